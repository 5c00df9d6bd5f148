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

/// Rewrites locals and dims of a copied expression.
pub(super) fn remap(e: &Expr, map: &dyn Fn(Local) -> Local, s: &Subst) -> Expr {
    let r = |x: &Expr| remap(x, map, s);
    let rs = |xs: &[Expr]| xs.iter().map(|x| remap(x, map, s)).collect::<Vec<_>>();
    let kind = match &e.kind {
        ExprKind::Lit(l) => ExprKind::Lit(l.clone()),
        ExprKind::Local(l) => ExprKind::Local(map(*l)),
        ExprKind::Const(c) => ExprKind::Const(*c),
        ExprKind::DimValue(d) => ExprKind::DimValue(s.dim(d)),
        ExprKind::Prim { prim, args, attrs } => {
            let mut a = (**attrs).clone();
            a.shape = a.shape.iter().map(|d| s.dim(d)).collect();
            ExprKind::Prim { prim: *prim, args: rs(args), attrs: Box::new(a) }
        }
        ExprKind::Call { func, dims, rests, args } => ExprKind::Call {
            func: *func,
            dims: dims.iter().map(|d| s.dim(d)).collect(),
            rests: rests.iter().map(|r| s.shape(r)).collect(),
            args: rs(args),
        },
        ExprKind::CallValue { callee, target, args } => {
            ExprKind::CallValue { callee: Box::new(r(callee)), target: target.clone(), args: rs(args) }
        }
        ExprKind::FuncRef(f) => ExprKind::FuncRef(*f),
        ExprKind::Closure { id, captures } => {
            ExprKind::Closure { id: *id, captures: captures.iter().map(|l| map(*l)).collect() }
        }
        ExprKind::Transform { target, callee } => {
            ExprKind::Transform { target: target.clone(), callee: Box::new(r(callee)) }
        }
        ExprKind::Jvp { target, callee, primals, tangents } => ExprKind::Jvp {
            target: target.clone(),
            callee: Box::new(r(callee)),
            primals: rs(primals),
            tangents: rs(tangents),
        },
        ExprKind::Vjp { target, callee, primals } => {
            ExprKind::Vjp { target: target.clone(), callee: Box::new(r(callee)), primals: rs(primals) }
        }
        ExprKind::Tuple(xs) => ExprKind::Tuple(rs(xs)),
        ExprKind::TupleGet(a, i) => ExprKind::TupleGet(Box::new(r(a)), *i),
        ExprKind::Field(a, i) => ExprKind::Field(Box::new(r(a)), *i),
        ExprKind::ModelInit { model, args, seed } => ExprKind::ModelInit {
            model: *model,
            args: args
                .iter()
                .map(|a| match a {
                    TypeArg::Dim(d) => TypeArg::Dim(s.dim(d)),
                    TypeArg::Type(t) => TypeArg::Type(s.ty(t)),
                })
                .collect(),
            seed: Box::new(r(seed)),
        },
        ExprKind::ModelBuild { fields } => ExprKind::ModelBuild { fields: rs(fields) },
        ExprKind::Block { stmts, result } => ExprKind::Block {
            stmts: stmts
                .iter()
                .map(|st| match st {
                    Stmt::Let { pat, value } => Stmt::Let { pat: remap_pat(pat, map), value: r(value) },
                    Stmt::Assign { pat, value } => Stmt::Assign { pat: remap_pat(pat, map), value: r(value) },
                    Stmt::Expr(x) => Stmt::Expr(r(x)),
                    Stmt::BindDims { local, dims, rank, span } => {
                        Stmt::BindDims { local: map(*local), dims: dims.clone(), rank: *rank, span: *span }
                    }
                })
                .collect(),
            result: Box::new(r(result)),
        },
        ExprKind::If { cond, then, els } => {
            ExprKind::If { cond: Box::new(r(cond)), then: Box::new(r(then)), els: Box::new(r(els)) }
        }
        ExprKind::ForRange { var, start, end, body } => ExprKind::ForRange {
            var: map(*var),
            start: Box::new(r(start)),
            end: Box::new(r(end)),
            body: Box::new(r(body)),
        },
        ExprKind::ForBatches { vars, data, size, shuffle, drop_last, rows, body } => ExprKind::ForBatches {
            vars: vars.iter().map(|l| map(*l)).collect(),
            data: rs(data),
            size: Box::new(r(size)),
            shuffle: shuffle.as_ref().map(|x| Box::new(r(x))),
            drop_last: *drop_last,
            rows: *rows,
            body: Box::new(r(body)),
        },
        ExprKind::While { cond, body } => ExprKind::While { cond: Box::new(r(cond)), body: Box::new(r(body)) },
        ExprKind::Return(v) => ExprKind::Return(Box::new(r(v))),
    };
    Expr { kind, ty: s.ty(&e.ty), span: e.span, id: crate::ir::ExprId::fresh() }
}

fn remap_pat(p: &Pat, map: &dyn Fn(Local) -> Local) -> Pat {
    match p {
        Pat::Local(l) => Pat::Local(map(*l)),
        Pat::Ignore => Pat::Ignore,
        Pat::Tuple(ps) => Pat::Tuple(ps.iter().map(|p| remap_pat(p, map)).collect()),
    }
}
