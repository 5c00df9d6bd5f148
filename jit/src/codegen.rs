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

use crate::fuse::{ElemOp, Node, Tree, Typed};
use crate::helpers;
use crate::lower::{float_type, Lower, Mode};
use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::{types, AbiParam, BlockArg, InstBuilder, MemFlagsData, UserFuncName, Value};
use cranelift_codegen::settings::{self, Configurable};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext};
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{default_libcall_names, FuncId, Linkage, Module};
use kernels::{DType, Storage, Tensor};
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
    /// Compiled host-code regions, keyed by [`crate::host::key`].
    pub(crate) regions: HashMap<String, crate::host::CompiledRegion>,
    /// Compiled function bodies and their compile times, keyed by [`crate::host::body::Code::key`].
    pub(crate) bodies: HashMap<String, (crate::host::body::BodyFn, f64)>,
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
            regions: HashMap::new(),
            bodies: HashMap::new(),
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
        let code = self.finalize(id)?;
        // SAFETY: `define` built a function with exactly this signature (three pointer-sized
        // integer parameters, no results) for the host's calling convention.
        let f = unsafe { std::mem::transmute::<*const u8, KernelFn>(code) };
        let c = Compiled { f, micros: t.elapsed().as_secs_f64() * 1e6 };
        self.cache.insert(key.to_string(), c);
        Ok((c, true))
    }

    /// Frees the module's code.
    ///
    /// # Safety
    /// No function compiled by this module may be called afterwards.
    pub(crate) unsafe fn free(self) {
        // SAFETY: the caller's guarantee.
        unsafe { self.module.free_memory() };
    }

    /// The number of compiled fused loops, host regions and bodies in the cache.
    pub fn cached(&self) -> usize {
        self.cache.len() + self.regions.len() + self.bodies.len()
    }

    fn define(&mut self, spec: &Spec) -> Result<FuncId, String> {
        let ptr = types::I64;
        let params = [AbiParam::new(ptr), AbiParam::new(ptr), AbiParam::new(ptr)];
        let (id, ()) = self.build("msl_fused", &params, &[], |l| {
            let mut g = Gen { l, spec, pre: Vec::new(), ptrs: Vec::new() };
            g.body();
            Ok(())
        })?;
        Ok(id)
    }

    /// Builds one function with these parameters and results: `body` emits its code through
    /// a [`Lower`] whose builder sits in no block yet. When `body` fails nothing is defined.
    pub(crate) fn build<T>(
        &mut self,
        prefix: &str,
        params: &[AbiParam],
        returns: &[AbiParam],
        body: impl FnOnce(Lower<'_, '_>) -> Result<T, String>,
    ) -> Result<(FuncId, T), String> {
        let mut sig = self.module.make_signature();
        sig.params.extend_from_slice(params);
        sig.returns.extend_from_slice(returns);
        self.module.clear_context(&mut self.ctx);
        self.ctx.func.signature = sig.clone();
        self.ctx.func.name = UserFuncName::user(0, self.next);
        let cfg = self.module.target_config();
        let mut b = FunctionBuilder::new(&mut self.ctx.func, &mut self.fctx);
        let r = body(Lower::new(&mut b, &mut self.module, &self.helpers));
        let out = match r {
            Ok(out) => out,
            Err(e) => {
                // The builder stopped half way: start the next function from fresh state.
                self.fctx = FunctionBuilderContext::new();
                self.module.clear_context(&mut self.ctx);
                return Err(e);
            }
        };
        b.seal_all_blocks();
        b.finalize(cfg);
        let name = format!("{prefix}_{}", self.next);
        self.next += 1;
        let id = self.module.declare_function(&name, Linkage::Local, &sig).map_err(err)?;
        // `MSL_JIT_DISASM=1` prints the machine code of every function compiled (for
        // developers tuning the code generators).
        let disasm = std::env::var_os("MSL_JIT_DISASM").is_some();
        self.ctx.set_disasm(disasm);
        let r = self.module.define_function(id, &mut self.ctx).map_err(|e| format!("{e:?}"));
        if let (true, Some(code)) = (disasm, self.ctx.compiled_code()) {
            eprintln!("== {name}\n{}", code.vcode.as_deref().unwrap_or(""));
        }
        self.module.clear_context(&mut self.ctx);
        r?;
        Ok((id, out))
    }

    /// Makes every function defined so far callable and returns the address of `id`.
    pub(crate) fn finalize(&mut self, id: FuncId) -> Result<*const u8, String> {
        self.module.finalize_definitions().map_err(err)?;
        Ok(self.module.get_finalized_function(id))
    }
}

fn size_shift(d: DType) -> i64 {
    match d {
        DType::F64 => 3,
        DType::F32 | DType::I32 => 2,
        DType::Bf16 | DType::F16 => 1,
        DType::Bool => 0,
    }
}

/// Vectors computed by one iteration of the main loop of a small tree.
const UNROLL: i64 = 4;
/// Trees of at most this many nodes are unrolled; larger ones keep one vector an iteration
/// (their own arithmetic outweighs the loop's, and four copies would cost compile time and
/// registers).
const UNROLL_MAX_NODES: usize = 12;

/// Loads and stores of tensor elements: never trapping, possibly unaligned.
fn mem() -> MemFlagsData {
    MemFlagsData::new().with_notrap()
}

struct Gen<'a, 'b, 'f> {
    l: Lower<'a, 'f>,
    spec: &'a Spec<'b>,
    /// Broadcast inputs read before the loop: (scalar value, vector value).
    pre: Vec<Option<(Value, Option<Value>)>>,
    ptrs: Vec<Value>,
}

impl Gen<'_, '_, '_> {
    fn body(&mut self) {
        let ptr = types::I64;
        let spec = self.spec;
        let entry = self.l.b.create_block();
        self.l.b.append_block_params_for_function_params(entry);
        self.l.b.switch_to_block(entry);
        let params = self.l.b.block_params(entry).to_vec();
        let (ins, out, n) = (params[0], params[1], params[2]);
        let leaf_dtype = leaf_dtypes(spec);
        for (i, d) in leaf_dtype.iter().enumerate() {
            let p = self.l.b.ins().load(ptr, MemFlagsData::trusted(), ins, (8 * i) as i32);
            self.ptrs.push(p);
            if spec.bcast[i] {
                let s = self.l.b.ins().load(Mode::Scalar.ty(*d), mem(), p, 0);
                let v = spec.vector.map(|vt| self.l.b.ins().splat(Mode::Vector(vt).ty(*d), s));
                self.pre.push(Some((s, v)));
            } else {
                self.pre.push(None);
            }
        }
        let exit = self.l.b.create_block();
        let tail_head = self.l.b.create_block();
        self.l.b.append_block_param(tail_head, ptr);
        let tail_body = self.l.b.create_block();
        let zero = self.l.b.ins().iconst(ptr, 0);
        if let Some(vt) = spec.vector {
            let mode = Mode::Vector(vt);
            // Small trees first run [`UNROLL`] vectors an iteration (the loop's own compare,
            // branch and increment were a third of a bias add's instructions), then one.
            let steps: &[i64] = if spec.tree.nodes.len() <= UNROLL_MAX_NODES { &[UNROLL, 1] } else { &[1] };
            let mut start = zero;
            for &step in steps {
                let head = self.l.b.create_block();
                self.l.b.append_block_param(head, ptr);
                let body = self.l.b.create_block();
                let done = self.l.b.create_block();
                self.l.b.append_block_param(done, ptr);
                let width = mode.lanes() * step;
                let nv = self.l.b.ins().band_imm_s(n, !(width - 1));
                self.l.b.ins().jump(head, &[BlockArg::Value(start)]);
                self.l.b.switch_to_block(head);
                let i = self.l.b.block_params(head)[0];
                let more = self.l.b.ins().icmp(IntCC::UnsignedLessThan, i, nv);
                self.l.b.ins().brif(more, body, &[], done, &[BlockArg::Value(i)]);
                self.l.b.switch_to_block(body);
                for u in 0..step {
                    let at = if u == 0 { i } else { self.l.b.ins().iadd_imm_s(i, u * mode.lanes()) };
                    self.iteration(mode, at, out);
                }
                let next = self.l.b.ins().iadd_imm_s(i, width);
                self.l.b.ins().jump(head, &[BlockArg::Value(next)]);
                self.l.b.switch_to_block(done);
                start = self.l.b.block_params(done)[0];
            }
            self.l.b.ins().jump(tail_head, &[BlockArg::Value(start)]);
        } else {
            self.l.b.ins().jump(tail_head, &[BlockArg::Value(zero)]);
        }
        self.l.b.switch_to_block(tail_head);
        let i = self.l.b.block_params(tail_head)[0];
        let more = self.l.b.ins().icmp(IntCC::UnsignedLessThan, i, n);
        self.l.b.ins().brif(more, tail_body, &[], exit, &[]);
        self.l.b.switch_to_block(tail_body);
        self.iteration(Mode::Scalar, i, out);
        let next = self.l.b.ins().iadd_imm_s(i, 1);
        self.l.b.ins().jump(tail_head, &[BlockArg::Value(next)]);
        self.l.b.switch_to_block(exit);
        self.l.b.ins().return_(&[]);
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
                Node::Op { op, to, args } => Some(self.op(mode, k, *op, *to, args, &vals)),
            };
            vals.push(v);
        }
        let root = vals[n - 1].expect("the root is an operation");
        let d = spec.typed.dtype[n - 1];
        let addr = self.addr(out, i, d);
        self.l.b.ins().store(mem(), root, addr, 0);
    }

    fn addr(&mut self, base: Value, i: Value, d: DType) -> Value {
        let off = self.l.b.ins().ishl_imm_u(i, size_shift(d));
        self.l.b.ins().iadd(base, off)
    }

    fn input(&mut self, mode: Mode, j: usize, d: DType, i: Value) -> Value {
        if let Some((s, v)) = self.pre[j] {
            return match mode {
                Mode::Scalar => s,
                Mode::Vector(_) => v.expect("vector broadcast value"),
            };
        }
        let addr = self.addr(self.ptrs[j], i, d);
        self.l.b.ins().load(mode.ty(d), mem(), addr, 0)
    }

    /// The value of node `k` as an operand of element type `want`.
    fn operand(&mut self, mode: Mode, k: usize, want: DType, vals: &[Option<Value>]) -> Value {
        match (&self.spec.tree.nodes[k], vals[k]) {
            (Node::Const(t), _) => self.konst(mode, &t.cast(want)),
            (_, Some(v)) => self.l.convert(mode, v, self.spec.typed.dtype[k], want),
            (_, None) => unreachable!("every non-constant node has a value"),
        }
    }

    /// Whether node `k` is a constant whose bits are all zero (`+0.0`, `0`, `false`).
    fn zero_bits(&self, k: usize) -> bool {
        let Node::Const(t) = &self.spec.tree.nodes[k] else { return false };
        match t.storage() {
            Storage::F32(v) => v[0].to_bits() == 0,
            Storage::F64(v) => v[0].to_bits() == 0,
            Storage::Bool(v) => !v[0],
            Storage::I32(_) | Storage::Bf16(_) | Storage::F16(_) => false,
        }
    }

    fn konst(&mut self, mode: Mode, t: &Tensor) -> Value {
        match t.storage() {
            Storage::F32(v) => self.l.fconst(mode, DType::F32, f64::from(v[0])),
            Storage::F64(v) => self.l.fconst(mode, DType::F64, v[0]),
            Storage::Bool(v) => self.l.bconst(mode, v[0]),
            Storage::I32(_) => unreachable!("i32 constants are not fused"),
            // Storage-only types are never fused (`fuse::elem_ok`); a constant is its f32 value.
            Storage::Bf16(_) | Storage::F16(_) => self.l.fconst(mode, DType::F32, t.scalar_value_f64().unwrap_or(0.0)),
        }
    }

    fn op(
        &mut self,
        mode: Mode,
        k: usize,
        op: ElemOp,
        to: Option<kernels::DType>,
        args: &[usize],
        vals: &[Option<Value>],
    ) -> Value {
        let od = self.spec.typed.operand[k];
        match op {
            ElemOp::Where => {
                let c = self.operand(mode, args[0], DType::Bool, vals);
                let a = self.operand(mode, args[1], od, vals);
                let b = self.operand(mode, args[2], od, vals);
                match (mode, self.zero_bits(args[1]), self.zero_bits(args[2])) {
                    // A lane mask is all ones or all zeros, so choosing +0 (all zero bits) is
                    // one `and` (relu's derivative `where(y > 0, g, 0)`).
                    (Mode::Vector(_), _, true) => self.l.mask(c, a, false),
                    (Mode::Vector(_), true, _) => self.l.mask(c, b, true),
                    _ => self.l.select(mode, c, a, b),
                }
            }
            ElemOp::Cast => {
                let x = self.operand(mode, args[0], od, vals);
                self.l.convert(mode, x, od, to.unwrap_or(DType::F32))
            }
            ElemOp::Binary(b) => {
                let x = self.operand(mode, args[0], od, vals);
                let y = self.operand(mode, args[1], od, vals);
                self.l.binary(mode, b, od, x, y)
            }
            ElemOp::Unary(u) => {
                let x = self.operand(mode, args[0], od, vals);
                self.l.unary(mode, u, od, x)
            }
        }
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
