//! Editor features over a checked program: hover, go to definition, references, inlay hints,
//! document symbols, completion and signature help.
//!
//! Everything here speaks byte offsets and `Span`s; the language server converts them to UTF-16
//! positions and the REPL uses them directly. Nothing here knows the LSP. The answers come from
//! the checker's `Index` (the type of every name occurrence and where it is defined), the typed
//! IR (instantiated dims of generic calls) and a fresh parse of the file, so they also work on a
//! file with errors: whatever the checker could type is answered.

mod builtins;
mod complete;
mod syntax;

pub use builtins::builtin_info;
pub use complete::{completions, signature_help, Completion, SignatureHelp};
pub use syntax::{
    hint_sites, imports, scope_at, symbols, HintSite, Import, ModuleTarget, ScopeName, Symbol, SymbolKind,
};

use crate::check::Checked;
use crate::ir::{walk::walk, ExprKind};
use crate::source::{FileId, Span};
use crate::types::{dim_str, shape_str};

/// An index entry: (span of a name, rendered type or signature, definition span).
pub type Entry = (Span, String, Option<Span>);

/// The innermost index entry whose span contains `offset` (the end counts: a cursor right after
/// a name is on it).
pub fn entry_at(c: &Checked, file: FileId, offset: usize) -> Option<&Entry> {
    let mut best: Option<&Entry> = None;
    for e in &c.index.types {
        let s = e.0;
        if s.file != file || (s.start as usize) > offset || offset > s.end as usize {
            continue;
        }
        if best.is_none_or(|b| s.end - s.start < b.0.end - b.0.start) {
            best = Some(e);
        }
    }
    best
}

/// The identifier around `offset` in `text`, as a byte range.
pub fn word_at(text: &str, offset: usize) -> Option<(usize, usize)> {
    let mut offset = offset.min(text.len());
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    let is_id = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let start = text[..offset].char_indices().rev().take_while(|(_, c)| is_id(*c)).last().map_or(offset, |(i, _)| i);
    let end = text[offset..].char_indices().find(|(_, c)| !is_id(*c)).map_or(text.len(), |(i, _)| offset + i);
    (start < end).then_some((start, end))
}

/// What hovering a name shows.
#[derive(Clone, Debug, PartialEq)]
pub struct Hover {
    /// The name hovered.
    pub span: Span,
    /// Its type with the symbolic shape (`x: f32[N, 128]`) or its signature.
    pub signature: String,
    /// The dims a generic call instantiates (`I = 64, O = 10, ..S = [N]`).
    pub instance: Option<String>,
    /// The doc comment of the definition.
    pub doc: Option<String>,
}

/// The type, doc comment and instantiated dims of the name at `offset`.
pub fn hover(c: &Checked, file: FileId, offset: usize) -> Option<Hover> {
    let text = c.sources.text(file);
    if let Some((span, s, def)) = entry_at(c, file, offset) {
        if let Some(name) = s.strip_prefix("builtin ") {
            let (sig, doc) = builtin_info(name).unwrap_or((name, ""));
            return Some(Hover {
                span: *span,
                signature: sig.to_string(),
                instance: None,
                doc: (!doc.is_empty()).then(|| doc.to_string()),
            });
        }
        let mut h = Hover { span: *span, signature: s.clone(), instance: None, doc: None };
        if let Some(t) = inferred_layouts(c).and_then(|l| layout_at(c, &l, *span)) {
            h.signature = format!("{}: {t}", s.split_once(": ").map_or(s.as_str(), |(n, _)| n));
        }
        if s.starts_with("fn ") {
            h.doc = def.and_then(|d| c.fn_sigs.iter().find(|f| f.span == d)).and_then(|f| f.doc.clone());
            h.instance = instantiation(c, *span);
        }
        return Some(h);
    }
    // Names the index does not record: function and model definitions, models in types,
    // builtins, modules.
    let inside = |s: Span| s.file == file && (s.start as usize) <= offset && offset <= s.end as usize;
    if let Some(f) = c.fn_sigs.iter().find(|f| inside(f.span)) {
        return Some(Hover { span: f.span, signature: fn_signature(c, f), instance: None, doc: f.doc.clone() });
    }
    let (a, b) = word_at(text, offset)?;
    let word = &text[a..b];
    let span = Span::new(file, a, b);
    if let Some((i, m)) = c.program.models.iter().enumerate().find(|(_, m)| c.program.names.get(m.name) == word) {
        let _ = i;
        let def = c.program.span(m.span);
        let doc = crate::syntax::lexer::doc_comment_before(c.sources.text(def.file), def.start as usize);
        return Some(Hover { span, signature: model_str(c, m), instance: None, doc });
    }
    if let Some((sig, doc)) = builtin_info(word) {
        return Some(Hover { span, signature: sig.to_string(), instance: None, doc: Some(doc.to_string()) });
    }
    let parsed = crate::syntax::parse(file, text).0;
    for imp in imports(&parsed) {
        if let Import::Module { alias, target, .. } = imp {
            if alias == word {
                let t = match target {
                    ModuleTarget::Stdlib(m) => m,
                    ModuleTarget::File(p) => format!("\"{p}\""),
                };
                return Some(Hover { span, signature: format!("module {t}"), instance: None, doc: None });
            }
        }
    }
    None
}

/// `model Mlp[I, H, O] { w1: f32[I, H], … }`.
fn model_str(c: &Checked, m: &crate::ir::Model) -> String {
    let p = &c.program;
    let mut g: Vec<String> =
        m.dims.iter().map(|s| p.sym_names.get(s.0 as usize).cloned().unwrap_or_default()).collect();
    g.extend(
        m.models.iter().map(|v| format!("{}: Model", p.tyvar_names.get(v.0 as usize).cloned().unwrap_or_default())),
    );
    let gs = if g.is_empty() { String::new() } else { format!("[{}]", g.join(", ")) };
    let fields: Vec<String> =
        m.fields.iter().map(|f| format!("    {}: {}", p.names.get(f.name), crate::types::type_str(&f.ty, p))).collect();
    format!("model {}{gs} {{\n{}\n}}", p.names.get(m.name), fields.join("\n"))
}

/// `fn linear[I, O, ..S](x: f32[..S, I], w: f32[I, O], b: f32[O]) -> f32[..S, O]`.
pub fn fn_signature(c: &Checked, sig: &crate::check::FnSig) -> String {
    let p = &c.program;
    let mut g: Vec<String> = sig.dim_names.iter().map(|(n, _)| n.clone()).collect();
    g.extend(sig.rest_names.iter().map(|(n, _)| format!("..{n}")));
    g.extend(sig.model_names.iter().map(|(n, _)| format!("{n}: Model")));
    let gs = if g.is_empty() { String::new() } else { format!("[{}]", g.join(", ")) };
    let ps: Vec<String> =
        sig.params.iter().map(|q| format!("{}: {}", q.name, crate::types::type_str(&q.ty, p))).collect();
    let ret = if sig.ret.is_unit() { String::new() } else { format!(" -> {}", crate::types::type_str(&sig.ret, p)) };
    format!("fn {}{gs}({}){ret}", sig.name, ps.join(", "))
}

/// The dims a call of a generic function instantiates, for the callee name at `callee`.
pub fn instantiation(c: &Checked, callee: Span) -> Option<String> {
    let p = &c.program;
    let name = c.sources.text(callee.file).get(callee.range())?;
    let mut best: Option<(u32, String)> = None;
    for f in &p.funcs {
        walk(&f.body, &mut |e| {
            let ExprKind::Call { func, dims, rests, .. } = &e.kind else {
                return;
            };
            let s = p.span(e.span);
            if s.file != callee.file || s.start > callee.start || s.end < callee.end {
                return;
            }
            let target = p.func(*func);
            if p.names.get(target.name) != name {
                return;
            }
            let len = s.end - s.start;
            if best.as_ref().is_some_and(|(l, _)| *l <= len) {
                return;
            }
            let mut parts: Vec<String> = target
                .dims
                .iter()
                .zip(dims)
                .map(|(s, d)| {
                    format!("{} = {}", p.sym_names.get(s.0 as usize).map_or("?", String::as_str), dim_str(d, p))
                })
                .collect();
            parts.extend(target.rests.iter().zip(rests).map(|(r, sh)| {
                format!("..{} = {}", p.rest_names.get(r.0 as usize).map_or("?", String::as_str), shape_str(sh, p))
            }));
            if !parts.is_empty() {
                best = Some((len, parts.join(", ")));
            }
        });
    }
    best.map(|(_, s)| s)
}

/// Where the name at `offset` is defined.
pub fn definition(c: &Checked, file: FileId, offset: usize) -> Option<Span> {
    if let Some((_, _, def)) = entry_at(c, file, offset) {
        return *def;
    }
    let text = c.sources.text(file);
    let (a, b) = word_at(text, offset)?;
    let word = &text[a..b];
    if let Some(m) = c.program.models.iter().find(|m| c.program.names.get(m.name) == word) {
        return Some(c.program.span(m.span));
    }
    let parsed = crate::syntax::parse(file, text).0;
    for imp in imports(&parsed) {
        match imp {
            Import::Module { alias, target, .. } if alias == word => {
                return module_file(c, &target).map(|f| Span::new(f, 0, 0));
            }
            Import::Item { name, target, .. } if name == word => {
                let f = module_file(c, &target)?;
                let parsed = crate::syntax::parse(f, c.sources.text(f)).0;
                return symbols(&parsed, c.sources.text(f)).into_iter().find(|s| s.name == word).map(|s| s.name_span);
            }
            _ => {}
        }
    }
    None
}

/// The file of a used module in this compilation, if it was loaded.
pub fn module_file(c: &Checked, target: &ModuleTarget) -> Option<FileId> {
    match target {
        ModuleTarget::Stdlib(m) => {
            let name = format!("<stdlib>/{}.msl", m.replace('.', "/"));
            c.sources.files().find(|(_, f)| f.name == name).map(|(id, _)| id)
        }
        ModuleTarget::File(p) => {
            let want = std::path::Path::new(p).file_name()?;
            c.sources
                .files()
                .skip(1)
                .find(|(_, f)| std::path::Path::new(&f.name).file_name() == Some(want))
                .map(|(id, _)| id)
        }
    }
}

/// Every occurrence of the name at `offset` (its definition included), in source order.
pub fn references(c: &Checked, file: FileId, offset: usize) -> Vec<Span> {
    let Some(target) = definition(c, file, offset) else {
        return vec![];
    };
    let mut out: Vec<Span> = c.index.types.iter().filter(|e| e.2 == Some(target)).map(|e| e.0).collect();
    out.push(target);
    // Model names occur in types, which the index does not record: find them token by token.
    let word = c.sources.text(target.file).get(target.range()).unwrap_or("");
    if c.program.models.iter().any(|m| c.program.names.get(m.name) == word && c.program.span(m.span) == target) {
        for (id, f) in c.sources.files() {
            if f.name.starts_with("<stdlib>") && id != target.file {
                continue;
            }
            let (toks, _) = crate::syntax::lexer::lex(id, &f.text);
            for (a, t, b) in toks {
                if matches!(t, crate::syntax::lexer::Tok::Ident(s) if s == word) {
                    out.push(Span::new(id, a, b));
                }
            }
        }
    }
    out.sort_by_key(|s| (s.file, s.start, s.end));
    out.dedup();
    out
}

/// One inlay hint: a label to show right after the byte `offset`.
#[derive(Clone, Debug, PartialEq)]
pub struct InlayHint {
    pub offset: usize,
    pub label: String,
    pub site: HintSite,
}

/// The inferred type after every `let`/`var` name and closure parameter written without one.
pub fn inlay_hints(c: &Checked, file: FileId) -> Vec<InlayHint> {
    let parsed = crate::syntax::parse(file, c.sources.text(file)).0;
    let layouts = inferred_layouts(c);
    let mut out = Vec::new();
    for (span, site) in hint_sites(&parsed) {
        let mut tys: Vec<String> = Vec::new();
        if let Some(t) = layouts.as_ref().and_then(|l| layout_at(c, l, span)) {
            tys.push(t);
        }
        for e in c.index.types.iter().filter(|e| e.0 == span) {
            let t = binding_type(&e.1);
            if tys.is_empty() && !t.contains("{error}") && !tys.iter().any(|x| x == t) {
                tys.push(t.to_string());
            }
        }
        if !tys.is_empty() {
            out.push(InlayHint { offset: span.end as usize, label: format!(": {}", tys.join(" | ")), site });
        }
    }
    out
}

/// The inferred types of the program's locals when it declares a mesh (`shard::inferred_locals`).
fn inferred_layouts(c: &Checked) -> Option<Vec<Vec<crate::types::Type>>> {
    if c.program.meshes.is_empty() || c.has_errors() {
        return None;
    }
    crate::shard::inferred_locals(&c.program)
}

/// The inferred type of the binding named at `span`, when sharding gives it a layout.
fn layout_at(c: &Checked, layouts: &[Vec<crate::types::Type>], span: Span) -> Option<String> {
    let (_, f, l) = c.index.locals.iter().find(|(s, _, _)| *s == span)?;
    let t = layouts.get(f.0 as usize)?.get(l.0 as usize)?;
    crate::shard::has_layout(t).then(|| crate::types::type_str(t, &c.program))
}

/// `f32[N]` from an index entry `x: f32[N]`.
pub fn binding_type(entry: &str) -> &str {
    match entry.split_once(": ") {
        Some((name, t)) if !name.contains(' ') && !name.contains('(') => t,
        _ => entry,
    }
}

#[cfg(test)]
mod tests;
