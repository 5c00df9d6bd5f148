//! Derived functions: what the autodiff pass generated (by function and mode) and how a static
//! call target finds its implementation. The data lives in the IR so that every later stage
//! (interpreter, memory plan, JIT) can resolve targets without knowing the autodiff pass.

use super::{FnTarget, Program};
use crate::types::FuncId;
use std::collections::HashMap;

/// What a derived function computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    /// `grad(f, wrt)`: the gradient of the scalar result with respect to one parameter.
    Grad { wrt: usize },
    /// `value_and_grad(f, wrt)`: `(value, gradient)`.
    ValueAndGrad { wrt: usize },
    /// The pullback of `vjp(f, …)`: takes the parameters and an output cotangent, returns the
    /// tuple of cotangents of every parameter.
    Pullback,
    /// `jvp(f, x, v)`: takes the parameters and their tangents, returns `(value, tangent)`.
    Jvp,
    /// `vmap(f, in_axes)`: the batched function (`in_axes` packed by [`axes_code`]).
    Vmap { code: u64 },
}

/// Derived functions already generated, by (function, mode).
#[derive(Clone, Debug, Default)]
pub struct Derived {
    pub funcs: HashMap<(FuncId, Mode), FuncId>,
    /// For each derived function, the forward values its backward pass reads.
    pub residuals: HashMap<FuncId, Vec<crate::ir::Local>>,
    /// A reverse-mode function whose loops keep tapes (`tape_push`, `tape_get`, which have no
    /// derivative or batching rules) → the same derivative recomputing its loops' states
    /// instead: what a further `grad`, `jvp` or `vmap` of it, or a function inlining it, uses.
    pub twins: HashMap<FuncId, FuncId>,
}

impl Derived {
    /// The function to transform (differentiate, batch, inline) in place of `f`.
    pub fn transformable(&self, f: FuncId) -> FuncId {
        self.twins.get(&f).copied().unwrap_or(f)
    }
}

/// The function that implements a static target: a named function, a closure instance, or a
/// derived function the pass generated. `None` for targets resolved at run time.
pub fn target_func(prog: &Program, t: &FnTarget) -> Option<FuncId> {
    match t {
        FnTarget::Func(f) => Some(*f),
        FnTarget::Grad { inner, wrt, with_value } => {
            let f = target_func(prog, inner)?;
            prog.derived.funcs.get(&(f, mode_of(*wrt, *with_value))).copied()
        }
        FnTarget::Vmap { inner, in_axes } => {
            let f = target_func(prog, inner)?;
            prog.derived.funcs.get(&(f, Mode::Vmap { code: axes_code(in_axes) })).copied()
        }
        FnTarget::Dynamic => None,
    }
}

/// The mode of a `grad`/`value_and_grad` target (`wrt == usize::MAX` marks a pullback).
pub fn mode_of(wrt: usize, with_value: bool) -> Mode {
    if wrt == usize::MAX {
        Mode::Pullback
    } else if with_value {
        Mode::ValueAndGrad { wrt }
    } else {
        Mode::Grad { wrt }
    }
}

/// Packs `in_axes` into a key (4 bits an argument; 15 = not mapped).
pub fn axes_code(in_axes: &[Option<usize>]) -> u64 {
    let mut c = in_axes.len() as u64;
    for (i, a) in in_axes.iter().enumerate().take(14) {
        let v = a.map(|x| x.min(14) as u64).unwrap_or(15);
        c |= v << (4 * (i + 1));
    }
    c
}
