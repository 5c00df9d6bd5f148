//! The process contract of the `msl` binary (LANGUAGE.md §12): what `--help` offers works, an
//! absent device and running out of memory are exit 2 with a clear message, msl starts under a
//! limit on virtual memory, `print` reaches a pipe while the program runs, and `msl test` names
//! the files that do not check.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::Duration;

mod common;

fn scratch(name: &str, files: &[(&str, &str)]) -> PathBuf {
    common::scratch("cli", name, files)
}

fn msl(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_msl"))
        .args(args)
        .current_dir(dir)
        .env_remove("RUST_BACKTRACE")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .output()
        .expect("run msl")
}

/// Runs msl through `sh` after `ulimit -v KIB` (a limit on the address space, which makes large
/// requests fail whatever the machine's overcommit policy).
fn msl_limited(dir: &Path, kib: u64, args: &str) -> Output {
    Command::new("sh")
        .arg("-c")
        .arg(format!("ulimit -v {kib} && exec \"$MSL\" {args}"))
        .env("MSL", env!("CARGO_BIN_EXE_msl"))
        .current_dir(dir)
        .env_remove("RUST_BACKTRACE")
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .output()
        .expect("run sh")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn help_offers_only_what_works() {
    let dir = scratch("help", &[]);
    let run = text(&msl(&dir, &["run", "--help"]).stdout);
    assert!(run.contains("--device"), "{run}");
    assert!(!run.contains("cuda"), "`msl run --help` offers a device this build does not have:\n{run}");
    let top = text(&msl(&dir, &["--help"]).stdout);
    // `dryrun` works (tests/dryrun.rs), so it is offered.
    assert!(top.contains("repl") && top.contains("dryrun"), "{top}");
}

#[test]
fn an_absent_device_is_exit_2_with_a_clear_message() {
    let dir = scratch("cuda", &[("p.msl", "fn main() {\n    print(1)\n}\n")]);
    for (mode, dev) in [("eager", "cuda"), ("jit", "cuda"), ("eager", "cuda:1")] {
        let o = msl(&dir, &["run", "--mode", mode, "--device", dev, "p.msl"]);
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{mode}: {err}");
        let n = if dev == "cuda" { "0" } else { "1" };
        assert!(err.contains(&format!("no CUDA device `cuda:{n}`")), "{mode}: {err}");
        assert!(o.stdout.is_empty(), "{mode}: the program ran");
    }
    // A test run on an absent device is skipped, with the reason.
    let o = msl(&dir, &["test", "--device", "cuda", "p.msl"]);
    let out = text(&o.stdout);
    assert_eq!(o.status.code(), Some(0), "{out}");
    assert!(out.contains("skipped") && out.contains("no CUDA device `cuda:0`"), "{out}");
    // Under a launcher, `cuda` is the GPU of the rank's local rank.
    let o = Command::new(env!("CARGO_BIN_EXE_msl"))
        .args(["run", "--device", "cuda", "p.msl"])
        .current_dir(&dir)
        .env("MPI_LOCALRANKID", "3")
        .stdin(Stdio::null())
        .output()
        .expect("run msl");
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("no CUDA device `cuda:3`"), "{err}");
}

#[test]
fn out_of_memory_is_exit_2_naming_the_operation() {
    let program = "fn main() {\n    let a = 1\n    let z = zeros(100000, 100000, 100)\n    print(sum(z))\n}\n";
    let dir = scratch("oom", &[("train.msl", program)]);
    for mode in ["eager", "jit"] {
        let o = msl_limited(&dir, 4_000_000, &format!("run --mode {mode} train.msl"));
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{mode}: {err}");
        assert_eq!(
            err.trim_end(),
            "error: out of memory: zeros at train.msl:3 asked for 4000000000000 bytes",
            "{mode}"
        );
    }
}

#[test]
fn starts_under_a_limit_on_virtual_memory() {
    let dir = scratch("ulimit", &[("p.msl", "fn main() {\n    print(sum(ones(3, 4)))\n}\n")]);
    let o = msl_limited(&dir, 2_000_000, "run p.msl");
    assert_eq!((o.status.code(), text(&o.stdout).as_str()), (Some(0), "12.0\n"), "{}", text(&o.stderr));
    // Many workers ask for more stacks than the limit holds: msl starts with fewer.
    let o = msl_limited(&dir, 1_000_000, "run p.msl");
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    let many = Command::new("sh")
        .arg("-c")
        .arg("ulimit -v 1000000 && RAYON_NUM_THREADS=400 exec \"$MSL\" run p.msl")
        .env("MSL", env!("CARGO_BIN_EXE_msl"))
        .current_dir(&dir)
        .output()
        .expect("run sh");
    assert_eq!((many.status.code(), text(&many.stdout).as_str()), (Some(0), "12.0\n"), "{}", text(&many.stderr));
}

#[test]
fn print_reaches_a_pipe_while_the_program_runs() {
    // The loop takes far longer than the test waits: the first line must arrive before it ends.
    let program = "fn main() {\n    print(\"started\")\n    var acc = 0\n    for i in 0..2000000000 {\n        acc = acc + 1\n    }\n    print(acc)\n}\n";
    let dir = scratch("flush", &[("p.msl", program)]);
    let mut child = Command::new(env!("CARGO_BIN_EXE_msl"))
        .args(["run", "p.msl"])
        .current_dir(&dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start msl");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    // A generous limit, only so that a missing flush fails instead of hanging the suite.
    let first = rx.recv_timeout(Duration::from_secs(120));
    let still_running = child.try_wait().expect("poll msl").is_none();
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(first.as_deref(), Ok("started\n"), "the first line did not reach the pipe while msl ran");
    assert!(still_running, "msl ended before the loop could have finished");
}

#[test]
fn msl_test_names_files_that_do_not_check() {
    let dir = scratch(
        "test",
        &[
            ("good.msl", "test \"fine\" {\n    assert(1 == 1)\n}\n"),
            ("bad.msl", "test \"never runs\" {\n    let x: f32[2] = ones(3)\n}\n"),
        ],
    );
    let o = msl(&dir, &["test", "."]);
    let (out, err) = (text(&o.stdout), text(&o.stderr));
    assert_eq!(o.status.code(), Some(1), "{out}{err}");
    assert!(out.contains("bad.msl ... FAILED (it does not check"), "{out}");
    assert!(out.contains("failures:\n    ./bad.msl (it does not check)\n"), "{out}");
    assert!(out.ends_with("1 passed, 1 failed\n"), "{out}");
    assert!(err.contains("E0306") && err.contains("bad.msl:2"), "the diagnostics are not shown:\n{err}");
}

#[test]
fn a_float_literal_times_an_integer_suggests_converting_the_integer() {
    // `0.1 * epoch` means float arithmetic; the help names the fix, `f32(epoch)`, instead of
    // suggesting an integer literal.
    let src = "fn main() {\n    for epoch in 0..3 {\n        print(0.1 * epoch, 2 * epoch)\n    }\n}\n";
    let dir = scratch("float_times_int", &[("p.msl", src)]);
    let o = msl(&dir, &["check", "--message-format", "json", "p.msl"]);
    assert_eq!(o.status.code(), Some(1));
    let out = text(&o.stdout);
    assert!(out.contains("\"code\":\"E0322\""), "{out}");
    assert!(out.contains("convert the i32 operand: `f32(epoch)`"), "{out}");
}

#[test]
fn a_run_time_error_shows_the_calls_it_happened_in() {
    // The error is in `bad`, called from `mid`, called from `main`: each call site is a label,
    // innermost first, in the interpreter and the JIT.
    let src = "fn bad(i: i32) -> f32 {\n    let a = ones(3)\n    a[i]\n}\n\nfn mid(i: i32) -> f32 { bad(i) + 1.0 }\n\nfn main() { print(mid(7)) }\n";
    let dir = scratch("call_stack", &[("p.msl", src)]);
    for mode in [&["--mode", "eager"][..], &["--mode", "jit", "-O2"]] {
        let mut args = vec!["run", "--message-format", "json"];
        args.extend_from_slice(mode);
        args.push("p.msl");
        let o = msl(&dir, &args);
        assert_eq!(o.status.code(), Some(2), "{mode:?}");
        let out = text(&o.stdout);
        assert!(out.contains("\"message\":\"in `bad`\",\"primary\":true"), "{mode:?}: {out}");
        let (b, m) = (out.find("`bad` called here").expect(&out), out.find("`mid` called here").expect(&out));
        assert!(b < m, "innermost call first: {out}");
        assert!(out.contains("\"column\":25,\"end_column\":31,\"end_line\":6"), "the call of `bad`: {out}");
    }
}

#[test]
fn nan_check_stops_at_the_first_primitive_that_makes_a_nan_or_inf() {
    let src = "fn f(x: f32[3]) -> f32[3] {\n    log(x - 1.0)\n}\n\nfn main() {\n    let x = stack([3.0, 2.0, 1.0])\n    print(sum(f(x) + exp(x)))\n}\n";
    let dir = scratch("nan_check", &[("nan.msl", src)]);
    for mode in
        [&["--mode", "eager"][..], &["--mode", "jit", "-O0"], &["--mode", "jit", "-O1"], &["--mode", "jit", "-O2"]]
    {
        let plain = msl(&dir, &[&["run"][..], mode, &["nan.msl"]].concat());
        assert_eq!(plain.status.code(), Some(0), "{mode:?}: {}", text(&plain.stderr));
        assert_eq!(text(&plain.stdout).trim(), "-inf", "{mode:?}");
        let o = msl(&dir, &[&["run", "--nan-check"][..], mode, &["nan.msl"]].concat());
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{mode:?}: {err}");
        assert!(err.contains("E0606") && err.contains("`log` produced -inf at element 2 of [3]"), "{mode:?}: {err}");
        assert!(err.contains("nan.msl:2:5"), "{mode:?}: the line of `log` is named: {err}");
        assert!(o.stdout.is_empty(), "{mode:?}: nothing is printed after the check stops the run");
    }
}

#[test]
fn a_list_of_axes_reduces_each_and_other_builtins_take_one() {
    // NumPy's several-axes form: `sum(x, axis: [0, 1])` sums every element.
    let src = "fn main() {\n    let x = ones(2, 3)\n    print(sum(x, axis: [0, 1]), sum(x, axis: (1, 0)))\n}\n";
    let dir = scratch("axis_list", &[("p.msl", src)]);
    let o = msl(&dir, &["run", "p.msl"]);
    assert_eq!(text(&o.stdout), "6.0 6.0\n", "{}", text(&o.stderr));
    // Builtins that take one axis say so.
    let src = "fn main() {\n    let x = ones(2, 3)\n    print(argmax(x, axis: [0, 1]), softmax(x, axis: (0, 1)))\n}\n";
    let dir = scratch("axis_list_one", &[("p.msl", src)]);
    let o = msl(&dir, &["check", "--message-format", "json", "p.msl"]);
    assert_eq!(o.status.code(), Some(1));
    let out = text(&o.stdout);
    assert!(out.contains("\"code\":\"E0323\"") && out.contains("`argmax` takes one axis"), "{out}");
}

#[test]
fn const_values_are_set_from_the_command_line() {
    let src = "const LR = 0.1\nconst EPOCHS = 2\nconst VERBOSE = false\n\nfn main() {\n    print(LR, EPOCHS, VERBOSE)\n    for e in 0..EPOCHS {\n        print(e)\n    }\n}\n";
    let dir = scratch("consts", &[("p.msl", src)]);
    let o = msl(&dir, &["run", "p.msl"]);
    assert_eq!(text(&o.stdout), "0.1 2 false\n0\n1\n");
    // An integer value of a float constant is that float; every constant keeps its type.
    let o = msl(&dir, &["run", "--const", "LR=1,EPOCHS=3,VERBOSE=true", "p.msl"]);
    assert_eq!(text(&o.stdout), "1.0 3 true\n0\n1\n2\n", "{}", text(&o.stderr));
    let o = msl(&dir, &["run", "--mode", "jit", "-O2", "--const", "LR=0.5", "p.msl"]);
    assert_eq!(text(&o.stdout), "0.5 2 false\n0\n1\n", "{}", text(&o.stderr));
    for (arg, code, why) in [
        ("EPOCHS=1.5", 1, "`EPOCHS` is not a float constant"),
        ("NOPE=1", 1, "`--const` names `NOPE`, which this file does not declare"),
        ("LR=abc", 2, "the value must be a number, `true` or `false`"),
        ("LR", 2, "expected `NAME=VALUE` pairs"),
        ("LR=1,LR=2", 2, "each constant is named once"),
    ] {
        let o = msl(&dir, &["run", "--const", arg, "p.msl"]);
        let err = text(&o.stderr);
        assert_eq!(o.status.code(), Some(code), "{arg}: {err}");
        assert!(err.contains(why), "{arg}: {err}");
        assert!(o.stdout.is_empty(), "{arg}: nothing runs");
    }
    let o = msl(&dir, &["check", "--const", "EPOCHS=4", "p.msl"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
}

#[test]
fn spec_files_pass_from_any_folder() {
    // The spec's files name the files they `use` from the spec folder (`spec/fixtures/…`),
    // whatever the working directory; `fixtures/` itself is not collected by a folder walk.
    let spec = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("spec");
    let files = [spec.join("modules.md"), spec.join("errors.md")];
    let files: Vec<&str> = files.iter().map(|p| p.to_str().expect("utf-8 path")).collect();
    let elsewhere = scratch("anyfolder", &[]);
    for dir in [elsewhere.as_path(), spec.as_path(), &spec.join("fixtures")] {
        let mut args = vec!["test"];
        args.extend(&files);
        let o = msl(dir, &args);
        assert!(o.status.success(), "from {}: {}{}", dir.display(), text(&o.stdout), text(&o.stderr));
    }
    let dir = scratch("fixtures", &[("ok.msl", "test \"one\" { assert(1 == 1) }\n")]);
    std::fs::create_dir_all(dir.join("fixtures")).expect("fixtures");
    std::fs::write(dir.join("fixtures/bad.msl"), "fn f() -> f32 { zeros(2) }\n").expect("bad.msl");
    let o = msl(&dir, &["test", "."]);
    assert!(o.status.success(), "{}{}", text(&o.stdout), text(&o.stderr));
}

/// The events of a `--trace` file, each as (cat, name, ts, dur, args); panics on a file that is
/// not a Chrome trace-event document.
fn trace_events(path: &Path) -> Vec<(String, String, f64, f64, serde_json::Value)> {
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("the trace")).expect("JSON");
    let events = doc["traceEvents"].as_array().expect("traceEvents");
    events
        .iter()
        .filter(|e| e["ph"] == "X")
        .map(|e| {
            let s = |k: &str| e[k].as_str().unwrap_or_default().to_string();
            (s("cat"), s("name"), e["ts"].as_f64().expect("ts"), e["dur"].as_f64().expect("dur"), e["args"].clone())
        })
        .collect()
}

/// The largest value of a `--trace` file's `heap` counter, in MB.
fn trace_peak_heap(path: &Path) -> f64 {
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).expect("the trace")).expect("JSON");
    let events = doc["traceEvents"].as_array().expect("traceEvents");
    let heap = events.iter().filter(|e| e["ph"] == "C" && e["name"] == "heap");
    heap.filter_map(|e| e["args"].as_object()?.values().next()?.as_f64()).fold(0.0, f64::max)
}

#[test]
fn values_are_freed_where_they_die() {
    // 4 MB each: `x` (read to the end); `t`, last read in a tree that reads it three times (at
    // -O2 one fused loop, which must free it there, not when the frame ends); `z` and `w`. The
    // interpreter holds at most three at a time (12 MB), the JIT two (`z * z` is written into
    // `z`); keeping `t` would add one.
    let src = "fn main() {\n    let x = uniform(1000000, seed: 1)\n    let t = x * 2.0\n    \
               let y = sum(t * t + t)\n    let z = x * 3.0 + 1.0\n    \
               let w = z * z\n    print(y > 0.0, sum(w) > sum(x))\n}\n";
    let dir = scratch("freed", &[("p.msl", src)]);
    for (mode, values) in [(&["--mode", "eager"][..], 3.0), (&["--mode", "jit", "-O2"], 2.0)] {
        let o = msl(&dir, &[&["run", "--trace", "t.json"][..], mode, &["p.msl"]].concat());
        assert!(o.status.success(), "{mode:?}: {}", text(&o.stderr));
        assert_eq!(text(&o.stdout).trim(), "true true");
        let peak = trace_peak_heap(&dir.join("t.json"));
        assert!(peak < (values + 0.5) * 4.0, "{mode:?}: peak heap {peak} MB");
    }
}

#[test]
fn a_loop_backward_pass_frees_each_iteration_as_it_goes() {
    // Two iterations whose residuals are 4 MB tensors; the backward pass of the first (last to
    // run) recomputes its branch, which needs more memory than the second's. By then the second
    // iteration's residuals are gone: 40-41 MB at the peak, 44-45 MB when the tape kept them.
    let src = "fn loss(w: f32[1000, 1000], x: f32[1000, 1000]) -> f32 {\n    var h = x\n    \
               for i in 0..2 {\n        if i == 0 {\n            h = tanh(h @ w) * sigmoid(h) + exp(h * 0.01)\n        \
               } else {\n            h = tanh(h @ w)\n        }\n    }\n    sum(h)\n}\n\nfn main() {\n    \
               let w = normal(1000, 1000, seed: 1) * 0.01\n    let x = normal(1000, 1000, seed: 2)\n    \
               print(sum(grad(loss)(w, x)) != 0.0)\n}\n";
    let dir = scratch("tape", &[("p.msl", src)]);
    for mode in [&["--mode", "eager"][..], &["--mode", "jit", "-O2"]] {
        let o = msl(&dir, &[&["run", "--trace", "t.json"][..], mode, &["p.msl"]].concat());
        assert!(o.status.success(), "{mode:?}: {}", text(&o.stderr));
        assert_eq!(text(&o.stdout).trim(), "true");
        let peak = trace_peak_heap(&dir.join("t.json"));
        assert!(peak < 42.5, "{mode:?}: peak heap {peak} MB");
    }
}

#[test]
fn a_trace_holds_the_kernels_calls_and_fused_trees_of_the_run() {
    let src = "fn loss(w: f32[4, 3], x: f32[8, 4]) -> f32 {\n    sum(tanh(x @ w) * 2.0 + 1.0)\n}\n\nfn main() {\n    let x = normal(8, 4, seed: 1)\n    let w = normal(4, 3, seed: 2)\n    print(grad(loss)(w, x)[0, 0] != 0.0)\n}\n";
    let dir = scratch("trace", &[("p.msl", src)]);
    for (mode, fused) in [(&["--mode", "eager"][..], false), (&["--mode", "jit", "-O2"], true)] {
        let o = msl(&dir, &[&["run", "--trace", "t.json"][..], mode, &["p.msl"]].concat());
        assert!(o.status.success(), "{mode:?}: {}", text(&o.stderr));
        assert_eq!(text(&o.stdout).trim(), "true");
        let ev = trace_events(&dir.join("t.json"));
        // The backward pass's `xᵀ @ g`, at the `@` it differentiates.
        let mm = ev.iter().filter(|e| e.0 == "kernel" && e.1 == "matmul");
        assert!(mm.clone().any(|e| e.4["shape"] == "f32[4, 3]" && e.4["at"] == "p.msl:2:14"), "{mode:?}: {ev:?}");
        assert!(ev.iter().any(|e| e.0 == "io" && e.1 == "print"), "{mode:?}");
        let main = ev.iter().find(|e| e.1 == "main" && (e.0 == "call" || e.0 == "compiled")).expect("main");
        for e in &ev {
            assert!(e.2 >= main.2 && e.2 + e.3 <= main.2 + main.3 + 1.0, "{mode:?}: {e:?} lies inside main {main:?}");
        }
        assert_eq!(ev.iter().any(|e| e.0 == "fused"), fused, "{mode:?}: fused trees");
        assert!(ev.iter().any(|e| e.1 == "grad(loss)"), "{mode:?}: the derivative's body, named as --explain names it");
        let doc = std::fs::read_to_string(dir.join("t.json")).expect("the trace");
        assert!(doc.contains("{\"name\":\"heap\",\"ph\":\"C\","), "{mode:?}: a heap counter track");
    }
    // A failing run still writes what happened before the failure (one process).
    let bad = "fn main() {\n    let a = ones(3)\n    print(sum(a))\n    print(a[i32(sum(a)) + 2])\n}\n";
    std::fs::write(dir.join("bad.msl"), bad).expect("write");
    let o = msl(&dir, &["run", "--trace", "bad.json", "bad.msl"]);
    assert_eq!(o.status.code(), Some(2));
    let ev = trace_events(&dir.join("bad.json"));
    assert!(ev.iter().any(|e| e.1 == "sum") && ev.iter().any(|e| e.1 == "print"), "{ev:?}");
    // A trace that cannot be written is exit 2 naming the file.
    std::fs::create_dir_all(dir.join("adir")).expect("mkdir");
    let o = msl(&dir, &["run", "--trace", "adir", "p.msl"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o.stderr).contains("error: --trace adir:"), "{}", text(&o.stderr));
}

#[test]
fn an_explicit_optimisation_level_selects_the_jit() {
    let src =
        "fn main() {\n    var acc = 0\n    for i in 0..1000 {\n        acc = acc + i % 7\n    }\n    print(acc)\n}\n";
    let dir = scratch("opt_level", &[("p.msl", src)]);
    // `-O2` alone compiles (what `--explain` describes), and prints what the interpreter prints.
    let o = msl(&dir, &["run", "-O2", "--explain", "p.msl"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert_eq!(text(&o.stdout).trim(), "2997");
    assert!(text(&o.stderr).contains("jit -O2:"), "{}", text(&o.stderr));
    // Neither flag: the interpreter, as before.
    let o = msl(&dir, &["run", "--explain", "p.msl"]);
    assert_eq!(text(&o.stdout).trim(), "2997");
    assert!(text(&o.stderr).contains("add `--mode jit`"), "{}", text(&o.stderr));
    // `--mode eager` keeps the interpreter and says the level does not apply.
    let o = msl(&dir, &["run", "--mode", "eager", "-O2", "p.msl"]);
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(text(&o.stdout).trim(), "2997");
    assert!(text(&o.stderr).contains("note: -O2 applies to --mode jit; running eagerly"), "{}", text(&o.stderr));
    // A level that does not exist is an error in either mode.
    for args in [&["run", "-O3", "p.msl"][..], &["run", "--mode", "eager", "-O3", "p.msl"]] {
        let o = msl(&dir, args);
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        assert!(text(&o.stderr).contains("`-O3` is not an optimisation level"), "{args:?}: {}", text(&o.stderr));
    }
}

#[test]
fn msl_check_of_a_folder_checks_every_msl_file_under_it() {
    let good = "fn f(x: f32[3]) -> f32 { sum(x) }\n";
    let bad = "fn g() -> f32[2] { ones(3) }\n";
    let dir = scratch("check_folder", &[("a.msl", good), ("notes.md", "not checked\n")]);
    for (sub, text) in [("sub", good), (".hidden", bad)] {
        std::fs::create_dir_all(dir.join(sub)).unwrap();
        std::fs::write(dir.join(sub).join("b.msl"), text).unwrap();
    }
    let o = msl(&dir, &["check", "."]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o.stderr));
    assert!(text(&o.stderr).contains("ok: 2 files checked"), "{}", text(&o.stderr));
    std::fs::write(dir.join("sub/deeper.msl"), bad).unwrap();
    let o = msl(&dir, &["check", "."]);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o.stderr).contains("deeper.msl"), "the diagnostic names the file: {}", text(&o.stderr));
    std::fs::create_dir_all(dir.join("empty")).unwrap();
    let o = msl(&dir, &["check", "empty"]);
    assert_eq!(o.status.code(), Some(2), "nothing to check, as for a missing file");
    assert!(text(&o.stderr).contains("error: no `.msl` files under `empty`"), "{}", text(&o.stderr));
}
