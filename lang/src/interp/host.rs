//! The run-time library of compiled function bodies: the operations native host code calls.
//!
//! A compiler (the `jit` crate) may take over whole function bodies
//! ([`Accel::body`](super::Accel::body)): its native code runs the body's control flow (blocks,
//! `if`, `for`, `while`, `batches`, `return`) itself and calls this library for each operation
//! on values — one call per primitive or fused tree of primitives, call, tuple or model
//! operation. Values live where the interpreter keeps them: locals in the [`Frame`], the
//! results of operations in slots the compiled code numbers. An operation is applied to
//! operands the compiled code evaluated before ([`Interp::apply_node`]): those are *preset*,
//! and the interpreter takes their values instead of evaluating them, so each operation has one
//! definition, the interpreter's, and the two engines cannot disagree.

use super::{bind_pat, rt, truthy, value, Frame, Interp, Value, R};
use crate::diag::Code;
use crate::ir::{Expr, ExprKind, Pat, Prim, SpanId, Stmt};

/// A function body compiled to native code.
pub trait CompiledBody {
    /// Runs the body in `frame` (parameters bound): its value, or the `return`ed one.
    fn run(&self, it: &mut Interp, frame: &mut Frame) -> R<Value>;
}

/// The subexpressions the interpreter evaluates, in order, before it applies `e` itself: the
/// operands compiled code may evaluate first and preset. Other subexpressions of `e` (none for
/// most kinds) are evaluated by the interpreter when it applies `e`.
pub fn operands(e: &Expr) -> Vec<&Expr> {
    match &e.kind {
        ExprKind::Prim { prim: Prim::MatMul, args, .. } => args.iter().map(|a| a.swapped_last().unwrap_or(a)).collect(),
        ExprKind::Prim { args, .. } | ExprKind::Call { args, .. } => args.iter().collect(),
        ExprKind::CallValue { callee, args, .. } => std::iter::once(&**callee).chain(args).collect(),
        ExprKind::Transform { callee, .. } => vec![callee],
        ExprKind::Vjp { callee, primals, .. } => std::iter::once(&**callee).chain(primals).collect(),
        ExprKind::Jvp { callee, primals, tangents, .. } => {
            std::iter::once(&**callee).chain(primals).chain(tangents).collect()
        }
        ExprKind::Tuple(items) | ExprKind::ModelBuild { fields: items } => items.iter().collect(),
        ExprKind::TupleGet(a, _) | ExprKind::Field(a, _) => vec![a],
        ExprKind::ModelInit { seed, .. } => vec![seed],
        _ => vec![],
    }
}

/// The state of a `batches` loop run by compiled code.
pub struct Batches {
    arrays: Vec<kernels::Tensor>,
    order: Vec<usize>,
    size: usize,
    /// How many batches the loop runs.
    pub count: usize,
}

impl Interp<'_> {
    /// Applies `e` to the values of some of its operands ([`operands`]), evaluated before by
    /// compiled code; the interpreter evaluates the others.
    pub fn apply_node(&mut self, e: &Expr, preset: Vec<(crate::ir::ExprId, Value)>, frame: &mut Frame) -> R<Value> {
        self.with_preset(preset, e, |it| it.eval(e, frame))
    }

    /// Runs `f` with these operands' values preset; every one must be used (by the
    /// application of `e`).
    pub fn with_preset<T>(
        &mut self,
        preset: Vec<(crate::ir::ExprId, Value)>,
        e: &Expr,
        f: impl FnOnce(&mut Self) -> R<T>,
    ) -> R<T> {
        let outer = std::mem::replace(&mut self.preset, preset);
        let r = f(self);
        let left = std::mem::replace(&mut self.preset, outer);
        if r.is_ok() && !left.is_empty() {
            return Err(rt(Code::E0605, "internal error: an operand of compiled code was not used", self.span(e)));
        }
        r
    }

    /// The value of `e` when compiled code preset it (taken: each preset value is used once).
    pub(crate) fn take_preset(&mut self, e: &Expr) -> Option<Value> {
        let i = self.preset.iter().position(|(a, _)| *a == e.id)?;
        Some(self.preset.swap_remove(i).1)
    }

    /// Binds `v` to the pattern of a `let`, or of an assignment (`assign`: then a variable that
    /// holds an optimizer state in pieces keeps it in pieces, as [`Interp::keep_pieces`] says).
    pub fn bind(&mut self, pat: &Pat, v: Value, frame: &mut Frame, assign: Option<SpanId>) -> R<()> {
        let v = match assign {
            Some(span) => self.keep_pieces(pat, v, frame, self.prog.span(span))?,
            None => v,
        };
        bind_pat(pat, v, frame);
        Ok(())
    }

    /// Runs one statement as the interpreter does.
    pub fn exec_stmt(&mut self, s: &Stmt, frame: &mut Frame) -> R<()> {
        self.stmt(s, frame)
    }

    /// The truth of a condition's value.
    pub fn truthy(&self, v: &Value) -> bool {
        truthy(v)
    }

    /// A loop bound's value as an integer.
    pub fn int_of(&self, v: &Value) -> i64 {
        v.tensor().and_then(value::scalar_i64).unwrap_or(0)
    }

    /// An error for an interrupted run at `e`.
    pub fn interrupted(&self, e: &Expr) -> super::Ctrl {
        rt(Code::E0605, "interrupted", self.span(e))
    }

    /// Starts the `batches` loop `e`: evaluates its arrays, batch size and seed (preset ones
    /// taken), and tells the observer.
    pub fn batches_begin(&mut self, e: &Expr, frame: &mut Frame) -> R<Batches> {
        let span = self.span(e);
        let ExprKind::ForBatches { data, size, shuffle, drop_last, .. } = &e.kind else {
            return Err(rt(Code::E0605, "internal error: not a `batches` loop", span));
        };
        let mut arrays = Vec::new();
        for d in data {
            match self.eval(d, frame)? {
                Value::Tensor(t) => arrays.push(t),
                _ => return Err(rt(Code::E0605, "`batches` needs tensors", span)),
            }
        }
        let b = self.eval(size, frame)?.tensor().and_then(value::scalar_i64).unwrap_or(0);
        if b <= 0 {
            return Err(rt(Code::E0602, format!("batch size must be positive, got {b}"), span));
        }
        let b = b as usize;
        let n = arrays.first().map(|t| t.shape().first().copied().unwrap_or(0)).unwrap_or(0);
        for a in &arrays {
            if a.shape().first().copied() != Some(n) {
                return Err(rt(Code::E0602, "`batches` arrays have different numbers of rows", span));
            }
        }
        let order: Vec<usize> = match shuffle {
            Some(s) => {
                let seed = self.eval(s, frame)?.tensor().and_then(value::scalar_i64).unwrap_or(0);
                kernels::rng::permutation(n, kernels::rng::stream_key(seed as u64, "batches"))
            }
            None => (0..n).collect(),
        };
        // The ragged tail is dropped, so every batch has exactly `b` rows (as its type says),
        // unless `drop_last: false` keeps it as a last, smaller batch.
        let count = if *drop_last { n / b } else { n.div_ceil(b) };
        let batches = Batches { arrays, order, size: b, count };
        self.observer.batches_start(batches.count);
        Ok(batches)
    }

    /// Binds the loop variables of the `batches` loop `e` to batch `i`.
    pub fn batch_bind(&mut self, e: &Expr, b: &Batches, i: usize, frame: &mut Frame) -> R<()> {
        let span = self.span(e);
        let ExprKind::ForBatches { vars, rows: dim, .. } = &e.kind else {
            return Err(rt(Code::E0605, "internal error: not a `batches` loop", span));
        };
        let end = ((i + 1) * b.size).min(b.order.len());
        let rows = b.order.get(i * b.size..end).unwrap_or(&[]);
        if let Some(s) = dim {
            frame.dims.insert(*s, rows.len() as i64);
        }
        let idx: Vec<i32> = rows.iter().map(|&x| x as i32).collect();
        let idx = kernels::Tensor::from_i32(vec![rows.len()], idx).map_err(|k| super::kerr(k, span))?;
        for (l, a) in vars.iter().zip(&b.arrays) {
            let t = kernels::ops::gather(a, &idx, 0).map_err(|k| super::kerr(k, span))?;
            frame.locals[l.0 as usize] = Some(Value::Tensor(t));
        }
        Ok(())
    }

    /// One batch has run.
    pub fn batch_done(&mut self) {
        self.observer.batch_done();
    }

    /// The `batches` loop has ended.
    pub fn batches_end(&mut self) {
        self.observer.batches_end();
    }
}
