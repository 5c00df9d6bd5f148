//! The collectives a sharded program runs on: the mesh's geometry, the `Collectives` trait that
//! the interpreter calls for every collective primitive, its one-process implementation, and
//! the tensor-level operations built on it. `lang` knows nothing of MPI: the binary plugs in
//! the MPI implementation (the `dist` crate).

mod pending;

pub use pending::{run_now, Coll, CollOp, Pending, Ticket};

use crate::types::AxisId;
use kernels::ops::{self, SliceSpec};
use kernels::Tensor;

/// An element-wise reduction over the ranks of a group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceKind {
    Sum,
    Max,
    Min,
}

/// The grid of processes: axis names and sizes, in declaration order. A rank's coordinates run
/// with the last axis fastest (`rank = dp_index * size(mp) + mp_index`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Mesh {
    pub names: Vec<String>,
    pub sizes: Vec<i64>,
}

impl Mesh {
    /// The mesh a checked program declares (`None` without one).
    pub fn of(prog: &crate::ir::Program) -> Option<Mesh> {
        let m = prog.meshes.first()?;
        Some(Mesh {
            names: m.axes.iter().map(|(n, _)| prog.names.get(*n).to_string()).collect(),
            sizes: m.axes.iter().map(|(_, s)| *s).collect(),
        })
    }

    /// The number of ranks the mesh has.
    pub fn devices(&self) -> i64 {
        self.sizes.iter().product()
    }

    pub fn size(&self, a: AxisId) -> i64 {
        self.sizes.get(a.0 as usize).copied().unwrap_or(1)
    }

    /// The number of blocks a dim split over `axes` has.
    /// Every axis, in declaration order (the group of the whole job, in rank order).
    pub fn all_axes(&self) -> Vec<AxisId> {
        (0..self.names.len() as u32).map(AxisId).collect()
    }

    pub fn parts(&self, axes: &[AxisId]) -> i64 {
        axes.iter().map(|a| self.size(*a)).product()
    }

    /// The coordinates of a rank, one per axis.
    pub fn coords(&self, rank: usize) -> Vec<i64> {
        let mut r = rank as i64;
        let mut out = vec![0; self.sizes.len()];
        for (i, s) in self.sizes.iter().enumerate().rev() {
            out[i] = r % s.max(&1);
            r /= s.max(&1);
        }
        out
    }

    /// The index of a rank within the group of ranks that differ only in `axes` (`axes[0]`
    /// outer): the block of a dim split over `axes` that the rank holds.
    pub fn group_index(&self, rank: usize, axes: &[AxisId]) -> i64 {
        let c = self.coords(rank);
        axes.iter().fold(0, |acc, a| acc * self.size(*a) + c.get(a.0 as usize).copied().unwrap_or(0))
    }

    /// Which group over `axes` a rank belongs to: its index over the other axes.
    pub fn group_color(&self, rank: usize, axes: &[AxisId]) -> i64 {
        let c = self.coords(rank);
        (0..self.sizes.len())
            .filter(|i| !axes.iter().any(|a| a.0 as usize == *i))
            .fold(0, |acc, i| acc * self.sizes[i] + c[i])
    }
}

/// A communicator over the ranks of a mesh. Every method is called by every rank of the group
/// in the same order (the program is SPMD); an error message ends the job.
pub trait Collectives {
    /// This process's rank in the job.
    fn rank(&self) -> usize;
    /// The number of processes in the job.
    fn world(&self) -> usize;
    /// `data` reduced element-wise over the ranks that differ from this one only in `axes`
    /// (sent from where it lies: no copy of it is made first).
    fn all_reduce_f32(&self, axes: &[AxisId], op: ReduceKind, data: &[f32]) -> Result<Vec<f32>, String>;
    fn all_reduce_f64(&self, axes: &[AxisId], op: ReduceKind, data: &[f64]) -> Result<Vec<f64>, String>;
    fn all_reduce_i32(&self, axes: &[AxisId], op: ReduceKind, data: &[i32]) -> Result<Vec<i32>, String>;
    /// Every rank's equal-sized block, concatenated in group order.
    fn all_gather_f32(&self, axes: &[AxisId], block: &[f32]) -> Result<Vec<f32>, String>;
    fn all_gather_f64(&self, axes: &[AxisId], block: &[f64]) -> Result<Vec<f64>, String>;
    fn all_gather_i32(&self, axes: &[AxisId], block: &[i32]) -> Result<Vec<i32>, String>;
    /// `data` is the group's `k` equal blocks in group order; sums each block over the group and
    /// returns this rank's.
    fn reduce_scatter_f32(&self, axes: &[AxisId], data: &[f32]) -> Result<Vec<f32>, String>;
    fn reduce_scatter_f64(&self, axes: &[AxisId], data: &[f64]) -> Result<Vec<f64>, String>;
    fn reduce_scatter_i32(&self, axes: &[AxisId], data: &[i32]) -> Result<Vec<i32>, String>;
    /// `data` is `k` equal chunks; chunk `j` goes to the group's member `j`, and the result is the
    /// chunks received, in group order.
    fn all_to_all_f32(&self, axes: &[AxisId], data: &[f32]) -> Result<Vec<f32>, String>;
    fn all_to_all_f64(&self, axes: &[AxisId], data: &[f64]) -> Result<Vec<f64>, String>;
    fn all_to_all_i32(&self, axes: &[AxisId], data: &[i32]) -> Result<Vec<i32>, String>;
    /// One communication point of a pipeline schedule: posts every send (`(peer, bytes)`) and
    /// every receive (from `peer`) among the ranks that differ from this one only in `axes`
    /// (peers are their indices in that group) at once, and waits for all of them. Returns the
    /// messages received, in the order of `recvs`. Messages between two ranks arrive in the
    /// order they were sent.
    fn send_recv(&self, axes: &[AxisId], sends: &[(usize, &[u8])], recvs: &[usize]) -> Result<Vec<Vec<u8>>, String> {
        let _ = axes;
        if sends.is_empty() && recvs.is_empty() {
            return Ok(vec![]);
        }
        Err("a pipeline stage's messages need the ranks of its mesh axis (start the job with `mpirun`)".into())
    }
    /// Starts `op` on the flat `data` (f32, f64 or i32) over the group of `axes` without
    /// waiting for it (MPI's non-blocking collectives). Collectives are started in the same
    /// order on every rank of a group. The default runs it at once.
    fn start(&self, op: CollOp, axes: &[AxisId], data: Tensor) -> Result<Ticket, String> {
        run_now(self, op, axes, &data).map(Ticket::Ready)
    }
    /// Advances the collective numbered `id` by [`Collectives::start`] and tells whether it
    /// has completed, without waiting.
    fn test(&self, id: u64) -> Result<bool, String> {
        let _ = id;
        Ok(true)
    }
    /// Waits for the collective numbered `id` and returns what it received, flat.
    fn wait(&self, id: u64) -> Result<Tensor, String> {
        Err(format!("no collective number {id} is in flight"))
    }
    /// Bytes this rank sent through collectives so far (for `--explain`'s counters).
    fn bytes_sent(&self) -> u64 {
        0
    }
    /// Ends every process of the job with this exit status (after a run-time error here).
    fn abort(&self, code: i32) {
        std::process::exit(code)
    }
}

/// The one-process communicator: every group has one member, so each collective is the
/// identity.
pub struct Solo;

impl Collectives for Solo {
    fn rank(&self) -> usize {
        0
    }
    fn world(&self) -> usize {
        1
    }
    fn all_reduce_f32(&self, _: &[AxisId], _: ReduceKind, data: &[f32]) -> Result<Vec<f32>, String> {
        Ok(data.to_vec())
    }
    fn all_reduce_f64(&self, _: &[AxisId], _: ReduceKind, data: &[f64]) -> Result<Vec<f64>, String> {
        Ok(data.to_vec())
    }
    fn all_reduce_i32(&self, _: &[AxisId], _: ReduceKind, data: &[i32]) -> Result<Vec<i32>, String> {
        Ok(data.to_vec())
    }
    fn all_gather_f32(&self, _: &[AxisId], block: &[f32]) -> Result<Vec<f32>, String> {
        Ok(block.to_vec())
    }
    fn all_gather_f64(&self, _: &[AxisId], block: &[f64]) -> Result<Vec<f64>, String> {
        Ok(block.to_vec())
    }
    fn all_gather_i32(&self, _: &[AxisId], block: &[i32]) -> Result<Vec<i32>, String> {
        Ok(block.to_vec())
    }
    fn reduce_scatter_f32(&self, _: &[AxisId], data: &[f32]) -> Result<Vec<f32>, String> {
        Ok(data.to_vec())
    }
    fn reduce_scatter_f64(&self, _: &[AxisId], data: &[f64]) -> Result<Vec<f64>, String> {
        Ok(data.to_vec())
    }
    fn reduce_scatter_i32(&self, _: &[AxisId], data: &[i32]) -> Result<Vec<i32>, String> {
        Ok(data.to_vec())
    }
    fn all_to_all_f32(&self, _: &[AxisId], data: &[f32]) -> Result<Vec<f32>, String> {
        Ok(data.to_vec())
    }
    fn all_to_all_f64(&self, _: &[AxisId], data: &[f64]) -> Result<Vec<f64>, String> {
        Ok(data.to_vec())
    }
    fn all_to_all_i32(&self, _: &[AxisId], data: &[i32]) -> Result<Vec<i32>, String> {
        Ok(data.to_vec())
    }
}

/// The runtime side of a sharded run: the mesh and the communicator of this process.
pub struct Spmd {
    pub mesh: Mesh,
    pub comm: Box<dyn Collectives>,
    /// What each collective of the program sent from this rank (`msl run --comm-report`).
    pub traffic: std::cell::RefCell<Traffic>,
}

/// Bytes sent per collective site, as the communicator counted them: keyed by the site's
/// number (`ir::Attrs::site`; 0 for the run-time traffic of pipelines and sharded optimizer
/// steps, one entry per place and kind) and its place and kind; its location and kind, the
/// number of calls and the bytes of all of them.
pub type Traffic =
    std::collections::BTreeMap<(u32, u32, u32, &'static str), (crate::source::Span, &'static str, u64, u64)>;

impl Spmd {
    pub fn new(mesh: Mesh, comm: Box<dyn Collectives>) -> Spmd {
        Spmd { mesh, comm, traffic: Default::default() }
    }

    /// Counts one call of collective number `site` (`kind`, at `span`) that sent `bytes`.
    pub fn count(&self, site: u32, span: crate::source::Span, kind: &'static str, bytes: u64) {
        let mut t = self.traffic.borrow_mut();
        let e = t.entry((site, span.file.0, span.start, kind)).or_insert((span, kind, 0, 0));
        e.2 += 1;
        e.3 += bytes;
    }
}

fn err<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

impl Spmd {
    pub fn rank(&self) -> usize {
        self.comm.rank()
    }

    /// `x` reduced over the group of `axes`.
    pub fn all_reduce(&self, axes: &[AxisId], op: ReduceKind, x: &Tensor) -> Result<Tensor, String> {
        self.run(Coll::AllReduce(op), axes, x)
    }

    /// The group's blocks of `x` concatenated along `dim`.
    pub fn all_gather(&self, axes: &[AxisId], dim: usize, x: &Tensor) -> Result<Tensor, String> {
        self.run(Coll::AllGather(dim), axes, x)
    }

    /// Every rank's `bytes`, in rank order (each rank passes its own; lengths may differ).
    pub fn exchange(&self, bytes: &[u8]) -> Result<Vec<Vec<u8>>, String> {
        let all = self.mesh.all_axes();
        let n = [i32::try_from(bytes.len()).map_err(|_| "a message over 2 GiB".to_string())?];
        let n = self.comm.all_reduce_i32(&all, ReduceKind::Max, &n)?;
        let words = (n[0] as usize).div_ceil(4) + 1;
        let mut block = vec![0i32; words];
        block[0] = bytes.len() as i32;
        for (i, c) in bytes.chunks(4).enumerate() {
            let mut w = [0u8; 4];
            w[..c.len()].copy_from_slice(c);
            block[i + 1] = i32::from_le_bytes(w);
        }
        let got = self.comm.all_gather_i32(&all, &block)?;
        Ok(got
            .chunks(words)
            .map(|b| {
                let len = (b[0].max(0) as usize).min((words - 1) * 4);
                b[1..].iter().flat_map(|w| w.to_le_bytes()).take(len).collect()
            })
            .collect())
    }

    /// Returns once every rank has called it.
    pub fn barrier(&self) -> Result<(), String> {
        self.comm.all_reduce_i32(&self.mesh.all_axes(), ReduceKind::Sum, &[0]).map(|_| ())
    }

    /// `x` summed over the group, keeping this rank's block of dim `dim` (one message of the
    /// whole `x` instead of an all-reduce and a slice: half the bytes of a ring all-reduce).
    pub fn reduce_scatter(&self, axes: &[AxisId], dim: usize, x: &Tensor) -> Result<Tensor, String> {
        self.run(Coll::ReduceScatter(dim), axes, x)
    }

    /// `x` with the `k` blocks of dim `dim` laid out one after another: shape `[k, …, n/k, …]`.
    fn blocks_first(&self, k: usize, dim: usize, x: &Tensor) -> Result<Tensor, String> {
        let shape = x.shape();
        let mut split: Vec<usize> = shape[..dim].to_vec();
        split.push(k);
        split.push(shape[dim] / k);
        split.extend_from_slice(&shape[dim + 1..]);
        let v = ops::reshape(x, &split).map_err(err)?;
        let mut perm = vec![dim];
        perm.extend(0..dim);
        perm.extend(dim + 1..split.len());
        ops::permute(&v, &perm).map_err(err)
    }

    fn check_split(&self, axes: &[AxisId], dim: usize, x: &Tensor) -> Result<(), String> {
        let k = self.mesh.parts(axes);
        let n = x.shape().get(dim).copied().unwrap_or(0) as i64;
        if n % k != 0 {
            let names: Vec<&str> = axes.iter().map(|a| self.mesh.names[a.0 as usize].as_str()).collect();
            return Err(format!("dim {dim} of size {n} does not split evenly over `{}` ({k} parts)", names.join(", ")));
        }
        Ok(())
    }

    /// This rank's block of dim `dim` of a replicated `x` split over `axes`; the size must
    /// divide evenly (`what` names the value for the message).
    pub fn local_slice(&self, axes: &[AxisId], dim: usize, x: &Tensor) -> Result<Tensor, String> {
        let k = self.mesh.parts(axes);
        if k <= 1 {
            return Ok(x.clone());
        }
        self.check_split(axes, dim, x)?;
        let n = x.shape().get(dim).copied().unwrap_or(0) as i64;
        let i = self.mesh.group_index(self.rank(), axes);
        let b = n / k;
        let specs: Vec<SliceSpec> = (0..x.rank())
            .map(|d| if d == dim { SliceSpec::Range { start: i * b, end: (i + 1) * b } } else { SliceSpec::Full })
            .collect();
        ops::slice(x, &specs).map_err(err)
    }
}

/// `[k, d0, …]` (block `i` first-indexed by `i`) → `[d0, …, k·d_dim, …]`, block `i` at offset
/// `i · d_dim` of dim `dim`.
fn merge_blocks(all: &Tensor, dim: usize, block: Vec<usize>) -> Result<Tensor, String> {
    let k = all.shape().first().copied().unwrap_or(1);
    let mut perm: Vec<usize> = (1..=dim).collect();
    perm.push(0);
    perm.extend(dim + 1..=block.len());
    let moved = ops::permute(all, &perm).map_err(err)?;
    let mut out = block;
    if let Some(d) = out.get_mut(dim) {
        *d *= k;
    }
    ops::reshape(&moved, &out).map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coordinates_run_last_axis_fastest() {
        let m = Mesh { names: vec!["dp".into(), "mp".into()], sizes: vec![2, 3] };
        assert_eq!(m.coords(4), vec![1, 1]);
        assert_eq!(m.group_index(5, &[AxisId(1)]), 2);
        assert_eq!(m.group_index(5, &[AxisId(0), AxisId(1)]), 5);
        assert_eq!(m.group_index(5, &[AxisId(1), AxisId(0)]), 5 % 3 * 2 + 1);
        assert_eq!(m.group_color(5, &[AxisId(1)]), 1);
        assert_eq!(m.group_color(5, &[AxisId(0)]), 2);
    }

    #[test]
    fn one_process_collectives_are_identities() {
        let s = Spmd::new(Mesh { names: vec!["dp".into()], sizes: vec![1] }, Box::new(Solo));
        let x = Tensor::from_f32(vec![2, 2], vec![1.0, 2.0, 3.0, 4.0]).unwrap();
        let y = s.all_reduce(&[AxisId(0)], ReduceKind::Sum, &x).unwrap();
        assert_eq!(y.as_f32().unwrap(), x.as_f32().unwrap());
        assert_eq!(s.all_gather(&[AxisId(0)], 1, &x).unwrap().shape(), &[2, 2]);
    }
}
