//! Conversions between `lang`'s byte spans and diagnostics and the LSP's UTF-16 positions and URIs.
//!
//! The root document is always file 0 of a check; other files are `use`d files (named by path)
//! or stdlib modules (named `<stdlib>/nn.msl`), which are written to a private cache folder on
//! demand (see `cache`) so that "go to definition" can open them.

use lang::check::Checked;
use lang::diag::{Diagnostic, Severity};
use lang::source::{FileId, SourceMap, Span};
use std::path::{Path, PathBuf};
use tower_lsp_server::ls_types as lsp;
use tower_lsp_server::ls_types::Uri;

/// The document a request is about is the root of its check.
pub const ROOT: FileId = FileId(0);

pub fn range(c: &Checked, s: Span) -> lsp::Range {
    let (l1, c1) = c.sources.line_utf16(s.file, s.start);
    let (l2, c2) = c.sources.line_utf16(s.file, s.end);
    lsp::Range::new(lsp::Position::new(l1, c1), lsp::Position::new(l2, c2))
}

pub fn position(c: &Checked, file: FileId, offset: usize) -> lsp::Position {
    let (l, col) = c.sources.line_utf16(file, offset as u32);
    lsp::Position::new(l, col)
}

/// The byte offset of an LSP position in the root document.
pub fn offset(c: &Checked, p: lsp::Position) -> usize {
    c.sources.offset_of_utf16(ROOT, p.line, p.character)
}

/// The byte offset of an LSP position in a text that has not been checked.
pub fn offset_in(text: &str, p: lsp::Position) -> usize {
    let mut sm = SourceMap::new();
    let f = sm.add("", text);
    sm.offset_of_utf16(f, p.line, p.character)
}

/// The path of a source file of a check: the document itself, a used file, or a stdlib module
/// written to the private cache folder (on first use; `None` when it cannot be written there).
pub fn path_of(c: &Checked, file: FileId) -> Option<PathBuf> {
    let name = c.sources.name(file);
    if let Some(rel) = name.strip_prefix("<stdlib>/") {
        return crate::cache::write_private(crate::cache::stdlib_dir()?, rel, c.sources.text(file)).ok();
    }
    let p = Path::new(name);
    Some(if p.is_absolute() { p.to_path_buf() } else { std::env::current_dir().ok()?.join(p) })
}

/// True for stdlib modules, whose diagnostics are never shown.
pub fn is_stdlib(c: &Checked, file: FileId) -> bool {
    c.sources.name(file).starts_with("<stdlib>/")
}

pub fn uri_of(c: &Checked, file: FileId, root: &Uri) -> Option<Uri> {
    if file == ROOT {
        return Some(root.clone());
    }
    Uri::from_file_path(path_of(c, file)?)
}

pub fn location(c: &Checked, s: Span, root: &Uri) -> Option<lsp::Location> {
    Some(lsp::Location::new(uri_of(c, s.file, root)?, range(c, s)))
}

/// The LSP form of a diagnostic: the message with its primary label and help, the code, and
/// secondary labels as related information.
pub fn diagnostic(c: &Checked, d: &Diagnostic, root: &Uri) -> lsp::Diagnostic {
    let mut message = d.message.clone();
    if !d.primary.message.is_empty() {
        message.push_str(&format!("\n{}", d.primary.message));
    }
    if let Some(h) = &d.help {
        message.push_str(&format!("\nhelp: {h}"));
    }
    let related: Vec<lsp::DiagnosticRelatedInformation> = d
        .secondary
        .iter()
        .filter_map(|l| {
            Some(lsp::DiagnosticRelatedInformation {
                location: location(c, l.span, root)?,
                message: if l.message.is_empty() { "related".to_string() } else { l.message.clone() },
            })
        })
        .collect();
    lsp::Diagnostic {
        range: range(c, d.primary.span),
        severity: Some(match d.severity {
            Severity::Error => lsp::DiagnosticSeverity::ERROR,
            Severity::Warning => lsp::DiagnosticSeverity::WARNING,
        }),
        code: Some(lsp::NumberOrString::String(d.code.as_str())),
        source: Some("msl".to_string()),
        message,
        related_information: (!related.is_empty()).then_some(related),
        ..Default::default()
    }
}

/// The diagnostics of a check grouped by file: the root document first (possibly empty), then
/// every used user file with problems. Stdlib files are left out.
pub fn diagnostics_by_file(c: &Checked, root: &Uri) -> Vec<(Uri, Vec<lsp::Diagnostic>)> {
    let mut groups: Vec<(FileId, Vec<lsp::Diagnostic>)> = vec![(ROOT, vec![])];
    for d in &c.diagnostics {
        let f = d.primary.span.file;
        if is_stdlib(c, f) {
            continue;
        }
        let ld = diagnostic(c, d, root);
        match groups.iter_mut().find(|(g, _)| *g == f) {
            Some((_, v)) => v.push(ld),
            None => groups.push((f, vec![ld])),
        }
    }
    groups.into_iter().filter_map(|(f, v)| Some((uri_of(c, f, root)?, v))).collect()
}
