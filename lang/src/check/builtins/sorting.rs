//! Shape rules of sorting and sampling (`spec/inference.md`): the primitives `argsort`,
//! `take_along_axis` and `scatter_add_along`, and `sort`, `top_k` and `categorical`, which are
//! written with them (so they differentiate, batch and shard by those primitives' rules).

use super::*;

/// The sorting and sampling builtins the checker writes with other primitives.
pub(super) const COMPOSED: &[&str] = &["sort", "top_k", "categorical"];

/// Checked operands of `take_along_axis`/`scatter_add_along`: values, indices, the values'
/// element type, both dims and the axis.
type AlongOperands = (ir::Expr, ir::Expr, Elem, Vec<Dim>, Vec<Dim>, usize);

/// A checked operand of rank one or more with its fixed dims, and the axis asked for.
struct Sortable {
    v: ir::Expr,
    elem: Elem,
    dims: Vec<Dim>,
    axis: usize,
    descending: bool,
}

impl Checker {
    /// The operand of `sort`/`argsort`/`top_k`/`categorical`, with `axis:` (default the last)
    /// and `descending:` (default false) when `named` allows them.
    fn sortable(
        &mut self,
        cx: &mut FnCx,
        name: &str,
        a: &Args,
        named: &[&str],
        arity: usize,
        span: Span,
    ) -> Option<Sortable> {
        self.check_named(name, a, named);
        if !self.arity(name, a, arity, arity, span) {
            return None;
        }
        let v = self.check_expr(cx, a.pos[0].0, None);
        let v = self.materialise(v);
        let (elem, s) = self.tensor_of(&v, a.pos[0].1, name)?;
        let s = s.clone();
        let dims = self.fixed_dims(&s, a.pos[0].1, name)?;
        if dims.is_empty() {
            let ts = self.ty_str(&v.ty);
            self.error(Diagnostic::error(
                Code::E0305,
                a.pos[0].1,
                format!("`{name}` needs a tensor of rank 1 or more, found {ts}"),
            ));
            return None;
        }
        let (k, kspan) = match self.named(a, "axis") {
            Some(ax) => (self.const_int(cx, ax, "axis")?, ax.span),
            None => (-1, span),
        };
        let axis = self.axis(k, dims.len(), kspan, &v.ty)?;
        let descending = match self.named(a, "descending") {
            Some(d) => self.const_bool(d, "descending")?,
            None => false,
        };
        Some(Sortable { v, elem, dims, axis, descending })
    }

    /// `argsort(v)` along `axis` as an expression, keeping the first `keep` positions.
    fn argsort_expr(
        &mut self,
        v: ir::Expr,
        dims: &[Dim],
        axis: usize,
        descending: bool,
        keep: Option<Dim>,
        span: Span,
    ) -> ir::Expr {
        let mut out: Vec<Dim> = dims.to_vec();
        if let Some(k) = &keep {
            out[axis] = k.clone();
        }
        let attrs = Attrs { axis: Some(axis), descending, shape: keep.into_iter().collect(), ..Attrs::default() };
        let ty = Type::tensor(ElemTy::I32, out);
        self.prim(Prim::Argsort, vec![v], attrs, ty, span)
    }

    /// `argsort(x, axis: k, descending: d)`.
    pub(super) fn check_argsort(&mut self, cx: &mut FnCx, a: &Args, span: Span) -> ir::Expr {
        let Some(s) = self.sortable(cx, "argsort", a, &["axis", "descending"], 1, span) else {
            return self.error_expr(span);
        };
        self.argsort_expr(s.v, &s.dims, s.axis, s.descending, None, span)
    }

    /// The two operands of `take_along_axis`/`scatter_add_along` and the axis: values and `i32`
    /// indices of the same rank whose dims agree except along the axis.
    fn along_operands(&mut self, cx: &mut FnCx, p: Prim, a: &Args, arity: usize, span: Span) -> Option<AlongOperands> {
        let name = p.name();
        self.check_named(name, a, &["axis"]);
        if !self.arity(name, a, arity, arity, span) {
            return None;
        }
        let (x, e, xs, idx, is) = self.values_and_indices(cx, a, name)?;
        let xd = self.fixed_dims(&xs, a.pos[0].1, name)?;
        let id = self.fixed_dims(&is, a.pos[1].1, name)?;
        let Some(ax) = self.named(a, "axis") else {
            self.error(Diagnostic::error(Code::E0212, span, format!("`{name}` needs `axis: k`")));
            return None;
        };
        let k = self.const_int(cx, ax, "axis")?;
        let axis = self.axis(k, xd.len(), ax.span, &x.ty)?;
        let (xt, it) = (self.ty_str(&x.ty), self.ty_str(&idx.ty));
        if id.len() != xd.len() {
            self.error(Diagnostic::error(
                Code::E0305,
                a.pos[1].1,
                format!("`{name}` indices must have the rank of {xt} ({}), found {it}", xd.len()),
            ));
            return None;
        }
        if let Some(i) = (0..xd.len()).find(|&i| i != axis && xd[i] != id[i]) {
            self.error(
                Diagnostic::error(
                    Code::E0306,
                    a.pos[1].1,
                    format!("`{name}` indices {it} must match {xt} in every dim but axis {axis} (dim {i} differs)"),
                )
                .with_secondary(a.pos[0].1, format!("this is {xt}")),
            );
            return None;
        }
        Some((x, idx, e, xd, id, axis))
    }

    /// `take_along_axis(x, idx, axis: k)`: the shape of `idx`, the element type of `x`.
    pub(super) fn check_take_along(&mut self, cx: &mut FnCx, p: Prim, a: &Args, span: Span) -> ir::Expr {
        let Some((x, idx, e, _, id, axis)) = self.along_operands(cx, p, a, 2, span) else {
            return self.error_expr(span);
        };
        let attrs = Attrs { axis: Some(axis), ..Attrs::default() };
        let shape = id.into_iter().map(ShapeItem::Dim).collect();
        self.prim(p, vec![x, idx], attrs, Type::Tensor(TensorTy::new(e, shape)), span)
    }

    /// `scatter_add_along(upd, idx, n, axis: k)`: `upd`'s shape with `n` along the axis.
    pub(super) fn check_scatter_add_along(&mut self, cx: &mut FnCx, p: Prim, a: &Args, span: Span) -> ir::Expr {
        let Some((upd, idx, e, ud, id, axis)) = self.along_operands(cx, p, a, 3, span) else {
            return self.error_expr(span);
        };
        if ud != id {
            let (ut, it) = (self.ty_str(&upd.ty), self.ty_str(&idx.ty));
            self.error(Diagnostic::error(
                Code::E0306,
                a.pos[0].1,
                format!("`scatter_add_along` updates {ut} must have the shape of the indices {it}"),
            ));
            return self.error_expr(span);
        }
        let Some(n) = self.dim_args(cx, &a.pos[2..3], p.name()) else { return self.error_expr(span) };
        let mut dims = ud;
        dims[axis] = n[0].clone();
        let shape = dims.iter().cloned().map(ShapeItem::Dim).collect();
        let attrs = Attrs { axis: Some(axis), shape: dims, ..Attrs::default() };
        self.prim(p, vec![upd, idx], attrs, Type::Tensor(TensorTy::new(e, shape)), span)
    }

    /// `sort`, `top_k` and `categorical`.
    pub(super) fn check_composed(&mut self, cx: &mut FnCx, name: &str, a: &Args, span: Span) -> ir::Expr {
        let built = match name {
            "sort" => self.check_sort(cx, a, span),
            "top_k" => self.check_top_k(cx, a, span),
            _ => self.check_categorical(cx, a, span),
        };
        built.unwrap_or_else(|| self.error_expr(span))
    }

    /// Binds `v` to a new local the program cannot name; returns the statement and a reader.
    fn bind_hidden(&mut self, cx: &mut FnCx, what: &str, v: ir::Expr) -> (ir::Stmt, impl Fn() -> ir::Expr) {
        let (ty, sid) = (v.ty.clone(), v.span);
        let l = cx.new_local(self, &format!("%{what}"), ty.clone(), false);
        (ir::Stmt::Let { pat: ir::Pat::Local(l), value: v }, move || mk(ExprKind::Local(l), ty.clone(), sid))
    }

    /// `sort(x, axis: k, descending: d)` is `take_along_axis(x, argsort(x, …), axis: k)`.
    fn check_sort(&mut self, cx: &mut FnCx, a: &Args, span: Span) -> Option<ir::Expr> {
        let s = self.sortable(cx, "sort", a, &["axis", "descending"], 1, span)?;
        let ty = s.v.ty.clone();
        let (bind, x) = self.bind_hidden(cx, "sort", s.v);
        let order = self.argsort_expr(x(), &s.dims, s.axis, s.descending, None, span);
        let attrs = Attrs { axis: Some(s.axis), ..Attrs::default() };
        let sorted = self.prim(Prim::TakeAlong, vec![x(), order], attrs, ty.clone(), span);
        let sid = self.span_id(span);
        Some(mk(ExprKind::Block { stmts: vec![bind], result: Box::new(sorted) }, ty, sid))
    }

    /// `top_k(x, k)`: `(take_along_axis(x, i, axis: -1), i)` with `i` the first `k` positions
    /// of the descending order of the last axis.
    fn check_top_k(&mut self, cx: &mut FnCx, a: &Args, span: Span) -> Option<ir::Expr> {
        self.check_named("top_k", a, &[]);
        if !self.arity("top_k", a, 2, 2, span) {
            return None;
        }
        let k = self.dim_args(cx, &a.pos[1..2], "top_k")?.remove(0);
        let s = self.sortable(cx, "top_k", &Args { pos: a.pos[..1].to_vec(), named: vec![] }, &[], 1, span)?;
        let last = s.dims.len() - 1;
        if let (Some(kv), Some(n)) = (k.as_const(), s.dims[last].as_const()) {
            if kv > n {
                let ts = self.ty_str(&s.v.ty);
                self.error(
                    Diagnostic::error(
                        Code::E0306,
                        span,
                        format!("`top_k` asks for {kv} values but the last axis of {ts} has {n}"),
                    )
                    .with_secondary(a.pos[1].1, "k"),
                );
                return None;
            }
        }
        let (bind_x, x) = self.bind_hidden(cx, "topk_x", s.v);
        let order = self.argsort_expr(x(), &s.dims, last, true, Some(k.clone()), span);
        let it = order.ty.clone();
        let (bind_i, i) = self.bind_hidden(cx, "topk_i", order);
        let mut vd = s.dims.clone();
        vd[last] = k;
        let vt = Type::Tensor(TensorTy::new(s.elem, vd.into_iter().map(ShapeItem::Dim).collect()));
        let attrs = Attrs { axis: Some(last), ..Attrs::default() };
        let values = self.prim(Prim::TakeAlong, vec![x(), i()], attrs, vt.clone(), span);
        let sid = self.span_id(span);
        let ty = Type::Tuple(vec![vt, it]);
        let pair = mk(ExprKind::Tuple(vec![values, i()]), ty.clone(), sid);
        Some(mk(ExprKind::Block { stmts: vec![bind_x, bind_i], result: Box::new(pair) }, ty, sid))
    }

    /// `categorical(logits, seed: s)`: `argmax(logits + g, axis: -1)` with Gumbel noise
    /// `g = -log(-log(uniform(like: logits, seed: s)))`.
    fn check_categorical(&mut self, cx: &mut FnCx, a: &Args, span: Span) -> Option<ir::Expr> {
        let s = self.sortable(cx, "categorical", a, &["seed"], 1, span)?;
        if !s.elem.is_float() {
            let ts = self.ty_str(&s.v.ty);
            self.error(
                Diagnostic::error(Code::E0318, a.pos[0].1, format!("`categorical` needs float logits, found {ts}"))
                    .label(ts)
                    .with_help("convert them with `f32(…)`"),
            );
            return None;
        }
        let Some(seed) = self.named(a, "seed") else {
            self.error(Diagnostic::error(Code::E0212, span, "`categorical` needs `seed: s`").label("missing seed"));
            return None;
        };
        let i32t = Type::scalar(ElemTy::I32);
        let sv = self.check_expr(cx, seed, Some(&i32t));
        let sv = self.coerce_with(sv, &i32t, seed.span, Code::E0303, "seed");
        let ty = s.v.ty.clone();
        let et = match s.elem {
            Elem::T(t) => t,
            _ => ElemTy::F32,
        };
        let (bind, l) = self.bind_hidden(cx, "logits", s.v);
        let quiet = self.prim(Prim::StopGradient, vec![l()], Attrs::default(), ty.clone(), span);
        let attrs = Attrs { dtype: Some(et), ..Attrs::default() };
        let u = self.prim(Prim::Uniform, vec![sv, quiet], attrs, ty.clone(), span);
        let mut g = u;
        for p in [Prim::Log, Prim::Neg, Prim::Log, Prim::Neg] {
            g = self.prim(p, vec![g], Attrs::default(), ty.clone(), span);
        }
        let noisy = self.prim(Prim::Add, vec![l(), g], Attrs::default(), ty, span);
        let last = s.dims.len() - 1;
        let attrs = Attrs { axis: Some(last), ..Attrs::default() };
        let out = Type::tensor(ElemTy::I32, s.dims[..last].to_vec());
        let draw = self.prim(Prim::Argmax, vec![noisy], attrs, out.clone(), span);
        let sid = self.span_id(span);
        Some(mk(ExprKind::Block { stmts: vec![bind], result: Box::new(draw) }, out, sid))
    }
}
