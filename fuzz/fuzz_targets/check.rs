//! cargo-fuzz target: `lang::check::check_source` (and everything `msl check` does with its
//! result) on arbitrary bytes must never panic, overflow the stack or hang.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::path::Path;

/// What `msl check` does with a source text: check it, then render the diagnostics in every
/// message format, or verify and dump the typed IR when there are none.
fn check_everything(text: &str) {
    // Relative `use "…"` paths resolve into a directory that does not exist.
    let c = lang::check::check_source("fuzz.msl", text, Path::new("/nonexistent/msl-fuzz"));
    let _ = lang::diag::render(&c.diagnostics, &c.sources, false);
    let _ = lang::diag::render_short(&c.diagnostics, &c.sources);
    for d in &c.diagnostics {
        let _ = lang::diag::to_json(d, &c.sources).to_string();
    }
    if !c.has_errors() {
        let _ = lang::ir::verify::verify(&c.program);
        let _ = lang::ir::dump::dump(&c.program);
    }
}

fuzz_target!(|data: &[u8]| {
    // Exact text when the bytes are UTF-8, else their lossy decoding (U+FFFD for bad bytes),
    // which is what `msl check` reports E0108 on and then renders.
    let text = String::from_utf8_lossy(data).into_owned();
    // The CLI checks on a 1 GiB stack; nesting is bounded well below what 256 MiB needs.
    // A panic on this thread aborts the process (libfuzzer-sys's hook), which libFuzzer reports.
    std::thread::Builder::new()
        .stack_size(256 << 20)
        .spawn(move || check_everything(&text))
        .expect("spawn checker thread")
        .join()
        .expect("checker thread");
});
