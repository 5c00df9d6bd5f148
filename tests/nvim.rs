//! A real editor against `msl lsp`: Neovim headless with its built-in LSP client opens a copy of
//! the MLP example with a shape error put in, and a diagnostic and a hover must arrive (see
//! `tests/nvim/lsp_smoke.lua`). Skipped, with a printed reason, where `nvim` is not installed
//! (`scripts/setup.sh` installs it as root with apt).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

#[test]
fn neovim_gets_a_diagnostic_and_a_hover() {
    if Command::new("nvim").arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status().is_err() {
        println!("skipped: nvim not found");
        return;
    }
    let root = env!("CARGO_MANIFEST_DIR");
    let dir = std::env::temp_dir().join(format!("msl-nvim-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let example = std::fs::read_to_string(format!("{root}/examples/mlp/train.msl")).unwrap();
    // `w1` where `w2` belongs: f32[N, H] @ f32[I, H] does not fit.
    let broken = example.replacen("linear(h, m.w2, m.b2)", "linear(h, m.w1, m.b2)", 1);
    assert_ne!(broken, example, "the example changed; update this test");
    let file = dir.join("train.msl");
    std::fs::write(&file, &broken).unwrap();
    // Hover over the `h` of `let h = relu(…)`.
    let at = broken.find("let h = ").unwrap() + 4;
    let line = broken[..at].matches('\n').count();
    let col = at - broken[..at].rfind('\n').map_or(0, |i| i + 1);
    let out = dir.join("result.txt");

    let mut child = Command::new("nvim")
        .args(["--headless", "-u", "NONE", "-i", "NONE", "-n", "-c"])
        .arg(format!("luafile {root}/tests/nvim/lsp_smoke.lua"))
        .env("MSL_BIN", env!("CARGO_BIN_EXE_msl"))
        .env("MSL_FILE", &file)
        .env("MSL_OUT", &out)
        .env("MSL_HOVER_LINE", line.to_string())
        .env("MSL_HOVER_COL", col.to_string())
        .env("MSL_HOVER_EXPECT", "h: f32[N, H]")
        .env("XDG_CONFIG_HOME", dir.join("config"))
        .env("XDG_DATA_HOME", dir.join("data"))
        .env("XDG_STATE_HOME", dir.join("state"))
        .env("XDG_CACHE_HOME", dir.join("cache"))
        .env("NVIM_LOG_FILE", dir.join("nvim.log"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start nvim");
    let end = Instant::now() + Duration::from_secs(90);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > end {
            let _ = child.kill();
            panic!("nvim did not finish; so far:\n{}", std::fs::read_to_string(&out).unwrap_or_default());
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let report = std::fs::read_to_string(&out).unwrap_or_default();
    println!("{report}");
    assert!(status.success() && report.contains("RESULT ok"), "nvim reported:\n{report}");
    // The diagnostic sits on the line that was broken.
    let bad_line = broken[..broken.find("linear(h, m.w1").unwrap()].matches('\n').count();
    assert!(report.contains(&format!("diagnostic {bad_line}:")), "{report}");
    let _ = std::fs::remove_dir_all(&dir);
}
