//! How msl's row-major matrix products become one cuBLAS call (`gemmStridedBatched`), worked
//! out without a GPU so that the mapping is tested on every machine.
//!
//! cuBLAS reads matrices column-major, and a row-major `[r, c]` buffer read column-major is its
//! transpose (`[c, r]`, leading dimension `c`). So the row-major `C = op(A) op(B)` is computed
//! as the column-major `Cᵀ = op(B)ᵀ op(A)ᵀ`: cuBLAS's first operand is msl's `b`, its second
//! msl's `a`, each transposed by cuBLAS exactly when msl transposes it, and the leading dimension
//! of each buffer is its stored row length. Batches are strided; an operand without batch dims is
//! shared by every batch (stride 0).

/// One `cublas<t>gemmStridedBatched` call, in cuBLAS's terms (column-major).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GemmPlan {
    /// Whether cuBLAS transposes its first operand (msl's `b`) and its second (msl's `a`).
    pub trans_first: bool,
    pub trans_second: bool,
    /// cuBLAS's `m`, `n`, `k`: msl's `N`, `M` and `K`.
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub ld_first: usize,
    pub ld_second: usize,
    pub ldc: usize,
    pub batch: usize,
    pub stride_first: usize,
    pub stride_second: usize,
    pub stride_c: usize,
    /// The product's row-major shape.
    pub out_shape: Vec<usize>,
}

impl GemmPlan {
    /// Whether the product has no elements to compute from (an empty result, or `K = 0`, whose
    /// result is zeros): then no call is made.
    pub fn is_trivial(&self) -> bool {
        self.m == 0 || self.n == 0 || self.batch == 0 || self.k == 0
    }
}

/// The call computing `op(a) @ op(b)` for row-major operands of shapes `a` and `b` (`ta`, `tb`:
/// the last two axes swapped), with NumPy's rules for a vector operand (no transposes then).
/// `None` where one call cannot compute it: operands that do not agree, batch dims that differ
/// and are not absent on one side, or a size past cuBLAS's 32-bit integers.
pub fn plan(a: &[usize], b: &[usize], ta: bool, tb: bool) -> Option<GemmPlan> {
    if a.is_empty() || b.is_empty() || (ta || tb) && (a.len() < 2 || b.len() < 2) {
        return None;
    }
    // A vector is a one-row (left) or one-column (right) matrix whose axis the result drops.
    let (a2, drop_m) = if a.len() == 1 { (vec![1, a[0]], true) } else { (a.to_vec(), false) };
    let (b2, drop_n) = if b.len() == 1 { (vec![b[0], 1], true) } else { (b.to_vec(), false) };
    let (ba, [ra, ca]) = split(&a2);
    let (bb, [rb, cb]) = split(&b2);
    let (m, ka) = if ta { (ca, ra) } else { (ra, ca) };
    let (kb, n) = if tb { (cb, rb) } else { (rb, cb) };
    if ka != kb {
        return None;
    }
    let (sa, sb) = (ra * ca, rb * cb);
    let (batch_dims, stride_a, stride_b) = if ba == bb {
        (ba, sa, sb)
    } else if bb.is_empty() {
        (ba, sa, 0)
    } else if ba.is_empty() {
        (bb, 0, sb)
    } else {
        return None;
    };
    let mut out_shape = batch_dims.to_vec();
    if !drop_m {
        out_shape.push(m);
    }
    if !drop_n {
        out_shape.push(n);
    }
    // The result's size: operands with a zero dim may multiply to one past `usize`.
    let stride_c = m.checked_mul(n)?;
    let batch = batch_dims.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d))?;
    stride_c.checked_mul(batch)?;
    let p = GemmPlan {
        trans_first: tb,
        trans_second: ta,
        m: n,
        n: m,
        k: ka,
        ld_first: cb.max(1),
        ld_second: ca.max(1),
        ldc: n.max(1),
        batch,
        stride_first: stride_b,
        stride_second: stride_a,
        stride_c,
        out_shape,
    };
    let fits = [p.m, p.n, p.k, p.ld_first, p.ld_second, p.ldc, p.batch].iter().all(|&v| v <= i32::MAX as usize);
    fits.then_some(p)
}

/// The batch dims and the last two dims of a shape of rank at least 2.
fn split(s: &[usize]) -> (&[usize], [usize; 2]) {
    let r = s.len();
    (&s[..r - 2], [s[r - 2], s[r - 1]])
}
