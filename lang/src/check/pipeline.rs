//! `@pipeline(microbatches: m, schedule: "1f1b")` (LANGUAGE.md §8): the checker cuts the loss
//! function at its layer loop into three ordinary functions (what runs before the loop, one
//! iteration of it given its layer, what runs after it), generates their pullbacks, and builds
//! and proves the schedule for the program's mesh; the interpreter's pipeline driver runs them
//! (`interp/pipeline.rs`).

use super::Checker;
use crate::diag::{Code, Diagnostic};
use crate::ir::{self, walk, Expr, ExprKind, Local, Pat, Stmt};
use crate::shard::schedule::Kind;
use crate::source::Span;
use crate::syntax::ast;
use crate::types::{FuncId, Type, TypeArg};
use std::collections::HashSet;

/// What a `@pipeline(…)` annotation asks for.
#[derive(Clone, Debug)]
pub(crate) struct PipeOpts {
    pub func: FuncId,
    pub microbatches: usize,
    pub kind: Kind,
    pub virtual_stages: usize,
    pub span: Span,
}

/// The schedule is a table of every microbatch's work on every stage, built at check time.
const MAX_MICROBATCHES: i64 = 4096;
const MAX_VIRTUAL: i64 = 64;

fn bad(span: Span, msg: impl Into<String>) -> Diagnostic {
    Diagnostic::error(Code::E0505, span, msg)
}

impl Checker {
    /// Reads `@pipeline(microbatches: m, schedule: s, virtual_stages: v)` on function `id`.
    pub(crate) fn pipeline_annotation(&mut self, id: FuncId, a: &ast::Annotation) {
        let (mut mb, mut kind, mut v) = (None, Kind::GPipe, 1usize);
        for arg in &a.args {
            let name = arg.name.as_ref().map(|n| n.name.as_str()).unwrap_or("");
            match (name, &arg.value.kind) {
                ("microbatches", ast::ExprKind::Int(k)) if (1..=MAX_MICROBATCHES).contains(k) => mb = Some(*k as usize),
                ("virtual_stages", ast::ExprKind::Int(k)) if (1..=MAX_VIRTUAL).contains(k) => v = *k as usize,
                ("schedule", ast::ExprKind::Str(s)) => match Kind::parse(s) {
                    Some(k) => kind = k,
                    None => {
                        return self.error(
                            bad(arg.value.span, format!("unknown pipeline schedule \"{s}\""))
                                .label("not a schedule")
                                .with_help("the schedules are \"gpipe\", \"1f1b\" and \"interleaved\""),
                        )
                    }
                },
                _ => {
                    return self.error(
                        bad(arg.value.span, format!("`@pipeline` takes `microbatches:` (1 to {MAX_MICROBATCHES}), `schedule:` (\"gpipe\", \"1f1b\" or \"interleaved\") and `virtual_stages:` (1 to {MAX_VIRTUAL})"))
                            .label("not one of them"),
                    )
                }
            }
        }
        let Some(microbatches) = mb else {
            return self.error(
                bad(a.span, "`@pipeline` needs the number of microbatches")
                    .with_help("write e.g. `@pipeline(microbatches: 8, schedule: \"1f1b\")`"),
            );
        };
        self.pipeline_opts.push(PipeOpts { func: id, microbatches, kind, virtual_stages: v, span: a.span });
    }

    /// Cuts every `@pipeline` function into its pieces and generates their pullbacks.
    pub(crate) fn build_pipelines(&mut self) {
        let opts = std::mem::take(&mut self.pipeline_opts);
        if opts.is_empty() {
            return;
        }
        let piped: HashSet<FuncId> = opts.iter().map(|o| o.func).collect();
        // The driver runs calls, `grad` and `value_and_grad` with respect to the model.
        let mut bad_uses = Vec::new();
        for f in &self.prog.funcs {
            walk::walk(&f.body, &mut |e| {
                let target = match &e.kind {
                    ExprKind::CallValue { target, .. } | ExprKind::Transform { target, .. } => Some(target),
                    ExprKind::Jvp { target, .. } | ExprKind::Vjp { target, .. } => Some(target),
                    _ => None,
                };
                let Some(t) = target else { return };
                let direct = matches!(t, ir::FnTarget::Func(_))
                    && !matches!(e.kind, ExprKind::Jvp { .. } | ExprKind::Vjp { .. });
                let ok = direct
                    || matches!(t, ir::FnTarget::Grad { inner, wrt: 0, .. } if matches!(**inner, ir::FnTarget::Func(_)));
                if !ok && mentions(t, &piped) {
                    bad_uses.push(e.span);
                }
            });
        }
        let mut spans: Vec<Span> = bad_uses.into_iter().map(|sp| self.prog.span(sp)).collect();
        // A call of a transform and the transform itself start at the same place: one error.
        spans.sort_by_key(|s| (s.file.0, s.start, std::cmp::Reverse(s.end)));
        spans.dedup_by_key(|s| (s.file.0, s.start));
        for span in spans {
            self.error(
                bad(span, "a `@pipeline` function is called, or differentiated with respect to its model (`grad`, `value_and_grad`)")
                    .label("another transform of it")
                    .with_help("a pipeline runs forward and reverse mode over the model; drop `@pipeline` for other transforms"),
            );
        }
        for o in opts {
            match self.split_pipeline(&o) {
                Ok(p) => self.prog.pipelines.push(p),
                Err(d) => self.error(d),
            }
        }
    }

    fn split_pipeline(&mut self, o: &PipeOpts) -> Result<ir::Pipeline, Diagnostic> {
        let f = self.prog.func(o.func).clone();
        let fspan = self.prog.span(f.span);
        let shape_help = "write the layers as one loop at the top of the body: \
                          `var h = …; for l in 0..L { h = block(m.layers[l], h) }; loss_of(h)`";
        let model = *f.params.first().ok_or_else(|| bad(fspan, "a `@pipeline` function takes the model first"))?;
        let Type::Model(mid, targs) = f.locals[model.0 as usize].ty.clone() else {
            return Err(bad(fspan, "a `@pipeline` function takes the model (with its stack of layers) first")
                .with_help(shape_help));
        };
        let ExprKind::Block { stmts, result } = &f.body.kind else {
            return Err(bad(fspan, "this `@pipeline` function has no loop over a stack of layers")
                .label("no `for l in 0..L { … m.layers[l] … }`")
                .with_help(shape_help));
        };
        // The loop over the layers: the one top-level `for` whose body indexes a stack field.
        let mut found = None;
        for (i, s) in stmts.iter().enumerate() {
            if let Stmt::Expr(Expr { kind: ExprKind::ForRange { var, body, .. }, .. }) = s {
                if let Some(k) = stack_index(body, model) {
                    if found.is_some() {
                        return Err(bad(fspan, "a `@pipeline` function runs its layers in one loop, not two")
                            .with_help(shape_help));
                    }
                    found = Some((i, *var, k));
                }
            }
        }
        let Some((at, var, field)) = found else {
            return Err(bad(fspan, "this `@pipeline` function has no loop over a stack of layers")
                .label("no `for l in 0..L { … m.layers[l] … }`")
                .with_help(shape_help));
        };
        let fty = self.field_type(mid, &targs, field);
        let Type::Model(sid, sargs) = fty else { return Err(bad(fspan, "internal: a stack field is not a stack")) };
        let inner = self.prog.model(sid).stack.ok_or_else(|| bad(fspan, "internal: not a stack"))?;
        let axis = self.prog.model(sid).stack_axis;
        let Stmt::Expr(Expr { kind: ExprKind::ForRange { start, end, body, .. }, span: lspan, .. }) = &stmts[at] else {
            return Err(bad(fspan, "internal: the layer loop moved"));
        };
        let lspan = self.prog.span(*lspan);
        let len = match sargs.first() {
            Some(TypeArg::Dim(d)) => d.clone(),
            _ => return Err(bad(lspan, "internal: a stack without a length")),
        };
        let runs_all = matches!(start.kind, ExprKind::Lit(ir::Lit::Int(0))) && ends_at(end, &len);
        if !runs_all {
            return Err(bad(lspan, "the layer loop of a `@pipeline` function runs over every layer: `for l in 0..L`")
                .label("not from 0 to the number of layers"));
        }
        // The state the loop carries from layer to layer.
        let mut assigned = Vec::new();
        walk::walk(body, &mut |e| {
            if let ExprKind::Block { stmts, .. } = &e.kind {
                for s in stmts {
                    if let Stmt::Assign { pat, .. } = s {
                        pat.each_local(&mut |l| {
                            if !assigned.contains(&l) {
                                assigned.push(l)
                            }
                        });
                    }
                }
            }
        });
        let [h] = assigned[..] else {
            return Err(bad(lspan, "the layer loop of a `@pipeline` function carries one value from layer to layer")
                .label(format!("this loop assigns {} variables", assigned.len()))
                .with_help("pass one activation through the layers (`h = block(m.layers[l], h)`); a tuple works too"));
        };
        let hty = f.locals[h.0 as usize].ty.clone();
        // One iteration, its layer given as a parameter.
        let mut lf = f.clone();
        let block = Local(lf.locals.len() as u32);
        let inner_ty = Type::Model(inner, sargs[1..].to_vec());
        lf.locals.push(ir::LocalInfo { name: self.prog.names.intern("block"), ty: inner_ty.clone(), mutable: false });
        let mut lbody = (**body).clone();
        let mut stray = None;
        replace_stack_index(&mut lbody, model, var, block, &inner_ty, &mut stray);
        if let Some(sp) = stray {
            return Err(bad(self.prog.span(sp), "a stage's layer is indexed by the loop's variable: `m.layers[l]`")
                .label("another index"));
        }
        let others: Vec<Local> = f.params.iter().copied().filter(|p| *p != model).collect();
        let mut allowed: HashSet<Local> = others.iter().copied().collect();
        allowed.extend([h, block]);
        allowed.extend(bound(&lbody));
        if let Some(l) = first_free(&lbody, &allowed) {
            let name = self.prog.names.get(f.locals[l.0 as usize].name).to_string();
            let what = if l == model {
                "the loop uses the model only as `m.layers[l]` (a stage holds only its layers)".to_string()
            } else if l == var {
                format!("the loop uses `{name}` only to index the stack")
            } else {
                format!("`{name}` is computed before the layer loop, but a stage receives only the activation")
            };
            return Err(
                bad(lspan, what).with_help("compute it inside the loop, or pass it to the function as a parameter")
            );
        }
        // The activation comes in as a parameter of its own (reverse mode gives a parameter's
        // cotangent, not that of a variable assigned over it).
        let h_in = Local(lf.locals.len() as u32);
        lf.locals.push(ir::LocalInfo { name: self.prog.names.intern("h_in"), ty: hty.clone(), mutable: false });
        lf.params = [block, h_in].into_iter().chain(others.iter().copied()).collect();
        lf.ret = hty.clone();
        let sid_body = f.body.span;
        let unit = Expr::new(ExprKind::Local(h), hty.clone(), sid_body);
        let enter = Stmt::Let { pat: Pat::Local(h), value: Expr::new(ExprKind::Local(h_in), hty.clone(), sid_body) };
        lf.body = Expr::new(
            ExprKind::Block { stmts: vec![enter, Stmt::Expr(lbody)], result: Box::new(unit.clone()) },
            hty.clone(),
            sid_body,
        );
        // Before the loop: the parameters to the first activation.
        let mut pre = f.clone();
        pre.ret = hty.clone();
        pre.body =
            Expr::new(ExprKind::Block { stmts: stmts[..at].to_vec(), result: Box::new(unit) }, hty.clone(), sid_body);
        // After the loop: the parameters and the last activation to the result.
        let mut post = f.clone();
        post.params.push(h);
        post.body = Expr::new(
            ExprKind::Block { stmts: stmts[at + 1..].to_vec(), result: result.clone() },
            f.ret.clone(),
            sid_body,
        );
        let mut allowed: HashSet<Local> = f.params.iter().copied().collect();
        allowed.insert(h);
        allowed.extend(bound(&post.body));
        if let Some(l) = first_free(&post.body, &allowed) {
            let name = self.prog.names.get(f.locals[l.0 as usize].name).to_string();
            return Err(bad(
                fspan,
                format!("`{name}` is computed before the layer loop and used after it; the last stage receives only the activation"),
            )
            .with_help("compute it after the loop, or pass it to the function as a parameter"));
        }
        for (piece, what) in [(&pre.body, "before"), (&post.body, "after")] {
            if reads_field(piece, model, field) {
                return Err(bad(fspan, format!("the stack of layers is used {what} the layer loop")).with_help(
                    "the first and last stages hold only their own layers; use the stack only inside the loop",
                ));
            }
        }
        let fname = self.prog.names.get(f.name).to_string();
        let ids = [(pre, "pre"), (lf, "layer"), (post, "post")].map(|(mut g, part)| {
            g.annotations.retain(|a| self.prog.names.get(*a) != "pipeline");
            g.name = self.prog.names.intern(&format!("{fname}.{part}"));
            self.prog.funcs.push(g);
            FuncId(self.prog.funcs.len() as u32 - 1)
        });
        let mode = crate::autodiff::mode_of(usize::MAX, false);
        // A piece that cannot be differentiated (an accuracy's `argmax`) only matters when the
        // function is: then reverse mode of the whole function reports it.
        for id in ids {
            let _ = crate::autodiff::derive(&mut self.prog, id, mode, fspan);
        }
        let span = self.span_id(o.span);
        let p = ir::Pipeline {
            func: o.func,
            pre: ids[0],
            layer: ids[1],
            post: ids[2],
            stack_field: field,
            carried: h,
            axis,
            microbatches: o.microbatches,
            schedule: o.kind,
            virtual_stages: o.virtual_stages,
            span,
        };
        // The schedule for the mesh this program declares, proved before anything runs.
        let stages = p.stages(crate::dist::Mesh::of(&self.prog).as_ref());
        let work = stages.saturating_mul(o.microbatches).saturating_mul(o.virtual_stages);
        if work > 1 << 17 {
            return Err(bad(o.span, format!(
                "this schedule has {work} forwards per step ({stages} stages, {} microbatches, {} virtual stages), more than the checker builds (131072)",
                o.microbatches, o.virtual_stages
            )));
        }
        p.proved(stages).map_err(|e| bad(o.span, e).label("this schedule"))?;
        Ok(p)
    }
}

/// Whether `end` is the stack's length `len` (as `cast(dim(L))`, `dim(L)` or a literal).
fn ends_at(end: &Expr, len: &crate::types::Dim) -> bool {
    match &end.kind {
        ExprKind::DimValue(d) => d == len,
        ExprKind::Lit(ir::Lit::Int(k)) => len.as_const() == Some(*k),
        ExprKind::Prim { args, .. } if args.len() == 1 => ends_at(&args[0], len),
        _ => false,
    }
}

/// The checker's expansion of `m.layers[i]` (see `stacks.rs`): a block binding the index,
/// then the stack field `k` of the local `model`, then the layer built from its rows.
/// Returns the field and the index expression.
fn stack_parts(e: &Expr, model: Local) -> Option<(usize, &Expr)> {
    let ExprKind::Block { stmts, result } = &e.kind else { return None };
    let [Stmt::Let { pat: Pat::Local(_), value: index }] = &stmts[..] else { return None };
    let ExprKind::Block { stmts: inner, result: build } = &result.kind else { return None };
    let [Stmt::Let { pat: Pat::Local(_), value }] = &inner[..] else { return None };
    let ExprKind::Field(base, k) = &value.kind else { return None };
    let ExprKind::Local(b) = base.kind else { return None };
    (b == model && matches!(build.kind, ExprKind::ModelBuild { .. })).then_some((*k, index))
}

/// The stack field that `e` indexes somewhere (`m.layers[…]`).
fn stack_index(e: &Expr, model: Local) -> Option<usize> {
    let mut found = None;
    walk::walk(e, &mut |x| {
        if found.is_none() {
            found = stack_parts(x, model).map(|(k, _)| k);
        }
    });
    found
}

/// Replaces every `m.layers[var]` in `e` by the local `block`; `stray` gets the span of one
/// indexed by anything else.
fn replace_stack_index(
    e: &mut Expr,
    model: Local,
    var: Local,
    block: Local,
    ty: &Type,
    stray: &mut Option<ir::SpanId>,
) {
    if let Some((_, index)) = stack_parts(e, model) {
        if !matches!(index.kind, ExprKind::Local(l) if l == var) {
            *stray = Some(e.span);
        }
        *e = Expr::new(ExprKind::Local(block), ty.clone(), e.span);
        return;
    }
    walk::children_mut(e, &mut |c| replace_stack_index(c, model, var, block, ty, stray));
}

/// Every local that `e` binds (lets, assignments' targets, loop variables).
fn bound(e: &Expr) -> HashSet<Local> {
    let mut out = HashSet::new();
    walk::walk(e, &mut |x| match &x.kind {
        ExprKind::Block { stmts, .. } => {
            for s in stmts {
                match s {
                    Stmt::Let { pat, .. } => pat.each_local(&mut |l| {
                        out.insert(l);
                    }),
                    Stmt::BindDims { local, .. } => {
                        out.insert(*local);
                    }
                    _ => {}
                }
            }
        }
        ExprKind::ForRange { var, .. } => {
            out.insert(*var);
        }
        ExprKind::ForBatches { vars, .. } => out.extend(vars.iter().copied()),
        _ => {}
    });
    out
}

/// A local that `e` reads (or a closure in it captures) outside `allowed`.
fn first_free(e: &Expr, allowed: &HashSet<Local>) -> Option<Local> {
    let mut found = None;
    walk::walk(e, &mut |x| {
        let reads: Vec<Local> = match &x.kind {
            ExprKind::Local(l) => vec![*l],
            ExprKind::Closure { captures, .. } => captures.clone(),
            _ => vec![],
        };
        for l in reads {
            if found.is_none() && !allowed.contains(&l) {
                found = Some(l);
            }
        }
    });
    found
}

/// Whether `e` reads field `k` of the local `model`.
fn reads_field(e: &Expr, model: Local, k: usize) -> bool {
    let mut found = false;
    walk::walk(e, &mut |x| {
        if let ExprKind::Field(b, j) = &x.kind {
            found |= *j == k && matches!(b.kind, ExprKind::Local(l) if l == model);
        }
    });
    found
}

/// Whether the target applies one of the functions `fs` somewhere.
fn mentions(t: &ir::FnTarget, fs: &HashSet<FuncId>) -> bool {
    match t {
        ir::FnTarget::Func(f) => fs.contains(f),
        ir::FnTarget::Grad { inner, .. } | ir::FnTarget::Vmap { inner, .. } => mentions(inner, fs),
        ir::FnTarget::Dynamic => false,
    }
}
