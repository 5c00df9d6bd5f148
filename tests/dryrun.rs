//! `msl dryrun FILE --devices N` (LANGUAGE.md §8 *DryRun*): per-rank bytes of parameters,
//! gradients and optimizer state computed by hand from the model's shapes, the run-time dims
//! read from file headers, the communication of the whole run against what the communicator
//! counts under `mpirun`, the bad inputs, and `--search`.

use std::path::{Path, PathBuf};
use std::process::Output;

mod common;
use common::{have_mpirun, mpirun, scratch, text};

fn msl(dir: &Path, args: &[&str]) -> Output {
    common::msl_in(dir, args)
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The `in bytes:` line's figure for `what`.
fn figure(out: &str, what: &str) -> u64 {
    let line = out.lines().find(|l| l.trim_start().starts_with("in bytes:")).unwrap_or_else(|| panic!("{out}"));
    let at = line.find(&format!("{what} ")).unwrap_or_else(|| panic!("{what} in {line}"));
    let rest = &line[at + what.len() + 1..];
    rest.split(|c: char| !c.is_ascii_digit()).next().and_then(|n| n.parse().ok()).unwrap_or_else(|| panic!("{line}"))
}

/// A `.npy` file of `rows × cols` little-endian f32 zeros (version 1.0).
fn npy(rows: usize, cols: usize) -> Vec<u8> {
    let mut header = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': ({rows}, {cols}), }}");
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut b = b"\x93NUMPY\x01\x00".to_vec();
    b.extend_from_slice(&(header.len() as u16).to_le_bytes());
    b.extend_from_slice(header.as_bytes());
    b.resize(b.len() + rows * cols * 4, 0);
    b
}

#[test]
fn the_parallel_mlp_per_rank() {
    let o = msl(&repo(), &["dryrun", "examples/parallel/train.msl", "--devices", "4"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}\n{err}");
    assert!(out.contains("mesh [dp = 2, mp = 2]"), "{out}");
    // The training set's rows come from its header; 20 epochs of ⌊1437 / 64⌋ batches.
    assert!(out.contains("N = 1437 (from the header of ../mlp/data/train_x.npy)"), "{out}");
    assert!(out.contains("value_and_grad(loss), 440 steps in the run"), "{out}");
    // Mlp[64, 128, 10] with `w1`, `b1` and `w2` split over mp = 2: a half of each, `b2` whole.
    let params = (64 * 128 / 2 + 128 / 2 + 128 / 2 * 10 + 10) * 4;
    assert_eq!(figure(&out, "parameters"), params, "{out}");
    assert_eq!(figure(&out, "gradients"), params, "{out}");
    // Adam's two moments, laid out like the parameters.
    assert_eq!(figure(&out, "optimizer"), 2 * params, "{out}");
    let peak = figure(&out, "peak");
    assert!(peak >= 4 * params + figure(&out, "activations"), "{out}");
    // The gradient all-reduce over dp of the replicated `b2`, and the partial sums over mp.
    assert!(out.contains("all_reduce_sum") && out.contains("over dp"), "{out}");
    assert!(out.contains("pipeline bubble: none"), "{out}");

    // On one rank's worth of layouts (mp = 1) every tensor is whole.
    let o = msl(&repo(), &["dryrun", "examples/parallel/train.msl", "--devices", "4", "--mesh", "dp=4,mp=1"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}\n{err}");
    let whole = (64 * 128 + 128 + 128 * 10 + 10) * 4;
    assert_eq!(figure(&out, "parameters"), whole, "{out}");
    assert_eq!(figure(&out, "optimizer"), 2 * whole, "{out}");
}

/// A run with no gradient (inference): the breakdown is at the call of `main` that needs the
/// most memory, its model counted as parameters even when the call is its last use.
#[test]
fn an_inference_run_counts_its_model_as_parameters() {
    let dir = scratch("dryrun", "inference", &[]);
    std::fs::write(
        dir.join("infer.msl"),
        r#"
mesh M[dp = 2, mp = 2]

model Mlp[I, H, O] {
    w1: f32[I, H @mp] = he_normal(I, H)
    w2: f32[H @mp, O] = he_normal(H, O)
}

fn forward[N, I, H, O](m: Mlp[I, H, O], x: f32[N @dp, I]) -> f32[N @dp, O] {
    relu(x @ m.w1) @ m.w2
}

fn main() {
    let m = init(Mlp[64, 256, 10], seed: 0)
    let x: f32[128 @dp, 64] = normal(128, 64, seed: 1)
    print(sum(forward(m, x)))
}
"#,
    )
    .unwrap();
    let o = msl(&dir, &["dryrun", "infer.msl", "--devices", "4"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}\n{err}");
    assert!(out.contains("training step: none"), "{out}");
    // Half of each weight per rank (mp = 2), half of the rows of x (dp = 2), and the callee's
    // two [64, 128] f32 intermediates.
    assert_eq!(figure(&out, "parameters"), (64 * 256 / 2 + 256 / 2 * 10) * 4, "{out}");
    assert_eq!(figure(&out, "data"), 64 * 64 * 4, "{out}");
    assert_eq!(figure(&out, "activations"), 2 * 64 * 128 * 4, "{out}");
    assert_eq!((figure(&out, "gradients"), figure(&out, "optimizer")), (0, 0), "{out}");
}

/// `offload: host` (alone, and with `shard: dp` over 2 ranks) takes Adam's two moments off the
/// device: the optimizer column is 0, the peak is lower by them, and a line gives their bytes
/// in host memory (the rank's pieces when sharded).
#[test]
fn an_offloaded_optimizer_state_is_in_host_memory() {
    let dir = scratch("dryrun", "offload", &[]);
    let src = |opt: &str| {
        format!(
            "use optim.adam\nmesh M[dp = 2]\nmodel Lin {{ w: f32[64, 32] = glorot_uniform(64, 32), b: f32[32] = zeros(32) }}\n\
             fn loss(m: Lin, x: f32[16 @dp, 64], y: f32[16 @dp, 32]) -> f32 {{ mean((x @ m.w + m.b - y) ** 2) }}\n\
             fn main() {{\n var m = init(Lin, seed: 0)\n var opt = adam.init(m, lr: 0.1{opt})\n\
             let x = normal(16, 64, seed: 1)\n let y = normal(16, 32, seed: 2)\n\
             for step in 0..3 {{\n let g = grad(loss)(m, x, y)\n (m, opt) = adam.step(m, g, opt)\n }}\n}}\n"
        )
    };
    let params = (64 * 32 + 32) * 4;
    for (opt, host) in [("", 0), (", offload: host", 2 * params), (", shard: dp, offload: host", params)] {
        std::fs::write(dir.join("o.msl"), src(opt)).unwrap();
        let o = msl(&dir, &["dryrun", "o.msl", "--devices", "2"]);
        let (out, err) = text(&o);
        assert!(o.status.success(), "{out}\n{err}");
        assert_eq!(figure(&out, "parameters"), params, "{out}");
        let line = out.lines().find(|l| l.contains("in host memory"));
        if host == 0 {
            assert_eq!(figure(&out, "optimizer"), 2 * params, "{out}");
            assert!(line.is_none(), "{out}");
        } else {
            assert_eq!(figure(&out, "optimizer"), 0, "{out}");
            assert!(line.is_some_and(|l| l.contains(&format!("({host} bytes)"))), "{opt}: {out}");
        }
    }
}

#[test]
fn a_program_without_a_mesh_is_one_device() {
    let o = msl(&repo(), &["dryrun", "examples/mlp/train.msl", "--devices", "1"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}\n{err}");
    assert!(out.contains("on 1 device (no mesh)"), "{out}");
    assert!(out.contains("communication per training step, from each rank:\n  none"), "{out}");
    assert!(figure(&out, "parameters") > 0 && figure(&out, "activations") > 0, "{out}");
}

#[test]
fn bad_requests_are_exit_2_with_a_reason() {
    let cases: [(&[&str], &str); 6] = [
        (&["dryrun", "examples/parallel/train.msl", "--devices", "8"], "the mesh has 4 devices (dp = 2, mp = 2)"),
        (&["dryrun", "examples/mlp/train.msl", "--devices", "2"], "declares no mesh"),
        (&["dryrun", "examples/parallel/train.msl", "--devices", "0"], "at least 1"),
        (&["dryrun", "examples/parallel/train.msl", "--devices", "4", "--memory", "lots"], "expected a size"),
        (&["dryrun", "examples/parallel/train.msl", "--devices", "4", "--memory", "1KiB"], "exceeds `--memory`"),
        // Batches of 64 rows do not split over dp = 3: the run would stop, so the dry run does.
        (
            &["dryrun", "examples/parallel/train.msl", "--devices", "6", "--mesh", "dp=3,mp=2"],
            "`N` is 64 in `value_and_grad(loss)`, which does not split into 3 equal blocks over dp = 3",
        ),
    ];
    for (args, why) in cases {
        let o = msl(&repo(), args);
        let (out, err) = text(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {out}\n{err}");
        assert!(err.contains(why), "{args:?}: {err}");
    }
    // A program that does not check is exit 1 with its diagnostics.
    let dir = scratch("dryrun", "bad", &[("bad.msl", "fn main() { let x = zeros(2, 3) @ zeros(4, 5) }\n")]);
    let o = msl(&dir, &["dryrun", "bad.msl", "--devices", "1"]);
    assert_eq!(o.status.code(), Some(1), "{:?}", text(&o));
    assert!(text(&o).1.contains("E0"), "{:?}", text(&o));
}

#[test]
fn search_proposes_mesh_sizes_as_a_patch() {
    let o = msl(&repo(), &["dryrun", "examples/parallel/train.msl", "--devices", "4", "--search"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}\n{err}");
    for sizes in ["[dp = 1, mp = 4]", "[dp = 2, mp = 2]", "[dp = 4, mp = 1]"] {
        assert!(out.contains(sizes), "{sizes}: {out}");
    }
    assert!(out.contains("proposed: [dp = "), "{out}");
    assert!(out.contains("-mesh M[dp = 2, mp = 2]\n+mesh M[dp = ") || out.contains("already has these sizes"), "{out}");
    let o = msl(&repo(), &["dryrun", "examples/parallel/train.msl", "--devices", "4", "--search", "--memory", "1KiB"]);
    assert_eq!(o.status.code(), Some(2), "{:?}", text(&o));
    assert!(
        text(&o).1.contains("no mesh sizes for 4 devices split every size of the program evenly and fit 1.0 KiB"),
        "{:?}",
        text(&o)
    );
}

const STEPS: &str = r#"use nn.{relu}
use optim.adam

mesh M[dp = 2, mp = 2]

model Mlp[I, H, O] {
    w1: f32[I, H @mp] = he_normal(I, H)
    b1: f32[H @mp]    = zeros(H)
    w2: f32[H @mp, O] = he_normal(H, O)
    b2: f32[O]        = zeros(O)
}

fn loss[N, I, H, O](m: Mlp[I, H, O], x: f32[N @dp, I], y: f32[N @dp, O]) -> f32 {
    let d = relu(x @ m.w1 + m.b1) @ m.w2 + m.b2 - y
    mean(d * d)
}

fn main() {
    let x: f32[N, 8] = load("x.npy")
    let y: f32[N, 4] = load("y.npy")
    var m = init(Mlp[8, 16, 4], seed: 0)
    var opt = adam.init(m, lr: 0.01)
    for epoch in 0..3 {
        for (xb, yb) in batches(x, y, size: 8) {
            let (l, g) = value_and_grad(loss)(m, xb, yb)
            (m, opt) = adam.step(m, g, opt)
        }
        print(epoch, sum(m.w1))
    }
}
"#;

/// `(calls, bytes)` of a `total` line of the section that starts with `head`.
fn total(out: &str, head: &str) -> (u64, u64) {
    let section = &out[out.find(head).unwrap_or_else(|| panic!("{head}: {out}"))..];
    let line = section.lines().find(|l| l.trim_start().starts_with("total")).unwrap_or_else(|| panic!("{out}"));
    let f: Vec<&str> = line.split_whitespace().collect();
    (f[1].parse().unwrap_or(0), f[3].parse().unwrap_or(0))
}

#[test]
fn predicted_traffic_equals_what_the_communicator_counts() {
    let dir = scratch("dryrun", "steps", &[("steps.msl", STEPS)]);
    std::fs::write(dir.join("x.npy"), npy(42, 8)).expect("write x.npy");
    std::fs::write(dir.join("y.npy"), npy(42, 4)).expect("write y.npy");
    let o = msl(&dir, &["dryrun", "steps.msl", "--devices", "4"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}\n{err}");
    assert!(out.contains("N = 42 (from the header of x.npy)"), "{out}");
    // ⌊42 / 8⌋ = 5 batches in each of 3 epochs.
    assert!(out.contains("15 steps in the run"), "{out}");
    let step = total(&out, "communication per training step");
    let run = total(&out, "communication in the whole run");
    assert!(step.0 > 0 && run.0 >= 15 * step.0 && run.1 >= 15 * step.1, "{out}");
    if !have_mpirun("predicted_traffic_equals_what_the_communicator_counts") {
        return;
    }
    let o = mpirun(&dir, 4, &["run", "--comm-report", "steps.msl"]);
    let (_, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let line = err.lines().find(|l| l.starts_with("collectives run by rank 0:")).unwrap_or_else(|| panic!("{err}"));
    let f: Vec<&str> = line.split_whitespace().collect();
    let counted: (u64, u64) = (f[5].parse().unwrap_or(0), f[7].parse().unwrap_or(0));
    assert_eq!(counted, run, "predicted {run:?} for the run, counted {counted:?}:\n{out}\n{err}");
}

/// The `memory: peak heap during the run` figure of `--explain`, in bytes.
fn measured_heap(err: &str) -> f64 {
    let line =
        err.lines().find(|l| l.starts_with("memory: peak heap during the run")).unwrap_or_else(|| panic!("{err}"));
    let f: Vec<&str> = line.split_whitespace().collect();
    let v: f64 = f[f.len() - 2].parse().unwrap_or_else(|_| panic!("{line}"));
    v * match f[f.len() - 1] {
        "KiB" => 1024.0,
        "MiB" => 1024.0 * 1024.0,
        "GiB" => 1024.0 * 1024.0 * 1024.0,
        _ => 1.0,
    }
}

#[test]
fn the_predicted_peak_is_near_the_measured_heap_peak() {
    // The program above with tensors large enough to dominate the process's own heap.
    let big = STEPS
        .replace("Mlp[8, 16, 4]", "Mlp[512, 2048, 64]")
        .replace("f32[N, 8]", "f32[N, 512]")
        .replace("f32[N, 4]", "f32[N, 64]")
        .replace("size: 8", "size: 512")
        .replace("0..3", "0..1");
    let dir = scratch("dryrun", "big", &[("big.msl", &big)]);
    std::fs::write(dir.join("x.npy"), npy(4096, 512)).expect("write x.npy");
    std::fs::write(dir.join("y.npy"), npy(4096, 64)).expect("write y.npy");
    let o = msl(&dir, &["dryrun", "big.msl", "--devices", "1", "--mesh", "dp=1,mp=1"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}\n{err}");
    let predicted = figure(&out, "peak") as f64;
    let o = msl(&dir, &["run", "--mode", "jit", "-O2", "--explain", "big.msl"]);
    let (_, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let measured = measured_heap(&err);
    let ratio = predicted / measured;
    assert!((0.8..=1.2).contains(&ratio), "predicted {predicted} bytes, measured {measured}:\n{out}");
}
