//! The diagnostic for an argument whose type does not fit its parameter: which dim differs, and
//! which earlier argument fixed it.

use super::*;

impl Checker {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn report_mismatch(
        &mut self,
        fname: &str,
        params: &[crate::check::ParamSig],
        i: usize,
        pty: &Type,
        aty: &Type,
        m: Mismatch,
        aspan: Span,
        bound_by: &HashMap<Sym, usize>,
        arg_spans: &[Span],
        subst: &Subst,
    ) {
        let pname = &params[i].name;
        let expected = self.ty_str(&subst.ty(pty));
        // Literals inside a tuple read better as the types they default to: `(f32, f32)`.
        let found = match aty {
            Type::Tuple(ts) => self.ty_str(&Type::Tuple(
                ts.iter()
                    .map(|t| match t {
                        Type::Tensor(TensorTy { elem: e, shape: s, .. }) => {
                            Type::Tensor(TensorTy::new(Elem::T(e.materialise()), s.clone()))
                        }
                        t => t.clone(),
                    })
                    .collect(),
            )),
            _ => self.ty_str(aty),
        };
        let d = match m {
            Mismatch::Elem { expected: e, found: f } => Diagnostic::error(
                if f.is_weak() { Code::E0322 } else { Code::E0303 },
                aspan,
                format!("argument `{pname}` of `{fname}` has element type {}, expected {}", f.name(), e.name()),
            )
            .label(format!("this is {found}"))
            .with_help(format!("convert it with `{}(…)`", e.materialise().name())),
            Mismatch::Rank { expected: r, found: fr } => {
                let rest = matches!(aty, Type::Tensor(TensorTy { shape: s, .. }) if s.iter().any(|i| matches!(i, ShapeItem::Rest(_))));
                let has = if rest { format!("a shape of unknown rank ({found})") } else { format!("rank {fr}") };
                Diagnostic::error(
                    Code::E0305,
                    aspan,
                    format!("argument `{pname}` of `{fname}` has {has}, expected rank {r} ({expected})"),
                )
                .label(format!("this is {found}"))
            }
            Mismatch::Dim { index, expected: e, found: f } => {
                // If the dim was fixed by an earlier argument, say which.
                let orig = match pty {
                    Type::Tensor(TensorTy { shape: s, .. }) => s.get(index).and_then(|x| match x {
                        ShapeItem::Dim(d) => Some(d.clone()),
                        _ => None,
                    }),
                    _ => None,
                };
                let earlier = orig.as_ref().and_then(|d| d.vars().find_map(|v| bound_by.get(&v).map(|j| (v, *j))));
                match earlier {
                    Some((v, j)) => {
                        let vname = self.names().sym(v);
                        Diagnostic::error(
                            Code::E0307,
                            aspan,
                            format!(
                                "conflicting sizes for dim {vname} of `{fname}`: {} from argument `{}` vs {} from argument `{pname}`",
                                self.dim_str(&e),
                                params[j].name,
                                self.dim_str(&f)
                            ),
                        )
                        .label(format!("this is {found}"))
                        .with_secondary(arg_spans[j], format!("{vname} = {} here", self.dim_str(&e)))
                    }
                    // A model argument: its type arguments differ.
                    None if !matches!(pty, Type::Tensor(..)) => Diagnostic::error(
                        Code::E0306,
                        aspan,
                        format!("argument `{pname}` of `{fname}` has type {found}, expected {expected}"),
                    )
                    .label(format!("{} where {} is expected", self.dim_str(&f), self.dim_str(&e))),
                    None => Diagnostic::error(
                        Code::E0306,
                        aspan,
                        format!(
                            "argument `{pname}` of `{fname}` has type {found}, expected {expected}: dimension {index} is {}, not {}",
                            self.dim_str(&f),
                            self.dim_str(&e)
                        ),
                    )
                    .label(format!("this is {found}, expected {expected}")),
                }
            }
            Mismatch::Conflict { var, first, second } => Diagnostic::error(
                Code::E0307,
                aspan,
                format!(
                    "conflicting sizes for dim {}: {} vs {}",
                    self.names().sym(var),
                    self.dim_str(&first),
                    self.dim_str(&second)
                ),
            ),
            Mismatch::Kind => Diagnostic::error(
                Code::E0304,
                aspan,
                format!("argument `{pname}` of `{fname}` has type {found}, expected {expected}"),
            )
            .label(format!("this is {found}")),
        };
        self.error(d);
    }
}
