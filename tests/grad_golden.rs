//! Golden tests of `msl grad`: the printed derivative of each case matches its golden file
//! (`MSL_BLESS=1` rewrites them) and checks again when appended to the program it came from.

use std::path::Path;
use std::process::Command;

fn msl() -> Command {
    Command::new(env!("CARGO_BIN_EXE_msl"))
}

fn golden(func: &str, wrt: Option<&str>) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    let src = dir.join("grad_cases.msl");
    let mut cmd = msl();
    cmd.arg("grad").arg(&src).arg(func);
    if let Some(w) = wrt {
        cmd.arg("--wrt").arg(w);
    }
    let out = cmd.output().unwrap();
    let printed = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "msl grad {func}: {}", String::from_utf8_lossy(&out.stderr));
    let name = format!("grad_{func}{}.msl", wrt.map(|w| format!("_{w}")).unwrap_or_default());
    let path = dir.join(&name);
    if std::env::var_os("MSL_BLESS").is_some() {
        std::fs::write(&path, &printed).unwrap();
    } else {
        let want = std::fs::read_to_string(&path).unwrap_or_default();
        assert_eq!(printed, want, "{name} differs (MSL_BLESS=1 rewrites it)");
    }
    // The derivative is msl: it checks in the context of the program it was taken from.
    let combined = std::env::temp_dir().join(format!("msl-golden-{}-{name}", std::process::id()));
    let text = std::fs::read_to_string(&src).unwrap() + "\n" + &printed;
    std::fs::write(&combined, text).unwrap();
    let check = msl().arg("check").arg(&combined).output().unwrap();
    let _ = std::fs::remove_file(&combined);
    assert!(
        check.status.success(),
        "the derivative of {func} does not check:\n{}\n{printed}",
        String::from_utf8_lossy(&check.stderr)
    );
}

#[test]
fn mlp_loss_wrt_model() {
    golden("mse_loss", None);
}

#[test]
fn mlp_loss_wrt_input() {
    golden("mse_loss", Some("x"));
}

#[test]
fn loop_power() {
    golden("power", None);
}

#[test]
fn branch() {
    golden("piecewise", None);
}

#[test]
fn reduction_of_elementwise() {
    golden("softplus_sum", None);
}

#[test]
fn a_slice_at_a_run_time_position() {
    golden("window", Some("x"));
}

#[test]
fn a_model_dim_no_field_determines() {
    golden("smooth_loss", None);
}

#[test]
fn a_stack_of_models() {
    golden("stacked", None);
    // The printed derivative, run, is the gradient `grad` computes.
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).unwrap();
    let main = "fn main() {
    let m = init(Net[4, 3], seed: 0)
    let x = normal(5, 4, seed: 1)
    let (a, b) = (grad(stacked)(m, x), grad_stacked_m(m, x))
    print(max(abs(a.layers.w - b.layers.w)), max(abs(a.layers.b - b.layers.b)), max(abs(a.head - b.head)))
}
";
    let text = read("grad_cases.msl") + "\n" + &read("grad_stacked.msl") + "\n" + main;
    let path = std::env::temp_dir().join(format!("msl-golden-run-{}.msl", std::process::id()));
    std::fs::write(&path, text).unwrap();
    let out = msl().arg("run").arg(&path).output().unwrap();
    let _ = std::fs::remove_file(&path);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "0.0 0.0 0.0\n", "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn grad_of_a_non_scalar_function_is_rejected() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden");
    let out = msl().arg("grad").arg(dir.join("grad_cases.msl")).arg("power").arg("--wrt").arg("n").output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("E0402"));
}
