//! `msl run --mode jit -O<level> [--explain]`: the interpreter with the JIT installed.
//!
//! At every level, loops of scalar host code run as native code (`jit::host`); `-O0` runs every
//! tensor primitive op by op through the kernels; `-O1` also fuses elementwise trees into
//! Cranelift loops; `-O2` first folds constants and removes common subexpressions and dead code
//! in every function (`lang::ir::opt`), then runs as `-O1` with a memory plan: each local's
//! last read moves its value out of the frame, and a fused loop writes its result into the
//! buffer of an input nothing else refers to (a temporary such as `x @ w`, or a local at its
//! last use). The peak heap of the run is measured by the process's allocator. `--explain` prints, on stderr after the run, each compiled loop and fused tree
//! with its source location, and every fallback to the interpreter with its reason; at `-O2`
//! also the static memory plan (`lang::ir::memplan`) of `main` and the functions it reaches,
//! before the measured peak.

use lang::check::Checked;
use std::path::Path;

/// `level` is 0, 1 or 2 (`cli::mode_and_level` refuses the rest).
pub fn run(file: &Path, logdir: &Path, level: u8, explain: bool, json: bool) -> u8 {
    let (mut c, main) = match crate::run::runnable(file, json) {
        Ok(x) => x,
        Err(code) => return code,
    };
    let t = std::time::Instant::now();
    let opts = jit::Options::level(level);
    let opt = jit::prepare(&mut c.program, opts);
    let opt_ms = t.elapsed().as_secs_f64() * 1e3;
    crate::alloc::reset_peak();
    let (live0, _) = crate::alloc::heap();
    let mut it = crate::run::interpreter(&c.program, file, logdir);
    let report = jit::install(&mut it, opts);
    let n_moves = it.moves.len();
    let result = crate::alloc::with_sources(&c.sources, || it.run_main(main));
    let traced = crate::trace::finish(&mut it, &c, result.is_ok());
    drop(it);
    let (_, peak) = crate::alloc::heap();
    if explain {
        let mut s = explain_text(&c, level, &report.borrow());
        if let Some(o) = opt {
            s.push_str(&format!(
                "-O2: {} constants folded, IR {} -> {} nodes (CSE, dead code), {} single-use values moved into \
                 their use, {} last uses move their value, {} fused results written into a dead input's buffer \
                 ({opt_ms:.1} ms)\n",
                o.folded,
                o.nodes_before,
                o.nodes_after,
                o.substituted,
                n_moves,
                report.borrow().sites.iter().map(|s| s.reused).sum::<u64>()
            ));
            if let Some(j) = crate::spmd::job() {
                let axes: Vec<String> =
                    j.mesh.names.iter().zip(&j.mesh.sizes).map(|(n, k)| format!("{n} = {k}")).collect();
                s.push_str(&format!("memory plans per rank (each holds its blocks on mesh [{}]):\n", axes.join(", ")));
            }
            s.push_str(&plan_text(&c.program, main));
        }
        s.push_str(&format!("memory: peak heap during the run {}\n", mib(peak.saturating_sub(live0))));
        // In a sharded run every rank runs the same plan: rank 0 reports it.
        if crate::spmd::rank() == 0 {
            eprint!("{s}");
        }
    }
    match result {
        Ok(_) => {
            crate::spmd::comm_report(&c);
            traced.err().unwrap_or(0)
        }
        Err(e) => crate::run::run_failed(&e, &c, json),
    }
}

/// The most functions besides `main` whose memory plan `--explain` prints.
const MAX_PLANS: usize = 8;

/// The static memory plan (`lang::ir::memplan`) of `main` and of the functions it reaches that
/// hold tensor values (the largest plans first, at most [`MAX_PLANS`]): bytes are concrete where
/// the dims are constants and symbolic in the dims bound at run time.
fn plan_text(prog: &lang::ir::Program, main: lang::types::FuncId) -> String {
    use lang::ir::memplan;
    let no_dims = |_: lang::types::Sym| None;
    let mut others: Vec<memplan::MemPlan> = memplan::reachable(prog, main)
        .into_iter()
        .skip(1)
        .map(|f| memplan::plan(prog, f))
        .filter(|p| p.n_values() + p.n_unknown() > 0)
        .collect();
    others.sort_by_key(|p| std::cmp::Reverse(p.n_values()));
    let mut s = memplan::plan(prog, main).render(prog, &no_dims) + "\n";
    for p in others.iter().take(MAX_PLANS) {
        s.push_str(&format!("  {}\n", p.render(prog, &no_dims)));
    }
    if others.len() > MAX_PLANS {
        let more = (others.len() - MAX_PLANS) as u64;
        s.push_str(&format!("  ... and {more} more function{} with tensor values\n", plural(more)));
    }
    s
}

/// Bodies listed one by one by `--explain` (the most run first).
const MAX_BODIES: usize = 12;

/// The plural ending for `n` things.
fn plural(n: u64) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

fn mib(bytes: usize) -> String {
    format!("{:.1} MiB", bytes as f64 / (1024.0 * 1024.0))
}

/// `file:line:col` and the source text of a span, on one line.
fn place(c: &Checked, id: lang::ir::SpanId) -> (String, String) {
    let span = c.program.span(id);
    let (line, col) = c.sources.line_col(span.file, span.start);
    let text = c.sources.text(span.file);
    let snippet = text.get(span.start as usize..span.end as usize).unwrap_or("");
    let mut snippet = snippet.split_whitespace().collect::<Vec<_>>().join(" ");
    if snippet.chars().count() > 72 {
        snippet = snippet.chars().take(69).collect::<String>() + "...";
    }
    (format!("{}:{line}:{col}", c.sources.name(span.file)), snippet)
}

fn explain_text(c: &Checked, level: u8, r: &jit::Report) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    if level == 0 {
        let _ =
            writeln!(s, "jit -O0: function bodies and scalar loops compiled, tensor primitives op by op (no fusion)");
    } else {
        let _ = writeln!(
            s,
            "jit -O{level}: function bodies and scalar loops compiled, elementwise trees fused into Cranelift loops"
        );
    }
    explain_bodies(&mut s, c, r);
    explain_loops(&mut s, c, r);
    let mut sites: Vec<&jit::Site> = r.sites.iter().collect();
    sites.sort_by_key(|x| {
        let sp = c.program.span(x.span);
        (sp.file.0, sp.start)
    });
    for (i, x) in sites.iter().enumerate() {
        let (at, snippet) = place(c, x.span);
        let code = match x.vector {
            Some(kernels::DType::F64) => "f64x2 vector loop",
            Some(_) => "f32x4 vector loop",
            None => "scalar loop",
        };
        let _ = writeln!(s, "  fused #{} at {at}: `{snippet}`", i + 1);
        let _ = writeln!(s, "     {} ops ({}), {} inputs: {}", x.ops.len(), x.ops.join(", "), x.inputs, x.term);
        let compiles: Vec<String> = x.compiles.iter().map(|us| format!("{us:.0} µs")).collect();
        let _ = writeln!(
            s,
            "     {} compiled calls ({code}), {} compile{} ({})",
            x.calls,
            x.compiles.len(),
            plural(x.compiles.len() as u64),
            if compiles.is_empty() { "cached".to_string() } else { compiles.join(", ") }
        );
        if x.on_device > 0 {
            let _ =
                writeln!(s, "     {} of them on the accelerator, by the kernel its code generator wrote", x.on_device);
        }
        if x.fallbacks > 0 {
            let why = x.fallback_reason.as_deref().unwrap_or("");
            let _ =
                writeln!(s, "     fallback to the interpreter: {} call{} ({why})", x.fallbacks, plural(x.fallbacks));
        }
    }
    let compiled = r.loops.iter().filter(|l| l.calls > 0).count();
    let bodies = r.bodies.len() - r.interpreted_bodies();
    let fallbacks = r.fallbacks() + r.interpreted_loops() + r.interpreted_bodies() as u64;
    let _ = writeln!(
        s,
        "jit: {bodies} compiled bod{}, {compiled} compiled scalar loop{}, {} fused tree{}, {} compiled calls, {} \
         functions in the compile cache, {fallbacks} fallback{} ({} interpreted bodies, {} interpreted loop runs, {} \
         fused-tree fallbacks)",
        if bodies == 1 { "y" } else { "ies" },
        plural(compiled as u64),
        sites.len(),
        plural(sites.len() as u64),
        r.calls() + r.loops.iter().map(|l| l.calls).sum::<u64>(),
        jit::cached_loops(),
        plural(fallbacks),
        r.interpreted_bodies(),
        r.interpreted_loops(),
        r.fallbacks(),
    );
    s
}

/// Each function body the run entered: compiled (ops, runs, compile time) or interpreted.
fn explain_bodies(s: &mut String, c: &Checked, r: &jit::Report) {
    use std::fmt::Write as _;
    let mut bodies: Vec<&jit::BodySite> = r.bodies.iter().collect();
    bodies.sort_by_key(|b| std::cmp::Reverse(b.runs.get()));
    let shown = bodies.len().min(MAX_BODIES);
    for b in &bodies[..shown] {
        let name = lang::ir::memplan::func_name(&c.program, b.func);
        let (at, _) = place(c, c.program.func(b.func).span);
        let runs = b.runs.get();
        match &b.fallback {
            None => {
                let compile =
                    b.compile.map_or("code from the cache".to_string(), |us| format!("compiled in {us:.0} µs"));
                let _ = writeln!(
                    s,
                    "  compiled body of `{name}` ({at}): {} op call{}, {runs} native run{}, {compile}",
                    b.ops,
                    plural(b.ops as u64),
                    plural(runs)
                );
            }
            Some(why) => {
                let _ = writeln!(s, "  fallback: body of `{name}` ({at}) interpreted ({why})");
            }
        }
    }
    if bodies.len() > shown {
        let more = (bodies.len() - shown) as u64;
        let _ = writeln!(s, "  ... and {more} more compiled bod{}", if more == 1 { "y" } else { "ies" });
    }
}

/// Each loop of host code: compiled (with its compile times) or interpreted (with the reason).
fn explain_loops(s: &mut String, c: &Checked, r: &jit::Report) {
    use std::fmt::Write as _;
    let mut loops: Vec<&jit::LoopSite> = r.loops.iter().collect();
    loops.sort_by_key(|x| {
        let sp = c.program.span(x.span);
        (sp.file.0, sp.start)
    });
    for x in loops {
        let (at, snippet) = place(c, x.span);
        if x.calls > 0 {
            let compiles: Vec<String> = x.compiles.iter().map(|us| format!("{us:.0} µs")).collect();
            let _ = writeln!(s, "  compiled loop at {at}: `{snippet}`");
            let _ = writeln!(
                s,
                "     {} scalar ops, {} native run{}, compiled in {}",
                x.ops,
                x.calls,
                plural(x.calls),
                if compiles.is_empty() { "cache".to_string() } else { compiles.join(", ") }
            );
        }
        if x.interpreted > 0 {
            let why = x.reason.as_deref().unwrap_or("");
            let _ = writeln!(s, "  fallback: loop at {at} interpreted ({why}): `{snippet}`");
            let _ = writeln!(s, "     {} interpreted run{}", x.interpreted, plural(x.interpreted));
        }
    }
}
