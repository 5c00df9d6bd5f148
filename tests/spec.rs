//! The literate spec harness: runs every ```` ```msl ```` block of `spec/*.md` and compares it
//! with the ```` ```error ```` or ```` ```output ```` block that follows it.
//!
//! - A block followed by an `error` block must be rejected with exactly those diagnostics, one per
//!   line as `CODE line:col: message`.
//! - A block followed by an `output` block is run (`main`, then its `test` blocks) and its printed
//!   output must match exactly.
//! - A block with neither must check cleanly, and its `test` blocks must pass.
//!
//! `MSL_BLESS=1 cargo test --test spec` rewrites the expectation blocks from what msl does now
//! (and adds an `error` block to a rejected block that has none); review the diff before committing.
//! `MSL_SPEC=name` runs only files whose name contains `name`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

#[path = "support/spec_runner.rs"]
mod spec_runner;

struct Block {
    /// Line (0-based) of the opening fence of the msl block.
    start: usize,
    code: String,
    /// The expectation: kind, first and last line (fences included), content.
    expect: Option<(String, usize, usize, String)>,
}

fn parse_blocks(text: &str) -> Vec<Block> {
    let lines: Vec<&str> = text.lines().collect();
    let mut blocks = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let info = lines[i].trim_start().strip_prefix("```").map(str::trim);
        if info.is_some_and(|s| s == "msl") {
            let start = i;
            let mut code = String::new();
            i += 1;
            while i < lines.len() && lines[i].trim_start() != "```" {
                code.push_str(lines[i]);
                code.push('\n');
                i += 1;
            }
            i += 1;
            // The expectation, if any, is the next fenced block before any other msl block.
            let mut j = i;
            while j < lines.len() && lines[j].trim().is_empty() {
                j += 1;
            }
            let mut expect = None;
            if let Some(kind) = lines.get(j).and_then(|l| l.trim_start().strip_prefix("```")).map(str::trim) {
                if kind == "error" || kind == "output" {
                    let first = j;
                    let mut content = String::new();
                    j += 1;
                    while j < lines.len() && lines[j].trim_start() != "```" {
                        content.push_str(lines[j]);
                        content.push('\n');
                        j += 1;
                    }
                    expect = Some((kind.to_string(), first, j, content));
                    i = j + 1;
                }
            }
            blocks.push(Block { start, code, expect });
        } else {
            i += 1;
        }
    }
    blocks
}

fn spec_files(root: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(root)
        .map(|d| d.flatten().map(|e| e.path()).filter(|p| p.extension().is_some_and(|e| e == "md")).collect())
        .unwrap_or_default();
    files.sort();
    if let Ok(only) = std::env::var("MSL_SPEC") {
        files.retain(|f| f.to_string_lossy().contains(&only));
    }
    files
}

fn main() {
    // Specs may nest deeply; run on a large stack like the CLI does.
    let h = std::thread::Builder::new().stack_size(1 << 30).spawn(run).unwrap();
    let ok = h.join().unwrap_or(false);
    std::process::exit(if ok { 0 } else { 1 });
}

fn run() -> bool {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("spec");
    let bless = std::env::var_os("MSL_BLESS").is_some();
    let (mut passed, mut failed) = (0usize, 0usize);
    let mut report = String::new();
    for file in spec_files(&root) {
        let text = std::fs::read_to_string(&file).unwrap();
        let blocks = parse_blocks(&text);
        let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
        let mut edits: Vec<(usize, usize, Vec<String>)> = Vec::new();
        let name = file.file_name().unwrap().to_string_lossy().to_string();
        for b in &blocks {
            let label = format!("{name}:{}", b.start + 1);
            let kind = b.expect.as_ref().map(|e| e.0.as_str());
            let outcome = spec_runner::run_block(&b.code, &root, kind == Some("output"));
            let (actual_kind, actual) = match &outcome {
                spec_runner::Outcome::Rejected(d) => ("error", d.clone()),
                spec_runner::Outcome::Ran(out) => ("output", out.clone()),
            };
            let ok = match (&b.expect, actual_kind) {
                (Some((k, _, _, content)), ak) => k == ak && content == &actual,
                (None, "output") => true,
                (None, _) => false,
            };
            if ok {
                passed += 1;
                continue;
            }
            if bless {
                let mut new = vec![format!("```{actual_kind}")];
                new.extend(actual.lines().map(str::to_string));
                new.push("```".to_string());
                match &b.expect {
                    Some((_, first, last, _)) => edits.push((*first, *last + 1, new)),
                    None => {
                        let end = b.start + b.code.lines().count() + 2;
                        new.insert(0, String::new());
                        edits.push((end, end, new));
                    }
                }
                passed += 1;
                continue;
            }
            failed += 1;
            let expected = match &b.expect {
                Some((k, _, _, c)) => format!("```{k}\n{c}```"),
                None => "(no error)".to_string(),
            };
            let _ = writeln!(report, "\n--- {label}\n{}expected:\n{expected}\nactual:\n```{actual_kind}\n{actual}```", b.code);
        }
        if bless && !edits.is_empty() {
            edits.sort_by_key(|e| std::cmp::Reverse(e.0));
            for (a, z, new) in edits {
                lines.splice(a..z.min(lines.len()), new);
            }
            std::fs::write(&file, lines.join("\n") + "\n").unwrap();
        }
    }
    print!("{report}");
    println!("spec: {passed} passed, {failed} failed");
    failed == 0
}
