//! Evaluation of each primitive through the CPU kernels: the interpreter's column of the
//! primitive table.

use super::value::{self, scalar_i64, ModelValue, Value};
use super::{kerr, rt, Frame, Interp, R};
use crate::diag::Code;
use crate::ir::eval::{binary_op, dtype_of, unary_op, unary_operand, unify_dtypes};
use crate::ir::{self, Attrs, Expr, ExprKind, Prim};
use crate::source::Span;
use crate::types::TensorTy;
use crate::types::{ElemTy, Type};
use kernels::ops::{self, BinaryOp, SliceSpec};
use kernels::{rng, DType, KernelId, KernelParams, Tensor};
use std::rc::Rc;

fn t(v: &Value, span: Span) -> R<&Tensor> {
    v.tensor().ok_or_else(|| rt(Code::E0605, "expected a tensor value", span))
}

impl Interp<'_> {
    /// The shape of this rank's block of a value of type `ty` whose global shape is `shape`.
    fn local_shape(&self, ty: &Type, mut shape: Vec<usize>) -> Vec<usize> {
        if let (Some(s), Type::Tensor(TensorTy { layout, .. })) = (self.spmd.as_deref(), ty) {
            for (d, axes) in shape.iter_mut().zip(&layout.0) {
                *d /= s.mesh.parts(axes).max(1) as usize;
            }
        }
        shape
    }

    /// The global shape of a value of type `ty` whose block on this rank has shape `shape`.
    fn global_shape(&self, ty: &Type, mut shape: Vec<usize>) -> Vec<usize> {
        if let (Some(s), Type::Tensor(TensorTy { layout, .. })) = (self.spmd.as_deref(), ty) {
            for (d, axes) in shape.iter_mut().zip(&layout.0) {
                *d *= s.mesh.parts(axes).max(1) as usize;
            }
        }
        shape
    }

    /// The block of a value of type `ty` (global shape `shape`) that this rank holds.
    fn region(&self, ty: &Type, shape: &[usize]) -> rng::Region {
        let mut r = rng::Region::whole(shape);
        if let (Some(s), Type::Tensor(TensorTy { layout, .. })) = (self.spmd.as_deref(), ty) {
            for (d, axes) in layout.0.iter().enumerate().take(shape.len()) {
                let k = s.mesh.parts(axes).max(1) as usize;
                if k > 1 {
                    let i = s.mesh.group_index(s.rank(), axes) as usize;
                    r.len[d] = shape[d] / k;
                    r.start[d] = i * r.len[d];
                }
            }
        }
        r
    }

    /// A collective primitive on this rank's block (the identity without a sharded run).
    fn collective(&self, p: Prim, x: &Tensor, attrs: &Attrs, span: Span) -> R<Value> {
        let Some(s) = self.spmd.as_deref() else { return Ok(Value::Tensor(x.clone())) };
        let axes = &attrs.mesh_axes;
        if p == Prim::LocalSlice {
            let r = s.local_slice(axes, attrs.axis.unwrap_or(0), x);
            return r.map(Value::Tensor).map_err(|m| rt(Code::E0602, m, span));
        }
        let c = super::overlap::coll_of(p, attrs)
            .ok_or_else(|| rt(Code::E0605, format!("`{}` is not a collective", p.name()), span))?;
        let before = s.comm.bytes_sent();
        let r = s.run(c, axes, x);
        s.count(attrs.site, span, p.name(), s.comm.bytes_sent().saturating_sub(before));
        r.map(Value::Tensor).map_err(|m| rt(Code::E0602, m, span))
    }

    /// `a @ b`; an operand written as a swap of its last two axes (`transpose(a) @ b`, and the
    /// derivatives of `@`) is read through strides by the GEMM instead of being copied.
    /// The left operand of `@` as evaluated, transposed back when its transpose was folded.
    fn undo_swap(&self, x: Option<Tensor>, swapped: bool, span: Span) -> R<Tensor> {
        let x = x.ok_or_else(|| rt(Code::E0605, "`@` takes two operands", span))?;
        if swapped {
            ops::swap_last(&x).map_err(|k| kerr(k, span))
        } else {
            Ok(x)
        }
    }

    pub(crate) fn matmul(&mut self, args: &[Expr], e: &Expr, frame: &mut Frame) -> R<Value> {
        let span = self.span(e);
        let mut ts = Vec::with_capacity(2);
        let mut flags = [false; 2];
        for (i, a) in args.iter().enumerate() {
            let inner = a.swapped_last();
            flags[i] = inner.is_some();
            let v = self.eval(inner.unwrap_or(a), frame)?;
            if let (1, false, Value::Quant(q)) = (i, flags[1], &v) {
                // An int8 weight (`quantize`): the int8 kernel.
                let t0 = self.trace_start();
                let x = self.undo_swap(ts.pop(), flags[0], span)?;
                let r = super::compress::matmul(x, q).map(Value::Tensor).map_err(|k| kerr(k, span));
                self.trace_prim(t0, Prim::MatMul, e, &r, None);
                return r;
            }
            let v = super::compress::plain(v);
            ts.push(t(&v, span)?.clone());
        }
        let t0 = self.trace_start();
        let (Some(b), Some(a)) = (ts.pop(), ts.pop()) else {
            return Err(rt(Code::E0605, "`@` takes two operands", span));
        };
        let (a, b) = unify_dtypes(a, b);
        // Products over storage-only types accumulate in f32 (LANGUAGE.md §10).
        let (a, b) = (widened(a), widened(b));
        let r = self.gemm(&a, &b, flags, span).map(|t| Value::Tensor(stored(t, &e.ty)));
        self.trace_prim(t0, Prim::MatMul, e, &r, None);
        r
    }

    /// [`Interp::prim_any`], with `bf16`/`f16` operands computed in f32 and the result
    /// rounded to its storage type (`print`, `save`, conversions and collectives take them as
    /// they are).
    pub(crate) fn prim(&mut self, p: Prim, args: Vec<Value>, attrs: &Attrs, e: &Expr, frame: &mut Frame) -> R<Value> {
        let keeps = matches!(p, Prim::Print | Prim::Save | Prim::Cast | Prim::LogScalar | Prim::Params)
            || matches!(p, crate::collective_prims!());
        let half = |v: &Value| matches!(v, Value::Tensor(t) if t.dtype().is_half());
        let out_half = matches!(&e.ty, Type::Tensor(tt) if dtype_of_elem(tt.elem).is_some_and(DType::is_half));
        if keeps || (!out_half && !args.iter().any(half)) {
            return self.prim_any(p, args, attrs, e, frame);
        }
        let args = args
            .into_iter()
            .map(|v| match v {
                Value::Tensor(t) => Value::Tensor(widened(t)),
                v => v,
            })
            .collect();
        Ok(match self.prim_any(p, args, attrs, e, frame)? {
            Value::Tensor(t) => Value::Tensor(stored(t, &e.ty)),
            v => v,
        })
    }

    pub(crate) fn prim_any(
        &mut self,
        p: Prim,
        mut args: Vec<Value>,
        attrs: &Attrs,
        e: &Expr,
        frame: &mut Frame,
    ) -> R<Value> {
        let span = self.span(e);
        // A quantized matrix stays int8 as the right operand of `@`, in `save`, `params` and
        // the compression builtins; everywhere else it is the f32 matrix it stands for.
        let keeps = |i: usize| {
            (p == Prim::MatMul && i == 1)
                || matches!(p, Prim::Save | Prim::Params | Prim::Quantize | Prim::Prune | Prim::Print)
        };
        for (i, a) in args.iter_mut().enumerate() {
            if matches!(a, Value::Quant(_)) && !keeps(i) {
                *a = super::compress::plain(std::mem::replace(a, Value::unit()));
            }
            // A sharded optimizer state is whole to everything but an optimizer step.
            if super::zero::holds_pieces(a) {
                *a = self.whole_value(std::mem::replace(a, Value::unit()), span)?;
            }
        }
        let normalised;
        let attrs = if attrs.from_end {
            let rank = args.first().and_then(|v| v.tensor()).map(|t| t.rank()).unwrap_or(0);
            let k = attrs.axis.unwrap_or(1);
            normalised = Attrs { axis: Some(rank.saturating_sub(k)), from_end: false, ..attrs.clone() };
            &normalised
        } else {
            attrs
        };
        let k = |r: Result<Tensor, kernels::KernelError>| r.map(Value::Tensor).map_err(|e| kerr(e, span));
        let kt = |r: R<Tensor>| r.map(Value::Tensor);
        let x0 = || t(&args[0], span);
        let along = |axis: Option<usize>| KernelParams { axis, keepdims: attrs.keepdims, ..KernelParams::new() };
        if let Some(op) = unary_op(p) {
            return kt(self.kernel1(KernelId::Unary(op), &unary_operand(p, x0()?), KernelParams::new(), span));
        }
        if let Some(op) = binary_op(p) {
            return self.binary(op, &args[0], &args[1], span);
        }
        if let Some(op) = p.reduce_kernel() {
            let x = x0()?;
            let x = if x.dtype() == DType::Bool { x.cast(DType::I32) } else { x.clone() };
            return kt(self.kernel1(KernelId::Reduce(op), &x, along(attrs.axis), span));
        }
        let axis0 = Some(attrs.axis.unwrap_or(0));
        if let Some(a) = p.along() {
            return kt(self.kernel1(a.kernel, x0()?, along(axis0), span));
        }
        match p {
            Prim::Argmax => kt(self.kernel1(KernelId::ArgMax, x0()?, along(attrs.axis), span)),
            Prim::Argmin => kt(self.kernel1(KernelId::ArgMin, x0()?, along(attrs.axis), span)),
            Prim::Logsumexp => kt(self.kernel1(KernelId::LogSumExp, x0()?, along(attrs.axis), span)),
            Prim::Quantize => super::compress::quantize(&args[0]).map_err(|e| kerr(e, span)),
            Prim::Prune => {
                let s = t(&args[1], span)?.scalar_value_f64().unwrap_or(f64::NAN);
                super::compress::prune(&args[0], s).map_err(|e| kerr(e, span))
            }
            Prim::MatMul => {
                if let Value::Quant(q) = &args[1] {
                    return k(super::compress::matmul(t(&args[0], span)?.clone(), q));
                }
                let (a, b) = unify_dtypes(t(&args[0], span)?.clone(), t(&args[1], span)?.clone());
                kt(self.gemm(&a, &b, [false; 2], span))
            }
            Prim::Where => {
                let ts = args.iter().map(|v| t(v, span).cloned()).collect::<R<Vec<_>>>()?;
                let [c, a, b] = &ts[..] else {
                    return Err(rt(Code::E0605, "`where` takes three operands", span));
                };
                let (a, b) = unify_dtypes(a.clone(), b.clone());
                kt(self.kernel(KernelId::Where, &[c, &a, &b], &KernelParams::new(), span))
            }
            // A conversion that cannot hold the value (NaN, ±inf, out of range to i32) is an error.
            Prim::Cast => {
                let to = dtype_of(attrs.dtype.unwrap_or(ElemTy::F32));
                kt(self.kernel1(KernelId::Cast, x0()?, KernelParams::new().dtype(to), span))
            }
            Prim::Reshape => {
                // A sharded result (`shard::rules`): this rank reshapes its block.
                let global = self.dims_usize(frame, &attrs.shape, span)?;
                let shape = self.local_shape(&e.ty, global.clone());
                if let (Some(s), Type::Tensor(TensorTy { layout, .. })) = (self.spmd.as_deref(), &e.ty) {
                    for (d, axes) in layout.0.iter().enumerate() {
                        let parts = s.mesh.parts(axes).max(1) as usize;
                        if global.get(d).is_some_and(|n| n % parts != 0) {
                            let names: Vec<&str> = axes.iter().map(|a| s.mesh.names[a.0 as usize].as_str()).collect();
                            let msg = format!(
                                "reshape: dim {d} of the result, of size {}, does not split evenly over `{}` ({parts} parts)",
                                global[d],
                                names.join(", ")
                            );
                            return Err(rt(Code::E0602, msg, span));
                        }
                    }
                }
                kt(self.kernel1(KernelId::Reshape, x0()?, KernelParams::new().shape(&shape), span))
            }
            Prim::BroadcastTo => {
                let shape = self.local_shape(&e.ty, self.dims_usize(frame, &attrs.shape, span)?);
                kt(self.kernel1(KernelId::BroadcastTo, x0()?, KernelParams::new().shape(&shape), span))
            }
            Prim::Transpose | Prim::Permute => {
                kt(self.kernel1(KernelId::Permute, x0()?, KernelParams::new().perm(&attrs.perm), span))
            }
            Prim::Concat | Prim::Stack => {
                let ts: Vec<&Tensor> = args.iter().map(|a| t(a, span)).collect::<R<_>>()?;
                let id = if p == Prim::Concat { KernelId::Concat } else { KernelId::Stack };
                kt(self.kernel(id, &ts, &along(axis0), span))
            }
            Prim::CopyJoin => {
                // This rank's parts, in order (`copy_split` took them from its block).
                let ts: Vec<&Tensor> = args.iter().map(|a| t(a, span)).collect::<R<_>>()?;
                kt(self.kernel(KernelId::Concat, &ts, &along(axis0), span))
            }
            Prim::CopySplit => {
                let x = t(&args[0], span)?;
                let (c, n) = (attrs.perm.first().copied().unwrap_or(0), attrs.perm.get(1).copied().unwrap_or(1));
                let ax = attrs.axis.unwrap_or(0);
                let rows = x.shape().get(ax).copied().unwrap_or(0);
                if n == 0 || rows % n != 0 {
                    return Err(rt(
                        Code::E0602,
                        format!(
                            "`@copies({n})` cannot split a batch of {rows} rows (on this rank) into {n} equal copies"
                        ),
                        span,
                    ));
                }
                // Copy `c` of each rank's rows: a view of its run of the buffer (no copy).
                let b = rows / n;
                let d = self.device.upload(x).and_then(|d| d.narrowed(ax, c * b, b));
                kt(d.and_then(|d| self.device.download(&d)).map_err(|k| kerr(k, span)))
            }
            Prim::ExpandDims => kt(self.kernel1(KernelId::ExpandDims, x0()?, along(axis0), span)),
            Prim::Squeeze => {
                // `squeeze(x)` removes exactly the dims the checker removed (literal 1s).
                let x = t(&args[0], span)?;
                let out_shape: Vec<usize> = match &e.ty {
                    Type::Tensor(TensorTy { shape: s, .. }) => self.dims_usize(frame, &shape_dims(s), span)?,
                    _ => vec![],
                };
                kt(self.kernel1(KernelId::Reshape, x, KernelParams::new().shape(&out_shape), span))
            }
            Prim::Gather => kt(self.kernel(KernelId::Gather, &[x0()?, t(&args[1], span)?], &along(axis0), span)),
            Prim::OneHot => {
                let n = self.dims_usize(frame, &attrs.shape, span)?;
                let p = KernelParams::new().n(n[0]).dtype(dtype_of(attrs.dtype.unwrap_or(ElemTy::F32)));
                kt(self.kernel1(KernelId::OneHot, x0()?, p, span))
            }
            Prim::Einsum => {
                let ts: Vec<&Tensor> = args.iter().map(|a| t(a, span)).collect::<R<_>>()?;
                kt(self.kernel(
                    KernelId::Einsum,
                    &ts,
                    &KernelParams::new().spec(attrs.spec.as_deref().unwrap_or("")),
                    span,
                ))
            }
            Prim::Conv2d => self.conv_pool(p, KernelId::Conv2d, &args, attrs, e, frame),
            Prim::Conv2dInputGrad => self.conv_pool(p, KernelId::Conv2dInputGrad, &args, attrs, e, frame),
            Prim::Conv2dWeightGrad => self.conv_pool(p, KernelId::Conv2dWeightGrad, &args, attrs, e, frame),
            Prim::MaxPool2d => self.conv_pool(p, KernelId::MaxPool2d, &args, attrs, e, frame),
            Prim::MaxPool2dGrad => self.conv_pool(p, KernelId::MaxPool2dGrad, &args, attrs, e, frame),
            Prim::AvgPool2d => self.conv_pool(p, KernelId::AvgPool2d, &args, attrs, e, frame),
            Prim::AvgPool2dGrad => self.conv_pool(p, KernelId::AvgPool2dGrad, &args, attrs, e, frame),
            Prim::Slice => {
                let x = t(&args[0], span)?;
                let specs = self.slice_specs(&attrs.slice, &args[1..], span)?;
                kt(self.kernel1(KernelId::Slice, x, KernelParams::new().slices(&specs), span))
            }
            Prim::ScatterAdd => {
                // A split result (`shard::rules`) is this rank's block.
                let shape = self.local_shape(&e.ty, self.dims_usize(frame, &attrs.shape, span)?);
                let p = KernelParams { axis: axis0, ..KernelParams::new().shape(&shape) };
                kt(self.kernel(KernelId::ScatterAdd, &[t(&args[1], span)?, x0()?], &p, span))
            }
            Prim::Update => {
                let at = scalar_i64(t(&args[2], span)?).unwrap_or(0);
                let v = t(&args[1], span)?.clone();
                // The buffer is taken out of the argument list, so that an unshared one is
                // written in place.
                let x = match std::mem::replace(&mut args[0], Value::unit()) {
                    Value::Tensor(x) => x,
                    other => t(&other, span)?.clone(),
                };
                kt(self.update_on_device(x, &v, at, attrs.axis.unwrap_or(0), span))
            }
            Prim::Argsort => {
                let keep = self.dims_usize(frame, &attrs.shape, span)?;
                let p = KernelParams::new().shape(&keep[..keep.len().min(1)]).flag(attrs.descending);
                kt(self.kernel1(KernelId::Argsort, x0()?, KernelParams { axis: axis0, ..p }, span))
            }
            Prim::Attention | Prim::AttentionWeights => {
                let n = args.len();
                let len = scalar_i64(t(&args[n - 2], span)?).unwrap_or(0);
                let causal = t(&args[n - 1], span)?.as_bool().is_some_and(|b| b.first() == Some(&true));
                let params = KernelParams::new().ints(&[len]).flag(causal);
                let (q, kk) = (x0()?, t(&args[1], span)?);
                kt(if p == Prim::Attention {
                    self.kernel(KernelId::Attention, &[q, kk, t(&args[2], span)?], &params, span)
                } else {
                    self.kernel(KernelId::AttentionWeights, &[q, kk], &params, span)
                })
            }
            Prim::TakeAlong => kt(self.kernel(KernelId::TakeAlong, &[x0()?, t(&args[1], span)?], &along(axis0), span)),
            Prim::ScatterAddAlong => {
                let shape = self.local_shape(&e.ty, self.dims_usize(frame, &attrs.shape, span)?);
                let p = KernelParams { axis: axis0, ..KernelParams::new().shape(&shape) };
                kt(self.kernel(KernelId::ScatterAddAlong, &[t(&args[1], span)?, x0()?], &p, span))
            }
            Prim::Zeros => kt(self.create(Create::Fill(0.0), attrs, e, frame)),
            Prim::Ones => kt(self.create(Create::Fill(1.0), attrs, e, frame)),
            Prim::Full => kt(self.create(Create::Fill(x0()?.scalar_value_f64().unwrap_or(0.0)), attrs, e, frame)),
            Prim::Arange => kt(self.create(Create::Counted(KernelId::Arange), attrs, e, frame)),
            Prim::Eye => kt(self.create(Create::Counted(KernelId::Eye), attrs, e, frame)),
            Prim::Normal => kt(self.draw(Draw::Normal, &args, attrs, e, frame)),
            Prim::Uniform => kt(self.draw(Draw::Uniform, &args, attrs, e, frame)),
            Prim::HeNormal => kt(self.draw(Draw::He, &args, attrs, e, frame)),
            Prim::GlorotUniform => kt(self.draw(Draw::Glorot, &args, attrs, e, frame)),
            Prim::ModelSum => {
                let mut leaves = Vec::new();
                args[0].leaves(&mut leaves);
                let mut total = 0.0f64;
                for t in leaves.iter().filter(|t| t.dtype().is_float()) {
                    let s =
                        self.kernel1(KernelId::Reduce(kernels::ops::ReduceOp::Sum), t, KernelParams::new(), span)?;
                    total += s.scalar_value_f64().unwrap_or(0.0);
                }
                Ok(Value::Tensor(Tensor::scalar_f32(total as f32)))
            }
            Prim::Params => Ok(Value::Tensor(Tensor::scalar_i32(super::compress::count(&args[0]) as i32))),
            Prim::StopGradient => Ok(args.into_iter().next().unwrap_or_else(Value::unit)),
            Prim::ShardState => {
                let v = args.into_iter().next().unwrap_or_else(Value::unit);
                self.host_states |= attrs.host;
                self.shard_state(v, attrs.mesh_axes.first().copied(), attrs.host, span)
            }
            Prim::TapeNew => Ok(Value::Tape(value::Tape::default())),
            Prim::TapePush => {
                let mut it = args.into_iter();
                match (it.next(), it.next()) {
                    (Some(Value::Tape(t)), Some(v)) => Ok(Value::Tape(t.push(v))),
                    _ => Err(rt(Code::E0605, "tape_push: expected a tape and a value", span)),
                }
            }
            Prim::TapeGet => {
                let i = args.get(1).and_then(|v| v.tensor()).and_then(scalar_i64);
                match (args.first(), i) {
                    (Some(Value::Tape(t)), Some(i)) => t.take(i).ok_or_else(|| {
                        rt(Code::E0605, format!("tape_get: no entry {i} in a tape of {}", t.len()), span)
                    }),
                    _ => Err(rt(Code::E0605, "tape_get: expected a tape and an index", span)),
                }
            }
            // A partial result's sum (`interp::zero`): this rank's part.
            Prim::AllReduceSum if self.left_out(e) => Ok(args.swap_remove(0)),
            crate::collective_prims!() => self.collective(p, t(&args[0], span)?, attrs, span),
            Prim::Print => {
                let parts: Vec<String> = args.iter().map(|v| v.display_with(self.prog, attrs.precision)).collect();
                let line = parts.join(" ");
                let _ = writeln!(self.out, "{line}");
                Ok(Value::unit())
            }
            Prim::Load => {
                let v = self.load(&args[0], &e.ty, span, frame)?;
                // A checkpoint folder is read by blocks (`load` does it); other files hold whole
                // models, cut to this rank's blocks here.
                let folder = matches!(&args[0], Value::Str(p) if p.ends_with('/'));
                match self.spmd.clone() {
                    Some(s) if !folder => self.localize(&s, v, span),
                    _ => Ok(v),
                }
            }
            // A checkpoint folder in a sharded run: every rank writes its blocks (the pass
            // gathered nothing). Any other file: every rank holds the whole value (the pass
            // gathered it), and rank 0 writes it.
            Prim::Save
                if self.spmd.is_some()
                    && matches!(&e.kind, crate::ir::ExprKind::Prim { args, .. } if crate::shard::sharded_save(args)) =>
            {
                let (Some(s), Value::Str(p)) = (self.spmd.clone(), &args[0]) else {
                    return Err(rt(Code::E0605, "`save` needs a path", span));
                };
                let ty = match &e.kind {
                    crate::ir::ExprKind::Prim { args, .. } => args.get(1).map_or(Type::Error, |a| a.ty.clone()),
                    _ => Type::Error,
                };
                let full = self.in_work_dir(std::path::Path::new(&**p));
                self.save_sharded(&s, &full, p, &args[1], &ty, span).map(|_| Value::unit())
            }
            Prim::Save if self.spmd.as_ref().is_some_and(|s| s.rank() != 0) => Ok(Value::unit()),
            Prim::Save => self.save(&args[0], &args[1], span),
            Prim::LogScalar => self.log_scalar(&args, span),
            Prim::Exists => self.exists(&args[0], span),
            Prim::Clock => Ok(Value::Tensor(Tensor::scalar_f64(process_start().elapsed().as_secs_f64()))),
            Prim::Assert => {
                let ok = t(&args[0], span)?.as_bool().is_some_and(|b| b.first().copied().unwrap_or(false));
                if ok {
                    return Ok(Value::unit());
                }
                let msg = match args.get(1) {
                    Some(Value::Str(s)) => format!("assertion failed: {s}"),
                    _ => "assertion failed".to_string(),
                };
                Err(rt(Code::E0604, msg, span))
            }
            Prim::AssertClose => self.assert_close(&args, span),
            Prim::Map => self.map(args, span),
            // Applied above through their kernels (`ir::eval`); listed so that a new primitive
            // cannot compile without an evaluation.
            crate::unary_prims!()
            | crate::binary_prims!()
            | crate::along_prims!()
            | Prim::Sum
            | Prim::Mean
            | Prim::Max
            | Prim::Min => Err(rt(Code::E0605, format!("`{}` cannot be evaluated here", p.name()), span)),
        }
    }

    /// `zeros`, `ones`, `full` (a filled shape) and `arange`, `eye` (sized by their first dim).
    fn create(&mut self, how: Create, attrs: &Attrs, e: &Expr, frame: &Frame) -> R<Tensor> {
        let span = self.span(e);
        let shape = self.dims_usize(frame, &attrs.shape, span)?;
        let dt = dtype_of(attrs.dtype.unwrap_or(ElemTy::F32));
        let (id, params) = match how {
            // A split result (the sharding pass made it one) is created as this rank's block.
            Create::Fill(v) => {
                let shape = self.local_shape(&e.ty, shape);
                (KernelId::Fill, KernelParams::new().dtype(dt).shape(&shape).value(v))
            }
            Create::Counted(id) => (id, KernelParams::new().n(shape.first().copied().unwrap_or(0)).dtype(dt)),
        };
        self.kernel(id, &[], &params, span)
    }

    /// The random creations: element `i` draws counter `i` of the seed's stream, so a rank's
    /// block holds what the whole tensor has there.
    fn draw(&mut self, how: Draw, args: &[Value], attrs: &Attrs, e: &Expr, frame: &Frame) -> R<Tensor> {
        let span = self.span(e);
        // `uniform(like: x, seed: s)` takes the (global) shape of its second operand.
        let shape = match args.get(1) {
            Some(like) => self.global_shape(&e.ty, t(like, span)?.shape().to_vec()),
            None => self.dims_usize(frame, &attrs.shape, span)?,
        };
        let region = self.region(&e.ty, &shape);
        let dt = dtype_of(attrs.dtype.unwrap_or(ElemTy::F32));
        let key = match args.first() {
            Some(v) => rng::stream_key(t(v, span).map(|x| scalar_i64(x).unwrap_or(0))? as u64, ""),
            None => match self.init_keys.last() {
                Some((seed, path)) => rng::stream_key(*seed as u64, path),
                None => return Err(rt(Code::E0605, "random creation outside `init` needs `seed:`", span)),
            },
        };
        let dim = |i: usize| shape.get(i).copied().unwrap_or(0);
        let (id, lo, hi) = match how {
            Draw::Normal => (KernelId::Normal, 0.0, 1.0),
            Draw::Uniform => (KernelId::Uniform, 0.0, 1.0),
            Draw::He => (KernelId::Normal, 0.0, (2.0 / dim(0).max(1) as f64).sqrt()),
            Draw::Glorot => {
                let a = (6.0 / dim(0).saturating_add(dim(1)).max(1) as f64).sqrt();
                (KernelId::Uniform, -a, a)
            }
        };
        let params = KernelParams::new().dtype(dt).key(key).region(region).value(lo).scale(hi);
        self.kernel(id, &[], &params, span)
    }

    /// The convolution and pooling primitives (`attrs.perm` holds their two integers). A
    /// symbolic output size with a stride above 1 is an exact division in the type
    /// (`check::builtins::conv`); a run whose sizes make it inexact stops here (exit 2).
    fn conv_pool(&mut self, p: Prim, id: KernelId, args: &[Value], attrs: &Attrs, e: &Expr, frame: &Frame) -> R<Value> {
        let span = self.span(e);
        let (a, b) = (attrs.perm.first().copied().unwrap_or(1), attrs.perm.get(1).copied().unwrap_or(0));
        let mut params = KernelParams::new().ints(&[a as i64, b as i64]);
        // The adjoints whose input size floor division does not determine carry it in
        // `attrs.shape` (`conv2d_input_grad`'s `size:`, `conv2d_weight_grad`'s `kernel:`).
        if !attrs.shape.is_empty() {
            let s = self.dims_usize(frame, &attrs.shape, span)?;
            params = params.shape(&[s.first().copied().unwrap_or(0), s.get(1).copied().unwrap_or(0)]);
        }
        let xs = args.iter().map(|v| t(v, span)).collect::<R<Vec<&Tensor>>>()?;
        let out = self.kernel(id, &xs, &params, span)?;
        // The type's spatial sizes: a symbolic one may be an exact division that the sizes of
        // this run do not divide.
        if let Type::Tensor(TensorTy { shape: s, .. }) = &e.ty {
            for (i, item) in s.iter().enumerate().skip(2) {
                if let crate::types::ShapeItem::Dim(d) = item {
                    let v = d.subst(&|s| frame.dims.get(&s).map(|&x| crate::types::Dim::constant(x)));
                    let got = out.shape().get(i).map(|&n| n as i64);
                    if v.is_fractional_const() || v.as_const().is_some_and(|c| Some(c) != got) {
                        let (name, ds) = (p.name(), crate::types::dim_str(d, self.prog));
                        return Err(rt(
                            Code::E0602,
                            format!(
                                "`{name}` gives spatial size {} here, but its type's size {ds} is {}: over a symbolic \
                                 size the stride must divide the padded size minus the window",
                                got.unwrap_or(0),
                                crate::types::dim_str(&v, self.prog),
                            ),
                            span,
                        ));
                    }
                }
            }
        }
        Ok(Value::Tensor(out))
    }

    fn slice_specs(&self, kinds: &[ir::SliceEntry], bounds: &[Value], span: Span) -> R<Vec<SliceSpec>> {
        let mut it = bounds.iter();
        let next = |it: &mut std::slice::Iter<Value>| -> R<i64> {
            it.next()
                .and_then(|v| v.tensor())
                .and_then(scalar_i64)
                .ok_or_else(|| rt(Code::E0605, "bad slice bound", span))
        };
        let mut specs = Vec::new();
        for kind in kinds {
            specs.push(match kind {
                ir::SliceEntry::Index => SliceSpec::Index(next(&mut it)?),
                ir::SliceEntry::Range => {
                    let start = next(&mut it)?;
                    let end = next(&mut it)?;
                    SliceSpec::Range { start, end }
                }
                ir::SliceEntry::Full => SliceSpec::Full,
            });
        }
        Ok(specs)
    }

    /// Elementwise binary operation; models combine field by field and scale by scalars.
    pub(crate) fn binary(&mut self, op: BinaryOp, a: &Value, b: &Value, span: Span) -> R<Value> {
        if let (Value::Quant(_), _) | (_, Value::Quant(_)) = (a, b) {
            let (a, b) = (super::compress::plain(a.clone()), super::compress::plain(b.clone()));
            return self.binary(op, &a, &b, span);
        }
        let model = matches!(a, Value::Model(_)) || matches!(b, Value::Model(_));
        if let Some((like, ts)) = if model { flat_operands([a, b]) } else { None } {
            return wrap_flat(like, &self.tensor_binary(op, &ts[0], &ts[1], span)?, span);
        }
        match (a, b) {
            (Value::Tensor(x), Value::Tensor(y)) => self.tensor_binary(op, x, y, span).map(Value::Tensor),
            // Model arithmetic works on the float tensors; integer and bool fields (counters,
            // masks) keep the model operand's values, as the model's type says they must.
            (Value::Model(m), Value::Model(n)) => {
                let fields = m
                    .fields
                    .iter()
                    .zip(&n.fields)
                    .map(|(x, y)| if carried(x) { Ok(x.clone()) } else { self.binary(op, x, y, span) })
                    .collect::<R<Vec<_>>>()?;
                Ok(Value::Model(Rc::new(ModelValue { model: m.model, dims: m.dims.clone(), fields })))
            }
            (Value::Model(m), s @ Value::Tensor(_)) => {
                let fields = m
                    .fields
                    .iter()
                    .map(|x| if carried(x) { Ok(x.clone()) } else { self.binary(op, x, s, span) })
                    .collect::<R<Vec<_>>>()?;
                Ok(Value::Model(Rc::new(ModelValue { model: m.model, dims: m.dims.clone(), fields })))
            }
            (s @ Value::Tensor(_), Value::Model(m)) => {
                let fields = m
                    .fields
                    .iter()
                    .map(|x| if carried(x) { Ok(x.clone()) } else { self.binary(op, s, x, span) })
                    .collect::<R<Vec<_>>>()?;
                Ok(Value::Model(Rc::new(ModelValue { model: m.model, dims: m.dims.clone(), fields })))
            }
            (Value::Tuple(x), Value::Tuple(y)) => {
                let items = x.iter().zip(y.iter()).map(|(x, y)| self.binary(op, x, y, span)).collect::<R<Vec<_>>>()?;
                Ok(Value::Tuple(Rc::new(items)))
            }
            _ => Err(rt(Code::E0605, "operands of incompatible kinds", span)),
        }
    }

    /// `map(f, m, …)`: applies `f` to the tensors of one or more models of one type.
    pub(crate) fn map(&mut self, args: Vec<Value>, span: Span) -> R<Value> {
        let mut it = args.into_iter();
        let Some(Value::Fn(f)) = it.next() else { return Err(rt(Code::E0605, "`map` needs a function", span)) };
        let models: Vec<Value> = it.collect();
        if let Some(r) = self.map_flat(&f, &models, span) {
            return r;
        }
        self.map_rec(&f, &models, span)
    }

    /// `map` of a pointwise function over models of one layout: the function applied once to
    /// the models' parameter buffers (it gives what it gives tensor by tensor, since every
    /// operation in it is elementwise and every other operand is a scalar). `None` when some
    /// model cannot be flat or the function is not pointwise.
    fn map_flat(&mut self, f: &Rc<super::FnValue>, models: &[Value], span: Span) -> Option<R<Value>> {
        let super::FnValue::Func { target, captures, closure, .. } = &**f else { return None };
        models.iter().all(|v| matches!(v, Value::Model(_))).then_some(())?;
        // A model kept in parts (a gradient of large tensors) is packed first: one copy costs
        // less than applying the function once per tensor.
        let packed: Vec<Value> = models.iter().map(|v| v.clone().packed()).collect();
        let (shape_of, flats) = flat_operands(&packed)?;
        let args: Vec<Value> = flats.into_iter().map(Value::Tensor).collect();
        let fid = match target {
            crate::ir::FnTarget::Func(fid) => *fid,
            crate::ir::FnTarget::Dynamic => self.pick_instance((*closure)?, &args)?,
            _ => return None,
        };
        let func = self.prog.func(fid);
        let scalar_capture = |l: crate::ir::Local| {
            captures.iter().any(|(c, v)| *c == l && matches!(v, Value::Tensor(t) if t.rank() == 0))
        };
        let params = &func.params[func.params.len().checked_sub(args.len())?..];
        pointwise(&func.body, params, &scalar_capture).then_some(())?;
        let n = args[0].tensor().map_or(0, |t| t.len());
        match self.apply(f, &crate::ir::FnTarget::Dynamic, args, span) {
            // A body that ignores its parameters gives a scalar: map tensor by tensor then.
            Ok(Value::Tensor(t)) if t.rank() == 1 && t.len() == n => Some(wrap_flat(shape_of, &t, span)),
            Ok(_) => None,
            Err(e) => Some(Err(e)),
        }
    }

    fn map_rec(&mut self, f: &Rc<super::FnValue>, vals: &[Value], span: Span) -> R<Value> {
        match &vals[0] {
            Value::Tensor(_) => self.apply(f, &crate::ir::FnTarget::Dynamic, vals.to_vec(), span),
            Value::Model(m) => {
                let mut fields = Vec::with_capacity(m.fields.len());
                for i in 0..m.fields.len() {
                    let col: Vec<Value> = vals
                        .iter()
                        .map(|v| match v {
                            Value::Model(n) => n.fields[i].clone(),
                            other => other.clone(),
                        })
                        .collect();
                    fields.push(self.map_rec(f, &col, span)?);
                }
                Ok(Value::Model(Rc::new(ModelValue { model: m.model, dims: m.dims.clone(), fields })))
            }
            other => Ok(other.clone()),
        }
    }

    fn assert_close(&mut self, args: &[Value], span: Span) -> R<Value> {
        let a = t(&args[0], span)?.to_f64_vec();
        let b = t(&args[1], span)?.to_f64_vec();
        let rtol = t(&args[2], span)?.scalar_value_f64().unwrap_or(1e-5);
        let atol = t(&args[3], span)?.scalar_value_f64().unwrap_or(1e-6);
        let n = a.len().max(b.len());
        let get = |v: &[f64], i: usize| if v.len() == 1 { v[0] } else { v[i] };
        if a.len() != b.len() && a.len() != 1 && b.len() != 1 {
            return Err(rt(Code::E0604, format!("assert_close: sizes differ ({} vs {})", a.len(), b.len()), span));
        }
        let mut worst: Option<(usize, f64, f64)> = None;
        let mut bad = 0;
        for i in 0..n {
            let (x, y) = (get(&a, i), get(&b, i));
            let ok = (x - y).abs() <= atol + rtol * y.abs() || (x == y);
            if !ok || x.is_nan() || y.is_nan() {
                bad += 1;
                if worst.is_none_or(|(_, wx, wy)| (x - y).abs() > (wx - wy).abs() || x.is_nan() || y.is_nan()) {
                    worst = Some((i, x, y));
                }
            }
        }
        match worst {
            None => Ok(Value::unit()),
            Some((i, x, y)) => {
                let what = if x.is_nan() || y.is_nan() { "NaN in assert_close" } else { "assert_close failed" };
                Err(rt(
                    Code::E0604,
                    format!("{what}: {bad} of {n} elements differ; worst at flat index {i}: {x} vs {y} (rtol {rtol}, atol {atol})"),
                    span,
                ))
            }
        }
    }
}

fn shape_dims(s: &[crate::types::ShapeItem]) -> Vec<crate::types::Dim> {
    s.iter()
        .filter_map(|i| match i {
            crate::types::ShapeItem::Dim(d) => Some(d.clone()),
            _ => None,
        })
        .collect()
}

use std::io::Write as _;

/// The operands of elementwise arithmetic over flat models (see [`ModelValue::flat`]) as
/// tensors — each model's parameter buffer, each scalar as it is — with the first model, which
/// gives the result's layout. `None` unless there is a model and every model is flat, of a float
/// element type and of one length, and every other operand is a scalar: then the arithmetic is
/// one operation over the buffers, with what tensor-by-tensor arithmetic gives (every tensor of
/// a flat model has rank ≥ 1, so a scalar operand adapts to it either way).
/// The instant `clock()` counts from: the first time anything asks for it.
fn process_start() -> std::time::Instant {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    *START.get_or_init(std::time::Instant::now)
}

/// A field that model arithmetic leaves as it is: an integer or bool tensor.
fn carried(v: &Value) -> bool {
    matches!(v, Value::Tensor(t) if !t.dtype().is_float())
}

pub(super) fn flat_operands<'v>(vals: impl IntoIterator<Item = &'v Value>) -> Option<(&'v ModelValue, Vec<Tensor>)> {
    let mut like: Option<(&ModelValue, Tensor)> = None;
    let mut ts = Vec::new();
    for v in vals {
        match v {
            Value::Model(m) => {
                let x = m.flat()?;
                let first = like.as_ref().map_or(&x, |(_, f)| f);
                (x.dtype().is_float() && x.dtype() == first.dtype() && x.len() == first.len()).then_some(())?;
                if like.is_none() {
                    like = Some((m, x.clone()));
                }
                ts.push(x);
            }
            Value::Tensor(t) if t.rank() == 0 => ts.push(t.clone()),
            _ => return None,
        }
    }
    Some((like?.0, ts))
}

/// The model of `like`'s layout whose parameters are the rank-1 tensor `flat`.
pub(super) fn wrap_flat(like: &ModelValue, flat: &Tensor, span: Span) -> R<Value> {
    like.with_flat(flat)
        .map(|m| Value::Model(Rc::new(m)))
        .ok_or_else(|| rt(Code::E0605, "internal error: a flat model result of the wrong size", span))
}

/// Whether `e` is built only from elementwise primitives, literals, the locals `params` and
/// locals that `scalar` accepts (captured scalars): applied to a rank-1 concatenation of
/// tensors it gives the concatenation of its results on each.
pub(crate) fn pointwise(e: &Expr, params: &[crate::ir::Local], scalar: &dyn Fn(crate::ir::Local) -> bool) -> bool {
    use crate::ir::ExprKind;
    match &e.kind {
        ExprKind::Prim { prim, args, .. } => prim.is_elementwise() && args.iter().all(|a| pointwise(a, params, scalar)),
        ExprKind::Lit(_) => true,
        ExprKind::Local(l) => params.contains(l) || scalar(*l),
        ExprKind::Block { stmts, result } => stmts.is_empty() && pointwise(result, params, scalar),
        _ => false,
    }
}

impl Interp<'_> {
    /// `buf = update(buf, v, at: i)`: the old buffer is dead once the update is made, so it
    /// moves out of its slot and, when nothing else holds it, is written in place (a key/value
    /// cache costs one row per step, not a copy of the cache). Only an update that fits is
    /// taken this way, so a failing one leaves `buf` as it was. False when `value` is not such
    /// an update (the caller evaluates it as usual).
    pub(crate) fn assign_update(&mut self, l: ir::Local, value: &Expr, frame: &mut Frame) -> R<bool> {
        let ExprKind::Prim { prim: Prim::Update, args, attrs } = &value.kind else { return Ok(false) };
        if !matches!(&args[0].kind, ExprKind::Local(x) if *x == l) || self.nan_check {
            return Ok(false);
        }
        let span = self.span(value);
        let v = self.eval(&args[1], frame)?;
        let i = self.eval(&args[2], frame)?;
        let at = scalar_i64(t(&i, span)?).unwrap_or(-1);
        let axis = attrs.axis.unwrap_or(0);
        let vt = t(&v, span)?;
        let fits = match frame.locals.get(l.0 as usize) {
            Some(Some(Value::Tensor(x))) if axis < x.rank() => {
                let m = if vt.rank() == x.rank() { vt.shape()[axis] } else { 1 };
                at >= 0 && at.saturating_add(m as i64) <= x.shape()[axis] as i64
            }
            _ => false,
        };
        let Some(Value::Tensor(x)) = (if fits { frame.locals[l.0 as usize].take() } else { None }) else {
            // Evaluated as usual: the error names what does not fit.
            let x = self.eval(&args[0], frame)?;
            let r = self.prim(Prim::Update, vec![x, v, i], attrs, value, frame)?;
            frame.locals[l.0 as usize] = Some(r);
            return Ok(true);
        };
        let r = self.update_on_device(x, vt, at, axis, span)?;
        frame.locals[l.0 as usize] = Some(Value::Tensor(r));
        Ok(true)
    }
}

/// `t` in the type it is computed in: `f32` for the storage-only `bf16` and `f16`.
fn widened(t: Tensor) -> Tensor {
    if t.dtype().is_half() {
        t.cast(DType::F32)
    } else {
        t
    }
}

/// A float result `t` rounded to `ty`'s storage type when that is `bf16` or `f16`.
fn stored(t: Tensor, ty: &Type) -> Tensor {
    match ty {
        Type::Tensor(tt) => match dtype_of_elem(tt.elem) {
            Some(d) if d.is_half() && t.dtype().is_float() => t.cast(d),
            _ => t,
        },
        _ => t,
    }
}

/// The storage type of an element type, when it is a definite one.
fn dtype_of_elem(e: crate::types::Elem) -> Option<DType> {
    match e {
        crate::types::Elem::T(t) => Some(super::dtype_of(t)),
        _ => None,
    }
}

/// What a creation fills its tensor with.
enum Create {
    /// Every element `v` (`zeros`, `ones`, `full`).
    Fill(f64),
    /// A kernel sized by the first dim alone (`arange`, `eye`).
    Counted(KernelId),
}

/// The distribution a random creation draws from.
enum Draw {
    Normal,
    Uniform,
    /// `he_normal(i, o)`: a normal with standard deviation `sqrt(2 / i)`.
    He,
    /// `glorot_uniform(i, o)`: uniform on `±sqrt(6 / (i + o))`.
    Glorot,
}
