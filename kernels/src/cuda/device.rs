//! The CUDA device behind the [`Device`] trait: `ops.cu` compiled by NVRTC for the GPU's own
//! architecture, buffers and launches through cudarc on its streams (the context's default
//! one and any `new_stream` makes; cudarc's events order a buffer's uses across them).
//!
//! It runs the kernels `ops.cu` holds (reductions over one axis, arg-max/min, softmax,
//! log-softmax, cumsum, gather) and the shape-only kernels (reshape, expand/squeeze dims), on
//! f32 and f64; every other kernel answers an error naming it, so a caller falls back or stops
//! clearly. A view input is made contiguous first; a view is copied through the host (a
//! strided-copy kernel is still to come), and device-to-device copies stay on the GPU. Nothing here has run on a GPU yet: the test suite's machines have none, and
//! `kernels/tests/cuda_device.rs` skips with the reason there; `scripts/gpu_check.sh` runs it
//! on a machine that has one.

use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaContext, CudaModule, CudaSlice, CudaStream, LaunchConfig, PushKernelArg};

use super::{compile_cubin, driver_present, NVRTC_OPTIONS, OPS_SOURCE};
use crate::cpu::reduce::ReduceOp;
use crate::device::{arity, gather_host, need_axis, Device, DeviceTensor, KernelId, KernelParams, MemoryStats, Stream};
use crate::error::KernelError;
use crate::tensor::{DType, Tensor};

/// A buffer on the GPU, of one element type.
enum Buf {
    F32(CudaSlice<f32>),
    F64(CudaSlice<f64>),
    I32(CudaSlice<i32>),
}

/// One CUDA GPU: its context's streams (`Stream(i)` is the i-th; 0 the default) and the
/// loaded `ops.cu` module.
pub struct CudaDevice {
    name: String,
    streams: Mutex<Vec<Arc<CudaStream>>>,
    module: Arc<CudaModule>,
}

fn driver(e: impl std::fmt::Debug) -> KernelError {
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
            return Err(KernelError::Invalid(format!("no CUDA device cuda:{ordinal} ({count} on this machine)")));
        }
        let ctx = CudaContext::new(ordinal).map_err(driver)?;
        let (major, minor) = ctx.compute_capability().map_err(driver)?;
        let arch = format!("sm_{major}{minor}");
        let cubin = compile_cubin(OPS_SOURCE, &arch, NVRTC_OPTIONS).map_err(KernelError::Invalid)?;
        let module = ctx.load_module(cudarc::nvrtc::Ptx::from_binary(cubin)).map_err(driver)?;
        Ok(CudaDevice { name: format!("cuda:{ordinal}"), streams: Mutex::new(vec![ctx.default_stream()]), module })
    }

    fn stream(&self, s: Stream) -> Result<Arc<CudaStream>, KernelError> {
        let streams =
            self.streams.lock().map_err(|_| KernelError::Invalid(format!("{}: streams poisoned", self.name)))?;
        streams
            .get(s.0 as usize)
            .cloned()
            .ok_or_else(|| KernelError::Invalid(format!("{}: no stream {}", self.name, s.0)))
    }

    fn default_stream(&self) -> Result<Arc<CudaStream>, KernelError> {
        self.stream(Stream::DEFAULT)
    }

    /// The whole buffer of `d` on the host, as a 1-D tensor.
    fn download_base(&self, d: &DeviceTensor) -> Result<Tensor, KernelError> {
        let s = self.default_stream()?;
        let len = d.base_len();
        match self.buf(d)? {
            Buf::F32(v) => Tensor::from_vec(vec![len], s.clone_dtoh(v).map_err(driver)?),
            Buf::F64(v) => Tensor::from_vec(vec![len], s.clone_dtoh(v).map_err(driver)?),
            Buf::I32(v) => Tensor::from_vec(vec![len], s.clone_dtoh(v).map_err(driver)?),
        }
    }

    fn buf<'a>(&self, d: &'a DeviceTensor) -> Result<&'a Buf, KernelError> {
        d.buffer::<Buf>()
            .ok_or_else(|| KernelError::Invalid(format!("{}: this tensor belongs to another device", self.name)))
    }

    fn wrap(shape: Vec<usize>, dtype: DType, b: Buf) -> DeviceTensor {
        DeviceTensor::new(shape, dtype, Arc::new(b))
    }

    /// Runs `msl_{name}_{f32|f64}` over `x` viewed as `[outer, n, inner]` around `axis`.
    fn axis_kernel(
        &self,
        name: &str,
        x: &DeviceTensor,
        axis: usize,
        out_shape: Vec<usize>,
        ints: bool,
        s: &Arc<CudaStream>,
    ) -> Result<DeviceTensor, KernelError> {
        let shape = x.shape();
        if axis >= shape.len() {
            return Err(KernelError::AxisOutOfRange { op: "cuda kernel", axis, rank: shape.len() });
        }
        let outer: usize = shape[..axis].iter().product();
        let inner: usize = shape[axis + 1..].iter().product();
        let (o, n, i) = (outer as i64, shape[axis] as i64, inner as i64);
        let len: usize = out_shape.iter().product();
        let cfg = LaunchConfig::for_num_elems((outer * inner).clamp(1, u32::MAX as usize) as u32);
        macro_rules! go {
            ($src:expr, $suffix:literal, $out:ty, $variant:ident, $dt:expr) => {{
                let f = self.module.load_function(&format!("msl_{name}_{}", $suffix)).map_err(driver)?;
                let mut out: CudaSlice<$out> = s.alloc_zeros(len.max(1)).map_err(driver)?;
                let mut b = s.launch_builder(&f);
                b.arg($src).arg(&mut out).arg(&o).arg(&n).arg(&i);
                // SAFETY: the kernel reads `outer * n * inner` elements of the input and writes
                // `len` elements of `out`, both allocated with those lengths.
                unsafe { b.launch(cfg) }.map_err(driver)?;
                Ok(Self::wrap(out_shape, $dt, Buf::$variant(out)))
            }};
        }
        match (self.buf(x)?, ints) {
            (Buf::F32(v), false) => go!(v, "f32", f32, F32, DType::F32),
            (Buf::F64(v), false) => go!(v, "f64", f64, F64, DType::F64),
            (Buf::F32(v), true) => go!(v, "f32", i32, I32, DType::I32),
            (Buf::F64(v), true) => go!(v, "f64", i32, I32, DType::I32),
            (Buf::I32(_), _) => Err(KernelError::dtype("cuda kernel", "a float tensor", DType::I32)),
        }
    }
}

/// The shape a reduction over `axis` leaves.
fn reduced(shape: &[usize], axis: usize, keepdims: bool) -> Vec<usize> {
    let mut out = shape.to_vec();
    if keepdims {
        out[axis] = 1;
    } else {
        out.remove(axis);
    }
    out
}

impl Device for CudaDevice {
    fn name(&self) -> &str {
        &self.name
    }

    /// The kernels `launch_on` has, on the element types its buffers and `ops.cu` take.
    fn runs(&self, kernel: KernelId, inputs: &[DType]) -> bool {
        let float = inputs.iter().all(|d| matches!(d, DType::F32 | DType::F64));
        let held = inputs.iter().all(|d| matches!(d, DType::F32 | DType::F64 | DType::I32));
        match kernel {
            KernelId::Reduce(ReduceOp::Prod) => false,
            KernelId::Reduce(_)
            | KernelId::ArgMax
            | KernelId::ArgMin
            | KernelId::Softmax
            | KernelId::LogSoftmax
            | KernelId::Cumsum => float,
            KernelId::Reshape | KernelId::ExpandDims | KernelId::Squeeze | KernelId::Contiguous => held,
            KernelId::Unary(_)
            | KernelId::Binary(_)
            | KernelId::Where
            | KernelId::LogSumExp
            | KernelId::Matmul
            | KernelId::MatmulT { .. }
            | KernelId::Cast
            | KernelId::Transpose
            | KernelId::Permute
            | KernelId::Concat
            | KernelId::Stack
            | KernelId::BroadcastTo
            | KernelId::SumToShape
            | KernelId::Slice
            | KernelId::SliceUpdateAdd
            | KernelId::Gather
            | KernelId::ScatterAdd
            | KernelId::OneHot
            | KernelId::Einsum
            | KernelId::Conv2d
            | KernelId::Conv2dInputGrad
            | KernelId::Conv2dWeightGrad
            | KernelId::MaxPool2d
            | KernelId::MaxPool2dGrad
            | KernelId::AvgPool2d
            | KernelId::AvgPool2dGrad
            | KernelId::Attention
            | KernelId::AttentionWeights
            | KernelId::Argsort
            | KernelId::TakeAlong
            | KernelId::ScatterAddAlong
            | KernelId::Fill
            | KernelId::Arange
            | KernelId::Eye
            | KernelId::Uniform
            | KernelId::Normal
            | KernelId::Update => false,
        }
    }

    fn alloc(&self, dtype: DType, len: usize) -> Result<DeviceTensor, KernelError> {
        let s = &self.default_stream()?;
        let b = match dtype {
            DType::F32 => Buf::F32(s.alloc_zeros(len).map_err(driver)?),
            DType::F64 => Buf::F64(s.alloc_zeros(len).map_err(driver)?),
            DType::I32 => Buf::I32(s.alloc_zeros(len).map_err(driver)?),
            d => return Err(KernelError::dtype("cuda alloc", "f32, f64 or i32", d)),
        };
        Ok(Self::wrap(vec![len], dtype, b))
    }

    fn upload(&self, t: &Tensor) -> Result<DeviceTensor, KernelError> {
        let s = &self.default_stream()?;
        let b = if let Some(v) = t.as_f32() {
            Buf::F32(s.clone_htod(v).map_err(driver)?)
        } else if let Some(v) = t.as_f64() {
            Buf::F64(s.clone_htod(v).map_err(driver)?)
        } else if let Some(v) = t.as_i32() {
            Buf::I32(s.clone_htod(v).map_err(driver)?)
        } else {
            return Err(KernelError::dtype("cuda upload", "f32, f64 or i32", t.dtype()));
        };
        Ok(Self::wrap(t.shape().to_vec(), t.dtype(), b))
    }

    fn download(&self, d: &DeviceTensor) -> Result<Tensor, KernelError> {
        let base = self.download_base(d)?;
        gather_host(&base, d)
    }

    fn launch_on(
        &self,
        stream: Stream,
        kernel: KernelId,
        inputs: &[&DeviceTensor],
        p: &KernelParams,
    ) -> Result<DeviceTensor, KernelError> {
        let s = &self.stream(stream)?;
        let dense: Vec<DeviceTensor> = inputs.iter().map(|d| self.contiguous(stream, d)).collect::<Result<_, _>>()?;
        let inputs: Vec<&DeviceTensor> = dense.iter().collect();
        let inputs = &inputs[..];
        if kernel == KernelId::Contiguous {
            return arity(kernel, inputs, 1).map(|()| inputs[0].clone());
        }
        // Every kernel this device runs takes one input.
        let one = || arity(kernel, inputs, 1).map(|()| inputs[0]);
        let axis = || need_axis(kernel, p);
        match kernel {
            KernelId::Reduce(op) => {
                let x = one()?;
                let a = axis()?;
                let name = match op {
                    ReduceOp::Sum => "sum",
                    ReduceOp::Mean => "mean",
                    ReduceOp::Max => "max",
                    ReduceOp::Min => "min",
                    ReduceOp::Prod => return Err(KernelError::Invalid(format!("{}: no prod kernel yet", self.name))),
                };
                self.axis_kernel(name, x, a, reduced(x.shape(), a, p.keepdims), false, s)
            }
            KernelId::ArgMax | KernelId::ArgMin => {
                let x = one()?;
                let a = axis()?;
                let name = if kernel == KernelId::ArgMax { "argmax" } else { "argmin" };
                self.axis_kernel(name, x, a, reduced(x.shape(), a, p.keepdims), true, s)
            }
            KernelId::Softmax => self.axis_kernel("softmax", one()?, axis()?, one()?.shape().to_vec(), false, s),
            KernelId::LogSoftmax => self.axis_kernel("log_softmax", one()?, axis()?, one()?.shape().to_vec(), false, s),
            KernelId::Cumsum => self.axis_kernel("cumsum", one()?, axis()?, one()?.shape().to_vec(), false, s),
            // Shape only: the same buffer under the new shape.
            KernelId::Reshape => reshaped(one()?, p.shape.clone()),
            KernelId::ExpandDims => {
                let x = one()?;
                let mut shape = x.shape().to_vec();
                shape.insert(axis()?.min(shape.len()), 1);
                reshaped(x, shape)
            }
            KernelId::Squeeze => {
                let x = one()?;
                let mut shape = x.shape().to_vec();
                match p.axis {
                    Some(a) if shape.get(a) == Some(&1) => {
                        shape.remove(a);
                    }
                    Some(a) => return Err(KernelError::AxisOutOfRange { op: "squeeze", axis: a, rank: shape.len() }),
                    None => shape.retain(|&d| d != 1),
                }
                reshaped(x, shape)
            }
            other => {
                // any other kernel: not on this device yet (the CPU device runs every kernel)
                Err(KernelError::Invalid(format!("{}: kernel {other:?} does not run on this device yet", self.name)))
            }
        }
    }

    fn copy_into(&self, stream: Stream, src: &DeviceTensor, dst: &mut DeviceTensor) -> Result<(), KernelError> {
        let s = self.stream(stream)?;
        if !dst.is_contiguous() || dst.len() != src.len() || dst.dtype() != src.dtype() {
            return Err(KernelError::Invalid(format!(
                "{}: an output must be contiguous, of the input's size and dtype",
                self.name
            )));
        }
        let host = if src.is_contiguous() { None } else { Some(self.download(src)?) };
        let name = self.name.clone();
        let out = dst
            .buffer_mut::<Buf>()
            .ok_or_else(|| KernelError::Invalid(format!("{name}: an output that is shared or on another device")))?;
        let mismatch = || KernelError::Invalid(format!("{name}: copy between element types"));
        match (host, out) {
            (Some(h), Buf::F32(o)) => s.memcpy_htod(h.as_f32().ok_or_else(mismatch)?, o).map_err(driver),
            (Some(h), Buf::F64(o)) => s.memcpy_htod(h.as_f64().ok_or_else(mismatch)?, o).map_err(driver),
            (Some(h), Buf::I32(o)) => s.memcpy_htod(h.as_i32().ok_or_else(mismatch)?, o).map_err(driver),
            (None, o) => match (src.buffer::<Buf>().ok_or_else(mismatch)?, o) {
                (Buf::F32(i), Buf::F32(o)) => s.memcpy_dtod(i, o).map_err(driver),
                (Buf::F64(i), Buf::F64(o)) => s.memcpy_dtod(i, o).map_err(driver),
                (Buf::I32(i), Buf::I32(o)) => s.memcpy_dtod(i, o).map_err(driver),
                _ => Err(mismatch()),
            },
        }
    }

    fn new_stream(&self) -> Result<Stream, KernelError> {
        let s = self.default_stream()?.context().new_stream().map_err(driver)?;
        let mut streams =
            self.streams.lock().map_err(|_| KernelError::Invalid(format!("{}: streams poisoned", self.name)))?;
        streams.push(s);
        Ok(Stream(streams.len() as u32 - 1))
    }

    fn synchronize_stream(&self, stream: Stream) -> Result<(), KernelError> {
        self.stream(stream)?.synchronize().map_err(driver)
    }

    fn synchronize(&self) -> Result<(), KernelError> {
        self.default_stream()?.context().synchronize().map_err(driver)
    }

    /// No caching allocator yet: cudarc allocates and frees each buffer on its stream.
    fn memory(&self) -> MemoryStats {
        MemoryStats::default()
    }
}

/// `x`'s buffer under `shape`, which must hold as many elements.
fn reshaped(x: &DeviceTensor, shape: Vec<usize>) -> Result<DeviceTensor, KernelError> {
    if shape.iter().product::<usize>() != x.len() {
        return Err(KernelError::DataLength { shape, len: x.len() });
    }
    Ok(x.with_shape(shape))
}
