//! Models as flat buffers: arithmetic on a model is one fused loop over its parameter buffer
//! (not one per tensor), pointwise `map` is one application, and every level prints what the
//! interpreter prints — including a `map` that is not pointwise and models that cannot be flat.
//! A model built of large tensors (a gradient) keeps them apart, and arithmetic with it is one
//! fused call over its tensors part by part, whose result is one buffer.

use lang::spec::run_block;
use std::path::Path;

const SGD_MOMENTUM: &str = r#"
model Net {
    w1: f32[4, 8] = glorot_uniform(4, 8)
    b1: f32[8]    = zeros(8)
    w2: f32[8, 2] = glorot_uniform(8, 2)
    b2: f32[2]    = zeros(2)
}

fn loss(m: Net, x: f32[16, 4]) -> f32 {
    mean((relu(x @ m.w1 + m.b1) @ m.w2 + m.b2) ** 2)
}

fn main() {
    var m = init(Net, seed: 0)
    let x = normal(16, 4, seed: 1)
    var v = map(|p| p * 0.0, m)
    for step in 0..5 {
        let g = grad(loss)(m, x)
        v = 0.9 * v + g
        m = m - 0.05 * v
        print(loss(m, x))
    }
    let centred = map(|p| p - mean(p), m)
    print(m.b2, sum(centred.w1), params(m))
}
"#;

/// Checks that `src` prints at `level` what the interpreter prints, with no fallback; the JIT's
/// report of the run.
fn same_as_interpreter(src: &str, level: u8) -> jit::Report {
    let eager = run_block(src, Path::new("."));
    assert_eq!(eager.kind(), "output", "{}", eager.text());
    let (out, report) = jit::run_block(src, Path::new("."), jit::Options::level(level));
    assert_eq!((out.kind(), out.text()), (eager.kind(), eager.text()), "-O{level}");
    let report = report.take();
    assert_eq!(report.fallbacks(), 0);
    report
}

/// Calls of the fused tree printed as `term`, at `level`, after checking the output.
fn calls_of(src: &str, level: u8, term: &str) -> Option<u64> {
    same_as_interpreter(src, level).sites.iter().find(|s| s.term == term).map(|s| s.calls)
}

/// Calls of the fused tree printed as `term` at `-O2` whose result went into an input's buffer.
fn reused_by(src: &str, term: &str) -> Option<u64> {
    same_as_interpreter(src, 2).sites.iter().find(|s| s.term == term).map(|s| s.reused)
}

#[test]
fn model_arithmetic_is_one_loop_per_step_not_per_tensor() {
    for level in [1, 2] {
        // Five steps, four tensors: five compiled calls each, over the whole buffer.
        assert_eq!(calls_of(SGD_MOMENTUM, level, "add(mul(0.9, in0), in1)"), Some(5), "-O{level}");
        assert_eq!(calls_of(SGD_MOMENTUM, level, "sub(in0, mul(0.05, in1))"), Some(5), "-O{level}");
    }
    // -O0 fuses nothing and still prints the same.
    same_as_interpreter(SGD_MOMENTUM, 0);
}

/// At `-O2` the old `m` and `v` are dead at their updates (moved out at their last reads), so
/// each step's result is written into their buffers: the models, whose fields are views of
/// those buffers, are dropped before the loop runs, and nothing else holds them.
#[test]
fn a_model_update_writes_into_the_dead_models_buffer() {
    assert_eq!(reused_by(SGD_MOMENTUM, "sub(in0, mul(0.05, in1))"), Some(5));
    assert_eq!(reused_by(SGD_MOMENTUM, "add(mul(0.9, in0), in1)"), Some(5));
    // A model still read later keeps its buffer: `n` is printed after `n * 2.0`.
    let src = "model P { a: f32[3] = ones(3), b: f32[2] = ones(2) }\nfn main() {\n    let n = init(P, seed: 0)\n    let k = n * 2.0 + n\n    print(k.a, n.a)\n}\n";
    let sites = same_as_interpreter(src, 2).sites;
    assert!(sites.iter().any(|s| s.calls == 1) && sites.iter().all(|s| s.reused == 0));
    // Storage-only (`bf16`) models: the JIT declines the loop after the models were dropped,
    // and the interpreter gets them back, rebuilt over the same buffers.
    let src = "model P { a: bf16[3], b: bf16[2] }\nfn main() {\n    var m = P(a: bf16(ones(3)), b: bf16(ones(2) * 2.0))\n    let g = P(a: bf16(ones(3) * 0.5), b: bf16(ones(2)))\n    for s in 0..3 {\n        m = m - 0.25 * g\n    }\n    print(m.a, m.b)\n}\n";
    let (out, report) = jit::run_block(src, Path::new("."), jit::Options::level(2));
    assert_eq!(out.text(), "[0.625, 0.625, 0.625] [1.25, 1.25]\n");
    assert!(report.borrow().sites.iter().all(|s| s.calls == 0));
}

/// A model of large tensors (65,536 and 1,024 elements): the gradient's constructor keeps them
/// apart rather than copying them into one buffer, and the update is still one compiled call a
/// step, over the gradient's tensors part by part, written into the dead model's buffer (so
/// `m` stays one buffer).
const SGD_WIDE: &str = r#"
model Wide {
    w: f32[64, 1024] = glorot_uniform(64, 1024)
    b: f32[1024]     = zeros(1024)
}

fn loss(m: Wide, x: f32[8, 64]) -> f32 {
    mean((x @ m.w + m.b) ** 2)
}

fn main() {
    var m = init(Wide, seed: 0)
    let x = normal(8, 64, seed: 1)
    for step in 0..4 {
        let g = grad(loss)(m, x)
        m = m - 0.05 * g
        print(loss(m, x))
    }
    print(sum(m.w), m.b[0])
}
"#;

#[test]
fn a_model_of_large_tensors_updates_in_one_call_in_place() {
    for level in [1, 2] {
        assert_eq!(calls_of(SGD_WIDE, level, "sub(in0, mul(0.05, in1))"), Some(4), "-O{level}");
    }
    same_as_interpreter(SGD_WIDE, 0);
    assert_eq!(reused_by(SGD_WIDE, "sub(in0, mul(0.05, in1))"), Some(4));
}

/// One flat model (`init`) and one built of large tensors of three sizes (kept apart): their
/// arithmetic is one call over the parts, split into chunks across the threads, and equals the
/// same arithmetic written tensor by tensor, at every level.
#[test]
fn arithmetic_over_models_in_parts_equals_it_tensor_by_tensor() {
    let head = "model Big { a: f32[40000] = normal(40000), b: f32[300, 200] = normal(300, 200), c: f32[50000] = normal(50000) }\n\nfn main() {\n    let m = init(Big, seed: 3)\n    let g = Big(a: normal(40000, seed: 4), b: normal(300, 200, seed: 5), c: normal(50000, seed: 6))\n    let s = 0.75\n";
    let model = format!("{head}    let r = (m + g * s) * g - m\n    print(sum(r.a), sum(r.b), sum(r.c), r.a[39999], r.b[299, 199], r.c[0])\n}}\n");
    let by_hand = format!(
        "{head}    let (a, b, c) = ((m.a + g.a * s) * g.a - m.a, (m.b + g.b * s) * g.b - m.b, (m.c + g.c * s) * g.c - m.c)\n    print(sum(a), sum(b), sum(c), a[39999], b[299, 199], c[0])\n}}\n"
    );
    let want = run_block(&by_hand, Path::new("."));
    assert_eq!(want.kind(), "output", "{}", want.text());
    assert_eq!(run_block(&model, Path::new(".")).text(), want.text());
    for level in 0..3 {
        let (out, report) = jit::run_block(&model, Path::new("."), jit::Options::level(level));
        assert_eq!(out.text(), want.text(), "-O{level}");
        let calls = report.borrow().sites.iter().find(|s| s.term.starts_with("sub(mul(add(")).map(|s| s.calls);
        assert_eq!(calls, (level > 0).then_some(1), "-O{level}");
    }
}

#[test]
fn models_that_cannot_be_flat_still_compute_tensor_by_tensor() {
    // A scalar field, two element types, nested models, a constructor of views of another model.
    let src = r#"
model Scaled { w: f32[2], s: f32 }
model Counted { w: f32[3], n: i32[3] }
model Inner { a: f32[2] = ones(2) }
model Outer { x: f32[3] = ones(3), inner: Inner }

fn main() {
    let s = Scaled(w: stack([1.0, 2.0]), s: 3.0)
    let t = s * 2.0 + s
    print(t.w, t.s, map(|x| x * x, t).w)
    let c = Counted(w: ones(3), n: i32(arange(3)))
    print(c.n, c.w)
    let o = init(Outer, seed: 0)
    let p = o + o * 3.0
    let q = Outer(x: p.x * 0.5, inner: p.inner)
    let r = q - o
    print(p.inner.a, r.x, r.inner.a, map(|x| x / 2.0, r).inner.a)
}
"#;
    for level in 0..3 {
        same_as_interpreter(src, level);
    }
    let eager = run_block(src, Path::new("."));
    assert_eq!(
        eager.text(),
        "[3.0, 6.0] 9.0 [9.0, 36.0]\n[0, 1, 2] [1.0, 1.0, 1.0]\n[4.0, 4.0] [1.0, 1.0, 1.0] [3.0, 3.0] [1.5, 1.5]\n"
    );
}

/// A small deterministic generator (xorshift), so that every case is reproducible by seed.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// An expression for one field, given the field's name.
type PerField = Box<dyn Fn(&str) -> String>;

/// One random expression over the models `m`, `n` and the scalar `s`, written twice: as model
/// arithmetic (`.0`) and for field `f` by hand, tensor by tensor (`.1` is a function of `f`).
fn expr(r: &mut Rng, depth: u32) -> (String, PerField) {
    let unary = ["exp(X * 0.1)", "X * X", "maximum(X, 0.25)", "tanh(X)", "sqrt(abs(X) + 1.0)"];
    let leaf = |r: &mut Rng| -> (String, PerField) {
        if r.below(2) == 0 {
            ("m".into(), Box::new(|f: &str| format!("m.{f}")))
        } else {
            ("n".into(), Box::new(|f: &str| format!("n.{f}")))
        }
    };
    if depth == 0 {
        return leaf(r);
    }
    match r.below(6) {
        0 | 1 => {
            let op = ["+", "-", "*"][r.below(3) as usize];
            let (a, fa) = expr(r, depth - 1);
            let (b, fb) = expr(r, depth - 1);
            (format!("({a} {op} {b})"), Box::new(move |f: &str| format!("({} {op} {})", fa(f), fb(f))))
        }
        2 => {
            let k = ["0.5", "s", "(1.0 - s)", "2.0"][r.below(4) as usize];
            let (a, fa) = expr(r, depth - 1);
            (format!("({k} * {a})"), Box::new(move |f: &str| format!("({k} * {})", fa(f))))
        }
        3 => {
            let u = unary[r.below(unary.len() as u64) as usize];
            let (a, fa) = expr(r, depth - 1);
            let body = u.replace('X', "x");
            (
                format!("map(|x| {body}, {a})"),
                Box::new(move |f: &str| format!("({})", u.replace('X', &format!("({})", fa(f))))),
            )
        }
        4 => {
            // Not pointwise: each tensor on its own.
            let (a, fa) = expr(r, depth - 1);
            (
                format!("map(|x| x - mean(x), {a})"),
                Box::new(move |f: &str| {
                    let t = fa(f);
                    format!("(({t}) - mean({t}))")
                }),
            )
        }
        _ => leaf(r),
    }
}

/// A random model type, two values of it, and a random expression over them printed as model
/// arithmetic and, tensor by tensor, as tensor arithmetic. With `large`, every tensor has a
/// leading axis of 2^15 (a constructor keeps such tensors apart rather than in one buffer, so
/// the arithmetic runs tensor by tensor) and each field's sum is printed.
fn case(seed: u64, large: bool) -> (String, String) {
    let mut r = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let k = 1 + r.below(4) as usize;
    let mut shapes: Vec<Vec<u64>> = (0..k).map(|_| (0..1 + r.below(3)).map(|_| 1 + r.below(5)).collect()).collect();
    if large {
        shapes.iter_mut().for_each(|s| s.insert(0, 1 << 15));
    }
    let shown = |t: String| if large { format!("sum({t})") } else { t };
    let dims = |s: &Vec<u64>| s.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ");
    let fields: Vec<String> = (0..k).map(|i| format!("f{i}: f32[{}]", dims(&shapes[i]))).collect();
    let build = |seed0: u64| {
        let args: Vec<String> =
            (0..k).map(|i| format!("f{i}: normal({}, seed: {})", dims(&shapes[i]), seed0 + i as u64)).collect();
        format!("M({})", args.join(", "))
    };
    let depth = 1 + r.below(3) as u32;
    let (e, per_field) = expr(&mut r, depth);
    let head = format!(
        "model M {{ {} }}\n\nfn main() {{\n    let m = {}\n    let n = {}\n    let s = 0.75\n",
        fields.join(", "),
        build(10),
        build(20)
    );
    let names: Vec<String> = (0..k).map(|i| format!("f{i}")).collect();
    let model = format!(
        "{head}    let r = {e}\n    print({})\n}}\n",
        names.iter().map(|f| shown(format!("r.{f}"))).collect::<Vec<_>>().join(", ")
    );
    let by_hand =
        format!("{head}    print({})\n}}\n", names.iter().map(|f| shown(per_field(f))).collect::<Vec<_>>().join(", "));
    (model, by_hand)
}

#[test]
fn random_model_arithmetic_equals_the_same_arithmetic_tensor_by_tensor() {
    let cases = (0..60).map(|seed| (seed, false)).chain((0..12).map(|seed| (seed, true)));
    for (seed, large) in cases {
        let (model, by_hand) = case(seed, large);
        let want = run_block(&by_hand, Path::new("."));
        assert_eq!(want.kind(), "output", "seed {seed} ({large}):\n{by_hand}\n{}", want.text());
        let got = run_block(&model, Path::new("."));
        assert_eq!(got.text(), want.text(), "seed {seed}, interpreter:\n{model}");
        for level in 0..3 {
            let (out, _) = jit::run_block(&model, Path::new("."), jit::Options::level(level));
            assert_eq!(out.text(), want.text(), "seed {seed}, -O{level}:\n{model}");
        }
    }
}

/// A model tree that the accelerator cannot run (a scalar field: neither one buffer nor only
/// tensors, and a `map` that is not pointwise gives separate tensors) runs op by op; a local it
/// reads twice is one input, whose value must not be read again from the frame, which `-O2`
/// has emptied at the local's last read further right.
#[test]
fn a_repeated_local_in_a_tree_that_runs_op_by_op_keeps_its_value() {
    let src = r#"
model P { a: f32[3], b: f32[2, 4], s: f32 }

fn main() {
    var p = P(a: stack([1.0, 2.0, 3.0]), b: ones(2, 4), s: 2.0)
    for k in 0..2 {
        p = (p * p) * map(|v| v - mean(v) + 1.0, map(|v| v * 2.0, p))
    }
    print(p.a, p.b, p.s)
}
"#;
    for level in 0..3 {
        same_as_interpreter(src, level);
    }
    // Step 1: a = [1, 4, 9] * ([2, 4, 6] - 4 + 1) = [-1, 4, 27]; b = 1 * 1 = 1.
    // Step 2: a = [1, 16, 729] * ([-2, 8, 54] - 20 + 1) = [-21, -176, 25515]; b = 1.
    // s: 4 * (4 - 4 + 1) = 4, then 16 * (8 - 8 + 1) = 16.
    let out = run_block(src, Path::new("."));
    assert_eq!(out.text(), "[-21.0, -176.0, 25515.0] [[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0]] 16.0\n");
}
