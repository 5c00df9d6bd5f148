//! Module loading: the root file, `use "./file.msl"` files and stdlib modules embedded in the
//! binary, with cycle and missing-file diagnostics. Produces modules in dependency order.

use super::Checker;
use crate::diag::{Code, Diagnostic};
use crate::source::{FileId, Span};
use crate::syntax::{self, ast};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;

include!(concat!(env!("OUT_DIR"), "/stdlib_files.rs"));

/// The source of a stdlib module (`nn`, `optim.adam`), if it exists.
pub fn stdlib_source(module: &str) -> Option<&'static str> {
    STDLIB_FILES.iter().find(|(m, _)| *m == module).map(|(_, s)| *s)
}

/// Every stdlib module path (for completion and suggestions).
pub fn stdlib_modules() -> impl Iterator<Item = &'static str> {
    STDLIB_FILES.iter().map(|(m, _)| *m)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ModuleId(pub u32);

/// Where a module's source came from; decides how its relative `use` paths resolve.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Origin {
    File(PathBuf),
    Stdlib(String),
    /// In-memory source (REPL, tests, LSP buffers); relative paths resolve from `dir`.
    Memory {
        name: String,
        dir: PathBuf,
    },
}

pub struct Module {
    pub name: String,
    pub file: FileId,
    pub origin: Origin,
    pub ast: Rc<ast::File>,
    /// The module each `use` item resolved to (by item index).
    pub uses: Vec<(usize, ModuleId)>,
    /// Submodules named in a `use m.{a, b}` list (`use optim.{adam}`): (item index, name, module).
    pub sub_uses: Vec<(usize, String, ModuleId)>,
    pub is_stdlib: bool,
}

impl Checker {
    /// Loads a module and, recursively, everything it uses. Returns `None` when loading failed
    /// (a diagnostic was reported at `at`).
    pub(super) fn load_module(&mut self, origin: Origin, text: String, name: String) -> ModuleId {
        let display = match &origin {
            Origin::File(p) => display_path(p),
            Origin::Stdlib(m) => format!("<stdlib>/{}.msl", m.replace('.', "/")),
            Origin::Memory { name, .. } => name.clone(),
        };
        let file = self.sources.add(display, text);
        let (tree, diags) = syntax::parse(file, self.sources.text(file));
        self.diags.extend(diags);
        let id = ModuleId(self.modules.len() as u32);
        let is_stdlib = matches!(origin, Origin::Stdlib(_));
        self.modules.push(Module {
            name,
            file,
            origin: origin.clone(),
            ast: Rc::new(tree),
            uses: Vec::new(),
            sub_uses: Vec::new(),
            is_stdlib,
        });
        self.module_index.insert(origin, id);
        self.loading.push(id);
        let ast = self.modules[id.0 as usize].ast.clone();
        let mut uses = Vec::new();
        let mut sub_uses = Vec::new();
        for (i, item) in ast.items.iter().enumerate() {
            if let ast::ItemKind::Use(target) = &item.kind {
                if let Some(m) = self.resolve_use(id, target, item.span) {
                    uses.push((i, m));
                }
                if let ast::UseTarget::Names(path, names) = target {
                    let base = path.iter().map(|p| p.name.as_str()).collect::<Vec<_>>().join(".");
                    for n in names {
                        let full = format!("{base}.{}", n.name);
                        if stdlib_source(&full).is_some() {
                            if let Some(sm) = self.load_stdlib(&full, n.span) {
                                sub_uses.push((i, n.name.clone(), sm));
                            }
                        }
                    }
                }
            }
        }
        self.modules[id.0 as usize].uses = uses;
        self.modules[id.0 as usize].sub_uses = sub_uses;
        self.loading.pop();
        self.order.push(id);
        id
    }

    fn resolve_use(&mut self, from: ModuleId, target: &ast::UseTarget, span: Span) -> Option<ModuleId> {
        match target {
            ast::UseTarget::File(path, pspan) => {
                let origin = self.modules[from.0 as usize].origin.clone();
                let stem = Path::new(path).file_stem().map(|s| s.to_string_lossy().into_owned());
                let name = stem.unwrap_or_else(|| path.clone());
                match &origin {
                    Origin::Stdlib(m) => {
                        // Relative files inside the stdlib are other stdlib modules.
                        let base: Vec<&str> = m.split('.').collect();
                        let mut parts: Vec<String> =
                            base[..base.len().saturating_sub(1)].iter().map(|s| s.to_string()).collect();
                        for c in Path::new(path).with_extension("").components() {
                            match c {
                                std::path::Component::ParentDir => {
                                    parts.pop();
                                }
                                std::path::Component::Normal(s) => parts.push(s.to_string_lossy().into_owned()),
                                _ => {}
                            }
                        }
                        self.load_stdlib(&parts.join("."), *pspan)
                    }
                    Origin::File(p) | Origin::Memory { dir: p, .. } => {
                        let dir = if matches!(origin, Origin::File(_)) {
                            p.parent().map(Path::to_path_buf).unwrap_or_default()
                        } else {
                            p.clone()
                        };
                        let full = dir.join(path);
                        let canon = match std::fs::canonicalize(&full) {
                            Ok(c) => c,
                            Err(_) => {
                                self.diags.push(
                                    Diagnostic::error(Code::E0204, *pspan, format!("cannot find file `{path}`"))
                                        .label(format!("no such file: {}", display_path(&full)))
                                        .with_help("paths in `use \"…\"` are relative to the file that uses them"),
                                );
                                return None;
                            }
                        };
                        let origin = Origin::File(canon.clone());
                        if let Some(&m) = self.module_index.get(&origin) {
                            if self.loading.contains(&m) {
                                self.cycle(m, *pspan);
                                return None;
                            }
                            return Some(m);
                        }
                        // Only regular files: reading `/dev/zero` or a FIFO would never end.
                        if !canon.is_file() {
                            self.diags.push(
                                Diagnostic::error(
                                    Code::E0204,
                                    *pspan,
                                    format!("cannot read `{}`: not a regular file", canon.display()),
                                )
                                .label("not a file"),
                            );
                            return None;
                        }
                        let bytes = match std::fs::read(&canon) {
                            Ok(b) => b,
                            Err(e) => {
                                self.diags.push(Diagnostic::error(
                                    Code::E0204,
                                    *pspan,
                                    format!("cannot read `{}`: {e}", canon.display()),
                                ));
                                return None;
                            }
                        };
                        let text = match String::from_utf8(bytes) {
                            Ok(t) => t,
                            Err(_) => {
                                self.diags.push(Diagnostic::error(
                                    Code::E0108,
                                    *pspan,
                                    format!("`{}` is not valid UTF-8", canon.display()),
                                ));
                                return None;
                            }
                        };
                        Some(self.load_module(origin, text, name))
                    }
                }
            }
            ast::UseTarget::Module(path) | ast::UseTarget::Names(path, _) => {
                let full: Vec<&str> = path.iter().map(|i| i.name.as_str()).collect();
                let joined = full.join(".");
                let pspan = path[0].span.to(path[path.len() - 1].span);
                if stdlib_source(&joined).is_some() {
                    return self.load_stdlib(&joined, pspan);
                }
                // `use nn.linear`: an item of module `nn`.
                if matches!(target, ast::UseTarget::Module(_)) && full.len() > 1 {
                    let parent = full[..full.len() - 1].join(".");
                    if stdlib_source(&parent).is_some() {
                        return self.load_stdlib(&parent, pspan);
                    }
                }
                let mut d = Diagnostic::error(Code::E0202, pspan, format!("unknown module `{joined}`"))
                    .label("not a stdlib module");
                let candidates: Vec<&str> = stdlib_modules().collect();
                if let Some(s) = super::suggest(&joined, candidates.iter().copied()) {
                    d = d.with_help(format!("did you mean `{s}`?"));
                } else {
                    d = d.with_help(format!(
                        "the stdlib modules are {}; a file is used as `use \"./file.msl\"`",
                        candidates.join(", ")
                    ));
                }
                self.diags.push(d);
                let _ = span;
                None
            }
        }
    }

    fn load_stdlib(&mut self, module: &str, span: Span) -> Option<ModuleId> {
        let origin = Origin::Stdlib(module.to_string());
        if let Some(&m) = self.module_index.get(&origin) {
            if self.loading.contains(&m) {
                self.cycle(m, span);
                return None;
            }
            return Some(m);
        }
        let text = stdlib_source(module)?.to_string();
        let short = module.rsplit('.').next().unwrap_or(module).to_string();
        Some(self.load_module(origin, text, short))
    }

    fn cycle(&mut self, m: ModuleId, span: Span) {
        let start = self.loading.iter().position(|&x| x == m).unwrap_or(0);
        let chain: Vec<String> = self.loading[start..]
            .iter()
            .chain(std::iter::once(&m))
            .map(|id| self.sources.name(self.modules[id.0 as usize].file).to_string())
            .collect();
        self.diags.push(
            Diagnostic::error(Code::E0203, span, format!("`use` cycle: {}", chain.join(" -> ")))
                .label("this `use` closes the cycle"),
        );
    }

    pub(super) fn module(&self, id: ModuleId) -> &Module {
        &self.modules[id.0 as usize]
    }
}

/// How a file is named in diagnostics: relative to the working directory when it lies below it
/// (as rustc does), so that messages do not depend on where the project is checked out.
fn display_path(p: &Path) -> String {
    let cwd = std::env::current_dir().ok().and_then(|d| std::fs::canonicalize(d).ok());
    let abs = std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    match cwd.as_ref().and_then(|d| abs.strip_prefix(d).ok()) {
        Some(rel) => rel.display().to_string(),
        None => p.display().to_string(),
    }
}

/// Map from module to the names it brings into scope, filled by item collection.
pub type Scope = HashMap<String, super::ItemRef>;
