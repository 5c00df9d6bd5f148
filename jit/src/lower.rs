//! Lowering of one elementwise operation to Cranelift instructions, on one element (scalar) or
//! one 128-bit vector of elements, shared by fused loops (`codegen`) and compiled host code
//! (`host`).
//!
//! Each operation mirrors the CPU kernel it replaces instruction for instruction, so results are
//! bit-identical: no fused multiply-add, `maximum` and `minimum` with the kernels' NaN rule, and
//! transcendental functions calling the same Rust methods as the kernels (`helpers`).

use crate::helpers;
use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::{
    types, Endianness, FuncRef, InstBuilder, MemFlagsData, StackSlot, StackSlotData, StackSlotKind, Type, Value,
};
use cranelift_frontend::FunctionBuilder;
use cranelift_jit::JITModule;
use cranelift_module::{FuncId, Module};
use kernels::ops::{BinaryOp, UnaryOp};
use kernels::DType;
use std::collections::HashMap;

pub(crate) fn float_type(d: DType) -> Type {
    if d == DType::F64 {
        types::F64
    } else {
        types::F32
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Scalar,
    Vector(DType),
}

impl Mode {
    pub(crate) fn lanes(self) -> i64 {
        match self {
            Mode::Scalar => 1,
            Mode::Vector(DType::F64) => 2,
            Mode::Vector(_) => 4,
        }
    }

    /// The Cranelift type of a value of element type `d`.
    pub(crate) fn ty(self, d: DType) -> Type {
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

/// The function being built, and the helpers it may call.
pub(crate) struct Lower<'a, 'f> {
    pub b: &'a mut FunctionBuilder<'f>,
    module: &'a mut JITModule,
    helpers: &'a HashMap<&'static str, FuncId>,
    /// The helpers this function calls, declared on first use.
    refs: HashMap<&'static str, FuncRef>,
    /// Two 16-byte stack slots for vector helper calls, made on first use.
    slots: Option<(StackSlot, StackSlot)>,
}

impl<'a, 'f> Lower<'a, 'f> {
    pub fn new(
        b: &'a mut FunctionBuilder<'f>,
        module: &'a mut JITModule,
        helpers: &'a HashMap<&'static str, FuncId>,
    ) -> Self {
        Lower { b, module, helpers, refs: HashMap::new(), slots: None }
    }
    /// A float constant; `x` is exactly representable in `d`.
    pub(crate) fn fconst(&mut self, mode: Mode, d: DType, x: f64) -> Value {
        let s = if d == DType::F64 { self.b.ins().f64const(x) } else { self.b.ins().f32const(x as f32) };
        match mode {
            Mode::Scalar => s,
            Mode::Vector(_) => self.b.ins().splat(mode.ty(d), s),
        }
    }

    pub(crate) fn bconst(&mut self, mode: Mode, v: bool) -> Value {
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
    pub(crate) fn select(&mut self, mode: Mode, c: Value, a: Value, b: Value) -> Value {
        match mode {
            Mode::Scalar => self.b.ins().select(c, a, b),
            Mode::Vector(_) => {
                let c = self.lanes_like(c, a);
                self.b.ins().bitselect(c, a, b)
            }
        }
    }

    /// A vector of lanes `v` where the lane mask `c` is set (clear, when `invert`), else all
    /// zero bits: `select(c, v, 0)` (`select(c, 0, v)`) in one instruction.
    pub(crate) fn mask(&mut self, c: Value, v: Value, invert: bool) -> Value {
        let c = self.lanes_like(c, v);
        if invert {
            self.b.ins().band_not(v, c)
        } else {
            self.b.ins().band(v, c)
        }
    }

    /// The lane mask `c` as a vector of `v`'s type (the same bits).
    fn lanes_like(&mut self, c: Value, v: Value) -> Value {
        let ty = self.b.func.dfg.value_type(v);
        if self.b.func.dfg.value_type(c) == ty {
            c
        } else {
            self.b.ins().bitcast(ty, MemFlagsData::new().with_endianness(Endianness::Little), c)
        }
    }

    pub(crate) fn not(&mut self, mode: Mode, c: Value) -> Value {
        match mode {
            Mode::Scalar => self.b.ins().bxor_imm_u(c, 1),
            Mode::Vector(_) => self.b.ins().bnot(c),
        }
    }

    /// The interpreter's element type conversions (`Tensor::cast`).
    pub(crate) fn convert(&mut self, mode: Mode, v: Value, from: DType, to: DType) -> Value {
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

    pub(crate) fn helper(&mut self, sym: &'static str) -> FuncRef {
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
    pub(crate) fn call(&mut self, mode: Mode, op: &str, d: DType, xs: &[Value]) -> Value {
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

    pub(crate) fn binary(&mut self, mode: Mode, op: BinaryOp, d: DType, a: Value, b: Value) -> Value {
        // Comparisons: bools unsigned (scalar bools are 0/1 and lane masks 0/-1, so unsigned
        // order puts false first in both), floats ordered.
        let compare = |s: &mut Self, int: IntCC, float: FloatCC| {
            if d == DType::Bool {
                s.b.ins().icmp(int, a, b)
            } else {
                s.b.ins().fcmp(float, a, b)
            }
        };
        match op {
            BinaryOp::And => self.b.ins().band(a, b),
            BinaryOp::Or => self.b.ins().bor(a, b),
            BinaryOp::Eq => compare(self, IntCC::Equal, FloatCC::Equal),
            BinaryOp::Ne => compare(self, IntCC::NotEqual, FloatCC::NotEqual),
            BinaryOp::Lt => compare(self, IntCC::UnsignedLessThan, FloatCC::LessThan),
            BinaryOp::Le => compare(self, IntCC::UnsignedLessThanOrEqual, FloatCC::LessThanOrEqual),
            BinaryOp::Gt => compare(self, IntCC::UnsignedGreaterThan, FloatCC::GreaterThan),
            BinaryOp::Ge => compare(self, IntCC::UnsignedGreaterThanOrEqual, FloatCC::GreaterThanOrEqual),
            BinaryOp::Add => self.b.ins().fadd(a, b),
            BinaryOp::Sub => self.b.ins().fsub(a, b),
            BinaryOp::Mul => self.b.ins().fmul(a, b),
            BinaryOp::Div => self.b.ins().fdiv(a, b),
            BinaryOp::Rem => self.call(mode, "rem", d, &[a, b]),
            BinaryOp::Pow => self.call(mode, "pow", d, &[a, b]),
            BinaryOp::Max | BinaryOp::Min => {
                // `Num::max_p`: `a` when `a` is NaN or wins the comparison, else `b`.
                let cc = if op == BinaryOp::Max { FloatCC::GreaterThanOrEqual } else { FloatCC::LessThanOrEqual };
                let nan = self.b.ins().fcmp(FloatCC::Unordered, a, a);
                let wins = self.b.ins().fcmp(cc, a, b);
                let m = self.b.ins().bor(nan, wins);
                self.select(mode, m, a, b)
            }
            BinaryOp::GeluGrad => self.gelu_grad(mode, d, a, b),
        }
    }

    /// `1 + exp(-(u + u))` with `u = c * (x + k * x * x * x)`, in the kernels' order: `gelu(x)`
    /// is `x` over it, and `gelu_grad`'s `s` is one over it.
    fn gelu_den(&mut self, mode: Mode, d: DType, x: Value) -> Value {
        let one = self.fconst(mode, d, 1.0);
        let c = self.fconst(mode, d, round(d, (2.0 / std::f64::consts::PI).sqrt()));
        let k = self.fconst(mode, d, round(d, 0.044715));
        let t = self.b.ins().fmul(k, x);
        let t = self.b.ins().fmul(t, x);
        let t = self.b.ins().fmul(t, x);
        let t = self.b.ins().fadd(x, t);
        let u = self.b.ins().fmul(c, t);
        let u2 = self.b.ins().fadd(u, u);
        let n = self.b.ins().fneg(u2);
        let e = self.exp(mode, d, n);
        self.b.ins().fadd(one, e)
    }

    /// `g · gelu'(x)` as `kernels`' `gelu_grad` computes it, operation for operation:
    /// `g * (s + (x + x) * (s * (1 - s)) * du)`, `s = 1 / (1 + exp(-(u + u)))`,
    /// `u = c * (x + k * x * x * x)`, `du = c * (1 + k3 * x * x)`.
    fn gelu_grad(&mut self, mode: Mode, d: DType, x: Value, g: Value) -> Value {
        let one = self.fconst(mode, d, 1.0);
        let c = self.fconst(mode, d, round(d, (2.0 / std::f64::consts::PI).sqrt()));
        let k3 = self.fconst(mode, d, round(d, 0.134145));
        let den = self.gelu_den(mode, d, x);
        let s = self.b.ins().fdiv(one, den);
        let q = self.b.ins().fmul(k3, x);
        let q = self.b.ins().fmul(q, x);
        let q = self.b.ins().fadd(one, q);
        let du = self.b.ins().fmul(c, q);
        let x2 = self.b.ins().fadd(x, x);
        let oms = self.b.ins().fsub(one, s);
        let ss = self.b.ins().fmul(s, oms);
        let m = self.b.ins().fmul(x2, ss);
        let m = self.b.ins().fmul(m, du);
        let sum = self.b.ins().fadd(s, m);
        self.b.ins().fmul(g, sum)
    }

    /// The f32 polynomial with coefficients `cs` (highest power first) at `x`, as `kernels::math`
    /// evaluates it: `p = p * x + c`, a multiplication then an addition (no fused multiply-add).
    fn horner(&mut self, mode: Mode, cs: &[f32], x: Value) -> Value {
        let mut p = self.fconst(mode, DType::F32, f64::from(cs[0]));
        for c in &cs[1..] {
            let c = self.fconst(mode, DType::F32, f64::from(*c));
            let m = self.b.ins().fmul(p, x);
            p = self.b.ins().fadd(m, c);
        }
        p
    }

    /// `exp`: in f32 msl's own `kernels::math::exp_f32`, inline and vectorised, operation for
    /// operation; in f64 the library's, through a helper.
    fn exp(&mut self, mode: Mode, d: DType, x: Value) -> Value {
        use kernels::math::{EXP_MAX, EXP_MIN, EXP_P, LN2_HI, LN2_LO, LOG2E, ROUNDER};
        if d != DType::F32 {
            return self.call(mode, "exp", d, &[x]);
        }
        let f = |s: &mut Self, v: f32| s.fconst(mode, d, f64::from(v));
        let little = MemFlagsData::new().with_endianness(Endianness::Little);
        let ity = if mode == Mode::Scalar { types::I32 } else { types::I32X4 };
        let int = |s: &mut Self, v: i64| {
            let c = s.b.ins().iconst(types::I32, v);
            if mode == Mode::Scalar {
                c
            } else {
                s.b.ins().splat(ity, c)
            }
        };
        let log2e = f(self, LOG2E);
        let rounder = f(self, ROUNDER);
        let t = self.b.ins().fmul(x, log2e);
        let t = self.b.ins().fadd(t, rounder);
        let n = self.b.ins().fsub(t, rounder);
        let hi = f(self, LN2_HI);
        let lo = f(self, LN2_LO);
        let m = self.b.ins().fmul(n, hi);
        let r = self.b.ins().fsub(x, m);
        let m = self.b.ins().fmul(n, lo);
        let r = self.b.ins().fsub(r, m);
        let z = self.b.ins().fmul(r, r);
        let p = self.horner(mode, &EXP_P, r);
        let y = self.b.ins().fmul(p, z);
        let y = self.b.ins().fadd(y, r);
        let one = f(self, 1.0);
        let y = self.b.ins().fadd(y, one);
        // n from t's bits, then 2^n as two factors built from their exponent bits.
        let tb = self.b.ins().bitcast(ity, little, t);
        let rb = int(self, i64::from(ROUNDER.to_bits() as i32));
        let ni = self.b.ins().isub(tb, rb);
        let n1 = self.b.ins().sshr_imm_u(ni, 1);
        let n2 = self.b.ins().isub(ni, n1);
        let bias = int(self, 127);
        let mut scaled = y;
        for k in [n1, n2] {
            let e = self.b.ins().iadd(k, bias);
            let e = self.b.ins().ishl_imm_u(e, 23);
            let s = self.b.ins().bitcast(mode.ty(d), little, e);
            scaled = self.b.ins().fmul(scaled, s);
        }
        let big = f(self, EXP_MAX);
        let small = f(self, EXP_MIN);
        let inf = f(self, f32::INFINITY);
        let zero = f(self, 0.0);
        let over = self.b.ins().fcmp(FloatCC::GreaterThan, x, big);
        let under = self.b.ins().fcmp(FloatCC::LessThan, x, small);
        let v = self.select(mode, under, zero, scaled);
        self.select(mode, over, inf, v)
    }

    /// `tanh`: in f32 msl's own `kernels::math::tanh_f32`, inline and vectorised, operation for
    /// operation; in f64 the library's, through a helper.
    fn tanh(&mut self, mode: Mode, d: DType, a: Value) -> Value {
        use kernels::math::{TANH_CLAMP, TANH_P, TANH_Q, TANH_TINY};
        if d != DType::F32 {
            return self.call(mode, "tanh", d, &[a]);
        }
        let hi = self.fconst(mode, d, f64::from(TANH_CLAMP));
        let lo = self.fconst(mode, d, f64::from(-TANH_CLAMP));
        let gt = self.b.ins().fcmp(FloatCC::GreaterThan, a, hi);
        let lt = self.b.ins().fcmp(FloatCC::LessThan, a, lo);
        let x = self.select(mode, lt, lo, a);
        let x = self.select(mode, gt, hi, x);
        let x2 = self.b.ins().fmul(x, x);
        let p = self.horner(mode, &TANH_P, x2);
        let p = self.b.ins().fmul(p, x);
        let q = self.horner(mode, &TANH_Q, x2);
        let r = self.b.ins().fdiv(p, q);
        let tiny = self.fconst(mode, d, f64::from(TANH_TINY));
        let mag = self.b.ins().fabs(a);
        let small = self.b.ins().fcmp(FloatCC::LessThan, mag, tiny);
        self.select(mode, small, a, r)
    }

    pub(crate) fn unary(&mut self, mode: Mode, op: UnaryOp, d: DType, a: Value) -> Value {
        // Unused constants (a `not`'s, a `sqrt`'s) are dropped by Cranelift.
        let zero = self.fconst(mode, d, 0.0);
        let one = self.fconst(mode, d, 1.0);
        match op {
            UnaryOp::Not => self.not(mode, a),
            UnaryOp::Square => self.b.ins().fmul(a, a),
            UnaryOp::Neg => self.b.ins().fneg(a),
            UnaryOp::Abs => self.b.ins().fabs(a),
            UnaryOp::Sqrt => self.b.ins().sqrt(a),
            UnaryOp::Floor => self.b.ins().floor(a),
            UnaryOp::Rsqrt => {
                let s = self.b.ins().sqrt(a);
                self.b.ins().fdiv(one, s)
            }
            UnaryOp::Exp => self.exp(mode, d, a),
            UnaryOp::Log => self.call(mode, "log", d, &[a]),
            UnaryOp::Tanh => self.tanh(mode, d, a),
            UnaryOp::Erf => self.call(mode, "erf", d, &[a]),
            UnaryOp::Sin => self.call(mode, "sin", d, &[a]),
            UnaryOp::Cos => self.call(mode, "cos", d, &[a]),
            UnaryOp::Sigmoid => {
                // a >= 0: 1 / (1 + exp(-a)); otherwise (NaN too) exp(a) / (1 + exp(a)).
                let ge = self.b.ins().fcmp(FloatCC::GreaterThanOrEqual, a, zero);
                let neg = self.b.ins().fneg(a);
                let arg = self.select(mode, ge, neg, a);
                let e = self.exp(mode, d, arg);
                let den = self.b.ins().fadd(one, e);
                let pos = self.b.ins().fdiv(one, den);
                let negv = self.b.ins().fdiv(e, den);
                self.select(mode, ge, pos, negv)
            }
            UnaryOp::Relu => {
                // `a` when a > 0 or a is NaN, else +0.
                let m = self.b.ins().fcmp(FloatCC::UnorderedOrGreaterThan, a, zero);
                match mode {
                    Mode::Scalar => self.select(mode, m, a, zero),
                    Mode::Vector(_) => self.mask(m, a, false),
                }
            }
            UnaryOp::Gelu => {
                // a / (one + exp(-(u + u))), in the kernel's order.
                let den = self.gelu_den(mode, d, a);
                self.b.ins().fdiv(a, den)
            }
            UnaryOp::Sign => {
                let minus = self.fconst(mode, d, -1.0);
                let gt = self.b.ins().fcmp(FloatCC::GreaterThan, a, zero);
                let lt = self.b.ins().fcmp(FloatCC::LessThan, a, zero);
                let inner = self.select(mode, lt, minus, a);
                self.select(mode, gt, one, inner)
            }
        }
    }
}

/// `x` rounded to `d` (as `T::from_f64c` does in the kernels), returned as f64.
pub(crate) fn round(d: DType, x: f64) -> f64 {
    if d == DType::F32 {
        f64::from(x as f32)
    } else {
        x
    }
}
