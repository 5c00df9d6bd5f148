//! The device trait: what msl needs from a place that stores tensors and runs kernels.
//!
//! The trait assumes nothing about the host. A device owns its buffers behind an opaque
//! handle ([`DeviceTensor`]), kernels are named by a closed enum ([`KernelId`]) with their
//! arguments in [`KernelParams`], and data moves only through `upload` and `download`.
//! [`CpuDevice`] implements every kernel id by calling the `ops` functions, so `ops` is the
//! reference that later devices (CUDA, NPU) are tested against.

use std::any::Any;
use std::sync::Arc;

use crate::cpu::elementwise::{BinaryOp, UnaryOp};
use crate::cpu::index::SliceSpec;
use crate::cpu::reduce::ReduceOp;
use crate::error::KernelError;
use crate::ops;
use crate::tensor::{DType, Tensor};

/// Names each kernel a device can run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KernelId {
    Unary(UnaryOp),
    Binary(BinaryOp),
    /// Inputs: condition, then the two branches.
    Where,
    /// Uses `axis` and `keepdims`.
    Reduce(ReduceOp),
    ArgMax,
    ArgMin,
    LogSumExp,
    /// Uses `axis` (required).
    Softmax,
    LogSoftmax,
    Cumsum,
    Matmul,
    /// `op(a) @ op(b)` with the last two axes of `a` and/or `b` swapped.
    MatmulT {
        transpose_a: bool,
        transpose_b: bool,
    },
    /// Uses `dtype`.
    Cast,
    /// Uses `shape`.
    Reshape,
    Transpose,
    /// Uses `perm`.
    Permute,
    /// Any number of inputs; uses `axis`.
    Concat,
    Stack,
    ExpandDims,
    /// Uses `axis` (`None` removes every size-1 axis).
    Squeeze,
    BroadcastTo,
    SumToShape,
    /// Uses `slices`.
    Slice,
    /// Uses `shape` (the base shape) and `slices`.
    SliceUpdateAdd,
    /// Inputs: data, indices; uses `axis`.
    Gather,
    /// Inputs: indices, updates; uses `shape` (the data shape) and `axis`.
    ScatterAdd,
    /// Uses `n` and `dtype`.
    OneHot,
    /// Any number of inputs; uses `spec`.
    Einsum,
}

/// The non-tensor arguments of a kernel; each kernel reads the fields its [`KernelId`] lists.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct KernelParams {
    pub axis: Option<usize>,
    pub keepdims: bool,
    pub shape: Vec<usize>,
    pub perm: Vec<usize>,
    pub slices: Vec<SliceSpec>,
    pub n: usize,
    pub dtype: Option<DType>,
    pub spec: String,
}

impl KernelParams {
    pub fn new() -> KernelParams {
        KernelParams::default()
    }
    pub fn axis(mut self, axis: usize) -> Self {
        self.axis = Some(axis);
        self
    }
    pub fn keepdims(mut self, keepdims: bool) -> Self {
        self.keepdims = keepdims;
        self
    }
    pub fn shape(mut self, shape: &[usize]) -> Self {
        self.shape = shape.to_vec();
        self
    }
    pub fn perm(mut self, perm: &[usize]) -> Self {
        self.perm = perm.to_vec();
        self
    }
    pub fn slices(mut self, slices: &[SliceSpec]) -> Self {
        self.slices = slices.to_vec();
        self
    }
    pub fn n(mut self, n: usize) -> Self {
        self.n = n;
        self
    }
    pub fn dtype(mut self, dtype: DType) -> Self {
        self.dtype = Some(dtype);
        self
    }
    pub fn spec(mut self, spec: &str) -> Self {
        self.spec = spec.to_string();
        self
    }
}

/// A tensor that lives on some device: its shape, dtype and an opaque buffer that only the
/// device that made it understands.
#[derive(Clone)]
pub struct DeviceTensor {
    shape: Vec<usize>,
    dtype: DType,
    buffer: Arc<dyn Any + Send + Sync>,
}

impl std::fmt::Debug for DeviceTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceTensor").field("shape", &self.shape).field("dtype", &self.dtype).finish_non_exhaustive()
    }
}

impl DeviceTensor {
    /// Wraps a device's own buffer. Devices call this; users get device tensors from them.
    pub fn new(shape: Vec<usize>, dtype: DType, buffer: Arc<dyn Any + Send + Sync>) -> DeviceTensor {
        DeviceTensor { shape, dtype, buffer }
    }
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The same buffer under another shape of as many elements (a reshape on any device).
    pub fn with_shape(&self, shape: Vec<usize>) -> DeviceTensor {
        DeviceTensor { shape, dtype: self.dtype, buffer: self.buffer.clone() }
    }
    /// The buffer as the device's own type `B`, or `None` when another device made it.
    pub fn buffer<B: Any>(&self) -> Option<&B> {
        self.buffer.downcast_ref::<B>()
    }
}

/// A place that stores tensors and runs kernels on them.
pub trait Device: Send + Sync {
    /// A short name such as `"cpu"` or `"cuda:0"`.
    fn name(&self) -> &str;
    /// A zero-filled 1-D tensor of `len` elements on the device.
    fn alloc(&self, dtype: DType, len: usize) -> Result<DeviceTensor, KernelError>;
    /// Copies a host tensor to the device.
    fn upload(&self, t: &Tensor) -> Result<DeviceTensor, KernelError>;
    /// Copies a device tensor back to the host.
    fn download(&self, d: &DeviceTensor) -> Result<Tensor, KernelError>;
    /// Runs one kernel and returns its output (which may still be being computed until
    /// `synchronize` on asynchronous devices).
    fn launch(
        &self,
        kernel: KernelId,
        inputs: &[&DeviceTensor],
        params: &KernelParams,
    ) -> Result<DeviceTensor, KernelError>;
    /// Waits until every launched kernel has finished.
    fn synchronize(&self) -> Result<(), KernelError>;
}

/// The host CPU; its buffers are host tensors and its kernels are the `ops` functions.
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuDevice;

impl CpuDevice {
    fn host<'a>(&self, d: &'a DeviceTensor) -> Result<&'a Tensor, KernelError> {
        d.buffer::<Tensor>().ok_or_else(|| KernelError::Invalid("cpu: this tensor belongs to another device".into()))
    }
    fn wrap(t: Tensor) -> DeviceTensor {
        DeviceTensor::new(t.shape().to_vec(), t.dtype(), Arc::new(t))
    }
}

pub(crate) fn arity(kernel: KernelId, inputs: &[&DeviceTensor], n: usize) -> Result<(), KernelError> {
    if inputs.len() == n {
        Ok(())
    } else {
        Err(KernelError::Invalid(format!("kernel {kernel:?} takes {n} inputs, got {}", inputs.len())))
    }
}

pub(crate) fn need_axis(kernel: KernelId, p: &KernelParams) -> Result<usize, KernelError> {
    p.axis.ok_or_else(|| KernelError::Invalid(format!("kernel {kernel:?} needs an axis")))
}

fn need_dtype(kernel: KernelId, p: &KernelParams) -> Result<DType, KernelError> {
    p.dtype.ok_or_else(|| KernelError::Invalid(format!("kernel {kernel:?} needs a dtype")))
}

impl Device for CpuDevice {
    fn name(&self) -> &str {
        "cpu"
    }

    fn alloc(&self, dtype: DType, len: usize) -> Result<DeviceTensor, KernelError> {
        Ok(CpuDevice::wrap(ops::zeros(dtype, &[len])?))
    }

    fn upload(&self, t: &Tensor) -> Result<DeviceTensor, KernelError> {
        Ok(CpuDevice::wrap(t.clone()))
    }

    fn download(&self, d: &DeviceTensor) -> Result<Tensor, KernelError> {
        self.host(d).cloned()
    }

    fn launch(
        &self,
        kernel: KernelId,
        inputs: &[&DeviceTensor],
        p: &KernelParams,
    ) -> Result<DeviceTensor, KernelError> {
        let xs: Vec<&Tensor> = inputs.iter().map(|d| self.host(d)).collect::<Result<_, _>>()?;
        let one = || -> Result<&Tensor, KernelError> {
            arity(kernel, inputs, 1)?;
            Ok(xs[0])
        };
        let two = || -> Result<(&Tensor, &Tensor), KernelError> {
            arity(kernel, inputs, 2)?;
            Ok((xs[0], xs[1]))
        };
        let out = match kernel {
            KernelId::Unary(op) => ops::unary(op, one()?)?,
            KernelId::Binary(op) => {
                let (a, b) = two()?;
                ops::binary(op, a, b)?
            }
            KernelId::Where => {
                arity(kernel, inputs, 3)?;
                ops::where_(xs[0], xs[1], xs[2])?
            }
            KernelId::Reduce(op) => ops::reduce(op, one()?, p.axis, p.keepdims)?,
            KernelId::ArgMax => ops::argmax(one()?, p.axis, p.keepdims)?,
            KernelId::ArgMin => ops::argmin(one()?, p.axis, p.keepdims)?,
            KernelId::LogSumExp => ops::logsumexp(one()?, p.axis, p.keepdims)?,
            KernelId::Softmax => ops::softmax(one()?, need_axis(kernel, p)?)?,
            KernelId::LogSoftmax => ops::log_softmax(one()?, need_axis(kernel, p)?)?,
            KernelId::Cumsum => ops::cumsum(one()?, need_axis(kernel, p)?)?,
            KernelId::Matmul => {
                let (a, b) = two()?;
                ops::matmul(a, b)?
            }
            KernelId::MatmulT { transpose_a, transpose_b } => {
                let (a, b) = two()?;
                ops::matmul_t(a, b, transpose_a, transpose_b)?
            }
            KernelId::Cast => one()?.try_cast(need_dtype(kernel, p)?)?,
            KernelId::Reshape => ops::reshape(one()?, &p.shape)?,
            KernelId::Transpose => ops::transpose(one()?),
            KernelId::Permute => ops::permute(one()?, &p.perm)?,
            KernelId::Concat => {
                let owned: Vec<Tensor> = xs.iter().map(|&t| t.clone()).collect();
                ops::concat(&owned, need_axis(kernel, p)?)?
            }
            KernelId::Stack => {
                let owned: Vec<Tensor> = xs.iter().map(|&t| t.clone()).collect();
                ops::stack(&owned, need_axis(kernel, p)?)?
            }
            KernelId::ExpandDims => ops::expand_dims(one()?, need_axis(kernel, p)?)?,
            KernelId::Squeeze => ops::squeeze(one()?, p.axis)?,
            KernelId::BroadcastTo => ops::broadcast_to(one()?, &p.shape)?,
            KernelId::SumToShape => ops::sum_to_shape(one()?, &p.shape)?,
            KernelId::Slice => ops::slice(one()?, &p.slices)?,
            KernelId::SliceUpdateAdd => ops::slice_update_add(&p.shape, &p.slices, one()?)?,
            KernelId::Gather => {
                let (x, idx) = two()?;
                ops::gather(x, idx, need_axis(kernel, p)?)?
            }
            KernelId::ScatterAdd => {
                let (idx, upd) = two()?;
                ops::scatter_add(&p.shape, idx, upd, need_axis(kernel, p)?)?
            }
            KernelId::OneHot => ops::one_hot(one()?, p.n, need_dtype(kernel, p)?)?,
            KernelId::Einsum => {
                let owned: Vec<Tensor> = xs.iter().map(|&t| t.clone()).collect();
                ops::einsum(&p.spec, &owned)?
            }
        };
        Ok(CpuDevice::wrap(out))
    }

    fn synchronize(&self) -> Result<(), KernelError> {
        Ok(())
    }
}
