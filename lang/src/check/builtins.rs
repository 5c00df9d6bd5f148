//! Shape rules of the builtins (LANGUAGE.md §6), one arm per primitive, and the special forms
//! `init`, `grad`, `value_and_grad`, `jvp`, `vjp`, `vmap` and the conversions `f32(x)` ….

use super::call::lit_i32;
use super::expr::{mk, FnCx};
use super::Checker;
use crate::diag::{Code, Diagnostic};
use crate::ir::prim::{AxisArg, Reduces};
use crate::ir::{self, Attrs, ExprKind, Prim};
use crate::source::Span;
use crate::syntax::ast;
use crate::types::unify::broadcast;
use crate::types::TensorTy;
use crate::types::{Dim, Elem, ElemTy, FnTy, ShapeItem, Type};

mod attention;
mod compress;
mod conv;
mod create;
mod einsum;
mod index;
mod io;
mod shape;
mod sorting;
mod special;

/// Arguments of a builtin after checking: positional values and named ones (unchecked).
struct Args<'a> {
    pos: Vec<(&'a ast::Expr, Span)>,
    named: Vec<(&'a ast::Ident, &'a ast::Expr)>,
}

/// Checked operands of `gather`/`scatter_add`: values, their element type and shape, indices and
/// their shape.
type ValuesAndIndices = (ir::Expr, Elem, Vec<ShapeItem>, ir::Expr, Vec<ShapeItem>);

fn split(args: &[ast::Arg]) -> Args<'_> {
    let mut pos = Vec::new();
    let mut named = Vec::new();
    for a in args {
        match &a.name {
            None => pos.push((&a.value, a.value.span)),
            Some(n) => named.push((n, &a.value)),
        }
    }
    Args { pos, named }
}

impl Checker {
    /// Named arguments a builtin accepts; anything else is `E0212`.
    fn check_named(&mut self, name: &str, a: &Args, allowed: &[&str]) {
        for (n, _) in &a.named {
            if n.name == ".." {
                self.error(
                    Diagnostic::error(Code::E0212, n.span, format!("`{name}` takes no `..base`"))
                        .label("not a model constructor"),
                );
            } else if !allowed.contains(&n.name.as_str()) {
                let mut d = Diagnostic::error(Code::E0212, n.span, format!("`{name}` has no argument `{}`", n.name))
                    .label("unknown argument name");
                d = match super::suggest(&n.name, allowed.iter().copied()) {
                    Some(s) => d.with_help(format!("did you mean `{s}`?")),
                    None if allowed.is_empty() => d.with_help(format!("`{name}` takes no named arguments")),
                    None => d.with_help(format!("its named arguments are {}", allowed.join(", "))),
                };
                self.error(d);
            }
        }
    }

    fn named<'a>(&self, a: &Args<'a>, n: &str) -> Option<&'a ast::Expr> {
        a.named.iter().find(|(i, _)| i.name == n).map(|(_, e)| *e)
    }

    /// The named argument `n`, a run-time scalar of type `elem` (`at:`, `len:`, `sparsity:`),
    /// checked and converted; `None` when the call does not name it.
    fn named_scalar(&mut self, cx: &mut FnCx, a: &Args, n: &str, elem: ElemTy) -> Option<ir::Expr> {
        let e = self.named(a, n)?;
        let t = Type::scalar(elem);
        let v = self.check_expr(cx, e, Some(&t));
        Some(self.coerce_with(v, &t, e.span, Code::E0303, &format!("`{n}`")))
    }

    fn arity(&mut self, name: &str, a: &Args, min: usize, max: usize, span: Span) -> bool {
        let n = a.pos.len();
        if n < min || n > max {
            let want = if min == max {
                format!("{min}")
            } else if max == usize::MAX {
                format!("at least {min}")
            } else {
                format!("{min} to {max}")
            };
            self.error(
                Diagnostic::error(
                    Code::E0312,
                    span,
                    format!("`{name}` takes {want} argument{}, found {n}", if want == "1" { "" } else { "s" }),
                )
                .label("wrong number of arguments"),
            );
            return false;
        }
        true
    }

    /// A compile-time integer (an axis): a literal, possibly negative.
    fn const_int(&mut self, cx: &FnCx, e: &ast::Expr, what: &str) -> Option<i64> {
        match self.static_dim(cx, e).and_then(|d| d.as_const()) {
            Some(v) => Some(v),
            None => {
                let mut d =
                    Diagnostic::error(Code::E0323, e.span, format!("{what} must be an integer known at compile time"))
                        .label("not a constant");
                if what == "axis" && matches!(e.kind, ast::ExprKind::List(_) | ast::ExprKind::Tuple(_)) {
                    // Only the reductions take several axes (`sum(x, axis: (0, 2))`).
                    d = d
                        .label("one axis, not a list")
                        .with_help("this builtin takes one axis; reductions take several");
                }
                self.error(d);
                None
            }
        }
    }

    fn const_bool(&mut self, e: &ast::Expr, what: &str) -> Option<bool> {
        match e.kind {
            ast::ExprKind::Bool(b) => Some(b),
            _ => {
                self.error(Diagnostic::error(Code::E0323, e.span, format!("{what} must be `true` or `false`")));
                None
            }
        }
    }

    /// Normalises an axis (negative counts from the end) for a rank, or reports `E0309`.
    fn axis(&mut self, ax: i64, rank: usize, span: Span, ty: &Type) -> Option<usize> {
        let r = rank as i64;
        if ax >= r || ax < -r {
            let ts = self.ty_str(ty);
            self.error(
                Diagnostic::error(
                    Code::E0309,
                    span,
                    format!("axis {ax} is out of range for a tensor of rank {rank} ({ts})"),
                )
                .label(format!("valid axes are {} to {}", -r, r - 1)),
            );
            return None;
        }
        Some(if ax < 0 { (ax + r) as usize } else { ax as usize })
    }

    fn tensor_of<'t>(&mut self, v: &'t ir::Expr, span: Span, what: &str) -> Option<(Elem, &'t Vec<ShapeItem>)> {
        match &v.ty {
            Type::Tensor(TensorTy { elem: e, shape: s, .. }) => Some((*e, s)),
            Type::Error => None,
            t => {
                let ts = self.ty_str(t);
                self.error(
                    Diagnostic::error(Code::E0304, span, format!("`{what}` needs a tensor, found {ts}")).label(ts),
                );
                None
            }
        }
    }

    fn fixed_dims(&mut self, s: &[ShapeItem], span: Span, what: &str) -> Option<Vec<Dim>> {
        let mut out = Vec::new();
        for i in s {
            match i {
                ShapeItem::Dim(d) => out.push(d.clone()),
                ShapeItem::Rest(_) => {
                    self.error(Diagnostic::error(
                        Code::E0305,
                        span,
                        format!("{what} needs a tensor of known rank, not one with a `..` rest"),
                    ));
                    return None;
                }
            }
        }
        Some(out)
    }

    /// Dims given as arguments (`zeros(N, 64)`), known at compile time.
    fn dim_args(&mut self, cx: &FnCx, a: &[(&ast::Expr, Span)], what: &str) -> Option<Vec<Dim>> {
        let mut out = Vec::new();
        let mut ok = true;
        for (e, s) in a {
            match self.static_dim(cx, e) {
                Some(d) => {
                    if d.as_const().is_some_and(|v| v < 0) {
                        self.error(Diagnostic::error(
                            Code::E0323,
                            *s,
                            format!("`{what}`: a dimension cannot be negative"),
                        ));
                        ok = false;
                    }
                    out.push(d)
                }
                None => {
                    self.error(
                        Diagnostic::error(
                            Code::E0323,
                            *s,
                            format!("`{what}` needs dimensions known at compile time (integers or dim names)"),
                        )
                        .label("a run-time value")
                        .with_help("shapes are types in msl: use a dim such as `N` or a literal"),
                    );
                    ok = false;
                }
            }
        }
        ok.then_some(out)
    }

    /// The two tensor operands of `gather`/`scatter_add`: values of any type and i32 indices.
    fn values_and_indices(&mut self, cx: &mut FnCx, a: &Args, name: &str) -> Option<ValuesAndIndices> {
        let x = self.check_expr(cx, a.pos[0].0, None);
        let x = self.materialise(x);
        let idx = self.check_expr(cx, a.pos[1].0, None);
        let idx = self.materialise(idx);
        let (Some((e, xs)), Some((ie, is))) =
            (self.tensor_of(&x, a.pos[0].1, name), self.tensor_of(&idx, a.pos[1].1, name))
        else {
            return None;
        };
        let (xs, is) = (xs.clone(), is.clone());
        if ie != Elem::T(ElemTy::I32) {
            self.error(
                Diagnostic::error(
                    Code::E0303,
                    a.pos[1].1,
                    format!("`{name}` indices must be i32, found {}", ie.name()),
                )
                .with_help("convert them with `i32(…)`"),
            );
            return None;
        }
        Some((x, e, xs, idx, is))
    }

    fn elem_from_expected(expected: Option<&Type>, default: ElemTy) -> ElemTy {
        match expected {
            Some(Type::Tensor(TensorTy { elem: Elem::T(t), .. })) => *t,
            _ => default,
        }
    }

    fn seed_arg(&mut self, cx: &mut FnCx, a: &Args, name: &str, span: Span) -> Option<ir::Expr> {
        let i32t = Type::scalar(ElemTy::I32);
        match self.named(a, "seed") {
            Some(e) => {
                let v = self.check_expr(cx, e, Some(&i32t));
                Some(self.coerce_with(v, &i32t, e.span, Code::E0303, "seed"))
            }
            None if cx.in_init => None,
            None => {
                self.error(
                    Diagnostic::error(
                        Code::E0212,
                        span,
                        format!("`{name}` needs `seed: s` outside a model initialiser"),
                    )
                    .label("missing seed")
                    .with_help(format!("write e.g. `{name}(…, seed: 0)`; inside a model, `init` supplies the seed")),
                );
                None
            }
        }
    }

    pub(crate) fn check_builtin(
        &mut self,
        cx: &mut FnCx,
        p: Prim,
        args: &[ast::Arg],
        span: Span,
        fspan: Span,
        expected: Option<&Type>,
    ) -> ir::Expr {
        use crate::ir::prim::Class;
        let a = split(args);
        let name = p.name();
        self.index.types.push((fspan, format!("builtin {name}"), None));
        match p.class() {
            Class::Unary => {
                self.check_named(name, &a, if p == Prim::Gelu { &["approximate"] } else { &[] });
                if !self.arity(name, &a, 1, 1, span) {
                    return self.error_expr(span);
                }
                let v = self.check_expr(cx, a.pos[0].0, expected);
                let Some((e, s)) = self.tensor_of(&v, a.pos[0].1, name) else { return self.error_expr(span) };
                let s = s.clone();
                let needs_float = !matches!(p.unary_kernel(), Some((_, crate::ir::prim::Domain::Any)));
                let elem = if e == Elem::WeakInt && needs_float { Elem::WeakFloat } else { e };
                if (needs_float && !elem.is_float()) || elem == Elem::T(ElemTy::Bool) {
                    let ts = self.ty_str(&v.ty);
                    let kind = if needs_float { "float" } else { "numeric" };
                    self.error(
                        Diagnostic::error(
                            Code::E0318,
                            a.pos[0].1,
                            format!("`{name}` needs a {kind} tensor, found {ts}"),
                        )
                        .label(ts)
                        .with_help("convert it with `f32(…)`"),
                    );
                    return self.error_expr(span);
                }
                let v = if elem != e { self.retype_weak(v, elem) } else { v };
                let exact = p == Prim::Gelu
                    && self.named(&a, "approximate").is_some_and(|x| self.const_bool(x, "approximate") == Some(false));
                if exact {
                    return self.exact_gelu(cx, v, Type::Tensor(TensorTy::new(elem, s)), span);
                }
                self.prim(p, vec![v], Attrs::default(), Type::Tensor(TensorTy::new(elem, s)), span)
            }
            Class::Binary => {
                self.check_named(name, &a, &[]);
                if !self.arity(name, &a, 2, 2, span) {
                    return self.error_expr(span);
                }
                let (x, y) = self.arithmetic_operands(cx, a.pos[0].0, a.pos[1].0, expected);
                let op = match p {
                    Prim::Pow => ast::BinOp::Pow,
                    // `maximum`, `minimum` and `gelu_grad` share the arithmetic rule of `+`.
                    Prim::Maximum | Prim::Minimum | Prim::GeluGrad => ast::BinOp::Add,
                    // Operators are not called by name (`Prim::callable`); the syntax checks them.
                    Prim::Add
                    | Prim::Sub
                    | Prim::Mul
                    | Prim::Div
                    | Prim::Rem
                    | crate::comparison_prims!()
                    | Prim::And
                    | Prim::Or
                    | crate::not_binary_prims!() => return self.error_expr(span),
                };
                let r = self.binary_op(op, Some(name), x, y, span, a.pos[0].1, a.pos[1].1);
                // `gelu_grad` is a derivative: of floats only.
                let float = matches!(&r.ty, Type::Tensor(t) if t.elem.is_float());
                if p == Prim::GeluGrad && !float && !matches!(r.ty, Type::Error) {
                    let ts = self.ty_str(&r.ty);
                    self.error(
                        Diagnostic::error(Code::E0318, span, format!("`{name}` needs float tensors, found {ts}"))
                            .label(ts)
                            .with_help("convert them with `f32(…)`"),
                    );
                    return self.error_expr(span);
                }
                // `maximum`/`minimum` share the arithmetic rule; swap the primitive.
                match r.kind {
                    ExprKind::Prim { args, attrs, .. } if p != Prim::Pow => {
                        mk(ExprKind::Prim { prim: p, args, attrs }, r.ty, r.span)
                    }
                    _ => r,
                }
            }
            Class::Reduce => self.check_reduce(cx, p, &a, span),
            Class::Along => self.check_along(cx, p, &a, span),
            Class::Other => self.check_other(cx, p, &a, span, expected),
        }
    }

    /// `gelu(x, approximate: false)`, PyTorch's default GELU: `x * 0.5 * (1 + erf(x / √2))`,
    /// written with `erf` so that every transform and engine sees ordinary primitives.
    fn exact_gelu(&mut self, cx: &mut FnCx, v: ir::Expr, ty: Type, span: Span) -> ir::Expr {
        let Type::Tensor(TensorTy { elem, .. }) = &ty else { return self.error_expr(span) };
        let scalar = Type::tensor_of(*elem, vec![]);
        let sid = self.span_id(span);
        let lit = |x: f64| mk(ExprKind::Lit(ir::Lit::Float(x)), scalar.clone(), sid);
        let x = cx.new_local(self, "x", ty.clone(), false);
        let read = || mk(ExprKind::Local(x), ty.clone(), sid);
        let scaled = self.prim(
            Prim::Mul,
            vec![read(), lit(std::f64::consts::FRAC_1_SQRT_2)],
            Attrs::default(),
            ty.clone(),
            span,
        );
        let erf = self.prim(Prim::Erf, vec![scaled], Attrs::default(), ty.clone(), span);
        let one_plus = self.prim(Prim::Add, vec![lit(1.0), erf], Attrs::default(), ty.clone(), span);
        let half_x = self.prim(Prim::Mul, vec![read(), lit(0.5)], Attrs::default(), ty.clone(), span);
        let result = self.prim(Prim::Mul, vec![half_x, one_plus], Attrs::default(), ty.clone(), span);
        let stmts = vec![ir::Stmt::Let { pat: ir::Pat::Local(x), value: v }];
        mk(ExprKind::Block { stmts, result: Box::new(result) }, ty, sid)
    }

    /// A primitive along one axis (`cumsum`, `softmax`, `log_softmax`; `ir::prim::Along`): one
    /// tensor, whose shape is kept, of the elements its entry takes (`Float`: floats; `Counts`:
    /// numbers or bools, counted as i32). `axis: k` is required or defaults to the last axis, as
    /// the entry says; over a `..` rest it must lie in the fixed prefix or suffix.
    fn check_along(&mut self, cx: &mut FnCx, p: Prim, a: &Args, span: Span) -> ir::Expr {
        let name = p.name();
        let Some(along) = p.along() else { return self.error_expr(span) };
        let Some((v, e, s)) = self.tensor_operand(cx, p, a, &["axis"], (1, 1), span) else {
            return self.error_expr(span);
        };
        if !self.takes_elems(along.elems, e, &v.ty, a.pos[0].1, name) {
            return self.error_expr(span);
        }
        let (k, kspan) = match (self.named(a, "axis"), along.axis) {
            (Some(ax), _) => match self.const_int(cx, ax, "axis") {
                Some(k) => (k, ax.span),
                None => return self.error_expr(span),
            },
            (None, AxisArg::Last) => (-1, span),
            (None, AxisArg::Required) => {
                self.error(
                    Diagnostic::error(Code::E0212, span, format!("`{name}` needs `axis: k`"))
                        .label("along which axis?")
                        .with_help(format!("`{name}(x, axis: -1)` works along the last axis")),
                );
                return self.error_expr(span);
            }
        };
        let rest = s.iter().position(|i| matches!(i, ShapeItem::Rest(_)));
        let (axis, from_end) = match rest {
            None => match self.axis(k, s.len(), kspan, &v.ty) {
                Some(i) => (i, false),
                None => return self.error_expr(span),
            },
            Some(r) if k >= 0 && (k as usize) < r => (k as usize, false),
            // Counted from the end: the rank is known only at run time.
            Some(r) if k < 0 && ((-k) as usize) < s.len() - r => ((-k) as usize, true),
            Some(r) => {
                let dims = if r > 0 { "fixed dims before or after" } else { "fixed dims after" };
                self.error(Diagnostic::error(
                    Code::E0309,
                    kspan,
                    format!("axis {k} of `{name}` must be in the {dims} the `..` rest of {}", self.ty_str(&v.ty)),
                ));
                return self.error_expr(span);
            }
        };
        let out = crate::ir::typing::reduction_elem(p, e);
        let attrs = Attrs { axis: Some(axis), from_end, ..Attrs::default() };
        self.prim(p, vec![v], attrs, Type::Tensor(TensorTy::new(out, s)), span)
    }

    /// Whether elements `e` are what a reduction or a primitive along one axis takes (`takes`):
    /// floats for `Float`, bools only for `Counts`; E0318 at `at` if not.
    fn takes_elems(&mut self, takes: Reduces, e: Elem, ty: &Type, at: Span, name: &str) -> bool {
        let float_only = takes == Reduces::Float;
        if (float_only && !e.is_float()) || (e == Elem::T(ElemTy::Bool) && takes != Reduces::Counts) {
            let ts = self.ty_str(ty);
            self.error(
                Diagnostic::error(Code::E0318, at, format!("`{name}` needs a float tensor, found {ts}"))
                    .label(ts)
                    .with_help("convert it with `f32(…)`"),
            );
            return false;
        }
        true
    }

    /// The common start of a builtin over one tensor: its named arguments and arity checked,
    /// the tensor checked and materialised, with its element type and shape.
    fn tensor_operand(
        &mut self,
        cx: &mut FnCx,
        p: Prim,
        a: &Args,
        named: &[&str],
        arity: (usize, usize),
        span: Span,
    ) -> Option<(ir::Expr, Elem, Vec<ShapeItem>)> {
        let name = p.name();
        self.check_named(name, a, named);
        if !self.arity(name, a, arity.0, arity.1, span) {
            return None;
        }
        let v = self.check_expr(cx, a.pos[0].0, None);
        let v = self.materialise(v);
        let (e, s) = self.tensor_of(&v, a.pos[0].1, name)?;
        let s = s.clone();
        Some((v, e, s))
    }

    fn retype_weak(&mut self, v: ir::Expr, e: Elem) -> ir::Expr {
        match v.ty {
            Type::Tensor(TensorTy { shape: ref s, .. }) => {
                let t = Type::Tensor(TensorTy::new(e, s.clone()));
                let span = v.span;
                // An integer literal that becomes a float is written as one (`9` into f32 is `9.0`).
                if let (ExprKind::Lit(ir::Lit::Int(n)), true) = (&v.kind, e.is_float()) {
                    return mk(ExprKind::Lit(ir::Lit::Float(*n as f64)), t, span);
                }
                ir::Expr { ty: t, ..v }
            }
            _ => v,
        }
    }

    fn check_reduce(&mut self, cx: &mut FnCx, p: Prim, a: &Args, span: Span) -> ir::Expr {
        let name = p.name();
        self.check_named(name, a, &["axis", "keepdims"]);
        if !self.arity(name, a, 1, 1, span) {
            return self.error_expr(span);
        }
        let v = self.check_expr(cx, a.pos[0].0, None);
        let v = self.materialise(v);
        if p == Prim::Sum && v.ty.is_model() {
            // The sum over every tensor of a model (`sum(map(|t| t * t, g))`).
            if let Some((n, _)) = a.named.first() {
                self.error(
                    Diagnostic::error(Code::E0212, n.span, format!("`sum` of a model takes no `{}`", n.name))
                        .label("a model's tensors have different shapes"),
                );
                return self.error_expr(span);
            }
            return self.prim(Prim::ModelSum, vec![v], Attrs::default(), Type::scalar(ElemTy::F32), span);
        }
        let Some((e, s)) = self.tensor_of(&v, a.pos[0].1, name) else { return self.error_expr(span) };
        let s = s.clone();
        if !self.takes_elems(p.reduces().unwrap_or(Reduces::Same), e, &v.ty, a.pos[0].1, name) {
            return self.error_expr(span);
        }
        let keepdims = match self.named(a, "keepdims") {
            Some(k) => self.const_bool(k, "keepdims").unwrap_or(false),
            None => false,
        };
        let out_elem = crate::ir::typing::reduction_elem(p, e);
        if let Some(ax) = self.named(a, "axis") {
            if let ast::ExprKind::List(items) | ast::ExprKind::Tuple(items) = &ax.kind {
                return self.reduce_axes(cx, p, v, &s, items, ax.span, keepdims, out_elem, span);
            }
        }
        let (axis, shape) = match self.named(a, "axis") {
            None => {
                let shape = if keepdims {
                    match self.fixed_dims(&s, span, name) {
                        Some(d) => d.iter().map(|_| ShapeItem::Dim(Dim::constant(1))).collect(),
                        None => return self.error_expr(span),
                    }
                } else {
                    vec![]
                };
                (None, shape)
            }
            Some(ax) => {
                let Some(k) = self.const_int(cx, ax, "axis") else { return self.error_expr(span) };
                let rest = s.iter().position(|i| matches!(i, ShapeItem::Rest(_)));
                let idx = match rest {
                    // With a `..` rest, an axis must point into the fixed prefix or suffix.
                    Some(r) if (k >= 0 && (k as usize) < r) => Some(k as usize),
                    Some(r) if k < 0 && ((-k) as usize) < s.len() - r => Some((s.len() as i64 + k) as usize),
                    Some(_) => {
                        self.error(Diagnostic::error(
                            Code::E0309,
                            ax.span,
                            format!("axis {k} falls inside the `..` rest of {}", self.ty_str(&v.ty)),
                        ));
                        return self.error_expr(span);
                    }
                    None => self.axis(k, s.len(), ax.span, &v.ty),
                };
                let Some(i) = idx else { return self.error_expr(span) };
                let mut shape = s.clone();
                if keepdims {
                    shape[i] = ShapeItem::Dim(Dim::constant(1));
                } else {
                    shape.remove(i);
                }
                (Some(i), shape)
            }
        };
        // Over a `..` rest a negative axis stays relative to the end: the rank is known at run time.
        let from_end = axis.is_some()
            && s.iter().any(|i| matches!(i, ShapeItem::Rest(_)))
            && self
                .named(a, "axis")
                .and_then(|x| self.static_dim(cx, x))
                .and_then(|d| d.as_const())
                .is_some_and(|k| k < 0);
        let axis = if from_end { axis.map(|i| s.len() - i) } else { axis };
        let attrs = Attrs { axis, keepdims, from_end, ..Attrs::default() };
        self.prim(p, vec![v], attrs, Type::Tensor(TensorTy::new(out_elem, shape)), span)
    }

    /// `sum(x, axis: (0, 2))` (or `[0, 2]`): one reduction per axis, the highest first, so the
    /// lower axes keep their numbers; a mean of equal-sized means is the mean over both axes,
    /// and so for `max`, `min` and `logsumexp`.
    #[allow(clippy::too_many_arguments)]
    fn reduce_axes(
        &mut self,
        cx: &mut FnCx,
        p: Prim,
        v: ir::Expr,
        s: &[ShapeItem],
        items: &[ast::Expr],
        aspan: Span,
        keepdims: bool,
        out_elem: Elem,
        span: Span,
    ) -> ir::Expr {
        let name = p.name();
        if matches!(p, Prim::Argmax | Prim::Argmin) {
            self.error(
                Diagnostic::error(Code::E0323, aspan, format!("`{name}` takes one axis"))
                    .label("several axes")
                    .with_help(format!("as in NumPy, `{name}` finds the index along one axis")),
            );
            return self.error_expr(span);
        }
        if s.iter().any(|i| matches!(i, ShapeItem::Rest(_))) {
            let ts = self.ty_str(&v.ty);
            self.error(
                Diagnostic::error(Code::E0309, aspan, format!("several axes need a tensor of known rank, found {ts}"))
                    .label("reduce one axis at a time here"),
            );
            return self.error_expr(span);
        }
        if items.is_empty() {
            self.error(
                Diagnostic::error(Code::E0323, aspan, "the list of axes is empty").label("name at least one axis"),
            );
            return self.error_expr(span);
        }
        let mut axes = Vec::new();
        for it in items {
            let Some(k) = self.const_int(cx, it, "axis") else { return self.error_expr(span) };
            let Some(i) = self.axis(k, s.len(), it.span, &v.ty) else { return self.error_expr(span) };
            if axes.contains(&i) {
                self.error(
                    Diagnostic::error(Code::E0309, it.span, format!("axis {k} is named twice"))
                        .label("this axis is already reduced"),
                );
                return self.error_expr(span);
            }
            axes.push(i);
        }
        axes.sort_unstable_by(|a, b| b.cmp(a));
        let mut shape = s.to_vec();
        let mut out = v;
        for i in axes {
            if keepdims {
                shape[i] = ShapeItem::Dim(Dim::constant(1));
            } else {
                shape.remove(i);
            }
            // `sum` of bools gives i32 at the first step; the later steps sum those integers.
            let attrs = Attrs { axis: Some(i), keepdims, ..Attrs::default() };
            out = self.prim(p, vec![out], attrs, Type::Tensor(TensorTy::new(out_elem, shape.clone())), span);
        }
        out
    }

    fn check_other(&mut self, cx: &mut FnCx, p: Prim, a: &Args, span: Span, expected: Option<&Type>) -> ir::Expr {
        let name = p.name();
        match p {
            Prim::Where => {
                self.check_named(name, a, &[]);
                if !self.arity(name, a, 3, 3, span) {
                    return self.error_expr(span);
                }
                let c = self.check_expr(cx, a.pos[0].0, None);
                let x = self.check_expr(cx, a.pos[1].0, expected);
                let y = self.check_expr(cx, a.pos[2].0, expected);
                if c.ty.has_error() || x.ty.has_error() || y.ty.has_error() {
                    return self.error_expr(span);
                }
                let Some((ce, cs)) = self.tensor_of(&c, a.pos[0].1, "where") else { return self.error_expr(span) };
                let cs = cs.clone();
                if ce != Elem::T(ElemTy::Bool) {
                    self.error(Diagnostic::error(
                        Code::E0303,
                        a.pos[0].1,
                        format!("`where` needs a bool condition, found {}", ce.name()),
                    ));
                    return self.error_expr(span);
                }
                // The value operands follow the arithmetic rule (element types and broadcasting).
                let xy = self.binary_op(ast::BinOp::Add, Some("where"), x, y, span, a.pos[1].1, a.pos[2].1);
                let ExprKind::Prim { args: xy_args, .. } = xy.kind else { return xy };
                let Type::Tensor(TensorTy { elem: e, shape: s, .. }) = xy.ty else { return self.error_expr(span) };
                let shape = match broadcast(&cs, &s) {
                    Ok(sh) => sh,
                    Err(err) => {
                        let (ct, vt) = (c.ty.clone(), Type::Tensor(TensorTy::new(e, s.clone())));
                        self.broadcast_error(&ct, &vt, err, span, a.pos[0].1, a.pos[1].1);
                        return self.error_expr(span);
                    }
                };
                let mut all = vec![c];
                all.extend(xy_args);
                self.prim(Prim::Where, all, Attrs::default(), Type::Tensor(TensorTy::new(e, shape)), span)
            }
            Prim::Reshape | Prim::BroadcastTo => self.check_reshape(cx, p, a, span),
            Prim::Transpose | Prim::Permute => self.check_transpose(cx, p, a, span),
            Prim::Concat | Prim::Stack => self.check_concat(cx, p, a, span),
            Prim::ExpandDims | Prim::Squeeze => self.check_expand_dims(cx, p, a, span),
            Prim::Gather => self.check_gather(cx, p, a, span),
            Prim::ScatterAdd => self.check_scatter_add(cx, p, a, span),
            Prim::Update => self.check_update(cx, p, a, span),
            Prim::Argsort => self.check_argsort(cx, a, span),
            Prim::Attention | Prim::AttentionWeights => self.check_attention(cx, p, a, span),
            Prim::TakeAlong => self.check_take_along(cx, p, a, span),
            Prim::ScatterAddAlong => self.check_scatter_add_along(cx, p, a, span),
            Prim::OneHot => self.check_one_hot(cx, p, a, span, expected),
            Prim::Einsum => self.check_einsum(cx, a, span),
            Prim::Conv2d => self.check_conv2d(cx, a, span),
            Prim::Conv2dInputGrad | Prim::Conv2dWeightGrad => self.check_conv2d_grad(cx, p, a, span),
            Prim::MaxPool2d => self.check_pool2d(cx, conv::Pool::Max, a, span),
            Prim::MaxPool2dGrad => self.check_pool2d(cx, conv::Pool::MaxGrad, a, span),
            Prim::AvgPool2d => self.check_pool2d(cx, conv::Pool::Avg, a, span),
            Prim::AvgPool2dGrad => self.check_pool2d(cx, conv::Pool::AvgGrad, a, span),
            Prim::Zeros | Prim::Ones | Prim::Full | Prim::Arange | Prim::Eye => {
                self.check_zeros(cx, p, a, span, expected)
            }
            Prim::Normal | Prim::Uniform | Prim::HeNormal | Prim::GlorotUniform => {
                self.check_normal(cx, p, a, span, expected)
            }
            Prim::Params => {
                self.check_named(name, a, &[]);
                if !self.arity(name, a, 1, 1, span) {
                    return self.error_expr(span);
                }
                let m = self.check_expr(cx, a.pos[0].0, None);
                if !m.ty.is_model() && !m.ty.has_error() {
                    let ts = self.ty_str(&m.ty);
                    self.error(Diagnostic::error(
                        Code::E0304,
                        a.pos[0].1,
                        format!("`params` needs a model, found {ts}"),
                    ));
                }
                self.prim(p, vec![m], Attrs::default(), Type::scalar(ElemTy::I32), span)
            }
            Prim::Map => self.check_map(cx, a, span),
            Prim::Quantize => self.check_quantize(cx, p, a, span),
            Prim::Prune => self.check_prune(cx, p, a, span),
            Prim::StopGradient => {
                self.check_named(name, a, &[]);
                if !self.arity(name, a, 1, 1, span) {
                    return self.error_expr(span);
                }
                let v = self.check_expr(cx, a.pos[0].0, expected);
                let ty = v.ty.clone();
                self.prim(p, vec![v], Attrs::default(), ty, span)
            }
            Prim::Print => self.check_print(cx, p, a, span),
            Prim::Load => self.check_load(cx, p, a, span, expected),
            Prim::Save => self.check_save(cx, p, a, span),
            Prim::LogScalar => self.check_log_scalar(cx, p, a, span),
            Prim::Exists => self.check_exists(cx, p, a, span),
            Prim::Clock => {
                self.check_named(name, a, &[]);
                if !self.arity(name, a, 0, 0, span) {
                    return self.error_expr(span);
                }
                self.prim(p, vec![], Attrs::default(), Type::scalar(ElemTy::F64), span)
            }
            Prim::Assert => self.check_assert(cx, p, a, span),
            Prim::AssertClose => self.check_assert_close(cx, p, a, span),
            // Unary, binary and reduction primitives are checked by class in `check_builtin`;
            // operators, casts and slices have their own syntax and never reach here.
            crate::unary_prims!()
            | crate::binary_prims!()
            | crate::reduce_prims!()
            | crate::along_prims!()
            | Prim::MatMul
            | Prim::Cast
            | Prim::Slice
            | Prim::TapeNew
            | Prim::TapePush
            | Prim::TapeGet
            | Prim::ModelSum
            | Prim::ShardState
            | Prim::CopySplit
            | Prim::CopyJoin
            | crate::collective_prims!() => {
                self.error(Diagnostic::error(Code::E0325, span, format!("`{name}` cannot be called directly")));
                self.error_expr(span)
            }
        }
    }

    fn check_concat(&mut self, cx: &mut FnCx, p: Prim, a: &Args, span: Span) -> ir::Expr {
        let name = p.name();
        self.check_named(name, a, &["axis"]);
        if !self.arity(name, a, 1, 1, span) {
            return self.error_expr(span);
        }
        let ast::ExprKind::List(items) = &a.pos[0].0.kind else {
            self.error(
                Diagnostic::error(Code::E0323, a.pos[0].1, format!("`{name}` needs a list of tensors `[a, b, …]`"))
                    .label("expected `[…]`"),
            );
            return self.error_expr(span);
        };
        if items.is_empty() {
            self.error(Diagnostic::error(Code::E0310, a.pos[0].1, format!("`{name}` needs at least one tensor")));
            return self.error_expr(span);
        }
        let mut vals = Vec::new();
        for it in items {
            let v = self.check_expr(cx, it, None);
            vals.push(self.materialise(v));
        }
        if vals.iter().any(|v| v.ty.has_error()) {
            return self.error_expr(span);
        }
        let mut shapes = Vec::new();
        let mut elem = None;
        for (v, it) in vals.iter().zip(items) {
            let Some((e, s)) = self.tensor_of(v, it.span, name) else { return self.error_expr(span) };
            let s = s.clone();
            let Some(d) = self.fixed_dims(&s, it.span, name) else { return self.error_expr(span) };
            match elem {
                None => elem = Some(e),
                Some(prev) if prev != e => {
                    self.error(
                        Diagnostic::error(
                            Code::E0303,
                            it.span,
                            format!("`{name}` operands have different element types: {} and {}", prev.name(), e.name()),
                        )
                        .label(e.name()),
                    );
                    return self.error_expr(span);
                }
                _ => {}
            }
            shapes.push((d, it.span, v.ty.clone()));
        }
        let rank = shapes[0].0.len();
        let k = match self.named(a, "axis") {
            Some(x) => self.const_int(cx, x, "axis"),
            None => Some(0),
        };
        let Some(k) = k else { return self.error_expr(span) };
        let out_rank = if p == Prim::Stack { rank + 1 } else { rank };
        let t0 = shapes[0].2.clone();
        let Some(ax) = self.axis(k, out_rank, span, &t0) else { return self.error_expr(span) };
        for (d, s, t) in &shapes[1..] {
            let ok = d.len() == rank && (0..rank).all(|i| (p == Prim::Concat && i == ax) || d[i] == shapes[0].0[i]);
            if !ok {
                let (t0s, ts) = (self.ty_str(&t0), self.ty_str(t));
                let msg = if d.len() != rank {
                    format!("`{name}` operands have different ranks: {t0s} and {ts}")
                } else if p == Prim::Concat {
                    format!("`{name}` operands must agree in every dim except axis {ax}: {t0s} and {ts}")
                } else {
                    format!("`stack` operands must have the same shape: {t0s} and {ts}")
                };
                self.error(
                    Diagnostic::error(Code::E0310, *s, msg)
                        .label(format!("this is {ts}"))
                        .with_secondary(shapes[0].1, format!("this is {t0s}")),
                );
                return self.error_expr(span);
            }
        }
        let mut out = shapes[0].0.clone();
        if p == Prim::Concat {
            out[ax] = shapes.iter().fold(Dim::constant(0), |acc, (d, _, _)| acc.add(&d[ax]));
        } else {
            out.insert(ax, Dim::constant(shapes.len() as i64));
        }
        let shape = out.into_iter().map(ShapeItem::Dim).collect();
        let attrs = Attrs { axis: Some(ax), ..Attrs::default() };
        self.prim(p, vals, attrs, Type::Tensor(TensorTy::new(elem.unwrap(), shape)), span)
    }

    fn check_map(&mut self, cx: &mut FnCx, a: &Args, span: Span) -> ir::Expr {
        self.check_named("map", a, &[]);
        if !self.arity("map", a, 2, usize::MAX, span) {
            return self.error_expr(span);
        }
        let f = self.check_expr(cx, a.pos[0].0, None);
        let mut models = Vec::new();
        for (e, s) in &a.pos[1..] {
            let m = self.check_expr(cx, e, None);
            if !m.ty.is_model() && !m.ty.has_error() {
                let ts = self.ty_str(&m.ty);
                self.error(Diagnostic::error(
                    Code::E0304,
                    *s,
                    format!("`map` applies a function to models, found {ts}"),
                ));
                return self.error_expr(span);
            }
            models.push(m);
        }
        let mty = models[0].ty.clone();
        for (m, (_, s)) in models.iter().zip(&a.pos[1..]).skip(1) {
            if m.ty != mty && !m.ty.has_error() && !mty.has_error() {
                let (a0, b0) = (self.ty_str(&mty), self.ty_str(&m.ty));
                self.error(Diagnostic::error(
                    Code::E0321,
                    *s,
                    format!("`map` needs models of one type: {a0} and {b0}"),
                ));
                return self.error_expr(span);
            }
        }
        let Type::Fn(fty) = &f.ty else {
            if !f.ty.has_error() {
                let ts = self.ty_str(&f.ty);
                self.error(Diagnostic::error(Code::E0313, a.pos[0].1, format!("`map` needs a function, found {ts}")));
            }
            return self.error_expr(span);
        };
        // The function is checked on every distinct leaf type of the model.
        let leaves = self.leaf_types(&mty);
        for leaf in leaves {
            let args: Vec<(Type, Span)> = models.iter().map(|_| (leaf.clone(), a.pos[0].1)).collect();
            match self.apply_fn_type(fty, &args, a.pos[0].1, false) {
                Some((r, _)) => {
                    if !self.types_equal(&r, &leaf) && !r.has_error() {
                        let (rs, ls) = (self.ty_str(&r), self.ty_str(&leaf));
                        self.error(
                            Diagnostic::error(
                                Code::E0304,
                                a.pos[0].1,
                                format!("`map`'s function must keep each tensor's type: it maps {ls} to {rs}"),
                            )
                            .label("changes the shape or element type"),
                        );
                        return self.error_expr(span);
                    }
                }
                None => return self.error_expr(span),
            }
        }
        let mut args = vec![f];
        args.extend(models);
        self.prim(Prim::Map, args, Attrs::default(), mty, span)
    }

    /// The distinct tensor types inside a model (all of `f32[..S]` for a generic model).
    fn leaf_types(&mut self, t: &Type) -> Vec<Type> {
        match t {
            Type::Model(id, args) => {
                let n = self.model_sigs[id.0 as usize].fields.len();
                let mut out: Vec<Type> = Vec::new();
                for i in 0..n {
                    let ft = self.field_type(*id, args, i);
                    for l in self.leaf_types(&ft) {
                        if !out.contains(&l) {
                            out.push(l);
                        }
                    }
                }
                out
            }
            Type::ModelVar(_) => {
                let r = self.new_rest("S");
                vec![Type::Tensor(TensorTy::new(Elem::T(ElemTy::F32), vec![ShapeItem::Rest(r)]))]
            }
            Type::Tensor(..) => vec![t.clone()],
            _ => vec![],
        }
    }
}

/// The static call target of a function type, where the checker knows it.
pub(crate) fn fn_target(f: &FnTy) -> ir::FnTarget {
    match f {
        FnTy::Item(id) => ir::FnTarget::Func(*id),
        FnTy::Grad { inner, wrt, with_value } => {
            ir::FnTarget::Grad { inner: Box::new(fn_target(inner)), wrt: *wrt, with_value: *with_value }
        }
        FnTy::Vmap { inner, in_axes } => {
            ir::FnTarget::Vmap { inner: Box::new(fn_target(inner)), in_axes: in_axes.clone() }
        }
        _ => ir::FnTarget::Dynamic,
    }
}
