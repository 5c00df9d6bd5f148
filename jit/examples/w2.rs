//! W2 in-process: `y = gelu(x * w + b)` on 16M f32, op by op (`-O0`) against one fused loop
//! (`-O1`), plus the same with `relu` (a tree without a C library call), and the compile
//! latency of a fused tree. Medians over repetitions; the inputs are made once, so data
//! generation does not count.
//!
//! `cargo run --release -p jit --example w2 [-- N REPS]`

use jit::{install, Options};
use kernels::Tensor;
use lang::interp::{Ctrl, Interp, Value};
use std::collections::HashMap;
use std::path::Path;
use std::time::Instant;

// As the `msl` binary: large freed blocks are reused (see `kernels::pool`).
#[global_allocator]
static ALLOC: kernels::pool::Pool<std::alloc::System> = kernels::pool::Pool(std::alloc::System);

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Calls the first function of `src` on `inputs` at `-O<level>`: (ms, result, compile µs).
fn call(src: &lang::check::Checked, inputs: &[Value], level: u8) -> (f64, Tensor, Option<f64>) {
    let f = src.program.root_funcs[0].1;
    let mut it = Interp::new(&src.program, Box::new(std::io::sink()));
    let report = install(&mut it, Options::level(level));
    let t = Instant::now();
    let v = match it.call(f, inputs.to_vec(), HashMap::new(), vec![]) {
        Ok(v) | Err(Ctrl::Return(v)) => v,
        Err(Ctrl::Error(e)) => panic!("{}", e.message),
    };
    let dt = t.elapsed().as_secs_f64() * 1e3;
    let compile = report.borrow().sites.first().and_then(|s| s.compiles.first().copied());
    (dt, v.tensor().cloned().expect("a tensor"), compile)
}

/// -O0 and -O1 medians (ms) of `body` over `reps` alternating calls, and bit-identity.
fn measure(body: &str, inputs: &[Value], reps: usize) -> (f64, f64, bool, Option<f64>) {
    let src = format!("fn w2[N](x: f32[N], w: f32[N], b: f32[N]) -> f32[N] {{ {body} }}");
    let c = lang::check::check_source("w2.msl", &src, Path::new("."));
    // The first -O1 call compiles (the first compile in a process also creates the JIT module).
    let (_, _, first) = call(&c, inputs, 1);
    let (mut o0, mut o1, mut same) = (Vec::new(), Vec::new(), true);
    for _ in 0..reps {
        let (a, ya, _) = call(&c, inputs, 0);
        let (b, yb, _) = call(&c, inputs, 1);
        o0.push(a);
        o1.push(b);
        same &= ya
            .to_f64_vec()
            .iter()
            .zip(yb.to_f64_vec())
            .all(|(p, q)| p.to_bits() == q.to_bits() || (p.is_nan() && q.is_nan()));
    }
    (median(o0), median(o1), same, first)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(16 << 20);
    let reps: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(9);
    let inputs: Vec<Value> = (1..=3u64)
        .map(|seed| {
            let key = kernels::rng::stream_key(seed, "");
            Value::Tensor(kernels::rng::normal(kernels::DType::F32, &[n], key, 0.0, 1.0).unwrap())
        })
        .collect();
    let threads = rayon::current_num_threads();
    println!("n = {n}, {reps} reps, {threads} threads");
    let mut first = None;
    for body in ["gelu(x * w + b)", "relu(x * w + b)"] {
        let (m0, m1, same, c) = measure(body, &inputs, reps);
        first = first.or(c);
        println!("  {body:16} -O0 {m0:7.1} ms/call   -O1 {m1:7.1} ms/call   {:.2}x   bit-identical: {same}", m0 / m1);
    }
    // Compile latency of further trees of W2's shape (distinct constants, so each one
    // compiles), in a process whose JIT module already exists: the median of 21.
    let mut src = String::new();
    for i in 0..21 {
        src += &format!("fn f{i}[N](x: f32[N], w: f32[N], b: f32[N]) -> f32[N] {{ gelu(x * w + b * {i}.5) }}\n");
    }
    let c2 = lang::check::check_source("w2b.msl", &src, Path::new("."));
    let small: Vec<Value> = (0..3).map(|_| Value::Tensor(Tensor::from_f32(vec![4], vec![1.0; 4]).unwrap())).collect();
    let mut warm = Vec::new();
    for (_, g) in &c2.program.root_funcs {
        let mut it = Interp::new(&c2.program, Box::new(std::io::sink()));
        let report = install(&mut it, Options::level(1));
        let _ = it.call(*g, small.clone(), HashMap::new(), vec![]);
        warm.extend(report.borrow().sites.first().and_then(|s| s.compiles.first().copied()));
    }
    println!(
        "  compile of one fused tree: first in the process {:.0} µs (creates the JIT module), then median {:.0} µs",
        first.unwrap_or(f64::NAN),
        median(warm)
    );
}
