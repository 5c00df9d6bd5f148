//! Types of msl values: element types, symbolic shapes, tuples, models and functions.

pub mod dim;
pub mod unify;

pub use dim::{Dim, Sym};

use std::fmt::Write as _;

/// The element type of a tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ElemTy {
    F32,
    F64,
    I32,
    Bool,
    Bf16,
    F16,
}

impl ElemTy {
    pub fn name(self) -> &'static str {
        match self {
            ElemTy::F32 => "f32",
            ElemTy::F64 => "f64",
            ElemTy::I32 => "i32",
            ElemTy::Bool => "bool",
            ElemTy::Bf16 => "bf16",
            ElemTy::F16 => "f16",
        }
    }

    pub fn from_name(s: &str) -> Option<ElemTy> {
        Some(match s {
            "f32" => ElemTy::F32,
            "f64" => ElemTy::F64,
            "i32" => ElemTy::I32,
            "bool" => ElemTy::Bool,
            "bf16" => ElemTy::Bf16,
            "f16" => ElemTy::F16,
            _ => return None,
        })
    }

    pub fn is_float(self) -> bool {
        matches!(self, ElemTy::F32 | ElemTy::F64 | ElemTy::Bf16 | ElemTy::F16)
    }
}

/// An element type, or the weak type of a literal that adapts to its context.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Elem {
    T(ElemTy),
    WeakInt,
    WeakFloat,
}

impl Elem {
    pub fn is_float(self) -> bool {
        match self {
            Elem::T(t) => t.is_float(),
            Elem::WeakFloat => true,
            Elem::WeakInt => false,
        }
    }
    pub fn is_numeric(self) -> bool {
        !matches!(self, Elem::T(ElemTy::Bool))
    }
    pub fn is_weak(self) -> bool {
        !matches!(self, Elem::T(_))
    }
    /// The concrete type of an integer literal's value: `None` while it is still a weak integer,
    /// f64 for a weak float (weak floats are computed in f64 until they meet a type).
    pub fn materialise_weak_float(self) -> Option<ElemTy> {
        match self {
            Elem::T(t) => Some(t),
            Elem::WeakFloat => Some(ElemTy::F64),
            Elem::WeakInt => None,
        }
    }

    /// The type a weak literal takes when nothing asks for another.
    pub fn materialise(self) -> ElemTy {
        match self {
            Elem::T(t) => t,
            Elem::WeakInt => ElemTy::I32,
            Elem::WeakFloat => ElemTy::F32,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Elem::T(t) => t.name(),
            Elem::WeakInt => "integer literal",
            Elem::WeakFloat => "float literal",
        }
    }
}

/// The dims of a shape with no `..` rest; `None` when it has one.
pub fn fixed_dims(s: &[ShapeItem]) -> Option<Vec<Dim>> {
    s.iter()
        .map(|i| match i {
            ShapeItem::Dim(d) => Some(d.clone()),
            ShapeItem::Rest(_) => None,
        })
        .collect()
}

/// A rank-polymorphic shape variable (`..S`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RestSym(pub u32);

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ShapeItem {
    Dim(Dim),
    Rest(RestSym),
}

pub type Shape = Vec<ShapeItem>;

/// A model type parameter (`M: Model`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TyVar(pub u32);

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ModelId(pub u32);
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FuncId(pub u32);
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClosureId(pub u32);

/// An argument of a model type: a dimension or a model type.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum TypeArg {
    Dim(Dim),
    Type(Type),
}

/// What a function value is, as far as the checker knows it. Named functions and closures are
/// checked at each application with the argument types (like templates); transforms wrap them.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum FnTy {
    /// A known monomorphic signature, from an annotation such as `fn(f32) -> f32`.
    Sig { params: Vec<Type>, ret: Box<Type> },
    /// A named function (possibly generic over dims).
    Item(FuncId),
    /// One particular closure.
    Closure(ClosureId),
    /// `grad(f)` / `value_and_grad(f)` with respect to parameter `wrt`.
    Grad { inner: Box<FnTy>, wrt: usize, with_value: bool },
    /// `vmap(f, in_axes: …)`: `None` marks an argument that is not mapped.
    Vmap { inner: Box<FnTy>, in_axes: Vec<Option<usize>> },
    /// The pullback of `vjp(f, primals…)`: takes the output cotangent.
    Pullback { inner: Box<FnTy>, primals: Vec<Type> },
}

/// A mesh axis, by its index in the program's `mesh` declaration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AxisId(pub u32);

/// How a tensor's dims are laid out over the mesh: for each dim, the mesh axes that split it,
/// outer first (`D @(a, b)`). Empty means every dim is whole on every rank, the only layout a
/// program without sharding has; `TensorTy::new` makes that layout.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct Layout(pub Vec<Vec<AxisId>>);

/// The type of a tensor value: element type, symbolic shape and layout.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorTy {
    pub elem: Elem,
    pub shape: Shape,
    pub layout: Layout,
}

impl TensorTy {
    /// A tensor type with the replicated layout.
    pub fn new(elem: Elem, shape: Shape) -> TensorTy {
        TensorTy { elem, shape, layout: Layout::default() }
    }
    pub fn is_scalar(&self) -> bool {
        self.shape.is_empty()
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Type {
    Tensor(TensorTy),
    Tuple(Vec<Type>),
    Model(ModelId, Vec<TypeArg>),
    ModelVar(TyVar),
    Fn(FnTy),
    Str,
    /// A model type used as a value (`Mlp[64, 128, 10]` passed to `init`).
    ModelType(Box<Type>),
    /// A list literal `[a, b]` (dims for `reshape`, tensors for `concat`).
    List(Vec<Type>),
    /// The type of an expression that already produced a diagnostic; it matches everything.
    Error,
}

impl Type {
    /// The type with every tensor in it (and in its tuples) replicated: no layout.
    pub fn replicated(&self) -> Type {
        match self {
            Type::Tensor(tt) => Type::Tensor(TensorTy::new(tt.elem, tt.shape.clone())),
            Type::Tuple(ts) => Type::Tuple(ts.iter().map(Type::replicated).collect()),
            t => t.clone(),
        }
    }

    pub fn unit() -> Type {
        Type::Tuple(vec![])
    }
    /// A tensor type with the replicated layout.
    pub fn tensor_of(elem: Elem, shape: Shape) -> Type {
        Type::Tensor(TensorTy::new(elem, shape))
    }
    pub fn scalar(t: ElemTy) -> Type {
        Type::Tensor(TensorTy::new(Elem::T(t), vec![]))
    }
    pub fn tensor(t: ElemTy, dims: Vec<Dim>) -> Type {
        Type::Tensor(TensorTy::new(Elem::T(t), dims.into_iter().map(ShapeItem::Dim).collect()))
    }
    pub fn is_error(&self) -> bool {
        matches!(self, Type::Error)
    }
    /// The dim symbols the type names, in its shapes and model arguments.
    pub fn dim_syms(&self) -> Vec<Sym> {
        let mut out = Vec::new();
        self.collect_dim_syms(&mut out);
        out
    }
    fn collect_dim_syms(&self, out: &mut Vec<Sym>) {
        match self {
            Type::Tensor(TensorTy { shape, .. }) => {
                for i in shape {
                    if let ShapeItem::Dim(d) = i {
                        out.extend(d.vars());
                    }
                }
            }
            Type::Tuple(ts) | Type::List(ts) => ts.iter().for_each(|t| t.collect_dim_syms(out)),
            Type::Model(_, args) => {
                for a in args {
                    match a {
                        TypeArg::Dim(d) => out.extend(d.vars()),
                        TypeArg::Type(t) => t.collect_dim_syms(out),
                    }
                }
            }
            _ => {}
        }
    }
    pub fn is_unit(&self) -> bool {
        matches!(self, Type::Tuple(v) if v.is_empty())
    }
    pub fn is_model(&self) -> bool {
        matches!(self, Type::Model(..) | Type::ModelVar(_))
    }
    /// Element type and shape of a tensor type.
    pub fn as_tensor(&self) -> Option<(Elem, &Shape)> {
        match self {
            Type::Tensor(TensorTy { elem: e, shape: s, .. }) => Some((*e, s)),
            _ => None,
        }
    }
    pub fn is_scalar(&self) -> bool {
        matches!(self, Type::Tensor(TensorTy { shape: s, .. }) if s.is_empty())
    }
    /// True when the type contains an error type somewhere (to silence follow-up diagnostics).
    pub fn has_error(&self) -> bool {
        match self {
            Type::Error => true,
            Type::Tuple(ts) | Type::List(ts) => ts.iter().any(Type::has_error),
            Type::Model(_, args) => args.iter().any(|a| matches!(a, TypeArg::Type(t) if t.has_error())),
            Type::ModelType(t) => t.has_error(),
            _ => false,
        }
    }
}

/// Names for printing types; implemented by the checker's tables.
pub trait Names {
    fn sym(&self, s: Sym) -> String;
    fn rest(&self, r: RestSym) -> String;
    fn tyvar(&self, v: TyVar) -> String;
    fn model(&self, m: ModelId) -> String;
    /// The inner model of a stack of models (`[Block[D]; L]`), if `m` is one.
    fn stacked(&self, _m: ModelId) -> Option<ModelId> {
        None
    }
    fn func(&self, f: FuncId) -> String;
    /// The name of a mesh axis (`dp`).
    fn axis(&self, a: AxisId) -> String {
        format!("axis{}", a.0)
    }
}

pub fn dim_str(d: &Dim, n: &dyn Names) -> String {
    d.display(&|s| n.sym(s)).to_string()
}

pub fn shape_str(s: &Shape, n: &dyn Names) -> String {
    layout_shape_str(s, &Layout::default(), n)
}

/// A shape with its layout: `[N @dp, H @mp]`, `[D @(dp, mp)]`.
pub fn layout_shape_str(s: &Shape, layout: &Layout, n: &dyn Names) -> String {
    let items: Vec<String> = s
        .iter()
        .enumerate()
        .map(|(k, i)| {
            let mut t = match i {
                ShapeItem::Dim(d) => dim_str(d, n),
                ShapeItem::Rest(r) => format!("..{}", n.rest(*r)),
            };
            match layout.0.get(k).map(Vec::as_slice) {
                None | Some([]) => {}
                Some([a]) => {
                    let _ = write!(t, " @{}", n.axis(*a));
                }
                Some(axes) => {
                    let names: Vec<String> = axes.iter().map(|a| n.axis(*a)).collect();
                    let _ = write!(t, " @({})", names.join(", "));
                }
            }
            t
        })
        .collect();
    format!("[{}]", items.join(", "))
}

pub fn type_str(t: &Type, n: &dyn Names) -> String {
    let mut out = String::new();
    match t {
        Type::Tensor(TensorTy { elem: e, shape: s, .. }) if s.is_empty() => out.push_str(e.name()),
        Type::Tensor(TensorTy { elem: e, shape: s, layout }) => {
            let _ = write!(out, "{}{}", e.materialise().name(), layout_shape_str(s, layout, n));
        }
        Type::Tuple(ts) => {
            let items: Vec<String> = ts.iter().map(|t| type_str(t, n)).collect();
            if items.len() == 1 {
                let _ = write!(out, "({},)", items[0]);
            } else {
                let _ = write!(out, "({})", items.join(", "));
            }
        }
        Type::List(ts) => {
            let items: Vec<String> = ts.iter().map(|t| type_str(t, n)).collect();
            let _ = write!(out, "list[{}]", items.join(", "));
        }
        Type::Model(m, args) => {
            let arg = |a: &TypeArg| match a {
                TypeArg::Dim(d) => dim_str(d, n),
                TypeArg::Type(t) => type_str(t, n),
            };
            match (n.stacked(*m), args.split_first()) {
                // `[Block[D]; L]`: the stack's first argument is the number of layers.
                (Some(inner), Some((len, rest))) => {
                    let _ = write!(out, "[{}; {}]", type_str(&Type::Model(inner, rest.to_vec()), n), arg(len));
                }
                _ => {
                    out.push_str(&n.model(*m));
                    if !args.is_empty() {
                        let items: Vec<String> = args.iter().map(arg).collect();
                        let _ = write!(out, "[{}]", items.join(", "));
                    }
                }
            }
        }
        Type::ModelVar(v) => out.push_str(&n.tyvar(*v)),
        Type::Fn(f) => out.push_str(&fn_str(f, n)),
        Type::Str => out.push_str("str"),
        Type::ModelType(t) => {
            let _ = write!(out, "type {}", type_str(t, n));
        }
        Type::Error => out.push_str("{error}"),
    }
    out
}

fn fn_str(f: &FnTy, n: &dyn Names) -> String {
    match f {
        FnTy::Sig { params, ret } => {
            let ps: Vec<String> = params.iter().map(|t| type_str(t, n)).collect();
            format!("fn({}) -> {}", ps.join(", "), type_str(ret, n))
        }
        FnTy::Item(id) => format!("fn {}", n.func(*id)),
        FnTy::Closure(_) => "closure".to_string(),
        FnTy::Grad { inner, with_value, .. } => {
            format!("{}({})", if *with_value { "value_and_grad" } else { "grad" }, fn_str(inner, n))
        }
        FnTy::Vmap { inner, .. } => format!("vmap({})", fn_str(inner, n)),
        FnTy::Pullback { inner, .. } => format!("pullback({})", fn_str(inner, n)),
    }
}
