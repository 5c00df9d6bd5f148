//! The JIT on an interpreter whose device has an accelerator (`--device cuda`): each fused tree
//! the accelerator runs (`Device::accelerates`) goes to it as one `KernelId::Fused` launch of the
//! tree, which its code generator compiles (CUDA C on a GPU), and everything else runs as on the
//! CPU. With a fake accelerator that runs fused trees by the reference evaluation, a program at
//! -O1 prints what it prints on the CPU, and the report and the launch counts show the trees
//! went to the accelerator; on the CPU device no tree does.

#[path = "../../kernels/tests/support/accel.rs"]
mod accel;

use accel::Accel;
use kernels::{CpuDevice, Device, Offload};
use std::path::Path;
use std::sync::Arc;

const SRC: &str = r#"
fn step[N](x: f32[N], y: f32[N]) -> f32[N] {
    let z = relu(x * 2.0 + y) - 0.5 * tanh(y)
    where(z > 1.0, gelu(z), z * z)
}

fn main() {
    var x = normal(64, seed: 3)
    let y = uniform(64, seed: 4)
    for i in 0..5 {
        x = step(x, y) / 4.0
    }
    print(sum(x))
    print(x[0:4])
    print(sum(exp(x) > 1.0))
}
"#;

/// What `SRC` prints at -O1 on `device`, and the calls of its fused trees (all, on the device).
fn run(device: Arc<dyn Device>) -> (String, u64, u64) {
    let c = lang::check::check_source("device.msl", SRC, Path::new("."));
    assert!(!c.has_errors(), "{:?}", c.diagnostics);
    let main = c.program.root_funcs.iter().find(|(n, _)| n == "main").map(|(_, f)| *f).expect("main");
    let mut out: Vec<u8> = Vec::new();
    let mut it = lang::interp::Interp::new(&c.program, Box::new(&mut out));
    it.device = device;
    let report = jit::install(&mut it, jit::Options::level(1));
    if let Err(e) = it.run_main(main) {
        panic!("the program stops: {}", e.message);
    }
    drop(it);
    let r = report.borrow();
    let calls = r.sites.iter().map(|s| s.calls).sum();
    let on_device = r.sites.iter().map(|s| s.on_device).sum();
    let text = String::from_utf8(out).unwrap();
    (text, calls, on_device)
}

#[test]
fn fused_trees_run_on_the_accelerator_and_print_what_the_cpu_prints() {
    let (cpu, calls, on_cpu_device) = run(Arc::new(CpuDevice));
    assert!(calls >= 5, "the step's trees ran compiled ({calls} calls)");
    assert_eq!(on_cpu_device, 0, "on the CPU device every tree runs Cranelift's code");
    let fake = Arc::new(Accel::default());
    let off = Arc::new(Offload::new(fake.clone()));
    let (text, calls_there, on_device) = run(off.clone());
    assert_eq!(text, cpu, "the program prints the same with its trees on the accelerator");
    assert_eq!(on_device, calls_there, "every compiled tree went to the accelerator");
    assert!(on_device >= 5, "{on_device} trees on the accelerator");
    let (on_accel, _) = off.counts();
    let fused = fake.launches.load(std::sync::atomic::Ordering::Relaxed);
    assert!(on_accel >= on_device && fused >= on_device, "{on_accel} offloaded launches, {fused} on the fake");
}

/// Every spec example, interpreted and at -O1, on a device whose accelerator runs every kernel
/// (with the CPU's code, in buffers of its own), and interpreted on one that runs the CUDA
/// device's kernels: values stay on the accelerator between kernels and come back only where
/// the host reads them, and each example prints exactly what its spec says. The views, flat models, in-place updates, files and collectives of the specs all meet
/// tensors that live on the accelerator here.
#[test]
fn every_spec_example_prints_the_same_with_its_values_on_an_accelerator() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../spec");
    let mut files: Vec<_> = std::fs::read_dir(&root).unwrap().map(|e| e.unwrap().path()).collect();
    files.retain(|f| f.extension().is_some_and(|x| x == "md"));
    files.sort();
    let (mut ran, mut failed) = (0, Vec::new());
    let (mut up, mut down) = (0, 0);
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        for b in lang::spec::parse_blocks(&text) {
            let Some((kind, _, _, want)) = &b.expect else { continue };
            // Interpreted and at -O1 on the accelerator that runs everything; interpreted on
            // one that runs the CUDA device's kernels, so that host and device values mix.
            let runs = [(Accel::everything(), None), (Accel::everything(), Some(1)), (Accel::cuda_like(), None)];
            for (accel, level) in runs {
                let off = Arc::new(Offload::new(Arc::new(accel)));
                let out = lang::spec::run_block_with(&b.code, &root, &mut |it| {
                    it.device = off.clone();
                    if let Some(l) = level {
                        drop(jit::install(it, jit::Options::level(l)));
                    }
                });
                ran += 1;
                let (u, d) = off.bytes_moved();
                (up, down) = (up + u, down + d);
                if out.kind() != kind || out.text() != want {
                    failed.push(format!("{}:{} at {level:?}:\n{}", f.display(), b.start + 1, out.text()));
                }
            }
        }
    }
    eprintln!("{ran} runs; {up} bytes to the accelerator, {down} back");
    assert!(ran > 1000, "only {ran} runs");
    assert!(failed.is_empty(), "{} of {ran} differ:\n{}", failed.len(), failed.join("\n"));
}
