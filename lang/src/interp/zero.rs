//! Sharded optimizer state (`adam.init(m, lr: …, shard: dp)`, ZeRO stage 1; spec/sharding.md):
//! each rank keeps its piece of every state tensor that is whole over the axis, an
//! `@optimizer_step` call runs on the pieces of the model, the gradient and the state, and
//! one all-gather over the axis makes the updated model whole again.
//!
//! A tensor of `n` elements is cut into `k = size(axis)` pieces of `⌈n/k⌉` elements, the last
//! one padded with zeros; rank `i` of the axis keeps piece `i` as a rank-1 tensor. A tensor
//! already split over the axis (its rank holds a block no other rank of the axis holds), and a
//! scalar, is kept as it is. The pieces of one value share one buffer, so model arithmetic on
//! them stays one kernel.
//!
//! The gradient comes in pieces too: where it reaches the step straight from the function that
//! computes it (`shard::zero` finds where), that function leaves its data-parallel partial sums
//! unsummed ([`Value::Partial`]) and the step sums and cuts them with one reduce-scatter, so a
//! step sends what plain data parallelism sends (a reduce-scatter and an all-gather move the
//! bytes of one all-reduce). Anything else that meets a partial sum sums it whole first.

use super::value::Value;
use super::Frame;
use super::{rt, Interp, R};
use crate::diag::Code;
use crate::ir::{Pat, Program};
use crate::source::Span;
use crate::types::{AxisId, Type};
use kernels::Tensor;
use std::rc::Rc;

/// A tensor each rank of a mesh axis holds a partial sum of: the value is their sum.
#[derive(Clone, Debug)]
pub struct PartialSum {
    pub axis: AxisId,
    pub t: Tensor,
}

/// What a call tells its callee: the sums over `axis` that reach item `item` of its result
/// (`shard::zero::ZeroPlan::sums`) stay partial.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Defer {
    pub axis: AxisId,
    pub item: Option<usize>,
}

/// An optimizer state held in pieces, or in host memory (`offload: host`), or both.
#[derive(Clone, Debug)]
pub struct Sharded {
    /// The axis it is cut over (`None`: kept whole).
    pub axis: Option<AxisId>,
    /// Whether it lives in host memory and its update runs there.
    pub host: bool,
    /// The state with each cut tensor replaced by this rank's piece.
    pub value: Value,
    /// For each tensor leaf of the state (in `Value::leaves` order): its shape when it was
    /// cut, `None` when it is kept whole.
    pub cut: Vec<Option<Vec<usize>>>,
}

/// Whether each tensor leaf of `v` (in `Value::leaves` order) is cut over `axis`: tensors of
/// rank ≥ 1 whose declared layout does not split them over it.
fn plan(prog: &Program, v: &Value, decl: Option<&Type>, axis: AxisId, out: &mut Vec<bool>) {
    match v {
        Value::Tensor(t) => {
            let split = match decl {
                Some(Type::Tensor(tt)) => tt.layout.0.iter().any(|axes| axes.contains(&axis)),
                _ => false,
            };
            out.push(t.rank() > 0 && !split);
        }
        Value::Model(m) => {
            let fields = &prog.model(m.model).fields;
            for (i, f) in m.fields.iter().enumerate() {
                plan(prog, f, fields.get(i).map(|f| &f.ty), axis, out);
            }
        }
        Value::Tuple(xs) => xs.iter().for_each(|x| plan(prog, x, None, axis, out)),
        _ => {}
    }
}

/// The elements of `t` from `start`, `len` of them, as a rank-1 view.
fn run(t: &Tensor, start: usize, len: usize, span: Span) -> R<Tensor> {
    t.view(start, vec![len]).map_err(|e| rt(Code::E0605, e.to_string(), span))
}

/// Piece `i` of `k` of `t`: its elements from `i·⌈n/k⌉`, `⌈n/k⌉` of them, padded with zeros.
fn piece(t: &Tensor, i: usize, k: usize, span: Span) -> R<Tensor> {
    let n = t.len();
    let c = n.div_ceil(k);
    let start = (i * c).min(n);
    let len = c.min(n - start);
    let p = run(t, start, len, span)?;
    if len == c {
        return Ok(p);
    }
    let pad = kernels::ops::zeros(t.dtype(), &[c - len]).map_err(|e| rt(Code::E0605, e.to_string(), span))?;
    Ok(Tensor::concat_flat(&[&p, &pad]).unwrap_or(p))
}

/// `t` as a rank-1 tensor.
fn flat(t: &Tensor, span: Span) -> R<Tensor> {
    t.with_shape(vec![t.len()]).map_err(|e| rt(Code::E0605, e.to_string(), span))
}

/// `v` with its tensor leaves replaced, in order, by `parts` reshaped to `shapes`, all in one
/// new buffer when they have one element type.
fn rebuild(v: &Value, parts: Vec<Tensor>, shapes: Vec<Vec<usize>>, span: Span) -> R<Value> {
    let refs: Vec<&Tensor> = parts.iter().collect();
    let packed = Tensor::concat_flat(&refs);
    let mut leaves = Vec::with_capacity(parts.len());
    let mut at = 0;
    for (p, shape) in parts.iter().zip(shapes) {
        let t = match &packed {
            Some(buf) => buf.view(at, shape),
            None => Tensor::concat_flat(&[p])
                .ok_or_else(|| kernels::KernelError::Invalid("empty".into()))
                .and_then(|t| t.with_shape(shape)),
        };
        leaves.push(t.map_err(|e| rt(Code::E0605, e.to_string(), span))?);
        at += p.len();
    }
    let mut it = leaves.into_iter();
    v.map_tensors(&mut |_| it.next().ok_or_else(|| rt(Code::E0605, "internal: a piece is missing", span)))
}

impl Interp<'_> {
    /// The rank's index along `axis` and the axis's size; `None` when nothing is split.
    fn zero_group(&self, axis: AxisId) -> Option<(usize, usize)> {
        let s = self.spmd.as_deref()?;
        let k = s.mesh.parts(&[axis]) as usize;
        (k > 1).then(|| (s.mesh.group_index(s.rank(), &[axis]) as usize, k))
    }

    /// `v` as it is assigned to `pat`: a whole state assigned to a variable that holds one in
    /// pieces (a state resumed from a checkpoint over one made by `init(…, shard: dp)`) is cut
    /// into the rank's pieces too, so the variable keeps its layout.
    pub(crate) fn keep_pieces(&self, pat: &Pat, v: Value, frame: &Frame, span: Span) -> R<Value> {
        if !holds_sharded(pat, frame) {
            return Ok(v); // nothing to keep: no tuple is rebuilt
        }
        match (pat, v) {
            (Pat::Local(l), v) => match (&frame.locals[l.0 as usize], &v) {
                (Some(Value::Sharded(old)), Value::Model(_) | Value::Tuple(_)) => {
                    self.shard_state(v, old.axis, old.host, span)
                }
                _ => Ok(v),
            },
            (Pat::Tuple(ps), Value::Tuple(vs)) => {
                let parts = ps.iter().zip(vs.iter()).map(|(p, v)| self.keep_pieces(p, v.clone(), frame, span));
                Ok(Value::Tuple(Rc::new(parts.collect::<R<Vec<_>>>()?)))
            }
            (_, v) => Ok(v),
        }
    }

    /// `shard_state(v)`: the rank's pieces of `v` over `axis` (`v` itself when the axis has
    /// one rank or the run is not sharded), in host memory with `host`.
    pub(crate) fn shard_state(&self, v: Value, axis: Option<AxisId>, host: bool, span: Span) -> R<Value> {
        let group = axis.and_then(|a| self.zero_group(a).map(|g| (a, g)));
        let (value, cut) = match group {
            Some((a, (i, k))) => {
                let mut cut = Vec::new();
                plan(self.prog, &v, None, a, &mut cut);
                self.cut(&v, &cut, i, k, span)?
            }
            None if host => {
                let mut leaves = Vec::new();
                v.leaves(&mut leaves);
                let whole = vec![None; leaves.len()];
                (v, whole)
            }
            None => return Ok(v),
        };
        let value = if host { value.map_tensors(&mut |t| Ok(t.to_host()))? } else { value };
        Ok(Value::Sharded(Rc::new(Sharded { axis: group.map(|g| g.0), host, value, cut })))
    }

    /// `v` with every leaf that `cut` marks replaced by piece `i` of `k`.
    fn cut(&self, v: &Value, cut: &[bool], i: usize, k: usize, span: Span) -> R<(Value, Vec<Option<Vec<usize>>>)> {
        let mut leaves = Vec::new();
        v.leaves(&mut leaves);
        if leaves.len() != cut.len() {
            return Err(rt(Code::E0605, "internal: the optimizer state does not match its model", span));
        }
        let (mut parts, mut shapes, mut was) = (Vec::new(), Vec::new(), Vec::new());
        for (t, &c) in leaves.iter().zip(cut) {
            if !c {
                parts.push(flat(t, span)?);
                shapes.push(t.shape().to_vec());
                was.push(None);
                continue;
            }
            let p = piece(t, i, k, span)?;
            shapes.push(vec![p.len()]);
            parts.push(p);
            was.push(Some(t.shape().to_vec()));
        }
        Ok((rebuild(v, parts, shapes, span)?, was))
    }

    /// The whole value of `v`, whose leaves `cut` marks as pieces of their shapes: one
    /// all-gather over `axis` of all the pieces (per element type).
    fn gather(&mut self, v: &Value, cut: &[Option<Vec<usize>>], axis: AxisId, span: Span) -> R<Value> {
        let Some((_, k)) = self.zero_group(axis) else { return Ok(v.clone()) };
        let mut leaves = Vec::new();
        v.leaves(&mut leaves);
        if leaves.len() != cut.len() {
            return Err(rt(Code::E0605, "internal: the optimizer state lost a piece", span));
        }
        // One all-gather per element type, of that type's pieces one after another.
        let mut gathered: Vec<(kernels::DType, Tensor, usize)> = Vec::new();
        let mut offset = vec![0usize; leaves.len()];
        for dt in [kernels::DType::F32, kernels::DType::F64, kernels::DType::I32, kernels::DType::Bool] {
            let mine: Vec<usize> = (0..leaves.len()).filter(|&j| cut[j].is_some() && leaves[j].dtype() == dt).collect();
            if mine.is_empty() {
                continue;
            }
            let mut at = 0;
            for &j in &mine {
                offset[j] = at;
                at += leaves[j].len();
            }
            let refs: Vec<&Tensor> = mine.iter().map(|&j| leaves[j]).collect();
            let Some(cat) = Tensor::concat_flat(&refs) else { continue };
            let all = self.counted("optimizer all_gather", span, |s| s.all_gather(&[axis], 0, &cat))?;
            gathered.push((dt, all, at));
        }
        let mut parts = Vec::with_capacity(leaves.len());
        let mut shapes = Vec::with_capacity(leaves.len());
        for (j, t) in leaves.iter().enumerate() {
            let Some(shape) = &cut[j] else {
                parts.push(flat(t, span)?);
                shapes.push(t.shape().to_vec());
                continue;
            };
            let (_, all, width) = gathered
                .iter()
                .find(|(dt, ..)| *dt == t.dtype())
                .ok_or_else(|| rt(Code::E0605, "internal: a piece was not gathered", span))?;
            let n: usize = shape.iter().product();
            let c = t.len();
            let mut runs = Vec::with_capacity(k);
            for r in 0..k {
                let len = c.min(n.saturating_sub(r * c));
                runs.push(run(all, r * width + offset[j], len, span)?);
            }
            let refs: Vec<&Tensor> = runs.iter().collect();
            parts.push(match Tensor::concat_flat(&refs) {
                Some(x) => x,
                None => kernels::ops::zeros(t.dtype(), &[0]).map_err(|e| rt(Code::E0605, e.to_string(), span))?,
            });
            shapes.push(shape.clone());
        }
        rebuild(v, parts, shapes, span)
    }

    /// Collective `f` of an optimizer step, counted under `name` (`msl run --comm-report`) and
    /// on the timeline.
    fn counted(
        &mut self,
        name: &'static str,
        span: Span,
        f: impl FnOnce(&crate::dist::Spmd) -> Result<Tensor, String>,
    ) -> R<Tensor> {
        let s = self.spmd.clone().ok_or_else(|| rt(Code::E0605, "a collective outside a sharded run", span))?;
        let before = s.comm.bytes_sent();
        let t0 = self.trace_start();
        let out = f(&s).map_err(|m| rt(Code::E0602, m, span))?;
        let sent = s.comm.bytes_sent().saturating_sub(before);
        s.count(0, span, name, sent);
        if let (Some(t0), Some(tr)) = (t0, self.trace.as_mut()) {
            if let Some(ev) = tr.end(t0, name.into(), super::trace::Kind::Collective, Some(span)) {
                ev.bytes = Some(sent);
            }
        }
        Ok(out)
    }

    /// The sums call `e` leaves partial: those of the gradient it hands to a sharded step
    /// (`shard::zero`) whose state is held in pieces now.
    pub(crate) fn defer_for(&mut self, e: &crate::ir::Expr, frame: &Frame) -> Option<Defer> {
        self.spmd.as_ref()?;
        let prog = self.prog;
        let plan = self.zero_plan.get_or_insert_with(|| Rc::new(crate::shard::zero::ZeroPlan::of(prog)));
        let feed = *plan.feeds.get(&e.id)?;
        match frame.locals.get(feed.state.0 as usize) {
            Some(Some(Value::Sharded(s))) if s.axis == Some(feed.axis) => {}
            _ => return None,
        }
        self.zero_group(feed.axis)?;
        Some(Defer { axis: feed.axis, item: feed.item })
    }

    /// Whether function `f` returns item `d.item` as a partial sum over `d.axis`
    /// (`shard::zero::ZeroPlan::results`).
    pub(crate) fn returns_partial(&self, f: crate::types::FuncId, d: Defer) -> bool {
        self.zero_plan.as_ref().is_some_and(|p| p.results.get(&(f, d.item)) == Some(&d.axis))
    }

    /// Whether the all-reduce `e` is left out by the function call running now (its partial
    /// result's sums, `shard::zero`): each rank keeps its own part.
    pub(crate) fn left_out(&self, e: &crate::ir::Expr) -> bool {
        match (self.defers.last(), &self.zero_plan) {
            (Some(Some(d)), Some(plan)) => plan.sums.get(&e.id) == Some(&(d.axis, d.item)),
            _ => false,
        }
    }

    /// A call's result `v` with item `d.item` (the whole result for `None`) marked as partial
    /// sums over `d.axis`: every tensor in it.
    pub(crate) fn partial_result(&self, v: Value, d: Defer) -> Value {
        fn mark(v: &Value, axis: AxisId) -> Value {
            match v {
                Value::Tensor(t) => Value::Partial(Rc::new(PartialSum { axis, t: t.clone() })),
                Value::Model(m) => Value::Model(Rc::new(super::value::ModelValue {
                    model: m.model,
                    dims: m.dims.clone(),
                    fields: m.fields.iter().map(|f| mark(f, axis)).collect(),
                })),
                Value::Tuple(xs) => Value::Tuple(Rc::new(xs.iter().map(|x| mark(x, axis)).collect())),
                other => other.clone(),
            }
        }
        match (d.item, v) {
            (None, v) => mark(&v, d.axis),
            (Some(k), Value::Tuple(xs)) => Value::Tuple(Rc::new(
                xs.iter().enumerate().map(|(i, x)| if i == k { mark(x, d.axis) } else { x.clone() }).collect(),
            )),
            (Some(_), v) => v,
        }
    }

    /// The sum over `axis` of the partial sums `t` of its ranks.
    fn summed(&mut self, axis: AxisId, t: &Tensor, span: Span) -> R<Tensor> {
        self.counted("gradient all_reduce", span, |s| s.all_reduce(&[axis], crate::dist::ReduceKind::Sum, t))
    }

    /// `args` with every partial sum in them summed (a sharded run only has them).
    pub(crate) fn whole_partials(&mut self, args: Vec<Value>, span: Span) -> R<Vec<Value>> {
        if (self.spmd.is_none() && !self.host_states) || !args.iter().any(holds_pieces) {
            return Ok(args);
        }
        args.into_iter().map(|a| self.whole_value(a, span)).collect()
    }

    /// The whole value a sharded state stands for (its reader is not an optimizer step).
    pub(crate) fn whole_state(&mut self, s: &Sharded, span: Span) -> R<Value> {
        match s.axis {
            Some(axis) => self.gather(&s.value, &s.cut, axis, span),
            None => Ok(s.value.clone()),
        }
    }

    /// `v` with every state in it made whole (a tuple or model may hold one).
    pub(crate) fn whole_value(&mut self, v: Value, span: Span) -> R<Value> {
        Ok(match v {
            Value::Sharded(s) => self.whole_state(&s, span)?,
            Value::Partial(p) => Value::Tensor(self.summed(p.axis, &p.t, span)?),
            Value::Tuple(xs) if xs.iter().any(holds_pieces) => {
                let mut out = Vec::with_capacity(xs.len());
                for x in xs.iter() {
                    out.push(self.whole_value(x.clone(), span)?);
                }
                Value::Tuple(Rc::new(out))
            }
            Value::Model(m) if m.fields.iter().any(holds_pieces) => {
                let mut fields = Vec::with_capacity(m.fields.len());
                for x in m.fields.iter() {
                    fields.push(self.whole_value(x.clone(), span)?);
                }
                Value::Model(Rc::new(super::value::ModelValue { model: m.model, dims: m.dims.clone(), fields }))
            }
            v => v,
        })
    }

    /// Field `i` of a sharded state: read directly when it holds no piece.
    pub(crate) fn sharded_field(&mut self, s: &Sharded, i: usize, span: Span) -> R<Value> {
        let Value::Model(m) = &s.value else { return Err(rt(Code::E0605, "not a model", span)) };
        let mut before = 0;
        for f in &m.fields[..i.min(m.fields.len())] {
            before += count(f);
        }
        let f = m.fields.get(i).ok_or_else(|| rt(Code::E0605, "no such field", span))?;
        if s.cut[before..before + count(f)].iter().all(Option::is_none) {
            return Ok(f.clone());
        }
        match self.whole_state(s, span)? {
            Value::Model(w) => w.fields.get(i).cloned().ok_or_else(|| rt(Code::E0605, "no such field", span)),
            _ => Err(rt(Code::E0605, "not a model", span)),
        }
    }

    /// A call of `@optimizer_step` function `f` with a sharded state: the step on the rank's
    /// pieces of `(m, g, state)`, then the model gathered whole and the state kept in pieces.
    /// With a state in host memory, the step runs on the host and the new model goes to the
    /// device once.
    pub(crate) fn sharded_step(
        &mut self,
        f: crate::types::FuncId,
        args: Vec<Value>,
        dims: std::collections::HashMap<crate::types::Sym, i64>,
        span: Span,
    ) -> R<Value> {
        let [m, g, Value::Sharded(st)] = <[Value; 3]>::try_from(args)
            .map_err(|_| rt(Code::E0605, "an `@optimizer_step` function takes (model, gradient, state)", span))?
        else {
            return Err(rt(Code::E0605, "an `@optimizer_step` function takes (model, gradient, state)", span));
        };
        let group = st.axis.and_then(|a| self.zero_group(a).map(|g| (a, g)));
        let (out, cut_m) = match group {
            None => (self.on_host(st.host, |it| it.call_body(f, vec![m, g, st.value.clone()], dims, vec![]))?, None),
            Some((axis, (i, k))) => {
                let mut plan_m = Vec::new();
                plan(self.prog, &m, None, axis, &mut plan_m);
                let (mp, cut_m) = self.cut(&m, &plan_m, i, k, span)?;
                let gp = self.gradient_pieces(&g, &plan_m, axis, i, k, span)?;
                let out = self.on_host(st.host, |it| it.call_body(f, vec![mp, gp, st.value.clone()], dims, vec![]))?;
                (out, Some((axis, cut_m)))
            }
        };
        let Value::Tuple(items) = &out else {
            return Err(rt(Code::E0605, "an `@optimizer_step` function returns (model, state)", span));
        };
        let [m2, s2] = items.as_slice() else {
            return Err(rt(Code::E0605, "an `@optimizer_step` function returns (model, state)", span));
        };
        let mut whole = match &cut_m {
            Some((axis, cut_m)) => self.gather(m2, cut_m, *axis, span)?,
            None => m2.clone(),
        };
        if st.host {
            whole = self.placed(whole, span)?;
        }
        let kept =
            Value::Sharded(Rc::new(Sharded { axis: st.axis, host: st.host, value: s2.clone(), cut: st.cut.clone() }));
        Ok(Value::Tuple(Rc::new(vec![whole, kept])))
    }

    /// `v` with its tensors where the device's kernels read them ([`kernels::Device::place`]):
    /// a flat model as one buffer, whose fields stay views of it.
    fn placed(&self, v: Value, span: Span) -> R<Value> {
        let dev = self.device.clone();
        let place = |t: &Tensor| dev.place(t).map_err(|e| super::kerr(e, span));
        if let Value::Model(m) = &v {
            if let Some(flat) = m.flat() {
                let lost = || rt(Code::E0605, "internal: the model lost its layout", span);
                return Ok(Value::Model(Rc::new(m.with_flat(&place(&flat)?).ok_or_else(lost)?)));
            }
        }
        v.map_tensors(&mut |t| place(t))
    }

    /// `run` with every kernel on the host when `host` (the interpreter's device and its
    /// accelerator's set to the CPU device, and set back afterwards, however `run` ends).
    fn on_host<T>(&mut self, host: bool, run: impl FnOnce(&mut Self) -> R<T>) -> R<T> {
        if !host {
            return run(self);
        }
        // The CPU device, or the CPU side of one that counts its launches (`Offload`).
        let cpu = self.device.clone().host_side();
        let device = std::mem::replace(&mut self.device, cpu.clone());
        if let Some(a) = self.accel.as_mut() {
            a.set_device(cpu);
        }
        let r = run(self);
        if let Some(a) = self.accel.as_mut() {
            a.set_device(device.clone());
        }
        self.device = device;
        r
    }

    /// The rank's pieces of gradient `g`, cut as `plan` says: its partial sums over `axis`
    /// summed and cut by one reduce-scatter per element type, its whole tensors cut.
    fn gradient_pieces(&mut self, g: &Value, plan: &[bool], axis: AxisId, i: usize, k: usize, span: Span) -> R<Value> {
        let mut partial = Vec::new();
        partial_leaves(g, &mut partial);
        if !partial.iter().any(|p| p.is_some()) {
            return Ok(self.cut(g, plan, i, k, span)?.0);
        }
        let mut leaves = Vec::new();
        g.leaves(&mut leaves);
        if leaves.len() != plan.len() || partial.len() != plan.len() {
            return Err(rt(Code::E0605, "internal: the gradient does not match its model", span));
        }
        let mut parts: Vec<Option<Tensor>> = vec![None; leaves.len()];
        // Partial sums that are cut: per element type, the k pieces of every one, piece r of
        // all of them before piece r + 1, so that the reduce-scatter hands rank r its pieces.
        for dt in [kernels::DType::F32, kernels::DType::F64, kernels::DType::I32] {
            let mine: Vec<usize> =
                (0..leaves.len()).filter(|&j| plan[j] && partial[j] == Some(axis) && leaves[j].dtype() == dt).collect();
            if mine.is_empty() {
                continue;
            }
            let mut blocks = Vec::with_capacity(k * mine.len());
            for r in 0..k {
                for &j in &mine {
                    blocks.push(piece(leaves[j], r, k, span)?);
                }
            }
            let refs: Vec<&Tensor> = blocks.iter().collect();
            let Some(cat) = Tensor::concat_flat(&refs) else { continue };
            let mine_sum = self.counted("optimizer reduce_scatter", span, |s| s.reduce_scatter(&[axis], 0, &cat))?;
            let mut at = 0;
            for (&j, b) in mine.iter().zip(&blocks) {
                parts[j] = Some(run(&mine_sum, at, b.len(), span)?);
                at += b.len();
            }
        }
        let mut shapes = Vec::with_capacity(leaves.len());
        let mut out = Vec::with_capacity(leaves.len());
        for (j, t) in leaves.iter().enumerate() {
            let p = match parts[j].take() {
                Some(p) => p,
                None => {
                    // Summed whole (a partial sum kept whole, or over another axis), then cut.
                    let t = match partial[j] {
                        Some(ax) => self.summed(ax, t, span)?,
                        None => (*t).clone(),
                    };
                    if plan[j] {
                        piece(&t, i, k, span)?
                    } else {
                        flat(&t, span)?
                    }
                }
            };
            shapes.push(if plan[j] { vec![p.len()] } else { t.shape().to_vec() });
            out.push(p);
        }
        rebuild(g, out, shapes, span)
    }
}

/// For each tensor leaf of `v` (in `Value::leaves` order), the axis it is a partial sum over.
fn partial_leaves(v: &Value, out: &mut Vec<Option<AxisId>>) {
    match v {
        Value::Tensor(_) => out.push(None),
        Value::Partial(p) => out.push(Some(p.axis)),
        Value::Model(m) => m.fields.iter().for_each(|f| partial_leaves(f, out)),
        Value::Tuple(xs) => xs.iter().for_each(|x| partial_leaves(x, out)),
        _ => {}
    }
}

/// The number of tensor leaves of `v`.
fn count(v: &Value) -> usize {
    let mut l = Vec::new();
    v.leaves(&mut l);
    l.len()
}

/// Whether a local the pattern assigns holds a state in pieces now.
fn holds_sharded(pat: &Pat, frame: &Frame) -> bool {
    match pat {
        Pat::Local(l) => matches!(frame.locals[l.0 as usize], Some(Value::Sharded(_))),
        Pat::Tuple(ps) => ps.iter().any(|p| holds_sharded(p, frame)),
        Pat::Ignore => false,
    }
}

/// Whether `v` holds a state in pieces or a partial sum, at any depth.
pub(crate) fn holds_pieces(v: &Value) -> bool {
    match v {
        Value::Sharded(_) | Value::Partial(_) => true,
        Value::Tuple(xs) => xs.iter().any(holds_pieces),
        Value::Model(m) => m.fields.iter().any(holds_pieces),
        _ => false,
    }
}

/// Whether `f` is an `@optimizer_step` function called with a sharded state.
pub(crate) fn is_sharded_step(prog: &Program, f: crate::types::FuncId, args: &[Value]) -> bool {
    args.iter().any(|a| matches!(a, Value::Sharded(_))) && crate::shard::zero::is_optimizer_step(prog, f)
}
