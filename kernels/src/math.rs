//! msl's own `f32` transcendental functions: defined here operation by operation (no fused
//! multiply-add, no library call), so the interpreter's kernels and the JIT's generated vector
//! code compute them with the same instructions and get the same bits.
//!
//! `exp_f32` is Cephes' `expf` with round-to-nearest: `n = round(x·log₂e)`, `r = x − n·ln2` in two parts
//! (Cody–Waite), a degree-7 polynomial for `e^r`, and the scaling by `2ⁿ` as two exact
//! multiplications by powers of two built from their bits (so that subnormal results round
//! once); `+∞` above 88.72 and `0` below −103.97. It is within 2 ulp of the correctly rounded
//! `exp` for normal results (`kernels/tests/math.rs`).
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

/// The polynomial with coefficients `cs` (highest power first) at `x`: `p = p * x + c`, a
/// multiplication then an addition (Rust never fuses them), as the JIT emits it.
#[inline(always)]
fn horner(cs: &[f32], x: f32) -> f32 {
    let mut p = cs[0];
    for c in &cs[1..] {
        p = p * x + c;
    }
    p
}

/// `tanh` in `f32`, the same bits in the kernels and in JIT-compiled code.
#[inline(always)]
pub fn tanh_f32(a: f32) -> f32 {
    // NaN stays NaN (as in the JIT's two selects).
    let x = a.clamp(-TANH_CLAMP, TANH_CLAMP);
    let x2 = x * x;
    let r = horner(&TANH_P, x2) * x / horner(&TANH_Q, x2);
    if a.abs() < TANH_TINY {
        a
    } else {
        r
    }
}

/// Above this `exp` overflows to `+∞` in `f32`.
pub const EXP_MAX: f32 = 88.722_84;
/// Below this `exp` underflows to `0` in `f32`.
pub const EXP_MIN: f32 = -103.972_08;
pub const LOG2E: f32 = std::f32::consts::LOG2_E;
/// 1.5 · 2²³: adding it rounds an `f32` below 2²² in magnitude to an integer, kept in the low
/// bits of the sum's mantissa.
pub const ROUNDER: f32 = 12_582_912.0;
/// ln 2 in two parts: `LN2_HI` has few enough bits that `n · LN2_HI` is exact.
pub const LN2_HI: f32 = 0.693_359_4;
pub const LN2_LO: f32 = -2.121_944_4e-4;
/// The polynomial of `(e^r − 1 − r) / r²`, highest power first.
pub const EXP_P: [f32; 6] = [1.987_569_1e-4, 1.398_199_9e-3, 8.333_452e-3, 4.166_579_6e-2, 1.666_666_5e-1, 0.5];

/// `exp` in `f32`, the same bits in the kernels and in JIT-compiled code.
#[inline(always)]
pub fn exp_f32(x: f32) -> f32 {
    // n = x·log₂e rounded to nearest by the 1.5·2²³ trick: t's low mantissa bits hold n, so
    // neither a floor nor a float-to-int conversion is needed (both are slow or library calls
    // without SSE4.1, and would stop vectorisation). Out of range, the result is replaced below.
    let t = x * LOG2E + ROUNDER;
    let n = t - ROUNDER;
    let r = x - n * LN2_HI;
    let r = r - n * LN2_LO;
    let z = r * r;
    let y = horner(&EXP_P, r) * z + r + 1.0;
    // 2^n as 2^(n/2) · 2^(n - n/2): both factors are normal for every n that matters here.
    let ni = (t.to_bits() as i32).wrapping_sub(ROUNDER.to_bits() as i32);
    let n1 = ni >> 1;
    let n2 = ni.wrapping_sub(n1);
    let s1 = f32::from_bits((n1.wrapping_add(127) as u32) << 23);
    let s2 = f32::from_bits((n2.wrapping_add(127) as u32) << 23);
    let v = y * s1 * s2;
    if x > EXP_MAX {
        f32::INFINITY
    } else if x < EXP_MIN {
        0.0
    } else {
        v
    }
}

/// Python's and NumPy's integer division: the quotient rounded toward negative infinity
/// (`-7 / 2 == -4`), wrapping at `i32::MIN / -1`. `b` must not be 0.
pub fn div_floor_i32(a: i32, b: i32) -> i32 {
    let q = a.wrapping_div(b);
    if (a.wrapping_rem(b) != 0) && ((a ^ b) < 0) {
        q - 1
    } else {
        q
    }
}

/// Python's and NumPy's integer remainder: the sign of the divisor (`-7 % 3 == 2`), so that
/// `a == (a / b) * b + a % b`. `b` must not be 0.
pub fn rem_floor_i32(a: i32, b: i32) -> i32 {
    let r = a.wrapping_rem(b);
    if r != 0 && ((r ^ b) < 0) {
        r + b
    } else {
        r
    }
}

macro_rules! rem_floor_float {
    ($name:ident, $t:ty) => {
        /// Python's and NumPy's float remainder (`numpy.remainder`): the sign of the divisor
        /// (`-7.0 % 3.0 == 2.0`), a zero result signed like the divisor.
        pub fn $name(a: $t, b: $t) -> $t {
            let r = a % b;
            if r == 0.0 {
                (0.0 as $t).copysign(b)
            } else if (r < 0.0) != (b < 0.0) {
                r + b
            } else {
                r
            }
        }
    };
}
rem_floor_float!(rem_floor_f32, f32);
rem_floor_float!(rem_floor_f64, f64);
