//! Rest shapes made concrete before sharding: a direct call of a function with `..S`
//! parameters whose rest binds to plain dims (`nn.linear` on an `f32[B, T, D]`) calls a copy of
//! the callee with `S` replaced by those dims, so that the propagation rules see every dim of its
//! values one by one (a `..S` shape is otherwise whole on every rank). Axes counted from the end
//! over a rest (`axis: -1`) become ordinary axes in the copy. Copies are made once per callee and
//! binding, and only for callees whose rest dims reach them through their parameters (the
//! interpreter binds the new dims from the arguments, as it binds any generic dim).

use crate::ir::walk::{walk, walk_mut};
use crate::ir::{ExprKind, Func, Program};
use crate::types::unify::Subst;
use crate::types::{FuncId, Shape, ShapeItem, Type};
use std::collections::HashMap;

/// At most this many copies in one program (rest functions calling each other recursively
/// with growing shapes would otherwise never stop).
const MAX_COPIES: usize = 2000;

pub(super) fn run(prog: &mut Program) {
    let mut memo: HashMap<(FuncId, String), FuncId> = HashMap::new();
    let mut i = 0;
    while i < prog.funcs.len() {
        let mut body = std::mem::replace(&mut prog.funcs[i].body, super::dummy());
        let mut new: Vec<Func> = Vec::new();
        let base = prog.funcs.len();
        walk_mut(&mut body, &mut |e| {
            let ExprKind::Call { func, rests, .. } = &mut e.kind else { return };
            if rests.is_empty() || memo.len() >= MAX_COPIES {
                return;
            }
            let key = (*func, format!("{rests:?}"));
            let id = match memo.get(&key) {
                Some(id) => *id,
                None => {
                    let Some(copy) = concrete_copy(prog.func(*func), rests) else { return };
                    let id = FuncId((base + new.len()) as u32);
                    new.push(copy);
                    memo.insert(key, id);
                    id
                }
            };
            *func = id;
            rests.clear();
        });
        prog.funcs[i].body = body;
        prog.funcs.extend(new);
        i += 1;
    }
}

/// `f` with its rests bound to `rests` (the call's bindings, in the caller's dims), or `None`
/// where that is not safe: a binding that is itself rank-polymorphic, a rest that no parameter
/// carries, caller dims that clash with the callee's own, or closures and transforms in the
/// body (their functions would keep the rest).
fn concrete_copy(f: &Func, rests: &[Shape]) -> Option<Func> {
    if rests.len() != f.rests.len() || rests.iter().flatten().any(|i| matches!(i, ShapeItem::Rest(_))) {
        return None;
    }
    let in_params = |r| {
        f.params.iter().any(|p| match &f.locals[p.0 as usize].ty {
            Type::Tensor(t) => t.shape.contains(&ShapeItem::Rest(r)),
            _ => false,
        })
    };
    if !f.rests.iter().all(|r| in_params(*r)) {
        return None;
    }
    let clash = rests.iter().flatten().any(|i| match i {
        ShapeItem::Dim(d) => d.vars().any(|v| f.dims.contains(&v)),
        ShapeItem::Rest(_) => true,
    });
    let mut opaque = false;
    walk(&f.body, &mut |e| {
        opaque |= matches!(
            e.kind,
            ExprKind::Closure { .. } | ExprKind::Transform { .. } | ExprKind::Jvp { .. } | ExprKind::Vjp { .. }
        )
    });
    if clash || opaque {
        return None;
    }
    let s = Subst { rests: f.rests.iter().copied().zip(rests.iter().cloned()).collect(), ..Subst::default() };
    let mut g = f.clone();
    g.rests.clear();
    for l in g.locals.iter_mut() {
        l.ty = s.ty(&l.ty);
    }
    g.ret = s.ty(&g.ret);
    walk_mut(&mut g.body, &mut |e| {
        e.ty = s.ty(&e.ty);
        if let ExprKind::Call { rests, .. } = &mut e.kind {
            for r in rests.iter_mut() {
                *r = s.shape(r);
            }
        }
    });
    // `axis: -k` over what was a rest is now an ordinary axis (as the interpreter counts it).
    walk_mut(&mut g.body, &mut |e| {
        let ExprKind::Prim { args, attrs, .. } = &mut e.kind else { return };
        if !attrs.from_end {
            return;
        }
        if let Some(Type::Tensor(t)) = args.first().map(|a| &a.ty) {
            if !t.shape.iter().any(|i| matches!(i, ShapeItem::Rest(_))) {
                attrs.axis = Some(t.shape.len().saturating_sub(attrs.axis.unwrap_or(1)));
                attrs.from_end = false;
            }
        }
    });
    Some(g)
}
