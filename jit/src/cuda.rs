//! CUDA C for a fused tree: the second code generator over the same fused-tree analysis.
//!
//! [`source`] turns a typed [`Tree`] (the one `fuse` found and typed for the Cranelift loop)
//! into one `extern "C" __global__` kernel that computes the tree for every element of the
//! broadcast result. Each thread walks a grid-stride loop over the result's elements and finds
//! each input's element from the result index and the input's strides (0 along a broadcast
//! dim), passed in [`Index`]-shaped kernel parameters. The operations are written as the CPU
//! kernels compute them (`maximum` keeps a NaN first operand, `%` takes the divisor's sign,
//! `sigmoid` and `gelu` in the kernels' order of operations), and the kernel must be compiled
//! with `--fmad=false`, so that no product and sum are contracted into one rounding the CPU
//! does not make. `kernels::cuda::compile_cubin` compiles it with NVRTC.

use crate::fuse::{ElemOp, Node, Tree, Typed};
use crate::lower::round;
use kernels::ops::{BinaryOp, UnaryOp};
use kernels::DType;
use std::fmt::Write as _;

/// The most dims a kernel's index arithmetic handles; a larger rank is declined.
pub const MAX_RANK: usize = 8;

/// The NVRTC options every generated kernel is compiled with (besides the architecture).
pub const OPTIONS: &[&str] = kernels::cuda::NVRTC_OPTIONS;

/// The C type holding an element of `d`, or `None` for types fused trees never hold.
fn c_type(d: DType) -> Option<&'static str> {
    match d {
        DType::F32 => Some("float"),
        DType::F64 => Some("double"),
        DType::Bool => Some("bool"),
        DType::I32 | DType::Bf16 | DType::F16 => None,
    }
}

/// A literal of type `d` written exactly (float bits, not decimal text).
fn literal(d: DType, v: f64) -> String {
    match d {
        DType::F32 => format!("__int_as_float(0x{:08x})", (v as f32).to_bits()),
        DType::F64 => format!("__longlong_as_double(0x{:016x}ll)", v.to_bits()),
        _ => (if v != 0.0 { "true" } else { "false" }).to_string(),
    }
}

/// A math function's name for `d`: `expf` for f32, `exp` for f64.
fn f(name: &str, d: DType) -> String {
    if d == DType::F32 {
        format!("{name}f")
    } else {
        name.to_string()
    }
}

/// The C element types of the kernel's inputs (`in0`, `in1`, …) and of its output.
pub fn param_types(tree: &Tree, typed: &Typed) -> Option<(Vec<&'static str>, &'static str)> {
    let out_t = c_type(*typed.dtype.last()?)?;
    let mut input_t = vec!["float"; tree.n_inputs];
    for (i, node) in tree.nodes.iter().enumerate() {
        if let Node::Leaf(k) = node {
            *input_t.get_mut(*k)? = c_type(typed.dtype[i])?;
        }
    }
    Some((input_t, out_t))
}

/// The CUDA C source of kernel `name` computing `tree` typed as `typed`, or `None` when the
/// tree holds an element type the generator does not write (the interpreter then runs it).
///
/// Parameters: `in0 … in{n-1}` (device pointers, each of its input's element type), `out`, the
/// element count `n`, the result's rank and dims, and each input's strides in elements
/// (`st{k}`), each dim array `MAX_RANK` long and packed in a struct passed by value.
pub fn source(tree: &Tree, typed: &Typed, name: &str) -> Option<String> {
    let root = tree.nodes.len().checked_sub(1)?;
    let (input_t, out_t) = param_types(tree, typed)?;
    let mut s = String::new();
    let _ = writeln!(s, "struct {name}_index {{ long long n; int rank; long long dims[{MAX_RANK}];");
    for k in 0..tree.n_inputs {
        let _ = writeln!(s, "    long long st{k}[{MAX_RANK}];");
    }
    s.push_str("};\n");
    let _ = write!(s, "extern \"C\" __global__ void {name}(");
    for (k, t) in input_t.iter().enumerate() {
        let _ = write!(s, "const {t}* __restrict__ in{k}, ");
    }
    let _ = writeln!(s, "{out_t}* __restrict__ out, const {name}_index ix) {{");
    s.push_str("    long long step = (long long)gridDim.x * blockDim.x;\n");
    s.push_str("    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < ix.n; i += step) {\n");
    for k in 0..tree.n_inputs {
        let _ = writeln!(s, "        long long o{k} = 0;");
    }
    s.push_str("        long long r = i;\n");
    s.push_str("        for (int d = ix.rank - 1; d >= 0; --d) {\n");
    s.push_str("            long long c = r % ix.dims[d];\n            r /= ix.dims[d];\n");
    for k in 0..tree.n_inputs {
        let _ = writeln!(s, "            o{k} += c * ix.st{k}[d];");
    }
    s.push_str("        }\n");
    for (i, node) in tree.nodes.iter().enumerate() {
        let d = typed.dtype[i];
        let t = c_type(d)?;
        let value = match node {
            Node::Leaf(k) => format!("in{k}[o{k}]"),
            Node::Const(c) => literal(d, c.scalar_value_f64()?),
            Node::Op { op: o_p, args, .. } => {
                let o = typed.operand[i];
                // Operands converted to the operation's operand type, as the interpreter does.
                let arg = |j: usize| -> Option<String> {
                    let a = *args.get(j)?;
                    Some(if typed.dtype[a] == o || *o_p == ElemOp::Where && j == 0 {
                        format!("v{a}")
                    } else {
                        format!("(({})v{a})", c_type(o)?)
                    })
                };
                op(*o_p, d, o, &arg)?
            }
        };
        let _ = writeln!(s, "        const {t} v{i} = {value};");
    }
    let _ = writeln!(s, "        out[i] = v{root};\n    }}\n}}");
    Some(s)
}

/// One operation as a C expression; `d` is its result type, `o` its operands' type.
fn op(e: ElemOp, d: DType, o: DType, arg: &dyn Fn(usize) -> Option<String>) -> Option<String> {
    use BinaryOp as B;
    use UnaryOp as U;
    let zero = literal(o, 0.0);
    let one = literal(o, 1.0);
    let bin = |sym: &str| -> Option<String> { Some(format!("({} {sym} {})", arg(0)?, arg(1)?)) };
    let call1 = |name: &str| -> Option<String> { Some(format!("{}({})", f(name, o), arg(0)?)) };
    Some(match e {
        ElemOp::Binary(B::Add) => bin("+")?,
        ElemOp::Binary(B::Sub) => bin("-")?,
        ElemOp::Binary(B::Mul) => bin("*")?,
        ElemOp::Binary(B::Div) => bin("/")?,
        ElemOp::Binary(B::Eq) => bin("==")?,
        ElemOp::Binary(B::Ne) => bin("!=")?,
        ElemOp::Binary(B::Lt) => bin("<")?,
        ElemOp::Binary(B::Le) => bin("<=")?,
        ElemOp::Binary(B::Gt) => bin(">")?,
        ElemOp::Binary(B::Ge) => bin(">=")?,
        ElemOp::Binary(B::And) => bin("&&")?,
        ElemOp::Binary(B::Or) => bin("||")?,
        ElemOp::Unary(U::Not) => format!("(!{})", arg(0)?),
        ElemOp::Unary(U::Neg) => format!("(-{})", arg(0)?),
        ElemOp::Unary(U::Abs) => call1("fabs")?,
        ElemOp::Unary(U::Sqrt) => call1("sqrt")?,
        ElemOp::Unary(U::Floor) => call1("floor")?,
        ElemOp::Unary(U::Exp) => call1("exp")?,
        ElemOp::Unary(U::Log) => call1("log")?,
        ElemOp::Unary(U::Tanh) => call1("tanh")?,
        ElemOp::Unary(U::Erf) => call1("erf")?,
        ElemOp::Unary(U::Sin) => call1("sin")?,
        ElemOp::Unary(U::Cos) => call1("cos")?,
        ElemOp::Unary(U::Rsqrt) => format!("({one} / {}({}))", f("sqrt", o), arg(0)?),
        ElemOp::Binary(B::Pow) => format!("{}({}, {})", f("pow", o), arg(0)?, arg(1)?),
        // Python's remainder: the divisor's sign, a zero result signed like the divisor.
        ElemOp::Binary(B::Rem) => {
            let (a, b) = (arg(0)?, arg(1)?);
            let r = format!("{}({a}, {b})", f("fmod", o));
            format!(
                "([&] {{ const auto r = {r}; return r == {zero} ? {}({zero}, {b}) : ((r < {zero}) != ({b} < {zero}) ? r + {b} : r); }}())",
                f("copysign", o)
            )
        }
        // `a` when it is NaN or wins the comparison, else `b` (the kernels' `max_p`/`min_p`).
        ElemOp::Binary(B::Max | B::Min) => {
            let (a, b) = (arg(0)?, arg(1)?);
            let cmp = if e == ElemOp::Binary(B::Max) { ">=" } else { "<=" };
            format!("(({a} != {a} || {a} {cmp} {b}) ? {a} : {b})")
        }
        // g (s + 2x s (1 - s) du), s = 1 / (1 + exp(-2u)), in the kernel's order.
        ElemOp::Binary(B::GeluGrad) => {
            let (a, g) = (arg(0)?, arg(1)?);
            let c = literal(o, round(o, (2.0 / std::f64::consts::PI).sqrt()));
            let k = literal(o, round(o, 0.044715));
            let k3 = literal(o, round(o, 0.134145));
            let exp = f("exp", o);
            format!(
                "([&] {{ const auto x = {a}; const auto u = {c} * (x + {k} * x * x * x); const auto s = {one} / ({one} + {exp}(-(u + u))); const auto du = {c} * ({one} + {k3} * x * x); return {g} * (s + (x + x) * (s * ({one} - s)) * du); }}())"
            )
        }
        ElemOp::Unary(U::Relu) => {
            let a = arg(0)?;
            format!("((!({a} <= {zero})) ? {a} : {zero})")
        }
        ElemOp::Unary(U::Sign) => {
            let a = arg(0)?;
            format!("({a} > {zero} ? {one} : ({a} < {zero} ? {} : {a}))", literal(o, -1.0))
        }
        // a >= 0: 1 / (1 + exp(-a)); otherwise (NaN too) exp(a) / (1 + exp(a)).
        ElemOp::Unary(U::Sigmoid) => {
            let a = arg(0)?;
            let exp = f("exp", o);
            format!(
                "([&] {{ const bool ge = {a} >= {zero}; const auto e = {exp}(ge ? -{a} : {a}); const auto den = {one} + e; return ge ? {one} / den : e / den; }}())"
            )
        }
        // a / (1 + exp(-(u + u))) with u = c (a + k a³), in the kernel's order.
        ElemOp::Unary(U::Gelu) => {
            let a = arg(0)?;
            let c = literal(o, round(o, (2.0 / std::f64::consts::PI).sqrt()));
            let k = literal(o, round(o, 0.044715));
            let exp = f("exp", o);
            format!(
                "([&] {{ const auto x = {a}; const auto u = {c} * (x + {k} * x * x * x); return x / ({one} + {exp}(-(u + u))); }}())"
            )
        }
        ElemOp::Where => format!("({} ? {} : {})", arg(0)?, arg(1)?, arg(2)?),
        ElemOp::Cast => {
            let a = arg(0)?;
            match (o, d) {
                (_, DType::Bool) => format!("({a} != {zero})"),
                (DType::Bool, _) => format!("({a} ? {} : {})", literal(d, 1.0), literal(d, 0.0)),
                _ => format!("(({}){a})", c_type(d)?),
            }
        }
        ElemOp::Unary(U::Square) => {
            let a = arg(0)?;
            format!("({a} * {a})")
        }
    })
}
