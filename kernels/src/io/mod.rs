//! Loading and saving tensors: `.npy`, `.npz`, `.safetensors`, numeric `.csv` and `.txt` bytes.
//!
//! Every error names the file. No file content, however corrupt, makes a loader panic, hang or
//! allocate more than the file could fill: only regular files are read (`file`), and every
//! length a header declares is checked against the file before it is used. Saves are atomic.

pub mod checkpoint;
pub mod csv;
pub mod file;
pub mod npy;
pub mod npz;
pub mod safetensors;
pub mod text;

use std::path::Path;

use crate::error::{shape_string, KernelError};
use crate::tensor::{DType, Storage, Tensor};

/// The lower-case extension of `path`, or an error naming the supported ones.
fn extension(path: &Path) -> Result<String, KernelError> {
    path.extension()
        .and_then(|e| e.to_str())
        .map(|e| e.to_ascii_lowercase())
        .ok_or_else(|| KernelError::io(path, "unknown file type (expected .npy, .npz, .safetensors, .csv or .txt)"))
}

/// Loads one tensor, choosing the format by extension: `.npy`; `.npz` with `entry` naming an
/// array (optional when the archive holds one); `.safetensors` with `entry` naming a tensor
/// (optional when the file holds one); `.csv` as an f64 `[rows, cols]` tensor; `.txt` as the
/// `i32` vector of its bytes.
pub fn load(path: &Path, entry: Option<&str>) -> Result<Tensor, KernelError> {
    let ext = extension(path)?;
    if entry.is_some() && matches!(ext.as_str(), "npy" | "csv" | "txt") {
        return Err(KernelError::io(path, format!("a .{ext} file holds one array, so it has no entry names")));
    }
    match ext.as_str() {
        "npy" => npy::read_npy(path),
        "npz" => npz::read_npz(path, entry),
        "safetensors" => safetensors::read_safetensors_entry(path, entry),
        "csv" => csv::read_csv(path),
        "txt" => text::read_text(path),
        other => Err(KernelError::io(
            path,
            format!("unknown file type '.{other}' (expected .npy, .npz, .safetensors, .csv or .txt)"),
        )),
    }
}

/// The shape of the tensor [`load`] would read, from the file's header alone (`msl dryrun`):
/// `.npy`, `.npz` (the member's header) and `.safetensors` (the JSON header); `None` for a
/// `.csv` file, whose rows are known only by reading it.
pub fn shape_of(path: &Path, entry: Option<&str>) -> Result<Option<Vec<usize>>, KernelError> {
    match extension(path)?.as_str() {
        "npy" => {
            let (mut f, len) = file::open_file(path)?;
            npy::header_shape(&mut f, len, &path.display().to_string()).map(Some)
        }
        "npz" => npz::npz_shape(path, entry).map(Some),
        "safetensors" => safetensors::entry_shape(path, entry).map(Some),
        "txt" => Ok(Some(vec![file::open_file(path)?.1 as usize])),
        _ => Ok(None),
    }
}

/// Loads a `.csv` file as a `[rows, cols]` tensor of `dtype`: text numbers take the element
/// type the program asks for, and a value that type cannot hold exactly is an error naming its
/// row and column (see [`csv::parse_csv_as`]).
pub fn load_csv(path: &Path, dtype: DType) -> Result<Tensor, KernelError> {
    csv::read_csv_as(path, dtype)
}

/// Every tensor of a `.safetensors` file with its name, in file order.
pub fn load_all_safetensors(path: &Path) -> Result<Vec<(String, Tensor)>, KernelError> {
    safetensors::read_safetensors(path)
}

/// Every array of a `.npz` archive with its name, in archive order.
pub fn load_all_npz(path: &Path) -> Result<Vec<(String, Tensor)>, KernelError> {
    npz::read_all_npz(path)
}

/// A loaded tensor as a program that wants `want` reads it: a file's `bf16` or `f16` values
/// widen (exactly) to a wanted `f32` or `f64`; anything else is as the file holds it.
pub fn widen_loaded(t: Tensor, want: DType) -> Tensor {
    if t.dtype().is_half() && matches!(want, DType::F32 | DType::F64) {
        t.cast(want)
    } else {
        t
    }
}

/// Checks a loaded tensor against the element type and shape a program declares for it, so
/// that a wrong file is reported as a [`KernelError::FileMismatch`] naming the file, e.g.
/// "data/x.npy: expected f32 [1797, 64] but the file holds f64 [1797, 65]". `None` skips
/// that part of the check.
pub fn check_loaded(path: &Path, t: &Tensor, dtype: Option<DType>, shape: Option<&[usize]>) -> Result<(), KernelError> {
    let dtype_ok = dtype.is_none_or(|d| d == t.dtype());
    let shape_ok = shape.is_none_or(|s| s == t.shape());
    if dtype_ok && shape_ok {
        return Ok(());
    }
    let want_dtype = dtype.unwrap_or(t.dtype());
    let want_shape = shape.unwrap_or(t.shape());
    Err(KernelError::FileMismatch {
        path: path.display().to_string(),
        expected: format!("{want_dtype} {}", shape_string(want_shape)),
        found: format!("{} {}", t.dtype(), shape_string(t.shape())),
    })
}

/// Saves one tensor, choosing the format by extension: `.npy`; `.npz` and `.safetensors`
/// (one array named `"value"`); `.csv` (rank at most 2); `.txt` (an `i32` vector of bytes).
pub fn save(path: &Path, t: &Tensor) -> Result<(), KernelError> {
    match extension(path)?.as_str() {
        "npy" => npy::write_npy(path, t),
        "npz" => npz::write_npz(path, &[("value".to_string(), t.clone())]),
        "safetensors" => safetensors::write_safetensors(path, &[("value".to_string(), t.clone())]),
        "csv" => csv::write_csv(path, t),
        "txt" => text::write_text(path, t),
        other => Err(KernelError::io(
            path,
            format!("unknown file type '.{other}' (expected .npy, .npz, .safetensors, .csv or .txt)"),
        )),
    }
}

/// Saves named tensors, in the given order, as a `.safetensors` file that the Python
/// `safetensors` package loads.
pub fn save_safetensors(path: &Path, named: &[(String, Tensor)]) -> Result<(), KernelError> {
    safetensors::write_safetensors(path, named)
}

/// Saves named tensors as `.safetensors`, the `i32` ones named in `int8` as `I8`.
pub fn save_safetensors_int8(
    path: &Path,
    named: &[(String, Tensor)],
    int8: &std::collections::HashSet<String>,
) -> Result<(), KernelError> {
    safetensors::write_safetensors_narrowed(path, named, int8)
}

/// Saves named tensors as an uncompressed `.npz` archive.
pub fn save_npz(path: &Path, named: &[(String, Tensor)]) -> Result<(), KernelError> {
    npz::write_npz(path, named)
}

/// Text taken from a file, made safe to print inside a message: control characters (a newline,
/// a terminal escape) and quotes are escaped as in Rust string literals.
pub(crate) fn shown(text: &str) -> String {
    text.escape_debug().to_string()
}

/// Appends the elements of `t` as little-endian bytes (bool as one byte 0 or 1); on a
/// little-endian machine, copies of the tensor's own memory.
pub fn push_le_data(out: &mut Vec<u8>, t: &Tensor) {
    out.reserve(t.nbytes());
    // Writing into a `Vec` cannot fail.
    let _ = for_le_chunks(t, |b| {
        out.extend_from_slice(b);
        Ok(())
    });
}

/// The tensor of `dtype` and `shape` whose elements are `bytes`, little-endian (bool one byte
/// each, nonzero true), as [`push_le_data`] writes them; an error unless `bytes` holds exactly
/// that many elements. On a little-endian machine the bytes are copied into place at once.
pub fn tensor_from_le(dtype: DType, shape: Vec<usize>, bytes: &[u8]) -> Result<Tensor, KernelError> {
    let n = crate::tensor::checked_numel(&shape)?;
    if n.checked_mul(dtype.size_in_bytes()) != Some(bytes.len()) {
        return Err(KernelError::Invalid(format!("{} bytes do not hold {} {} elements", bytes.len(), n, dtype.name())));
    }
    macro_rules! words {
        ($t:ty, $zero:expr) => {{
            let mut v: Vec<$t> = vec![$zero; n];
            #[cfg(target_endian = "little")]
            bytemuck::cast_slice_mut::<$t, u8>(&mut v).copy_from_slice(bytes);
            #[cfg(not(target_endian = "little"))]
            for (x, b) in v.iter_mut().zip(bytes.chunks_exact(std::mem::size_of::<$t>())) {
                *x = <$t>::from_le_bytes(b.try_into().unwrap_or_default());
            }
            Tensor::from_vec(shape, v)
        }};
    }
    match dtype {
        DType::F32 => words!(f32, 0.0),
        DType::F64 => words!(f64, 0.0),
        DType::I32 => words!(i32, 0),
        DType::Bf16 => words!(half::bf16, half::bf16::ZERO),
        DType::F16 => words!(half::f16, half::f16::ZERO),
        DType::Bool => Tensor::from_vec(shape, bytes.iter().map(|&b| b != 0).collect::<Vec<bool>>()),
    }
}

/// Elements per piece in [`for_le_chunks`]: 256 KiB of `f32`, so that a piece handed to a
/// checksum and then to `write` is still in the cache the second time.
const PIECE: usize = 1 << 16;

/// Hands the little-endian bytes of `t` to `f` in pieces (see [`PIECE`]), so that a large
/// tensor is written without a second copy of it in memory. On a little-endian machine the
/// pieces are the tensor's own memory.
pub(crate) fn for_le_chunks(t: &Tensor, mut f: impl FnMut(&[u8]) -> std::io::Result<()>) -> std::io::Result<()> {
    macro_rules! pieces {
        ($v:expr) => {{
            #[cfg(target_endian = "little")]
            for c in $v.chunks(PIECE) {
                f(bytemuck::cast_slice(c))?;
            }
            #[cfg(not(target_endian = "little"))]
            {
                let mut buf = Vec::with_capacity(PIECE * 8);
                for c in $v.chunks(PIECE) {
                    buf.clear();
                    c.iter().for_each(|x| buf.extend_from_slice(&x.to_le_bytes()));
                    f(&buf)?;
                }
            }
        }};
    }
    match t.storage() {
        Storage::F32(v) => pieces!(v),
        Storage::F64(v) => pieces!(v),
        Storage::I32(v) => pieces!(v),
        Storage::Bf16(v) => pieces!(v),
        Storage::F16(v) => pieces!(v),
        Storage::Bool(v) => {
            let mut buf = Vec::with_capacity(PIECE);
            for c in v.chunks(PIECE) {
                buf.clear();
                buf.extend(c.iter().map(|&b| u8::from(b)));
                f(&buf)?;
            }
        }
    }
    Ok(())
}
