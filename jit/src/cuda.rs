//! CUDA C for a fused tree: the second code generator over the same fused-tree analysis.
//!
//! [`source`] turns a typed [`Tree`] (the one `fuse` found and typed for the Cranelift loop)
//! into one `extern "C" __global__` kernel that computes the tree for every element of the
//! broadcast result, in the form and with the operations of `kernels::cuda::elem`, which also
//! writes the CUDA device's single-operation kernels: one C expression per operation, for both.
//! `kernels::cuda::compile_cubin` compiles it with NVRTC.

use crate::fuse::{Node, Tree, Typed};
use kernels::cuda::elem::c_type;

pub use kernels::cuda::elem::MAX_RANK;

/// The NVRTC options every generated kernel is compiled with (besides the architecture).
pub const OPTIONS: &[&str] = kernels::cuda::NVRTC_OPTIONS;

/// The C element types of the kernel's inputs (`in0`, `in1`, …) and of its output.
pub fn param_types(tree: &Tree, typed: &Typed) -> Option<(Vec<&'static str>, &'static str)> {
    let out_t = c_type(*typed.dtype.last()?)?;
    let mut input_t = vec!["float"; tree.n_inputs];
    for (i, node) in tree.nodes.iter().enumerate() {
        if let Node::Leaf(k) = node {
            *input_t.get_mut(*k)? = c_type(typed.dtype[i])?;
        }
    }
    Some((input_t, out_t))
}

/// The CUDA C source of kernel `name` computing `tree` typed as `typed`, or `None` when the
/// tree holds an element type the generator does not write (the interpreter then runs it).
///
/// Parameters: `in0 … in{n-1}` (device pointers, each of its input's element type), `out`, the
/// element count `n`, the result's rank and dims, and each input's strides in elements
/// (`st{k}`), each dim array `MAX_RANK` long and packed in a struct passed by value.
pub fn source(tree: &Tree, typed: &Typed, name: &str) -> Option<String> {
    kernels::cuda::elem::fused_kernel(&crate::fuse::device_tree(tree, typed)?, name)
}
