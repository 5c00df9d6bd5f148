//! The host CPU as a device: its buffers are host tensors and its kernels are the `ops`
//! functions, the reference every other device is compared with. Views are read through
//! their strides (a matrix operand whose last two axes are swapped goes to the GEMM as it is);
//! launches run at once, in order, so every stream is already synchronized.

use std::borrow::Cow;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use super::view::gather_host;
use super::{arity, need_axis, Device, DeviceTensor, KernelId, KernelParams, MemoryStats, Stream};
use crate::error::KernelError;
use crate::ops;
use crate::tensor::{DType, Tensor};

/// The host CPU; its buffers are host tensors and its kernels are the `ops` functions.
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuDevice;

/// `a == b` for two shapes, element by element: the slices' `==` calls `memcmp`, which for the
/// few dims of a shape cost more than the comparison (7 % of the interpreter's time on small
/// tensors, where every operand of every kernel is checked).
fn same_shape(a: &[usize], b: &[usize]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x == y)
}

impl CpuDevice {
    /// The elements `d` selects, as a host tensor: its own buffer when `d` is all of it in
    /// order, shared storage for a row-major view, a copy otherwise.
    fn host<'a>(&self, d: &'a DeviceTensor) -> Result<Cow<'a, Tensor>, KernelError> {
        let base = d
            .buffer::<Tensor>()
            .ok_or_else(|| KernelError::Invalid("cpu: this tensor belongs to another device".into()))?;
        if d.is_contiguous() && same_shape(base.shape(), d.shape()) {
            return Ok(Cow::Borrowed(base));
        }
        // A run of the buffer in row-major order (a narrowed leading axis): a view of it.
        if d.is_row_major() {
            if let Ok(v) = base.view(d.offset(), d.shape().to_vec()) {
                return Ok(Cow::Owned(v));
            }
        }
        gather_host(base, d).map(Cow::Owned)
    }
    /// A GEMM operand: a view whose last two axes are swapped from a row-major one is read
    /// as that one, transposed by the kernel (`true`), without a copy.
    fn gemm_operand<'a>(&self, d: &'a DeviceTensor) -> Result<(Cow<'a, Tensor>, bool), KernelError> {
        if d.rank() >= 2 && !d.is_row_major() {
            let t = d.transposed_last()?;
            if t.is_row_major() {
                let base =
                    d.buffer::<Tensor>().ok_or_else(|| KernelError::Invalid("cpu: another device's tensor".into()))?;
                return Ok((Cow::Owned(gather_host(base, &t)?), true));
            }
        }
        Ok((self.host(d)?, false))
    }
    /// A host tensor as a device tensor (no copy).
    pub fn wrap(t: Tensor) -> DeviceTensor {
        DeviceTensor::new(t.shape().to_vec(), t.dtype(), Arc::new(t))
    }
    /// The host tensor a device tensor holds, moved out when nothing else refers to it.
    pub fn unwrap(&self, d: DeviceTensor) -> Result<Tensor, KernelError> {
        if d.is_contiguous() && d.buffer::<Tensor>().is_some_and(|t| same_shape(t.shape(), d.shape())) {
            if let Some(t) = d.into_buffer::<Tensor>() {
                return Ok(Arc::try_unwrap(t).unwrap_or_else(|t| (*t).clone()));
            }
            return Err(KernelError::Invalid("cpu: this tensor belongs to another device".into()));
        }
        self.download(&d)
    }
}

/// The two integers of a convolution or pooling kernel.
fn pair(kernel: KernelId, ints: &[i64]) -> Result<[usize; 2], KernelError> {
    match ints {
        &[a, b] if a >= 0 && b >= 0 => Ok([a as usize, b as usize]),
        _ => Err(KernelError::Invalid(format!("kernel {kernel:?} needs two non-negative integers, got {ints:?}"))),
    }
}

fn need_dtype(kernel: KernelId, p: &KernelParams) -> Result<DType, KernelError> {
    p.dtype.ok_or_else(|| KernelError::Invalid(format!("kernel {kernel:?} needs a dtype")))
}

impl Device for CpuDevice {
    fn name(&self) -> &str {
        "cpu"
    }

    fn runs(&self, _: KernelId, _: &[&DeviceTensor], _: &KernelParams) -> bool {
        true
    }

    fn alloc(&self, dtype: DType, len: usize) -> Result<DeviceTensor, KernelError> {
        Ok(CpuDevice::wrap(ops::zeros(dtype, &[len])?))
    }

    fn upload(&self, t: &Tensor) -> Result<DeviceTensor, KernelError> {
        Ok(CpuDevice::wrap(t.clone()))
    }

    fn download(&self, d: &DeviceTensor) -> Result<Tensor, KernelError> {
        self.host(d).map(Cow::into_owned)
    }

    fn launch_on(
        &self,
        _stream: Stream,
        kernel: KernelId,
        inputs: &[&DeviceTensor],
        p: &KernelParams,
    ) -> Result<DeviceTensor, KernelError> {
        if let KernelId::Matmul | KernelId::MatmulT { .. } = kernel {
            arity(kernel, inputs, 2)?;
            if inputs.iter().any(|d| d.rank() < 2) {
                // A vector operand is reshaped by `matmul`: both are read in order.
                let (a, b) = (self.host(inputs[0])?, self.host(inputs[1])?);
                if kernel != KernelId::Matmul {
                    return Err(KernelError::Invalid(format!("kernel {kernel:?} needs two matrices")));
                }
                return Ok(CpuDevice::wrap(ops::matmul(&a, &b)?));
            }
            let ((a, sa), (b, sb)) = (self.gemm_operand(inputs[0])?, self.gemm_operand(inputs[1])?);
            let (ta, tb) = if let KernelId::MatmulT { transpose_a, transpose_b } = kernel {
                (sa ^ transpose_a, sb ^ transpose_b)
            } else {
                (sa, sb)
            };
            let out = if ta || tb { ops::matmul_t(&a, &b, ta, tb)? } else { ops::matmul(&a, &b)? };
            return Ok(CpuDevice::wrap(out));
        }
        let held: Vec<Cow<Tensor>> = inputs.iter().map(|d| self.host(d)).collect::<Result<_, _>>()?;
        let xs: Vec<&Tensor> = held.iter().map(|t| t.as_ref()).collect();
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
            KernelId::Fused => {
                let tree = p.fused.as_ref().ok_or_else(|| KernelError::Invalid("kernel Fused needs a tree".into()))?;
                ops::fused(tree, &xs)?
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
            KernelId::Matmul | KernelId::MatmulT { .. } => unreachable!("run above"),
            KernelId::Contiguous => one()?.clone(),
            KernelId::Conv2d => {
                let (x, w) = two()?;
                let [st, pad] = pair(kernel, &p.ints)?;
                ops::conv2d(x, w, st, pad)?
            }
            KernelId::Conv2dInputGrad | KernelId::Conv2dWeightGrad => {
                let (x, g) = two()?;
                let [st, pad] = pair(kernel, &p.ints)?;
                let size = [p.shape.first().copied().unwrap_or(0), p.shape.get(1).copied().unwrap_or(0)];
                if kernel == KernelId::Conv2dInputGrad {
                    ops::conv2d_input_grad(x, g, size, st, pad)?
                } else {
                    ops::conv2d_weight_grad(x, g, size, st, pad)?
                }
            }
            KernelId::MaxPool2d => {
                let [k, st] = pair(kernel, &p.ints)?;
                match xs[..] {
                    [x] => ops::max_pool2d(x, None, k, st)?,
                    [x, v] => ops::max_pool2d(x, Some(v), k, st)?,
                    _ => {
                        return Err(KernelError::Invalid(format!(
                            "kernel {kernel:?} takes 1 or 2 inputs, got {}",
                            xs.len()
                        )))
                    }
                }
            }
            KernelId::MaxPool2dGrad => {
                let (x, g) = two()?;
                let [k, st] = pair(kernel, &p.ints)?;
                ops::max_pool2d_grad(x, g, k, st)?
            }
            KernelId::AvgPool2d => {
                let [k, st] = pair(kernel, &p.ints)?;
                ops::avg_pool2d(one()?, k, st)?
            }
            KernelId::AvgPool2dGrad => {
                let [k, st] = pair(kernel, &p.ints)?;
                let size = [p.shape.first().copied().unwrap_or(0), p.shape.get(1).copied().unwrap_or(0)];
                ops::avg_pool2d_grad(one()?, size, k, st)?
            }
            KernelId::Attention | KernelId::AttentionWeights => {
                let mask = ops::AttentionMask { len: p.ints.first().copied().unwrap_or(0), causal: p.flag };
                if kernel == KernelId::Attention {
                    arity(kernel, inputs, 3)?;
                    ops::attention(xs[0], xs[1], xs[2], mask)?
                } else {
                    let (q, k) = two()?;
                    ops::attention_weights(q, k, mask)?
                }
            }
            KernelId::Argsort => ops::argsort(one()?, need_axis(kernel, p)?, p.flag, p.shape.first().copied())?,
            KernelId::TakeAlong => {
                let (x, idx) = two()?;
                ops::take_along(x, idx, need_axis(kernel, p)?)?
            }
            KernelId::ScatterAddAlong => {
                let (idx, upd) = two()?;
                ops::scatter_add_along(&p.shape, idx, upd, need_axis(kernel, p)?)?
            }
            KernelId::Fill => {
                arity(kernel, inputs, 0)?;
                ops::full(need_dtype(kernel, p)?, &p.shape, p.value)?
            }
            KernelId::Arange => {
                arity(kernel, inputs, 0)?;
                ops::arange(p.n, need_dtype(kernel, p)?)?
            }
            KernelId::Eye => {
                arity(kernel, inputs, 0)?;
                ops::eye(p.n, need_dtype(kernel, p)?)?
            }
            KernelId::Update => {
                let (x, v) = two()?;
                let (at, axis) = (p.ints.first().copied().unwrap_or(0), need_axis(kernel, p)?);
                ops::update(x.clone(), v, at, axis)?
            }
            KernelId::Uniform | KernelId::Normal => {
                arity(kernel, inputs, 0)?;
                let region = p
                    .region
                    .as_ref()
                    .ok_or_else(|| KernelError::Invalid(format!("kernel {kernel:?} needs a region")))?;
                let dt = need_dtype(kernel, p)?;
                if kernel == KernelId::Uniform {
                    crate::rng::uniform_region(dt, region, p.key, p.value, p.scale)?
                } else {
                    crate::rng::normal_region(dt, region, p.key, p.value, p.scale)?
                }
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

    fn copy_into(&self, _stream: Stream, src: &DeviceTensor, dst: &mut DeviceTensor) -> Result<(), KernelError> {
        let src = self.host(src)?;
        if !dst.is_contiguous() {
            return Err(KernelError::Invalid("cpu: an output must be contiguous".into()));
        }
        let dst = dst
            .buffer_mut::<Tensor>()
            .ok_or_else(|| KernelError::Invalid("cpu: an output that is shared or on another device".into()))?;
        dst.storage_mut().copy_from(src.storage())
    }

    /// `Update` writes into the caller's tensor itself when nothing else holds its buffer.
    fn launch_into(
        &self,
        stream: Stream,
        kernel: KernelId,
        inputs: &[&DeviceTensor],
        p: &KernelParams,
        out: &mut DeviceTensor,
    ) -> Result<(), KernelError> {
        if kernel != KernelId::Update {
            return super::computed_into(self, stream, kernel, inputs, p, out);
        }
        arity(kernel, inputs, 1)?;
        let v = self.host(inputs[0])?;
        let (at, axis) = (p.ints.first().copied().unwrap_or(0), need_axis(kernel, p)?);
        if !out.is_contiguous() {
            return Err(KernelError::Invalid("cpu: an output must be contiguous".into()));
        }
        let x = out
            .buffer_mut::<Tensor>()
            .ok_or_else(|| KernelError::Invalid("cpu: an output that is shared or on another device".into()))?;
        // Checked first: on an error the caller's tensor is left as it was.
        crate::cpu::index::update_fits(x, &v, at, axis)?;
        let taken = std::mem::replace(x, Tensor::scalar_bool(false));
        *x = ops::update(taken, &v, at, axis)?;
        Ok(())
    }

    fn new_stream(&self) -> Result<Stream, KernelError> {
        static NEXT: AtomicU32 = AtomicU32::new(1);
        Ok(Stream(NEXT.fetch_add(1, Ordering::Relaxed)))
    }

    fn synchronize_stream(&self, _stream: Stream) -> Result<(), KernelError> {
        Ok(())
    }

    fn synchronize(&self) -> Result<(), KernelError> {
        Ok(())
    }

    fn memory(&self) -> MemoryStats {
        let (cached_blocks, cached_bytes, reuses) = crate::pool::stats();
        MemoryStats { cached_blocks, cached_bytes, reuses }
    }
}
