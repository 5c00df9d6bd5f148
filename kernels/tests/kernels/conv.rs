//! The convolution kernels against a direct six-loop reference, with stride and padding, and
//! their gradients against the adjoint identities ⟨conv(x, w), g⟩ = ⟨x, x̄⟩ = ⟨w, w̄⟩.

use kernels::{ops, Tensor};

/// A deterministic pseudo-random f64 tensor.
fn rand(shape: &[usize], seed: u64) -> Tensor {
    let n: usize = shape.iter().product();
    let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    let data = (0..n)
        .map(|_| {
            s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((s >> 33) as f64 / (1u64 << 31) as f64) - 0.5
        })
        .collect();
    Tensor::from_f64(shape.to_vec(), data).unwrap()
}

fn reference(x: &Tensor, w: &Tensor, s: usize, p: usize) -> (Vec<usize>, Vec<f64>) {
    let (xs, ws) = (x.shape(), w.shape());
    let (n, c, h, wd) = (xs[0], xs[1], xs[2], xs[3]);
    let (o, kh, kw) = (ws[0], ws[2], ws[3]);
    let (oh, ow) = ((h + 2 * p - kh) / s + 1, (wd + 2 * p - kw) / s + 1);
    let (xv, wv) = (x.data::<f64>().unwrap(), w.data::<f64>().unwrap());
    let mut out = vec![0.0; n * o * oh * ow];
    for b in 0..n {
        for oc in 0..o {
            for y in 0..oh {
                for z in 0..ow {
                    let mut acc = 0.0;
                    for ic in 0..c {
                        for i in 0..kh {
                            for j in 0..kw {
                                let (iy, ix) = ((y * s + i) as isize - p as isize, (z * s + j) as isize - p as isize);
                                if iy < 0 || ix < 0 || iy >= h as isize || ix >= wd as isize {
                                    continue;
                                }
                                acc += xv[((b * c + ic) * h + iy as usize) * wd + ix as usize]
                                    * wv[((oc * c + ic) * kh + i) * kw + j];
                            }
                        }
                    }
                    out[((b * o + oc) * oh + y) * ow + z] = acc;
                }
            }
        }
    }
    (vec![n, o, oh, ow], out)
}

fn dot(a: &Tensor, b: &Tensor) -> f64 {
    a.data::<f64>().unwrap().iter().zip(b.data::<f64>().unwrap()).map(|(x, y)| x * y).sum()
}

#[test]
fn conv2d_matches_the_direct_loops_and_its_adjoints() {
    // (n, c, h, w, o, kh, kw, stride, padding), including a kernel as large as the padded
    // input, strides that leave rows unread, and odd sizes.
    let cases = [
        (2, 3, 7, 6, 4, 3, 3, 1, 0),
        (2, 3, 7, 6, 4, 3, 3, 2, 1),
        (1, 2, 5, 5, 3, 2, 3, 3, 2),
        (5, 1, 4, 4, 2, 6, 6, 1, 1),
        (9, 2, 8, 3, 2, 1, 1, 2, 0),
        (1, 1, 1, 1, 1, 1, 1, 1, 0),
    ];
    for (k, &(n, c, h, wd, o, kh, kw, s, p)) in cases.iter().enumerate() {
        let x = rand(&[n, c, h, wd], 2 * k as u64);
        let w = rand(&[o, c, kh, kw], 2 * k as u64 + 1);
        let y = ops::conv2d(&x, &w, s, p).unwrap();
        let (shape, want) = reference(&x, &w, s, p);
        assert_eq!(y.shape(), &shape[..], "case {k}");
        for (a, b) in y.data::<f64>().unwrap().iter().zip(&want) {
            assert!((a - b).abs() < 1e-12, "case {k}: {a} vs {b}");
        }
        let g = rand(&shape, 100 + k as u64);
        let xg = ops::conv2d_input_grad(&g, &w, [h, wd], s, p).unwrap();
        let wg = ops::conv2d_weight_grad(&x, &g, [kh, kw], s, p).unwrap();
        assert_eq!(xg.shape(), x.shape());
        assert_eq!(wg.shape(), w.shape());
        let base = dot(&y, &g);
        assert!((dot(&x, &xg) - base).abs() < 1e-10, "case {k}: input gradient");
        assert!((dot(&w, &wg) - base).abs() < 1e-10, "case {k}: weight gradient");
    }
}

#[test]
fn conv2d_reports_bad_sizes() {
    let x = rand(&[1, 2, 4, 4], 1);
    let w = rand(&[3, 2, 3, 3], 2);
    let msg = |r: Result<Tensor, kernels::KernelError>| r.unwrap_err().to_string();
    assert!(msg(ops::conv2d(&x, &w, 0, 0)).contains("stride"));
    assert!(msg(ops::conv2d(&x, &rand(&[3, 2, 5, 5], 3), 1, 0)).contains("does not fit"));
    assert!(ops::conv2d(&x, &rand(&[3, 2, 5, 5], 3), 1, 1).is_ok());
    assert!(msg(ops::conv2d(&x, &rand(&[3, 1, 3, 3], 3), 1, 0)).contains("channels"));
    assert!(msg(ops::conv2d(&rand(&[2, 4, 4], 1), &w, 1, 0)).contains("rank 4"));
    assert!(ops::conv2d(&x.cast(kernels::DType::F32), &w, 1, 0).is_err());
}
