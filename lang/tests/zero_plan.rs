//! Where a gradient reaches a sharded optimizer step straight from its call (`shard::zero`):
//! the call is a feed and the derivative's data-parallel sums that build the gradient are left
//! for the step's reduce-scatter; a gradient read by anything else, or a state made without
//! `shard:`, changes nothing. (The numbers under `mpirun` are checked by `tests/mpi.rs` and the
//! spec blocks of `spec/sharding.md`.)

mod support;

use lang::ir::derived::Mode;
use lang::ir::{walk, ExprKind, Prim, Program};
use lang::shard::zero::ZeroPlan;
use support::*;

const SRC: &str = "
use nn
use optim.adam

mesh M[dp = 2]

model Mlp { w1: f32[4, 8] = he_normal(4, 8), b1: f32[8] = zeros(8), w2: f32[8, 3] = he_normal(8, 3) }

fn loss[N](m: Mlp, x: f32[N @dp, 4], y: i32[N @dp]) -> f32 {
    mean(nn.cross_entropy(relu(x @ m.w1 + m.b1) @ m.w2, y))
}

fn main() {
    var m = init(Mlp, seed: 1)
    var opt = adam.init(m, lr: 0.05, SHARD)
    let x = normal(16, 4, seed: 2)
    let y = i32(floor(uniform(16, seed: 3) * 2.99))
    for step in 0..2 {
        let (l, g) = value_and_grad(loss)(m, x, y)
        READ
        (m, opt) = adam.step(m, g, opt)
    }
}
";

fn sharded(shard: &str, read: &str) -> Program {
    let src = SRC.replace("SHARD", shard).replace("READ", read);
    let mut c = check(&src).unwrap();
    lang::passes::shard(&mut c.program);
    assert!(c.program.malformed.is_empty(), "{:?}", c.program.malformed);
    c.program
}

/// The all-reduces of `value_and_grad(loss)`, the derivative the training loop calls.
fn gradient_sums(p: &Program) -> Vec<lang::ir::ExprId> {
    let mut out = Vec::new();
    let called = p.derived.funcs.iter().filter(|((_, mode), _)| matches!(mode, Mode::ValueAndGrad { .. }));
    for (_, f) in called {
        walk::walk(&p.func(*f).body, &mut |e| {
            if let ExprKind::Prim { prim: Prim::AllReduceSum, .. } = &e.kind {
                out.push(e.id);
            }
        });
    }
    out
}

#[test]
fn a_gradient_handed_straight_to_a_sharded_step_leaves_its_sums_to_the_step() {
    let p = sharded("shard: dp", "");
    let plan = ZeroPlan::of(&p);
    assert_eq!(plan.feeds.len(), 1, "{plan:?}");
    let feed = plan.feeds.values().next().unwrap();
    assert_eq!(feed.item, Some(1), "the gradient is the pair's second item");
    // Every weight's sum over the batch's ranks reaches the result: all three are left.
    let sums = gradient_sums(&p);
    assert_eq!(sums.len(), 3, "one all-reduce per weight");
    for s in &sums {
        assert_eq!(plan.sums.get(s), Some(&(feed.axis, Some(1))), "{plan:?}");
    }
}

#[test]
fn a_gradient_read_before_the_step_or_a_whole_state_is_summed_where_it_is_computed() {
    let read = sharded("shard: dp", "print(sum(g.b1))");
    assert!(ZeroPlan::of(&read).feeds.is_empty());
    let whole = sharded("b1: 0.9", "");
    let plan = ZeroPlan::of(&whole);
    assert!(plan.feeds.is_empty() && plan.sums.is_empty(), "{plan:?}");
}

/// A stack of layers: the reverse loop adds each layer's gradient into its row of the stacked
/// gradient (`update` of zeros), and the head's gradient is added as models; all of it is
/// linear in the sums, so they are all left to the step, the loop's included.
#[test]
fn a_gradient_accumulated_in_a_loop_leaves_its_sums_to_the_step_too() {
    // The program tests/mpi.rs runs under mpirun, whose numbers match a whole state.
    let src = include_str!("../../tests/programs/stack_zero.msl");
    let mut c = check(src).unwrap();
    lang::passes::shard(&mut c.program);
    assert!(c.program.malformed.is_empty(), "{:?}", c.program.malformed);
    let p = &c.program;
    let plan = ZeroPlan::of(p);
    assert_eq!(plan.feeds.len(), 1, "{plan:?}");
    let sums = gradient_sums(p);
    assert!(sums.len() >= 3, "the layers' w and b (in the loop) and the head's");
    for s in &sums {
        assert!(plan.sums.contains_key(s), "{plan:?}\n{}", lang::ir::dump::dump(p));
    }
}
