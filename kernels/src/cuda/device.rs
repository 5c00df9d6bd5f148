//! The CUDA device behind the [`Device`] trait: buffers and launches through cudarc on the
//! context's streams (the default one and any `new_stream` makes; cudarc's events order a
//! buffer's uses across them), `ops.cu` compiled by NVRTC for the GPU's own architecture when
//! the device opens, each elementwise kernel generated and compiled on its first use, and matrix
//! products through cuBLAS, and allocations from the GPU's default memory pool kept as a cache.
//!
//! Which kernels run here is one exhaustive table ([`CudaDevice::runs`]); every other kernel
//! answers an error naming it, so that a caller falls back ([`crate::Offload`]) or stops
//! clearly. Elementwise kernels read views through their strides; every other kernel reads its
//! inputs made contiguous by the strided copy (the identity conversion) on the GPU. Nothing here
//! has run on a GPU yet: the test suite's machines have none, and `kernels/tests/cuda_device.rs`
//! skips with the reason there; `scripts/gpu_check.sh` runs it on a machine that has one. The
//! kernels' sources and the cuBLAS argument mapping are tested on every machine
//! (`cuda_ops.rs`, `cuda_elem.rs`, `cuda_gemm.rs`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use cudarc::cublas::CudaBlas;
use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, CudaView, DeviceRepr, LaunchArgs, PushKernelArg,
};

use super::elem::{self, Index};
use super::{compile_cubin, driver_present, gemm, RegionArg, NVRTC_OPTIONS, OPS_SOURCE};
use crate::cpu::elementwise::ElemOp;
use crate::cpu::reduce::ReduceOp;
use crate::device::{arity, gather_host, Device, DeviceTensor, KernelId, KernelParams, MemoryStats, Stream};
use crate::error::KernelError;
use crate::tensor::{DType, Storage, Tensor};

// SAFETY: both are `#[repr(C)]` structs of integers, laid out as the C structs the kernels
// declare (checked on the host by `cuda_elem.rs` and `cuda_ops.rs`).
unsafe impl<const K: usize> DeviceRepr for Index<K> {}
unsafe impl DeviceRepr for RegionArg {}

/// A buffer on the GPU, of one element type.
pub(super) enum Buf {
    F32(CudaSlice<f32>),
    F64(CudaSlice<f64>),
    I32(CudaSlice<i32>),
    Bool(CudaSlice<bool>),
    /// The storage-only types, as their bits.
    Bf16(CudaSlice<u16>),
    F16(CudaSlice<u16>),
}

/// A buffer from one element on, as a kernel's input.
pub(super) enum Arg<'a> {
    F32(CudaView<'a, f32>),
    F64(CudaView<'a, f64>),
    I32(CudaView<'a, i32>),
    Bool(CudaView<'a, bool>),
    Bits(CudaView<'a, u16>),
}

impl<'a> Arg<'a> {
    pub(super) fn push<'l>(&'l self, b: &mut LaunchArgs<'l>) {
        match self {
            Arg::F32(v) => b.arg(v),
            Arg::F64(v) => b.arg(v),
            Arg::I32(v) => b.arg(v),
            Arg::Bool(v) => b.arg(v),
            Arg::Bits(v) => b.arg(v),
        };
    }
}

impl Buf {
    /// A zero-filled buffer of `len` elements (at least one, so that every kernel gets a
    /// pointer) of `dtype`.
    pub(super) fn zeros(s: &Arc<CudaStream>, dtype: DType, len: usize) -> Result<Buf, KernelError> {
        let len = len.max(1);
        Ok(match dtype {
            DType::F32 => Buf::F32(s.alloc_zeros(len).map_err(driver)?),
            DType::F64 => Buf::F64(s.alloc_zeros(len).map_err(driver)?),
            DType::I32 => Buf::I32(s.alloc_zeros(len).map_err(driver)?),
            DType::Bool => Buf::Bool(s.alloc_zeros(len).map_err(driver)?),
            DType::Bf16 => Buf::Bf16(s.alloc_zeros(len).map_err(driver)?),
            DType::F16 => Buf::F16(s.alloc_zeros(len).map_err(driver)?),
        })
    }

    /// The buffer from element `offset` on.
    pub(super) fn at(&self, offset: usize) -> Arg<'_> {
        match self {
            Buf::F32(v) => Arg::F32(v.slice(offset..)),
            Buf::F64(v) => Arg::F64(v.slice(offset..)),
            Buf::I32(v) => Arg::I32(v.slice(offset..)),
            Buf::Bool(v) => Arg::Bool(v.slice(offset..)),
            Buf::Bf16(v) | Buf::F16(v) => Arg::Bits(v.slice(offset..)),
        }
    }

    /// Copies the first `n` elements to `out` from position `at` on (`None` when `out` holds
    /// another element type).
    pub(super) fn copy_to(
        &self,
        s: &Arc<CudaStream>,
        n: usize,
        out: &mut Buf,
        at: usize,
    ) -> Option<Result<(), KernelError>> {
        let r = match (self, out) {
            (Buf::F32(i), Buf::F32(o)) => s.memcpy_dtod(&i.slice(..n), &mut o.slice_mut(at..at + n)),
            (Buf::F64(i), Buf::F64(o)) => s.memcpy_dtod(&i.slice(..n), &mut o.slice_mut(at..at + n)),
            (Buf::I32(i), Buf::I32(o)) => s.memcpy_dtod(&i.slice(..n), &mut o.slice_mut(at..at + n)),
            (Buf::Bool(i), Buf::Bool(o)) => s.memcpy_dtod(&i.slice(..n), &mut o.slice_mut(at..at + n)),
            (Buf::Bf16(i), Buf::Bf16(o)) | (Buf::F16(i), Buf::F16(o)) => {
                s.memcpy_dtod(&i.slice(..n), &mut o.slice_mut(at..at + n))
            }
            _ => return None,
        };
        Some(r.map_err(driver))
    }

    /// The buffer as a kernel's output.
    pub(super) fn push_out<'l>(&'l mut self, b: &mut LaunchArgs<'l>) {
        match self {
            Buf::F32(v) => b.arg(v),
            Buf::F64(v) => b.arg(v),
            Buf::I32(v) => b.arg(v),
            Buf::Bool(v) => b.arg(v),
            Buf::Bf16(v) | Buf::F16(v) => b.arg(v),
        };
    }
}

/// One CUDA GPU: its context's streams (`Stream(i)` is the i-th; 0 the default), the loaded
/// `ops.cu` module, the elementwise kernels compiled so far and cuBLAS, when present.
pub struct CudaDevice {
    pub(super) name: String,
    arch: String,
    ctx: Arc<CudaContext>,
    streams: Mutex<Vec<Arc<CudaStream>>>,
    pub(super) module: Arc<CudaModule>,
    functions: Mutex<HashMap<String, CudaFunction>>,
    /// cuBLAS, made on the first product; `None` inside until then. Absent when the library is.
    blas: Option<Mutex<Option<CudaBlas>>>,
    /// The GPU's default memory pool, made a caching allocator (see [`caching_pool`]).
    pool: Option<Pool>,
}

/// A CUDA memory pool handle.
struct Pool(cudarc::driver::sys::CUmemoryPool);

// SAFETY: a pool handle is an opaque driver object that any thread may pass to the driver.
unsafe impl Send for Pool {}
// SAFETY: as above; the driver synchronizes its own use of the pool.
unsafe impl Sync for Pool {}

/// The GPU's default memory pool, from which cudarc's stream-ordered allocations
/// (`cuMemAllocAsync`) come, made a caching allocator: memory freed stays reserved for the next
/// allocations instead of going back to the driver at every synchronization (an unlimited
/// release threshold), as PyTorch's `cudaMallocAsync` backend keeps it. `None` where the GPU
/// has no memory pools (cudarc then allocates synchronously).
fn caching_pool(ctx: &CudaContext) -> Option<Pool> {
    use cudarc::driver::sys;
    if !ctx.has_async_alloc() {
        return None;
    }
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    let mut threshold = u64::MAX;
    // SAFETY: the out-pointers are valid; the device is the context's own.
    unsafe {
        let ok = sys::cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device()) == sys::CUresult::CUDA_SUCCESS
            && sys::cuMemPoolSetAttribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                (&mut threshold) as *mut u64 as *mut std::ffi::c_void,
            ) == sys::CUresult::CUDA_SUCCESS;
        ok.then_some(Pool(pool))
    }
}

impl Pool {
    /// A byte count the pool reports.
    fn bytes(&self, attr: cudarc::driver::sys::CUmemPool_attribute) -> u64 {
        let mut v = 0u64;
        // SAFETY: the handle is the default pool of a live context; `v` receives a 64-bit count.
        let r = unsafe { cudarc::driver::sys::cuMemPoolGetAttribute(self.0, attr, (&mut v) as *mut u64 as *mut _) };
        if r == cudarc::driver::sys::CUresult::CUDA_SUCCESS {
            v
        } else {
            0
        }
    }
}

pub(super) fn driver(e: impl std::fmt::Debug) -> KernelError {
    KernelError::Invalid(format!("cuda: {e:?}"))
}

impl CudaDevice {
    /// GPU `ordinal`, with `ops.cu` compiled for its compute capability; an error (never a
    /// panic) when the driver or the GPU is absent.
    pub fn new(ordinal: usize) -> Result<CudaDevice, KernelError> {
        if !driver_present() {
            return Err(KernelError::Invalid("no CUDA driver (libcuda.so) on this machine".into()));
        }
        let count = CudaContext::device_count().map_err(driver)?;
        if ordinal as i64 >= i64::from(count) {
            let gpus = if count == 1 { "1 GPU".to_string() } else { format!("{count} GPUs") };
            return Err(KernelError::Invalid(format!("this machine has {gpus}, numbered from 0")));
        }
        let ctx = CudaContext::new(ordinal).map_err(driver)?;
        let (major, minor) = ctx.compute_capability().map_err(driver)?;
        let arch = format!("sm_{major}{minor}");
        let cubin = compile_cubin(OPS_SOURCE, &arch, NVRTC_OPTIONS).map_err(KernelError::Invalid)?;
        let module = ctx.load_module(cudarc::nvrtc::Ptx::from_binary(cubin)).map_err(driver)?;
        // SAFETY: only tries to open the library by its candidate names.
        let blas = unsafe { cudarc::cublas::sys::is_culib_present() }.then(|| Mutex::new(None));
        let pool = caching_pool(&ctx);
        Ok(CudaDevice {
            name: format!("cuda:{ordinal}"),
            arch,
            streams: Mutex::new(vec![ctx.default_stream()]),
            ctx,
            module,
            functions: Mutex::new(HashMap::new()),
            blas,
            pool,
        })
    }

    fn poisoned(&self, what: &str) -> KernelError {
        KernelError::Invalid(format!("{}: {what} poisoned by an earlier panic", self.name))
    }

    pub(super) fn stream(&self, s: Stream) -> Result<Arc<CudaStream>, KernelError> {
        let streams = self.streams.lock().map_err(|_| self.poisoned("streams"))?;
        streams
            .get(s.0 as usize)
            .cloned()
            .ok_or_else(|| KernelError::Invalid(format!("{}: no stream {}", self.name, s.0)))
    }

    fn default_stream(&self) -> Result<Arc<CudaStream>, KernelError> {
        self.stream(Stream::DEFAULT)
    }

    /// Generated kernel `name` of the source `source()` writes, compiled on its first use and
    /// kept under `key` (which names the source exactly).
    pub(super) fn function(
        &self,
        key: &str,
        name: &str,
        source: impl FnOnce() -> Option<String>,
    ) -> Result<CudaFunction, KernelError> {
        let mut cache = self.functions.lock().map_err(|_| self.poisoned("kernel cache"))?;
        if let Some(f) = cache.get(key) {
            return Ok(f.clone());
        }
        let src = source().ok_or_else(|| KernelError::Invalid(format!("{}: no kernel {name}", self.name)))?;
        let cubin = compile_cubin(&src, &self.arch, NVRTC_OPTIONS).map_err(KernelError::Invalid)?;
        let module = self.ctx.load_module(cudarc::nvrtc::Ptx::from_binary(cubin)).map_err(driver)?;
        let f = module.load_function(name).map_err(driver)?;
        cache.insert(key.to_string(), f.clone());
        Ok(f)
    }

    /// cuBLAS on stream `s`.
    pub(super) fn blas(&self, s: &Arc<CudaStream>) -> Result<MutexGuard<'_, Option<CudaBlas>>, KernelError> {
        let blas = self.blas.as_ref().ok_or_else(|| {
            KernelError::Invalid(format!("{}: cuBLAS (libcublas.so) is not on this machine", self.name))
        })?;
        let mut guard = blas.lock().map_err(|_| self.poisoned("cuBLAS"))?;
        match guard.as_mut() {
            // SAFETY: the handle's earlier work was queued on streams of this context, which
            // cudarc orders against `s` through the buffers' events.
            Some(h) => unsafe { h.set_stream(s.clone()) }.map_err(driver)?,
            None => *guard = Some(CudaBlas::new(s.clone()).map_err(driver)?),
        }
        Ok(guard)
    }

    /// The whole buffer of `d` on the host, as a 1-D tensor.
    fn download_base(&self, d: &DeviceTensor) -> Result<Tensor, KernelError> {
        let s = self.default_stream()?;
        let len = d.base_len();
        match self.buf(d)? {
            Buf::F32(v) => Tensor::from_vec(vec![len], s.clone_dtoh(&v.slice(..len)).map_err(driver)?),
            Buf::F64(v) => Tensor::from_vec(vec![len], s.clone_dtoh(&v.slice(..len)).map_err(driver)?),
            Buf::I32(v) => Tensor::from_vec(vec![len], s.clone_dtoh(&v.slice(..len)).map_err(driver)?),
            Buf::Bool(v) => Tensor::from_vec(vec![len], s.clone_dtoh(&v.slice(..len)).map_err(driver)?),
            Buf::Bf16(v) => {
                let bits = s.clone_dtoh(&v.slice(..len)).map_err(driver)?;
                Tensor::from_vec(vec![len], bits.into_iter().map(half::bf16::from_bits).collect::<Vec<_>>())
            }
            Buf::F16(v) => {
                let bits = s.clone_dtoh(&v.slice(..len)).map_err(driver)?;
                Tensor::from_vec(vec![len], bits.into_iter().map(half::f16::from_bits).collect::<Vec<_>>())
            }
        }
    }

    /// `d` itself when contiguous; else what it selects, copied on the GPU by the identity
    /// conversion reading it through its strides (through the host past the kernels' rank).
    pub(super) fn dense(&self, d: &DeviceTensor, s: &Arc<CudaStream>) -> Result<DeviceTensor, KernelError> {
        if d.is_contiguous() {
            return Ok(d.clone());
        }
        if elem::storage_type(d.dtype()).is_some() && d.rank() <= elem::MAX_RANK {
            return self.elementwise(ElemOp::Cast, &[d], Some(d.dtype()), s);
        }
        let host = gather_host(&self.download_base(d)?, d)?;
        self.upload(&host)
    }

    pub(super) fn buf<'a>(&self, d: &'a DeviceTensor) -> Result<&'a Buf, KernelError> {
        d.buffer::<Buf>()
            .ok_or_else(|| KernelError::Invalid(format!("{}: this tensor belongs to another device", self.name)))
    }

    /// A new tensor of `shape` holding `b` (which may be longer by one: see [`Buf::zeros`]).
    pub(super) fn wrap(shape: Vec<usize>, dtype: DType, b: Buf) -> DeviceTensor {
        DeviceTensor::new(shape, dtype, Arc::new(b))
    }
}

/// Whether cuBLAS computes `op(a) @ op(b)` of these inputs in one call.
fn multiplies(inputs: &[&DeviceTensor], ta: bool, tb: bool) -> bool {
    matches!(inputs, [a, b] if a.dtype() == b.dtype() && GEMM.contains(&a.dtype())
        && gemm::plan(a.shape(), b.shape(), ta, tb).is_some())
}

/// The kernels the CUDA device's `launch_on` has, on the element types and shapes they take
/// (products only with cuBLAS, `blas`): its `Device::runs`, which tests without a GPU read too.
pub fn runs(kernel: KernelId, inputs: &[&DeviceTensor], p: &KernelParams, blas: bool) -> bool {
    let float = all(inputs, FLOATS);
    let dtypes: Vec<DType> = inputs.iter().map(|d| d.dtype()).collect();
    let one_rank = inputs.iter().all(|d| d.rank() <= elem::MAX_RANK);
    match kernel {
        KernelId::Unary(u) => one_rank && elem::result_type(ElemOp::Unary(u), &dtypes, None).is_some(),
        KernelId::Binary(b) => one_rank && elem::result_type(ElemOp::Binary(b), &dtypes, None).is_some(),
        KernelId::Where => one_rank && elem::result_type(ElemOp::Where, &dtypes, None).is_some(),
        KernelId::Cast => one_rank && elem::result_type(ElemOp::Cast, &dtypes, p.dtype).is_some(),
        KernelId::Fused => {
            one_rank
                && p.fused.as_deref().is_some_and(|t| {
                    elem::writes(t)
                        && t.inputs == inputs.len()
                        && inputs.iter().enumerate().all(|(k, d)| t.input_dtype(k).is_none_or(|x| x == d.dtype()))
                })
        }
        KernelId::Reduce(ReduceOp::Prod) => false,
        // Along an axis, or of every element.
        KernelId::Reduce(ReduceOp::Sum | ReduceOp::Mean | ReduceOp::Max | ReduceOp::Min)
        | KernelId::ArgMax
        | KernelId::ArgMin => float,
        KernelId::Softmax | KernelId::LogSoftmax | KernelId::Cumsum => float && p.axis.is_some(),
        KernelId::Matmul => blas && multiplies(inputs, false, false),
        KernelId::MatmulT { transpose_a, transpose_b } => blas && multiplies(inputs, transpose_a, transpose_b),
        KernelId::Gather => {
            matches!(dtypes[..], [DType::F32 | DType::F64, DType::I32]) && p.axis.is_some_and(|a| a < inputs[0].rank())
        }
        // Inputs: the tensor written into (absent through `launch_into`), the block.
        KernelId::Update => {
            matches!(dtypes[..], [DType::F32, DType::F32] | [DType::F64, DType::F64] | [DType::F32] | [DType::F64])
                && p.axis.is_some()
        }
        KernelId::OneHot => matches!(dtypes[..], [DType::I32]) && matches!(p.dtype, Some(DType::F32 | DType::F64)),
        KernelId::Attention => float && inputs.len() == 3 && inputs.iter().all(|d| d.dtype() == dtypes[0]),
        KernelId::Uniform | KernelId::Normal => {
            inputs.is_empty()
                && matches!(p.dtype, Some(DType::F32 | DType::F64))
                && p.region.as_ref().is_some_and(|r| RegionArg::new(r).is_some())
        }
        KernelId::Reshape | KernelId::ExpandDims | KernelId::Squeeze | KernelId::Contiguous => all(inputs, HELD),
        // Views of one input, copied by the identity conversion.
        KernelId::Transpose | KernelId::Permute | KernelId::BroadcastTo => {
            one_rank && p.shape.len() <= elem::MAX_RANK && all(inputs, HELD) && inputs.len() == 1
        }
        KernelId::SumToShape => float && inputs.len() == 1,
        // Along the first axis: the inputs' elements one after another.
        KernelId::Concat => {
            let rest = |d: &DeviceTensor| d.shape().get(1..).map(<[usize]>::to_vec);
            p.axis == Some(0)
                && all(inputs, HELD)
                && inputs.first().is_some_and(|a| {
                    a.rank() >= 1 && inputs.iter().all(|d| d.dtype() == a.dtype() && rest(d) == rest(a))
                })
        }
        KernelId::LogSumExp
        | KernelId::Stack
        | KernelId::Slice
        | KernelId::SliceUpdateAdd
        | KernelId::ScatterAdd
        | KernelId::Einsum
        | KernelId::Conv2d
        | KernelId::Conv2dInputGrad
        | KernelId::Conv2dWeightGrad
        | KernelId::MaxPool2d
        | KernelId::MaxPool2dGrad
        | KernelId::AvgPool2d
        | KernelId::AvgPool2dGrad
        | KernelId::AttentionWeights
        | KernelId::Argsort
        | KernelId::TakeAlong
        | KernelId::ScatterAddAlong
        | KernelId::Fill
        | KernelId::Arange
        | KernelId::Eye => false,
    }
}

/// Whether every input has one of the element types `ok`.
fn all(inputs: &[&DeviceTensor], ok: &[DType]) -> bool {
    inputs.iter().all(|d| ok.contains(&d.dtype()))
}

const FLOATS: &[DType] = &[DType::F32, DType::F64];
/// What a buffer here holds.
const HELD: &[DType] = &[DType::F32, DType::F64, DType::I32, DType::Bool, DType::Bf16, DType::F16];
/// What cuBLAS multiplies (the storage-only types with f32 accumulation).
const GEMM: &[DType] = &[DType::F32, DType::F64, DType::Bf16, DType::F16];

/// The bits of storage-only values.
fn bits<T: Copy>(v: &[T], f: fn(T) -> u16) -> Vec<u16> {
    v.iter().map(|&x| f(x)).collect()
}

impl Device for CudaDevice {
    fn name(&self) -> &str {
        &self.name
    }

    /// The kernels `launch_on` has, on the element types and shapes they take.
    fn runs(&self, kernel: KernelId, inputs: &[&DeviceTensor], p: &KernelParams) -> bool {
        runs(kernel, inputs, p, self.blas.is_some())
    }

    fn accelerates(&self, kernel: KernelId, inputs: &[&DeviceTensor], p: &KernelParams) -> bool {
        self.runs(kernel, inputs, p)
    }

    fn alloc(&self, dtype: DType, len: usize) -> Result<DeviceTensor, KernelError> {
        let b = Buf::zeros(&self.default_stream()?, dtype, len)?;
        Ok(Self::wrap(vec![len], dtype, b))
    }

    fn upload(&self, t: &Tensor) -> Result<DeviceTensor, KernelError> {
        let s = &self.default_stream()?;
        if t.is_empty() {
            return Ok(Self::wrap(t.shape().to_vec(), t.dtype(), Buf::zeros(s, t.dtype(), 0)?));
        }
        let b = if let Some(v) = t.as_f32() {
            Buf::F32(s.clone_htod(v).map_err(driver)?)
        } else if let Some(v) = t.as_f64() {
            Buf::F64(s.clone_htod(v).map_err(driver)?)
        } else if let Some(v) = t.as_i32() {
            Buf::I32(s.clone_htod(v).map_err(driver)?)
        } else if let Some(v) = t.as_bool() {
            Buf::Bool(s.clone_htod(v).map_err(driver)?)
        } else {
            match t.storage() {
                Storage::Bf16(v) => Buf::Bf16(s.clone_htod(&bits(v.as_slice(), half::bf16::to_bits)).map_err(driver)?),
                Storage::F16(v) => Buf::F16(s.clone_htod(&bits(v.as_slice(), half::f16::to_bits)).map_err(driver)?),
                Storage::F32(_) | Storage::F64(_) | Storage::I32(_) | Storage::Bool(_) => {
                    return Err(KernelError::dtype("cuda upload", "a tensor", t.dtype()))
                }
            }
        };
        Ok(Self::wrap(t.shape().to_vec(), t.dtype(), b))
    }

    fn download(&self, d: &DeviceTensor) -> Result<Tensor, KernelError> {
        if d.is_empty() {
            return crate::ops::zeros(d.dtype(), d.shape());
        }
        // The whole buffer of a contiguous tensor is its elements in order.
        let d = self.dense(d, &self.default_stream()?)?;
        crate::ops::reshape(&self.download_base(&d)?, d.shape())
    }

    fn launch_on(
        &self,
        stream: Stream,
        kernel: KernelId,
        inputs: &[&DeviceTensor],
        p: &KernelParams,
    ) -> Result<DeviceTensor, KernelError> {
        let s = &self.stream(stream)?;
        // Generated kernels read views through their strides; the others read contiguous inputs.
        let strided = matches!(
            kernel,
            KernelId::Unary(_)
                | KernelId::Binary(_)
                | KernelId::Where
                | KernelId::Cast
                | KernelId::Fused
                | KernelId::Transpose
                | KernelId::Permute
                | KernelId::BroadcastTo
        );
        if strided {
            return self.kernel(kernel, inputs, p, s);
        }
        let dense: Vec<DeviceTensor> = inputs.iter().map(|d| self.dense(d, s)).collect::<Result<_, _>>()?;
        let inputs: Vec<&DeviceTensor> = dense.iter().collect();
        self.kernel(kernel, &inputs, p, s)
    }

    fn copy_into(&self, stream: Stream, src: &DeviceTensor, dst: &mut DeviceTensor) -> Result<(), KernelError> {
        let s = self.stream(stream)?;
        if !dst.is_contiguous() || dst.len() != src.len() || dst.dtype() != src.dtype() {
            return Err(KernelError::Invalid(format!(
                "{}: an output must be contiguous, of the input's size and dtype",
                self.name
            )));
        }
        let src = self.dense(src, &s)?;
        let name = self.name.clone();
        let mismatch = || KernelError::Invalid(format!("{name}: copy between element types or devices"));
        let input = src.buffer::<Buf>().ok_or_else(mismatch)?;
        let out = dst.buffer_mut::<Buf>().ok_or_else(|| {
            KernelError::Invalid(format!("{}: an output that is shared or on another device", self.name))
        })?;
        input.copy_to(&s, src.len(), out, 0).ok_or_else(mismatch)?
    }

    fn contiguous(&self, stream: Stream, d: &DeviceTensor) -> Result<DeviceTensor, KernelError> {
        self.dense(d, &self.stream(stream)?)
    }

    fn new_stream(&self) -> Result<Stream, KernelError> {
        let s = self.ctx.new_stream().map_err(driver)?;
        let mut streams = self.streams.lock().map_err(|_| self.poisoned("streams"))?;
        streams.push(s);
        Ok(Stream(streams.len() as u32 - 1))
    }

    fn synchronize_stream(&self, stream: Stream) -> Result<(), KernelError> {
        self.stream(stream)?.synchronize().map_err(driver)
    }

    fn synchronize(&self) -> Result<(), KernelError> {
        self.ctx.synchronize().map_err(driver)
    }

    /// What the caching pool holds beyond what live buffers use (the driver counts bytes, not
    /// blocks or reuses).
    fn memory(&self) -> MemoryStats {
        use cudarc::driver::sys::CUmemPool_attribute as A;
        let Some(p) = &self.pool else { return MemoryStats::default() };
        let reserved = p.bytes(A::CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT);
        let used = p.bytes(A::CU_MEMPOOL_ATTR_USED_MEM_CURRENT);
        MemoryStats { cached_bytes: reserved.saturating_sub(used) as usize, ..MemoryStats::default() }
    }
}

/// Checks that `inputs` holds `n` tensors.
pub(super) fn take<'a, const N: usize>(
    kernel: KernelId,
    inputs: &[&'a DeviceTensor],
) -> Result<[&'a DeviceTensor; N], KernelError> {
    arity(kernel, inputs, N)?;
    inputs.try_into().map_err(|_| KernelError::Invalid(format!("kernel {kernel:?} takes {N} inputs")))
}
