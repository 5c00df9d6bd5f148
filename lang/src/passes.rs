//! The passes over the typed IR, by name, in the order a program meets them: the checker's
//! output (`check`), reverse mode and the other transforms (`autodiff`), partitioning for a mesh
//! (`shard`, under a launcher, then `overlap`), and `-O2`'s whole-program optimisation (`optimize`). Each entry
//! point runs its pass and then, in debug builds (every test) or with `MSL_VERIFY=1`, the
//! verifier (`ir::verify`: structure, and every node's type re-inferred by `ir::typing`); what it
//! finds is recorded in `Program::malformed`, naming the pass, and drivers stop on it.

use crate::diag::Diagnostic;
use crate::ir::Program;

/// A pass over the typed IR.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pass {
    Check,
    Autodiff,
    Shard,
    Overlap,
    Optimize,
}

impl Pass {
    pub fn name(self) -> &'static str {
        match self {
            Pass::Check => "check",
            Pass::Autodiff => "autodiff",
            Pass::Shard => "shard",
            Pass::Overlap => "overlap",
            Pass::Optimize => "optimize",
        }
    }
}

/// Whether the verifier runs after every pass: always in debug builds, and in release builds
/// when `MSL_VERIFY` is set to anything but `0`.
pub fn verifying() -> bool {
    cfg!(debug_assertions) || std::env::var_os("MSL_VERIFY").is_some_and(|v| v != "0")
}

/// Runs the verifier on `p` after `pass` (when [`verifying`]) and records what it finds.
pub fn verified(p: &mut Program, pass: Pass) {
    if verifying() {
        let found = crate::ir::verify::verify(p);
        record(p, pass, found);
    }
}

fn record(p: &mut Program, pass: Pass, found: Vec<String>) {
    p.malformed.extend(found.into_iter().map(|m| format!("after `{}`: {m}", pass.name())));
}

/// The transforms: every `grad`/`value_and_grad`/`vjp`/`jvp`/`vmap` target becomes a function.
pub fn autodiff(p: &mut Program, diags: &mut Vec<Diagnostic>) {
    crate::autodiff::run(p, diags);
    crate::check::copies::fuse_splits(p);
    verified(p, Pass::Autodiff);
}

/// Partitions the program for its mesh (layouts re-inferred, collectives inserted), then
/// orders each body so that its collectives overlap computation (`overlap`).
pub fn shard(p: &mut Program) -> crate::shard::Report {
    let mut report = crate::shard::run(p);
    verified_layouts(p, Pass::Shard, &report);
    if crate::dist::Mesh::of(p).is_some() {
        crate::shard::overlap::run(p);
        report.retain_present(p);
        verified_layouts(p, Pass::Overlap, &report);
    }
    report
}

/// The verifier after a pass of partitioning: types, and every rank holding the blocks its
/// values' types say (`shard::verify`).
fn verified_layouts(p: &mut Program, pass: Pass, report: &crate::shard::Report) {
    verified(p, pass);
    if verifying() {
        let found = crate::shard::verify::check(p, &report.unpartitioned);
        record(p, pass, found.into_iter().map(|m| format!("layout: {m}")).collect());
    }
}

/// `-O2`'s folding, common subexpressions, dead code and forward substitution.
/// A sharded program's bodies are ordered for overlap again afterwards (substitution moves
/// single-use values into their readers).
pub fn optimize(p: &mut Program) -> crate::ir::opt::OptReport {
    let report = crate::ir::opt::optimize(p);
    verified(p, Pass::Optimize);
    if crate::dist::Mesh::of(p).is_some() {
        crate::shard::overlap::run(p);
        verified(p, Pass::Overlap);
    }
    report
}

/// The internal compiler error a driver reports for a malformed program, if it is one.
pub fn malformed(p: &Program) -> Option<String> {
    if p.malformed.is_empty() {
        return None;
    }
    let mut s = String::from("internal compiler error: the typed IR is malformed (a compiler bug, please report it):");
    for m in p.malformed.iter().take(20) {
        s.push_str("\n  ");
        s.push_str(m);
    }
    if p.malformed.len() > 20 {
        s.push_str(&format!("\n  … and {} more", p.malformed.len() - 20));
    }
    Some(s)
}
