//! Tensor views: a tensor over part of a shared buffer (a field of a flat model) reads only its
//! part, kernels see only its elements, joining adjacent views is free, and a buffer is handed
//! back for reuse only when one view covers all of it and nothing else refers to it.

use super::t32;
use kernels::ops::{self, BinaryOp};
use kernels::{DType, Storage, Tensor};

#[test]
fn views_read_their_own_part_and_kernels_see_only_it() {
    let flat = t32(&[10], &[0., 1., 2., 3., 4., 5., 6., 7., 8., 9.]);
    let w = flat.view(2, vec![2, 3]).unwrap();
    assert_eq!(w.shape(), &[2, 3]);
    assert_eq!(w.as_f32().unwrap(), &[2., 3., 4., 5., 6., 7.]);
    let b = flat.view(8, vec![2]).unwrap();
    let sum = ops::binary(BinaryOp::Add, &b, &b).unwrap();
    assert_eq!(sum.as_f32().unwrap(), &[16., 18.]);
    let p = ops::matmul(&w, &t32(&[3, 1], &[1., 1., 1.])).unwrap();
    assert_eq!(p.as_f32().unwrap(), &[9., 18.]);
    // Views compare by their elements, not by their buffer.
    assert_eq!(b, t32(&[2], &[8., 9.]));
    assert!(flat.view(8, vec![3]).is_err(), "a view past the end");
    assert!(flat.view(usize::MAX, vec![2]).is_err(), "an overflowing start");
}

#[test]
fn adjacent_views_join_without_a_copy_and_others_do_not() {
    let flat = t32(&[6], &[1., 2., 3., 4., 5., 6.]);
    let a = flat.view(0, vec![2]).unwrap();
    let b = flat.view(2, vec![2, 2]).unwrap();
    let ab = a.join(&b).unwrap();
    assert_eq!(ab.shape(), &[6]);
    assert_eq!(ab.storage().addr(), flat.storage().addr());
    assert!(b.join(&a).is_none(), "not in order");
    let gap = flat.view(3, vec![1]).unwrap();
    assert!(a.join(&gap).is_none(), "not adjacent");
    assert!(a.join(&t32(&[2], &[3., 4.])).is_none(), "another buffer");
    let copy = Tensor::concat_flat(&[&b, &a]).unwrap();
    assert_eq!(copy.as_f32().unwrap(), &[3., 4., 5., 6., 1., 2.]);
    assert!(Tensor::concat_flat(&[&a, &a.cast(DType::F64)]).is_none(), "two element types");
}

#[test]
fn only_a_whole_unshared_buffer_is_handed_back() {
    let whole = Storage::F32(vec![1.0f32, 2.0, 3.0].into());
    let part = whole.view(1, 2).unwrap();
    let Storage::F32(p) = part else { unreachable!() };
    let p = p.into_vec().expect_err("a view of part of a buffer");
    assert_eq!(&*p, &[2.0, 3.0]);
    let Storage::F32(w) = whole else { unreachable!() };
    let w = w.into_vec().expect_err("the part still refers to it");
    drop(p);
    assert_eq!(w.into_vec().expect("whole and unshared"), vec![1.0, 2.0, 3.0]);
}
