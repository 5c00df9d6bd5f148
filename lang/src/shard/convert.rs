//! Redistributions: a value converted to the layouts another type wants (gathers, all-to-alls,
//! local slices, a partial sum reduce-scattered), models made whole field by field, and the
//! record of every collective inserted (`msl check --emit collectives`, `W0510`).

use super::{dummy, has_rest, layout, model_has_layout, strip_eq_differs, with_layout, Fcx, Inserted, LocalInfo};
use crate::diag::{Code, Diagnostic};
use crate::ir::{Attrs, Expr, ExprKind, Local, Pat, Prim, SpanId, Stmt};
use crate::types::{AxisId, Type};

impl Fcx<'_> {
    /// `e` redistributed to the layouts of `to`. `requested`: an annotation asks for it.
    pub(super) fn convert(&mut self, e: Expr, to: &Type, requested: bool) -> Expr {
        match (&e.ty, to) {
            (Type::Tensor(_), Type::Tensor(_)) => {
                if has_rest(&e.ty) {
                    return e;
                }
                let from = layout(&e.ty);
                // A `..S` shape is whole on every rank: a split value passed to one is gathered.
                let want = if has_rest(to) { vec![Vec::new(); from.len()] } else { layout(to) };
                if from == want {
                    return e;
                }
                // A whole creation that is only sliced is created as each rank's block instead
                // (a sharded `init` never holds the whole tensor; the values are the same).
                let creation = matches!(
                    &e.kind,
                    ExprKind::Prim {
                        prim: Prim::Zeros
                            | Prim::Ones
                            | Prim::Full
                            | Prim::Normal
                            | Prim::Uniform
                            | Prim::HeNormal
                            | Prim::GlorotUniform,
                        ..
                    }
                );
                if creation && from.iter().all(Vec::is_empty) {
                    let mut e = e;
                    e.ty = with_layout(&e.ty, want);
                    return e;
                }
                let mut e = self.reduce_scatter(e, &want);
                let from = layout(&e.ty);
                let mut cur = from.clone();
                for d in 0..from.len() {
                    if !from[d].is_empty() && want.get(d) != Some(&from[d]) {
                        // The split moves to another dim that wants exactly these axes and is
                        // whole so far: one all-to-all instead of a gather and a slice.
                        let to = (0..want.len()).find(|&t| t != d && want[t] == from[d] && cur[t].is_empty());
                        match to {
                            Some(t) if want[d].is_empty() => {
                                e = self.collective(Prim::AllToAll, e, Some(d), from[d].clone(), requested);
                                if let ExprKind::Prim { attrs, .. } = &mut e.kind {
                                    attrs.perm = vec![t];
                                }
                                cur[t] = std::mem::take(&mut cur[d]);
                            }
                            _ => {
                                e = self.collective(Prim::AllGather, e, Some(d), from[d].clone(), requested);
                                cur[d].clear();
                            }
                        }
                        e.ty = with_layout(&e.ty, cur.clone());
                    }
                }
                for (d, w) in want.iter().enumerate() {
                    if !w.is_empty() && cur.get(d) != Some(w) {
                        e = self.collective(Prim::LocalSlice, e, Some(d), w.clone(), true);
                        if let Some(c) = cur.get_mut(d) {
                            c.clone_from(w);
                        }
                        e.ty = with_layout(&e.ty, cur.clone());
                    }
                }
                e
            }
            (Type::Tuple(ts), Type::Tuple(us)) if ts.len() == us.len() => {
                if ts == us || !ts.iter().zip(us).any(|(a, b)| strip_eq_differs(a, b)) {
                    return e;
                }
                let us = us.clone();
                if let ExprKind::Tuple(items) = e.kind {
                    let items: Vec<Expr> =
                        items.into_iter().zip(&us).map(|(x, u)| self.convert(x, u, requested)).collect();
                    let ty = Type::Tuple(items.iter().map(|x| x.ty.clone()).collect());
                    return Expr::new(ExprKind::Tuple(items), ty, e.span);
                }
                // Bind the tuple once, then rebuild it from its converted parts.
                let span = e.span;
                let tmp = self.temp(e.ty.clone());
                let parts: Vec<Expr> = ts
                    .clone()
                    .iter()
                    .zip(&us)
                    .enumerate()
                    .map(|(i, (t, u))| {
                        let get = Expr::new(
                            ExprKind::TupleGet(Box::new(Expr::new(ExprKind::Local(tmp), e.ty.clone(), span)), i),
                            t.clone(),
                            span,
                        );
                        self.convert(get, u, requested)
                    })
                    .collect();
                let ty = Type::Tuple(parts.iter().map(|x| x.ty.clone()).collect());
                let result = Expr::new(ExprKind::Tuple(parts), ty.clone(), span);
                Expr::new(
                    ExprKind::Block {
                        stmts: vec![Stmt::Let { pat: Pat::Local(tmp), value: e }],
                        result: Box::new(result),
                    },
                    ty,
                    span,
                )
            }
            _ => e,
        }
    }

    /// A partial sum that is all-reduced and then wanted split along a dim over the same axes
    /// becomes one reduce-scatter (each rank receives only its block of the sum).
    pub(super) fn reduce_scatter(&mut self, e: Expr, want: &[Vec<AxisId>]) -> Expr {
        let ExprKind::Prim { prim: Prim::AllReduceSum, attrs, .. } = &e.kind else {
            return self.reduce_scatter_through(e, want);
        };
        let from = layout(&e.ty);
        let axes = attrs.mesh_axes.clone();
        let site = attrs.site;
        let Some(d) = (0..want.len()).find(|&d| want[d] == axes && from.get(d).is_some_and(Vec::is_empty)) else {
            return e;
        };
        let ExprKind::Prim { args, .. } = e.kind else { return e };
        let Some(inner) = args.into_iter().next() else { return dummy() };
        // The all-reduce recorded for this partial sum is replaced by the reduce-scatter.
        if let Some(i) = self.inserted.iter().rposition(|k| k.site == site) {
            self.inserted.remove(i);
        }
        let mut out = from;
        out[d].clone_from(&axes);
        let mut r = self.collective(Prim::ReduceScatter, inner, Some(d), axes, true);
        r.ty = with_layout(&r.ty, out);
        r
    }

    /// An elementwise function of a partial sum wanted split, `h @ w + b` annotated
    /// `f32[N, O @mp]` for `w: f32[D @mp, O]`: every operand is converted to its block first (the
    /// partial sum reduce-scattered, a whole operand sliced locally, a broadcast dim left whole),
    /// then the function runs on the blocks, which is the block of its value on the whole
    /// operands. Only when some operand is such a partial sum and none would need a message of
    /// its own; otherwise the value is all-reduced first, as before.
    fn reduce_scatter_through(&mut self, e: Expr, want: &[Vec<AxisId>]) -> Expr {
        let ExprKind::Prim { prim, args, .. } = &e.kind else { return e };
        if !prim.is_elementwise() || layout(&e.ty).len() != want.len() || layout(&e.ty).iter().any(|l| !l.is_empty()) {
            return e;
        }
        if has_rest(&e.ty) {
            return e;
        }
        let mut targets = Vec::new();
        let mut partial = false;
        for a in args {
            let Some(t) = operand_want(&a.ty, want) else { return e };
            if reduce_scatters(a, &t) {
                partial = true;
            } else {
                // Anything already split must be split as wanted: no message but slices.
                let from = layout(&a.ty);
                if from.iter().zip(&t).any(|(f, w)| !f.is_empty() && f != w) {
                    return e;
                }
            }
            targets.push(t);
        }
        if !partial {
            return e;
        }
        let mut e = e;
        if let ExprKind::Prim { args, .. } = &mut e.kind {
            let taken = std::mem::take(args);
            *args = taken
                .into_iter()
                .zip(targets)
                .map(|(a, t)| {
                    let to = with_layout(&a.ty, t);
                    self.convert(a, &to, true)
                })
                .collect();
        }
        e.ty = with_layout(&e.ty, want.to_vec());
        e
    }

    /// A model value with every field whole (for `print`, `save`, `params`): built field by
    /// field from gathered fields. Models of a type parameter stay as they are.
    pub(super) fn replicate_model(&mut self, e: Expr) -> Expr {
        let Type::Model(id, args) = e.ty.clone() else { return e };
        let model = self.prog.model(id);
        if !model_has_layout(self.prog, id) {
            return e;
        }
        let span = e.span;
        let subst = model.arg_subst(&args);
        let tmp = self.temp(e.ty.clone());
        let mut fields = Vec::new();
        for (i, f) in model.fields.iter().enumerate() {
            let fty = crate::ir::Model::field_ty(&subst, f);
            let get = Expr::new(
                ExprKind::Field(Box::new(Expr::new(ExprKind::Local(tmp), e.ty.clone(), span)), i),
                fty.clone(),
                span,
            );
            let whole = if matches!(fty, Type::Model(..)) {
                self.replicate_model(get)
            } else {
                self.convert(get, &fty.replicated(), true)
            };
            fields.push(whole);
        }
        let ty = e.ty.clone();
        let build = Expr::new(ExprKind::ModelBuild { fields }, ty.clone(), span);
        Expr::new(
            ExprKind::Block { stmts: vec![Stmt::Let { pat: Pat::Local(tmp), value: e }], result: Box::new(build) },
            ty,
            span,
        )
    }

    pub(super) fn temp(&mut self, ty: Type) -> Local {
        self.locals.push(LocalInfo { name: crate::ir::Name(0), ty, mutable: false });
        Local(self.locals.len() as u32 - 1)
    }

    /// Wraps `e` in a collective over `axes` (on dim `dim` for gathers and slices).
    pub(super) fn collective(
        &mut self,
        p: Prim,
        e: Expr,
        dim: Option<usize>,
        axes: Vec<AxisId>,
        requested: bool,
    ) -> Expr {
        let span = e.span;
        let ty = e.ty.clone();
        let mut site = 0;
        if p != Prim::LocalSlice {
            self.site += 1;
            site = self.site;
            if self.emit {
                self.record(site, p, &ty, &axes, span, requested);
            }
        }
        let attrs = Attrs { axis: dim, mesh_axes: axes, site, ..Attrs::default() };
        Expr::new(ExprKind::Prim { prim: p, args: vec![e], attrs: Box::new(attrs) }, ty, span)
    }

    pub(super) fn record(&mut self, site: u32, p: Prim, ty: &Type, axes: &[AxisId], span: SpanId, requested: bool) {
        let Type::Tensor(tt) = ty else { return };
        let elem = tt.elem.materialise();
        let bytes = super::sent_bytes(self.mesh, ty);
        let names: Vec<String> = axes.iter().map(|a| self.mesh.names[a.0 as usize].clone()).collect();
        let shape = crate::types::shape_str(&tt.shape, self.prog);
        let bytes = crate::types::dim_str(&bytes, self.prog);
        let span_v = self.prog.span(span);
        if !requested {
            let what = match p {
                Prim::AllGather => "all-gather",
                Prim::AllReduceSum | Prim::AllReduceMean | Prim::AllReduceMax | Prim::AllReduceMin => "all-reduce",
                Prim::ReduceScatter => "reduce-scatter",
                Prim::AllToAll => "all-to-all",
                Prim::LocalSlice => "local slice",
                crate::not_collective_prims!() => "collective",
            };
            self.warnings.push(
                Diagnostic::warning(
                    Code::W0510,
                    span_v,
                    format!(
                        "an {what} over `{}` of {}{shape} ({bytes} bytes per rank) is inserted here",
                        names.join(", "),
                        elem.name()
                    ),
                )
                .label(self.why.clone().unwrap_or_else(|| "the operands' layouts disagree".to_string()))
                .with_help("annotate the layout you want (e.g. on a `let`) or shard the operands alike"),
            );
        }
        self.inserted.push(Inserted {
            site,
            same: Vec::new(),
            span: span_v,
            prim: p,
            axes: names,
            elem: elem.name().to_string(),
            shape,
            bytes,
            requested,
        });
    }
}

/// The layout an operand of an elementwise result wanted as `want` takes; `None` for an operand
/// that is not a tensor of fixed rank within the result's.
fn operand_want(t: &Type, want: &[Vec<AxisId>]) -> Option<Vec<Vec<AxisId>>> {
    let fits = matches!(t, Type::Tensor(tt) if tt.shape.len() <= want.len()) && !has_rest(t);
    fits.then(|| super::rules::operand_layout(t, want))
}

/// Whether converting `e` to the layout `want` reduce-scatters a partial sum: `e` is one whose
/// axes `want` splits a whole dim over, or an elementwise function of one (`relu(h @ w + b)`).
fn reduce_scatters(e: &Expr, want: &[Vec<AxisId>]) -> bool {
    let ExprKind::Prim { prim, args, attrs } = &e.kind else { return false };
    let from = layout(&e.ty);
    if *prim == Prim::AllReduceSum {
        return (0..want.len()).any(|d| want[d] == attrs.mesh_axes && from.get(d).is_some_and(Vec::is_empty));
    }
    if !prim.is_elementwise() || from.iter().any(|l| !l.is_empty()) {
        return false;
    }
    !has_rest(&e.ty) && args.iter().any(|a| operand_want(&a.ty, want).is_some_and(|t| reduce_scatters(a, &t)))
}
