//! The IR verifier: structural invariants every pass must keep. Run after checking and after
//! every transform; a violation is a compiler bug, reported as a message, never a panic.

use super::{walk::walk, Expr, ExprKind, Program, Stmt};
use crate::types::Type;

/// Checks the invariants of a whole program; returns the violations found.
pub fn verify(p: &Program) -> Vec<String> {
    let mut errs = Vec::new();
    for (i, f) in p.funcs.iter().enumerate() {
        let name = p.names.get(f.name).to_string();
        let nlocals = f.locals.len();
        let check_local = |l: super::Local, errs: &mut Vec<String>| {
            if l.0 as usize >= nlocals {
                errs.push(format!("fn#{i} {name}: local %{} out of range ({nlocals} locals)", l.0));
            }
        };
        for l in &f.params {
            check_local(*l, &mut errs);
        }
        let mut local_errs = Vec::new();
        walk(&f.body, &mut |e: &Expr| match &e.kind {
            ExprKind::Local(l) => check_local(*l, &mut local_errs),
            ExprKind::Call { func, args, .. } => match p.funcs.get(func.0 as usize) {
                Some(callee) if callee.params.len() != args.len() && !callee.params.is_empty() => {
                    local_errs.push(format!(
                        "fn#{i} {name}: call of {} with {} arguments, expected {}",
                        p.names.get(callee.name),
                        args.len(),
                        callee.params.len()
                    ))
                }
                None => local_errs.push(format!("fn#{i} {name}: call of unknown fn#{}", func.0)),
                _ => {}
            },
            ExprKind::Prim { prim, args, .. } => {
                let want = match prim.class() {
                    super::prim::Class::Unary | super::prim::Class::Reduce | super::prim::Class::Along => Some(1),
                    super::prim::Class::Binary => Some(2),
                    super::prim::Class::Other => None,
                };
                if want.is_some_and(|w| w != args.len()) {
                    local_errs.push(format!("fn#{i} {name}: {} with {} arguments", prim.name(), args.len()));
                }
            }
            ExprKind::Block { stmts, .. } => {
                for s in stmts {
                    if let Stmt::Let { pat, .. } | Stmt::Assign { pat, .. } = s {
                        pat.each_local(&mut |l| check_local(l, &mut local_errs));
                    }
                }
            }
            ExprKind::Tuple(items) => {
                if let Type::Tuple(ts) | Type::List(ts) = &e.ty {
                    if ts.len() != items.len() {
                        local_errs.push(format!(
                            "fn#{i} {name}: tuple of {} typed with {} elements",
                            items.len(),
                            ts.len()
                        ));
                    }
                }
            }
            _ => {}
        });
        errs.extend(local_errs);
    }
    errs.extend(super::typing::check(p));
    errs
}
