//! Whole-program passes of `-O2`: constant folding, common-subexpression elimination,
//! dead-code removal and forward substitution of single-use elementwise values (so that the SSA
//! chains of derivatives fuse) on every function, and a liveness analysis that finds the last use of each
//! local so the interpreter can hand its value over instead of keeping a copy alive (the same
//! walk gives the static memory plan, `ir::memplan`, its live sets).
//!
//! Folding evaluates a scalar elementwise primitive whose operands are literals with the
//! interpreter's own kernels (`ir::eval`) and keeps the result only when a literal of the expression's type makes
//! exactly that value (same element type, same bits), so folding never changes a result. CSE
//! and dead-code removal are the autodiff pass's `simplify` (pure expressions only: no calls,
//! random numbers or effects). The last uses are a set of expression ids (`ExprId`), so they
//! stay true when the program moves in memory; a clone of a subtree has new ids.

use super::prim::Class;
use super::{Expr, ExprId, ExprKind, Func, Lit, Local, Pat, Prim, Program, Stmt};
use crate::types::TensorTy;
use crate::types::Type;
use kernels::{DType, Tensor};
use std::collections::{HashMap, HashSet};

/// What [`optimize`] did.
#[derive(Clone, Debug, Default)]
pub struct OptReport {
    /// Primitive applications replaced by literals.
    pub folded: usize,
    /// Single-use elementwise values moved into their use (so that they fuse there), and
    /// literals bound to locals copied into every read.
    pub substituted: usize,
    /// Expression nodes before and after, over all functions.
    pub nodes_before: usize,
    pub nodes_after: usize,
}

fn count(e: &Expr) -> usize {
    let mut n = 0;
    super::walk::walk(e, &mut |_| n += 1);
    n
}

/// Folds constants and removes common subexpressions and dead code in every function.
pub fn optimize(prog: &mut Program) -> OptReport {
    let mut rep = OptReport::default();
    let mut funcs = std::mem::take(&mut prog.funcs);
    for f in &mut funcs {
        rep.nodes_before += count(&f.body);
        rep.folded += fold(f);
        crate::ir::simplify::simplify_with(f, true);
        rep.substituted += substitute(f);
        rep.nodes_after += count(&f.body);
    }
    prog.funcs = funcs;
    rep
}

/// Folds literal-only scalar primitives of `f`, innermost first; returns how many.
fn fold(f: &mut Func) -> usize {
    let mut folded = 0;
    // Each sweep folds the primitives whose operands are already literals; nested constant
    // expressions fold from the inside out over successive sweeps.
    for _ in 0..16 {
        let mut changed = 0;
        crate::ir::walk::walk_mut(&mut f.body, &mut |e| {
            if let Some(lit) = fold_one(e) {
                e.kind = ExprKind::Lit(lit);
                changed += 1;
            }
        });
        folded += changed;
        if changed == 0 {
            break;
        }
    }
    folded
}

fn fold_one(e: &Expr) -> Option<Lit> {
    let ExprKind::Prim { prim, args, .. } = &e.kind else { return None };
    let scalar = |t: &Type| matches!(t, Type::Tensor(TensorTy { shape: s, .. }) if s.is_empty());
    if prim.has_effect()
        || !(matches!(prim.class(), Class::Unary | Class::Binary) || matches!(prim, Prim::Cast | Prim::Where))
        || !scalar(&e.ty)
        || !args.iter().all(|a| matches!(a.kind, ExprKind::Lit(Lit::Int(_) | Lit::Float(_) | Lit::Bool(_))))
    {
        return None;
    }
    let ExprKind::Prim { attrs, .. } = &e.kind else { return None };
    let ins = args.iter().map(|a| match &a.kind {
        ExprKind::Lit(l) => super::eval::lit_tensor(l, &a.ty),
        _ => None,
    });
    let ins = ins.collect::<Option<Vec<_>>>()?;
    let Some(Ok(v)) = super::eval::elementwise(*prim, attrs.dtype, &ins) else { return None };
    let lit = match v.dtype() {
        DType::F32 => Lit::Float(f64::from(v.as_f32()?[0])),
        DType::F64 => Lit::Float(v.as_f64()?[0]),
        DType::I32 => Lit::Int(i64::from(v.as_i32()?[0])),
        DType::Bool => Lit::Bool(v.as_bool()?[0]),
        DType::Bf16 | DType::F16 => return None,
    };
    // Keep the literal only if it evaluates to exactly this value (type and bits).
    let w = super::eval::lit_tensor(&lit, &e.ty)?;
    same_bits(&v, &w).then_some(lit)
}

fn same_bits(a: &Tensor, b: &Tensor) -> bool {
    if a.dtype() != b.dtype() || a.shape() != b.shape() {
        return false;
    }
    match a.dtype() {
        DType::F32 => a.as_f32().zip(b.as_f32()).is_some_and(|(x, y)| x[0].to_bits() == y[0].to_bits()),
        DType::F64 => a.as_f64().zip(b.as_f64()).is_some_and(|(x, y)| x[0].to_bits() == y[0].to_bits()),
        DType::I32 => a.as_i32() == b.as_i32(),
        DType::Bool => a.as_bool() == b.as_bool(),
        DType::Bf16 | DType::F16 => a.to_f64_vec().iter().zip(b.to_f64_vec()).all(|(x, y)| x.to_bits() == y.to_bits()),
    }
}

/// Moves `let t = <float elementwise expression>` read exactly once, later in the same block
/// and not inside a loop or a closure, into that read, so that chains of single-use values
/// (the SSA form of derivatives: `let u = t + b; let v = relu(u)`) become one fusable tree.
/// Only expressions that cannot fail are moved (elementwise arithmetic on float and bool
/// tensors over locals and literals, no integer division, no random numbers), and only when
/// nothing they read is assigned anywhere in the function, so moving them changes no value, no
/// error and no order of effects.
///
/// A value read several times, all by one later elementwise tree (`let x2 = x * x; let t =
/// tanh(x + x2 * x); let d = bar * (1 + t) * (1 - t * t) * (1 + x2)`, common subexpressions
/// and derivative rules), is copied into each read, so that the tree fuses into one loop and
/// the value is never stored: the JIT computes an operation that occurs several times on the
/// same operands once per element (`jit::fuse::analyse`). Copies are bounded in size.
fn substitute(f: &mut Func) -> usize {
    let mut n = 0;
    // Copying a value into a tree adds reads of what it reads: each sweep counts them again.
    for _ in 0..8 {
        let k = substitute_once(f);
        n += k;
        if k == 0 {
            break;
        }
    }
    n
}

/// Nodes a value copied into a tree may add, at most.
const COPY_BUDGET: usize = 64;

fn substitute_once(f: &mut Func) -> usize {
    let (reads, assigned) = crate::ir::simplify::reads_and_assigned(&f.body);
    let types: Vec<Type> = f.locals.iter().map(|l| l.ty.clone()).collect();
    let mut n = 0;
    crate::ir::walk::walk_mut(&mut f.body, &mut |e| {
        let ExprKind::Block { stmts, result } = &mut e.kind else { return };
        let mut i = 0;
        while i < stmts.len() {
            if let Some(done) = propagate_literal(stmts, result, i, &assigned, &types) {
                if done {
                    stmts.remove(i);
                    n += 1;
                    continue;
                }
                i += 1;
                continue;
            }
            let candidate = match &stmts[i] {
                Stmt::Let { pat: Pat::Local(l), value }
                    if !assigned.contains(l)
                        && cannot_fail(value, &assigned)
                        && !matches!(value.kind, ExprKind::Local(_)) =>
                {
                    reads.get(l).map(|&r| (*l, r, count(value)))
                }
                _ => None,
            };
            let movable = match candidate {
                Some((_, 1, _)) => true,
                Some((l, r, size)) if r > 1 && size * (r - 1) <= COPY_BUDGET => {
                    if copy_into_tree(stmts, result, i, l, r) {
                        stmts.remove(i);
                        n += 1;
                        continue;
                    }
                    false
                }
                _ => false,
            };
            if movable {
                let Stmt::Let { pat: Pat::Local(l), value } = stmts[i].clone() else { unreachable!() };
                let mut value = Some(value);
                place_in(&mut stmts[i + 1..], result, l, &mut |slot| {
                    if let Some(v) = value.take() {
                        *slot = v;
                    }
                });
                if value.is_none() {
                    stmts.remove(i);
                    n += 1;
                    continue;
                }
            }
            i += 1;
        }
    });
    n
}

/// A number or boolean literal bound by `let l = …` (statement `i`) is copied into every read
/// the value of a single-use local could move to: CSE gives all the `0.0`s of a derivative one
/// local (`relu`'s mask and its `where` in every layer), which would otherwise be an input of
/// every tree that reads it, and a literal is a constant the fused loop knows. Only a literal
/// of the local's own type (`types`, by local) is copied. `None` when statement `i` is no such
/// `let`; otherwise whether no read is left (reads in loops, closures and transforms stay).
fn propagate_literal(
    stmts: &mut [Stmt],
    result: &mut Expr,
    i: usize,
    assigned: &HashSet<Local>,
    types: &[Type],
) -> Option<bool> {
    let Stmt::Let { pat: Pat::Local(l), value } = &stmts[i] else { return None };
    let literal = matches!(value.kind, ExprKind::Lit(Lit::Float(_) | Lit::Int(_) | Lit::Bool(_)));
    if assigned.contains(l) || !literal || types.get(l.0 as usize) != Some(&value.ty) {
        return None;
    }
    let (l, lit) = (*l, value.clone());
    place_in(&mut stmts[i + 1..], result, l, &mut |slot| *slot = lit.clone());
    let left = stmts[i + 1..].iter().map(|s| match s {
        Stmt::Let { value: v, .. } | Stmt::Assign { value: v, .. } | Stmt::Expr(v) => reads_of(v, l),
        _ => 0,
    });
    Some(left.sum::<usize>() + reads_of(result, l) == 0)
}

/// Copies the value of `let l = …` (statement `i`, read `r` times) into every read, when all
/// of them lie in one elementwise tree of one later statement (or the block's result); whether
/// it did.
fn copy_into_tree(stmts: &mut [Stmt], result: &mut Expr, i: usize, l: Local, r: usize) -> bool {
    let Stmt::Let { value, .. } = &stmts[i] else { return false };
    let value = value.clone();
    let target = stmts[i + 1..].iter_mut().find_map(|s| match s {
        Stmt::Let { value: v, .. } | Stmt::Assign { value: v, .. } | Stmt::Expr(v) if reads_of(v, l) > 0 => Some(v),
        _ => None,
    });
    let target = match target {
        Some(v) => v,
        None if reads_of(result, l) > 0 => result,
        None => return false,
    };
    if !one_tree(target, l, r) {
        return false;
    }
    crate::ir::walk::walk_mut(target, &mut |x| {
        if matches!(x.kind, ExprKind::Local(m) if m == l) {
            *x = value.clone();
        }
    });
    true
}

/// The reads of `l` in `e`.
fn reads_of(e: &Expr, l: Local) -> usize {
    let mut n = 0;
    crate::ir::walk::walk(e, &mut |x| match &x.kind {
        ExprKind::Local(m) if *m == l => n += 1,
        ExprKind::Closure { captures, .. } if captures.contains(&l) => n += 2,
        _ => {}
    });
    n
}

/// A float/bool elementwise primitive application on float/bool operands: an interior node of
/// the trees the JIT fuses.
fn elementwise(e: &Expr) -> bool {
    let float_or_bool = |t: &Type| matches!(t, Type::Tensor(TensorTy { elem: el, .. }) if el.is_float() || *el == crate::types::Elem::T(crate::types::ElemTy::Bool));
    match &e.kind {
        ExprKind::Prim { prim, args, .. } => {
            (matches!(prim.class(), Class::Unary | Class::Binary) || matches!(prim, Prim::Where))
                && float_or_bool(&e.ty)
                && args.iter().all(|a| float_or_bool(&a.ty))
        }
        _ => false,
    }
}

/// Whether the `r` reads of `l` in `e` all lie in one elementwise tree of `e`, reached from its
/// root through elementwise primitives only (so a copy there is computed in that tree's loop,
/// once per element, and nowhere else).
fn one_tree(e: &Expr, l: Local, r: usize) -> bool {
    if elementwise(e) {
        return tree_reads(e, l) == Some(r);
    }
    let kids: Vec<&Expr> = match &e.kind {
        ExprKind::Prim { args, .. } | ExprKind::Call { args, .. } | ExprKind::Tuple(args) => args.iter().collect(),
        ExprKind::ModelBuild { fields } => fields.iter().collect(),
        ExprKind::TupleGet(a, _) | ExprKind::Field(a, _) => vec![a],
        _ => return false,
    };
    let mut with = kids.into_iter().filter(|k| reads_of(k, l) > 0);
    match (with.next(), with.next()) {
        (Some(k), None) => one_tree(k, l, r),
        _ => false,
    }
}

/// The reads of `l` in the elementwise tree rooted at `e`; `None` when one is below a node
/// that is not elementwise.
fn tree_reads(e: &Expr, l: Local) -> Option<usize> {
    match &e.kind {
        ExprKind::Local(m) if *m == l => Some(1),
        ExprKind::Prim { args, .. } if elementwise(e) => args.iter().map(|a| tree_reads(a, l)).sum(),
        _ => (reads_of(e, l) == 0).then_some(0),
    }
}

/// Elementwise float/bool arithmetic over locals (never assigned) and literals: no run-time
/// error is possible, and its value does not depend on when it is computed.
fn cannot_fail(e: &Expr, assigned: &HashSet<Local>) -> bool {
    match &e.kind {
        ExprKind::Local(l) => !assigned.contains(l),
        ExprKind::Lit(Lit::Float(_) | Lit::Bool(_)) => true,
        ExprKind::Prim { args, .. } => elementwise(e) && args.iter().all(|a| cannot_fail(a, assigned)),
        _ => false,
    }
}

/// Calls `put` on each read of `l` in `e` outside loops, closures and transforms (where a
/// value moved in could run more than once).
fn place_with(e: &mut Expr, l: Local, put: &mut dyn FnMut(&mut Expr)) {
    match &mut e.kind {
        ExprKind::Local(x) if *x == l => put(e),
        ExprKind::Prim { args, .. } | ExprKind::Call { args, .. } | ExprKind::Tuple(args) => {
            args.iter_mut().for_each(|a| place_with(a, l, put))
        }
        ExprKind::ModelBuild { fields } => fields.iter_mut().for_each(|a| place_with(a, l, put)),
        ExprKind::CallValue { callee, args, .. } => {
            place_with(callee, l, put);
            args.iter_mut().for_each(|a| place_with(a, l, put));
        }
        ExprKind::TupleGet(a, _) | ExprKind::Field(a, _) | ExprKind::Return(a) => place_with(a, l, put),
        ExprKind::If { cond, then, els } => {
            place_with(cond, l, put);
            place_with(then, l, put);
            place_with(els, l, put);
        }
        ExprKind::Block { stmts, result } => place_in(stmts, result, l, put),
        _ => {}
    }
}

/// [`place_with`] over the statements `stmts` and then `result` (a block, or what follows a
/// `let` in one).
fn place_in(stmts: &mut [Stmt], result: &mut Expr, l: Local, put: &mut dyn FnMut(&mut Expr)) {
    for s in stmts {
        if let Stmt::Let { value: v, .. } | Stmt::Assign { value: v, .. } | Stmt::Expr(v) = s {
            place_with(v, l, put);
        }
    }
    place_with(result, l, put);
}

/// The reads of locals after which the local is never read again (in any function of the
/// program), by expression id. The interpreter moves those values out of the frame.
pub fn last_uses(prog: &Program) -> HashSet<ExprId> {
    let mut out = HashSet::new();
    for f in &prog.funcs {
        let mut live = HashSet::new();
        Live { out: &mut out, after: None, record: true }.expr(&f.body, &mut live);
    }
    out
}

/// A point of a function body where liveness records the set of live locals.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Point {
    /// After statement `i` of the block expression with this id.
    AfterStmt(ExprId, usize),
    /// At the end of the loop body with this id (the live set at the next iteration's head).
    LoopEnd(ExprId),
}

/// The liveness of one function's locals, as the memory plan (`ir::memplan`) needs it.
#[derive(Clone, Debug, Default)]
pub struct Liveness {
    /// The reads that are a local's last ([`last_uses`] restricted to this function).
    pub last_reads: HashSet<ExprId>,
    /// The locals live after each statement and at the end of each loop body (the live set
    /// at the next iteration's head).
    pub live_after: HashMap<Point, HashSet<Local>>,
}

/// The liveness of `f`'s locals: the same backward walk as [`last_uses`], also recording the
/// live set after every statement.
pub fn liveness(f: &Func) -> Liveness {
    let mut l = Liveness::default();
    let mut live = HashSet::new();
    Live { out: &mut l.last_reads, after: Some(&mut l.live_after), record: true }.expr(&f.body, &mut live);
    l
}

struct Live<'a> {
    out: &'a mut HashSet<ExprId>,
    /// Where to record the live set after each statement and at each loop body's end.
    after: Option<&'a mut HashMap<Point, HashSet<Local>>>,
    /// False while iterating a loop to its fixpoint (only the last pass records).
    record: bool,
}

/// Every local read anywhere in `e` (closure captures and dim bindings included).
fn uses(e: &Expr, live: &mut HashSet<Local>) {
    super::walk::walk(e, &mut |x| match &x.kind {
        ExprKind::Local(l) => {
            live.insert(*l);
        }
        ExprKind::Closure { captures, .. } => live.extend(captures.iter().copied()),
        ExprKind::Block { stmts, .. } => {
            for s in stmts {
                if let Stmt::BindDims { local, .. } = s {
                    live.insert(*local);
                }
            }
        }
        _ => {}
    });
}

impl Live<'_> {
    /// Turns `live` (the locals live after `e`) into those live before it, walking `e`'s
    /// evaluation order backwards and recording last reads.
    fn expr(&mut self, e: &Expr, live: &mut HashSet<Local>) {
        match &e.kind {
            ExprKind::Local(l) => {
                if self.record && !live.contains(l) {
                    self.out.insert(e.id);
                }
                live.insert(*l);
            }
            ExprKind::Prim { args, .. } | ExprKind::Call { args, .. } | ExprKind::Tuple(args) => {
                args.iter().rev().for_each(|a| self.expr(a, live))
            }
            ExprKind::ModelBuild { fields } => fields.iter().rev().for_each(|a| self.expr(a, live)),
            ExprKind::CallValue { callee, args, .. } => {
                args.iter().rev().for_each(|a| self.expr(a, live));
                self.expr(callee, live);
            }
            ExprKind::TupleGet(a, _) | ExprKind::Field(a, _) => self.expr(a, live),
            ExprKind::Return(a) => {
                live.clear();
                self.expr(a, live);
            }
            ExprKind::Block { stmts, result } => {
                self.expr(result, live);
                for (i, s) in stmts.iter().enumerate().rev() {
                    if self.record {
                        if let Some(after) = self.after.as_deref_mut() {
                            after.insert(Point::AfterStmt(e.id, i), live.clone());
                        }
                    }
                    match s {
                        Stmt::Let { pat, value } | Stmt::Assign { pat, value } => {
                            pat.each_local(&mut |l| {
                                live.remove(&l);
                            });
                            self.expr(value, live);
                        }
                        Stmt::Expr(x) => self.expr(x, live),
                        Stmt::BindDims { local, .. } => {
                            live.insert(*local);
                        }
                    }
                }
            }
            ExprKind::If { cond, then, els } => {
                let mut t = live.clone();
                self.expr(then, &mut t);
                self.expr(els, live);
                live.extend(t);
                self.expr(cond, live);
            }
            ExprKind::ForRange { var, start, end, body } => {
                self.body_loop(body, std::slice::from_ref(var), None, live);
                self.expr(end, live);
                self.expr(start, live);
            }
            ExprKind::ForBatches { vars, data, size, shuffle, body, .. } => {
                self.body_loop(body, vars, None, live);
                if let Some(s) = shuffle {
                    self.expr(s, live);
                }
                self.expr(size, live);
                data.iter().rev().for_each(|a| self.expr(a, live));
            }
            ExprKind::While { cond, body } => self.body_loop(body, &[], Some(cond), live),
            // Transforms, closures, model initialisers: their reads are uses, never moves.
            _ => uses(e, live),
        }
    }

    /// A loop `head: [cond →] body → head`, run zero or more times: iterates the live set at
    /// the loop head to its fixpoint, then walks the body once more recording last reads.
    fn body_loop(&mut self, body: &Expr, vars: &[Local], cond: Option<&Expr>, live: &mut HashSet<Local>) {
        let after = live.clone();
        let record = self.record;
        self.record = false;
        let mut head = after.clone();
        loop {
            let next = self.head_from(body, vars, cond, &after, &head);
            if next == head {
                break;
            }
            head = next;
        }
        self.record = record;
        *live = self.head_from(body, vars, cond, &after, &head);
    }

    /// The live set at the loop head given the one assumed at the end of the body.
    fn head_from(
        &mut self,
        body: &Expr,
        vars: &[Local],
        cond: Option<&Expr>,
        after: &HashSet<Local>,
        head: &HashSet<Local>,
    ) -> HashSet<Local> {
        if self.record {
            if let Some(at_end) = self.after.as_deref_mut() {
                at_end.insert(Point::LoopEnd(body.id), head.clone());
            }
        }
        let mut b = head.clone();
        self.expr(body, &mut b);
        for v in vars {
            b.remove(v);
        }
        let mut h: HashSet<Local> = after.union(&b).copied().collect();
        if let Some(c) = cond {
            self.expr(c, &mut h);
        }
        h
    }
}
