//! A fake accelerator for tests of `Offload`: it keeps its tensors in a buffer type of its own,
//! so an operand handed to the wrong device is an error rather than a silent success, and runs
//! reductions (sum, mean, max, min), softmax, log-softmax and cumsum of f32 and f64, and the
//! JIT's fused trees (`KernelId::Fused`), with the CPU device's code; made with
//! [`Accel::everything`], it runs every kernel (as a device that holds a whole program would),
//! and with [`Accel::cuda_like`] the kernels the CUDA device runs.

use kernels::ops::ReduceOp;
use kernels::{
    CpuDevice, DType, Device, DeviceTensor, KernelError, KernelId, KernelParams, MemoryStats, Stream, Tensor,
};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// A host tensor that belongs to the fake accelerator.
struct Owned(Tensor);

/// The fake accelerator; `launches` counts the kernels it ran.
#[derive(Default)]
pub struct Accel {
    pub launches: AtomicU64,
    runs: Runs,
}

/// Which kernels the fake runs.
#[derive(Default)]
enum Runs {
    /// Reductions, softmax, cumsum and fused trees of floats.
    #[default]
    Some,
    Everything,
    /// Those the CUDA device runs (`kernels::cuda::runs`, with cuBLAS).
    CudaLike,
}

impl Accel {
    /// The accelerator that runs every kernel.
    #[allow(dead_code)]
    pub fn everything() -> Accel {
        Accel { launches: AtomicU64::new(0), runs: Runs::Everything }
    }

    /// The accelerator that runs the kernels the CUDA device runs (with the CPU's code).
    #[allow(dead_code)]
    pub fn cuda_like() -> Accel {
        Accel { launches: AtomicU64::new(0), runs: Runs::CudaLike }
    }
}

fn own(d: &DeviceTensor) -> Result<DeviceTensor, KernelError> {
    let t = d.buffer::<Owned>().ok_or_else(|| KernelError::Invalid("accel: not an accelerator tensor".into()))?;
    // The view `d` is (a device reads its operands through their strides).
    let base = CpuDevice.upload(&t.0)?;
    base.restrided(d).ok_or_else(|| KernelError::Invalid("accel: a view outside its buffer".into()))
}

fn mine(d: DeviceTensor) -> Result<DeviceTensor, KernelError> {
    let t = CpuDevice.download(&d)?;
    Ok(DeviceTensor::new(t.shape().to_vec(), t.dtype(), Arc::new(Owned(t))))
}

impl Device for Accel {
    fn name(&self) -> &str {
        "accel"
    }
    fn runs(&self, kernel: KernelId, inputs: &[&DeviceTensor], params: &KernelParams) -> bool {
        let float = inputs.iter().all(|d| matches!(d.dtype(), DType::F32 | DType::F64));
        match self.runs {
            Runs::Everything => return true,
            Runs::CudaLike => return kernels::cuda::runs(kernel, inputs, params, true),
            Runs::Some => {}
        }
        float
            && matches!(
                kernel,
                KernelId::Reduce(ReduceOp::Sum | ReduceOp::Mean | ReduceOp::Max | ReduceOp::Min)
                    | KernelId::Softmax
                    | KernelId::LogSoftmax
                    | KernelId::Cumsum
                    | KernelId::Fused
            )
    }
    fn alloc(&self, dtype: DType, len: usize) -> Result<DeviceTensor, KernelError> {
        mine(CpuDevice.alloc(dtype, len)?)
    }
    fn upload(&self, t: &Tensor) -> Result<DeviceTensor, KernelError> {
        Ok(DeviceTensor::new(t.shape().to_vec(), t.dtype(), Arc::new(Owned(t.clone()))))
    }
    fn download(&self, d: &DeviceTensor) -> Result<Tensor, KernelError> {
        CpuDevice.download(&own(d)?)
    }
    fn launch_on(
        &self,
        stream: Stream,
        kernel: KernelId,
        inputs: &[&DeviceTensor],
        params: &KernelParams,
    ) -> Result<DeviceTensor, KernelError> {
        if !self.runs(kernel, inputs, params) {
            return Err(KernelError::Invalid(format!("accel: no kernel {kernel:?}")));
        }
        self.launches.fetch_add(1, Ordering::Relaxed);
        let host = inputs.iter().map(|d| own(d)).collect::<Result<Vec<_>, _>>()?;
        let refs: Vec<&DeviceTensor> = host.iter().collect();
        mine(CpuDevice.launch_on(stream, kernel, &refs, params)?)
    }
    fn copy_into(&self, _: Stream, _: &DeviceTensor, _: &mut DeviceTensor) -> Result<(), KernelError> {
        Err(KernelError::Invalid("accel: no copies".into()))
    }
    fn new_stream(&self) -> Result<Stream, KernelError> {
        Ok(Stream::DEFAULT)
    }
    fn synchronize_stream(&self, _: Stream) -> Result<(), KernelError> {
        Ok(())
    }
    fn synchronize(&self) -> Result<(), KernelError> {
        Ok(())
    }
    fn memory(&self) -> MemoryStats {
        CpuDevice.memory()
    }
}
