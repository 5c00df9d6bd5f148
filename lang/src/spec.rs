//! Literate specs: Markdown files whose ```` ```msl ```` blocks are programs and whose
//! ```` ```error ```` / ```` ```output ```` blocks say what msl must do with them. Shared by
//! `msl test` and the test-suite harness.

use crate::check;
use crate::interp::Interp;
use std::path::{Path, PathBuf};

/// One program of a spec file with its expectation.
pub struct Block {
    /// Line (0-based) of the opening fence of the msl block.
    pub start: usize,
    pub code: String,
    /// The expectation: kind (`error` or `output`), first and last line (fences), content.
    pub expect: Option<(String, usize, usize, String)>,
}

pub fn parse_blocks(text: &str) -> Vec<Block> {
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

pub enum Outcome {
    /// Diagnostics, one per line: `CODE line:col: message`.
    Rejected(String),
    /// What the program printed, ending with `error[CODE] line:col: message` if it failed.
    Ran(String),
}

impl Outcome {
    pub fn kind(&self) -> &'static str {
        match self {
            Outcome::Rejected(_) => "error",
            Outcome::Ran(_) => "output",
        }
    }
    pub fn text(&self) -> &str {
        match self {
            Outcome::Rejected(s) | Outcome::Ran(s) => s,
        }
    }
}

/// Checks a block and, if it checks, runs its `main` and then its `test` blocks.
pub fn run_block(code: &str, dir: &Path) -> Outcome {
    run_block_with(code, dir, &mut |_| {})
}

/// `run_block` with a hook that configures the interpreter before anything runs; the spec
/// harness installs the JIT's accelerator with it, so every block also runs compiled.
pub fn run_block_with(code: &str, dir: &Path, setup: &mut dyn FnMut(&mut Interp<'_>)) -> Outcome {
    run_block_prepared(code, dir, &mut |_| {}, setup)
}

/// `run_block_with` where `prepare` may first transform the checked program (the JIT's `-O2`
/// passes).
pub fn run_block_prepared(
    code: &str,
    dir: &Path,
    prepare: &mut dyn FnMut(&mut crate::ir::Program),
    setup: &mut dyn FnMut(&mut Interp<'_>),
) -> Outcome {
    // An absolute folder names the files a block uses the same way from any working directory.
    let canon = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    let dir = canon.as_path();
    let mut c = check::check_source("spec.msl", code, dir);
    let pos = |span: crate::source::Span| {
        let (line, col) = c.sources.line_col(span.file, span.start);
        let file = c.sources.name(span.file);
        if file == "spec.msl" {
            format!("{line}:{col}")
        } else {
            format!("{file}:{line}:{col}")
        }
    };
    if c.has_errors() {
        // Files a block uses are named from the spec's folder (`spec/fixtures/a.msl`), wherever
        // `msl test` runs from: expectations do not depend on the working directory.
        let short = dir.file_name().map(|n| PathBuf::from(n.to_os_string()));
        let mut names: Vec<(String, String)> = Vec::new();
        for (_, f) in c.sources.files() {
            let p = std::fs::canonicalize(&f.name).unwrap_or_else(|_| PathBuf::from(&f.name));
            if let (Some(s), Ok(rel)) = (&short, p.strip_prefix(dir)) {
                let want = s.join(rel).display().to_string();
                if want != f.name && f.name != "spec.msl" {
                    names.push((f.name.clone(), want));
                }
            }
        }
        names.sort_by_key(|(n, _)| std::cmp::Reverse(n.len()));
        let mut out = String::new();
        for d in &c.diagnostics {
            let mut line = format!("{} {}: {}\n", d.code, pos(d.primary.span), d.message);
            // Through placeholders, so that a name never rewrites inside another's replacement.
            for (i, (from, _)) in names.iter().enumerate() {
                line = line.replace(from.as_str(), &format!("\u{0}{i}\u{0}"));
            }
            for (i, (_, to)) in names.iter().enumerate() {
                line = line.replace(&format!("\u{0}{i}\u{0}"), to);
            }
            out.push_str(&line);
        }
        return Outcome::Rejected(out);
    }
    prepare(&mut c.program);
    let scratch = Scratch::new();
    let mut buf: Vec<u8> = Vec::new();
    let mut failure = None;
    {
        let mut it = Interp::new(&c.program, Box::new(&mut buf));
        it.move_at_last_uses();
        it.source_dir = Some(dir.to_path_buf());
        it.work_dir = scratch.as_ref().map(|s| s.0.clone());
        setup(&mut it);
        let mut funcs: Vec<crate::types::FuncId> = c.program.main.into_iter().collect();
        funcs.extend(c.program.tests.iter().map(|t| t.func));
        for f in funcs {
            if let Err(e) = it.run_main(f) {
                failure = Some(e);
                break;
            }
        }
    }
    let mut out = String::from_utf8_lossy(&buf).into_owned();
    if let Some(e) = failure {
        out.push_str(&format!("error[{}] {}: {}\n", e.code, pos(e.span), e.message));
    }
    Outcome::Ran(out)
}

/// A fresh, empty working folder for one run of a block, removed afterwards: what an example
/// saves lands there, and no run sees the files of another.
struct Scratch(std::path::PathBuf);

impl Scratch {
    fn new() -> Option<Scratch> {
        static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("msl-spec-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).ok()?;
        Some(Scratch(dir))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Whether `got` shows what `expected` shows up to a device's rounding: the same text, except
/// that each number written as a float (a `.`, an exponent, `nan`, `inf`) may differ by 1e-5 of
/// its size (the contract's bound for f32 on a device), by 1e-6, or by two units in the last
/// digit `expected` writes (a bf16 or f16 value prints few digits). Integers and everything else
/// must be equal. `msl test --device cuda` compares outputs this way.
pub fn outputs_agree(expected: &str, got: &str) -> bool {
    let (a, b) = (tokens(expected), tokens(got));
    a.len() == b.len()
        && a.iter().zip(&b).all(|(x, y)| match (x, y) {
            (Token::Float(tx, vx), Token::Float(_, vy)) => {
                vx == vy
                    || vx.is_nan() && vy.is_nan()
                    || (vx - vy).abs() <= (1e-5 * vx.abs()).max(1e-6).max(2.0 * last_digit(tx))
            }
            _ => x == y,
        })
}

#[derive(Debug, PartialEq)]
enum Token<'a> {
    Text(&'a str),
    Float(&'a str, f64),
}

/// One unit in the last significant digit `t` writes (`2.72` → 0.01, `1.5e-3` → 0.0001).
fn last_digit(t: &str) -> f64 {
    let (mantissa, exp) = match t.find(['e', 'E']) {
        Some(i) => (&t[..i], t[i + 1..].parse::<i32>().unwrap_or(0)),
        None => (t, 0),
    };
    let decimals = mantissa.find('.').map_or(0, |i| mantissa.len() - i - 1) as i32;
    10f64.powi(exp - decimals)
}

/// `s` split into floats and the text between them (integers stay text).
fn tokens(s: &str) -> Vec<Token<'_>> {
    let bytes = s.as_bytes();
    let mut out = Vec::new();
    let (mut i, mut text) = (0, 0);
    while i < bytes.len() {
        let starts = i == 0 || !(bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_' || bytes[i - 1] == b'.');
        if let Some(n) = starts.then(|| float_len(&s[i..])).flatten() {
            if text < i {
                out.push(Token::Text(&s[text..i]));
            }
            let t = &s[i..i + n];
            out.push(Token::Float(t, t.parse().unwrap_or(f64::NAN)));
            i += n;
            text = i;
        } else {
            i += s[i..].chars().next().map_or(1, char::len_utf8);
        }
    }
    if text < s.len() {
        out.push(Token::Text(&s[text..]));
    }
    out
}

/// The length of the float `s` starts with (`-1.5e-3`, `0.25`, `nan`, `-inf`), or `None`.
fn float_len(s: &str) -> Option<usize> {
    let b = s.as_bytes();
    let sign = usize::from(b.first() == Some(&b'-'));
    for word in ["nan", "inf"] {
        if s[sign..].starts_with(word) && !b.get(sign + 3).is_some_and(|c| c.is_ascii_alphanumeric()) {
            return Some(sign + 3);
        }
    }
    let digits = |from: usize| b[from..].iter().take_while(|c| c.is_ascii_digit()).count();
    let whole = digits(sign);
    if whole == 0 {
        return None;
    }
    let mut n = sign + whole;
    let mut is_float = false;
    if b.get(n) == Some(&b'.') && digits(n + 1) > 0 {
        n += 1 + digits(n + 1);
        is_float = true;
    }
    if matches!(b.get(n), Some(b'e' | b'E')) {
        let s2 = n + 1 + usize::from(matches!(b.get(n + 1), Some(b'+' | b'-')));
        if digits(s2) > 0 {
            n = s2 + digits(s2);
            is_float = true;
        }
    }
    let ends = !b.get(n).is_some_and(|c| c.is_ascii_alphanumeric() || *c == b'_');
    (is_float && ends).then_some(n)
}

#[cfg(test)]
mod tests {
    use super::outputs_agree;

    #[test]
    fn outputs_agree_up_to_a_devices_rounding() {
        assert!(outputs_agree("0.6931472 [1.0, 2.5]\n", "0.69314724 [1.0, 2.5]\n"));
        assert!(outputs_agree("[2.72, 7.38]", "[2.73, 7.39]"), "bf16 values differ in their last digit");
        assert!(outputs_agree("loss 1.5e-3 nan -inf", "loss 1.500001e-3 nan -inf"));
        assert!(outputs_agree("0.0", "1e-08"));
        assert!(!outputs_agree("0.6931472", "0.6932"), "beyond 1e-5");
        assert!(!outputs_agree("[2.72, 7.38]", "[2.75, 7.38]"), "three units in the last digit");
        assert!(!outputs_agree("3 4", "3 5"), "integers are exact");
        assert!(!outputs_agree("3.0", "3"), "a float is not an integer");
        assert!(!outputs_agree("true", "false"));
        assert!(!outputs_agree("[1.0, 2.0]", "[1.0, 2.0, 3.0]"));
        assert!(!outputs_agree("nan", "1.0"));
        assert!(outputs_agree(
            "error[E0603] 3:11: integer division by zero",
            "error[E0603] 3:11: integer division by zero"
        ));
        assert!(!outputs_agree("x1.5", "x1.6"), "a number inside a word is text");
    }
}
