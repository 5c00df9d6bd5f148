//! Matrix products with NumPy `matmul` semantics; f32/f64 go through the `gemm` crate.

use rayon::prelude::*;

use crate::cpu::{broadcast_shapes, broadcast_strides, PAR_MIN};
use crate::error::KernelError;
use crate::tensor::{checked_numel, DType, Storage, Tensor};

/// Products with at least this many multiply-adds use all rayon threads inside `gemm`...
const GEMM_PAR_MIN: usize = 64 * 64 * 64;
/// ... unless their inner size is below this and their output smaller than
/// [`SHALLOW_PAR_OUT`]: such a product writes much and computes little, and its threads cost
/// more than they save. A classifier's input gradient `d[256, 10] @ w[512, 10]ᵀ`, after the
/// single-threaded loss kernels, took 33 µs on two threads (waking the second) and 12 µs on one.
const SHALLOW_PAR_K: usize = 16;
/// Outputs from this many elements take the threads whatever the inner size (a 2048×1024
/// output of an inner size of 8: 279 µs on two threads, 291 µs on one).
const SHALLOW_PAR_OUT: usize = 1 << 20;
/// An output with fewer rows than this, and fewer than [`NARROW_PAR_WORK`] multiply-adds, runs
/// on one thread: `d[256, 10]ᵀ @ h2[256, 512]` took 42 µs on two threads and 11 on one (medians
/// of 300 calls); `x[15, 784] @ w[784, 512]` (6M multiply-adds) is faster on two, 49 against
/// 62 µs. Few columns keep the threads: `h2[256, 512] @ w3[512, 10]` in W3's step, right after
/// a product on both threads, took 20 µs on two and 31 on one.
const NARROW: usize = 16;
const NARROW_PAR_WORK: usize = 1 << 21;

/// `numpy.matmul(a, b)`: 1-D operands are promoted to matrices and the added dimension is
/// removed from the result; leading (batch) dimensions broadcast. Both operands must share a
/// numeric dtype.
pub fn matmul(a: &Tensor, b: &Tensor) -> Result<Tensor, KernelError> {
    if a.rank() == 0 || b.rank() == 0 {
        return Err(KernelError::Invalid(
            "matmul: operands must have at least one dimension (use mul for scalars)".into(),
        ));
    }
    let a2 = if a.rank() == 1 { a.with_shape(vec![1, a.len()])? } else { a.clone() };
    let b2 = if b.rank() == 1 { b.with_shape(vec![b.len(), 1])? } else { b.clone() };
    let out = matmul_t(&a2, &b2, false, false).map_err(|e| match e {
        KernelError::ShapeMismatch { .. } => {
            KernelError::ShapeMismatch { op: "matmul", lhs: a.shape().to_vec(), rhs: b.shape().to_vec() }
        }
        other => other,
    })?;
    let mut shape = out.shape().to_vec();
    if b.rank() == 1 {
        shape.pop();
    }
    if a.rank() == 1 {
        let r = shape.len();
        shape.remove(r - 1 - usize::from(b.rank() != 1));
    }
    out.with_shape(shape)
}

/// `op(a) @ op(b)` for operands of rank at least 2, where `op` swaps the last two axes when
/// its flag is set. The transposes are read through strides, never copied, which is what the
/// gradients of a product need (`g @ wᵀ`, `xᵀ @ g`). Batch dimensions broadcast.
pub fn matmul_t(a: &Tensor, b: &Tensor, transpose_a: bool, transpose_b: bool) -> Result<Tensor, KernelError> {
    if a.dtype() != b.dtype() {
        return Err(KernelError::DTypeMismatch {
            op: "matmul",
            expected: format!("operands of one element type ({})", a.dtype()),
            found: b.dtype().to_string(),
        });
    }
    if a.rank() < 2 || b.rank() < 2 {
        return Err(KernelError::Invalid("matmul_t: operands must have at least two dimensions".into()));
    }
    if a.dtype() == DType::Bool {
        return Err(KernelError::dtype("matmul", "a numeric tensor", DType::Bool));
    }
    if a.dtype().is_half() {
        // Storage-only operands are multiplied in f32, and the product rounded back once.
        let w = b.cast(DType::F32);
        return a.in_f32(|v| matmul_t(v, &w, transpose_a, transpose_b));
    }
    let mismatch = || KernelError::ShapeMismatch { op: "matmul", lhs: a.shape().to_vec(), rhs: b.shape().to_vec() };
    let (ra, rb) = (a.rank(), b.rank());
    let (ar, ac) = (a.shape()[ra - 2], a.shape()[ra - 1]);
    let (br, bc) = (b.shape()[rb - 2], b.shape()[rb - 1]);
    let (m, k) = if transpose_a { (ac, ar) } else { (ar, ac) };
    let (k2, n) = if transpose_b { (bc, br) } else { (br, bc) };
    if k != k2 {
        return Err(mismatch());
    }
    // The output combines dims of both operands, so its size is new: check it first. The work
    // `m·n·k` can still exceed usize (its factors come from different operands) and saturates.
    let batch_a = &a.shape()[..ra - 2];
    let batch_b = &b.shape()[..rb - 2];
    let batch = broadcast_shapes("matmul", batch_a, batch_b).map_err(|e| match e {
        KernelError::ShapeMismatch { .. } => mismatch(),
        other => other,
    })?;
    let mut shape = batch.clone();
    shape.push(m);
    shape.push(n);
    if checked_numel(&shape)? == 0 {
        // Nothing to compute; the per-matrix offsets below could still be many (`[2^40, 0, k]`).
        return crate::cpu::shape::zeros(a.dtype(), &shape);
    }
    if transpose_b && a.dtype().is_float() && m.saturating_mul(n).saturating_mul(k) >= GEMM_PAR_MIN {
        // `gemm` packs a column-major right operand one element per cache line: `g @ wᵀ` with
        // a 512×512 `w` took 506 µs where `g @ w` takes 277. A tiled transpose into a row-major
        // copy (60 µs) first is cheaper, and the packed panels, hence the sums, are the same.
        return matmul_t(a, &crate::cpu::shape::swap_last(b)?, transpose_a, false);
    }
    if transpose_a
        && !transpose_b
        && ra == 2
        && rb == 2
        && a.dtype().is_float()
        && (2..NARROW).contains(&n)
        && m >= NARROW
        && m * n > 256
    {
        // A weight's gradient with few columns (`h[256, 512]ᵀ @ d[256, 10]`): `gemm` took 31 µs
        // for it on one thread or two, and 11 µs for `dᵀ @ h` on one (784×256×10: 47 → 18 µs;
        // 2048×2048×12: 913 → 499 µs on two). Each output element is the same sum in the same
        // order either way, so the bits are the same: `gemm`'s inner blocking is symmetric in
        // the two sizes, and its horizontal kernels for outputs of at most 256 elements, whose
        // order depends on the operands' strides, are not reached.
        return crate::cpu::shape::swap_last(&matmul_t(b, a, true, false)?);
    }
    let nb: usize = batch.iter().product();
    // Offsets of each batch's matrices, in units of whole matrices.
    let sa = broadcast_strides(batch_a, &batch);
    let sb = broadcast_strides(batch_b, &batch);
    let offsets: Vec<(usize, usize)> = (0..nb)
        .map(|mut i| {
            let (mut oa, mut ob) = (0, 0);
            for d in (0..batch.len()).rev() {
                let j = i % batch[d];
                i /= batch[d];
                oa += j * sa[d];
                ob += j * sb[d];
            }
            (oa * m * k, ob * k * n)
        })
        .collect();
    // A stack of matrices times one matrix (`x[B, T, D] @ w[D, F]`, and its derivative
    // `g @ wᵀ`): one product of (nb·m)×k by k×n, so that the right operand is packed once
    // rather than once per matrix of the stack. The rows of the stack are consecutive.
    let (m, offsets) = if rb == 2 && !transpose_a && nb > 1 { (nb * m, vec![(0, 0)]) } else { (m, offsets) };
    let geo = Geometry {
        m,
        n,
        k,
        // Row and column strides of op(a) and op(b).
        a_rs: if transpose_a { 1 } else { k },
        a_cs: if transpose_a { m } else { 1 },
        b_rs: if transpose_b { 1 } else { n },
        b_cs: if transpose_b { k } else { 1 },
    };
    match (a.storage(), b.storage()) {
        (Storage::F32(x), Storage::F32(y)) => Ok(Tensor::from_parts(shape, gemm_batched(x, y, &offsets, &geo))),
        (Storage::F64(x), Storage::F64(y)) => Ok(Tensor::from_parts(shape, gemm_batched(x, y, &offsets, &geo))),
        (Storage::I32(x), Storage::I32(y)) => Ok(Tensor::from_parts(shape, int_batched(x, y, &offsets, &geo))),
        _ => Err(KernelError::dtype("matmul", "a numeric tensor", a.dtype())),
    }
}

/// Sizes of one product and the element strides of its operands.
struct Geometry {
    m: usize,
    n: usize,
    k: usize,
    a_rs: usize,
    a_cs: usize,
    b_rs: usize,
    b_cs: usize,
}

/// Element types `gemm` multiplies.
pub(crate) trait GemmElement: Copy + Default + Send + Sync + 'static {
    fn zero() -> Self;
    fn one() -> Self;
}
impl GemmElement for f32 {
    fn zero() -> Self {
        0.0
    }
    fn one() -> Self {
        1.0
    }
}
impl GemmElement for f64 {
    fn zero() -> Self {
        0.0
    }
    fn one() -> Self {
        1.0
    }
}

fn gemm_batched<T: GemmElement>(x: &[T], y: &[T], offsets: &[(usize, usize)], g: &Geometry) -> Vec<T> {
    let mn = g.m * g.n;
    let len = offsets.len() * mn;
    if mn == 0 || g.k == 0 {
        return vec![T::zero(); len];
    }
    // The products overwrite every element (gemm does not read `dst`), so the output is not
    // zeroed first: that memset was 2–4 % of a training step once buffers are reused.
    let mut out: Vec<std::mem::MaybeUninit<T>> = Vec::with_capacity(len);
    // SAFETY: `MaybeUninit` elements need no initialisation.
    unsafe { out.set_len(len) };
    let work = g.m.saturating_mul(g.n).saturating_mul(g.k);
    if work >= GEMM_PAR_MIN || offsets.len() == 1 || work.saturating_mul(offsets.len()) < PAR_MIN {
        // Threads split the output, never the inner sums, so either way gives the same bits.
        let threads = work >= GEMM_PAR_MIN
            && (g.k >= SHALLOW_PAR_K || mn >= SHALLOW_PAR_OUT)
            && (g.m >= NARROW || work >= NARROW_PAR_WORK);
        let par = if threads { gemm::Parallelism::Rayon(0) } else { gemm::Parallelism::None };
        // Column bands too: their only caller is this loop, on the threads.
        let _awake = threads.then_some(crate::threads::Linger);
        for (dst, &(oa, ob)) in out.chunks_mut(mn).zip(offsets) {
            let bands = g.k > BAND_MIN_K
                && g.m > BAND_MIN_ROWS
                && (g.a_rs == 1 || g.m * g.k <= BAND_MAX_LHS)
                && g.n >= 2 * BAND_MIN_COLS;
            if threads && bands {
                gemm_column_bands(dst, &x[oa..], &y[ob..], g);
            } else {
                gemm_one(dst, &x[oa..], &y[ob..], g, par);
            }
        }
    } else {
        // Many small products: one product per task.
        let _awake = crate::threads::Linger;
        out.par_chunks_mut(mn)
            .zip(offsets.par_iter())
            .for_each(|(dst, &(oa, ob))| gemm_one(dst, &x[oa..], &y[ob..], g, gemm::Parallelism::None));
    }
    let mut out = std::mem::ManuallyDrop::new(out);
    // SAFETY: every chunk of `mn` elements was written by `gemm_one` (m×n products with k ≥ 1),
    // so all `len` elements are initialised; `MaybeUninit<T>` has the layout of `T`, and the
    // allocation is handed over with its length and capacity.
    unsafe { Vec::from_raw_parts(out.as_mut_ptr() as *mut T, len, out.capacity()) }
}

/// Products of an inner size above this (more than one of `gemm`'s inner blocks) whose left
/// operand is read transposed or has at most [`BAND_MAX_LHS`] elements split their output's
/// columns between the threads ([`gemm_column_bands`]).
const BAND_MIN_K: usize = 512;
/// Each thread packs the whole left operand of a split product, so a large one is not split:
/// W5's `f[2048, 1024] @ w[1024, 256]` was 3 % slower split, while W5's `h[2048, 256]ᵀ @ g`
/// gained 22 % and `f[2048, 1024]ᵀ @ g` 8 %.
const BAND_MAX_LHS: usize = 1 << 20;
/// Columns of an output band, at the least.
const BAND_MIN_COLS: usize = 64;
/// Rows of a split product, at the least: `gemm` blocks the inner size of a product of at most
/// 64 rows and 64 columns differently (512 and the rest, not balanced blocks), so a band of
/// 64 columns of such a product would sum in another order than the whole product.
const BAND_MIN_ROWS: usize = 64;

/// `dst = a @ b` on every rayon thread, each computing one band of the output's columns with
/// `gemm` on one thread, with no barrier between them. Alternating with `gemm`'s own threads
/// over 10 rounds: W3's `x[256, 784] @ w1` 473 → 466 µs, 600³ 1,153 → 1,020 µs, W5's
/// `h[2048, 256]ᵀ @ g[2048, 256]` 779 → 611 µs, 1024³ within 1 %. Each band is the same product
/// restricted to its columns, summed in the same order (beyond 64 rows `gemm`'s inner
/// blocking depends on `k` alone), so the bits equal one call's, whatever the number of threads.
fn gemm_column_bands<T: GemmElement>(dst: &mut [std::mem::MaybeUninit<T>], a: &[T], b: &[T], g: &Geometry) {
    let bands = rayon::current_num_threads().min(g.n / BAND_MIN_COLS).max(1);
    // Band widths are multiples of 16 columns, the last band takes the rest.
    let width = (g.n / bands) / 16 * 16;
    /// `dst` as an address that may cross to another thread: the bands write disjoint columns.
    struct Out<T>(*mut std::mem::MaybeUninit<T>);
    // SAFETY: each task writes only its own band's columns of `dst` (see below).
    unsafe impl<T: Send> Sync for Out<T> {}
    let out = Out(dst.as_mut_ptr());
    let (out, len) = (&out, dst.len());
    (0..bands).into_par_iter().for_each(|i| {
        let (c0, c1) = (i * width, if i + 1 == bands { g.n } else { (i + 1) * width });
        let n = c1 - c0;
        let last_a = (g.m - 1) * g.a_rs + (g.k - 1) * g.a_cs;
        let last_b = (g.k - 1) * g.b_rs + (c1 - 1) * g.b_cs;
        assert!(n > 0 && len >= g.m * g.n && a.len() > last_a && b.len() > last_b);
        // SAFETY: the assertion shows that every element read lies inside `a` and `b` and that
        // rows `0..m` (row stride `g.n`) of columns `c0..c1` lie inside `dst`; the bands' column
        // ranges are disjoint, so no two tasks write one element, and `dst` does not alias the
        // inputs (a separate, exclusively borrowed allocation).
        unsafe {
            let band = Geometry { n, ..*g };
            gemm_raw(
                out.0.add(c0) as *mut T,
                g.n,
                a.as_ptr(),
                b.as_ptr().add(c0 * g.b_cs),
                &band,
                gemm::Parallelism::None,
            )
        };
    });
}

/// `dst = a @ b` for one `m×k` by `k×n` product with the strides in `g`; every element of
/// `dst[..m * n]` is written.
fn gemm_one<T: GemmElement>(
    dst: &mut [std::mem::MaybeUninit<T>],
    a: &[T],
    b: &[T],
    g: &Geometry,
    par: gemm::Parallelism,
) {
    let last_a = (g.m - 1) * g.a_rs + (g.k - 1) * g.a_cs;
    let last_b = (g.k - 1) * g.b_rs + (g.n - 1) * g.b_cs;
    assert!(dst.len() >= g.m * g.n && a.len() > last_a && b.len() > last_b);
    // SAFETY: the assertion above shows that every element gemm reads or writes (rows and
    // columns within m, n, k at the given strides) lies inside the three slices, and `dst`
    // does not alias the inputs because it is a separate, exclusively borrowed allocation.
    unsafe { gemm_raw(dst.as_mut_ptr() as *mut T, g.n, a.as_ptr(), b.as_ptr(), g, par) };
}

/// `dst = a @ b` through `gemm`, `dst` row-major with row stride `dst_rs`; `gemm` does not read
/// `dst` (`read_dst` is false), so its elements need not be initialised.
///
/// # Safety
/// Every element of `a`, `b` (rows and columns within `g`'s sizes at its strides) and `dst`
/// (`g.m` rows of `g.n` elements at row stride `dst_rs`) is in bounds, `dst` aliases neither
/// input, and no other thread touches those elements of `dst` meanwhile.
unsafe fn gemm_raw<T: GemmElement>(
    dst: *mut T,
    dst_rs: usize,
    a: *const T,
    b: *const T,
    g: &Geometry,
    par: gemm::Parallelism,
) {
    // SAFETY: the caller's guarantee.
    unsafe {
        gemm::gemm(
            g.m,
            g.n,
            g.k,
            dst,
            1,
            dst_rs as isize,
            false,
            a,
            g.a_cs as isize,
            g.a_rs as isize,
            b,
            g.b_cs as isize,
            g.b_rs as isize,
            T::zero(),
            T::one(),
            false,
            false,
            false,
            par,
        )
    }
}

fn int_batched(x: &[i32], y: &[i32], offsets: &[(usize, usize)], g: &Geometry) -> Vec<i32> {
    let mn = g.m * g.n;
    let mut out = vec![0i32; offsets.len() * mn];
    if mn == 0 {
        return out;
    }
    for (dst, &(oa, ob)) in out.chunks_mut(mn).zip(offsets) {
        for i in 0..g.m {
            let row = &mut dst[i * g.n..(i + 1) * g.n];
            for p in 0..g.k {
                let av = x[oa + i * g.a_rs + p * g.a_cs];
                for (j, o) in row.iter_mut().enumerate() {
                    *o = o.wrapping_add(av.wrapping_mul(y[ob + p * g.b_rs + j * g.b_cs]));
                }
            }
        }
    }
    out
}
