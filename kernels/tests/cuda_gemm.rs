//! The CUDA device's matrix products as cuBLAS calls (`kernels::cuda::gemm::plan`), checked
//! without a GPU: a plain column-major `gemmStridedBatched`, written here from cuBLAS's
//! documented semantics, is run with each plan's arguments on the operands' row-major buffers and
//! must give what the CPU's `matmul`/`matmul_t` give, for vectors, matrices, batches, an operand
//! shared by every batch, every transpose and empty sizes.

use kernels::cuda::gemm::{plan, GemmPlan};
use kernels::ops;
use kernels::Tensor;

/// cuBLAS's `gemmStridedBatched` with alpha 1 and beta 0: for each batch `p`,
/// `C_p = op(A_p) op(B_p)`, every matrix column-major with its leading dimension.
fn strided_batched(p: &GemmPlan, first: &[f64], second: &[f64]) -> Vec<f64> {
    let mut c = vec![0.0; p.batch * p.stride_c];
    for q in 0..p.batch {
        let (a, b) = (&first[q * p.stride_first..], &second[q * p.stride_second..]);
        for j in 0..p.n {
            for i in 0..p.m {
                let mut acc = 0.0;
                for l in 0..p.k {
                    let x = if p.trans_first { a[l + i * p.ld_first] } else { a[i + l * p.ld_first] };
                    let y = if p.trans_second { b[j + l * p.ld_second] } else { b[l + j * p.ld_second] };
                    acc += x * y;
                }
                c[q * p.stride_c + i + j * p.ldc] = acc;
            }
        }
    }
    c
}

fn tensor(shape: &[usize], seed: usize) -> Tensor {
    let n: usize = shape.iter().product();
    let data: Vec<f64> = (0..n).map(|i| ((i * 37 + seed * 11) % 23) as f64 - 11.0).collect();
    Tensor::from_vec(shape.to_vec(), data).unwrap()
}

#[test]
fn each_plan_computes_what_the_cpu_computes() {
    // (a's shape, b's shape) of msl's product before any transpose.
    let cases: &[(&[usize], &[usize])] = &[
        (&[3, 4], &[4, 5]),
        (&[1, 4], &[4, 1]),
        (&[4], &[4, 5]),
        (&[3, 4], &[4]),
        (&[4], &[4]),
        (&[2, 3, 4], &[2, 4, 5]),
        (&[2, 2, 3, 4], &[2, 2, 4, 5]),
        (&[2, 3, 4], &[4, 5]),
        (&[3, 4], &[6, 4, 5]),
        (&[2, 3, 4], &[4]),
        (&[0, 4], &[4, 5]),
        (&[3, 0], &[0, 5]),
        (&[2, 3, 4], &[2, 4, 0]),
    ];
    let mut checked = 0;
    for (i, &(sa, sb)) in cases.iter().enumerate() {
        for (ta, tb) in [(false, false), (true, false), (false, true), (true, true)] {
            if (ta || tb) && (sa.len() < 2 || sb.len() < 2) {
                continue;
            }
            // The stored operands: transposed ones hold their last two axes swapped.
            let stored = |s: &[usize], t: bool| {
                let mut s = s.to_vec();
                if t {
                    let r = s.len();
                    s.swap(r - 2, r - 1);
                }
                s
            };
            let (a, b) = (tensor(&stored(sa, ta), i), tensor(&stored(sb, tb), i + 1));
            let want = if ta || tb { ops::matmul_t(&a, &b, ta, tb) } else { ops::matmul(&a, &b) }.unwrap();
            let p = plan(a.shape(), b.shape(), ta, tb).unwrap_or_else(|| panic!("no plan for {sa:?} @ {sb:?}"));
            assert_eq!(p.out_shape, want.shape(), "{sa:?} @ {sb:?} ({ta}, {tb})");
            let got = if p.is_trivial() {
                vec![0.0; want.len()]
            } else {
                strided_batched(&p, &b.to_f64_vec(), &a.to_f64_vec())
            };
            assert_eq!(got, want.to_f64_vec(), "{sa:?} @ {sb:?} ({ta}, {tb}): {p:?}");
            checked += 1;
        }
    }
    assert!(checked >= 40, "{checked} products");
}

#[test]
fn what_one_call_cannot_compute_has_no_plan() {
    assert_eq!(plan(&[3, 4], &[5, 6], false, false), None, "inner dims disagree");
    assert_eq!(plan(&[2, 3, 4], &[3, 4, 5], false, false), None, "batch dims differ");
    assert_eq!(plan(&[2, 1, 3, 4], &[1, 2, 4, 5], false, false), None, "broadcast batch dims");
    assert_eq!(plan(&[4], &[4, 5], true, false), None, "a vector has no axes to swap");
    assert_eq!(plan(&[], &[4], false, false), None, "a scalar is not a matrix");
    assert_eq!(plan(&[1 << 31, 1], &[1, 1], false, false), None, "past 32-bit sizes");
    // Valid operands (no elements) whose product would have more elements than `usize` counts:
    // no plan, not an overflow (the CPU's error is the answer).
    let big = 1usize << 40;
    assert_eq!(plan(&[big, 0], &[0, big], false, false), None, "a result past usize");
    assert_eq!(plan(&[big, 1 << 24, 0], &[big, 0, 1 << 24], false, false), None, "a batch past usize");
}
