//! Pipeline-parallel schedules (GPipe, 1F1B, interleaved 1F1B): construction, a proof by simulation, and a table.
//!
//! A stack of layers is cut into `p * v` virtual stages; virtual stage `k` lives on rank `k % p` as its chunk
//! `k / p`. Each of the `m` microbatches runs one forward `F(j, k)` and one backward `B(j, k)` per virtual stage.
//! [`build`] orders the work of every rank and places the communication between neighbouring ranks; [`prove`]
//! simulates all ranks under strict rendezvous semantics (a send completes only when the receiver has posted the
//! matching receive, FIFO per directed channel) and returns the timeline, or the first violation it finds.
//!
//! Communication placement: between two consecutive units `X`, `Y` of a rank there is at most one [`Op::Comm`],
//! holding the sends of `X`'s outputs and the receives of `Y`'s inputs (Megatron's `send_forward_recv_backward`
//! and friends); a rank's first unit is preceded by its receives and its last followed by its sends. A unit is
//! one compute op, except in the steady state of the interleaved schedule, where it is a forward-backward pair
//! (otherwise the ring of chunks deadlocks under rendezvous). GPipe runs all forwards in microbatch order, then
//! all backwards in reverse microbatch order.

use std::collections::{HashMap, HashSet};
use std::fmt;

/// Time units of one forward and one backward of a chunk; communication is free.
const FWD_COST: u64 = 1;
const BWD_COST: u64 = 2;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    GPipe,
    OneFOneB,
    Interleaved,
}

impl Kind {
    /// `gpipe`, `1f1b` or `interleaved`.
    pub fn parse(s: &str) -> Option<Kind> {
        [Kind::GPipe, Kind::OneFOneB, Kind::Interleaved].into_iter().find(|k| k.name() == s)
    }

    pub fn name(self) -> &'static str {
        match self {
            Kind::GPipe => "gpipe",
            Kind::OneFOneB => "1f1b",
            Kind::Interleaved => "interleaved",
        }
    }
}

/// A message between stages: `Act` is the output of F(mb, vstage) going to vstage+1; `Grad` is the cotangent of
/// the input of B(mb, vstage) going to vstage-1.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Msg {
    Act { mb: usize, vstage: usize },
    Grad { mb: usize, vstage: usize },
}

impl fmt::Display for Msg {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Msg::Act { mb, vstage } => write!(f, "Act{{mb {mb}, vstage {vstage}}}"),
            Msg::Grad { mb, vstage } => write!(f, "Grad{{mb {mb}, vstage {vstage}}}"),
        }
    }
}

impl Msg {
    /// The compute op that produces it: (is backward, microbatch, virtual stage).
    fn producer(self) -> (bool, usize, usize) {
        match self {
            Msg::Act { mb, vstage } => (false, mb, vstage),
            Msg::Grad { mb, vstage } => (true, mb, vstage),
        }
    }

    /// Compact form for the table: `a3`/`g3`, with virtual stages `a3:5` (out of virtual stage 5).
    fn short(self, v: usize) -> String {
        let (bwd, mb, k) = self.producer();
        let c = if bwd { 'g' } else { 'a' };
        if v > 1 {
            format!("{c}{mb}:{k}")
        } else {
            format!("{c}{mb}")
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    Fwd {
        mb: usize,
        chunk: usize,
    },
    Bwd {
        mb: usize,
        chunk: usize,
    },
    /// One communication point: every send and receive is posted at once (non-blocking) and the rank waits for
    /// all of them (like Megatron's batched isend/irecv). Peers are stage (rank) indices.
    Comm {
        sends: Vec<(usize, Msg)>,
        recvs: Vec<(usize, Msg)>,
    },
}

impl Op {
    /// A compute op as (is backward, microbatch, chunk).
    fn work(&self) -> Option<(bool, usize, usize)> {
        match *self {
            Op::Fwd { mb, chunk } => Some((false, mb, chunk)),
            Op::Bwd { mb, chunk } => Some((true, mb, chunk)),
            Op::Comm { .. } => None,
        }
    }
}

#[derive(Clone, Debug)]
pub struct Schedule {
    pub kind: Kind,
    pub stages: usize,
    pub microbatches: usize,
    pub virtual_stages: usize,
    pub ranks: Vec<Vec<Op>>,
}

/// One compute op of a rank before communication is placed.
#[derive(Clone, Copy)]
struct Work {
    bwd: bool,
    mb: usize,
    vstage: usize,
}

impl Work {
    fn op(self, p: usize) -> Op {
        let (mb, chunk) = (self.mb, self.vstage / p);
        if self.bwd {
            Op::Bwd { mb, chunk }
        } else {
            Op::Fwd { mb, chunk }
        }
    }

    /// The message this op sends when its consumer is on another rank.
    fn output(self, p: usize, n: usize) -> Option<(usize, Msg)> {
        let (mb, k) = (self.mb, self.vstage);
        if p == 1 {
            None
        } else if self.bwd {
            (k > 0).then(|| ((k - 1) % p, Msg::Grad { mb, vstage: k }))
        } else {
            (k + 1 < n).then(|| ((k + 1) % p, Msg::Act { mb, vstage: k }))
        }
    }

    /// The message this op receives when its producer is on another rank.
    fn input(self, p: usize, n: usize) -> Option<(usize, Msg)> {
        let (mb, k) = (self.mb, self.vstage);
        if p == 1 {
            None
        } else if self.bwd {
            (k + 1 < n).then(|| ((k + 1) % p, Msg::Grad { mb, vstage: k + 1 }))
        } else {
            (k > 0).then(|| ((k - 1) % p, Msg::Act { mb, vstage: k - 1 }))
        }
    }
}

fn work_name(bwd: bool, mb: usize, k: usize) -> String {
    format!("{}(mb {mb}, vstage {k})", if bwd { "B" } else { "F" })
}

pub fn build(kind: Kind, stages: usize, microbatches: usize, virtual_stages: usize) -> Result<Schedule, String> {
    let (p, m, v) = (stages, microbatches, virtual_stages);
    if p == 0 {
        return Err("a pipeline schedule needs at least one stage".to_string());
    }
    if m == 0 {
        return Err("a pipeline schedule needs at least one microbatch".to_string());
    }
    if v == 0 {
        return Err("a pipeline schedule needs at least one virtual stage per stage".to_string());
    }
    if v > 1 && kind != Kind::Interleaved {
        return Err(format!("{v} virtual stages per stage need the interleaved schedule, not {}", kind.name()));
    }
    if v > 1 && m % p != 0 {
        return Err(format!("the interleaved schedule needs microbatches divisible by the stages ({m} by {p})"));
    }
    let n = p * v;
    let ranks = (0..p)
        .map(|r| {
            let units = match kind {
                Kind::GPipe => gpipe(m, r).into_iter().map(|w| vec![w]).collect(),
                Kind::Interleaved if v > 1 => interleaved(p, m, v, r),
                _ => one_f_one_b(p, m, r).into_iter().map(|w| vec![w]).collect(),
            };
            place_comms(p, n, &units)
        })
        .collect();
    Ok(Schedule { kind, stages: p, microbatches: m, virtual_stages: v, ranks })
}

/// All forwards in microbatch order, then all backwards in reverse microbatch order.
fn gpipe(m: usize, r: usize) -> Vec<Work> {
    let w = |bwd, mb| Work { bwd, mb, vstage: r };
    (0..m).map(|j| w(false, j)).chain((0..m).rev().map(|j| w(true, j))).collect()
}

/// PipeDream-Flush: `min(p - r - 1, m)` warm-up forwards, then one forward one backward, then the cool-down.
fn one_f_one_b(p: usize, m: usize, r: usize) -> Vec<Work> {
    let (warm, w) = ((p - r - 1).min(m), |bwd, mb| Work { bwd, mb, vstage: r });
    let steady = (0..m - warm).flat_map(|i| [w(false, warm + i), w(true, i)]);
    (0..warm).map(|j| w(false, j)).chain(steady).chain((m - warm..m).map(|j| w(true, j))).collect()
}

/// Megatron-LM's interleaved 1F1B: virtual microbatch `i` (of `m * v`) visits the chunks in groups of `p`
/// microbatches, forwards in chunk order and backwards in reverse chunk order; the warm-up is
/// `2 (p - r - 1) + (v - 1) p` forwards. Each steady-state forward-backward pair is one unit: it communicates
/// once, after both (Megatron's `send_forward_backward_recv_forward_backward`).
fn interleaved(p: usize, m: usize, v: usize, r: usize) -> Vec<Vec<Work>> {
    let total = m * v;
    let at = |i: usize, bwd: bool| {
        let in_group = i % (p * v);
        let chunk = if bwd { v - 1 - in_group / p } else { in_group / p };
        Work { bwd, mb: i / (p * v) * p + in_group % p, vstage: chunk * p + r }
    };
    let warm = (2 * (p - r - 1) + (v - 1) * p).min(total);
    let mut units: Vec<Vec<Work>> = (0..warm).map(|i| vec![at(i, false)]).collect();
    units.extend((0..total - warm).map(|i| vec![at(warm + i, false), at(i, true)]));
    units.extend((total - warm..total).map(|i| vec![at(i, true)]));
    units
}

/// One `Comm` between consecutive units of compute ops: the sends of the first unit's outputs and the receives
/// of the second unit's inputs (activations before gradients in both lists).
fn place_comms(p: usize, n: usize, units: &[Vec<Work>]) -> Vec<Op> {
    let mut ops = Vec::new();
    let none: &[Work] = &[];
    let mut prev = none;
    for unit in units.iter().map(Vec::as_slice).chain(std::iter::once(none)) {
        let sends: Vec<(usize, Msg)> = prev.iter().filter_map(|x| x.output(p, n)).collect();
        let recvs: Vec<(usize, Msg)> = unit.iter().filter_map(|x| x.input(p, n)).collect();
        if !sends.is_empty() || !recvs.is_empty() {
            ops.push(Op::Comm { sends, recvs });
        }
        ops.extend(unit.iter().map(|x| x.op(p)));
        prev = unit;
    }
    ops
}

#[derive(Clone, Debug)]
pub struct Timeline {
    /// per rank: (start, end, index into ranks[r]) of every Fwd/Bwd op
    pub busy: Vec<Vec<(u64, u64, usize)>>,
    pub makespan: u64,
    /// per rank: the most forwards done whose backward is not yet done, at any time
    pub peak_activations: Vec<usize>,
}

impl Timeline {
    /// Idle fraction: 1 - busy time / (stages * makespan).
    pub fn bubble(&self) -> f64 {
        let busy: u64 = self.busy.iter().flatten().map(|&(s, e, _)| e - s).sum();
        let total = self.busy.len() as u64 * self.makespan;
        if total == 0 {
            0.0
        } else {
            1.0 - busy as f64 / total as f64
        }
    }
}

/// One posted send or receive of the `Comm` a rank waits at; `seq` is its place on the channel.
struct Post {
    peer: usize,
    msg: Msg,
    send: bool,
    seq: usize,
}

/// A directed channel: the sends and receives posted on it, in order, with post time and op index.
#[derive(Default)]
struct Channel {
    sends: Vec<(Msg, u64, usize)>,
    recvs: Vec<(Msg, u64, usize)>,
}

struct Sim<'a> {
    s: &'a Schedule,
    n: usize,
    pc: Vec<usize>,
    clock: Vec<u64>,
    posted: Vec<Option<Vec<Post>>>,
    got: Vec<HashSet<Msg>>,
    sent: HashSet<Msg>,
    done: HashSet<(bool, usize, usize)>,
    live: Vec<usize>,
    peak: Vec<usize>,
    busy: Vec<Vec<(u64, u64, usize)>>,
    chan: HashMap<(usize, usize), Channel>,
}

/// Checks every F(j,k) and B(j,k) appears exactly once (on rank k % p as chunk k / p) and nothing else.
fn check_coverage(s: &Schedule) -> Result<(), String> {
    let (p, m, v) = (s.stages, s.microbatches, s.virtual_stages);
    let mut seen: HashMap<(bool, usize, usize), (usize, usize)> = HashMap::new();
    for (r, ops) in s.ranks.iter().enumerate() {
        for (i, op) in ops.iter().enumerate() {
            let Some((bwd, mb, chunk)) = op.work() else { continue };
            if mb >= m || chunk >= v {
                return Err(format!(
                    "rank {r} op {i}: {op:?} is out of range ({m} microbatches, {v} chunks per stage)"
                ));
            }
            let key = (bwd, mb, chunk * p + r);
            if let Some((r0, i0)) = seen.insert(key, (r, i)) {
                return Err(format!(
                    "{} appears twice: rank {r0} op {i0} and rank {r} op {i}",
                    work_name(bwd, mb, key.2)
                ));
            }
        }
    }
    let mut all = (0..p * v).flat_map(|k| (0..m).flat_map(move |mb| [(false, mb, k), (true, mb, k)]));
    if let Some((bwd, mb, k)) = all.find(|key| !seen.contains_key(key)) {
        let what = work_name(bwd, mb, k);
        return Err(format!("{what} is missing (it belongs on rank {} as chunk {})", k % p, k / p));
    }
    Ok(())
}

impl<'a> Sim<'a> {
    /// Which ranks a message travels between, if it is one the pipeline sends at all.
    fn route(&self, msg: Msg) -> Option<(usize, usize)> {
        let (p, n) = (self.s.stages, self.n);
        let route = match msg {
            Msg::Act { mb, vstage } if mb < self.s.microbatches && vstage + 1 < n => (vstage % p, (vstage + 1) % p),
            Msg::Grad { mb, vstage } if mb < self.s.microbatches && vstage >= 1 && vstage < n => {
                (vstage % p, (vstage - 1) % p)
            }
            _ => return None,
        };
        (route.0 != route.1).then_some(route)
    }

    /// Runs rank `r` one step; `Ok(false)` when it cannot move now.
    fn step(&mut self, r: usize) -> Result<bool, String> {
        let s: &'a Schedule = self.s;
        let i = self.pc[r];
        let Some(op) = s.ranks[r].get(i) else { return Ok(false) };
        let (p, n) = (s.stages, self.n);
        if let Op::Comm { sends, recvs } = op {
            if self.posted[r].is_none() {
                self.post(r, i, sends, recvs)?;
                return Ok(true);
            }
            return self.try_complete(r, i);
        }
        let Some((bwd, mb, chunk)) = op.work() else { return Ok(false) };
        let k = chunk * p + r;
        let what = work_name(bwd, mb, k);
        if bwd && !self.done.contains(&(false, mb, k)) {
            return Err(format!("rank {r} op {i}: {what} runs before its forward"));
        }
        let input = if bwd {
            (k + 1 < n).then(|| Msg::Grad { mb, vstage: k + 1 })
        } else {
            (k > 0).then(|| Msg::Act { mb, vstage: k - 1 })
        };
        if let Some(msg) = input {
            let (pbwd, pmb, pk) = msg.producer();
            let src = pk % p;
            if src == r && !self.done.contains(&(pbwd, pmb, pk)) {
                return Err(format!(
                    "rank {r} op {i}: {what} runs before {} that produces its input",
                    work_name(pbwd, pmb, pk)
                ));
            }
            if src != r && !self.got[r].contains(&msg) {
                return Err(format!("rank {r} op {i}: {what} runs before its input {msg} arrived from stage {src}"));
            }
        }
        let start = self.clock[r];
        let end = start + if bwd { BWD_COST } else { FWD_COST };
        self.busy[r].push((start, end, i));
        self.clock[r] = end;
        self.done.insert((bwd, mb, k));
        if bwd {
            self.live[r] -= 1;
        } else {
            self.live[r] += 1;
            self.peak[r] = self.peak[r].max(self.live[r]);
        }
        self.pc[r] += 1;
        Ok(true)
    }

    fn post(&mut self, r: usize, i: usize, sends: &[(usize, Msg)], recvs: &[(usize, Msg)]) -> Result<(), String> {
        if sends.is_empty() && recvs.is_empty() {
            return Err(format!("rank {r} op {i}: empty communication point"));
        }
        let mut posts = Vec::new();
        for (send, list) in [(true, sends), (false, recvs)] {
            for &(peer, msg) in list {
                let (src, dst, verb, dir) = if send { (r, peer, "sends", "to") } else { (peer, r, "receives", "from") };
                match self.route(msg) {
                    Some(route) if route == (src, dst) => {}
                    Some((a, b)) => {
                        return Err(format!(
                            "rank {r} op {i}: {verb} {msg} {dir} stage {peer}, but it goes from stage {a} to stage {b}"
                        ))
                    }
                    None => return Err(format!("rank {r} op {i}: {verb} {msg}, which no pipeline stage sends")),
                }
                if send {
                    let (pbwd, pmb, pk) = msg.producer();
                    if !self.done.contains(&(pbwd, pmb, pk)) {
                        let what = work_name(pbwd, pmb, pk);
                        return Err(format!("rank {r} op {i}: sends {msg} to stage {peer} before {what} produced it"));
                    }
                    if !self.sent.insert(msg) {
                        return Err(format!("rank {r} op {i}: sends {msg} a second time"));
                    }
                }
                let ch = self.chan.entry((src, dst)).or_default();
                let list = if send { &mut ch.sends } else { &mut ch.recvs };
                list.push((msg, self.clock[r], i));
                posts.push(Post { peer, msg, send, seq: list.len() - 1 });
            }
        }
        self.posted[r] = Some(posts);
        Ok(())
    }

    /// The posted counterpart of `post` on its channel, if any.
    fn counterpart(&self, r: usize, post: &Post) -> Option<(Msg, u64, usize)> {
        let ch = if post.send { &self.chan[&(r, post.peer)].recvs } else { &self.chan[&(post.peer, r)].sends };
        ch.get(post.seq).copied()
    }

    fn try_complete(&mut self, r: usize, i: usize) -> Result<bool, String> {
        let posts = self.posted[r].take().unwrap_or_default();
        let mut t = self.clock[r];
        let mut waiting = false;
        for post in &posts {
            match self.counterpart(r, post) {
                None => waiting = true,
                Some((msg, at, j)) => {
                    if msg != post.msg {
                        let (src, dst, sent, got, sop, rop) = if post.send {
                            (r, post.peer, post.msg, msg, i, j)
                        } else {
                            (post.peer, r, msg, post.msg, j, i)
                        };
                        let n = post.seq;
                        return Err(format!(
                            "rank {r} op {i}: mismatch on channel stage {src} -> stage {dst}: message #{n} sent is \
                             {sent} (rank {src} op {sop}) but the receive posted is {got} (rank {dst} op {rop})"
                        ));
                    }
                    t = t.max(at);
                }
            }
        }
        if waiting {
            self.posted[r] = Some(posts);
            return Ok(false);
        }
        self.got[r].extend(posts.iter().filter(|q| !q.send).map(|q| q.msg));
        self.clock[r] = t;
        self.pc[r] += 1;
        Ok(true)
    }

    /// The deadlock report: every rank with ops left and what it waits for.
    fn deadlock(&self) -> String {
        let mut parts = Vec::new();
        for (r, ops) in self.s.ranks.iter().enumerate() {
            if self.pc[r] >= ops.len() {
                continue;
            }
            let waits: Vec<String> = self.posted[r]
                .iter()
                .flatten()
                .filter(|q| self.counterpart(r, q).is_none())
                .map(|q| {
                    if q.send {
                        format!("send {} to stage {}", q.msg, q.peer)
                    } else {
                        format!("recv {} from stage {}", q.msg, q.peer)
                    }
                })
                .collect();
            parts.push(format!("rank {r} waits at op {} ({})", self.pc[r], waits.join(", ")));
        }
        format!("deadlock: {}", parts.join(", "))
    }
}

/// Simulates every rank (strict rendezvous, FIFO per channel, forward 1 unit, backward 2) and returns the
/// timeline, or the first violation: coverage, routing, data dependency, mismatch, deadlock or leftover message.
pub fn prove(s: &Schedule) -> Result<Timeline, String> {
    let (p, m, v) = (s.stages, s.microbatches, s.virtual_stages);
    if p == 0 || m == 0 || v == 0 {
        return Err(format!("empty pipeline ({p} stages, {m} microbatches, {v} virtual stages)"));
    }
    if s.ranks.len() != p {
        return Err(format!("the schedule has {} op lists for {p} stages", s.ranks.len()));
    }
    check_coverage(s)?;
    let mut sim = Sim {
        s,
        n: p * v,
        pc: vec![0; p],
        clock: vec![0; p],
        posted: (0..p).map(|_| None).collect(),
        got: vec![HashSet::new(); p],
        sent: HashSet::new(),
        done: HashSet::new(),
        live: vec![0; p],
        peak: vec![0; p],
        busy: vec![Vec::new(); p],
        chan: HashMap::new(),
    };
    loop {
        let mut progress = false;
        for r in 0..p {
            while sim.step(r)? {
                progress = true;
            }
        }
        if !progress {
            break;
        }
    }
    if s.ranks.iter().zip(&sim.pc).any(|(ops, &pc)| pc < ops.len()) {
        return Err(sim.deadlock());
    }
    if let Some((&(a, b), ch)) = sim.chan.iter().filter(|c| c.1.sends.len() != c.1.recvs.len()).min_by_key(|c| c.0) {
        let (sent, got) = (ch.sends.len(), ch.recvs.len());
        return Err(format!("stage {a} -> stage {b}: {sent} messages sent, {got} received"));
    }
    let makespan = sim.clock.iter().copied().max().unwrap_or(0);
    Ok(Timeline { busy: sim.busy, makespan, peak_activations: sim.peak })
}

/// `F3`, `B3` (with virtual stages `F3.1`: chunk 1), or a communication point `send a0>1 + recv g0<1`.
fn op_label(op: &Op, v: usize) -> String {
    match *op {
        Op::Fwd { mb, chunk } | Op::Bwd { mb, chunk } => {
            let c = if matches!(op, Op::Bwd { .. }) { 'B' } else { 'F' };
            if v > 1 {
                format!("{c}{mb}.{chunk}")
            } else {
                format!("{c}{mb}")
            }
        }
        Op::Comm { ref sends, ref recvs } => {
            let sends = sends.iter().map(|(peer, msg)| format!("send {}>{peer}", msg.short(v)));
            let recvs = recvs.iter().map(|(peer, msg)| format!("recv {}<{peer}", msg.short(v)));
            sends.chain(recvs).collect::<Vec<_>>().join(" + ")
        }
    }
}

/// The schedule as a table: one row per time unit, one column per stage, then each stage's op list and a summary.
pub fn render(s: &Schedule, t: &Timeline) -> String {
    let (p, m, v) = (s.stages, s.microbatches, s.virtual_stages);
    let mut out = format!("pipeline schedule {}: {p} stages, {m} microbatches", s.kind.name());
    if v > 1 {
        out += &format!(", {v} virtual stages per stage (forward 1 unit, backward 2 units per chunk)\n");
    } else {
        out += " (forward 1 unit, backward 2 units)\n";
    }
    let rows = t.makespan as usize;
    let mut grid = vec![vec![".".to_string(); p]; rows];
    for (r, busy) in t.busy.iter().enumerate() {
        for &(start, end, i) in busy {
            let label = op_label(&s.ranks[r][i], v);
            for row in &mut grid[start as usize..end as usize] {
                row[r] = label.clone();
            }
        }
    }
    let width = grid.iter().flatten().map(String::len).chain((0..p).map(|r| format!("s{r}").len())).max().unwrap_or(1);
    let tw = rows.to_string().len();
    let mut header = format!("{:>tw$}", "t");
    for r in 0..p {
        header += &format!("  {:<width$}", format!("s{r}"));
    }
    out += header.trim_end();
    out.push('\n');
    for (time, row) in grid.iter().enumerate() {
        let mut line = format!("{time:>tw$}");
        for cell in row {
            line += &format!("  {cell:<width$}");
        }
        out += line.trim_end();
        out.push('\n');
    }
    let (chunk, vstage) = if v > 1 { (" (Fj.c: chunk c)", " (aj:k: out of virtual stage k)") } else { ("", "") };
    out += &format!(
        "legend: Fj/Bj = forward/backward of microbatch j{chunk}; aj/gj = activation/gradient of microbatch j{vstage}; \
         >s = to stage s, <s = from stage s; + = posted together in one communication point\n"
    );
    for (r, ops) in s.ranks.iter().enumerate() {
        let list: Vec<String> = ops.iter().map(|op| op_label(op, v)).collect();
        out += &format!("stage {r}: {}\n", list.join(" | "));
    }
    let (pf, mf, vf) = (p as f64, m as f64, v as f64);
    let ideal = if v > 1 {
        format!("(p-1)/(v*m+p-1) = {:.3}", (pf - 1.0) / (vf * mf + pf - 1.0))
    } else {
        format!("(p-1)/(m+p-1) = {:.3}", (pf - 1.0) / (mf + pf - 1.0))
    };
    let peaks: Vec<String> = t.peak_activations.iter().map(usize::to_string).collect();
    out += &format!(
        "bubble {:.3} (ideal {ideal}); peak activations per stage: {}; every send has its matching receive, in order \
         (checked)\n",
        t.bubble(),
        peaks.join(" ")
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn act(mb: usize, vstage: usize) -> Msg {
        Msg::Act { mb, vstage }
    }

    fn grad(mb: usize, vstage: usize) -> Msg {
        Msg::Grad { mb, vstage }
    }

    fn snd(peer: usize, msg: Msg) -> Op {
        Op::Comm { sends: vec![(peer, msg)], recvs: vec![] }
    }

    fn rcv(peer: usize, msg: Msg) -> Op {
        Op::Comm { sends: vec![], recvs: vec![(peer, msg)] }
    }

    const F0: Op = Op::Fwd { mb: 0, chunk: 0 };
    const F1: Op = Op::Fwd { mb: 1, chunk: 0 };
    const B0: Op = Op::Bwd { mb: 0, chunk: 0 };
    const B1: Op = Op::Bwd { mb: 1, chunk: 0 };

    /// A hand-made two-stage schedule.
    fn hand(m: usize, r0: Vec<Op>, r1: Vec<Op>) -> Result<Timeline, String> {
        prove(&Schedule { kind: Kind::GPipe, stages: 2, microbatches: m, virtual_stages: 1, ranks: vec![r0, r1] })
    }

    fn ideal(p: usize, m: usize) -> f64 {
        (p as f64 - 1.0) / (m as f64 + p as f64 - 1.0)
    }

    #[test]
    fn kinds_parse_and_name() {
        for k in [Kind::GPipe, Kind::OneFOneB, Kind::Interleaved] {
            assert_eq!(Kind::parse(k.name()), Some(k));
        }
        assert_eq!(Kind::parse("zb"), None);
    }

    #[test]
    fn gpipe_and_1f1b_are_proved_with_ideal_bubble() {
        for (p, m, kind) in
            (1..=8).flat_map(|p| (1..=16).flat_map(move |m| [(p, m, Kind::GPipe), (p, m, Kind::OneFOneB)]))
        {
            let s = build(kind, p, m, 1).unwrap();
            let t = prove(&s).unwrap_or_else(|e| panic!("{} p={p} m={m}: {e}", kind.name()));
            assert!((t.bubble() - ideal(p, m)).abs() < 1e-9, "{} p={p} m={m}: {}", kind.name(), t.bubble());
            assert_eq!(t.makespan, 3 * (m + p - 1) as u64);
            if kind == Kind::GPipe {
                assert!(t.peak_activations.iter().all(|&a| a == m));
            } else {
                assert!(t.peak_activations.iter().all(|&a| a <= p && a <= m), "{:?}", t.peak_activations);
                assert_eq!(t.peak_activations[0], p.min(m));
            }
            let empty = |op: &&Op| matches!(op, Op::Comm { sends, recvs } if sends.is_empty() && recvs.is_empty());
            assert!(!s.ranks.iter().flatten().any(|op| empty(&op)));
        }
    }

    /// Every interleaved case reaches the interleaved ideal (p-1)/(v*m+p-1) exactly. The looser target
    /// (p-1)/(m+p-1)/v + 0.05 holds except for m == p >= 4 with v >= 2, where it is below that ideal (e.g. p=4 m=4
    /// v=2: bubble 0.2727 = 3/11, target 0.2643); the test pins exactly that set of exceptions.
    #[test]
    fn interleaved_is_proved_and_beats_1f1b() {
        for (p, v) in (1..=8).flat_map(|p| (1..=4).map(move |v| (p, v))) {
            for m in (p..=16).step_by(p) {
                let s = build(Kind::Interleaved, p, m, v).unwrap();
                let t = prove(&s).unwrap_or_else(|e| panic!("interleaved p={p} m={m} v={v}: {e}"));
                let best = (p as f64 - 1.0) / ((v * m) as f64 + p as f64 - 1.0);
                assert!((t.bubble() - best).abs() < 1e-9, "p={p} m={m} v={v}: {} vs {best}", t.bubble());
                let target = ideal(p, m) / v as f64 + 0.05;
                assert_eq!(t.bubble() > target, m == p && p >= 4 && v >= 2, "p={p} m={m} v={v}: {}", t.bubble());
            }
        }
        for p in 1..=6 {
            for m in 1..=9 {
                assert_eq!(
                    build(Kind::Interleaved, p, m, 1).unwrap().ranks,
                    build(Kind::OneFOneB, p, m, 1).unwrap().ranks
                );
            }
        }
    }

    #[test]
    fn build_errors() {
        assert_eq!(build(Kind::GPipe, 0, 4, 1).unwrap_err(), "a pipeline schedule needs at least one stage");
        assert_eq!(build(Kind::GPipe, 4, 0, 1).unwrap_err(), "a pipeline schedule needs at least one microbatch");
        assert!(build(Kind::Interleaved, 4, 4, 0).unwrap_err().contains("at least one virtual stage"));
        let e = build(Kind::OneFOneB, 4, 8, 2).unwrap_err();
        assert_eq!(e, "2 virtual stages per stage need the interleaved schedule, not 1f1b");
        let e = build(Kind::Interleaved, 4, 6, 2).unwrap_err();
        assert_eq!(e, "the interleaved schedule needs microbatches divisible by the stages (6 by 4)");
    }

    #[test]
    fn proof_catches_deadlock() {
        let e = hand(
            1,
            vec![rcv(1, grad(0, 1)), F0, snd(1, act(0, 0)), B0],
            vec![rcv(0, act(0, 0)), F0, B0, snd(0, grad(0, 1))],
        );
        let want = "deadlock: rank 0 waits at op 0 (recv Grad{mb 0, vstage 1} from stage 1), \
                    rank 1 waits at op 0 (recv Act{mb 0, vstage 0} from stage 0)";
        assert_eq!(e.unwrap_err(), want);
    }

    #[test]
    fn proof_catches_mismatch() {
        let r0 = vec![F0, F1, snd(1, act(1, 0)), snd(1, act(0, 0)), rcv(1, grad(1, 1)), B1, rcv(1, grad(0, 1)), B0];
        let r1 = build(Kind::GPipe, 2, 2, 1).unwrap().ranks.remove(1);
        let e = hand(2, r0, r1).unwrap_err();
        assert!(e.contains("mismatch on channel stage 0 -> stage 1: message #0 sent is Act{mb 1, vstage 0}"), "{e}");
        assert!(e.contains("the receive posted is Act{mb 0, vstage 0} (rank 1 op 0)"), "{e}");
    }

    #[test]
    fn proof_catches_missing_or_repeated_forward() {
        let mut s = build(Kind::OneFOneB, 2, 2, 1).unwrap();
        s.ranks[1].retain(|op| *op != F1);
        assert_eq!(prove(&s).unwrap_err(), "F(mb 1, vstage 1) is missing (it belongs on rank 1 as chunk 0)");
        let mut s = build(Kind::OneFOneB, 2, 2, 1).unwrap();
        s.ranks[0].push(F0);
        assert!(prove(&s).unwrap_err().starts_with("F(mb 0, vstage 0) appears twice: rank 0 op 0 and rank 0 op"));
    }

    #[test]
    fn proof_catches_backward_before_its_gradient_and_early_send() {
        let r1 = vec![rcv(0, act(0, 0)), F0, B0, snd(0, grad(0, 1))];
        let e = hand(1, vec![F0, snd(1, act(0, 0)), B0, rcv(1, grad(0, 1))], r1.clone()).unwrap_err();
        assert_eq!(e, "rank 0 op 2: B(mb 0, vstage 0) runs before its input Grad{mb 0, vstage 1} arrived from stage 1");
        let e = hand(1, vec![snd(1, act(0, 0)), F0, rcv(1, grad(0, 1)), B0], r1).unwrap_err();
        assert_eq!(e, "rank 0 op 0: sends Act{mb 0, vstage 0} to stage 1 before F(mb 0, vstage 0) produced it");
    }

    #[test]
    fn render_small_cases() {
        let s = build(Kind::OneFOneB, 2, 3, 1).unwrap();
        let text = render(&s, &prove(&s).unwrap());
        println!("{text}");
        assert!(
            text.starts_with("pipeline schedule 1f1b: 2 stages, 3 microbatches (forward 1 unit, backward 2 units)\n")
        );
        assert!(
            text.contains("bubble 0.250 (ideal (p-1)/(m+p-1) = 0.250); peak activations per stage: 2 1; every send")
        );
        assert!(text.contains("stage 0: F0 | send a0>1 | F1 | send a1>1 + recv g0<1 | B0"));
        for (kind, v) in [(Kind::GPipe, 1), (Kind::OneFOneB, 1), (Kind::Interleaved, 1), (Kind::Interleaved, 2)] {
            let t = prove(&build(kind, 4, 8, v).unwrap()).unwrap();
            let (name, peaks) = (kind.name(), &t.peak_activations);
            println!("{name} p=4 m=8 v={v}: makespan {} bubble {:.4} peaks {peaks:?}", t.makespan, t.bubble());
        }
        let s = build(Kind::Interleaved, 2, 2, 2).unwrap();
        println!("{}", render(&s, &prove(&s).unwrap()));
    }
}
