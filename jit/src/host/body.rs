//! Compiled function bodies: host code holding tensors, tuples, models and functions becomes
//! native code that calls the run-time library (`lang::interp::host`) once per operation.
//!
//! A body is first flattened into a [`Code`] tree over a table of [`Op`]s — one op per
//! primitive application (or fused tree, as the accelerator plans it), call, tuple or model
//! operation, binding, loop bound or condition — then emitted as one Cranelift function
//! `f(ctx) -> status`. The native code runs the control flow (blocks, `if`, `for`, `while`,
//! `batches`, `return`, loop counters, interrupt polls at loop heads) and calls [`rt_op`] with
//! the op's index; an op's operands were evaluated by earlier ops into numbered slots and are
//! preset for it, so the interpreter's definition of each operation is the only one. Loops
//! whose values are all scalars are single ops that run as compiled scalar regions (`host`).
//!
//! Operands are evaluated in the interpreter's order: when any operand of an operation needs
//! an op of its own, every operand gets one, so reads of locals (and `-O2`'s moves at last
//! uses) happen in the same order as in the interpreter.
//!
//! The native code depends only on the shape of the `Code` tree, so it is cached by a hash of
//! that tree: a second program (a REPL input) with the same function reuses it with a new op
//! table. Ops point into the checked program, which outlives the interpreter's run.

use crate::codegen::Jit;
use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::{types, AbiParam, Block, BlockArg, InstBuilder, MemFlagsData, Signature, Value as ClValue};
use cranelift_frontend::FunctionBuilder;
use lang::interp::host::{operands, Batches, CompiledBody};
use lang::interp::{Ctrl, Frame, Interp, Value, R};
use lang::ir::{Expr, ExprId, ExprKind, Local, Pat, SpanId, Stmt};
use std::hash::{DefaultHasher, Hash, Hasher};

/// The op ran; go on.
const GO: i32 = 0;
/// The op failed; the error is in the context.
const FAIL: i32 = 1;
/// A `return` ran; its value is in the context.
const RETURN: i32 = 2;

/// A compiled body: `f(ctx) -> status`.
pub type BodyFn = unsafe extern "C" fn(*mut u8) -> i32;

/// One operation the native code asks the run-time library for.
#[derive(Debug)]
pub enum Op {
    /// Applies a node to its preset operands (slots), the value going to a slot or dropped.
    Apply {
        e: *const Expr,
        preset: Vec<(ExprId, u32)>,
        out: Option<u32>,
    },
    /// Binds a slot's value to a pattern; `assign`: the assignment's span (`None` for a `let`).
    Bind {
        pat: *const Pat,
        slot: u32,
        assign: Option<SpanId>,
    },
    /// Runs a statement with no value (`BindDims`).
    Stmt {
        s: *const Stmt,
    },
    /// The truth of a slot's value, into the context's integer.
    Truthy {
        slot: u32,
    },
    /// A slot's value as an integer (a loop bound), into the context's integer.
    Int {
        slot: u32,
    },
    /// Sets a loop variable to the op's argument.
    SetVar {
        var: Local,
    },
    /// Puts `()` into a slot.
    Unit {
        slot: u32,
    },
    /// `return`s a slot's value.
    Return {
        slot: u32,
    },
    /// Starts a `batches` loop (its operands preset), the number of batches into the context.
    BatchesBegin {
        e: *const Expr,
        preset: Vec<(ExprId, u32)>,
        state: u32,
    },
    /// Binds batch `arg` of a `batches` loop.
    BatchBind {
        e: *const Expr,
        state: u32,
    },
    BatchDone,
    BatchesEnd {
        state: u32,
    },
    /// Reports an interrupt at a loop.
    Interrupted {
        e: *const Expr,
    },
}

/// The control structure of a body over its ops (what the native code is generated from).
#[derive(Debug, Hash)]
pub enum Code {
    Op(u32),
    Seq(Vec<Code>),
    /// `cond` computes a value, `truthy` tests it.
    If {
        cond: Box<Code>,
        truthy: u32,
        then: Box<Code>,
        els: Box<Code>,
    },
    /// `bounds` computes both bounds into slots, `start`/`end` read them as integers.
    Range {
        bounds: Box<Code>,
        start: u32,
        end: u32,
        set: u32,
        body: Box<Code>,
        interrupted: u32,
    },
    While {
        cond: Box<Code>,
        truthy: u32,
        body: Box<Code>,
        interrupted: u32,
    },
    Batches {
        begin: u32,
        bind: u32,
        body: Box<Code>,
        done: u32,
        end: u32,
        interrupted: u32,
    },
}

/// A body flattened for compilation.
pub struct Flat {
    pub code: Code,
    pub ops: Vec<Op>,
    pub slots: u32,
    pub states: u32,
    /// The slot of the body's value.
    pub result: u32,
}

/// What flattening asks of the accelerator, so that the ops match what it does at run time.
pub trait Planner<'e> {
    /// The leaves of the fused tree rooted at the primitive application `e`, if one is.
    fn fused(&mut self, e: &'e Expr) -> Option<Vec<&'e Expr>>;
    /// Whether the loop `e` compiles whole as a scalar region.
    fn scalar_loop(&mut self, e: &'e Expr) -> bool;
}

/// Flattens `body` with the accelerator's plans.
pub fn flatten<'e>(body: &'e Expr, planner: &mut dyn Planner<'e>) -> Flat {
    let mut f = Flattener { ops: Vec::new(), slots: 0, states: 0, planner };
    let result = f.slot();
    let code = f.expr(body, Some(result));
    Flat { code, ops: f.ops, slots: f.slots, states: f.states, result }
}

struct Flattener<'e, 'a> {
    ops: Vec<Op>,
    slots: u32,
    states: u32,
    planner: &'a mut dyn Planner<'e>,
}

/// Nodes the interpreter evaluates without evaluating anything else.
fn trivial(e: &Expr) -> bool {
    matches!(
        e.kind,
        ExprKind::Lit(_)
            | ExprKind::Local(_)
            | ExprKind::Const(_)
            | ExprKind::DimValue(_)
            | ExprKind::FuncRef(_)
            | ExprKind::Closure { .. }
    )
}

impl<'e> Flattener<'e, '_> {
    fn slot(&mut self) -> u32 {
        self.slots += 1;
        self.slots - 1
    }

    fn op(&mut self, op: Op) -> u32 {
        self.ops.push(op);
        (self.ops.len() - 1) as u32
    }

    /// Ops that evaluate `xs` into fresh slots, in order, unless all are trivial.
    fn operands(&mut self, xs: &[&'e Expr], code: &mut Vec<Code>) -> Vec<(ExprId, u32)> {
        if xs.iter().all(|x| trivial(x)) {
            return Vec::new();
        }
        xs.iter()
            .map(|x| {
                let s = self.slot();
                code.push(self.expr(x, Some(s)));
                (x.id, s)
            })
            .collect()
    }

    fn apply(&mut self, e: &'e Expr, out: Option<u32>) -> Code {
        let xs = match &e.kind {
            ExprKind::Prim { .. } => self.planner.fused(e).unwrap_or_else(|| operands(e)),
            _ => operands(e),
        };
        let mut code = Vec::new();
        let preset = self.operands(&xs, &mut code);
        code.push(Code::Op(self.op(Op::Apply { e, preset, out })));
        seq(code)
    }

    fn unit(&mut self, code: Code, out: Option<u32>) -> Code {
        match out {
            Some(slot) => seq(vec![code, Code::Op(self.op(Op::Unit { slot }))]),
            None => code,
        }
    }

    fn expr(&mut self, e: &'e Expr, out: Option<u32>) -> Code {
        match &e.kind {
            ExprKind::Block { stmts, result } => {
                let mut code = Vec::new();
                for s in stmts {
                    match s {
                        Stmt::Let { pat, value } | Stmt::Assign { pat, value } => {
                            let slot = self.slot();
                            let assign = matches!(s, Stmt::Assign { .. }).then_some(value.span);
                            code.push(self.expr(value, Some(slot)));
                            code.push(Code::Op(self.op(Op::Bind { pat, slot, assign })));
                        }
                        Stmt::Expr(x) => code.push(self.expr(x, None)),
                        Stmt::BindDims { .. } => code.push(Code::Op(self.op(Op::Stmt { s }))),
                    }
                }
                code.push(self.expr(result, out));
                seq(code)
            }
            ExprKind::If { cond, then, els } => {
                let slot = self.slot();
                let cond = Box::new(self.expr(cond, Some(slot)));
                let truthy = self.op(Op::Truthy { slot });
                let then = Box::new(self.expr(then, out));
                let els = Box::new(self.expr(els, out));
                Code::If { cond, truthy, then, els }
            }
            ExprKind::ForRange { .. } | ExprKind::While { .. } if self.planner.scalar_loop(e) => self.apply(e, out),
            ExprKind::ForRange { var, start, end, body } => {
                let (a, b) = (self.slot(), self.slot());
                let bounds = Box::new(seq(vec![self.expr(start, Some(a)), self.expr(end, Some(b))]));
                let start = self.op(Op::Int { slot: a });
                let end = self.op(Op::Int { slot: b });
                let set = self.op(Op::SetVar { var: *var });
                let interrupted = self.op(Op::Interrupted { e });
                let body = Box::new(self.expr(body, None));
                let code = Code::Range { bounds, start, end, set, body, interrupted };
                self.unit(code, out)
            }
            ExprKind::While { cond, body } => {
                let slot = self.slot();
                let cond = Box::new(self.expr(cond, Some(slot)));
                let truthy = self.op(Op::Truthy { slot });
                let interrupted = self.op(Op::Interrupted { e });
                let body = Box::new(self.expr(body, None));
                let code = Code::While { cond, truthy, body, interrupted };
                self.unit(code, out)
            }
            ExprKind::ForBatches { data, size, shuffle, body, .. } => {
                let mut xs: Vec<&'e Expr> = data.iter().collect();
                xs.push(size);
                xs.extend(shuffle.as_deref());
                let mut code = Vec::new();
                let preset = self.operands(&xs, &mut code);
                let state = self.states;
                self.states += 1;
                let begin = self.op(Op::BatchesBegin { e, preset, state });
                let bind = self.op(Op::BatchBind { e, state });
                let done = self.op(Op::BatchDone);
                let end = self.op(Op::BatchesEnd { state });
                let interrupted = self.op(Op::Interrupted { e });
                let body = Box::new(self.expr(body, None));
                code.push(Code::Batches { begin, bind, body, done, end, interrupted });
                let code = seq(code);
                self.unit(code, out)
            }
            ExprKind::Return(v) => {
                let slot = self.slot();
                let code = self.expr(v, Some(slot));
                seq(vec![code, Code::Op(self.op(Op::Return { slot }))])
            }
            _ => self.apply(e, out),
        }
    }
}

fn seq(mut v: Vec<Code>) -> Code {
    if v.len() == 1 {
        v.pop().unwrap_or(Code::Seq(Vec::new()))
    } else {
        Code::Seq(v)
    }
}

impl Code {
    /// The cache key of the native code for this tree.
    pub fn key(&self) -> String {
        let mut h = DefaultHasher::new();
        self.hash(&mut h);
        format!("body:{:016x}", h.finish())
    }

    /// How many ops the native code calls (for `--explain`).
    pub fn calls(&self) -> usize {
        match self {
            Code::Op(_) => 1,
            Code::Seq(v) => v.iter().map(Code::calls).sum(),
            Code::If { cond, then, els, .. } => cond.calls() + 1 + then.calls() + els.calls(),
            Code::Range { bounds, body, .. } => bounds.calls() + 3 + body.calls(),
            Code::While { cond, body, .. } => cond.calls() + 1 + body.calls(),
            Code::Batches { body, .. } => 4 + body.calls(),
        }
    }
}

/// What the native code reaches through its one parameter. `int` and `flag` come first, at
/// offsets 0 and 8, where the native code reads them.
#[repr(C)]
struct Ctx<'a, 'p> {
    int: i64,
    flag: *const u8,
    it: &'a mut Interp<'p>,
    frame: &'a mut Frame,
    ops: &'a [Op],
    slots: Vec<Option<Value>>,
    batches: Vec<Option<Batches>>,
    /// The error or `return` that stopped the body.
    stop: Option<Ctrl>,
}

impl Ctx<'_, '_> {
    fn take(&mut self, s: u32) -> Value {
        self.slots.get_mut(s as usize).and_then(Option::take).unwrap_or_else(Value::unit)
    }

    fn put(&mut self, s: Option<u32>, v: Value) {
        if let Some(slot) = s.and_then(|s| self.slots.get_mut(s as usize)) {
            *slot = Some(v);
        }
    }

    fn preset(&mut self, preset: &[(ExprId, u32)]) -> Vec<(ExprId, Value)> {
        preset.iter().map(|&(x, s)| (x, self.take(s))).collect()
    }

    fn run(&mut self, k: u32, arg: i64) -> R<i32> {
        let ops = self.ops;
        let Some(op) = ops.get(k as usize) else { return Ok(FAIL) };
        match op {
            Op::Apply { e, preset, out } => {
                let vals = self.preset(preset);
                // SAFETY: ops point into the program the interpreter runs, which outlives the run.
                let v = self.it.apply_node(unsafe { &**e }, vals, self.frame)?;
                self.put(*out, v);
            }
            Op::Bind { pat, slot, assign } => {
                let v = self.take(*slot);
                // SAFETY: as in `Op::Apply`.
                self.it.bind(unsafe { &**pat }, v, self.frame, *assign)?;
            }
            // SAFETY: as in `Op::Apply`.
            Op::Stmt { s } => self.it.exec_stmt(unsafe { &**s }, self.frame)?,
            Op::Truthy { slot } => {
                let v = self.take(*slot);
                self.int = i64::from(self.it.truthy(&v));
            }
            Op::Int { slot } => {
                let v = self.take(*slot);
                self.int = self.it.int_of(&v);
            }
            Op::SetVar { var } => {
                if let Some(l) = self.frame.locals.get_mut(var.0 as usize) {
                    *l = Some(Value::Tensor(kernels::Tensor::scalar_i32(arg as i32)));
                }
            }
            Op::Unit { slot } => self.put(Some(*slot), Value::unit()),
            Op::Return { slot } => {
                let v = self.take(*slot);
                self.stop = Some(Ctrl::Return(v));
                return Ok(RETURN);
            }
            Op::BatchesBegin { e, preset, state } => {
                let vals = self.preset(preset);
                // SAFETY: as in `Op::Apply`.
                let e = unsafe { &**e };
                let frame = &mut *self.frame;
                let b = self.it.with_preset(vals, e, |it| it.batches_begin(e, frame))?;
                self.int = b.count as i64;
                if let Some(s) = self.batches.get_mut(*state as usize) {
                    *s = Some(b);
                }
            }
            Op::BatchBind { e, state } => {
                let b = self.batches.get(*state as usize).and_then(Option::as_ref);
                // SAFETY: as in `Op::Apply`.
                let e = unsafe { &**e };
                if let Some(b) = b {
                    self.it.batch_bind(e, b, arg as usize, self.frame)?;
                }
            }
            Op::BatchDone => self.it.batch_done(),
            Op::BatchesEnd { state } => {
                if let Some(s) = self.batches.get_mut(*state as usize) {
                    *s = None;
                }
                self.it.batches_end();
            }
            // SAFETY: as in `Op::Apply`.
            Op::Interrupted { e } => return Err(self.it.interrupted(unsafe { &**e })),
        }
        Ok(GO)
    }
}

/// The run-time entry of compiled bodies: runs op `k` of the body whose context `ctx` is.
///
/// # Safety
/// `ctx` points to the live `Ctx` of the body being run (the native code passes its parameter).
unsafe extern "C" fn rt_op(ctx: *mut u8, k: u32, arg: i64) -> i32 {
    // SAFETY: the caller's guarantee; no other reference to the context is live while the
    // native code calls this function.
    let ctx = unsafe { &mut *(ctx as *mut Ctx<'_, '_>) };
    match ctx.run(k, arg) {
        Ok(status) => status,
        Err(c) => {
            ctx.stop = Some(c);
            FAIL
        }
    }
}

/// A compiled body with the op table of one program.
pub struct Body {
    pub f: BodyFn,
    pub ops: Vec<Op>,
    pub slots: u32,
    pub states: u32,
    pub result: u32,
    /// Runs of the body, counted for `--explain`.
    pub runs: std::rc::Rc<std::cell::Cell<u64>>,
}

impl CompiledBody for Body {
    fn run(&self, it: &mut Interp, frame: &mut Frame) -> R<Value> {
        self.runs.set(self.runs.get() + 1);
        let flag = &*it.interrupt as *const std::sync::atomic::AtomicBool as *const u8;
        let mut ctx = Ctx {
            int: 0,
            flag,
            it,
            frame,
            ops: &self.ops,
            slots: vec![None; self.slots as usize],
            batches: (0..self.states).map(|_| None).collect(),
            stop: None,
        };
        // SAFETY: the native code was compiled for this op table (same `Code`), and calls
        // `rt_op` with a pointer to `ctx`, which lives until it returns.
        let status = unsafe { (self.f)(&mut ctx as *mut Ctx as *mut u8) };
        match (status, ctx.stop.take()) {
            (GO, _) => Ok(ctx.take(self.result)),
            (_, Some(c)) => Err(c),
            (_, None) => Err(Ctrl::Error(lang::interp::RuntimeError::new(
                lang::diag::Code::E0605,
                format!("internal error: compiled code stopped with status {status}"),
                Default::default(),
            ))),
        }
    }
}

impl Jit {
    /// The native code of a flattened body (compiled, or found in the cache by its `Code`).
    pub fn get_or_compile_body(&mut self, code: &Code) -> Result<(BodyFn, f64, bool), String> {
        let k = code.key();
        if let Some(&(f, us)) = self.bodies.get(&k) {
            return Ok((f, us, false));
        }
        let t = std::time::Instant::now();
        let ptr = AbiParam::new(types::I64);
        let (id, ()) = self.build("msl_body", &[ptr], &[AbiParam::new(types::I32)], |l| {
            let call_conv = l.b.func.signature.call_conv;
            let mut sig = Signature::new(call_conv);
            sig.params.extend([AbiParam::new(types::I64), AbiParam::new(types::I32), AbiParam::new(types::I64)]);
            sig.returns.push(AbiParam::new(types::I32));
            let sig = l.b.import_signature(sig);
            let entry = l.b.create_block();
            l.b.append_block_params_for_function_params(entry);
            l.b.switch_to_block(entry);
            let ctx = l.b.block_params(entry)[0];
            let rt = l.b.ins().iconst(types::I64, rt_op as *const () as usize as i64);
            let exit = l.b.create_block();
            l.b.append_block_param(exit, types::I32);
            let mut g = BodyGen { b: l.b, ctx, rt, sig, exit };
            g.code(code);
            let go = g.b.ins().iconst(types::I32, i64::from(GO));
            g.b.ins().return_(&[go]);
            g.b.switch_to_block(exit);
            let status = g.b.block_params(exit)[0];
            g.b.ins().return_(&[status]);
            Ok(())
        })?;
        let addr = self.finalize(id)?;
        // SAFETY: `build` defined a function of one pointer-sized parameter returning an i32,
        // for the host's calling convention.
        let f = unsafe { std::mem::transmute::<*const u8, BodyFn>(addr) };
        let us = t.elapsed().as_secs_f64() * 1e6;
        self.bodies.insert(k, (f, us));
        Ok((f, us, true))
    }
}

struct BodyGen<'a, 'f> {
    b: &'a mut FunctionBuilder<'f>,
    ctx: ClValue,
    rt: ClValue,
    sig: cranelift_codegen::ir::SigRef,
    exit: Block,
}

impl BodyGen<'_, '_> {
    /// Calls op `k` with `arg`, leaving for the exit block unless it says go on.
    fn call(&mut self, k: u32, arg: Option<ClValue>) {
        let kv = self.b.ins().iconst(types::I32, i64::from(k));
        let arg = arg.unwrap_or_else(|| self.b.ins().iconst(types::I64, 0));
        let inst = self.b.ins().call_indirect(self.sig, self.rt, &[self.ctx, kv, arg]);
        let status = self.b.inst_results(inst)[0];
        let go = self.b.create_block();
        self.b.ins().brif(status, self.exit, &[BlockArg::Value(status)], go, &[]);
        self.b.switch_to_block(go);
    }

    /// The integer the last op left in the context.
    fn int(&mut self) -> ClValue {
        self.b.ins().load(types::I64, MemFlagsData::trusted(), self.ctx, 0)
    }

    /// Leaves through op `interrupted` when the run's interrupt flag is up.
    fn poll(&mut self, interrupted: u32) {
        let flag = self.b.ins().load(types::I64, MemFlagsData::trusted(), self.ctx, 8);
        // Atomic, so that no read is merged with an earlier one (see `host::gen`).
        let up = self.b.ins().atomic_load(types::I8, MemFlagsData::new(), flag);
        let stop = self.b.create_block();
        let go = self.b.create_block();
        self.b.ins().brif(up, stop, &[], go, &[]);
        self.b.switch_to_block(stop);
        self.call(interrupted, None);
        self.b.ins().jump(go, &[]);
        self.b.switch_to_block(go);
    }

    fn code(&mut self, c: &Code) {
        match c {
            Code::Op(k) => self.call(*k, None),
            Code::Seq(v) => v.iter().for_each(|c| self.code(c)),
            Code::If { cond, truthy, then, els } => {
                self.code(cond);
                self.call(*truthy, None);
                let t = self.int();
                let (tb, eb, merge) = (self.b.create_block(), self.b.create_block(), self.b.create_block());
                self.b.ins().brif(t, tb, &[], eb, &[]);
                self.b.switch_to_block(tb);
                self.code(then);
                self.b.ins().jump(merge, &[]);
                self.b.switch_to_block(eb);
                self.code(els);
                self.b.ins().jump(merge, &[]);
                self.b.switch_to_block(merge);
            }
            Code::Range { bounds, start, end, set, body, interrupted } => {
                self.code(bounds);
                self.call(*start, None);
                let a = self.int();
                self.call(*end, None);
                let b = self.int();
                self.counted(a, b, *interrupted, |g, i| {
                    g.call(*set, Some(i));
                    g.code(body);
                });
            }
            Code::While { cond, truthy, body, interrupted } => {
                let (head, stay, out) = (self.b.create_block(), self.b.create_block(), self.b.create_block());
                self.b.ins().jump(head, &[]);
                self.b.switch_to_block(head);
                self.code(cond);
                self.call(*truthy, None);
                let t = self.int();
                self.b.ins().brif(t, stay, &[], out, &[]);
                self.b.switch_to_block(stay);
                self.poll(*interrupted);
                self.code(body);
                self.b.ins().jump(head, &[]);
                self.b.switch_to_block(out);
            }
            Code::Batches { begin, bind, body, done, end, interrupted } => {
                self.call(*begin, None);
                let n = self.int();
                let zero = self.b.ins().iconst(types::I64, 0);
                self.counted(zero, n, *interrupted, |g, i| {
                    g.call(*bind, Some(i));
                    g.code(body);
                    g.call(*done, None);
                });
                self.call(*end, None);
            }
        }
    }

    /// `for i in a..b { poll; body(i) }` with `i` an i64 block parameter.
    fn counted(&mut self, a: ClValue, b: ClValue, interrupted: u32, body: impl FnOnce(&mut Self, ClValue)) {
        let (head, stay, out) = (self.b.create_block(), self.b.create_block(), self.b.create_block());
        self.b.append_block_param(head, types::I64);
        self.b.ins().jump(head, &[BlockArg::Value(a)]);
        self.b.switch_to_block(head);
        let i = self.b.block_params(head)[0];
        let more = self.b.ins().icmp(IntCC::SignedLessThan, i, b);
        self.b.ins().brif(more, stay, &[], out, &[]);
        self.b.switch_to_block(stay);
        self.poll(interrupted);
        body(self, i);
        let next = self.b.ins().iadd_imm_s(i, 1);
        self.b.ins().jump(head, &[BlockArg::Value(next)]);
        self.b.switch_to_block(out);
    }
}
