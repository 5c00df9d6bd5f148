//! Where checks run. Each open document has a worker thread that keeps the check of its current
//! text, so that the requests an editor sends after each edit (diagnostics, hover, inlay hints,
//! symbols) share one check instead of each making its own; the checker's results are not `Send`,
//! so they stay on that thread and the questions travel to it as closures. Texts that are not an
//! open document (an unopened file, completion's patched text) are checked on a thread of their
//! own, at most `MAX_ONE_OFF` at a time.
//!
//! The worker drops its check when the document is closed (the thread ends) or after `IDLE`
//! without questions, and then hands freed memory back to the system: a check takes about two
//! hundred times the size of its text, and the C allocator keeps freed memory for reuse.

use crate::worker;
use lang::check::Checked;
use std::path::PathBuf;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tower_lsp_server::ls_types::Uri;

/// How long a worker keeps a check that nothing asks about.
const IDLE: Duration = Duration::from_secs(60);
/// How long one question may keep a worker busy before the worker is taken to be stuck (a
/// check that never ends) and replaced. Much longer than a request's time limit: a check that
/// outlasts its request still finishes and is kept for the questions after it.
const STUCK: Duration = Duration::from_secs(120);
/// Most checks of texts other than open documents at once.
pub const MAX_ONE_OFF: usize = 4;

/// What a question's answer is when it has none: a panic's message, or why the file is missing.
pub type Outcome<T> = Result<T, String>;

/// A check kept by a document's worker, with the text it is of (compared by address: every
/// change of the document makes a new `Arc`).
struct Kept {
    text: Arc<str>,
    checked: Checked,
}

type Job = Box<dyn FnOnce(&mut Option<Kept>) + Send>;

/// The sending end of a document's worker; dropping it ends the thread once it is idle.
pub struct DocWorker {
    tx: mpsc::Sender<Job>,
    /// Since when the worker has been answering its current question, if it is.
    busy: Arc<Mutex<Option<Instant>>>,
    #[cfg(test)]
    thread: std::thread::JoinHandle<()>,
}

/// Where a document lives: its name for diagnostics and the folder its `use "…"` paths start from.
pub fn doc_location(uri: &Uri) -> (String, PathBuf) {
    let cwd = std::env::current_dir().unwrap_or_default();
    match uri.to_file_path() {
        Some(p) if p.is_absolute() => {
            let dir = p.parent().map(|d| d.to_path_buf()).unwrap_or(cwd);
            (p.display().to_string(), dir)
        }
        _ => (uri.as_str().to_string(), cwd),
    }
}

/// The URIs checked so far, for tests to count checks by.
#[cfg(test)]
pub static CHECKED: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());

fn check(uri: &Uri, text: &str) -> Checked {
    #[cfg(test)]
    CHECKED.lock().unwrap_or_else(|e| e.into_inner()).push(uri.as_str().to_string());
    let (name, dir) = doc_location(uri);
    lang::check::check_source(&name, text, &dir)
}

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    let text = p.downcast_ref::<&str>().map(|s| s.to_string()).or_else(|| p.downcast_ref::<String>().cloned());
    format!("panicked: {}", text.unwrap_or_default())
}

/// Returns memory freed by a dropped check to the system. Two caches keep it otherwise: msl's
/// allocator keeps freed blocks of 64 KiB and more for reuse (`kernels::pool`, up to 2 GiB; meant
/// for the interpreter's tensors), and glibc keeps the rest of its heap. Measured on a 900 KB
/// document: 210 MB resident with its check, 101 MB after closing it with only the second cache
/// emptied, 23 MB with both (19 MB before opening it).
fn release_memory() {
    // SAFETY: every `Pool` in this workspace, and the global allocator of `msl` (src/alloc.rs)
    // in particular, wraps `System`, so cached blocks came from `System`; in a process without a
    // `Pool` the cache is empty and nothing is freed.
    unsafe { kernels::pool::release(&std::alloc::System) };
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `malloc_trim` only returns free pages of the C heap to the system.
    unsafe {
        libc::malloc_trim(0);
    }
}

impl DocWorker {
    /// Starts the worker thread of a document.
    pub fn start() -> std::io::Result<DocWorker> {
        let (tx, rx) = mpsc::channel::<Job>();
        let busy = Arc::new(Mutex::new(None));
        let since = busy.clone();
        let set = move |at: Option<Instant>| *since.lock().unwrap_or_else(|e| e.into_inner()) = at;
        let _thread = worker::start("msl-doc", &worker::STACKS, move || {
            let mut kept = None;
            loop {
                match rx.recv_timeout(IDLE) {
                    Ok(job) => {
                        set(Some(Instant::now()));
                        job(&mut kept);
                        set(None);
                    }
                    Err(mpsc::RecvTimeoutError::Timeout) => {
                        if kept.take().is_some() {
                            release_memory();
                        }
                    }
                    Err(mpsc::RecvTimeoutError::Disconnected) => break,
                }
            }
            drop(kept);
            release_memory();
        })?;
        Ok(DocWorker {
            tx,
            busy,
            #[cfg(test)]
            thread: _thread,
        })
    }

    /// Drops the sender, as closing the document does, and returns the thread to wait for.
    #[cfg(test)]
    pub fn close(self) -> std::thread::JoinHandle<()> {
        self.thread
    }

    /// True when the worker has been answering one question for longer than `STUCK`.
    pub fn stuck(&self) -> bool {
        self.busy.lock().unwrap_or_else(|e| e.into_inner()).is_some_and(|t| t.elapsed() > STUCK)
    }

    /// Asks `f` about the check of `text` (checked now unless it is the one kept). `None` when
    /// the worker has ended (it only does when its sender is dropped, so this is a bug guard).
    pub fn ask<T, F>(&self, uri: &Uri, text: Arc<str>, f: F) -> Option<tokio::sync::oneshot::Receiver<Outcome<T>>>
    where
        T: Send + 'static,
        F: FnOnce(&Checked, &Uri) -> T + Send + 'static,
    {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let uri = uri.clone();
        let job: Job = Box::new(move |kept: &mut Option<Kept>| {
            if tx.is_closed() {
                return; // the request gave up (or was cancelled) while this waited: no check for it
            }
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                if !kept.as_ref().is_some_and(|k| Arc::ptr_eq(&k.text, &text)) {
                    // The old check goes first, so that two are never held at once.
                    if kept.take().is_some() {
                        release_memory();
                    }
                    let checked = check(&uri, &text);
                    *kept = Some(Kept { text, checked });
                }
                let k = kept.as_ref().map(|k| &k.checked).expect("just kept");
                f(k, &uri)
            }));
            if r.is_err() {
                *kept = None; // a check that panicked half-way is not kept
            }
            let _ = tx.send(r.map_err(|p| panic_message(&*p)));
        });
        self.tx.send(job).ok()?;
        Some(rx)
    }
}

/// Where the text of a one-off check comes from.
pub enum Text {
    Given(String),
    /// The file the URI names, read only if it is a small regular file.
    File,
}

/// Checks a text on a thread of its own and asks `f` about it.
pub fn one_off<T, F>(
    uri: &Uri,
    text: Text,
    f: F,
    permit: tokio::sync::OwnedSemaphorePermit,
) -> std::io::Result<tokio::sync::oneshot::Receiver<Outcome<T>>>
where
    T: Send + 'static,
    F: FnOnce(&Checked, &Uri) -> T + Send + 'static,
{
    let (tx, rx) = tokio::sync::oneshot::channel();
    let uri = uri.clone();
    let _ = worker::start("msl-check", &worker::STACKS, move || {
        let _permit = permit;
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let text = match text {
                Text::Given(t) => t,
                Text::File => {
                    let path = uri.to_file_path().ok_or_else(|| "is not a file".to_string())?;
                    crate::cache::read_regular(&path, crate::cache::MAX_FILE)
                        .map_err(|e| format!("is not open and cannot be read: {e}"))?
                }
            };
            let c = check(&uri, &text);
            Ok(f(&c, &uri))
        }));
        let _ = tx.send(r.unwrap_or_else(|p| Err(panic_message(&*p))));
        release_memory();
    })?;
    Ok(rx)
}
