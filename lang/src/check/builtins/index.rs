//! Shape rules of the indexing builtins: `gather`, `scatter_add`, `one_hot`.

use super::*;

impl Checker {
    pub(super) fn check_gather(&mut self, cx: &mut FnCx, p: Prim, a: &Args, span: Span) -> ir::Expr {
        let name = p.name();
        self.check_named(name, a, &["axis"]);
        if !self.arity(name, a, 2, 2, span) {
            return self.error_expr(span);
        }
        let Some((x, e, xs, idx, is)) = self.values_and_indices(cx, a, name) else {
            return self.error_expr(span);
        };
        let k = match self.named(a, "axis") {
            Some(x) => self.const_int(cx, x, "axis"),
            None => Some(0),
        };
        let Some(k) = k else { return self.error_expr(span) };
        let Some(xd) = self.fixed_dims(&xs, a.pos[0].1, name) else { return self.error_expr(span) };
        let axis_span = self.named(a, "axis").map_or(span, |x| x.span);
        let Some(ax) = self.axis(k, xd.len(), axis_span, &x.ty) else { return self.error_expr(span) };
        let mut shape: Vec<ShapeItem> = xd[..ax].iter().cloned().map(ShapeItem::Dim).collect();
        shape.extend(is.iter().cloned());
        shape.extend(xd[ax + 1..].iter().cloned().map(ShapeItem::Dim));
        let attrs = Attrs { axis: Some(ax), ..Attrs::default() };
        self.prim(p, vec![x, idx], attrs, Type::Tensor(TensorTy::new(e, shape)), span)
    }

    pub(super) fn check_scatter_add(&mut self, cx: &mut FnCx, p: Prim, a: &Args, span: Span) -> ir::Expr {
        let name = p.name();
        // scatter_add(upd, idx, n, axis: k): upd is [pre(k), idx.shape…, post] and the
        // result is [pre, n, post]: the adjoint of gather along axis k.
        self.check_named(name, a, &["axis"]);
        if !self.arity(name, a, 3, 3, span) {
            return self.error_expr(span);
        }
        let Some((upd, e, us, idx, is)) = self.values_and_indices(cx, a, name) else {
            return self.error_expr(span);
        };
        let Some(n) = self.dim_args(cx, &a.pos[2..3], name) else { return self.error_expr(span) };
        let k = match self.named(a, "axis") {
            Some(x) => self.const_int(cx, x, "axis"),
            None => Some(0),
        };
        let Some(k) = k else { return self.error_expr(span) };
        let (Some(ud), Some(id)) = (self.fixed_dims(&us, a.pos[0].1, name), self.fixed_dims(&is, a.pos[1].1, name))
        else {
            return self.error_expr(span);
        };
        let k = k.max(0) as usize;
        if ud.len() < k + id.len() || ud[k..k + id.len()] != id[..] {
            let (us_s, is_s) = (self.ty_str(&upd.ty), self.ty_str(&idx.ty));
            self.error(
                Diagnostic::error(
                    Code::E0306,
                    span,
                    format!("`scatter_add` updates {us_s} must hold the index shape of {is_s} at axis {k}"),
                )
                .with_secondary(a.pos[0].1, format!("this is {us_s}")),
            );
            return self.error_expr(span);
        }
        let mut dims: Vec<Dim> = ud[..k].to_vec();
        dims.push(n[0].clone());
        dims.extend(ud[k + id.len()..].iter().cloned());
        let shape = dims.iter().cloned().map(ShapeItem::Dim).collect();
        let attrs = Attrs { axis: Some(k), shape: dims, ..Attrs::default() };
        self.prim(p, vec![upd, idx], attrs, Type::Tensor(TensorTy::new(e, shape)), span)
    }

    pub(super) fn check_one_hot(
        &mut self,
        cx: &mut FnCx,
        p: Prim,
        a: &Args,
        span: Span,
        expected: Option<&Type>,
    ) -> ir::Expr {
        let name = p.name();
        self.check_named(name, a, &[]);
        if !self.arity(name, a, 2, 2, span) {
            return self.error_expr(span);
        }
        let y = self.check_expr(cx, a.pos[0].0, None);
        let y = self.materialise(y);
        let Some((ye, ys)) = self.tensor_of(&y, a.pos[0].1, name) else { return self.error_expr(span) };
        let ys = ys.clone();
        if ye != Elem::T(ElemTy::I32) {
            self.error(Diagnostic::error(
                Code::E0303,
                a.pos[0].1,
                format!("`one_hot` needs i32 labels, found {}", ye.name()),
            ));
            return self.error_expr(span);
        }
        let Some(n) = self.dim_args(cx, &a.pos[1..2], name) else { return self.error_expr(span) };
        let mut shape = ys;
        shape.push(ShapeItem::Dim(n[0].clone()));
        let et = Self::elem_from_expected(expected, ElemTy::F32);
        let attrs = Attrs { shape: n, dtype: Some(et), ..Attrs::default() };
        self.prim(p, vec![y], attrs, Type::Tensor(TensorTy::new(Elem::T(et), shape)), span)
    }
}
