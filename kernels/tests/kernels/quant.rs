//! Int8 quantization: the per-channel error bound, the file round trip, the int8 product against
//! an exact integer reference (VNNI and the portable loop agree bit for bit) and against f32.

use kernels::ops;
use kernels::{QuantMatrix, Tensor};

use crate::lcg;

fn matrix(rows: usize, cols: usize, seed: u64) -> Tensor {
    Tensor::from_f32(vec![rows, cols], lcg(rows * cols, seed).into_iter().map(|x| x as f32).collect()).unwrap()
}

#[test]
fn each_weight_is_within_half_a_step_of_its_channel_scale() {
    let w = matrix(37, 9, 1);
    let q = QuantMatrix::quantize(&w).unwrap();
    let d = q.dequantize();
    let (wv, dv) = (w.as_f32().unwrap(), d.as_f32().unwrap());
    for (i, (&a, &b)) in wv.iter().zip(dv).enumerate() {
        let s = q.scales()[i % 9];
        assert!((a - b).abs() <= s / 2.0 + 1e-7, "weight {i}: {a} vs {b} (scale {s})");
    }
    // The largest weight of each channel is exact (±127 steps).
    for o in 0..9 {
        let top = (0..37).map(|i| wv[i * 9 + o].abs()).fold(0f32, f32::max);
        assert!((q.scales()[o] * 127.0 - top).abs() <= 1e-6 * top);
    }
    assert_eq!(q.bytes(), 37 * 9 + 4 * 9);
    let back = QuantMatrix::from_parts(37, 9, &q.values(), q.scales().to_vec()).unwrap();
    assert_eq!(back, q, "values() and from_parts() round trip");
}

#[test]
fn a_zero_channel_and_bad_weights() {
    let mut v = vec![0.5f32; 12];
    for i in 0..4 {
        v[i * 3 + 1] = 0.0;
    }
    let q = QuantMatrix::quantize(&Tensor::from_f32(vec![4, 3], v.clone()).unwrap()).unwrap();
    assert_eq!(q.scales()[1], 0.0);
    assert_eq!(q.dequantize().as_f32().unwrap(), &v[..]);
    v[5] = f32::NAN;
    let e = QuantMatrix::quantize(&Tensor::from_f32(vec![4, 3], v).unwrap()).unwrap_err();
    assert_eq!(e.to_string(), "quantize: the weight at [1, 2] is NaN");
}

#[test]
fn int8_product_is_exact_in_integers_and_close_to_f32() {
    for (n, i, o) in [(1, 64, 130), (5, 200, 33), (70, 17, 8), (3, 0, 4)] {
        let x = matrix(n, i, 7 + o as u64);
        let w = matrix(i, o, 9 + n as u64);
        let q = QuantMatrix::quantize(&w).unwrap();
        let fast = ops::matmul_i8(&x, &q).unwrap();
        let portable = ops::matmul_i8_portable(&x, &q).unwrap();
        assert_eq!(fast.as_f32().unwrap(), portable.as_f32().unwrap(), "VNNI and the loop agree ({n}, {i}, {o})");
        // Against the product in f32: error relative to Σ|x||w| stays at int8 resolution.
        let exact = ops::matmul(&x, &w).unwrap();
        let (xv, wv) = (x.as_f32().unwrap(), w.as_f32().unwrap());
        for r in 0..n {
            for c in 0..o {
                let mag: f32 = (0..i).map(|k| (xv[r * i + k] * wv[k * o + c]).abs()).sum();
                let (a, b) = (fast.as_f32().unwrap()[r * o + c], exact.as_f32().unwrap()[r * o + c]);
                assert!((a - b).abs() <= 0.02 * mag + 1e-6, "({r}, {c}): {a} vs {b}, Σ|xw| = {mag}");
            }
        }
    }
    // A row with NaN gives NaN; a row of zeros gives zeros; leading dims are kept.
    let x = Tensor::from_f32(vec![2, 1, 2], vec![f32::NAN, 1.0, 0.0, 0.0]).unwrap();
    let q = QuantMatrix::quantize(&matrix(2, 3, 4)).unwrap();
    let y = ops::matmul_i8(&x, &q).unwrap();
    assert_eq!(y.shape(), &[2, 1, 3]);
    assert!(y.as_f32().unwrap()[..3].iter().all(|v| v.is_nan()));
    assert_eq!(&y.as_f32().unwrap()[3..], &[0.0, 0.0, 0.0]);
    assert!(ops::matmul_i8(&matrix(2, 5, 1), &q).is_err(), "inner sizes differ");
}
