//! `jacfwd(f)(x)`, `jacrev(f)(x)` and `hessian(f)(x)`, as in JAX: the Jacobian of a function of
//! one float tensor, shaped `[out…, in…]`. They are written as the transforms that already
//! compose (so they differentiate, batch and shard like them): `jacfwd` is `vmap` of `jvp` over
//! the basis of the input (one forward sweep per input element), `jacrev` is `vmap` of `grad`
//! of `sum(f(y) * e)` over the basis of the output (one reverse sweep per output element), and
//! `hessian(f)` is `jacfwd(grad(f))`.

use super::*;

/// The Jacobian builtins.
pub(crate) const JACOBIANS: &[&str] = &["jacfwd", "jacrev", "hessian"];

fn name(n: &str, span: Span) -> ast::Expr {
    ast::Expr::new(ast::ExprKind::Name(n.to_string()), span)
}

fn call(f: ast::Expr, args: Vec<ast::Expr>, span: Span) -> ast::Expr {
    let args = args.into_iter().map(|value| ast::Arg { name: None, value }).collect();
    ast::Expr::new(ast::ExprKind::Call(Box::new(f), args), span)
}

fn builtin(n: &str, args: Vec<ast::Expr>, span: Span) -> ast::Expr {
    call(name(n, span), args, span)
}

fn list(items: Vec<ast::Expr>, span: Span) -> ast::Expr {
    ast::Expr::new(ast::ExprKind::List(items), span)
}

fn closure(param: &str, body: ast::Expr, span: Span) -> ast::Expr {
    let p = ast::Param { name: ast::Ident { name: param.to_string(), span }, ty: None, default: None };
    ast::Expr::new(ast::ExprKind::Closure { params: vec![p], body: Box::new(body) }, span)
}

/// `vmap(f, in_axes: (0,))(batch)`.
fn vmap0(f: ast::Expr, batch: ast::Expr, span: Span) -> ast::Expr {
    let zero = ast::Expr::new(ast::ExprKind::Int(0), span);
    let axes = ast::Expr::new(ast::ExprKind::Tuple(vec![zero]), span);
    let v = ast::Expr::new(
        ast::ExprKind::Call(
            Box::new(name("vmap", span)),
            vec![
                ast::Arg { name: None, value: f },
                ast::Arg { name: Some(ast::Ident { name: "in_axes".to_string(), span }), value: axes },
            ],
        ),
        span,
    );
    call(v, vec![batch], span)
}

impl Checker {
    /// `J(f)(x)` for `J` one of [`JACOBIANS`]. `None` when `callee` is not such a call.
    pub(crate) fn check_jacobian(
        &mut self,
        cx: &mut FnCx,
        callee: &ast::Expr,
        args: &[ast::Arg],
        span: Span,
    ) -> Option<ir::Expr> {
        let ast::ExprKind::Call(j, jargs) = &callee.kind else { return None };
        let ast::ExprKind::Name(which) = &j.kind else { return None };
        if !JACOBIANS.contains(&which.as_str()) || cx.lookup(which).is_some() {
            return None;
        }
        if self.scopes[cx.module.0 as usize].contains_key(which) {
            return None;
        }
        let bad = |c: &mut Checker, sp: Span, msg: String| {
            c.error(Diagnostic::error(Code::E0404, sp, msg).label(format!("in this `{which}`")));
            Some(c.error_expr(span))
        };
        let ([f], [x]) = (jargs.as_slice(), args) else {
            return bad(self, span, format!("`{which}(f)(x)` takes one function and one argument"));
        };
        if f.name.is_some() || x.name.is_some() {
            return bad(self, span, format!("`{which}(f)(x)` takes no named arguments"));
        }
        let f = if which == "hessian" { builtin("grad", vec![f.value.clone()], f.value.span) } else { f.value.clone() };
        // The shapes of the input and of the result decide the basis and the final shape.
        let before = self.diags.len();
        let xv = self.check_expr(cx, &x.value, None);
        let yv = self.check_expr(cx, &call(f.clone(), vec![x.value.clone()], span), None);
        if self.diags.len() > before || xv.ty.has_error() || yv.ty.has_error() {
            return Some(self.error_expr(span));
        }
        let dims = |c: &mut Checker, t: &Type, what: &str| -> Option<Vec<ast::Expr>> {
            let Type::Tensor(tt) = t else {
                let ts = c.ty_str(t);
                bad(c, span, format!("`{which}` needs {what} to be a float tensor, found {ts}"));
                return None;
            };
            if !tt.elem.is_float() {
                let ts = c.ty_str(t);
                bad(c, span, format!("`{which}` needs {what} to be a float tensor, found {ts}"));
                return None;
            }
            let mut out = Vec::new();
            for item in &tt.shape {
                let ShapeItem::Dim(d) = item else {
                    bad(c, span, format!("`{which}` needs {what} of known rank"));
                    return None;
                };
                let e = match (d.as_const(), d.as_var()) {
                    (Some(n), _) => ast::ExprKind::Int(n),
                    (None, Some(s)) => ast::ExprKind::Name(c.names().sym(s)),
                    _ => {
                        let ds = c.dim_str(d);
                        bad(c, span, format!("`{which}` needs {what}'s dims to be sizes or dim names, found {ds}"));
                        return None;
                    }
                };
                out.push(ast::Expr::new(e, span));
            }
            Some(out)
        };
        let ins = dims(self, &xv.ty, "its argument")?;
        let outs = dims(self, &yv.ty, "the function's result")?;
        let total = |ds: &[ast::Expr]| {
            ds.iter()
                .cloned()
                .reduce(|a, b| ast::Expr::new(ast::ExprKind::Binary(ast::BinOp::Mul, Box::new(a), Box::new(b)), span))
        };
        // A basis of `n` tensors of shape `ds`: `reshape(eye(n), [n, ds…])`.
        let basis = |ds: &[ast::Expr]| {
            let n = total(ds).unwrap_or_else(|| ast::Expr::new(ast::ExprKind::Int(1), span));
            let mut shape = vec![n.clone()];
            shape.extend(ds.iter().cloned());
            builtin("reshape", vec![builtin("eye", vec![n], span), list(shape, span)], span)
        };
        let mut result_shape = outs.clone();
        result_shape.extend(ins.iter().cloned());
        let gx = "__jacobian_x";
        let body = if which == "jacrev" {
            if outs.is_empty() {
                // A scalar function: its gradient.
                call(builtin("grad", vec![f], span), vec![name(gx, span)], span)
            } else {
                // Row i: the gradient of the i-th output element, `grad(|y| sum(f(y) * e_i))(x)`.
                let dot = builtin(
                    "sum",
                    vec![ast::Expr::new(
                        ast::ExprKind::Binary(
                            ast::BinOp::Mul,
                            Box::new(call(f, vec![name("__jacobian_y", span)], span)),
                            Box::new(name("__jacobian_e", span)),
                        ),
                        span,
                    )],
                    span,
                );
                let g =
                    call(builtin("grad", vec![closure("__jacobian_y", dot, span)], span), vec![name(gx, span)], span);
                let rows = vmap0(closure("__jacobian_e", g, span), basis(&outs), span);
                builtin("reshape", vec![rows, list(result_shape, span)], span)
            }
        } else {
            // Column j: the tangent of the output along the j-th input element.
            let primals = ast::Expr::new(ast::ExprKind::Tuple(vec![name(gx, span)]), span);
            let tangents = ast::Expr::new(ast::ExprKind::Tuple(vec![name("__jacobian_v", span)]), span);
            let jvp = builtin("jvp", vec![f, primals, tangents], span);
            let col = ast::Expr::new(ast::ExprKind::TupleIndex(Box::new(jvp), 1, span), span);
            let cols = vmap0(closure("__jacobian_v", col, span), basis(&ins), span);
            // [n_in, out…] → [out…, n_in] → [out…, in…].
            let k = outs.len();
            let moved = if k == 0 {
                cols
            } else {
                let mut perm: Vec<ast::Expr> =
                    (1..=k as i64).map(|i| ast::Expr::new(ast::ExprKind::Int(i), span)).collect();
                perm.push(ast::Expr::new(ast::ExprKind::Int(0), span));
                builtin("permute", vec![cols, list(perm, span)], span)
            };
            builtin("reshape", vec![moved, list(result_shape, span)], span)
        };
        let bind = ast::Stmt {
            kind: ast::StmtKind::Let {
                pat: ast::Pattern::Name(ast::Ident { name: gx.to_string(), span }),
                ty: None,
                value: x.value.clone(),
            },
            span,
        };
        let result = ast::Stmt { kind: ast::StmtKind::Expr(body), span };
        let block = ast::Expr::new(ast::ExprKind::Block(ast::Block { stmts: vec![bind, result], span }), span);
        Some(self.check_expr(cx, &block, None))
    }
}
