//! The surface syntax tree produced by the parser. Every node carries a byte span.

use crate::source::Span;

#[derive(Clone, Debug, PartialEq)]
pub struct Ident {
    pub name: String,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq)]
pub struct File {
    pub items: Vec<Item>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Annotation {
    pub name: Ident,
    pub args: Vec<Arg>,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Item {
    pub annotations: Vec<Annotation>,
    pub kind: ItemKind,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq)]
pub enum UseTarget {
    /// `use nn`, `use optim.adam`: a dotted module path.
    Module(Vec<Ident>),
    /// `use nn.{a, b}`.
    Names(Vec<Ident>, Vec<Ident>),
    /// `use "./layers.msl"`.
    File(String, Span),
}

#[derive(Clone, Debug, PartialEq)]
pub enum ItemKind {
    Use(UseTarget),
    Dim {
        name: Ident,
        value: DimExpr,
    },
    Const {
        name: Ident,
        ty: Option<TypeExpr>,
        value: Expr,
    },
    Fn(FnDecl),
    Model(ModelDecl),
    Mesh {
        name: Ident,
        axes: Vec<(Ident, DimExpr)>,
    },
    Test {
        name: String,
        body: Block,
    },
    /// An item the parser could not read; a diagnostic was reported.
    Error,
}

/// A `[…]` parameter of a `fn` or `model`: a dimension variable or `M: Model`.
#[derive(Clone, Debug, PartialEq)]
pub enum Generic {
    Dim(Ident),
    Model(Ident),
    /// `..S`: a rank-polymorphic rest of a shape.
    Rest(Ident),
}

#[derive(Clone, Debug, PartialEq)]
pub struct Param {
    pub name: Ident,
    pub ty: Option<TypeExpr>,
    pub default: Option<Expr>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct FnDecl {
    pub name: Ident,
    pub generics: Vec<Generic>,
    pub params: Vec<Param>,
    pub ret: Option<TypeExpr>,
    pub body: Block,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Field {
    pub name: Ident,
    pub ty: TypeExpr,
    pub init: Option<Expr>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ModelDecl {
    pub name: Ident,
    pub generics: Vec<Generic>,
    pub fields: Vec<Field>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct TypeExpr {
    pub kind: TypeKind,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq)]
pub enum TypeKind {
    /// `f32`, `Mlp`, `M`, `f32[N, 64]`, `Mlp[64, 128, 10]`, `AdamState[M]`, `nn.Linear[4, 8]`.
    Named {
        path: Vec<Ident>,
        args: Option<Vec<DimArg>>,
    },
    Tuple(Vec<TypeExpr>),
    Fn {
        params: Vec<TypeExpr>,
        ret: Box<TypeExpr>,
    },
    /// A stack of models, `[Block[D]; L]` (optionally `L @pp`): each field gains a leading `L`.
    Stack {
        elem: Box<TypeExpr>,
        len: Box<DimArg>,
    },
    Error,
}

/// One entry of a `[…]` type argument list: a dimension (with optional sharding) or `..S`.
#[derive(Clone, Debug, PartialEq)]
pub enum DimArg {
    Dim {
        dim: DimExpr,
        /// The mesh axes that split the dim, outer first (`D @a`, `D @(a, b)`); empty: whole.
        shard: Vec<Ident>,
    },
    Rest(Ident),
    /// A model type with arguments as the argument of a generic model: `AdamState[Mlp[4, 8, 2]]`.
    Type(TypeExpr),
}

#[derive(Clone, Debug, PartialEq)]
pub struct DimExpr {
    pub kind: DimKind,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq)]
pub enum DimKind {
    Int(i64),
    Var(String),
    Infer,
    Bin(BinOp, Box<DimExpr>, Box<DimExpr>),
    Neg(Box<DimExpr>),
    Error,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Block {
    pub stmts: Vec<Stmt>,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Stmt {
    pub kind: StmtKind,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq)]
pub enum StmtKind {
    Let {
        pat: Pattern,
        ty: Option<TypeExpr>,
        value: Expr,
    },
    Var {
        name: Ident,
        ty: Option<TypeExpr>,
        value: Expr,
    },
    /// `x = e`, `(a, b) = e`, `x += e`.
    Assign {
        target: Expr,
        op: Option<BinOp>,
        value: Expr,
    },
    Return(Option<Expr>),
    /// `break` and `continue` leave the innermost enclosing loop or its current iteration.
    Break,
    Continue,
    Expr(Expr),
    Error,
}

#[derive(Clone, Debug, PartialEq)]
pub enum Pattern {
    Name(Ident),
    Wild(Span),
    Tuple(Vec<Pattern>, Span),
}

impl Pattern {
    pub fn span(&self) -> Span {
        match self {
            Pattern::Name(i) => i.span,
            Pattern::Wild(s) | Pattern::Tuple(_, s) => *s,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
    Rem,
    Pow,
    MatMul,
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    And,
    Or,
}

impl BinOp {
    pub fn symbol(self) -> &'static str {
        use BinOp::*;
        match self {
            Add => "+",
            Sub => "-",
            Mul => "*",
            Div => "/",
            Rem => "%",
            Pow => "**",
            MatMul => "@",
            Eq => "==",
            Ne => "!=",
            Lt => "<",
            Le => "<=",
            Gt => ">",
            Ge => ">=",
            And => "&&",
            Or => "||",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnOp {
    Neg,
    Not,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Arg {
    pub name: Option<Ident>,
    pub value: Expr,
}

/// One entry of `x[…]`: an index, or a slice `a:b` or `a:b:s` (every part optional).
#[derive(Clone, Debug, PartialEq)]
pub enum IndexArg {
    Expr(Expr),
    Slice {
        start: Option<Expr>,
        end: Option<Expr>,
        step: Option<Box<Expr>>,
        span: Span,
    },
    /// `H = 4` in `heads[H = 4](x)`: a dim argument of a call, not an index.
    Named {
        name: Ident,
        value: Expr,
    },
}

impl IndexArg {
    /// The expressions of a slice's bounds and step, in order.
    pub fn slice_parts(&self) -> impl Iterator<Item = &Expr> {
        let (a, b, c) = match self {
            IndexArg::Expr(_) | IndexArg::Named { .. } => (None, None, None),
            IndexArg::Slice { start, end, step, .. } => (start.as_ref(), end.as_ref(), step.as_deref()),
        };
        a.into_iter().chain(b).chain(c)
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Expr {
    pub kind: ExprKind,
    pub span: Span,
}

#[derive(Clone, Debug, PartialEq)]
pub enum ExprKind {
    Int(i64),
    Float(f64),
    Bool(bool),
    Str(String),
    Name(String),
    /// `_` in an argument position (e.g. an unmapped entry of `in_axes`).
    Wild,
    Tuple(Vec<Expr>),
    List(Vec<Expr>),
    /// `[Block; L]`, the callee of a stack's constructor `[Block; L](w: ws, b: bs)`: the
    /// model and the number of layers.
    StackModel(Box<Expr>, Box<DimArg>),
    Unary(UnOp, Box<Expr>),
    Binary(BinOp, Box<Expr>, Box<Expr>),
    Call(Box<Expr>, Vec<Arg>),
    Field(Box<Expr>, Ident),
    /// `t.0`: a tuple element.
    TupleIndex(Box<Expr>, u32, Span),
    Index(Box<Expr>, Vec<IndexArg>),
    Closure {
        params: Vec<Param>,
        body: Box<Expr>,
    },
    Block(Block),
    If {
        cond: Box<Expr>,
        then: Block,
        els: Option<Box<Expr>>,
    },
    For {
        pat: Pattern,
        iter: ForIter,
        body: Block,
    },
    While {
        cond: Box<Expr>,
        body: Block,
    },
    Error,
}

#[derive(Clone, Debug, PartialEq)]
pub enum ForIter {
    Range(Box<Expr>, Box<Expr>),
    Expr(Box<Expr>),
}

impl Expr {
    pub fn new(kind: ExprKind, span: Span) -> Expr {
        Expr { kind, span }
    }
}
