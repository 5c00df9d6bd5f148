//! Indexing and slicing: `x[i]`, `x[a:b, :]`, with static bounds checks where the sizes are known.

use super::*;
use crate::ir::SliceEntry;

impl Checker {
    /// `Model[D = 2, K = 5]` as a type value: every dim given by name, in any order.
    fn model_type_by_name(&mut self, cx: &mut FnCx, id: ModelId, args: &[ast::IndexArg], span: Span) -> ir::Expr {
        let targs = match self.model_with_dims_named(cx, id, args) {
            Some(t) => t,
            None => return self.error_expr(span),
        };
        let sig = self.model_sigs[id.0 as usize].clone();
        let missing: Vec<String> =
            sig.dims.iter().zip(&targs).filter(|(_, t)| t.is_none()).map(|(d, _)| self.names().sym(*d)).collect();
        if !missing.is_empty() {
            self.error(
                Diagnostic::error(
                    Code::E0307,
                    span,
                    format!("dim {} of model `{}` is not given", missing.join(", "), sig.name),
                )
                .label("a model type names every dim")
                .with_help("only a constructor infers the dims its fields determine: `Name[K = 4](field: …)`"),
            );
            return self.error_expr(span);
        }
        let t = Type::Model(id, targs.into_iter().flatten().collect());
        let s = self.span_id(span);
        mk(ExprKind::Tuple(vec![]), Type::ModelType(Box::new(t)), s)
    }

    pub(crate) fn check_index(
        &mut self,
        cx: &mut FnCx,
        base: &ast::Expr,
        args: &[ast::IndexArg],
        span: Span,
        _expected: Option<&Type>,
    ) -> ir::Expr {
        // `Model[…]` as a type value.
        let model = match &base.kind {
            ast::ExprKind::Name(n) if cx.lookup(n).is_none() => match self.scopes[cx.module.0 as usize].get(n) {
                Some(ItemRef::Model(id)) => Some(*id),
                _ => None,
            },
            ast::ExprKind::Field(b, f) => match &b.kind {
                ast::ExprKind::Name(n) if cx.lookup(n).is_none() => match self.scopes[cx.module.0 as usize].get(n) {
                    Some(ItemRef::Module(m)) => match self.scopes[m.0 as usize].get(&f.name) {
                        Some(ItemRef::Model(id)) => Some(*id),
                        _ => None,
                    },
                    _ => None,
                },
                _ => None,
            },
            _ => None,
        };
        if let Some(id) = model {
            if args.iter().any(|a| matches!(a, ast::IndexArg::Named { .. })) {
                return self.model_type_by_name(cx, id, args, span);
            }
            let dim_args: Vec<ast::DimArg> = args
                .iter()
                .map(|a| match a {
                    ast::IndexArg::Expr(e) => expr_to_dim_arg(e),
                    ast::IndexArg::Slice { span, .. } | ast::IndexArg::Named { name: ast::Ident { span, .. }, .. } => {
                        ast::DimArg::Dim { dim: ast::DimExpr { kind: ast::DimKind::Error, span: *span }, shard: vec![] }
                    }
                })
                .collect();
            let mut env = self.env_of(cx);
            let t = self.model_type_from_args(cx.module, id, Some(&dim_args), &mut env, span);
            let s = self.span_id(span);
            return mk(ExprKind::Tuple(vec![]), Type::ModelType(Box::new(t)), s);
        }
        if let Some(ast::IndexArg::Named { name, .. }) = args.iter().find(|a| matches!(a, ast::IndexArg::Named { .. }))
        {
            self.error(
                Diagnostic::error(Code::E0320, name.span, format!("`{} = …` is not an index", name.name))
                    .label("a named dim argument")
                    .with_help(
                        "dims are given by name to a generic function, `f[H = 4](x)`, or a model, `Dense[O = 4](…)`",
                    ),
            );
            return self.error_expr(span);
        }
        let x = self.check_expr(cx, base, None);
        if let Type::Model(id, _) = &x.ty {
            if self.prog.models[id.0 as usize].stack.is_some() {
                return self.index_stack(cx, x, args, span);
            }
        }
        let (elem, shape) = match &x.ty {
            Type::Tensor(TensorTy { elem: e, shape: s, .. }) => (*e, s.clone()),
            Type::Error => return self.error_expr(span),
            t => {
                let ts = self.ty_str(t);
                self.error(
                    Diagnostic::error(Code::E0320, base.span, format!("cannot index {ts}")).label("not a tensor"),
                );
                return self.error_expr(span);
            }
        };
        // Leading dims before a `..` rest can be indexed (`x[0]` of `f32[B, ..S]` is `f32[..S]`).
        if let Some(r) = shape.iter().position(|i| matches!(i, ShapeItem::Rest(_))) {
            if args.len() > r {
                let ts = self.ty_str(&x.ty);
                self.error(
                    Diagnostic::error(Code::E0320, span, format!("cannot index into the `..` rest of {ts}"))
                        .with_secondary(base.span, format!("this is {ts}")),
                );
                return self.error_expr(span);
            }
        }
        if args.len() > shape.len() {
            let ts = self.ty_str(&x.ty);
            self.error(
                Diagnostic::error(
                    Code::E0320,
                    span,
                    format!("too many indices: {} for a tensor of rank {} ({ts})", args.len(), shape.len()),
                )
                .with_secondary(base.span, format!("this is {ts}")),
            );
            return self.error_expr(span);
        }
        let i32t = Type::scalar(ElemTy::I32);
        let mut kinds = Vec::new();
        let mut operands = vec![x];
        let mut out_shape = Vec::new();
        let mut opaque = HashMap::new();
        // An index or slice out of range is reported once; the result is then an error value.
        let mut bad = false;
        // Slices with a step: (axis of the contiguous slice's result, step, span).
        let mut steps: Vec<(usize, i64, Span)> = Vec::new();
        for (i, a) in args.iter().enumerate() {
            let ShapeItem::Dim(size) = &shape[i] else { unreachable!() };
            match a {
                ast::IndexArg::Expr(e) => {
                    let v = self.check_expr(cx, e, Some(&i32t));
                    if !v.ty.has_error()
                        && !matches!(&v.ty, Type::Tensor(TensorTy { elem: Elem::T(ElemTy::I32) | Elem::WeakInt, shape: s, .. }) if s.is_empty())
                    {
                        let ts = self.ty_str(&v.ty);
                        self.error(
                            Diagnostic::error(
                                Code::E0320,
                                e.span,
                                format!("an index must be an i32 scalar, found {ts}"),
                            )
                            .with_help("use `gather(x, idx, axis: k)` to index with a tensor"),
                        );
                        bad = true;
                    }
                    if let (Some(k), Some(n)) = (self.static_dim(cx, e).and_then(|d| d.as_const()), size.as_const()) {
                        if k >= n || k < -n {
                            self.error(Diagnostic::error(
                                Code::E0320,
                                e.span,
                                format!("index {k} is out of range for dimension {i} of size {n}"),
                            ));
                            bad = true;
                        }
                    }
                    // A non-integer index was reported above; coercing it would report it again.
                    let v = if bad { v } else { self.coerce(v, &i32t, e.span, "index") };
                    operands.push(v);
                    kinds.push(SliceEntry::Index);
                }
                // Refused above.
                ast::IndexArg::Named { .. } => return self.error_expr(span),
                ast::IndexArg::Slice { start, end, step, span: sspan } => {
                    if let Some(st) = step {
                        let Some(k) = self.slice_step(cx, st, start.is_some() || end.is_some()) else {
                            return self.error_expr(span);
                        };
                        if k != 1 {
                            steps.push((out_shape.len(), k, *sspan));
                        }
                    }
                    match (start, end) {
                        (None, None) => {
                            kinds.push(SliceEntry::Full);
                            out_shape.push(ShapeItem::Dim(size.clone()));
                            continue;
                        }
                        _ => kinds.push(SliceEntry::Range),
                    }
                    let sd = match start {
                        Some(e) => self.symbolic_int(cx, e, &mut opaque),
                        None => Some(Dim::constant(0)),
                    };
                    let ed = match end {
                        Some(e) => self.symbolic_int(cx, e, &mut opaque),
                        None => Some(size.clone()),
                    };
                    // A negative constant bound counts from the end, as in NumPy (`x[-2:]`, `x[:-1]`).
                    let from_end = |d: Option<Dim>| {
                        d.map(|d| match d.as_const() {
                            Some(k) if k < 0 => size.add(&Dim::constant(k)),
                            _ => d,
                        })
                    };
                    let (sd, ed) = (from_end(sd), from_end(ed));
                    let len = match (&sd, &ed) {
                        (Some(a), Some(b)) => {
                            let l = b.sub(a);
                            if l.vars().any(|v| opaque.values().any(|o| *o == v)) {
                                None
                            } else {
                                Some(l)
                            }
                        }
                        _ => None,
                    };
                    let Some(len) = len else {
                        self.error(
                            Diagnostic::error(
                                Code::E0320,
                                *sspan,
                                "the length of a slice must be known at compile time",
                            )
                            .label("length depends on run-time values")
                            .with_help("write the slice as `i : i + K` with a dimension `K`"),
                        );
                        return self.error_expr(span);
                    };
                    if let (Some(a), Some(b), Some(n)) =
                        (sd.as_ref().and_then(Dim::as_const), ed.as_ref().and_then(Dim::as_const), size.as_const())
                    {
                        if a < 0 || b > n || a > b {
                            self.error(Diagnostic::error(
                                Code::E0320,
                                *sspan,
                                format!("slice {a}:{b} is out of range for dimension {i} of size {n}"),
                            ));
                            bad = true;
                        }
                    }
                    for (bound, default) in [(start, Lit::Int(0)), (end, Lit::Int(-1))] {
                        let negative = bound
                            .as_ref()
                            .and_then(|e| self.static_dim(cx, e))
                            .and_then(|d| d.as_const())
                            .filter(|k| *k < 0);
                        let v = match bound {
                            Some(e) if negative.is_some() => {
                                let sid = self.span_id(e.span);
                                let d = size.add(&Dim::constant(negative.unwrap_or(0)));
                                mk(ExprKind::DimValue(d), i32t.clone(), sid)
                            }
                            Some(e) => {
                                let v = self.check_expr(cx, e, Some(&i32t));
                                self.coerce(v, &i32t, e.span, "slice bound")
                            }
                            None => {
                                let sid = self.span_id(*sspan);
                                if default == Lit::Int(0) {
                                    mk(ExprKind::Lit(default), i32t.clone(), sid)
                                } else {
                                    mk(ExprKind::DimValue(size.clone()), i32t.clone(), sid)
                                }
                            }
                        };
                        operands.push(v);
                    }
                    out_shape.push(ShapeItem::Dim(len));
                }
            }
        }
        if bad {
            return self.error_expr(span);
        }
        out_shape.extend(shape[args.len()..].iter().cloned());
        let mut out = if !steps.is_empty() && kinds.iter().all(|k| *k == SliceEntry::Full) {
            operands.swap_remove(0)
        } else {
            let attrs = Attrs { slice: kinds, ..Attrs::default() };
            self.prim(Prim::Slice, operands, attrs, Type::Tensor(TensorTy::new(elem, out_shape.clone())), span)
        };
        // `a:b:s` is the contiguous `a:b` then every |s|-th element of it (from its end when s is
        // negative), gathered: its derivative and batching are `gather`'s.
        for (ax, k, sspan) in steps {
            let ShapeItem::Dim(len) = out_shape[ax].clone() else { continue };
            let m = k.abs();
            // Over a size known only at run time the step must divide it (checked when it runs).
            let count = match len.as_const() {
                Some(n) => Dim::constant((n + m - 1) / m),
                None => len.div(&Dim::constant(m)).unwrap_or_else(|| len.clone()),
            };
            let sid = self.span_id(sspan);
            let idx_ty = Type::tensor(ElemTy::I32, vec![count.clone()]);
            let at = Attrs { shape: vec![count.clone()], dtype: Some(ElemTy::I32), ..Attrs::default() };
            let arange = self.prim(Prim::Arange, vec![], at, idx_ty.clone(), sspan);
            let step = mk(ExprKind::Lit(Lit::Int(m)), i32t.clone(), sid);
            let mut idx = self.prim(Prim::Mul, vec![arange, step], Attrs::default(), idx_ty.clone(), sspan);
            if k < 0 {
                let last = mk(ExprKind::DimValue(len.sub(&Dim::constant(1))), i32t.clone(), sid);
                idx = self.prim(Prim::Sub, vec![last, idx], Attrs::default(), idx_ty, sspan);
            }
            out_shape[ax] = ShapeItem::Dim(count);
            let attrs = Attrs { axis: Some(ax), ..Attrs::default() };
            out = self.prim(
                Prim::Gather,
                vec![out, idx],
                attrs,
                Type::Tensor(TensorTy::new(elem, out_shape.clone())),
                span,
            );
        }
        out
    }

    /// The step of a slice: a non-zero integer known at compile time; a negative step takes no
    /// bounds (`x[::-1]`). `None` after a diagnostic.
    fn slice_step(&mut self, cx: &mut FnCx, st: &ast::Expr, bounded: bool) -> Option<i64> {
        let k = match self.static_dim(cx, st).and_then(|d| d.as_const()) {
            Some(k) => k,
            None => {
                self.error(
                    Diagnostic::error(Code::E0320, st.span, "a slice step must be an integer known at compile time")
                        .label("not a constant"),
                );
                return None;
            }
        };
        if k == 0 {
            self.error(Diagnostic::error(Code::E0320, st.span, "a slice step cannot be zero").label("step 0"));
            return None;
        }
        if k < 0 && bounded {
            self.error(
                Diagnostic::error(Code::E0320, st.span, "a slice with a negative step takes no bounds here")
                    .label("negative step")
                    .with_help("slice forwards, then reverse: `x[a:b][::-1]`"),
            );
            return None;
        }
        Some(k)
    }
}
