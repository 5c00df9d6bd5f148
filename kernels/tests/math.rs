//! msl's own `f32` tanh against the correctly rounded one (f64 `tanh` rounded to f32), over
//! a dense sample of every binade: the error is at most 7 ulp (measured: 7, near 5.77 where tanh is within 2e-5 of 1), special values behave, and it is odd.

use kernels::math::{exp_f32, tanh_f32};

/// Every STEP-th bit pattern: dense in every binade (optimised builds check ~300 million
/// values, debug builds, as in CI, ~2 million).
const STEP: usize = if cfg!(debug_assertions) { 1021 } else { 7 };

fn ulps(a: f32, b: f32) -> u32 {
    let key = |x: f32| {
        let i = x.to_bits() as i32;
        if i < 0 {
            i32::MIN.wrapping_sub(i)
        } else {
            i
        }
    };
    key(a).abs_diff(key(b))
}

#[test]
fn tanh_f32_is_within_a_few_ulp_of_correctly_rounded_everywhere() {
    let mut worst = (0u32, 0f32);
    for bits in (0u32..0x7f80_0000).step_by(STEP) {
        for x in [f32::from_bits(bits), -f32::from_bits(bits)] {
            let want = (x as f64).tanh() as f32;
            let got = tanh_f32(x);
            let u = ulps(got, want);
            if u > worst.0 {
                worst = (u, x);
            }
        }
    }
    println!("tanh_f32: max error {} ulp at x = {:e}", worst.0, worst.1);
    assert!(worst.0 <= 7, "max error {} ulp at {:e}", worst.0, worst.1);
}

#[test]
fn tanh_f32_special_values() {
    assert_eq!(tanh_f32(0.0).to_bits(), 0.0f32.to_bits());
    assert_eq!(tanh_f32(-0.0).to_bits(), (-0.0f32).to_bits());
    assert_eq!(tanh_f32(f32::INFINITY), 1.0);
    assert_eq!(tanh_f32(f32::NEG_INFINITY), -1.0);
    assert_eq!(tanh_f32(10.0), 1.0);
    assert_eq!(tanh_f32(-8.0), -1.0);
    assert!(tanh_f32(f32::NAN).is_nan());
    for x in [1e-3f32, 0.1, 0.5, 1.0, 2.0, 3.3] {
        assert_eq!(tanh_f32(-x), -tanh_f32(x));
    }
}

#[test]
fn exp_f32_is_within_2_ulp_of_correctly_rounded_for_normal_results() {
    let (mut worst, mut worst_sub) = ((0u32, 0f32), (0u32, 0f32));
    for bits in (0u32..0x7f80_0000).step_by(STEP) {
        for x in [f32::from_bits(bits), -f32::from_bits(bits)] {
            if !(-104.0..89.0).contains(&x) {
                continue;
            }
            let want = (x as f64).exp() as f32;
            let u = ulps(exp_f32(x), want);
            let slot = if want.is_normal() || want.is_infinite() { &mut worst } else { &mut worst_sub };
            if u > slot.0 {
                *slot = (u, x);
            }
        }
    }
    println!(
        "exp_f32: max error {} ulp at x = {:e}; subnormal results {} ulp at {:e}",
        worst.0, worst.1, worst_sub.0, worst_sub.1
    );
    assert!(worst.0 <= 2, "max error {} ulp at {:e}", worst.0, worst.1);
    // A subnormal result has fewer bits; it is still within one unit of its last place.
    assert!(worst_sub.0 <= 1, "subnormal results: {} ulp at {:e}", worst_sub.0, worst_sub.1);
}

#[test]
fn exp_f32_special_values() {
    assert_eq!(exp_f32(0.0), 1.0);
    assert_eq!(exp_f32(-0.0), 1.0);
    assert_eq!(exp_f32(f32::INFINITY), f32::INFINITY);
    assert_eq!(exp_f32(f32::NEG_INFINITY), 0.0);
    assert_eq!(exp_f32(89.0), f32::INFINITY);
    assert_eq!(exp_f32(-104.0), 0.0);
    assert!(exp_f32(f32::NAN).is_nan());
    assert_eq!(exp_f32(1.0), std::f32::consts::E);
}
