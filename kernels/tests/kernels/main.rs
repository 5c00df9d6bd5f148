//! Integration tests of the kernels crate, one module per concern, built as one test binary.

mod attention;
mod conv;
mod device;
mod einsum;
mod elementwise;
mod format;
mod io;
// FIFOs, devices and symbolic links are Unix things.
#[cfg(unix)]
mod io_safety;
mod matmul;
mod no_panic;
mod quant;
mod reduce;
mod rng;
mod shape_index;
mod sizes;
mod sort;
mod views;

use kernels::{KernelError, Tensor};

/// An f32 tensor from a shape and values.
pub fn t32(shape: &[usize], v: &[f32]) -> Tensor {
    Tensor::from_f32(shape.to_vec(), v.to_vec()).unwrap()
}

/// An f64 tensor from a shape and values.
pub fn t64(shape: &[usize], v: &[f64]) -> Tensor {
    Tensor::from_f64(shape.to_vec(), v.to_vec()).unwrap()
}

/// An i32 tensor from a shape and values.
pub fn ti(shape: &[usize], v: &[i32]) -> Tensor {
    Tensor::from_i32(shape.to_vec(), v.to_vec()).unwrap()
}

/// Checks shape and values: each value within `tol` relative to max(1, |want|).
/// NaN matches NaN and infinities must match exactly.
#[track_caller]
pub fn check(got: &Tensor, shape: &[usize], want: &[f64], tol: f64) {
    assert_eq!(got.shape(), shape, "shape");
    let g = got.to_f64_vec();
    assert_eq!(g.len(), want.len(), "length");
    for (i, (&a, &b)) in g.iter().zip(want).enumerate() {
        let ok = if b.is_nan() {
            a.is_nan()
        } else if b.is_infinite() {
            a == b
        } else {
            (a - b).abs() <= tol * b.abs().max(1.0)
        };
        assert!(ok, "element {i}: got {a}, want {b} (all: {g:?})");
    }
}

/// A deterministic pseudo-random f64 vector in [-1, 1) (a tiny LCG, independent of the crate).
pub fn lcg(n: usize, seed: u64) -> Vec<f64> {
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
        })
        .collect()
}

/// The error's user-facing message.
pub fn msg<T: std::fmt::Debug>(r: Result<T, KernelError>) -> String {
    r.expect_err("expected an error").to_string()
}
