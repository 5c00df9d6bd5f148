//! Run-time dispatch of the hot loops to an AVX2 build of themselves.
//!
//! msl is compiled for the x86-64 baseline (SSE2, 128-bit vectors), which runs everywhere. Each
//! hot loop of the CPU kernels (elementwise maps, broadcast rows, reductions, softmax rows) is
//! entered through [`vectorized`], which calls it inside a function compiled with AVX2 and FMA
//! enabled when the CPU has them: the loop, inlined there, is vectorised 8 lanes wide. Rust never
//! fuses a multiplication and an addition into an FMA, and reductions keep their explicit
//! accumulator order, so both builds compute the same bits (`kernels/tests/simd.rs` checks it).
//! `MSL_SIMD=baseline` in the environment, or [`set_avx2`], keeps the baseline build.

use std::sync::atomic::{AtomicU8, Ordering};

const UNKNOWN: u8 = 0;
const OFF: u8 = 1;
const ON: u8 = 2;

static AVX2: AtomicU8 = AtomicU8::new(UNKNOWN);

/// Whether [`vectorized`] runs loops in their AVX2 build.
pub fn avx2_enabled() -> bool {
    match AVX2.load(Ordering::Relaxed) {
        ON => true,
        OFF => false,
        _ => {
            let on = detected() && std::env::var("MSL_SIMD").map_or(true, |v| v != "baseline");
            AVX2.store(if on { ON } else { OFF }, Ordering::Relaxed);
            on
        }
    }
}

/// Uses the AVX2 build (when the CPU has AVX2 and FMA) or the baseline one from now on;
/// benchmarks and tests compare the two in one process.
pub fn set_avx2(on: bool) {
    AVX2.store(if on && detected() { ON } else { OFF }, Ordering::Relaxed);
}

/// The name of the build [`vectorized`] uses, for `--explain` and benchmark tables.
pub fn level() -> &'static str {
    if avx2_enabled() {
        "avx2"
    } else {
        "baseline (sse2)"
    }
}

#[cfg(target_arch = "x86_64")]
fn detected() -> bool {
    std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")
}

#[cfg(not(target_arch = "x86_64"))]
fn detected() -> bool {
    false
}

/// Runs `f` in the AVX2 build when it is enabled. `f` is inlined into the AVX2 function, so the
/// loops it holds are compiled for AVX2 there; it must not call out to non-inlined code in its
/// hot path for this to help.
#[inline(always)]
pub(crate) fn vectorized<R>(f: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    if avx2_enabled() {
        // SAFETY: `avx2_enabled` is only true when the CPU reports AVX2 and FMA.
        return unsafe { with_avx2(f) };
    }
    f()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn with_avx2<R>(f: impl FnOnce() -> R) -> R {
    f()
}
