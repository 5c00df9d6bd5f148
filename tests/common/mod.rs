//! Helpers shared by the integration tests (each test file that needs one says `mod common;`;
//! a file uses some of them, hence the `allow`).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

/// A fresh directory under the test target's temporary folder, named by `prefix`, the process
/// and `name`, holding `files` (name, text).
pub fn scratch(prefix: &str, name: &str, files: &[(&str, &str)]) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "{prefix}-{}-{name}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create scratch dir");
    for (f, text) in files {
        std::fs::write(dir.join(f), text).expect("write test file");
    }
    dir
}

/// Equal outputs up to float rounding: the same words, and numbers within 1e-5 relative (a
/// sharded sum adds in another order than one process does).
pub fn same_up_to_rounding(a: &str, b: &str) -> bool {
    let split = |s: &str| -> Vec<String> {
        s.split(|c: char| c.is_whitespace() || "[](),".contains(c))
            .filter(|w| !w.is_empty())
            .map(str::to_string)
            .collect()
    };
    let (wa, wb) = (split(a), split(b));
    wa.len() == wb.len()
        && wa.iter().zip(&wb).all(|(x, y)| match (x.parse::<f64>(), y.parse::<f64>()) {
            (Ok(p), Ok(q)) => (p - q).abs() <= 1e-5 * p.abs().max(q.abs()) + 1e-6,
            _ => x == y,
        })
}

/// Whether Open MPI's `mpirun` is here; prints why `test` is skipped where it is not.
pub fn have_mpirun(test: &str) -> bool {
    let ok = Command::new("mpirun").arg("--version").output().is_ok_and(|o| o.status.success());
    if !ok {
        println!("skipping {test}: `mpirun` is not installed (scripts/setup.sh installs Open MPI)");
    }
    ok
}

/// `msl ARGS` in `dir` (colours off, `mpirun` allowed as root for `--ranks`).
pub fn msl_in(dir: &Path, args: &[&str]) -> Output {
    quiet(Command::new(env!("CARGO_BIN_EXE_msl")).args(args), dir).output().expect("run msl")
}

/// `cmd` in `dir` with colours off, no input, and `mpirun` allowed as root.
fn quiet<'c>(cmd: &'c mut Command, dir: &Path) -> &'c mut Command {
    cmd.current_dir(dir)
        .env("NO_COLOR", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .stdin(Stdio::null())
}

/// A folder of one `mpirun` job's own for Open MPI's session files, removed when dropped: jobs
/// started at once (tests run in parallel) share `/tmp/ompi.<host>.<uid>` otherwise, and one that
/// ends removes it while another is making its own folder there (`msl run --ranks` does the same).
pub struct Session(std::path::PathBuf);

impl Session {
    pub fn new(cmd: &mut Command) -> Session {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        // Short: Open MPI puts Unix sockets in it, whose paths may be at most 107 bytes.
        let dir = std::env::temp_dir().join(format!("msl-mpi-t{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        cmd.env("OMPI_MCA_orte_tmpdir_base", &dir).env("PRTE_MCA_prte_tmpdir_base", &dir);
        Session(dir)
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `mpirun -n N msl ARGS` in `dir`.
pub fn mpirun(dir: &Path, n: usize, args: &[&str]) -> Output {
    mpirun_with(dir, n, &[], args)
}

/// `mpirun -n N msl ARGS` in `dir` with environment variables `env` set on every rank.
pub fn mpirun_with(dir: &Path, n: usize, env: &[(&str, &str)], args: &[&str]) -> Output {
    let mut cmd = Command::new("mpirun");
    cmd.args(["-n", &n.to_string(), "--oversubscribe"]);
    for (k, v) in env {
        cmd.args(["-x", k]).env(k, v);
    }
    cmd.arg(env!("CARGO_BIN_EXE_msl")).args(args);
    let _session = Session::new(&mut cmd);
    quiet(&mut cmd, dir).output().expect("run mpirun")
}

/// A command's stdout and stderr as text.
pub fn text(o: &Output) -> (String, String) {
    (String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
}

/// A tiny deterministic PRNG (xorshift64*), so that every run tests the same inputs.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed | 1)
    }
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    pub fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[self.below(xs.len())]
    }
}
