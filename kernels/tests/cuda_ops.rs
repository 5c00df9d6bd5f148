//! msl's CUDA kernels for reductions, arg-max/min, softmax, running sums, gathers, one-hot
//! encodings and updates (`kernels/src/cuda/ops.cu`): NVRTC compiles them to an sm_90 CUBIN
//! with no GPU present (skipped with a printed reason where NVRTC is absent;
//! `scripts/setup.sh` installs it), and
//! the same source built for the host by the C++ compiler computes what the CPU kernels
//! compute, on every axis of a rank-3 tensor and on rows long enough that the CPU sums in lanes
//! (f32 to 1e-5 relative, the contract's bound for a device; arg-max/min and gathers exactly).

#[path = "support/cuda_host.rs"]
mod cuda_host;

use cuda_host::{close, from_bytes, Rng};
use kernels::cuda::{RegionArg as Region, OPS_SOURCE};
use kernels::ops::{self, ReduceOp};
use kernels::{DType, Tensor};

#[test]
fn the_ops_kernels_compile_to_an_sm_90_cubin() {
    let (major, minor) = match kernels::cuda::nvrtc_version() {
        Ok(v) => v,
        Err(why) => {
            println!("skipped: {why}");
            return;
        }
    };
    let cubin = kernels::cuda::compile_cubin(OPS_SOURCE, "sm_90", kernels::cuda::NVRTC_OPTIONS).unwrap();
    assert_eq!(&cubin[..4], b"\x7fELF");
    println!("NVRTC {major}.{minor}: ops.cu compiled for sm_90, {} bytes of CUBIN", cubin.len());
}

type Axis = unsafe extern "C" fn(*const u8, *mut u8, i64, i64, i64);
type Gather = unsafe extern "C" fn(*const u8, *const i32, *mut u8, *mut i32, i64, i64, i64, i64);

/// Mostly in [-4, 4].
fn float(rng: &mut Rng) -> f64 {
    (rng.next() % 2_000_001) as f64 / 250_000.0 - 4.0
}

/// `(outer, n, inner)` of `shape` around `axis`.
fn split(shape: &[usize], axis: usize) -> (i64, i64, i64) {
    let outer: usize = shape[..axis].iter().product();
    let inner: usize = shape[axis + 1..].iter().product();
    (outer as i64, shape[axis] as i64, inner as i64)
}

#[test]
fn the_ops_kernels_compute_what_the_cpu_kernels_compute() {
    let Some(lib) = cuda_host::build("ops", OPS_SOURCE) else { return };
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let mut checked = 0usize;
    let shapes: [&[usize]; 4] = [&[3, 5, 4], &[7], &[2, 1000], &[1, 3, 1]];
    for dtype in [DType::F32, DType::F64] {
        let s = if dtype == DType::F32 { "f32" } else { "f64" };
        for shape in shapes {
            let n: usize = shape.iter().product();
            let mut data: Vec<f64> = (0..n).map(|_| float(&mut rng)).collect();
            if n > 10 {
                // A NaN and infinities somewhere, which max, min, arg-max and softmax treat apart.
                data[n / 3] = f64::INFINITY;
                data[n / 2] = f64::NEG_INFINITY;
                if dtype == DType::F64 {
                    data[n - 2] = f64::NAN;
                }
            }
            let x = Tensor::from_vec(shape.to_vec(), data).unwrap().cast(dtype);
            for axis in 0..shape.len() {
                let (outer, len, inner) = split(shape, axis);
                let cases: Vec<(&str, Tensor)> = vec![
                    ("sum", ops::reduce(ReduceOp::Sum, &x, Some(axis), false).unwrap()),
                    ("mean", ops::reduce(ReduceOp::Mean, &x, Some(axis), false).unwrap()),
                    ("max", ops::reduce(ReduceOp::Max, &x, Some(axis), false).unwrap()),
                    ("min", ops::reduce(ReduceOp::Min, &x, Some(axis), false).unwrap()),
                    ("argmax", ops::argmax(&x, Some(axis), false).unwrap()),
                    ("argmin", ops::argmin(&x, Some(axis), false).unwrap()),
                    ("softmax", ops::softmax(&x, axis).unwrap()),
                    ("log_softmax", ops::log_softmax(&x, axis).unwrap()),
                    ("cumsum", ops::cumsum(&x, axis).unwrap()),
                ];
                for (name, want) in cases {
                    let mut out = vec![0u64; want.len()];
                    // SAFETY: the kernel reads `outer * len * inner` elements of `x`'s type and
                    // writes `want.len()` elements (f32/f64, or i32 for arg-max/min) into `out`,
                    // which holds 8 bytes per element.
                    unsafe {
                        let f: libloading::Symbol<Axis> = lib.get(format!("msl_{name}_{s}").as_bytes()).unwrap();
                        f(x.storage().addr() as *const u8, out.as_mut_ptr() as *mut u8, outer, len, inner);
                    }
                    let got =
                        Tensor::from_vec(want.shape().to_vec(), from_bytes(&out, want.dtype(), want.len())).unwrap();
                    let got = got.cast(want.dtype());
                    for (j, (a, b)) in got.to_f64_vec().iter().zip(want.to_f64_vec()).enumerate() {
                        let exact = want.dtype() == DType::I32;
                        assert!(
                            if exact { *a == b } else { close(*a, b, dtype) },
                            "{name}_{s} of {shape:?} over axis {axis}: element {j}: CUDA C {a} vs CPU {b}"
                        );
                    }
                    checked += want.len();
                }
                // Gathers, with a repeated index; then an index out of range is reported.
                let idx: Vec<i32> = (0..len as i32).rev().chain([0, 0]).collect();
                let want = ops::gather(&x, &Tensor::from_vec(vec![idx.len()], idx.clone()).unwrap(), axis).unwrap();
                let mut out = vec![0u64; want.len()];
                let mut bad = 0i32;
                // SAFETY: as above, with `idx.len()` indices and one flag.
                unsafe {
                    let f: libloading::Symbol<Gather> = lib.get(format!("msl_gather_{s}").as_bytes()).unwrap();
                    let o = out.as_mut_ptr() as *mut u8;
                    f(x.storage().addr() as *const u8, idx.as_ptr(), o, &mut bad, outer, len, inner, idx.len() as i64);
                    assert_eq!(bad, 0);
                    let far = [len as i32];
                    let mut spare = vec![0u64; (outer * inner) as usize];
                    let so = spare.as_mut_ptr() as *mut u8;
                    f(x.storage().addr() as *const u8, far.as_ptr(), so, &mut bad, outer, len, inner, 1);
                    assert_eq!(bad, 1, "an index past the axis is reported");
                }
                let got = Tensor::from_vec(want.shape().to_vec(), from_bytes(&out, dtype, want.len())).unwrap();
                let (g, w) = (got.to_f64_vec(), want.to_f64_vec());
                assert!(
                    g.iter().zip(&w).all(|(a, b)| a == b || a.is_nan() && b.is_nan()),
                    "gather_{s} over axis {axis}"
                );
                checked += want.len();
            }
        }
    }
    println!("ops.cu on the host agrees with the CPU kernels on {checked} elements");
}

/// `one_hot` of f32 and f64 equals the CPU's exactly, and an index outside the classes raises
/// the flag the device turns into the CPU's error.
#[test]
fn one_hot_encodes_as_the_cpu_does() {
    let Some(lib) = cuda_host::build("one_hot", OPS_SOURCE) else { return };
    type OneHot = unsafe extern "C" fn(*const i32, *mut u8, *mut i32, i64, i64);
    let idx: Vec<i32> = vec![2, 0, 4, 4, 1, 3, 0];
    let n = 5usize;
    for (dtype, s) in [(DType::F32, "f32"), (DType::F64, "f64")] {
        let want = ops::one_hot(&Tensor::from_vec(vec![idx.len()], idx.clone()).unwrap(), n, dtype).unwrap();
        let mut out = vec![0u64; want.len()];
        let mut bad = 0i32;
        // SAFETY: the kernel reads `idx.len()` indices and writes `idx.len() * n` elements (the
        // u64 buffer holds that many f64s) and one flag.
        unsafe {
            let f: libloading::Symbol<OneHot> = lib.get(format!("msl_one_hot_{s}").as_bytes()).unwrap();
            f(idx.as_ptr(), out.as_mut_ptr() as *mut u8, &mut bad, idx.len() as i64, n as i64);
            assert_eq!(bad, 0);
            let far = [n as i32, -1];
            let mut spare = vec![0u64; 2 * n];
            f(far.as_ptr(), spare.as_mut_ptr() as *mut u8, &mut bad, 2, n as i64);
            assert_eq!(bad, 1, "an index past the classes is reported");
        }
        let got = Tensor::from_vec(want.shape().to_vec(), from_bytes(&out, dtype, want.len())).unwrap();
        assert_eq!(got.to_f64_vec(), want.to_f64_vec(), "one_hot_{s}");
    }
}

/// `update` (a block written into a copy of a tensor, as a cache is) equals the CPU's exactly,
/// on every axis of a rank-3 tensor, a block of several positions and one of a lower rank.
#[test]
fn update_writes_the_block_where_the_cpu_does() {
    let Some(lib) = cuda_host::build("update", OPS_SOURCE) else { return };
    type Update = unsafe extern "C" fn(*const u8, *mut u8, i64, i64, i64, i64, i64);
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let shape = [3usize, 5, 4];
    for (dtype, s) in [(DType::F32, "f32"), (DType::F64, "f64")] {
        let data: Vec<f64> = (0..60).map(|_| float(&mut rng)).collect();
        let x = Tensor::from_vec(shape.to_vec(), data).unwrap().cast(dtype);
        for axis in 0..3 {
            for (m, lower) in [(2usize, false), (1, true)] {
                let mut vshape = shape.to_vec();
                vshape[axis] = m;
                if lower {
                    vshape.remove(axis);
                }
                let n: usize = vshape.iter().product();
                let v = Tensor::from_vec(vshape, (0..n).map(|_| float(&mut rng)).collect::<Vec<f64>>())
                    .unwrap()
                    .cast(dtype);
                let at = shape[axis] as i64 - m as i64;
                let want = ops::update(x.clone(), &v, at, axis).unwrap();
                let mut out: Vec<u64> = vec![0; 60];
                let bytes = dtype.size_in_bytes();
                // SAFETY: `out` (480 bytes) starts as a copy of `x`'s 60 elements; the kernel reads
                // `v`'s elements and writes inside those 60.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        x.storage().addr() as *const u8,
                        out.as_mut_ptr() as *mut u8,
                        60 * bytes,
                    );
                    let f: libloading::Symbol<Update> = lib.get(format!("msl_update_{s}").as_bytes()).unwrap();
                    let (outer, len, inner) = split(&shape, axis);
                    f(v.storage().addr() as *const u8, out.as_mut_ptr() as *mut u8, outer, len, inner, m as i64, at);
                }
                let got = Tensor::from_vec(shape.to_vec(), from_bytes(&out, dtype, 60)).unwrap();
                assert_eq!(got.to_f64_vec(), want.to_f64_vec(), "update_{s} axis {axis}, {m} positions");
            }
        }
    }
}

/// The region argument the device passes (its layout is what these calls check).
fn region(shape: &[usize], start: &[usize], len: &[usize]) -> Region {
    let r = kernels::rng::Region { shape: shape.to_vec(), start: start.to_vec(), len: len.to_vec() };
    Region::new(&r).unwrap()
}

#[test]
fn uniform_and_normal_draw_the_cpus_philox_values() {
    let Some(lib) = cuda_host::build("rng", OPS_SOURCE) else { return };
    type UniF32 = unsafe extern "C" fn(*mut f32, i64, Region, u32, u32, f32, f32, f32);
    type UniF64 = unsafe extern "C" fn(*mut f64, i64, Region, u32, u32, f64, f64);
    type NormF64 = unsafe extern "C" fn(*mut f64, i64, Region, u32, u32, f64, f64);
    type NormF32 = unsafe extern "C" fn(*mut f32, i64, Region, u32, u32, f64, f64);
    let mut checked = 0;
    // The whole tensor, then a rank's block of it (as a sharded `init` draws it).
    for (shape, start, len) in
        [(vec![5usize, 7], vec![0usize, 0], vec![5usize, 7]), (vec![6, 8], vec![3, 4], vec![3, 4])]
    {
        let key = kernels::rng::stream_key(7, "layers.0.w");
        let r = kernels::rng::Region { shape: shape.clone(), start: start.clone(), len: len.clone() };
        let n: usize = len.iter().product();
        let (lo, hi) = (-0.5f64, 1.5f64);
        let want_u32 = kernels::rng::uniform_region(DType::F32, &r, key, lo, hi).unwrap();
        let want_u64 = kernels::rng::uniform_region(DType::F64, &r, key, lo, hi).unwrap();
        let want_n64 = kernels::rng::normal_region(DType::F64, &r, key, 0.25, 2.0).unwrap();
        let want_n32 = kernels::rng::normal_region(DType::F32, &r, key, 0.25, 2.0).unwrap();
        let (mut u32s, mut u64s, mut n64s, mut n32s) = (vec![0f32; n], vec![0f64; n], vec![0f64; n], vec![0f32; n]);
        // SAFETY: each kernel writes `n` elements of its output type into a buffer that long.
        unsafe {
            let f: libloading::Symbol<UniF32> = lib.get(b"msl_uniform_f32").unwrap();
            f(
                u32s.as_mut_ptr(),
                n as i64,
                region(&shape, &start, &len),
                key[0],
                key[1],
                lo as f32,
                (hi - lo) as f32,
                hi as f32,
            );
            let f: libloading::Symbol<UniF64> = lib.get(b"msl_uniform_f64").unwrap();
            f(u64s.as_mut_ptr(), n as i64, region(&shape, &start, &len), key[0], key[1], lo, hi - lo);
            let f: libloading::Symbol<NormF64> = lib.get(b"msl_normal_f64").unwrap();
            f(n64s.as_mut_ptr(), n as i64, region(&shape, &start, &len), key[0], key[1], 0.25, 2.0);
            let f: libloading::Symbol<NormF32> = lib.get(b"msl_normal_f32").unwrap();
            f(n32s.as_mut_ptr(), n as i64, region(&shape, &start, &len), key[0], key[1], 0.25, 2.0);
        }
        let bits32 = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        let bits64 = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits32(&u32s), bits32(want_u32.as_f32().unwrap()), "uniform f32 {shape:?} {start:?}");
        assert_eq!(bits64(&u64s), bits64(want_u64.as_f64().unwrap()), "uniform f64 {shape:?} {start:?}");
        assert_eq!(bits64(&n64s), bits64(want_n64.as_f64().unwrap()), "normal f64 {shape:?} {start:?}");
        assert_eq!(bits32(&n32s), bits32(want_n32.as_f32().unwrap()), "normal f32 {shape:?} {start:?}");
        checked += 4 * n;
    }
    println!("the Philox kernels drew the CPU's {checked} values, bit for bit (host build)");
}

type Att<T> = unsafe extern "C" fn(*const T, *const T, *const T, *mut T, i64, i64, i64, i64, i64, i64, i32, T);

/// (batch, queries, keys, D, E, visible keys, causal) of one attention call.
type Geometry = (i64, i64, i64, i64, i64, i64, i32);

/// Runs the attention kernel `name` of element type `T` on q, k and v into `out`.
///
/// # Safety
/// q, k and v hold `T`s in the shapes `g` gives, and `out` has room for the result.
unsafe fn attend<T>(lib: &libloading::Library, name: &[u8], qkv: [&Tensor; 3], out: &mut [u64], g: Geometry, scale: T) {
    let ptr = |t: &Tensor| t.storage().addr() as *const T;
    // SAFETY: the caller's guarantee; the symbol is the kernel of that signature.
    unsafe {
        let f: libloading::Symbol<Att<T>> = lib.get(name).unwrap();
        f(ptr(qkv[0]), ptr(qkv[1]), ptr(qkv[2]), out.as_mut_ptr() as *mut T, g.0, g.1, g.2, g.3, g.4, g.5, g.6, scale);
    }
}

#[test]
fn fused_attention_computes_what_the_cpu_kernel_computes() {
    let Some(lib) = cuda_host::build("attention", OPS_SOURCE) else { return };
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut checked = 0;
    // (batch, queries, keys, D, E, visible keys, causal): more keys than one tile of 64, a
    // cache that is partly filled, and one query against a cache (a generation step).
    for (b, nq, s, d, e, len, causal) in
        [(2, 5, 7, 4, 3, 7, false), (1, 70, 70, 8, 8, 70, true), (3, 1, 130, 16, 4, 97, true), (2, 4, 9, 3, 5, 6, true)]
    {
        for dtype in [DType::F32, DType::F64] {
            let t = |n: &[usize], rng: &mut Rng| {
                let len: usize = n.iter().product();
                Tensor::from_vec(n.to_vec(), (0..len).map(|_| float(rng) / 2.0).collect::<Vec<_>>())
                    .unwrap()
                    .cast(dtype)
            };
            let (q, k, v) = (t(&[b, nq, d], &mut rng), t(&[b, s, d], &mut rng), t(&[b, s, e], &mut rng));
            let mask = ops::AttentionMask { len: len as i64, causal };
            let want = ops::attention(&q, &k, &v, mask).unwrap();
            let mut out = vec![0u64; want.len()];
            let args = (b as i64, nq as i64, s as i64, d as i64, e as i64, len as i64, i32::from(causal));
            // The scale as the CPU kernel rounds it: 1/√D in f64, then to the element type.
            let scale = 1.0 / (d as f64).sqrt();
            // SAFETY: q, k and v hold [b, nq, d], [b, s, d] and [b, s, e] elements of `dtype`, and
            // `out` has room for the [b, nq, e] result.
            unsafe {
                if dtype == DType::F32 {
                    attend::<f32>(&lib, b"msl_attention_f32", [&q, &k, &v], &mut out, args, scale as f32);
                } else {
                    attend::<f64>(&lib, b"msl_attention_f64", [&q, &k, &v], &mut out, args, scale);
                }
            }
            let got = from_bytes(&out, dtype, want.len());
            for (j, (a, w)) in got.iter().zip(want.to_f64_vec()).enumerate() {
                assert!(
                    close(*a, w, dtype),
                    "attention {dtype} ({b}, {nq}, {s}, {d}, {e}, {len}, {causal}): element {j}: CUDA C {a} vs CPU {w}"
                );
            }
            checked += want.len();
        }
    }
    println!("fused attention on the host agrees with the CPU kernel on {checked} elements");
}
