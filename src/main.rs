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
    // Deeply nested programs recurse in the checker; a large stack (reserved, not committed)
    // keeps such input a diagnostic instead of a crash.
    let child = std::thread::Builder::new().stack_size(1 << 30).spawn(cli::main);
    match child.map(|h| h.join()) {
        Ok(Ok(code)) => ExitCode::from(code),
        Ok(Err(_)) => {
            eprintln!("error: internal compiler error (a bug in msl); please report it with the input that caused it");
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("error: cannot start: {e}");
            ExitCode::from(2)
        }
    }
}
