//! Checkpoint folders (`save("dir/", state)`, `load("dir/")`, `exists`) through the `msl` binary:
//! the same state gives the same bytes in every process and engine; `kill -9` at random moments
//! of many saves over a good checkpoint always leaves one that loads and is complete; a training
//! run stopped after any epoch and started again prints exactly the lines of the uninterrupted
//! run; a damaged checkpoint is a run-time error, never a crash; and Python's `safetensors` reads what msl writes, with the names, shapes, types and
//! values msl has (in a venv under `target/`, skipped with the reason printed when Python,
//! venv or pip is not there).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

mod common;

fn scratch(name: &str, files: &[(&str, &str)]) -> PathBuf {
    common::scratch("ckpt", name, files)
}

fn msl_cmd(dir: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_msl"));
    c.args(args).current_dir(dir).env_remove("RUST_BACKTRACE").env("NO_COLOR", "1").stdin(Stdio::null());
    c
}

fn msl(dir: &Path, args: &[&str]) -> Output {
    msl_cmd(dir, args).output().expect("run msl")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Runs `args` and returns its output, which must be a success.
fn ok(dir: &Path, args: &[&str]) -> String {
    let o = msl(dir, args);
    assert!(o.status.success(), "msl {args:?} in {}:\n{}{}", dir.display(), text(&o.stdout), text(&o.stderr));
    text(&o.stdout)
}

/// The files of a folder with their bytes, sorted by name.
fn files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .flatten()
        .map(|e| (e.file_name().to_string_lossy().into_owned(), std::fs::read(e.path()).unwrap()))
        .collect();
    v.sort();
    v
}

/// A small deterministic generator for the kill delays (seeded from the clock; the seed is
/// printed so that a failure can be replayed with `MSL_KILL_SEED`).
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (self.0 >> 33) % n.max(1)
    }
}

const STATE: &str = "use optim.adam

model Mlp {
    w1: f32[8, 32] = he_normal(8, 32)
    b1: f32[32]    = zeros(32)
    w2: f32[32, 3] = he_normal(32, 3)
    b2: f32[3]     = zeros(3)
}
";

#[test]
fn the_same_state_gives_the_same_bytes() {
    let prog = format!(
        "{STATE}
fn main() {{
    let m = init(Mlp, seed: 3)
    var opt = adam.init(m, lr: 0.01)
    let (m2, o2) = adam.step(m, m * 0.5, opt)
    save(\"a/\", (m2, o2, 4, f64(arange(5)) / 3.0, arange(4) > 1))
    save(\"b/\", (m2, o2, 4, f64(arange(5)) / 3.0, arange(4) > 1))
    save(\"b/\", (m2, o2, 4, f64(arange(5)) / 3.0, arange(4) > 1))
}}
"
    );
    let dir = scratch("same", &[("save.msl", &prog)]);
    ok(&dir, &["run", "save.msl"]);
    let a = files(&dir.join("a"));
    assert_eq!(a.len(), 2, "an index and one data file: {:?}", a.iter().map(|f| &f.0).collect::<Vec<_>>());
    assert_eq!(files(&dir.join("b")), a, "a second save of the same state changes nothing");
    // Another process, and the JIT, write the same bytes.
    std::fs::rename(dir.join("a"), dir.join("first")).unwrap();
    ok(&dir, &["run", "save.msl"]);
    assert_eq!(files(&dir.join("a")), a, "another process");
    std::fs::remove_dir_all(dir.join("a")).unwrap();
    ok(&dir, &["run", "--mode", "jit", "-O2", "save.msl"]);
    assert_eq!(files(&dir.join("a")), a, "the JIT");
    let index = String::from_utf8(a.iter().find(|f| f.0 == "index.json").unwrap().1.clone()).unwrap();
    for name in ["\"0.w1\"", "\"1.mu.w1\"", "\"1.nu.b2\"", "\"1.t\"", "\"2\"", "\"3\"", "\"4\""] {
        assert!(index.contains(&format!("{{\"name\":{name},")), "{name} in\n{index}");
    }
    assert!(index.contains("\"mesh\": null") && index.contains("\"dtype\":\"F64\"") && index.contains("\"BOOL\""));
    let _ = std::fs::remove_dir_all(&dir);
}

/// Kills `child` with SIGKILL and reaps it.
fn kill9(mut child: Child) {
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn kill_9_during_saves_never_damages_the_checkpoint() {
    const KILLS: usize = 30;
    let dir = scratch(
        "kill",
        &[
            ("good.msl", "fn main() {\n    save(\"ck/\", (full(-1.0, 1024, 256), -1))\n}\n"),
            (
                "saver.msl",
                "fn main() {\n    for i in 0..1000000 {\n        save(\"ck/\", (full(f32(i), 1024, 256), i))\n        print(i)\n    }\n}\n",
            ),
            ("saver2.msl", "fn main() {\n    save(\"ck/\", (full(5.0, 1024, 256), 5))\n    save(\"ck/\", (full(6.0, 1024, 256), 6))\n}\n"),
            (
                "check.msl",
                "fn main() {\n    let (x, n): (f32[1024, 256], i32) = load(\"ck/\")\n    \
                 assert(min(x) == f32(n) && max(x) == f32(n), \"every element is the saved counter\")\n    print(n)\n}\n",
            ),
        ],
    );
    ok(&dir, &["run", "good.msl"]);
    let seed = std::env::var("MSL_KILL_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
    });
    eprintln!("kill delays from MSL_KILL_SEED={seed}");
    let mut rng = Lcg(seed);
    let mut landed = 0;
    for round in 0..KILLS {
        let mut child = msl_cmd(&dir, &["run", "saver.msl"]).stdout(Stdio::piped()).spawn().expect("start the saver");
        let stdout = child.stdout.take().expect("a pipe");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        // Most kills land among the saves (after the first has finished); some at any moment,
        // start-up included.
        if round % 4 != 0 {
            let _ = rx.recv_timeout(Duration::from_secs(60));
        }
        std::thread::sleep(Duration::from_millis(rng.below(60)));
        kill9(child);
        let printed: Vec<i64> = rx.try_iter().filter_map(|l| l.trim().parse().ok()).collect();
        landed += usize::from(!printed.is_empty());
        let o = msl(&dir, &["run", "check.msl"]);
        assert!(
            o.status.success(),
            "round {round} (seed {seed}): the checkpoint does not load after kill -9:\n{}{}",
            text(&o.stdout),
            text(&o.stderr)
        );
        let n: i64 = text(&o.stdout).trim().parse().expect("the counter");
        // A save whose line was printed had finished: the checkpoint holds it or a later one.
        if let Some(&last) = printed.last() {
            assert!(n >= last && n <= last + 1, "round {round}: loaded {n} after save {last} had finished");
        }
    }
    assert!(landed >= KILLS / 2, "only {landed} of {KILLS} kills landed during saves");
    // A save that completes removes what the killed ones left behind.
    ok(&dir, &["run", "saver2.msl"]);
    let left: Vec<String> = files(&dir.join("ck")).into_iter().map(|f| f.0).collect();
    assert_eq!(left.len(), 2, "leftovers: {left:?}");
    assert_eq!(ok(&dir, &["run", "check.msl"]).trim(), "6");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_damaged_checkpoint_is_an_error_never_a_crash() {
    let prog = format!(
        "{STATE}
fn main() {{
    let m = init(Mlp, seed: 3)
    save(\"good/\", (m, adam.init(m), 4))
}}
"
    );
    let load = format!(
        "{STATE}
fn main() {{
    let s: (Mlp, adam.AdamState[Mlp], i32) = load(\"ckpt/\")
    print(\"loaded\")
}}
"
    );
    let dir = scratch("damaged", &[("save.msl", &prog), ("load.msl", &load)]);
    ok(&dir, &["run", "save.msl"]);
    let good = files(&dir.join("good"));
    let mut rng = Lcg(7);
    for round in 0..40 {
        let ck = dir.join("ckpt");
        let _ = std::fs::remove_dir_all(&ck);
        std::fs::create_dir_all(&ck).unwrap();
        // Damage one file: cut it short or change a byte (of the index, mostly its numbers).
        let victim = rng.below(good.len() as u64) as usize;
        for (i, (name, bytes)) in good.iter().enumerate() {
            let mut b = bytes.clone();
            if i == victim {
                let at = rng.below(b.len() as u64) as usize;
                if round % 3 == 0 {
                    b.truncate(at);
                } else {
                    b[at] = b"0123456789-[]{},\"x \xff"[rng.below(18) as usize];
                }
            }
            std::fs::write(ck.join(name), b).unwrap();
        }
        let o = msl(&dir, &["run", "load.msl"]);
        let (out, err) = (text(&o.stdout), text(&o.stderr));
        assert!(!err.contains("panicked") && !err.contains("internal error"), "round {round}: {err}");
        match o.status.code() {
            Some(0) => assert_eq!(out, "loaded\n", "round {round}"),
            Some(2) => assert!(err.contains("E0601") && err.contains("ckpt/"), "round {round}: {err}"),
            c => panic!("round {round}: exit {c:?}\n{out}{err}"),
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

const TRAIN: &str = "
use nn.{linear, relu, cross_entropy}

fn loss[N](m: Mlp, x: f32[N, 8], y: i32[N]) -> f32 {
    mean(cross_entropy(linear(relu(linear(x, m.w1, m.b1)), m.w2, m.b2), y))
}

fn main() {
    let x = normal(2048, 8, seed: 1)
    let y = argmax(x[:, 0:3], axis: 1)
    var m = init(Mlp, seed: 0)
    var opt = adam.init(m, lr: 0.01)
    var start = 0
    if exists(\"ckpt/\") {
        let s: (Mlp, adam.AdamState[Mlp], i32) = load(\"ckpt/\")
        (m, opt, start) = s
    }
    for epoch in start..10 {
        for (xb, yb) in batches(x, y, size: 32, shuffle: epoch) {
            (m, opt) = adam.step(m, grad(loss)(m, xb, yb), opt)
        }
        save(\"ckpt/\", (m, opt, epoch + 1))
        print(\"epoch\", epoch, \"loss\", loss(m, x, y), \"step\", opt.t)
    }
    print(\"final\", sum(m.w1), sum(m.b1), sum(m.w2), sum(m.b2), opt.t)
}
";

const EPOCH_OF: &str = "
fn main() {
    let (m, opt, epoch): (Mlp, adam.AdamState[Mlp], i32) = load(\"ckpt/\")
    print(epoch)
}
";

#[test]
fn a_stopped_run_resumes_exactly() {
    let train = format!("{STATE}{TRAIN}");
    let epoch_of = format!("{STATE}{EPOCH_OF}");
    let full_dir = scratch("resume-full", &[("train.msl", &train)]);
    let full: Vec<String> = ok(&full_dir, &["run", "train.msl"]).lines().map(str::to_string).collect();
    assert_eq!(full.len(), 11, "{full:?}");
    assert_eq!(ok(&full_dir, &["run", "train.msl"]).lines().collect::<Vec<_>>(), [full[10].as_str()]);
    for (k, mode) in [(0, &["run"][..]), (3, &["run"][..]), (6, &["run", "--mode", "jit", "-O2"][..])] {
        let dir = scratch("resume", &[("train.msl", &train), ("epoch.msl", &epoch_of)]);
        // Stop the run with kill -9 once it has printed epoch k (each line follows its save).
        let mut child = msl_cmd(&dir, &["run", "train.msl"]).stdout(Stdio::piped()).spawn().expect("start");
        let stdout = child.stdout.take().expect("a pipe");
        let mut printed = Vec::new();
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let done = line.starts_with(&format!("epoch {k} "));
            printed.push(line);
            if done {
                break;
            }
        }
        kill9(child);
        assert_eq!(printed[..], full[..printed.len()], "the stopped run printed what the full run prints");
        let saved: usize = ok(&dir, &["run", "epoch.msl"]).trim().parse().expect("an epoch count");
        assert!(saved > k && saved <= 10, "stopped after epoch {k}, the checkpoint holds {saved} epochs");
        let mut args = mode.to_vec();
        args.push("train.msl");
        let rerun: Vec<String> = ok(&dir, &args).lines().map(str::to_string).collect();
        assert_eq!(rerun[..], full[saved..], "resumed from epoch {saved} ({mode:?})");
        let _ = std::fs::remove_dir_all(&dir);
    }
    let _ = std::fs::remove_dir_all(&full_dir);
}

/// The check run by Python: what msl wrote to `ckpt/` is what it wrote to `ref.npz`, and the
/// index describes the safetensors file (names in order, shapes, types, byte ranges, CRC-32).
const PY_CHECK: &str = r#"
import json, struct, sys, zlib
import numpy as np
import safetensors.numpy

index = json.load(open("ckpt/index.json"))
assert index["format"] == "msl-checkpoint" and index["version"] == 1 and index["mesh"] is None, index
[f] = index["files"]
path = "ckpt/" + f["name"]
raw = open(path, "rb").read()
assert len(raw) == f["size"], (len(raw), f["size"])
n = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8:8 + n])
assert header["__metadata__"] == {"format": "pt"}, header["__metadata__"]
assert zlib.crc32(raw[:8 + n]) == f["header_crc32"]
state = safetensors.numpy.load_file(path)
ref = dict(np.load("ref.npz"))
names = [t["name"] for t in index["tensors"]]
assert names == [k for k in header if k != "__metadata__"], (names, list(header))
assert sorted(names) == sorted(state) == sorted(ref), (names, sorted(state), sorted(ref))
kinds = {"F32": np.float32, "F64": np.float64, "I32": np.int32, "BOOL": np.bool_}
for t in index["tensors"]:
    a, r = state[t["name"]], ref[t["name"]]
    assert a.dtype == kinds[t["dtype"]] == r.dtype, (t["name"], a.dtype, r.dtype)
    assert list(a.shape) == t["shape"] == list(r.shape), (t["name"], a.shape, r.shape)
    assert np.array_equal(a, r), t["name"]
    [s] = t["shards"]
    lo, hi = s["bytes"]
    assert zlib.crc32(raw[lo:hi]) == s["crc32"], t["name"]
    assert np.array_equal(np.frombuffer(raw[lo:hi], dtype=a.dtype).reshape(a.shape), a), t["name"]
print("python read", len(names), "tensors:", " ".join(names))
print("w1", state["0.w1"].shape, "t", int(state["1.t"]), "epoch", int(state["2"]))
"#;

/// A Python with `safetensors` and `numpy`, in a venv under `target/` made once, or why there
/// is none.
fn python_with_safetensors() -> Result<PathBuf, String> {
    let venv = Path::new(env!("CARGO_TARGET_TMPDIR")).join("ckpt-venv");
    let py = venv.join("bin/python");
    let usable = |py: &Path| {
        Command::new(py).args(["-c", "import safetensors.numpy, numpy"]).output().is_ok_and(|o| o.status.success())
    };
    if usable(&py) {
        return Ok(py);
    }
    let run = |c: &mut Command, what: &str| -> Result<(), String> {
        let o = c.output().map_err(|e| format!("{what}: {e}"))?;
        if o.status.success() {
            Ok(())
        } else {
            let err = text(&o.stderr);
            let tail: Vec<&str> = err.lines().rev().take(3).collect();
            Err(format!("{what} failed: {}", tail.into_iter().rev().collect::<Vec<_>>().join(" / ")))
        }
    };
    run(Command::new("python3").arg("--version"), "python3")?;
    let _ = std::fs::remove_dir_all(&venv);
    run(Command::new("python3").args(["-m", "venv"]).arg(&venv), "python3 -m venv")?;
    run(
        Command::new(&py).args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "safetensors",
            "numpy",
        ]),
        "pip install safetensors numpy",
    )?;
    if usable(&py) {
        Ok(py)
    } else {
        Err("safetensors was installed but does not import".to_string())
    }
}

#[test]
fn python_safetensors_reads_a_checkpoint() {
    let py = match python_with_safetensors() {
        Ok(py) => py,
        Err(why) => {
            eprintln!("SKIPPED python_safetensors_reads_a_checkpoint: {why}");
            return;
        }
    };
    let prog = format!(
        "{STATE}
fn main() {{
    let m = init(Mlp, seed: 3)
    let (m2, o2) = adam.step(m, m * 0.5, adam.init(m, lr: 0.01))
    let state = (m2, o2, 4, f64(arange(5)) / 3.0, arange(4) > 1)
    save(\"ckpt/\", state)
    save(\"ref.npz\", state)
}}
"
    );
    let dir = scratch("python", &[("save.msl", &prog), ("check.py", PY_CHECK)]);
    ok(&dir, &["run", "save.msl"]);
    let o = Command::new(&py).arg("check.py").current_dir(&dir).output().expect("run python");
    let out = text(&o.stdout);
    assert!(o.status.success(), "python check failed:\n{out}{}", text(&o.stderr));
    let names = "0.w1 0.b1 0.w2 0.b2 1.mu.w1 1.mu.b1 1.mu.w2 1.mu.b2 1.nu.w1 1.nu.b1 1.nu.w2 1.nu.b2 \
                 1.t 1.lr 1.b1 1.b2 1.eps 2 3 4";
    assert!(out.contains(&format!("python read 20 tensors: {names}\n")), "{out}");
    assert!(out.contains("w1 (8, 32) t 1 epoch 4"), "{out}");
    eprint!("{out}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A model whose fields are named as PyTorch names a module's parameters (`fc1.weight`, with
/// `nn.Linear`'s [out, in] weight), the program that saves it, and the one that loads a
/// `state_dict` saved by PyTorch; both save the model's output on the same input.
const TORCH_NET: &str = "
model Linear[I, O] {
    weight: f32[O, I] = glorot_uniform(O, I)
    bias: f32[O] = normal(O) * 0.1
}
model Net {
    fc1: Linear[4, 8]
    fc2: Linear[8, 3]
}
fn forward[N](m: Net, x: f32[N, 4]) -> f32[N, 3] {
    let h = relu(x @ transpose(m.fc1.weight) + m.fc1.bias)
    h @ transpose(m.fc2.weight) + m.fc2.bias
}
fn input() -> f32[2, 4] { reshape(f32(arange(8)), [2, 4]) / 8.0 }
";

const TORCH_SAVE: &str = "
fn main() {
    let m = init(Net, seed: 7)
    save(\"ckpt/\", m)
    save(\"msl_out.npy\", forward(m, input()))
}
";

const TORCH_LOAD: &str = "
fn main() {
    let m: Net = load(\"torch.safetensors\")
    save(\"msl_out2.npy\", forward(m, input()))
}
";

/// Run by a Python with PyTorch: msl's checkpoint is a `state_dict` that `load_state_dict`
/// takes strictly into the same network written with `torch.nn`, which then computes what msl
/// computed; then a PyTorch model's `state_dict` is saved for msl to load (`load.msl`), and
/// `--check` compares msl's output with PyTorch's.
const TORCH_CHECK: &str = r#"
import json, sys
import numpy as np
import torch, safetensors.torch

class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(4, 8)
        self.fc2 = torch.nn.Linear(8, 3)
    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))

x = torch.arange(8, dtype=torch.float32).reshape(2, 4) / 8
if sys.argv[1:] == ["--check"]:
    ours, theirs = np.load("msl_out2.npy"), np.load("torch_out.npy")
    assert np.allclose(ours, theirs, rtol=1e-5, atol=1e-6), (ours, theirs)
    print("msl computes what torch computes with its weights")
    sys.exit(0)
index = json.load(open("ckpt/index.json"))
[f] = index["files"]
state = safetensors.torch.load_file("ckpt/" + f["name"])
net = Net()
result = net.load_state_dict(state, strict=True)
assert not result.missing_keys and not result.unexpected_keys, result
with torch.no_grad():
    y = net(x).numpy()
ours = np.load("msl_out.npy")
assert np.allclose(y, ours, rtol=1e-5, atol=1e-6), (y, ours)
print("load_state_dict took", " ".join(state), "and torch computes what msl computed")
torch.manual_seed(0)
theirs = Net()
safetensors.torch.save_file(theirs.state_dict(), "torch.safetensors")
with torch.no_grad():
    np.save("torch_out.npy", theirs(x).numpy())
"#;

/// A Python that imports `torch` and `safetensors.torch`: `MSL_TORCH_PYTHON`, else `python3`;
/// or why there is none. PyTorch is not installed for the test: its PyPI wheel is a 3.5 GB
/// download (with its CUDA libraries), too much for every run of the suite.
fn python_with_torch() -> Result<PathBuf, String> {
    let py = std::env::var_os("MSL_TORCH_PYTHON").map_or_else(|| PathBuf::from("python3"), PathBuf::from);
    let o = Command::new(&py).args(["-c", "import torch, safetensors.torch, numpy"]).output();
    match o {
        Ok(o) if o.status.success() => Ok(py),
        _ => Err(format!(
            "{} cannot import torch, safetensors and numpy; set MSL_TORCH_PYTHON to a Python that can \
             (PyTorch's 3.5 GB wheel is not installed by the suite)",
            py.display()
        )),
    }
}

#[test]
fn pytorch_loads_a_checkpoint_as_a_state_dict() {
    let py = match python_with_torch() {
        Ok(py) => py,
        Err(why) => {
            eprintln!("SKIPPED pytorch_loads_a_checkpoint_as_a_state_dict: {why}");
            return;
        }
    };
    let save = format!("{TORCH_NET}{TORCH_SAVE}");
    let load = format!("{TORCH_NET}{TORCH_LOAD}");
    let dir = scratch("torch", &[("save.msl", &save), ("load.msl", &load), ("check.py", TORCH_CHECK)]);
    ok(&dir, &["run", "save.msl"]);
    let python = |args: &[&str]| {
        let o = Command::new(&py).args(args).current_dir(&dir).output().expect("run python");
        let out = text(&o.stdout);
        assert!(o.status.success(), "python {args:?} failed:\n{out}{}", text(&o.stderr));
        out
    };
    let out = python(&["check.py"]);
    assert!(out.contains("load_state_dict took fc1.weight fc1.bias fc2.weight fc2.bias and torch computes"), "{out}");
    ok(&dir, &["run", "load.msl"]);
    let out2 = python(&["check.py", "--check"]);
    assert!(out2.contains("msl computes what torch computes"), "{out2}");
    eprint!("{out}{out2}");
    let _ = std::fs::remove_dir_all(&dir);
}
