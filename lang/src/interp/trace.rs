//! `msl run --trace FILE`: a timeline of the run, one event per primitive executed (its
//! kernel time, after its operands were computed), per collective (from its issue to its
//! completion, with the bytes it sent), per fused tree or compiled function body, and per
//! function call (which holds the events of its body). The CLI turns it into a Chrome
//! trace-event file (`src/trace.rs`), one process per rank.

use std::rc::Rc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crate::source::Span;

/// What an event is, as trace viewers colour and filter it (`cat`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A primitive's kernel.
    Kernel,
    /// A collective: issue to completion.
    Collective,
    /// A collective started without waiting (`interp::overlap`): start to completion, while
    /// the rank went on computing.
    Deferred,
    /// Time a rank spent waiting for a collective it had started earlier (`interp::overlap`).
    Wait,
    /// Printing, files and logs.
    Io,
    /// A tree of elementwise primitives run as one compiled loop (`--mode jit`).
    Fused,
    /// A function body run as compiled code (`--mode jit`).
    Compiled,
    /// A call of an msl function (interpreted).
    Call,
    /// A pipeline stage's forward or backward of one microbatch (`F3`, `B3`); its messages are
    /// collectives named `send/recv`.
    Stage,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Kernel => "kernel",
            Kind::Collective => "collective",
            Kind::Deferred => "deferred",
            Kind::Wait => "wait",
            Kind::Io => "io",
            Kind::Fused => "fused",
            Kind::Compiled => "compiled",
            Kind::Call => "call",
            Kind::Stage => "stage",
        }
    }
}

/// One span of time of the run.
#[derive(Clone, Debug)]
pub struct Event {
    pub name: Rc<str>,
    pub kind: Kind,
    /// Microseconds since the trace began ([`Trace::origin_us`]).
    pub start_us: f64,
    pub dur_us: f64,
    /// Where in the source it comes from.
    pub span: Option<Span>,
    /// The result's element type and shape (`f32[256, 512]`), where it is one tensor.
    pub shape: Option<String>,
    /// For a collective: the bytes this rank sent.
    pub bytes: Option<u64>,
    /// Bytes of heap in use when it ended (where the embedder counts them, [`Trace::heap`]).
    pub heap: Option<usize>,
}

/// The events of a run, in the order they ended.
pub struct Trace {
    origin: Instant,
    /// When the trace began, in microseconds since the Unix epoch (the ranks of one machine
    /// share that clock, so their timelines line up).
    pub origin_us: f64,
    pub events: Vec<Event>,
    /// Events recorded at most (later ones are counted in `dropped`).
    limit: usize,
    pub dropped: u64,
    /// The heap bytes in use now, where the embedder's allocator counts them (`msl` does):
    /// each event then records it, and the file has a memory track.
    pub heap: Option<fn() -> usize>,
    /// Function names as events show them (`grad(loss)` for a derived one), made once each.
    names: std::collections::HashMap<crate::types::FuncId, Rc<str>>,
}

/// Events kept at most: about 200 bytes each in the file, so a trace stays under ~400 MB.
const LIMIT: usize = 2_000_000;

impl Default for Trace {
    fn default() -> Self {
        Trace::new()
    }
}

impl Trace {
    pub fn new() -> Trace {
        let origin_us = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64() * 1e6);
        Trace {
            origin: Instant::now(),
            origin_us,
            events: Vec::new(),
            limit: LIMIT,
            dropped: 0,
            heap: None,
            names: Default::default(),
        }
    }

    /// The moment an event starts.
    pub fn now(&self) -> Instant {
        Instant::now()
    }

    /// Records an event that started at `start` and ends now (`None` past the limit, when it
    /// is only counted).
    pub fn end(&mut self, start: Instant, name: Rc<str>, kind: Kind, span: Option<Span>) -> Option<&mut Event> {
        if self.events.len() >= self.limit {
            self.dropped += 1;
            return None;
        }
        let at = start.saturating_duration_since(self.origin).as_secs_f64() * 1e6;
        let dur_us = start.elapsed().as_secs_f64() * 1e6;
        let heap = self.heap.map(|f| f());
        self.events.push(Event { name, kind, start_us: at, dur_us, span, shape: None, bytes: None, heap });
        self.events.last_mut()
    }
}

/// The element type and shape of a one-tensor value, as the trace shows it (`f32[2, 3]`).
pub(crate) fn shape_of(v: &super::Value) -> Option<String> {
    let t = v.tensor()?;
    let dims: Vec<String> = t.shape().iter().map(usize::to_string).collect();
    Some(format!("{}[{}]", t.dtype(), dims.join(", ")))
}

impl super::Interp<'_> {
    /// The moment a traced event starts; `None` when the run is not traced.
    pub(crate) fn trace_start(&self) -> Option<Instant> {
        self.trace.as_ref().map(|t| t.now())
    }

    /// Records primitive `p` at `e`, started at `t0`, with its result `r` (nothing when the
    /// run is not traced or `p` failed); `sent` is what a collective sent.
    pub(crate) fn trace_prim(
        &mut self,
        t0: Option<Instant>,
        p: crate::ir::Prim,
        e: &crate::ir::Expr,
        r: &super::R<super::Value>,
        sent: Option<u64>,
    ) {
        let (Some(t0), Ok(v)) = (t0, r) else { return };
        let kind = match p {
            // A local slice (this rank's block of a whole value) sends no message.
            crate::collective_prims!() if p != crate::ir::Prim::LocalSlice => Kind::Collective,
            crate::ir::Prim::Print
            | crate::ir::Prim::Save
            | crate::ir::Prim::Load
            | crate::ir::Prim::LogScalar
            | crate::ir::Prim::Exists => Kind::Io,
            _ => Kind::Kernel, // any other primitive: computes
        };
        let span = self.span(e);
        let shape = shape_of(v);
        if let Some(ev) = self.trace.as_mut().and_then(|t| t.end(t0, Rc::from(p.name()), kind, Some(span))) {
            ev.shape = shape;
            ev.bytes = sent;
        }
    }

    /// Records deferred collective `name` at `span`, started at `t0` and completed at `end`, with the
    /// result's `shape` and the `bytes` this rank sent.
    pub(crate) fn trace_between(
        &mut self,
        t0: Instant,
        end: Instant,
        name: &str,
        span: Span,
        shape: Option<String>,
        bytes: u64,
    ) {
        let Some(t) = self.trace.as_mut() else { return };
        if let Some(ev) = t.end(t0, Rc::from(name), Kind::Deferred, Some(span)) {
            ev.dur_us = end.saturating_duration_since(t0).as_secs_f64() * 1e6;
            ev.shape = shape;
            ev.bytes = Some(bytes);
        }
    }

    /// Records a span of kind `kind` named `name` that started at `t0`.
    pub(crate) fn trace_span(&mut self, t0: Option<Instant>, name: &str, kind: Kind, span: Span) {
        if let (Some(t0), Some(t)) = (t0, self.trace.as_mut()) {
            t.end(t0, Rc::from(name), kind, Some(span));
        }
    }

    /// Records the run of function `f`'s body (interpreted or compiled) that started at `t0`.
    pub(crate) fn trace_call(&mut self, t0: Option<Instant>, f: crate::types::FuncId, kind: Kind) {
        let prog = self.prog;
        let (Some(t0), Some(t)) = (t0, self.trace.as_mut()) else { return };
        let name = t.names.entry(f).or_insert_with(|| Rc::from(crate::ir::memplan::func_name(prog, f))).clone();
        t.end(t0, name, kind, Some(prog.span(prog.func(f).span)));
    }
}
