//! Calls of transformed functions (`grad`, `value_and_grad`, `vjp` pullbacks): the interpreter
//! runs the derivative programs that the autodiff pass generated.

use super::value::{FnValue, Value};
use super::{rt, Frame, Interp, R};
use crate::diag::Code;
use crate::ir::{Expr, ExprKind, FnTarget, Local};
use crate::source::Span;
use std::collections::HashMap;
use std::rc::Rc;

impl Interp<'_> {
    pub(crate) fn grad_call(
        &mut self,
        target: &FnTarget,
        _closure: Option<crate::types::ClosureId>,
        captures: &[(Local, Value)],
        args: Vec<Value>,
        span: Span,
    ) -> R<Value> {
        if let FnTarget::Grad { inner, wrt, with_value } = target {
            if let Some(pi) = match &**inner {
                FnTarget::Func(f) => self.pipeline_of(*f),
                _ => None,
            } {
                if *wrt != 0 {
                    return Err(rt(
                        Code::E0605,
                        "a pipelined function is differentiated with respect to its model",
                        span,
                    ));
                }
                self.defer_next = None; // a pipeline's gradient comes whole
                let (v, g) = self.run_pipeline(pi, args, true, span)?;
                let g = g.unwrap_or(Value::unit());
                return Ok(if *with_value { Value::Tuple(Rc::new(vec![v, g])) } else { g });
            }
        }
        let Some(f) = crate::autodiff::target_func(self.prog, target) else {
            return Err(rt(
                Code::E0605,
                "this derivative was not generated (a function value known only at run time)",
                span,
            ));
        };
        self.call(f, args, HashMap::new(), captures.to_vec())
    }

    pub(crate) fn transform_expr(&mut self, e: &Expr, frame: &mut Frame) -> R<Value> {
        let span = self.span(e);
        match &e.kind {
            ExprKind::Vjp { target, callee, primals } => {
                let f = self.eval(callee, frame)?;
                let Value::Fn(fv) = f else { return Err(rt(Code::E0605, "not a function", span)) };
                let mut ps = Vec::new();
                for p in primals {
                    ps.push(self.eval(p, frame)?);
                }
                let value = self.apply(&fv, target, ps.clone(), span)?;
                let (captures, closure, dims) = match &*fv {
                    FnValue::Func { captures, closure, dims, .. } => (captures.clone(), *closure, dims.clone()),
                    FnValue::Pullback { .. } => (vec![], None, vec![]),
                };
                let pb_target = FnTarget::Grad { inner: Box::new(target.clone()), wrt: usize::MAX, with_value: false };
                let func = Rc::new(FnValue::Func { target: pb_target, captures, closure, dims });
                let pb = Value::Fn(Rc::new(FnValue::Pullback { func, primals: ps }));
                Ok(Value::Tuple(Rc::new(vec![value, pb])))
            }
            ExprKind::Jvp { target, callee, primals, tangents } => {
                let f = self.eval(callee, frame)?;
                let captures = match &f {
                    Value::Fn(fv) => match &**fv {
                        FnValue::Func { captures, .. } => captures.clone(),
                        FnValue::Pullback { .. } => vec![],
                    },
                    _ => vec![],
                };
                let mut args = Vec::new();
                for p in primals.iter().chain(tangents) {
                    args.push(self.eval(p, frame)?);
                }
                let jf = crate::autodiff::target_func(self.prog, target)
                    .and_then(|f| self.prog.derived.funcs.get(&(f, crate::autodiff::Mode::Jvp)).copied())
                    .ok_or_else(|| rt(Code::E0605, "this `jvp` was not generated", span))?;
                self.call(jf, args, HashMap::new(), captures)
            }
            _ => Err(rt(Code::E0605, "not a transform", span)),
        }
    }

    pub(crate) fn apply_pullback(&mut self, f: &FnValue, args: Vec<Value>, span: Span) -> R<Value> {
        let FnValue::Pullback { func, primals } = f else { return Err(rt(Code::E0605, "not a pullback", span)) };
        let FnValue::Func { target, captures, closure, .. } = &**func else {
            return Err(rt(Code::E0605, "not a pullback", span));
        };
        let mut all = primals.clone();
        all.extend(args);
        self.grad_call(target, *closure, captures, all, span)
    }
}
