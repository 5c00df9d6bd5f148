//! `Offload`: a device that has only some kernels runs those, the CPU the rest, and the
//! kernels give the CPU device's results bit for bit (`support/accel.rs` is the accelerator).

#[path = "support/accel.rs"]
mod accel;

use accel::Accel;
use kernels::ops::{BinaryOp, ReduceOp, UnaryOp};
use kernels::{CpuDevice, DType, Device, KernelId, KernelParams, Offload, Tensor};
use std::sync::atomic::Ordering;

fn bits(t: &Tensor) -> Vec<u64> {
    t.to_f64_vec().iter().map(|v| v.to_bits()).collect()
}

#[test]
fn kernels_it_has_run_on_the_accelerator_the_rest_on_the_cpu_with_the_cpus_results() {
    let accel = std::sync::Arc::new(Accel::default());
    let off = Offload::new(accel.clone());
    let x = Tensor::from_vec(vec![4, 6, 5], (0..120).map(|i| ((i * 37) % 23) as f64 / 7.0 - 1.5).collect()).unwrap();
    let mut expected = 0;
    for dtype in [DType::F32, DType::F64] {
        let x = x.cast(dtype);
        let (xc, xo) = (CpuDevice.upload(&x).unwrap(), off.upload(&x).unwrap());
        // A view too: the operand moved is what it selects.
        let (vc, vo) = (xc.permuted(&[2, 0, 1]).unwrap(), xo.permuted(&[2, 0, 1]).unwrap());
        for axis in 0..3 {
            for k in [
                KernelId::Reduce(ReduceOp::Sum),
                KernelId::Reduce(ReduceOp::Max),
                KernelId::Softmax,
                KernelId::LogSoftmax,
                KernelId::Cumsum,
                KernelId::ArgMax,
                KernelId::Unary(UnaryOp::Exp),
            ] {
                let p = KernelParams::new().axis(axis);
                for (c, o) in [(&xc, &xo), (&vc, &vo)] {
                    let want = CpuDevice.download(&CpuDevice.launch(k, &[c], &p).unwrap()).unwrap();
                    let got = off.download(&off.launch(k, &[o], &p).unwrap()).unwrap();
                    assert_eq!((got.shape(), got.dtype()), (want.shape(), want.dtype()), "{k:?} axis {axis}");
                    assert_eq!(bits(&got), bits(&want), "{k:?} axis {axis} {dtype}");
                }
                expected += 2;
            }
        }
    }
    let (on_accel, host) = off.counts();
    assert_eq!(on_accel + host, expected);
    // Sum, max, softmax, log_softmax and cumsum on the accelerator; argmax and exp on the CPU.
    assert_eq!((on_accel, host), (expected / 7 * 5, expected / 7 * 2));
    assert_eq!(accel.launches.load(Ordering::Relaxed), on_accel);
    // Integers stay on the CPU, and a binary kernel of two operands works through it.
    let i = Tensor::from_vec(vec![3], vec![1.0, 2.0, 3.0]).unwrap().cast(DType::I32);
    let io = off.upload(&i).unwrap();
    let s = off.launch(KernelId::Reduce(ReduceOp::Sum), &[&io], &KernelParams::new().axis(0)).unwrap();
    assert_eq!(off.download(&s).unwrap().to_f64_vec(), vec![6.0]);
    let two = off.launch(KernelId::Binary(BinaryOp::Add), &[&io, &io], &KernelParams::new()).unwrap();
    assert_eq!(off.download(&two).unwrap().to_f64_vec(), vec![2.0, 4.0, 6.0]);
    assert_eq!(off.counts(), (on_accel, host + 2));
    // Each offloaded launch moved its operand there and its result back; the CPU's moved none.
    let (up, down) = off.bytes_moved();
    assert!(up > 0 && down > 0 && down <= up, "{up} bytes up, {down} down");
    let before = off.bytes_moved();
    let _ = off.launch(KernelId::Binary(BinaryOp::Add), &[&io, &io], &KernelParams::new()).unwrap();
    assert_eq!(off.bytes_moved(), before, "a launch on the CPU moves nothing");
    let f = off.upload(&Tensor::from_vec(vec![2, 3], vec![1.0f32; 6]).unwrap()).unwrap();
    let r = off.launch(KernelId::Reduce(ReduceOp::Sum), &[&f], &KernelParams::new().axis(1)).unwrap();
    assert_eq!(off.bytes_moved(), (before.0 + 24, before.1), "six f32s there, nothing back yet");
    assert_eq!(off.download(&r).unwrap().to_f64_vec(), vec![3.0, 3.0]);
    assert_eq!(off.bytes_moved(), (before.0 + 24, before.1 + 8), "two back when read");
}

/// `f` through `dev`: `x` up, softmax of it, cumsum of that read through a permuted view,
/// and the sum of that along an axis, all left on the device.
fn chain(dev: &dyn Device, x: &Tensor) -> [kernels::DeviceTensor; 3] {
    let d = dev.upload(x).unwrap();
    let a = dev.launch(KernelId::Softmax, &[&d], &KernelParams::new().axis(2)).unwrap();
    let v = a.permuted(&[2, 0, 1]).unwrap();
    let b = dev.launch(KernelId::Cumsum, &[&v], &KernelParams::new().axis(1)).unwrap();
    let c = dev.launch(KernelId::Reduce(ReduceOp::Sum), &[&b], &KernelParams::new().axis(0)).unwrap();
    [a, b, c]
}

#[test]
fn results_stay_on_the_accelerator_until_the_host_reads_them() {
    let accel = std::sync::Arc::new(Accel::default());
    let off = Offload::new(accel.clone());
    let x = Tensor::from_vec(vec![4, 6, 5], (0..120).map(|i| ((i * 29) % 17) as f32 / 5.0 - 1.0).collect()).unwrap();
    let [_, bc, cc] = chain(&CpuDevice, &x);
    let [a, b, c] = chain(&off, &x);
    assert_eq!(accel.launches.load(Ordering::Relaxed), 3);
    // Only `x` went over: the view of `a` and `b` were read where they are.
    assert_eq!(off.bytes_moved(), (480, 0));
    let got = off.download(&c).unwrap();
    assert!(!got.on_host(), "downloading hands over the tensor, not its elements");
    assert_eq!(off.bytes_moved(), (480, 0));
    let want = CpuDevice.download(&cc).unwrap();
    assert_eq!(got.shape(), want.shape());
    assert_eq!(bits(&got), bits(&want));
    assert!(got.on_host());
    assert_eq!(off.bytes_moved(), (480, 6 * 4 * 4), "`c` came back once");
    assert_eq!(bits(&got), bits(&want));
    assert_eq!(off.bytes_moved(), (480, 96), "and only once");
    // Reshapes and flat views of a resident tensor stay there.
    let bt = off.download(&b).unwrap();
    let dev: std::sync::Arc<dyn Device> = accel.clone();
    let flat = bt.with_shape(vec![120]).unwrap();
    let part = flat.view(30, vec![3, 10]).unwrap();
    assert!(flat.resident_on(&dev).is_some() && part.resident_on(&dev).is_some());
    assert_eq!(bits(&part), bits(&CpuDevice.download(&bc).unwrap().view(30, vec![3, 10]).unwrap()));
    assert_eq!(off.bytes_moved(), (480, 96 + 480), "a view brings its whole buffer back");
    assert_eq!(bits(&bt), bits(&CpuDevice.download(&bc).unwrap()));
    assert_eq!(off.bytes_moved(), (480, 96 + 480), "once, for every view of it");
    // A kernel only the CPU has reads `a` there; its result is the CPU's.
    let before = off.bytes_moved();
    let e = off.launch(KernelId::Unary(UnaryOp::Exp), &[&a], &KernelParams::new()).unwrap();
    assert_eq!(off.bytes_moved(), (before.0, before.1 + 480));
    assert!(off.download(&e).unwrap().on_host());
    // A tensor the host wrote is the host's: writing in place brings it over first.
    let mut w = off.download(&off.launch(KernelId::Softmax, &[&b], &KernelParams::new().axis(0)).unwrap()).unwrap();
    w.storage_mut();
    assert!(w.on_host() && w.resident_on(&dev).is_none());
}

/// A device whose copies back to the host fail.
struct Broken;

impl Device for Broken {
    fn name(&self) -> &str {
        "broken"
    }
    fn runs(&self, _: KernelId, _: &[&kernels::DeviceTensor], _: &KernelParams) -> bool {
        false
    }
    fn alloc(&self, dtype: DType, len: usize) -> Result<kernels::DeviceTensor, kernels::KernelError> {
        CpuDevice.alloc(dtype, len)
    }
    fn upload(&self, t: &Tensor) -> Result<kernels::DeviceTensor, kernels::KernelError> {
        CpuDevice.upload(t)
    }
    fn download(&self, _: &kernels::DeviceTensor) -> Result<Tensor, kernels::KernelError> {
        Err(kernels::KernelError::Invalid("an illegal memory access was encountered".into()))
    }
    fn launch_on(
        &self,
        _: kernels::Stream,
        k: KernelId,
        _: &[&kernels::DeviceTensor],
        _: &KernelParams,
    ) -> Result<kernels::DeviceTensor, kernels::KernelError> {
        Err(kernels::KernelError::Invalid(format!("broken: no {k:?}")))
    }
    fn copy_into(
        &self,
        _: kernels::Stream,
        _: &kernels::DeviceTensor,
        _: &mut kernels::DeviceTensor,
    ) -> Result<(), kernels::KernelError> {
        Err(kernels::KernelError::Invalid("broken: no copies".into()))
    }
    fn new_stream(&self) -> Result<kernels::Stream, kernels::KernelError> {
        Ok(kernels::Stream::DEFAULT)
    }
    fn synchronize_stream(&self, _: kernels::Stream) -> Result<(), kernels::KernelError> {
        Ok(())
    }
    fn synchronize(&self) -> Result<(), kernels::KernelError> {
        Ok(())
    }
    fn memory(&self) -> kernels::MemoryStats {
        CpuDevice.memory()
    }
}

/// Reading a tensor cannot return an error: when its device cannot hand it back, the read
/// panics with `DeviceLost` and the device's message (which `msl` reports, exit 2). Its shape,
/// element type and length are known without a copy.
#[test]
fn a_device_that_cannot_hand_a_tensor_back_is_named_in_the_panic() {
    let x = Tensor::from_vec(vec![2, 3], vec![1.0f32; 6]).unwrap();
    let t = Tensor::resident(std::sync::Arc::new(Broken), CpuDevice.upload(&x).unwrap(), None).unwrap();
    assert_eq!((t.shape(), t.dtype(), t.len()), (&[2, 3][..], DType::F32, 6));
    let prev = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| t.to_f64_vec()));
    std::panic::set_hook(prev);
    let payload = r.expect_err("the read cannot succeed");
    let lost = payload.downcast_ref::<kernels::DeviceLost>().expect("a DeviceLost payload");
    assert!(lost.0.contains("broken") && lost.0.contains("illegal memory access"), "{}", lost.0);
}
