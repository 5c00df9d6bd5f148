//! The special forms: `init`, `grad`/`value_and_grad`/`vmap`, `jvp`, `vjp`, conversions, and
//! the checks they need (initialisable models, `in_axes`, `wrt:`).

use super::*;
use crate::types::TensorTy;

impl Checker {
    /// `init`, the transforms and conversions.
    pub(in crate::check) fn check_special(
        &mut self,
        cx: &mut FnCx,
        name: &str,
        args: &[ast::Arg],
        span: Span,
        fspan: Span,
        expected: Option<&Type>,
    ) -> ir::Expr {
        let a = split(args);
        self.index.types.push((fspan, format!("builtin {name}"), None));
        match name {
            n if sorting::COMPOSED.contains(&n) => self.check_composed(cx, n, &a, span),
            "f32" | "f64" | "i32" | "bool" | "bf16" | "f16" => {
                self.check_named(name, &a, &[]);
                if !self.arity(name, &a, 1, 1, span) {
                    return self.error_expr(span);
                }
                let et = ElemTy::from_name(name).unwrap();
                let v = self.check_expr(cx, a.pos[0].0, None);
                let ty = match &v.ty {
                    Type::Tensor(TensorTy { shape: s, .. }) => Type::Tensor(TensorTy::new(Elem::T(et), s.clone())),
                    Type::Error => Type::Error,
                    t => {
                        let ts = self.ty_str(t);
                        self.error(Diagnostic::error(
                            Code::E0304,
                            a.pos[0].1,
                            format!("cannot convert {ts} to {name}"),
                        ));
                        Type::Error
                    }
                };
                let attrs = Attrs { dtype: Some(et), ..Attrs::default() };
                self.prim(Prim::Cast, vec![v], attrs, ty, span)
            }
            "init" => {
                self.check_named(name, &a, &["seed"]);
                if !self.arity(name, &a, 1, 1, span) {
                    return self.error_expr(span);
                }
                let t = self.check_expr(cx, a.pos[0].0, None);
                let mty = match &t.ty {
                    Type::ModelType(m) => (**m).clone(),
                    Type::Error => return self.error_expr(span),
                    other => {
                        let ts = self.ty_str(other);
                        self.error(
                            Diagnostic::error(
                                Code::E0304,
                                a.pos[0].1,
                                format!("`init` needs a model type such as `Mlp[64, 10]`, found {ts}"),
                            )
                            .label("not a model type"),
                        );
                        return self.error_expr(span);
                    }
                };
                let Type::Model(id, targs) = mty.clone() else { return self.error_expr(span) };
                self.check_initialisable(id, &targs, a.pos[0].1);
                let i32t = Type::scalar(ElemTy::I32);
                let seed = match self.named(&a, "seed") {
                    Some(e) => {
                        let v = self.check_expr(cx, e, Some(&i32t));
                        self.coerce_with(v, &i32t, e.span, Code::E0303, "seed")
                    }
                    None => {
                        self.error(
                            Diagnostic::error(Code::E0212, span, "`init` needs `seed: s`")
                                .label("missing seed")
                                .with_help("parameters are drawn from a generator keyed by the seed, e.g. `init(Mlp[64, 10], seed: 0)`"),
                        );
                        lit_i32(self, 0, span)
                    }
                };
                let s = self.span_id(span);
                mk(ExprKind::ModelInit { model: id, args: targs, seed: Box::new(seed) }, mty, s)
            }
            "grad" | "value_and_grad" | "vmap" => {
                let allowed: &[&str] = if name == "vmap" { &["in_axes"] } else { &["wrt"] };
                self.check_named(name, &a, allowed);
                if !self.arity(name, &a, 1, 1, span) {
                    return self.error_expr(span);
                }
                let f = self.check_expr(cx, a.pos[0].0, None);
                let fty = match &f.ty {
                    Type::Fn(ft) => ft.clone(),
                    Type::Error => return self.error_expr(span),
                    t => {
                        let ts = self.ty_str(t);
                        self.error(Diagnostic::error(
                            Code::E0313,
                            a.pos[0].1,
                            format!("`{name}` needs a function, found {ts}"),
                        ));
                        return self.error_expr(span);
                    }
                };
                let new = if name == "vmap" {
                    let in_axes = match self.named(&a, "in_axes") {
                        Some(e) => match self.in_axes(cx, e) {
                            Some(v) => v,
                            None => return self.error_expr(span),
                        },
                        None => vec![],
                    };
                    FnTy::Vmap { inner: Box::new(fty), in_axes }
                } else {
                    let wrt = match self.named(&a, "wrt") {
                        Some(e) => match self.wrt_index(cx, &fty, e) {
                            Some(i) => i,
                            None => return self.error_expr(span),
                        },
                        None => 0,
                    };
                    // A named function's declared types already decide these; report them here
                    // rather than at every call of the gradient.
                    if let FnTy::Item(id) = &fty {
                        let sig = &self.fn_sigs[id.0 as usize];
                        let ret_bad = match &sig.ret {
                            Type::Tensor(TensorTy { elem: e, shape: s, .. }) => {
                                !e.is_float() || s.iter().any(|i| matches!(i, ShapeItem::Dim(_)))
                            }
                            Type::Tuple(_) | Type::Model(..) | Type::ModelVar(_) | Type::Str => true,
                            _ => false,
                        };
                        if ret_bad && !sig.ret.has_error() {
                            let (fname, rs) = (sig.name.clone(), self.ty_str(&sig.ret));
                            self.error(
                                Diagnostic::error(
                                    Code::E0401,
                                    a.pos[0].1,
                                    format!("`{name}` needs a function that returns a float scalar, but `{fname}` returns {rs}"),
                                )
                                .label(format!("returns {rs}"))
                                .with_help("reduce the result first, e.g. with `sum(…)` or `mean(…)`"),
                            );
                            return self.error_expr(span);
                        }
                        let sig = &self.fn_sigs[id.0 as usize];
                        if let Some(p) = sig.params.get(wrt) {
                            if matches!(&p.ty, Type::Tensor(TensorTy { elem: e, .. }) if !e.is_float()) {
                                let (pn, ps) = (p.name.clone(), self.ty_str(&p.ty));
                                let at = self.named(&a, "wrt").map_or(a.pos[0].1, |e| e.span);
                                self.error(
                                    Diagnostic::error(
                                        Code::E0402,
                                        at,
                                        format!("cannot differentiate with respect to `{pn}`: it is {ps}, and only float values have gradients"),
                                    )
                                    .label(format!("`{pn}` is {ps}"))
                                    .with_help("pick a float parameter with `wrt:`"),
                                );
                                return self.error_expr(span);
                            }
                        }
                    }
                    FnTy::Grad { inner: Box::new(fty), wrt, with_value: name == "value_and_grad" }
                };
                let target = fn_target(&new);
                let s = self.span_id(span);
                mk(ExprKind::Transform { target, callee: Box::new(f) }, Type::Fn(new), s)
            }
            "jvp" => {
                self.check_named(name, &a, &[]);
                if !self.arity(name, &a, 3, 3, span) {
                    return self.error_expr(span);
                }
                let f = self.check_expr(cx, a.pos[0].0, None);
                let Type::Fn(fty) = f.ty.clone() else {
                    if !f.ty.has_error() {
                        self.error(Diagnostic::error(Code::E0313, a.pos[0].1, "`jvp` needs a function"));
                    }
                    return self.error_expr(span);
                };
                let prim_vals = self.tuple_items(cx, a.pos[1].0, Some(&fty));
                let tan_exprs: Vec<&ast::Expr> = match &a.pos[2].0.kind {
                    ast::ExprKind::Tuple(es) => es.iter().collect(),
                    _ => vec![a.pos[2].0],
                };
                if prim_vals.len() != tan_exprs.len() {
                    self.error(Diagnostic::error(
                        Code::E0404,
                        a.pos[2].1,
                        format!(
                            "`jvp` has {} primal{} but {} tangent{}",
                            prim_vals.len(),
                            if prim_vals.len() == 1 { "" } else { "s" },
                            tan_exprs.len(),
                            if tan_exprs.len() == 1 { "" } else { "s" }
                        ),
                    ));
                    return self.error_expr(span);
                }
                let args: Vec<(Type, Span)> = prim_vals.iter().map(|v| (v.ty.clone(), a.pos[1].1)).collect();
                let Some((ret, target)) = self.apply_fn_type(&fty, &args, span, false) else {
                    return self.error_expr(span);
                };
                let mut tans = Vec::new();
                for (t, p) in tan_exprs.into_iter().zip(&prim_vals) {
                    // A literal tangent takes its primal's type, like any weakly typed literal.
                    let v = self.check_expr(cx, t, Some(&p.ty));
                    tans.push(self.coerce_with(v, &p.ty, t.span, Code::E0404, "tangent"));
                }
                let s = self.span_id(span);
                let ty = Type::Tuple(vec![ret.clone(), ret]);
                mk(ExprKind::Jvp { target, callee: Box::new(f), primals: prim_vals, tangents: tans }, ty, s)
            }
            "vjp" => {
                self.check_named(name, &a, &[]);
                if !self.arity(name, &a, 2, usize::MAX, span) {
                    return self.error_expr(span);
                }
                let f = self.check_expr(cx, a.pos[0].0, None);
                let Type::Fn(fty) = f.ty.clone() else {
                    if !f.ty.has_error() {
                        self.error(Diagnostic::error(Code::E0313, a.pos[0].1, "`vjp` needs a function"));
                    }
                    return self.error_expr(span);
                };
                let mut prims = Vec::new();
                for (e, _) in &a.pos[1..] {
                    let v = self.check_expr(cx, e, None);
                    prims.push(self.materialise(v));
                }
                let args: Vec<(Type, Span)> =
                    prims.iter().zip(&a.pos[1..]).map(|(v, (_, s))| (v.ty.clone(), *s)).collect();
                let Some((ret, target)) = self.apply_fn_type(&fty, &args, span, false) else {
                    return self.error_expr(span);
                };
                let pb = FnTy::Pullback { inner: Box::new(fty), primals: prims.iter().map(|v| v.ty.clone()).collect() };
                let s = self.span_id(span);
                let ty = Type::Tuple(vec![ret, Type::Fn(pb)]);
                mk(ExprKind::Vjp { target, callee: Box::new(f), primals: prims }, ty, s)
            }
            "batches" => {
                self.error(
                    Diagnostic::error(Code::E0304, span, "`batches(…)` can only be used in a `for` loop")
                        .with_help("write `for (xb, yb) in batches(x, y, size: 64) { … }`"),
                );
                self.error_expr(span)
            }
            _ => {
                let _ = expected;
                self.error_expr(span)
            }
        }
    }

    pub(in crate::check) fn check_initialisable(
        &mut self,
        id: crate::types::ModelId,
        args: &[crate::types::TypeArg],
        span: Span,
    ) {
        // A stack initialises each layer as its inner model.
        if let (Some(inner), Some((_, rest))) = (self.prog.models[id.0 as usize].stack, args.split_first()) {
            return self.check_initialisable(inner, rest, span);
        }
        let n = self.model_sigs[id.0 as usize].fields.len();
        for i in 0..n {
            let has_init = self.model_sigs[id.0 as usize].decl.fields.get(i).is_some_and(|f| f.init.is_some());
            let ft = self.field_type(id, args, i);
            match &ft {
                Type::Model(mid, margs) => {
                    let (mid, margs) = (*mid, margs.clone());
                    self.check_initialisable(mid, &margs, span);
                }
                Type::Error => {}
                _ if !has_init => {
                    let (mname, fname) = (
                        self.model_sigs[id.0 as usize].name.clone(),
                        self.model_sigs[id.0 as usize].fields[i].0.clone(),
                    );
                    let fspan = self.model_sigs[id.0 as usize].fields[i].2;
                    self.error(
                        Diagnostic::error(
                            Code::E0325,
                            span,
                            format!("`init` cannot initialise `{mname}`: field `{fname}` has no initialiser"),
                        )
                        .with_secondary(fspan, "no `= …` here")
                        .with_help(format!("give the field an initialiser, or build the model with `{mname}(…)`")),
                    );
                }
                _ => {}
            }
        }
    }

    /// The primals of `jvp`: weak literals take the parameter types of the function.
    pub(in crate::check) fn tuple_items(&mut self, cx: &mut FnCx, e: &ast::Expr, f: Option<&FnTy>) -> Vec<ir::Expr> {
        let exprs: Vec<&ast::Expr> = match &e.kind {
            ast::ExprKind::Tuple(es) => es.iter().collect(),
            _ => vec![e],
        };
        let vals: Vec<ir::Expr> = exprs.iter().map(|x| self.check_expr(cx, x, None)).collect();
        let tys: Vec<(Type, Span)> = vals.iter().map(|v| (v.ty.clone(), e.span)).collect();
        let params = f.and_then(|f| self.param_types(f, &tys));
        vals.into_iter()
            .enumerate()
            .map(|(i, v)| match params.as_ref().and_then(|p| p.get(i)) {
                Some(p) if matches!(v.ty, Type::Tensor(TensorTy { elem: e, .. }) if e.is_weak()) => {
                    match self.try_coerce(v, p) {
                        Ok(v) => v,
                        Err((v, _)) => self.materialise(v),
                    }
                }
                _ => self.materialise(v),
            })
            .collect()
    }

    pub(in crate::check) fn in_axes(&mut self, cx: &FnCx, e: &ast::Expr) -> Option<Vec<Option<usize>>> {
        let items: Vec<&ast::Expr> = match &e.kind {
            ast::ExprKind::Tuple(es) => es.iter().collect(),
            _ => vec![e],
        };
        let mut out = Vec::new();
        for it in items {
            if matches!(it.kind, ast::ExprKind::Wild) {
                out.push(None);
                continue;
            }
            match self.static_dim(cx, it).and_then(|d| d.as_const()) {
                Some(k) if k >= 0 => out.push(Some(k as usize)),
                _ => {
                    self.error(
                        Diagnostic::error(
                            Code::E0404,
                            it.span,
                            "`in_axes` entries are axis numbers or `_` for an unmapped argument",
                        )
                        .label("expected e.g. `0` or `_`"),
                    );
                    return None;
                }
            }
        }
        Some(out)
    }

    pub(in crate::check) fn wrt_index(&mut self, cx: &FnCx, f: &FnTy, e: &ast::Expr) -> Option<usize> {
        if let Some(k) = self.static_dim(cx, e).and_then(|d| d.as_const()) {
            return Some(k.max(0) as usize);
        }
        let ast::ExprKind::Name(n) = &e.kind else {
            self.error(Diagnostic::error(Code::E0402, e.span, "`wrt:` names a parameter"));
            return None;
        };
        let names: Vec<String> = match f {
            FnTy::Item(id) => self.fn_sigs[id.0 as usize].params.iter().map(|p| p.name.clone()).collect(),
            FnTy::Closure(cid) => match &self.closures[cid.0 as usize].ast.kind {
                ast::ExprKind::Closure { params, .. } => params.iter().map(|p| p.name.name.clone()).collect(),
                _ => vec![],
            },
            _ => vec![],
        };
        match names.iter().position(|p| p == n) {
            Some(i) => Some(i),
            None => {
                let mut d = Diagnostic::error(Code::E0402, e.span, format!("the function has no parameter `{n}`"))
                    .label("unknown parameter");
                if let Some(s) = crate::check::suggest(n, names.iter().map(String::as_str)) {
                    d = d.with_help(format!("did you mean `{s}`?"));
                }
                self.error(d);
                None
            }
        }
    }
}
