//! The private folder where stdlib sources are written for "go to definition", and the file
//! operations that are safe in it and on files the client names.
//!
//! The folder is `$XDG_CACHE_HOME/msl/stdlib-<version>` (or `~/.cache/msl/…`), falling back to
//! `<temp>/msl-<uid>/stdlib-<version>`. A shared temp folder lets any local user create paths in
//! it, so every folder this server writes in must be a real directory (not a link), owned by this
//! user and not writable by others; otherwise it is not used. Folders it makes have mode 0700.
//! Files are written to a new temporary file (`create_new`, which never follows a link) and
//! renamed over the target, and a target that is a link or not a regular file is left alone.
//! Owners and modes are Unix notions; elsewhere only the link checks apply.

use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// Largest unopened file read for a request; larger ones are treated as unavailable.
pub const MAX_FILE: u64 = 8 << 20;

/// The stdlib cache folder, checked once; `None` when no private folder can be had.
pub fn stdlib_dir() -> Option<&'static Path> {
    static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    DIR.get_or_init(|| {
        let leaf = format!("stdlib-{}", env!("CARGO_PKG_VERSION"));
        let env_dir = |k: &str| std::env::var_os(k).map(PathBuf::from).filter(|p| p.is_absolute());
        let home_cache = env_dir("XDG_CACHE_HOME").or_else(|| env_dir("HOME").map(|h| h.join(".cache")));
        if let Some(dir) = home_cache.and_then(|c| private_dir(&c.join("msl"), true)) {
            if let Some(d) = private_dir(&dir.join(&leaf), false) {
                return Some(d);
            }
        }
        let base = private_dir(&std::env::temp_dir().join(format!("msl-{}", os::user())), false)?;
        private_dir(&base.join(&leaf), false)
    })
    .as_deref()
}

#[cfg(unix)]
mod os {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};

    /// This user's id, which names the per-user folder in the temp folder.
    pub fn user() -> String {
        // SAFETY: `geteuid` has no preconditions and cannot fail.
        unsafe { libc::geteuid() }.to_string()
    }

    /// Owned by this user, and writable by no one else.
    pub fn owned_and_closed(m: &std::fs::Metadata) -> bool {
        // SAFETY: as above.
        m.uid() == unsafe { libc::geteuid() } && m.permissions().mode() & 0o022 == 0
    }

    pub fn private(b: &mut std::fs::DirBuilder) {
        b.mode(0o700);
    }

    pub fn private_file(o: &mut std::fs::OpenOptions) {
        o.mode(0o600);
    }

    /// Opening a FIFO for reading blocks until a writer comes; with `O_NONBLOCK` it does not
    /// (and reads of a regular file are unaffected).
    pub fn no_blocking(o: &mut std::fs::OpenOptions) {
        o.custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY);
    }
}

#[cfg(not(unix))]
mod os {
    pub fn user() -> String {
        std::env::var("USERNAME").unwrap_or_default()
    }

    pub fn owned_and_closed(_: &std::fs::Metadata) -> bool {
        true
    }

    pub fn private(_: &mut std::fs::DirBuilder) {}

    pub fn private_file(_: &mut std::fs::OpenOptions) {}

    pub fn no_blocking(_: &mut std::fs::OpenOptions) {}
}

/// `dir`, created with mode 0700 when missing (with its parents when `parents`), if it is a
/// directory (not a link) owned by this user that no one else may write to: then no one else
/// can put a link or a file in it.
fn private_dir(dir: &Path, parents: bool) -> Option<PathBuf> {
    let mut b = DirBuilder::new();
    os::private(b.recursive(parents));
    if let Err(e) = b.create(dir) {
        if e.kind() != io::ErrorKind::AlreadyExists {
            return None;
        }
    }
    let m = fs::symlink_metadata(dir).ok()?;
    (m.file_type().is_dir() && os::owned_and_closed(&m)).then(|| dir.to_path_buf())
}

/// Writes `text` to `rel` under the private folder `dir` unless it already holds it, and
/// returns the file's path. `rel` is a relative path of plain names (`optim/adam.msl`).
pub fn write_private(dir: &Path, rel: &str, text: &str) -> io::Result<PathBuf> {
    let rel = Path::new(rel);
    if rel.components().any(|c| !matches!(c, Component::Normal(_))) {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "not a plain relative path"));
    }
    let target = dir.join(rel);
    let parent = target.parent().unwrap_or(dir);
    // Folders inside the cache are made like the cache itself, and checked the same way.
    if private_dir(parent, true).is_none() {
        return Err(io::Error::new(io::ErrorKind::PermissionDenied, "the cache folder is not private"));
    }
    match fs::symlink_metadata(&target) {
        Ok(m) if !m.file_type().is_file() => {
            return Err(io::Error::new(io::ErrorKind::AlreadyExists, "the target is a link or not a file"));
        }
        Ok(m) if m.len() == text.len() as u64 => {
            if read_regular(&target, MAX_FILE).ok().as_deref() == Some(text) {
                return Ok(target);
            }
        }
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let name = rel.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    let tmp = parent.join(format!(".{name}.{}.{}.tmp", std::process::id(), SEQ.fetch_add(1, Ordering::Relaxed)));
    let written = (|| {
        let mut options = OpenOptions::new();
        os::private_file(options.write(true).create_new(true));
        let mut f = options.open(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        fs::rename(&tmp, &target)
    })();
    if written.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    written.map(|()| target)
}

/// The text of a file that is not open in the editor, read only when it is a regular file of at
/// most `limit` bytes: a request can name any path (`/dev/zero`, a FIFO), and reading such a
/// thing would fill memory or block for good.
pub fn read_regular(path: &Path, limit: u64) -> io::Result<String> {
    let not_regular = || io::Error::new(io::ErrorKind::InvalidInput, "not a regular file");
    // `metadata` does not open the file, so a FIFO is seen before anything blocks on it.
    let m = fs::metadata(path)?;
    if !m.is_file() {
        return Err(not_regular());
    }
    if m.len() > limit {
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("larger than {limit} bytes")));
    }
    // The path may be replaced between the check and the open: opening without blocking and
    // checking the opened file again keeps a FIFO put there from wedging the read.
    let mut options = OpenOptions::new();
    os::no_blocking(options.read(true));
    let f = options.open(path)?;
    if !f.metadata()?.is_file() {
        return Err(not_regular());
    }
    read_bounded(f, limit)
}

fn read_bounded(f: File, limit: u64) -> io::Result<String> {
    let mut bytes = Vec::new();
    f.take(limit + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("larger than {limit} bytes")));
    }
    String::from_utf8(bytes).map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "not UTF-8"))
}

#[cfg(all(test, unix))]
mod tests {
    use super::*;
    use std::os::unix::fs::{symlink, DirBuilderExt, PermissionsExt};

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("msl-lsp-cache-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        DirBuilder::new().mode(0o700).create(&d).unwrap();
        d
    }

    #[test]
    fn only_small_regular_files_are_read() {
        let d = scratch("read");
        let f = d.join("a.msl");
        fs::write(&f, "fn main() {}\n").unwrap();
        assert_eq!(read_regular(&f, MAX_FILE).unwrap(), "fn main() {}\n");
        assert!(read_regular(&f, 4).is_err(), "over the limit");
        assert!(read_regular(Path::new("/dev/zero"), MAX_FILE).is_err());
        assert!(read_regular(&d, MAX_FILE).is_err(), "a folder");
        // A FIFO with no writer: opening it for reading would block forever.
        let fifo = d.join("fifo");
        let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        assert!(read_regular(&fifo, MAX_FILE).is_err());
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn writes_never_follow_links() {
        let d = scratch("write");
        let victim = d.join("victim");
        fs::write(&victim, "mine").unwrap();
        symlink(&victim, d.join("nn.msl")).unwrap();
        assert!(write_private(&d, "nn.msl", "fn linear() {}").is_err());
        assert_eq!(fs::read_to_string(&victim).unwrap(), "mine", "the link's target is untouched");
        // A linked folder is refused as well.
        fs::create_dir(d.join("elsewhere")).unwrap();
        symlink(d.join("elsewhere"), d.join("optim")).unwrap();
        assert!(write_private(&d, "optim/adam.msl", "x").is_err());
        assert!(!d.join("elsewhere/adam.msl").exists());
        assert!(write_private(&d, "../escape.msl", "x").is_err());
        // A plain write, then a rewrite with other text, then one with the same text.
        let p = write_private(&d, "optim2/sgd.msl", "one").unwrap();
        assert_eq!(fs::read_to_string(&p).unwrap(), "one");
        assert_eq!(fs::symlink_metadata(&p).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(fs::symlink_metadata(d.join("optim2")).unwrap().permissions().mode() & 0o777, 0o700);
        write_private(&d, "optim2/sgd.msl", "two!").unwrap();
        assert_eq!(fs::read_to_string(&p).unwrap(), "two!");
        write_private(&d, "optim2/sgd.msl", "two!").unwrap();
        let left: Vec<_> = fs::read_dir(d.join("optim2")).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(left, ["sgd.msl"], "no temporary files are left behind");
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_shared_folder_is_not_private() {
        let d = scratch("shared");
        let open = d.join("open");
        DirBuilder::new().mode(0o777).create(&open).unwrap();
        fs::set_permissions(&open, fs::Permissions::from_mode(0o777)).unwrap();
        assert!(private_dir(&open, false).is_none(), "others may write to it");
        let link = d.join("link");
        symlink(&d, &link).unwrap();
        assert!(private_dir(&link, false).is_none(), "a link");
        assert_eq!(private_dir(&d.join("new"), false).as_deref(), Some(d.join("new").as_path()));
        assert!(stdlib_dir().is_some_and(|p| private_dir(p, false).is_some()));
        fs::remove_dir_all(&d).unwrap();
    }
}
