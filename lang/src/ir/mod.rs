//! The typed IR: the checker's output and the one boundary every later stage consumes.
//!
//! Every expression node carries its type (element type and symbolic shape); primitives are a
//! closed enum (`Prim`, one table in `prim.rs`); names are interned; spans live in a side table
//! indexed by `SpanId`. `verify` re-checks structural invariants and `dump` prints a stable text
//! form used by golden tests (`msl check --emit ir`).

pub mod derived;
pub mod dump;
pub mod eval;
pub mod memplan;
pub mod opt;
pub mod prim;
pub mod simplify;
pub mod source;
pub mod typing;
pub mod verify;
pub mod walk;

pub use prim::Prim;

use crate::source::Span;
use crate::types::{ClosureId, Dim, FuncId, ModelId, RestSym, Sym, TyVar, Type};
use std::collections::HashMap;

/// An interned name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Name(pub u32);

#[derive(Clone, Debug, Default)]
pub struct Interner {
    names: Vec<String>,
    ids: HashMap<String, Name>,
}

impl Interner {
    pub fn intern(&mut self, s: &str) -> Name {
        if let Some(&n) = self.ids.get(s) {
            return n;
        }
        let n = Name(self.names.len() as u32);
        self.names.push(s.to_string());
        self.ids.insert(s.to_string(), n);
        n
    }
    pub fn get(&self, n: Name) -> &str {
        self.names.get(n.0 as usize).map(String::as_str).unwrap_or("v")
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct SpanId(pub u32);

/// A local variable of one function body (parameters, `let`, `var`, loop variables, captures).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Local(pub u32);

#[derive(Clone, Debug)]
pub struct LocalInfo {
    pub name: Name,
    pub ty: Type,
    pub mutable: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConstId(pub u32);

/// A literal constant. Floats keep f64 precision until their type is known.
#[derive(Clone, Debug, PartialEq)]
pub enum Lit {
    Int(i64),
    Float(f64),
    Bool(bool),
    Str(String),
}

/// One entry of an index expression `x[…]` as `Prim::Slice` takes it; the bounds it needs
/// follow the sliced tensor among the operands, in entry order.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SliceEntry {
    /// `x[i]`: one position (one operand); the axis is removed.
    Index,
    /// `x[a:b]`: positions `a..b` (two operands).
    Range,
    /// `x[:]`, or an axis past the last entry: the whole axis (no operand).
    Full,
}

/// Compile-time attributes of a primitive application.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Attrs {
    /// A normalised (non-negative) axis, or with `from_end` the axis counted from the end
    /// (`axis: -k` over a rank-polymorphic `..S` shape, whose rank is known only at run time).
    pub axis: Option<usize>,
    pub from_end: bool,
    pub keepdims: bool,
    /// `argsort(…, descending: true)`: largest first.
    pub descending: bool,
    /// Target shape (`reshape`, `broadcast_to`, creation ops) as symbolic dims.
    pub shape: Vec<Dim>,
    /// A permutation or list of axes.
    pub perm: Vec<usize>,
    /// `Prim::Slice`: what each indexed axis takes.
    pub slice: Vec<SliceEntry>,
    /// The einsum specification, normalised to explicit form.
    pub spec: Option<String>,
    /// The element type of a creation or conversion.
    pub dtype: Option<crate::types::ElemTy>,
    /// The mesh axes a collective runs over, outer first (`crate::shard`).
    pub mesh_axes: Vec<crate::types::AxisId>,
    /// A collective's number in `msl check --emit collectives` (0 for none), under which the
    /// run counts what it sends (`msl run --comm-report`).
    pub site: u32,
    /// `print(…, precision: k)`: floats with `k` digits after the point.
    pub precision: Option<u32>,
    /// `shard_state`: the optimizer state lives in host memory and its update runs there
    /// (`offload: host`).
    pub host: bool,
}

/// The identity of one expression node, the key of every side table over the IR (last uses,
/// live sets, the JIT's plans and presets). Ids are unique within a process: a new node takes
/// the next one, and so does a clone, because a copied subtree placed elsewhere is another
/// node (a pass that duplicates code must not share facts between the copies).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ExprId(pub u64);

impl ExprId {
    pub fn fresh() -> ExprId {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        ExprId(NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
    }
}

pub struct Expr {
    pub kind: ExprKind,
    pub ty: Type,
    pub span: SpanId,
    pub id: ExprId,
}

impl std::fmt::Debug for Expr {
    /// The node without its id, so that equal subtrees print alike (CSE and the JIT's compile
    /// cache compare these strings).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Expr").field("kind", &self.kind).field("ty", &self.ty).field("span", &self.span).finish()
    }
}

impl Clone for Expr {
    /// A copy of the subtree whose every node has a fresh id.
    fn clone(&self) -> Expr {
        Expr { kind: self.kind.clone(), ty: self.ty.clone(), span: self.span, id: ExprId::fresh() }
    }
}

impl Expr {
    pub fn new(kind: ExprKind, ty: Type, span: SpanId) -> Expr {
        Expr { kind, ty, span, id: ExprId::fresh() }
    }

    /// The operand of a permutation that swaps exactly the last two axes of a tensor of rank
    /// ≥ 2 (`@` reads such an operand through strides instead of copying it).
    pub fn swapped_last(&self) -> Option<&Expr> {
        let ExprKind::Prim { prim: Prim::Permute | Prim::Transpose, args, attrs } = &self.kind else { return None };
        let n = attrs.perm.len();
        let swap = n >= 2
            && attrs.perm.iter().enumerate().all(|(i, &p)| {
                p == if i + 2 == n {
                    n - 1
                } else if i + 1 == n {
                    n - 2
                } else {
                    i
                }
            });
        if swap && args.len() == 1 {
            args.first()
        } else {
            None
        }
    }
}

/// How a function value is called: the checker knows statically which function it is.
#[derive(Clone, Debug, PartialEq)]
pub enum FnTarget {
    Func(FuncId),
    Grad {
        inner: Box<FnTarget>,
        wrt: usize,
        with_value: bool,
    },
    Vmap {
        inner: Box<FnTarget>,
        in_axes: Vec<Option<usize>>,
    },
    /// Whatever function value the callee expression holds at run time.
    Dynamic,
}

#[derive(Clone, Debug)]
pub enum ExprKind {
    Lit(Lit),
    Local(Local),
    Const(ConstId),
    /// A dimension used as an integer value (`sqrt(2.0 / I)`).
    DimValue(Dim),
    /// Application of a primitive.
    Prim {
        prim: Prim,
        args: Vec<Expr>,
        attrs: Box<Attrs>,
    },
    /// A direct call of a named function with its generic dims instantiated.
    /// `rests` are the shapes bound to the callee's `..S` parameters, in the caller's terms.
    Call {
        func: FuncId,
        dims: Vec<Dim>,
        rests: Vec<crate::types::Shape>,
        args: Vec<Expr>,
    },
    /// A call of a function value (closure, transformed function, parameter of function type).
    CallValue {
        callee: Box<Expr>,
        target: FnTarget,
        args: Vec<Expr>,
    },
    /// A named function as a value.
    FuncRef(FuncId),
    /// A closure value: the lowered bodies (one per distinct argument signature) and captures.
    Closure {
        id: ClosureId,
        captures: Vec<Local>,
    },
    /// `grad(f)`, `value_and_grad(f)`, `vmap(f, …)` as values.
    Transform {
        target: FnTarget,
        callee: Box<Expr>,
    },
    /// `jvp(f, primals, tangents)`.
    Jvp {
        target: FnTarget,
        callee: Box<Expr>,
        primals: Vec<Expr>,
        tangents: Vec<Expr>,
    },
    /// `vjp(f, primals…)`: `(value, pullback)`.
    Vjp {
        target: FnTarget,
        callee: Box<Expr>,
        primals: Vec<Expr>,
    },
    Tuple(Vec<Expr>),
    TupleGet(Box<Expr>, usize),
    Field(Box<Expr>, usize),
    /// `init(Model[…], seed: s)`.
    ModelInit {
        model: ModelId,
        args: Vec<crate::types::TypeArg>,
        seed: Box<Expr>,
    },
    /// A model value built field by field (`map`, model arithmetic): `fields[i]` is field i.
    ModelBuild {
        fields: Vec<Expr>,
    },
    Block {
        stmts: Vec<Stmt>,
        result: Box<Expr>,
    },
    If {
        cond: Box<Expr>,
        then: Box<Expr>,
        els: Box<Expr>,
    },
    /// `for var in start..end { body }`.
    ForRange {
        var: Local,
        start: Box<Expr>,
        end: Box<Expr>,
        body: Box<Expr>,
    },
    /// `for (xb, yb) in batches(x, y, size: B, shuffle: s, drop_last: d) { body }`.
    ForBatches {
        vars: Vec<Local>,
        data: Vec<Expr>,
        size: Box<Expr>,
        shuffle: Option<Box<Expr>>,
        /// Whether a ragged last batch is dropped (the default) or run with the rows left.
        drop_last: bool,
        /// The run-time dim of the batch's rows, bound to each batch's row count (a batch size
        /// not known at compile time, or a kept ragged tail); `None` when the size is static.
        rows: Option<Sym>,
        body: Box<Expr>,
    },
    While {
        cond: Box<Expr>,
        body: Box<Expr>,
    },
    Return(Box<Expr>),
}

#[derive(Clone, Debug)]
pub enum Stmt {
    /// Binds a pattern of locals (`None` ignores that position).
    Let {
        pat: Pat,
        value: Expr,
    },
    /// Assigns to `var` locals.
    Assign {
        pat: Pat,
        value: Expr,
    },
    /// Binds run-time dims from a value's actual shape (`let x: f32[N, 64] = load(…)`), checking
    /// the fixed dims; the `Local` holds the checked value.
    BindDims {
        local: Local,
        dims: Vec<(usize, Option<Sym>, Dim)>,
        rank: usize,
        span: SpanId,
    },
    Expr(Expr),
}

#[derive(Clone, Debug)]
pub enum Pat {
    Local(Local),
    Ignore,
    Tuple(Vec<Pat>),
}

impl Pat {
    /// Calls `f` with every local the pattern binds, left to right.
    pub fn each_local(&self, f: &mut dyn FnMut(Local)) {
        match self {
            Pat::Local(l) => f(*l),
            Pat::Ignore => {}
            Pat::Tuple(ps) => ps.iter().for_each(|p| p.each_local(f)),
        }
    }

    /// The locals the pattern binds, left to right.
    pub fn locals(&self) -> Vec<Local> {
        let mut out = Vec::new();
        self.each_local(&mut |l| out.push(l));
        out
    }
}

#[derive(Clone, Debug)]
pub struct Func {
    pub name: Name,
    pub dims: Vec<Sym>,
    pub rests: Vec<RestSym>,
    pub models: Vec<TyVar>,
    /// For closures: the captured locals come first as parameters.
    pub n_captures: usize,
    pub params: Vec<Local>,
    pub ret: Type,
    pub locals: Vec<LocalInfo>,
    pub body: Expr,
    /// Annotations such as `@recompute`, kept for later passes.
    pub annotations: Vec<Name>,
    pub span: SpanId,
}

#[derive(Clone, Debug)]
pub struct Field {
    pub name: Name,
    pub ty: Type,
    /// The initialiser as a function of the model's dims (none for nested model fields).
    pub init: Option<FuncId>,
}

#[derive(Clone, Debug)]
pub struct Model {
    pub name: Name,
    pub dims: Vec<Sym>,
    pub models: Vec<TyVar>,
    pub fields: Vec<Field>,
    pub span: SpanId,
    /// A stack of this model (`[Block[D]; L]`, LANGUAGE.md §8): its first dim is the number of
    /// layers `L`, the rest are the inner model's, and each field is the inner model's with a
    /// leading `L` (a nested model field is a stack of that model).
    pub stack: Option<ModelId>,
    /// The mesh axis a stack's layers are split over (`[Block[D]; L @pp]`: pipeline stages).
    pub stack_axis: Option<crate::types::AxisId>,
}

impl Model {
    /// The type of `field` in a use of the model whose arguments gave `s`, with the field's
    /// written layout (substitution builds tensor types afresh, replicated).
    pub fn field_ty(s: &crate::types::unify::Subst, field: &Field) -> Type {
        match (s.ty(&field.ty), &field.ty) {
            (Type::Tensor(mut tt), Type::Tensor(orig)) if tt.shape.len() == orig.shape.len() => {
                tt.layout = orig.layout.clone();
                Type::Tensor(tt)
            }
            (t, _) => t,
        }
    }

    /// The binding of the model's generic dims and model parameters to the arguments of a
    /// use of it (`Mlp[64, H]`), in order, for substituting into its field types.
    pub fn arg_subst(&self, args: &[crate::types::TypeArg]) -> crate::types::unify::Subst {
        let mut s = crate::types::unify::Subst::default();
        let (mut d, mut v) = (self.dims.iter(), self.models.iter());
        for a in args {
            match a {
                crate::types::TypeArg::Dim(x) => {
                    if let Some(sym) = d.next() {
                        s.dims.insert(*sym, x.clone());
                    }
                }
                crate::types::TypeArg::Type(t) => {
                    if let Some(tv) = v.next() {
                        s.models.insert(*tv, t.clone());
                    }
                }
            }
        }
        s
    }
}

#[derive(Clone, Debug)]
pub struct Const {
    pub name: Name,
    pub ty: Type,
    pub value: Expr,
}

#[derive(Clone, Debug)]
pub struct Test {
    pub name: String,
    pub func: FuncId,
    pub span: SpanId,
}

#[derive(Clone, Debug)]
pub struct Mesh {
    pub name: Name,
    pub axes: Vec<(Name, i64)>,
}

/// A closure's lowered bodies, one per argument signature it was applied with.
#[derive(Clone, Debug, Default)]
pub struct ClosureInfo {
    pub instances: Vec<(String, FuncId)>,
}

/// A whole checked program: every function of every module it uses.
#[derive(Clone, Debug, Default)]
pub struct Program {
    pub names: Interner,
    pub spans: Vec<Span>,
    pub funcs: Vec<Func>,
    pub models: Vec<Model>,
    pub consts: Vec<Const>,
    pub tests: Vec<Test>,
    pub meshes: Vec<Mesh>,
    pub closures: Vec<ClosureInfo>,
    pub sym_names: Vec<String>,
    pub rest_names: Vec<String>,
    pub tyvar_names: Vec<String>,
    /// `main` of the root file, if it has one.
    pub main: Option<FuncId>,
    /// Functions with a user-given derivative (`@custom_vjp`): function → its cotangent function.
    pub custom_vjp: HashMap<FuncId, FuncId>,
    /// Functions generated by the autodiff pass.
    pub derived: derived::Derived,
    /// Functions of the root file, by name (for `msl grad FILE FN`).
    pub root_funcs: Vec<(String, FuncId)>,
    /// `@pipeline` functions, split into their stages' pieces.
    pub pipelines: Vec<Pipeline>,
    /// What the verifier found wrong after a pass (`crate::passes`), each naming the pass; a
    /// driver that finds any stops with an internal compiler error before running anything.
    pub malformed: Vec<String>,
}

/// A `@pipeline` loss function (LANGUAGE.md §8) cut at its layer loop into three pieces, each an
/// ordinary function with its pullback generated: `pre(params…) -> h` runs on the first stage,
/// `layer(block, h, params…) -> h` is one iteration of the loop (the stack's layer given as
/// `block`, `params…` without the model), `post(params…, h)` runs on the last stage.
#[derive(Clone, Debug)]
pub struct Pipeline {
    pub func: FuncId,
    pub pre: FuncId,
    pub layer: FuncId,
    pub post: FuncId,
    /// The field of the model (parameter 0) that holds the stack of layers.
    pub stack_field: usize,
    /// The local of `func` that the layer loop carries.
    pub carried: Local,
    /// The mesh axis the stack is split over (`None`: one stage).
    pub axis: Option<crate::types::AxisId>,
    pub microbatches: usize,
    pub schedule: crate::shard::schedule::Kind,
    pub virtual_stages: usize,
    pub span: SpanId,
}

impl Pipeline {
    /// The number of stages on `mesh`: the size of the stack's axis (one without either).
    pub fn stages(&self, mesh: Option<&crate::dist::Mesh>) -> usize {
        match (self.axis, mesh) {
            (Some(a), Some(m)) => m.size(a).max(1) as usize,
            _ => 1,
        }
    }

    /// The schedule for `stages` stages and its simulation, which proves it deadlock-free.
    pub fn proved(
        &self,
        stages: usize,
    ) -> Result<(crate::shard::schedule::Schedule, crate::shard::schedule::Timeline), String> {
        let s = crate::shard::schedule::build(self.schedule, stages, self.microbatches, self.virtual_stages)?;
        let t = crate::shard::schedule::prove(&s)?;
        Ok((s, t))
    }
}

impl Program {
    pub fn span(&self, id: SpanId) -> Span {
        self.spans.get(id.0 as usize).copied().unwrap_or_default()
    }
    pub fn func(&self, id: FuncId) -> &Func {
        &self.funcs[id.0 as usize]
    }
    pub fn model(&self, id: ModelId) -> &Model {
        &self.models[id.0 as usize]
    }
}

impl crate::types::Names for Program {
    fn sym(&self, s: Sym) -> String {
        self.sym_names.get(s.0 as usize).cloned().unwrap_or_else(|| format!("d{}", s.0))
    }
    fn rest(&self, r: RestSym) -> String {
        self.rest_names.get(r.0 as usize).cloned().unwrap_or_else(|| format!("r{}", r.0))
    }
    fn tyvar(&self, v: TyVar) -> String {
        self.tyvar_names.get(v.0 as usize).cloned().unwrap_or_else(|| format!("T{}", v.0))
    }
    fn model(&self, m: ModelId) -> String {
        self.models.get(m.0 as usize).map(|m| self.names.get(m.name).to_string()).unwrap_or_default()
    }
    fn stacked(&self, m: ModelId) -> Option<ModelId> {
        self.models.get(m.0 as usize).and_then(|m| m.stack)
    }
    fn func(&self, f: FuncId) -> String {
        self.funcs.get(f.0 as usize).map(|f| self.names.get(f.name).to_string()).unwrap_or_default()
    }
    fn axis(&self, a: crate::types::AxisId) -> String {
        match self.meshes.first().and_then(|m| m.axes.get(a.0 as usize)) {
            Some((n, _)) => self.names.get(*n).to_string(),
            None => format!("axis{}", a.0),
        }
    }
}
