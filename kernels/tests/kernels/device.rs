//! The CPU device runs kernels through the device trait with the same results as `ops`.

use kernels::ops::{self, BinaryOp, ReduceOp, SliceSpec, UnaryOp};
use kernels::{CpuDevice, DType, Device, KernelId, KernelParams};

use crate::{lcg, t32, ti};

#[test]
fn kernels_through_the_trait_equal_direct_calls() {
    let dev: Box<dyn Device> = Box::new(CpuDevice);
    assert_eq!(dev.name(), "cpu");
    let a = t32(&[4, 3], &lcg(12, 1).iter().map(|&x| x as f32).collect::<Vec<_>>());
    let b = t32(&[3, 5], &lcg(15, 2).iter().map(|&x| x as f32).collect::<Vec<_>>());
    let (da, db) = (dev.upload(&a).unwrap(), dev.upload(&b).unwrap());
    assert_eq!(da.shape(), &[4, 3]);
    assert_eq!(da.dtype(), DType::F32);
    let run = |k: KernelId, inputs: &[&kernels::DeviceTensor], p: &KernelParams| {
        let out = dev.launch(k, inputs, p).unwrap();
        dev.synchronize().unwrap();
        dev.download(&out).unwrap()
    };
    let none = KernelParams::new();
    assert_eq!(run(KernelId::Matmul, &[&da, &db], &none), ops::matmul(&a, &b).unwrap());
    assert_eq!(run(KernelId::Unary(UnaryOp::Tanh), &[&da], &none), ops::unary(UnaryOp::Tanh, &a).unwrap());
    let bias = t32(&[3], &[1.0, 2.0, 3.0]);
    let dbias = dev.upload(&bias).unwrap();
    assert_eq!(
        run(KernelId::Binary(BinaryOp::Add), &[&da, &dbias], &none),
        ops::binary(BinaryOp::Add, &a, &bias).unwrap()
    );
    let p = KernelParams::new().axis(0).keepdims(true);
    assert_eq!(
        run(KernelId::Reduce(ReduceOp::Sum), &[&da], &p),
        ops::reduce(ReduceOp::Sum, &a, Some(0), true).unwrap()
    );
    assert_eq!(run(KernelId::Softmax, &[&da], &KernelParams::new().axis(1)), ops::softmax(&a, 1).unwrap());
    let idx = ti(&[2], &[3, 1]);
    let didx = dev.upload(&idx).unwrap();
    assert_eq!(run(KernelId::Gather, &[&da, &didx], &KernelParams::new().axis(0)), ops::gather(&a, &idx, 0).unwrap());
    let specs = [SliceSpec::Range { start: 1, end: 3 }];
    assert_eq!(run(KernelId::Slice, &[&da], &KernelParams::new().slices(&specs)), ops::slice(&a, &specs).unwrap());
    assert_eq!(
        run(KernelId::Einsum, &[&da, &db], &KernelParams::new().spec("ij,jk->ik")),
        ops::matmul(&a, &b).unwrap()
    );
    assert_eq!(run(KernelId::Cast, &[&da], &KernelParams::new().dtype(DType::F64)), a.cast(DType::F64));
    let z = dev.alloc(DType::I32, 3).unwrap();
    assert_eq!(dev.download(&z).unwrap(), ops::zeros(DType::I32, &[3]).unwrap());
}

#[test]
fn launch_checks_arity_and_parameters() {
    let dev = CpuDevice;
    let a = dev.upload(&t32(&[2], &[1.0, 2.0])).unwrap();
    assert!(dev.launch(KernelId::Matmul, &[&a], &KernelParams::new()).is_err());
    assert!(dev.launch(KernelId::Softmax, &[&a], &KernelParams::new()).is_err());
    // A buffer that some other device made is refused, not misread.
    let foreign = kernels::DeviceTensor::new(vec![2], DType::F32, std::sync::Arc::new(5u8));
    assert!(dev.download(&foreign).is_err());
}
