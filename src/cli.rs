//! Argument parsing (clap) and the subcommands.

use clap::{Parser, Subcommand, ValueEnum};
use lang::check::{self, Checked};
use lang::diag;
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::Arc;

#[derive(Parser)]
#[command(name = "msl", version, about = "msl: a statically shape-typed language for tensor models")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq)]
enum MessageFormat {
    Human,
    Short,
    Json,
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq)]
enum Emit {
    Ir,
    /// Every collective the sharding pass inserts for the file's mesh.
    Collectives,
    /// The static schedule of every `@pipeline` function, per stage and time step.
    Schedule,
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq)]
enum Mode {
    Eager,
    Jit,
}

/// `--device cpu`, `cuda` or `cuda:N`. CUDA is accepted so that a program asking for a GPU
/// gets a clear answer (the contract's exit 2); `--help` lists only what runs in this build.
/// `cuda` alone is GPU 0, or under a launcher the GPU of the rank's local rank.
#[derive(Clone, Copy, PartialEq, Eq)]
enum DeviceKind {
    Cpu,
    Cuda(Option<u32>),
}

/// Opens the device a run asks for and gives it to every interpreter of this process
/// (`run::DEVICE`): nothing for the CPU; for CUDA, the GPU behind `kernels::Offload` (the kernels
/// the CUDA device has run on it, the rest on the CPU). `Err`: its name and why it cannot run here.
fn open_device(device: DeviceKind) -> Result<(), (String, String)> {
    let DeviceKind::Cuda(n) = device else { return Ok(()) };
    let n = n.unwrap_or_else(|| dist::launcher_local_rank().unwrap_or(0) as u32);
    let name = format!("cuda:{n}");
    if !kernels::cuda::driver_present() {
        return Err((name, "the CUDA driver (libcuda.so) is not on this machine".into()));
    }
    let gpu = kernels::cuda::CudaDevice::new(n as usize).map_err(|e| (name, e.to_string()))?;
    let _ = crate::run::DEVICE.set(Arc::new(kernels::Offload::new(Arc::new(gpu))));
    Ok(())
}

/// After a run on an offloading device: how many launches ran where (stderr).
fn device_note() {
    if let Some(off) = crate::run::DEVICE.get() {
        let (accel, host) = off.counts();
        let (up, down) = off.bytes_moved();
        let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
        eprintln!(
            "note: {} ran {accel} of the run's {} kernel launches, the CPU the rest (the CUDA device has only some kernels yet); \
             {:.1} MiB went there and {:.1} MiB came back",
            kernels::Device::name(off.as_ref()),
            accel + host,
            mib(up),
            mib(down)
        );
    }
}

fn parse_device(s: &str) -> Result<DeviceKind, String> {
    match s {
        "cpu" => Ok(DeviceKind::Cpu),
        "cuda" => Ok(DeviceKind::Cuda(None)),
        _ => s
            .strip_prefix("cuda:")
            .and_then(|n| n.parse().ok())
            .map(|n| DeviceKind::Cuda(Some(n)))
            .ok_or_else(|| format!("`{s}` is not a device: use `cpu`, `cuda` or `cuda:N`")),
    }
}

/// The mode and JIT level a command runs with: an explicit `-O` asks for compiled code, so it
/// selects `--mode jit` unless `--mode` says otherwise; with `--mode eager` the level has
/// nothing to apply to, which msl notes on stderr. A level past 2 is an error (exit 2).
fn mode_and_level(mode: Option<Mode>, opt: Option<u8>) -> Result<(Mode, u8), u8> {
    let level = opt.unwrap_or(1);
    if level > 2 {
        eprintln!("error: `-O{level}` is not an optimisation level (use 0, 1 or 2)");
        return Err(2);
    }
    Ok(match (mode, opt) {
        (Some(Mode::Eager), Some(o)) => {
            eprintln!("note: -O{o} applies to --mode jit; running eagerly");
            (Mode::Eager, level)
        }
        (Some(m), _) => (m, level),
        (None, Some(_)) => (Mode::Jit, level),
        (None, None) => (Mode::Eager, level),
    })
}

#[derive(Subcommand)]
enum Cmd {
    /// Check a program, then run its `main`.
    Run {
        file: PathBuf,
        /// Eager interpretation (the default) or JIT compilation (the default with `-O`).
        #[arg(long, value_enum)]
        mode: Option<Mode>,
        /// Optimisation level of the JIT (0, 1 or 2; default 1); given alone, it selects `--mode jit`.
        #[arg(short = 'O')]
        opt: Option<u8>,
        /// The device that runs the program.
        #[arg(long, value_parser = parse_device, default_value = "cpu")]
        device: DeviceKind,
        #[arg(long, value_enum, default_value = "human")]
        message_format: MessageFormat,
        /// With `--mode jit`: print what was fused and every fallback (on stderr).
        #[arg(long)]
        explain: bool,
        /// Stop at the first primitive whose result holds a NaN or an infinity (exit 2, naming
        /// it and its line); every primitive then runs on its own, nothing is compiled.
        #[arg(long)]
        nan_check: bool,
        /// Run on N processes: starts `mpirun -n N` with this command (Open MPI).
        #[arg(long, value_name = "N")]
        ranks: Option<usize>,
        /// Mesh axis sizes replacing the file's, e.g. `--mesh dp=4,mp=1`.
        #[arg(long, value_name = "AXIS=SIZE,…")]
        mesh: Option<String>,
        /// Constants of the file replaced, e.g. `--const LR=0.01,EPOCHS=3` (for `const LR = …`).
        #[arg(long = "const", value_name = "NAME=VALUE,…")]
        consts: Option<String>,
        /// Make warnings (such as W0510, an unrequested redistribution) errors.
        #[arg(long)]
        deny_warnings: bool,
        /// In a sharded run: after the run, list the bytes each collective sent from rank 0, as
        /// the communicator counted them (compare `msl check --emit collectives`).
        #[arg(long)]
        comm_report: bool,
        /// Write a timeline of the run to FILE (Chrome trace events: open it in Perfetto):
        /// every kernel, collective, fused tree and call, each rank a process.
        #[arg(long, value_name = "FILE")]
        trace: Option<PathBuf>,
        /// The folder `log_scalar` writes TensorBoard event files into (default: `runs/<file
        /// stem>` in the working directory).
        #[arg(long, value_name = "DIR")]
        logdir: Option<PathBuf>,
    },
    /// Draw every scalar logged with `log_scalar` (TensorBoard event files) against its step.
    Plot {
        /// Log folders: each folder under them that holds event files is one run.
        #[arg(required = true, value_name = "LOGDIR")]
        logdirs: Vec<PathBuf>,
        /// The picture to write: `.png` or `.svg` (`.csv` writes the points instead).
        #[arg(short, long, value_name = "FILE", default_value = "plot.png")]
        output: PathBuf,
        /// Draw only these tags (repeat for several; default: every tag).
        #[arg(long, value_name = "TAG")]
        tag: Vec<String>,
        /// A logarithmic value axis (for losses that fall by orders of magnitude); values ≤ 0
        /// are left out.
        #[arg(long)]
        log_y: bool,
    },
    /// Print the derivative of a function as msl source.
    Grad {
        file: PathBuf,
        /// The function to differentiate (its result must be a float scalar).
        func: String,
        /// The parameter to differentiate with respect to (default: the first).
        #[arg(long)]
        wrt: Option<String>,
        /// Also list the values the backward pass keeps from the forward pass.
        #[arg(long)]
        explain: bool,
    },
    /// Run `test` blocks of .msl files and the examples of spec/*.md files.
    Test {
        /// Files or folders (default: the current folder).
        paths: Vec<PathBuf>,
        /// Eager interpretation (the default) or JIT compilation (the default with `-O`).
        #[arg(long, value_enum)]
        mode: Option<Mode>,
        /// Optimisation level of the JIT (0, 1 or 2; default 1); given alone, it selects `--mode jit`.
        #[arg(short = 'O')]
        opt: Option<u8>,
        /// Mesh axis sizes replacing the files', e.g. `--mesh dp=4,mp=1`.
        #[arg(long, value_name = "AXIS=SIZE,…")]
        mesh: Option<String>,
        /// Constants of the file replaced, e.g. `--const LR=0.01,EPOCHS=3` (for `const LR = …`).
        #[arg(long = "const", value_name = "NAME=VALUE,…")]
        consts: Option<String>,
        /// Write what tests log with `log_scalar` under `DIR/<file stem>` (default: nothing is
        /// written).
        #[arg(long, value_name = "DIR")]
        logdir: Option<PathBuf>,
        /// The device the tests run on; on an absent device they are skipped, with the reason.
        #[arg(long, value_parser = parse_device, default_value = "cpu")]
        device: DeviceKind,
    },
    /// Type-check files (names, types and every tensor shape) without running them.
    Check {
        /// Files, or folders: every `.msl` file under them.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// How diagnostics are printed.
        #[arg(long, value_enum, default_value = "human")]
        message_format: MessageFormat,
        /// Also print the typed IR of each file that checks.
        #[arg(long, value_enum)]
        emit: Option<Emit>,
        /// Mesh axis sizes replacing the files', e.g. `--mesh dp=4,mp=1`.
        #[arg(long, value_name = "AXIS=SIZE,…")]
        mesh: Option<String>,
        /// Constants of the file replaced, e.g. `--const LR=0.01,EPOCHS=3` (for `const LR = …`).
        #[arg(long = "const", value_name = "NAME=VALUE,…")]
        consts: Option<String>,
    },
    /// Report what each of N devices would hold and send in a training step, without running
    /// anything (no kernel runs; only the headers of loaded files are read).
    Dryrun {
        file: PathBuf,
        /// The number of devices (ranks) the job would have.
        #[arg(long, value_name = "N")]
        devices: i64,
        /// Mesh axis sizes replacing the file's, e.g. `--mesh dp=4,mp=1`.
        #[arg(long, value_name = "AXIS=SIZE,…")]
        mesh: Option<String>,
        /// Constants of the file replaced, e.g. `--const LR=0.01,EPOCHS=3` (for `const LR = …`).
        #[arg(long = "const", value_name = "NAME=VALUE,…")]
        consts: Option<String>,
        /// Try every assignment of mesh sizes whose product is N and propose the fastest that
        /// fits `--memory`, as a patch to the file's `mesh` line.
        #[arg(long)]
        search: bool,
        /// The memory of one device (e.g. `16GiB`): `--search` keeps what fits; otherwise a
        /// peak above it is exit 2. Default for `--search`: 16GiB.
        #[arg(long, value_name = "SIZE")]
        memory: Option<String>,
    },
    /// Start the language server (LSP over stdin/stdout) for editors.
    Lsp,
    /// Start an interactive session; `:help` inside lists its commands.
    Repl {
        /// Eager interpretation, or with the JIT (`-O1`: compiled scalar loops and fused
        /// elementwise trees; compiled code is reused by later inputs).
        #[arg(long, value_enum, default_value = "eager")]
        mode: Mode,
        /// The folder `log_scalar` writes TensorBoard event files into (default: `runs/repl`).
        #[arg(long, value_name = "DIR")]
        logdir: Option<PathBuf>,
    },
}

pub fn main() -> u8 {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() { 2 } else { 0 };
            let _ = e.print();
            return code;
        }
    };
    match cli.cmd {
        Cmd::Check { files, message_format, emit, mesh, consts } => {
            if let Err(code) = mesh_override(mesh.as_deref()).and_then(|_| const_override(consts.as_deref())) {
                return code;
            }
            check_cmd(&files, message_format, emit)
        }
        Cmd::Run {
            file,
            mode,
            opt,
            device,
            message_format,
            explain,
            nan_check,
            logdir,
            ranks,
            mesh,
            consts,
            deny_warnings,
            comm_report,
            trace,
        } => {
            if let Some(n) = ranks {
                if n == 0 {
                    eprintln!("error: `--ranks` must be at least 1");
                    return 2;
                }
                return crate::spmd::launch(n);
            }
            if let Err(code) = mesh_override(mesh.as_deref()).and_then(|_| const_override(consts.as_deref())) {
                return code;
            }
            crate::run::DENY_WARNINGS.store(deny_warnings, std::sync::atomic::Ordering::Relaxed);
            let logdir = logdir.unwrap_or_else(|| crate::metrics::default_logdir(&file));
            crate::run::NAN_CHECK.store(nan_check, std::sync::atomic::Ordering::Relaxed);
            crate::spmd::COMM_REPORT.store(comm_report, std::sync::atomic::Ordering::Relaxed);
            if let Some(t) = trace {
                let _ = crate::trace::TRACE.set(t);
            }
            if let Err((name, why)) = open_device(device) {
                eprintln!("error: no CUDA device `{name}`: {why}; run with `--device cpu`");
                return 2;
            }
            let (mode, opt) = match mode_and_level(mode, opt) {
                Ok(x) => x,
                Err(code) => return code,
            };
            let code = if mode == Mode::Jit {
                crate::jit_cmd::run(&file, &logdir, opt, explain, message_format == MessageFormat::Json)
            } else {
                if explain {
                    eprintln!("note: `--explain` describes compiled code; add `--mode jit` to see it");
                }
                crate::run::run_cmd(&file, &logdir, message_format == MessageFormat::Json)
            };
            device_note();
            code
        }
        Cmd::Test { paths, mode, opt, mesh, consts, logdir, device } => {
            if let Err(code) = mesh_override(mesh.as_deref()).and_then(|_| const_override(consts.as_deref())) {
                return code;
            }
            if let Err((name, why)) = open_device(device) {
                println!("skipped: every test of this run: no CUDA device `{name}`: {why}");
                return 0;
            }
            let (mode, opt) = match mode_and_level(mode, opt) {
                Ok(x) => x,
                Err(code) => return code,
            };
            let code =
                crate::run::test_cmd(&paths, (mode == Mode::Jit).then(|| jit::Options::level(opt)), logdir.as_deref());
            device_note();
            code
        }
        Cmd::Dryrun { file, devices, mesh, consts, search, memory } => {
            if let Err(code) = const_override(consts.as_deref()) {
                return code;
            }
            crate::dryrun::main(&crate::dryrun::Args {
                file: &file,
                devices,
                mesh: mesh.as_deref(),
                search,
                memory: memory.as_deref(),
            })
        }
        Cmd::Lsp => lsp::run(),
        Cmd::Repl { mode, logdir } => {
            crate::repl::main(mode == Mode::Jit, logdir.unwrap_or_else(|| PathBuf::from("runs/repl")))
        }
        Cmd::Plot { logdirs, output, tag, log_y } => crate::plot::plot_cmd(&logdirs, &output, &tag, log_y),
        Cmd::Grad { file, func, wrt, explain } => crate::run::grad_cmd(&file, &func, wrt.as_deref(), explain),
    }
}

/// Checks one file; `Err` carries the exit status of an I/O failure already reported.
pub(crate) fn load(path: &Path) -> Result<Checked, u8> {
    match check::check_file(path) {
        Ok(c) => Ok(c),
        Err(e) => {
            eprintln!("error: cannot read `{}`: {e}", path.display());
            Err(2)
        }
    }
}

/// Prints diagnostics in the chosen format; returns true when there were errors.
fn report(c: &Checked, format: MessageFormat) -> bool {
    match format {
        MessageFormat::Json => {
            for d in &c.diagnostics {
                println!("{}", diag::to_json(d, &c.sources));
            }
        }
        MessageFormat::Short => eprint!("{}", diag::render_short(&c.diagnostics, &c.sources)),
        MessageFormat::Human => {
            if !c.diagnostics.is_empty() {
                let color = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
                eprint!("{}", diag::render(&c.diagnostics, &c.sources, color));
            }
        }
    }
    c.has_errors()
}

fn check_cmd(files: &[PathBuf], format: MessageFormat, emit: Option<Emit>) -> u8 {
    let mut status = 0;
    // A folder stands for the `.msl` files under it (as `msl test` finds them).
    let mut expanded = Vec::new();
    for f in files {
        if f.is_dir() {
            let found: Vec<PathBuf> = crate::run::collect(std::slice::from_ref(f))
                .into_iter()
                .filter(|p| p.extension().is_some_and(|x| x == "msl"))
                .collect();
            if found.is_empty() {
                // Nothing to check is a mistake, as a missing file is (exit 2).
                eprintln!("error: no `.msl` files under `{}`", f.display());
                status = 2;
            }
            expanded.extend(found);
        } else {
            expanded.push(f.clone());
        }
    }
    for f in &expanded {
        let c = match load(f) {
            Ok(c) => c,
            Err(code) => {
                status = status.max(code);
                continue;
            }
        };
        if report(&c, format) {
            status = status.max(1);
            continue;
        }
        let mut problems = c.program.malformed.clone();
        if problems.is_empty() && !lang::passes::verifying() {
            problems = lang::ir::verify::verify(&c.program);
        }
        if !problems.is_empty() {
            eprintln!("error: internal compiler error: the typed IR of `{}` is malformed:", f.display());
            for p in problems {
                eprintln!("  {p}");
            }
            status = status.max(2);
            continue;
        }
        if emit == Some(Emit::Ir) {
            print!("{}", lang::ir::dump::dump(&c.program));
        }
        if emit == Some(Emit::Schedule) {
            print!("{}", schedule_text(&c.program, f));
        }
        if emit == Some(Emit::Collectives) {
            let mut c = c;
            match collectives_text(&mut c, f) {
                Ok(text) => print!("{text}"),
                Err(why) => {
                    eprintln!("error: {}: {why}", f.display());
                    status = status.max(2);
                }
            }
        }
    }
    if status == 0 && format == MessageFormat::Human {
        let n = expanded.len();
        eprintln!("ok: {n} file{} checked", if n == 1 { "" } else { "s" });
    }
    status
}

/// `msl check --emit schedule`: each `@pipeline` function's schedule for the file's mesh, as
/// the checker built and proved it.
fn schedule_text(p: &lang::ir::Program, f: &Path) -> String {
    if p.pipelines.is_empty() {
        return format!("{}: no `@pipeline` function, so no schedule\n", f.display());
    }
    let mesh = lang::dist::Mesh::of(p);
    let mut out = String::new();
    for pl in &p.pipelines {
        let name = p.names.get(p.func(pl.func).name);
        let stages = pl.stages(mesh.as_ref());
        let axis = match (pl.axis, &mesh) {
            (Some(a), Some(m)) => m.names[a.0 as usize].clone(),
            _ => "(no axis)".to_string(),
        };
        out.push_str(&format!("{}: `{name}` on {axis} = {stages}\n", f.display()));
        match pl.proved(stages).map(|(s, t)| lang::shard::schedule::render(&s, &t)) {
            Ok(t) => out.push_str(t.trim_end()),
            Err(e) => out.push_str(&format!("error: {e}")),
        }
        out.push('\n');
    }
    out
}

/// `msl check --emit collectives`: partitions the program for its mesh and lists what the
/// pass inserted, one line each (location, kind, axes, element type, global shape, bytes per
/// rank), then the warnings.
fn collectives_text(c: &mut lang::check::Checked, f: &std::path::Path) -> Result<String, String> {
    let Some(mesh) = lang::dist::Mesh::of(&c.program) else {
        return Ok(format!("{}: no mesh, so no collectives\n", f.display()));
    };
    let report = lang::passes::shard(&mut c.program);
    if let Some(why) = lang::passes::malformed(&c.program) {
        return Err(why);
    }
    let axes: Vec<String> = mesh.names.iter().zip(&mesh.sizes).map(|(n, s)| format!("{n} = {s}")).collect();
    let mut out = format!("{}: {} collectives on mesh [{}]\n", f.display(), report.collectives.len(), axes.join(", "));
    for k in &report.collectives {
        let (line, col) = c.sources.line_col(k.span.file, k.span.start);
        let why = if k.requested { "" } else { "  (W0510: not asked for by an annotation)" };
        let sites: Vec<String> =
            std::iter::once(k.site).chain(k.same.iter().copied()).map(|s| format!("#{s}")).collect();
        out.push_str(&format!(
            "  {}  {line}:{col}  {}  over {}  {}{}  {} bytes per rank{why}\n",
            sites.join(","),
            k.prim.name(),
            k.axes.join(", "),
            k.elem,
            k.shape,
            k.bytes
        ));
    }
    if !report.warnings.is_empty() {
        crate::run::render(&report.warnings, c, false);
    }
    Ok(out)
}

/// Applies `--const NAME=VALUE,…`; a malformed value is a usage error (exit 2).
fn const_override(consts: Option<&str>) -> Result<(), u8> {
    let Some(text) = consts else { return Ok(()) };
    let mut out: Vec<(String, check::ConstValue)> = Vec::new();
    for part in text.split(',') {
        let Some((name, value)) = part.split_once('=') else {
            eprintln!("error: `--const {text}`: expected `NAME=VALUE` pairs such as `LR=0.01,EPOCHS=3`");
            return Err(2);
        };
        let (name, value) = (name.trim(), value.trim());
        let v = match value {
            "true" => check::ConstValue::Bool(true),
            "false" => check::ConstValue::Bool(false),
            _ => match (value.parse::<i64>(), value.parse::<f64>()) {
                (Ok(n), _) => check::ConstValue::Int(n),
                (_, Ok(x)) if x.is_finite() => check::ConstValue::Float(x),
                _ => {
                    eprintln!("error: `--const {name}={value}`: the value must be a number, `true` or `false`");
                    return Err(2);
                }
            },
        };
        if name.is_empty() || out.iter().any(|(n, _)| n == name) {
            eprintln!("error: `--const {text}`: each constant is named once");
            return Err(2);
        }
        out.push((name.to_string(), v));
    }
    check::set_const_override(out);
    Ok(())
}

/// Applies `--mesh`; a malformed value is a usage error (exit 2).
fn mesh_override(mesh: Option<&str>) -> Result<(), u8> {
    let Some(m) = mesh else { return Ok(()) };
    match crate::spmd::parse_mesh(m) {
        Ok(sizes) => {
            lang::check::set_mesh_override(sizes);
            Ok(())
        }
        Err(e) => {
            eprintln!("error: {e}");
            Err(2)
        }
    }
}
