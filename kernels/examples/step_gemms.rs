//! Times each matrix product of one W3 or W5 training step (the anchors' MLP 784-512-512-10 at
//! batch 256; the pre-LN block with d 256, FFN 1024, 2048 tokens) in the operand orientation the
//! derivative uses, so each can be set beside the same product in JAX or PyTorch
//! (`bench/step_gemms.py`). Medians of `REPS` calls, in microseconds.
//!
//! Run with `cargo run --release -p kernels --example step_gemms [w3|w5]`.

use std::time::Instant;

use kernels::{ops, rng, DType, Tensor};

/// (name, m, k, n, transpose a, transpose b): `op(a)` is m×k, `op(b)` is k×n.
type Case = (&'static str, usize, usize, usize, bool, bool);

const W3: [Case; 8] = [
    ("x @ w1", 256, 784, 512, false, false),
    ("h1 @ w2", 256, 512, 512, false, false),
    ("h2 @ w3", 256, 512, 10, false, false),
    ("h2^T @ d", 512, 256, 10, true, false),
    ("d @ w3^T", 256, 10, 512, false, true),
    ("h1^T @ g", 512, 256, 512, true, false),
    ("g @ w2^T", 256, 512, 512, false, true),
    ("x^T @ g", 784, 256, 512, true, false),
];

const W5: [Case; 9] = [
    ("h @ wq", 2048, 256, 256, false, false),
    ("h @ w1", 2048, 256, 1024, false, false),
    ("f @ w2", 2048, 1024, 256, false, false),
    ("g @ wq^T", 2048, 256, 256, false, true),
    ("g @ w1^T", 2048, 1024, 256, false, true),
    ("g @ w2^T", 2048, 256, 1024, false, true),
    ("h^T @ g", 256, 2048, 256, true, false),
    ("h^T @ g1", 256, 2048, 1024, true, false),
    ("f^T @ g", 1024, 2048, 256, true, false),
];

const REPS: usize = 30;

fn tensor(shape: &[usize], key: &str) -> Tensor {
    rng::uniform(DType::F32, shape, rng::stream_key(1, key), -1.0, 1.0).expect("uniform")
}

fn main() {
    let cases: &[Case] = match std::env::args().nth(1).as_deref() {
        Some("w5") => &W5,
        _ => &W3,
    };
    let mut total = 0.0;
    for &(name, m, k, n, ta, tb) in cases {
        let a = tensor(&if ta { [k, m] } else { [m, k] }, "a");
        let b = tensor(&if tb { [n, k] } else { [k, n] }, "b");
        ops::matmul_t(&a, &b, ta, tb).expect("matmul");
        let mut times: Vec<f64> = (0..REPS)
            .map(|_| {
                let start = Instant::now();
                std::hint::black_box(ops::matmul_t(&a, &b, ta, tb).expect("matmul"));
                start.elapsed().as_secs_f64()
            })
            .collect();
        times.sort_by(f64::total_cmp);
        let t = times[REPS / 2];
        total += t;
        println!("{name:10} {m}x{k}x{n}: {:8.1} us {:6.1} GFLOP/s", t * 1e6, 2.0 * (m * n * k) as f64 / t / 1e9);
    }
    println!("total {:.3} ms", total * 1e3);
}
