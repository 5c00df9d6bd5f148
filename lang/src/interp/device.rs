//! The interpreter's way to a kernel: every primitive that has a kernel id runs through the
//! `kernels::Device` the interpreter holds (the CPU device unless an embedder gives another),
//! its host operands uploaded and its result downloaded, both free on the CPU device, whose
//! buffers are host tensors. An operand written as a swap of its last two axes is handed to
//! the device as a strided view, which the GEMM reads without a copy.

use super::{kerr, Interp, R};
use crate::source::Span;
use kernels::ops::BinaryOp;
use kernels::{DeviceTensor, KernelId, KernelParams, Tensor};

impl Interp<'_> {
    /// Kernel `k` on host operands.
    pub(crate) fn kernel(&self, k: KernelId, xs: &[&Tensor], p: &KernelParams, span: Span) -> R<Tensor> {
        let ds = xs.iter().map(|x| self.device.upload(x)).collect::<Result<Vec<_>, _>>().map_err(|e| kerr(e, span))?;
        self.kernel_on(k, &ds, p, span)
    }

    /// Kernel `k` on device operands (views among them), its result brought to the host.
    pub(crate) fn kernel_on(&self, k: KernelId, ds: &[DeviceTensor], p: &KernelParams, span: Span) -> R<Tensor> {
        let refs: Vec<&DeviceTensor> = ds.iter().collect();
        let out = self.device.launch(k, &refs, p).map_err(|e| kerr(e, span))?;
        self.device.download(&out).map_err(|e| kerr(e, span))
    }

    /// A kernel of one operand and its parameters.
    pub(crate) fn kernel1(&self, k: KernelId, x: &Tensor, p: KernelParams, span: Span) -> R<Tensor> {
        self.kernel(k, &[x], &p, span)
    }

    /// `a @ b`, each operand read transposed (its last two axes swapped) where `swapped` says.
    pub(crate) fn gemm(&self, a: &Tensor, b: &Tensor, swapped: [bool; 2], span: Span) -> R<Tensor> {
        let view = |x: &Tensor, s: bool| -> Result<DeviceTensor, kernels::KernelError> {
            let d = self.device.upload(x)?;
            if s {
                d.transposed_last()
            } else {
                Ok(d)
            }
        };
        let ds = [view(a, swapped[0]).map_err(|e| kerr(e, span))?, view(b, swapped[1]).map_err(|e| kerr(e, span))?];
        self.kernel_on(KernelId::Matmul, &ds, &KernelParams::new(), span)
    }

    /// `x` with `v` written at `at` along `axis`, into `x`'s own buffer when nothing else holds
    /// it (a cache updated in a loop is written in place): `x` is handed to the device as the
    /// kernel's output.
    pub(crate) fn update_on_device(&self, x: Tensor, v: &Tensor, at: i64, axis: usize, span: Span) -> R<Tensor> {
        let mut out = self.device.upload(&x).map_err(|e| kerr(e, span))?;
        drop(x);
        let v = self.device.upload(v).map_err(|e| kerr(e, span))?;
        let p = KernelParams { axis: Some(axis), ..KernelParams::new().ints(&[at]) };
        self.device
            .launch_into(kernels::Stream::DEFAULT, KernelId::Update, &[&v], &p, &mut out)
            .map_err(|e| kerr(e, span))?;
        self.device.download(&out).map_err(|e| kerr(e, span))
    }

    /// A binary elementwise operation: scalars of one type on the host (loop counters,
    /// accumulators), everything else through the device after unifying weak-literal types.
    pub(crate) fn tensor_binary(&self, op: BinaryOp, a: &Tensor, b: &Tensor, span: Span) -> R<Tensor> {
        if let Some(t) = crate::ir::eval::scalar_binary(op, a, b) {
            return Ok(t);
        }
        let (a, b) = crate::ir::eval::unify_dtypes(a.clone(), b.clone());
        self.kernel(KernelId::Binary(op), &[&a, &b], &KernelParams::new(), span)
    }
}
