//! A fused elementwise tree as every device takes it (`KernelId::Fused`): the JIT finds and
//! types the trees (`jit::fuse`); Cranelift compiles them for the CPU, and a device with a code
//! generator of its own (CUDA: `cuda::elem::fused_kernel`) compiles them for itself. This module
//! holds the tree and its reference evaluation, node by node through the elementwise kernels,
//! which is what the CPU device runs and what every generated kernel must compute.

use crate::cpu::elementwise::{binary, unary, where_, ElemOp};
use crate::error::KernelError;
use crate::tensor::{DType, Tensor};

/// One node; nodes are stored children first, the root last.
#[derive(Clone, Debug, PartialEq)]
pub enum FusedNode {
    /// Input number `k`.
    Input(usize),
    /// A constant, of the node's element type.
    Const(f64),
    /// An operation of earlier nodes (a conversion's target is the node's element type).
    Op(ElemOp, Vec<usize>),
}

/// A typed tree: each node's element type (`dtype`) and the element type its operands are
/// converted to first (`operand`; for `where`, that of the two branches).
#[derive(Clone, Debug, PartialEq)]
pub struct Fused {
    pub nodes: Vec<FusedNode>,
    pub dtype: Vec<DType>,
    pub operand: Vec<DType>,
    /// How many inputs the tree reads.
    pub inputs: usize,
}

impl Fused {
    /// The element type of the tree's result.
    pub fn out_dtype(&self) -> Option<DType> {
        self.dtype.last().copied()
    }

    /// The element type the tree reads input `k` as (its first leaf's).
    pub fn input_dtype(&self, k: usize) -> Option<DType> {
        self.nodes.iter().zip(&self.dtype).find(|(n, _)| **n == FusedNode::Input(k)).map(|(_, &d)| d)
    }
}

fn bad(why: String) -> KernelError {
    KernelError::Invalid(format!("fused tree: {why}"))
}

/// Evaluates `tree` on `xs`, node by node, as the interpreter evaluates the same primitives.
pub fn fused(tree: &Fused, xs: &[&Tensor]) -> Result<Tensor, KernelError> {
    if xs.len() != tree.inputs || tree.dtype.len() != tree.nodes.len() || tree.operand.len() != tree.nodes.len() {
        return Err(bad(format!("{} inputs for a tree of {}", xs.len(), tree.inputs)));
    }
    let mut vals: Vec<Tensor> = Vec::with_capacity(tree.nodes.len());
    for (i, node) in tree.nodes.iter().enumerate() {
        let d = tree.dtype[i];
        let v = match node {
            FusedNode::Input(k) => {
                let x = xs.get(*k).ok_or_else(|| bad(format!("no input {k}")))?;
                if x.dtype() != d {
                    return Err(KernelError::dtype("fused tree", d.name(), x.dtype()));
                }
                (*x).clone()
            }
            FusedNode::Const(c) => Tensor::scalar_f64(*c).try_cast(d)?,
            FusedNode::Op(e, args) => {
                let o = tree.operand[i];
                let arg = |j: usize| -> Result<Tensor, KernelError> {
                    let a =
                        *args.get(j).filter(|&&a| a < i).ok_or_else(|| bad(format!("node {i} reads a later node")))?;
                    let v = &vals[a];
                    // Operands converted to the operation's operand type (not `where`'s condition).
                    if v.dtype() == o || *e == ElemOp::Where && j == 0 {
                        Ok(v.clone())
                    } else {
                        v.try_cast(o)
                    }
                };
                match e {
                    ElemOp::Unary(u) => unary(*u, &arg(0)?)?,
                    ElemOp::Binary(b) => binary(*b, &arg(0)?, &arg(1)?)?,
                    ElemOp::Where => where_(&arg(0)?, &arg(1)?, &arg(2)?)?,
                    ElemOp::Cast => arg(0)?.try_cast(d)?,
                }
            }
        };
        if v.dtype() != d {
            return Err(bad(format!("node {i} is {}, typed {}", v.dtype(), d)));
        }
        vals.push(v);
    }
    vals.pop().ok_or_else(|| bad("an empty tree".into()))
}
