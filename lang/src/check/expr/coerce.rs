//! Coercions: weak literals taking a concrete type, and a value accepted where a type is
//! expected (with the diagnostic when it is not).

use super::*;

impl Checker {
    /// A weak literal value takes its default type (`1` is i32, `1.0` is f32).
    pub(crate) fn materialise(&mut self, v: ir::Expr) -> ir::Expr {
        match &v.ty {
            Type::Tensor(TensorTy { elem: e, shape, .. }) if e.is_weak() => {
                let t = Type::Tensor(TensorTy::new(Elem::T(e.materialise()), shape.clone()));
                self.cast_to(v, &t)
            }
            Type::Tuple(ts)
                if ts.iter().any(|t| matches!(t, Type::Tensor(TensorTy { elem: e, .. }) if e.is_weak())) =>
            {
                let span = v.span;
                let ExprKind::Tuple(items) = v.kind else {
                    return v;
                };
                let items: Vec<ir::Expr> = items.into_iter().map(|e| self.materialise(e)).collect();
                let ty = Type::Tuple(items.iter().map(|e| e.ty.clone()).collect());
                mk(ExprKind::Tuple(items), ty, span)
            }
            _ => v,
        }
    }

    /// `[a, b, …]`: a tensor stacking its items when they are tensors (numbers, booleans) of
    /// one fixed shape and element types that join, as `np.array` makes one; else a list, which
    /// only the builtins that take lists accept (`concat([a, b])`, `reshape(x, [2, 3])`). Weak
    /// literals take the expected element type, or the type a lone literal would take.
    pub(crate) fn tensor_literal(&mut self, items: Vec<ir::Expr>, expected: Option<&Type>, span: Span) -> ir::Expr {
        let mut row: Option<(Elem, Vec<ShapeItem>)> = None;
        let mut uniform = !items.is_empty();
        for e in &items {
            let Type::Tensor(t) = &e.ty else {
                uniform = false;
                break;
            };
            let fixed = t.shape.iter().all(|i| matches!(i, ShapeItem::Dim(_)));
            row = match row {
                None if fixed => Some((t.elem, t.shape.clone())),
                Some((el, sh)) if fixed && sh == t.shape => join_elem(el, t.elem).map(|j| (j, sh)),
                _ => None,
            };
            if row.is_none() {
                uniform = false;
                break;
            }
        }
        // `[]` where an empty tensor is expected (`let e: f32[0, 4] = []`): zeros of that shape.
        if let (true, Some(Type::Tensor(t))) = (items.is_empty(), expected) {
            let dims: Option<Vec<Dim>> =
                t.shape.iter().map(|i| if let ShapeItem::Dim(d) = i { Some(d.clone()) } else { None }).collect();
            if let (Elem::T(et), Some(dims)) = (t.elem, dims) {
                if dims.first().and_then(Dim::as_const) == Some(0) {
                    let attrs = Attrs { shape: dims, dtype: Some(et), ..Attrs::default() };
                    return self.prim(
                        Prim::Zeros,
                        vec![],
                        attrs,
                        Type::Tensor(TensorTy::new(t.elem, t.shape.clone())),
                        span,
                    );
                }
            }
        }
        let s = self.span_id(span);
        let Some((elem, shape)) = row.filter(|_| uniform) else {
            let ty = Type::List(items.iter().map(|e| e.ty.clone()).collect());
            return mk(ExprKind::Tuple(items), ty, s);
        };
        // Weak literals take the expected element type; with none the tensor stays weak, as a
        // lone literal does, and its context decides (`norm([2, 3, 6])` for an `f32[3]`).
        let elem = match expected {
            Some(Type::Tensor(t)) if !t.elem.is_weak() && crate::types::unify::elem_accepts(t.elem, elem).is_ok() => {
                t.elem
            }
            _ => elem,
        };
        // Items are stacked in one run-time type: a weak float is an f64 until it is converted.
        let to = match elem {
            Elem::T(t) => Some(t),
            Elem::WeakFloat => Some(ElemTy::F64),
            Elem::WeakInt => None,
        };
        let items: Vec<ir::Expr> = items
            .into_iter()
            .map(|e| match (&e.ty, to) {
                (Type::Tensor(t), Some(to)) if t.elem.is_weak() && (t.elem != elem || !elem.is_weak()) => {
                    let ty = Type::Tensor(TensorTy::new(Elem::T(to), t.shape.clone()));
                    self.cast_to(e, &ty)
                }
                _ => e,
            })
            .collect();
        let mut out = vec![ShapeItem::Dim(Dim::constant(items.len() as i64))];
        out.extend(shape);
        let attrs = Attrs { axis: Some(0), ..Attrs::default() };
        self.prim(Prim::Stack, items, attrs, Type::Tensor(TensorTy::new(elem, out)), span)
    }

    /// Converts a weak-typed expression to a concrete type of the same shape.
    pub(super) fn cast_to(&mut self, v: ir::Expr, t: &Type) -> ir::Expr {
        let Type::Tensor(TensorTy { elem: Elem::T(et), .. }) = t else { return v };
        if let (ElemTy::I32, ExprKind::Lit(Lit::Int(n))) = (et, &v.kind) {
            if i32::try_from(*n).is_err() {
                let span = self.prog.span(v.span);
                self.error(
                    Diagnostic::error(Code::E0322, span, format!("integer literal {n} does not fit in i32"))
                        .label("out of range")
                        .with_help("i32 holds -2147483648 to 2147483647; write it as a float such as `3.0e9`"),
                );
            }
        }
        match v.kind {
            ExprKind::Lit(Lit::Int(_) | Lit::Float(_)) => ir::Expr { ty: t.clone(), ..v },
            _ => {
                let span = v.span;
                let attrs = Attrs { dtype: Some(*et), ..Attrs::default() };
                mk(ExprKind::Prim { prim: Prim::Cast, args: vec![v], attrs: Box::new(attrs) }, t.clone(), span)
            }
        }
    }

    /// Checks that a value fits a type exactly (weak literals adapt) or explains why not.
    /// The error hands the expression back so that checking goes on with it.
    #[allow(clippy::result_large_err)]
    pub(crate) fn try_coerce(&mut self, v: ir::Expr, t: &Type) -> Result<ir::Expr, (ir::Expr, String)> {
        if v.ty.has_error() || t.has_error() {
            return Ok(v);
        }
        match (&v.ty, t) {
            (
                Type::Tensor(TensorTy { elem: ve, shape: vs, .. }),
                Type::Tensor(TensorTy { elem: te, shape: ts, .. }),
            ) => {
                if crate::types::unify::elem_accepts(*te, *ve).is_err() {
                    let why = format!("expected {}, found {}", te.name(), ve.name());
                    return Err((v, why));
                }
                if vs.len() != ts.len() {
                    let why = format!(
                        "expected rank {} ({}), found rank {} ({})",
                        ts.len(),
                        self.ty_str(t),
                        vs.len(),
                        self.ty_str(&v.ty)
                    );
                    return Err((v, why));
                }
                for (i, (a, b)) in vs.iter().zip(ts).enumerate() {
                    if a != b {
                        let why = match (a, b) {
                            (ShapeItem::Dim(a), ShapeItem::Dim(b)) => format!(
                                "dimension {i} differs: expected {}, found {}",
                                self.dim_str(b),
                                self.dim_str(a)
                            ),
                            _ => format!("shape differs: expected {}, found {}", self.ty_str(t), self.ty_str(&v.ty)),
                        };
                        return Err((v, why));
                    }
                }
                if ve.is_weak() && !te.is_weak() {
                    return Ok(self.cast_to(v, t));
                }
                Ok(v)
            }
            (Type::Tuple(vs), Type::Tuple(ts)) if vs.len() == ts.len() => {
                if let ExprKind::Tuple(_) = &v.kind {
                    let span = v.span;
                    let ExprKind::Tuple(items) = v.kind else { unreachable!() };
                    let mut out = Vec::new();
                    let mut err = None;
                    for (e, t) in items.into_iter().zip(ts) {
                        match self.try_coerce(e, t) {
                            Ok(e) => out.push(e),
                            Err((e, why)) => {
                                err.get_or_insert(why);
                                out.push(e)
                            }
                        }
                    }
                    let ty = Type::Tuple(out.iter().map(|e| e.ty.clone()).collect());
                    let e = mk(ExprKind::Tuple(out), ty, span);
                    return match err {
                        Some(w) => Err((e, w)),
                        None => Ok(e),
                    };
                }
                if self.types_equal(&v.ty, t) {
                    Ok(v)
                } else {
                    let why = format!("expected {}, found {}", self.ty_str(t), self.ty_str(&v.ty));
                    Err((v, why))
                }
            }
            (Type::Fn(_), Type::Fn(FnTy::Sig { params, ret })) => {
                // A function value fits a signature when applying it to the parameter types
                // gives the result type.
                let fty = match &v.ty {
                    Type::Fn(f) => f.clone(),
                    _ => unreachable!(),
                };
                let span = self.prog.span(v.span);
                let args: Vec<(Type, Span)> = params.iter().map(|p| (p.clone(), span)).collect();
                match self.apply_fn_type(&fty, &args, span, true) {
                    Some((r, _)) if self.types_equal(&r, ret) => Ok(v),
                    Some((r, _)) => {
                        let why = format!("function returns {}, expected {}", self.ty_str(&r), self.ty_str(ret));
                        Err((v, why))
                    }
                    None => Err((v, "function does not accept these parameter types".to_string())),
                }
            }
            _ => {
                if self.types_equal(&v.ty, t) {
                    Ok(v)
                } else {
                    let why = format!("expected {}, found {}", self.ty_str(t), self.ty_str(&v.ty));
                    Err((v, why))
                }
            }
        }
    }

    pub(crate) fn types_equal(&self, a: &Type, b: &Type) -> bool {
        match (a, b) {
            (Type::Error, _) | (_, Type::Error) => true,
            (
                Type::Tensor(TensorTy { elem: ae, shape: as_, .. }),
                Type::Tensor(TensorTy { elem: be, shape: bs, .. }),
            ) => (ae == be || crate::types::unify::elem_accepts(*be, *ae).is_ok()) && as_ == bs,
            (Type::Tuple(x), Type::Tuple(y)) => {
                x.len() == y.len() && x.iter().zip(y).all(|(a, b)| self.types_equal(a, b))
            }
            _ => a == b,
        }
    }

    pub(crate) fn coerce(&mut self, v: ir::Expr, t: &Type, span: Span, what: &str) -> ir::Expr {
        self.coerce_with(v, t, span, Code::E0304, what)
    }

    pub(crate) fn coerce_with(&mut self, v: ir::Expr, t: &Type, span: Span, code: Code, what: &str) -> ir::Expr {
        match self.try_coerce(v, t) {
            Ok(e) => e,
            Err((e, why)) => {
                let code = if code == Code::E0304 { mismatch_code(&e.ty, t) } else { code };
                let msg = match (&e.ty, t) {
                    // `let i: i32 = 1.5`: say that the literal is what does not fit.
                    (Type::Tensor(TensorTy { elem: we, shape: ws, .. }), Type::Tensor(TensorTy { elem: te, .. }))
                        if we.is_weak() && ws.is_empty() && crate::types::unify::elem_accepts(*te, *we).is_err() =>
                    {
                        let article = if *we == Elem::WeakInt { "an" } else { "a" };
                        format!("{what} is {article} {}, which cannot be used as {}", we.name(), self.ty_str(t))
                    }
                    _ => format!("{what} has type {}, expected {}", self.ty_str(&e.ty), self.ty_str(t)),
                };
                self.error(Diagnostic::error(code, span, msg).label(why));
                e
            }
        }
    }
}
