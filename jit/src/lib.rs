//! msl's Cranelift JIT: compiled function bodies and scalar loops (every level), fusion of
//! elementwise trees (`-O1`) and the whole-program passes and memory plan of `-O2` (`prepare`).
//!
//! The interpreter stays the reference semantics; through `lang::interp::Accel` it asks this
//! crate for the native code of every function body it runs (`host::body`: native control flow
//! calling the interpreter's operations one at a time), offers it every loop, which `host`
//! compiles whole when all its values are scalars, and each maximal tree
//! of elementwise primitives over float and bool tensors (`gelu(x * w + b)`, the body of
//! `nn.layer_norm` after its reductions). Each tree becomes one Cranelift loop that reads every
//! input once and writes the output once (`codegen`), run over broadcast shapes and threads by
//! `exec`. A process-wide (per thread) compile cache keyed by the tree's structure and element
//! types means a loop body or a second call reuses code; sizes are run-time arguments, so one
//! compile serves every shape. Trees whose run-time element types the JIT does not handle fall
//! back to op-by-op interpretation from the same inputs, and are counted.
//!
//! Results are bit-identical to the interpreter's (see `codegen`); the spec harness runs every
//! spec block both ways, and `tests/ops.rs` compares every op on random and special inputs.

pub mod codegen;
pub mod cuda;
pub mod exec;
pub mod fuse;
mod helpers;
pub mod host;
mod lower;
pub mod proggen;

use codegen::{Jit, Spec};
use kernels::{KernelError, Tensor};
use lang::interp::{Accel, Interp, Operand, Region, RegionRun};
use lang::ir::{Expr, ExprId, SpanId};
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

/// How much the JIT does.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// The `-O` level: 0 compiles scalar loops and runs tensor ops one kernel each, 1 also fuses
    /// elementwise trees, 2 adds the whole-program passes and the memory plan.
    pub level: u8,
    /// Trees with fewer operations are left to the interpreter's kernels (a lone op gains
    /// nothing from fusion).
    pub min_ops: usize,
}

impl Options {
    /// The options of `msl run --mode jit -O<level>`.
    pub fn level(level: u8) -> Options {
        Options { level, min_ops: 2 }
    }
}

/// What happened at one fused tree (one source location), for `--explain`.
#[derive(Clone, Debug)]
pub struct Site {
    pub span: SpanId,
    /// The tree as a term over its inputs (`gelu(add(mul(in0, in1), in2))`).
    pub term: String,
    pub ops: Vec<&'static str>,
    pub inputs: usize,
    /// Calls run by compiled code, and calls that fell back to the interpreter.
    pub calls: u64,
    pub fallbacks: u64,
    /// Why the last fallback happened.
    pub fallback_reason: Option<String>,
    /// Compilations for this tree (one per distinct element types / broadcast pattern) and
    /// their code generation times in microseconds.
    pub compiles: Vec<f64>,
    /// Whether the last compiled run used vector code.
    pub vector: Option<kernels::DType>,
    /// Calls that wrote their result into an input's buffer (`-O2`).
    pub reused: u64,
    /// Calls run on the interpreter's accelerator by the kernel its code generator wrote from
    /// the tree (`--device cuda`), counted in `calls` too.
    pub on_device: u64,
}

/// What happened at one loop of host code, for `--explain`.
#[derive(Clone, Debug)]
pub struct LoopSite {
    pub span: SpanId,
    /// Scalar operations in the loop (calls included), when it compiles.
    pub ops: usize,
    /// Times the loop ran as native code, and times the interpreter ran it.
    pub calls: u64,
    pub interpreted: u64,
    /// Why the interpreter ran it (the JIT compiles only loops of scalars).
    pub reason: Option<String>,
    /// Compile times in microseconds, one per distinct set of input element types.
    pub compiles: Vec<f64>,
}

/// What happened to one function body, for `--explain`.
#[derive(Clone, Debug)]
pub struct BodySite {
    pub func: lang::types::FuncId,
    /// Operations the native code calls (one per primitive or fused tree, call, binding…).
    pub ops: usize,
    /// Compile time in microseconds (`None`: found in the cache).
    pub compile: Option<f64>,
    /// Why the interpreter runs it instead (compilation failed).
    pub fallback: Option<String>,
    pub runs: Rc<std::cell::Cell<u64>>,
}

/// Everything the JIT did in one run, shared with whoever installed it.
#[derive(Debug, Default)]
pub struct Report {
    pub sites: Vec<Site>,
    pub loops: Vec<LoopSite>,
    pub bodies: Vec<BodySite>,
    /// Site of each tree root, by its expression's id.
    index: HashMap<ExprId, usize>,
}

impl Report {
    /// The total number of fallbacks.
    pub fn fallbacks(&self) -> u64 {
        self.sites.iter().map(|s| s.fallbacks).sum()
    }
    /// The total number of fused calls that ran compiled code.
    pub fn calls(&self) -> u64 {
        self.sites.iter().map(|s| s.calls).sum()
    }
}

impl Report {
    /// The number of loops the interpreter ran (fallbacks of host code).
    pub fn interpreted_loops(&self) -> u64 {
        self.loops.iter().map(|l| l.interpreted).sum()
    }

    /// The number of function bodies the interpreter ran because they did not compile.
    pub fn interpreted_bodies(&self) -> usize {
        self.bodies.iter().filter(|b| b.fallback.is_some()).count()
    }
}

thread_local! {
    static JIT: RefCell<Option<Result<Jit, String>>> = const { RefCell::new(None) };
    /// Accelerators alive on this thread: their memos point into the module's code.
    static LIVE: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Compiled functions the module may hold before [`install`] frees it (when no accelerator is
/// alive), so that a REPL session or a long fuzz run does not grow without bound.
pub const MAX_CACHED: usize = 4096;

/// Frees this thread's JIT module and its compile cache when it holds more than `limit`
/// functions and no accelerator that could point into it is alive; whether it did.
pub fn release_code(limit: usize) -> bool {
    if LIVE.with(|l| l.get()) > 0 {
        return false;
    }
    JIT.with(|j| {
        let mut j = j.borrow_mut();
        let full = matches!(&*j, Some(Ok(jit)) if jit.cached() > limit);
        if full {
            if let Some(Ok(jit)) = j.take() {
                // SAFETY: no accelerator is alive on this thread, and only accelerators keep
                // pointers to compiled code (their memos and compiled bodies), so nothing can
                // call into the module after this.
                unsafe { jit.free() };
            }
        }
        full
    })
}

/// The accelerator installed into the interpreter.
pub struct JitAccel<'p> {
    prog: &'p lang::ir::Program,
    opts: Options,
    /// Every loop `plan_region` has seen, by id: its analysis and site, or its site
    /// alone when it does not compile.
    loops: HashMap<ExprId, (Option<Rc<host::Analysis>>, usize)>,
    /// The compiled code of each loop for the input element types it last ran with.
    loop_memo: HashMap<ExprId, (Vec<kernels::DType>, host::CompiledRegion)>,
    /// Every primitive application `plan` has seen, by id: its tree, or `None` when it
    /// does not root one.
    planned: HashMap<ExprId, Option<Planned>>,
    /// The compiled body of each function run so far (`None`: it did not compile).
    bodies: HashMap<lang::types::FuncId, Option<Rc<host::body::Body>>>,
    report: Rc<RefCell<Report>>,
    /// The interpreter's device: fused trees go to its accelerator when it has one that runs
    /// them (`Device::accelerates`), and to Cranelift's code otherwise.
    device: Arc<dyn kernels::Device>,
}

struct Planned {
    tree: Rc<fuse::Tree>,
    site: usize,
    /// What the last call compiled to, reused while the inputs keep their element types, ranks
    /// and broadcast pattern (loops call the same tree with the same kinds of inputs).
    memo: Option<Memo>,
}

/// A compiled loop, its output's element type, the layout it was asked for, and the tree as
/// an accelerator device takes it (when one runs it).
type Kernel = (codegen::KernelFn, kernels::DType, exec::Layout, Option<Arc<kernels::ops::Fused>>);

struct Memo {
    inputs: Vec<(kernels::DType, bool)>,
    bcast: Vec<bool>,
    out: kernels::DType,
    f: codegen::KernelFn,
    /// The tree as devices take it, kept for an accelerator.
    fused: Option<Arc<kernels::ops::Fused>>,
}

impl Drop for JitAccel<'_> {
    fn drop(&mut self) {
        LIVE.with(|l| l.set(l.get().saturating_sub(1)));
    }
}

impl<'p> JitAccel<'p> {
    pub fn new(
        prog: &'p lang::ir::Program,
        opts: Options,
        device: Arc<dyn kernels::Device>,
    ) -> (JitAccel<'p>, Rc<RefCell<Report>>) {
        LIVE.with(|l| l.set(l.get() + 1));
        let report = Rc::new(RefCell::new(Report::default()));
        let accel = JitAccel {
            prog,
            opts,
            loops: HashMap::new(),
            loop_memo: HashMap::new(),
            planned: HashMap::new(),
            bodies: HashMap::new(),
            report: report.clone(),
            device,
        };
        (accel, report)
    }

    fn site(&self, tree: &fuse::Tree, addr: ExprId) -> usize {
        let mut r = self.report.borrow_mut();
        if let Some(&i) = r.index.get(&addr) {
            return i;
        }
        let site = Site {
            span: tree.span,
            term: tree.term(),
            ops: tree.op_names(),
            inputs: tree.n_inputs,
            calls: 0,
            fallbacks: 0,
            fallback_reason: None,
            compiles: Vec::new(),
            vector: None,
            reused: 0,
            on_device: 0,
        };
        r.sites.push(site);
        let i = r.sites.len() - 1;
        r.index.insert(addr, i);
        i
    }

    fn fallback(&self, site: usize, why: String) -> Option<Result<Tensor, KernelError>> {
        let mut r = self.report.borrow_mut();
        r.sites[site].fallbacks += 1;
        r.sites[site].fallback_reason = Some(why);
        None
    }

    /// The inputs on the interpreter's device and the launch's parameters, when the device has
    /// an accelerator that runs `tree` on them.
    fn for_accelerator(
        &self,
        tree: Arc<kernels::ops::Fused>,
        inputs: &[Tensor],
    ) -> Option<(Vec<kernels::DeviceTensor>, kernels::KernelParams)> {
        let ds = inputs.iter().map(|t| self.device.upload(t)).collect::<Result<Vec<_>, _>>().ok()?;
        let p = kernels::KernelParams::new().fused(tree);
        let refs: Vec<&kernels::DeviceTensor> = ds.iter().collect();
        let runs = self.device.accelerates(kernels::KernelId::Fused, &refs, &p);
        runs.then_some((ds, p))
    }

    /// The tree run on the interpreter's accelerator by the kernel its code generator writes,
    /// when it has one that runs it; `None` leaves the tree to Cranelift's code.
    fn on_device(
        &self,
        tree: Arc<kernels::ops::Fused>,
        inputs: &[Tensor],
        site: usize,
    ) -> Option<Result<Tensor, KernelError>> {
        let (ds, p) = self.for_accelerator(tree, inputs)?;
        let refs: Vec<&kernels::DeviceTensor> = ds.iter().collect();
        let dev = &self.device;
        let t = dev.launch(kernels::KernelId::Fused, &refs, &p).and_then(|out| dev.download(&out));
        let mut r = self.report.borrow_mut();
        r.sites[site].calls += 1;
        r.sites[site].on_device += 1;
        Some(t)
    }

    /// Types, lays out and compiles (or finds in the cache) the loop for these inputs.
    /// The compiled loop of the planned tree at `addr` for inputs like `inputs` (their element
    /// types, which are scalars, and how they broadcast): the memo's when it fits, else
    /// compiled (or found in the compile cache) and memoised.
    fn kernel(&mut self, addr: ExprId, inputs: &[Tensor]) -> Result<Kernel, String> {
        let p = self.planned.get(&addr).and_then(Option::as_ref).ok_or("not planned")?;
        let same_kinds = |m: &Memo| {
            m.inputs.len() == inputs.len()
                && m.inputs.iter().zip(inputs).all(|(k, t)| k.0 == t.dtype() && k.1 == (t.rank() == 0))
        };
        let hit = p.memo.as_ref().filter(|m| same_kinds(m)).and_then(|m| {
            let lay = exec::layout(inputs)?;
            (lay.bcast == m.bcast).then(|| (m.f, m.out, lay, m.fused.clone()))
        });
        if let Some(h) = hit {
            return Ok(h);
        }
        let (memo, lay) = self.prepare(addr, inputs)?;
        let h = (memo.f, memo.out, lay, memo.fused.clone());
        if let Some(Some(p)) = self.planned.get_mut(&addr) {
            p.memo = Some(memo);
        }
        Ok(h)
    }

    fn prepare(&mut self, addr: ExprId, inputs: &[Tensor]) -> Result<(Memo, exec::Layout), String> {
        let p = self.planned.get(&addr).and_then(Option::as_ref).ok_or("not planned")?;
        let tree = p.tree.clone();
        let site = p.site;
        let Some(typed) = fuse::type_tree(&tree, inputs) else {
            let types: Vec<String> = inputs.iter().map(|t| t.dtype().to_string()).collect();
            return Err(format!("input element types ({}) not compiled", types.join(", ")));
        };
        let lay = exec::layout(inputs).ok_or("input shapes do not broadcast along rows")?;
        let vector = fuse::vector_type(&tree, &typed, inputs);
        let key = fuse::key(&tree, &typed, &lay.bcast, vector);
        let spec = Spec { tree: &tree, typed: &typed, bcast: &lay.bcast, vector };
        let (c, fresh) = JIT.with(|j| {
            let mut j = j.borrow_mut();
            match j.get_or_insert_with(Jit::new) {
                Ok(jit) => jit.get_or_compile(&key, &spec),
                Err(e) => Err(e.clone()),
            }
        })?;
        RECORD.with(|r| {
            if let Some(trees) = r.borrow_mut().as_mut() {
                trees.entry(key.clone()).or_insert_with(|| ((*tree).clone(), typed.clone()));
            }
        });
        let mut r = self.report.borrow_mut();
        r.sites[site].vector = vector;
        if fresh {
            r.sites[site].compiles.push(c.micros);
        }
        let memo = Memo {
            inputs: inputs.iter().map(|t| (t.dtype(), t.rank() == 0)).collect(),
            bcast: lay.bcast.clone(),
            out: *typed.dtype.last().ok_or("empty tree")?,
            f: c.f,
            // Asked once per compiled kernel, so the CPU's runs pay nothing per call.
            fused: fuse::device_tree(&tree, &typed)
                .map(Arc::new)
                .filter(|t| self.for_accelerator(t.clone(), inputs).is_some()),
        };
        Ok((memo, lay))
    }
}

thread_local! {
    static RECORD: RefCell<Option<std::collections::BTreeMap<String, (fuse::Tree, fuse::Typed)>>> =
        const { RefCell::new(None) };
}

/// Runs `f` and returns with its result every distinct fused tree, with its typing, that the
/// JIT compiled or took from its cache on this thread meanwhile (keyed by [`fuse::key`]): the
/// trees a device code generator such as [`cuda::source`] must handle.
pub fn recording_trees<R>(f: impl FnOnce() -> R) -> (R, Vec<(fuse::Tree, fuse::Typed)>) {
    let outer = RECORD.with(|r| r.borrow_mut().replace(Default::default()));
    let out = f();
    let trees = RECORD.with(|r| std::mem::replace(&mut *r.borrow_mut(), outer)).unwrap_or_default();
    (out, trees.into_values().collect())
}

/// The whole-program passes of `-O2` (none below): run on the checked program before an
/// interpreter borrows it.
pub fn prepare(prog: &mut lang::ir::Program, opts: Options) -> Option<lang::ir::opt::OptReport> {
    (opts.level >= 2).then(|| lang::passes::optimize(prog))
}

/// Installs the JIT into an interpreter (at `-O2` with the memory plan's last uses); the
/// report fills as the program runs.
pub fn install<'p>(it: &mut Interp<'p>, opts: Options) -> Rc<RefCell<Report>> {
    // Replacing an accelerator drops it first, so its code may go too.
    it.accel = None;
    release_code(MAX_CACHED);
    let (accel, report) = JitAccel::new(it.prog, opts, it.device.clone());
    it.accel = Some(Box::new(accel));
    if opts.level >= 2 {
        it.move_at_last_uses();
    }
    report
}

impl<'p> host::body::Planner<'p> for JitAccel<'p> {
    fn fused(&mut self, e: &'p Expr) -> Option<Vec<&'p Expr>> {
        Accel::plan(self, e)
    }

    fn scalar_loop(&mut self, e: &'p Expr) -> bool {
        self.loop_analysis(e).0.is_some()
    }
}

impl<'p> JitAccel<'p> {
    /// The analysis of the loop `e` (`None`: it does not compile whole) and its report site,
    /// worked out once per loop.
    fn loop_analysis(&mut self, e: &Expr) -> (Option<Rc<host::Analysis>>, usize) {
        let addr = e.id;
        if let Some(x) = self.loops.get(&addr) {
            return x.clone();
        }
        let r = host::analyse(self.prog, e);
        let mut rep = self.report.borrow_mut();
        let (ops, reason) = match &r {
            Ok(a) => (a.ops, None),
            Err(why) => (0, Some(why.clone())),
        };
        rep.loops.push(LoopSite { span: e.span, ops, calls: 0, interpreted: 0, reason, compiles: Vec::new() });
        let entry = (r.ok().map(Rc::new), rep.loops.len() - 1);
        self.loops.insert(addr, entry.clone());
        entry
    }

    /// Flattens and compiles the body of `f` (see `host::body`).
    fn compile_body(&mut self, f: lang::types::FuncId) -> (Option<Rc<host::body::Body>>, BodySite) {
        let prog = self.prog;
        let body = &prog.func(f).body;
        let flat = host::body::flatten(body, self);
        let mut site =
            BodySite { func: f, ops: flat.code.calls(), compile: None, fallback: None, runs: Default::default() };
        let r = JIT.with(|j| {
            let mut j = j.borrow_mut();
            match j.get_or_insert_with(Jit::new) {
                Ok(jit) => jit.get_or_compile_body(&flat.code),
                Err(e) => Err(e.clone()),
            }
        });
        match r {
            Ok((code, us, fresh)) => {
                site.compile = fresh.then_some(us);
                let b = host::body::Body {
                    f: code,
                    ops: flat.ops,
                    slots: flat.slots,
                    states: flat.states,
                    result: flat.result,
                    runs: site.runs.clone(),
                };
                (Some(Rc::new(b)), site)
            }
            Err(why) => {
                site.fallback = Some(why);
                (None, site)
            }
        }
    }
}

impl Accel for JitAccel<'_> {
    fn set_device(&mut self, device: Arc<dyn kernels::Device>) {
        self.device = device;
    }

    fn body(&mut self, f: lang::types::FuncId) -> Option<Rc<dyn lang::interp::host::CompiledBody>> {
        if let Some(b) = self.bodies.get(&f) {
            return b.clone().map(|b| b as Rc<dyn lang::interp::host::CompiledBody>);
        }
        let (b, site) = self.compile_body(f);
        self.report.borrow_mut().bodies.push(site);
        self.bodies.insert(f, b.clone());
        b.map(|b| b as Rc<dyn lang::interp::host::CompiledBody>)
    }

    fn plan_region<'e>(&mut self, e: &'e Expr) -> Option<Region<'e>> {
        let (an, site) = self.loop_analysis(e);
        let Some(an) = an else {
            self.report.borrow_mut().loops[site].interpreted += 1;
            return None;
        };
        let mut leaves = Vec::with_capacity(an.n_leaves);
        host::leaves(e, &mut leaves);
        Some(Region { locals: an.locals.clone(), leaves, outputs: an.outputs.clone() })
    }

    fn run_region(&mut self, e: &Expr, inputs: &[Tensor], interrupt: &AtomicBool) -> RegionRun {
        let addr = e.id;
        let Some((Some(an), site)) = self.loops.get(&addr).cloned() else { return RegionRun::Decline };
        let dtypes: Vec<kernels::DType> = inputs.iter().map(Tensor::dtype).collect();
        let code = match self.loop_memo.get(&addr) {
            Some((d, c)) if *d == dtypes => c.clone(),
            _ => {
                let r = JIT.with(|j| {
                    let mut j = j.borrow_mut();
                    match j.get_or_insert_with(Jit::new) {
                        Ok(jit) => jit.get_or_compile_region(self.prog, e, &an, &dtypes),
                        Err(e) => Err(e.clone()),
                    }
                });
                match r {
                    Ok((c, fresh)) => {
                        if fresh {
                            self.report.borrow_mut().loops[site].compiles.push(c.micros);
                        }
                        self.loop_memo.insert(addr, (dtypes, c.clone()));
                        c
                    }
                    Err(why) => {
                        let mut rep = self.report.borrow_mut();
                        rep.loops[site].interpreted += 1;
                        rep.loops[site].reason = Some(why);
                        return RegionRun::Decline;
                    }
                }
            }
        };
        let ins: Vec<u64> = inputs.iter().map(host::slot).collect();
        let mut outs = vec![0u64; code.outputs.len()];
        let flag = interrupt as *const AtomicBool as *const u8;
        // SAFETY: the region reads `ins.len()` slots, writes `outs.len()` slots (both as
        // compiled for exactly these inputs and outputs) and reads one byte of the flag.
        let status = unsafe { (code.f)(ins.as_ptr(), outs.as_mut_ptr(), flag) };
        let mut rep = self.report.borrow_mut();
        match status {
            host::OK => {
                rep.loops[site].calls += 1;
                RegionRun::Done(outs.iter().zip(&code.outputs).map(|(s, d)| host::from_slot(*s, *d)).collect())
            }
            host::INTERRUPTED => RegionRun::Interrupted,
            _ => {
                rep.loops[site].interpreted += 1;
                rep.loops[site].reason = Some(
                    "an integer division by zero, a negative integer power or a float with no i32 value \
                     (the interpreter reports it)"
                        .into(),
                );
                RegionRun::Decline
            }
        }
    }

    fn try_eval_parts(
        &mut self,
        e: &Expr,
        inputs: &mut [Operand],
        lens: &[usize],
    ) -> Option<Result<Tensor, KernelError>> {
        let n: usize = lens.iter().sum();
        // One stand-in per input for the kernel's types and broadcast pattern: part 0 of each
        // model (every part is contiguous), the scalars as they are.
        let first = *lens.first()?;
        let mut reps = Vec::with_capacity(inputs.len());
        for op in inputs.iter() {
            let t = match op {
                Operand::Scalar(t) if t.rank() == 0 => t.clone(),
                // Read once per part, so only a rank-0 tensor.
                Operand::Scalar(_) => return None,
                Operand::Flat(t) => t.view(0, vec![first]).ok()?,
                Operand::Parts(ts) => ts.first()?.with_shape(vec![first]).ok()?,
            };
            if t.dtype().is_half() {
                return None;
            }
            reps.push(t);
        }
        let site = self.planned.get(&e.id)?.as_ref()?.site;
        let (f, out, _, fused) = match self.kernel(e.id, &reps) {
            Ok(k) => k,
            Err(why) => return self.fallback(site, why),
        };
        // A tree an accelerator device runs goes to it tensor by tensor (op by op).
        if fused.is_some() {
            return None;
        }
        drop(reps);
        let mut parts = Vec::with_capacity(inputs.len());
        for op in inputs.iter() {
            parts.push(match op {
                Operand::Scalar(t) => exec::PartInput::Each(t.storage().addr()),
                Operand::Flat(t) => {
                    if t.len() != n {
                        return None;
                    }
                    let (base, size) = (t.storage().addr(), t.dtype().size_in_bytes());
                    let mut at = 0;
                    let addrs = lens
                        .iter()
                        .map(|&l| {
                            at += l;
                            base + (at - l) * size
                        })
                        .collect();
                    exec::PartInput::Parts(addrs, size)
                }
                Operand::Parts(ts) => {
                    let ok = ts.len() == lens.len() && ts.iter().zip(lens).all(|(t, &l)| t.len() == l);
                    if !ok {
                        return None;
                    }
                    let size = ts[0].dtype().size_in_bytes();
                    exec::PartInput::Parts(ts.iter().map(|t| t.storage().addr()).collect(), size)
                }
            });
        }
        let reuse = self.opts.level >= 2;
        let donor = inputs.iter_mut().find_map(|op| match op {
            Operand::Flat(t) if reuse && t.dtype() == out && t.len() == n => Some(t),
            _ => None,
        });
        let (t, reused) = exec::run_parts(f, &parts, lens, out, donor);
        let mut r = self.report.borrow_mut();
        r.sites[site].calls += 1;
        r.sites[site].reused += u64::from(reused);
        Some(Ok(t))
    }

    fn plan<'e>(&mut self, e: &'e Expr) -> Option<Vec<&'e Expr>> {
        if self.opts.level == 0 || !fuse::may_root(e) {
            return None;
        }
        let addr = e.id;
        match self.planned.get(&addr) {
            Some(None) => None,
            Some(Some(p)) => {
                let mut leaves = Vec::with_capacity(p.tree.n_inputs);
                fuse::leaves(e, &mut leaves);
                Some(leaves)
            }
            None => {
                let (tree, leaves) = fuse::analyse(e);
                if tree.op_names().len() < self.opts.min_ops {
                    self.planned.insert(addr, None);
                    return None;
                }
                let site = self.site(&tree, addr);
                let tree = Rc::new(tree);
                self.planned.insert(addr, Some(Planned { tree, site, memo: None }));
                Some(leaves)
            }
        }
    }

    fn try_eval(&mut self, e: &Expr, inputs: &mut [Tensor]) -> Option<Result<Tensor, KernelError>> {
        // Storage-only types (a model's bf16 buffer) are computed by the interpreter.
        if inputs.iter().any(|t| t.dtype().is_half()) {
            return None;
        }
        let site = self.planned.get(&e.id)?.as_ref()?.site;
        let (f, out, lay, fused) = match self.kernel(e.id, inputs) {
            Ok(k) => k,
            Err(why) => return self.fallback(site, why),
        };
        if let Some(tree) = fused {
            if let Some(t) = self.on_device(tree, inputs, site) {
                return Some(t);
            }
        }
        let (t, reused) = exec::run(f, inputs, &lay, out, self.opts.level >= 2);
        let mut r = self.report.borrow_mut();
        r.sites[site].calls += 1;
        r.sites[site].reused += u64::from(reused);
        Some(Ok(t))
    }
}

/// Runs a spec block (its `main`, then its `test`s) with the JIT installed at `opts`, after
/// `-O2`'s passes when the level asks for them: the outcome, and what the JIT did (empty when
/// the block did not check).
pub fn run_block(code: &str, dir: &std::path::Path, opts: Options) -> (lang::spec::Outcome, Rc<RefCell<Report>>) {
    let mut report = None;
    let out = lang::spec::run_block_prepared(
        code,
        dir,
        &mut |p| {
            prepare(p, opts);
        },
        &mut |it| report = Some(install(it, opts)),
    );
    (out, report.unwrap_or_default())
}

/// The number of loops in this thread's compile cache.
pub fn cached_loops() -> usize {
    JIT.with(|j| j.borrow().as_ref().and_then(|r| r.as_ref().ok()).map_or(0, Jit::cached))
}
