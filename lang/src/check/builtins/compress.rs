//! Shape rules of model compression (`spec/inference.md`): `quantize(m, i8)` and
//! `prune(m, sparsity: s)` give a value of `m`'s own type, so it is usable wherever `m` was.

use super::*;

impl Checker {
    /// The operand of `quantize`/`prune`: a model, or a float tensor.
    fn compressible(&mut self, cx: &mut FnCx, name: &str, a: &Args) -> Option<ir::Expr> {
        let m = self.check_expr(cx, a.pos[0].0, None);
        let ok = m.ty.is_model() || matches!(&m.ty, Type::Tensor(TensorTy { elem, .. }) if elem.is_float());
        if !ok && !m.ty.has_error() {
            let ts = self.ty_str(&m.ty);
            self.error(Diagnostic::error(
                Code::E0304,
                a.pos[0].1,
                format!("`{name}` needs a model or a float tensor, found {ts}"),
            ));
            return None;
        }
        Some(self.materialise(m))
    }

    /// `quantize(m, i8)`: every `f32` matrix of `m` held as int8 with per-channel scales.
    pub(super) fn check_quantize(&mut self, cx: &mut FnCx, p: Prim, a: &Args, span: Span) -> ir::Expr {
        self.check_named("quantize", a, &[]);
        if !self.arity("quantize", a, 2, 2, span) {
            return self.error_expr(span);
        }
        let (to, to_span) = a.pos[1];
        if !matches!(&to.kind, ast::ExprKind::Name(n) if n == "i8") {
            self.error(
                Diagnostic::error(Code::E0303, to_span, "`quantize` converts to `i8`")
                    .label("not an element type it supports")
                    .with_help("write `quantize(m, i8)`"),
            );
            return self.error_expr(span);
        }
        let Some(m) = self.compressible(cx, "quantize", a) else { return self.error_expr(span) };
        let ty = m.ty.clone();
        self.prim(p, vec![m], Attrs::default(), ty, span)
    }

    /// `prune(m, sparsity: s)`: `m` with the fraction `s` of each matrix's weights, the smallest
    /// in magnitude, set to zero; `s` is an `f32` known at run time.
    pub(super) fn check_prune(&mut self, cx: &mut FnCx, p: Prim, a: &Args, span: Span) -> ir::Expr {
        self.check_named("prune", a, &["sparsity"]);
        if !self.arity("prune", a, 1, 1, span) {
            return self.error_expr(span);
        }
        let Some(m) = self.compressible(cx, "prune", a) else { return self.error_expr(span) };
        let Some(sv) = self.named_scalar(cx, a, "sparsity", ElemTy::F32) else {
            self.error(Diagnostic::error(Code::E0212, span, "`prune` needs `sparsity: s`, the fraction to zero"));
            return self.error_expr(span);
        };
        let ty = m.ty.clone();
        self.prim(p, vec![m, sv], Attrs::default(), ty, span)
    }
}
