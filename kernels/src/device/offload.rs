//! A device that runs on an accelerator the kernels it has and every other kernel on the CPU.
//! It is how a program runs whole on a device that has only some kernels (the CUDA device
//! today), and every kernel the accelerator has is exercised on it with the program's own
//! operands, so the results can be compared with the CPU's.
//!
//! A result the accelerator computed stays there ([`Tensor::resident`]): the next kernel the
//! accelerator runs reads it where it is, and it is brought to the host only when the host
//! reads it (a kernel the accelerator lacks, `print`, a file). Host operands are copied to the
//! accelerator for each launch that reads them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::{computed, CpuDevice, Device, DeviceTensor, KernelId, KernelParams, MemoryStats, Stream};
use crate::error::KernelError;
use crate::tensor::DType;

/// The CPU device, with the kernels `accel` runs offloaded to it.
pub struct Offload {
    accel: Arc<dyn Device>,
    /// The CPU side (`Device::host_side`): every launch runs on the CPU, counted with the rest.
    host_only: bool,
    counts: Arc<Counts>,
    /// Bytes brought back to the host (resident tensors count their own downloads into it).
    bytes_down: Arc<AtomicU64>,
}

/// Launches both ways and bytes sent, shared by an `Offload` and its CPU side.
#[derive(Default)]
struct Counts {
    on_accel: AtomicU64,
    on_host: AtomicU64,
    bytes_up: AtomicU64,
}

impl Offload {
    pub fn new(accel: Arc<dyn Device>) -> Offload {
        Offload { accel, host_only: false, counts: Arc::default(), bytes_down: Arc::new(AtomicU64::new(0)) }
    }

    /// Launches so far: (run on the accelerator, run on the CPU).
    pub fn counts(&self) -> (u64, u64) {
        (self.counts.on_accel.load(Ordering::Relaxed), self.counts.on_host.load(Ordering::Relaxed))
    }

    /// Bytes moved so far: (to the accelerator, back to the host).
    pub fn bytes_moved(&self) -> (u64, u64) {
        (self.counts.bytes_up.load(Ordering::Relaxed), self.bytes_down.load(Ordering::Relaxed))
    }

    /// Whether the accelerator runs `kernel` on these inputs (never on the CPU side).
    fn offloaded(&self, kernel: KernelId, inputs: &[&DeviceTensor], params: &KernelParams) -> bool {
        !self.host_only && self.accel.runs(kernel, inputs, params)
    }

    /// An operand (a view) on the accelerator: read where it is when it lives there; else
    /// copied over, as the same view of its whole buffer when the view reads all of it or more
    /// (a permutation, a broadcast), so that the accelerator reads it as the CPU would, and
    /// as the elements it selects otherwise (part of a tensor).
    fn to_accel(&self, d: &DeviceTensor) -> Result<DeviceTensor, KernelError> {
        let base = d.buffer::<crate::Tensor>();
        if let Some(v) = base.and_then(|t| t.resident_on(&self.accel)).and_then(|on| on.restrided(d)) {
            return Ok(v);
        }
        if let Some(t) = base.filter(|t| d.len() >= t.len()) {
            let whole = self.accel.upload(t)?;
            if let Some(v) = whole.restrided(d) {
                self.counts.bytes_up.fetch_add(t.nbytes() as u64, Ordering::Relaxed);
                return Ok(v);
            }
        }
        self.counts.bytes_up.fetch_add(d.nbytes() as u64, Ordering::Relaxed);
        CpuDevice.download(d).and_then(|t| self.accel.upload(&t))
    }

    fn count(&self, on_accel: bool) {
        let n = if on_accel { &self.counts.on_accel } else { &self.counts.on_host };
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

    fn host_side(self: Arc<Self>) -> Arc<dyn Device> {
        Arc::new(Offload {
            accel: self.accel.clone(),
            host_only: true,
            counts: self.counts.clone(),
            bytes_down: self.bytes_down.clone(),
        })
    }

    fn place(&self, t: &crate::Tensor) -> Result<crate::Tensor, KernelError> {
        if self.host_only || t.resident_on(&self.accel).is_some() {
            return Ok(t.clone());
        }
        let on = self.accel.upload(t)?;
        self.counts.bytes_up.fetch_add(t.nbytes() as u64, Ordering::Relaxed);
        t.mirrored(self.accel.clone(), on, Some(self.bytes_down.clone()))
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
        let moved = inputs.iter().map(|d| self.to_accel(d)).collect::<Result<Vec<_>, _>>()?;
        let refs: Vec<&DeviceTensor> = moved.iter().collect();
        let out = self.accel.launch(kernel, &refs, params)?;
        // The result stays on the accelerator (a view of its own buffer is brought back now).
        let t = if out.is_row_major() {
            crate::Tensor::resident(self.accel.clone(), out, Some(self.bytes_down.clone()))?
        } else {
            self.bytes_down.fetch_add(out.nbytes() as u64, Ordering::Relaxed);
            self.accel.download(&out)?
        };
        CpuDevice.upload(&t)
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
            let r = computed(self, stream, kernel, inputs, params, out)?;
            if kernel != KernelId::Update {
                return self.copy_into(stream, &r, out);
            }
            // The tensor written into stays on the accelerator: the updated copy made there
            // takes the caller's handle (a holder of the old one keeps the old elements, as a
            // tensor that is shared is never written in place).
            *out = r;
            Ok(())
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
