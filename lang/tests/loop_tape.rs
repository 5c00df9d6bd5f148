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

const LAYERS: &str = "
model Layer { w: f32[4, 4] = glorot_uniform(4, 4) }
model Net { layers: [Layer; 3] }

fn layer(p: Layer, h: f32[8, 4]) -> f32[8, 4] { tanh(h @ p.w) }

@recompute
fn lean_layer(p: Layer, h: f32[8, 4]) -> f32[8, 4] { tanh(h @ p.w) }

fn kept(m: Net, x: f32[8, 4]) -> f32 {
    var h = x
    for l in 0..3 { h = layer(m.layers[l], h) }
    sum(h * h)
}

fn lean(m: Net, x: f32[8, 4]) -> f32 {
    var h = x
    for l in 0..3 { h = lean_layer(m.layers[l], h) }
    sum(h * h)
}

fn main() {
    let m = init(Net, seed: 0)
    let x = normal(8, 4, seed: 1)
    print(sum(grad(kept)(m, x).layers.w), sum(grad(lean)(m, x).layers.w))
}
";

/// What `main` prints, or `None` when it fails.
fn main_output(p: &Program) -> Option<String> {
    #[derive(Clone, Default)]
    struct Out(std::rc::Rc<std::cell::RefCell<Vec<u8>>>);
    impl std::io::Write for Out {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.borrow_mut().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let out = Out::default();
    let mut it = lang::interp::Interp::new(p, Box::new(out.clone()));
    it.run_main(func(p, "main").ok()?).ok()?;
    let text = String::from_utf8(out.0.borrow().clone()).ok();
    text
}

/// How many times a primitive is applied in an expression.
fn count(e: &Expr, p: Prim) -> usize {
    let mut n = 0;
    walk::walk(e, &mut |x| n += usize::from(matches!(&x.kind, ExprKind::Prim { prim, .. } if *prim == p)));
    n
}

#[test]
fn a_loop_keeps_what_its_backward_pass_reads_and_computes_nothing_twice() {
    let c = check(LAYERS).unwrap();
    let p = &c.program;
    // The tape keeps each iteration's `tanh` (its derivative reads it): the backward pass has
    // no `tanh` of its own, and one product per operand.
    let kept = p.func(grad_of(p, "kept", 1));
    assert_eq!(count(&kept.body, Prim::Tanh), 1, "the backward pass recomputes the layer");
    assert_eq!(count(&kept.body, Prim::MatMul), 3);
    // Under `@recompute` the tape keeps the layer's inputs, and the backward pass runs it again.
    let lean = p.func(grad_of(p, "lean", 1));
    assert_eq!(count(&lean.body, Prim::Tanh), 2);
    assert_eq!(count(&lean.body, Prim::MatMul), 4);
    // Both derivatives give the same gradient.
    let out = main_output(p).expect("runs");
    let v: Vec<f64> = out.split_whitespace().map(|x| x.parse().unwrap()).collect();
    assert!((v[0] - v[1]).abs() <= 1e-6 * (1.0 + v[0].abs()), "{out}");
}

#[test]
fn a_sharded_loop_keeps_its_residuals_as_each_rank_holds_them() {
    let src = "mesh M[dp = 2]
model Layer[H] { w: f32[H, H] = glorot_uniform(H, H) }
model Net[H] { layers: [Layer[H]; 3] }
fn loss[N, H](m: Net[H], x: f32[N @dp, H]) -> f32 {
    var h = x
    for l in 0..3 { h = tanh(h @ m.layers[l].w) }
    mean(h * h)
}
fn main() {
    let (l, g) = value_and_grad(loss)(init(Net[4], seed: 0), uniform(8, 4, seed: 1))
    print(l, sum(g.layers.w))
}
";
    let mut c = check(src).unwrap();
    lang::passes::shard(&mut c.program);
    assert!(c.program.malformed.is_empty(), "{:?}", c.program.malformed);
    // The tape holds each rank's rows of every residual, as the forward pass computed them: the
    // only collectives are the weight gradients' and the loss's all-reduces, none a gather.
    for f in &c.program.funcs {
        assert_eq!(count(&f.body, Prim::AllGather), 0, "{}", c.program.names.get(f.name));
    }
    let g = c.program.func(*c.program.derived.funcs.values().next().expect("the derivative"));
    assert!(count(&g.body, Prim::TapePush) == 1 && count(&g.body, Prim::AllReduceSum) >= 1);
}

/// Statements a random loop body is made of (over the state `h: f32[4, 3]`, the counter `i`, the
/// weights `w` and the scalar `a`): products, elementwise functions, a `let` read later, a local
/// `var`, branches, a nested loop, and jumps.
const BODY: &[&str] = &[
    "h = tanh(h @ w) * a",
    "h = h + sin(h)",
    "let t = exp(h * 0.1)\n        h = t * h",
    "if i % 2 == 0 { h = h * 0.9 } else { h = h + a }",
    "for j in 0..2 { h = h * cos(h) + a }",
    "if sum(h) > 1000.0 { break }",
    "if i == 1 { continue }",
    "h = h @ transpose(w) * 0.5",
    "let u = h * h\n        h = h - u * 0.01",
    "var k = h\n        k = k * 2.0 + a\n        h = k * 0.5",
    "h = where(h > 0.0, h, h * 0.1)",
];

#[test]
fn random_loop_bodies_differentiate_as_their_recomputing_form() {
    let mut rng = Rng::new(21);
    for case in 0..24 {
        let n = rng.range(1, 5);
        // The first statement makes the state depend on `w` (the loop is differentiated).
        let mut body = vec!["h = h + tanh(h @ w) * 0.1"];
        body.extend((0..n).map(|_| rng.pick(BODY)));
        let src = format!(
            "fn f(w: f32[3, 3], h0: f32[4, 3], a: f32, n: i32) -> f32 {{
    var h = h0
    for i in 0..n {{
        {}
    }}
    sum(h * h)
}}

@recompute
fn g(w: f32[3, 3], h0: f32[4, 3], a: f32, n: i32) -> f32 {{ f(w, h0, a, n) }}

fn main() {{
    let w = normal(3, 3, seed: {case}) * 0.5
    let h0 = normal(4, 3, seed: 99)
    print(grad(f)(w, h0, 0.3, 4), grad(g)(w, h0, 0.3, 4))
    print(grad(f, wrt: a)(w, h0, 0.3, 4), grad(g, wrt: a)(w, h0, 0.3, 4))
}}
",
            body.join("\n        ")
        );
        let c = check(&src).unwrap_or_else(|e| panic!("case {case}: {e}\n{src}"));
        let p = &c.program;
        let taped = p.func(grad_of(p, "f", 1));
        assert!(count(&taped.body, Prim::TapePush) >= 1, "case {case}: no tape\n{src}");
        let text = main_output(p).unwrap_or_else(|| panic!("case {case} fails\n{src}"));
        let lines: Vec<Vec<f64>> = text
            .lines()
            .map(|l| {
                l.split(|c: char| !(c.is_ascii_alphanumeric() || c == '.' || c == '-'))
                    .filter_map(|s| s.parse().ok())
                    .collect()
            })
            .collect();
        assert!(lines.len() == 2 && lines[0].len() == 18 && lines[1].len() == 2, "case {case}: {text}");
        for l in &lines {
            let (a, b) = l.split_at(l.len() / 2);
            for (x, y) in a.iter().zip(b) {
                let same = (x.is_nan() && y.is_nan()) || x == y || (x - y).abs() <= 1e-5 * (1.0 + y.abs());
                assert!(same, "case {case}: {x} vs {y}\n{text}\n{src}");
            }
        }
    }
}
