//! Models as flat buffers: arithmetic on a model is one fused loop over its parameter buffer
//! (not one per tensor), pointwise `map` is one application, and every level prints what the
//! interpreter prints — including a `map` that is not pointwise and models that cannot be flat.

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

/// Calls of the fused tree printed as `term`, at `level`, after checking the output.
fn calls_of(src: &str, level: u8, term: &str) -> Option<u64> {
    let eager = run_block(src, Path::new("."));
    assert_eq!(eager.kind(), "output", "{}", eager.text());
    let (out, report) = jit::run_block(src, Path::new("."), jit::Options::level(level));
    assert_eq!((out.kind(), out.text()), (eager.kind(), eager.text()), "-O{level}");
    let report = report.borrow();
    assert_eq!(report.fallbacks(), 0);
    report.sites.iter().find(|s| s.term == term).map(|s| s.calls)
}

#[test]
fn model_arithmetic_is_one_loop_per_step_not_per_tensor() {
    for level in [1, 2] {
        // Five steps, four tensors: five compiled calls each, over the whole buffer.
        assert_eq!(calls_of(SGD_MOMENTUM, level, "add(mul(0.9, in0), in1)"), Some(5), "-O{level}");
        assert_eq!(calls_of(SGD_MOMENTUM, level, "sub(in0, mul(0.05, in1))"), Some(5), "-O{level}");
    }
    // -O0 fuses nothing and still prints the same.
    calls_of(SGD_MOMENTUM, 0, "");
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
        calls_of(src, level, "");
    }
    let eager = run_block(src, Path::new("."));
    assert_eq!(
        eager.text(),
        "[3.0, 6.0] 9.0 [9.0, 36.0]\n[0, 1, 2] [1.0, 1.0, 1.0]\n[4.0, 4.0] [1.0, 1.0, 1.0] [3.0, 3.0] [1.5, 1.5]\n"
    );
}
