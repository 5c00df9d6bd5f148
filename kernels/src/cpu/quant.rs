//! Symmetric int8 quantization of weight matrices, per output channel, and the int8 matrix
//! product `x @ w` with activations quantized per row at run time (dynamic quantization, as
//! `torch.ao.quantization.quantize_dynamic`). Products accumulate exactly in `i32`; on CPUs with
//! AVX-512 VNNI the dot products are `vpdpbusd`, elsewhere a loop the compiler vectorises (AVX2
//! `vpmaddwd`), with identical results: integer sums have no rounding.

use rayon::prelude::*;

use crate::error::KernelError;
use crate::simd::vectorized;
use crate::tensor::{checked_numel, DType, Tensor};

/// A matrix `w[I, O]` as int8 values with one `f32` scale per output channel (column):
/// `w[i, o] ≈ q[i, o] · scale[o]`, `q` in `-127..=127`, `scale[o] = max |w[:, o]| / 127`.
#[derive(Clone, Debug, PartialEq)]
pub struct QuantMatrix {
    rows: usize,
    cols: usize,
    /// The values transposed, `[O, I]`: each channel's weights are contiguous.
    data_t: Vec<i8>,
    scales: Vec<f32>,
    /// Σᵢ q[i, o] per channel, the correction of VNNI's unsigned activations.
    sums: Vec<i32>,
}

#[inline]
fn to_i8(v: f32) -> i8 {
    v.round_ties_even().clamp(-127.0, 127.0) as i8
}

impl QuantMatrix {
    /// Quantizes an `f32` matrix. A channel of zeros gets scale 0; NaN or infinity is an error.
    pub fn quantize(w: &Tensor) -> Result<QuantMatrix, KernelError> {
        let (Some(v), [rows, cols]) = (w.as_f32(), w.shape()) else {
            return Err(KernelError::Invalid(format!(
                "quantize: needs an f32 matrix, found {}{:?}",
                w.dtype().name(),
                w.shape()
            )));
        };
        let (rows, cols) = (*rows, *cols);
        if let Some(i) = v.iter().position(|x| !x.is_finite()) {
            return Err(KernelError::Invalid(format!(
                "quantize: the weight at [{}, {}] is {}",
                i / cols.max(1),
                i % cols.max(1),
                v[i]
            )));
        }
        let mut scales = vec![0f32; cols];
        for row in v.chunks(cols.max(1)) {
            for (s, x) in scales.iter_mut().zip(row) {
                *s = s.max(x.abs());
            }
        }
        scales.iter_mut().for_each(|s| *s /= 127.0);
        let mut data_t = vec![0i8; rows * cols];
        for (i, row) in v.chunks(cols.max(1)).enumerate() {
            for (o, &x) in row.iter().enumerate() {
                if scales[o] > 0.0 {
                    data_t[o * rows + i] = to_i8(x / scales[o]);
                }
            }
        }
        Ok(QuantMatrix::from_transposed(rows, cols, data_t, scales))
    }

    fn from_transposed(rows: usize, cols: usize, data_t: Vec<i8>, scales: Vec<f32>) -> QuantMatrix {
        let sums = (0..cols).map(|o| data_t[o * rows..(o + 1) * rows].iter().map(|&q| q as i32).sum()).collect();
        QuantMatrix { rows, cols, data_t, scales, sums }
    }

    /// A matrix from its int8 values in row-major `[I, O]` order and its `O` scales (a file's).
    pub fn from_parts(rows: usize, cols: usize, q: &[i8], scales: Vec<f32>) -> Result<QuantMatrix, KernelError> {
        if q.len() != rows * cols || scales.len() != cols {
            return Err(KernelError::Invalid(format!(
                "quantized matrix [{rows}, {cols}]: {} values and {} scales",
                q.len(),
                scales.len()
            )));
        }
        let mut data_t = vec![0i8; q.len()];
        for (i, row) in q.chunks(cols.max(1)).enumerate() {
            for (o, &x) in row.iter().enumerate() {
                data_t[o * rows + i] = x;
            }
        }
        Ok(QuantMatrix::from_transposed(rows, cols, data_t, scales))
    }

    /// `[I, O]`.
    pub fn shape(&self) -> [usize; 2] {
        [self.rows, self.cols]
    }

    /// The int8 values in row-major `[I, O]` order (what a file stores).
    pub fn values(&self) -> Vec<i8> {
        let mut q = vec![0i8; self.data_t.len()];
        for (o, col) in self.data_t.chunks(self.rows.max(1)).enumerate() {
            for (i, &x) in col.iter().enumerate() {
                q[i * self.cols + o] = x;
            }
        }
        q
    }

    pub fn scales(&self) -> &[f32] {
        &self.scales
    }

    /// Bytes held: one per value and four per scale.
    pub fn bytes(&self) -> usize {
        self.data_t.len() + 4 * self.scales.len()
    }

    /// The `f32` matrix the int8 values stand for, `q · scale`.
    pub fn dequantize(&self) -> Tensor {
        let mut v = vec![0f32; self.rows * self.cols];
        for (o, col) in self.data_t.chunks(self.rows.max(1)).enumerate() {
            for (i, &q) in col.iter().enumerate() {
                v[i * self.cols + o] = q as f32 * self.scales[o];
            }
        }
        Tensor::from_f32(vec![self.rows, self.cols], v).unwrap_or_else(|_| Tensor::scalar_f32(0.0))
    }
}

/// Σ a·b over int8 vectors, exactly, in `i32`.
#[inline(always)]
fn dot_i8(a: &[i8], b: &[i8]) -> i32 {
    let mut acc = 0i32;
    for (&x, &y) in a.iter().zip(b) {
        acc = acc.wrapping_add(x as i32 * y as i32);
    }
    acc
}

/// Whether the int8 products use `vpdpbusd`: the CPU has AVX-512 VNNI and the vector builds are
/// on (`MSL_SIMD=baseline` or `simd::set_avx2(false)` keeps every kernel portable).
#[cfg(target_arch = "x86_64")]
fn has_vnni() -> bool {
    static VNNI: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    crate::simd::avx2_enabled()
        && *VNNI.get_or_init(|| {
            std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512bw")
                && std::arch::is_x86_feature_detected!("avx512vnni")
        })
}

/// `Σ a·b` with `vpdpbusd`: `a` shifted to unsigned (`a + 128`), corrected by `128 · Σ b`.
///
/// # Safety
/// The CPU must support AVX-512F, AVX-512BW and AVX-512 VNNI.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn dot_vnni(au: &[u8], b: &[i8], b_sum: i32) -> i32 {
    use std::arch::x86_64::*;
    let n = au.len().min(b.len());
    let mut acc = _mm512_setzero_si512();
    let mut i = 0;
    while i + 64 <= n {
        // SAFETY: i + 64 ≤ n, so both 64-byte loads are in bounds.
        let (x, y) =
            unsafe { (_mm512_loadu_si512(au.as_ptr().add(i).cast()), _mm512_loadu_si512(b.as_ptr().add(i).cast())) };
        acc = _mm512_dpbusd_epi32(acc, x, y);
        i += 64;
    }
    let mut s = _mm512_reduce_add_epi32(acc);
    while i < n {
        s = s.wrapping_add(au[i] as i32 * b[i] as i32);
        i += 1;
    }
    s.wrapping_sub(128 * b_sum)
}

/// A 4×4 tile of dot products with `vpdpbusd`: rows `x` (unsigned, `q + 128`) against
/// columns `w`, uncorrected (the caller subtracts `128 · Σ w`). Each load feeds four products.
///
/// # Safety
/// The CPU must support AVX-512F, AVX-512BW and AVX-512 VNNI; all slices have one length.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn tile_vnni(x: [&[u8]; 4], w: [&[i8]; 4]) -> [[i32; 4]; 4] {
    use std::arch::x86_64::*;
    let n = x.iter().map(|r| r.len()).chain(w.iter().map(|c| c.len())).min().unwrap_or(0);
    let mut acc = [[_mm512_setzero_si512(); 4]; 4];
    let mut i = 0;
    while i + 64 <= n {
        // SAFETY: i + 64 ≤ n ≤ every slice's length. (Plain loads, not closures: a closure
        // would not inherit the target features.)
        let (xs, ws) = unsafe {
            let lx = |k: usize| x[k].as_ptr().add(i).cast::<__m512i>();
            let lw = |k: usize| w[k].as_ptr().add(i).cast::<__m512i>();
            (
                [
                    _mm512_loadu_si512(lx(0)),
                    _mm512_loadu_si512(lx(1)),
                    _mm512_loadu_si512(lx(2)),
                    _mm512_loadu_si512(lx(3)),
                ],
                [
                    _mm512_loadu_si512(lw(0)),
                    _mm512_loadu_si512(lw(1)),
                    _mm512_loadu_si512(lw(2)),
                    _mm512_loadu_si512(lw(3)),
                ],
            )
        };
        for a in 0..4 {
            for b in 0..4 {
                acc[a][b] = _mm512_dpbusd_epi32(acc[a][b], xs[a], ws[b]);
            }
        }
        i += 64;
    }
    let mut out = [[0i32; 4]; 4];
    for a in 0..4 {
        for b in 0..4 {
            let tail: i32 = (i..n).map(|k| x[a][k] as i32 * w[b][k] as i32).sum();
            out[a][b] = _mm512_reduce_add_epi32(acc[a][b]).wrapping_add(tail);
        }
    }
    out
}

/// `v` rounded to the nearest integer, ties to even, for |v| ≤ 2²²: adding and subtracting
/// 1.5 · 2²³ leaves the rounded value (the default rounding mode), in two vector instructions
/// where `round_ties_even` is a call per element.
#[inline(always)]
fn round_even(v: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0;
    (v + MAGIC) - MAGIC
}

/// One row of `x` quantized: its scale (NaN when the row holds NaN or infinity) and values.
fn quantize_row(xr: &[f32]) -> (f32, Vec<i8>) {
    vectorized(
        #[inline(always)]
        || {
            let mut top = 0f32;
            let mut bad = false;
            for &v in xr {
                bad |= !v.is_finite();
                top = top.max(v.abs());
            }
            if bad {
                return (f32::NAN, vec![0; xr.len()]);
            }
            let sx = top / 127.0;
            let inv = if sx > 0.0 { 1.0 / sx } else { 0.0 };
            (sx, xr.iter().map(|&v| round_even((v * inv).clamp(-127.0, 127.0)) as i8).collect())
        },
    )
}

/// `x @ w` for `x: f32[.., I]` and an int8 `w[I, O]`: `[.., O]`. Each row of `x` is quantized
/// with its own scale `max |x| / 127`; a row holding NaN or infinity gives NaN. Four or more
/// rows are computed in 4×4 tiles (VNNI); fewer (generation) split the columns between threads.
pub fn matmul_i8(x: &Tensor, w: &QuantMatrix) -> Result<Tensor, KernelError> {
    let Some(xv) = x.as_f32() else {
        return Err(KernelError::DTypeMismatch {
            op: "matmul",
            expected: "f32".into(),
            found: x.dtype().name().into(),
        });
    };
    let (i_n, o_n) = (w.rows, w.cols);
    if x.rank() == 0 || x.shape()[x.rank() - 1] != i_n {
        return Err(KernelError::ShapeMismatch { op: "matmul", lhs: x.shape().to_vec(), rhs: vec![i_n, o_n] });
    }
    let mut shape = x.shape().to_vec();
    *shape.last_mut().unwrap_or(&mut 0) = o_n;
    let total = checked_numel(&shape)?;
    let n = total / o_n.max(1);
    let mut out = vec![0f32; total];
    if o_n == 0 {
        return Tensor::from_f32(shape, out);
    }
    let rows: Vec<(f32, Vec<i8>)> = (0..n).into_par_iter().map(|r| quantize_row(&xv[r * i_n..(r + 1) * i_n])).collect();
    #[cfg(target_arch = "x86_64")]
    let vnni = has_vnni();
    #[cfg(not(target_arch = "x86_64"))]
    let vnni = false;
    let unsigned: Vec<Vec<u8>> = if vnni {
        rows.par_iter().map(|(_, q)| q.iter().map(|&v| (v as u8) ^ 0x80).collect()).collect()
    } else {
        vec![]
    };
    let col = |o: usize| &w.data_t[o * i_n..(o + 1) * i_n];
    let scaled = |r: usize, o: usize, acc: i32| acc as f32 * rows[r].0 * w.scales[o];
    let dot = |r: usize, o: usize| -> i32 {
        #[cfg(target_arch = "x86_64")]
        if vnni {
            // SAFETY: `vnni` is true only when the CPU reports the features.
            return unsafe { dot_vnni(&unsigned[r], col(o), w.sums[o]) };
        }
        vectorized(
            #[inline(always)]
            || dot_i8(&rows[r].1, col(o)),
        )
    };
    if n >= 4 {
        // Blocks of 64 rows per task; within one, 64 columns at a time (64 KB of weights, kept
        // in cache while every 4-row tile of the block uses them).
        out.par_chunks_mut(64 * o_n).enumerate().for_each(|(b, ob)| {
            let (r0, nr) = (64 * b, ob.len() / o_n);
            let full = if vnni { nr / 4 * 4 } else { 0 };
            let tiled = if vnni { o_n / 4 * 4 } else { 0 };
            #[cfg(target_arch = "x86_64")]
            for c0 in (0..tiled).step_by(64) {
                for a0 in (0..full).step_by(4) {
                    for o in (c0..(c0 + 64).min(tiled)).step_by(4) {
                        let xs = std::array::from_fn(|a| &unsigned[r0 + a0 + a][..]);
                        // SAFETY: as above; every row and column has I entries.
                        let t = unsafe { tile_vnni(xs, std::array::from_fn(|c| col(o + c))) };
                        for (a, row) in t.iter().enumerate() {
                            for (c, &acc) in row.iter().enumerate() {
                                let v = scaled(r0 + a0 + a, o + c, acc.wrapping_sub(128 * w.sums[o + c]));
                                ob[(a0 + a) * o_n + o + c] = v;
                            }
                        }
                    }
                }
            }
            // What the tiles leave: the last columns of tiled rows, and untiled rows whole.
            for a in 0..nr {
                let from = if a < full { tiled } else { 0 };
                for c in from..o_n {
                    ob[a * o_n + c] = scaled(r0 + a, c, dot(r0 + a, c));
                }
            }
        });
    } else {
        for (r, orow) in out.chunks_mut(o_n).enumerate() {
            orow.par_chunks_mut(64).enumerate().for_each(|(c, oc)| {
                for (j, y) in oc.iter_mut().enumerate() {
                    *y = scaled(r, 64 * c + j, dot(r, 64 * c + j));
                }
            });
        }
    }
    Tensor::from_f32(shape, out)
}

/// The same product with the portable loop only (what a CPU without VNNI computes), for tests.
pub fn matmul_i8_portable(x: &Tensor, w: &QuantMatrix) -> Result<Tensor, KernelError> {
    let xv = x.as_f32().unwrap_or(&[]);
    let (i_n, o_n) = (w.rows, w.cols);
    if x.rank() == 0 || x.shape()[x.rank() - 1] != i_n || x.dtype() != DType::F32 {
        return Err(KernelError::ShapeMismatch { op: "matmul", lhs: x.shape().to_vec(), rhs: vec![i_n, o_n] });
    }
    let mut shape = x.shape().to_vec();
    *shape.last_mut().unwrap_or(&mut 0) = o_n;
    let total = checked_numel(&shape)?;
    let mut out = Vec::with_capacity(total);
    for r in 0..total / o_n.max(1) {
        let xr = &xv[r * i_n..(r + 1) * i_n];
        let (sx, xq) = quantize_row(xr);
        for o in 0..o_n {
            let acc = dot_i8(&xq, &w.data_t[o * i_n..(o + 1) * i_n]);
            out.push(acc as f32 * sx * w.scales[o]);
        }
    }
    Tensor::from_f32(shape, out)
}
