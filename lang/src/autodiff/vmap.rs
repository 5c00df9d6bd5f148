//! `vmap` as a batching transform from typed IR to typed IR: every value of the function is
//! either shared by all batch elements or carries the batch as a new leading dimension, and
//! each primitive has a batching rule. The generated function is ordinary IR, so it runs fast in
//! the interpreter and can be differentiated (`grad` of a function that calls `vmap`).

use super::{err, target_func};
use crate::diag::Diagnostic;
pub use crate::ir::derived::axes_code;
use crate::ir::{self, Attrs, Expr, ExprKind, FnTarget, Local, LocalInfo, Name, Pat, Prim, Program, SpanId, Stmt};
use crate::source::Span;
use crate::types::fixed_dims as fixed;
use crate::types::unify::{Subst, Unifier};
use crate::types::TensorTy;
use crate::types::{Dim, Elem, ElemTy, FuncId, ShapeItem, Type};
use std::collections::{HashMap, HashSet};

type Res<T> = Result<T, Diagnostic>;

/// Whether a value carries the batch (structurally for tuples).
#[derive(Clone, Debug, PartialEq)]
enum Bat {
    No,
    Yes,
    Tup(Vec<Bat>),
}

impl Bat {
    fn any(&self) -> bool {
        match self {
            Bat::No => false,
            Bat::Yes => true,
            Bat::Tup(v) => v.iter().any(Bat::any),
        }
    }
}

fn unpack(code: u64) -> Vec<Option<usize>> {
    let n = (code & 15) as usize;
    (0..n)
        .map(|i| {
            let v = (code >> (4 * (i + 1))) & 15;
            (v != 15).then_some(v as usize)
        })
        .collect()
}

/// The batched value of each local of a frame.
type Env = HashMap<Local, (Local, Bat)>;

struct Frame {
    env: HashMap<Local, (Local, Bat)>,
    subst: Subst,
    returned: Option<(Local, Bat)>,
}

struct V<'p> {
    prog: &'p Program,
    /// The scope each closure was created in, for inlining its instances.
    closure_envs: HashMap<crate::types::ClosureId, (Env, Subst)>,
    locals: Vec<LocalInfo>,
    blocks: Vec<Vec<Stmt>>,
    frames: Vec<Frame>,
    b: Dim,
    span: Span,
    sid: SpanId,
}

fn mk(kind: ExprKind, ty: Type, span: SpanId) -> Expr {
    Expr::new(kind, ty, span)
}

fn shape(t: &Type) -> Vec<ShapeItem> {
    match t {
        Type::Tensor(TensorTy { shape: s, .. }) => s.clone(),
        _ => vec![],
    }
}

fn with_shape(t: &Type, s: Vec<ShapeItem>) -> Type {
    match t {
        Type::Tensor(TensorTy { elem: e, .. }) => Type::tensor_of(*e, s),
        other => other.clone(),
    }
}

/// Generates the batched version of `f` for the given packed `in_axes`.
pub(super) fn generate(prog: &Program, f: FuncId, code: u64, bsym: crate::types::Sym, span: Span) -> Res<ir::Func> {
    let func = prog.func(f);
    let axes = {
        let a = unpack(code);
        if a.is_empty() {
            vec![Some(0); func.params.len()]
        } else {
            a
        }
    };
    if axes.len() != func.params.len() {
        return Err(err(span, "`vmap` in_axes do not match the parameters"));
    }
    let mut v = V {
        prog,
        closure_envs: HashMap::new(),
        locals: func.locals.clone(),
        blocks: vec![vec![]],
        frames: vec![],
        b: Dim::constant(1),
        span,
        sid: func.span,
    };
    // Parameters: mapped ones get the batch dim inserted at their axis; inside, it is moved to 0.
    let mut params = Vec::new();
    let mut env = HashMap::new();
    let mut bdim: Option<Dim> = None;
    let mut new_dims = func.dims.clone();
    for (p, a) in func.params.iter().zip(&axes) {
        let ty = func.locals[p.0 as usize].ty.clone();
        match a {
            None => {
                let l = v.new_local(ty.clone());
                params.push(l);
                env.insert(*p, (l, Bat::No));
            }
            Some(ax) => {
                let b = match &bdim {
                    Some(b) => b.clone(),
                    None => {
                        new_dims.push(bsym);
                        let d = Dim::var(bsym);
                        bdim = Some(d.clone());
                        d
                    }
                };
                let mut s = shape(&ty);
                if *ax > s.len() {
                    return Err(err(span, "`vmap` axis out of range"));
                }
                s.insert(*ax, ShapeItem::Dim(b.clone()));
                let pty = with_shape(&ty, s.clone());
                let l = v.new_local(pty);
                params.push(l);
                let inner = if *ax == 0 {
                    l
                } else {
                    let mut perm: Vec<usize> = (0..s.len()).collect();
                    perm.remove(*ax);
                    perm.insert(0, *ax);
                    let mut s2 = s.clone();
                    let bd = s2.remove(*ax);
                    s2.insert(0, bd);
                    v.p(Prim::Permute, &[l], Attrs { perm, ..Attrs::default() }, with_shape(&ty, s2))
                };
                env.insert(*p, (inner, Bat::Yes));
            }
        }
    }
    v.b = bdim.unwrap_or_else(|| Dim::constant(1));
    // Captured values of a closure are shared by the whole batch and stay in their slots.
    for l in crate::autodiff::fwd::free_locals(&func.body) {
        if !func.params.contains(&l) {
            env.insert(l, (l, Bat::No));
        }
    }
    v.frames.push(Frame { env, subst: Subst::default(), returned: None });
    let (r, rb) = v.walk(&func.body)?;
    let (r, rb) = v.frames[0].returned.clone().unwrap_or((r, rb));
    let r = v.force(r, &rb)?;
    let ret = v.ty_of(r);
    let stmts = v.blocks.pop().unwrap_or_default();
    let body =
        mk(ExprKind::Block { stmts, result: Box::new(mk(ExprKind::Local(r), ret.clone(), v.sid)) }, ret.clone(), v.sid);
    Ok(ir::Func {
        name: func.name,
        dims: new_dims,
        rests: func.rests.clone(),
        models: func.models.clone(),
        n_captures: func.n_captures,
        params,
        ret,
        locals: v.locals,
        body,
        annotations: vec![],
        span: func.span,
    })
}

impl V<'_> {
    fn new_local(&mut self, ty: Type) -> Local {
        self.locals.push(LocalInfo { name: Name(u32::MAX), ty, mutable: true });
        Local(self.locals.len() as u32 - 1)
    }
    fn ty_of(&self, l: Local) -> Type {
        self.locals[l.0 as usize].ty.clone()
    }
    fn local(&self, l: Local) -> Expr {
        mk(ExprKind::Local(l), self.ty_of(l), self.sid)
    }
    fn emit(&mut self, e: Expr) -> Local {
        let l = self.new_local(e.ty.clone());
        self.blocks.last_mut().unwrap().push(Stmt::Let { pat: Pat::Local(l), value: e });
        l
    }
    fn p(&mut self, prim: Prim, args: &[Local], attrs: Attrs, ty: Type) -> Local {
        let a = args.iter().map(|l| self.local(*l)).collect();
        self.emit(mk(ExprKind::Prim { prim, args: a, attrs: Box::new(attrs) }, ty, self.sid))
    }
    fn frame(&self) -> &Frame {
        self.frames.last().unwrap()
    }
    fn sty(&self, t: &Type) -> Type {
        self.frame().subst.ty(t)
    }
    /// The batched type of a per-sample type.
    fn bty(&self, t: &Type) -> Type {
        match t {
            Type::Tensor(TensorTy { elem: e, shape: s, .. }) => {
                let mut s2 = vec![ShapeItem::Dim(self.b.clone())];
                s2.extend(s.iter().cloned());
                Type::Tensor(TensorTy::new(*e, s2))
            }
            other => other.clone(),
        }
    }

    /// Makes a value batched (broadcasting a shared value over the batch).
    fn force(&mut self, v: Local, b: &Bat) -> Res<Local> {
        match b {
            Bat::Yes => Ok(v),
            Bat::Tup(parts) => {
                let Type::Tuple(ts) = self.ty_of(v) else { return Ok(v) };
                let mut items = Vec::new();
                for (i, (t, pb)) in ts.iter().zip(parts).enumerate() {
                    let c = self.emit(mk(ExprKind::TupleGet(Box::new(self.local(v)), i), t.clone(), self.sid));
                    items.push(self.force(c, pb)?);
                }
                let tys: Vec<Type> = items.iter().map(|x| self.ty_of(*x)).collect();
                Ok(self.emit(mk(
                    ExprKind::Tuple(items.iter().map(|x| self.local(*x)).collect()),
                    Type::Tuple(tys),
                    self.sid,
                )))
            }
            Bat::No => {
                let t = self.ty_of(v);
                let Type::Tensor(..) = &t else {
                    return Err(err(self.span, "`vmap` cannot batch a model or function value"));
                };
                let Some(d) = fixed(&shape(&t)) else {
                    return Err(err(self.span, "`vmap` cannot broadcast a `..` rest"));
                };
                let mut full = vec![self.b.clone()];
                full.extend(d);
                let bt = self.bty(&t);
                Ok(self.p(Prim::BroadcastTo, &[v], Attrs { shape: full, ..Attrs::default() }, bt))
            }
        }
    }

    /// A batched value with `n` size-1 dims inserted after the batch dim.
    fn lift(&mut self, v: Local, n: usize) -> Local {
        let mut cur = v;
        for _ in 0..n {
            let t = self.ty_of(cur);
            let mut s = shape(&t);
            s.insert(1, ShapeItem::Dim(Dim::constant(1)));
            cur = self.p(Prim::ExpandDims, &[cur], Attrs { axis: Some(1), ..Attrs::default() }, with_shape(&t, s));
        }
        cur
    }

    fn walk(&mut self, e: &Expr) -> Res<(Local, Bat)> {
        let ty = self.sty(&e.ty);
        match &e.kind {
            ExprKind::Local(l) => {
                self.frame().env.get(l).cloned().ok_or_else(|| err(self.span, "internal: unbound value in vmap"))
            }
            ExprKind::Lit(_) | ExprKind::Const(_) | ExprKind::FuncRef(_) => {
                let c = mk(e.kind.clone(), ty, e.span);
                Ok((self.emit(c), Bat::No))
            }
            ExprKind::DimValue(d) => {
                let d = self.frame().subst.dim(d);
                Ok((self.emit(mk(ExprKind::DimValue(d), ty, e.span)), Bat::No))
            }
            ExprKind::Prim { prim, args, attrs } => {
                let mut vs = Vec::new();
                for a in args {
                    vs.push(self.walk(a)?);
                }
                let mut attrs = (**attrs).clone();
                attrs.shape = attrs.shape.iter().map(|d| self.frame().subst.dim(d)).collect();
                if attrs.from_end {
                    // Per-sample rank of the operand decides the axis.
                    let (l, b) = &vs[0];
                    let s = shape(&self.ty_of(*l));
                    if s.iter().any(|i| matches!(i, ShapeItem::Rest(_))) {
                        return Err(err(
                            self.prog.span(e.span),
                            "`vmap` of a reduction over `axis: -k` of a `..` rest",
                        ));
                    }
                    let rank = s.len() - usize::from(*b == Bat::Yes);
                    attrs.axis = attrs.axis.map(|k| rank.saturating_sub(k));
                    attrs.from_end = false;
                }
                self.prim(*prim, vs, attrs, ty)
            }
            ExprKind::Call { func, dims, rests, args } => {
                let mut vs = Vec::new();
                for a in args {
                    vs.push(self.walk(a)?);
                }
                let callee = self.prog.func(*func);
                let mut s = Subst::default();
                for (sym, d) in callee.dims.iter().zip(dims) {
                    s.dims.insert(*sym, self.frame().subst.dim(d));
                }
                for (r, sh) in callee.rests.iter().zip(rests) {
                    s.rests.insert(*r, self.frame().subst.shape(sh));
                }
                self.inline(*func, vs, s)
            }
            ExprKind::CallValue { callee: _, target, args } => {
                // A pullback reads residuals its `vjp` saved, which the batched copy does not hold.
                if matches!(target, FnTarget::Grad { wrt: usize::MAX, .. }) {
                    return Err(err(
                        self.prog.span(e.span),
                        "`vmap` cannot batch a call of a `vjp` pullback; use `jacrev(f)(x)` or `vmap` of `grad`",
                    ));
                }
                let mut vs = Vec::new();
                for a in args {
                    vs.push(self.walk(a)?);
                }
                let Some(f) = target_func(self.prog, target) else {
                    return Err(err(
                        self.prog.span(e.span),
                        "`vmap` cannot batch a call of a function value known only at run time",
                    ));
                };
                self.call_target(f, target, vs)
            }
            // `jvp(f, primals, tangents)`: a call of `f`'s forward-mode function with the primals
            // and the tangents, so per-sample tangents (the columns of a Jacobian) batch.
            ExprKind::Jvp { target, primals, tangents, .. } => {
                let mut vs = Vec::new();
                for a in primals.iter().chain(tangents) {
                    vs.push(self.walk(a)?);
                }
                let f = target_func(self.prog, target).map(|f| self.prog.derived.transformable(f));
                let jf = f.and_then(|f| self.prog.derived.funcs.get(&(f, crate::ir::derived::Mode::Jvp)).copied());
                let Some(jf) = jf else {
                    return Err(err(
                        self.prog.span(e.span),
                        "`vmap` cannot batch a `jvp` of a function value known only at run time",
                    ));
                };
                self.call_target(jf, target, vs)
            }
            ExprKind::Tuple(items) => {
                let mut vs = Vec::new();
                for a in items {
                    vs.push(self.walk(a)?);
                }
                let tys: Vec<Type> = vs.iter().map(|(l, _)| self.ty_of(*l)).collect();
                let t = self.emit(mk(
                    ExprKind::Tuple(vs.iter().map(|(l, _)| self.local(*l)).collect()),
                    Type::Tuple(tys),
                    e.span,
                ));
                Ok((t, Bat::Tup(vs.into_iter().map(|(_, b)| b).collect())))
            }
            ExprKind::TupleGet(a, i) => {
                let (v, b) = self.walk(a)?;
                let Type::Tuple(ts) = self.ty_of(v) else { return Err(err(self.span, "internal: not a tuple")) };
                let t = ts[*i].clone();
                let out = self.emit(mk(ExprKind::TupleGet(Box::new(self.local(v)), *i), t, e.span));
                let ob = match b {
                    Bat::Tup(parts) => parts[*i].clone(),
                    other => other,
                };
                Ok((out, ob))
            }
            ExprKind::Field(a, i) => {
                let (v, b) = self.walk(a)?;
                if b.any() {
                    return Err(err(self.prog.span(e.span), "`vmap` cannot batch over model values"));
                }
                Ok((self.emit(mk(ExprKind::Field(Box::new(self.local(v)), *i), ty, e.span)), Bat::No))
            }
            ExprKind::Block { stmts, result } => {
                for s in stmts {
                    if self.frame().returned.is_some() {
                        break;
                    }
                    self.stmt(s)?;
                }
                if let Some(r) = self.frame().returned.clone() {
                    return Ok(r);
                }
                self.walk(result)
            }
            ExprKind::Return(v) => {
                let r = self.walk(v)?;
                self.frames.last_mut().unwrap().returned = Some(r.clone());
                Ok(r)
            }
            ExprKind::If { cond, then, els } => {
                let (c, cb) = self.walk(cond)?;
                let (t, tb) = self.sub_block(then)?;
                let (f, fb) = self.sub_block(els)?;
                if cb == Bat::No {
                    // Both branches must agree on batching: broadcast inside the branch.
                    let (tv, tstmts) = t;
                    let (fv, fstmts) = f;
                    let want = if tb.any() || fb.any() { Bat::Yes } else { Bat::No };
                    let (te, fe) =
                        if want == Bat::Yes && (tb != Bat::Yes || fb != Bat::Yes) && !matches!(tb, Bat::Tup(_)) {
                            let te = self.finish_branch(tstmts, tv, &tb, true)?;
                            let fe = self.finish_branch(fstmts, fv, &fb, true)?;
                            (te, fe)
                        } else {
                            let te = self.finish_branch(tstmts, tv, &tb, false)?;
                            let fe = self.finish_branch(fstmts, fv, &fb, false)?;
                            (te, fe)
                        };
                    let rty = te.ty.clone();
                    let out = self.emit(mk(
                        ExprKind::If { cond: Box::new(self.local(c)), then: Box::new(te), els: Box::new(fe) },
                        rty,
                        e.span,
                    ));
                    let ob = if want == Bat::Yes && !matches!(tb, Bat::Tup(_)) { Bat::Yes } else { tb };
                    return Ok((out, ob));
                }
                // A batched condition: both branches run, the result is selected per element.
                let (tv, tstmts) = t;
                let (fv, fstmts) = f;
                self.blocks.last_mut().unwrap().extend(tstmts);
                self.blocks.last_mut().unwrap().extend(fstmts);
                let tv = self.force(tv, &tb)?;
                let fv = self.force(fv, &fb)?;
                let r = shape(&self.ty_of(tv)).len();
                let cl = self.lift(c, r.saturating_sub(1));
                let out_ty = self.ty_of(tv);
                Ok((self.p(Prim::Where, &[cl, tv, fv], Attrs::default(), out_ty), Bat::Yes))
            }
            ExprKind::ForRange { .. } | ExprKind::While { .. } | ExprKind::ForBatches { .. } => {
                // Loops whose state is shared by all batch elements run once, as they are.
                let fl = crate::autodiff::fwd::free_locals(e);
                if fl.iter().any(|l| self.frame().env.get(l).is_some_and(|(_, b)| b.any())) {
                    return Err(err(self.prog.span(e.span), "`vmap` cannot batch a loop over batched values yet"));
                }
                let map: HashMap<Local, Local> = self.frame().env.iter().map(|(k, (v, _))| (*k, *v)).collect();
                let copied = copy_local_refs(e, &map);
                Ok((self.emit(copied), Bat::No))
            }
            ExprKind::Closure { id, captures } => {
                let fr = self.frame();
                self.closure_envs.insert(*id, (fr.env.clone(), fr.subst.clone()));
                let caps = captures.iter().filter_map(|l| self.frame().env.get(l).map(|(v, _)| *v)).collect();
                Ok((self.emit(mk(ExprKind::Closure { id: *id, captures: caps }, ty, e.span)), Bat::No))
            }
            _ => Err(err(self.prog.span(e.span), "`vmap` cannot batch this construct")),
        }
    }

    /// A call of the function implementing a static target (`f`), inlined with the batched
    /// arguments; a closure's captures come from where it was made.
    fn call_target(&mut self, f: FuncId, target: &FnTarget, vs: Vec<(Local, Bat)>) -> Res<(Local, Bat)> {
        let closure = super::innermost(target).and_then(|g| {
            self.prog
                .closures
                .iter()
                .position(|c| c.instances.iter().any(|(_, h)| *h == g))
                .map(|i| crate::types::ClosureId(i as u32))
        });
        let f = self.prog.derived.transformable(f);
        let callee = self.prog.func(f);
        let generic: HashSet<_> = callee.dims.iter().copied().collect();
        let mut u = Unifier::new(&generic);
        for (p, (a, b)) in callee.params.iter().zip(&vs) {
            let at = self.ty_of(*a);
            let at = if *b == Bat::Yes { with_shape(&at, shape(&at)[1..].to_vec()) } else { at };
            let _ = u.ty(&callee.locals[p.0 as usize].ty, &at);
        }
        let _ = u.finish();
        let mut s = u.subst;
        let base = closure.and_then(|c| self.closure_envs.get(&c).cloned());
        let outer = base.as_ref().map(|(_, s)| s.clone()).unwrap_or_else(|| self.frame().subst.clone());
        for (sym, d) in &outer.dims {
            s.dims.entry(*sym).or_insert_with(|| d.clone());
        }
        self.inline_with(f, vs, s, base.map(|(env, _)| env))
    }

    fn sub_block(&mut self, e: &Expr) -> Res<((Local, Vec<Stmt>), Bat)> {
        self.blocks.push(vec![]);
        let r = self.walk(e);
        let stmts = self.blocks.pop().unwrap_or_default();
        let (v, b) = r?;
        Ok(((v, stmts), b))
    }

    fn finish_branch(&mut self, stmts: Vec<Stmt>, v: Local, b: &Bat, force: bool) -> Res<Expr> {
        self.blocks.push(stmts);
        let v = if force { self.force(v, b)? } else { v };
        let stmts = self.blocks.pop().unwrap_or_default();
        let ty = self.ty_of(v);
        Ok(mk(ExprKind::Block { stmts, result: Box::new(self.local(v)) }, ty, self.sid))
    }

    fn stmt(&mut self, s: &Stmt) -> Res<()> {
        match s {
            Stmt::Let { pat, value } | Stmt::Assign { pat, value } => {
                let (v, b) = self.walk(value)?;
                self.bind(pat, v, b);
                Ok(())
            }
            Stmt::Expr(e) => self.walk(e).map(|_| ()),
            Stmt::BindDims { .. } => Err(err(self.span, "`vmap` cannot batch `load`")),
        }
    }

    fn bind(&mut self, pat: &Pat, v: Local, b: Bat) {
        match pat {
            Pat::Local(l) => {
                self.frames.last_mut().unwrap().env.insert(*l, (v, b));
            }
            Pat::Ignore => {}
            Pat::Tuple(ps) => {
                let Type::Tuple(ts) = self.ty_of(v) else { return };
                for (i, (p, t)) in ps.iter().zip(ts).enumerate() {
                    let c = self.emit(mk(ExprKind::TupleGet(Box::new(self.local(v)), i), t, self.sid));
                    let cb = match &b {
                        Bat::Tup(parts) => parts.get(i).cloned().unwrap_or(Bat::No),
                        other => other.clone(),
                    };
                    self.bind(p, c, cb);
                }
            }
        }
    }

    fn inline(&mut self, f: FuncId, args: Vec<(Local, Bat)>, subst: Subst) -> Res<(Local, Bat)> {
        self.inline_with(f, args, subst, None)
    }

    fn inline_with(
        &mut self,
        f: FuncId,
        args: Vec<(Local, Bat)>,
        subst: Subst,
        base: Option<HashMap<Local, (Local, Bat)>>,
    ) -> Res<(Local, Bat)> {
        if self.frames.len() > 200 {
            return Err(err(self.span, "calls nested too deeply to batch"));
        }
        let f = self.prog.derived.transformable(f);
        let func = self.prog.func(f);
        let mut env = base.unwrap_or_default();
        // Captured values of closures made outside read their own slots (shared by the batch).
        for l in crate::autodiff::fwd::free_locals(&func.body) {
            if !func.params.contains(&l) && !env.contains_key(&l) {
                if let Some(v) = self.frames[0].env.get(&l) {
                    env.insert(l, v.clone());
                } else if (l.0 as usize) < self.locals.len() {
                    env.insert(l, (l, Bat::No));
                }
            }
        }
        for (p, a) in func.params.iter().zip(args) {
            env.insert(*p, a);
        }
        let mut flat = Subst::default();
        for (s, d) in &subst.dims {
            flat.dims.insert(*s, self.frame().subst.dim(d));
        }
        for (r, sh) in &subst.rests {
            flat.rests.insert(*r, self.frame().subst.shape(sh));
        }
        for (s, d) in &self.frame().subst.dims {
            flat.dims.entry(*s).or_insert_with(|| d.clone());
        }
        self.frames.push(Frame { env, subst: flat, returned: None });
        let r = self.walk(&func.body);
        let fr = self.frames.pop().unwrap();
        let r = r?;
        Ok(fr.returned.unwrap_or(r))
    }

    /// One primitive under the batch: `ty` is the per-sample result type.
    fn prim(&mut self, p: Prim, vs: Vec<(Local, Bat)>, attrs: Attrs, ty: Type) -> Res<(Local, Bat)> {
        let any = vs.iter().any(|(_, b)| b.any());
        if !any {
            return Ok((self.p(p, &vs.iter().map(|(l, _)| *l).collect::<Vec<_>>(), attrs, ty), Bat::No));
        }
        let bt = self.bty(&ty);
        let r_out = shape(&ty).len();
        use crate::ir::prim::Class;
        let out = match (p, p.class()) {
            (_, Class::Unary) | (Prim::Cast | Prim::StopGradient | Prim::OneHot, _) => self.p(p, &[vs[0].0], attrs, bt),
            (_, Class::Binary) | (Prim::Where, _) => {
                let mut args = Vec::new();
                for (l, b) in &vs {
                    if *b == Bat::Yes {
                        let r = shape(&self.ty_of(*l)).len() - 1;
                        args.push(self.lift(*l, r_out.saturating_sub(r)));
                    } else {
                        args.push(*l);
                    }
                }
                self.p(p, &args, attrs, bt)
            }
            // The one operand is batched (only it can be); its axes move up by one.
            (_, Class::Along) | (Prim::Argsort, _) => {
                // An axis counted from the end stays where it is.
                let axis = if attrs.from_end { attrs.axis } else { attrs.axis.map(|a| a + 1) };
                self.p(p, &[vs[0].0], Attrs { axis, ..attrs }, bt)
            }
            (_, Class::Reduce) => {
                let x = vs[0].0;
                let xs = shape(&self.ty_of(x));
                match attrs.axis {
                    Some(a) => self.p(p, &[x], Attrs { axis: Some(a + 1), ..attrs }, bt),
                    None => {
                        let Some(d) = fixed(&xs) else {
                            return Err(err(self.span, "`vmap` of a reduction over a `..` rest"));
                        };
                        let n = d[1..].iter().fold(Dim::constant(1), |acc, x| acc.mul(x));
                        let flat_t =
                            with_shape(&self.ty_of(x), vec![ShapeItem::Dim(self.b.clone()), ShapeItem::Dim(n.clone())]);
                        let flat = self.p(
                            Prim::Reshape,
                            &[x],
                            Attrs { shape: vec![self.b.clone(), n], ..Attrs::default() },
                            flat_t,
                        );
                        let red_t = self.bty(&with_shape(&ty, vec![]));
                        let red = self.p(p, &[flat], Attrs { axis: Some(1), keepdims: false, ..attrs.clone() }, red_t);
                        if attrs.keepdims {
                            let mut full = vec![self.b.clone()];
                            full.extend(std::iter::repeat_n(Dim::constant(1), r_out));
                            self.p(Prim::Reshape, &[red], Attrs { shape: full, ..Attrs::default() }, bt)
                        } else {
                            red
                        }
                    }
                }
            }
            (Prim::MatMul, _) => {
                let (a, ab) = vs[0].clone();
                let (b, bb) = vs[1].clone();
                let ra = shape(&self.ty_of(a)).len() - usize::from(ab == Bat::Yes);
                let rb = shape(&self.ty_of(b)).len() - usize::from(bb == Bat::Yes);
                match (ab == Bat::Yes, bb == Bat::Yes, ra, rb) {
                    (true, true, 1, 1) => {
                        let prod_t = self.ty_of(a);
                        let m = self.p(Prim::Mul, &[a, b], Attrs::default(), prod_t);
                        self.p(Prim::Sum, &[m], Attrs { axis: Some(1), ..Attrs::default() }, bt)
                    }
                    (true, true, 1, _) => {
                        let a2 = self.lift(a, 1);
                        let mt = self.mm_type(a2, b);
                        let m = self.p(Prim::MatMul, &[a2, b], Attrs::default(), mt.clone());
                        let ms = shape(&mt);
                        let axis = ms.len() - 2;
                        self.p(Prim::Squeeze, &[m], Attrs { axis: Some(axis), ..Attrs::default() }, bt)
                    }
                    (_, true, _, 1) => {
                        // b[B, k] as a column [B, k, 1]; the result loses that column.
                        let bt1 = self.ty_of(b);
                        let mut s = shape(&bt1);
                        s.push(ShapeItem::Dim(Dim::constant(1)));
                        let bl = self.p(
                            Prim::ExpandDims,
                            &[b],
                            Attrs { axis: Some(s.len() - 1), ..Attrs::default() },
                            with_shape(&bt1, s),
                        );
                        let mt = self.mm_type(a, bl);
                        let m = self.p(Prim::MatMul, &[a, bl], Attrs::default(), mt.clone());
                        let axis = shape(&mt).len() - 1;
                        self.p(Prim::Squeeze, &[m], Attrs { axis: Some(axis), ..Attrs::default() }, bt)
                    }
                    _ => self.p(Prim::MatMul, &[a, b], attrs, bt),
                }
            }
            (Prim::Reshape | Prim::BroadcastTo, _) => {
                let (x, _) = vs[0];
                let mut full = vec![self.b.clone()];
                full.extend(attrs.shape.iter().cloned());
                let x = if p == Prim::BroadcastTo {
                    let r = shape(&self.ty_of(x)).len() - 1;
                    self.lift(x, attrs.shape.len().saturating_sub(r))
                } else {
                    x
                };
                self.p(p, &[x], Attrs { shape: full, ..attrs }, bt)
            }
            (Prim::Transpose | Prim::Permute, _) => {
                let mut perm = vec![0];
                perm.extend(attrs.perm.iter().map(|x| x + 1));
                self.p(Prim::Permute, &[vs[0].0], Attrs { perm, ..attrs }, bt)
            }
            (Prim::ExpandDims, _) => self.p(p, &[vs[0].0], Attrs { axis: attrs.axis.map(|a| a + 1), ..attrs }, bt),
            // A copy of the batch dim of every element (one process: contiguous rows).
            (Prim::CopySplit, _) => {
                self.p(p, &[vs[0].0], Attrs { axis: Some(attrs.axis.unwrap_or(0) + 1), ..attrs }, bt)
            }
            (Prim::Squeeze, _) => {
                let Some(d) = fixed(&shape(&bt)) else { return Err(err(self.span, "`vmap` of squeeze over a rest")) };
                self.p(Prim::Reshape, &[vs[0].0], Attrs { shape: d, ..Attrs::default() }, bt)
            }
            (Prim::Concat | Prim::Stack | Prim::CopyJoin, _) => {
                let mut args = Vec::new();
                for (l, b) in &vs {
                    args.push(self.force(*l, b)?);
                }
                self.p(p, &args, Attrs { axis: attrs.axis.map(|a| a + 1), ..attrs }, bt)
            }
            (Prim::Slice, _) => {
                if vs[1..].iter().any(|(_, b)| b.any()) {
                    return Err(err(self.span, "`vmap` cannot batch an index that differs per element"));
                }
                let mut slice = vec![crate::ir::SliceEntry::Full];
                slice.extend(attrs.slice.iter().copied());
                let args: Vec<Local> = vs.iter().map(|(l, _)| *l).collect();
                self.p(p, &args, Attrs { slice, ..attrs }, bt)
            }
            (Prim::Gather, _) => {
                let ((x, xb), (i, ib)) = (vs[0].clone(), vs[1].clone());
                match (xb == Bat::Yes, ib == Bat::Yes) {
                    (true, false) => self.p(p, &[x, i], Attrs { axis: attrs.axis.map(|a| a + 1), ..attrs }, bt),
                    (false, true) => {
                        let a = attrs.axis.unwrap_or(0);
                        let mut raw = shape(&bt);
                        let bd = raw.remove(0);
                        raw.insert(a, bd);
                        let g = self.p(p, &[x, i], attrs, with_shape(&bt, raw.clone()));
                        let mut perm: Vec<usize> = (0..raw.len()).collect();
                        perm.remove(a);
                        perm.insert(0, a);
                        self.p(Prim::Permute, &[g], Attrs { perm, ..Attrs::default() }, bt)
                    }
                    _ => {
                        return Err(err(
                            self.span,
                            "`vmap` cannot batch a gather whose table and indices both differ per element",
                        ))
                    }
                }
            }
            // Values and indices have one rank: both take the batch dim (a shared one is
            // broadcast over the batch), and the axis moves up by one.
            (Prim::TakeAlong | Prim::ScatterAddAlong, _) => {
                let x = self.force(vs[0].0, &vs[0].1)?;
                let i = self.force(vs[1].0, &vs[1].1)?;
                let mut shape = attrs.shape.clone();
                if p == Prim::ScatterAddAlong {
                    shape.insert(0, self.b.clone());
                }
                self.p(p, &[x, i], Attrs { axis: attrs.axis.map(|a| a + 1), shape, ..attrs }, bt)
            }
            (Prim::Update, _) => {
                if vs[2].1.any() {
                    return Err(err(self.span, "`vmap` cannot batch an `update` position that differs per element"));
                }
                let x = self.force(vs[0].0, &vs[0].1)?;
                let v = self.force(vs[1].0, &vs[1].1)?;
                self.p(p, &[x, v, vs[2].0], Attrs { axis: attrs.axis.map(|a| a + 1), ..attrs }, bt)
            }
            // The batch is one more leading dim of queries, keys and values; the mask is shared.
            (Prim::Attention | Prim::AttentionWeights, _) => {
                let n = vs.len();
                if vs[n - 2].1.any() || vs[n - 1].1.any() {
                    return Err(err(
                        self.span,
                        "`vmap` cannot batch an attention `len` or `causal` that differs per element",
                    ));
                }
                let mut a = Vec::new();
                for (l, b) in &vs[..n - 2] {
                    a.push(self.force(*l, b)?);
                }
                a.extend([vs[n - 2].0, vs[n - 1].0]);
                self.p(p, &a, attrs, bt)
            }
            (Prim::ScatterAdd, _) => {
                if vs[1].1.any() {
                    return Err(err(self.span, "`vmap` cannot batch scatter indices"));
                }
                let mut full = vec![self.b.clone()];
                full.extend(attrs.shape.iter().cloned());
                self.p(p, &[vs[0].0, vs[1].0], Attrs { axis: attrs.axis.map(|a| a + 1), shape: full, ..attrs }, bt)
            }
            (Prim::Einsum, _) => {
                let spec = attrs.spec.clone().unwrap_or_default();
                let (lhs, rhs) = spec.split_once("->").unwrap_or((&spec, ""));
                let letter = ('A'..='Z').chain('a'..='z').find(|c| !spec.contains(*c)).unwrap_or('Z');
                let ins: Vec<String> = lhs
                    .split(',')
                    .zip(&vs)
                    .map(|(l, (_, b))| if *b == Bat::Yes { format!("{letter}{l}") } else { l.to_string() })
                    .collect();
                let spec2 = format!("{}->{letter}{rhs}", ins.join(","));
                let args: Vec<Local> = vs.iter().map(|(l, _)| *l).collect();
                self.p(p, &args, Attrs { spec: Some(spec2), ..attrs }, bt)
            }
            // A batched value would be one scalar per example: there is no one value to record.
            (Prim::LogScalar, _) if vs.iter().any(|(_, b)| *b != Bat::No) => {
                return Err(err(
                    self.span,
                    "`vmap` cannot batch `log_scalar` of a batched value; log a reduction of it (`mean(…)`) outside",
                ));
            }
            (
                Prim::Print
                | Prim::Assert
                | Prim::AssertClose
                | Prim::Save
                | Prim::LogScalar
                | Prim::Exists
                | Prim::Clock,
                _,
            ) => {
                let args: Vec<Local> = vs.iter().map(|(l, _)| *l).collect();
                return Ok((self.p(p, &args, attrs, ty), Bat::No));
            }
            _ => return Err(err(self.span, format!("`vmap` cannot batch `{}` yet", p.name()))),
        };
        Ok((out, Bat::Yes))
    }

    fn mm_type(&self, a: Local, b: Local) -> Type {
        let (at, bt) = (self.ty_of(a), self.ty_of(b));
        let (sa, sb) = (shape(&at), shape(&bt));
        let batch = crate::types::unify::broadcast(&sa[..sa.len() - 2].to_vec(), &sb[..sb.len() - 2].to_vec())
            .unwrap_or_default();
        let mut out = batch;
        out.push(sa[sa.len() - 2].clone());
        out.push(sb[sb.len() - 1].clone());
        Type::Tensor(TensorTy::new(
            match &at {
                Type::Tensor(TensorTy { elem: e, .. }) => *e,
                _ => Elem::T(ElemTy::F32),
            },
            out,
        ))
    }
}

/// Copies an expression, renaming the locals it reads (for code shared by the whole batch).
fn copy_local_refs(e: &Expr, map: &HashMap<Local, Local>) -> Expr {
    let mut out = e.clone();
    rename(&mut out, map);
    out
}

fn rename(e: &mut Expr, map: &HashMap<Local, Local>) {
    crate::ir::walk::rename_locals(e, map)
}
