//! The CUDA device against the CPU device, kernel by kernel: upload, launch, download, compare
//! (f32 to 1e-5 relative, the contract's bound; arg-max/min exactly). On a machine without a
//! CUDA driver or GPU, `CudaDevice::new` answers an error (never a panic) and the comparison is
//! skipped with that reason; `scripts/gpu_check.sh` runs this test where a GPU is.

use kernels::cuda::CudaDevice;
use kernels::ops::{BinaryOp, ReduceOp, UnaryOp};
use kernels::rng::Region;
use kernels::{CpuDevice, DType, Device, DeviceTensor, KernelId, KernelParams, Tensor};

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

fn t(shape: &[usize], dtype: DType, seed: usize) -> Tensor {
    let n: usize = shape.iter().product();
    let data: Vec<f64> = (0..n).map(|i| ((i * 7919 + seed * 104_729) % 1000) as f64 / 250.0 - 2.0).collect();
    Tensor::from_vec(shape.to_vec(), data).unwrap().cast(dtype)
}

/// One launch: the kernel, its inputs (each optionally read through a permutation, a view) and
/// its parameters.
struct Case {
    kernel: KernelId,
    inputs: Vec<(Tensor, Option<Vec<usize>>)>,
    params: KernelParams,
}

fn cases(dtype: DType) -> Vec<Case> {
    let plain = |x: Tensor| (x, None);
    let c = |kernel, inputs, params| Case { kernel, inputs, params };
    let p = KernelParams::new;
    let idx = Tensor::from_vec(vec![2, 3], vec![4i32, 0, 2, 2, 1, 3]).unwrap();
    let cond = t(&[4, 1], dtype, 9).try_cast(DType::Bool).unwrap();
    let region = Region { shape: vec![6, 8], start: vec![3, 4], len: vec![3, 4] };
    vec![
        c(KernelId::Unary(UnaryOp::Tanh), vec![(t(&[3, 4, 5], dtype, 1), Some(vec![2, 0, 1]))], p()),
        c(KernelId::Unary(UnaryOp::Gelu), vec![plain(t(&[1000], dtype, 2))], p()),
        c(KernelId::Binary(BinaryOp::Add), vec![plain(t(&[4, 5], dtype, 3)), plain(t(&[5], dtype, 4))], p()),
        c(KernelId::Binary(BinaryOp::Rem), vec![plain(t(&[4, 1], dtype, 5)), plain(t(&[1, 5], dtype, 6))], p()),
        c(
            KernelId::Binary(BinaryOp::Lt),
            vec![(t(&[5, 4], dtype, 7), Some(vec![1, 0])), plain(t(&[4, 5], dtype, 8))],
            p(),
        ),
        c(KernelId::Where, vec![plain(cond), plain(t(&[4, 5], dtype, 10)), plain(t(&[5], dtype, 11))], p()),
        c(KernelId::Cast, vec![plain(t(&[7], dtype, 12))], p().dtype(DType::Bool)),
        c(
            KernelId::Cast,
            vec![plain(t(&[7], dtype, 13))],
            p().dtype(if dtype == DType::F32 { DType::F64 } else { DType::F32 }),
        ),
        c(KernelId::Contiguous, vec![(t(&[3, 4, 5], dtype, 14), Some(vec![1, 2, 0]))], p()),
        c(KernelId::Matmul, vec![plain(t(&[33, 17], dtype, 15)), plain(t(&[17, 9], dtype, 16))], p()),
        c(KernelId::Matmul, vec![plain(t(&[2, 3, 17], dtype, 17)), plain(t(&[17], dtype, 18))], p()),
        c(KernelId::Matmul, vec![plain(t(&[2, 5, 6], dtype, 19)), plain(t(&[6, 4], dtype, 20))], p()),
        c(
            KernelId::MatmulT { transpose_a: true, transpose_b: false },
            vec![plain(t(&[3, 6, 5], dtype, 21)), plain(t(&[3, 6, 4], dtype, 22))],
            p(),
        ),
        c(
            KernelId::MatmulT { transpose_a: false, transpose_b: true },
            vec![plain(t(&[5, 6], dtype, 23)), plain(t(&[4, 6], dtype, 24))],
            p(),
        ),
        // A transposed view as a product's operand is made contiguous first.
        c(KernelId::Matmul, vec![(t(&[6, 5], dtype, 25), Some(vec![1, 0])), plain(t(&[6, 4], dtype, 26))], p()),
        c(KernelId::Gather, vec![plain(t(&[3, 5, 2], dtype, 27)), plain(idx)], p().axis(1)),
        c(
            KernelId::Concat,
            vec![plain(t(&[2, 3], dtype, 31)), (t(&[3, 4], dtype, 32), Some(vec![1, 0])), plain(t(&[1, 3], dtype, 33))],
            p().axis(0),
        ),
        c(KernelId::Transpose, vec![(t(&[3, 4, 5], dtype, 34), Some(vec![0, 2, 1]))], p()),
        c(KernelId::Permute, vec![plain(t(&[3, 4, 5], dtype, 35))], p().perm(&[1, 2, 0])),
        c(KernelId::BroadcastTo, vec![plain(t(&[4, 1], dtype, 36))], p().shape(&[2, 4, 3])),
        c(KernelId::SumToShape, vec![plain(t(&[2, 4, 3], dtype, 37))], p().shape(&[4, 1])),
        c(KernelId::SumToShape, vec![(t(&[5, 3], dtype, 38), Some(vec![1, 0]))], p().shape(&[5])),
        c(
            KernelId::OneHot,
            vec![plain(Tensor::from_vec(vec![2, 3], vec![4i32, 0, 2, 2, 1, 3]).unwrap())],
            p().n(5).dtype(dtype),
        ),
        c(
            KernelId::Cast,
            vec![(Tensor::from_vec(vec![2, 3], vec![7i32, -3, 0, 1 << 30, 5, -1]).unwrap(), Some(vec![1, 0]))],
            p().dtype(dtype),
        ),
        c(
            KernelId::Update,
            vec![plain(t(&[2, 6, 3], dtype, 42)), (t(&[3, 2, 2], dtype, 43), Some(vec![1, 2, 0]))],
            p().axis(1).ints(&[4]),
        ),
        // Of every element (no axis).
        c(KernelId::Reduce(ReduceOp::Mean), vec![plain(t(&[3, 4], dtype, 39))], p()),
        c(KernelId::Reduce(ReduceOp::Max), vec![(t(&[3, 4], dtype, 40), Some(vec![1, 0]))], p().keepdims(true)),
        c(KernelId::ArgMin, vec![plain(t(&[2, 3, 4], dtype, 41))], p()),
        c(
            KernelId::Attention,
            vec![plain(t(&[2, 70, 8], dtype, 28)), plain(t(&[2, 70, 8], dtype, 29)), plain(t(&[2, 70, 3], dtype, 30))],
            p().ints(&[70]).flag(true),
        ),
        c(KernelId::Uniform, vec![], p().dtype(dtype).region(region.clone()).key([7, 9]).value(-0.5).scale(1.5)),
        c(KernelId::Normal, vec![], p().dtype(dtype).region(region).key([7, 9]).value(0.25).scale(2.0)),
    ]
}

/// The storage-only types on the device: computed in f32 and rounded as on the CPU.
fn half_cases(dtype: DType) -> Vec<Case> {
    let plain = |x: Tensor| (x, None);
    let c = |kernel, inputs, params| Case { kernel, inputs, params };
    let p = KernelParams::new;
    let cond = t(&[4, 1], DType::F32, 9).try_cast(DType::Bool).unwrap();
    vec![
        c(KernelId::Unary(UnaryOp::Exp), vec![(t(&[3, 4, 5], dtype, 1), Some(vec![2, 0, 1]))], p()),
        c(KernelId::Binary(BinaryOp::Add), vec![plain(t(&[4, 5], dtype, 3)), plain(t(&[5], dtype, 4))], p()),
        c(KernelId::Binary(BinaryOp::Ge), vec![plain(t(&[4, 5], dtype, 5)), plain(t(&[5], dtype, 6))], p()),
        c(KernelId::Where, vec![plain(cond), plain(t(&[4, 5], dtype, 10)), plain(t(&[5], dtype, 11))], p()),
        c(KernelId::Cast, vec![plain(t(&[9], DType::F32, 12))], p().dtype(dtype)),
        c(KernelId::Cast, vec![plain(t(&[9], dtype, 13))], p().dtype(DType::F32)),
        c(KernelId::Matmul, vec![plain(t(&[2, 33, 17], dtype, 15)), plain(t(&[17, 9], dtype, 16))], p()),
    ]
}

/// `x` on `dev`, read through `perm` when given.
fn placed(dev: &dyn Device, x: &Tensor, perm: &Option<Vec<usize>>) -> DeviceTensor {
    let d = dev.upload(x).unwrap();
    match perm {
        Some(p) => d.permuted(p).unwrap(),
        None => d,
    }
}

#[test]
fn elementwise_products_gathers_attention_and_draws_match_the_cpu_device() {
    let gpu = CudaDevice::new(0);
    if let Err(why) = &gpu {
        println!("skipped on the GPU: {why}");
    }
    let mut checked = 0;
    let all = [DType::F32, DType::F64].into_iter().flat_map(|d| cases(d).into_iter().map(move |c| (d, c)));
    let halves = [DType::Bf16, DType::F16].into_iter().flat_map(|d| half_cases(d).into_iter().map(move |c| (d, c)));
    for (dtype, case) in all.chain(halves) {
        {
            let on = |dev: &dyn Device| -> Vec<DeviceTensor> {
                case.inputs.iter().map(|(x, perm)| placed(dev, x, perm)).collect()
            };
            let cpu_in = on(&CpuDevice);
            let refs: Vec<&DeviceTensor> = cpu_in.iter().collect();
            let want = CpuDevice.download(&CpuDevice.launch(case.kernel, &refs, &case.params).unwrap()).unwrap();
            let Ok(gpu) = &gpu else { continue };
            let gpu_in = on(gpu);
            let refs: Vec<&DeviceTensor> = gpu_in.iter().collect();
            assert!(gpu.runs(case.kernel, &refs, &case.params), "{:?} {dtype} runs on the GPU", case.kernel);
            let got = gpu.download(&gpu.launch(case.kernel, &refs, &case.params).unwrap()).unwrap();
            assert_eq!((got.shape(), got.dtype()), (want.shape(), want.dtype()), "{:?} {dtype}", case.kernel);
            for (j, (a, b)) in got.to_f64_vec().iter().zip(want.to_f64_vec()).enumerate() {
                let tol = match dtype {
                    DType::F64 => 1e-12 * b.abs() + 1e-13,
                    // One unit in the last place: an f32 sum in another order may round the other way.
                    DType::Bf16 => b.abs() / 128.0,
                    DType::F16 => b.abs() / 1024.0 + 6e-5,
                    _ => 1e-5 * b.abs() + 1e-6,
                };
                assert!(
                    (a - b).abs() <= tol || a.is_nan() && b.is_nan(),
                    "{:?} {dtype}: element {j}: cuda {a} vs cpu {b}",
                    case.kernel
                );
            }
            checked += want.len();
        }
    }
    if let Ok(gpu) = &gpu {
        println!(
            "{}: {checked} elements of elementwise, product, gather, attention and draw kernels agree",
            gpu.name()
        );
    }
}

#[test]
fn an_index_out_of_range_is_the_cpus_error() {
    let Ok(gpu) = CudaDevice::new(0) else {
        println!("skipped: no GPU");
        return;
    };
    let x = gpu.upload(&t(&[3, 4], DType::F32, 1)).unwrap();
    let idx = gpu.upload(&Tensor::from_vec(vec![2], vec![1i32, 4]).unwrap()).unwrap();
    let err = gpu.launch(KernelId::Gather, &[&x, &idx], &KernelParams::new().axis(1)).unwrap_err();
    let cpu = CpuDevice.launch(
        KernelId::Gather,
        &[
            &CpuDevice.upload(&t(&[3, 4], DType::F32, 1)).unwrap(),
            &CpuDevice.upload(&Tensor::from_vec(vec![2], vec![1i32, 4]).unwrap()).unwrap(),
        ],
        &KernelParams::new().axis(1),
    );
    assert_eq!(err.to_string(), cpu.unwrap_err().to_string());
    // A label past the classes of a one-hot encoding too.
    let labels = Tensor::from_vec(vec![3], vec![0i32, 5, 1]).unwrap();
    let p = KernelParams::new().n(5).dtype(DType::F32);
    let err = gpu.launch(KernelId::OneHot, &[&gpu.upload(&labels).unwrap()], &p).unwrap_err();
    let cpu = CpuDevice.launch(KernelId::OneHot, &[&CpuDevice.upload(&labels).unwrap()], &p);
    assert_eq!(err.to_string(), cpu.unwrap_err().to_string());
}

#[test]
fn freed_memory_stays_in_the_pool_for_the_next_allocations() {
    let Ok(gpu) = CudaDevice::new(0) else {
        println!("skipped: no GPU");
        return;
    };
    let n = 16 << 20;
    let t = gpu.alloc(DType::F32, n).unwrap();
    drop(t);
    gpu.synchronize().unwrap();
    let cached = gpu.memory().cached_bytes;
    assert!(cached >= 4 * n, "{cached} bytes cached after freeing {} and synchronizing", 4 * n);
    // The next allocation of that size is served from the cache.
    let again = gpu.alloc(DType::F32, n).unwrap();
    assert!(gpu.memory().cached_bytes < cached);
    drop(again);
}
