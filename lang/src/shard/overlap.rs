//! Ordering the blocks of a sharded function so that its collectives overlap computation (the
//! interpreter starts a block's `let c = collective(…)` without waiting and waits where `c` is
//! first read, `interp::overlap`). Three steps over every block that binds a collective
//! (function bodies, loop bodies), innermost first:
//!
//! 0. Partial sums added after their all-reduces are added before one (`merge_sums`).
//! 1. A collective nested in a statement's value (`let h = relu(all_reduce(a @ w) + b)`) is
//!    bound by a statement of its own just before (`let c = all_reduce(a @ w); let h = relu(c + b)`).
//! 2. Runs of pure `let`s are list-scheduled: a collective is started as soon as its operand
//!    is computed, statements that need no collective in flight come next, and a statement that
//!    reads one in flight comes only when nothing else can run. With `@copies`, one copy's
//!    computation thus fills the time of another copy's collectives; in data parallelism the
//!    gradients' all-reduces run during the rest of the backward pass.
//!
//! Values are unchanged (statements are pure and read only what their dependences computed);
//! every rank runs the same program, so every rank starts the collectives in the same order.

use crate::ir::walk::walk;
use crate::ir::{Expr, ExprKind, Func, LocalInfo, Pat, Program, Stmt};
use std::collections::{BTreeSet, HashMap, HashSet};

/// Reorders every block of every function of `prog` (after `shard::run`): function bodies and
/// the bodies of loops and branches alike.
pub fn run(prog: &mut Program) {
    let name = prog.names.intern("comm");
    for f in prog.funcs.iter_mut() {
        if !has_collective(&f.body) {
            continue;
        }
        let Func { body, locals, .. } = f;
        let pinned = pinned(body);
        order_blocks(body, locals, name, &pinned);
    }
}

/// Merges, hoists and schedules the statements of every block in `e` that binds a collective,
/// innermost first (a loop's body before the block holding the loop).
fn order_blocks(e: &mut Expr, locals: &mut Vec<LocalInfo>, name: crate::ir::Name, pinned: &HashSet<crate::ir::Local>) {
    crate::ir::walk::children_mut(e, &mut |c| order_blocks(c, locals, name, pinned));
    let ExprKind::Block { stmts, .. } = &e.kind else { return };
    if !stmts.iter().any(|s| matches!(s, Stmt::Let { value, .. } if has_collective(value))) {
        return;
    }
    let (reads, _) = crate::ir::simplify::reads_and_assigned(e);
    let ExprKind::Block { stmts, .. } = &mut e.kind else { return };
    while merge_once(stmts, &reads) {}
    hoist(stmts, locals, name);
    schedule(stmts, pinned);
}

/// Locals bound more than once or assigned anywhere in `body`: the statements that touch them
/// keep their places.
fn pinned(body: &Expr) -> HashSet<crate::ir::Local> {
    let (_, mut pinned) = crate::ir::simplify::reads_and_assigned(body);
    let mut bound: HashMap<crate::ir::Local, usize> = HashMap::new();
    walk(body, &mut |x| {
        if let ExprKind::Block { stmts, .. } = &x.kind {
            for s in stmts {
                if let Stmt::Let { pat, .. } = s {
                    pat.each_local(&mut |l| *bound.entry(l).or_insert(0) += 1);
                }
            }
        }
    });
    pinned.extend(bound.iter().filter(|(_, n)| **n > 1).map(|(l, _)| *l));
    pinned
}

fn is_collective(e: &Expr) -> bool {
    matches!(&e.kind, ExprKind::Prim { prim, args, .. }
        if args.len() == 1 && matches!(prim, crate::collective_prims!()) && *prim != crate::ir::Prim::LocalSlice)
}

fn has_collective(e: &Expr) -> bool {
    let mut found = false;
    walk(e, &mut |x| found |= is_collective(x));
    found
}

/// Whether `e` can move among other pure statements: primitives without effects or random
/// draws over locals, constants and tuples; anything that calls, branches, loops or binds is
/// left where it is.
fn movable(e: &Expr) -> bool {
    let mut ok = true;
    walk(e, &mut |x| match &x.kind {
        // A tape is appended to in place: its primitives keep their order.
        ExprKind::Prim { prim, .. } => {
            ok &= prim.is_pure() && !matches!(prim, crate::ir::Prim::TapeNew | crate::ir::Prim::TapePush)
        }
        ExprKind::Lit(_)
        | ExprKind::Local(_)
        | ExprKind::Const(_)
        | ExprKind::DimValue(_)
        | ExprKind::Tuple(_)
        | ExprKind::TupleGet(..)
        | ExprKind::Field(..)
        | ExprKind::ModelBuild { .. }
        | ExprKind::FuncRef(_) => {}
        _ => ok = false,
    });
    ok
}

/// `let a = all_reduce_sum(x); let b = all_reduce_sum(y); let g = a + b`, with `a` and `b`
/// read only there, becomes `let g = all_reduce_sum(x + y)`: one collective instead of two
/// (the gradient of a weight used twice, or by each copy of `@copies`, under data
/// parallelism). Partial sums over the same axes add up to a partial sum. Whether it merged.
fn merge_once(stmts: &mut Vec<Stmt>, reads: &HashMap<crate::ir::Local, usize>) -> bool {
    let mut merged = false;
    // Within one value: `all_reduce_sum(x) + all_reduce_sum(y)`.
    for s in stmts.iter_mut() {
        if let Stmt::Let { value, .. } = s {
            merged |= merge_nested(value);
        }
    }
    let reduced = |s: &Stmt| match s {
        Stmt::Let { pat: Pat::Local(l), value } => match &value.kind {
            ExprKind::Prim { prim: crate::ir::Prim::AllReduceSum, args, attrs } if args.len() == 1 => {
                Some((*l, attrs.mesh_axes.clone(), value.ty.clone()))
            }
            _ => None,
        },
        _ => None,
    };
    // Across statements: `let a = all_reduce_sum(x); let b = …; … a + b …`.
    let mut at: HashMap<crate::ir::Local, (usize, Vec<crate::types::AxisId>, crate::types::Type)> = HashMap::new();
    let mut merges: Vec<(usize, usize, usize, crate::ir::ExprId)> = Vec::new();
    let mut used = HashSet::new();
    for (i, s) in stmts.iter().enumerate() {
        if let Stmt::Let { value, .. } = s {
            if movable(value) {
                walk_movable(value, &mut |e| {
                    let ExprKind::Prim { prim: crate::ir::Prim::Add, args, .. } = &e.kind else { return };
                    let [x, y] = args.as_slice() else { return };
                    let (ExprKind::Local(a), ExprKind::Local(b)) = (&x.kind, &y.kind) else { return };
                    let (Some((ia, axa, ta)), Some((ib, axb, tb))) = (at.get(a), at.get(b)) else { return };
                    let same = a != b && axa == axb && *ta == e.ty && *tb == e.ty;
                    // The partial sums move here: nothing between may assign what they read.
                    let plain = stmts[(*ia).min(*ib)..i].iter().all(|s| matches!(s, Stmt::Let { .. }));
                    let once = reads.get(a) == Some(&1) && reads.get(b) == Some(&1);
                    if same && plain && once && !used.contains(ia) && !used.contains(ib) {
                        used.insert(*ia);
                        used.insert(*ib);
                        merges.push((*ia, *ib, i, e.id));
                    }
                });
            }
        }
        if let Some((l, axes, ty)) = reduced(s) {
            at.insert(l, (i, axes, ty));
        }
    }
    if merges.is_empty() {
        return merged;
    }
    let mut slots: Vec<Option<Stmt>> = std::mem::take(stmts).into_iter().map(Some).collect();
    for (ia, ib, i, id) in merges {
        let (Some(Stmt::Let { value: va, .. }), Some(Stmt::Let { value: vb, .. })) =
            (slots[ia].take(), slots[ib].take())
        else {
            continue;
        };
        let (ExprKind::Prim { args: xa, attrs, .. }, ExprKind::Prim { args: xb, .. }) = (va.kind, vb.kind) else {
            continue;
        };
        let Some(Stmt::Let { value, .. }) = &mut slots[i] else { continue };
        let (Some(px), Some(py)) = (xa.into_iter().next(), xb.into_iter().next()) else { continue };
        let mut parts = Some((px, py, attrs));
        crate::ir::walk::walk_mut(value, &mut |e| {
            if e.id == id {
                if let Some((px, py, attrs)) = parts.take() {
                    *e = summed(px, py, attrs, e.ty.clone(), e.span);
                }
            }
        });
    }
    *stmts = slots.into_iter().flatten().collect();
    true
}

/// `all_reduce_sum(x + y)` typed `ty`, with the collective's attributes `attrs`.
fn summed(x: Expr, y: Expr, attrs: Box<crate::ir::Attrs>, ty: crate::types::Type, span: crate::ir::SpanId) -> Expr {
    let sum = Expr::new(
        ExprKind::Prim { prim: crate::ir::Prim::Add, args: vec![x, y], attrs: Box::default() },
        ty.clone(),
        span,
    );
    Expr::new(ExprKind::Prim { prim: crate::ir::Prim::AllReduceSum, args: vec![sum], attrs }, ty, span)
}

/// Rewrites `all_reduce_sum(x) + all_reduce_sum(y)` (same axes and type) in `e`'s movable
/// positions into `all_reduce_sum(x + y)`; whether it did.
fn merge_nested(e: &mut Expr) -> bool {
    let mut merged = false;
    if let ExprKind::Prim { args, .. } | ExprKind::Tuple(args) = &mut e.kind {
        for a in args.iter_mut() {
            merged |= merge_nested(a);
        }
    }
    if let ExprKind::ModelBuild { fields } = &mut e.kind {
        for a in fields.iter_mut() {
            merged |= merge_nested(a);
        }
    }
    let ExprKind::Prim { prim: crate::ir::Prim::Add, args, .. } = &e.kind else { return merged };
    let reduce = |x: &Expr| match &x.kind {
        ExprKind::Prim { prim: crate::ir::Prim::AllReduceSum, args, attrs } if args.len() == 1 && x.ty == e.ty => {
            Some(attrs.mesh_axes.clone())
        }
        _ => None,
    };
    let [x, y] = args.as_slice() else { return merged };
    if reduce(x).is_none() || reduce(x) != reduce(y) {
        return merged;
    }
    let ExprKind::Prim { args, .. } = std::mem::replace(&mut e.kind, ExprKind::Tuple(vec![])) else { return merged };
    let mut it = args.into_iter();
    let (Some(x), Some(y)) = (it.next(), it.next()) else { return merged };
    let (ExprKind::Prim { args: xa, attrs, .. }, ExprKind::Prim { args: ya, .. }) = (x.kind, y.kind) else {
        return merged;
    };
    let (Some(px), Some(py)) = (xa.into_iter().next(), ya.into_iter().next()) else { return merged };
    *e = summed(px, py, attrs, e.ty.clone(), e.span);
    true
}

/// Calls `f` on `e` and the expressions below it through primitives, tuples, tuple items,
/// fields and model builds (what a statement evaluates at once).
fn walk_movable(e: &Expr, f: &mut dyn FnMut(&Expr)) {
    f(e);
    match &e.kind {
        ExprKind::Prim { args, .. } | ExprKind::Tuple(args) => args.iter().for_each(|a| walk_movable(a, f)),
        ExprKind::ModelBuild { fields } => fields.iter().for_each(|a| walk_movable(a, f)),
        ExprKind::TupleGet(a, _) | ExprKind::Field(a, _) => walk_movable(a, f),
        _ => {}
    }
}

/// Binds each collective nested in a movable `let`'s value by a `let` of its own, placed just
/// before (innermost first).
fn hoist(stmts: &mut Vec<Stmt>, locals: &mut Vec<LocalInfo>, name: crate::ir::Name) {
    let old = std::mem::take(stmts);
    let mut out = Vec::with_capacity(old.len());
    for mut s in old {
        if let Stmt::Let { value, .. } = &mut s {
            if movable(value) && !is_collective(value) {
                lift(value, locals, name, &mut out);
            } else if let ExprKind::Prim { args, .. } = &mut value.kind {
                // A collective bound directly: collectives in its operand still move out.
                for a in args.iter_mut() {
                    lift(a, locals, name, &mut out);
                }
            }
        }
        out.push(s);
    }
    *stmts = out;
}

/// Replaces every collective in `e` (reached through primitives and tuples only) by a new
/// local bound in `out`.
fn lift(e: &mut Expr, locals: &mut Vec<LocalInfo>, name: crate::ir::Name, out: &mut Vec<Stmt>) {
    match &mut e.kind {
        ExprKind::Prim { args, .. } | ExprKind::Tuple(args) => {
            for a in args.iter_mut() {
                lift(a, locals, name, out);
            }
        }
        ExprKind::TupleGet(a, _) | ExprKind::Field(a, _) => lift(a, locals, name, out),
        ExprKind::ModelBuild { fields } => {
            for a in fields.iter_mut() {
                lift(a, locals, name, out);
            }
        }
        _ => return,
    }
    if is_collective(e) {
        let l = crate::ir::Local(locals.len() as u32);
        locals.push(LocalInfo { name, ty: e.ty.clone(), mutable: false });
        let local = Expr::new(ExprKind::Local(l), e.ty.clone(), e.span);
        let value = std::mem::replace(e, local);
        out.push(Stmt::Let { pat: Pat::Local(l), value });
    }
}

/// List-schedules each run of movable `let`s of a block.
fn schedule(stmts: &mut Vec<Stmt>, pinned: &HashSet<crate::ir::Local>) {
    let free = |s: &Stmt| match s {
        Stmt::Let { pat, value } => {
            let mut ok = movable(value);
            pat.each_local(&mut |l| ok &= !pinned.contains(&l));
            walk(value, &mut |x| {
                if let ExprKind::Local(l) = &x.kind {
                    ok &= !pinned.contains(l);
                }
            });
            ok
        }
        _ => false,
    };
    let old = std::mem::take(stmts);
    let mut out = Vec::with_capacity(old.len());
    let mut run: Vec<Stmt> = Vec::new();
    for s in old {
        if free(&s) {
            run.push(s);
        } else {
            out.extend(order(std::mem::take(&mut run)));
            out.push(s);
        }
    }
    out.extend(order(run));
    *stmts = out;
}

/// The statements of a run of movable `let`s in the order described in the module comment.
fn order(run: Vec<Stmt>) -> Vec<Stmt> {
    let n = run.len();
    if n < 3 || !run.iter().any(|s| matches!(s, Stmt::Let { value, .. } if is_collective(value))) {
        return run;
    }
    let mut def: HashMap<crate::ir::Local, usize> = HashMap::new();
    for (i, s) in run.iter().enumerate() {
        if let Stmt::Let { pat, .. } = s {
            pat.each_local(&mut |l| {
                def.insert(l, i);
            });
        }
    }
    let mut deps: Vec<Vec<usize>> = vec![Vec::new(); n];
    let mut succ: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (j, s) in run.iter().enumerate() {
        let Stmt::Let { value, .. } = s else { continue };
        walk(value, &mut |x| {
            if let ExprKind::Local(l) = &x.kind {
                if let Some(&i) = def.get(l) {
                    if i < j && !deps[j].contains(&i) {
                        deps[j].push(i);
                        succ[i].push(j);
                    }
                }
            }
        });
    }
    let coll: Vec<bool> = run.iter().map(|s| matches!(s, Stmt::Let { value, .. } if is_collective(value))).collect();
    let mut left: Vec<usize> = deps.iter().map(Vec::len).collect();
    // Collectives in flight, with the order they were started in.
    let mut pending: HashMap<usize, usize> = HashMap::new();
    let mut started = 0;
    // Ready statements: collectives that read nothing in flight, other statements that read
    // nothing in flight, and statements that would wait.
    let (mut starts, mut free, mut waits) = (BTreeSet::new(), BTreeSet::new(), BTreeSet::new());
    let place = |j: usize,
                 pending: &HashMap<usize, usize>,
                 s: &mut BTreeSet<usize>,
                 f: &mut BTreeSet<usize>,
                 w: &mut BTreeSet<usize>| {
        if deps[j].iter().any(|d| pending.contains_key(d)) {
            w.insert(j);
        } else if coll[j] {
            s.insert(j);
        } else {
            f.insert(j);
        }
    };
    for (j, _) in left.iter().enumerate().filter(|(_, k)| **k == 0) {
        place(j, &pending, &mut starts, &mut free, &mut waits);
    }
    let mut order = Vec::with_capacity(n);
    while order.len() < n {
        // Waiting, take the statement whose collectives were started longest ago (the most
        // likely to have completed).
        let next = starts.pop_first().or_else(|| free.pop_first()).or_else(|| {
            let k = waits
                .iter()
                .copied()
                .min_by_key(|&k| (deps[k].iter().filter_map(|d| pending.get(d)).max().copied().unwrap_or(0), k))?;
            waits.remove(&k);
            Some(k)
        });
        let Some(j) = next else { break };
        order.push(j);
        // What `j` read has landed: statements waiting only on it can run freely.
        let landed: Vec<usize> = deps[j].iter().copied().filter(|d| pending.remove(d).is_some()).collect();
        for d in landed {
            for &k in &succ[d] {
                if waits.contains(&k) && !deps[k].iter().any(|x| pending.contains_key(x)) {
                    waits.remove(&k);
                    if coll[k] {
                        starts.insert(k);
                    } else {
                        free.insert(k);
                    }
                }
            }
        }
        if coll[j] {
            pending.insert(j, started);
            started += 1;
        }
        for &k in &succ[j] {
            left[k] -= 1;
            if left[k] == 0 {
                place(k, &pending, &mut starts, &mut free, &mut waits);
            }
        }
    }
    if order.len() < n {
        return run;
    }
    let mut slots: Vec<Option<Stmt>> = run.into_iter().map(Some).collect();
    order.into_iter().filter_map(|i| slots[i].take()).collect()
}
