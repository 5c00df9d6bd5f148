//! The rule builder: a derivative rule written as an expression over locals and constants
//! (`bar * (1.0 - y * y)` for `tanh`), which `Gen::build` emits as SSA lets with every node's
//! type inferred from the primitive table (`ir::typing`), so a rule states only its mathematics.

use super::err;
use super::fwd::{mk, Gen, Res};
use crate::ir::{Attrs, ExprKind, Local, Prim};
use crate::types::{ElemTy, Type};

/// An expression of a rule: a local, a constant of the rule's element type, or a primitive.
#[derive(Clone, Debug)]
pub(super) enum R {
    L(Local),
    C(f64),
    P(Prim, Vec<R>),
}

/// A local as a rule operand.
pub(super) fn l(x: Local) -> R {
    R::L(x)
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
        impl std::ops::$tr<R> for f64 {
            type Output = R;
            fn $f(self, o: R) -> R {
                R::P(Prim::$p, vec![R::C(self), o])
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
        }
    }

    fn build_node(&mut self, r: &R, consts: &[(u64, Local)]) -> Res<Local> {
        match r {
            R::L(x) => Ok(*x),
            R::C(c) => Ok(consts.iter().find(|(b, _)| *b == c.to_bits()).map(|(_, x)| *x).expect("emitted first")),
            R::P(p, args) => {
                let locals = args.iter().map(|a| self.build_node(a, consts)).collect::<Res<Vec<Local>>>()?;
                let tys: Vec<Type> = locals.iter().map(|x| self.ty_of(*x)).collect();
                let operands: Vec<_> =
                    locals.iter().zip(&tys).map(|(x, t)| mk(ExprKind::Local(*x), t.clone(), self.sid)).collect();
                let ty = crate::ir::typing::infer_prim(*p, &operands, &Attrs::default())
                    .map_err(|m| err(self.span, format!("internal: a derivative rule's `{}`: {m}", p.name())))?;
                let same = |t: &Type| match (t, &ty) {
                    (Type::Tensor(a), Type::Tensor(b)) => a.elem == b.elem && a.shape == b.shape,
                    (a, b) => a == b,
                };
                let ty = tys.into_iter().find(same).unwrap_or(ty);
                Ok(self.p(*p, &locals, Attrs::default(), ty))
            }
        }
    }
}
