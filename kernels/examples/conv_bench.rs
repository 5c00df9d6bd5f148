//! Times the three convolution kernels on the CNN benchmark's shapes (a 64×16×28×28 input, 32
//! filters of 16×3×3): the median of 10 runs of each, in ms and GFLOP/s.
//!
//! Run with `cargo run -p kernels --example conv_bench` (the dev profile builds `kernels` and
//! `gemm` at opt-level 3) or `--release`; `GEMM_SHAPES=1` times `ops::matmul` on the same
//! products instead.

use std::time::Instant;

use kernels::{ops, rng, DType, Tensor};

fn median(f: &mut dyn FnMut() -> Tensor) -> f64 {
    std::hint::black_box(f());
    let mut t: Vec<f64> = (0..10)
        .map(|_| {
            let s = Instant::now();
            std::hint::black_box(f());
            s.elapsed().as_secs_f64()
        })
        .collect();
    t.sort_by(f64::total_cmp);
    (t[4] + t[5]) / 2.0
}

fn main() {
    if std::env::var_os("GEMM_SHAPES").is_some() {
        gemm_shapes();
        return;
    }
    let x = rng::uniform(DType::F32, &[64, 16, 28, 28], rng::stream_key(1, "x"), -1.0, 1.0).unwrap();
    let w = rng::uniform(DType::F32, &[32, 16, 3, 3], rng::stream_key(1, "w"), -1.0, 1.0).unwrap();
    let g = rng::uniform(DType::F32, &[64, 32, 26, 26], rng::stream_key(1, "g"), -1.0, 1.0).unwrap();
    let geo = ops::Conv2dGeometry::new("conv2d", [64, 16, 28, 28], [32, 16, 3, 3], 1, 0).unwrap();
    let gf = geo.flops() / 1e9;
    let rows: [(&str, &mut dyn FnMut() -> Tensor); 3] = [
        ("forward", &mut || ops::conv2d(&x, &w, 1, 0).unwrap()),
        ("input gradient", &mut || ops::conv2d_input_grad(&g, &w, [28, 28], 1, 0).unwrap()),
        ("weight gradient", &mut || ops::conv2d_weight_grad(&x, &g, [3, 3], 1, 0).unwrap()),
    ];
    let mut total = 0.0;
    for (name, f) in rows {
        let t = median(f);
        total += t;
        println!("{name}: {:.2} ms, {:.1} GFLOP/s", t * 1e3, gf / t);
    }
    println!(
        "all three: {:.2} ms, {:.1} GFLOP/s ({} rayon threads)",
        total * 1e3,
        3.0 * gf / total,
        rayon::current_num_threads()
    );
}

/// With `GEMM_SHAPES=1`: `ops::matmul` on the products of one image, for comparison.
fn gemm_shapes() {
    for (m, k, n) in [(32usize, 144usize, 676usize), (144, 32, 676), (32, 676, 144), (32, 144, 43264)] {
        let a = rng::uniform(DType::F32, &[m, k], rng::stream_key(1, "a"), -1.0, 1.0).unwrap();
        let b = rng::uniform(DType::F32, &[64, k, n], rng::stream_key(1, "b"), -1.0, 1.0).unwrap();
        let t = median(&mut || ops::matmul(&a, &b).unwrap());
        println!(
            "[{m}x{k}] @ 64x[{k}x{n}]: {:.2} ms, {:.1} GFLOP/s",
            t * 1e3,
            2.0 * 64.0 * (m * n * k) as f64 / t / 1e9
        );
    }
}
