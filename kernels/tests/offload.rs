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
    let _ = off.launch(KernelId::Reduce(ReduceOp::Sum), &[&f], &KernelParams::new().axis(1)).unwrap();
    assert_eq!(off.bytes_moved(), (before.0 + 24, before.1 + 8), "six f32s there, two back");
}
