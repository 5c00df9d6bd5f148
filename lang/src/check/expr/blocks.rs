//! Blocks: statements in order, the value of the last expression, and the rest of a block run
//! only while its loop's iteration goes on after a statement that may `break` or `continue`.

use super::*;

impl Checker {
    pub(crate) fn check_block(&mut self, cx: &mut FnCx, b: &ast::Block, expected: Option<&Type>) -> ir::Expr {
        self.check_block_as(cx, b, expected, false)
    }

    /// A block; `loop_body` when it is the body of a loop (whose jumps are checked here).
    pub(crate) fn check_block_as(
        &mut self,
        cx: &mut FnCx,
        b: &ast::Block,
        expected: Option<&Type>,
        loop_body: bool,
    ) -> ir::Expr {
        cx.scopes.push(vec![]);
        if loop_body {
            b.stmts.iter().for_each(|s| self.check_jump_positions(s));
        }
        let e = self.check_stmts(cx, &b.stmts, b.span, expected);
        cx.scopes.pop();
        e
    }

    fn check_stmts(&mut self, cx: &mut FnCx, list: &[ast::Stmt], span: Span, expected: Option<&Type>) -> ir::Expr {
        let mut stmts = Vec::new();
        let mut result = None;
        let n = list.len();
        for (i, s) in list.iter().enumerate() {
            let last = i + 1 == n;
            match &s.kind {
                ast::StmtKind::Expr(e) if last => {
                    result = Some(self.check_expr(cx, e, expected));
                }
                _ => {
                    stmts.extend(self.check_stmt(cx, s));
                    // The rest of the block runs only if this statement did not jump.
                    if !last && !cx.loops.is_empty() && jumps::exits(s).is_some() {
                        let rest = &list[i + 1..];
                        let rspan = match (rest.first(), rest.last()) {
                            (Some(a), Some(b)) if a.span.file == b.span.file => {
                                Span::new(a.span.file, a.span.start as usize, b.span.end as usize)
                            }
                            _ => span,
                        };
                        let r = self.check_stmts(cx, rest, rspan, expected);
                        let g = self.guard_rest(cx, r);
                        stmts.push(Stmt::Expr(g));
                        break;
                    }
                }
            }
        }
        let result = match result {
            Some(r) => r,
            None => {
                // A block ending in `return` has no value of its own.
                let ends_in_return = matches!(list.last().map(|s| &s.kind), Some(ast::StmtKind::Return(_)));
                let mut u = self.unit(span);
                if ends_in_return {
                    u.ty = Type::Error;
                }
                u
            }
        };
        if stmts.is_empty() {
            return result;
        }
        let ty = result.ty.clone();
        let s = self.span_id(span);
        mk(ExprKind::Block { stmts, result: Box::new(result) }, ty, s)
    }
}
