//! Matrix products: NumPy matmul semantics, batch broadcasting, and gemm against a naive loop.

use kernels::ops;
use kernels::{DType, KernelError, Tensor};

use crate::{check, lcg, t32, t64, ti};

/// A naive triple loop in f64 over row-major `[m, k]` and `[k, n]`.
fn naive(a: &[f64], b: &[f64], m: usize, k: usize, n: usize) -> Vec<f64> {
    let mut c = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            c[i * n + j] = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
        }
    }
    c
}

// Reference values computed once with NumPy 2.4:
//   A = np.arange(12.).reshape(2,1,2,3) - 5; B = np.arange(18.).reshape(3,3,2) % 7 - 3
//   (A @ B).shape == (2,3,2,2); v = [1,-2,3]: v @ B[0], A[0,0] @ v, v @ v, v @ B (shape (3,2))
fn ab() -> (Tensor, Tensor) {
    let a: Vec<f64> = (0..12).map(|i| i as f64 - 5.0).collect();
    let b: Vec<f64> = (0..18).map(|i| (i % 7) as f64 - 3.0).collect();
    (t64(&[2, 1, 2, 3], &a), t64(&[3, 3, 2], &b))
}

#[test]
fn batch_dimensions_broadcast_like_numpy() {
    let (a, b) = ab();
    let c = ops::matmul(&a, &b).unwrap();
    let want = [
        16.0, 4.0, 7.0, 4.0, -7.0, 16.0, -4.0, 7.0, 5.0, -7.0, -1.0, -4.0, -2.0, 4.0, -11.0, 4.0, -1.0, -2.0, 2.0,
        -11.0, -7.0, -1.0, -13.0, 2.0,
    ];
    check(&c, &[2, 3, 2, 2], &want, 0.0);
}

#[test]
fn one_dimensional_operands_are_promoted_and_squeezed() {
    let (a, b) = ab();
    let v = t64(&[3], &[1.0, -2.0, 3.0]);
    let b0 = ops::slice(&b, &[ops::SliceSpec::Index(0)]).unwrap();
    check(&ops::matmul(&v, &b0).unwrap(), &[2], &[2.0, 4.0], 0.0);
    let a00 = ops::slice(&a, &[ops::SliceSpec::Index(0), ops::SliceSpec::Index(0)]).unwrap();
    check(&ops::matmul(&a00, &v).unwrap(), &[2], &[-6.0, 0.0], 0.0);
    check(&ops::matmul(&v, &v).unwrap(), &[], &[14.0], 0.0);
    check(&ops::matmul(&v, &b).unwrap(), &[3, 2], &[2.0, 4.0, 7.0, 2.0, 5.0, 7.0], 0.0);
    // A 1-D right operand against a batch: [2,1,2,3] @ [3] -> [2,1,2].
    assert_eq!(ops::matmul(&a, &v).unwrap().shape(), &[2, 1, 2]);
}

#[test]
fn f32_gemm_matches_a_naive_loop() {
    let (m, k, n) = (300, 200, 100);
    let a = lcg(m * k, 1);
    let b = lcg(k * n, 2);
    let a32: Vec<f32> = a.iter().map(|&x| x as f32).collect();
    let b32: Vec<f32> = b.iter().map(|&x| x as f32).collect();
    // The reference uses the f32-rounded inputs, accumulated in f64.
    let want = naive(
        &a32.iter().map(|&x| x as f64).collect::<Vec<_>>(),
        &b32.iter().map(|&x| x as f64).collect::<Vec<_>>(),
        m,
        k,
        n,
    );
    let c = ops::matmul(&t32(&[m, k], &a32), &t32(&[k, n], &b32)).unwrap();
    assert_eq!(c.shape(), &[m, n]);
    let got = c.to_f64_vec();
    let scale = want.iter().fold(0.0f64, |s, x| s.max(x.abs()));
    for (g, w) in got.iter().zip(&want) {
        assert!((g - w).abs() <= 1e-4 * scale.max(1.0), "got {g}, want {w}");
    }
}

#[test]
fn f64_gemm_is_exact_on_small_integers_and_close_on_random_data() {
    let (m, k, n) = (70, 90, 50);
    let a: Vec<f64> = (0..m * k).map(|i| ((i * 7) % 13) as f64 - 6.0).collect();
    let b: Vec<f64> = (0..k * n).map(|i| ((i * 5) % 11) as f64 - 5.0).collect();
    let c = ops::matmul(&t64(&[m, k], &a), &t64(&[k, n], &b)).unwrap();
    check(&c, &[m, n], &naive(&a, &b, m, k, n), 0.0);
    let (m, k, n) = (129, 65, 97);
    let a = lcg(m * k, 3);
    let b = lcg(k * n, 4);
    let c = ops::matmul(&t64(&[m, k], &a), &t64(&[k, n], &b)).unwrap();
    check(&c, &[m, n], &naive(&a, &b, m, k, n), 1e-12);
}

#[test]
fn many_small_products_run_per_batch() {
    let (nb, m, k, n) = (256, 8, 16, 8);
    let a = lcg(nb * m * k, 5);
    let b = lcg(nb * k * n, 6);
    let c = ops::matmul(&t64(&[nb, m, k], &a), &t64(&[nb, k, n], &b)).unwrap();
    let mut want = Vec::new();
    for i in 0..nb {
        want.extend(naive(&a[i * m * k..(i + 1) * m * k], &b[i * k * n..(i + 1) * k * n], m, k, n));
    }
    check(&c, &[nb, m, n], &want, 1e-12);
}

#[test]
fn transposed_products_read_operands_through_strides() {
    let (m, k, n) = (33, 17, 21);
    let a = t64(&[k, m], &lcg(k * m, 8));
    let b = t64(&[n, k], &lcg(n * k, 9));
    let at = ops::transpose(&a);
    let bt = ops::transpose(&b);
    let want = ops::matmul(&at, &bt).unwrap();
    assert_eq!(ops::matmul_t(&a, &b, true, true).unwrap(), want);
    let got = ops::matmul_t(&at, &b, false, true).unwrap();
    check(&got, &[m, n], &want.to_f64_vec(), 1e-14);
    let got = ops::matmul_t(&a, &bt, true, false).unwrap();
    check(&got, &[m, n], &want.to_f64_vec(), 1e-14);
}

#[test]
fn integer_products_and_degenerate_sizes() {
    let a = ti(&[2, 3], &[1, 2, 3, 4, 5, 6]);
    let b = ti(&[3, 2], &[7, 8, 9, 10, 11, 12]);
    assert_eq!(ops::matmul(&a, &b).unwrap().as_i32().unwrap(), &[58, 64, 139, 154]);
    let z = ops::matmul(&t32(&[2, 0], &[]), &t32(&[0, 3], &[])).unwrap();
    check(&z, &[2, 3], &[0.0; 6], 0.0);
    assert_eq!(ops::matmul(&t32(&[0, 4], &[]), &t32(&[4, 3], &[0.0; 12])).unwrap().shape(), &[0, 3]);
}

#[test]
fn mismatched_products_are_errors() {
    let a = t32(&[2, 3], &[0.0; 6]);
    let b = t32(&[2, 3], &[0.0; 6]);
    assert_eq!(ops::matmul(&a, &b).unwrap_err().to_string(), "matmul: shapes [2, 3] and [2, 3] are incompatible");
    let c = t32(&[4, 3, 2], &[0.0; 24]);
    let d = t32(&[5, 2, 2], &[0.0; 20]);
    assert!(matches!(ops::matmul(&c, &d), Err(KernelError::ShapeMismatch { .. })));
    assert!(ops::matmul(&Tensor::scalar_f32(1.0), &a).is_err());
    let p = Tensor::from_bool(vec![1, 1], vec![true]).unwrap();
    assert!(ops::matmul(&p, &p).is_err());
    assert!(ops::matmul(&a, &ti(&[3, 1], &[1, 2, 3])).is_err());
}

/// A stack of matrices times one matrix is computed as one tall product (the right operand is
/// packed once): each matrix of the result is exactly the product of its own slice, with the
/// right operand plain or read transposed, in f32 and f64, for small and threaded sizes.
#[test]
fn a_stack_times_a_matrix_equals_each_product() {
    for &(nb, m, k, n) in &[(3usize, 2usize, 3usize, 4usize), (16, 128, 96, 80)] {
        let a = lcg(nb * m * k, 7);
        let b = lcg(k * n, 8);
        for transpose_b in [false, true] {
            // The right operand as stored: k×n, or n×k read transposed.
            let (bshape, bdata) = if transpose_b {
                let mut t = vec![0.0; k * n];
                for p in 0..k {
                    for j in 0..n {
                        t[j * k + p] = b[p * n + j];
                    }
                }
                ([n, k], t)
            } else {
                ([k, n], b.clone())
            };
            let a32: Vec<f32> = a.iter().map(|&x| x as f32).collect();
            let b32: Vec<f32> = bdata.iter().map(|&x| x as f32).collect();
            for (sa, sb) in [(t64(&[nb, m, k], &a), t64(&bshape, &bdata)), (t32(&[nb, m, k], &a32), t32(&bshape, &b32))]
            {
                let stacked = ops::matmul_t(&sa, &sb, false, transpose_b).unwrap();
                assert_eq!(stacked.shape(), &[nb, m, n]);
                let got = stacked.to_f64_vec();
                let all = sa.to_f64_vec();
                for i in 0..nb {
                    let slice: Vec<f64> = all[i * m * k..(i + 1) * m * k].to_vec();
                    let single = if sa.dtype() == kernels::DType::F64 {
                        t64(&[m, k], &slice)
                    } else {
                        t32(&[m, k], &slice.iter().map(|&x| x as f32).collect::<Vec<_>>())
                    };
                    let want = ops::matmul_t(&single, &sb, false, transpose_b).unwrap().to_f64_vec();
                    assert_eq!(&got[i * m * n..(i + 1) * m * n], &want[..], "matrix {i} of {nb}×{m}×{k}×{n}");
                    let naive_want = naive(&slice, &b, m, k, n);
                    for (g, w) in want.iter().zip(&naive_want) {
                        assert!((g - w).abs() <= 1e-4 * (1.0 + w.abs()), "{g} vs {w}");
                    }
                }
            }
        }
    }
}

/// A right operand read transposed in a product big enough for threads is first copied
/// row-major (gemm packs a column-major one slowly): the result is exactly the product with
/// that copy, and close to a naive f64 product, for one matrix and for a broadcast batch.
#[test]
fn large_products_with_a_transposed_right_operand_equal_the_copy() {
    let (m, k, n) = (96, 130, 70);
    let a = lcg(2 * m * k, 11);
    let b = lcg(n * k, 12);
    let a32: Vec<f32> = a.iter().map(|&x| x as f32).collect();
    let b32: Vec<f32> = b.iter().map(|&x| x as f32).collect();
    let bt = t32(&[n, k], &b32);
    let copy = ops::transpose(&bt);
    let one = t32(&[m, k], &a32[..m * k]);
    let got = ops::matmul_t(&one, &bt, false, true).unwrap();
    assert_eq!(got, ops::matmul(&one, &copy).unwrap());
    let bt64: Vec<f64> = copy.to_f64_vec();
    let a64: Vec<f64> = a32[..m * k].iter().map(|&x| x as f64).collect();
    check(&got, &[m, n], &naive(&a64, &bt64, m, k, n), 1e-5);
    let batch = t32(&[2, m, k], &a32);
    let stacked = t32(&[2, n, k], &[b32.clone(), b32].concat());
    let got = ops::matmul_t(&batch, &stacked, false, true).unwrap();
    assert_eq!(got, ops::matmul(&batch, &ops::permute(&stacked, &[0, 2, 1]).unwrap()).unwrap());
}

/// Products with a small inner size run on one thread below a million outputs and on all of
/// them above; both equal a naive f64 product, with either operand read transposed (`d @ wᵀ`
/// of a classifier's input gradient).
#[test]
fn shallow_products_on_one_thread_or_many_equal_the_naive_loop() {
    for (m, k, n) in [(256, 10, 512), (1024, 3, 1025)] {
        let a: Vec<f32> = lcg(m * k, 21).iter().map(|&x| x as f32).collect();
        let b: Vec<f32> = lcg(k * n, 22).iter().map(|&x| x as f32).collect();
        let (a64, b64): (Vec<f64>, Vec<f64>) =
            (a.iter().map(|&x| x as f64).collect(), b.iter().map(|&x| x as f64).collect());
        let want = naive(&a64, &b64, m, k, n);
        let (at, bt) = (t32(&[m, k], &a), t32(&[k, n], &b));
        check(&ops::matmul(&at, &bt).unwrap(), &[m, n], &want, 1e-5);
        let (ta, tb) = (ops::transpose(&at), ops::transpose(&bt));
        check(&ops::matmul_t(&ta, &tb, true, true).unwrap(), &[m, n], &want, 1e-5);
    }
}

/// `aᵀ @ b` with fewer than 16 columns is computed as `(bᵀ @ a)ᵀ` on one thread; every element
/// has the bits of the same product taken the usual way, which a 16-column operand (`b` and
/// zero columns) still gets, and is near the naive f64 product.
#[test]
fn narrow_weight_gradients_have_the_bits_of_the_usual_product() {
    let mut seed = 7u64;
    let mut below = |n: usize| {
        seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (seed >> 33) as usize % n
    };
    let mut shapes = vec![(512, 256, 10), (784, 256, 10), (16, 17, 2), (2048, 1100, 15), (65, 600, 4), (20, 700, 13)];
    shapes.extend((0..40).map(|_| (16 + below(900), 1 + below(1200), 2 + below(14))));
    for (i, &(m, k, n)) in shapes.iter().enumerate() {
        let a: Vec<f32> = lcg(k * m, 30 + i as u64).iter().map(|&x| x as f32).collect();
        let b: Vec<f32> = lcg(k * n, 90 + i as u64).iter().map(|&x| x as f32).collect();
        let wide: Vec<f32> = (0..k * 16).map(|e| if e % 16 < n { b[e / 16 * n + e % 16] } else { 0.0 }).collect();
        let got = ops::matmul_t(&t32(&[k, m], &a), &t32(&[k, n], &b), true, false).unwrap();
        let usual = ops::matmul_t(&t32(&[k, m], &a), &t32(&[k, 16], &wide), true, false).unwrap().to_f64_vec();
        let want: Vec<f64> = (0..m * n).map(|e| usual[e / n * 16 + e % n]).collect();
        assert_eq!(got.shape(), &[m, n]);
        assert!(got.to_f64_vec() == want, "{m}x{k}x{n}: not the usual product's bits");
        let at: Vec<f64> = (0..m * k).map(|e| a[(e % k) * m + e / k] as f64).collect();
        let b64: Vec<f64> = b.iter().map(|&x| x as f64).collect();
        check(&got, &[m, n], &naive(&at, &b64, m, k, n), 1e-4 * (k as f64).sqrt());
    }
}

/// Products whose output columns are split between the threads (an inner size above 512)
/// have, column by column, the bits of narrower products that are not split, with either
/// operand orientation of the left one.
#[test]
fn products_split_by_columns_have_the_bits_of_each_band() {
    for (i, &(m, k, n, ta)) in
        [(256, 784, 512, false), (128, 1100, 200, true), (300, 2048, 129, true), (65, 700, 300, false)]
            .iter()
            .enumerate()
    {
        let a: Vec<f32> = lcg(m * k, 50 + i as u64).iter().map(|&x| x as f32).collect();
        let b: Vec<f32> = lcg(k * n, 60 + i as u64).iter().map(|&x| x as f32).collect();
        let at = t32(&if ta { [k, m] } else { [m, k] }, &a);
        let got = ops::matmul_t(&at, &t32(&[k, n], &b), ta, false).unwrap().to_f64_vec();
        // 60-column slices of `b`: too narrow to split.
        for c0 in (0..n).step_by(60) {
            let w = 60.min(n - c0);
            let slice: Vec<f32> = (0..k * w).map(|e| b[e / w * n + c0 + e % w]).collect();
            let part = ops::matmul_t(&at, &t32(&[k, w], &slice), ta, false).unwrap().to_f64_vec();
            for r in 0..m {
                assert!(
                    got[r * n + c0..r * n + c0 + w] == part[r * w..(r + 1) * w],
                    "{m}x{k}x{n} ({ta}): row {r}, columns {c0}.."
                );
            }
        }
    }
}

#[test]
fn storage_only_matrices_multiply_in_f32_and_round_once() {
    let a = Tensor::from_vec(vec![2, 3], vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
    let b = Tensor::from_vec(vec![3, 2], vec![0.5f32, -1.0, 0.25, 2.0, 1.5, 0.125]).unwrap();
    let want = ops::matmul(&a, &b).unwrap();
    for d in [DType::Bf16, DType::F16] {
        let got = ops::matmul(&a.cast(d), &b.cast(d)).unwrap();
        assert_eq!(got.dtype(), d);
        assert_eq!(got.to_f64_vec(), want.cast(d).to_f64_vec());
        let t = ops::matmul_t(&a.cast(d), &a.cast(d), false, true).unwrap();
        assert_eq!(t.to_f64_vec(), ops::matmul_t(&a, &a, false, true).unwrap().cast(d).to_f64_vec());
    }
}
