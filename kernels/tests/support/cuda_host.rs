//! What the CUDA kernel-source tests share (`kernels/tests/cuda_ops.rs`, `jit/tests/cuda.rs`):
//! building CUDA C for the host with the C++ compiler, reading back what a kernel wrote, the
//! comparison and a seeded generator.

use kernels::cuda::HOST_PRELUDE;
use kernels::DType;

/// `source` (CUDA C) with `HOST_PRELUDE`, built by the C++ compiler (`$CXX`, default `c++`) into
/// a shared library and loaded; `None`, said once, where there is no C++ compiler.
pub fn build(tag: &str, source: &str) -> Option<libloading::Library> {
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    if std::process::Command::new(&cxx).arg("--version").output().is_err() {
        println!("skipped: no C++ compiler ({cxx}) to run the kernels on the host");
        return None;
    }
    let dir = std::env::temp_dir().join(format!("msl_cuda_{tag}_{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (cpp, so) = (dir.join("kernels.cpp"), dir.join("kernels.so"));
    std::fs::write(&cpp, format!("{HOST_PRELUDE}\n{source}")).unwrap();
    let built = std::process::Command::new(&cxx)
        .args(["-O1", "-std=c++17", "-shared", "-fPIC", "-ffp-contract=off", "-o"])
        .arg(&so)
        .arg(&cpp)
        .output()
        .unwrap();
    assert!(built.status.success(), "{}", String::from_utf8_lossy(&built.stderr));
    // SAFETY: the library is the one just compiled; its initialisers do nothing.
    let lib = unsafe { libloading::Library::new(&so) }.unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    Some(lib)
}

/// The first `n` elements of type `d` a kernel wrote into `buf`, widened to f64 (bools 0/1).
pub fn from_bytes(buf: &[u64], d: DType, n: usize) -> Vec<f64> {
    assert!(n <= buf.len(), "the buffer holds {} elements", buf.len());
    // SAFETY: `buf` holds at least `n` elements of any of these types (8 bytes per element).
    unsafe {
        let p = buf.as_ptr();
        match d {
            DType::F32 => std::slice::from_raw_parts(p as *const f32, n).iter().map(|&v| f64::from(v)).collect(),
            DType::F64 => std::slice::from_raw_parts(p as *const f64, n).to_vec(),
            DType::I32 => std::slice::from_raw_parts(p as *const i32, n).iter().map(|&v| f64::from(v)).collect(),
            DType::Bool => std::slice::from_raw_parts(p as *const u8, n).iter().map(|&b| f64::from(b)).collect(),
            DType::Bf16 => std::slice::from_raw_parts(p as *const u16, n)
                .iter()
                .map(|&b| half::bf16::from_bits(b).to_f64())
                .collect(),
            DType::F16 => std::slice::from_raw_parts(p as *const u16, n)
                .iter()
                .map(|&b| half::f16::from_bits(b).to_f64())
                .collect(),
        }
    }
}

/// Whether a device result `a` matches the CPU's `b` of type `d`: to 1e-5 relative for f32
/// (the contract's bound for a device), 1e-12 for f64, exactly otherwise; NaN matches NaN.
pub fn close(a: f64, b: f64, d: DType) -> bool {
    if a.is_nan() || b.is_nan() {
        return a.is_nan() && b.is_nan();
    }
    let (rel, abs) = match d {
        DType::F32 => (1e-5, 1e-6),
        DType::F64 => (1e-12, 1e-14),
        // One unit in the last place (8 and 11 bits of precision), and the smallest normal.
        DType::Bf16 => (1.0 / 128.0, 1e-38),
        DType::F16 => (1.0 / 1024.0, 6.2e-5),
        _ => (0.0, 0.0),
    };
    a == b || (a - b).abs() <= rel * b.abs() + abs
}

/// Mostly in [-3, 3], with zeros, integers and a few specials that the kernels treat apart.
#[allow(dead_code)] // not every test that includes this file draws such inputs
pub fn float(rng: &mut Rng) -> f64 {
    match rng.next() % 16 {
        0 => 0.0,
        1 => -0.0,
        2 => (rng.next() % 7) as f64 - 3.0,
        3 => [f64::INFINITY, f64::NEG_INFINITY, f64::NAN, 20.0, -20.0][(rng.next() % 5) as usize],
        _ => (rng.next() % 600_001) as f64 / 100_000.0 - 3.0,
    }
}

/// A small deterministic generator (xorshift64*).
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}
