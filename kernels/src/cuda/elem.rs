//! CUDA C for elementwise operations, written once for both users: the JIT's fused trees
//! (`jit::cuda` writes one kernel per tree) and the CUDA device's single-operation kernels
//! ([`op_kernel`], one per operation and element types, compiled on first use).
//!
//! Every kernel has the same form ([`kernel`]): a grid-stride loop over the result's elements
//! that finds each input's element from the result index and the input's strides in elements
//! (0 along a broadcast dim, any order for a view), passed by value in an [`Index`]. The
//! operations are written as the CPU kernels compute them (`maximum` keeps a NaN first operand,
//! `%` takes the divisor's sign, `sigmoid` and `gelu` in the kernels' order of operations), and
//! kernels are compiled with `--fmad=false` ([`super::NVRTC_OPTIONS`]), so that no product and
//! sum are contracted into one rounding the CPU does not make.

use std::fmt::Write as _;

use crate::cpu::elementwise::{BinaryOp, ElemOp, UnaryOp};
use crate::cpu::fused::{Fused, FusedNode};
use crate::tensor::DType;

/// The most dims a kernel's index arithmetic handles; a larger rank is declined.
pub const MAX_RANK: usize = 8;

/// The most inputs the CUDA device gives a generated kernel. It passes every kernel an
/// `Index<MAX_INPUTS>`: a kernel of fewer inputs declares a prefix of that struct, and the
/// driver copies as many bytes as the kernel declares.
pub const MAX_INPUTS: usize = 16;

/// The C type holding an element of `d`, or `None` for types these kernels never hold.
pub fn c_type(d: DType) -> Option<&'static str> {
    match d {
        DType::F32 => Some("float"),
        DType::F64 => Some("double"),
        DType::Bool => Some("bool"),
        DType::I32 => Some("int"),
        DType::Bf16 | DType::F16 => None,
    }
}

/// A literal of type `d` written exactly (float bits, not decimal text; an f64 value is
/// rounded to f32 first for an f32 literal, as the CPU kernels round their constants).
pub fn literal(d: DType, v: f64) -> String {
    match d {
        DType::F32 => format!("__int_as_float(0x{:08x})", (v as f32).to_bits()),
        DType::F64 => format!("__longlong_as_double(0x{:016x}ll)", v.to_bits()),
        DType::I32 => format!("{}", v as i32),
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

/// The index a kernel takes by value: the result's element count, rank and dims, and each
/// input's strides in elements over the result's dims. Laid out as the C struct [`kernel`]
/// declares (`long long n; int rank; long long dims[8]; long long st0[8]; …`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Index<const K: usize> {
    pub n: i64,
    pub rank: i32,
    pub dims: [i64; MAX_RANK],
    pub strides: [[i64; MAX_RANK]; K],
}

impl<const K: usize> Index<K> {
    /// The index of a result of shape `out` computed from inputs of the given shapes and
    /// strides (a row-major input's strides are `row_major(shape)`); a dim of size 1 that the
    /// result broadcasts reads stride 0. `None` past [`MAX_RANK`] dims, or when an input does
    /// not broadcast to `out`.
    pub fn new(out: &[usize], inputs: [(&[usize], &[usize]); K]) -> Option<Index<K>> {
        Index::from_parts(out, &inputs)
    }

    /// As [`Index::new`], from at most `K` inputs (the strides of the rest are zero).
    pub fn from_parts(out: &[usize], inputs: &[(&[usize], &[usize])]) -> Option<Index<K>> {
        if out.len() > MAX_RANK || inputs.len() > K {
            return None;
        }
        let mut dims = [1i64; MAX_RANK];
        for (d, &n) in out.iter().enumerate() {
            dims[d] = n as i64;
        }
        let mut strides = [[0i64; MAX_RANK]; K];
        for (k, (shape, st)) in inputs.iter().enumerate() {
            let off = out.len().checked_sub(shape.len())?;
            if st.len() != shape.len() {
                return None;
            }
            for d in 0..shape.len() {
                match (shape[d], out[off + d]) {
                    (a, b) if a == b && a != 1 => strides[k][off + d] = st[d] as i64,
                    (1, _) => {}
                    _ => return None,
                }
            }
        }
        Some(Index { n: out.iter().product::<usize>() as i64, rank: out.len() as i32, dims, strides })
    }
}

/// A kernel named `name` with inputs `in0 …` of the C types `inputs`, output `out` of type
/// `out_t`, and parameter `ix` (its `{name}_index` struct); `body` holds the statements that
/// compute one element from `in{k}[o{k}]`, and `result` the value stored.
pub fn kernel(name: &str, inputs: &[&str], out_t: &str, body: &str, result: &str) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "struct {name}_index {{ long long n; int rank; long long dims[{MAX_RANK}];");
    for k in 0..inputs.len() {
        let _ = writeln!(s, "    long long st{k}[{MAX_RANK}];");
    }
    s.push_str("};\n");
    let _ = write!(s, "extern \"C\" __global__ void {name}(");
    for (k, t) in inputs.iter().enumerate() {
        let _ = write!(s, "const {t}* __restrict__ in{k}, ");
    }
    let _ = writeln!(s, "{out_t}* __restrict__ out, const {name}_index ix) {{");
    s.push_str("    long long step = (long long)gridDim.x * blockDim.x;\n");
    s.push_str("    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < ix.n; i += step) {\n");
    for k in 0..inputs.len() {
        let _ = writeln!(s, "        long long o{k} = 0;");
    }
    s.push_str("        long long r = i;\n");
    s.push_str("        for (int d = ix.rank - 1; d >= 0; --d) {\n");
    s.push_str("            long long c = r % ix.dims[d];\n            r /= ix.dims[d];\n");
    for k in 0..inputs.len() {
        let _ = writeln!(s, "            o{k} += c * ix.st{k}[d];");
    }
    s.push_str("        }\n");
    s.push_str(body);
    let _ = writeln!(s, "        out[i] = {result};\n    }}\n}}");
    s
}

/// The CUDA C of kernel `name` computing `tree` for every element of the broadcast result (the
/// JIT's fused trees, and the device's one-operation kernels), or `None` when the tree holds an
/// element type these kernels do not. Each operation's operands are converted to its operand
/// type first, as the interpreter does. Storage-only values (bf16, f16) are computed in f32: read
/// widened, and each operation's result rounded to its type, as the CPU rounds it.
pub fn fused_kernel(tree: &Fused, name: &str) -> Option<String> {
    let root = tree.nodes.len().checked_sub(1)?;
    let input_t: Vec<&str> =
        (0..tree.inputs).map(|k| tree.input_dtype(k).map_or(Some("float"), storage_type)).collect::<Option<_>>()?;
    // The f32 of a storage-only value `v` of type `d` (`v` already rounded: widened; else rounded first).
    let half = |d: DType, v: String, rounded: bool| match (d, rounded) {
        (DType::Bf16, true) => format!("msl_from_bf16({v})"),
        (DType::F16, true) => format!("msl_from_f16({v})"),
        (DType::Bf16, false) => format!("msl_from_bf16(msl_to_bf16({v}))"),
        (DType::F16, false) => format!("msl_from_f16(msl_to_f16({v}))"),
        _ => v,
    };
    let mut body = String::new();
    for (i, node) in tree.nodes.iter().enumerate() {
        let d = *tree.dtype.get(i)?;
        let t = c_type(computed(d))?;
        let value = match node {
            FusedNode::Input(k) => half(d, format!("in{k}[o{k}]"), true),
            FusedNode::Const(c) => half(d, literal(computed(d), *c), false),
            FusedNode::Op(e, args) => {
                let o = *tree.operand.get(i)?;
                let arg = |j: usize| -> Option<String> {
                    let a = *args.get(j).filter(|&&a| a < i)?;
                    Some(if *tree.dtype.get(a)? == o || *e == ElemOp::Where && j == 0 {
                        format!("v{a}")
                    } else if o.is_half() {
                        // A conversion into a storage-only type inside a tree: not written.
                        return None;
                    } else {
                        format!("(({})v{a})", c_type(o)?)
                    })
                };
                half(d, expr(*e, computed(d), computed(o), &arg)?, false)
            }
        };
        let _ = writeln!(body, "        const {t} v{i} = {value};");
    }
    let out = *tree.dtype.get(root)?;
    let result = match out {
        DType::Bf16 => format!("msl_to_bf16(v{root})"),
        DType::F16 => format!("msl_to_f16(v{root})"),
        _ => format!("v{root}"),
    };
    let mut src = String::new();
    if tree.dtype.iter().any(|d| d.is_half()) {
        src.push_str(HALF_SOURCE);
    }
    src.push_str(&kernel(name, &input_t, storage_type(out)?, &body, &result));
    Some(src)
}

/// Whether the device takes the JIT's fused tree `tree`: at most [`MAX_INPUTS`] inputs, and only
/// f32, f64 and bool values (the JIT leaves storage-only values to the interpreter).
pub fn writes(tree: &Fused) -> bool {
    // No i32 values: integer arithmetic (division by zero, overflow) stays with the CPU's rules.
    let held = |d: &DType| matches!(d, DType::F32 | DType::F64 | DType::Bool);
    tree.inputs <= MAX_INPUTS && tree.dtype.iter().chain(&tree.operand).all(held)
}

/// The element type the CUDA device's kernel for `e` computes from inputs of types `inputs`
/// (`to`: a conversion's target), or `None` where it has no such kernel (the CPU's then runs):
/// the CPU kernels' typing, over f32, f64, bool and the storage-only bf16 and f16, which are
/// computed in f32 as on the CPU; i32 values are only selected (`where`) and converted from. A
/// conversion from f64 to bf16 or f16 stays on the CPU, which rounds it in one step.
pub fn result_type(e: ElemOp, inputs: &[DType], to: Option<DType>) -> Option<DType> {
    use DType::{Bf16, Bool, F16, F32, F64, I32};
    let float = |d: DType| matches!(d, F32 | F64 | Bf16 | F16);
    match (e, inputs) {
        (ElemOp::Unary(UnaryOp::Not), [Bool]) => Some(Bool),
        (ElemOp::Unary(UnaryOp::Not), _) => None,
        (ElemOp::Unary(_), &[a]) if float(a) => Some(a),
        (ElemOp::Unary(_), _) => None,
        (ElemOp::Binary(BinaryOp::And | BinaryOp::Or), [Bool, Bool]) => Some(Bool),
        (ElemOp::Binary(BinaryOp::And | BinaryOp::Or), _) => None,
        (ElemOp::Binary(b), &[x, y]) if x == y && float(x) => Some(if b.is_comparison() { Bool } else { x }),
        (ElemOp::Binary(_), _) => None,
        (ElemOp::Where, &[Bool, x, y]) if x == y && storage_type(x).is_some() => Some(x),
        (ElemOp::Where, _) => None,
        (ElemOp::Cast, &[F64]) if matches!(to, Some(Bf16 | F16)) => None,
        // To i32 from another type the CPU checks the range (NaN and overflow are errors).
        (ElemOp::Cast, &[a]) if to == Some(I32) && a != I32 => None,
        (ElemOp::Cast, &[a]) => to.filter(|&t| storage_type(a).is_some() && storage_type(t).is_some()),
        (ElemOp::Cast, _) => None,
    }
}

/// The name of the CUDA device's kernel for `e` on inputs of types `inputs`:
/// `msl_e_{op}_{types…}_{result}`.
pub fn op_kernel_name(e: ElemOp, inputs: &[DType], out: DType) -> String {
    let mut s = format!("msl_e_{}", e.name());
    for d in inputs.iter().chain([&out]) {
        let _ = write!(s, "_{d}");
    }
    s
}

/// The C type a buffer of `d` holds: [`c_type`]'s, and the bits of the storage-only types.
pub fn storage_type(d: DType) -> Option<&'static str> {
    match d {
        DType::Bf16 | DType::F16 => Some("unsigned short"),
        DType::F32 | DType::F64 | DType::Bool | DType::I32 => c_type(d),
    }
}

/// The type an element of `d` is computed in: f32 for the storage-only types.
fn computed(d: DType) -> DType {
    if d.is_half() {
        DType::F32
    } else {
        d
    }
}

/// Conversions between the storage-only types' bits and f32, as the `half` crate (the CPU's)
/// makes them: rounding to nearest even, NaNs kept quiet, f16's subnormals exact.
pub const HALF_SOURCE: &str = r#"
#ifndef MSL_HALF
#define MSL_HALF
__device__ inline float msl_from_bf16(unsigned short b) {
    const unsigned u = (unsigned)b << 16;
    return __int_as_float((int)((b & 0x7fffu) > 0x7f80u ? u | 0x400000u : u));
}
__device__ inline unsigned short msl_to_bf16(float f) {
    const unsigned x = (unsigned)__float_as_int(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((x >> 16) | 0x40u);
    const unsigned r = 0x8000u;
    return (unsigned short)((x & r) && (x & (3u * r - 1u)) ? (x >> 16) + 1u : x >> 16);
}
__device__ inline float msl_from_f16(unsigned short h) {
    const unsigned sign = (unsigned)(h & 0x8000u) << 16, exp = h & 0x7c00u, man = h & 0x3ffu;
    if ((h & 0x7fffu) == 0) return __int_as_float((int)sign);
    if (exp == 0x7c00u) return __int_as_float((int)(sign | 0x7f800000u | (man ? 0x400000u | (man << 13) : 0u)));
    if (exp == 0) {
        int e = 0;
        unsigned m = man;
        while (!(m & 0x400u)) { m <<= 1; ++e; }
        return __int_as_float((int)(sign | ((unsigned)(127 - 15 - e + 1) << 23) | ((m & 0x3ffu) << 13)));
    }
    return __int_as_float((int)(sign | ((((exp >> 10) + 127u - 15u)) << 23) | (man << 13)));
}
__device__ inline unsigned short msl_to_f16(float f) {
    const unsigned x = (unsigned)__float_as_int(f);
    const unsigned sign = (x >> 16) & 0x8000u, exp = (x >> 23) & 0xffu, man = x & 0x7fffffu;
    if (exp == 0xffu) return (unsigned short)(sign | 0x7c00u | (man ? 0x200u | (man >> 13) : 0u));
    const int e = (int)exp - 127 + 15;
    if (e >= 0x1f) return (unsigned short)(sign | 0x7c00u);
    if (e <= 0) {
        if (14 - e > 24) return (unsigned short)sign;
        const unsigned m = man | 0x800000u, r = 1u << (13 - e);
        const unsigned h = m >> (14 - e);
        return (unsigned short)(sign | ((m & r) && (m & (3u * r - 1u)) ? h + 1u : h));
    }
    const unsigned h = sign | ((unsigned)e << 10) | (man >> 13), r = 0x1000u;
    return (unsigned short)((man & r) && (man & (3u * r - 1u)) ? h + 1u : h);
}
#endif
"#;

/// The CUDA C of the device's kernel for `e` on inputs of types `inputs`, named by
/// [`op_kernel_name`], or `None` where [`result_type`] has none: the tree of that one
/// operation, written by [`fused_kernel`].
pub fn op_kernel(e: ElemOp, inputs: &[DType], to: Option<DType>) -> Option<String> {
    let out = result_type(e, inputs, to)?;
    // The operands' type: the branches' for `where`, the first input's otherwise.
    let o = if e == ElemOp::Where { inputs[2] } else { inputs[0] };
    let n = inputs.len();
    let mut nodes: Vec<FusedNode> = (0..n).map(FusedNode::Input).collect();
    nodes.push(FusedNode::Op(e, (0..n).collect()));
    let tree = Fused {
        nodes,
        dtype: inputs.iter().copied().chain([out]).collect(),
        operand: inputs.iter().copied().chain([o]).collect(),
        inputs: n,
    };
    fused_kernel(&tree, &op_kernel_name(e, inputs, out))
}

/// One operation as a C expression; `d` is its result type, `o` its operands' type.
pub fn expr(e: ElemOp, d: DType, o: DType, arg: &dyn Fn(usize) -> Option<String>) -> Option<String> {
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
            let c = literal(o, (2.0 / std::f64::consts::PI).sqrt());
            let k = literal(o, 0.044715);
            let k3 = literal(o, 0.134145);
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
            let c = literal(o, (2.0 / std::f64::consts::PI).sqrt());
            let k = literal(o, 0.044715);
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
