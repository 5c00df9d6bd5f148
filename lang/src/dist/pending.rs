//! Collectives that run while the program computes: a collective is started (MPI's
//! non-blocking `MPI_Iallreduce` and friends), the rank goes on with work that does not need its
//! result, and waits for it where the result is first read. Every tensor-level collective of
//! [`Spmd`] is a start followed by a wait, so the blocking and the deferred forms share one path.

use super::{Collectives, ReduceKind, Spmd};
use crate::types::AxisId;
use kernels::ops;
use kernels::{DType, Tensor};

/// A collective as a communicator runs it on flat buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CollOp {
    /// Element-wise reduction over the group.
    AllReduce(ReduceKind),
    /// Every member's equal block, concatenated in group order.
    AllGather,
    /// The group's `k` equal blocks summed over the group; this member keeps its block.
    ReduceScatter,
    /// `k` equal chunks; chunk `j` goes to member `j`.
    AllToAll,
}

/// A started collective: complete at once (one process, or a communicator without
/// non-blocking collectives), or in flight under the communicator's number for it.
pub enum Ticket {
    Ready(Tensor),
    InFlight(u64),
}

/// Runs `op` on the flat `data` (f32, f64 or i32) through the blocking methods of `c`.
pub fn run_now<C: Collectives + ?Sized>(c: &C, op: CollOp, axes: &[AxisId], data: &Tensor) -> Result<Tensor, String> {
    macro_rules! by_type {
        ($red:ident, $gather:ident, $scatter:ident, $a2a:ident, $x:expr) => {{
            let x = $x;
            let out = match op {
                CollOp::AllReduce(k) => c.$red(axes, k, x)?,
                CollOp::AllGather => c.$gather(axes, x)?,
                CollOp::ReduceScatter => c.$scatter(axes, x)?,
                CollOp::AllToAll => c.$a2a(axes, x)?,
            };
            Tensor::from_vec(vec![out.len()], out).map_err(|e| e.to_string())
        }};
    }
    match data.dtype() {
        DType::F32 => {
            by_type!(all_reduce_f32, all_gather_f32, reduce_scatter_f32, all_to_all_f32, data.as_f32().unwrap_or(&[]))
        }
        DType::F64 => {
            by_type!(all_reduce_f64, all_gather_f64, reduce_scatter_f64, all_to_all_f64, data.as_f64().unwrap_or(&[]))
        }
        DType::I32 => {
            by_type!(all_reduce_i32, all_gather_i32, reduce_scatter_i32, all_to_all_i32, data.as_i32().unwrap_or(&[]))
        }
        d => Err(format!("a collective cannot send {d} elements")),
    }
}

/// What turns a collective's flat result into the tensor the program reads.
enum Finish {
    /// Done before anything was sent (a group of one).
    Done(Tensor),
    /// The result has `shape`; a mean divides by the group's size; `back` is the element type
    /// the value had before it travelled as f32/i32.
    Reshape { shape: Vec<usize>, mean: Option<i64>, back: DType },
    /// `k` blocks received in group order, merged along `dim` (all-gather, all-to-all).
    Merge { dim: usize, block: Vec<usize>, back: DType },
}

/// A tensor-level collective that was started and not yet waited for.
pub struct Pending {
    ticket: Ticket,
    finish: Finish,
    /// Completed, as far as a [`Spmd::test`] found.
    complete: bool,
}

/// A collective of the program, as the interpreter starts it.
#[derive(Clone, Copy, Debug)]
pub enum Coll {
    AllReduce(ReduceKind),
    AllReduceMean,
    /// Along dim `dim`.
    AllGather(usize),
    ReduceScatter(usize),
    /// Split moved from dim `from` to dim `to`.
    AllToAll {
        from: usize,
        to: usize,
    },
}

/// The element type `x` travels as: bools as i32, storage-only types as f32.
fn transport(x: &Tensor) -> Tensor {
    match x.dtype() {
        DType::Bool => x.cast(DType::I32),
        DType::Bf16 | DType::F16 => x.cast(DType::F32),
        _ => x.clone(),
    }
}

fn err<E: std::fmt::Display>(e: E) -> String {
    e.to_string()
}

impl Spmd {
    /// Starts collective `c` over the group of `axes` on this rank's block `x`, without
    /// waiting for it where the communicator can (MPI's non-blocking collectives).
    pub fn start(&self, c: Coll, axes: &[AxisId], x: &Tensor) -> Result<Pending, String> {
        self.begin(c, axes, x, true)
    }

    /// Starts `c`; `defer` asks for a non-blocking collective, otherwise it runs at once through
    /// the communicator's blocking methods.
    fn begin(&self, c: Coll, axes: &[AxisId], x: &Tensor, defer: bool) -> Result<Pending, String> {
        let k = self.mesh.parts(axes).max(1) as usize;
        let back = x.dtype();
        let ready =
            |t: Tensor| Ok(Pending { ticket: Ticket::Ready(t.clone()), finish: Finish::Done(t), complete: true });
        let (op, data, finish) = match c {
            Coll::AllReduce(r) => {
                (CollOp::AllReduce(r), transport(x), Finish::Reshape { shape: x.shape().to_vec(), mean: None, back })
            }
            Coll::AllReduceMean => {
                let f = Finish::Reshape { shape: x.shape().to_vec(), mean: Some(k as i64), back };
                (CollOp::AllReduce(ReduceKind::Sum), transport(x), f)
            }
            Coll::AllGather(_) | Coll::ReduceScatter(_) | Coll::AllToAll { .. } if k <= 1 => return ready(x.clone()),
            Coll::AllGather(dim) => {
                (CollOp::AllGather, transport(x), Finish::Merge { dim, block: x.shape().to_vec(), back })
            }
            Coll::ReduceScatter(dim) => {
                self.check_split(axes, dim, x)?;
                // Blocks of `dim` made contiguous in group order: [.., k·b, ..] → [k, .., b, ..].
                let blocks = self.blocks_first(k, dim, &transport(x))?;
                let mut shape = x.shape().to_vec();
                shape[dim] /= k;
                (CollOp::ReduceScatter, blocks, Finish::Reshape { shape, mean: None, back })
            }
            Coll::AllToAll { from, to } => {
                self.check_split(axes, to, x)?;
                let send = self.blocks_first(k, to, &transport(x))?;
                let mut chunk = x.shape().to_vec();
                chunk[to] /= k;
                (CollOp::AllToAll, send, Finish::Merge { dim: from, block: chunk, back })
            }
        };
        let ticket = if defer {
            self.comm.start(op, axes, data)?
        } else {
            Ticket::Ready(run_now(&*self.comm, op, axes, &data)?)
        };
        let complete = matches!(ticket, Ticket::Ready(_));
        Ok(Pending { ticket, finish, complete })
    }

    /// Advances `p` without waiting; whether it has completed.
    pub fn test(&self, p: &mut Pending) -> Result<bool, String> {
        if !p.complete {
            if let Ticket::InFlight(id) = p.ticket {
                p.complete = self.comm.test(id)?;
            }
        }
        Ok(p.complete)
    }

    /// Waits for `p` and returns its result.
    pub fn wait(&self, p: Pending) -> Result<Tensor, String> {
        let flat = match (p.ticket, &p.finish) {
            (_, Finish::Done(_)) => None,
            (Ticket::Ready(t), _) => Some(t),
            (Ticket::InFlight(id), _) => Some(self.comm.wait(id)?),
        };
        let Some(flat) = flat else {
            let Finish::Done(t) = p.finish else { return Err("a collective finished without its result".into()) };
            return Ok(t);
        };
        let travelled = flat.dtype();
        let (_, storage) = flat.into_parts();
        let t = match p.finish {
            Finish::Done(t) => t,
            Finish::Reshape { shape, mean, back } => {
                let s = Tensor::new(shape, storage).map_err(err)?;
                let s = if back == travelled { s } else { s.cast(back) };
                match mean {
                    None => s,
                    Some(k) => {
                        let k = Tensor::scalar_f64(k as f64).cast(s.dtype());
                        crate::ir::eval::binary(ops::BinaryOp::Div, &s, &k).map_err(err)?
                    }
                }
            }
            Finish::Merge { dim, block, back } => {
                let n: usize = block.iter().product();
                let k = storage.len().checked_div(n).unwrap_or(1);
                let mut stacked = vec![k];
                stacked.extend_from_slice(&block);
                let all = Tensor::new(stacked, storage).map_err(err)?;
                let m = super::merge_blocks(&all, dim, block)?;
                if back == travelled {
                    m
                } else {
                    m.cast(back)
                }
            }
        };
        Ok(t)
    }

    /// `c` run to completion.
    pub fn run(&self, c: Coll, axes: &[AxisId], x: &Tensor) -> Result<Tensor, String> {
        self.wait(self.begin(c, axes, x, false)?)
    }
}
