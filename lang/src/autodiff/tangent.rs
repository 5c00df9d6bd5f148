//! Forward mode: the tangent rule of every primitive and the forward sweep over the tape
//! (`jvp`). Control flow: an `if` recomputes its taken branch with tangents; a loop carries each
//! state value together with its tangent, so no iteration is recomputed.

use super::build::{along_tangent, AlongTangent, Ax};
use super::err;
use super::fwd::{mk, Gen, LoopNode, Node, Op, Res};
use crate::ir::{Attrs, Expr, ExprKind, Lit, Local, Pat, Prim, Stmt};
use crate::types::TensorTy;
use crate::types::{ElemTy, Type};
use std::collections::HashMap;

fn elem(t: &Type) -> ElemTy {
    match t {
        Type::Tensor(TensorTy { elem: e, .. }) => e.materialise(),
        _ => ElemTy::F32,
    }
}

impl Gen<'_> {
    /// A tangent given for an operand, shaped like the result of a broadcasting operation.
    fn shaped_like_out(&mut self, t: Local, out: Local) -> Res<Local> {
        let (tt, ot) = (self.ty_of(t), self.ty_of(out));
        if tt == ot || !matches!(ot, Type::Tensor(..)) {
            return Ok(t);
        }
        let z = self.zeros_like(out)?;
        Ok(self.p(Prim::Add, &[z, t], Attrs::default(), ot))
    }

    fn tan_or_zero(&mut self, t: Option<Local>, like: Local) -> Res<Local> {
        match t {
            Some(t) => Ok(t),
            None => self.zeros_like(like),
        }
    }

    /// The tangent of one operation from the tangents of its operands (`None` = zero).
    fn jvp_op(&mut self, op: &Op, args: &[Local], ts: &[Option<Local>], out: Local) -> Res<Local> {
        let ot = self.ty_of(out);
        let (p, attrs) = match op {
            Op::Tuple => {
                let mut items = Vec::new();
                for (a, t) in args.iter().zip(ts) {
                    items.push(self.tan_or_zero(*t, *a)?);
                }
                return Ok(self.emit(
                    mk(ExprKind::Tuple(items.iter().map(|x| self.local(*x)).collect()), ot.clone(), self.sid),
                    ot,
                    "tt",
                ));
            }
            Op::ModelBuild => {
                let mut items = Vec::new();
                for (a, t) in args.iter().zip(ts) {
                    items.push(self.tan_or_zero(*t, *a)?);
                }
                return Ok(self.emit(
                    mk(
                        ExprKind::ModelBuild { fields: items.iter().map(|x| self.local(*x)).collect() },
                        ot.clone(),
                        self.sid,
                    ),
                    ot,
                    "tm",
                ));
            }
            Op::Relayout => {
                let t = self.tan_or_zero(ts[0], args[0])?;
                return Ok(self.emit(mk(ExprKind::Local(t), ot.clone(), self.sid), ot, "trl"));
            }
            Op::TupleGet(i) => {
                let t = ts[0].unwrap_or(args[0]);
                return Ok(self.emit(
                    mk(ExprKind::TupleGet(Box::new(self.local(t)), *i), ot.clone(), self.sid),
                    ot,
                    "tg",
                ));
            }
            Op::Field(i) => {
                let t = ts[0].unwrap_or(args[0]);
                return Ok(self.emit(mk(ExprKind::Field(Box::new(self.local(t)), *i), ot.clone(), self.sid), ot, "tf"));
            }
            Op::Prim(p, a) => (*p, a.clone()),
        };
        let t0 = ts.first().copied().flatten();
        let t1 = ts.get(1).copied().flatten();
        let bin = |g: &mut Gen, p: Prim, a: Local, b: Local| g.p(p, &[a, b], Attrs::default(), ot.clone());
        let r = match p {
            Prim::Add | Prim::Sub => {
                let a = match t0 {
                    Some(t) => Some(self.shaped_like_out(t, out)?),
                    None => None,
                };
                let b = match t1 {
                    Some(t) => Some(self.shaped_like_out(t, out)?),
                    None => None,
                };
                match (a, b) {
                    (Some(a), Some(b)) => bin(self, p, a, b),
                    (Some(a), None) => a,
                    (None, Some(b)) if p == Prim::Add => b,
                    (None, Some(b)) => self.p(Prim::Neg, &[b], Attrs::default(), ot.clone()),
                    (None, None) => self.zeros_like(out)?,
                }
            }
            Prim::Mul => {
                let mut parts = Vec::new();
                if let Some(t) = t0 {
                    parts.push(bin(self, Prim::Mul, t, args[1]));
                }
                if let Some(t) = t1 {
                    parts.push(bin(self, Prim::Mul, args[0], t));
                }
                let s = self.sum(&parts);
                self.shaped_like_out(s, out)?
            }
            Prim::Div => {
                let mut parts = Vec::new();
                if let Some(t) = t0 {
                    parts.push(bin(self, Prim::Div, t, args[1]));
                }
                if let Some(t) = t1 {
                    let m = bin(self, Prim::Mul, out, t);
                    let d = bin(self, Prim::Div, m, args[1]);
                    parts.push(self.p(Prim::Neg, &[d], Attrs::default(), ot.clone()));
                }
                let s = self.sum(&parts);
                self.shaped_like_out(s, out)?
            }
            Prim::Pow => {
                let mut parts = Vec::new();
                if let Some(t) = t0 {
                    let one = self.lit(1.0, elem(&self.ty_of(args[1])));
                    let bt = self.ty_of(args[1]);
                    let bm1 = self.p(Prim::Sub, &[args[1], one], Attrs::default(), bt);
                    let pw = bin(self, Prim::Pow, args[0], bm1);
                    let m = bin(self, Prim::Mul, t, args[1]);
                    parts.push(bin(self, Prim::Mul, m, pw));
                }
                if let Some(t) = t1 {
                    let at = self.ty_of(args[0]);
                    let la = self.p(Prim::Log, &[args[0]], Attrs::default(), at);
                    let m = bin(self, Prim::Mul, t, out);
                    parts.push(bin(self, Prim::Mul, m, la));
                }
                let s = self.sum(&parts);
                self.shaped_like_out(s, out)?
            }
            Prim::Maximum | Prim::Minimum => {
                let c = self.p(
                    if p == Prim::Maximum { Prim::Ge } else { Prim::Le },
                    &[args[0], args[1]],
                    Attrs::default(),
                    Type::Tensor(TensorTy::new(
                        crate::types::Elem::T(ElemTy::Bool),
                        match &ot {
                            Type::Tensor(TensorTy { shape: s, .. }) => s.clone(),
                            _ => vec![],
                        },
                    )),
                );
                let a = self.tan_or_zero(t0, args[0])?;
                let b = self.tan_or_zero(t1, args[1])?;
                self.p(Prim::Where, &[c, a, b], Attrs::default(), ot.clone())
            }
            Prim::Where => {
                let a = self.tan_or_zero(ts[1], args[1])?;
                let b = self.tan_or_zero(ts[2], args[2])?;
                self.p(Prim::Where, &[args[0], a, b], Attrs::default(), ot.clone())
            }
            Prim::Cast => self.p(Prim::Cast, &[t0.unwrap_or(args[0])], attrs, ot.clone()),
            Prim::StopGradient => self.zeros_like(out)?,
            Prim::MatMul => {
                let mut parts = Vec::new();
                if let Some(t) = t0 {
                    parts.push(bin(self, Prim::MatMul, t, args[1]));
                }
                if let Some(t) = t1 {
                    parts.push(bin(self, Prim::MatMul, args[0], t));
                }
                self.sum(&parts)
            }
            Prim::Attention | Prim::AttentionWeights => super::attention::jvp(self, p, args, ts, out)?,
            Prim::Einsum => {
                let mut parts = Vec::new();
                for (i, t) in ts.iter().enumerate() {
                    if let Some(t) = t {
                        let mut a = args.to_vec();
                        a[i] = *t;
                        parts.push(self.p(Prim::Einsum, &a, attrs.clone(), ot.clone()));
                    }
                }
                self.sum(&parts)
            }
            // Bilinear, like `@`: one term per operand with a tangent.
            Prim::Conv2d | Prim::Conv2dInputGrad | Prim::Conv2dWeightGrad => {
                let mut parts = Vec::new();
                for (i, t) in ts.iter().enumerate() {
                    if let Some(t) = t {
                        let mut a = args.to_vec();
                        a[i] = *t;
                        parts.push(self.p(p, &a, attrs.clone(), ot.clone()));
                    }
                }
                self.sum(&parts)
            }
            // Max pooling is locally a selection: the tangent is picked where the primal has its
            // maxima (`max_pool2d(x, ẋ)`); the positions themselves carry no tangent.
            Prim::MaxPool2d => {
                let picked = if args.len() == 1 { t0 } else { t1 };
                match picked {
                    Some(t) => self.p(p, &[args[0], t], attrs, ot.clone()),
                    None => self.zeros_like(out)?,
                }
            }
            Prim::MaxPool2dGrad => match t1 {
                Some(t) => self.p(p, &[args[0], t], attrs, ot.clone()),
                None => self.zeros_like(out)?,
            },
            // Linear in the buffer and the update together; the position carries no tangent.
            Prim::Update => {
                let (tx, tv) = (self.tan_or_zero(ts[0], args[0])?, self.tan_or_zero(ts[1], args[1])?);
                self.p(p, &[tx, tv, args[2]], attrs, ot.clone())
            }
            Prim::Concat | Prim::Stack | Prim::CopyJoin => {
                let mut a = Vec::new();
                for (x, t) in args.iter().zip(ts) {
                    a.push(self.tan_or_zero(*t, *x)?);
                }
                self.p(p, &a, attrs, ot.clone())
            }
            // Linear in the first operand; the others (indices, bounds) carry no tangent.
            crate::linear_first_prims!()
            // The linear collectives: a tangent is communicated like its primal.
            | Prim::AllReduceSum
            | Prim::AllReduceMean
            | Prim::AllGather
            | Prim::ReduceScatter
            | Prim::LocalSlice
            | Prim::AllToAll => {
                let mut a = args.to_vec();
                a[0] = t0.unwrap_or(args[0]);
                self.p(p, &a, attrs, ot.clone())
            }
            // A primitive's along one axis is its table entry's (`ir::prim`).
            crate::along_prims!() => {
                let t = t0.unwrap_or(args[0]);
                match along_tangent(p, t, args[0], out, Ax::of(&attrs)) {
                    Some(AlongTangent::Linear) => self.p(p, &[t], attrs, ot.clone()),
                    Some(AlongTangent::Rule(r)) => {
                        let et = match &ot {
                            Type::Tensor(t) => t.elem.materialise(),
                            _ => ElemTy::F32,
                        };
                        self.build(r, et)?
                    }
                    None => return Err(err(self.span, format!("no forward-mode rule for `{}`", p.name()))),
                }
            }
            Prim::Max | Prim::Min | Prim::Logsumexp => {
                let x = args[0];
                let xt = self.ty_of(x);
                let t = t0.unwrap_or(x);
                let y = match (attrs.axis, attrs.keepdims) {
                    (Some(k), false) => {
                        let mut s = match &ot {
                            Type::Tensor(TensorTy { shape: s, .. }) => s.clone(),
                            _ => vec![],
                        };
                        s.insert(k.min(s.len()), crate::types::ShapeItem::Dim(crate::types::Dim::constant(1)));
                        self.p(
                            Prim::ExpandDims,
                            &[out],
                            Attrs { axis: Some(k), ..Attrs::default() },
                            Type::Tensor(TensorTy::new(crate::types::Elem::T(elem(&ot)), s)),
                        )
                    }
                    _ => out,
                };
                let w = if p == Prim::Logsumexp {
                    let d = self.p(Prim::Sub, &[x, y], Attrs::default(), xt.clone());
                    self.p(Prim::Exp, &[d], Attrs::default(), xt.clone())
                } else {
                    let c = self.p(
                        Prim::Eq,
                        &[x, y],
                        Attrs::default(),
                        Type::Tensor(TensorTy::new(
                            crate::types::Elem::T(ElemTy::Bool),
                            match &xt {
                                Type::Tensor(TensorTy { shape: s, .. }) => s.clone(),
                                _ => vec![],
                            },
                        )),
                    );
                    let one = self.lit(1.0, elem(&xt));
                    let zero = self.lit(0.0, elem(&xt));
                    self.p(Prim::Where, &[c, one, zero], Attrs::default(), xt.clone())
                };
                let m = self.p(Prim::Mul, &[t, w], Attrs::default(), xt);
                self.p(
                    Prim::Sum,
                    &[m],
                    Attrs { axis: attrs.axis, keepdims: attrs.keepdims, ..Attrs::default() },
                    ot.clone(),
                )
            }
            // ẏ = gelu_grad(x, ġ) + g·gelu''(x)·ẋ.
            Prim::GeluGrad => {
                let et = match &ot {
                    Type::Tensor(t) => t.elem.materialise(),
                    _ => ElemTy::F32,
                };
                let mut parts = Vec::new();
                if let Some(t) = t1 {
                    parts.push(self.p(Prim::GeluGrad, &[args[0], t], Attrs::default(), ot.clone()));
                }
                if let Some(t) = t0 {
                    let d2 = super::rules::gelu_second(self, args[0], et)?;
                    parts.push(self.build(super::build::l(t) * args[1] * d2, et)?);
                }
                let s = self.sum(&parts);
                self.shaped_like_out(s, out)?
            }
            crate::unary_prims!() => {
                // For f(x) elementwise the reverse rule g ↦ g·f'(x) is also the tangent rule.
                let t = t0.unwrap_or(args[0]);
                let parts = super::rules::vjp(self, &Op::Prim(p, attrs), args, out, t)?;
                parts.first().map(|(_, c)| *c).ok_or_else(|| err(self.span, "internal: no tangent"))?
            }
            // No tangent: the same primitives as the reverse rules' list (a wildcard would let a new
            // primitive compile without a rule).
            Prim::Rem
            | crate::comparison_prims!()
            | Prim::And
            | Prim::Or
            | Prim::Argmax
            | Prim::Argmin
            | Prim::Argsort
            | Prim::Quantize
            | Prim::Prune
            | Prim::OneHot
            | Prim::Zeros
            | Prim::Ones
            | Prim::Full
            | Prim::Arange
            | Prim::Eye
            | Prim::Normal
            | Prim::Uniform
            | Prim::HeNormal
            | Prim::GlorotUniform
            | Prim::Params
            | Prim::Map
            | Prim::ModelSum
            | Prim::ShardState
            | Prim::Print
            | Prim::Load
            | Prim::Save
            | Prim::LogScalar
            | Prim::Exists
            | Prim::Clock
            | Prim::Assert
            | Prim::AssertClose
            | Prim::AllReduceMax
            | Prim::AllReduceMin
            | Prim::TapeNew
            | Prim::TapePush
            | Prim::TapeGet => return Err(err(self.span, format!("no forward-mode rule for `{}`", p.name()))),
        };
        Ok(r)
    }

    /// The forward sweep: tangents of every active value of the tape, in order.
    pub(super) fn tangents(&mut self, tape: &[Node], tan: &mut HashMap<Local, Local>) -> Res<()> {
        for node in tape {
            match node {
                Node::Op { out, op, args, span } => {
                    let ts: Vec<Option<Local>> = args.iter().map(|a| tan.get(a).copied()).collect();
                    if ts.iter().all(Option::is_none) {
                        continue;
                    }
                    self.sid = *span;
                    let t = self.jvp_op(op, args, &ts, *out)?;
                    tan.insert(*out, t);
                }
                Node::If { cond, then, els, ctx, assigned, outs, span, .. } => {
                    self.sid = *span;
                    let te = self.if_branch_jvp(then, ctx, assigned, tan)?;
                    let ee = self.if_branch_jvp(els, ctx, assigned, tan)?;
                    let ty = te.ty.clone();
                    let both = mk(
                        ExprKind::If { cond: Box::new(self.local(*cond)), then: Box::new(te), els: Box::new(ee) },
                        ty.clone(),
                        *span,
                    );
                    let tup = self.emit(both, ty.clone(), "tif");
                    let Type::Tuple(parts) = ty else { continue };
                    for (i, (o, t)) in outs.iter().zip(parts).enumerate() {
                        let v = self.emit(
                            mk(ExprKind::TupleGet(Box::new(self.local(tup)), i), t.clone(), self.sid),
                            t,
                            "tifo",
                        );
                        tan.insert(*o, v);
                    }
                }
                Node::Loop(l) => self.loop_jvp(l, tan)?,
                Node::Custom { span, .. } => {
                    return Err(err(self.prog.span(*span), "internal: a custom derivative in forward mode"));
                }
                // Forward mode inlines `@recompute` calls: it keeps nothing for a backward pass.
                Node::Recompute { span, .. } => {
                    return Err(err(self.prog.span(*span), "internal: a recomputed call in forward mode"));
                }
            }
        }
        Ok(())
    }

    fn if_branch_jvp(
        &mut self,
        b: &Expr,
        ctx: &[super::fwd::FrameCx],
        assigned: &[Local],
        tan: &HashMap<Local, Local>,
    ) -> Res<Expr> {
        let saved = self.replace_frames(ctx.to_vec());
        self.push_block();
        let mut sub = Vec::new();
        let r = self.fwd(b, &mut sub)?;
        let mut local = tan.clone();
        self.tangents(&sub, &mut local)?;
        let results: Vec<Local> = std::iter::once(r).chain(assigned.iter().map(|l| self.env_of(*l))).collect();
        let mut outs = Vec::new();
        for v in results {
            let t = match local.get(&v) {
                Some(t) => *t,
                None => self.zeros_like(v)?,
            };
            outs.push(self.local(t));
        }
        let stmts = self.pop_block();
        self.replace_frames(saved);
        let t = Type::Tuple(outs.iter().map(|o| o.ty.clone()).collect());
        Ok(mk(ExprKind::Block { stmts, result: Box::new(mk(ExprKind::Tuple(outs), t.clone(), self.sid)) }, t, self.sid))
    }

    fn loop_jvp(&mut self, l: &LoopNode, tan: &mut HashMap<Local, Local>) -> Res<()> {
        self.sid = l.span;
        let i32t = Type::scalar(ElemTy::I32);
        // State and tangent slots, advanced together; the primal is recomputed once.
        let mut sslots = Vec::new();
        let mut tslots = Vec::new();
        for v in &l.init {
            let ty = self.ty_of(*v);
            let s = self.new_local(ty.clone(), "s", true);
            self.push_stmt(Stmt::Let { pat: Pat::Local(s), value: self.local(*v) });
            sslots.push(s);
            let t0 = match tan.get(v) {
                Some(t) => *t,
                None => self.zeros_like(*v)?,
            };
            let t = self.new_local(ty, "ts", true);
            self.push_stmt(Stmt::Let { pat: Pat::Local(t), value: self.local(t0) });
            tslots.push(t);
        }
        let start = match l.start {
            Some(s) => s,
            None => self.emit(mk(ExprKind::Lit(Lit::Int(0)), i32t.clone(), self.sid), i32t.clone(), "z"),
        };
        let iv = self.new_local(i32t.clone(), "i", false);
        let saved = self.replace_frames(l.ctx.clone());
        self.push_block();
        let mut local = tan.clone();
        for ((c, s), t) in l.carried.iter().zip(&sslots).zip(&tslots) {
            let ty = self.ty_of(*s);
            let v = self.emit(self.local(*s), ty.clone(), "st");
            self.active.insert(v);
            self.bind_env(*c, v);
            let tv = self.emit(self.local(*t), ty, "stt");
            local.insert(v, tv);
        }
        if let Some(ivar) = l.ivar {
            self.bind_env(ivar, iv);
        }
        let mut sub = Vec::new();
        self.fwd(&l.body, &mut sub)?;
        self.tangents(&sub, &mut local)?;
        for ((c, s), t) in l.carried.iter().zip(&sslots).zip(&tslots) {
            let new = self.env_of(*c);
            let nt = match local.get(&new) {
                Some(x) => *x,
                None => self.zeros_like(new)?,
            };
            self.push_stmt(Stmt::Assign { pat: Pat::Local(*s), value: self.local(new) });
            self.push_stmt(Stmt::Assign { pat: Pat::Local(*t), value: self.local(nt) });
        }
        let stmts = self.pop_block();
        self.replace_frames(saved);
        let body = self.unit_block(stmts);
        self.push_for(iv, start, l.end, body);
        for (o, t) in l.outs.iter().zip(&tslots) {
            let ty = self.ty_of(*t);
            let v = self.emit(self.local(*t), ty, "lto");
            tan.insert(*o, v);
        }
        Ok(())
    }
}
