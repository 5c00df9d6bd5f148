//! Philox4x32-10 known answers and the statistics and index-counter property of the samplers.

use kernels::rng::{self, philox4x32_10};
use kernels::{DType, Tensor};

// Known-answer vectors from Random123's kat_vectors for philox4x32_10.
#[test]
fn philox_known_answer_vectors() {
    assert_eq!(philox4x32_10([0, 0, 0, 0], [0, 0]), [0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8]);
    assert_eq!(
        philox4x32_10([0xffffffff; 4], [0xffffffff, 0xffffffff]),
        [0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd]
    );
    assert_eq!(
        philox4x32_10([0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344], [0xa4093822, 0x299f31d0]),
        [0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1]
    );
}

fn mean_var(t: &Tensor) -> (f64, f64) {
    let v = t.to_f64_vec();
    let n = v.len() as f64;
    let m = v.iter().sum::<f64>() / n;
    (m, v.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / n)
}

#[test]
fn uniform_and_normal_have_the_right_moments() {
    let key = rng::stream_key(42, "w1");
    let n = 100_000;
    // Tolerances are about five standard errors of the estimates.
    let u = rng::uniform(DType::F32, &[n], key, -1.0, 3.0).unwrap();
    let (m, v) = mean_var(&u);
    assert!((m - 1.0).abs() < 0.02, "uniform mean {m}");
    assert!((v - 16.0 / 12.0).abs() < 0.02, "uniform variance {v}");
    assert!(u.as_f32().unwrap().iter().all(|&x| (-1.0..3.0).contains(&x)));
    let u64v = rng::uniform(DType::F64, &[n], key, 0.0, 1.0).unwrap();
    let (m, v) = mean_var(&u64v);
    assert!((m - 0.5).abs() < 0.005 && (v - 1.0 / 12.0).abs() < 0.002, "{m} {v}");
    let z = rng::normal(DType::F64, &[n], rng::stream_key(42, "w2"), 2.0, 3.0).unwrap();
    let (m, v) = mean_var(&z);
    assert!((m - 2.0).abs() < 0.05, "normal mean {m}");
    assert!((v - 9.0).abs() < 0.25, "normal variance {v}");
    let b = rng::bernoulli(&[n], key, 0.3).unwrap();
    let rate = b.cast(DType::F64).to_f64_vec().iter().sum::<f64>() / n as f64;
    assert!((rate - 0.3).abs() < 0.008, "bernoulli rate {rate}");
    let k = rng::uniform(DType::I32, &[n], key, 0.0, 10.0).unwrap();
    assert!(k.as_i32().unwrap().iter().all(|&x| (0..10).contains(&x)));
}

#[test]
fn element_i_depends_only_on_its_index() {
    let key = rng::stream_key(7, "layers.0.w");
    let small = rng::normal(DType::F32, &[4, 5], key, 0.0, 1.0).unwrap();
    let big = rng::normal(DType::F32, &[100], key, 0.0, 1.0).unwrap();
    assert_eq!(small.as_f32().unwrap(), &big.as_f32().unwrap()[..20]);
    // Large enough to be generated in parallel: still the same prefix.
    let huge = rng::uniform(DType::F64, &[200_000], key, 0.0, 1.0).unwrap();
    let few = rng::uniform(DType::F64, &[3], key, 0.0, 1.0).unwrap();
    assert_eq!(few.as_f64().unwrap(), &huge.as_f64().unwrap()[..3]);
    assert_eq!(rng::uniform(DType::F64, &[3], key, 0.0, 1.0).unwrap(), few);
}

#[test]
fn keys_separate_streams() {
    assert_eq!(rng::stream_key(1, "w"), rng::stream_key(1, "w"));
    assert_ne!(rng::stream_key(1, "w"), rng::stream_key(2, "w"));
    assert_ne!(rng::stream_key(1, "w1"), rng::stream_key(1, "w2"));
    let k = rng::stream_key(1, "w");
    assert_ne!(rng::fold_in(k, 0), rng::fold_in(k, 1));
    let a = rng::uniform(DType::F32, &[8], rng::stream_key(1, "a"), 0.0, 1.0).unwrap();
    let b = rng::uniform(DType::F32, &[8], rng::stream_key(1, "b"), 0.0, 1.0).unwrap();
    assert_ne!(a, b);
}

#[test]
fn permutation_is_a_deterministic_permutation() {
    let key = rng::stream_key(3, "shuffle");
    let p = rng::permutation(1000, key);
    let mut s = p.clone();
    s.sort();
    assert_eq!(s, (0..1000).collect::<Vec<_>>());
    assert_eq!(p, rng::permutation(1000, key));
    assert_ne!(p, (0..1000).collect::<Vec<_>>());
    assert_ne!(p, rng::permutation(1000, rng::stream_key(4, "shuffle")));
    assert!(rng::permutation(0, key).is_empty());
    // Each position is roughly uniform: element 0 lands in the first half about half the time.
    let hits = (0..2000u64)
        .filter(|&i| rng::permutation(10, rng::fold_in(key, i)).iter().position(|&x| x == 0).unwrap() < 5)
        .count();
    assert!((900..1100).contains(&hits), "{hits}");
}
