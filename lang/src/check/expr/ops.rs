//! Operators: unary and binary arithmetic, comparisons and logic with NumPy broadcasting,
//! matrix products, and model arithmetic.

use super::*;
use crate::types::unify::{matmul_shape, MatmulError};
use crate::types::TensorTy;

impl Checker {
    /// The source text of the `i32` operand when the other is a float literal (`0.1 * epoch`),
    /// for the help that suggests converting it.
    fn int_operand_of_float_literal(&self, ea: Elem, eb: Elem, aspan: Span, bspan: Span) -> Option<String> {
        let int_span = match (ea, eb) {
            (Elem::WeakFloat, Elem::T(ElemTy::I32)) => bspan,
            (Elem::T(ElemTy::I32), Elem::WeakFloat) => aspan,
            _ => return None,
        };
        let text = self.sources.text(int_span.file).get(int_span.start as usize..int_span.end as usize)?;
        (text.len() <= 40 && !text.contains('\n')).then(|| text.to_string())
    }

    pub(in crate::check) fn check_binary(
        &mut self,
        cx: &mut FnCx,
        op: BinOp,
        a: &ast::Expr,
        b: &ast::Expr,
        span: Span,
        expected: Option<&Type>,
    ) -> ir::Expr {
        let arithmetic = matches!(op, BinOp::Add | BinOp::Sub | BinOp::Mul | BinOp::Div | BinOp::Rem | BinOp::Pow);
        let (x, y) = if arithmetic {
            self.arithmetic_operands(cx, a, b, expected)
        } else {
            (self.check_expr(cx, a, None), self.check_expr(cx, b, None))
        };
        self.binary_op(op, None, x, y, span, a.span, b.span)
    }

    /// The operands of arithmetic (`x + y`, `maximum(x, y)`), checked against the expected type;
    /// a creation call (`ones(3)`, `zeros(N)`) takes its element type from the other operand, so
    /// `x * ones(3)` and `ones(3) * x` both work for an f64 `x`.
    pub(in crate::check) fn arithmetic_operands(
        &mut self,
        cx: &mut FnCx,
        a: &ast::Expr,
        b: &ast::Expr,
        expected: Option<&Type>,
    ) -> (ir::Expr, ir::Expr) {
        let from = |v: &ir::Expr| match &v.ty {
            Type::Tensor(TensorTy { elem: e @ Elem::T(_), .. }) => Some(Type::tensor_of(*e, vec![])),
            _ => None,
        };
        if expected.is_none() && is_creation(a) && !is_creation(b) {
            let y = self.check_expr(cx, b, None);
            let ha = from(&y);
            return (self.check_expr(cx, a, ha.as_ref()), y);
        }
        let x = self.check_expr(cx, a, expected);
        let hb = expected.cloned().or_else(|| from(&x));
        let y = self.check_expr(cx, b, hb.as_ref());
        (x, y)
    }

    /// `x op y`, or with `name` the builtin of that name that shares the operator's rule
    /// (`maximum(x, y)`, which the messages then name).
    #[allow(clippy::too_many_arguments)]
    pub(in crate::check) fn binary_op(
        &mut self,
        op: BinOp,
        name: Option<&'static str>,
        x: ir::Expr,
        y: ir::Expr,
        span: Span,
        aspan: Span,
        bspan: Span,
    ) -> ir::Expr {
        let prim = match op {
            BinOp::Add => Prim::Add,
            BinOp::Sub => Prim::Sub,
            BinOp::Mul => Prim::Mul,
            BinOp::Div => Prim::Div,
            BinOp::Rem => Prim::Rem,
            BinOp::Pow => Prim::Pow,
            BinOp::MatMul => Prim::MatMul,
            BinOp::Eq => Prim::Eq,
            BinOp::Ne => Prim::Ne,
            BinOp::Lt => Prim::Lt,
            BinOp::Le => Prim::Le,
            BinOp::Gt => Prim::Gt,
            BinOp::Ge => Prim::Ge,
            BinOp::And => Prim::And,
            BinOp::Or => Prim::Or,
        };
        if x.ty.has_error() || y.ty.has_error() {
            return self.prim(prim, vec![x, y], Attrs::default(), Type::Error, span);
        }
        let what = match name {
            Some(n) => format!("`{n}`"),
            None => format!("operator `{}`", op.symbol()),
        };
        // Model arithmetic: field by field, or scaling by a scalar.
        if x.ty.is_model() || y.ty.is_model() {
            return self.model_arith(op, prim, x, y, span, aspan, bspan);
        }
        let (Some((ea, sa)), Some((eb, sb))) = (x.ty.as_tensor(), y.ty.as_tensor()) else {
            let (xs, ys) = (self.ty_str(&x.ty), self.ty_str(&y.ty));
            self.error(
                Diagnostic::error(Code::E0318, span, format!("{what} cannot be applied to {xs} and {ys}"))
                    .with_secondary(aspan, xs)
                    .with_secondary(bspan, ys),
            );
            return self.error_expr(span);
        };
        let (sa, sb) = (sa.clone(), sb.clone());
        if op == BinOp::MatMul {
            return self.matmul(x, y, ea, eb, &sa, &sb, span, aspan, bspan);
        }
        let Some(elem) = join_elem(ea, eb) else {
            self.error(
                Diagnostic::error(
                    if ea.is_weak() || eb.is_weak() { Code::E0322 } else { Code::E0303 },
                    span,
                    match name {
                        Some(n) => format!("`{n}`: element types differ: {} and {}", ea.name(), eb.name()),
                        None => format!("element types differ: {} {} {}", ea.name(), op.symbol(), eb.name()),
                    },
                )
                .with_secondary(aspan, ea.name())
                .with_secondary(bspan, eb.name())
                .with_help(
                    if let Some(other) = self.int_operand_of_float_literal(ea, eb, aspan, bspan) {
                        // `0.1 * epoch` almost always means float arithmetic, not an integer literal.
                        format!(
                            "to compute in floating point, convert the i32 operand: `f32({other})`; for integer \
                         arithmetic write the literal as an integer"
                        )
                    } else if ea.is_weak() || eb.is_weak() {
                        "write the literal in the other operand's type (e.g. `2` instead of `2.0` for i32)".to_string()
                    } else {
                        format!(
                            "msl never converts implicitly; write `{}(…)` around one operand",
                            ea.materialise().name()
                        )
                    },
                ),
            );
            return self.error_expr(span);
        };
        let logical = matches!(op, BinOp::And | BinOp::Or);
        let compare = matches!(op, BinOp::Eq | BinOp::Ne | BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge);
        let is_bool = elem == Elem::T(ElemTy::Bool);
        let bad = if logical {
            !is_bool
        } else if compare {
            is_bool && !matches!(op, BinOp::Eq | BinOp::Ne)
        } else {
            is_bool
        };
        if bad {
            self.error(
                Diagnostic::error(Code::E0318, span, format!("{what} cannot be applied to {} values", elem.name()))
                    .label(if logical { "needs bool operands" } else { "needs numeric operands" }),
            );
            return self.error_expr(span);
        }
        let shape = match broadcast(&sa, &sb) {
            Ok(s) => s,
            Err(e) => {
                self.broadcast_error(&x.ty, &y.ty, e, span, aspan, bspan);
                return self.error_expr(span);
            }
        };
        let out_elem = if compare { Elem::T(ElemTy::Bool) } else { elem };
        // Weak operands take the concrete element type of the other side.
        let (x, y) = if let Elem::T(t) = elem {
            let xt = Type::Tensor(TensorTy::new(Elem::T(t), sa.clone()));
            let yt = Type::Tensor(TensorTy::new(Elem::T(t), sb.clone()));
            (self.cast_weak(x, &xt), self.cast_weak(y, &yt))
        } else {
            (x, y)
        };
        self.prim(prim, vec![x, y], Attrs::default(), Type::Tensor(TensorTy::new(out_elem, shape)), span)
    }

    pub(in crate::check) fn cast_weak(&mut self, v: ir::Expr, t: &Type) -> ir::Expr {
        match &v.ty {
            Type::Tensor(TensorTy { elem: e, .. }) if e.is_weak() => self.cast_to(v, t),
            _ => v,
        }
    }

    pub(in crate::check) fn broadcast_error(
        &mut self,
        a: &Type,
        b: &Type,
        e: BroadcastError,
        span: Span,
        aspan: Span,
        bspan: Span,
    ) {
        let (xs, ys) = (self.ty_str(a), self.ty_str(b));
        let fixed_rank = |t: &Type| match t {
            Type::Tensor(TensorTy { shape: s, .. }) if !s.iter().any(|i| matches!(i, ShapeItem::Rest(_))) => {
                Some(s.len())
            }
            _ => None,
        };
        let ranks = (fixed_rank(a), fixed_rank(b));
        let msg = match e {
            BroadcastError::Dims { from_end, a, b } => {
                let which = match ranks {
                    _ if from_end == 1 => "the last dimension".to_string(),
                    // Same rank: count from the front, as people index.
                    (Some(ra), Some(rb)) if ra == rb => format!("dimension {}", ra - from_end),
                    _ => format!("dimension {from_end} from the end"),
                };
                format!(
                    "shapes {xs} and {ys} do not broadcast: {} vs {} in {which}",
                    self.dim_str(&a),
                    self.dim_str(&b),
                )
            }
            BroadcastError::Rest => "rank-polymorphic shapes do not broadcast: their `..` rests differ".to_string(),
        };
        self.error(
            Diagnostic::error(Code::E0302, span, msg)
                .with_secondary(aspan, format!("this is {xs}"))
                .with_secondary(bspan, format!("this is {ys}"))
                .with_help("dims must be equal or one of them 1 (aligned from the right)"),
        );
    }

    #[allow(clippy::too_many_arguments)]
    pub(in crate::check) fn matmul(
        &mut self,
        x: ir::Expr,
        y: ir::Expr,
        ea: Elem,
        eb: Elem,
        sa: &[ShapeItem],
        sb: &[ShapeItem],
        span: Span,
        aspan: Span,
        bspan: Span,
    ) -> ir::Expr {
        let Some(elem) = join_elem(ea, eb).filter(|e| e.is_numeric()) else {
            self.error(
                Diagnostic::error(
                    Code::E0303,
                    span,
                    format!("matmul element types differ: {} @ {}", ea.name(), eb.name()),
                )
                .with_secondary(aspan, ea.name())
                .with_secondary(bspan, eb.name()),
            );
            return self.error_expr(span);
        };
        let shape = match matmul_shape(sa, sb) {
            Ok(shape) => shape,
            Err(MatmulError::Scalar) => {
                self.error(
                    Diagnostic::error(Code::E0305, span, "`@` needs operands of rank ≥ 1; use `*` for scalars")
                        .with_secondary(if sa.is_empty() { aspan } else { bspan }, "this is a scalar"),
                );
                return self.error_expr(span);
            }
            Err(MatmulError::Rest) => {
                self.error(Diagnostic::error(
                    Code::E0305,
                    span,
                    "`@` needs fixed matrix dims, not `..` rests, in its last two positions",
                ));
                return self.error_expr(span);
            }
            Err(MatmulError::Inner(k1, k2)) => {
                let (ks1, ks2) = (self.dim_str(&k1), self.dim_str(&k2));
                let (xs, ys) = (self.ty_str(&x.ty), self.ty_str(&y.ty));
                self.error(
                    Diagnostic::error(Code::E0301, span, format!("matmul inner dimensions differ: {ks1} vs {ks2}"))
                        .with_secondary(aspan, format!("this is {xs}"))
                        .with_secondary(bspan, format!("this is {ys}")),
                );
                return self.error_expr(span);
            }
            Err(MatmulError::Batch(e)) => {
                // The batch dims (all but the last two) broadcast; say so, with both types.
                let (xs, ys) = (self.ty_str(&x.ty), self.ty_str(&y.ty));
                let why = match e {
                    BroadcastError::Dims { a, b, .. } => format!("{} vs {}", self.dim_str(&a), self.dim_str(&b)),
                    BroadcastError::Rest => "their `..` rests differ".to_string(),
                };
                self.error(
                    Diagnostic::error(
                        Code::E0302,
                        span,
                        format!("matmul batch dimensions do not broadcast: {why} ({xs} @ {ys})"),
                    )
                    .with_secondary(aspan, format!("this is {xs}"))
                    .with_secondary(bspan, format!("this is {ys}"))
                    .with_help("`@` multiplies the last two dims; the dims before them broadcast like `+`"),
                );
                return self.error_expr(span);
            }
        };
        let (x, y) = if let Elem::T(t) = elem {
            let xt = Type::Tensor(TensorTy::new(Elem::T(t), sa.to_vec()));
            let yt = Type::Tensor(TensorTy::new(Elem::T(t), sb.to_vec()));
            (self.cast_weak(x, &xt), self.cast_weak(y, &yt))
        } else {
            (x, y)
        };
        self.prim(Prim::MatMul, vec![x, y], Attrs::default(), Type::Tensor(TensorTy::new(elem, shape)), span)
    }

    #[allow(clippy::too_many_arguments)]
    pub(in crate::check) fn model_arith(
        &mut self,
        op: BinOp,
        prim: Prim,
        x: ir::Expr,
        y: ir::Expr,
        span: Span,
        aspan: Span,
        bspan: Span,
    ) -> ir::Expr {
        let ok_op = matches!(op, BinOp::Add | BinOp::Sub | BinOp::Mul | BinOp::Div);
        let scalar = |t: &Type| matches!(t, Type::Tensor(TensorTy { elem: e, shape: s, .. }) if s.is_empty() && e.is_float() || (s.is_empty() && *e == Elem::WeakInt));
        let ty = if !ok_op {
            None
        } else if x.ty.is_model() && y.ty.is_model() {
            (x.ty == y.ty).then(|| x.ty.clone())
        } else if x.ty.is_model() && scalar(&y.ty) {
            Some(x.ty.clone())
        } else if y.ty.is_model() && scalar(&x.ty) && op != BinOp::Div {
            Some(y.ty.clone())
        } else {
            None
        };
        match ty {
            Some(t) => {
                let f32t = Type::scalar(ElemTy::F32);
                let x = if x.ty.is_model() { x } else { self.cast_weak(x, &f32t) };
                let y = if y.ty.is_model() { y } else { self.cast_weak(y, &f32t) };
                self.prim(prim, vec![x, y], Attrs::default(), t, span)
            }
            None => {
                let (xs, ys) = (self.ty_str(&x.ty), self.ty_str(&y.ty));
                self.error(
                    Diagnostic::error(
                        Code::E0321,
                        span,
                        format!("model arithmetic `{}` is not defined for {xs} and {ys}", op.symbol()),
                    )
                    .with_secondary(aspan, xs)
                    .with_secondary(bspan, ys)
                    .with_help("models support `+ - * /` with a model of the same type, and scaling by a float scalar"),
                );
                self.error_expr(span)
            }
        }
    }
}

/// A call of a builtin that creates a tensor and can take its element type from context.
fn is_creation(e: &ast::Expr) -> bool {
    const CREATION: &[&str] =
        &["zeros", "ones", "full", "eye", "arange", "normal", "uniform", "he_normal", "glorot_uniform", "one_hot"];
    matches!(&e.kind, ast::ExprKind::Call(f, _) if matches!(&f.kind, ast::ExprKind::Name(n) if CREATION.contains(&n.as_str())))
}
