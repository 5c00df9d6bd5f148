//! A deterministic mutation fuzzer for the loaders: thousands of truncated, bit-flipped and
//! lying `.npy`, `.npz`, `.safetensors` and `.csv` files, each of which must load or give an
//! error naming the file — never a panic, never a hang, and never an allocation larger than
//! the file could justify.
//!
//! This is its own test binary because it installs a global allocator that records the largest
//! single allocation: the seeds are a few kilobytes, so a loader that asks for more than
//! [`LIMIT`] bytes trusted a size from a header. Requests above [`REFUSE`] are refused outright
//! (the binary aborts naming the size) rather than letting a lying header exhaust memory.
//!
//! `MSL_LOADER_FUZZ=N` sets the number of mutants per seed file (200 by default);
//! `MSL_LOADER_FUZZ_SHOW=1` prints every outcome, to see which checks the mutants reach.

use std::alloc::{GlobalAlloc, Layout, System};
use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use kernels::io;
use kernels::{DType, Tensor};

/// The most one load of a seed-sized file may allocate at once.
const LIMIT: usize = 16 << 20;
/// Allocations above this fail at once (the process aborts with the size in its message).
const REFUSE: usize = 1 << 30;

static LARGEST: AtomicUsize = AtomicUsize::new(0);

struct Recording;

// SAFETY: every call is forwarded unchanged to the system allocator, except that requests
// above `REFUSE` return null, which `GlobalAlloc` allows.
unsafe impl GlobalAlloc for Recording {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        if layout.size() > REFUSE {
            return std::ptr::null_mut();
        }
        // SAFETY: the caller's layout contract is passed on as is.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        if layout.size() > REFUSE {
            return std::ptr::null_mut();
        }
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator, hence from `System`, with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LARGEST.fetch_max(new_size, Ordering::Relaxed);
        if new_size > REFUSE {
            return std::ptr::null_mut();
        }
        // SAFETY: as for `dealloc`; `new_size` is the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Recording = Recording;

/// xorshift64*: the same inputs on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Numbers that break size arithmetic: zero, the edges of 32 and 64 bits, products that wrap.
const BIG_TEXT: [&str; 13] = [
    "0",
    "1",
    "-1",
    "2147483648",
    "4294967296",
    "4294967297",
    "1099511627776",
    "4611686018427387904",
    "9223372036854775807",
    "18446744073709551615",
    "18446744073709551616",
    "99999999999999999999999",
    "1e999",
];
const BIG_WORDS: [u64; 7] = [0, 1, 0x7fff_ffff, 0x8000_0000, 0xffff_ffff, 1 << 40, u64::MAX];

/// One mutation of `v`: a truncation, flipped bytes, a digit run replaced by a huge number, a
/// little-endian word overwritten (zip and safetensors length fields), a chunk repeated or cut.
fn mutate(rng: &mut Rng, v: &mut Vec<u8>) {
    if v.is_empty() {
        v.push(rng.next() as u8);
        return;
    }
    match rng.below(7) {
        0 => v.truncate(rng.below(v.len())),
        1 => {
            for _ in 0..1 + rng.below(4) {
                let at = rng.below(v.len());
                v[at] ^= 1 << rng.below(8);
            }
        }
        2 | 3 => {
            let runs: Vec<(usize, usize)> = digit_runs(v);
            if runs.is_empty() {
                return;
            }
            let (a, b) = runs[rng.below(runs.len())];
            let text = BIG_TEXT[rng.below(BIG_TEXT.len())].as_bytes();
            v.splice(a..b, text.iter().copied());
        }
        4 => {
            // Zip headers keep their sizes at fixed offsets from their signatures; hit those
            // most of the time, anything else otherwise.
            let at = match zip_size_fields(v) {
                f if !f.is_empty() && rng.below(4) != 0 => f[rng.below(f.len())],
                _ => rng.below(v.len()),
            };
            let width = [2, 4, 8][rng.below(3)];
            let word = BIG_WORDS[rng.below(BIG_WORDS.len())].to_le_bytes();
            for (i, &b) in word[..width].iter().enumerate() {
                if let Some(x) = v.get_mut(at + i) {
                    *x = b;
                }
            }
        }
        5 => {
            let a = rng.below(v.len());
            let b = (a + 1 + rng.below(64)).min(v.len());
            let chunk = v[a..b].to_vec();
            let at = rng.below(v.len());
            v.splice(at..at, chunk);
        }
        _ => {
            let a = rng.below(v.len());
            let b = (a + 1 + rng.below(64)).min(v.len());
            v.drain(a..b);
        }
    }
}

fn digit_runs(v: &[u8]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < v.len() {
        if v[i].is_ascii_digit() {
            let start = i;
            while i < v.len() && v[i].is_ascii_digit() {
                i += 1;
            }
            out.push((start, i));
        } else {
            i += 1;
        }
    }
    out
}

/// Offsets of the size, count and offset fields of zip local headers, central directory
/// entries and the end-of-directory record.
fn zip_size_fields(v: &[u8]) -> Vec<usize> {
    let mut out = Vec::new();
    for i in 0..v.len().saturating_sub(4) {
        match &v[i..i + 4] {
            b"PK\x03\x04" => out.extend([i + 18, i + 22, i + 26, i + 28]),
            b"PK\x01\x02" => out.extend([i + 20, i + 24, i + 28, i + 42]),
            b"PK\x05\x06" => out.extend([i + 8, i + 10, i + 12, i + 16]),
            _ => {}
        }
    }
    out
}

/// A zip archive whose one member, `x.npy`, holds `member`.
fn zip_bytes(member: &[u8], method: zip::CompressionMethod) -> Vec<u8> {
    use std::io::Write as _;
    let mut z = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    z.start_file("x.npy", zip::write::SimpleFileOptions::default().compression_method(method)).unwrap();
    z.write_all(member).unwrap();
    z.finish().unwrap().into_inner()
}

fn data(name: &str) -> Vec<u8> {
    std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data").join(name)).unwrap()
}

/// Valid files of every format: NumPy's and Python's own (tests/data) and msl's.
fn seeds(dir: &Path) -> Vec<(&'static str, Vec<u8>)> {
    let mut out: Vec<(&'static str, Vec<u8>)> = Vec::new();
    for name in ["f8_fortran.npy", "i8_big.npy", "f4_v2.npy", "f2.npy", "b1.npy", "f4_scalar.npy"] {
        out.push(("npy", data(name)));
    }
    out.push(("npz", data("two.npz")));
    out.push(("safetensors", data("mixed.safetensors")));
    let m = Tensor::from_f32(vec![3, 4], (0..12).map(|i| i as f32 * 0.5).collect()).unwrap();
    let i = Tensor::from_i32(vec![2], vec![7, -7]).unwrap();
    let named = vec![("x".to_string(), m.clone()), ("labels".to_string(), i)];
    let p = dir.join("seed.npz");
    io::save_npz(&p, &named).unwrap();
    out.push(("npz", std::fs::read(&p).unwrap()));
    let p = dir.join("seed.safetensors");
    io::save_safetensors(&p, &named).unwrap();
    out.push(("safetensors", std::fs::read(&p).unwrap()));
    out.push(("npy", kernels::io::npy::npy_bytes(&m)));
    out.push(("csv", b"a,b,c\n1,2.5,-3\n\n4,5e-1,7\r\n".to_vec()));
    out.push(("csv", b"10,20\n30,40\n2147483647,-2147483648\n".to_vec()));
    out
}

/// Every way msl reads a file of this kind; `Err` messages must name the file.
fn load_every_way(p: &Path, ext: &str) -> Vec<Result<(), String>> {
    let named = |r: Result<Tensor, kernels::KernelError>| r.map(|_| ()).map_err(|e| e.to_string());
    match ext {
        "npy" => vec![named(io::load(p, None))],
        "npz" => vec![
            named(io::load(p, Some("x"))),
            named(io::load(p, None)),
            io::load_all_npz(p).map(|_| ()).map_err(|e| e.to_string()),
        ],
        "safetensors" => vec![
            named(io::load(p, Some("x"))),
            named(io::load(p, None)),
            io::load_all_safetensors(p).map(|_| ()).map_err(|e| e.to_string()),
        ],
        _ => vec![
            named(io::load(p, None)),
            named(io::load_csv(p, DType::I32)),
            named(io::load_csv(p, DType::F32)),
            named(io::load_csv(p, DType::Bool)),
        ],
    }
}

/// The outcome of one case: `None` when it behaved, else what went wrong.
fn run_case(p: &Path, ext: &str, bytes: &[u8]) -> Option<String> {
    std::fs::write(p, bytes).unwrap();
    LARGEST.store(0, Ordering::Relaxed);
    let results = panic::catch_unwind(AssertUnwindSafe(|| load_every_way(p, ext)));
    let largest = LARGEST.load(Ordering::Relaxed);
    let results = match results {
        Ok(r) => r,
        Err(_) => return Some("a loader panicked".into()),
    };
    if largest > LIMIT {
        return Some(format!("a loader allocated {largest} bytes at once for a file of {} bytes", bytes.len()));
    }
    if std::env::var_os("MSL_LOADER_FUZZ_SHOW").is_some() {
        for r in &results {
            eprintln!(
                "OUTCOME {ext} {}",
                r.as_ref().err().map_or("ok".to_string(), |m| m.replace(&p.display().to_string(), "F"))
            );
        }
    }
    results.into_iter().find_map(|r| match r {
        Err(m) if !m.contains("case.") => Some(format!("an error does not name the file: {m}")),
        _ => None,
    })
}

#[test]
fn mutated_files_never_panic_hang_or_over_allocate() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("loader-fuzz");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let per_seed: usize = std::env::var("MSL_LOADER_FUZZ").ok().and_then(|v| v.parse().ok()).unwrap_or(200);
    let mut cases: Vec<(&'static str, Vec<u8>)> = Vec::new();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for (ext, seed) in seeds(&dir) {
        cases.push((ext, seed.clone()));
        for k in 0..per_seed {
            let mut v = seed.clone();
            for _ in 0..1 + rng.below(3) {
                mutate(&mut rng, &mut v);
            }
            if ext == "npy" {
                // The same lying `.npy` as a member of a well-formed archive (valid checksums),
                // so that the streamed member path meets it too.
                let method = if k % 2 == 0 { zip::CompressionMethod::Stored } else { zip::CompressionMethod::Deflated };
                cases.push(("npz", zip_bytes(&v, method)));
            }
            cases.push((ext, v));
        }
    }
    // One worker runs the cases in order and reports each; a case that takes more than 20 s
    // counts as a hang.
    let (tx, rx) = mpsc::channel::<(usize, Option<String>)>();
    let work: Vec<(&'static str, Vec<u8>)> = cases.clone();
    let wdir = dir.clone();
    std::thread::spawn(move || {
        for (i, (ext, bytes)) in work.iter().enumerate() {
            let p = wdir.join(format!("case.{ext}"));
            if tx.send((i, run_case(&p, ext, bytes))).is_err() {
                return;
            }
        }
    });
    let keep = |i: usize| -> PathBuf {
        let (ext, bytes) = &cases[i];
        let p = dir.join(format!("failing-{i}.{ext}"));
        std::fs::write(&p, bytes).unwrap();
        p
    };
    for i in 0..cases.len() {
        match rx.recv_timeout(Duration::from_secs(20)) {
            Ok((j, None)) => assert_eq!(i, j),
            Ok((j, Some(problem))) => panic!("case {j}: {problem} (the file is kept at {})", keep(j).display()),
            Err(_) => panic!("case {i}: still loading after 20 s (the file is kept at {})", keep(i).display()),
        }
    }
    eprintln!("loader fuzz: {} files, none panicked, hung or over-allocated", cases.len());
}
