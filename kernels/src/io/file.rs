//! Opening data files safely: reads refuse anything but a regular file and never read more
//! than the file holds; writes are atomic and never follow a link or open a special file.
//!
//! Reading a FIFO blocks until something writes to it, and a link to `/dev/zero` never ends,
//! so a path is checked with `metadata` before it is opened, and opened without blocking
//! (`O_NONBLOCK` has no effect on a regular file but stops a FIFO swapped in after the check
//! from blocking the open), then checked again on the open file. Reads are bounded by the
//! length the open file reports, so a lying header cannot make a loader allocate more than the
//! file could fill.
//!
//! A save writes a fresh temporary file in the target's folder, flushes it to disk, renames it
//! over the target and flushes the folder: a crash at any moment leaves either the old file or
//! the new one, complete, and at worst a stray temporary file beside it. A target that exists
//! and is not a regular file (a symbolic link, a FIFO, a directory, a device) is refused, and
//! the rename replaces a link swapped in after that check rather than writing through it.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::KernelError;

/// What a non-regular file is, for messages.
fn kind_of(ft: std::fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if ft.is_fifo() {
            return "a FIFO";
        }
        if ft.is_socket() {
            return "a socket";
        }
        if ft.is_block_device() || ft.is_char_device() {
            return "a device";
        }
    }
    if ft.is_symlink() {
        "a symbolic link"
    } else if ft.is_dir() {
        "a directory"
    } else {
        "not a regular file"
    }
}

fn not_regular(ft: std::fs::FileType) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, format!("not a regular file ({})", kind_of(ft)))
}

/// Opens `path` for reading when it is (or links to) a regular file, with its length.
pub fn open_regular(path: &Path) -> io::Result<(File, u64)> {
    let meta = std::fs::metadata(path)?;
    if !meta.is_file() {
        return Err(not_regular(meta.file_type()));
    }
    let mut options = OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        options.custom_flags(libc::O_NONBLOCK);
    }
    let file = options.open(path)?;
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(not_regular(meta.file_type()));
    }
    Ok((file, meta.len()))
}

/// Reads at most `limit` bytes of `r` into a vector that grows as data arrives (so that a
/// declared length, which may lie, never decides an allocation by itself).
pub fn read_at_most(r: &mut impl Read, limit: u64) -> io::Result<Vec<u8>> {
    let mut out = Vec::with_capacity(usize::try_from(limit.min(1 << 20)).unwrap_or(0));
    r.take(limit).read_to_end(&mut out)?;
    Ok(out)
}

/// The whole content of a regular file, read no further than the length it had when opened.
pub fn read_regular(path: &Path) -> io::Result<Vec<u8>> {
    let (mut file, len) = open_regular(path)?;
    let mut out = Vec::with_capacity(usize::try_from(len).map_err(|_| io::Error::other("file too large"))?);
    (&mut file).take(len).read_to_end(&mut out)?;
    Ok(out)
}

/// [`read_regular`] as text: what `std::fs::read_to_string` does, without blocking on a FIFO
/// or reading a device forever. Source files (the REPL's `:load`) are read through it.
pub fn read_to_string(path: &Path) -> io::Result<String> {
    String::from_utf8(read_regular(path)?)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "stream did not contain valid UTF-8"))
}

/// [`read_regular`] with the error in loader form ("cannot read: …", naming the file).
pub(crate) fn read_file(path: &Path) -> Result<Vec<u8>, KernelError> {
    read_regular(path).map_err(|e| KernelError::io(path, format!("cannot read: {e}")))
}

/// [`open_regular`] with the error in loader form.
pub(crate) fn open_file(path: &Path) -> Result<(File, u64), KernelError> {
    open_regular(path).map_err(|e| KernelError::io(path, format!("cannot read: {e}")))
}

/// A name for a temporary file beside `path` that no other writer uses: the process id and a
/// counter, and `create_new` refuses a name that exists anyway.
fn temp_path(path: &Path) -> PathBuf {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    path.with_file_name(format!(".{name}.{}.{n}.tmp", std::process::id()))
}

/// A temporary file being written beside its target: removed when dropped unless
/// [`TempFile::commit`] renamed it into place.
pub(crate) struct TempFile {
    file: File,
    /// Where the file is while it is temporary; `None` once committed.
    path: Option<PathBuf>,
}

impl TempFile {
    /// A fresh temporary file in the folder of `target`, named after it (`.NAME.PID.N.tmp`).
    pub(crate) fn beside(target: &Path) -> io::Result<TempFile> {
        if target.file_name().is_none() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "the path names no file"));
        }
        let mut tmp = temp_path(target);
        for _ in 0..16 {
            match OpenOptions::new().write(true).create_new(true).open(&tmp) {
                Ok(file) => return Ok(TempFile { file, path: Some(tmp) }),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => tmp = temp_path(target),
                Err(e) => return Err(e),
            }
        }
        Err(io::Error::other("no free temporary file name"))
    }

    /// The open file.
    pub(crate) fn file(&mut self) -> &mut File {
        &mut self.file
    }

    /// Flushes the file to disk and renames it to `target` (in the same folder), replacing
    /// what was there. The folder itself is not synced (see [`sync_folder`]).
    pub(crate) fn commit(&mut self, target: &Path) -> io::Result<()> {
        let Some(path) = &self.path else {
            return Err(io::Error::other("the temporary file was committed already"));
        };
        self.file.flush()?;
        self.file.sync_all()?;
        std::fs::rename(path, target)?;
        self.path = None;
        Ok(())
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if let Some(p) = self.path.take() {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Writes a file atomically: `write` fills a new temporary file in the same folder, which is
/// synced, renamed over `path` and followed by a sync of the folder. On any failure the
/// temporary file is removed and `path` is untouched. An existing `path` must be a regular
/// file; its permissions carry over to the new one.
pub fn write_atomic(path: &Path, write: impl FnOnce(&mut File) -> io::Result<()>) -> Result<(), KernelError> {
    let fail = |e: io::Error| KernelError::io(path, format!("cannot write: {e}"));
    let existing = match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_file() => Some(m.permissions()),
        Ok(m) => return Err(fail(not_regular(m.file_type()))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err(fail(e)),
    };
    let mut tmp = TempFile::beside(path).map_err(fail)?;
    if let Some(p) = existing {
        tmp.file().set_permissions(p).map_err(fail)?;
    }
    write(tmp.file()).map_err(fail)?;
    tmp.commit(path).map_err(fail)?;
    sync_folder(path).map_err(fail)
}

/// Flushes the folder holding `path` so that the rename itself survives a power cut.
pub(crate) fn sync_folder(path: &Path) -> io::Result<()> {
    #[cfg(unix)]
    {
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        File::open(dir)?.sync_all()?;
    }
    #[cfg(not(unix))]
    let _ = path;
    Ok(())
}

/// [`write_atomic`] of bytes already in memory.
pub(crate) fn write_bytes(path: &Path, bytes: &[u8]) -> Result<(), KernelError> {
    write_atomic(path, |f| f.write_all(bytes))
}
