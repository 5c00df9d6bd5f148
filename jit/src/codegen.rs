//! Cranelift code generation for fused trees, and the compile cache.
//!
//! Every fused tree becomes one function `f(inputs: *const *const u8, out: *mut u8, n: usize)`
//! that computes `n` consecutive output elements. An input is either read at `i` (contiguous
//! along the loop) or read once before the loop (broadcast along it); the caller walks the outer
//! dimensions of a broadcast and splits long loops over threads. When every input and the result
//! share one float type, the main loop works on 128-bit vectors (`f32x4`/`f64x2`, the widest
//! Cranelift offers on x86-64) and a scalar loop finishes the tail.
//!
//! Each operation mirrors the CPU kernel it replaces instruction for instruction, so results are
//! bit-identical: no fused multiply-add (Rust does not contract `a * b + c`), `maximum` and
//! `minimum` written with the kernels' NaN rule rather than Cranelift's `fmax`, and the
//! transcendental functions calling the same Rust methods as the kernels (`helpers`).

use crate::fuse::{Node, Tree, Typed};
use crate::helpers;
use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::{
    types, AbiParam, BlockArg, Endianness, FuncRef, InstBuilder, MemFlagsData, StackSlot, StackSlotData, StackSlotKind,
    Type, UserFuncName, Value,
};
use cranelift_codegen::settings::{self, Configurable};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{default_libcall_names, FuncId, Linkage, Module};
use kernels::{DType, Storage, Tensor};
use lang::ir::Prim;
use std::collections::HashMap;
use std::time::Instant;

/// A compiled fused loop: `f(inputs, out, n)`.
pub type KernelFn = unsafe extern "C" fn(*const *const u8, *mut u8, usize);

/// What one compilation needs beyond the tree: its element types, which inputs are broadcast
/// along the loop, and the vector element type (if any).
pub struct Spec<'a> {
    pub tree: &'a Tree,
    pub typed: &'a Typed,
    pub bcast: &'a [bool],
    pub vector: Option<DType>,
}

/// One entry of the compile cache.
#[derive(Clone, Copy, Debug)]
pub struct Compiled {
    pub f: KernelFn,
    /// How long code generation took, in microseconds.
    pub micros: f64,
}

/// A JIT module and the code it holds, keyed by [`crate::fuse::key`].
pub struct Jit {
    module: JITModule,
    ctx: cranelift_codegen::Context,
    fctx: FunctionBuilderContext,
    helpers: HashMap<&'static str, FuncId>,
    cache: HashMap<String, Compiled>,
    next: u32,
}

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

impl Jit {
    /// A module for the host CPU with the helper functions linked in.
    pub fn new() -> Result<Jit, String> {
        let mut flags = settings::builder();
        flags.set("opt_level", "speed").map_err(err)?;
        flags.set("use_colocated_libcalls", "false").map_err(err)?;
        flags.set("is_pic", "false").map_err(err)?;
        // The IR verifier costs about as much as compiling; debug builds keep it.
        let verify = if cfg!(debug_assertions) { "true" } else { "false" };
        flags.set("enable_verifier", verify).map_err(err)?;
        let isa = cranelift_native::builder().map_err(err)?.finish(settings::Flags::new(flags)).map_err(err)?;
        let mut jb = JITBuilder::with_isa(isa, default_libcall_names());
        for (name, addr) in helpers::all_symbols() {
            jb.symbol(name, addr as *const u8);
        }
        let mut module = JITModule::new(jb);
        let mut ids = HashMap::new();
        let unary = helpers::unary().into_iter().map(|h| (h, 1));
        for (h, arity) in unary.chain(helpers::binary().into_iter().map(|h| (h, 2))) {
            let (_, dt, sym, _, vsym, _) = h;
            let t = float_type(dt);
            let mut sig = module.make_signature();
            sig.params.extend(std::iter::repeat_n(AbiParam::new(t), arity));
            sig.returns.push(AbiParam::new(t));
            ids.insert(sym, module.declare_function(sym, Linkage::Import, &sig).map_err(err)?);
            let mut vsig = module.make_signature();
            vsig.params.extend(std::iter::repeat_n(AbiParam::new(types::I64), arity));
            ids.insert(vsym, module.declare_function(vsym, Linkage::Import, &vsig).map_err(err)?);
        }
        Ok(Jit {
            ctx: module.make_context(),
            module,
            fctx: FunctionBuilderContext::new(),
            helpers: ids,
            cache: HashMap::new(),
            next: 0,
        })
    }

    /// The compiled loop for `key`, compiling it from `spec` on a miss. The flag is true when
    /// this call compiled it.
    pub fn get_or_compile(&mut self, key: &str, spec: &Spec) -> Result<(Compiled, bool), String> {
        if let Some(c) = self.cache.get(key) {
            return Ok((*c, false));
        }
        let t = Instant::now();
        let id = self.define(spec)?;
        self.module.finalize_definitions().map_err(err)?;
        let code = self.module.get_finalized_function(id);
        // SAFETY: `define` built a function with exactly this signature (three pointer-sized
        // integer parameters, no results) for the host's calling convention.
        let f = unsafe { std::mem::transmute::<*const u8, KernelFn>(code) };
        let c = Compiled { f, micros: t.elapsed().as_secs_f64() * 1e6 };
        self.cache.insert(key.to_string(), c);
        Ok((c, true))
    }

    /// The number of compiled loops in the cache.
    pub fn cached(&self) -> usize {
        self.cache.len()
    }

    fn define(&mut self, spec: &Spec) -> Result<FuncId, String> {
        let ptr = types::I64;
        let mut sig = self.module.make_signature();
        sig.params.extend([AbiParam::new(ptr), AbiParam::new(ptr), AbiParam::new(ptr)]);
        let name = format!("msl_fused_{}", self.next);
        self.next += 1;
        let id = self.module.declare_function(&name, Linkage::Local, &sig).map_err(err)?;
        self.module.clear_context(&mut self.ctx);
        self.ctx.func.signature = sig;
        self.ctx.func.name = UserFuncName::user(0, id.as_u32());
        let cfg = self.module.target_config();
        let mut b = FunctionBuilder::new(&mut self.ctx.func, &mut self.fctx);
        let mut g = Gen {
            b: &mut b,
            spec,
            module: &mut self.module,
            helpers: &self.helpers,
            refs: HashMap::new(),
            slots: None,
            pre: Vec::new(),
            ptrs: Vec::new(),
        };
        g.body();
        b.seal_all_blocks();
        b.finalize(cfg);
        let r = self.module.define_function(id, &mut self.ctx).map_err(|e| format!("{e:?}"));
        self.module.clear_context(&mut self.ctx);
        r?;
        Ok(id)
    }
}

fn float_type(d: DType) -> Type {
    if d == DType::F64 {
        types::F64
    } else {
        types::F32
    }
}

fn size_shift(d: DType) -> i64 {
    match d {
        DType::F64 => 3,
        DType::F32 | DType::I32 => 2,
        DType::Bool => 0,
    }
}

/// Loads and stores of tensor elements: never trapping, possibly unaligned.
fn mem() -> MemFlagsData {
    MemFlagsData::new().with_notrap()
}

/// Scalar (one element per iteration) or vector code.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Scalar,
    Vector(DType),
}

impl Mode {
    fn lanes(self) -> i64 {
        match self {
            Mode::Scalar => 1,
            Mode::Vector(DType::F64) => 2,
            Mode::Vector(_) => 4,
        }
    }

    /// The Cranelift type of a value of element type `d`.
    fn ty(self, d: DType) -> Type {
        match (self, d) {
            (Mode::Scalar, DType::Bool) => types::I8,
            (Mode::Scalar, d) => float_type(d),
            (Mode::Vector(DType::F64), DType::Bool) => types::I64X2,
            (Mode::Vector(_), DType::Bool) => types::I32X4,
            (Mode::Vector(_), DType::F64) => types::F64X2,
            (Mode::Vector(_), _) => types::F32X4,
        }
    }
}

struct Gen<'a, 'b, 'f> {
    b: &'a mut FunctionBuilder<'f>,
    spec: &'a Spec<'b>,
    module: &'a mut JITModule,
    helpers: &'a HashMap<&'static str, FuncId>,
    /// The helpers this function calls, declared on first use.
    refs: HashMap<&'static str, FuncRef>,
    /// Two 16-byte stack slots for vector helper calls, made on first use.
    slots: Option<(StackSlot, StackSlot)>,
    /// Broadcast inputs read before the loop: (scalar value, vector value).
    pre: Vec<Option<(Value, Option<Value>)>>,
    ptrs: Vec<Value>,
}

impl Gen<'_, '_, '_> {
    fn body(&mut self) {
        let ptr = types::I64;
        let spec = self.spec;
        let entry = self.b.create_block();
        self.b.append_block_params_for_function_params(entry);
        self.b.switch_to_block(entry);
        let params = self.b.block_params(entry).to_vec();
        let (ins, out, n) = (params[0], params[1], params[2]);
        let leaf_dtype = leaf_dtypes(spec);
        for (i, d) in leaf_dtype.iter().enumerate() {
            let p = self.b.ins().load(ptr, MemFlagsData::trusted(), ins, (8 * i) as i32);
            self.ptrs.push(p);
            if spec.bcast[i] {
                let s = self.b.ins().load(Mode::Scalar.ty(*d), mem(), p, 0);
                let v = spec.vector.map(|vt| self.b.ins().splat(Mode::Vector(vt).ty(*d), s));
                self.pre.push(Some((s, v)));
            } else {
                self.pre.push(None);
            }
        }
        let exit = self.b.create_block();
        let tail_head = self.b.create_block();
        self.b.append_block_param(tail_head, ptr);
        let tail_body = self.b.create_block();
        let zero = self.b.ins().iconst(ptr, 0);
        if let Some(vt) = spec.vector {
            let mode = Mode::Vector(vt);
            let head = self.b.create_block();
            self.b.append_block_param(head, ptr);
            let body = self.b.create_block();
            let nv = self.b.ins().band_imm_s(n, !(mode.lanes() - 1));
            self.b.ins().jump(head, &[BlockArg::Value(zero)]);
            self.b.switch_to_block(head);
            let i = self.b.block_params(head)[0];
            let more = self.b.ins().icmp(IntCC::UnsignedLessThan, i, nv);
            self.b.ins().brif(more, body, &[], tail_head, &[BlockArg::Value(i)]);
            self.b.switch_to_block(body);
            self.iteration(mode, i, out);
            let next = self.b.ins().iadd_imm_s(i, mode.lanes());
            self.b.ins().jump(head, &[BlockArg::Value(next)]);
        } else {
            self.b.ins().jump(tail_head, &[BlockArg::Value(zero)]);
        }
        self.b.switch_to_block(tail_head);
        let i = self.b.block_params(tail_head)[0];
        let more = self.b.ins().icmp(IntCC::UnsignedLessThan, i, n);
        self.b.ins().brif(more, tail_body, &[], exit, &[]);
        self.b.switch_to_block(tail_body);
        self.iteration(Mode::Scalar, i, out);
        let next = self.b.ins().iadd_imm_s(i, 1);
        self.b.ins().jump(tail_head, &[BlockArg::Value(next)]);
        self.b.switch_to_block(exit);
        self.b.ins().return_(&[]);
    }

    /// Computes and stores the elements starting at index `i`.
    fn iteration(&mut self, mode: Mode, i: Value, out: Value) {
        let spec = self.spec;
        let n = spec.tree.nodes.len();
        let mut vals: Vec<Option<Value>> = Vec::with_capacity(n);
        let mut loaded: Vec<Option<Value>> = vec![None; spec.tree.n_inputs];
        for k in 0..n {
            let v = match &spec.tree.nodes[k] {
                Node::Leaf(j) => {
                    let v = match loaded[*j] {
                        Some(v) => v,
                        None => self.input(mode, *j, spec.typed.dtype[k], i),
                    };
                    loaded[*j] = Some(v);
                    Some(v)
                }
                Node::Const(_) => None,
                Node::Op { prim, to, args } => Some(self.op(mode, k, *prim, *to, args, &vals)),
            };
            vals.push(v);
        }
        let root = vals[n - 1].expect("the root is an operation");
        let d = spec.typed.dtype[n - 1];
        let addr = self.addr(out, i, d);
        self.b.ins().store(mem(), root, addr, 0);
    }

    fn addr(&mut self, base: Value, i: Value, d: DType) -> Value {
        let off = self.b.ins().ishl_imm_u(i, size_shift(d));
        self.b.ins().iadd(base, off)
    }

    fn input(&mut self, mode: Mode, j: usize, d: DType, i: Value) -> Value {
        if let Some((s, v)) = self.pre[j] {
            return match mode {
                Mode::Scalar => s,
                Mode::Vector(_) => v.expect("vector broadcast value"),
            };
        }
        let addr = self.addr(self.ptrs[j], i, d);
        self.b.ins().load(mode.ty(d), mem(), addr, 0)
    }

    /// The value of node `k` as an operand of element type `want`.
    fn operand(&mut self, mode: Mode, k: usize, want: DType, vals: &[Option<Value>]) -> Value {
        match (&self.spec.tree.nodes[k], vals[k]) {
            (Node::Const(t), _) => self.konst(mode, &t.cast(want)),
            (_, Some(v)) => self.convert(mode, v, self.spec.typed.dtype[k], want),
            (_, None) => unreachable!("every non-constant node has a value"),
        }
    }

    fn konst(&mut self, mode: Mode, t: &Tensor) -> Value {
        match t.storage() {
            Storage::F32(v) => self.fconst(mode, DType::F32, f64::from(v[0])),
            Storage::F64(v) => self.fconst(mode, DType::F64, v[0]),
            Storage::Bool(v) => self.bconst(mode, v[0]),
            Storage::I32(_) => unreachable!("i32 constants are not fused"),
        }
    }

    /// A float constant; `x` is exactly representable in `d`.
    fn fconst(&mut self, mode: Mode, d: DType, x: f64) -> Value {
        let s = if d == DType::F64 { self.b.ins().f64const(x) } else { self.b.ins().f32const(x as f32) };
        match mode {
            Mode::Scalar => s,
            Mode::Vector(_) => self.b.ins().splat(mode.ty(d), s),
        }
    }

    fn bconst(&mut self, mode: Mode, v: bool) -> Value {
        match mode {
            Mode::Scalar => self.b.ins().iconst(types::I8, i64::from(v)),
            Mode::Vector(_) => {
                let lane = mode.ty(DType::Bool).lane_type();
                let s = self.b.ins().iconst(lane, if v { -1 } else { 0 });
                self.b.ins().splat(mode.ty(DType::Bool), s)
            }
        }
    }

    /// `c ? a : b` lane by lane; `c` is a bool (scalar) or a lane mask (vector).
    fn select(&mut self, mode: Mode, c: Value, a: Value, b: Value) -> Value {
        match mode {
            Mode::Scalar => self.b.ins().select(c, a, b),
            Mode::Vector(_) => {
                let ty = self.b.func.dfg.value_type(a);
                let c = if self.b.func.dfg.value_type(c) == ty {
                    c
                } else {
                    self.b.ins().bitcast(ty, MemFlagsData::new().with_endianness(Endianness::Little), c)
                };
                self.b.ins().bitselect(c, a, b)
            }
        }
    }

    fn not(&mut self, mode: Mode, c: Value) -> Value {
        match mode {
            Mode::Scalar => self.b.ins().bxor_imm_u(c, 1),
            Mode::Vector(_) => self.b.ins().bnot(c),
        }
    }

    /// The interpreter's element type conversions (`Tensor::cast`).
    fn convert(&mut self, mode: Mode, v: Value, from: DType, to: DType) -> Value {
        match (from, to) {
            _ if from == to => v,
            (DType::Bool, _) => {
                let one = self.fconst(mode, to, 1.0);
                let zero = self.fconst(mode, to, 0.0);
                self.select(mode, v, one, zero)
            }
            (_, DType::Bool) => {
                let zero = self.fconst(mode, from, 0.0);
                self.b.ins().fcmp(FloatCC::NotEqual, v, zero)
            }
            (DType::F32, DType::F64) => self.b.ins().fpromote(types::F64, v),
            _ => self.b.ins().fdemote(types::F32, v),
        }
    }

    fn helper(&mut self, sym: &'static str) -> FuncRef {
        if let Some(f) = self.refs.get(sym) {
            return *f;
        }
        let f = self.module.declare_func_in_func(self.helpers[sym], self.b.func);
        self.refs.insert(sym, f);
        f
    }

    fn helper_slots(&mut self) -> (StackSlot, StackSlot) {
        if let Some(s) = self.slots {
            return s;
        }
        let mk =
            |b: &mut FunctionBuilder| b.create_sized_stack_slot(StackSlotData::new(StackSlotKind::ExplicitSlot, 16, 4));
        let s = (mk(self.b), mk(self.b));
        self.slots = Some(s);
        s
    }

    /// Calls the Rust helper for `op` on one value (scalar) or on each lane (vector, in place
    /// in a stack slot).
    fn call(&mut self, mode: Mode, op: &str, d: DType, xs: &[Value]) -> Value {
        let (sym, vsym) = helpers::symbols(op, d).expect("a helper exists for every transcendental op");
        match mode {
            Mode::Scalar => {
                let f = self.helper(sym);
                let inst = self.b.ins().call(f, xs);
                self.b.inst_results(inst)[0]
            }
            Mode::Vector(_) => {
                let (sa, sb) = self.helper_slots();
                let ty = mode.ty(d);
                self.b.ins().stack_store(types::I64, xs[0], sa, 0);
                let pa = self.b.ins().stack_addr(types::I64, sa, 0);
                let mut args = vec![pa];
                if let Some(&y) = xs.get(1) {
                    self.b.ins().stack_store(types::I64, y, sb, 0);
                    args.push(self.b.ins().stack_addr(types::I64, sb, 0));
                }
                let f = self.helper(vsym);
                self.b.ins().call(f, &args);
                self.b.ins().stack_load(types::I64, ty, sa, 0)
            }
        }
    }

    fn op(
        &mut self,
        mode: Mode,
        k: usize,
        prim: Prim,
        to: Option<kernels::DType>,
        args: &[usize],
        vals: &[Option<Value>],
    ) -> Value {
        let od = self.spec.typed.operand[k];
        if prim == Prim::Where {
            let c = self.operand(mode, args[0], DType::Bool, vals);
            let a = self.operand(mode, args[1], od, vals);
            let b = self.operand(mode, args[2], od, vals);
            return self.select(mode, c, a, b);
        }
        if prim == Prim::Cast {
            let x = self.operand(mode, args[0], od, vals);
            return self.convert(mode, x, od, to.unwrap_or(DType::F32));
        }
        let a = self.operand(mode, args[0], od, vals);
        if args.len() == 2 {
            let b = self.operand(mode, args[1], od, vals);
            return self.binary(mode, prim, od, a, b);
        }
        self.unary(mode, prim, od, a)
    }

    fn binary(&mut self, mode: Mode, prim: Prim, d: DType, a: Value, b: Value) -> Value {
        if d == DType::Bool {
            let cc = match prim {
                Prim::And => return self.b.ins().band(a, b),
                Prim::Or => return self.b.ins().bor(a, b),
                Prim::Eq => IntCC::Equal,
                Prim::Ne => IntCC::NotEqual,
                Prim::Lt => IntCC::UnsignedLessThan,
                Prim::Le => IntCC::UnsignedLessThanOrEqual,
                Prim::Gt => IntCC::UnsignedGreaterThan,
                _ => IntCC::UnsignedGreaterThanOrEqual,
            };
            // Scalar bools are 0/1 and lane masks 0/-1: unsigned order puts false first in both.
            return self.b.ins().icmp(cc, a, b);
        }
        match prim {
            Prim::Add => self.b.ins().fadd(a, b),
            Prim::Sub => self.b.ins().fsub(a, b),
            Prim::Mul => self.b.ins().fmul(a, b),
            Prim::Div => self.b.ins().fdiv(a, b),
            Prim::Rem => self.call(mode, "rem", d, &[a, b]),
            Prim::Pow => self.call(mode, "pow", d, &[a, b]),
            Prim::Maximum | Prim::Minimum => {
                // `Num::max_p`: `a` when `a` is NaN or wins the comparison, else `b`.
                let cc = if prim == Prim::Maximum { FloatCC::GreaterThanOrEqual } else { FloatCC::LessThanOrEqual };
                let nan = self.b.ins().fcmp(FloatCC::Unordered, a, a);
                let wins = self.b.ins().fcmp(cc, a, b);
                let m = self.b.ins().bor(nan, wins);
                self.select(mode, m, a, b)
            }
            Prim::Eq => self.b.ins().fcmp(FloatCC::Equal, a, b),
            Prim::Ne => self.b.ins().fcmp(FloatCC::NotEqual, a, b),
            Prim::Lt => self.b.ins().fcmp(FloatCC::LessThan, a, b),
            Prim::Le => self.b.ins().fcmp(FloatCC::LessThanOrEqual, a, b),
            Prim::Gt => self.b.ins().fcmp(FloatCC::GreaterThan, a, b),
            _ => self.b.ins().fcmp(FloatCC::GreaterThanOrEqual, a, b),
        }
    }

    fn unary(&mut self, mode: Mode, prim: Prim, d: DType, a: Value) -> Value {
        if prim == Prim::Not {
            return self.not(mode, a);
        }
        let zero = self.fconst(mode, d, 0.0);
        let one = self.fconst(mode, d, 1.0);
        match prim {
            Prim::Neg => self.b.ins().fneg(a),
            Prim::Abs => self.b.ins().fabs(a),
            Prim::Sqrt => self.b.ins().sqrt(a),
            Prim::Floor => self.b.ins().floor(a),
            Prim::Rsqrt => {
                let s = self.b.ins().sqrt(a);
                self.b.ins().fdiv(one, s)
            }
            Prim::Exp => self.call(mode, "exp", d, &[a]),
            Prim::Log => self.call(mode, "log", d, &[a]),
            Prim::Tanh => self.call(mode, "tanh", d, &[a]),
            Prim::Sin => self.call(mode, "sin", d, &[a]),
            Prim::Cos => self.call(mode, "cos", d, &[a]),
            Prim::Sigmoid => {
                // a >= 0: 1 / (1 + exp(-a)); otherwise (NaN too) exp(a) / (1 + exp(a)).
                let ge = self.b.ins().fcmp(FloatCC::GreaterThanOrEqual, a, zero);
                let neg = self.b.ins().fneg(a);
                let arg = self.select(mode, ge, neg, a);
                let e = self.call(mode, "exp", d, &[arg]);
                let den = self.b.ins().fadd(one, e);
                let pos = self.b.ins().fdiv(one, den);
                let negv = self.b.ins().fdiv(e, den);
                self.select(mode, ge, pos, negv)
            }
            Prim::Relu => {
                // `a` when a > 0 or a is NaN, else +0.
                let m = match mode {
                    Mode::Scalar => self.b.ins().fcmp(FloatCC::UnorderedOrGreaterThan, a, zero),
                    Mode::Vector(_) => {
                        let le = self.b.ins().fcmp(FloatCC::LessThanOrEqual, a, zero);
                        self.b.ins().bnot(le)
                    }
                };
                self.select(mode, m, a, zero)
            }
            Prim::Gelu => {
                // half * a * (one + tanh(c * (a + k * a * a * a))), in the kernel's order.
                let c = self.fconst(mode, d, round(d, (2.0 / std::f64::consts::PI).sqrt()));
                let kk = self.fconst(mode, d, round(d, 0.044715));
                let half = self.fconst(mode, d, 0.5);
                let t = self.b.ins().fmul(kk, a);
                let t = self.b.ins().fmul(t, a);
                let t = self.b.ins().fmul(t, a);
                let t = self.b.ins().fadd(a, t);
                let t = self.b.ins().fmul(c, t);
                let t = self.call(mode, "tanh", d, &[t]);
                let t = self.b.ins().fadd(one, t);
                let h = self.b.ins().fmul(half, a);
                self.b.ins().fmul(h, t)
            }
            Prim::Sign => {
                let minus = self.fconst(mode, d, -1.0);
                let gt = self.b.ins().fcmp(FloatCC::GreaterThan, a, zero);
                let lt = self.b.ins().fcmp(FloatCC::LessThan, a, zero);
                let inner = self.select(mode, lt, minus, a);
                self.select(mode, gt, one, inner)
            }
            _ => unreachable!("`{}` is not a unary elementwise primitive", prim.name()),
        }
    }
}

/// `x` rounded to `d` (as `T::from_f64c` does in the kernels), returned as f64.
fn round(d: DType, x: f64) -> f64 {
    if d == DType::F32 {
        f64::from(x as f32)
    } else {
        x
    }
}

/// The element type of each input, from the tree's leaves.
fn leaf_dtypes(spec: &Spec) -> Vec<DType> {
    let mut out = vec![DType::F32; spec.tree.n_inputs];
    for (k, n) in spec.tree.nodes.iter().enumerate() {
        if let Node::Leaf(j) = n {
            out[*j] = spec.typed.dtype[k];
        }
    }
    out
}
