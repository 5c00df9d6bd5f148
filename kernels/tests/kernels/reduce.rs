//! Reductions, arg-max/min, log-sum-exp and softmax against NumPy reference values.

use kernels::ops::{self, ReduceOp};
use kernels::{DType, Tensor};

use crate::{check, lcg, t32, t64, ti};

// x = (((np.arange(24)*7) % 11 - 5).astype(np.float64).reshape(2,3,4)) / 4
fn x() -> Tensor {
    t64(
        &[2, 3, 4],
        &[
            -1.25, 0.5, -0.5, 1.25, 0.25, -0.75, 1.0, 0.0, -1.0, 0.75, -0.25, -1.25, 0.5, -0.5, 1.25, 0.25, -0.75, 1.0,
            0.0, -1.0, 0.75, -0.25, -1.25, 0.5,
        ],
    )
}

// Reference values computed once with NumPy 2.4: x.sum(axis=a, keepdims=True),
// x.mean(axis=a), x.max(axis=a), x.min(axis=a), x.prod(axis=a), x.argmax(axis=a), x.argmin(axis=a).
#[test]
fn reductions_along_each_axis_match_numpy() {
    let x = x();
    let r = |op, axis, keep| ops::reduce(op, &x, Some(axis), keep).unwrap();
    // axis 0
    check(
        &r(ReduceOp::Sum, 0, true),
        &[1, 3, 4],
        &[-0.75, 0.0, 0.75, 1.5, -0.5, 0.25, 1.0, -1.0, -0.25, 0.5, -1.5, -0.75],
        1e-15,
    );
    check(
        &r(ReduceOp::Mean, 0, false),
        &[3, 4],
        &[-0.375, 0.0, 0.375, 0.75, -0.25, 0.125, 0.5, -0.5, -0.125, 0.25, -0.75, -0.375],
        1e-15,
    );
    check(
        &r(ReduceOp::Max, 0, false),
        &[3, 4],
        &[0.5, 0.5, 1.25, 1.25, 0.25, 1.0, 1.0, 0.0, 0.75, 0.75, -0.25, 0.5],
        0.0,
    );
    check(
        &r(ReduceOp::Min, 0, false),
        &[3, 4],
        &[-1.25, -0.5, -0.5, 0.25, -0.75, -0.75, 0.0, -1.0, -1.0, -0.25, -1.25, -1.25],
        0.0,
    );
    check(
        &r(ReduceOp::Prod, 0, false),
        &[3, 4],
        &[-0.625, -0.25, -0.625, 0.3125, -0.1875, -0.75, 0.0, -0.0, -0.75, -0.1875, 0.3125, -0.625],
        1e-15,
    );
    // axis 1
    check(&r(ReduceOp::Sum, 1, true), &[2, 1, 4], &[-2.0, 0.5, 0.25, 0.0, 0.5, 0.25, 0.0, -0.25], 1e-15);
    check(
        &r(ReduceOp::Mean, 1, false),
        &[2, 4],
        &[
            -0.6666666666666666,
            0.16666666666666666,
            0.08333333333333333,
            0.0,
            0.16666666666666666,
            0.08333333333333333,
            0.0,
            -0.08333333333333333,
        ],
        1e-15,
    );
    check(&r(ReduceOp::Max, 1, false), &[2, 4], &[0.25, 0.75, 1.0, 1.25, 0.75, 1.0, 1.25, 0.5], 0.0);
    check(&r(ReduceOp::Min, 1, true), &[2, 1, 4], &[-1.25, -0.75, -0.5, -1.25, -0.75, -0.5, -1.25, -1.0], 0.0);
    check(
        &r(ReduceOp::Prod, 1, false),
        &[2, 4],
        &[0.3125, -0.28125, 0.125, -0.0, -0.28125, 0.125, -0.0, -0.125],
        1e-15,
    );
    // axis 2
    check(&r(ReduceOp::Sum, 2, true), &[2, 3, 1], &[0.0, 0.5, -1.75, 1.5, -0.75, -0.25], 1e-15);
    check(&r(ReduceOp::Mean, 2, false), &[2, 3], &[0.0, 0.125, -0.4375, 0.375, -0.1875, -0.0625], 1e-15);
    check(&r(ReduceOp::Max, 2, false), &[2, 3], &[1.25, 1.0, 0.75, 1.25, 1.0, 0.75], 0.0);
    check(&r(ReduceOp::Min, 2, false), &[2, 3], &[-1.25, -0.75, -1.25, -0.5, -1.0, -1.25], 0.0);
    check(&r(ReduceOp::Prod, 2, false), &[2, 3], &[0.390625, -0.0, -0.234375, -0.078125, 0.0, 0.1171875], 1e-15);
    // all elements: x.sum() = -0.75, x.argmax() = 3
    check(&ops::reduce(ReduceOp::Sum, &x, None, false).unwrap(), &[], &[-0.75], 1e-15);
    check(&ops::reduce(ReduceOp::Sum, &x, None, true).unwrap(), &[1, 1, 1], &[-0.75], 1e-15);
    assert_eq!(ops::argmax(&x, None, false).unwrap().as_i32().unwrap(), &[3]);
}

#[test]
fn argmax_and_argmin_match_numpy_and_first_wins() {
    let x = x();
    let am = |axis| ops::argmax(&x, Some(axis), false).unwrap();
    let an = |axis| ops::argmin(&x, Some(axis), false).unwrap();
    assert_eq!(am(0).as_i32().unwrap(), &[1, 0, 1, 0, 0, 1, 0, 0, 1, 0, 0, 1]);
    assert_eq!(an(0).as_i32().unwrap(), &[0, 1, 0, 1, 1, 0, 1, 1, 0, 1, 1, 0]);
    assert_eq!(am(1).as_i32().unwrap(), &[1, 2, 1, 0, 2, 1, 0, 2]);
    assert_eq!(an(1).as_i32().unwrap(), &[0, 1, 0, 2, 1, 0, 2, 1]);
    assert_eq!(am(2).as_i32().unwrap(), &[3, 2, 1, 2, 1, 0]);
    assert_eq!(an(2).as_i32().unwrap(), &[0, 1, 3, 1, 3, 2]);
    assert_eq!(am(2).dtype(), DType::I32);
    assert_eq!(ops::argmax(&x, Some(1), true).unwrap().shape(), &[2, 1, 4]);
    // Ties: the first occurrence wins; NaN counts as the maximum (np.argmax([1,3,3,nan,3]) = 3).
    let t = ti(&[5], &[1, 3, 3, 0, 3]);
    assert_eq!(ops::argmax(&t, Some(0), false).unwrap().as_i32().unwrap(), &[1]);
    let n = t32(&[5], &[1.0, 3.0, 3.0, f32::NAN, 3.0]);
    assert_eq!(ops::argmax(&n, Some(0), false).unwrap().as_i32().unwrap(), &[3]);
    assert!(ops::argmax(&t64(&[0], &[]), Some(0), false).is_err());
}

#[test]
fn empty_axes_and_dtype_rules() {
    let e = t64(&[2, 0], &[]);
    check(&ops::reduce(ReduceOp::Sum, &e, Some(1), false).unwrap(), &[2], &[0.0, 0.0], 0.0);
    check(&ops::reduce(ReduceOp::Prod, &e, Some(1), false).unwrap(), &[2], &[1.0, 1.0], 0.0);
    check(&ops::reduce(ReduceOp::Mean, &e, Some(1), false).unwrap(), &[2], &[f64::NAN, f64::NAN], 0.0);
    assert!(ops::reduce(ReduceOp::Max, &e, Some(1), false).is_err());
    assert!(ops::reduce(ReduceOp::Min, &e, None, false).is_err());
    let i = ti(&[2, 2], &[1, 2, 3, 4]);
    assert!(ops::reduce(ReduceOp::Mean, &i, None, false).is_err());
    assert_eq!(ops::reduce(ReduceOp::Sum, &i, Some(0), false).unwrap().as_i32().unwrap(), &[4, 6]);
    assert_eq!(ops::reduce(ReduceOp::Prod, &i, None, false).unwrap().as_i32().unwrap(), &[24]);
    let b = Tensor::from_bool(vec![3], vec![true, false, true]).unwrap();
    assert_eq!(ops::reduce(ReduceOp::Sum, &b, None, false).unwrap().as_i32().unwrap(), &[2]);
    assert_eq!(ops::reduce(ReduceOp::Max, &b, None, false).unwrap().as_bool().unwrap(), &[true]);
    assert_eq!(ops::reduce(ReduceOp::Min, &b, None, false).unwrap().as_bool().unwrap(), &[false]);
    assert!(ops::reduce(ReduceOp::Sum, &i, Some(2), false).is_err());
}

#[test]
fn large_reductions_are_accurate_and_match_a_loop() {
    // 10^6 copies of 0.1f32: a naive f32 running sum drifts by ~1%, a pairwise sum does not.
    let n = 1_000_000;
    let x = t32(&[n], &vec![0.1f32; n]);
    let s = ops::reduce(ReduceOp::Sum, &x, None, false).unwrap().scalar_value_f64().unwrap();
    assert!((s - 100_000.0).abs() < 1.0, "sum = {s}");
    // Bias-gradient shape: sum over the batch axis of [512, 300], and over the last axis.
    let (r, c) = (512, 300);
    let v = lcg(r * c, 7);
    let t = t64(&[r, c], &v);
    let cols: Vec<f64> = (0..c).map(|j| (0..r).map(|i| v[i * c + j]).sum()).collect();
    check(&ops::reduce(ReduceOp::Sum, &t, Some(0), false).unwrap(), &[c], &cols, 1e-12);
    let rows: Vec<f64> = (0..r).map(|i| v[i * c..(i + 1) * c].iter().cloned().fold(f64::MIN, f64::max)).collect();
    check(&ops::reduce(ReduceOp::Max, &t, Some(1), false).unwrap(), &[r], &rows, 0.0);
    // The same reduction with [1, r, c] (outer = 1 splits lanes across threads).
    let t3 = t.with_shape(vec![1, r, c]).unwrap();
    check(&ops::reduce(ReduceOp::Sum, &t3, Some(1), false).unwrap(), &[1, c], &cols, 1e-12);
}

// Reference values computed once with NumPy 2.4 (float64), stable formula:
//   y = [[1000,1001,1002],[-1000,-1000,-1000],[0,-inf,1]]; m = y.max(1, keepdims=True)
//   lse = m + np.log(np.exp(y-m).sum(1, keepdims=True)); softmax = np.exp(y-m)/np.exp(y-m).sum(1, keepdims=True)
#[test]
fn logsumexp_and_softmax_are_stable_for_large_values() {
    let y = t64(&[3, 3], &[1000.0, 1001.0, 1002.0, -1000.0, -1000.0, -1000.0, 0.0, f64::NEG_INFINITY, 1.0]);
    let lse = ops::logsumexp(&y, Some(1), false).unwrap();
    check(&lse, &[3], &[1002.4076059644444, -998.9013877113318, 1.3132616875182228], 1e-15);
    let sm = ops::softmax(&y, 1).unwrap();
    let want = [
        0.09003057317038046,
        0.24472847105479764,
        0.6652409557748218,
        0.3333333333333333,
        0.3333333333333333,
        0.3333333333333333,
        0.2689414213699951,
        0.0,
        0.7310585786300049,
    ];
    check(&sm, &[3, 3], &want, 1e-15);
    let lsm = ops::log_softmax(&y, 1).unwrap();
    let want = [
        -2.4076059644444285,
        -1.4076059644444285,
        -0.40760596444442854,
        -1.0986122886681642,
        -1.0986122886681642,
        -1.0986122886681642,
        -1.3132616875182228,
        f64::NEG_INFINITY,
        -0.3132616875182228,
    ];
    // NumPy's `y - lse` cancels against a rounded 1002.4076…, so it is only good to ~1e-13.
    check(&lsm, &[3, 3], &want, 1e-12);
    // Along axis 0 (strided lanes): m + log(sum(exp(y[:2]-m), 0)) = [1000, 1001, 1002].
    let y2 = ops::slice(&y, &[kernels::ops::SliceSpec::Range { start: 0, end: 2 }]).unwrap();
    check(&ops::logsumexp(&y2, Some(0), true).unwrap(), &[1, 3], &[1000.0, 1001.0, 1002.0], 1e-15);
    // f32 with 1000.0 must not overflow either.
    let f = t32(&[2], &[1000.0, 1000.0]);
    check(&ops::softmax(&f, 0).unwrap(), &[2], &[0.5, 0.5], 0.0);
    check(&ops::logsumexp(&f, None, false).unwrap(), &[], &[1000.6931471805599], 1e-7);
}

#[test]
fn logsumexp_of_all_neg_infinity_is_neg_infinity() {
    let y = t32(&[2, 2], &[f32::NEG_INFINITY, f32::NEG_INFINITY, f32::INFINITY, 0.0]);
    let lse = ops::logsumexp(&y, Some(1), false).unwrap();
    check(&lse, &[2], &[f64::NEG_INFINITY, f64::INFINITY], 0.0);
    assert!(ops::logsumexp(&ti(&[1], &[1]), None, false).is_err());
}

#[test]
fn softmax_along_a_middle_axis_sums_to_one() {
    let v = lcg(2 * 5 * 3, 11);
    let t = t32(&[2, 5, 3], &v.iter().map(|&x| (x * 50.0) as f32).collect::<Vec<_>>());
    let s = ops::softmax(&t, 1).unwrap();
    let sums = ops::reduce(ReduceOp::Sum, &s, Some(1), false).unwrap();
    check(&sums, &[2, 3], &[1.0; 6], 1e-6);
    // Equals softmax of the permuted tensor along its last axis.
    let p = ops::permute(&t, &[0, 2, 1]).unwrap();
    let s2 = ops::permute(&ops::softmax(&p, 2).unwrap(), &[0, 2, 1]).unwrap();
    assert_eq!(s, s2);
}

#[test]
fn cumsum_along_axes() {
    let t = ti(&[2, 3], &[1, 2, 3, 4, 5, 6]);
    assert_eq!(ops::cumsum(&t, 1).unwrap().as_i32().unwrap(), &[1, 3, 6, 4, 9, 15]);
    assert_eq!(ops::cumsum(&t, 0).unwrap().as_i32().unwrap(), &[1, 2, 3, 5, 7, 9]);
}
