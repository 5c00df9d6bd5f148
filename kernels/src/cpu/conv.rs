//! 2-D convolution (cross-correlation, NCHW, as `torch.nn.functional.conv2d`) and its two
//! gradients, lowered to the GEMM: each image is unfolded into columns (im2col), multiplied by
//! the weight matrix with the `gemm` crate, and the input gradient folds columns back (col2im).
//!
//! Work is split over images (one column buffer per rayon task), so the sums of one image never
//! depend on the thread count; the weight gradient adds the images of fixed groups of
//! [`WGRAD_GROUP`] first and then the groups in order, so it is the same on every machine too.

use rayon::prelude::*;

use crate::cpu::matmul::GemmElement;
use crate::error::KernelError;
use crate::tensor::{checked_numel, Element, Storage, Tensor};

/// Images per partial sum of the weight gradient (a fixed number, for reproducible sums).
const WGRAD_GROUP: usize = 4;

/// Images per rayon task of the forward product and the input gradient.
const IMAGES_PER_TASK: usize = 4;

/// Multiply-adds from which one product uses all rayon threads inside `gemm`.
const GEMM_PAR_MIN: usize = 64 * 64 * 64;

/// The sizes of one convolution: input `[n, c, h, w]`, weights `[o, c, kh, kw]`, output
/// `[n, o, oh, ow]` with `oh = (h + 2·pad - kh) / stride + 1` (floor division, as PyTorch).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Conv2dGeometry {
    pub n: usize,
    pub c: usize,
    pub h: usize,
    pub w: usize,
    pub o: usize,
    pub kh: usize,
    pub kw: usize,
    pub stride: usize,
    /// Zero padding above and below (`pad_h`) and left and right (`pad_w`); the public
    /// operations pad both alike, the transposed convolution of the input gradient not.
    pub pad_h: usize,
    pub pad_w: usize,
    pub oh: usize,
    pub ow: usize,
}

impl Conv2dGeometry {
    /// Checks the sizes and computes the output size; a zero stride or a kernel larger than
    /// the padded input is an error (as in PyTorch), never a panic.
    pub fn new(
        op: &'static str,
        x: [usize; 4],
        wt: [usize; 4],
        stride: usize,
        pad: usize,
    ) -> Result<Conv2dGeometry, KernelError> {
        let [n, c, h, w] = x;
        let [o, c2, kh, kw] = wt;
        if c != c2 {
            return Err(KernelError::Invalid(format!(
                "{op}: the input has {c} channels but the weights expect {c2} (input {:?}, weights {:?})",
                x, wt
            )));
        }
        if stride == 0 {
            return Err(KernelError::Invalid(format!("{op}: the stride must be at least 1")));
        }
        let (ph, pw) = (h.saturating_add(2 * pad), w.saturating_add(2 * pad));
        if kh == 0 || kw == 0 || kh > ph || kw > pw {
            return Err(KernelError::Invalid(format!(
                "{op}: the kernel {kh}×{kw} does not fit the input {h}×{w} padded by {pad} ({ph}×{pw})"
            )));
        }
        let (oh, ow) = ((ph - kh) / stride + 1, (pw - kw) / stride + 1);
        checked_numel(&[n, o, oh, ow])?;
        checked_numel(&[c, kh, kw, oh, ow])?;
        Ok(Conv2dGeometry { n, c, h, w, o, kh, kw, stride, pad_h: pad, pad_w: pad, oh, ow })
    }

    /// Rows of the unfolded image: one per (channel, kernel row, kernel column).
    fn ck(&self) -> usize {
        self.c * self.kh * self.kw
    }

    /// Output positions per image (the columns of the unfolded image).
    fn p(&self) -> usize {
        self.oh * self.ow
    }

    /// Floating-point operations of the forward product (2 per multiply-add).
    pub fn flops(&self) -> f64 {
        2.0 * (self.n * self.o * self.p()) as f64 * self.ck() as f64
    }

    /// For output column `o0..` along one axis, the valid range of outputs whose input index
    /// `out·stride + k - pad` lies in `0..len`.
    fn valid(&self, k: usize, len: usize, outs: usize, pad: usize) -> (usize, usize) {
        let s = self.stride;
        // out·s + k ≥ pad  ⇔  out ≥ ceil((pad - k) / s)
        let lo = if k >= pad { 0 } else { (pad - k).div_ceil(s) };
        // out·s + k - pad ≤ len - 1  ⇔  out ≤ (len - 1 + pad - k) / s
        let hi = if len + pad > k { ((len - 1 + pad - k) / s + 1).min(outs) } else { 0 };
        (lo.min(hi), hi)
    }
}

fn rank4(op: &'static str, t: &Tensor, what: &str) -> Result<[usize; 4], KernelError> {
    match t.shape() {
        &[a, b, c, d] => Ok([a, b, c, d]),
        s => Err(KernelError::Invalid(format!("{op}: {what} must have rank 4, found shape {s:?}"))),
    }
}

fn same_float(op: &'static str, a: &Tensor, b: &Tensor) -> Result<(), KernelError> {
    if a.dtype() != b.dtype() {
        return Err(KernelError::DTypeMismatch {
            op,
            expected: format!("operands of one element type ({})", a.dtype()),
            found: b.dtype().to_string(),
        });
    }
    if !a.dtype().is_float() {
        return Err(KernelError::dtype(op, "a float tensor", a.dtype()));
    }
    Ok(())
}

/// `conv2d(x, w, stride, padding)`: `x[n, c, h, w]` correlated with `w[o, c, kh, kw]`, giving
/// `[n, o, oh, ow]`. No bias: the caller adds it.
pub fn conv2d(x: &Tensor, w: &Tensor, stride: usize, padding: usize) -> Result<Tensor, KernelError> {
    let op = "conv2d";
    same_float(op, x, w)?;
    let g = Conv2dGeometry::new(op, rank4(op, x, "the input")?, rank4(op, w, "the weights")?, stride, padding)?;
    let shape = vec![g.n, g.o, g.oh, g.ow];
    Ok(match (x.storage(), w.storage()) {
        (Storage::F32(a), Storage::F32(b)) => Tensor::from_parts(shape, forward(a, b, &g)),
        (Storage::F64(a), Storage::F64(b)) => Tensor::from_parts(shape, forward(a, b, &g)),
        _ => return Err(KernelError::dtype(op, "a float tensor", x.dtype())),
    })
}

/// The gradient of `conv2d` with respect to its input: `g[n, o, oh, ow]` and `w[o, c, kh, kw]`
/// give `[n, c, h, w]` (the transposed convolution); `h` and `w` are the input's size, which
/// floor division does not determine from the output's.
pub fn conv2d_input_grad(
    g: &Tensor,
    w: &Tensor,
    size: [usize; 2],
    stride: usize,
    padding: usize,
) -> Result<Tensor, KernelError> {
    let op = "conv2d_input_grad";
    same_float(op, g, w)?;
    let [n, o, oh, ow] = rank4(op, g, "the output gradient")?;
    let ws = rank4(op, w, "the weights")?;
    let geo = Conv2dGeometry::new(op, [n, ws[1], size[0], size[1]], ws, stride, padding)?;
    if o != geo.o || oh != geo.oh || ow != geo.ow {
        return Err(KernelError::ShapeMismatch { op, lhs: g.shape().to_vec(), rhs: vec![n, geo.o, geo.oh, geo.ow] });
    }
    let shape = vec![n, geo.c, geo.h, geo.w];
    Ok(match (g.storage(), w.storage()) {
        (Storage::F32(a), Storage::F32(b)) => Tensor::from_parts(shape, input_grad(a, b, &geo)),
        (Storage::F64(a), Storage::F64(b)) => Tensor::from_parts(shape, input_grad(a, b, &geo)),
        _ => return Err(KernelError::dtype(op, "a float tensor", g.dtype())),
    })
}

/// The gradient of `conv2d` with respect to its weights: `x[n, c, h, w]` and `g[n, o, oh, ow]`
/// give `[o, c, kh, kw]`; `kh` and `kw` are the kernel's size.
pub fn conv2d_weight_grad(
    x: &Tensor,
    g: &Tensor,
    kernel: [usize; 2],
    stride: usize,
    padding: usize,
) -> Result<Tensor, KernelError> {
    let op = "conv2d_weight_grad";
    same_float(op, x, g)?;
    let xs = rank4(op, x, "the input")?;
    let [n, o, oh, ow] = rank4(op, g, "the output gradient")?;
    let geo = Conv2dGeometry::new(op, xs, [o, xs[1], kernel[0], kernel[1]], stride, padding)?;
    if n != geo.n || oh != geo.oh || ow != geo.ow {
        return Err(KernelError::ShapeMismatch { op, lhs: g.shape().to_vec(), rhs: vec![geo.n, o, geo.oh, geo.ow] });
    }
    let shape = vec![o, geo.c, geo.kh, geo.kw];
    Ok(match (x.storage(), g.storage()) {
        (Storage::F32(a), Storage::F32(b)) => Tensor::from_parts(shape, weight_grad(a, b, &geo)),
        (Storage::F64(a), Storage::F64(b)) => Tensor::from_parts(shape, weight_grad(a, b, &geo)),
        _ => return Err(KernelError::dtype(op, "a float tensor", x.dtype())),
    })
}

/// The element types the convolutions run on.
trait ConvElement: GemmElement + Element + std::ops::AddAssign {
    /// Calls `f` with two scratch buffers of `a` and `b` elements (contents unspecified: every
    /// user overwrites them). They are kept per thread between calls, because allocating and
    /// clearing them for every task was 5 % of a training step; a nested call on the same
    /// thread (rayon may run another task while one waits) gets fresh buffers.
    fn with_scratch<R>(a: usize, b: usize, f: impl FnOnce(&mut [Self], &mut [Self]) -> R) -> R;
}

macro_rules! scratch_impl {
    ($t:ty) => {
        impl ConvElement for $t {
            fn with_scratch<R>(a: usize, b: usize, f: impl FnOnce(&mut [Self], &mut [Self]) -> R) -> R {
                thread_local! {
                    static SCRATCH: std::cell::RefCell<Vec<$t>> = const { std::cell::RefCell::new(Vec::new()) };
                }
                SCRATCH.with(|cell| match cell.try_borrow_mut() {
                    Ok(mut buf) => {
                        if buf.len() < a + b {
                            buf.resize(a + b, 0.0);
                        }
                        let (x, y) = buf[..a + b].split_at_mut(a);
                        f(x, y)
                    }
                    Err(_) => {
                        let mut buf = vec![0.0; a + b];
                        let (x, y) = buf.split_at_mut(a);
                        f(x, y)
                    }
                })
            }
        }
    };
}
scratch_impl!(f32);
scratch_impl!(f64);

/// Unfolds one image `x[c, h, w]` into `col[c·kh·kw, oh·ow]`; padding reads as zero.
fn im2col<T: ConvElement>(x: &[T], g: &Conv2dGeometry, col: &mut [T]) {
    let p = g.p();
    for c in 0..g.c {
        let plane = &x[c * g.h * g.w..(c + 1) * g.h * g.w];
        for ki in 0..g.kh {
            let (ylo, yhi) = g.valid(ki, g.h, g.oh, g.pad_h);
            for kj in 0..g.kw {
                let (xlo, xhi) = g.valid(kj, g.w, g.ow, g.pad_w);
                let r = (c * g.kh + ki) * g.kw + kj;
                let row = &mut col[r * p..(r + 1) * p];
                row[..ylo * g.ow].fill(T::default());
                row[yhi * g.ow..].fill(T::default());
                for oy in ylo..yhi {
                    let iy = oy * g.stride + ki - g.pad_h;
                    let src = &plane[iy * g.w..(iy + 1) * g.w];
                    let dst = &mut row[oy * g.ow..(oy + 1) * g.ow];
                    dst[..xlo].fill(T::default());
                    dst[xhi..].fill(T::default());
                    if g.stride == 1 {
                        let start = xlo + kj - g.pad_w;
                        dst[xlo..xhi].copy_from_slice(&src[start..start + (xhi - xlo)]);
                    } else {
                        for (ox, d) in dst.iter_mut().enumerate().take(xhi).skip(xlo) {
                            *d = src[ox * g.stride + kj - g.pad_w];
                        }
                    }
                }
            }
        }
    }
}

/// Folds `col[c·kh·kw, oh·ow]` back into one image `x[c, h, w]`, adding overlaps; `x` is
/// overwritten.
fn col2im<T: ConvElement>(col: &[T], g: &Conv2dGeometry, x: &mut [T]) {
    x.fill(T::default());
    let p = g.p();
    for c in 0..g.c {
        let plane = &mut x[c * g.h * g.w..(c + 1) * g.h * g.w];
        for ki in 0..g.kh {
            let (ylo, yhi) = g.valid(ki, g.h, g.oh, g.pad_h);
            for kj in 0..g.kw {
                let (xlo, xhi) = g.valid(kj, g.w, g.ow, g.pad_w);
                let r = (c * g.kh + ki) * g.kw + kj;
                let row = &col[r * p..(r + 1) * p];
                for oy in ylo..yhi {
                    let iy = oy * g.stride + ki - g.pad_h;
                    let dst = &mut plane[iy * g.w..(iy + 1) * g.w];
                    let src = &row[oy * g.ow..(oy + 1) * g.ow];
                    for ox in xlo..xhi {
                        dst[ox * g.stride + kj - g.pad_w] += src[ox];
                    }
                }
            }
        }
    }
}

/// `dst[m×n] (+)= a @ b` with `a`, `b` given by (row, column) strides; `dst` is row-major.
#[allow(clippy::too_many_arguments)]
fn gemm_into<T: ConvElement>(
    dst: &mut [T],
    (m, n, k): (usize, usize, usize),
    a: &[T],
    (a_rs, a_cs): (usize, usize),
    b: &[T],
    (b_rs, b_cs): (usize, usize),
    accumulate: bool,
    threaded: bool,
) {
    if m == 0 || n == 0 || k == 0 {
        if !accumulate {
            dst[..m * n].fill(T::default());
        }
        return;
    }
    let last_a = (m - 1) * a_rs + (k - 1) * a_cs;
    let last_b = (k - 1) * b_rs + (n - 1) * b_cs;
    assert!(dst.len() >= m * n && a.len() > last_a && b.len() > last_b);
    let par = if threaded && m.saturating_mul(n).saturating_mul(k) >= GEMM_PAR_MIN {
        gemm::Parallelism::Rayon(0)
    } else {
        gemm::Parallelism::None
    };
    // SAFETY: the assertion shows that every element read or written (rows and columns within
    // m, n, k at the given strides) lies inside the slices, and `dst` is exclusively borrowed,
    // so it aliases neither input.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            n as isize,
            accumulate,
            a.as_ptr(),
            a_cs as isize,
            a_rs as isize,
            b.as_ptr(),
            b_cs as isize,
            b_rs as isize,
            <T as GemmElement>::one(),
            <T as GemmElement>::one(),
            false,
            false,
            false,
            par,
        );
    }
}

/// `t` (`rows × cols`, row-major) transposed into `dst` (`cols × rows`).
fn transpose_into<T: ConvElement>(t: &[T], rows: usize, cols: usize, dst: &mut [T]) {
    const B: usize = 32;
    for r0 in (0..rows).step_by(B) {
        for c0 in (0..cols).step_by(B) {
            for r in r0..(r0 + B).min(rows) {
                for c in c0..(c0 + B).min(cols) {
                    dst[c * rows + r] = t[r * cols + c];
                }
            }
        }
    }
}

/// Output `[n, o, p]`, image by image: `gemm` is two to three times faster on the tall
/// product `colsᵀ [p, ck] @ wᵀ [ck, o]` than on the wide `w [o, ck] @ cols [ck, p]` (it
/// packs the 32-row left operand into half-empty 64-row panels), so the product is computed
/// transposed and copied into place.
fn forward<T: ConvElement>(x: &[T], w: &[T], g: &Conv2dGeometry) -> Vec<T> {
    let (ck, p, chw) = (g.ck(), g.p(), g.c * g.h * g.w);
    let mut out = vec![T::default(); g.n * g.o * p];
    if out.is_empty() || chw == 0 {
        return out;
    }
    let mut wt = vec![T::default(); ck * g.o];
    transpose_into(w, g.o, ck, &mut wt);
    // A few images per task, with one pair of buffers per task (rayon may call a
    // `for_each_init` initialiser once per image, and clearing the buffers cost 5 %).
    out.par_chunks_mut(IMAGES_PER_TASK * g.o * p).zip(x.par_chunks(IMAGES_PER_TASK * chw)).for_each(|(dst, xs)| {
        T::with_scratch(ck * p, p * g.o, |col, tmp| {
            for (dst, xi) in dst.chunks_mut(g.o * p).zip(xs.chunks(chw)) {
                im2col(xi, g, col);
                gemm_into(tmp, (p, g.o, ck), col, (1, p), &wt, (g.o, 1), false, g.n == 1);
                transpose_into(tmp, p, g.o, dst);
            }
        })
    });
    out
}

/// Input gradient `[n, c, h, w]`: columns `[ck, p]` = wᵀ `[ck, o]` @ g `[o, p]`, folded back.
///
/// At stride 1 with a padding below the kernel size it is instead the forward convolution of
/// `g` with the flipped, transposed kernel `w'[c, o, i, j] = w[o, c, KH-1-i, KW-1-j]` padded by
/// `K - 1 - p`: the same sums, as the tall product [`forward`] runs fast, where the folding
/// path multiplies with an inner size of only `o`.
fn input_grad<T: ConvElement>(gr: &[T], w: &[T], g: &Conv2dGeometry) -> Vec<T> {
    if g.stride == 1 && g.pad_h < g.kh && g.pad_w < g.kw {
        let mut flipped = vec![T::default(); w.len()];
        for o in 0..g.o {
            for c in 0..g.c {
                for i in 0..g.kh {
                    for j in 0..g.kw {
                        flipped[((c * g.o + o) * g.kh + g.kh - 1 - i) * g.kw + g.kw - 1 - j] =
                            w[((o * g.c + c) * g.kh + i) * g.kw + j];
                    }
                }
            }
        }
        let t = Conv2dGeometry {
            n: g.n,
            c: g.o,
            h: g.oh,
            w: g.ow,
            o: g.c,
            kh: g.kh,
            kw: g.kw,
            stride: 1,
            pad_h: g.kh - 1 - g.pad_h,
            pad_w: g.kw - 1 - g.pad_w,
            oh: g.h,
            ow: g.w,
        };
        return forward(gr, &flipped, &t);
    }
    let (ck, p, chw) = (g.ck(), g.p(), g.c * g.h * g.w);
    let mut out = vec![T::default(); g.n * chw];
    if out.is_empty() || g.o * p == 0 {
        return out;
    }
    let mut wt = vec![T::default(); ck * g.o];
    transpose_into(w, g.o, ck, &mut wt);
    out.par_chunks_mut(IMAGES_PER_TASK * chw).zip(gr.par_chunks(IMAGES_PER_TASK * g.o * p)).for_each(|(dst, gs)| {
        T::with_scratch(ck * p, 0, |col, _| {
            for (dst, gi) in dst.chunks_mut(chw).zip(gs.chunks(g.o * p)) {
                gemm_into(col, (ck, p, g.o), &wt, (g.o, 1), gi, (p, 1), false, g.n == 1);
                col2im(col, g, dst);
            }
        })
    });
    out
}

/// Weight gradient `[o, ck]` = Σₙ (cols[n] `[ck, p]` @ g[n]ᵀ `[p, o]`)ᵀ: the transposed sum is
/// the shape `gemm` runs fastest (see [`forward`]), and it is transposed once at the end.
fn weight_grad<T: ConvElement>(x: &[T], gr: &[T], g: &Conv2dGeometry) -> Vec<T> {
    let (ck, p, chw) = (g.ck(), g.p(), g.c * g.h * g.w);
    let len = g.o * ck;
    if len == 0 || g.n == 0 || p == 0 || chw == 0 {
        return vec![T::default(); len];
    }
    let groups = g.n.div_ceil(WGRAD_GROUP);
    let partials: Vec<Vec<T>> = (0..groups)
        .into_par_iter()
        .map(|gi| {
            let mut acc = vec![T::default(); len];
            T::with_scratch(ck * p, 0, |col, _| {
                for i in gi * WGRAD_GROUP..((gi + 1) * WGRAD_GROUP).min(g.n) {
                    im2col(&x[i * chw..(i + 1) * chw], g, col);
                    let go = &gr[i * g.o * p..(i + 1) * g.o * p];
                    gemm_into(&mut acc, (ck, g.o, p), col, (p, 1), go, (1, p), true, groups == 1);
                }
            });
            acc
        })
        .collect();
    let mut it = partials.into_iter();
    let mut total = it.next().unwrap_or_else(|| vec![T::default(); len]);
    for part in it {
        for (t, v) in total.iter_mut().zip(part) {
            *t += v;
        }
    }
    let mut out = vec![T::default(); len];
    transpose_into(&total, ck, g.o, &mut out);
    out
}
