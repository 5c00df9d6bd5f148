//! Robustness of `msl check`: hostile input never makes msl panic, hang or exit oddly.
//!
//! LANGUAGE.md §9: exit status 0 (ok), 1 (program rejected) or 2 (run-time error such as a missing
//! file), and "msl itself never panics on any input". Three parts:
//!
//! - the built `msl` binary on hand-made hostile files (garbage bytes, invalid UTF-8, a 1 MB line,
//!   10,000 nested brackets, a huge literal, …), in both the human and the JSON message format,
//!   each under a 20 s watchdog;
//! - every ```` ```msl ```` block of the language contract (`../shared/design/LANGUAGE.md`, skipped
//!   with a note when that file is not there);
//! - a bounded, deterministic mutation fuzzer that runs the checker in-process on mutated seed
//!   programs (spec blocks and the stdlib) and fails on the first panic or hang, printing the
//!   mutated source. `fuzz/` has the open-ended cargo-fuzz target for the same entry point.

mod common;
use common::Rng;
use std::io::Read;
use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

/// How long one `msl check` (or one in-process check) may take before it counts as a hang.
const LIMIT: Duration = Duration::from_secs(20);

/// Words that only appear in stderr when msl crashed.
const CRASH_MARKERS: [&str; 4] = ["panicked", "RUST_BACKTRACE", "internal compiler error", "overflowed its stack"];

/// The keys every `--message-format json` diagnostic carries (LANGUAGE.md §9).
const JSON_KEYS: [&str; 9] =
    ["code", "severity", "message", "file", "line", "column", "end_line", "end_column", "labels"];

// ---------------------------------------------------------------- helpers

/// A fresh directory for this test's files.
fn scratch(name: &str) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "robustness-{}-{name}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).expect("create scratch dir");
    dir
}

struct Outcome {
    /// `None` when killed by a signal (e.g. a stack overflow abort) or by the watchdog.
    code: Option<i32>,
    stdout: String,
    stderr: String,
    elapsed: Duration,
}

/// Runs `msl check --message-format FORMAT FILE`, killing it after `LIMIT`.
fn run_check(file: &Path, format: &str) -> Outcome {
    run_check_within(file, format, LIMIT)
}

/// `run_check` with another limit.
fn run_check_within(file: &Path, format: &str, limit: Duration) -> Outcome {
    let mut child = Command::new(env!("CARGO_BIN_EXE_msl"))
        .args(["check", "--message-format", format])
        .arg(file)
        .env_remove("RUST_BACKTRACE")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn msl");
    // Drain both pipes on threads so that a chatty msl cannot block on a full pipe.
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            let _ = r.read_to_end(&mut v);
            String::from_utf8_lossy(&v).into_owned()
        })
    };
    let out = drain(Box::new(child.stdout.take().expect("stdout")));
    let err = drain(Box::new(child.stderr.take().expect("stderr")));
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait for msl") {
            break Some(s);
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    let elapsed = start.elapsed();
    Outcome {
        code: status.and_then(|s| s.code()),
        stdout: out.join().unwrap_or_default(),
        stderr: err.join().unwrap_or_default(),
        elapsed,
    }
}

/// The last part of a possibly huge output, for failure messages.
fn tail(s: &str) -> &str {
    let mut i = s.len().saturating_sub(3000);
    while !s.is_char_boundary(i) {
        i += 1;
    }
    &s[i..]
}

fn assert_robust(name: &str, o: &Outcome, allowed: &[i32]) {
    assert!(o.elapsed < LIMIT, "{name}: msl check did not finish within {LIMIT:?}");
    for bad in CRASH_MARKERS {
        assert!(!o.stderr.contains(bad), "{name}: stderr contains {bad:?}:\n{}", tail(&o.stderr));
    }
    assert!(
        o.code.is_some_and(|c| allowed.contains(&c)),
        "{name}: exit status {:?}, expected one of {allowed:?}; stderr:\n{}",
        o.code,
        tail(&o.stderr)
    );
}

/// Parses `--message-format json` output: one JSON object per line with every contract key,
/// and an exit status that agrees with the severities.
fn json_diagnostics(name: &str, o: &Outcome) -> Vec<serde_json::Value> {
    let diags: Vec<serde_json::Value> = o
        .stdout
        .lines()
        .map(|line| {
            let v: serde_json::Value =
                serde_json::from_str(line).unwrap_or_else(|e| panic!("{name}: not a JSON line ({e}): {}", tail(line)));
            assert!(v.is_object(), "{name}: not a JSON object: {}", tail(line));
            for k in JSON_KEYS {
                assert!(v.get(k).is_some(), "{name}: JSON diagnostic lacks `{k}`: {}", tail(line));
            }
            assert!(v["labels"].is_array(), "{name}: `labels` is not an array");
            for k in ["line", "column", "end_line", "end_column"] {
                assert!(v[k].as_u64().is_some_and(|n| n >= 1), "{name}: bad `{k}` in {}", tail(line));
            }
            v
        })
        .collect();
    let errors = diags.iter().any(|d| d["severity"] == "error");
    if o.code == Some(0) {
        assert!(!errors, "{name}: exit 0 but errors were printed");
    }
    if o.code == Some(1) {
        assert!(errors, "{name}: exit 1 but no error diagnostic was printed");
    }
    diags
}

/// Writes `bytes` to a file and checks it in both message formats; returns the JSON diagnostics.
fn check_bytes(name: &str, bytes: &[u8]) -> Vec<serde_json::Value> {
    let dir = scratch(name);
    let file = dir.join(format!("{name}.msl"));
    std::fs::write(&file, bytes).expect("write input");
    let human = run_check(&file, "human");
    assert_robust(&format!("{name} (human)"), &human, &[0, 1]);
    let json = run_check(&file, "json");
    assert_robust(&format!("{name} (json)"), &json, &[0, 1]);
    assert_eq!(human.code, json.code, "{name}: formats disagree on the exit status");
    let diags = json_diagnostics(name, &json);
    let _ = std::fs::remove_dir_all(&dir);
    diags
}

fn codes(diags: &[serde_json::Value]) -> Vec<String> {
    diags.iter().map(|d| d["code"].as_str().unwrap_or("?").to_string()).collect()
}

// ---------------------------------------------------------------- hostile files

#[test]
fn garbage_bytes() {
    let mut rng = Rng::new(0x5eed);
    let random: Vec<u8> = (0..65_536).map(|_| rng.next() as u8).collect();
    check_bytes("random_bytes", &random);
    // Printable garbage gets past the UTF-8 check and into the lexer and parser.
    let printable: Vec<u8> = (0..65_536).map(|_| b' ' + (rng.next() % 95) as u8).collect();
    check_bytes("random_ascii", &printable);
    // Random multi-byte characters (valid UTF-8) exercise column and span arithmetic.
    let chars = ['é', '∑', '𝔽', '\u{0}', '\t', '\n', '"', '(', 'a', '1', '\u{FEFF}', '\u{202E}'];
    let unicode: String = (0..20_000).map(|_| *rng.pick(&chars)).collect();
    check_bytes("random_unicode", unicode.as_bytes());
    let punct = "()[]{},.:;@=+-*/|!<>\"";
    let soup: String = (0..20_000).map(|_| punct.as_bytes()[rng.below(punct.len())] as char).collect();
    check_bytes("punctuation_soup", soup.as_bytes());
}

#[test]
fn invalid_utf8_is_e0108() {
    let diags = check_bytes("invalid_utf8", b"fn f() -> i32 { 1 }\n\xff\xfe bad\n");
    assert_eq!(codes(&diags), ["E0108"]);
    assert_eq!(diags[0]["line"], 2);
    assert_eq!(diags[0]["column"], 1);
    // A multi-byte character cut short, inside a string literal.
    let diags = check_bytes("truncated_char", b"fn f() { let s = \"\xc3\" }\n");
    assert_eq!(codes(&diags), ["E0108"]);
    // Nothing but invalid bytes.
    let diags = check_bytes("only_invalid", &[0xC0, 0x80, 0xFF, 0xFE, 0xFD]);
    assert_eq!(codes(&diags), ["E0108"]);
}

#[test]
fn a_leading_byte_order_mark_is_not_text() {
    // Editors on Windows save UTF-8 with a BOM; it is skipped at the start, and columns of the
    // first line count from after it.
    let diags = check_bytes("bom", "\u{FEFF}fn f() -> i32 { 1 }\nfn g() -> f32 { x }\n".as_bytes());
    assert_eq!(codes(&diags), ["E0201"]);
    assert_eq!((diags[0]["line"].clone(), diags[0]["column"].clone()), (2.into(), 17.into()));
    let diags = check_bytes("bom_first_line", "\u{FEFF}fn f() -> i32 { y }\n".as_bytes());
    assert_eq!(codes(&diags), ["E0201"]);
    assert_eq!(diags[0]["column"], 17, "the BOM takes no column");
    // Anywhere else it is an unexpected character.
    let diags = check_bytes("bom_inside", "fn f() -> i32 { 1 \u{FEFF}}\n".as_bytes());
    assert_eq!(codes(&diags), ["E0101"]);
}

#[test]
fn eighty_thousand_errors_in_one_function() {
    // Each name was looked up by scanning every binding in scope, so a function of n locals
    // took time in n² to check: 40,000 took 50 s in a debug build, 80,000 would take minutes.
    // The limit only tells such a hang from a result.
    let n = 80_000;
    let mut text = String::from("fn main() {\n");
    for i in 0..n {
        text.push_str(&format!("    let x{i}: f32[2] = ones(3)\n"));
    }
    text.push_str("}\n");
    let file = scratch("many_errors").join("many.msl");
    std::fs::write(&file, &text).expect("write test file");
    for format in ["human", "short"] {
        let o = run_check_within(&file, format, Duration::from_secs(90));
        assert_eq!(o.code, Some(1), "{format}: did not finish in {:?}: {}", o.elapsed, tail(&o.stderr));
        assert_eq!(o.stderr.matches("E0306").count(), n, "{format}");
        assert!(o.stderr.contains(&format!("{}", n + 1)), "{format}: the last line is not reported");
    }
}

#[test]
fn megabyte_lines() {
    let n = 1 << 20;
    // One long expression on one line (rejected: nested deeper than the checker allows).
    let mut sum = String::from("fn f() -> i32 {\n    let x = 1");
    while sum.len() < n {
        sum.push_str(" + 1");
    }
    sum.push_str("\n    x\n}\n");
    check_bytes("long_sum", sum.as_bytes());
    // A flat long line: a 1 MB call argument list.
    let mut args = String::from("fn f() -> f32 { sum(zeros(1");
    while args.len() < n {
        args.push_str(", 1");
    }
    args.push_str(")) }\n");
    check_bytes("long_args", args.as_bytes());
    // A 1 MB identifier, bound and then used unknown (the "did you mean" path).
    let ident = "a".repeat(n);
    let def = format!("fn f() -> i32 {{\n    let {ident} = 1\n    {ident}b\n}}\n");
    check_bytes("long_ident", def.as_bytes());
    // A 1 MB string literal and a 1 MB comment.
    let s = format!("fn f() {{ let s = \"{}\" }}\n", "x".repeat(n));
    check_bytes("long_string", s.as_bytes());
    let c = format!("// {}\nfn f() {{}}\n", "é".repeat(n / 2));
    check_bytes("long_comment", c.as_bytes());
    // Floods of errors on one long line: one E0101 for a run of bad characters, at most 100
    // lexical errors per file, and no ariadne rendering of megabyte lines (that printed the
    // whole line once per diagnostic: terabytes for these inputs).
    let diags = check_bytes("bad_char_run", "$".repeat(n).as_bytes());
    assert_eq!(codes(&diags), ["E0101"]);
    let diags = check_bytes("bad_chars_spaced", "$ ".repeat(n / 2).as_bytes());
    assert_eq!(diags.len(), 100);
    let names = format!("fn f() {{ let a = [{}] }}\n", "u, ".repeat(n / 12));
    let diags = check_bytes("unknown_names_one_line", names.as_bytes());
    assert!(diags.len() > 10_000, "{}", diags.len());
}

#[test]
fn deep_nesting() {
    let n = 10_000;
    let parens = format!("fn f() -> i32 {{ {}1{} }}\n", "(".repeat(n), ")".repeat(n));
    check_bytes("nested_parens", parens.as_bytes());
    let brackets = format!("fn f() {{ let x = {}1{} }}\n", "[".repeat(n), "]".repeat(n));
    check_bytes("nested_brackets", brackets.as_bytes());
    let unclosed = format!("fn f() {{ let x = {}1\n", "(".repeat(n));
    check_bytes("unclosed_parens", unclosed.as_bytes());
    let braces = format!("fn f() {}{}\n", "{".repeat(n), "}".repeat(n));
    check_bytes("nested_braces", braces.as_bytes());
    let minus = format!("fn f() -> i32 {{ {}1 }}\n", "-".repeat(n));
    check_bytes("unary_minus", minus.as_bytes());
    let not = format!("fn f() -> bool {{ {}true }}\n", "!".repeat(n));
    check_bytes("unary_not", not.as_bytes());
    let pow = format!("fn f() -> f32 {{ 2.0{} }}\n", " ** 2.0".repeat(n));
    check_bytes("pow_chain", pow.as_bytes());
    let closures = format!("fn f() {{ let g = {}1 }}\n", "|a| ".repeat(n));
    check_bytes("closure_chain", closures.as_bytes());
    let elses = format!("fn f() -> i32 {{ {}{{ 2 }} }}\n", "if true { 1 } else ".repeat(n));
    check_bytes("else_if_chain", elses.as_bytes());
    let calls = format!("fn f() -> i32 {{ f{} }}\n", "()".repeat(n));
    check_bytes("call_chain", calls.as_bytes());
    let fields = format!("fn f() -> i32 {{ x{} }}\n", ".a".repeat(n));
    check_bytes("field_chain", fields.as_bytes());
    // Types and dimensions nest without brackets too; these used to overflow the stack.
    let fn_types = format!("fn f(x: {}f32) -> i32 {{ 1 }}\n", "fn() -> ".repeat(n));
    check_bytes("fn_type_chain", fn_types.as_bytes());
    let dim_neg = format!("fn f(x: f32[{}1]) -> f32 {{ sum(x) }}\n", "-".repeat(10 * n));
    check_bytes("dim_negation", dim_neg.as_bytes());
    let dim_sum = format!("dim X = 1{}\n", " + 1".repeat(10 * n));
    check_bytes("dim_sum", dim_sum.as_bytes());
    // Each function calls the next one, defined after it: bodies are checked on demand, one
    // recursion level per call. Deeper than the checker's bound is E0106, not a stack overflow.
    let mut chain = String::new();
    for i in 0..5000 {
        chain.push_str(&format!("fn f_{i}(x: f32) -> f32 {{ f_{}(x) }}\n", i + 1));
    }
    chain.push_str("fn f_5000(x: f32) -> f32 { x }\n");
    let diags = check_bytes("forward_call_chain", chain.as_bytes());
    assert!(codes(&diags).contains(&"E0106".to_string()), "{diags:?}");
}

#[test]
fn huge_numbers() {
    let diags = check_bytes("huge_int", b"fn f() -> i32 { 99999999999999999999999 }\n");
    assert_eq!(codes(&diags), ["E0105"]);
    check_bytes("huge_float", b"fn f() -> f32 { 1e999999 + 0.0000000000000000000000000000001e-99999 }\n");
    check_bytes("int_edges", b"fn f() -> i32 { 9223372036854775807 + 1 - -9223372036854775807 * 2 }\n");
    // Dimension arithmetic beyond 64 bits: rejected with E0105, not a panic or silent wrap.
    let p = "*2".repeat(130);
    for (name, src) in [
        ("dim_overflow", format!("fn f(x: f32[2{p}]) -> f32 {{ sum(x) }}\n")),
        ("dim_overflow_neg", format!("fn f(x: f32[-2{p}]) -> f32 {{ sum(x) }}\n")),
        ("dim_overflow_sub", format!("fn f(x: f32[(0 - 2{p}) * 4]) -> f32 {{ sum(x) }}\n")),
        ("dim_overflow_div", format!("fn f[N](x: f32[N / (2{p})]) -> f32 {{ sum(x) }}\n")),
        ("dim_overflow_expr", format!("fn f() -> f32 {{ sum(zeros(2{p})) }}\n")),
    ] {
        let diags = check_bytes(name, src.as_bytes());
        assert!(codes(&diags).contains(&"E0105".to_string()), "{name}: {diags:?}");
    }
    // Substituting into high powers expands polynomials: bounded, not exponential.
    let i40 = vec!["I"; 40].join("*");
    let blowup =
        format!("model A[I] {{ w: f32[{i40}] }}\nfn g[P, Q, R, S](a: A[P + Q + R + S]) -> f32 {{ sum(a.w) }}\n");
    check_bytes("dim_polynomial_blowup", blowup.as_bytes());
    let i1000 = vec!["I"; 1000].join("*");
    let j1000 = vec!["J"; 1000].join("*");
    let towers = format!(
        "model A[I] {{ w: f32[{i1000}] }}\nmodel B[J] {{ a: A[{j1000}] }}\nmodel C[K] {{ b: B[K*K*K*K] }}\n\
         fn g(c: C[2]) -> f32 {{ sum(c.b.a.w) }}\nfn h[L](c: C[L + 1]) -> f32 {{ sum(c.b.a.w) }}\n"
    );
    check_bytes("dim_exponent_tower", towers.as_bytes());
}

#[test]
fn degenerate_files() {
    assert!(check_bytes("empty", b"").is_empty());
    assert!(check_bytes("comments", b"// a\n/* b\n c */\n/// doc\n/**/").is_empty());
    assert!(check_bytes("whitespace", b" \n\t\r\n\x0c  \n").is_empty());
    let diags = check_bytes("unterminated_string", b"fn f() { let s = \"abc\n}\n");
    assert!(codes(&diags).contains(&"E0102".to_string()), "{diags:?}");
    let diags = check_bytes("unterminated_comment", b"fn f() {}\n/* never ends\n");
    assert!(codes(&diags).contains(&"E0102".to_string()), "{diags:?}");
    check_bytes("lone_quote", b"\"");
    check_bytes("lone_slash_star", b"/*");
    check_bytes("bad_escape", b"fn f() { print(\"\\q\\\xc3\xa9\") }\n");
    check_bytes("nul_bytes", b"fn f\0() {\0}\0");
    check_bytes("bom", "\u{FEFF}fn f() {}\n".as_bytes());
    check_bytes("crlf", b"fn f() -> i32 {\r\n  1\r\n}\r\n");
    check_bytes("only_semicolons", ";;;;\n;\n".as_bytes());
    // Paths that are not regular files: refused, never read (reading `/dev/zero` never ends).
    let diags = check_bytes("use_dev_zero", b"use \"/dev/zero\"\nfn f() {}\n");
    assert_eq!(codes(&diags), ["E0204"]);
    check_bytes("use_dir", b"use \".\"\nuse \"..\"\nuse \"\"\n");
    // Thousands of unknown names in a large scope: "did you mean" hints stay bounded.
    let mut many = String::from("fn f() {\n");
    for i in 0..3000 {
        many.push_str(&format!("    let v{i} = 1\n"));
    }
    for i in 0..3000 {
        many.push_str(&format!("    let w{i} = u{i}\n"));
    }
    many.push_str("}\n");
    check_bytes("many_unknown_names", many.as_bytes());
}

#[test]
fn missing_file_is_exit_2() {
    let dir = scratch("missing");
    let o = run_check(&dir.join("does-not-exist.msl"), "human");
    assert_robust("missing file", &o, &[2]);
    assert!(o.stderr.contains("does-not-exist.msl"), "the message names the file: {}", o.stderr);
    let o = run_check(&dir.join("does-not-exist.msl"), "json");
    assert_robust("missing file (json)", &o, &[2]);
    // A folder stands for the `.msl` files under it: one without any has nothing to check.
    let o = run_check(&dir, "human");
    assert_robust("directory", &o, &[2]);
    assert!(o.stderr.contains("no `.msl` files under"), "{}", o.stderr);
    let _ = std::fs::remove_dir_all(&dir);
}

// ---------------------------------------------------------------- the contract's programs

/// The ```` ```msl ```` blocks of a markdown file, with the line of each opening fence.
fn msl_blocks(markdown: &str) -> Vec<(usize, String)> {
    let mut blocks = Vec::new();
    let mut current: Option<(usize, String)> = None;
    for (i, line) in markdown.lines().enumerate() {
        let fence = line.trim_start().strip_prefix("```").map(str::trim);
        match (&mut current, fence) {
            (None, Some("msl")) => current = Some((i + 1, String::new())),
            (Some(_), Some(_)) => blocks.extend(current.take()),
            (Some((_, code)), None) => {
                code.push_str(line);
                code.push('\n');
            }
            (None, _) => {}
        }
    }
    blocks
}

#[test]
fn language_contract_programs() {
    let spec = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/design/LANGUAGE.md");
    let Ok(text) = std::fs::read_to_string(&spec) else {
        println!("skipped: {} is not there (it lives outside the repository)", spec.display());
        return;
    };
    let blocks = msl_blocks(&text);
    assert!(!blocks.is_empty(), "no ```msl blocks in {}", spec.display());
    for (line, code) in blocks {
        // Blocks with `…` elide code and are expected to be syntax errors; all must be clean exits.
        let name = format!("language_md_line_{line}");
        check_bytes(&name, code.as_bytes());
    }
}

// ---------------------------------------------------------------- in-process mutation fuzzing

/// Mutated programs checked by default (a few seconds in a debug build). For a longer local
/// campaign: `MSL_MUTATIONS=300000 MSL_MUTATION_SEED=7 cargo test --release --test robustness mutated`.
const MUTATION_CASES: usize = 3000;

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Seed programs: every ```` ```msl ```` block of `spec/*.md`, and the stdlib sources.
fn seeds() -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files: Vec<PathBuf> = Vec::new();
    for dir in ["spec", "stdlib", "stdlib/optim"] {
        if let Ok(entries) = std::fs::read_dir(root.join(dir)) {
            files.extend(entries.flatten().map(|e| e.path()));
        }
    }
    files.sort();
    let mut seeds = Vec::new();
    for f in files {
        let Ok(text) = std::fs::read_to_string(&f) else {
            continue;
        };
        let name = f.strip_prefix(root).unwrap_or(&f).display().to_string();
        match f.extension().and_then(|e| e.to_str()) {
            Some("md") => {
                for (line, code) in msl_blocks(&text) {
                    seeds.push((format!("{name}:{line}"), code));
                }
            }
            Some("msl") => seeds.push((name, text)),
            _ => {}
        }
    }
    seeds
}

/// Byte offsets where tokens start, approximately as the lexer sees them: runs of identifier
/// characters, runs of whitespace, string literals, and single other characters.
fn token_starts(s: &str) -> Vec<(usize, usize)> {
    let b = s.as_bytes();
    let mut toks = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let start = i;
        let c = b[i];
        if c.is_ascii_alphanumeric() || c == b'_' {
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_' || b[i] == b'.' && c.is_ascii_digit()) {
                i += 1;
            }
        } else if c.is_ascii_whitespace() {
            while i < b.len() && b[i].is_ascii_whitespace() {
                i += 1;
            }
        } else if c == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' && b[i] != b'\n' {
                i += 1;
            }
            i = (i + 1).min(b.len());
        } else {
            i += s[i..].chars().next().map_or(1, char::len_utf8);
        }
        toks.push((start, i));
    }
    toks
}

const PUNCT: &[&str] = &[
    "(", ")", "[", "]", "{", "}", ",", ".", ":", ";", "@", "=", "+", "-", "*", "/", "|", "!", "<", ">", "\"", "..",
    "->", "**", "||", "&&", "==", "\n", " ",
];

const WORDS: &[&str] = &[
    "fn",
    "let",
    "var",
    "model",
    "dim",
    "const",
    "use",
    "mesh",
    "test",
    "if",
    "else",
    "for",
    "in",
    "while",
    "return",
    "break",
    "continue",
    "true",
    "false",
    "_",
    "x",
    "N",
    "D",
    "M",
    "Model",
    "f32",
    "f64",
    "i32",
    "bool",
    "sum",
    "mean",
    "reshape",
    "concat",
    "einsum",
    "grad",
    "value_and_grad",
    "vmap",
    "map",
    "init",
    "zeros",
    "ones",
    "axis",
    "keepdims",
    "seed",
    "nn",
    "optim",
    "adam",
    "linear",
    "relu",
    "main",
    "print",
    "load",
    "transpose",
    "permute",
    "stack",
    "gather",
    "one_hot",
    "where",
];

const NUMBERS: &[&str] = &[
    "0",
    "1",
    "-1",
    "2",
    "64",
    "0.0",
    "1e-3",
    "1e999",
    "9223372036854775807",
    "9223372036854775808",
    "99999999999999999999999",
    "4294967296",
    "-9223372036854775808",
    "170141183460469231731687303715884105727",
];

/// Fragments with structure of their own, to reach deeper into the checker than single tokens.
const SNIPPETS: &[&str] = &[
    "..S",
    "M: Model",
    "[N, ..S]",
    "f32[_, 2 * D]",
    "@dp",
    "axis: -1",
    "keepdims: true",
    "seed: 0",
    "|x| x",
    "|a, b: f32| a * b",
    "grad(",
    "vmap(",
    "in_axes: (0, _)",
    "wrt: x",
    "(a, b)",
    ".0",
    ".w",
    "x[1:, :2]",
    "mesh Q[dp = 2]",
    "dim K = 2 * 3",
    "@copies(2)",
    "@recompute",
    "@bogus(",
    "bf16(",
    "f16(",
    "bf16[2, N]",
    "use amp\n",
    "amp.scale(",
    "return",
    "init(",
    "map(|p| p * 0.0, ",
    "einsum(\"ij,jk->ik\", ",
    "reshape(x, [",
    "concat([x, x], axis: ",
    "= 1\n",
];

/// Applies one random mutation to `s`; `donor` is another program to splice from.
fn mutate(rng: &mut Rng, s: &str, donor: &str) -> String {
    let toks = token_starts(s);
    if toks.is_empty() {
        return PUNCT[rng.below(PUNCT.len())].to_string();
    }
    let (a, b) = toks[rng.below(toks.len())];
    let (c, d) = toks[rng.below(toks.len())];
    let tok = &s[a..b];
    match rng.below(12) {
        // Delete a token.
        0 => format!("{}{}", &s[..a], &s[b..]),
        // Duplicate a token.
        1 => format!("{}{tok}{}", &s[..b], &s[b..]),
        // Swap two tokens.
        2 => {
            let ((a, b), (c, d)) = if a <= c { ((a, b), (c, d)) } else { ((c, d), (a, b)) };
            if b > c {
                return s.to_string();
            }
            format!("{}{}{}{}{}", &s[..a], &s[c..d], &s[b..c], &s[a..b], &s[d..])
        }
        // Delete a range of tokens.
        3 => {
            let (lo, hi) = (a.min(c), b.max(d));
            format!("{}{}", &s[..lo], &s[hi..])
        }
        // Duplicate a range of tokens in place.
        4 => {
            let (lo, hi) = (a.min(c), b.max(d));
            format!("{}{}{}", &s[..hi], &s[lo..hi], &s[hi..])
        }
        // Insert punctuation.
        5 => format!("{}{}{}", &s[..a], rng.pick(PUNCT), &s[a..]),
        // Replace an identifier or a number.
        6 | 7 => {
            let first = tok.as_bytes()[0];
            let new = if first.is_ascii_digit() || rng.below(4) == 0 { rng.pick(NUMBERS) } else { rng.pick(WORDS) };
            format!("{}{new}{}", &s[..a], &s[b..])
        }
        // Truncate.
        8 => s[..a].to_string(),
        // Insert a structured snippet.
        9 => format!("{}{}{}", &s[..a], rng.pick(SNIPPETS), &s[a..]),
        // Splice in a range of tokens from another program.
        10 => {
            let dt = token_starts(donor);
            if dt.is_empty() {
                return s.to_string();
            }
            let (x, _) = dt[rng.below(dt.len())];
            let (_, y) = dt[rng.below(dt.len())];
            let (x, y) = (x.min(y), x.max(y));
            format!("{}{}{}", &s[..a], &donor[x..y], &s[a..])
        }
        // Overwrite a token with another token of the same program.
        _ => format!("{}{}{}", &s[..a], &s[c..d], &s[b..]),
    }
}

/// Everything `msl check` does with a source text, in-process: check, then render the
/// diagnostics in every format, or verify and dump the IR when there are none.
/// Checks `text` every way the tools do; true when it checks without errors and has a `main`.
fn check_everything(name: &str, text: &str, dir: &Path) -> bool {
    let c = lang::check::check_source(name, text, dir);
    let _ = lang::diag::render(&c.diagnostics, &c.sources, false);
    let _ = lang::diag::render_short(&c.diagnostics, &c.sources);
    for d in &c.diagnostics {
        let _ = lang::diag::to_json(d, &c.sources).to_string();
    }
    if !c.has_errors() {
        // A program that checks has a typed IR whose every node re-infers (the verifier runs
        // after each pass in this debug build and records what it finds).
        assert!(
            c.program.malformed.is_empty(),
            "{name}: the typed IR is malformed:\n{}",
            c.program.malformed.join("\n")
        );
        let _ = lang::ir::dump::dump(&c.program);
    }
    !c.has_errors() && c.program.main.is_some()
}

enum Progress {
    Done(usize),
    Panicked(String),
    /// All cases ran; the slowest one, for spotting performance cliffs.
    Finished(Duration, String),
}

#[test]
fn mutated_programs_never_panic() {
    let seeds = seeds();
    assert!(!seeds.is_empty(), "no seed programs found");
    // Relative `use "…"` paths resolve into an empty directory.
    let dir = scratch("mutations");
    let last = Path::new(env!("CARGO_TARGET_TMPDIR")).join("robustness-last-mutant.msl");
    let current = Arc::new(Mutex::new(String::new()));
    let cases = env_number("MSL_MUTATIONS", MUTATION_CASES as u64) as usize;
    // For a run-time campaign (`scripts/run_mutants.sh`): the mutants that check, to be run.
    let keep = std::env::var_os("MSL_MUTANTS_DIR").map(PathBuf::from);
    let (tx, rx) = mpsc::channel();
    let worker = {
        let current = Arc::clone(&current);
        let dir = dir.clone();
        std::thread::Builder::new()
            .name("mutations".into())
            .stack_size(256 << 20)
            .spawn(move || {
                let mut rng = Rng::new(env_number("MSL_MUTATION_SEED", 0x6d73_6c21));
                let mut slowest = (Duration::ZERO, String::new());
                for i in 0..cases {
                    let (seed_name, seed) = &seeds[i % seeds.len()];
                    let mut text = seed.clone();
                    for _ in 0..1 + rng.below(4) {
                        let donor = &seeds[rng.below(seeds.len())].1;
                        text = mutate(&mut rng, &text, donor);
                    }
                    *current.lock().unwrap_or_else(|e| e.into_inner()) =
                        format!("case {i} (from {seed_name}):\n{text}");
                    // A stack overflow aborts the process before anything can be reported:
                    // the input that did it is left in this file.
                    let _ = std::fs::write(&last, &text);
                    let t0 = Instant::now();
                    let r = panic::catch_unwind(AssertUnwindSafe(|| check_everything("mutant.msl", &text, &dir)));
                    if t0.elapsed() > slowest.0 {
                        slowest = (t0.elapsed(), text.clone());
                    }
                    if let (Ok(true), Some(keep)) = (&r, &keep) {
                        let _ = std::fs::write(keep.join(format!("mutant_{i}.msl")), &text);
                    }
                    let msg = match r {
                        Ok(_) => Progress::Done(i),
                        Err(e) => {
                            let what = e
                                .downcast_ref::<String>()
                                .cloned()
                                .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                                .unwrap_or_default();
                            Progress::Panicked(format!(
                                "{what}\n--- input, case {i} (mutated from {seed_name}) ---\n{text}"
                            ))
                        }
                    };
                    let stop = matches!(msg, Progress::Panicked(_));
                    if tx.send(msg).is_err() || stop {
                        return;
                    }
                }
                let _ = tx.send(Progress::Finished(slowest.0, slowest.1));
            })
            .expect("spawn the mutation worker")
    };
    let start = Instant::now();
    let mut done = 0;
    loop {
        match rx.recv_timeout(LIMIT) {
            Ok(Progress::Done(i)) => done = i + 1,
            Ok(Progress::Finished(time, text)) => {
                println!("slowest case: {time:?}");
                if std::env::var_os("MSL_MUTATIONS").is_some() {
                    println!("{text}");
                }
                break;
            }
            Ok(Progress::Panicked(report)) => panic!("the checker panicked: {report}"),
            Err(_) => {
                let input = current.lock().unwrap_or_else(|e| e.into_inner()).clone();
                panic!("the checker hung (> {LIMIT:?}) on {input}");
            }
        }
    }
    let _ = worker.join();
    let _ = std::fs::remove_dir_all(&dir);
    println!("{done} mutated programs checked in {:?}", start.elapsed());
}
