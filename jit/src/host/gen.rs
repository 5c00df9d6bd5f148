//! Cranelift code for one host region: SSA variables per local (by inline frame), blocks for
//! `if`, loops and inlined calls, and the interpreter's scalar arithmetic (see `host`).

use super::{kind_name, leaves, Analysis, DECLINE, INTERRUPTED, OK};
use crate::fuse::ElemOp;
use crate::lower::{float_type, Lower, Mode};
use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::{
    types, Block, BlockArg, InstBuilder, InstructionData, MemFlagsData, Opcode, Type as ClType, Value,
};
use cranelift_frontend::{FunctionBuilder, Variable};
use kernels::ops::{BinaryOp, UnaryOp};
use kernels::{DType, Tensor};
use lang::ir::{Expr, ExprKind, Local, Pat, Prim, Program, Stmt};
use std::collections::HashMap;

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

/// Whether the interpreter's `where`/binary rules give `a` or `b` for two rank-0 operands.
fn wider(a: DType, b: DType) -> DType {
    let w = |d: DType| match d {
        DType::Bool => 0,
        DType::I32 => 1,
        DType::Bf16 | DType::F16 => 2,
        DType::F32 => 3,
        DType::F64 => 4,
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

type Val = Option<(Value, DType)>;

/// Iterations of a `for` loop between two reads of the interrupt flag.
const CHUNK: i64 = 1 << 16;

/// How many iterations of a small counted loop's body one trip runs (`unrollable`).
const UNROLL: i64 = 8;

/// The most IR nodes a loop body may have to be unrolled.
const UNROLL_NODES: usize = 40;

/// Whether a counted loop's body is small and straight enough to be written `UNROLL` times: no
/// call, loop or `return` (each copy would inline, nest or exit again), at most `UNROLL_NODES`
/// nodes.
fn unrollable(body: &Expr) -> bool {
    let mut nodes = 0;
    let mut straight = true;
    lang::ir::walk::walk(body, &mut |e| {
        nodes += 1;
        straight &= !matches!(
            e.kind,
            ExprKind::Call { .. } | ExprKind::ForRange { .. } | ExprKind::While { .. } | ExprKind::Return(_)
        );
    });
    straight && nodes <= UNROLL_NODES
}

/// The literal divisors `c ≥ 2` of `var / c` and `var % c` in a loop body, where `var` is the
/// loop variable: an unrolled trip divides its first value once and steps the rest
/// (`HostGen::stepped_division`).
fn induction_divisors(body: &Expr, var: Local) -> Vec<i64> {
    let mut cs = Vec::new();
    lang::ir::walk::walk(body, &mut |e| {
        let ExprKind::Prim { prim, args, .. } = &e.kind else { return };
        if !matches!(crate::fuse::elem_op(*prim), Some(ElemOp::Binary(BinaryOp::Div | BinaryOp::Rem))) {
            return;
        }
        if let [x, y] = &args[..] {
            if let (ExprKind::Local(l), ExprKind::Lit(lang::ir::Lit::Int(c))) = (&x.kind, &y.kind) {
                if *l == var && (2..=i64::from(i32::MAX)).contains(c) && !cs.contains(c) {
                    cs.push(*c);
                }
            }
        }
    });
    cs
}

pub(super) struct HostGen<'a, 'f, 'p> {
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
    /// Values of the dim and constant leaves, by expression id.
    leaf_vals: HashMap<lang::ir::ExprId, (Value, DType)>,
    /// Exit blocks of the calls being inlined, with their result types once known.
    rets: Vec<(Block, Option<DType>)>,
    interrupt: Option<Value>,
    /// Known bounds of `i32` values (constants, loop variables, and what arithmetic on them
    /// gives without wrapping), so that division by a literal skips the sign correction.
    ranges: HashMap<Value, (i64, i64)>,
    /// In an unrolled trip: the loop variable's value in each copy, with the copy's offset `k`
    /// from the trip's first value …
    copies: HashMap<Value, i64>,
    /// … and, for each divisor of the loop variable in the body, that first value's quotient
    /// and remainder (the variable is ≥ 0 there).
    trip_divisions: Vec<(i64, Value, Value)>,
    decline: Option<Block>,
    interrupted: Option<Block>,
}

fn bad<T>(why: impl Into<String>) -> Result<T, String> {
    Err(why.into())
}

impl<'a, 'f, 'p> HostGen<'a, 'f, 'p> {
    pub(super) fn new(l: Lower<'a, 'f>, prog: &'p Program, an: &'p Analysis, ins: &'p [DType], e: &'p Expr) -> Self {
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
            ranges: HashMap::new(),
            copies: HashMap::new(),
            trip_divisions: Vec::new(),
            decline: None,
            interrupted: None,
        }
    }

    pub(super) fn run(mut self, e: &Expr) -> Result<Vec<DType>, String> {
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
                self.leaf_vals.insert(self.leaf_exprs[k - n].id, (v, d));
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
                self.leaf_vals.get(&e.id).copied().map(Some).ok_or_else(|| "a leaf".into())
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
                // The loop variable lies in [start, end - 1] whenever the loop runs.
                let var_range = match (self.range(a), self.range(b)) {
                    (Some((lo, _)), Some((_, hi))) if lo < hi => Some((lo, hi - 1)),
                    _ => None,
                };
                // Rotated and strip-mined: the bound is tested at the bottom, and the interrupt
                // flag is read once per CHUNK iterations (the counter is an i64, so `i + CHUNK`
                // cannot wrap).
                let (lo, hi) = (a, b);
                let b = &mut self.l.b;
                let (a64, b64) = (b.ins().sextend(types::I64, lo), b.ins().sextend(types::I64, hi));
                let (outer, inner, exit) = (b.create_block(), b.create_block(), b.create_block());
                b.append_block_param(outer, types::I64);
                b.append_block_param(inner, types::I64);
                let runs = b.ins().icmp(IntCC::SignedLessThan, a64, b64);
                b.ins().brif(runs, outer, &[BlockArg::Value(a64)], exit, &[]);
                b.switch_to_block(outer);
                let i = b.block_params(outer)[0];
                let lim = b.ins().iadd_imm_s(i, CHUNK);
                let chunk_end = b.ins().smin(lim, b64);
                self.poll_interrupt();
                self.l.b.ins().jump(inner, &[BlockArg::Value(i)]);
                self.l.b.switch_to_block(inner);
                let j = self.l.b.block_params(inner)[0];
                if unrollable(body) {
                    // `UNROLL` iterations a trip while they fit in the chunk, then one at a time:
                    // a small body then pays the loop's test and jump once per `UNROLL`.
                    let b = &mut self.l.b;
                    let (wide, tail, single) = (b.create_block(), b.create_block(), b.create_block());
                    b.append_block_param(tail, types::I64);
                    let wide_end = b.ins().iadd_imm_s(j, UNROLL);
                    let fits = b.ins().icmp(IntCC::SignedLessThanOrEqual, wide_end, chunk_end);
                    b.ins().brif(fits, wide, &[], tail, &[BlockArg::Value(j)]);
                    b.switch_to_block(wide);
                    // `var / c` and `var % c` (var ≥ 0): the trip's first value is divided
                    // once, and each copy steps from it with an addition and a select.
                    if let Some(r) = var_range.filter(|&(lo, _)| lo >= 0) {
                        let v0 = self.l.b.ins().ireduce(types::I32, j);
                        self.ranges.insert(v0, r);
                        for c in induction_divisors(body, *var) {
                            // One quotient; the remainder from it (v0 ≥ 0: no floor correction).
                            let y = self.l.b.ins().iconst(types::I32, c);
                            let q0 = self.int_binary(BinaryOp::Div, v0, y)?;
                            let qc = self.l.b.ins().imul(q0, y);
                            let r0 = self.l.b.ins().isub(v0, qc);
                            self.trip_divisions.push((c, q0, r0));
                        }
                    }
                    for k in 0..UNROLL {
                        let jk = self.l.b.ins().iadd_imm_s(j, k);
                        self.iteration(*var, jk, var_range, body, Some(k))?;
                    }
                    self.copies.clear();
                    self.trip_divisions.clear();
                    self.l.b.ins().jump(inner, &[BlockArg::Value(wide_end)]);
                    self.l.b.switch_to_block(tail);
                    let t = self.l.b.block_params(tail)[0];
                    let b = &mut self.l.b;
                    let (after, in_chunk) = (b.create_block(), b.ins().icmp(IntCC::SignedLessThan, t, chunk_end));
                    b.append_block_param(after, types::I64);
                    b.ins().brif(in_chunk, single, &[], after, &[BlockArg::Value(t)]);
                    b.switch_to_block(single);
                    self.iteration(*var, t, var_range, body, None)?;
                    let next = self.l.b.ins().iadd_imm_s(t, 1);
                    self.l.b.ins().jump(tail, &[BlockArg::Value(next)]);
                    self.l.b.switch_to_block(after);
                    let n = self.l.b.block_params(after)[0];
                    let more = self.l.b.ins().icmp(IntCC::SignedLessThan, n, b64);
                    self.l.b.ins().brif(more, outer, &[BlockArg::Value(n)], exit, &[]);
                    self.l.b.switch_to_block(exit);
                    return Ok(None);
                }
                self.iteration(*var, j, var_range, body, None)?;
                let b = &mut self.l.b;
                let next = b.ins().iadd_imm_s(j, 1);
                let in_chunk = b.ins().icmp(IntCC::SignedLessThan, next, chunk_end);
                let after = b.create_block();
                b.ins().brif(in_chunk, inner, &[BlockArg::Value(next)], after, &[]);
                b.switch_to_block(after);
                let more = b.ins().icmp(IntCC::SignedLessThan, next, b64);
                b.ins().brif(more, outer, &[BlockArg::Value(next)], exit, &[]);
                b.switch_to_block(exit);
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

    /// One iteration of a counted loop's body, the loop variable `var` being `j` (an i64 counter),
    /// copy `copy` of an unrolled trip.
    fn iteration(
        &mut self,
        var: Local,
        j: Value,
        range: Option<(i64, i64)>,
        body: &Expr,
        copy: Option<i64>,
    ) -> Result<(), String> {
        let v = self.l.b.ins().ireduce(types::I32, j);
        if let Some(r) = range {
            self.ranges.insert(v, r);
        }
        if let Some(k) = copy {
            self.copies.insert(v, k);
        }
        self.define(var, v, DType::I32)?;
        self.expr(body)?;
        Ok(())
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
        // An atomic load: a plain one may be merged with an earlier read of the same address
        // (the region stores nothing), and a nested loop would then never see the flag change.
        let flag = self.l.b.ins().atomic_load(types::I8, MemFlagsData::new().with_notrap(), p);
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
            // Never compiled (`elem_ok`); a constant is its f32 value.
            DType::Bf16 | DType::F16 => {
                return (self.l.b.ins().f32const(t.scalar_value_f64().unwrap_or(0.0) as f32), DType::F32)
            }
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

    /// `Tensor::try_cast` refuses a float with no `i32` value (NaN, an infinity, out of
    /// range): the region declines there and the interpreter reports the error with its span.
    /// The bounds are those of `kernels::tensor::f32_fits_i32` and `f64_fits_i32`; NaN fails
    /// every ordered comparison.
    fn decline_unless_fits_i32(&mut self, x: Value, from: DType) {
        let b = &mut self.l.b;
        let (lo, lo_cc, hi) = match from {
            DType::F32 => {
                (b.ins().f32const(-2147483648.0), FloatCC::GreaterThanOrEqual, b.ins().f32const(2147483648.0))
            }
            _ => (b.ins().f64const(-2147483649.0), FloatCC::GreaterThan, b.ins().f64const(2147483648.0)),
        };
        let above = b.ins().fcmp(lo_cc, x, lo);
        let below = b.ins().fcmp(FloatCC::LessThan, x, hi);
        let fits = b.ins().band(above, below);
        let bad = b.ins().bxor_imm_u(fits, 1);
        self.exit_if(bad, DECLINE);
    }

    fn prim(&mut self, p: Prim, to: Option<DType>, xs: &[(Value, DType)]) -> Result<(Value, DType), String> {
        let Some(op) = crate::fuse::elem_op(p) else { return bad(format!("`{}` is not elementwise", p.name())) };
        match op {
            ElemOp::Cast => {
                let to = to.unwrap_or(DType::F32);
                let (x, from) = xs[0];
                if to == DType::I32 && from.is_float() {
                    self.decline_unless_fits_i32(x, from);
                }
                Ok((self.cast(x, from, to), to))
            }
            ElemOp::Where => {
                if xs[0].1 != DType::Bool {
                    return bad("`where` needs a bool condition");
                }
                let d = wider(xs[1].1, xs[2].1);
                let a = self.cast(xs[1].0, xs[1].1, d);
                let b = self.cast(xs[2].0, xs[2].1, d);
                Ok((self.l.b.ins().select(xs[0].0, a, b), d))
            }
            ElemOp::Unary(UnaryOp::Not) => match xs[0].1 {
                DType::Bool => Ok((self.l.b.ins().bxor_imm_u(xs[0].0, 1), DType::Bool)),
                _ => bad("`not` needs a bool"),
            },
            ElemOp::Binary(b) => self.binary(b, xs[0], xs[1]),
            ElemOp::Unary(u) => self.unary(u, xs[0]),
        }
    }

    fn unary(&mut self, u: UnaryOp, (x, d): (Value, DType)) -> Result<(Value, DType), String> {
        let b = &mut self.l.b;
        match (d, u) {
            (DType::Bool, _) => bad(format!("`{}` of a bool", u.name())),
            (DType::I32, UnaryOp::Neg) => Ok((b.ins().ineg(x), DType::I32)),
            (DType::I32, UnaryOp::Abs) => {
                let n = b.ins().ineg(x);
                let neg = b.ins().icmp_imm_s(IntCC::SignedLessThan, x, 0);
                Ok((b.ins().select(neg, n, x), DType::I32))
            }
            (DType::I32, UnaryOp::Sign) => {
                let gt = b.ins().icmp_imm_s(IntCC::SignedGreaterThan, x, 0);
                let lt = b.ins().icmp_imm_s(IntCC::SignedLessThan, x, 0);
                let gt = b.ins().uextend(types::I32, gt);
                let lt = b.ins().uextend(types::I32, lt);
                Ok((b.ins().isub(gt, lt), DType::I32))
            }
            (DType::I32, UnaryOp::Relu) => bad("`relu` of an i32"),
            (DType::I32, _) => {
                // A weak integer under a float function is computed in f64.
                let f = self.cast(x, DType::I32, DType::F64);
                Ok((self.l.unary(Mode::Scalar, u, DType::F64, f), DType::F64))
            }
            (d, _) => Ok((self.l.unary(Mode::Scalar, u, d, x), d)),
        }
    }

    fn binary(&mut self, op: BinaryOp, a: (Value, DType), b: (Value, DType)) -> Result<(Value, DType), String> {
        let d = wider(a.1, b.1);
        let x = self.cast(a.0, a.1, d);
        let y = self.cast(b.0, b.1, d);
        let cmp = op.is_comparison();
        let logic = matches!(op, BinaryOp::And | BinaryOp::Or);
        let out = if cmp { DType::Bool } else { d };
        match d {
            DType::Bool if cmp || logic => Ok((self.l.binary(Mode::Scalar, op, d, x, y), out)),
            DType::Bool => bad(format!("`{}` of bools", op.name())),
            _ if logic => bad(format!("`{}` of numbers", op.name())),
            DType::I32 => {
                let v = self.int_binary(op, x, y)?;
                if let Some(r) = self.result_range(op, x, y) {
                    self.ranges.insert(v, r);
                }
                Ok((v, out))
            }
            d => Ok((self.l.binary(Mode::Scalar, op, d, x, y), out)),
        }
    }

    /// The value of `v` when an `iconst` instruction defines it (sign-extended from its type:
    /// Cranelift keeps the immediate of a narrow constant zero-extended).
    fn constant(&self, v: Value) -> Option<i64> {
        let dfg = &self.l.b.func.dfg;
        let inst = dfg.value_def(v).inst()?;
        match dfg.insts[inst] {
            InstructionData::UnaryImm { opcode: Opcode::Iconst, imm } => Some(match dfg.value_type(v) {
                types::I8 => imm.bits() as i8 as i64,
                types::I16 => imm.bits() as i16 as i64,
                types::I32 => imm.bits() as i32 as i64,
                _ => imm.bits(),
            }),
            _ => None,
        }
    }

    /// Known bounds of the `i32` value `v`.
    fn range(&self, v: Value) -> Option<(i64, i64)> {
        self.constant(v).map(|c| (c, c)).or_else(|| self.ranges.get(&v).copied())
    }

    /// The bounds of `p(x, y)` on `i32`s of known bounds, when no result can wrap.
    fn result_range(&self, p: BinaryOp, x: Value, y: Value) -> Option<(i64, i64)> {
        let ((a, b), (c, d)) = (self.range(x)?, self.range(y)?);
        let r = match p {
            BinaryOp::Add => (a + c, b + d),
            BinaryOp::Sub => (a - d, b - c),
            BinaryOp::Mul => {
                let ps = [a * c, a * d, b * c, b * d];
                (*ps.iter().min()?, *ps.iter().max()?)
            }
            BinaryOp::Rem if c == d && c >= 2 && a >= 0 => (0, b.min(c - 1)),
            BinaryOp::Div if c == d && c >= 2 && a >= 0 => (a / c, b / c),
            _ => return None, // any other primitive: bounds not tracked
        };
        let fits = |v: i64| (i64::from(i32::MIN)..=i64::from(i32::MAX)).contains(&v);
        (fits(r.0) && fits(r.1)).then_some(r)
    }

    /// `x / c` or `x % c` when `x` is the loop variable in copy `k` of an unrolled trip whose
    /// first value `x₀ ≥ 0` has quotient `q₀` and remainder `r₀` by `c`: with `t = r₀ + k % c`
    /// (below `2c`), the remainder is `t` or `t − c`, and the quotient `q₀ + k / c`, one more
    /// when `t ≥ c`. No multiplication: W6's `i % 7` went from five multiplications an iteration
    /// to three. `None` (emitting nothing) when `x` and `y` are not such a pair.
    fn stepped_division(&mut self, p: BinaryOp, x: Value, y: Value) -> Option<Value> {
        let c = self.constant(y)?;
        let k = *self.copies.get(&x)?;
        let &(_, q0, r0) = self.trip_divisions.iter().find(|d| d.0 == c)?;
        let b = &mut self.l.b;
        let (kq, kr) = (k / c, k % c);
        if kr == 0 {
            return Some(if p == BinaryOp::Div { b.ins().iadd_imm_s(q0, kq) } else { r0 });
        }
        let t = b.ins().iadd_imm_s(r0, kr);
        let wraps = b.ins().icmp_imm_s(IntCC::SignedGreaterThanOrEqual, t, c);
        Some(if p == BinaryOp::Div {
            let q = b.ins().iadd_imm_s(q0, kq);
            let carry = b.ins().uextend(types::I32, wraps);
            b.ins().iadd(q, carry)
        } else {
            let tc = b.ins().iadd_imm_s(t, -c);
            b.ins().select(wraps, tc, t)
        })
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
    fn int_binary(&mut self, p: BinaryOp, x: Value, y: Value) -> Result<Value, String> {
        use BinaryOp::*;
        if matches!(p, Div | Rem) {
            if let Some(v) = self.stepped_division(p, x, y) {
                return Ok(v);
            }
        }
        let compare = |s: &mut Self, c: IntCC| s.l.b.ins().icmp(c, x, y);
        Ok(match p {
            Eq => compare(self, IntCC::Equal),
            Ne => compare(self, IntCC::NotEqual),
            Lt => compare(self, IntCC::SignedLessThan),
            Le => compare(self, IntCC::SignedLessThanOrEqual),
            Gt => compare(self, IntCC::SignedGreaterThan),
            Ge => compare(self, IntCC::SignedGreaterThanOrEqual),
            Add => self.l.b.ins().iadd(x, y),
            Sub => self.l.b.ins().isub(x, y),
            Mul => self.l.b.ins().imul(x, y),
            Max => self.l.b.ins().smax(x, y),
            Min => self.l.b.ins().smin(x, y),
            Div | Rem if self.constant(y).is_some_and(|c| (2..=i64::from(i32::MAX)).contains(&c)) => {
                // A literal divisor d ≥ 2: no checks, and the quotient by a multiplication
                // (`magic_s32`), which is exact for every x.
                let d = self.constant(y).unwrap_or(2) as i32;
                let nonneg = self.range(x).is_some_and(|(lo, _)| lo >= 0);
                // A dividend known to be ≥ 0: one 64-bit multiplication and a shift.
                let fast =
                    self.range(x).filter(|&(lo, _)| lo >= 0).and_then(|(_, hi)| magic_nonneg(d as u32, hi as u32));
                if let Some((m, s)) = fast {
                    let b = &mut self.l.b;
                    let x64 = b.ins().uextend(types::I64, x);
                    let mc = b.ins().iconst(types::I64, m as i64);
                    let prod = b.ins().imul(x64, mc);
                    let q64 = b.ins().ushr_imm_u(prod, i64::from(s));
                    let q = b.ins().ireduce(types::I32, q64);
                    return Ok(if p == Div {
                        q
                    } else {
                        let qd = b.ins().imul(q, y);
                        b.ins().isub(x, qd)
                    });
                }
                let (m, shift) = magic_s32(d);
                let b = &mut self.l.b;
                let mc = b.ins().iconst(types::I32, i64::from(m));
                let mut q = b.ins().smulhi(x, mc);
                if m < 0 {
                    q = b.ins().iadd(q, x);
                }
                let q = b.ins().sshr_imm_u(q, i64::from(shift));
                // `+ (x < 0)` rounds toward zero; a dividend known to be ≥ 0 needs none, and
                // for it the floored quotient is the truncated one.
                if nonneg {
                    return Ok(if p == Div {
                        q
                    } else {
                        let qd = b.ins().imul(q, y);
                        b.ins().isub(x, qd)
                    });
                }
                let sign = b.ins().ushr_imm_u(x, 31);
                let q = b.ins().iadd(q, sign);
                let qd = b.ins().imul(q, y);
                let r = b.ins().isub(x, qd);
                floor_div_rem(b, p == Div, q, r, y)
            }
            Div | Rem => {
                let zero = self.l.b.ins().icmp_imm_s(IntCC::Equal, y, 0);
                self.exit_if(zero, DECLINE);
                // `wrapping_div`/`wrapping_rem`: dividing by -1 never traps.
                let b = &mut self.l.b;
                let m1 = b.ins().icmp_imm_s(IntCC::Equal, y, -1);
                let one = b.ins().iconst(types::I32, 1);
                let safe = b.ins().select(m1, one, y);
                let q = b.ins().sdiv(x, safe);
                let n = b.ins().ineg(x);
                let q = b.ins().select(m1, n, q);
                let r = b.ins().srem(x, safe);
                floor_div_rem(b, p == Div, q, r, y)
            }
            Pow => self.int_pow(x, y),
            And | Or | GeluGrad => return bad(format!("`{}` of i32 values", p.name())),
        })
    }
}

/// The floored quotient (`div`) or remainder from the truncated ones, as Python and NumPy
/// define integer `/` and `%` (`kernels::math::div_floor_i32`): when the remainder is nonzero
/// and its sign differs from the divisor's, the quotient drops by one and the remainder gains
/// the divisor.
fn floor_div_rem(b: &mut FunctionBuilder, div: bool, q: Value, r: Value, y: Value) -> Value {
    let nz = b.ins().icmp_imm_s(IntCC::NotEqual, r, 0);
    let x = b.ins().bxor(r, y);
    let opposite = b.ins().icmp_imm_s(IntCC::SignedLessThan, x, 0);
    let adjust = b.ins().band(nz, opposite);
    if div {
        let one = b.ins().iconst(types::I32, 1);
        let q1 = b.ins().isub(q, one);
        b.ins().select(adjust, q1, q)
    } else {
        let ry = b.ins().iadd(r, y);
        b.ins().select(adjust, ry, r)
    }
}

/// The multiplier and shift of division by `d ≥ 2` of every `x` in `0..=hi` (`hi < 2^31`):
/// `x / d == (x * m) >> s` in 64 bits. With `m = ⌈2^s / d⌉` and `e = m·d − 2^s`, the quotient is
/// exact when `hi · e < 2^s`; `m < 2^32` keeps `x · m` below `2^63`.
pub(crate) fn magic_nonneg(d: u32, hi: u32) -> Option<(u64, u32)> {
    if d < 2 || hi >= 1 << 31 {
        return None;
    }
    for s in 32..64u32 {
        let p = 1u128 << s;
        let m = p.div_ceil(u128::from(d));
        if m >= 1 << 32 {
            return None;
        }
        if u128::from(hi) * (m * u128::from(d) - p) < p {
            return Some((m as u64, s));
        }
    }
    None
}

/// The multiplier and shift of signed 32-bit division by `d ≥ 2` (Hacker's Delight, 10–1):
/// `x / d == ((mulhs(x, m) [+ x if m < 0]) >> shift) + (x < 0)` for every `x`.
pub(crate) fn magic_s32(d: i32) -> (i32, u32) {
    let two31: u32 = 0x8000_0000;
    let ad = d.unsigned_abs();
    let t = two31 + ((d as u32) >> 31);
    let anc = t - 1 - t % ad;
    let mut p = 31u32;
    let (mut q1, mut r1) = (two31 / anc, two31 - (two31 / anc) * anc);
    let (mut q2, mut r2) = (two31 / ad, two31 - (two31 / ad) * ad);
    loop {
        p += 1;
        q1 = q1.wrapping_mul(2);
        r1 = r1.wrapping_mul(2);
        if r1 >= anc {
            q1 = q1.wrapping_add(1);
            r1 = r1.wrapping_sub(anc);
        }
        q2 = q2.wrapping_mul(2);
        r2 = r2.wrapping_mul(2);
        if r2 >= ad {
            q2 = q2.wrapping_add(1);
            r2 = r2.wrapping_sub(ad);
        }
        let delta = ad - r2;
        if !(q1 < delta || (q1 == delta && r1 == 0)) {
            break;
        }
    }
    (q2.wrapping_add(1) as i32, p - 32)
}

#[cfg(test)]
mod tests {
    use super::{magic_nonneg, magic_s32};

    #[test]
    fn nonnegative_magic_division_is_exact_up_to_its_bound() {
        let mut r = 0x9e37_79b9_7f4a_7c15u64;
        for d in (2..=300u32).chain([641, 1000, 65_535, 65_536, 1 << 20, 1_000_000_007, i32::MAX as u32]) {
            for hi in [1u32, 36, 1000, 9_999_999, i32::MAX as u32] {
                let Some((m, s)) = magic_nonneg(d, hi) else { panic!("no multiplier for {d} up to {hi}") };
                let mut xs = vec![0, hi, hi / 2, hi.saturating_sub(1)];
                for _ in 0..2_000 {
                    r ^= r << 13;
                    r ^= r >> 7;
                    r ^= r << 17;
                    xs.push((r % (u64::from(hi) + 1)) as u32);
                }
                // Around multiples of d, where rounding errors show first.
                let k = hi / d;
                xs.extend([k * d, (k * d).saturating_sub(1), k.saturating_sub(1) * d]);
                for x in xs {
                    assert_eq!((u64::from(x) * m) >> s, u64::from(x / d), "{x} / {d} (hi {hi})");
                }
            }
        }
    }

    /// The instruction sequence `int_binary` emits, in Rust.
    fn div(x: i32, d: i32) -> i32 {
        let (m, s) = magic_s32(d);
        let mut q = ((i64::from(x) * i64::from(m)) >> 32) as i32;
        if m < 0 {
            q = q.wrapping_add(x);
        }
        (q >> s) + ((x as u32) >> 31) as i32
    }

    #[test]
    fn magic_division_matches_truncating_division() {
        let mut xs: Vec<i32> = vec![0, 1, -1, 2, -2, 6, 7, -7, 8, i32::MAX, i32::MIN, i32::MAX - 1, i32::MIN + 1];
        let mut r = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..20_000 {
            r ^= r << 13;
            r ^= r >> 7;
            r ^= r << 17;
            xs.push(r as i32);
        }
        let mut ds: Vec<i32> = (2..=300).collect();
        ds.extend([641, 1000, 65_535, 65_536, 1 << 20, 1_000_000_007, i32::MAX - 1, i32::MAX]);
        for &d in &ds {
            for &x in &xs {
                assert_eq!(div(x, d), x.wrapping_div(d), "{x} / {d}");
            }
        }
    }
}
