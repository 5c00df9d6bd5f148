//! CUDA through cudarc, every library loaded at run time: NVRTC (which compiles generated
//! kernel sources to CUBIN for a named architecture with no GPU or driver present) and the
//! presence of the CUDA driver, which decides whether `--device cuda` can run at all.
//!
//! NVRTC is looked for, in order, at `MSL_NVRTC` (the library file or its folder), in the
//! cache folder `scripts/setup.sh` fills from PyPI's `nvidia-cuda-nvrtc-cu12` wheel
//! (`${XDG_CACHE_HOME:-~/.cache}/msl/nvrtc/nvidia/cuda_nvrtc/lib/libnvrtc.so.12`), and then where
//! the system's loader finds `libnvrtc.so` (a CUDA toolkit). A library found by path is opened
//! by that path first, so that cudarc's own lookup by name finds it already loaded.

use std::ffi::{c_char, CStr, CString};
use std::path::PathBuf;
use std::sync::OnceLock;

use cudarc::nvrtc::sys as nv;

mod device;
pub mod elem;
pub mod gemm;
mod launch;
pub use device::{runs, CudaDevice};

/// `msl_region` of `ops.cu`, passed by value to the random-number kernels: the block of a
/// tensor of `rank` dims that a draw fills (see [`crate::rng::Region`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RegionArg {
    pub rank: i32,
    pub shape: [i64; elem::MAX_RANK],
    pub start: [i64; elem::MAX_RANK],
    pub len: [i64; elem::MAX_RANK],
}

impl RegionArg {
    /// `r` as the kernels take it; `None` past [`elem::MAX_RANK`] dims or when its parts
    /// disagree in rank.
    pub fn new(r: &crate::rng::Region) -> Option<RegionArg> {
        let rank = r.shape.len();
        if rank > elem::MAX_RANK || r.start.len() != rank || r.len.len() != rank {
            return None;
        }
        let mut a = RegionArg { rank: rank as i32, shape: [1; 8], start: [0; 8], len: [1; 8] };
        for d in 0..rank {
            (a.shape[d], a.start[d], a.len[d]) = (r.shape[d] as i64, r.start[d] as i64, r.len[d] as i64);
        }
        Some(a)
    }
}

/// The CUDA C of the kernels that are not fused elementwise trees (reductions, arg-max/min,
/// softmax, running sums, gathers, the Philox streams of `uniform` and `normal`, fused attention), one `extern "C"` kernel per operation and element type
/// (`msl_sum_f32`, …); compiled with `--fmad=false` like the generated ones.
pub const OPS_SOURCE: &str = include_str!("ops.cu");

/// The NVRTC options of every msl kernel, generated or not (besides the architecture): no
/// product and sum contracted into one rounding the CPU kernels do not make.
pub const NVRTC_OPTIONS: &[&str] = &["--fmad=false", "--std=c++17"];

/// What a C++ compiler needs, besides the CUDA C itself, to build msl's kernels for the host:
/// CUDA's few built-ins (one block of one thread, so a kernel's grid-stride loop runs every
/// element in turn). The tests run every kernel source this way against the CPU kernels.
pub const HOST_PRELUDE: &str = r#"
#include <math.h>
#include <string.h>
#include <cmath>
using std::isfinite;
struct msl_dim { unsigned x; };
static msl_dim gridDim = {1}, blockDim = {1}, blockIdx = {0}, threadIdx = {0};
#define __global__
#define __device__
static inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
static inline int __float_as_int(float f) { int i; memcpy(&i, &f, 4); return i; }
static inline double __longlong_as_double(long long i) { double d; memcpy(&d, &i, 8); return d; }
"#;

/// The file name of NVRTC's library in the wheel and in CUDA 12 toolkits.
const NVRTC_LIB: &str = "libnvrtc.so.12";

/// Where NVRTC may be, in the order tried.
pub fn nvrtc_candidates() -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Some(p) = std::env::var_os("MSL_NVRTC").map(PathBuf::from) {
        out.push(if p.is_dir() { p.join(NVRTC_LIB) } else { p });
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")));
    if let Some(c) = cache {
        out.push(c.join("msl/nvrtc/nvidia/cuda_nvrtc/lib").join(NVRTC_LIB));
    }
    out
}

/// Loads NVRTC once per process; the error says where it was looked for.
pub fn load_nvrtc() -> Result<(), String> {
    static LOADED: OnceLock<Result<(), String>> = OnceLock::new();
    LOADED
        .get_or_init(|| {
            let candidates = nvrtc_candidates();
            if let Some(p) = candidates.iter().find(|p| p.is_file()) {
                // SAFETY: loading NVRTC runs its initialisers, which have no preconditions.
                match unsafe { libloading::Library::new(p) } {
                    // Kept loaded for the life of the process; cudarc finds it by its name.
                    Ok(lib) => std::mem::forget(lib),
                    Err(e) => return Err(format!("NVRTC at {} could not be loaded: {e}", p.display())),
                }
            }
            // SAFETY: only tries to open the library by its candidate names.
            if unsafe { nv::is_culib_present() } {
                Ok(())
            } else {
                let tried: Vec<String> = candidates.iter().map(|p| p.display().to_string()).collect();
                Err(format!(
                    "NVRTC not found (looked at {} and the system's libnvrtc.so; `bash scripts/setup.sh` installs it)",
                    tried.join(", ")
                ))
            }
        })
        .clone()
}

/// NVRTC's version, (major, minor).
pub fn nvrtc_version() -> Result<(i32, i32), String> {
    load_nvrtc()?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: NVRTC is loaded; the two out-pointers are valid.
    check(unsafe { nv::nvrtcVersion(&mut major, &mut minor) }, "nvrtcVersion")?;
    Ok((major, minor))
}

fn check(r: nv::nvrtcResult, what: &str) -> Result<(), String> {
    if r == nv::nvrtcResult::NVRTC_SUCCESS {
        Ok(())
    } else {
        Err(format!("{what} failed: {r:?}"))
    }
}

/// Compiles CUDA C `src` to a CUBIN for `arch` (`"sm_90"`) with the extra NVRTC `options`; the
/// error holds NVRTC's log. Needs no GPU.
pub fn compile_cubin(src: &str, arch: &str, options: &[&str]) -> Result<Vec<u8>, String> {
    load_nvrtc()?;
    let c_src = CString::new(src).map_err(|_| "kernel source holds a NUL byte".to_string())?;
    let name = CString::new("msl_kernel.cu").expect("no NUL");
    let mut opts: Vec<CString> = vec![CString::new(format!("--gpu-architecture={arch}")).map_err(|e| e.to_string())?];
    for o in options {
        opts.push(CString::new(*o).map_err(|e| e.to_string())?);
    }
    let ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
    let mut prog: nv::nvrtcProgram = std::ptr::null_mut();
    // SAFETY: NVRTC is loaded; every pointer is to a live NUL-terminated string or null, and
    // `prog` is destroyed below on every path.
    unsafe {
        check(
            nv::nvrtcCreateProgram(&mut prog, c_src.as_ptr(), name.as_ptr(), 0, std::ptr::null(), std::ptr::null()),
            "nvrtcCreateProgram",
        )?;
        let compiled = nv::nvrtcCompileProgram(prog, ptrs.len() as i32, ptrs.as_ptr());
        let result = if compiled == nv::nvrtcResult::NVRTC_SUCCESS {
            let mut size = 0usize;
            check(nv::nvrtcGetCUBINSize(prog, &mut size), "nvrtcGetCUBINSize").and_then(|()| {
                let mut buf = vec![0u8; size];
                check(nv::nvrtcGetCUBIN(prog, buf.as_mut_ptr() as *mut c_char), "nvrtcGetCUBIN").map(|()| buf)
            })
        } else {
            let mut size = 0usize;
            let log = if nv::nvrtcGetProgramLogSize(prog, &mut size) == nv::nvrtcResult::NVRTC_SUCCESS && size > 0 {
                let mut buf = vec![0u8; size];
                let _ = nv::nvrtcGetProgramLog(prog, buf.as_mut_ptr() as *mut c_char);
                CStr::from_bytes_until_nul(&buf).map(|s| s.to_string_lossy().into_owned()).unwrap_or_default()
            } else {
                String::new()
            };
            Err(format!("NVRTC could not compile the kernel ({compiled:?}):\n{log}"))
        };
        let _ = nv::nvrtcDestroyProgram(&mut prog);
        result
    }
}

/// Whether the CUDA driver library (`libcuda.so`) can be loaded on this machine.
pub fn driver_present() -> bool {
    // SAFETY: only tries to open the library by its candidate names.
    unsafe { cudarc::driver::sys::is_culib_present() }
}
