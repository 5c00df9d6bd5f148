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

use lang::types::TensorTy;
pub mod body;
mod gen;

use crate::codegen::Jit;
use cranelift_codegen::ir::{types, AbiParam};
use gen::HostGen;
use kernels::{DType, Tensor};
use lang::ir::{Expr, ExprKind, Local, Pat, Program, Stmt};
use lang::types::{Elem, ElemTy, Type};
use std::collections::HashSet;
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
    matches!(t, Type::Tensor(TensorTy { elem: e, shape: s, .. }) if s.is_empty() && elem_ok(*e))
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
        let bound = &mut self.bound;
        lang::ir::walk::walk(e, &mut |x| match &x.kind {
            ExprKind::ForRange { var, .. } => {
                bound.insert(*var);
            }
            ExprKind::Block { stmts, .. } => {
                for s in stmts {
                    if let Stmt::Let { pat, .. } = s {
                        bound.extend(pat.locals());
                    }
                }
            }
            _ => {}
        });
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
                if !crate::fuse::is_elementwise(*prim) {
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

/// The dims and constants the loop `e` reads (the bodies of called functions have none; the
/// interpreter evaluates them in this order, and the region reads its inputs in this order).
pub fn leaves<'e>(e: &'e Expr, out: &mut Vec<&'e Expr>) {
    lang::ir::walk::walk(e, &mut |x| {
        if matches!(x.kind, ExprKind::DimValue(_) | ExprKind::Const(_)) {
            out.push(x);
        }
    });
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

/// The 8-byte slot of one scalar input, its value in its own type.
pub fn slot(t: &Tensor) -> u64 {
    match t.dtype() {
        DType::F32 => u64::from(t.as_f32().map_or(0.0, |v| v[0]).to_bits()),
        DType::F64 => t.as_f64().map_or(0.0, |v| v[0]).to_bits(),
        DType::I32 => u64::from(t.as_i32().map_or(0, |v| v[0]) as u32),
        DType::Bool => u64::from(t.as_bool().is_some_and(|v| v[0])),
        DType::Bf16 | DType::F16 => u64::from((t.scalar_value_f64().unwrap_or(0.0) as f32).to_bits()),
    }
}

/// The scalar an output slot holds.
pub fn from_slot(s: u64, d: DType) -> Tensor {
    match d {
        DType::F32 => Tensor::scalar_f32(f32::from_bits(s as u32)),
        DType::F64 => Tensor::scalar_f64(f64::from_bits(s)),
        DType::I32 => Tensor::scalar_i32(s as u32 as i32),
        DType::Bool => Tensor::scalar_bool(s as u8 != 0),
        DType::Bf16 | DType::F16 => Tensor::scalar_f32(f32::from_bits(s as u32)).cast(d),
    }
}
