//! `einsum` against matmul and against NumPy reference values.

use kernels::ops;
use kernels::Tensor;

use crate::{check, lcg, msg, t64};

// P = (np.arange(24.).reshape(2,3,4) % 5) - 2; Q = (np.arange(20.).reshape(4,5) % 3) - 1
fn pq() -> (Tensor, Tensor) {
    let p: Vec<f64> = (0..24).map(|i| (i % 5) as f64 - 2.0).collect();
    let q: Vec<f64> = (0..20).map(|i| (i % 3) as f64 - 1.0).collect();
    (t64(&[2, 3, 4], &p), t64(&[4, 5], &q))
}

#[test]
fn batched_contraction_equals_matmul() {
    let a = t64(&[4, 7, 5], &lcg(140, 1));
    let b = t64(&[4, 5, 3], &lcg(60, 2));
    let e = ops::einsum("bij,bjk->bik", &[a.clone(), b.clone()]).unwrap();
    assert_eq!(e, ops::matmul(&a, &b).unwrap());
    // Operands stored transposed are read through strides and give the same numbers.
    let at = ops::permute(&a, &[0, 2, 1]).unwrap();
    let bt = ops::permute(&b, &[0, 2, 1]).unwrap();
    let e2 = ops::einsum("bji,bkj->bik", &[at, bt]).unwrap();
    check(&e2, &[4, 7, 3], &e.to_f64_vec(), 1e-14);
    // Implicit output: "ij,jk" means "ij,jk->ik".
    let m = t64(&[3, 5], &lcg(15, 3));
    let n = t64(&[5, 2], &lcg(10, 4));
    let e3 = ops::einsum("ij,jk", &[m.clone(), n.clone()]).unwrap();
    assert_eq!(e3, ops::matmul(&m, &n).unwrap());
}

// Reference values computed once with NumPy 2.4:
//   np.einsum("ijk,kl->jil", P, Q), np.einsum("ijk,ijk->j", P, P),
//   np.einsum("ijk,kl,lm->im", P, Q, Q.T), np.einsum("ii", X), np.einsum("ii->i", X),
//   np.einsum("ij->", X) with X = np.arange(9.).reshape(3,3)
#[test]
fn einsum_matches_numpy() {
    let (p, q) = pq();
    let r = ops::einsum("ijk,kl->jil", &[p.clone(), q.clone()]).unwrap();
    let want = [
        0.0, 1.0, -1.0, 0.0, 1.0, 3.0, 1.0, -4.0, 3.0, 1.0, -4.0, 1.0, 3.0, -4.0, 1.0, -1.0, 1.0, 0.0, -1.0, 1.0, 2.0,
        -4.0, 2.0, 2.0, -4.0, 0.0, 1.0, -1.0, 0.0, 1.0,
    ];
    check(&r, &[3, 2, 5], &want, 0.0);
    let r = ops::einsum("ijk,ijk->j", &[p.clone(), p.clone()]).unwrap();
    check(&r, &[3], &[15.0, 15.0, 16.0], 0.0);
    let qt = ops::transpose(&q);
    let r = ops::einsum("ijk,kl,lm->im", &[p.clone(), q.clone(), qt]).unwrap();
    check(&r, &[2, 4], &[8.0, 0.0, -8.0, 8.0, -9.0, -2.0, 11.0, -9.0], 0.0);
    assert_eq!(ops::einsum("ijk,kl", &[p, q]).unwrap().shape(), &[2, 3, 5]);
    let x = t64(&[3, 3], &(0..9).map(|i| i as f64).collect::<Vec<_>>());
    check(&ops::einsum("ii", std::slice::from_ref(&x)).unwrap(), &[], &[12.0], 0.0);
    check(&ops::einsum("ii->i", std::slice::from_ref(&x)).unwrap(), &[3], &[0.0, 4.0, 8.0], 0.0);
    check(&ops::einsum("ij->", std::slice::from_ref(&x)).unwrap(), &[], &[36.0], 0.0);
    let xt = ops::einsum("ij->ji", std::slice::from_ref(&x)).unwrap();
    assert_eq!(xt, ops::transpose(&x));
    // Outer product: no shared letters.
    let v = t64(&[2], &[1.0, 2.0]);
    let w = t64(&[3], &[1.0, 10.0, 100.0]);
    check(&ops::einsum("i,j->ij", &[v, w]).unwrap(), &[2, 3], &[1.0, 10.0, 100.0, 2.0, 20.0, 200.0], 0.0);
}

#[test]
fn malformed_specs_are_errors() {
    let (p, q) = pq();
    let e = msg(ops::einsum("ijk,jl->il", &[p.clone(), q.clone()]));
    assert!(e.contains("letter 'j' has size 3"), "{e}");
    assert!(ops::einsum("ij,jk->ik", &[p.clone(), q.clone()]).is_err());
    assert!(ops::einsum("ijk->ijkz", std::slice::from_ref(&p)).is_err());
    assert!(ops::einsum("ijk->ii", std::slice::from_ref(&p)).is_err());
    assert!(ops::einsum("...k,kl", &[p.clone(), q.clone()]).is_err());
    assert!(ops::einsum("ijk", &[p.clone(), q.clone()]).is_err());
    assert!(ops::einsum("ij", &[]).is_err());
}
