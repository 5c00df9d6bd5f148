//! Calls: named functions (generic dims inferred by unification), model constructors, function
//! values (closures, `grad`/`vmap` transforms), indexing and slicing, static dim expressions.

use super::expr::{mk, Binding, FnCx};
use super::{Checker, ItemRef};
use crate::diag::{Code, Diagnostic};
use crate::ir::{self, Attrs, ExprKind, FnTarget, Lit, Prim};
use crate::source::Span;
use crate::syntax::ast;
use crate::types::unify::{Mismatch, Subst, Unifier};
use crate::types::TensorTy;
use crate::types::{Dim, Elem, ElemTy, FnTy, FuncId, ModelId, ShapeItem, Sym, Type, TypeArg};
use std::collections::{HashMap, HashSet};

use dims::Callee;

mod construct;
mod dims;
mod index;
mod jacobian;
mod mismatch;
mod optimizer;

/// Special builtins whose arguments are not ordinary values.
use crate::ir::prim::SPECIAL_FORMS as SPECIAL;

impl Checker {
    pub(crate) fn check_call(
        &mut self,
        cx: &mut FnCx,
        f: &ast::Expr,
        args: &[ast::Arg],
        span: Span,
        expected: Option<&Type>,
    ) -> ir::Expr {
        if let Some(e) = self.check_jacobian(cx, f, args, span) {
            return e;
        }
        match self.model_with_dims(cx, f) {
            Some((id, Some(targs))) => return self.construct_model(cx, id, args, span, Some(&targs)),
            Some((_, None)) => {
                for a in args {
                    self.check_expr(cx, &a.value, None);
                }
                return self.error_expr(span);
            }
            None => {}
        }
        if let ast::ExprKind::Index(base, dargs) = &f.kind {
            if dargs.iter().any(|a| matches!(a, ast::IndexArg::Named { .. })) {
                return self.call_with_dims(cx, base, dargs, args, span, expected);
            }
        }
        if let ast::ExprKind::StackModel(m, len) = &f.kind {
            return self.construct_stack(cx, m, len, args, span);
        }
        // Callees known by name: items, constructors and builtins.
        let item = match &f.kind {
            ast::ExprKind::Name(n) if cx.lookup(n).is_none() => match self.named_item(cx, f) {
                Some(r) => Some(r),
                None => {
                    if SPECIAL.contains(&n.as_str()) {
                        return self.check_special(cx, n, args, span, f.span, expected);
                    }
                    if let Some(p) = Prim::from_name(n) {
                        return self.check_builtin(cx, p, args, span, f.span, expected);
                    }
                    if jacobian::JACOBIANS.contains(&n.as_str()) {
                        self.error(
                            Diagnostic::error(Code::E0404, span, format!("`{n}(f)` is applied at once: `{n}(f)(x)`"))
                                .label("not applied to an argument"),
                        );
                        return self.error_expr(span);
                    }
                    self.unknown_name(cx, n, f.span);
                    for a in args {
                        self.check_expr(cx, &a.value, None);
                    }
                    return self.error_expr(span);
                }
            },
            ast::ExprKind::Field(_, member) => {
                let r = self.named_item(cx, f);
                if let Some(ItemRef::Func(id)) = &r {
                    let def = self.fn_sigs[id.0 as usize].span;
                    self.index.types.push((member.span, self.fn_signature_str(*id), Some(def)));
                }
                r
            }
            _ => None,
        };
        match item {
            Some(ItemRef::Func(id)) => {
                if let ast::ExprKind::Name(_) = &f.kind {
                    let def = self.fn_sigs[id.0 as usize].span;
                    self.index.types.push((f.span, self.fn_signature_str(id), Some(def)));
                }
                return self.call_item(cx, id, args, span, Callee { span: f.span, dims: &[] }, expected);
            }
            Some(ItemRef::Model(id)) => return self.construct_model(cx, id, args, span, None),
            Some(ItemRef::Builtin(p)) => return self.check_builtin(cx, p, args, span, f.span, expected),
            _ => {}
        }
        let callee = self.check_expr(cx, f, None);
        let mut vals = Vec::new();
        for a in args {
            if let (Some(n), false) = (&a.name, matches!(callee.ty, Type::Error)) {
                self.error(
                    Diagnostic::error(
                        Code::E0212,
                        n.span,
                        format!("named argument `{}` in a call of a function value", n.name),
                    )
                    .with_help("function values take positional arguments"),
                );
            }
            vals.push(self.check_expr(cx, &a.value, None));
        }
        let fty = match &callee.ty {
            Type::Fn(fty) => fty.clone(),
            Type::Error => return self.error_expr(span),
            t => {
                let ts = self.ty_str(t);
                self.error(
                    Diagnostic::error(Code::E0313, f.span, format!("{ts} is not a function")).label("called here"),
                );
                return self.error_expr(span);
            }
        };
        let arg_tys: Vec<(Type, Span)> = vals.iter().zip(args).map(|(v, a)| (v.ty.clone(), a.value.span)).collect();
        match self.apply_fn_type(&fty, &arg_tys, span, false) {
            Some((ret, target)) => {
                let vals = self.coerce_args_for(&fty, vals);
                let s = self.span_id(span);
                mk(ExprKind::CallValue { callee: Box::new(callee), target, args: vals }, ret, s)
            }
            None => self.error_expr(span),
        }
    }

    /// The item a callee written `name` or `module.name` refers to, when it is not a local.
    fn named_item(&self, cx: &FnCx, f: &ast::Expr) -> Option<ItemRef> {
        let scope = |n: &String| (cx.lookup(n).is_none()).then(|| self.scopes[cx.module.0 as usize].get(n)).flatten();
        match &f.kind {
            ast::ExprKind::Name(n) => scope(n).cloned(),
            ast::ExprKind::Field(base, member) => match &base.kind {
                ast::ExprKind::Name(n) => match scope(n) {
                    Some(ItemRef::Module(m)) => self.scopes[m.0 as usize].get(&member.name).cloned(),
                    _ => None,
                },
                _ => None,
            },
            _ => None,
        }
    }

    /// Casts weak literal arguments of a value call to the element types they will meet.
    fn coerce_args_for(&mut self, fty: &FnTy, vals: Vec<ir::Expr>) -> Vec<ir::Expr> {
        match fty {
            FnTy::Sig { params, .. } => vals
                .into_iter()
                .zip(params.iter())
                .map(|(v, p)| match self.try_coerce(v, p) {
                    Ok(v) | Err((v, _)) => v,
                })
                .collect(),
            _ => {
                // Weak literals take the parameter types of the function the value calls.
                let tys: Vec<(Type, Span)> = vals.iter().map(|v| (v.ty.clone(), Span::default())).collect();
                let params = self.param_types(fty, &tys);
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
        }
    }

    /// The parameter types a function value expects for these arguments, where known.
    pub(crate) fn param_types(&mut self, fty: &FnTy, args: &[(Type, Span)]) -> Option<Vec<Type>> {
        match fty {
            FnTy::Item(id) => {
                let (_, subst) = self.instantiate(*id, args, Span::default(), true)?;
                Some(self.fn_sigs[id.0 as usize].params.iter().map(|p| subst.ty(&p.ty)).collect())
            }
            FnTy::Grad { inner, .. } => self.param_types(inner, args),
            FnTy::Closure(cid) => {
                let def = &self.closures[cid.0 as usize];
                let ast::ExprKind::Closure { params, .. } = &def.ast.kind else { return None };
                let mut env = self.env_of(&def.cx.clone());
                let m = def.cx.module;
                let ps = params.clone();
                let mut out = Vec::new();
                for (p, (a, _)) in ps.iter().zip(args) {
                    out.push(match &p.ty {
                        Some(t) => self.resolve_type(m, t, &mut env),
                        None => a.clone(),
                    });
                }
                Some(out)
            }
            _ => None,
        }
    }

    fn arg_list(
        &mut self,
        cx: &mut FnCx,
        names: &[String],
        args: &[ast::Arg],
        what: &str,
        span: Span,
    ) -> Vec<Option<ast::Expr>> {
        let mut out: Vec<Option<ast::Expr>> = vec![None; names.len()];
        let mut pos = 0;
        for a in args {
            match &a.name {
                None => {
                    if pos < names.len() {
                        out[pos] = Some(a.value.clone());
                        pos += 1;
                    } else {
                        self.error(
                            Diagnostic::error(
                                Code::E0312,
                                a.value.span,
                                format!("{what} takes {} arguments, but more were given", names.len()),
                            )
                            .label("unexpected argument"),
                        );
                        self.check_expr(cx, &a.value, None);
                    }
                }
                Some(n) => match names.iter().position(|p| *p == n.name) {
                    Some(i) if out[i].is_none() => out[i] = Some(a.value.clone()),
                    Some(_) => {
                        self.error(Diagnostic::error(
                            Code::E0212,
                            n.span,
                            format!("argument `{}` is given twice", n.name),
                        ));
                    }
                    None if n.name == ".." => {
                        self.error(
                            Diagnostic::error(Code::E0212, n.span, format!("{what} takes no `..base`"))
                                .label("not a model constructor")
                                .with_help("`..base` gives a model constructor the fields it does not name: `Model(f: v, ..m)`"),
                        );
                        self.check_expr(cx, &a.value, None);
                    }
                    None => {
                        // A constructor's named arguments are the model's fields.
                        let noun = if what.starts_with("model ") { "field" } else { "parameter" };
                        let mut d =
                            Diagnostic::error(Code::E0212, n.span, format!("{what} has no {noun} `{}`", n.name))
                                .label("unknown argument name");
                        d = match super::suggest(&n.name, names.iter().map(String::as_str)) {
                            Some(s) => d.with_help(format!("did you mean `{s}`?")),
                            None => d.with_help(format!("the parameters are {}", names.join(", "))),
                        };
                        self.error(d);
                        self.check_expr(cx, &a.value, None);
                    }
                },
            }
        }
        let _ = span;
        out
    }

    fn call_item(
        &mut self,
        cx: &mut FnCx,
        id: FuncId,
        args: &[ast::Arg],
        span: Span,
        callee: Callee<'_>,
        expected: Option<&Type>,
    ) -> ir::Expr {
        let fspan = callee.span;
        if self.checking.contains(&id) {
            let name = self.fn_sigs[id.0 as usize].name.clone();
            self.error(
                Diagnostic::error(Code::E0324, fspan, format!("recursive call of `{name}`"))
                    .label("recursion is not supported")
                    .with_help("shapes must be finite: use a `for` or `while` loop instead"),
            );
            return self.error_expr(span);
        }
        self.ensure_body(id);
        let sig = self.fn_sigs[id.0 as usize].clone();
        let names: Vec<String> = sig.params.iter().map(|p| p.name.clone()).collect();
        let what = format!("`{}`", sig.name);
        let (args, opt) = self.optimizer_args(cx, &sig.annotations, args);
        let given = self.arg_list(cx, &names, &args, &what, span);
        let mut vals = Vec::new();
        let mut spans = Vec::new();
        let mut missing = false;
        for (p, g) in sig.params.iter().zip(given) {
            match g {
                Some(e) => {
                    let hint = if p.ty.is_scalar() { Some(p.ty.clone()) } else { None };
                    let hint = hint.or_else(|| matches!(p.ty, Type::Fn(_)).then(|| p.ty.clone()));
                    vals.push(self.check_expr(cx, &e, hint.as_ref()));
                    spans.push(e.span);
                }
                None => match &p.default {
                    Some(d) => {
                        let mut dcx = FnCx::new(sig.module);
                        let v = self.check_expr(&mut dcx, d, Some(&p.ty));
                        vals.push(v);
                        spans.push(d.span);
                    }
                    None => {
                        self.error(
                            Diagnostic::error(Code::E0312, span, format!("missing argument `{}` of {what}", p.name))
                                .label(format!("`{}` expects {} arguments", sig.name, sig.params.len()))
                                .with_secondary(p.span, "parameter declared here"),
                        );
                        missing = true;
                    }
                },
            }
        }
        if missing {
            return self.error_expr(span);
        }
        let arg_tys: Vec<(Type, Span)> = vals.iter().map(|v| v.ty.clone()).zip(spans.iter().copied()).collect();
        // Dims that only the result mentions are taken from the type the caller expects
        // (`let q: f32[2, 4, 3, 6] = heads(x)`).
        let Some((ret, subst)) = self.instantiate_expecting(id, &arg_tys, span, false, expected, callee.dims) else {
            return self.error_expr(span);
        };
        let mut out = Vec::new();
        for ((v, p), sp) in vals.into_iter().zip(&sig.params).zip(&spans) {
            let pt = subst.ty(&p.ty);
            out.push(match self.try_coerce(v, &pt) {
                Ok(v) => v,
                Err((v, why)) => {
                    if !matches!(pt, Type::Tensor(..)) {
                        self.error(
                            Diagnostic::error(
                                Code::E0304,
                                *sp,
                                format!(
                                    "argument `{}` of {what} expects {}, found {}",
                                    p.name,
                                    self.ty_str(&pt),
                                    self.ty_str(&v.ty)
                                ),
                            )
                            .label(why),
                        );
                    }
                    v
                }
            });
        }
        let dims: Vec<Dim> =
            sig.dims.iter().map(|s| subst.dims.get(s).cloned().unwrap_or_else(|| Dim::var(*s))).collect();
        let s = self.span_id(span);
        let rests: Vec<crate::types::Shape> = sig
            .rests
            .iter()
            .map(|r| subst.rests.get(r).cloned().unwrap_or_else(|| vec![ShapeItem::Rest(*r)]))
            .collect();
        let call = mk(ExprKind::Call { func: id, dims, rests, args: out }, ret, s);
        self.shard_state(call, &opt)
    }

    /// Unifies a named function's parameters with argument types; reports mismatches.
    pub(crate) fn instantiate(
        &mut self,
        id: FuncId,
        args: &[(Type, Span)],
        span: Span,
        quiet: bool,
    ) -> Option<(Type, Subst)> {
        self.instantiate_expecting(id, args, span, quiet, None, &[])
    }

    /// [`Checker::instantiate`]; dims the arguments leave open are then solved from the type
    /// `expected` of the result, when the caller gives one.
    pub(crate) fn instantiate_expecting(
        &mut self,
        id: FuncId,
        args: &[(Type, Span)],
        span: Span,
        quiet: bool,
        expected: Option<&Type>,
        given: &[(Sym, Dim)],
    ) -> Option<(Type, Subst)> {
        let sig = self.fn_sigs[id.0 as usize].clone();
        if args.len() != sig.params.len() {
            if !quiet {
                self.error(
                    Diagnostic::error(
                        Code::E0312,
                        span,
                        format!(
                            "`{}` takes {} argument{}, found {}",
                            sig.name,
                            sig.params.len(),
                            if sig.params.len() == 1 { "" } else { "s" },
                            args.len()
                        ),
                    )
                    .with_secondary(sig.span, "defined here"),
                );
            }
            return None;
        }
        let generic: HashSet<Sym> = sig.dims.iter().copied().collect();
        let mut u = Unifier::new(&generic);
        // Dims given at the call (`heads[H = 4](x)`) are fixed before the arguments are seen.
        for (s, d) in given {
            u.subst.dims.insert(*s, d.clone());
        }
        let mut bound_by: HashMap<Sym, usize> = HashMap::new();
        let mut ok = true;
        for (i, (p, (a, aspan))) in sig.params.iter().zip(args).enumerate() {
            let before: HashSet<Sym> = u.subst.dims.keys().copied().collect();
            if let Err(m) = u.ty(&p.ty, a) {
                ok = false;
                if !quiet {
                    self.report_mismatch(
                        &sig.name,
                        &sig.params,
                        i,
                        &p.ty,
                        a,
                        m,
                        *aspan,
                        &bound_by,
                        &args.iter().map(|x| x.1).collect::<Vec<_>>(),
                        &u.subst,
                    );
                }
            }
            for s in u.subst.dims.keys() {
                if !before.contains(s) {
                    bound_by.insert(*s, i);
                }
            }
        }
        if let Err(m) = u.finish() {
            ok = false;
            if !quiet {
                self.error(Diagnostic::error(
                    Code::E0307,
                    span,
                    format!("cannot infer the dims of `{}`: {m:?}", sig.name),
                ));
            }
        }
        if !ok {
            return None;
        }
        if let Some(t @ Type::Tensor(_)) = expected {
            if !u.unsolved(&sig.dims).is_empty() && !t.has_error() {
                let open: Vec<String> = u.unsolved(&sig.dims).iter().map(|s| self.names().sym(*s)).collect();
                if u.ty(&sig.ret, t).and_then(|_| u.finish()).is_err() {
                    if !quiet {
                        let ts = self.ty_str(t);
                        self.error(
                            Diagnostic::error(
                                Code::E0307,
                                span,
                                format!(
                                    "cannot infer dim {} of `{}`: the expected {ts} does not fit its result with these arguments",
                                    open.join(", "),
                                    sig.name
                                ),
                            )
                            .label("no argument determines it")
                            .with_secondary(sig.span, "declared here"),
                        );
                    }
                    return None;
                }
            }
        }
        let unsolved = u.unsolved(&sig.dims);
        if !unsolved.is_empty() {
            if !quiet {
                let names: Vec<String> = unsolved.iter().map(|s| self.names().sym(*s)).collect();
                self.error(
                    Diagnostic::error(
                        Code::E0307,
                        span,
                        format!("cannot infer dim {} of `{}` from the arguments", names.join(", "), sig.name),
                    )
                    .label("no argument determines it")
                    .with_help(
                        "give the result a type, which fixes the dims only the result has: `let y: f32[…] = f(x)`",
                    )
                    .with_secondary(sig.span, "declared here"),
                );
            }
            return None;
        }
        for v in &sig.models {
            if !u.subst.models.contains_key(v) {
                if !quiet {
                    self.error(Diagnostic::error(
                        Code::E0307,
                        span,
                        format!("cannot infer model parameter `{}` of `{}`", self.names().tyvar(*v), sig.name),
                    ));
                }
                return None;
            }
        }
        // A generic dim solved from `2 * N` = 7 has no whole-number size.
        for s in &sig.dims {
            if let Some(q) = u.subst.dims.get(s).filter(|q| q.is_fractional_const()) {
                if !quiet {
                    let (n, qs) = (self.names().sym(*s), self.dim_str(q));
                    self.error(
                        Diagnostic::error(
                            Code::E0307,
                            span,
                            format!(
                                "the arguments of `{}` give dim {n} the size {qs}, which is not a whole number",
                                sig.name
                            ),
                        )
                        .with_secondary(sig.span, "declared here"),
                    );
                }
                return None;
            }
        }
        // A dim such as `E / H` in the signature must divide exactly once the call fixes E and H.
        let mut dims = Vec::new();
        for t in sig.params.iter().map(|p| &p.ty).chain(std::iter::once(&sig.ret)) {
            signature_dims(t, &mut dims);
        }
        for d in dims {
            let q = u.subst.dim(&d);
            if q.is_fractional_const() {
                if !quiet {
                    let bound: Vec<String> = d
                        .vars()
                        .filter_map(|v| {
                            u.subst.dims.get(&v).map(|b| format!("{} = {}", self.names().sym(v), self.dim_str(b)))
                        })
                        .collect();
                    self.error(
                        Diagnostic::error(
                            Code::E0317,
                            span,
                            format!(
                                "dimension division is not exact in this call of `{}`: {} is {}",
                                sig.name,
                                self.dim_str(&d),
                                self.dim_str(&q)
                            ),
                        )
                        .label(bound.join(", "))
                        .with_secondary(sig.span, "declared here"),
                    );
                }
                return None;
            }
        }
        let ret = u.subst.ty(&sig.ret);
        Some((ret, u.subst))
    }

    /// Applies a function value to argument types: the result type and the call target.
    pub(crate) fn apply_fn_type(
        &mut self,
        f: &FnTy,
        args: &[(Type, Span)],
        span: Span,
        quiet: bool,
    ) -> Option<(Type, FnTarget)> {
        match f {
            FnTy::Sig { params, ret } => {
                if params.len() != args.len() {
                    if !quiet {
                        self.error(Diagnostic::error(
                            Code::E0312,
                            span,
                            format!(
                                "function takes {} argument{}, found {}",
                                params.len(),
                                if params.len() == 1 { "" } else { "s" },
                                args.len()
                            ),
                        ));
                    }
                    return None;
                }
                for (p, (a, s)) in params.iter().zip(args) {
                    if !self.types_equal(a, p) {
                        if !quiet {
                            self.error(Diagnostic::error(
                                super::expr::mismatch_code(a, p),
                                *s,
                                format!("argument has type {}, expected {}", self.ty_str(a), self.ty_str(p)),
                            ));
                        }
                        return None;
                    }
                }
                Some(((**ret).clone(), FnTarget::Dynamic))
            }
            FnTy::Item(id) => {
                if self.checking.contains(id) {
                    self.error(Diagnostic::error(Code::E0324, span, "recursive use of a function"));
                    return None;
                }
                self.ensure_body(*id);
                let (ret, _) = self.instantiate(*id, args, span, quiet)?;
                Some((ret, FnTarget::Func(*id)))
            }
            FnTy::Closure(cid) => self.apply_closure(*cid, args, span),
            FnTy::Grad { inner, wrt, with_value } => {
                let (ret, target) = self.apply_fn_type(inner, args, span, quiet)?;
                let scalar_float = matches!(&ret, Type::Tensor(TensorTy { elem: e, shape: s, .. }) if s.is_empty() && e.is_float())
                    || ret.is_error();
                if !scalar_float {
                    self.error(
                        Diagnostic::error(
                            Code::E0401,
                            span,
                            format!(
                                "`grad` needs a function that returns a float scalar, but it returns {}",
                                self.ty_str(&ret)
                            ),
                        )
                        .label("differentiated here")
                        .with_help("reduce the result first, e.g. with `sum(…)` or `mean(…)`"),
                    );
                    return None;
                }
                let Some((wt, wspan)) = args.get(*wrt) else {
                    self.error(Diagnostic::error(
                        Code::E0402,
                        span,
                        format!("`grad` with respect to argument {wrt}, but only {} given", args.len()),
                    ));
                    return None;
                };
                if !differentiable_type(wt) {
                    let shown = match wt {
                        Type::Tensor(TensorTy { elem: e, shape: s, .. }) => {
                            Type::Tensor(TensorTy::new(Elem::T(e.materialise()), s.clone()))
                        }
                        t => t.clone(),
                    };
                    self.error(
                        Diagnostic::error(
                            Code::E0402,
                            *wspan,
                            format!(
                                "cannot differentiate with respect to argument {} of type {}: only float values have gradients",
                                wrt + 1,
                                self.ty_str(&shown)
                            ),
                        )
                        .label("integer or boolean argument")
                        .with_help("pick a float parameter with `wrt:`"),
                    );
                    return None;
                }
                let g = match wt {
                    Type::Tensor(TensorTy { elem: e, shape: s, .. }) => {
                        Type::Tensor(TensorTy::new(Elem::T(e.materialise()), s.clone()))
                    }
                    t => t.clone(),
                };
                let ret = if *with_value { Type::Tuple(vec![ret, g]) } else { g };
                Some((ret, FnTarget::Grad { inner: Box::new(target), wrt: *wrt, with_value: *with_value }))
            }
            FnTy::Vmap { inner, in_axes } => {
                let axes: Vec<Option<usize>> =
                    if in_axes.is_empty() { vec![Some(0); args.len()] } else { in_axes.clone() };
                if axes.len() != args.len() {
                    self.error(Diagnostic::error(
                        Code::E0404,
                        span,
                        format!(
                            "`vmap` has {} `in_axes` {} but is called with {} argument{}",
                            axes.len(),
                            if axes.len() == 1 { "entry" } else { "entries" },
                            args.len(),
                            if args.len() == 1 { "" } else { "s" }
                        ),
                    ));
                    return None;
                }
                let mut inner_args = Vec::new();
                let mut batch: Option<(Dim, Span)> = None;
                for ((t, s), ax) in args.iter().zip(&axes) {
                    match (t, ax) {
                        (_, None) => inner_args.push((t.clone(), *s)),
                        (Type::Tensor(TensorTy { elem: e, shape: sh, .. }), Some(ax)) if *ax < sh.len() => {
                            let ShapeItem::Dim(b) = &sh[*ax] else {
                                self.error(Diagnostic::error(Code::E0404, *s, "`vmap` cannot map over a `..` rest"));
                                return None;
                            };
                            if let Some((prev, pspan)) = &batch {
                                if prev != b {
                                    self.error(
                                        Diagnostic::error(
                                            Code::E0306,
                                            *s,
                                            format!(
                                                "`vmap` mapped dims differ: {} vs {}",
                                                self.dim_str(prev),
                                                self.dim_str(b)
                                            ),
                                        )
                                        .with_secondary(*pspan, format!("mapped dim {}", self.dim_str(prev))),
                                    );
                                    return None;
                                }
                            } else {
                                batch = Some((b.clone(), *s));
                            }
                            let mut sh2 = sh.clone();
                            sh2.remove(*ax);
                            inner_args.push((Type::Tensor(TensorTy::new(*e, sh2)), *s));
                        }
                        (Type::Error, _) => inner_args.push((Type::Error, *s)),
                        (t, Some(ax)) => {
                            self.error(Diagnostic::error(
                                Code::E0404,
                                *s,
                                format!("`vmap` cannot map axis {ax} of {}", self.ty_str(t)),
                            ));
                            return None;
                        }
                    }
                }
                let (ret, target) = self.apply_fn_type(inner, &inner_args, span, quiet)?;
                let b = batch.map(|(b, _)| b).unwrap_or_else(|| Dim::constant(1));
                let ret = add_leading(&ret, &b);
                Some((ret, FnTarget::Vmap { inner: Box::new(target), in_axes: axes }))
            }
            FnTy::Pullback { inner, primals } => {
                let prim_args: Vec<(Type, Span)> = primals.iter().map(|t| (t.clone(), span)).collect();
                let (ret, target) = self.apply_fn_type(inner, &prim_args, span, true)?;
                if args.len() != 1 || !self.types_equal(&args[0].0, &ret) {
                    if !quiet {
                        self.error(Diagnostic::error(
                            Code::E0404,
                            span,
                            format!("the pullback takes one cotangent of type {}", self.ty_str(&ret)),
                        ));
                    }
                    return None;
                }
                let out = Type::Tuple(primals.clone());
                Some((out, FnTarget::Grad { inner: Box::new(target), wrt: usize::MAX, with_value: false }))
            }
        }
    }

    fn apply_closure(
        &mut self,
        cid: crate::types::ClosureId,
        args: &[(Type, Span)],
        span: Span,
    ) -> Option<(Type, FnTarget)> {
        let key: String = args.iter().map(|(t, _)| self.ty_str(t)).collect::<Vec<_>>().join(",");
        let def = self.closures[cid.0 as usize].clone();
        if let Some((_, fid, ret)) = def.instances.iter().find(|(k, _, _)| *k == key) {
            return Some((ret.clone(), FnTarget::Func(*fid)));
        }
        let ast::ExprKind::Closure { params, body } = &def.ast.kind else { return None };
        if params.len() != args.len() {
            self.error(
                Diagnostic::error(
                    Code::E0312,
                    span,
                    format!(
                        "closure takes {} argument{}, found {}",
                        params.len(),
                        if params.len() == 1 { "" } else { "s" },
                        args.len()
                    ),
                )
                .with_secondary(def.ast.span, "closure defined here"),
            );
            return None;
        }
        let mut cx = def.cx.clone();
        cx.scopes.push(vec![]);
        cx.ret = None;
        let mut locals = Vec::new();
        for (p, (t, s)) in params.iter().zip(args) {
            let ty = match &p.ty {
                Some(te) => {
                    let mut env = self.env_of(&cx);
                    let pt = self.resolve_type(cx.module, te, &mut env);
                    if !self.types_equal(t, &pt) {
                        self.error(
                            Diagnostic::error(
                                super::expr::mismatch_code(t, &pt),
                                *s,
                                format!(
                                    "closure parameter `{}` is {}, found {}",
                                    p.name.name,
                                    self.ty_str(&pt),
                                    self.ty_str(t)
                                ),
                            )
                            .with_secondary(p.name.span, "parameter declared here"),
                        );
                    }
                    pt
                }
                None => match t {
                    Type::Tensor(TensorTy { elem: e, shape: sh, .. }) => {
                        Type::Tensor(TensorTy::new(Elem::T(e.materialise()), sh.clone()))
                    }
                    t => t.clone(),
                },
            };
            let l = cx.new_local(self, &p.name.name, ty.clone(), false);
            self.record_binding(p.name.span, &p.name.name, &ty);
            locals.push(l);
        }
        let b = self.check_expr(&mut cx, body, None);
        let b = self.materialise(b);
        let ret = b.ty.clone();
        let name = self.prog.names.intern("closure");
        let sid = self.span_id(def.ast.span);
        let fid = self.push_func(name, &cx, locals, ret.clone(), b, sid);
        self.prog.funcs[fid.0 as usize].n_captures = def.cx.visible_locals().len();
        self.closures[cid.0 as usize].instances.push((key.clone(), fid, ret.clone()));
        self.prog.closures[cid.0 as usize].instances.push((key, fid));
        Some((ret, FnTarget::Func(fid)))
    }

    /// A compile-time dimension written as an expression (`64`, `H`, `2 * D`, `nn_dim`).
    pub(crate) fn static_dim(&mut self, cx: &FnCx, e: &ast::Expr) -> Option<Dim> {
        match &e.kind {
            ast::ExprKind::Int(n) => Some(Dim::constant(*n)),
            ast::ExprKind::Name(n) => match cx.lookup(n) {
                Some((Binding::Dim(d), _)) => Some(d),
                Some(_) => None,
                None => match self.scopes[cx.module.0 as usize].get(n) {
                    Some(ItemRef::Dim(d)) => Some(d.clone()),
                    _ => None,
                },
            },
            ast::ExprKind::Unary(ast::UnOp::Neg, a) => self.static_dim(cx, a).map(|d| d.neg()),
            ast::ExprKind::Binary(op, a, b) => {
                let x = self.static_dim(cx, a)?;
                let y = self.static_dim(cx, b)?;
                let r = match op {
                    ast::BinOp::Add => x.add(&y),
                    ast::BinOp::Sub => x.sub(&y),
                    ast::BinOp::Mul => x.mul(&y),
                    ast::BinOp::Div => self.dim_div(&x, &y, e.span),
                    _ => return None,
                };
                Some(self.dim_in_range(r, &x, &y, e.span))
            }
            ast::ExprKind::Field(base, f) => match &base.kind {
                ast::ExprKind::Name(n) if cx.lookup(n).is_none() => match self.scopes[cx.module.0 as usize].get(n) {
                    Some(ItemRef::Module(m)) => match self.scopes[m.0 as usize].get(&f.name) {
                        Some(ItemRef::Dim(d)) => Some(d.clone()),
                        _ => None,
                    },
                    _ => None,
                },
                _ => None,
            },
            _ => None,
        }
    }

    /// Like `static_dim`, but integer locals become opaque symbols so that `x[i : i + K]` has a
    /// static length `K`.
    fn symbolic_int(&mut self, cx: &mut FnCx, e: &ast::Expr, opaque: &mut HashMap<String, Sym>) -> Option<Dim> {
        if let Some(d) = self.static_dim(cx, e) {
            return Some(d);
        }
        match &e.kind {
            ast::ExprKind::Name(n) => match cx.lookup(n) {
                Some((Binding::Local(_), _)) => {
                    let s = *opaque.entry(n.clone()).or_insert_with(|| self.new_sym(n));
                    Some(Dim::var(s))
                }
                _ => None,
            },
            ast::ExprKind::Binary(op, a, b) => {
                let x = self.symbolic_int(cx, a, opaque)?;
                let y = self.symbolic_int(cx, b, opaque)?;
                match op {
                    ast::BinOp::Add => Some(x.add(&y)),
                    ast::BinOp::Sub => Some(x.sub(&y)),
                    ast::BinOp::Mul => Some(x.mul(&y)),
                    _ => None,
                }
            }
            _ => None,
        }
    }
}

/// The dims written in a (tuple of) tensor types, for the exact-division check of a call.
fn signature_dims(t: &Type, out: &mut Vec<Dim>) {
    match t {
        Type::Tensor(TensorTy { shape: s, .. }) => out.extend(s.iter().filter_map(|i| match i {
            ShapeItem::Dim(d) => Some(d.clone()),
            ShapeItem::Rest(_) => None,
        })),
        Type::Tuple(ts) => ts.iter().for_each(|t| signature_dims(t, out)),
        _ => {}
    }
}

fn differentiable_type(t: &Type) -> bool {
    match t {
        Type::Tensor(TensorTy { elem: e, .. }) => e.is_float(),
        Type::Model(..) | Type::ModelVar(_) | Type::Error => true,
        Type::Tuple(ts) => ts.iter().all(differentiable_type),
        _ => false,
    }
}

/// Adds a leading dim to every tensor in a (tuple of) result types.
fn add_leading(t: &Type, b: &Dim) -> Type {
    match t {
        Type::Tensor(TensorTy { elem: e, shape: s, .. }) => {
            let mut s2 = vec![ShapeItem::Dim(b.clone())];
            s2.extend(s.iter().cloned());
            Type::Tensor(TensorTy::new(*e, s2))
        }
        Type::Tuple(ts) => Type::Tuple(ts.iter().map(|t| add_leading(t, b)).collect()),
        other => other.clone(),
    }
}

/// Reads an expression written as a model type argument: a nested model type with arguments
/// (`Stack[Dense[4, 2]]`) or a dim expression.
fn expr_to_dim_arg(e: &ast::Expr) -> ast::DimArg {
    use ast::ExprKind as K;
    let path = |b: &ast::Expr| match &b.kind {
        K::Name(n) => Some(vec![ast::Ident { name: n.clone(), span: b.span }]),
        K::Field(m, item) => match &m.kind {
            K::Name(n) => Some(vec![ast::Ident { name: n.clone(), span: m.span }, item.clone()]),
            _ => None,
        },
        _ => None,
    };
    if let K::Index(base, args) = &e.kind {
        if let Some(path) = path(base) {
            let args = args
                .iter()
                .map(|a| match a {
                    ast::IndexArg::Expr(e) => expr_to_dim_arg(e),
                    ast::IndexArg::Slice { span, .. } | ast::IndexArg::Named { name: ast::Ident { span, .. }, .. } => {
                        ast::DimArg::Dim { dim: ast::DimExpr { kind: ast::DimKind::Error, span: *span }, shard: vec![] }
                    }
                })
                .collect();
            let kind = ast::TypeKind::Named { path, args: Some(args) };
            return ast::DimArg::Type(ast::TypeExpr { kind, span: e.span });
        }
    }
    ast::DimArg::Dim { dim: expr_to_dim(e), shard: vec![] }
}

/// Reads an expression written as a model type argument as a dim expression.
fn expr_to_dim(e: &ast::Expr) -> ast::DimExpr {
    use ast::{DimExpr, DimKind, ExprKind as K};
    let kind = match &e.kind {
        K::Int(n) => DimKind::Int(*n),
        K::Name(n) => DimKind::Var(n.clone()),
        K::Field(base, item) => match &base.kind {
            K::Name(m) => DimKind::Var(format!("{m}.{}", item.name)),
            _ => DimKind::Error,
        },
        K::Wild => DimKind::Infer,
        K::Unary(ast::UnOp::Neg, a) => DimKind::Neg(Box::new(expr_to_dim(a))),
        K::Binary(op @ (ast::BinOp::Add | ast::BinOp::Sub | ast::BinOp::Mul | ast::BinOp::Div), a, b) => {
            DimKind::Bin(*op, Box::new(expr_to_dim(a)), Box::new(expr_to_dim(b)))
        }
        _ => DimKind::Error,
    };
    DimExpr { kind, span: e.span }
}

pub(crate) fn lit_i32(c: &mut Checker, v: i64, span: Span) -> ir::Expr {
    let s = c.span_id(span);
    mk(ExprKind::Lit(Lit::Int(v)), Type::scalar(ElemTy::I32), s)
}
