//! Unary, binary (broadcasting) and `where` kernels against NumPy reference values.

use kernels::ops::{self, BinaryOp, UnaryOp};
use kernels::{DType, KernelError, Tensor};

use crate::{check, lcg, msg, t32, t64, ti};

// Reference values computed once with NumPy 2.4 (float32):
//   a = np.arange(6, dtype=np.float32).reshape(2,1,3) * np.float32(0.5) - np.float32(1)
//   b = np.array([[1.5],[-2.0]], dtype=np.float32)
//   (a+b), (a*b), (a/b), np.maximum(a,b), (a<b)   -> shape (2, 2, 3)
fn ab() -> (Tensor, Tensor) {
    (t32(&[2, 1, 3], &[-1.0, -0.5, 0.0, 0.5, 1.0, 1.5]), t32(&[2, 1], &[1.5, -2.0]))
}

#[test]
fn broadcasting_with_size_one_dims_matches_numpy() {
    let (a, b) = ab();
    let s = [2, 2, 3];
    let add = ops::binary(BinaryOp::Add, &a, &b).unwrap();
    check(&add, &s, &[0.5, 1.0, 1.5, -3.0, -2.5, -2.0, 2.0, 2.5, 3.0, -1.5, -1.0, -0.5], 0.0);
    let mul = ops::binary(BinaryOp::Mul, &a, &b).unwrap();
    check(&mul, &s, &[-1.5, -0.75, 0.0, 2.0, 1.0, -0.0, 0.75, 1.5, 2.25, -1.0, -2.0, -3.0], 0.0);
    let div = ops::binary(BinaryOp::Div, &a, &b).unwrap();
    let want = [
        -0.6666666865348816,
        -0.3333333432674408,
        0.0,
        0.5,
        0.25,
        -0.0,
        0.3333333432674408,
        0.6666666865348816,
        1.0,
        -0.25,
        -0.5,
        -0.75,
    ];
    check(&div, &s, &want, 0.0);
    let max = ops::binary(BinaryOp::Max, &a, &b).unwrap();
    check(&max, &s, &[1.5, 1.5, 1.5, -1.0, -0.5, 0.0, 1.5, 1.5, 1.5, 0.5, 1.0, 1.5], 0.0);
    let lt = ops::binary(BinaryOp::Lt, &a, &b).unwrap();
    assert_eq!(lt.dtype(), DType::Bool);
    let want = [true, true, true, false, false, false, true, true, false, false, false, false];
    assert_eq!(lt.as_bool().unwrap(), &want);
}

#[test]
fn broadcasting_is_symmetric_and_scalars_broadcast() {
    let (a, b) = ab();
    let ab = ops::binary(BinaryOp::Sub, &a, &b).unwrap();
    let ba = ops::binary(BinaryOp::Sub, &b, &a).unwrap();
    let neg = ops::unary(UnaryOp::Neg, &ba).unwrap();
    assert_eq!(ab, neg);
    let two = Tensor::scalar_f32(2.0);
    let r = ops::binary(BinaryOp::Mul, &two, &a).unwrap();
    check(&r, &[2, 1, 3], &[-2.0, -1.0, 0.0, 1.0, 2.0, 3.0], 0.0);
}

#[test]
fn large_broadcasts_take_the_parallel_path_and_agree_with_a_loop() {
    // [300, 257] + [257] and [300, 257] * [300, 1]: well above the parallel threshold.
    let (r, c) = (300, 257);
    let x = lcg(r * c, 1);
    let row = lcg(c, 2);
    let col = lcg(r, 3);
    let xt = t64(&[r, c], &x);
    let add = ops::binary(BinaryOp::Add, &xt, &t64(&[c], &row)).unwrap();
    let mul = ops::binary(BinaryOp::Mul, &xt, &t64(&[r, 1], &col)).unwrap();
    let want_add: Vec<f64> = (0..r * c).map(|i| x[i] + row[i % c]).collect();
    let want_mul: Vec<f64> = (0..r * c).map(|i| x[i] * col[i / c]).collect();
    check(&add, &[r, c], &want_add, 0.0);
    check(&mul, &[r, c], &want_mul, 0.0);
    // An outer product through broadcasting: [r, 1] - [1, c].
    let outer = ops::binary(BinaryOp::Sub, &t64(&[r, 1], &col), &t64(&[1, c], &row)).unwrap();
    let want: Vec<f64> = (0..r * c).map(|i| col[i / c] - row[i % c]).collect();
    check(&outer, &[r, c], &want, 0.0);
}

#[test]
fn incompatible_shapes_and_dtypes_are_errors() {
    let a = t32(&[2, 3], &[0.0; 6]);
    let b = t32(&[4], &[0.0; 4]);
    assert_eq!(msg(ops::binary(BinaryOp::Add, &a, &b)), "add: shapes [2, 3] and [4] are incompatible");
    let c = ti(&[3], &[1, 2, 3]);
    assert!(matches!(ops::binary(BinaryOp::Add, &a, &c), Err(KernelError::DTypeMismatch { .. })));
    assert!(ops::unary(UnaryOp::Exp, &c).is_err());
    assert!(ops::unary(UnaryOp::Not, &a).is_err());
}

// Reference values computed once with NumPy 2.4 (float64), x = [-3,-1,-0.5,0,0.5,1,3]:
//   0.5*x*(1+np.tanh(np.sqrt(2/np.pi)*(x+0.044715*x**3))), 1/(1+np.exp(-x)), np.tanh(x)
#[test]
fn unary_functions_match_numpy() {
    let x = t64(&[7], &[-3.0, -1.0, -0.5, 0.0, 0.5, 1.0, 3.0]);
    let gelu = [
        -0.0036373920817729943,
        -0.1588080093917233,
        -0.15428599017485606,
        0.0,
        0.34571400982514394,
        0.8411919906082768,
        2.996362607918227,
    ];
    check(&ops::unary(UnaryOp::Gelu, &x).unwrap(), &[7], &gelu, 1e-15);
    let sigmoid = [
        0.04742587317756678,
        0.2689414213699951,
        0.3775406687981454,
        0.5,
        0.6224593312018546,
        0.7310585786300049,
        0.9525741268224334,
    ];
    check(&ops::unary(UnaryOp::Sigmoid, &x).unwrap(), &[7], &sigmoid, 1e-15);
    let tanh = [
        -0.9950547536867305,
        -0.7615941559557649,
        -0.46211715726000974,
        0.0,
        0.46211715726000974,
        0.7615941559557649,
        0.9950547536867305,
    ];
    check(&ops::unary(UnaryOp::Tanh, &x).unwrap(), &[7], &tanh, 1e-15);
    check(&ops::unary(UnaryOp::Relu, &x).unwrap(), &[7], &[0.0, 0.0, 0.0, 0.0, 0.5, 1.0, 3.0], 0.0);
    check(&ops::unary(UnaryOp::Sign, &x).unwrap(), &[7], &[-1.0, -1.0, -1.0, 0.0, 1.0, 1.0, 1.0], 0.0);
    check(&ops::unary(UnaryOp::Square, &x).unwrap(), &[7], &[9.0, 1.0, 0.25, 0.0, 0.25, 1.0, 9.0], 0.0);
    check(&ops::unary(UnaryOp::Floor, &x).unwrap(), &[7], &[-3.0, -1.0, -1.0, 0.0, 0.0, 1.0, 3.0], 0.0);
    let big = t32(&[3], &[-1000.0, 1000.0, f32::NAN]);
    check(&ops::unary(UnaryOp::Sigmoid, &big).unwrap(), &[3], &[0.0, 1.0, f64::NAN], 0.0);
    check(&ops::unary(UnaryOp::Relu, &big).unwrap(), &[3], &[0.0, 1000.0, f64::NAN], 0.0);
    let r = ops::unary(UnaryOp::Rsqrt, &t32(&[2], &[4.0, 0.25])).unwrap();
    check(&r, &[2], &[0.5, 2.0], 0.0);
}

#[test]
fn integer_and_bool_unary_ops() {
    let x = ti(&[4], &[-3, 0, 5, i32::MIN]);
    assert_eq!(ops::unary(UnaryOp::Neg, &x).unwrap().as_i32().unwrap(), &[3, 0, -5, i32::MIN]);
    assert_eq!(ops::unary(UnaryOp::Abs, &x).unwrap().as_i32().unwrap(), &[3, 0, 5, i32::MIN]);
    assert_eq!(ops::unary(UnaryOp::Sign, &x).unwrap().as_i32().unwrap(), &[-1, 0, 1, -1]);
    let b = Tensor::from_bool(vec![2], vec![true, false]).unwrap();
    assert_eq!(ops::unary(UnaryOp::Not, &b).unwrap().as_bool().unwrap(), &[false, true]);
}

// Reference: np.floor_divide(i, j) and np.remainder(i, j) for
//   i = [7,-7,7,-7,0,5,-6], j = [2,2,-2,-2,3,-7,3]  (Python's floor division, as NumPy and JAX)
#[test]
fn integer_division_floors_and_remainder_follows_the_divisor() {
    let i = ti(&[7], &[7, -7, 7, -7, 0, 5, -6]);
    let j = ti(&[7], &[2, 2, -2, -2, 3, -7, 3]);
    let q = ops::binary(BinaryOp::Div, &i, &j).unwrap();
    assert_eq!(q.as_i32().unwrap(), &[3, -4, -4, 3, 0, -1, -2]);
    let r = ops::binary(BinaryOp::Rem, &i, &j).unwrap();
    assert_eq!(r.as_i32().unwrap(), &[1, 1, -1, -1, 0, -2, 0]);
    // np.remainder([5.5,-5.5,5.5,-5.5,-6.0,6.0], [2,2,-2,-2,3,-3]) = [1.5,0.5,-0.5,-1.5,0.0,-0.0]
    let a = t64(&[6], &[5.5, -5.5, 5.5, -5.5, -6.0, 6.0]);
    let f = ops::binary(BinaryOp::Rem, &a, &t64(&[6], &[2.0, 2.0, -2.0, -2.0, 3.0, -3.0])).unwrap();
    check(&f, &[6], &[1.5, 0.5, -0.5, -1.5, 0.0, -0.0], 0.0);
    let signs: Vec<bool> = f.as_f64().unwrap().iter().map(|x| x.is_sign_negative()).collect();
    assert_eq!(signs, [false, false, true, true, false, true], "zero results take the divisor's sign");
}

#[test]
fn integer_division_by_zero_is_an_error() {
    let i = ti(&[3], &[1, 2, 3]);
    let z = ti(&[3], &[1, 0, 1]);
    assert_eq!(ops::binary(BinaryOp::Div, &i, &z), Err(KernelError::DivisionByZero));
    assert_eq!(ops::binary(BinaryOp::Rem, &i, &Tensor::scalar_i32(0)), Err(KernelError::DivisionByZero));
    assert_eq!(msg(ops::binary(BinaryOp::Div, &i, &z)), "integer division by zero");
    // i32::MIN / -1 wraps instead of panicking.
    let q = ops::binary(BinaryOp::Div, &ti(&[1], &[i32::MIN]), &ti(&[1], &[-1])).unwrap();
    assert_eq!(q.as_i32().unwrap(), &[i32::MIN]);
    // Float division by zero follows IEEE.
    let f = ops::binary(BinaryOp::Div, &t32(&[2], &[1.0, 0.0]), &t32(&[2], &[0.0, 0.0])).unwrap();
    check(&f, &[2], &[f64::INFINITY, f64::NAN], 0.0);
}

#[test]
fn integer_pow_and_float_pow() {
    let p = ops::binary(BinaryOp::Pow, &ti(&[3], &[2, -3, 5]), &ti(&[3], &[10, 3, 0])).unwrap();
    assert_eq!(p.as_i32().unwrap(), &[1024, -27, 1]);
    let e = ops::binary(BinaryOp::Pow, &ti(&[1], &[2]), &ti(&[1], &[-1]));
    assert!(matches!(e, Err(KernelError::Invalid(_))));
    let f = ops::binary(BinaryOp::Pow, &t64(&[2], &[2.0, 4.0]), &t64(&[1], &[0.5])).unwrap();
    check(&f, &[2], &[std::f64::consts::SQRT_2, 2.0], 1e-15);
}

#[test]
fn max_and_min_propagate_nan_like_numpy() {
    let a = t32(&[3], &[f32::NAN, 1.0, 2.0]);
    let b = t32(&[3], &[0.0, f32::NAN, 1.0]);
    check(&ops::binary(BinaryOp::Max, &a, &b).unwrap(), &[3], &[f64::NAN, f64::NAN, 2.0], 0.0);
    check(&ops::binary(BinaryOp::Min, &a, &b).unwrap(), &[3], &[f64::NAN, f64::NAN, 1.0], 0.0);
}

#[test]
fn logical_ops_and_comparisons_on_every_dtype() {
    let p = Tensor::from_bool(vec![4], vec![true, true, false, false]).unwrap();
    let q = Tensor::from_bool(vec![4], vec![true, false, true, false]).unwrap();
    assert_eq!(ops::binary(BinaryOp::And, &p, &q).unwrap().as_bool().unwrap(), &[true, false, false, false]);
    assert_eq!(ops::binary(BinaryOp::Or, &p, &q).unwrap().as_bool().unwrap(), &[true, true, true, false]);
    assert_eq!(ops::binary(BinaryOp::Eq, &p, &q).unwrap().as_bool().unwrap(), &[true, false, false, true]);
    let i = ti(&[3], &[1, 2, 3]);
    let ge = ops::binary(BinaryOp::Ge, &i, &Tensor::scalar_i32(2)).unwrap();
    assert_eq!(ge.as_bool().unwrap(), &[false, true, true]);
    let nan = t64(&[1], &[f64::NAN]);
    assert_eq!(ops::binary(BinaryOp::Ne, &nan, &nan).unwrap().as_bool().unwrap(), &[true]);
    assert!(ops::binary(BinaryOp::And, &i, &i).is_err());
    assert!(ops::binary(BinaryOp::Add, &p, &q).is_err());
}

#[test]
fn where_broadcasts_all_three_operands() {
    let c = Tensor::from_bool(vec![2, 1], vec![true, false]).unwrap();
    let a = t32(&[3], &[1.0, 2.0, 3.0]);
    let b = Tensor::scalar_f32(-1.0);
    let r = ops::where_(&c, &a, &b).unwrap();
    check(&r, &[2, 3], &[1.0, 2.0, 3.0, -1.0, -1.0, -1.0], 0.0);
    assert!(ops::where_(&a, &a, &b).is_err());
    assert!(ops::where_(&c, &a, &Tensor::scalar_i32(0)).is_err());
}

#[test]
fn cast_truncates_toward_zero_and_maps_bools() {
    let x = t64(&[5], &[-1.7, -0.2, 0.0, 2.9, 1e12]);
    assert_eq!(x.cast(DType::I32).as_i32().unwrap(), &[-1, 0, 0, 2, i32::MAX]);
    assert_eq!(x.cast(DType::Bool).as_bool().unwrap(), &[true, true, false, true, true]);
    let b = Tensor::from_bool(vec![2], vec![true, false]).unwrap();
    assert_eq!(b.cast(DType::F32).as_f32().unwrap(), &[1.0, 0.0]);
    assert_eq!(b.cast(DType::I32).as_i32().unwrap(), &[1, 0]);
    assert_eq!(Tensor::scalar_i32(7).cast(DType::F64).scalar_value_f64(), Some(7.0));
    assert!(Tensor::from_f32(vec![2, 2], vec![1.0]).is_err());
}

#[test]
fn long_rows_are_split_across_threads_without_changing_results() {
    // Rows longer than the parallel threshold take the segmented path of the loop planner.
    let n = 70_001;
    let v = lcg(2 * n, 9);
    let c: Vec<bool> = v.iter().map(|&x| x > 0.0).collect();
    let cond = Tensor::from_bool(vec![2, n], c.clone()).unwrap();
    let a = t64(&[2, n], &v);
    let r = ops::where_(&cond, &a, &Tensor::scalar_f64(0.0)).unwrap();
    let want: Vec<f64> = v.iter().map(|&x| if x > 0.0 { x } else { 0.0 }).collect();
    check(&r, &[2, n], &want, 0.0);
    let row = t64(&[1, n], &v[..n]);
    let b = ops::broadcast_to(&row, &[3, n]).unwrap();
    let want: Vec<f64> = (0..3 * n).map(|i| v[i % n]).collect();
    check(&b, &[3, n], &want, 0.0);
    let s = ops::binary(BinaryOp::Sub, &a, &row).unwrap();
    let want: Vec<f64> = (0..2 * n).map(|i| v[i] - v[i % n]).collect();
    check(&s, &[2, n], &want, 0.0);
}

#[test]
fn where_of_storage_only_branches_is_computed_in_f32() {
    let c = Tensor::from_vec(vec![3], vec![true, false, true]).unwrap();
    let a = Tensor::from_vec(vec![3], vec![1.5f32, 2.0, -3.0]).unwrap();
    let b = Tensor::from_vec(vec![1], vec![0.25f32]).unwrap();
    for d in [DType::Bf16, DType::F16] {
        let got = ops::where_(&c, &a.cast(d), &b.cast(d)).unwrap();
        assert_eq!(got.dtype(), d);
        assert_eq!(got.to_f64_vec(), vec![1.5, 0.25, -3.0]);
    }
}
