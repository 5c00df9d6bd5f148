//! Dims given by name at a call of a generic function: `heads[H = 4](x)` fixes `H` before the
//! arguments are unified, and the others are inferred as usual.

use super::*;

/// The callee of a call of a named function: where it is written and the dims given to it
/// (`heads[H = 4]`).
pub(crate) struct Callee<'a> {
    pub(super) span: Span,
    pub(super) dims: &'a [(Sym, Dim)],
}

impl Checker {
    /// `f[H = 4](x)`: a call of the generic function `f` with some of its dims given by name.
    pub(super) fn call_with_dims(
        &mut self,
        cx: &mut FnCx,
        base: &ast::Expr,
        dargs: &[ast::IndexArg],
        args: &[ast::Arg],
        span: Span,
        expected: Option<&Type>,
    ) -> ir::Expr {
        let given = match self.named_item(cx, base) {
            Some(ItemRef::Func(id)) => self.given_dims(cx, id, dargs).map(|g| (id, g)),
            _ => {
                self.error(
                    Diagnostic::error(
                        Code::E0313,
                        base.span,
                        "dims are given by name only to a generic function or a model",
                    )
                    .label("not a function defined with `fn`"),
                );
                None
            }
        };
        let Some((id, given)) = given else {
            for a in args {
                self.check_expr(cx, &a.value, None);
            }
            return self.error_expr(span);
        };
        let def = self.fn_sigs[id.0 as usize].span;
        self.index.types.push((base.span, self.fn_signature_str(id), Some(def)));
        self.call_item(cx, id, args, span, Callee { span: base.span, dims: &given }, expected)
    }

    /// The dims `dargs` give to `id` (`[H = 4, D = 2 * E]`), or `None` once their errors are reported.
    fn given_dims(&mut self, cx: &FnCx, id: FuncId, dargs: &[ast::IndexArg]) -> Option<Vec<(Sym, Dim)>> {
        let sig = self.fn_sigs[id.0 as usize].clone();
        self.given_dims_of(cx, &sig.name, &sig.dims, sig.span, dargs)
    }

    /// The dims `dargs` give by name to the generic item `name` (a function or a model) whose
    /// dims are `dims`, or `None` once their errors are reported.
    pub(super) fn given_dims_of(
        &mut self,
        cx: &FnCx,
        name: &str,
        dims: &[Sym],
        decl: Span,
        dargs: &[ast::IndexArg],
    ) -> Option<Vec<(Sym, Dim)>> {
        struct Sig<'a> {
            name: &'a str,
            dims: &'a [Sym],
            span: Span,
        }
        let sig = Sig { name, dims, span: decl };
        let mut given: Vec<(Sym, Dim)> = Vec::new();
        let mut ok = true;
        for a in dargs {
            let (name, value) = match a {
                ast::IndexArg::Named { name, value } => (name, value),
                ast::IndexArg::Expr(ast::Expr { span: s, .. }) | ast::IndexArg::Slice { span: s, .. } => {
                    self.error(
                        Diagnostic::error(Code::E0212, *s, "dim arguments are given by name")
                            .with_help(format!("write `{}[D = …](…)` with a dim of its signature", sig.name)),
                    );
                    ok = false;
                    continue;
                }
            };
            let Some(sym) = sig.dims.iter().copied().find(|d| self.names().sym(*d) == name.name) else {
                let dims: Vec<String> = sig.dims.iter().map(|d| self.names().sym(*d)).collect();
                let help = if dims.is_empty() {
                    format!("`{}` has no dims", sig.name)
                } else {
                    format!("its dims are {}", dims.join(", "))
                };
                self.error(
                    Diagnostic::error(Code::E0212, name.span, format!("`{}` has no dim `{}`", sig.name, name.name))
                        .with_help(help)
                        .with_secondary(sig.span, "declared here"),
                );
                ok = false;
                continue;
            };
            if given.iter().any(|(s, _)| *s == sym) {
                self.error(
                    Diagnostic::error(
                        Code::E0212,
                        name.span,
                        format!("dim `{}` of `{}` is given twice", name.name, sig.name),
                    )
                    .label("given again here"),
                );
                ok = false;
                continue;
            }
            match self.static_dim(cx, value) {
                Some(d) => given.push((sym, d)),
                None => {
                    self.error(
                        Diagnostic::error(
                            Code::E0323,
                            value.span,
                            "a dim argument must be a size known at compile time",
                        )
                        .label("not a compile-time size")
                        .with_help("a number, a global `dim`, a dim of this function, or arithmetic of them"),
                    );
                    ok = false;
                }
            }
        }
        ok.then_some(given)
    }
}
