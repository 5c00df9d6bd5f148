//! `threads::linger`: after a parallel section that the owner (the thread that turned
//! lingering on) ends, the other workers stay awake for a bounded time, steal the work that
//! comes meanwhile, and then stop spinning; sections other threads end start nothing.

use kernels::threads;
use rayon::prelude::*;
use std::time::{Duration, Instant};

fn wait_until_quiet(limit: Duration) {
    let t = Instant::now();
    while threads::alive() > 0 {
        assert!(t.elapsed() < limit, "linger jobs still alive after {limit:?}");
        std::thread::sleep(Duration::from_micros(200));
    }
}

fn section(round: u64) {
    let s: u64 = (0..100_000u64).into_par_iter().map(|i| i * round).sum();
    assert_eq!(s, 4_999_950_000 * round);
}

#[test]
fn workers_linger_after_the_owner_s_parallel_sections_then_stop() {
    let pool = rayon::ThreadPoolBuilder::new().num_threads(3).build().unwrap();
    let (most, owner) = pool.install(|| {
        // Off: nothing is spawned.
        section(1);
        threads::linger();
        assert_eq!(threads::alive(), 0);
        threads::enable(true);
        assert!(threads::enabled());
        let mut most = 0;
        for round in 0..50u64 {
            // Parallel sections separated by serial pauses shorter than the linger time: the
            // lingering workers steal the sections' tasks, and every result is exact.
            section(round);
            threads::linger();
            most = most.max(threads::alive());
            assert!(threads::alive() <= 2, "at most one job per other worker");
            let t = Instant::now();
            while t.elapsed() < Duration::from_micros(100) {
                std::hint::spin_loop();
            }
        }
        (most, rayon::current_thread_index().unwrap())
    });
    assert!(most >= 1, "no worker lingered");
    // The jobs end once the last section is `LINGER` old (allowing for a loaded machine).
    wait_until_quiet(Duration::from_secs(5));
    // A section ended on another thread (a product inside another kernel's task) starts
    // nothing: only the owner's do.
    pool.broadcast(|ctx| {
        if ctx.index() != owner {
            section(2);
            threads::linger();
        }
    });
    std::thread::spawn(threads::linger).join().unwrap();
    assert_eq!(threads::alive(), 0);
    threads::enable(false);
    assert!(!threads::enabled());
}
