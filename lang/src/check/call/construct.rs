//! Model constructors: `Name(field: value, …)`, every field by name, and `Name(f: v, ..base)`,
//! the other fields from a model of the same type; `[Block; L](w: ws, b: bs)` builds a stack of
//! `L` blocks from its stacked fields (what `msl grad` prints for a stack's gradient).

use super::*;

/// A model named with its dims (`Name[D, …]`, `Name[K = 4]`): the model and each generic
/// parameter given, or `None` where errors in them were reported.
pub(super) type GivenModel = (ModelId, Option<Vec<Option<TypeArg>>>);

impl Checker {
    /// `[Block; L](field: value, …)`: the stack model's constructor, whose count of layers is
    /// read from the fields' leading dim and must be `L`.
    pub(super) fn construct_stack(
        &mut self,
        cx: &mut FnCx,
        model: &ast::Expr,
        len: &ast::DimArg,
        args: &[ast::Arg],
        span: Span,
    ) -> ir::Expr {
        let (inner, given) = match self.model_with_dims(cx, model) {
            Some((_, None)) => {
                for a in args {
                    self.check_expr(cx, &a.value, None);
                }
                return self.error_expr(span);
            }
            Some((id, Some(targs))) => (id, Some(targs)),
            None => match self.named_item(cx, model) {
                Some(ItemRef::Model(id)) => (id, None),
                _ => (ModelId(u32::MAX), None),
            },
        };
        let inner = match inner {
            ModelId(u32::MAX) => {
                self.error(
                    Diagnostic::error(Code::E0304, model.span, "a stack holds models: `[Block; L](…)`")
                        .label("not a model"),
                );
                for a in args {
                    self.check_expr(cx, &a.value, None);
                }
                return self.error_expr(span);
            }
            id => id,
        };
        let id = self.stack_of(inner, None);
        // The stack's dims are its number of layers, then the inner model's.
        let given: Option<Vec<Option<TypeArg>>> = given.map(|g| {
            let mut all = vec![None];
            all.extend(g);
            all
        });
        let built = self.construct_model(cx, id, args, span, given.as_deref());
        let ast::DimArg::Dim { dim, shard } = len else {
            self.error(Diagnostic::error(Code::E0304, span, "the number of layers of a stack is a dim"));
            return self.error_expr(span);
        };
        if let Some(a) = shard.first() {
            self.error(
                Diagnostic::error(Code::E0502, a.span, "a stack's constructor takes no layout")
                    .label("here")
                    .with_help("split the layers in a type: `layers: [Block[D]; L @pp]`"),
            );
            return self.error_expr(span);
        }
        let mut env = self.env_of(cx);
        let want = Some(self.resolve_dim(cx.module, dim, &mut env));
        let got = match &built.ty {
            Type::Model(_, targs) => match targs.first() {
                Some(TypeArg::Dim(d)) => Some(d.clone()),
                _ => None,
            },
            _ => return built,
        };
        if let (Some(w), Some(g)) = (want, got) {
            if w != g {
                let (ws, gs) = (crate::types::dim_str(&w, &self.prog), crate::types::dim_str(&g, &self.prog));
                self.error(
                    Diagnostic::error(Code::E0306, span, format!("a stack of {ws} layers was given fields of {gs}"))
                        .label("the fields' leading dim"),
                );
                return self.error_expr(span);
            }
        }
        built
    }

    /// `Name[D, …]` or `Name[K = 4, …]` naming a model with its dims: the model and each generic
    /// parameter given (`None` for a dim not named, inferred from the fields), or `Some((id,
    /// None))` once errors in them are reported.
    pub(super) fn model_with_dims(&mut self, cx: &mut FnCx, f: &ast::Expr) -> Option<GivenModel> {
        let ast::ExprKind::Index(base, dargs) = &f.kind else { return None };
        let Some(ItemRef::Model(id)) = self.named_item(cx, base) else { return None };
        if dargs.iter().any(|a| matches!(a, ast::IndexArg::Named { .. })) {
            return Some((id, self.model_with_dims_named(cx, id, dargs)));
        }
        match self.check_expr(cx, f, None).ty {
            Type::ModelType(t) => match *t {
                Type::Model(id, targs) => Some((id, Some(targs.into_iter().map(Some).collect()))),
                _ => Some((id, None)),
            },
            _ => Some((id, None)),
        }
    }

    /// The dims `dargs` give model `id` by name (`Smooth[K = 4]`), in declaration order, `None`
    /// for one not named; `None` once errors in them are reported.
    pub(super) fn model_with_dims_named(
        &mut self,
        cx: &mut FnCx,
        id: ModelId,
        dargs: &[ast::IndexArg],
    ) -> Option<Vec<Option<TypeArg>>> {
        let sig = self.model_sigs[id.0 as usize].clone();
        if sig.generic_is_model.iter().any(|m| *m) {
            let at = dargs.iter().find_map(|a| match a {
                ast::IndexArg::Named { name, .. } => Some(name.span),
                _ => None,
            });
            self.error(
                Diagnostic::error(
                    Code::E0212,
                    at.unwrap_or(sig.span),
                    format!("`{}` takes its parameters in order", sig.name),
                )
                .label("it has model parameters")
                .with_help(format!("write `{}[…]` with every parameter, in declaration order", sig.name)),
            );
            return None;
        }
        let given = self.given_dims_of(cx, &sig.name, &sig.dims, sig.span, dargs)?;
        Some(
            sig.dims.iter().map(|s| given.iter().find(|(d, _)| d == s).map(|(_, v)| TypeArg::Dim(v.clone()))).collect(),
        )
    }

    /// `Name(…)`, or `Name[D, …](…)` with the model's dims given (`dims_given`), for dims that no
    /// field's type determines.
    pub(super) fn construct_model(
        &mut self,
        cx: &mut FnCx,
        id: ModelId,
        args: &[ast::Arg],
        span: Span,
        dims_given: Option<&[Option<TypeArg>]>,
    ) -> ir::Expr {
        let sig = self.model_sigs[id.0 as usize].clone();
        let names: Vec<String> = sig.fields.iter().map(|(n, _, _)| n.clone()).collect();
        let what = format!("model `{}`", sig.name);
        // `..base`: the fields the call does not name are read from `base`, a model of this type.
        let (bases, args): (Vec<&ast::Arg>, Vec<&ast::Arg>) =
            args.iter().partition(|a| a.name.as_ref().is_some_and(|n| n.name == ".."));
        let args: Vec<ast::Arg> = args.into_iter().cloned().collect();
        let base = match bases.as_slice() {
            [] => None,
            [b] => Some(b),
            [_, b, ..] => {
                let sp = b.name.as_ref().map_or(span, |n| n.span);
                self.error(
                    Diagnostic::error(Code::E0212, sp, "a constructor takes one `..base`").label("a second base"),
                );
                return self.error_expr(span);
            }
        };
        let base = match base {
            None => None,
            Some(b) => {
                let v = self.check_expr(cx, &b.value, None);
                match &v.ty {
                    Type::Model(m, _) if *m == id => Some(v),
                    Type::Error => return self.error_expr(span),
                    t => {
                        let ts = self.ty_str(t);
                        self.error(
                            Diagnostic::error(
                                Code::E0306,
                                b.value.span,
                                format!("`..base` of {what} must be a `{}`, found {ts}", sig.name),
                            )
                            .label("not this model type"),
                        );
                        return self.error_expr(span);
                    }
                }
            }
        };
        let base_local = base.map(|v| {
            let l = cx.new_local(self, "base", v.ty.clone(), false);
            (l, v)
        });
        let given = self.arg_list(cx, &names, &args, &what, span);
        let generic: HashSet<Sym> = sig.dims.iter().copied().collect();
        let mut u = Unifier::new(&generic);
        let mut vals = Vec::new();
        let mut bad = false;
        for (i, ((n, fty, _), g)) in sig.fields.iter().zip(given).enumerate() {
            if let (None, Some((l, bv))) = (&g, &base_local) {
                let sid = self.span_id(span);
                let read = mk(ExprKind::Local(*l), bv.ty.clone(), sid);
                let ftype = match &bv.ty {
                    Type::Model(m, targs) => self.field_type(*m, targs, i),
                    _ => Type::Error,
                };
                let v = mk(ExprKind::Field(Box::new(read), i), ftype, sid);
                let _ = u.ty(fty, &v.ty);
                vals.push((v, fty.clone()));
                continue;
            }
            let Some(e) = g else {
                self.error(
                    Diagnostic::error(Code::E0312, span, format!("missing field `{n}` of {what}"))
                        .label("every field must be given"),
                );
                bad = true;
                continue;
            };
            let hint = fty.is_scalar().then(|| fty.clone());
            let v = self.check_expr(cx, &e, hint.as_ref());
            if let Err(_m) = u.ty(fty, &v.ty) {
                self.error(
                    Diagnostic::error(
                        crate::check::expr::mismatch_code(&v.ty, fty),
                        e.span,
                        format!(
                            "field `{n}` of {what} expects {}, found {}",
                            self.ty_str(&u.subst.ty(fty)),
                            self.ty_str(&v.ty)
                        ),
                    )
                    .label("wrong type"),
                );
                bad = true;
            }
            vals.push((v, fty.clone()));
        }
        let _ = u.finish();
        if bad {
            return self.error_expr(span);
        }
        let mut targs = Vec::new();
        let (mut d, mut v) = (sig.dims.iter(), sig.models.iter());
        for (k, is_model) in sig.generic_is_model.iter().enumerate() {
            let told = dims_given.and_then(|g| g.get(k)).and_then(|t| t.as_ref());
            if *is_model {
                let tv = v.next().unwrap();
                let t = match (u.subst.models.get(tv), told) {
                    (Some(t), _) => t.clone(),
                    (None, Some(TypeArg::Type(t))) => t.clone(),
                    _ => Type::Error,
                };
                targs.push(TypeArg::Type(t));
            } else {
                let s = d.next().unwrap();
                match (u.subst.dims.get(s), told) {
                    (Some(x), Some(TypeArg::Dim(g))) if x != g => {
                        let (xs, gs) = (crate::types::dim_str(x, &self.prog), crate::types::dim_str(g, &self.prog));
                        self.error(
                            Diagnostic::error(
                                Code::E0306,
                                span,
                                format!("dim {} of {what} is {gs}, but its fields make it {xs}", self.names().sym(*s)),
                            )
                            .label("the fields' dims"),
                        );
                        return self.error_expr(span);
                    }
                    (Some(x), _) | (None, Some(TypeArg::Dim(x))) => targs.push(TypeArg::Dim(x.clone())),
                    _ => {
                        self.error(
                            Diagnostic::error(
                                Code::E0307,
                                span,
                                format!("cannot infer dim {} of {what} from its fields", self.names().sym(*s)),
                            )
                            .with_help(format!("name the model's dims: `{}[…](…)`", sig.name)),
                        );
                        return self.error_expr(span);
                    }
                }
            }
        }
        let fields: Vec<ir::Expr> = vals
            .into_iter()
            .map(|(v, t)| {
                let t = u.subst.ty(&t);
                match self.try_coerce(v, &t) {
                    Ok(v) | Err((v, _)) => v,
                }
            })
            .collect();
        let s = self.span_id(span);
        let build = mk(ExprKind::ModelBuild { fields }, Type::Model(id, targs), s);
        match base_local {
            None => build,
            Some((l, v)) => {
                let ty = build.ty.clone();
                let bind = ir::Stmt::Let { pat: ir::Pat::Local(l), value: v };
                mk(ExprKind::Block { stmts: vec![bind], result: Box::new(build) }, ty, s)
            }
        }
    }
}
