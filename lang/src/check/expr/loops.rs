//! Loops: `for i in a..b` and `for (xb, yb) in batches(…)`, their variables and bodies.

use super::*;

impl Checker {
    pub(super) fn check_for(
        &mut self,
        cx: &mut FnCx,
        pat: &ast::Pattern,
        iter: &ast::ForIter,
        body: &ast::Block,
        span: Span,
    ) -> ir::Expr {
        match iter {
            ast::ForIter::Range(a, b) => {
                let i32t = Type::scalar(ElemTy::I32);
                let a = self.check_expr(cx, a, Some(&i32t));
                let a = self.coerce_with(a, &i32t, span, Code::E0303, "range start");
                let b = self.check_expr(cx, b, Some(&i32t));
                let b = self.coerce_with(b, &i32t, span, Code::E0303, "range end");
                cx.scopes.push(vec![]);
                let var = match pat {
                    ast::Pattern::Name(n) => {
                        let l = cx.new_local(self, &n.name, i32t.clone(), false);
                        self.record_binding(n.span, &n.name, &i32t);
                        l
                    }
                    ast::Pattern::Wild(_) => cx.new_local(self, "_", i32t.clone(), false),
                    ast::Pattern::Tuple(ps, s) => {
                        self.error(Diagnostic::error(Code::E0319, *s, "a range gives one integer, not a tuple"));
                        // Bind the names (as errors) so that their uses are not reported again.
                        fn names(p: &ast::Pattern, out: &mut Vec<String>) {
                            match p {
                                ast::Pattern::Name(n) => out.push(n.name.clone()),
                                ast::Pattern::Wild(_) => {}
                                ast::Pattern::Tuple(ps, _) => ps.iter().for_each(|p| names(p, out)),
                            }
                        }
                        let mut ns = Vec::new();
                        ps.iter().for_each(|p| names(p, &mut ns));
                        for n in ns {
                            cx.new_local(self, &n, Type::Error, false);
                        }
                        cx.new_local(self, "_", i32t.clone(), false)
                    }
                };
                if jumps::body_jumps(body) {
                    let r = self.range_with_jumps(cx, var, a, b, body, span);
                    cx.scopes.pop();
                    return r;
                }
                let body = self.check_block_as(cx, body, None, true);
                cx.scopes.pop();
                let s = self.span_id(span);
                mk(
                    ExprKind::ForRange { var, start: Box::new(a), end: Box::new(b), body: Box::new(body) },
                    Type::unit(),
                    s,
                )
            }
            ast::ForIter::Expr(it) => {
                if let ast::ExprKind::Call(f, args) = &it.kind {
                    if matches!(&f.kind, ast::ExprKind::Name(n) if n == "batches" && cx.lookup(n).is_none()) {
                        return self.check_batches(cx, pat, args, body, span, it.span);
                    }
                }
                let v = self.check_expr(cx, it, None);
                if !v.ty.has_error() {
                    self.error(
                        Diagnostic::error(Code::E0304, it.span, format!("cannot iterate over {}", self.ty_str(&v.ty)))
                            .label("expected a range `a..b` or `batches(…)`"),
                    );
                }
                self.unit(span)
            }
        }
    }

    pub(super) fn check_batches(
        &mut self,
        cx: &mut FnCx,
        pat: &ast::Pattern,
        args: &[ast::Arg],
        body: &ast::Block,
        span: Span,
        call_span: Span,
    ) -> ir::Expr {
        let mut data = Vec::new();
        let mut size = None;
        let mut shuffle = None;
        let mut drop_last = true;
        for a in args {
            match a.name.as_ref().map(|n| n.name.as_str()) {
                None => data.push(self.check_expr(cx, &a.value, None)),
                Some("size") => size = Some(a.value.clone()),
                Some("shuffle") => {
                    let i32t = Type::scalar(ElemTy::I32);
                    let v = self.check_expr(cx, &a.value, Some(&i32t));
                    shuffle = Some(Box::new(self.coerce_with(v, &i32t, a.value.span, Code::E0303, "shuffle seed")));
                }
                Some("drop_last") => match &a.value.kind {
                    ast::ExprKind::Bool(b) => drop_last = *b,
                    _ => {
                        self.check_expr(cx, &a.value, None);
                        self.error(
                            Diagnostic::error(Code::E0323, a.value.span, "`drop_last:` must be `true` or `false`")
                                .label("not a literal bool")
                                .with_help("whether the batch type has a fixed size is decided at compile time"),
                        );
                    }
                },
                Some(other) => {
                    let n = a.name.as_ref().unwrap();
                    self.error(
                        Diagnostic::error(Code::E0212, n.span, format!("`batches` has no argument `{other}`"))
                            .with_help("the arguments are the arrays, `size:`, `shuffle:` and `drop_last:`"),
                    );
                }
            }
        }
        let Some(size_expr) = size else {
            self.error(
                Diagnostic::error(Code::E0212, call_span, "`batches` needs `size: B`").label("missing batch size"),
            );
            return self.unit(span);
        };
        // A run-time batch size, or a ragged last batch that is kept: the batch dim is a fresh
        // run-time dim, bound to each batch's row count.
        let (b, rows) = match self.static_dim(cx, &size_expr) {
            Some(d) if drop_last => (d, None),
            _ => {
                let s = self.new_sym("B");
                (Dim::var(s), Some(s))
            }
        };
        let i32t = Type::scalar(ElemTy::I32);
        let sv = self.check_expr(cx, &size_expr, Some(&i32t));
        let sv = self.coerce_with(sv, &i32t, size_expr.span, Code::E0303, "batch size");
        if data.is_empty() {
            self.error(Diagnostic::error(Code::E0312, call_span, "`batches` needs at least one array"));
        }
        let mut lead: Option<Dim> = None;
        let mut tys = Vec::new();
        for (d, a) in data.iter().zip(args.iter().filter(|a| a.name.is_none())) {
            match &d.ty {
                Type::Tensor(TensorTy { elem: e, shape: s, .. }) if !s.is_empty() => {
                    if let ShapeItem::Dim(n) = &s[0] {
                        if let Some(l) = &lead {
                            if l != n {
                                self.error(
                                    Diagnostic::error(
                                        Code::E0306,
                                        a.value.span,
                                        format!(
                                            "`batches` arrays must have the same number of rows: {} vs {}",
                                            self.dim_str(l),
                                            self.dim_str(n)
                                        ),
                                    )
                                    .label(format!("this has {} rows", self.dim_str(n)))
                                    .with_help(format!(
                                        "the rows must be one dim: write the arrays with the same one (e.g. `arange({})` \
                                         for an array made to match `{}` rows), or annotate a loaded array with a number",
                                        self.dim_str(l),
                                        self.dim_str(l)
                                    )),
                                );
                            }
                        } else {
                            lead = Some(n.clone());
                        }
                    }
                    let mut s2 = s.clone();
                    s2[0] = ShapeItem::Dim(b.clone());
                    tys.push(Type::Tensor(TensorTy::new(*e, s2)));
                }
                Type::Error => tys.push(Type::Error),
                t => {
                    let ts = self.ty_str(t);
                    self.error(
                        Diagnostic::error(
                            Code::E0305,
                            a.value.span,
                            format!("`batches` needs arrays of rank ≥ 1, found {ts}"),
                        )
                        .label(ts),
                    );
                    tys.push(Type::Error);
                }
            }
        }
        cx.scopes.push(vec![]);
        let elem_ty = if tys.len() == 1 { tys[0].clone() } else { Type::Tuple(tys.clone()) };
        let p = self.bind_pattern(cx, pat, &elem_ty, false);
        let vars: Vec<Local> = match p {
            Pat::Local(l) => vec![l],
            Pat::Tuple(ps) => ps
                .into_iter()
                .map(|p| match p {
                    Pat::Local(l) => l,
                    _ => cx.new_local(self, "_", Type::Error, false),
                })
                .collect(),
            Pat::Ignore => vec![],
        };
        if jumps::body_jumps(body) {
            // The remaining batches are still counted off, but their bodies do not run.
            let (flags, init) = self.begin_jump_loop(cx, span);
            cx.loops.push(flags);
            let b = self.check_block_as(cx, body, None, true);
            cx.loops.pop();
            cx.scopes.pop();
            let b = self.running_body(flags, vec![], b);
            let unit = self.unit(span);
            let sid = self.span_id(span);
            let brk = mk(ExprKind::Local(flags.brk), Type::scalar(ElemTy::Bool), sid);
            let b = mk(ExprKind::If { cond: Box::new(brk), then: Box::new(unit), els: Box::new(b) }, Type::unit(), sid);
            let lp = mk(
                ExprKind::ForBatches { vars, data, size: Box::new(sv), shuffle, drop_last, rows, body: Box::new(b) },
                Type::unit(),
                sid,
            );
            return self.with_init(init, lp);
        }
        let body = self.check_block_as(cx, body, None, true);
        cx.scopes.pop();
        let s = self.span_id(span);
        let kind =
            ExprKind::ForBatches { vars, data, size: Box::new(sv), shuffle, drop_last, rows, body: Box::new(body) };
        mk(kind, Type::unit(), s)
    }

    /// `for var in a..b` whose body jumps, as a `while` over a counter so that `break` stops it:
    /// `{ var ix = a; let end = b; while !brk && ix < end { let var = ix; ix += 1; go = true; body } }`.
    fn range_with_jumps(
        &mut self,
        cx: &mut FnCx,
        var: Local,
        a: ir::Expr,
        b: ir::Expr,
        body: &ast::Block,
        span: Span,
    ) -> ir::Expr {
        let i32t = Type::scalar(ElemTy::I32);
        let ix = cx.new_hidden_local(self, "ix", i32t.clone());
        let end = cx.new_hidden_local(self, "end", i32t.clone());
        let (flags, mut init) = self.begin_jump_loop(cx, span);
        cx.loops.push(flags);
        let body = self.check_block_as(cx, body, None, true);
        cx.loops.pop();
        let sid = self.span_id(span);
        let local = |l: Local| mk(ExprKind::Local(l), i32t.clone(), sid);
        init.insert(0, Stmt::Let { pat: Pat::Local(end), value: b });
        init.insert(0, Stmt::Let { pat: Pat::Local(ix), value: a });
        let lt = self.prim(Prim::Lt, vec![local(ix), local(end)], Attrs::default(), Type::scalar(ElemTy::Bool), span);
        let cond = self.unless_broken(flags, lt, span);
        let one = mk(ExprKind::Lit(Lit::Int(1)), i32t.clone(), sid);
        let next = self.prim(Prim::Add, vec![local(ix), one], Attrs::default(), i32t.clone(), span);
        let pre = vec![
            Stmt::Let { pat: Pat::Local(var), value: local(ix) },
            Stmt::Assign { pat: Pat::Local(ix), value: next },
        ];
        let body = self.running_body(flags, pre, body);
        let lp = mk(ExprKind::While { cond: Box::new(cond), body: Box::new(body) }, Type::unit(), sid);
        self.with_init(init, lp)
    }
}
