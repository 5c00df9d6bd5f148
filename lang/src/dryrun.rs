//! `msl dryrun`: what every rank of a partitioned program holds and sends, from the typed IR
//! alone: no kernel runs and no data is read beyond the headers of the files `load` names.
//!
//! The walk starts at `main` with the dims it knows (constants, and run-time dims bound from
//! file headers), follows every call with its callee's dims bound from the call (a direct
//! call's instantiation, or the argument types matched against the parameters), and counts
//! each collective the sharding pass inserted: its bytes (this rank's block, as `Spmd` counts
//! them) times the number of times it runs (loops with known trip counts multiply; `if` takes
//! its costlier branch). The *training step* is one iteration of the innermost loop whose body
//! calls a gradient (`grad`, `value_and_grad`, a pullback), directly or through a function.
//! Memory comes from the static memory plans (`ir::memplan`, per rank for a sharded program):
//! a function's peak is the larger of its own plan's peak and, at each call, what is live
//! around the call plus the callee's peak.

use crate::dist::Mesh;
use crate::ir::derived::target_func;
use crate::ir::memplan::{self, MemPlan};
use crate::ir::{walk, Expr, ExprId, ExprKind, FnTarget, Lit, Local, Pat, Prim, Program, SpanId, Stmt};
use crate::shard::zero::{is_optimizer_step, kind_of, offloaded_locals, sharded_locals, Kind};
use crate::types::{AxisId, Dim, FuncId, ShapeItem, Sym, Type, TypeArg};
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;

/// Concrete values of dims.
pub type Env = HashMap<Sym, i64>;

/// The model types bound to a frame's model type parameters (`M` of `adam.step[M: Model]`).
type Models = HashMap<crate::types::TyVar, Type>;

/// Where `load` finds its files: the working directory first, then the source's folder.
#[derive(Clone, Debug, Default)]
pub struct Files {
    pub work_dir: PathBuf,
    pub source_dir: Option<PathBuf>,
}

/// Bytes one rank holds (every rank alike: blocks are equal by the divisibility rules).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Memory {
    /// Models held during the training step, other than optimizer states.
    pub parameters: u64,
    /// The gradient the step's gradient call returns.
    pub gradients: u64,
    /// Values of a model type generic over a model (`AdamState[M]`, `MomentumState[M]` …).
    pub optimizer: u64,
    /// Every other tensor live around the step (loaded data, batches, results kept).
    pub data: u64,
    /// The most bytes the gradient computation holds at once beyond the gradient it returns.
    pub activations: u64,
    /// The most bytes live at once anywhere in the run.
    pub peak: u64,
    /// Optimizer state kept in host memory (`offload: host`): in none of the figures above.
    pub host: u64,
}

/// A kind of collective over some mesh axes.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct CommKey {
    pub kind: &'static str,
    pub axes: Vec<String>,
}

/// Calls of a collective and the bytes they send from one rank.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Comm {
    pub calls: u64,
    pub bytes: u64,
}

/// Communication by kind and axes.
pub type Traffic = BTreeMap<CommKey, Comm>;

/// The training step the report is about.
#[derive(Clone, Debug)]
pub struct Step {
    /// The loop whose one iteration is a step (`None`: `main` itself, which has no such loop).
    pub lp: Option<SpanId>,
    /// What computes the gradient (`value_and_grad(loss)`).
    pub grad: String,
    /// Times the step runs in the whole program, where the loop counts are known.
    pub count: Option<u64>,
}

/// What `msl dryrun` reports.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// Run-time dims bound from file headers: name, value, file.
    pub dims: Vec<(String, i64, String)>,
    /// What could not be known exactly (dims without a header, loops of unknown length …).
    pub notes: Vec<String>,
    /// Sizes that do not split over their axes: the run would stop there (exit 2).
    pub errors: Vec<String>,
    pub step: Option<Step>,
    pub memory: Memory,
    pub per_step: Traffic,
    pub per_run: Traffic,
    /// Multiply-adds × 2 of the products (`@`, `einsum`, `conv2d`) one rank runs in a step.
    pub step_flops: f64,
}

/// Walks `main` of a partitioned program (see the module documentation).
pub fn run(prog: &Program, sources: &crate::source::SourceMap, files: &Files) -> Report {
    let mut cx = Cx {
        prog,
        sources,
        mesh: Mesh::of(prog),
        files,
        plans: HashMap::new(),
        grads: HashMap::new(),
        report: Report::default(),
        step_found: false,
        flops: 0.0,
        noted: std::collections::HashSet::new(),
        stack: Vec::new(),
        zero: crate::shard::zero::ZeroPlan::of(prog),
        defers: Vec::new(),
        next_defer: None,
        fed: Default::default(),
    };
    let Some(main) = prog.main else { return cx.report };
    let env = cx.frame_env(main, Env::new());
    let mut run = Traffic::new();
    let count = cx.func(main, &env, 1, &mut run, 0);
    cx.report.per_run = run;
    if !cx.step_found {
        // No loop calls a gradient: the step is `main` itself (or there is none).
        let mut t = Traffic::new();
        cx.flops = 0.0;
        cx.func(main, &env, 1, &mut t, 0);
        cx.report.step_flops = cx.flops;
        cx.report.per_step = t;
        if let Some(g) = cx.grad_name(&prog.func(main).body, &env) {
            cx.report.step = Some(Step { lp: None, grad: g, count: Some(1) });
        }
    }
    if let Some(s) = cx.report.step.as_mut() {
        if s.lp.is_some() {
            s.count = count;
        }
    }
    cx.memory(main, &env);
    cx.report
}

struct Cx<'p> {
    prog: &'p Program,
    sources: &'p crate::source::SourceMap,
    mesh: Option<Mesh>,
    files: &'p Files,
    plans: HashMap<(FuncId, String), MemPlan>,
    /// Whether a function calls a gradient, directly or through its callees (memo).
    grads: HashMap<FuncId, bool>,
    report: Report,
    step_found: bool,
    flops: f64,
    noted: std::collections::HashSet<String>,
    /// The functions being walked, innermost last.
    stack: Vec<FuncId>,
    /// Gradients that reach sharded optimizer steps (`shard::zero`): the sums each function
    /// being walked leaves partial (as `stack`), the next callee's, and the state locals that
    /// such a gradient reaches, whose steps reduce-scatter it.
    zero: crate::shard::zero::ZeroPlan,
    defers: Vec<Option<(AxisId, Option<usize>)>>,
    next_defer: Option<(AxisId, Option<usize>)>,
    fed: std::collections::HashSet<(FuncId, Local)>,
}

/// Calls deeper than this are not followed (recursion is rejected by the checker; this bounds
/// generated chains).
const MAX_DEPTH: usize = 48;

fn eval_i(d: &Dim, env: &Env) -> Option<i64> {
    let v = d.subst(&|s| env.get(&s).map(|&x| Dim::constant(x)));
    if v.overflows() {
        return None;
    }
    v.as_const()
}

impl<'p> Cx<'p> {
    fn note(&mut self, s: String) {
        if self.noted.insert(s.clone()) {
            self.report.notes.push(s);
        }
    }

    fn place(&self, span: SpanId) -> String {
        let s = self.prog.span(span);
        let (line, col) = self.sources.line_col(s.file, s.start);
        format!("{}:{line}:{col}", self.sources.name(s.file))
    }

    /// The dims of a frame of `f`: those its caller bound, then the run-time dims its body binds
    /// from loaded files (read from their headers).
    fn frame_env(&mut self, f: FuncId, mut env: Env) -> Env {
        let prog = self.prog;
        let Some(func) = prog.funcs.get(f.0 as usize) else { return env };
        let mut loads: HashMap<Local, (String, Option<Vec<usize>>)> = HashMap::new();
        let mut binds = Vec::new();
        walk::walk(&func.body, &mut |e| {
            if let ExprKind::Block { stmts, .. } = &e.kind {
                for s in stmts {
                    match s {
                        Stmt::Let { pat: Pat::Local(l), value } => {
                            if let Some(path) = load_path(value) {
                                loads.insert(*l, (path, None));
                            }
                        }
                        Stmt::BindDims { local, dims, .. } => binds.push((*local, dims.clone())),
                        _ => {}
                    }
                }
            }
        });
        for (local, dims) in binds {
            let Some((path, shape)) = loads.get_mut(&local) else { continue };
            if shape.is_none() {
                *shape = Some(self.header(path).unwrap_or_default());
            }
            let shape = shape.clone().unwrap_or_default();
            let path = path.clone();
            for (i, sym, _) in dims {
                let Some(s) = sym else { continue };
                let name = prog.sym_names.get(s.0 as usize).cloned().unwrap_or_default();
                match shape.get(i) {
                    Some(&n) => {
                        env.insert(s, n as i64);
                        if !self.report.dims.iter().any(|(d, _, _)| *d == name) {
                            self.report.dims.push((name, n as i64, path.clone()));
                        }
                    }
                    None => self.note(format!("`{name}` is not known: `{path}` has no header that gives its size")),
                }
            }
        }
        self.check_splits(f, &env);
        env
    }

    /// Records every dim of `f`'s values whose size, known from `env`, does not split into
    /// equal blocks over its axes (what the run checks when the dim is bound).
    fn check_splits(&mut self, f: FuncId, env: &Env) {
        let (prog, Some(mesh)) = (self.prog, self.mesh.clone()) else { return };
        let Some(func) = prog.funcs.get(f.0 as usize) else { return };
        for l in &func.locals {
            let Type::Tensor(tt) = &l.ty else { continue };
            for (i, item) in tt.shape.iter().enumerate() {
                let (ShapeItem::Dim(d), Some(axes)) = (item, tt.layout.0.get(i)) else { continue };
                let parts = mesh.parts(axes);
                let Some(v) = eval_i(d, env) else { continue };
                if parts > 1 && v % parts != 0 {
                    let names: Vec<String> =
                        axes.iter().map(|a| format!("{} = {}", mesh.names[a.0 as usize], mesh.size(*a))).collect();
                    let e = format!(
                        "`{}` is {v} in `{}`, which does not split into {parts} equal blocks over {}",
                        crate::types::dim_str(d, prog),
                        memplan::func_name(prog, f),
                        names.join(", ")
                    );
                    if !self.report.errors.contains(&e) {
                        self.report.errors.push(e);
                    }
                }
            }
        }
    }

    /// The shape in the header of the file `load(path)` reads; `None` (with a note) when it
    /// cannot be read or has no header (a `.csv` file).
    fn header(&mut self, p: &str) -> Option<Vec<usize>> {
        let (file, entry) = crate::interp::split_entry(p);
        let full = crate::interp::resolve_path(Some(&self.files.work_dir), self.files.source_dir.as_deref(), file);
        match kernels::io::shape_of(&full, entry) {
            Ok(Some(s)) => Some(s),
            Ok(None) => None,
            Err(e) => {
                self.note(format!("{e}"));
                None
            }
        }
    }

    /// The callee of a call expression and its frame's dims; `None` for a call resolved only
    /// at run time.
    fn callee(&mut self, e: &'p Expr, env: &Env) -> Option<(FuncId, Env)> {
        let (f, args, inst) = match &e.kind {
            ExprKind::Call { func, dims, args, .. } => (*func, args, Some(dims)),
            ExprKind::CallValue { target, args, .. } => (target_func(self.prog, target)?, args, None),
            _ => return None,
        };
        let func = self.prog.funcs.get(f.0 as usize)?;
        let mut out = Env::new();
        if let Some(dims) = inst {
            for (s, d) in func.dims.iter().zip(dims) {
                if let Some(v) = eval_i(d, env) {
                    out.insert(*s, v);
                }
            }
        }
        let skip = if inst.is_some() { 0 } else { func.n_captures };
        for (p, a) in func.params.iter().skip(skip).zip(args) {
            bind(&func.locals[p.0 as usize].ty, &a.ty, env, &mut out);
        }
        let env = self.frame_env(f, out);
        Some((f, env))
    }

    /// Whether running `f` computes a gradient.
    fn calls_grad(&mut self, f: FuncId, depth: usize) -> bool {
        if let Some(&b) = self.grads.get(&f) {
            return b;
        }
        if depth > MAX_DEPTH {
            return false;
        }
        self.grads.insert(f, false);
        let prog = self.prog;
        let Some(func) = prog.funcs.get(f.0 as usize) else { return false };
        let b = self.expr_calls_grad(&func.body, depth);
        self.grads.insert(f, b);
        b
    }

    fn expr_calls_grad(&mut self, e: &'p Expr, depth: usize) -> bool {
        let mut callees = Vec::new();
        let mut direct = false;
        walk::walk(e, &mut |x| match &x.kind {
            ExprKind::Call { func, .. } => callees.push(*func),
            ExprKind::CallValue { target, .. } => {
                if grad_target(target) {
                    direct = true;
                } else if let Some(f) = target_func(self.prog, target) {
                    callees.push(f);
                }
            }
            _ => {}
        });
        direct || callees.into_iter().any(|f| self.calls_grad(f, depth + 1))
    }

    /// Walks one run of `f`, adding what its collectives send `mult` times to `t`; returns the
    /// times the step runs within it (`None` if a count is unknown).
    fn func(&mut self, f: FuncId, env: &Env, mult: u64, t: &mut Traffic, depth: usize) -> Option<u64> {
        if depth > MAX_DEPTH {
            return Some(0);
        }
        let prog = self.prog;
        let Some(func) = prog.funcs.get(f.0 as usize) else { return Some(0) };
        self.stack.push(f);
        self.defers.push(self.next_defer.take());
        let r = self.expr(&func.body, env, mult, t, depth);
        self.defers.pop();
        self.stack.pop();
        r
    }

    /// Walks `e` (see [`Cx::func`]).
    fn expr(&mut self, e: &'p Expr, env: &Env, mult: u64, t: &mut Traffic, depth: usize) -> Option<u64> {
        let mut steps = Some(0u64);
        let add = |steps: &mut Option<u64>, n: Option<u64>| {
            *steps = match (*steps, n) {
                (Some(a), Some(b)) => Some(a.saturating_add(b)),
                _ => None,
            }
        };
        match &e.kind {
            ExprKind::If { cond, then, els } => {
                add(&mut steps, self.expr(cond, env, mult, t, depth));
                // One branch runs: count the costlier.
                let (mut a, mut b) = (Traffic::new(), Traffic::new());
                let fl = self.flops;
                let sa = self.expr(then, env, mult, &mut a, depth);
                let fa = self.flops - fl;
                self.flops = fl;
                let sb = self.expr(els, env, mult, &mut b, depth);
                let fb = self.flops - fl;
                let (pick, s, f) = if bytes(&a) >= bytes(&b) { (a, sa, fa) } else { (b, sb, fb) };
                self.flops = fl + f;
                merge(t, &pick);
                add(&mut steps, s);
                return steps;
            }
            ExprKind::ForRange { start, end, body, .. } => {
                add(&mut steps, self.expr(start, env, mult, t, depth));
                add(&mut steps, self.expr(end, env, mult, t, depth));
                let n = match (int_value(start, env), int_value(end, env)) {
                    (Some(a), Some(b)) => Some((b - a).max(0) as u64),
                    _ => None,
                };
                return self.looped(e, body, n, env, mult, t, depth, steps);
            }
            ExprKind::ForBatches { data, size, body, .. } => {
                for d in data {
                    add(&mut steps, self.expr(d, env, mult, t, depth));
                }
                let rows = data.first().and_then(|d| match &d.ty {
                    Type::Tensor(tt) => match tt.shape.first() {
                        Some(ShapeItem::Dim(n)) => eval_i(n, env),
                        _ => None,
                    },
                    _ => None,
                });
                let n = match (rows, int_value(size, env)) {
                    (Some(r), Some(b)) if b > 0 => Some((r / b) as u64),
                    _ => None,
                };
                return self.looped(e, body, n, env, mult, t, depth, steps);
            }
            ExprKind::While { cond, body } => {
                let place = self.place(e.span);
                self.note(format!("a `while` loop ({place}) is counted as running once"));
                add(&mut steps, self.expr(cond, env, mult, t, depth));
                return self.looped(e, body, None, env, mult, t, depth, steps);
            }
            ExprKind::Prim { prim, args, attrs } => {
                // A sum left partial is sent by the optimizer step's reduce-scatter.
                let partial =
                    self.defers.last().copied().flatten().is_some_and(|d| self.zero.sums.get(&e.id) == Some(&d));
                if attrs.site != 0 && !partial {
                    if let (Some(mesh), Some(a)) = (&self.mesh, args.first()) {
                        let b = crate::shard::sent_bytes(mesh, &a.ty);
                        let key = CommKey {
                            kind: prim.name(),
                            axes: attrs.mesh_axes.iter().map(|x| mesh.names[x.0 as usize].clone()).collect(),
                        };
                        match eval_i(&b, env) {
                            Some(b) => {
                                let c = t.entry(key).or_default();
                                c.calls = c.calls.saturating_add(mult);
                                c.bytes = c.bytes.saturating_add(mult.saturating_mul(b.max(0) as u64));
                            }
                            None => self.note(format!(
                                "a {} of {} bytes is left out: its size is not known",
                                prim.name(),
                                crate::types::dim_str(&b, self.prog)
                            )),
                        }
                    }
                }
                self.flops += mult as f64 * self.prim_flops(*prim, args, attrs.spec.as_deref(), &e.ty, env);
            }
            ExprKind::Call { .. } | ExprKind::CallValue { .. } => {
                // A step on a state held in pieces all-gathers the model's pieces.
                // A step on a state held in pieces all-gathers the model's pieces, and
                // reduce-scatters a gradient left partial into its own (`interp::zero`).
                if let (Some(mesh), Some((axis, state, bytes))) = (&self.mesh, self.sharded_step(e, env)) {
                    let name = vec![mesh.names[axis.0 as usize].clone()];
                    let k = mesh.size(axis).max(1) as u64;
                    let fed = self.stack.last().is_some_and(|f| self.fed.contains(&(*f, state)));
                    let sends = [("all_gather", bytes), ("reduce_scatter", bytes.saturating_mul(k))];
                    for (kind, bytes) in sends.into_iter().take(if fed { 2 } else { 1 }) {
                        let c = t.entry(CommKey { kind, axes: name.clone() }).or_default();
                        c.calls = c.calls.saturating_add(mult);
                        c.bytes = c.bytes.saturating_add(mult.saturating_mul(bytes));
                    }
                }
                let split = |f: &crate::shard::zero::Feed| self.mesh.as_ref().is_some_and(|m| m.size(f.axis) > 1);
                let feed = self.zero.feeds.get(&e.id).copied().filter(split);
                if let (Some(f), Some(g)) = (feed, self.stack.last()) {
                    self.fed.insert((*g, f.state));
                }
                if let Some((f, cenv)) = self.callee(e, env) {
                    self.next_defer = feed.map(|f| (f.axis, f.item));
                    add(&mut steps, self.func(f, &cenv, mult, t, depth + 1));
                    self.next_defer = None;
                }
            }
            _ => {}
        }
        let mut kids = Vec::new();
        walk::children(e, &mut |c| kids.push(c));
        for k in kids {
            add(&mut steps, self.expr(k, env, mult, t, depth));
        }
        steps
    }

    /// A loop running `n` times (`None`: unknown, counted once). The first innermost loop that
    /// computes a gradient is the training step: its body is walked once more for the step.
    #[allow(clippy::too_many_arguments)]
    fn looped(
        &mut self,
        e: &'p Expr,
        body: &'p Expr,
        n: Option<u64>,
        env: &Env,
        mult: u64,
        t: &mut Traffic,
        depth: usize,
        steps: Option<u64>,
    ) -> Option<u64> {
        if n.is_none() && !matches!(e.kind, ExprKind::While { .. }) {
            let place = self.place(e.span);
            self.note(format!("a loop ({place}) whose length is not known is counted as running once"));
        }
        let times = n.unwrap_or(1);
        let is_step = !self.step_found && self.expr_calls_grad(body, 0) && !inner_loop_with_grad(self, body);
        if is_step {
            self.step_found = true;
            let mut st = Traffic::new();
            let fl = self.flops;
            self.expr(body, env, 1, &mut st, depth);
            self.report.step_flops = self.flops - fl;
            self.flops = fl;
            self.report.per_step = st;
            let grad = self.grad_name(body, env).unwrap_or_default();
            self.report.step = Some(Step { lp: Some(e.span), grad, count: None });
        }
        let inner = self.expr(body, env, mult.saturating_mul(times), t, depth);
        let here = if is_step { n } else { inner.zip(n).map(|(s, n)| s.saturating_mul(n)) };
        match (steps, here) {
            (Some(a), Some(b)) => Some(a.saturating_add(b)),
            _ => None,
        }
    }

    /// 2 × multiply-adds of one product on this rank's blocks.
    fn prim_flops(&self, p: Prim, args: &[Expr], spec: Option<&str>, ty: &Type, env: &Env) -> f64 {
        let local = |t: &Type| -> Option<Vec<f64>> {
            let Type::Tensor(tt) = t else { return None };
            let mut v = Vec::new();
            for (i, item) in tt.shape.iter().enumerate() {
                let ShapeItem::Dim(d) = item else { return None };
                let parts = match &self.mesh {
                    Some(m) => m.parts(tt.layout.0.get(i).map(Vec::as_slice).unwrap_or(&[])),
                    None => 1,
                };
                v.push(eval_i(d, env)? as f64 / parts.max(1) as f64);
            }
            Some(v)
        };
        let numel = |v: &Option<Vec<f64>>| v.as_ref().map_or(0.0, |v| v.iter().product::<f64>());
        let dim = |v: &Option<Vec<f64>>, i: usize| v.as_ref().and_then(|v| v.get(i).copied()).unwrap_or(1.0).max(1.0);
        let out = local(ty);
        let ops: Vec<Option<Vec<f64>>> = args.iter().map(|a| local(&a.ty)).collect();
        let op = |i: usize| ops.get(i).cloned().flatten();
        match p {
            Prim::MatMul => {
                let k = op(0).and_then(|v| v.last().copied()).unwrap_or(0.0);
                2.0 * numel(&out) * k
            }
            // Weights are [O, C, kh, kw]: every output element takes C·kh·kw multiply-adds.
            Prim::Conv2d => 2.0 * numel(&out) * numel(&op(1)) / dim(&op(1), 0),
            Prim::Conv2dInputGrad => 2.0 * numel(&op(0)) * numel(&op(1)) / dim(&op(1), 0),
            Prim::Conv2dWeightGrad => 2.0 * numel(&op(1)) * numel(&out) / dim(&op(1), 1),
            Prim::Einsum => {
                // Every index of the specification once: the product of their sizes.
                let Some(spec) = spec else { return 0.0 };
                let lhs = spec.split("->").next().unwrap_or("");
                let mut sizes: HashMap<char, f64> = HashMap::new();
                for (term, shape) in lhs.split(',').zip(&ops) {
                    let Some(shape) = shape else { return 0.0 };
                    for (c, n) in term.chars().filter(|c| c.is_alphabetic()).zip(shape) {
                        sizes.insert(c, *n);
                    }
                }
                2.0 * sizes.values().product::<f64>()
            }
            // `q[..B, Q, D] kᵀ` then the weights times `v[..B, S, E]` (causal masks counted whole).
            Prim::Attention => {
                let s = op(1).and_then(|v| v.iter().rev().nth(1).copied()).unwrap_or(0.0);
                2.0 * (numel(&op(0)) + numel(&out)) * s
            }
            Prim::AttentionWeights => 2.0 * numel(&out) * op(0).and_then(|v| v.last().copied()).unwrap_or(0.0),
            _ => 0.0, // any other primitive: not a product
        }
    }

    /// The plan of `f`, made once.
    fn plan(&mut self, f: FuncId) -> MemPlan {
        self.plan_with(f, &Models::new())
    }

    /// The plan of `f` with its model type parameters bound, made once per binding.
    fn plan_with(&mut self, f: FuncId, models: &Models) -> MemPlan {
        let mut key: Vec<String> = models.iter().map(|(v, t)| format!("{}={t:?}", v.0)).collect();
        key.sort();
        let prog = self.prog;
        self.plans.entry((f, key.join(";"))).or_insert_with(|| memplan::plan_with(prog, f, models)).clone()
    }

    /// The model types a call binds to its callee's model type parameters, with the dims
    /// known in `env` written as sizes (the callee's plan is sized in its own dims).
    fn callee_models(&self, e: &Expr, env: &Env, models: &Models) -> Models {
        let (f, args, skip_captures) = match &e.kind {
            ExprKind::Call { func, args, .. } => (Some(*func), args, false),
            ExprKind::CallValue { target, args, .. } => (target_func(self.prog, target), args, true),
            _ => (None, &Vec::new(), false),
        };
        let mut out = Models::new();
        let Some(func) = f.and_then(|f| self.prog.funcs.get(f.0 as usize)) else { return out };
        if func.models.is_empty() {
            return out;
        }
        let skip = if skip_captures { func.n_captures } else { 0 };
        for (p, a) in func.params.iter().skip(skip).zip(args) {
            bind_models(&func.locals[p.0 as usize].ty, &a.ty, env, models, &mut out);
        }
        out
    }

    /// The most bytes live at once while `f` runs with dims `env`.
    fn peak(&mut self, f: FuncId, env: &Env, models: &Models, depth: usize) -> u64 {
        if depth > MAX_DEPTH {
            return 0;
        }
        let plan = self.plan_with(f, models);
        let dims = |s: Sym| env.get(&s).copied();
        let mut best = plan.peak_bytes(&dims).unwrap_or_else(|| {
            self.note(format!(
                "the memory plan of `{}` has sizes that are not known",
                memplan::func_name(self.prog, f)
            ));
            0
        });
        if plan.n_unknown() > 0 {
            let n = plan.n_unknown();
            self.note(format!(
                "`{}`: {n} value{} of a size not known statically (generic model types, `..S` shapes) left out of its memory",
                memplan::func_name(self.prog, f),
                if n == 1 { "" } else { "s" }
            ));
        }
        let exprs = call_exprs(self.prog, f);
        for c in plan.calls() {
            let Some(&e) = exprs.get(&c.expr) else { continue };
            let around = plan.buffer_bytes(&c.live, &dims).unwrap_or(0);
            let gmodels = self.callee_models(e, env, models);
            if let Some((g, genv)) = self.callee(e, env) {
                let inner = self.peak(g, &genv, &gmodels, depth + 1);
                best = best.max(around.saturating_add(inner));
            }
        }
        best
    }

    /// Fills in the memory of the report: the whole run's peak, and what is live around the
    /// step's gradient call, by kind; in a run with no gradient (inference), around the call of
    /// `main` whose callee needs the most memory.
    fn memory(&mut self, main: FuncId, env: &Env) {
        self.report.memory.peak = self.peak(main, env, &Models::new(), 0);
        // The call in `main` that computes the gradient (directly or inside its callee).
        let plan = self.plan(main);
        let exprs = call_exprs(self.prog, main);
        let dims = |s: Sym| env.get(&s).copied();
        // The other calls: (kinds, saved, callee, its dims), for a run with no gradient call.
        let mut others = Vec::new();
        for c in plan.calls() {
            let Some(&e) = exprs.get(&c.expr) else { continue };
            let Some((g, genv)) = self.callee(e, env) else { continue };
            let direct = matches!(&e.kind, ExprKind::CallValue { target, .. } if grad_target(target));
            let step = direct || self.calls_grad(g, 0);
            let prog = self.prog;
            let main_func = prog.func(main);
            let mut kinds = [0u64; 3]; // parameters, optimizer, data
            let mut seen = std::collections::HashSet::new();
            let sharded = sharded_locals(prog, main);
            let offloaded = offloaded_locals(prog, main);
            let (mut saved, mut host) = (0u64, 0u64);
            for (l, bufs) in &c.held {
                let ty = &main_func.locals[l.0 as usize].ty;
                let on_host = offloaded.contains_key(l);
                if let (Some(&axis), Some(mesh)) = (sharded.get(l), &self.mesh) {
                    // A state held in pieces: the rank's pieces (`interp::zero`), which the
                    // run's peak counts in place of the whole state the plan sized.
                    let fresh: Vec<usize> = bufs.iter().copied().filter(|b| seen.insert(*b)).collect();
                    let pieces = piece_bytes(prog, mesh, ty, axis, env, 0);
                    let whole = plan.buffer_bytes(&fresh, &dims).unwrap_or(0);
                    saved += whole.saturating_sub(pieces);
                    if on_host {
                        (host, saved) = (host + pieces, saved + pieces);
                    } else {
                        kinds[1] += pieces;
                    }
                    continue;
                }
                if on_host {
                    // A state in host memory (`offload: host`): not on the device at all.
                    let fresh: Vec<usize> = bufs.iter().copied().filter(|b| seen.insert(*b)).collect();
                    let bytes = plan.buffer_bytes(&fresh, &dims).unwrap_or(0);
                    (host, saved) = (host + bytes, saved + bytes);
                    continue;
                }
                let k = match kind_of(self.prog, ty) {
                    Kind::Optimizer => 1,
                    Kind::Model => 0,
                    Kind::Other => 2,
                };
                let fresh: Vec<usize> = bufs.iter().copied().filter(|b| seen.insert(*b)).collect();
                kinds[k] += plan.buffer_bytes(&fresh, &dims).unwrap_or(0);
            }
            let rest: Vec<usize> = c.live.iter().copied().filter(|b| seen.insert(*b)).collect();
            kinds[2] += plan.buffer_bytes(&rest, &dims).unwrap_or(0);
            // A model or optimizer state moved into the call (its last use) is among the live
            // buffers the plan attributes to no local: count it by its type.
            let args: &[Expr] = match &e.kind {
                ExprKind::Call { args, .. } | ExprKind::CallValue { args, .. } => args,
                _ => &[],
            };
            for a in args {
                let ExprKind::Local(l) = &a.kind else { continue };
                if c.held.iter().any(|(h, _)| h == l) {
                    continue;
                }
                let k = match kind_of(prog, &a.ty) {
                    Kind::Optimizer => 1,
                    Kind::Model => 0,
                    Kind::Other => continue,
                };
                let b = value_bytes(prog, &a.ty, env, 0).min(kinds[2]);
                kinds[2] -= b;
                if offloaded.contains_key(l) {
                    (host, saved) = (host + b, saved + b);
                } else {
                    kinds[k] += b;
                }
            }
            if !step {
                others.push((kinds, saved, g, genv));
                continue;
            }
            self.report.memory.peak = self.report.memory.peak.saturating_sub(saved);
            self.report.memory.host = host;
            self.report.memory.parameters = kinds[0];
            self.report.memory.optimizer = kinds[1];
            self.report.memory.data = kinds[2];
            let (gf, gretty, genv2) = if direct {
                (g, e.ty.clone(), genv)
            } else {
                let prog = self.prog;
                self.grad_call(&prog.func(g).body, &genv, 0).unwrap_or((g, Type::unit(), genv))
            };
            let grads = grad_bytes(self.prog, &gretty, &genv2);
            let inner = self.peak(gf, &genv2, &Models::new(), 1);
            self.report.memory.gradients = grads;
            self.report.memory.activations = inner.saturating_sub(grads);
            return;
        }
        // No gradient call: the call whose held values and callee's peak are the most.
        let mut largest: Option<(u64, [u64; 3], u64, u64)> = None;
        for (kinds, saved, g, genv) in others {
            let inner = self.peak(g, &genv, &Models::new(), 1);
            let total = kinds.iter().sum::<u64>() + inner;
            if largest.is_none_or(|(t, ..)| total > t) {
                largest = Some((total, kinds, saved, inner));
            }
        }
        if let Some((_, kinds, saved, inner)) = largest {
            let m = &mut self.report.memory;
            m.peak = m.peak.saturating_sub(saved);
            (m.parameters, m.optimizer, m.data, m.activations) = (kinds[0], kinds[1], kinds[2], inner);
        }
    }

    /// The first gradient call in `e` or along the calls it makes: the derived function, the
    /// call's result type and the callee's dims.
    fn grad_call(&mut self, e: &'p Expr, env: &Env, depth: usize) -> Option<(FuncId, Type, Env)> {
        if depth > MAX_DEPTH {
            return None;
        }
        let mut calls = Vec::new();
        walk::walk(e, &mut |x| {
            if matches!(x.kind, ExprKind::Call { .. } | ExprKind::CallValue { .. }) {
                calls.push(x);
            }
        });
        for c in calls {
            let direct = matches!(&c.kind, ExprKind::CallValue { target, .. } if grad_target(target));
            let Some((g, genv)) = self.callee(c, env) else { continue };
            if direct {
                return Some((g, c.ty.clone(), genv));
            }
            let prog = self.prog;
            if let Some(r) = prog.funcs.get(g.0 as usize).and_then(|f| self.grad_call(&f.body, &genv, depth + 1)) {
                return Some(r);
            }
        }
        None
    }

    /// The name of the gradient computed in `e` (`value_and_grad(loss)`).
    fn grad_name(&mut self, e: &'p Expr, env: &Env) -> Option<String> {
        self.grad_call(e, env, 0).map(|(g, _, _)| memplan::func_name(self.prog, g))
    }
}

/// Whether a loop inside `e` computes a gradient (then `e`'s loop is not the innermost).
fn inner_loop_with_grad<'p>(cx: &mut Cx<'p>, e: &'p Expr) -> bool {
    let mut bodies = Vec::new();
    walk::walk(e, &mut |x| match &x.kind {
        ExprKind::ForRange { body, .. } | ExprKind::ForBatches { body, .. } | ExprKind::While { body, .. } => {
            bodies.push(&**body)
        }
        _ => {}
    });
    bodies.into_iter().any(|b| cx.expr_calls_grad(b, 0))
}

/// Every call expression of `f`, by id.
fn call_exprs(prog: &Program, f: FuncId) -> HashMap<ExprId, &Expr> {
    let mut out = HashMap::new();
    if let Some(func) = prog.funcs.get(f.0 as usize) {
        walk::walk(&func.body, &mut |x| {
            if matches!(x.kind, ExprKind::Call { .. } | ExprKind::CallValue { .. }) {
                out.insert(x.id, x);
            }
        });
    }
    out
}

/// A target that computes a gradient.
fn grad_target(t: &FnTarget) -> bool {
    matches!(t, FnTarget::Grad { .. })
}

impl Cx<'_> {
    /// For a call of an `@optimizer_step` function whose state is a local of the calling
    /// function held in pieces: the axis, that local, and the bytes of the model's pieces that
    /// each rank all-gathers.
    fn sharded_step(&self, e: &Expr, env: &Env) -> Option<(AxisId, Local, u64)> {
        let ExprKind::Call { func, args, .. } = &e.kind else { return None };
        let prog = self.prog;
        if !is_optimizer_step(prog, *func) {
            return None;
        }
        let (Some(ExprKind::Local(l)), Some(m)) = (args.get(2).map(|a| &a.kind), args.first()) else { return None };
        let axis = *sharded_locals(prog, *self.stack.last()?).get(l)?;
        Some((axis, *l, piece_bytes(prog, self.mesh.as_ref()?, &m.ty, axis, env, 0)))
    }
}

/// This rank's bytes of a value of type `t` held in pieces over `axis`: a tensor of rank ≥ 1
/// whole over the axis is `⌈elements / size(axis)⌉` of its elements, the rest whole.
fn piece_bytes(prog: &Program, mesh: &Mesh, t: &Type, axis: AxisId, env: &Env, depth: usize) -> u64 {
    if depth > 16 {
        return 0;
    }
    match t {
        Type::Tensor(tt) if !tt.shape.is_empty() => {
            let Some(b) = memplan::tensor_bytes(prog, tt).and_then(|d| eval_i(&d, env)) else { return 0 };
            let b = b.max(0) as u64;
            if tt.layout.0.iter().any(|a| a.contains(&axis)) {
                return b;
            }
            // One element's bytes (the scalar type without the tensor's layout, which would
            // divide it by the dims' splits).
            let elem = memplan::tensor_bytes(prog, &crate::types::TensorTy::new(tt.elem, vec![]))
                .and_then(|d| d.as_const())
                .unwrap_or(4)
                .max(1) as u64;
            (b / elem).div_ceil(mesh.size(axis).max(1) as u64) * elem
        }
        Type::Tuple(ts) => ts.iter().map(|t| piece_bytes(prog, mesh, t, axis, env, depth + 1)).sum(),
        Type::Model(id, args) => {
            let Some(def) = prog.models.get(id.0 as usize) else { return 0 };
            let s = def.arg_subst(args);
            def.fields
                .iter()
                .map(|f| piece_bytes(prog, mesh, &crate::ir::Model::field_ty(&s, f), axis, env, depth + 1))
                .sum()
        }
        _ => 0,
    }
}

/// What a local of type `t` holds, for the memory report.
/// This rank's bytes of the gradient in a gradient call's result: its model and tensor parts
/// other than the value of `value_and_grad` (the first part of a pair whose first part is a
/// scalar).
fn grad_bytes(prog: &Program, t: &Type, env: &Env) -> u64 {
    match t {
        Type::Tuple(ts) if ts.len() == 2 && scalar(&ts[0]) => value_bytes(prog, &ts[1], env, 0),
        _ => value_bytes(prog, t, env, 0),
    }
}

fn scalar(t: &Type) -> bool {
    matches!(t, Type::Tensor(tt) if tt.shape.is_empty())
}

/// This rank's bytes of every tensor of rank ≥ 1 in a value of type `t`.
fn value_bytes(prog: &Program, t: &Type, env: &Env, depth: usize) -> u64 {
    if depth > 16 {
        return 0;
    }
    match t {
        Type::Tensor(tt) if !tt.shape.is_empty() => {
            memplan::tensor_bytes(prog, tt).and_then(|d| eval_i(&d, env)).map_or(0, |b| b.max(0) as u64)
        }
        Type::Tuple(ts) => ts.iter().map(|t| value_bytes(prog, t, env, depth + 1)).sum(),
        Type::Model(id, args) => {
            let Some(def) = prog.models.get(id.0 as usize) else { return 0 };
            let s = def.arg_subst(args);
            def.fields.iter().map(|f| value_bytes(prog, &crate::ir::Model::field_ty(&s, f), env, depth + 1)).sum()
        }
        _ => 0,
    }
}

/// Binds the dims of a parameter type that are single variables to the argument's dims.
fn bind(p: &Type, a: &Type, env: &Env, out: &mut Env) {
    match (p, a) {
        (Type::Tensor(pt), Type::Tensor(at)) => {
            for (pi, ai) in pt.shape.iter().zip(&at.shape) {
                if let (ShapeItem::Dim(pd), ShapeItem::Dim(ad)) = (pi, ai) {
                    if let (Some(s), Some(v)) = (pd.as_var(), eval_i(ad, env)) {
                        out.entry(s).or_insert(v);
                    }
                }
            }
        }
        (Type::Model(_, pa), Type::Model(_, aa)) => {
            for (x, y) in pa.iter().zip(aa) {
                match (x, y) {
                    (TypeArg::Dim(pd), TypeArg::Dim(ad)) => {
                        if let (Some(s), Some(v)) = (pd.as_var(), eval_i(ad, env)) {
                            out.entry(s).or_insert(v);
                        }
                    }
                    (TypeArg::Type(pt), TypeArg::Type(at)) => bind(pt, at, env, out),
                    _ => {}
                }
            }
        }
        (Type::Tuple(ps), Type::Tuple(as_)) => ps.iter().zip(as_).for_each(|(p, a)| bind(p, a, env, out)),
        _ => {}
    }
}

/// Binds the model type parameters in a parameter type to the argument's model types (through
/// the caller's own bindings `models`), their dims written as sizes where `env` knows them.
fn bind_models(p: &Type, a: &Type, env: &Env, models: &Models, out: &mut Models) {
    match (p, a) {
        (Type::ModelVar(v), a) => {
            let a = match a {
                Type::ModelVar(w) => models.get(w).cloned(),
                t @ Type::Model(..) => Some(sized(t, env)),
                _ => None,
            };
            if let Some(t) = a {
                out.entry(*v).or_insert(t);
            }
        }
        (Type::Model(_, pa), Type::Model(_, aa)) => {
            for (x, y) in pa.iter().zip(aa) {
                if let (TypeArg::Type(pt), TypeArg::Type(at)) = (x, y) {
                    bind_models(pt, at, env, models, out);
                }
            }
        }
        (Type::Tuple(ps), Type::Tuple(as_)) => {
            ps.iter().zip(as_).for_each(|(p, a)| bind_models(p, a, env, models, out))
        }
        _ => {}
    }
}

/// A model type with the dims of its arguments that `env` knows written as sizes.
fn sized(t: &Type, env: &Env) -> Type {
    match t {
        Type::Model(id, args) => Type::Model(
            *id,
            args.iter()
                .map(|a| match a {
                    TypeArg::Dim(d) => TypeArg::Dim(eval_i(d, env).map_or_else(|| d.clone(), Dim::constant)),
                    TypeArg::Type(t) => TypeArg::Type(sized(t, env)),
                })
                .collect(),
        ),
        t => t.clone(),
    }
}

/// An integer-valued expression known from the dims (`0..20`, `0..N / B`).
fn int_value(e: &Expr, env: &Env) -> Option<i64> {
    match &e.kind {
        ExprKind::Lit(Lit::Int(n)) => Some(*n),
        ExprKind::DimValue(d) => eval_i(d, env),
        ExprKind::Prim { prim: Prim::Cast | Prim::Neg, args, .. } if args.len() == 1 => {
            let v = int_value(&args[0], env)?;
            if matches!(e.kind, ExprKind::Prim { prim: Prim::Neg, .. }) {
                v.checked_neg()
            } else {
                Some(v)
            }
        }
        ExprKind::Prim { prim, args, .. } if args.len() == 2 => {
            let (a, b) = (int_value(&args[0], env)?, int_value(&args[1], env)?);
            match prim {
                Prim::Add => a.checked_add(b),
                Prim::Sub => a.checked_sub(b),
                Prim::Mul => a.checked_mul(b),
                Prim::Div => a.checked_div(b),
                _ => None, // any other primitive: not integer arithmetic of sizes
            }
        }
        _ => None,
    }
}

/// The literal path of `load("…")` (through a `BindDims` check's block).
fn load_path(e: &Expr) -> Option<String> {
    match &e.kind {
        ExprKind::Prim { prim: Prim::Load, args, .. } => match args.first().map(|a| &a.kind) {
            Some(ExprKind::Lit(Lit::Str(s))) => Some(s.clone()),
            _ => None,
        },
        _ => None,
    }
}

fn bytes(t: &Traffic) -> u64 {
    t.values().map(|c| c.bytes).sum()
}

fn merge(into: &mut Traffic, from: &Traffic) {
    for (k, c) in from {
        let e = into.entry(k.clone()).or_default();
        e.calls = e.calls.saturating_add(c.calls);
        e.bytes = e.bytes.saturating_add(c.bytes);
    }
}
