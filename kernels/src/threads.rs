//! Keeping the kernels' other rayon threads awake for a moment after a parallel kernel.
//!
//! A rayon worker that finds no work yields a few dozen times and then sleeps; the next
//! parallel kernel wakes it, which on a virtual machine took 10–15 µs: W3's step ran the
//! gradient of its second ReLU (128K elements) in 21–25 µs right after 70 µs of small
//! single-threaded kernels (the loss, the classifier's products), against 9 µs when the other
//! worker was still awake. [`linger`], called when a parallel section ends, has each other
//! worker run a job that keeps stealing rayon work ([`rayon::yield_now`]) and otherwise spins,
//! until [`LINGER`] has passed since the last parallel section: the policy of OpenMP's
//! `KMP_BLOCKTIME` and Eigen's spinning pool, bounded far below theirs (200 ms, resp. a few
//! ms). Programs that never run a parallel section never spin.
//!
//! The job never runs on the thread that called [`linger`] (that thread may pick it from its
//! own queue while it waits inside a parallel section; it then returns at once). [`enable`]
//! turns lingering on: the `msl` command does, where its interpreter is worker 0 of the pool
//! (`src/main.rs`); libraries and tests that share the global pool keep rayon's behaviour.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// How long the other workers stay awake after the last parallel section.
pub const LINGER: Duration = Duration::from_micros(500);

static ENABLED: AtomicBool = AtomicBool::new(false);
/// Linger jobs spawned and not yet returned.
static ALIVE: AtomicUsize = AtomicUsize::new(0);
/// When the last parallel section ended, in nanoseconds since [`epoch`].
static LAST: AtomicU64 = AtomicU64::new(0);
/// The rayon index of the thread that last called [`linger`], plus one (0: none).
static CALLER: AtomicUsize = AtomicUsize::new(0);

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn now() -> u64 {
    u64::try_from(epoch().elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// Turns lingering on or off for this process.
pub fn enable(on: bool) {
    ENABLED.store(on, Relaxed);
}

/// Whether lingering is on.
pub fn enabled() -> bool {
    ENABLED.load(Relaxed)
}

/// Linger jobs spawned and not yet returned (at most the pool's other workers).
pub fn alive() -> usize {
    ALIVE.load(Relaxed)
}

/// Marks the end of a parallel section: the pool's other workers stay awake (stealing work as
/// it comes) for [`LINGER`] from now. Cheap when they already are.
pub fn linger() {
    if !ENABLED.load(Relaxed) {
        return;
    }
    let others = rayon::current_num_threads().saturating_sub(1);
    if others == 0 {
        return;
    }
    LAST.store(now(), Relaxed);
    CALLER.store(rayon::current_thread_index().map_or(0, |i| i + 1), Relaxed);
    while ALIVE.load(Relaxed) < others {
        ALIVE.fetch_add(1, Relaxed);
        rayon::spawn(stay_awake);
    }
}

/// Calls [`linger`] when dropped: `let _awake = Linger;` before a parallel section keeps the
/// other workers awake after it, however the enclosing block ends.
pub struct Linger;

impl Drop for Linger {
    fn drop(&mut self) {
        linger();
    }
}

fn stay_awake() {
    let me = rayon::current_thread_index().map_or(0, |i| i + 1);
    let limit = u64::try_from(LINGER.as_nanos()).unwrap_or(u64::MAX);
    while me != CALLER.load(Relaxed) {
        match rayon::yield_now() {
            Some(rayon::Yield::Executed) => {}
            Some(rayon::Yield::Idle) if now().saturating_sub(LAST.load(Relaxed)) < limit => std::hint::spin_loop(),
            _ => break,
        }
    }
    ALIVE.fetch_sub(1, Relaxed);
}
