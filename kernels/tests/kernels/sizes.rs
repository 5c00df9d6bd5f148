//! Sizes that do not fit: every kernel that makes a new shape checks its element count and
//! returns `KernelError::SizeOverflow` instead of wrapping, panicking or asking for a huge
//! allocation. The operands are empty tensors with huge other dims (no memory needed), and
//! the results would have more than `MAX_ELEMENTS` elements.

use crate::t32;
use kernels::ops::{self, BinaryOp, ReduceOp};
use kernels::tensor::{checked_numel, MAX_ELEMENTS};
use kernels::{rng, CpuDevice, DType, Device, KernelError, KernelId, KernelParams, Tensor};

const T40: usize = 1 << 40;

/// An empty f32 tensor of this shape (one dim must be 0).
fn empty(shape: &[usize]) -> Tensor {
    Tensor::from_f32(shape.to_vec(), vec![]).unwrap()
}

#[track_caller]
fn overflow<T: std::fmt::Debug>(r: Result<T, KernelError>) -> String {
    let e = r.expect_err("expected a size overflow");
    assert!(matches!(e, KernelError::SizeOverflow { .. }), "{e:?}");
    let m = e.to_string();
    assert!(m.starts_with("size overflow: shape [") && m.contains(" elements"), "{m}");
    m
}

#[test]
fn element_counts_are_checked_with_zero_dims_left_out() {
    assert_eq!(checked_numel(&[]).unwrap(), 1);
    assert_eq!(checked_numel(&[0, T40]).unwrap(), 0);
    assert_eq!(checked_numel(&[3, MAX_ELEMENTS / 3]).unwrap(), MAX_ELEMENTS / 3 * 3);
    assert_eq!(checked_numel(&[MAX_ELEMENTS]).unwrap(), MAX_ELEMENTS);
    let m = overflow(checked_numel(&[T40, T40]));
    assert_eq!(m, "size overflow: shape [1099511627776, 1099511627776] has 1208925819614629174706176 elements (at most 1152921504606846975 are supported)");
    // The product wraps to 2^32 in usize: it must not be taken for a 16 GiB tensor.
    overflow(checked_numel(&[1 << 32, (1 << 32) + 1]));
    overflow(checked_numel(&[MAX_ELEMENTS + 1]));
    let m = overflow(checked_numel(&[0, 1 << 62]));
    assert!(
        m.contains("[0, 4611686018427387904] is too large: its nonzero dimensions multiply to 4611686018427387904"),
        "{m}"
    );
    // A product too large even for u128 is still reported.
    assert!(overflow(checked_numel(&[usize::MAX; 3])).contains("more than 2^128"));
    overflow(Tensor::from_f32(vec![0, 1 << 62], vec![]));
    overflow(empty(&[0, T40]).with_shape(vec![0, T40, T40]));
    overflow(ops::reshape(&empty(&[0, T40]), &[T40, T40, 0]));
}

#[test]
fn creation_checks_its_shape() {
    overflow(ops::zeros(DType::F32, &[T40, T40]));
    overflow(ops::ones(DType::F32, &[1 << 32, (1 << 32) + 1]));
    overflow(ops::full(DType::I32, &[i64::MAX as usize], 2.0));
    overflow(ops::arange(usize::MAX, DType::F64));
    overflow(ops::eye(1 << 31, DType::F32));
    overflow(rng::normal(DType::F32, &[T40, T40], [1, 2], 0.0, 1.0));
    overflow(rng::uniform(DType::F64, &[usize::MAX], [1, 2], 0.0, 1.0));
    overflow(rng::bernoulli(&[T40, 0, T40], [1, 2], 0.5));
    assert!(ops::arange((1 << 31) + 1, DType::I32).unwrap_err().to_string().contains("do not fit in i32"));
}

#[test]
fn broadcasts_concats_products_and_gathers_check_their_results() {
    let (a, b) = (empty(&[T40, 1, 0]), empty(&[1, T40, 0]));
    let m = overflow(ops::binary(BinaryOp::Add, &a, &b));
    assert!(m.contains("[1099511627776, 1099511627776, 0]"), "{m}");
    overflow(ops::broadcast_shapes("add", &[T40, 1], &[1, T40]));
    let c = Tensor::from_bool(vec![T40, 1, 0], vec![]).unwrap();
    overflow(ops::where_(&c, &b, &b));
    overflow(ops::broadcast_to(&empty(&[1, 0]), &[1 << 62, 0]));
    // Two halves of the limit joined: one element too many.
    let half = empty(&[0, 1 << 59]);
    overflow(ops::concat(&[half.clone(), half.clone()], 1));
    overflow(ops::stack(&[empty(&[0, MAX_ELEMENTS]), empty(&[0, MAX_ELEMENTS])], 2));
    // Twenty dims of almost 2^60 add up past usize itself, and the sum is shown exactly.
    let wide = empty(&[0, MAX_ELEMENTS]);
    let m = overflow(ops::concat(&vec![wide; 20], 1));
    assert!(m.contains(&format!("[0, {}]", MAX_ELEMENTS as u128 * 20)), "{m}");
    let m = overflow(ops::matmul(&empty(&[T40, 0]), &empty(&[0, T40])));
    assert!(m.contains("[1099511627776, 1099511627776]"), "{m}");
    overflow(ops::matmul_t(&empty(&[0, T40]), &empty(&[T40, 0]), true, true));
    overflow(ops::matmul(&empty(&[T40, 1, 0]), &empty(&[1, 0, T40])));
    // An empty product of many matrices is made without a table of 2^40 offsets.
    let many = ops::matmul(&empty(&[T40, 0, 3]), &t32(&[3, 2], &[0.0; 6])).unwrap();
    assert_eq!(many.shape(), &[T40, 0, 2]);
    assert_eq!(ops::matmul(&empty(&[2, 0]), &empty(&[0, 3])).unwrap(), t32(&[2, 3], &[0.0; 6]));
    overflow(ops::einsum("ij,jk->ik", &[empty(&[T40, 0]), empty(&[0, T40])]));
    let idx = Tensor::from_i32(vec![0, T40], vec![]).unwrap();
    overflow(ops::gather(&empty(&[0, T40]), &idx, 0));
    overflow(ops::one_hot(&idx, T40, DType::F32));
    overflow(ops::scatter_add(&[T40, T40], &Tensor::from_i32(vec![0], vec![]).unwrap(), &empty(&[0, T40]), 0));
    overflow(ops::slice_update_add(&[T40, T40], &[], &empty(&[0])));
}

#[test]
fn empty_results_with_huge_dims_take_no_time() {
    // Each of these would loop 2^40 times over nothing (hours) if it walked the outer dims.
    let x = empty(&[T40, 2, 0]);
    assert_eq!(ops::concat(&[x.clone(), x.clone()], 1).unwrap().shape(), &[T40, 4, 0]);
    let idx = Tensor::from_i32(vec![3], vec![0, 1, 1]).unwrap();
    assert_eq!(ops::gather(&x, &idx, 1).unwrap().shape(), &[T40, 3, 0]);
    let upd = empty(&[T40, 3, 0]);
    assert_eq!(ops::scatter_add(&[T40, 2, 0], &idx, &upd, 1).unwrap().shape(), &[T40, 2, 0]);
    assert_eq!(ops::reduce(ReduceOp::Sum, &x, Some(1), false).unwrap().shape(), &[T40, 0]);
    assert_eq!(ops::cumsum(&x, 0).unwrap().shape(), &[T40, 2, 0]);
    // An arg-max over an empty axis is an error before any output is made.
    assert!(ops::argmax(&empty(&[0, T40]), Some(0), false).is_err());
}

#[test]
fn reductions_of_valid_empty_tensors_work() {
    // The largest sub-products of a valid shape fit, so reductions of empty tensors with huge
    // dims give their (empty or scalar) results without overflowing.
    let x = empty(&[T40, 0]);
    assert_eq!(ops::reduce(ReduceOp::Sum, &x, None, false).unwrap().scalar_value_f64(), Some(0.0));
    assert_eq!(ops::reduce(ReduceOp::Sum, &x, Some(0), false).unwrap().shape(), &[0]);
    assert_eq!(ops::reduce(ReduceOp::Max, &x, Some(0), true).unwrap().shape(), &[1, 0]);
    assert_eq!(ops::transpose(&x).shape(), &[0, T40]);
}

#[test]
fn float_to_i32_conversions_refuse_values_without_an_i32() {
    let x = Tensor::from_f32(vec![4], vec![2.7, -2.7, -2147483648.0, 2147483520.0]).unwrap();
    assert_eq!(x.try_cast(DType::I32).unwrap().as_i32().unwrap(), &[2, -2, i32::MIN, 2147483520]);
    let d = Tensor::from_f64(vec![2], vec![2147483647.9, -2147483648.9]).unwrap();
    assert_eq!(d.try_cast(DType::I32).unwrap().as_i32().unwrap(), &[i32::MAX, i32::MIN]);
    let bad = |v: f64| Tensor::scalar_f64(v).try_cast(DType::I32).unwrap_err();
    for v in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 2147483648.0, -2147483649.0, 1e20] {
        assert!(matches!(bad(v), KernelError::CastOutOfRange { .. }), "{v}");
    }
    assert_eq!(bad(f64::NAN).to_string(), "cannot convert nan to i32: it is not a number");
    assert_eq!(
        bad(2147483648.0).to_string(),
        "cannot convert 2147483648.0 to i32: it is outside the range of i32 (-2147483648 to 2147483647)"
    );
    let f = Tensor::from_f32(vec![3], vec![1.0, f32::NAN, 2147483648.0]).unwrap();
    assert_eq!(
        f.try_cast(DType::I32).unwrap_err().to_string(),
        "cannot convert element 1 (nan) to i32: it is not a number"
    );
    // Every other conversion is total.
    assert_eq!(f.try_cast(DType::F64).unwrap().len(), 3);
    assert_eq!(f.try_cast(DType::Bool).unwrap().as_bool().unwrap(), &[true, true, true]);
    // The device's cast kernel is the same checked conversion.
    let dev = CpuDevice;
    let df = dev.upload(&f).unwrap();
    let r = dev.launch(KernelId::Cast, &[&df], &KernelParams::new().dtype(DType::I32));
    assert!(matches!(r, Err(KernelError::CastOutOfRange { index: Some(1), .. })));
    overflow(dev.alloc(DType::F32, MAX_ELEMENTS + 1));
}
