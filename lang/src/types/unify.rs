//! Matching a generic signature against argument types: binds dims, rest shapes and model
//! type parameters, solving linear dim equations such as `N + 1 == 65`, and NumPy broadcasting.

use super::{Dim, Elem, FnTy, Shape, ShapeItem, Sym, TyVar, Type, TypeArg};
use super::{ElemTy, RestSym};
use crate::types::TensorTy;
use std::collections::{HashMap, HashSet};

/// Bindings of a callee's generic parameters, in the caller's terms.
#[derive(Clone, Debug, Default)]
pub struct Subst {
    pub dims: HashMap<Sym, Dim>,
    pub rests: HashMap<RestSym, Shape>,
    pub models: HashMap<TyVar, Type>,
}

/// Why a parameter type does not accept an argument type.
#[derive(Clone, Debug)]
pub enum Mismatch {
    /// Element types differ.
    Elem { expected: Elem, found: Elem },
    /// Ranks differ.
    Rank { expected: usize, found: usize },
    /// Dimension `index` differs: `expected` (already substituted) vs `found`.
    Dim { index: usize, expected: Dim, found: Dim },
    /// A generic dim was bound to two different values.
    Conflict { var: Sym, first: Dim, second: Dim },
    /// Different kinds of type (tensor vs model …), or different models.
    Kind,
}

impl Subst {
    pub fn dim(&self, d: &Dim) -> Dim {
        d.subst(&|s| self.dims.get(&s).cloned())
    }

    pub fn shape(&self, s: &Shape) -> Shape {
        let mut out = Vec::new();
        for item in s {
            match item {
                ShapeItem::Dim(d) => out.push(ShapeItem::Dim(self.dim(d))),
                ShapeItem::Rest(r) => match self.rests.get(r) {
                    Some(sh) => out.extend(sh.iter().cloned()),
                    None => out.push(ShapeItem::Rest(*r)),
                },
            }
        }
        out
    }

    pub fn ty(&self, t: &Type) -> Type {
        match t {
            // A declared layout stays with its dims (a shape without a rest keeps its rank).
            Type::Tensor(TensorTy { elem: e, shape: s, layout })
                if !s.iter().any(|i| matches!(i, ShapeItem::Rest(_))) =>
            {
                Type::Tensor(TensorTy { elem: *e, shape: self.shape(s), layout: layout.clone() })
            }
            Type::Tensor(TensorTy { elem: e, shape: s, .. }) => Type::Tensor(TensorTy::new(*e, self.shape(s))),
            Type::Tuple(ts) => Type::Tuple(ts.iter().map(|t| self.ty(t)).collect()),
            Type::List(ts) => Type::List(ts.iter().map(|t| self.ty(t)).collect()),
            Type::Model(m, args) => Type::Model(
                *m,
                args.iter()
                    .map(|a| match a {
                        TypeArg::Dim(d) => TypeArg::Dim(self.dim(d)),
                        TypeArg::Type(t) => TypeArg::Type(self.ty(t)),
                    })
                    .collect(),
            ),
            Type::ModelVar(v) => self.models.get(v).cloned().unwrap_or(Type::ModelVar(*v)),
            Type::ModelType(t) => Type::ModelType(Box::new(self.ty(t))),
            Type::Fn(FnTy::Sig { params, ret }) => {
                Type::Fn(FnTy::Sig { params: params.iter().map(|t| self.ty(t)).collect(), ret: Box::new(self.ty(ret)) })
            }
            other => other.clone(),
        }
    }
}

/// Unifies a callee's types against argument types. `generic` lists the callee's own dims;
/// other dims in the parameter types must already be equal.
pub struct Unifier<'a> {
    pub subst: Subst,
    generic: &'a HashSet<Sym>,
    /// Deferred dim equations `param == arg` that had several unknowns when first seen.
    pending: Vec<(usize, Dim, Dim)>,
}

impl<'a> Unifier<'a> {
    pub fn new(generic: &'a HashSet<Sym>) -> Unifier<'a> {
        Unifier { subst: Subst::default(), generic, pending: Vec::new() }
    }

    fn unbound(&self, d: &Dim) -> Vec<Sym> {
        let mut v: Vec<Sym> =
            d.vars().filter(|s| self.generic.contains(s) && !self.subst.dims.contains_key(s)).collect();
        v.sort();
        v.dedup();
        v
    }

    /// `param` (callee terms) must equal `arg` (caller terms).
    pub fn dim(&mut self, index: usize, param: &Dim, arg: &Dim) -> Result<(), Mismatch> {
        let p = self.subst.dim(param);
        let unbound = self.unbound(&p);
        match unbound.len() {
            0 => {
                if &p == arg {
                    Ok(())
                } else {
                    Err(Mismatch::Dim { index, expected: p, found: arg.clone() })
                }
            }
            1 => {
                let v = unbound[0];
                match p.sub(arg).solve_for(v) {
                    Some(sol) => {
                        self.subst.dims.insert(v, sol);
                        Ok(())
                    }
                    None => {
                        self.pending.push((index, param.clone(), arg.clone()));
                        Ok(())
                    }
                }
            }
            _ => {
                self.pending.push((index, param.clone(), arg.clone()));
                Ok(())
            }
        }
    }

    /// Re-tries deferred equations until no more progress; reports what is still unsolved.
    pub fn finish(&mut self) -> Result<(), Mismatch> {
        loop {
            let pending = std::mem::take(&mut self.pending);
            let before = pending.len();
            for (i, p, a) in pending {
                self.dim(i, &p, &a)?;
            }
            if self.pending.is_empty() || self.pending.len() == before {
                return Ok(());
            }
        }
    }

    /// Generic dims that no argument determined.
    pub fn unsolved(&self, all: &[Sym]) -> Vec<Sym> {
        all.iter().copied().filter(|s| !self.subst.dims.contains_key(s)).collect()
    }

    pub fn shape(&mut self, param: &Shape, arg: &Shape) -> Result<(), Mismatch> {
        let p_rest = param.iter().position(|i| matches!(i, ShapeItem::Rest(_)));
        match p_rest {
            None => {
                let arg_has_rest = arg.iter().any(|i| matches!(i, ShapeItem::Rest(_)));
                if param.len() != arg.len() || arg_has_rest {
                    return Err(Mismatch::Rank { expected: param.len(), found: arg.len() });
                }
                for (i, (p, a)) in param.iter().zip(arg).enumerate() {
                    if let (ShapeItem::Dim(p), ShapeItem::Dim(a)) = (p, a) {
                        self.dim(i, p, a)?;
                    }
                }
                Ok(())
            }
            Some(k) => {
                let suffix = param.len() - k - 1;
                let ShapeItem::Rest(r) = &param[k] else { unreachable!() };
                // The argument must have at least k + suffix fixed dims around whatever it has.
                if arg.len() < k + suffix {
                    return Err(Mismatch::Rank { expected: k + suffix, found: arg.len() });
                }
                for i in 0..k {
                    match (&param[i], &arg[i]) {
                        (ShapeItem::Dim(p), ShapeItem::Dim(a)) => self.dim(i, p, a)?,
                        _ => return Err(Mismatch::Rank { expected: param.len(), found: arg.len() }),
                    }
                }
                for j in 0..suffix {
                    let pi = param.len() - 1 - j;
                    let ai = arg.len() - 1 - j;
                    match (&param[pi], &arg[ai]) {
                        (ShapeItem::Dim(p), ShapeItem::Dim(a)) => self.dim(ai, p, a)?,
                        _ => return Err(Mismatch::Rank { expected: param.len(), found: arg.len() }),
                    }
                }
                let middle: Shape = arg[k..arg.len() - suffix].to_vec();
                if let Some(prev) = self.subst.rests.get(r) {
                    if prev != &middle {
                        return Err(Mismatch::Kind);
                    }
                } else {
                    self.subst.rests.insert(*r, middle);
                }
                Ok(())
            }
        }
    }

    /// `param` (callee) accepts a value of type `arg` (caller).
    pub fn ty(&mut self, param: &Type, arg: &Type) -> Result<(), Mismatch> {
        match (param, arg) {
            (_, Type::Error) | (Type::Error, _) => Ok(()),
            (
                Type::Tensor(TensorTy { elem: pe, shape: ps, .. }),
                Type::Tensor(TensorTy { elem: ae, shape: as_, .. }),
            ) => {
                elem_accepts(*pe, *ae)?;
                self.shape(ps, as_)
            }
            (Type::Tuple(ps), Type::Tuple(as_)) | (Type::List(ps), Type::List(as_)) => {
                if ps.len() != as_.len() {
                    return Err(Mismatch::Kind);
                }
                for (p, a) in ps.iter().zip(as_) {
                    self.ty(p, a)?;
                }
                Ok(())
            }
            (Type::ModelVar(v), a) if a.is_model() => match self.subst.models.get(v).cloned() {
                Some(prev) if &prev != a && !matches!(prev, Type::ModelVar(pv) if pv == *v) => Err(Mismatch::Kind),
                Some(_) => Ok(()),
                None => {
                    self.subst.models.insert(*v, a.clone());
                    Ok(())
                }
            },
            (Type::Model(pm, pargs), Type::Model(am, aargs)) => {
                if pm != am || pargs.len() != aargs.len() {
                    return Err(Mismatch::Kind);
                }
                for (i, (p, a)) in pargs.iter().zip(aargs).enumerate() {
                    match (p, a) {
                        (TypeArg::Dim(p), TypeArg::Dim(a)) => self.dim(i, p, a)?,
                        (TypeArg::Type(p), TypeArg::Type(a)) => self.ty(p, a)?,
                        _ => return Err(Mismatch::Kind),
                    }
                }
                Ok(())
            }
            (Type::ModelType(p), Type::ModelType(a)) => self.ty(p, a),
            (Type::Str, Type::Str) => Ok(()),
            (Type::Fn(FnTy::Sig { params, ret }), Type::Fn(FnTy::Sig { params: ap, ret: ar })) => {
                if params.len() != ap.len() {
                    return Err(Mismatch::Kind);
                }
                for (p, a) in params.iter().zip(ap) {
                    self.ty(p, a)?;
                }
                self.ty(ret, ar)
            }
            // Polymorphic function values are checked against signatures by the checker.
            (Type::Fn(_), Type::Fn(_)) => Ok(()),
            _ => Err(Mismatch::Kind),
        }
    }
}

/// Whether a parameter of element type `p` accepts an argument of element type `a`.
pub fn elem_accepts(p: Elem, a: Elem) -> Result<(), Mismatch> {
    let ok = match (p, a) {
        (Elem::T(x), Elem::T(y)) => x == y,
        (Elem::T(t), Elem::WeakInt) => t != ElemTy::Bool,
        (Elem::T(t), Elem::WeakFloat) => t.is_float(),
        (Elem::WeakFloat, Elem::WeakInt | Elem::WeakFloat) => true,
        (Elem::WeakInt, Elem::WeakInt) => true,
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err(Mismatch::Elem { expected: p, found: a })
    }
}

/// Joins the element types of two operands of an arithmetic operator (no implicit promotion).
pub fn join_elem(a: Elem, b: Elem) -> Option<Elem> {
    match (a, b) {
        (Elem::T(x), Elem::T(y)) => (x == y).then_some(a),
        (Elem::T(t), Elem::WeakInt) | (Elem::WeakInt, Elem::T(t)) => (t != ElemTy::Bool).then_some(Elem::T(t)),
        (Elem::T(t), Elem::WeakFloat) | (Elem::WeakFloat, Elem::T(t)) => t.is_float().then_some(Elem::T(t)),
        (Elem::WeakInt, Elem::WeakInt) => Some(Elem::WeakInt),
        _ => Some(Elem::WeakFloat),
    }
}

/// Why two shapes do not broadcast.
#[derive(Clone, Debug)]
pub enum BroadcastError {
    /// Dims at position `from_end` (1 = last) differ and neither is 1.
    Dims { from_end: usize, a: Dim, b: Dim },
    /// Rank-polymorphic shapes whose rests cannot be aligned.
    Rest,
}

/// NumPy broadcasting, checked on symbolic shapes.
pub fn broadcast(a: &Shape, b: &Shape) -> Result<Shape, BroadcastError> {
    let mut out: Vec<ShapeItem> = Vec::new();
    let (mut i, mut j) = (a.len(), b.len());
    let one = Dim::constant(1);
    while i > 0 && j > 0 {
        match (&a[i - 1], &b[j - 1]) {
            (ShapeItem::Dim(x), ShapeItem::Dim(y)) => {
                let d = if x == y || y == &one {
                    x.clone()
                } else if x == &one {
                    y.clone()
                } else {
                    return Err(BroadcastError::Dims { from_end: out.len() + 1, a: x.clone(), b: y.clone() });
                };
                out.push(ShapeItem::Dim(d));
                i -= 1;
                j -= 1;
            }
            (ShapeItem::Rest(r), ShapeItem::Rest(s)) if r == s && i == j && a[..i] == b[..j] => {
                out.extend(a[..i].iter().rev().cloned());
                i = 0;
                j = 0;
            }
            _ => return Err(BroadcastError::Rest),
        }
    }
    // Whatever remains of the longer shape passes through.
    out.extend(a[..i].iter().rev().cloned());
    out.extend(b[..j].iter().rev().cloned());
    out.reverse();
    Ok(out)
}

/// Why `a @ b` has no shape.
#[derive(Clone, Debug)]
pub enum MatmulError {
    /// An operand is a scalar.
    Scalar,
    /// A `..` rest stands where a matrix dim must be.
    Rest,
    /// The contracted dims differ: `a`'s last vs `b`'s second to last.
    Inner(Dim, Dim),
    /// The batch dims (all but the last two) do not broadcast.
    Batch(BroadcastError),
}

/// NumPy's `@` on symbolic shapes: a 1-D operand is promoted to a matrix and the added dim
/// removed from the result; `[..S, K] @ [K, M]` is `[..S, M]` whatever the length of `S`; the
/// batch dims broadcast. The checker reports its errors; the verifier re-infers with it.
pub fn matmul_shape(sa: &[ShapeItem], sb: &[ShapeItem]) -> Result<Shape, MatmulError> {
    if sa.is_empty() || sb.is_empty() {
        return Err(MatmulError::Scalar);
    }
    let dim = |i: &ShapeItem| match i {
        ShapeItem::Dim(d) => Some(d.clone()),
        ShapeItem::Rest(_) => None,
    };
    let last = |s: &[ShapeItem]| s.last().and_then(dim);
    let (a_batch, n, k1) = if sa.len() == 1 {
        (vec![], None, last(sa))
    } else if let ShapeItem::Rest(_) = &sa[sa.len() - 2] {
        (sa[..sa.len() - 1].to_vec(), None, last(sa))
    } else {
        (sa[..sa.len() - 2].to_vec(), dim(&sa[sa.len() - 2]), last(sa))
    };
    let (b_batch, k2, m) = if sb.len() == 1 {
        (vec![], last(sb), None)
    } else if let ShapeItem::Rest(_) = &sb[sb.len() - 2] {
        (vec![], None, None)
    } else {
        (sb[..sb.len() - 2].to_vec(), dim(&sb[sb.len() - 2]), last(sb))
    };
    let (Some(k1), Some(k2)) = (k1, k2) else { return Err(MatmulError::Rest) };
    if k1 != k2 {
        return Err(MatmulError::Inner(k1, k2));
    }
    let mut shape = broadcast(&a_batch, &b_batch).map_err(MatmulError::Batch)?;
    shape.extend(n.map(ShapeItem::Dim));
    shape.extend(m.map(ShapeItem::Dim));
    Ok(shape)
}

/// The spatial output size of a window of `k` sliding over `n` padded by `p` at stride `s`, as
/// PyTorch's `(n + 2p - k) / s + 1` with floor division. Dims are polynomials, which have no
/// floor: for symbolic sizes it is the exact division (the same thing when `s` is 1), which a
/// run checks.
pub fn window_out_size(n: &Dim, k: &Dim, s: i64, p: i64) -> Dim {
    match (n.as_const(), k.as_const()) {
        (Some(n), Some(k)) => Dim::constant((n + 2 * p - k).div_euclid(s) + 1),
        _ => {
            let span = n.add(&Dim::constant(2 * p)).sub(k);
            let q = if s == 1 { span } else { span.div(&Dim::constant(s)).unwrap_or(span) };
            q.add(&Dim::constant(1))
        }
    }
}
