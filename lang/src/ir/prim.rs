//! The primitive table: every builtin operation of msl, its surface name and its class.
//!
//! Shape rules live in `check::builtins` (keyed by this enum), evaluation in the interpreter,
//! derivative rules in the autodiff pass; all match on `Prim` exhaustively, so adding a
//! primitive is one entry here plus one arm in each of those tables.

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Prim {
    // Operators.
    Neg,
    Not,
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
    // Elementwise functions.
    Exp,
    Log,
    Sqrt,
    Rsqrt,
    Tanh,
    Sigmoid,
    Relu,
    Gelu,
    Sin,
    Cos,
    Abs,
    Sign,
    Floor,
    Maximum,
    Minimum,
    Where,
    Cast,
    // Reductions (attrs.axis, attrs.keepdims).
    Sum,
    Mean,
    Max,
    Min,
    Argmax,
    Argmin,
    Logsumexp,
    // Shape (attrs.shape / attrs.perm / attrs.axis).
    Reshape,
    Transpose,
    Permute,
    Concat,
    Stack,
    ExpandDims,
    Squeeze,
    BroadcastTo,
    Gather,
    OneHot,
    Einsum,
    /// `x[i, a:b, :]`: attrs.perm encodes each entry (0 index, 1 range, 2 full); the
    /// arguments after `x` are the index values and range bounds in order.
    Slice,
    /// `scatter_add(upd, idx, n, axis: k)`, the adjoint of `gather`: zeros of the result shape
    /// (`attrs.shape`) with `upd` added at the indices `idx` along axis `k`.
    ScatterAdd,
    // Creation (attrs.shape, attrs.dtype; random ones take an optional seed argument).
    Zeros,
    Ones,
    Full,
    Arange,
    Eye,
    Normal,
    Uniform,
    HeNormal,
    GlorotUniform,
    // Models.
    Params,
    Map,
    // Differentiation.
    StopGradient,
    // I/O and testing.
    Print,
    Load,
    Save,
    Assert,
    AssertClose,
}

/// How the checker treats a primitive's arguments.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    Unary,
    Binary,
    Reduce,
    Other,
}

impl Prim {
    /// The builtin name users call, for function-style primitives.
    pub fn from_name(name: &str) -> Option<Prim> {
        use Prim::*;
        Some(match name {
            "exp" => Exp,
            "log" => Log,
            "sqrt" => Sqrt,
            "rsqrt" => Rsqrt,
            "tanh" => Tanh,
            "sigmoid" => Sigmoid,
            "relu" => Relu,
            "gelu" => Gelu,
            "sin" => Sin,
            "cos" => Cos,
            "abs" => Abs,
            "sign" => Sign,
            "floor" => Floor,
            "pow" => Pow,
            "maximum" => Maximum,
            "minimum" => Minimum,
            "where" => Where,
            "sum" => Sum,
            "mean" => Mean,
            "max" => Max,
            "min" => Min,
            "argmax" => Argmax,
            "argmin" => Argmin,
            "logsumexp" => Logsumexp,
            "reshape" => Reshape,
            "transpose" => Transpose,
            "permute" => Permute,
            "concat" => Concat,
            "stack" => Stack,
            "expand_dims" => ExpandDims,
            "squeeze" => Squeeze,
            "broadcast_to" => BroadcastTo,
            "gather" => Gather,
            "scatter_add" => ScatterAdd,
            "one_hot" => OneHot,
            "einsum" => Einsum,
            "zeros" => Zeros,
            "ones" => Ones,
            "full" => Full,
            "arange" => Arange,
            "eye" => Eye,
            "normal" => Normal,
            "uniform" => Uniform,
            "he_normal" => HeNormal,
            "glorot_uniform" => GlorotUniform,
            "params" => Params,
            "map" => Map,
            "stop_gradient" => StopGradient,
            "print" => Print,
            "load" => Load,
            "save" => Save,
            "assert" => Assert,
            "assert_close" => AssertClose,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        use Prim::*;
        match self {
            Neg => "neg",
            Not => "not",
            Add => "add",
            Sub => "sub",
            Mul => "mul",
            Div => "div",
            Rem => "rem",
            Pow => "pow",
            MatMul => "matmul",
            Eq => "eq",
            Ne => "ne",
            Lt => "lt",
            Le => "le",
            Gt => "gt",
            Ge => "ge",
            And => "and",
            Or => "or",
            Exp => "exp",
            Log => "log",
            Sqrt => "sqrt",
            Rsqrt => "rsqrt",
            Tanh => "tanh",
            Sigmoid => "sigmoid",
            Relu => "relu",
            Gelu => "gelu",
            Sin => "sin",
            Cos => "cos",
            Abs => "abs",
            Sign => "sign",
            Floor => "floor",
            Maximum => "maximum",
            Minimum => "minimum",
            Where => "where",
            Cast => "cast",
            Sum => "sum",
            Mean => "mean",
            Max => "max",
            Min => "min",
            Argmax => "argmax",
            Argmin => "argmin",
            Logsumexp => "logsumexp",
            Reshape => "reshape",
            Transpose => "transpose",
            Permute => "permute",
            Concat => "concat",
            Stack => "stack",
            ExpandDims => "expand_dims",
            Squeeze => "squeeze",
            BroadcastTo => "broadcast_to",
            Gather => "gather",
            OneHot => "one_hot",
            Einsum => "einsum",
            Slice => "slice",
            ScatterAdd => "scatter_add",
            Zeros => "zeros",
            Ones => "ones",
            Full => "full",
            Arange => "arange",
            Eye => "eye",
            Normal => "normal",
            Uniform => "uniform",
            HeNormal => "he_normal",
            GlorotUniform => "glorot_uniform",
            Params => "params",
            Map => "map",
            StopGradient => "stop_gradient",
            Print => "print",
            Load => "load",
            Save => "save",
            Assert => "assert",
            AssertClose => "assert_close",
        }
    }

    pub fn class(self) -> Class {
        use Prim::*;
        match self {
            Neg | Not | Exp | Log | Sqrt | Rsqrt | Tanh | Sigmoid | Relu | Gelu | Sin | Cos | Abs | Sign | Floor => {
                Class::Unary
            }
            Add | Sub | Mul | Div | Rem | Pow | Eq | Ne | Lt | Le | Gt | Ge | And | Or | Maximum | Minimum => {
                Class::Binary
            }
            Sum | Mean | Max | Min | Argmax | Argmin | Logsumexp => Class::Reduce,
            _ => Class::Other,
        }
    }

    /// Elementwise primitives (unary and binary operators and functions, `where`, casts): the
    /// ones the JIT fuses into one loop, and whose intermediate results the memory plan
    /// (`ir::memplan`) does not materialise.
    pub fn is_elementwise(self) -> bool {
        matches!(self.class(), Class::Unary | Class::Binary) || matches!(self, Prim::Where | Prim::Cast)
    }

    /// Primitives whose result has no derivative; differentiating through them is `E0403`.
    pub fn differentiable(self) -> bool {
        use Prim::*;
        !matches!(self, Argmax | Argmin | Eq | Ne | Lt | Le | Gt | Ge | And | Or | Not | Sign | Floor | OneHot | Arange)
    }

    /// Primitives with effects; never removed or reordered by later passes.
    pub fn has_effect(self) -> bool {
        matches!(self, Prim::Print | Prim::Load | Prim::Save | Prim::Assert | Prim::AssertClose)
    }

    /// Every builtin name callable as a function (for "did you mean" suggestions and completion).
    pub fn builtin_names() -> &'static [&'static str] {
        &[
            "exp",
            "log",
            "sqrt",
            "rsqrt",
            "tanh",
            "sigmoid",
            "relu",
            "gelu",
            "sin",
            "cos",
            "abs",
            "sign",
            "floor",
            "pow",
            "maximum",
            "minimum",
            "where",
            "sum",
            "mean",
            "max",
            "min",
            "argmax",
            "argmin",
            "logsumexp",
            "reshape",
            "transpose",
            "permute",
            "concat",
            "stack",
            "expand_dims",
            "squeeze",
            "broadcast_to",
            "gather",
            "scatter_add",
            "one_hot",
            "einsum",
            "zeros",
            "ones",
            "full",
            "arange",
            "eye",
            "normal",
            "uniform",
            "he_normal",
            "glorot_uniform",
            "params",
            "map",
            "stop_gradient",
            "print",
            "load",
            "save",
            "assert",
            "assert_close",
            "init",
            "grad",
            "value_and_grad",
            "jvp",
            "vjp",
            "vmap",
            "batches",
            "f32",
            "f64",
            "i32",
            "bool",
        ]
    }
}
