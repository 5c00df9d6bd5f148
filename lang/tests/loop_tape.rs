//! Reverse mode through loops keeps a tape of loop states: the complexity of a derivative,
//! guarded by its structure (no timing), and its values against the recomputing derivative.
//!
//! A derivative whose loops are no deeper than the primal's does O(n) work for n iterations;
//! recomputing each iteration's state from the start (the old scheme, now `@recompute`) nests a
//! loop inside the reverse loop, O(n²).

mod support;

use lang::interp::value::Value;
use lang::ir::{walk, Expr, ExprKind, Prim, Program};
use lang::types::FuncId;
use support::*;

const SRC: &str = "
fn f(x: f32, n: i32) -> f32 {
    var y = x
    var k = 0
    while k < n {
        y = sin(y) * 1.01 + x * 0.5
        k += 1
    }
    var z = y
    for i in 0..n {
        if i % 3 == 2 { continue }
        z = z * 0.9 + cos(z) * y
    }
    z
}

@recompute
fn g(x: f32, n: i32) -> f32 { f(x, n) }

fn h(x: f32, n: i32) -> f32 { f(x, n) }

fn main() {
    print(grad(h)(0.3, 5), grad(g)(0.3, 5), grad(grad(h))(0.3, 5), grad(grad(g))(0.3, 5))
}
";

/// The deepest nesting of loops in an expression.
fn loop_depth(e: &Expr) -> usize {
    let inner = {
        let mut d = 0;
        walk::children(e, &mut |c| d = d.max(loop_depth(c)));
        d
    };
    match e.kind {
        ExprKind::ForRange { .. } | ExprKind::While { .. } | ExprKind::ForBatches { .. } => inner + 1,
        _ => inner,
    }
}

fn uses(e: &Expr, p: Prim) -> bool {
    let mut found = false;
    walk::walk(e, &mut |x| found |= matches!(&x.kind, ExprKind::Prim { prim, .. } if *prim == p));
    found
}

/// The function generated for `grad` of `name` (`times` deep: `grad(grad(…))`).
fn grad_of(prog: &Program, name: &str, times: usize) -> FuncId {
    let mut f = func(prog, name).unwrap();
    for _ in 0..times {
        f = *prog.derived.funcs.get(&(f, lang::ir::derived::Mode::Grad { wrt: 0 })).expect("derived");
    }
    f
}

fn args(n: i32) -> Vec<Value> {
    vec![Value::Tensor(kernels::Tensor::scalar_f32(0.3)), Value::Tensor(kernels::Tensor::scalar_i32(n))]
}

#[test]
fn a_loop_derivative_reads_its_states_from_a_tape() {
    let c = check(SRC).unwrap();
    let p = &c.program;
    let primal = loop_depth(&p.func(func(p, "f").unwrap()).body);
    assert_eq!(primal, 1);
    let taped = p.func(grad_of(p, "h", 1));
    assert!(uses(&taped.body, Prim::TapePush) && uses(&taped.body, Prim::TapeGet));
    assert_eq!(loop_depth(&taped.body), primal, "the backward pass recomputes loop states");
    let recomputed = p.func(grad_of(p, "g", 1));
    assert!(!uses(&recomputed.body, Prim::TapeNew), "`@recompute` keeps a tape");
    assert_eq!(loop_depth(&recomputed.body), primal + 1);
    // Second order differentiates the recomputing twin (depth 2), with tapes of its own, so it
    // adds no level of its own.
    let gg = p.func(grad_of(p, "h", 2));
    assert!(uses(&gg.body, Prim::TapePush));
    assert_eq!(loop_depth(&gg.body), primal + 1);
    // A derivative of a `@recompute` function recomputes again when differentiated again.
    let gg_lean = p.func(grad_of(p, "g", 2));
    assert!(!uses(&gg_lean.body, Prim::TapeNew));
    assert!(loop_depth(&gg_lean.body) > primal + 1);
}

#[test]
fn taped_and_recomputed_derivatives_agree() {
    let c = check(SRC).unwrap();
    let p = &c.program;
    for n in [0, 1, 4, 9] {
        for order in [1, 2] {
            let name = |f: &str| format!("{}{f}", "grad_".repeat(order));
            let run = |fname: &str| {
                let f = grad_of(p, fname, order);
                let mut it = lang::interp::Interp::new(p, Box::new(std::io::sink()));
                let v = it.call(f, args(n), Default::default(), vec![]).ok().expect("runs");
                scalar(&v).unwrap()
            };
            let (a, b) = (run("h"), run("g"));
            assert!((a - b).abs() <= 1e-5 * (1.0 + b.abs()), "{} vs {}: {a} vs {b} at n={n}", name("h"), name("g"));
        }
    }
}
