//! The shape rule of `einsum`: explicit (`ij,jk->ik`) and implicit (`ij,jk`) specifications,
//! with `...` standing for the leading dims an operand has beyond its letters (NumPy's rule:
//! right-aligned across operands, first in an implicit output).

use super::*;

impl Checker {
    pub(super) fn check_einsum(&mut self, cx: &mut FnCx, a: &Args, span: Span) -> ir::Expr {
        self.check_named("einsum", a, &[]);
        if !self.arity("einsum", a, 2, usize::MAX, span) {
            return self.error_expr(span);
        }
        let ast::ExprKind::Str(spec) = &a.pos[0].0.kind else {
            self.error(Diagnostic::error(
                Code::E0323,
                a.pos[0].1,
                "`einsum` needs its specification as a string literal",
            ));
            return self.error_expr(span);
        };
        let sspan = a.pos[0].1;
        let mut vals = Vec::new();
        for (e, _) in &a.pos[1..] {
            let v = self.check_expr(cx, e, None);
            vals.push(self.materialise(v));
        }
        if vals.iter().any(|v| v.ty.has_error()) {
            return self.error_expr(span);
        }
        let compact: String = spec.chars().filter(|c| !c.is_whitespace()).collect();
        let compact = match self.expand_ellipsis(&compact, &vals, sspan) {
            Some(c) => c,
            None => return self.error_expr(span),
        };
        let (lhs, rhs) = match compact.split_once("->") {
            Some((l, r)) => (l.to_string(), Some(r.to_string())),
            None => (compact.clone(), None),
        };
        let inputs: Vec<&str> = lhs.split(',').collect();
        let bad = |c: &mut Checker, msg: String| {
            c.error(Diagnostic::error(Code::E0311, sspan, msg).label("in this specification"));
        };
        // Letters and `,` before the one `->`, letters after it.
        let bad_lhs = lhs.chars().any(|c| !(c.is_ascii_alphabetic() || c == ','));
        if bad_lhs || rhs.as_deref().is_some_and(|r| r.chars().any(|c| !c.is_ascii_alphabetic())) {
            bad(self, format!("einsum specification `{spec}` may only contain letters, `...`, `,` and `->`"));
            return self.error_expr(span);
        }
        if inputs.len() != vals.len() {
            bad(
                self,
                format!("einsum specification has {} operands but {} tensors are given", inputs.len(), vals.len()),
            );
            return self.error_expr(span);
        }
        let mut sizes: Vec<(char, Dim, usize)> = Vec::new();
        let mut elem = None;
        for (i, (letters, v)) in inputs.iter().zip(&vals).enumerate() {
            let Some((e, s)) = self.tensor_of(v, a.pos[i + 1].1, "einsum") else { return self.error_expr(span) };
            let s = s.clone();
            match elem {
                None => elem = Some(e),
                Some(prev) if prev != e => {
                    self.error(Diagnostic::error(
                        Code::E0303,
                        a.pos[i + 1].1,
                        format!("einsum operands have different element types: {} and {}", prev.name(), e.name()),
                    ));
                    return self.error_expr(span);
                }
                _ => {}
            }
            let Some(d) = self.fixed_dims(&s, a.pos[i + 1].1, "einsum") else { return self.error_expr(span) };
            if d.len() != letters.len() {
                let ts = self.ty_str(&v.ty);
                self.error(
                    Diagnostic::error(
                        Code::E0311,
                        a.pos[i + 1].1,
                        format!(
                            "einsum operand {} has rank {} but `{letters}` names {} dims",
                            i + 1,
                            d.len(),
                            letters.len()
                        ),
                    )
                    .label(format!("this is {ts}"))
                    .with_secondary(sspan, "specification"),
                );
                return self.error_expr(span);
            }
            for (c, dim) in letters.chars().zip(d) {
                match sizes.iter().find(|(l, _, _)| *l == c) {
                    Some((_, prev, j)) if *prev != dim => {
                        let (ps, ds) = (self.dim_str(prev), self.dim_str(&dim));
                        self.error(
                            Diagnostic::error(
                                Code::E0311,
                                a.pos[i + 1].1,
                                format!(
                                    "einsum letter `{c}` is {ps} in operand {} but {ds} in operand {}",
                                    j + 1,
                                    i + 1
                                ),
                            )
                            .label(format!("`{c}` = {ds} here"))
                            .with_secondary(a.pos[j + 1].1, format!("`{c}` = {ps} here")),
                        );
                        return self.error_expr(span);
                    }
                    Some(_) => {}
                    None => sizes.push((c, dim, i)),
                }
            }
        }
        let out = match rhs {
            Some(r) => r,
            None => {
                // Implicit form: letters that appear exactly once, in alphabetical order.
                let mut once: Vec<char> =
                    sizes.iter().map(|(c, _, _)| *c).filter(|c| lhs.chars().filter(|x| x == c).count() == 1).collect();
                once.sort();
                once.into_iter().collect()
            }
        };
        let mut shape = Vec::new();
        for c in out.chars() {
            match sizes.iter().find(|(l, _, _)| *l == c) {
                Some((_, d, _)) => shape.push(ShapeItem::Dim(d.clone())),
                None => {
                    bad(self, format!("einsum output letter `{c}` does not appear in any operand"));
                    return self.error_expr(span);
                }
            }
            if out.chars().filter(|x| *x == c).count() > 1 {
                bad(self, format!("einsum output letter `{c}` appears twice"));
                return self.error_expr(span);
            }
        }
        let attrs = Attrs { spec: Some(format!("{lhs}->{out}")), ..Attrs::default() };
        self.prim(Prim::Einsum, vals, attrs, Type::Tensor(TensorTy::new(elem.unwrap(), shape)), span)
    }

    /// `spec` with every `...` replaced by letters it does not use, one per dim the operand has
    /// beyond its letters (right-aligned: the last `...` dims of all operands share letters);
    /// an implicit output gets them first. `None` after a diagnostic.
    fn expand_ellipsis(&mut self, spec: &str, vals: &[ir::Expr], sspan: Span) -> Option<String> {
        if !spec.contains("...") {
            return Some(spec.to_string());
        }
        let (lhs, rhs) = match spec.split_once("->") {
            Some((l, r)) => (l, Some(r)),
            None => (spec, None),
        };
        let terms: Vec<&str> = lhs.split(',').collect();
        let bad = |c: &mut Checker, msg: String| {
            c.error(Diagnostic::error(Code::E0311, sspan, msg).label("in this specification"));
            None
        };
        if terms.len() != vals.len() {
            return bad(
                self,
                format!("einsum specification has {} operands but {} tensors are given", terms.len(), vals.len()),
            );
        }
        let mut ranks = Vec::new();
        for (t, v) in terms.iter().zip(vals) {
            let dots = t.matches("...").count();
            let letters = t.replace("...", "").chars().count();
            let rank = match &v.ty {
                Type::Tensor(tt) if tt.shape.iter().all(|i| matches!(i, ShapeItem::Dim(_))) => tt.shape.len(),
                _ => return bad(self, "einsum with `...` needs operands of known rank".to_string()),
            };
            match dots {
                0 => ranks.push(0),
                1 if rank >= letters => ranks.push(rank - letters),
                1 => {
                    return bad(
                        self,
                        format!("einsum term `{t}` names {letters} dims, but its operand has rank {rank}"),
                    )
                }
                _ => return bad(self, format!("einsum term `{t}` has `...` more than once")),
            }
        }
        if rhs.is_some_and(|r| r.matches("...").count() > 1) {
            return bad(self, "einsum output has `...` more than once".to_string());
        }
        let n = ranks.iter().copied().max().unwrap_or(0);
        let fresh: Vec<char> = ('A'..='Z').chain('a'..='z').filter(|c| !spec.contains(*c)).take(n).collect();
        if fresh.len() < n {
            return bad(self, "einsum specification uses too many letters to expand `...`".to_string());
        }
        let dims = |k: usize| -> String { fresh[n - k..].iter().collect() };
        let inputs: Vec<String> = terms.iter().zip(&ranks).map(|(t, &k)| t.replace("...", &dims(k))).collect();
        let out = match rhs {
            Some(r) => r.replace("...", &dims(n)),
            None => {
                let joined: String = terms.concat().replace("...", "");
                let mut once: Vec<char> =
                    joined.chars().filter(|c| joined.chars().filter(|x| x == c).count() == 1).collect();
                once.sort();
                dims(n) + &once.into_iter().collect::<String>()
            }
        };
        Some(format!("{}->{out}", inputs.join(",")))
    }
}
