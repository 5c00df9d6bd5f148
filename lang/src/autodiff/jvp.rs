//! Forward mode (`jvp`) built from reverse mode by transposition: the pullback `u ↦ Jᵀu` is
//! linear in `u`, so `J v = ∇ᵤ ⟨Jᵀu, v⟩`. The pass generates, as ordinary IR functions,
//! `H(x…, u, v…) = Σ ⟨pullback(x…, u)ᵢ, vᵢ⟩`, its gradient with respect to `u`, and
//! `JVP(x…, v…) = (f(x…), ∇ᵤH(x…, 0, v…))`.

use super::{derive, err, Mode};
use crate::diag::Diagnostic;
use crate::ir::{Attrs, Expr, ExprKind, Func, Local, LocalInfo, Name, Prim, Program, SpanId};
use crate::source::Span;
use crate::types::{Dim, Elem, ElemTy, FuncId, ShapeItem, Type};

fn mk(kind: ExprKind, ty: Type, span: SpanId) -> Expr {
    Expr { kind, ty, span }
}

struct B {
    locals: Vec<LocalInfo>,
    span: SpanId,
}

impl B {
    fn local(&mut self, ty: Type) -> Local {
        self.locals.push(LocalInfo { name: Name(u32::MAX), ty, mutable: false });
        Local(self.locals.len() as u32 - 1)
    }
    fn get(&self, l: Local) -> Expr {
        mk(ExprKind::Local(l), self.locals[l.0 as usize].ty.clone(), self.span)
    }
    fn prim(&self, p: Prim, args: Vec<Expr>, attrs: Attrs, ty: Type) -> Expr {
        mk(ExprKind::Prim { prim: p, args, attrs: Box::new(attrs) }, ty, self.span)
    }
    fn call(&self, prog: &Program, f: FuncId, args: Vec<Expr>) -> Expr {
        let func = prog.func(f);
        let dims = func.dims.iter().map(|s| Dim::var(*s)).collect();
        let rests = func.rests.iter().map(|r| vec![ShapeItem::Rest(*r)]).collect();
        mk(ExprKind::Call { func: f, dims, rests, args }, func.ret.clone(), self.span)
    }
}

fn zeros(b: &B, ty: &Type, like: Expr) -> Result<Expr, ()> {
    match ty {
        Type::Tensor(e, s) => {
            let dims: Option<Vec<Dim>> = s
                .iter()
                .map(|i| match i {
                    ShapeItem::Dim(d) => Some(d.clone()),
                    ShapeItem::Rest(_) => None,
                })
                .collect();
            let et = e.materialise();
            Ok(match dims {
                Some(d) => b.prim(Prim::Zeros, vec![], Attrs { shape: d, dtype: Some(et), ..Attrs::default() }, ty.clone()),
                None => {
                    let z = mk(ExprKind::Lit(crate::ir::Lit::Float(0.0)), Type::scalar(et), b.span);
                    b.prim(Prim::Mul, vec![like, z], Attrs::default(), ty.clone())
                }
            })
        }
        _ => Err(()),
    }
}

/// Generates `JVP_f(x…, v…) -> (f(x…), J v)`.
pub(super) fn generate(prog: &mut Program, f: FuncId, span: Span) -> Result<Func, Diagnostic> {
    let pb = derive(prog, f, Mode::Pullback, span)?;
    let func = prog.func(f).clone();
    let sid = func.span;
    let ret = func.ret.clone();
    if !matches!(ret, Type::Tensor(..)) || func.params.iter().any(|p| !matches!(func.locals[p.0 as usize].ty, Type::Tensor(..))) {
        return Err(err(span, "`jvp` supports functions of tensors returning a tensor"));
    }
    // H(x…, u, v…) = Σ sum(pullback(x…, u)ᵢ * vᵢ), in f64.
    let mut b = B { locals: func.locals.clone(), span: sid };
    let xs: Vec<Local> = func.params.clone();
    let u = b.local(ret.clone());
    let vs: Vec<Local> = xs.iter().map(|x| b.local(func.locals[x.0 as usize].ty.clone())).collect();
    let mut args: Vec<Expr> = xs.iter().map(|x| b.get(*x)).collect();
    args.push(b.get(u));
    let cot = b.call(prog, pb, args);
    let f64t = Type::scalar(ElemTy::F64);
    let mut total: Option<Expr> = None;
    for (i, v) in vs.iter().enumerate() {
        let vt = b.locals[v.0 as usize].ty.clone();
        if !matches!(&vt, Type::Tensor(e, _) if e.is_float()) {
            continue;
        }
        let ci = mk(ExprKind::TupleGet(Box::new(cot.clone()), i), vt.clone(), sid);
        let prod = b.prim(Prim::Mul, vec![ci, b.get(*v)], Attrs::default(), vt.clone());
        let et = match &vt {
            Type::Tensor(Elem::T(t), _) => *t,
            _ => ElemTy::F32,
        };
        let s = b.prim(Prim::Sum, vec![prod], Attrs::default(), Type::scalar(et));
        let s = b.prim(Prim::Cast, vec![s], Attrs { dtype: Some(ElemTy::F64), ..Attrs::default() }, f64t.clone());
        total = Some(match total {
            None => s,
            Some(t) => b.prim(Prim::Add, vec![t, s], Attrs::default(), f64t.clone()),
        });
    }
    let body = total.unwrap_or_else(|| mk(ExprKind::Lit(crate::ir::Lit::Float(0.0)), f64t.clone(), sid));
    let mut hparams = xs.clone();
    hparams.push(u);
    hparams.extend(vs.iter().copied());
    let h = Func {
        name: func.name,
        dims: func.dims.clone(),
        rests: func.rests.clone(),
        models: func.models.clone(),
        n_captures: func.n_captures,
        params: hparams,
        ret: f64t,
        locals: b.locals.clone(),
        body,
        annotations: vec![],
        span: sid,
    };
    let hid = FuncId(prog.funcs.len() as u32);
    prog.funcs.push(h);
    let gh = derive(prog, hid, Mode::Grad { wrt: xs.len() }, span)?;
    // JVP(x…, v…) = (f(x…), ∇ᵤH(x…, 0, v…)).
    let mut b = B { locals: func.locals.clone(), span: sid };
    let vs: Vec<Local> = xs.iter().map(|x| b.local(func.locals[x.0 as usize].ty.clone())).collect();
    let y = b.call(prog, f, xs.iter().map(|x| b.get(*x)).collect());
    let yl = b.local(ret.clone());
    let z = zeros(&b, &ret, b.get(yl)).map_err(|_| err(span, "`jvp` of this result type is not supported"))?;
    let mut gargs: Vec<Expr> = xs.iter().map(|x| b.get(*x)).collect();
    gargs.push(z);
    gargs.extend(vs.iter().map(|v| b.get(*v)));
    let t = b.call(prog, gh, gargs);
    let out_ty = Type::Tuple(vec![ret.clone(), ret.clone()]);
    let result = mk(ExprKind::Tuple(vec![b.get(yl), t]), out_ty.clone(), sid);
    let body = mk(
        ExprKind::Block { stmts: vec![crate::ir::Stmt::Let { pat: crate::ir::Pat::Local(yl), value: y }], result: Box::new(result) },
        out_ty.clone(),
        sid,
    );
    let mut params = xs.clone();
    params.extend(vs);
    Ok(Func {
        name: func.name,
        dims: func.dims.clone(),
        rests: func.rests.clone(),
        models: func.models.clone(),
        n_captures: func.n_captures,
        params,
        ret: out_ty,
        locals: b.locals,
        body,
        annotations: vec![],
        span: sid,
    })
}
