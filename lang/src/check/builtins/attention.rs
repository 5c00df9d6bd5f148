//! Shape rules of the fused attention primitives (`spec/inference.md`):
//! `fused_attention(q, k, v, len: n, causal: c)` and `attention_weights(q, k, len: n, causal: c)`.

use super::*;

impl Checker {
    /// `q[..B, Q, D]`, `k[..B, S, D]` (and `v[..B, S, E]`): the result `[..B, Q, E]` (the
    /// weights `[..B, Q, S]`). `len` defaults to `S`, `causal` to `false`; both are run-time values.
    pub(super) fn check_attention(&mut self, cx: &mut FnCx, p: Prim, a: &Args, span: Span) -> ir::Expr {
        let name = p.name();
        let n = if p == Prim::Attention { 3 } else { 2 };
        self.check_named(name, a, &["len", "causal"]);
        if !self.arity(name, a, n, n, span) {
            return self.error_expr(span);
        }
        let mut ops = Vec::new();
        let mut dims = Vec::new();
        for (e, s) in &a.pos {
            let v = self.check_expr(cx, e, None);
            let v = self.materialise(v);
            let Some((el, sh)) = self.tensor_of(&v, *s, name) else { return self.error_expr(span) };
            let sh = sh.clone();
            let Some(d) = self.fixed_dims(&sh, *s, name) else { return self.error_expr(span) };
            if !el.is_float() {
                let ts = self.ty_str(&v.ty);
                self.error(Diagnostic::error(Code::E0303, *s, format!("`{name}` needs float tensors, found {ts}")));
                return self.error_expr(span);
            }
            if d.len() < 2 {
                let ts = self.ty_str(&v.ty);
                self.error(Diagnostic::error(
                    Code::E0305,
                    *s,
                    format!("`{name}` needs tensors of rank 2 or more ([..B, positions, features]), found {ts}"),
                ));
                return self.error_expr(span);
            }
            dims.push((el, d));
            ops.push(v);
        }
        let (qe, qd) = dims[0].clone();
        let r = qd.len();
        for (i, (el, d)) in dims.iter().enumerate().skip(1) {
            let (qt, ot) = (self.ty_str(&ops[0].ty), self.ty_str(&ops[i].ty));
            if *el != qe {
                self.error(
                    Diagnostic::error(Code::E0303, a.pos[i].1, format!("`{name}` mixes {qt} and {ot}"))
                        .with_secondary(a.pos[0].1, format!("this is {qt}")),
                );
                return self.error_expr(span);
            }
            // Keys share the queries' leading dims and features; values share the keys' positions.
            let fits = d.len() == r
                && d[..r - 2] == qd[..r - 2]
                && if i == 1 { d[r - 1] == qd[r - 1] } else { d[r - 2] == dims[1].1[r - 2] };
            if !fits {
                let what = if i == 1 {
                    "keys must be [..B, S, D] for queries [..B, Q, D]"
                } else {
                    "values must be [..B, S, E] for keys [..B, S, D]"
                };
                self.error(
                    Diagnostic::error(Code::E0306, a.pos[i].1, format!("`{name}`: {what}, found {ot}"))
                        .with_secondary(a.pos[0].1, format!("the queries are {qt}")),
                );
                return self.error_expr(span);
            }
        }
        let s = dims[1].1[r - 2].clone();
        // Defaults: every key visible (`len` = S), not causal.
        let len = match self.named_scalar(cx, a, "len", ElemTy::I32) {
            Some(v) => v,
            None => {
                let sid = self.span_id(span);
                let d = mk(ExprKind::DimValue(s.clone()), Type::Tensor(TensorTy::new(Elem::WeakInt, vec![])), sid);
                self.coerce_with(d, &Type::scalar(ElemTy::I32), span, Code::E0303, "`len`")
            }
        };
        let causal = match self.named_scalar(cx, a, "causal", ElemTy::Bool) {
            Some(v) => v,
            None => {
                let sid = self.span_id(span);
                mk(ExprKind::Lit(ir::Lit::Bool(false)), Type::scalar(ElemTy::Bool), sid)
            }
        };
        let mut out = qd;
        out[r - 1] = if p == Prim::Attention { dims[2].1[r - 1].clone() } else { s };
        ops.push(len);
        ops.push(causal);
        self.prim(
            p,
            ops,
            Attrs::default(),
            Type::Tensor(TensorTy::new(qe, out.into_iter().map(ShapeItem::Dim).collect())),
            span,
        )
    }
}
