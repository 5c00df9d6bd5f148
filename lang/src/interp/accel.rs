//! The accelerator hook: how a compiler (the `jit` crate) takes over trees of primitives from
//! the interpreter without `lang` knowing anything about it.
//!
//! When the interpreter meets a primitive application and an accelerator is installed, it asks
//! the accelerator to [`plan`](Accel::plan) the tree rooted there. A plan names the
//! subexpressions the accelerator needs as inputs (its leaves), in the order the interpreter
//! would evaluate them; the interpreter evaluates those itself (so nested trees are planned in
//! turn, and effects happen in source order) and hands the values to
//! [`try_eval`](Accel::try_eval). When the accelerator declines at that point (an element type
//! or shape it does not handle), the interpreter evaluates the tree op by op from the same input
//! values, so a fallback never evaluates anything twice. The interpreter stays the reference
//! semantics: an accelerator must return exactly what the op-by-op evaluation would.
//!
//! Loops are offered the same way as whole regions of host code
//! ([`plan_region`](Accel::plan_region)): the accelerator names the pure leaves it reads
//! (locals defined before the loop, dims, constants) and the locals it writes; the interpreter
//! evaluates the leaves, runs the compiled region, and stores the written locals back. A region
//! that declines (an integer division by zero, say) has changed nothing, and the interpreter
//! runs the loop itself from the start, reporting the error as usual.

use super::{kerr, lit_value, Frame, Interp, ModelValue, Value, R};
use crate::ir::{Expr, ExprKind, Lit, Local};
use crate::types::Type;
use kernels::{KernelError, Tensor};
use std::sync::atomic::AtomicBool;

/// What a compiled region of host code reads and writes.
pub struct Region<'e> {
    /// Locals defined before the region that it reads or assigns (its first inputs).
    pub locals: Vec<Local>,
    /// Pure subexpressions (dims, constants) whose values it takes in after the locals.
    pub leaves: Vec<&'e Expr>,
    /// Locals the region assigns, in the order of the values it returns.
    pub outputs: Vec<Local>,
}

/// How a compiled region ended.
pub enum RegionRun {
    /// The values of the region's outputs.
    Done(Vec<Tensor>),
    /// Nothing was changed; the interpreter runs the region itself.
    Decline,
    /// The interrupt flag was raised while the region ran.
    Interrupted,
}

/// One operand of model arithmetic evaluated part by part ([`Accel::try_eval_parts`]).
#[derive(Debug)]
pub enum Operand {
    /// A scalar, the same at every part.
    Scalar(Tensor),
    /// A flat model's buffer: a rank-1 tensor whose parts follow one another.
    Flat(Tensor),
    /// A model's tensors, one per part, each contiguous.
    Parts(Vec<Tensor>),
}

/// A compiler that evaluates whole trees of primitives at once.
pub trait Accel {
    /// Called when the interpreter is about to evaluate the primitive application `e`. Returns
    /// the subexpressions of `e` whose values the accelerator needs (pre-order, left to right),
    /// or `None` to let the interpreter evaluate `e` as usual.
    fn plan<'e>(&mut self, e: &'e Expr) -> Option<Vec<&'e Expr>>;

    /// Evaluates the tree `plan` accepted, given the tensors of its inputs in the same order.
    /// `None` declines (the interpreter then evaluates the tree op by op from these inputs,
    /// which must be left as they were). When it evaluates, it may reuse the buffer of an input
    /// nothing else refers to for its result, leaving a placeholder in its slot.
    fn try_eval(&mut self, e: &Expr, inputs: &mut [Tensor]) -> Option<Result<Tensor, KernelError>>;

    /// Evaluates the tree `plan` accepted over models of one layout held in parts (see
    /// [`Operand`]): part `i` of every model operand has `lens[i]` elements, and the result is
    /// one rank-1 tensor of all the parts, part after part (the flat buffer of the result
    /// model). `None` declines, with `inputs` as they were; otherwise it may reuse the buffer of
    /// a [`Operand::Flat`] input nothing else refers to.
    fn try_eval_parts(
        &mut self,
        _e: &Expr,
        _inputs: &mut [Operand],
        _lens: &[usize],
    ) -> Option<Result<Tensor, KernelError>> {
        None
    }

    /// Called when the interpreter is about to run the loop `e`: the region's inputs and
    /// outputs when the accelerator compiles it whole, `None` to let the interpreter run it.
    fn plan_region<'e>(&mut self, _e: &'e Expr) -> Option<Region<'e>> {
        None
    }

    /// Runs the region `plan_region` accepted, given the values of its inputs (all scalars).
    /// It may poll `interrupt` and stop.
    fn run_region(&mut self, _e: &Expr, _inputs: &[Tensor], _interrupt: &AtomicBool) -> RegionRun {
        RegionRun::Decline
    }

    /// The interpreter's device changed (to the CPU device while an update of a state in host
    /// memory runs, and back): trees go to this device's accelerator from now on.
    fn set_device(&mut self, _device: std::sync::Arc<dyn kernels::Device>) {}

    /// Called when the interpreter is about to run the body of function `f`: native code for
    /// the body (see [`host`](super::host)), or `None` to let the interpreter run it.
    fn body(&mut self, _f: crate::types::FuncId) -> Option<std::rc::Rc<dyn super::host::CompiledBody>> {
        None
    }
}

/// The value of a literal of type `ty`, exactly as the interpreter makes it (accelerators that
/// fold literals into code use this so that constants round the same way).
pub fn literal(l: &Lit, ty: &Type) -> Option<Tensor> {
    match lit_value(l, ty) {
        Value::Tensor(t) => Some(t),
        _ => None,
    }
}

/// The tensor element type the interpreter uses for a language element type.
pub fn dtype(t: crate::types::ElemTy) -> kernels::DType {
    super::dtype_of(t)
}

impl Interp<'_> {
    /// Evaluates `e` through the accelerator when one is installed and plans it; `None` when the
    /// interpreter should evaluate `e` itself.
    pub(crate) fn eval_accel(&mut self, e: &Expr, frame: &mut Frame) -> Option<R<Value>> {
        let leaves = self.accel.as_mut()?.plan(e)?;
        Some(self.run_planned(e, &leaves, frame))
    }

    /// Runs the loop `e` as a compiled region when the accelerator takes it; `None` when the
    /// interpreter should run it itself.
    pub(crate) fn eval_region(&mut self, e: &Expr, frame: &mut Frame) -> Option<R<Value>> {
        let region = self.accel.as_mut()?.plan_region(e)?;
        let mut ins = Vec::with_capacity(region.locals.len() + region.leaves.len());
        for l in &region.locals {
            match frame.locals.get(l.0 as usize) {
                Some(Some(Value::Tensor(t))) if t.rank() == 0 => ins.push(t.clone()),
                _ => return None,
            }
        }
        for x in &region.leaves {
            match self.eval(x, frame) {
                Ok(Value::Tensor(t)) if t.rank() == 0 => ins.push(t),
                // Leaves are pure, and the loop might never reach the one that failed (a dim that
                // does not fit in i32, read in a loop that runs zero times): the interpreter runs
                // the loop itself and reports the error only where it happens.
                _ => return None,
            }
        }
        let interrupt = self.interrupt.clone();
        match self.accel.as_mut()?.run_region(e, &ins, &interrupt) {
            RegionRun::Done(outs) => {
                for (l, t) in region.outputs.iter().zip(outs) {
                    frame.locals[l.0 as usize] = Some(Value::Tensor(t));
                }
                Some(Ok(Value::unit()))
            }
            RegionRun::Decline => None,
            RegionRun::Interrupted => Some(Err(super::rt(crate::diag::Code::E0605, "interrupted", self.span(e)))),
        }
    }

    fn run_planned(&mut self, e: &Expr, leaves: &[&Expr], frame: &mut Frame) -> R<Value> {
        let mut vals = Vec::with_capacity(leaves.len());
        for l in leaves {
            vals.push(self.eval(l, frame)?);
        }
        self.drop_moved_repeats(e, leaves, frame);
        let t0 = self.trace_start();
        if let Some(r) = self.run_models(e, &mut vals) {
            self.trace_span(t0, "fused", super::trace::Kind::Fused, self.span(e));
            return r;
        }
        if vals.iter().all(|v| matches!(v, Value::Tensor(_))) {
            // Hand the values over (not copies), so that a temporary's buffer can be reused.
            let mut ts: Vec<Tensor> = vals
                .into_iter()
                .filter_map(|v| match v {
                    Value::Tensor(t) => Some(t),
                    _ => None,
                })
                .collect();
            let r = self.accel.as_mut().and_then(|a| a.try_eval(e, &mut ts));
            if let Some(r) = r {
                self.trace_span(t0, "fused", super::trace::Kind::Fused, self.span(e));
                return r.map(Value::Tensor).map_err(|k| kerr(k, self.span(e)));
            }
            vals = ts.into_iter().map(Value::Tensor).collect();
        }
        let mut next = 0;
        self.eval_with_leaves(e, leaves, &vals, &mut next, frame)
    }

    /// A local read more than once in a planned tree is one leaf, read at its first place, and
    /// the tree's other reads take that value; when one of those is the local's last use
    /// (`moves`), the frame's value goes now, as it would have there.
    fn drop_moved_repeats(&mut self, e: &Expr, leaves: &[&Expr], frame: &mut Frame) {
        if self.moves.is_empty() {
            return;
        }
        for l in leaves {
            let ExprKind::Local(x) = l.kind else { continue };
            if self.moves.contains(&l.id) || frame.locals[x.0 as usize].is_none() {
                continue;
            }
            let mut moved = false;
            crate::ir::walk::walk(e, &mut |r| {
                moved |= matches!(r.kind, ExprKind::Local(y) if y == x) && self.moves.contains(&r.id);
            });
            if moved {
                frame.locals[x.0 as usize] = None;
            }
        }
    }

    /// A planned tree of model arithmetic over models of one layout (and scalars): the
    /// accelerator evaluates it in one call, and the result is one buffer, a flat model. When
    /// every model is flat the call goes over their buffers like any tree of tensors; when some
    /// are not (a gradient keeps its large tensors apart, [`ModelValue::assembled`]) it goes over
    /// the models' tensors part by part ([`Accel::try_eval_parts`]). `None` when the operands
    /// are not such models, or the accelerator declines (`vals` as they were).
    ///
    /// Only the buffers and tensors go to the accelerator: the models themselves are dropped
    /// first. So a model that nothing else holds (`m` in `m = m - lr * g` at `-O2`, moved out
    /// at its last use) is the only holder of its buffer, which the result may then reuse.
    fn run_models(&mut self, e: &Expr, vals: &mut Vec<Value>) -> Option<R<Value>> {
        if !e.ty.is_model() || self.accel.is_none() {
            return None;
        }
        let mut ops: Vec<Operand> = Vec::with_capacity(vals.len());
        // The first model's layout alone (its tensors placeholders, which become views of the
        // result: a model holding the operands' tensors would keep them shared), the shapes of
        // its tensors and their element type.
        let mut first: Option<(ModelValue, Vec<Vec<usize>>, kernels::DType)> = None;
        for v in vals.iter() {
            match v {
                Value::Model(m) => {
                    let ts = m.tensors()?;
                    let dtype = ts[0].dtype();
                    dtype.is_float().then_some(())?;
                    match &first {
                        Some((_, shapes, d)) => {
                            let same =
                                shapes.len() == ts.len() && shapes.iter().zip(&ts).all(|(s, t)| s[..] == *t.shape());
                            (same && *d == dtype).then_some(())?;
                        }
                        None => {
                            let layout = m.with_tensors(ts.iter().map(|_| Tensor::scalar_bool(false)))?;
                            first = Some((layout, ts.iter().map(|t| t.shape().to_vec()).collect(), dtype));
                        }
                    }
                    ops.push(match m.flat() {
                        Some(flat) => Operand::Flat(flat),
                        None => Operand::Parts(ts),
                    });
                }
                Value::Tensor(t) if t.rank() == 0 => ops.push(Operand::Scalar(t.clone())),
                _ => return None,
            }
        }
        let (layout, shapes, _) = first?;
        let lens: Vec<usize> = shapes.iter().map(|s| s.iter().product()).collect();
        vals.clear();
        let span = self.span(e);
        let lost = || super::rt(crate::diag::Code::E0605, "internal: a model lost its layout", span);
        let accel = self.accel.as_mut()?;
        let r = if ops.iter().any(|o| matches!(o, Operand::Parts(_))) {
            accel.try_eval_parts(e, &mut ops, &lens)
        } else {
            // Flat models: one loop over their buffers, as for any tree of tensors (which an
            // accelerator device may take); declined, the tensors are left as they were.
            let mut ts: Vec<Tensor> = std::mem::take(&mut ops)
                .into_iter()
                .filter_map(|o| match o {
                    Operand::Scalar(t) | Operand::Flat(t) => Some(t),
                    Operand::Parts(_) => None,
                })
                .collect();
            let r = accel.try_eval(e, &mut ts);
            ops = ts.into_iter().map(|t| if t.rank() == 0 { Operand::Scalar(t) } else { Operand::Flat(t) }).collect();
            r
        };
        let Some(r) = r else {
            // Declined before any buffer was taken: the same models again.
            for op in ops {
                let m = match op {
                    Operand::Scalar(t) => {
                        vals.push(Value::Tensor(t));
                        continue;
                    }
                    Operand::Flat(t) => layout.with_flat_as(&shapes, &t),
                    Operand::Parts(ts) => layout.with_tensors(ts),
                };
                match m {
                    Some(m) => vals.push(Value::Model(std::rc::Rc::new(m))),
                    None => return Some(Err(lost())),
                }
            }
            return None;
        };
        Some(r.map_err(|k| kerr(k, span)).and_then(|t| {
            let m = layout.with_flat_as(&shapes, &t).ok_or_else(lost)?;
            Ok(Value::Model(std::rc::Rc::new(m)))
        }))
    }

    /// Op-by-op evaluation of a planned tree whose leaves already have values (walked in the
    /// same pre-order as the plan, so the next leaf is always `leaves[*next]`).
    fn eval_with_leaves(
        &mut self,
        e: &Expr,
        leaves: &[&Expr],
        vals: &[Value],
        next: &mut usize,
        frame: &mut Frame,
    ) -> R<Value> {
        if leaves.get(*next).is_some_and(|l| l.id == e.id) {
            *next += 1;
            return Ok(vals[*next - 1].clone());
        }
        match &e.kind {
            ExprKind::Prim { prim, args, attrs } => {
                let mut xs = Vec::with_capacity(args.len());
                for a in args {
                    xs.push(self.eval_with_leaves(a, leaves, vals, next, frame)?);
                }
                self.prim(*prim, xs, attrs, e, frame)
            }
            // A local read again in the tree is one input (the plan lists it once): its value
            // is that input's, not the frame's, which a later leaf may have moved out at its
            // last use (`-O2`).
            ExprKind::Local(l) => {
                let first = leaves[..*next].iter().position(|x| matches!(x.kind, ExprKind::Local(m) if m == *l));
                match first {
                    Some(i) => Ok(vals[i].clone()),
                    None => self.eval(e, frame),
                }
            }
            // Anything else the plan kept inside the tree is a pure expression (a literal).
            _ => self.eval(e, frame),
        }
    }
}
