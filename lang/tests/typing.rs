//! The verifier over the whole corpus: every spec block, example and golden program that
//! checks has a typed IR whose every node's type re-infers, after checking and after each
//! later pass (sharding, `-O2`'s optimisations).

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// Every `.msl` file and spec block of the repository, as (name, source, folder).
fn corpus() -> Vec<(String, String, PathBuf)> {
    let mut out = Vec::new();
    // The language contract lives outside the repository; its programs join when it is there.
    let mut stack = vec![
        root().join("spec"),
        root().join("examples"),
        root().join("tests/golden"),
        root().join("tests/programs"),
        root().join("../shared/design"),
    ];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else { continue };
        let mut entries: Vec<_> = rd.flatten().map(|e| e.path()).collect();
        entries.sort();
        for p in entries {
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|e| e == "md") {
                let text = std::fs::read_to_string(&p).unwrap();
                for b in lang::spec::parse_blocks(&text) {
                    out.push((format!("{}:{}", p.display(), b.start + 1), b.code, d.clone()));
                }
            } else if p.extension().is_some_and(|e| e == "msl") {
                out.push((p.display().to_string(), std::fs::read_to_string(&p).unwrap(), d.clone()));
            }
        }
    }
    out
}

#[test]
fn every_node_of_every_program_re_infers_after_every_pass() {
    let mut failures = Vec::new();
    let mut checked = 0;
    for (name, code, dir) in corpus() {
        let mut c = lang::check::check_source("t.msl", &code, &dir);
        if c.has_errors() {
            continue;
        }
        checked += 1;
        let mut report = |pass: &str, p: &lang::ir::Program| {
            for e in lang::ir::verify::verify(p) {
                failures.push(format!("{name} after {pass}: {e}"));
            }
            // What the passes' own verification recorded (the layout verifier after `shard`).
            for e in &p.malformed {
                failures.push(format!("{name}: {e}"));
            }
        };
        report("check", &c.program);
        if lang::dist::Mesh::of(&c.program).is_some() {
            lang::passes::shard(&mut c.program);
            report("shard", &c.program);
        }
        lang::passes::optimize(&mut c.program);
        report("opt", &c.program);
    }
    println!("{checked} programs checked through every pass");
    assert!(checked > 250, "only {checked} programs checked");
    let n = failures.len();
    // One line per distinct message, with the first program that shows it.
    let mut seen = std::collections::HashSet::new();
    failures.retain(|f| {
        seen.insert(
            f.split_once(": ")
                .map_or(f.clone(), |(_, m)| m.split_once(": ").map_or(m.to_string(), |x| x.1.to_string())),
        )
    });
    failures.truncate(80);
    assert!(n == 0, "{n} type disagreements:\n{}", failures.join("\n"));
}

/// The checked program of `src` (which must check).
fn checked(src: &str) -> lang::check::Checked {
    let c = lang::check::check_source("t.msl", src, Path::new("."));
    assert!(!c.has_errors(), "{:?}", c.diagnostics);
    assert!(c.program.malformed.is_empty(), "{:?}", c.program.malformed);
    c
}

/// Applies `f` to every node of the function named `name`.
fn edit(p: &mut lang::ir::Program, name: &str, f: &mut dyn FnMut(&mut lang::ir::Expr)) {
    let names = p.names.clone();
    for func in p.funcs.iter_mut().filter(|func| names.get(func.name) == name) {
        lang::ir::walk::walk_mut(&mut func.body, f);
    }
}

fn is_prim(e: &lang::ir::Expr, p: lang::ir::Prim) -> bool {
    matches!(&e.kind, lang::ir::ExprKind::Prim { prim, .. } if *prim == p)
}

const MATMUL: &str = "
fn f(x: f32[3, 4], w: f32[4, 5]) -> f32 { sum(x @ w, axis: 1)[0] }
fn main() { print(f(ones(3, 4), ones(4, 5))) }
";

#[test]
fn a_node_of_the_wrong_shape_is_found() {
    let mut c = checked(MATMUL);
    edit(&mut c.program, "f", &mut |e| {
        if is_prim(e, lang::ir::Prim::MatMul) {
            e.ty = lang::types::Type::tensor(lang::types::ElemTy::F32, vec![lang::types::Dim::constant(3); 2]);
        }
    });
    let found = lang::ir::verify::verify(&c.program);
    assert!(found.iter().any(|m| m.contains("`matmul` is f32[3, 3], but its operands make it f32[3, 5]")), "{found:?}");
}

#[test]
fn an_attribute_that_contradicts_the_type_is_found() {
    let mut c = checked(MATMUL);
    edit(&mut c.program, "f", &mut |e| {
        if let lang::ir::ExprKind::Prim { prim: lang::ir::Prim::Sum, attrs, .. } = &mut e.kind {
            attrs.axis = Some(0);
        }
    });
    let found = lang::ir::verify::verify(&c.program);
    assert!(found.iter().any(|m| m.contains("`sum` is f32[3], but its operands make it f32[5]")), "{found:?}");
}

#[test]
fn an_element_type_that_changed_is_found() {
    let mut c = checked(MATMUL);
    edit(&mut c.program, "f", &mut |e| {
        if let lang::ir::ExprKind::Prim { prim: lang::ir::Prim::MatMul, args, .. } = &mut e.kind {
            args[0].ty = lang::types::Type::tensor(
                lang::types::ElemTy::F64,
                vec![lang::types::Dim::constant(3), lang::types::Dim::constant(4)],
            );
        }
    });
    let found = lang::ir::verify::verify(&c.program);
    // The operand now disagrees with the parameter it reads, and the product with its operands.
    assert!(found.iter().any(|m| m.contains("a value is f64[3, 4]")), "{found:?}");
    assert!(found.iter().any(|m| m.contains("`matmul`: operands of different element types")), "{found:?}");
}

#[test]
fn a_pass_that_breaks_the_ir_is_named_and_the_program_does_not_run() {
    let mut c = checked(MATMUL);
    edit(&mut c.program, "f", &mut |e| {
        if is_prim(e, lang::ir::Prim::MatMul) {
            e.ty = lang::types::Type::scalar(lang::types::ElemTy::F32);
        }
    });
    lang::passes::optimize(&mut c.program);
    let why = lang::passes::malformed(&c.program).expect("the verifier runs after every pass in tests");
    assert!(why.contains("after `optimize`") && why.contains("`matmul`"), "{why}");
    let main = c.program.main.unwrap();
    let mut it = lang::interp::Interp::new(&c.program, Box::new(std::io::sink()));
    let err = it.run_main(main).unwrap_err();
    assert_eq!(err.code, lang::diag::Code::E0605);
    assert!(err.message.starts_with("internal compiler error"), "{}", err.message);
}

#[test]
fn a_function_returning_unit_discards_its_body_s_value() {
    for src in
        ["fn main() { 1 }", "fn main() { [1, 2] }", "fn main() { (1, ones(2)) }", "fn f() { 2.0 }\nfn main() { f() }"]
    {
        let c = checked(src);
        assert!(lang::ir::verify::verify(&c.program).is_empty(), "{src}");
        let mut it = lang::interp::Interp::new(&c.program, Box::new(std::io::sink()));
        assert!(it.run_main(c.program.main.unwrap()).is_ok(), "{src}");
    }
}

const ROW_PARALLEL: &str = "
mesh M[mp = 2]
fn f[N, D](h: f32[N, D @mp], w: f32[D @mp, 4], b: f32[4]) -> f32[N, 4] {
    let y: f32[N, 4 @mp] = relu(h @ w + b)
    y
}
fn main() { print(f(ones(3, 4), ones(4, 4), ones(4))) }
";

#[test]
fn the_layout_verifier_passes_the_sharding_pass_and_finds_a_missing_collective() {
    let mut c = checked(ROW_PARALLEL);
    lang::passes::shard(&mut c.program);
    assert!(c.program.malformed.is_empty(), "{:?}", c.program.malformed);
    // Drop the reduce-scatter: the product is a partial sum that nothing combines.
    edit(&mut c.program, "f", &mut |e| {
        if let lang::ir::ExprKind::Prim { prim: lang::ir::Prim::ReduceScatter, args, .. } = &mut e.kind {
            let mut inner = args.remove(0);
            inner.ty = e.ty.clone();
            *e = inner;
        }
    });
    let found = lang::shard::verify::check(&c.program, &[]);
    assert!(found.iter().any(|m| m.contains("`matmul` sums over dims split over")), "{found:?}");
}

#[test]
fn the_layout_verifier_finds_a_block_combined_with_a_whole_value() {
    let mut c = checked(ROW_PARALLEL);
    lang::passes::shard(&mut c.program);
    // Drop the local slice of the bias: each rank would add the whole bias to its block.
    let mut dropped = 0;
    edit(&mut c.program, "f", &mut |e| {
        if let lang::ir::ExprKind::Prim { prim: lang::ir::Prim::LocalSlice, args, .. } = &mut e.kind {
            *e = args.remove(0);
            dropped += 1;
        }
    });
    assert!(dropped > 0);
    let found = lang::shard::verify::check(&c.program, &[]);
    assert!(found.iter().any(|m| m.contains("`add` of layout") && m.contains("has an operand of layout")), "{found:?}");
}
