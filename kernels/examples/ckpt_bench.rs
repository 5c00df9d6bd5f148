//! One round of checkpoint write and read throughput: `kernels::io::checkpoint` (what
//! `save("dir/", state)` and `load("dir/")` call) on four f32 tensors of 256 MiB each (1 GiB),
//! read back into one buffer as a model's fields are, printed as one JSON line. `bench/ckpt.py` alternates these rounds with Python's
//! `safetensors` and `numpy.save` in the same run.
//!
//! Run with `cargo run --release -p kernels --example ckpt_bench -- DIR [MIB]`.

use std::time::Instant;

use kernels::io::checkpoint::{read_checkpoint, write_checkpoint, Wanted};
use kernels::Tensor;

fn main() {
    let mut args = std::env::args().skip(1);
    let Some(dir) = args.next() else {
        eprintln!("usage: ckpt_bench DIR [MIB]");
        std::process::exit(2);
    };
    let mib: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(1024);
    let per = mib * (1 << 20) / 4 / 4;
    let named: Vec<(String, Tensor)> = (0..4)
        .map(|k| {
            let v: Vec<f32> = (0..per).map(|i| ((i * 7 + k) % 1000) as f32 * 0.001).collect();
            (format!("layers.{k}.w"), Tensor::from_f32(vec![per / 1024, 1024], v).expect("a tensor"))
        })
        .collect();
    let wanted: Vec<Wanted> = named
        .iter()
        .map(|(n, t)| Wanted {
            name: n.clone(),
            dtype: t.dtype(),
            shape: t.shape().iter().map(|&d| Some(d)).collect(),
            group: Some(0),
            region: None,
        })
        .collect();
    let dir = std::path::Path::new(&dir);
    let start = Instant::now();
    write_checkpoint(dir, &named).expect("write");
    let write = start.elapsed().as_secs_f64();
    let start = Instant::now();
    let back = read_checkpoint(dir, &wanted).expect("read");
    let read = start.elapsed().as_secs_f64();
    assert!(back.iter().zip(&named).all(|(a, (_, b))| a == b), "read back what was written");
    let bytes = (4 * per * 4) as f64;
    println!(
        "{{\"impl\": \"msl\", \"bytes\": {bytes}, \"write_s\": {write:.4}, \"read_s\": {read:.4}, \"write_gbs\": {:.3}, \"read_gbs\": {:.3}}}",
        bytes / write / 1e9,
        bytes / read / 1e9
    );
}
