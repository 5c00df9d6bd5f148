//! `shard:` and `offload:` on a call of an `@optimizer_init` function (`adam.init(m, lr: …,
//! shard: dp)`, spec/sharding.md): checked here and taken out of the call's arguments; `shard:`
//! wraps the state in `shard_state` over the axis (each rank keeps its piece of it,
//! `interp::zero`), and `offload: host` marks it to live in host memory, its update run there
//! while the model stays on the device (nothing changes on the CPU device).

use super::super::expr::FnCx;
use super::super::{Checker, Diagnostic};
use crate::diag::Code;
use crate::ir::{self, Attrs, ExprKind, Prim};
use crate::syntax::ast;
use crate::types::AxisId;

/// What the optimizer arguments of one call asked for.
pub(crate) struct OptimizerArgs {
    pub shard: Option<AxisId>,
    /// `offload: host`.
    pub host: bool,
}

impl Checker {
    /// Takes `shard:` and `offload:` out of `args` when `annotations` mark an optimizer's
    /// `init`; reports a bad value of either.
    pub(crate) fn optimizer_args(
        &mut self,
        cx: &FnCx,
        annotations: &[String],
        args: &[ast::Arg],
    ) -> (Vec<ast::Arg>, OptimizerArgs) {
        let mut out = OptimizerArgs { shard: None, host: false };
        if !annotations.iter().any(|a| a == "optimizer_init") {
            return (args.to_vec(), out);
        }
        let mut rest = Vec::with_capacity(args.len());
        for a in args {
            let Some(n) = &a.name else {
                rest.push(a.clone());
                continue;
            };
            let name = match &a.value.kind {
                ast::ExprKind::Name(v) => Some(ast::Ident { name: v.clone(), span: a.value.span }),
                _ => None,
            };
            match (n.name.as_str(), name) {
                ("shard", Some(axis)) => out.shard = self.check_shard_axis(cx.module, &axis).map(|(a, _)| a),
                ("shard", None) => self.error(
                    Diagnostic::error(Code::E0502, a.value.span, "`shard` takes a mesh axis")
                        .label("not the name of an axis")
                        .with_help("write `shard: dp` with an axis of the program's `mesh`"),
                ),
                ("offload", Some(place)) if place.name == "host" => out.host = true,
                ("offload", _) => self.error(
                    Diagnostic::error(Code::E0212, a.value.span, "`offload` takes `host`")
                        .label("not a place for the optimizer state")
                        .with_help("`offload: host` keeps the state and its update in host memory"),
                ),
                _ => rest.push(a.clone()),
            }
        }
        (rest, out)
    }

    /// The state `call` makes, laid out as `opt` asked.
    pub(crate) fn shard_state(&mut self, call: ir::Expr, opt: &OptimizerArgs) -> ir::Expr {
        if opt.shard.is_none() && !opt.host {
            return call;
        }
        let (ty, span) = (call.ty.clone(), call.span);
        let attrs = Attrs { mesh_axes: opt.shard.into_iter().collect(), host: opt.host, ..Attrs::default() };
        super::super::expr::mk(
            ExprKind::Prim { prim: Prim::ShardState, args: vec![call], attrs: Box::new(attrs) },
            ty,
            span,
        )
    }
}
