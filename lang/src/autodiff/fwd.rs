//! The generator of derived functions: the forward walk (inlining calls, SSA for `var`s,
//! activity analysis, a tape of active operations) and the backward walk over that tape.

use super::{err, rules, Mode};
use crate::diag::Diagnostic;
use crate::ir::{self, Attrs, Expr, ExprKind, FnTarget, Lit, Local, LocalInfo, Pat, Prim, Program, SpanId, Stmt};
use crate::source::Span;
use crate::types::unify::{Subst, Unifier};
use crate::types::TensorTy;
use crate::types::{ClosureId, Dim, Elem, ElemTy, FuncId, ShapeItem, Type, TypeArg};
use std::collections::{HashMap, HashSet};
use std::rc::Rc;

mod branches;
mod bwd;
mod leaves;
mod loops;
mod rewrite;

use rewrite::{join_early_return, remap};

pub(super) type Res<T> = Result<T, Diagnostic>;

/// One inlined function activation.
#[derive(Clone)]
pub(super) struct FrameCx {
    /// Current SSA value of each local of the inlined function.
    env: HashMap<Local, Local>,
    /// The function's dims in terms of the generated function's dims.
    subst: Subst,
    /// Where the function's own locals live in the generated function (for copied code).
    base: u32,
    returned: Option<Local>,
    /// Inside a `@recompute` function: its loops keep no tape of states.
    recompute: bool,
}

#[derive(Clone)]
pub(super) enum Op {
    Prim(Prim, Attrs),
    Tuple,
    TupleGet(usize),
    Field(usize),
    ModelBuild,
    /// `let y: f32[N @mp] = x`: the same value under the layout its annotation writes (the
    /// sharding pass redistributes it); its derivative is the cotangent back in `x`'s layout.
    Relayout,
}

pub(super) enum Node {
    Op {
        out: Local,
        op: Op,
        args: Vec<Local>,
        span: SpanId,
    },
    If {
        cond: Local,
        then: Rc<Expr>,
        els: Rc<Expr>,
        ctx: Vec<FrameCx>,
        assigned: Vec<Local>,
        outs: Vec<Local>,
        free: Vec<Local>,
        span: SpanId,
    },
    Loop(Box<LoopNode>),
    /// A call of a `@recompute` function in reverse mode: none of its forward values are kept
    /// for the backward pass, which walks its body again (`ctx`: the frames with the callee's,
    /// binding its parameters to `free`) before running the body's backward.
    Recompute {
        body: Rc<Expr>,
        ctx: Vec<FrameCx>,
        out: Local,
        free: Vec<Local>,
        span: SpanId,
    },
    /// A call of a function with a `@custom_vjp`: its cotangent function runs in the backward.
    Custom {
        out: Local,
        args: Vec<Local>,
        bwd: FuncId,
        dims: Vec<Dim>,
        rests: Vec<crate::types::Shape>,
        span: SpanId,
    },
}

pub(super) struct LoopNode {
    /// `for`: the start and end values; `while`: `None` and the iteration count in `end`.
    pub start: Option<Local>,
    pub end: Local,
    pub ivar: Option<Local>,
    pub body: Rc<Expr>,
    pub ctx: Vec<FrameCx>,
    pub carried: Vec<Local>,
    pub init: Vec<Local>,
    pub outs: Vec<Local>,
    pub free: Vec<Local>,
    /// What the forward pass kept for the backward pass, or `None` when the backward pass
    /// recomputes each iteration's state from `init` (inside `@recompute`, and in twins).
    pub tape: Option<Tape>,
    pub span: SpanId,
}

/// What an active loop's forward pass keeps for its backward pass.
pub(super) enum Tape {
    /// Every value of an iteration that the iteration's backward pass reads (its residuals),
    /// as a reverse-mode `scan` keeps them: nothing is computed twice.
    Residuals(Box<Saved>),
    /// The state at the start of each iteration (a tuple of the carried values); the backward
    /// pass runs each iteration forward again from it. Used when the backward pass reads a
    /// value bound inside a nested block, or dims bound at run time inside the body.
    States(Local),
}

/// One iteration of a loop whose tape keeps its residuals.
pub(super) struct Saved {
    /// The tape after the loop: one tuple of `residuals` per iteration.
    pub tape: Local,
    /// The iteration's operations, in terms of its own locals (read from the tape).
    pub nodes: Vec<Node>,
    /// The state at the iteration's start and the carried values at its end.
    pub start: Vec<Local>,
    pub end: Vec<Local>,
    /// The forward loop's counter (the backward loop's counter stands in for it).
    pub iv: Local,
    pub residuals: Vec<Local>,
    /// Every local the forward body binds: the backward pass, renamed, reads none of them.
    pub bound: HashSet<Local>,
}

struct LoopState {
    carried: Vec<Local>,
    init: Vec<Local>,
    free: Vec<Local>,
    active: bool,
    ctx: Vec<FrameCx>,
    slots: Vec<Local>,
}

pub(super) struct Gen<'p> {
    pub prog: &'p Program,
    pub locals: Vec<LocalInfo>,
    blocks: Vec<Vec<Stmt>>,
    frames: Vec<FrameCx>,
    pub active: HashSet<Local>,
    /// Integer/boolean values computed from active ones, with the builtin that made them.
    tainted: HashMap<Local, &'static str>,
    /// Inside `stop_gradient(…)`: nothing is differentiated, so nothing is rejected.
    quiet: usize,
    closure_envs: HashMap<ClosureId, FrameCx>,
    /// Cotangents of single model fields, merged into one model value when the model's
    /// cotangent is needed (so `m.w1`, `m.b1`, … do not each build a whole zero model).
    field_contribs: FieldContribs,
    /// Forward mode differentiates through `@custom_vjp` functions by inlining them.
    no_custom: bool,
    /// Reverse mode keeps a tape of each active loop's states (O(n) backward for n
    /// iterations); without it the backward recomputes every state from the initial one
    /// (O(n²) work, O(1) memory), as inside `@recompute` functions.
    tape_loops: bool,
    /// Inside the trial backward pass that finds a loop's residuals (`loops::residuals_of`):
    /// nested loops only mark what their backward pass would read.
    dry: usize,
    /// Cotangents of one copy of a `copy_split` (`@copies`): (copy, copies, axis, the whole
    /// value's type). `sum` joins a value's copies in one `copy_join` instead of adding each
    /// one padded with zeros.
    pub(super) copy_parts: HashMap<Local, (usize, usize, Option<usize>, Type)>,
    pub span: Span,
    pub sid: SpanId,
}

/// Values of the forward pass that the backward pass reads: what must be kept in memory.
fn residuals(stmts: &[Stmt], split: usize) -> Vec<Local> {
    let mut defined = HashSet::new();
    for s in &stmts[..split.min(stmts.len())] {
        if let Stmt::Let { pat, .. } = s {
            defined.extend(pat.locals());
        }
    }
    let mut used = Vec::new();
    for s in &stmts[split.min(stmts.len())..] {
        if let Stmt::Let { value, .. } | Stmt::Assign { value, .. } | Stmt::Expr(value) = s {
            ir::walk::walk(value, &mut |e| {
                if let ExprKind::Local(l) = &e.kind {
                    if defined.contains(l) {
                        used.push(*l);
                    }
                }
            });
        }
    }
    used.sort();
    used.dedup();
    used
}

pub(super) fn generate(
    prog: &Program,
    f: FuncId,
    mode: Mode,
    span: Span,
    tape_loops: bool,
) -> Res<(ir::Func, Vec<Local>)> {
    let func = prog.func(f);
    let mut g = Gen {
        prog,
        locals: func.locals.iter().map(|l| LocalInfo { mutable: true, ..l.clone() }).collect(),
        blocks: vec![vec![]],
        frames: vec![],
        active: HashSet::new(),
        copy_parts: HashMap::new(),
        tainted: HashMap::new(),
        quiet: 0,
        closure_envs: HashMap::new(),
        field_contribs: HashMap::new(),
        no_custom: mode == Mode::Jvp,
        tape_loops,
        dry: 0,
        span,
        sid: func.span,
    };
    // Parameters and captured locals are copied into SSA values so the original slots are free.
    let mut env = HashMap::new();
    let mut inputs: Vec<Local> = func.params.clone();
    inputs.extend(free_locals(&func.body).into_iter().filter(|l| !func.params.contains(l)));
    for l in &inputs {
        let ty = func.locals[l.0 as usize].ty.clone();
        let v = g.emit(mk(ExprKind::Local(*l), ty.clone(), g.sid), ty, "in");
        env.insert(*l, v);
    }
    let recompute = is_recompute(prog, f);
    g.frames.push(FrameCx { env, subst: Subst::default(), base: 0, returned: None, recompute });
    let wrt: Vec<usize> = match mode {
        Mode::Grad { wrt } | Mode::ValueAndGrad { wrt } => vec![wrt],
        Mode::Pullback | Mode::Jvp | Mode::Vmap { .. } => (0..func.params.len()).collect(),
    };
    for &i in &wrt {
        let Some(p) = func.params.get(i) else { return Err(err(span, "`wrt` names no parameter")) };
        let v = g.frames[0].env[p];
        if is_float_type(&g.locals[v.0 as usize].ty) {
            g.active.insert(v);
        }
    }
    let mut tape = Vec::new();
    let r = g.fwd(&func.body, &mut tape)?;
    let r = g.frames[0].returned.unwrap_or(r);
    let rty = g.ty_of(r);
    if mode == Mode::Jvp {
        // Forward mode: one tangent parameter per parameter, swept forward over the tape.
        let mut params = func.params.clone();
        let mut tan = HashMap::new();
        for p in &func.params {
            let v = g.frames[0].env[p];
            let t = g.new_local(g.ty_of(v), "t", false);
            params.push(t);
            if g.active.contains(&v) {
                tan.insert(v, t);
            }
        }
        g.tangents(&tape, &mut tan)?;
        let tr = match tan.get(&r) {
            Some(t) => *t,
            None => g.zeros_like(r)?,
        };
        let ret = Type::Tuple(vec![rty.clone(), g.ty_of(tr)]);
        let result = mk(ExprKind::Tuple(vec![g.local(r), g.local(tr)]), ret.clone(), g.sid);
        let stmts = g.blocks.pop().unwrap_or_default();
        let body = mk(ExprKind::Block { stmts, result: Box::new(result) }, ret.clone(), g.sid);
        let out = ir::Func {
            name: func.name,
            dims: func.dims.clone(),
            rests: func.rests.clone(),
            models: func.models.clone(),
            n_captures: func.n_captures,
            params,
            ret,
            locals: g.locals,
            body,
            annotations: kept_annotations(prog, f),
            span: func.span,
        };
        return Ok((out, vec![]));
    }
    let mut params = func.params.clone();
    let seed = match mode {
        Mode::Pullback | Mode::Jvp => {
            let ct = g.new_local(rty.clone(), "ct", false);
            params.push(ct);
            ct
        }
        _ => {
            let et = match &rty {
                Type::Tensor(TensorTy { elem: Elem::T(t), .. }) => *t,
                _ => ElemTy::F32,
            };
            g.lit(1.0, et)
        }
    };
    let split = g.blocks[0].len();
    let mut contribs: HashMap<Local, Vec<Local>> = HashMap::new();
    if g.active.contains(&r) {
        contribs.entry(r).or_default().push(seed);
    }
    g.bwd(&tape, &mut contribs)?;
    let mut grads = Vec::new();
    for &i in &wrt {
        let v = g.frames[0].env[&func.params[i]];
        grads.push(g.total(v, &mut contribs)?);
    }
    // A tensor's gradient has its parameter's type, layout included (LANGUAGE.md §8: `grad` of
    // a sharded program has the layout of its parameter); the cotangent computed is made so.
    let gty: Vec<Type> = grads
        .iter()
        .zip(&wrt)
        .map(|(v, &i)| match (g.ty_of(*v), &func.locals[func.params[i].0 as usize].ty) {
            (Type::Tensor(got), Type::Tensor(p)) if got.shape == p.shape => Type::Tensor(p.clone()),
            (t, _) => t,
        })
        .collect();
    let (result, ret) = match mode {
        Mode::Grad { .. } => (g.local(grads[0]), gty[0].clone()),
        Mode::ValueAndGrad { .. } => {
            let t = Type::Tuple(vec![rty.clone(), gty[0].clone()]);
            (mk(ExprKind::Tuple(vec![g.local(r), g.local(grads[0])]), t.clone(), g.sid), t)
        }
        Mode::Pullback | Mode::Jvp | Mode::Vmap { .. } => {
            let t = Type::Tuple(gty.clone());
            (mk(ExprKind::Tuple(grads.iter().map(|v| g.local(*v)).collect()), t.clone(), g.sid), t)
        }
    };
    let stmts = g.blocks.pop().unwrap_or_default();
    let residuals = residuals(&stmts, split);
    let body = mk(ExprKind::Block { stmts, result: Box::new(result) }, ret.clone(), g.sid);
    let name = prog.names.get(func.name).to_string();
    let _ = name;
    Ok((
        ir::Func {
            name: func.name,
            dims: func.dims.clone(),
            rests: func.rests.clone(),
            models: func.models.clone(),
            n_captures: func.n_captures,
            params,
            ret,
            locals: g.locals,
            body,
            annotations: kept_annotations(prog, f),
            span: func.span,
        },
        residuals,
    ))
}

/// The annotations a derived function keeps from its function: `@recompute`, so that a
/// derivative of a recomputing function recomputes its loops again when differentiated again.
fn kept_annotations(prog: &Program, f: FuncId) -> Vec<ir::Name> {
    prog.func(f).annotations.iter().copied().filter(|a| prog.names.get(*a) == "recompute").collect()
}

/// Whether `f` is annotated `@recompute`.
fn is_recompute(prog: &Program, f: FuncId) -> bool {
    prog.func(f).annotations.iter().any(|a| prog.names.get(*a) == "recompute")
}

pub(super) fn mk(kind: ExprKind, ty: Type, span: SpanId) -> Expr {
    Expr::new(kind, ty, span)
}

pub(super) fn is_float_type(t: &Type) -> bool {
    match t {
        Type::Tensor(TensorTy { elem: e, .. }) => e.is_float(),
        Type::Model(..) | Type::ModelVar(_) => true,
        Type::Tuple(ts) => ts.iter().any(is_float_type),
        _ => false,
    }
}

/// Locals read in `e` that no `let`, pattern or loop inside `e` defines.
pub(super) fn free_locals(e: &Expr) -> Vec<Local> {
    let mut defined = HashSet::new();
    let mut used = Vec::new();
    collect_locals(e, &mut defined, &mut used);
    let mut out: Vec<Local> = used.into_iter().filter(|l| !defined.contains(l)).collect();
    out.sort();
    out.dedup();
    out
}

fn collect_locals(e: &Expr, defined: &mut HashSet<Local>, used: &mut Vec<Local>) {
    ir::walk::walk(e, &mut |x| match &x.kind {
        ExprKind::Local(l) => used.push(*l),
        ExprKind::Block { stmts, .. } => {
            for s in stmts {
                if let Stmt::Let { pat, .. } = s {
                    defined.extend(pat.locals());
                }
            }
        }
        ExprKind::ForRange { var, .. } => {
            defined.insert(*var);
        }
        ExprKind::ForBatches { vars, .. } => defined.extend(vars.iter().copied()),
        ExprKind::Closure { captures, .. } => used.extend(captures.iter().copied()),
        _ => {}
    });
}

/// Outer locals that `e` assigns (`x = …` to a `var` declared outside `e`).
fn assigned_locals(e: &Expr) -> Vec<Local> {
    let mut defined = HashSet::new();
    let mut assigned = Vec::new();
    ir::walk::walk(e, &mut |x| {
        if let ExprKind::Block { stmts, .. } = &x.kind {
            for s in stmts {
                match s {
                    Stmt::Let { pat, .. } => defined.extend(pat.locals()),
                    Stmt::Assign { pat, .. } => assigned.extend(pat.locals()),
                    _ => {}
                }
            }
        }
    });
    let mut out: Vec<Local> = assigned.into_iter().filter(|l| !defined.contains(l)).collect();
    out.sort();
    out.dedup();
    out
}

/// Cotangent contributions to single fields of a model value, merged when it is taken.
pub(in crate::autodiff) type FieldContribs = HashMap<Local, HashMap<usize, Vec<Local>>>;

impl Gen<'_> {
    pub fn new_local(&mut self, ty: Type, name: &str, mutable: bool) -> Local {
        let _ = name;
        // Generated locals have no source name; printers call them `v_N`.
        self.locals.push(LocalInfo { name: ir::Name(u32::MAX), ty, mutable });
        Local(self.locals.len() as u32 - 1)
    }

    pub fn ty_of(&self, l: Local) -> Type {
        self.locals[l.0 as usize].ty.clone()
    }

    pub fn local(&self, l: Local) -> Expr {
        mk(ExprKind::Local(l), self.ty_of(l), self.sid)
    }

    /// Emits `let v = e` and returns `v`.
    pub fn emit(&mut self, e: Expr, ty: Type, name: &str) -> Local {
        let v = self.new_local(ty, name, false);
        self.blocks.last_mut().unwrap().push(Stmt::Let { pat: Pat::Local(v), value: e });
        v
    }

    pub fn push_stmt(&mut self, s: Stmt) {
        self.blocks.last_mut().unwrap().push(s);
    }

    /// Emits a primitive application on locals (at the function's span: generated code).
    pub fn p(&mut self, prim: Prim, args: &[Local], attrs: Attrs, ty: Type) -> Local {
        self.p_at(prim, args, attrs, ty, self.sid)
    }

    /// Emits a primitive application on locals at `span`: the source expression it replays, so
    /// that a run-time error or a `--trace` event of the derivative's forward pass names it.
    pub fn p_at(&mut self, prim: Prim, args: &[Local], attrs: Attrs, ty: Type, span: SpanId) -> Local {
        let a = args.iter().map(|l| self.local(*l)).collect();
        let e = mk(ExprKind::Prim { prim, args: a, attrs: Box::new(attrs) }, ty.clone(), span);
        self.emit(e, ty, "t")
    }

    pub fn lit(&mut self, x: f64, et: ElemTy) -> Local {
        let ty = Type::scalar(et);
        self.emit(mk(ExprKind::Lit(Lit::Float(x)), ty.clone(), self.sid), ty, "c")
    }

    fn frame(&self) -> &FrameCx {
        self.frames.last().unwrap()
    }

    pub(super) fn replace_frames(&mut self, f: Vec<FrameCx>) -> Vec<FrameCx> {
        std::mem::replace(&mut self.frames, f)
    }

    pub(super) fn push_block(&mut self) {
        self.blocks.push(vec![]);
    }

    pub(super) fn pop_block(&mut self) -> Vec<Stmt> {
        self.blocks.pop().unwrap_or_default()
    }

    /// `{ stmts }`, of type `()`.
    pub(super) fn unit_block(&self, stmts: Vec<Stmt>) -> Expr {
        mk(
            ExprKind::Block { stmts, result: Box::new(mk(ExprKind::Tuple(vec![]), Type::unit(), self.sid)) },
            Type::unit(),
            self.sid,
        )
    }

    /// Appends `for var in start..end body` to the current block.
    pub(super) fn push_for(&mut self, var: Local, start: Local, end: Local, body: Expr) {
        let (start, end) = (Box::new(self.local(start)), Box::new(self.local(end)));
        let e = mk(ExprKind::ForRange { var, start, end, body: Box::new(body) }, Type::unit(), self.sid);
        self.push_stmt(Stmt::Expr(e));
    }

    pub(super) fn env_of(&self, l: Local) -> Local {
        self.frame().env.get(&l).copied().unwrap_or(l)
    }

    pub(super) fn bind_env(&mut self, l: Local, v: Local) {
        self.bind(l, v);
    }

    fn sty(&self, t: &Type) -> Type {
        self.frame().subst.ty(t)
    }

    fn sattrs(&self, a: &Attrs) -> Attrs {
        let mut a = a.clone();
        a.shape = a.shape.iter().map(|d| self.frame().subst.dim(d)).collect();
        a
    }

    fn lookup(&self, l: Local) -> Res<Local> {
        self.frame().env.get(&l).copied().ok_or_else(|| err(self.span, "internal: a value used before its definition"))
    }

    fn bind(&mut self, l: Local, v: Local) {
        self.frames.last_mut().unwrap().env.insert(l, v);
    }

    fn is_active(&self, v: Local) -> bool {
        self.active.contains(&v)
    }

    /// Copies an expression whose values are all inactive into the generated function:
    /// locals it reads come from the current SSA values; locals it defines get their own slots.
    fn copy_expr(&mut self, e: &Expr) -> Res<Expr> {
        let base = self.frame().base;
        let defined: HashSet<Local> = {
            let all = free_locals(e);
            let mut used = HashSet::new();
            ir::walk::walk(e, &mut |x| {
                if let ExprKind::Local(l) = &x.kind {
                    used.insert(*l);
                }
            });
            used.into_iter().filter(|l| !all.contains(l)).collect()
        };
        let mut defs = defined;
        // Locals written by patterns and loops also live in the copied slots.
        ir::walk::walk(e, &mut |x| match &x.kind {
            ExprKind::Block { stmts, .. } => {
                for s in stmts {
                    if let Stmt::Let { pat, .. } | Stmt::Assign { pat, .. } = s {
                        defs.extend(pat.locals());
                    }
                }
            }
            ExprKind::ForRange { var, .. } => {
                defs.insert(*var);
            }
            ExprKind::ForBatches { vars, .. } => defs.extend(vars.iter().copied()),
            _ => {}
        });
        let env = self.frame().env.clone();
        let subst = self.frame().subst.clone();
        let map = |l: Local| -> Local {
            if defs.contains(&l) {
                Local(base + l.0)
            } else {
                env.get(&l).copied().unwrap_or(Local(base + l.0))
            }
        };
        Ok(remap(e, &map, &subst))
    }

    /// The forward walk: emits `e` into the current block and returns the local holding it.
    pub(super) fn fwd(&mut self, e: &Expr, tape: &mut Vec<Node>) -> Res<Local> {
        let ty = self.sty(&e.ty);
        match &e.kind {
            ExprKind::Local(l) => self.lookup(*l),
            ExprKind::Lit(_)
            | ExprKind::Const(_)
            | ExprKind::DimValue(_)
            | ExprKind::FuncRef(_)
            | ExprKind::ModelInit { .. } => {
                let c = self.copy_expr(e)?;
                Ok(self.emit(c, ty, "k"))
            }
            ExprKind::Prim { prim, args, attrs } => {
                let mut vs = Vec::with_capacity(args.len());
                let quiet = usize::from(*prim == Prim::StopGradient);
                self.quiet += quiet;
                for a in args {
                    let v = self.fwd(a, tape);
                    if v.is_err() {
                        self.quiet -= quiet;
                    }
                    vs.push(v?);
                }
                self.quiet -= quiet;
                let mut attrs = self.sattrs(attrs);
                if attrs.from_end {
                    let s = match self.ty_of(vs[0]) {
                        Type::Tensor(TensorTy { shape: s, .. }) => s,
                        _ => vec![],
                    };
                    if s.iter().any(|i| matches!(i, ShapeItem::Rest(_))) {
                        return Err(err(self.prog.span(e.span), "cannot differentiate a reduction over `axis: -k` of a `..` rest; call it with a tensor of known rank"));
                    }
                    attrs.axis = attrs.axis.map(|k| s.len().saturating_sub(k));
                    attrs.from_end = false;
                }
                let out = self.p_at(*prim, &vs, attrs.clone(), ty.clone(), e.span);
                self.mark(*prim, &vs, out, &ty, e)?;
                if self.is_active(out) {
                    tape.push(Node::Op { out, op: Op::Prim(*prim, attrs), args: vs, span: e.span });
                }
                Ok(out)
            }
            ExprKind::Call { func, dims, rests, args } => {
                let mut vs = Vec::with_capacity(args.len());
                for a in args {
                    vs.push(self.fwd(a, tape)?);
                }
                let callee = self.prog.func(*func);
                if let Some(&bwd) = self.prog.custom_vjp.get(func).filter(|_| !self.no_custom) {
                    let dims: Vec<Dim> = dims.iter().map(|d| self.frame().subst.dim(d)).collect();
                    let rests: Vec<crate::types::Shape> = rests.iter().map(|r| self.frame().subst.shape(r)).collect();
                    let call = mk(
                        ExprKind::Call {
                            func: *func,
                            dims: dims.clone(),
                            rests: rests.clone(),
                            args: vs.iter().map(|v| self.local(*v)).collect(),
                        },
                        ty.clone(),
                        e.span,
                    );
                    let out = self.emit(call, ty.clone(), "call");
                    if vs.iter().any(|v| self.is_active(*v)) && is_float_type(&ty) {
                        self.active.insert(out);
                        tape.push(Node::Custom { out, args: vs, bwd, dims, rests, span: e.span });
                    }
                    return Ok(out);
                }
                let mut subst = Subst::default();
                for (s, d) in callee.dims.iter().zip(dims) {
                    subst.dims.insert(*s, self.frame().subst.dim(d));
                }
                for (r, sh) in callee.rests.iter().zip(rests) {
                    subst.rests.insert(*r, self.frame().subst.shape(sh));
                }
                subst.models = self.infer_subst(*func, &vs).models;
                self.inline(*func, vs, subst, None, tape)
            }
            ExprKind::CallValue { callee, target, args } => {
                let mut vs = Vec::with_capacity(args.len());
                for a in args {
                    vs.push(self.fwd(a, tape)?);
                }
                let any_active = vs.iter().any(|v| self.is_active(*v)) || self.closure_captures_active(callee);
                let func = super::target_func(self.prog, target);
                match func {
                    Some(f) => {
                        let f = self.prog.derived.transformable(f);
                        let closure = self.closure_of(callee, target);
                        let subst = self.infer_subst(f, &vs);
                        self.inline(f, vs, subst, closure, tape)
                    }
                    None if !any_active => {
                        let c = self.copy_expr(e)?;
                        Ok(self.emit(c, ty, "v"))
                    }
                    None => Err(err(self.prog.span(e.span), "cannot differentiate through this call yet (`vmap` or a function value known only at run time)")),
                }
            }
            ExprKind::Closure { id, .. } => {
                let fr = self.frame().clone();
                self.closure_envs.insert(*id, fr);
                let c = self.copy_expr(e)?;
                Ok(self.emit(c, ty, "f"))
            }
            ExprKind::Transform { .. } | ExprKind::Jvp { .. } | ExprKind::Vjp { .. } | ExprKind::ForBatches { .. } => {
                let fl = free_locals(e);
                let active = fl.iter().any(|l| self.frame().env.get(l).is_some_and(|v| self.active.contains(v)));
                if active {
                    return Err(err(self.prog.span(e.span), "cannot differentiate through this construct yet"));
                }
                let c = self.copy_expr(e)?;
                Ok(self.emit(c, ty, "v"))
            }
            ExprKind::Tuple(items) => {
                let mut vs = Vec::new();
                for a in items {
                    vs.push(self.fwd(a, tape)?);
                }
                let out = self.emit(
                    mk(ExprKind::Tuple(vs.iter().map(|v| self.local(*v)).collect()), ty.clone(), e.span),
                    ty,
                    "tup",
                );
                self.structural(out, Op::Tuple, vs, e.span, tape);
                Ok(out)
            }
            ExprKind::TupleGet(a, i) => {
                let v = self.fwd(a, tape)?;
                let out = self.emit(
                    mk(ExprKind::TupleGet(Box::new(self.local(v)), *i), ty.clone(), e.span),
                    ty.clone(),
                    "get",
                );
                if self.is_active(v) && is_float_type(&ty) {
                    self.active.insert(out);
                    tape.push(Node::Op { out, op: Op::TupleGet(*i), args: vec![v], span: e.span });
                }
                Ok(out)
            }
            ExprKind::Field(a, i) => {
                let v = self.fwd(a, tape)?;
                let out =
                    self.emit(mk(ExprKind::Field(Box::new(self.local(v)), *i), ty.clone(), e.span), ty.clone(), "fld");
                if self.is_active(v) && is_float_type(&ty) {
                    self.active.insert(out);
                    tape.push(Node::Op { out, op: Op::Field(*i), args: vec![v], span: e.span });
                }
                Ok(out)
            }
            ExprKind::ModelBuild { fields } => {
                let mut vs = Vec::new();
                for a in fields {
                    vs.push(self.fwd(a, tape)?);
                }
                let out = self.emit(
                    mk(
                        ExprKind::ModelBuild { fields: vs.iter().map(|v| self.local(*v)).collect() },
                        ty.clone(),
                        e.span,
                    ),
                    ty,
                    "mdl",
                );
                self.structural(out, Op::ModelBuild, vs, e.span, tape);
                Ok(out)
            }
            ExprKind::Block { stmts, result } => {
                for (i, s) in stmts.iter().enumerate() {
                    if self.frame().returned.is_some() {
                        break;
                    }
                    // `if c { …; return a } rest` is `if c { …; a } else { rest }` (and the
                    // mirror): the early return becomes the value of a branch.
                    if let Some(joined) = join_early_return(s, &stmts[i + 1..], result) {
                        let r = self.fwd(&joined, tape)?;
                        self.frames.last_mut().unwrap().returned = Some(r);
                        return Ok(r);
                    }
                    self.stmt(s, tape)?;
                }
                if let Some(r) = self.frame().returned {
                    return Ok(r);
                }
                self.fwd(result, tape)
            }
            ExprKind::Return(v) => {
                let r = self.fwd(v, tape)?;
                self.frames.last_mut().unwrap().returned = Some(r);
                Ok(r)
            }
            ExprKind::If { cond, then, els } => self.fwd_if(e, cond, then, els, tape),
            ExprKind::ForRange { var, start, end, body } => {
                let s = self.fwd(start, tape)?;
                let en = self.fwd(end, tape)?;
                self.fwd_loop(e, Some(s), en, Some(*var), None, body, tape)
            }
            ExprKind::While { cond, body } => self.fwd_while(e, cond, body, tape),
        }
    }

    fn closure_captures_active(&self, callee: &Expr) -> bool {
        free_locals(callee).iter().any(|l| self.frame().env.get(l).is_some_and(|v| self.active.contains(v)))
    }

    /// The closure a call goes to, when the callee is a closure created in this function.
    fn closure_of(&self, _callee: &Expr, target: &FnTarget) -> Option<ClosureId> {
        let f = super::innermost(target)?;
        self.prog.closures.iter().position(|c| c.instances.iter().any(|(_, g)| *g == f)).map(|i| ClosureId(i as u32))
    }

    /// Generic dims of a function called through a value, from the argument types.
    fn infer_subst(&self, f: FuncId, args: &[Local]) -> Subst {
        let func = self.prog.func(f);
        let generic: HashSet<_> = func.dims.iter().copied().collect();
        let mut u = Unifier::new(&generic);
        for (p, a) in func.params.iter().zip(args) {
            let _ = u.ty(&func.locals[p.0 as usize].ty, &self.ty_of(*a));
        }
        let _ = u.finish();
        u.subst
    }

    /// Inlines a call: the callee's body is walked with its parameters bound to `args`.
    fn inline(
        &mut self,
        f: FuncId,
        args: Vec<Local>,
        subst: Subst,
        closure: Option<ClosureId>,
        tape: &mut Vec<Node>,
    ) -> Res<Local> {
        if self.frames.len() > 200 {
            return Err(err(self.span, "calls nested too deeply to differentiate"));
        }
        // A derived function that keeps tapes is transformed again through its recomputing twin.
        let f = self.prog.derived.transformable(f);
        let func = self.prog.func(f);
        let base = self.locals.len() as u32;
        for l in &func.locals {
            let ty = subst.ty(&l.ty);
            let ty = self.frame().subst.ty(&ty);
            self.locals.push(LocalInfo { name: l.name, ty, mutable: true });
        }
        let mut env = match closure.and_then(|c| self.closure_envs.get(&c)) {
            Some(fr) => fr.env.clone(),
            None => HashMap::new(),
        };
        // Captured locals of a closure made outside this derivation read their slots directly.
        for l in free_locals(&func.body) {
            if !func.params.contains(&l) && !env.contains_key(&l) {
                if let Some(v) = self.frames[0].env.get(&l) {
                    env.insert(l, *v);
                }
            }
        }
        for (p, a) in func.params.iter().zip(&args) {
            env.insert(*p, *a);
        }
        let mut flat = Subst::default();
        for (s, d) in &subst.dims {
            flat.dims.insert(*s, self.frame().subst.dim(d));
        }
        for (r, sh) in &subst.rests {
            flat.rests.insert(*r, self.frame().subst.shape(sh));
        }
        for (v, t) in &subst.models {
            flat.models.insert(*v, self.frame().subst.ty(t));
        }
        for (v, t) in &self.frame().subst.models {
            flat.models.entry(*v).or_insert_with(|| t.clone());
        }
        if let Some(c) = closure.and_then(|c| self.closure_envs.get(&c)) {
            for (s, d) in &c.subst.dims {
                flat.dims.entry(*s).or_insert_with(|| d.clone());
            }
        } else {
            for (s, d) in &self.frame().subst.dims {
                flat.dims.entry(*s).or_insert_with(|| d.clone());
            }
        }
        let recompute = self.frame().recompute || is_recompute(self.prog, f);
        // Reverse mode through a plain call of a `@recompute` function: its own tape is
        // dropped, and the backward pass recomputes the body from the arguments.
        let free: Vec<Local> = {
            let mut v: Vec<Local> = env.values().copied().collect();
            v.sort();
            v.dedup();
            v
        };
        let lean = is_recompute(self.prog, f) && !self.no_custom && closure.is_none();
        self.frames.push(FrameCx { env, subst: flat, base, returned: None, recompute });
        let ctx = if lean { self.frames.clone() } else { Vec::new() };
        let mut own = Vec::new();
        let r = self.fwd(&func.body, if lean { &mut own } else { tape });
        let fr = self.frames.pop().unwrap();
        let r = fr.returned.unwrap_or(r?);
        if lean && !own.is_empty() {
            let span = self.prog.funcs[f.0 as usize].span;
            tape.push(Node::Recompute { body: Rc::new(func.body.clone()), ctx, out: r, free, span });
        }
        Ok(r)
    }

    fn stmt(&mut self, s: &Stmt, tape: &mut Vec<Node>) -> Res<()> {
        match s {
            Stmt::Let { pat, value } | Stmt::Assign { pat, value } => {
                let fresh = self.locals.len();
                let v = self.fwd(value, tape)?;
                if let (Stmt::Let { .. }, Pat::Local(l)) = (s, pat) {
                    // An annotated layout is kept, so that the derived program is sharded as its
                    // source is: on the value's own local when this statement made it (then a
                    // partial sum can still be reduce-scattered), on a copy otherwise.
                    let declared = self.locals[(self.frame().base + l.0) as usize].ty.clone();
                    if crate::shard::has_layout(&declared)
                        && crate::shard::layout(&declared) != crate::shard::layout(&self.ty_of(v))
                    {
                        if v.0 as usize >= fresh {
                            self.locals[v.0 as usize].ty = declared;
                            self.bind(*l, v);
                            return Ok(());
                        }
                        let out = self.emit(mk(ExprKind::Local(v), declared.clone(), self.sid), declared, "relayout");
                        if self.is_active(v) {
                            self.active.insert(out);
                            tape.push(Node::Op { out, op: Op::Relayout, args: vec![v], span: self.sid });
                        }
                        self.bind(*l, out);
                        return Ok(());
                    }
                }
                self.bind_pat(pat, v, tape);
                Ok(())
            }
            Stmt::Expr(e) => self.fwd(e, tape).map(|_| ()),
            Stmt::BindDims { local, dims, rank, span } => {
                let v = self.lookup(*local)?;
                let slot = Local(self.frame().base + local.0);
                let ty = self.ty_of(v);
                self.locals[slot.0 as usize].ty = ty;
                self.push_stmt(Stmt::Assign { pat: Pat::Local(slot), value: self.local(v) });
                self.push_stmt(Stmt::BindDims { local: slot, dims: dims.clone(), rank: *rank, span: *span });
                Ok(())
            }
        }
    }

    fn bind_pat(&mut self, pat: &Pat, v: Local, tape: &mut Vec<Node>) {
        match pat {
            Pat::Local(l) => self.bind(*l, v),
            Pat::Ignore => {}
            Pat::Tuple(ps) => {
                let Type::Tuple(ts) = self.ty_of(v) else { return };
                for (i, (p, t)) in ps.iter().zip(ts).enumerate() {
                    let out = self.emit(
                        mk(ExprKind::TupleGet(Box::new(self.local(v)), i), t.clone(), self.sid),
                        t.clone(),
                        "get",
                    );
                    if self.is_active(v) && is_float_type(&t) {
                        self.active.insert(out);
                        tape.push(Node::Op { out, op: Op::TupleGet(i), args: vec![v], span: self.sid });
                    }
                    self.bind_pat(p, out, tape);
                }
            }
        }
    }

    fn structural(&mut self, out: Local, op: Op, vs: Vec<Local>, span: SpanId, tape: &mut Vec<Node>) {
        if vs.iter().any(|v| self.is_active(*v)) {
            self.active.insert(out);
            tape.push(Node::Op { out, op, args: vs, span });
        }
    }

    /// Activity of a primitive's result, and the non-differentiable-builtin check.
    fn mark(&mut self, prim: Prim, args: &[Local], out: Local, ty: &Type, e: &Expr) -> Res<()> {
        let span = self.prog.span(e.span);
        if self.quiet > 0 {
            return Ok(());
        }
        let any_active = args.iter().any(|a| self.is_active(*a));
        let out_float = is_float_type(ty);
        // Integers and booleans computed from tainted ones stay tainted (`argmax(x) == y`).
        if !out_float && !any_active {
            if let Some(name) = args.iter().find_map(|a| self.tainted.get(a)).copied() {
                self.tainted.insert(out, name);
            }
        }
        // A float value made from an integer or boolean that depends on what is differentiated.
        if out_float && matches!(prim, Prim::Cast | Prim::OneHot) {
            if let Some(name) = args.first().and_then(|a| self.tainted.get(a)) {
                return Err(err(
                    span,
                    format!("cannot differentiate through `{name}`: its result is not differentiable"),
                )
                .with_help("wrap the non-differentiable part in `stop_gradient(…)` if no gradient should flow"));
            }
        }
        if !any_active || prim == Prim::StopGradient || prim.has_effect() {
            return Ok(());
        }
        if !out_float {
            let name = if prim == Prim::Cast { "i32" } else { prim.symbol().unwrap_or(prim.name()) };
            self.tainted.insert(out, name);
            return Ok(());
        }
        if !prim.differentiable() || matches!(prim, Prim::Map | Prim::Params | Prim::ModelSum) {
            let name = if prim == Prim::ModelSum { "sum` of a model".to_string() } else { format!("{}`", prim.name()) };
            return Err(err(span, format!("cannot differentiate through `{name}: it has no derivative"))
                .with_help("wrap it in `stop_gradient(…)` if no gradient should flow through it"));
        }
        // `where`'s condition and `gather`'s indices carry no gradient; the value operands do.
        self.active.insert(out);
        Ok(())
    }
}
