//! Checking and lowering statements and expressions: names, operators, control flow, closures.

use super::{Checker, ItemRef, ModuleId};
use crate::diag::{Code, Diagnostic};
use crate::ir::{self, Attrs, ExprKind, Lit, Local, Pat, Prim, Stmt};
use crate::source::Span;
use crate::syntax::ast::{self, BinOp, UnOp};
use crate::types::unify::{broadcast, join_elem, BroadcastError};
use crate::types::TensorTy;
use crate::types::{ClosureId, Dim, Elem, ElemTy, FnTy, RestSym, ShapeItem, TyVar, Type};
use std::collections::HashMap;

/// What `let x: T = v` makes of `v`: the value, the run-time dims to bind from it, and the dim
/// each new dim name of `T` stands for.
type AnnotatedValue = (ir::Expr, Vec<(usize, Option<crate::types::Sym>, Dim)>, HashMap<crate::types::Sym, Dim>);

mod blocks;
mod coerce;
mod jumps;
mod loops;
mod ops;
mod sizes;

/// What a name in a function body refers to.
#[derive(Clone, Debug)]
pub enum Binding {
    Local(Local),
    Dim(Dim),
    Rest(RestSym),
    Model(TyVar),
}

/// The state of checking one function body (or closure, initialiser, test).
#[derive(Clone)]
pub struct FnCx {
    pub module: ModuleId,
    pub locals: Vec<ir::LocalInfo>,
    pub scopes: Vec<Vec<(String, Binding, Span)>>,
    /// Where each name was bound, in the order of binding: `(scope, entry)` positions in
    /// `scopes`. A position goes stale when its scope is popped, so each is checked before use;
    /// the latest one still holding the name is the innermost binding. Scanning every binding
    /// in scope for each name instead made a function of n locals cost n² to check (10,000
    /// `let`s took 4 s in a debug build, 40,000 took 50 s).
    by_name: HashMap<String, Vec<(u32, u32)>>,
    /// The positions of the dim, rest and model bindings, in the order of binding (`env_of`).
    non_locals: Vec<(u32, u32)>,
    pub ret: Option<Type>,
    pub in_init: bool,
    pub func: Option<crate::types::FuncId>,
    pub depth: usize,
    /// The flags of the enclosing loops whose bodies `break` or `continue`, innermost last.
    pub loops: Vec<jumps::LoopFlags>,
}

impl FnCx {
    pub fn new(module: ModuleId) -> FnCx {
        FnCx {
            module,
            locals: vec![],
            scopes: vec![vec![]],
            by_name: HashMap::new(),
            non_locals: vec![],
            ret: None,
            in_init: false,
            func: None,
            depth: 0,
            loops: vec![],
        }
    }

    pub fn bind(&mut self, name: &str, b: Binding) {
        self.bind_at(name, b, Span::default());
    }

    pub fn bind_at(&mut self, name: &str, b: Binding, span: Span) {
        let scope = self.scopes.len() - 1;
        let entries = self.scopes.last_mut().unwrap();
        let at = (scope as u32, entries.len() as u32);
        if !matches!(b, Binding::Local(_)) {
            self.non_locals.push(at);
        }
        entries.push((name.to_string(), b, span));
        self.by_name.entry(name.to_string()).or_default().push(at);
    }

    /// The entry at a position of `by_name` or `non_locals`, if its scope is still there.
    fn entry(&self, (scope, i): (u32, u32)) -> Option<&(String, Binding, Span)> {
        self.scopes.get(scope as usize)?.get(i as usize)
    }

    pub fn lookup(&self, name: &str) -> Option<(Binding, Span)> {
        // Bindings are made in the innermost scope, so among the positions still holding the
        // name the latest is the innermost and, within its scope, the last.
        self.by_name.get(name)?.iter().rev().find_map(|&at| match self.entry(at) {
            Some((n, b, sp)) if n == name => Some((b.clone(), *sp)),
            _ => None,
        })
    }

    pub fn new_local(&mut self, c: &mut Checker, name: &str, ty: Type, mutable: bool) -> Local {
        let n = c.prog.names.intern(name);
        self.locals.push(ir::LocalInfo { name: n, ty, mutable });
        let l = Local(self.locals.len() as u32 - 1);
        self.bind(name, Binding::Local(l));
        l
    }

    /// A mutable local that no name refers to (the flags of a loop that jumps).
    pub fn new_hidden_local(&mut self, c: &mut Checker, name: &str, ty: Type) -> Local {
        let n = c.prog.names.intern(name);
        self.locals.push(ir::LocalInfo { name: n, ty, mutable: true });
        Local(self.locals.len() as u32 - 1)
    }

    /// An immutable local that no name refers to (a value the checker's lowering reads twice).
    pub fn new_temp_local(&mut self, c: &mut Checker, name: &str, ty: Type) -> Local {
        let n = c.prog.names.intern(name);
        self.locals.push(ir::LocalInfo { name: n, ty, mutable: false });
        Local(self.locals.len() as u32 - 1)
    }

    /// Every local visible now (captured by a closure created here).
    pub fn visible_locals(&self) -> Vec<Local> {
        let mut v: Vec<Local> = self
            .scopes
            .iter()
            .flat_map(|s| s.iter().filter_map(|(_, b, _)| if let Binding::Local(l) = b { Some(*l) } else { None }))
            .collect();
        v.sort();
        v.dedup();
        v
    }

    pub fn names_in_scope(&self) -> Vec<String> {
        self.scopes.iter().flat_map(|s| s.iter().map(|(n, _, _)| n.clone())).collect()
    }
}

pub(crate) fn mk(kind: ExprKind, ty: Type, span: ir::SpanId) -> ir::Expr {
    ir::Expr::new(kind, ty, span)
}

impl Checker {
    pub(crate) fn unit(&mut self, span: Span) -> ir::Expr {
        let s = self.span_id(span);
        mk(ExprKind::Tuple(vec![]), Type::unit(), s)
    }

    pub(crate) fn error_expr(&mut self, span: Span) -> ir::Expr {
        let s = self.span_id(span);
        mk(ExprKind::Tuple(vec![]), Type::Error, s)
    }

    pub(crate) fn prim(&mut self, prim: Prim, args: Vec<ir::Expr>, attrs: Attrs, ty: Type, span: Span) -> ir::Expr {
        let s = self.span_id(span);
        mk(ExprKind::Prim { prim, args, attrs: Box::new(attrs) }, ty, s)
    }

    pub(super) fn check_stmt(&mut self, cx: &mut FnCx, s: &ast::Stmt) -> Vec<Stmt> {
        match &s.kind {
            ast::StmtKind::Error => vec![],
            ast::StmtKind::Break | ast::StmtKind::Continue => self.check_jump(cx, s),
            ast::StmtKind::Expr(e) => vec![Stmt::Expr(self.check_expr(cx, e, None))],
            ast::StmtKind::Return(e) => {
                let ret = cx.ret.clone();
                let v = match e {
                    Some(e) => {
                        let v = self.check_expr(cx, e, ret.as_ref());
                        match &ret {
                            Some(t) => self.coerce_with(v, t, e.span, Code::E0316, "returned value"),
                            None => v,
                        }
                    }
                    None => self.unit(s.span),
                };
                if cx.ret.is_none() {
                    self.error(Diagnostic::error(Code::E0316, s.span, "`return` outside a function"));
                }
                let sid = self.span_id(s.span);
                vec![Stmt::Expr(mk(ExprKind::Return(Box::new(v)), Type::Error, sid))]
            }
            ast::StmtKind::Let { pat, ty, value } => {
                let mut env = self.env_of(cx);
                env.fresh = Some(vec![]);
                let ann = ty.as_ref().map(|t| self.resolve_type(cx.module, t, &mut env));
                let fresh = env.fresh.take().unwrap_or_default();
                let v = self.check_expr(cx, value, ann.as_ref());
                let (v, binds, solved) = match &ann {
                    Some(t) => self.annotated_value(cx, v, t, &fresh, value.span),
                    None => (self.materialise(v), vec![], HashMap::new()),
                };
                for (name, s) in &fresh {
                    if name != "_" {
                        let d = solved.get(s).cloned().unwrap_or_else(|| Dim::var(*s));
                        cx.bind(name, Binding::Dim(d));
                    }
                }
                // The variable has the annotation's layout; the sharding pass converts the value.
                let lty = annotated_layout(&v.ty, ann.as_ref());
                let p = self.bind_pattern(cx, pat, &lty, false);
                let rank = match &v.ty {
                    Type::Tensor(TensorTy { shape: s, .. }) => s.len(),
                    _ => 0,
                };
                match p {
                    // Run-time dims: check the loaded value's shape and bind its dims.
                    Pat::Local(l) if !binds.is_empty() => {
                        let span = v.span;
                        vec![
                            Stmt::Let { pat: Pat::Local(l), value: v },
                            Stmt::BindDims { local: l, dims: binds, rank, span },
                        ]
                    }
                    p => vec![Stmt::Let { pat: p, value: v }],
                }
            }
            ast::StmtKind::Var { name, ty, value } => {
                let mut env = self.env_of(cx);
                let ann = ty.as_ref().map(|t| self.resolve_type(cx.module, t, &mut env));
                let v = self.check_expr(cx, value, ann.as_ref());
                let v = match &ann {
                    Some(t) => self.coerce(v, t, value.span, "initial value"),
                    None => self.materialise(v),
                };
                let lty = annotated_layout(&v.ty, ann.as_ref());
                let l = cx.new_local(self, &name.name, lty.clone(), true);
                self.record_binding(name.span, &name.name, &lty);
                if let Some(f) = cx.func {
                    self.index.locals.push((name.span, f, l));
                }
                vec![Stmt::Let { pat: Pat::Local(l), value: v }]
            }
            ast::StmtKind::Assign { target, op, value } => {
                let pat = self.assign_target(cx, target);
                let tty = self.pat_type(cx, &pat);
                let v = match op {
                    None => self.check_expr(cx, value, tty.as_ref()),
                    Some(op) => {
                        let bin = ast::Expr::new(
                            ast::ExprKind::Binary(*op, Box::new(target.clone()), Box::new(value.clone())),
                            s.span,
                        );
                        self.check_expr(cx, &bin, tty.as_ref())
                    }
                };
                let v = match &tty {
                    Some(t) => self.coerce(v, t, value.span, "assigned value"),
                    None => v,
                };
                vec![Stmt::Assign { pat, value: v }]
            }
        }
    }

    fn pat_type(&self, cx: &FnCx, p: &Pat) -> Option<Type> {
        match p {
            Pat::Local(l) => Some(cx.locals[l.0 as usize].ty.clone()),
            Pat::Ignore => Some(Type::Error),
            Pat::Tuple(ps) => ps.iter().map(|p| self.pat_type(cx, p)).collect::<Option<Vec<_>>>().map(Type::Tuple),
        }
    }

    fn assign_target(&mut self, cx: &mut FnCx, t: &ast::Expr) -> Pat {
        match &t.kind {
            ast::ExprKind::Name(n) => match cx.lookup(n) {
                Some((Binding::Local(l), def)) => {
                    if !cx.locals[l.0 as usize].mutable && def == Span::default() {
                        // Parameters and loop variables are bound without a `let` span.
                        self.error(
                            Diagnostic::error(
                                Code::E0210,
                                t.span,
                                format!("cannot assign to `{n}`: it is a parameter or loop variable, not a `var`"),
                            )
                            .label("assignment to an immutable name")
                            .with_help(format!("copy it into a variable first: `var {n}2 = {n}`")),
                        );
                    } else if !cx.locals[l.0 as usize].mutable {
                        self.error(
                            Diagnostic::error(
                                Code::E0210,
                                t.span,
                                format!("cannot assign twice to `{n}`: it is a `let` binding"),
                            )
                            .label("assignment to an immutable name")
                            .with_secondary(def, "declared here with `let`")
                            .with_help(format!("declare it with `var {n} = …` to make it mutable")),
                        );
                    }
                    Pat::Local(l)
                }
                _ => {
                    self.error(
                        Diagnostic::error(Code::E0210, t.span, format!("cannot assign to `{n}`: not a local variable"))
                            .label("not a `var`"),
                    );
                    Pat::Ignore
                }
            },
            ast::ExprKind::Wild => Pat::Ignore,
            ast::ExprKind::Tuple(es) => Pat::Tuple(es.iter().map(|e| self.assign_target(cx, e)).collect()),
            ast::ExprKind::Field(_, f) => {
                self.error(
                    Diagnostic::error(
                        Code::E0210,
                        t.span,
                        format!("cannot assign to field `{}`: models are values", f.name),
                    )
                    .label("fields cannot be assigned")
                    .with_help("build a new model: with its constructor, model arithmetic or `map`"),
                );
                Pat::Ignore
            }
            _ => {
                self.error(
                    Diagnostic::error(Code::E0210, t.span, "cannot assign to this expression")
                        .label("only `var` names and tuples of them can be assigned"),
                );
                Pat::Ignore
            }
        }
    }

    pub(crate) fn bind_pattern(&mut self, cx: &mut FnCx, p: &ast::Pattern, ty: &Type, mutable: bool) -> Pat {
        match p {
            ast::Pattern::Name(n) => {
                let l = cx.new_local(self, &n.name, ty.clone(), mutable);
                if let Some(last) = cx.scopes.last_mut().and_then(|s| s.last_mut()) {
                    last.2 = n.span;
                }
                self.record_binding(n.span, &n.name, ty);
                if let Some(f) = cx.func {
                    self.index.locals.push((n.span, f, l));
                }
                Pat::Local(l)
            }
            ast::Pattern::Wild(_) => Pat::Ignore,
            ast::Pattern::Tuple(ps, span) => {
                let tys: Vec<Type> = match ty {
                    Type::Tuple(ts) if ts.len() == ps.len() => ts.clone(),
                    Type::Error => vec![Type::Error; ps.len()],
                    Type::Tuple(ts) => {
                        self.error(
                            Diagnostic::error(
                                Code::E0319,
                                *span,
                                format!("pattern has {} elements but the value is a tuple of {}", ps.len(), ts.len()),
                            )
                            .label(format!("value: {}", self.ty_str(ty))),
                        );
                        vec![Type::Error; ps.len()]
                    }
                    _ => {
                        self.error(
                            Diagnostic::error(
                                Code::E0319,
                                *span,
                                format!("cannot destructure {} with a tuple pattern", self.ty_str(ty)),
                            )
                            .label("not a tuple"),
                        );
                        vec![Type::Error; ps.len()]
                    }
                };
                Pat::Tuple(ps.iter().zip(tys.iter()).map(|(p, t)| self.bind_pattern(cx, p, t, mutable)).collect())
            }
        }
    }

    pub(crate) fn record_binding(&mut self, span: Span, name: &str, ty: &Type) {
        let s = format!("{name}: {}", self.ty_str(ty));
        self.index.types.push((span, s, Some(span)));
    }

    pub(crate) fn env_of(&self, cx: &FnCx) -> super::resolve::TyEnv {
        let mut env = super::resolve::TyEnv::default();
        // In the order of binding, which for the entries still in scope is the order of the
        // scopes (outer first), so an inner binding replaces an outer one of the same name.
        for &at in &cx.non_locals {
            match cx.entry(at) {
                Some((n, Binding::Dim(d), _)) => {
                    env.dims.insert(n.clone(), d.clone());
                }
                Some((n, Binding::Rest(r), _)) => {
                    env.rests.insert(n.clone(), *r);
                }
                Some((n, Binding::Model(v), _)) => {
                    env.models.insert(n.clone(), *v);
                }
                Some((_, Binding::Local(_), _)) | None => {}
            }
        }
        env
    }

    /// `let x: T = e`: binds fresh dims of `T` from the value's type, statically where the
    /// value's shape is known and at run time where it is not (`load`).
    fn annotated_value(
        &mut self,
        _cx: &mut FnCx,
        v: ir::Expr,
        t: &Type,
        fresh: &[(String, crate::types::Sym)],
        span: Span,
    ) -> AnnotatedValue {
        let is_load = matches!(&v.kind, ExprKind::Prim { prim: Prim::Load, .. });
        if is_load && !matches!(t, Type::Tensor(..)) {
            // Only a lone tensor's new dims are bound from what is loaded.
            let syms = t.dim_syms();
            if let Some((name, _)) = fresh.iter().find(|(_, s)| syms.contains(s)) {
                self.error(
                    Diagnostic::error(
                        Code::E0323,
                        span,
                        format!(
                            "`load` of {} needs its dims known before it runs, but `{name}` is new here",
                            self.ty_str(t)
                        ),
                    )
                    .label("loaded here")
                    .with_help("only a lone tensor binds new dims from the file: `let x: f32[N, 64] = load(\"…\")`"),
                );
            }
            return (v, vec![], HashMap::new());
        }
        if is_load {
            // The loaded value has exactly the annotated type; dims are checked when it runs.
            let mut binds = Vec::new();
            if let Type::Tensor(TensorTy { shape, .. }) = t {
                for (i, item) in shape.iter().enumerate() {
                    if let ShapeItem::Dim(d) = item {
                        let var = d.as_var().filter(|s| fresh.iter().any(|(_, f)| f == s));
                        binds.push((i, var, d.clone()));
                    }
                }
            }
            return (v, binds, HashMap::new());
        }
        if fresh.is_empty() {
            return (self.coerce(v, t, span, "value"), vec![], HashMap::new());
        }
        let generic: std::collections::HashSet<_> = fresh.iter().map(|(_, s)| *s).collect();
        let mut u = crate::types::unify::Unifier::new(&generic);
        let ok = u.ty(t, &v.ty).is_ok() && u.finish().is_ok();
        if !ok {
            return (self.coerce(v, t, span, "value"), vec![], HashMap::new());
        }
        // Fresh names now stand for the value's dims; the scope binds them to those dims (a
        // batch's run-time row count, say, whose value the run knows under the value's dim).
        let t2 = u.subst.ty(t);
        let v = self.coerce(v, &t2, span, "value");
        for (_name, s) in fresh {
            if let Some(d) = u.subst.dims.get(s) {
                self.prog.sym_names[s.0 as usize] = self.dim_str(d);
            }
        }
        (v, vec![], u.subst.dims)
    }

    pub(crate) fn check_expr(&mut self, cx: &mut FnCx, e: &ast::Expr, expected: Option<&Type>) -> ir::Expr {
        cx.depth += 1;
        let out = self.check_expr_inner(cx, e, expected);
        cx.depth -= 1;
        self.check_static_size(&out, e.span);
        out
    }

    fn check_expr_inner(&mut self, cx: &mut FnCx, e: &ast::Expr, expected: Option<&Type>) -> ir::Expr {
        use ast::ExprKind as K;
        let span = e.span;
        match &e.kind {
            K::Error => self.error_expr(span),
            K::Int(n) => {
                // A literal too large for i32 stays weak, so that the coercion reports it (after
                // `-` has been folded in: `-2147483648` fits).
                let elem = match expected {
                    Some(Type::Tensor(TensorTy { elem: Elem::T(t), shape: s, .. }))
                        if s.is_empty() && *t != ElemTy::Bool && !(*t == ElemTy::I32 && i32::try_from(*n).is_err()) =>
                    {
                        Elem::T(*t)
                    }
                    _ => Elem::WeakInt,
                };
                let s = self.span_id(span);
                mk(ExprKind::Lit(Lit::Int(*n)), Type::Tensor(TensorTy::new(elem, vec![])), s)
            }
            K::Float(f) => {
                let elem = match expected {
                    Some(Type::Tensor(TensorTy { elem: Elem::T(t), shape: s, .. })) if s.is_empty() && t.is_float() => {
                        Elem::T(*t)
                    }
                    _ => Elem::WeakFloat,
                };
                let s = self.span_id(span);
                mk(ExprKind::Lit(Lit::Float(*f)), Type::Tensor(TensorTy::new(elem, vec![])), s)
            }
            K::Bool(b) => {
                let s = self.span_id(span);
                mk(ExprKind::Lit(Lit::Bool(*b)), Type::scalar(ElemTy::Bool), s)
            }
            K::Str(v) => {
                let s = self.span_id(span);
                mk(ExprKind::Lit(Lit::Str(v.clone())), Type::Str, s)
            }
            K::Wild => {
                self.error(Diagnostic::error(Code::E0325, span, "`_` is not a value here"));
                self.error_expr(span)
            }
            K::Name(n) => self.check_name(cx, n, span),
            K::Tuple(es) => {
                let exp: Vec<Option<Type>> = match expected {
                    Some(Type::Tuple(ts)) if ts.len() == es.len() => ts.iter().cloned().map(Some).collect(),
                    _ => vec![None; es.len()],
                };
                let items: Vec<ir::Expr> =
                    es.iter().zip(exp.iter()).map(|(e, t)| self.check_expr(cx, e, t.as_ref())).collect();
                let ty = Type::Tuple(items.iter().map(|e| e.ty.clone()).collect());
                let s = self.span_id(span);
                mk(ExprKind::Tuple(items), ty, s)
            }
            K::List(es) => {
                // A tensor literal's items are checked against the rows of the tensor expected.
                let row = match expected {
                    Some(Type::Tensor(t)) if matches!(t.shape.first(), Some(ShapeItem::Dim(_))) => {
                        Some(Type::Tensor(TensorTy::new(t.elem, t.shape[1..].to_vec())))
                    }
                    _ => None,
                };
                let items: Vec<ir::Expr> = es.iter().map(|e| self.check_expr(cx, e, row.as_ref())).collect();
                self.tensor_literal(items, expected, span)
            }
            K::StackModel(..) => {
                let msg = "a stack of models is built by calling it: `[Block; L](w: ws, b: bs)`";
                self.error(Diagnostic::error(Code::E0304, span, msg).label("a type, not a value"));
                self.error_expr(span)
            }
            K::Unary(op, a) => self.check_unary(cx, *op, a, span, expected),
            K::Binary(op, a, b) => self.check_binary(cx, *op, a, b, span, expected),
            K::Call(f, args) => self.check_call(cx, f, args, span, expected),
            K::Field(base, field) => self.check_field(cx, base, field, span),
            K::TupleIndex(base, i, ispan) => {
                let b = self.check_expr(cx, base, None);
                let ty = match &b.ty {
                    Type::Tuple(ts) => match ts.get(*i as usize) {
                        Some(t) => t.clone(),
                        None => {
                            self.error(Diagnostic::error(
                                Code::E0206,
                                *ispan,
                                format!("tuple {} has no element {i}", self.ty_str(&b.ty)),
                            ));
                            Type::Error
                        }
                    },
                    Type::Error => Type::Error,
                    other => {
                        self.error(Diagnostic::error(
                            Code::E0206,
                            *ispan,
                            format!("{} is not a tuple", self.ty_str(other)),
                        ));
                        Type::Error
                    }
                };
                let s = self.span_id(span);
                mk(ExprKind::TupleGet(Box::new(b), *i as usize), ty, s)
            }
            K::Index(base, args) => self.check_index(cx, base, args, span, expected),
            K::Closure { .. } => self.make_closure(cx, e),
            K::Block(b) => self.check_block(cx, b, expected),
            K::If { cond, then, els } => {
                let c = self.check_expr(cx, cond, Some(&Type::scalar(ElemTy::Bool)));
                self.expect_bool(&c, cond.span, "`if` condition");
                let t = self.check_block(cx, then, expected);
                if jumps::ends_in_jump(then) || els.as_deref().is_some_and(jumps::expr_ends_in_jump) {
                    // A branch leaves the iteration, so the `if` is a statement: its branches'
                    // values are dropped (one whose value is used is E0327).
                    let f = match els {
                        Some(els) => self.check_expr(cx, els, None),
                        None => self.unit(span),
                    };
                    let (t, f) = (self.discard(t), self.discard(f));
                    let s = self.span_id(span);
                    return mk(
                        ExprKind::If { cond: Box::new(c), then: Box::new(t), els: Box::new(f) },
                        Type::unit(),
                        s,
                    );
                }
                let (t, f) = match els {
                    Some(els) => {
                        let exp = expected.cloned().or_else(|| (!t.ty.is_error()).then(|| t.ty.clone()));
                        let f = self.check_expr(cx, els, exp.as_ref());
                        self.join_branches(t, f, then.span, els.span)
                    }
                    None => {
                        let u = self.unit(span);
                        (t, u)
                    }
                };
                let ty = if els.is_none() {
                    Type::unit()
                } else if t.ty.is_error() {
                    f.ty.clone()
                } else {
                    t.ty.clone()
                };
                let s = self.span_id(span);
                mk(ExprKind::If { cond: Box::new(c), then: Box::new(t), els: Box::new(f) }, ty, s)
            }
            K::While { cond, body } => {
                let c = self.check_expr(cx, cond, Some(&Type::scalar(ElemTy::Bool)));
                self.expect_bool(&c, cond.span, "`while` condition");
                if jumps::body_jumps(body) {
                    let (flags, init) = self.begin_jump_loop(cx, span);
                    cx.loops.push(flags);
                    let b = self.check_block_as(cx, body, None, true);
                    cx.loops.pop();
                    let c = self.unless_broken(flags, c, cond.span);
                    let b = self.running_body(flags, vec![], b);
                    let s = self.span_id(span);
                    let lp = mk(ExprKind::While { cond: Box::new(c), body: Box::new(b) }, Type::unit(), s);
                    return self.with_init(init, lp);
                }
                let b = self.check_block_as(cx, body, None, true);
                let s = self.span_id(span);
                mk(ExprKind::While { cond: Box::new(c), body: Box::new(b) }, Type::unit(), s)
            }
            K::For { pat, iter, body } => self.check_for(cx, pat, iter, body, span),
        }
    }

    fn join_branches(&mut self, t: ir::Expr, f: ir::Expr, tspan: Span, fspan: Span) -> (ir::Expr, ir::Expr) {
        if t.ty.has_error() || f.ty.has_error() {
            return (t, f);
        }
        if let (Type::Tensor(TensorTy { elem: a, shape: sa, .. }), Type::Tensor(TensorTy { elem: b, .. })) =
            (&t.ty, &f.ty)
        {
            if a.is_weak() && b.is_weak() && a != b {
                // `if c { 1 } else { 2.5 }`: the two literals meet as a float (f32, like `2.5` alone).
                let target = Type::Tensor(TensorTy::new(Elem::T(ElemTy::F32), sa.clone()));
                if let (Ok(t2), Ok(f2)) = (self.try_coerce(t.clone(), &target), self.try_coerce(f.clone(), &target)) {
                    return (t2, f2);
                }
            }
        }
        if let (Type::Tensor(TensorTy { elem: a, .. }), Type::Tensor(TensorTy { elem: b, .. })) = (&t.ty, &f.ty) {
            if a.is_weak() && !b.is_weak() {
                let target = f.ty.clone();
                if let Ok(t2) = self.try_coerce(t.clone(), &target) {
                    return (t2, f);
                }
            }
            let _ = (a, b);
        }
        let target = t.ty.clone();
        match self.try_coerce(f, &target) {
            Ok(f) => (t, f),
            Err((f, why)) => {
                self.error(
                    Diagnostic::error(
                        Code::E0315,
                        fspan,
                        format!(
                            "`if` branches have different types: {} and {}",
                            self.ty_str(&t.ty),
                            self.ty_str(&f.ty)
                        ),
                    )
                    .label(why)
                    .with_secondary(tspan, format!("this branch is {}", self.ty_str(&t.ty))),
                );
                (t, f)
            }
        }
    }

    pub(crate) fn expect_bool(&mut self, c: &ir::Expr, span: Span, what: &str) {
        match &c.ty {
            Type::Error => {}
            Type::Tensor(TensorTy { elem: Elem::T(ElemTy::Bool), shape: s, .. }) if s.is_empty() => {}
            t => {
                let ts = self.ty_str(t);
                self.error(
                    Diagnostic::error(Code::E0314, span, format!("{what} must be a bool scalar, found {ts}"))
                        .label(format!("this is {ts}")),
                );
            }
        }
    }

    fn check_name(&mut self, cx: &mut FnCx, n: &str, span: Span) -> ir::Expr {
        match cx.lookup(n) {
            Some((Binding::Local(l), def)) => {
                let ty = cx.locals[l.0 as usize].ty.clone();
                let ts = format!("{n}: {}", self.ty_str(&ty));
                self.index.types.push((span, ts, Some(def)));
                let s = self.span_id(span);
                return mk(ExprKind::Local(l), ty, s);
            }
            Some((Binding::Dim(d), _)) => {
                let s = self.span_id(span);
                let ds = self.dim_str(&d);
                self.index.types.push((span, format!("dim {n} = {ds}"), None));
                return mk(ExprKind::DimValue(d), Type::Tensor(TensorTy::new(Elem::WeakInt, vec![])), s);
            }
            Some((Binding::Rest(_) | Binding::Model(_), _)) => {
                self.error(Diagnostic::error(Code::E0304, span, format!("`{n}` is a type, not a value")));
                return self.error_expr(span);
            }
            None => {}
        }
        match self.scopes[cx.module.0 as usize].get(n).cloned() {
            Some(
                r @ (ItemRef::Func(_) | ItemRef::Const(_) | ItemRef::Dim(_) | ItemRef::Model(_) | ItemRef::Builtin(_)),
            ) => self.item_value(cx, r, span, span),
            Some(ItemRef::Module(_)) => {
                self.error(
                    Diagnostic::error(Code::E0304, span, format!("module `{n}` is not a value"))
                        .with_help(format!("use one of its items, e.g. `{n}.name`")),
                );
                self.error_expr(span)
            }
            Some(ItemRef::Mesh(_)) => {
                self.error(Diagnostic::error(Code::E0304, span, format!("mesh `{n}` is not a value")));
                self.error_expr(span)
            }
            None => {
                if crate::ir::Prim::from_name(n).is_some_and(|p| p.class() == crate::ir::prim::Class::Unary) {
                    return self.builtin_as_closure(cx, n, span);
                }
                self.unknown_name(cx, n, span);
                self.error_expr(span)
            }
        }
    }

    /// A module-level item used as a value: a function, a constant, a dim (an integer) or a
    /// model type (the argument of `init`). `name_span` is where the name is written.
    fn item_value(&mut self, cx: &mut FnCx, r: ItemRef, span: Span, name_span: Span) -> ir::Expr {
        let s = self.span_id(span);
        match r {
            ItemRef::Func(f) => {
                let def = self.fn_sigs[f.0 as usize].span;
                self.index.types.push((name_span, self.fn_signature_str(f), Some(def)));
                mk(ExprKind::FuncRef(f), Type::Fn(FnTy::Item(f)), s)
            }
            ItemRef::Const(c) => mk(ExprKind::Const(c), self.prog.consts[c.0 as usize].ty.clone(), s),
            ItemRef::Dim(d) => mk(ExprKind::DimValue(d), Type::Tensor(TensorTy::new(Elem::WeakInt, vec![])), s),
            ItemRef::Model(id) => {
                let mut env = self.env_of(cx);
                let t = self.model_type_from_args(cx.module, id, None, &mut env, span);
                mk(ExprKind::Tuple(vec![]), Type::ModelType(Box::new(t)), s)
            }
            ItemRef::Builtin(p) => self.builtin_as_closure(cx, p.name(), span),
            ItemRef::Module(_) | ItemRef::Mesh(_) => self.error_expr(span),
        }
    }

    pub(crate) fn unknown_name(&mut self, cx: &FnCx, n: &str, span: Span) {
        if self.unresolved.contains(&(cx.module.0, n.to_string())) {
            return; // its `use` failed, and said so
        }
        let mut cands: Vec<String> = Vec::new();
        if self.suggest_budget > 0 {
            cands = cx.names_in_scope();
            cands.extend(self.scopes[cx.module.0 as usize].keys().cloned());
            cands.extend(Prim::builtin_names().iter().map(|s| s.to_string()));
        }
        let mut d =
            Diagnostic::error(Code::E0201, span, format!("unknown name `{n}`")).label("not found in this scope");
        if let Some(s) = self.suggest_budgeted(n, &cands) {
            d = d.with_help(format!("did you mean `{s}`?"));
        }
        self.error(d);
    }

    pub(crate) fn fn_signature_str(&self, f: crate::types::FuncId) -> String {
        let sig = &self.fn_sigs[f.0 as usize];
        let mut g: Vec<String> = sig.dim_names.iter().map(|(n, _)| n.clone()).collect();
        g.extend(sig.rest_names.iter().map(|(n, _)| format!("..{n}")));
        g.extend(sig.model_names.iter().map(|(n, _)| format!("{n}: Model")));
        let gs = if g.is_empty() { String::new() } else { format!("[{}]", g.join(", ")) };
        let ps: Vec<String> = sig.params.iter().map(|p| format!("{}: {}", p.name, self.ty_str(&p.ty))).collect();
        let ret = if sig.ret.is_unit() { String::new() } else { format!(" -> {}", self.ty_str(&sig.ret)) };
        format!("fn {}{gs}({}){ret}", sig.name, ps.join(", "))
    }

    /// `relu` used as a value becomes the closure `|x| relu(x)`.
    fn builtin_as_closure(&mut self, cx: &mut FnCx, n: &str, span: Span) -> ir::Expr {
        let x = ast::Ident { name: "x".to_string(), span };
        let body = ast::Expr::new(
            ast::ExprKind::Call(
                Box::new(ast::Expr::new(ast::ExprKind::Name(n.to_string()), span)),
                vec![ast::Arg { name: None, value: ast::Expr::new(ast::ExprKind::Name("x".to_string()), span) }],
            ),
            span,
        );
        let clo = ast::Expr::new(
            ast::ExprKind::Closure {
                params: vec![ast::Param { name: x, ty: None, default: None }],
                body: Box::new(body),
            },
            span,
        );
        self.make_closure(cx, &clo)
    }

    fn make_closure(&mut self, cx: &mut FnCx, e: &ast::Expr) -> ir::Expr {
        let id = ClosureId(self.closures.len() as u32);
        self.closures.push(super::ClosureDef { ast: std::rc::Rc::new(e.clone()), cx: cx.clone(), instances: vec![] });
        self.prog.closures.push(ir::ClosureInfo::default());
        let captures = cx.visible_locals();
        let s = self.span_id(e.span);
        mk(ExprKind::Closure { id, captures }, Type::Fn(FnTy::Closure(id)), s)
    }

    fn check_field(&mut self, cx: &mut FnCx, base: &ast::Expr, field: &ast::Ident, span: Span) -> ir::Expr {
        // `module.item`
        if let ast::ExprKind::Name(n) = &base.kind {
            if cx.lookup(n).is_none() {
                if let Some(ItemRef::Module(m)) = self.scopes[cx.module.0 as usize].get(n).cloned() {
                    return self.module_member(cx, m, field, span);
                }
            }
        }
        let b = self.check_expr(cx, base, None);
        match b.ty.clone() {
            Type::Error => self.error_expr(span),
            Type::Model(id, args) => {
                let sig = &self.model_sigs[id.0 as usize];
                match sig.fields.iter().position(|(n, _, _)| *n == field.name) {
                    Some(i) => {
                        let fty = self.field_type(id, &args, i);
                        let def = self.model_sigs[id.0 as usize].fields[i].2;
                        self.index.types.push((
                            field.span,
                            format!("{}: {}", field.name, self.ty_str(&fty)),
                            Some(def),
                        ));
                        let s = self.span_id(span);
                        mk(ExprKind::Field(Box::new(b), i), fty, s)
                    }
                    None => {
                        let cands: Vec<String> = sig.fields.iter().map(|(n, _, _)| n.clone()).collect();
                        let mname = sig.name.clone();
                        let mut d = Diagnostic::error(
                            Code::E0206,
                            field.span,
                            format!("model `{mname}` has no field `{}`", field.name),
                        )
                        .label("unknown field");
                        d = match super::suggest(&field.name, cands.iter().map(String::as_str)) {
                            Some(s) => d.with_help(format!("did you mean `{s}`?")),
                            None => d.with_help(format!("its fields are {}", cands.join(", "))),
                        };
                        self.error(d);
                        self.error_expr(span)
                    }
                }
            }
            t => {
                let ts = self.ty_str(&t);
                self.error(
                    Diagnostic::error(Code::E0206, field.span, format!("{ts} has no field `{}`", field.name))
                        .label("fields exist only on models"),
                );
                self.error_expr(span)
            }
        }
    }

    /// The type of field `i` of a model type with arguments substituted.
    pub(crate) fn field_type(&self, id: crate::types::ModelId, args: &[crate::types::TypeArg], i: usize) -> Type {
        let sig = &self.model_sigs[id.0 as usize];
        let mut subst = crate::types::unify::Subst::default();
        let (mut d, mut v) = (sig.dims.iter(), sig.models.iter());
        for (a, is_model) in args.iter().zip(&sig.generic_is_model) {
            match a {
                crate::types::TypeArg::Dim(x) if !is_model => {
                    if let Some(s) = d.next() {
                        subst.dims.insert(*s, x.clone());
                    }
                }
                crate::types::TypeArg::Type(t) if *is_model => {
                    if let Some(tv) = v.next() {
                        subst.models.insert(*tv, t.clone());
                    }
                }
                _ => {}
            }
        }
        subst.ty(&sig.fields[i].1)
    }

    fn module_member(&mut self, cx: &mut FnCx, m: ModuleId, field: &ast::Ident, span: Span) -> ir::Expr {
        match self.scopes[m.0 as usize].get(&field.name).cloned() {
            Some(
                r @ (ItemRef::Func(_) | ItemRef::Const(_) | ItemRef::Dim(_) | ItemRef::Model(_) | ItemRef::Builtin(_)),
            ) => self.item_value(cx, r, span, field.span),
            _ => {
                let mname = self.module(m).name.clone();
                let cands: Vec<String> = self.scopes[m.0 as usize].keys().cloned().collect();
                let mut d = Diagnostic::error(
                    Code::E0207,
                    field.span,
                    format!("module `{mname}` has no item `{}`", field.name),
                )
                .label("not defined there");
                if let Some(s) = super::suggest(&field.name, cands.iter().map(String::as_str)) {
                    d = d.with_help(format!("did you mean `{s}`?"));
                }
                self.error(d);
                self.error_expr(span)
            }
        }
    }

    fn check_unary(&mut self, cx: &mut FnCx, op: UnOp, a: &ast::Expr, span: Span, expected: Option<&Type>) -> ir::Expr {
        let v = self.check_expr(cx, a, expected);
        let (prim, ok): (Prim, fn(Elem) -> bool) = match op {
            UnOp::Neg => (Prim::Neg, |e| e.is_numeric()),
            UnOp::Not => (Prim::Not, |e| e == Elem::T(ElemTy::Bool)),
        };
        let ty = match &v.ty {
            Type::Tensor(TensorTy { elem: e, .. }) if ok(*e) => v.ty.clone(),
            Type::Error => Type::Error,
            t if t.is_model() && op == UnOp::Neg => t.clone(),
            t => {
                let ts = self.ty_str(t);
                let sym = if op == UnOp::Neg { "-" } else { "!" };
                self.error(
                    Diagnostic::error(Code::E0318, span, format!("operator `{sym}` cannot be applied to {ts}"))
                        .label(ts),
                );
                Type::Error
            }
        };
        if let (UnOp::Neg, ExprKind::Lit(Lit::Int(n))) = (op, &v.kind) {
            let s = self.span_id(span);
            return mk(ExprKind::Lit(Lit::Int(n.wrapping_neg())), ty, s);
        }
        if let (UnOp::Neg, ExprKind::Lit(Lit::Float(f))) = (op, &v.kind) {
            let s = self.span_id(span);
            return mk(ExprKind::Lit(Lit::Float(-f)), ty, s);
        }
        self.prim(prim, vec![v], Attrs::default(), ty, span)
    }
}

/// The code for a value that does not fit an expected type.
pub(crate) fn mismatch_code(found: &Type, expected: &Type) -> Code {
    match (found, expected) {
        (Type::Tensor(TensorTy { elem: a, shape: sa, .. }), Type::Tensor(TensorTy { elem: b, shape: sb, .. })) => {
            if crate::types::unify::elem_accepts(*b, *a).is_err() {
                if a.is_weak() {
                    Code::E0322
                } else {
                    Code::E0303
                }
            } else if sa.len() != sb.len() {
                Code::E0305
            } else {
                Code::E0306
            }
        }
        _ => Code::E0304,
    }
}

/// `ty` with the layouts an annotation writes (`let y: f32[N @dp] = …`); `ty` itself without one.
fn annotated_layout(ty: &Type, ann: Option<&Type>) -> Type {
    match ann {
        Some(a) if crate::shard::has_layout(a) && crate::shard::layout(a).len() == crate::shard::layout(ty).len() => {
            crate::shard::with_layout(ty, crate::shard::layout(a))
        }
        _ => ty.clone(),
    }
}
