//! Differential testing of the engines: random well-typed programs (`jit::proggen`: scalar
//! loops over `i32`, `f32`, `f64` and `bool` variables with inlined helper functions, then
//! elementwise tensor expressions over those scalars) run in the interpreter and with the JIT at
//! `-O0`, `-O1` and `-O2`; the printed text (every value, to the last bit of its shortest
//! representation, or the error) must be identical. The generator is seeded, so a failure names
//! the program that shows it. `MSL_DIFF_CASES` sets the number of programs (default 150).

use lang::spec::Outcome;

#[test]
fn random_programs_print_the_same_in_every_engine() {
    let cases: u64 = std::env::var("MSL_DIFF_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(150);
    let (mut ran, mut errors, mut native, mut models) = (0, 0, 0, 0);
    for seed in 1..=cases {
        let src = jit::proggen::program(seed);
        let (eager, n) = jit::proggen::compare(&src).unwrap_or_else(|why| panic!("seed {seed}: {why}"));
        let Outcome::Ran(text) = &eager else {
            panic!("seed {seed}: the generator wrote a program the checker rejects:\n{src}\n{}", eager.text());
        };
        native += n;
        ran += 1;
        errors += u64::from(text.contains("error["));
        models += u64::from(src.contains("model P") && !text.contains("error["));
    }
    println!(
        "differential: {ran} programs, {errors} ending in a run-time error, {native} native loop runs, \
         {models} with model arithmetic"
    );
    // Most programs must have run their loop as native code, or the test compares nothing.
    assert!(native >= ran, "only {native} native loop runs in {ran} programs");
    // About half the programs end with a loop of model arithmetic (flat models).
    assert!(models * 4 >= ran, "only {models} of {ran} programs ran model arithmetic");
}
