//! `argsort` (stable, NaN largest, first k), `take_along_axis` and its adjoint, against a
//! brute-force reference: each row ordered by comparing every pair.

use kernels::ops;
use kernels::Tensor;

use crate::{lcg, msg, t32, ti};

/// The reference order of one row: position j comes before position i when its value is
/// smaller (NaN largest), or equal and earlier; reversed values for `desc`, positions still
/// ascending among equals.
fn reference(row: &[f32], desc: bool) -> Vec<i32> {
    let key = |v: f32| if v.is_nan() { f64::INFINITY * 2.0 } else { v as f64 };
    let mut p: Vec<usize> = (0..row.len()).collect();
    // Insertion sort: obviously stable.
    for i in 1..p.len() {
        let mut j = i;
        while j > 0 {
            let (a, b) = (key(row[p[j - 1]]), key(row[p[j]]));
            let out_of_order = if desc { a < b } else { a > b };
            // NaN keys compare as equal to each other (both are 2·inf = inf).
            if !out_of_order || (a.is_infinite() && b.is_infinite() && a == b) {
                break;
            }
            p.swap(j - 1, j);
            j -= 1;
        }
    }
    p.into_iter().map(|i| i as i32).collect()
}

#[test]
fn argsort_matches_a_stable_reference_along_every_axis() {
    // Values on a coarse grid so that ties are common, and some NaNs.
    let shape = [3, 5, 4];
    let v: Vec<f32> = lcg(60, 7)
        .into_iter()
        .enumerate()
        .map(|(i, u)| if i % 13 == 5 { f32::NAN } else { (u * 4.0).floor() as f32 })
        .collect();
    let x = t32(&shape, &v);
    for axis in 0..3 {
        for desc in [false, true] {
            let got = ops::argsort(&x, axis, desc, None).unwrap();
            assert_eq!(got.shape(), &shape);
            let g = got.as_i32().unwrap();
            let strides = [20, 4, 1];
            let n = shape[axis];
            // Every row along `axis`: the other two indices fixed.
            for base in 0..60usize {
                if (base / strides[axis]) % n != 0 {
                    continue;
                }
                let row: Vec<f32> = (0..n).map(|j| v[base + j * strides[axis]]).collect();
                let want = reference(&row, desc);
                let have: Vec<i32> = (0..n).map(|j| g[base + j * strides[axis]]).collect();
                assert_eq!(have, want, "axis {axis} desc {desc} row {row:?}");
                // The first k positions are the first k of the full order.
                for k in [0, 1, n / 2, n] {
                    let top = ops::argsort(&x, axis, desc, Some(k)).unwrap();
                    let t = top.as_i32().unwrap();
                    let mut s = shape.to_vec();
                    s[axis] = k;
                    assert_eq!(top.shape(), s.as_slice());
                    let ts: Vec<usize> = vec![s[1] * s[2], s[2], 1];
                    let (o, r) = (base / strides[axis] / n, base % strides[axis]);
                    let tbase = o * ts[axis] * k + r;
                    let have: Vec<i32> = (0..k).map(|j| t[tbase + j * ts[axis]]).collect();
                    assert_eq!(have, want[..k].to_vec(), "axis {axis} desc {desc} k {k}");
                }
            }
        }
    }
}

#[test]
fn argsort_orders_integers_and_refuses_too_many() {
    let x = ti(&[6], &[3, -1, 3, 0, -1, 7]);
    assert_eq!(ops::argsort(&x, 0, false, None).unwrap().as_i32().unwrap(), &[1, 4, 3, 0, 2, 5]);
    assert_eq!(ops::argsort(&x, 0, true, None).unwrap().as_i32().unwrap(), &[5, 0, 2, 3, 1, 4]);
    assert!(msg(ops::argsort(&x, 0, true, Some(7))).contains("asked for 7"));
    assert!(msg(ops::argsort(&x, 1, false, None)).contains("axis"));
}

#[test]
fn take_along_and_scatter_add_along_are_adjoint() {
    // <take(x, idx), u> == <x, scatter(u, idx)> for any x and u, with repeated indices.
    let x = t32(&[3, 4, 2], &lcg(24, 3).iter().map(|&u| u as f32).collect::<Vec<_>>());
    for axis in 0..3 {
        let mut ishape = vec![3, 4, 2];
        ishape[axis] = 5;
        let n: i32 = [3, 4, 2][axis];
        let count: usize = ishape.iter().product();
        let idx: Vec<i32> =
            lcg(count, 11 + axis as u64).iter().map(|&u| ((u + 1.0) / 2.0 * n as f64) as i32 % n).collect();
        let idx = ti(&ishape, &idx);
        let u: Vec<f32> = lcg(count, 5).iter().map(|&u| u as f32 - 0.5).collect();
        let u = t32(&ishape, &u);
        let y = ops::take_along(&x, &idx, axis).unwrap();
        assert_eq!(y.shape(), ishape.as_slice());
        let s = ops::scatter_add_along(&[3, 4, 2], &idx, &u, axis).unwrap();
        let dot = |a: &Tensor, b: &Tensor| -> f64 {
            a.as_f32().unwrap().iter().zip(b.as_f32().unwrap()).map(|(p, q)| *p as f64 * *q as f64).sum()
        };
        assert!((dot(&y, &u) - dot(&x, &s)).abs() < 1e-5, "axis {axis}");
    }
    let idx = ti(&[3, 1, 2], &[0, 1, 2, 3, 4, 0]);
    assert!(msg(ops::take_along(&x, &idx, 1)).contains("out of range"));
    assert!(msg(ops::take_along(&x, &ti(&[3, 4], &[0; 12]), 1)).contains("take_along_axis"));
}

#[test]
fn update_writes_in_place_when_the_buffer_is_not_shared() {
    let buf = kernels::ops::zeros(kernels::DType::F32, &[4, 3]).unwrap();
    let ptr = buf.as_f32().unwrap().as_ptr();
    let v = t32(&[3], &[1.0, 2.0, 3.0]);
    let out = ops::update(buf, &v, 2, 0).unwrap();
    assert_eq!(out.as_f32().unwrap().as_ptr(), ptr, "an unshared buffer is reused");
    assert_eq!(&out.as_f32().unwrap()[6..9], &[1.0, 2.0, 3.0]);
    // A shared buffer is copied: the other holder still sees the old values.
    let keep = out.clone();
    let out2 = ops::update(out, &t32(&[1, 3], &[9.0, 9.0, 9.0]), 0, 0).unwrap();
    assert_eq!(&keep.as_f32().unwrap()[0..3], &[0.0, 0.0, 0.0]);
    assert_eq!(&out2.as_f32().unwrap()[0..3], &[9.0, 9.0, 9.0]);
    // Along axis 1, a block of two columns.
    let out3 = ops::update(keep, &t32(&[4, 2], &[5.0; 8]), 1, 1).unwrap();
    assert_eq!(&out3.as_f32().unwrap()[0..3], &[0.0, 5.0, 5.0]);
    assert!(msg(ops::update(out3.clone(), &t32(&[4, 2], &[5.0; 8]), 2, 1)).contains("out of range"));
    assert!(msg(ops::update(out3.clone(), &t32(&[3, 2], &[5.0; 6]), 0, 1)).contains("update"));
    assert!(msg(ops::update(out3, &ti(&[3], &[1, 2, 3]), 0, 0)).contains("update"));
}
