//! Walks over the surface syntax for editor features: document symbols, the bindings that get
//! inlay hints, and the names in scope at a cursor.
//!
//! These work on a fresh parse of one file, so they also work on a file that does not check.

use crate::source::Span;
use crate::syntax::ast::{self, ExprKind, ItemKind, Pattern, StmtKind};

/// What kind of thing a symbol or a completion is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SymbolKind {
    Function,
    Model,
    Field,
    Dim,
    Const,
    Module,
    Mesh,
    Test,
    Variable,
    Parameter,
    Builtin,
    Keyword,
}

/// An item of a file, with its fields (for models).
#[derive(Clone, Debug)]
pub struct Symbol {
    pub name: String,
    pub kind: SymbolKind,
    /// The whole item.
    pub span: Span,
    /// The name.
    pub name_span: Span,
    /// A one-line description (the signature of a function, the type of a field).
    pub detail: Option<String>,
    pub children: Vec<Symbol>,
}

/// The items of a parsed file as symbols, in source order.
pub fn symbols(file: &ast::File, text: &str) -> Vec<Symbol> {
    let mut out = Vec::new();
    for item in &file.items {
        let sym = |name: &ast::Ident, kind, detail: Option<String>| Symbol {
            name: name.name.clone(),
            kind,
            span: item.span,
            name_span: name.span,
            detail,
            children: vec![],
        };
        match &item.kind {
            ItemKind::Fn(f) => out.push(sym(&f.name, SymbolKind::Function, Some(header(text, item.span, f.body.span)))),
            ItemKind::Model(m) => {
                let mut s = sym(&m.name, SymbolKind::Model, None);
                s.children = m
                    .fields
                    .iter()
                    .map(|fl| Symbol {
                        name: fl.name.name.clone(),
                        kind: SymbolKind::Field,
                        span: fl.name.span.to(fl.ty.span),
                        name_span: fl.name.span,
                        detail: slice(text, fl.ty.span).map(str::to_string),
                        children: vec![],
                    })
                    .collect();
                out.push(s);
            }
            ItemKind::Dim { name, value } => out.push(sym(
                name,
                SymbolKind::Dim,
                slice(text, value.span).map(|v| format!("dim {} = {v}", name.name)),
            )),
            ItemKind::Const { name, .. } => out.push(sym(name, SymbolKind::Const, None)),
            ItemKind::Mesh { name, .. } => out.push(sym(name, SymbolKind::Mesh, None)),
            ItemKind::Test { name, .. } => out.push(Symbol {
                name: format!("test \"{name}\""),
                kind: SymbolKind::Test,
                span: item.span,
                name_span: Span { end: item.span.start.saturating_add(4).min(item.span.end), ..item.span },
                detail: None,
                children: vec![],
            }),
            ItemKind::Use(_) | ItemKind::Error => {}
        }
    }
    out
}

/// The text of a function's header: from the start of the item to its body, annotations and
/// doc comments excluded (`fn linear[I, O](x: f32[I]) -> f32[O]`).
pub fn header(text: &str, item: Span, body: Span) -> String {
    let h = text.get(item.start as usize..body.start as usize).unwrap_or("");
    let h = match h.find("fn ").or_else(|| h.find("fn")) {
        Some(i) => &h[i..],
        None => h,
    };
    h.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn slice(text: &str, s: Span) -> Option<&str> {
    text.get(s.range())
}

/// One binding that an editor annotates with its inferred type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HintSite {
    Let,
    ClosureParam,
}

/// The name spans of every `let`/`var` binding written without a type, and of every closure
/// parameter written without a type, in source order.
pub fn hint_sites(file: &ast::File) -> Vec<(Span, HintSite)> {
    let mut out = Vec::new();
    for item in &file.items {
        match &item.kind {
            ItemKind::Fn(f) => {
                for p in &f.params {
                    if let Some(d) = &p.default {
                        hints_expr(d, &mut out);
                    }
                }
                hints_block(&f.body, &mut out);
            }
            ItemKind::Test { body, .. } => hints_block(body, &mut out),
            ItemKind::Model(m) => m.fields.iter().filter_map(|f| f.init.as_ref()).for_each(|e| hints_expr(e, &mut out)),
            ItemKind::Const { value, .. } => hints_expr(value, &mut out),
            _ => {}
        }
    }
    out
}

fn pattern_names<'a>(p: &'a Pattern, out: &mut Vec<&'a ast::Ident>) {
    match p {
        Pattern::Name(i) => out.push(i),
        Pattern::Wild(_) => {}
        Pattern::Tuple(ps, _) => ps.iter().for_each(|p| pattern_names(p, out)),
    }
}

fn hints_block(b: &ast::Block, out: &mut Vec<(Span, HintSite)>) {
    for s in &b.stmts {
        match &s.kind {
            StmtKind::Let { pat, ty, value } => {
                hints_expr(value, out);
                if ty.is_none() {
                    let mut names = Vec::new();
                    pattern_names(pat, &mut names);
                    out.extend(names.iter().map(|i| (i.span, HintSite::Let)));
                }
            }
            StmtKind::Var { name, ty, value } => {
                hints_expr(value, out);
                if ty.is_none() {
                    out.push((name.span, HintSite::Let));
                }
            }
            StmtKind::Assign { target, value, .. } => {
                hints_expr(target, out);
                hints_expr(value, out);
            }
            StmtKind::Return(Some(e)) | StmtKind::Expr(e) => hints_expr(e, out),
            StmtKind::Return(None) | StmtKind::Break | StmtKind::Continue | StmtKind::Error => {}
        }
    }
}

fn hints_expr(e: &ast::Expr, out: &mut Vec<(Span, HintSite)>) {
    for_children(e, &mut |c| match c {
        Child::Expr(e) => {
            if let ExprKind::Closure { params, .. } = &e.kind {
                out.extend(params.iter().filter(|p| p.ty.is_none()).map(|p| (p.name.span, HintSite::ClosureParam)));
            }
            hints_expr(e, out);
        }
        Child::Block(b) => hints_block(b, out),
    });
}

enum Child<'a> {
    Expr(&'a ast::Expr),
    Block(&'a ast::Block),
}

/// Calls `f` on the direct sub-expressions and sub-blocks of `e`.
fn for_children<'a>(e: &'a ast::Expr, f: &mut dyn FnMut(Child<'a>)) {
    match &e.kind {
        ExprKind::Int(_)
        | ExprKind::Float(_)
        | ExprKind::Bool(_)
        | ExprKind::Str(_)
        | ExprKind::Name(_)
        | ExprKind::Wild
        | ExprKind::Error => {}
        ExprKind::Tuple(es) | ExprKind::List(es) => es.iter().for_each(|e| f(Child::Expr(e))),
        ExprKind::Unary(_, a) | ExprKind::Field(a, _) | ExprKind::TupleIndex(a, _, _) | ExprKind::StackModel(a, _) => {
            f(Child::Expr(a))
        }
        ExprKind::Binary(_, a, b) => {
            f(Child::Expr(a));
            f(Child::Expr(b));
        }
        ExprKind::Call(c, args) => {
            f(Child::Expr(c));
            args.iter().for_each(|a| f(Child::Expr(&a.value)));
        }
        ExprKind::Index(a, idx) => {
            f(Child::Expr(a));
            for i in idx {
                match i {
                    ast::IndexArg::Expr(e) | ast::IndexArg::Named { value: e, .. } => f(Child::Expr(e)),
                    s @ ast::IndexArg::Slice { .. } => s.slice_parts().for_each(|e| f(Child::Expr(e))),
                }
            }
        }
        ExprKind::Closure { params, body } => {
            params.iter().filter_map(|p| p.default.as_ref()).for_each(|d| f(Child::Expr(d)));
            f(Child::Expr(body));
        }
        ExprKind::Block(b) => f(Child::Block(b)),
        ExprKind::If { cond, then, els } => {
            f(Child::Expr(cond));
            f(Child::Block(then));
            if let Some(e) = els {
                f(Child::Expr(e));
            }
        }
        ExprKind::For { iter, body, .. } => {
            match iter {
                ast::ForIter::Range(a, b) => {
                    f(Child::Expr(a));
                    f(Child::Expr(b));
                }
                ast::ForIter::Expr(a) => f(Child::Expr(a)),
            }
            f(Child::Block(body));
        }
        ExprKind::While { cond, body } => {
            f(Child::Expr(cond));
            f(Child::Block(body));
        }
    }
}

/// A name visible at a cursor: a local, a parameter or a generic dimension.
#[derive(Clone, Debug)]
pub struct ScopeName {
    pub name: String,
    pub kind: SymbolKind,
    /// Where it is bound (its type is the index entry at this span).
    pub span: Span,
}

/// The local names in scope at `offset`: generic dims, parameters, and the bindings of the
/// enclosing blocks that come before the cursor. Later bindings shadow earlier ones.
pub fn scope_at(file: &ast::File, offset: usize) -> Vec<ScopeName> {
    let mut out = Vec::new();
    let inside = |s: Span| (s.start as usize) <= offset && offset <= s.end as usize;
    for item in &file.items {
        if !inside(item.span) {
            continue;
        }
        match &item.kind {
            ItemKind::Fn(f) => {
                generics(&f.generics, &mut out);
                for p in &f.params {
                    out.push(ScopeName { name: p.name.name.clone(), kind: SymbolKind::Parameter, span: p.name.span });
                }
                scope_block(&f.body, offset, &mut out);
            }
            ItemKind::Test { body, .. } => scope_block(body, offset, &mut out),
            ItemKind::Model(m) => {
                generics(&m.generics, &mut out);
                for fl in m.fields.iter().filter_map(|f| f.init.as_ref()) {
                    scope_expr(fl, offset, &mut out);
                }
            }
            ItemKind::Const { value, .. } => scope_expr(value, offset, &mut out),
            _ => {}
        }
    }
    // Keep the innermost binding of each name.
    let mut seen = std::collections::HashSet::new();
    let mut kept: Vec<ScopeName> = out.into_iter().rev().filter(|n| seen.insert(n.name.clone())).collect();
    kept.reverse();
    kept
}

fn generics(gs: &[ast::Generic], out: &mut Vec<ScopeName>) {
    for g in gs {
        if let ast::Generic::Dim(i) = g {
            out.push(ScopeName { name: i.name.clone(), kind: SymbolKind::Dim, span: i.span });
        }
    }
}

fn scope_block(b: &ast::Block, offset: usize, out: &mut Vec<ScopeName>) {
    if !((b.span.start as usize) <= offset && offset <= b.span.end as usize) {
        return;
    }
    for s in &b.stmts {
        let ends_before = (s.span.end as usize) < offset;
        match &s.kind {
            StmtKind::Let { pat, value, .. } => {
                if ends_before {
                    let mut names = Vec::new();
                    pattern_names(pat, &mut names);
                    out.extend(names.iter().map(|i| ScopeName {
                        name: i.name.clone(),
                        kind: SymbolKind::Variable,
                        span: i.span,
                    }));
                } else {
                    scope_expr(value, offset, out);
                }
            }
            StmtKind::Var { name, value, .. } => {
                if ends_before {
                    out.push(ScopeName { name: name.name.clone(), kind: SymbolKind::Variable, span: name.span });
                } else {
                    scope_expr(value, offset, out);
                }
            }
            StmtKind::Assign { value, .. } => scope_expr(value, offset, out),
            StmtKind::Return(Some(e)) | StmtKind::Expr(e) => scope_expr(e, offset, out),
            StmtKind::Return(None) | StmtKind::Break | StmtKind::Continue | StmtKind::Error => {}
        }
    }
}

fn scope_expr(e: &ast::Expr, offset: usize, out: &mut Vec<ScopeName>) {
    if !((e.span.start as usize) <= offset && offset <= e.span.end as usize) {
        return;
    }
    match &e.kind {
        ExprKind::Closure { params, body } => {
            for p in params {
                out.push(ScopeName { name: p.name.name.clone(), kind: SymbolKind::Parameter, span: p.name.span });
            }
            scope_expr(body, offset, out);
        }
        ExprKind::For { pat, body, iter } => {
            if (body.span.start as usize) <= offset {
                let mut names = Vec::new();
                pattern_names(pat, &mut names);
                out.extend(names.iter().map(|i| ScopeName {
                    name: i.name.clone(),
                    kind: SymbolKind::Variable,
                    span: i.span,
                }));
                scope_block(body, offset, out);
            } else {
                match iter {
                    ast::ForIter::Range(a, b) => {
                        scope_expr(a, offset, out);
                        scope_expr(b, offset, out);
                    }
                    ast::ForIter::Expr(a) => scope_expr(a, offset, out),
                }
            }
        }
        _ => for_children(e, &mut |c| match c {
            Child::Expr(e) => scope_expr(e, offset, out),
            Child::Block(b) => scope_block(b, offset, out),
        }),
    }
}

/// What a `use` item brings into scope.
#[derive(Clone, Debug, PartialEq)]
pub enum Import {
    /// `use nn` / `use optim.adam` / `use "./layers.msl"`: a module under a short name.
    Module { alias: String, target: ModuleTarget, span: Span },
    /// `use nn.{linear, relu}` or `use nn.linear`: one item of a module.
    Item { name: String, target: ModuleTarget, span: Span },
}

/// Where a module's source comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ModuleTarget {
    /// A stdlib module path such as `optim.adam`.
    Stdlib(String),
    /// A file path as written, relative to the file that uses it.
    File(String),
}

/// The imports of a parsed file.
pub fn imports(file: &ast::File) -> Vec<Import> {
    let mut out = Vec::new();
    for item in &file.items {
        let ItemKind::Use(t) = &item.kind else {
            continue;
        };
        match t {
            ast::UseTarget::Module(path) if !path.is_empty() => {
                let joined = join(path);
                let last = &path[path.len() - 1];
                if crate::check::stdlib_source(&joined).is_some() || path.len() == 1 {
                    out.push(Import::Module {
                        alias: last.name.clone(),
                        target: ModuleTarget::Stdlib(joined),
                        span: last.span,
                    });
                } else {
                    out.push(Import::Item {
                        name: last.name.clone(),
                        target: ModuleTarget::Stdlib(join(&path[..path.len() - 1])),
                        span: last.span,
                    });
                }
            }
            ast::UseTarget::Names(path, names) => {
                for n in names {
                    out.push(Import::Item {
                        name: n.name.clone(),
                        target: ModuleTarget::Stdlib(join(path)),
                        span: n.span,
                    });
                }
            }
            ast::UseTarget::File(p, span) => {
                let alias = std::path::Path::new(p)
                    .file_stem()
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_else(|| p.clone());
                out.push(Import::Module { alias, target: ModuleTarget::File(p.clone()), span: *span });
            }
            ast::UseTarget::Module(_) => {}
        }
    }
    out
}

fn join(path: &[ast::Ident]) -> String {
    path.iter().map(|i| i.name.as_str()).collect::<Vec<_>>().join(".")
}
