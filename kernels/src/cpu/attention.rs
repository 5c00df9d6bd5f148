//! Fused scaled dot-product attention, `softmax(q kᵀ / √D) v`, with an online softmax over
//! tiles of keys (FlashAttention's forward pass): the Q×S score matrix never exists, so memory
//! stays O(Q·D) for any sequence length.
//!
//! Operands are `q[..B, Q, D]`, `k[..B, S, D]` and `v[..B, S, E]` with the same leading dims.
//! The mask is positional: only the first `len` keys are visible (a cache of capacity `S`
//! holding `len` positions), and when `causal`, query `i` sits at position `len - Q + i` and
//! sees the keys up to its own. Each query row is computed by the same sequence of operations
//! whatever block of queries it is computed in, so one query against a cache gives bit for bit
//! what the same query gives inside a whole-prefix call.

use rayon::prelude::*;

use super::num::Float;
use crate::error::KernelError;
use crate::simd::vectorized;
use crate::tensor::{checked_numel, DType, Tensor};

/// Keys per tile of the online softmax.
const KEY_TILE: usize = 64;
/// Queries per task: a block of queries shares each key tile while it is in cache.
const QUERY_BLOCK: usize = 16;

/// The visible keys: the first `len`, and for a causal mask the ones up to each query's position.
#[derive(Clone, Copy, Debug)]
pub struct AttentionMask {
    pub len: i64,
    pub causal: bool,
}

/// The checked geometry of one call (every device's attention kernels read it).
pub(crate) struct Geometry {
    /// Product of the leading dims.
    pub batch: usize,
    pub q: usize,
    pub s: usize,
    pub d: usize,
    pub e: usize,
    pub len: usize,
    pub causal: bool,
}

impl Geometry {
    /// How many keys query `i` sees (at least one).
    #[inline]
    fn visible(&self, i: usize) -> usize {
        if self.causal {
            self.len - self.q + i + 1
        } else {
            self.len
        }
    }
}

/// The geometry of queries `q`, keys `k` and values `v` (each its shape and element type).
pub(crate) fn geometry(
    op: &'static str,
    q: (&[usize], DType),
    k: (&[usize], DType),
    v: Option<(&[usize], DType)>,
    mask: AttentionMask,
) -> Result<Geometry, KernelError> {
    let (qs, ks) = (q.0, k.0);
    if qs.len() < 2 || ks.len() != qs.len() {
        return Err(KernelError::ShapeMismatch { op, lhs: qs.to_vec(), rhs: ks.to_vec() });
    }
    let r = qs.len();
    let (d, s) = (qs[r - 1], ks[r - 2]);
    if ks[..r - 2] != qs[..r - 2] || ks[r - 1] != d {
        return Err(KernelError::ShapeMismatch { op, lhs: qs.to_vec(), rhs: ks.to_vec() });
    }
    let e = match v {
        Some(v) => {
            let vs = v.0;
            if vs.len() != r || vs[..r - 1] != ks[..r - 1] {
                return Err(KernelError::ShapeMismatch { op, lhs: ks.to_vec(), rhs: vs.to_vec() });
            }
            vs[r - 1]
        }
        None => s,
    };
    for (_, t) in [Some(q), Some(k), v].into_iter().flatten() {
        if t != q.1 || !q.1.is_float() {
            return Err(KernelError::DTypeMismatch { op, expected: q.1.name().into(), found: t.name().into() });
        }
    }
    let nq = qs[r - 2];
    let low = if mask.causal { nq.max(1) } else { 1 };
    if mask.len < low as i64 || mask.len > s as i64 {
        let need = if mask.causal { format!("from {low} (the queries, causally)") } else { "from 1".into() };
        return Err(KernelError::OutOfRange(format!(
            "{op}: the cache length {} must be {need} to {s} (the keys)",
            mask.len
        )));
    }
    let batch = qs[..r - 2].iter().product();
    Ok(Geometry { batch, q: nq, s, d, e, len: mask.len as usize, causal: mask.causal })
}

#[inline(always)]
fn dot<F: Float>(a: &[F], b: &[F]) -> F {
    let mut acc = F::from_usize(0);
    for (&x, &y) in a.iter().zip(b) {
        acc = acc + x * y;
    }
    acc
}

/// Keys whose scores [`dots`] computes side by side.
const DOT_LANES: usize = 8;

/// `s[j] = q · k[j]` for the rows of `k` (`s.len()` rows of `q.len()`), each summed in the order
/// of its elements (the bits of [`dot`] and of the transposed path): eight keys at a time, so
/// that eight independent sums are in flight instead of one chain of dependent additions.
#[inline(always)]
fn dots<F: Float>(q: &[F], k: &[F], s: &mut [F]) {
    let d = q.len();
    let mut rows = s.chunks_exact_mut(DOT_LANES);
    let mut j0 = 0;
    for out in rows.by_ref() {
        let block = &k[j0 * d..(j0 + DOT_LANES) * d];
        let mut acc = [F::from_usize(0); DOT_LANES];
        for (c, &qc) in q.iter().enumerate() {
            for (lane, a) in acc.iter_mut().enumerate() {
                *a = *a + qc * block[lane * d + c];
            }
        }
        out.copy_from_slice(&acc);
        j0 += DOT_LANES;
    }
    for (j, x) in rows.into_remainder().iter_mut().enumerate() {
        *x = dot(q, &k[(j0 + j) * d..(j0 + j + 1) * d]);
    }
}

/// The scores of `rows` queries (from query `first`) against a tile of transposed keys `kt`
/// (`[D, KEY_TILE]`): `out[r·KEY_TILE + j] = Σ_c q[r][c]·kt[c][j]`, summed in the order of c.
/// Four queries at a time, so that their accumulators stay in vector registers while the tile's
/// rows stream past; entries past a tile's last key are computed but never read.
#[inline(always)]
fn tile_scores<F: Float>(g: &Geometry, q: &[F], first: usize, rows: usize, kt: &[F], out: &mut [F]) {
    let zero = F::from_usize(0);
    let query = |r: usize| &q[(first + r) * g.d..(first + r + 1) * g.d];
    let mut r = 0;
    while r + 4 <= rows {
        let qs = [query(r), query(r + 1), query(r + 2), query(r + 3)];
        let mut acc = [[zero; KEY_TILE]; 4];
        for (c, kr) in kt.chunks_exact(KEY_TILE).enumerate() {
            for (a, qi) in acc.iter_mut().zip(&qs) {
                let qc = qi[c];
                for (x, &kv) in a.iter_mut().zip(kr) {
                    *x = *x + qc * kv;
                }
            }
        }
        for (i, a) in acc.iter().enumerate() {
            out[(r + i) * KEY_TILE..(r + i + 1) * KEY_TILE].copy_from_slice(a);
        }
        r += 4;
    }
    for r in r..rows {
        let o = &mut out[r * KEY_TILE..(r + 1) * KEY_TILE];
        o.fill(zero);
        for (&qc, kr) in query(r).iter().zip(kt.chunks_exact(KEY_TILE)) {
            for (x, &kv) in o.iter_mut().zip(kr) {
                *x = *x + qc * kv;
            }
        }
    }
}

/// The attention output of one block of queries (`out` holds `rows × E`). It and its caller's
/// closure are inlined into [`run`]'s `simd::vectorized` call, so its loops get the AVX2 build.
#[inline(always)]
fn attend_block<F: Float>(g: &Geometry, q: &[F], k: &[F], v: &[F], first: usize, out: &mut [F], scale: F) {
    let rows = out.len() / g.e.max(1);
    let zero = F::from_usize(0);
    let mut m = vec![F::NEG_INFINITY; rows];
    let mut l = vec![zero; rows];
    out.fill(zero);
    let mut s = [zero; KEY_TILE];
    let most = (0..rows).map(|r| g.visible(first + r)).max().unwrap_or(0);
    // The tile's keys transposed ([D, KEY_TILE]), shared by the block's queries, so that each
    // query's scores are computed across keys in vector registers.
    let mut kt = vec![zero; g.d * KEY_TILE];
    let mut scores = vec![zero; rows * KEY_TILE];
    for t0 in (0..most).step_by(KEY_TILE) {
        let width = (most - t0).min(KEY_TILE);
        // A block of a few queries (a generation step) reads the keys directly instead.
        let transposed = rows >= 4;
        if transposed {
            for j in 0..width {
                for c in 0..g.d {
                    kt[c * KEY_TILE + j] = k[(t0 + j) * g.d + c];
                }
            }
        }
        if transposed {
            tile_scores(g, q, first, rows, &kt, &mut scores);
        }
        for r in 0..rows {
            let n = g.visible(first + r).saturating_sub(t0).min(KEY_TILE);
            if n == 0 {
                continue;
            }
            let qi = &q[(first + r) * g.d..(first + r + 1) * g.d];
            // s[j] = Σ_c q[c]·k[j][c], summed in the order of c either way (the same bits).
            if transposed {
                s[..n].copy_from_slice(&scores[r * KEY_TILE..r * KEY_TILE + n]);
            } else {
                dots(qi, &k[t0 * g.d..(t0 + n) * g.d], &mut s[..n]);
            }
            let mut top = m[r];
            for x in &mut s[..n] {
                *x = *x * scale;
            }
            for &x in &s[..n] {
                top = top.max_p(x);
            }
            let correction = (m[r] - top).exp();
            // The exponentials in their own loop, so that it vectorises.
            for x in &mut s[..n] {
                *x = (*x - top).exp();
            }
            let mut sum = zero;
            for &p in &s[..n] {
                sum = sum + p;
            }
            let o = &mut out[r * g.e..(r + 1) * g.e];
            for x in o.iter_mut() {
                *x = *x * correction;
            }
            for (j, &p) in s[..n].iter().enumerate() {
                let vj = &v[(t0 + j) * g.e..(t0 + j + 1) * g.e];
                for (x, &y) in o.iter_mut().zip(vj) {
                    *x = *x + p * y;
                }
            }
            l[r] = l[r] * correction + sum;
            m[r] = top;
        }
    }
    for r in 0..rows {
        let inv = F::from_usize(1) / l[r];
        for x in &mut out[r * g.e..(r + 1) * g.e] {
            *x = *x * inv;
        }
    }
}

/// The softmax weights of one block of queries (`out` holds `rows × S`; hidden keys get 0).
#[inline(always)]
fn weights_block<F: Float>(g: &Geometry, q: &[F], k: &[F], first: usize, out: &mut [F], scale: F) {
    let zero = F::from_usize(0);
    let rows = out.len() / g.s.max(1);
    // The scores. A block of several queries computes them across a tile of transposed keys
    // (as `attend_block` does: vector registers over keys, not strided loads); a block of a few
    // queries (a generation step) reads the keys directly. Both sum in the order of c.
    if rows >= 4 {
        let most = (0..rows).map(|r| g.visible(first + r)).max().unwrap_or(0);
        let mut kt = vec![zero; g.d * KEY_TILE];
        let mut scores = vec![zero; rows * KEY_TILE];
        for t0 in (0..most).step_by(KEY_TILE) {
            let width = (most - t0).min(KEY_TILE);
            for j in 0..width {
                for c in 0..g.d {
                    kt[c * KEY_TILE + j] = k[(t0 + j) * g.d + c];
                }
            }
            tile_scores(g, q, first, rows, &kt, &mut scores);
            for (r, row) in out.chunks_mut(g.s).enumerate() {
                let n = g.visible(first + r).saturating_sub(t0).min(KEY_TILE);
                row[t0..t0 + n].copy_from_slice(&scores[r * KEY_TILE..r * KEY_TILE + n]);
            }
        }
    } else {
        for (r, row) in out.chunks_mut(g.s).enumerate() {
            let n = g.visible(first + r);
            let qi = &q[(first + r) * g.d..(first + r + 1) * g.d];
            dots(qi, &k[..n * g.d], &mut row[..n]);
        }
    }
    for (r, row) in out.chunks_mut(g.s).enumerate() {
        let n = g.visible(first + r);
        let mut top = F::NEG_INFINITY;
        // Each elementwise step in a loop of its own, so that it vectorises (a loop that also
        // sums or takes the maximum does not); the sum still runs in key order.
        for w in &mut row[..n] {
            *w = *w * scale;
        }
        for &w in &row[..n] {
            top = top.max_p(w);
        }
        for w in &mut row[..n] {
            *w = (*w - top).exp();
        }
        let mut sum = zero;
        for &w in &row[..n] {
            sum = sum + w;
        }
        let inv = F::from_usize(1) / sum;
        for w in &mut row[..n] {
            *w = *w * inv;
        }
        row[n..].fill(zero);
    }
}

/// Runs `block` over every (batch, block of queries) in parallel; each writes `width` values per query.
fn run<F: Float>(g: &Geometry, width: usize, block: impl Fn(usize, usize, &mut [F]) + Sync) -> Vec<F> {
    let per_batch = g.q * width;
    let mut out = vec![F::from_usize(0); g.batch * per_batch];
    if per_batch == 0 {
        return out;
    }
    out.par_chunks_mut(per_batch).enumerate().for_each(|(b, ob)| {
        ob.par_chunks_mut(QUERY_BLOCK * width).enumerate().for_each(|(blk, o)| {
            vectorized(
                #[inline(always)]
                || block(b, blk * QUERY_BLOCK, o),
            )
        })
    });
    out
}

fn scale_of<F: Float>(d: usize) -> F {
    F::from_f64c(1.0 / (d as f64).sqrt())
}

/// `softmax(q kᵀ / √D) v` under `mask`, without materialising the scores: `[..B, Q, E]`.
pub fn attention(q: &Tensor, k: &Tensor, v: &Tensor, mask: AttentionMask) -> Result<Tensor, KernelError> {
    let g = geometry("attention", (q.shape(), q.dtype()), (k.shape(), k.dtype()), Some((v.shape(), v.dtype())), mask)?;
    let mut shape = q.shape().to_vec();
    *shape.last_mut().unwrap_or(&mut 0) = g.e;
    checked_numel(&shape)?;
    fn go<F: Float>(g: &Geometry, q: &[F], k: &[F], v: &[F]) -> Vec<F> {
        let scale = scale_of::<F>(g.d);
        run(
            g,
            g.e,
            #[inline(always)]
            |b, first, o| {
                let (qb, kb, vb) = (b * g.q * g.d, b * g.s * g.d, b * g.s * g.e);
                attend_block(g, &q[qb..qb + g.q * g.d], &k[kb..kb + g.s * g.d], &v[vb..vb + g.s * g.e], first, o, scale)
            },
        )
    }
    match q.dtype() {
        DType::F32 => {
            let (a, b, c) = (q.as_f32().unwrap_or(&[]), k.as_f32().unwrap_or(&[]), v.as_f32().unwrap_or(&[]));
            Tensor::from_f32(shape, go(&g, a, b, c))
        }
        _ => {
            let (a, b, c) = (q.as_f64().unwrap_or(&[]), k.as_f64().unwrap_or(&[]), v.as_f64().unwrap_or(&[]));
            Tensor::from_f64(shape, go(&g, a, b, c))
        }
    }
}

/// The attention weights `softmax(q kᵀ / √D)` under `mask`, hidden keys 0: `[..B, Q, S]` (what
/// the backward pass of [`attention`] recomputes).
pub fn attention_weights(q: &Tensor, k: &Tensor, mask: AttentionMask) -> Result<Tensor, KernelError> {
    let g = geometry("attention_weights", (q.shape(), q.dtype()), (k.shape(), k.dtype()), None, mask)?;
    let mut shape = q.shape().to_vec();
    *shape.last_mut().unwrap_or(&mut 0) = g.s;
    checked_numel(&shape)?;
    fn go<F: Float>(g: &Geometry, q: &[F], k: &[F]) -> Vec<F> {
        let scale = scale_of::<F>(g.d);
        run(
            g,
            g.s,
            #[inline(always)]
            |b, first, o| {
                let (qb, kb) = (b * g.q * g.d, b * g.s * g.d);
                weights_block(g, &q[qb..qb + g.q * g.d], &k[kb..kb + g.s * g.d], first, o, scale)
            },
        )
    }
    match q.dtype() {
        DType::F32 => Tensor::from_f32(shape, go(&g, q.as_f32().unwrap_or(&[]), k.as_f32().unwrap_or(&[]))),
        _ => Tensor::from_f64(shape, go(&g, q.as_f64().unwrap_or(&[]), k.as_f64().unwrap_or(&[]))),
    }
}
