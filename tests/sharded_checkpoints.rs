//! Sharded checkpoints under `mpirun` (LANGUAGE.md §9): every rank writes its blocks, the index
//! names the mesh and the layouts, a checkpoint loads under any other mesh (2×2 → 1, 2×1, 4×1),
//! the same state gives the same bytes, a resumed run prints exactly what the uninterrupted run
//! prints, and a rank killed mid-training leaves the last complete checkpoint to resume from.
//! Skipped with a message where `mpirun` is absent (scripts/setup.sh installs Open MPI).

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{have_mpirun, mpirun, msl_in, same_up_to_rounding, scratch, text};

/// A small sharded training loop that resumes from `ck/` and saves after every epoch; `EPOCHS`
/// is replaced by the number of epochs to reach.
const TRAIN: &str = r#"use nn
use optim.adam

mesh M[dp = 2, mp = 2]

model Mlp {
    w1: f32[4, 8 @mp] = he_normal(4, 8)
    b1: f32[8 @mp] = zeros(8)
    w2: f32[8 @mp, 3] = he_normal(8, 3)
    b2: f32[3] = zeros(3)
}

fn loss(m: Mlp, x: f32[16 @dp, 4], y: i32[16 @dp]) -> f32 {
    mean(nn.cross_entropy(relu(x @ m.w1 + m.b1) @ m.w2 + m.b2, y))
}

fn main() {
    let x = normal(16, 4, seed: 2)
    let y = i32(floor(uniform(16, seed: 3) * 2.99))
    var m = init(Mlp, seed: 1)
    var opt = adam.init(m, lr: 0.05)
    var start = 0
    if exists("ck/") {
        let s: (Mlp, adam.AdamState[Mlp], i32) = load("ck/")
        (m, opt, start) = s
    }
    for epoch in start..EPOCHS {
        let (l, g) = value_and_grad(loss)(m, x, y)
        (m, opt) = adam.step(m, g, opt)
        save("ck/", (m, opt, epoch + 1))
        print(epoch, l)
    }
    print(m.w1)
}
"#;

fn train(epochs: usize) -> String {
    TRAIN.replace("EPOCHS", &epochs.to_string())
}

/// Runs `train.msl` with `epochs` in `dir`: on `ranks` processes under `mpirun` (with `mesh`
/// sizes if given), or on one process for 1.
fn run(dir: &Path, epochs: usize, ranks: usize, mesh: Option<&str>) -> String {
    std::fs::write(dir.join("train.msl"), train(epochs)).unwrap();
    let mut args = vec!["run"];
    if let Some(m) = mesh {
        args.extend(["--mesh", m]);
    }
    args.push("train.msl");
    let o = if ranks == 1 { msl_in(dir, &args) } else { mpirun(dir, ranks, &args) };
    let (out, err) = text(&o);
    assert!(o.status.success(), "{epochs} epochs on {ranks} ranks: {err}");
    out
}

/// The files of a checkpoint folder, by name.
fn files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .map(|e| (e.file_name().to_string_lossy().into_owned(), std::fs::read(e.path()).unwrap()))
        .collect();
    v.sort();
    v
}

#[test]
fn sharded_checkpoints_reshard_and_resume_exactly() {
    if !have_mpirun("sharded_checkpoints_reshard_and_resume_exactly") {
        return;
    }
    let full = run(&scratch("ckpt", "full", &[]), 6, 4, None);
    let tail: Vec<&str> = full.lines().skip(3).collect();
    // Stopped after 3 epochs, then rerun on the same mesh: exactly the uninterrupted lines.
    let dir = scratch("ckpt", "resume", &[]);
    let first = run(&dir, 3, 4, None);
    assert_eq!(first.lines().take(3).collect::<Vec<_>>(), full.lines().take(3).collect::<Vec<_>>());
    let index = std::fs::read_to_string(dir.join("ck/index.json")).unwrap();
    assert!(index.contains(r#""mesh": [{"name":"dp","size":2},{"name":"mp","size":2}]"#), "{index}");
    assert!(index.contains(r#""layout":[[],["mp"]]"#), "w1 is split by columns: {index}");
    let data: Vec<String> =
        files(&dir.join("ck")).into_iter().map(|f| f.0).filter(|n| n.ends_with(".safetensors")).collect();
    // The state is split over `mp` and replicated over `dp`: the ranks at `dp` index 0 write it.
    assert!(data.len() == 2 && data[0].starts_with("rank0.") && data[1].starts_with("rank1."), "{data:?}");
    let saved = files(&dir.join("ck"));
    let rest = run(&dir, 6, 4, None);
    assert_eq!(rest.lines().collect::<Vec<_>>(), tail, "resumed on 2×2");
    // The same state gives the same bytes.
    let again = scratch("ckpt", "again", &[]);
    run(&again, 3, 4, None);
    assert!(files(&again.join("ck")) == saved, "a second save of the same state wrote other bytes");
    // Resumed under other meshes (resharding): equal up to reduction order.
    for (ranks, mesh) in [(1, None), (2, Some("dp=2,mp=1")), (4, Some("dp=4,mp=1")), (2, Some("dp=1,mp=2"))] {
        let dir = scratch("ckpt", "reshard", &[]);
        run(&dir, 3, 4, None);
        let rest = run(&dir, 6, ranks, mesh);
        let got: Vec<&str> = rest.lines().collect();
        assert_eq!(got.len(), tail.len(), "{ranks} ranks {mesh:?}: {rest}");
        for (a, b) in got.iter().zip(&tail) {
            assert!(same_up_to_rounding(a, b), "resumed on {ranks} ranks {mesh:?}: {a} vs {b}");
        }
    }
}

#[test]
fn a_rank_killed_mid_training_resumes_from_the_last_checkpoint() {
    if !have_mpirun("a_rank_killed_mid_training_resumes_from_the_last_checkpoint") {
        return;
    }
    const EPOCHS: usize = 300;
    let uninterrupted = run(&scratch("ckpt", "kill-ref", &[]), EPOCHS, 4, None);
    let dir = scratch("ckpt", "kill", &[]);
    std::fs::write(dir.join("train.msl"), train(EPOCHS)).unwrap();
    let mut launch = Command::new("mpirun");
    let _session = common::Session::new(&mut launch);
    let mut job = launch
        .args(["-n", "4", "--oversubscribe", "--mca", "orte_abort_on_non_zero_status", "1"])
        .arg(env!("CARGO_BIN_EXE_msl"))
        .args(["run", "train.msl"])
        .current_dir(&dir)
        .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
        .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start mpirun");
    // Once a checkpoint is complete, kill one rank (a process of this file not named mpirun).
    let start = Instant::now();
    while !dir.join("ck/index.json").exists() {
        assert!(start.elapsed() < Duration::from_secs(60), "no checkpoint was written");
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = Command::new("pgrep").args(["-f", "run train.msl"]).output().expect("pgrep");
    let here = dir.canonicalize().unwrap();
    let victim =
        String::from_utf8_lossy(&out.stdout).split_whitespace().filter_map(|p| p.parse::<u32>().ok()).find(|p| {
            let cmd = std::fs::read_to_string(format!("/proc/{p}/cmdline")).unwrap_or_default();
            let cwd = std::fs::read_link(format!("/proc/{p}/cwd")).ok();
            !cmd.starts_with("mpirun") && cwd.as_deref() == Some(here.as_path())
        });
    let Some(victim) = victim else {
        // The job ended before a rank could be killed: nothing left to test on this machine.
        let _ = job.wait();
        println!("the training finished before a rank could be killed");
        return;
    };
    let _ = Command::new("kill").args(["-9", &victim.to_string()]).status();
    let t = Instant::now();
    let status = loop {
        if let Some(s) = job.try_wait().expect("wait") {
            break s;
        }
        assert!(t.elapsed() < Duration::from_secs(30), "the job hung after a rank was killed");
        std::thread::sleep(Duration::from_millis(50));
    };
    let finished = status.success();
    if finished {
        println!("the training finished before the kill took effect");
    }
    // Rerun: it resumes from the last complete checkpoint and ends with the same model.
    let rest = run(&dir, EPOCHS, 4, None);
    assert_eq!(rest.lines().last(), uninterrupted.lines().last(), "the final model differs after the resume");
    let resumed_from: usize =
        rest.lines().next().and_then(|l| l.split_whitespace().next()).and_then(|e| e.parse().ok()).unwrap_or(0);
    assert!(finished || resumed_from > 0, "the rerun started over instead of resuming:\n{rest}");
}
