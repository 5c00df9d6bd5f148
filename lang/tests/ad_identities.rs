//! Identities of the transforms and their errors: ⟨vjp(u), v⟩ = ⟨u, Jv⟩ with Jv by finite
//! differences, higher derivatives against closed forms, and the diagnostics of `grad` misuse.

mod support;

#[allow(unused_imports)]
use support::*;
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

/// `jvp` through `gelu` and `gelu_grad` (its tangent rule needs `gelu''`) against central
/// differences along the tangent, in f64.
#[test]
fn gelu_tangents_match_finite_differences() {
    let text = "
fn h(x: f64[5]) -> f64[5] { gelu_grad(x, sin(x)) + gelu(x * 0.7) }
fn main() {
    let x = f64(stack([-2.5, -0.4, 0.0, 0.9, 3.1]))
    let v = f64(stack([0.3, -1.0, 0.5, 2.0, -0.7]))
    let (_, t) = jvp(h, (x,), (v,))
    let e = f64(1e-6)
    print(t - (h(x + e * v) - h(x - e * v)) / (2.0 * e))
    print(t)
}
";
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let c = lang::check::check_source("t.msl", text, dir);
    assert!(!c.has_errors(), "{:?}", c.diagnostics);
    let mut out = Vec::new();
    {
        let mut it = lang::interp::Interp::new(&c.program, Box::new(&mut out));
        it.run_main(c.program.main.unwrap()).unwrap_or_else(|e| panic!("{}", e.message));
    }
    let out = String::from_utf8(out).unwrap();
    let nums = |l: &str| -> Vec<f64> {
        l.trim_matches(|c| c == '[' || c == ']').split(", ").map(|x| x.parse().unwrap()).collect()
    };
    let mut lines = out.lines();
    let diff = nums(lines.next().unwrap());
    let t = nums(lines.next().unwrap());
    for (d, t) in diff.iter().zip(&t) {
        assert!(d.abs() <= 1e-7 * (1.0 + t.abs()), "{out}");
    }
    assert!(t.iter().any(|x| x.abs() > 0.1), "{out}");
}
