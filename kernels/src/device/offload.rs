//! A device that runs on an accelerator the kernels it has and every other kernel on the CPU:
//! values live on the host, and each offloaded launch moves its operands to the accelerator and
//! its result back. It is how a program runs whole on a device that has only some kernels (the
//! CUDA device today): slow, since every such kernel pays two transfers, but every kernel the
//! accelerator has is exercised on it with the program's own operands, and the results can be
//! compared with the CPU's.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::{computed_into, CpuDevice, Device, DeviceTensor, KernelId, KernelParams, MemoryStats, Stream};
use crate::error::KernelError;
use crate::tensor::DType;

/// The CPU device, with the kernels `accel` runs offloaded to it.
pub struct Offload {
    accel: Arc<dyn Device>,
    on_accel: AtomicU64,
    on_host: AtomicU64,
    /// Bytes moved to the accelerator and back.
    bytes_up: AtomicU64,
    bytes_down: AtomicU64,
}

impl Offload {
    pub fn new(accel: Arc<dyn Device>) -> Offload {
        Offload {
            accel,
            on_accel: AtomicU64::new(0),
            on_host: AtomicU64::new(0),
            bytes_up: AtomicU64::new(0),
            bytes_down: AtomicU64::new(0),
        }
    }

    /// Launches so far: (run on the accelerator, run on the CPU).
    pub fn counts(&self) -> (u64, u64) {
        (self.on_accel.load(Ordering::Relaxed), self.on_host.load(Ordering::Relaxed))
    }

    /// Bytes moved so far: (to the accelerator, back to the host).
    pub fn bytes_moved(&self) -> (u64, u64) {
        (self.bytes_up.load(Ordering::Relaxed), self.bytes_down.load(Ordering::Relaxed))
    }

    /// Whether the accelerator runs `kernel` on these inputs.
    fn offloaded(&self, kernel: KernelId, inputs: &[&DeviceTensor], params: &KernelParams) -> bool {
        self.accel.runs(kernel, inputs, params)
    }

    fn count(&self, on_accel: bool) {
        let n = if on_accel { &self.on_accel } else { &self.on_host };
        n.fetch_add(1, Ordering::Relaxed);
    }
}

impl Device for Offload {
    fn name(&self) -> &str {
        self.accel.name()
    }

    fn runs(&self, _: KernelId, _: &[&DeviceTensor], _: &KernelParams) -> bool {
        true
    }

    fn accelerates(&self, kernel: KernelId, inputs: &[&DeviceTensor], params: &KernelParams) -> bool {
        self.offloaded(kernel, inputs, params)
    }

    fn alloc(&self, dtype: DType, len: usize) -> Result<DeviceTensor, KernelError> {
        CpuDevice.alloc(dtype, len)
    }

    fn upload(&self, t: &crate::Tensor) -> Result<DeviceTensor, KernelError> {
        CpuDevice.upload(t)
    }

    fn download(&self, d: &DeviceTensor) -> Result<crate::Tensor, KernelError> {
        CpuDevice.download(d)
    }

    fn launch_on(
        &self,
        stream: Stream,
        kernel: KernelId,
        inputs: &[&DeviceTensor],
        params: &KernelParams,
    ) -> Result<DeviceTensor, KernelError> {
        let here = self.offloaded(kernel, inputs, params);
        self.count(here);
        if !here {
            return CpuDevice.launch_on(stream, kernel, inputs, params);
        }
        // Each operand (a view: what it selects) to the accelerator, the result back.
        let bytes = |d: &DeviceTensor| (d.len() * d.dtype().size_in_bytes()) as u64;
        let moved = inputs
            .iter()
            .map(|d| {
                self.bytes_up.fetch_add(bytes(d), Ordering::Relaxed);
                CpuDevice.download(d).and_then(|t| self.accel.upload(&t))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let refs: Vec<&DeviceTensor> = moved.iter().collect();
        let out = self.accel.launch(kernel, &refs, params)?;
        self.bytes_down.fetch_add(bytes(&out), Ordering::Relaxed);
        CpuDevice.upload(&self.accel.download(&out)?)
    }

    fn launch_into(
        &self,
        stream: Stream,
        kernel: KernelId,
        inputs: &[&DeviceTensor],
        params: &KernelParams,
        out: &mut DeviceTensor,
    ) -> Result<(), KernelError> {
        if self.offloaded(kernel, inputs, params) {
            computed_into(self, stream, kernel, inputs, params, out)
        } else {
            // In place where the CPU writes so (`update` into a cache nothing else holds).
            self.count(false);
            CpuDevice.launch_into(stream, kernel, inputs, params, out)
        }
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
        self.accel.synchronize()
    }

    fn memory(&self) -> MemoryStats {
        CpuDevice.memory()
    }
}
