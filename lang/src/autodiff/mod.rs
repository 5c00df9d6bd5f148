//! Reverse-mode differentiation as a pass from typed IR to typed IR.
//!
//! For every `grad`/`value_and_grad`/`vjp` target in the program the pass generates a new IR
//! function: the forward computation (callees and closures inlined, `var`s turned into SSA
//! values) followed by the backward computation, one rule per primitive (`rules.rs`).
//! Control flow differentiates: an `if` recomputes its taken branch in the backward pass, and a
//! loop keeps a tape of its state at the start of every iteration, which the backward pass
//! reads last first (O(n) for n iterations, like JAX's `scan`); inside a `@recompute`
//! function it keeps only its initial state and recomputes each iteration's state from it
//! (O(n²) work, O(1) extra memory). A derivative holding tapes has a recomputing twin
//! (`Derived::twins`) that further transforms use, since tapes have no derivative rules.
//! Generated functions are ordinary IR: they are differentiated again for higher order.

mod attention;
mod build;
mod fwd;
mod rules;
mod tangent;
pub mod vmap;

use crate::diag::{Code, Diagnostic};
pub use crate::ir::derived::{mode_of, target_func, Derived, Mode};
use crate::ir::{walk::walk, ExprKind, FnTarget, Program};
use crate::source::Span;
use crate::types::FuncId;

/// Generates every derived function the program needs; problems become diagnostics.
pub fn run(prog: &mut Program, diags: &mut Vec<Diagnostic>) {
    let n = prog.funcs.len();
    let mut wanted = Vec::new();
    let mut jvps = Vec::new();
    for i in 0..n {
        walk(&prog.funcs[i].body, &mut |e| match &e.kind {
            // Call sites carry the static target (a `grad(f)` value itself may wrap a closure
            // whose instance is only known where it is applied).
            ExprKind::CallValue { target, .. } => wanted.push((target.clone(), prog.span(e.span))),
            ExprKind::Vjp { target, .. } => wanted.push((pullback_marker(target), prog.span(e.span))),
            ExprKind::Jvp { target, .. } => jvps.push((target.clone(), prog.span(e.span))),
            _ => {}
        });
    }
    for (t, span) in wanted {
        if let Err(d) = ensure_target(prog, &t, span) {
            diags.push(d);
        }
    }
    for (t, span) in jvps {
        let r = ensure_target(prog, &t, span).and_then(|f| match f {
            Some(f) => derive(prog, f, Mode::Jvp, span).map(|_| ()),
            None => Err(err(span, "cannot take `jvp` of a function value known only at run time")),
        });
        if let Err(d) = r {
            diags.push(d);
        }
    }
}

/// A marker target meaning "the pullback of this function".
fn pullback_marker(t: &FnTarget) -> FnTarget {
    FnTarget::Grad { inner: Box::new(t.clone()), wrt: usize::MAX, with_value: false }
}

/// The function that implements a target, generating derived functions as needed.
/// `Ok(None)` for dynamic targets (resolved at run time).
pub fn ensure_target(prog: &mut Program, t: &FnTarget, span: Span) -> Result<Option<FuncId>, Diagnostic> {
    match t {
        FnTarget::Func(f) => Ok(Some(*f)),
        FnTarget::Dynamic => Ok(None),
        FnTarget::Vmap { inner, in_axes } => {
            // A pullback holds its primals, which the batched copy would have to share unbatched.
            if matches!(&**inner, FnTarget::Grad { wrt: usize::MAX, .. }) {
                return Err(err(span, "`vmap` cannot batch a `vjp` pullback; use `jacrev(f)(x)` or `vmap` of `grad`"));
            }
            let Some(f) = ensure_target(prog, inner, span)? else { return Ok(None) };
            derive(prog, f, Mode::Vmap { code: vmap::axes_code(in_axes) }, span).map(Some)
        }
        FnTarget::Grad { inner, wrt, with_value } => {
            let Some(f) = ensure_target(prog, inner, span)? else {
                return Err(Diagnostic::error(
                    Code::E0403,
                    span,
                    "cannot differentiate a function value that is only known at run time",
                )
                .label("differentiated here")
                .with_help("differentiate a named function or a closure written in place"));
            };
            derive(prog, f, mode_of(*wrt, *with_value), span).map(Some)
        }
    }
}

/// Generates (once) the derived function of `f` in `mode`.
pub fn derive(prog: &mut Program, f: FuncId, mode: Mode, span: Span) -> Result<FuncId, Diagnostic> {
    let orig = f;
    let f = prog.derived.transformable(f);
    if let Some(&d) = prog.derived.funcs.get(&(f, mode)) {
        prog.derived.funcs.insert((orig, mode), d);
        return Ok(d);
    }
    // Derived functions that `f` (or anything it calls) uses must exist first: they are inlined.
    let mut deps = Vec::new();
    let mut jvps = Vec::new();
    collect_targets(prog, f, &mut deps, &mut jvps, &mut vec![]);
    for t in deps {
        if let FnTarget::Grad { .. } | FnTarget::Vmap { .. } = t {
            ensure_target(prog, &t, span)?;
        }
    }
    // `jvp`s inside a function that is batched are inlined as calls of their functions.
    if let Mode::Vmap { .. } = mode {
        for t in jvps {
            if let Some(g) = ensure_target(prog, &t, span)? {
                derive(prog, g, Mode::Jvp, span)?;
            }
        }
    }
    let (func, residuals) = match mode {
        Mode::Vmap { code } => {
            prog.sym_names.push("B".to_string());
            let b = crate::types::Sym(prog.sym_names.len() as u32 - 1);
            (vmap::generate(prog, f, code, b, span)?, vec![])
        }
        Mode::Jvp => fwd::generate(prog, f, mode, span, false)?,
        _ => fwd::generate(prog, f, mode, span, true)?,
    };
    let id = add_derived(prog, func, residuals);
    if uses_tape(prog.func(id)) {
        let (twin, res) = fwd::generate(prog, f, mode, span, false)?;
        let t = add_derived(prog, twin, res);
        prog.derived.twins.insert(id, t);
    }
    prog.derived.funcs.insert((f, mode), id);
    // Targets name the function as written (the tape version), so it finds the result too.
    prog.derived.funcs.insert((orig, mode), id);
    Ok(id)
}

/// Whether a generated function keeps a tape of loop states.
fn uses_tape(f: &crate::ir::Func) -> bool {
    let mut found = false;
    walk(&f.body, &mut |e| {
        if let ExprKind::Prim { prim: crate::ir::Prim::TapeNew, .. } = &e.kind {
            found = true;
        }
    });
    found
}

/// Simplifies a generated function and adds it to the program.
fn add_derived(prog: &mut Program, func: crate::ir::Func, residuals: Vec<crate::ir::Local>) -> FuncId {
    let mut func = func;
    crate::ir::simplify::simplify(&mut func);
    // Residuals that simplification removed (shared or dead) are no longer kept.
    let mut live = std::collections::HashSet::new();
    walk(&func.body, &mut |e| {
        if let ExprKind::Local(l) = &e.kind {
            live.insert(*l);
        }
    });
    let residuals: Vec<_> = residuals.into_iter().filter(|l| live.contains(l)).collect();
    let id = FuncId(prog.funcs.len() as u32);
    prog.funcs.push(func);
    prog.derived.residuals.insert(id, residuals);
    id
}

/// Grad targets used by `f` and by the functions it calls.
fn collect_targets(
    prog: &Program,
    f: FuncId,
    out: &mut Vec<FnTarget>,
    jvps: &mut Vec<FnTarget>,
    seen: &mut Vec<FuncId>,
) {
    if seen.contains(&f) {
        return;
    }
    seen.push(f);
    let mut calls = Vec::new();
    walk(&prog.func(f).body, &mut |e| match &e.kind {
        ExprKind::Call { func, .. } => calls.push(*func),
        ExprKind::CallValue { target, .. } => {
            if let FnTarget::Func(g) = target {
                calls.push(*g);
            }
            out.push(target.clone());
        }
        ExprKind::Jvp { target, .. } => {
            if let FnTarget::Func(g) = target {
                calls.push(*g);
            }
            jvps.push(target.clone());
        }
        _ => {}
    });
    for g in calls {
        collect_targets(prog, g, out, jvps, seen);
    }
}

/// The name of a derived function, for dumps and `msl grad`.
pub fn derived_name(prog: &Program, f: FuncId, mode: Mode) -> String {
    let base = prog.names.get(prog.func(f).name).to_string();
    match mode {
        Mode::Grad { wrt } => format!("grad_{base}_{wrt}"),
        Mode::ValueAndGrad { wrt } => format!("value_and_grad_{base}_{wrt}"),
        Mode::Pullback => format!("pullback_{base}"),
        Mode::Jvp => format!("jvp_{base}"),
        Mode::Vmap { .. } => format!("vmap_{base}"),
    }
}

pub(crate) fn err(span: Span, msg: impl Into<String>) -> Diagnostic {
    Diagnostic::error(Code::E0403, span, msg).label("differentiated through here")
}

/// The innermost function of a target (what a closure's captures belong to).
pub fn innermost(t: &FnTarget) -> Option<FuncId> {
    match t {
        FnTarget::Func(f) => Some(*f),
        FnTarget::Grad { inner, .. } | FnTarget::Vmap { inner, .. } => innermost(inner),
        FnTarget::Dynamic => None,
    }
}
