//! The `msl` command line: a thin layer over the `lang` crate (and later `jit` and `lsp`).
//!
//! Exit status: 0 success, 1 the program was rejected (diagnostics), 2 a run-time error.

mod alloc;
mod cli;
mod dryrun;
mod jit_cmd;
mod metrics;
mod plot;
mod repl;
mod run;
mod spmd;
mod tfevents;
mod trace;

use std::process::ExitCode;

#[global_allocator]
static ALLOC: alloc::Counting = alloc::Counting;

/// The stack the command's thread asks for first. Deeply nested programs recurse in the
/// checker; a large stack (reserved, not committed) keeps such input a diagnostic instead of a
/// crash.
const COMMAND_STACK: usize = 1 << 30;
/// The smallest command stack tried when a limit on virtual memory refuses larger ones.
const MIN_COMMAND_STACK: usize = 16 << 20;
/// The stack of the other workers: they run only kernel chunks and compiled loops, which
/// recurse no deeper than rayon's splitting.
const WORKER_STACK: usize = 16 << 20;

fn main() -> ExitCode {
    // The command runs on worker 0 of the kernels' thread pool, one thread per core in all: the
    // interpreter's thread takes part in every parallel kernel, and an idle worker spinning
    // between two short kernels does not take a core from it (with a separate main thread, that
    // contention cost W5 about a fifth of its time in the scheduler).
    //
    // Under a limit on virtual memory (`ulimit -v`) the reservations must fit: the command's
    // stack is capped at a quarter of the limit, and when a thread cannot be made the next try
    // asks for a smaller stack or fewer workers, down to a single thread, instead of refusing to
    // start. A failed try leaves nothing behind that a later one needs, since each runs on a
    // thread of its own.
    // A device that fails to hand a tensor back ends the command with its own message (in `attempt`),
    // not a panic's.
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if info.payload().downcast_ref::<kernels::DeviceLost>().is_none() {
            default(info);
        }
    }));
    let mut stack = COMMAND_STACK.min(address_space_limit().map_or(usize::MAX, |l| l / 4)).max(MIN_COMMAND_STACK);
    let mut threads = default_threads();
    // "Resource temporarily unavailable" (EAGAIN) can pass: a machine busy with other processes'
    // threads refuses one for a moment. The smallest start is retried a few times before giving up.
    let mut retries = 5;
    loop {
        match attempt(stack, threads) {
            Attempt::Ran(code) => return ExitCode::from(code),
            Attempt::NoCommandThread(_) if stack > MIN_COMMAND_STACK => stack = (stack / 4).max(MIN_COMMAND_STACK),
            Attempt::NoPool(_) if threads > 1 => threads /= 2,
            Attempt::NoCommandThread(e) | Attempt::NoPool(e)
                if retries > 0 && e.contains("temporarily unavailable") =>
            {
                retries -= 1;
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            Attempt::NoCommandThread(e) | Attempt::NoPool(e) => {
                eprintln!("error: cannot start: {e}");
                return ExitCode::from(2);
            }
        }
    }
}

enum Attempt {
    /// The command ran, with this exit status.
    Ran(u8),
    /// The operating system refused the command's thread (its stack).
    NoCommandThread(String),
    /// The thread pool could not be built (a worker's thread was refused).
    NoPool(String),
}

/// Runs the command on a new thread with `stack` bytes of stack, as worker 0 of a pool of
/// `threads` threads.
fn attempt(stack: usize, threads: usize) -> Attempt {
    let spawned = std::thread::Builder::new().name("msl-0".into()).stack_size(stack).spawn(move || {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .use_current_thread()
            .stack_size(WORKER_STACK)
            .thread_name(|i| format!("msl-{i}"))
            .build();
        // The pool is kept (not dropped) while the command runs: this thread is its worker 0.
        let _pool = match pool {
            Ok(p) => p,
            Err(e) => return Attempt::NoPool(e.to_string()),
        };
        // The interpreter is worker 0 here: the others stay awake between its parallel kernels
        // (unless `MSL_WAIT_POLICY=passive`, for machines whose cores other jobs need).
        kernels::threads::enable(std::env::var("MSL_WAIT_POLICY").map_or(true, |v| v != "passive"));
        match std::panic::catch_unwind(cli::main) {
            Ok(code) => Attempt::Ran(code),
            Err(p) if p.downcast_ref::<kernels::DeviceLost>().is_some() => {
                if let Some(kernels::DeviceLost(why)) = p.downcast_ref::<kernels::DeviceLost>() {
                    eprintln!("error: the device failed: {why}");
                }
                Attempt::Ran(2)
            }
            Err(_) => {
                eprintln!(
                    "error: internal compiler error (a bug in msl); please report it with the input that caused it"
                );
                Attempt::Ran(2)
            }
        }
    });
    match spawned {
        Ok(handle) => handle.join().unwrap_or(Attempt::Ran(2)),
        Err(e) => Attempt::NoCommandThread(e.to_string()),
    }
}

/// The number of threads rayon would use: `RAYON_NUM_THREADS` if set, else one per core.
fn default_threads() -> usize {
    let from_env = std::env::var("RAYON_NUM_THREADS").ok().and_then(|v| v.parse::<usize>().ok()).filter(|&n| n > 0);
    from_env.unwrap_or_else(|| {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        // The ranks of a job on this machine share its cores (`mpirun -n 2` on 2 cores: 1 each).
        let local = std::env::var("OMPI_COMM_WORLD_LOCAL_SIZE").ok().and_then(|v| v.parse::<usize>().ok());
        (cores / local.unwrap_or(1).max(1)).max(1)
    })
}

/// The process's limit on virtual memory (`ulimit -v`), when there is one.
fn address_space_limit() -> Option<usize> {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `getrlimit` writes one `rlimit` through a valid pointer.
    let ok = unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut r) } == 0;
    (ok && r.rlim_cur != libc::RLIM_INFINITY).then(|| usize::try_from(r.rlim_cur).unwrap_or(usize::MAX))
}
