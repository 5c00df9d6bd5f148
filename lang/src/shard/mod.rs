//! Sharding: propagates layouts over the typed IR after autodiff and inserts the collectives
//! that make each rank's blocks compute what one process computes (`spec/sharding.md`).
//!
//! Layouts are written on parameters, results, model fields and `let` annotations; every other
//! value's layout is inferred by one rule per primitive (`rules.rs`). A parameter whose type
//! names no axis is layout-polymorphic: it takes the layout its callers pass (a whole-program
//! fixpoint; callers that disagree make it replicated). Derivative code is an ordinary function
//! by now, so the data-parallel gradient all-reduce comes out of the rule for `@`.

mod convert;
mod mono;
pub mod overlap;
mod rules;
pub mod schedule;
pub mod verify;
pub mod zero;

use crate::diag::Diagnostic;
use crate::dist::Mesh;
use crate::ir::{Expr, ExprKind, FnTarget, Func, LocalInfo, Pat, Prim, Program, SpanId, Stmt};
use crate::types::{AxisId, Elem, Layout, ShapeItem, TensorTy, Type};
use std::collections::HashMap;

/// One collective the pass inserted.
#[derive(Clone, Debug)]
pub struct Inserted {
    /// Its number (`Attrs::site`), from 1 in the order the pass inserted them.
    pub site: u32,
    /// The numbers of the same collective at the same place elsewhere (in a derivative's
    /// forward pass, which replays its function's operations at their locations), listed once.
    pub same: Vec<u32>,
    pub span: crate::source::Span,
    pub prim: Prim,
    pub axes: Vec<String>,
    pub elem: String,
    /// The global shape of the value communicated.
    pub shape: String,
    /// Bytes of this rank's buffer that enter the collective (symbolic where dims are).
    pub bytes: String,
    /// Asked for by an annotation (no warning) rather than a disagreement between operands.
    pub requested: bool,
}

/// What the pass did: the collectives and the `W0510` warnings for unrequested ones.
#[derive(Clone, Debug, Default)]
pub struct Report {
    pub collectives: Vec<Inserted>,
    pub warnings: Vec<Diagnostic>,
    /// Functions left as they were: a `@pipeline` function and its derivatives, which never run
    /// whole (the pipeline driver runs their pieces). Their layouts are not a rank's blocks.
    pub unpartitioned: Vec<crate::types::FuncId>,
}

impl Report {
    /// Keeps only the collectives whose numbers `prog` still holds (a later pass may merge two
    /// into one, `overlap::merge_sums`).
    pub fn retain_present(&mut self, prog: &Program) {
        let mut present = std::collections::HashSet::new();
        for f in &prog.funcs {
            crate::ir::walk::walk(&f.body, &mut |e| {
                if let ExprKind::Prim { attrs, .. } = &e.kind {
                    if attrs.site > 0 {
                        present.insert(attrs.site);
                    }
                }
            });
        }
        self.collectives.retain_mut(|k| {
            let sites: Vec<u32> =
                std::iter::once(k.site).chain(k.same.iter().copied()).filter(|s| present.contains(s)).collect();
            let Some((first, rest)) = sites.split_first() else { return false };
            k.site = *first;
            k.same = rest.to_vec();
            true
        });
    }
}

/// What is known about a parameter's layout from the calls seen so far.
#[derive(Clone, Debug, PartialEq)]
enum Lat {
    Unknown,
    Known(Type),
    /// Written in the signature (or forced replicated): never joined.
    Fixed(Type),
}

struct State {
    /// The parameters of each function as a value (what calls through `grad`, closures and
    /// function values see): joined over the calls seen.
    params: Vec<Vec<Lat>>,
    rets: Vec<Option<Type>>,
    /// Copies of functions for the layouts their direct calls pass (like a template per
    /// argument type): the copy `specs[i]` becomes function `funcs.len() + i`.
    specs: Vec<Spec>,
    spec_index: HashMap<(crate::types::FuncId, String), usize>,
    n_funcs: usize,
}

struct Spec {
    base: usize,
    params: Vec<Type>,
    ret: Option<Type>,
}

/// The type of every local of every function of `prog` as the pass infers it (layouts
/// included), for the editor's hover and inlay hints; `None` without a mesh.
pub fn inferred_locals(prog: &Program) -> Option<Vec<Vec<Type>>> {
    Mesh::of(prog)?;
    let n = prog.funcs.len();
    let mut p = prog.clone();
    run(&mut p);
    Some(p.funcs[..n].iter().map(|f| f.locals.iter().map(|l| l.ty.clone()).collect()).collect())
}

/// Partitions every function of `prog` for its mesh. Does nothing without a mesh.
pub fn run(prog: &mut Program) -> Report {
    let Some(mesh) = Mesh::of(prog) else { return Report::default() };
    mono::run(prog);
    let mut pristine: Vec<Func> = prog.funcs.clone();
    let dynamic = pristine.iter().any(|f| has_dynamic_call(&f.body));
    let mut st = State {
        params: pristine
            .iter()
            .map(|f| {
                f.params
                    .iter()
                    .enumerate()
                    .map(|(i, p)| {
                        let t = &f.locals[p.0 as usize].ty;
                        if has_layout(t) {
                            Lat::Fixed(t.clone())
                        } else if i < f.n_captures {
                            Lat::Unknown
                        } else if f.n_captures > 0 {
                            // Closures are applied by `map` and dynamic calls to whole values.
                            Lat::Fixed(t.replicated())
                        } else {
                            Lat::Unknown
                        }
                    })
                    .collect()
            })
            .collect(),
        rets: vec![None; pristine.len()],
        specs: Vec::new(),
        spec_index: HashMap::new(),
        n_funcs: pristine.len(),
    };
    if dynamic {
        // A function value called where the callee is known only at run time receives
        // replicated arguments; so does every function that can be such a value.
        for f in pristine.iter() {
            walk_refs(&f.body, &mut |t| {
                if let Some(g) = t {
                    for p in st.params[g.0 as usize].iter_mut() {
                        if let Lat::Unknown = p {
                            *p = Lat::Fixed(Type::Error);
                        }
                    }
                }
            });
        }
    }
    // `vjp(f, x)` applies `f` to whole primals and keeps them for its pullback, which is called
    // later as a value: both take whole parameters.
    let mut vjps = Vec::new();
    for f in pristine.iter() {
        crate::ir::walk::walk(&f.body, &mut |e| {
            if let ExprKind::Vjp { target, .. } = &e.kind {
                if let Some(g) = crate::ir::derived::target_func(prog, target) {
                    vjps.push(g);
                    if let Some(pb) = prog.derived.funcs.get(&(g, crate::ir::derived::Mode::Pullback)) {
                        vjps.push(*pb);
                    }
                }
            }
        });
    }
    for g in vjps {
        for p in st.params[g.0 as usize].iter_mut() {
            if !matches!(p, Lat::Fixed(t) if has_layout(t)) {
                *p = Lat::Fixed(Type::Error);
            }
        }
    }
    fixpoint(prog, &mesh, &mut st, &pristine);
    if pipeline_params(prog, &mesh, &mut st, &mut pristine) {
        fixpoint(prog, &mesh, &mut st, &pristine);
    }
    let mut report = Report::default();
    let mut site = 0;
    let mut out = Vec::with_capacity(pristine.len() + st.specs.len());
    // A `@pipeline` function (and its derivatives) never runs whole: the pipeline driver runs
    // its pieces, which are partitioned like any function.
    let whole: std::collections::HashSet<usize> = prog
        .pipelines
        .iter()
        .flat_map(|p| {
            let derived = prog.derived.funcs.iter().filter(move |((f, _), _)| *f == p.func).map(|(_, d)| *d);
            let twins = derived.clone().filter_map(|d| prog.derived.twins.get(&d).copied());
            std::iter::once(p.func).chain(derived).chain(twins).map(|f| f.0 as usize)
        })
        .collect();
    for i in 0..pristine.len() + st.specs.len() {
        let (base, params) = match i.checked_sub(pristine.len()) {
            None => (i, None),
            Some(j) => (st.specs[j].base, Some(st.specs[j].params.clone())),
        };
        let f = &pristine[base];
        if whole.contains(&base) {
            report.unpartitioned.push(crate::types::FuncId(i as u32));
            out.push(f.clone());
            continue;
        }
        let mut cx = Fcx::new(prog, &mesh, &st, f, base, params, true);
        cx.site = site;
        let mut func = f.clone();
        func.body = cx.take_body();
        site = cx.site;
        func.ret = cx.ret.clone().unwrap_or_else(|| func.ret.clone());
        func.locals = std::mem::take(&mut cx.locals);
        report.collectives.append(&mut cx.inserted);
        report.warnings.append(&mut cx.warnings);
        out.push(func);
    }
    prog.funcs = out;
    for (j, sp) in st.specs.iter().enumerate() {
        let base = crate::types::FuncId(sp.base as u32);
        // A copy of a pipelined function for its call's layouts is the same pipeline.
        if let Some(p) = prog.pipelines.iter().find(|p| p.func == base).cloned() {
            let func = crate::types::FuncId((st.n_funcs + j) as u32);
            prog.pipelines.push(crate::ir::Pipeline { func, ..p });
        }
        if let Some(r) = prog.derived.residuals.get(&base).cloned() {
            prog.derived.residuals.insert(crate::types::FuncId((st.n_funcs + j) as u32), r);
        }
    }
    report.collectives.sort_by_key(|c| (c.span.file, c.span.start));
    report.collectives.dedup_by(|a, b| {
        let same = a.span == b.span && a.prim == b.prim && a.shape == b.shape && a.axes == b.axes;
        if same {
            b.same.push(a.site);
        }
        same
    });
    // In source order, once each: copies of one function for different layouts (or a
    // derived function and its twin) may insert the same collective at the same site.
    report.warnings.sort_by(|a, b| {
        let key = |w: &Diagnostic| (w.primary.span.file, w.primary.span.start, w.primary.span.end);
        key(a)
            .cmp(&key(b))
            .then_with(|| a.message.cmp(&b.message))
            .then_with(|| a.primary.message.cmp(&b.primary.message))
    });
    report.warnings.dedup();
    report
}

/// The layout a parameter takes for callers that pass `a` and `b`: a dim split by one and whole
/// in the other stays split (the whole caller slices it for free). `None` when two callers
/// split a dim differently: the parameter is then whole for good.
fn join(a: &Type, b: &Type) -> Option<Type> {
    match (a, b) {
        (Type::Tensor(_), Type::Tensor(_)) => {
            let (la, lb) = (layout(a), layout(b));
            let mut out = Vec::with_capacity(la.len());
            for (x, y) in la.iter().zip(&lb) {
                out.push(match (x.is_empty(), y.is_empty()) {
                    _ if x == y => x.clone(),
                    (true, _) => y.clone(),
                    (_, true) => x.clone(),
                    _ => return None,
                });
            }
            let mut l = out;
            rules::unique(&mut l);
            Some(with_layout(a, l))
        }
        (Type::Tuple(xs), Type::Tuple(ys)) if xs.len() == ys.len() => {
            Some(Type::Tuple(xs.iter().zip(ys).map(|(x, y)| join(x, y)).collect::<Option<Vec<_>>>()?))
        }
        _ if a == b => Some(a.clone()),
        _ => None,
    }
}

fn has_dynamic_call(e: &Expr) -> bool {
    let mut found = matches!(&e.kind, ExprKind::CallValue { target: FnTarget::Dynamic, .. });
    crate::ir::walk::children(e, &mut |c| found |= has_dynamic_call(c));
    found
}

/// Calls `f` with the function behind every function value the body creates.
fn walk_refs(e: &Expr, f: &mut dyn FnMut(Option<crate::types::FuncId>)) {
    match &e.kind {
        ExprKind::FuncRef(g) => f(Some(*g)),
        ExprKind::Transform { target, .. } => f(target_of(target)),
        _ => {}
    }
    crate::ir::walk::children(e, &mut |c| walk_refs(c, f));
}

fn target_of(t: &FnTarget) -> Option<crate::types::FuncId> {
    match t {
        FnTarget::Func(f) => Some(*f),
        FnTarget::Grad { inner, .. } | FnTarget::Vmap { inner, .. } => target_of(inner),
        FnTarget::Dynamic => None,
    }
}

/// Infers the parameter layouts of every function (and of its copies) until nothing changes.
fn fixpoint(prog: &Program, mesh: &Mesh, st: &mut State, pristine: &[Func]) {
    for _round in 0..16 {
        let mut changed = false;
        let mut obs = Vec::new();
        let mut calls = Vec::new();
        let n_specs = st.specs.len();
        for i in 0..pristine.len() + n_specs {
            let (base, params) = match i.checked_sub(pristine.len()) {
                None => (i, None),
                Some(j) => (st.specs[j].base, Some(st.specs[j].params.clone())),
            };
            let mut cx = Fcx::new(prog, mesh, st, &pristine[base], base, params, false);
            let ret = cx.body();
            obs.append(&mut cx.obs);
            calls.append(&mut cx.calls);
            let slot = match i.checked_sub(pristine.len()) {
                None => &mut st.rets[i],
                Some(j) => &mut st.specs[j].ret,
            };
            if slot.as_ref() != Some(&ret) {
                *slot = Some(ret);
                changed = true;
            }
        }
        for (g, args) in obs {
            for (slot, a) in st.params[g.0 as usize].iter_mut().zip(args) {
                let next = match &*slot {
                    Lat::Unknown => Lat::Known(a),
                    Lat::Known(t) if *t == a => continue,
                    Lat::Known(t) => match join(t, &a) {
                        Some(j) if j == *t => continue,
                        Some(j) => Lat::Known(j),
                        None => Lat::Fixed(t.replicated()),
                    },
                    Lat::Fixed(_) => continue,
                };
                *slot = next;
                changed = true;
            }
        }
        for (g, key, params) in calls {
            if !st.spec_index.contains_key(&(g, key.clone())) {
                st.spec_index.insert((g, key), st.specs.len());
                st.specs.push(Spec { base: g.0 as usize, params, ret: None });
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
}

/// The pieces of a `@pipeline` function (and their pullbacks) are called by the pipeline driver,
/// not by the program: they take the layouts the function's own values have there (the
/// activation's as the loss function's loop carries it, the parameters' as written).
fn pipeline_params(prog: &Program, mesh: &Mesh, st: &mut State, pristine: &mut [Func]) -> bool {
    let mode = crate::ir::derived::mode_of(usize::MAX, false);
    let (mut sets, mut rets) = (Vec::new(), Vec::new());
    for p in &prog.pipelines {
        let f = p.func.0 as usize;
        let Some(func) = pristine.get(f) else { continue };
        let mut cx = Fcx::new(prog, mesh, st, func, f, None, false);
        cx.body();
        let h = Lat::Fixed(cx.locals[p.carried.0 as usize].ty.clone());
        let lp = st.params[f].clone();
        let block = pristine[p.layer.0 as usize]
            .params
            .first()
            .map(|b| pristine[p.layer.0 as usize].locals[b.0 as usize].ty.clone());
        let layer: Vec<Lat> =
            [Lat::Fixed(block.unwrap_or(Type::Error)), h.clone()].into_iter().chain(lp[1..].iter().cloned()).collect();
        let post: Vec<Lat> = lp.iter().cloned().chain([h.clone()]).collect();
        let ret = Lat::Fixed(func.ret.replicated());
        let Lat::Fixed(hty) = h.clone() else { continue };
        // The activation's cotangent, which a pullback returns, has the activation's layout.
        let pieces = [
            (p.pre, lp.clone(), h.clone(), None),
            (p.layer, layer, h.clone(), Some(1)),
            (p.post, post, ret, Some(lp.len())),
        ];
        for (piece, params, cot, dh) in pieces {
            if let Some(pb) = prog.derived.funcs.get(&(piece, mode)) {
                let mut with_cot = params.clone();
                with_cot.push(cot);
                sets.push((pb.0 as usize, with_cot));
                if let Some(i) = dh {
                    rets.push((pb.0 as usize, i, hty.clone()));
                }
            }
            sets.push((piece.0 as usize, params));
        }
    }
    for (g, i, t) in rets {
        if let Some(Type::Tuple(items)) = pristine.get_mut(g).map(|f| &mut f.ret) {
            if let Some(slot) = items.get_mut(i) {
                *slot = t;
            }
        }
    }
    let mut changed = false;
    for (g, params) in sets {
        if let Some(slot) = st.params.get_mut(g) {
            if slot.len() == params.len() && *slot != params {
                *slot = params;
                changed = true;
            }
        }
    }
    changed
}

/// Whether `save(args…)` writes a checkpoint folder named by a literal (`save("ckpt/", s)`):
/// then each rank writes its own blocks (`interp::shards`) and the pass gathers nothing.
pub fn sharded_save(args: &[Expr]) -> bool {
    matches!(args.first().map(|a| &a.kind), Some(ExprKind::Lit(crate::ir::Lit::Str(p))) if p.ends_with('/'))
}

/// The layout of a tensor type, one entry per shape item (replicated where not written).
pub fn layout(t: &Type) -> Vec<Vec<AxisId>> {
    match t {
        Type::Tensor(TensorTy { shape, layout, .. }) => {
            let mut l = layout.0.clone();
            l.resize(shape.len(), Vec::new());
            l
        }
        _ => Vec::new(),
    }
}

/// True when a type names a mesh axis anywhere.
pub fn has_layout(t: &Type) -> bool {
    match t {
        Type::Tensor(TensorTy { layout, .. }) => layout.0.iter().any(|a| !a.is_empty()),
        Type::Tuple(ts) => ts.iter().any(has_layout),
        _ => false,
    }
}

/// `t` with the tensor layout `l` (normalised: all-replicated is the empty layout).
pub fn with_layout(t: &Type, l: Vec<Vec<AxisId>>) -> Type {
    match t {
        Type::Tensor(tt) => {
            let has_rest = tt.shape.iter().any(|i| matches!(i, ShapeItem::Rest(_)));
            let layout = if has_rest || l.iter().all(Vec::is_empty) { Layout::default() } else { Layout(l) };
            Type::Tensor(TensorTy { elem: tt.elem, shape: tt.shape.clone(), layout })
        }
        t => t.clone(),
    }
}

/// A type whose shape has a `..S` rest (its dims are not tracked one by one: replicated).
fn has_rest(t: &Type) -> bool {
    matches!(t, Type::Tensor(tt) if tt.shape.iter().any(|i| matches!(i, ShapeItem::Rest(_))))
}

/// The pass over one function body, for the current parameter layouts.
struct Fcx<'a> {
    fid: usize,
    /// The parameter types of a specialised copy (`None`: the function as a value).
    params: Option<Vec<Type>>,
    /// Direct calls seen: callee, layout key, parameter types in the callee's terms.
    calls: Vec<(crate::types::FuncId, String, Vec<Type>)>,
    prog: &'a Program,
    mesh: &'a Mesh,
    st: &'a State,
    func: &'a Func,
    pub(super) locals: Vec<LocalInfo>,
    ret: Option<Type>,
    emit: bool,
    obs: Vec<(crate::types::FuncId, Vec<Type>)>,
    inserted: Vec<Inserted>,
    warnings: Vec<Diagnostic>,
    /// The number of the last collective inserted (in the whole program, for the last pass).
    site: u32,
    /// Why the redistribution being inserted is needed, for `W0510`'s label, where that is not
    /// that the operands' layouts disagree (`rules::convert_along`).
    why: Option<String>,
}

impl<'a> Fcx<'a> {
    fn new(
        prog: &'a Program,
        mesh: &'a Mesh,
        st: &'a State,
        func: &'a Func,
        fid: usize,
        params: Option<Vec<Type>>,
        emit: bool,
    ) -> Fcx<'a> {
        let mut locals = func.locals.clone();
        // Parameters take what is known of their layouts; other locals start replicated.
        for l in locals.iter_mut() {
            l.ty = l.ty.replicated();
        }
        Fcx {
            fid,
            params,
            calls: Vec::new(),
            prog,
            mesh,
            st,
            func,
            locals,
            ret: None,
            emit,
            obs: Vec::new(),
            inserted: Vec::new(),
            warnings: Vec::new(),
            site: 0,
            why: None,
        }
    }

    fn setup_params(&mut self) {
        if let Some(ps) = self.params.clone() {
            for (p, t) in self.func.params.iter().zip(ps) {
                self.locals[p.0 as usize].ty = t;
            }
            return;
        }
        let fid = self.fid;
        let lats = self.st.params.get(fid).cloned().unwrap_or_default();
        for (i, p) in self.func.params.iter().enumerate() {
            let declared = self.func.locals[p.0 as usize].ty.clone();
            let t = match lats.get(i) {
                Some(Lat::Fixed(Type::Error)) | None | Some(Lat::Unknown) => declared.replicated(),
                // The caller's layouts on the callee's own shapes.
                Some(Lat::Known(t) | Lat::Fixed(t)) => with_shape_of(&declared.replicated(), t),
            };
            self.locals[p.0 as usize].ty = t;
        }
    }

    /// Processes the body; returns the result type (with layouts).
    fn body(&mut self) -> Type {
        let _ = self.take_body();
        self.ret.clone().unwrap_or(Type::Error)
    }

    /// The body rewritten for the parameters' layouts (`self.ret` is its result type then).
    fn take_body(&mut self) -> Expr {
        self.setup_params();
        let mut body = self.func.body.clone();
        self.expr(&mut body);
        let declared = &self.func.ret;
        let target = if has_layout(declared) {
            declared.clone()
        } else if self.func.n_captures > 0 {
            // A closure (or its derivative) is applied to whole values and gives one back.
            declared.replicated()
        } else if has_return(&body) {
            declared.replicated()
        } else {
            body.ty.clone()
        };
        if has_return(&body) {
            let t = target.clone();
            convert_returns(self, &mut body, &t);
        }
        let body = self.convert(body, &target, true);
        self.ret = Some(target);
        body
    }

    // ---------------------------------------------------------------- expressions

    fn expr(&mut self, e: &mut Expr) {
        match &mut e.kind {
            ExprKind::Lit(_) | ExprKind::Const(_) | ExprKind::DimValue(_) | ExprKind::FuncRef(_) => {
                e.ty = e.ty.replicated();
            }
            ExprKind::Local(l) => e.ty = self.locals[l.0 as usize].ty.clone(),
            ExprKind::Closure { id, captures } => {
                let tys: Vec<Type> = captures.iter().map(|l| self.locals[l.0 as usize].ty.clone()).collect();
                for (_, f) in self.prog.closures.get(id.0 as usize).map(|c| c.instances.clone()).unwrap_or_default() {
                    let mut args = tys.clone();
                    let n = self.prog.func(f).params.len();
                    while args.len() < n {
                        args.push(Type::Error);
                    }
                    self.obs.push((f, args));
                }
            }
            ExprKind::Prim { .. } => rules::prim(self, e),
            ExprKind::Call { func, args, .. } => {
                let g = *func;
                for a in args.iter_mut() {
                    self.expr(a);
                }
                let (key, ret) = self.direct_call(g, args);
                e.ty = match ret {
                    Some(t) => with_shape_of(&e.ty, &t),
                    None => e.ty.replicated(),
                };
                if self.emit {
                    if let Some(i) = self.st.spec_index.get(&(g, key)) {
                        *func = crate::types::FuncId((self.st.n_funcs + i) as u32);
                    }
                }
            }
            ExprKind::CallValue { callee, target, args } => {
                self.expr(callee);
                for a in args.iter_mut() {
                    self.expr(a);
                }
                let static_target = crate::ir::derived::target_func(self.prog, target)
                    .filter(|g| self.prog.func(*g).n_captures == 0 && !matches!(target, FnTarget::Dynamic));
                let pullback = matches!(target, FnTarget::Grad { wrt: usize::MAX, .. });
                match static_target {
                    // A pullback receives the primals its `vjp` kept before these arguments.
                    Some(g) if pullback => {
                        let offset = self.prog.func(g).params.len().saturating_sub(args.len());
                        self.fit_params(g, offset, args.iter_mut());
                        e.ty = self.ret_of(g, &e.ty);
                    }
                    Some(g) => {
                        self.call_args(g, args);
                        e.ty = self.ret_of(g, &e.ty);
                    }
                    None => {
                        self.replicate_all(args);
                        e.ty = e.ty.replicated();
                    }
                }
            }
            ExprKind::Transform { callee, .. } => {
                self.expr(callee);
            }
            ExprKind::Jvp { callee, primals, tangents, target } => {
                self.expr(callee);
                for a in primals.iter_mut().chain(tangents.iter_mut()) {
                    self.expr(a);
                }
                let jf = crate::ir::derived::target_func(self.prog, target)
                    .and_then(|f| self.prog.derived.funcs.get(&(f, crate::ir::derived::Mode::Jvp)).copied());
                match jf {
                    Some(g) => {
                        let tys: Vec<Type> = primals.iter().chain(tangents.iter()).map(|a| a.ty.clone()).collect();
                        self.obs.push((g, tys));
                        self.fit_params(g, 0, primals.iter_mut().chain(tangents.iter_mut()));
                        e.ty = self.ret_of(g, &e.ty);
                    }
                    None => {
                        self.replicate_all(primals);
                        self.replicate_all(tangents);
                        e.ty = e.ty.replicated();
                    }
                }
            }
            ExprKind::Vjp { callee, primals, target } => {
                self.expr(callee);
                for a in primals.iter_mut() {
                    self.expr(a);
                }
                // The primals take the layouts of `f`'s parameters (whole unless written): the
                // pullback gets them as they are.
                match crate::ir::derived::target_func(self.prog, target) {
                    Some(g) => {
                        self.fit_params(g, 0, primals.iter_mut());
                        if let Type::Tuple(ts) = &e.ty {
                            let mut ts = ts.clone();
                            if let Some(v) = ts.first_mut() {
                                *v = self.ret_of(g, v);
                            }
                            e.ty = Type::Tuple(ts);
                        }
                    }
                    None => {
                        self.replicate_all(primals);
                        e.ty = e.ty.replicated();
                    }
                }
            }
            ExprKind::Tuple(items) => {
                for a in items.iter_mut() {
                    self.expr(a);
                }
                e.ty = Type::Tuple(items.iter().map(|a| a.ty.clone()).collect());
            }
            ExprKind::TupleGet(a, i) => {
                self.expr(a);
                if let Type::Tuple(ts) = &a.ty {
                    if let Some(t) = ts.get(*i) {
                        e.ty = t.clone();
                    }
                }
            }
            ExprKind::Field(a, i) => {
                self.expr(a);
                if let Type::Model(id, _) = &a.ty {
                    if let Some(f) = self.prog.model(*id).fields.get(*i) {
                        e.ty = with_layout(&e.ty, layout(&f.ty));
                    }
                }
            }
            ExprKind::ModelInit { seed, .. } => self.expr(seed),
            ExprKind::ModelBuild { fields } => {
                for a in fields.iter_mut() {
                    self.expr(a);
                }
                if let Type::Model(id, _) = &e.ty {
                    let decl: Vec<Type> = self.prog.model(*id).fields.iter().map(|f| f.ty.clone()).collect();
                    for (a, d) in fields.iter_mut().zip(decl) {
                        if matches!(a.ty, Type::Tensor(_)) {
                            let want = with_layout(&a.ty, layout(&d));
                            let x = std::mem::replace(a, dummy());
                            *a = self.convert(x, &want, true);
                        }
                    }
                }
            }
            ExprKind::Block { stmts, result } => {
                let old = std::mem::take(stmts);
                let mut it = old.into_iter().peekable();
                while let Some(mut s) = it.next() {
                    if let Some(bind) = self.split_bind(&mut s, &mut it) {
                        stmts.extend(bind);
                        continue;
                    }
                    self.stmt(&mut s);
                    stmts.push(s);
                }
                self.expr(result);
                e.ty = result.ty.clone();
            }
            ExprKind::If { cond, then, els } => {
                self.expr(cond);
                self.make_whole(cond);
                self.expr(then);
                self.expr(els);
                let t = then.ty.clone();
                let x = std::mem::replace(&mut **els, dummy());
                **els = self.convert(x, &t, false);
                e.ty = t;
            }
            ExprKind::ForRange { start, end, body, .. } => {
                self.expr(start);
                self.expr(end);
                self.expr(body);
                e.ty = e.ty.replicated();
            }
            ExprKind::ForBatches { vars, data, size, shuffle, body, .. } => {
                for d in data.iter_mut() {
                    self.expr(d);
                    self.make_whole(d);
                }
                for v in vars.iter() {
                    let t = self.locals[v.0 as usize].ty.replicated();
                    self.locals[v.0 as usize].ty = t;
                }
                self.expr(size);
                if let Some(s) = shuffle {
                    self.expr(s);
                }
                self.expr(body);
                e.ty = e.ty.replicated();
            }
            ExprKind::While { cond, body } => {
                self.expr(cond);
                self.make_whole(cond);
                self.expr(body);
                e.ty = e.ty.replicated();
            }
            ExprKind::Return(a) => self.expr(a),
        }
    }

    fn stmt(&mut self, s: &mut Stmt) {
        match s {
            Stmt::Let { pat, value } => {
                self.expr(value);
                if let Pat::Local(l) = pat {
                    let declared = &self.func.locals[l.0 as usize].ty;
                    if has_layout(declared) {
                        let want = declared.clone();
                        let x = std::mem::replace(value, dummy());
                        *value = self.convert(x, &want, true);
                    }
                }
                self.bind(pat, &value.ty.clone());
            }
            Stmt::Assign { pat, value } => {
                self.expr(value);
                if let Pat::Local(l) = pat {
                    let want = self.locals[l.0 as usize].ty.clone();
                    let x = std::mem::replace(value, dummy());
                    *value = self.convert(x, &want, false);
                } else {
                    // Destructuring assignment: every part to the layout its variable has.
                    let want = self.pat_ty(pat, &value.ty);
                    let x = std::mem::replace(value, dummy());
                    *value = self.convert(x, &want, false);
                }
            }
            Stmt::BindDims { .. } => {}
            Stmt::Expr(v) => self.expr(v),
        }
    }

    /// `let x: f32[N @dp, 64] = load(f)` followed by the binding of `N`: the dims are bound from
    /// the whole value (global sizes), then `x` keeps its block.
    fn split_bind(
        &mut self,
        s: &mut Stmt,
        rest: &mut std::iter::Peekable<std::vec::IntoIter<Stmt>>,
    ) -> Option<Vec<Stmt>> {
        let Stmt::Let { pat: Pat::Local(l), value } = s else { return None };
        let l = *l;
        let declared = self.func.locals[l.0 as usize].ty.clone();
        if !has_layout(&declared) || !matches!(rest.peek(), Some(Stmt::BindDims { local, .. }) if *local == l) {
            return None;
        }
        let Some(Stmt::BindDims { dims, rank, span, .. }) = rest.next() else { return None };
        let mut value = std::mem::replace(value, dummy());
        self.expr(&mut value);
        let tmp = self.temp(value.ty.clone());
        let read = Expr::new(ExprKind::Local(tmp), value.ty.clone(), value.span);
        let block = self.convert(read, &declared, true);
        self.locals[l.0 as usize].ty = block.ty.clone();
        Some(vec![
            Stmt::Let { pat: Pat::Local(tmp), value },
            Stmt::BindDims { local: tmp, dims, rank, span },
            Stmt::Let { pat: Pat::Local(l), value: block },
        ])
    }

    fn pat_ty(&self, p: &Pat, t: &Type) -> Type {
        match (p, t) {
            (Pat::Local(l), _) => self.locals[l.0 as usize].ty.clone(),
            (Pat::Tuple(ps), Type::Tuple(ts)) => {
                Type::Tuple(ps.iter().zip(ts).map(|(p, t)| self.pat_ty(p, t)).collect())
            }
            (_, t) => t.clone(),
        }
    }

    fn bind(&mut self, p: &Pat, t: &Type) {
        match (p, t) {
            (Pat::Local(l), t) => self.locals[l.0 as usize].ty = t.clone(),
            (Pat::Tuple(ps), Type::Tuple(ts)) => {
                for (p, t) in ps.iter().zip(ts) {
                    self.bind(p, t);
                }
            }
            (Pat::Tuple(ps), _) => {
                for p in ps {
                    self.bind(p, &Type::Error);
                }
            }
            (Pat::Ignore, _) => {}
        }
    }

    /// The layout a callee's parameter `i` expects; `given` where it is still unknown.
    fn param_ty(&self, g: crate::types::FuncId, i: usize, given: &Type) -> Type {
        match self.st.params.get(g.0 as usize).and_then(|p| p.get(i)) {
            Some(Lat::Known(t)) => with_shape_of(given, t),
            Some(Lat::Fixed(Type::Error)) => given.replicated(),
            Some(Lat::Fixed(t)) => with_shape_of(given, t),
            Some(Lat::Unknown) | None => given.clone(),
        }
    }

    fn call_args(&mut self, g: crate::types::FuncId, args: &mut [Expr]) {
        self.obs.push((g, args.iter().map(|a| a.ty.clone()).collect()));
        self.fit_params(g, 0, args.iter_mut());
    }

    /// Redistributes arguments to the layouts of `g`'s parameters from `offset` on (a written
    /// layout asks for its redistribution: no warning).
    fn fit_params<'x>(&mut self, g: crate::types::FuncId, offset: usize, args: impl Iterator<Item = &'x mut Expr>) {
        for (i, a) in args.enumerate() {
            let want = self.param_ty(g, offset + i, &a.ty);
            let written = matches!(
                self.st.params.get(g.0 as usize).and_then(|p| p.get(offset + i)),
                Some(Lat::Fixed(t)) if has_layout(t)
            );
            let x = std::mem::replace(a, dummy());
            *a = self.convert(x, &want, written);
        }
    }

    /// A direct call of `g`: the arguments keep their layouts where the callee's signature names
    /// none (a copy of `g` is made for them), and take the written ones where it does. Returns
    /// the copy's key and its result type if known yet.
    fn direct_call(&mut self, g: crate::types::FuncId, args: &mut [Expr]) -> (String, Option<Type>) {
        let callee = self.prog.func(g);
        let mut params = Vec::with_capacity(args.len());
        for (i, a) in args.iter_mut().enumerate() {
            let declared = callee.params.get(i).map(|p| callee.locals[p.0 as usize].ty.clone()).unwrap_or(Type::Error);
            let written = has_layout(&declared);
            let want = if written {
                with_shape_of(&a.ty, &declared)
            } else if has_rest(&declared) {
                // A `..S` parameter is whole on every rank (its dims are not tracked one by one).
                a.ty.replicated()
            } else {
                a.ty.clone()
            };
            let x = std::mem::replace(a, dummy());
            *a = self.convert(x, &want, written);
            params.push(with_shape_of(&declared.replicated(), &want));
        }
        let key = format!("{:?}", params.iter().map(layout_key).collect::<Vec<_>>());
        self.calls.push((g, key.clone(), params));
        let ret = self.st.spec_index.get(&(g, key.clone())).and_then(|i| self.st.specs[*i].ret.clone());
        (key, ret)
    }

    fn ret_of(&self, g: crate::types::FuncId, ty: &Type) -> Type {
        match self.st.rets.get(g.0 as usize).and_then(Option::as_ref) {
            Some(t) => with_shape_of(ty, t),
            None => ty.replicated(),
        }
    }

    fn replicate_all(&mut self, args: &mut [Expr]) {
        for a in args.iter_mut() {
            self.make_whole(a);
        }
    }

    /// Makes `a` whole on every rank (a requested redistribution: I/O and unknown callees).
    fn make_whole(&mut self, a: &mut Expr) {
        let x = std::mem::replace(a, dummy());
        *a = if matches!(x.ty, Type::Model(..)) {
            self.replicate_model(x)
        } else {
            let t = x.ty.replicated();
            self.convert(x, &t, true)
        };
    }
}

/// The layouts in a type, for telling copies of a function apart.
fn layout_key(t: &Type) -> Vec<Vec<Vec<AxisId>>> {
    match t {
        Type::Tensor(_) => vec![layout(t)],
        Type::Tuple(ts) => ts.iter().flat_map(layout_key).collect(),
        _ => vec![],
    }
}

/// The layouts of `t` on the shapes of `given` (a callee's view of the caller's value).
fn with_shape_of(given: &Type, t: &Type) -> Type {
    match (given, t) {
        (Type::Tensor(_), Type::Tensor(_)) => with_layout(given, layout(t)),
        (Type::Tuple(gs), Type::Tuple(ts)) if gs.len() == ts.len() => {
            Type::Tuple(gs.iter().zip(ts).map(|(g, t)| with_shape_of(g, t)).collect())
        }
        _ => given.clone(),
    }
}

fn strip_eq_differs(a: &Type, b: &Type) -> bool {
    match (a, b) {
        (Type::Tensor(_), Type::Tensor(_)) => layout(a) != layout(b),
        (Type::Tuple(x), Type::Tuple(y)) => x.iter().zip(y).any(|(a, b)| strip_eq_differs(a, b)),
        _ => false,
    }
}

fn model_has_layout(prog: &Program, id: crate::types::ModelId) -> bool {
    prog.model(id).fields.iter().any(|f| match &f.ty {
        Type::Model(m, _) => model_has_layout(prog, *m),
        t => has_layout(t),
    })
}

/// The bytes of this rank's block of a value of type `ty` that a collective sends (booleans
/// travel as `i32`): what `--emit collectives` lists, `msl dryrun` adds up and `Spmd` counts.
pub fn sent_bytes(mesh: &Mesh, ty: &Type) -> crate::types::Dim {
    use crate::types::Dim;
    let Type::Tensor(tt) = ty else { return Dim::default() };
    let l = layout(ty);
    let mut n = Dim::constant(elem_bytes(tt.elem));
    let mut parts = 1;
    for (i, item) in tt.shape.iter().enumerate() {
        if let ShapeItem::Dim(d) = item {
            n = n.mul(d);
        }
        parts *= mesh.parts(l.get(i).map(Vec::as_slice).unwrap_or(&[]));
    }
    n.div(&Dim::constant(parts)).unwrap_or(n)
}

/// Bytes per element on the wire: `bf16`/`f16` blocks travel (and are reduced) as `f32`.
fn elem_bytes(e: Elem) -> i64 {
    match e.materialise() {
        crate::types::ElemTy::F64 => 8,
        _ => 4,
    }
}

fn has_return(e: &Expr) -> bool {
    let mut found = matches!(e.kind, ExprKind::Return(_));
    crate::ir::walk::children(e, &mut |c| found |= has_return(c));
    found
}

fn convert_returns(cx: &mut Fcx, e: &mut Expr, t: &Type) {
    if let ExprKind::Return(a) = &mut e.kind {
        let x = std::mem::replace(&mut **a, dummy());
        **a = cx.convert(x, t, true);
        return;
    }
    crate::ir::walk::children_mut(e, &mut |c| convert_returns(cx, c, t));
}

/// A placeholder while a node is moved out and back.
fn dummy() -> Expr {
    Expr {
        kind: ExprKind::Lit(crate::ir::Lit::Bool(false)),
        ty: Type::Error,
        span: SpanId(0),
        id: crate::ir::ExprId(0),
    }
}
