//! Where a gradient reaches a sharded optimizer step straight from the function that computes
//! it, so that its data-parallel partial sums are reduce-scattered into the step's pieces
//! instead of all-reduced whole and then cut (ZeRO stage 1's communication; the run side is
//! `interp::zero`, `spec/sharding.md` says what a user sees).
//!
//! Two facts about the final IR, both static:
//! - a *feed*: `let (l, g) = value_and_grad(loss)(m, x, y)` (any call) whose `g` is read once,
//!   by an `@optimizer_step` call whose state is a local bound to an optimizer state made with
//!   `shard:` (`opt = adam.init(m, …, shard: dp)`);
//! - a function's *partial result*: an item of its result that is built from its
//!   `all_reduce_sum`s over one axis by linear operations only (sums, differences, scaling by
//!   values that do not depend on them, slices and `update`s, reshapes, fields and model or
//!   tuple building), starting from zeros, with every value on the way read by nothing else.
//!   Such an item equals the all-reduce of the same computation run on each rank's partial
//!   sums, so those all-reduces can be left out and the item returned as a partial sum. This
//!   covers a gradient summed where the backward pass returns it and one accumulated in a loop
//!   (a stack of layers, whose reverse loop adds each layer's gradient into its row).
//!
//! A call that is a feed runs its callee with the all-reduces of the gradient's item left out
//! and that item returned as partial sums; only the step reads them, and it sums and cuts them
//! with one reduce-scatter. Everything else gets whole values, as without this.

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
    /// The all-reduces a partial result leaves out, by the id of the `all_reduce_sum`: its axis
    /// and the item of the tuple result it reaches (`None`: the result is not a tuple).
    pub sums: HashMap<ExprId, (AxisId, Option<usize>)>,
    /// Partial results: a function and the item of its result, with the axis of its sums.
    pub results: HashMap<(FuncId, Option<usize>), AxisId>,
}

impl ZeroPlan {
    /// The plan of `prog`: empty unless some optimizer state is made with `shard:`.
    pub fn of(prog: &Program) -> ZeroPlan {
        let mut plan = ZeroPlan::default();
        let mut any = false;
        for f in &prog.funcs {
            walk(&f.body, &mut |e| {
                any |= matches!(&e.kind, ExprKind::Prim { prim: Prim::ShardState, attrs, .. } if !attrs.mesh_axes.is_empty())
            });
        }
        if !any {
            return plan;
        }
        let mut callees = std::collections::BTreeSet::new();
        for (i, f) in prog.funcs.iter().enumerate() {
            let (reads, assigned) = crate::ir::simplify::reads_and_assigned(&f.body);
            let once = |l: Local| reads.get(&l) == Some(&1) && !assigned.contains(&l);
            feeds(prog, FuncId(i as u32), &once, &mut plan.feeds, &mut callees);
        }
        // Only a feed's callee runs with sums left out.
        for f in callees {
            partial_results(f, &prog.func(f).body, &mut plan.results, &mut plan.sums);
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
    state_locals(prog, f, &|a| a.mesh_axes.first().copied())
}

/// The locals of `f` bound to an optimizer state made with `offload: host`.
pub(crate) fn offloaded_locals(prog: &Program, f: FuncId) -> HashMap<Local, ()> {
    state_locals(prog, f, &|a| a.host.then_some(()))
}

/// The locals of `f` bound to an optimizer state made by a `shard_state` whose attributes
/// `pick` takes, with what it took.
fn state_locals<T: Copy>(
    prog: &Program,
    f: FuncId,
    pick: &dyn Fn(&crate::ir::Attrs) -> Option<T>,
) -> HashMap<Local, T> {
    let mut out = HashMap::new();
    let func = prog.func(f);
    walk(&func.body, &mut |e| {
        let ExprKind::Block { stmts, .. } = &e.kind else { return };
        for s in stmts {
            let (Stmt::Let { pat, value } | Stmt::Assign { pat, value }) = s else { continue };
            let mut found = None;
            walk(value, &mut |x| {
                if let ExprKind::Prim { prim: Prim::ShardState, attrs, .. } = &x.kind {
                    found = found.or(pick(attrs));
                }
            });
            if let Some(a) = found {
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

/// The feeds in the blocks of function `f`; the functions they call (when known statically) go
/// into `callees`.
fn feeds(
    prog: &Program,
    f: FuncId,
    once: &dyn Fn(Local) -> bool,
    out: &mut HashMap<ExprId, Feed>,
    callees: &mut std::collections::BTreeSet<FuncId>,
) {
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
                    let callee = match &value.kind {
                        ExprKind::Call { func, .. } => Some(*func),
                        ExprKind::CallValue { target, .. } => crate::ir::derived::target_func(prog, target),
                        _ => None,
                    };
                    callees.extend(callee);
                    break;
                }
            }
        }
    });
}

/// How a local is read: into the value bound to another local, by the function's result (in
/// that item of a tuple result), or otherwise.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Use {
    Bind(Local),
    Result(Option<usize>),
    Other,
}

/// The locals of a function body, the values bound to each, and how each is read.
#[derive(Default)]
struct Flow<'e> {
    binds: HashMap<Local, Vec<&'e Expr>>,
    uses: HashMap<Local, Vec<Use>>,
    /// Bound by a tuple pattern or read by a closure or a dim binding.
    bad: std::collections::HashSet<Local>,
}

impl<'e> Flow<'e> {
    fn of(body: &'e Expr) -> Flow<'e> {
        let mut f = Flow::default();
        f.visit(body, Use::Other, true);
        f
    }

    fn visit(&mut self, e: &'e Expr, u: Use, top: bool) {
        match &e.kind {
            ExprKind::Local(x) => self.uses.entry(*x).or_default().push(u),
            ExprKind::Closure { captures, .. } => self.bad.extend(captures.iter().copied()),
            // What a sum adds up is read as anything else is: a partial value may not enter it.
            ExprKind::Prim { prim: Prim::AllReduceSum, args, .. } => {
                args.iter().for_each(|a| self.visit(a, Use::Other, false))
            }
            ExprKind::Block { stmts, result } => {
                for s in stmts {
                    match s {
                        Stmt::Let { pat: Pat::Local(y), value } | Stmt::Assign { pat: Pat::Local(y), value } => {
                            self.binds.entry(*y).or_default().push(value);
                            self.visit(value, Use::Bind(*y), false);
                        }
                        Stmt::Let { pat, value } | Stmt::Assign { pat, value } => {
                            pat.each_local(&mut |l| {
                                self.bad.insert(l);
                            });
                            self.visit(value, Use::Other, false);
                        }
                        Stmt::Expr(v) => self.visit(v, Use::Other, false),
                        Stmt::BindDims { local, .. } => {
                            self.bad.insert(*local);
                        }
                    }
                }
                match (&result.kind, top) {
                    (ExprKind::Tuple(items), true) => {
                        for (k, x) in items.iter().enumerate() {
                            self.visit(x, Use::Result(Some(k)), false);
                        }
                    }
                    (_, true) => self.visit(result, Use::Result(None), false),
                    _ => self.visit(result, Use::Other, false),
                }
            }
            _ => crate::ir::walk::children(e, &mut |c| self.visit(c, u, false)),
        }
    }
}

/// The locals of `c` and those that depend on a sum (`tainted`), for [`linear`].
struct Sets<'a> {
    c: &'a std::collections::HashSet<Local>,
    tainted: &'a std::collections::HashSet<Local>,
}

/// Whether `e` reads none of `locals` and holds no sum.
fn reads_none(e: &Expr, locals: &std::collections::HashSet<Local>) -> bool {
    let mut ok = true;
    walk(e, &mut |y| match &y.kind {
        ExprKind::Local(l) => ok &= !locals.contains(l),
        ExprKind::Prim { prim: Prim::AllReduceSum, .. } => ok = false,
        _ => {}
    });
    ok
}

/// Whether `e` is linear in the locals of `c` and the sums it holds (see the module
/// documentation); the sums it holds go into `sums`.
fn linear<'e>(e: &'e Expr, k: &Sets, sums: &mut Vec<&'e Expr>) -> bool {
    let c = k.c;
    // A factor that does not depend on any sum and is the same on every rank (a rank's own
    // block of a split value would scale each rank's part differently).
    let free = |x: &Expr| {
        !matches!(&x.ty, crate::types::Type::Tensor(t) if t.layout.0.iter().any(|a| !a.is_empty()))
            && reads_none(x, k.tainted)
    };
    match &e.kind {
        ExprKind::Local(x) => c.contains(x),
        ExprKind::Lit(crate::ir::Lit::Float(v)) => *v == 0.0,
        ExprKind::Field(a, _) | ExprKind::TupleGet(a, _) => linear(a, k, sums),
        ExprKind::Tuple(items) | ExprKind::ModelBuild { fields: items } => items.iter().all(|x| linear(x, k, sums)),
        ExprKind::Prim { prim, args, attrs } => match (prim, args.as_slice()) {
            (Prim::Zeros, _) => true,
            // Its operand reads no local of `c` (`Flow` counts such a read as `Other`).
            (Prim::AllReduceSum, [_]) if attrs.mesh_axes.len() == 1 => {
                sums.push(e);
                true
            }
            (Prim::Add | Prim::Sub, [a, b]) => linear(a, k, sums) && linear(b, k, sums),
            (Prim::Mul, [a, b]) => (free(b) && linear(a, k, sums)) || (free(a) && linear(b, k, sums)),
            (Prim::Div, [a, b]) => free(b) && linear(a, k, sums),
            (p, [a, rest @ ..]) if p.linear_in_first() => rest.iter().all(free) && linear(a, k, sums),
            (Prim::Update, [a, v, rest @ ..]) => rest.iter().all(free) && linear(a, k, sums) && linear(v, k, sums),
            (Prim::Neg, [a]) => linear(a, k, sums),
            _ => false,
        },
        _ => false,
    }
}

type Set<T> = std::collections::BTreeSet<T>;

/// The partial results of function `f` and the sums they leave out.
fn partial_results(
    f: FuncId,
    body: &Expr,
    results: &mut HashMap<(FuncId, Option<usize>), AxisId>,
    out: &mut HashMap<ExprId, (AxisId, Option<usize>)>,
) {
    // A `return` could hand back another value than the result's expression.
    let mut returns = false;
    walk(body, &mut |e| returns |= matches!(e.kind, ExprKind::Return(_)));
    let ExprKind::Block { result, .. } = &body.kind else { return };
    if returns {
        return;
    }
    let flow = Flow::of(body);
    let tainted = tainted(&flow);
    let (c, axes, items) = linear_locals(&flow, &tainted);
    let k = Sets { c: &c, tainted: &tainted };
    let item_exprs: Vec<(Option<usize>, &Expr)> = match &result.kind {
        ExprKind::Tuple(xs) => xs.iter().enumerate().map(|(i, x)| (Some(i), x)).collect(),
        _ => vec![(None, &**result)],
    };
    for (item, x) in item_exprs {
        let mut sums = Vec::new();
        if !linear(x, &k, &mut sums) {
            continue;
        }
        let mut a: Set<AxisId> = sums.iter().flat_map(|s| sum_axis(s)).collect();
        walk(x, &mut |y| {
            if let ExprKind::Local(l) = &y.kind {
                a.extend(axes.get(l).into_iter().flatten().copied());
            }
        });
        let [axis] = a.into_iter().collect::<Vec<_>>()[..] else { continue };
        results.insert((f, item), axis);
        for l in c.iter().filter(|l| items[l].contains(&item)) {
            for v in &flow.binds[l] {
                linear(v, &k, &mut sums);
            }
        }
        out.extend(sums.into_iter().map(|s| (s.id, (axis, item))));
    }
}

/// The axis of the sum `s`.
fn sum_axis(s: &Expr) -> Option<AxisId> {
    match &s.kind {
        ExprKind::Prim { attrs, .. } => attrs.mesh_axes.first().copied(),
        _ => None,
    }
}

/// The locals whose values depend on a sum.
fn tainted(flow: &Flow) -> std::collections::HashSet<Local> {
    let mut tainted = std::collections::HashSet::new();
    loop {
        let before = tainted.len();
        for (x, vs) in &flow.binds {
            if !tainted.contains(x) && vs.iter().any(|v| !reads_none(v, &tainted)) {
                tainted.insert(*x);
            }
        }
        if tainted.len() == before {
            return tainted;
        }
    }
}

/// The locals that may hold partial sums: the greatest set bound only to values linear in one
/// another and the sums, read only into one another and the result, each over one axis and
/// reaching one item of the result; with each one's axes and items.
#[allow(clippy::type_complexity)]
fn linear_locals(
    flow: &Flow,
    tainted: &std::collections::HashSet<Local>,
) -> (std::collections::HashSet<Local>, HashMap<Local, Set<AxisId>>, HashMap<Local, Set<Option<usize>>>) {
    let mut c: std::collections::HashSet<Local> =
        flow.binds.keys().copied().filter(|x| !flow.bad.contains(x)).collect();
    loop {
        loop {
            let keep: std::collections::HashSet<Local> = c
                .iter()
                .copied()
                .filter(|x| {
                    let k = Sets { c: &c, tainted };
                    let bound = flow.binds[x].iter().all(|v| linear(v, &k, &mut Vec::new()));
                    let read = flow.uses.get(x).into_iter().flatten().all(|u| match u {
                        Use::Bind(y) => c.contains(y),
                        Use::Result(_) => true,
                        Use::Other => false,
                    });
                    bound && read
                })
                .collect();
            if keep.len() == c.len() {
                break;
            }
            c = keep;
        }
        let (axes, items) = spread(flow, &c, tainted);
        let mixed: Vec<Local> = c.iter().copied().filter(|x| axes[x].len() > 1 || items[x].len() > 1).collect();
        if mixed.is_empty() {
            return (c, axes, items);
        }
        for x in mixed {
            c.remove(&x);
        }
    }
}

/// For the locals of `c`: the axes of the sums they hold (forward along the bindings) and the
/// items of the result they reach (backward along the reads).
#[allow(clippy::type_complexity)]
fn spread(
    flow: &Flow,
    c: &std::collections::HashSet<Local>,
    tainted: &std::collections::HashSet<Local>,
) -> (HashMap<Local, Set<AxisId>>, HashMap<Local, Set<Option<usize>>>) {
    let k = Sets { c, tainted };
    let mut axes: HashMap<Local, Set<AxisId>> = c.iter().map(|x| (*x, Set::new())).collect();
    let mut items: HashMap<Local, Set<Option<usize>>> = c.iter().map(|x| (*x, Set::new())).collect();
    for _ in 0..=c.len() {
        let mut changed = false;
        for x in c {
            let mut a = axes[x].clone();
            for v in &flow.binds[x] {
                let mut sums = Vec::new();
                linear(v, &k, &mut sums);
                a.extend(sums.iter().flat_map(|s| sum_axis(s)));
                walk(v, &mut |y| {
                    if let ExprKind::Local(l) = &y.kind {
                        a.extend(axes.get(l).into_iter().flatten().copied());
                    }
                });
            }
            let mut it = items[x].clone();
            for u in flow.uses.get(x).into_iter().flatten() {
                match u {
                    Use::Result(i) => {
                        it.insert(*i);
                    }
                    Use::Bind(y) => it.extend(items.get(y).into_iter().flatten().copied()),
                    Use::Other => {}
                }
            }
            changed |= axes[x] != a || items[x] != it;
            axes.insert(*x, a);
            items.insert(*x, it);
        }
        if !changed {
            break;
        }
    }
    (axes, items)
}
