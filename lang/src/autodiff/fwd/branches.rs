//! `if` in the forward walk: both branches as blocks that yield their value and the new values
//! of the locals they assign, and the tape node whose backward pass recomputes the taken one.

use super::*;

impl Gen<'_> {
    pub(super) fn fwd_if(
        &mut self,
        e: &Expr,
        cond: &Expr,
        then: &Expr,
        els: &Expr,
        tape: &mut Vec<Node>,
    ) -> Res<Local> {
        let c = self.fwd(cond, tape)?;
        let assigned: Vec<Local> = {
            let mut a = assigned_locals(then);
            a.extend(assigned_locals(els));
            a.sort();
            a.dedup();
            a.into_iter().filter(|l| self.frame().env.contains_key(l)).collect()
        };
        let mut free: Vec<Local> = free_locals(then)
            .into_iter()
            .chain(free_locals(els))
            .filter_map(|l| self.frame().env.get(&l).copied())
            .collect();
        free.extend(assigned.iter().map(|l| self.frame().env[l]));
        free.sort();
        free.dedup();
        let active = free.iter().any(|v| self.is_active(*v));
        let ty = self.sty(&e.ty);
        let ctx = self.frames.clone();
        // Each branch yields its value and the new values of the assigned locals.
        let branch = |g: &mut Gen, b: &Expr| -> Res<Expr> {
            g.blocks.push(vec![]);
            let mut sub = Vec::new();
            let saved = g.frames.clone();
            let r = g.fwd(b, &mut sub)?;
            if g.frame().returned.is_some() {
                return Err(err(g.prog.span(b.span), "cannot differentiate a `return` inside `if`: assign the result to a variable and return it at the end"));
            }
            let outs: Vec<Expr> =
                std::iter::once(g.local(r)).chain(assigned.iter().map(|l| g.local(g.frame().env[l]))).collect();
            g.frames = saved;
            let stmts = g.blocks.pop().unwrap_or_default();
            let tys: Vec<Type> = outs.iter().map(|o| o.ty.clone()).collect();
            let t = Type::Tuple(tys);
            Ok(mk(ExprKind::Block { stmts, result: Box::new(mk(ExprKind::Tuple(outs), t.clone(), g.sid)) }, t, g.sid))
        };
        let te = branch(self, then)?;
        let ee = branch(self, els)?;
        let tty = te.ty.clone();
        let both = mk(
            ExprKind::If { cond: Box::new(self.local(c)), then: Box::new(te), els: Box::new(ee) },
            tty.clone(),
            e.span,
        );
        let tup = self.emit(both, tty.clone(), "if");
        let Type::Tuple(parts) = tty else { unreachable!() };
        let mut outs = Vec::new();
        for (i, t) in parts.iter().enumerate() {
            let o =
                self.emit(mk(ExprKind::TupleGet(Box::new(self.local(tup)), i), t.clone(), self.sid), t.clone(), "ifo");
            if active && is_float_type(t) {
                self.active.insert(o);
            }
            outs.push(o);
        }
        for (l, o) in assigned.iter().zip(&outs[1..]) {
            self.bind(*l, *o);
        }
        let _ = ty;
        if active {
            tape.push(Node::If {
                cond: c,
                then: Rc::new(then.clone()),
                els: Rc::new(els.clone()),
                ctx,
                assigned,
                outs: outs.clone(),
                free,
                span: e.span,
            });
        }
        Ok(outs[0])
    }
}
