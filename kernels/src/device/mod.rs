//! The device trait: what msl needs from a place that stores tensors and runs kernels.
//!
//! The trait assumes nothing about the host. A device owns its buffers behind an opaque
//! handle ([`DeviceTensor`]: shape, strides and offset, so that views cost nothing on any
//! device), kernels are named by a closed enum ([`KernelId`]) with their arguments in
//! [`KernelParams`], launches go to [`Stream`]s into outputs the device allocates or the caller
//! provides, and data moves only through `upload` and `download`. [`CpuDevice`] implements
//! every kernel id by calling the `ops` functions, so `ops` is the reference that later devices
//! (CUDA, NPU) are tested against; the interpreter runs every primitive that has a kernel id
//! through whichever device it is given.

mod cpu;
mod offload;
mod resident;
mod view;

pub use cpu::CpuDevice;
pub use offload::Offload;
pub use resident::DeviceLost;
pub(crate) use resident::Resident;
pub use view::{gather_host, row_major, DeviceTensor};

use std::sync::Arc;

use crate::cpu::elementwise::{BinaryOp, UnaryOp};
use crate::cpu::index::SliceSpec;
use crate::cpu::reduce::ReduceOp;
use crate::error::KernelError;
use crate::rng::Region;
use crate::tensor::{DType, Tensor};

/// Names each kernel a device can run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KernelId {
    Unary(UnaryOp),
    Binary(BinaryOp),
    /// Inputs: condition, then the two branches.
    Where,
    /// A fused elementwise tree (`fused`) of its inputs, broadcast to one shape (views read
    /// through their strides).
    Fused,
    /// Uses `axis` and `keepdims`.
    Reduce(ReduceOp),
    ArgMax,
    ArgMin,
    LogSumExp,
    /// Uses `axis` (required).
    Softmax,
    LogSoftmax,
    Cumsum,
    Matmul,
    /// `op(a) @ op(b)` with the last two axes of `a` and/or `b` swapped.
    MatmulT {
        transpose_a: bool,
        transpose_b: bool,
    },
    /// Uses `dtype`.
    Cast,
    /// Uses `shape`.
    Reshape,
    Transpose,
    /// Uses `perm`.
    Permute,
    /// Any number of inputs; uses `axis`.
    Concat,
    Stack,
    ExpandDims,
    /// Uses `axis` (`None` removes every size-1 axis).
    Squeeze,
    BroadcastTo,
    SumToShape,
    /// Uses `slices`.
    Slice,
    /// Uses `shape` (the base shape) and `slices`.
    SliceUpdateAdd,
    /// Inputs: data, indices; uses `axis`.
    Gather,
    /// Inputs: indices, updates; uses `shape` (the data shape) and `axis`.
    ScatterAdd,
    /// Uses `n` and `dtype`.
    OneHot,
    /// Any number of inputs; uses `spec`.
    Einsum,
    /// A view made contiguous.
    Contiguous,
    /// Inputs: images `[N, C, H, W]`, weights `[O, C, KH, KW]`; uses `ints` = [stride, padding].
    Conv2d,
    /// Inputs: the output's gradient, weights; uses `shape` (the images' height and width)
    /// and `ints`.
    Conv2dInputGrad,
    /// Inputs: images, the output's gradient; uses `shape` (the kernel's height and width)
    /// and `ints`.
    Conv2dWeightGrad,
    /// Inputs: images, and optionally values taken where each window's maximum is; uses
    /// `ints` = [window, stride].
    MaxPool2d,
    /// Inputs: images, the output's gradient; uses `ints`.
    MaxPool2dGrad,
    /// Uses `ints` = [window, stride].
    AvgPool2d,
    /// Input: the output's gradient; uses `shape` (the images' height and width) and `ints`.
    AvgPool2dGrad,
    /// Inputs: queries, keys, values; uses `ints[0]` (how many key positions are filled) and
    /// `flag` (causal).
    Attention,
    /// Inputs: queries, keys; uses `ints[0]` and `flag`, as `Attention`.
    AttentionWeights,
    /// Uses `axis`, `flag` (descending) and `shape` (`[k]`: keep the first k; empty: all).
    Argsort,
    /// Inputs: data, indices; uses `axis`.
    TakeAlong,
    /// Inputs: indices, updates; uses `shape` (the data shape) and `axis`.
    ScatterAddAlong,
    /// No inputs; uses `dtype`, `shape` and `value`.
    Fill,
    /// No inputs: `0, 1, …, n - 1`; uses `n` and `dtype`.
    Arange,
    /// No inputs: the `n × n` identity; uses `n` and `dtype`.
    Eye,
    /// No inputs: the block `region` of a tensor drawn from the Philox stream `key`, element
    /// `i` of the whole tensor from counter `i`; uses `dtype`, `region`, `key` and `value`,
    /// `scale` (the bounds).
    Uniform,
    /// As `Uniform`, with `value` and `scale` the mean and the standard deviation.
    Normal,
    /// Inputs: a tensor `x`, a block `v`; `x` with `v` written at positions `ints[0]..` of
    /// `axis` (`v` of one rank less is one position). Through `launch_into` with `x` as the
    /// output and `v` the only input, `x` is written in place.
    Update,
}

/// The non-tensor arguments of a kernel; each kernel reads the fields its [`KernelId`] lists.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct KernelParams {
    pub axis: Option<usize>,
    pub keepdims: bool,
    pub shape: Vec<usize>,
    pub perm: Vec<usize>,
    pub slices: Vec<SliceSpec>,
    pub n: usize,
    pub dtype: Option<DType>,
    pub spec: String,
    pub ints: Vec<i64>,
    pub flag: bool,
    pub value: f64,
    pub scale: f64,
    pub key: [u32; 2],
    pub region: Option<Region>,
    pub fused: Option<std::sync::Arc<crate::cpu::fused::Fused>>,
}

impl KernelParams {
    pub fn new() -> KernelParams {
        KernelParams::default()
    }
    pub fn axis(mut self, axis: usize) -> Self {
        self.axis = Some(axis);
        self
    }
    pub fn keepdims(mut self, keepdims: bool) -> Self {
        self.keepdims = keepdims;
        self
    }
    pub fn shape(mut self, shape: &[usize]) -> Self {
        self.shape = shape.to_vec();
        self
    }
    pub fn perm(mut self, perm: &[usize]) -> Self {
        self.perm = perm.to_vec();
        self
    }
    pub fn slices(mut self, slices: &[SliceSpec]) -> Self {
        self.slices = slices.to_vec();
        self
    }
    pub fn n(mut self, n: usize) -> Self {
        self.n = n;
        self
    }
    pub fn dtype(mut self, dtype: DType) -> Self {
        self.dtype = Some(dtype);
        self
    }
    pub fn spec(mut self, spec: &str) -> Self {
        self.spec = spec.to_string();
        self
    }
    pub fn ints(mut self, ints: &[i64]) -> Self {
        self.ints = ints.to_vec();
        self
    }
    pub fn flag(mut self, flag: bool) -> Self {
        self.flag = flag;
        self
    }
    pub fn value(mut self, value: f64) -> Self {
        self.value = value;
        self
    }
    pub fn scale(mut self, scale: f64) -> Self {
        self.scale = scale;
        self
    }
    pub fn key(mut self, key: [u32; 2]) -> Self {
        self.key = key;
        self
    }
    pub fn fused(mut self, tree: std::sync::Arc<crate::cpu::fused::Fused>) -> Self {
        self.fused = Some(tree);
        self
    }
    pub fn region(mut self, region: Region) -> Self {
        self.region = Some(region);
        self
    }
}

/// An ordered queue of launches on a device. Launches on one stream run in the order they
/// were made; launches on different streams may overlap until a `synchronize`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Stream(pub u32);

impl Stream {
    /// The stream `launch` uses.
    pub const DEFAULT: Stream = Stream(0);
}

/// What a device's allocator holds: blocks and bytes kept for reuse, and how many requests
/// a kept block has served.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryStats {
    pub cached_blocks: usize,
    pub cached_bytes: usize,
    pub reuses: u64,
}

/// A place that stores tensors and runs kernels on them.
///
/// Inputs may be views ([`DeviceTensor::permuted`], [`DeviceTensor::broadcast_to`], …): a
/// device reads them through their strides or makes them contiguous itself. Outputs are
/// contiguous, either made by the device (`launch`) or provided by the caller (`launch_into`).
pub trait Device: Send + Sync {
    /// A short name such as `"cpu"` or `"cuda:0"`.
    fn name(&self) -> &str;
    /// Whether the device runs `kernel` itself on these inputs and parameters (the CPU device
    /// runs every kernel; an accelerator may run some, see [`Offload`]). Reads only the inputs'
    /// element types and shapes, so the inputs may belong to another device.
    fn runs(&self, kernel: KernelId, inputs: &[&DeviceTensor], params: &KernelParams) -> bool;
    /// Whether an accelerator runs `kernel` on these inputs and parameters: the device itself
    /// when it is one, or the accelerator behind it ([`Offload`]). The CPU device answers no,
    /// so that a compiler with code of its own for the CPU (the JIT's fused trees) keeps it.
    fn accelerates(&self, kernel: KernelId, inputs: &[&DeviceTensor], params: &KernelParams) -> bool {
        let _ = (kernel, inputs, params);
        false
    }
    /// The device that runs what a program asks to run in host memory (`offload: host`'s
    /// optimizer step): the CPU device. A device that counts its launches (`Offload`) hands
    /// out a CPU side of itself that counts them too.
    fn host_side(self: Arc<Self>) -> Arc<dyn Device> {
        Arc::new(CpuDevice)
    }
    /// `t` with its elements where this device's kernels read them, for a value many kernels
    /// will read (a model updated on the host): the host tensor itself on the CPU device, a
    /// copy on the accelerator too behind [`Offload`].
    fn place(&self, t: &Tensor) -> Result<Tensor, KernelError> {
        Ok(t.clone())
    }
    /// A zero-filled 1-D tensor of `len` elements on the device, from its allocator.
    fn alloc(&self, dtype: DType, len: usize) -> Result<DeviceTensor, KernelError>;
    /// Copies a host tensor to the device.
    fn upload(&self, t: &Tensor) -> Result<DeviceTensor, KernelError>;
    /// Copies a device tensor (a view: the elements it selects) back to the host.
    fn download(&self, d: &DeviceTensor) -> Result<Tensor, KernelError>;
    /// Runs one kernel on `stream` and returns its output (which may still be being computed
    /// until that stream or the device is synchronized, on asynchronous devices).
    fn launch_on(
        &self,
        stream: Stream,
        kernel: KernelId,
        inputs: &[&DeviceTensor],
        params: &KernelParams,
    ) -> Result<DeviceTensor, KernelError>;
    /// Copies `src` (a view) into `dst`, a contiguous tensor of as many elements of its dtype
    /// that nothing else refers to, on `stream`.
    fn copy_into(&self, stream: Stream, src: &DeviceTensor, dst: &mut DeviceTensor) -> Result<(), KernelError>;
    /// A new stream.
    fn new_stream(&self) -> Result<Stream, KernelError>;
    /// Waits until every launch on `stream` has finished.
    fn synchronize_stream(&self, stream: Stream) -> Result<(), KernelError>;
    /// Waits until every launched kernel has finished.
    fn synchronize(&self) -> Result<(), KernelError>;
    /// What the device's allocator keeps for reuse.
    fn memory(&self) -> MemoryStats;

    /// Runs one kernel on the default stream.
    fn launch(
        &self,
        kernel: KernelId,
        inputs: &[&DeviceTensor],
        params: &KernelParams,
    ) -> Result<DeviceTensor, KernelError> {
        self.launch_on(Stream::DEFAULT, kernel, inputs, params)
    }
    /// Runs one kernel on `stream` into the caller's `out` (contiguous, of the output's shape
    /// and dtype, referred to by nothing else). A device that cannot write a kernel's output
    /// in place computes it and copies it there, on the same stream.
    fn launch_into(
        &self,
        stream: Stream,
        kernel: KernelId,
        inputs: &[&DeviceTensor],
        params: &KernelParams,
        out: &mut DeviceTensor,
    ) -> Result<(), KernelError> {
        computed_into(self, stream, kernel, inputs, params, out)
    }
    /// `d` as a contiguous tensor: itself when it is one, else a copy of what it selects.
    fn contiguous(&self, stream: Stream, d: &DeviceTensor) -> Result<DeviceTensor, KernelError> {
        if d.is_contiguous() {
            return Ok(d.clone());
        }
        let mut out = self.alloc(d.dtype(), d.len())?.with_shape(d.shape().to_vec());
        self.copy_into(stream, d, &mut out)?;
        Ok(out)
    }
}

pub(crate) fn arity(kernel: KernelId, inputs: &[&DeviceTensor], n: usize) -> Result<(), KernelError> {
    if inputs.len() == n {
        Ok(())
    } else {
        Err(KernelError::Invalid(format!("kernel {kernel:?} takes {n} inputs, got {}", inputs.len())))
    }
}

pub(crate) fn need_axis(kernel: KernelId, p: &KernelParams) -> Result<usize, KernelError> {
    p.axis.ok_or_else(|| KernelError::Invalid(format!("kernel {kernel:?} needs an axis")))
}

/// `launch_into` as a device that cannot write a kernel's output in place does it: the output
/// computed into a new buffer, then copied into the caller's.
pub(crate) fn computed_into<D: Device + ?Sized>(
    dev: &D,
    stream: Stream,
    kernel: KernelId,
    inputs: &[&DeviceTensor],
    params: &KernelParams,
    out: &mut DeviceTensor,
) -> Result<(), KernelError> {
    let r = computed(dev, stream, kernel, inputs, params, out)?;
    dev.copy_into(stream, &r, out)
}

/// The output `launch_into` would write into `out`, in a new buffer (`update` reads `out` as
/// the tensor written into), checked to be of `out`'s shape and element type.
pub(crate) fn computed<D: Device + ?Sized>(
    dev: &D,
    stream: Stream,
    kernel: KernelId,
    inputs: &[&DeviceTensor],
    params: &KernelParams,
    out: &DeviceTensor,
) -> Result<DeviceTensor, KernelError> {
    let r = if kernel == KernelId::Update {
        let mut all = vec![out];
        all.extend_from_slice(inputs);
        dev.launch_on(stream, kernel, &all, params)?
    } else {
        dev.launch_on(stream, kernel, inputs, params)?
    };
    if r.shape() != out.shape() || r.dtype() != out.dtype() {
        return Err(KernelError::Invalid(format!(
            "kernel {kernel:?} makes {} {:?}, the output provided is {} {:?}",
            r.dtype().name(),
            r.shape(),
            out.dtype().name(),
            out.shape()
        )));
    }
    Ok(r)
}
