//! Rewrites of copied bodies for inlining: early `return`s joined into `if`s, locals and dims renamed.

use super::*;

/// The block with its final `return v` replaced by `v`, if it always ends in a `return`.
fn strip_return(e: &Expr) -> Option<Expr> {
    match &e.kind {
        ExprKind::Return(v) => Some((**v).clone()),
        ExprKind::Block { stmts, result } => {
            if let Some(r) = strip_return(result) {
                return Some(Expr {
                    kind: ExprKind::Block { stmts: stmts.clone(), result: Box::new(r.clone()) },
                    ty: r.ty.clone(),
                    span: e.span,
                    id: crate::ir::ExprId::fresh(),
                });
            }
            match stmts.last() {
                Some(Stmt::Expr(last)) => {
                    let r = strip_return(last)?;
                    let rest = stmts[..stmts.len() - 1].to_vec();
                    Some(Expr {
                        kind: ExprKind::Block { stmts: rest, result: Box::new(r.clone()) },
                        ty: r.ty.clone(),
                        span: e.span,
                        id: crate::ir::ExprId::fresh(),
                    })
                }
                _ => None,
            }
        }
        _ => None,
    }
}

/// `if c { …; return a }` followed by the rest of a block, as one `if` whose branches are the
/// value of the function.
pub(super) fn join_early_return(s: &Stmt, rest: &[Stmt], result: &Expr) -> Option<Expr> {
    let Stmt::Expr(e) = s else { return None };
    let ExprKind::If { cond, then, els } = &e.kind else { return None };
    let (t, f) = (strip_return(then), strip_return(els));
    if t.is_none() && f.is_none() {
        return None;
    }
    let tail = Expr {
        kind: ExprKind::Block { stmts: rest.to_vec(), result: Box::new(result.clone()) },
        ty: result.ty.clone(),
        span: result.span,
        id: crate::ir::ExprId::fresh(),
    };
    let seq = |b: &Expr| -> Expr {
        let mut stmts = vec![Stmt::Expr(b.clone())];
        stmts.extend(rest.iter().cloned());
        Expr {
            kind: ExprKind::Block { stmts, result: Box::new(result.clone()) },
            ty: result.ty.clone(),
            span: b.span,
            id: crate::ir::ExprId::fresh(),
        }
    };
    let then2 = t.unwrap_or_else(|| seq(then));
    let els2 = match f {
        Some(f) => f,
        None if matches!(&els.kind, ExprKind::Tuple(v) if v.is_empty()) => tail,
        None => seq(els),
    };
    let ty = then2.ty.clone();
    Some(Expr {
        kind: ExprKind::If { cond: cond.clone(), then: Box::new(then2), els: Box::new(els2) },
        ty,
        span: e.span,
        id: crate::ir::ExprId::fresh(),
    })
}

/// A copy of an expression (fresh ids) with its locals and dims rewritten.
pub(super) fn remap(e: &Expr, map: &dyn Fn(Local) -> Local, s: &Subst) -> Expr {
    let mut c = e.clone();
    crate::ir::walk::remap(&mut c, map, s);
    c
}
