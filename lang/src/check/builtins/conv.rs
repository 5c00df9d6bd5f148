//! Shape rules of the convolution and pooling builtins over NCHW tensors: `conv2d` and its two
//! gradients, `max_pool2d`, `avg_pool2d` and theirs (`spec/cnn.md`).
//!
//! Strides, paddings and windows are integers known at compile time. The output size follows
//! PyTorch, `(H + 2p - K) / s + 1` with floor division. Dims are polynomials, which have no
//! floor: when `H` and `K` are constants the size is computed; when they are symbolic the type
//! holds the exact division (the same thing when `s` is 1), and a run whose sizes the stride does
//! not divide stops with `E0602` (the interpreter compares the kernel's size with the type's).

use super::*;
use crate::types::unify::window_out_size as out_size;

/// A checked float tensor operand of rank 4 (or `rank`): its expression and dims.
type Operand = (ir::Expr, Elem, Vec<Dim>);

/// The four pooling primitives, which share one checking rule.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Pool {
    Max,
    MaxGrad,
    Avg,
    AvgGrad,
}

impl Pool {
    fn prim(self) -> Prim {
        match self {
            Pool::Max => Prim::MaxPool2d,
            Pool::MaxGrad => Prim::MaxPool2dGrad,
            Pool::Avg => Prim::AvgPool2d,
            Pool::AvgGrad => Prim::AvgPool2dGrad,
        }
    }
}

impl Checker {
    /// One tensor operand of a convolution or pooling: float, of the given rank.
    fn window_operand(
        &mut self,
        cx: &mut FnCx,
        name: &str,
        (e, span): (&ast::Expr, Span),
        rank: usize,
        what: &str,
    ) -> Option<Operand> {
        let v = self.check_expr(cx, e, None);
        let v = self.materialise(v);
        let (el, s) = self.tensor_of(&v, span, name)?;
        let s = s.clone();
        let d = self.fixed_dims(&s, span, name)?;
        if !el.is_float() {
            let ts = self.ty_str(&v.ty);
            self.error(
                Diagnostic::error(Code::E0318, span, format!("`{name}` needs a float tensor, found {ts}"))
                    .label(ts)
                    .with_help("convert it with `f32(…)`"),
            );
            return None;
        }
        if d.len() != rank {
            let ts = self.ty_str(&v.ty);
            self.error(
                Diagnostic::error(Code::E0305, span, format!("`{name}` needs {what} of rank {rank}, found {ts}"))
                    .label(format!("rank {}", d.len())),
            );
            return None;
        }
        Some((v, el, d))
    }

    /// Operands of one element type, or `E0303`.
    fn same_elem(&mut self, name: &str, a: Elem, (b, span): (Elem, Span)) -> bool {
        if a != b {
            self.error(
                Diagnostic::error(
                    Code::E0303,
                    span,
                    format!("`{name}` operands have different element types: {} and {}", a.name(), b.name()),
                )
                .label(b.name()),
            );
            return false;
        }
        true
    }

    /// Two dims that must agree (`E0306`): channels, output channels, sizes.
    fn dims_agree(&mut self, name: &str, what: &str, (a, b): (&Dim, &Dim), span: Span) -> bool {
        if a != b {
            let (x, y) = (self.dim_str(a), self.dim_str(b));
            self.error(
                Diagnostic::error(Code::E0306, span, format!("`{name}`: {what} differ: {x} vs {y}"))
                    .label(format!("{y} here")),
            );
            return false;
        }
        true
    }

    /// A named compile-time integer at least `min` (`stride: 2`), or its default.
    fn window_int(&mut self, cx: &FnCx, a: &Args, (name, arg): (&str, &str), default: i64, min: i64) -> Option<i64> {
        let Some(e) = self.named(a, arg) else { return Some(default) };
        let v = self.const_int(cx, e, arg)?;
        if v < min {
            self.error(
                Diagnostic::error(Code::E0328, e.span, format!("`{name}`: `{arg}` must be at least {min}, found {v}"))
                    .label("out of range"),
            );
            return None;
        }
        Some(v)
    }

    /// A named list of two dims (`size: [H, W]`, `kernel: [KH, KW]`), required.
    fn dim_pair(&mut self, cx: &FnCx, a: &Args, name: &str, arg: &str, span: Span) -> Option<Vec<Dim>> {
        let Some(e) = self.named(a, arg) else {
            self.error(Diagnostic::error(Code::E0212, span, format!("`{name}` needs `{arg}: [d, d]`")));
            return None;
        };
        let ast::ExprKind::List(items) = &e.kind else {
            self.error(Diagnostic::error(Code::E0323, e.span, format!("`{name}`: `{arg}` must be a list `[d, d]`")));
            return None;
        };
        if items.len() != 2 {
            self.error(Diagnostic::error(Code::E0323, e.span, format!("`{name}`: `{arg}` needs two dims")));
            return None;
        }
        let items: Vec<(&ast::Expr, Span)> = items.iter().map(|i| (i, i.span)).collect();
        self.dim_args(cx, &items, name)
    }

    /// Checks that a window of `k` fits the size `n` padded by `p` where both are known
    /// (`E0328`), and gives the output size.
    fn window_out(&mut self, name: &str, (n, k): (&Dim, &Dim), s: i64, p: i64, span: Span) -> Option<Dim> {
        if let (Some(nv), Some(kv)) = (n.as_const(), k.as_const()) {
            if kv < 1 || kv > nv + 2 * p {
                let pad = if p > 0 { format!(" padded by {p} ({})", nv + 2 * p) } else { String::new() };
                self.error(
                    Diagnostic::error(
                        Code::E0328,
                        span,
                        format!("`{name}`: the window of size {kv} does not fit the input size {nv}{pad}"),
                    )
                    .label("window larger than its input"),
                );
                return None;
            }
        }
        Some(out_size(n, k, s, p))
    }

    /// `conv2d(x, w)`, `conv2d(x, w, b)` with `stride:` (default 1) and `padding:` (default 0).
    pub(super) fn check_conv2d(&mut self, cx: &mut FnCx, a: &Args, span: Span) -> ir::Expr {
        let name = "conv2d";
        self.check_named(name, a, &["stride", "padding"]);
        if !self.arity(name, a, 2, 3, span) {
            return self.error_expr(span);
        }
        let x = self.window_operand(cx, name, a.pos[0], 4, "an input `[N, C, H, W]`");
        let w = self.window_operand(cx, name, a.pos[1], 4, "weights `[O, C, KH, KW]`");
        let b = match a.pos.get(2) {
            Some(&p) => self.window_operand(cx, name, p, 1, "a bias `[O]`").map(Some),
            None => Some(None),
        };
        let s = self.window_int(cx, a, (name, "stride"), 1, 1);
        let p = self.window_int(cx, a, (name, "padding"), 0, 0);
        let (Some((x, xe, xd)), Some((w, we, wd)), Some(b), Some(s), Some(p)) = (x, w, b, s, p) else {
            return self.error_expr(span);
        };
        if !self.same_elem(name, xe, (we, a.pos[1].1))
            || !self.dims_agree(name, "input channels", (&xd[1], &wd[1]), a.pos[1].1)
        {
            return self.error_expr(span);
        }
        if let Some((_, be, bd)) = &b {
            if !self.same_elem(name, xe, (*be, a.pos[2].1))
                || !self.dims_agree(name, "output channels", (&wd[0], &bd[0]), a.pos[2].1)
            {
                return self.error_expr(span);
            }
        }
        let (Some(oh), Some(ow)) =
            (self.window_out(name, (&xd[2], &wd[2]), s, p, span), self.window_out(name, (&xd[3], &wd[3]), s, p, span))
        else {
            return self.error_expr(span);
        };
        let dims = vec![xd[0].clone(), wd[0].clone(), oh, ow];
        let ty = Type::tensor_of(xe, dims.into_iter().map(ShapeItem::Dim).collect());
        let attrs = Attrs { perm: vec![s as usize, p as usize], ..Attrs::default() };
        let conv = self.prim(Prim::Conv2d, vec![x, w], attrs, ty.clone(), span);
        match b {
            None => conv,
            Some((b, be, bd)) => {
                let shape = vec![Dim::constant(1), bd[0].clone(), Dim::constant(1), Dim::constant(1)];
                let bty = Type::tensor_of(be, shape.iter().cloned().map(ShapeItem::Dim).collect());
                let b = self.prim(Prim::Reshape, vec![b], Attrs { shape, ..Attrs::default() }, bty, span);
                self.prim(Prim::Add, vec![conv, b], Attrs::default(), ty, span)
            }
        }
    }

    /// `conv2d_input_grad(g, w, size: [H, W], stride:, padding:)` and
    /// `conv2d_weight_grad(x, g, kernel: [KH, KW], stride:, padding:)`.
    pub(super) fn check_conv2d_grad(&mut self, cx: &mut FnCx, q: Prim, a: &Args, span: Span) -> ir::Expr {
        let name = q.name();
        let input = q == Prim::Conv2dInputGrad;
        let sizes = if input { "size" } else { "kernel" };
        self.check_named(name, a, &[sizes, "stride", "padding"]);
        if !self.arity(name, a, 2, 2, span) {
            return self.error_expr(span);
        }
        let (w0, w1) = if input {
            ("a gradient `[N, O, OH, OW]`", "weights `[O, C, KH, KW]`")
        } else {
            ("an input `[N, C, H, W]`", "a gradient `[N, O, OH, OW]`")
        };
        let u = self.window_operand(cx, name, a.pos[0], 4, w0);
        let v = self.window_operand(cx, name, a.pos[1], 4, w1);
        let pair = self.dim_pair(cx, a, name, sizes, span);
        let s = self.window_int(cx, a, (name, "stride"), 1, 1);
        let p = self.window_int(cx, a, (name, "padding"), 0, 0);
        let (Some((u, ue, ud)), Some((v, ve, vd)), Some(pair), Some(s), Some(p)) = (u, v, pair, s, p) else {
            return self.error_expr(span);
        };
        if !self.same_elem(name, ue, (ve, a.pos[1].1)) {
            return self.error_expr(span);
        }
        // The input `[N, C, H, W]`, weights `[O, C, KH, KW]` and gradient `[N, O, OH, OW]`.
        let (g, (n, c, h, wd), (o, kh, kw)) = if input {
            (&ud, (&ud[0], &vd[1], &pair[0], &pair[1]), (&vd[0], &vd[2], &vd[3]))
        } else {
            (&vd, (&ud[0], &ud[1], &ud[2], &ud[3]), (&vd[1], &pair[0], &pair[1]))
        };
        let ok = if input {
            self.dims_agree(name, "output channels", (&ud[1], o), a.pos[1].1)
        } else {
            self.dims_agree(name, "batch sizes", (&ud[0], &vd[0]), a.pos[1].1)
        };
        if !ok {
            return self.error_expr(span);
        }
        let (Some(oh), Some(ow)) =
            (self.window_out(name, (h, kh), s, p, span), self.window_out(name, (wd, kw), s, p, span))
        else {
            return self.error_expr(span);
        };
        let gpos = if input { a.pos[0].1 } else { a.pos[1].1 };
        if !self.dims_agree(name, "gradient heights", (&oh, &g[2]), gpos)
            || !self.dims_agree(name, "gradient widths", (&ow, &g[3]), gpos)
        {
            return self.error_expr(span);
        }
        let dims = if input { vec![n, c, h, wd] } else { vec![o, c, kh, kw] };
        let ty = Type::tensor_of(ue, dims.into_iter().cloned().map(ShapeItem::Dim).collect());
        let attrs = Attrs { perm: vec![s as usize, p as usize], shape: pair, ..Attrs::default() };
        self.prim(q, vec![u, v], attrs, ty, span)
    }

    /// `max_pool2d(x[, v], kernel: k, stride: s)`, `avg_pool2d(x, kernel:, stride:)`,
    /// `max_pool2d_grad(x, g, …)` and `avg_pool2d_grad(g, size: [H, W], …)`; the stride
    /// defaults to the window, as in PyTorch.
    pub(super) fn check_pool2d(&mut self, cx: &mut FnCx, pool: Pool, a: &Args, span: Span) -> ir::Expr {
        let q = pool.prim();
        let name = q.name();
        let named: &[&str] = if pool == Pool::AvgGrad { &["size", "kernel", "stride"] } else { &["kernel", "stride"] };
        self.check_named(name, a, named);
        let (lo, hi) = match pool {
            Pool::Max => (1, 2),
            Pool::MaxGrad => (2, 2),
            Pool::Avg | Pool::AvgGrad => (1, 1),
        };
        if !self.arity(name, a, lo, hi, span) {
            return self.error_expr(span);
        }
        let Some(kexpr) = self.named(a, "kernel") else {
            self.error(Diagnostic::error(Code::E0212, span, format!("`{name}` needs `kernel: k`")));
            return self.error_expr(span);
        };
        let k = self.window_int(cx, a, (name, "kernel"), 1, 1);
        let s = match k {
            Some(k) => self.window_int(cx, a, (name, "stride"), k, 1),
            None => None,
        };
        let x = self.window_operand(cx, name, a.pos[0], 4, "a tensor `[N, C, H, W]`");
        let second = match a.pos.get(1) {
            Some(&p) => self.window_operand(cx, name, p, 4, "a tensor `[N, C, …]`").map(Some),
            None => Some(None),
        };
        let size = if pool == Pool::AvgGrad { self.dim_pair(cx, a, name, "size", span) } else { Some(vec![]) };
        let (Some(k), Some(s), Some((x, xe, xd)), Some(second), Some(size)) = (k, s, x, second, size) else {
            return self.error_expr(span);
        };
        let kd = Dim::constant(k);
        let kspan = kexpr.span;
        // The input's spatial size: the operand's, or `size:` for the adjoint of averaging.
        let (h, w) = if pool == Pool::AvgGrad { (&size[0], &size[1]) } else { (&xd[2], &xd[3]) };
        let (Some(oh), Some(ow)) =
            (self.window_out(name, (h, &kd), s, 0, kspan), self.window_out(name, (w, &kd), s, 0, kspan))
        else {
            return self.error_expr(span);
        };
        let pooled = vec![xd[0].clone(), xd[1].clone(), oh.clone(), ow.clone()];
        let mut args = vec![x];
        if let Some((v, ve, vd)) = second {
            if !self.same_elem(name, xe, (ve, a.pos[1].1)) {
                return self.error_expr(span);
            }
            // `max_pool2d(x, v)` picks from a `v` shaped like `x`; the adjoint's `g` is pooled.
            let want = if pool == Pool::Max { &xd } else { &pooled };
            for i in 0..4 {
                if !self.dims_agree(name, "operand sizes", (&want[i], &vd[i]), a.pos[1].1) {
                    return self.error_expr(span);
                }
            }
            args.push(v);
        }
        if pool == Pool::AvgGrad
            && (!self.dims_agree(name, "gradient heights", (&oh, &xd[2]), a.pos[0].1)
                || !self.dims_agree(name, "gradient widths", (&ow, &xd[3]), a.pos[0].1))
        {
            return self.error_expr(span);
        }
        let dims = match pool {
            Pool::Max | Pool::Avg => pooled,
            Pool::MaxGrad => xd.clone(),
            Pool::AvgGrad => vec![xd[0].clone(), xd[1].clone(), size[0].clone(), size[1].clone()],
        };
        let ty = Type::tensor_of(xe, dims.into_iter().map(ShapeItem::Dim).collect());
        let attrs = Attrs { perm: vec![k as usize, s as usize], shape: size, ..Attrs::default() };
        self.prim(q, args, attrs, ty, span)
    }
}
