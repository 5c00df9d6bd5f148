//! Fused attention against the explicit formula computed in f64 (scores, masked softmax,
//! weighted sum), over shapes that span several key tiles and query blocks; the positional mask;
//! one query against a cache giving exactly what it gives inside a whole-prefix call.

use kernels::ops::{self, AttentionMask};
use kernels::Tensor;

use crate::{lcg, msg};

/// `softmax(q kᵀ / √D)` rows and `w v` in f64 for one batch entry, with the positional mask.
fn reference(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    (nq, s, d, e): (usize, usize, usize, usize),
    m: AttentionMask,
) -> (Vec<f64>, Vec<f64>) {
    let mut w = vec![0.0; nq * s];
    let mut o = vec![0.0; nq * e];
    for i in 0..nq {
        let vis = if m.causal { m.len as usize - nq + i + 1 } else { m.len as usize };
        let sc: Vec<f64> =
            (0..vis).map(|j| (0..d).map(|c| q[i * d + c] * k[j * d + c]).sum::<f64>() / (d as f64).sqrt()).collect();
        let top = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let z: f64 = sc.iter().map(|x| (x - top).exp()).sum();
        for j in 0..vis {
            w[i * s + j] = (sc[j] - top).exp() / z;
            for c in 0..e {
                o[i * e + c] += w[i * s + j] * v[j * e + c];
            }
        }
    }
    (w, o)
}

fn f32s(n: usize, seed: u64) -> Vec<f32> {
    lcg(n, seed).into_iter().map(|x| (x * 2.0) as f32).collect()
}

#[test]
fn fused_attention_matches_the_explicit_formula() {
    // (batch, queries, keys, features, value features, len, causal)
    let cases = [
        (2, 5, 5, 3, 2, 5, false),
        (3, 40, 150, 8, 5, 150, false),
        (2, 70, 70, 16, 16, 70, true),
        (1, 1, 200, 4, 4, 129, true),
        (2, 20, 130, 6, 3, 97, true),
        (1, 3, 9, 2, 2, 4, false),
    ];
    for (seed, &(b, nq, s, d, e, len, causal)) in cases.iter().enumerate() {
        let seed = seed as u64 * 3;
        let (qv, kv, vv) = (f32s(b * nq * d, seed + 1), f32s(b * s * d, seed + 2), f32s(b * s * e, seed + 3));
        let q = Tensor::from_f32(vec![b, nq, d], qv.clone()).unwrap();
        let k = Tensor::from_f32(vec![b, s, d], kv.clone()).unwrap();
        let v = Tensor::from_f32(vec![b, s, e], vv.clone()).unwrap();
        let m = AttentionMask { len, causal };
        let out = ops::attention(&q, &k, &v, m).unwrap();
        let w = ops::attention_weights(&q, &k, m).unwrap();
        assert_eq!(out.shape(), &[b, nq, e]);
        assert_eq!(w.shape(), &[b, nq, s]);
        let (out, w) = (out.as_f32().unwrap(), w.as_f32().unwrap());
        let wide = |x: &[f32]| x.iter().map(|&y| y as f64).collect::<Vec<_>>();
        for bi in 0..b {
            let (rw, ro) = reference(
                &wide(&qv[bi * nq * d..(bi + 1) * nq * d]),
                &wide(&kv[bi * s * d..(bi + 1) * s * d]),
                &wide(&vv[bi * s * e..(bi + 1) * s * e]),
                (nq, s, d, e),
                m,
            );
            for (i, r) in ro.iter().enumerate() {
                let got = out[bi * nq * e + i] as f64;
                assert!((got - r).abs() < 2e-6 * (1.0 + r.abs()), "case {seed}: output {i}: {got} vs {r}");
            }
            for (i, r) in rw.iter().enumerate() {
                let got = w[bi * nq * s + i] as f64;
                assert!((got - r).abs() < 2e-6, "case {seed}: weight {i}: {got} vs {r}");
                if *r == 0.0 {
                    assert_eq!(got, 0.0, "a hidden key has weight exactly 0");
                }
            }
        }
    }
}

#[test]
fn one_query_against_a_cache_is_bit_identical_to_the_whole_prefix() {
    let (nq, s, d) = (100, 128, 8);
    let q = Tensor::from_f32(vec![2, nq, d], f32s(2 * nq * d, 5)).unwrap();
    let k = Tensor::from_f32(vec![2, s, d], f32s(2 * s * d, 6)).unwrap();
    let v = Tensor::from_f32(vec![2, s, d], f32s(2 * s * d, 7)).unwrap();
    let full = ops::attention(&q, &k, &v, AttentionMask { len: nq as i64, causal: true }).unwrap();
    let full = full.as_f32().unwrap();
    for t in [0, 15, 16, 63, 64, 65, 99] {
        // Query t alone (both batch entries), with t + 1 positions filled.
        let mut one = Vec::new();
        for b in 0..2 {
            one.extend_from_slice(&q.as_f32().unwrap()[(b * nq + t) * d..(b * nq + t + 1) * d]);
        }
        let qt = Tensor::from_f32(vec![2, 1, d], one).unwrap();
        let o = ops::attention(&qt, &k, &v, AttentionMask { len: t as i64 + 1, causal: true }).unwrap();
        for b in 0..2 {
            let want = &full[(b * nq + t) * d..(b * nq + t + 1) * d];
            assert_eq!(&o.as_f32().unwrap()[b * d..(b + 1) * d], want, "query {t}, batch {b}");
        }
    }
}

#[test]
fn f64_and_leading_dims_and_errors() {
    let q = Tensor::from_f64(vec![2, 3, 4, 5], lcg(120, 1)).unwrap();
    let k = Tensor::from_f64(vec![2, 3, 6, 5], lcg(180, 2)).unwrap();
    let v = Tensor::from_f64(vec![2, 3, 6, 2], lcg(72, 3)).unwrap();
    let m = AttentionMask { len: 6, causal: true };
    let o = ops::attention(&q, &k, &v, m).unwrap();
    assert_eq!(o.shape(), &[2, 3, 4, 2]);
    // Each weight row sums to 1.
    let w = ops::attention_weights(&q, &k, m).unwrap();
    for row in w.as_f64().unwrap().chunks(6) {
        assert!((row.iter().sum::<f64>() - 1.0).abs() < 1e-12);
    }
    assert_eq!(
        msg(ops::attention(&q, &k, &v, AttentionMask { len: 3, causal: true })),
        "attention: the cache length 3 must be from 4 (the queries, causally) to 6 (the keys)"
    );
    assert_eq!(
        msg(ops::attention(&q, &k, &v, AttentionMask { len: 0, causal: false })),
        "attention: the cache length 0 must be from 1 to 6 (the keys)"
    );
    let bad = Tensor::from_f64(vec![2, 3, 6, 4], lcg(144, 4)).unwrap();
    assert!(ops::attention(&q, &bad, &v, m).is_err(), "keys with other features");
    let ints = Tensor::from_i32(vec![2, 3, 4, 5], vec![0; 120]).unwrap();
    assert!(ops::attention_weights(&ints, &ints, AttentionMask { len: 4, causal: false }).is_err());
}

#[test]
fn weights_of_a_block_of_queries_are_bit_identical_to_one_query_at_a_time() {
    // A block of ≥ 4 queries computes its scores across transposed key tiles, a single query
    // with dot products: both sum in feature order, so the weights have the same bits.
    let (nq, s, d) = (20, 150, 8);
    let qv = f32s(nq * d, 11);
    let k = Tensor::from_f32(vec![1, s, d], f32s(s * d, 12)).unwrap();
    let q = Tensor::from_f32(vec![1, nq, d], qv.clone()).unwrap();
    let m = AttentionMask { len: s as i64, causal: false };
    let all = ops::attention_weights(&q, &k, m).unwrap();
    for t in 0..nq {
        let qt = Tensor::from_f32(vec![1, 1, d], qv[t * d..(t + 1) * d].to_vec()).unwrap();
        let w = ops::attention_weights(&qt, &k, m).unwrap();
        assert_eq!(w.as_f32().unwrap(), &all.as_f32().unwrap()[t * s..(t + 1) * s], "query {t}");
    }
}
