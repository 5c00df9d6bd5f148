//! msl's own `f32` transcendental functions: defined here operation by operation (no fused
//! multiply-add, no library call), so the interpreter's kernels and the JIT's generated vector
//! code compute them with the same instructions and get the same bits.
//!
//! `tanh_f32` is a rational minimax approximation `x·P(x²)/Q(x²)` on `[-c, c]` (the form and
//! coefficients of Eigen's `ptanh_float`), with `c` the point beyond which `tanh` rounds to ±1
//! in `f32`, and `x` itself below 4·10⁻⁴. Its error against the correctly rounded `tanh` is at
//! most 7 units in the last place (4·10⁻⁷ relative, near |x| = 5.8; `kernels/tests/math.rs`
//! sweeps every binade). glibc's `tanhf` is not vectorisable and was 95 % of a fused `gelu`.

/// `tanh` is ±1 in `f32` beyond this.
pub const TANH_CLAMP: f32 = 7.905_311;
/// Below this magnitude `tanh(x)` rounds to `x`.
pub const TANH_TINY: f32 = 0.0004;
/// Numerator coefficients, highest power first: α13, α11, …, α1 (odd powers).
pub const TANH_P: [f32; 7] =
    [-2.760_768_5e-16, 2.000_188e-13, -8.604_672e-11, 5.122_297e-8, 1.485_722_4e-5, 6.372_619_3e-4, 4.893_524_6e-3];
/// Denominator coefficients, highest power first: β6, β4, β2, β0 (even powers).
pub const TANH_Q: [f32; 4] = [1.198_258_4e-6, 1.185_347_1e-4, 2.268_434_7e-3, 4.893_525e-3];

/// `tanh` in `f32`, the same bits in the kernels and in JIT-compiled code.
#[inline(always)]
pub fn tanh_f32(a: f32) -> f32 {
    // NaN stays NaN (as in the JIT's two selects).
    let x = a.clamp(-TANH_CLAMP, TANH_CLAMP);
    let x2 = x * x;
    let mut p = TANH_P[0];
    for c in &TANH_P[1..] {
        p = p * x2 + c;
    }
    let p = p * x;
    let mut q = TANH_Q[0];
    for c in &TANH_Q[1..] {
        q = q * x2 + c;
    }
    let r = p / q;
    if a.abs() < TANH_TINY {
        a
    } else {
        r
    }
}
