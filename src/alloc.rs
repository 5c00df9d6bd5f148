//! The process's allocator: the system one behind `kernels::pool`'s cache of large blocks,
//! counting live heap bytes and their peak, so that `msl run --mode jit --explain` can report
//! what a memory plan saves (blocks in the cache are not live). Blocks of 64 KiB and more are
//! counted at once; smaller ones add up per thread and reach the shared figures 64 KiB at a
//! time, so the figures lag by less than that per thread: an atomic update on every
//! allocation and free was a fifth of the interpreter's time on small tensors.
//!
//! It also turns running out of memory into the contract's run-time error. Rust's default
//! answer to a failed allocation is to print `memory allocation of N bytes failed` and abort
//! (exit 134), and stable Rust offers no hook to change that. So when the system refuses a
//! request, this allocator first frees the pool's cached blocks and tries again, and if that
//! fails too it writes `error: out of memory: zeros at train.msl:3 asked for N bytes` and ends
//! the process with exit status 2. The operation and its line come from the interpreter
//! ([`lang::interp::applying`]) and the sources registered with [`with_sources`]. Nothing on
//! that path allocates: the message is formatted into a buffer on the stack. A consequence is
//! that a null pointer never reaches a caller, so `try_reserve` cannot observe a failure; no
//! code of msl relies on it.

use kernels::pool::Pool;
use lang::source::SourceMap;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicIsize, AtomicPtr, Ordering};

pub struct Counting;

static INNER: Pool<System> = Pool(System);

/// Live bytes as counted so far (a block allocated on one thread and freed on another can make
/// it briefly negative), and the most there have been.
static LIVE: AtomicIsize = AtomicIsize::new(0);
static PEAK: AtomicIsize = AtomicIsize::new(0);

/// Bytes a thread counts on its own before adding them to [`LIVE`]; blocks of this size and
/// more are added at once.
const BATCH: isize = 64 << 10;

thread_local! {
    /// This thread's bytes not yet added to [`LIVE`] (a `const` cell with no destructor: the
    /// allocator may use it at any time, the thread's exit included).
    static PENDING: Cell<isize> = const { Cell::new(0) };
}

/// The sources of the program being run, for the out-of-memory message (null when none).
static SOURCES: AtomicPtr<SourceMap> = AtomicPtr::new(std::ptr::null_mut());

/// Counts `n` more (fewer, when negative) live bytes.
fn count(n: isize) {
    let due = if n.abs() >= BATCH {
        Some(n)
    } else {
        PENDING
            .try_with(|p| {
                let v = p.get() + n;
                if v.abs() >= BATCH {
                    p.set(0);
                    Some(v)
                } else {
                    p.set(v);
                    None
                }
            })
            .unwrap_or(Some(n))
    };
    if let Some(v) = due {
        let now = LIVE.fetch_add(v, Ordering::Relaxed) + v;
        // A locked read-modify-write only for a new peak.
        if v > 0 && now > PEAK.load(Ordering::Relaxed) {
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
    }
}

fn grew(n: usize) {
    count(isize::try_from(n).unwrap_or(isize::MAX));
}

fn shrank(n: usize) {
    count(-isize::try_from(n).unwrap_or(isize::MAX));
}

/// After the system refused a request: frees the cached blocks, retries once with `again`, and
/// ends the process with the out-of-memory error when that fails too.
fn retry_or_exit(size: usize, again: impl FnOnce() -> *mut u8) -> *mut u8 {
    // SAFETY: the cached blocks came from `System`, the allocator `INNER` wraps.
    unsafe { kernels::pool::release(&System) };
    let p = again();
    if p.is_null() {
        out_of_memory(size);
    }
    p
}

// SAFETY: every call forwards to the pool over `System` with the caller's arguments; the counters only
// observe sizes, and a failed request either succeeds on the retry or never returns.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        // SAFETY: forwarded as is (both times).
        let mut p = unsafe { INNER.alloc(l) };
        if p.is_null() {
            p = retry_or_exit(l.size(), || unsafe { INNER.alloc(l) });
        }
        grew(l.size());
        p
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        // SAFETY: forwarded as is (both times).
        let mut p = unsafe { INNER.alloc_zeroed(l) };
        if p.is_null() {
            p = retry_or_exit(l.size(), || unsafe { INNER.alloc_zeroed(l) });
        }
        grew(l.size());
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: forwarded as is.
        unsafe { INNER.dealloc(p, l) };
        shrank(l.size());
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        // SAFETY: forwarded as is (both times); a failed realloc leaves `p` valid for the retry.
        let mut q = unsafe { INNER.realloc(p, l, new) };
        if q.is_null() {
            q = retry_or_exit(new, || unsafe { INNER.realloc(p, l, new) });
        }
        shrank(l.size());
        grew(new);
        q
    }
}

/// Live heap bytes now, and the most there have been since [`reset_peak`].
pub fn heap() -> (usize, usize) {
    let bytes = |a: &AtomicIsize| usize::try_from(a.load(Ordering::Relaxed)).unwrap_or(0);
    (bytes(&LIVE), bytes(&PEAK))
}

/// Starts a new peak from the bytes live now.
pub fn reset_peak() {
    PEAK.store(LIVE.load(Ordering::Relaxed), Ordering::Relaxed);
}

/// Runs `f` (which interprets a program of `sources`) with the sources registered, so that an
/// out-of-memory message can name the file and line of the operation.
pub fn with_sources<R>(sources: &SourceMap, f: impl FnOnce() -> R) -> R {
    /// Unregisters the sources however `f` ends (a panic included), before they are dropped.
    struct Unregister(*mut SourceMap);
    impl Drop for Unregister {
        fn drop(&mut self) {
            SOURCES.store(self.0, Ordering::SeqCst);
        }
    }
    let before = SOURCES.swap(std::ptr::from_ref(sources).cast_mut(), Ordering::SeqCst);
    let _restore = Unregister(before);
    f()
}

/// A message buffer on the stack: formatting into it never allocates, and text past its end is
/// cut off.
struct StackText {
    buf: [u8; 1024],
    len: usize,
}

impl std::fmt::Write for StackText {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let n = s.len().min(self.buf.len() - self.len);
        self.buf[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
        self.len += n;
        Ok(())
    }
}

/// Writes the out-of-memory error for a request of `size` bytes and ends the process (exit 2).
fn out_of_memory(size: usize) -> ! {
    use std::fmt::Write;
    let mut text = StackText { buf: [0; 1024], len: 0 };
    let _ = text.write_str("error: out of memory: ");
    if let Some((prim, span)) = lang::interp::applying() {
        let _ = write!(text, "{}", prim.name());
        let sources = SOURCES.load(Ordering::SeqCst);
        // SAFETY: a registered map stays alive until `with_sources` unregisters it; the checks
        // below only read it (a file id from another program is skipped, not indexed).
        if let Some(sm) = unsafe { sources.as_ref() } {
            if sm.files().nth(span.file.0 as usize).is_some() {
                let (line, _) = sm.line_col(span.file, span.start);
                let _ = write!(text, " at {}:{line}", sm.name(span.file));
            }
        }
        let _ = text.write_str(" ");
    }
    let _ = writeln!(text, "asked for {size} bytes");
    // SAFETY: writes initialised bytes of a live buffer to stderr, then ends the process at once
    // (destructors and atexit handlers could allocate, and other threads may hold locks).
    unsafe {
        libc::write(2, text.buf.as_ptr().cast(), text.len);
        libc::_exit(2)
    }
}
