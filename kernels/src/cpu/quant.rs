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

#[cfg(target_arch = "x86_64")]
fn has_vnni() -> bool {
    static VNNI: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *VNNI.get_or_init(|| {
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

/// `x @ w` for `x: f32[.., I]` and an int8 `w[I, O]`: `[.., O]`. Each row of `x` is quantized
/// with its own scale `max |x| / 127`; a row holding NaN or infinity gives NaN.
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
    #[cfg(target_arch = "x86_64")]
    let vnni = has_vnni();
    out.par_chunks_mut(o_n).enumerate().for_each(|(r, orow)| {
        let xr = &xv[r * i_n..(r + 1) * i_n];
        let top = xr.iter().fold(0f32, |m, v| if v.is_nan() || m.is_nan() { f32::NAN } else { m.max(v.abs()) });
        if !top.is_finite() {
            orow.fill(f32::NAN);
            return;
        }
        let sx = top / 127.0;
        let xq: Vec<i8> = xr.iter().map(|&v| if sx > 0.0 { to_i8(v / sx) } else { 0 }).collect();
        #[cfg(target_arch = "x86_64")]
        let xu: Vec<u8> = if vnni { xq.iter().map(|&q| (q as i16 + 128) as u8).collect() } else { Vec::new() };
        let chunk = if n < 4 { 16 } else { o_n };
        orow.par_chunks_mut(chunk).enumerate().for_each(|(c, oc)| {
            for (j, y) in oc.iter_mut().enumerate() {
                let o = c * chunk + j;
                let col = &w.data_t[o * i_n..(o + 1) * i_n];
                #[cfg(target_arch = "x86_64")]
                let acc = if vnni {
                    // SAFETY: `vnni` is true only when the CPU reports the features.
                    unsafe { dot_vnni(&xu, col, w.sums[o]) }
                } else {
                    vectorized(
                        #[inline(always)]
                        || dot_i8(&xq, col),
                    )
                };
                #[cfg(not(target_arch = "x86_64"))]
                let acc = dot_i8(&xq, col);
                *y = acc as f32 * sx * w.scales[o];
            }
        });
    });
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
        let top = xr.iter().fold(0f32, |m, v| if v.is_nan() || m.is_nan() { f32::NAN } else { m.max(v.abs()) });
        let sx = top / 127.0;
        let xq: Vec<i8> = xr.iter().map(|&v| if sx > 0.0 { to_i8(v / sx) } else { 0 }).collect();
        for o in 0..o_n {
            let acc = dot_i8(&xq, &w.data_t[o * i_n..(o + 1) * i_n]);
            out.push(if top.is_finite() { acc as f32 * sx * w.scales[o] } else { f32::NAN });
        }
    }
    Tensor::from_f32(shape, out)
}
