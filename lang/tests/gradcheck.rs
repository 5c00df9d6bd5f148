//! Gradient checks of msl's reverse-mode autodiff against central finite differences.
//!
//! Every case is a small program `fn f(…) -> f64 { … }`; the harness (`support/`) checks it,
//! calls `grad(f, wrt: x)` and `value_and_grad(f, wrt: x)` in the interpreter, and compares with
//! central differences of `f` itself at x ± h·eᵢ (h = 1e-6 in f64). Cases whose differentiated
//! parameter is a plain f64 tensor are also checked at second order: the gradient of
//! ⟨v, ∇ₓf⟩ (a `grad` of a function that calls `grad`) against finite differences of ⟨v, ∇ₓf⟩.
//! A fixed random weight `w` multiplies results before summing, so outputs are not symmetric.
//! Tolerances are in `support::F64` / `support::F32` (with the reasons); closed forms cover what
//! finite differences cannot decide (stop_gradient, ties, higher order), and the last tests
//! check the E040x diagnostics. `GRADCHECK_ROUNDS=n GRADCHECK_SEED=s` widens `random_shapes`.

mod support;

use support::*;

/// Shapes for elementwise cases: a scalar, a single element, and random ranks 1–3 (dims 1–4).
fn unary_shapes(rng: &mut Rng) -> Vec<Vec<usize>> {
    vec![vec![], vec![1], rng.shape(1, 1), rng.shape(2, 2), rng.shape(3, 3)]
}

// ---------------------------------------------------------------------------------------------
// Elementwise unary functions.

#[test]
fn unary_elementwise() {
    let mut rng = Rng::new(11);
    let pos = Dist::Range(0.3, 2.5);
    let away = Dist::Away(0.2, 2.0);
    let ops: Vec<(&str, Dist)> = vec![
        ("exp(x)", Dist::Normal),
        ("log(x)", pos),
        ("sqrt(x)", pos),
        ("rsqrt(x)", pos),
        ("tanh(x)", Dist::Normal),
        ("sigmoid(x)", Dist::Normal),
        ("relu(x)", away),
        ("gelu(x)", Dist::Normal),
        ("erf(x)", Dist::Normal),
        ("gelu(x, approximate: false)", Dist::Normal),
        ("gelu_grad(x, sin(x))", Dist::Normal),
        ("sin(x)", Dist::Normal),
        ("cos(x)", Dist::Normal),
        ("abs(x)", away),
        ("-x", Dist::Normal),
        ("x ** 2", Dist::Normal),
        ("x ** 3", Dist::Normal),
        ("pow(x, 0.5)", pos),
        ("x ** -1.5", pos),
        ("pow(x, 2.5)", pos),
        ("2.0 ** x", Dist::Normal),
        ("exp(sin(x)) * log(x * x + 1.0)", Dist::Normal),
        ("sqrt(x * x + 1.0) / (1.0 + abs(x))", away),
        ("tanh(gelu(x)) - sigmoid(-x) * cos(x)", Dist::Normal),
        ("relu(x) * relu(-x) + relu(x) * x", away),
    ];
    let mut cases = Vec::new();
    for (i, (op, d)) in ops.iter().enumerate() {
        for (j, s) in unary_shapes(&mut rng).iter().enumerate() {
            cases.push(
                Case::new(format!("{op} on {s:?}"), format!("sum(w * ({op}))"))
                    .param("x", f64d(s, *d))
                    .weight(s)
                    .seed((i * 10 + j) as u64),
            );
        }
    }
    run_all("unary_elementwise", cases);
}

// ---------------------------------------------------------------------------------------------
// Binary operators with broadcasting in both directions.

#[test]
fn binary_broadcasting() {
    let mut rng = Rng::new(12);
    let pos = Dist::Range(0.4, 2.0);
    let away = Dist::Away(0.5, 2.0);
    // (expression, distribution of x, of y)
    let ops: Vec<(&str, Dist, Dist)> = vec![
        ("x + y", Dist::Normal, Dist::Normal),
        ("x - y", Dist::Normal, Dist::Normal),
        ("x * y", Dist::Normal, Dist::Normal),
        ("x / y", Dist::Normal, away),
        ("x ** y", pos, Dist::Normal),
        ("pow(x, y)", pos, Dist::Normal),
        ("maximum(x, y)", Dist::Normal, Dist::Normal),
        ("minimum(x, y)", Dist::Normal, Dist::Normal),
        ("where(x > y, x * y, x - y)", Dist::Normal, Dist::Normal),
        ("x % y", Dist::Normal, away),
        ("(x * 3.0) % 1.25 + x % y", Dist::Normal, away),
        ("x * y - x / y + y * y", Dist::Normal, away),
    ];
    let mut cases = Vec::new();
    let mut seed = 100;
    for (op, dx, dy) in &ops {
        let mut pairs = vec![(vec![3, 1], vec![4]), (vec![4], vec![3, 1]), (vec![], vec![2, 3]), (vec![2, 3], vec![])];
        for _ in 0..4 {
            pairs.push(rng.broadcast_pair());
        }
        for (sx, sy) in pairs {
            let so = broadcast(&sx, &sy);
            seed += 1;
            cases.push(
                Case::new(format!("{op} with x{sx:?} y{sy:?}"), format!("sum(w * ({op}))"))
                    .param("x", f64d(&sx, *dx))
                    .param("y", f64d(&sy, *dy))
                    .weight(&so)
                    .seed(seed),
            );
        }
    }
    // Operands mixed with literals and with themselves.
    for (i, body) in [
        "sum(w * (x * 2.0 - 3.0 / (x * x + 1.0)))",
        "sum(w * (1.5 - x)) * sum(x)",
        "sum(w * x * x * x)",
        "sum(w * maximum(x, 0.25) + w * minimum(x, -0.25))",
        "sum(w * maximum(x, x * 0.5))",
    ]
    .iter()
    .enumerate()
    {
        cases.push(
            Case::new(format!("literal mix {i}"), *body)
                .param("x", f64d(&[2, 3], away))
                .weight(&[2, 3])
                .seed(200 + i as u64),
        );
    }
    // `where` with a bool parameter broadcast against both branches, and literal branches.
    for (i, (sc, sx, sy)) in [
        (vec![2, 1], vec![3], vec![2, 3]),
        (vec![2, 3], vec![2, 3], vec![]),
        (vec![3], vec![2, 1], vec![1, 3]),
        (vec![], vec![2], vec![2]),
    ]
    .into_iter()
    .enumerate()
    {
        let so = broadcast(&broadcast(&sc, &sx), &sy);
        cases.push(
            Case::new(format!("where(c{sc:?}, x{sx:?}, y{sy:?})"), "sum(w * where(c, sin(x), y * y))")
                .param("c", Arg::Bool(sc.clone()))
                .param("x", f64t(&sx))
                .param("y", f64t(&sy))
                .weight(&so)
                .seed(300 + i as u64),
        );
    }
    cases.push(
        Case::new("where literal branch", "sum(w * where(x > 0.0, x * x, 0.5))")
            .param("x", f64d(&[5], away))
            .weight(&[5]),
    );
    cases.push(
        Case::new("where literal first", "sum(w * where(x > 0.0, -1.0, exp(x)))")
            .param("x", f64d(&[5], away))
            .weight(&[5]),
    );
    run_all("binary_broadcasting", cases);
}

// ---------------------------------------------------------------------------------------------
// Reductions: over everything, along each axis (positive and negative), with and without keepdims.

#[test]
fn reductions() {
    let mut rng = Rng::new(13);
    let mut cases = Vec::new();
    let mut seed = 400;
    for red in ["sum", "mean", "max", "min", "logsumexp"] {
        let mut shapes = vec![vec![5], vec![1], vec![2, 3], vec![3, 1, 2]];
        shapes.push(rng.shape(2, 3));
        for s in &shapes {
            seed += 1;
            // Everything.
            cases.push(
                Case::new(format!("{red}(x) {s:?}"), format!("{red}(x) * {red}(x * w)"))
                    .param("x", f64t(s))
                    .weight(s)
                    .seed(seed),
            );
            cases.push(
                Case::new(format!("{red}(x, keepdims) {s:?}"), format!("sum(sin({red}(x, keepdims: true)))"))
                    .param("x", f64t(s))
                    .seed(seed),
            );
            let r = s.len() as i64;
            for axis in -r..r {
                let k = axis.rem_euclid(r) as usize;
                for keep in [false, true] {
                    let mut o = s.clone();
                    if keep {
                        o[k] = 1;
                    } else {
                        o.remove(k);
                    }
                    seed += 1;
                    let kd = if keep { ", keepdims: true" } else { "" };
                    cases.push(
                        Case::new(
                            format!("{red}(x, axis: {axis}{kd}) {s:?}"),
                            format!("sum(w * {red}(x, axis: {axis}{kd}))"),
                        )
                        .param("x", f64t(s))
                        .weight(&o)
                        .seed(seed),
                    );
                }
            }
        }
    }
    // softmax and log_softmax along every axis, as the builtins (the default is the last).
    for f in ["softmax", "log_softmax"] {
        for s in [vec![5], vec![2, 3], vec![3, 1, 2]] {
            let r = s.len() as i64;
            for axis in -r..r {
                seed += 1;
                cases.push(
                    Case::new(format!("{f}(x, axis: {axis}) {s:?}"), format!("sum(w * sin({f}(x, axis: {axis})))"))
                        .param("x", f64t(&s))
                        .weight(&s)
                        .seed(seed),
                );
            }
        }
    }
    // Running sums along every axis, alone and feeding a nonlinearity.
    for s in [vec![5], vec![2, 3], vec![3, 1, 2]] {
        let r = s.len() as i64;
        for axis in -r..r {
            seed += 1;
            cases.push(
                Case::new(format!("cumsum(x, axis: {axis}) {s:?}"), format!("sum(w * tanh(cumsum(x, axis: {axis})))"))
                    .param("x", f64t(&s))
                    .weight(&s)
                    .seed(seed),
            );
        }
    }
    // Along an axis counted from the end of a `..` rest, or in the fixed dims before it.
    let poly = "fn last[C, ..S](x: f64[..S, C]) -> f64[..S, C] { log_softmax(cumsum(x, axis: -1), axis: -1) }\n\
                fn first[B, ..S](x: f64[B, ..S]) -> f64[B, ..S] { softmax(cumsum(x, axis: 0), axis: 0) }";
    for s in [vec![4], vec![2, 3], vec![3, 1, 2]] {
        seed += 1;
        cases.push(
            Case::new(format!("along an axis of a rest {s:?}"), "sum(w * sin(last(x) * first(x)))")
                .prelude(poly)
                .param("x", f64t(&s))
                .weight(&s)
                .seed(seed),
        );
    }
    // Reductions feeding broadcasts (softmax-like patterns).
    cases.push(
        Case::new("x - max(x, axis: 1, keepdims)", "sum(w * exp(x - max(x, axis: 1, keepdims: true)))")
            .param("x", f64t(&[3, 4]))
            .weight(&[3, 4]),
    );
    cases.push(
        Case::new("x / sum(x, axis: 0)", "sum(w * x / sum(x * x, axis: 0))")
            .param("x", f64d(&[3, 4], Dist::Away(0.5, 1.5)))
            .weight(&[3, 4]),
    );
    cases.push(
        Case::new("mean(x, axis: -1) broadcast", "sum(w * (x - mean(x, axis: -1, keepdims: true)) ** 2)")
            .param("x", f64t(&[2, 5]))
            .weight(&[2, 5]),
    );
    run_all("reductions", cases);
}

// ---------------------------------------------------------------------------------------------
// Matrix products in every rank combination, batch broadcasting included.

#[test]
fn matmul_ranks() {
    let combos: Vec<(Vec<usize>, Vec<usize>)> = vec![
        (vec![4], vec![4]),
        (vec![4], vec![4, 3]),
        (vec![2, 4], vec![4]),
        (vec![2, 4], vec![4, 3]),
        (vec![1, 4], vec![4, 1]),
        (vec![2, 2, 4], vec![2, 4, 3]),
        (vec![2, 2, 4], vec![4, 3]),
        (vec![2, 4], vec![3, 4, 2]),
        (vec![4], vec![2, 4, 3]),
        (vec![2, 3, 4], vec![4]),
        (vec![2, 1, 3, 4], vec![3, 4, 5]),
        (vec![1, 3, 4], vec![2, 4, 2]),
        (vec![2, 1, 2, 3], vec![1, 2, 3, 2]),
    ];
    let mut cases = Vec::new();
    for (i, (sa, sb)) in combos.iter().enumerate() {
        let mut so: Vec<usize> = match (sa.len(), sb.len()) {
            (1, 1) => vec![],
            (1, _) => sb[..sb.len() - 2].iter().chain([sb[sb.len() - 1]].iter()).copied().collect(),
            (_, 1) => sa[..sa.len() - 1].to_vec(),
            _ => {
                let mut b = broadcast(&sa[..sa.len() - 2], &sb[..sb.len() - 2]);
                b.push(sa[sa.len() - 2]);
                b.push(sb[sb.len() - 1]);
                b
            }
        };
        if sa.len() == 1 && sb.len() > 2 {
            // a[k] @ b[.., k, m] is b's batch dims then m.
            so = sb[..sb.len() - 2].to_vec();
            so.push(sb[sb.len() - 1]);
        }
        cases.push(
            Case::new(format!("a{sa:?} @ b{sb:?}"), "sum(w * (a @ b))")
                .param("a", f64t(sa))
                .param("b", f64t(sb))
                .weight(&so)
                .seed(500 + i as u64),
        );
    }
    cases.push(Case::new("x @ x", "sum(w * (x @ x))").param("x", f64t(&[3, 3])).weight(&[3, 3]));
    cases.push(
        Case::new("chain", "sum(w * (tanh(a @ b) @ transpose(b)))")
            .param("a", f64t(&[2, 3]))
            .param("b", f64t(&[3, 4]))
            .weight(&[2, 3]),
    );
    run_all("matmul_ranks", cases);
}

// ---------------------------------------------------------------------------------------------
// Shape functions.

#[test]
fn shape_functions() {
    let mut cases = Vec::new();
    let c = |name: &str, body: &str, xs: &[usize], ws: &[usize]| Case::new(name, body).param("x", f64t(xs)).weight(ws);
    cases.push(c("reshape 2x6->3x4", "sum(w * reshape(sin(x), [3, 4]))", &[2, 6], &[3, 4]));
    cases.push(c("reshape infer", "sum(w * reshape(x * x, [_, 2]))", &[2, 3, 2], &[6, 2]));
    cases.push(c("reshape flat", "sum(w * reshape(x, [_]))", &[2, 1, 3], &[6]));
    cases.push(c("reshape to scalar dims", "sum(w * reshape(x, [1, 1]))", &[1], &[1, 1]));
    cases.push(c("transpose 2d", "sum(w * transpose(exp(x)))", &[2, 3], &[3, 2]));
    cases.push(c("transpose 3d", "sum(w * transpose(x))", &[2, 3, 4], &[4, 3, 2]));
    cases.push(c("transpose 1d", "sum(w * transpose(x) * x)", &[3], &[3]));
    cases.push(c("permute 201", "sum(w * permute(x, [2, 0, 1]))", &[2, 3, 4], &[4, 2, 3]));
    cases.push(c("permute negative", "sum(w * permute(x * x, [0, -1, 1]))", &[2, 3, 4], &[2, 4, 3]));
    cases.push(c("permute 4d", "sum(w * permute(x, [3, 1, 0, 2]))", &[2, 1, 3, 2], &[2, 1, 2, 3]));
    cases.push(c("expand_dims 0", "sum(w * expand_dims(x, axis: 0))", &[3], &[1, 3]));
    cases.push(c("expand_dims -1", "sum(w * expand_dims(x, axis: -1))", &[2, 3], &[2, 3, 1]));
    cases.push(c(
        "expand_dims 1 broadcast",
        "sum(w * expand_dims(x, axis: 1) * expand_dims(x, axis: 0))",
        &[3],
        &[3, 3],
    ));
    cases.push(c("squeeze axis", "sum(w * squeeze(x, axis: 1))", &[2, 1, 3], &[2, 3]));
    cases.push(c("squeeze all", "sum(w * squeeze(x))", &[1, 2, 1, 3], &[2, 3]));
    cases.push(c("squeeze to scalar", "w * squeeze(x) * squeeze(x)", &[1, 1], &[]));
    cases.push(c("broadcast_to lead", "sum(w * broadcast_to(x, [4, 2, 3]))", &[2, 3], &[4, 2, 3]));
    cases.push(c("broadcast_to stretch", "sum(w * broadcast_to(sin(x), [3, 4]))", &[1, 4], &[3, 4]));
    cases.push(c("broadcast_to both", "sum(w * broadcast_to(x, [2, 3, 4]))", &[3, 1], &[2, 3, 4]));
    cases.push(c("broadcast_to scalar", "sum(w * broadcast_to(x, [2, 2]))", &[], &[2, 2]));
    cases.push(c("full from a scalar", "sum(w * full(x * x, 2, 3))", &[], &[2, 3]));
    cases.push(c("full from a reduction", "sum(w * full(sum(sin(x)), 3)) * x[0]", &[3], &[3]));
    // concat / stack: several operands, axes, the same operand twice.
    let two = |name: &str, body: &str, sx: &[usize], sy: &[usize], ws: &[usize]| {
        Case::new(name, body).param("x", f64t(sx)).param("y", f64t(sy)).weight(ws)
    };
    cases.push(two("concat axis 0", "sum(w * concat([x, y]))", &[2, 3], &[1, 3], &[3, 3]));
    cases.push(two("concat axis 1", "sum(w * concat([x, y], axis: 1))", &[2, 3], &[2, 2], &[2, 5]));
    cases.push(two("concat axis -1 three", "sum(w * concat([x, exp(y), x], axis: -1))", &[2, 1], &[2, 2], &[2, 4]));
    cases.push(two("concat 1d", "sum(w * concat([y, x * x, y]))", &[3], &[2], &[7]));
    cases.push(two("stack axis 0", "sum(w * stack([x, y]))", &[2, 3], &[2, 3], &[2, 2, 3]));
    cases.push(two("stack axis 1", "sum(w * stack([x, y, x * y], axis: 1))", &[2, 3], &[2, 3], &[2, 3, 3]));
    cases.push(two("stack axis -1", "sum(w * stack([x, sin(y)], axis: -1))", &[3], &[3], &[3, 2]));
    cases.push(two("stack scalars", "sum(w * stack([x, y, x]))", &[], &[], &[3]));
    run_all("shape_functions", cases);
}

// ---------------------------------------------------------------------------------------------
// Indexing and slicing, static and with loop variables; gather.

#[test]
fn indexing_and_gather() {
    let mut cases = Vec::new();
    let c = |name: &str, body: &str, xs: &[usize], ws: &[usize]| Case::new(name, body).param("x", f64t(xs)).weight(ws);
    cases.push(c("x[1]", "sum(w * x[1])", &[3, 4], &[4]));
    cases.push(c("x[1, 2]", "w * x[1, 2]", &[3, 4], &[]));
    cases.push(c("x[-1]", "sum(w * x[-1])", &[3, 4], &[4]));
    cases.push(c("x[:, 1:3]", "sum(w * x[:, 1:3])", &[3, 4], &[3, 2]));
    cases.push(c("x[0:2, 1]", "sum(w * x[0:2, 1])", &[3, 4], &[2]));
    cases.push(c("x[1:, :2] of 3d", "sum(w * x[1:, :2, 0])", &[3, 4, 2], &[2, 2]));
    cases.push(c("slices overlap", "sum(w * (x[0:3] * x[1:4]))", &[4], &[3]));
    cases.push(c(
        "x[i] in loop",
        "var acc: f64 = 0.0\n    for i in 0..3 {\n        acc = acc + sum(w[i] * sin(x[i]))\n    }\n    acc",
        &[3, 4],
        &[3, 4],
    ));
    cases.push(c(
        "x[i:i+2] in loop",
        "var acc: f64 = 0.0\n    for i in 0..3 {\n        acc = acc + sum(w[i:i + 2] * x[i:i + 2] * x[i + 1])\n    }\n    acc",
        &[4],
        &[4],
    ));
    cases.push(
        Case::new("x[n] with i32 param", "sum(w * x[n] * x[n + 1, :])")
            .param("x", f64t(&[3, 2]))
            .param("n", Arg::I32Values(vec![], vec![1]))
            .weight(&[2]),
    );
    // gather: axes, repeated indices (scatter-add must accumulate), index tensors of rank 0–2.
    let g = |name: &str, body: &str, xs: &[usize], idx: Arg, ws: &[usize]| {
        Case::new(name, body).param("x", f64t(xs)).param("idx", idx).weight(ws)
    };
    cases.push(g(
        "gather axis 0",
        "sum(w * gather(x, idx, axis: 0))",
        &[5, 3],
        Arg::I32Values(vec![4], vec![4, 0, 4, 2]),
        &[4, 3],
    ));
    cases.push(g(
        "gather axis 1",
        "sum(w * gather(x, idx, axis: 1))",
        &[2, 5],
        Arg::I32Values(vec![3], vec![1, 1, 3]),
        &[2, 3],
    ));
    cases.push(g(
        "gather axis -1 2d idx",
        "sum(w * gather(x, idx, axis: -1))",
        &[2, 4],
        Arg::I32Values(vec![2, 3], vec![0, 3, 3, 1, 0, 0]),
        &[2, 2, 3],
    ));
    cases.push(g(
        "gather default axis, 2d idx",
        "sum(w * gather(sin(x), idx))",
        &[4, 2],
        Arg::I32Values(vec![2, 2], vec![3, 3, 0, 3]),
        &[2, 2, 2],
    ));
    cases.push(g(
        "gather scalar idx",
        "sum(w * gather(x, idx, axis: 0))",
        &[3, 2],
        Arg::I32Values(vec![], vec![2]),
        &[2],
    ));
    cases.push(g(
        "gather random idx",
        "sum(w * gather(x * x, idx, axis: 1))",
        &[3, 4, 2],
        i32t(&[5], 0, 4),
        &[3, 5, 2],
    ));
    // take_along_axis: repeated positions accumulate in the adjoint.
    cases.push(g(
        "take_along_axis axis 1",
        "sum(w * take_along_axis(x * x, idx, axis: 1))",
        &[2, 4],
        Arg::I32Values(vec![2, 3], vec![0, 3, 3, 1, 0, 0]),
        &[2, 3],
    ));
    cases.push(g(
        "take_along_axis axis 0",
        "sum(w * take_along_axis(sin(x), idx, axis: 0))",
        &[3, 2],
        i32t(&[4, 2], 0, 2),
        &[4, 2],
    ));
    run_all("indexing_and_gather", cases);
}

// ---------------------------------------------------------------------------------------------
// Element-type conversions.

#[test]
fn conversions() {
    // An f32 parameter read as f64: f is computed in f64 from the f32 values, so only the step
    // is rounded (the harness divides by the actual step); the gradient comes back as f32, so
    // the relative tolerance is f32's (1e-5). h = 2⁻¹² keeps the truncation error ~1e-8.
    let f32_in = Tol { h: 2f64.powi(-12), rtol: 1e-5, atol: 1e-7 };
    let mut cases = vec![
        Case::new("f64(x32)", "sum(w * exp(f64(x)) * f64(x))").param("x", f32t(&[2, 3])).weight(&[2, 3]).tol(f32_in),
        Case::new("f64(x32) broadcast", "sum(w * sin(f64(x)) * y)")
            .param("x", f32t(&[3, 1]))
            .param("y", f64t(&[4]))
            .weight(&[3, 4])
            .tol(f32_in),
        // f64 → f32 → f64 inside f: f is only f32-accurate, so it uses the f32 tolerance.
        Case::new("f64(f32(x))", "sum(w * f64(exp(f32(x)) * f32(x)))")
            .param("x", f64t(&[2, 3]))
            .weight(&[2, 3])
            .tol(F32)
            .first_order_only(),
        Case::new("f64(x) identity", "sum(w * f64(x) * x)").param("x", f64t(&[3])).weight(&[3]),
    ];
    // An f32 result: the whole function is f32.
    cases.push(
        Case::new("f32 result", "sum(f32(w) * tanh(x) * x)")
            .param("x", f32t(&[2, 3]))
            .weight(&[2, 3])
            .ret("f32")
            .tol(F32),
    );
    run_all("conversions", cases);
}

// ---------------------------------------------------------------------------------------------
// Control flow: if, for with var accumulation, while; calls; closures; stop_gradient.

#[test]
fn control_flow() {
    let mut cases = Vec::new();
    for seed in 0..4 {
        cases.push(
            Case::new(
                "if on a float condition",
                "if sum(x) > 0.0 {\n        sum(w * x * x * x)\n    } else {\n        sum(w * sin(x)) * sum(x)\n    }",
            )
            .param("x", f64t(&[3]))
            .weight(&[3])
            .seed(700 + seed),
        );
        cases.push(
            Case::new(
                "if statement assigning a var",
                "var y = x * w\n    if y[0] > 0.0 {\n        y = y * exp(x)\n    }\n    sum(y * y)",
            )
            .param("x", f64t(&[3]))
            .weight(&[3])
            .seed(710 + seed),
        );
    }
    for n in [0, 1, 3] {
        cases.push(
            Case::new(
                format!("if on an i32 parameter n={n}"),
                "let y = if n > 1 { tanh(x) } else { x * x }\n    sum(w * y)",
            )
            .param("x", f64t(&[2, 2]))
            .param("n", Arg::I32Values(vec![], vec![n]))
            .weight(&[2, 2]),
        );
        cases.push(
            Case::new(
                format!("for 0..n with var, n={n}"),
                "var acc = x\n    for i in 0..n {\n        acc = sin(acc) * w + acc * x\n    }\n    sum(acc * w)",
            )
            .param("x", f64d(&[3], Dist::Range(-0.8, 0.8)))
            .param("n", Arg::I32Values(vec![], vec![n]))
            .weight(&[3]),
        );
        cases.push(
            Case::new(format!("while with counter, n={n}"), "var k = 0\n    var y = x\n    while k < n {\n        y = y * x + sin(y)\n        k = k + 1\n    }\n    sum(w * y)")
                .param("x", f64d(&[2], Dist::Range(-0.8, 0.8)))
                .param("n", Arg::I32Values(vec![], vec![n]))
                .weight(&[2]),
        );
    }
    cases.push(Case::new("for with static bound and two vars", "var a = x\n    var b = y\n    for i in 0..3 {\n        let t = a * b\n        a = b + 0.5 * sin(t)\n        b = t * 0.5\n    }\n    sum(w * a) + sum(b)")
        .param("x", f64t(&[3]))
        .param("y", f64t(&[3]))
        .weight(&[3]));
    cases.push(
        Case::new(
            "carried var plus a free var",
            "var y = z\n    for i in 0..1 {\n        y = y * 2.0 + x\n    }\n    y",
        )
        .param("x", f64t(&[]))
        .param("z", f64t(&[])),
    );
    cases.push(
        Case::new(
            "while: carried var plus a free var",
            "var y = z\n    var k = 0\n    while k < 1 {\n        y = y * 2.0 + x\n        k = k + 1\n    }\n    y",
        )
        .param("x", f64t(&[]))
        .param("z", f64t(&[])),
    );
    cases.push(
        Case::new("unused parameter", "sum(w * sin(x))").param("x", f64t(&[3])).param("y", f64t(&[2])).weight(&[3]),
    );
    cases.push(Case::new("constant result", "2.5").param("x", f64t(&[2, 2])));
    cases.push(
        Case::new(
            "rnn-style loop",
            "var h = x * 0.0\n    for i in 0..3 {\n        h = tanh(h @ a) + x\n    }\n    sum(w * h)",
        )
        .param("x", f64t(&[3]))
        .param("a", f64t(&[3, 3]))
        .weight(&[3]),
    );
    cases.push(Case::new("swap two vars in a loop", "var a = x\n    var b = y\n    for i in 0..1 {\n        let t = a\n        a = b\n        b = t\n    }\n    a + 10.0 * b")
        .param("x", f64t(&[]))
        .param("y", f64t(&[])));
    cases.push(Case::new("nested for", "var acc: f64 = 0.0\n    for i in 0..3 {\n        for j in 0..2 {\n            acc = acc + w[i, j] * x[i, j] * x[j, 1] * acc + x[i, j]\n        }\n    }\n    acc")
        .param("x", f64d(&[3, 2], Dist::Range(-0.5, 0.5)))
        .weight(&[3, 2]));
    cases.push(
        Case::new(
            "loop variable as a float",
            "var acc = x\n    for i in 0..3 {\n        acc = acc * (1.0 + f64(i) * x)\n    }\n    sum(w * acc)",
        )
        .param("x", f64t(&[3]))
        .weight(&[3]),
    );
    cases.push(Case::new("while on a float condition", "var y = x\n    var k = 0\n    while sum(y * y) < 20.0 && k < 10 {\n        y = y * 1.5 + 0.1 * sin(y)\n        k = k + 1\n    }\n    sum(w * y)")
        .param("x", f64d(&[2], Dist::Range(0.5, 1.0)))
        .weight(&[2]));
    cases.push(
        Case::new("early return", "if x[0] > 0.0 {\n        return sum(w * exp(x))\n    }\n    sum(w * x * x)")
            .param("x", f64t(&[2]))
            .weight(&[2])
            .seed(3),
    );
    cases.push(
        Case::new(
            "early return other branch",
            "if x[0] > 0.0 {\n        return sum(w * exp(x))\n    }\n    sum(w * x * x)",
        )
        .param("x", f64t(&[2]))
        .weight(&[2])
        .seed(4),
    );
    cases.push(Case::new("var reassigned in a for over tuples", "var a = x\n    var b = x * 2.0\n    for i in 0..2 {\n        (a, b) = (b * a, a - b)\n    }\n    sum(w * a) + sum(b * b)")
        .param("x", f64d(&[3], Dist::Range(-0.8, 0.8)))
        .weight(&[3]));
    run_all("control_flow", cases);
}

/// `break` and `continue` (lowered to flags and guarded statements): the gradient follows the
/// iterations that ran, for `for` and `while`, with the exit taken at different iterations.
#[test]
fn loops_with_jumps() {
    let mut cases = Vec::new();
    for n in [0, 2, 5] {
        cases.push(
            Case::new(
                format!("for with break after n={n}"),
                "var acc = x\n    for i in 0..8 {\n        if i >= n { break }\n        acc = sin(acc) * w + acc * x\n    }\n    sum(acc * w)",
            )
            .param("x", f64d(&[3], Dist::Range(-0.8, 0.8)))
            .param("n", Arg::I32Values(vec![], vec![n]))
            .weight(&[3]),
        );
        cases.push(
            Case::new(
                format!("while with continue and break, n={n}"),
                "var k = 0\n    var y = x\n    while true {\n        k = k + 1\n        if k > n + 3 { break }\n        if k % 2 == 0 { continue }\n        y = y * x + sin(y)\n    }\n    sum(w * y)",
            )
            .param("x", f64d(&[2], Dist::Range(-0.8, 0.8)))
            .param("n", Arg::I32Values(vec![], vec![n]))
            .weight(&[2]),
        );
    }
    cases.push(
        Case::new(
            "break on a float condition",
            "var acc: f64 = 0.0\n    for i in 0..20 {\n        acc = acc + sum(w * exp(x * f64(i) * 0.1))\n        if acc > 4.0 { break } else { acc = acc * 1.01 }\n    }\n    acc",
        )
        .param("x", f64d(&[3], Dist::Range(0.1, 0.5)))
        .weight(&[3]),
    );
    cases.push(
        Case::new(
            "continue in an inner loop, break in the outer",
            "var acc = x\n    for i in 0..4 {\n        for j in 0..3 {\n            if j == i { continue }\n            acc = acc * 0.5 + cos(acc) * x\n        }\n        if i == 2 { break }\n    }\n    sum(acc * w)",
        )
        .param("x", f64d(&[2], Dist::Range(-0.8, 0.8)))
        .weight(&[2]),
    );
    run_all("loops_with_jumps", cases);
}

#[test]
fn calls_and_closures() {
    let cases = vec![
        Case::new("generic function", "sum(w * sq(x)) + sum(sq(y))")
            .prelude("fn sq[N](x: f64[N]) -> f64[N] { x * x * sin(x) }")
            .param("x", f64t(&[3]))
            .param("y", f64t(&[5]))
            .weight(&[3]),
        Case::new("rank-polymorphic function", "sum(w * scale(x, y)) + sum(scale(y, 2.0))")
            .prelude("fn scale[..S](x: f64[..S], s: f64) -> f64[..S] { exp(x) * s }")
            .param("x", f64t(&[2, 3]))
            .param("y", f64t(&[]))
            .weight(&[2, 3]),
        Case::new("generic broadcast over a rest", "sum(w * addb(x, b))")
            .prelude("fn addb[D, ..S](x: f64[..S, D], b: f64[D]) -> f64[..S, D] { sin(x + b) * b }")
            .param("x", f64t(&[2, 3]))
            .param("b", f64t(&[3]))
            .weight(&[2, 3]),
        Case::new("generic matmul over a rest", "sum(w * lin(x, a))")
            .prelude("fn lin[I, O, ..S](x: f64[..S, I], a: f64[I, O]) -> f64[..S, O] { x @ a }")
            .param("x", f64t(&[2, 3]))
            .param("a", f64t(&[3, 2]))
            .weight(&[2, 2]),
        Case::new("nested calls", "outer(x, w)")
            .prelude("fn inner(x: f64[3]) -> f64[3] { tanh(x) * x }\nfn outer(x: f64[3], w: f64[3]) -> f64 { sum(w * inner(inner(x) + x)) }")
            .param("x", f64t(&[3]))
            .weight(&[3]),
        Case::new("closure capturing a parameter", "let k = |t: f64[3]| sin(t) * x\n    sum(w * k(x * 2.0)) + sum(k(w))")
            .param("x", f64t(&[3]))
            .weight(&[3]),
        Case::new("closure with inferred types", "let k = |t| t * y + x\n    sum(w * k(x) * k(y))").param("x", f64t(&[3])).param("y", f64t(&[3])).weight(&[3]),
        // Not supported yet (a function-typed parameter is only known at run time): a clean
        // E0403 is accepted, a wrong gradient is not.
        Case::new("closure passed to a function", "apply(|t: f64[2]| exp(t) * x, x) * sum(w)")
            .prelude("fn apply(g: fn(f64[2]) -> f64[2], x: f64[2]) -> f64 { sum(g(x) * x) }")
            .param("x", f64t(&[2]))
            .weight(&[2])
            .allow_e0403(),
        Case::new("grad inside f (closure capturing x)", "sum(w * grad(|t: f64[3]| sum(sin(t) * x * t))(x))")
            .param("x", f64t(&[3]))
            .weight(&[3]),
        Case::new("value_and_grad inside f", "let (v, g) = value_and_grad(|t: f64[2]| sum(exp(t) * x))(x * x)\n    v * sum(w * g)")
            .param("x", f64t(&[2]))
            .weight(&[2]),
        Case::new("grad of a named function inside f", "sum(w * grad(h, wrt: b)(x, x * 2.0))")
            .prelude("fn h(a: f64[3], b: f64[3]) -> f64 { sum(a * a * sin(b)) }")
            .param("x", f64t(&[3]))
            .weight(&[3]),
    ];
    run_all("calls_and_closures", cases);
}

// ---------------------------------------------------------------------------------------------
// stop_gradient: compared with closed forms (finite differences see through it).

#[test]
fn stop_gradient() {
    let text = "
fn f(x: f64[3], w: f64[3]) -> f64 { sum(w * x * stop_gradient(x * x)) }
fn g(x: f64[3], w: f64[3]) -> f64 { sum(w * exp(x)) + sum(stop_gradient(exp(x)) * x) }
fn h(x: f64[3], w: f64[3]) -> f64 { sum(stop_gradient(w * x)) }
fn df(x: f64[3], w: f64[3]) -> f64[3] { grad(f)(x, w) }
fn dg(x: f64[3], w: f64[3]) -> f64[3] { grad(g)(x, w) }
fn dh(x: f64[3], w: f64[3]) -> f64[3] { grad(h)(x, w) }
fn ddf(x: f64[3], w: f64[3]) -> f64[3] { grad(|t: f64[3]| sum(df(t, w)))(x) }
";
    let ck = check(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let x = [0.3, -1.2, 0.7];
    let w = [1.5, -0.5, 2.0];
    let t = |v: &[f64]| lang::interp::Value::Tensor(kernels::Tensor::from_f64(vec![3], v.to_vec()).unwrap());
    let get = |name: &str| {
        let v = call(&ck.program, name, vec![t(&x), t(&w)]).unwrap_or_else(|e| panic!("{e}\n{text}"));
        v.tensor().unwrap().to_f64_vec()
    };
    let close = |a: &[f64], b: &[f64], what: &str| {
        for i in 0..3 {
            assert!((a[i] - b[i]).abs() < 1e-12, "{what}: msl {a:?}, expected {b:?}\n{text}");
        }
    };
    close(&get("df"), &[w[0] * x[0] * x[0], w[1] * x[1] * x[1], w[2] * x[2] * x[2]], "grad of w·x·sg(x²)");
    let e: Vec<f64> = x.iter().map(|v: &f64| v.exp()).collect();
    close(&get("dg"), &[w[0] * e[0] + e[0], w[1] * e[1] + e[1], w[2] * e[2] + e[2]], "grad of w·eˣ + sg(eˣ)·x");
    close(&get("dh"), &[0.0; 3], "grad of sum(sg(w·x))");
    // The derivative of `df` sees `stop_gradient(x * x)` as a constant (as JAX does).
    close(&get("ddf"), &[0.0; 3], "grad of grad through stop_gradient");
}

// ---------------------------------------------------------------------------------------------
// The `nn` standard library: as shipped (f32), and transliterated to f64 for tight checks.

/// `stdlib/nn.msl` with every `f32` turned into `f64` and every function renamed `nn_NAME`,
/// so the same code is checked at f64 precision (and at second order).
fn nn_f64_prelude() -> String {
    let src = lang::check::modules::stdlib_source("nn").expect("the nn stdlib module");
    // Creation functions take f32 unless an annotation asks otherwise (a binary operator with an
    // f64 operand does not), so the few of them in nn get an explicit f64.
    let mut out = src
        .replace("f32", "f64")
        .replace("one_hot(y, C)", "f64(one_hot(y, C))")
        .replace("uniform(like: x, seed: seed)", "f64(uniform(like: x, seed: seed))");
    // The builtins nn re-exports keep their names; `nn_relu` is the builtin `relu`.
    for name in ["relu", "gelu", "sigmoid"] {
        out.push_str(&format!("\nfn nn_{name}[..S](x: f64[..S]) -> f64[..S] {{\n    {name}(x)\n}}\n"));
    }
    // `conv2d` is a builtin too; the wrapper also checks it over symbolic sizes.
    out.push_str(
        "\nfn nn_conv2d[N, C, H, W, O, KH, KW](x: f64[N, C, H, W], k: f64[O, C, KH, KW], b: f64[O]) \
         -> f64[N, O, H - KH + 1, W - KW + 1] {\n    conv2d(x, k, b)\n}\n",
    );
    for name in ["softmax", "log_softmax"] {
        out.push_str(&format!("\nfn nn_{name}[C, ..S](x: f64[..S, C]) -> f64[..S, C] {{\n    {name}(x)\n}}\n"));
    }
    for name in
        ["linear", "cross_entropy", "mse", "accuracy", "layer_norm", "embedding", "attention", "batch_norm", "dropout"]
    {
        out = out.replace(&format!("fn {name}["), &format!("fn nn_{name}["));
    }
    out
}

/// The nn cases for one element type: `f32` uses the stdlib itself, `f64` the transliteration.
fn nn_cases(elem: &str) -> Vec<Case> {
    let f64_mode = elem == "f64";
    let t = |s: &[usize]| if f64_mode { f64t(s) } else { f32t(s) };
    let td = |s: &[usize], d: Dist| {
        if f64_mode {
            Arg::F64(s.to_vec(), d)
        } else {
            Arg::F32(s.to_vec(), d)
        }
    };
    let (prelude, p) = if f64_mode { (nn_f64_prelude(), "nn_") } else { ("use nn".to_string(), "nn.") };
    let mk = |name: &str, body: &str| {
        let c = Case::new(format!("{elem} {name}"), body.replace("nn.", p)).prelude(&prelude).ret(elem);
        if f64_mode {
            c
        } else {
            c.tol(F32)
        }
    };
    let w = |s: &[usize]| t(s);
    vec![
        mk("linear 2d", "sum(w * nn.linear(x, a, b))")
            .param("x", t(&[2, 3]))
            .param("a", t(&[3, 4]))
            .param("b", t(&[4]))
            .param("w", w(&[2, 4])),
        mk("linear 3d", "sum(w * nn.linear(x, a, b))")
            .param("x", t(&[2, 1, 3]))
            .param("a", t(&[3, 2]))
            .param("b", t(&[2]))
            .param("w", w(&[2, 1, 2])),
        mk("linear 1d", "sum(w * nn.linear(x, a, b))")
            .param("x", t(&[3]))
            .param("a", t(&[3, 2]))
            .param("b", t(&[2]))
            .param("w", w(&[2])),
        mk("relu", "sum(w * nn.relu(x))").param("x", td(&[2, 3], Dist::Away(0.1, 2.0))).param("w", w(&[2, 3])),
        mk("gelu", "sum(w * nn.gelu(x))").param("x", t(&[2, 3])).param("w", w(&[2, 3])),
        mk("sigmoid", "sum(w * nn.sigmoid(x))").param("x", t(&[4])).param("w", w(&[4])),
        mk("softmax", "sum(w * nn.softmax(x))").param("x", t(&[2, 4])).param("w", w(&[2, 4])),
        mk("softmax 3d", "sum(w * nn.softmax(x))").param("x", t(&[2, 1, 3])).param("w", w(&[2, 1, 3])),
        mk("log_softmax", "sum(w * nn.log_softmax(x))").param("x", t(&[3, 4])).param("w", w(&[3, 4])),
        mk("cross_entropy", "sum(w * nn.cross_entropy(logits, y))")
            .param("logits", t(&[3, 4]))
            .param("y", Arg::I32Values(vec![3], vec![2, 0, 2]))
            .param("w", w(&[3]))
            .wrt(&["logits"]),
        mk("mean cross_entropy", "mean(nn.cross_entropy(logits, y))")
            .param("logits", t(&[4, 3]))
            .param("y", i32t(&[4], 0, 3))
            .wrt(&["logits"]),
        mk("mse", "nn.mse(pred, target)").param("pred", t(&[2, 3])).param("target", t(&[2, 3])),
        mk("mse scalar", "nn.mse(pred, target) * pred").param("pred", t(&[])).param("target", t(&[])),
        mk("layer_norm", "sum(w * nn.layer_norm(x, gamma, beta))")
            .param("x", t(&[2, 4]))
            .param("gamma", t(&[4]))
            .param("beta", t(&[4]))
            .param("w", w(&[2, 4])),
        mk("layer_norm 3d", "sum(w * nn.layer_norm(x, gamma, beta))")
            .param("x", t(&[2, 2, 3]))
            .param("gamma", t(&[3]))
            .param("beta", t(&[3]))
            .param("w", w(&[2, 2, 3])),
        mk("embedding", "sum(w * nn.embedding(table, ids))")
            .param("table", t(&[5, 3]))
            .param("ids", Arg::I32Values(vec![2, 3], vec![4, 1, 4, 0, 4, 2]))
            .param("w", w(&[2, 3, 3]))
            .wrt(&["table"]),
        mk("attention", "sum(w * nn.attention(q, k, v, false))")
            .param("q", t(&[1, 2, 3, 2]))
            .param("k", t(&[1, 2, 3, 2]))
            .param("v", t(&[1, 2, 3, 2]))
            .param("w", w(&[1, 2, 3, 2])),
        mk("attention causal", "sum(w * nn.attention(q, k, v, true))")
            .param("q", t(&[2, 1, 3, 2]))
            .param("k", t(&[2, 1, 3, 2]))
            .param("v", t(&[2, 1, 3, 2]))
            .param("w", w(&[2, 1, 3, 2])),
        mk("conv2d", "sum(w * nn.conv2d(x, k, b))")
            .param("x", t(&[1, 2, 4, 4]))
            .param("k", t(&[3, 2, 2, 2]))
            .param("b", t(&[3]))
            .param("w", w(&[1, 3, 3, 3])),
        mk("conv2d rect", "sum(w * nn.conv2d(x, k, b))")
            .param("x", t(&[2, 1, 3, 4]))
            .param("k", t(&[2, 1, 3, 2]))
            .param("b", t(&[2]))
            .param("w", w(&[2, 2, 1, 3])),
        mk("dropout", "sum(w * nn.dropout(x, 0.25, 3))").param("x", t(&[4, 5])).param("w", w(&[4, 5])),
        mk("dropout 3d", "sum(w * nn.dropout(x, 0.5, 4))").param("x", t(&[2, 3, 2])).param("w", w(&[2, 3, 2])),
        mk("batch_norm", "sum(w * nn.batch_norm(x, gamma, beta))")
            .param("x", t(&[2, 3, 2, 2]))
            .param("gamma", t(&[3]))
            .param("beta", t(&[3]))
            .param("w", w(&[2, 3, 2, 2])),
        mk(
            "mlp loss",
            "mean(nn.cross_entropy(nn.linear(nn.gelu(nn.layer_norm(nn.linear(x, a, b), g, be)), a2, b2), y))",
        )
        .param("x", t(&[3, 4]))
        .param("a", t(&[4, 5]))
        .param("b", t(&[5]))
        .param("g", t(&[5]))
        .param("be", t(&[5]))
        .param("a2", t(&[5, 3]))
        .param("b2", t(&[3]))
        .param("y", i32t(&[3], 0, 3))
        .wrt(&["x", "a", "b", "g", "a2"]),
    ]
}

#[test]
fn nn_f32() {
    run_all("nn_f32", nn_cases("f32"));
}

#[test]
fn nn_f64() {
    run_all("nn_f64", nn_cases("f64"));
}

// ---------------------------------------------------------------------------------------------
// Identities and closed forms.
