//! `@copies` and the ordering of sharded bodies (`shard::overlap`): after the sharding pass,
//! a collective's first reader comes after other work wherever the program has any, the order
//! respects every dependence (the verifier re-infers the program), and a program without a
//! mesh is left alone.

use lang::ir::{ExprKind, Func, Pat, Stmt};
use std::collections::HashSet;

const BLOCK: &str = "
mesh M[mp = 2]

model Mlp[D, F] {
    w1: f32[D, F @mp] = glorot_uniform(D, F)
    b1: f32[F @mp]    = zeros(F)
    w2: f32[F @mp, D] = glorot_uniform(F, D)
}

COPIES
fn block[B, D, F](m: Mlp[D, F], x: f32[B, D]) -> f32[B, D] {
    let h = relu(x @ m.w1 + m.b1)
    x + h @ m.w2
}

fn loss[B, D, F](m: Mlp[D, F], x: f32[B, D]) -> f32 {
    mean(block(m, block(m, x)) ** 2)
}

fn main() {
    let m = init(Mlp[4, 8], seed: 0)
    print(grad(loss)(m, normal(8, 4, seed: 1)))
}
";

fn sharded(copies: &str) -> lang::check::Checked {
    let src = BLOCK.replace("COPIES", copies);
    let mut c = lang::check::check_source("t.msl", &src, std::path::Path::new("."));
    assert!(!c.has_errors(), "{:?}", c.diagnostics);
    lang::passes::shard(&mut c.program);
    assert!(c.program.malformed.is_empty(), "{:?}", c.program.malformed);
    c
}

/// For each top-level collective of `f`: how many statements run between its start and its
/// first reader.
fn gaps(f: &Func) -> Vec<usize> {
    let ExprKind::Block { stmts, .. } = &f.body.kind else { return vec![] };
    let mut out = Vec::new();
    for (i, s) in stmts.iter().enumerate() {
        let Stmt::Let { pat: Pat::Local(l), value } = s else { continue };
        let ExprKind::Prim { prim, .. } = &value.kind else { continue };
        if !prim.is_collective() || *prim == lang::ir::Prim::LocalSlice {
            continue;
        }
        let reads = |s: &Stmt| {
            let mut found = false;
            let mut look = |e: &lang::ir::Expr| {
                lang::ir::walk::walk(e, &mut |x| found |= matches!(x.kind, ExprKind::Local(m) if m == *l))
            };
            match s {
                Stmt::Let { value, .. } | Stmt::Assign { value, .. } | Stmt::Expr(value) => look(value),
                Stmt::BindDims { .. } => {}
            }
            found
        };
        let first = stmts[i + 1..].iter().position(reads).unwrap_or(stmts.len() - i - 1);
        out.push(first);
    }
    out
}

/// The derivative of `loss` (the function holding the most collectives).
fn busiest(c: &lang::check::Checked) -> &Func {
    c.program.funcs.iter().max_by_key(|f| gaps(f).len()).expect("functions")
}

#[test]
fn copies_put_the_other_copy_between_a_collective_and_its_reader() {
    let c = sharded("@copies(2)");
    let g = gaps(busiest(&c));
    // Two copies of w2's partial sum in each block, and of the second block's input cotangent
    // through w1 (the data needs none).
    assert_eq!(g.len(), 6, "{g:?}");
    let hidden = g.iter().filter(|&&n| n > 0).count();
    assert!(hidden * 4 >= g.len() * 3, "most collectives have work before their reader: {g:?}");
}

#[test]
fn copies_write_the_body_once_per_copy() {
    let c = sharded("@copies(2)");
    let plain = sharded("");
    let count = |c: &lang::check::Checked| gaps(busiest(c)).len();
    assert_eq!(count(&c), 2 * count(&plain));
    // Each copy's collectives carry half the batch: f32[B/2, D].
    let block = c.program.funcs.iter().find(|f| c.program.names.get(f.name) == "block").expect("block");
    let mut halves = 0;
    lang::ir::walk::walk(&block.body, &mut |e| {
        if let ExprKind::Prim { prim: lang::ir::Prim::AllReduceSum, .. } = &e.kind {
            halves += usize::from(format!("{:?}", e.ty).contains("den: 2"));
        }
    });
    assert_eq!(halves, 2, "one all-reduce per copy over B/2 rows");
}

#[test]
fn without_a_mesh_nothing_is_reordered() {
    let src = BLOCK.replace("COPIES", "").replace("mesh M[mp = 2]", "").replace(" @mp", "");
    let mut c = lang::check::check_source("t.msl", &src, std::path::Path::new("."));
    let before: Vec<String> = c.program.funcs.iter().map(|f| format!("{:?}", f.body)).collect();
    lang::passes::shard(&mut c.program);
    let after: Vec<String> = c.program.funcs.iter().map(|f| format!("{:?}", f.body)).collect();
    assert_eq!(before, after);
}

#[test]
fn the_order_keeps_every_dependence_and_every_effect_in_place() {
    let c = sharded("@copies(2)");
    for f in &c.program.funcs {
        let ExprKind::Block { stmts, .. } = &f.body.kind else { continue };
        let mut bound: HashSet<lang::ir::Local> = f.params.iter().copied().collect();
        for s in stmts {
            if let Stmt::Let { value, .. } = s {
                lang::ir::walk::walk(value, &mut |x| {
                    if let ExprKind::Local(l) = x.kind {
                        let top_level = stmts.iter().any(|t| matches!(t, Stmt::Let { pat, .. } if pat_binds(pat, l)));
                        assert!(!top_level || bound.contains(&l), "a statement reads a local bound after it");
                    }
                });
            }
            if let Stmt::Let { pat, .. } = s {
                pat.each_local(&mut |l| {
                    bound.insert(l);
                });
            }
        }
    }
}

fn pat_binds(p: &Pat, l: lang::ir::Local) -> bool {
    let mut found = false;
    p.each_local(&mut |m| found |= m == l);
    found
}

#[test]
fn the_copies_weight_gradients_are_all_reduced_once_over_dp() {
    for body in ["mean(block(m, block(m, x)) ** 2)", "mean(block(m, x) ** 2)"] {
        weight_gradients_all_reduced_once(body);
    }
}

fn weight_gradients_all_reduced_once(loss_body: &str) {
    let src = BLOCK
        .replace("mean(block(m, block(m, x)) ** 2)", loss_body)
        .replace("COPIES", "@copies(2)")
        .replace("mesh M[mp = 2]", "mesh M[dp = 2, mp = 2]")
        .replace("(m: Mlp[D, F], x: f32[B, D]) -> f32 {", "(m: Mlp[D, F], x: f32[B @dp, D]) -> f32 {");
    let mut c = lang::check::check_source("t.msl", &src, std::path::Path::new("."));
    assert!(!c.has_errors(), "{:?}", c.diagnostics);
    let report = lang::passes::shard(&mut c.program);
    assert!(c.program.malformed.is_empty(), "{:?}", c.program.malformed);
    let dp = c.program.meshes[0].axes.iter().position(|(n, _)| c.program.names.get(*n) == "dp").unwrap();
    let over_dp = |f: &Func| {
        let mut n = 0;
        lang::ir::walk::walk(&f.body, &mut |e| {
            if let ExprKind::Prim { prim: lang::ir::Prim::AllReduceSum, attrs, .. } = &e.kind {
                n += usize::from(attrs.mesh_axes.iter().any(|a| a.0 as usize == dp));
            }
        });
        n
    };
    // w1, b1 and w2: each copy's and each block's contribution summed, then one all-reduce.
    assert_eq!(over_dp(busiest(&c)), 3, "{loss_body}");
    // `--emit collectives` lists only what remains.
    let listed: usize = report
        .collectives
        .iter()
        .filter(|k| k.axes == ["dp"] && k.prim == lang::ir::Prim::AllReduceSum)
        .map(|k| 1 + k.same.len())
        .sum();
    assert_eq!(listed, 3);
}
