//! Shape rules of the creation builtins: `zeros`, `ones`, `full`, `arange`, `eye` and the random ones.

use super::*;

impl Checker {
    pub(super) fn check_zeros(
        &mut self,
        cx: &mut FnCx,
        p: Prim,
        a: &Args,
        span: Span,
        expected: Option<&Type>,
    ) -> ir::Expr {
        let name = p.name();
        self.check_named(name, a, &[]);
        let (vals, dims_from) = if p == Prim::Full {
            if !self.arity(name, a, 1, usize::MAX, span) {
                return self.error_expr(span);
            }
            (1, 1)
        } else {
            (0, 0)
        };
        if matches!(p, Prim::Arange | Prim::Eye) && !self.arity(name, a, 1, 1, span) {
            return self.error_expr(span);
        }
        let Some(dims) = self.dim_args(cx, &a.pos[dims_from..], name) else { return self.error_expr(span) };
        let default = if p == Prim::Arange { ElemTy::I32 } else { ElemTy::F32 };
        let mut et = Self::elem_from_expected(expected, default);
        let mut args = Vec::new();
        if vals == 1 {
            let v = self.check_expr(
                cx,
                a.pos[0].0,
                expected
                    .map(|t| match t {
                        Type::Tensor(TensorTy { elem: e, .. }) => Type::tensor_of(*e, vec![]),
                        t => t.clone(),
                    })
                    .as_ref(),
            );
            if let Type::Tensor(TensorTy { elem: e, shape: s, .. }) = &v.ty {
                if !s.is_empty() {
                    let ts = self.ty_str(&v.ty);
                    self.error(
                        Diagnostic::error(
                            Code::E0305,
                            a.pos[0].1,
                            format!("`full` needs a scalar fill value, found {ts}"),
                        )
                        .with_help("to repeat a tensor, use `broadcast_to(x, [d, …])`"),
                    );
                    return self.error_expr(span);
                }
                if let Elem::T(t) = e {
                    et = *t;
                } else if *e == Elem::WeakInt && expected.is_none() {
                    // With nothing asking for a type, `full(7, 3)` takes its fill value's: i32.
                    et = ElemTy::I32;
                }
            }
            let st = Type::scalar(et);
            args.push(self.coerce(v, &st, a.pos[0].1, "fill value"));
        }
        let shape_dims = if p == Prim::Eye { vec![dims[0].clone(), dims[0].clone()] } else { dims };
        let shape = shape_dims.iter().cloned().map(ShapeItem::Dim).collect();
        let attrs = Attrs { shape: shape_dims, dtype: Some(et), ..Attrs::default() };
        self.prim(p, args, attrs, Type::Tensor(TensorTy::new(Elem::T(et), shape)), span)
    }

    pub(super) fn check_normal(
        &mut self,
        cx: &mut FnCx,
        p: Prim,
        a: &Args,
        span: Span,
        expected: Option<&Type>,
    ) -> ir::Expr {
        let name = p.name();
        let likeable = matches!(p, Prim::Normal | Prim::Uniform);
        self.check_named(name, a, if likeable { &["seed", "like"] } else { &["seed"] });
        if matches!(p, Prim::HeNormal | Prim::GlorotUniform) && !self.arity(name, a, 2, 2, span) {
            return self.error_expr(span);
        }
        if let (true, Some(like)) = (likeable, self.named(a, "like")) {
            return self.check_random_like(cx, p, a, like, span, expected);
        }
        let Some(dims) = self.dim_args(cx, &a.pos, name) else { return self.error_expr(span) };
        let seed = self.seed_arg(cx, a, name, span);
        let et = Self::elem_from_expected(expected, ElemTy::F32);
        let et = if et.is_float() { et } else { ElemTy::F32 };
        let shape = dims.iter().cloned().map(ShapeItem::Dim).collect();
        let attrs = Attrs { shape: dims, dtype: Some(et), ..Attrs::default() };
        self.prim(p, seed.into_iter().collect(), attrs, Type::Tensor(TensorTy::new(Elem::T(et), shape)), span)
    }

    /// `uniform(like: x, seed: s)` / `normal(like: x, seed: s)`: random numbers of the shape of
    /// `x`, which may have a `..` rest (known at run time). The operand passes through
    /// `stop_gradient`, so only its shape is used and no derivative flows through it.
    fn check_random_like(
        &mut self,
        cx: &mut FnCx,
        p: Prim,
        a: &Args,
        like: &ast::Expr,
        span: Span,
        expected: Option<&Type>,
    ) -> ir::Expr {
        let name = p.name();
        if !self.arity(name, a, 0, 0, span) {
            return self.error_expr(span);
        }
        let v = self.check_expr(cx, like, None);
        let v = self.materialise(v);
        let Some((_, shape)) = self.tensor_of(&v, like.span, name) else { return self.error_expr(span) };
        let shape = shape.clone();
        let Some(seed) = self.named(a, "seed") else {
            self.error(
                Diagnostic::error(Code::E0212, span, format!("`{name}(like: …)` needs `seed: s`"))
                    .label("missing seed"),
            );
            return self.error_expr(span);
        };
        let i32t = Type::scalar(ElemTy::I32);
        let sv = self.check_expr(cx, seed, Some(&i32t));
        let sv = self.coerce_with(sv, &i32t, seed.span, Code::E0303, "seed");
        let et = Self::elem_from_expected(expected, ElemTy::F32);
        let et = if et.is_float() { et } else { ElemTy::F32 };
        let vt = v.ty.clone();
        let quiet = self.prim(Prim::StopGradient, vec![v], Attrs::default(), vt, span);
        let attrs = Attrs { dtype: Some(et), ..Attrs::default() };
        self.prim(p, vec![sv, quiet], attrs, Type::Tensor(TensorTy::new(Elem::T(et), shape)), span)
    }
}
