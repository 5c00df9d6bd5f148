//! The `msl` binary and hostile file systems: `save` is atomic under `kill -9` and never
//! writes through a link; `load`, `save` and the REPL's `:load` refuse FIFOs and devices with
//! exit status 2 instead of blocking forever.
//!
//! Every run is under a watchdog, so a regression shows as a failed test, not a hung one. The
//! tests need FIFOs and symbolic links, hence Unix.
#![cfg(unix)]

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// How long one `msl` run may take before it counts as blocked.
const LIMIT: Duration = Duration::from_secs(20);

fn scratch(name: &str) -> PathBuf {
    static N: AtomicUsize = AtomicUsize::new(0);
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "files-{}-{name}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Waits for `child` at most `LIMIT`, killing it (and failing) when it takes longer.
fn finish(mut child: Child, what: &str) -> Output {
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what}: still running after {LIMIT:?} (blocked?)");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    child.wait_with_output().unwrap()
}

/// Runs `msl run main.msl` in `dir` with `src` as the program.
fn run(dir: &Path, src: &str) -> Output {
    std::fs::write(dir.join("main.msl"), src).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_msl"))
        .args(["run", "main.msl"])
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    finish(child, src)
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn mkfifo(p: &Path) {
    assert!(Command::new("mkfifo").arg(p).status().unwrap().success(), "mkfifo {}", p.display());
}

/// The f32 values of the one tensor `w` of a safetensors file written by msl, or why the file
/// is not a complete one.
fn weights(bytes: &[u8]) -> Result<Vec<f32>, String> {
    let n = u64::from_le_bytes(bytes.get(..8).ok_or("shorter than 8 bytes")?.try_into().unwrap()) as usize;
    let header =
        std::str::from_utf8(bytes.get(8..8 + n).ok_or("ends inside the header")?).map_err(|e| e.to_string())?;
    let (start, end) = (header.find("\"data_offsets\":[").ok_or("no offsets")? + 16, header.rfind(']').unwrap());
    let offsets: Vec<usize> = header[start..end].split(',').map(|s| s.trim().parse().unwrap()).collect();
    let data = &bytes[8 + n..];
    if data.len() != offsets[1] {
        return Err(format!("{} bytes of data where the header says {}", data.len(), offsets[1]));
    }
    Ok(data.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect())
}

/// `save` under `kill -9` at random moments: the file on disk is always a complete file, either
/// the good one that was there before the run or one that the run saved whole. Before saves
/// were atomic, a kill during the write left a truncated file (the old content was already
/// gone).
#[test]
fn save_survives_kill_9_at_any_moment() {
    let dir = scratch("kill");
    // Each save writes 4 MiB whose every element is the loop counter, so a torn or mixed file
    // shows as a wrong length or as two different values.
    let program = "model Big { w: f32[1024, 1024] }

fn main() {
    for i in 0..1000000 {
        save(\"model.safetensors\", Big(w: full(f32(i), 1024, 1024)))
    }
}
";
    std::fs::write(dir.join("main.msl"), program).unwrap();
    let target = dir.join("model.safetensors");
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let (mut trials, mut saw_new, mut saw_old) = (0, 0, 0);
    let start = Instant::now();
    // About 40 trials, stopping early to stay near 15 s on a slow machine.
    while trials < 40 && start.elapsed() < Duration::from_secs(15) {
        trials += 1;
        // The good file from before: the value -1 everywhere, as msl saves such a model.
        let good = {
            let w = kernels::Tensor::from_f32(vec![1024, 1024], vec![-1.0; 1024 * 1024]).unwrap();
            kernels::io::save_safetensors(&target, &[("w".to_string(), w)]).unwrap();
            std::fs::read(&target).unwrap()
        };
        let mut child = Command::new(env!("CARGO_BIN_EXE_msl"))
            .args(["run", "main.msl"])
            .current_dir(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        // From the start-up (the program is still being checked) to several saves in.
        std::thread::sleep(Duration::from_millis(rng % 400));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        let now = std::fs::read(&target).expect("the target file still exists");
        if now == good {
            saw_old += 1;
            continue;
        }
        let w = weights(&now).unwrap_or_else(|e| panic!("trial {trials}: a damaged file after kill -9: {e}"));
        assert_eq!(w.len(), 1024 * 1024, "trial {trials}");
        assert!(w.iter().all(|&x| x == w[0] && x >= 0.0), "trial {trials}: a file mixing saves");
        saw_new += 1;
        // Stray temporary files of killed runs are cleaned up between trials.
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            if p.extension().is_some_and(|x| x == "tmp") {
                std::fs::remove_file(p).unwrap();
            }
        }
    }
    eprintln!("kill -9: {trials} trials, {saw_old} left the old file, {saw_new} a new complete one");
    assert!(trials >= 10, "only {trials} trials ran");
}

#[test]
fn save_refuses_links_and_leaves_their_targets_alone() {
    let dir = scratch("link");
    let real = dir.join("real.npy");
    std::fs::write(&real, b"precious").unwrap();
    std::os::unix::fs::symlink(&real, dir.join("link.npy")).unwrap();
    let o = run(&dir, "fn main() {\n    save(\"link.npy\", ones(3))\n}\n");
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(e.contains("link.npy: cannot write: not a regular file (a symbolic link)"), "{e}");
    assert_eq!(std::fs::read(&real).unwrap(), b"precious");
    assert!(std::fs::symlink_metadata(dir.join("link.npy")).unwrap().file_type().is_symlink());
    // A directory in the way is refused the same way.
    std::fs::create_dir(dir.join("d.safetensors")).unwrap();
    let o = run(&dir, "fn main() {\n    save(\"d.safetensors\", ones(3))\n}\n");
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("not a regular file (a directory)"), "{}", stderr(&o));
}

#[test]
fn fifos_and_devices_are_refused_instead_of_blocking() {
    let dir = scratch("fifo");
    mkfifo(&dir.join("pipe.npy"));
    mkfifo(&dir.join("pipe.csv"));
    std::os::unix::fs::symlink("/dev/zero", dir.join("zero.npy")).unwrap();
    for (src, want) in [
        ("let x: f32[N] = load(\"pipe.npy\")\n    print(N)", "pipe.npy: cannot read: not a regular file (a FIFO)"),
        ("let x: f32[N, 2] = load(\"pipe.csv\")\n    print(N)", "pipe.csv: cannot read: not a regular file (a FIFO)"),
        ("let x: f32[N] = load(\"zero.npy\")\n    print(N)", "zero.npy: cannot read: not a regular file (a device)"),
        ("save(\"pipe.npy\", ones(2))", "pipe.npy: cannot write: not a regular file (a FIFO)"),
    ] {
        let o = run(&dir, &format!("fn main() {{\n    {src}\n}}\n"));
        assert_eq!(o.status.code(), Some(2), "{src}: {}", stderr(&o));
        assert!(stderr(&o).contains(want), "{src}: {}", stderr(&o));
    }
    // The REPL's `:load` of a FIFO reports an error and the session goes on.
    let pipe = dir.join("pipe.msl");
    mkfifo(&pipe);
    let mut child = Command::new(env!("CARGO_BIN_EXE_msl"))
        .arg("repl")
        .current_dir(&dir)
        .env("XDG_DATA_HOME", dir.join("data"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    write!(child.stdin.take().unwrap(), ":load {}\n1 + 1\n", pipe.display()).unwrap();
    let o = finish(child, ":load of a FIFO");
    let (out, err) = (String::from_utf8_lossy(&o.stdout), stderr(&o));
    assert!(err.contains("cannot read") && err.contains("not a regular file (a FIFO)"), "{err}");
    assert_eq!(out.trim(), "2", "{out}");
}
