//! Shape kernels (permute, concat, broadcast, sum_to_shape, ...) and indexing kernels
//! (slice, gather, scatter_add, one_hot), including adjointness checks.

use kernels::ops::{self, SliceSpec};
use kernels::{DType, KernelError, Tensor};

use crate::{check, lcg, msg, t64, ti};

/// ⟨a, b⟩ over all elements.
fn dot(a: &Tensor, b: &Tensor) -> f64 {
    a.to_f64_vec().iter().zip(b.to_f64_vec()).map(|(x, y)| x * y).sum()
}

#[test]
fn permute_round_trips_for_every_permutation_of_four_axes() {
    let x = t64(&[2, 3, 4, 5], &lcg(120, 1));
    let axes = [0usize, 1, 2, 3];
    let mut perms = Vec::new();
    for a in axes {
        for b in axes {
            for c in axes {
                for d in axes {
                    let p = [a, b, c, d];
                    let mut s = p;
                    s.sort();
                    if s == axes {
                        perms.push(p);
                    }
                }
            }
        }
    }
    assert_eq!(perms.len(), 24);
    for p in perms {
        let y = ops::permute(&x, &p).unwrap();
        let expect_shape: Vec<usize> = p.iter().map(|&i| x.shape()[i]).collect();
        assert_eq!(y.shape(), expect_shape.as_slice());
        let mut inv = [0; 4];
        for (i, &q) in p.iter().enumerate() {
            inv[q] = i;
        }
        assert_eq!(ops::permute(&y, &inv).unwrap(), x, "perm {p:?}");
        // Spot-check one element: y[i0,i1,i2,i3] = x[idx] with idx[p[k]] = i_k.
        let yv = y.to_f64_vec();
        let xv = x.to_f64_vec();
        let (i0, i1, i2, i3) = (1, 2, 3, 1);
        let ys = y.shape();
        let yi = ((i0 * ys[1] + i1) * ys[2] + i2) * ys[3] + i3;
        let mut xi = [0; 4];
        for (k, &i) in [i0, i1, i2, i3].iter().enumerate() {
            xi[p[k]] = i % x.shape()[p[k]];
        }
        if [i0, i1, i2, i3].iter().zip(ys).all(|(&i, &s)| i < s) {
            assert_eq!(yv[yi], xv[((xi[0] * 3 + xi[1]) * 4 + xi[2]) * 5 + xi[3]]);
        }
    }
}

#[test]
fn large_transposes_use_tiles_and_agree_with_the_definition() {
    let (r, c) = (203, 77);
    let v = lcg(r * c, 2);
    let t = ops::transpose(&t64(&[r, c], &v));
    let want: Vec<f64> = (0..r * c).map(|i| v[(i % r) * c + i / r]).collect();
    check(&t, &[c, r], &want, 0.0);
    // Last-two-axes swap of a batch, big enough to run in parallel.
    let (b, r, c) = (3, 130, 97);
    let v = lcg(b * r * c, 3);
    let t = ops::permute(&t64(&[b, r, c], &v), &[0, 2, 1]).unwrap();
    let want: Vec<f64> = (0..b * r * c)
        .map(|i| {
            let (bi, rest) = (i / (r * c), i % (r * c));
            let (j, k) = (rest / r, rest % r);
            v[bi * r * c + k * c + j]
        })
        .collect();
    check(&t, &[b, c, r], &want, 0.0);
    assert!(ops::permute(&t, &[0, 0, 1]).is_err());
    assert!(ops::permute(&t, &[0, 1]).is_err());
}

#[test]
fn reshape_concat_stack_squeeze() {
    let x = ti(&[2, 3], &[1, 2, 3, 4, 5, 6]);
    assert_eq!(ops::reshape(&x, &[3, 2]).unwrap().shape(), &[3, 2]);
    assert_eq!(msg(ops::reshape(&x, &[4])), "reshape: shapes [2, 3] and [4] are incompatible");
    let y = ti(&[2, 1], &[7, 8]);
    let c = ops::concat(&[x.clone(), y.clone()], 1).unwrap();
    assert_eq!(c.shape(), &[2, 4]);
    assert_eq!(c.as_i32().unwrap(), &[1, 2, 3, 7, 4, 5, 6, 8]);
    assert!(ops::concat(&[x.clone(), y.clone()], 0).is_err());
    assert!(ops::concat(&[x.clone(), y.cast(DType::F32)], 1).is_err());
    let s = ops::stack(&[x.clone(), x.clone()], 1).unwrap();
    assert_eq!(s.shape(), &[2, 2, 3]);
    assert_eq!(s.as_i32().unwrap(), &[1, 2, 3, 1, 2, 3, 4, 5, 6, 4, 5, 6]);
    let e = ops::expand_dims(&x, 2).unwrap();
    assert_eq!(e.shape(), &[2, 3, 1]);
    assert!(ops::expand_dims(&x, 3).is_err());
    assert_eq!(ops::squeeze(&e, None).unwrap().shape(), &[2, 3]);
    assert_eq!(ops::squeeze(&e, Some(2)).unwrap().shape(), &[2, 3]);
    assert!(ops::squeeze(&e, Some(0)).is_err());
}

#[test]
fn broadcast_to_and_sum_to_shape_are_adjoint() {
    let x = t64(&[3, 1], &[1.0, 2.0, 3.0]);
    let b = ops::broadcast_to(&x, &[2, 3, 4]).unwrap();
    assert_eq!(b.shape(), &[2, 3, 4]);
    assert_eq!(b.to_f64_vec()[..8], [1.0, 1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 2.0]);
    assert!(ops::broadcast_to(&x, &[2, 4]).is_err());
    // ⟨broadcast_to(x), u⟩ = ⟨x, sum_to_shape(u)⟩
    let u = t64(&[2, 3, 4], &lcg(24, 4));
    let s = ops::sum_to_shape(&u, &[3, 1]).unwrap();
    assert_eq!(s.shape(), &[3, 1]);
    assert!((dot(&b, &u) - dot(&x, &s)).abs() < 1e-12);
    let s2 = ops::sum_to_shape(&u, &[4]).unwrap();
    let want: Vec<f64> = (0..4).map(|j| (0..6).map(|i| u.to_f64_vec()[i * 4 + j]).sum()).collect();
    check(&s2, &[4], &want, 1e-14);
    assert_eq!(ops::sum_to_shape(&u, &[]).unwrap().shape(), &[] as &[usize]);
    assert!(ops::sum_to_shape(&u, &[2, 4]).is_err());
}

#[test]
fn slicing_with_indices_ranges_and_full_axes() {
    let x = ti(&[3, 4], &(0..12).collect::<Vec<_>>());
    let r = ops::slice(&x, &[SliceSpec::Index(-1)]).unwrap();
    assert_eq!(r.shape(), &[4]);
    assert_eq!(r.as_i32().unwrap(), &[8, 9, 10, 11]);
    let r = ops::slice(&x, &[SliceSpec::Full, SliceSpec::Range { start: 1, end: 3 }]).unwrap();
    assert_eq!(r.shape(), &[3, 2]);
    assert_eq!(r.as_i32().unwrap(), &[1, 2, 5, 6, 9, 10]);
    let r = ops::slice(&x, &[SliceSpec::Range { start: 1, end: 1 }]).unwrap();
    assert_eq!(r.shape(), &[0, 4]);
    let r = ops::slice(&x, &[SliceSpec::Index(1), SliceSpec::Index(2)]).unwrap();
    assert_eq!(r.shape(), &[] as &[usize]);
    assert_eq!(r.as_i32().unwrap(), &[6]);
    let ten = ti(&[10], &[0; 10]);
    assert_eq!(msg(ops::slice(&ten, &[SliceSpec::Index(12)])), "index 12 is out of range for axis 0 of size 10");
    assert_eq!(
        ops::slice(&x, &[SliceSpec::Full, SliceSpec::Range { start: 2, end: 5 }]),
        Err(KernelError::IndexOutOfRange { index: 5, axis: 1, size: 4 })
    );
    assert!(ops::slice(&x, &[SliceSpec::Range { start: 3, end: 2 }]).is_err());
    assert!(ops::slice(&x, &[SliceSpec::Range { start: -1, end: 2 }]).is_err());
    assert!(ops::slice(&x, &[SliceSpec::Index(-5)]).is_err());
    assert!(ops::slice(&x, &[SliceSpec::Full, SliceSpec::Full, SliceSpec::Full]).is_err());
}

#[test]
fn slice_update_add_is_the_adjoint_of_slice() {
    let shape = [4, 5, 6];
    let x = t64(&shape, &lcg(120, 5));
    let specs = [SliceSpec::Range { start: 1, end: 3 }, SliceSpec::Index(-2), SliceSpec::Range { start: 0, end: 4 }];
    let s = ops::slice(&x, &specs).unwrap();
    assert_eq!(s.shape(), &[2, 4]);
    let u = t64(&[2, 4], &lcg(8, 6));
    let g = ops::slice_update_add(&shape, &specs, &u).unwrap();
    assert_eq!(g.shape(), &shape);
    assert!((dot(&s, &u) - dot(&x, &g)).abs() < 1e-12);
    assert!(ops::slice_update_add(&shape, &specs, &t64(&[4, 2], &[0.0; 8])).is_err());
}

#[test]
fn gather_matches_numpy_take_and_scatter_add_is_its_adjoint() {
    // np.take(np.arange(12).reshape(3,4), [[2,0],[1,1]], axis=1) -> shape (3,2,2)
    let x = ti(&[3, 4], &(0..12).collect::<Vec<_>>());
    let idx = ti(&[2, 2], &[2, 0, 1, 1]);
    let g = ops::gather(&x, &idx, 1).unwrap();
    assert_eq!(g.shape(), &[3, 2, 2]);
    assert_eq!(g.as_i32().unwrap(), &[2, 0, 1, 1, 6, 4, 5, 5, 10, 8, 9, 9]);
    let rows = ops::gather(&x, &ti(&[3], &[2, 2, 0]), 0).unwrap();
    assert_eq!(rows.as_i32().unwrap(), &[8, 9, 10, 11, 8, 9, 10, 11, 0, 1, 2, 3]);
    // ⟨gather(x), u⟩ = ⟨x, scatter_add(u)⟩ on floats, with repeated indices.
    let xf = t64(&[3, 4, 2], &lcg(24, 7));
    let idx = ti(&[5], &[3, 1, 3, 0, 3]);
    let gx = ops::gather(&xf, &idx, 1).unwrap();
    assert_eq!(gx.shape(), &[3, 5, 2]);
    let u = t64(&[3, 5, 2], &lcg(30, 8));
    let su = ops::scatter_add(&[3, 4, 2], &idx, &u, 1).unwrap();
    assert!((dot(&gx, &u) - dot(&xf, &su)).abs() < 1e-12);
    // Repeated indices accumulate.
    let ones = t64(&[5], &[1.0; 5]);
    let counts = ops::scatter_add(&[4], &idx, &ones, 0).unwrap();
    check(&counts, &[4], &[1.0, 1.0, 0.0, 3.0], 0.0);
}

#[test]
fn bad_indices_are_errors() {
    let x = t64(&[3, 4], &[0.0; 12]);
    assert_eq!(
        ops::gather(&x, &ti(&[2], &[1, 4]), 1),
        Err(KernelError::IndexOutOfRange { index: 4, axis: 1, size: 4 })
    );
    assert!(ops::gather(&x, &ti(&[1], &[-1]), 0).is_err());
    assert!(ops::gather(&x, &t64(&[1], &[0.0]), 0).is_err());
    assert!(ops::gather(&x, &ti(&[1], &[0]), 2).is_err());
    assert!(ops::scatter_add(&[3, 4], &ti(&[2], &[0, 1]), &t64(&[3, 3], &[0.0; 9]), 1).is_err());
    assert!(ops::one_hot(&ti(&[2], &[0, 3]), 3, DType::F32).is_err());
}

#[test]
fn one_hot_and_constructors() {
    let h = ops::one_hot(&ti(&[2, 2], &[0, 2, 1, 0]), 3, DType::F32).unwrap();
    assert_eq!(h.shape(), &[2, 2, 3]);
    check(&h, &[2, 2, 3], &[1.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0], 0.0);
    assert_eq!(ops::zeros(DType::I32, &[2]).unwrap().as_i32().unwrap(), &[0, 0]);
    assert_eq!(ops::ones(DType::Bool, &[2]).unwrap().as_bool().unwrap(), &[true, true]);
    check(&ops::full(DType::F64, &[2, 1], 2.5).unwrap(), &[2, 1], &[2.5, 2.5], 0.0);
    assert_eq!(ops::arange(4, DType::I32).unwrap().as_i32().unwrap(), &[0, 1, 2, 3]);
    check(&ops::eye(2, DType::F32).unwrap(), &[2, 2], &[1.0, 0.0, 0.0, 1.0], 0.0);
    assert_eq!(ops::zeros(DType::F32, &[]).unwrap().shape(), &[] as &[usize]);
}

#[test]
fn swap_last_transposes_each_matrix_of_a_stack() {
    let x = t64(&[2, 2, 3], &[0., 1., 2., 3., 4., 5., 6., 7., 8., 9., 10., 11.]);
    let y = ops::swap_last(&x).unwrap();
    check(&y, &[2, 3, 2], &[0., 3., 1., 4., 2., 5., 6., 9., 7., 10., 8., 11.], 0.0);
    assert_eq!(y, ops::permute(&x, &[0, 2, 1]).unwrap());
    assert!(ops::swap_last(&t64(&[3], &[1., 2., 3.])).is_err());
}
