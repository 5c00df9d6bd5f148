//! Gradient checks with respect to models and tuples against central finite differences (the
//! harness and its tolerances are `support/`; the other cases are in `gradcheck.rs`): a
//! model's gradient is a model, each field checked, including stacks of layers and loops over
//! them.

mod support;

use support::*;

// ---------------------------------------------------------------------------------------------
// Models: the gradient with respect to a model is a model; each field is checked.

#[test]
fn models() {
    let prelude = "model Inner { v: f64[2] = zeros(2) }\nmodel M { a: f64[3] = zeros(3), inner: Inner, b: f64[2, 3] = zeros(2, 3), s: f64 = zeros() }\nmodel G[D] { a: f64[D] = zeros(D), b: f64[D, 2] = zeros(D, 2) }";
    let m = || Arg::Model {
        name: "M".into(),
        dims: vec![],
        fields: vec![
            f64t(&[3]),
            Arg::Model { name: "Inner".into(), dims: vec![], fields: vec![f64t(&[2])] },
            f64t(&[2, 3]),
            f64t(&[]),
        ],
    };
    let gm = |d: usize| Arg::Model { name: "G".into(), dims: vec![d as i64], fields: vec![f64t(&[d]), f64t(&[d, 2])] };
    let cases = vec![
        Case::new("model fields", "sum(m.a * x) + sum(m.b * w) * sum(m.inner.v * m.inner.v) + m.s * m.s * sum(x)")
            .prelude(prelude)
            .param("m", m())
            .param("x", f64t(&[3]))
            .weight(&[2, 3]),
        Case::new(
            "model arithmetic",
            "let m2 = m * 2.0 + m - m * m\n    sum(sin(m2.a) * x) + sum(m2.b * w) + sum(m2.inner.v) * m2.s",
        )
        .prelude(prelude)
        .param("m", m())
        .param("x", f64t(&[3]))
        .weight(&[2, 3]),
        Case::new("model through a helper", "sum(w * tanh(x @ m.b @ transpose(m.b) @ m.b) * m.a)")
            .prelude(prelude)
            .param("m", m())
            .param("x", f64t(&[2]))
            .weight(&[3]),
        Case::new("generic model G[3]", "sum(w * (g.a @ g.b)) + sum(g.a * g.a * x)")
            .prelude(prelude)
            .param("g", gm(3))
            .param("x", f64t(&[3]))
            .weight(&[2]),
        Case::new("model passed to a generic function", "loss(g, x)")
            .prelude(prelude)
            .prelude("fn loss[D](g: G[D], x: f64[D]) -> f64 { sum(exp(g.a) * x) + sum(g.b * g.b) }")
            .param("g", gm(4))
            .param("x", f64t(&[4])),
        // A loop or a branch that reads some fields of a model while code outside reads others:
        // the outside cotangents must be counted once, not once per iteration (or only in one
        // branch).
        Case::new(
            "model fields read inside and outside a loop",
            "var h = x\n    for i in 0..3 {\n        h = tanh(h * m.a + m.s)\n    }\n    sum(h @ transpose(m.b) * m.inner.v)",
        )
        .prelude(prelude)
        .param("m", m())
        .param("x", f64t(&[3])),
        Case::new(
            "model fields read inside and outside an if (else taken)",
            "let h = if sum(x) > 1000.0 { tanh(x * m.a) } else { x * m.s }\n    sum(h @ transpose(m.b) * m.inner.v)",
        )
        .prelude(prelude)
        .param("m", m())
        .param("x", f64t(&[3])),
        Case::new(
            "model fields read inside and outside an if (then taken)",
            "let h = if sum(x) > -1000.0 { tanh(x * m.a) } else { x * m.s }\n    sum(h @ transpose(m.b) * m.inner.v)",
        )
        .prelude(prelude)
        .param("m", m())
        .param("x", f64t(&[3])),
        // A stack of models (`[Blk; 3]`) run layer by layer in a loop.
        Case::new(
            "a stack of models in a loop",
            "var y = x\n    for l in 0..3 {\n        let k = s.layers[l]\n        y = tanh(y @ k.w + k.b)\n    }\n    sum(y * s.h)",
        )
        .prelude("model Blk { w: f64[2, 2] = zeros(2, 2), b: f64[2] = zeros(2) }\nmodel S { layers: [Blk; 3], h: f64[2] = zeros(2) }")
        .param(
            "s",
            Arg::Model {
                name: "S".into(),
                dims: vec![],
                fields: vec![
                    Arg::Model { name: "[Blk; …]".into(), dims: vec![3], fields: vec![f64t(&[3, 2, 2]), f64t(&[3, 2])] },
                    f64t(&[2]),
                ],
            },
        )
        .param("x", f64t(&[2])),
    ];
    run_all("models", cases);
}

// ---------------------------------------------------------------------------------------------
// Tuples.

#[test]
fn tuples() {
    let p = || Arg::Tuple(vec![f64t(&[3]), f64t(&[])]);
    let cases = vec![
        Case::new("tuple parameter", "let (a, b) = p\n    sum(w * sin(a) * b) + b * b").param("p", p()).weight(&[3]),
        Case::new("tuple field access", "sum(w * p.0 * p.1 * p.0)").param("p", p()).weight(&[3]),
        Case::new("one-element tuple", "sum(w * exp(p.0))").param("p", Arg::Tuple(vec![f64t(&[2, 2])])).weight(&[2, 2]),
        Case::new(
            "tuples built inside",
            "let t = (x * 2.0, sin(x), 3)\n    let (a, b, n) = t\n    sum(w * a * b) + sum(t.1) * f64(n)",
        )
        .param("x", f64t(&[4]))
        .weight(&[4]),
        Case::new("function returning a tuple", "let (s, c) = sc(x)\n    sum(w * s * c) + sum(c)")
            .prelude("fn sc(x: f64[3]) -> (f64[3], f64[3]) { (sin(x), cos(x) * x) }")
            .param("x", f64t(&[3]))
            .weight(&[3]),
        Case::new("nested tuple", "let ((a, b), c) = ((x, x * x), exp(x))\n    sum(w * a * b * c)")
            .param("x", f64t(&[2]))
            .weight(&[2]),
    ];
    run_all("tuples", cases);
}
