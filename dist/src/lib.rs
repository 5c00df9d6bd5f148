//! msl's multi-process runtime: MPI (Open MPI, through the `mpi` crate) behind `lang`'s
//! `Collectives` trait. One communicator is split per group of mesh axes, its ranks ordered by
//! their block index, so a collective over `mp` runs among the ranks that differ only in `mp`.

use lang::dist::{Collectives, Mesh, ReduceKind};
use lang::types::AxisId;
use mpi::collective::SystemOperation;
use mpi::environment::Universe;
use mpi::topology::{Color, Communicator, SimpleCommunicator};
use mpi::traits::*;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;

/// The size of the job this process was started in by a launcher, from the launcher's
/// environment (Open MPI, then PMI/PMIx and MPICH's Hydra); `None` when no launcher started it.
pub fn launcher_size() -> Option<usize> {
    ["OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "PMI_SIZE", "MPI_LOCALNRANKS"]
        .iter()
        .find_map(|k| std::env::var(k).ok())
        .and_then(|v| v.trim().parse().ok())
}

/// This process's rank as its launcher numbered it (for messages before MPI is up).
pub fn launcher_rank() -> Option<usize> {
    ["OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"]
        .iter()
        .find_map(|k| std::env::var(k).ok())
        .and_then(|v| v.trim().parse().ok())
}

/// This process's rank among the job's processes on its node (Open MPI, PMIx, MPICH's Hydra):
/// the GPU a rank takes under `--device cuda`.
pub fn launcher_local_rank() -> Option<usize> {
    ["OMPI_COMM_WORLD_LOCAL_RANK", "PMIX_LOCAL_RANK", "MPI_LOCALRANKID"]
        .iter()
        .find_map(|k| std::env::var(k).ok())
        .and_then(|v| v.trim().parse().ok())
}

/// The MPI communicator of a job, split by mesh axes.
pub struct Mpi {
    // Fields drop in order: the communicators before the universe, which finalises MPI.
    groups: RefCell<HashMap<Vec<AxisId>, SimpleCommunicator>>,
    world: SimpleCommunicator,
    mesh: Mesh,
    sent: Cell<u64>,
    _universe: Universe,
}

impl Mpi {
    /// Starts MPI; `None` when it cannot be initialised (already initialised, or no MPI).
    pub fn start(mesh: Mesh) -> Option<Mpi> {
        let universe = mpi::initialize()?;
        let world = universe.world();
        let mpi = Mpi { groups: RefCell::new(HashMap::new()), world, mesh, sent: Cell::new(0), _universe: universe };
        // Splitting a communicator is collective over the whole job, but a pipeline stage may
        // need a group's first collective while other stages wait for a message: every group
        // (each ordered choice of axes) is split here, while every rank is at the same point.
        if mpi.size() > 1 && mpi.mesh.names.len() <= 4 {
            let n = mpi.mesh.names.len() as u32;
            let mut orders: Vec<Vec<AxisId>> = (0..n).map(|a| vec![AxisId(a)]).collect();
            let mut i = 0;
            while i < orders.len() {
                for a in 0..n {
                    if !orders[i].contains(&AxisId(a)) {
                        let mut o = orders[i].clone();
                        o.push(AxisId(a));
                        orders.push(o);
                    }
                }
                i += 1;
            }
            for axes in orders {
                mpi.with_group(&axes, |_| ()).ok()?;
            }
        }
        Some(mpi)
    }

    pub fn size(&self) -> usize {
        self.world.size() as usize
    }

    /// Runs `f` on the communicator of the group over `axes`, made the first time it is needed
    /// (every rank reaches the same collectives in the same order, so every rank splits then).
    fn with_group<T>(&self, axes: &[AxisId], f: impl FnOnce(&SimpleCommunicator) -> T) -> Result<T, String> {
        let rank = self.world.rank() as usize;
        if !self.groups.borrow().contains_key(axes) {
            let color = self.mesh.group_color(rank, axes) as i32;
            let key = self.mesh.group_index(rank, axes) as i32;
            let c = self
                .world
                .split_by_color_with_key(Color::with_value(color), key)
                .ok_or_else(|| "MPI could not split the communicator".to_string())?;
            self.groups.borrow_mut().insert(axes.to_vec(), c);
        }
        let groups = self.groups.borrow();
        let c = groups.get(axes).ok_or_else(|| "MPI group missing".to_string())?;
        Ok(f(c))
    }

    fn reduce<T: Equivalence + Clone + Default>(
        &self,
        axes: &[AxisId],
        op: ReduceKind,
        data: &[T],
    ) -> Result<Vec<T>, String> {
        self.sent.set(self.sent.get() + std::mem::size_of_val(data) as u64);
        let mut out = vec![T::default(); data.len()];
        let op = match op {
            ReduceKind::Sum => SystemOperation::sum(),
            ReduceKind::Max => SystemOperation::max(),
            ReduceKind::Min => SystemOperation::min(),
        };
        self.with_group(axes, |c| c.all_reduce_into(data, &mut out[..], op))?;
        Ok(out)
    }

    fn gather<T: Equivalence + Clone + Default>(&self, axes: &[AxisId], block: &[T]) -> Result<Vec<T>, String> {
        self.sent.set(self.sent.get() + std::mem::size_of_val(block) as u64);
        let k = self.mesh.parts(axes) as usize;
        let mut out = vec![T::default(); block.len() * k];
        self.with_group(axes, |c| c.all_gather_into(block, &mut out[..]))?;
        Ok(out)
    }
}

impl Mpi {
    fn reduce_scatter<T: Equivalence + Clone + Default>(&self, axes: &[AxisId], data: &[T]) -> Result<Vec<T>, String> {
        self.sent.set(self.sent.get() + std::mem::size_of_val(data) as u64);
        let k = self.mesh.parts(axes).max(1) as usize;
        let mut out = vec![T::default(); data.len() / k];
        self.with_group(axes, |c| c.reduce_scatter_block_into(data, &mut out[..], SystemOperation::sum()))?;
        Ok(out)
    }

    fn all_to_all<T: Equivalence + Clone + Default>(&self, axes: &[AxisId], data: &[T]) -> Result<Vec<T>, String> {
        self.sent.set(self.sent.get() + std::mem::size_of_val(data) as u64);
        let mut out = vec![T::default(); data.len()];
        self.with_group(axes, |c| c.all_to_all_into(data, &mut out[..]))?;
        Ok(out)
    }
}

impl Collectives for Mpi {
    fn rank(&self) -> usize {
        self.world.rank() as usize
    }
    fn world(&self) -> usize {
        self.size()
    }
    fn all_reduce_f32(&self, axes: &[AxisId], op: ReduceKind, data: &[f32]) -> Result<Vec<f32>, String> {
        self.reduce(axes, op, data)
    }
    fn all_reduce_f64(&self, axes: &[AxisId], op: ReduceKind, data: &[f64]) -> Result<Vec<f64>, String> {
        self.reduce(axes, op, data)
    }
    fn all_reduce_i32(&self, axes: &[AxisId], op: ReduceKind, data: &[i32]) -> Result<Vec<i32>, String> {
        self.reduce(axes, op, data)
    }
    fn all_gather_f32(&self, axes: &[AxisId], block: &[f32]) -> Result<Vec<f32>, String> {
        self.gather(axes, block)
    }
    fn all_gather_f64(&self, axes: &[AxisId], block: &[f64]) -> Result<Vec<f64>, String> {
        self.gather(axes, block)
    }
    fn all_gather_i32(&self, axes: &[AxisId], block: &[i32]) -> Result<Vec<i32>, String> {
        self.gather(axes, block)
    }
    fn reduce_scatter_f32(&self, axes: &[AxisId], data: &[f32]) -> Result<Vec<f32>, String> {
        self.reduce_scatter(axes, data)
    }
    fn reduce_scatter_f64(&self, axes: &[AxisId], data: &[f64]) -> Result<Vec<f64>, String> {
        self.reduce_scatter(axes, data)
    }
    fn reduce_scatter_i32(&self, axes: &[AxisId], data: &[i32]) -> Result<Vec<i32>, String> {
        self.reduce_scatter(axes, data)
    }
    fn all_to_all_f32(&self, axes: &[AxisId], data: &[f32]) -> Result<Vec<f32>, String> {
        self.all_to_all(axes, data)
    }
    fn all_to_all_f64(&self, axes: &[AxisId], data: &[f64]) -> Result<Vec<f64>, String> {
        self.all_to_all(axes, data)
    }
    fn all_to_all_i32(&self, axes: &[AxisId], data: &[i32]) -> Result<Vec<i32>, String> {
        self.all_to_all(axes, data)
    }
    fn send_recv(&self, axes: &[AxisId], sends: &[(usize, &[u8])], recvs: &[usize]) -> Result<Vec<Vec<u8>>, String> {
        // Every send is posted before the receives (non-blocking), so two stages that send to
        // each other at one communication point cannot wait on each other.
        const TAG: i32 = 7;
        self.sent.set(self.sent.get() + sends.iter().map(|(_, b)| b.len() as u64).sum::<u64>());
        self.with_group(axes, |c| {
            mpi::request::scope(|scope| {
                let pending: Vec<_> = sends
                    .iter()
                    .map(|(peer, b)| c.process_at_rank(*peer as i32).immediate_send_with_tag(scope, *b, TAG))
                    .collect();
                let got: Vec<Vec<u8>> = recvs
                    .iter()
                    .map(|peer| c.process_at_rank(*peer as i32).receive_vec_with_tag::<u8>(TAG).0)
                    .collect();
                for r in pending {
                    r.wait();
                }
                got
            })
        })
    }
    fn bytes_sent(&self) -> u64 {
        self.sent.get()
    }
    fn abort(&self, code: i32) {
        self.world.abort(code)
    }
}
