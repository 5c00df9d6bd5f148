//! The propagation rule of each primitive: the layouts its operands must have, the layout of
//! its result, and the collective a partial result needs (`spec/sharding.md` has the table).
//! Primitives without a rule of their own take whole operands and give a whole result, which is
//! always correct; the rules below are what avoid the communication.

use super::{dummy, has_rest, layout, strip, with_layout, Fcx};
use crate::ir::{Expr, ExprKind, Prim};
use crate::types::{AxisId, ShapeItem, Type};

type L = Vec<Vec<AxisId>>;

pub(super) fn prim(cx: &mut Fcx, e: &mut Expr) {
    let ExprKind::Prim { prim, args, attrs } = &mut e.kind else { return };
    for a in args.iter_mut() {
        cx.expr(a);
    }
    let p = *prim;
    let any_rest = has_rest(&e.ty) || args.iter().any(|a| has_rest(&a.ty));
    let any_model = matches!(e.ty, Type::Model(..) | Type::ModelVar(_))
        || args.iter().any(|a| matches!(a.ty, Type::Model(..) | Type::ModelVar(_)));
    if any_model && !matches!(p, Prim::Print | Prim::Save | Prim::Params | Prim::Assert | Prim::AssertClose) {
        // Model arithmetic and `map` work leaf by leaf on blocks of the declared layouts.
        return;
    }
    let partial: Option<(Prim, Vec<AxisId>)>;
    match p {
        crate::unary_prims!() | Prim::Cast | Prim::StopGradient | crate::collective_prims!() => {
            if let Some(a) = args.first() {
                e.ty = with_layout(&e.ty, layout(&a.ty));
            }
            return;
        }
        _ if any_rest => {
            whole(cx, args, false);
            e.ty = strip(&e.ty);
            return;
        }
        crate::binary_prims!() | Prim::Where => {
            let out = elementwise(cx, args, &e.ty);
            e.ty = with_layout(&e.ty, out);
            return;
        }
        Prim::Sum | Prim::Mean | Prim::Max | Prim::Min => {
            let lx = layout(&args[0].ty);
            let (out, axes) = reduced(&lx, attrs.axis, attrs.keepdims);
            e.ty = with_layout(&e.ty, out);
            let coll = match p {
                Prim::Sum => Prim::AllReduceSum,
                Prim::Mean => Prim::AllReduceMean,
                Prim::Max => Prim::AllReduceMax,
                _ => Prim::AllReduceMin,
            };
            partial = (!axes.is_empty()).then_some((coll, axes));
        }
        Prim::Argmax | Prim::Argmin | Prim::Logsumexp => {
            // The reduced dims must be whole; the others keep their layout.
            let lx = layout(&args[0].ty);
            let mut want = lx.clone();
            match attrs.axis {
                Some(a) if a < want.len() => want[a].clear(),
                _ => want.iter_mut().for_each(Vec::clear),
            }
            convert_to(cx, &mut args[0], want.clone(), false);
            let (out, _) = reduced(&want, attrs.axis, attrs.keepdims);
            e.ty = with_layout(&e.ty, out);
            return;
        }
        Prim::Softmax | Prim::LogSoftmax | Prim::Cumsum => {
            let mut want = layout(&args[0].ty);
            if let Some(d) = attrs.axis.and_then(|a| want.get_mut(a)) {
                d.clear();
            }
            convert_to(cx, &mut args[0], want.clone(), false);
            e.ty = with_layout(&e.ty, want);
            return;
        }
        Prim::Transpose | Prim::Permute => {
            let lx = layout(&args[0].ty);
            let out: L = attrs.perm.iter().map(|&i| lx.get(i).cloned().unwrap_or_default()).collect();
            e.ty = with_layout(&e.ty, out);
            return;
        }
        Prim::ExpandDims => {
            let mut out = layout(&args[0].ty);
            let a = attrs.axis.unwrap_or(0).min(out.len());
            out.insert(a, Vec::new());
            e.ty = with_layout(&e.ty, out);
            return;
        }
        Prim::OneHot => {
            // Row-wise: the new last dim (the classes) is whole.
            let mut out = layout(&args[0].ty);
            out.push(Vec::new());
            e.ty = with_layout(&e.ty, out);
            return;
        }
        Prim::BroadcastTo => {
            // New leading dims and broadcast (size-1) dims are whole; the others keep theirs.
            let lx = layout(&args[0].ty);
            let r = rank(&e.ty);
            let shift = r.saturating_sub(lx.len());
            let xs = shape_items(&args[0].ty);
            let mut out = vec![Vec::new(); r];
            for (i, l) in lx.iter().enumerate() {
                if !is_one(xs.get(i)) {
                    out[i + shift].clone_from(l);
                }
            }
            e.ty = with_layout(&e.ty, out);
            return;
        }
        Prim::MatMul => {
            let out = matmul(cx, args, &e.ty);
            match out {
                Some((out, k)) => {
                    e.ty = with_layout(&e.ty, out);
                    partial = (!k.is_empty()).then_some((Prim::AllReduceSum, k));
                }
                None => {
                    whole(cx, args, false);
                    e.ty = strip(&e.ty);
                    return;
                }
            }
        }
        Prim::Print | Prim::Save | Prim::LogScalar | Prim::Assert | Prim::AssertClose | Prim::Params => {
            whole(cx, args, true);
            e.ty = strip(&e.ty);
            return;
        }
        // Whole operands, whole result.
        Prim::Reshape
        | Prim::Concat
        | Prim::Stack
        | Prim::Squeeze
        | Prim::Gather
        | Prim::Einsum
        | Prim::Slice
        | Prim::ScatterAdd
        | Prim::Zeros
        | Prim::Ones
        | Prim::Full
        | Prim::Arange
        | Prim::Eye
        | Prim::Normal
        | Prim::Uniform
        | Prim::HeNormal
        | Prim::GlorotUniform
        | Prim::Map
        | Prim::Load
        | Prim::Exists
        | Prim::Conv2d
        | Prim::Conv2dInputGrad
        | Prim::Conv2dWeightGrad
        | Prim::MaxPool2d
        | Prim::MaxPool2dGrad
        | Prim::AvgPool2d
        | Prim::AvgPool2dGrad => {
            whole(cx, args, false);
            e.ty = strip(&e.ty);
            return;
        }
    }
    if let Some((coll, axes)) = partial {
        let inner = std::mem::replace(e, dummy());
        *e = cx.collective(coll, inner, None, axes, true);
    }
}

fn rank(t: &Type) -> usize {
    shape_items(t).len()
}

fn shape_items(t: &Type) -> Vec<ShapeItem> {
    match t {
        Type::Tensor(tt) => tt.shape.clone(),
        _ => Vec::new(),
    }
}

fn is_one(i: Option<&ShapeItem>) -> bool {
    matches!(i, Some(ShapeItem::Dim(d)) if d.as_const() == Some(1))
}

/// The layout after reducing over `axis` (all dims for `None`) and the axes of the partial sums.
fn reduced(lx: &L, axis: Option<usize>, keepdims: bool) -> (L, Vec<AxisId>) {
    match axis {
        Some(a) if a < lx.len() => {
            let axes = lx[a].clone();
            let mut out = lx.clone();
            if keepdims {
                out[a].clear();
            } else {
                out.remove(a);
            }
            (out, axes)
        }
        _ => {
            let axes: Vec<AxisId> = lx.iter().flatten().copied().collect();
            let out = if keepdims { vec![Vec::new(); lx.len()] } else { Vec::new() };
            (out, axes)
        }
    }
}

fn convert_to(cx: &mut Fcx, a: &mut Expr, want: L, requested: bool) {
    let x = std::mem::replace(a, dummy());
    let t = with_layout(&x.ty, want);
    *a = cx.convert(x, &t, requested);
}

/// Every tensor operand whole (and model operands gathered field by field).
fn whole(cx: &mut Fcx, args: &mut [Expr], requested: bool) {
    for a in args.iter_mut() {
        if requested || matches!(a.ty, Type::Model(..)) {
            cx.make_whole(a);
        } else {
            let x = std::mem::replace(a, dummy());
            let t = strip(&x.ty);
            *a = cx.convert(x, &t, false);
        }
    }
}

/// Broadcasting operands agree dim by dim (aligned from the right): a dim takes the first
/// operand's split that is not a broadcast; a whole operand dim is sliced locally (free); a
/// differently split one is redistributed (`W0510`).
fn elementwise(cx: &mut Fcx, args: &mut [Expr], out_ty: &Type) -> L {
    let r = rank(out_ty);
    let mut target: L = vec![Vec::new(); r];
    for a in args.iter() {
        let la = layout(&a.ty);
        let shift = r.saturating_sub(la.len());
        for (i, l) in la.iter().enumerate() {
            if target[i + shift].is_empty() && !l.is_empty() {
                target[i + shift].clone_from(l);
            }
        }
    }
    unique(&mut target);
    for a in args.iter_mut() {
        let items = shape_items(&a.ty);
        let n = items.len();
        if n == 0 {
            continue;
        }
        let shift = r.saturating_sub(n);
        let want: L =
            (0..n).map(|i| if is_one(items.get(i)) { Vec::new() } else { target[i + shift].clone() }).collect();
        convert_to(cx, a, want, false);
    }
    target
}

/// Drops a later dim's split over an axis an earlier dim already uses.
pub(super) fn unique(l: &mut L) {
    let mut used: Vec<AxisId> = Vec::new();
    for d in l.iter_mut() {
        if d.iter().any(|a| used.contains(a)) {
            d.clear();
        }
        used.extend(d.iter().copied());
    }
}

/// `a @ b` for operands of rank ≥ 2: the result's layout and the axes of the contracted dim
/// (a partial sum over them). `None` sends it to the whole-operand rule.
fn matmul(cx: &mut Fcx, args: &mut [Expr], out_ty: &Type) -> Option<(L, Vec<AxisId>)> {
    let (la, lb) = (layout(&args.first()?.ty), layout(&args.get(1)?.ty));
    let (ra, rb) = (la.len(), lb.len());
    if ra < 2 || rb < 2 || rank(out_ty) != ra.max(rb) {
        return None;
    }
    let (mut ka, mut kb) = (la[ra - 1].clone(), lb[rb - 2].clone());
    if ka != kb {
        if ka.is_empty() {
            ka.clone_from(&kb);
        } else if kb.is_empty() {
            kb.clone_from(&ka);
        } else {
            ka.clear();
            kb.clear();
        }
    }
    let k = ka.clone();
    let batch: L = if rb == 2 {
        la[..ra - 2].to_vec()
    } else if ra == 2 || la[..ra - 2] == lb[..rb - 2] {
        lb[..rb - 2].to_vec()
    } else {
        vec![Vec::new(); ra.max(rb) - 2]
    };
    let mut used: Vec<AxisId> = k.iter().chain(batch.iter().flatten()).copied().collect();
    let mut m = la[ra - 2].clone();
    if m.iter().any(|a| used.contains(a)) {
        m.clear();
    }
    used.extend(m.iter().copied());
    let mut n = lb[rb - 1].clone();
    if n.iter().any(|a| used.contains(a)) {
        n.clear();
    }
    let mut want_a: L = if ra == 2 { Vec::new() } else { batch[batch.len() - (ra - 2)..].to_vec() };
    want_a.push(m.clone());
    want_a.push(ka);
    let mut want_b: L = if rb == 2 { Vec::new() } else { batch[batch.len() - (rb - 2)..].to_vec() };
    want_b.push(kb);
    want_b.push(n.clone());
    convert_to(cx, &mut args[0], want_a, false);
    convert_to(cx, &mut args[1], want_b, false);
    let mut out = batch;
    out.push(m);
    out.push(n);
    Some((out, k))
}
