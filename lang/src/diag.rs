//! Diagnostics: the one `Diagnostic` type every stage reports, its stable codes, and rendering.
//!
//! A diagnostic always carries a primary span; secondary labels and a help line are optional.
//! The CLI renders diagnostics with ariadne, `--message-format json` serialises them, and the
//! LSP converts the same values into editor positions.

use crate::source::{FileId, SourceMap, Span};
use std::fmt;

/// Stable diagnostic codes. The numbering groups codes by stage: `E01xx` syntax, `E02xx` names and
/// modules, `E03xx` types and shapes, `E04xx` differentiation, `E05xx` sharding, `E06xx` run-time errors (exit status 2).
/// `spec/errors.md` documents every code with a failing example.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Code {
    /// A character that starts no token.
    E0101,
    /// A string literal or block comment that never ends.
    E0102,
    /// A token the grammar does not allow here.
    E0103,
    /// The file ended in the middle of an item.
    E0104,
    /// An integer literal, or a dimension computed from literals, that does not fit in 64 bits;
    /// or a shape known at compile time with more elements than a tensor can hold.
    E0105,
    /// Brackets or expressions nested too deeply.
    E0106,
    /// An unknown escape sequence in a string literal.
    E0107,
    /// A source file that cannot be read or is not UTF-8.
    E0108,
    /// An unknown name.
    E0201,
    /// An unknown module in `use`.
    E0202,
    /// A cycle of `use` between files.
    E0203,
    /// A `use "./file.msl"` whose file does not exist.
    E0204,
    /// A name defined twice in one scope.
    E0205,
    /// An unknown field of a model or tuple.
    E0206,
    /// A name that the used module does not define.
    E0207,
    /// An unknown type name.
    E0208,
    /// An unknown dimension variable in a type.
    E0209,
    /// Assignment to a `let` binding or to a name that is not a variable.
    E0210,
    /// A missing `main` function in a program that is run.
    E0211,
    /// Unknown, missing or repeated named argument.
    E0212,
    /// A model that contains itself, directly or through other models (it would be infinite).
    E0213,
    /// An unknown annotation, one on an item it does not apply to, or one with bad arguments.
    E0214,
    /// Matrix product with inner dimensions that differ.
    E0301,
    /// Shapes that do not broadcast.
    E0302,
    /// Element types that differ (no implicit promotion).
    E0303,
    /// A value of the wrong kind of type (tensor, tuple, model, function).
    E0304,
    /// A tensor of the wrong rank.
    E0305,
    /// A dimension that differs from the one expected (annotation or argument).
    E0306,
    /// A generic dimension that cannot be inferred, or conflicting bindings.
    E0307,
    /// `reshape` to a shape with a different number of elements.
    E0308,
    /// An axis out of range for the rank of the tensor.
    E0309,
    /// `concat`/`stack` operands whose other dimensions differ.
    E0310,
    /// A malformed `einsum` specification or operands that do not fit it.
    E0311,
    /// A call with the wrong number of arguments.
    E0312,
    /// A call of something that is not a function.
    E0313,
    /// A condition that is not a `bool` scalar.
    E0314,
    /// `if` branches whose types differ.
    E0315,
    /// A function body or `return` whose type differs from the declared result.
    E0316,
    /// A dimension division that is not exact.
    E0317,
    /// An operator applied to an element type it does not support.
    E0318,
    /// A tuple pattern whose arity differs from the value.
    E0319,
    /// A bad index or slice.
    E0320,
    /// Model arithmetic on models of different types, or on a non-model.
    E0321,
    /// A literal that does not fit the type its context needs.
    E0322,
    /// An argument that must be known at compile time (a dimension, an axis, a string).
    E0323,
    /// A recursive function (not supported: shapes must be finite).
    E0324,
    /// Something that the checker cannot type for another reason.
    E0325,
    /// `break` or `continue` outside a loop.
    E0326,
    /// `break` or `continue` where a value is needed.
    E0327,
    /// A convolution or pooling window that does not fit its (padded) input, or a stride,
    /// padding or window size out of range.
    E0328,
    /// `grad` of a function whose result is not a float scalar.
    E0401,
    /// `grad` with respect to an integer or boolean parameter.
    E0402,
    /// Differentiating through a non-differentiable builtin.
    E0403,
    /// A bad `vmap`/`jvp`/`vjp` argument.
    E0404,
    /// An unknown mesh axis in a sharding annotation.
    E0501,
    /// A malformed mesh declaration or sharding annotation.
    E0502,
    /// A static dim that does not split evenly over its mesh axes.
    E0503,
    /// A mesh axis that splits two dims of one tensor.
    E0504,
    /// A `@pipeline` function that cannot be cut into stages, or a schedule that cannot be built.
    E0505,
    /// Run time: a file that is missing, corrupt, or does not match its annotation.
    E0601,
    /// Run time: an index out of range or a shape that does not fit.
    E0602,
    /// Run time: integer division by zero or another arithmetic failure.
    E0603,
    /// Run time: a failed `assert` or `assert_close`.
    E0604,
    /// Run time: any other failure (an interrupted run, an unsupported operation).
    E0605,
    /// Run time: `--nan-check` found a NaN or an infinity in a primitive's result.
    E0606,
    /// Warning: the sharding pass inserted a redistribution that no annotation asked for.
    W0510,
}

impl Code {
    pub fn as_str(self) -> String {
        format!("{self:?}")
    }
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self:?}")
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Severity {
    Error,
    Warning,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Label {
    pub span: Span,
    pub message: String,
}

/// One user-facing diagnostic.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Diagnostic {
    pub code: Code,
    pub severity: Severity,
    pub message: String,
    pub primary: Label,
    pub secondary: Vec<Label>,
    pub help: Option<String>,
}

impl Diagnostic {
    pub fn error(code: Code, span: Span, message: impl Into<String>) -> Diagnostic {
        Diagnostic {
            code,
            severity: Severity::Error,
            message: message.into(),
            primary: Label { span, message: String::new() },
            secondary: Vec::new(),
            help: None,
        }
    }

    pub fn warning(code: Code, span: Span, message: impl Into<String>) -> Diagnostic {
        Diagnostic { severity: Severity::Warning, ..Diagnostic::error(code, span, message) }
    }

    /// Sets the text shown under the primary span.
    pub fn label(mut self, message: impl Into<String>) -> Diagnostic {
        self.primary.message = message.into();
        self
    }

    pub fn with_secondary(mut self, span: Span, message: impl Into<String>) -> Diagnostic {
        self.secondary.push(Label { span, message: message.into() });
        self
    }

    pub fn with_help(mut self, help: impl Into<String>) -> Diagnostic {
        self.help = Some(help.into());
        self
    }

    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }
}

/// Renders diagnostics for a terminal with ariadne. `color` is false in tests and when piped.
pub fn render(diags: &[Diagnostic], sources: &SourceMap, color: bool) -> String {
    use ariadne::{Config, IndexType, Label as ALabel, Report, ReportKind};
    let mut out = Vec::new();
    if diags.is_empty() {
        return String::new();
    }
    let file = |id: FileId| sources.name(id).to_string();
    // One cache for all reports. Building it copies and indexes each file, which for a file of
    // ten megabytes costs more than rendering thousands of reports, so it holds only the files
    // that a label points into (not every stdlib module the program uses).
    let mut used: Vec<FileId> =
        diags.iter().flat_map(|d| std::iter::once(&d.primary).chain(&d.secondary)).map(|l| l.span.file).collect();
    used.sort();
    used.dedup();
    let mut cache = ariadne::sources(
        sources
            .files()
            .filter(|(id, _)| used.binary_search(id).is_ok())
            .map(|(id, f)| (file(id), f.text.clone()))
            .collect::<Vec<_>>(),
    );
    for d in diags {
        // ariadne prints every line a label touches in full: on a line longer than
        // `MAX_RENDER_LINE` (generated or minified code, garbage) use the one-line form instead.
        let labels = std::iter::once(&d.primary).chain(&d.secondary);
        let long = |o: u32, f: FileId| sources.line_range(f, o).len() > MAX_RENDER_LINE;
        if labels.into_iter().any(|l| long(l.span.start, l.span.file) || long(l.span.end, l.span.file)) {
            out.extend_from_slice(render_short(std::slice::from_ref(d), sources).as_bytes());
            if let Some(h) = &d.help {
                out.extend_from_slice(format!("  help: {h}\n").as_bytes());
            }
            continue;
        }
        let kind = match d.severity {
            Severity::Error => ReportKind::Error,
            Severity::Warning => ReportKind::Warning,
        };
        let p = &d.primary;
        let mut report = Report::build(kind, (file(p.span.file), safe_range(sources, &p.span)))
            .with_config(Config::default().with_color(color).with_index_type(IndexType::Byte))
            .with_code(d.code)
            .with_message(&d.message);
        let mut primary = ALabel::new((file(p.span.file), safe_range(sources, &p.span)));
        if !p.message.is_empty() {
            primary = primary.with_message(&p.message);
        }
        report = report.with_label(primary);
        for s in &d.secondary {
            report = report
                .with_label(ALabel::new((file(s.span.file), safe_range(sources, &s.span))).with_message(&s.message));
        }
        if let Some(h) = &d.help {
            report = report.with_help(h);
        }
        // Writing into a Vec cannot fail; a rendering error would only drop this report.
        let _ = report.finish().write(&mut cache, &mut out);
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Longest source line (in bytes) that `render` shows with ariadne.
const MAX_RENDER_LINE: usize = 2000;

/// A span's byte range clamped to its file and widened to character boundaries: ariadne slices
/// the text with it and panics on a range that splits a character or runs past the end.
fn safe_range(sources: &SourceMap, span: &Span) -> std::ops::Range<usize> {
    let text = sources.text(span.file);
    let mut start = (span.start as usize).min(text.len());
    let mut end = (span.end as usize).clamp(start, text.len());
    while !text.is_char_boundary(start) {
        start -= 1;
    }
    while !text.is_char_boundary(end) {
        end += 1;
    }
    start..end
}

/// One line per diagnostic: `file:line:col: error[E0301]: message`. Stable, used by spec tests.
pub fn render_short(diags: &[Diagnostic], sources: &SourceMap) -> String {
    let mut out = String::new();
    for d in diags {
        let (line, col) = sources.line_col(d.primary.span.file, d.primary.span.start);
        let sev = match d.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
        };
        out.push_str(&format!(
            "{}:{}:{}: {}[{}]: {}\n",
            sources.name(d.primary.span.file),
            line,
            col,
            sev,
            d.code,
            d.message
        ));
    }
    out
}

/// The JSON form of `--message-format json`: one object per diagnostic, positions 1-based,
/// columns counted in characters.
pub fn to_json(d: &Diagnostic, sources: &SourceMap) -> serde_json::Value {
    let pos = |s: &Span| {
        let (l, c) = sources.line_col(s.file, s.start);
        let (el, ec) = sources.line_col(s.file, s.end);
        (l, c, el, ec)
    };
    let (line, column, end_line, end_column) = pos(&d.primary.span);
    let labels: Vec<_> = std::iter::once((&d.primary, true))
        .chain(d.secondary.iter().map(|l| (l, false)))
        .map(|(l, primary)| {
            let (line, column, end_line, end_column) = pos(&l.span);
            serde_json::json!({
                "file": sources.name(l.span.file),
                "line": line, "column": column, "end_line": end_line, "end_column": end_column,
                "byte_start": l.span.start, "byte_end": l.span.end,
                "message": l.message, "primary": primary,
            })
        })
        .collect();
    serde_json::json!({
        "code": d.code.as_str(),
        "severity": match d.severity { Severity::Error => "error", Severity::Warning => "warning" },
        "message": d.message,
        "file": sources.name(d.primary.span.file),
        "line": line, "column": column, "end_line": end_line, "end_column": end_column,
        "labels": labels,
        "help": d.help,
    })
}
