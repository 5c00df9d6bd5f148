//! The propagation rule of each primitive: the layouts its operands must have, the layout of
//! its result, and the collective a partial result needs (`spec/sharding.md` has the table).
//! Primitives without a rule of their own take whole operands and give a whole result, which is
//! always correct; the rules below are what avoid the communication.

use super::{dummy, has_rest, layout, with_layout, Fcx};
use crate::ir::{Expr, ExprKind, Prim, SliceEntry};
use crate::types::{AxisId, Elem, ElemTy, ShapeItem, TensorTy, Type};
use std::collections::HashMap;

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
    if any_model
        && !matches!(p, Prim::Print | Prim::Save | Prim::Params | Prim::ModelSum | Prim::Assert | Prim::AssertClose)
    {
        // Model arithmetic and `map` work leaf by leaf on blocks of the declared layouts.
        return;
    }
    let partial: Option<(Prim, Vec<AxisId>)>;
    match p {
        // A loop's tape stores what each iteration pushes (its state or its residuals) as this
        // rank holds it: nothing is gathered. The tape (one push per tape, in the loop's body)
        // takes the pushed layouts as its type (`list[(…)]`), which carries them through copies
        // of the tape to `TapeGet`, which gives the blocks back in them.
        Prim::TapePush => {
            let held = match args.first().map(|a| &a.ty) {
                Some(Type::List(items)) if items.len() == 1 => Some(items[0].clone()),
                _ => None,
            };
            match (held, &args[..]) {
                (Some(t), [tape, item]) if t.replicated() == item.ty.replicated() => {
                    let ty = Type::List(vec![item.ty.clone()]);
                    if let ExprKind::Local(l) = tape.kind {
                        cx.locals[l.0 as usize].ty = ty.clone();
                    }
                    e.ty = ty;
                    return;
                }
                _ => return whole_result(cx, args, &mut e.ty),
            }
        }
        Prim::TapeGet => {
            let held = match args.first().map(|a| &a.ty) {
                Some(Type::List(items)) if items.len() == 1 => Some(items[0].clone()),
                _ => None,
            };
            match held {
                Some(t) if t.replicated() == e.ty.replicated() => {
                    if let Some(i) = args.get_mut(1) {
                        cx.make_whole(i);
                    }
                    e.ty = t;
                    return;
                }
                _ => return whole_result(cx, args, &mut e.ty),
            }
        }
        Prim::Save if super::sharded_save(args) => {
            // A checkpoint folder: each rank writes its own blocks (`interp::shards`), so
            // nothing is gathered, a model no more than a tuple.
            e.ty = e.ty.replicated();
            return;
        }
        crate::unary_prims!() | Prim::Cast | Prim::StopGradient | crate::collective_prims!() => {
            if let Some(a) = args.first() {
                e.ty = with_layout(&e.ty, layout(&a.ty));
            }
            return;
        }
        _ if any_rest => {
            return whole_result(cx, args, &mut e.ty);
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
            partial = combined_by(p).filter(|_| !axes.is_empty()).map(|coll| (coll, axes));
        }
        Prim::Argmax | Prim::Argmin | Prim::Logsumexp => {
            // The reduced dims must be whole; the others keep their layout.
            let lx = layout(&args[0].ty);
            let mut want = lx.clone();
            match attrs.axis {
                Some(a) if a < want.len() => want[a].clear(),
                _ => want.iter_mut().for_each(Vec::clear),
            }
            convert_along(cx, &mut args[0], want.clone(), p, attrs.axis);
            let (out, _) = reduced(&want, attrs.axis, attrs.keepdims);
            e.ty = with_layout(&e.ty, out);
            return;
        }
        Prim::Update if args.len() == 3 => {
            // The buffer is whole along the written axis; the update takes the buffer's splits
            // in its other dims.
            let k = attrs.axis.unwrap_or(0);
            let mut want = layout(&args[0].ty);
            if let Some(d) = want.get_mut(k) {
                d.clear();
            }
            convert_along(cx, &mut args[0], want.clone(), p, Some(k));
            let mut vw = want.clone();
            if rank(&args[1].ty) + 1 == want.len() {
                vw.remove(k);
            }
            convert_to(cx, &mut args[1], vw, false);
            e.ty = with_layout(&e.ty, want);
            return;
        }
        Prim::Attention | Prim::AttentionWeights if args.len() >= 4 => {
            // Split only in the leading (batch, head) dims: positions and features are whole,
            // and each block of heads attends on its own, with no communication.
            let mut want = layout(&args[0].ty);
            let r = want.len();
            for d in want.iter_mut().skip(r.saturating_sub(2)) {
                d.clear();
            }
            let n = args.len();
            for a in &mut args[..n - 2] {
                convert_to(cx, a, want.clone(), false);
            }
            e.ty = with_layout(&e.ty, want);
            return;
        }
        Prim::TakeAlong | Prim::ScatterAddAlong if args.len() == 2 => {
            // Along the axis the operands are taken whole; their other dims agree, so both take
            // the values' splits there, and so does the result.
            let mut want = layout(&args[0].ty);
            if let Some(d) = attrs.axis.and_then(|a| want.get_mut(a)) {
                d.clear();
            }
            convert_along(cx, &mut args[0], want.clone(), p, attrs.axis);
            if layout(&args[1].ty).len() == want.len() {
                convert_to(cx, &mut args[1], want.clone(), false);
            }
            e.ty = with_layout(&e.ty, want);
            return;
        }
        crate::along_prims!() | Prim::Argsort => {
            let mut want = layout(&args[0].ty);
            if let Some(d) = attrs.axis.and_then(|a| want.get_mut(a)) {
                d.clear();
            }
            convert_along(cx, &mut args[0], want.clone(), p, attrs.axis);
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
            let Some((out, k)) = matmul(cx, args, &e.ty) else { return whole_result(cx, args, &mut e.ty) };
            e.ty = with_layout(&e.ty, out);
            partial = (!k.is_empty()).then_some((Prim::AllReduceSum, k));
        }
        Prim::Einsum => {
            let Some((out, k)) = einsum(cx, args, attrs.spec.as_deref(), &e.ty) else {
                return whole_result(cx, args, &mut e.ty);
            };
            e.ty = with_layout(&e.ty, out);
            partial = (!k.is_empty()).then_some((Prim::AllReduceSum, k));
        }
        Prim::Print
        | Prim::Save
        | Prim::LogScalar
        | Prim::Assert
        | Prim::AssertClose
        | Prim::Params
        | Prim::ModelSum => {
            whole(cx, args, true);
            e.ty = e.ty.replicated();
            return;
        }
        // The state keeps its declared layouts; the pieces are cut at run time.
        Prim::ShardState => return,
        // A copy is cut from each rank's block (`@copies`), so every dim keeps its split; the
        // copies are joined back in the first one's layout.
        Prim::CopySplit => {
            e.ty = with_layout(&e.ty, layout(&args[0].ty));
            return;
        }
        Prim::CopyJoin => {
            let l0 = layout(&args[0].ty);
            for a in args.iter_mut().skip(1) {
                convert_to(cx, a, l0.clone(), false);
            }
            e.ty = with_layout(&e.ty, l0);
            return;
        }
        Prim::Reshape => {
            let lx = layout(&args[0].ty);
            match reshaped(cx, &shape_items(&args[0].ty), &shape_items(&e.ty), &lx) {
                Some(out) => e.ty = with_layout(&e.ty, out),
                None => whole_result(cx, args, &mut e.ty),
            }
            return;
        }
        Prim::Slice => {
            // `x[i, a:b, :]`: dims taken whole (`:`) keep their splits; an indexed or ranged dim
            // is gathered first if it is split.
            let lx = layout(&args[0].ty);
            let mut want = lx.clone();
            let mut out = Vec::new();
            for (d, l) in lx.iter().enumerate() {
                match attrs.slice.get(d).copied().unwrap_or(SliceEntry::Full) {
                    SliceEntry::Index => want[d].clear(),
                    SliceEntry::Range => {
                        want[d].clear();
                        out.push(Vec::new());
                    }
                    SliceEntry::Full => out.push(l.clone()),
                }
            }
            convert_to(cx, &mut args[0], want, false);
            e.ty = with_layout(&e.ty, out);
            return;
        }
        Prim::Gather if args.len() == 2 && rank(&args[0].ty) > 0 => {
            // `gather(x, idx, axis: k)` (an embedding lookup): dim `k` of `x` is taken whole; the
            // result's dims are x's before `k`, idx's, then x's after `k`, with their splits.
            let k = attrs.axis.unwrap_or(0);
            let mut lx = layout(&args[0].ty);
            if k >= lx.len() {
                return whole_result(cx, args, &mut e.ty);
            }
            lx[k].clear();
            convert_to(cx, &mut args[0], lx.clone(), false);
            let li = layout(&args[1].ty);
            let mut out: L = lx[..k].to_vec();
            out.extend(li.iter().cloned());
            out.extend(lx[k + 1..].iter().cloned());
            if out.len() != rank(&e.ty) {
                return whole_result(cx, args, &mut e.ty);
            }
            let mut fixed = out.clone();
            unique(&mut fixed);
            if fixed != out {
                // An axis on both x and idx: idx is made whole.
                let x = std::mem::replace(&mut args[1], dummy());
                let t = x.ty.replicated();
                args[1] = cx.convert(x, &t, false);
                out = lx[..k].to_vec();
                out.extend(std::iter::repeat_n(Vec::new(), li.len()));
                out.extend(lx[k + 1..].iter().cloned());
            }
            e.ty = with_layout(&e.ty, out);
            return;
        }
        Prim::ScatterAdd if args.len() == 2 => {
            // `scatter_add(upd, idx, shape, axis: k)`, the adjoint of `gather`: upd's dims before
            // and after idx's keep their splits on the result; idx's dims split over axes leave
            // partial sums (an embedding gradient from `dp`-split ids), all-reduced.
            let k = attrs.axis.unwrap_or(0);
            let lu = layout(&args[0].ty);
            let ri = rank(&args[1].ty);
            let r = rank(&e.ty);
            if k + ri > lu.len() || lu.len() + 1 != r + ri {
                return whole_result(cx, args, &mut e.ty);
            }
            convert_to(cx, &mut args[1], lu[k..k + ri].to_vec(), false);
            let mut out: L = lu[..k].to_vec();
            out.push(Vec::new());
            out.extend(lu[k + ri..].iter().cloned());
            e.ty = with_layout(&e.ty, out);
            let axes: Vec<AxisId> = lu[k..k + ri].iter().flatten().copied().collect();
            partial = (!axes.is_empty()).then_some((Prim::AllReduceSum, axes));
        }
        // Whole operands, whole result.
        Prim::Concat
        | Prim::Stack
        | Prim::Squeeze
        | Prim::Gather
        | Prim::ScatterAdd
        | Prim::TakeAlong
        | Prim::ScatterAddAlong
        | Prim::Update
        | Prim::Attention
        | Prim::AttentionWeights
        | Prim::Quantize
        | Prim::Prune
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
        | Prim::Clock
        | Prim::TapeNew
        | Prim::Conv2d
        | Prim::Conv2dInputGrad
        | Prim::Conv2dWeightGrad
        | Prim::MaxPool2d
        | Prim::MaxPool2dGrad
        | Prim::AvgPool2d
        | Prim::AvgPool2dGrad => {
            return whole_result(cx, args, &mut e.ty);
        }
    }
    if let Some((coll, axes)) = partial {
        let mut inner = std::mem::replace(e, dummy());
        // A bf16/f16 partial sum or mean stays in f32 until it is combined across ranks, then rounds once,
        // as the one-process reduction does (rounding each rank's part first would not).
        let half = half_elem(&inner.ty).filter(|_| matches!(coll, Prim::AllReduceSum | Prim::AllReduceMean));
        if half.is_some() {
            inner.ty = with_elem(&inner.ty, ElemTy::F32);
        }
        *e = cx.collective(coll, inner, None, axes, true);
        if let Some(h) = half {
            let (ty, span) = (with_elem(&e.ty, h), e.span);
            let attrs = crate::ir::Attrs { dtype: Some(h), ..Default::default() };
            let sum = std::mem::replace(e, dummy());
            *e = Expr::new(ExprKind::Prim { prim: Prim::Cast, args: vec![sum], attrs: Box::new(attrs) }, ty, span);
        }
    }
}

/// The storage-only element type of a tensor type, if it has one.
fn half_elem(t: &Type) -> Option<ElemTy> {
    match t {
        Type::Tensor(TensorTy { elem: Elem::T(h @ (ElemTy::Bf16 | ElemTy::F16)), .. }) => Some(*h),
        _ => None,
    }
}

/// `t` with element type `to` (shape and layout kept).
fn with_elem(t: &Type, to: ElemTy) -> Type {
    match t {
        Type::Tensor(tt) => Type::Tensor(TensorTy { elem: Elem::T(to), ..tt.clone() }),
        other => other.clone(),
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

/// The layout of `reshape` from dims `ins` (layout `lx`) to `outs`, when every split dim is the
/// outermost of its group: a dim split into several (`[B, D @mp] → [B, H @mp, D / H]`) gives
/// its split to the first of them, a run of dims merged into one (`[B, H @mp, K] → [B, H * K]`)
/// gives the first one's split to the merged dim; each rank reshapes its block. `None` when a
/// split dim is not outermost (its blocks would not be contiguous), or a static size does not
/// divide: the operand is then gathered.
fn reshaped(cx: &Fcx, ins: &[ShapeItem], outs: &[ShapeItem], lx: &L) -> Option<L> {
    let dims = |s: &[ShapeItem]| -> Option<Vec<crate::types::Dim>> {
        s.iter()
            .map(|i| match i {
                ShapeItem::Dim(d) => Some(d.clone()),
                _ => None,
            })
            .collect()
    };
    let (ins, outs) = (dims(ins)?, dims(outs)?);
    let prod = |ds: &[crate::types::Dim]| ds.iter().fold(crate::types::Dim::constant(1), |a, d| a.mul(d));
    let mut out: L = vec![Vec::new(); outs.len()];
    for d in 0..ins.len() {
        let Some(axes) = lx.get(d).filter(|a| !a.is_empty()) else { continue };
        let pre = prod(&ins[..d]);
        // The group of `ins[d]`: the dims before it and the dims after its group have equal
        // products on both sides.
        let group = (0..outs.len()).rev().filter(|&k| prod(&outs[..k]) == pre).find_map(|k| {
            (d + 1..=ins.len())
                .find_map(|e| (k + 1..=outs.len()).find(|&j| prod(&ins[e..]) == prod(&outs[j..])).map(|j| (k, e, j)))
        });
        let (k, e, j) = group?;
        let splits = e == d + 1 && j > k + 1;
        let merges = j == k + 1 && lx[d + 1..e].iter().all(Vec::is_empty);
        if !(e == d + 1 && j == k + 1 || splits || merges) {
            return None;
        }
        let parts = cx.mesh.parts(axes);
        if outs[k].as_const().is_some_and(|n| n % parts != 0) {
            return None;
        }
        out[k].clone_from(axes);
    }
    Some(out)
}

/// `einsum(spec, …)`: each letter takes the first split an operand gives it (an axis at most
/// once over all letters); operands are redistributed to their letters' splits; the result's
/// letters keep theirs, and a contracted letter that is split leaves partial sums over its axes
/// (`bhqd,bhkd->bhqk` over heads split on `mp` needs nothing; `nd,dk->nk` over a split `d` is
/// all-reduced). `None` for specs the rule does not read (it then takes whole operands).
fn einsum(cx: &mut Fcx, args: &mut [Expr], spec: Option<&str>, out_ty: &Type) -> Option<(L, Vec<AxisId>)> {
    let (ins, out) = spec?.split_once("->")?;
    let ins: Vec<&str> = ins.split(',').collect();
    let letters_ok = |s: &str| s.chars().all(|c| c.is_ascii_alphabetic());
    if ins.len() != args.len() || !ins.iter().all(|s| letters_ok(s)) || !letters_ok(out) || out.len() != rank(out_ty) {
        return None;
    }
    let mut split: HashMap<char, Vec<AxisId>> = HashMap::new();
    let mut used: Vec<AxisId> = Vec::new();
    for (s, a) in ins.iter().zip(args.iter()) {
        let la = layout(&a.ty);
        if la.len() != s.len() {
            return None;
        }
        for (c, l) in s.chars().zip(la) {
            if !split.contains_key(&c) && !l.is_empty() && !l.iter().any(|x| used.contains(x)) {
                used.extend(l.iter().copied());
                split.insert(c, l);
            }
        }
    }
    let of = |c: char| split.get(&c).cloned().unwrap_or_default();
    for (s, a) in ins.iter().zip(args.iter_mut()) {
        convert_to(cx, a, s.chars().map(of).collect(), false);
    }
    let contracted: Vec<AxisId> = ins
        .iter()
        .flat_map(|s| s.chars())
        .filter(|c| !out.contains(*c))
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .flat_map(of)
        .collect();
    Some((out.chars().map(of).collect(), contracted))
}

fn convert_to(cx: &mut Fcx, a: &mut Expr, want: L, requested: bool) {
    let x = std::mem::replace(a, dummy());
    let t = with_layout(&x.ty, want);
    *a = cx.convert(x, &t, requested);
}

/// [`convert_to`] for primitive `p`, which works along dim `axis` (every dim: `None`) and so
/// needs it whole: `W0510` says so instead of blaming the operands' layouts.
fn convert_along(cx: &mut Fcx, a: &mut Expr, want: L, p: Prim, axis: Option<usize>) {
    cx.why = Some(match axis {
        Some(k) => format!("`{}` works along dim {k}, so that dim is gathered whole", p.name()),
        None => format!("`{}` works along every dim, so they are gathered whole", p.name()),
    });
    convert_to(cx, a, want, false);
    cx.why = None;
}

/// The rule of primitives without one: whole operands, whole result.
fn whole_result(cx: &mut Fcx, args: &mut [Expr], ty: &mut Type) {
    whole(cx, args, false);
    *ty = ty.replicated();
}

/// Every tensor operand whole (and model operands gathered field by field).
fn whole(cx: &mut Fcx, args: &mut [Expr], requested: bool) {
    for a in args.iter_mut() {
        if requested || matches!(a.ty, Type::Model(..)) {
            cx.make_whole(a);
        } else {
            let x = std::mem::replace(a, dummy());
            let t = x.ty.replicated();
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
        if rank(&a.ty) == 0 {
            continue;
        }
        let want = operand_layout(&a.ty, &target);
        convert_to(cx, a, want, false);
    }
    target
}

/// The layout an operand of an elementwise result laid out as `target` takes: its dims aligned
/// with the result's from the right, a size-1 (broadcast) dim whole. The sharding pass converts
/// operands to it, and the layout verifier checks it (`shard::verify`).
pub(super) fn operand_layout(t: &Type, target: &[Vec<AxisId>]) -> L {
    let items = shape_items(t);
    let shift = target.len().saturating_sub(items.len());
    (0..items.len())
        .map(|i| if is_one(items.get(i)) { Vec::new() } else { target.get(i + shift).cloned().unwrap_or_default() })
        .collect()
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

/// `a @ b`: the result's layout and the axes of the contracted dim (a partial sum over them).
/// A vector operand is a matrix of one row (`a`) or one column (`b`), as NumPy's `matmul`
/// treats it, so `x[N @dp, D] @ v[D]` keeps its rows split. `None` sends it to the
/// whole-operand rule.
fn matmul(cx: &mut Fcx, args: &mut [Expr], out_ty: &Type) -> Option<(L, Vec<AxisId>)> {
    let (mut la, mut lb) = (layout(&args.first()?.ty), layout(&args.get(1)?.ty));
    let (va, vb) = (la.len() == 1, lb.len() == 1);
    if va {
        la.insert(0, Vec::new());
    }
    if vb {
        lb.push(Vec::new());
    }
    let (ra, rb) = (la.len(), lb.len());
    if ra < 2 || rb < 2 || rank(out_ty) + usize::from(va) + usize::from(vb) != ra.max(rb) {
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
    if va {
        want_a.remove(want_a.len() - 2);
    }
    if vb {
        want_b.pop();
    }
    convert_to(cx, &mut args[0], want_a, false);
    convert_to(cx, &mut args[1], want_b, false);
    let mut out = batch;
    if !va {
        out.push(m);
    }
    if !vb {
        out.push(n);
    }
    Some((out, k))
}

/// The all-reduce that combines the ranks' partial results of reduction `p` over a split dim;
/// `None` for a reduction whose dims must be whole (and for anything else).
fn combined_by(p: Prim) -> Option<Prim> {
    match p {
        Prim::Sum => Some(Prim::AllReduceSum),
        Prim::Mean => Some(Prim::AllReduceMean),
        Prim::Max => Some(Prim::AllReduceMax),
        Prim::Min => Some(Prim::AllReduceMin),
        Prim::Argmax | Prim::Argmin | Prim::Logsumexp | crate::not_reduce_prims!() => None,
    }
}
