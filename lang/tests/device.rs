//! The interpreter runs its primitives through the `kernels::Device` it is given: a device
//! that records each launch sees a training step's kernels (the backward pass's GEMMs with
//! transposed operands as strided views, not copies), and a device whose results differ
//! changes what the program prints, so nothing bypasses it.

use kernels::ops::BinaryOp;
use kernels::{
    CpuDevice, DType, Device, DeviceTensor, KernelError, KernelId, KernelParams, MemoryStats, Stream, Tensor,
};
use std::path::Path;
use std::sync::{Arc, Mutex};

#[path = "../../kernels/tests/support/accel.rs"]
mod accel;

const SRC: &str = r#"
model Mlp { w1: f32[4, 8] = glorot_uniform(4, 8), w2: f32[8, 3] = glorot_uniform(8, 3) }

fn loss(m: Mlp, x: f32[16, 4], y: i32[16]) -> f32 {
    let h = relu(x @ m.w1)
    -mean(sum(log_softmax(h @ m.w2, axis: 1) * one_hot(y, 3), axis: 1))
}

fn main() {
    let m = init(Mlp, seed: 1)
    let x = normal(16, 4, seed: 2)
    let y = arange(16) % 3
    let (l, g) = value_and_grad(loss)(m, x, y)
    print(l)
    print(sum(g.w1) + sum(g.w2))
}
"#;

/// Delegates to the CPU device and records every launch; `skew` adds 1 to the output of
/// every `Binary(Mul)` (scalar arithmetic of one type stays on the host).
#[derive(Default)]
struct Recording {
    launches: Mutex<Vec<(KernelId, bool)>>,
    skew: bool,
}

impl Device for Recording {
    fn name(&self) -> &str {
        "recording"
    }
    fn runs(&self, _: KernelId, _: &[&DeviceTensor], _: &KernelParams) -> bool {
        true
    }
    fn alloc(&self, dtype: DType, len: usize) -> Result<DeviceTensor, KernelError> {
        CpuDevice.alloc(dtype, len)
    }
    fn upload(&self, t: &Tensor) -> Result<DeviceTensor, KernelError> {
        CpuDevice.upload(t)
    }
    fn download(&self, d: &DeviceTensor) -> Result<Tensor, KernelError> {
        CpuDevice.download(d)
    }
    fn launch_on(
        &self,
        stream: Stream,
        kernel: KernelId,
        inputs: &[&DeviceTensor],
        params: &KernelParams,
    ) -> Result<DeviceTensor, KernelError> {
        let viewed = inputs.iter().any(|d| !d.is_contiguous());
        self.launches.lock().unwrap().push((kernel, viewed));
        let out = CpuDevice.launch_on(stream, kernel, inputs, params)?;
        if self.skew && kernel == KernelId::Binary(BinaryOp::Mul) {
            let one = CpuDevice.upload(&kernels::ops::ones(out.dtype(), &[])?)?;
            return CpuDevice.launch(KernelId::Binary(BinaryOp::Add), &[&out, &one], &KernelParams::new());
        }
        Ok(out)
    }
    fn copy_into(&self, stream: Stream, src: &DeviceTensor, dst: &mut DeviceTensor) -> Result<(), KernelError> {
        CpuDevice.copy_into(stream, src, dst)
    }
    fn new_stream(&self) -> Result<Stream, KernelError> {
        CpuDevice.new_stream()
    }
    fn synchronize_stream(&self, stream: Stream) -> Result<(), KernelError> {
        CpuDevice.synchronize_stream(stream)
    }
    fn synchronize(&self) -> Result<(), KernelError> {
        CpuDevice.synchronize()
    }
    fn memory(&self) -> MemoryStats {
        CpuDevice.memory()
    }
}

/// What `SRC` prints on `device`.
fn run(device: Arc<dyn Device>) -> String {
    run_source(SRC, device)
}

/// What `src` prints on `device`.
fn run_source(src: &str, device: Arc<dyn Device>) -> String {
    let c = lang::check::check_source("device.msl", src, Path::new("."));
    assert!(!c.has_errors(), "{:?}", c.diagnostics);
    let main = c.program.root_funcs.iter().find(|(n, _)| n == "main").map(|(_, f)| *f).expect("main");
    let mut out: Vec<u8> = Vec::new();
    let mut it = lang::interp::Interp::new(&c.program, Box::new(&mut out));
    it.device = device;
    if let Err(e) = it.run_main(main) {
        panic!("the program stops: {}", e.message);
    }
    drop(it);
    String::from_utf8(out).unwrap()
}

/// A run of a program on an `Offload` of a fake accelerator.
struct OnAccel {
    /// Launches (on the accelerator, on the CPU) as `Offload` counts them.
    counts: (u64, u64),
    /// Launches the accelerator itself ran.
    accel_launches: u64,
    /// Bytes (to the accelerator, back).
    bytes: (u64, u64),
}

/// `src` on an `Offload` of `accel`, which must print what `src` prints on the CPU.
fn on_accel(src: &str, accel: accel::Accel) -> OnAccel {
    let accel = Arc::new(accel);
    let off = Arc::new(kernels::Offload::new(accel.clone()));
    assert_eq!(run_source(src, off.clone()), run_source(src, Arc::new(CpuDevice)));
    let accel_launches = accel.launches.load(std::sync::atomic::Ordering::Relaxed);
    let r = OnAccel { counts: off.counts(), accel_launches, bytes: off.bytes_moved() };
    eprintln!("{:?} launches on the accelerator and the CPU, {:?} bytes there and back", r.counts, r.bytes);
    r
}

#[test]
fn a_training_step_runs_through_the_device_it_is_given() {
    let cpu = run(Arc::new(CpuDevice));
    let rec = Arc::new(Recording::default());
    assert_eq!(run(rec.clone()), cpu, "the same program on a device that delegates to the CPU prints the same");
    let launches = rec.launches.lock().unwrap().clone();
    let has = |k: KernelId| launches.iter().any(|(l, _)| *l == k);
    for k in [
        KernelId::Matmul,
        KernelId::Unary(kernels::ops::UnaryOp::Relu),
        KernelId::LogSoftmax,
        KernelId::OneHot,
        KernelId::Reduce(kernels::ops::ReduceOp::Sum),
        KernelId::Binary(BinaryOp::Mul),
    ] {
        assert!(has(k), "no {k:?} launch among {launches:?}");
    }
    // The backward pass's `transpose(x) @ dh` and `dh @ transpose(w)` reach the GEMM as views.
    let strided = launches.iter().filter(|(k, v)| *k == KernelId::Matmul && *v).count();
    assert!(strided >= 2, "{strided} GEMMs took a strided view: {launches:?}");
}

#[test]
fn nothing_bypasses_the_device() {
    let cpu = run(Arc::new(CpuDevice));
    let skewed = run(Arc::new(Recording { skew: true, ..Recording::default() }));
    assert_ne!(skewed, cpu, "a device whose products are off by one changes what the program prints");
}

/// `--device cuda`'s way: a device that has only some kernels (here reductions, softmax and
/// cumsum, in buffers of its own) runs those, the CPU the rest, and the program prints what it
/// prints on the CPU.
#[test]
fn a_program_runs_whole_on_a_device_that_has_some_kernels() {
    let r = on_accel(SRC, accel::Accel::default());
    let (on_accel, on_host) = r.counts;
    assert!(on_accel > 0 && on_host > 0, "{on_accel} launches on the accelerator, {on_host} on the CPU");
    assert_eq!(r.accel_launches, on_accel);
}

/// The model and loss of the training loops below.
const MLP: &str = r#"
use optim.adam

model Mlp { w1: f32[4, 32] = glorot_uniform(4, 32), w2: f32[32, 3] = glorot_uniform(32, 3) }

fn loss(m: Mlp, x: f32[64, 4], y: i32[64]) -> f32 {
    let h = tanh(x @ m.w1)
    -mean(sum(log_softmax(h @ m.w2, axis: 1) * one_hot(y, 3), axis: 1))
}
"#;

/// 20 steps of gradient descent, as a program.
fn train() -> String {
    format!("{MLP}{}", TRAIN_MAIN)
}

const TRAIN_MAIN: &str = r#"
fn main() {
    var m = init(Mlp, seed: 1)
    let x = normal(64, 4, seed: 2)
    let y = arange(64) % 3
    var l = 0.0
    for step in 0..20 {
        let (v, g) = value_and_grad(loss)(m, x, y)
        m = m - 0.5 * g
        l = v
    }
    print(l)
    print(m.w2[0])
}
"#;

/// On a device that runs every kernel, a training loop's values stay there: what comes back
/// to the host is what the program prints, not the model at every step (the 20 steps compute
/// about 40 KB of parameters and gradients each).
#[test]
fn a_training_loop_keeps_its_values_on_the_device() {
    let r = on_accel(&train(), accel::Accel::everything());
    let ((_, on_host), (up, down)) = (r.counts, r.bytes);
    assert_eq!(on_host, 0);
    assert_eq!(down, 4 + 3 * 4, "what came back is the loss and a row of `m.w2`");
    assert!(up < 1024, "{up} bytes went over (the data is drawn there)");
}

const ADAM_MAIN: &str = r#"
fn main() {
    var m = init(Mlp, seed: 1)
    var opt = adam.init(m, lr: 0.01OFFLOAD)
    let x = normal(64, 4, seed: 2)
    let y = arange(64) % 3
    for step in 0..5 {
        let (l, g) = value_and_grad(loss)(m, x, y)
        (m, opt) = adam.step(m, g, opt)
        print(step, l)
    }
    print(opt.t, sum(opt.nu.w2))
}
"#;

/// `offload: host` on a device: the optimizer state stays in host memory and its update runs
/// on the CPU (MindSpore's heterogeneous training); the forward and backward passes stay on the
/// accelerator. The program prints what it prints without it, and on the CPU device.
#[test]
fn an_offloaded_optimizer_state_is_updated_on_the_host() {
    let plain = format!("{MLP}{}", ADAM_MAIN.replace("OFFLOAD", ""));
    let offloaded = format!("{MLP}{}", ADAM_MAIN.replace("OFFLOAD", ", offload: host"));
    let cpu = run_source(&plain, Arc::new(CpuDevice));
    assert_eq!(run_source(&offloaded, Arc::new(CpuDevice)), cpu, "on the CPU device `offload` changes nothing");
    let plain_run = on_accel(&plain, accel::Accel::everything());
    let (accel_plain, (up_plain, down_plain)) = (plain_run.accel_launches, plain_run.bytes);
    let offloaded_run = on_accel(&offloaded, accel::Accel::everything());
    let (accel, (up, down)) = (offloaded_run.accel_launches, offloaded_run.bytes);
    // Each of the 5 steps runs Adam's arithmetic on the host, not the accelerator, brings the
    // gradient there (the model's host copy is kept, so it does not come back but before the
    // first step) and sends the new model over once. The state made on the device comes over
    // once, at `init`.
    let params = (4 * 32 + 32 * 3) * 4;
    assert!(accel + 5 * 10 < accel_plain, "{accel} launches on the accelerator, {accel_plain} without `offload`");
    assert!(down >= 5 * params && down <= down_plain + 7 * params, "{down} bytes back");
    assert!(up >= up_plain + 5 * params, "{up} bytes there");
    // The step's launches on the host are counted too (what `--device cuda`'s note reports):
    // the same launches in all, moved from the accelerator's count to the CPU's.
    let ((on_accel, on_host), (plain_accel, plain_host)) = (offloaded_run.counts, plain_run.counts);
    assert_eq!(on_accel + on_host, plain_accel + plain_host, "every launch counted on one side");
    assert!(on_host >= plain_host + 5 * 10, "{on_host} launches on the CPU, {plain_host} without `offload`");
}

/// `train()` on a fake accelerator that runs the kernels the CUDA device runs: what a GPU run of
/// a training loop moves between host and device. The labels are made on the host (`arange` and
/// `%` of integers run there), so they go up for each step's `one_hot` (256 bytes); the step
/// count's conversion to `f32` runs on the CPU too. Nothing the accelerator computed comes back
/// but the printed values and a few scalars.
#[test]
fn a_training_loop_on_the_cuda_devices_kernels_moves_little() {
    let r = on_accel(&train(), accel::Accel::cuda_like());
    let ((on_accel, on_host), (up, down)) = (r.counts, r.bytes);
    assert!(on_accel > 10 * on_host, "{on_accel} launches on the accelerator, {on_host} on the CPU");
    assert!(up <= 20 * 64 * 4 + 1024, "{up} bytes up");
    assert!(down <= 1024, "{down} bytes down");
}

/// A cache written step by step (`buf = update(buf, …)`, as a key/value cache is) on a fake
/// accelerator that runs the CUDA device's kernels: it stays there, and what comes back is the
/// one sum printed at the end, not the cache at every step.
#[test]
fn a_cache_updated_in_a_loop_stays_on_the_cuda_device() {
    const CACHE: &str = r#"
fn main() {
    var buf = zeros(64, 32)
    let w = normal(32, 32, seed: 1)
    for t in 0..64 {
        let row = tanh(normal(32, seed: t) @ w)
        buf = update(buf, row, at: t)
    }
    print(sum(buf))
}
"#;
    let (_, down) = on_accel(CACHE, accel::Accel::cuda_like()).bytes;
    assert!(down <= 64, "{down} bytes came back: the cache ({} bytes) should not have", 64 * 32 * 4);
}
