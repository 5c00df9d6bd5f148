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
