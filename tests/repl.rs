//! Drives `msl repl` with piped stdin: items and statements accumulate, expressions print their
//! values, `:type` does not run anything, errors (a panic included) do not end the session, input
//! continues while brackets are open (up to 1 MiB), piped output carries no prompts or terminal
//! escapes, long sessions take time in proportion to their length, and checking inputs in
//! slices prints what checking them in the whole session program prints.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Runs a session on `input`; returns (stdout, stderr, exit status).
fn repl(input: &str) -> (String, String, Option<i32>) {
    repl_with(&[], input)
}

/// `repl` with extra arguments to `msl repl`.
fn repl_with(args: &[&str], input: &str) -> (String, String, Option<i32>) {
    repl_in(Path::new(env!("CARGO_MANIFEST_DIR")), args, &[], input)
}

/// `repl_with` in the folder `dir`, with extra environment variables.
fn repl_in(dir: &Path, args: &[&str], env: &[(&str, &str)], input: &str) -> (String, String, Option<i32>) {
    repl_within(dir, args, env, input, HANG).unwrap_or_else(|| panic!("msl repl did not end within {HANG:?}"))
}

/// How long a session may take before it counts as hung.
const HANG: Duration = Duration::from_secs(300);

/// Runs a session, killing it after `limit` (then `None`): a generous limit only detects a hang.
fn repl_within(
    dir: &Path,
    args: &[&str],
    env: &[(&str, &str)],
    input: &str,
    limit: Duration,
) -> Option<(String, String, Option<i32>)> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_msl"))
        .arg("repl")
        .args(args)
        .current_dir(dir)
        .envs(env.iter().copied())
        .env_remove("RUST_BACKTRACE")
        .env("XDG_DATA_HOME", std::env::temp_dir().join("msl-repl-test-data"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start msl repl");
    // Input is written and output read on threads of their own: a session that answers while
    // input still comes must not block on a full pipe.
    let mut stdin = child.stdin.take().unwrap();
    let input = input.to_string();
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(input.as_bytes());
    });
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            let _ = r.read_to_end(&mut v);
            String::from_utf8_lossy(&v).into_owned()
        })
    };
    let out = drain(Box::new(child.stdout.take().unwrap()));
    let err = drain(Box::new(child.stderr.take().unwrap()));
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let _ = writer.join();
    let (o, e) = (out.join().unwrap_or_default(), err.join().unwrap_or_default());
    assert!(!o.contains('\x1b') && !e.contains('\x1b'), "terminal escapes in piped output:\n{o}\n{e}");
    assert!(!o.contains("msl> "), "a prompt in piped output:\n{o}");
    Some((o, e, status.code()))
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

/// A fresh folder for one test's files.
fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("repl-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create scratch dir");
    dir
}

#[test]
fn a_panic_is_one_error_and_the_session_goes_on() {
    let (out, err, code) = repl("let a = 1\nzeros(9223372036854775807)\na + 1\n");
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(lines(&out), ["a: i32", "2"]);
    assert!(err.to_lowercase().contains("error"), "the failure is reported: {err}");
    assert!(!err.contains("panicked") && !err.contains("RUST_BACKTRACE"), "a raw panic report:\n{err}");
}

#[test]
fn a_loaded_file_may_repeat_a_use_and_loads_relative_to_its_folder() {
    let dir = scratch("load");
    std::fs::create_dir_all(dir.join("sub")).unwrap();
    std::fs::write(
        dir.join("sub/lib.msl"),
        "// Helpers.\nuse nn.{relu, gelu}\n\nfn act(x: f32[3]) -> f32[3] { relu(x) }\n\n\
         fn data() -> f32[4] {\n    let d: f32[4] = load(\"d.npy\")\n    d\n}\n",
    )
    .unwrap();
    let (out, err, _) = repl_in(
        &dir,
        &[],
        &[],
        "save(\"sub/d.npy\", ones(4) * 2.0)\nuse nn.{relu}\n:load sub/lib.msl\nact(ones(3) - 2.0)\ndata()\ngelu(zeros(1))\n",
    );
    assert_eq!(err, "");
    assert_eq!(lines(&out), ["loaded sub/lib.msl (2 items)", "[0.0, 0.0, 0.0]", "[2.0, 2.0, 2.0, 2.0]", "[0.0]"]);
}

#[test]
fn long_piped_sessions_take_time_in_proportion_to_their_length() {
    // Checking each input in the whole session made n `let` lines cost time in n² (20,000 of
    // them took about an hour in a debug build), and a bracket left open for many lines lexed
    // the whole input again for every line. The limits only tell such a hang from a result.
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let lets: String = (0..20_000).map(|i| format!("let x{i} = {i}\n")).collect();
    let (out, err, _) = repl_within(here, &[], &[], &format!("{lets}x19999 + x1\n"), Duration::from_secs(240))
        .expect("20,000 `let` lines did not finish");
    assert_eq!(err, "");
    assert_eq!(out.lines().count(), 20_001);
    assert!(
        out.starts_with("x0: i32\nx1: i32\n") && out.ends_with("x19999: i32\n20000\n"),
        "{}",
        &out[out.len() - 100..]
    );
    let open = format!("let t = (\n{}1)\nt + 1\n", "\n".repeat(300_000));
    let (out, err, _) =
        repl_within(here, &[], &[], &open, Duration::from_secs(120)).expect("a bracket open for 300,000 lines");
    assert_eq!((lines(&out), err.as_str()), (vec!["t: i32", "2"], ""));
}

#[test]
fn an_input_that_never_ends_is_dropped_past_a_mebibyte() {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let input = format!("let t = (\n{}1 + 1\n", "\n".repeat(1_100_000));
    let (out, err, code) =
        repl_within(here, &[], &[], &input, Duration::from_secs(120)).expect("an input open for 1.1M lines");
    assert_eq!(code, Some(0));
    assert!(err.contains("over 1 MiB") && err.contains("still not complete"), "{err}");
    // The lines after the dropped input are inputs of their own.
    assert_eq!(out, "2\n");
}

/// A deterministic generator of REPL sessions (xorshift64*).
struct Gen(u64);

impl Gen {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 33) as usize % n
    }
    fn pick(&mut self, names: &[String]) -> Option<String> {
        (!names.is_empty()).then(|| names[self.below(names.len())].clone())
    }
}

/// A session of `n` inputs that binds, shadows and assigns tensors, variables, run-time dims,
/// models, tuples and closures, redefines a function and makes errors of every kind.
fn random_session(seed: u64, n: usize) -> String {
    let mut g = Gen(seed | 1);
    let mut s = String::from(
        "save(\"s.npy\", ones(5, 3))\nmodel M[D] { w: f32[D] = ones(D) }\nlet a = ones(2, 3)\nvar v = 0\n\
         let d: f32[N, 3] = load(\"s.npy\")\n",
    );
    let (mut ts, mut vs, mut ds) = (vec!["a".to_string()], vec!["v".to_string()], vec!["d".to_string()]);
    let (mut ms, mut fs, mut ps, mut h) = (Vec::new(), Vec::new(), Vec::new(), false);
    for k in 0..n {
        let c = g.below(5) + 1;
        let (t, t2) = (g.pick(&ts).unwrap(), g.pick(&ts).unwrap());
        let (v, d) = (g.pick(&vs).unwrap(), g.pick(&ds).unwrap());
        let line = match g.below(22) {
            0 => {
                ts.push(format!("a{k}"));
                format!("let a{k} = ones(2, 3) * {c}.0")
            }
            1 => {
                ts.push(format!("a{k}"));
                format!("let a{k} = {t} + {t2} * {c}.0")
            }
            2 => format!("let {t} = {t} - 1.0"),
            3 => {
                vs.push(format!("v{k}"));
                format!("var v{k} = {c}")
            }
            4 => format!("{v} = {v} + {c}"),
            5 => format!("for i in 0..{c} {{ {v} = {v} + i }}"),
            6 => format!("sum({t})"),
            7 => format!(":type {t} @ transpose({t2})"),
            8 => {
                ds.push(format!("d{k}"));
                format!("let d{k}: f32[N, 3] = load(\"s.npy\")")
            }
            9 => format!("sum({d}, axis: 0) + {t}[0]"),
            10 => {
                ms.push(format!("m{k}"));
                format!("let m{k} = init(M[3], seed: {c})")
            }
            11 => g.pick(&ms).map_or(v.clone(), |m| format!("{m}.w * {c}.0")),
            12 => {
                fs.push(format!("f{k}"));
                format!("let f{k} = |z: f32[2, 3]| z * {t}")
            }
            13 => g.pick(&fs).map_or(t.clone(), |f| format!("{f}({t2})")),
            14 => format!("{t} @ {t2}"),
            15 => format!("nope{k} + {v}"),
            16 => {
                h = true;
                format!("fn h(x: f32[2, 3]) -> f32[2, 3] {{ x * {c}.0 }}")
            }
            17 if h => format!("h({t})"),
            18 => {
                ps.push(format!("p{k}"));
                format!("let p{k} = ({t}, {v})")
            }
            19 => g.pick(&ps).unwrap_or(t),
            20 => format!("let r{k} = ones(2)[{}]", c + 4),
            _ => format!("let g{k} = {t}[1] + sum({d}, axis: 0)\ng{k}"),
        };
        s.push_str(&line);
        s.push('\n');
    }
    s
}

#[test]
fn checking_in_slices_prints_what_the_whole_program_prints() {
    // The same sessions checked input by input in the whole session program (MSL_REPL_WHOLE)
    // and, where it will do, in a slice that declares only what the input names.
    let dir = scratch("slices");
    for seed in [1, 2, 3] {
        let session = random_session(seed, 150);
        let sliced = repl_in(&dir, &[], &[], &session);
        let whole = repl_in(&dir, &[], &[("MSL_REPL_WHOLE", "1")], &session);
        assert_eq!(sliced.2, Some(0), "{}", sliced.1);
        assert!(sliced.0.lines().count() > 100 && sliced.1.contains("[E0301]"), "seed {seed}:\n{}", sliced.0);
        assert!(
            sliced == whole,
            "seed {seed}: the outputs differ\n--- session\n{session}\n--- sliced\n{}\n{}\n--- whole\n{}\n{}",
            sliced.0,
            sliced.1,
            whole.0,
            whole.1
        );
    }
}
