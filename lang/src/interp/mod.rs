//! The eager interpreter over the typed IR: msl's reference semantics.
//!
//! Every primitive is evaluated by the CPU kernels (`kernels::ops`); the JIT and other devices
//! are checked against what this interpreter computes.

use crate::types::TensorTy;
pub mod accel;
mod checkpoint;
mod compress;
mod data;
mod device;
pub mod host;
mod overlap;
mod pipeline;
mod prims;
mod shards;
mod stacks;
pub mod trace;
mod transforms;
pub mod value;
mod zero;

use crate::diag::{Code, Diagnostic};
use crate::ir::{self, Expr, ExprKind, FnTarget, Lit, Local, Pat, Program, Stmt};
use crate::source::Span;
use crate::types::{Dim, FuncId, RestSym, ShapeItem, Sym, Type, TypeArg};
pub use accel::{Accel, Operand, Region, RegionRun};
pub(crate) use data::{resolve_path, split_entry};
use kernels::{KernelError, Tensor};
use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
pub use value::{FnValue, ModelValue, Value};

thread_local! {
    /// The primitive this thread's interpreter is applying, and its span: what an
    /// out-of-memory message names. The binary's allocator reads it when a request fails,
    /// without allocating (a `Cell` of a `Copy` value with a constant initialiser).
    static APPLYING: std::cell::Cell<Option<(ir::Prim, Span)>> = const { std::cell::Cell::new(None) };
}

/// The primitive the interpreter on this thread is applying now, and where (none outside
/// primitives, and on threads that do not interpret).
pub fn applying() -> Option<(ir::Prim, Span)> {
    APPLYING.try_with(std::cell::Cell::get).ok().flatten()
}

/// Records a primitive in [`APPLYING`] while it is applied; restores the enclosing one (a
/// primitive such as `map` applies others) when dropped, however the application ends.
struct Applying(Option<(ir::Prim, Span)>);

impl Applying {
    fn enter(prim: ir::Prim, span: Span) -> Applying {
        Applying(APPLYING.try_with(|a| a.replace(Some((prim, span)))).ok().flatten())
    }
}

impl Drop for Applying {
    fn drop(&mut self) {
        let _ = APPLYING.try_with(|a| a.set(self.0));
    }
}

/// A run-time failure: a message and the span of the operation that failed (exit status 2).
#[derive(Clone, Debug)]
pub struct RuntimeError {
    pub code: Code,
    pub message: String,
    pub span: Span,
    /// The calls the error unwound through, innermost first: the function called and where.
    pub stack: Vec<(String, Span)>,
}

/// Most calls a run-time error lists (innermost first; a loop of calls repeats little).
const MAX_STACK: usize = 16;

impl RuntimeError {
    pub fn new(code: Code, message: impl Into<String>, span: Span) -> RuntimeError {
        RuntimeError { code, message: message.into(), span, stack: Vec::new() }
    }

    /// The error as a diagnostic: its place, then each call it unwound through (`bad` called
    /// here, `mid` called here …), the call stack a Python traceback shows.
    pub fn to_diagnostic(&self) -> Diagnostic {
        let mut d = Diagnostic::error(self.code, self.span, self.message.clone());
        if let Some((inner, _)) = self.stack.first() {
            d = d.label(format!("in `{inner}`"));
        }
        for (name, span) in &self.stack {
            d = d.with_secondary(*span, format!("`{name}` called here"));
        }
        d
    }
}

/// Adds the call of `name` at `span` to an error unwinding through it.
pub(crate) fn called_from(c: Ctrl, name: &str, span: Span) -> Ctrl {
    match c {
        Ctrl::Error(mut e) => {
            if e.stack.len() < MAX_STACK {
                e.stack.push((name.to_string(), span));
            }
            Ctrl::Error(e)
        }
        other => other,
    }
}

/// Non-local control flow: `return`, or an error unwinding to the caller.
pub enum Ctrl {
    Return(Value),
    Error(RuntimeError),
}

pub type R<T> = Result<T, Ctrl>;

pub(crate) fn kerr(e: KernelError, span: Span) -> Ctrl {
    let code = match &e {
        KernelError::DivisionByZero | KernelError::CastOutOfRange { .. } => Code::E0603,
        KernelError::IndexOutOfRange { .. }
        | KernelError::AxisOutOfRange { .. }
        | KernelError::ShapeMismatch { .. }
        | KernelError::SizeOverflow { .. }
        | KernelError::OutOfRange(_) => Code::E0602,
        KernelError::Io { .. } | KernelError::FileMismatch { .. } => Code::E0601,
        _ => Code::E0605,
    };
    Ctrl::Error(RuntimeError::new(code, e.to_string(), span))
}

pub(crate) fn rt(code: Code, message: impl Into<String>, span: Span) -> Ctrl {
    Ctrl::Error(RuntimeError::new(code, message, span))
}

/// One function activation: its locals and the values of its dims.
pub struct Frame {
    pub locals: Vec<Option<Value>>,
    pub dims: HashMap<Sym, i64>,
    pub rests: HashMap<RestSym, Vec<i64>>,
}

/// Watches the progress of long loops (`batches`), for progress bars.
pub trait Observer {
    fn batches_start(&mut self, _total: usize) {}
    fn batch_done(&mut self) {}
    fn batches_end(&mut self) {}
}

struct NoObserver;
impl Observer for NoObserver {}

/// Where `log_scalar` sends what it records. `msl run` installs a writer of TensorBoard event
/// files; the default (spec blocks, `msl test` without `--logdir`) discards the values, so that
/// running a program never leaves files behind unless asked to.
pub trait ScalarLog {
    /// Records `value` under `tag` at `step`. An `Err` is the reason it could not be written;
    /// it stops the run (`E0601`).
    fn scalar(&mut self, tag: &str, step: i64, value: f64) -> Result<(), String>;
}

/// The default [`ScalarLog`]: records nothing.
pub struct NoLog;
impl ScalarLog for NoLog {
    fn scalar(&mut self, _tag: &str, _step: i64, _value: f64) -> Result<(), String> {
        Ok(())
    }
}

pub struct Interp<'p> {
    pub prog: &'p Program,
    pub out: Box<dyn Write + 'p>,
    consts: Vec<Option<Value>>,
    /// The seed and field path of the model initialiser running now.
    pub(crate) init_keys: Vec<(i64, String)>,
    /// Directory of the program's source, where relative `load` paths are tried second.
    pub source_dir: Option<PathBuf>,
    /// The folder relative paths of `save`, `load` and `exists` start from (tried first, for
    /// `load`); `None` is the process's working directory. The spec runner gives each block
    /// a fresh one, so that examples can write files.
    pub work_dir: Option<PathBuf>,
    pub interrupt: Arc<AtomicBool>,
    pub observer: Box<dyn Observer + 'p>,
    /// The destination of `log_scalar` ([`NoLog`] unless the embedder installs one).
    pub scalars: Box<dyn ScalarLog + 'p>,
    /// Dims of the scope of the closure being applied (closures see their creator's dims).
    closure_dims: HashMap<Sym, i64>,
    /// A compiler that takes over trees of primitives (`--mode jit`); `None` interprets op by op.
    pub accel: Option<Box<dyn Accel + 'p>>,
    /// `--nan-check`: every primitive's float result is checked for NaN and ±inf, and the run
    /// stops at the first one that has them. Nothing is compiled then (like `jax_debug_nans`'
    /// op-by-op rerun), so the first such primitive is found whatever the engine.
    pub nan_check: bool,
    /// Where primitives run (`interp::device`): the CPU device unless the embedder gives
    /// another.
    pub device: Arc<dyn kernels::Device>,
    /// Whether some optimizer state lives in host memory (`offload: host`), so that calls
    /// look for one among their arguments.
    pub(crate) host_states: bool,
    /// Reads of locals that are their last (`ir::opt::last_uses`), by expression id: the value
    /// moves out of the frame there. Set for whole programs (`msl run`, `msl test`, spec files,
    /// the JIT at `-O2`), never in the REPL, whose later input may read any local again.
    pub moves: std::collections::HashSet<crate::ir::ExprId>,
    /// Values of operands that compiled code evaluated, by expression id (`host`).
    preset: Vec<(crate::ir::ExprId, Value)>,
    /// A sharded run (`mpirun`): this rank's mesh and communicator. Values hold this rank's
    /// blocks; dims keep their global sizes. `None` runs every layout whole.
    pub spmd: Option<Rc<crate::dist::Spmd>>,
    /// `msl run --trace`: the timeline being recorded; `None` records nothing.
    pub trace: Option<Box<trace::Trace>>,
    /// Where gradients reach sharded optimizer steps (`shard::zero`), found at the first call
    /// of a sharded run that could be one.
    zero_plan: Option<Rc<crate::shard::zero::ZeroPlan>>,
    /// What the next [`Interp::call`] tells its callee: which sums to leave partial (`zero`).
    defer_next: Option<zero::Defer>,
    /// For each function call running, innermost last: the sums it leaves out (`zero`).
    defers: Vec<Option<zero::Defer>>,
}

impl<'p> Interp<'p> {
    pub fn new(prog: &'p Program, out: Box<dyn Write + 'p>) -> Interp<'p> {
        Interp {
            prog,
            out,
            consts: vec![None; prog.consts.len()],
            init_keys: Vec::new(),
            source_dir: None,
            work_dir: None,
            interrupt: Arc::new(AtomicBool::new(false)),
            observer: Box::new(NoObserver),
            scalars: Box::new(NoLog),
            closure_dims: HashMap::new(),
            accel: None,
            nan_check: false,
            device: Arc::new(kernels::CpuDevice),
            host_states: false,
            moves: Default::default(),
            preset: Vec::new(),
            spmd: None,
            trace: None,
            zero_plan: None,
            defer_next: None,
            defers: Vec::new(),
        }
    }

    pub fn span(&self, e: &Expr) -> Span {
        self.prog.span(e.span)
    }

    /// Moves each local's value out of the frame at its last read (`ir::opt::last_uses`), for a
    /// run of the whole program: a buffer handed to a function that updates it (a key/value
    /// cache) is then written in place, not copied. Never for the REPL (see [`Interp::moves`]).
    pub fn move_at_last_uses(&mut self) {
        self.moves = crate::ir::opt::last_uses(self.prog);
    }

    /// Runs a function with no parameters (`main`, a test) to completion.
    pub fn run_main(&mut self, f: FuncId) -> Result<Value, RuntimeError> {
        // A program the verifier found malformed after some pass is not run (`crate::passes`).
        if let Some(why) = crate::passes::malformed(self.prog) {
            let span = self.prog.funcs.get(f.0 as usize).and_then(|func| self.prog.spans.get(func.span.0 as usize));
            return Err(RuntimeError {
                code: Code::E0605,
                message: why,
                span: span.copied().unwrap_or_default(),
                stack: Vec::new(),
            });
        }
        match self.call(f, vec![], HashMap::new(), vec![]) {
            Ok(v) => {
                let _ = self.out.flush();
                Ok(v)
            }
            Err(Ctrl::Return(v)) => Ok(v),
            Err(Ctrl::Error(e)) => {
                let _ = self.out.flush();
                Err(e)
            }
        }
    }

    /// Calls a function with arguments; generic dims come from `dims` or, when absent, from the
    /// shapes of the arguments.
    pub fn call(
        &mut self,
        f: FuncId,
        args: Vec<Value>,
        dims: HashMap<Sym, i64>,
        captures: Vec<(Local, Value)>,
    ) -> R<Value> {
        let defer = self.defer_next.take();
        if let Some(pi) = self.pipeline_of(f) {
            let span = self.prog.span(self.prog.func(f).span);
            return self.run_pipeline(pi, args, false, span).map(|(v, _)| v);
        }
        if zero::is_sharded_step(self.prog, f, &args) {
            let span = self.prog.span(self.prog.func(f).span);
            return self.sharded_step(f, args, dims, span);
        }
        let args = self.whole_partials(args, self.prog.span(self.prog.func(f).span))?;
        self.call_body_deferring(f, args, dims, captures, defer)
    }

    /// [`Interp::call`] without the calls that run another way (pipelines, sharded steps).
    pub(crate) fn call_body(
        &mut self,
        f: FuncId,
        args: Vec<Value>,
        dims: HashMap<Sym, i64>,
        captures: Vec<(Local, Value)>,
    ) -> R<Value> {
        self.call_body_deferring(f, args, dims, captures, None)
    }

    /// [`Interp::call_body`], leaving the sums `defer` names partial (`zero`).
    fn call_body_deferring(
        &mut self,
        f: FuncId,
        args: Vec<Value>,
        dims: HashMap<Sym, i64>,
        captures: Vec<(Local, Value)>,
        defer: Option<zero::Defer>,
    ) -> R<Value> {
        let func = self.prog.func(f);
        let mut dims = dims;
        if !captures.is_empty() || func.n_captures > 0 {
            for (k, v) in &self.closure_dims {
                dims.entry(*k).or_insert(*v);
            }
        }
        let mut frame = Frame { locals: vec![None; func.locals.len()], dims, rests: HashMap::new() };
        for (l, v) in captures {
            if let Some(slot) = frame.locals.get_mut(l.0 as usize) {
                *slot = Some(v);
            }
        }
        for (l, v) in func.params.iter().zip(args) {
            let ty = &func.locals[l.0 as usize].ty;
            bind_dims_from(ty, &v, &mut frame, self.spmd.as_ref().map(|s| &s.mesh));
            frame.locals[l.0 as usize] = Some(v);
        }
        // A sharded body that starts collectives runs here, where they overlap its work (a
        // compiled body would wait at each); the accelerator still fuses its elementwise trees.
        let deferring = self.spmd.is_some() && !overlap::overlap_off() && overlap::starts_collectives(&func.body);
        let compiled = if self.nan_check || deferring { None } else { self.accel.as_mut().and_then(|a| a.body(f)) };
        let defer = defer.filter(|d| self.returns_partial(f, *d));
        self.defers.push(defer);
        let t0 = self.trace_start();
        let kind = if compiled.is_some() { trace::Kind::Compiled } else { trace::Kind::Call };
        let r = match (compiled, &func.body.kind) {
            (Some(code), _) => code.run(self, &mut frame),
            (None, ExprKind::Block { stmts, result }) if deferring => self.body_overlapped(stmts, result, &mut frame),
            (None, _) => self.eval(&func.body, &mut frame),
        };
        self.defers.pop();
        self.trace_call(t0, f, kind);
        let v = match r {
            Ok(v) => v,
            Err(Ctrl::Return(v)) => v,
            Err(e) => return Err(e),
        };
        Ok(match defer {
            Some(d) => self.partial_result(v, d),
            None => v,
        })
    }

    pub fn dim(&self, frame: &Frame, d: &Dim, span: Span) -> R<i64> {
        let v = d.subst(&|s| frame.dims.get(&s).map(|&x| Dim::constant(x)));
        match v.as_const() {
            Some(x) => Ok(x),
            // The dims' values multiplied past 64 bits (`N * N * N` with `N` bound from a file).
            None if v.overflows() && v.vars().next().is_none() => Err(rt(
                Code::E0602,
                format!("size overflow: dimension {} does not fit in 64 bits", crate::types::dim_str(d, self.prog)),
                span,
            )),
            None if v.is_fractional_const() => Err(rt(
                Code::E0602,
                format!("a dimension is not a whole number here ({})", crate::types::dim_str(d, self.prog)),
                span,
            )),
            None => Err(rt(
                Code::E0605,
                format!("dimension {} is not known at run time", crate::types::dim_str(d, self.prog)),
                span,
            )),
        }
    }

    pub fn dims_usize(&self, frame: &Frame, ds: &[Dim], span: Span) -> R<Vec<usize>> {
        ds.iter()
            .map(|d| {
                let v = self.dim(frame, d, span)?;
                usize::try_from(v).map_err(|_| rt(Code::E0602, format!("negative dimension {v}"), span))
            })
            .collect()
    }

    fn check_interrupt(&self, span: Span) -> R<()> {
        if self.interrupt.load(Ordering::Relaxed) {
            return Err(rt(Code::E0605, "interrupted", span));
        }
        Ok(())
    }

    pub fn eval(&mut self, e: &Expr, frame: &mut Frame) -> R<Value> {
        if !self.preset.is_empty() {
            if let Some(v) = self.take_preset(e) {
                return Ok(v);
            }
        }
        match &e.kind {
            ExprKind::Lit(l) => Ok(lit_value(l, &e.ty)),
            ExprKind::Local(l) => {
                let slot = &mut frame.locals[l.0 as usize];
                // A last use (`-O2`'s liveness) hands the value over instead of copying it.
                let v = if !self.moves.is_empty() && self.moves.contains(&e.id) { slot.take() } else { slot.clone() };
                v.ok_or_else(|| rt(Code::E0605, "use of a variable before it has a value", self.span(e)))
            }
            ExprKind::Const(c) => {
                if let Some(v) = &self.consts[c.0 as usize] {
                    return Ok(v.clone());
                }
                let mut f = Frame { locals: vec![], dims: HashMap::new(), rests: HashMap::new() };
                let v = self.eval(&self.prog.consts[c.0 as usize].value, &mut f)?;
                self.consts[c.0 as usize] = Some(v.clone());
                Ok(v)
            }
            ExprKind::DimValue(d) => {
                let span = self.span(e);
                let v = self.dim(frame, d, span)?;
                // A dim read as a value is an `i32`; one bound from a file (a `[0, 2^40]` array)
                // may not fit, and wrapping it would print a wrong size.
                let v = i32::try_from(v).map_err(|_| {
                    let name = crate::types::dim_str(d, self.prog);
                    rt(Code::E0602, format!("dimension {name} = {v} does not fit in i32"), span)
                })?;
                Ok(Value::Tensor(Tensor::scalar_i32(v)))
            }
            ExprKind::Prim { prim, args, attrs } => {
                let _applying = Applying::enter(*prim, self.span(e));
                if self.accel.is_some() && !self.nan_check {
                    if let Some(r) = self.eval_accel(e, frame) {
                        return r;
                    }
                }
                let v = self.eval_prim_node(e, *prim, args, attrs, frame)?;
                if self.nan_check {
                    self.check_finite(*prim, &v, e)?;
                }
                Ok(v)
            }
            ExprKind::Call { func, dims, args, .. } => {
                let mut vals = Vec::with_capacity(args.len());
                for a in args {
                    vals.push(self.eval(a, frame)?);
                }
                let callee = self.prog.func(*func);
                let mut env = HashMap::new();
                for (s, d) in callee.dims.iter().zip(dims) {
                    if let Ok(v) = self.dim(frame, d, self.span(e)) {
                        env.insert(*s, v);
                    }
                }
                // A sharded step here counts its gather at the call (`Interp::call` has no site).
                let r = if zero::is_sharded_step(self.prog, *func, &vals) {
                    self.sharded_step(*func, vals, env, self.span(e))
                } else {
                    self.defer_next = self.defer_for(e, frame);
                    let r = self.call(*func, vals, env, vec![]);
                    self.defer_next = None;
                    r
                };
                r.map_err(|c| called_from(c, self.prog.names.get(callee.name), self.span(e)))
            }
            ExprKind::CallValue { callee, target, args } => {
                let f = self.eval(callee, frame)?;
                let mut vals = Vec::with_capacity(args.len());
                for a in args {
                    vals.push(self.eval(a, frame)?);
                }
                let Value::Fn(fv) = f else {
                    return Err(rt(Code::E0605, "called value is not a function", self.span(e)));
                };
                self.defer_next = self.defer_for(e, frame);
                let r = self.apply(&fv, target, vals, self.span(e));
                self.defer_next = None;
                r
            }
            ExprKind::FuncRef(f) => Ok(Value::Fn(Rc::new(FnValue::Func {
                target: FnTarget::Func(*f),
                captures: vec![],
                closure: None,
                dims: vec![],
            }))),
            ExprKind::Closure { id, captures } => {
                let caps = captures
                    .iter()
                    .filter_map(|l| frame.locals.get(l.0 as usize).cloned().flatten().map(|v| (*l, v)))
                    .collect();
                Ok(Value::Fn(Rc::new(FnValue::Func {
                    target: FnTarget::Dynamic,
                    captures: caps,
                    closure: Some(*id),
                    dims: frame.dims.iter().map(|(k, v)| (*k, *v)).collect(),
                })))
            }
            ExprKind::Transform { target, callee } => {
                let f = self.eval(callee, frame)?;
                let Value::Fn(fv) = f else { return Err(rt(Code::E0605, "not a function", self.span(e))) };
                let (captures, closure, dims) = match &*fv {
                    FnValue::Func { captures, closure, dims, .. } => (captures.clone(), *closure, dims.clone()),
                    FnValue::Pullback { .. } => (vec![], None, vec![]),
                };
                Ok(Value::Fn(Rc::new(FnValue::Func { target: target.clone(), captures, closure, dims })))
            }
            ExprKind::Jvp { .. } | ExprKind::Vjp { .. } => self.transform_expr(e, frame),
            ExprKind::Tuple(items) => {
                let mut vals = Vec::with_capacity(items.len());
                for a in items {
                    vals.push(self.eval(a, frame)?);
                }
                Ok(Value::Tuple(Rc::new(vals)))
            }
            ExprKind::TupleGet(a, i) => match self.eval(a, frame)? {
                Value::Tuple(ts) => {
                    ts.get(*i).cloned().ok_or_else(|| rt(Code::E0605, "tuple index out of range", self.span(e)))
                }
                _ => Err(rt(Code::E0605, "not a tuple", self.span(e))),
            },
            ExprKind::Field(a, i) => match self.eval(a, frame)? {
                Value::Model(m) => {
                    m.fields.get(*i).cloned().ok_or_else(|| rt(Code::E0605, "no such field", self.span(e)))
                }
                Value::Sharded(s) => self.sharded_field(&s, *i, self.span(e)),
                _ => Err(rt(Code::E0605, "not a model", self.span(e))),
            },
            ExprKind::ModelInit { model, args, seed } => {
                let s = self.eval(seed, frame)?;
                let seed = s.tensor().and_then(value::scalar_i64).unwrap_or(0);
                let dims = self.type_arg_dims(args, frame, self.span(e))?;
                self.init_model(*model, dims, seed, String::new(), self.span(e)).map(Value::packed)
            }
            ExprKind::ModelBuild { fields } => {
                let mut vals = Vec::with_capacity(fields.len());
                for f in fields {
                    vals.push(self.eval(f, frame)?);
                }
                let Type::Model(id, args) = &e.ty else {
                    return Err(rt(Code::E0605, "not a model type", self.span(e)));
                };
                let dims = self.type_arg_dims(args, frame, self.span(e)).unwrap_or_default();
                Ok(Value::Model(Rc::new(ModelValue { model: *id, dims, fields: vals })).assembled())
            }
            ExprKind::Block { stmts, result } => {
                if self.spmd.is_some() && overlap::block_starts_collectives(stmts) && !overlap::overlap_off() {
                    return self.body_overlapped(stmts, result, frame);
                }
                for s in stmts {
                    self.stmt(s, frame)?;
                }
                self.eval(result, frame)
            }
            ExprKind::If { cond, then, els } => {
                let c = self.eval(cond, frame)?;
                if truthy(&c) {
                    self.eval(then, frame)
                } else {
                    self.eval(els, frame)
                }
            }
            ExprKind::ForRange { var, start, end, body } => {
                if self.accel.is_some() && !self.nan_check {
                    if let Some(r) = self.eval_region(e, frame) {
                        return r;
                    }
                }
                let a = self.eval(start, frame)?.tensor().and_then(value::scalar_i64).unwrap_or(0);
                let b = self.eval(end, frame)?.tensor().and_then(value::scalar_i64).unwrap_or(0);
                for i in a..b {
                    self.check_interrupt(self.span(e))?;
                    frame.locals[var.0 as usize] = Some(Value::Tensor(Tensor::scalar_i32(i as i32)));
                    self.eval(body, frame)?;
                }
                Ok(Value::unit())
            }
            ExprKind::ForBatches { body, .. } => self.for_batches(e, body, frame),
            ExprKind::While { cond, body } => {
                if self.accel.is_some() && !self.nan_check {
                    if let Some(r) = self.eval_region(e, frame) {
                        return r;
                    }
                }
                while truthy(&self.eval(cond, frame)?) {
                    self.check_interrupt(self.span(e))?;
                    self.eval(body, frame)?;
                }
                Ok(Value::unit())
            }
            ExprKind::Return(v) => {
                let v = self.eval(v, frame)?;
                Err(Ctrl::Return(v))
            }
        }
    }

    fn stmt(&mut self, s: &Stmt, frame: &mut Frame) -> R<()> {
        match s {
            Stmt::Assign { pat: Pat::Local(l), value } if self.assign_update(*l, value, frame)? => Ok(()),
            Stmt::Let { pat, value } => {
                let v = self.eval(value, frame)?;
                bind_pat(pat, v, frame);
                Ok(())
            }
            Stmt::Assign { pat, value } => {
                let v = self.eval(value, frame)?;
                let v = self.keep_pieces(pat, v, frame, self.span(value))?;
                bind_pat(pat, v, frame);
                Ok(())
            }
            Stmt::Expr(e) => self.eval(e, frame).map(|_| ()),
            Stmt::BindDims { local, dims, rank, span } => {
                let Some(Value::Tensor(t)) = &frame.locals[local.0 as usize] else { return Ok(()) };
                let shape = t.shape().to_vec();
                let span = self.prog.span(*span);
                if shape.len() != *rank {
                    return Err(rt(
                        Code::E0601,
                        format!("loaded array has rank {} ({:?}), expected rank {rank}", shape.len(), shape),
                        span,
                    ));
                }
                for (i, sym, d) in dims {
                    match sym {
                        Some(s) => match frame.dims.get(s) {
                            Some(&prev) if prev != shape[*i] as i64 => {
                                return Err(rt(
                                    Code::E0601,
                                    format!(
                                        "loaded array has {} in dimension {i}, but `{}` is already {prev}",
                                        shape[*i], self.prog.sym_names[s.0 as usize]
                                    ),
                                    span,
                                ))
                            }
                            _ => {
                                frame.dims.insert(*s, shape[*i] as i64);
                            }
                        },
                        None => {
                            let want = self.dim(frame, d, span)?;
                            if want != shape[*i] as i64 {
                                return Err(rt(
                                    Code::E0601,
                                    format!("loaded array has shape {:?}, but dimension {i} must be {want}", shape),
                                    span,
                                ));
                            }
                        }
                    }
                }
                Ok(())
            }
        }
    }

    pub(crate) fn type_arg_dims(&self, args: &[TypeArg], frame: &Frame, span: Span) -> R<Vec<i64>> {
        let mut out = Vec::new();
        for a in args {
            if let TypeArg::Dim(d) = a {
                out.push(self.dim(frame, d, span)?);
            }
        }
        Ok(out)
    }

    /// Initialises a model: each tensor field runs its initialiser with the generator keyed by
    /// (seed, field path); nested model fields recurse with a longer path.
    pub(crate) fn init_model(
        &mut self,
        id: crate::types::ModelId,
        dims: Vec<i64>,
        seed: i64,
        prefix: String,
        span: Span,
    ) -> R<Value> {
        let def = self.prog.model(id);
        // A stack initialises layer `l` as its inner model under the path `prefix.l`.
        if let Some(inner) = def.stack {
            let n = dims.first().copied().unwrap_or(0).max(0);
            // Split over a mesh axis (pipeline stages), a rank makes only its run of layers.
            let (lo, hi) = match (def.stack_axis, &self.spmd) {
                (Some(a), Some(s)) => {
                    let (k, i) = (s.mesh.size(a).max(1), s.mesh.group_index(s.rank(), &[a]));
                    if n % k != 0 {
                        let axis = &s.mesh.names[a.0 as usize];
                        return Err(rt(
                            Code::E0602,
                            format!("a stack of {n} layers does not split evenly over `{axis}` ({k} parts)"),
                            span,
                        ));
                    }
                    (i * n / k, (i + 1) * n / k)
                }
                _ => (0, n),
            };
            let mut layers = Vec::with_capacity((hi - lo) as usize);
            for l in lo..hi {
                let path = if prefix.is_empty() { l.to_string() } else { format!("{prefix}.{l}") };
                layers.push(self.init_model(inner, dims[1..].to_vec(), seed, path, span)?);
            }
            let v = stacks::stack_layers(self.prog, id, &layers).map_err(|e| rt(Code::E0605, e.to_string(), span))?;
            // Dims keep their global sizes in a sharded run: the stack has `n` layers.
            return Ok(match v {
                Value::Model(m) => Value::Model(Rc::new(ModelValue { model: m.model, dims, fields: m.fields.clone() })),
                v => v,
            });
        }
        let mut env = HashMap::new();
        for (s, v) in def.dims.iter().zip(&dims) {
            env.insert(*s, *v);
        }
        let frame = Frame { locals: vec![], dims: env, rests: HashMap::new() };
        let mut fields = Vec::new();
        for f in &def.fields {
            let name = self.prog.names.get(f.name);
            let path = if prefix.is_empty() { name.to_string() } else { format!("{prefix}.{name}") };
            match (&f.ty, f.init) {
                (_, Some(init)) => {
                    self.init_keys.push((seed, path));
                    let r = self.call(init, vec![], frame.dims.clone(), vec![]);
                    self.init_keys.pop();
                    fields.push(r?);
                }
                (Type::Model(mid, margs), None) => {
                    let mdims = self.type_arg_dims(margs, &frame, span)?;
                    fields.push(self.init_model(*mid, mdims, seed, path, span)?);
                }
                _ => {
                    return Err(rt(Code::E0605, format!("field `{path}` has no initialiser"), span));
                }
            }
        }
        Ok(Value::Model(Rc::new(ModelValue { model: id, dims, fields })))
    }

    /// Calls a function value.
    pub fn apply(&mut self, f: &FnValue, target: &FnTarget, args: Vec<Value>, span: Span) -> R<Value> {
        let (captures, closure, own, dims) = match f {
            FnValue::Func { captures, closure, target: own, dims } => {
                (captures.clone(), *closure, own.clone(), dims.clone())
            }
            FnValue::Pullback { .. } => return self.apply_pullback(f, args, span),
        };
        // The static target wins; a dynamic call uses what the value itself says.
        let target = match target {
            FnTarget::Dynamic => own,
            t => t.clone(),
        };
        let saved = std::mem::replace(&mut self.closure_dims, dims.into_iter().collect());
        let r = self.apply_target(&target, closure, &captures, args, span);
        self.closure_dims = saved;
        r
    }

    pub(crate) fn apply_target(
        &mut self,
        target: &FnTarget,
        closure: Option<crate::types::ClosureId>,
        captures: &[(Local, Value)],
        args: Vec<Value>,
        span: Span,
    ) -> R<Value> {
        match target {
            FnTarget::Func(fid) => self.call(*fid, args, HashMap::new(), captures.to_vec()),
            FnTarget::Dynamic => {
                let Some(cid) = closure else { return Err(rt(Code::E0605, "cannot call this function value", span)) };
                let fid = self
                    .pick_instance(cid, &args)
                    .ok_or_else(|| rt(Code::E0605, "closure was never checked for these argument types", span))?;
                self.call(fid, args, HashMap::new(), captures.to_vec())
            }
            FnTarget::Vmap { inner, in_axes } => match crate::autodiff::target_func(self.prog, target) {
                // The batched function the vmap pass generated; the loop is the fallback.
                Some(f) => self.call(f, args, HashMap::new(), captures.to_vec()),
                None => {
                    self.defer_next = None; // each element's call returns whole values
                    self.vmap(inner, in_axes, closure, captures, args, span)
                }
            },
            FnTarget::Grad { .. } => self.grad_call(target, closure, captures, args, span),
        }
    }

    /// The closure instance whose parameters match the arguments' element types and ranks.
    pub(crate) fn pick_instance(&self, cid: crate::types::ClosureId, args: &[Value]) -> Option<FuncId> {
        let insts = &self.prog.closures.get(cid.0 as usize)?.instances;
        let fits = |fid: FuncId| {
            let f = self.prog.func(fid);
            f.params.iter().zip(args).all(|(l, a)| match (&f.locals[l.0 as usize].ty, a) {
                (Type::Tensor(TensorTy { elem: e, shape: s, .. }), Value::Tensor(t)) => {
                    let rank_ok = s.iter().any(|i| matches!(i, ShapeItem::Rest(_))) || s.len() == t.rank();
                    rank_ok && dtype_of(e.materialise()) == t.dtype()
                }
                _ => true,
            })
        };
        insts.iter().map(|(_, f)| *f).find(|f| fits(*f)).or_else(|| insts.first().map(|(_, f)| *f))
    }

    /// `vmap`: the reference semantics is a loop over the mapped axis, stacking the results.
    fn vmap(
        &mut self,
        inner: &FnTarget,
        in_axes: &[Option<usize>],
        closure: Option<crate::types::ClosureId>,
        captures: &[(Local, Value)],
        args: Vec<Value>,
        span: Span,
    ) -> R<Value> {
        let axes: Vec<Option<usize>> = if in_axes.is_empty() { vec![Some(0); args.len()] } else { in_axes.to_vec() };
        let mut n = None;
        for (a, ax) in args.iter().zip(&axes) {
            if let (Value::Tensor(t), Some(ax)) = (a, ax) {
                let len = t.shape().get(*ax).copied().ok_or_else(|| rt(Code::E0602, "vmap axis out of range", span))?;
                if n.is_some_and(|m| m != len) {
                    return Err(rt(Code::E0602, "vmap mapped dims differ", span));
                }
                n = Some(len);
            }
        }
        let n = n.unwrap_or(1);
        let mut outs = Vec::with_capacity(n);
        for i in 0..n {
            let mut sub = Vec::with_capacity(args.len());
            for (a, ax) in args.iter().zip(&axes) {
                match (a, ax) {
                    (Value::Tensor(t), Some(ax)) => {
                        let mut specs = vec![kernels::ops::SliceSpec::Full; *ax];
                        specs.push(kernels::ops::SliceSpec::Index(i as i64));
                        let p = kernels::KernelParams::new().slices(&specs);
                        sub.push(Value::Tensor(self.kernel1(kernels::KernelId::Slice, t, p, span)?));
                    }
                    (v, _) => sub.push(v.clone()),
                }
            }
            outs.push(self.apply_target(inner, closure, captures, sub, span)?);
        }
        self.stack_values(outs, span)
    }

    fn stack_values(&self, outs: Vec<Value>, span: Span) -> R<Value> {
        match outs.first() {
            Some(Value::Tensor(_)) => {
                let ts: Vec<&Tensor> =
                    outs.iter().filter_map(|v| if let Value::Tensor(t) = v { Some(t) } else { None }).collect();
                let p = kernels::KernelParams::new().axis(0);
                Ok(Value::Tensor(self.kernel(kernels::KernelId::Stack, &ts, &p, span)?))
            }
            Some(Value::Tuple(first)) => {
                let k = first.len();
                let mut cols: Vec<Vec<Value>> = vec![Vec::new(); k];
                for v in outs {
                    if let Value::Tuple(ts) = v {
                        for (i, x) in ts.iter().enumerate() {
                            cols[i].push(x.clone());
                        }
                    }
                }
                let items = cols.into_iter().map(|c| self.stack_values(c, span)).collect::<R<Vec<_>>>()?;
                Ok(Value::Tuple(Rc::new(items)))
            }
            _ => Ok(Value::unit()),
        }
    }
}

pub(crate) use crate::ir::eval::dtype_of;

pub(crate) fn lit_value(l: &Lit, ty: &Type) -> Value {
    match l {
        Lit::Str(s) => Value::Str(s.as_str().into()),
        _ => Value::Tensor(crate::ir::eval::lit_tensor(l, ty).unwrap_or_else(|| Tensor::scalar_bool(false))),
    }
}

fn truthy(v: &Value) -> bool {
    match v {
        Value::Tensor(t) => t.as_bool().is_some_and(|b| b.first().copied().unwrap_or(false)),
        _ => false,
    }
}

fn bind_pat(p: &Pat, v: Value, frame: &mut Frame) {
    match p {
        Pat::Local(l) => frame.locals[l.0 as usize] = Some(v),
        Pat::Ignore => {}
        Pat::Tuple(ps) => {
            if let Value::Tuple(vs) = v {
                for (p, v) in ps.iter().zip(vs.iter()) {
                    bind_pat(p, v.clone(), frame);
                }
            }
        }
    }
}

/// Binds the generic dims of a parameter type from an argument's actual shape.
/// Binds the dims of `ty` from the shape of `v`. In a sharded run a value holds its block, so a
/// split dim's global size is the block's times the number of blocks.
pub(crate) fn bind_dims_from(ty: &Type, v: &Value, frame: &mut Frame, mesh: Option<&crate::dist::Mesh>) {
    match (ty, v) {
        (Type::Tensor(TensorTy { shape, layout, .. }), Value::Tensor(t)) => {
            let mut dims = t.shape().to_vec();
            if let Some(mesh) = mesh {
                for (d, axes) in dims.iter_mut().zip(&layout.0) {
                    *d *= mesh.parts(axes).max(1) as usize;
                }
            }
            let rest = shape.iter().position(|i| matches!(i, ShapeItem::Rest(_)));
            let suffix = rest.map(|r| shape.len() - r - 1);
            for (i, item) in shape.iter().enumerate() {
                let actual = match (rest, suffix) {
                    (Some(r), Some(sfx)) if i > r => {
                        dims.len().checked_sub(sfx - (i - r - 1)).and_then(|j| dims.get(j))
                    }
                    _ => dims.get(i),
                };
                match item {
                    ShapeItem::Dim(d) => {
                        if let (Some(s), Some(&a)) = (d.as_var(), actual) {
                            frame.dims.entry(s).or_insert(a as i64);
                        }
                    }
                    ShapeItem::Rest(r) => {
                        let sfx = suffix.unwrap_or(0);
                        let end = dims.len().saturating_sub(sfx);
                        let mid: Vec<i64> = dims.get(i..end).unwrap_or(&[]).iter().map(|&x| x as i64).collect();
                        frame.rests.insert(*r, mid);
                    }
                }
            }
        }
        (Type::Model(_, args), Value::Model(m)) => {
            let mut vals = m.dims.iter();
            for a in args {
                if let TypeArg::Dim(d) = a {
                    if let (Some(s), Some(&x)) = (d.as_var(), vals.next()) {
                        frame.dims.entry(s).or_insert(x);
                    }
                }
            }
        }
        (_, Value::Sharded(s)) => bind_dims_from(ty, &s.value, frame, mesh),
        (Type::Tuple(ts), Value::Tuple(vs)) => {
            for (t, v) in ts.iter().zip(vs.iter()) {
                bind_dims_from(t, v, frame, mesh);
            }
        }
        _ => {}
    }
}

impl Interp<'_> {
    /// A primitive application's value, op by op: its operands, then the primitive.
    fn eval_prim_node(
        &mut self,
        e: &Expr,
        prim: ir::Prim,
        args: &[Expr],
        attrs: &ir::Attrs,
        frame: &mut Frame,
    ) -> R<Value> {
        let mut vals = Vec::with_capacity(args.len());
        if prim == ir::Prim::Map {
            for a in args {
                vals.push(self.eval(a, frame)?);
            }
            return self.map(vals, self.span(e));
        }
        if prim == ir::Prim::MatMul {
            return self.matmul(args, e, frame);
        }
        for a in args {
            vals.push(self.eval(a, frame)?);
        }
        if self.trace.is_none() {
            return self.prim(prim, vals, attrs, e, frame);
        }
        let sent = match prim {
            // As the communicator counts them: bools travel as i32.
            crate::collective_prims!() if prim != ir::Prim::LocalSlice => {
                vals.first().and_then(Value::tensor).map(|t| {
                    (t.len() * t.dtype().size_in_bytes().max(4 * usize::from(t.dtype() == kernels::DType::Bool))) as u64
                })
            }
            _ => None, // any other primitive: sends no message
        };
        let t0 = self.trace_start();
        let r = self.prim(prim, vals, attrs, e, frame);
        self.trace_prim(t0, prim, e, &r, sent);
        r
    }

    /// `--nan-check`: an error at `e` when a float tensor of `v` holds a NaN or an infinity.
    fn check_finite(&self, prim: ir::Prim, v: &Value, e: &Expr) -> R<()> {
        let mut leaves = Vec::new();
        v.leaves(&mut leaves);
        for t in leaves {
            let bad = match t.storage() {
                kernels::Storage::F32(x) => x.iter().position(|a| !a.is_finite()).map(|i| (i, f64::from(x[i]))),
                kernels::Storage::F64(x) => x.iter().position(|a| !a.is_finite()).map(|i| (i, x[i])),
                _ => None,
            };
            if let Some((i, a)) = bad {
                let what = if a.is_nan() { "NaN".to_string() } else { format!("{a}") };
                let at = if t.rank() == 0 { String::new() } else { format!(" at element {i} of {:?}", t.shape()) };
                return Err(rt(
                    Code::E0606,
                    format!("`{}` produced {what}{at} (--nan-check)", prim.name()),
                    self.span(e),
                ));
            }
        }
        Ok(())
    }
}
