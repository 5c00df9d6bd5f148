//! `msl run --mode jit`: same output as eager at every level, and `--explain` names each compiled
//! function body, fused tree and compiled scalar loop with its source location, counts the
//! fallbacks (none here: the loop over a tensor is native code in `main`'s body), and at `-O2`
//! tells what the whole-program passes did and the static memory plan.

use std::process::{Command, Output};

const PROGRAM: &str = "use nn.layer_norm

fn main() {
    let x = normal(64, 32, seed: 1)
    let w = normal(32, 16, seed: 2)
    let b = normal(16, seed: 3)
    let h = gelu(x @ w + b)
    print(sum(h), mean(layer_norm(h, ones(16), zeros(16)) * 2.0 - 1.0))
    var acc = 0
    for i in 0..1000 { acc = acc + i % 3 }
    var t = zeros(4)
    for i in 0..3 { t = t + 1.0 }
    print(acc, t)
}
";

fn msl(args: &[&str], file: &std::path::Path) -> Output {
    Command::new(env!("CARGO_BIN_EXE_msl")).args(args).arg(file).output().unwrap()
}

#[test]
fn jit_levels_print_what_eager_prints_and_explain_fusion() {
    let dir = std::env::temp_dir().join(format!("msl-jit-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("fuse.msl");
    std::fs::write(&file, PROGRAM).unwrap();
    let eager = msl(&["run"], &file);
    assert!(eager.status.success(), "{}", String::from_utf8_lossy(&eager.stderr));
    for level in ["-O0", "-O1", "-O2"] {
        let out = msl(&["run", "--mode", "jit", level, "--explain"], &file);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{level}: {err}");
        assert_eq!(out.stdout, eager.stdout, "{level} prints something else than eager");
        // Bodies and scalar loops compile at every level; the loop over `t` is part of `main`'s
        // native code, so nothing falls back.
        assert!(err.contains("fuse.msl:3:4): "), "{err}");
        assert!(err.contains("compiled body of `main` ("), "{err}");
        assert!(err.contains("compiled body of `layer_norm`"), "{err}");
        assert!(err.contains("compiled loop at "), "{err}");
        assert!(err.contains("fuse.msl:10:5: `for i in 0..1000 { acc = acc + i % 3 }`"), "{err}");
        assert!(!err.contains("fallback:"), "{err}");
        assert!(err.contains(" 0 fallbacks (0 interpreted bodies, 0 interpreted loop runs"), "{err}");
        assert!(err.contains("memory: peak heap during the run"), "{err}");
        if level == "-O0" {
            assert!(err.contains("no fusion"), "{err}");
            continue;
        }
        // `gelu(x @ w + b)`: the matmul is an input, `add` and `gelu` one loop with `b`
        // broadcast along rows; the tail of `layer_norm` (in nn.msl) is another tree.
        assert!(err.contains("fuse.msl:7:13: `gelu(x @ w + b)`"), "{err}");
        assert!(err.contains("2 ops (add, gelu), 2 inputs: gelu(add(in0, in1))"), "{err}");
        assert!(err.contains("nn.msl"), "{err}");
        assert!(err.contains("0 fused-tree fallbacks"), "{err}");
        assert_eq!(err.contains("constants folded"), level == "-O2", "{err}");
        // The static memory plan (-O2), before the measured peak: x, w, b, x @ w (its fused
        // `gelu(… + b)` written into it), ones, zeros, layer_norm's result (the fused `* 2.0 - 1.0`
        // written into it), zeros(4) and `t + 1.0`; the peak is x, w, b and x @ w, 14400 bytes.
        let plan = "memory plan of `main`: 11 tensor values in 8 buffers (3 reuse a dead value's buffer); \
                    peak 4 buffers = 14.1 KiB, 26.2 KiB without reuse";
        assert_eq!(err.contains(plan), level == "-O2", "{err}");
        if level == "-O2" {
            assert!(err.find(plan) < err.find("memory: peak heap"), "{err}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn msl_test_runs_test_blocks_and_spec_examples_compiled() {
    let dir = std::env::temp_dir().join(format!("msl-jit-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("t.msl");
    std::fs::write(
        &file,
        "test \"a loop over tensors\" {\n    var t = zeros(3)\n    for i in 0..4 { t = t + f32(i) }\n    \
         assert_close(t, full(6.0, 3))\n}\n\ntest \"a failing one\" {\n    assert(sum(ones(2)) == 3.0, \"two ones\")\n}\n",
    )
    .unwrap();
    let spec = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("spec/jit.md");
    for level in ["-O0", "-O1", "-O2"] {
        let out =
            Command::new(env!("CARGO_BIN_EXE_msl")).args(["test", "--mode", "jit", level]).arg(&file).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(1), "{level}: {text}");
        assert!(
            text.contains("\"a loop over tensors\" ... ok") && text.contains("\"a failing one\" ... FAILED"),
            "{text}"
        );
        assert!(text.contains("1 passed, 1 failed"), "{text}");
        let out =
            Command::new(env!("CARGO_BIN_EXE_msl")).args(["test", "--mode", "jit", level]).arg(&spec).output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success() && text.contains(" passed, 0 failed"), "{level}: {text}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
