//! Shape rules of the I/O and testing builtins: `print`, `load`, `save`, `exists`, `log_scalar`, `assert`,
//! `assert_close`.

use super::*;
use crate::types::TypeArg;

impl Checker {
    pub(super) fn check_print(&mut self, cx: &mut FnCx, p: Prim, a: &Args, span: Span) -> ir::Expr {
        let name = p.name();
        self.check_named(name, a, &["precision"]);
        let precision = match self.named(a, "precision") {
            None => None,
            Some(e) => match self.const_int(cx, e, "precision") {
                Some(k) if (0..=17).contains(&k) => Some(k as u32),
                Some(k) => {
                    self.error(
                        Diagnostic::error(Code::E0323, e.span, format!("precision {k} is out of range"))
                            .label("digits after the point: 0 to 17"),
                    );
                    None
                }
                None => None,
            },
        };
        let mut vs = Vec::new();
        for (e, s) in &a.pos {
            let v = self.check_expr(cx, e, None);
            if matches!(v.ty, Type::Fn(_) | Type::ModelType(_)) {
                self.error(Diagnostic::error(Code::E0304, *s, format!("cannot print {}", self.ty_str(&v.ty))));
            }
            vs.push(self.materialise(v));
        }
        self.prim(p, vs, Attrs { precision, ..Attrs::default() }, Type::unit(), span)
    }

    pub(super) fn check_load(
        &mut self,
        cx: &mut FnCx,
        p: Prim,
        a: &Args,
        span: Span,
        expected: Option<&Type>,
    ) -> ir::Expr {
        let name = p.name();
        self.check_named(name, a, &[]);
        if !self.arity(name, a, 1, 1, span) {
            return self.error_expr(span);
        }
        let path = self.check_expr(cx, a.pos[0].0, None);
        if path.ty != Type::Str && !path.ty.has_error() {
            self.error(Diagnostic::error(Code::E0304, a.pos[0].1, "`load` needs a path string"));
        }
        let ty = match expected {
            Some(t @ Type::Tensor(TensorTy { elem: Elem::T(_), shape: s, .. }))
                if !s.iter().any(|i| matches!(i, ShapeItem::Rest(_))) =>
            {
                t.clone()
            }
            Some(t @ (Type::Model(..) | Type::Tuple(_))) => match Self::unloadable(t) {
                None => t.clone(),
                Some(why) => {
                    let ts = self.ty_str(t);
                    self.error(
                        Diagnostic::error(Code::E0323, span, format!("`load` cannot load {ts}: {why}"))
                            .label("loaded here"),
                    );
                    Type::Error
                }
            },
            Some(t @ Type::ModelVar(_)) => {
                let ts = self.ty_str(t);
                self.error(
                    Diagnostic::error(
                        Code::E0323,
                        span,
                        format!("`load` cannot load the generic model type {ts}: what it holds is known only where the function is called"),
                    )
                    .label("loaded here")
                    .with_help("load it where the model type is known and pass it in"),
                );
                Type::Error
            }
            Some(Type::Error) => Type::Error,
            _ => {
                self.error(
                    Diagnostic::error(Code::E0323, span, "`load` needs a type annotation saying what it loads")
                        .label("what shape and element type?")
                        .with_help("write `let x: f32[N, 64] = load(\"…\")`; `N` is then bound at run time"),
                );
                Type::Error
            }
        };
        self.prim(p, vec![path], Attrs::default(), ty, span)
    }

    pub(super) fn check_save(&mut self, cx: &mut FnCx, p: Prim, a: &Args, span: Span) -> ir::Expr {
        let name = p.name();
        self.check_named(name, a, &[]);
        if !self.arity(name, a, 2, 2, span) {
            return self.error_expr(span);
        }
        let path = self.check_expr(cx, a.pos[0].0, None);
        if path.ty != Type::Str && !path.ty.has_error() {
            self.error(Diagnostic::error(Code::E0304, a.pos[0].1, "`save` needs a path string"));
        }
        let v = self.check_expr(cx, a.pos[1].0, None);
        let v = self.materialise(v);
        if !Self::savable(&v.ty) {
            self.error(Diagnostic::error(Code::E0304, a.pos[1].1, format!("cannot save {}", self.ty_str(&v.ty))));
        }
        self.prim(p, vec![path, v], Attrs::default(), Type::unit(), span)
    }

    /// `log_scalar(name, step, value)`: a non-empty name string, an `i32` step and a numeric
    /// scalar value (recorded as the `f32` TensorBoard stores).
    pub(super) fn check_log_scalar(&mut self, cx: &mut FnCx, p: Prim, a: &Args, span: Span) -> ir::Expr {
        let name = p.name();
        self.check_named(name, a, &[]);
        if !self.arity(name, a, 3, 3, span) {
            return self.error_expr(span);
        }
        let tag = self.check_expr(cx, a.pos[0].0, None);
        match (&tag.ty, &tag.kind) {
            (Type::Error, _) => {}
            (Type::Str, ExprKind::Lit(ir::Lit::Str(s))) if s.is_empty() => {
                self.error(
                    Diagnostic::error(Code::E0323, a.pos[0].1, "`log_scalar` needs a non-empty name")
                        .label("an empty name")
                        .with_help("name the series, e.g. `log_scalar(\"loss\", step, l)`"),
                );
            }
            (Type::Str, _) => {}
            (t, _) => {
                let ts = self.ty_str(t);
                self.error(
                    Diagnostic::error(Code::E0304, a.pos[0].1, format!("`log_scalar` needs a name string, found {ts}"))
                        .label(format!("this is {ts}")),
                );
            }
        }
        let i32t = Type::scalar(ElemTy::I32);
        let step = self.check_expr(cx, a.pos[1].0, Some(&i32t));
        let step = self.coerce(step, &i32t, a.pos[1].1, "the step of `log_scalar`");
        let value = self.check_expr(cx, a.pos[2].0, None);
        let value = self.materialise(value);
        match &value.ty {
            Type::Error => {}
            Type::Tensor(TensorTy { elem: Elem::T(e), shape, .. }) if shape.is_empty() && *e != ElemTy::Bool => {}
            t @ Type::Tensor(TensorTy { elem: e, shape, .. }) => {
                let ts = self.ty_str(t);
                let (code, why) = if shape.is_empty() {
                    (Code::E0303, format!("a {} is not a number to plot", e.name()))
                } else {
                    (Code::E0305, format!("this is {ts}, not a scalar"))
                };
                self.error(
                    Diagnostic::error(
                        code,
                        a.pos[2].1,
                        format!("the value of `log_scalar` must be a number scalar, found {ts}"),
                    )
                    .label(why)
                    .with_help("log one number, e.g. `mean(…)` of a tensor, or `f32(…)` of a bool"),
                );
            }
            t => {
                let ts = self.ty_str(t);
                self.error(
                    Diagnostic::error(
                        Code::E0304,
                        a.pos[2].1,
                        format!("the value of `log_scalar` must be a number scalar, found {ts}"),
                    )
                    .label(format!("this is {ts}")),
                );
            }
        }
        self.prim(p, vec![tag, step, value], Attrs::default(), Type::unit(), span)
    }

    /// Whether `save` can write a value of type `ty`: tensors, models and tuples of them.
    fn savable(ty: &Type) -> bool {
        match ty {
            Type::Tensor(..) | Type::Model(..) | Type::ModelVar(_) | Type::Error => true,
            Type::Tuple(ts) => ts.iter().all(Self::savable),
            _ => false,
        }
    }

    /// Why `load` cannot produce a value of the model or tuple type `ty`, if it cannot: every
    /// tensor in it needs a fixed rank. (Its dims need values before the load runs, which
    /// `let` checks: `annotated_value`.)
    fn unloadable(ty: &Type) -> Option<&'static str> {
        match ty {
            Type::Tensor(TensorTy { shape, .. }) => {
                shape.iter().any(|i| matches!(i, ShapeItem::Rest(_))).then_some("a tensor in it has no fixed rank")
            }
            Type::Tuple(ts) => ts.iter().find_map(Self::unloadable),
            Type::Model(_, args) => args.iter().find_map(|a| match a {
                TypeArg::Dim(_) => None,
                TypeArg::Type(t) => Self::unloadable(t),
            }),
            Type::ModelVar(_) => Some("a generic model type is known only where the function is called"),
            Type::Error => None,
            _ => Some("it holds something that is not a tensor or a model"),
        }
    }

    pub(super) fn check_exists(&mut self, cx: &mut FnCx, p: Prim, a: &Args, span: Span) -> ir::Expr {
        let name = p.name();
        self.check_named(name, a, &[]);
        if !self.arity(name, a, 1, 1, span) {
            return self.error_expr(span);
        }
        let path = self.check_expr(cx, a.pos[0].0, None);
        if path.ty != Type::Str && !path.ty.has_error() {
            self.error(Diagnostic::error(Code::E0304, a.pos[0].1, "`exists` needs a path string"));
        }
        self.prim(p, vec![path], Attrs::default(), Type::scalar(ElemTy::Bool), span)
    }

    pub(super) fn check_assert(&mut self, cx: &mut FnCx, p: Prim, a: &Args, span: Span) -> ir::Expr {
        let name = p.name();
        self.check_named(name, a, &[]);
        if !self.arity(name, a, 1, 2, span) {
            return self.error_expr(span);
        }
        let c = self.check_expr(cx, a.pos[0].0, None);
        self.expect_bool(&c, a.pos[0].1, "`assert` condition");
        let mut args = vec![c];
        if let Some((e, s)) = a.pos.get(1) {
            let m = self.check_expr(cx, e, None);
            if m.ty != Type::Str && !m.ty.has_error() {
                self.error(Diagnostic::error(Code::E0304, *s, "`assert` message must be a string"));
            }
            args.push(m);
        }
        self.prim(p, args, Attrs::default(), Type::unit(), span)
    }

    pub(super) fn check_assert_close(&mut self, cx: &mut FnCx, p: Prim, a: &Args, span: Span) -> ir::Expr {
        let name = p.name();
        self.check_named(name, a, &["rtol", "atol"]);
        if !self.arity(name, a, 2, 2, span) {
            return self.error_expr(span);
        }
        let x = self.check_expr(cx, a.pos[0].0, None);
        let y = self.check_expr(cx, a.pos[1].0, None);
        let both = self.binary_op(ast::BinOp::Sub, Some(p.name()), x, y, span, a.pos[0].1, a.pos[1].1);
        let (x, y) = match both.kind {
            ExprKind::Prim { mut args, .. } if args.len() == 2 => {
                let y = args.pop().unwrap();
                (args.pop().unwrap(), y)
            }
            _ => return self.error_expr(span),
        };
        let (x, y) = (self.materialise(x), self.materialise(y));
        if let Type::Tensor(TensorTy { elem: e, .. }) = &x.ty {
            if !e.is_float() {
                self.error(Diagnostic::error(
                    Code::E0318,
                    span,
                    "`assert_close` compares float tensors; use `assert(a == b)` for integers",
                ));
            }
        }
        let f64t = Type::scalar(ElemTy::F64);
        let mut args = vec![x, y];
        for (tol, default) in [("rtol", 1e-5), ("atol", 1e-6)] {
            let v = match self.named(a, tol) {
                Some(e) => {
                    let v = self.check_expr(cx, e, Some(&f64t));
                    self.coerce(v, &f64t, e.span, tol)
                }
                None => {
                    let sid = self.span_id(span);
                    mk(ExprKind::Lit(ir::Lit::Float(default)), f64t.clone(), sid)
                }
            };
            args.push(v);
        }
        self.prim(p, args, Attrs::default(), Type::unit(), span)
    }
}
