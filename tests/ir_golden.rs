//! Golden tests of the typed IR dump (`msl check --emit ir`); `MSL_BLESS=1` rewrites them.

use std::path::Path;
use std::process::Command;

fn golden(name: &str) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    let out = Command::new(env!("CARGO_BIN_EXE_msl"))
        .args(["check", "--emit", "ir"])
        .arg(dir.join(format!("{name}.msl")))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let got = String::from_utf8_lossy(&out.stdout).into_owned();
    let path = dir.join(format!("{name}.ir"));
    if std::env::var_os("MSL_BLESS").is_some() {
        std::fs::write(&path, &got).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&path).unwrap_or_default();
    assert_eq!(got, want, "{name}.ir differs (MSL_BLESS=1 rewrites it)");
}

#[test]
fn model_and_generic_calls() {
    golden("ir_mlp");
}

#[test]
fn control_flow_closures_and_runtime_dims() {
    golden("ir_control");
}
