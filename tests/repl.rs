//! Drives `msl repl` with piped stdin: items and statements accumulate, expressions print their
//! values, `:type` does not run anything, errors do not end the session, input continues while
//! brackets are open, and piped output carries no prompts or terminal escapes.

use std::io::Write;
use std::process::{Command, Stdio};

/// Runs a session on `input`; returns (stdout, stderr, exit status).
fn repl(input: &str) -> (String, String, Option<i32>) {
    repl_with(&[], input)
}

/// `repl` with extra arguments to `msl repl`.
fn repl_with(args: &[&str], input: &str) -> (String, String, Option<i32>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_msl"))
        .arg("repl")
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("XDG_DATA_HOME", std::env::temp_dir().join("msl-repl-test-data"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start msl repl");
    child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let (o, e) = (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned());
    assert!(!o.contains('\x1b') && !e.contains('\x1b'), "terminal escapes in piped output:\n{o}\n{e}");
    assert!(!o.contains("msl> "), "a prompt in piped output:\n{o}");
    (o, e, out.status.code())
}

fn lines(s: &str) -> Vec<&str> {
    s.lines().collect()
}

#[test]
fn items_and_statements_accumulate() {
    let (out, err, code) = repl(
        "use nn.{relu}
let x = ones(2, 3)
fn double[N](t: f32[N, 3]) -> f32[N, 3] { t * 2.0 }
let y = double(x)
relu(y - 3.0)
sum(y)
var acc = 0
for i in 0..5 { acc = acc + i }
acc
",
    );
    assert_eq!(code, Some(0));
    assert_eq!(err, "");
    assert_eq!(
        lines(&out),
        [
            "x: f32[2, 3]",
            "fn double[N](t: f32[N, 3]) -> f32[N, 3]",
            "y: f32[2, 3]",
            "[[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]",
            "12.0",
            "acc: i32",
            "10",
        ]
    );
}

#[test]
fn type_shows_the_shape_without_running() {
    let (out, err, _) = repl(
        "fn noisy() -> f32[2] { print(\"ran\"); ones(2) }
let x: f32[4, 3] = ones(4, 3)
:type x @ transpose(x)
:type noisy()
:type noisy
:t sum(x, axis: 0)
",
    );
    assert_eq!(err, "");
    assert_eq!(
        lines(&out),
        ["fn noisy() -> f32[2]", "x: f32[4, 3]", "f32[4, 4]", "f32[2]", "fn noisy() -> f32[2]", "f32[3]"]
    );
}

#[test]
fn errors_do_not_end_the_session() {
    let (out, err, code) = repl(
        "let x = ones(2, 3)
let bad = x @ x
let x2 = x +
    1.0
undefined_name
assert(false, \"boom\")
fn broken() -> { 1 }
:nope
x2
",
    );
    assert_eq!(code, Some(0));
    assert!(err.contains("[E0301]") && err.contains("matmul inner dimensions differ: 3 vs 2"), "{err}");
    assert!(err.contains("[E0201]") && err.contains("undefined_name"), "{err}");
    assert!(err.contains("boom"), "a run-time failure is reported: {err}");
    assert!(err.contains("unknown command `:nope`"), "{err}");
    // The failed `let` bound nothing; the session goes on with everything else.
    assert_eq!(lines(&out), ["x: f32[2, 3]", "x2: f32[2, 3]", "[[2.0, 2.0, 2.0], [2.0, 2.0, 2.0]]"]);
}

#[test]
fn multi_line_input_continues_while_brackets_are_open() {
    let (out, err, _) = repl(
        "model Lin[I, O] {
    w: f32[I, O] = ones(I, O)
    b: f32[O] = zeros(O)
}
fn apply[N, I, O](
    m: Lin[I, O],
    x: f32[N, I],
) -> f32[N, O] {
    x @ m.w + m.b
}
let m = init(Lin[3, 2], seed: 0)
apply(m,
      ones(1, 3))
",
    );
    assert_eq!(err, "");
    assert_eq!(
        lines(&out),
        [
            "model Lin[I, O] { w: f32[I, O], b: f32[O] }",
            "fn apply[N, I, O](m: Lin[I, O], x: f32[N, I]) -> f32[N, O]",
            "m: Lin[3, 2]",
            "[[3.0, 3.0]]",
        ]
    );
}

#[test]
fn load_grad_reset_and_redefinition() {
    let dir = std::env::temp_dir().join(format!("msl-repl-load-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("lib.msl");
    std::fs::write(&file, "/// Squared norm.\nfn sq(v: f32[3]) -> f32 {\n    sum(v * v)\n}\n").unwrap();
    let (out, err, _) = repl(&format!(
        ":load {}
let v = ones(3)
sq(v)
:grad sq
fn sq(v: f32[3]) -> f32 {{ 2.0 * sum(v * v) }}
sq(v)
:reset
v
",
        file.display()
    ));
    assert!(out.contains("loaded"), "{out}");
    assert!(out.contains("3.0\n"), "{out}");
    assert!(out.contains("fn grad_sq_v(v_0: f32[3]) -> f32[3] {"), "the derivative as msl source:\n{out}");
    assert!(out.contains("6.0\n"), "the redefinition is used:\n{out}");
    assert!(out.contains("session cleared"), "{out}");
    assert!(err.contains("unknown name `v`"), "after :reset nothing is left: {err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn values_survive_new_items() {
    // Adding a `use` and a model renumbers the program's models; earlier values carry over.
    let (out, err, _) = repl(
        "model A[D] { w: f32[D] = ones(D) }
let a = init(A[2], seed: 0)
use optim.adam
model B[D] { v: f32[D] = zeros(D) }
let s = adam.init(a, lr: 0.1)
a.w
s.lr
",
    );
    assert_eq!(err, "");
    assert!(out.ends_with("[1.0, 1.0]\n0.1\n"), "{out}");
}

#[test]
fn help_and_quit() {
    let (out, _, code) = repl(":help\n:quit\nprint(\"not reached\")\n");
    assert_eq!(code, Some(0));
    assert!(out.contains(":type EXPR"), "{out}");
    assert!(!out.contains("not reached"));
}

#[test]
fn a_jit_session_prints_what_an_eager_one_prints() {
    // Scalar loops compile (and the second loop reuses the first one's code), a fused tree
    // runs, variables live across inputs; the printed values are the interpreter's.
    let input = "var acc = 0
for i in 0..100000 { acc = acc + i % 7 }
acc
for i in 0..100000 { acc = acc + i % 7 }
acc
let x = normal(1000, seed: 1)
sum(gelu(x * 2.0 + 1.0))
";
    let (eager, err, code) = repl(input);
    assert_eq!(code, Some(0), "{err}");
    let (jit, err, code) = repl_with(&["--mode", "jit"], input);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(jit, eager);
    assert!(eager.contains("299995") && eager.contains("599990"), "{eager}");
}
