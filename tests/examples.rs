//! Smoke tests of the examples: each checks, the MLP trains to its accuracy target (a rerun
//! resumes from its checkpoint after the last epoch; quantized to int8 it keeps its accuracy),
//! the PINN and MD examples reach theirs, the GPT's cached generation equals recomputation, and
//! each of them prints exactly the same under `--mode jit -O2` as in the interpreter and logs its
//! curves with `log_scalar`. (The transformer, about 45 s in a release build, is run by hand.)

use std::process::Command;

mod common;

fn msl() -> Command {
    Command::new(env!("CARGO_BIN_EXE_msl"))
}

#[test]
fn every_example_checks() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let mut n = 0;
    for dir in std::fs::read_dir(&root).unwrap().flatten() {
        for f in std::fs::read_dir(dir.path()).unwrap().flatten() {
            if f.path().extension().is_some_and(|e| e == "msl") {
                let out = msl().arg("check").arg(f.path()).output().unwrap();
                assert!(out.status.success(), "{}: {}", f.path().display(), String::from_utf8_lossy(&out.stderr));
                n += 1;
            }
        }
    }
    assert!(n >= 4, "expected the mlp, transformer, pinn and md examples, found {n} programs");
}

#[test]
fn mlp_example_reaches_96_percent() {
    let dir = std::env::temp_dir().join(format!("msl-mlp-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/mlp/train.msl");
    let out = msl().arg("run").arg(&file).current_dir(&dir).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(dir.join("mlp.ckpt/index.json").exists(), "the training state is saved every epoch");
    // A rerun resumes after the last epoch: it trains no more and prints the last line again.
    let again = msl().arg("run").arg(&file).current_dir(&dir).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&again.stdout), stdout.lines().last().unwrap().to_string() + "\n");
    std::fs::remove_dir_all(dir.join("mlp.ckpt")).unwrap();
    let jit = msl().args(["run", "--mode", "jit", "-O2"]).arg(&file).current_dir(&dir).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&jit.stdout), stdout, "{}", String::from_utf8_lossy(&jit.stderr));
    let last = stdout.lines().rev().find(|l| l.starts_with("epoch")).expect("an epoch line");
    let acc: f64 = last.rsplit("test_acc").next().unwrap().split_whitespace().next().unwrap().parse().unwrap();
    assert!(acc >= 0.96, "test accuracy {acc} < 0.96:\n{stdout}");
    // Quantized to int8 it loses at most half a point (issue 18's bound).
    let int8 = figure(&stdout, "int8 test_acc");
    assert!(int8 >= acc - 0.005, "int8 test accuracy {int8} against {acc}:\n{stdout}");
    assert!(dir.join("mlp.safetensors").exists(), "the trained model is saved");
    assert_eq!(event_files(&dir.join("runs/train")), 2, "each run logs loss and accuracy into runs/train");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The number of TensorBoard event files in `dir`.
fn event_files(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir)
        .map_or(0, |rd| rd.flatten().filter(|e| e.file_name().to_string_lossy().contains("tfevents")).count())
}

/// What the example prints, after checking that `--mode jit -O2` prints exactly the same; both
/// log into a scratch folder, not the repository's `runs/`.
fn run_example(rel: &str) -> String {
    let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(rel);
    let logdir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "examples-{}-{}",
        std::process::id(),
        rel.replace('/', "_")
    ));
    let _ = std::fs::remove_dir_all(&logdir);
    let run = |args: &[&str]| {
        let out = msl().args(args).arg("--logdir").arg(&logdir).arg(&file).output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(out.status.success(), "{rel} {args:?}: {stdout}\n{}", String::from_utf8_lossy(&out.stderr));
        stdout
    };
    let eager = run(&["run"]);
    assert_eq!(run(&["run", "--mode", "jit", "-O2"]), eager, "{rel}: the JIT prints something else");
    assert_eq!(event_files(&logdir), 2, "{rel}: each run logs with `log_scalar`");
    let _ = std::fs::remove_dir_all(&logdir);
    eager
}

/// The number after `key` on the last line that has it.
fn figure(out: &str, key: &str) -> f64 {
    let line = out.lines().rev().find(|l| l.contains(key)).unwrap_or_else(|| panic!("no `{key}` in:\n{out}"));
    line.split(key).nth(1).unwrap().split_whitespace().next().unwrap().parse().unwrap()
}

/// The character-level GPT's test block (`msl test`): generation with the key/value cache gives
/// the tokens and logits of recomputing the window, in the interpreter and compiled.
#[test]
fn gpt_example_generates_the_same_with_and_without_the_cache() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/gpt");
    for mode in [&["test"][..], &["test", "--mode", "jit", "-O2"]] {
        let out = msl().args(mode).arg("train.msl").current_dir(&dir).output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{mode:?}: {stdout}\n{}", String::from_utf8_lossy(&out.stderr));
        assert!(stdout.contains("1 passed, 0 failed"), "{mode:?}: {stdout}");
    }
}

#[test]
fn pinn_example_is_within_1e_2_of_the_exact_solution() {
    let out = run_example("examples/pinn/train.msl");
    let err = figure(&out, "max error");
    assert!(err < 1e-2, "max error {err}:\n{out}");
}

#[test]
fn md_example_conserves_energy_to_1e_3() {
    let out = run_example("examples/md/simulate.msl");
    let drift = figure(&out, "max relative drift");
    assert!(drift < 1e-3, "drift {drift}:\n{out}");
}

/// The sharded examples (`examples/parallel`): on one process they learn, and on four ranks
/// (`dp = 2, mp = 2`) they print the same lines (skipped with a message where `mpirun` is absent).
fn same_on_four_ranks(example: &str, one: &str) {
    if Command::new("mpirun").arg("--version").output().is_err() {
        println!("skipping the four-rank run of {example}: `mpirun` is not installed");
        return;
    }
    let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(example);
    let out = msl().args(["run", "--ranks", "4"]).arg(&file).output().unwrap();
    let four = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{four}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(common::same_up_to_rounding(one, &four), "one process:\n{one}\nfour ranks:\n{four}");
}

/// The digits MLP over `dp` and `mp` reaches the accuracy of the plain one.
#[test]
fn parallel_example_on_four_ranks_prints_what_one_process_prints() {
    let one = run_example("examples/parallel/train.msl");
    assert!(figure(&one, "test_acc") >= 0.96, "{one}");
    same_on_four_ranks("examples/parallel/train.msl", &one);
}

/// The sorting transformer with its heads and feed-forward layer over `mp`, the batch over `dp`.
#[test]
fn parallel_transformer_on_four_ranks_prints_what_one_process_prints() {
    let one = run_example("examples/parallel/transformer.msl");
    assert!(figure(&one, "test_acc") >= 0.85, "{one}");
    same_on_four_ranks("examples/parallel/transformer.msl", &one);
}

/// The residual digits classifier over two pipeline stages of two data-parallel replicas
/// learns, and prints on four ranks what it prints on one process.
#[test]
fn pipeline_example_on_four_ranks_prints_what_one_process_prints() {
    let one = run_example("examples/parallel/pipeline.msl");
    assert!(figure(&one, "test_acc") >= 0.95, "{one}");
    same_on_four_ranks("examples/parallel/pipeline.msl", &one);
}
