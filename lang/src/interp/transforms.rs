//! Calls of transformed functions (`grad`, `value_and_grad`, `jvp`, `vjp`): the interpreter runs
//! the derivative programs that the autodiff pass generates.

use super::value::{FnValue, Value};
use super::{rt, Frame, Interp, R};
use crate::diag::Code;
use crate::ir::{Expr, FnTarget, Local};
use crate::source::Span;

impl Interp<'_> {
    pub(crate) fn grad_call(
        &mut self,
        _target: &FnTarget,
        _closure: Option<crate::types::ClosureId>,
        _captures: &[(Local, Value)],
        _args: Vec<Value>,
        span: Span,
    ) -> R<Value> {
        Err(rt(Code::E0605, "differentiation is not available in this build yet", span))
    }

    pub(crate) fn transform_expr(&mut self, e: &Expr, _frame: &mut Frame) -> R<Value> {
        Err(rt(Code::E0605, "differentiation is not available in this build yet", self.span(e)))
    }

    pub(crate) fn apply_pullback(&mut self, _f: &FnValue, _args: Vec<Value>, span: Span) -> R<Value> {
        Err(rt(Code::E0605, "differentiation is not available in this build yet", span))
    }
}
