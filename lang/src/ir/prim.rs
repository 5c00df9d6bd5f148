//! The primitive table: every builtin operation of msl, its surface name, its class, and, for
//! an elementwise primitive or reduction, its kernel operation; a unary elementwise primitive's
//! entry also holds its reverse rule (forward mode and batching treat the class alike), and a
//! primitive along one axis its kernel and both its rules.
//!
//! Every other rule of a primitive is an arm of its stage's table (type rules in `ir::typing`,
//! diagnostics in `check::builtins`, evaluation in `interp::prims`, derivatives in `autodiff`,
//! layouts in `shard::rules`); every table matches on `Prim` without a catch-all arm
//! (`scripts/tables.sh` checks it), so adding such a primitive is one entry here plus one arm
//! in each table, each asked for by the compiler.

use kernels::ops::{BinaryOp, ReduceOp, UnaryOp};
use kernels::KernelId;

/// Declares the primitives, grouped by class (unary and binary elementwise, reductions,
/// primitives along one axis, the rest, collectives): the enum, every variant in `Prim::ALL`,
/// each one's name, whether users call it by that name (operators, casts and slices have their
/// own syntax), and for those that they do, its signature and description (`Prim::info`);
/// operators add `op(symbol, precedence)` (`Prim::symbol`, `Prim::precedence`). From the
/// groups it writes `Prim::class`, the class patterns (`unary_prims!()` …) and their
/// complements (`not_unary_prims!()` …), the kernel
/// operation of each elementwise primitive and reduction (`Prim::unary_kernel`,
/// `binary_kernel`, `reduce_kernel`), what a primitive along one axis is (`Prim::along`), and
/// `unary_rules!` and `along_rules!`, which hand the rules the entries write to the pass that
/// compiles them (`autodiff::build`): a unary elementwise primitive or a primitive along one
/// axis is its entry and nothing else in `lang`. The table's first token is `$`, which the
/// class patterns it writes need.
macro_rules! prims {
    (
        $d:tt
        unary { $($(#[$um:meta])* $uv:ident : $un:literal $uk:ident $(($us:literal, $ud:literal))? $(op($uy:literal, $up:literal))? => $uop:ident $udom:ident $urule:tt,)* }
        binary { $($(#[$bm:meta])* $bv:ident : $bn:literal $bk:ident $(($bs:literal, $bd:literal))? $(op($by:literal, $bp:literal))? => $bop:ident $bres:ident,)* }
        reduce { $($(#[$rm:meta])* $rv:ident : $rn:literal $rk:ident $(($rs:literal, $rd:literal))? => $rop:ident $rel:ident,)* }
        along { $($(#[$am:meta])* $av:ident : $an:literal $ak:ident $(($asig:literal, $adoc:literal))? => $akern:ident $ael:ident $aaxis:ident $arule:tt $atan:tt,)* }
        other { $($(#[$om:meta])* $ov:ident : $on:literal $ok:ident $(($os:literal, $od:literal))? $(op($oy:literal, $opr:literal))? $([$($of:ident),*])?,)* }
        collective { $($(#[$cm:meta])* $cv:ident : $cn:literal $ck:ident,)* }
    ) => {
        prims!(@common
            $($(#[$um])* $uv : $un $uk $(($us, $ud))? $(op($uy, $up))?,)*
            $($(#[$bm])* $bv : $bn $bk $(($bs, $bd))? $(op($by, $bp))?,)*
            $($(#[$rm])* $rv : $rn $rk $(($rs, $rd))?,)*
            $($(#[$am])* $av : $an $ak $(($asig, $adoc))?,)*
            $($(#[$om])* $ov : $on $ok $(($os, $od))? $(op($oy, $opr))?,)*
            $($(#[$cm])* $cv : $cn $ck,)*
        );

        impl Prim {
            /// How the checker treats the primitive's arguments: its group in the table.
            pub fn class(self) -> Class {
                match self {
                    $(Prim::$uv)|* => Class::Unary,
                    $(Prim::$bv)|* => Class::Binary,
                    $(Prim::$rv)|* => Class::Reduce,
                    $(Prim::$av)|* => Class::Along,
                    $(Prim::$ov)|* | $(Prim::$cv)|* => Class::Other,
                }
            }

            /// A unary elementwise primitive's kernel operation and what it takes.
            pub fn unary_kernel(self) -> Option<(UnaryOp, Domain)> {
                match self {
                    $(Prim::$uv => Some((UnaryOp::$uop, Domain::$udom)),)*
                    $(Prim::$bv)|* | $(Prim::$rv)|* | $(Prim::$av)|* | $(Prim::$ov)|* | $(Prim::$cv)|* => None,
                }
            }

            /// Whether the primitive is a collective (inserted by the sharding pass).
            pub fn is_collective(self) -> bool {
                matches!(self, $(Prim::$cv)|*)
            }

            /// A binary elementwise primitive's kernel operation and its result's element type.
            pub fn binary_kernel(self) -> Option<(BinaryOp, Joins)> {
                match self {
                    $(Prim::$bv => Some((BinaryOp::$bop, Joins::$bres)),)*
                    $(Prim::$uv)|* | $(Prim::$rv)|* | $(Prim::$av)|* | $(Prim::$ov)|* | $(Prim::$cv)|* => None,
                }
            }

            /// Whether the result has a derivative, as the entry says: a unary rule written, a
            /// result that is not bool, a reduction that is not an index, no `NoDiff` flag.
            pub fn differentiable(self) -> bool {
                match self {
                    $(Prim::$uv => prims!(@written $urule),)*
                    $(Prim::$bv)|* => !matches!(self.binary_kernel(), Some((_, Joins::Bool))),
                    $(Prim::$rv)|* => self.reduces() != Some(Reduces::Index),
                    $(Prim::$av => prims!(@written $arule),)*
                    $(Prim::$ov)|* => !self.flags().contains(&Flag::NoDiff),
                    $(Prim::$cv)|* => true,
                }
            }

            /// The flags an entry of the rest carries (`[Effect]`); none for the other classes.
            fn flags(self) -> &'static [Flag] {
                match self {
                    $(Prim::$ov => &[$($(Flag::$of),*)?],)*
                    $(Prim::$uv)|* | $(Prim::$bv)|* | $(Prim::$rv)|* | $(Prim::$av)|* | $(Prim::$cv)|* => &[],
                }
            }

            /// What a primitive along one axis is (`Along`); `None` for the other primitives.
            pub fn along(self) -> Option<Along> {
                match self {
                    $(Prim::$av => Some(Along {
                        kernel: KernelId::$akern,
                        elems: Reduces::$ael,
                        axis: AxisArg::$aaxis,
                        linear: prims!(@linear $atan),
                    }),)*
                    $(Prim::$uv)|* | $(Prim::$bv)|* | $(Prim::$rv)|* | $(Prim::$ov)|* | $(Prim::$cv)|* => None,
                }
            }

            /// What a reduction takes and gives (`Reduces`); `None` for other primitives.
            pub fn reduces(self) -> Option<Reduces> {
                match self {
                    $(Prim::$rv => Some(Reduces::$rel),)*
                    $(Prim::$uv)|* | $(Prim::$bv)|* | $(Prim::$av)|* | $(Prim::$ov)|* | $(Prim::$cv)|* => None,
                }
            }

            /// A reduction's kernel operation; `None` for those computed by their own kernels.
            pub fn reduce_kernel(self) -> Option<ReduceOp> {
                match self {
                    $(Prim::$rv => prims!(@reduce $rop),)*
                    $(Prim::$uv)|* | $(Prim::$bv)|* | $(Prim::$av)|* | $(Prim::$ov)|* | $(Prim::$cv)|* => None,
                }
            }
        }

        /// Patterns for the primitives of each class (the table's groups), so that a table
        /// that treats a class alike (the checker's dispatch, the interpreter's kernel lookups)
        /// names the class once and stays exhaustive: `match p { unary_prims!() => …, … }`.
        macro_rules! unary_prims {
            () => { $($d crate::ir::Prim::$uv)|* };
        }
        /// The binary elementwise primitives (see `unary_prims!`).
        macro_rules! binary_prims {
            () => { $($d crate::ir::Prim::$bv)|* };
        }
        /// The reductions (see `unary_prims!`).
        macro_rules! reduce_prims {
            () => { $($d crate::ir::Prim::$rv)|* };
        }
        /// The primitives along one axis (see `unary_prims!`).
        macro_rules! along_prims {
            () => { $($d crate::ir::Prim::$av)|* };
        }
        /// Every primitive of class `Other` but the collectives (see `unary_prims!`): with the
        /// five other class patterns, every primitive exactly once, so a table written with
        /// them is exhaustive without a catch-all arm.
        macro_rules! other_prims {
            () => { $($d crate::ir::Prim::$ov)|* };
        }
        /// The collectives (see `unary_prims!`).
        macro_rules! collective_prims {
            () => { $($d crate::ir::Prim::$cv)|* };
        }
        /// Every primitive outside the unary elementwise ones: the last arm of a table over that
        /// class alone, so that a new primitive of the class does not compile until the table has
        /// its arm. The other complements below are alike.
        macro_rules! not_unary_prims {
            () => { $($d crate::ir::Prim::$bv)|* | $($d crate::ir::Prim::$rv)|* | $($d crate::ir::Prim::$av)|* | $($d crate::ir::Prim::$ov)|* | $($d crate::ir::Prim::$cv)|* };
        }
        /// Every primitive outside the binary elementwise ones (see `not_unary_prims!`).
        macro_rules! not_binary_prims {
            () => { $($d crate::ir::Prim::$uv)|* | $($d crate::ir::Prim::$rv)|* | $($d crate::ir::Prim::$av)|* | $($d crate::ir::Prim::$ov)|* | $($d crate::ir::Prim::$cv)|* };
        }
        /// Every primitive outside the reductions (see `not_unary_prims!`).
        macro_rules! not_reduce_prims {
            () => { $($d crate::ir::Prim::$uv)|* | $($d crate::ir::Prim::$bv)|* | $($d crate::ir::Prim::$av)|* | $($d crate::ir::Prim::$ov)|* | $($d crate::ir::Prim::$cv)|* };
        }
        /// Every primitive outside the ones along one axis (see `not_unary_prims!`).
        macro_rules! not_along_prims {
            () => { $($d crate::ir::Prim::$uv)|* | $($d crate::ir::Prim::$bv)|* | $($d crate::ir::Prim::$rv)|* | $($d crate::ir::Prim::$ov)|* | $($d crate::ir::Prim::$cv)|* };
        }
        /// Every primitive but the collectives (see `not_unary_prims!`).
        macro_rules! not_collective_prims {
            () => { $($d crate::ir::Prim::$uv)|* | $($d crate::ir::Prim::$bv)|* | $($d crate::ir::Prim::$rv)|* | $($d crate::ir::Prim::$av)|* | $($d crate::ir::Prim::$ov)|* };
        }
        /// Calls `$cb! { Prim rule; … }` with every unary primitive and its reverse rule as the
        /// table writes it, so the rule is compiled where its builder lives (`autodiff`).
        macro_rules! unary_rules {
            ($d cb:ident) => { $d cb! { $($uv $urule;)* } };
        }
        /// Calls `$cb! { Prim reverse tangent; … }` with every primitive along one axis and its
        /// rules as the table writes them (see `unary_rules!`).
        macro_rules! along_rules {
            ($d cb:ident) => { $d cb! { $($av $arule $atan;)* } };
        }
        pub(crate) use {
            along_prims, along_rules, binary_prims, collective_prims, not_along_prims, not_binary_prims,
            not_collective_prims, not_reduce_prims, not_unary_prims, other_prims, reduce_prims, unary_prims,
            unary_rules,
        };
    };
    (@common $($(#[$m:meta])* $v:ident : $name:literal $kind:ident $(($sig:literal, $doc:literal))? $(op($sym:literal, $prec:literal))?,)*) => {
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum Prim {
            $($(#[$m])* $v,)*
        }

        impl Prim {
            /// Every primitive, in declaration order.
            pub const ALL: &'static [Prim] = &[$(Prim::$v,)*];

            /// The primitive's name: the builtin users call, or the operator's name in messages.
            pub fn name(self) -> &'static str {
                match self {
                    $(Prim::$v => $name,)*
                }
            }

            /// True for builtins called by name; false for operators and internal primitives.
            pub fn callable(self) -> bool {
                match self {
                    $(Prim::$v => prims!(@callable $kind),)*
                }
            }

            /// How a builtin is called (in `spec/builtins.md`'s notation) and what it does, for
            /// hover, completion and signature help; `None` for operators and internal
            /// primitives. A callable entry without both does not compile.
            pub fn info(self) -> Option<(&'static str, &'static str)> {
                match self {
                    $(Prim::$v => prims!(@info $kind $(($sig, $doc))?),)*
                }
            }

            /// The operator's symbol (`+`, `**`, prefix `-` and `!`), for operators written with one.
            pub fn symbol(self) -> Option<&'static str> {
                match self {
                    $(Prim::$v => prims!(@opt $($sym)?),)*
                }
            }

            /// How tightly the operator binds, loosest first (LANGUAGE.md §5); 10 for calls.
            pub fn precedence(self) -> u8 {
                match self {
                    $(Prim::$v => prims!(@prec $($prec)?),)*
                }
            }
        }
    };
    (@written nodiff) => { false };
    (@written $rule:tt) => { true };
    (@linear linear) => { true };
    (@linear $tangent:tt) => { false };
    (@reduce none) => { None };
    (@reduce $k:ident) => { Some(ReduceOp::$k) };
    (@opt $x:literal) => { Some($x) };
    (@opt) => { None };
    (@prec $x:literal) => { $x };
    (@prec) => { 10 };
    (@callable callable) => { true };
    (@callable internal) => { false };
    (@info callable ($sig:literal, $doc:literal)) => { Some(($sig, $doc)) };
    (@info internal) => { None };
}

prims! {
    $
    // Unary elementwise: `=> kernel operation, operand domain, reverse rule`. The domain
    // (`Domain`) is `Float` (integers are computed in floating point), `Any` or `Bool`;
    // the rule (`|g, x, y|`: the cotangent, the operand, the result) is `autodiff::build`'s
    // expression of the operand's cotangent, which is also the tangent rule; `nodiff` has none.
    unary {
        Neg: "neg" internal op("-", 7) => Neg Any (|g, x, y| -g),
        Not: "not" internal op("!", 7) => Not Bool nodiff,
        Exp: "exp" callable("exp(x: f[..S]) -> f[..S]", "Elementwise exponential.") => Exp Float (|g, x, y| g * y),
        Log: "log" callable("log(x: f[..S]) -> f[..S]", "Elementwise natural logarithm.") => Log Float (|g, x, y| g / x),
        Sqrt: "sqrt" callable("sqrt(x: f[..S]) -> f[..S]", "Elementwise square root.") => Sqrt Float (|g, x, y| g / y * 0.5),
        Rsqrt: "rsqrt" callable("rsqrt(x: f[..S]) -> f[..S]", "Elementwise `1 / sqrt(x)`.") => Rsqrt Float (|g, x, y| g * (y * y * y) * -0.5),
        Tanh: "tanh" callable("tanh(x: f[..S]) -> f[..S]", "Elementwise hyperbolic tangent.") => Tanh Float (|g, x, y| g * (1.0 - y * y)),
        Sigmoid: "sigmoid" callable("sigmoid(x: f[..S]) -> f[..S]", "Elementwise logistic sigmoid.") => Sigmoid Float (|g, x, y| g * (y * (1.0 - y))),
        Relu: "relu" callable("relu(x: T[..S]) -> T[..S]", "Elementwise `max(x, 0)`.") => Relu Any (|g, x, y| select(gt(y, 0.0), g, 0.0)),
        Gelu: "gelu" callable("gelu(x: f[..S], approximate: true) -> f[..S]", "Gaussian error linear unit: the tanh approximation, or with `approximate: false` the exact `x * 0.5 * (1 + erf(x / sqrt(2)))` (PyTorch's default).") => Gelu Float (|g, x, y| gelu_grad(x, g)),
        /// The error function; `gelu(x, approximate: false)` is built on it.
        Erf: "erf" callable("erf(x: f[..S]) -> f[..S]", "The error function `2/sqrt(pi) * integral of exp(-t^2) from 0 to x`.") => Erf Float (|g, x, y| g * (FRAC_2_SQRT_PI * exp(-(x * x)))),
        Sin: "sin" callable("sin(x: f[..S]) -> f[..S]", "Elementwise sine.") => Sin Float (|g, x, y| g * cos(x)),
        Cos: "cos" callable("cos(x: f[..S]) -> f[..S]", "Elementwise cosine.") => Cos Float (|g, x, y| -(g * sin(x))),
        Abs: "abs" callable("abs(x: T[..S]) -> T[..S]", "Elementwise absolute value.") => Abs Any (|g, x, y| select(ge(x, 0.0), g, -g)),
        Sign: "sign" callable("sign(x: T[..S]) -> T[..S]", "Elementwise sign: −1, 0 or 1.") => Sign Any nodiff,
        Floor: "floor" callable("floor(x: f[..S]) -> f[..S]", "Rounds down, keeping the float type.") => Floor Float nodiff,
    }
    // Binary elementwise: `=> kernel operation, result` (`Joins`): `Elem` (the operands' element
    // type, which must agree) or `Bool` (comparisons and logic).
    binary {
        Add: "add" internal op("+", 4) => Add Elem,
        Sub: "sub" internal op("-", 4) => Sub Elem,
        Mul: "mul" internal op("*", 5) => Mul Elem,
        Div: "div" internal op("/", 5) => Div Elem,
        Rem: "rem" internal op("%", 5) => Rem Elem,
        Pow: "pow" callable("pow(x, y) -> broadcast(x, y)", "`x` to the power `y`, elementwise with broadcasting; same as `x ** y`.") op("**", 8) => Pow Elem,
        Eq: "eq" internal op("==", 3) => Eq Bool,
        Ne: "ne" internal op("!=", 3) => Ne Bool,
        Lt: "lt" internal op("<", 3) => Lt Bool,
        Le: "le" internal op("<=", 3) => Le Bool,
        Gt: "gt" internal op(">", 3) => Gt Bool,
        Ge: "ge" internal op(">=", 3) => Ge Bool,
        And: "and" internal op("&&", 2) => And Bool,
        Or: "or" internal op("||", 1) => Or Bool,
        Maximum: "maximum" callable("maximum(a, b) -> broadcast(a, b)", "The elementwise larger value.") => Max Elem,
        Minimum: "minimum" callable("minimum(a, b) -> broadcast(a, b)", "The elementwise smaller value.") => Min Elem,
        /// `gelu_grad(x, g)`: `g · gelu'(x)` (the tanh approximation), the adjoint of `gelu` in
        /// one pass, so the backward pass stores nothing between (PyTorch's `GeluBackward`).
        GeluGrad: "gelu_grad" callable("gelu_grad(x: f[..S], g: f[..S]) -> f[..S]", "The gradient of `gelu` (the tanh approximation): `g * gelu'(x)`, in one pass; what reverse mode emits for `gelu`.") => GeluGrad Elem,
    }
    // Reductions (attrs.axis, attrs.keepdims): `=> kernel operation, elements`. The kernel
    // operation is `none` for those computed by their own kernels (an index, or max-shifted
    // sums); the elements (`Reduces`) are `Counts` (numbers or bools, a sum of bools is i32),
    // `Float`, `Same` (numbers, kept) or `Index` (numbers, giving i32 positions).
    reduce {
        Sum: "sum" callable("sum(x, axis: k, keepdims: false)", "Sum of all elements, or along `axis` (several: `axis: (0, 2)`); of a model, every element of its float tensors.") => Sum Counts,
        Mean: "mean" callable("mean(x, axis: k, keepdims: false)", "Mean of all elements, or along `axis`.") => Mean Float,
        Max: "max" callable("max(x, axis: k, keepdims: false)", "Largest element, or along `axis`.") => Max Same,
        Min: "min" callable("min(x, axis: k, keepdims: false)", "Smallest element, or along `axis`.") => Min Same,
        Argmax: "argmax" callable("argmax(x, axis: k) -> i32", "Index of the largest element, or along `axis`.") => none Index,
        Argmin: "argmin" callable("argmin(x, axis: k) -> i32", "Index of the smallest element, or along `axis`.") => none Index,
        Logsumexp: "logsumexp" callable("logsumexp(x, axis: k, keepdims: false)", "`log(sum(exp(x)))` computed without overflow.") => none Float,
    }
    // Along one axis, the shape kept (attrs.axis; attrs.from_end counts it from the end, over a
    // `..` rest): `=> kernel (KernelId), elements (Reduces), axis (AxisArg), reverse rule,
    // tangent rule`. A rule (`|g, x, y, ax|`) is an `autodiff::build` expression as a unary
    // primitive's, where `ax.sum(v)` (dim kept) and `ax.cumsum(v)` work along the primitive's
    // axis; the tangent rule is `linear` (the primitive of the tangent), `symmetric` (the reverse
    // rule, with the tangent for `g`: a symmetric Jacobian) or an expression of its own.
    along {
        /// `cumsum(x, axis: k)`: running sums along one axis. Its adjoint is the running sum from
        /// the end, `x̄ᵢ = Σ_{j≥i} ȳⱼ = sum(ȳ) - cumsum(ȳ)ᵢ + ȳᵢ`.
        Cumsum: "cumsum" callable("cumsum(x, axis: k)", "Running sums along axis `k`; the shape is kept (bool counts as i32).") => Cumsum Counts Required (|g, x, y, ax| ax.sum(g) - ax.cumsum(g) + g) linear,
        /// `softmax(x, axis: k)` (default the last axis), computed with the maximum subtracted
        /// first: `x̄ = y ⊙ (ȳ - Σ ȳ ⊙ y)`.
        Softmax: "softmax" callable("softmax(x: f[..S], axis: -1) -> f[..S]", "`exp(x) / sum(exp(x))` along an axis (default the last), with the maximum subtracted first.") => Softmax Float Last (|g, x, y, ax| y * (g - ax.sum(g * y))) symmetric,
        /// `log_softmax(x, axis: k)`: `x̄ = ȳ - exp(y) ⊙ Σ ȳ`, `ẏ = ẋ - Σ exp(y) ⊙ ẋ`.
        LogSoftmax: "log_softmax" callable("log_softmax(x: f[..S], axis: -1) -> f[..S]", "`x - logsumexp(x)` along an axis (default the last), with the maximum subtracted first.") => LogSoftmax Float Last (|g, x, y, ax| g - exp(y) * ax.sum(g)) (|t, x, y, ax| t - ax.sum(exp(y) * t)),
    }
    // The rest; flags (`Flag`): `[NoDiff]` (no derivative: differentiating through it is E0403),
    // `[Effect]` (never removed or reordered), `[Random]` (draws anew at each application).
    other {
        MatMul: "matmul" internal op("@", 6),
        Where: "where" callable("where(c: bool[..], a, b) -> broadcast(c, a, b)", "`a` where `c` is true, else `b`."),
        Cast: "cast" internal,
        // Shape (attrs.shape / attrs.perm / attrs.axis).
        Reshape: "reshape" callable("reshape(x, [d…])", "The same elements in a new shape; one dimension may be `_`."),
        Transpose: "transpose" callable("transpose(x: T[..S, A, B]) -> T[..S, B, A]", "Swaps the last two dimensions."),
        Permute: "permute" callable("permute(x, [i…])", "Reorders the dimensions."),
        Concat: "concat" callable("concat([a, b, …], axis: k)", "Joins tensors along an existing axis (sizes add)."),
        Stack: "stack" callable("stack([a, b, …], axis: k)", "Joins equal-shaped tensors along a new axis."),
        ExpandDims: "expand_dims" callable("expand_dims(x, axis: k)", "Inserts a dimension of size 1."),
        Squeeze: "squeeze" callable("squeeze(x, axis: k)", "Removes a dimension of size 1."),
        BroadcastTo: "broadcast_to" callable("broadcast_to(x, [d…])", "Broadcasts `x` to the given shape."),
        Gather: "gather" callable("gather(x, idx, axis: k)", "Picks entries of `x` along `axis` by integer indices."),
        OneHot: "one_hot" callable("one_hot(y: i32[..S], n) -> f32[..S, n]", "One-hot encoding of integer labels.") [NoDiff],
        Einsum: "einsum" callable("einsum(\"spec\", a, b, …)", "Einstein summation, e.g. `einsum(\"bij,bjk->bik\", a, b)`."),
        // Convolution and pooling over NCHW tensors (`spec/cnn.md`); `attrs.perm` holds the two
        // integers of each: `[stride, padding]` for the convolutions, `[kernel, stride]` for pooling.
        /// `conv2d(x, w, stride: s, padding: p)`: `x[N, C, H, W]` cross-correlated with
        /// `w[O, C, KH, KW]` (the bias of `conv2d(x, w, b, …)` is a separate addition).
        Conv2d: "conv2d" callable("conv2d(x: f[N, C, H, W], w: f[O, C, KH, KW], b: f[O], stride: s, padding: p) -> f[N, O, OH, OW]", "2-D cross-correlation (NCHW, as PyTorch); `OH = (H + 2p - KH) / s + 1`, floor division; the bias is optional."),
        /// `conv2d_input_grad(g, w, size: [H, W], …)`: the adjoint of `conv2d` in `x` (the transposed
        /// convolution); `attrs.shape` is the input's `[H, W]`, which floor division does not determine.
        Conv2dInputGrad: "conv2d_input_grad" callable("conv2d_input_grad(g: f[N, O, OH, OW], w: f[O, C, KH, KW], size: [H, W], stride: s, padding: p) -> f[N, C, H, W]", "The gradient of `conv2d` with respect to its input (the transposed convolution)."),
        /// `conv2d_weight_grad(x, g, kernel: [KH, KW], …)`: the adjoint of `conv2d` in `w`
        /// (`attrs.shape` is `[KH, KW]`).
        Conv2dWeightGrad: "conv2d_weight_grad" callable("conv2d_weight_grad(x: f[N, C, H, W], g: f[N, O, OH, OW], kernel: [KH, KW], stride: s, padding: p) -> f[O, C, KH, KW]", "The gradient of `conv2d` with respect to its weights."),
        /// `max_pool2d(x, kernel: k, stride: s)`: the maximum of each window. With a second operand,
        /// `max_pool2d(x, v, …)` picks `v` where `x` has its first maximum in each window (the
        /// tangent of max pooling).
        MaxPool2d: "max_pool2d" callable("max_pool2d(x: f[N, C, H, W], kernel: k, stride: s) -> f[N, C, OH, OW]", "The maximum of each `k × k` window (stride defaults to `k`); `max_pool2d(x, v, …)` picks `v` at those maxima."),
        /// `max_pool2d_grad(x, g, kernel: k, stride: s)`: `g` sent to the first maximum of each
        /// window of `x` (summed where windows overlap), the adjoint of `max_pool2d`.
        MaxPool2dGrad: "max_pool2d_grad" callable("max_pool2d_grad(x: f[N, C, H, W], g: f[N, C, OH, OW], kernel: k, stride: s) -> f[N, C, H, W]", "The gradient of `max_pool2d`: `g` sent to the first maximum of each window."),
        /// `avg_pool2d(x, kernel: k, stride: s)`: the mean of each window.
        AvgPool2d: "avg_pool2d" callable("avg_pool2d(x: f[N, C, H, W], kernel: k, stride: s) -> f[N, C, OH, OW]", "The mean of each `k × k` window."),
        /// `avg_pool2d_grad(g, size: [H, W], kernel: k, stride: s)`: the adjoint of `avg_pool2d`
        /// (`attrs.shape` is the input's `[H, W]`).
        AvgPool2dGrad: "avg_pool2d_grad" callable("avg_pool2d_grad(g: f[N, C, OH, OW], size: [H, W], kernel: k, stride: s) -> f[N, C, H, W]", "The gradient of `avg_pool2d`: each window's cotangent spread evenly over it."),
        /// `x[i, a:b, :]`: attrs.slice says what each entry takes (`SliceEntry`); the
        /// arguments after `x` are the index values and range bounds in order.
        Slice: "slice" internal,
        /// `scatter_add(upd, idx, n, axis: k)`, the adjoint of `gather`: zeros of the result shape
        /// (`attrs.shape`) with `upd` added at the indices `idx` along axis `k`.
        ScatterAdd: "scatter_add" callable("scatter_add(x, idx, updates, axis: k)", "Adds `updates` into `x` at integer indices along `axis`."),
        /// `update(x, v, at: i, axis: k)`: `x` with `v` written at positions `i..i + m` of axis
        /// `k` (`v` of one rank less: position `i`); arguments `[x, v, i]`. In place when `x`'s
        /// buffer is not shared (a key/value cache).
        Update: "update" callable("update(x, v, at: i, axis: 0)", "`x` with `v` written at position `i` of `axis` (in place when `x` is not shared): a key/value cache's step."),
        // Sorting (`spec/inference.md`); `sort`, `top_k` and `categorical` are written with these.
        /// `argsort(x, axis: k, descending: d)`: the `i32` positions that order `x` along axis `k`
        /// (stable; NaN is largest). With `attrs.shape = [n]` only the first `n` positions are kept
        /// (`top_k`'s indices).
        Argsort: "argsort" callable("argsort(x, axis: -1, descending: false) -> i32", "The positions that order `x` along an axis (stable; NaN is largest).") [NoDiff],
        /// `take_along_axis(x, idx, axis: k)`: `x`'s entries along axis `k` at the positions `idx`
        /// holds, one for one (`idx` has `x`'s rank and its other dims).
        TakeAlong: "take_along_axis" callable("take_along_axis(x, idx, axis: k)", "Picks `x`'s entries along `axis` at the positions `idx` holds, one for one (NumPy's `take_along_axis`)."),
        /// `scatter_add_along(upd, idx, n, axis: k)`, the adjoint of `take_along_axis`: zeros of
        /// the result shape (`attrs.shape`) with each entry of `upd` added at its position.
        ScatterAddAlong: "scatter_add_along" callable("scatter_add_along(g, idx, n, axis: k)", "The adjoint of `take_along_axis`: zeros with `g` added at `idx` along `axis` (of size `n`)."),
        // Attention (`spec/inference.md`); `nn.attention` and `nn.attention_cached` call it.
        /// `fused_attention(q, k, v, len: n, causal: c)`: `softmax(q kᵀ / √D) v` over the first `n`
        /// keys (causally: query `i` at position `n - Q + i` sees the keys up to its own), with an
        /// online softmax over tiles of keys, never the Q×S scores; arguments `[q, k, v, n, c]`.
        Attention: "fused_attention" callable("fused_attention(q, k, v, len: S, causal: false)", "`softmax(q kᵀ / √D) v` for `q[..B, Q, D]`, `k[..B, S, D]`, `v[..B, S, E]` in one kernel (online softmax, no Q×S scores); only the first `len` keys are visible, and when `causal` query `i` sees keys up to position `len - Q + i`."),
        /// `attention_weights(q, k, len: n, causal: c)`: the softmax weights `[..B, Q, S]` of the
        /// same mask (hidden keys 0), which `fused_attention`'s derivatives recompute; `[q, k, n, c]`.
        AttentionWeights: "attention_weights" callable("attention_weights(q, k, len: S, causal: false)", "The softmax weights `[..B, Q, S]` of `fused_attention`'s mask (hidden keys 0)."),
        // Compression (`spec/inference.md`): results of the operand's own type.
        /// `quantize(m, i8)`: every `f32` matrix of `m` (or `m` itself) held as int8 values with
        /// one `f32` scale per output channel; `x @ w` with such a `w` runs the int8 kernel.
        Quantize: "quantize" callable("quantize(m, i8)", "`m` (a model or a matrix) with every `f32` matrix held as int8 with one scale per output channel; `x @ w` with such a `w` is an int8 product. Same type as `m`.") [NoDiff],
        /// `prune(m, sparsity: s)`: each matrix of `m` with the fraction `s` of its weights of
        /// smallest magnitude set to zero; arguments `[m, s]`.
        Prune: "prune" callable("prune(m, sparsity: s)", "`m` with the fraction `s` of each matrix's weights, the smallest in magnitude, set to zero. Same type as `m`.") [NoDiff],
        // Creation (attrs.shape, attrs.dtype; random ones take an optional seed argument).
        Zeros: "zeros" callable("zeros(d…) -> f32[d…]", "A tensor of the given dimensions filled with 0."),
        Ones: "ones" callable("ones(d…) -> f32[d…]", "A tensor of the given dimensions filled with 1."),
        Full: "full" callable("full(v, d…) -> T[d…]", "A tensor of the given dimensions filled with the scalar `v`."),
        Arange: "arange" callable("arange(n) -> i32[n]", "The integers `0, 1, …, n-1`.") [NoDiff],
        Eye: "eye" callable("eye(n) -> f32[n, n]", "The `n × n` identity matrix."),
        Normal: "normal" callable("normal(d…, seed: s) -> f32[d…]", "Standard normal random numbers (counter-based, reproducible).") [Random],
        Uniform: "uniform" callable("uniform(d…, seed: s) -> f32[d…]", "Uniform random numbers on [0, 1).") [Random],
        HeNormal: "he_normal" callable("he_normal(i, o) -> f32[i, o]", "He initialisation: a normal with standard deviation `sqrt(2 / i)`.") [Random],
        GlorotUniform: "glorot_uniform" callable("glorot_uniform(i, o) -> f32[i, o]", "Glorot initialisation: uniform on `±sqrt(6 / (i + o))`.") [Random],
        // Models.
        Params: "params" callable("params(m) -> i32", "The number of parameters of a model."),
        Map: "map" callable("map(f, m, …)", "Applies a rank-polymorphic function to every tensor of one or more models."),
        /// `sum(m)` of a model: the sum of every element of every float tensor in it, as `f32`
        /// (`sum(map(|t| t * t, g))` is the squared global norm). No derivative, like `map`.
        ModelSum: "model_sum" internal,
        /// `shard_state(s)` over `mesh_axes: [a]`: an optimizer state made by an `@optimizer_init`
        /// call with `shard: a`. At run time under a launcher each rank keeps its piece of every
        /// tensor of `s` that is whole over `a` (`interp::zero`); elsewhere it is `s`.
        ShardState: "shard_state" internal [NoDiff],
        // Multi-copy parallelism (`@copies(n)`, `check::copies`): a batch split into copies.
        /// Copy `attrs.perm[0]` of `attrs.perm[1]` along dim `attrs.axis`: each rank's block of that
        /// dim cut into equal parts, part `c` taken (on one process, the `c`-th run of rows).
        CopySplit: "copy_split" internal,
        /// The inverse of the copies' split: each rank's parts put back in order along `attrs.axis`.
        CopyJoin: "copy_join" internal,
        // Differentiation.
        StopGradient: "stop_gradient" callable("stop_gradient(x) -> x", "The value of `x`, treated as a constant by differentiation."),
        /// Reverse mode's tape of a loop's states (generated, never written by users): `tape_new()`
        /// is an empty tape (type `[T]`), `tape_push(t, s)` the tape with `s` appended, and
        /// `tape_get(t, i)` its entry `i`. Derived functions holding them are differentiated and
        /// batched through their recomputing twins (`ir::derived::Derived::twins`).
        TapeNew: "tape_new" internal,
        TapePush: "tape_push" internal,
        TapeGet: "tape_get" internal,
        // I/O and testing.
        Print: "print" callable("print(a, b, …, precision: k)", "Writes its arguments separated by one space and ends the line; `precision: k` prints floats with k decimals.") [Effect],
        Load: "load" callable("load(path)", "Loads `.npy`, `.npz` (`\"file.npz:name\"`), `.safetensors`, `.csv`, `.txt` (bytes as `i32[N]`), or a checkpoint folder (`\"ckpt/\"`).") [Effect],
        Save: "save" callable("save(path, value)", "Saves a tensor, a model or a tuple: one file, or a checkpoint folder when the path ends in `/`.") [Effect],
        /// `log_scalar(name, step, value)`: records a scalar for TensorBoard through the
        /// interpreter's `ScalarLog` (`msl run` writes event files; elsewhere it is discarded).
        LogScalar: "log_scalar" callable("log_scalar(\"name\", step: i32, value: f32)", "Records a scalar at a step for TensorBoard (`msl run` writes `runs/<program>/`; `msl plot` draws it).") [Effect],
        /// `exists(path)`: whether a file or folder is there (a complete checkpoint for a path
        /// ending in `/`).
        Exists: "exists" callable("exists(path) -> bool", "Whether a file or folder is there; for a path ending in `/`, whether a complete checkpoint is.") [Effect],
        /// `clock()`: seconds (`f64`) on a monotonic clock since the process started, for timing
        /// (`let t0 = clock()` … `clock() - t0`), like Python's `time.perf_counter`.
        Clock: "clock" callable("clock() -> f64", "Seconds on a monotonic clock since the process started, for timing (`clock() - t0`).") [Effect],
        Assert: "assert" callable("assert(c: bool, \"message\")", "Fails the run when `c` is false.") [Effect],
        AssertClose: "assert_close" callable("assert_close(a, b, rtol: 1e-5, atol: 1e-6)", "Fails the run when `a` and `b` differ beyond the tolerances.") [Effect],
    }
    // Collectives: inserted by the sharding pass (`crate::shard`), never written by hand.
    // `attrs.mesh_axes` names the mesh axes whose ranks take part; `attrs.axis` the tensor dim.
    collective {
        /// Sums the blocks of every rank of the group (partial results of a contraction).
        AllReduceSum: "all_reduce_sum" internal,
        /// The element-wise maximum over the group.
        AllReduceMax: "all_reduce_max" internal,
        /// The element-wise minimum over the group.
        AllReduceMin: "all_reduce_min" internal,
        /// The mean over the group (of equal-sized local means).
        AllReduceMean: "all_reduce_mean" internal,
        /// Concatenates the group's blocks along dim `attrs.axis`.
        AllGather: "all_gather" internal,
        /// Sums over the group and keeps this rank's block of dim `attrs.axis`.
        ReduceScatter: "reduce_scatter" internal,
        /// Keeps this rank's block of dim `attrs.axis` of a replicated value (no communication).
        LocalSlice: "local_slice" internal,
        /// Moves a split over the group from dim `attrs.axis` (gathered) to dim `attrs.perm[0]`
        /// (split): every rank exchanges one block with every other.
        AllToAll: "all_to_all" internal,
    }
}

/// The six comparisons, binary elementwise primitives with a bool result (see `unary_prims!`).
#[macro_export]
macro_rules! comparison_prims {
    () => {
        $crate::ir::Prim::Eq
            | $crate::ir::Prim::Ne
            | $crate::ir::Prim::Lt
            | $crate::ir::Prim::Le
            | $crate::ir::Prim::Gt
            | $crate::ir::Prim::Ge
    };
}

/// The primitives linear in their first operand whose other operands are indices, bounds or
/// attributes (see `unary_prims!`): forward mode's tangent is the primitive of the tangent,
/// and a partial sum stays one through them (`shard::zero`). A primitive along one axis says so
/// in its entry instead (`linear`); `Prim::linear_in_first` reads both.
#[macro_export]
macro_rules! linear_first_prims {
    () => {
        $crate::ir::Prim::Sum
            | $crate::ir::Prim::Mean
            | $crate::ir::Prim::Reshape
            | $crate::ir::Prim::Transpose
            | $crate::ir::Prim::Permute
            | $crate::ir::Prim::ExpandDims
            | $crate::ir::Prim::Squeeze
            | $crate::ir::Prim::BroadcastTo
            | $crate::ir::Prim::Gather
            | $crate::ir::Prim::ScatterAdd
            | $crate::ir::Prim::TakeAlong
            | $crate::ir::Prim::ScatterAddAlong
            | $crate::ir::Prim::Slice
            | $crate::ir::Prim::CopySplit
            | $crate::ir::Prim::AvgPool2d
            | $crate::ir::Prim::AvgPool2dGrad
    };
}

/// What a unary elementwise primitive takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Domain {
    /// Floats; an integer operand is computed in floating point (`exp(2)`).
    Float,
    /// Numbers of any element type, kept (`abs`, `relu`, `sign`, `neg`).
    Any,
    /// Booleans (`!`).
    Bool,
}

/// The element type of a binary elementwise primitive's result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Joins {
    /// The operands' common element type (`+`, `maximum`).
    Elem,
    /// Bool (comparisons, `&&`, `||`).
    Bool,
}

/// What a reduction takes and gives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reduces {
    /// Numbers or bools; the sum of bools counts them (i32).
    Counts,
    /// Floats, kept.
    Float,
    /// Numbers, kept.
    Same,
    /// Numbers; the result is the i32 position.
    Index,
}

/// What a primitive along one axis is, as its entry says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Along {
    /// The kernel that computes it (with `axis`).
    pub kernel: KernelId,
    /// What it takes and gives, as a reduction's elements: `Counts` (numbers, or bools counted
    /// as i32), `Float` (floats, kept).
    pub elems: Reduces,
    /// Whether `axis:` must be given.
    pub axis: AxisArg,
    /// Linear in its operand: its tangent is the primitive of the tangent, and a partial sum
    /// stays one through it (`shard::zero`).
    pub linear: bool,
}

/// How a primitive along one axis takes its axis.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AxisArg {
    /// `axis: k` must be given (`cumsum`, as `torch.cumsum`'s `dim`).
    Required,
    /// The last axis unless `axis: k` says otherwise (`softmax`).
    Last,
}

/// A flag of an entry of the rest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flag {
    /// No derivative: differentiating through it is E0403.
    NoDiff,
    /// An effect: never removed or reordered by later passes.
    Effect,
    /// A fresh random draw at each application.
    Random,
}

/// Builtins the checker handles itself, not as one primitive: the transforms, `init`, `batches`,
/// conversions, and what is written with other primitives (`sort`, `top_k`, `categorical`).
pub const SPECIAL_FORMS: &[&str] = &[
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
    "bf16",
    "f16",
    "sort",
    "top_k",
    "categorical",
];

/// How the checker treats a primitive's arguments.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    Unary,
    Binary,
    Reduce,
    Along,
    Other,
}

impl Prim {
    /// The primitive a builtin name calls, for function-style primitives.
    pub fn from_name(name: &str) -> Option<Prim> {
        Prim::ALL.iter().copied().find(|p| p.callable() && p.name() == name)
    }

    /// Elementwise primitives (unary and binary operators and functions, `where`, casts): the
    /// ones the JIT fuses into one loop, and whose intermediate results the memory plan
    /// (`ir::memplan`) does not materialise.
    pub fn is_elementwise(self) -> bool {
        matches!(self.class(), Class::Unary | Class::Binary) || matches!(self, Prim::Where | Prim::Cast)
    }

    /// Whether an application is a function of its operands alone: no effect, and no fresh
    /// random draw (each `normal(…)` draws anew). Such an application may be shared with an
    /// equal one, moved, or dropped when unused.
    pub fn is_pure(self) -> bool {
        !self.has_effect() && !self.flags().contains(&Flag::Random)
    }

    /// Linear in its first operand, whose other operands are indices, bounds or attributes
    /// (`linear_first_prims!` and the primitives along one axis marked `linear`).
    pub fn linear_in_first(self) -> bool {
        matches!(self, crate::linear_first_prims!()) || self.along().is_some_and(|a| a.linear)
    }

    /// Primitives with effects (`[Effect]`); never removed or reordered by later passes.
    pub fn has_effect(self) -> bool {
        self.flags().contains(&Flag::Effect)
    }

    /// Every builtin name callable as a function (for "did you mean" suggestions and completion):
    /// the callable primitives, then the special forms the checker handles itself.
    pub fn builtin_names() -> &'static [&'static str] {
        static NAMES: std::sync::OnceLock<Vec<&'static str>> = std::sync::OnceLock::new();
        NAMES.get_or_init(|| {
            Prim::ALL.iter().filter(|p| p.callable()).map(|p| p.name()).chain(SPECIAL_FORMS.iter().copied()).collect()
        })
    }
}
