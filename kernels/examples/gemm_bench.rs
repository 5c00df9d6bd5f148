//! Measures f32 GEMM throughput: the median of 10 runs of a 1024³ `ops::matmul`, in GFLOP/s.
//!
//! Run with `cargo run --release -p kernels --example gemm_bench [n]`. Set
//! `RAYON_NUM_THREADS=1` for the single-thread figure.

use std::time::Instant;

use kernels::{ops, rng, DType};

fn main() {
    let n: usize = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(1024);
    let a = rng::uniform(DType::F32, &[n, n], rng::stream_key(1, "a"), -1.0, 1.0).unwrap();
    let b = rng::uniform(DType::F32, &[n, n], rng::stream_key(1, "b"), -1.0, 1.0).unwrap();
    // One warm-up run so that thread start-up and page faults are not timed.
    ops::matmul(&a, &b).expect("matmul");
    let mut times: Vec<f64> = (0..10)
        .map(|_| {
            let start = Instant::now();
            let c = ops::matmul(&a, &b).expect("matmul");
            let t = start.elapsed().as_secs_f64();
            std::hint::black_box(c);
            t
        })
        .collect();
    times.sort_by(f64::total_cmp);
    let median = (times[4] + times[5]) / 2.0;
    let gflops = 2.0 * (n as f64).powi(3) / median / 1e9;
    println!(
        "f32 matmul {n}x{n}x{n}: median {:.3} ms, {gflops:.1} GFLOP/s ({} rayon threads)",
        median * 1e3,
        rayon::current_num_threads()
    );
}
