//! The one traversal of the IR: every pass visits children through these functions, so a new
//! construct is taught to every pass in one place (the matches are exhaustive on purpose).

use super::{Expr, ExprKind, Local, Stmt};

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
