//! The storage-only types `bf16` and `f16`: conversions round to nearest even, operations are
//! computed in f32 and rounded once, sums accumulate in f32, values print as their shortest
//! round-trip decimal, and files keep their 2-byte elements.

use kernels::format::{format_half, format_tensor_with};
use kernels::ops::{self, BinaryOp, ReduceOp};
use kernels::{DType, Tensor};

fn bf16s(v: &[f32]) -> Tensor {
    Tensor::from_f32(vec![v.len()], v.to_vec()).unwrap().cast(DType::Bf16)
}

fn f32s(t: &Tensor) -> Vec<f32> {
    t.cast(DType::F32).as_f32().unwrap().to_vec()
}

#[test]
fn conversions_round_to_nearest_even() {
    let e = 2f32.powi(-8);
    // 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: even is 1. 1 + 3·2^-8 rounds up to even.
    let t = bf16s(&[1.0 + e, 1.0 + 3.0 * e, 1.0 + 1.5 * e, f32::INFINITY, -0.0, 3.0e38, f32::MAX]);
    let back = f32s(&t);
    assert_eq!(back[..3], [1.0, 1.0 + 4.0 * e, 1.0 + 2.0 * e]);
    assert_eq!(back[3], f32::INFINITY);
    assert!(back[4] == 0.0 && back[4].is_sign_negative());
    assert!(back[5].is_finite() && back[6].is_infinite(), "{back:?}");
    let nan = bf16s(&[f32::NAN]);
    assert!(f32s(&nan)[0].is_nan());
    // f16: 65504 is the largest finite value; 2^-24 the smallest subnormal, and half of it
    // ties to even (zero).
    let h = Tensor::from_f32(vec![4], vec![65504.0, 65520.0, 2f32.powi(-24), 2f32.powi(-25)]).unwrap().cast(DType::F16);
    assert_eq!(h.dtype(), DType::F16);
    assert_eq!(f32s(&h), [65504.0, f32::INFINITY, 2f32.powi(-24), 0.0]);
    assert_eq!(h.storage().len() * h.dtype().size_in_bytes(), 8, "two bytes an element");
}

#[test]
fn operations_compute_in_f32_and_round_once() {
    let a = bf16s(&[256.0, 1.0, 3.0]);
    let b = bf16s(&[1.0, 0.001, 7.0]);
    let s = ops::binary(BinaryOp::Add, &a, &b).unwrap();
    assert_eq!(s.dtype(), DType::Bf16);
    // 257 ties between 256 and 258 (even: 256); 1.001 rounds to 1; 10 is exact.
    assert_eq!(f32s(&s), [256.0, 1.0, 10.0]);
    let q = ops::binary(BinaryOp::Div, &b, &a).unwrap();
    let want: Vec<f32> =
        [1.0f32 / 256.0, 0.0009994507 / 1.0, 7.0 / 3.0].iter().map(|x| half::bf16::from_f32(*x).to_f32()).collect();
    assert_eq!(f32s(&q), want);
    // A thousand bf16(0.001) summed one by one in bf16 would stall near 0.5 (its spacing
    // there exceeds the addend); accumulated in f32 the sum is 0.99945, rounded once to 1.
    let many = ops::binary(BinaryOp::Mul, &bf16s(&[1.0; 1000]), &bf16s(&[0.001])).unwrap();
    let total = ops::reduce(ReduceOp::Sum, &many, None, false).unwrap();
    assert_eq!(total.dtype(), DType::Bf16);
    assert_eq!(f32s(&total), [1.0]);
    let wide = ops::reduce(ReduceOp::Sum, &many.cast(DType::F32), None, false).unwrap();
    assert!((wide.as_f32().unwrap()[0] - 0.99945).abs() < 1e-5);
    // Shape operations keep the storage type and its bytes.
    let c = ops::concat(&[a.clone(), b.clone()], 0).unwrap();
    assert_eq!((c.dtype(), f32s(&c)), (DType::Bf16, vec![256.0, 1.0, 3.0, 1.0, 0.0009994507, 7.0]));
}

#[test]
fn values_print_as_their_shortest_round_trip_decimal() {
    let r16 = |x: f32| half::bf16::from_f32(x).to_f32();
    assert_eq!(format_half(r16(0.1), r16), "0.1");
    assert_eq!(format_half(r16(1.0 / 3.0), r16), "0.334");
    let rh = |x: f32| half::f16::from_f32(x).to_f32();
    assert_eq!(format_half(65504.0, rh), "65500.0");
    assert_eq!(format_half(f32::INFINITY, rh), "inf");
    assert_eq!(format_tensor_with(&bf16s(&[0.1, -2.5]), None), "[0.1, -2.5]");
    assert_eq!(format_tensor_with(&bf16s(&[0.1]), Some(4)), "[0.1001]");
}

#[test]
fn files_keep_two_byte_elements() {
    let dir = std::env::temp_dir().join(format!("msl-half-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let t = bf16s(&[0.1, 1.5, -3.0]);
    let p = dir.join("t.safetensors");
    kernels::io::save_safetensors(&p, &[("t".into(), t.clone())]).unwrap();
    let back = kernels::io::load(&p, None).unwrap();
    assert_eq!((back.dtype(), f32s(&back)), (DType::Bf16, f32s(&t)));
    let len = std::fs::metadata(&p).unwrap().len();
    let h = Tensor::from_f32(vec![3], vec![0.1, 1.5, -3.0]).unwrap().cast(DType::F16);
    kernels::io::save_safetensors(&p, &[("t".into(), h.clone())]).unwrap();
    assert_eq!(std::fs::metadata(&p).unwrap().len(), len, "bf16 and f16 take the same bytes");
    let n = dir.join("h.npy");
    kernels::io::save(&n, &h).unwrap();
    let back = kernels::io::load(&n, None).unwrap();
    assert_eq!((back.dtype(), f32s(&back)), (DType::F16, f32s(&h)));
    assert_eq!(kernels::io::widen_loaded(back, DType::F32).dtype(), DType::F32);
    let _ = std::fs::remove_dir_all(&dir);
}
