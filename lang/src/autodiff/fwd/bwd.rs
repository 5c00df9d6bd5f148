//! The backward sweep of reverse mode: cotangent sums, zeros of any type, and the backward
//! of operations, `if`s (recomputing the taken branch) and loops (each iteration's state read
//! from the loop's tape, or recomputed from the state before the loop under `@recompute`).

use super::*;
use crate::types::TensorTy;

/// A loop's backward pass's mutable slots: the carried state's cotangents (`sb`) and the
/// accumulated cotangents (`fb`) of its active free values (`free_act`).
#[derive(Clone, Copy)]
pub(super) struct Cotangents<'a> {
    pub sb: &'a [Local],
    pub fb: &'a [Acc],
    pub free_act: &'a [Local],
}

/// The accumulated cotangent of a loop's free value: one slot, or one per tensor leaf.
pub(super) enum Acc {
    Whole(Local),
    Leaves(Vec<(Vec<usize>, Local)>),
}

impl Gen<'_> {
    /// The sum of the contributions to `v`, or zeros of its type.
    pub(in crate::autodiff) fn total(&mut self, v: Local, contribs: &mut HashMap<Local, Vec<Local>>) -> Res<Local> {
        match self.take(v, contribs)? {
            Some(cs) if !cs.is_empty() => Ok(self.sum(&cs)),
            _ => self.zeros_like(v),
        }
    }

    pub(in crate::autodiff) fn has(&self, v: &Local, contribs: &HashMap<Local, Vec<Local>>) -> bool {
        contribs.contains_key(v) || self.field_contribs.contains_key(v)
    }

    /// All cotangent contributions to `v`, with per-field ones merged into one model value.
    pub(in crate::autodiff) fn take(
        &mut self,
        v: Local,
        contribs: &mut HashMap<Local, Vec<Local>>,
    ) -> Res<Option<Vec<Local>>> {
        let mut cs = contribs.remove(&v);
        if let Some(fields) = self.field_contribs.remove(&v) {
            let ty = self.ty_of(v);
            let Type::Model(id, args) = ty.clone() else { return Ok(cs) };
            let n = self.prog.model(id).fields.len();
            let mut items = Vec::new();
            for i in 0..n {
                match fields.get(&i) {
                    Some(fc) if !fc.is_empty() => items.push(self.sum(fc)),
                    _ => {
                        let ft = self.field_type(id, &args, i);
                        let fv = self.emit(
                            mk(ExprKind::Field(Box::new(self.local(v)), i), ft.clone(), self.sid),
                            ft.clone(),
                            "zf",
                        );
                        items.push(self.zeros_of(&ft, fv)?);
                    }
                }
            }
            let m = self.emit(
                mk(
                    ExprKind::ModelBuild { fields: items.iter().map(|x| self.local(*x)).collect() },
                    ty.clone(),
                    self.sid,
                ),
                ty,
                "gm",
            );
            cs.get_or_insert_with(Vec::new).push(m);
        }
        Ok(cs)
    }

    /// Starts the backward of a nested region (a loop body, an `if` branch, a `@recompute`
    /// body): the per-field cotangents gathered outside it are set aside, so that the region's
    /// cotangents of a free model (`take`) hold only what the region contributes; a loop body
    /// runs once per iteration, and an outside contribution taken there would count each time.
    pub(in crate::autodiff) fn enter_scope(&mut self) -> FieldContribs {
        std::mem::take(&mut self.field_contribs)
    }

    /// Ends a region begun with `enter_scope`: the outside cotangents come back, with whatever
    /// the region left (nothing, when every free value was taken).
    pub(in crate::autodiff) fn leave_scope(&mut self, outer: FieldContribs) {
        let inner = std::mem::replace(&mut self.field_contribs, outer);
        for (v, fields) in inner {
            let slot = self.field_contribs.entry(v).or_default();
            for (i, cs) in fields {
                slot.entry(i).or_default().extend(cs);
            }
        }
    }

    pub(in crate::autodiff) fn sum(&mut self, cs: &[Local]) -> Local {
        if !self.copy_parts.is_empty() && cs.iter().any(|c| self.copy_parts.contains_key(c)) {
            return self.join_copies(cs);
        }
        let mut acc = cs[0];
        for c in &cs[1..] {
            let ty = self.ty_of(acc);
            acc = self.p(Prim::Add, &[acc, *c], Attrs::default(), ty);
        }
        acc
    }

    /// The sum of contributions among which are copies' cotangents (`copy_parts`): the copies
    /// joined once, a missing copy as zeros, then the other contributions added.
    fn join_copies(&mut self, cs: &[Local]) -> Local {
        let (parts, mut rest): (Vec<Local>, Vec<Local>) = cs.iter().partition(|c| self.copy_parts.contains_key(c));
        let (_, n, axis, whole) = self.copy_parts[&parts[0]].clone();
        let mut slots: Vec<Vec<Local>> = vec![Vec::new(); n];
        for p in &parts {
            slots[self.copy_parts[p].0.min(n - 1)].push(*p);
        }
        let mut zero = None;
        let mut args = Vec::with_capacity(n);
        for slot in slots {
            if slot.is_empty() {
                let z = match zero {
                    Some(z) => z,
                    None => {
                        let ty = self.ty_of(parts[0]);
                        let z = self.zeros_of(&ty, parts[0]).unwrap_or(parts[0]);
                        *zero.insert(z)
                    }
                };
                args.push(z);
            } else {
                let s = slot[1..].iter().fold(slot[0], |acc, c| {
                    let ty = self.ty_of(acc);
                    self.p(Prim::Add, &[acc, *c], Attrs::default(), ty)
                });
                args.push(s);
            }
        }
        let j = self.p(Prim::CopyJoin, &args, Attrs { axis, ..Attrs::default() }, whole);
        rest.push(j);
        self.sum(&rest)
    }

    /// Zeros of the type of `v` (a tensor, a model or a tuple).
    pub(in crate::autodiff) fn zeros_like(&mut self, v: Local) -> Res<Local> {
        let ty = self.ty_of(v);
        self.zeros_of(&ty, v)
    }

    pub(in crate::autodiff) fn zeros_of(&mut self, ty: &Type, v: Local) -> Res<Local> {
        match ty {
            Type::Tensor(TensorTy { elem: e, shape: s, .. }) => {
                let dims: Option<Vec<Dim>> = s
                    .iter()
                    .map(|i| match i {
                        ShapeItem::Dim(d) => Some(d.clone()),
                        ShapeItem::Rest(_) => None,
                    })
                    .collect();
                let et = e.materialise();
                match dims {
                    Some(d) => Ok(self.p(
                        Prim::Zeros,
                        &[],
                        Attrs { shape: d, dtype: Some(et), ..Attrs::default() },
                        ty.clone(),
                    )),
                    None => {
                        // The shape is known only at run time, so the zeros take `v`'s: a select
                        // of 0 by a condition of that shape is 0 everywhere (`v * 0` would be NaN
                        // where `v` is ±inf or NaN, and poison a `mean`'s gradient).
                        let z = self.lit(0.0, et);
                        let bt = Type::tensor_of(Elem::T(ElemTy::Bool), s.clone());
                        let c = self.p(Prim::Eq, &[v, v], Attrs::default(), bt);
                        Ok(self.p(Prim::Where, &[c, z, z], Attrs::default(), ty.clone()))
                    }
                }
            }
            Type::Model(id, args) => {
                let def = self.prog.model(*id);
                let mut fields = Vec::new();
                for (i, _) in def.fields.iter().enumerate() {
                    let fty = self.field_type(*id, args, i);
                    let fv = self.emit(
                        mk(ExprKind::Field(Box::new(self.local(v)), i), fty.clone(), self.sid),
                        fty.clone(),
                        "zf",
                    );
                    fields.push(self.zeros_of(&fty, fv)?);
                }
                Ok(self.emit(
                    mk(
                        ExprKind::ModelBuild { fields: fields.iter().map(|f| self.local(*f)).collect() },
                        ty.clone(),
                        self.sid,
                    ),
                    ty.clone(),
                    "zm",
                ))
            }
            Type::Tuple(ts) => {
                let mut items = Vec::new();
                for (i, t) in ts.iter().enumerate() {
                    let tv = self.emit(
                        mk(ExprKind::TupleGet(Box::new(self.local(v)), i), t.clone(), self.sid),
                        t.clone(),
                        "zt",
                    );
                    items.push(self.zeros_of(t, tv)?);
                }
                Ok(self.emit(
                    mk(ExprKind::Tuple(items.iter().map(|f| self.local(*f)).collect()), ty.clone(), self.sid),
                    ty.clone(),
                    "ztup",
                ))
            }
            _ => {
                let z = self.lit(0.0, ElemTy::F32);
                Ok(self.p(Prim::Mul, &[v, z], Attrs::default(), ty.clone()))
            }
        }
    }

    /// The type of field `i` of a model type, with its arguments substituted.
    pub(in crate::autodiff) fn field_type(&self, id: crate::types::ModelId, args: &[TypeArg], i: usize) -> Type {
        let def = self.prog.model(id);
        def.arg_subst(args).ty(&def.fields[i].ty)
    }

    pub(in crate::autodiff) fn bwd(&mut self, tape: &[Node], contribs: &mut HashMap<Local, Vec<Local>>) -> Res<()> {
        for node in tape.iter().rev() {
            match node {
                Node::Op { out, op, args, span } => {
                    let Some(cs) = self.take(*out, contribs)? else { continue };
                    if cs.is_empty() {
                        continue;
                    }
                    let g = self.sum(&cs);
                    self.sid = *span;
                    if let (Op::Field(i), Type::Model(..)) = (op, self.ty_of(args[0])) {
                        if self.is_active(args[0]) {
                            self.field_contribs.entry(args[0]).or_default().entry(*i).or_default().push(g);
                        }
                        continue;
                    }
                    let parts = rules::vjp(self, op, args, *out, g)?;
                    for (i, c) in parts {
                        if self.is_active(args[i]) {
                            contribs.entry(args[i]).or_default().push(c);
                        }
                    }
                }
                Node::If { cond, then, els, ctx, assigned, outs, free, span } => {
                    if !outs.iter().any(|o| self.has(o, contribs)) {
                        continue;
                    }
                    self.sid = *span;
                    let mut seeds = Vec::new();
                    for o in outs {
                        let active = self.is_active(*o);
                        seeds.push(if active { Some(self.total(*o, contribs)?) } else { None });
                    }
                    let free_act: Vec<Local> = free.iter().copied().filter(|v| self.is_active(*v)).collect();
                    let te = self.if_branch_bwd(then, ctx, assigned, &seeds, &free_act)?;
                    let ee = self.if_branch_bwd(els, ctx, assigned, &seeds, &free_act)?;
                    let tty = te.ty.clone();
                    let both = mk(
                        ExprKind::If { cond: Box::new(self.local(*cond)), then: Box::new(te), els: Box::new(ee) },
                        tty.clone(),
                        *span,
                    );
                    let tup = self.emit(both, tty.clone(), "bif");
                    let Type::Tuple(parts) = tty else { unreachable!() };
                    for (i, (v, t)) in free_act.iter().zip(parts).enumerate() {
                        let b = self.emit(
                            mk(ExprKind::TupleGet(Box::new(self.local(tup)), i), t.clone(), self.sid),
                            t,
                            "bfr",
                        );
                        contribs.entry(*v).or_default().push(b);
                    }
                }
                Node::Loop(l) => self.loop_bwd(l, contribs)?,
                Node::Recompute { body, ctx, out, free, span } => {
                    if !self.has(out, contribs) {
                        continue;
                    }
                    self.sid = *span;
                    let seed = self.total(*out, contribs)?;
                    // The body runs again on copies of its free values that are assigned (`var`
                    // copies): common-subexpression elimination never shares a value that reads
                    // an assigned local, so the recomputation is not merged back into the
                    // forward values it exists to drop (at any level, `-O2` included).
                    let mut ctx = ctx.clone();
                    let mut copies = Vec::with_capacity(free.len());
                    for v in free {
                        let ty = self.ty_of(*v);
                        let c = self.new_local(ty, "rcv", true);
                        self.push_stmt(Stmt::Let { pat: Pat::Local(c), value: self.local(*v) });
                        self.push_stmt(Stmt::Assign { pat: Pat::Local(c), value: self.local(*v) });
                        if self.is_active(*v) {
                            self.active.insert(c);
                        }
                        if let Some(fr) = ctx.last_mut() {
                            fr.env.values_mut().filter(|x| **x == *v).for_each(|x| *x = c);
                        }
                        copies.push((*v, c));
                    }
                    let (free_act, copy_act): (Vec<Local>, Vec<Local>) =
                        copies.iter().copied().filter(|(v, _)| self.is_active(*v)).unzip();
                    let block = self.if_branch_bwd(body, &ctx, &[], &[Some(seed)], &copy_act)?;
                    let ty = block.ty.clone();
                    let tup = self.emit(block, ty.clone(), "rc");
                    let Type::Tuple(parts) = ty else { unreachable!() };
                    for (i, (v, t)) in free_act.iter().zip(parts).enumerate() {
                        let b = self.emit(
                            mk(ExprKind::TupleGet(Box::new(self.local(tup)), i), t.clone(), self.sid),
                            t,
                            "rcf",
                        );
                        contribs.entry(*v).or_default().push(b);
                    }
                }
                Node::Custom { out, args, bwd, dims, rests, span } => {
                    let Some(cs) = self.take(*out, contribs)? else { continue };
                    if cs.is_empty() {
                        continue;
                    }
                    self.sid = *span;
                    let g = self.sum(&cs);
                    let bf = self.prog.func(*bwd);
                    let mut s = Subst::default();
                    for (sym, d) in bf.dims.iter().zip(dims) {
                        s.dims.insert(*sym, d.clone());
                    }
                    for (r, sh) in bf.rests.iter().zip(rests) {
                        s.rests.insert(*r, sh.clone());
                    }
                    let rty = s.ty(&bf.ret);
                    let mut a: Vec<Expr> = args.iter().map(|v| self.local(*v)).collect();
                    a.push(self.local(*out));
                    a.push(self.local(g));
                    let call = mk(
                        ExprKind::Call { func: *bwd, dims: dims.clone(), rests: rests.clone(), args: a },
                        rty.clone(),
                        *span,
                    );
                    let r = self.emit(call, rty.clone(), "cv");
                    for (i, arg) in args.iter().enumerate() {
                        if !self.is_active(*arg) {
                            continue;
                        }
                        let c = if args.len() == 1 {
                            r
                        } else {
                            let Type::Tuple(parts) = &rty else { continue };
                            let t = parts[i].clone();
                            self.emit(mk(ExprKind::TupleGet(Box::new(self.local(r)), i), t.clone(), self.sid), t, "cvi")
                        };
                        contribs.entry(*arg).or_default().push(c);
                    }
                }
            }
        }
        Ok(())
    }

    /// Backward of one `if` branch, or of a `@recompute` function's body: recompute its forward
    /// values, then run its backward.
    pub(in crate::autodiff) fn if_branch_bwd(
        &mut self,
        b: &Expr,
        ctx: &[FrameCx],
        assigned: &[Local],
        seeds: &[Option<Local>],
        free: &[Local],
    ) -> Res<Expr> {
        let saved = std::mem::replace(&mut self.frames, ctx.to_vec());
        self.blocks.push(vec![]);
        let mut sub = Vec::new();
        let r = self.fwd(b, &mut sub)?;
        // A function body (`@recompute`) may end in `return` (an `if` branch may not).
        let r = self.frame().returned.unwrap_or(r);
        let mut local: HashMap<Local, Vec<Local>> = HashMap::new();
        let results: Vec<Local> = std::iter::once(r).chain(assigned.iter().map(|l| self.frame().env[l])).collect();
        for (res, seed) in results.iter().zip(seeds) {
            if let Some(s) = seed {
                if self.is_active(*res) {
                    local.entry(*res).or_default().push(*s);
                }
            }
        }
        let outer = self.enter_scope();
        self.bwd(&sub, &mut local)?;
        let mut outs = Vec::new();
        for v in free {
            let t = self.total(*v, &mut local)?;
            outs.push(self.local(t));
        }
        self.leave_scope(outer);
        let stmts = self.blocks.pop().unwrap_or_default();
        self.frames = saved;
        let t = Type::Tuple(outs.iter().map(|o| o.ty.clone()).collect());
        Ok(mk(ExprKind::Block { stmts, result: Box::new(mk(ExprKind::Tuple(outs), t.clone(), self.sid)) }, t, self.sid))
    }

    /// Backward of a loop: for each iteration, last first, the iteration's backward pass, on
    /// its residuals read from the tape, or on its state (read from the tape, or recomputed
    /// from the state before the loop) run forward again.
    pub(in crate::autodiff) fn loop_bwd(&mut self, l: &LoopNode, contribs: &mut HashMap<Local, Vec<Local>>) -> Res<()> {
        if !l.outs.iter().any(|o| self.has(o, contribs)) {
            return Ok(());
        }
        if self.dry > 0 {
            self.mark_loop_reads(l, contribs);
            return Ok(());
        }
        self.sid = l.span;
        let i32t = Type::scalar(ElemTy::I32);
        // Carried cotangents and accumulated cotangents of free values, as mutable slots.
        let mut sb = Vec::new();
        for (o, init) in l.outs.iter().zip(&l.init) {
            let v = if self.is_active(*o) { self.total(*o, contribs)? } else { self.zeros_like(*init)? };
            // The slot has the state's own type, layout included, so that a sharded state's
            // cotangent stays sharded across iterations (rather than being gathered each time).
            let ty = match (self.ty_of(v), self.ty_of(*init)) {
                (Type::Tensor(c), Type::Tensor(p)) if c.shape == p.shape && c.elem == p.elem => Type::Tensor(p),
                (t, _) => t,
            };
            let s = self.new_local(ty, "sb", true);
            self.push_stmt(Stmt::Let { pat: Pat::Local(s), value: self.local(v) });
            sb.push(s);
        }
        let free_act: Vec<Local> = l.free.iter().copied().filter(|v| self.is_active(*v)).collect();
        let fb = self.free_accs(&free_act)?;
        let start = match l.start {
            Some(s) => s,
            None => self.emit(mk(ExprKind::Lit(Lit::Int(0)), i32t.clone(), self.sid), i32t.clone(), "z"),
        };
        let n = self.p(Prim::Sub, &[l.end, start], Attrs::default(), i32t.clone());
        let zero = self.emit(mk(ExprKind::Lit(Lit::Int(0)), i32t.clone(), self.sid), i32t.clone(), "z");
        let r = self.new_local(i32t.clone(), "r", false);

        // The body of the reverse loop.
        self.blocks.push(vec![]);
        let one = self.emit(mk(ExprKind::Lit(Lit::Int(1)), i32t.clone(), self.sid), i32t.clone(), "one");
        let last = self.p(Prim::Sub, &[l.end, one], Attrs::default(), i32t.clone());
        let it = self.p(Prim::Sub, &[last, r], Attrs::default(), i32t.clone());
        let saved = std::mem::replace(&mut self.frames, l.ctx.clone());
        let cot = Cotangents { sb: &sb, fb: &fb, free_act: &free_act };
        match &l.tape {
            Some(Tape::Residuals(k)) => self.iteration_from_residuals(k, it, start, &cot)?,
            _ => self.iteration_run_again(l, it, start, &cot)?,
        }
        self.frames = saved;
        let stmts = self.blocks.pop().unwrap_or_default();
        let body = self.unit_block(stmts);
        self.push_for(r, zero, n, body);
        for (init, s) in l.init.iter().zip(&sb) {
            if self.is_active(*init) {
                let ty = self.ty_of(*s);
                let v = self.emit(self.local(*s), ty, "sbo");
                contribs.entry(*init).or_default().push(v);
            }
        }
        for (v, acc) in free_act.iter().zip(&fb) {
            let x = match acc {
                Acc::Whole(s) => {
                    let ty = self.ty_of(*s);
                    self.emit(self.local(*s), ty, "fbo")
                }
                Acc::Leaves(slots) => {
                    let ty = self.ty_of(*v);
                    self.build_from_leaves(&ty, slots)?
                }
            };
            contribs.entry(*v).or_default().push(x);
        }
        Ok(())
    }

    /// One iteration of a loop whose tape keeps residuals: they are read from the tape and
    /// stand in for the iteration's own values in its backward pass.
    fn iteration_from_residuals(&mut self, k: &Saved, it: Local, start: Local, cot: &Cotangents) -> Res<()> {
        let idx = self.p(Prim::Sub, &[it, start], Attrs::default(), Type::scalar(ElemTy::I32));
        let tys: Vec<Type> = k.residuals.iter().map(|v| self.ty_of(*v)).collect();
        // Typed without layouts, so that the sharding pass keeps each residual's block
        // as the forward pass held it (the tape takes the pushed layouts).
        let tuple = Type::Tuple(tys.clone()).replicated();
        let got = self.p(Prim::TapeGet, &[k.tape, idx], Attrs::default(), tuple);
        let mut map = HashMap::from([(k.iv, it)]);
        for (i, (v, t)) in k.residuals.iter().zip(tys).enumerate() {
            let x = self.emit(mk(ExprKind::TupleGet(Box::new(self.local(got)), i), t.clone(), self.sid), t, "rs");
            map.insert(*v, x);
        }
        let mark = self.blocks.last().map_or(0, Vec::len);
        self.iteration_bwd(&k.nodes, &k.start, &k.end, cot)?;
        let mut stray = None;
        for st in self.blocks.last_mut().map_or(&mut [][..], |b| &mut b[mark..]) {
            if let Stmt::Let { value, .. } | Stmt::Assign { value, .. } | Stmt::Expr(value) = st {
                ir::walk::rename_locals(value, &map);
                ir::walk::walk(value, &mut |e| match e.kind {
                    ExprKind::Local(v) if k.bound.contains(&v) => stray = Some(v),
                    _ => {}
                });
            }
        }
        if let Some(v) = stray {
            let name = self.prog.names.get(self.locals[v.0 as usize].name);
            return Err(err(
                self.span,
                format!("internal: a loop's backward pass reads `{name}`, which its tape does not keep"),
            ));
        }
        Ok(())
    }

    /// One iteration of a loop whose tape keeps states (or none): its state at `it`, read from
    /// the tape or recomputed from the state before the loop, run forward again, then its
    /// backward pass.
    fn iteration_run_again(&mut self, l: &LoopNode, it: Local, start: Local, cot: &Cotangents) -> Res<()> {
        let i32t = Type::scalar(ElemTy::I32);
        let srcs: Vec<Expr> = match &l.tape {
            // The state at the start of iteration `it`, read from the tape.
            Some(Tape::States(tp)) => {
                let idx = self.p(Prim::Sub, &[it, start], Attrs::default(), i32t.clone());
                let tys: Vec<Type> = l.init.iter().map(|v| self.ty_of(*v)).collect();
                let st = Type::Tuple(tys.clone());
                let s = self.p(Prim::TapeGet, &[*tp, idx], Attrs::default(), st);
                tys.into_iter()
                    .enumerate()
                    .map(|(i, t)| mk(ExprKind::TupleGet(Box::new(self.local(s)), i), t, self.sid))
                    .collect()
            }
            // Recompute the state at the start of iteration `it` from the state before the loop.
            None => {
                let tslots: Vec<Local> = l
                    .init
                    .iter()
                    .map(|v| {
                        let ty = self.ty_of(*v);
                        let s = self.new_local(ty, "t", true);
                        self.push_stmt(Stmt::Let { pat: Pat::Local(s), value: self.local(*v) });
                        s
                    })
                    .collect();
                let j = self.new_local(i32t.clone(), "j", false);
                let rec_body = self.loop_body(&l.body, &l.carried, &tslots, l.ivar, j, false)?.block;
                self.push_for(j, start, it, rec_body);
                tslots.iter().map(|t| self.local(*t)).collect()
            }
            Some(Tape::Residuals(_)) => return Err(err(self.span, "internal: a residual tape run again")),
        };
        // One iteration at `it` from that state, run forward again, then its backward.
        let mut state = Vec::new();
        for (c, src) in l.carried.iter().zip(srcs) {
            let ty = src.ty.clone();
            let v = self.emit(src, ty.clone(), "st");
            // Only float state carries a cotangent (a `bool` or `i32` slot never does).
            let act = self.active.contains(&l.init[state.len()]) || l.outs.iter().any(|o| self.active.contains(o));
            if act && is_float_type(&ty) {
                self.active.insert(v);
            }
            self.bind(*c, v);
            state.push(v);
        }
        if let Some(iv) = l.ivar {
            self.bind(iv, it);
        }
        let mut sub = Vec::new();
        self.fwd(&l.body, &mut sub)?;
        let end: Vec<Local> = l.carried.iter().map(|c| self.frame().env[c]).collect();
        self.iteration_bwd(&sub, &state, &end, cot)?;
        Ok(())
    }

    /// The cotangent accumulators of a loop's active free values: one slot each, or one per
    /// leaf for a model holding a stack of layers (`fwd::leaves`: a row per iteration).
    pub(super) fn free_accs(&mut self, free_act: &[Local]) -> Res<Vec<Acc>> {
        let mut fb = Vec::new();
        for v in free_act {
            let ty = self.ty_of(*v);
            if self.by_leaves(&ty) {
                fb.push(Acc::Leaves(self.leaf_slots(&ty, *v)?));
                continue;
            }
            let z = self.zeros_like(*v)?;
            let ty = self.ty_of(z);
            let s = self.new_local(ty, "fb", true);
            self.push_stmt(Stmt::Let { pat: Pat::Local(s), value: self.local(z) });
            fb.push(Acc::Whole(s));
        }
        Ok(fb)
    }

    /// The backward pass of one iteration whose operations are `nodes`: the carried cotangents
    /// `sb` seed the values at its `end`, become the cotangents of its `start`, and the free
    /// values' cotangents are added into `fb`.
    pub(super) fn iteration_bwd(
        &mut self,
        nodes: &[Node],
        start: &[Local],
        end: &[Local],
        cot: &Cotangents,
    ) -> Res<()> {
        let Cotangents { sb, fb, free_act } = *cot;
        let mut local: HashMap<Local, Vec<Local>> = HashMap::new();
        for (new, s) in end.iter().zip(sb) {
            if self.is_active(*new) {
                // Read the slot once: contributions may pass it through unchanged, and the
                // slots are reassigned before the free values' cotangents are accumulated.
                let ty = self.ty_of(*s);
                let cur = self.emit(self.local(*s), ty, "sbv");
                local.entry(*new).or_default().push(cur);
            }
        }
        let outer = self.enter_scope();
        self.bwd(nodes, &mut local)?;
        for (v, s) in start.iter().zip(sb) {
            let t = self.total(*v, &mut local)?;
            self.push_stmt(Stmt::Assign { pat: Pat::Local(*s), value: self.local(t) });
        }
        for (v, acc) in free_act.iter().zip(fb) {
            if let Some(cs) = self.take(*v, &mut local)? {
                if cs.is_empty() {
                    continue;
                }
                match acc {
                    Acc::Whole(s) => {
                        let t = self.sum(&cs);
                        let ty = self.ty_of(*s);
                        let acc = self.p(Prim::Add, &[*s, t], Attrs::default(), ty);
                        self.push_stmt(Stmt::Assign { pat: Pat::Local(*s), value: self.local(acc) });
                    }
                    Acc::Leaves(slots) => {
                        let ty = self.ty_of(*v);
                        self.add_into_leaves(&ty, &cs, slots)?;
                    }
                }
            }
        }
        self.leave_scope(outer);
        Ok(())
    }

    /// In the trial backward pass of an enclosing loop (`loops::residuals_of`), a nested loop's
    /// backward pass: it reads the loop's bounds, states, free values and tape, and gives its
    /// initial state and free values a cotangent each.
    fn mark_loop_reads(&mut self, l: &LoopNode, contribs: &mut HashMap<Local, Vec<Local>>) {
        let tape = match &l.tape {
            Some(Tape::Residuals(k)) => Some(k.tape),
            Some(Tape::States(tp)) => Some(*tp),
            None => None,
        };
        let read: Vec<Local> =
            l.start.iter().chain([&l.end]).chain(&l.init).chain(&l.outs).chain(&l.free).chain(&tape).copied().collect();
        let ty = Type::Tuple(read.iter().map(|v| self.ty_of(*v)).collect());
        let all = mk(ExprKind::Tuple(read.iter().map(|v| self.local(*v)).collect()), ty, self.sid);
        self.push_stmt(Stmt::Expr(all));
        for v in l.init.iter().chain(&l.free) {
            if self.is_active(*v) {
                let ty = self.ty_of(*v);
                let c = self.new_local(ty, "dry", false);
                contribs.entry(*v).or_default().push(c);
            }
        }
    }
}
