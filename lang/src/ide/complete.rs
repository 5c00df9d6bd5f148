//! Completion (names in scope, model fields after `.`, module members after `nn.`, keywords)
//! and signature help (the parameters of the call around the cursor).

use super::syntax::{imports, scope_at, symbols, Import, ModuleTarget, SymbolKind};
use super::{binding_type, builtin_info, module_file, Checked};
use crate::source::{FileId, Span};
use crate::syntax::lexer::{self, Tok};

/// One completion candidate.
#[derive(Clone, Debug, PartialEq)]
pub struct Completion {
    pub label: String,
    pub kind: SymbolKind,
    /// Its type or signature.
    pub detail: Option<String>,
    pub doc: Option<String>,
}

impl Completion {
    fn new(label: impl Into<String>, kind: SymbolKind, detail: Option<String>, doc: Option<String>) -> Completion {
        Completion { label: label.into(), kind, detail, doc }
    }
}

/// The keywords of msl, offered everywhere.
pub const KEYWORDS: &[&str] = &[
    "fn", "let", "var", "model", "dim", "const", "use", "mesh", "test", "if", "else", "for", "in", "while", "return",
    "break", "continue", "true", "false",
];

/// Candidates at `offset` of `file`. After `name.` these are the fields of a model value or the
/// members of a module; elsewhere the names in scope, items, imports, builtins and keywords.
/// Names starting with `__` (synthesised by the REPL) are left out. The caller filters by the
/// word being typed.
pub fn completions(c: &Checked, file: FileId, offset: usize) -> Vec<Completion> {
    let text = c.sources.text(file);
    let offset = offset.min(text.len());
    let Some(prefix) = text.get(..offset) else {
        return vec![];
    };
    let before = prefix.trim_end_matches(|ch: char| ch.is_ascii_alphanumeric() || ch == '_');
    let parsed = crate::syntax::parse(file, text).0;
    let mut out = if let Some(recv) = before.strip_suffix('.') {
        member_completions(c, file, &parsed, recv, before.len() - 1)
    } else {
        scope_completions(c, file, &parsed, offset)
    };
    out.retain(|x| !x.label.starts_with("__"));
    let mut seen = std::collections::HashSet::new();
    out.retain(|x| seen.insert(x.label.clone()));
    out
}

fn scope_completions(c: &Checked, file: FileId, parsed: &crate::syntax::ast::File, offset: usize) -> Vec<Completion> {
    let mut out = Vec::new();
    for n in scope_at(parsed, offset).into_iter().rev() {
        let detail = c.index.types.iter().find(|e| e.0 == n.span).map(|e| binding_type(&e.1).to_string());
        out.push(Completion::new(n.name, n.kind, detail, None));
    }
    let text = c.sources.text(file);
    for s in symbols(parsed, text) {
        if s.kind == SymbolKind::Test {
            continue;
        }
        let doc = crate::syntax::lexer::doc_comment_before(text, s.span.start as usize);
        out.push(Completion::new(s.name, s.kind, s.detail, doc));
    }
    for imp in imports(parsed) {
        match imp {
            Import::Module { alias, target, .. } => {
                let d = match &target {
                    ModuleTarget::Stdlib(m) => format!("module {m}"),
                    ModuleTarget::File(p) => format!("module \"{p}\""),
                };
                out.push(Completion::new(alias, SymbolKind::Module, Some(d), None));
            }
            Import::Item { name, target, .. } => {
                let member = module_members(c, &target).into_iter().find(|m| m.label == name);
                out.push(member.unwrap_or_else(|| Completion::new(name, SymbolKind::Function, None, None)));
            }
        }
    }
    for b in crate::ir::Prim::builtin_names() {
        let (sig, doc) = builtin_info(b).unwrap_or((b, ""));
        out.push(Completion::new(*b, SymbolKind::Builtin, Some(sig.to_string()), Some(doc.to_string())));
    }
    for k in KEYWORDS {
        out.push(Completion::new(*k, SymbolKind::Keyword, None, None));
    }
    out
}

/// Completions after `recv.` where the dot is at byte `dot`.
fn member_completions(
    c: &Checked,
    file: FileId,
    parsed: &crate::syntax::ast::File,
    recv: &str,
    dot: usize,
) -> Vec<Completion> {
    let chain_start = recv
        .char_indices()
        .rev()
        .take_while(|(_, ch)| ch.is_ascii_alphanumeric() || *ch == '_' || *ch == '.')
        .last()
        .map_or(recv.len(), |(i, _)| i);
    let chain: Vec<&str> = recv[chain_start..].split('.').collect();
    if chain.iter().any(|s| s.is_empty()) {
        return vec![];
    }
    // A module alias, unless a local of the same name hides it.
    let local = scope_at(parsed, dot).iter().any(|n| n.name == chain[0]);
    if !local {
        for imp in imports(parsed) {
            if let Import::Module { alias, target, .. } = imp {
                if alias == chain[0] {
                    let target = match target {
                        ModuleTarget::Stdlib(m) if chain.len() > 1 => {
                            ModuleTarget::Stdlib(format!("{m}.{}", chain[1..].join(".")))
                        }
                        t => t,
                    };
                    return module_members(c, &target);
                }
            }
        }
    }
    // A value: its type is the index entry of the name right before the dot, or failing that the
    // nearest earlier occurrence of the same name.
    let last = chain[chain.len() - 1];
    let text = c.sources.text(file);
    let exact = c.index.types.iter().find(|e| e.0.file == file && e.0.end as usize == dot);
    let near = || {
        c.index
            .types
            .iter()
            .filter(|e| e.0.file == file && (e.0.end as usize) <= dot && text.get(e.0.range()) == Some(last))
            .max_by_key(|e| e.0.start)
    };
    let Some(entry) = exact.or_else(near) else {
        return vec![];
    };
    model_fields(c, binding_type(&entry.1))
}

/// The fields of the model named by a type string such as `Mlp[64, 128, 10]`.
pub fn model_fields(c: &Checked, ty: &str) -> Vec<Completion> {
    let name = ty.split('[').next().unwrap_or(ty).trim();
    let p = &c.program;
    let Some(m) = p.models.iter().find(|m| p.names.get(m.name) == name) else {
        return vec![];
    };
    m.fields
        .iter()
        .map(|f| Completion::new(p.names.get(f.name), SymbolKind::Field, Some(crate::types::type_str(&f.ty, p)), None))
        .collect()
}

/// The items of a module (and its submodules, for the stdlib), from its source.
pub fn module_members(c: &Checked, target: &ModuleTarget) -> Vec<Completion> {
    let (file, text): (FileId, String) = match (module_file(c, target), target) {
        (Some(f), _) => (f, c.sources.text(f).to_string()),
        (None, ModuleTarget::Stdlib(m)) => match crate::check::stdlib_source(m) {
            Some(s) => (FileId(u32::MAX), s.to_string()),
            None => (FileId(u32::MAX), String::new()),
        },
        (None, ModuleTarget::File(_)) => return vec![],
    };
    let parsed = crate::syntax::parse(file, &text).0;
    let mut out: Vec<Completion> = symbols(&parsed, &text)
        .into_iter()
        .filter(|s| s.kind != SymbolKind::Test)
        .map(|s| {
            let doc = crate::syntax::lexer::doc_comment_before(&text, s.span.start as usize);
            Completion::new(s.name, s.kind, s.detail, doc)
        })
        .collect();
    if let ModuleTarget::Stdlib(m) = target {
        let prefix = format!("{m}.");
        for sub in crate::check::stdlib_modules() {
            if let Some(rest) = sub.strip_prefix(&prefix) {
                let first = rest.split('.').next().unwrap_or(rest);
                out.push(Completion::new(first, SymbolKind::Module, Some(format!("module {m}.{first}")), None));
            }
        }
    }
    out
}

/// The signature of the call around the cursor, with the parameter being written.
#[derive(Clone, Debug, PartialEq)]
pub struct SignatureHelp {
    /// `fn linear[I, O, ..S](x: f32[..S, I], w: f32[I, O], b: f32[O]) -> f32[..S, O]`.
    pub label: String,
    /// Byte ranges of the parameters in `label`.
    pub params: Vec<(usize, usize)>,
    /// The index of the parameter at the cursor.
    pub active: usize,
    pub doc: Option<String>,
}

/// Signature help for the innermost call whose `(` is open at `offset`.
pub fn signature_help(c: &Checked, file: FileId, offset: usize) -> Option<SignatureHelp> {
    let text = c.sources.text(file);
    let prefix = text.get(..offset.min(text.len()))?;
    let (toks, _) = lexer::lex(file, prefix);
    // Open brackets: (token index, is a paren, commas so far, token index after the last comma).
    let mut stack: Vec<(usize, bool, usize, usize)> = Vec::new();
    for (i, (_, t, _)) in toks.iter().enumerate() {
        match t {
            Tok::LParen => stack.push((i, true, 0, i + 1)),
            Tok::LBracket | Tok::LBrace => stack.push((i, false, 0, i + 1)),
            Tok::RParen | Tok::RBracket | Tok::RBrace => {
                stack.pop();
            }
            Tok::Comma => {
                if let Some(top) = stack.last_mut() {
                    top.2 += 1;
                    top.3 = i + 1;
                }
            }
            _ => {}
        }
    }
    let &(open, _, commas, arg_start) = stack.iter().rev().find(|f| f.1)?;
    // The callee: `name(` or `module.name(`.
    let (cs, Tok::Ident(name), ce) = toks.get(open.checked_sub(1)?)? else {
        return None;
    };
    let callee = Span::new(file, *cs, *ce);
    let mut chain = vec![name.to_string()];
    let mut k = open - 1;
    while k >= 2 && matches!(toks[k - 1].1, Tok::Dot) {
        if let Tok::Ident(m) = &toks[k - 2].1 {
            chain.insert(0, m.to_string());
            k -= 2;
        } else {
            break;
        }
    }
    let (label, doc) = callee_signature(c, file, callee, &chain)?;
    let params = param_ranges(&label);
    // A named argument (`seed: 7`) selects its parameter by name.
    let named = match (toks.get(arg_start), toks.get(arg_start + 1)) {
        (Some((_, Tok::Ident(n), _)), Some((_, Tok::Colon, _))) => Some(n.to_string()),
        _ => None,
    };
    let mut active = commas;
    if let Some(n) = named {
        if let Some(i) = params.iter().position(|&(a, b)| {
            let p = &label[a..b];
            p.split(':').next().unwrap_or(p).trim() == n
        }) {
            active = i;
        }
    }
    let active = active.min(params.len().saturating_sub(1));
    Some(SignatureHelp { label, params, active, doc })
}

fn callee_signature(c: &Checked, file: FileId, callee: Span, chain: &[String]) -> Option<(String, Option<String>)> {
    let name = chain.last()?;
    let doc_of =
        |def: Option<Span>| def.and_then(|d| c.fn_sigs.iter().find(|f| f.span == d)).and_then(|f| f.doc.clone());
    if let Some((_, s, def)) = c.index.types.iter().find(|e| e.0 == callee) {
        if s.starts_with("fn ") {
            return Some((s.clone(), doc_of(*def)));
        }
    }
    if chain.len() == 1 {
        if let Some((sig, doc)) = builtin_info(name) {
            return Some((sig.to_string(), Some(doc.to_string())));
        }
    }
    // A module member: its header as written.
    let parsed = crate::syntax::parse(file, c.sources.text(file)).0;
    let targets: Vec<ModuleTarget> = imports(&parsed)
        .into_iter()
        .filter_map(|i| match i {
            Import::Module { alias, target, .. } if chain.len() > 1 && alias == chain[0] => Some(match target {
                ModuleTarget::Stdlib(m) if chain.len() > 2 => {
                    ModuleTarget::Stdlib(format!("{m}.{}", chain[1..chain.len() - 1].join(".")))
                }
                t => t,
            }),
            Import::Item { name: n, target, .. } if chain.len() == 1 && &n == name => Some(target),
            _ => None,
        })
        .collect();
    for t in &targets {
        if let Some(m) = super::complete::module_members(c, t)
            .into_iter()
            .find(|m| &m.label == name && m.kind == SymbolKind::Function)
        {
            return Some((m.detail.unwrap_or_default(), m.doc));
        }
    }
    // Any function of that name that the checker knows.
    let sig = c
        .fn_sigs
        .iter()
        .find(|f| &f.name == name && f.span.file == file)
        .or_else(|| c.fn_sigs.iter().find(|f| &f.name == name))?;
    Some((super::fn_signature(c, sig), sig.doc.clone()))
}

/// Byte ranges of the parameters of a signature label: the comma-separated entries of its first
/// top-level `(…)` (generic `[…]` lists are skipped).
pub fn param_ranges(label: &str) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut start = None;
    for (i, ch) in label.char_indices() {
        match ch {
            '(' if depth == 0 && start.is_none() => {
                start = Some(i + 1);
                depth = 1;
                continue;
            }
            '(' | '[' => depth += 1,
            ')' | ']' => {
                depth -= 1;
                if depth == 0 {
                    if let Some(s) = start {
                        push_trimmed(label, s, i, &mut out);
                        return out;
                    }
                }
            }
            ',' if depth == 1 => {
                if let Some(s) = start {
                    push_trimmed(label, s, i, &mut out);
                    start = Some(i + 1);
                }
            }
            _ => {}
        }
    }
    out
}

fn push_trimmed(label: &str, a: usize, b: usize, out: &mut Vec<(usize, usize)>) {
    let s = &label[a..b];
    let lead = s.len() - s.trim_start().len();
    let trail = s.len() - s.trim_end().len();
    if a + lead < b - trail {
        out.push((a + lead, b - trail));
    }
}
