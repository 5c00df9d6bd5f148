//! Random sharded programs for differential testing of the sharding pass (`tests/mpi.rs`): each
//! is a set of functions on `mesh M[dp = 2, mp = 2]` whose parameters and `let`s carry random
//! layouts, built from the primitives the propagation rules know (elementwise with
//! broadcasting, `@`, `einsum`, reductions, `softmax`, `transpose`, reshapes, slices, `where`)
//! over static shapes, and a `main` that prints every function's value and gradient. Under
//! `mpirun` such a program must print what it prints on one process.

use crate::common::Rng;

/// A matrix value in scope: its name and static shape.
#[derive(Clone)]
struct Val {
    name: String,
    rows: usize,
    cols: usize,
}

/// A type `f32[r @x, c @y]` with a random layout (no axis twice).
fn layout_ty(r: &mut Rng, rows: usize, cols: usize) -> String {
    let axes = ["", " @dp", " @mp", " @(dp, mp)"];
    let a = *r.pick(&axes);
    let b = loop {
        let b = *r.pick(&axes);
        let clash = (a.contains("dp") && b.contains("dp")) || (a.contains("mp") && b.contains("mp"));
        if !clash {
            break b;
        }
    };
    format!("f32[{rows}{a}, {cols}{b}]")
}

/// One random function `name(a, b) -> f32`.
fn function(r: &mut Rng, name: &str) -> (String, (usize, usize), (usize, usize)) {
    let sizes = [4, 8];
    let (ra, ca, cb) = (*r.pick(&sizes), *r.pick(&sizes), *r.pick(&sizes));
    let mut body = String::new();
    let mut pool = vec![Val { name: "a".into(), rows: ra, cols: ca }, Val { name: "b".into(), rows: ca, cols: cb }];
    let steps = 3 + r.below(5);
    for i in 0..steps {
        let x = r.pick(&pool).clone();
        let same: Vec<Val> = pool.iter().filter(|v| v.rows == x.rows && v.cols == x.cols).cloned().collect();
        let y = r.pick(&same).clone();
        let mut op = r.below(13);
        // Ops whose shapes need room: fall back to `tanh` where they do not fit.
        if (op == 7 && (x.cols < 2 || !x.cols.is_multiple_of(2)))
            || (op == 8 && x.cols < 4)
            || (op == 9 && x.cols < 2)
            || (op == 10 && x.rows < 4)
        {
            op = 0;
        }
        let (expr, rows, cols) = match op {
            0 => (format!("tanh({})", x.name), x.rows, x.cols),
            1 => (format!("{} * {} + 0.5", x.name, y.name), x.rows, x.cols),
            2 => (format!("{} - sum({}, axis: 0) / 4.0", x.name, y.name), x.rows, x.cols),
            3 => match pool.iter().find(|v| v.rows == x.cols) {
                Some(z) => (format!("{} @ {}", x.name, z.name), x.rows, z.cols),
                None => (format!("transpose({})", x.name), x.cols, x.rows),
            },
            4 => match pool.iter().find(|v| v.cols == x.cols) {
                Some(z) => (format!("einsum(\"ij,kj->ik\", {}, {})", x.name, z.name), x.rows, z.rows),
                None => (format!("relu({})", x.name), x.rows, x.cols),
            },
            5 => (format!("softmax({})", x.name), x.rows, x.cols),
            6 => (format!("transpose({})", x.name), x.cols, x.rows),
            7 => (format!("sum(reshape({}, [{}, 2, {}]), axis: 2)", x.name, x.rows, x.cols / 2), x.rows, 2),
            8 => (format!("reshape({}, [{}, {}])", x.name, x.rows * 2, x.cols / 2), x.rows * 2, x.cols / 2),
            9 => (format!("{}[:, 0:2] * 2.0", x.name), x.rows, 2),
            10 => (format!("{}[1:3, :]", x.name), 2, x.cols),
            11 => (format!("where({} > 0.0, {}, {} * 0.25)", x.name, x.name, y.name), x.rows, x.cols),
            _ => (format!("expand_dims(mean({}, axis: 1), axis: 1) + {}", x.name, y.name), x.rows, x.cols),
        };
        let v = format!("v{i}");
        // Half the values are annotated with a layout of their own (a redistribution).
        if r.below(2) == 0 && rows % 4 == 0 && cols % 4 == 0 {
            body.push_str(&format!("    let {v}: {} = {expr}\n", layout_ty(r, rows, cols)));
        } else {
            body.push_str(&format!("    let {v} = {expr}\n"));
        }
        pool.push(Val { name: v, rows, cols });
    }
    let last = &pool[pool.len() - 1].name;
    let src = format!(
        "fn {name}(a: {}, b: {}) -> f32 {{\n{body}    sum(tanh({last}) * {last}) + 0.1 * sum(a * a)\n}}\n",
        layout_ty(r, ra, ca),
        layout_ty(r, ca, cb)
    );
    (src, (ra, ca), (ca, cb))
}

/// A program of `n` random functions from `seed`, with a `main` printing each one's value and
/// its gradient with respect to `a`.
pub fn program(seed: u64, n: usize) -> String {
    let mut r = Rng::new(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let mut src = String::from("mesh M[dp = 2, mp = 2]\n\n");
    let mut main = String::from("fn main() {\n");
    for i in 0..n {
        let name = format!("f{i}");
        let (f, (ra, ca), (rb, cb)) = function(&mut r, &name);
        src.push_str(&f);
        src.push('\n');
        main.push_str(&format!(
            "    let a{i} = normal({ra}, {ca}, seed: {})\n    let b{i} = normal({rb}, {cb}, seed: {})\n    \
             print(\"{name}\", {name}(a{i}, b{i}), grad({name})(a{i}, b{i}))\n",
            2 * i + 1,
            2 * i + 2
        ));
    }
    src.push_str(&main);
    src.push_str("}\n");
    src
}
