//! Clean-up of generated functions: common subexpressions are shared and values nobody reads
//! are dropped (dead-code removal), so derivatives stay small and readable.

use super::walk::{walk, walk_mut};
use super::{Expr, ExprKind, Func, Local, Pat, Stmt};
use crate::types::TensorTy;
use std::collections::{HashMap, HashSet};

/// Simplifies a generated function in place, and lets its GEMMs read transposed operands
/// through strides ([`operand_transposes`]).
pub fn simplify(f: &mut Func) {
    simplify_with(f, false);
    operand_transposes(f);
}

/// Moves each `let t = permute(x, [.., 1, 0])` (a swap of the last two axes) that is read once,
/// as an operand of `@` in a later statement of the same block, into that operand, so that the
/// GEMM reads `x` through strides instead of a transposed copy (the derivatives of `@` are
/// such products). Only generated code is rewritten, so every engine evaluates the same IR.
/// How often each local of `body` is read (a closure capture or a run-time dim binding counts
/// as two reads, so such a local is never "read once"), and the locals it assigns.
pub(crate) fn reads_and_assigned(body: &Expr) -> (HashMap<Local, usize>, HashSet<Local>) {
    let mut reads: HashMap<Local, usize> = HashMap::new();
    let mut assigned = HashSet::new();
    walk(body, &mut |e| match &e.kind {
        ExprKind::Local(l) => *reads.entry(*l).or_default() += 1,
        ExprKind::Closure { captures, .. } => captures.iter().for_each(|l| *reads.entry(*l).or_default() += 2),
        ExprKind::Block { stmts, .. } => {
            for s in stmts {
                match s {
                    Stmt::Assign { pat, .. } => assigned.extend(pat.locals()),
                    Stmt::BindDims { local, .. } => *reads.entry(*local).or_default() += 2,
                    _ => {}
                }
            }
        }
        _ => {}
    });
    (reads, assigned)
}

fn operand_transposes(f: &mut Func) {
    let (reads, assigned) = reads_and_assigned(&f.body);
    let operand_of = |value: &mut Expr, l: Local| -> Option<usize> {
        let ExprKind::Prim { prim: crate::ir::Prim::MatMul, args, .. } = &value.kind else { return None };
        args.iter().position(|a| matches!(a.kind, ExprKind::Local(x) if x == l))
    };
    walk_mut(&mut f.body, &mut |e| {
        let ExprKind::Block { stmts, .. } = &mut e.kind else { return };
        let mut i = 0;
        while i < stmts.len() {
            let movable = match &stmts[i] {
                Stmt::Let { pat: Pat::Local(l), value } if reads.get(l) == Some(&1) => value
                    .swapped_last()
                    .is_some_and(|x| matches!(x.kind, ExprKind::Local(v) if !assigned.contains(&v)))
                    .then_some(*l),
                _ => None,
            };
            let Some(l) = movable else {
                i += 1;
                continue;
            };
            let mut target = None;
            for (j, s) in stmts.iter_mut().enumerate().skip(i + 1) {
                if let Stmt::Let { value, .. } | Stmt::Assign { value, .. } | Stmt::Expr(value) = s {
                    if let Some(k) = operand_of(value, l) {
                        target = Some((j, k));
                        break;
                    }
                }
            }
            let Some((j, k)) = target else {
                i += 1;
                continue;
            };
            let Stmt::Let { value: perm, .. } = stmts.remove(i) else { continue };
            if let Stmt::Let { value, .. } | Stmt::Assign { value, .. } | Stmt::Expr(value) = &mut stmts[j - 1] {
                if let ExprKind::Prim { args, .. } = &mut value.kind {
                    args[k] = perm;
                }
            }
        }
    });
}

/// Simplifies a function in place; with `anywhere`, equal expressions from different places
/// of the source are shared too (their spans are ignored), as `-O2` does for whole programs.
pub fn simplify_with(f: &mut Func, anywhere: bool) {
    let mutable: HashSet<Local> =
        f.locals.iter().enumerate().filter(|(_, l)| l.mutable).map(|(i, _)| Local(i as u32)).collect();
    let mut assigned = HashSet::new();
    walk(&f.body, &mut |e| {
        if let ExprKind::Block { stmts, .. } = &e.kind {
            for s in stmts {
                if let Stmt::Assign { pat, .. } = s {
                    assigned.extend(pat.locals());
                }
            }
        }
    });
    let _ = mutable;
    // Captured locals are read by closure bodies under their own ids: never renamed or dropped.
    let mut captured = HashSet::new();
    walk(&f.body, &mut |e| {
        if let ExprKind::Closure { captures, .. } = &e.kind {
            captured.extend(captures.iter().copied());
        }
    });
    assigned.extend(captured.iter().copied());
    let mut renames = HashMap::new();
    cse(&mut f.body, &mut HashMap::new(), &mut renames, &assigned, anywhere);
    for _ in 0..8 {
        let mut used = captured.clone();
        walk(&f.body, &mut |e| {
            if let ExprKind::Local(l) = &e.kind {
                used.insert(*l);
            }
            if let ExprKind::Block { stmts, .. } = &e.kind {
                for s in stmts {
                    if let Stmt::BindDims { local, .. } = s {
                        used.insert(*local);
                    }
                }
            }
        });
        if !dce(&mut f.body, &used, anywhere) {
            break;
        }
    }
}

/// Whether evaluating `e` can stop with a run-time error even though it type-checked: integer
/// division, indexing, and operations whose sizes come from values.
fn may_fail(e: &Expr) -> bool {
    use crate::ir::Prim::*;
    let mut fails = false;
    walk(e, &mut |x| {
        if let ExprKind::Prim { prim, .. } = &x.kind {
            let int = matches!(&x.ty, crate::types::Type::Tensor(TensorTy { elem: el, .. }) if !el.is_float());
            fails |= match prim {
                Div | Rem | Pow => int,
                Gather | OneHot | Slice | ScatterAdd | Argsort | TakeAlong | ScatterAddAlong | Attention
                | AttentionWeights | Quantize | Prune | Reshape | Concat | Stack | Einsum | Map | Load => true,
                Zeros | Ones | Full | Arange | Eye | BroadcastTo => true,
                _ => false,
            };
        }
    });
    fails
}

/// A value whose evaluation has no effect and whose result depends only on its operands.
fn pure(e: &Expr) -> bool {
    let mut ok = true;
    walk(e, &mut |x| match &x.kind {
        ExprKind::Prim { prim, .. } if !prim.is_pure() => ok = false,
        ExprKind::Call { .. }
        | ExprKind::CallValue { .. }
        | ExprKind::Block { .. }
        | ExprKind::If { .. }
        | ExprKind::ForRange { .. }
        | ExprKind::ForBatches { .. }
        | ExprKind::While { .. }
        | ExprKind::Return(_)
        | ExprKind::ModelInit { .. }
        | ExprKind::Closure { .. }
        | ExprKind::Jvp { .. }
        | ExprKind::Vjp { .. } => ok = false,
        _ => {}
    });
    ok
}

fn rename(e: &mut Expr, renames: &HashMap<Local, Local>) {
    crate::ir::walk::rename_locals(e, renames)
}

/// `s` without the numbers of its `SpanId(…)`s.
fn strip_spans(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find("SpanId(") {
        out.push_str(&rest[..i + 7]);
        rest = &rest[i + 7..];
        rest = rest.trim_start_matches(|c: char| c.is_ascii_digit());
    }
    out.push_str(rest);
    out
}

/// Shares equal pure values within a block (and with the blocks it encloses).
fn cse(
    e: &mut Expr,
    seen: &mut HashMap<String, Local>,
    renames: &mut HashMap<Local, Local>,
    assigned: &HashSet<Local>,
    anywhere: bool,
) {
    match &mut e.kind {
        ExprKind::Block { stmts, result } => {
            let mut scope = seen.clone();
            let mut kept = Vec::with_capacity(stmts.len());
            for mut s in std::mem::take(stmts) {
                match &mut s {
                    Stmt::Let { pat: Pat::Local(l), value } => {
                        rename(value, renames);
                        cse(value, &mut scope, renames, assigned, anywhere);
                        let reads_mutable = {
                            let mut r = false;
                            walk(value, &mut |x| {
                                if let ExprKind::Local(m) = &x.kind {
                                    r |= assigned.contains(m);
                                }
                            });
                            r
                        };
                        if pure(value) && !reads_mutable && !assigned.contains(l) {
                            let mut key = format!("{:?}|{:?}", value.kind, value.ty);
                            if anywhere {
                                key = strip_spans(&key);
                            }
                            if let Some(prev) = scope.get(&key) {
                                renames.insert(*l, *prev);
                                continue;
                            }
                            scope.insert(key, *l);
                        }
                    }
                    Stmt::Let { value, .. } | Stmt::Assign { value, .. } | Stmt::Expr(value) => {
                        rename(value, renames);
                        cse(value, &mut scope, renames, assigned, anywhere);
                    }
                    Stmt::BindDims { .. } => {}
                }
                kept.push(s);
            }
            *stmts = kept;
            rename(result, renames);
            cse(result, &mut scope, renames, assigned, anywhere);
        }
        ExprKind::If { cond, then, els } => {
            rename(cond, renames);
            cse(then, seen, renames, assigned, anywhere);
            cse(els, seen, renames, assigned, anywhere);
        }
        ExprKind::ForRange { start, end, body, .. } => {
            rename(start, renames);
            rename(end, renames);
            cse(body, seen, renames, assigned, anywhere);
        }
        ExprKind::While { cond, body } => {
            cse(cond, seen, renames, assigned, anywhere);
            cse(body, seen, renames, assigned, anywhere);
        }
        _ => rename(e, renames),
    }
}

/// Drops `let`s of pure values nobody reads; returns whether anything changed. With `keep_errors`
/// (`-O2` on user code), a value whose evaluation can fail at run time stays, so that the
/// program reports the same errors at every level.
fn dce(e: &mut Expr, used: &HashSet<Local>, keep_errors: bool) -> bool {
    let mut changed = false;
    walk_mut(e, &mut |x| {
        if let ExprKind::Block { stmts, .. } = &mut x.kind {
            let before = stmts.len();
            stmts.retain(|s| match s {
                Stmt::Let { pat: Pat::Local(l), value } => {
                    used.contains(l) || !pure(value) || (keep_errors && may_fail(value))
                }
                _ => true,
            });
            changed |= stmts.len() != before;
        }
    });
    changed
}
