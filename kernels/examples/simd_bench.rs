//! The hot elementwise and reduction kernels of W3 and W5 in their baseline (SSE2) and AVX2
//! builds, alternated round by round in one process (`kernels::simd::set_avx2`), with a check
//! that both builds give the same bits. Medians of 7 rounds, microseconds.
//!
//! Run with `cargo run --release -p kernels --example simd_bench`.

use std::time::Instant;

use kernels::ops::{self, BinaryOp, ReduceOp, UnaryOp};
use kernels::{rng, simd, DType, Tensor};

type Kernel = Box<dyn Fn() -> Tensor>;

fn main() {
    let big = rng::normal(DType::F32, &[2048, 1024], rng::stream_key(1, "x"), 0.0, 2.0).expect("normal");
    let bias = rng::normal(DType::F32, &[1024], rng::stream_key(1, "b"), 0.0, 1.0).expect("normal");
    let scores = rng::normal(DType::F32, &[16, 4, 128, 128], rng::stream_key(1, "s"), 0.0, 3.0).expect("normal");
    let square = rng::normal(DType::F32, &[512, 512], rng::stream_key(1, "w"), 0.0, 1.0).expect("normal");
    let tall = rng::normal(DType::F32, &[1024, 256], rng::stream_key(1, "t"), 0.0, 1.0).expect("normal");
    let cases: Vec<(&str, Kernel)> = vec![
        (
            "exp [2048, 1024]",
            Box::new({
                let x = big.clone();
                move || ops::unary(UnaryOp::Exp, &x).unwrap()
            }),
        ),
        (
            "gelu [2048, 1024]",
            Box::new({
                let x = big.clone();
                move || ops::unary(UnaryOp::Gelu, &x).unwrap()
            }),
        ),
        (
            "tanh [2048, 1024]",
            Box::new({
                let x = big.clone();
                move || ops::unary(UnaryOp::Tanh, &x).unwrap()
            }),
        ),
        (
            "x * y [2048, 1024]",
            Box::new({
                let x = big.clone();
                move || ops::binary(BinaryOp::Mul, &x, &x).unwrap()
            }),
        ),
        (
            "x + b [2048, 1024] + [1024]",
            Box::new({
                let (x, b) = (big.clone(), bias.clone());
                move || ops::binary(BinaryOp::Add, &x, &b).unwrap()
            }),
        ),
        (
            "sum axis 0 [2048, 1024]",
            Box::new({
                let x = big.clone();
                move || ops::reduce(ReduceOp::Sum, &x, Some(0), false).unwrap()
            }),
        ),
        (
            "mean axis 1 [2048, 1024]",
            Box::new({
                let x = big.clone();
                move || ops::reduce(ReduceOp::Mean, &x, Some(1), false).unwrap()
            }),
        ),
        (
            "logsumexp axis 3 [16, 4, 128, 128]",
            Box::new({
                let x = scores.clone();
                move || ops::logsumexp(&x, Some(3), true).unwrap()
            }),
        ),
        (
            "softmax axis 3 [16, 4, 128, 128]",
            Box::new({
                let x = scores.clone();
                move || ops::softmax(&x, 3).unwrap()
            }),
        ),
        (
            "transpose [512, 512]",
            Box::new({
                let x = square.clone();
                move || ops::swap_last(&x).unwrap()
            }),
        ),
        (
            "transpose [1024, 256]",
            Box::new({
                let x = tall.clone();
                move || ops::swap_last(&x).unwrap()
            }),
        ),
    ];
    println!("| kernel | baseline µs | avx2 µs | baseline / avx2 |");
    println!("|---|---|---|---|");
    for (name, k) in &cases {
        let (mut base, mut avx) = (Vec::new(), Vec::new());
        for _ in 0..7 {
            for (on, acc) in [(false, &mut base), (true, &mut avx)] {
                simd::set_avx2(on);
                k();
                let start = Instant::now();
                for _ in 0..5 {
                    std::hint::black_box(k());
                }
                acc.push(start.elapsed().as_secs_f64() / 5.0 * 1e6);
            }
        }
        simd::set_avx2(false);
        let a = k();
        simd::set_avx2(true);
        let b = k();
        assert!(same_bits(&a, &b), "{name}: the two builds differ");
        let (mb, ma) = (median(&mut base), median(&mut avx));
        println!("| {name} | {mb:.0} | {ma:.0} | {:.2}× |", mb / ma);
    }
    println!("(AVX2 available: {})", simd::avx2_enabled());
}

fn same_bits(a: &Tensor, b: &Tensor) -> bool {
    let (x, y) = (a.as_f32().expect("f32"), b.as_f32().expect("f32"));
    x.len() == y.len() && x.iter().zip(y).all(|(p, q)| p.to_bits() == q.to_bits())
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}
