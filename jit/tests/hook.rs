//! The interpreter's side of the accelerator hook: a tree the accelerator plans and then
//! declines is evaluated op by op from the inputs already computed, so every input (and any
//! effect in it) is evaluated exactly once and the result is the interpreter's own.

use jit::fuse;
use kernels::{KernelError, Tensor};
use lang::interp::{Accel, Interp};
use lang::ir::Expr;
use std::cell::Cell;
use std::path::Path;
use std::rc::Rc;

/// Plans like the JIT, then always declines.
struct Decline(Rc<Cell<usize>>);

impl Accel for Decline {
    fn plan<'e>(&mut self, e: &'e Expr) -> Option<Vec<&'e Expr>> {
        fuse::may_root(e).then(|| fuse::analyse(e).1)
    }
    fn try_eval(&mut self, _: &Expr, _: &mut [Tensor]) -> Option<Result<Tensor, KernelError>> {
        self.0.set(self.0.get() + 1);
        None
    }
}

const SRC: &str = r#"
fn noisy(x: f32[3]) -> f32[3] {
    print("evaluated once")
    x * 2.0
}

fn main() {
    let x = stack([1.0, -2.0, 0.5])
    let c = x > 0.0
    print(where(c, exp(noisy(x)) + x * x, -x) - 1.0)
    print(f32(c) * sigmoid(x) / 3.0)
}
"#;

fn run(decline: bool) -> (String, usize) {
    let c = lang::check::check_source("hook.msl", SRC, Path::new("."));
    assert!(!c.has_errors());
    let mut out = Vec::new();
    let declined = Rc::new(Cell::new(0));
    {
        let mut it = Interp::new(&c.program, Box::new(&mut out));
        if decline {
            it.accel = Some(Box::new(Decline(declined.clone())));
        }
        it.run_main(c.program.main.unwrap()).unwrap_or_else(|e| panic!("{}", e.message));
    }
    (String::from_utf8(out).unwrap(), declined.get())
}

#[test]
fn a_declined_tree_runs_op_by_op_from_its_inputs() {
    let (plain, _) = run(false);
    let (fallback, declined) = run(true);
    assert_eq!(plain, fallback);
    assert_eq!(fallback.matches("evaluated once").count(), 1);
    assert!(declined >= 2, "the accelerator declined {declined} trees");
}
