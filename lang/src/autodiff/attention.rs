//! Derivatives of `fused_attention` and `attention_weights`, written with `attention_weights`
//! (which recomputes the softmax weights `w` from `q` and `k`), `einsum` and elementwise
//! primitives, all of which have rules of their own, so the result differentiates again.
//!
//! With `s = q kᵀ / √D` (masked), `w = softmax(s)` and `y = w v`:
//! `v̄ = wᵀ ȳ`, `w̄ = ȳ vᵀ`, `s̄ = w ⊙ (w̄ − Σₛ w̄ ⊙ w)`, `q̄ = s̄ k / √D`, `k̄ = s̄ᵀ q / √D`;
//! forward: `ṡ = (q̇ kᵀ + q k̇ᵀ) / √D`, `ẇ = w ⊙ (ṡ − Σₛ w ⊙ ṡ)`, `ẏ = ẇ v + w v̇`. Hidden keys
//! have `w = 0`, so the mask needs no separate treatment.

use super::fwd::{mk, Gen, Res};
use crate::ir::{Attrs, ExprKind, Local, Prim};
use crate::types::{Dim, Elem, ElemTy, ShapeItem, TensorTy, Type};

fn dims(t: &Type) -> Vec<Dim> {
    match t {
        Type::Tensor(TensorTy { shape, .. }) => shape
            .iter()
            .filter_map(|i| match i {
                ShapeItem::Dim(d) => Some(d.clone()),
                ShapeItem::Rest(_) => None,
            })
            .collect(),
        _ => vec![],
    }
}

fn elem(t: &Type) -> ElemTy {
    match t {
        Type::Tensor(TensorTy { elem, .. }) => elem.materialise(),
        _ => ElemTy::F32,
    }
}

/// The pieces every rule needs: leading dims, the letters naming them in einsum specs, the
/// element type, and the operands.
struct Parts {
    lead: Vec<Dim>,
    letters: String,
    et: ElemTy,
    q: Local,
    k: Local,
    len: Local,
    causal: Local,
}

impl Parts {
    fn of(g: &Gen, args: &[Local]) -> Parts {
        let qd = dims(&g.ty_of(args[0]));
        let lead = qd[..qd.len().saturating_sub(2)].to_vec();
        let letters = "abcfghijlmnoprtuvwxyz".chars().take(lead.len()).collect();
        let n = args.len();
        Parts {
            lead,
            letters,
            et: elem(&g.ty_of(args[0])),
            q: args[0],
            k: args[1],
            len: args[n - 2],
            causal: args[n - 1],
        }
    }

    fn ty(&self, last2: [Dim; 2]) -> Type {
        let mut d = self.lead.clone();
        d.extend(last2);
        Type::tensor(self.et, d)
    }

    /// `einsum("L{a},L{b}->L{c}", x, y)` with the leading letters `L`, of type `[.., t0, t1]`.
    fn einsum(&self, g: &mut Gen, spec: [&str; 3], x: Local, y: Local, t: [Dim; 2]) -> Local {
        let l = &self.letters;
        let s = format!("{l}{},{l}{}->{l}{}", spec[0], spec[1], spec[2]);
        g.p(Prim::Einsum, &[x, y], Attrs { spec: Some(s), ..Attrs::default() }, self.ty(t))
    }

    /// `1 / √D` for the queries' feature count `D`, a run-time value when `D` is symbolic.
    fn scale(&self, g: &mut Gen, d: &Dim) -> Local {
        if let Some(n) = d.as_const() {
            return g.lit(1.0 / (n as f64).sqrt(), self.et);
        }
        let i = Type::scalar(ElemTy::I32);
        let dv = g.emit(mk(ExprKind::DimValue(d.clone()), i.clone(), g.sid), i, "d");
        let f = g.p(Prim::Cast, &[dv], Attrs { dtype: Some(self.et), ..Attrs::default() }, Type::scalar(self.et));
        g.p(Prim::Rsqrt, &[f], Attrs::default(), Type::scalar(self.et))
    }

    /// The softmax weights `[.., Q, S]`, recomputed.
    fn weights(&self, g: &mut Gen, qn: &Dim, sn: &Dim) -> Local {
        let ty = self.ty([qn.clone(), sn.clone()]);
        g.p(Prim::AttentionWeights, &[self.q, self.k, self.len, self.causal], Attrs::default(), ty)
    }

    /// `w ⊙ (x − Σₛ x ⊙ w)`: the softmax's Jacobian (symmetric) applied to `x` (`[.., Q, S]`).
    fn softmax_jac(&self, g: &mut Gen, w: Local, x: Local) -> Local {
        let t = g.ty_of(w);
        let xw = g.p(Prim::Mul, &[x, w], Attrs::default(), t.clone());
        let mut kd = dims(&t);
        if let Some(last) = kd.last_mut() {
            *last = Dim::constant(1);
        }
        let red = Attrs { axis: Some(kd.len() - 1), keepdims: true, ..Attrs::default() };
        let s = g.p(
            Prim::Sum,
            &[xw],
            red,
            Type::Tensor(TensorTy::new(Elem::T(self.et), kd.into_iter().map(ShapeItem::Dim).collect())),
        );
        let d = g.p(Prim::Sub, &[x, s], Attrs::default(), t.clone());
        g.p(Prim::Mul, &[w, d], Attrs::default(), t)
    }
}

/// The reverse rule: cotangent contributions to `q`, `k` (and `v`) for the active operands.
pub(super) fn vjp(g: &mut Gen, p: Prim, args: &[Local], out: Local, bar: Local) -> Res<Vec<(usize, Local)>> {
    let pt = Parts::of(g, args);
    let (qd, kd) = (dims(&g.ty_of(pt.q)), dims(&g.ty_of(pt.k)));
    let r = qd.len();
    let (qn, dn, sn) = (qd[r - 2].clone(), qd[r - 1].clone(), kd[r - 2].clone());
    let on: Vec<bool> = args.iter().map(|a| g.active.contains(a)).collect();
    let act = |i: usize| on[i];
    let mut v = Vec::new();
    let (w, wbar) = if p == Prim::Attention {
        let vv = args[2];
        let en = dims(&g.ty_of(vv))[r - 1].clone();
        let w = pt.weights(g, &qn, &sn);
        if act(2) {
            v.push((2, pt.einsum(g, ["qs", "qe", "se"], w, bar, [sn.clone(), en])));
        }
        (w, pt.einsum(g, ["qe", "se", "qs"], bar, vv, [qn.clone(), sn.clone()]))
    } else {
        (out, bar)
    };
    if act(0) || act(1) {
        let sbar = pt.softmax_jac(g, w, wbar);
        let c = pt.scale(g, &dn);
        let t = g.ty_of(sbar);
        let sbar = g.p(Prim::Mul, &[sbar, c], Attrs::default(), t);
        if act(0) {
            v.push((0, pt.einsum(g, ["qs", "sd", "qd"], sbar, pt.k, [qn.clone(), dn.clone()])));
        }
        if act(1) {
            v.push((1, pt.einsum(g, ["qs", "qd", "sd"], sbar, pt.q, [sn, dn])));
        }
    }
    Ok(v)
}

/// The tangent from the operands' tangents (`None` = zero).
pub(super) fn jvp(g: &mut Gen, p: Prim, args: &[Local], ts: &[Option<Local>], out: Local) -> Res<Local> {
    let pt = Parts::of(g, args);
    let (qd, kd) = (dims(&g.ty_of(pt.q)), dims(&g.ty_of(pt.k)));
    let r = qd.len();
    let (qn, dn, sn) = (qd[r - 2].clone(), qd[r - 1].clone(), kd[r - 2].clone());
    let w = if p == Prim::Attention { pt.weights(g, &qn, &sn) } else { out };
    let ot = g.ty_of(out);
    let mut parts = Vec::new();
    if let Some(tq) = ts[0] {
        parts.push(pt.einsum(g, ["qd", "sd", "qs"], tq, pt.k, [qn.clone(), sn.clone()]));
    }
    if let Some(tk) = ts[1] {
        parts.push(pt.einsum(g, ["qd", "sd", "qs"], pt.q, tk, [qn.clone(), sn.clone()]));
    }
    let mut terms = Vec::new();
    if !parts.is_empty() {
        let sdot = g.sum(&parts);
        let c = pt.scale(g, &dn);
        let t = g.ty_of(sdot);
        let sdot = g.p(Prim::Mul, &[sdot, c], Attrs::default(), t);
        let wdot = pt.softmax_jac(g, w, sdot);
        if p == Prim::AttentionWeights {
            return Ok(wdot);
        }
        let en = dims(&ot)[r - 1].clone();
        terms.push(pt.einsum(g, ["qs", "se", "qe"], wdot, args[2], [qn.clone(), en]));
    }
    if p == Prim::Attention {
        if let Some(tv) = ts[2] {
            let en = dims(&ot)[r - 1].clone();
            terms.push(pt.einsum(g, ["qs", "se", "qe"], w, tv, [qn, en]));
        }
    }
    if terms.is_empty() {
        return g.zeros_like(out);
    }
    Ok(g.sum(&terms))
}
