//! The compile cache: a second run of the same program in the same process (a REPL, a test
//! runner) compiles nothing; its fused loops, host regions and function bodies come from the
//! cache, which is keyed by the IR (structure, element types, a hash of the region or of the
//! body's control tree) and never by sizes. A full module is freed between runs (never while
//! an accelerator that points into it is alive).

use std::path::Path;

const SRC: &str = r#"
fn steps(n: i32) -> i32 {
    var k = n
    var s = 0
    while k > 1 {
        if k % 2 == 0 { k = k / 2 } else { k = 3 * k + 1 }
        s = s + 1
    }
    s
}

fn main() {
    var total = 0
    for i in 1..500 { total = total + steps(i) }
    let x = normal(1000, seed: 1)
    let y = normal(1000, seed: 2)
    print(total, sum(gelu(x * y + 1.0)), sum(exp(x) - y * 2.0))
}
"#;

/// Runs SRC at -O2 and returns (output, compiles of fused trees, of loops, of bodies).
fn run() -> (String, usize, usize, usize) {
    let (out, r) = jit::run_block(SRC, Path::new("."), jit::Options::level(2));
    let r = r.borrow();
    let trees: usize = r.sites.iter().map(|s| s.compiles.len()).sum();
    let loops: usize = r.loops.iter().map(|l| l.compiles.len()).sum();
    let bodies = r.bodies.iter().filter(|b| b.compile.is_some()).count();
    assert!(r.sites.iter().all(|s| s.calls > 0) && r.loops.iter().all(|l| l.calls > 0), "{r:?}");
    assert!(r.bodies.iter().all(|b| b.fallback.is_none() && b.runs.get() > 0), "{r:?}");
    (out.text().to_string(), trees, loops, bodies)
}

#[test]
fn a_second_run_in_the_process_reuses_every_compiled_function() {
    let (first, trees, loops, bodies) = run();
    assert!(
        trees >= 2 && loops >= 1 && bodies >= 1,
        "first run compiled {trees} trees, {loops} loops, {bodies} bodies"
    );
    let cached = jit::cached_loops();
    let (second, trees2, loops2, bodies2) = run();
    assert_eq!(first, second);
    assert_eq!((trees2, loops2, bodies2), (0, 0, 0), "the second run compiled again");
    assert_eq!(jit::cached_loops(), cached, "the cache grew on the second run");
}

#[test]
fn a_full_module_is_freed_between_runs_and_code_compiles_again() {
    let (first, ..) = run();
    assert!(jit::cached_loops() > 0);
    // No accelerator is alive between runs, so the module may go.
    assert!(jit::release_code(0), "the module was not freed");
    assert_eq!(jit::cached_loops(), 0);
    let (second, trees, loops, bodies) = run();
    assert_eq!(first, second);
    assert!(trees >= 2 && loops >= 1 && bodies >= 1, "nothing compiled again: {trees} {loops} {bodies}");
}

#[test]
fn a_module_in_use_is_not_freed() {
    run();
    let prog = lang::ir::Program::default();
    let (accel, _) = jit::JitAccel::new(&prog, jit::Options::level(1), std::sync::Arc::new(kernels::CpuDevice));
    assert!(!jit::release_code(0), "freed while an accelerator was alive");
    assert!(jit::cached_loops() > 0);
    drop(accel);
    assert!(jit::release_code(0), "not freed once no accelerator was alive");
}
