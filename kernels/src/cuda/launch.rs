//! The CUDA device's kernels, one method per family: generated elementwise kernels over strided
//! views, `ops.cu`'s kernels over `[outer, n, inner]` around an axis (reductions, arg-max/min,
//! softmax, running sums, gathers), fused attention, the Philox draws, and matrix products as one
//! cuBLAS call each. Every method checks its inputs as the CPU kernel does and answers an error,
//! never a launch that could read past a buffer.

use std::sync::Arc;

use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType_t};
use cudarc::cublas::{CudaBlas, Gemm, GemmConfig, StridedBatchedConfig};
use cudarc::driver::{CudaFunction, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, LaunchConfig, PushKernelArg};

use super::device::{driver, take, Arg, Buf, CudaDevice};
use super::elem::{self, Index};
use super::gemm::{self, GemmPlan};
use super::RegionArg;
use crate::cpu::attention::{geometry, AttentionMask};
use crate::cpu::broadcast_shapes;
use crate::cpu::elementwise::ElemOp;
use crate::cpu::fused::Fused;
use crate::cpu::reduce::ReduceOp;
use crate::device::{need_axis, Device, DeviceTensor, KernelId, KernelParams};
use crate::error::KernelError;
use crate::tensor::DType;

/// A launch over `n` elements (grid-stride loops cover any count).
fn config(n: usize) -> LaunchConfig {
    LaunchConfig::for_num_elems(n.clamp(1, 1 << 30) as u32)
}

/// The suffix of `ops.cu`'s kernels for a float element type.
fn suffix(op: &'static str, d: DType) -> Result<&'static str, KernelError> {
    match d {
        DType::F32 => Ok("f32"),
        DType::F64 => Ok("f64"),
        other @ (DType::I32 | DType::Bool | DType::Bf16 | DType::F16) => {
            Err(KernelError::dtype(op, "an f32 or f64 tensor", other))
        }
    }
}

/// `(outer, n, inner)` of `shape` around `axis`.
fn around(op: &'static str, shape: &[usize], axis: usize) -> Result<(usize, usize, usize), KernelError> {
    if axis >= shape.len() {
        return Err(KernelError::AxisOutOfRange { op, axis, rank: shape.len() });
    }
    Ok((shape[..axis].iter().product(), shape[axis], shape[axis + 1..].iter().product()))
}

/// The shape a reduction over `axis` leaves.
fn reduced(shape: &[usize], axis: usize, keepdims: bool) -> Result<Vec<usize>, KernelError> {
    around("reduce", shape, axis)?;
    let mut out = shape.to_vec();
    if keepdims {
        out[axis] = 1;
    } else {
        out.remove(axis);
    }
    Ok(out)
}

/// cuBLAS's arguments for `p`, with `one` and `zero` of the element type.
fn blas_config<T>(p: &GemmPlan, one: T, zero: T) -> StridedBatchedConfig<T> {
    let op = |t: bool| if t { cublasOperation_t::CUBLAS_OP_T } else { cublasOperation_t::CUBLAS_OP_N };
    // `gemm::plan` keeps every size within 32 bits.
    StridedBatchedConfig {
        gemm: GemmConfig {
            transa: op(p.trans_first),
            transb: op(p.trans_second),
            m: p.m as i32,
            n: p.n as i32,
            k: p.k as i32,
            alpha: one,
            lda: p.ld_first as i32,
            ldb: p.ld_second as i32,
            beta: zero,
            ldc: p.ldc as i32,
        },
        batch_size: p.batch as i32,
        stride_a: p.stride_first as i64,
        stride_b: p.stride_second as i64,
        stride_c: p.stride_c as i64,
    }
}

/// A product of storage-only matrices (their bits, of cuBLAS type `ty`) accumulated in f32 and
/// rounded once to `ty`, as the CPU computes them in f32 and rounds the result.
///
/// # Safety
/// As `Gemm::gemm_strided_batched`: `p` describes the buffers.
unsafe fn half_gemm(
    blas: &CudaBlas,
    p: &GemmPlan,
    first: &CudaSlice<u16>,
    second: &CudaSlice<u16>,
    out: &mut CudaSlice<u16>,
    ty: cudaDataType_t,
    s: &Arc<CudaStream>,
) -> Result<(), cudarc::cublas::result::CublasError> {
    let c = blas_config(p, 1.0f32, 0.0f32);
    let (a, _ra) = first.device_ptr(s);
    let (b, _rb) = second.device_ptr(s);
    let (o, _ro) = out.device_ptr_mut(s);
    // SAFETY: the caller's guarantee; alpha and beta are f32 for an f32 compute type.
    unsafe {
        cudarc::cublas::result::gemm_strided_batched_ex(
            *blas.handle(),
            c.gemm.transa,
            c.gemm.transb,
            c.gemm.m,
            c.gemm.n,
            c.gemm.k,
            (&c.gemm.alpha) as *const f32 as *const std::ffi::c_void,
            a as *const std::ffi::c_void,
            ty,
            c.gemm.lda,
            c.stride_a,
            b as *const std::ffi::c_void,
            ty,
            c.gemm.ldb,
            c.stride_b,
            (&c.gemm.beta) as *const f32 as *const std::ffi::c_void,
            o as *mut std::ffi::c_void,
            ty,
            c.gemm.ldc,
            c.stride_c,
            c.batch_size,
            cublasComputeType_t::CUBLAS_COMPUTE_32F,
            cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
        )
    }
}

impl CudaDevice {
    /// Elementwise operation `e` of `inputs` (views, read through their strides, broadcast to
    /// one shape) by its generated kernel; `to` is a conversion's target.
    pub(super) fn elementwise(
        &self,
        e: ElemOp,
        inputs: &[&DeviceTensor],
        to: Option<DType>,
        s: &Arc<CudaStream>,
    ) -> Result<DeviceTensor, KernelError> {
        let dtypes: Vec<DType> = inputs.iter().map(|d| d.dtype()).collect();
        let out_t = elem::result_type(e, &dtypes, to)
            .ok_or_else(|| KernelError::Invalid(format!("{}: no `{}` kernel for {dtypes:?}", self.name, e.name())))?;
        let name = elem::op_kernel_name(e, &dtypes, out_t);
        let f = self.function(&name, &name, || elem::op_kernel(e, &dtypes, to))?;
        self.generated(e.name(), &f, inputs, out_t, s)
    }

    /// The JIT's fused tree `tree` of `inputs` by the kernel generated from it.
    pub(super) fn fused(
        &self,
        tree: &Fused,
        inputs: &[&DeviceTensor],
        s: &Arc<CudaStream>,
    ) -> Result<DeviceTensor, KernelError> {
        let reads = (0..tree.inputs).map(|k| tree.input_dtype(k));
        if inputs.len() != tree.inputs || inputs.iter().zip(reads).any(|(d, t)| t.is_some_and(|t| t != d.dtype())) {
            return Err(KernelError::Invalid(format!(
                "{}: a fused tree's inputs are not what it was typed for",
                self.name
            )));
        }
        let out_t = tree.out_dtype().ok_or_else(|| KernelError::Invalid("an empty fused tree".into()))?;
        // Each tree is a module of its own, so every one's kernel may have the same name.
        let f = self.function(&format!("{tree:?}"), "msl_fused", || elem::fused_kernel(tree, "msl_fused"))?;
        self.generated("fused tree", &f, inputs, out_t, s)
    }

    /// Launches generated kernel `f` (the [`elem::kernel`] form) over `inputs` broadcast to one
    /// shape, into a new tensor of `out_t`.
    fn generated(
        &self,
        what: &'static str,
        f: &CudaFunction,
        inputs: &[&DeviceTensor],
        out_t: DType,
        s: &Arc<CudaStream>,
    ) -> Result<DeviceTensor, KernelError> {
        let mut shape = Vec::new();
        for d in inputs {
            shape = broadcast_shapes(what, &shape, d.shape())?;
        }
        let parts: Vec<(&[usize], &[usize])> = inputs.iter().map(|d| (d.shape(), d.strides())).collect();
        let index = Index::<{ elem::MAX_INPUTS }>::from_parts(&shape, &parts).ok_or_else(|| {
            KernelError::Invalid(format!(
                "{}: {what} of rank {} or {} inputs (at most {} and {})",
                self.name,
                shape.len(),
                inputs.len(),
                elem::MAX_RANK,
                elem::MAX_INPUTS
            ))
        })?;
        let len: usize = shape.iter().product();
        let args = inputs.iter().map(|d| Ok(self.buf(d)?.at(d.offset()))).collect::<Result<Vec<Arg>, KernelError>>()?;
        let mut out = Buf::zeros(s, out_t, len)?;
        {
            let mut b = s.launch_builder(f);
            for a in &args {
                a.push(&mut b);
            }
            out.push_out(&mut b);
            b.arg(&index);
            // SAFETY: the kernel was generated for these inputs' element types; it reads each at
            // offsets its view's strides give within its buffer, and writes `len` elements of
            // `out`, allocated with at least that many. Its index parameter is a prefix of
            // `index` (see `elem::MAX_INPUTS`).
            unsafe { b.launch(config(len)) }.map_err(driver)?;
        }
        Ok(Self::wrap(shape, out_t, out))
    }

    /// Runs `kernel`: its generated kernels on inputs that may be views, every other one on
    /// contiguous inputs (`launch_on` makes them so).
    pub(super) fn kernel(
        &self,
        kernel: KernelId,
        inputs: &[&DeviceTensor],
        p: &KernelParams,
        s: &Arc<CudaStream>,
    ) -> Result<DeviceTensor, KernelError> {
        let one = || take::<1>(kernel, inputs).map(|[x]| x);
        let axis = || need_axis(kernel, p);
        match kernel {
            KernelId::Unary(u) => self.elementwise(ElemOp::Unary(u), inputs, None, s),
            KernelId::Binary(b) => self.elementwise(ElemOp::Binary(b), inputs, None, s),
            KernelId::Where => self.elementwise(ElemOp::Where, inputs, None, s),
            KernelId::Cast => self.elementwise(ElemOp::Cast, inputs, p.dtype, s),
            KernelId::Fused => self.fused(need_tree(p)?, inputs, s),
            KernelId::Reduce(op) => {
                let name = match op {
                    ReduceOp::Sum => "sum",
                    ReduceOp::Mean => "mean",
                    ReduceOp::Max => "max",
                    ReduceOp::Min => "min",
                    ReduceOp::Prod => return Err(KernelError::Invalid(format!("{}: no prod kernel yet", self.name))),
                };
                let x = one()?;
                self.reduction(name, x, p, x.dtype(), s)
            }
            KernelId::ArgMax | KernelId::ArgMin => {
                let name = if kernel == KernelId::ArgMax { "argmax" } else { "argmin" };
                self.reduction(name, one()?, p, DType::I32, s)
            }
            KernelId::Softmax => {
                self.axis_kernel("softmax", one()?, axis()?, one()?.shape().to_vec(), one()?.dtype(), s)
            }
            KernelId::LogSoftmax => {
                self.axis_kernel("log_softmax", one()?, axis()?, one()?.shape().to_vec(), one()?.dtype(), s)
            }
            KernelId::Cumsum => self.axis_kernel("cumsum", one()?, axis()?, one()?.shape().to_vec(), one()?.dtype(), s),
            KernelId::Matmul => self.matmul(kernel, inputs, false, false, s),
            KernelId::MatmulT { transpose_a, transpose_b } => self.matmul(kernel, inputs, transpose_a, transpose_b, s),
            KernelId::Gather => {
                let [x, idx] = take::<2>(kernel, inputs)?;
                self.gather(x, idx, axis()?, s)
            }
            KernelId::Update => {
                let [x, v] = take::<2>(kernel, inputs)?;
                self.update(x, v, p.ints.first().copied().unwrap_or(0), axis()?, s)
            }
            KernelId::OneHot => {
                let out_t =
                    p.dtype.ok_or_else(|| KernelError::Invalid(format!("{}: one_hot needs a dtype", self.name)))?;
                self.one_hot(one()?, p.n, out_t, s)
            }
            KernelId::Attention => {
                let [q, k, v] = take::<3>(kernel, inputs)?;
                self.attention(q, k, v, p, s)
            }
            KernelId::Uniform | KernelId::Normal => {
                take::<0>(kernel, inputs)?;
                self.draw(kernel == KernelId::Uniform, p, s)
            }
            KernelId::Concat => self.concat_first(inputs, s),
            // Views, copied through their strides.
            KernelId::Transpose => {
                let x = one()?;
                self.dense(&x.permuted(&(0..x.rank()).rev().collect::<Vec<_>>())?, s)
            }
            KernelId::Permute => self.dense(&one()?.permuted(&p.perm)?, s),
            KernelId::BroadcastTo => self.dense(&one()?.broadcast_to(&p.shape)?, s),
            KernelId::SumToShape => self.sum_to_shape(one()?, &p.shape, s),
            // Shape only: the same buffer under the new shape.
            KernelId::Contiguous => one().cloned(),
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
                // any other kernel: not on this device yet (`runs` says no; the CPU device runs every kernel)
                Err(KernelError::Invalid(format!("{}: kernel {other:?} does not run on this device yet", self.name)))
            }
        }
    }

    /// `ops.cu`'s reduction `name` of contiguous `x` along `p.axis`, or of all its elements
    /// (as the CPU does: one axis of all of them) when there is none.
    fn reduction(
        &self,
        name: &str,
        x: &DeviceTensor,
        p: &KernelParams,
        out_t: DType,
        s: &Arc<CudaStream>,
    ) -> Result<DeviceTensor, KernelError> {
        match p.axis {
            Some(a) => self.axis_kernel(name, x, a, reduced(x.shape(), a, p.keepdims)?, out_t, s),
            None => {
                let all = if p.keepdims { vec![1; x.rank()] } else { vec![] };
                self.axis_kernel(name, &reshaped(x, vec![x.len()])?, 0, all, out_t, s)
            }
        }
    }

    /// `x` summed down to `shape` (a gradient of a broadcast) in the CPU's steps, with this
    /// device's sum kernel.
    fn sum_to_shape(
        &self,
        x: &DeviceTensor,
        shape: &[usize],
        s: &Arc<CudaStream>,
    ) -> Result<DeviceTensor, KernelError> {
        let plan = crate::cpu::shape::sum_to_shape_plan(x.shape(), shape)?;
        let mut cur = x.clone();
        if let Some(flat) = plan.lead {
            let all = reshaped(&cur, flat)?;
            cur = self.axis_kernel("sum", &all, 0, reduced(all.shape(), 0, false)?, x.dtype(), s)?;
        }
        for a in plan.axes {
            cur = self.axis_kernel("sum", &cur, a, reduced(cur.shape(), a, true)?, x.dtype(), s)?;
        }
        reshaped(&cur, shape.to_vec())
    }

    /// The concatenation of contiguous inputs along their first axis (`runs` checked their
    /// element types and other axes): their buffers one after another.
    fn concat_first(&self, inputs: &[&DeviceTensor], s: &Arc<CudaStream>) -> Result<DeviceTensor, KernelError> {
        let first = inputs.first().ok_or_else(|| KernelError::Invalid(format!("{}: concat of nothing", self.name)))?;
        let mut shape = first.shape().to_vec();
        shape[0] = inputs.iter().map(|d| d.shape()[0]).sum();
        let mut out = Buf::zeros(s, first.dtype(), inputs.iter().map(|d| d.len()).sum())?;
        let mut at = 0;
        for d in inputs {
            let mismatch = || KernelError::Invalid(format!("{}: concat of different element types", self.name));
            self.buf(d)?.copy_to(s, d.len(), &mut out, at).ok_or_else(mismatch)??;
            at += d.len();
        }
        Ok(Self::wrap(shape, first.dtype(), out))
    }

    /// Runs `ops.cu`'s `msl_{name}_{f32|f64}` over `x` viewed as `[outer, n, inner]` around
    /// `axis`, into a new tensor of `out_shape` and `out_t`.
    fn axis_kernel(
        &self,
        name: &str,
        x: &DeviceTensor,
        axis: usize,
        out_shape: Vec<usize>,
        out_t: DType,
        s: &Arc<CudaStream>,
    ) -> Result<DeviceTensor, KernelError> {
        let (outer, n, inner) = around("cuda kernel", x.shape(), axis)?;
        if n == 0 && matches!(name, "max" | "min" | "argmax" | "argmin") {
            return Err(KernelError::Invalid(format!("{name} of an empty axis")));
        }
        let f =
            self.module.load_function(&format!("msl_{name}_{}", suffix("cuda kernel", x.dtype())?)).map_err(driver)?;
        let (o, n, i) = (outer as i64, n as i64, inner as i64);
        let len: usize = out_shape.iter().product();
        let input = self.buf(x)?.at(0);
        let mut out = Buf::zeros(s, out_t, len)?;
        {
            let mut b = s.launch_builder(&f);
            input.push(&mut b);
            out.push_out(&mut b);
            b.arg(&o).arg(&n).arg(&i);
            // SAFETY: the kernel reads `outer * n * inner` elements of the input (its whole
            // contiguous buffer) and writes at most that many, `len`, into `out`.
            unsafe { b.launch(config(outer * inner)) }.map_err(driver)?;
        }
        Ok(Self::wrap(out_shape, out_t, out))
    }

    /// `op(a) @ op(b)` as one cuBLAS call.
    fn matmul(
        &self,
        kernel: KernelId,
        inputs: &[&DeviceTensor],
        ta: bool,
        tb: bool,
        s: &Arc<CudaStream>,
    ) -> Result<DeviceTensor, KernelError> {
        let [a, b] = take::<2>(kernel, inputs)?;
        if a.dtype() != b.dtype() {
            return Err(KernelError::DTypeMismatch {
                op: "matmul",
                expected: a.dtype().name().into(),
                found: b.dtype().name().into(),
            });
        }
        let plan = gemm::plan(a.shape(), b.shape(), ta, tb).ok_or_else(|| KernelError::ShapeMismatch {
            op: "matmul",
            lhs: a.shape().to_vec(),
            rhs: b.shape().to_vec(),
        })?;
        let len: usize = plan.out_shape.iter().product();
        let mut out = Buf::zeros(s, a.dtype(), len)?;
        if !plan.is_trivial() {
            let guard = self.blas(s)?;
            let blas =
                guard.as_ref().ok_or_else(|| KernelError::Invalid(format!("{}: no cuBLAS handle", self.name)))?;
            // SAFETY: `plan` describes the operands' contiguous buffers (cuBLAS's first operand is
            // `b`, its second `a`) and an output of `len` elements, as `cuda_gemm.rs` checks.
            let done = unsafe {
                match (self.buf(a)?, self.buf(b)?, &mut out) {
                    (Buf::F32(x), Buf::F32(y), Buf::F32(o)) => {
                        blas.gemm_strided_batched(blas_config(&plan, 1.0f32, 0.0), y, x, o)
                    }
                    (Buf::F64(x), Buf::F64(y), Buf::F64(o)) => {
                        blas.gemm_strided_batched(blas_config(&plan, 1.0f64, 0.0), y, x, o)
                    }
                    (Buf::Bf16(x), Buf::Bf16(y), Buf::Bf16(o)) => {
                        half_gemm(blas, &plan, y, x, o, cudaDataType_t::CUDA_R_16BF, s)
                    }
                    (Buf::F16(x), Buf::F16(y), Buf::F16(o)) => {
                        half_gemm(blas, &plan, y, x, o, cudaDataType_t::CUDA_R_16F, s)
                    }
                    _ => return Err(KernelError::dtype("matmul", "float matrices", a.dtype())),
                }
            };
            done.map_err(driver)?;
        }
        Ok(Self::wrap(plan.out_shape, a.dtype(), out))
    }

    /// `numpy.take(x, idx, axis)`; an index out of range is the CPU's error.
    fn gather(
        &self,
        x: &DeviceTensor,
        idx: &DeviceTensor,
        axis: usize,
        s: &Arc<CudaStream>,
    ) -> Result<DeviceTensor, KernelError> {
        let (outer, n, inner) = around("gather", x.shape(), axis)?;
        if idx.dtype() != DType::I32 {
            return Err(KernelError::dtype("gather", "i32 indices", idx.dtype()));
        }
        let m = idx.len();
        let mut shape = x.shape()[..axis].to_vec();
        shape.extend_from_slice(idx.shape());
        shape.extend_from_slice(&x.shape()[axis + 1..]);
        let len = outer * m * inner;
        let f = self.module.load_function(&format!("msl_gather_{}", suffix("gather", x.dtype())?)).map_err(driver)?;
        let mut out = Buf::zeros(s, x.dtype(), len)?;
        let mut bad: CudaSlice<i32> = s.alloc_zeros(1).map_err(driver)?;
        let (input, indices) = (self.buf(x)?.at(0), self.buf(idx)?.at(0));
        let (o, nn, i, mm) = (outer as i64, n as i64, inner as i64, m as i64);
        {
            let mut b = s.launch_builder(&f);
            input.push(&mut b);
            indices.push(&mut b);
            out.push_out(&mut b);
            b.arg(&mut bad).arg(&o).arg(&nn).arg(&i).arg(&mm);
            // SAFETY: the kernel reads `m` indices, reads `x` only at indices it has checked are
            // in 0..n, and writes `len` elements of `out` and one flag.
            unsafe { b.launch(config(len)) }.map_err(driver)?;
        }
        self.indices_in_range(s, &bad, idx, n, axis)?;
        Ok(Self::wrap(shape, x.dtype(), out))
    }

    /// The CPU's error when a kernel raised its flag `bad` for an index of `idx` outside `0..n`
    /// (the first such index, reported along `axis`).
    fn indices_in_range(
        &self,
        s: &Arc<CudaStream>,
        bad: &CudaSlice<i32>,
        idx: &DeviceTensor,
        n: usize,
        axis: usize,
    ) -> Result<(), KernelError> {
        if s.clone_dtoh(bad).map_err(driver)?.first() == Some(&0) {
            return Ok(());
        }
        let ix = self.download(idx)?;
        let index = ix.as_i32().and_then(|v| v.iter().find(|&&j| j < 0 || j as usize >= n).copied()).unwrap_or(-1);
        Err(KernelError::IndexOutOfRange { index: i64::from(index), axis, size: n })
    }

    /// A copy of contiguous `x` with the block `v` written at positions `at..` of `axis` (the
    /// CPU's checks and errors first).
    fn update(
        &self,
        x: &DeviceTensor,
        v: &DeviceTensor,
        at: i64,
        axis: usize,
        s: &Arc<CudaStream>,
    ) -> Result<DeviceTensor, KernelError> {
        let end = crate::cpu::index::update_check((x.shape(), x.dtype()), (v.shape(), v.dtype()), at, axis)?;
        let (outer, n, inner) = around("update", x.shape(), axis)?;
        let m = end - at;
        let f = self.module.load_function(&format!("msl_update_{}", suffix("update", x.dtype())?)).map_err(driver)?;
        let mut out = Buf::zeros(s, x.dtype(), x.len())?;
        let mismatch = || KernelError::Invalid(format!("{}: update of different element types", self.name));
        self.buf(x)?.copy_to(s, x.len(), &mut out, 0).ok_or_else(mismatch)??;
        let input = self.buf(v)?.at(0);
        let (o, nn, i) = (outer as i64, n as i64, inner as i64);
        if !v.is_empty() {
            let mut b = s.launch_builder(&f);
            input.push(&mut b);
            out.push_out(&mut b);
            b.arg(&o).arg(&nn).arg(&i).arg(&m).arg(&at);
            // SAFETY: `update_check` proved `at..at + m` within `0..n` and `v` of `outer * m *
            // inner` elements; the kernel reads those and writes inside `out`'s `x.len()`.
            unsafe { b.launch(config(v.len())) }.map_err(driver)?;
        }
        Ok(Self::wrap(x.shape().to_vec(), x.dtype(), out))
    }

    /// The one-hot encoding of i32 indices over `n` classes, in `out_t` (f32 or f64); an
    /// index outside `0..n` is the CPU's error.
    fn one_hot(
        &self,
        idx: &DeviceTensor,
        n: usize,
        out_t: DType,
        s: &Arc<CudaStream>,
    ) -> Result<DeviceTensor, KernelError> {
        if idx.dtype() != DType::I32 {
            return Err(KernelError::dtype("one_hot", "i32 indices", idx.dtype()));
        }
        let mut shape = idx.shape().to_vec();
        shape.push(n);
        let (m, len) = (idx.len(), crate::tensor::checked_numel(&shape)?);
        let f = self.module.load_function(&format!("msl_one_hot_{}", suffix("one_hot", out_t)?)).map_err(driver)?;
        let mut out = Buf::zeros(s, out_t, len)?;
        let mut bad: CudaSlice<i32> = s.alloc_zeros(1).map_err(driver)?;
        let indices = self.buf(idx)?.at(0);
        let (mm, nn) = (m as i64, n as i64);
        {
            let mut b = s.launch_builder(&f);
            indices.push(&mut b);
            out.push_out(&mut b);
            b.arg(&mut bad).arg(&mm).arg(&nn);
            // SAFETY: the kernel reads `m` indices and writes `m * n = len` elements of `out`
            // and one flag.
            unsafe { b.launch(config(len)) }.map_err(driver)?;
        }
        self.indices_in_range(s, &bad, idx, n, idx.rank())?;
        Ok(Self::wrap(shape, out_t, out))
    }

    /// `softmax(q kᵀ / √D) v` by the fused kernel; `ints[0]` keys visible, `flag` causal.
    fn attention(
        &self,
        q: &DeviceTensor,
        k: &DeviceTensor,
        v: &DeviceTensor,
        p: &KernelParams,
        s: &Arc<CudaStream>,
    ) -> Result<DeviceTensor, KernelError> {
        let mask = AttentionMask { len: p.ints.first().copied().unwrap_or(0), causal: p.flag };
        let g =
            geometry("attention", (q.shape(), q.dtype()), (k.shape(), k.dtype()), Some((v.shape(), v.dtype())), mask)?;
        let mut shape = q.shape().to_vec();
        if let Some(last) = shape.last_mut() {
            *last = g.e;
        }
        let len = g.batch * g.q * g.e;
        let f =
            self.module.load_function(&format!("msl_attention_{}", suffix("attention", q.dtype())?)).map_err(driver)?;
        let mut out = Buf::zeros(s, q.dtype(), len)?;
        let (qa, ka, va) = (self.buf(q)?.at(0), self.buf(k)?.at(0), self.buf(v)?.at(0));
        let dims = [g.batch, g.q, g.s, g.d, g.e, g.len].map(|x| x as i64);
        let causal = i32::from(g.causal);
        // The scale as the CPU rounds it: 1/√D in f64, then to the element type.
        let (scale32, scale64) = ((1.0 / (g.d as f64).sqrt()) as f32, 1.0 / (g.d as f64).sqrt());
        {
            let mut b = s.launch_builder(&f);
            qa.push(&mut b);
            ka.push(&mut b);
            va.push(&mut b);
            out.push_out(&mut b);
            for d in &dims {
                b.arg(d);
            }
            b.arg(&causal);
            if q.dtype() == DType::F32 {
                b.arg(&scale32);
            } else {
                b.arg(&scale64);
            }
            // SAFETY: `geometry` checked the three shapes against each other and the mask; the
            // kernel reads within them and writes `len` elements of `out`.
            unsafe { b.launch(config(g.batch * g.q)) }.map_err(driver)?;
        }
        Ok(Self::wrap(shape, q.dtype(), out))
    }

    /// The block `region` of a tensor drawn from Philox stream `key`: uniform in
    /// [`value`, `scale`), or normal with mean `value` and deviation `scale`.
    fn draw(&self, uniform: bool, p: &KernelParams, s: &Arc<CudaStream>) -> Result<DeviceTensor, KernelError> {
        let op = if uniform { "uniform" } else { "normal" };
        let region = p.region.as_ref().ok_or_else(|| KernelError::Invalid(format!("{op} needs a region")))?;
        let r = RegionArg::new(region)
            .ok_or_else(|| KernelError::Invalid(format!("{}: {op} of rank {}", self.name, region.shape.len())))?;
        let dt = p.dtype.ok_or_else(|| KernelError::Invalid(format!("{op} needs a dtype")))?;
        let f = self.module.load_function(&format!("msl_{op}_{}", suffix(op, dt)?)).map_err(driver)?;
        let len: usize = region.len.iter().product();
        let mut out = Buf::zeros(s, dt, len)?;
        let n = len as i64;
        let [k0, k1] = p.key;
        let (lo, width, hi) = (p.value, p.scale - p.value, p.scale);
        let (lo32, width32, hi32) = (lo as f32, width as f32, hi as f32);
        {
            let mut b = s.launch_builder(&f);
            out.push_out(&mut b);
            b.arg(&n).arg(&r).arg(&k0).arg(&k1);
            match (uniform, dt) {
                (true, DType::F32) => b.arg(&lo32).arg(&width32).arg(&hi32),
                (true, _) => b.arg(&lo).arg(&width),
                // Mean and deviation, in f64 for both element types.
                (false, _) => b.arg(&p.value).arg(&p.scale),
            };
            // SAFETY: the kernel writes `len` elements of `dt` into `out`, allocated with that many.
            unsafe { b.launch(config(len)) }.map_err(driver)?;
        }
        Ok(Self::wrap(region.len.clone(), dt, out))
    }
}

/// The tree a `Fused` launch carries.
pub(super) fn need_tree(p: &KernelParams) -> Result<&Fused, KernelError> {
    p.fused.as_deref().ok_or_else(|| KernelError::Invalid("kernel Fused needs a tree".into()))
}

/// `x`'s buffer under `shape`, which must hold as many elements.
fn reshaped(x: &DeviceTensor, shape: Vec<usize>) -> Result<DeviceTensor, KernelError> {
    if shape.iter().product::<usize>() != x.len() {
        return Err(KernelError::DataLength { shape, len: x.len() });
    }
    Ok(x.with_shape(shape))
}
