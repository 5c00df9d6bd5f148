//! Shape rules of the shape builtins: `reshape`, `broadcast_to`, `transpose`, `permute`, `expand_dims`, `squeeze` (and `concat`/`stack`).

use super::*;

impl Checker {
    pub(super) fn check_reshape(&mut self, cx: &mut FnCx, p: Prim, a: &Args, span: Span) -> ir::Expr {
        let name = p.name();
        let Some((v, e, s)) = self.tensor_operand(cx, p, a, &[], (2, 2), span) else {
            return self.error_expr(span);
        };
        let ast::ExprKind::List(items) = &a.pos[1].0.kind else {
            self.error(
                Diagnostic::error(
                    Code::E0323,
                    a.pos[1].1,
                    format!("`{name}` needs the target shape as a list `[d, …]`"),
                )
                .label("expected `[…]`"),
            );
            return self.error_expr(span);
        };
        let infer_at = items.iter().position(|i| matches!(i.kind, ast::ExprKind::Wild));
        if let Some(second) = items.iter().filter(|i| matches!(i.kind, ast::ExprKind::Wild)).nth(1) {
            self.error(
                Diagnostic::error(
                    Code::E0323,
                    second.span,
                    format!("`{name}` can infer only one dimension written `_`"),
                )
                .label("a second `_`"),
            );
            return self.error_expr(span);
        }
        let mut dims = Vec::new();
        for (i, it) in items.iter().enumerate() {
            if Some(i) == infer_at {
                dims.push(Dim::constant(1));
                continue;
            }
            let Some(d) = self.dim_args(cx, &[(it, it.span)], name) else { return self.error_expr(span) };
            dims.push(d[0].clone());
        }
        let Some(src) = self.fixed_dims(&s, a.pos[0].1, name) else { return self.error_expr(span) };
        if p == Prim::Reshape {
            let total = src.iter().fold(Dim::constant(1), |acc, d| acc.mul(d));
            if let Some(i) = infer_at {
                let others = dims.iter().fold(Dim::constant(1), |acc, d| acc.mul(d));
                dims[i] = self.dim_div(&total, &others, items[i].span);
            }
            let target = dims.iter().fold(Dim::constant(1), |acc, d| acc.mul(d));
            if target != total {
                let ts = self.ty_str(&v.ty);
                let shape_s: Vec<String> = dims.iter().map(|d| self.dim_str(d)).collect();
                self.error(
                    Diagnostic::error(
                        Code::E0308,
                        span,
                        format!(
                            "reshape changes the number of elements: {} ({ts}) to {} ([{}])",
                            self.dim_str(&total),
                            self.dim_str(&target),
                            shape_s.join(", ")
                        ),
                    )
                    .with_secondary(a.pos[0].1, format!("this is {ts}"))
                    .with_secondary(a.pos[1].1, format!("{} elements", self.dim_str(&target))),
                );
                return self.error_expr(span);
            }
        } else {
            let tgt: Vec<ShapeItem> = dims.iter().cloned().map(ShapeItem::Dim).collect();
            let ok = src.len() <= dims.len() && matches!(broadcast(&s, &tgt), Ok(ref b) if *b == tgt);
            if !ok {
                let shape_s: Vec<String> = dims.iter().map(|d| self.dim_str(d)).collect();
                self.error(Diagnostic::error(
                    Code::E0302,
                    span,
                    format!("cannot broadcast {} to [{}]", self.ty_str(&v.ty), shape_s.join(", ")),
                ));
                return self.error_expr(span);
            }
        }
        let shape = dims.iter().cloned().map(ShapeItem::Dim).collect();
        let attrs = Attrs { shape: dims, ..Attrs::default() };
        self.prim(p, vec![v], attrs, Type::Tensor(TensorTy::new(e, shape)), span)
    }

    pub(super) fn check_transpose(&mut self, cx: &mut FnCx, p: Prim, a: &Args, span: Span) -> ir::Expr {
        let name = p.name();
        self.check_named(name, a, &[]);
        let n = if p == Prim::Transpose { 1 } else { 2 };
        if !self.arity(name, a, n, n, span) {
            return self.error_expr(span);
        }
        let v = self.check_expr(cx, a.pos[0].0, None);
        let v = self.materialise(v);
        let Some((e, s)) = self.tensor_of(&v, a.pos[0].1, name) else { return self.error_expr(span) };
        let s = s.clone();
        let Some(dims) = self.fixed_dims(&s, a.pos[0].1, name) else { return self.error_expr(span) };
        let perm: Vec<usize> = if p == Prim::Transpose {
            (0..dims.len()).rev().collect()
        } else {
            let ast::ExprKind::List(items) = &a.pos[1].0.kind else {
                self.error(Diagnostic::error(Code::E0323, a.pos[1].1, "`permute` needs the axes as a list `[i, …]`"));
                return self.error_expr(span);
            };
            let mut perm = Vec::new();
            for it in items {
                let Some(k) = self.const_int(cx, it, "an axis") else { return self.error_expr(span) };
                let Some(k) = self.axis(k, dims.len(), it.span, &v.ty) else { return self.error_expr(span) };
                perm.push(k);
            }
            let mut sorted = perm.clone();
            sorted.sort();
            if sorted != (0..dims.len()).collect::<Vec<_>>() {
                self.error(
                    Diagnostic::error(
                        Code::E0309,
                        a.pos[1].1,
                        format!("`permute` needs each of the {} axes exactly once", dims.len()),
                    )
                    .label("not a permutation"),
                );
                return self.error_expr(span);
            }
            perm
        };
        let shape = perm.iter().map(|&i| ShapeItem::Dim(dims[i].clone())).collect();
        let attrs = Attrs { perm, ..Attrs::default() };
        self.prim(p, vec![v], attrs, Type::Tensor(TensorTy::new(e, shape)), span)
    }

    pub(super) fn check_expand_dims(&mut self, cx: &mut FnCx, p: Prim, a: &Args, span: Span) -> ir::Expr {
        let name = p.name();
        let Some((v, e, s)) = self.tensor_operand(cx, p, a, &["axis"], (1, 1), span) else {
            return self.error_expr(span);
        };
        let Some(mut dims) = self.fixed_dims(&s, a.pos[0].1, name) else { return self.error_expr(span) };
        let ax = match self.named(a, "axis") {
            Some(x) => match self.const_int(cx, x, "axis") {
                Some(k) => Some((k, x.span)),
                None => return self.error_expr(span),
            },
            None => None,
        };
        let axis = if p == Prim::ExpandDims {
            let Some((k, sp)) = ax else {
                self.error(Diagnostic::error(Code::E0212, span, "`expand_dims` needs `axis: k`"));
                return self.error_expr(span);
            };
            // The new dim can go at any of rank + 1 positions.
            let r = dims.len() as i64 + 1;
            if k >= r || k < -r {
                let ts = self.ty_str(&v.ty);
                self.error(
                    Diagnostic::error(
                        Code::E0309,
                        sp,
                        format!(
                            "axis {k} is out of range for `expand_dims` of {ts}: the new dim goes at {} to {}",
                            -r,
                            r - 1
                        ),
                    )
                    .label(format!("valid axes are {} to {}", -r, r - 1)),
                );
                return self.error_expr(span);
            }
            let Some(i) = self.axis(k, dims.len() + 1, sp, &v.ty) else { return self.error_expr(span) };
            dims.insert(i, Dim::constant(1));
            Some(i)
        } else {
            match ax {
                Some((k, sp)) => {
                    let Some(i) = self.axis(k, dims.len(), sp, &v.ty) else { return self.error_expr(span) };
                    if !dims[i].is_one() {
                        let ds = self.dim_str(&dims[i]);
                        self.error(
                            Diagnostic::error(
                                Code::E0306,
                                sp,
                                format!("cannot squeeze axis {k}: its size is {ds}, not 1"),
                            )
                            .with_secondary(a.pos[0].1, format!("this is {}", self.ty_str(&v.ty))),
                        );
                        return self.error_expr(span);
                    }
                    dims.remove(i);
                    Some(i)
                }
                None => {
                    dims.retain(|d| !d.is_one());
                    None
                }
            }
        };
        let shape = dims.into_iter().map(ShapeItem::Dim).collect();
        let attrs = Attrs { axis, ..Attrs::default() };
        self.prim(p, vec![v], attrs, Type::Tensor(TensorTy::new(e, shape)), span)
    }
}
