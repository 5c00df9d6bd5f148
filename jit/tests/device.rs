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
