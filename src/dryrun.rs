//! `msl dryrun FILE --devices N [--mesh …] [--search --memory 16GiB]`: checks and partitions a
//! program for N devices as `mpirun -n N` would, then reports per rank the bytes of its
//! parameters, gradients, optimizer state, data and activations, the peak, and the
//! communication of a training step, without running a kernel (`lang::dryrun`). `--search`
//! tries every assignment of mesh sizes whose product is N and proposes the fastest one that
//! fits, as a patch to the source.

use lang::dist::Mesh;
use lang::dryrun::{self, Report, Traffic};
use lang::ir::memplan::human;
use std::path::Path;

/// What one device is assumed to do, for `--search`'s estimate of a step's time.
const FLOPS: f64 = 1.0e11;
/// Bytes per second one rank sends or receives, and the cost of starting one collective.
const BANDWIDTH: f64 = 5.0e9;
const LATENCY: f64 = 2.0e-5;

pub struct Args<'a> {
    pub file: &'a Path,
    pub devices: i64,
    pub mesh: Option<&'a str>,
    pub search: bool,
    pub memory: Option<&'a str>,
}

/// The exit status of `msl dryrun`.
pub fn main(a: &Args) -> u8 {
    if a.devices < 1 {
        eprintln!("error: `--devices` must be at least 1");
        return 2;
    }
    let limit = match a.memory.map(parse_bytes) {
        None => None,
        Some(Ok(b)) => Some(b),
        Some(Err(e)) => {
            eprintln!("error: {e}");
            return 2;
        }
    };
    if let Some(m) = a.mesh {
        match crate::spmd::parse_mesh(m) {
            Ok(sizes) => lang::check::set_mesh_override(sizes),
            Err(e) => {
                eprintln!("error: {e}");
                return 2;
            }
        }
    }
    let c = match crate::cli::load(a.file) {
        Ok(c) => c,
        Err(code) => return code,
    };
    if !c.diagnostics.is_empty() {
        crate::run::render(&c.diagnostics, &c, false);
    }
    if c.has_errors() {
        return 1;
    }
    let Some(mesh) = Mesh::of(&c.program) else {
        if a.devices != 1 {
            eprintln!(
                "error: the program declares no mesh, so it runs on one device, not {}; add e.g. `mesh M[dp = {}]` \
                 and layouts, or use `--devices 1`",
                a.devices, a.devices
            );
            return 2;
        }
        let bubble = bubble_text(&c.program, None);
        let r = analyse(a.file, c);
        print!("{}{bubble}", render(a.file, None, &r));
        return fits(&r, limit);
    };
    if a.search {
        return search(a, &mesh, limit);
    }
    if mesh.devices() != a.devices {
        eprintln!(
            "error: the mesh has {} devices ({}) but `--devices {}` was asked for; give `--mesh` sizes whose \
             product is {}, or `--search` for them",
            mesh.devices(),
            axes_text(&mesh),
            a.devices,
            a.devices
        );
        return 2;
    }
    let bubble = bubble_text(&c.program, Some(&mesh));
    let r = analyse(a.file, c);
    print!("{}{bubble}", render(a.file, Some(&mesh), &r));
    fits(&r, limit)
}

/// The idle fraction of each `@pipeline` function's schedule for the mesh, as the checker's
/// simulation of it gives (a forward costs one unit, a backward two).
fn bubble_text(p: &lang::ir::Program, mesh: Option<&Mesh>) -> String {
    if p.pipelines.is_empty() {
        return "pipeline bubble: none (no `@pipeline` function: every rank works through the whole step)\n".into();
    }
    let mut s = String::new();
    for pl in &p.pipelines {
        let name = p.names.get(p.func(pl.func).name);
        let stages = pl.stages(mesh);
        let line = pl
            .proved(stages)
            .map(|(_, t)| {
                let peak: Vec<String> = t.peak_activations.iter().map(usize::to_string).collect();
                format!(
                    "{:.3} ({} over {stages} stages, {} microbatches); microbatches held per stage: {}",
                    t.bubble(),
                    pl.schedule.name(),
                    pl.microbatches,
                    peak.join(" ")
                )
            })
            .unwrap_or_else(|e| format!("none: {e}"));
        s.push_str(&format!("pipeline bubble of `{name}`: {line}\n"));
        s.push_str(&format!(
            "note: `{name}` runs as a pipeline: the messages between its stages and the collectives inside them are not \
             counted above (`msl run --comm-report` counts them)\n"
        ));
    }
    s
}

/// Exit 2 when a size does not split over its axes (the run would stop there) or the peak
/// exceeds `--memory`.
fn fits(r: &Report, limit: Option<u64>) -> u8 {
    if !r.errors.is_empty() {
        for e in &r.errors {
            eprintln!("error: {e}: a run on this mesh would stop here (exit 2)");
        }
        return 2;
    }
    match limit {
        Some(l) if r.memory.peak > l => {
            eprintln!("error: the peak of {} per rank exceeds `--memory` {}", human(r.memory.peak), human(l));
            2
        }
        _ => 0,
    }
}

/// Partitions the checked program for its mesh and walks it.
fn analyse(file: &Path, mut c: lang::check::Checked) -> Report {
    let shard = lang::passes::shard(&mut c.program);
    if !shard.warnings.is_empty() {
        crate::run::render(&shard.warnings, &c, false);
    }
    let files = dryrun::Files {
        work_dir: std::env::current_dir().unwrap_or_default(),
        source_dir: file.parent().map(|p| if p.as_os_str().is_empty() { Path::new(".") } else { p }.to_path_buf()),
    };
    let mut report = dryrun::run(&c.program, &c.sources, &files);
    // A program the verifier found malformed after partitioning is not reported on as if it
    // were sound (`lang::passes`).
    if let Some(why) = lang::passes::malformed(&c.program) {
        report.errors.insert(0, why);
    }
    report
}

fn axes_text(mesh: &Mesh) -> String {
    mesh.names.iter().zip(&mesh.sizes).map(|(n, s)| format!("{n} = {s}")).collect::<Vec<_>>().join(", ")
}

/// The report as text (see `spec/sharding.md`, *Dry runs*).
fn render(file: &Path, mesh: Option<&Mesh>, r: &Report) -> String {
    let devices = mesh.map_or(1, Mesh::devices);
    let mut s = match mesh {
        Some(m) => format!("dry run of {} on {devices} devices, mesh [{}]\n", file.display(), axes_text(m)),
        None => format!("dry run of {} on 1 device (no mesh)\n", file.display()),
    };
    for (name, v, path) in &r.dims {
        s.push_str(&format!("  {name} = {v} (from the header of {path})\n"));
    }
    match &r.step {
        Some(st) => {
            let count = st.count.map(|n| format!(", {n} steps in the run")).unwrap_or_default();
            match st.lp {
                Some(_) => {
                    s.push_str(&format!("training step: one iteration of the loop that calls {}{count}\n", st.grad))
                }
                None => s.push_str(&format!("training step: `main`, which calls {}\n", st.grad)),
            }
        }
        None => s.push_str(
            "training step: none (no gradient is computed); figures are for the whole run, the memory by kind at \
             the call of `main` that needs the most\n",
        ),
    }
    let m = &r.memory;
    let ranks = if devices == 1 { "rank 0".to_string() } else { format!("ranks 0-{} (each)", devices - 1) };
    s.push_str("memory per rank:\n");
    s.push_str(&format!(
        "  {:<18}{:>14}{:>14}{:>14}{:>14}{:>14}{:>14}\n",
        "", "parameters", "gradients", "optimizer", "data", "activations", "peak"
    ));
    s.push_str(&format!(
        "  {:<18}{:>14}{:>14}{:>14}{:>14}{:>14}{:>14}\n",
        ranks,
        human(m.parameters),
        human(m.gradients),
        human(m.optimizer),
        human(m.data),
        human(m.activations),
        human(m.peak)
    ));
    s.push_str(&format!(
        "  in bytes: parameters {}, gradients {}, optimizer {}, data {}, activations {}, peak {}\n",
        m.parameters, m.gradients, m.optimizer, m.data, m.activations, m.peak
    ));
    if m.host > 0 {
        s.push_str(&format!(
            "  in host memory (`offload: host`): optimizer state {} ({} bytes), in none of the figures above\n",
            human(m.host),
            m.host
        ));
    }
    s.push_str("communication per training step, from each rank:\n");
    traffic(&mut s, &r.per_step);
    s.push_str("communication in the whole run, from each rank:\n");
    traffic(&mut s, &r.per_run);
    s.push_str(&format!("products per training step: {:.3e} flops per rank\n", r.step_flops));
    for n in &r.notes {
        s.push_str(&format!("note: {n}\n"));
    }
    s
}

fn traffic(s: &mut String, t: &Traffic) {
    if t.is_empty() {
        s.push_str("  none\n");
        return;
    }
    let (mut calls, mut bytes) = (0u64, 0u64);
    for (k, c) in t {
        let axes = k.axes.join(", ");
        s.push_str(&format!(
            "  {:<16} over {:<8} {:>6} calls {:>14} bytes ({})\n",
            k.kind,
            axes,
            c.calls,
            c.bytes,
            human(c.bytes)
        ));
        calls += c.calls;
        bytes += c.bytes;
    }
    s.push_str(&format!(
        "  {:<16}      {:<8} {:>6} calls {:>14} bytes ({})\n",
        "total",
        "",
        calls,
        bytes,
        human(bytes)
    ));
}

/// `16GiB`, `512MiB`, `2e9` → bytes.
fn parse_bytes(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let units = [
        ("KiB", 1u64 << 10),
        ("MiB", 1 << 20),
        ("GiB", 1 << 30),
        ("TiB", 1 << 40),
        ("KB", 1000),
        ("MB", 1_000_000),
        ("GB", 1_000_000_000),
        ("B", 1),
    ];
    let (num, mul) = units.iter().find_map(|(u, m)| t.strip_suffix(u).map(|n| (n.trim(), *m))).unwrap_or((t, 1));
    match num.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v * (mul as f64) < 1.8e19 => Ok((v * mul as f64) as u64),
        _ => Err(format!("`--memory {s}`: expected a size such as `16GiB`, `512MiB` or `2e9`")),
    }
}

/// The estimated seconds of one step: the products at [`FLOPS`] plus each collective's bytes
/// over its group at [`BANDWIDTH`] (ring algorithms), plus [`LATENCY`] per call.
fn step_time(mesh: &Mesh, r: &Report) -> f64 {
    let mut t = r.step_flops / FLOPS;
    for (k, c) in &r.per_step {
        let n: i64 =
            k.axes.iter().filter_map(|a| mesh.names.iter().position(|x| x == a)).map(|i| mesh.sizes[i]).product();
        let n = n.max(1) as f64;
        let share = match k.kind {
            "all_gather" => n - 1.0,
            "all_reduce_sum" | "all_reduce_max" | "all_reduce_min" | "all_reduce_mean" => 2.0 * (n - 1.0) / n,
            _ => (n - 1.0) / n,
        };
        t += c.bytes as f64 * share / BANDWIDTH + c.calls as f64 * LATENCY;
    }
    t
}

/// Every way to give the mesh's axes sizes whose product is `n`, in order.
fn factorings(axes: usize, n: i64) -> Vec<Vec<i64>> {
    if axes == 0 {
        return if n == 1 { vec![vec![]] } else { vec![] };
    }
    let mut out = Vec::new();
    for d in 1..=n {
        if n % d == 0 {
            for mut rest in factorings(axes - 1, n / d) {
                rest.insert(0, d);
                out.push(rest);
            }
        }
    }
    out
}

/// `--search`: re-checks the program for each assignment of sizes, keeps those that check and
/// fit `--memory`, and proposes the fastest as a patch to the `mesh` line.
fn search(a: &Args, mesh: &Mesh, limit: Option<u64>) -> u8 {
    let limit = limit.unwrap_or(16 << 30);
    let options = factorings(mesh.names.len(), a.devices);
    if options.len() > 256 {
        eprintln!(
            "error: `--search`: {} ways to split {} devices over the mesh; give fewer devices",
            options.len(),
            a.devices
        );
        return 2;
    }
    println!("search over {} mesh sizes for {} devices (at most {} per rank):", options.len(), a.devices, human(limit));
    let mut best: Option<(f64, Vec<i64>, Report)> = None;
    for sizes in options {
        let m = Mesh { names: mesh.names.clone(), sizes: sizes.clone() };
        lang::check::set_mesh_override(m.names.iter().cloned().zip(sizes.iter().copied()).collect());
        let label = format!("[{}]", axes_text(&m));
        let c = match crate::cli::load(a.file) {
            Ok(c) => c,
            Err(code) => return code,
        };
        if c.has_errors() {
            let why = c
                .diagnostics
                .iter()
                .find(|d| d.is_error())
                .map(|d| format!("{}: {}", d.code.as_str(), d.message))
                .unwrap_or_default();
            println!("  {label:<28} rejected: {why}");
            continue;
        }
        let r = analyse(a.file, c);
        if let Some(e) = r.errors.first() {
            println!("  {label:<28} rejected: {e}");
            continue;
        }
        let t = step_time(&m, &r);
        let fits = r.memory.peak <= limit;
        println!(
            "  {label:<28} peak {:>10}  step ≈ {:>9.3} ms  sent {:>10} per step{}",
            human(r.memory.peak),
            t * 1e3,
            human(r.per_step.values().map(|c| c.bytes).sum()),
            if fits { "" } else { "  (does not fit)" }
        );
        if fits && best.as_ref().is_none_or(|(bt, _, _)| t < *bt) {
            best = Some((t, sizes, r));
        }
    }
    let Some((_, sizes, _)) = best else {
        eprintln!(
            "error: no mesh sizes for {} devices split every size of the program evenly and fit {} per rank",
            a.devices,
            human(limit)
        );
        return 2;
    };
    let m = Mesh { names: mesh.names.clone(), sizes };
    println!("proposed: [{}]", axes_text(&m));
    match patch(a.file, &m) {
        Some(p) => print!("{p}"),
        None => println!(
            "(run with `--mesh {}`)",
            m.names.iter().zip(&m.sizes).map(|(n, s)| format!("{n}={s}")).collect::<Vec<_>>().join(",")
        ),
    }
    0
}

/// A unified diff that rewrites the file's `mesh` line to `m`'s sizes (`None` when the line is
/// not found as written, or already says so).
fn patch(file: &Path, m: &Mesh) -> Option<String> {
    let text = std::fs::read_to_string(file).ok()?;
    let (i, line) = text.lines().enumerate().find(|(_, l)| l.trim_start().starts_with("mesh ") && l.contains('['))?;
    let open = line.find('[')?;
    let close = open + line[open..].find(']')?;
    let new = format!("{}[{}]{}", &line[..open], axes_text(m), &line[close + 1..]);
    if new == line {
        return Some("(the file's mesh already has these sizes)\n".to_string());
    }
    let name = file.display();
    Some(format!("--- a/{name}\n+++ b/{name}\n@@ -{n} +{n} @@\n-{line}\n+{new}\n", n = i + 1))
}
