//! Checkpoints: a folder holding one `.safetensors` file per rank and an index, `index.json`,
//! that names every tensor with its global shape, element type and layout over the mesh, and
//! says where each of its shards lies (file, position in the global tensor, byte range and
//! CRC-32 of its bytes, and of each [`CHUNK`] of them when it is longer, so that a reader that
//! needs some rows of a shard reads and checks only the pieces holding them).
//!
//! A single process writes one file, `rank0.<crc>.safetensors`, with every tensor whole (the
//! replicated layout, no mesh). The index already has room for a sharded save: a `mesh`, a
//! layout per tensor (for each dim, the mesh axes that split it) and several shards per
//! tensor, one in each rank's file; [`read_checkpoint`] assembles a tensor from any set of
//! shards that tiles it, so a reader needs nothing new when writers shard.
//!
//! **Atomic.** The data file is written to a temporary file in the folder, synced and renamed to
//! a name made from the CRC-32 of its content; then the index is written the same way, last.
//! The index names the data file it describes, so until the new index replaces the old one the
//! old index still names the old data file, which is removed only after that (with temporary
//! files that dead processes left behind). A `kill -9` at any moment leaves the earlier complete
//! checkpoint or the new one; a folder with data but no index is an incomplete checkpoint and is
//! reported as such. A fixed data file name would not do: the new data could replace the old
//! while the old index still describes it.
//!
//! **Deterministic.** The same tensors give the same bytes: the order is the caller's, the
//! index has no time stamps, and the data file's name comes from its content.

use std::collections::HashMap;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::file::{open_regular, read_regular, sync_folder, write_atomic, TempFile};
use crate::error::{shape_string, KernelError};
use crate::tensor::{checked_numel, DType, Element, Tensor};

/// The name of the index file in a checkpoint folder.
pub const INDEX: &str = "index.json";
/// What the index's `format` field holds.
pub const FORMAT: &str = "msl-checkpoint";
/// The version of the index format this code writes and reads.
pub const VERSION: u32 = 1;
/// At most this many shards per tensor are accepted from an index (shards are checked pairwise).
const MAX_SHARDS: usize = 4096;

/// The content of `index.json`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Index {
    /// Always [`FORMAT`].
    pub format: String,
    /// The format version, [`VERSION`] for what this code writes.
    pub version: u32,
    /// The mesh the checkpoint was saved from: its axes in declaration order; `None` (JSON
    /// `null`) for a single process.
    pub mesh: Option<Vec<MeshAxis>>,
    /// The data files, one per rank that holds shards.
    pub files: Vec<FileEntry>,
    /// Every tensor, in the order of the saved value's fields.
    pub tensors: Vec<TensorEntry>,
}

/// One axis of the mesh a checkpoint was saved from.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct MeshAxis {
    pub name: String,
    pub size: usize,
}

/// One data file of a checkpoint.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct FileEntry {
    /// The file's name in the checkpoint folder.
    pub name: String,
    /// The rank that wrote it.
    pub rank: usize,
    /// Its length in bytes.
    pub size: u64,
    /// The CRC-32 of its safetensors header (the 8-byte length and the JSON after it), which
    /// msl does not read but Python does.
    pub header_crc32: u32,
}

/// One tensor of a checkpoint.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct TensorEntry {
    /// The dotted name (`0.l1.w`), which is also its name in the data files.
    pub name: String,
    /// The element type, as safetensors spells it (`F32`, `F64`, `I32`, `BOOL`).
    pub dtype: String,
    /// The global shape.
    pub shape: Vec<usize>,
    /// For each dim, the mesh axes that split it, outer first; all empty when replicated.
    pub layout: Vec<Vec<String>>,
    /// Where its elements are: shards that together tile the global tensor.
    pub shards: Vec<Shard>,
}

/// A block of a tensor stored in one data file.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
pub struct Shard {
    /// The index of its file in [`Index::files`].
    pub file: usize,
    /// The block's first element in the global tensor, per dim.
    pub start: Vec<usize>,
    /// The block's shape.
    pub shape: Vec<usize>,
    /// Its bytes in the file (from the start of the file), row-major, little endian.
    pub bytes: [u64; 2],
    /// The CRC-32 (IEEE) of those bytes.
    pub crc32: u32,
    /// For a shard longer than [`CHUNK`] bytes: the length of the pieces its bytes are cut
    /// into (`chunk`), and the CRC-32 of each piece in order (`chunk_crc32`, the last piece
    /// shorter), so that a reader that needs only some rows of the shard reads and checks only
    /// the pieces that hold them. Absent (JSON: no such fields) for shorter shards, whose one
    /// piece is the whole shard, and in checkpoints written before these fields existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chunk: Option<u64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub chunk_crc32: Vec<u32>,
}

/// The length of the checksummed pieces of a long shard: 1 MiB (a multiple of every element
/// size), so a rank that reads only its rows reads at most 1 MiB more at each end.
pub const CHUNK: u64 = 1 << 20;

/// What a program expects of one tensor it loads from a checkpoint: its name, element type and
/// global shape, where `None` is a dim bound at run time (any size; the caller checks it).
/// Consecutive tensors of one element type with the same `group` are read into one buffer, one
/// after another (the interpreter holds a model's parameters so), each a view of it.
#[derive(Clone, Debug)]
pub struct Wanted {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<Option<usize>>,
    pub group: Option<usize>,
    /// Only this block of the global tensor (its first element per dim, and its shape): a rank
    /// of a sharded run reads the shards that overlap its block and keeps the overlap. `None`
    /// reads the whole tensor.
    pub region: Option<(Vec<usize>, Vec<usize>)>,
}

impl Wanted {
    fn accepts(&self, dtype: DType, shape: &[usize]) -> bool {
        dtype == self.dtype
            && shape.len() == self.shape.len()
            && shape.iter().zip(&self.shape).all(|(d, w)| w.is_none_or(|w| w == *d))
    }

    /// The expected shape as messages write it, `_` for a dim of any size.
    fn shape_text(&self) -> String {
        let parts: Vec<String> = self.shape.iter().map(|d| d.map_or("_".to_string(), |d| d.to_string())).collect();
        format!("[{}]", parts.join(", "))
    }
}

/// True when `dir` holds a complete checkpoint: its index is a regular file.
pub fn is_complete(dir: &Path) -> bool {
    std::fs::metadata(dir.join(INDEX)).is_ok_and(|m| m.is_file())
}

/// Writes `named` (distinct names, in this order) as a checkpoint in the folder `dir`,
/// creating the folder if needed and replacing a checkpoint that is there, atomically.
pub fn write_checkpoint(dir: &Path, named: &[(String, Tensor)]) -> Result<(), KernelError> {
    let fail = |e: io::Error| KernelError::io(dir, format!("cannot write the checkpoint: {e}"));
    prepare_folder(dir).map_err(fail)?;
    let (file, shards) = write_data_file(dir, 0, named)?;
    let tensors = named
        .iter()
        .zip(shards)
        .map(|((name, t), shard)| TensorEntry {
            name: name.clone(),
            dtype: super::safetensors::dtype_name(t.dtype()).to_string(),
            shape: t.shape().to_vec(),
            layout: vec![vec![]; t.rank()],
            shards: vec![shard],
        })
        .collect();
    write_index(dir, &Index { format: FORMAT.to_string(), version: VERSION, mesh: None, files: vec![file], tensors })
}

/// Creates the checkpoint folder `dir` if it is not one yet (every rank of a sharded save may).
pub fn prepare_checkpoint(dir: &Path) -> Result<(), KernelError> {
    prepare_folder(dir).map_err(|e| KernelError::io(dir, format!("cannot write the checkpoint: {e}")))
}

/// Writes rank `rank`'s data file of a checkpoint in `dir` (which exists): the tensors `named`
/// one after another, named `rank<rank>.<crc>.safetensors` after their CRC-32, atomically.
/// Returns its index entry and, for each tensor, a shard of file 0 that starts at the origin
/// and is the tensor's shape (the caller places shards of a sharded save).
pub fn write_data_file(
    dir: &Path,
    rank: usize,
    named: &[(String, Tensor)],
) -> Result<(FileEntry, Vec<Shard>), KernelError> {
    let fail = |e: io::Error| KernelError::io(dir, format!("cannot write the checkpoint: {e}"));
    let head = super::safetensors::header(named).map_err(|m| KernelError::io(dir, m))?;
    let mut tmp = TempFile::beside(&dir.join(format!("rank{rank}.safetensors"))).map_err(fail)?;
    let mut whole = crc32fast::Hasher::new();
    let mut at = head.len() as u64;
    tmp.file().write_all(&head).map_err(fail)?;
    whole.update(&head);
    let mut tensors = Vec::with_capacity(named.len());
    let mut flushed = 0u64;
    for (_, t) in named {
        let mut crc = Pieces::default();
        let file = tmp.file();
        let mut end = at;
        super::for_le_chunks(t, |b| {
            crc.update(b);
            file.write_all(b)?;
            end += b.len() as u64;
            if end - flushed >= WRITEBACK {
                start_writeback(file, flushed, end - flushed);
                flushed = end;
            }
            Ok(())
        })
        .map_err(fail)?;
        let (crc, chunk_crc32) = crc.finish();
        whole.combine(&crc);
        let size = t.nbytes() as u64;
        let shape = t.shape().to_vec();
        tensors.push(Shard {
            file: 0,
            start: vec![0; shape.len()],
            shape,
            bytes: [at, at + size],
            crc32: crc.finalize(),
            chunk: (!chunk_crc32.is_empty()).then_some(CHUNK),
            chunk_crc32,
        });
        at += size;
    }
    let data_name = format!("rank{rank}.{:08x}.safetensors", whole.finalize());
    let data_path = dir.join(&data_name);
    if std::fs::symlink_metadata(&data_path).is_ok_and(|m| m.is_dir()) {
        return Err(fail(io::Error::other(format!("{data_name} is a directory"))));
    }
    tmp.commit(&data_path).map_err(fail)?;
    sync_folder(&data_path).map_err(fail)?;
    Ok((FileEntry { name: data_name, rank, size: at, header_crc32: crc32fast::hash(&head) }, tensors))
}

/// The CRC-32 of a shard's bytes as they are written, and of each [`CHUNK`] of them.
#[derive(Default)]
struct Pieces {
    whole: crc32fast::Hasher,
    piece: crc32fast::Hasher,
    /// Bytes in the current piece.
    filled: u64,
    done: Vec<u32>,
}

impl Pieces {
    fn update(&mut self, mut b: &[u8]) {
        while !b.is_empty() {
            let n = (CHUNK - self.filled).min(b.len() as u64) as usize;
            self.piece.update(&b[..n]);
            self.filled += n as u64;
            b = &b[n..];
            if self.filled == CHUNK {
                self.close();
            }
        }
    }

    fn close(&mut self) {
        let piece = std::mem::take(&mut self.piece);
        self.whole.combine(&piece);
        self.done.push(piece.finalize());
        self.filled = 0;
    }

    /// The whole shard's hasher, and the pieces' CRC-32s when there is more than one piece.
    fn finish(mut self) -> (crc32fast::Hasher, Vec<u32>) {
        if self.filled > 0 {
            self.close();
        }
        if self.done.len() <= 1 {
            self.done.clear();
        }
        (self.whole, self.done)
    }
}

/// Writes `index` as the index of the checkpoint in `dir`, atomically and last (its data files
/// are all written), then removes data files it does not name and dead processes' temporary
/// files.
pub fn write_index(dir: &Path, index: &Index) -> Result<(), KernelError> {
    let fail = |e: io::Error| KernelError::io(dir, format!("cannot write the checkpoint: {e}"));
    let json = index_text(index).map_err(|e| fail(io::Error::other(e)))?;
    write_atomic(&dir.join(INDEX), |f| f.write_all(json.as_bytes()))?;
    remove_leftovers(dir, index);
    Ok(())
}

/// The text of `index.json`: the top-level fields one per line and each file and tensor on a
/// line of its own, so that the index reads (and diffs) as a table.
fn index_text(index: &Index) -> serde_json::Result<String> {
    let rows = |items: Vec<String>| {
        if items.is_empty() {
            "[]".to_string()
        } else {
            format!("[\n    {}\n  ]", items.join(",\n    "))
        }
    };
    let files = index.files.iter().map(serde_json::to_string).collect::<serde_json::Result<Vec<_>>>()?;
    let tensors = index.tensors.iter().map(serde_json::to_string).collect::<serde_json::Result<Vec<_>>>()?;
    Ok(format!(
        "{{\n  \"format\": {},\n  \"version\": {},\n  \"mesh\": {},\n  \"files\": {},\n  \"tensors\": {}\n}}\n",
        serde_json::to_string(&index.format)?,
        index.version,
        serde_json::to_string(&index.mesh)?,
        rows(files),
        rows(tensors)
    ))
}

/// Bytes written before their write-back to disk is started (see [`start_writeback`]).
const WRITEBACK: u64 = 32 << 20;

/// Asks the kernel to start writing a range of `file` to disk now, without waiting for it, so
/// that the data file's final `fsync` finds most of it written already. Only a hint: nothing
/// depends on it, and it does nothing where `sync_file_range` does not exist.
fn start_writeback(file: &File, offset: u64, len: u64) {
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::io::AsRawFd;
        let (Ok(offset), Ok(len)) = (libc::off64_t::try_from(offset), libc::off64_t::try_from(len)) else { return };
        // SAFETY: the descriptor is open for the duration of the call; the call only schedules
        // write-back of that range of the file.
        unsafe {
            libc::sync_file_range(file.as_raw_fd(), offset, len, libc::SYNC_FILE_RANGE_WRITE);
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (file, offset, len);
}

/// Makes `dir` a folder if it is not one yet (syncing its parent, so that it survives a crash).
fn prepare_folder(dir: &Path) -> io::Result<()> {
    // Without its trailing `/`, a path that names a file is reported as that, not as ENOTDIR.
    match std::fs::metadata(dir.components().as_path()) {
        Ok(m) if m.is_dir() => Ok(()),
        Ok(_) => Err(io::Error::other("a file of that name is there, not a folder")),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            std::fs::create_dir_all(dir)?;
            sync_folder(dir)
        }
        Err(e) => Err(e),
    }
}

/// Whether `name` is a data file name this module writes: `rank<N>.<8 hex digits>.safetensors`.
fn is_data_file(name: &str) -> bool {
    let Some(rest) = name.strip_prefix("rank").and_then(|r| r.strip_suffix(".safetensors")) else {
        return false;
    };
    let Some((rank, crc)) = rest.split_once('.') else { return false };
    !rank.is_empty()
        && rank.bytes().all(|b| b.is_ascii_digit())
        && crc.len() == 8
        && crc.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The process that made the temporary file `name` (`.rank0.safetensors.PID.N.tmp` or
/// `.index.json.PID.N.tmp`), if it is one of this module's.
fn temp_owner(name: &str) -> Option<u32> {
    let rest = name.strip_suffix(".tmp")?;
    let rest = rest.strip_prefix(".index.json.").or_else(|| {
        let r = rest.strip_prefix(".rank")?;
        let digits = r.find(|c: char| !c.is_ascii_digit())?;
        r[digits..].strip_prefix(".safetensors.")
    })?;
    let (pid, n) = rest.split_once('.')?;
    n.parse::<u64>().ok()?;
    pid.parse().ok()
}

/// Whether the process `pid` is running (so its temporary files may still be in use).
fn alive(pid: u32) -> bool {
    #[cfg(unix)]
    {
        let Ok(p) = libc::pid_t::try_from(pid) else { return false };
        // SAFETY: kill with signal 0 sends nothing; it only asks whether the process exists.
        let r = unsafe { libc::kill(p, 0) };
        r == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
    }
    #[cfg(not(unix))]
    {
        let _ = pid;
        true
    }
}

/// Removes data files the index no longer names and temporary files of processes that died
/// while saving. Only regular files with this module's names are touched; failures are
/// ignored (what is left is removed by a later save).
fn remove_leftovers(dir: &Path, index: &Index) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let Some(name) = e.file_name().to_str().map(str::to_string) else { continue };
        let stale = (is_data_file(&name) && !index.files.iter().any(|f| f.name == name))
            || temp_owner(&name).is_some_and(|pid| !alive(pid));
        if stale && e.file_type().is_ok_and(|t| t.is_file()) {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// Reads the index of the checkpoint in `dir`; a folder without one is an incomplete
/// checkpoint.
pub fn read_index(dir: &Path) -> Result<Index, KernelError> {
    match std::fs::metadata(dir.components().as_path()) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => return Err(KernelError::io(dir, "not a checkpoint: it is a file, not a folder")),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(KernelError::io(dir, "no checkpoint here: the folder does not exist"))
        }
        Err(e) => return Err(KernelError::io(dir, format!("cannot read the checkpoint: {e}"))),
    }
    let path = dir.join(INDEX);
    let bytes = match read_regular(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(KernelError::io(
                dir,
                format!("incomplete checkpoint: the folder has no {INDEX} (the save that wrote it did not finish)"),
            ))
        }
        Err(e) => return Err(KernelError::io(&path, format!("cannot read: {e}"))),
    };
    let index: Index = serde_json::from_slice(&bytes)
        .map_err(|e| KernelError::io(&path, format!("damaged checkpoint index ({e})")))?;
    if index.format != FORMAT {
        return Err(KernelError::io(
            &path,
            format!("not an msl checkpoint index (format '{}')", super::shown(&index.format)),
        ));
    }
    if index.version != VERSION {
        return Err(KernelError::io(
            &path,
            format!("checkpoint format version {} (this msl reads version {VERSION})", index.version),
        ));
    }
    Ok(index)
}

/// The element type of a safetensors dtype name this module writes.
fn dtype_of(name: &str) -> Option<DType> {
    Some(match name {
        "F32" => DType::F32,
        "F64" => DType::F64,
        "I32" => DType::I32,
        "BOOL" => DType::Bool,
        "BF16" => DType::Bf16,
        "F16" => DType::F16,
        _ => return None,
    })
}

/// `names` as a list for a message, at most `n` of them.
fn listed(names: &[&str], n: usize) -> String {
    let mut out: Vec<String> = names.iter().take(n).map(|s| format!("`{}`", super::shown(s))).collect();
    if names.len() > n {
        out.push(format!("and {} more", names.len() - n));
    }
    out.join(", ")
}

/// Reads the tensors `wanted` from the checkpoint in `dir`, in that order. The checkpoint must
/// hold exactly these names, each with exactly this element type and global shape: a missing
/// tensor, one the program does not expect, and any difference of type or shape are errors
/// naming the tensor (never a cast or a truncation). Every shard's bytes are checked against
/// its CRC-32 before use.
pub fn read_checkpoint(dir: &Path, wanted: &[Wanted]) -> Result<Vec<Tensor>, KernelError> {
    let index = read_index(dir)?;
    let by_name: HashMap<&str, &TensorEntry> = index.tensors.iter().map(|t| (t.name.as_str(), t)).collect();
    let missing: Vec<&str> = wanted.iter().map(|w| w.name.as_str()).filter(|n| !by_name.contains_key(n)).collect();
    if !missing.is_empty() {
        let holds: Vec<&str> = index.tensors.iter().map(|t| t.name.as_str()).collect();
        let one = if missing.len() == 1 { "tensor" } else { "tensors" };
        return Err(KernelError::io(
            dir,
            format!(
                "the checkpoint has no {one} {} (it holds {})",
                listed(&missing, 8),
                if holds.is_empty() { "no tensors".to_string() } else { listed(&holds, 8) }
            ),
        ));
    }
    let expected: std::collections::HashSet<&str> = wanted.iter().map(|w| w.name.as_str()).collect();
    let extra: Vec<&str> = index.tensors.iter().map(|t| t.name.as_str()).filter(|n| !expected.contains(n)).collect();
    if !extra.is_empty() {
        return Err(KernelError::io(
            dir,
            format!("the checkpoint holds tensors the program's type does not have: {}", listed(&extra, 8)),
        ));
    }
    for w in wanted {
        let e = by_name[w.name.as_str()];
        let found = dtype_of(&e.dtype).ok_or_else(|| {
            KernelError::io(
                dir,
                format!(
                    "damaged checkpoint index: tensor `{}` has element type '{}'",
                    super::shown(&e.name),
                    super::shown(&e.dtype)
                ),
            )
        })?;
        if !w.accepts(found, &e.shape) {
            return Err(KernelError::io(
                dir,
                format!(
                    "tensor `{}` is {found} {} in the checkpoint, but the program expects {} {}",
                    super::shown(&w.name),
                    shape_string(&e.shape),
                    w.dtype,
                    w.shape_text()
                ),
            ));
        }
    }
    let mut files = Files { dir, index: &index, open: HashMap::new() };
    let mut out = Vec::with_capacity(wanted.len());
    let mut i = 0;
    while i < wanted.len() {
        let w = &wanted[i];
        let run = match w.group {
            Some(g) => wanted[i..].iter().take_while(|v| v.group == Some(g) && v.dtype == w.dtype).count(),
            None => 1,
        };
        let entries: Vec<Part> =
            wanted[i..i + run].iter().map(|v| (by_name[v.name.as_str()], v.region.as_ref())).collect();
        out.extend(files.tensors(&entries, w.dtype)?);
        i += run;
    }
    Ok(out)
}

/// The data files of one read, each opened once and checked against its recorded size.
struct Files<'a> {
    dir: &'a Path,
    index: &'a Index,
    open: HashMap<usize, File>,
}

/// Elements as they are stored: little endian, `SIZE` bytes each (bool as one byte).
trait Le: Element {
    const SIZE: usize;
    /// Fills `out` with elements read from `r`, handing every byte to `crc`.
    fn read_into(r: &mut File, out: &mut [Self], crc: &mut crc32fast::Hasher) -> io::Result<()>;
}

/// Bytes read per `read` call: 256 KiB, so that the checksum reads them from the cache.
const PIECE: usize = 1 << 18;

macro_rules! le {
    ($t:ty, $n:expr) => {
        impl Le for $t {
            const SIZE: usize = $n;
            fn read_into(r: &mut File, out: &mut [Self], crc: &mut crc32fast::Hasher) -> io::Result<()> {
                // On a little-endian machine the file's bytes are the elements' memory: they
                // are read in place.
                #[cfg(target_endian = "little")]
                for piece in bytemuck::cast_slice_mut::<$t, u8>(out).chunks_mut(PIECE) {
                    r.read_exact(piece)?;
                    crc.update(piece);
                }
                #[cfg(not(target_endian = "little"))]
                {
                    let mut buf = vec![0u8; PIECE];
                    for part in out.chunks_mut(PIECE / $n) {
                        let piece = &mut buf[..part.len() * $n];
                        r.read_exact(piece)?;
                        crc.update(piece);
                        for (x, b) in part.iter_mut().zip(piece.chunks_exact($n)) {
                            *x = <$t>::from_le_bytes(b.try_into().unwrap_or_default());
                        }
                    }
                }
                Ok(())
            }
        }
    };
}
le!(f32, 4);
le!(f64, 8);
le!(i32, 4);
le!(half::bf16, 2);
le!(half::f16, 2);

impl Le for bool {
    const SIZE: usize = 1;
    fn read_into(r: &mut File, out: &mut [Self], crc: &mut crc32fast::Hasher) -> io::Result<()> {
        let mut buf = vec![0u8; PIECE];
        for part in out.chunks_mut(PIECE) {
            let piece = &mut buf[..part.len()];
            r.read_exact(piece)?;
            crc.update(piece);
            for (x, &b) in part.iter_mut().zip(piece.iter()) {
                *x = b != 0;
            }
        }
        Ok(())
    }
}

impl Files<'_> {
    fn damaged(&self, what: String) -> KernelError {
        KernelError::io(self.dir, format!("damaged checkpoint: {what}"))
    }

    /// The file with index `i`, opened (once) and checked against its recorded size.
    fn file(&mut self, i: usize) -> Result<&mut File, KernelError> {
        let index = self.index;
        let entry = index.files.get(i).ok_or_else(|| self.damaged(format!("the index has no file {i}")))?;
        if !self.open.contains_key(&i) {
            let name = &entry.name;
            if name.is_empty() || name.starts_with('.') || name.contains(['/', '\\']) {
                return Err(self.damaged(format!("the index names the file '{}'", super::shown(name))));
            }
            let path = self.dir.join(name);
            let (f, len) = match open_regular(&path) {
                Ok(f) => f,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    return Err(self.damaged(format!("its data file {} is missing", super::shown(name))))
                }
                Err(e) => return Err(KernelError::io(&path, format!("cannot read: {e}"))),
            };
            if len != entry.size {
                return Err(self.damaged(format!(
                    "{} has {len} bytes, but the index says {}",
                    super::shown(name),
                    entry.size
                )));
            }
            let mut f = f;
            if header_crc(&mut f, len).ok() != Some(entry.header_crc32) {
                return Err(
                    self.damaged(format!("the safetensors header of {} is not the one saved", super::shown(name)))
                );
            }
            self.open.insert(i, f);
        }
        self.open.get_mut(&i).ok_or_else(|| KernelError::io(self.dir, format!("file {i} could not be opened")))
    }

    /// The tensors `entries` (whose dtype the caller checked is `dtype`), each assembled from
    /// its shards, all in one buffer (in order, each a view of it).
    fn tensors(&mut self, entries: &[Part], dtype: DType) -> Result<Vec<Tensor>, KernelError> {
        match dtype {
            DType::F32 => self.typed::<f32>(entries),
            DType::F64 => self.typed::<f64>(entries),
            DType::I32 => self.typed::<i32>(entries),
            DType::Bool => self.typed::<bool>(entries),
            DType::Bf16 => self.typed::<half::bf16>(entries),
            DType::F16 => self.typed::<half::f16>(entries),
        }
    }

    fn typed<T: Le>(&mut self, entries: &[Part]) -> Result<Vec<Tensor>, KernelError> {
        let mut blocks = Vec::with_capacity(entries.len());
        let mut shapes = Vec::with_capacity(entries.len());
        let mut total = 0usize;
        for (e, region) in entries {
            let b = check_tiling(&e.shape, &e.shards).map_err(|m| self.bad(e, m))?;
            self.check_ranges::<T>(e, &b)?;
            let shape = match region {
                Some((start, shape)) => {
                    let inside = start.len() == e.shape.len()
                        && shape.len() == e.shape.len()
                        && (0..shape.len())
                            .all(|d| start[d].checked_add(shape[d]).is_some_and(|end| end <= e.shape[d]));
                    if !inside {
                        return Err(self
                            .bad(e, format!("the block asked for lies outside its shape {}", shape_string(&e.shape))));
                    }
                    shape.clone()
                }
                None => e.shape.clone(),
            };
            total = total.checked_add(checked_numel(&shape)?).ok_or_else(|| self.bad(e, "the sizes overflow"))?;
            blocks.push(b);
            shapes.push(shape);
        }
        // Every shard's bytes lie in a file that is there, and no two share bytes, so `total`
        // elements are no more than those files hold: an index cannot make this allocate more.
        let mut buf: Vec<T> = vec![T::default(); total];
        let mut at = 0;
        for (((e, region), b), shape) in entries.iter().zip(&blocks).zip(&shapes) {
            let n: usize = shape.iter().product();
            let start = region.map_or_else(|| vec![0; shape.len()], |r| r.0.clone());
            self.fill(e, b, &start, shape, &mut buf[at..at + n])?;
            at += n;
        }
        if let [_] = entries {
            return Ok(vec![Tensor::from_vec(shapes.swap_remove(0), buf)?]);
        }
        let flat = Tensor::from_vec(vec![total], buf)?;
        let mut at = 0;
        let mut out = Vec::with_capacity(entries.len());
        for shape in shapes {
            let n: usize = shape.iter().product();
            out.push(flat.view(at, shape)?);
            at += n;
        }
        Ok(out)
    }

    /// Fills `out` (row-major, the block of `e` at `start` of shape `shape`) from the shards of
    /// `e` that overlap it (`blocks[i]` elements each); the others are not read.
    fn fill<T: Le>(
        &mut self,
        e: &TensorEntry,
        blocks: &[usize],
        start: &[usize],
        shape: &[usize],
        out: &mut [T],
    ) -> Result<(), KernelError> {
        if let ([s], [n]) = (&e.shards[..], blocks) {
            if *n == out.len() {
                return self.shard(e, s, out);
            }
        }
        for (s, &n) in e.shards.iter().zip(blocks) {
            let overlaps =
                (0..shape.len()).all(|d| s.start[d] < start[d] + shape[d] && start[d] < s.start[d] + s.shape[d]);
            if n == 0 || !overlaps {
                continue;
            }
            // The elements of the shard (row-major) from the first to the last it shares with
            // the block: all that is read, widened to whole checksummed pieces.
            let lo: Vec<usize> = (0..shape.len()).map(|d| start[d].max(s.start[d]) - s.start[d]).collect();
            let hi: Vec<usize> =
                (0..shape.len()).map(|d| (start[d] + shape[d]).min(s.start[d] + s.shape[d]) - s.start[d] - 1).collect();
            let (first, last) = (linear(&lo, &s.shape), linear(&hi, &s.shape) + 1);
            let (from, data) = match s.chunk {
                Some(chunk) if last - first < n => {
                    let per = chunk as usize / T::SIZE;
                    let (p0, p1) = (first / per, last.div_ceil(per));
                    let mut data = vec![T::default(); (p1 * per).min(n) - p0 * per];
                    self.pieces(e, s, p0, per, &mut data)?;
                    (p0 * per, data)
                }
                _ => {
                    let mut data = vec![T::default(); n];
                    self.shard(e, s, &mut data)?;
                    (0, data)
                }
            };
            copy_overlap(out, start, shape, &data, from, &s.start, &s.shape);
        }
        Ok(())
    }

    /// Reads the pieces of shard `s` of `e` from piece `p0` on (`per` elements each, the last
    /// one maybe shorter) into `out`, each checked against its CRC-32.
    fn pieces<T: Le>(
        &mut self,
        e: &TensorEntry,
        s: &Shard,
        p0: usize,
        per: usize,
        out: &mut [T],
    ) -> Result<(), KernelError> {
        let begin = s.bytes[0] + (p0 * per * T::SIZE) as u64;
        let f = self.file(s.file)?;
        let read = (|| {
            let io = |e: io::Error| format!("cannot read its data: {e}");
            f.seek(SeekFrom::Start(begin)).map_err(io)?;
            for (k, part) in out.chunks_mut(per).enumerate() {
                let mut crc = crc32fast::Hasher::new();
                T::read_into(f, part, &mut crc).map_err(io)?;
                if s.chunk_crc32.get(p0 + k) != Some(&crc.finalize()) {
                    return Err("its data does not match its checksum".to_string());
                }
            }
            Ok(())
        })();
        read.map_err(|m| self.bad(e, m))
    }

    /// Checks, before anything is read, that each shard of `e` (`blocks[i]` elements) has a
    /// byte range of the right length inside its file, that the file is there with its recorded
    /// size, and that no two shards share bytes.
    fn check_ranges<T: Le>(&mut self, e: &TensorEntry, blocks: &[usize]) -> Result<(), KernelError> {
        let mut ranges: Vec<(usize, u64, u64)> = Vec::with_capacity(e.shards.len());
        for (s, &n) in e.shards.iter().zip(blocks) {
            let [begin, end] = s.bytes;
            let want = (n as u64).checked_mul(T::SIZE as u64).ok_or_else(|| self.bad(e, "its size overflows"))?;
            if end.checked_sub(begin) != Some(want) {
                let m = format!("its byte range {begin}..{end} does not hold {n} elements of {} bytes", T::SIZE);
                return Err(self.bad(e, m));
            }
            self.file(s.file)?;
            let size = self.index.files.get(s.file).map_or(0, |f| f.size);
            if end > size {
                let m = format!("its byte range {begin}..{end} lies past the end of its file ({size} bytes)");
                return Err(self.bad(e, m));
            }
            if let Some(chunk) = s.chunk {
                let pieces = if chunk == 0 { None } else { Some(want.div_ceil(chunk)) };
                if chunk % T::SIZE as u64 != 0 || pieces != Some(s.chunk_crc32.len() as u64) {
                    let m = format!("its {} checksums do not fit pieces of {chunk} bytes", s.chunk_crc32.len());
                    return Err(self.bad(e, m));
                }
            }
            ranges.push((s.file, begin, end));
        }
        // Sorted by file and start, non-empty ranges share bytes exactly when one starts before
        // the furthest end so far in its file.
        ranges.retain(|r| r.1 < r.2);
        ranges.sort_unstable();
        let mut reach: Option<(usize, u64)> = None;
        for &(file, begin, end) in &ranges {
            match reach {
                Some((f, far)) if f == file && begin < far => return Err(self.bad(e, "two of its shards share bytes")),
                Some((f, far)) if f == file => reach = Some((f, far.max(end))),
                _ => reach = Some((file, end)),
            }
        }
        Ok(())
    }

    /// The error for a damaged tensor `e`.
    fn bad(&self, e: &TensorEntry, m: impl std::fmt::Display) -> KernelError {
        self.damaged(format!("tensor `{}`: {m}", super::shown(&e.name)))
    }

    /// Reads one shard of `e` (whose byte range [`Files::check_ranges`] checked) into `out`,
    /// checked against its CRC-32.
    fn shard<T: Le>(&mut self, e: &TensorEntry, s: &Shard, out: &mut [T]) -> Result<(), KernelError> {
        let [begin, _] = s.bytes;
        let f = self.file(s.file)?;
        let read = (|| {
            let io = |e: io::Error| format!("cannot read its data: {e}");
            f.seek(SeekFrom::Start(begin)).map_err(io)?;
            let mut crc = crc32fast::Hasher::new();
            T::read_into(f, out, &mut crc).map_err(io)?;
            if crc.finalize() != s.crc32 {
                return Err("its data does not match its checksum".to_string());
            }
            Ok(())
        })();
        read.map_err(|m| self.bad(e, m))
    }
}

/// The CRC-32 of the safetensors header at the start of `f` (`len` bytes long).
fn header_crc(f: &mut File, len: u64) -> io::Result<u32> {
    let mut n = [0u8; 8];
    f.read_exact(&mut n)?;
    let size = u64::from_le_bytes(n);
    if size > len.saturating_sub(8) {
        return Err(io::Error::other("the header is longer than the file"));
    }
    let mut head = n.to_vec();
    (&mut *f).take(size).read_to_end(&mut head)?;
    Ok(crc32fast::hash(&head))
}

/// Checks that `shards` tile a tensor of `shape` (each inside it, none overlapping, together
/// covering it) and returns each one's element count.
fn check_tiling(shape: &[usize], shards: &[Shard]) -> Result<Vec<usize>, String> {
    if shards.len() > MAX_SHARDS {
        return Err(format!("{} shards (at most {MAX_SHARDS} are read)", shards.len()));
    }
    let mut counts = Vec::with_capacity(shards.len());
    let mut sum = 0usize;
    for s in shards {
        if s.start.len() != shape.len() || s.shape.len() != shape.len() {
            return Err("a shard's rank differs from the tensor's".to_string());
        }
        for d in 0..shape.len() {
            if s.start[d].checked_add(s.shape[d]).is_none_or(|e| e > shape[d]) {
                return Err(format!(
                    "a shard at {} of shape {} lies outside its shape {}",
                    shape_string(&s.start),
                    shape_string(&s.shape),
                    shape_string(shape)
                ));
            }
        }
        let n = checked_numel(&s.shape).map_err(|e| e.to_string())?;
        sum = sum.checked_add(n).ok_or("its shards' sizes overflow")?;
        counts.push(n);
    }
    for (i, a) in shards.iter().enumerate() {
        if let Some(b) = shards[..i].iter().find(|b| overlap(a, b)) {
            return Err(format!("shards at {} and {} overlap", shape_string(&a.start), shape_string(&b.start)));
        }
    }
    if sum != checked_numel(shape).map_err(|e| e.to_string())? {
        return Err("its shards do not cover it".to_string());
    }
    Ok(counts)
}

/// Whether two non-empty blocks share an element.
fn overlap(a: &Shard, b: &Shard) -> bool {
    let empty = |s: &Shard| s.shape.contains(&0);
    !empty(a)
        && !empty(b)
        && (0..a.start.len()).all(|d| a.start[d] < b.start[d] + b.shape[d] && b.start[d] < a.start[d] + a.shape[d])
}

/// The row-major position of the element at `idx` in a block of `shape`.
fn linear(idx: &[usize], shape: &[usize]) -> usize {
    idx.iter().zip(shape).fold(0, |a, (i, n)| a * n + i)
}

/// A tensor to read and the block of it wanted (`None`: all of it).
type Part<'a> = (&'a TensorEntry, Option<&'a (Vec<usize>, Vec<usize>)>);

/// Copies the part of the block `src` (row-major from its element `src_from` on, at
/// `src_start` of the global tensor, shape `src_shape`) that lies inside the block `dst` (at `dst_start`, shape `dst_shape`).
fn copy_overlap<T: Copy>(
    dst: &mut [T],
    dst_start: &[usize],
    dst_shape: &[usize],
    src: &[T],
    src_from: usize,
    src_start: &[usize],
    src_shape: &[usize],
) {
    let rank = dst_shape.len();
    if rank == 0 {
        if let (Some(o), Some(&d)) = (dst.first_mut(), src.first()) {
            *o = d;
        }
        return;
    }
    let lo: Vec<usize> = (0..rank).map(|d| dst_start[d].max(src_start[d])).collect();
    let hi: Vec<usize> = (0..rank).map(|d| (dst_start[d] + dst_shape[d]).min(src_start[d] + src_shape[d])).collect();
    if (0..rank).any(|d| lo[d] >= hi[d]) {
        return;
    }
    let row = hi[rank - 1] - lo[rank - 1];
    let mut idx = lo.clone();
    loop {
        let offset = |start: &[usize], shape: &[usize]| (0..rank).fold(0, |a, d| a * shape[d] + idx[d] - start[d]);
        let (from, to) = (offset(src_start, src_shape) - src_from, offset(dst_start, dst_shape));
        dst[to..to + row].copy_from_slice(&src[from..from + row]);
        // The next row: the dims before the last, last-but-one fastest.
        let mut d = rank - 1;
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            idx[d] += 1;
            if idx[d] < hi[d] {
                break;
            }
            idx[d] = lo[d];
        }
    }
}

#[cfg(test)]
#[path = "checkpoint_tests.rs"]
mod tests;
