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
    run_all("indexing_and_gather", cases);
}

// ---------------------------------------------------------------------------------------------
// einsum.

#[test]
fn einsum_specs() {
    type Spec = (&'static str, Vec<Vec<usize>>, Vec<usize>);
    let specs: Vec<Spec> = vec![
        ("ij,jk->ik", vec![vec![2, 3], vec![3, 4]], vec![2, 4]),
        ("ij,jk", vec![vec![2, 3], vec![3, 4]], vec![2, 4]),
        ("i,j->ij", vec![vec![3], vec![2]], vec![3, 2]),
        ("ij->ji", vec![vec![2, 3]], vec![3, 2]),
        ("ij->", vec![vec![2, 3]], vec![]),
        ("ijk->ik", vec![vec![2, 3, 2]], vec![2, 2]),
        ("ij,ij->", vec![vec![2, 3], vec![2, 3]], vec![]),
        ("ij,ij->ij", vec![vec![2, 3], vec![2, 3]], vec![2, 3]),
        ("ij,j->i", vec![vec![2, 3], vec![3]], vec![2]),
        ("ij,kj->ik", vec![vec![2, 3], vec![4, 3]], vec![2, 4]),
        ("bij,bjk->bik", vec![vec![2, 2, 3], vec![2, 3, 2]], vec![2, 2, 2]),
        ("bhqd,bhkd->bhqk", vec![vec![1, 2, 3, 2], vec![1, 2, 4, 2]], vec![1, 2, 3, 4]),
        ("ij,jk,kl->il", vec![vec![2, 3], vec![3, 2], vec![2, 4]], vec![2, 4]),
        ("i,ij,j->", vec![vec![2], vec![2, 3], vec![3]], vec![]),
        ("ab,bc,ca->b", vec![vec![2, 3], vec![3, 4], vec![4, 2]], vec![3]),
        ("ijk,k->j", vec![vec![2, 3, 4], vec![4]], vec![3]),
        ("nchw,oc->nohw", vec![vec![1, 2, 2, 3], vec![3, 2]], vec![1, 3, 2, 3]),
    ];
    let names = ["a", "b", "c"];
    let mut cases = Vec::new();
    for (i, (spec, shapes, out)) in specs.iter().enumerate() {
        let ops: Vec<&str> = names[..shapes.len()].to_vec();
        let mut c = Case::new(format!("einsum {spec}"), format!("sum(w * einsum(\"{spec}\", {}))", ops.join(", ")))
            .seed(600 + i as u64);
        for (n, s) in ops.iter().zip(shapes) {
            c = c.param(n, f64t(s));
        }
        cases.push(c.weight(out));
    }
    cases.push(
        Case::new("einsum same operand twice", "sum(w * einsum(\"ij,kj->ik\", x, x))")
            .param("x", f64t(&[3, 2]))
            .weight(&[3, 3]),
    );
    run_all("einsum_specs", cases);
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
        .replace("var out = zeros(", "var out: f64[N, O, H - KH + 1, W - KW + 1] = zeros(")
        .replace("uniform(N, D, seed: seed)", "f64(uniform(N, D, seed: seed))");
    for name in [
        "linear",
        "relu",
        "gelu",
        "sigmoid",
        "softmax",
        "log_softmax",
        "cross_entropy",
        "mse",
        "accuracy",
        "layer_norm",
        "embedding",
        "attention",
        "conv2d",
        "dropout",
    ] {
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

fn tensor(shape: &[usize], data: Vec<f64>) -> lang::interp::Value {
    lang::interp::Value::Tensor(kernels::Tensor::from_f64(shape.to_vec(), data).expect("tensor"))
}

fn leaves(v: &lang::interp::Value) -> Vec<f64> {
    let mut ls = Vec::new();
    v.leaves(&mut ls);
    ls.iter().flat_map(|t| t.to_f64_vec()).collect()
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// ⟨pullback(u), v⟩ = ⟨u, J v⟩, with J v by central differences along v (jvp is not there yet).
#[test]
fn vjp_identity() {
    // (name, parameter shapes, result type, body)
    type Fun = (&'static str, Vec<Vec<usize>>, Vec<usize>, &'static str);
    let fns: Vec<Fun> = vec![
        ("elementwise", vec![vec![3, 2], vec![2]], vec![3, 2], "tanh(a * b) + exp(a) * b"),
        ("matmul", vec![vec![2, 3], vec![3, 4]], vec![2, 4], "sin(a @ b)"),
        ("reductions", vec![vec![3, 4], vec![4]], vec![3], "logsumexp(a * b, axis: 1) + max(a, axis: -1)"),
        (
            "shapes",
            vec![vec![2, 3], vec![3]],
            vec![3, 3],
            "concat([transpose(a) * b[0], expand_dims(b, axis: 1)], axis: 1)",
        ),
        ("scalar result", vec![vec![3], vec![3]], vec![], "sum(a * b * b)"),
        (
            "loop",
            vec![vec![3], vec![]],
            vec![3],
            "var y = a\n    for i in 0..3 {\n        y = y * b + sin(y)\n    }\n    y",
        ),
        ("single parameter", vec![vec![2, 2]], vec![2, 2], "a @ a + transpose(a)"),
    ];
    let names = ["a", "b"];
    let mut rng = Rng::new(77);
    let mut failures = Vec::new();
    for (name, shapes, out, body) in &fns {
        let params: Vec<String> =
            shapes.iter().enumerate().map(|(i, s)| format!("{}: {}", names[i], tensor_ty("f64", s))).collect();
        let args: Vec<&str> = names[..shapes.len()].to_vec();
        let rty = tensor_ty("f64", out);
        let text = format!(
            "fn h({ps}) -> {rty} {{\n    {body}\n}}\nfn pb({ps}, u: {rty}) -> ({cts}) {{\n    let (v, p) = vjp(h, {a})\n    p(u)\n}}\nfn val({ps}) -> {rty} {{\n    let (v, p) = vjp(h, {a})\n    v\n}}\n",
            ps = params.join(", "),
            cts = shapes.iter().map(|s| tensor_ty("f64", s)).collect::<Vec<_>>().join(", ") + if shapes.len() == 1 { "," } else { "" },
            a = args.join(", "),
        );
        let ck = match check(&text) {
            Ok(c) => c,
            Err(e) => {
                failures.push(format!("{name}: does not check:\n{e}\n{text}"));
                continue;
            }
        };
        let prog = &ck.program;
        let n = |s: &[usize]| s.iter().product::<usize>();
        let xs: Vec<Vec<f64>> = shapes.iter().map(|s| (0..n(s)).map(|_| rng.normal() * 0.7).collect()).collect();
        let vs: Vec<Vec<f64>> = shapes.iter().map(|s| (0..n(s)).map(|_| rng.normal()).collect()).collect();
        let u: Vec<f64> = (0..n(out)).map(|_| rng.normal()).collect();
        let xvals = |eps: f64| -> Vec<lang::interp::Value> {
            shapes
                .iter()
                .enumerate()
                .map(|(i, s)| tensor(s, xs[i].iter().zip(&vs[i]).map(|(x, v)| x + eps * v).collect()))
                .collect()
        };
        let run = || -> Result<(), String> {
            let mut a = xvals(0.0);
            a.push(tensor(out, u.clone()));
            let ct = leaves(&call(prog, "pb", a)?);
            let lhs = dot(&ct, &vs.concat());
            let h = 1e-6;
            let yp = leaves(&call(prog, "h", xvals(h))?);
            let ym = leaves(&call(prog, "h", xvals(-h))?);
            let jv: Vec<f64> = yp.iter().zip(&ym).map(|(p, m)| (p - m) / (2.0 * h)).collect();
            let rhs = dot(&u, &jv);
            if (lhs - rhs).abs() > 1e-7 * (1.0 + rhs.abs()) {
                return Err(format!("⟨pullback(u), v⟩ = {lhs} but ⟨u, J v⟩ = {rhs}"));
            }
            let v0 = leaves(&call(prog, "val", xvals(0.0))?);
            let y0 = leaves(&call(prog, "h", xvals(0.0))?);
            if v0.iter().zip(&y0).any(|(a, b)| (a - b).abs() > 1e-12 * (1.0 + b.abs())) {
                return Err(format!("vjp value {v0:?} differs from h {y0:?}"));
            }
            Ok(())
        };
        if let Err(e) = run() {
            failures.push(format!("{name}: {e}\n{text}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// Higher-order derivatives against closed forms, and `grad`/`value_and_grad` without `wrt`.
#[test]
fn higher_order_closed_forms() {
    let text = "
fn cube(t: f64) -> f64 { t * t * t }
fn poly(t: f64) -> f64 { 2.0 * t ** 4 - 3.0 * t * t * t + t * t - 5.0 }
fn mixed(x: f64, y: f64) -> f64 { sin(x * y) + x * x * y * y * y }
fn d2_cube(x: f64) -> f64 { grad(grad(|t: f64| t * t * t))(x) }
fn d2_cube_named(x: f64) -> f64 { grad(grad(cube))(x) }
fn d2_sin(x: f64) -> f64 { grad(grad(|t: f64| sin(t)))(x) }
fn d2_sin_builtin(x: f64) -> f64 { grad(grad(sin))(x) }
fn d3_poly(x: f64) -> f64 { grad(grad(grad(poly)))(x) }
fn d4_poly(x: f64) -> f64 { grad(grad(grad(grad(poly))))(x) }
fn d3_exp(x: f64) -> f64 { grad(grad(grad(|t: f64| exp(2.0 * t))))(x) }
fn d2_tanh(x: f64) -> f64 { grad(grad(|t: f64| tanh(t)))(x) }
fn d2_log(x: f64) -> f64 { grad(grad(|t: f64| log(t)))(x) }
fn dxy(x: f64, y: f64) -> f64 { grad(|b: f64| grad(mixed)(x, b))(y) }
fn dyx(x: f64, y: f64) -> f64 { grad(|a: f64| grad(mixed, wrt: y)(a, y))(x) }
fn dx_default(x: f64, y: f64) -> f64 { grad(mixed)(x, y) }
fn vg_default(x: f64, y: f64) -> (f64, f64) { value_and_grad(mixed)(x, y) }
fn vg_of_grad(x: f64) -> (f64, f64) { value_and_grad(grad(poly))(x) }
fn hess_diag(x: f64[3]) -> f64[3] { grad(|t: f64[3]| sum(grad(|s: f64[3]| sum(s * s * s * x))(t)))(x) }
";
    let ck = check(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let prog = &ck.program;
    let s = |x: f64| tensor(&[], vec![x]);
    let mut failures = Vec::new();
    let mut expect = |name: &str, args: Vec<lang::interp::Value>, want: Vec<f64>| match call(prog, name, args) {
        Ok(v) => {
            let got = leaves(&v);
            if got.len() != want.len() || got.iter().zip(&want).any(|(g, w)| (g - w).abs() > 1e-10 * (1.0 + w.abs())) {
                failures.push(format!("{name}: got {got:?}, expected {want:?}"));
            }
        }
        Err(e) => failures.push(format!("{name}: {e}")),
    };
    for &x in &[-1.3, 0.4, 2.1] {
        let y = 0.7;
        expect("d2_cube", vec![s(x)], vec![6.0 * x]);
        expect("d2_cube_named", vec![s(x)], vec![6.0 * x]);
        expect("d2_sin", vec![s(x)], vec![-x.sin()]);
        expect("d2_sin_builtin", vec![s(x)], vec![-x.sin()]);
        expect("d3_poly", vec![s(x)], vec![48.0 * x - 18.0]);
        expect("d4_poly", vec![s(x)], vec![48.0]);
        expect("d3_exp", vec![s(x)], vec![8.0 * (2.0 * x).exp()]);
        let th = x.tanh();
        expect("d2_tanh", vec![s(x)], vec![-2.0 * th * (1.0 - th * th)]);
        expect("d2_log", vec![s(x.abs())], vec![-1.0 / (x * x)]);
        let m = (x * y).cos() - x * y * (x * y).sin() + 6.0 * x * y * y;
        expect("dxy", vec![s(x), s(y)], vec![m]);
        expect("dyx", vec![s(x), s(y)], vec![m]);
        expect("dx_default", vec![s(x), s(y)], vec![y * (x * y).cos() + 2.0 * x * y * y * y]);
        expect(
            "vg_default",
            vec![s(x), s(y)],
            vec![(x * y).sin() + x * x * y * y * y, y * (x * y).cos() + 2.0 * x * y * y * y],
        );
        expect("vg_of_grad", vec![s(x)], vec![8.0 * x * x * x - 9.0 * x * x + 2.0 * x, 24.0 * x * x - 18.0 * x + 2.0]);
    }
    expect("hess_diag", vec![tensor(&[3], vec![0.5, -1.0, 2.0])], vec![1.5, 6.0, 24.0]);
    assert!(failures.is_empty(), "{}\n{text}", failures.join("\n"));
}

// ---------------------------------------------------------------------------------------------
// Diagnostics.

/// The codes of a program's diagnostics (the checker must not panic).
fn codes(text: &str) -> Vec<(String, String)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let c = std::panic::catch_unwind(|| lang::check::check_source("err.msl", text, dir))
        .unwrap_or_else(|p| panic!("checker panicked: {}\n{text}", panic_msg(&p)));
    c.diagnostics.iter().map(|d| (d.code.to_string(), d.message.clone())).collect()
}

#[test]
fn differentiation_errors() {
    let mut failures = Vec::new();
    let mut expect = |code: &str, names: &[&str], text: &str| {
        let ds = codes(text);
        let ok = ds.iter().any(|(c, m)| c == code && (names.is_empty() || names.iter().any(|n| m.contains(n))));
        if !ok {
            failures.push(format!("expected {code} naming one of {names:?}, got {ds:?}\n{text}"));
        }
    };
    expect(
        "E0401",
        &[],
        "fn sq(x: f64[3]) -> f64[3] { x * x }\nfn main() {\n    let x: f64[3] = zeros(3)\n    print(grad(sq)(x))\n}\n",
    );
    expect(
        "E0401",
        &[],
        "fn n(x: f64) -> i32 { i32(x) }\nfn main() {\n    let x: f64 = 1.0\n    print(grad(n)(x))\n}\n",
    );
    expect("E0401", &[], "fn t(x: f64) -> (f64, f64) { (x, x) }\nfn main() {\n    let x: f64 = 1.0\n    print(value_and_grad(t)(x))\n}\n");
    expect("E0402", &["n"], "fn power(x: f64, n: i32) -> f64 { x ** f64(n) }\nfn main() {\n    let x: f64 = 2.0\n    print(grad(power, wrt: n)(x, 3))\n}\n");
    expect("E0402", &["b"], "fn f(x: f64, b: bool) -> f64 { where(b, x, 0.0) }\nfn main() {\n    let x: f64 = 2.0\n    print(grad(f, wrt: b)(x, true))\n}\n");
    let through = |body: &str| {
        format!("fn f(x: f64[3]) -> f64 {{ {body} }}\nfn main() {{\n    let x: f64[3] = f64(arange(3))\n    print(grad(f)(x))\n}}\n")
    };
    expect("E0403", &["argmax"], &through("f64(argmax(x)) * sum(x)"));
    expect("E0403", &["argmin"], &through("sum(x) * f64(argmin(x * x))"));
    expect("E0403", &["argmax"], &through("sum(x * f64(one_hot(argmax(x), 3)))"));
    expect("E0403", &[">", "gt", "comparison"], &through("sum(f64(x > 0.0) * x)"));
    expect("E0403", &["i32", "cast"], &through("sum(f64(i32(x * 3.0)) * x)"));
    expect("E0403", &["floor"], &through("sum(floor(x) * x)"));
    expect("E0403", &["sign"], &through("sum(sign(x) * x)"));
    // An integer that depends on x through argmax, used in a comparison or indexed before the
    // cast to float, is still a non-differentiable path.
    let through2 = |body: &str| {
        format!("fn f(x: f64[2, 3], y: i32[2]) -> f64 {{ {body} }}\nfn main() {{\n    let x: f64[2, 3] = f64(reshape(arange(6), [2, 3]))\n    let y: i32[2] = arange(2)\n    print(grad(f)(x, y))\n}}\n")
    };
    expect("E0403", &["argmax"], &through2("mean(f64(argmax(x, axis: -1)))"));
    expect("E0403", &["argmax", "=="], &through2("mean(f64(argmax(x, axis: -1) == y)) * sum(x)"));
    expect("E0403", &["argmax"], &through2("f64(argmax(x, axis: -1)[0]) * sum(x)"));
    expect(
        "E0403",
        &["argmax"],
        "use nn\nfn f(l: f32[2, 3], y: i32[2]) -> f32 { nn.accuracy(l, y) }\nfn main() {\n    let l: f32[2, 3] = zeros(2, 3)\n    let y: i32[2] = zeros(2)\n    print(grad(f)(l, y))\n}\n",
    );
    // Negative controls: comparisons as `where` conditions, integer one_hot and stop_gradient
    // around a non-differentiable builtin are fine.
    let fine = |body: &str| through(body);
    for body in [
        "sum(where(x > 0.0, x, -x))",
        "sum(x * stop_gradient(f64(argmax(x))))",
        "sum(x * f64(one_hot(argmax(stop_gradient(x)), 3)))",
        "sum(x) * f64(argmax(stop_gradient(x)))",
        "sum(x * f64(arange(3)))",
    ] {
        let t = fine(body);
        let ds = codes(&t);
        if !ds.is_empty() {
            failures.push(format!("expected no diagnostics, got {ds:?}\n{t}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// `jvp` and differentiating through `vmap` are not implemented yet: they must fail cleanly
/// (a diagnostic, or a run-time error), never panic.
#[test]
fn unimplemented_transforms_fail_cleanly() {
    let programs = [
        "fn f(x: f64[3]) -> f64 { sum(sin(x)) }\nfn main() {\n    let x: f64[3] = f64(arange(3))\n    let (y, dy) = jvp(f, (x,), (x,))\n    print(y, dy)\n}\n",
        "fn f(x: f64[3]) -> f64[3] { sin(x) }\nfn main() {\n    let x: f64[3] = f64(arange(3))\n    print(jvp(f, (x,), (x,)))\n}\n",
        "fn f(x: f64) -> f64 { sin(x) * x }\nfn g(x: f64[4]) -> f64 { sum(vmap(f)(x)) }\nfn main() {\n    let x: f64[4] = f64(arange(4))\n    print(grad(g)(x))\n}\n",
        "fn f(x: f64) -> f64 { sin(x) * x }\nfn main() {\n    let x: f64[4] = f64(arange(4))\n    print(vmap(grad(f))(x))\n}\n",
        "fn f(x: f64) -> f64 { sin(x) * x }\nfn main() {\n    let x: f64[4] = f64(arange(4))\n    print(jvp(grad(f), (x[0],), (1.0,)))\n}\n",
        "fn main() {\n    let x: f64[2, 2] = eye(2)\n    print(grad(|m: f64[2, 2]| einsum(\"ii->\", m))(x))\n}\n",
    ];
    for text in programs {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let c = std::panic::catch_unwind(|| lang::check::check_source("t.msl", text, dir))
            .unwrap_or_else(|p| panic!("checker panicked: {}\n{text}", panic_msg(&p)));
        if c.has_errors() {
            continue;
        }
        let main = c.program.main.expect("main");
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut it = lang::interp::Interp::new(&c.program, Box::new(std::io::sink()));
            it.run_main(main).map(|_| ())
        }));
        if let Err(p) = r {
            panic!("interpreter panicked: {}\n{text}", panic_msg(&p));
        }
    }
}

/// The harness itself notices a wrong gradient (finite differences see through stop_gradient).
#[test]
fn harness_detects_a_wrong_gradient() {
    let mut st = Stats::default();
    st.run(
        &Case::new("deliberately wrong", "sum(w * x * stop_gradient(x))")
            .param("x", f64t(&[3]))
            .weight(&[3])
            .first_order_only(),
    );
    assert_eq!(st.failures.len(), 1, "the harness missed a wrong gradient");
}

// ---------------------------------------------------------------------------------------------
// Random shapes for the shape functions, indexing, gather, matmul and einsum.

fn perm(rng: &mut Rng, n: usize) -> Vec<usize> {
    let mut p: Vec<usize> = (0..n).collect();
    for i in (1..n).rev() {
        let j = rng.range(0, i + 1);
        p.swap(i, j);
    }
    p
}

fn list(xs: &[usize]) -> String {
    format!("[{}]", shape_str(xs))
}

#[test]
fn random_shapes() {
    // GRADCHECK_ROUNDS=n runs more random rounds (and GRADCHECK_SEED another sequence).
    let rounds: usize = std::env::var("GRADCHECK_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(6);
    let seed0: u64 = std::env::var("GRADCHECK_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or(2024);
    let mut rng = Rng::new(seed0);
    let mut cases = Vec::new();
    for round in 0..rounds {
        let seed = 900 + round as u64 * 20;
        // reshape to a random factorisation of the element count.
        let s = rng.shape(1, 3);
        let n: usize = s.iter().product();
        let mut t = Vec::new();
        let mut rest = n;
        while rest > 1 && t.len() < 3 {
            let divs: Vec<usize> = (1..=rest).filter(|d| rest.is_multiple_of(*d)).collect();
            let d = rng.pick(&divs);
            t.push(d);
            rest /= d;
        }
        t.push(rest);
        cases.push(
            Case::new(format!("reshape {s:?} -> {t:?}"), format!("sum(w * reshape(sin(x), {}))", list(&t)))
                .param("x", f64t(&s))
                .weight(&t)
                .seed(seed),
        );
        // permute.
        let s = rng.shape(2, 4);
        let p = perm(&mut rng, s.len());
        let o: Vec<usize> = p.iter().map(|&i| s[i]).collect();
        cases.push(
            Case::new(format!("permute {s:?} by {p:?}"), format!("sum(w * permute(x, {}))", list(&p)))
                .param("x", f64t(&s))
                .weight(&o)
                .seed(seed + 1),
        );
        // concat of 2–3 operands along a random axis (written negative half the time).
        let s = rng.shape(1, 3);
        let r = s.len();
        let axis = rng.range(0, r);
        let k = rng.range(2, 4);
        let shapes: Vec<Vec<usize>> = (0..k)
            .map(|_| {
                let mut x = s.clone();
                x[axis] = rng.range(1, 4);
                x
            })
            .collect();
        let mut o = s.clone();
        o[axis] = shapes.iter().map(|x| x[axis]).sum();
        let ax = if rng.coin(0.5) { axis as i64 } else { axis as i64 - r as i64 };
        let names: Vec<String> = (0..k).map(|i| format!("x{i}")).collect();
        let mut c = Case::new(
            format!("concat {shapes:?} axis {ax}"),
            format!("sum(w * concat([{}], axis: {ax}))", names.join(", ")),
        )
        .seed(seed + 2);
        for (nm, sh) in names.iter().zip(&shapes) {
            c = c.param(nm, f64t(sh));
        }
        cases.push(c.weight(&o));
        // stack along a random axis.
        let s = rng.shape(0, 2);
        let axis = rng.range(0, s.len() + 1);
        let mut o = s.clone();
        o.insert(axis, 3);
        cases.push(
            Case::new(format!("stack {s:?} axis {axis}"), format!("sum(w * stack([x, y * y, x * y], axis: {axis}))"))
                .param("x", f64t(&s))
                .param("y", f64t(&s))
                .weight(&o)
                .seed(seed + 3),
        );
        // expand_dims at a random (possibly negative) position, then squeeze it back.
        let s = rng.shape(0, 3);
        let pos = rng.range(0, s.len() + 1);
        let ax = if rng.coin(0.5) { pos as i64 } else { pos as i64 - s.len() as i64 - 1 };
        let mut o = s.clone();
        o.insert(pos, 1);
        cases.push(
            Case::new(format!("expand_dims {s:?} axis {ax}"), format!("sum(w * expand_dims(x, axis: {ax}))"))
                .param("x", f64t(&s))
                .weight(&o)
                .seed(seed + 4),
        );
        cases.push(
            Case::new(format!("squeeze {o:?} axis {pos}"), format!("sum(w * squeeze(exp(x), axis: {pos}))"))
                .param("x", f64t(&o))
                .weight(&s)
                .seed(seed + 5),
        );
        // broadcast_to.
        let (a, b) = rng.broadcast_pair();
        let o = broadcast(&a, &b);
        cases.push(
            Case::new(format!("broadcast_to {a:?} -> {o:?}"), format!("sum(w * broadcast_to(x * x, {}))", list(&o)))
                .param("x", f64t(&a))
                .weight(&o)
                .seed(seed + 6),
        );
        // slicing: per dim an index (maybe negative), a range, or everything.
        let s = rng.shape(1, 3);
        let mut items = Vec::new();
        let mut o = Vec::new();
        for &d in &s {
            match rng.range(0, 3) {
                0 => {
                    let i = rng.range(0, d) as i64;
                    items.push(if rng.coin(0.5) { format!("{i}") } else { format!("{}", i - d as i64) });
                }
                1 => {
                    let a = rng.range(0, d);
                    let b = rng.range(a + 1, d + 1);
                    items.push(format!("{a}:{b}"));
                    o.push(b - a);
                }
                _ => {
                    items.push(":".into());
                    o.push(d);
                }
            }
        }
        cases.push(
            Case::new(format!("x[{}] of {s:?}", items.join(", ")), format!("sum(w * x[{}])", items.join(", ")))
                .param("x", f64t(&s))
                .weight(&o)
                .seed(seed + 7),
        );
        // gather along a random axis with random indices (repeats likely).
        let s = rng.shape(1, 3);
        let axis = rng.range(0, s.len());
        let is = rng.shape(0, 2);
        let mut o: Vec<usize> = s[..axis].to_vec();
        o.extend(&is);
        o.extend(&s[axis + 1..]);
        let ax = if rng.coin(0.5) { axis as i64 } else { axis as i64 - s.len() as i64 };
        cases.push(
            Case::new(
                format!("gather {s:?} axis {ax} idx {is:?}"),
                format!("sum(w * gather(sin(x), idx, axis: {ax}))"),
            )
            .param("x", f64t(&s))
            .param("idx", i32t(&is, 0, s[axis] as i32))
            .weight(&o)
            .seed(seed + 8),
        );
        // batched matmul with random batch broadcasting.
        let (ba, bb) = {
            let (p, q) = rng.broadcast_pair();
            (p[p.len().saturating_sub(2)..].to_vec(), q[q.len().saturating_sub(2)..].to_vec())
        };
        let (m, k, nn) = (rng.range(1, 4), rng.range(1, 4), rng.range(1, 4));
        let sa: Vec<usize> = ba.iter().copied().chain([m, k]).collect();
        let sb: Vec<usize> = bb.iter().copied().chain([k, nn]).collect();
        let mut o = broadcast(&ba, &bb);
        o.extend([m, nn]);
        cases.push(
            Case::new(format!("matmul {sa:?} @ {sb:?}"), "sum(w * (a @ b))")
                .param("a", f64t(&sa))
                .param("b", f64t(&sb))
                .weight(&o)
                .seed(seed + 9),
        );
        // einsum: two operands over random letters, a random set of them kept.
        let pool = ['a', 'b', 'c', 'd'];
        let sizes: Vec<usize> = (0..4).map(|_| rng.range(1, 4)).collect();
        let pick = |rng: &mut Rng| -> Vec<usize> {
            let r = rng.range(1, 4);
            perm(rng, 4)[..r].to_vec()
        };
        let (la, lb) = (pick(&mut rng), pick(&mut rng));
        let mut all: Vec<usize> = la.iter().chain(&lb).copied().collect();
        all.sort();
        all.dedup();
        let keep: Vec<usize> = all.iter().copied().filter(|_| rng.coin(0.5)).collect();
        let word = |ls: &[usize]| ls.iter().map(|&i| pool[i]).collect::<String>();
        let shape_of = |ls: &[usize]| ls.iter().map(|&i| sizes[i]).collect::<Vec<_>>();
        let spec = format!("{},{}->{}", word(&la), word(&lb), word(&keep));
        cases.push(
            Case::new(format!("einsum {spec}"), format!("sum(w * einsum(\"{spec}\", a, b))"))
                .param("a", f64t(&shape_of(&la)))
                .param("b", f64t(&shape_of(&lb)))
                .weight(&shape_of(&keep))
                .seed(seed + 10),
        );
    }
    run_all("random_shapes", cases);
}

// ---------------------------------------------------------------------------------------------
// Closed forms where finite differences cannot decide: ties, and generic (`..`) roots.

#[test]
fn ties_and_generic_roots() {
    let text = "
use nn
fn mx(x: f64[4]) -> f64 { max(x) }
fn mn_axis(x: f64[2, 3]) -> f64 { sum(w() * min(x, axis: 1)) }
fn mx_keep(x: f64[2, 3]) -> f64 { sum(max(x, axis: 0, keepdims: true) * 2.0) }
fn w() -> f64[2] { f64(arange(2)) + 1.0 }
fn gmean[..S](x: f64[..S]) -> f64 { mean(x * x) }
fn d_mx(x: f64[4]) -> f64[4] { grad(mx)(x) }
fn d_mn_axis(x: f64[2, 3]) -> f64[2, 3] { grad(mn_axis)(x) }
fn d_mx_keep(x: f64[2, 3]) -> f64[2, 3] { grad(mx_keep)(x) }
fn dd_mx(x: f64[4]) -> f64[4] { grad(|t: f64[4]| sum(grad(mx)(t) * t))(x) }
fn d_gmean(x: f64[2, 3]) -> f64[2, 3] { grad(gmean)(x) }
fn d_mse(p: f32[2, 3], t: f32[2, 3]) -> f32[2, 3] { grad(nn.mse)(p, t) }
";
    let ck = check(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let prog = &ck.program;
    let mut failures = Vec::new();
    let mut expect = |name: &str, args: Vec<lang::interp::Value>, want: &[f64]| match call(prog, name, args) {
        Ok(v) => {
            let got = leaves(&v);
            if got.len() != want.len() || got.iter().zip(want).any(|(g, w)| (g - w).abs() > 1e-6 * (1.0 + w.abs())) {
                failures.push(format!("{name}: got {got:?}, expected {want:?}"));
            }
        }
        Err(e) => failures.push(format!("{name}: {e}")),
    };
    // Tied extrema share the cotangent equally (JAX and PyTorch do the same).
    expect("d_mx", vec![tensor(&[4], vec![1.0, 3.0, 3.0, 2.0])], &[0.0, 0.5, 0.5, 0.0]);
    expect("d_mx", vec![tensor(&[4], vec![2.0; 4])], &[0.25; 4]);
    expect("d_mn_axis", vec![tensor(&[2, 3], vec![1.0, 1.0, 4.0, 0.0, 5.0, 0.0])], &[0.5, 0.5, 0.0, 1.0, 0.0, 1.0]);
    expect("d_mx_keep", vec![tensor(&[2, 3], vec![1.0, 2.0, 4.0, 1.0, 5.0, 0.0])], &[1.0, 0.0, 2.0, 1.0, 2.0, 0.0]);
    expect("dd_mx", vec![tensor(&[4], vec![1.0, 3.0, 3.0, 2.0])], &[0.0, 0.5, 0.5, 0.0]);
    // A generic root over a `..` rest: the mean divides by the run-time element count.
    let x = vec![0.5, -1.0, 2.0, 0.0, 1.5, -0.5];
    expect("d_gmean", vec![tensor(&[2, 3], x.clone())], &x.iter().map(|v| 2.0 * v / 6.0).collect::<Vec<_>>());
    let f32t = |v: Vec<f64>| {
        lang::interp::Value::Tensor(
            kernels::Tensor::from_f32(vec![2, 3], v.iter().map(|&x| x as f32).collect()).unwrap(),
        )
    };
    expect("d_mse", vec![f32t(x.clone()), f32t(vec![0.0; 6])], &x.iter().map(|v| 2.0 * v / 6.0).collect::<Vec<_>>());
    assert!(failures.is_empty(), "{}\n{text}", failures.join("\n"));
}

// ---------------------------------------------------------------------------------------------
// Compositions of control flow, models, closures and nested differentiation.

#[test]
fn compositions() {
    let model = "model P { a: f64[3] = zeros(3), b: f64[3, 2] = zeros(3, 2) }
fn loss(m: P, x: f64[2]) -> f64 { sum(tanh(m.b @ x) * m.a) + sum(m.a * m.a) * 0.1 }
fn sgd[M: Model](m: M, g: M, lr: f64) -> M { m - lr * g }";
    let p = || Arg::Model { name: "P".into(), dims: vec![], fields: vec![f64t(&[3]), f64t(&[3, 2])] };
    let mut cases = vec![
        Case::new("accumulator that starts inactive", "var acc: f64[3] = zeros(3)\n    for i in 0..3 {\n        acc = acc * x + sin(x * f64(i))\n    }\n    sum(w * acc)")
            .param("x", f64t(&[3]))
            .weight(&[3]),
        Case::new("if inside for", "var y = x\n    for i in 0..4 {\n        if i % 2 == 0 {\n            y = y * x\n        } else {\n            y = sin(y) + x\n        }\n    }\n    sum(w * y)")
            .param("x", f64d(&[3], Dist::Range(-0.9, 0.9)))
            .weight(&[3]),
        Case::new("data-dependent if inside for", "var y = x\n    for i in 0..3 {\n        if sum(y) > 0.0 {\n            y = y * 0.5 - x\n        } else {\n            y = exp(y) * x\n        }\n    }\n    sum(w * y)")
            .param("x", f64t(&[2]))
            .weight(&[2]),
        Case::new("for inside if", "var y = x\n    if x[0] > -10.0 {\n        for i in 0..3 {\n            y = tanh(y * x) + y\n        }\n    }\n    sum(w * y)")
            .param("x", f64t(&[3]))
            .weight(&[3]),
        Case::new("else-if chain", "let y = if x[0] > 1.0 { x * x } else if x[0] > 0.0 { sin(x) } else if x[0] > -1.0 { exp(x) } else { -x }\n    sum(w * y)")
            .param("x", f64t(&[2]))
            .weight(&[2]),
        Case::new("if with one constant branch", "let y = if n > 0 { x * x } else { f64(ones(3)) }\n    sum(w * y)")
            .param("x", f64t(&[3]))
            .param("n", Arg::I32Values(vec![], vec![1]))
            .weight(&[3]),
        Case::new("if returning a tuple", "let (a, b) = if x[0] > 0.0 { (x, sin(x)) } else { (cos(x), x * x) }\n    sum(w * a * b)")
            .param("x", f64t(&[3]))
            .weight(&[3]),
        Case::new("while with an if inside", "var y = x\n    var k = 0\n    while k < 3 {\n        if k == 1 {\n            y = y * y\n        }\n        y = y + x * 0.5\n        k = k + 1\n    }\n    sum(w * y)")
            .param("x", f64d(&[2], Dist::Range(-0.9, 0.9)))
            .weight(&[2]),
        Case::new("closure defined in a loop", "var y = x\n    for i in 0..3 {\n        let g = |t: f64[3]| t * y + x\n        y = g(sin(y))\n    }\n    sum(w * y)")
            .param("x", f64d(&[3], Dist::Range(-0.9, 0.9)))
            .weight(&[3]),
        Case::new("loop over static slices written into a var", "var acc = x * 0.0\n    for i in 0..2 {\n        acc = acc + concat([acc[1:] * x[:2], x[:1]]) * x\n    }\n    sum(w * acc)")
            .param("x", f64t(&[3]))
            .weight(&[3]),
        Case::new("model carried through a loop", "var m = p\n    for i in 0..2 {\n        m = m * 0.9 + m * m * 0.05\n    }\n    loss(m, x)")
            .prelude(model)
            .param("p", p())
            .param("x", f64t(&[2])),
        Case::new("meta-gradient through an sgd step", "let m2 = sgd(p, grad(loss)(p, x), 0.3)\n    loss(m2, x)")
            .prelude(model)
            .param("p", p())
            .param("x", f64t(&[2])),
        Case::new("meta-gradient through a loop of sgd steps", "var m = p\n    for i in 0..2 {\n        m = sgd(m, grad(loss)(m, x), 0.2)\n    }\n    loss(m, x)")
            .prelude(model)
            .param("p", p())
            .param("x", f64t(&[2])),
        Case::new("value_and_grad used in the forward pass", "let (l, g) = value_and_grad(loss)(p, x)\n    l * l + sum(g.a * g.a) + sum(g.b)")
            .prelude(model)
            .param("p", p())
            .param("x", f64t(&[2])),
        Case::new("vjp used in the forward pass", "let (v, pb) = vjp(|t: f64[3]| sin(t) * x, x)\n    let (ct,) = pb(w)\n    sum(v * ct)")
            .param("x", f64t(&[3]))
            .weight(&[3])
            .allow_e0403(),
        Case::new("field of a generic model function's result", "loss(twice(p), x)")
            .prelude(model)
            .prelude("fn twice[M: Model](m: M) -> M { m * 2.0 }")
            .param("p", p())
            .param("x", f64t(&[2])),
        // Not supported yet: the cotangent of the scalar in `lr * model`. A clean E0403 is accepted.
        Case::new("gradient wrt a learning rate", "loss(p - lr * grad(loss)(p, x), x)")
            .prelude(model)
            .param("p", p())
            .param("x", f64t(&[2]))
            .param("lr", f64d(&[], Dist::Range(0.1, 0.3)))
            .wrt(&["lr"])
            .allow_e0403(),
        // Not supported yet: `map` over a model. A clean E0403 is accepted.
        Case::new("map over a model", "let q = map(sq, p)\n    sum(q.a) + sum(q.b * p.b)")
            .prelude(model)
            .prelude("fn sq[..S](t: f64[..S]) -> f64[..S] { t * t }")
            .param("p", p())
            .allow_e0403(),
        Case::new("generic model function", "loss(scale(p) + p, x)")
            .prelude(model)
            .prelude("fn scale[M: Model](m: M) -> M { m * 2.0 - m * m }")
            .param("p", p())
            .param("x", f64t(&[2])),
    ];
    cases.push(
        Case::new(
            "grad of grad inside f",
            "sum(w * grad(|t: f64[2]| sum(grad(|s: f64[2]| sum(sin(s) * s * x))(t) * t))(x))",
        )
        .param("x", f64t(&[2]))
        .weight(&[2]),
    );
    run_all("compositions", cases);
}
