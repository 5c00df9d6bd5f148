//! The CPU device runs kernels through the device trait with the same results as `ops`.

use kernels::ops::{self, BinaryOp, ReduceOp, SliceSpec, UnaryOp};
use kernels::{CpuDevice, DType, Device, KernelId, KernelParams};

use crate::{lcg, t32, ti};

#[test]
fn kernels_through_the_trait_equal_direct_calls() {
    let dev: Box<dyn Device> = Box::new(CpuDevice);
    assert_eq!(dev.name(), "cpu");
    let a = t32(&[4, 3], &lcg(12, 1).iter().map(|&x| x as f32).collect::<Vec<_>>());
    let b = t32(&[3, 5], &lcg(15, 2).iter().map(|&x| x as f32).collect::<Vec<_>>());
    let (da, db) = (dev.upload(&a).unwrap(), dev.upload(&b).unwrap());
    assert_eq!(da.shape(), &[4, 3]);
    assert_eq!(da.dtype(), DType::F32);
    let run = |k: KernelId, inputs: &[&kernels::DeviceTensor], p: &KernelParams| {
        let out = dev.launch(k, inputs, p).unwrap();
        dev.synchronize().unwrap();
        dev.download(&out).unwrap()
    };
    let none = KernelParams::new();
    assert_eq!(run(KernelId::Matmul, &[&da, &db], &none), ops::matmul(&a, &b).unwrap());
    assert_eq!(run(KernelId::Unary(UnaryOp::Tanh), &[&da], &none), ops::unary(UnaryOp::Tanh, &a).unwrap());
    let bias = t32(&[3], &[1.0, 2.0, 3.0]);
    let dbias = dev.upload(&bias).unwrap();
    assert_eq!(
        run(KernelId::Binary(BinaryOp::Add), &[&da, &dbias], &none),
        ops::binary(BinaryOp::Add, &a, &bias).unwrap()
    );
    let p = KernelParams::new().axis(0).keepdims(true);
    assert_eq!(
        run(KernelId::Reduce(ReduceOp::Sum), &[&da], &p),
        ops::reduce(ReduceOp::Sum, &a, Some(0), true).unwrap()
    );
    assert_eq!(run(KernelId::Softmax, &[&da], &KernelParams::new().axis(1)), ops::softmax(&a, 1).unwrap());
    let idx = ti(&[2], &[3, 1]);
    let didx = dev.upload(&idx).unwrap();
    assert_eq!(run(KernelId::Gather, &[&da, &didx], &KernelParams::new().axis(0)), ops::gather(&a, &idx, 0).unwrap());
    let specs = [SliceSpec::Range { start: 1, end: 3 }];
    assert_eq!(run(KernelId::Slice, &[&da], &KernelParams::new().slices(&specs)), ops::slice(&a, &specs).unwrap());
    assert_eq!(
        run(KernelId::Einsum, &[&da, &db], &KernelParams::new().spec("ij,jk->ik")),
        ops::matmul(&a, &b).unwrap()
    );
    assert_eq!(run(KernelId::Cast, &[&da], &KernelParams::new().dtype(DType::F64)), a.cast(DType::F64));
    let z = dev.alloc(DType::I32, 3).unwrap();
    assert_eq!(dev.download(&z).unwrap(), ops::zeros(DType::I32, &[3]).unwrap());
}

#[test]
fn launch_checks_arity_and_parameters() {
    let dev = CpuDevice;
    let a = dev.upload(&t32(&[2], &[1.0, 2.0])).unwrap();
    assert!(dev.launch(KernelId::Matmul, &[&a], &KernelParams::new()).is_err());
    assert!(dev.launch(KernelId::Softmax, &[&a], &KernelParams::new()).is_err());
    // A buffer that some other device made is refused, not misread.
    let foreign = kernels::DeviceTensor::new(vec![2], DType::F32, std::sync::Arc::new(5u8));
    assert!(dev.download(&foreign).is_err());
}

fn f32s(shape: &[usize], seed: u64) -> kernels::Tensor {
    let n = shape.iter().product();
    t32(shape, &lcg(n, seed).iter().map(|&x| x as f32).collect::<Vec<_>>())
}

#[test]
fn views_select_what_the_copying_kernels_make() {
    let dev = CpuDevice;
    let a = f32s(&[2, 3, 4], 3);
    let d = dev.upload(&a).unwrap();
    let down = |v: &kernels::DeviceTensor| dev.download(v).unwrap();
    assert_eq!(down(&d.permuted(&[2, 0, 1]).unwrap()), ops::permute(&a, &[2, 0, 1]).unwrap());
    assert_eq!(down(&d.transposed_last().unwrap()), ops::swap_last(&a).unwrap());
    assert_eq!(down(&d.broadcast_to(&[5, 2, 3, 4]).unwrap()), ops::broadcast_to(&a, &[5, 2, 3, 4]).unwrap());
    let col = dev.upload(&f32s(&[3, 1], 4)).unwrap();
    assert_eq!(down(&col.broadcast_to(&[2, 3, 4]).unwrap()), ops::broadcast_to(&f32s(&[3, 1], 4), &[2, 3, 4]).unwrap());
    let specs = [SliceSpec::Full, SliceSpec::Range { start: 1, end: 3 }];
    assert_eq!(down(&d.narrowed(1, 1, 2).unwrap()), ops::slice(&a, &specs).unwrap());
    assert_eq!(down(&d.expanded(1).unwrap()), ops::expand_dims(&a, 1).unwrap());
    assert_eq!(down(&d.expanded(3).unwrap().squeezed(Some(3)).unwrap()), a);
    // Views of views: a narrowed, permuted, broadcast tensor.
    let chain = d.narrowed(2, 1, 3).unwrap().permuted(&[1, 0, 2]).unwrap().expanded(0).unwrap();
    let step = ops::slice(&a, &[SliceSpec::Full, SliceSpec::Full, SliceSpec::Range { start: 1, end: 4 }]).unwrap();
    let want = ops::expand_dims(&ops::permute(&step, &[1, 0, 2]).unwrap(), 0).unwrap();
    assert_eq!(down(&chain), want);
    assert!(!chain.is_contiguous() && d.is_contiguous());
    // Every element type is viewed the same way.
    let i = ti(&[2, 3], &[1, 2, 3, 4, 5, 6]);
    let di = dev.upload(&i).unwrap().transposed_last().unwrap();
    assert_eq!(down(&di), ops::swap_last(&i).unwrap());
    let h = a.cast(DType::Bf16);
    assert_eq!(down(&dev.upload(&h).unwrap().permuted(&[1, 2, 0]).unwrap()), ops::permute(&h, &[1, 2, 0]).unwrap());
    // A row-major view reshapes in place; a transposed one must be copied first.
    assert!(d.narrowed(0, 1, 1).unwrap().reshaped(&[12]).is_some());
    assert!(d.transposed_last().unwrap().reshaped(&[24]).is_none());
    let dense = dev.contiguous(kernels::Stream::DEFAULT, &d.transposed_last().unwrap()).unwrap();
    assert!(dense.is_contiguous());
    assert_eq!(down(&dense.reshaped(&[24]).unwrap()), ops::reshape(&ops::swap_last(&a).unwrap(), &[24]).unwrap());
}

#[test]
fn views_outside_their_tensor_are_refused() {
    let d = CpuDevice.upload(&f32s(&[2, 3], 5)).unwrap();
    assert!(d.narrowed(1, 2, 2).is_err());
    assert!(d.narrowed(2, 0, 1).is_err());
    assert!(d.permuted(&[0, 0]).is_err());
    assert!(d.permuted(&[1]).is_err());
    assert!(d.broadcast_to(&[4, 3]).is_err());
    assert!(d.broadcast_to(&[3]).is_err());
    assert!(d.expanded(3).is_err());
    assert!(d.squeezed(Some(0)).is_err());
    assert!(d.narrowed(0, 1, 0).unwrap().is_empty());
}

#[test]
fn kernels_read_views_through_their_strides() {
    let dev = CpuDevice;
    let (a, b) = (f32s(&[2, 4, 3], 6), f32s(&[2, 4, 5], 7));
    let (da, db) = (dev.upload(&a).unwrap(), dev.upload(&b).unwrap());
    let none = KernelParams::new();
    // `transpose(a) @ b` reads `a` as stored (the GEMM's transposed operand), as the copy would.
    let ta = da.transposed_last().unwrap();
    let r = dev.launch(KernelId::Matmul, &[&ta, &db], &none).unwrap();
    assert_eq!(dev.download(&r).unwrap(), ops::matmul(&ops::swap_last(&a).unwrap(), &b).unwrap());
    let tb = db.transposed_last().unwrap();
    let r = dev.launch(
        KernelId::MatmulT { transpose_a: true, transpose_b: false },
        &[&da, &tb.transposed_last().unwrap()],
        &none,
    );
    assert_eq!(dev.download(&r.unwrap()).unwrap(), ops::matmul_t(&a, &b, true, false).unwrap());
    // Elementwise kernels on a permuted and a broadcast view.
    let p = da.permuted(&[0, 2, 1]).unwrap();
    let row = dev.upload(&f32s(&[4], 8)).unwrap().broadcast_to(&[2, 3, 4]).unwrap();
    let r = dev.launch(KernelId::Binary(BinaryOp::Mul), &[&p, &row], &none).unwrap();
    let want = ops::binary(BinaryOp::Mul, &ops::permute(&a, &[0, 2, 1]).unwrap(), &f32s(&[4], 8)).unwrap();
    assert_eq!(dev.download(&r).unwrap(), want);
    let n = da.narrowed(1, 1, 2).unwrap();
    let r = dev.launch(KernelId::Reduce(ReduceOp::Sum), &[&n], &KernelParams::new().axis(1)).unwrap();
    let want = ops::reduce(
        ReduceOp::Sum,
        &ops::slice(&a, &[SliceSpec::Full, SliceSpec::Range { start: 1, end: 3 }]).unwrap(),
        Some(1),
        false,
    );
    assert_eq!(dev.download(&r).unwrap(), want.unwrap());
}

#[test]
fn outputs_go_where_the_caller_says_on_any_stream() {
    let dev = CpuDevice;
    let a = f32s(&[3, 4], 9);
    let da = dev.upload(&a).unwrap();
    let (s1, s2) = (dev.new_stream().unwrap(), dev.new_stream().unwrap());
    assert!(s1 != s2 && s1 != kernels::Stream::DEFAULT);
    let mut out = dev.alloc(DType::F32, 12).unwrap().with_shape(vec![3, 4]);
    dev.launch_into(s1, KernelId::Unary(UnaryOp::Exp), &[&da], &KernelParams::new(), &mut out).unwrap();
    dev.synchronize_stream(s1).unwrap();
    assert_eq!(dev.download(&out).unwrap(), ops::unary(UnaryOp::Exp, &a).unwrap());
    // The same buffer takes the next result (no new allocation on the caller's side).
    dev.launch_into(s2, KernelId::Unary(UnaryOp::Tanh), &[&da], &KernelParams::new(), &mut out).unwrap();
    dev.synchronize().unwrap();
    assert_eq!(dev.download(&out).unwrap(), ops::unary(UnaryOp::Tanh, &a).unwrap());
    // An output of the wrong shape, or one something else still reads, is refused.
    let mut wrong = dev.alloc(DType::F32, 12).unwrap();
    assert!(dev.launch_into(s1, KernelId::Unary(UnaryOp::Exp), &[&da], &KernelParams::new(), &mut wrong).is_err());
    let held = out.clone();
    assert!(dev.launch_into(s1, KernelId::Unary(UnaryOp::Exp), &[&da], &KernelParams::new(), &mut out).is_err());
    assert_eq!(dev.download(&held).unwrap(), ops::unary(UnaryOp::Tanh, &a).unwrap());
    let stats = dev.memory();
    assert!(stats.cached_bytes >= stats.cached_blocks);
}

#[test]
fn convolution_attention_sorting_and_creation_through_the_trait_equal_direct_calls() {
    let dev = CpuDevice;
    let run = |k: KernelId, xs: &[&kernels::Tensor], p: &KernelParams| {
        let ds: Vec<_> = xs.iter().map(|x| dev.upload(x).unwrap()).collect();
        let refs: Vec<&kernels::DeviceTensor> = ds.iter().collect();
        dev.download(&dev.launch(k, &refs, p).unwrap()).unwrap()
    };
    let (x, w) = (f32s(&[2, 3, 6, 6], 11), f32s(&[4, 3, 3, 3], 12));
    let conv = KernelParams::new().ints(&[1, 1]);
    let y = ops::conv2d(&x, &w, 1, 1).unwrap();
    assert_eq!(run(KernelId::Conv2d, &[&x, &w], &conv), y);
    let sized = conv.clone().shape(&[6, 6]);
    assert_eq!(
        run(KernelId::Conv2dInputGrad, &[&y, &w], &sized),
        ops::conv2d_input_grad(&y, &w, [6, 6], 1, 1).unwrap()
    );
    let ksize = conv.clone().shape(&[3, 3]);
    assert_eq!(
        run(KernelId::Conv2dWeightGrad, &[&x, &y], &ksize),
        ops::conv2d_weight_grad(&x, &y, [3, 3], 1, 1).unwrap()
    );
    let pool = KernelParams::new().ints(&[2, 2]);
    let m = ops::max_pool2d(&x, None, 2, 2).unwrap();
    assert_eq!(run(KernelId::MaxPool2d, &[&x], &pool), m);
    assert_eq!(run(KernelId::MaxPool2dGrad, &[&x, &m], &pool), ops::max_pool2d_grad(&x, &m, 2, 2).unwrap());
    assert_eq!(run(KernelId::AvgPool2d, &[&x], &pool), ops::avg_pool2d(&x, 2, 2).unwrap());
    assert!(dev.launch(KernelId::AvgPool2d, &[&dev.upload(&x).unwrap()], &KernelParams::new().ints(&[-1, 2])).is_err());
    let (q, k, v) = (f32s(&[2, 5, 4], 13), f32s(&[2, 7, 4], 14), f32s(&[2, 7, 4], 15));
    let att = KernelParams::new().ints(&[6]).flag(true);
    let mask = ops::AttentionMask { len: 6, causal: true };
    assert_eq!(run(KernelId::Attention, &[&q, &k, &v], &att), ops::attention(&q, &k, &v, mask).unwrap());
    assert_eq!(run(KernelId::AttentionWeights, &[&q, &k], &att), ops::attention_weights(&q, &k, mask).unwrap());
    let sort = KernelParams::new().axis(1).flag(true).shape(&[2]);
    assert_eq!(run(KernelId::Argsort, &[&q], &sort), ops::argsort(&q, 1, true, Some(2)).unwrap());
    let fill = KernelParams::new().dtype(DType::F64).shape(&[2, 3]).value(2.5);
    assert_eq!(run(KernelId::Fill, &[], &fill), ops::full(DType::F64, &[2, 3], 2.5).unwrap());
    assert_eq!(run(KernelId::Eye, &[], &KernelParams::new().n(3).dtype(DType::I32)), ops::eye(3, DType::I32).unwrap());
    let region = kernels::rng::Region { shape: vec![4, 6], start: vec![2, 0], len: vec![2, 6] };
    let key = kernels::rng::stream_key(7, "w");
    let draw = KernelParams::new().dtype(DType::F32).key(key).region(region.clone()).value(0.0).scale(1.0);
    assert_eq!(
        run(KernelId::Normal, &[], &draw),
        kernels::rng::normal_region(DType::F32, &region, key, 0.0, 1.0).unwrap()
    );
    assert_eq!(
        run(KernelId::Uniform, &[], &draw),
        kernels::rng::uniform_region(DType::F32, &region, key, 0.0, 1.0).unwrap()
    );
    assert!(dev.launch(KernelId::Normal, &[], &KernelParams::new().dtype(DType::F32)).is_err());
}

#[test]
fn an_update_writes_into_the_callers_tensor() {
    let dev = CpuDevice;
    let x = f32s(&[4, 3], 16);
    let v = t32(&[3], &[7.0, 8.0, 9.0]);
    let want = ops::update(x.clone(), &v, 2, 0).unwrap();
    let p = KernelParams::new().axis(0).ints(&[2]);
    let dv = dev.upload(&v).unwrap();
    // Through `launch`: a new tensor, the input unchanged.
    let dx = dev.upload(&x).unwrap();
    assert_eq!(dev.download(&dev.launch(KernelId::Update, &[&dx, &dv], &p).unwrap()).unwrap(), want);
    assert_eq!(dev.download(&dx).unwrap(), x);
    // Through `launch_into`: into the caller's buffer, which keeps its address.
    let mut out = dev.upload(&ops::full(DType::F32, &[4, 3], 0.0).unwrap()).unwrap();
    let addr = |d: &kernels::DeviceTensor| d.buffer::<kernels::Tensor>().unwrap().storage().addr();
    let before = addr(&out);
    dev.launch_into(kernels::Stream::DEFAULT, KernelId::Update, &[&dv], &p, &mut out).unwrap();
    assert_eq!(addr(&out), before);
    assert_eq!(
        dev.download(&out).unwrap(),
        ops::update(ops::full(DType::F32, &[4, 3], 0.0).unwrap(), &v, 2, 0).unwrap()
    );
    // Out of range: an error, not a write.
    let far = KernelParams::new().axis(0).ints(&[4]);
    assert!(dev.launch_into(kernels::Stream::DEFAULT, KernelId::Update, &[&dv], &far, &mut out).is_err());
    assert_eq!(
        dev.download(&out).unwrap(),
        ops::update(ops::full(DType::F32, &[4, 3], 0.0).unwrap(), &v, 2, 0).unwrap()
    );
}
