//! The CUDA device's elementwise kernels (`kernels::cuda::elem::op_kernel`): one per operation
//! and element types. Every one of them compiles with NVRTC to an sm_90 CUBIN (no GPU needed;
//! skipped with a printed reason where NVRTC is absent), and the same source, built for the host
//! by the C++ compiler and called with the Rust [`Index`] passed by value (so its layout is
//! checked against the C struct), computes what the CPU kernels compute on broadcast inputs and
//! on a permuted view read through its strides (f32 to 1e-5 relative, the contract's bound for
//! a device; bools exactly; bf16 and f16, computed in f32 and rounded, to one unit in their last
//! place, since an f32 that differs by an ulp may round the other way).

#[path = "support/cuda_host.rs"]
mod cuda_host;

use cuda_host::{close, float, from_bytes, Rng};
use kernels::cuda::elem::{op_kernel, op_kernel_name, result_type, Index};
use kernels::device::row_major;
use kernels::ops::{self, BinaryOp, ElemOp, UnaryOp};
use kernels::{DType, Tensor};

/// Every kernel the device has: (operation, input types, conversion target), found by asking
/// `result_type` about every operation on every element type.
fn every_kernel() -> Vec<(ElemOp, Vec<DType>, Option<DType>)> {
    const TYPES: [DType; 6] = [DType::F32, DType::F64, DType::Bool, DType::Bf16, DType::F16, DType::I32];
    let mut out = Vec::new();
    let mut add = |e: ElemOp, ins: Vec<DType>, to: Option<DType>| {
        if result_type(e, &ins, to).is_some() {
            out.push((e, ins, to));
        }
    };
    for &d in &TYPES {
        for &u in UnaryOp::ALL {
            add(ElemOp::Unary(u), vec![d], None);
        }
        for &b in BinaryOp::ALL {
            add(ElemOp::Binary(b), vec![d, d], None);
        }
        add(ElemOp::Where, vec![DType::Bool, d, d], None);
        for &to in &TYPES {
            add(ElemOp::Cast, vec![d], Some(to));
        }
    }
    out
}

fn source() -> String {
    let mut unit = String::new();
    for (e, ins, to) in every_kernel() {
        unit.push_str(&op_kernel(e, &ins, to).unwrap_or_else(|| panic!("no kernel for {e:?} on {ins:?}")));
    }
    unit
}

#[test]
fn the_device_has_no_kernel_for_what_the_cpu_types_differently() {
    use DType::{Bool, F32, F64, I32};
    assert_eq!(result_type(ElemOp::Binary(BinaryOp::Add), &[F32, F64], None), None);
    assert_eq!(result_type(ElemOp::Binary(BinaryOp::Add), &[I32, I32], None), None);
    assert_eq!(result_type(ElemOp::Binary(BinaryOp::Lt), &[F64, F64], None), Some(Bool));
    assert_eq!(result_type(ElemOp::Unary(UnaryOp::Not), &[F32], None), None);
    assert_eq!(result_type(ElemOp::Where, &[F32, F32, F32], None), None);
    assert_eq!(result_type(ElemOp::Cast, &[F32], Some(I32)), None);
    assert_eq!(result_type(ElemOp::Cast, &[F32], None), None);
    assert_eq!(result_type(ElemOp::Cast, &[F64], Some(DType::Bf16)), None);
    assert_eq!(result_type(ElemOp::Binary(BinaryOp::Le), &[DType::F16, DType::F16], None), Some(Bool));
    // Every operation has a kernel on some element type.
    let ops: std::collections::HashSet<ElemOp> = every_kernel().into_iter().map(|(e, ..)| e).collect();
    assert_eq!(ops.len(), UnaryOp::ALL.len() + BinaryOp::ALL.len() + 2);
}

#[test]
fn every_elementwise_kernel_compiles_to_an_sm_90_cubin() {
    let (major, minor) = match kernels::cuda::nvrtc_version() {
        Ok(v) => v,
        Err(why) => {
            println!("skipped: {why}");
            return;
        }
    };
    let cubin = kernels::cuda::compile_cubin(&source(), "sm_90", kernels::cuda::NVRTC_OPTIONS).unwrap();
    assert_eq!(&cubin[..4], b"\x7fELF");
    println!("NVRTC {major}.{minor}: {} kernels, {} bytes of CUBIN", every_kernel().len(), cubin.len());
}

fn input(rng: &mut Rng, d: DType, shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    let t = if d == DType::Bool {
        Tensor::from_vec(shape.to_vec(), (0..n).map(|_| rng.next().is_multiple_of(2)).collect::<Vec<_>>())
    } else {
        Tensor::from_vec(shape.to_vec(), (0..n).map(|_| float(rng)).collect::<Vec<_>>()).map(|t| t.cast(d))
    };
    t.unwrap()
}

type K1 = unsafe extern "C" fn(*const u8, *mut u8, Index<1>);
type K2 = unsafe extern "C" fn(*const u8, *const u8, *mut u8, Index<2>);
type K3 = unsafe extern "C" fn(*const u8, *const u8, *const u8, *mut u8, Index<3>);

#[test]
fn elementwise_kernels_compute_what_the_cpu_kernels_compute() {
    let Some(lib) = cuda_host::build("elem", &source()) else { return };
    let mut rng = Rng(0x51_7cc1_b727_220a);
    let out_shape = [4usize, 3, 5];
    let mut elements = 0;
    for (e, ins, to) in every_kernel() {
        // Input 0 is a [5, 3, 4] buffer read as [4, 3, 5] through reversed strides; the others
        // broadcast: a [3, 1] column and a [5] row.
        let base = input(&mut rng, ins[0], &[5, 3, 4]);
        let first = ops::permute(&base, &[2, 1, 0]).unwrap();
        let first_strides: Vec<usize> = row_major(&[5, 3, 4]).into_iter().rev().collect();
        let rest: Vec<Tensor> = ins[1..]
            .iter()
            .enumerate()
            .map(|(k, &d)| input(&mut rng, d, if k == 0 { &[3, 1] } else { &[5] }))
            .collect();
        let want = match e {
            ElemOp::Unary(u) => ops::unary(u, &first),
            ElemOp::Binary(b) => ops::binary(b, &first, &rest[0]),
            ElemOp::Where => ops::where_(&first, &rest[0], &rest[1]),
            ElemOp::Cast => first.try_cast(to.unwrap()),
        }
        .unwrap();
        assert_eq!(want.shape(), out_shape);
        let out_t = result_type(e, &ins, to).unwrap();
        assert_eq!(want.dtype(), out_t, "{e:?} on {ins:?}");
        let n = want.len();
        let mut got = vec![0u64; n];
        let name = op_kernel_name(e, &ins, out_t);
        let o = got.as_mut_ptr() as *mut u8;
        let p = |t: &Tensor| t.storage().addr() as *const u8;
        let head = &first_strides[..];
        let (a, b) = (&[3usize, 1][..], &[1usize, 1][..]);
        let (c, d) = (&[5usize][..], &[1usize][..]);
        // SAFETY: each kernel reads its inputs through the index's strides, within the buffers
        // the shapes describe (the base buffer for input 0), and writes `n` elements of its
        // result type into `got`, which holds 8 bytes per element.
        unsafe {
            match ins.len() {
                1 => {
                    let ix = Index::new(&out_shape, [(&out_shape[..], head)]).unwrap();
                    lib.get::<K1>(name.as_bytes()).unwrap()(p(&base), o, ix)
                }
                2 => {
                    let ix = Index::new(&out_shape, [(&out_shape[..], head), (a, b)]).unwrap();
                    lib.get::<K2>(name.as_bytes()).unwrap()(p(&base), p(&rest[0]), o, ix)
                }
                _ => {
                    let ix = Index::new(&out_shape, [(&out_shape[..], head), (a, b), (c, d)]).unwrap();
                    lib.get::<K3>(name.as_bytes()).unwrap()(p(&base), p(&rest[0]), p(&rest[1]), o, ix)
                }
            }
        }
        let (w, g) = (want.to_f64_vec(), from_bytes(&got, out_t, n));
        for (j, (x, y)) in g.iter().zip(&w).enumerate() {
            assert!(close(*x, *y, out_t), "{name}: element {j}: CUDA C {x} vs CPU {y}");
        }
        elements += n;
    }
    println!("{} elementwise kernels agree with the CPU's on {elements} elements", every_kernel().len());
}

#[test]
fn an_index_declines_what_does_not_broadcast() {
    assert!(Index::<1>::new(&[4, 3], [(&[2, 3][..], &[3, 1][..])]).is_none());
    assert!(Index::<1>::new(&[3], [(&[2, 3][..], &[3, 1][..])]).is_none());
    assert!(Index::<1>::new(&[1; 9], [(&[1][..], &[1][..])]).is_none());
    let ix = Index::<1>::new(&[2, 3], [(&[3][..], &[1][..])]).unwrap();
    assert_eq!((ix.n, ix.rank, &ix.strides[0][..2], &ix.dims[..3]), (6, 2, &[0, 1][..], &[2, 3, 1][..]));
}

/// Runs the one-input kernel `name` of `lib` over `n` elements of `input`, contiguous.
///
/// # Safety
/// `input` holds `n` elements of the kernel's input type and `out` room for `n` of its output's.
unsafe fn run1(lib: &libloading::Library, name: &str, input: *const u8, out: *mut u8, n: usize) {
    let ix = Index::new(&[n], [(&[n][..], &[1][..])]).unwrap();
    // SAFETY: the caller's guarantee; the symbol is a kernel of one input.
    unsafe { lib.get::<K1>(name.as_bytes()).unwrap()(input, out, ix) }
}

#[test]
fn conversions_to_and_from_bf16_and_f16_are_the_cpus_bit_for_bit() {
    use DType::{Bf16, F16, F32};
    let kernels: String = [(F32, Bf16), (F32, F16), (Bf16, F32), (F16, F32)]
        .iter()
        .map(|&(a, b)| op_kernel(ElemOp::Cast, &[a], Some(b)).unwrap())
        .collect();
    let Some(lib) = cuda_host::build("half", &kernels) else { return };
    // Every 16-bit pattern, widened.
    let all: Vec<u16> = (0..=u16::MAX).collect();
    let mut wide = vec![0f32; all.len()];
    for (from, want) in
        [(Bf16, (|b| half::bf16::from_bits(b).to_f32()) as fn(u16) -> f32), (F16, |b| half::f16::from_bits(b).to_f32())]
    {
        // SAFETY: 65,536 u16s in, as many f32s out.
        unsafe {
            run1(
                &lib,
                &op_kernel_name(ElemOp::Cast, &[from], F32),
                all.as_ptr() as *const u8,
                wide.as_mut_ptr() as *mut u8,
                all.len(),
            )
        };
        for (&b, &got) in all.iter().zip(&wide) {
            let w = want(b);
            assert!(got.to_bits() == w.to_bits() || got.is_nan() && w.is_nan(), "{from} {b:#06x}: {got} vs {w}");
        }
    }
    // f32s around every rounding boundary: each 16-bit pattern shifted up, with the bits below
    // it at a tie, just under, just over, and random; subnormals, overflow and NaNs among them.
    let mut rng = Rng(0x853c_49e6_748f_ea9b);
    let mut xs: Vec<f32> = Vec::new();
    for &b in &all {
        let hi = u32::from(b) << 16;
        for low in [0u32, 0x8000, 0x7fff, 0x8001, 0xffff, (rng.next() & 0xffff) as u32] {
            xs.push(f32::from_bits(hi | low));
        }
        // Around f16's rounding bits (13 of f32's mantissa bits go).
        let m = (rng.next() as u32) & !0x1fff;
        for low in [0x1000u32, 0x0fff, 0x1001] {
            xs.push(f32::from_bits(m | low));
        }
    }
    let mut narrow = vec![0u16; xs.len()];
    for (to, want) in
        [(Bf16, (|x| half::bf16::from_f32(x).to_bits()) as fn(f32) -> u16), (F16, |x| half::f16::from_f32(x).to_bits())]
    {
        // SAFETY: `xs.len()` f32s in, as many u16s out.
        unsafe {
            run1(
                &lib,
                &op_kernel_name(ElemOp::Cast, &[F32], to),
                xs.as_ptr() as *const u8,
                narrow.as_mut_ptr() as *mut u8,
                xs.len(),
            )
        };
        for (&x, &got) in xs.iter().zip(&narrow) {
            let w = want(x);
            let nan =
                |b: u16| if to == Bf16 { half::bf16::from_bits(b).is_nan() } else { half::f16::from_bits(b).is_nan() };
            assert!(got == w || nan(got) && nan(w), "{x:e} ({:#010x}) to {to}: {got:#06x} vs {w:#06x}", x.to_bits());
        }
    }
}
