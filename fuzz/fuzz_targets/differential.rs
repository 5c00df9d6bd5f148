//! cargo-fuzz target: the engines agree. The input's bytes take the first decisions of
//! `jit::proggen`'s generator of well-typed programs (scalar loops with calls, then tensor
//! expressions); the program then runs in the interpreter and with the JIT at -O0, -O1 and -O2,
//! and any difference in what they print is a crash.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let src = jit::proggen::program_from_bytes(data);
    if let Err(why) = jit::proggen::compare(&src) {
        panic!("{why}");
    }
});
