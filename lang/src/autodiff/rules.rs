//! The reverse-mode rule of every differentiable primitive: given the cotangent of the result,
//! the cotangent contributions to each operand, emitted as IR. Rules use only primitives that
//! themselves have rules, so derived functions can be differentiated again.

use super::build::{along_rule, l, un, unary_rule, Ax};
use super::err;
use super::fwd::{mk, Gen, Op, Res};
use crate::ir::{Attrs, ExprKind, Local, Prim, SliceEntry};
use crate::types::fixed_dims as fixed;
use crate::types::TensorTy;
use crate::types::{Dim, Elem, ElemTy, ShapeItem, Type};

fn shape(t: &Type) -> Vec<ShapeItem> {
    match t {
        Type::Tensor(TensorTy { shape: s, .. }) => s.clone(),
        _ => vec![],
    }
}

fn elem(t: &Type) -> ElemTy {
    match t {
        Type::Tensor(TensorTy { elem: e, .. }) => e.materialise(),
        _ => ElemTy::F32,
    }
}

fn tensor(e: ElemTy, s: Vec<ShapeItem>) -> Type {
    Type::Tensor(TensorTy::new(Elem::T(e), s))
}

impl Gen<'_> {
    fn bin(&mut self, p: Prim, a: Local, b: Local, ty: Type) -> Local {
        self.p(p, &[a, b], Attrs::default(), ty)
    }

    /// Sums a cotangent of a broadcast result back to the shape of an operand.
    pub(super) fn unbroadcast(&mut self, g: Local, target: &Type) -> Res<Local> {
        let gt = self.ty_of(g);
        if &gt == target || !matches!(target, Type::Tensor(..)) {
            return Ok(g);
        }
        let (o, a) = (shape(&gt), shape(target));
        let et = elem(&gt);
        if a.is_empty() {
            let attrs = Attrs { axis: None, ..Attrs::default() };
            return Ok(self.p(Prim::Sum, &[g], attrs, tensor(et, vec![])));
        }
        if o.len() < a.len() {
            return Err(err(self.span, "internal: cannot unbroadcast to a larger shape"));
        }
        let mut cur = g;
        let mut cs = o.clone();
        for _ in 0..(o.len() - a.len()) {
            if matches!(cs[0], ShapeItem::Rest(_)) {
                return Err(err(self.span, "cannot differentiate broadcasting over a `..` rest"));
            }
            cs.remove(0);
            cur = self.p(Prim::Sum, &[cur], Attrs { axis: Some(0), ..Attrs::default() }, tensor(et, cs.clone()));
        }
        let one = Dim::constant(1);
        for i in 0..a.len() {
            if let (ShapeItem::Dim(ad), ShapeItem::Dim(cd)) = (&a[i], &cs[i]) {
                if *ad == one && *cd != one {
                    cs[i] = ShapeItem::Dim(one.clone());
                    cur = self.p(
                        Prim::Sum,
                        &[cur],
                        Attrs { axis: Some(i), keepdims: true, ..Attrs::default() },
                        tensor(et, cs.clone()),
                    );
                }
            }
        }
        Ok(cur)
    }

    /// `g` broadcast to the shape of `like`.
    fn bcast_like(&mut self, g: Local, like: Local) -> Res<Local> {
        let lt = self.ty_of(like);
        let gt = self.ty_of(g);
        if gt == lt {
            return Ok(g);
        }
        match fixed(&shape(&lt)) {
            Some(d) => {
                let ty = tensor(elem(&gt), shape(&lt));
                Ok(self.p(Prim::BroadcastTo, &[g], Attrs { shape: d, ..Attrs::default() }, ty))
            }
            None => {
                let z = self.zeros_like(like)?;
                Ok(self.bin(Prim::Add, z, g, lt))
            }
        }
    }

    /// A reduced cotangent with the reduced axis put back (size 1), ready to broadcast.
    fn keep(&mut self, g: Local, axis: Option<usize>, keepdims: bool) -> Local {
        match axis {
            Some(k) if !keepdims => {
                let gt = self.ty_of(g);
                let mut s = shape(&gt);
                s.insert(k.min(s.len()), ShapeItem::Dim(Dim::constant(1)));
                self.p(Prim::ExpandDims, &[g], Attrs { axis: Some(k), ..Attrs::default() }, tensor(elem(&gt), s))
            }
            _ => g,
        }
    }

    fn scalar(&mut self, x: f64, like: &Type) -> Local {
        self.lit(x, elem(like))
    }

    fn cmp(&mut self, p: Prim, a: Local, b: Local) -> Local {
        let at = self.ty_of(a);
        let bt = self.ty_of(b);
        let s = crate::types::unify::broadcast(&shape(&at), &shape(&bt)).unwrap_or_else(|_| shape(&at));
        self.p(p, &[a, b], Attrs::default(), tensor(ElemTy::Bool, s))
    }

    fn select(&mut self, c: Local, yes: Local, no: Local, ty: Type) -> Local {
        self.p(Prim::Where, &[c, yes, no], Attrs::default(), ty)
    }

    /// The cotangent of a dim count as a float scalar (for `mean`).
    fn count(&mut self, d: Dim, et: ElemTy) -> Local {
        let i = self.emit(
            mk(ExprKind::DimValue(d), Type::Tensor(TensorTy::new(Elem::WeakInt, vec![])), self.sid),
            Type::Tensor(TensorTy::new(Elem::WeakInt, vec![])),
            "n",
        );
        self.p(Prim::Cast, &[i], Attrs { dtype: Some(et), ..Attrs::default() }, Type::scalar(et))
    }

    fn swap_last(&mut self, x: Local) -> Res<Local> {
        let t = self.ty_of(x);
        let s = shape(&t);
        if s.iter().any(|i| matches!(i, ShapeItem::Rest(_))) {
            return Err(err(self.span, "cannot differentiate `@` over a `..` rest"));
        }
        let n = s.len();
        let mut perm: Vec<usize> = (0..n).collect();
        perm.swap(n - 2, n - 1);
        let mut s2 = s.clone();
        s2.swap(n - 2, n - 1);
        Ok(self.p(Prim::Permute, &[x], Attrs { perm, ..Attrs::default() }, tensor(elem(&t), s2)))
    }

    fn matmul(&mut self, a: Local, b: Local) -> Local {
        let (at, bt) = (self.ty_of(a), self.ty_of(b));
        let (sa, sb) = (shape(&at), shape(&bt));
        let et = elem(&at);
        let mut out = Vec::new();
        let (ba, bb) = (&sa[..sa.len().saturating_sub(2)], &sb[..sb.len().saturating_sub(2)]);
        if sa.len() >= 2 && sb.len() >= 2 {
            out = crate::types::unify::broadcast(&ba.to_vec(), &bb.to_vec()).unwrap_or_default();
        }
        if sa.len() >= 2 {
            out.push(sa[sa.len() - 2].clone());
        }
        if sb.len() >= 2 {
            out.push(sb[sb.len() - 1].clone());
        }
        self.p(Prim::MatMul, &[a, b], Attrs::default(), tensor(et, out))
    }

    /// `Σ_batch a[.., n, k]ᵀ @ g[.., n, m]` as one product of `[rows, k]ᵀ @ [rows, m]`, the
    /// batch dims folded into the rows: the gradient of a matrix applied to every row of a
    /// batch (`x[B, T, D] @ w[D, F]`) without a `[B, D, F]` intermediate. `None` when `a` has
    /// no batch dims or a shape is not fixed.
    fn rows_product(&mut self, a: Local, g: Local) -> Res<Option<Local>> {
        let (at, gt) = (self.ty_of(a), self.ty_of(g));
        let (Some(sa), Some(sg)) = (fixed(&shape(&at)), fixed(&shape(&gt))) else { return Ok(None) };
        if sa.len() < 3 || sg.len() != sa.len() {
            return Ok(None);
        }
        let rows = sa[..sa.len() - 1].iter().fold(Dim::constant(1), |r, d| r.mul(d));
        let et = elem(&at);
        let flat = |gen: &mut Self, x: Local, last: &Dim| {
            let d = vec![rows.clone(), last.clone()];
            let ty = tensor(et, d.iter().cloned().map(ShapeItem::Dim).collect());
            gen.p(Prim::Reshape, &[x], Attrs { shape: d, ..Attrs::default() }, ty)
        };
        let a2 = flat(self, a, &sa[sa.len() - 1]);
        let g2 = flat(self, g, &sg[sg.len() - 1]);
        let a2t = self.swap_last(a2)?;
        Ok(Some(self.matmul(a2t, g2)))
    }

    fn expand(&mut self, x: Local, axis: usize) -> Local {
        let t = self.ty_of(x);
        let mut s = shape(&t);
        s.insert(axis, ShapeItem::Dim(Dim::constant(1)));
        self.p(Prim::ExpandDims, &[x], Attrs { axis: Some(axis), ..Attrs::default() }, tensor(elem(&t), s))
    }
}

mod index;
mod linalg;
mod nn;
mod reduce;

/// One primitive application being differentiated, as the rules in the family files read it.
pub(super) struct Site<'a> {
    pub p: Prim,
    pub attrs: &'a Attrs,
    pub args: &'a [Local],
    pub tys: &'a [Type],
    pub act: &'a [bool],
    pub bar: Local,
    pub ot: &'a Type,
}

/// Cotangent contributions `(operand index, value)` of one operation.
pub(super) fn vjp(g: &mut Gen, op: &Op, args: &[Local], out: Local, bar: Local) -> Res<Vec<(usize, Local)>> {
    let ot = g.ty_of(out);
    let et = elem(&ot);
    let tys: Vec<Type> = args.iter().map(|a| g.ty_of(*a)).collect();
    let act: Vec<bool> = args.iter().map(|a| g.active.contains(a)).collect();
    let prim = match op {
        Op::Prim(p, attrs) => (*p, attrs.clone()),
        Op::Tuple => {
            let mut v = Vec::new();
            for (i, t) in tys.iter().enumerate() {
                if act[i] {
                    let x =
                        g.emit(mk(ExprKind::TupleGet(Box::new(g.local(bar)), i), t.clone(), g.sid), t.clone(), "tb");
                    v.push((i, x));
                }
            }
            return Ok(v);
        }
        Op::ModelBuild => {
            let mut v = Vec::new();
            for (i, t) in tys.iter().enumerate() {
                if act[i] {
                    let x = g.emit(mk(ExprKind::Field(Box::new(g.local(bar)), i), t.clone(), g.sid), t.clone(), "mb");
                    v.push((i, x));
                }
            }
            return Ok(v);
        }
        Op::Relayout => {
            let back = g.emit(g.local(bar), tys[0].clone(), "rl");
            return Ok(vec![(0, back)]);
        }
        Op::TupleGet(k) => {
            let Type::Tuple(parts) = tys[0].clone() else { return Ok(vec![]) };
            let mut items = Vec::new();
            for (j, t) in parts.iter().enumerate() {
                if j == *k {
                    items.push(bar);
                } else {
                    let comp = g.emit(
                        mk(ExprKind::TupleGet(Box::new(g.local(args[0])), j), t.clone(), g.sid),
                        t.clone(),
                        "tc",
                    );
                    items.push(g.zeros_like(comp)?);
                }
            }
            let e = mk(ExprKind::Tuple(items.iter().map(|x| g.local(*x)).collect()), tys[0].clone(), g.sid);
            return Ok(vec![(0, g.emit(e, tys[0].clone(), "tgb"))]);
        }
        Op::Field(k) => {
            let Type::Model(id, margs) = tys[0].clone() else {
                return Err(err(g.span, "cannot differentiate a field of a generic model here"));
            };
            let n = g.prog.model(id).fields.len();
            let mut items = Vec::new();
            for j in 0..n {
                if j == *k {
                    items.push(bar);
                } else {
                    let ft = g.field_type(id, &margs, j);
                    let comp = g.emit(mk(ExprKind::Field(Box::new(g.local(args[0])), j), ft.clone(), g.sid), ft, "fc");
                    items.push(g.zeros_like(comp)?);
                }
            }
            let e =
                mk(ExprKind::ModelBuild { fields: items.iter().map(|x| g.local(*x)).collect() }, tys[0].clone(), g.sid);
            return Ok(vec![(0, g.emit(e, tys[0].clone(), "fb"))]);
        }
    };
    let (p, attrs) = prim;
    let site = Site { p, attrs: &attrs, args, tys: &tys, act: &act, bar, ot: &ot };
    let a = args.first().copied();
    let b = args.get(1).copied();
    let model = |t: &Type| t.is_model();
    let mut v = Vec::new();
    match p {
        Prim::Add | Prim::Sub => {
            if act[0] {
                if model(&tys[0]) != model(&ot) {
                    return Err(err(g.span, "cannot differentiate the scalar of model arithmetic"));
                }
                v.push((0, g.unbroadcast(bar, &tys[0])?));
            }
            if act[1] {
                if model(&tys[1]) != model(&ot) {
                    return Err(err(g.span, "cannot differentiate the scalar of model arithmetic"));
                }
                let x = g.unbroadcast(bar, &tys[1])?;
                let x = if p == Prim::Sub { g.negate(x) } else { x };
                v.push((1, x));
            }
        }
        Prim::Mul => {
            let (a, b) = (a.unwrap(), b.unwrap());
            for (i, other) in [(0, b), (1, a)] {
                if act[i] {
                    if model(&tys[i]) != model(&ot) {
                        return Err(err(g.span, "cannot differentiate the scalar of model arithmetic"));
                    }
                    let m = g.bin(Prim::Mul, bar, other, ot.clone());
                    v.push((i, g.unbroadcast(m, &tys[i])?));
                }
            }
        }
        Prim::Div => {
            let b = b.unwrap();
            if act[0] {
                let m = g.bin(Prim::Div, bar, b, ot.clone());
                v.push((0, g.unbroadcast(m, &tys[0])?));
            }
            if act[1] {
                if model(&tys[1]) != model(&ot) {
                    return Err(err(g.span, "cannot differentiate the scalar of model arithmetic"));
                }
                let m = g.bin(Prim::Mul, bar, out, ot.clone());
                let m = g.bin(Prim::Div, m, b, ot.clone());
                let m = g.negate(m);
                v.push((1, g.unbroadcast(m, &tys[1])?));
            }
        }
        Prim::Pow => {
            let (a, b) = (a.unwrap(), b.unwrap());
            if act[0] {
                let one = g.scalar(1.0, &tys[1]);
                let bm1 = g.bin(Prim::Sub, b, one, tys[1].clone());
                let pw = g.bin(Prim::Pow, a, bm1, ot.clone());
                let t = g.bin(Prim::Mul, bar, b, ot.clone());
                let t = g.bin(Prim::Mul, t, pw, ot.clone());
                v.push((0, g.unbroadcast(t, &tys[0])?));
            }
            if act[1] {
                let la = g.p(Prim::Log, &[a], Attrs::default(), tys[0].clone());
                let t = g.bin(Prim::Mul, bar, out, ot.clone());
                let t = g.bin(Prim::Mul, t, la, ot.clone());
                v.push((1, g.unbroadcast(t, &tys[1])?));
            }
        }
        Prim::Rem => {
            // x % y = x - q·y with q = trunc(x / y), locally constant: d/dx = 1, d/dy = -q.
            // q is written (x - out) / y so that the rule itself stays differentiable.
            let (a, b) = (a.unwrap(), b.unwrap());
            if act[0] {
                v.push((0, g.unbroadcast(bar, &tys[0])?));
            }
            if act[1] {
                let d = g.bin(Prim::Sub, a, out, ot.clone());
                let q = g.bin(Prim::Div, d, b, ot.clone());
                let m = g.bin(Prim::Mul, bar, q, ot.clone());
                let m = g.negate(m);
                v.push((1, g.unbroadcast(m, &tys[1])?));
            }
        }
        // A unary elementwise primitive's rule is its table entry's (`ir::prim`).
        crate::unary_prims!() => match unary_rule(p, bar, a.unwrap(), out) {
            Some(r) => v.push((0, g.build(r, et)?)),
            None => return Err(no_derivative(g, p)),
        },
        // So is a primitive's along one axis.
        crate::along_prims!() => match along_rule(p, bar, a.unwrap(), out, Ax::of(&attrs)) {
            Some(r) => v.push((0, g.build(r, et)?)),
            None => return Err(no_derivative(g, p)),
        },
        Prim::Full => {
            // `full(v, d…)`: every element is `v`, so its cotangent is the sum.
            if act[0] {
                let s = g.unbroadcast(bar, &tys[0])?;
                let s = if elem(&tys[0]) == elem(&ot) {
                    s
                } else {
                    g.p(Prim::Cast, &[s], Attrs { dtype: Some(elem(&tys[0])), ..Attrs::default() }, tys[0].clone())
                };
                v.push((0, s));
            }
        }
        Prim::GeluGrad => {
            // y = g·gelu'(x): x̄ = ȳ·g·gelu''(x), ḡ = gelu_grad(x, ȳ).
            let (x, gb) = (a.unwrap(), b.unwrap());
            if act[0] {
                let d2 = gelu_second(g, x, et)?;
                v.push((0, g.build(l(bar) * gb * d2, et)?));
            }
            if act[1] {
                v.push((1, g.p(Prim::GeluGrad, &[x, bar], Attrs::default(), ot.clone())));
            }
        }
        Prim::Maximum | Prim::Minimum => {
            let (a, b) = (a.unwrap(), b.unwrap());
            let c = g.cmp(if p == Prim::Maximum { Prim::Ge } else { Prim::Le }, a, b);
            let z = g.scalar(0.0, &ot);
            if act[0] {
                let s = g.select(c, bar, z, ot.clone());
                v.push((0, g.unbroadcast(s, &tys[0])?));
            }
            if act[1] {
                let s = g.select(c, z, bar, ot.clone());
                v.push((1, g.unbroadcast(s, &tys[1])?));
            }
        }
        Prim::Where => {
            let c = args[0];
            let z = g.scalar(0.0, &ot);
            if act[1] {
                let s = g.select(c, bar, z, ot.clone());
                v.push((1, g.unbroadcast(s, &tys[1])?));
            }
            if act[2] {
                let s = g.select(c, z, bar, ot.clone());
                v.push((2, g.unbroadcast(s, &tys[2])?));
            }
        }
        Prim::Cast => {
            let to = elem(&tys[0]);
            v.push((0, g.p(Prim::Cast, &[bar], Attrs { dtype: Some(to), ..Attrs::default() }, tys[0].clone())));
        }
        Prim::StopGradient => {}
        Prim::Sum | Prim::Mean => reduce::sum_or_mean(g, &site, &mut v)?,
        Prim::Max | Prim::Min => {
            // Entries that tie for the extremum share the cotangent equally (as in JAX and
            // PyTorch), so the gradient stays a subgradient: it sums to the cotangent.
            let y = g.keep(out, attrs.axis, attrs.keepdims);
            let mask = g.cmp(Prim::Eq, a.unwrap(), y);
            let z = g.scalar(0.0, &ot);
            let one = g.scalar(1.0, &ot);
            let ind = g.select(mask, one, z, tys[0].clone());
            let red = Attrs { axis: attrs.axis, keepdims: attrs.keepdims, ..Attrs::default() };
            let cnt = g.p(Prim::Sum, &[ind], red, ot.clone());
            let share = g.bin(Prim::Div, bar, cnt, ot.clone());
            let k = g.keep(share, attrs.axis, attrs.keepdims);
            let kb = g.bcast_like(k, a.unwrap())?;
            v.push((0, g.select(mask, kb, z, tys[0].clone())));
        }
        Prim::Logsumexp => {
            let k = g.keep(bar, attrs.axis, attrs.keepdims);
            let y = g.keep(out, attrs.axis, attrs.keepdims);
            let d = g.bin(Prim::Sub, a.unwrap(), y, tys[0].clone());
            let e = g.p(Prim::Exp, &[d], Attrs::default(), tys[0].clone());
            v.push((0, g.bin(Prim::Mul, e, k, tys[0].clone())));
        }
        Prim::MatMul => linalg::matmul(g, &site, &mut v)?,
        Prim::Reshape | Prim::ExpandDims | Prim::Squeeze => {
            let Some(d) = fixed(&shape(&tys[0])) else {
                return Err(err(g.span, "cannot differentiate a reshape of a `..` rest"));
            };
            v.push((0, g.p(Prim::Reshape, &[bar], Attrs { shape: d, ..Attrs::default() }, tys[0].clone())));
        }
        Prim::Transpose | Prim::Permute => {
            let mut inv = vec![0; attrs.perm.len()];
            for (i, &p) in attrs.perm.iter().enumerate() {
                inv[p] = i;
            }
            v.push((0, g.p(Prim::Permute, &[bar], Attrs { perm: inv, ..Attrs::default() }, tys[0].clone())));
        }
        Prim::BroadcastTo => v.push((0, g.unbroadcast(bar, &tys[0])?)),
        // The collectives' adjoints (the sharding pass runs after this one, so these apply to
        // programs differentiated after partitioning): all-reduce ↔ identity, all-gather ↔
        // reduce-scatter, local slice ↔ all-gather.
        Prim::AllReduceSum | Prim::AllReduceMean => v.push((0, bar)),
        Prim::AllGather => v.push((0, g.p(Prim::ReduceScatter, &[bar], attrs.clone(), tys[0].clone()))),
        Prim::ReduceScatter | Prim::LocalSlice => {
            v.push((0, g.p(Prim::AllGather, &[bar], attrs.clone(), tys[0].clone())))
        }
        // all-to-all ↔ the all-to-all that moves the split back.
        Prim::AllToAll => {
            let back = Attrs {
                axis: attrs.perm.first().copied(),
                perm: attrs.axis.into_iter().collect(),
                mesh_axes: attrs.mesh_axes.clone(),
                ..Attrs::default()
            };
            v.push((0, g.p(Prim::AllToAll, &[bar], back, tys[0].clone())))
        }
        Prim::Concat | Prim::Stack => index::concat_or_stack(g, &site, &mut v)?,
        // The copies of `@copies`: a join's operands take their copies of the cotangent; a
        // copy's cotangent is joined with zeros in the other copies' places.
        Prim::CopyJoin => {
            let n = tys.len();
            for (i, t) in tys.iter().enumerate().filter(|(i, _)| act[*i]) {
                let at = Attrs { axis: attrs.axis, perm: vec![i, n], ..Attrs::default() };
                v.push((i, g.p(Prim::CopySplit, &[bar], at, t.clone())));
            }
        }
        Prim::CopySplit => {
            // A copy of `bar` marked as copy `c`'s part: `Gen::sum` joins the parts.
            let (c, n) = (attrs.perm.first().copied().unwrap_or(0), attrs.perm.get(1).copied().unwrap_or(1));
            let part = g.emit(mk(ExprKind::Local(bar), ot.clone(), g.sid), ot.clone(), "cp");
            g.copy_parts.insert(part, (c, n, attrs.axis, tys[0].clone()));
            v.push((0, part));
        }
        Prim::Slice => index::slice(g, &site, &mut v)?,
        Prim::Gather => {
            let Some(d) = fixed(&shape(&tys[0])) else { return Err(err(g.span, "gather from a rest")) };
            let attrs2 = Attrs { axis: attrs.axis, shape: d, ..Attrs::default() };
            v.push((0, g.p(Prim::ScatterAdd, &[bar, args[1]], attrs2, tys[0].clone())));
        }
        Prim::ScatterAdd => {
            let attrs2 = Attrs { axis: attrs.axis, ..Attrs::default() };
            v.push((0, g.p(Prim::Gather, &[bar, args[1]], attrs2, tys[0].clone())));
        }
        Prim::Update => index::update(g, &site, &mut v)?,
        Prim::TakeAlong => {
            let Some(d) = fixed(&shape(&tys[0])) else { return Err(err(g.span, "take_along_axis from a rest")) };
            let attrs2 = Attrs { axis: attrs.axis, shape: d, ..Attrs::default() };
            v.push((0, g.p(Prim::ScatterAddAlong, &[bar, args[1]], attrs2, tys[0].clone())));
        }
        Prim::ScatterAddAlong => {
            let attrs2 = Attrs { axis: attrs.axis, ..Attrs::default() };
            v.push((0, g.p(Prim::TakeAlong, &[bar, args[1]], attrs2, tys[0].clone())));
        }
        Prim::Attention | Prim::AttentionWeights => v.extend(super::attention::vjp(g, p, args, out, bar)?),
        Prim::Einsum => linalg::einsum(g, &site, &mut v)?,
        // The convolutions are bilinear, and each one's adjoints are the other two
        // (`kernels::ops::conv2d*`): ⟨conv(x, w), g⟩ = ⟨x, input_grad(g, w)⟩ = ⟨w, weight_grad(x, g)⟩.
        Prim::Conv2d => nn::conv(g, &site, &mut v, nn::Conv::Forward)?,
        Prim::Conv2dInputGrad => nn::conv(g, &site, &mut v, nn::Conv::InputGrad)?,
        Prim::Conv2dWeightGrad => nn::conv(g, &site, &mut v, nn::Conv::WeightGrad)?,
        // Max pooling selects: the cotangent goes to each window's first maximum, and the
        // positions (the first operand, when a second one is picked from) get none.
        Prim::MaxPool2d => {
            let i = args.len() - 1;
            if act[i] {
                v.push((i, g.p(Prim::MaxPool2dGrad, &[args[0], bar], attrs.clone(), tys[i].clone())));
            }
        }
        Prim::MaxPool2dGrad => {
            if act[1] {
                v.push((1, g.p(Prim::MaxPool2d, &[args[0], bar], attrs.clone(), tys[1].clone())));
            }
        }
        Prim::AvgPool2d => {
            let Some(d) = fixed(&shape(&tys[0])) else { return Err(err(g.span, "avg_pool2d of a rest")) };
            let at = Attrs { perm: attrs.perm.clone(), shape: d[2..].to_vec(), ..Attrs::default() };
            v.push((0, g.p(Prim::AvgPool2dGrad, &[bar], at, tys[0].clone())));
        }
        Prim::AvgPool2dGrad => {
            let at = Attrs { perm: attrs.perm.clone(), ..Attrs::default() };
            v.push((0, g.p(Prim::AvgPool2d, &[bar], at, tys[0].clone())));
        }
        // No derivative: comparisons, logic, indices, creation, counts, `map` (expanded
        // before differentiation) and effects. Listed, not caught by a wildcard, so that a new
        // primitive cannot compile without a decision here.
        crate::comparison_prims!()
        | Prim::And
        | Prim::Or
        | Prim::Argmax
        | Prim::Argmin
        | Prim::Argsort
        | Prim::Quantize
        | Prim::Prune
        | Prim::OneHot
        | Prim::Zeros
        | Prim::Ones
        | Prim::Arange
        | Prim::Eye
        | Prim::Normal
        | Prim::Uniform
        | Prim::HeNormal
        | Prim::GlorotUniform
        | Prim::Params
        | Prim::Map
        | Prim::ModelSum
        | Prim::ShardState
        | Prim::Print
        | Prim::Load
        | Prim::Save
        | Prim::LogScalar
        | Prim::Exists
        | Prim::Clock
        | Prim::Assert
        | Prim::AssertClose
        | Prim::AllReduceMax
        | Prim::AllReduceMin => {
            return Err(no_derivative(g, p));
        }
        // A derived function holding a tape is differentiated through its recomputing twin.
        Prim::TapeNew | Prim::TapePush | Prim::TapeGet => {
            return Err(err(g.span, format!("internal: `{}` reached reverse mode", p.name())));
        }
    }
    Ok(v)
}

/// `gelu''(x)` of the tanh approximation, in the forward kernel's terms (`s = sigmoid(2u)`,
/// `u = c (x + k x³)`, `du = c (1 + 3k x²)`): `s (1 - s) (4 du + 4x (1 - 2s) du² + 12ck x²)`,
/// for the derivatives of `gelu_grad`.
pub(super) fn gelu_second(g: &mut Gen, x: Local, et: ElemTy) -> Res<Local> {
    let (c, k) = (0.797_884_560_802_865_4, 0.044_715);
    let s = g.build(un(Prim::Sigmoid, (2.0 * c) * (l(x) + k * (l(x) * x * x))), et)?;
    let du = g.build(c * (1.0 + (3.0 * k) * (l(x) * x)), et)?;
    let inner = 4.0 * l(du) + 4.0 * l(x) * (1.0 - 2.0 * l(s)) * (l(du) * du) + (12.0 * c * k) * (l(x) * x);
    g.build(l(s) * (1.0 - l(s)) * inner, et)
}

fn no_derivative(g: &Gen, p: Prim) -> crate::diag::Diagnostic {
    err(g.span, format!("cannot differentiate through `{}`: it has no derivative", p.name()))
}
