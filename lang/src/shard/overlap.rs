//! Ordering a sharded function body so that its collectives overlap computation (the
//! interpreter starts a top-level `let c = collective(…)` without waiting and waits where `c`
//! is first read, `interp::overlap`). Two steps over every function body:
//!
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
use crate::types::FuncId;
use std::collections::{BTreeSet, HashMap, HashSet};

/// Reorders every function of `prog` (after `shard::run`).
pub fn run(prog: &mut Program) {
    let name = prog.names.intern("comm");
    for i in 0..prog.funcs.len() {
        let f = &mut prog.funcs[FuncId(i as u32).0 as usize];
        if !has_collective(&f.body) {
            continue;
        }
        merge_sums(f);
        hoist(f, name);
        schedule(f);
    }
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
        ExprKind::Prim { prim, .. } => {
            ok &= !prim.has_effect()
                && !matches!(
                    prim,
                    crate::ir::Prim::Normal
                        | crate::ir::Prim::Uniform
                        | crate::ir::Prim::HeNormal
                        | crate::ir::Prim::GlorotUniform
                        | crate::ir::Prim::TapeNew
                        | crate::ir::Prim::TapePush
                )
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
/// parallelism). Partial sums over the same axes add up to a partial sum.
fn merge_sums(f: &mut Func) {
    while merge_once(f) {}
}

/// One pass of [`merge_sums`]; whether it merged anything.
fn merge_once(f: &mut Func) -> bool {
    let ExprKind::Block { stmts, .. } = &f.body.kind else { return false };
    let mut reads: HashMap<crate::ir::Local, usize> = HashMap::new();
    walk(&f.body, &mut |x| match &x.kind {
        ExprKind::Local(l) => *reads.entry(*l).or_insert(0) += 1,
        ExprKind::Closure { captures, .. } => {
            for l in captures {
                *reads.entry(*l).or_insert(2) += 2;
            }
        }
        _ => {}
    });
    let reduced = |s: &Stmt| match s {
        Stmt::Let { pat: Pat::Local(l), value } => match &value.kind {
            ExprKind::Prim { prim: crate::ir::Prim::AllReduceSum, args, attrs } if args.len() == 1 => {
                Some((*l, attrs.mesh_axes.clone()))
            }
            _ => None,
        },
        _ => None,
    };
    let mut at: HashMap<crate::ir::Local, (usize, Vec<crate::types::AxisId>)> = HashMap::new();
    let mut merges = Vec::new();
    for (i, s) in stmts.iter().enumerate() {
        if let Some((l, axes)) = reduced(s) {
            at.insert(l, (i, axes));
        }
        let Stmt::Let { pat: Pat::Local(_), value } = s else { continue };
        let ExprKind::Prim { prim: crate::ir::Prim::Add, args, .. } = &value.kind else { continue };
        let [x, y] = args.as_slice() else { continue };
        let (ExprKind::Local(a), ExprKind::Local(b)) = (&x.kind, &y.kind) else { continue };
        let (Some((ia, axa)), Some((ib, axb))) = (at.get(a), at.get(b)) else { continue };
        let same = a != b && axa == axb && x.ty == y.ty && x.ty == value.ty;
        // The partial sums move to `g`: nothing between may assign what they read.
        let plain = stmts[(*ia).min(*ib)..i].iter().all(|s| matches!(s, Stmt::Let { .. }));
        if same && plain && reads.get(a) == Some(&1) && reads.get(b) == Some(&1) {
            merges.push((*ia, *ib, i));
        }
    }
    if merges.is_empty() {
        return false;
    }
    let ExprKind::Block { stmts, .. } = &mut f.body.kind else { return false };
    let mut slots: Vec<Option<Stmt>> = std::mem::take(stmts).into_iter().map(Some).collect();
    for (ia, ib, i) in merges {
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
        let sum = Expr::new(
            ExprKind::Prim { prim: crate::ir::Prim::Add, args: vec![px, py], attrs: Box::default() },
            value.ty.clone(),
            value.span,
        );
        let ty = value.ty.clone();
        *value =
            Expr::new(ExprKind::Prim { prim: crate::ir::Prim::AllReduceSum, args: vec![sum], attrs }, ty, value.span);
    }
    *stmts = slots.into_iter().flatten().collect();
    true
}

/// Binds each collective nested in a movable `let`'s value by a `let` of its own, placed just
/// before (innermost first).
fn hoist(f: &mut Func, name: crate::ir::Name) {
    let ExprKind::Block { stmts, .. } = &mut f.body.kind else { return };
    let old = std::mem::take(stmts);
    let mut out = Vec::with_capacity(old.len());
    for mut s in old {
        if let Stmt::Let { value, .. } = &mut s {
            if movable(value) && !is_collective(value) {
                lift(value, &mut f.locals, name, &mut out);
            } else if let ExprKind::Prim { args, .. } = &mut value.kind {
                // A collective bound directly: collectives in its operand still move out.
                for a in args.iter_mut() {
                    lift(a, &mut f.locals, name, &mut out);
                }
            }
        }
        out.push(s);
    }
    let ExprKind::Block { stmts, .. } = &mut f.body.kind else { return };
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

/// List-schedules each run of movable `let`s of `f`'s body.
fn schedule(f: &mut Func) {
    let ExprKind::Block { stmts, .. } = &mut f.body.kind else { return };
    // Locals bound more than once or assigned anywhere pin the statements that touch them.
    let mut bound: HashMap<crate::ir::Local, usize> = HashMap::new();
    let mut pinned: HashSet<crate::ir::Local> = HashSet::new();
    for s in stmts.iter() {
        match s {
            Stmt::Let { pat, .. } => pat.each_local(&mut |l| *bound.entry(l).or_insert(0) += 1),
            Stmt::Assign { pat, .. } => pat.each_local(&mut |l| {
                pinned.insert(l);
            }),
            _ => {}
        }
    }
    walk(&f.body, &mut |x| {
        if let ExprKind::Block { stmts, .. } = &x.kind {
            for s in stmts {
                if let Stmt::Assign { pat, .. } = s {
                    pat.each_local(&mut |l| {
                        pinned.insert(l);
                    });
                }
            }
        }
    });
    pinned.extend(bound.iter().filter(|(_, n)| **n > 1).map(|(l, _)| *l));
    let ExprKind::Block { stmts, .. } = &mut f.body.kind else { return };
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
