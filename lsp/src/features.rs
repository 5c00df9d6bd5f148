//! The answers to requests, computed from one check of the document: each function turns the
//! `lang::ide` answer into the LSP's types.

use crate::convert::{self, ROOT};
use lang::check::Checked;
use lang::ide::{self, SymbolKind};
use lang::source::Span;
use std::collections::HashMap;
use tower_lsp_server::ls_types as lsp;
use tower_lsp_server::ls_types::Uri;

pub fn hover(c: &Checked, pos: lsp::Position) -> Option<lsp::Hover> {
    let h = ide::hover(c, ROOT, convert::offset(c, pos))?;
    let mut md = format!("```msl\n{}\n```", h.signature);
    if let Some(i) = &h.instance {
        md.push_str(&format!("\n\ninstantiated with `{i}`"));
    }
    if let Some(d) = &h.doc {
        md.push_str(&format!("\n\n---\n\n{d}"));
    }
    Some(lsp::Hover {
        contents: lsp::HoverContents::Markup(lsp::MarkupContent { kind: lsp::MarkupKind::Markdown, value: md }),
        range: Some(convert::range(c, h.span)),
    })
}

pub fn definition(c: &Checked, root: &Uri, pos: lsp::Position) -> Option<lsp::GotoDefinitionResponse> {
    let s = ide::definition(c, ROOT, convert::offset(c, pos))?;
    Some(lsp::GotoDefinitionResponse::Scalar(convert::location(c, s, root)?))
}

pub fn references(c: &Checked, root: &Uri, pos: lsp::Position, include_decl: bool) -> Vec<lsp::Location> {
    let off = convert::offset(c, pos);
    let def = ide::definition(c, ROOT, off);
    ide::references(c, ROOT, off)
        .into_iter()
        .filter(|s| include_decl || Some(*s) != def)
        .filter_map(|s| convert::location(c, s, root))
        .collect()
}

/// The inferred type after every `let`/`var` name and closure parameter written without one, in
/// `range`: what `ide::inlay_hints` gives, but linear in the document. That one compares every
/// binding with every index entry, which took minutes on a document of a few megabytes; here
/// the index is read once, for the bindings in the range only.
pub fn inlay_hints(c: &Checked, range: lsp::Range) -> Vec<lsp::InlayHint> {
    let parsed = lang::syntax::parse(ROOT, c.sources.text(ROOT)).0;
    let sites: Vec<(Span, lsp::Position)> = ide::hint_sites(&parsed)
        .into_iter()
        .map(|(span, _)| (span, convert::position(c, ROOT, span.end as usize)))
        .filter(|(_, p)| *p >= range.start && *p <= range.end)
        .collect();
    let mut types: HashMap<Span, Vec<&str>> = sites.iter().map(|(s, _)| (*s, Vec::new())).collect();
    for (span, ty, _) in &c.index.types {
        if let Some(tys) = types.get_mut(span) {
            let t = ide::binding_type(ty);
            if !t.contains("{error}") && !tys.contains(&t) {
                tys.push(t);
            }
        }
    }
    sites
        .into_iter()
        .filter_map(|(span, position)| {
            let tys = types.get(&span).filter(|t| !t.is_empty())?;
            Some(lsp::InlayHint {
                position,
                label: lsp::InlayHintLabel::String(format!(": {}", tys.join(" | "))),
                kind: Some(lsp::InlayHintKind::TYPE),
                text_edits: None,
                tooltip: None,
                padding_left: None,
                padding_right: None,
                data: None,
            })
        })
        .collect()
}

fn symbol_kind(k: SymbolKind) -> lsp::SymbolKind {
    match k {
        SymbolKind::Function | SymbolKind::Builtin => lsp::SymbolKind::FUNCTION,
        SymbolKind::Model => lsp::SymbolKind::STRUCT,
        SymbolKind::Field => lsp::SymbolKind::FIELD,
        SymbolKind::Dim | SymbolKind::Const => lsp::SymbolKind::CONSTANT,
        SymbolKind::Module => lsp::SymbolKind::MODULE,
        SymbolKind::Mesh => lsp::SymbolKind::OBJECT,
        SymbolKind::Test => lsp::SymbolKind::METHOD,
        SymbolKind::Variable | SymbolKind::Parameter => lsp::SymbolKind::VARIABLE,
        SymbolKind::Keyword => lsp::SymbolKind::KEY,
    }
}

pub fn document_symbols(c: &Checked) -> Vec<lsp::DocumentSymbol> {
    let text = c.sources.text(ROOT);
    let parsed = lang::syntax::parse(ROOT, text).0;
    fn conv(c: &Checked, s: ide::Symbol) -> lsp::DocumentSymbol {
        #[allow(deprecated)]
        lsp::DocumentSymbol {
            name: s.name,
            detail: s.detail,
            kind: symbol_kind(s.kind),
            tags: None,
            deprecated: None,
            range: convert::range(c, s.span),
            selection_range: convert::range(c, s.name_span),
            children: (!s.children.is_empty()).then(|| s.children.into_iter().map(|ch| conv(c, ch)).collect()),
        }
    }
    ide::symbols(&parsed, text).into_iter().map(|s| conv(c, s)).collect()
}

/// Keyword snippets, replacing the plain keyword of the same name.
const SNIPPETS: &[(&str, &str)] = &[
    ("fn", "fn ${1:name}(${2:x: f32[N]}) -> ${3:f32} {\n\t$0\n}"),
    ("model", "model ${1:Name}[${2:I, O}] {\n\t${3:w}: f32[${4:I, O}] = ${5:he_normal(I, O)}\n}"),
    ("let", "let ${1:x} = $0"),
    ("var", "var ${1:x} = $0"),
    ("if", "if ${1:cond} {\n\t$0\n}"),
    ("for", "for ${1:i} in ${2:0..n} {\n\t$0\n}"),
    ("while", "while ${1:cond} {\n\t$0\n}"),
    ("test", "test \"${1:name}\" {\n\t$0\n}"),
    ("use", "use ${1:nn}"),
];

pub fn completions(c: &Checked, offset: usize) -> Vec<lsp::CompletionItem> {
    ide::completions(c, ROOT, offset)
        .into_iter()
        .map(|x| {
            let snippet = (x.kind == SymbolKind::Keyword).then(|| SNIPPETS.iter().find(|s| s.0 == x.label)).flatten();
            let kind = match x.kind {
                SymbolKind::Function | SymbolKind::Builtin => lsp::CompletionItemKind::FUNCTION,
                SymbolKind::Model => lsp::CompletionItemKind::STRUCT,
                SymbolKind::Field => lsp::CompletionItemKind::FIELD,
                SymbolKind::Dim | SymbolKind::Const => lsp::CompletionItemKind::CONSTANT,
                SymbolKind::Module => lsp::CompletionItemKind::MODULE,
                SymbolKind::Variable | SymbolKind::Parameter => lsp::CompletionItemKind::VARIABLE,
                SymbolKind::Keyword if snippet.is_some() => lsp::CompletionItemKind::SNIPPET,
                SymbolKind::Keyword => lsp::CompletionItemKind::KEYWORD,
                SymbolKind::Mesh | SymbolKind::Test => lsp::CompletionItemKind::VALUE,
            };
            lsp::CompletionItem {
                label: x.label,
                kind: Some(kind),
                detail: x.detail,
                documentation: x.doc.filter(|d| !d.is_empty()).map(|d| {
                    lsp::Documentation::MarkupContent(lsp::MarkupContent { kind: lsp::MarkupKind::Markdown, value: d })
                }),
                insert_text: snippet.map(|s| s.1.to_string()),
                insert_text_format: snippet.map(|_| lsp::InsertTextFormat::SNIPPET),
                ..Default::default()
            }
        })
        .collect()
}

pub fn signature_help(c: &Checked, pos: lsp::Position) -> Option<lsp::SignatureHelp> {
    let s = ide::signature_help(c, ROOT, convert::offset(c, pos))?;
    let params: Vec<lsp::ParameterInformation> = s
        .params
        .iter()
        .map(|&(a, b)| lsp::ParameterInformation {
            label: lsp::ParameterLabel::Simple(s.label[a..b].to_string()),
            documentation: None,
        })
        .collect();
    Some(lsp::SignatureHelp {
        signatures: vec![lsp::SignatureInformation {
            label: s.label,
            documentation: s.doc.map(|d| {
                lsp::Documentation::MarkupContent(lsp::MarkupContent { kind: lsp::MarkupKind::Markdown, value: d })
            }),
            parameters: Some(params),
            active_parameter: Some(s.active as u32),
        }],
        active_signature: Some(0),
        active_parameter: Some(s.active as u32),
    })
}

#[cfg(test)]
mod tests;
