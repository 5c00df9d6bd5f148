//! Times one eager training step of a 784-512-512-10 MLP (batch 256, f32) built from `ops`
//! calls only, the way the msl interpreter runs it: median of 20 steps, in milliseconds.
//!
//! Run with `cargo run --release -p kernels --example mlp_step_bench`.

use std::time::Instant;

use kernels::ops::{self, BinaryOp, ReduceOp, UnaryOp};
use kernels::{rng, DType, KernelError, Tensor};

struct Layer {
    w: Tensor,
    b: Tensor,
}

fn bin(op: BinaryOp, a: &Tensor, b: &Tensor) -> Result<Tensor, KernelError> {
    ops::binary(op, a, b)
}

/// Forward, backward and SGD update; returns the loss.
fn step(layers: &mut [Layer], x: &Tensor, y: &Tensor, lr: f32) -> Result<f32, KernelError> {
    let batch = x.shape()[0] as f32;
    // Forward, keeping each layer's input and pre-activation.
    let mut inputs = vec![x.clone()];
    let mut pre = Vec::new();
    for (i, l) in layers.iter().enumerate() {
        let z = bin(BinaryOp::Add, &ops::matmul(inputs.last().unwrap(), &l.w)?, &l.b)?;
        if i + 1 < layers.len() {
            inputs.push(ops::unary(UnaryOp::Relu, &z)?);
        }
        pre.push(z);
    }
    let logits = pre.last().unwrap();
    let onehot = ops::one_hot(y, 10, DType::F32)?;
    let lsm = ops::log_softmax(logits, 1)?;
    let nll = ops::reduce(ReduceOp::Sum, &bin(BinaryOp::Mul, &lsm, &onehot)?, None, false)?;
    let loss = -nll.scalar_value_f64().unwrap() as f32 / batch;
    // Backward.
    let sm = ops::softmax(logits, 1)?;
    let mut g = bin(BinaryOp::Mul, &bin(BinaryOp::Sub, &sm, &onehot)?, &Tensor::scalar_f32(1.0 / batch))?;
    let lr = Tensor::scalar_f32(lr);
    for i in (0..layers.len()).rev() {
        let dw = ops::matmul_t(&inputs[i], &g, true, false)?;
        let db = ops::reduce(ReduceOp::Sum, &g, Some(0), false)?;
        if i > 0 {
            let dh = ops::matmul_t(&g, &layers[i].w, false, true)?;
            let mask = bin(BinaryOp::Gt, &pre[i - 1], &Tensor::scalar_f32(0.0))?;
            g = ops::where_(&mask, &dh, &Tensor::scalar_f32(0.0))?;
        }
        let l = &mut layers[i];
        l.w = bin(BinaryOp::Sub, &l.w, &bin(BinaryOp::Mul, &lr, &dw)?)?;
        l.b = bin(BinaryOp::Sub, &l.b, &bin(BinaryOp::Mul, &lr, &db)?)?;
    }
    Ok(loss)
}

fn main() -> Result<(), KernelError> {
    let sizes = [784, 512, 512, 10];
    let mut layers: Vec<Layer> = (0..3)
        .map(|i| {
            let std = (2.0 / sizes[i] as f64).sqrt();
            let key = rng::stream_key(0, &format!("layers.{i}.w"));
            Layer {
                w: rng::normal(DType::F32, &[sizes[i], sizes[i + 1]], key, 0.0, std).unwrap(),
                b: ops::zeros(DType::F32, &[sizes[i + 1]]).unwrap(),
            }
        })
        .collect();
    let x = rng::uniform(DType::F32, &[256, 784], rng::stream_key(0, "x"), 0.0, 1.0)?;
    let y = rng::uniform(DType::I32, &[256], rng::stream_key(0, "y"), 0.0, 10.0)?;
    let first = step(&mut layers, &x, &y, 0.01)?;
    let mut times = Vec::new();
    let mut loss = first;
    for _ in 0..20 {
        let start = Instant::now();
        loss = step(&mut layers, &x, &y, 0.01)?;
        times.push(start.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(f64::total_cmp);
    println!(
        "MLP 784-512-512-10, batch 256, f32: median step {:.2} ms (min {:.2}); loss {first:.4} -> {loss:.4} ({} rayon threads)",
        (times[9] + times[10]) / 2.0,
        times[0],
        rayon::current_num_threads()
    );
    Ok(())
}
