//! NumPy `.npz` archives: zip files of `.npy` members, stored or deflated.

use std::io::{Read, Write};
use std::path::Path;

use crate::error::KernelError;
use crate::io::npy::{npy_bytes, parse_npy};
use crate::tensor::Tensor;

type Archive = zip::ZipArchive<std::fs::File>;

fn open(path: &Path) -> Result<(Archive, Vec<String>), KernelError> {
    let file = std::fs::File::open(path).map_err(|e| KernelError::io(path, format!("cannot read: {e}")))?;
    let archive = zip::ZipArchive::new(file)
        .map_err(|e| KernelError::io(path, format!("not a .npz file (not a valid zip archive: {e})")))?;
    let names = archive
        .file_names()
        .map(|n| n.map(|n| n.into_owned()))
        .collect::<Result<Vec<String>, _>>()
        .map_err(|e| KernelError::io(path, format!("corrupt .npz archive: {e}")))?;
    Ok((archive, names))
}

/// The array name of a member (`"x.npy"` holds the array `"x"`).
fn array_name(member: &str) -> &str {
    member.strip_suffix(".npy").unwrap_or(member)
}

fn read_member(archive: &mut Archive, path: &Path, member: &str) -> Result<Tensor, KernelError> {
    let label = format!("{}:{}", path.display(), array_name(member));
    let mut f = archive
        .by_name(member)
        .map_err(|e| KernelError::Io { path: label.clone(), message: format!("cannot open archive member: {e}") })?;
    let mut bytes = Vec::new();
    f.read_to_end(&mut bytes)
        .map_err(|e| KernelError::Io { path: label.clone(), message: format!("corrupt archive member: {e}") })?;
    parse_npy(&bytes, &label)
}

/// Reads one array of a `.npz` archive. `entry` may be omitted when the archive holds one
/// array; otherwise the error lists the names it holds.
pub fn read_npz(path: &Path, entry: Option<&str>) -> Result<Tensor, KernelError> {
    let (mut archive, members) = open(path)?;
    let listing = || {
        let names: Vec<&str> = members.iter().map(|m| array_name(m)).collect();
        names.join(", ")
    };
    let member =
        match entry {
            Some(e) => members.iter().find(|m| m.as_str() == e || array_name(m) == e).cloned().ok_or_else(|| {
                KernelError::io(path, format!("no array named '{e}' (the archive holds: {})", listing()))
            })?,
            None => match members.len() {
                0 => return Err(KernelError::io(path, "the archive holds no arrays")),
                1 => members[0].clone(),
                _ => {
                    return Err(KernelError::io(
                        path,
                        format!("the archive holds several arrays ({}); name the one to load", listing()),
                    ))
                }
            },
        };
    read_member(&mut archive, path, &member)
}

/// Reads every array of a `.npz` archive, in archive order.
pub fn read_all_npz(path: &Path) -> Result<Vec<(String, Tensor)>, KernelError> {
    let (mut archive, members) = open(path)?;
    members.iter().map(|m| Ok((array_name(m).to_string(), read_member(&mut archive, path, m)?))).collect()
}

/// Writes named tensors as an uncompressed `.npz` archive (like `numpy.savez`).
pub fn write_npz(path: &Path, named: &[(String, Tensor)]) -> Result<(), KernelError> {
    let fail = |e: &dyn std::fmt::Display| KernelError::io(path, format!("cannot write: {e}"));
    let file = std::fs::File::create(path).map_err(|e| fail(&e))?;
    let mut zip = zip::ZipWriter::new(file);
    let options =
        zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored).large_file(true);
    for (name, t) in named {
        zip.start_file(format!("{name}.npy"), options).map_err(|e| fail(&e))?;
        zip.write_all(&npy_bytes(t)).map_err(|e| fail(&e))?;
    }
    zip.finish().map_err(|e| fail(&e))?;
    Ok(())
}
