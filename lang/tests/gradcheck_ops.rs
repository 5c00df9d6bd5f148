//! Gradient checks of sorting, fused attention and `einsum` against central finite
//! differences, first and second order, with the harness of `gradcheck.rs` (`support/`).

mod support;

use support::*;

/// Sorting: the derivative of each sorted value is its source's (random values have no ties).
#[test]
fn sorting() {
    let mut cases = Vec::new();
    let mut seed = 900;
    for s in [vec![6], vec![3, 4], vec![2, 3, 2]] {
        let r = s.len() as i64;
        for axis in -r..r {
            for desc in [false, true] {
                seed += 1;
                let body = format!("sum(w * tanh(sort(x * x, axis: {axis}, descending: {desc})))");
                cases.push(
                    Case::new(format!("sort axis {axis} desc {desc} {s:?}"), body)
                        .param("x", f64t(&s))
                        .weight(&s)
                        .seed(seed),
                );
            }
        }
    }
    let mut ws = vec![3, 2];
    cases.push(
        Case::new("top_k", "let (v, i) = top_k(sin(x), 2)\n    sum(w * v * v)").param("x", f64t(&[3, 5])).weight(&ws),
    );
    ws[1] = 5;
    cases.push(
        Case::new("top_k all", "let (v, i) = top_k(x, 5)\n    sum(w * exp(v))").param("x", f64t(&[3, 5])).weight(&ws),
    );
    run_all("sorting", cases);
}

/// Fused attention and its weights in every operand: all keys, causal, a partly filled cache.
#[test]
fn attention() {
    let mut cases = Vec::new();
    for (i, (name, len, causal)) in
        [("all keys", 5, false), ("causal", 5, true), ("cache", 4, true), ("first keys", 3, false)]
            .into_iter()
            .enumerate()
    {
        let qkv = |c: Case| c.param("q", f64t(&[2, 3, 4])).param("k", f64t(&[2, 5, 4])).seed(950 + i as u64);
        let body = format!("sum(w * fused_attention(q, k, v, len: {len}, causal: {causal}))");
        cases.push(
            qkv(Case::new(format!("fused_attention {name}"), body)).param("v", f64t(&[2, 5, 3])).weight(&[2, 3, 3]),
        );
        let body = format!("sum(w * sin(attention_weights(q, k, len: {len}, causal: {causal})))");
        cases.push(qkv(Case::new(format!("attention_weights {name}"), body)).weight(&[2, 3, 5]));
    }
    run_all("attention", cases);
}

// ---------------------------------------------------------------------------------------------
// einsum.

#[test]
fn einsum_specs() {
    type Spec = (&'static str, Vec<Vec<usize>>, Vec<usize>);
    let specs: Vec<Spec> = vec![
        ("ij,jk->ik", vec![vec![2, 3], vec![3, 4]], vec![2, 4]),
        ("ij,jk", vec![vec![2, 3], vec![3, 4]], vec![2, 4]),
        ("i,j->ij", vec![vec![3], vec![2]], vec![3, 2]),
        ("ij->ji", vec![vec![2, 3]], vec![3, 2]),
        ("ij->", vec![vec![2, 3]], vec![]),
        ("ijk->ik", vec![vec![2, 3, 2]], vec![2, 2]),
        ("ij,ij->", vec![vec![2, 3], vec![2, 3]], vec![]),
        ("ij,ij->ij", vec![vec![2, 3], vec![2, 3]], vec![2, 3]),
        ("ij,j->i", vec![vec![2, 3], vec![3]], vec![2]),
        ("ij,kj->ik", vec![vec![2, 3], vec![4, 3]], vec![2, 4]),
        ("bij,bjk->bik", vec![vec![2, 2, 3], vec![2, 3, 2]], vec![2, 2, 2]),
        ("bhqd,bhkd->bhqk", vec![vec![1, 2, 3, 2], vec![1, 2, 4, 2]], vec![1, 2, 3, 4]),
        ("ij,jk,kl->il", vec![vec![2, 3], vec![3, 2], vec![2, 4]], vec![2, 4]),
        ("i,ij,j->", vec![vec![2], vec![2, 3], vec![3]], vec![]),
        ("ab,bc,ca->b", vec![vec![2, 3], vec![3, 4], vec![4, 2]], vec![3]),
        ("ijk,k->j", vec![vec![2, 3, 4], vec![4]], vec![3]),
        ("nchw,oc->nohw", vec![vec![1, 2, 2, 3], vec![3, 2]], vec![1, 3, 2, 3]),
    ];
    let names = ["a", "b", "c"];
    let mut cases = Vec::new();
    for (i, (spec, shapes, out)) in specs.iter().enumerate() {
        let ops: Vec<&str> = names[..shapes.len()].to_vec();
        let mut c = Case::new(format!("einsum {spec}"), format!("sum(w * einsum(\"{spec}\", {}))", ops.join(", ")))
            .seed(600 + i as u64);
        for (n, s) in ops.iter().zip(shapes) {
            c = c.param(n, f64t(s));
        }
        cases.push(c.weight(out));
    }
    cases.push(
        Case::new("einsum same operand twice", "sum(w * einsum(\"ij,kj->ik\", x, x))")
            .param("x", f64t(&[3, 2]))
            .weight(&[3, 3]),
    );
    run_all("einsum_specs", cases);
}
