//! Helpers shared by the integration tests (each test file that needs one says `mod common;`;
//! a file uses some of them, hence the `allow`).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

/// A fresh directory under the test target's temporary folder, named by `prefix`, the process
/// and `name`, holding `files` (name, text).
pub fn scratch(prefix: &str, name: &str, files: &[(&str, &str)]) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "{prefix}-{}-{name}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create scratch dir");
    for (f, text) in files {
        std::fs::write(dir.join(f), text).expect("write test file");
    }
    dir
}

/// Equal outputs up to float rounding: the same words, and numbers within 1e-5 relative (a
/// sharded sum adds in another order than one process does).
pub fn same_up_to_rounding(a: &str, b: &str) -> bool {
    let split = |s: &str| -> Vec<String> {
        s.split(|c: char| c.is_whitespace() || "[](),".contains(c))
            .filter(|w| !w.is_empty())
            .map(str::to_string)
            .collect()
    };
    let (wa, wb) = (split(a), split(b));
    wa.len() == wb.len()
        && wa.iter().zip(&wb).all(|(x, y)| match (x.parse::<f64>(), y.parse::<f64>()) {
            (Ok(p), Ok(q)) => (p - q).abs() <= 1e-5 * p.abs().max(q.abs()) + 1e-6,
            _ => x == y,
        })
}
