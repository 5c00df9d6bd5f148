//! Elementwise kernels: unary maps, broadcasting binary operations and `where`.

use crate::cpu::num::Float;
use crate::cpu::{broadcast_shapes, broadcast_strides, map_slice, zip_slices, Plan};
use crate::error::KernelError;
use crate::tensor::{DType, Element, Storage, Tensor};

/// An operation enum with `ALL`, every variant in declaration order (for tests and tools that
/// go through every operation; a new variant is in it by construction).
macro_rules! op_enum {
    ($(#[$m:meta])* pub enum $name:ident { $($(#[$vm:meta])* $v:ident,)* }) => {
        $(#[$m])*
        pub enum $name { $($(#[$vm])* $v,)* }
        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$v),*];
        }
    };
}

op_enum! {
    /// Elementwise functions of one tensor.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub enum UnaryOp {
        Neg,
        Not,
        Exp,
        Log,
        Sqrt,
        Rsqrt,
        Tanh,
        Sigmoid,
        Relu,
        /// The tanh approximation `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`.
        Gelu,
        /// The error function (libm's, so the JIT's calls give the same bits).
        Erf,
        Sin,
        Cos,
        Abs,
        Sign,
        Floor,
        Square,
    }
}

impl UnaryOp {
    /// The msl name of the operation, used in messages.
    pub fn name(self) -> &'static str {
        match self {
            UnaryOp::Neg => "neg",
            UnaryOp::Not => "not",
            UnaryOp::Exp => "exp",
            UnaryOp::Log => "log",
            UnaryOp::Sqrt => "sqrt",
            UnaryOp::Rsqrt => "rsqrt",
            UnaryOp::Tanh => "tanh",
            UnaryOp::Sigmoid => "sigmoid",
            UnaryOp::Relu => "relu",
            UnaryOp::Gelu => "gelu",
            UnaryOp::Erf => "erf",
            UnaryOp::Sin => "sin",
            UnaryOp::Cos => "cos",
            UnaryOp::Abs => "abs",
            UnaryOp::Sign => "sign",
            UnaryOp::Floor => "floor",
            UnaryOp::Square => "square",
        }
    }
}

op_enum! {
    /// Elementwise functions of two broadcast tensors.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub enum BinaryOp {
        Add,
        Sub,
        Mul,
        Div,
        Rem,
        Pow,
        Max,
        Min,
        Eq,
        Ne,
        Lt,
        Le,
        Gt,
        Ge,
        And,
        Or,
        /// `g · gelu'(x)` of `x` and `g` (the tanh approximation): `gelu`'s adjoint in one pass.
        GeluGrad,
    }
}

impl BinaryOp {
    /// The msl name of the operation, used in messages.
    pub fn name(self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "sub",
            BinaryOp::Mul => "mul",
            BinaryOp::Div => "div",
            BinaryOp::Rem => "rem",
            BinaryOp::Pow => "pow",
            BinaryOp::Max => "maximum",
            BinaryOp::Min => "minimum",
            BinaryOp::Eq => "eq",
            BinaryOp::Ne => "ne",
            BinaryOp::Lt => "lt",
            BinaryOp::Le => "le",
            BinaryOp::Gt => "gt",
            BinaryOp::Ge => "ge",
            BinaryOp::And => "and",
            BinaryOp::Or => "or",
            BinaryOp::GeluGrad => "gelu_grad",
        }
    }

    /// True for the six comparisons, whose result is bool.
    pub fn is_comparison(self) -> bool {
        matches!(self, BinaryOp::Eq | BinaryOp::Ne | BinaryOp::Lt | BinaryOp::Le | BinaryOp::Gt | BinaryOp::Ge)
    }
}

/// An elementwise operation as code generators see it: a unary or binary operation, `where`
/// (condition, then the two branches) or a conversion to another element type. The JIT's fused
/// trees hold these, and the CUDA device's elementwise kernels are generated from them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ElemOp {
    Unary(UnaryOp),
    Binary(BinaryOp),
    Where,
    Cast,
}

impl ElemOp {
    /// The operation's msl name.
    pub fn name(self) -> &'static str {
        match self {
            ElemOp::Unary(u) => u.name(),
            ElemOp::Binary(b) => b.name(),
            ElemOp::Where => "where",
            ElemOp::Cast => "cast",
        }
    }
}

/// Applies `op` to every element. `Not` takes bool; `Neg`, `Abs`, `Sign`, `Square`, `Relu` and
/// `Floor` also take i32; the rest take f32 or f64.
pub fn unary(op: UnaryOp, x: &Tensor) -> Result<Tensor, KernelError> {
    let shape = x.shape().to_vec();
    match x.storage() {
        Storage::F32(v) => Ok(Tensor::from_parts(shape, float_unary::<f32>(op, v)?)),
        Storage::F64(v) => Ok(Tensor::from_parts(shape, float_unary::<f64>(op, v)?)),
        Storage::I32(v) => {
            let out = match op {
                UnaryOp::Neg => map_slice(v, i32::wrapping_neg),
                UnaryOp::Abs => map_slice(v, i32::wrapping_abs),
                UnaryOp::Sign => map_slice(v, i32::signum),
                UnaryOp::Square => map_slice(v, |a| a.wrapping_mul(a)),
                UnaryOp::Relu => map_slice(v, |a| a.max(0)),
                UnaryOp::Floor => v.to_vec(),
                UnaryOp::Not
                | UnaryOp::Exp
                | UnaryOp::Log
                | UnaryOp::Sqrt
                | UnaryOp::Rsqrt
                | UnaryOp::Tanh
                | UnaryOp::Sigmoid
                | UnaryOp::Gelu
                | UnaryOp::Erf
                | UnaryOp::Sin
                | UnaryOp::Cos => return Err(KernelError::dtype(op.name(), "a float tensor", DType::I32)),
            };
            Ok(Tensor::from_parts(shape, out))
        }
        Storage::Bool(v) => match op {
            UnaryOp::Not => Ok(Tensor::from_parts(shape, map_slice(v, |a| !a))),
            UnaryOp::Neg
            | UnaryOp::Exp
            | UnaryOp::Log
            | UnaryOp::Sqrt
            | UnaryOp::Rsqrt
            | UnaryOp::Tanh
            | UnaryOp::Sigmoid
            | UnaryOp::Relu
            | UnaryOp::Gelu
            | UnaryOp::Erf
            | UnaryOp::Sin
            | UnaryOp::Cos
            | UnaryOp::Abs
            | UnaryOp::Sign
            | UnaryOp::Floor
            | UnaryOp::Square => Err(KernelError::dtype(op.name(), "a numeric tensor", DType::Bool)),
        },
        Storage::Bf16(_) | Storage::F16(_) => x.in_f32(|w| unary(op, w)),
    }
}

fn float_unary<T: Float>(op: UnaryOp, v: &[T]) -> Result<Vec<T>, KernelError> {
    let one = T::one();
    Ok(match op {
        UnaryOp::Neg => map_slice(v, |a| -a),
        UnaryOp::Exp => map_slice(v, T::exp),
        UnaryOp::Log => map_slice(v, T::ln),
        UnaryOp::Sqrt => map_slice(v, T::sqrt),
        UnaryOp::Rsqrt => map_slice(v, |a| one / a.sqrt()),
        UnaryOp::Tanh => map_slice(v, T::tanh),
        UnaryOp::Sigmoid => map_slice(v, |a| sigmoid(a)),
        UnaryOp::Relu => map_slice(v, |a| if a > T::zero() || a.is_nan_v() { a } else { T::zero() }),
        // ½a(1 + tanh u) written as a / (1 + e^(-2u)): the same function, without the
        // cancellation of 1 + tanh u in the negative tail.
        UnaryOp::Gelu => map_slice(v, |a| a / gelu_den(a)),
        UnaryOp::Erf => map_slice(v, T::erf),
        UnaryOp::Sin => map_slice(v, T::sin),
        UnaryOp::Cos => map_slice(v, T::cos),
        UnaryOp::Abs => map_slice(v, T::abs_w),
        UnaryOp::Sign => map_slice(v, T::sign),
        UnaryOp::Floor => map_slice(v, T::floor),
        UnaryOp::Square => map_slice(v, |a| a * a),
        UnaryOp::Not => return Err(KernelError::dtype("not", "a bool tensor", T::DTYPE)),
    })
}

/// `1 + e^(-2u)` with `u = c (x + k x³)`: `gelu(x)` is `x` over it.
#[inline(always)]
fn gelu_den<T: Float>(x: T) -> T {
    let c = T::from_f64c((2.0 / std::f64::consts::PI).sqrt());
    let k = T::from_f64c(0.044715);
    let u = c * (x + k * x * x * x);
    T::one() + (-(u + u)).exp()
}

/// `g · gelu'(x)`, with `gelu(x) = x · s`, `s = 1 / (1 + e^(-2u))`, `u = c (x + k x³)` (the
/// forward kernel's form): `gelu'(x) = s + 2x · s (1 - s) · c (1 + 3k x²)`. The JIT lowers the
/// same operations in the same order (`jit::lower`).
#[inline(always)]
pub(crate) fn gelu_grad<T: Float>(x: T, g: T) -> T {
    let one = T::one();
    let c = T::from_f64c((2.0 / std::f64::consts::PI).sqrt());
    let k3 = T::from_f64c(0.134145);
    let s = one / gelu_den(x);
    let du = c * (one + k3 * x * x);
    g * (s + (x + x) * (s * (one - s)) * du)
}

/// The logistic function, computed without overflow for large negative inputs.
#[inline(always)]
fn sigmoid<T: Float>(a: T) -> T {
    let one = T::one();
    if a >= T::zero() {
        one / (one + (-a).exp())
    } else {
        let e = a.exp();
        e / (one + e)
    }
}

/// Applies `op` to `a` and `b` broadcast together (NumPy rules). Both must have one dtype.
/// Comparisons give bool. Integer `Div` truncates toward zero and `Rem` takes the sign of the
/// dividend; integer division by zero is an error, and so is an i32 `Pow` with a negative
/// exponent. Float `Rem` is `fmod`. `And` and `Or` take bool.
pub fn binary(op: BinaryOp, a: &Tensor, b: &Tensor) -> Result<Tensor, KernelError> {
    if a.dtype() != b.dtype() {
        return Err(KernelError::DTypeMismatch {
            op: op.name(),
            expected: format!("operands of one element type ({})", a.dtype()),
            found: b.dtype().to_string(),
        });
    }
    if a.dtype().is_half() {
        let w = b.cast(DType::F32);
        return a.in_f32(|v| binary(op, v, &w));
    }
    let shape = broadcast_shapes(op.name(), a.shape(), b.shape())?;
    if op.is_comparison() {
        return match (a.storage(), b.storage()) {
            (Storage::F32(x), Storage::F32(y)) => compare(op, x, a, y, b, shape),
            (Storage::F64(x), Storage::F64(y)) => compare(op, x, a, y, b, shape),
            (Storage::I32(x), Storage::I32(y)) => compare(op, x, a, y, b, shape),
            (Storage::Bool(x), Storage::Bool(y)) => compare(op, x, a, y, b, shape),
            _ => unreachable!("dtypes were checked equal"),
        };
    }
    match (a.storage(), b.storage()) {
        (Storage::F32(x), Storage::F32(y)) => float_binary(op, x, a, y, b, shape),
        (Storage::F64(x), Storage::F64(y)) => float_binary(op, x, a, y, b, shape),
        (Storage::I32(x), Storage::I32(y)) => int_binary(op, x, a, y, b, shape),
        (Storage::Bool(x), Storage::Bool(y)) => match op {
            BinaryOp::And => Ok(broadcast_map(x, a.shape(), y, b.shape(), shape, |p, q| p & q)),
            BinaryOp::Or => Ok(broadcast_map(x, a.shape(), y, b.shape(), shape, |p, q| p | q)),
            BinaryOp::Add
            | BinaryOp::Sub
            | BinaryOp::Mul
            | BinaryOp::Div
            | BinaryOp::Rem
            | BinaryOp::Pow
            | BinaryOp::Max
            | BinaryOp::Min
            | BinaryOp::Eq
            | BinaryOp::Ne
            | BinaryOp::Lt
            | BinaryOp::Le
            | BinaryOp::Gt
            | BinaryOp::Ge
            | BinaryOp::GeluGrad => Err(KernelError::dtype(op.name(), "a numeric tensor", DType::Bool)),
        },
        _ => unreachable!("dtypes were checked equal"),
    }
}

fn compare<T: Element>(
    op: BinaryOp,
    x: &[T],
    a: &Tensor,
    y: &[T],
    b: &Tensor,
    shape: Vec<usize>,
) -> Result<Tensor, KernelError> {
    let (sa, sb) = (a.shape(), b.shape());
    Ok(match op {
        BinaryOp::Eq => broadcast_map(x, sa, y, sb, shape, |p, q| p == q),
        BinaryOp::Ne => broadcast_map(x, sa, y, sb, shape, |p, q| p != q),
        BinaryOp::Lt => broadcast_map(x, sa, y, sb, shape, |p, q| p < q),
        BinaryOp::Le => broadcast_map(x, sa, y, sb, shape, |p, q| p <= q),
        BinaryOp::Gt => broadcast_map(x, sa, y, sb, shape, |p, q| p > q),
        BinaryOp::Ge => broadcast_map(x, sa, y, sb, shape, |p, q| p >= q),
        BinaryOp::Add
        | BinaryOp::Sub
        | BinaryOp::Mul
        | BinaryOp::Div
        | BinaryOp::Rem
        | BinaryOp::Pow
        | BinaryOp::Max
        | BinaryOp::Min
        | BinaryOp::And
        | BinaryOp::Or
        | BinaryOp::GeluGrad => return Err(KernelError::Invalid(format!("{} is not a comparison", op.name()))),
    })
}

fn float_binary<T: Float>(
    op: BinaryOp,
    x: &[T],
    a: &Tensor,
    y: &[T],
    b: &Tensor,
    shape: Vec<usize>,
) -> Result<Tensor, KernelError> {
    let (sa, sb) = (a.shape(), b.shape());
    Ok(match op {
        BinaryOp::Add => broadcast_map(x, sa, y, sb, shape, |p, q| p + q),
        BinaryOp::Sub => broadcast_map(x, sa, y, sb, shape, |p, q| p - q),
        BinaryOp::Mul => broadcast_map(x, sa, y, sb, shape, |p, q| p * q),
        BinaryOp::Div => broadcast_map(x, sa, y, sb, shape, |p, q| p / q),
        BinaryOp::Rem => broadcast_map(x, sa, y, sb, shape, T::rem),
        BinaryOp::Pow => broadcast_map(x, sa, y, sb, shape, T::powf),
        BinaryOp::Max => broadcast_map(x, sa, y, sb, shape, T::max_p),
        BinaryOp::Min => broadcast_map(x, sa, y, sb, shape, T::min_p),
        BinaryOp::GeluGrad => broadcast_map(x, sa, y, sb, shape, gelu_grad),
        BinaryOp::Eq
        | BinaryOp::Ne
        | BinaryOp::Lt
        | BinaryOp::Le
        | BinaryOp::Gt
        | BinaryOp::Ge
        | BinaryOp::And
        | BinaryOp::Or => return Err(KernelError::dtype(op.name(), "a bool tensor", T::DTYPE)),
    })
}

fn int_binary(
    op: BinaryOp,
    x: &[i32],
    a: &Tensor,
    y: &[i32],
    b: &Tensor,
    shape: Vec<usize>,
) -> Result<Tensor, KernelError> {
    let (sa, sb) = (a.shape(), b.shape());
    // Broadcasting reads every element of `b` when the output is not empty, so checking the
    // divisor and exponent up front is exact.
    let nonempty = shape.iter().all(|&d| d > 0);
    if nonempty && matches!(op, BinaryOp::Div | BinaryOp::Rem) && y.contains(&0) {
        return Err(KernelError::DivisionByZero);
    }
    if nonempty && op == BinaryOp::Pow {
        if let Some(e) = y.iter().find(|&&e| e < 0) {
            return Err(KernelError::Invalid(format!("pow: an i32 power needs a non-negative exponent, got {e}")));
        }
    }
    Ok(match op {
        BinaryOp::Add => broadcast_map(x, sa, y, sb, shape, i32::wrapping_add),
        BinaryOp::Sub => broadcast_map(x, sa, y, sb, shape, i32::wrapping_sub),
        BinaryOp::Mul => broadcast_map(x, sa, y, sb, shape, i32::wrapping_mul),
        BinaryOp::Div => {
            broadcast_map(x, sa, y, sb, shape, |p, q| if q == 0 { 0 } else { crate::math::div_floor_i32(p, q) })
        }
        BinaryOp::Rem => {
            broadcast_map(x, sa, y, sb, shape, |p, q| if q == 0 { 0 } else { crate::math::rem_floor_i32(p, q) })
        }
        BinaryOp::Pow => broadcast_map(x, sa, y, sb, shape, |p, q| p.wrapping_pow(q.max(0) as u32)),
        BinaryOp::Max => broadcast_map(x, sa, y, sb, shape, i32::max),
        BinaryOp::Min => broadcast_map(x, sa, y, sb, shape, i32::min),
        BinaryOp::Eq
        | BinaryOp::Ne
        | BinaryOp::Lt
        | BinaryOp::Le
        | BinaryOp::Gt
        | BinaryOp::Ge
        | BinaryOp::And
        | BinaryOp::Or
        | BinaryOp::GeluGrad => return Err(KernelError::dtype(op.name(), "a bool tensor", DType::I32)),
    })
}

/// `f` over `x` and `y` broadcast to `shape`. Same-shape and scalar operands take straight
/// slice loops; everything else goes through a [`Plan`] whose rows are specialised for
/// strides 0 and 1.
pub(crate) fn broadcast_map<T, U, F>(x: &[T], xs: &[usize], y: &[T], ys: &[usize], shape: Vec<usize>, f: F) -> Tensor
where
    T: Element,
    U: Element,
    F: Fn(T, T) -> U + Sync + Send + Copy,
{
    let n: usize = shape.iter().product();
    if x.len() == n && y.len() == n {
        return Tensor::from_parts(shape, zip_slices(x, y, f));
    }
    if x.len() == n && y.len() == 1 {
        let c = y[0];
        return Tensor::from_parts(shape, map_slice(x, move |p| f(p, c)));
    }
    if y.len() == n && x.len() == 1 {
        let c = x[0];
        return Tensor::from_parts(shape, map_slice(y, move |q| f(c, q)));
    }
    let stx = broadcast_strides(xs, &shape);
    let sty = broadcast_strides(ys, &shape);
    let plan = Plan::new(&shape, &[&stx, &sty]);
    // Not zeroed first: the plan's rows cover every element, each written below.
    let mut out: Vec<U> = Vec::with_capacity(n);
    let (rx, ry) = (plan.row_strides[0], plan.row_strides[1]);
    plan.run(&mut out.spare_capacity_mut()[..n], |row, off| {
        let len = row.len();
        let (ox, oy) = (off[0], off[1]);
        match (rx, ry) {
            (1, 1) => {
                for ((o, &p), &q) in row.iter_mut().zip(&x[ox..ox + len]).zip(&y[oy..oy + len]) {
                    o.write(f(p, q));
                }
            }
            (1, 0) => {
                let q = y[oy];
                for (o, &p) in row.iter_mut().zip(&x[ox..ox + len]) {
                    o.write(f(p, q));
                }
            }
            (0, 1) => {
                let p = x[ox];
                for (o, &q) in row.iter_mut().zip(&y[oy..oy + len]) {
                    o.write(f(p, q));
                }
            }
            _ => {
                for (j, o) in row.iter_mut().enumerate() {
                    o.write(f(x[ox + j * rx], y[oy + j * ry]));
                }
            }
        }
    });
    // SAFETY: `Plan::run` hands every row of the `n` elements to the closure exactly once
    // (`n > 0` here: empty shapes have `x.len() == n`), and each row is written in full.
    unsafe { out.set_len(n) };
    Tensor::from_parts(shape, out)
}

/// Picks `a` where `c` is true and `b` elsewhere, broadcasting all three. `c` must be bool and
/// `a` and `b` must share a dtype.
pub fn where_(c: &Tensor, a: &Tensor, b: &Tensor) -> Result<Tensor, KernelError> {
    let cond = c.as_bool().ok_or_else(|| KernelError::dtype("where", "a bool condition", c.dtype()))?;
    if a.dtype() != b.dtype() {
        return Err(KernelError::DTypeMismatch {
            op: "where",
            expected: format!("branches of one element type ({})", a.dtype()),
            found: b.dtype().to_string(),
        });
    }
    if a.dtype().is_half() {
        // Storage-only branches are selected in f32, and the result goes back to their type.
        let w = b.cast(DType::F32);
        return a.in_f32(|v| where_(c, v, &w));
    }
    let shape = broadcast_shapes("where", a.shape(), b.shape())?;
    let shape = broadcast_shapes("where", c.shape(), &shape)?;
    match (a.storage(), b.storage()) {
        (Storage::F32(x), Storage::F32(y)) => Ok(select(cond, c, x, a, y, b, shape)),
        (Storage::F64(x), Storage::F64(y)) => Ok(select(cond, c, x, a, y, b, shape)),
        (Storage::I32(x), Storage::I32(y)) => Ok(select(cond, c, x, a, y, b, shape)),
        (Storage::Bool(x), Storage::Bool(y)) => Ok(select(cond, c, x, a, y, b, shape)),
        _ => unreachable!("dtypes were checked equal"),
    }
}

fn select<T: Element>(
    cond: &[bool],
    c: &Tensor,
    x: &[T],
    a: &Tensor,
    y: &[T],
    b: &Tensor,
    shape: Vec<usize>,
) -> Tensor {
    let n: usize = shape.iter().product();
    let sc = broadcast_strides(c.shape(), &shape);
    let sx = broadcast_strides(a.shape(), &shape);
    let sy = broadcast_strides(b.shape(), &shape);
    let plan = Plan::new(&shape, &[&sc, &sx, &sy]);
    let (rc, rx, ry) = (plan.row_strides[0], plan.row_strides[1], plan.row_strides[2]);
    let mut out = vec![T::default(); n];
    plan.run(&mut out, |row, off| {
        let len = row.len();
        let (oc, ox, oy) = (off[0], off[1], off[2]);
        // The masked-gradient cases (`where(mask, g, 0)` and friends) get straight loops.
        match (rc, rx, ry) {
            (1, 1, 1) => {
                let it = cond[oc..oc + len].iter().zip(&x[ox..ox + len]).zip(&y[oy..oy + len]);
                for (o, ((&k, &p), &q)) in row.iter_mut().zip(it) {
                    *o = if k { p } else { q };
                }
            }
            (1, 1, 0) => {
                let q = y[oy];
                for (o, (&k, &p)) in row.iter_mut().zip(cond[oc..oc + len].iter().zip(&x[ox..ox + len])) {
                    *o = if k { p } else { q };
                }
            }
            (1, 0, 1) => {
                let p = x[ox];
                for (o, (&k, &q)) in row.iter_mut().zip(cond[oc..oc + len].iter().zip(&y[oy..oy + len])) {
                    *o = if k { p } else { q };
                }
            }
            _ => {
                for (j, o) in row.iter_mut().enumerate() {
                    *o = if cond[oc + j * rc] { x[ox + j * rx] } else { y[oy + j * ry] };
                }
            }
        }
    });
    Tensor::from_parts(shape, out)
}
