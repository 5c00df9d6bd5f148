//! Loops in the forward walk: their carried state as mutable slots, one iteration as a block,
//! `while` as a counted loop, and the tape of states the backward pass reads.

use super::*;

impl Gen<'_> {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn fwd_loop(
        &mut self,
        e: &Expr,
        start: Option<Local>,
        end: Local,
        ivar: Option<Local>,
        _cond: Option<&Expr>,
        body: &Expr,
        tape: &mut Vec<Node>,
    ) -> Res<Local> {
        let LoopState { carried, init, free, active, ctx, slots } = self.loop_state(body, ivar);
        let tp = self.new_tape(active, &slots);
        let iv = self.new_local(Type::scalar(ElemTy::I32), "i", false);
        let body_e = self.loop_body(body, &carried, &slots, ivar, iv)?;
        let body_e = self.push_state(tp, &slots, body_e);
        let loop_e = match start {
            Some(s) => mk(
                ExprKind::ForRange {
                    var: iv,
                    start: Box::new(self.local(s)),
                    end: Box::new(self.local(end)),
                    body: Box::new(body_e),
                },
                Type::unit(),
                e.span,
            ),
            None => unreachable!(),
        };
        self.push_stmt(Stmt::Expr(loop_e));
        let mut outs = Vec::new();
        for (l, s) in carried.iter().zip(&slots) {
            let ty = self.ty_of(*s);
            let o = self.emit(self.local(*s), ty.clone(), "out");
            if active && is_float_type(&ty) {
                self.active.insert(o);
            }
            self.bind(*l, o);
            outs.push(o);
        }
        if active {
            tape.push(Node::Loop(Box::new(LoopNode {
                start,
                end,
                ivar,
                body: Rc::new(body.clone()),
                ctx,
                carried,
                init,
                outs,
                free,
                tape: self.tape_value(tp),
                span: e.span,
            })));
        }
        Ok(self.emit(mk(ExprKind::Tuple(vec![]), Type::unit(), self.sid), Type::unit(), "u"))
    }

    /// What a loop carries: the outer locals its body assigns (their values before the loop and
    /// mutable slots initialised with them), the outer values it reads, and whether any is active.
    pub(super) fn loop_state(&mut self, body: &Expr, ivar: Option<Local>) -> LoopState {
        let carried: Vec<Local> =
            assigned_locals(body).into_iter().filter(|l| self.frame().env.contains_key(l)).collect();
        let init: Vec<Local> = carried.iter().map(|l| self.frame().env[l]).collect();
        let free: Vec<Local> = free_locals(body)
            .into_iter()
            .filter(|l| !carried.contains(l) && Some(*l) != ivar)
            .filter_map(|l| self.frame().env.get(&l).copied())
            .collect();
        let active = init.iter().chain(&free).any(|v| self.is_active(*v));
        let ctx = self.frames.clone();
        let slots = init
            .iter()
            .map(|v| {
                let ty = self.ty_of(*v);
                let s = self.new_local(ty, "s", true);
                self.push_stmt(Stmt::Let { pat: Pat::Local(s), value: self.local(*v) });
                s
            })
            .collect();
        LoopState { carried, init, free, active, ctx, slots }
    }

    /// One iteration of a loop body as a block: reads the state slots, writes them back.
    pub(super) fn loop_body(
        &mut self,
        body: &Expr,
        carried: &[Local],
        slots: &[Local],
        ivar: Option<Local>,
        iv: Local,
    ) -> Res<Expr> {
        let saved = self.frames.clone();
        self.blocks.push(vec![]);
        for (l, s) in carried.iter().zip(slots) {
            let ty = self.ty_of(*s);
            let v = self.emit(self.local(*s), ty, "st");
            self.bind(*l, v);
        }
        if let Some(iv0) = ivar {
            self.bind(iv0, iv);
        }
        let mut throwaway = Vec::new();
        self.fwd(body, &mut throwaway)?;
        if self.frame().returned.is_some() {
            return Err(err(self.prog.span(body.span), "cannot differentiate a `return` inside a loop"));
        }
        for (l, s) in carried.iter().zip(slots) {
            let v = self.frame().env[l];
            self.push_stmt(Stmt::Assign { pat: Pat::Local(*s), value: self.local(v) });
        }
        let stmts = self.blocks.pop().unwrap_or_default();
        self.frames = saved;
        Ok(mk(
            ExprKind::Block { stmts, result: Box::new(mk(ExprKind::Tuple(vec![]), Type::unit(), self.sid)) },
            Type::unit(),
            self.sid,
        ))
    }

    /// The type of a loop's state: the tuple of its carried slots.
    pub(super) fn state_type(&self, slots: &[Local]) -> Type {
        Type::Tuple(slots.iter().map(|s| self.ty_of(*s)).collect())
    }

    /// A tape slot for an active loop's states (`None` when the backward recomputes them).
    pub(super) fn new_tape(&mut self, active: bool, slots: &[Local]) -> Option<Local> {
        if !active || !self.tape_loops || self.frame().recompute {
            return None;
        }
        let ty = Type::List(vec![self.state_type(slots)]);
        let t = self.new_local(ty.clone(), "tape", true);
        let new = mk(ExprKind::Prim { prim: Prim::TapeNew, args: vec![], attrs: Box::default() }, ty, self.sid);
        self.push_stmt(Stmt::Let { pat: Pat::Local(t), value: new });
        Some(t)
    }

    /// `tape = tape_push(tape, (slots…)); body`: the state at the start of the iteration is kept.
    pub(super) fn push_state(&mut self, tp: Option<Local>, slots: &[Local], body: Expr) -> Expr {
        let Some(tp) = tp else { return body };
        let st = self.state_type(slots);
        let state = mk(ExprKind::Tuple(slots.iter().map(|s| self.local(*s)).collect()), st, self.sid);
        let ty = self.ty_of(tp);
        let push = mk(
            ExprKind::Prim { prim: Prim::TapePush, args: vec![self.local(tp), state], attrs: Box::default() },
            ty,
            self.sid,
        );
        mk(
            ExprKind::Block {
                stmts: vec![Stmt::Assign { pat: Pat::Local(tp), value: push }, Stmt::Expr(body)],
                result: Box::new(mk(ExprKind::Tuple(vec![]), Type::unit(), self.sid)),
            },
            Type::unit(),
            self.sid,
        )
    }

    /// The tape's value after the loop (read by the backward pass).
    pub(super) fn tape_value(&mut self, tp: Option<Local>) -> Option<Local> {
        let tp = tp?;
        let ty = self.ty_of(tp);
        Some(self.emit(self.local(tp), ty, "tp"))
    }

    pub(super) fn fwd_while(&mut self, e: &Expr, cond: &Expr, body: &Expr, tape: &mut Vec<Node>) -> Res<Local> {
        // `while` runs as a counted loop: the forward pass counts iterations, and the backward
        // pass (like a `for`) recomputes the state of each iteration from the initial state.
        let LoopState { carried, init, free, active, ctx, slots } = self.loop_state(body, None);
        let tp = self.new_tape(active, &slots);
        let i32t = Type::scalar(ElemTy::I32);
        let count = self.new_local(i32t.clone(), "n", true);
        self.push_stmt(Stmt::Let {
            pat: Pat::Local(count),
            value: mk(ExprKind::Lit(Lit::Int(0)), i32t.clone(), self.sid),
        });
        // Condition block over the slots.
        let saved = self.frames.clone();
        self.blocks.push(vec![]);
        for (l, s) in carried.iter().zip(&slots) {
            let ty = self.ty_of(*s);
            let v = self.emit(self.local(*s), ty, "st");
            self.bind(*l, v);
        }
        let mut throwaway = Vec::new();
        let c = self.fwd(cond, &mut throwaway)?;
        let cstmts = self.blocks.pop().unwrap_or_default();
        self.frames = saved;
        let cexpr = mk(
            ExprKind::Block { stmts: cstmts, result: Box::new(self.local(c)) },
            Type::scalar(ElemTy::Bool),
            self.sid,
        );
        let iv = self.new_local(i32t.clone(), "i", false);
        let body_e = self.loop_body(body, &carried, &slots, None, iv)?;
        let body_e = self.push_state(tp, &slots, body_e);
        let one = mk(ExprKind::Lit(Lit::Int(1)), i32t.clone(), self.sid);
        let inc = mk(
            ExprKind::Prim { prim: Prim::Add, args: vec![self.local(count), one], attrs: Box::default() },
            i32t.clone(),
            self.sid,
        );
        let body_e = mk(
            ExprKind::Block {
                stmts: vec![Stmt::Expr(body_e), Stmt::Assign { pat: Pat::Local(count), value: inc }],
                result: Box::new(mk(ExprKind::Tuple(vec![]), Type::unit(), self.sid)),
            },
            Type::unit(),
            self.sid,
        );
        self.push_stmt(Stmt::Expr(mk(
            ExprKind::While { cond: Box::new(cexpr), body: Box::new(body_e) },
            Type::unit(),
            e.span,
        )));
        let n = self.emit(self.local(count), i32t, "cnt");
        let mut outs = Vec::new();
        for (l, s) in carried.iter().zip(&slots) {
            let ty = self.ty_of(*s);
            let o = self.emit(self.local(*s), ty.clone(), "out");
            if active && is_float_type(&ty) {
                self.active.insert(o);
            }
            self.bind(*l, o);
            outs.push(o);
        }
        if active {
            tape.push(Node::Loop(Box::new(LoopNode {
                start: None,
                end: n,
                ivar: None,
                body: Rc::new(body.clone()),
                ctx,
                carried,
                init,
                outs,
                free,
                tape: self.tape_value(tp),
                span: e.span,
            })));
        }
        Ok(self.emit(mk(ExprKind::Tuple(vec![]), Type::unit(), self.sid), Type::unit(), "u"))
    }
}
