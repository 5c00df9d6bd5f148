//! The CUDA device against the CPU device, kernel by kernel: upload, launch, download, compare
//! (f32 to 1e-5 relative, the contract's bound; arg-max/min exactly). On a machine without a
//! CUDA driver or GPU, `CudaDevice::new` answers an error (never a panic) and the comparison is
//! skipped with that reason; `scripts/gpu_check.sh` runs this test where a GPU is.

use kernels::cuda::CudaDevice;
use kernels::ops::ReduceOp;
use kernels::{CpuDevice, DType, Device, KernelId, KernelParams, Tensor};

#[test]
fn an_absent_gpu_is_an_error_not_a_panic() {
    match CudaDevice::new(0) {
        Ok(d) => println!("{} is present; the comparison test runs", d.name()),
        Err(e) => assert!(e.to_string().contains("CUDA") || e.to_string().contains("cuda"), "{e}"),
    }
    let far = CudaDevice::new(1 << 20).err().map(|e| e.to_string()).unwrap_or_default();
    assert!(!far.is_empty(), "a GPU numbered 2^20 cannot exist");
}

#[test]
fn the_cuda_device_computes_what_the_cpu_device_computes() {
    let cpu = CpuDevice;
    // The CPU half runs everywhere, so that the comparison a GPU machine makes is known to work.
    let gpu = CudaDevice::new(0);
    if let Err(why) = &gpu {
        println!("skipped on the GPU: {why}");
    }
    let mut checked = 0;
    for dtype in [DType::F32, DType::F64] {
        let n = 3 * 70 * 5;
        let data: Vec<f64> = (0..n).map(|i| ((i * 7919) % 1000) as f64 / 125.0 - 4.0).collect();
        let x = Tensor::from_vec(vec![3, 70, 5], data).unwrap().cast(dtype);
        let xc = cpu.upload(&x).unwrap();
        let xg = gpu.as_ref().ok().map(|g| g.upload(&x).unwrap());
        for axis in 0..3 {
            let p = KernelParams::new().axis(axis);
            let kernels = [
                KernelId::Reduce(ReduceOp::Sum),
                KernelId::Reduce(ReduceOp::Mean),
                KernelId::Reduce(ReduceOp::Max),
                KernelId::Reduce(ReduceOp::Min),
                KernelId::ArgMax,
                KernelId::ArgMin,
                KernelId::Softmax,
                KernelId::LogSoftmax,
                KernelId::Cumsum,
            ];
            for k in kernels {
                let want = cpu.download(&cpu.launch(k, &[&xc], &p).unwrap()).unwrap();
                let (Ok(gpu), Some(xg)) = (&gpu, &xg) else { continue };
                let out = gpu.launch(k, &[xg], &p).unwrap();
                gpu.synchronize().unwrap();
                let got = gpu.download(&out).unwrap();
                assert_eq!(got.shape(), want.shape(), "{k:?} over {axis}");
                for (j, (a, b)) in got.to_f64_vec().iter().zip(want.to_f64_vec()).enumerate() {
                    let tol = if dtype == DType::F32 { 1e-5 * b.abs() + 1e-6 } else { 1e-12 * b.abs() + 1e-13 };
                    assert!((a - b).abs() <= tol, "{k:?} {dtype} over {axis}: element {j}: cuda {a} vs cpu {b}");
                }
                checked += want.len();
            }
        }
        if let (Ok(gpu), Some(xg)) = (&gpu, &xg) {
            let r = gpu.launch(KernelId::Reshape, &[xg], &KernelParams::new().shape(&[210, 5])).unwrap();
            assert_eq!(gpu.download(&r).unwrap().to_f64_vec(), x.to_f64_vec());
        }
    }
    if let Ok(gpu) = &gpu {
        println!("{}: {checked} elements agree with the CPU device", gpu.name());
    }
}
