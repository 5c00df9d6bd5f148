//! The CPU implementation of every kernel, plus the shared machinery for strided loops.
//!
//! Every kernel works on contiguous row-major host tensors. Loops over broadcast or permuted
//! operands go through one helper, [`Plan`]: it merges dimensions that are contiguous in every
//! operand, leaves one innermost "row" with a fixed stride per operand, and hands rows to a
//! closure, in parallel when the output is large. The kernels then specialise the row loop for
//! strides 0 and 1 so that the common cases compile to straight vector loops.

pub mod attention;
pub mod conv;
pub mod einsum;
pub mod elementwise;
pub mod fused;
pub mod index;
pub mod matmul;
pub(crate) mod num;
pub mod pool2d;
pub mod quant;
pub mod reduce;
pub mod shape;
pub mod sort;

use rayon::prelude::*;

use crate::error::KernelError;
use crate::simd::vectorized;
use crate::tensor::{Element, Tensor};

/// Outputs with at least this many elements are computed by several rayon tasks.
pub(crate) const PAR_MIN: usize = 1 << 15;

/// The most operands a [`Plan`] handles (three for `where`, plus the output when needed).
pub(crate) const MAX_OPERANDS: usize = 4;

/// `f` applied to every element, in parallel for large inputs.
pub(crate) fn map_slice<T, U, F>(x: &[T], f: F) -> Vec<U>
where
    T: Copy + Sync,
    U: Copy + Send + Sync,
    F: Fn(T) -> U + Sync + Send,
{
    if x.len() >= PAR_MIN {
        // Whole chunks per task, so that each task's loop is a plain (vectorisable) loop. The
        // output is not zeroed first (a reused buffer would be cleared for nothing).
        let mut out: Vec<U> = Vec::with_capacity(x.len());
        let spare = &mut out.spare_capacity_mut()[..x.len()];
        let _awake = crate::threads::Linger;
        spare.par_chunks_mut(PAR_MIN / 4).zip(x.par_chunks(PAR_MIN / 4)).for_each(|(o, i)| {
            vectorized(
                #[inline(always)]
                || {
                    for (o, &v) in o.iter_mut().zip(i) {
                        o.write(f(v));
                    }
                },
            )
        });
        // SAFETY: the chunks cover all `x.len()` spare elements, each written above.
        unsafe { out.set_len(x.len()) };
        out
    } else {
        vectorized(
            #[inline(always)]
            || x.iter().map(|&v| f(v)).collect(),
        )
    }
}

/// `f` applied to pairs of elements of two equally long slices, in parallel for large inputs.
pub(crate) fn zip_slices<T, U, V, F>(a: &[T], b: &[U], f: F) -> Vec<V>
where
    T: Copy + Sync,
    U: Copy + Sync,
    V: Send,
    F: Fn(T, U) -> V + Sync + Send,
{
    debug_assert_eq!(a.len(), b.len());
    if a.len() >= PAR_MIN {
        let mut out: Vec<V> = Vec::with_capacity(a.len());
        let spare = &mut out.spare_capacity_mut()[..a.len()];
        let chunk = PAR_MIN / 4;
        let _awake = crate::threads::Linger;
        spare.par_chunks_mut(chunk).zip(a.par_chunks(chunk).zip(b.par_chunks(chunk))).for_each(|(o, (x, y))| {
            vectorized(
                #[inline(always)]
                || {
                    for ((o, &x), &y) in o.iter_mut().zip(x).zip(y) {
                        o.write(f(x, y));
                    }
                },
            )
        });
        // SAFETY: the chunks cover all `a.len()` spare elements, each written above.
        unsafe { out.set_len(a.len()) };
        out
    } else {
        vectorized(
            #[inline(always)]
            || a.iter().zip(b.iter()).map(|(&x, &y)| f(x, y)).collect(),
        )
    }
}

/// Row-major strides of a contiguous tensor with this shape.
pub(crate) fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![0; shape.len()];
    let mut acc = 1;
    for i in (0..shape.len()).rev() {
        strides[i] = acc;
        acc *= shape[i];
    }
    strides
}

/// Checks that `axis` names a dimension of a rank-`rank` tensor.
pub(crate) fn check_axis(op: &'static str, axis: usize, rank: usize) -> Result<(), KernelError> {
    if axis < rank {
        Ok(())
    } else {
        Err(KernelError::AxisOutOfRange { op, axis, rank })
    }
}

/// The NumPy broadcast of two shapes, checked with [`checked_numel`](crate::tensor::checked_numel).
pub fn broadcast_shapes(op: &'static str, a: &[usize], b: &[usize]) -> Result<Vec<usize>, KernelError> {
    let rank = a.len().max(b.len());
    let mut out = vec![0; rank];
    for i in 0..rank {
        let da = if i + a.len() >= rank { a[i + a.len() - rank] } else { 1 };
        let db = if i + b.len() >= rank { b[i + b.len() - rank] } else { 1 };
        out[i] = if da == db || db == 1 {
            da
        } else if da == 1 {
            db
        } else {
            return Err(KernelError::ShapeMismatch { op, lhs: a.to_vec(), rhs: b.to_vec() });
        };
    }
    // Two valid shapes can broadcast to one with too many elements (`[N, 1]` and `[1, N]`).
    crate::tensor::checked_numel(&out)?;
    Ok(out)
}

/// Strides that read a contiguous tensor of shape `src` as if broadcast to `out`
/// (0 along broadcast dimensions). The caller has checked that `src` broadcasts to `out`.
pub(crate) fn broadcast_strides(src: &[usize], out: &[usize]) -> Vec<usize> {
    let own = contiguous_strides(src);
    let lead = out.len() - src.len();
    (0..out.len()).map(|i| if i < lead || src[i - lead] == 1 { 0 } else { own[i - lead] }).collect()
}

/// A loop nest over an output shape with per-operand strides, reduced to rows.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    /// Sizes of the outer (non-row) dimensions after merging.
    outer: Vec<usize>,
    /// For each outer dimension, each operand's stride.
    outer_strides: Vec<[usize; MAX_OPERANDS]>,
    /// Length of one row (the innermost merged dimension).
    pub row_len: usize,
    /// Each operand's stride along the row.
    pub row_strides: [usize; MAX_OPERANDS],
    /// Number of rows.
    pub rows: usize,
}

impl Plan {
    /// Builds a plan for `shape` with the given strides for each operand (at most
    /// [`MAX_OPERANDS`]). Size-1 dimensions are dropped and dimensions that are contiguous
    /// with their inner neighbour in every operand are merged.
    pub(crate) fn new(shape: &[usize], strides: &[&[usize]]) -> Plan {
        debug_assert!(strides.len() <= MAX_OPERANDS);
        let mut dims: Vec<(usize, [usize; MAX_OPERANDS])> = Vec::new();
        for (i, &size) in shape.iter().enumerate() {
            if size == 1 {
                continue;
            }
            let mut st = [0; MAX_OPERANDS];
            for (k, s) in strides.iter().enumerate() {
                st[k] = s[i];
            }
            if let Some(last) = dims.last_mut() {
                let mergeable = (0..strides.len()).all(|k| last.1[k] == st[k] * size);
                if mergeable {
                    last.0 *= size;
                    last.1 = st;
                    continue;
                }
            }
            dims.push((size, st));
        }
        let (row_len, row_strides) = dims.pop().unwrap_or((1, [0; MAX_OPERANDS]));
        let rows = if shape.contains(&0) { 0 } else { dims.iter().map(|d| d.0).product() };
        Plan {
            outer: dims.iter().map(|d| d.0).collect(),
            outer_strides: dims.iter().map(|d| d.1).collect(),
            row_len: if shape.contains(&0) { 0 } else { row_len },
            row_strides,
            rows,
        }
    }

    /// The operand offsets of the first element of row `row`.
    fn offsets_of(&self, mut row: usize) -> [usize; MAX_OPERANDS] {
        let mut off = [0; MAX_OPERANDS];
        for d in (0..self.outer.len()).rev() {
            let i = row % self.outer[d];
            row /= self.outer[d];
            for (k, o) in off.iter_mut().enumerate() {
                *o += i * self.outer_strides[d][k];
            }
        }
        off
    }

    /// Calls `f(offsets)` for the first element of every row, in order, on this thread.
    pub(crate) fn for_each_row<F: FnMut([usize; MAX_OPERANDS])>(&self, mut f: F) {
        if self.row_len == 0 {
            return;
        }
        let mut idx = vec![0usize; self.outer.len()];
        let mut off = [0usize; MAX_OPERANDS];
        for _ in 0..self.rows {
            f(off);
            for d in (0..self.outer.len()).rev() {
                idx[d] += 1;
                for (k, o) in off.iter_mut().enumerate() {
                    *o += self.outer_strides[d][k];
                }
                if idx[d] < self.outer[d] {
                    break;
                }
                for (k, o) in off.iter_mut().enumerate() {
                    *o -= self.outer[d] * self.outer_strides[d][k];
                }
                idx[d] = 0;
            }
        }
    }

    /// Calls `f(row_out, offsets)` for every row, where `row_out` is the matching row of the
    /// contiguous output `out` (whose length must be `rows * row_len`). Runs in parallel when
    /// the output is large; rows are independent, so the result does not depend on threads.
    pub(crate) fn run<T, F>(&self, out: &mut [T], f: F)
    where
        T: Send,
        F: Fn(&mut [T], [usize; MAX_OPERANDS]) + Sync + Send,
    {
        if self.rows == 0 || self.row_len == 0 {
            return;
        }
        debug_assert_eq!(out.len(), self.rows * self.row_len);
        let total = out.len();
        if total >= PAR_MIN && self.row_len >= PAR_MIN {
            // Few long rows: split each row into segments, shifting the offsets to match.
            let seg = PAR_MIN / 2;
            let _awake = crate::threads::Linger;
            out.par_chunks_mut(self.row_len).enumerate().for_each(|(r, row)| {
                let base = self.offsets_of(r);
                row.par_chunks_mut(seg).enumerate().for_each(|(s, part)| {
                    let mut off = base;
                    for (k, o) in off.iter_mut().enumerate() {
                        *o += s * seg * self.row_strides[k];
                    }
                    vectorized(
                        #[inline(always)]
                        || f(part, off),
                    );
                });
            });
            return;
        }
        let rows_per_task = if total >= PAR_MIN { (PAR_MIN / 2 / self.row_len).max(1) } else { self.rows };
        let chunk = rows_per_task * self.row_len;
        let body = |task: usize, block: &mut [T]| {
            let first = task * rows_per_task;
            let mut idx = vec![0usize; self.outer.len()];
            let mut r = first;
            for d in (0..self.outer.len()).rev() {
                idx[d] = r % self.outer[d];
                r /= self.outer[d];
            }
            let mut off = self.offsets_of(first);
            for row_out in block.chunks_mut(self.row_len) {
                vectorized(
                    #[inline(always)]
                    || f(row_out, off),
                );
                // Advance the odometer by one row, updating offsets incrementally.
                for d in (0..self.outer.len()).rev() {
                    idx[d] += 1;
                    for (k, o) in off.iter_mut().enumerate() {
                        *o += self.outer_strides[d][k];
                    }
                    if idx[d] < self.outer[d] {
                        break;
                    }
                    for (k, o) in off.iter_mut().enumerate() {
                        *o -= self.outer[d] * self.outer_strides[d][k];
                    }
                    idx[d] = 0;
                }
            }
        };
        if rows_per_task < self.rows {
            let _awake = crate::threads::Linger;
            out.par_chunks_mut(chunk).enumerate().for_each(|(task, block)| body(task, block));
        } else {
            body(0, out);
        }
    }
}

/// Copies the elements of `src` read at `offset` with `strides` over `shape` into a new
/// contiguous vector. This one routine implements permutes, broadcasts and slices.
pub(crate) fn strided_copy<T: Element>(src: &[T], offset: usize, shape: &[usize], strides: &[usize]) -> Vec<T> {
    let n: usize = shape.iter().product();
    let mut out = vec![T::default(); n];
    let plan = Plan::new(shape, &[strides]);
    let s = plan.row_strides[0];
    plan.run(&mut out, |row, off| {
        let base = offset + off[0];
        match s {
            1 => row.copy_from_slice(&src[base..base + row.len()]),
            0 => row.fill(src[base]),
            _ => {
                for (j, o) in row.iter_mut().enumerate() {
                    *o = src[base + j * s];
                }
            }
        }
    });
    out
}

/// Applies a generic function to the typed data of a tensor: `dispatch!(t, v => expr)` binds
/// `v` to the element slice of whichever dtype `t` holds.
macro_rules! dispatch {
    ($t:expr, $v:ident => $body:expr) => {
        $crate::tensor::each_storage!($t.storage(), data => {
            let $v = data.as_slice();
            $body
        })
    };
}
pub(crate) use dispatch;

/// Checks that every tensor has the dtype of the first and returns it.
pub(crate) fn same_dtype(op: &'static str, xs: &[&Tensor]) -> Result<(), KernelError> {
    let first = xs[0].dtype();
    for x in &xs[1..] {
        if x.dtype() != first {
            return Err(KernelError::DTypeMismatch {
                op,
                expected: format!("operands of one element type ({first})"),
                found: x.dtype().to_string(),
            });
        }
    }
    Ok(())
}
