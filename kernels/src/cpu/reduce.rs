//! Reductions along one axis or over all elements, arg-max/min, log-sum-exp, softmax, cumsum.
//!
//! A reduction views its input as `[outer, n, inner]`, where `n` is the reduced axis. With
//! `inner == 1` every output reads one contiguous row; otherwise whole `inner`-long rows are
//! combined at once, which keeps bias-gradient sums (`sum` over the batch axis) vectorised.
//! Parallel splits use fixed boundaries, so results never depend on the number of threads.

use rayon::prelude::*;

use crate::cpu::num::{sum_contig, Float, Num};
use crate::cpu::{check_axis, PAR_MIN};
use crate::error::KernelError;
use crate::simd::vectorized;
use crate::tensor::{DType, Element, Storage, Tensor};

/// The reductions `reduce` computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    Sum,
    Mean,
    Max,
    Min,
    Prod,
}

impl ReduceOp {
    /// The msl name of the reduction, used in messages.
    pub fn name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Mean => "mean",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
            ReduceOp::Prod => "prod",
        }
    }
}

/// The `[outer, n, inner]` view of a reduction and its output shape.
struct Split {
    outer: usize,
    n: usize,
    inner: usize,
    out_shape: Vec<usize>,
}

fn split(op: &'static str, shape: &[usize], axis: Option<usize>, keepdims: bool) -> Result<Split, KernelError> {
    match axis {
        None => Ok(Split {
            outer: 1,
            n: shape.iter().product(),
            inner: 1,
            out_shape: if keepdims { vec![1; shape.len()] } else { vec![] },
        }),
        Some(a) => {
            check_axis(op, a, shape.len())?;
            let mut out_shape = shape.to_vec();
            if keepdims {
                out_shape[a] = 1;
            } else {
                out_shape.remove(a);
            }
            Ok(Split {
                outer: shape[..a].iter().product(),
                n: shape[a],
                inner: shape[a + 1..].iter().product(),
                out_shape,
            })
        }
    }
}

/// Reduces `x` along `axis` (all elements when `None`). `keepdims` keeps the reduced axes as
/// size 1. `Mean` needs a float tensor; `Max` and `Min` of an empty axis are errors; `Sum` of
/// bool counts the true elements (as i32) and `Max`/`Min`/`Prod` of bool are any/all.
pub fn reduce(op: ReduceOp, x: &Tensor, axis: Option<usize>, keepdims: bool) -> Result<Tensor, KernelError> {
    let s = split(op.name(), x.shape(), axis, keepdims)?;
    if s.n == 0 && matches!(op, ReduceOp::Max | ReduceOp::Min) && s.outer * s.inner > 0 {
        return Err(KernelError::Invalid(format!(
            "{}: cannot reduce an empty axis (it has no {} element)",
            op.name(),
            if op == ReduceOp::Max { "largest" } else { "smallest" }
        )));
    }
    match x.storage() {
        Storage::Bf16(_) | Storage::F16(_) => x.in_f32(|w| reduce(op, w, axis, keepdims)),
        Storage::F32(v) => Ok(Tensor::from_parts(s.out_shape.clone(), float_reduce(op, v, &s))),
        Storage::F64(v) => Ok(Tensor::from_parts(s.out_shape.clone(), float_reduce(op, v, &s))),
        Storage::I32(v) => {
            if op == ReduceOp::Mean {
                return Err(KernelError::dtype("mean", "a float tensor", DType::I32));
            }
            Ok(Tensor::from_parts(s.out_shape.clone(), num_reduce(op, v, &s)))
        }
        Storage::Bool(_) => {
            let as_int = x.cast(DType::I32);
            let v = as_int.as_i32().expect("cast to i32");
            match op {
                ReduceOp::Mean => Err(KernelError::dtype("mean", "a float tensor", DType::Bool)),
                ReduceOp::Sum => Ok(Tensor::from_parts(s.out_shape.clone(), num_reduce(op, v, &s))),
                ReduceOp::Max => {
                    let r = num_reduce(ReduceOp::Max, v, &s);
                    Ok(Tensor::from_parts(s.out_shape.clone(), r).cast(DType::Bool))
                }
                ReduceOp::Min | ReduceOp::Prod => {
                    let r = num_reduce(ReduceOp::Min, v, &s);
                    let r = if s.n == 0 { vec![1; r.len()] } else { r };
                    Ok(Tensor::from_parts(s.out_shape.clone(), r).cast(DType::Bool))
                }
            }
        }
    }
}

fn float_reduce<T: Float>(op: ReduceOp, v: &[T], s: &Split) -> Vec<T> {
    if op == ReduceOp::Mean {
        let mut out = num_reduce(ReduceOp::Sum, v, s);
        let n = T::from_usize(s.n);
        for o in out.iter_mut() {
            *o = *o / n;
        }
        return out;
    }
    num_reduce(op, v, s)
}

fn num_reduce<T: Num>(op: ReduceOp, v: &[T], s: &Split) -> Vec<T> {
    match op {
        ReduceOp::Sum | ReduceOp::Mean => reduce_lanes(v, s, T::zero(), T::add_w, sum_contig),
        ReduceOp::Prod => reduce_lanes(v, s, T::one(), T::mul_w, |r: &[T]| r.iter().fold(T::one(), |a, &b| a.mul_w(b))),
        ReduceOp::Max => {
            reduce_lanes(v, s, T::zero(), T::max_p, |r: &[T]| r[1..].iter().fold(r[0], |a, &b| a.max_p(b)))
        }
        ReduceOp::Min => {
            reduce_lanes(v, s, T::zero(), T::min_p, |r: &[T]| r[1..].iter().fold(r[0], |a, &b| a.min_p(b)))
        }
    }
}

/// Combines the `n` rows of each `[n, inner]` block. `contig` reduces a non-empty contiguous
/// slice and must agree with folding `combine`; `empty` is the result for `n == 0`.
fn reduce_lanes<T, C, R>(v: &[T], s: &Split, empty: T, combine: C, contig: R) -> Vec<T>
where
    T: Num,
    C: Fn(T, T) -> T + Sync + Send + Copy,
    R: Fn(&[T]) -> T + Sync + Send + Copy,
{
    let (outer, n, inner) = (s.outer, s.n, s.inner);
    let mut out = vec![empty; outer * inner];
    if n == 0 || out.is_empty() {
        return out;
    }
    if inner == 1 {
        if outer == 1 {
            out[0] = if v.len() >= PAR_MIN {
                // Fixed-size blocks keep the summation order independent of the thread count.
                let _awake = crate::threads::Linger;
                let parts: Vec<T> = v
                    .par_chunks(1 << 14)
                    .map(|c| {
                        vectorized(
                            #[inline(always)]
                            || contig(c),
                        )
                    })
                    .collect();
                contig(&parts)
            } else {
                vectorized(
                    #[inline(always)]
                    || contig(v),
                )
            };
        } else if v.len() >= PAR_MIN {
            let min_len = (PAR_MIN / n).max(1);
            let _awake = crate::threads::Linger;
            out.par_iter_mut().with_min_len(min_len).enumerate().for_each(|(o, r)| {
                *r = vectorized(
                    #[inline(always)]
                    || contig(&v[o * n..(o + 1) * n]),
                )
            });
        } else {
            vectorized(
                #[inline(always)]
                || {
                    for (o, r) in out.iter_mut().enumerate() {
                        *r = contig(&v[o * n..(o + 1) * n]);
                    }
                },
            );
        }
        return out;
    }
    // Each lane is reduced independently, so any split of lanes gives identical results.
    let lanes = |o: usize, lo: usize, acc: &mut [T]| {
        vectorized(
            #[inline(always)]
            || {
                let base = o * n * inner + lo;
                acc.copy_from_slice(&v[base..base + acc.len()]);
                for j in 1..n {
                    let row = &v[base + j * inner..base + j * inner + acc.len()];
                    for (a, &b) in acc.iter_mut().zip(row) {
                        *a = combine(*a, b);
                    }
                }
            },
        )
    };
    if v.len() < PAR_MIN {
        for (o, acc) in out.chunks_mut(inner).enumerate() {
            lanes(o, 0, acc);
        }
    } else if outer >= 2 {
        let _awake = crate::threads::Linger;
        out.par_chunks_mut(inner).enumerate().for_each(|(o, acc)| lanes(o, 0, acc));
    } else {
        let width = (inner / (2 * rayon::current_num_threads())).max(64);
        let _awake = crate::threads::Linger;
        out.par_chunks_mut(width).enumerate().for_each(|(c, acc)| lanes(0, c * width, acc));
    }
    out
}

/// Runs `f(row, out_row)` on every length-`n` lane along the axis, producing `m` outputs per
/// lane laid out as `[outer, m, inner]`. Lanes with `inner > 1` are gathered into a buffer.
fn row_wise<T, U, F>(v: &[T], s: &Split, m: usize, f: F) -> Vec<U>
where
    T: Copy + Sync,
    U: Copy + Default + Send + Sync,
    F: Fn(&[T], &mut [U]) + Sync + Send,
{
    let (outer, n, inner) = (s.outer, s.n, s.inner);
    let mut out = vec![U::default(); outer * m * inner];
    if out.is_empty() {
        return out;
    }
    let parallel = v.len().max(out.len()) >= PAR_MIN;
    if inner == 1 {
        // Callers wrap `f`'s loops in `vectorized` themselves, where they are inlined.
        let body = |o: usize, r: &mut [U]| f(&v[o * n..(o + 1) * n], r);
        if parallel {
            let min_len = (PAR_MIN / (n + m)).max(1);
            let _awake = crate::threads::Linger;
            out.par_chunks_mut(m).with_min_len(min_len).enumerate().for_each(|(o, r)| body(o, r));
        } else {
            for (o, r) in out.chunks_mut(m).enumerate() {
                body(o, r);
            }
        }
        return out;
    }
    let block = |o: usize, ob: &mut [U]| {
        let mut tin = Vec::with_capacity(n);
        let mut tout = vec![U::default(); m];
        for i in 0..inner {
            tin.clear();
            tin.extend((0..n).map(|j| v[(o * n + j) * inner + i]));
            f(&tin, &mut tout);
            for (j, &t) in tout.iter().enumerate() {
                ob[j * inner + i] = t;
            }
        }
    };
    if parallel && outer > 1 {
        let _awake = crate::threads::Linger;
        out.par_chunks_mut(m * inner).enumerate().for_each(|(o, ob)| block(o, ob));
    } else {
        for (o, ob) in out.chunks_mut(m * inner).enumerate() {
            block(o, ob);
        }
    }
    out
}

/// The index of the largest element along `axis` (of the flattened tensor when `None`), as
/// i32. The first maximum wins, and a NaN counts as the maximum, like NumPy.
pub fn argmax(x: &Tensor, axis: Option<usize>, keepdims: bool) -> Result<Tensor, KernelError> {
    arg_best("argmax", x, axis, keepdims, true)
}

/// The index of the smallest element along `axis`, as i32 (first minimum wins; NaN counts).
pub fn argmin(x: &Tensor, axis: Option<usize>, keepdims: bool) -> Result<Tensor, KernelError> {
    arg_best("argmin", x, axis, keepdims, false)
}

fn arg_best(
    op: &'static str,
    x: &Tensor,
    axis: Option<usize>,
    keepdims: bool,
    largest: bool,
) -> Result<Tensor, KernelError> {
    let s = split(op, x.shape(), axis, keepdims)?;
    if s.n == 0 && s.outer * s.inner > 0 {
        return Err(KernelError::Invalid(format!("{op}: cannot take the {op} of an empty axis")));
    }
    let out = match x.storage() {
        Storage::F32(v) => arg_rows(v, &s, largest),
        Storage::F64(v) => arg_rows(v, &s, largest),
        Storage::I32(v) => arg_rows(v, &s, largest),
        Storage::Bool(_) => arg_rows(x.cast(DType::I32).as_i32().expect("cast"), &s, largest),
        Storage::Bf16(_) | Storage::F16(_) => return arg_best(op, &x.cast(DType::F32), axis, keepdims, largest),
    };
    Ok(Tensor::from_parts(s.out_shape, out))
}

fn arg_rows<T: Num>(v: &[T], s: &Split, largest: bool) -> Vec<i32> {
    row_wise(v, s, 1, |row: &[T], out: &mut [i32]| {
        let mut best = row[0];
        let mut at = 0;
        if !best.is_nan_v() {
            for (j, &x) in row.iter().enumerate().skip(1) {
                if x.is_nan_v() {
                    at = j;
                    break;
                }
                if (largest && x > best) || (!largest && x < best) {
                    best = x;
                    at = j;
                }
            }
        }
        out[0] = at as i32;
    })
}

fn float_only<'a, T: Element>(op: &'static str, x: &'a Tensor) -> Result<&'a [T], KernelError> {
    x.data::<T>().ok_or_else(|| KernelError::dtype(op, "a float tensor", x.dtype()))
}

/// The shift that keeps `exp` from overflowing: the row maximum when finite, else 0 (so rows
/// of `-inf` give `-inf` and rows holding `+inf` give `+inf`, never NaN).
/// The largest element of `row` (NaN if it holds one), in eight lanes so that the loop
/// vectorises; the maximum does not depend on the order.
#[inline(always)]
fn row_max<T: Float>(row: &[T]) -> T {
    let mut acc = [T::NEG_INFINITY; 8];
    let chunks = row.chunks_exact(8);
    let mut m = chunks.remainder().iter().fold(T::NEG_INFINITY, |a, &b| a.max_p(b));
    for c in chunks {
        for (a, &b) in acc.iter_mut().zip(c) {
            *a = a.max_p(b);
        }
    }
    for a in acc {
        m = m.max_p(a);
    }
    m
}

#[inline(always)]
fn row_shift<T: Float>(row: &[T]) -> T {
    let m = row_max(row);
    if m.is_finite() || m.is_nan_v() {
        m
    } else {
        T::zero()
    }
}

/// Elements of a row exponentiated per block before they are summed: the exponentials then
/// vectorise as a map, and the sum is [`sum_contig`]'s (eight lanes, pairwise blocks).
const EXP_BLOCK: usize = 64;

#[inline(always)]
fn lse_row<T: Float>(row: &[T]) -> T {
    let shift = row_shift(row);
    let mut buf = [T::zero(); EXP_BLOCK];
    let mut s = T::zero();
    for c in row.chunks(EXP_BLOCK) {
        let b = &mut buf[..c.len()];
        for (o, &x) in b.iter_mut().zip(c) {
            *o = (x - shift).exp();
        }
        s = s + sum_contig(b);
    }
    shift + s.ln()
}

/// `log(sum(exp(x)))` along `axis`, computed stably by subtracting the maximum.
pub fn logsumexp(x: &Tensor, axis: Option<usize>, keepdims: bool) -> Result<Tensor, KernelError> {
    let s = split("logsumexp", x.shape(), axis, keepdims)?;
    match x.dtype() {
        DType::F32 => {
            let v = float_only::<f32>("logsumexp", x)?;
            let out = row_wise(v, &s, 1, |r: &[f32], o: &mut [f32]| {
                vectorized(
                    #[inline(always)]
                    || o[0] = lse_row(r),
                )
            });
            Ok(Tensor::from_parts(s.out_shape, out))
        }
        DType::F64 => {
            let v = float_only::<f64>("logsumexp", x)?;
            let out = row_wise(v, &s, 1, |r: &[f64], o: &mut [f64]| {
                vectorized(
                    #[inline(always)]
                    || o[0] = lse_row(r),
                )
            });
            Ok(Tensor::from_parts(s.out_shape, out))
        }
        d => Err(KernelError::dtype("logsumexp", "a float tensor", d)),
    }
}

/// One row of `softmax` (`log`: `log_softmax`), shifted by the row's maximum as NumPy, JAX and
/// PyTorch compute it: a row holding +inf is NaN throughout (`inf - inf`), as is a row of -inf
/// or one holding NaN. (`logsumexp` shifts by 0 where the maximum is infinite instead, as
/// `jax.nn.logsumexp` does, so that its result is that infinity.)
#[inline(always)]
fn softmax_row<T: Float>(row: &[T], out: &mut [T], log: bool) {
    let shift = row_max(row);
    for (o, &x) in out.iter_mut().zip(row) {
        *o = (x - shift).exp();
    }
    let sum = sum_contig(out);
    if log {
        let ls = sum.ln();
        for (o, &x) in out.iter_mut().zip(row) {
            *o = x - shift - ls;
        }
    } else {
        let inv = T::one() / sum;
        for o in out.iter_mut() {
            *o = *o * inv;
        }
    }
}

fn softmax_impl(op: &'static str, x: &Tensor, axis: usize, log: bool) -> Result<Tensor, KernelError> {
    let s = split(op, x.shape(), Some(axis), true)?;
    let shape = x.shape().to_vec();
    match x.dtype() {
        DType::F32 => {
            let v = float_only::<f32>(op, x)?;
            let out = row_wise(v, &s, s.n, |r: &[f32], o: &mut [f32]| {
                vectorized(
                    #[inline(always)]
                    || softmax_row(r, o, log),
                )
            });
            Ok(Tensor::from_parts(shape, out))
        }
        DType::F64 => {
            let v = float_only::<f64>(op, x)?;
            let out = row_wise(v, &s, s.n, |r: &[f64], o: &mut [f64]| {
                vectorized(
                    #[inline(always)]
                    || softmax_row(r, o, log),
                )
            });
            Ok(Tensor::from_parts(shape, out))
        }
        d => Err(KernelError::dtype(op, "a float tensor", d)),
    }
}

/// `exp(x) / sum(exp(x))` along `axis`, computed stably.
pub fn softmax(x: &Tensor, axis: usize) -> Result<Tensor, KernelError> {
    softmax_impl("softmax", x, axis, false)
}

/// `x - logsumexp(x)` along `axis`, computed stably.
pub fn log_softmax(x: &Tensor, axis: usize) -> Result<Tensor, KernelError> {
    softmax_impl("log_softmax", x, axis, true)
}

/// Running sum along `axis` (bool counts as i32).
pub fn cumsum(x: &Tensor, axis: usize) -> Result<Tensor, KernelError> {
    let s = split("cumsum", x.shape(), Some(axis), true)?;
    let shape = x.shape().to_vec();
    fn run<T: Num>(v: &[T], s: &Split) -> Vec<T> {
        row_wise(v, s, s.n, |r: &[T], o: &mut [T]| {
            let mut acc = T::zero();
            for (o, &x) in o.iter_mut().zip(r) {
                acc = acc.add_w(x);
                *o = acc;
            }
        })
    }
    Ok(match x.storage() {
        Storage::F32(v) => Tensor::from_parts(shape, run(v, &s)),
        Storage::F64(v) => Tensor::from_parts(shape, run(v, &s)),
        Storage::I32(v) => Tensor::from_parts(shape, run(v, &s)),
        Storage::Bool(_) => Tensor::from_parts(shape, run(x.cast(DType::I32).as_i32().expect("cast"), &s)),
        Storage::Bf16(_) | Storage::F16(_) => return x.in_f32(|w| cumsum(w, axis)),
    })
}
