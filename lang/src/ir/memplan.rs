//! The static memory plan of `-O2`: which tensor values a function materialises, which buffer
//! each one lives in, and how many bytes are live at once, computed from the typed IR before
//! the run.
//!
//! The planner walks a function body in the interpreter's evaluation order. Every tensor value
//! of rank one or more that is materialised gets a buffer of `element bytes × product of its
//! symbolic dims`: results of primitives, calls (each tensor of the result, model fields
//! included), `load`s and the batches of a `batches` loop. Not materialised: scalars, the
//! interior nodes of an elementwise tree (the JIT computes the whole tree in one loop, so only
//! its root is stored), views that share their operand's storage (`reshape`, `expand_dims`,
//! `squeeze`, `stop_gradient`, a transpose read through the strides of `@`), local reads,
//! tuple and field projections, constants (computed once for the whole run) and the function's
//! parameters (the caller's buffers). A tensor whose shape is rank-polymorphic (`..S`) or a
//! model of a generic type has no static size: it is counted as unknown and left out.
//!
//! A value is live while a local holds it or while it is an operand of a consumer that has not
//! run yet. Locals die at their last read (`opt::liveness`, the walker that also gives the
//! interpreter its moves) or after the statement past which they are no longer live; values
//! born in a loop body die by the end of the iteration unless a local carried to the next
//! iteration holds them. A new value takes a free buffer of identical symbolic size if there is
//! one (the lowest numbered), otherwise a new buffer; the root of a fused tree writes into the
//! buffer of an operand of its own type that dies there, as `-O2`'s fused loops do. At every
//! allocation the planner records the set of live buffers; the peak is the largest of those
//! sets' byte totals. The plan of a function counts its own buffers only: what a callee
//! allocates is in the callee's plan.

use super::opt::{liveness, Liveness, Point};
use super::{Expr, ExprKind, FnTarget, Func, Local, Pat, Prim, Program, Stmt};
use crate::types::TensorTy;
use crate::types::{dim_str, Dim, Elem, ElemTy, FuncId, Names, ShapeItem, Sym, Type};
use std::collections::{HashMap, HashSet};

/// A function's memory plan (see the module documentation).
#[derive(Clone, Debug)]
pub struct MemPlan {
    pub func: FuncId,
    /// Each materialised value, in order of birth: its size in bytes and its buffer.
    values: Vec<(Dim, usize)>,
    /// The size in bytes of each buffer.
    buffers: Vec<Dim>,
    /// The live buffers at each allocation (sorted buffer numbers).
    points: Vec<Vec<usize>>,
    /// Values left out because their size is not static (`..S` shapes, generic models).
    unknown: usize,
    /// Every call of a function, with what is live while the callee runs.
    calls: Vec<CallPoint>,
}

/// A call (`Call` or `CallValue`) in a plan: the buffers live while the callee runs (its
/// operands evaluated, its result not yet born), and which locals hold which of them. The
/// callee's own buffers are in its plan (`msl dryrun` adds them up along the calls).
#[derive(Clone, Debug)]
pub struct CallPoint {
    pub expr: super::ExprId,
    pub live: Vec<usize>,
    pub held: Vec<(Local, Vec<usize>)>,
}

/// The value of a dim given concrete values of its variables; `None` when one is missing or the
/// value is negative or fractional.
pub fn eval(d: &Dim, dims: &dyn Fn(Sym) -> Option<i64>) -> Option<u64> {
    let v = d.subst(&|s| dims(s).map(Dim::constant));
    if v.overflows() {
        return None;
    }
    v.as_const().and_then(|x| u64::try_from(x).ok())
}

/// Bytes as a short human-readable size.
pub fn human(bytes: u64) -> String {
    const K: f64 = 1024.0;
    let b = bytes as f64;
    if b < K {
        format!("{bytes} bytes")
    } else if b < K * K {
        format!("{:.1} KiB", b / K)
    } else if b < K * K * K {
        format!("{:.1} MiB", b / (K * K))
    } else {
        format!("{:.1} GiB", b / (K * K * K))
    }
}

impl MemPlan {
    /// The number of materialised tensor values.
    pub fn n_values(&self) -> usize {
        self.values.len()
    }

    /// The number of buffers the values are assigned to.
    pub fn n_buffers(&self) -> usize {
        self.buffers.len()
    }

    /// The values that take the buffer of a value that died before them.
    pub fn n_reused(&self) -> usize {
        self.values.len() - self.buffers.len()
    }

    /// Values whose size is not static (rank-polymorphic shapes, generic models), left out.
    pub fn n_unknown(&self) -> usize {
        self.unknown
    }

    /// The size in bytes of each value, in order of birth.
    pub fn value_sizes(&self) -> impl Iterator<Item = &Dim> {
        self.values.iter().map(|(d, _)| d)
    }

    /// Every call of the function with the buffers live around it.
    pub fn calls(&self) -> &[CallPoint] {
        &self.calls
    }

    /// The bytes of buffers `bufs` given concrete dims; `None` if a needed dim is unknown.
    pub fn buffer_bytes(&self, bufs: &[usize], dims: &dyn Fn(Sym) -> Option<i64>) -> Option<u64> {
        eval(&self.point_bytes(bufs), dims)
    }

    /// The live bytes at each allocation, symbolically.
    fn point_bytes(&self, p: &[usize]) -> Dim {
        p.iter().fold(Dim::default(), |acc, &b| acc.add(&self.buffers[b]))
    }

    /// The most bytes live at once, given concrete dims; `None` if a needed dim is unknown.
    pub fn peak_bytes(&self, dims: &dyn Fn(Sym) -> Option<i64>) -> Option<u64> {
        let mut peak = 0;
        for p in &self.points {
            peak = peak.max(eval(&self.point_bytes(p), dims)?);
        }
        Some(peak)
    }

    /// The peak allocation point: its number of live buffers and their bytes as a symbolic
    /// size. Dims `dims` does not know are taken as 1024 to choose the point (the one largest
    /// for large sizes); `None` when the function allocates nothing.
    pub fn peak(&self, dims: &dyn Fn(Sym) -> Option<i64>) -> Option<(usize, Dim)> {
        let probe = |s: Sym| dims(s).or(Some(1024));
        let mut best: Option<(u64, usize)> = None;
        for (i, p) in self.points.iter().enumerate() {
            let v = eval(&self.point_bytes(p), &probe).unwrap_or(u64::MAX);
            if best.is_none_or(|(b, _)| v > b) {
                best = Some((v, i));
            }
        }
        best.map(|(_, i)| (self.points[i].len(), self.point_bytes(&self.points[i])))
    }

    /// The bytes of all values without any reuse (each value in a buffer of its own), symbolically.
    pub fn total(&self) -> Dim {
        self.values.iter().fold(Dim::default(), |acc, (d, _)| acc.add(d))
    }

    /// [`MemPlan::total`] given concrete dims.
    pub fn total_bytes(&self, dims: &dyn Fn(Sym) -> Option<i64>) -> Option<u64> {
        eval(&self.total(), dims)
    }

    /// One line: values, buffers, reuse, the peak (symbolic, and concrete where `dims` knows
    /// every dim it needs) and the bytes without reuse.
    pub fn render(&self, prog: &Program, dims: &dyn Fn(Sym) -> Option<i64>) -> String {
        let name = func_name(prog, self.func);
        let mut s = format!(
            "memory plan of `{name}`: {} tensor value{} in {} buffer{} ({} reuse{} a dead value's buffer)",
            self.n_values(),
            plural(self.n_values()),
            self.n_buffers(),
            plural(self.n_buffers()),
            self.n_reused(),
            if self.n_reused() == 1 { "s" } else { "" },
        );
        if let Some((n, bytes)) = self.peak(dims) {
            s.push_str(&format!("; peak {n} buffer{}", plural(n)));
            s.push_str(&self.size_text(prog, &bytes, dims, true));
            s.push_str(&format!(",{} without reuse", self.size_text(prog, &self.total(), dims, false)));
        }
        if self.unknown > 0 {
            s.push_str(&format!(
                "; {} value{} of no static size left out (`..S` shapes, generic models)",
                self.unknown,
                plural(self.unknown)
            ));
        }
        s
    }

    /// ` = EXPR bytes (SIZE at D = v)`, ` = SIZE` or ` = EXPR bytes` (after `peak`), or the
    /// same without the `=`.
    fn size_text(&self, prog: &Program, d: &Dim, dims: &dyn Fn(Sym) -> Option<i64>, eq: bool) -> String {
        let lead = if eq { " = " } else { " " };
        if let Some(c) = d.as_const() {
            return format!("{lead}{}", human(u64::try_from(c).unwrap_or(0)));
        }
        let expr = dim_str(d, prog);
        match eval(d, dims) {
            Some(v) => {
                let mut vars: Vec<Sym> = d.vars().collect();
                vars.sort();
                vars.dedup();
                let at: Vec<String> =
                    vars.iter().map(|&s| format!("{} = {}", prog.sym(s), dims(s).unwrap_or(0))).collect();
                format!("{lead}{expr} bytes ({} at {})", human(v), at.join(", "))
            }
            None => format!("{lead}{expr} bytes"),
        }
    }
}

/// A function's name; a generated one is named after what generated it (`value_and_grad(loss)`).
pub fn func_name(prog: &Program, f: FuncId) -> String {
    use super::derived::Mode;
    let name = |f: FuncId| prog.funcs.get(f.0 as usize).map(|x| prog.names.get(x.name).to_string()).unwrap_or_default();
    let mut derived: Vec<(&(FuncId, Mode), &FuncId)> = prog.derived.funcs.iter().filter(|(_, d)| **d == f).collect();
    derived.sort_by_key(|((from, _), _)| *from);
    match derived.first() {
        Some(((from, mode), _)) => {
            let how = match mode {
                Mode::Grad { .. } => "grad",
                Mode::ValueAndGrad { .. } => "value_and_grad",
                Mode::Pullback => "pullback",
                Mode::Jvp => "jvp",
                Mode::Vmap { .. } => "vmap",
            };
            format!("{how}({})", name(*from))
        }
        None => name(f),
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// The plan of function `f` of `prog`.
pub fn plan(prog: &Program, f: FuncId) -> MemPlan {
    plan_with(prog, f, &HashMap::new())
}

/// [`plan`] for a call that binds the function's model type parameters to `models` (`M` of
/// `adam.step[M: Model]` to the model it updates), so their values have sizes.
pub fn plan_with(prog: &Program, f: FuncId, models: &HashMap<crate::types::TyVar, Type>) -> MemPlan {
    let empty =
        MemPlan { func: f, values: Vec::new(), buffers: Vec::new(), points: Vec::new(), unknown: 0, calls: Vec::new() };
    let Some(func) = prog.funcs.get(f.0 as usize) else { return empty };
    let mut p = Planner {
        prog,
        func,
        live: liveness(func),
        bound: HashMap::new(),
        temps: Vec::new(),
        values: Vec::new(),
        buffers: Vec::new(),
        points: Vec::new(),
        unknown: 0,
        depth: 0,
        calls: Vec::new(),
        models,
    };
    p.eval(&func.body);
    MemPlan { func: f, values: p.values, buffers: p.buffers, points: p.points, unknown: p.unknown, calls: p.calls }
}

/// The functions a run of `f` may call (`f` first, then in order of discovery): direct calls,
/// named functions and closures used as values, the functions `grad`, `vmap` … generated for
/// them, and the initialisers of the models it creates.
pub fn reachable(prog: &Program, f: FuncId) -> Vec<FuncId> {
    let mut seen = vec![f];
    let mut i = 0;
    while let Some(&g) = seen.get(i) {
        i += 1;
        let Some(func) = prog.funcs.get(g.0 as usize) else { continue };
        let mut found = Vec::new();
        super::walk::walk(&func.body, &mut |e| match &e.kind {
            ExprKind::Call { func, .. } | ExprKind::FuncRef(func) => found.push(*func),
            ExprKind::CallValue { target, .. }
            | ExprKind::Transform { target, .. }
            | ExprKind::Jvp { target, .. }
            | ExprKind::Vjp { target, .. } => found.extend(targets(prog, target)),
            ExprKind::Closure { id, .. } => {
                if let Some(c) = prog.closures.get(id.0 as usize) {
                    found.extend(c.instances.iter().map(|(_, f)| *f));
                }
            }
            ExprKind::ModelInit { model, .. } => model_inits(prog, *model, &mut found, 0),
            _ => {}
        });
        for g in found {
            if !seen.contains(&g) && (g.0 as usize) < prog.funcs.len() {
                seen.push(g);
            }
        }
    }
    seen
}

/// The functions a call target names: the generated function and the one it derives from.
fn targets(prog: &Program, t: &FnTarget) -> Vec<FuncId> {
    let mut out: Vec<FuncId> = super::derived::target_func(prog, t).into_iter().collect();
    match t {
        FnTarget::Grad { inner, .. } | FnTarget::Vmap { inner, .. } => out.extend(targets(prog, inner)),
        FnTarget::Func(_) | FnTarget::Dynamic => {}
    }
    out
}

fn model_inits(prog: &Program, m: crate::types::ModelId, out: &mut Vec<FuncId>, depth: usize) {
    let Some(def) = prog.models.get(m.0 as usize) else { return };
    if depth > 16 {
        return;
    }
    for field in &def.fields {
        if let Some(f) = field.init {
            out.push(f);
        }
        if let Type::Model(inner, _) = &field.ty {
            model_inits(prog, *inner, out, depth + 1);
        }
    }
}

/// What an expression evaluates to, as far as buffers go: the values it holds, structured like
/// a tuple or model where the type is one (so projections pick the right part).
#[derive(Clone, Debug)]
enum Res {
    Leaf(Vec<usize>),
    Tuple(Vec<Res>),
}

impl Res {
    fn none() -> Res {
        Res::Leaf(Vec::new())
    }

    fn ids(&self, out: &mut Vec<usize>) {
        match self {
            Res::Leaf(v) => out.extend(v),
            Res::Tuple(rs) => rs.iter().for_each(|r| r.ids(out)),
        }
    }

    /// Part `i` of a tuple or model (the whole of anything else).
    fn get(self, i: usize) -> Res {
        match self {
            Res::Tuple(mut rs) if i < rs.len() => rs.swap_remove(i),
            Res::Tuple(_) => Res::none(),
            leaf => leaf,
        }
    }

    /// Either of two results (the branches of an `if`): one of them is held afterwards, so
    /// of two parts of the same size (`values` gives the sizes) one is kept; parts of
    /// different sizes are both kept (an over-estimate).
    fn merge(a: Res, b: Res, values: &[(Dim, usize)]) -> Res {
        let bytes = |ids: &[usize]| ids.iter().fold(Dim::default(), |acc, &v| acc.add(&values[v].0));
        match (a, b) {
            (Res::Tuple(x), Res::Tuple(y)) if x.len() == y.len() => {
                Res::Tuple(x.into_iter().zip(y).map(|(a, b)| Res::merge(a, b, values)).collect())
            }
            (Res::Leaf(x), Res::Leaf(y)) if !x.is_empty() && bytes(&x) == bytes(&y) => Res::Leaf(x),
            (a, b) => {
                let mut ids = Vec::new();
                a.ids(&mut ids);
                b.ids(&mut ids);
                ids.sort_unstable();
                ids.dedup();
                Res::Leaf(ids)
            }
        }
    }
}

struct Planner<'p> {
    prog: &'p Program,
    func: &'p Func,
    live: Liveness,
    /// The values each local holds now.
    bound: HashMap<Local, Res>,
    /// Operands held by consumers that have not run yet.
    temps: Vec<usize>,
    values: Vec<(Dim, usize)>,
    buffers: Vec<Dim>,
    points: Vec<Vec<usize>>,
    unknown: usize,
    /// Nesting of model types being sized (a guard against runaway recursion).
    depth: usize,
    calls: Vec<CallPoint>,
    /// The model type parameters bound by the call planned for ([`plan_with`]).
    models: &'p HashMap<crate::types::TyVar, Type>,
}

/// The bytes of one element of a tensor as the interpreter stores it.
fn elem_bytes(e: Elem) -> i64 {
    match e.materialise() {
        ElemTy::F32 | ElemTy::I32 => 4,
        ElemTy::Bf16 | ElemTy::F16 => 2,
        ElemTy::F64 => 8,
        ElemTy::Bool => 1,
    }
}

/// The bytes of this rank's block of a tensor of type `tt` as the interpreter stores it
/// (symbolic in its dims); `None` for a rank-polymorphic shape. A sharded program (under a
/// launcher, or `msl dryrun`) holds its blocks, so plans are per rank.
pub fn tensor_bytes(prog: &Program, tt: &TensorTy) -> Option<Dim> {
    let mut size = Dim::constant(elem_bytes(tt.elem));
    for item in &tt.shape {
        match item {
            ShapeItem::Dim(d) => size = size.mul(d),
            ShapeItem::Rest(_) => return None,
        }
    }
    if let Some(mesh) = crate::dist::Mesh::of(prog) {
        let parts: i64 = tt.layout.0.iter().map(|axes| mesh.parts(axes)).product();
        if parts > 1 {
            size = size.div(&Dim::constant(parts)).unwrap_or(size);
        }
    }
    Some(size)
}

/// A float or bool tensor type (what the JIT's fused loops compute on).
fn float_or_bool(t: &Type) -> bool {
    matches!(t, Type::Tensor(TensorTy { elem: e, .. }) if e.is_float() || *e == Elem::T(ElemTy::Bool))
}

/// An elementwise primitive over float or bool tensors: a node of a fused tree.
fn interior(e: &Expr) -> bool {
    match &e.kind {
        ExprKind::Prim { prim, args, .. } => {
            prim.is_elementwise() && float_or_bool(&e.ty) && args.iter().all(|a| float_or_bool(&a.ty))
        }
        _ => false,
    }
}

/// An interior node the JIT roots a fused tree at: one whose shape is not known to be a scalar.
fn fused_root(e: &Expr) -> bool {
    let Type::Tensor(TensorTy { shape, .. }) = &e.ty else { return false };
    let nonscalar = shape.iter().any(|i| match i {
        ShapeItem::Dim(d) => d.as_const() != Some(1),
        ShapeItem::Rest(_) => true,
    });
    nonscalar && interior(e)
}

fn rank(t: &Type) -> usize {
    match t {
        Type::Tensor(TensorTy { shape: s, .. }) => s.len(),
        _ => 0,
    }
}

impl Planner<'_> {
    /// Every value held by a local or an operand now.
    fn alive(&self) -> HashSet<usize> {
        let mut ids = self.temps.clone();
        for r in self.bound.values() {
            r.ids(&mut ids);
        }
        ids.into_iter().collect()
    }

    /// A new value of `size` bytes: in `donor`'s buffer, or a free buffer of identical size, or
    /// a new one. Records the live buffers at this point.
    fn alloc(&mut self, size: Dim, donor: Option<usize>) -> usize {
        let mut live: Vec<usize> = self.alive().iter().map(|&v| self.values[v].1).collect();
        live.sort_unstable();
        live.dedup();
        let buf = match donor {
            Some(d) => self.values[d].1,
            None => {
                match (0..self.buffers.len()).find(|b| self.buffers[*b] == size && live.binary_search(b).is_err()) {
                    Some(b) => b,
                    None => {
                        self.buffers.push(size.clone());
                        self.buffers.len() - 1
                    }
                }
            }
        };
        if let Err(i) = live.binary_search(&buf) {
            live.insert(i, buf);
        }
        self.points.push(live);
        self.values.push((size, buf));
        self.values.len() - 1
    }

    /// Holds `r` as an operand until the temporaries are truncated.
    fn hold(&mut self, r: &Res) {
        r.ids(&mut self.temps);
    }

    /// The values of a fresh result of type `ty` (each tensor of it allocated), held as
    /// temporaries while the rest is allocated.
    fn fresh(&mut self, ty: &Type) -> Res {
        let mark = self.temps.len();
        let r = self.fresh_held(ty);
        self.temps.truncate(mark);
        r
    }

    fn fresh_held(&mut self, ty: &Type) -> Res {
        match ty {
            Type::Tensor(tt) => {
                if tt.shape.is_empty() {
                    return Res::none();
                }
                let Some(size) = tensor_bytes(self.prog, tt) else {
                    self.unknown += 1;
                    return Res::none();
                };
                let id = self.alloc(size, None);
                self.temps.push(id);
                Res::Leaf(vec![id])
            }
            Type::Tuple(ts) => Res::Tuple(ts.iter().map(|t| self.fresh_held(t)).collect()),
            Type::Model(id, args) => {
                let Some(def) = self.prog.models.get(id.0 as usize) else { return Res::none() };
                if self.depth > 16 {
                    self.unknown += 1;
                    return Res::none();
                }
                let s = def.arg_subst(args);
                let fields: Vec<Type> = def.fields.iter().map(|f| super::Model::field_ty(&s, f)).collect();
                self.depth += 1;
                let r = Res::Tuple(fields.iter().map(|t| self.fresh_held(t)).collect());
                self.depth -= 1;
                r
            }
            Type::ModelVar(v) => match self.models.get(v) {
                Some(t) if self.depth <= 16 => {
                    self.depth += 1;
                    let r = self.fresh_held(t);
                    self.depth -= 1;
                    r
                }
                _ => {
                    self.unknown += 1;
                    Res::none()
                }
            },
            _ => Res::none(),
        }
    }

    /// Evaluates the operands `es` in order, then allocates a fresh result of type `ty`.
    fn consume(&mut self, es: &[&Expr], ty: &Type) -> Res {
        self.consume_at(es, ty, None)
    }

    /// [`Planner::consume`] for a call `e`, recording what is live while its callee runs.
    fn call(&mut self, e: &Expr, es: &[&Expr]) -> Res {
        self.consume_at(es, &e.ty, Some(e.id))
    }

    fn consume_at(&mut self, es: &[&Expr], ty: &Type, call: Option<super::ExprId>) -> Res {
        let mark = self.temps.len();
        for a in es {
            let r = self.eval(a);
            self.hold(&r);
        }
        if let Some(expr) = call {
            self.record_call(expr);
        }
        let r = self.fresh(ty);
        self.temps.truncate(mark);
        r
    }

    /// Records the buffers live now, and their holders, as the point of call `expr`.
    fn record_call(&mut self, expr: super::ExprId) {
        let bufs_of = |p: &Self, r: &Res| {
            let mut ids = Vec::new();
            r.ids(&mut ids);
            let mut bufs: Vec<usize> = ids.iter().map(|&v| p.values[v].1).collect();
            bufs.sort_unstable();
            bufs.dedup();
            bufs
        };
        let mut live: Vec<usize> = self.alive().iter().map(|&v| self.values[v].1).collect();
        live.sort_unstable();
        live.dedup();
        let mut held: Vec<(Local, Vec<usize>)> =
            self.bound.iter().map(|(l, r)| (*l, bufs_of(self, r))).filter(|(_, b)| !b.is_empty()).collect();
        held.sort_by_key(|(l, _)| l.0);
        self.calls.push(CallPoint { expr, live, held });
    }

    fn eval(&mut self, e: &Expr) -> Res {
        match &e.kind {
            ExprKind::Lit(_)
            | ExprKind::Const(_)
            | ExprKind::DimValue(_)
            | ExprKind::FuncRef(_)
            | ExprKind::Closure { .. } => Res::none(),
            ExprKind::Local(l) => {
                if self.live.last_reads.contains(&e.id) {
                    self.bound.remove(l).unwrap_or_else(Res::none)
                } else {
                    self.bound.get(l).cloned().unwrap_or_else(Res::none)
                }
            }
            ExprKind::Prim { prim, args, .. } => self.prim(e, *prim, args),
            ExprKind::Call { args, .. } => self.call(e, &args.iter().collect::<Vec<_>>()),
            ExprKind::CallValue { callee, args, .. } => {
                let ops: Vec<&Expr> = std::iter::once(&**callee).chain(args).collect();
                self.call(e, &ops)
            }
            ExprKind::Transform { callee, .. } => {
                self.eval(callee);
                Res::none()
            }
            ExprKind::Jvp { callee, primals, tangents, .. } => {
                let ops: Vec<&Expr> = std::iter::once(&**callee).chain(primals).chain(tangents).collect();
                self.consume(&ops, &e.ty)
            }
            ExprKind::Vjp { callee, primals, .. } => {
                let ops: Vec<&Expr> = std::iter::once(&**callee).chain(primals).collect();
                self.consume(&ops, &e.ty)
            }
            ExprKind::Tuple(items) | ExprKind::ModelBuild { fields: items } => {
                let mark = self.temps.len();
                let mut rs = Vec::with_capacity(items.len());
                for a in items {
                    let r = self.eval(a);
                    self.hold(&r);
                    rs.push(r);
                }
                self.temps.truncate(mark);
                Res::Tuple(rs)
            }
            ExprKind::TupleGet(a, i) | ExprKind::Field(a, i) => self.eval(a).get(*i),
            ExprKind::ModelInit { seed, .. } => self.consume(&[&**seed], &e.ty),
            ExprKind::Block { stmts, result } => {
                for (i, s) in stmts.iter().enumerate() {
                    self.stmt(s, Point::AfterStmt(e.id, i));
                }
                self.eval(result)
            }
            ExprKind::If { cond, then, els } => {
                self.eval(cond);
                let (bound, temps) = (self.bound.clone(), self.temps.clone());
                let rt = self.eval(then);
                let bound_then = std::mem::replace(&mut self.bound, bound);
                self.temps = temps;
                let re = self.eval(els);
                for (l, r) in bound_then {
                    let merged = match self.bound.remove(&l) {
                        Some(x) => Res::merge(x, r, &self.values),
                        None => r,
                    };
                    self.bound.insert(l, merged);
                }
                Res::merge(rt, re, &self.values)
            }
            ExprKind::ForRange { start, end, body, .. } => {
                self.eval(start);
                self.eval(end);
                self.iteration(body);
                Res::none()
            }
            ExprKind::ForBatches { vars, data, size, shuffle, body, .. } => {
                // The data stays referenced by the loop until it ends.
                let mark = self.temps.len();
                for a in data {
                    let r = self.eval(a);
                    self.hold(&r);
                }
                self.eval(size);
                if let Some(s) = shuffle {
                    self.eval(s);
                }
                for v in vars {
                    self.bound.remove(v);
                    let ty = self.local_ty(*v);
                    let r = self.fresh(&ty);
                    self.bound.insert(*v, r);
                }
                self.iteration(body);
                self.temps.truncate(mark);
                Res::none()
            }
            ExprKind::While { cond, body } => {
                self.eval(cond);
                self.iteration(body);
                Res::none()
            }
            ExprKind::Return(a) => self.eval(a),
        }
    }

    fn local_ty(&self, l: Local) -> Type {
        self.func.locals.get(l.0 as usize).map(|i| i.ty.clone()).unwrap_or(Type::unit())
    }

    /// One iteration of a loop body: what is not live at the next iteration's head dies.
    fn iteration(&mut self, body: &Expr) {
        self.eval(body);
        if let Some(set) = self.live.live_after.get(&Point::LoopEnd(body.id)) {
            self.bound.retain(|l, _| set.contains(l));
        }
    }

    fn stmt(&mut self, s: &Stmt, after: Point) {
        match s {
            Stmt::Let { pat, value } | Stmt::Assign { pat, value } => {
                let r = self.eval(value);
                pat.each_local(&mut |l| {
                    self.bound.remove(&l);
                });
                self.bind(pat, r);
            }
            Stmt::Expr(x) => {
                self.eval(x);
            }
            Stmt::BindDims { .. } => {}
        }
        if let Some(set) = self.live.live_after.get(&after) {
            self.bound.retain(|l, _| set.contains(l));
        }
    }

    fn bind(&mut self, pat: &Pat, r: Res) {
        match (pat, r) {
            (Pat::Local(l), r) => {
                self.bound.insert(*l, r);
            }
            (Pat::Ignore, _) => {}
            (Pat::Tuple(ps), Res::Tuple(rs)) if ps.len() == rs.len() => {
                for (p, r) in ps.iter().zip(rs) {
                    self.bind(p, r);
                }
            }
            (Pat::Tuple(ps), r) => {
                for p in ps {
                    self.bind(p, r.clone());
                }
            }
        }
    }

    fn prim(&mut self, e: &Expr, prim: Prim, args: &[Expr]) -> Res {
        if fused_root(e) {
            // One loop computes the whole tree: only its leaves and its root are stored.
            let mark = self.temps.len();
            let mut ops = 1;
            let mut leaves = Vec::new();
            for a in args {
                self.leaves(a, &mut ops, &mut leaves);
            }
            let donor = if ops >= 2 { self.donor(e, &leaves, mark) } else { None };
            let r = match (&e.ty, donor) {
                (_, Some(d)) => {
                    let size = self.values[d].0.clone();
                    let id = self.alloc(size, Some(d));
                    Res::Leaf(vec![id])
                }
                (ty, None) => self.fresh(ty),
            };
            self.temps.truncate(mark);
            return r;
        }
        match prim {
            Prim::Reshape | Prim::ExpandDims | Prim::Squeeze | Prim::StopGradient => {
                // A view of the first operand's storage.
                let mark = self.temps.len();
                let mut out = None;
                for a in args {
                    let r = self.eval(a);
                    self.hold(&r);
                    out.get_or_insert(r);
                }
                self.temps.truncate(mark);
                out.unwrap_or_else(Res::none)
            }
            Prim::MatMul => {
                let strided = args.len() == 2 && args.iter().all(|a| rank(&a.ty) >= 2);
                let ops: Vec<&Expr> =
                    args.iter().map(|a| if strided { a.swapped_last().unwrap_or(a) } else { a }).collect();
                self.consume(&ops, &e.ty)
            }
            _ => self.consume(&args.iter().collect::<Vec<_>>(), &e.ty), // any other primitive: reads its operands
        }
    }

    /// Evaluates the leaves of a fused tree below `e`, holding them; counts the tree's
    /// operations and collects each leaf's type and values.
    fn leaves<'e>(&mut self, e: &'e Expr, ops: &mut usize, out: &mut Vec<(&'e Type, Res)>) {
        if let (true, ExprKind::Prim { args, .. }) = (interior(e), &e.kind) {
            *ops += 1;
            for a in args {
                self.leaves(a, ops, out);
            }
            return;
        }
        let r = self.eval(e);
        self.hold(&r);
        out.push((&e.ty, r));
    }

    /// A leaf whose buffer the root can take: one value of the root's type that nothing but
    /// this one operand refers to (a temporary, or a local at its last read).
    fn donor(&self, root: &Expr, leaves: &[(&Type, Res)], mark: usize) -> Option<usize> {
        let same = |t: &Type| match (t, &root.ty) {
            (Type::Tensor(TensorTy { elem: a, shape: s, .. }), Type::Tensor(TensorTy { elem: b, shape: r, .. })) => {
                a.materialise() == b.materialise() && s == r
            }
            _ => false,
        };
        let mut held = Vec::new();
        for r in self.bound.values() {
            r.ids(&mut held);
        }
        held.extend(&self.temps[..mark.min(self.temps.len())]);
        leaves.iter().find_map(|(t, r)| match r {
            Res::Leaf(ids) if ids.len() == 1 && same(t) => {
                let id = ids[0];
                let uses = self.temps[mark.min(self.temps.len())..].iter().filter(|&&x| x == id).count();
                (uses == 1 && !held.contains(&id)).then_some(id)
            }
            _ => None,
        })
    }
}
