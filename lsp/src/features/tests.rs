//! Tests of the answers that the LSP computes itself rather than taking from `lang::ide`.

use super::*;
use std::time::{Duration, Instant};

const ALL: lsp::Range =
    lsp::Range { start: lsp::Position { line: 0, character: 0 }, end: lsp::Position { line: u32::MAX, character: 0 } };

fn checked(text: &str) -> Checked {
    lang::check::check_source("hints.msl", text, std::path::Path::new("."))
}

#[test]
fn inlay_hints_are_those_of_the_ide_module() {
    let text = "fn twice[N](x: f32[N]) -> f32[N] {\n    let y = x * 2.0\n    var z = y\n    let f = |a| a + 1.0\n    let w = f(z)\n    let bad = x @ ones(3, 3, 3)\n    w\n}\n\nfn main() {\n    let a = ones(3)\n    let (p, q) = (a, twice(a))\n    print(p, q)\n}\n";
    let c = checked(text);
    let ours: Vec<(lsp::Position, String)> = inlay_hints(&c, ALL)
        .into_iter()
        .map(|h| match h.label {
            lsp::InlayHintLabel::String(s) => (h.position, s),
            l => panic!("{l:?}"),
        })
        .collect();
    let theirs: Vec<(lsp::Position, String)> =
        ide::inlay_hints(&c, ROOT).into_iter().map(|h| (convert::position(&c, ROOT, h.offset), h.label)).collect();
    assert!(ours.len() >= 6, "{ours:?}");
    assert_eq!(ours, theirs);
    // Only the hints in the range asked for.
    let line2 = lsp::Range::new(lsp::Position::new(2, 0), lsp::Position::new(2, 100));
    let some: Vec<_> = inlay_hints(&c, line2).into_iter().map(|h| h.position.line).collect();
    assert_eq!(some, [2]);
}

#[test]
fn inlay_hints_of_a_large_document_take_linear_time() {
    // 20,000 bindings: comparing each with each index entry took over ten seconds in a debug build.
    let mut text = String::from("fn main() {\n    let x0 = ones(3)\n");
    for i in 0..20_000 {
        text.push_str(&format!("    let x{} = x{i} + 1.0\n", i + 1));
    }
    text.push_str("    print(x20000)\n}\n");
    let c = checked(&text);
    let t = Instant::now();
    let hints = inlay_hints(&c, ALL);
    let took = t.elapsed();
    assert_eq!(hints.len(), 20_001);
    assert!(took < Duration::from_secs(3), "inlay hints took {took:?}");
}
