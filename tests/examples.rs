//! Smoke tests of the examples: each checks, and the MLP trains to its accuracy target.

use std::process::Command;

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
    assert!(n >= 2, "expected the mlp and transformer examples, found {n} programs");
}

#[test]
fn mlp_example_reaches_96_percent() {
    let dir = std::env::temp_dir().join(format!("msl-mlp-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/mlp/train.msl");
    let out = msl().arg("run").arg(&file).current_dir(&dir).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let last = stdout.lines().rev().find(|l| l.contains("test_acc")).expect("an epoch line");
    let acc: f64 = last.rsplit("test_acc").next().unwrap().trim().split_whitespace().next().unwrap().parse().unwrap();
    assert!(acc >= 0.96, "test accuracy {acc} < 0.96:\n{stdout}");
    assert!(dir.join("mlp.safetensors").exists(), "the trained model is saved");
    let _ = std::fs::remove_dir_all(&dir);
}
