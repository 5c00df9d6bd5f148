//! Tests of the editor features on small programs.

use super::*;
use crate::check::check_source;
use std::path::Path;

const MLP: &str = r#"use nn.{linear, relu}
use optim.adam

/// A two-layer perceptron.
model Mlp[I, H, O] {
    w1: f32[I, H] = he_normal(I, H)
    b1: f32[H] = zeros(H)
    w2: f32[H, O] = he_normal(H, O)
    b2: f32[O] = zeros(O)
}

/// Logits of the perceptron.
fn forward[N, I, H, O](m: Mlp[I, H, O], x: f32[N, I]) -> f32[N, O] {
    let h = relu(linear(x, m.w1, m.b1))
    let sq = map(|t| t * t, m)
    linear(h, m.w2, m.b2)
}

fn main() {
    let m = init(Mlp[4, 8, 3], seed: 0)
    let x = ones(2, 4)
    let y = forward(m, x)
    print(y)
}
"#;

fn check(text: &str) -> Checked {
    check_source("t.msl", text, Path::new("."))
}

fn at(text: &str, needle: &str, nth: usize) -> usize {
    text.match_indices(needle).nth(nth).map(|(i, _)| i).unwrap_or_else(|| panic!("no {needle:?}"))
}

#[test]
fn the_example_checks() {
    let c = check(MLP);
    assert!(!c.has_errors(), "{}", crate::diag::render_short(&c.diagnostics, &c.sources));
}

#[test]
fn hover_shows_symbolic_shapes_docs_and_instances() {
    let c = check(MLP);
    let h = hover(&c, FileId(0), at(MLP, "h = relu", 0)).unwrap();
    assert_eq!(h.signature, "h: f32[N, H]");
    let f = hover(&c, FileId(0), at(MLP, "forward(m, x)", 0) + 2).unwrap();
    assert!(f.signature.starts_with("fn forward[N, I, H, O](m: Mlp[I, H, O], x: f32[N, I]) -> f32[N, O]"), "{f:?}");
    assert_eq!(f.doc.as_deref(), Some("Logits of the perceptron."));
    assert_eq!(f.instance.as_deref(), Some("N = 2, I = 4, H = 8, O = 3"));
    let l = hover(&c, FileId(0), at(MLP, "linear(h", 0)).unwrap();
    assert!(l.doc.unwrap().contains("Affine map"));
    let m = hover(&c, FileId(0), at(MLP, "Mlp[4", 0)).unwrap();
    assert!(m.signature.starts_with("model Mlp[I, H, O] {\n    w1: f32[I, H]"), "{m:?}");
    assert_eq!(m.doc.as_deref(), Some("A two-layer perceptron."));
    let z = hover(&c, FileId(0), at(MLP, "ones(2", 0)).unwrap();
    assert_eq!(z.signature, "ones(d…) -> f32[d…]");
}

#[test]
fn definitions_and_references() {
    let c = check(MLP);
    let def = definition(&c, FileId(0), at(MLP, "h, m.w2", 0)).unwrap();
    assert_eq!(def.start as usize, at(MLP, "h = relu", 0));
    let refs = references(&c, FileId(0), at(MLP, "h = relu", 0));
    assert_eq!(refs.len(), 2, "{refs:?}");
    let fwd = definition(&c, FileId(0), at(MLP, "forward(m, x)", 0)).unwrap();
    assert_eq!(fwd.start as usize, at(MLP, "forward[", 0));
    let lin = definition(&c, FileId(0), at(MLP, "linear(x", 0)).unwrap();
    assert_eq!(c.sources.name(lin.file), "<stdlib>/nn.msl");
    let model_refs = references(&c, FileId(0), at(MLP, "Mlp[4", 0));
    assert_eq!(model_refs.len(), 3, "{model_refs:?}");
    let w1 = definition(&c, FileId(0), at(MLP, "w1, m.b1", 0)).unwrap();
    assert_eq!(w1.start as usize, at(MLP, "w1: f32", 0));
}

#[test]
fn inlay_hints_after_lets_and_closure_params() {
    let c = check(MLP);
    let hints = inlay_hints(&c, FileId(0));
    let find = |needle: &str| {
        hints.iter().find(|h| h.offset == at(MLP, needle, 0) + needle.find(' ').unwrap_or(1)).map(|h| h.label.clone())
    };
    assert_eq!(find("h = relu").as_deref(), Some(": f32[N, H]"));
    assert_eq!(find("y = forward").as_deref(), Some(": f32[2, 3]"));
    assert_eq!(find("m = init").as_deref(), Some(": Mlp[4, 8, 3]"));
    let closure = hints.iter().find(|h| h.site == HintSite::ClosureParam).expect("a closure hint");
    assert_eq!(closure.offset, at(MLP, "|t|", 0) + 2);
    assert!(closure.label.starts_with(": f32["), "{closure:?}");
}

#[test]
fn completion_in_scope_fields_and_modules() {
    let text = MLP.replace("    print(y)", "    print(y)\n    let z = m.__c\n    nn.__d\n    adam.__e\n    y");
    let text = format!("use nn\n{text}");
    let c = check(&text);
    let labels = |off: usize| completions(&c, FileId(0), off).into_iter().map(|x| x.label).collect::<Vec<_>>();
    let fields = labels(at(&text, "__c", 0));
    assert_eq!(fields, ["w1", "b1", "w2", "b2"]);
    let nn = labels(at(&text, "__d", 0));
    assert!(nn.contains(&"cross_entropy".to_string()) && nn.contains(&"linear".to_string()), "{nn:?}");
    let adam = labels(at(&text, "__e", 0));
    assert!(adam.contains(&"step".to_string()) && adam.contains(&"init".to_string()), "{adam:?}");
    let all = completions(&c, FileId(0), at(&text, "    y\n}", 0) + 5);
    let get = |n: &str| all.iter().find(|x| x.label == n).unwrap_or_else(|| panic!("no {n}: {all:?}"));
    assert_eq!(get("x").detail.as_deref(), Some("f32[2, 4]"));
    assert_eq!(get("forward").kind, SymbolKind::Function);
    assert_eq!(get("Mlp").kind, SymbolKind::Model);
    assert_eq!(get("relu").kind, SymbolKind::Function);
    assert_eq!(get("adam").kind, SymbolKind::Module);
    assert_eq!(get("zeros").kind, SymbolKind::Builtin);
    assert_eq!(get("while").kind, SymbolKind::Keyword);
    assert!(all.iter().all(|x| x.label != "h"), "`h` is local to forward");
}

#[test]
fn signature_help_tracks_the_argument() {
    let text = MLP.replace("    print(y)", "    let q = forward(m, ");
    let c = check(&text);
    let off = at(&text, "forward(m, ", 0) + "forward(m, ".len();
    let s = signature_help(&c, FileId(0), off).unwrap();
    assert!(s.label.starts_with("fn forward"), "{s:?}");
    assert_eq!(s.active, 1);
    assert_eq!(&s.label[s.params[1].0..s.params[1].1], "x: f32[N, I]");
    let text = MLP.replace("    print(y)", "    let n = normal(2, 3, seed: ");
    let c = check(&text);
    let s = signature_help(&c, FileId(0), at(&text, "seed: ", 1) + 6).unwrap();
    assert_eq!(s.label, "normal(d…, seed: s) -> f32[d…]");
    assert_eq!(s.active, 1);
    let text = MLP.replace("    print(y)", "    let n = nn.linear(x, ");
    let c = check(&text);
    let s = signature_help(&c, FileId(0), at(&text, "linear(x, ", 0) + 10).unwrap();
    assert!(s.label.starts_with("fn linear[I, O, ..S]"), "{s:?}");
}

#[test]
fn symbols_of_a_file() {
    let parsed = crate::syntax::parse(FileId(0), MLP).0;
    let s = symbols(&parsed, MLP);
    let names: Vec<&str> = s.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["Mlp", "forward", "main"]);
    assert_eq!(s[0].children.len(), 4);
    assert_eq!(s[1].detail.as_deref(), Some("fn forward[N, I, H, O](m: Mlp[I, H, O], x: f32[N, I]) -> f32[N, O]"));
}

#[test]
fn broken_code_answers_what_it_can() {
    let text =
        "fn f(x: f32[3]) -> f32 {\n    let y = x +\n}\n\nfn g(a: f32[2]) -> f32[2] {\n    let b = a * 2.0\n    b\n}\n";
    let c = check(text);
    assert!(c.has_errors());
    let h = hover(&c, FileId(0), at(text, "b\n}", 0)).unwrap();
    assert_eq!(h.signature, "b: f32[2]");
    for off in 0..=text.len() {
        let _ = hover(&c, FileId(0), off);
        let _ = completions(&c, FileId(0), off);
        let _ = signature_help(&c, FileId(0), off);
        let _ = definition(&c, FileId(0), off);
    }
    let _ = inlay_hints(&c, FileId(0));
}

/// Every prefix of a real program (what an editor holds while the file is typed from the top),
/// with the cursor at its end: no feature may panic, and a check must come back.
#[test]
fn every_prefix_of_an_example_is_answered() {
    let example = format!("{MLP}\n// ünïcödé 𝄞 at the end\nfn z() {{ let s = \"𝄞\" }}\n");
    let cuts: Vec<usize> = (0..=example.len()).step_by(5).filter(|&i| example.is_char_boundary(i)).collect();
    for cut in cuts {
        let text = &example[..cut];
        let c = check(text);
        for off in [cut, cut.saturating_sub(1), cut / 2] {
            let _ = hover(&c, FileId(0), off);
            let _ = completions(&c, FileId(0), off);
            let _ = signature_help(&c, FileId(0), off);
            let _ = references(&c, FileId(0), off);
        }
        let _ = inlay_hints(&c, FileId(0));
        let _ = symbols(&crate::syntax::parse(FileId(0), text).0, text);
    }
}

/// Hover and inlay hints show the layouts sharding infers (LANGUAGE.md §8 *Propagation*).
#[test]
fn hover_and_hints_show_inferred_layouts() {
    let text = r#"mesh M[dp = 2, mp = 2]
model Mlp[I, H, O] {
    w1: f32[I, H @mp] = he_normal(I, H)
    w2: f32[H @mp, O] = he_normal(H, O)
}
fn loss[N, I, H, O](m: Mlp[I, H, O], x: f32[N @dp, I]) -> f32 {
    let h = relu(x @ m.w1)
    let z: f32[N @dp, O] = h @ m.w2
    mean(z)
}
fn main() {
    print(loss(init(Mlp[4, 8, 2], seed: 0), ones(4, 4)))
}
"#;
    let c = check(text);
    assert!(!c.has_errors(), "{:?}", c.diagnostics);
    let h = hover(&c, FileId(0), at(text, "h = relu", 0)).expect("hover on h");
    assert_eq!(h.signature, "h: f32[N @dp, H @mp]");
    let h = hover(&c, FileId(0), at(text, "z: f32", 0)).expect("hover on z");
    assert_eq!(h.signature, "z: f32[N @dp, O]");
    let hints = inlay_hints(&c, FileId(0));
    assert!(
        hints.iter().any(|h| h.label == ": f32[N @dp, H @mp]"),
        "{:?}",
        hints.iter().map(|h| &h.label).collect::<Vec<_>>()
    );
}
