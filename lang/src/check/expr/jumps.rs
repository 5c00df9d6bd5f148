//! `break` and `continue`: where they may stand, and their lowering to structured IR.
//!
//! The IR has no jumps. A loop whose body breaks or continues gets two hidden `bool` locals:
//! `go` (this iteration is still running) and `brk` (the loop is finished). `break` sets both,
//! `continue` clears `go`, the statements after one that may jump run under `if go`, and the
//! loop's condition reads `brk` first. A `for` over a range with jumps becomes a `while` over a
//! counter, so that `break` stops it at once. Every later stage (interpreter, JIT, autodiff,
//! vmap, sharding) then sees ordinary control flow and needs no rule of its own.

use super::*;

/// The hidden flags of one loop whose body jumps.
#[derive(Clone, Copy, Debug)]
pub struct LoopFlags {
    pub go: Local,
    pub brk: Local,
}

/// The keyword of a jump statement.
fn keyword(s: &ast::Stmt) -> Option<&'static str> {
    match s.kind {
        ast::StmtKind::Break => Some("break"),
        ast::StmtKind::Continue => Some("continue"),
        _ => None,
    }
}

/// Every jump of the current loop inside `s` (not in nested loop bodies or closures), with
/// whether it stands in a statement position: reached only through blocks and the branches of
/// `if` statements. A jump elsewhere would skip the rest of an expression that is being evaluated.
fn stmt_jumps(s: &ast::Stmt, proper: bool, out: &mut Vec<(Span, &'static str, bool)>) {
    use ast::StmtKind as S;
    match &s.kind {
        S::Break | S::Continue => out.extend(keyword(s).map(|k| (s.span, k, proper))),
        S::Expr(e) => expr_jumps(e, proper, out),
        S::Let { value, .. } | S::Var { value, .. } => expr_jumps(value, false, out),
        S::Assign { target, value, .. } => {
            expr_jumps(target, false, out);
            expr_jumps(value, false, out);
        }
        S::Return(Some(e)) => expr_jumps(e, false, out),
        S::Return(None) | S::Error => {}
    }
}

fn expr_jumps(e: &ast::Expr, proper: bool, out: &mut Vec<(Span, &'static str, bool)>) {
    use ast::ExprKind as K;
    match &e.kind {
        K::Block(b) => b.stmts.iter().for_each(|s| stmt_jumps(s, proper, out)),
        K::If { cond, then, els } => {
            expr_jumps(cond, false, out);
            then.stmts.iter().for_each(|s| stmt_jumps(s, proper, out));
            if let Some(els) = els {
                expr_jumps(els, proper, out);
            }
        }
        // A nested loop's body belongs to that loop; its header is a value of this one.
        K::While { cond, .. } => expr_jumps(cond, false, out),
        K::For { iter, .. } => match iter {
            ast::ForIter::Range(a, b) => {
                expr_jumps(a, false, out);
                expr_jumps(b, false, out);
            }
            ast::ForIter::Expr(x) => expr_jumps(x, false, out),
        },
        K::Closure { .. } => {}
        K::Tuple(xs) | K::List(xs) => xs.iter().for_each(|x| expr_jumps(x, false, out)),
        K::Unary(_, a) | K::Field(a, _) | K::TupleIndex(a, _, _) | K::StackModel(a, _) => expr_jumps(a, false, out),
        K::Binary(_, a, b) => {
            expr_jumps(a, false, out);
            expr_jumps(b, false, out);
        }
        K::Call(f, args) => {
            expr_jumps(f, false, out);
            args.iter().for_each(|a| expr_jumps(&a.value, false, out));
        }
        K::Index(a, idx) => {
            expr_jumps(a, false, out);
            for i in idx {
                match i {
                    ast::IndexArg::Expr(x) | ast::IndexArg::Named { value: x, .. } => expr_jumps(x, false, out),
                    s @ ast::IndexArg::Slice { .. } => s.slice_parts().for_each(|x| expr_jumps(x, false, out)),
                }
            }
        }
        K::Int(_) | K::Float(_) | K::Bool(_) | K::Str(_) | K::Name(_) | K::Wild | K::Error => {}
    }
}

/// The first jump of the current loop that `s` may take, if any.
pub(super) fn exits(s: &ast::Stmt) -> Option<&'static str> {
    let mut out = Vec::new();
    stmt_jumps(s, true, &mut out);
    out.first().map(|j| j.1)
}

/// Whether a loop body breaks or continues its own loop.
pub(super) fn body_jumps(b: &ast::Block) -> bool {
    b.stmts.iter().any(|s| exits(s).is_some())
}

/// Whether a block's last statement is `break` or `continue`.
pub(super) fn ends_in_jump(b: &ast::Block) -> bool {
    b.stmts.last().is_some_and(|s| keyword(s).is_some())
}

/// Whether an `else` branch (a block or an `else if`) ends in a jump on some path.
pub(super) fn expr_ends_in_jump(e: &ast::Expr) -> bool {
    match &e.kind {
        ast::ExprKind::Block(b) => ends_in_jump(b),
        ast::ExprKind::If { then, els, .. } => ends_in_jump(then) || els.as_deref().is_some_and(expr_ends_in_jump),
        _ => false,
    }
}

fn bool_ty() -> Type {
    Type::scalar(ElemTy::Bool)
}

impl Checker {
    /// Reports the jumps of a loop body's statement that stand where a value is needed.
    pub(super) fn check_jump_positions(&mut self, s: &ast::Stmt) {
        let mut out = Vec::new();
        stmt_jumps(s, true, &mut out);
        for (span, k, proper) in out {
            if !proper {
                self.error(Diagnostic::error(
                    Code::E0327,
                    span,
                    format!("`{k}` inside an expression whose value is needed"),
                ));
            }
        }
    }

    /// `break` or `continue`: the assignments of the innermost loop's flags.
    pub(super) fn check_jump(&mut self, cx: &mut FnCx, s: &ast::Stmt) -> Vec<Stmt> {
        let k = keyword(s).unwrap_or("break");
        let Some(flags) = cx.loops.last().copied() else {
            self.error(Diagnostic::error(Code::E0326, s.span, format!("`{k}` outside a loop")));
            return vec![];
        };
        let sid = self.span_id(s.span);
        let set = |l: Local, b: bool| Stmt::Assign {
            pat: Pat::Local(l),
            value: mk(ExprKind::Lit(Lit::Bool(b)), bool_ty(), sid),
        };
        let mut out = vec![set(flags.go, false)];
        if k == "break" {
            out.push(set(flags.brk, true));
        }
        out
    }

    /// The statements after one that may jump, run only while the iteration goes on.
    pub(super) fn guard_rest(&mut self, cx: &FnCx, rest: ir::Expr) -> ir::Expr {
        let Some(flags) = cx.loops.last() else { return rest };
        let s = rest.span;
        let unit = mk(ExprKind::Tuple(vec![]), Type::unit(), s);
        let cond = mk(ExprKind::Local(flags.go), bool_ty(), s);
        mk(ExprKind::If { cond: Box::new(cond), then: Box::new(rest), els: Box::new(unit) }, Type::unit(), s)
    }

    /// Starts a loop whose body jumps: its flags, and the statements that initialise them.
    pub(super) fn begin_jump_loop(&mut self, cx: &mut FnCx, span: Span) -> (LoopFlags, Vec<Stmt>) {
        let go = cx.new_hidden_local(self, "go", bool_ty());
        let brk = cx.new_hidden_local(self, "brk", bool_ty());
        let sid = self.span_id(span);
        let init = |l: Local, b: bool| Stmt::Let {
            pat: Pat::Local(l),
            value: mk(ExprKind::Lit(Lit::Bool(b)), bool_ty(), sid),
        };
        (LoopFlags { go, brk }, vec![init(brk, false), init(go, true)])
    }

    /// `cond` unless the loop has broken: `if brk { false } else { cond }`.
    pub(super) fn unless_broken(&mut self, flags: LoopFlags, cond: ir::Expr, span: Span) -> ir::Expr {
        let sid = self.span_id(span);
        let f = mk(ExprKind::Lit(Lit::Bool(false)), bool_ty(), sid);
        let brk = mk(ExprKind::Local(flags.brk), bool_ty(), sid);
        mk(ExprKind::If { cond: Box::new(brk), then: Box::new(f), els: Box::new(cond) }, bool_ty(), sid)
    }

    /// A loop body that first marks its iteration as running: `go = true; body`.
    pub(super) fn running_body(&mut self, flags: LoopFlags, mut pre: Vec<Stmt>, body: ir::Expr) -> ir::Expr {
        let s = body.span;
        pre.push(Stmt::Assign { pat: Pat::Local(flags.go), value: mk(ExprKind::Lit(Lit::Bool(true)), bool_ty(), s) });
        pre.push(Stmt::Expr(body));
        mk(
            ExprKind::Block { stmts: pre, result: Box::new(mk(ExprKind::Tuple(vec![]), Type::unit(), s)) },
            Type::unit(),
            s,
        )
    }

    /// `e` evaluated for its effects only: a unit value.
    pub(super) fn discard(&mut self, e: ir::Expr) -> ir::Expr {
        if e.ty == Type::unit() {
            return e;
        }
        let s = e.span;
        mk(
            ExprKind::Block {
                stmts: vec![Stmt::Expr(e)],
                result: Box::new(mk(ExprKind::Tuple(vec![]), Type::unit(), s)),
            },
            Type::unit(),
            s,
        )
    }

    /// `init; lp` as one unit-valued block.
    pub(super) fn with_init(&mut self, init: Vec<Stmt>, lp: ir::Expr) -> ir::Expr {
        let s = lp.span;
        mk(ExprKind::Block { stmts: init, result: Box::new(lp) }, Type::unit(), s)
    }
}
