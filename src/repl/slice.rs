//! What the REPL knows of each local of its session function, so that an input can be checked
//! in a small program instead of the whole session.
//!
//! Checking every input inside the whole session program costs time in proportion to the
//! session, so a piped script of n lines took time in n² (100,000 `let` lines: 4,400 done in a
//! minute). Most inputs name only a few earlier locals, and the checker needs no more of them
//! than their types: such an input is checked in a *slice*, the session's items and then
//! `fn __repl() { let x: f32[2, 3] = load("") … input }`, one declaration (a stub, never run) per
//! local the input names. Its run starts from the session's values of those locals.
//!
//! A slice is used only when it is sure to mean what the whole program means; otherwise the
//! input is checked in the whole program, as before:
//! - every local the input can reach is declarable: a tensor or a model, whose type prints as
//!   source (a function, a tuple or a string is not); dims bound at run time come with the
//!   local that bound them, so a stub's `N` is the session's `N`;
//! - the input has no closure (`|x| …` captures every local in scope, and its numbering would
//!   differ from the whole program's);
//! - the slice checks without errors (an input with an error is checked again in the whole
//!   program, which then reports it), and each stub has exactly the name, type and mutability
//!   of the local it stands for.
//!
//! Locals are numbered as in the whole session program: the input's locals come after every
//! earlier one whichever program checked it, so a later whole-program check finds the frame as
//! it expects (`matches_whole` confirms it before such a check is used).

use lang::ir::{self, Stmt};
use lang::syntax::lexer::{lex, Tok};
use lang::types::{type_str, Type};
use std::collections::HashMap;

/// One local of the session function.
#[derive(Clone, Debug)]
struct Decl {
    name: String,
    /// Its type as msl source (`f32[N, 64]`).
    ty: String,
    mutable: bool,
    /// A stub can stand for it (a tensor or a model).
    declarable: bool,
    /// Names in its type that may be dims bound at run time.
    dims: Vec<String>,
}

/// The session function's locals in the whole program's numbering, and which of them each
/// name means at the top level of the session.
#[derive(Default)]
pub(super) struct Decls {
    decls: Vec<Decl>,
    /// A name bound by a top-level `let`/`var`: the latest local with that name.
    bound: HashMap<String, u32>,
    /// A dim bound at run time (`let x: f32[N] = load(…)`): the local whose value bound it.
    dims: HashMap<String, u32>,
}

/// A slice for an input: the stub lines, and the session local each stub stands for.
pub(super) struct Slice {
    pub lines: Vec<String>,
    pub slots: Vec<u32>,
}

fn identifiers(text: &str) -> Vec<&str> {
    let (toks, _) = lex(lang::source::FileId(0), text);
    toks.iter().filter_map(|(_, t, _)| if let Tok::Ident(s) = t { Some(*s) } else { None }).collect()
}

impl Decls {
    /// How many locals the session function has (the next input's locals start here).
    pub fn len(&self) -> usize {
        self.decls.len()
    }

    /// The slice to check `input` in, or `None` when only the whole program will do.
    pub fn slice(&self, input: &str) -> Option<Slice> {
        let (toks, diags) = lex(lang::source::FileId(0), input);
        if !diags.is_empty() || toks.iter().any(|(_, t, _)| matches!(t, Tok::Pipe | Tok::OrOr)) {
            return None;
        }
        let mut need: std::collections::HashSet<u32> = Default::default();
        let mut names: Vec<&str> =
            toks.iter().filter_map(|(_, t, _)| if let Tok::Ident(s) = t { Some(*s) } else { None }).collect();
        // The locals named, and for each the locals that bound the dims of its type.
        while let Some(n) = names.pop() {
            for &l in [self.bound.get(n), self.dims.get(n)].into_iter().flatten() {
                if need.insert(l) {
                    names.extend(self.decls[l as usize].dims.iter().map(String::as_str));
                }
            }
        }
        let mut need: Vec<u32> = need.into_iter().collect();
        need.sort_unstable();
        let mut lines = Vec::with_capacity(need.len());
        for &l in &need {
            let d = &self.decls[l as usize];
            if !d.declarable {
                return None;
            }
            let kw = if d.mutable { "var" } else { "let" };
            lines.push(format!("{kw} {}: {} = load(\"\")", d.name, d.ty));
        }
        Some(Slice { lines, slots: need })
    }

    /// Checks that a slice program declared exactly the stubs asked for; gives the index of
    /// the input's first IR statement.
    pub fn verify_slice(&self, prog: &ir::Program, func: &ir::Func, body: &[Stmt], slots: &[u32]) -> Option<usize> {
        if func.locals.len() < slots.len() {
            return None;
        }
        for (i, &g) in slots.iter().enumerate() {
            if !self.same(prog, &func.locals[i], g as usize) {
                return None;
            }
        }
        // Each stub lowers to its `let` and the run-time dims of its type.
        let mut at = 0;
        for i in 0..slots.len() {
            match body.get(at) {
                Some(Stmt::Let { pat: ir::Pat::Local(l), .. }) if l.0 as usize == i => at += 1,
                _ => return None,
            }
            while matches!(body.get(at), Some(Stmt::BindDims { local, .. }) if local.0 as usize == i) {
                at += 1;
            }
        }
        Some(at)
    }

    /// True when local `l` of a program is the session's local `g`: same name, type and
    /// mutability.
    fn same(&self, prog: &ir::Program, l: &ir::LocalInfo, g: usize) -> bool {
        let Some(d) = self.decls.get(g) else { return false };
        d.mutable == l.mutable && prog.names.get(l.name) == d.name && type_str(&l.ty, prog) == d.ty
    }

    /// True when the whole session program numbers the earlier locals as the session does.
    pub fn matches_whole(&self, prog: &ir::Program, func: &ir::Func) -> bool {
        func.locals.len() >= self.decls.len()
            && self
                .decls
                .iter()
                .zip(&func.locals)
                .all(|(d, l)| d.name == prog.names.get(l.name) && d.mutable == l.mutable)
    }

    /// Adds the locals of a committed input: locals `base..` of `func`, whose top-level IR
    /// statements are `new`.
    pub fn commit(&mut self, prog: &ir::Program, func: &ir::Func, base: usize, new: &[Stmt]) {
        let first = self.decls.len();
        for l in func.locals.get(base..).unwrap_or(&[]) {
            self.decls.push(decl(prog, l));
        }
        let global = |l: ir::Local| (l.0 as usize).checked_sub(base).map(|i| (first + i) as u32);
        for s in new {
            match s {
                Stmt::Let { pat, .. } => pat.each_local(&mut |l| {
                    if let Some(g) = global(l) {
                        self.bound.insert(self.decls[g as usize].name.clone(), g);
                    }
                }),
                Stmt::BindDims { local, dims, .. } => {
                    for (_, sym, _) in dims {
                        if let (Some(sym), Some(g)) = (sym, global(*local)) {
                            let name = prog.sym_names.get(sym.0 as usize).cloned().unwrap_or_default();
                            self.dims.insert(name, g);
                        }
                    }
                }
                Stmt::Assign { .. } | Stmt::Expr(_) => {}
            }
        }
    }

    /// Everything again from a whole session program checked without input.
    pub fn rebuild(prog: &ir::Program, func: &ir::Func, body: &[Stmt]) -> Decls {
        let mut d = Decls::default();
        d.commit(prog, func, 0, body);
        d
    }
}

fn decl(prog: &ir::Program, l: &ir::LocalInfo) -> Decl {
    let ty = type_str(&l.ty, prog);
    let dims = identifiers(&ty).into_iter().map(str::to_string).collect();
    Decl {
        name: prog.names.get(l.name).to_string(),
        declarable: matches!(l.ty, Type::Tensor(..) | Type::Model(..)),
        ty,
        mutable: l.mutable,
        dims,
    }
}
