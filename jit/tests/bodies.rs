//! Compiled function bodies: control flow over tensors, models and `batches` runs as native code
//! with the interpreter's results — `return` from inside loops, tuples, run-time errors with
//! the interpreter's message and span, and Ctrl-C stopping a loop that never ends.

use lang::spec::{run_block, run_block_prepared};
use std::path::Path;
use std::sync::atomic::Ordering;

/// Runs `src` at `level`, returning (output kind, text, bodies compiled, bodies interpreted).
fn jit(src: &str, level: u8) -> (String, String, usize, usize) {
    let (out, r) = jit::run_block(src, Path::new("."), jit::Options::level(level));
    let r = r.borrow();
    (out.kind().to_string(), out.text().to_string(), r.bodies.len(), r.interpreted_bodies())
}

/// Every level prints exactly what the interpreter prints, with every body compiled.
fn same_everywhere(src: &str) -> String {
    let eager = run_block(src, Path::new("."));
    for level in 0..3 {
        let (kind, text, bodies, interpreted) = jit(src, level);
        assert_eq!((kind.as_str(), text.as_str()), (eager.kind(), eager.text()), "-O{level}");
        assert!(bodies >= 1, "-O{level}: no body compiled");
        assert_eq!(interpreted, 0, "-O{level}");
    }
    eager.text().to_string()
}

#[test]
fn return_from_loops_over_tensors_and_tuples() {
    let out = same_everywhere(
        r#"
fn first_above(x: f32[8], t: f32) -> i32 {
    var i = 0
    var acc = zeros(8)
    while i < 8 {
        acc = acc + x
        if sum(acc) > t { return i }
        i = i + 1
    }
    -1
}

fn pow_sum(x: f32[4], n: i32) -> f32[4] {
    var p = ones(4)
    for k in 0..n {
        if k == 10 { return p }
        p = p * x
    }
    p
}

fn main() {
    let x = f32(arange(8)) * 0.5
    print(first_above(x, 40.0), first_above(x, 1000.0))
    let p = pow_sum(stack([1.0, 2.0, 3.0, 0.5]), 5) + pow_sum(stack([1.0, 1.5, 0.5, 2.0]), 20)
    let (a, b) = (p * 2.0, sum(p))
    print(a, b)
    for i in 0..3 {
        let t = (i, x[i])
        print(t.0, t.1)
    }
}
"#,
    );
    assert!(out.starts_with("2 -1\n"), "{out}");
}

#[test]
fn run_time_errors_keep_the_interpreters_message_and_span() {
    let out = same_everywhere(
        r#"
fn main() {
    var t = ones(4)
    for i in 0..10 {
        t = t * 2.0
        if i == 3 { let bad = t[i + 4] }
    }
}
"#,
    );
    assert!(out.contains("error[E0602]"), "{out}");
}

#[test]
fn batches_and_models_in_a_training_loop() {
    same_everywhere(
        r#"
use nn.{linear, mse}

model Lin[I, O] {
    w: f32[I, O] = he_normal(I, O)
    b: f32[O]    = zeros(O)
}

fn loss[B](m: Lin[3, 1], x: f32[B, 3], y: f32[B, 1]) -> f32 {
    mse(linear(x, m.w, m.b), y)
}

fn main() {
    let x = normal(40, 3, seed: 1)
    let y = sum(x, axis: 1, keepdims: true) * 0.5
    var m = init(Lin[3, 1], seed: 2)
    for epoch in 0..5 {
        var total = 0.0
        for (xb, yb) in batches(x, y, size: 8, shuffle: epoch) {
            let (l, g) = value_and_grad(loss)(m, xb, yb)
            m = m - 0.1 * g
            total = total + l
        }
        print(epoch, total)
    }
}
"#,
    );
}

#[test]
fn an_endless_tensor_loop_stops_at_ctrl_c() {
    interrupted("fn main() {\n    var t = zeros(16)\n    while true { t = t + 1.0 }\n}\n");
}

#[test]
fn a_long_scalar_loop_stops_at_ctrl_c() {
    // About a minute of work: the compiled loop reads the flag once per 65,536 iterations.
    interrupted("fn main() {\n    var acc = 0\n    for k in 0..100 {\n        for i in 0..2000000000 { acc = acc + i % 3 }\n    }\n    print(acc)\n}\n");
}

/// Runs `src`, raising the interrupt flag after 200 ms: the run stops with an error at line 3.
fn interrupted(src: &str) {
    let opts = jit::Options::level(1);
    let out = run_block_prepared(src, Path::new("."), &mut |_| {}, &mut |it| {
        jit::install(it, opts);
        let flag = it.interrupt.clone();
        std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(200));
            flag.store(true, Ordering::SeqCst);
        });
    });
    assert!(out.text().contains("interrupted"), "{}", out.text());
    assert!(out.text().contains("3:5"), "the error points at the loop: {}", out.text());
}

/// Small counted loops run their body several times a trip (`host::gen`'s `UNROLL`), then one
/// at a time: every length from 0 to 18 and starts below and above 0, loops that cross the
/// 65,536-iteration chunk, a body with a branch, and remainders of the loop variable by small,
/// large and near-`i32::MAX` divisors, of negative variables too, and quotients and remainders
/// by divisors below, at and above the 8 copies of a trip (stepped from the trip's first value),
/// give the numbers Rust computes, at every level, with each loop compiled.
#[test]
fn unrolled_counted_loops_give_every_iteration_once() {
    let src = r#"
fn main() {
    var total = 0
    for a in -9..4 {
        for len in 0..19 {
            var acc = 0
            for i in a..a + len {
                let r = i % 7
                if r > 2 { acc = acc + r * i } else { acc = acc - i }
            }
            total = total + acc * (len + 1)
        }
    }
    print(total)
    var s = 0
    for i in 3..140003 { s = s + (i % 13) * (i % 5) }
    print(s)
    var f = 0.0
    for i in 0..65541 { f = f + 0.5 }
    print(f)
    var m = 0
    for i in -3000..3001 { m = m + i % 1000 + (i % 7) * (i % 9) }
    print(m)
    var big = 0
    for i in 2147483600..2147483647 { big = big + i % 2147483640 }
    print(big)
    var d = 0
    for i in 5..1006 { d = d + i / 2 * 3 + i % 2 + (i / 3) * (i % 3) }
    for i in 5..1006 { d = d + (i / 7) * 11 + i % 7 + (i / 8) * (i % 8) }
    for i in 5..1006 { d = d + i / 9 - i % 9 + i / 1000 * 5 }
    print(d)
}
"#;
    let mut total: i64 = 0;
    for a in -9i64..4 {
        for len in 0i64..19 {
            let mut acc = 0;
            for i in a..a + len {
                let r = i.rem_euclid(7);
                acc += if r > 2 { r * i } else { -i };
            }
            total += acc * (len + 1);
        }
    }
    let s: i64 = (3i64..140003).map(|i| (i % 13) * (i % 5)).sum();
    let m: i64 = (-3000i64..3001).map(|i| i.rem_euclid(1000) + i.rem_euclid(7) * i.rem_euclid(9)).sum();
    // msl's i32 sum wraps, as NumPy's does.
    let big = (2147483600i64..2147483647).fold(0i32, |a, i| a.wrapping_add(i.rem_euclid(2147483640) as i32));
    let d: i64 = (5i64..1006)
        .map(|i| {
            i / 2 * 3 + i % 2 + (i / 3) * (i % 3) + (i / 7) * 11 + i % 7 + (i / 8) * (i % 8) + i / 9 - i % 9
                + i / 1000 * 5
        })
        .sum();
    let want = format!("{total}\n{s}\n32770.5\n{m}\n{big}\n{d}\n");
    assert_eq!(run_block(src, Path::new(".")).text(), want, "interpreter");
    for level in 0..3 {
        let (out, r) = jit::run_block(src, Path::new("."), jit::Options::level(level));
        assert_eq!(out.text(), want, "-O{level}");
        assert_eq!(r.borrow().interpreted_loops(), 0, "-O{level}: a loop ran in the interpreter");
    }
}
