//! NumPy `.npz` archives: zip files of `.npy` members, stored or deflated.
//!
//! A member is read as a stream: its `.npy` header is decoded and checked against the size
//! the archive declares for the member before the data is decompressed, and decompression
//! stops at the size the header gives, so a lying archive cannot make msl inflate or allocate
//! more than the header of the array it asked for describes.

use std::io::{Read, Write};
use std::path::Path;

use crate::error::KernelError;
use crate::io::npy::{npy_bytes, read_npy_from};
use crate::tensor::Tensor;

type Archive = zip::ZipArchive<std::fs::File>;

fn open(path: &Path) -> Result<(Archive, Vec<String>), KernelError> {
    let (file, _) = super::file::open_file(path)?;
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
    let label = format!("{}:{}", path.display(), super::shown(array_name(member)));
    let fail = |m: String| KernelError::Io { path: label.clone(), message: m };
    let mut f = archive.by_name(member).map_err(|e| fail(format!("cannot open archive member: {e}")))?;
    let declared = f.size();
    let t = read_npy_from(&mut f, declared, false, &label).map_err(|e| match e {
        // A stream error inside the member is corruption of the archive, not of the array.
        KernelError::Io { message, .. } if message.starts_with("cannot read: ") => {
            fail(format!("corrupt archive member: {}", &message["cannot read: ".len()..]))
        }
        other => other,
    })?;
    // NumPy writes nothing after the data; reading on to the end lets the zip reader check
    // the member's checksum, and anything more than a byte there is refused unread.
    let mut rest = Vec::new();
    (&mut f).take(1).read_to_end(&mut rest).map_err(|e| fail(format!("corrupt archive member: {e}")))?;
    if !rest.is_empty() {
        return Err(fail("corrupt archive member: it holds more bytes than its array header describes".into()));
    }
    Ok(t)
}

/// Reads one array of a `.npz` archive. `entry` may be omitted when the archive holds one
/// array; otherwise the error lists the names it holds.
pub fn read_npz(path: &Path, entry: Option<&str>) -> Result<Tensor, KernelError> {
    let (mut archive, members) = open(path)?;
    let member = choose(path, &members, entry)?;
    read_member(&mut archive, path, &member)
}

/// The shape of one array of a `.npz` archive (chosen as [`read_npz`] chooses it), from its
/// header alone: only the start of the member is decompressed (`msl dryrun`).
pub fn npz_shape(path: &Path, entry: Option<&str>) -> Result<Vec<usize>, KernelError> {
    let (mut archive, members) = open(path)?;
    let member = choose(path, &members, entry)?;
    let label = format!("{}:{}", path.display(), super::shown(array_name(&member)));
    let mut f = archive
        .by_name(&member)
        .map_err(|e| KernelError::Io { path: label.clone(), message: format!("cannot open archive member: {e}") })?;
    let declared = f.size();
    super::npy::header_shape(&mut f, declared, &label)
}

/// The member holding array `entry`, or the only one; otherwise the error lists the names.
fn choose(path: &Path, members: &[String], entry: Option<&str>) -> Result<String, KernelError> {
    let listing = || {
        let names: Vec<String> = members.iter().map(|m| super::shown(array_name(m))).collect();
        names.join(", ")
    };
    match entry {
        Some(e) => {
            members.iter().find(|m| m.as_str() == e || array_name(m) == e).cloned().ok_or_else(|| {
                KernelError::io(path, format!("no array named '{e}' (the archive holds: {})", listing()))
            })
        }
        None => match members.len() {
            0 => Err(KernelError::io(path, "the archive holds no arrays")),
            1 => Ok(members[0].clone()),
            _ => Err(KernelError::io(
                path,
                format!("the archive holds several arrays ({}); name the one to load", listing()),
            )),
        },
    }
}

/// Reads every array of a `.npz` archive, in archive order.
pub fn read_all_npz(path: &Path) -> Result<Vec<(String, Tensor)>, KernelError> {
    let (mut archive, members) = open(path)?;
    members.iter().map(|m| Ok((array_name(m).to_string(), read_member(&mut archive, path, m)?))).collect()
}

/// Writes named tensors as an uncompressed `.npz` archive (like `numpy.savez`), atomically.
pub fn write_npz(path: &Path, named: &[(String, Tensor)]) -> Result<(), KernelError> {
    super::file::write_atomic(path, |file| {
        let mut zip = zip::ZipWriter::new(file);
        let options = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Stored)
            .large_file(true);
        for (name, t) in named {
            zip.start_file(format!("{name}.npy"), options).map_err(std::io::Error::other)?;
            zip.write_all(&npy_bytes(t))?;
        }
        zip.finish().map_err(std::io::Error::other)?;
        Ok(())
    })
}
