//! Shape kernels (reshape, permute, concat, broadcast, squeeze, ...) and tensor constructors.

use rayon::prelude::*;

use crate::cpu::reduce::{reduce, ReduceOp};
use crate::cpu::{
    broadcast_shapes, broadcast_strides, check_axis, contiguous_strides, dispatch, same_dtype, strided_copy, PAR_MIN,
};
use crate::error::KernelError;
use crate::tensor::{checked_numel, DType, Element, Tensor};

/// The same elements under a new shape with the same number of elements (no copy).
pub fn reshape(x: &Tensor, shape: &[usize]) -> Result<Tensor, KernelError> {
    if checked_numel(shape)? != x.len() {
        return Err(KernelError::ShapeMismatch { op: "reshape", lhs: x.shape().to_vec(), rhs: shape.to_vec() });
    }
    x.with_shape(shape.to_vec())
}

/// Reverses all axes (NumPy's `.T`).
pub fn transpose(x: &Tensor) -> Tensor {
    let perm: Vec<usize> = (0..x.rank()).rev().collect();
    permute(x, &perm).expect("a reversal is a valid permutation")
}

/// `x` with its last two axes swapped, as a new contiguous tensor (each matrix of a stack
/// transposed); `x` needs at least two axes.
pub fn swap_last(x: &Tensor) -> Result<Tensor, KernelError> {
    let n = x.rank();
    if n < 2 {
        return Err(KernelError::Invalid(format!("swap_last: a tensor of rank {n} has no two last axes")));
    }
    let mut perm: Vec<usize> = (0..n).collect();
    perm.swap(n - 2, n - 1);
    permute(x, &perm)
}

/// `numpy.transpose(x, perm)`: axis `i` of the result is axis `perm[i]` of `x`.
pub fn permute(x: &Tensor, perm: &[usize]) -> Result<Tensor, KernelError> {
    let rank = x.rank();
    let mut seen = vec![false; rank];
    let valid = perm.len() == rank && perm.iter().all(|&p| p < rank && !std::mem::replace(&mut seen[p], true));
    if !valid {
        return Err(KernelError::Invalid(format!(
            "permute: {perm:?} is not a permutation of the {rank} axes of a tensor of shape {}",
            crate::error::shape_string(x.shape())
        )));
    }
    let shape: Vec<usize> = perm.iter().map(|&p| x.shape()[p]).collect();
    if perm.iter().enumerate().all(|(i, &p)| i == p) {
        return Ok(x.clone());
    }
    // Swapping the last two axes (which covers every 2-D transpose) uses cache-sized tiles.
    let last_two_swapped = rank >= 2
        && perm[rank - 2] == rank - 1
        && perm[rank - 1] == rank - 2
        && perm[..rank - 2].iter().enumerate().all(|(i, &p)| i == p);
    if last_two_swapped {
        let (r, c) = (x.shape()[rank - 2], x.shape()[rank - 1]);
        return Ok(dispatch!(x, v => Tensor::from_parts(shape, transpose_tiles(v, r, c))));
    }
    let own = contiguous_strides(x.shape());
    let strides: Vec<usize> = perm.iter().map(|&p| own[p]).collect();
    Ok(dispatch!(x, v => Tensor::from_parts(shape.clone(), strided_copy(v, 0, &shape, &strides))))
}

/// Transposes each of the row-major `r×c` matrices that make up `src`, 32×32 tiles at a time.
fn transpose_tiles<T: Element>(src: &[T], r: usize, c: usize) -> Vec<T> {
    use std::mem::MaybeUninit;
    const TILE: usize = 32;
    if src.is_empty() {
        return Vec::new();
    }
    // Not zeroed first: every element is written below (a reused buffer would be cleared for
    // nothing).
    let mut out: Vec<T> = Vec::with_capacity(src.len());
    // One task transposes a band of TILE source columns (= TILE output rows) of one matrix.
    let band = TILE * r;
    // 4-byte elements move as f32 bits through 8×8 register transposes where AVX is there.
    let blocks = std::mem::size_of::<T>() == 4 && crate::simd::avx2_enabled();
    let work = |mat: usize, col0: usize, dst: &mut [MaybeUninit<T>]| {
        let s = &src[mat * r * c..(mat + 1) * r * c];
        let cols = dst.len() / r;
        for i0 in (0..r).step_by(TILE) {
            let i1 = (i0 + TILE).min(r);
            let (mut j0, mut i_done) = (0, i0);
            if blocks {
                // Whole 8×8 blocks of the tile; the rest of its rows and columns below.
                i_done = i0 + (i1 - i0) / 8 * 8;
                j0 = cols / 8 * 8;
                for j in (0..j0).step_by(8) {
                    for i in (i0..i_done).step_by(8) {
                        // SAFETY: `blocks` implies AVX and 4-byte elements; rows i..i+8 of
                        // columns col0+j..col0+j+8 are inside matrix `mat` of `src` (i + 8 ≤ r,
                        // j + 8 ≤ cols), output rows j..j+8 at i..i+8 inside `dst`, and `dst`
                        // is a separate allocation.
                        unsafe {
                            transpose_8x8(
                                s.as_ptr().add(i * c + col0 + j) as *const f32,
                                c,
                                dst.as_mut_ptr().add(j * r + i) as *mut f32,
                                r,
                            )
                        };
                    }
                }
            }
            for j in 0..cols {
                let drow = &mut dst[j * r..(j + 1) * r];
                let from = if j < j0 { i_done } else { i0 };
                for i in from..i1 {
                    drow[i].write(s[i * c + col0 + j]);
                }
            }
        }
    };
    let bands_per_mat = c.div_ceil(TILE);
    let run = |(t, dst): (usize, &mut [MaybeUninit<T>])| {
        let mat = t / bands_per_mat;
        work(mat, (t % bands_per_mat) * TILE, dst)
    };
    let spare = &mut out.spare_capacity_mut()[..src.len()];
    // Output chunks of one band each; the last band of every matrix may be narrower, so split
    // per matrix first.
    if src.len() >= PAR_MIN {
        let _awake = crate::threads::Linger;
        spare.par_chunks_mut(r * c).enumerate().for_each(|(mat, m)| {
            m.par_chunks_mut(band).enumerate().for_each(|(b, dst)| run((mat * bands_per_mat + b, dst)));
        });
    } else {
        for (mat, m) in spare.chunks_mut(r * c).enumerate() {
            for (b, dst) in m.chunks_mut(band).enumerate() {
                run((mat * bands_per_mat + b, dst));
            }
        }
    }
    // SAFETY: each band of `TILE` output rows (r elements each) of each matrix is written
    // whole: rows `j` of the band for every `i` in `0..r`, so all `src.len()` elements are set.
    unsafe { out.set_len(src.len()) };
    out
}

/// Transposes the 8×8 block of 4-byte elements at `src` (row stride `ss`) into `dst` (row
/// stride `ds`) in eight AVX registers: unpack pairs, shuffle quads, swap 128-bit halves.
///
/// # Safety
/// The CPU has AVX; rows `0..8` of both blocks, 8 elements each, are in bounds, and the two
/// blocks do not overlap.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx")]
unsafe fn transpose_8x8(src: *const f32, ss: usize, dst: *mut f32, ds: usize) {
    use std::arch::x86_64::*;
    let r: [__m256; 8] = std::array::from_fn(|i| _mm256_loadu_ps(src.add(i * ss)));
    let t0 = _mm256_unpacklo_ps(r[0], r[1]);
    let t1 = _mm256_unpackhi_ps(r[0], r[1]);
    let t2 = _mm256_unpacklo_ps(r[2], r[3]);
    let t3 = _mm256_unpackhi_ps(r[2], r[3]);
    let t4 = _mm256_unpacklo_ps(r[4], r[5]);
    let t5 = _mm256_unpackhi_ps(r[4], r[5]);
    let t6 = _mm256_unpacklo_ps(r[6], r[7]);
    let t7 = _mm256_unpackhi_ps(r[6], r[7]);
    let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
    let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
    let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
    let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
    let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
    let u5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
    let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
    let u7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
    let o = [
        _mm256_permute2f128_ps::<0x20>(u0, u4),
        _mm256_permute2f128_ps::<0x20>(u1, u5),
        _mm256_permute2f128_ps::<0x20>(u2, u6),
        _mm256_permute2f128_ps::<0x20>(u3, u7),
        _mm256_permute2f128_ps::<0x31>(u0, u4),
        _mm256_permute2f128_ps::<0x31>(u1, u5),
        _mm256_permute2f128_ps::<0x31>(u2, u6),
        _mm256_permute2f128_ps::<0x31>(u3, u7),
    ];
    for (i, v) in o.into_iter().enumerate() {
        _mm256_storeu_ps(dst.add(i * ds), v);
    }
}

/// The same block moved element by element (`blocks` is never set off x86-64).
///
/// # Safety
/// As for the x86-64 version, without the CPU requirement.
#[cfg(not(target_arch = "x86_64"))]
unsafe fn transpose_8x8(src: *const f32, ss: usize, dst: *mut f32, ds: usize) {
    for i in 0..8 {
        for j in 0..8 {
            *dst.add(j * ds + i) = *src.add(i * ss + j);
        }
    }
}

/// Joins tensors of one dtype along an existing axis; the other dimensions must agree.
pub fn concat(xs: &[Tensor], axis: usize) -> Result<Tensor, KernelError> {
    let first = xs.first().ok_or_else(|| KernelError::Invalid("concat: needs at least one tensor".into()))?;
    check_axis("concat", axis, first.rank())?;
    let refs: Vec<&Tensor> = xs.iter().collect();
    same_dtype("concat", &refs)?;
    for x in &xs[1..] {
        let agree =
            x.rank() == first.rank() && (0..first.rank()).all(|d| d == axis || x.shape()[d] == first.shape()[d]);
        if !agree {
            return Err(KernelError::ShapeMismatch {
                op: "concat",
                lhs: first.shape().to_vec(),
                rhs: x.shape().to_vec(),
            });
        }
    }
    let outer: usize = first.shape()[..axis].iter().product();
    let inner: usize = first.shape()[axis + 1..].iter().product();
    // The joined axis is summed in u128 (it cannot overflow there) and the result checked
    // like any new shape: many large parts may add up to more than fits.
    let joined: u128 = xs.iter().map(|x| x.shape()[axis] as u128).sum();
    let mut wide: Vec<u128> = first.shape().iter().map(|&d| d as u128).collect();
    wide[axis] = joined;
    let mut shape = first.shape().to_vec();
    shape[axis] = usize::try_from(joined).map_err(|_| KernelError::SizeOverflow { dims: wide })?;
    if checked_numel(&shape)? == 0 {
        // An empty result: the copy loop below would still run `outer` times, which may be 2^40.
        return zeros(first.dtype(), &shape);
    }
    fn join<T: Element>(xs: &[Tensor], axis: usize, outer: usize, inner: usize) -> Vec<T> {
        let parts: Vec<(&[T], usize)> =
            xs.iter().map(|x| (x.data::<T>().expect("dtypes checked"), x.shape()[axis] * inner)).collect();
        let total: usize = parts.iter().map(|p| p.0.len()).sum();
        let mut out = Vec::with_capacity(total);
        for o in 0..outer {
            for &(data, w) in &parts {
                out.extend_from_slice(&data[o * w..(o + 1) * w]);
            }
        }
        out
    }
    Ok(match first.dtype() {
        DType::F32 => Tensor::from_parts(shape, join::<f32>(xs, axis, outer, inner)),
        DType::F64 => Tensor::from_parts(shape, join::<f64>(xs, axis, outer, inner)),
        DType::I32 => Tensor::from_parts(shape, join::<i32>(xs, axis, outer, inner)),
        DType::Bool => Tensor::from_parts(shape, join::<bool>(xs, axis, outer, inner)),
        DType::Bf16 => Tensor::from_parts(shape, join::<half::bf16>(xs, axis, outer, inner)),
        DType::F16 => Tensor::from_parts(shape, join::<half::f16>(xs, axis, outer, inner)),
    })
}

/// Joins tensors of one shape and dtype along a new axis `axis` (at most their rank).
pub fn stack(xs: &[Tensor], axis: usize) -> Result<Tensor, KernelError> {
    let first = xs.first().ok_or_else(|| KernelError::Invalid("stack: needs at least one tensor".into()))?;
    for x in &xs[1..] {
        if x.shape() != first.shape() {
            return Err(KernelError::ShapeMismatch {
                op: "stack",
                lhs: first.shape().to_vec(),
                rhs: x.shape().to_vec(),
            });
        }
    }
    let expanded: Vec<Tensor> = xs.iter().map(|x| expand_dims(x, axis)).collect::<Result<_, _>>()?;
    concat(&expanded, axis)
}

/// Inserts a size-1 axis at position `axis` (at most the rank).
pub fn expand_dims(x: &Tensor, axis: usize) -> Result<Tensor, KernelError> {
    check_axis("expand_dims", axis, x.rank() + 1)?;
    let mut shape = x.shape().to_vec();
    shape.insert(axis, 1);
    x.with_shape(shape)
}

/// Removes the size-1 axis `axis`, or every size-1 axis when `None`.
pub fn squeeze(x: &Tensor, axis: Option<usize>) -> Result<Tensor, KernelError> {
    let shape: Vec<usize> = match axis {
        None => x.shape().iter().copied().filter(|&d| d != 1).collect(),
        Some(a) => {
            check_axis("squeeze", a, x.rank())?;
            if x.shape()[a] != 1 {
                return Err(KernelError::Invalid(format!("squeeze: axis {a} has size {}, not 1", x.shape()[a])));
            }
            let mut s = x.shape().to_vec();
            s.remove(a);
            s
        }
    };
    x.with_shape(shape)
}

/// Materialises `x` broadcast to `shape` (NumPy rules).
pub fn broadcast_to(x: &Tensor, shape: &[usize]) -> Result<Tensor, KernelError> {
    if x.shape() == shape {
        return Ok(x.clone());
    }
    let mismatch = || KernelError::ShapeMismatch { op: "broadcast_to", lhs: x.shape().to_vec(), rhs: shape.to_vec() };
    if x.rank() > shape.len() || broadcast_shapes("broadcast_to", x.shape(), shape)? != shape {
        return Err(mismatch());
    }
    let strides = broadcast_strides(x.shape(), shape);
    Ok(dispatch!(x, v => Tensor::from_parts(shape.to_vec(), strided_copy(v, 0, shape, &strides))))
}

/// The reverse of broadcasting: sums `x` over the dimensions that broadcasting `shape` to
/// `x.shape()` would have added or stretched. This is the gradient of `broadcast_to`.
pub fn sum_to_shape(x: &Tensor, shape: &[usize]) -> Result<Tensor, KernelError> {
    if x.shape() == shape {
        return Ok(x.clone());
    }
    let plan = sum_to_shape_plan(x.shape(), shape)?;
    let mut cur = x.clone();
    if let Some(flat) = plan.lead {
        cur = reduce(ReduceOp::Sum, &cur.with_shape(flat)?, Some(0), false)?;
    }
    for a in plan.axes {
        cur = reduce(ReduceOp::Sum, &cur, Some(a), true)?;
    }
    cur.with_shape(shape.to_vec())
}

/// The sums [`sum_to_shape`] takes, which a device takes in the same order: the axes before
/// the last `to.len()` as one (`lead`: the shape `from` is seen as, with them as its first
/// axis; `None` when there are none), then each axis in `axes`, kept as size 1.
pub(crate) struct SumToShapePlan {
    pub lead: Option<Vec<usize>>,
    pub axes: Vec<usize>,
}

/// The plan of summing a tensor of shape `from` down to `to`, or the mismatch.
pub(crate) fn sum_to_shape_plan(from: &[usize], to: &[usize]) -> Result<SumToShapePlan, KernelError> {
    let mismatch = || KernelError::ShapeMismatch { op: "sum_to_shape", lhs: from.to_vec(), rhs: to.to_vec() };
    let lead = from.len().checked_sub(to.len()).ok_or_else(mismatch)?;
    let rest = &from[lead..];
    if to.iter().zip(rest).any(|(&t, &d)| d != t && t != 1) {
        return Err(mismatch());
    }
    let flat = (lead > 0).then(|| {
        let mut s = vec![from[..lead].iter().product()];
        s.extend_from_slice(rest);
        s
    });
    let axes = (0..to.len()).filter(|&i| to[i] == 1 && rest[i] != 1).collect();
    Ok(SumToShapePlan { lead: flat, axes })
}

/// A tensor of `shape` with every element `v` (converted like [`Element::from_f64`]), or a
/// [`KernelError::SizeOverflow`] when the shape has too many elements.
pub fn full(dtype: DType, shape: &[usize], v: f64) -> Result<Tensor, KernelError> {
    fn fill<T: Element>(shape: &[usize], n: usize, v: f64) -> Tensor {
        Tensor::from_parts(shape.to_vec(), vec![T::from_f64(v); n])
    }
    let n = checked_numel(shape)?;
    Ok(match dtype {
        DType::F32 => fill::<f32>(shape, n, v),
        DType::F64 => fill::<f64>(shape, n, v),
        DType::I32 => fill::<i32>(shape, n, v),
        DType::Bool => fill::<bool>(shape, n, v),
        DType::Bf16 => fill::<half::bf16>(shape, n, v),
        DType::F16 => fill::<half::f16>(shape, n, v),
    })
}

/// A tensor of zeros (false for bool).
pub fn zeros(dtype: DType, shape: &[usize]) -> Result<Tensor, KernelError> {
    full(dtype, shape, 0.0)
}

/// A tensor of ones (true for bool).
pub fn ones(dtype: DType, shape: &[usize]) -> Result<Tensor, KernelError> {
    full(dtype, shape, 1.0)
}

/// `[0, 1, ..., n-1]` in the given dtype (bool: `[false, true, true, ...]`).
pub fn arange(n: usize, dtype: DType) -> Result<Tensor, KernelError> {
    checked_numel(&[n])?;
    // The values below 2^53 are exact in f64; an i32 arange must not run past i32::MAX, where
    // the conversion would saturate.
    if dtype == DType::I32 && n > 1 << 31 {
        return Err(KernelError::Invalid(format!("arange: {n} values do not fit in i32 (at most 2147483648)")));
    }
    Ok(Tensor::from_parts(vec![n], (0..n).map(|i| i as f64).collect::<Vec<f64>>()).cast(dtype))
}

/// The `n×n` identity matrix.
pub fn eye(n: usize, dtype: DType) -> Result<Tensor, KernelError> {
    let mut v = vec![0.0f64; checked_numel(&[n, n])?];
    for i in 0..n {
        v[i * n + i] = 1.0;
    }
    Ok(Tensor::from_parts(vec![n, n], v).cast(dtype))
}
