//! `@copies(n)` (LANGUAGE.md §8, multi-copy parallelism): a function's batch is split into `n`
//! copies. Its body is written out once per copy, on that copy of every parameter that has the
//! batch dim first (`copy_split`), and the copies' results are joined back (`copy_join`), so
//! the function computes what it computed before. The copies share no value, so once the
//! sharding pass has inserted the collectives, `shard::overlap` can run one copy's computation
//! while another copy's collectives are in flight (forward and, since reverse mode inlines the
//! body, backward). The transform runs on checked code, before the derivatives are generated.

use super::Checker;
use crate::diag::{Code, Diagnostic};
use crate::ir::walk::{remap, remap_stmt, walk_mut};
use crate::ir::{Attrs, Expr, ExprKind, Func, Local, LocalInfo, Pat, Prim, Program, Stmt};
use crate::source::Span;
use crate::types::unify::Subst;
use crate::types::{Dim, FuncId, ShapeItem, Sym, Type};
use std::collections::HashMap;

/// A function annotated `@copies(n)`.
pub(crate) struct CopiesOpt {
    pub func: FuncId,
    pub n: usize,
    pub span: Span,
}

impl Checker {
    /// Writes out the copies of every `@copies(n)` function with `n ≥ 2`; `E0214` where a
    /// function cannot be split.
    pub(crate) fn build_copies(&mut self) {
        for o in std::mem::take(&mut self.copies_opts) {
            if o.n < 2 {
                continue;
            }
            if self.pipeline_opts.iter().any(|p| p.func == o.func) {
                self.error(
                    Diagnostic::error(Code::E0214, o.span, "`@copies` and `@pipeline` cannot be put on one function")
                        .label("this annotation")
                        .with_help("a pipeline already splits its batch into microbatches; put `@copies` on the layer function"),
                );
                continue;
            }
            if o.n > MAX_COPIES {
                self.error(
                    Diagnostic::error(Code::E0214, o.span, format!("`@copies({})`: at most {MAX_COPIES} copies", o.n))
                        .label("this annotation")
                        .with_help("two to four copies are enough to overlap communication"),
                );
                continue;
            }
            match expand(&mut self.prog, o.func, o.n) {
                Ok(()) => {}
                Err(Refusal::Shape(why)) => self.error(
                    Diagnostic::error(Code::E0214, o.span, why)
                        .label("this annotation")
                        .with_help("`@copies` goes on a function whose batched parameters and results have the batch dim first, such as a block `f32[B, T, D] -> f32[B, T, D]`"),
                ),
                Err(Refusal::Mixes(why, at)) => {
                    let at = self.prog.span(at);
                    self.error(
                        Diagnostic::error(Code::E0214, at, why)
                            .label("this mixes rows of the batch")
                            .with_help("each copy sees only its rows: `@copies` goes on functions that treat the rows of their batch independently (layers, blocks), not on a loss or a batch norm"),
                    )
                }
            }
        }
    }
}

/// At most this many copies (the body is written out once per copy).
const MAX_COPIES: usize = 64;

/// Why a function cannot be split.
enum Refusal {
    /// Its parameters, result or body's constructs.
    Shape(String),
    /// An expression of its body combines rows of the batch.
    Mixes(String, crate::ir::SpanId),
}

impl From<String> for Refusal {
    fn from(s: String) -> Refusal {
        Refusal::Shape(s)
    }
}

/// The first expression of `body` that combines rows of batch dim `b`, described: one whose
/// operands have the batch dim and whose result has not (a reduction, contraction or row
/// index over it, or a call doing one), a slice of the batch dim, or the batch size read as a
/// value. A copy sees only its rows, so each would give another value.
fn mixes_rows(prog: &Program, body: &Expr, b: Sym) -> Option<(String, crate::ir::SpanId)> {
    let has = |t: &Type| t.dim_syms().contains(&b);
    let dim_has = |t: &Type, axis: usize| match t {
        Type::Tensor(tt) => matches!(tt.shape.get(axis), Some(ShapeItem::Dim(d)) if d.mentions(b)),
        _ => false,
    };
    let mut found = None;
    crate::ir::walk::walk(body, &mut |e| {
        if found.is_some() {
            return;
        }
        let what = match &e.kind {
            ExprKind::DimValue(d) if d.mentions(b) => Some("reads the batch size as a value".to_string()),
            ExprKind::Prim { prim: Prim::Slice, args, attrs } => {
                let cut = attrs.slice.iter().enumerate().any(|(ax, k)| {
                    *k != crate::ir::SliceEntry::Full && args.first().is_some_and(|a| dim_has(&a.ty, ax))
                });
                cut.then(|| "indexes or slices the batch dim".to_string())
            }
            ExprKind::Prim { prim, args, .. } if args.iter().any(|a| has(&a.ty)) && !has(&e.ty) => {
                Some(format!("`{}` combines the batch's rows (its result has no batch dim)", prim.name()))
            }
            ExprKind::Call { func, args, .. } if args.iter().any(|a| has(&a.ty)) && !has(&e.ty) => Some(format!(
                "`{}` combines the batch's rows (its result has no batch dim)",
                prog.names.get(prog.func(*func).name)
            )),
            _ => None,
        };
        if let Some(w) = what {
            found = Some((w, e.span));
        }
    });
    found
}

/// Whether `t` is a tensor with `b` as its first dim and nowhere else.
fn batch_first(t: &Type, b: Sym) -> bool {
    match t {
        Type::Tensor(tt) => {
            matches!(tt.shape.first(), Some(ShapeItem::Dim(d)) if d.as_var() == Some(b))
                && tt.shape[1..].iter().all(|i| !matches!(i, ShapeItem::Dim(d) if d.mentions(b)))
        }
        _ => false,
    }
}

/// The batch dim of `f`: the first dim of its first tensor parameter, when that is one of
/// `f`'s own dims.
fn batch_dim(f: &Func) -> Option<Sym> {
    f.params[f.n_captures..].iter().find_map(|p| match &f.locals[p.0 as usize].ty {
        Type::Tensor(tt) => match tt.shape.first() {
            Some(ShapeItem::Dim(d)) => d.as_var().filter(|s| f.dims.contains(s)),
            _ => None,
        },
        _ => None,
    })
}

/// What `@copies` splits in `f`: its batch dim, the parameters that have it first, and the
/// number of results in a tuple (`None` for one tensor); why not where it cannot.
fn splittable(prog: &Program, f: &Func) -> Result<(Sym, Vec<Local>, Option<usize>), Refusal> {
    let fname = prog.names.get(f.name).to_string();
    let local_name = |l: Local| prog.names.get(f.locals[l.0 as usize].name).to_string();
    let Some(b) = batch_dim(f) else {
        return Err(format!(
            "`@copies` splits the batch dim, but the first dim of `{fname}`'s first tensor parameter is not one of its dims (write it as a dim such as `B`)"
        )
        .into());
    };
    let bname = prog.sym_names[b.0 as usize].clone();
    let mut batched = Vec::new();
    for &p in &f.params {
        let ty = &f.locals[p.0 as usize].ty;
        if !ty.dim_syms().contains(&b) {
            continue;
        }
        if !batch_first(ty, b) {
            return Err(format!(
                "`@copies` splits `{fname}`'s batch dim `{bname}`, but parameter `{}` has it elsewhere than as its first dim",
                local_name(p)
            )
            .into());
        }
        batched.push(p);
    }
    let joins = match &f.ret {
        t if batch_first(t, b) => None,
        Type::Tuple(ts) if ts.iter().all(|t| batch_first(t, b)) => Some(ts.len()),
        _ => {
            return Err(format!(
                "`@copies` joins the copies' results along the batch dim `{bname}`, but `{fname}` returns a value without it first"
            )
            .into())
        }
    };
    let mut why = None;
    crate::ir::walk::walk(&f.body, &mut |e| {
        let what = match &e.kind {
            ExprKind::Closure { .. } => "a closure",
            ExprKind::Transform { .. } | ExprKind::Jvp { .. } | ExprKind::Vjp { .. } => "a transform",
            ExprKind::Return(_) => "a `return`",
            ExprKind::ForBatches { .. } => "a loop over batches",
            ExprKind::Block { stmts, .. } if stmts.iter().any(|s| matches!(s, Stmt::BindDims { .. })) => {
                "dims bound at run time"
            }
            _ => return,
        };
        why.get_or_insert(what);
    });
    if let Some(what) = why {
        return Err(format!("`@copies` cannot split `{fname}`: its body has {what}").into());
    }
    Ok((b, batched, joins))
}

/// Writes `@copies(n)` function `id` out once per copy (see the module comment).
fn expand(prog: &mut Program, id: FuncId, n: usize) -> Result<(), Refusal> {
    let f = prog.func(id);
    let (b, batched, joins) = splittable(prog, f)?;
    let fname = prog.names.get(f.name).to_string();
    let bname = prog.sym_names[b.0 as usize].clone();
    let mut g = f.clone();
    inline_calls(prog, &mut g);
    if let Some((what, at)) = mixes_rows(prog, &g.body, b) {
        return Err(Refusal::Mixes(
            format!("`@copies` splits `{fname}`'s batch `{bname}` into copies, but this {what}"),
            at,
        ));
    }
    let f = prog.func(id);
    let sub = Subst {
        dims: [(b, Dim::var(b).div(&Dim::constant(n as i64)).ok_or_else(|| Refusal::Shape("a batch dim".into()))?)]
            .into(),
        ..Subst::default()
    };
    let span = g.body.span;
    let old_locals = g.locals.clone();
    let (_, assigned) = crate::ir::simplify::reads_and_assigned(&g.body);
    let f_params = f.params.clone();
    let f_ret = f.ret.clone();
    let (stmts0, result0) =
        match std::mem::replace(&mut g.body, Expr::new(ExprKind::Tuple(vec![]), f.ret.clone(), span)).kind {
            ExprKind::Block { stmts, result } => (stmts, *result),
            other => (Vec::new(), Expr::new(other, f_ret.clone(), span)),
        };
    let mut stmts = Vec::new();
    let mut results = Vec::new();
    for c in 0..n {
        // Copy `c`'s locals: every local of the body again, its types over `B / n`.
        let base = g.locals.len() as u32;
        for l in &old_locals {
            g.locals.push(LocalInfo { name: l.name, ty: sub.ty(&l.ty), mutable: l.mutable });
        }
        // The shared parameters (the model) are read as they are; a copy's batched ones are
        // its parts.
        let shared: Vec<Local> =
            f_params.iter().copied().filter(|p| !batched.contains(p) && !assigned.contains(p)).collect();
        let map = |l: Local| if shared.contains(&l) { l } else { Local(base + l.0) };
        for &p in f_params.iter().filter(|p| !shared.contains(p)) {
            let value = if !batched.contains(&p) {
                Expr::new(ExprKind::Local(p), old_locals[p.0 as usize].ty.clone(), span)
            } else {
                let ty = &old_locals[p.0 as usize].ty;
                let x = Expr::new(ExprKind::Local(p), ty.clone(), span);
                let attrs = Attrs { axis: Some(0), perm: vec![c, n], ..Attrs::default() };
                Expr::new(
                    ExprKind::Prim { prim: Prim::CopySplit, args: vec![x], attrs: Box::new(attrs) },
                    sub.ty(ty),
                    span,
                )
            };
            stmts.push(Stmt::Let { pat: Pat::Local(map(p)), value });
        }
        for s in &stmts0 {
            let mut s = s.clone();
            remap_stmt(&mut s, &map, &sub);
            stmts.push(s);
        }
        let mut r = result0.clone();
        remap(&mut r, &map, &sub);
        let rl = Local(g.locals.len() as u32);
        g.locals.push(LocalInfo { name: g.name, ty: r.ty.clone(), mutable: false });
        stmts.push(Stmt::Let { pat: Pat::Local(rl), value: r });
        results.push(rl);
    }
    let join = |parts: Vec<Expr>, ty: Type| {
        let attrs = Attrs { axis: Some(0), ..Attrs::default() };
        Expr::new(ExprKind::Prim { prim: Prim::CopyJoin, args: parts, attrs: Box::new(attrs) }, ty, span)
    };
    let part = |l: Local, i: Option<usize>, g: &Func| {
        let t = g.locals[l.0 as usize].ty.clone();
        let x = Expr::new(ExprKind::Local(l), t.clone(), span);
        match (i, t) {
            (Some(i), Type::Tuple(ts)) => Expr::new(ExprKind::TupleGet(Box::new(x), i), ts[i].clone(), span),
            _ => x,
        }
    };
    let result = match (joins, &f_ret) {
        (Some(k), Type::Tuple(ts)) => {
            let items =
                (0..k).map(|i| join(results.iter().map(|l| part(*l, Some(i), &g)).collect(), ts[i].clone())).collect();
            Expr::new(ExprKind::Tuple(items), f_ret.clone(), span)
        }
        _ => join(results.iter().map(|l| part(*l, None, &g)).collect(), f_ret.clone()),
    };
    g.body = Expr::new(ExprKind::Block { stmts, result: Box::new(result) }, f_ret, span);
    prog.funcs[id.0 as usize] = g;
    Ok(())
}

/// `let r = copy_join(p0, p1, …)` followed in the same block by `let x = copy_split(r)` of
/// copy `c`: `x` is `pc` (two `@copies` blocks in a row, once reverse mode has written them
/// into one derivative, hand each copy over without joining and splitting it again).
pub(crate) fn fuse_splits(prog: &mut Program) {
    for f in prog.funcs.iter_mut() {
        let mut fused = false;
        walk_mut(&mut f.body, &mut |e| {
            let ExprKind::Block { stmts, .. } = &mut e.kind else { return };
            let mut joins: HashMap<Local, (Vec<Local>, Option<usize>)> = HashMap::new();
            for s in stmts.iter_mut() {
                let Stmt::Let { pat: Pat::Local(l), value } = s else { continue };
                let ExprKind::Prim { prim, args, attrs } = &value.kind else { continue };
                if *prim == Prim::CopyJoin {
                    let parts: Option<Vec<Local>> = args
                        .iter()
                        .map(|a| match a.kind {
                            ExprKind::Local(p) => Some(p),
                            _ => None,
                        })
                        .collect();
                    if let Some(parts) = parts {
                        joins.insert(*l, (parts, attrs.axis));
                    }
                } else if *prim == Prim::CopySplit {
                    let (c, n) = (attrs.perm.first().copied().unwrap_or(0), attrs.perm.get(1).copied().unwrap_or(0));
                    let Some(ExprKind::Local(r)) = args.first().map(|a| &a.kind) else { continue };
                    if let Some((parts, axis)) = joins.get(r) {
                        if parts.len() == n && *axis == attrs.axis && c < n {
                            *value = Expr::new(ExprKind::Local(parts[c]), value.ty.clone(), value.span);
                            fused = true;
                        }
                    }
                }
            }
        });
        if fused {
            drop_unread_joins(&mut f.body);
        }
    }
}

/// Removes `let r = copy_join(…)` whose `r` nothing reads any more.
fn drop_unread_joins(body: &mut Expr) {
    let mut read = std::collections::HashSet::new();
    crate::ir::walk::walk(body, &mut |x| match &x.kind {
        ExprKind::Local(l) => {
            read.insert(*l);
        }
        ExprKind::Closure { captures, .. } => read.extend(captures.iter().copied()),
        _ => {}
    });
    walk_mut(body, &mut |e| {
        if let ExprKind::Block { stmts, .. } = &mut e.kind {
            stmts.retain(|s| {
                !matches!(s, Stmt::Let { pat: Pat::Local(l), value: Expr { kind: ExprKind::Prim { prim: Prim::CopyJoin, .. }, .. } } if !read.contains(l))
            });
        }
    });
}

/// Calls nested this deep or deeper stay calls.
const MAX_INLINE_DEPTH: usize = 8;

/// Writes the direct calls in `g`'s body out in place, as statements of its top level, where
/// they are pure calls of plain functions (no annotation such as `@custom_vjp`, no closures,
/// transforms, effects, `return` or model type parameters): the copies' statements then sit
/// side by side, so `shard::overlap` can interleave them in a plain call as it does in the
/// derivative (which reverse mode inlines anyway).
fn inline_calls(prog: &Program, g: &mut Func) {
    let (stmts, result) = match std::mem::replace(&mut g.body.kind, ExprKind::Tuple(vec![])) {
        ExprKind::Block { stmts, result } => (stmts, *result),
        other => (Vec::new(), Expr::new(other, g.ret.clone(), g.body.span)),
    };
    let mut out = Vec::with_capacity(stmts.len());
    for mut s in stmts {
        if let Stmt::Let { value, .. } | Stmt::Expr(value) = &mut s {
            hoist_calls(prog, value, &mut g.locals, &mut out, 0);
        }
        out.push(s);
    }
    let mut result = result;
    hoist_calls(prog, &mut result, &mut g.locals, &mut out, 0);
    g.body.kind = ExprKind::Block { stmts: out, result: Box::new(result) };
}

/// Whether `f` can be written out at a call: see [`inline_calls`].
fn inlinable(f: &Func, rests: usize) -> bool {
    if !f.annotations.is_empty() || !f.models.is_empty() || f.n_captures > 0 || f.rests.len() != rests {
        return false;
    }
    let mut ok = true;
    crate::ir::walk::walk(&f.body, &mut |e| match &e.kind {
        ExprKind::Closure { .. }
        | ExprKind::Transform { .. }
        | ExprKind::Jvp { .. }
        | ExprKind::Vjp { .. }
        | ExprKind::Return(_)
        | ExprKind::ForBatches { .. }
        | ExprKind::CallValue { .. } => ok = false,
        ExprKind::Prim { prim, .. } => ok &= !prim.has_effect(),
        ExprKind::Block { stmts, .. } => ok &= !stmts.iter().any(|s| matches!(s, Stmt::BindDims { .. })),
        _ => {}
    });
    ok
}

/// Replaces each inlinable call in `e` reached through primitives, tuples and call arguments
/// (innermost first) by a local bound, after the callee's statements, in `out`.
fn hoist_calls(prog: &Program, e: &mut Expr, locals: &mut Vec<LocalInfo>, out: &mut Vec<Stmt>, depth: usize) {
    match &mut e.kind {
        ExprKind::Prim { args, .. } | ExprKind::Tuple(args) | ExprKind::Call { args, .. } => {
            for a in args.iter_mut() {
                hoist_calls(prog, a, locals, out, depth);
            }
        }
        ExprKind::TupleGet(a, _) | ExprKind::Field(a, _) => hoist_calls(prog, a, locals, out, depth),
        _ => return,
    }
    let ExprKind::Call { func, dims, rests, args } = &mut e.kind else { return };
    let callee = prog.func(*func);
    if depth >= MAX_INLINE_DEPTH || !inlinable(callee, rests.len()) || callee.dims.len() != dims.len() {
        return;
    }
    let sub = Subst {
        dims: callee.dims.iter().copied().zip(dims.iter().cloned()).collect(),
        rests: callee.rests.iter().copied().zip(rests.iter().cloned()).collect(),
        ..Subst::default()
    };
    let base = locals.len() as u32;
    for l in &callee.locals {
        locals.push(LocalInfo { name: l.name, ty: sub.ty(&l.ty), mutable: l.mutable });
    }
    // An argument that is a local is read where the parameter is (a model keeps the layouts
    // the sharding pass gives its value); others are bound to the parameter's new local.
    let mut direct: HashMap<Local, Local> = HashMap::new();
    let (_, assigned) = crate::ir::simplify::reads_and_assigned(&callee.body);
    for (p, a) in callee.params.iter().zip(std::mem::take(args)) {
        match a.kind {
            ExprKind::Local(x) if !assigned.contains(p) => {
                direct.insert(*p, x);
            }
            _ => out.push(Stmt::Let { pat: Pat::Local(Local(base + p.0)), value: a }),
        }
    }
    let map = |l: Local| direct.get(&l).copied().unwrap_or(Local(base + l.0));
    let (stmts, result) = match &callee.body.kind {
        ExprKind::Block { stmts, result } => (stmts.clone(), (**result).clone()),
        _ => (Vec::new(), callee.body.clone()),
    };
    for mut s in stmts {
        remap_stmt(&mut s, &map, &sub);
        if let Stmt::Let { value, .. } | Stmt::Expr(value) = &mut s {
            hoist_calls(prog, value, locals, out, depth + 1);
        }
        out.push(s);
    }
    let mut r = result;
    remap(&mut r, &map, &sub);
    hoist_calls(prog, &mut r, locals, out, depth + 1);
    let t = Local(locals.len() as u32);
    locals.push(LocalInfo { name: callee.name, ty: e.ty.clone(), mutable: false });
    out.push(Stmt::Let { pat: Pat::Local(t), value: r });
    *e = Expr::new(ExprKind::Local(t), e.ty.clone(), e.span);
}
