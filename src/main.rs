//! The `msl` command line: a thin layer over the `lang` crate (and later `jit` and `lsp`).
//!
//! Exit status: 0 success, 1 the program was rejected (diagnostics), 2 a run-time error.

mod alloc;
mod cli;
mod jit_cmd;
mod repl;
mod run;

use std::process::ExitCode;

#[global_allocator]
static ALLOC: alloc::Counting = alloc::Counting;

fn main() -> ExitCode {
    // The command runs on a worker of the kernels' thread pool, one thread per core in all: the
    // interpreter's thread takes part in every parallel kernel, and an idle worker spinning
    // between two short kernels does not take a core from it (with a separate main thread, that
    // contention cost W5 about a fifth of its time in the scheduler). Deeply nested programs
    // recurse in the checker; a large stack (reserved, not committed) keeps such input a
    // diagnostic instead of a crash.
    let pool = rayon::ThreadPoolBuilder::new().stack_size(1 << 30).thread_name(|i| format!("msl-{i}")).build();
    let pool = match pool {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: cannot start: {e}");
            return ExitCode::from(2);
        }
    };
    match pool.install(|| std::panic::catch_unwind(cli::main)) {
        Ok(code) => ExitCode::from(code),
        Err(_) => {
            eprintln!("error: internal compiler error (a bug in msl); please report it with the input that caused it");
            ExitCode::from(2)
        }
    }
}
