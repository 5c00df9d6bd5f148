//! msl's kernels: host tensors, the device trait and its CPU implementation, counter-based
//! random numbers, tensor file I/O and value formatting.
//!
//! The `ops` functions are the reference numerics of msl: the interpreter evaluates every
//! primitive through them, and other devices are checked against them. They are pure
//! functions from tensors to tensors that return a [`KernelError`] instead of panicking.

mod cpu;
pub mod cuda;
pub mod device;
pub mod error;
pub mod format;
pub mod io;
pub mod math;
pub mod pool;
pub mod rng;
pub mod simd;
pub mod tensor;
pub mod threads;

pub use cpu::quant::QuantMatrix;
pub use device::{CpuDevice, Device, DeviceLost, DeviceTensor, KernelId, KernelParams, MemoryStats, Offload, Stream};
pub use error::KernelError;
pub use tensor::{DType, Element, Storage, Tensor};

/// Every CPU kernel, as pure functions over [`Tensor`].
pub mod ops {
    pub use crate::cpu::attention::{attention, attention_weights, AttentionMask};
    pub use crate::cpu::broadcast_shapes;
    pub use crate::cpu::conv::{conv2d, conv2d_input_grad, conv2d_weight_grad, Conv2dGeometry};
    pub use crate::cpu::einsum::einsum;
    pub use crate::cpu::elementwise::{binary, unary, where_, BinaryOp, ElemOp, UnaryOp};
    pub use crate::cpu::fused::{fused, Fused, FusedNode};
    pub use crate::cpu::index::{gather, one_hot, scatter_add, slice, slice_update_add, update, SliceSpec};
    pub use crate::cpu::matmul::{matmul, matmul_t};
    pub use crate::cpu::pool2d::{avg_pool2d, avg_pool2d_grad, max_pool2d, max_pool2d_grad};
    pub use crate::cpu::quant::{matmul_i8, matmul_i8_portable};
    pub use crate::cpu::reduce::{argmax, argmin, cumsum, log_softmax, logsumexp, reduce, softmax, ReduceOp};
    pub use crate::cpu::shape::{
        arange, broadcast_to, concat, expand_dims, eye, full, ones, permute, reshape, squeeze, stack, sum_to_shape,
        swap_last, transpose, zeros,
    };
    pub use crate::cpu::sort::{argsort, scatter_add_along, take_along};
}
