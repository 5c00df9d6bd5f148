//! Loops in the forward walk: their carried state as mutable slots, one iteration as a block,
//! `while` as a counted loop, and the tape of states the backward pass reads.

use super::*;

/// One forward iteration of a loop body: the block, its operations, the state at its start and
/// the carried values at its end.
pub(super) struct Iter {
    pub block: Expr,
    pub nodes: Vec<Node>,
    pub start: Vec<Local>,
    pub end: Vec<Local>,
}

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
        let taping = self.taping(active);
        let iv = self.new_local(Type::scalar(ElemTy::I32), "i", false);
        let iter = self.loop_body(body, &carried, &slots, ivar, iv, taping)?;
        let (body_e, kept) = self.with_tape(iter, taping, iv, &slots, &init, &free);
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
                tape: self.finish(kept),
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

    /// One iteration of a loop body as a block: reads the state slots, writes them back. With
    /// `active`, the float state is differentiated through (its operations are kept in `nodes`).
    pub(super) fn loop_body(
        &mut self,
        body: &Expr,
        carried: &[Local],
        slots: &[Local],
        ivar: Option<Local>,
        iv: Local,
        active: bool,
    ) -> Res<Iter> {
        let saved = self.frames.clone();
        self.blocks.push(vec![]);
        let mut start = Vec::with_capacity(carried.len());
        for (l, s) in carried.iter().zip(slots) {
            let ty = self.ty_of(*s);
            let float = is_float_type(&ty);
            let v = self.emit(self.local(*s), ty, "st");
            if active && float {
                self.active.insert(v);
            }
            self.bind(*l, v);
            start.push(v);
        }
        if let Some(iv0) = ivar {
            self.bind(iv0, iv);
        }
        let mut nodes = Vec::new();
        self.fwd(body, &mut nodes)?;
        if self.frame().returned.is_some() {
            return Err(err(self.prog.span(body.span), "cannot differentiate a `return` inside a loop"));
        }
        let end: Vec<Local> = carried.iter().map(|l| self.frame().env[l]).collect();
        for (v, s) in end.iter().zip(slots) {
            self.push_stmt(Stmt::Assign { pat: Pat::Local(*s), value: self.local(*v) });
        }
        let stmts = self.blocks.pop().unwrap_or_default();
        self.frames = saved;
        Ok(Iter { block: self.unit_block(stmts), nodes, start, end })
    }

    /// Whether an active loop keeps a tape (not inside `@recompute`, nor in a twin).
    fn taping(&self, active: bool) -> bool {
        active && self.tape_loops && !self.frame().recompute
    }

    /// The forward loop's body with what its tape keeps pushed onto it: the iteration's
    /// residuals at its end, or else its state at its start.
    fn with_tape(
        &mut self,
        iter: Iter,
        taping: bool,
        iv: Local,
        slots: &[Local],
        init: &[Local],
        free: &[Local],
    ) -> (Expr, Option<Tape>) {
        if !taping {
            return (iter.block, None);
        }
        let Iter { mut block, nodes, start, end } = iter;
        if let Some((residuals, bound)) = self.residuals_of(&block, &nodes, &start, &end, init, free) {
            let ty = Type::Tuple(residuals.iter().map(|r| self.ty_of(*r)).collect());
            let tp = self.new_tape(ty.clone());
            let items = mk(ExprKind::Tuple(residuals.iter().map(|r| self.local(*r)).collect()), ty, self.sid);
            let push = self.tape_push(tp, items);
            if let ExprKind::Block { stmts, .. } = &mut block.kind {
                stmts.push(push);
            }
            let saved = Saved { tape: tp, nodes, start, end, iv, residuals, bound };
            return (block, Some(Tape::Residuals(Box::new(saved))));
        }
        let st = self.state_type(slots);
        let tp = self.new_tape(st.clone());
        let state = mk(ExprKind::Tuple(slots.iter().map(|s| self.local(*s)).collect()), st, self.sid);
        let push = self.tape_push(tp, state);
        (self.unit_block(vec![push, Stmt::Expr(block)]), Some(Tape::States(tp)))
    }

    /// The values of one iteration that its backward pass reads, found by generating that
    /// backward pass once and throwing it away, and every local the body binds; `None` when one
    /// of them is bound inside a nested block of the body or assigned, or the body binds dims at
    /// run time (the tape then keeps states).
    fn residuals_of(
        &mut self,
        block: &Expr,
        nodes: &[Node],
        start: &[Local],
        end: &[Local],
        init: &[Local],
        free: &[Local],
    ) -> Option<(Vec<Local>, HashSet<Local>)> {
        let ExprKind::Block { stmts: top, .. } = &block.kind else { return None };
        let top: Vec<Local> = top
            .iter()
            .filter_map(|s| match s {
                Stmt::Let { pat, .. } => Some(pat.locals()),
                _ => None,
            })
            .flatten()
            .collect();
        let mut inner = HashSet::new();
        let mut binds_dims = false;
        ir::walk::walk(block, &mut |e| match &e.kind {
            ExprKind::Block { stmts, .. } => {
                for s in stmts {
                    match s {
                        Stmt::Let { pat, .. } => inner.extend(pat.locals()),
                        Stmt::BindDims { .. } => binds_dims = true,
                        _ => {}
                    }
                }
            }
            ExprKind::ForRange { var, .. } => {
                inner.insert(*var);
            }
            _ => {}
        });
        if binds_dims {
            return None;
        }
        let free_act: Vec<Local> = free.iter().copied().filter(|v| self.is_active(*v)).collect();
        let (n_locals, active) = (self.locals.len(), self.active.clone());
        let (field_contribs, copy_parts) = (self.field_contribs.clone(), self.copy_parts.clone());
        let tainted = self.tainted.clone();
        let (frames, sid) = (self.frames.clone(), self.sid);
        self.blocks.push(vec![]);
        self.dry += 1;
        let sb: Vec<Local> = init
            .iter()
            .map(|v| {
                let ty = self.ty_of(*v);
                self.new_local(ty, "sb", true)
            })
            .collect();
        let trial = self.free_accs(&free_act).and_then(|fb| {
            let cot = bwd::Cotangents { sb: &sb, fb: &fb, free_act: &free_act };
            self.iteration_bwd(nodes, start, end, &cot)
        });
        self.dry -= 1;
        let stmts = self.blocks.pop().unwrap_or_default();
        self.locals.truncate(n_locals);
        self.active = active;
        self.field_contribs = field_contribs;
        self.copy_parts = copy_parts;
        self.tainted = tainted;
        self.frames = frames;
        self.sid = sid;
        trial.ok()?;
        let mut reads = HashSet::new();
        for s in &stmts {
            if let Stmt::Let { value, .. } | Stmt::Assign { value, .. } | Stmt::Expr(value) = s {
                ir::walk::walk(value, &mut |e| {
                    if let ExprKind::Local(l) = &e.kind {
                        reads.insert(*l);
                    }
                });
            }
        }
        let top_set: HashSet<Local> = top.iter().copied().collect();
        let nested = |l: &Local| inner.contains(l) && !top_set.contains(l);
        let assigned = |l: &Local| top_set.contains(l) && self.locals[l.0 as usize].mutable;
        if reads.iter().any(|l| nested(l) || assigned(l)) {
            return None;
        }
        Some((top.into_iter().filter(|l| reads.contains(l)).collect(), inner))
    }

    /// The type of a loop's state: the tuple of its carried slots.
    pub(super) fn state_type(&self, slots: &[Local]) -> Type {
        Type::Tuple(slots.iter().map(|s| self.ty_of(*s)).collect())
    }

    /// A tape of `item`s, empty before the loop.
    fn new_tape(&mut self, item: Type) -> Local {
        let ty = Type::List(vec![item]);
        let t = self.new_local(ty.clone(), "tape", true);
        let new = mk(ExprKind::Prim { prim: Prim::TapeNew, args: vec![], attrs: Box::default() }, ty, self.sid);
        self.push_stmt(Stmt::Let { pat: Pat::Local(t), value: new });
        t
    }

    /// `tape = tape_push(tape, item)`.
    fn tape_push(&self, tp: Local, item: Expr) -> Stmt {
        let ty = self.ty_of(tp);
        let push = mk(
            ExprKind::Prim { prim: Prim::TapePush, args: vec![self.local(tp), item], attrs: Box::default() },
            ty,
            self.sid,
        );
        Stmt::Assign { pat: Pat::Local(tp), value: push }
    }

    /// The tape as the backward pass reads it: its value after the loop.
    fn finish(&mut self, kept: Option<Tape>) -> Option<Tape> {
        let read = |g: &mut Self, tp: Local| {
            let ty = g.ty_of(tp);
            g.emit(g.local(tp), ty, "tp")
        };
        Some(match kept? {
            Tape::States(tp) => Tape::States(read(self, tp)),
            Tape::Residuals(mut s) => {
                s.tape = read(self, s.tape);
                Tape::Residuals(s)
            }
        })
    }

    pub(super) fn fwd_while(&mut self, e: &Expr, cond: &Expr, body: &Expr, tape: &mut Vec<Node>) -> Res<Local> {
        // `while` runs as a counted loop: the forward pass counts iterations, and the backward
        // pass (like a `for`) recomputes the state of each iteration from the initial state.
        let LoopState { carried, init, free, active, ctx, slots } = self.loop_state(body, None);
        let taping = self.taping(active);
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
        let iter = self.loop_body(body, &carried, &slots, None, iv, taping)?;
        let (body_e, kept) = self.with_tape(iter, taping, iv, &slots, &init, &free);
        let one = mk(ExprKind::Lit(Lit::Int(1)), i32t.clone(), self.sid);
        let inc = mk(
            ExprKind::Prim { prim: Prim::Add, args: vec![self.local(count), one], attrs: Box::default() },
            i32t.clone(),
            self.sid,
        );
        let body_e = self.unit_block(vec![Stmt::Expr(body_e), Stmt::Assign { pat: Pat::Local(count), value: inc }]);
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
                tape: self.finish(kept),
                span: e.span,
            })));
        }
        Ok(self.emit(mk(ExprKind::Tuple(vec![]), Type::unit(), self.sid), Type::unit(), "u"))
    }
}
