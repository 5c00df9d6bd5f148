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
//! Only the thread that turned lingering on (the owner) starts it: the `msl` command does, on
//! its interpreter's thread, worker 0 of the pool (`src/main.rs`), so the parallel sections
//! that count are the interpreter's kernels, not a product inside another kernel's task. A
//! linger job never runs on the owner (which may pick it from its own queue while it waits
//! inside a parallel section; the job then returns at once). Libraries and tests that never
//! call [`enable`] keep rayon's behaviour.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// How long the other workers stay awake after the last parallel section.
pub const LINGER: Duration = Duration::from_micros(500);

/// The rayon index of the thread that turned lingering on, plus one (0: off).
static OWNER: AtomicUsize = AtomicUsize::new(0);
/// Linger jobs spawned and not yet returned.
static ALIVE: AtomicUsize = AtomicUsize::new(0);
/// When the last parallel section ended, in nanoseconds since [`epoch`].
static LAST: AtomicU64 = AtomicU64::new(0);

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn now() -> u64 {
    u64::try_from(epoch().elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// The calling thread's rayon index plus one (0 outside a pool).
fn me() -> usize {
    rayon::current_thread_index().map_or(0, |i| i + 1)
}

/// Turns lingering on for parallel sections that the calling thread, a worker of a rayon pool,
/// ends (off everywhere with `false`, or outside a pool).
pub fn enable(on: bool) {
    OWNER.store(if on { me() } else { 0 }, Relaxed);
}

/// Whether lingering is on.
pub fn enabled() -> bool {
    OWNER.load(Relaxed) != 0
}

/// Linger jobs spawned and not yet returned (at most the pool's other workers).
pub fn alive() -> usize {
    ALIVE.load(Relaxed)
}

/// Marks the end of a parallel section: on the owner's thread, the pool's other workers stay
/// awake (stealing work as it comes) for [`LINGER`] from now; elsewhere nothing. Cheap when
/// they already are.
pub fn linger() {
    let owner = OWNER.load(Relaxed);
    if owner == 0 || me() != owner {
        return;
    }
    let others = rayon::current_num_threads().saturating_sub(1);
    if others == 0 {
        return;
    }
    LAST.store(now(), Relaxed);
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
    let me = me();
    let limit = u64::try_from(LINGER.as_nanos()).unwrap_or(u64::MAX);
    loop {
        let owner = OWNER.load(Relaxed);
        if owner == 0 || owner == me {
            break;
        }
        match rayon::yield_now() {
            Some(rayon::Yield::Executed) => {}
            Some(rayon::Yield::Idle) if now().saturating_sub(LAST.load(Relaxed)) < limit => std::hint::spin_loop(),
            _ => break,
        }
    }
    ALIVE.fetch_sub(1, Relaxed);
}
