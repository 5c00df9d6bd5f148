//! A REPL session: the items and statements entered so far, and the values they computed.
//!
//! The session is one msl program: the items, then `fn __repl() { … }` whose body holds every
//! `let`/`var` statement entered so far. Each input is checked as part of that program (so it
//! sees every earlier name with its shape), but only the new part runs: the values of the
//! earlier locals live on in one interpreter `Frame`. Adding an item can renumber models and
//! functions, so stored values are carried over by name; replacing an item runs the earlier
//! statements again (without their output) so that no value of the old definition survives.
//!
//! An input that names only tensors and models of the session is checked in a smaller program
//! (`super::slice`) that declares just those, so that a long session does not make each input
//! slower; the whole program remains the reference, used whenever a slice might differ.

use super::slice::{Decls, Slice};
use lang::check::Checked;
use lang::diag::{self, Code, Diagnostic};
use lang::interp::{FnValue, Frame, Interp, ModelValue, Value};
use lang::ir::{self, ExprKind};
use lang::source::{FileId, SourceMap, Span};
use lang::syntax::ast;
use lang::types::TensorTy;
use lang::types::{ClosureId, FuncId, ModelId, Type};
use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// The name of the function that holds the session's statements.
const REPL_FN: &str = "__repl";

/// One item of the session, as written.
#[derive(Clone, Debug)]
struct Item {
    /// `fn`/`model`/… and its name; `None` for `use` items (kept once each).
    key: Option<(&'static str, String)>,
    text: String,
    /// For `use m.{a, b}`: the module's dotted path and the names it brings in.
    imports: Option<(String, Vec<String>)>,
}

/// What the user sees from one input: text for stdout, and diagnostics already rendered.
#[derive(Default, Debug)]
pub struct Output {
    pub out: String,
    pub err: String,
}

impl Output {
    fn line(&mut self, s: impl AsRef<str>) {
        self.out.push_str(s.as_ref());
        self.out.push('\n');
    }
    fn error(&mut self, s: impl AsRef<str>) {
        self.err.push_str(s.as_ref());
        if !s.as_ref().ends_with('\n') {
            self.err.push('\n');
        }
    }
}

/// Stable names of a program's models and functions, to carry values over to a new program.
#[derive(Default)]
struct Names {
    models: Vec<String>,
    funcs: Vec<String>,
    /// The smallest closure id created in the session's function.
    closure_base: Option<u32>,
}

pub struct Session {
    items: Vec<Item>,
    stmts: Vec<String>,
    /// IR statements the committed `stmts` lower to (their values are in `frame`).
    ir_count: usize,
    /// The values of the session function's locals, numbered as in the whole session program.
    frame: Frame,
    /// What each of those locals is, to check an input in a slice.
    decls: Decls,
    /// A slice bound dims at run time since `frame.dims` was last bound (its keys are the
    /// whole program's symbols, which a slice does not know): bind them again before the whole
    /// program runs.
    dims_stale: bool,
    /// Check inputs in slices where one will do; `MSL_REPL_WHOLE` set turns this off, so that
    /// tests can compare a session both ways.
    slices: bool,
    names: Names,
    dir: PathBuf,
    /// Where relative `load` paths are tried after the working directory: the folder of the
    /// file `:load`ed last (as `msl run` tries the program's folder), else the working one.
    load_dir: PathBuf,
    pub interrupt: Arc<AtomicBool>,
    pub color: bool,
    /// Evaluate with the JIT installed at `-O1` (`msl repl --mode jit`). Not `-O2`: its
    /// last-use moves assume the program ends, while the session's frame outlives each input.
    pub jit: bool,
    /// Where `log_scalar` writes (one event file for the session); `None` discards. Replays of
    /// earlier statements after a redefinition never log again.
    pub scalars: Option<std::rc::Rc<std::cell::RefCell<crate::metrics::TensorBoard>>>,
}

/// A check of the session's program with some input placed in it.
struct Compiled {
    c: Checked,
    /// Byte range of the input in the program text.
    input: (usize, usize),
    input_text: String,
    plan: Plan,
}

/// Which program an input was checked in.
enum Plan {
    /// The whole session program: its locals are numbered as the session's frame.
    Whole,
    /// A slice: local `i < slots.len()` of its function stands for the session's local
    /// `slots[i]`, and the input's IR statements start at `ir_start`.
    Slice { slots: Vec<u32>, ir_start: usize },
}

impl Compiled {
    fn repl_fn(&self) -> Option<FuncId> {
        self.c.program.root_funcs.iter().find(|(n, _)| n == REPL_FN).map(|(_, f)| *f)
    }

    /// The statements and result of the session's function body.
    fn body(&self) -> Option<(&[ir::Stmt], &ir::Expr)> {
        let f = self.c.program.func(self.repl_fn()?);
        Some(match &f.body.kind {
            ExprKind::Block { stmts, result } => (stmts.as_slice(), &**result),
            _ => (&[], &f.body),
        })
    }
}

fn empty_frame() -> Frame {
    Frame { locals: vec![], dims: HashMap::new(), rests: HashMap::new() }
}

fn key_name(file: &str, text: &str) -> String {
    if file == "<repl>" {
        text.to_string()
    } else {
        format!("{file}::{text}")
    }
}

impl Session {
    pub fn new(interrupt: Arc<AtomicBool>) -> Session {
        Session {
            items: vec![],
            stmts: vec![],
            ir_count: 0,
            frame: empty_frame(),
            decls: Decls::default(),
            dims_stale: false,
            slices: std::env::var_os("MSL_REPL_WHOLE").is_none(),
            names: Names::default(),
            dir: std::env::current_dir().unwrap_or_default(),
            load_dir: std::env::current_dir().unwrap_or_default(),
            interrupt,
            color: false,
            jit: false,
            scalars: None,
        }
    }

    /// The program text with `input` placed in the session's function (as a statement or the
    /// tail expression) or among the items.
    fn source(&self, items: &[Item], stmts: &[String], input: Option<&str>) -> (String, (usize, usize)) {
        let mut s = String::new();
        for it in items {
            s.push_str(&it.text);
            s.push_str("\n\n");
        }
        s.push_str(&format!("fn {REPL_FN}() {{\n"));
        for st in stmts {
            s.push_str(st);
            s.push('\n');
        }
        let start = s.len();
        // With no input the body ends in `()`, so that every kept statement stays a statement.
        s.push_str(input.unwrap_or("()"));
        let end = s.len();
        s.push_str("\n}\n");
        (s, (start, end))
    }

    fn compile(&self, items: &[Item], stmts: &[String], input: Option<&str>) -> Compiled {
        let (src, range) = self.source(items, stmts, input);
        let c = lang::check::check_source("<repl>", &src, &self.dir);
        Compiled { c, input: range, input_text: input.unwrap_or("").to_string(), plan: Plan::Whole }
    }

    /// Checks `input` in a slice of the session (see `super::slice`); `None` when the whole
    /// program must check it (the input names a local no stub can stand for, has a closure, or
    /// the slice reports an error, which the whole program then reports as it sees it).
    fn compile_slice(&self, input: &str) -> Option<Compiled> {
        let Slice { lines, slots } = self.decls.slice(input)?;
        let mut comp = self.compile(&self.items, &lines, Some(input));
        if comp.c.diagnostics.iter().any(Diagnostic::is_error) {
            return None;
        }
        let func = comp.c.program.func(comp.repl_fn()?);
        let (body, _) = comp.body()?;
        let ir_start = self.decls.verify_slice(&comp.c.program, func, body, &slots)?;
        comp.plan = Plan::Slice { slots, ir_start };
        Some(comp)
    }

    /// Renders diagnostics, showing spans inside the input against the input alone.
    fn render(&self, comp: &Compiled, diags: &[Diagnostic]) -> String {
        let mut sm = SourceMap::new();
        for (_, f) in comp.c.sources.files() {
            sm.add(f.name.clone(), f.text.clone());
        }
        let inp = sm.add("<input>", comp.input_text.clone());
        let (a, b) = comp.input;
        let map = |s: Span| {
            if s.file == FileId(0) && s.start as usize >= a && s.end as usize <= b {
                Span::new(inp, s.start as usize - a, s.end as usize - a)
            } else {
                s
            }
        };
        let mapped: Vec<Diagnostic> = diags
            .iter()
            .map(|d| {
                let mut d = d.clone();
                d.primary.span = map(d.primary.span);
                for l in &mut d.secondary {
                    l.span = map(l.span);
                }
                d
            })
            .collect();
        diag::render(&mapped, &sm, self.color)
    }

    /// Renders diagnostics of a text checked on its own (parse errors of an input).
    fn render_text(&self, text: &str, diags: &[Diagnostic], shift: usize) -> String {
        let mut sm = SourceMap::new();
        let f = sm.add("<input>", text.to_string());
        let mapped: Vec<Diagnostic> = diags
            .iter()
            .map(|d| {
                let mut d = d.clone();
                let fix = |s: Span| {
                    let st = (s.start as usize).saturating_sub(shift).min(text.len());
                    let en = (s.end as usize).saturating_sub(shift).clamp(st, text.len());
                    Span::new(f, st, en)
                };
                d.primary.span = fix(d.primary.span);
                d.secondary.iter_mut().for_each(|l| l.span = fix(l.span));
                d
            })
            .collect();
        diag::render(&mapped, &sm, self.color)
    }

    /// Handles one complete input: items, statements or an expression.
    pub fn eval(&mut self, input: &str) -> Output {
        let mut out = Output::default();
        let input = input.trim();
        if input.is_empty() {
            return out;
        }
        // Items parse as a file; anything else must parse as statements of a body.
        let (file, file_diags) = lang::syntax::parse(FileId(0), input);
        let looks_like_item = starts_with_item_keyword(input);
        if !file.items.is_empty() && (file_diags.is_empty() || looks_like_item) {
            if !file_diags.is_empty() {
                out.error(self.render_text(input, &file_diags, 0));
                return out;
            }
            self.add_items(input, &file, &mut out);
            return out;
        }
        let head = format!("fn {REPL_FN}() {{\n");
        let wrapper = format!("{head}{input}\n}}");
        let shift = head.len();
        let (body, diags) = lang::syntax::parse(FileId(0), &wrapper);
        if !diags.is_empty() {
            let (d, shift) = if looks_like_item { (&file_diags, 0) } else { (&diags, shift) };
            out.error(self.render_text(input, d, shift));
            return out;
        }
        let Some(ast::ItemKind::Fn(f)) = body.items.first().map(|i| &i.kind) else {
            return out;
        };
        for s in &f.body.stmts {
            let text = wrapper.get(s.span.range()).unwrap_or("").to_string();
            let ok = match &s.kind {
                ast::StmtKind::Let { .. } | ast::StmtKind::Var { .. } => self.run_kept(&text, &mut out, true),
                ast::StmtKind::Assign { .. } => self.run_kept(&text, &mut out, false),
                ast::StmtKind::Expr(_) if assigns(&text) => self.run_kept(&text, &mut out, false),
                ast::StmtKind::Expr(_) => self.run_expr(&text, &mut out),
                _ => self.run_statement(&text, &mut out),
            };
            if !ok {
                break;
            }
        }
        out
    }

    /// Checks the session with `stmt` added, in a slice when one will do; reports errors.
    fn check_with(&mut self, stmt: &str, out: &mut Output) -> Option<Compiled> {
        if let Some(comp) = self.slices.then(|| self.compile_slice(stmt)).flatten() {
            return Some(comp);
        }
        let mut comp = self.compile(&self.items, &self.stmts, Some(stmt));
        let errors: Vec<Diagnostic> = comp.c.diagnostics.iter().filter(|d| d.is_error()).cloned().collect();
        if !errors.is_empty() {
            out.error(self.render(&comp, &errors));
            return None;
        }
        if !self.whole_matches(&comp) {
            // The whole program numbers the earlier locals differently from the frame (which
            // slices should never cause): run the session again in its numbering, then check
            // the input once more.
            let fresh = self.compile(&self.items, &self.stmts, None);
            self.replay(&fresh, out);
            comp = self.compile(&self.items, &self.stmts, Some(stmt));
            if !self.whole_matches(&comp) {
                out.error("error: internal: the session's values no longer match its program; :reset starts afresh");
                return None;
            }
        }
        Some(comp)
    }

    /// True when `comp` (the whole program) has the session's function, its earlier locals
    /// numbered as the frame and its earlier statements where the session counts them.
    fn whole_matches(&self, comp: &Compiled) -> bool {
        let (Some(f), Some((stmts, _))) = (comp.repl_fn(), comp.body()) else { return false };
        stmts.len() >= self.ir_count && self.decls.matches_whole(&comp.c.program, comp.c.program.func(f))
    }

    /// Runs the IR statements after the committed ones, then the body's result.
    fn execute(&mut self, comp: &Compiled, out: &mut Output) -> Option<Value> {
        let (stmts, result) = comp.body()?;
        let func = comp.c.program.func(comp.repl_fn()?);
        let (mut frame, new) = match &comp.plan {
            Plan::Whole => {
                if self.dims_stale {
                    self.rebind_dims(comp);
                    self.dims_stale = false;
                }
                if self.frame.locals.len() < func.locals.len() {
                    self.frame.locals.resize(func.locals.len(), None);
                }
                (std::mem::replace(&mut self.frame, empty_frame()), stmts.get(self.ir_count..).unwrap_or(&[]).to_vec())
            }
            Plan::Slice { slots, ir_start } => {
                let mut frame = empty_frame();
                frame.locals.resize(func.locals.len(), None);
                for (i, &g) in slots.iter().enumerate() {
                    frame.locals[i] = self.frame.locals.get(g as usize).cloned().flatten();
                }
                // The stubs' run-time dims are bound from the session's values, then the input
                // runs.
                let (stubs, input) = stmts.split_at((*ir_start).min(stmts.len()));
                let mut new: Vec<ir::Stmt> =
                    stubs.iter().filter(|s| matches!(s, ir::Stmt::BindDims { .. })).cloned().collect();
                new.extend_from_slice(input);
                (frame, new)
            }
        };
        let block = ir::Expr {
            kind: ExprKind::Block { stmts: new, result: Box::new(result.clone()) },
            ty: result.ty.clone(),
            span: result.span,
            id: lang::ir::ExprId::fresh(),
        };
        self.interrupt.store(false, Ordering::SeqCst);
        let stdout = std::io::stdout();
        let mut it = Interp::new(&comp.c.program, Box::new(stdout.lock()));
        it.source_dir = Some(self.load_dir.clone());
        it.interrupt = self.interrupt.clone();
        if let Some(log) = &self.scalars {
            it.scalars = Box::new(crate::metrics::Shared(log.clone()));
        }
        if self.jit {
            jit::install(&mut it, jit::Options::level(1));
        }
        let r = it.eval(&block, &mut frame);
        let _ = it.out.flush();
        drop(it);
        match &comp.plan {
            Plan::Whole => self.frame = frame,
            Plan::Slice { slots, .. } => {
                // Variables the input assigned go back to the session; its own locals follow the
                // session's, where the whole program numbers them.
                for (i, &g) in slots.iter().enumerate() {
                    if let Some(slot) = self.frame.locals.get_mut(g as usize) {
                        *slot = frame.locals[i].take();
                    }
                }
                self.frame.locals.truncate(self.decls.len());
                self.frame.locals.extend(frame.locals.drain(slots.len()..));
            }
        }
        match r {
            Ok(v) | Err(lang::interp::Ctrl::Return(v)) => Some(v),
            Err(lang::interp::Ctrl::Error(e)) => {
                if self.interrupt.load(Ordering::SeqCst) {
                    out.error("interrupted");
                } else {
                    out.error(self.render(comp, &[e.to_diagnostic()]));
                }
                None
            }
        }
    }

    /// A statement that binds names or changes variables: runs it and keeps it, so that later
    /// input sees its names and a replay reproduces its effect. Prints the type of every name
    /// it binds.
    fn run_kept(&mut self, stmt: &str, out: &mut Output, show: bool) -> bool {
        // A trailing `()` keeps the statement out of the block's result, so that it is one of
        // the body's statements both now and when later input follows it.
        let Some(comp) = self.check_with(&format!("{stmt}\n()"), out) else {
            return false;
        };
        if self.execute(&comp, out).is_none() {
            return false;
        }
        self.stmts.push(stmt.to_string());
        let (Some(f), Some((stmts, _))) = (comp.repl_fn(), comp.body()) else { return false };
        let func = comp.c.program.func(f);
        match &comp.plan {
            Plan::Whole => {
                let new = stmts.get(self.ir_count..).unwrap_or(&[]);
                self.decls.commit(&comp.c.program, func, self.decls.len(), new);
                self.ir_count = stmts.len();
                self.names = names_of(&comp.c, comp.repl_fn());
            }
            Plan::Slice { slots, ir_start } => {
                let new = stmts.get(*ir_start..).unwrap_or(&[]);
                self.decls.commit(&comp.c.program, func, slots.len(), new);
                self.ir_count += new.len();
                self.dims_stale |= new.iter().any(|s| matches!(s, ir::Stmt::BindDims { .. }));
                // A slice numbers the items' models and functions as the whole program does,
                // and has no closure, so the session's names stay as they are.
            }
        }
        if !show {
            return true;
        }
        // The type of each bound name: the index entries of bindings inside the input.
        let (a, b) = comp.input;
        let mut seen = Vec::new();
        for (span, s, def) in &comp.c.index.types {
            let inside = span.file == FileId(0) && span.start as usize >= a && span.end as usize <= b;
            if inside && *def == Some(*span) && !seen.contains(span) && is_top_binding(stmt, span.start as usize - a) {
                seen.push(*span);
                out.line(s);
            }
        }
        true
    }

    /// An expression: runs it and prints its value unless it is `()`.
    fn run_expr(&mut self, expr: &str, out: &mut Output) -> bool {
        let Some(comp) = self.check_with(expr, out) else {
            return false;
        };
        let Some(v) = self.execute(&comp, out) else {
            return false;
        };
        if !matches!(&v, Value::Tuple(t) if t.is_empty()) {
            out.line(v.display(&comp.c.program));
        }
        true
    }

    /// `return` and other statements: run, not kept.
    fn run_statement(&mut self, stmt: &str, out: &mut Output) -> bool {
        let Some(comp) = self.check_with(&format!("{stmt}\n()"), out) else {
            return false;
        };
        self.execute(&comp, out).is_some()
    }

    /// Adds (or replaces) items; the session must still check with them. False when it does
    /// not (the items are then not added).
    fn add_items(&mut self, input: &str, file: &ast::File, out: &mut Output) -> bool {
        let mut items = self.items.clone();
        let mut replaced = false;
        let mut added = Vec::new();
        let mut prev_end = 0;
        for item in &file.items {
            let end = item.span.end as usize;
            let text = input.get(prev_end..end).unwrap_or("").trim().to_string();
            prev_end = end;
            let key = item_key(&item.kind);
            if let Some(k) = &key {
                added.push(k.clone());
            }
            if let ast::ItemKind::Use(ast::UseTarget::Names(path, names)) = &item.kind {
                // Bringing in a name that an earlier `use` already brought in from the same
                // module changes nothing (a `:load`ed file often repeats the session's `use`),
                // so only the new names are kept; the same name from another module is kept,
                // for the checker to report.
                let module = path.iter().map(|p| p.name.as_str()).collect::<Vec<_>>().join(".");
                let known = |n: &str| {
                    items
                        .iter()
                        .any(|i| matches!(&i.imports, Some((m, ns)) if *m == module && ns.iter().any(|x| x == n)))
                };
                let fresh: Vec<String> = names.iter().map(|n| n.name.clone()).filter(|n| !known(n)).collect();
                if fresh.is_empty() {
                    continue;
                }
                let text =
                    if fresh.len() == names.len() { text } else { format!("use {module}.{{{}}}", fresh.join(", ")) };
                items.push(Item { key, text, imports: Some((module, fresh)) });
                continue;
            }
            match items.iter().position(|i| i.key.is_some() && i.key == key) {
                Some(i) => {
                    items[i].text = text;
                    replaced = true;
                }
                None if key.is_none() && items.iter().any(|i| i.text == text) => {}
                None => items.push(Item { key, text, imports: None }),
            }
        }
        let comp = self.compile(&items, &self.stmts, None);
        let errors: Vec<Diagnostic> = comp.c.diagnostics.iter().filter(|d| d.is_error()).cloned().collect();
        if !errors.is_empty() {
            out.error(self.render(&comp, &errors));
            return false;
        }
        self.items = items;
        if replaced || !self.whole_matches(&comp) {
            self.replay(&comp, out);
        } else {
            self.carry_over(&comp);
        }
        self.names = names_of(&comp.c, comp.repl_fn());
        // Show what was defined, with the checked signature.
        let text = comp.c.sources.text(FileId(0));
        for (kind, name) in added {
            let at = match kind {
                "fn" => format!("fn {name}"),
                "model" => format!("model {name}"),
                "dim" => format!("dim {name}"),
                "const" => format!("const {name}"),
                _ => continue,
            };
            let Some(pos) = find_item(text, &at) else {
                continue;
            };
            let off = pos + at.len() - name.len();
            match lang::ide::hover(&comp.c, FileId(0), off) {
                Some(h) if kind == "model" => out.line(one_line(&h.signature)),
                Some(h) if kind == "const" => out.line(format!("const {name}: {}", h.signature)),
                Some(h) => out.line(h.signature),
                None => {}
            }
        }
        true
    }

    /// After items were added: move stored values to the new program's numbering.
    fn carry_over(&mut self, comp: &Compiled) {
        let new = names_of(&comp.c, comp.repl_fn());
        let models: HashMap<&str, u32> = new.models.iter().enumerate().map(|(i, n)| (n.as_str(), i as u32)).collect();
        let funcs: HashMap<&str, u32> = new.funcs.iter().enumerate().map(|(i, n)| (n.as_str(), i as u32)).collect();
        let remap = Remap {
            old: &self.names,
            models: &models,
            funcs: &funcs,
            closure_shift: match (self.names.closure_base, new.closure_base) {
                (Some(a), Some(b)) => Some((a, b)),
                _ => None,
            },
        };
        for slot in &mut self.frame.locals {
            if let Some(v) = slot.take() {
                *slot = remap.value(&v);
            }
        }
        self.rebind_dims(comp);
        self.reindex(comp);
    }

    /// Describes the session's locals afresh from the whole program `comp` (checked without
    /// input), whose every statement is now in the frame.
    fn reindex(&mut self, comp: &Compiled) {
        if let (Some(f), Some((stmts, _))) = (comp.repl_fn(), comp.body()) {
            self.decls = Decls::rebuild(&comp.c.program, comp.c.program.func(f), stmts);
            self.frame.locals.resize(self.decls.len(), None);
        }
        self.dims_stale = false;
    }

    /// Dims bound at run time (`let x: f32[N, 64] = load(…)`) are keyed by symbol ids, which a
    /// new program renumbers: bind them again from the values.
    fn rebind_dims(&mut self, comp: &Compiled) {
        let Some((stmts, result)) = comp.body() else {
            return;
        };
        let binds: Vec<ir::Stmt> =
            stmts.iter().take(self.ir_count).filter(|s| matches!(s, ir::Stmt::BindDims { .. })).cloned().collect();
        self.frame.dims.clear();
        self.frame.rests.clear();
        let unit = ir::Expr {
            kind: ExprKind::Tuple(vec![]),
            ty: lang::types::Type::unit(),
            span: result.span,
            id: lang::ir::ExprId::fresh(),
        };
        let block = ir::Expr {
            kind: ExprKind::Block { stmts: binds, result: Box::new(unit) },
            ty: lang::types::Type::unit(),
            span: result.span,
            id: lang::ir::ExprId::fresh(),
        };
        let mut it = Interp::new(&comp.c.program, Box::new(std::io::sink()));
        let _ = it.eval(&block, &mut self.frame);
    }

    /// After an item was replaced: run every kept statement again, output discarded.
    fn replay(&mut self, comp: &Compiled, out: &mut Output) {
        self.frame = empty_frame();
        let Some((stmts, result)) = comp.body() else {
            return;
        };
        let func = comp.c.program.func(comp.repl_fn().unwrap_or(FuncId(0)));
        self.frame.locals.resize(func.locals.len(), None);
        let block = ir::Expr {
            kind: ExprKind::Block { stmts: stmts.to_vec(), result: Box::new(result.clone()) },
            ty: result.ty.clone(),
            span: result.span,
            id: lang::ir::ExprId::fresh(),
        };
        self.interrupt.store(false, Ordering::SeqCst);
        let mut it = Interp::new(&comp.c.program, Box::new(std::io::sink()));
        it.source_dir = Some(self.load_dir.clone());
        it.interrupt = self.interrupt.clone();
        if let Err(lang::interp::Ctrl::Error(e)) = it.eval(&block, &mut self.frame) {
            drop(it);
            out.error(format!(
                "note: running the earlier statements again after the redefinition failed:\n{}",
                self.render(comp, &[e.to_diagnostic()])
            ));
        }
        self.ir_count = stmts.len();
        self.reindex(comp);
    }

    /// `:type EXPR`: the type of an expression, checked in the session but not run.
    pub fn type_of(&mut self, expr: &str) -> Output {
        let mut out = Output::default();
        let expr = expr.trim();
        // A bare function or model name shows its signature.
        if lang::ide::word_at(expr, 0) == Some((0, expr.len())) {
            let slice = self.slices.then(|| self.compile_slice(expr)).flatten();
            let comp = slice.unwrap_or_else(|| self.compile(&self.items, &self.stmts, Some(expr)));
            if let Some(h) = lang::ide::hover(&comp.c, FileId(0), comp.input.0) {
                if h.signature.starts_with("fn ") || h.signature.starts_with("model ") {
                    out.line(h.signature);
                    return out;
                }
            }
        }
        let Some(comp) = self.check_with(expr, &mut out) else {
            return out;
        };
        let Some((_, result)) = comp.body() else {
            return out;
        };
        out.line(lang::types::type_str(&result.ty, &comp.c.program));
        out
    }

    /// `:grad FN [PARAM]`: the derivative of a function as msl source, as `msl grad` prints it.
    pub fn grad_of(&self, args: &str) -> Output {
        let mut out = Output::default();
        let mut words = args.split_whitespace();
        let Some(name) = words.next() else {
            out.error("usage: :grad FN [PARAM]");
            return out;
        };
        let comp = self.compile(&self.items, &self.stmts, None);
        let errors: Vec<Diagnostic> = comp.c.diagnostics.iter().filter(|d| d.is_error()).cloned().collect();
        if !errors.is_empty() {
            out.error(self.render(&comp, &errors));
            return out;
        }
        let mut prog = comp.c.program.clone();
        let Some(&(_, fid)) = prog.root_funcs.iter().find(|(n, _)| n == name && n != REPL_FN) else {
            out.error(format!("error: no function `{name}` in this session"));
            return out;
        };
        let f = prog.func(fid).clone();
        let names: Vec<String> =
            f.params.iter().map(|l| prog.names.get(f.locals[l.0 as usize].name).to_string()).collect();
        let wrt = match words.next() {
            None => 0,
            Some(w) => match names.iter().position(|n| n == w) {
                Some(i) => i,
                None => {
                    out.error(format!("error: `{name}` has no parameter `{w}`"));
                    return out;
                }
            },
        };
        let span = prog.span(f.span);
        // The checks `grad(f)` gets in a program: a float scalar result, a float parameter.
        let ret_ok = matches!(&f.ret, Type::Tensor(TensorTy { elem: e, shape: s, .. }) if s.is_empty() && e.is_float());
        let param_ok = f
            .params
            .get(wrt)
            .map(|l| &f.locals[l.0 as usize].ty)
            .is_some_and(|t| matches!(t, Type::Tensor(TensorTy { elem: e, .. }) if e.is_float()) || t.is_model());
        let problem = if !ret_ok {
            Some(Diagnostic::error(
                Code::E0401,
                span,
                format!("`{name}` does not return a float scalar, so it has no gradient"),
            ))
        } else if !param_ok {
            Some(Diagnostic::error(
                Code::E0402,
                span,
                format!("cannot differentiate `{name}` with respect to parameter {wrt}: it is not a float value"),
            ))
        } else {
            None
        };
        if let Some(d) = problem {
            out.error(self.render(&comp, &[d]));
            return out;
        }
        match lang::autodiff::derive(&mut prog, fid, lang::autodiff::Mode::Grad { wrt }, span) {
            Ok(g) => {
                let pname = names.get(wrt).cloned().unwrap_or_default();
                out.line(format!(
                    "// The gradient of `{name}` with respect to `{pname}`, generated by msl's reverse-mode pass."
                ));
                out.out.push_str(&lang::ir::source::function_source(
                    &prog,
                    prog.func(g),
                    &format!("grad_{name}_{pname}"),
                ));
            }
            Err(d) => out.error(self.render(&comp, &[d])),
        }
        out
    }

    /// `:load FILE`: adds the file's items (its relative `use "…"` paths made absolute).
    pub fn load(&mut self, path: &str) -> Output {
        let mut out = Output::default();
        let path = PathBuf::from(path.trim());
        let text = match kernels::io::file::read_to_string(&path) {
            Ok(t) => t,
            Err(e) => {
                out.error(format!("error: cannot read `{}`: {e}", path.display()));
                return out;
            }
        };
        let (file, diags) = lang::syntax::parse(FileId(0), &text);
        if !diags.is_empty() {
            let mut sm = SourceMap::new();
            sm.add(path.display().to_string(), text.clone());
            out.error(diag::render(&diags, &sm, self.color));
            return out;
        }
        let base = std::fs::canonicalize(&path).ok().and_then(|p| p.parent().map(|d| d.to_path_buf()));
        let mut rewritten = String::new();
        let mut prev = 0;
        for item in &file.items {
            let (a, b) = (item.span.start as usize, item.span.end as usize);
            rewritten.push_str(&text[prev..a]);
            match (&item.kind, &base) {
                (ast::ItemKind::Use(ast::UseTarget::File(p, _)), Some(dir))
                    if !std::path::Path::new(p).is_absolute() =>
                {
                    let abs = dir.join(p);
                    rewritten.push_str(&format!("use {:?}", abs.display().to_string()));
                }
                _ => rewritten.push_str(&text[a..b]),
            }
            prev = b;
        }
        let (file, _) = lang::syntax::parse(FileId(0), &rewritten);
        let before = out.err.len();
        let mut items_out = Output::default();
        // The file's functions `load` relative to its folder, as under `msl run`.
        let previous = self.load_dir.clone();
        if let Some(dir) = &base {
            self.load_dir = dir.clone();
        }
        if !self.add_items(&rewritten, &file, &mut items_out) {
            self.load_dir = previous;
        }
        out.err.push_str(&items_out.err);
        if out.err.len() == before {
            let n = file.items.iter().filter(|i| !matches!(i.kind, ast::ItemKind::Use(_))).count();
            out.line(format!("loaded {} ({n} item{})", path.display(), if n == 1 { "" } else { "s" }));
        }
        out
    }

    /// Completion candidates for `line` with the cursor at byte `pos`, placed in the session.
    pub fn complete(&self, line: &str, pos: usize) -> Vec<lang::ide::Completion> {
        let mut text = line[..pos].to_string();
        if text.ends_with('.') {
            text.push_str("__complete");
        }
        let comp = self.compile(&self.items, &self.stmts, Some(&text));
        lang::ide::completions(&comp.c, FileId(0), comp.input.0 + pos)
    }
}

/// `model M[I] {\n    w: f32[I]\n}` on one line: `model M[I] { w: f32[I] }`.
fn one_line(sig: &str) -> String {
    let lines: Vec<&str> = sig.lines().map(str::trim).collect();
    match lines.as_slice() {
        [first, fields @ .., last] if !fields.is_empty() => {
            format!("{first} {} {last}", fields.join(", "))
        }
        _ => lines.join(" "),
    }
}

/// True when a statement assigns to a variable somewhere (`acc = acc + i` inside a loop).
fn assigns(stmt: &str) -> bool {
    use lang::syntax::lexer::Tok;
    let (toks, _) = lang::syntax::lexer::lex(FileId(0), stmt);
    toks.iter().any(|(_, t, _)| matches!(t, Tok::Eq | Tok::PlusEq | Tok::MinusEq | Tok::StarEq | Tok::SlashEq))
}

/// True for inputs that start like an item (`fn`, `model`, `use`, …).
fn starts_with_item_keyword(input: &str) -> bool {
    let first = input.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).next().unwrap_or("");
    matches!(first, "fn" | "model" | "dim" | "const" | "use" | "mesh" | "test")
        || input.starts_with("///")
        || input.starts_with('@')
}

fn item_key(k: &ast::ItemKind) -> Option<(&'static str, String)> {
    Some(match k {
        ast::ItemKind::Fn(f) => ("fn", f.name.name.clone()),
        ast::ItemKind::Model(m) => ("model", m.name.name.clone()),
        ast::ItemKind::Dim { name, .. } => ("dim", name.name.clone()),
        ast::ItemKind::Const { name, .. } => ("const", name.name.clone()),
        ast::ItemKind::Mesh { name, .. } => ("mesh", name.name.clone()),
        ast::ItemKind::Test { name, .. } => ("test", name.clone()),
        ast::ItemKind::Use(_) | ast::ItemKind::Error => return None,
    })
}

/// The offset of `at` (`fn name`) as a whole word at the start of a line of `text`.
fn find_item(text: &str, at: &str) -> Option<usize> {
    text.match_indices(at)
        .find(|(i, _)| {
            let before_ok = *i == 0 || text[..*i].ends_with('\n');
            let after = text[i + at.len()..].chars().next();
            before_ok && !after.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
        })
        .map(|(i, _)| i)
}

/// True when `offset` of a `let`/`var` statement is one of the names it binds (not a name bound
/// inside its value, such as a closure parameter).
fn is_top_binding(stmt: &str, offset: usize) -> bool {
    let head = match stmt.find('=') {
        Some(eq) => &stmt[..eq],
        None => stmt,
    };
    offset < head.len()
}

fn names_of(c: &Checked, repl: Option<FuncId>) -> Names {
    let p = &c.program;
    // Items of the session are known by name alone, others by their file too.
    let key = |span: ir::SpanId, name: &str| {
        let s = p.span(span);
        let file = if s.file == FileId(0) { "<repl>" } else { c.sources.name(s.file) };
        key_name(file, name)
    };
    let mut closure_base = None;
    if let Some(f) = repl {
        lang::ir::walk::walk(&p.func(f).body, &mut |e| {
            if let ExprKind::Closure { id, .. } = &e.kind {
                closure_base = Some(closure_base.map_or(id.0, |b: u32| b.min(id.0)));
            }
        });
    }
    Names {
        models: p.models.iter().map(|m| key(m.span, p.names.get(m.name))).collect(),
        funcs: p.funcs.iter().map(|f| key(f.span, p.names.get(f.name))).collect(),
        closure_base,
    }
}

/// Moves a value from one program's numbering of models, functions and closures to another's.
struct Remap<'a> {
    old: &'a Names,
    models: &'a HashMap<&'a str, u32>,
    funcs: &'a HashMap<&'a str, u32>,
    closure_shift: Option<(u32, u32)>,
}

impl Remap<'_> {
    fn value(&self, v: &Value) -> Option<Value> {
        Some(match v {
            Value::Tensor(_) | Value::Str(_) | Value::Type | Value::Tape(_) | Value::Quant(_) => v.clone(),
            Value::Tuple(ts) => Value::Tuple(Rc::new(ts.iter().map(|t| self.value(t)).collect::<Option<Vec<_>>>()?)),
            Value::Model(m) => {
                let name = self.old.models.get(m.model.0 as usize)?;
                let id = *self.models.get(name.as_str())?;
                Value::Model(Rc::new(ModelValue {
                    model: ModelId(id),
                    dims: m.dims.clone(),
                    fields: m.fields.iter().map(|f| self.value(f)).collect::<Option<Vec<_>>>()?,
                }))
            }
            Value::Fn(f) => Value::Fn(Rc::new(self.func(f)?)),
            // The REPL runs on one process, where no state is held in pieces and no sum is partial.
            Value::Sharded(_) | Value::Partial(_) => return None,
        })
    }

    fn func(&self, f: &FnValue) -> Option<FnValue> {
        Some(match f {
            FnValue::Func { target, captures, closure, dims } => FnValue::Func {
                dims: dims.clone(),
                target: self.target(target)?,
                captures: captures.iter().map(|(l, v)| Some((*l, self.value(v)?))).collect::<Option<Vec<_>>>()?,
                closure: match (closure, self.closure_shift) {
                    (Some(c), Some((a, b))) if c.0 >= a => Some(ClosureId(c.0 - a + b)),
                    (c, _) => *c,
                },
            },
            FnValue::Pullback { func, primals } => FnValue::Pullback {
                func: Rc::new(self.func(func)?),
                primals: primals.iter().map(|v| self.value(v)).collect::<Option<Vec<_>>>()?,
            },
        })
    }

    fn target(&self, t: &ir::FnTarget) -> Option<ir::FnTarget> {
        Some(match t {
            ir::FnTarget::Func(f) => {
                let name = self.old.funcs.get(f.0 as usize)?;
                ir::FnTarget::Func(FuncId(*self.funcs.get(name.as_str())?))
            }
            ir::FnTarget::Grad { inner, wrt, with_value } => {
                ir::FnTarget::Grad { inner: Box::new(self.target(inner)?), wrt: *wrt, with_value: *with_value }
            }
            ir::FnTarget::Vmap { inner, in_axes } => {
                ir::FnTarget::Vmap { inner: Box::new(self.target(inner)?), in_axes: in_axes.clone() }
            }
            ir::FnTarget::Dynamic => ir::FnTarget::Dynamic,
        })
    }
}
