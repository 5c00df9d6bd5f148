//! Sorting kernels: stable `argsort` along an axis (optionally only the first `k` positions, for
//! `top_k`), `take_along_axis` and its adjoint `scatter_add_along`.

use std::cmp::Ordering;

use crate::cpu::num::Num;
use crate::cpu::{check_axis, dispatch};
use crate::error::KernelError;
use crate::tensor::{checked_numel, DType, Element, Storage, Tensor};

/// The total order of `argsort`: NaN is larger than every number (and equal to NaN).
fn order<T: Element>(a: T, b: T) -> Ordering {
    match a.partial_cmp(&b) {
        Some(o) => o,
        None => {
            // At least one NaN (only floats are unordered).
            let nan = |v: T| v.partial_cmp(&v).is_none();
            nan(a).cmp(&nan(b))
        }
    }
}

/// The positions that order `x` along `axis` (stable: equal values keep their order, also when
/// `descending`), as `i32`; with `keep = Some(k)` only the first `k` of each row.
pub fn argsort(x: &Tensor, axis: usize, descending: bool, keep: Option<usize>) -> Result<Tensor, KernelError> {
    check_axis("argsort", axis, x.rank())?;
    let n = x.shape()[axis];
    if n > i32::MAX as usize {
        return Err(KernelError::Invalid(format!("argsort: axis {axis} has {n} entries, more than i32 positions")));
    }
    let k = keep.unwrap_or(n);
    if k > n {
        return Err(KernelError::OutOfRange(format!("top_k: asked for {k} values along an axis of size {n}")));
    }
    let outer: usize = x.shape()[..axis].iter().product();
    let inner: usize = x.shape()[axis + 1..].iter().product();
    let mut shape = x.shape().to_vec();
    shape[axis] = k;
    let total = checked_numel(&shape)?;
    if total == 0 {
        return crate::cpu::shape::zeros(DType::I32, &shape);
    }
    fn run<T: Element>(v: &[T], outer: usize, n: usize, inner: usize, k: usize, desc: bool, total: usize) -> Vec<i32> {
        let mut out = vec![0i32; total];
        let mut row: Vec<(T, i32)> = Vec::with_capacity(n);
        for o in 0..outer {
            for i in 0..inner {
                row.clear();
                row.extend((0..n).map(|j| (v[(o * n + j) * inner + i], j as i32)));
                let cmp = |a: &(T, i32), b: &(T, i32)| {
                    let c = order(a.0, b.0);
                    if desc {
                        c.reverse()
                    } else {
                        c
                    }
                };
                if k < n && k > 0 {
                    // The first k in order: select, then sort that part (stable by position).
                    let by = |a: &(T, i32), b: &(T, i32)| cmp(a, b).then(a.1.cmp(&b.1));
                    row.select_nth_unstable_by(k - 1, by);
                    row[..k].sort_by(by);
                } else {
                    row.sort_by(cmp);
                }
                for (j, &(_, p)) in row[..k].iter().enumerate() {
                    out[(o * k + j) * inner + i] = p;
                }
            }
        }
        out
    }
    let out = dispatch!(x, v => run(v, outer, n, inner, k, descending, total));
    Ok(Tensor::from_parts(shape, out))
}

/// Checks `idx` against `x`'s shape for `take_along_axis` along `axis`: the same rank and dims
/// except along `axis`; every index within `0..size`.
fn along_indices<'a>(
    op: &'static str,
    shape: &[usize],
    idx: &'a Tensor,
    axis: usize,
) -> Result<&'a [i32], KernelError> {
    check_axis(op, axis, shape.len())?;
    let ix = idx.as_i32().ok_or_else(|| KernelError::dtype(op, "i32 indices", idx.dtype()))?;
    let other =
        |s: &[usize]| -> Vec<usize> { s.iter().enumerate().filter(|(i, _)| *i != axis).map(|(_, &d)| d).collect() };
    if idx.rank() != shape.len() || other(idx.shape()) != other(shape) {
        return Err(KernelError::ShapeMismatch { op, lhs: shape.to_vec(), rhs: idx.shape().to_vec() });
    }
    let size = shape[axis];
    if let Some(&bad) = ix.iter().find(|&&i| i < 0 || i as usize >= size) {
        return Err(KernelError::IndexOutOfRange { index: bad as i64, axis, size });
    }
    Ok(ix)
}

/// `numpy.take_along_axis(x, idx, axis)`: `out[.., j, ..] = x[.., idx[.., j, ..], ..]`, with
/// the shape of `idx`.
pub fn take_along(x: &Tensor, idx: &Tensor, axis: usize) -> Result<Tensor, KernelError> {
    let ix = along_indices("take_along_axis", x.shape(), idx, axis)?;
    let n = x.shape()[axis];
    let m = idx.shape()[axis];
    let inner: usize = x.shape()[axis + 1..].iter().product();
    fn take<T: Element>(v: &[T], ix: &[i32], n: usize, m: usize, inner: usize) -> Vec<T> {
        ix.iter()
            .enumerate()
            .map(|(p, &i)| {
                let (o, r) = (p / (m * inner), p % inner);
                v[(o * n + i as usize) * inner + r]
            })
            .collect()
    }
    Ok(dispatch!(x, v => Tensor::from_parts(idx.shape().to_vec(), take(v, ix, n, m, inner))))
}

/// The adjoint of [`take_along`]: zeros of `x_shape` with each entry of `upd` (shaped like
/// `idx`) added at its position (repeated positions accumulate).
pub fn scatter_add_along(x_shape: &[usize], idx: &Tensor, upd: &Tensor, axis: usize) -> Result<Tensor, KernelError> {
    let ix = along_indices("scatter_add_along", x_shape, idx, axis)?;
    if upd.shape() != idx.shape() {
        return Err(KernelError::ShapeMismatch {
            op: "scatter_add_along",
            lhs: idx.shape().to_vec(),
            rhs: upd.shape().to_vec(),
        });
    }
    let total = checked_numel(x_shape)?;
    let n = x_shape[axis];
    let m = idx.shape()[axis];
    let inner: usize = x_shape[axis + 1..].iter().product();
    fn add<T: Num>(u: &[T], ix: &[i32], shape: &[usize], total: usize, n: usize, m: usize, inner: usize) -> Tensor {
        let mut out = vec![T::zero(); total];
        for (p, (&i, &v)) in ix.iter().zip(u).enumerate() {
            let (o, r) = (p / (m * inner), p % inner);
            let d = &mut out[(o * n + i as usize) * inner + r];
            *d = d.add_w(v);
        }
        Tensor::from_parts(shape.to_vec(), out)
    }
    match upd.storage() {
        Storage::F32(u) => Ok(add(u, ix, x_shape, total, n, m, inner)),
        Storage::F64(u) => Ok(add(u, ix, x_shape, total, n, m, inner)),
        Storage::I32(u) => Ok(add(u, ix, x_shape, total, n, m, inner)),
        Storage::Bool(_) => Err(KernelError::dtype("scatter_add_along", "a numeric tensor", DType::Bool)),
        Storage::Bf16(_) | Storage::F16(_) => upd.in_f32(|w| scatter_add_along(x_shape, idx, w, axis)),
    }
}
