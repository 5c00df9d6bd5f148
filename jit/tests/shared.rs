//! A value read several times by one elementwise tree is computed inside that tree, once per
//! element: `-O2` copies it into its reads (`ir::opt::substitute`) and the JIT builds one node
//! for an operation that occurs several times on the same operands (`fuse::analyse`). Below,
//! `t = tanh(…)` read four times and `q = x * x` read twice become one fused loop with one
//! `tanh`, and nothing between is stored (as in a derivative rule's shared values, or common
//! subexpressions).

use jit::fuse;
use lang::ir::{walk, Expr, ExprKind, Prim, Stmt};
use std::path::Path;

const SRC: &str = "
fn h(x: f32[64]) -> f32[64] {
    let t = tanh(x * 0.5)
    let q = x * x
    t * (1.0 - t * t) + q * t - q
}

fn main() {
    print(h(normal(64, seed: 1)), precision: 6)
}
";

fn tanhs(e: &Expr) -> usize {
    let mut n = 0;
    walk::walk(e, &mut |x| n += matches!(x.kind, ExprKind::Prim { prim: Prim::Tanh, .. }) as usize);
    n
}

#[test]
fn a_value_read_several_times_by_one_tree_is_computed_in_it_once() {
    let mut c = lang::check::check_source("shared.msl", SRC, Path::new("."));
    assert!(!c.has_errors());
    let before = {
        let mut out = Vec::new();
        let mut it = lang::interp::Interp::new(&c.program, Box::new(&mut out));
        it.run_main(c.program.main.unwrap()).unwrap_or_else(|e| panic!("{}", e.message));
        drop(it);
        String::from_utf8(out).unwrap()
    };
    let report = lang::passes::optimize(&mut c.program);
    assert!(c.program.malformed.is_empty(), "{:?}", c.program.malformed);
    assert!(report.substituted > 0);
    let g = c.program.funcs.iter().find(|f| c.program.names.get(f.name) == "h").expect("h");
    // No statement stores a value that reads `tanh`: it sits in the tree that uses it.
    walk::walk(&g.body, &mut |e| {
        if let ExprKind::Block { stmts, .. } = &e.kind {
            for s in stmts {
                if let Stmt::Let { value, .. } = s {
                    assert!(tanhs(value) == 0 || fuse::may_root(value), "a stored tanh: {value:?}");
                }
            }
        }
    });
    // The tree holding the copies computes `tanh` once.
    let mut trees = Vec::new();
    walk::walk(&g.body, &mut |e| {
        if fuse::may_root(e) && tanhs(e) > 1 {
            trees.push(fuse::analyse(e).0);
        }
    });
    let biggest = trees.iter().max_by_key(|t| t.nodes.len()).expect("a fused tree with the copies");
    assert_eq!(biggest.op_names().iter().filter(|n| **n == "tanh").count(), 1, "{}", biggest.term());
    // And the program prints what it printed before.
    let mut out = Vec::new();
    {
        let mut it = lang::interp::Interp::new(&c.program, Box::new(&mut out));
        it.run_main(c.program.main.unwrap()).unwrap_or_else(|e| panic!("{}", e.message));
    }
    assert_eq!(String::from_utf8(out).unwrap(), before);
}

const LITERALS: &str = "
fn k(x: f32[64], y: f32[64]) -> f32[64] {
    let z = 0.0
    let s = 2.0
    let a = where(x > z, y, z)
    var b = where(y > z, x * s, z)
    for i in 0..2 {
        b = b * s
    }
    a * b
}

fn main() {
    print(k(normal(64, seed: 2), normal(64, seed: 3)), precision: 6)
}
";

#[test]
fn a_literal_bound_to_a_local_is_a_constant_of_every_tree_that_reads_it() {
    let mut c = lang::check::check_source("literals.msl", LITERALS, Path::new("."));
    assert!(!c.has_errors());
    let run = |p: &lang::ir::Program| {
        let mut out = Vec::new();
        let mut it = lang::interp::Interp::new(p, Box::new(&mut out));
        it.run_main(p.main.unwrap()).unwrap_or_else(|e| panic!("{}", e.message));
        drop(it);
        String::from_utf8(out).unwrap()
    };
    let before = run(&c.program);
    lang::passes::optimize(&mut c.program);
    assert!(c.program.malformed.is_empty(), "{:?}", c.program.malformed);
    let k = c.program.funcs.iter().find(|f| c.program.names.get(f.name) == "k").expect("k");
    // `z` is gone; `s` stays for the loop (whose body runs more than once).
    let mut lets = Vec::new();
    walk::walk(&k.body, &mut |e| {
        if let ExprKind::Block { stmts, .. } = &e.kind {
            for s in stmts {
                if let Stmt::Let { value, .. } = s {
                    if matches!(value.kind, ExprKind::Lit(_)) {
                        lets.push(value.clone());
                    }
                }
            }
        }
    });
    assert_eq!(lets.len(), 1, "{lets:?}");
    // Every `where` tree reads only `x` and `y`; its zeros and the 2 are constants.
    let mut trees = Vec::new();
    walk::walk(&k.body, &mut |e| {
        if fuse::may_root(e) && matches!(e.kind, ExprKind::Prim { prim: Prim::Where, .. }) {
            trees.push(fuse::analyse(e));
        }
    });
    assert!(!trees.is_empty());
    for (tree, leaves) in &trees {
        assert!(
            leaves.iter().all(|l| !matches!(l.kind, ExprKind::Lit(_))) && leaves.len() <= 2,
            "{}: {leaves:?}",
            tree.term()
        );
        assert!(tree.term().contains(", 0)"), "{}", tree.term());
    }
    assert_eq!(run(&c.program), before);
}
