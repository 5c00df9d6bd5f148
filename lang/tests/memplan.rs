//! The static memory plan (`lang::ir::memplan`) of small programs, worked out by hand: counts of
//! values, buffers and reuses, the peak and the total without reuse, exactly.

use lang::ir::memplan::{self, MemPlan};
use lang::ir::Program;
use lang::types::{Names, Sym};
use std::path::Path;

/// Checks `src` and plans its function `name`.
fn plan_of(src: &str, name: &str) -> (Program, MemPlan) {
    let c = lang::check::check_source("memplan.msl", src, Path::new("."));
    assert!(!c.has_errors(), "{:?}", c.diagnostics);
    let f = c.program.root_funcs.iter().find(|(n, _)| n == name).map(|(_, f)| *f).expect("function");
    let p = memplan::plan(&c.program, f);
    (c.program, p)
}

fn no_dims(_: Sym) -> Option<i64> {
    None
}

/// The plan's counts: (values, buffers, reused, unknown).
fn counts(p: &MemPlan) -> (usize, usize, usize, usize) {
    (p.n_values(), p.n_buffers(), p.n_reused(), p.n_unknown())
}

/// Plans `name` in `src`, checking its counts (values, buffers, reused, unknown) and its peak
/// in bytes (every dim a constant).
fn planned(src: &str, name: &str, want: (usize, usize, usize, usize), peak: u64) -> (Program, MemPlan) {
    let (prog, p) = plan_of(src, name);
    assert_eq!(counts(&p), want, "counts of `{name}`");
    assert_eq!(p.peak_bytes(&no_dims), Some(peak), "peak of `{name}`");
    (prog, p)
}

// Four 4×8 f32 products (128 bytes each) in a chain: each one's operand dies when the next is
// computed, so two buffers alternate.
#[test]
fn chain_reuses_dead_buffers() {
    let src = "
fn chain(x: f32[4, 8], w: f32[8, 8]) -> f32 {
    let a = x @ w
    let b = a @ w
    let c = b @ w
    let d = c @ w
    sum(d)
}
";
    let (prog, p) = planned(src, "chain", (4, 2, 2, 0), 256);
    assert_eq!(p.total_bytes(&no_dims), Some(512));
    assert_eq!(
        p.render(&prog, &no_dims),
        "memory plan of `chain`: 4 tensor values in 2 buffers (2 reuse a dead value's buffer); peak 2 buffers = \
         256 bytes, 512 bytes without reuse"
    );
}

// One elementwise expression is one fused loop: only its root is stored (the operands are
// parameters, which belong to the caller).
#[test]
fn elementwise_chain_is_not_materialised() {
    let src = "
fn fused(x: f32[256], y: f32[256]) -> f32[256] {
    exp(x * y + 1.0) - y
}

fn split(x: f32[256], y: f32[256]) -> f32[256] {
    let a = x * y
    let b = exp(a + 1.0)
    b - y
}
";
    planned(src, "fused", (1, 1, 0, 0), 1024);
    // Split into lets: `a` is stored; `exp(a + 1.0)` is a fused tree of two operations that
    // writes into `a`'s buffer (its last read); `b - y` is a single operation (not fused), so it
    // needs a second buffer while `b` is still an operand.
    let (_, p) = planned(src, "split", (3, 2, 1, 0), 2048);
    assert_eq!(p.total_bytes(&no_dims), Some(3072));
}

// A loop carrying `h`: `h @ x` is `h`'s last read in the iteration (it is assigned next), so
// `tanh(t)` takes the old `h`'s buffer, and `t` dies at the end of the statement.
#[test]
fn loop_body_values_die_each_iteration() {
    let src = "
fn looped(x: f32[8, 8]) -> f32[8, 8] {
    var h = x @ x
    for i in 0..3 {
        let t = h @ x
        h = tanh(t)
    }
    h
}
";
    let (_, p) = planned(src, "looped", (3, 2, 1, 0), 512);
    assert_eq!(p.total_bytes(&no_dims), Some(768));
}

// A local read after the loop stays live through it: nothing may take its buffer.
#[test]
fn values_read_after_a_loop_stay_live_through_it() {
    let src = "
fn kept(x: f32[8, 8]) -> f32 {
    let keep = x @ x
    var s = 0.0
    for i in 0..3 {
        let t = x @ x
        s = s + sum(t)
    }
    sum(keep) + s
}
";
    planned(src, "kept", (2, 2, 0, 0), 512);
}

// A symbolic batch dim. Values, in order (bytes):
//   v0 = w @ w          1048576   b0    live {b0}
//   v1 = x @ w          2048·B    b1    live {b1}        (b0 is free but of another size)
//   v2 = relu(v1) * s   2048·B    b1    live {b1}        (a fused tree: written into v1)
//   v3 = h @ w          2048·B    b2    live {b1, b2}
//   v4 = g @ v          40·B      b3    live {b2, b3}
// Peak: max(1048576, 4096·B, 2088·B); total 1048576 + 6184·B.
#[test]
fn symbolic_batch_dim_at_two_values() {
    let src = "
fn layer[B](x: f32[B, 512], w: f32[512, 512], v: f32[512, 10]) -> f32[B, 10] {
    let s = sum(w @ w)
    let h = relu(x @ w) * s
    let g = h @ w
    g @ v
}
";
    let (prog, p) = plan_of(src, "layer");
    assert_eq!(counts(&p), (5, 4, 1, 0));
    let at = |b: i64| {
        let prog = &prog;
        move |s: Sym| (prog.sym(s) == "B").then_some(b)
    };
    assert_eq!(p.peak_bytes(&no_dims), None);
    assert_eq!(p.peak_bytes(&at(1)), Some(1_048_576));
    assert_eq!(p.peak_bytes(&at(512)), Some(4096 * 512));
    assert_eq!(p.total_bytes(&at(1)), Some(1_048_576 + 6184));
    assert_eq!(p.total_bytes(&at(512)), Some(1_048_576 + 6184 * 512));
    assert_eq!(
        p.render(&prog, &at(512)),
        "memory plan of `layer`: 5 tensor values in 4 buffers (1 reuses a dead value's buffer); peak 2 buffers = \
         4096*B bytes (2.0 MiB at B = 512), 6184*B + 1048576 bytes (4.0 MiB at B = 512) without reuse"
    );
    assert_eq!(
        p.render(&prog, &no_dims),
        "memory plan of `layer`: 5 tensor values in 4 buffers (1 reuses a dead value's buffer); peak 2 buffers = \
         4096*B bytes, 6184*B + 1048576 bytes without reuse"
    );
}

// Both branches of an `if` may use the same buffer; a rank-polymorphic value has no static size.
#[test]
fn branches_share_and_rank_polymorphic_values_are_unknown() {
    let src = "
fn pick(x: f32[64], c: bool) -> f32 {
    let y = if c { sort_of(x) } else { sort_of(x) + x }
    sum(y)
}

fn sort_of(x: f32[64]) -> f32[64] {
    x
}

fn poly[..S](x: f32[..S]) -> f32 {
    let y = exp(x) * 2.0
    sum(y)
}
";
    // then: sort_of(x) → b0; else: sort_of(x) → b0 again, `+ x` (one op, not fused) → b1.
    planned(src, "pick", (3, 2, 1, 0), 512);
    let (prog, p) = plan_of(src, "poly");
    assert_eq!(counts(&p), (0, 0, 0, 1));
    assert_eq!(
        p.render(&prog, &no_dims),
        "memory plan of `poly`: 0 tensor values in 0 buffers (0 reuse a dead value's buffer); 1 value of no \
         static size left out (`..S` shapes, generic models)"
    );
}

// Model values count their fields: `init` allocates each parameter tensor.
#[test]
fn models_count_their_fields() {
    let src = "
model Lin[I, O] {
    w: f32[I, O] = zeros(I, O)
    b: f32[O] = zeros(O)
}

fn make() -> f32 {
    let m = init(Lin[16, 4], seed: 0)
    sum(m.w) + sum(m.b)
}
";
    planned(src, "make", (2, 2, 0, 0), 16 * 4 * 4 + 4 * 4);
}

// Every function of the examples, optimised as at -O2, plans without panicking, and the
// functions `main` reaches are found.
#[test]
fn examples_plan_at_o2() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    for ex in ["mlp", "transformer", "pinn", "md"] {
        let dir = root.join(ex);
        let Some(file) = std::fs::read_dir(&dir)
            .ok()
            .and_then(|d| d.flatten().map(|e| e.path()).find(|p| p.extension().is_some_and(|x| x == "msl")))
        else {
            continue;
        };
        let mut c = lang::check::check_file(&file).expect("readable example");
        assert!(!c.has_errors(), "{ex}");
        lang::ir::opt::optimize(&mut c.program);
        for i in 0..c.program.funcs.len() {
            let p = memplan::plan(&c.program, lang::types::FuncId(i as u32));
            assert_eq!(p.n_values(), p.n_buffers() + p.n_reused());
            let _ = p.render(&c.program, &no_dims);
        }
        let main = c.program.main.expect("main");
        let reach = memplan::reachable(&c.program, main);
        assert_eq!(reach.first(), Some(&main));
        assert!(reach.len() > 1, "{ex}: main calls functions");
    }
}

/// The plan of the derivative `grad(name)` of a function of `src`.
fn grad_plan_of(src: &str, name: &str) -> MemPlan {
    let c = lang::check::check_source("memplan.msl", src, Path::new("."));
    assert!(!c.has_errors(), "{:?}", c.diagnostics);
    let f = c.program.root_funcs.iter().find(|(n, _)| n == name).map(|(_, f)| *f).expect("function");
    let d = c.program.derived.funcs.get(&(f, lang::ir::derived::Mode::Grad { wrt: 0 })).expect("grad is derived");
    memplan::plan(&c.program, *d)
}

// Four blocks of `x + tanh(x @ w)` on 64×64 values (16 KiB each). Without `@recompute` the
// gradient keeps every block's `tanh` for the backward pass; with it, a block keeps only its
// input and recomputes the rest in the backward pass, so the planned peak is lower.
#[test]
fn recompute_lowers_the_peak_of_a_gradient() {
    let blocks = |attr: &str| {
        format!(
            "
fn block(w: f32[64, 64], x: f32[64, 64]) -> f32[64, 64] {{ x + tanh(x @ w) }}
{attr}
fn step(w: f32[64, 64], x: f32[64, 64]) -> f32[64, 64] {{ block(w, x) }}
fn loss(w: f32[64, 64], x: f32[64, 64]) -> f32 {{ sum(step(w, step(w, step(w, step(w, x))))) }}
fn main() {{ print(grad(loss)(ones(64, 64), ones(64, 64))[0, 0]) }}
"
        )
    };
    let plain = grad_plan_of(&blocks(""), "loss").peak_bytes(&no_dims).expect("a static peak");
    let lean = grad_plan_of(&blocks("@recompute"), "loss").peak_bytes(&no_dims).expect("a static peak");
    // Without: the four inputs, the four `tanh`s and the cotangents, 11 buffers of 16 KiB; with:
    // the four inputs and one recomputed block at a time, 7.
    assert_eq!((plain, lean), (11 * 16384, 7 * 16384), "peaks without and with @recompute");
}
