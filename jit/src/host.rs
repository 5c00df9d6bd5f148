//! Compiled host code: loops whose every value is a scalar become one native function.
//!
//! A `for` or `while` loop qualifies when every value inside it is a scalar (`i32`, `f32`,
//! `f64`, `bool`) and every operation is one the interpreter runs on scalars without effects:
//! arithmetic, comparisons, logic, `where`, casts, the elementwise functions, `if`, blocks,
//! `let`/`var`/assignment, nested loops, and calls of named functions of scalars (inlined,
//! early `return` included; recursion is left to the interpreter). `analyse` finds the region's
//! inputs (locals defined before the loop, dims, constants) and the locals it writes;
//! `compile` types the region from its inputs' run-time element types, following the
//! interpreter's rules (a wider scalar type wins; `i32` under a float function is computed in
//! `f64`), and emits Cranelift code with one SSA variable per local.
//!
//! The function is `f(inputs: *const u64, outputs: *mut u64, interrupt: *const u8) -> i32`;
//! each input and output occupies one 8-byte slot holding its value in its own type. It
//! returns [`OK`], [`DECLINE`] (an integer division by zero: the interpreter reruns the loop and
//! reports the error with its span) or [`INTERRUPTED`] (the flag was seen at a loop head).
//! Every operation is the interpreter's own arithmetic (wrapping `i32`, truncating division,
//! the float lowering shared with fused loops), so results are bit-identical.

use crate::codegen::Jit;
use crate::lower::{float_type, Lower, Mode};
use cranelift_codegen::ir::condcodes::IntCC;
use cranelift_codegen::ir::{types, AbiParam, Block, BlockArg, InstBuilder, MemFlagsData, Type as ClType, Value};
use cranelift_frontend::Variable;
use kernels::{DType, Tensor};
use lang::ir::{Expr, ExprKind, Local, Pat, Prim, Program, Stmt};
use lang::types::{Elem, ElemTy, Type};
use std::collections::{HashMap, HashSet};
use std::hash::{DefaultHasher, Hash, Hasher};

/// The compiled region ran to the end.
pub const OK: i32 = 0;
/// The region stopped without effect; the interpreter reruns it.
pub const DECLINE: i32 = 1;
/// The interrupt flag was raised.
pub const INTERRUPTED: i32 = 2;

/// A compiled region.
pub type RegionFn = unsafe extern "C" fn(*const u64, *mut u64, *const u8) -> i32;

/// Calls nested deeper than this are left to the interpreter.
const MAX_INLINE: usize = 16;

/// What a loop reads and writes, found before any run.
pub struct Analysis {
    /// Locals defined before the loop that it reads or assigns (the first inputs).
    pub locals: Vec<Local>,
    /// How many dims and constants it reads (the inputs after the locals, in the order of
    /// [`leaves`]).
    pub n_leaves: usize,
    /// Locals defined before the loop that it assigns.
    pub outputs: Vec<Local>,
    /// Number of operations, for `--explain`.
    pub ops: usize,
    /// Hash of the region and every function it inlines (the compile cache key's base).
    pub hash: u64,
}

fn scalar_ty(t: &Type) -> bool {
    matches!(t, Type::Tensor(e, s) if s.is_empty() && elem_ok(*e))
}

fn elem_ok(e: Elem) -> bool {
    match e {
        Elem::T(t) => matches!(t, ElemTy::F32 | ElemTy::F64 | ElemTy::I32 | ElemTy::Bool),
        Elem::WeakInt | Elem::WeakFloat => true,
    }
}

fn unit_ty(t: &Type) -> bool {
    matches!(t, Type::Tuple(v) if v.is_empty())
}

/// Finds whether the loop `e` can be compiled whole, and what it reads and writes.
pub fn analyse(prog: &Program, e: &Expr) -> Result<Analysis, String> {
    let mut a = Analyser {
        prog,
        bound: HashSet::new(),
        locals: Vec::new(),
        writes: Vec::new(),
        leaves: 0,
        ops: 0,
        stack: Vec::new(),
        hasher: DefaultHasher::new(),
    };
    a.bind_all(e);
    a.expr(e, true)?;
    format!("{:?}", e.kind).hash(&mut a.hasher);
    let mut outputs = Vec::new();
    for l in a.writes {
        if !outputs.contains(&l) {
            outputs.push(l);
        }
    }
    Ok(Analysis { locals: a.locals, n_leaves: a.leaves, outputs, ops: a.ops, hash: a.hasher.finish() })
}

struct Analyser<'e> {
    prog: &'e Program,
    /// Locals of the region's own function bound inside the region.
    bound: HashSet<Local>,
    /// Locals defined outside the region that it reads or assigns.
    locals: Vec<Local>,
    writes: Vec<Local>,
    leaves: usize,
    ops: usize,
    /// Functions being inlined (empty: the region's own function).
    stack: Vec<lang::types::FuncId>,
    hasher: DefaultHasher,
}

impl<'e> Analyser<'e> {
    /// Records the locals the region binds itself (`let`, loop variables).
    fn bind_all(&mut self, e: &Expr) {
        match &e.kind {
            ExprKind::Block { stmts, result } => {
                for s in stmts {
                    match s {
                        Stmt::Let { pat, value } => {
                            bind_pat(pat, &mut self.bound);
                            self.bind_all(value);
                        }
                        Stmt::Assign { value, .. } | Stmt::Expr(value) => self.bind_all(value),
                        Stmt::BindDims { .. } => {}
                    }
                }
                self.bind_all(result);
            }
            ExprKind::ForRange { var, start, end, body } => {
                self.bound.insert(*var);
                self.bind_all(start);
                self.bind_all(end);
                self.bind_all(body);
            }
            ExprKind::While { cond, body } => {
                self.bind_all(cond);
                self.bind_all(body);
            }
            ExprKind::If { cond, then, els } => {
                self.bind_all(cond);
                self.bind_all(then);
                self.bind_all(els);
            }
            ExprKind::Prim { args, .. } | ExprKind::Call { args, .. } => args.iter().for_each(|a| self.bind_all(a)),
            _ => {}
        }
    }

    fn expr(&mut self, e: &Expr, top: bool) -> Result<(), String> {
        let inlined = !self.stack.is_empty();
        // (`return` has the error type, which matches everything: it never produces a value.)
        if !(scalar_ty(&e.ty) || unit_ty(&e.ty) || e.ty.is_error()) {
            return Err(format!("it holds a value of type {}", lang::types::type_str(&e.ty, self.prog)));
        }
        match &e.kind {
            ExprKind::Lit(lang::ir::Lit::Str(_)) => Err("it uses a string".into()),
            ExprKind::Lit(_) => Ok(()),
            ExprKind::Local(l) => {
                if !inlined && !self.bound.contains(l) && !self.locals.contains(l) {
                    self.locals.push(*l);
                }
                Ok(())
            }
            ExprKind::DimValue(_) | ExprKind::Const(_) if !inlined => {
                self.leaves += 1;
                Ok(())
            }
            ExprKind::DimValue(_) | ExprKind::Const(_) => Err("a called function uses a dim or constant".into()),
            ExprKind::Prim { prim, args, .. } => {
                if !scalar_prim(*prim) {
                    return Err(format!("it calls `{}`", prim.name()));
                }
                self.ops += 1;
                args.iter().try_for_each(|a| self.expr(a, false))
            }
            ExprKind::Call { func, dims, rests, args } => {
                let f = self.prog.func(*func);
                let name = self.prog.names.get(f.name);
                if !dims.is_empty() || !rests.is_empty() || !f.models.is_empty() || f.n_captures > 0 {
                    return Err(format!("it calls the generic function `{name}`"));
                }
                if self.stack.contains(func) || self.stack.len() >= MAX_INLINE {
                    return Err(format!("it calls `{name}` recursively"));
                }
                if !f.params.iter().all(|p| scalar_ty(&f.locals[p.0 as usize].ty)) {
                    return Err(format!("`{name}` takes non-scalar values"));
                }
                args.iter().try_for_each(|a| self.expr(a, false))?;
                self.ops += 1;
                format!("{:?}", f.body.kind).hash(&mut self.hasher);
                self.stack.push(*func);
                let r = self.expr(&f.body, false);
                self.stack.pop();
                r
            }
            ExprKind::Tuple(items) if items.is_empty() => Ok(()),
            ExprKind::Block { stmts, result } => {
                for s in stmts {
                    match s {
                        Stmt::Let { pat, value } => {
                            simple_pat(pat)?;
                            self.expr(value, false)?;
                        }
                        Stmt::Assign { pat, value } => {
                            simple_pat(pat)?;
                            if let (Pat::Local(l), false) = (pat, inlined) {
                                if !self.bound.contains(l) {
                                    self.writes.push(*l);
                                    if !self.locals.contains(l) {
                                        self.locals.push(*l);
                                    }
                                }
                            }
                            self.expr(value, false)?;
                        }
                        Stmt::Expr(x) => self.expr(x, false)?,
                        Stmt::BindDims { .. } => return Err("it binds dims at run time".into()),
                    }
                }
                self.expr(result, false)
            }
            ExprKind::If { cond, then, els } => {
                self.expr(cond, false)?;
                self.expr(then, false)?;
                self.expr(els, false)
            }
            ExprKind::ForRange { start, end, body, .. } => {
                self.expr(start, false)?;
                self.expr(end, false)?;
                self.expr(body, false)
            }
            ExprKind::While { cond, body } => {
                self.expr(cond, false)?;
                self.expr(body, false)
            }
            ExprKind::Return(v) if inlined => self.expr(v, false),
            ExprKind::Return(_) => Err("it returns from its function".into()),
            _ if top => Err("it is not a loop".into()),
            _ => Err(format!("it uses {}", kind_name(&e.kind))),
        }
    }
}

/// The dims and constants the loop `e` reads, in the order `analyse` counted them (the
/// bodies of called functions have none).
pub fn leaves<'e>(e: &'e Expr, out: &mut Vec<&'e Expr>) {
    match &e.kind {
        ExprKind::DimValue(_) | ExprKind::Const(_) => out.push(e),
        ExprKind::Prim { args, .. } | ExprKind::Call { args, .. } => args.iter().for_each(|a| leaves(a, out)),
        ExprKind::Block { stmts, result } => {
            for s in stmts {
                match s {
                    Stmt::Let { value, .. } | Stmt::Assign { value, .. } | Stmt::Expr(value) => leaves(value, out),
                    Stmt::BindDims { .. } => {}
                }
            }
            leaves(result, out);
        }
        ExprKind::If { cond, then, els } => {
            leaves(cond, out);
            leaves(then, out);
            leaves(els, out);
        }
        ExprKind::ForRange { start, end, body, .. } => {
            leaves(start, out);
            leaves(end, out);
            leaves(body, out);
        }
        ExprKind::While { cond, body } => {
            leaves(cond, out);
            leaves(body, out);
        }
        ExprKind::Return(v) => leaves(v, out),
        _ => {}
    }
}

fn bind_pat(p: &Pat, out: &mut HashSet<Local>) {
    match p {
        Pat::Local(l) => {
            out.insert(*l);
        }
        Pat::Ignore => {}
        Pat::Tuple(ps) => ps.iter().for_each(|p| bind_pat(p, out)),
    }
}

fn simple_pat(p: &Pat) -> Result<(), String> {
    match p {
        Pat::Local(_) | Pat::Ignore => Ok(()),
        Pat::Tuple(_) => Err("it destructures a tuple".into()),
    }
}

fn kind_name(k: &ExprKind) -> &'static str {
    match k {
        ExprKind::CallValue { .. } => "a function value",
        ExprKind::Closure { .. } | ExprKind::FuncRef(_) => "a function value",
        ExprKind::Transform { .. } | ExprKind::Jvp { .. } | ExprKind::Vjp { .. } => "a transform",
        ExprKind::Tuple(_) | ExprKind::TupleGet(..) => "tuples",
        ExprKind::Field(..) | ExprKind::ModelInit { .. } | ExprKind::ModelBuild { .. } => "models",
        ExprKind::ForBatches { .. } => "`batches`",
        _ => "an expression the JIT does not compile",
    }
}

/// Whether `e` always leaves its function through a `return`.
fn diverges(e: &Expr) -> bool {
    match &e.kind {
        ExprKind::Return(_) => true,
        ExprKind::Block { stmts, result } => {
            stmts.iter().any(|s| match s {
                Stmt::Let { value, .. } | Stmt::Assign { value, .. } | Stmt::Expr(value) => diverges(value),
                Stmt::BindDims { .. } => false,
            }) || diverges(result)
        }
        ExprKind::If { cond, then, els } => diverges(cond) || (diverges(then) && diverges(els)),
        _ => false,
    }
}

/// The primitives host code runs on scalars.
fn scalar_prim(p: Prim) -> bool {
    crate::fuse::is_elementwise(p)
}

/// Whether the interpreter's `where`/binary rules give `a` or `b` for two rank-0 operands.
fn wider(a: DType, b: DType) -> DType {
    let w = |d: DType| match d {
        DType::Bool => 0,
        DType::I32 => 1,
        DType::F32 => 2,
        DType::F64 => 3,
    };
    if w(a) >= w(b) {
        a
    } else {
        b
    }
}

fn cl_type(d: DType) -> ClType {
    match d {
        DType::Bool => types::I8,
        DType::I32 => types::I32,
        d => float_type(d),
    }
}

/// A compiled region and the element types of its outputs.
#[derive(Clone, Debug)]
pub struct CompiledRegion {
    pub f: RegionFn,
    pub outputs: Vec<DType>,
    pub micros: f64,
}

/// The cache key of a region compiled for inputs of these element types.
pub fn key(a: &Analysis, ins: &[DType]) -> String {
    let ts: Vec<&str> = ins.iter().map(|d| d.name()).collect();
    format!("host:{:016x}:{}", a.hash, ts.join(","))
}

impl Jit {
    /// Compiles the loop `e` for inputs of these element types (or finds it in the cache).
    pub fn get_or_compile_region(
        &mut self,
        prog: &Program,
        e: &Expr,
        a: &Analysis,
        ins: &[DType],
    ) -> Result<(CompiledRegion, bool), String> {
        let k = key(a, ins);
        if let Some(c) = self.regions.get(&k) {
            return Ok((c.clone(), false));
        }
        let t = std::time::Instant::now();
        let ptr = AbiParam::new(types::I64);
        let (id, outputs) = self.build("msl_host", &[ptr, ptr, ptr], &[AbiParam::new(types::I32)], |l| {
            HostGen::new(l, prog, a, ins, e).run(e)
        })?;
        let code = self.finalize(id)?;
        // SAFETY: `build` defined a function with exactly this signature (three pointer-sized
        // parameters, an i32 result) for the host's calling convention.
        let f = unsafe { std::mem::transmute::<*const u8, RegionFn>(code) };
        let c = CompiledRegion { f, outputs, micros: t.elapsed().as_secs_f64() * 1e6 };
        self.regions.insert(k, c.clone());
        Ok((c, true))
    }
}

type Val = Option<(Value, DType)>;

struct HostGen<'a, 'f, 'p> {
    l: Lower<'a, 'f>,
    prog: &'p Program,
    an: &'p Analysis,
    /// The loop's dims and constants, as `leaves` lists them.
    leaf_exprs: Vec<&'p Expr>,
    ins: &'p [DType],
    /// SSA variable and element type of each local, by (inline frame, local).
    vars: HashMap<(u32, Local), (Variable, DType)>,
    frame: u32,
    next_frame: u32,
    /// Values of the dim and constant leaves, by expression address.
    leaf_vals: HashMap<usize, (Value, DType)>,
    /// Exit blocks of the calls being inlined, with their result types once known.
    rets: Vec<(Block, Option<DType>)>,
    interrupt: Option<Value>,
    decline: Option<Block>,
    interrupted: Option<Block>,
}

fn bad<T>(why: impl Into<String>) -> Result<T, String> {
    Err(why.into())
}

impl<'a, 'f, 'p> HostGen<'a, 'f, 'p> {
    fn new(l: Lower<'a, 'f>, prog: &'p Program, an: &'p Analysis, ins: &'p [DType], e: &'p Expr) -> Self {
        let mut leaf_exprs = Vec::new();
        leaves(e, &mut leaf_exprs);
        HostGen {
            l,
            prog,
            an,
            leaf_exprs,
            ins,
            vars: HashMap::new(),
            frame: 0,
            next_frame: 1,
            leaf_vals: HashMap::new(),
            rets: Vec::new(),
            interrupt: None,
            decline: None,
            interrupted: None,
        }
    }

    fn run(mut self, e: &Expr) -> Result<Vec<DType>, String> {
        let entry = self.l.b.create_block();
        self.l.b.append_block_params_for_function_params(entry);
        self.l.b.switch_to_block(entry);
        let p = self.l.b.block_params(entry).to_vec();
        let (ins, outs) = (p[0], p[1]);
        self.interrupt = Some(p[2]);
        let flags = MemFlagsData::trusted();
        let n = self.an.locals.len();
        if self.ins.len() != n + self.an.n_leaves || self.leaf_exprs.len() != self.an.n_leaves {
            return bad("wrong number of inputs");
        }
        for (k, &d) in self.ins.iter().enumerate() {
            let v = self.l.b.ins().load(cl_type(d), flags, ins, (8 * k) as i32);
            if k < n {
                let var = self.l.b.declare_var(cl_type(d));
                self.l.b.def_var(var, v);
                self.vars.insert((0, self.an.locals[k]), (var, d));
            } else {
                self.leaf_vals.insert(self.leaf_exprs[k - n] as *const Expr as usize, (v, d));
            }
        }
        self.expr(e)?;
        let mut out_types = Vec::new();
        for (k, l) in self.an.outputs.iter().enumerate() {
            let (var, d) = self.vars[&(0, *l)];
            let v = self.l.b.use_var(var);
            self.l.b.ins().store(flags, v, outs, (8 * k) as i32);
            out_types.push(d);
        }
        let ok = self.l.b.ins().iconst(types::I32, i64::from(OK));
        self.l.b.ins().return_(&[ok]);
        for (blk, code) in [(self.decline, DECLINE), (self.interrupted, INTERRUPTED)] {
            if let Some(blk) = blk {
                self.l.b.switch_to_block(blk);
                let c = self.l.b.ins().iconst(types::I32, i64::from(code));
                self.l.b.ins().return_(&[c]);
            }
        }
        Ok(out_types)
    }

    fn exit_block(&mut self, code: i32) -> Block {
        let slot = if code == DECLINE { &mut self.decline } else { &mut self.interrupted };
        match slot {
            Some(b) => *b,
            None => {
                let b = self.l.b.create_block();
                *slot = Some(b);
                b
            }
        }
    }

    /// Leaves the function with `code` when `cond` (an i8) is true.
    fn exit_if(&mut self, cond: Value, code: i32) {
        let exit = self.exit_block(code);
        let cont = self.l.b.create_block();
        self.l.b.ins().brif(cond, exit, &[], cont, &[]);
        self.l.b.switch_to_block(cont);
    }

    fn value(&mut self, e: &Expr) -> Result<(Value, DType), String> {
        match self.expr(e)? {
            Some(v) => Ok(v),
            None => bad("a value is missing"),
        }
    }

    fn expr(&mut self, e: &Expr) -> Result<Val, String> {
        match &e.kind {
            ExprKind::Lit(l) => {
                let Some(t) = lang::interp::accel::literal(l, &e.ty) else { return bad("a literal is not a scalar") };
                Ok(Some(self.konst(&t)))
            }
            ExprKind::Local(l) => match self.vars.get(&(self.frame, *l)) {
                Some(&(var, d)) => Ok(Some((self.l.b.use_var(var), d))),
                None => bad("a local has no value"),
            },
            ExprKind::DimValue(_) | ExprKind::Const(_) => {
                self.leaf_vals.get(&(e as *const Expr as usize)).copied().map(Some).ok_or_else(|| "a leaf".into())
            }
            ExprKind::Prim { prim, args, attrs } => {
                let mut xs = Vec::with_capacity(args.len());
                for a in args {
                    xs.push(self.value(a)?);
                }
                let to = attrs.dtype.map(lang::interp::accel::dtype);
                self.prim(*prim, to, &xs).map(Some)
            }
            ExprKind::Call { func, args, .. } => self.call(*func, args),
            ExprKind::Tuple(_) => Ok(None),
            ExprKind::Block { stmts, result } => {
                for s in stmts {
                    self.stmt(s)?;
                }
                self.expr(result)
            }
            ExprKind::If { cond, then, els } => self.if_(cond, then, els),
            ExprKind::ForRange { var, start, end, body } => {
                let (a, da) = self.value(start)?;
                let (b, db) = self.value(end)?;
                if da != DType::I32 || db != DType::I32 {
                    return bad("a range bound is not an i32");
                }
                let head = self.l.b.create_block();
                self.l.b.append_block_param(head, types::I32);
                let body_blk = self.l.b.create_block();
                let exit = self.l.b.create_block();
                self.l.b.ins().jump(head, &[BlockArg::Value(a)]);
                self.l.b.switch_to_block(head);
                let i = self.l.b.block_params(head)[0];
                let more = self.l.b.ins().icmp(IntCC::SignedLessThan, i, b);
                self.l.b.ins().brif(more, body_blk, &[], exit, &[]);
                self.l.b.switch_to_block(body_blk);
                self.poll_interrupt();
                self.define(*var, i, DType::I32)?;
                self.expr(body)?;
                let next = self.l.b.ins().iadd_imm_s(i, 1);
                self.l.b.ins().jump(head, &[BlockArg::Value(next)]);
                self.l.b.switch_to_block(exit);
                Ok(None)
            }
            ExprKind::While { cond, body } => {
                let head = self.l.b.create_block();
                let body_blk = self.l.b.create_block();
                let exit = self.l.b.create_block();
                self.l.b.ins().jump(head, &[]);
                self.l.b.switch_to_block(head);
                let (c, d) = self.value(cond)?;
                if d != DType::Bool {
                    return bad("a loop condition is not a bool");
                }
                self.l.b.ins().brif(c, body_blk, &[], exit, &[]);
                self.l.b.switch_to_block(body_blk);
                self.poll_interrupt();
                self.expr(body)?;
                self.l.b.ins().jump(head, &[]);
                self.l.b.switch_to_block(exit);
                Ok(None)
            }
            ExprKind::Return(v) => {
                let (x, d) = self.value(v)?;
                let Some((blk, ty)) = self.rets.last_mut() else { return bad("a return leaves the region") };
                if ty.is_some_and(|t| t != d) {
                    return bad("a function returns values of two element types");
                }
                if ty.is_none() {
                    *ty = Some(d);
                    let blk = *blk;
                    self.l.b.append_block_param(blk, cl_type(d));
                }
                let blk = *blk;
                self.l.b.ins().jump(blk, &[BlockArg::Value(x)]);
                // What follows a `return` is unreachable; it still needs a block.
                let dead = self.l.b.create_block();
                self.l.b.switch_to_block(dead);
                Ok(None)
            }
            _ => bad(format!("it uses {}", kind_name(&e.kind))),
        }
    }

    fn stmt(&mut self, s: &Stmt) -> Result<(), String> {
        match s {
            Stmt::Let { pat, value } | Stmt::Assign { pat, value } => {
                let v = self.expr(value)?;
                match (pat, v) {
                    (Pat::Local(l), Some((x, d))) => self.define(*l, x, d),
                    (Pat::Ignore, _) => Ok(()),
                    _ => bad("a binding has no scalar value"),
                }
            }
            Stmt::Expr(x) => self.expr(x).map(|_| ()),
            Stmt::BindDims { .. } => bad("it binds dims"),
        }
    }

    /// Gives local `l` of the current frame the value `x` (declaring it on first sight).
    fn define(&mut self, l: Local, x: Value, d: DType) -> Result<(), String> {
        let key = (self.frame, l);
        let var = match self.vars.get(&key) {
            Some(&(var, old)) if old == d => var,
            Some(_) => return bad("a variable changes element type"),
            None => {
                let var = self.l.b.declare_var(cl_type(d));
                self.vars.insert(key, (var, d));
                var
            }
        };
        self.l.b.def_var(var, x);
        Ok(())
    }

    fn poll_interrupt(&mut self) {
        let Some(p) = self.interrupt else { return };
        let flag = self.l.b.ins().load(types::I8, MemFlagsData::new().with_notrap(), p, 0);
        self.exit_if(flag, INTERRUPTED);
    }

    fn if_(&mut self, cond: &Expr, then: &Expr, els: &Expr) -> Result<Val, String> {
        let (c, d) = self.value(cond)?;
        if d != DType::Bool {
            return bad("a condition is not a bool");
        }
        let (tb, eb, merge) = (self.l.b.create_block(), self.l.b.create_block(), self.l.b.create_block());
        self.l.b.ins().brif(c, tb, &[], eb, &[]);
        // A branch that always returns gives no value: compile the other one first, so that the
        // merge block's type is known when the returning branch jumps there (unreachably).
        let order = if diverges(then) { [(eb, els), (tb, then)] } else { [(tb, then), (eb, els)] };
        let mut ty: Option<Option<DType>> = None;
        for (blk, x) in order {
            self.l.b.switch_to_block(blk);
            let v = self.expr(x)?;
            let want = *ty.get_or_insert_with(|| {
                let d = v.map(|(_, d)| d);
                if let Some(d) = d {
                    self.l.b.append_block_param(merge, cl_type(d));
                }
                d
            });
            match (v, want) {
                (Some((v, d)), Some(w)) if d == w => self.l.b.ins().jump(merge, &[BlockArg::Value(v)]),
                (None, Some(w)) if diverges(x) => {
                    let z = self.zero(w);
                    self.l.b.ins().jump(merge, &[BlockArg::Value(z)])
                }
                (_, None) => self.l.b.ins().jump(merge, &[]),
                _ => return bad("the branches of an `if` differ in element type"),
            };
        }
        self.l.b.switch_to_block(merge);
        Ok(ty.flatten().map(|d| (self.l.b.block_params(merge)[0], d)))
    }

    fn call(&mut self, func: lang::types::FuncId, args: &[Expr]) -> Result<Val, String> {
        let f = self.prog.func(func);
        let mut vals = Vec::with_capacity(args.len());
        for a in args {
            vals.push(self.value(a)?);
        }
        let saved = self.frame;
        self.frame = self.next_frame;
        self.next_frame += 1;
        for (p, (v, d)) in f.params.iter().zip(vals) {
            self.define(*p, v, d)?;
        }
        let exit = self.l.b.create_block();
        self.rets.push((exit, None));
        let r = self.expr(&f.body);
        let (_, ty) = self.rets.pop().expect("pushed above");
        self.frame = saved;
        let r = r?;
        match (r, ty) {
            (Some((v, d)), None) => {
                self.l.b.append_block_param(exit, cl_type(d));
                self.l.b.ins().jump(exit, &[BlockArg::Value(v)]);
                self.l.b.switch_to_block(exit);
                Ok(Some((self.l.b.block_params(exit)[0], d)))
            }
            (Some((v, d)), Some(t)) if d == t => {
                self.l.b.ins().jump(exit, &[BlockArg::Value(v)]);
                self.l.b.switch_to_block(exit);
                Ok(Some((self.l.b.block_params(exit)[0], d)))
            }
            (None, Some(t)) => {
                // The body ended in a `return`: the fall-through is unreachable.
                let z = self.zero(t);
                self.l.b.ins().jump(exit, &[BlockArg::Value(z)]);
                self.l.b.switch_to_block(exit);
                Ok(Some((self.l.b.block_params(exit)[0], t)))
            }
            (None, None) => {
                self.l.b.ins().jump(exit, &[]);
                self.l.b.switch_to_block(exit);
                Ok(None)
            }
            _ => bad("a function returns values of two element types"),
        }
    }

    fn zero(&mut self, d: DType) -> Value {
        match d {
            DType::F32 => self.l.b.ins().f32const(0.0),
            DType::F64 => self.l.b.ins().f64const(0.0),
            d => self.l.b.ins().iconst(cl_type(d), 0),
        }
    }

    fn konst(&mut self, t: &Tensor) -> (Value, DType) {
        let d = t.dtype();
        let v = match d {
            DType::F32 => self.l.b.ins().f32const(t.as_f32().map_or(0.0, |v| v[0])),
            DType::F64 => self.l.b.ins().f64const(t.as_f64().map_or(0.0, |v| v[0])),
            DType::I32 => self.l.b.ins().iconst(types::I32, i64::from(t.as_i32().map_or(0, |v| v[0]))),
            DType::Bool => self.l.b.ins().iconst(types::I8, i64::from(t.as_bool().is_some_and(|v| v[0]))),
        };
        (v, d)
    }

    /// `Tensor::cast` on one scalar.
    fn cast(&mut self, v: Value, from: DType, to: DType) -> Value {
        let b = &mut self.l.b;
        match (from, to) {
            _ if from == to => v,
            (DType::I32, DType::Bool) => b.ins().icmp_imm_s(IntCC::NotEqual, v, 0),
            (DType::Bool, DType::I32) => b.ins().uextend(types::I32, v),
            (DType::I32, f) => b.ins().fcvt_from_sint(float_type(f), v),
            (f, DType::I32) if f.is_float() => b.ins().fcvt_to_sint_sat(types::I32, v),
            _ => self.l.convert(Mode::Scalar, v, from, to),
        }
    }

    fn prim(&mut self, p: Prim, to: Option<DType>, xs: &[(Value, DType)]) -> Result<(Value, DType), String> {
        use Prim::*;
        match p {
            Cast => {
                let to = to.unwrap_or(DType::F32);
                Ok((self.cast(xs[0].0, xs[0].1, to), to))
            }
            Where => {
                if xs[0].1 != DType::Bool {
                    return bad("`where` needs a bool condition");
                }
                let d = wider(xs[1].1, xs[2].1);
                let a = self.cast(xs[1].0, xs[1].1, d);
                let b = self.cast(xs[2].0, xs[2].1, d);
                Ok((self.l.b.ins().select(xs[0].0, a, b), d))
            }
            Not => match xs[0].1 {
                DType::Bool => Ok((self.l.b.ins().bxor_imm_u(xs[0].0, 1), DType::Bool)),
                _ => bad("`not` needs a bool"),
            },
            _ if xs.len() == 2 => self.binary(p, xs[0], xs[1]),
            _ => self.unary(p, xs[0]),
        }
    }

    fn unary(&mut self, p: Prim, (x, d): (Value, DType)) -> Result<(Value, DType), String> {
        match d {
            DType::Bool => bad(format!("`{}` of a bool", p.name())),
            DType::I32 if matches!(p, Prim::Neg | Prim::Abs | Prim::Sign) => {
                let b = &mut self.l.b;
                let v = match p {
                    Prim::Neg => b.ins().ineg(x),
                    Prim::Abs => {
                        let n = b.ins().ineg(x);
                        let neg = b.ins().icmp_imm_s(IntCC::SignedLessThan, x, 0);
                        b.ins().select(neg, n, x)
                    }
                    _ => {
                        let gt = b.ins().icmp_imm_s(IntCC::SignedGreaterThan, x, 0);
                        let lt = b.ins().icmp_imm_s(IntCC::SignedLessThan, x, 0);
                        let gt = b.ins().uextend(types::I32, gt);
                        let lt = b.ins().uextend(types::I32, lt);
                        b.ins().isub(gt, lt)
                    }
                };
                Ok((v, DType::I32))
            }
            DType::I32 if p == Prim::Relu => bad("`relu` of an i32"),
            DType::I32 => {
                // A weak integer under a float function is computed in f64.
                let f = self.cast(x, DType::I32, DType::F64);
                Ok((self.l.unary(Mode::Scalar, p, DType::F64, f), DType::F64))
            }
            d => Ok((self.l.unary(Mode::Scalar, p, d, x), d)),
        }
    }

    fn binary(&mut self, p: Prim, a: (Value, DType), b: (Value, DType)) -> Result<(Value, DType), String> {
        use Prim::*;
        let d = wider(a.1, b.1);
        let x = self.cast(a.0, a.1, d);
        let y = self.cast(b.0, b.1, d);
        let cmp = matches!(p, Eq | Ne | Lt | Le | Gt | Ge);
        let out = if cmp { DType::Bool } else { d };
        match d {
            DType::Bool if cmp || matches!(p, And | Or) => Ok((self.l.binary(Mode::Scalar, p, d, x, y), out)),
            DType::Bool => bad(format!("`{}` of bools", p.name())),
            _ if matches!(p, And | Or) => bad(format!("`{}` of numbers", p.name())),
            DType::I32 => self.int_binary(p, x, y).map(|v| (v, out)),
            d => Ok((self.l.binary(Mode::Scalar, p, d, x, y), out)),
        }
    }

    /// `i32::wrapping_pow` by squaring (any order of wrapping products gives the same bits); a
    /// negative exponent is the interpreter's error to report.
    fn int_pow(&mut self, x: Value, y: Value) -> Value {
        let neg = self.l.b.ins().icmp_imm_s(IntCC::SignedLessThan, y, 0);
        self.exit_if(neg, DECLINE);
        let b = &mut self.l.b;
        let (head, body, done) = (b.create_block(), b.create_block(), b.create_block());
        for _ in 0..3 {
            b.append_block_param(head, types::I32);
        }
        b.append_block_param(done, types::I32);
        let one = b.ins().iconst(types::I32, 1);
        b.ins().jump(head, &[BlockArg::Value(one), BlockArg::Value(x), BlockArg::Value(y)]);
        b.switch_to_block(head);
        let (r, base, e) = (b.block_params(head)[0], b.block_params(head)[1], b.block_params(head)[2]);
        b.ins().brif(e, body, &[], done, &[BlockArg::Value(r)]);
        b.switch_to_block(body);
        let bit = b.ins().band_imm_u(e, 1);
        let times = b.ins().imul(r, base);
        let r2 = b.ins().select(bit, times, r);
        let sq = b.ins().imul(base, base);
        let e2 = b.ins().ushr_imm_u(e, 1);
        b.ins().jump(head, &[BlockArg::Value(r2), BlockArg::Value(sq), BlockArg::Value(e2)]);
        b.switch_to_block(done);
        b.block_params(done)[0]
    }

    /// The interpreter's `i32` arithmetic: wrapping, truncating division, division by zero
    /// an error (here: decline, and the interpreter reports it).
    fn int_binary(&mut self, p: Prim, x: Value, y: Value) -> Result<Value, String> {
        use Prim::*;
        let cc = |c| -> Option<IntCC> { Some(c) };
        let c = match p {
            Eq => cc(IntCC::Equal),
            Ne => cc(IntCC::NotEqual),
            Lt => cc(IntCC::SignedLessThan),
            Le => cc(IntCC::SignedLessThanOrEqual),
            Gt => cc(IntCC::SignedGreaterThan),
            Ge => cc(IntCC::SignedGreaterThanOrEqual),
            _ => None,
        };
        if let Some(c) = c {
            return Ok(self.l.b.ins().icmp(c, x, y));
        }
        Ok(match p {
            Add => self.l.b.ins().iadd(x, y),
            Sub => self.l.b.ins().isub(x, y),
            Mul => self.l.b.ins().imul(x, y),
            Maximum => self.l.b.ins().smax(x, y),
            Minimum => self.l.b.ins().smin(x, y),
            Div | Rem => {
                let zero = self.l.b.ins().icmp_imm_s(IntCC::Equal, y, 0);
                self.exit_if(zero, DECLINE);
                // `wrapping_div`/`wrapping_rem`: dividing by -1 never traps.
                let b = &mut self.l.b;
                let m1 = b.ins().icmp_imm_s(IntCC::Equal, y, -1);
                let one = b.ins().iconst(types::I32, 1);
                let safe = b.ins().select(m1, one, y);
                if p == Div {
                    let q = b.ins().sdiv(x, safe);
                    let n = b.ins().ineg(x);
                    b.ins().select(m1, n, q)
                } else {
                    b.ins().srem(x, safe)
                }
            }
            Pow => self.int_pow(x, y),
            _ => return bad(format!("`{}` of i32 values", p.name())),
        })
    }
}

/// The 8-byte slot of one scalar input, its value in its own type.
pub fn slot(t: &Tensor) -> u64 {
    match t.dtype() {
        DType::F32 => u64::from(t.as_f32().map_or(0.0, |v| v[0]).to_bits()),
        DType::F64 => t.as_f64().map_or(0.0, |v| v[0]).to_bits(),
        DType::I32 => u64::from(t.as_i32().map_or(0, |v| v[0]) as u32),
        DType::Bool => u64::from(t.as_bool().is_some_and(|v| v[0])),
    }
}

/// The scalar an output slot holds.
pub fn from_slot(s: u64, d: DType) -> Tensor {
    match d {
        DType::F32 => Tensor::scalar_f32(f32::from_bits(s as u32)),
        DType::F64 => Tensor::scalar_f64(f64::from_bits(s)),
        DType::I32 => Tensor::scalar_i32(s as u32 as i32),
        DType::Bool => Tensor::scalar_bool(s as u8 != 0),
    }
}
