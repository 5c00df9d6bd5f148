//! The rule builder: a derivative rule written as an expression over locals and constants
//! (`bar * (1.0 - y * y)` for `tanh`), which `Gen::build` emits as SSA lets with every node's
//! type inferred from the primitive table (`ir::typing`), so a rule states only its mathematics.

use super::err;
use super::fwd::{mk, Gen, Res};
use crate::ir::{Attrs, ExprKind, Local, Prim};
use crate::types::{ElemTy, Type};
use std::f64::consts::FRAC_2_SQRT_PI; // named by `erf`'s rule in the table

/// An expression of a rule: a local, a constant of the rule's element type, a primitive, or
/// a primitive along the axis of the rule's own primitive (`ax.sum(v)`).
#[derive(Clone, Debug)]
pub(super) enum R {
    L(Local),
    C(f64),
    P(Prim, Vec<R>),
    Along(Prim, Box<R>, Ax),
}

/// The axis of a primitive along one axis (`ir::prim::Along`), as its rules see it (`ax`).
#[derive(Clone, Copy, Debug)]
pub(super) struct Ax {
    axis: Option<usize>,
    from_end: bool,
}

impl Ax {
    /// The axis `attrs` name.
    pub(super) fn of(attrs: &Attrs) -> Ax {
        Ax { axis: attrs.axis, from_end: attrs.from_end }
    }

    /// The attributes of `p` along this axis; a reduction keeps the dim (as 1), so that its
    /// result broadcasts against the operand.
    fn attrs(self, p: Prim) -> Attrs {
        let keepdims = p.class() == crate::ir::prim::Class::Reduce;
        Attrs { axis: self.axis, from_end: self.from_end, keepdims, ..Attrs::default() }
    }

    /// `sum(v, axis: ax, keepdims: true)`.
    pub(super) fn sum(self, v: impl Into<R>) -> R {
        R::Along(Prim::Sum, Box::new(v.into()), self)
    }

    /// `cumsum(v, axis: ax)`.
    pub(super) fn cumsum(self, v: impl Into<R>) -> R {
        R::Along(Prim::Cumsum, Box::new(v.into()), self)
    }
}

/// A local as a rule operand.
pub(super) fn l(x: Local) -> V {
    V(x)
}

/// A unary primitive applied to `x` (`un(Prim::Exp, x)`).
pub(super) fn un(p: Prim, x: impl Into<R>) -> R {
    R::P(p, vec![x.into()])
}

impl From<Local> for R {
    fn from(x: Local) -> R {
        R::L(x)
    }
}

/// A local as a rule operand (`l(x)`; `g`, `x`, `y` of a unary primitive's rule in the table):
/// copyable, so a rule may name it more than once (`y * y`).
#[derive(Clone, Copy, Debug)]
pub(super) struct V(pub Local);

impl From<V> for R {
    fn from(v: V) -> R {
        R::L(v.0)
    }
}

/// `exp(x)`, for the rules written in the primitive table.
pub(super) fn exp(x: impl Into<R>) -> R {
    un(Prim::Exp, x)
}

/// `sin(x)`.
pub(super) fn sin(x: impl Into<R>) -> R {
    un(Prim::Sin, x)
}

/// `cos(x)`.
pub(super) fn cos(x: impl Into<R>) -> R {
    un(Prim::Cos, x)
}

/// `a > b`.
pub(super) fn gt(a: impl Into<R>, b: impl Into<R>) -> R {
    R::P(Prim::Gt, vec![a.into(), b.into()])
}

/// `a >= b`.
pub(super) fn ge(a: impl Into<R>, b: impl Into<R>) -> R {
    R::P(Prim::Ge, vec![a.into(), b.into()])
}

/// `where(c, a, b)`.
pub(super) fn select(c: impl Into<R>, a: impl Into<R>, b: impl Into<R>) -> R {
    R::P(Prim::Where, vec![c.into(), a.into(), b.into()])
}

/// `gelu_grad(x, g)`.
pub(super) fn gelu_grad(x: impl Into<R>, g: impl Into<R>) -> R {
    R::P(Prim::GeluGrad, vec![x.into(), g.into()])
}

impl From<f64> for R {
    fn from(c: f64) -> R {
        R::C(c)
    }
}

macro_rules! binary_ops {
    ($($tr:ident $f:ident $p:ident),*) => {$(
        impl<T: Into<R>> std::ops::$tr<T> for R {
            type Output = R;
            fn $f(self, o: T) -> R {
                R::P(Prim::$p, vec![self, o.into()])
            }
        }
        impl<T: Into<R>> std::ops::$tr<T> for V {
            type Output = R;
            fn $f(self, o: T) -> R {
                R::P(Prim::$p, vec![self.into(), o.into()])
            }
        }
        impl std::ops::$tr<R> for f64 {
            type Output = R;
            fn $f(self, o: R) -> R {
                R::P(Prim::$p, vec![R::C(self), o])
            }
        }
        impl std::ops::$tr<V> for f64 {
            type Output = R;
            fn $f(self, o: V) -> R {
                R::P(Prim::$p, vec![R::C(self), o.into()])
            }
        }
    )*};
}

binary_ops!(Add add Add, Sub sub Sub, Mul mul Mul, Div div Div);

impl std::ops::Neg for R {
    type Output = R;
    fn neg(self) -> R {
        R::P(Prim::Neg, vec![self])
    }
}

impl std::ops::Neg for V {
    type Output = R;
    fn neg(self) -> R {
        R::P(Prim::Neg, vec![self.into()])
    }
}

impl Gen<'_> {
    /// Emits `r`: its constants first (each distinct value once, as `elem` scalars, in the order
    /// they appear), then its primitives innermost first, left to right. A node takes the type
    /// the primitive table infers; where that is an operand's type, the operand's own (its
    /// layout included).
    pub(super) fn build(&mut self, r: R, elem: ElemTy) -> Res<Local> {
        let mut consts: Vec<(u64, Local)> = Vec::new();
        self.constants(&r, elem, &mut consts);
        self.build_node(&r, &consts)
    }

    fn constants(&mut self, r: &R, elem: ElemTy, out: &mut Vec<(u64, Local)>) {
        match r {
            R::L(_) => {}
            R::C(c) => {
                if !out.iter().any(|(b, _)| *b == c.to_bits()) {
                    let x = self.lit(*c, elem);
                    out.push((c.to_bits(), x));
                }
            }
            R::P(_, args) => {
                for a in args {
                    self.constants(a, elem, out);
                }
            }
            R::Along(_, a, _) => self.constants(a, elem, out),
        }
    }

    fn build_node(&mut self, r: &R, consts: &[(u64, Local)]) -> Res<Local> {
        match r {
            R::L(x) => Ok(*x),
            R::C(c) => Ok(consts.iter().find(|(b, _)| *b == c.to_bits()).map(|(_, x)| *x).expect("emitted first")),
            // A model is negated as `-1.0 * m`.
            R::P(Prim::Neg, args) if args.len() == 1 => {
                let x = self.build_node(&args[0], consts)?;
                Ok(self.negate(x))
            }
            R::P(p, args) => {
                let locals = args.iter().map(|a| self.build_node(a, consts)).collect::<Res<Vec<Local>>>()?;
                self.typed(*p, &locals, Attrs::default())
            }
            R::Along(p, a, ax) => {
                let x = self.build_node(a, consts)?;
                self.typed(*p, &[x], ax.attrs(*p))
            }
        }
    }

    /// `p` of `locals`, typed as the primitive table infers.
    fn typed(&mut self, p: Prim, locals: &[Local], attrs: Attrs) -> Res<Local> {
        let tys: Vec<Type> = locals.iter().map(|x| self.ty_of(*x)).collect();
        let operands: Vec<_> =
            locals.iter().zip(&tys).map(|(x, t)| mk(ExprKind::Local(*x), t.clone(), self.sid)).collect();
        let ty = crate::ir::typing::infer_prim(p, &operands, &attrs)
            .map_err(|m| err(self.span, format!("internal: a derivative rule's `{}`: {m}", p.name())))?;
        let same = |t: &Type| match (t, &ty) {
            (Type::Tensor(a), Type::Tensor(b)) => a.elem == b.elem && a.shape == b.shape,
            (a, b) => a == b,
        };
        let ty = tys.into_iter().find(same).unwrap_or(ty);
        Ok(self.p(p, locals, attrs, ty))
    }

    /// `-x`; a model is negated as `-1.0 * m`.
    pub(super) fn negate(&mut self, x: Local) -> Local {
        let t = self.ty_of(x);
        if t.is_model() {
            let m = self.lit(-1.0, ElemTy::F32);
            return self.p(Prim::Mul, &[m, x], Attrs::default(), t);
        }
        self.p(Prim::Neg, &[x], Attrs::default(), t)
    }
}

/// The reverse rules of the unary elementwise primitives, as their entries in the primitive
/// table write them (`ir::prim`): `unary_rule(p, g, x, y)` is the cotangent of `p`'s operand
/// `x` given the cotangent `g` of its result `y`; `None` where `p` has no derivative. The same
/// expression is `p`'s tangent rule (`tangent.rs`), with the operand's tangent for `g`.
macro_rules! unary_rules_of_table {
    ($($p:ident $rule:tt;)*) => {
        pub(super) fn unary_rule(p: Prim, g: Local, x: Local, y: Local) -> Option<R> {
            match p {
                $(Prim::$p => unary_rules_of_table!(@rule $rule, g, x, y),)*
                crate::not_unary_prims!() => None,
            }
        }
    };
    (@rule nodiff, $g:ident, $x:ident, $y:ident) => {
        None
    };
    (@rule (|$gp:ident, $xp:ident, $yp:ident| $e:expr), $g:ident, $x:ident, $y:ident) => {{
        #[allow(unused_variables)]
        let ($gp, $xp, $yp) = (l($g), l($x), l($y));
        Some(R::from($e))
    }};
}

crate::unary_rules!(unary_rules_of_table);

/// The tangent rule of a primitive along one axis, as its entry writes it.
pub(super) enum AlongTangent {
    /// The primitive of the tangent (`linear`).
    Linear,
    /// The tangent, an expression of the operand's tangent `t`.
    Rule(R),
}

/// The rules of the primitives along one axis, as their entries in the primitive table write
/// them (`ir::prim`): `along_rule(p, g, x, y, ax)` is the cotangent of the operand `x` given
/// the cotangent `g` of the result `y`, `along_tangent(p, t, x, y, ax)` the result's tangent
/// given the operand's; `None` where `p` has no derivative.
macro_rules! along_rules_of_table {
    ($($p:ident $rule:tt $tangent:tt;)*) => {
        pub(super) fn along_rule(p: Prim, g: Local, x: Local, y: Local, ax: Ax) -> Option<R> {
            match p {
                $(Prim::$p => along_rules_of_table!(@rule $rule, g, x, y, ax),)*
                crate::not_along_prims!() => None,
            }
        }

        pub(super) fn along_tangent(p: Prim, t: Local, x: Local, y: Local, ax: Ax) -> Option<AlongTangent> {
            match p {
                $(Prim::$p => along_rules_of_table!(@tangent $tangent $rule, t, x, y, ax),)*
                crate::not_along_prims!() => None,
            }
        }
    };
    (@rule nodiff, $g:ident, $x:ident, $y:ident, $ax:ident) => {
        None
    };
    (@rule (|$gp:ident, $xp:ident, $yp:ident, $axp:ident| $e:expr), $g:ident, $x:ident, $y:ident, $ax:ident) => {{
        #[allow(unused_variables)]
        let ($gp, $xp, $yp, $axp) = (l($g), l($x), l($y), $ax);
        Some(R::from($e))
    }};
    (@tangent linear $rule:tt, $t:ident, $x:ident, $y:ident, $ax:ident) => {
        Some(AlongTangent::Linear)
    };
    (@tangent symmetric $rule:tt, $t:ident, $x:ident, $y:ident, $ax:ident) => {
        along_rules_of_table!(@rule $rule, $t, $x, $y, $ax).map(AlongTangent::Rule)
    };
    (@tangent $tangent:tt $rule:tt, $t:ident, $x:ident, $y:ident, $ax:ident) => {
        along_rules_of_table!(@rule $tangent, $t, $x, $y, $ax).map(AlongTangent::Rule)
    };
}

crate::along_rules!(along_rules_of_table);
