//! Sharded programs on many processes (LANGUAGE.md §8 *Running*): `msl run --ranks N` and
//! `mpirun -n N msl run` print what one process prints; a job whose size differs from the mesh,
//! a size that does not split, a failing or killed rank all end the job with a message, never a
//! hang; `--mesh` and `msl check --emit collectives`. Every test that needs `mpirun` says so and
//! returns where it is absent (scripts/setup.sh installs Open MPI).

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{have_mpirun, mpirun, mpirun_with, same_up_to_rounding, text};

fn msl(dir: &Path, args: &[&str]) -> Output {
    common::msl_in(dir, args)
}

const MLP: &str = r#"use nn

mesh M[dp = 2, mp = 2]

model Mlp[I, H, O] {
    w1: f32[I, H @mp] = he_normal(I, H)
    b1: f32[H @mp]    = zeros(H)
    w2: f32[H @mp, O] = he_normal(H, O)
    b2: f32[O]        = zeros(O)
}

fn loss[N, I, H, O](m: Mlp[I, H, O], x: f32[N @dp, I], y: i32[N @dp]) -> f32 {
    let h = relu(x @ m.w1 + m.b1)
    mean(nn.cross_entropy(h @ m.w2 + m.b2, y))
}

fn main() {
    var m = init(Mlp[4, 8, 3], seed: 1)
    let x = normal(16, 4, seed: 2)
    let y = i32(floor(uniform(16, seed: 3) * 2.99))
    for step in 0..4 {
        let (l, g) = value_and_grad(loss)(m, x, y)
        m = m - 0.5 * g
        print(step, l)
    }
    print(m.w1)
}
"#;

fn scratch(name: &str, files: &[(&str, &str)]) -> PathBuf {
    common::scratch("mpi", name, files)
}

#[test]
fn four_ranks_print_what_one_process_prints_in_every_engine() {
    if !have_mpirun("four_ranks_print_what_one_process_prints_in_every_engine") {
        return;
    }
    let dir = scratch("mlp", &[("mlp.msl", MLP)]);
    let one = msl(&dir, &["run", "mlp.msl"]);
    assert!(one.status.success(), "{:?}", text(&one));
    let (want, _) = text(&one);
    assert_eq!(want.lines().count(), 5);
    for engine in [&["run", "--ranks", "4", "mlp.msl"][..], &["run", "--ranks", "4", "--mode", "jit", "-O2", "mlp.msl"]]
    {
        let four = msl(&dir, engine);
        let (got, err) = text(&four);
        assert!(four.status.success(), "{engine:?}: {err}");
        assert!(same_up_to_rounding(&got, &want), "{engine:?}\none process:\n{want}\nfour ranks:\n{got}");
        assert!(!err.contains("W0510"), "the contract's MLP needs no unrequested redistribution: {err}");
    }
    // `mpirun` started by hand gives the same.
    let (got, err) = text(&mpirun(&dir, 4, &["run", "mlp.msl"]));
    assert!(same_up_to_rounding(&got, &want), "{got}\n{err}");
}

#[test]
fn a_job_whose_size_differs_from_the_mesh_stops_before_any_work() {
    if !have_mpirun("a_job_whose_size_differs_from_the_mesh_stops_before_any_work") {
        return;
    }
    let dir = scratch("size", &[("mlp.msl", MLP)]);
    let o = msl(&dir, &["run", "--ranks", "2", "mlp.msl"]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(out.is_empty(), "no work may run: {out}");
    assert!(err.contains("the mesh has 4 devices (dp = 2, mp = 2) but this job has 2 processes"), "{err}");
    // `--mesh` makes the same file fit two ranks, and prints what one process prints.
    let two = msl(&dir, &["run", "--ranks", "2", "--mesh", "dp=2,mp=1", "mlp.msl"]);
    let (got, err) = text(&two);
    assert!(two.status.success(), "{err}");
    let (want, _) = text(&msl(&dir, &["run", "mlp.msl"]));
    assert!(same_up_to_rounding(&got, &want), "{got}\n{want}");
}

#[test]
fn a_failing_rank_names_itself_and_ends_the_job() {
    if !have_mpirun("a_failing_rank_names_itself_and_ends_the_job") {
        return;
    }
    // Five rows do not split over two ranks: found where the size is bound.
    let prog = "mesh M[dp = 2]\nfn main() {\n    let x: f32[N @dp] = load(\"x.csv\")\n    print(sum(x))\n}\n";
    let dir = scratch("fail", &[("bad.msl", prog), ("x.csv", "1\n2\n3\n4\n5\n")]);
    let t = Instant::now();
    let o = msl(&dir, &["run", "--ranks", "2", "bad.msl"]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("does not split evenly over `dp` (2 parts)") && err.contains("rank "), "{err}");
    assert!(t.elapsed() < Duration::from_secs(30));
    // A reshape into heads whose count, known only at run time, does not split over `mp`.
    let prog = "mesh M[mp = 2]\nfn split[B, D, H](a: f32[B, D @mp], k: f32[H]) -> f32 {\n    \
                sum(reshape(a, [B, H, D / H]) * 2.0)\n}\nfn main() {\n    print(split(ones(2, 12), ones(3)))\n}\n";
    let dir = scratch("fail-reshape", &[("bad.msl", prog)]);
    assert_eq!(text(&msl(&dir, &["run", "bad.msl"])).0.trim(), "48.0", "one process");
    let o = msl(&dir, &["run", "--ranks", "2", "bad.msl"]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("reshape: dim 1 of the result, of size 3, does not split evenly over `mp` (2 parts)"),
        "{err}"
    );
}

#[test]
fn a_killed_rank_ends_the_job_within_seconds() {
    if !have_mpirun("a_killed_rank_ends_the_job_within_seconds") {
        return;
    }
    let prog = "mesh M[dp = 2]\nfn f[N](x: f32[N @dp]) -> f32 { sum(x) }\nfn main() {\n    var t = 0.0\n    \
                for i in 0..100000000 { t = t + f(ones(8)) }\n    print(t)\n}\n";
    let dir = scratch("kill", &[("long.msl", prog)]);
    let mut child = Command::new(env!("CARGO_BIN_EXE_msl"))
        .args(["run", "--ranks", "2", "long.msl"])
        .current_dir(&dir)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start");
    // Find a rank: a process running this file whose parent is `mpirun`.
    let start = Instant::now();
    let victim = loop {
        let out = Command::new("pgrep").args(["-f", "long.msl"]).output().expect("pgrep");
        let pids: Vec<u32> =
            String::from_utf8_lossy(&out.stdout).split_whitespace().filter_map(|p| p.parse().ok()).collect();
        // Only this test's ranks: another test (or another checkout's) may run a `long.msl` too.
        let here = dir.canonicalize().expect("scratch dir");
        let ranks: Vec<u32> = pids
            .into_iter()
            .filter(|p| {
                let stat = std::fs::read_to_string(format!("/proc/{p}/cmdline")).unwrap_or_default();
                let cwd = std::fs::read_link(format!("/proc/{p}/cwd")).ok();
                !stat.contains("--ranks") && !stat.starts_with("mpirun") && cwd.as_deref() == Some(here.as_path())
            })
            .collect();
        if ranks.len() >= 2 {
            break ranks[1];
        }
        assert!(start.elapsed() < Duration::from_secs(20), "the ranks never started");
        std::thread::sleep(Duration::from_millis(100));
    };
    std::thread::sleep(Duration::from_millis(500));
    let _ = Command::new("kill").args(["-9", &victim.to_string()]).status();
    let t = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            assert!(!status.success(), "a killed rank must fail the job");
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(20), "the job hung after a rank was killed");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A row-parallel layer with a bias and an activation, wanted split over the axis its product
/// was summed over (spec/sharding.md).
const ROW_PARALLEL: &str = "mesh M[dp = 2, mp = 2]

fn row_parallel[N, D](h: f32[N, D @mp], w: f32[D @mp, 4], b: f32[4], c: f32[1]) -> f32[N, 4] {
    let y: f32[N, 4 @mp] = relu(h @ w + b) * c
    y
}

fn main() {
    print(row_parallel(ones(6, 4), ones(4, 4), ones(4), ones(1)))
}
";

#[test]
fn a_function_of_a_partial_sum_wanted_split_is_reduce_scattered() {
    let dir = scratch("row_parallel", &[("rp.msl", ROW_PARALLEL)]);
    let o = msl(&dir, &["check", "--emit", "collectives", "rp.msl"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(out.contains("4:33  reduce_scatter  over mp  f32[N, 4]"), "{out}");
    assert!(!out.contains("all_reduce_sum"), "the partial sum is not all-reduced as well: {out}");
}

/// A primitive working along a split dim gathers it, and `W0510` says why (no launcher needed).
#[test]
fn a_gather_for_a_dim_worked_along_says_so() {
    let src = "mesh M[dp = 2]

fn f[N, D](x: f32[N, D @dp], y: f32[N @dp, D]) -> (f32[N, D], f32[N, D], f32[N, D]) {
    (cumsum(x, axis: 1), softmax(x), x + y)
}

fn main() {
    print(f(ones(4, 6), ones(4, 6)))
}
";
    let dir = scratch("along_gather", &[("a.msl", src)]);
    let o = msl(&dir, &["check", "--emit", "collectives", "a.msl"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("`cumsum` works along dim 1, so that dim is gathered whole"), "{err}");
    assert!(err.contains("`softmax` works along dim 1, so that dim is gathered whole"), "{err}");
    assert!(err.contains("the operands' layouts disagree"), "`+` of two layouts: {err}");
    assert_eq!(out.matches("(W0510: not asked for by an annotation)").count(), 3, "{out}");
    // Each once, though two copies of `f` (layout-generic and for `main`'s call) insert them.
    assert_eq!(err.matches("W0510").count(), 3, "{err}");
}

#[test]
fn mesh_flags_and_the_collectives_listing() {
    let dir = scratch("flags", &[("mlp.msl", MLP)]);
    let o = msl(&dir, &["check", "--emit", "collectives", "mlp.msl"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(out.contains("collectives on mesh [dp = 2, mp = 2]"), "{out}");
    assert!(out.contains("all_reduce_sum  over mp  f32[N, O]"), "the row-parallel partial sum: {out}");
    assert!(out.contains("all_reduce_sum  over dp  f32[I, H]"), "the data-parallel gradient of w1: {out}");
    // A `--mesh` axis the file lacks, and a malformed one.
    let o = msl(&dir, &["check", "--mesh", "tp=2", "mlp.msl"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o).1.contains("`--mesh` names axis `tp`, which mesh `M` does not declare"), "{:?}", text(&o));
    let o = msl(&dir, &["run", "--mesh", "dp=two", "mlp.msl"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).1.contains("must be a positive integer"));
    let o = msl(&dir, &["run", "--mesh", "dp=2,dp=4", "mlp.msl"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).1.contains("axis `dp` is given twice"), "{:?}", text(&o));
    // Sizes whose product overflows are a diagnostic, never a crash.
    let o = msl(&dir, &["check", "--mesh", "dp=4611686018427387904,mp=4", "mlp.msl"]);
    assert_eq!(o.status.code(), Some(1), "{:?}", text(&o));
    assert!(text(&o).1.contains("more devices than msl can number"), "{:?}", text(&o));
    // `--mesh` sizes that do not divide a static dim.
    let o = msl(&dir, &["check", "--mesh", "dp=2,mp=3", "mlp.msl"]);
    assert!(o.status.success(), "the MLP's dims are generic: {:?}", text(&o));
    // Without a launcher a mesh runs on one process, every layout whole.
    let o = msl(&dir, &["run", "mlp.msl"]);
    assert!(o.status.success());
}

/// A training step with every dim static, so that `--emit collectives` predicts each site's
/// bytes as a number: a column-parallel product, a row-parallel one whose partial sums are
/// reduce-scattered, an all-to-all, and the data-parallel gradient all-reduces.
const STATIC_STEP: &str = r#"mesh M[dp = 2, mp = 2]

model Mlp {
    w1: f32[4, 8 @mp] = he_normal(4, 8)
    w2: f32[8 @mp, 6] = he_normal(8, 6)
}

fn loss(m: Mlp, x: f32[16 @dp, 4]) -> f32 {
    let h = relu(x @ m.w1)
    let s: f32[16 @dp, 6 @mp] = h @ m.w2
    let t: f32[16 @mp, 6] = s
    mean(tanh(s)) + 0.01 * mean(t * t)
}

fn main() {
    var m = init(Mlp, seed: 1)
    let x = normal(16, 4, seed: 2)
    for step in 0..2 {
        let (l, g) = value_and_grad(loss)(m, x)
        m = m - 0.5 * g
        print(step, l)
    }
}
"#;

/// Collective number → bytes per rank per call, from `--emit collectives` (numeric sizes only).
fn predicted(out: &str) -> std::collections::HashMap<String, (String, u64)> {
    let mut m = std::collections::HashMap::new();
    for line in out.lines().filter(|l| l.starts_with("  #")) {
        let f: Vec<&str> = line.split_whitespace().collect();
        let Some(i) = f.iter().position(|w| *w == "bytes") else { continue };
        if let Ok(b) = f[i - 1].parse::<u64>() {
            // `#3,#11`: the same collective at the same place, in a function and its derivative.
            for site in f[0].split(',') {
                m.insert(site.to_string(), (f[2].to_string(), b));
            }
        }
    }
    m
}

/// Collective number → (kind, calls, bytes per call), from `msl run --comm-report` on stderr.
fn measured(err: &str) -> std::collections::HashMap<String, (String, u64, u64)> {
    let mut m = std::collections::HashMap::new();
    for line in err.lines().filter(|l| l.starts_with("  #") && l.contains("bytes per call")) {
        let f: Vec<&str> = line.split_whitespace().collect();
        let calls = f[3].parse().unwrap_or(0);
        let per = f[5].parse().unwrap_or(u64::MAX);
        m.insert(f[0].to_string(), (f[2].to_string(), calls, per));
    }
    m
}

#[test]
fn bytes_counted_at_run_time_equal_the_predicted_bytes() {
    if !have_mpirun("bytes_counted_at_run_time_equal_the_predicted_bytes") {
        return;
    }
    let dir = scratch("bytes", &[("step.msl", STATIC_STEP)]);
    let o = msl(&dir, &["check", "--emit", "collectives", "step.msl"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let want = predicted(&out);
    for kind in ["reduce_scatter", "all_to_all", "all_reduce_sum", "all_reduce_mean"] {
        assert!(want.values().any(|(k, _)| k == kind), "a {kind} is predicted: {out}");
    }
    let one = msl(&dir, &["run", "step.msl"]);
    for args in
        [&["run", "--comm-report", "step.msl"][..], &["run", "--mode", "jit", "-O2", "--comm-report", "step.msl"]]
    {
        let o = mpirun(&dir, 4, args);
        let (got_out, err) = text(&o);
        assert!(o.status.success(), "{args:?}: {err}");
        assert!(same_up_to_rounding(&text(&one).0, &got_out), "{args:?}: {got_out}");
        let got = measured(&err);
        assert!(got.len() >= 6, "{args:?}: {err}");
        for (site, (kind, calls, per)) in &got {
            let Some((k, p)) = want.get(site) else {
                panic!("{args:?}: {site} ran but was not predicted:\n{out}\n{err}")
            };
            assert_eq!(kind, k, "{args:?}: {site}");
            assert_eq!(per, p, "{args:?}: {site} sent {per} bytes per call, predicted {p}:\n{out}\n{err}");
            assert_eq!(*calls, 2, "{args:?}: {site} runs once per step: {err}");
        }
        for kind in ["reduce_scatter", "all_to_all"] {
            assert!(got.values().any(|(k, _, _)| k == kind), "{args:?}: a {kind} ran: {err}");
        }
    }
    // `--explain`'s memory plans are per rank, printed once: `w1` (4 × 8 f32, split over `mp`)
    // is 64 bytes per rank against 128 on one process.
    let w1 = "memory plan of `Mlp.w1`: 1 tensor value in 1 buffer (0 reuse a dead value's buffer); peak 1 buffer =";
    let (_, err) = text(&msl(&dir, &["run", "--mode", "jit", "-O2", "--explain", "step.msl"]));
    assert!(err.contains(&format!("{w1} 128 bytes")), "{err}");
    let (_, err) = text(&mpirun(&dir, 4, &["run", "--mode", "jit", "-O2", "--explain", "step.msl"]));
    assert_eq!(err.matches("memory plans per rank").count(), 1, "{err}");
    assert!(err.contains(&format!("{w1} 64 bytes")), "{err}");
}

#[path = "common/shardgen.rs"]
mod shardgen;

/// Random sharded programs (`common/shardgen.rs`: random layouts on parameters and `let`s over
/// every propagation rule) print on four ranks what they print on one, values and gradients, in
/// the interpreter and at `-O2`.
#[test]
fn random_sharded_programs_print_what_one_process_prints() {
    if !have_mpirun("random_sharded_programs_print_what_one_process_prints") {
        return;
    }
    for (seed, engine) in [(1u64, &["run"][..]), (2, &["run", "--mode", "jit", "-O2"][..])] {
        let src = shardgen::program(seed, 24);
        let dir = scratch(&format!("gen{seed}"), &[("gen.msl", &src)]);
        let mut args = engine.to_vec();
        args.push("gen.msl");
        let one = msl(&dir, &args);
        let (one_out, err) = text(&one);
        assert!(one.status.success(), "seed {seed} on one process:\n{src}\n{err}");
        let four = mpirun(&dir, 4, &args);
        let (four_out, err) = text(&four);
        assert!(four.status.success(), "seed {seed} on four ranks:\n{src}\n{err}");
        for (a, b) in one_out.lines().zip(four_out.lines()) {
            assert!(same_up_to_rounding(a, b), "seed {seed}: one process printed\n{a}\nfour ranks\n{b}\nin\n{src}");
        }
        assert_eq!(one_out.lines().count(), four_out.lines().count(), "seed {seed}");
    }
}

/// The sharding pass on many random sharded programs (no launcher needed: `--emit collectives`
/// runs it): every one is partitioned without a crash and lists its collectives.
#[test]
fn the_sharding_pass_partitions_random_programs() {
    let dir = scratch("gen-many", &[]);
    for seed in 100..160u64 {
        std::fs::write(dir.join("gen.msl"), shardgen::program(seed, 12)).unwrap();
        let o = msl(&dir, &["check", "--emit", "collectives", "gen.msl"]);
        let (out, err) = text(&o);
        assert!(o.status.success(), "seed {seed}:\n{err}");
        assert!(out.contains("collectives on mesh [dp = 2, mp = 2]"), "seed {seed}: {out}");
    }
}

/// The events of the trace `t.json` that a run in `dir` wrote.
fn trace_events(dir: &Path) -> Vec<serde_json::Value> {
    let doc: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("t.json")).expect("the trace")).expect("JSON");
    doc["traceEvents"].as_array().expect("traceEvents").clone()
}

#[test]
fn a_trace_of_two_ranks_holds_both_and_their_collectives() {
    if !have_mpirun("a_trace_of_two_ranks_holds_both_and_their_collectives") {
        return;
    }
    let src = MLP.replace("mesh M[dp = 2, mp = 2]", "mesh M[dp = 2]").replace(" @mp", "");
    let dir = scratch("trace", &[("mlp.msl", &src)]);
    let o = mpirun(&dir, 2, &["run", "--trace", "t.json", "mlp.msl"]);
    assert!(o.status.success(), "{:?}", text(&o));
    let events = trace_events(&dir);
    for rank in 0..2 {
        let mine: Vec<&serde_json::Value> = events.iter().filter(|e| e["pid"] == rank).collect();
        assert!(mine.iter().any(|e| e["ph"] == "M" && e["args"]["name"] == format!("rank {rank}")), "rank {rank}");
        let reduces: Vec<&&serde_json::Value> = mine
            .iter()
            .filter(|e| (e["cat"] == "collective" || e["cat"] == "deferred") && e["name"] == "all_reduce_sum")
            .collect();
        // The gradient all-reduce of w1 (4 × 8 f32) in each of the 4 steps: started without
        // waiting (the rest of the backward pass runs meanwhile), on the communication track.
        let w1: Vec<_> =
            reduces.iter().filter(|e| e["args"]["bytes"] == 128 && e["args"]["shape"] == "f32[4, 8]").collect();
        assert_eq!(w1.len(), 4, "rank {rank}: {reduces:?}");
        assert!(w1.iter().all(|e| e["cat"] == "deferred" && e["tid"] == 1), "rank {rank}: {w1:?}");
        assert!(
            mine.iter().any(|e| e["ph"] == "M" && e["tid"] == 1 && e["args"]["name"] == "communication"),
            "rank {rank}"
        );
        assert!(mine.iter().any(|e| e["cat"] == "kernel" && e["name"] == "matmul"), "rank {rank}");
    }
}

/// A stack of eight layers over `pp`, trained as a pipeline.
const PIPE: &str = r#"mesh M[pp = 4]

model Block[D] {
    w: f32[D, D] = glorot_uniform(D, D)
    b: f32[D]    = normal(D) * 0.1
}

model Net[D, L] {
    inp: f32[D, D] = glorot_uniform(D, D)
    layers: [Block[D]; L @pp]
    head: f32[D] = ones(D)
}

@pipeline(microbatches: 4, schedule: "1f1b")
fn loss[N, D, L](m: Net[D, L], x: f32[N, D], y: f32[N]) -> f32 {
    var h = x @ m.inp
    for l in 0..L {
        h = tanh(h @ m.layers[l].w + m.layers[l].b)
    }
    mean((h @ m.head - y) ** 2)
}

fn main() {
    var m = init(Net[4, 8], seed: 0)
    let x = normal(8, 4, seed: 1)
    let y = normal(8, seed: 2)
    for step in 0..3 {
        let (l, g) = value_and_grad(loss)(m, x, y)
        print(step, l)
        m = m - 0.1 * g
    }
    print(sum(m.layers.w), loss(m, x, y))
}
"#;

#[test]
fn pipelines_of_two_and_four_stages_print_what_one_process_prints() {
    let interleaved = PIPE.replace("schedule: \"1f1b\"", "schedule: \"interleaved\", virtual_stages: 2");
    let gpipe = PIPE.replace("\"1f1b\"", "\"gpipe\"");
    let dir = scratch("pipe", &[("pipe.msl", PIPE), ("gpipe.msl", &gpipe), ("interleaved.msl", &interleaved)]);
    // The schedule, as the checker built and proved it.
    let o = msl(&dir, &["check", "--emit", "schedule", "pipe.msl"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(out.contains("pipeline schedule 1f1b: 4 stages, 4 microbatches"), "{out}");
    assert!(out.contains("bubble 0.429 (ideal (p-1)/(m+p-1) = 0.429)"), "{out}");
    assert!(out.contains("every send has its matching receive, in order (checked)"), "{out}");
    let o = msl(&dir, &["dryrun", "--devices", "4", "pipe.msl"]);
    let (out, err) = text(&o);
    assert!(out.contains("pipeline bubble of `loss`: 0.429 (1f1b over 4 stages, 4 microbatches)"), "{out}{err}");
    assert!(out.contains("microbatches held per stage: 4 3 2 1"), "{out}");
    let o = msl(&dir, &["check", "--mesh", "pp=2", "--emit", "schedule", "gpipe.msl"]);
    assert!(text(&o).0.contains("pipeline schedule gpipe: 2 stages"), "{:?}", text(&o));
    let one = msl(&dir, &["run", "pipe.msl"]);
    let (want, err) = text(&one);
    assert!(one.status.success(), "{err}");
    assert_eq!(want.lines().count(), 4, "{want}");
    if !have_mpirun("pipelines_of_two_and_four_stages_print_what_one_process_prints") {
        return;
    }
    for (file, ranks) in [("pipe.msl", "4"), ("gpipe.msl", "4"), ("interleaved.msl", "4"), ("pipe.msl", "2")] {
        let mut args = vec!["run", "--ranks", ranks];
        if ranks == "2" {
            args.extend(["--mesh", "pp=2"]);
        }
        args.push(file);
        let o = msl(&dir, &args);
        let (got, err) = text(&o);
        assert!(o.status.success(), "{args:?}: {err}");
        assert!(same_up_to_rounding(&got, &want), "{args:?}\none process:\n{want}\npipelined:\n{got}");
        assert!(!err.contains("W0510"), "a pipeline gathers no layers: {err}");
    }
    // A checkpoint of the stack saved from four stages loads on one process, and back.
    let ck = r#"mesh M[pp = 4]
model Block[D] { w: f32[D, D] = glorot_uniform(D, D) }
model Net[D, L] { layers: [Block[D]; L @pp], head: f32[D] = ones(D) }
fn main() {
    if exists("ck/") {
        let m: Net[3, 8] = load("ck/")
        print(sum(m.layers.w), m.layers.w[5])
    } else {
        let m = init(Net[3, 8], seed: 4)
        save("ck/", m)
        print(sum(m.layers.w), m.layers.w[5])
    }
}
"#;
    std::fs::write(dir.join("ck.msl"), ck).unwrap();
    let saved = msl(&dir, &["run", "--ranks", "4", "ck.msl"]);
    let (want, err) = text(&saved);
    assert!(saved.status.success(), "{err}");
    let loaded = msl(&dir, &["run", "ck.msl"]);
    let (got, err) = text(&loaded);
    assert!(same_up_to_rounding(&got, &want), "saved from 4 stages:\n{want}loaded on one process:\n{got}{err}");
    let again = msl(&dir, &["run", "--ranks", "4", "ck.msl"]);
    assert!(same_up_to_rounding(&text(&again).0, &want), "{:?}", text(&again));
}

/// Three optimizers whose state is held in pieces over `dp` (sizes that do not split evenly
/// pad the last piece), read whole, and saved.
const ZERO: &str = r#"use nn
use optim.adam
use optim.adamw
use optim.momentum

mesh M[dp = 2, mp = 2]

model Mlp[I, H, O] {
    w1: f32[I, H @mp] = he_normal(I, H)
    b1: f32[H @mp]    = zeros(H)
    w2: f32[H @mp, O] = he_normal(H, O)
    b2: f32[O]        = zeros(O)
}

fn loss[N, I, H, O](m: Mlp[I, H, O], x: f32[N @dp, I], y: i32[N @dp]) -> f32 {
    let h = relu(x @ m.w1 + m.b1)
    mean(nn.cross_entropy(h @ m.w2 + m.b2, y))
}

fn main() {
    let m = init(Mlp[5, 6, 3], seed: 1)
    var a = adam.init(m, lr: 0.05, shard: dp)
    var w = adamw.init(m, lr: 0.05, wd: 0.1, shard: dp)
    var v = momentum.init(m, lr: 0.1, offload: host, shard: dp)
    var ma = m
    var mw = m
    var mv = m
    let x = normal(16, 5, seed: 2)
    let y = i32(floor(uniform(16, seed: 3) * 2.99))
    for step in 0..3 {
        let (la, ga) = value_and_grad(loss)(ma, x, y)
        (ma, a) = adam.step(ma, ga, a)
        let (lw, gw) = value_and_grad(loss)(mw, x, y)
        (mw, w) = adamw.step(mw, gw, w)
        let (lv, gv) = value_and_grad(loss)(mv, x, y)
        (mv, v) = momentum.step(mv, gv, v)
        print(step, la, lw, lv)
    }
    print(a.t, sum(ma.w1 * ma.w1), sum(mw.b2), sum(mv.w2))
    print(a.mu.b2, w.nu.w1[0], v.v.b1)
    save("ck/", (ma, a))
}
"#;

#[test]
fn a_sharded_optimizer_state_gives_the_numbers_and_checkpoint_of_a_whole_one() {
    let whole = ZERO.replace(", shard: dp", "");
    let dir = scratch("zero", &[("zero.msl", ZERO), ("whole.msl", &whole)]);
    let one = msl(&dir, &["run", "zero.msl"]);
    let (want, err) = text(&one);
    assert!(one.status.success(), "{err}");
    assert_eq!(want.lines().count(), 5, "{want}");
    // The dry run counts each rank's pieces and the all-gather of every step.
    let o = msl(&dir, &["dryrun", "--devices", "4", "zero.msl"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let o = msl(&dir, &["dryrun", "--devices", "4", "whole.msl"]);
    let (out_whole, _) = text(&o);
    let figure = |s: &str, kind: &str| -> u64 {
        let line = s.lines().find(|l| l.contains("in bytes:")).unwrap_or_default();
        let key = format!("{kind} ");
        let at = line.find(&key).map(|i| &line[i + key.len()..]).unwrap_or_default();
        at.split(',').next().unwrap_or_default().trim().parse().unwrap_or(0)
    };
    let optimizer = |s: &str| figure(s, "optimizer");
    assert!(optimizer(&out) > 0 && optimizer(&out) < optimizer(&out_whole), "{out}\n{out_whole}");
    // The peak holds the pieces, not the whole state.
    let saved = optimizer(&out_whole) - optimizer(&out);
    assert_eq!(figure(&out, "peak"), figure(&out_whole, "peak") - saved, "{out}\n{out_whole}");
    assert!(out.contains("all_gather       over dp            3 calls            204 bytes"), "{out}");
    assert!(out.contains("reduce_scatter   over dp            3 calls            408 bytes"), "{out}");
    assert!(!out.contains("all_reduce_sum   over dp"), "{out}");
    assert!(!out_whole.contains("all_gather       over dp"), "{out_whole}");
    assert!(out_whole.contains("all_reduce_sum   over dp"), "{out_whole}");
    if !have_mpirun("a_sharded_optimizer_state_gives_the_numbers_and_checkpoint_of_a_whole_one") {
        return;
    }
    let o = msl(&dir, &["run", "--ranks", "4", "whole.msl"]);
    let (reference, err) = text(&o);
    assert!(o.status.success(), "{err}");
    std::fs::rename(dir.join("ck"), dir.join("ck_whole")).unwrap();
    for engine in [
        &["run", "--ranks", "4", "--comm-report", "zero.msl"][..],
        &["run", "--ranks", "4", "--mode", "jit", "-O2", "zero.msl"],
    ] {
        let _ = std::fs::remove_dir_all(dir.join("ck"));
        let o = msl(&dir, engine);
        let (got, err) = text(&o);
        assert!(o.status.success(), "{engine:?}: {err}");
        // The update is elementwise: each element is computed exactly as it is whole.
        assert_eq!(got, reference, "{engine:?}");
        assert!(same_up_to_rounding(&got, &want), "{engine:?}\none process:\n{want}\nfour ranks:\n{got}");
        if engine.contains(&"--comm-report") {
            // Each step reduce-scatters the gradient's pieces of both ranks of `dp` and
            // all-gathers the model's; the derivative's all-reduces over `dp` are gone: the one
            // left is the forward pass's over `mp`.
            assert!(err.contains("32:19  optimizer all_gather  3 calls  68 bytes per call"), "{err}");
            assert!(err.contains("32:19  optimizer reduce_scatter  3 calls  136 bytes per call"), "{err}");
            assert_eq!(err.lines().filter(|l| l.contains("all_reduce_sum  9 calls")).count(), 1, "{err}");
        }
        // The same state gives the same checkpoint, byte for byte.
        let mut names: Vec<_> =
            std::fs::read_dir(dir.join("ck_whole")).unwrap().map(|e| e.unwrap().file_name()).collect();
        names.sort();
        assert!(!names.is_empty());
        for n in names {
            let a = std::fs::read(dir.join("ck_whole").join(&n)).unwrap();
            let b = std::fs::read(dir.join("ck").join(&n)).unwrap_or_default();
            assert!(a == b, "{engine:?}: checkpoint file {n:?} differs");
        }
    }
}

/// Training that resumes from a checkpoint: the state loaded into a variable made by
/// `adam.init(…, shard: dp)` is cut into pieces again (the resumed steps all-gather the model).
const RESUME_ZERO: &str = r#"use nn
use optim.adam

mesh M[dp = 2]

model Mlp { w1: f32[4, 6] = he_normal(4, 6), b1: f32[6] = zeros(6), w2: f32[6, 3] = he_normal(6, 3) }

fn loss[N](m: Mlp, x: f32[N @dp, 4], y: i32[N @dp]) -> f32 {
    mean(nn.cross_entropy(relu(x @ m.w1 + m.b1) @ m.w2, y))
}

fn main() {
    var m = init(Mlp, seed: 1)
    var opt = adam.init(m, lr: 0.05, shard: dp)
    var start = 0
    if exists("ck/") {
        let state: (Mlp, adam.AdamState[Mlp], i32) = load("ck/")
        (m, opt, start) = state
    }
    let x = normal(16, 4, seed: 2)
    let y = i32(floor(uniform(16, seed: 3) * 2.99))
    for step in start..STOP {
        let (l, g) = value_and_grad(loss)(m, x, y)
        (m, opt) = adam.step(m, g, opt)
        print(step, l)
        save("ck/", (m, opt, step + 1))
    }
}
const STOP = 4"#;

#[test]
fn a_resumed_sharded_optimizer_state_stays_in_pieces() {
    if !have_mpirun("a_resumed_sharded_optimizer_state_stays_in_pieces") {
        return;
    }
    let dir = scratch("resume_zero", &[("r.msl", RESUME_ZERO)]);
    let o = msl(&dir, &["run", "--ranks", "2", "r.msl"]);
    let (whole_run, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert_eq!(whole_run.lines().count(), 4, "{whole_run}");
    for engine in [&["--mode", "eager"][..], &["--mode", "jit", "-O2"]] {
        let _ = std::fs::remove_dir_all(dir.join("ck"));
        let first = msl(&dir, &[&["run", "--ranks", "2", "--const", "STOP=2"][..], engine, &["r.msl"]].concat());
        let (a, err) = text(&first);
        assert!(first.status.success(), "{engine:?}: {err}");
        let second = msl(&dir, &[&["run", "--ranks", "2", "--comm-report"][..], engine, &["r.msl"]].concat());
        let (b, err) = text(&second);
        assert!(second.status.success(), "{engine:?}: {err}");
        assert_eq!(format!("{a}{b}"), whole_run, "{engine:?}: the resumed run prints what the whole run prints");
        assert!(err.contains("24:20  optimizer all_gather  2 calls"), "{engine:?}: the resumed state is whole\n{err}");
    }
}

/// A tensor-parallel block split into two copies (spec/copies.md).
const COPIES: &str = r#"mesh M[mp = 2]

model Mlp[D, F] {
    w1: f32[D, F @mp] = glorot_uniform(D, F)
    b1: f32[F @mp]    = zeros(F)
    w2: f32[F @mp, D] = glorot_uniform(F, D)
}

@copies(2)
fn block[B, D, F](m: Mlp[D, F], x: f32[B, D]) -> f32[B, D] {
    x + relu(x @ m.w1 + m.b1) @ m.w2
}

fn loss[B, D, F](m: Mlp[D, F], x: f32[B, D]) -> f32 {
    mean(block(m, block(m, x)) ** 2)
}

fn main() {
    var m = init(Mlp[4, 8], seed: 0)
    let x = normal(8, 4, seed: 1)
    for step in 0..3 {
        let (l, g) = value_and_grad(loss)(m, x)
        print(step, l, precision: 5)
        m = m - 0.1 * g
    }
}
"#;

#[test]
fn a_loop_over_a_split_stack_keeps_its_layers_split() {
    // The derivative of the loop indexes the stack again: its layers' types keep their `@mp`
    // (instantiating a function's types used to drop declared layouts, and every layer was
    // all-gathered in the backward pass).
    let src = COPIES
        .replace("model Mlp[D, F] {", "model Net[D, F, L] {\n    layers: [Mlp[D, F]; L]\n}\n\nmodel Mlp[D, F] {")
        .replace(
            "mean(block(m, block(m, x)) ** 2)",
            "var h = x\n    for l in 0..L {\n        h = block(m.layers[l], h)\n    }\n    mean(h ** 2)",
        )
        .replace("fn loss[B, D, F](m: Mlp[D, F]", "fn loss[B, D, F, L](m: Net[D, F, L]")
        .replace("init(Mlp[4, 8]", "init(Net[4, 8, 3]");
    let dir = scratch("stack-copies", &[("s.msl", &src)]);
    let o = msl(&dir, &["check", "--emit", "collectives", "s.msl"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    assert!(!out.contains("all_gather") && !err.contains("W0510"), "{out}{err}");
    assert!(out.contains("all_reduce_sum  over mp  f32[B/2, D]"), "{out}");
}

#[test]
fn copies_defer_their_collectives_and_print_what_blocking_ones_print() {
    if !have_mpirun("copies_defer_their_collectives_and_print_what_blocking_ones_print") {
        return;
    }
    let dir = scratch("copies", &[("c.msl", COPIES)]);
    let one = msl(&dir, &["run", "c.msl"]);
    assert!(one.status.success(), "{:?}", text(&one));
    let mut events = Vec::new();
    for overlap in ["1", "0"] {
        let o = mpirun_with(&dir, 2, &[("MSL_OVERLAP", overlap)], &["run", "--trace", "t.json", "c.msl"]);
        assert!(o.status.success(), "{:?}", text(&o));
        assert_eq!(text(&o).0, text(&one).0, "MSL_OVERLAP={overlap}");
        events.push(trace_events(&dir));
    }
    let of = |evs: &[serde_json::Value], cat: &str| {
        evs.iter().filter(|e| e["pid"] == 0 && e["cat"] == cat && e["name"] == "all_reduce_sum").count()
    };
    // Each step: two blocks × two copies forward, two copies of the second block's input
    // cotangent backward, every one over half the batch (4 rows of 4 f32).
    let deferred: Vec<_> = events[0].iter().filter(|e| e["pid"] == 0 && e["cat"] == "deferred").collect();
    assert_eq!(deferred.len(), 3 * 6, "{deferred:?}");
    assert!(deferred.iter().all(|e| e["args"]["shape"] == "f32[4, 4]" && e["tid"] == 1), "{deferred:?}");
    assert_eq!(of(&events[1], "deferred"), 0);
    assert_eq!(of(&events[1], "collective"), 3 * 6);
    // Compiled (-O2), the bodies that start collectives still run where they overlap.
    let o = mpirun(&dir, 2, &["run", "--mode", "jit", "-O2", "--trace", "t.json", "c.msl"]);
    assert!(o.status.success(), "{:?}", text(&o));
    assert_eq!(text(&o).0, text(&one).0, "-O2");
    assert_eq!(of(&trace_events(&dir), "deferred"), 3 * 6);
}

/// A stack of layers with its optimizer state in pieces: the reverse loop's per-layer gradients
/// are added up on each rank and reduce-scattered once by the step (`shard::zero`), with the
/// numbers of a whole state.
const STACK_ZERO: &str = include_str!("programs/stack_zero.msl");

#[test]
fn a_stacks_gradient_is_reduce_scattered_once_a_step() {
    if !have_mpirun("a_stacks_gradient_is_reduce_scattered_once_a_step") {
        return;
    }
    let whole = STACK_ZERO.replace(", shard: dp", "");
    let dir = scratch("stack_zero", &[("z.msl", STACK_ZERO), ("w.msl", &whole)]);
    let o = msl(&dir, &["run", "--ranks", "2", "w.msl"]);
    let (want, err) = text(&o);
    assert!(o.status.success(), "{err}");
    for engine in [&["--mode", "eager"][..], &["--mode", "jit", "-O2"]] {
        let mut args = vec!["run", "--ranks", "2", "--comm-report"];
        args.extend_from_slice(engine);
        args.push("z.msl");
        let o = msl(&dir, &args);
        let (got, err) = text(&o);
        assert!(o.status.success(), "{engine:?}: {err}");
        assert!(same_up_to_rounding(&got, &want), "{engine:?}\nwhole:\n{want}\nin pieces:\n{got}");
        assert!(err.contains("optimizer reduce_scatter  3 calls"), "{engine:?}: {err}");
        assert!(!err.contains("all_reduce_sum"), "a gradient all-reduce is left ({engine:?}): {err}");
    }
}
