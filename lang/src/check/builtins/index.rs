//! Shape rules of the indexing builtins: `gather`, `scatter_add`, `one_hot`, `update`.

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

    /// `update(x, v, at: i, axis: k)`: `x`'s type; `v` has `x`'s dims (any size along `k`) or
    /// all but dim `k`; `i` is an `i32` scalar known at run time.
    pub(super) fn check_update(&mut self, cx: &mut FnCx, p: Prim, a: &Args, span: Span) -> ir::Expr {
        let name = p.name();
        self.check_named(name, a, &["at", "axis"]);
        if !self.arity(name, a, 2, 2, span) {
            return self.error_expr(span);
        }
        let x = self.check_expr(cx, a.pos[0].0, None);
        let x = self.materialise(x);
        let Some((xe, xs)) = self.tensor_of(&x, a.pos[0].1, name) else { return self.error_expr(span) };
        let xs = xs.clone();
        let xt = x.ty.clone();
        let v = self.check_expr(cx, a.pos[1].0, Some(&xt));
        let Some((ve, _)) = self.tensor_of(&v, a.pos[1].1, name) else { return self.error_expr(span) };
        // A literal takes the buffer's element type (`update(buf, 0.0, at: i)`).
        let v = if ve.is_weak() && (xe.is_float() || !ve.is_float()) { self.retype_weak(v, xe) } else { v };
        let v = self.materialise(v);
        let Some((ve, vs)) = self.tensor_of(&v, a.pos[1].1, name) else { return self.error_expr(span) };
        let vs = vs.clone();
        let (xts, vts) = (self.ty_str(&x.ty), self.ty_str(&v.ty));
        if ve != xe {
            self.error(Diagnostic::error(
                Code::E0303,
                a.pos[1].1,
                format!("`update` writes {vts} into {xts}: the element types differ"),
            ));
            return self.error_expr(span);
        }
        let Some(iv) = self.named_scalar(cx, a, "at", ElemTy::I32) else {
            self.error(Diagnostic::error(Code::E0212, span, "`update` needs `at: i`, the position to write at"));
            return self.error_expr(span);
        };
        let k = match self.named(a, "axis") {
            Some(e) => self.const_int(cx, e, "axis"),
            None => Some(0),
        };
        let Some(k) = k else { return self.error_expr(span) };
        let (Some(xd), Some(vd)) = (self.fixed_dims(&xs, a.pos[0].1, name), self.fixed_dims(&vs, a.pos[1].1, name))
        else {
            return self.error_expr(span);
        };
        if xd.is_empty() {
            self.error(Diagnostic::error(
                Code::E0305,
                a.pos[0].1,
                format!("`update` needs a buffer of rank 1 or more, found {xts}"),
            ));
            return self.error_expr(span);
        }
        let axis_span = self.named(a, "axis").map_or(span, |e| e.span);
        let Some(axis) = self.axis(k, xd.len(), axis_span, &x.ty) else { return self.error_expr(span) };
        let fits = if vd.len() == xd.len() {
            (0..xd.len()).all(|i| i == axis || vd[i] == xd[i])
                && !matches!((vd[axis].as_const(), xd[axis].as_const()), (Some(m), Some(n)) if m > n)
        } else {
            vd.len() + 1 == xd.len()
                && vd.iter().zip(xd.iter().enumerate().filter(|(i, _)| *i != axis)).all(|(a, (_, b))| a == b)
        };
        if !fits {
            self.error(
                Diagnostic::error(
                    Code::E0306,
                    a.pos[1].1,
                    format!("`update` cannot write {vts} into {xts} along axis {axis}"),
                )
                .label(format!("this is {vts}"))
                .with_help("the update has the buffer's dims (any size along the axis), or all of them but the axis"),
            );
            return self.error_expr(span);
        }
        let attrs = Attrs { axis: Some(axis), ..Attrs::default() };
        self.prim(p, vec![x, v, iv], attrs, xt, span)
    }
}
