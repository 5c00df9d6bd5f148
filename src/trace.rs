//! `msl run --trace FILE`: writes the run's timeline (`lang::interp::trace`) as a Chrome
//! trace-event file, which Perfetto (ui.perfetto.dev) and `chrome://tracing` open. Each rank
//! of a sharded run is one process of the file (`rank 0`, `rank 1`, …) on a common time axis;
//! every event is a complete event (`"ph": "X"`) whose `cat` says what it is (kernel,
//! collective, io, fused, compiled, call) and whose `args` give its source location, its
//! result's type and, for a collective, the bytes this rank sent. A counter track, `heap`,
//! follows the bytes of heap in use (MiB) at the end of each event.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use lang::check::Checked;
use lang::dist::ReduceKind;
use lang::interp::trace::Trace;
use lang::interp::Interp;

/// The file `--trace` names, for the interpreter the command makes.
pub(crate) static TRACE: OnceLock<PathBuf> = OnceLock::new();

/// Starts recording when the command asked for a trace.
pub(crate) fn start(it: &mut Interp) {
    if TRACE.get().is_some() {
        let mut t = Trace::new();
        t.heap = Some(|| crate::alloc::heap().0);
        it.trace = Some(Box::new(t));
    }
}

/// Writes the trace `it` recorded (rank 0 writes every rank's events; each rank sends its own).
/// A failed sharded run writes none: the other ranks are being stopped, so none can be
/// gathered. An error writing it is reported and makes the exit status 2.
pub(crate) fn finish(it: &mut Interp, c: &Checked, ran: bool) -> Result<(), u8> {
    let (Some(path), Some(trace)) = (TRACE.get(), it.trace.take()) else { return Ok(()) };
    let job = crate::spmd::job().filter(|j| j.comm.world() > 1);
    if job.is_some() && !ran {
        return Ok(());
    }
    let rank = crate::spmd::rank();
    let fail = |m: String| {
        eprintln!("error: --trace {}: {m}", path.display());
        2
    };
    let texts: Vec<String> = match &job {
        Some(j) => {
            // The earliest rank's start is time 0 of the file.
            let me = kernels::Tensor::scalar_f64(trace.origin_us);
            let first = j.all_reduce(&j.mesh.all_axes(), ReduceKind::Min, &me).map_err(fail)?;
            let origin = first.scalar_value_f64().unwrap_or(trace.origin_us);
            let mine = events(&trace, c, rank, origin);
            let texts = j.exchange(mine.as_bytes()).map_err(fail)?;
            texts.into_iter().map(|b| String::from_utf8_lossy(&b).into_owned()).collect()
        }
        None => vec![events(&trace, c, 0, trace.origin_us)],
    };
    if trace.dropped > 0 {
        eprintln!("note: --trace: {} events after the first {} were not recorded", trace.dropped, trace.events.len());
    }
    if rank != 0 {
        return Ok(());
    }
    write(path, &texts).map_err(fail)
}

/// Rank `rank`'s events as lines of the trace file (each ending in `,\n`), times relative to
/// `origin` (µs since the Unix epoch).
fn events(trace: &Trace, c: &Checked, rank: usize, origin: f64) -> String {
    let shift = trace.origin_us - origin;
    let mut s = format!(
        "{{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":{rank},\"tid\":0,\"args\":{{\"name\":\"rank {rank}\"}}}},\n"
    );
    // Collectives run beside the computation (a deferred one overlaps the kernels after its
    // start): they have a track of their own.
    for (tid, name) in [(0, "compute"), (1, "communication")] {
        s.push_str(&format!(
            "{{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":{rank},\"tid\":{tid},\"args\":{{\"name\":\"{name}\"}}}},\n"
        ));
    }
    let mut last_heap = None;
    for e in &trace.events {
        // The memory track: the heap in use at the end of each event, where it changed.
        if let Some(h) = e.heap.filter(|h| Some(*h) != last_heap) {
            last_heap = Some(h);
            s.push_str(&format!(
                "{{\"name\":\"heap\",\"ph\":\"C\",\"ts\":{:.3},\"pid\":{rank},\"tid\":0,\"args\":{{\"MiB\":{:.3}}}}},\n",
                e.start_us + e.dur_us + shift,
                h as f64 / (1 << 20) as f64
            ));
        }
        let mut args = Vec::new();
        if let Some(span) = e.span {
            let (line, col) = c.sources.line_col(span.file, span.start);
            let at = format!("{}:{line}:{col}", c.sources.name(span.file));
            args.push(format!("\"at\":{}", json_str(&at)));
        }
        if let Some(shape) = &e.shape {
            args.push(format!("\"shape\":{}", json_str(shape)));
        }
        if let Some(b) = e.bytes {
            args.push(format!("\"bytes\":{b}"));
        }
        s.push_str(&format!(
            "{{\"name\":{},\"cat\":\"{}\",\"ph\":\"X\",\"ts\":{:.3},\"dur\":{:.3},\"pid\":{rank},\"tid\":{},\"args\":{{{}}}}},\n",
            json_str(&e.name),
            e.kind.name(),
            e.start_us + shift,
            e.dur_us,
            u8::from(matches!(e.kind, lang::interp::trace::Kind::Collective | lang::interp::trace::Kind::Deferred)),
            args.join(",")
        ));
    }
    s
}

fn json_str(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"?\"".to_string())
}

/// The trace file: every rank's lines in one `traceEvents` array.
fn write(path: &Path, texts: &[String]) -> Result<(), String> {
    kernels::io::file::write_atomic(path, |f| {
        f.write_all(b"{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n")?;
        let body: String = texts.concat();
        // The last event's `,` would make the array invalid JSON.
        f.write_all(body.trim_end().trim_end_matches(',').as_bytes())?;
        f.write_all(b"\n]}\n")
    })
    .map_err(|e| e.to_string())
}
