//! The layout verifier: after the sharding pass, every rank must hold the blocks its values'
//! types say. Checked per node where the layout rule is local: a local holds the layout it is
//! declared with; elementwise operands are split as their result (a broadcast dim whole); a
//! product's contracted dim is split alike on both sides, and a split one is a partial sum that
//! an all-reduce or reduce-scatter over its axes combines at once; so is a reduction over a
//! split dim; each collective changes exactly the layout it says; a tape gives back the
//! layouts pushed onto it. A violation means a rank
//! would combine its block with another rank's (a wrong number, not an error), so it is reported
//! as a compiler bug by `passes::shard` in debug builds and with `MSL_VERIFY=1`.

use super::{has_rest, layout, rules::operand_layout};
use crate::ir::{walk::walk, Expr, ExprId, ExprKind, Func, Pat, Prim, Program, Stmt};
use crate::types::{AxisId, Type};
use std::collections::HashMap;

type L = Vec<Vec<AxisId>>;

/// The layout violations of every function of `p` but those the pass left whole (`skip`).
pub fn check(p: &Program, skip: &[crate::types::FuncId]) -> Vec<String> {
    let mut errs = Vec::new();
    for (i, f) in p.funcs.iter().enumerate() {
        if skip.iter().any(|s| s.0 as usize == i) {
            continue;
        }
        let name = p.names.get(f.name);
        let mut combined: HashMap<ExprId, (Prim, Vec<AxisId>)> = HashMap::new();
        walk(&f.body, &mut |e: &Expr| {
            if let ExprKind::Prim { prim, args, attrs } = &e.kind {
                if matches!(
                    prim,
                    Prim::AllReduceSum
                        | Prim::AllReduceMean
                        | Prim::AllReduceMax
                        | Prim::AllReduceMin
                        | Prim::ReduceScatter
                ) {
                    if let Some(a) = args.first() {
                        mark_combined(a, *prim, &attrs.mesh_axes, &mut combined);
                    }
                }
            }
        });
        let mut found = Vec::new();
        walk(&f.body, &mut |e: &Expr| node(p, f, e, &combined, &mut found));
        errs.extend(found.into_iter().map(|m| format!("fn#{i} {name}: {m}")));
    }
    errs
}

/// Marks `a` as combined by collective `prim` over `axes`, and so the operands of a sum of
/// partial sums under it (`all_reduce_sum(p1 + p2)`, `shard::overlap::merge_sums`).
fn mark_combined(a: &Expr, prim: Prim, axes: &[AxisId], combined: &mut HashMap<ExprId, (Prim, Vec<AxisId>)>) {
    combined.insert(a.id, (prim, axes.to_vec()));
    if let ExprKind::Prim { prim: Prim::Add, args, .. } = &a.kind {
        for x in args {
            mark_combined(x, prim, axes, combined);
        }
    }
}

/// The layout of a tensor type of fixed rank; `None` otherwise.
fn fixed(t: &Type) -> Option<L> {
    (matches!(t, Type::Tensor(_)) && !has_rest(t)).then(|| layout(t))
}

/// What a tape of type `t` holds per entry.
fn tape_item(t: &Type) -> Option<&Type> {
    match t {
        Type::List(items) if items.len() == 1 => items.first(),
        _ => None,
    }
}

/// The layout of every tensor in a value of type `t` (tuples flattened), in order.
fn leaf_layouts(t: &Type) -> Vec<L> {
    match t {
        Type::Tensor(_) => vec![layout(t)],
        Type::Tuple(ts) => ts.iter().flat_map(leaf_layouts).collect(),
        _ => vec![],
    }
}

fn node(p: &Program, f: &Func, e: &Expr, combined: &HashMap<ExprId, (Prim, Vec<AxisId>)>, out: &mut Vec<String>) {
    let name = |e: &Expr| match &e.kind {
        ExprKind::Prim { prim, .. } => format!("`{}`", prim.name()),
        _ => "a value".to_string(),
    };
    match &e.kind {
        ExprKind::Local(l) => {
            if let (Some(have), Some(info)) = (fixed(&e.ty), f.locals.get(l.0 as usize)) {
                if let Some(want) = fixed(&info.ty) {
                    if have != want {
                        out.push(format!(
                            "a read of `{}` has layout {have:?}, the local {want:?}",
                            p.names.get(info.name)
                        ));
                    }
                }
            }
        }
        ExprKind::Block { stmts, .. } => {
            for s in stmts {
                if let Stmt::Let { pat: Pat::Local(l), value } | Stmt::Assign { pat: Pat::Local(l), value } = s {
                    let (Some(have), Some(info)) = (fixed(&value.ty), f.locals.get(l.0 as usize)) else {
                        continue;
                    };
                    if let Some(want) = fixed(&info.ty) {
                        if have != want {
                            let local = p.names.get(info.name);
                            out.push(format!(
                                "`{local}` of layout {want:?} is bound to {} of layout {have:?}",
                                name(value)
                            ));
                        }
                    }
                }
            }
        }
        // A tape holds what is pushed onto it as it is, and gives it back so.
        ExprKind::Prim { prim: Prim::TapePush, args, .. } => {
            if let ([_, item], Some(held)) = (&args[..], tape_item(&e.ty)) {
                let (have, want) = (leaf_layouts(&item.ty), leaf_layouts(held));
                if have != want {
                    out.push(format!("`tape_push` of layouts {have:?} onto a tape of {want:?}"));
                }
            }
        }
        ExprKind::Prim { prim: Prim::TapeGet, args, .. } => {
            if let Some(held) = args.first().and_then(|a| tape_item(&a.ty)) {
                let (have, want) = (leaf_layouts(&e.ty), leaf_layouts(held));
                if have != want {
                    out.push(format!("`tape_get` gives layouts {have:?} from a tape of {want:?}"));
                }
            }
        }
        ExprKind::Prim { prim, args, attrs } => {
            let Some(rl) = fixed(&e.ty) else { return };
            let must_combine = |axes: &[AxisId], out: &mut Vec<String>| {
                if !axes.is_empty() && combined.get(&e.id).is_none_or(|(_, a)| a.as_slice() != axes) {
                    out.push(format!("{} sums over dims split over {axes:?}, but no collective combines it", name(e)));
                }
            };
            match prim {
                p if p.is_elementwise() => {
                    for a in args.iter().filter(|a| fixed(&a.ty).is_some_and(|al| al.len() <= rl.len())) {
                        let al = layout(&a.ty);
                        if al != operand_layout(&a.ty, &rl) {
                            out.push(format!("{} of layout {rl:?} has an operand of layout {al:?}", name(e)));
                            break;
                        }
                    }
                }
                Prim::MatMul => {
                    let (Some(mut la), Some(mut lb)) =
                        (args.first().and_then(|a| fixed(&a.ty)), args.get(1).and_then(|b| fixed(&b.ty)))
                    else {
                        return;
                    };
                    if la.len() == 1 {
                        la.insert(0, Vec::new());
                    }
                    if lb.len() == 1 {
                        lb.push(Vec::new());
                    }
                    if la.len() < 2 || lb.len() < 2 {
                        return;
                    }
                    let (ka, kb) = (&la[la.len() - 1], &lb[lb.len() - 2]);
                    if ka != kb {
                        out.push(format!("`matmul` contracts a dim split as {ka:?} with one split as {kb:?}"));
                        return;
                    }
                    must_combine(ka, out);
                }
                Prim::Sum | Prim::Mean | Prim::Max | Prim::Min => {
                    let Some(xl) = args.first().and_then(|a| fixed(&a.ty)) else { return };
                    let reduced: Vec<AxisId> = match attrs.axis {
                        Some(k) if !attrs.from_end => xl.get(k).cloned().unwrap_or_default(),
                        Some(_) => return,
                        None => xl.iter().flatten().copied().collect(),
                    };
                    must_combine(&reduced, out);
                }
                Prim::AllGather | Prim::LocalSlice | Prim::ReduceScatter | Prim::AllToAll => {
                    let Some(xl) = args.first().and_then(|a| fixed(&a.ty)) else { return };
                    let d = attrs.axis.unwrap_or(0);
                    let mut want = xl.clone();
                    match prim {
                        Prim::AllGather if want.get(d) == Some(&attrs.mesh_axes) => want[d].clear(),
                        Prim::LocalSlice | Prim::ReduceScatter if want.get(d).is_some_and(Vec::is_empty) => {
                            want[d].clone_from(&attrs.mesh_axes)
                        }
                        Prim::AllToAll => {
                            let t = attrs.perm.first().copied().unwrap_or(0);
                            if want.get(d) != Some(&attrs.mesh_axes) || !want.get(t).is_some_and(Vec::is_empty) {
                                out.push(format!("`all_to_all` from layout {xl:?} over {:?}", attrs.mesh_axes));
                                return;
                            }
                            want[t] = std::mem::take(&mut want[d]);
                        }
                        // A guard above failed, so the operand's layout does not fit the collective.
                        Prim::AllGather
                        | Prim::LocalSlice
                        | Prim::ReduceScatter
                        | Prim::AllReduceSum
                        | Prim::AllReduceMean
                        | Prim::AllReduceMax
                        | Prim::AllReduceMin
                        | crate::not_collective_prims!() => {
                            out.push(format!(
                                "{} over {:?} at dim {d} of an operand of layout {xl:?}",
                                name(e),
                                attrs.mesh_axes
                            ));
                            return;
                        }
                    }
                    if want != rl {
                        out.push(format!("{} of an operand of layout {xl:?} gives {rl:?}, not {want:?}", name(e)));
                    }
                }
                Prim::AllReduceSum | Prim::AllReduceMean | Prim::AllReduceMax | Prim::AllReduceMin => {
                    if let Some(xl) = args.first().and_then(|a| fixed(&a.ty)) {
                        if xl != rl {
                            out.push(format!("{} changes the layout {xl:?} to {rl:?}", name(e)));
                        }
                    }
                }
                _ => {} // any other primitive: no layout invariant beyond its rule in `shard::rules`
            }
        }
        _ => {}
    }
}
