//! msl's multi-process runtime: MPI (Open MPI, through the `mpi` crate) behind `lang`'s
//! `Collectives` trait. One communicator is split per group of mesh axes, its ranks ordered by
//! their block index, so a collective over `mp` runs among the ranks that differ only in `mp`.

use kernels::{Element, Tensor};
use lang::dist::{CollOp, Collectives, Mesh, ReduceKind, Ticket};
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
    /// Non-blocking collectives started and not yet waited for, by number.
    in_flight: RefCell<HashMap<u64, InFlight>>,
    next: Cell<u64>,
    _universe: Universe,
}

/// A non-blocking collective in flight: the buffers MPI reads and writes live here until it
/// has completed.
struct InFlight {
    request: mpi::ffi::MPI_Request,
    _send: Tensor,
    recv: Recv,
    done: bool,
}

/// A receive buffer.
enum Recv {
    F32(Vec<f32>),
    F64(Vec<f64>),
    I32(Vec<i32>),
}

impl Recv {
    fn into_tensor(self) -> Result<Tensor, String> {
        let r = match self {
            Recv::F32(v) => Tensor::from_vec(vec![v.len()], v),
            Recv::F64(v) => Tensor::from_vec(vec![v.len()], v),
            Recv::I32(v) => Tensor::from_vec(vec![v.len()], v),
        };
        r.map_err(|e| e.to_string())
    }
}

/// An element type a collective sends.
trait Wire: Element + Equivalence {
    fn recv(v: Vec<Self>) -> Recv;
}
impl Wire for f32 {
    fn recv(v: Vec<f32>) -> Recv {
        Recv::F32(v)
    }
}
impl Wire for f64 {
    fn recv(v: Vec<f64>) -> Recv {
        Recv::F64(v)
    }
}
impl Wire for i32 {
    fn recv(v: Vec<i32>) -> Recv {
        Recv::I32(v)
    }
}

impl Drop for Mpi {
    /// Waits for collectives still in flight (after an error), so that MPI never writes into
    /// freed buffers.
    fn drop(&mut self) {
        for (_, mut f) in self.in_flight.get_mut().drain() {
            if !f.done {
                // SAFETY: the request is a live non-blocking collective whose buffers `f` owns.
                unsafe { mpi::ffi::MPI_Wait(&mut f.request, mpi::ffi::RSMPI_STATUS_IGNORE) };
            }
        }
    }
}

impl Mpi {
    /// Starts MPI; `None` when it cannot be initialised (already initialised, or no MPI).
    pub fn start(mesh: Mesh) -> Option<Mpi> {
        let universe = mpi::initialize()?;
        let world = universe.world();
        let mpi = Mpi {
            groups: RefCell::new(HashMap::new()),
            world,
            mesh,
            sent: Cell::new(0),
            in_flight: RefCell::new(HashMap::new()),
            next: Cell::new(0),
            _universe: universe,
        };
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

impl Mpi {
    /// Starts `op` on `send` (elements of type `T`) as an MPI non-blocking collective.
    fn start_typed<T: Wire>(&self, op: CollOp, axes: &[AxisId], send: Tensor) -> Result<Ticket, String> {
        use mpi::ffi;
        use mpi::raw::AsRaw;
        let data: &[T] = send.data::<T>().ok_or("a collective's buffer has another element type")?;
        self.sent.set(self.sent.get() + std::mem::size_of_val(data) as u64);
        let k = self.mesh.parts(axes).max(1) as usize;
        let n = data.len();
        let out_len = match op {
            CollOp::AllReduce(_) | CollOp::AllToAll => n,
            CollOp::AllGather => n * k,
            CollOp::ReduceScatter => n / k,
        };
        let count = |c: usize| i32::try_from(c).map_err(|_| "a collective of more than 2^31 elements".to_string());
        let mut recv = vec![T::default(); out_len];
        let dt = T::equivalent_datatype().as_raw();
        let rop = |r: ReduceKind| match r {
            ReduceKind::Sum => SystemOperation::sum().as_raw(),
            ReduceKind::Max => SystemOperation::max().as_raw(),
            ReduceKind::Min => SystemOperation::min().as_raw(),
        };
        let (send_ptr, recv_ptr) = (data.as_ptr().cast(), recv.as_mut_ptr().cast());
        let mut request = std::mem::MaybeUninit::<ffi::MPI_Request>::uninit();
        let code = self.with_group(axes, |c| {
            let comm = c.as_raw();
            let req = request.as_mut_ptr();
            // SAFETY: `send` and `recv` are kept in `in_flight` until MPI reports the request
            // complete (or `Drop` waits for it); the counts match the buffers' lengths.
            Ok::<_, String>(unsafe {
                match op {
                    CollOp::AllReduce(r) => ffi::MPI_Iallreduce(send_ptr, recv_ptr, count(n)?, dt, rop(r), comm, req),
                    CollOp::AllGather => {
                        ffi::MPI_Iallgather(send_ptr, count(n)?, dt, recv_ptr, count(n)?, dt, comm, req)
                    }
                    CollOp::ReduceScatter => ffi::MPI_Ireduce_scatter_block(
                        send_ptr,
                        recv_ptr,
                        count(n / k)?,
                        dt,
                        SystemOperation::sum().as_raw(),
                        comm,
                        req,
                    ),
                    CollOp::AllToAll => {
                        ffi::MPI_Ialltoall(send_ptr, count(n / k)?, dt, recv_ptr, count(n / k)?, dt, comm, req)
                    }
                }
            })
        })??;
        if code != 0 {
            return Err(format!("MPI could not start a collective (error {code})"));
        }
        // SAFETY: MPI wrote the request above (it returned success).
        let request = unsafe { request.assume_init() };
        let id = self.next.get();
        self.next.set(id + 1);
        self.in_flight.borrow_mut().insert(id, InFlight { request, _send: send, recv: T::recv(recv), done: false });
        Ok(Ticket::InFlight(id))
    }
}

impl Collectives for Mpi {
    fn start(&self, op: CollOp, axes: &[AxisId], data: Tensor) -> Result<Ticket, String> {
        match data.dtype() {
            kernels::DType::F32 => self.start_typed::<f32>(op, axes, data),
            kernels::DType::F64 => self.start_typed::<f64>(op, axes, data),
            kernels::DType::I32 => self.start_typed::<i32>(op, axes, data),
            d => Err(format!("a collective cannot send {d} elements")),
        }
    }
    fn test(&self, id: u64) -> Result<bool, String> {
        let mut all = self.in_flight.borrow_mut();
        let f = all.get_mut(&id).ok_or_else(|| format!("no collective number {id} is in flight"))?;
        if !f.done {
            let mut flag = 0;
            // SAFETY: a live request whose buffers `f` owns; MPI sets it to null when complete.
            unsafe { mpi::ffi::MPI_Test(&mut f.request, &mut flag, mpi::ffi::RSMPI_STATUS_IGNORE) };
            f.done = flag != 0;
        }
        Ok(f.done)
    }
    fn wait(&self, id: u64) -> Result<Tensor, String> {
        let mut f =
            self.in_flight.borrow_mut().remove(&id).ok_or_else(|| format!("no collective number {id} is in flight"))?;
        if !f.done {
            // SAFETY: as in `test`.
            unsafe { mpi::ffi::MPI_Wait(&mut f.request, mpi::ffi::RSMPI_STATUS_IGNORE) };
        }
        f.recv.into_tensor()
    }

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
