//! Collectives that overlap computation in a sharded run: a statement `let c = all_reduce(…)`
//! of a function body starts its collective without waiting (MPI's non-blocking collectives)
//! and the body goes on; the first statement that reads `c` waits for it. Between statements
//! the rank advances what is in flight (MPI progresses a non-blocking collective only inside
//! MPI calls). `shard::overlap` orders the statements so that work that does not need a
//! collective's result comes between its start and its first read (`@copies` gives it the
//! other copies' work). Values are those of the blocking run: only when a rank waits changes.

use super::trace::Kind;
use super::{rt, Frame, Interp, R};
use crate::diag::Code;
use crate::dist::{Coll, Pending, ReduceKind};
use crate::ir::{walk, Expr, ExprKind, Local, Pat, Prim, Stmt};
use std::time::Instant;

/// How often the collectives in flight are advanced, at most.
const POLL: std::time::Duration = std::time::Duration::from_micros(50);

/// A collective started by a statement and not yet waited for.
struct InFlight {
    local: Local,
    pending: Pending,
    /// The collective and where it is written.
    prim: Prim,
    span: crate::source::Span,
    /// When it was started and, once a test found it complete, when that was.
    started: Option<Instant>,
    completed: Option<Instant>,
    bytes: u64,
}

/// The collective a primitive runs, if it is one that sends (a local slice sends nothing).
pub(crate) fn coll_of(p: Prim, attrs: &crate::ir::Attrs) -> Option<Coll> {
    let dim = attrs.axis.unwrap_or(0);
    Some(match p {
        Prim::AllReduceSum => Coll::AllReduce(ReduceKind::Sum),
        Prim::AllReduceMax => Coll::AllReduce(ReduceKind::Max),
        Prim::AllReduceMin => Coll::AllReduce(ReduceKind::Min),
        Prim::AllReduceMean => Coll::AllReduceMean,
        Prim::AllGather => Coll::AllGather(dim),
        Prim::ReduceScatter => Coll::ReduceScatter(dim),
        Prim::AllToAll => Coll::AllToAll { from: dim, to: attrs.perm.first().copied().unwrap_or(0) },
        Prim::LocalSlice | crate::not_collective_prims!() => return None,
    })
}

/// The locals statement `s` reads or writes (a superset is harmless: it only waits earlier).
fn touched(s: &Stmt, out: &mut Vec<Local>) {
    let expr = |e: &Expr, out: &mut Vec<Local>| {
        walk::walk(e, &mut |x| match &x.kind {
            ExprKind::Local(l) => out.push(*l),
            ExprKind::Closure { captures, .. } => out.extend(captures.iter().copied()),
            _ => {}
        })
    };
    match s {
        Stmt::Let { pat, value } | Stmt::Assign { pat, value } => {
            pat.each_local(&mut |l| out.push(l));
            expr(value, out);
        }
        Stmt::Expr(e) => expr(e, out),
        Stmt::BindDims { local, .. } => out.push(*local),
    }
}

/// Whether a function body has a top-level `let` of a collective that sends (one it would start
/// without waiting).
pub(crate) fn starts_collectives(body: &Expr) -> bool {
    let ExprKind::Block { stmts, .. } = &body.kind else { return false };
    block_starts_collectives(stmts)
}

/// Whether statements `stmts` have a `let` of a collective that sends.
pub(crate) fn block_starts_collectives(stmts: &[Stmt]) -> bool {
    stmts.iter().any(|s| {
        matches!(s, Stmt::Let { pat: Pat::Local(_), value: Expr { kind: ExprKind::Prim { prim, args, attrs }, .. } }
            if args.len() == 1 && coll_of(*prim, attrs).is_some())
    })
}

/// Whether deferred collectives are off (`MSL_OVERLAP=0`: every collective waits where it is
/// started, for comparing a run with and without overlap).
pub(crate) fn overlap_off() -> bool {
    std::env::var_os("MSL_OVERLAP").is_some_and(|v| v == "0")
}

impl Interp<'_> {
    /// Runs a block `{ stmts; result }` of a sharded run (a function body, a loop body) with
    /// its collectives deferred; every one is waited for before the block ends.
    pub(crate) fn body_overlapped(&mut self, stmts: &[Stmt], result: &Expr, frame: &mut Frame) -> R<super::Value> {
        let mut flight: Vec<InFlight> = Vec::new();
        let r = self.overlapped(stmts, result, frame, &mut flight);
        if r.is_err() {
            // An error ends the run; what is in flight is still waited for, so that no rank
            // leaves a collective its group has started.
            for f in flight {
                if let Some(s) = self.spmd.clone() {
                    let _ = s.wait(f.pending);
                }
            }
        }
        r
    }

    fn overlapped(
        &mut self,
        stmts: &[Stmt],
        result: &Expr,
        frame: &mut Frame,
        flight: &mut Vec<InFlight>,
    ) -> R<super::Value> {
        let mut reads = Vec::new();
        let mut polled = Instant::now();
        for s in stmts {
            if !flight.is_empty() {
                reads.clear();
                touched(s, &mut reads);
                self.land(flight, frame, |l| reads.contains(&l))?;
            }
            match s {
                Stmt::Let { pat: Pat::Local(l), value } if self.preset.is_empty() => {
                    if let ExprKind::Prim { prim, args, attrs } = &value.kind {
                        if let (Some(c), [arg]) = (coll_of(*prim, attrs), args.as_slice()) {
                            if self.left_out(value) {
                                // A partial result's sum (`interp::zero`): this rank's part.
                                let v = super::compress::plain(self.eval(arg, frame)?);
                                frame.locals[l.0 as usize] = Some(v);
                                continue;
                            }
                            let f = self.start_collective(*l, c, arg, value, frame)?;
                            flight.push(f);
                            continue;
                        }
                    }
                    self.stmt(s, frame)?;
                }
                _ => self.stmt(s, frame)?,
            }
            // MPI advances a collective only inside its calls: between statements, at most
            // every POLL (a test costs microseconds; statements can be shorter).
            if !flight.is_empty() && polled.elapsed() >= POLL {
                self.advance(flight)?;
                polled = Instant::now();
            }
        }
        self.land(flight, frame, |_| true)?;
        self.eval(result, frame)
    }

    /// Evaluates the operand of collective `c` at `value` and starts it, bound to `local`.
    fn start_collective(&mut self, local: Local, c: Coll, arg: &Expr, value: &Expr, frame: &mut Frame) -> R<InFlight> {
        let span = self.span(value);
        let x = self.eval(arg, frame)?;
        let x = super::compress::plain(x);
        let x = x.tensor().ok_or_else(|| rt(Code::E0605, "a collective takes a tensor", span))?.clone();
        let s = self.spmd.clone().ok_or_else(|| rt(Code::E0605, "a collective outside a sharded run", span))?;
        let started = self.trace_start();
        let before = s.comm.bytes_sent();
        let ExprKind::Prim { prim, attrs, .. } = &value.kind else {
            return Err(rt(Code::E0605, "expected a collective", span));
        };
        let pending = s.start(c, &attrs.mesh_axes, &x).map_err(|m| rt(Code::E0602, m, span))?;
        let bytes = s.comm.bytes_sent().saturating_sub(before);
        s.count(attrs.site, span, prim.name(), bytes);
        Ok(InFlight { local, pending, prim: *prim, span, started, completed: None, bytes })
    }

    /// Advances every collective in flight (no waiting), noting when each completed.
    fn advance(&mut self, flight: &mut [InFlight]) -> R<()> {
        let Some(s) = self.spmd.clone() else { return Ok(()) };
        for f in flight.iter_mut().filter(|f| f.completed.is_none()) {
            let done = s.test(&mut f.pending).map_err(|m| rt(Code::E0602, m, f.span))?;
            if done {
                f.completed = Some(Instant::now());
            }
        }
        Ok(())
    }

    /// Waits for the collectives in flight whose local `want` selects and binds their values.
    fn land(&mut self, flight: &mut Vec<InFlight>, frame: &mut Frame, want: impl Fn(Local) -> bool) -> R<()> {
        let mut i = 0;
        while i < flight.len() {
            if !want(flight[i].local) {
                i += 1;
                continue;
            }
            let f = flight.remove(i);
            let span = f.span;
            let s = self.spmd.clone().ok_or_else(|| rt(Code::E0605, "a collective outside a sharded run", span))?;
            let waited = self.trace_start();
            let t = s.wait(f.pending).map_err(|m| rt(Code::E0602, m, span))?;
            let now = Instant::now();
            if f.completed.is_none() {
                self.trace_span(waited, "wait", Kind::Wait, span);
            }
            if let Some(t0) = f.started {
                let shape = super::trace::shape_of(&super::Value::Tensor(t.clone()));
                self.trace_between(t0, f.completed.unwrap_or(now), f.prim.name(), span, shape, f.bytes);
            }
            frame.locals[f.local.0 as usize] = Some(super::Value::Tensor(t));
        }
        Ok(())
    }
}
