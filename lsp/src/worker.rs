//! Threads for checks: a large stack when the system grants one, a smaller one when it does
//! not, and an error (never a panic) when no thread can be had.
//!
//! The checker recurses once per nesting level of the program (bounded by the parser's limits),
//! so a check wants a deep stack; the stack is reserved address space, not memory, but under a
//! limit on address space (`ulimit -v`) a large reservation can fail. tokio's blocking pool
//! panics when it cannot start a thread, so checks run on threads made here instead.

use std::io;
use std::sync::{Arc, Mutex};
use std::thread;

/// Stack sizes tried for a checking thread, largest first. The smallest still holds a check of
/// a program at the parser's nesting limits in a debug build (see the test below).
pub const STACKS: [usize; 3] = [512 << 20, 128 << 20, 64 << 20];

/// Runs `f` on a new thread named `name`, trying each of `stacks` in turn; the last error when
/// no thread could be started. `f` should catch its own panics: nothing waits for the thread.
pub fn start<F>(name: &str, stacks: &[usize], f: F) -> io::Result<thread::JoinHandle<()>>
where
    F: FnOnce() + Send + 'static,
{
    // `Builder::spawn` consumes its closure even when it fails, so the job waits in a slot that
    // the thread which does start empties.
    let job = Arc::new(Mutex::new(Some(f)));
    let mut error = io::Error::other("no stack size to try");
    for &stack in stacks {
        let job = job.clone();
        let started = thread::Builder::new().name(name.to_string()).stack_size(stack).spawn(move || {
            let taken = job.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some(f) = taken {
                f();
            }
        });
        match started {
            Ok(handle) => return Ok(handle),
            Err(e) => error = e,
        }
    }
    Err(error)
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::sync::mpsc::channel;

    #[test]
    fn a_stack_that_cannot_be_had_falls_back_to_a_smaller_one() {
        // No address space holds a stack this large, so the first attempt always fails.
        let huge = 1usize << 62;
        let (tx, rx) = channel();
        start("t", &[huge, 1 << 20], move || tx.send(6 * 7).unwrap()).unwrap();
        assert_eq!(rx.recv().unwrap(), 42);
        let (tx, rx) = channel::<u8>();
        let e = start("t", &[huge], move || tx.send(1).unwrap()).expect_err("no thread can be started");
        assert!(!e.to_string().is_empty());
        assert!(rx.recv().is_err(), "the job was dropped without running");
    }

    #[test]
    fn the_smallest_stack_holds_a_check_at_the_nesting_limits() {
        // Brackets at the lexer's limit, and an operator chain at the checker's.
        let brackets = lang::syntax::lexer::MAX_NESTING - 1;
        let ops = lang::syntax::MAX_EXPR_DEPTH - 10;
        let text = format!(
            "fn main() {{\n    let a = {}1{}\n    let b = 1{}\n    print(a, b)\n}}\n",
            "(".repeat(brackets),
            ")".repeat(brackets),
            " + 1".repeat(ops)
        );
        let smallest = *STACKS.last().unwrap();
        let run = move || {
            let c = lang::check::check_source("deep.msl", &text, std::path::Path::new("."));
            let _ = lang::ide::inlay_hints(&c, lang::source::FileId(0));
            c.diagnostics.len()
        };
        let n = thread::Builder::new().stack_size(smallest).spawn(run).unwrap().join().unwrap();
        assert_eq!(n, 0, "the deep program checks without errors");
    }
}
