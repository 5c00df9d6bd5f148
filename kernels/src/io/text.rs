//! Text files as bytes: a `.txt` file loads as an `i32[N]` vector of its bytes (0 to 255), and an
//! integer vector saves back as those bytes, so a character-level model reads and writes text.

use std::io::Write;
use std::path::Path;

use crate::error::KernelError;
use crate::tensor::{Storage, Tensor};

/// Every byte of the file, in order, as an `i32` vector.
pub fn read_text(path: &Path) -> Result<Tensor, KernelError> {
    let bytes = super::file::read_file(path)?;
    let v: Vec<i32> = bytes.iter().map(|&b| i32::from(b)).collect();
    Ok(Tensor::from_parts(vec![v.len()], v))
}

/// The bytes an integer vector stands for; a value outside 0 to 255 is an error naming its
/// position (nothing is written then).
pub fn text_bytes(path: &Path, t: &Tensor) -> Result<Vec<u8>, KernelError> {
    if t.rank() != 1 {
        return Err(KernelError::io(
            path,
            format!("a text file holds a vector of bytes, not a rank-{} tensor", t.rank()),
        ));
    }
    let Storage::I32(v) = t.storage() else {
        return Err(KernelError::io(path, format!("a text file holds i32 bytes, not {}", t.dtype())));
    };
    v.iter()
        .enumerate()
        .map(|(i, &x)| {
            u8::try_from(x)
                .map_err(|_| KernelError::io(path, format!("value {x} at position {i} is not a byte (0 to 255)")))
        })
        .collect()
}

/// Writes an integer vector as the bytes it holds, atomically (see [`text_bytes`]).
pub fn write_text(path: &Path, t: &Tensor) -> Result<(), KernelError> {
    let bytes = text_bytes(path, t)?;
    super::file::write_atomic(path, |f| f.write_all(&bytes))
}
