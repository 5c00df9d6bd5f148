//! The checker: name resolution, element types, symbolic shapes and lowering to the typed IR.
//!
//! It never stops at the first error: every problem becomes a diagnostic, the offending
//! expression gets `Type::Error` (which matches everything), and checking goes on.

mod builtins;
mod call;
pub(crate) mod copies;
mod expr;
mod items;
pub mod modules;
mod pipeline;
mod resolve;
mod stacks;

use crate::diag::{Code, Diagnostic};
use crate::ir::{self, Program};
use crate::source::{SourceMap, Span};
use crate::syntax::ast;
use crate::types::{Dim, FuncId, ModelId, Names, RestSym, Sym, TyVar, Type};
use modules::{Module, ModuleId, Origin};
use std::collections::HashMap;
use std::path::Path;
use std::rc::Rc;

pub use modules::{stdlib_modules, stdlib_source};

/// What a name at module level refers to.
#[derive(Clone, Debug, PartialEq)]
pub enum ItemRef {
    Func(FuncId),
    Model(ModelId),
    Dim(Dim),
    Const(ir::ConstId),
    Module(ModuleId),
    Mesh(usize),
    /// A builtin primitive that a stdlib module re-exports (`nn.relu` is the builtin `relu`),
    /// so that each operation has one definition.
    Builtin(crate::ir::Prim),
}

/// A function's checked signature.
#[derive(Clone, Debug)]
pub struct FnSig {
    pub name: String,
    pub module: ModuleId,
    pub dims: Vec<Sym>,
    pub rests: Vec<RestSym>,
    pub models: Vec<TyVar>,
    pub params: Vec<ParamSig>,
    pub ret: Type,
    pub span: Span,
    pub doc: Option<String>,
    /// The declaration, for checking the body; `None` for functions the checker synthesises.
    pub decl: Option<Rc<ast::FnDecl>>,
    /// Names of generic dims by source name, for the body.
    pub dim_names: Vec<(String, Sym)>,
    pub rest_names: Vec<(String, RestSym)>,
    pub model_names: Vec<(String, TyVar)>,
    pub annotations: Vec<String>,
}

#[derive(Clone, Debug)]
pub struct ParamSig {
    pub name: String,
    pub ty: Type,
    pub default: Option<ast::Expr>,
    pub span: Span,
}

#[derive(Clone, Debug)]
pub struct ModelSig {
    pub name: String,
    pub module: ModuleId,
    pub dims: Vec<Sym>,
    pub models: Vec<TyVar>,
    /// Generic parameter kinds in declaration order: `true` for model parameters.
    pub generic_is_model: Vec<bool>,
    pub fields: Vec<(String, Type, Span)>,
    pub span: Span,
    pub doc: Option<String>,
    pub decl: Rc<ast::ModelDecl>,
}

/// A closure as written, with the scope it was created in; checked at each application.
#[derive(Clone)]
pub struct ClosureDef {
    pub ast: Rc<ast::Expr>,
    pub cx: expr::FnCx,
    pub instances: Vec<(String, FuncId, Type)>,
}

/// Information kept for editor features: the type of every name occurrence and definitions.
#[derive(Clone, Debug, Default)]
pub struct Index {
    /// (span of an identifier use or binding, type rendered, definition span if known).
    pub types: Vec<(Span, String, Option<Span>)>,
    /// Item definitions: (name, kind, span of the name, doc).
    pub items: Vec<(String, &'static str, Span, Option<String>)>,
    /// The local each binding's name defines (the editor shows its inferred layout).
    pub locals: Vec<(Span, crate::types::FuncId, crate::ir::Local)>,
}

pub struct Checker {
    /// The module of the file checked (whose `const`s `--const` sets).
    root: Option<ModuleId>,
    pub sources: SourceMap,
    pub diags: Vec<Diagnostic>,
    pub prog: Program,
    modules: Vec<Module>,
    module_index: HashMap<Origin, ModuleId>,
    /// Modules whose loading is in progress (for cycle detection).
    loading: Vec<ModuleId>,
    /// Modules in dependency order (a module after everything it uses).
    order: Vec<ModuleId>,
    scopes: Vec<modules::Scope>,
    pub fn_sigs: Vec<FnSig>,
    pub model_sigs: Vec<ModelSig>,
    closures: Vec<ClosureDef>,
    pub index: Index,
    /// Functions whose bodies are being checked (for recursion detection).
    checking: Vec<FuncId>,
    body_done: Vec<bool>,
    /// Candidates that "did you mean" hints may still compare in this run (see `suggest_budgeted`).
    suggest_budget: usize,
    /// Names a failed `use` would have brought into a module (module index, name): their uses
    /// are not reported again as unknown.
    unresolved: std::collections::HashSet<(u32, String)>,
    /// Spans of expressions reported as too large for a tensor (see `check_static_size`).
    oversized: Vec<Span>,
    /// The stack model of each model stacked (`[Block[D]; L]`), and those whose fields are
    /// derived once the module's models are declared (see `stacks.rs`).
    stacks: HashMap<(ModelId, Option<crate::types::AxisId>), ModelId>,
    pending_stacks: Vec<ModelId>,
    pipeline_opts: Vec<pipeline::PipeOpts>,
    copies_opts: Vec<copies::CopiesOpt>,
    declaring_models: bool,
}

/// The result of checking a program.
pub struct Checked {
    pub program: Program,
    pub diagnostics: Vec<Diagnostic>,
    pub sources: SourceMap,
    pub index: Index,
    pub fn_sigs: Vec<FnSig>,
}

impl Checked {
    pub fn has_errors(&self) -> bool {
        self.diagnostics.iter().any(|d| d.is_error())
    }
}

thread_local! {
    /// Mesh sizes given on the command line (`--mesh dp=4,mp=1`), replacing the file's.
    static MESH_OVERRIDE: std::cell::RefCell<Vec<(String, i64)>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Makes every later check on this thread use these mesh axis sizes instead of the ones the
/// program's `mesh` declares (`--mesh` on `run`, `check`, `test`).
pub fn set_mesh_override(sizes: Vec<(String, i64)>) {
    MESH_OVERRIDE.with(|m| *m.borrow_mut() = sizes);
}

fn mesh_override() -> Vec<(String, i64)> {
    MESH_OVERRIDE.with(|m| m.borrow().clone())
}

/// A constant's value given on the command line (`--const LR=0.01`).
#[derive(Clone, Debug, PartialEq)]
pub enum ConstValue {
    Int(i64),
    Float(f64),
    Bool(bool),
}

thread_local! {
    static CONST_OVERRIDE: std::cell::RefCell<Vec<(String, ConstValue)>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Makes every later check on this thread give the root file's `const`s these values instead
/// of the ones written (`--const LR=0.01,EPOCHS=3` on `run`, `check`, `test`, `dryrun`).
pub fn set_const_override(values: Vec<(String, ConstValue)>) {
    CONST_OVERRIDE.with(|m| *m.borrow_mut() = values);
}

fn const_override() -> Vec<(String, ConstValue)> {
    CONST_OVERRIDE.with(|m| m.borrow().clone())
}

/// Checks a file on disk and everything it uses.
pub fn check_file(path: &Path) -> Result<Checked, std::io::Error> {
    // Only a regular file is read (a FIFO would block forever, a device never end).
    let bytes = kernels::io::file::read_regular(path)?;
    let canon = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    let name = path.display().to_string();
    Ok(match String::from_utf8(bytes) {
        Ok(text) => check_source_with_origin(Origin::File(canon), &name, text),
        Err(e) => {
            let mut c = Checker::new();
            let text = String::from_utf8_lossy(e.as_bytes()).into_owned();
            let file = c.sources.add(name.clone(), text);
            // In the lossy text the bad byte became U+FFFD (3 bytes): span the whole character.
            let bad = e.utf8_error().valid_up_to();
            let span = Span::new(file, bad, bad + char::REPLACEMENT_CHARACTER.len_utf8());
            c.diags.push(
                Diagnostic::error(Code::E0108, span, "source file is not valid UTF-8").label("invalid byte here"),
            );
            c.finish()
        }
    })
}

/// Checks source text held in memory; relative `use` paths resolve from `dir`.
pub fn check_source(name: &str, text: &str, dir: &Path) -> Checked {
    check_source_with_origin(Origin::Memory { name: name.to_string(), dir: dir.to_path_buf() }, name, text.to_string())
}

fn check_source_with_origin(origin: Origin, name: &str, text: String) -> Checked {
    let mut c = Checker::new();
    let stem = Path::new(name).file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
    let root = c.load_module(origin, text, stem);
    c.check_all(root);
    c.finish()
}

impl Checker {
    fn new() -> Checker {
        Checker {
            root: None,
            sources: SourceMap::new(),
            diags: Vec::new(),
            prog: Program::default(),
            modules: Vec::new(),
            module_index: HashMap::new(),
            loading: Vec::new(),
            order: Vec::new(),
            scopes: Vec::new(),
            fn_sigs: Vec::new(),
            model_sigs: Vec::new(),
            closures: Vec::new(),
            index: Index::default(),
            checking: Vec::new(),
            body_done: Vec::new(),
            suggest_budget: SUGGEST_BUDGET,
            unresolved: Default::default(),
            oversized: Vec::new(),
            stacks: HashMap::new(),
            pending_stacks: Vec::new(),
            pipeline_opts: Vec::new(),
            copies_opts: Vec::new(),
            declaring_models: false,
        }
    }

    fn finish(mut self) -> Checked {
        // Keep diagnostics in source order per file, errors of the root file first.
        self.diags.sort_by_key(|d| (d.primary.span.file, d.primary.span.start));
        self.diags.dedup();
        Checked {
            program: self.prog,
            diagnostics: self.diags,
            sources: self.sources,
            index: self.index,
            fn_sigs: self.fn_sigs,
        }
    }

    fn check_all(&mut self, root: ModuleId) {
        self.root = Some(root);
        self.scopes = vec![HashMap::new(); self.modules.len()];
        let order = self.order.clone();
        for &m in &order {
            self.declare_items(m);
        }
        for &m in &order {
            self.resolve_uses(m);
        }
        for &m in &order {
            self.collect_signatures(m);
        }
        self.body_done = vec![false; self.fn_sigs.len()];
        for &m in &order {
            self.check_bodies(m);
        }
        // Derivatives are generated from checked code only.
        if !self.diags.iter().any(|d| d.is_error()) {
            crate::passes::verified(&mut self.prog, crate::passes::Pass::Check);
            self.build_copies();
            self.build_pipelines();
            crate::passes::autodiff(&mut self.prog, &mut self.diags);
        }
        // Functions synthesised while checking bodies (closures) are already checked.
        let root_scope = &self.scopes[root.0 as usize];
        let mut root_funcs: Vec<(String, FuncId)> = root_scope
            .iter()
            .filter_map(|(n, r)| match r {
                ItemRef::Func(f) if self.fn_sigs[f.0 as usize].module == root => Some((n.clone(), *f)),
                _ => None,
            })
            .collect();
        root_funcs.sort();
        self.prog.main = root_funcs.iter().find(|(n, _)| n == "main").map(|(_, f)| *f);
        self.prog.root_funcs = root_funcs;
    }

    pub(crate) fn error(&mut self, d: Diagnostic) {
        self.diags.push(d);
    }

    pub(crate) fn span_id(&mut self, span: Span) -> ir::SpanId {
        self.prog.spans.push(span);
        ir::SpanId(self.prog.spans.len() as u32 - 1)
    }

    pub(crate) fn new_sym(&mut self, name: &str) -> Sym {
        self.prog.sym_names.push(name.to_string());
        Sym(self.prog.sym_names.len() as u32 - 1)
    }

    pub(crate) fn new_rest(&mut self, name: &str) -> RestSym {
        self.prog.rest_names.push(name.to_string());
        RestSym(self.prog.rest_names.len() as u32 - 1)
    }

    pub(crate) fn new_tyvar(&mut self, name: &str) -> TyVar {
        self.prog.tyvar_names.push(name.to_string());
        TyVar(self.prog.tyvar_names.len() as u32 - 1)
    }

    pub(crate) fn ty_str(&self, t: &Type) -> String {
        crate::types::type_str(t, &self.prog)
    }

    pub(crate) fn dim_str(&self, d: &Dim) -> String {
        crate::types::dim_str(d, &self.prog)
    }

    pub(crate) fn names(&self) -> &dyn Names {
        &self.prog
    }

    /// `suggest` within a per-run budget of compared candidates. Thousands of unknown names in a
    /// scope of thousands would otherwise cost quadratic time for hints alone; once the budget is
    /// spent, later diagnostics simply come without a "did you mean".
    pub(crate) fn suggest_budgeted(&mut self, name: &str, cands: &[String]) -> Option<String> {
        if cands.len() > self.suggest_budget {
            self.suggest_budget = 0;
            return None;
        }
        self.suggest_budget -= cands.len();
        suggest(name, cands.iter().map(String::as_str))
    }
}

/// How many candidates "did you mean" hints compare in one run, all diagnostics together.
const SUGGEST_BUDGET: usize = 1_000_000;

/// The closest candidate by edit distance, for "did you mean" help.
pub fn suggest<'a>(name: &str, candidates: impl Iterator<Item = &'a str>) -> Option<String> {
    let mut best: Option<(usize, &str)> = None;
    for c in candidates {
        if c == name {
            continue;
        }
        let d = edit_distance(name, c);
        let limit = (name.chars().count().max(c.chars().count()) / 3).max(1);
        if d <= limit && best.is_none_or(|(bd, bc)| d < bd || (d == bd && c < bc)) {
            best = Some((d, c));
        }
    }
    best.map(|(_, c)| c.to_string())
}

fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    if a.len() > 64 || b.len() > 64 {
        return usize::MAX;
    }
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for i in 1..=a.len() {
        let mut cur = vec![i; b.len() + 1];
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            cur[j] = (prev[j] + 1).min(cur[j - 1] + 1).min(prev[j - 1] + cost);
        }
        prev = cur;
    }
    prev[b.len()]
}
