//! `msl run` and `msl test`: check, then interpret.

use crate::cli::load;
use lang::diag::{self, Code, Diagnostic};
use lang::interp::{Interp, Observer};
use lang::types::TensorTy;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};

/// A progress bar over `batches` when stderr is a terminal.
struct Progress {
    bar: Option<indicatif::ProgressBar>,
}

impl Observer for Progress {
    fn batches_start(&mut self, total: usize) {
        let bar = indicatif::ProgressBar::new(total as u64);
        bar.set_style(
            indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} batches [{elapsed_precise}<{eta_precise}]")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        self.bar = Some(bar);
    }
    fn batch_done(&mut self) {
        if let Some(b) = &self.bar {
            b.inc(1);
        }
    }
    fn batches_end(&mut self) {
        if let Some(b) = self.bar.take() {
            b.finish_and_clear();
        }
    }
}

pub(crate) fn render(d: &[Diagnostic], c: &lang::check::Checked, json: bool) {
    if json {
        for x in d {
            println!("{}", diag::to_json(x, &c.sources));
        }
    } else {
        let color = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
        eprint!("{}", diag::render(d, &c.sources, color));
    }
}

/// Checks `file` and finds its `main`; otherwise renders why not and gives the exit status.
pub(crate) fn runnable(file: &Path, json: bool) -> Result<(lang::check::Checked, lang::types::FuncId), u8> {
    let mut c = load(file)?;
    if c.has_errors() {
        if crate::spmd::rank() == 0 {
            render(&c.diagnostics, &c, json);
        }
        return Err(1);
    }
    crate::spmd::prepare(&mut c, json, DENY_WARNINGS.load(std::sync::atomic::Ordering::Relaxed))?;
    let Some(main) = c.program.main else {
        let file_id = lang::source::FileId(0);
        let d = Diagnostic::error(
            Code::E0211,
            lang::source::Span::new(file_id, 0, 0),
            "this program has no `main` function",
        )
        .with_help("add `fn main() { … }`; `msl test` runs `test` blocks instead");
        render(&[d], &c, json);
        return Err(1);
    };
    Ok((c, main))
}

/// An interpreter for a program of `file` that prints to stdout, shows the progress of
/// `batches` loops on a terminal and writes what `log_scalar` logs into `logdir`.
///
/// Output is line-buffered even into a pipe or a file: every `print` reaches the reader when it
/// is made, so a long training run logged with `msl run train.msl > log` or `| tee log` can be
/// followed while it runs (what Python does for a terminal, and what training scripts expect of
/// `print(…, flush=True)`). A line costs one write; block buffering would save little next to
/// the tensor work of a line worth printing.
/// `msl run --deny-warnings`: sharding warnings stop the run.
pub(crate) static DENY_WARNINGS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

pub(crate) fn interpreter<'p>(prog: &'p lang::ir::Program, file: &Path, logdir: &Path) -> Interp<'p> {
    // In a sharded run, rank 0 prints: every rank computes the same global values.
    let out: Box<dyn std::io::Write> = if crate::spmd::rank() == 0 {
        Box::new(std::io::LineWriter::new(std::io::stdout().lock()))
    } else {
        Box::new(std::io::sink())
    };
    let mut it = Interp::new(prog, out);
    it.spmd = crate::spmd::job();
    it.scalars = Box::new(crate::metrics::TensorBoard::new(logdir.to_path_buf()));
    it.nan_check = NAN_CHECK.load(std::sync::atomic::Ordering::Relaxed);
    use_device(&mut it);
    it.source_dir = file.parent().map(Path::to_path_buf);
    crate::trace::start(&mut it);
    if std::io::stderr().is_terminal() && crate::spmd::rank() == 0 {
        it.observer = Box::new(Progress { bar: None });
    }
    it
}

/// `msl run --nan-check`, for every interpreter the command makes.
pub(crate) static NAN_CHECK: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// `--device cuda`: the device every interpreter of this process runs its kernels on (the CPU
/// device when unset).
pub(crate) static DEVICE: std::sync::OnceLock<std::sync::Arc<kernels::Offload>> = std::sync::OnceLock::new();

/// Gives `it` the device `--device` chose, if it chose one.
fn use_device(it: &mut Interp<'_>) {
    if let Some(d) = DEVICE.get() {
        it.device = d.clone();
    }
}

pub fn run_cmd(file: &Path, logdir: &Path, json: bool) -> u8 {
    let (c, main) = match runnable(file, json) {
        Ok(x) => x,
        Err(code) => return code,
    };
    let mut it = interpreter(&c.program, file, logdir);
    it.move_at_last_uses();
    let result = crate::alloc::with_sources(&c.sources, || it.run_main(main));
    let traced = crate::trace::finish(&mut it, &c, result.is_ok());
    match result {
        Ok(_) => {
            crate::spmd::comm_report(&c);
            traced.err().unwrap_or(0)
        }
        Err(e) => {
            drop(it);
            run_failed(&e, &c, json)
        }
    }
}

/// Reports a run-time error (naming the rank in a sharded run, whose other ranks it ends).
pub(crate) fn run_failed(e: &lang::interp::RuntimeError, c: &lang::check::Checked, json: bool) -> u8 {
    let mut d = e.to_diagnostic();
    if let Some(j) = crate::spmd::job() {
        if j.comm.world() > 1 {
            d.message = format!("rank {}: {}", j.rank(), d.message);
        }
    }
    render(&[d], c, json);
    crate::spmd::abort_job(2);
    2
}

/// The `.msl` and `.md` files under `paths` (every one named, and those found in folders other
/// than hidden ones, `target/` and `fixtures/`), sorted.
pub(crate) fn collect(paths: &[PathBuf]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let roots: Vec<PathBuf> = if paths.is_empty() { vec![PathBuf::from(".")] } else { paths.to_vec() };
    for p in roots {
        if p.is_dir() {
            let mut stack = vec![p];
            while let Some(d) = stack.pop() {
                let Ok(rd) = std::fs::read_dir(&d) else { continue };
                for e in rd.flatten() {
                    let q = e.path();
                    let name = q.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                    if q.is_dir() {
                        // `fixtures/` holds inputs that the specs beside it use (some, such as
                        // a `use` cycle, do not check by design): the specs test them.
                        if !name.starts_with('.') && name != "target" && name != "fixtures" {
                            stack.push(q);
                        }
                    } else if q.extension().is_some_and(|x| x == "msl" || x == "md") {
                        out.push(q);
                    }
                }
            }
        } else {
            out.push(p);
        }
    }
    out.sort();
    out
}

/// `msl test`: every `test` block and spec example, in the interpreter or, with `jit`, compiled
/// at that level. With `logdir`, what the tests of `f.msl` log goes to `logdir/f`; without it
/// (and always for spec examples) `log_scalar` records nothing.
pub fn test_cmd(paths: &[PathBuf], jit: Option<jit::Options>, logdir: Option<&Path>) -> u8 {
    let mut passed = 0usize;
    // What failed, named as the summary lists it: a test, a spec example, or a whole file that
    // could not be read or does not check (its tests cannot run, so it counts as one failure).
    let mut failures: Vec<String> = Vec::new();
    for f in collect(paths) {
        if f.extension().is_some_and(|x| x == "md") {
            let Ok(text) = std::fs::read_to_string(&f) else {
                println!("file {} ... FAILED (it cannot be read)", f.display());
                failures.push(format!("{} (it cannot be read)", f.display()));
                continue;
            };
            let dir = f.parent().unwrap_or(Path::new(".")).to_path_buf();
            for b in lang::spec::parse_blocks(&text) {
                let out = lang::spec::run_block_prepared(
                    &b.code,
                    &dir,
                    &mut |p| {
                        if let Some(opts) = jit {
                            jit::prepare(p, opts);
                        }
                    },
                    &mut |it| {
                        use_device(it);
                        if let Some(opts) = jit {
                            drop(jit::install(it, opts));
                        }
                    },
                );
                let ok = match &b.expect {
                    // On an accelerator, printed floats agree to the contract's bound for a device.
                    Some((k, _, _, content)) if DEVICE.get().is_some() => {
                        k == out.kind() && lang::spec::outputs_agree(content, out.text())
                    }
                    Some((k, _, _, content)) => k == out.kind() && content == out.text(),
                    None => out.kind() == "output" && !out.text().contains("error["),
                };
                let label = format!("{}:{}", f.display(), b.start + 1);
                if ok {
                    passed += 1;
                } else {
                    println!("FAILED {label}\n{}", out.text());
                    failures.push(label);
                }
            }
            continue;
        }
        let mut c = match load(&f) {
            Ok(c) => c,
            Err(_) => {
                println!("file {} ... FAILED (it cannot be read)", f.display());
                failures.push(format!("{} (it cannot be read)", f.display()));
                continue;
            }
        };
        if c.has_errors() {
            println!("file {} ... FAILED (it does not check; its tests did not run)", f.display());
            render(&c.diagnostics, &c, false);
            failures.push(format!("{} (it does not check)", f.display()));
            continue;
        }
        if let Some(opts) = jit {
            jit::prepare(&mut c.program, opts);
        }
        // One event file per test file, shared by its tests.
        let log = logdir.map(|d| {
            let dir = d.join(f.file_stem().unwrap_or_default());
            std::rc::Rc::new(std::cell::RefCell::new(crate::metrics::TensorBoard::new(dir)))
        });
        for t in &c.program.tests {
            let mut it = Interp::new(&c.program, Box::new(std::io::stdout()));
            use_device(&mut it);
            it.source_dir = f.parent().map(Path::to_path_buf);
            if let Some(log) = &log {
                it.scalars = Box::new(crate::metrics::Shared(log.clone()));
            }
            match jit {
                Some(opts) => drop(jit::install(&mut it, opts)),
                None => it.move_at_last_uses(),
            }
            match crate::alloc::with_sources(&c.sources, || it.run_main(t.func)) {
                Ok(_) => {
                    passed += 1;
                    println!("test {} \"{}\" ... ok", f.display(), t.name);
                }
                Err(e) => {
                    println!("test {} \"{}\" ... FAILED", f.display(), t.name);
                    failures.push(format!("{} \"{}\"", f.display(), t.name));
                    drop(it);
                    render(&[e.to_diagnostic()], &c, false);
                }
            }
        }
    }
    if !failures.is_empty() {
        println!("\nfailures:");
        for name in &failures {
            println!("    {name}");
        }
    }
    println!("{passed} passed, {} failed", failures.len());
    u8::from(!failures.is_empty())
}

pub fn grad_cmd(file: &Path, name: &str, wrt: Option<&str>, explain: bool) -> u8 {
    let mut c = match load(file) {
        Ok(c) => c,
        Err(code) => return code,
    };
    if c.has_errors() {
        render(&c.diagnostics, &c, false);
        return 1;
    }
    let Some(&(_, fid)) = c.program.root_funcs.iter().find(|(n, _)| n == name) else {
        let names: Vec<&str> = c.program.root_funcs.iter().map(|(n, _)| n.as_str()).collect();
        eprintln!("error: `{}` has no function `{name}` (its functions: {})", file.display(), names.join(", "));
        return 1;
    };
    let f = c.program.func(fid).clone();
    let span = c.program.span(f.span);
    let wrt_index = match wrt {
        None => 0,
        Some(w) => match f.params.iter().position(|l| c.program.names.get(f.locals[l.0 as usize].name) == w) {
            Some(i) => i,
            None => {
                eprintln!("error: `{name}` has no parameter `{w}`");
                return 1;
            }
        },
    };
    // The same checks `grad(f)` gets in a program: a float scalar result, a float parameter.
    let param_ty = f.params.get(wrt_index).map(|l| f.locals[l.0 as usize].ty.clone());
    let ok_ret =
        matches!(&f.ret, lang::types::Type::Tensor(TensorTy { elem: e, shape: s, .. }) if s.is_empty() && e.is_float());
    if !ok_ret {
        let d = Diagnostic::error(
            Code::E0401,
            span,
            format!("`{name}` does not return a float scalar, so it has no gradient"),
        );
        render(&[d], &c, false);
        return 1;
    }
    if !param_ty.as_ref().is_some_and(|t| {
        matches!(t, lang::types::Type::Tensor(TensorTy { elem: e, .. }) if e.is_float()) || t.is_model()
    }) {
        let d = Diagnostic::error(
            Code::E0402,
            span,
            format!("cannot differentiate `{name}` with respect to parameter {wrt_index}: it is not a float value"),
        );
        render(&[d], &c, false);
        return 1;
    }
    let mode = lang::autodiff::Mode::Grad { wrt: wrt_index };
    let d = match lang::autodiff::derive(&mut c.program, fid, mode, span) {
        Ok(d) => d,
        Err(diag) => {
            render(&[diag], &c, false);
            return 1;
        }
    };
    let pname = f
        .params
        .get(wrt_index)
        .map(|l| c.program.names.get(c.program.func(fid).locals[l.0 as usize].name).to_string())
        .unwrap_or_default();
    let gname = format!("grad_{name}_{pname}");
    println!("// The gradient of `{name}` with respect to `{pname}`, generated by msl's reverse-mode pass.");
    // Tapes of loop states are internal values with no msl syntax: the derivative is shown in
    // its recomputing form (its twin), which computes the same values and checks as msl.
    let shown = c.program.derived.transformable(d);
    if shown != d {
        println!(
            "// Its loops run with a tape of their states; shown here recomputing each state from the loop's start."
        );
    }
    print!("{}", lang::ir::source::function_source(&c.program, c.program.func(shown), &gname));
    if explain {
        let func = c.program.func(d);
        let res = c.program.derived.residuals.get(&d).cloned().unwrap_or_default();
        println!("\n// Saved for the backward pass ({} values):", res.len());
        for l in res {
            let ty = lang::types::type_str(&func.locals[l.0 as usize].ty, &c.program);
            println!("//   v_{}: {ty}", l.0);
        }
    }
    0
}
