//! Rust functions the generated loops call for transcendental operations.
//!
//! The CPU kernels compute `ln`, `sin`, `cos`, `powf`, `%` and f64 `exp` and `tanh` with Rust's
//! `f32` and `f64` methods, which call the C library, and `erf` with the `libm` crate (f32 `exp` and `tanh` are msl's own,
//! generated inline); calling the very same methods from the fused
//! loop keeps the JIT bit-identical to the interpreter. The vector forms take a pointer to one
//! vector's lanes in memory (a stack slot of the generated function) and work in place, so a
//! vector loop pays one call per vector rather than one per lane.

macro_rules! unary_helpers {
    ($($name:ident, $vname:ident, $t:ty, $lanes:expr, $op:expr, $f:expr;)*) => {
        $(
            extern "C" fn $name(x: $t) -> $t {
                let f: fn($t) -> $t = $f;
                f(x)
            }
            /// # Safety
            /// `p` points to `$lanes` initialised, writable elements.
            unsafe extern "C" fn $vname(p: *mut $t) {
                let f: fn($t) -> $t = $f;
                for i in 0..$lanes {
                    // SAFETY: the generated code passes a stack slot of `$lanes` elements.
                    unsafe { *p.add(i) = f(*p.add(i)) };
                }
            }
        )*
        /// Every unary helper: (operation, element type, scalar symbol and address, vector
        /// symbol and address).
        pub(crate) fn unary() -> Vec<Helper> {
            vec![
            $(($op, <$t as Elem>::DTYPE, stringify!($name), $name as extern "C" fn($t) -> $t as usize,
               stringify!($vname), $vname as unsafe extern "C" fn(*mut $t) as usize),)*
            ]
        }
    };
}

macro_rules! binary_helpers {
    ($($name:ident, $vname:ident, $t:ty, $lanes:expr, $op:expr, $f:expr;)*) => {
        $(
            extern "C" fn $name(x: $t, y: $t) -> $t {
                let f: fn($t, $t) -> $t = $f;
                f(x, y)
            }
            /// # Safety
            /// `p` and `q` point to `$lanes` initialised elements each; `p` is writable.
            unsafe extern "C" fn $vname(p: *mut $t, q: *const $t) {
                let f: fn($t, $t) -> $t = $f;
                for i in 0..$lanes {
                    // SAFETY: the generated code passes two stack slots of `$lanes` elements.
                    unsafe { *p.add(i) = f(*p.add(i), *q.add(i)) };
                }
            }
        )*
        /// Every binary helper, as for [`unary`].
        pub(crate) fn binary() -> Vec<Helper> {
            vec![
            $(($op, <$t as Elem>::DTYPE, stringify!($name), $name as extern "C" fn($t, $t) -> $t as usize,
               stringify!($vname), $vname as unsafe extern "C" fn(*mut $t, *const $t) as usize),)*
            ]
        }
    };
}

use kernels::Element as Elem;

type Helper = (&'static str, kernels::DType, &'static str, usize, &'static str, usize);

unary_helpers! {
    msl_log_f32, msl_log_f32x4, f32, 4, "log", f32::ln;
    msl_sin_f32, msl_sin_f32x4, f32, 4, "sin", f32::sin;
    msl_cos_f32, msl_cos_f32x4, f32, 4, "cos", f32::cos;
    msl_erf_f32, msl_erf_f32x4, f32, 4, "erf", libm::erff;
    msl_exp_f64, msl_exp_f64x2, f64, 2, "exp", f64::exp;
    msl_log_f64, msl_log_f64x2, f64, 2, "log", f64::ln;
    msl_tanh_f64, msl_tanh_f64x2, f64, 2, "tanh", f64::tanh;
    msl_sin_f64, msl_sin_f64x2, f64, 2, "sin", f64::sin;
    msl_cos_f64, msl_cos_f64x2, f64, 2, "cos", f64::cos;
    msl_erf_f64, msl_erf_f64x2, f64, 2, "erf", libm::erf;
}

binary_helpers! {
    msl_pow_f32, msl_pow_f32x4, f32, 4, "pow", f32::powf;
    msl_rem_f32, msl_rem_f32x4, f32, 4, "rem", kernels::math::rem_floor_f32;
    msl_pow_f64, msl_pow_f64x2, f64, 2, "pow", f64::powf;
    msl_rem_f64, msl_rem_f64x2, f64, 2, "rem", kernels::math::rem_floor_f64;
}

/// The (scalar, vector) symbols of the helper computing `op` on `dt`.
pub(crate) fn symbols(op: &str, dt: kernels::DType) -> Option<(&'static str, &'static str)> {
    unary().into_iter().chain(binary()).find(|h| h.0 == op && h.1 == dt).map(|h| (h.2, h.4))
}

/// Every helper symbol with its address, for the JIT's symbol table.
pub(crate) fn all_symbols() -> impl Iterator<Item = (&'static str, usize)> {
    unary().into_iter().chain(binary()).flat_map(|h| [(h.2, h.3), (h.4, h.5)])
}
