//! `msl run --mode jit -O<level> [--explain]`: the interpreter with the JIT installed.
//!
//! `-O0` runs op by op (the interpreter alone); `-O1` fuses elementwise trees into Cranelift
//! loops; `-O2` is `-O1` for now (whole-program passes and memory planning are not built yet).
//! `--explain` prints, on stderr after the run, each fused tree with its source location and
//! every fallback to the interpreter.

use crate::cli::load;
use lang::check::Checked;
use lang::diag::{self, Code, Diagnostic};
use lang::interp::Interp;
use std::io::IsTerminal;
use std::path::Path;

pub fn run(file: &Path, level: u8, explain: bool, json: bool) -> u8 {
    if level > 2 {
        eprintln!("error: `-O{level}` is not an optimisation level (use 0, 1 or 2)");
        return 2;
    }
    let c = match load(file) {
        Ok(c) => c,
        Err(code) => return code,
    };
    if c.has_errors() {
        render(&c.diagnostics, &c, json);
        return 1;
    }
    let Some(main) = c.program.main else {
        let span = lang::source::Span::new(lang::source::FileId(0), 0, 0);
        render(&[Diagnostic::error(Code::E0211, span, "this program has no `main` function")], &c, json);
        return 1;
    };
    let stdout = std::io::stdout();
    let mut it = Interp::new(&c.program, Box::new(std::io::BufWriter::new(stdout.lock())));
    it.source_dir = file.parent().map(Path::to_path_buf);
    let report = jit::install(&mut it, jit::Options::level(level));
    let result = it.run_main(main);
    drop(it);
    if explain {
        eprint!("{}", explain_text(&c, level, &report.borrow()));
    }
    match result {
        Ok(_) => 0,
        Err(e) => {
            render(&[e.to_diagnostic()], &c, json);
            2
        }
    }
}

fn render(d: &[Diagnostic], c: &Checked, json: bool) {
    if json {
        for x in d {
            println!("{}", diag::to_json(x, &c.sources));
        }
    } else {
        let color = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
        eprint!("{}", diag::render(d, &c.sources, color));
    }
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
        let _ = writeln!(s, "jit -O0: every primitive runs op by op in the interpreter (no fusion); 0 fallbacks");
        return s;
    }
    let _ = writeln!(s, "jit -O{level}: fusion of elementwise trees into Cranelift loops");
    if level == 2 {
        let _ = writeln!(s, "  note: -O2 is -O1 for now (no CSE, constant folding or memory planning yet)");
    }
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
            if x.compiles.len() == 1 { "" } else { "s" },
            if compiles.is_empty() { "cached".to_string() } else { compiles.join(", ") }
        );
        if x.fallbacks > 0 {
            let why = x.fallback_reason.as_deref().unwrap_or("");
            let _ = writeln!(
                s,
                "     fallback to the interpreter: {} call{} ({why})",
                x.fallbacks,
                if x.fallbacks == 1 { "" } else { "s" }
            );
        }
    }
    let _ = writeln!(
        s,
        "jit: {} fused tree{}, {} compiled calls, {} loops in the compile cache, {} fallback{}",
        sites.len(),
        if sites.len() == 1 { "" } else { "s" },
        r.calls(),
        jit::cached_loops(),
        r.fallbacks(),
        if r.fallbacks() == 1 { "" } else { "s" }
    );
    s
}
