//! `log_scalar` and `msl plot` from the outside: the event files every engine writes are read
//! back by TensorBoard's own reader (`EventAccumulator`, in a venv made under `target/`; the
//! test says so and skips that part when python3, venv or pip is unavailable), only rank 0
//! writes, an unwritable log folder is a run-time error, and `msl plot` draws valid PNG and SVG
//! pictures or stops with exit 2 and a message.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

mod common;

fn scratch(name: &str, files: &[(&str, &str)]) -> PathBuf {
    common::scratch("tb", name, files)
}

fn msl_cmd(dir: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_msl"));
    c.args(args).current_dir(dir).env_remove("RUST_BACKTRACE").env("NO_COLOR", "1").stdin(Stdio::null());
    for v in ["OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"] {
        c.env_remove(v);
    }
    c
}

fn msl(dir: &Path, args: &[&str]) -> Output {
    msl_cmd(dir, args).output().expect("run msl")
}

fn text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The event files in `dir`.
fn event_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| rd.flatten().map(|e| e.path()).filter(|p| p.to_string_lossy().contains("tfevents")).collect())
        .unwrap_or_default();
    v.sort();
    v
}

/// Logs a known series: `loss` = 1/(step+1) and `acc/test` = step/4 for steps 0..5, an `i32`
/// value, an `f64` one and a negative step.
const PROGRAM: &str = r#"
fn main() {
    for step in 0..5 {
        log_scalar("loss", step, 1.0 / f32(step + 1))
        log_scalar("acc/test", step, f32(step) * 0.25)
    }
    let big: f64 = 12345.5
    log_scalar("count", 10, 42)
    log_scalar("wide", 7, big)
    log_scalar("before", -2, -1.5)
    print("logged")
}
"#;

/// What `PROGRAM` logs, per tag in tag order: (step, value as the f32 stored).
fn expected() -> Vec<(String, Vec<(i64, f64)>)> {
    let s = |n: &str| n.to_string();
    vec![
        (s("acc/test"), (0..5).map(|i| (i, (i as f32 * 0.25) as f64)).collect()),
        (s("before"), vec![(-2, -1.5)]),
        (s("count"), vec![(10, 42.0)]),
        (s("loss"), (0..5).map(|i| (i, (1.0 / (i as f32 + 1.0)) as f64)).collect()),
        (s("wide"), vec![(7, 12345.5)]),
    ]
}

const ENGINES: [&[&str]; 4] = [&[], &["--mode", "jit", "-O0"], &["--mode", "jit", "-O1"], &["--mode", "jit", "-O2"]];

/// Runs `PROGRAM` in every engine, each into its own `--logdir`; returns the folders.
fn log_in_every_engine(dir: &Path) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    for (i, engine) in ENGINES.iter().enumerate() {
        let logdir = dir.join(format!("engine{i}"));
        let mut args = vec!["run"];
        args.extend_from_slice(engine);
        let l = logdir.to_string_lossy().into_owned();
        args.extend_from_slice(&["--logdir", &l, "prog.msl"]);
        let o = msl(dir, &args);
        assert!(o.status.success(), "{engine:?}: {}", text(&o));
        assert_eq!(String::from_utf8_lossy(&o.stdout), "logged\n");
        assert_eq!(event_files(&logdir).len(), 1, "{engine:?} writes one event file into {}", logdir.display());
        dirs.push(logdir);
    }
    dirs
}

/// A Python with the `tensorboard` package: a venv under `target/` made on first use. `Err`
/// says why there is none.
fn tensorboard_python() -> Result<PathBuf, String> {
    let venv = Path::new(env!("CARGO_TARGET_TMPDIR")).join("tensorboard-venv");
    let python = venv.join("bin/python");
    let has_tb = |py: &Path| {
        Command::new(py)
            .args(["-c", "import tensorboard.backend.event_processing.event_accumulator"])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if has_tb(&python) {
        return Ok(python);
    }
    // Made beside, then renamed into place, so a second test run at the same time never
    // sees half a venv.
    let tmp = venv.with_file_name(format!("tensorboard-venv.tmp-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    let run = |c: &mut Command, what: &str| -> Result<(), String> {
        let o = c.output().map_err(|e| format!("{what}: {e}"))?;
        if o.status.success() {
            Ok(())
        } else {
            Err(format!("{what} failed: {}", String::from_utf8_lossy(&o.stderr).lines().last().unwrap_or("")))
        }
    };
    run(Command::new("python3").arg("-m").arg("venv").arg(&tmp), "python3 -m venv")?;
    let tmp_py = tmp.join("bin/python");
    run(
        Command::new(&tmp_py).args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check", "tensorboard"]),
        "pip install tensorboard",
    )?;
    if std::fs::rename(&tmp, &venv).is_err() {
        let _ = std::fs::remove_dir_all(&tmp);
    }
    if has_tb(&python) {
        Ok(python)
    } else {
        Err("the venv has no importable tensorboard".into())
    }
}

/// What TensorBoard's `EventAccumulator` reads from `logdir`: per tag, (step, value).
fn read_with_tensorboard(python: &Path, logdir: &Path) -> Vec<(String, Vec<(i64, f64)>)> {
    let script = r#"
import json, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
acc = EventAccumulator(sys.argv[1], size_guidance={"scalars": 0})
acc.Reload()
print(json.dumps({t: [[e.step, e.value] for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}))
"#;
    let o = Command::new(python).arg("-c").arg(script).arg(logdir).output().expect("run python");
    assert!(o.status.success(), "EventAccumulator failed: {}", String::from_utf8_lossy(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("json from the reader");
    let mut out: Vec<(String, Vec<(i64, f64)>)> = v
        .as_object()
        .expect("an object of tags")
        .iter()
        .map(|(tag, pts)| {
            let pts = pts
                .as_array()
                .expect("points")
                .iter()
                .map(|p| (p[0].as_i64().expect("a step"), p[1].as_f64().expect("a value")))
                .collect();
            (tag.clone(), pts)
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

#[test]
fn tensorboard_reads_what_every_engine_logs() {
    let dir = scratch("read", &[("prog.msl", PROGRAM)]);
    let dirs = log_in_every_engine(&dir);
    match tensorboard_python() {
        Ok(python) => {
            for d in &dirs {
                assert_eq!(read_with_tensorboard(&python, d), expected(), "as read from {}", d.display());
            }
            msl_reads_what_tensorboard_writes(&python, &dir);
        }
        Err(why) => {
            eprintln!("SKIPPED: reading the event files with TensorBoard's EventAccumulator: {why}");
            println!("SKIPPED: reading the event files with TensorBoard's EventAccumulator: {why}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `msl plot` reads the scalars of TensorBoard's own writer: `simple_value`s (PyTorch's kind) and
/// TensorFlow 2's tensors of the `scalars` plugin (`float_val` and `tensor_content`).
fn msl_reads_what_tensorboard_writes(python: &Path, dir: &Path) {
    let script = r#"
import struct, sys
from tensorboard.summary.writer.event_file_writer import EventFileWriter
from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, types_pb2
w = EventFileWriter(sys.argv[1])
meta = summary_pb2.SummaryMetadata(plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"))
for step in range(3):
    vals = [
        summary_pb2.Summary.Value(tag="simple", simple_value=0.5 * step),
        summary_pb2.Summary.Value(tag="tf2/float_val", metadata=meta,
            tensor=tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT, float_val=[0.25 * step])),
        summary_pb2.Summary.Value(tag="tf2/content", metadata=meta,
            tensor=tensor_pb2.TensorProto(dtype=types_pb2.DT_DOUBLE, tensor_content=struct.pack("<d", 1.5 * step))),
    ]
    w.add_event(event_pb2.Event(step=step, wall_time=1.0 + step, summary=summary_pb2.Summary(value=vals)))
w.close()
"#;
    let logdir = dir.join("by-tensorboard");
    let o = Command::new(python).arg("-c").arg(script).arg(&logdir).output().expect("run python");
    assert!(o.status.success(), "TensorBoard's writer failed: {}", String::from_utf8_lossy(&o.stderr));
    let o = msl(dir, &["plot", "by-tensorboard", "-o", "points.csv"]);
    assert!(o.status.success(), "{}", text(&o));
    let csv = std::fs::read_to_string(dir.join("points.csv")).expect("the csv");
    let mut want = String::from("run,tag,step,value\n");
    for (tag, f) in [("simple", 0.5), ("tf2/content", 1.5), ("tf2/float_val", 0.25)] {
        for step in 0..3 {
            want.push_str(&format!("by-tensorboard,{tag},{step},{}\n", f * step as f64));
        }
    }
    assert_eq!(csv, want);
}

#[test]
fn the_default_logdir_is_runs_and_the_file_stem_and_nothing_is_made_without_a_log() {
    let dir = scratch("default", &[("prog.msl", PROGRAM), ("quiet.msl", "fn main() { print(1) }\n")]);
    let o = msl(&dir, &["run", "prog.msl"]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(event_files(&dir.join("runs/prog")).len(), 1);
    // A second run adds a file beside the first; TensorBoard shows the latest steps.
    let o = msl(&dir, &["run", "--mode", "jit", "prog.msl"]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(event_files(&dir.join("runs/prog")).len(), 2);
    let o = msl(&dir, &["run", "quiet.msl"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(!dir.join("runs/quiet").exists(), "a program that logs nothing makes no folder");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn only_rank_0_of_a_distributed_run_writes() {
    let dir = scratch("rank", &[("prog.msl", PROGRAM)]);
    for (var, rank, writes) in
        [("OMPI_COMM_WORLD_RANK", "1", false), ("PMI_RANK", "3", false), ("OMPI_COMM_WORLD_RANK", "0", true)]
    {
        let logdir = dir.join(format!("{var}-{rank}"));
        let o = msl_cmd(&dir, &["run", "--logdir", &logdir.to_string_lossy(), "prog.msl"])
            .env(var, rank)
            .output()
            .expect("run msl");
        assert!(o.status.success(), "{}", text(&o));
        assert_eq!(logdir.exists(), writes, "{var}={rank}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_logdir_that_cannot_be_made_is_a_run_time_error() {
    let dir = scratch("unwritable", &[("prog.msl", PROGRAM), ("file", "not a folder")]);
    for engine in ENGINES {
        let mut args = vec!["run"];
        args.extend_from_slice(engine);
        args.extend_from_slice(&["--logdir", "file/sub", "prog.msl"]);
        let o = msl(&dir, &args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{engine:?}: {}", text(&o));
        assert!(err.contains("E0601") && err.contains("cannot write TensorBoard events into `file/sub`"), "{err}");
        assert!(!err.contains("panicked") && !err.contains("internal compiler error"), "{err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn msl_test_logs_only_with_a_logdir_and_the_repl_logs_to_its_own() {
    let prog = "test \"logs\" {\n    log_scalar(\"t\", 1, 2.0)\n}\n";
    let dir = scratch("test", &[("t.msl", prog)]);
    let o = msl(&dir, &["test", "t.msl"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(!dir.join("runs").exists(), "`msl test` writes nothing unless asked");
    let o = msl(&dir, &["test", "--logdir", "logs", "t.msl"]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(event_files(&dir.join("logs/t")).len(), 1);

    let mut child = msl_cmd(&dir, &["repl", "--logdir", "repl-logs"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the repl");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(b"log_scalar(\"x\", 0, 1.0)\nlog_scalar(\"x\", 1, 0.5)\n")
        .expect("write to the repl");
    let o = child.wait_with_output().expect("repl output");
    assert!(o.status.success(), "{}", text(&o));
    let files = event_files(&dir.join("repl-logs"));
    assert_eq!(files.len(), 1, "one file for the session: {}", text(&o));
    let _ = std::fs::remove_dir_all(&dir);
}

/// The width, height and pixels of a PNG, decoded (so the file is a valid picture).
fn decode_png(path: &Path) -> (u32, u32, Vec<u8>) {
    let file = std::fs::File::open(path).expect("open the png");
    let mut reader = png::Decoder::new(std::io::BufReader::new(file)).read_info().expect("a PNG header");
    let mut buf = vec![0; reader.output_buffer_size().expect("a size")];
    let info = reader.next_frame(&mut buf).expect("PNG image data");
    buf.truncate(info.buffer_size());
    (info.width, info.height, buf)
}

#[test]
fn msl_plot_draws_png_and_svg_with_a_line_per_run() {
    let dir = scratch("plot", &[("prog.msl", PROGRAM)]);
    let dirs = log_in_every_engine(&dir);
    let one = dirs[0].to_string_lossy().into_owned();
    let o = msl(&dir, &["plot", &one, "-o", "one.png"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("wrote one.png (5 charts, 1 run)"), "{}", text(&o));
    let (w, h, pixels) = decode_png(&dir.join("one.png"));
    assert!(w >= 800 && h >= 400, "{w}x{h}");
    // Something besides white and grey was drawn: the lines.
    let coloured =
        pixels.chunks(3).filter(|p| p.iter().max().unwrap_or(&0) - p.iter().min().unwrap_or(&0) > 60).count();
    assert!(coloured > 500, "only {coloured} coloured pixels");

    // A folder of runs: each subfolder with event files is a run.
    let o = msl(&dir, &["plot", ".", "-o", "all.svg", "--tag", "loss", "--tag", "acc/test"]);
    assert!(o.status.success(), "{}", text(&o));
    let svg = std::fs::read_to_string(dir.join("all.svg")).expect("the svg");
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"), "{}", &svg[..svg.len().min(200)]);
    let texts: Vec<&str> = svg.split("<text").skip(1).filter_map(|t| t.split('>').nth(1)).map(str::trim).collect();
    let texts: Vec<&str> = texts.iter().map(|t| t.trim_end_matches("</text").trim()).collect();
    // `acc/test` is the line `test` of the chart `acc`; with several runs, named after the run.
    for want in ["loss", "acc", "step", "engine0", "engine3", "engine0 test", "engine3 test"] {
        assert!(texts.contains(&want), "the svg has no text `{want}`: {texts:?}");
    }
    assert!(!texts.contains(&"count"), "--tag leaves out the other tags");
    assert!(svg.contains("<polyline"), "the svg has no lines");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn msl_plot_errors_are_exit_2_with_a_message() {
    let dir = scratch("plot-errors", &[("prog.msl", PROGRAM)]);
    std::fs::create_dir_all(dir.join("empty")).expect("mkdir");
    std::fs::create_dir_all(dir.join("junk")).expect("mkdir");
    std::fs::write(dir.join("junk/events.out.tfevents.1.host.1.0"), b"\x05\x00\x00\x00\x00\x00\x00\x00garbage bytes")
        .expect("write junk");
    let o = msl(&dir, &["run", "--logdir", "good", "prog.msl"]);
    assert!(o.status.success(), "{}", text(&o));
    let cases: [(&[&str], &str); 7] = [
        (&["plot", "missing", "-o", "x.png"], "`missing` does not exist"),
        (&["plot", "empty", "-o", "x.png"], "no TensorBoard event files"),
        (&["plot", "junk", "-o", "x.png"], "hold no scalars"),
        (&["plot", "good", "-o", "x.jpg"], "must be a `.png` or `.svg` file (or `.csv` for the data)"),
        (&["plot", "good", "-o", "nowhere/x.png"], "cannot write `nowhere/x.png`"),
        (&["plot", "good", "--tag", "lost", "-o", "x.png"], "no tag `lost` was logged"),
        (&["plot"], "LOGDIR"),
    ];
    for (args, want) in cases {
        let o = msl(&dir, args);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        assert!(err.contains(want), "{args:?}: expected `{want}` in:\n{err}");
        assert!(!err.contains("panicked") && !err.contains("internal compiler error"), "{args:?}: {err}");
    }
    assert!(!dir.join("x.png").exists());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn msl_plot_draws_gaps_extremes_and_odd_names_without_failing() {
    let prog = r#"
fn main() {
    let z: f32 = 0.0
    for step in 0..4 {
        log_scalar("gaps", step, where(step % 2 == 0, z / z, f32(step)))
    }
    log_scalar("inf", 0, 1.0 / z)
    log_scalar("big", -2147483647, 3.0e38)
    log_scalar("big", 2147483647, -3.0e38)
    log_scalar("same", 5, 1.0)
    log_scalar("same", 5, 1.0)
    log_scalar("tiny", 0, 1.0e-38)
    log_scalar("tiny", 1, 1.1e-38)
    log_scalar("near", 0, 1000000.0)
    log_scalar("near", 1, 1000000.1)
    log_scalar("a,b\"c", 0, -1.0)
    log_scalar("/lead", 0, 0.0)
    log_scalar("trail/", 0, 1.0)
    log_scalar("ünï/cödé", 0, 2.0)
}
"#;
    let dir = scratch("extremes", &[("x.msl", prog)]);
    let o = msl(&dir, &["run", "--logdir", "xl", "x.msl"]);
    assert!(o.status.success(), "{}", text(&o));
    for args in [&["-o", "x.png"][..], &["-o", "x.svg"], &["--log-y", "-o", "log.png"], &["-o", "x.csv"]] {
        let mut all = vec!["plot", "xl"];
        all.extend_from_slice(args);
        let o = msl(&dir, &all);
        assert!(o.status.success(), "{args:?}: {}", text(&o));
    }
    decode_png(&dir.join("x.png"));
    decode_png(&dir.join("log.png"));
    let csv = std::fs::read_to_string(dir.join("x.csv")).expect("the csv");
    for line in [
        "xl,gaps,0,NaN",
        "xl,gaps,1,1",
        "xl,inf,0,inf",
        "xl,big,-2147483647,3e38",
        "xl,near,1,1000000.1",
        "xl,\"a,b\"\"c\",0,-1",
        "xl,ünï/cödé,0,2",
    ] {
        assert!(csv.lines().any(|l| l == line), "no `{line}` in:\n{csv}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
