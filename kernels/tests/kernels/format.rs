//! How values print: shortest round-trip floats, nested lists and NumPy-style elision.

use kernels::format::format_tensor;
use kernels::ops;
use kernels::{DType, Tensor};

use crate::{t32, ti};

#[test]
fn scalars_print_like_python() {
    let f = |v: f32| format_tensor(&Tensor::scalar_f32(v));
    assert_eq!(f(std::f32::consts::LN_2), "0.6931472");
    assert_eq!(f(4.0), "4.0");
    assert_eq!(f(f32::NEG_INFINITY), "-inf");
    assert_eq!(f(f32::INFINITY), "inf");
    assert_eq!(f(f32::NAN), "nan");
    assert_eq!(f(-0.5), "-0.5");
    assert_eq!(f(1e20), "1e+20");
    assert_eq!(f(1.5e-7), "1.5e-07");
    assert_eq!(f(0.1), "0.1");
    assert_eq!(format_tensor(&Tensor::scalar_f64(std::f64::consts::LN_2)), "0.6931471805599453");
    assert_eq!(format_tensor(&Tensor::scalar_f64(0.1 + 0.2)), "0.30000000000000004");
    assert_eq!(format_tensor(&Tensor::scalar_f64(1e16)), "1e+16");
    assert_eq!(format_tensor(&Tensor::scalar_f64(1e15)), "1000000000000000.0");
    assert_eq!(format_tensor(&Tensor::scalar_i32(12)), "12");
    assert_eq!(format_tensor(&Tensor::scalar_bool(true)), "true");
    assert_eq!(format_tensor(&Tensor::scalar_bool(false)), "false");
}

#[test]
fn tensors_print_as_nested_lists() {
    assert_eq!(format_tensor(&ti(&[2, 2], &[1, 2, 3, 4])), "[[1, 2], [3, 4]]");
    assert_eq!(format_tensor(&t32(&[3], &[0.5, 1.0, -2.25])), "[0.5, 1.0, -2.25]");
    assert_eq!(format_tensor(&t32(&[0], &[])), "[]");
    assert_eq!(format_tensor(&t32(&[2, 0], &[])), "[[], []]");
    let b = Tensor::from_bool(vec![1, 2], vec![true, false]).unwrap();
    assert_eq!(format_tensor(&b), "[[true, false]]");
}

#[test]
fn large_tensors_are_elided_with_three_edge_items() {
    let x = ops::arange(1000, DType::F32).unwrap();
    assert!(format_tensor(&x).ends_with("999.0]"));
    assert!(!format_tensor(&x).contains("..."));
    let x = ops::arange(1001, DType::F32).unwrap();
    assert_eq!(format_tensor(&x), "[0.0, 1.0, 2.0, ..., 998.0, 999.0, 1000.0]");
    let m = ops::reshape(&ops::arange(2000, DType::I32).unwrap(), &[100, 20]).unwrap();
    assert_eq!(
        format_tensor(&m),
        "[[0, 1, 2, ..., 17, 18, 19], [20, 21, 22, ..., 37, 38, 39], [40, 41, 42, ..., 57, 58, 59], ..., \
         [1940, 1941, 1942, ..., 1957, 1958, 1959], [1960, 1961, 1962, ..., 1977, 1978, 1979], \
         [1980, 1981, 1982, ..., 1997, 1998, 1999]]"
    );
    // Short axes are not elided even when the tensor is large.
    let t = ops::reshape(&ops::arange(1200, DType::I32).unwrap(), &[2, 600]).unwrap();
    let s = format_tensor(&t);
    assert!(s.starts_with("[[0, 1, 2, ..., 597, 598, 599], [600, 601, 602, ..., 1197, 1198, 1199]]"));
}
