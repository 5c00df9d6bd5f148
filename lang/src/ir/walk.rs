//! The one traversal of the IR: every pass visits children through these functions, so a new
//! construct is taught to every pass in one place (the matches are exhaustive on purpose).

use super::{Expr, ExprKind, Local, Pat, Stmt};
use crate::types::unify::Subst;
use crate::types::TypeArg;

/// Calls `f` on each direct subexpression of `e`, in evaluation order (statements' values
/// included; a closure's body is another function and is not a child).
pub fn children<'e>(e: &'e Expr, f: &mut dyn FnMut(&'e Expr)) {
    match &e.kind {
        ExprKind::Lit(_)
        | ExprKind::Local(_)
        | ExprKind::Const(_)
        | ExprKind::DimValue(_)
        | ExprKind::FuncRef(_)
        | ExprKind::Closure { .. } => {}
        ExprKind::Prim { args, .. } | ExprKind::Call { args, .. } | ExprKind::Tuple(args) => args.iter().for_each(f),
        ExprKind::ModelBuild { fields } => fields.iter().for_each(f),
        ExprKind::CallValue { callee, args, .. } => {
            f(callee);
            args.iter().for_each(f);
        }
        ExprKind::Transform { callee, .. } => f(callee),
        ExprKind::Jvp { callee, primals, tangents, .. } => {
            f(callee);
            primals.iter().chain(tangents).for_each(f);
        }
        ExprKind::Vjp { callee, primals, .. } => {
            f(callee);
            primals.iter().for_each(f);
        }
        ExprKind::TupleGet(a, _) | ExprKind::Field(a, _) | ExprKind::Return(a) => f(a),
        ExprKind::ModelInit { seed, .. } => f(seed),
        ExprKind::Block { stmts, result } => {
            for s in stmts {
                match s {
                    Stmt::Let { value, .. } | Stmt::Assign { value, .. } | Stmt::Expr(value) => f(value),
                    Stmt::BindDims { .. } => {}
                }
            }
            f(result);
        }
        ExprKind::If { cond, then, els } => {
            f(cond);
            f(then);
            f(els);
        }
        ExprKind::ForRange { start, end, body, .. } => {
            f(start);
            f(end);
            f(body);
        }
        ExprKind::ForBatches { data, size, shuffle, body, .. } => {
            data.iter().for_each(&mut *f);
            f(size);
            if let Some(s) = shuffle {
                f(s);
            }
            f(body);
        }
        ExprKind::While { cond, body } => {
            f(cond);
            f(body);
        }
    }
}

/// [`children`] with mutable access.
pub fn children_mut(e: &mut Expr, f: &mut dyn FnMut(&mut Expr)) {
    match &mut e.kind {
        ExprKind::Lit(_)
        | ExprKind::Local(_)
        | ExprKind::Const(_)
        | ExprKind::DimValue(_)
        | ExprKind::FuncRef(_)
        | ExprKind::Closure { .. } => {}
        ExprKind::Prim { args, .. } | ExprKind::Call { args, .. } | ExprKind::Tuple(args) => {
            args.iter_mut().for_each(f)
        }
        ExprKind::ModelBuild { fields } => fields.iter_mut().for_each(f),
        ExprKind::CallValue { callee, args, .. } => {
            f(callee);
            args.iter_mut().for_each(f);
        }
        ExprKind::Transform { callee, .. } => f(callee),
        ExprKind::Jvp { callee, primals, tangents, .. } => {
            f(callee);
            primals.iter_mut().chain(tangents.iter_mut()).for_each(f);
        }
        ExprKind::Vjp { callee, primals, .. } => {
            f(callee);
            primals.iter_mut().for_each(f);
        }
        ExprKind::TupleGet(a, _) | ExprKind::Field(a, _) | ExprKind::Return(a) => f(a),
        ExprKind::ModelInit { seed, .. } => f(seed),
        ExprKind::Block { stmts, result } => {
            for s in stmts {
                match s {
                    Stmt::Let { value, .. } | Stmt::Assign { value, .. } | Stmt::Expr(value) => f(value),
                    Stmt::BindDims { .. } => {}
                }
            }
            f(result);
        }
        ExprKind::If { cond, then, els } => {
            f(cond);
            f(then);
            f(els);
        }
        ExprKind::ForRange { start, end, body, .. } => {
            f(start);
            f(end);
            f(body);
        }
        ExprKind::ForBatches { data, size, shuffle, body, .. } => {
            data.iter_mut().for_each(&mut *f);
            f(size);
            if let Some(s) = shuffle {
                f(s);
            }
            f(body);
        }
        ExprKind::While { cond, body } => {
            f(cond);
            f(body);
        }
    }
}

/// Calls `f` on every expression of a tree, parents first.
pub fn walk<'e>(e: &'e Expr, f: &mut dyn FnMut(&'e Expr)) {
    f(e);
    children(e, &mut |c| walk(c, f));
}

/// Calls `f` on every expression of a tree, parents first, with mutable access (`f` may
/// rewrite a node; the walk then visits the new node's children).
pub fn walk_mut(e: &mut Expr, f: &mut dyn FnMut(&mut Expr)) {
    f(e);
    children_mut(e, &mut |c| walk_mut(c, f));
}

/// Replaces every read of a local that `map` names by its image (definitions and assignment
/// targets are left alone).
pub fn rename_locals(e: &mut Expr, map: &std::collections::HashMap<Local, Local>) {
    if map.is_empty() {
        return;
    }
    walk_mut(e, &mut |x| {
        if let ExprKind::Local(l) = &mut x.kind {
            if let Some(n) = map.get(l) {
                *l = *n;
            }
        }
    });
}

/// Renames every local `e` binds or reads by `map` and substitutes its dims by `sub`: a body
/// copied into another function (an inlined callee, a copy of `@copies`).
pub fn remap(e: &mut Expr, map: &dyn Fn(Local) -> Local, sub: &Subst) {
    walk_mut(e, &mut |x| {
        x.ty = sub.ty(&x.ty);
        match &mut x.kind {
            ExprKind::Local(l) => *l = map(*l),
            ExprKind::DimValue(d) => *d = sub.dim(d),
            ExprKind::Prim { attrs, .. } => attrs.shape.iter_mut().for_each(|d| *d = sub.dim(d)),
            ExprKind::Call { dims, rests, .. } => {
                dims.iter_mut().for_each(|d| *d = sub.dim(d));
                rests.iter_mut().for_each(|r| *r = sub.shape(r));
            }
            ExprKind::Closure { captures, .. } => captures.iter_mut().for_each(|l| *l = map(*l)),
            ExprKind::ModelInit { args, .. } => {
                for a in args.iter_mut() {
                    match a {
                        TypeArg::Dim(d) => *d = sub.dim(d),
                        TypeArg::Type(t) => *t = sub.ty(t),
                    }
                }
            }
            ExprKind::ForRange { var, .. } => *var = map(*var),
            ExprKind::ForBatches { vars, .. } => vars.iter_mut().for_each(|l| *l = map(*l)),
            ExprKind::Block { stmts, .. } => stmts.iter_mut().for_each(|s| remap_bindings(s, map)),
            _ => {}
        }
    });
}

/// [`remap`] of a statement.
pub fn remap_stmt(s: &mut Stmt, map: &dyn Fn(Local) -> Local, sub: &Subst) {
    remap_bindings(s, map);
    if let Stmt::Let { value, .. } | Stmt::Assign { value, .. } | Stmt::Expr(value) = s {
        remap(value, map, sub);
    }
}

/// The locals a statement binds (or whose dims it binds), renamed.
fn remap_bindings(s: &mut Stmt, map: &dyn Fn(Local) -> Local) {
    fn pat(p: &mut Pat, map: &dyn Fn(Local) -> Local) {
        match p {
            Pat::Local(l) => *l = map(*l),
            Pat::Ignore => {}
            Pat::Tuple(ps) => ps.iter_mut().for_each(|p| pat(p, map)),
        }
    }
    match s {
        Stmt::Let { pat: p, .. } | Stmt::Assign { pat: p, .. } => pat(p, map),
        Stmt::BindDims { local, .. } => *local = map(*local),
        Stmt::Expr(_) => {}
    }
}
