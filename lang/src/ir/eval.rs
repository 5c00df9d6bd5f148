//! Evaluation of the elementwise primitives through the CPU kernels, below every engine: the
//! interpreter applies them, and `-O2`'s constant folding evaluates literal operands with the
//! same functions, so a folded value is the one the program would have computed.

use super::prim::Domain;
use super::{Lit, Prim};
use crate::types::{ElemTy, TensorTy, Type};
use kernels::ops::{self, BinaryOp, UnaryOp};
use kernels::{DType, KernelError, Tensor};

/// The storage type of an element type (`bf16`/`f16` are stored in 2 bytes and computed in
/// f32: `kernels::Tensor::in_f32`, `interp::prims`).
pub fn dtype_of(t: crate::types::ElemTy) -> DType {
    use crate::types::ElemTy;
    match t {
        ElemTy::F32 => DType::F32,
        ElemTy::Bf16 => DType::Bf16,
        ElemTy::F16 => DType::F16,
        ElemTy::F64 => DType::F64,
        ElemTy::I32 => DType::I32,
        ElemTy::Bool => DType::Bool,
    }
}

/// Applies an elementwise primitive (unary, binary, `where`, a conversion to `to`) to tensors;
/// `None` for any other primitive.
pub fn elementwise(p: Prim, to: Option<ElemTy>, args: &[Tensor]) -> Option<Result<Tensor, KernelError>> {
    if let Some(op) = unary_op(p) {
        return Some(ops::unary(op, &unary_operand(p, args.first()?)));
    }
    if let Some(op) = binary_op(p) {
        return Some(binary(op, args.first()?, args.get(1)?));
    }
    match p {
        Prim::Where => {
            let (a, b) = unify_dtypes(args.get(1)?.clone(), args.get(2)?.clone());
            Some(ops::where_(args.first()?, &a, &b))
        }
        // A conversion that cannot hold the value (NaN, ±inf, out of range to i32) is an error.
        Prim::Cast => Some(args.first()?.try_cast(dtype_of(to.unwrap_or(ElemTy::F32)))),
        // The class patterns name `where` and `cast` again: every primitive is covered once more.
        #[allow(unreachable_patterns)]
        crate::unary_prims!()
        | crate::binary_prims!()
        | crate::reduce_prims!()
        | crate::along_prims!()
        | crate::collective_prims!()
        | crate::other_prims!() => None,
    }
}

/// The operand of unary primitive `p` as its kernel takes it: an integer (a weak literal)
/// under a float function is computed in floating point.
pub fn unary_operand(p: Prim, x: &Tensor) -> Tensor {
    if x.dtype() == DType::I32 && matches!(p.unary_kernel(), Some((_, Domain::Float))) {
        x.cast(DType::F64)
    } else {
        x.clone()
    }
}

/// The kernel of a unary elementwise primitive (its table entry's).
pub fn unary_op(p: Prim) -> Option<UnaryOp> {
    p.unary_kernel().map(|(op, _)| op)
}

/// The kernel of a binary elementwise primitive (its table entry's).
pub fn binary_op(p: Prim) -> Option<BinaryOp> {
    p.binary_kernel().map(|(op, _)| op)
}

/// Two tensors whose element types differ only because one came from a weak literal: the
/// narrower one takes the other's type.
pub fn unify_dtypes(a: Tensor, b: Tensor) -> (Tensor, Tensor) {
    if a.dtype() == b.dtype() {
        return (a, b);
    }
    let rank = |d: DType| match d {
        DType::Bool => 0,
        DType::I32 => 1,
        DType::Bf16 | DType::F16 => 2,
        DType::F32 => 3,
        DType::F64 => 4,
    };
    // A scalar adapts to a tensor; otherwise the wider type wins.
    if a.rank() == 0 && b.rank() > 0 {
        let d = b.dtype();
        return (a.cast(d), b);
    }
    if b.rank() == 0 && a.rank() > 0 {
        let d = a.dtype();
        return (a, b.cast(d));
    }
    if rank(a.dtype()) >= rank(b.dtype()) {
        let d = a.dtype();
        (a, b.cast(d))
    } else {
        let d = b.dtype();
        (a.cast(d), b)
    }
}

/// A binary elementwise operation as the interpreter applies it: scalars of one type directly,
/// everything else through the kernel after unifying weak-literal element types.
pub fn binary(op: BinaryOp, a: &Tensor, b: &Tensor) -> Result<Tensor, KernelError> {
    if let Some(t) = scalar_binary(op, a, b) {
        return Ok(t);
    }
    let (a, b) = unify_dtypes(a.clone(), b.clone());
    ops::binary(op, &a, &b)
}

/// Host-code arithmetic on two scalars of one type, without going through a kernel (loop
/// counters, accumulators). Integer division and remainder by zero take the kernel path, which
/// reports the error.
pub fn scalar_binary(op: BinaryOp, a: &Tensor, b: &Tensor) -> Option<Tensor> {
    if a.rank() != 0 || b.rank() != 0 || a.dtype() != b.dtype() {
        return None;
    }
    match a.dtype() {
        DType::I32 => {
            let (x, y) = (a.as_i32()?[0], b.as_i32()?[0]);
            let v = match op {
                BinaryOp::Add => x.wrapping_add(y),
                BinaryOp::Sub => x.wrapping_sub(y),
                BinaryOp::Mul => x.wrapping_mul(y),
                BinaryOp::Div if y != 0 => kernels::math::div_floor_i32(x, y),
                BinaryOp::Rem if y != 0 => kernels::math::rem_floor_i32(x, y),
                BinaryOp::Max => x.max(y),
                BinaryOp::Min => x.min(y),
                BinaryOp::Eq => return Some(Tensor::scalar_bool(x == y)),
                BinaryOp::Ne => return Some(Tensor::scalar_bool(x != y)),
                BinaryOp::Lt => return Some(Tensor::scalar_bool(x < y)),
                BinaryOp::Le => return Some(Tensor::scalar_bool(x <= y)),
                BinaryOp::Gt => return Some(Tensor::scalar_bool(x > y)),
                BinaryOp::Ge => return Some(Tensor::scalar_bool(x >= y)),
                _ => return None, // any other primitive: folded by its kernel
            };
            Some(Tensor::scalar_i32(v))
        }
        DType::F32 => {
            let (x, y) = (a.as_f32()?[0], b.as_f32()?[0]);
            let v = match op {
                BinaryOp::Add => x + y,
                BinaryOp::Sub => x - y,
                BinaryOp::Mul => x * y,
                BinaryOp::Div => x / y,
                BinaryOp::Lt => return Some(Tensor::scalar_bool(x < y)),
                BinaryOp::Le => return Some(Tensor::scalar_bool(x <= y)),
                BinaryOp::Gt => return Some(Tensor::scalar_bool(x > y)),
                BinaryOp::Ge => return Some(Tensor::scalar_bool(x >= y)),
                _ => return None, // any other primitive: folded by its kernel
            };
            Some(Tensor::scalar_f32(v))
        }
        _ => None,
    }
}

/// The value of a numeric or boolean literal of type `ty` (`None` for a string).
pub fn lit_tensor(l: &Lit, ty: &Type) -> Option<Tensor> {
    use crate::types::Elem;
    let elem = match ty {
        Type::Tensor(TensorTy { elem: e, .. }) => *e,
        _ => Elem::WeakFloat,
    };
    match l {
        Lit::Bool(b) => Some(Tensor::scalar_bool(*b)),
        Lit::Str(_) => None,
        Lit::Int(n) => Some(match elem.materialise_weak_float() {
            Some(t) => scalar_of(t, *n as f64),
            None => Tensor::scalar_i32(*n as i32),
        }),
        Lit::Float(x) => Some(match elem {
            Elem::T(t) => scalar_of(t, *x),
            _ => Tensor::scalar_f64(*x),
        }),
    }
}

/// A scalar of an element type, built directly (literals are evaluated in every loop iteration).
fn scalar_of(t: crate::types::ElemTy, x: f64) -> Tensor {
    match dtype_of(t) {
        DType::F32 => Tensor::scalar_f32(x as f32),
        DType::F64 => Tensor::scalar_f64(x),
        DType::I32 => Tensor::scalar_i32(x as i32),
        DType::Bool => Tensor::scalar_bool(x != 0.0),
        d @ (DType::Bf16 | DType::F16) => Tensor::scalar_f64(x).cast(d),
    }
}
