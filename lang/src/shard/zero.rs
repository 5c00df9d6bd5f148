//! Where a gradient reaches a sharded optimizer step straight from the function that computes
//! it, so that its data-parallel partial sums are reduce-scattered into the step's pieces
//! instead of all-reduced whole and then cut (ZeRO stage 1's communication; the run side is
//! `interp::zero`, `spec/sharding.md` says what a user sees).
//!
//! Two facts about the final IR, both static:
//! - a *feed*: `let (l, g) = value_and_grad(loss)(m, x, y)` (any call) whose `g` is read once,
//!   by an `@optimizer_step` call whose state is a local bound to an optimizer state made with
//!   `shard:` (`opt = adam.init(m, …, shard: dp)`);
//! - a *deferrable sum*: a statement `let c = all_reduce_sum(p)` of a function body, over one
//!   mesh axis, whose local is read once, by the function's result (as a field of the model or
//!   an item of the tuple it returns, directly or through locals that are read only there).
//!
//! A call that is a feed tells its callee to leave the deferrable sums of the gradient's part of
//! its result, over the state's axis, as partial sums; only the step reads them, and it sums and
//! cuts them with one reduce-scatter. Everything else gets whole values, as without this.

use crate::ir::walk::walk;
use crate::ir::{Expr, ExprId, ExprKind, Local, Pat, Prim, Program, Stmt};
use crate::types::{AxisId, FuncId, Type};
use std::collections::HashMap;

/// A call whose result holds a gradient that only a sharded optimizer step reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Feed {
    /// The local holding the step's optimizer state.
    pub state: Local,
    /// The item of the call's tuple result that is the gradient (`None`: the whole result).
    pub item: Option<usize>,
    /// The mesh axis the state is cut over.
    pub axis: AxisId,
}

/// The feeds and deferrable sums of a program.
#[derive(Clone, Debug, Default)]
pub struct ZeroPlan {
    /// Feeds, by the id of the call.
    pub feeds: HashMap<ExprId, Feed>,
    /// Deferrable sums, by the id of the `all_reduce_sum`: its axis and the item of the tuple
    /// result it reaches (`None`: the result is not a tuple).
    pub sums: HashMap<ExprId, (AxisId, Option<usize>)>,
}

impl ZeroPlan {
    /// The plan of `prog`: empty unless some optimizer state is made with `shard:`.
    pub fn of(prog: &Program) -> ZeroPlan {
        let mut plan = ZeroPlan::default();
        let mut any = false;
        for f in &prog.funcs {
            walk(&f.body, &mut |e| any |= matches!(&e.kind, ExprKind::Prim { prim: Prim::ShardState, .. }));
        }
        if !any {
            return plan;
        }
        for (i, f) in prog.funcs.iter().enumerate() {
            let (reads, assigned) = crate::ir::simplify::reads_and_assigned(&f.body);
            let once = |l: Local| reads.get(&l) == Some(&1) && !assigned.contains(&l);
            feeds(prog, FuncId(i as u32), &once, &mut plan.feeds);
            sums(&f.body, &once, &mut plan.sums);
        }
        plan
    }
}

/// What a value of a type is, for memory accounting: model parameters, an optimizer state (a
/// model whose fields include models, `AdamState[M]`), or anything else.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Model,
    Optimizer,
    Other,
}

pub(crate) fn kind_of(prog: &Program, t: &Type) -> Kind {
    match t {
        Type::Model(id, _) if prog.models.get(id.0 as usize).is_some_and(|m| !m.models.is_empty()) => Kind::Optimizer,
        Type::Model(..) => Kind::Model,
        Type::Tuple(ts) => {
            let ks: Vec<Kind> = ts.iter().map(|t| kind_of(prog, t)).collect();
            if ks.contains(&Kind::Model) {
                Kind::Model
            } else if ks.contains(&Kind::Optimizer) {
                Kind::Optimizer
            } else {
                Kind::Other
            }
        }
        _ => Kind::Other,
    }
}

/// The locals of `f` bound to an optimizer state made with `shard:` (a `shard_state`), with
/// its axis.
pub(crate) fn sharded_locals(prog: &Program, f: FuncId) -> HashMap<Local, AxisId> {
    let mut out = HashMap::new();
    let func = prog.func(f);
    walk(&func.body, &mut |e| {
        let ExprKind::Block { stmts, .. } = &e.kind else { return };
        for s in stmts {
            let (Stmt::Let { pat, value } | Stmt::Assign { pat, value }) = s else { continue };
            let mut axis = None;
            walk(value, &mut |x| {
                if let ExprKind::Prim { prim: Prim::ShardState, attrs, .. } = &x.kind {
                    axis = axis.or(attrs.mesh_axes.first().copied());
                }
            });
            if let Some(a) = axis {
                pat.each_local(&mut |l| {
                    if kind_of(prog, &func.locals[l.0 as usize].ty) == Kind::Optimizer {
                        out.insert(l, a);
                    }
                });
            }
        }
    });
    out
}

/// Whether `f` is an `@optimizer_step` function.
pub(crate) fn is_optimizer_step(prog: &Program, f: FuncId) -> bool {
    prog.func(f).annotations.iter().any(|n| prog.names.get(*n) == "optimizer_step")
}

/// The feeds in the blocks of function `f`.
fn feeds(prog: &Program, f: FuncId, once: &dyn Fn(Local) -> bool, out: &mut HashMap<ExprId, Feed>) {
    let states = sharded_locals(prog, f);
    if states.is_empty() {
        return;
    }
    // The state local and axis of a sharded step that takes `g` as its gradient.
    let step_of = |s: &Stmt, g: Local| -> Option<(Local, AxisId)> {
        let (Stmt::Let { value, .. } | Stmt::Assign { value, .. } | Stmt::Expr(value)) = s else { return None };
        let ExprKind::Call { func, args, .. } = &value.kind else { return None };
        if !is_optimizer_step(prog, *func) {
            return None;
        }
        match (args.get(1).map(|a| &a.kind), args.get(2).map(|a| &a.kind)) {
            (Some(ExprKind::Local(x)), Some(ExprKind::Local(s))) if *x == g => states.get(s).map(|a| (*s, *a)),
            _ => None,
        }
    };
    walk(&prog.func(f).body, &mut |e| {
        let ExprKind::Block { stmts, .. } = &e.kind else { return };
        for (i, s) in stmts.iter().enumerate() {
            let Stmt::Let { pat, value } = s else { continue };
            if !matches!(value.kind, ExprKind::Call { .. } | ExprKind::CallValue { .. }) {
                continue;
            }
            let items: Vec<(Option<usize>, Local)> = match pat {
                Pat::Local(g) => vec![(None, *g)],
                Pat::Tuple(ps) => ps
                    .iter()
                    .enumerate()
                    .filter_map(|(k, p)| match p {
                        Pat::Local(g) => Some((Some(k), *g)),
                        _ => None,
                    })
                    .collect(),
                Pat::Ignore => vec![],
            };
            for (item, g) in items.into_iter().filter(|(_, g)| once(*g)) {
                if let Some((state, axis)) = stmts[i + 1..].iter().find_map(|s| step_of(s, g)) {
                    out.insert(value.id, Feed { state, item, axis });
                    break;
                }
            }
        }
    });
}

/// The deferrable sums of a function body.
fn sums(body: &Expr, once: &dyn Fn(Local) -> bool, out: &mut HashMap<ExprId, (AxisId, Option<usize>)>) {
    let ExprKind::Block { stmts, result } = &body.kind else { return };
    // Locals that reach the result only, with the tuple item they reach.
    let mut reach: HashMap<Local, Option<usize>> = HashMap::new();
    match &result.kind {
        ExprKind::Tuple(items) => {
            for (k, x) in items.iter().enumerate() {
                built_from(x, &mut |l| {
                    reach.insert(l, Some(k));
                });
            }
        }
        _ => built_from(result, &mut |l| {
            reach.insert(l, None);
        }),
    }
    for s in stmts.iter().rev() {
        let Stmt::Let { pat: Pat::Local(y), value } = s else { continue };
        let Some(item) = reach.remove(y) else { continue };
        if !once(*y) {
            continue;
        }
        match &value.kind {
            ExprKind::Prim { prim: Prim::AllReduceSum, args, attrs }
                if args.len() == 1 && attrs.mesh_axes.len() == 1 =>
            {
                out.insert(value.id, (attrs.mesh_axes[0], item));
            }
            _ => built_from(value, &mut |l| {
                reach.insert(l, item);
            }),
        }
    }
}

/// The locals `e` is built from as it is: itself when it is a local, the items and fields of a
/// tuple or model it builds, at any depth.
fn built_from(e: &Expr, f: &mut dyn FnMut(Local)) {
    match &e.kind {
        ExprKind::Local(l) => f(*l),
        ExprKind::Tuple(items) | ExprKind::ModelBuild { fields: items } => items.iter().for_each(|x| built_from(x, f)),
        _ => {}
    }
}
