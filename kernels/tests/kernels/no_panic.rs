//! Every kernel of the CPU device, on every element type and on awkward shapes and parameters
//! (empty tensors, scalars, size-1 dims, mismatched ranks, axes past the rank, missing
//! parameters), answers a result or an error, never a panic: the device is a public API that a
//! second device is tested against, and the interpreter reaches it with whatever a program holds.
//! The CUDA device's table of the kernels it runs (`kernels::cuda::runs`) is asked about each too.

use kernels::ops::{BinaryOp, ElemOp, Fused, FusedNode, ReduceOp, SliceSpec, UnaryOp};
use kernels::rng::Region;
use kernels::{CpuDevice, DType, Device, KernelId, KernelParams, Tensor};
use std::sync::Arc;

/// One of each kind of kernel id (every unary and binary operation is covered by the
/// elementwise tests; one of each stands for them here). The match makes a new kernel id fail
/// to compile until it is listed.
fn every_kernel() -> Vec<KernelId> {
    let all = vec![
        KernelId::Unary(UnaryOp::Exp),
        KernelId::Unary(UnaryOp::Not),
        KernelId::Binary(BinaryOp::Add),
        KernelId::Binary(BinaryOp::Rem),
        KernelId::Binary(BinaryOp::Lt),
        KernelId::Binary(BinaryOp::And),
        KernelId::Where,
        KernelId::Fused,
        KernelId::Reduce(ReduceOp::Sum),
        KernelId::Reduce(ReduceOp::Max),
        KernelId::Reduce(ReduceOp::Prod),
        KernelId::ArgMax,
        KernelId::ArgMin,
        KernelId::LogSumExp,
        KernelId::Softmax,
        KernelId::LogSoftmax,
        KernelId::Cumsum,
        KernelId::Matmul,
        KernelId::MatmulT { transpose_a: true, transpose_b: false },
        KernelId::Cast,
        KernelId::Reshape,
        KernelId::Transpose,
        KernelId::Permute,
        KernelId::Concat,
        KernelId::Stack,
        KernelId::ExpandDims,
        KernelId::Squeeze,
        KernelId::BroadcastTo,
        KernelId::SumToShape,
        KernelId::Slice,
        KernelId::SliceUpdateAdd,
        KernelId::Gather,
        KernelId::ScatterAdd,
        KernelId::OneHot,
        KernelId::Einsum,
        KernelId::Contiguous,
        KernelId::Conv2d,
        KernelId::Conv2dInputGrad,
        KernelId::Conv2dWeightGrad,
        KernelId::MaxPool2d,
        KernelId::MaxPool2dGrad,
        KernelId::AvgPool2d,
        KernelId::AvgPool2dGrad,
        KernelId::Attention,
        KernelId::AttentionWeights,
        KernelId::Argsort,
        KernelId::TakeAlong,
        KernelId::ScatterAddAlong,
        KernelId::Fill,
        KernelId::Arange,
        KernelId::Eye,
        KernelId::Uniform,
        KernelId::Normal,
        KernelId::Update,
    ];
    for k in &all {
        match k {
            KernelId::Unary(_)
            | KernelId::Binary(_)
            | KernelId::Where
            | KernelId::Fused
            | KernelId::Reduce(_)
            | KernelId::ArgMax
            | KernelId::ArgMin
            | KernelId::LogSumExp
            | KernelId::Softmax
            | KernelId::LogSoftmax
            | KernelId::Cumsum
            | KernelId::Matmul
            | KernelId::MatmulT { .. }
            | KernelId::Cast
            | KernelId::Reshape
            | KernelId::Transpose
            | KernelId::Permute
            | KernelId::Concat
            | KernelId::Stack
            | KernelId::ExpandDims
            | KernelId::Squeeze
            | KernelId::BroadcastTo
            | KernelId::SumToShape
            | KernelId::Slice
            | KernelId::SliceUpdateAdd
            | KernelId::Gather
            | KernelId::ScatterAdd
            | KernelId::OneHot
            | KernelId::Einsum
            | KernelId::Contiguous
            | KernelId::Conv2d
            | KernelId::Conv2dInputGrad
            | KernelId::Conv2dWeightGrad
            | KernelId::MaxPool2d
            | KernelId::MaxPool2dGrad
            | KernelId::AvgPool2d
            | KernelId::AvgPool2dGrad
            | KernelId::Attention
            | KernelId::AttentionWeights
            | KernelId::Argsort
            | KernelId::TakeAlong
            | KernelId::ScatterAddAlong
            | KernelId::Fill
            | KernelId::Arange
            | KernelId::Eye
            | KernelId::Uniform
            | KernelId::Normal
            | KernelId::Update => {}
        }
    }
    all
}

const DTYPES: [DType; 6] = [DType::F32, DType::F64, DType::I32, DType::Bool, DType::Bf16, DType::F16];

fn tensor(shape: &[usize], d: DType, seed: usize) -> Tensor {
    let n: usize = shape.iter().product();
    let v: Vec<f64> = (0..n).map(|i| ((i * 7 + seed * 3) % 11) as f64 - 4.0).collect();
    Tensor::from_vec(shape.to_vec(), v).unwrap().cast(d)
}

/// Parameter sets: none, then each field set to something plausible or out of range.
fn params() -> Vec<KernelParams> {
    let p = KernelParams::new;
    let tree = Arc::new(Fused {
        nodes: vec![
            FusedNode::Input(0),
            FusedNode::Const(2.0),
            FusedNode::Op(ElemOp::Binary(BinaryOp::Mul), vec![0, 1]),
        ],
        dtype: vec![DType::F32; 3],
        operand: vec![DType::F32; 3],
        inputs: 1,
    });
    let bad_tree =
        Arc::new(Fused { nodes: vec![FusedNode::Op(ElemOp::Unary(UnaryOp::Neg), vec![5])], ..(*tree).clone() });
    vec![
        p(),
        p().axis(0).keepdims(true).dtype(DType::F32).n(3).shape(&[2, 3]).perm(&[1, 0]),
        p().axis(7).shape(&[0]).perm(&[0, 0]).n(0).dtype(DType::Bf16),
        p().ints(&[1, 1]).shape(&[3, 3]).flag(true).axis(1),
        p().ints(&[-1, 9]).flag(true),
        p().spec("ij,jk->ik"),
        p().spec("i->j->"),
        p().slices(&[SliceSpec::Range { start: 0, end: 9 }]),
        p().slices(&[SliceSpec::Range { start: 2, end: 1 }, SliceSpec::Index(-7), SliceSpec::Full]),
        p().dtype(DType::F64)
            .region(Region { shape: vec![2, 3], start: vec![1, 0], len: vec![1, 3] })
            .value(-1.0)
            .scale(1.0),
        p().dtype(DType::F32).region(Region { shape: vec![2], start: vec![5], len: vec![3] }),
        p().fused(tree),
        p().fused(bad_tree),
    ]
}

#[test]
fn no_kernel_panics_on_any_element_type_shape_or_parameters() {
    let shapes: [&[usize]; 6] = [&[], &[0], &[1], &[2, 3], &[3, 1, 2], &[2, 2, 2, 2]];
    let dev = CpuDevice;
    let mut panics = Vec::new();
    let mut calls = 0;
    let prev = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    for k in every_kernel() {
        for p in params() {
            for arity in 0..=3usize {
                for (si, a) in shapes.iter().enumerate() {
                    // Every combination of element types over the inputs.
                    for combo in 0..DTYPES.len().pow(arity as u32) {
                        // The inputs: the same shape, or a row of it, in turn.
                        let inputs: Vec<Tensor> = (0..arity)
                            .map(|j| {
                                let d = DTYPES[combo / DTYPES.len().pow(j as u32) % DTYPES.len()];
                                let shape = if (j + si) % 2 == 0 { a } else { &a[a.len().saturating_sub(1)..] };
                                tensor(shape, d, j)
                            })
                            .collect();
                        let ds: Vec<_> = inputs.iter().map(|t| dev.upload(t).unwrap()).collect();
                        let refs: Vec<_> = ds.iter().collect();
                        calls += 1;
                        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                            // The CUDA device's table of what it runs reads the same inputs.
                            let _ = kernels::cuda::runs(k, &refs, &p, true);
                            let _ = dev.launch(k, &refs, &p).and_then(|o| dev.download(&o));
                        }));
                        if r.is_err() {
                            let types: Vec<DType> = inputs.iter().map(Tensor::dtype).collect();
                            panics.push(format!("{k:?} on {types:?} {a:?} with {p:?}"));
                        }
                    }
                }
            }
        }
    }
    std::panic::set_hook(prev);
    println!("{calls} launches, {} panicked", panics.len());
    panics.dedup_by_key(|s| s.split(" with ").next().map(str::to_string));
    assert!(
        panics.is_empty(),
        "{} of {calls} launches panicked, e.g.:\n{}",
        panics.len(),
        panics[..panics.len().min(20)].join("\n")
    );
}
