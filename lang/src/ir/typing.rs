//! Type re-inference over the typed IR: every node's type computed again from its operands
//! (one rule per expression kind, and one per primitive in `typing/prims.rs`) and compared with
//! the type the node carries, so a pass that builds a node of the wrong type is caught at the
//! pass, not as a wrong number or a crash later.
//!
//! Types agree when their element types and shapes agree (a literal's weak element type agrees
//! with any concrete type it could take); layouts are not compared: the sharding pass re-infers
//! them with its own rules (`shard::rules`). A rule that needs a fact the IR does not carry (a
//! run-time slice length, a file's contents for `load`) takes that fact from the node's own
//! type and checks the rest.

mod prims;
pub(crate) use prims::reduction_elem;

use super::{Expr, ExprKind, Func, Lit, Pat, Program, Stmt};
use crate::types::unify::elem_accepts;
use crate::types::{Dim, Elem, ElemTy, FnTy, ModelId, ShapeItem, TensorTy, Type, TypeArg};

/// Re-infers the type of every node of every function of `p`; returns the disagreements.
pub fn check(p: &Program) -> Vec<String> {
    let mut errs = Vec::new();
    for (i, f) in p.funcs.iter().enumerate() {
        let mut cx = Cx { p, f, errs: Vec::new() };
        cx.expr(&f.body);
        // A function whose result is `()` discards its body's value (`fn main() { 1 }`; the REPL's
        // session function shows it).
        if !f.ret.has_error() && !f.ret.is_unit() && !agree(&f.body.ty, &f.ret) && !returns(&f.body) {
            cx.errs.push(format!("body is {} but the function returns {}", cx.show(&f.body.ty), cx.show(&f.ret)));
        }
        let name = p.names.get(f.name);
        errs.extend(cx.errs.into_iter().map(|e| format!("fn#{i} {name}: {e}")));
    }
    errs
}

/// Whether a body ends in `return` (its value's type is then the returned one's).
fn returns(e: &Expr) -> bool {
    match &e.kind {
        ExprKind::Return(_) => true,
        ExprKind::Block { result, .. } => returns(result),
        _ => false,
    }
}

struct Cx<'a> {
    p: &'a Program,
    f: &'a Func,
    errs: Vec<String>,
}

/// What a rule says a node's type is.
pub(super) enum Rule {
    /// The node's type, computed from its operands and attributes.
    Is(Type),
    /// The node's type is its own declaration (`load`'s annotation, a function value); the rule
    /// has checked what it could of it.
    Declared,
}

impl Cx<'_> {
    fn show(&self, t: &Type) -> String {
        crate::types::type_str(t, self.p)
    }

    /// Checks `e` and every node below it.
    fn expr(&mut self, e: &Expr) {
        super::walk::children(e, &mut |c| self.expr(c));
        if let ExprKind::Block { stmts, .. } = &e.kind {
            for s in stmts {
                self.stmt(s);
            }
        }
        if e.ty.has_error() {
            return;
        }
        match self.rule(e) {
            Ok(Rule::Is(t)) => {
                if !t.has_error() && !agree(&t, &e.ty) {
                    let what = describe(e, self.p);
                    let (want, have) = (self.show(&t), self.show(&e.ty));
                    self.errs.push(format!("{what} is {have}, but its operands make it {want}"));
                }
            }
            Ok(Rule::Declared) => {}
            Err(why) => {
                let what = describe(e, self.p);
                self.errs.push(format!("{what}: {why}"));
            }
        }
    }

    fn stmt(&mut self, s: &Stmt) {
        let (Stmt::Let { pat, value } | Stmt::Assign { pat, value }) = s else { return };
        if value.ty.has_error() {
            return;
        }
        self.pat(pat, &value.ty);
    }

    /// A pattern binding a value of type `t`: each local's declared type must agree with its part.
    fn pat(&mut self, pat: &Pat, t: &Type) {
        match pat {
            Pat::Ignore => {}
            Pat::Local(l) => {
                let Some(info) = self.f.locals.get(l.0 as usize) else { return };
                if !info.ty.has_error() && !agree(t, &info.ty) {
                    let name = self.p.names.get(info.name);
                    let (lt, vt) = (self.show(&info.ty), self.show(t));
                    self.errs.push(format!("local `{name}` of type {lt} is bound to a value of type {vt}"));
                }
            }
            Pat::Tuple(ps) => match t {
                Type::Tuple(ts) | Type::List(ts) if ts.len() == ps.len() => {
                    for (p, t) in ps.iter().zip(ts) {
                        self.pat(p, t);
                    }
                }
                _ => {
                    let vt = self.show(t);
                    self.errs.push(format!("a pattern of {} parts is bound to a value of type {vt}", ps.len()))
                }
            },
        }
    }

    fn rule(&self, e: &Expr) -> Result<Rule, String> {
        let p = self.p;
        Ok(match &e.kind {
            ExprKind::Lit(l) => {
                let elem = match l {
                    Lit::Int(_) => Elem::WeakInt,
                    Lit::Float(_) => Elem::WeakFloat,
                    Lit::Bool(_) => Elem::T(ElemTy::Bool),
                    Lit::Str(_) => return Ok(Rule::Is(Type::Str)),
                };
                Rule::Is(Type::tensor_of(elem, vec![]))
            }
            ExprKind::Local(l) => match self.f.locals.get(l.0 as usize) {
                Some(info) => Rule::Is(info.ty.clone()),
                None => return Err(format!("local %{} out of range", l.0)),
            },
            ExprKind::Const(c) => match p.consts.get(c.0 as usize) {
                Some(k) => Rule::Is(k.ty.clone()),
                None => return Err(format!("constant #{} out of range", c.0)),
            },
            ExprKind::DimValue(_) => Rule::Is(Type::tensor_of(Elem::WeakInt, vec![])),
            ExprKind::Prim { prim, args, attrs } => prims::rule(*prim, args, attrs, &e.ty)?,
            ExprKind::Call { func, dims, rests, args } => {
                let callee = p.funcs.get(func.0 as usize).ok_or_else(|| format!("call of unknown fn#{}", func.0))?;
                let mut s = crate::types::unify::Subst::default();
                if callee.dims.len() != dims.len() || callee.rests.len() != rests.len() {
                    return Err(format!(
                        "call with {} dims and {} rests, the callee has {} and {}",
                        dims.len(),
                        rests.len(),
                        callee.dims.len(),
                        callee.rests.len()
                    ));
                }
                s.dims.extend(callee.dims.iter().copied().zip(dims.iter().cloned()));
                s.rests.extend(callee.rests.iter().copied().zip(rests.iter().cloned()));
                // Model type parameters are bound by the arguments' types, as at the call.
                let generic = callee.dims.iter().copied().collect();
                let mut u = crate::types::unify::Unifier::new(&generic);
                for (l, a) in callee.params.iter().zip(args) {
                    if let Some(info) = callee.locals.get(l.0 as usize) {
                        let _ = u.ty(&info.ty, &a.ty);
                    }
                }
                s.models = u.subst.models;
                Rule::Is(s.ty(&callee.ret))
            }
            ExprKind::CallValue { callee, .. } => match &callee.ty {
                Type::Fn(FnTy::Sig { ret, .. }) => Rule::Is((**ret).clone()),
                _ => Rule::Declared,
            },
            ExprKind::FuncRef(_) | ExprKind::Closure { .. } | ExprKind::Transform { .. } => match &e.ty {
                Type::Fn(_) => Rule::Declared,
                _ => return Err("a function value not typed as a function".into()),
            },
            ExprKind::Jvp { .. } | ExprKind::Vjp { .. } => match &e.ty {
                Type::Tuple(ts) if ts.len() == 2 => Rule::Declared,
                _ => return Err("`jvp`/`vjp` must give a pair".into()),
            },
            ExprKind::Tuple(items) => {
                let ts = items.iter().map(|i| i.ty.clone()).collect();
                Rule::Is(if matches!(e.ty, Type::List(_)) { Type::List(ts) } else { Type::Tuple(ts) })
            }
            ExprKind::TupleGet(t, i) => match &t.ty {
                Type::Tuple(ts) | Type::List(ts) => match ts.get(*i) {
                    Some(t) => Rule::Is(t.clone()),
                    None => return Err(format!("element {i} of a tuple of {}", ts.len())),
                },
                Type::Error => Rule::Declared,
                other => return Err(format!("element {i} of {}, not a tuple", self.show(other))),
            },
            ExprKind::Field(m, i) => Rule::Is(self.field_type(&m.ty, *i)?),
            ExprKind::ModelInit { model, args, .. } => Rule::Is(Type::Model(*model, args.clone())),
            ExprKind::ModelBuild { fields } => {
                let n = match &e.ty {
                    Type::Model(id, _) => p.models.get(id.0 as usize).map_or(0, |m| m.fields.len()),
                    _ => return Err(format!("a model built as {}", self.show(&e.ty))),
                };
                if n != fields.len() {
                    return Err(format!("{} fields given for a model of {n}", fields.len()));
                }
                for (i, f) in fields.iter().enumerate() {
                    let want = self.field_type(&e.ty, i)?;
                    if !f.ty.has_error() && !agree(&f.ty, &want) {
                        return Err(format!("field {i} is {}, the model's is {}", self.show(&f.ty), self.show(&want)));
                    }
                }
                Rule::Declared
            }
            ExprKind::Block { result, .. } => {
                if returns(result) {
                    Rule::Declared
                } else {
                    Rule::Is(result.ty.clone())
                }
            }
            ExprKind::If { cond, then, els } => {
                if !cond.ty.has_error() && !agree(&cond.ty, &Type::scalar(ElemTy::Bool)) {
                    return Err(format!("the condition is {}", self.show(&cond.ty)));
                }
                if returns(then) || returns(els) || e.ty.is_unit() {
                    Rule::Declared
                } else {
                    if !agree(&then.ty, &els.ty) && !then.ty.has_error() && !els.ty.has_error() {
                        return Err(format!("branches are {} and {}", self.show(&then.ty), self.show(&els.ty)));
                    }
                    Rule::Is(then.ty.clone())
                }
            }
            ExprKind::ForRange { .. } | ExprKind::ForBatches { .. } | ExprKind::While { .. } => Rule::Is(Type::unit()),
            ExprKind::Return(_) => Rule::Declared,
        })
    }

    /// The type of field `i` of a value of model type `m`, with the model's dims and type
    /// parameters put in.
    fn field_type(&self, m: &Type, i: usize) -> Result<Type, String> {
        let Type::Model(id, targs) = m else {
            return match m {
                Type::Error | Type::ModelVar(_) => Ok(Type::Error),
                other => Err(format!("a field of {}, not a model", self.show(other))),
            };
        };
        model_field(self.p, *id, targs, i).ok_or_else(|| format!("field {i} of a model without it"))
    }
}

/// Field `i` of model `id` instantiated with `targs`.
pub(super) fn model_field(p: &Program, id: ModelId, targs: &[TypeArg], i: usize) -> Option<Type> {
    let model = p.models.get(id.0 as usize)?;
    Some(super::Model::field_ty(&model.arg_subst(targs), model.fields.get(i)?))
}

/// Names a node for a message: its primitive, or its kind.
fn describe(e: &Expr, p: &Program) -> String {
    match &e.kind {
        ExprKind::Prim { prim, .. } => format!("`{}`", prim.name()),
        ExprKind::Call { func, .. } => {
            format!("call of `{}`", p.funcs.get(func.0 as usize).map_or("?", |f| p.names.get(f.name)))
        }
        ExprKind::Lit(_) => "a literal".into(),
        ExprKind::Local(_) | ExprKind::Const(_) | ExprKind::DimValue(_) => "a value".into(),
        ExprKind::CallValue { .. } => "a call of a function value".into(),
        ExprKind::FuncRef(_) | ExprKind::Closure { .. } | ExprKind::Transform { .. } => "a function value".into(),
        ExprKind::Jvp { .. } => "`jvp`".into(),
        ExprKind::Vjp { .. } => "`vjp`".into(),
        ExprKind::Tuple(_) => "a tuple".into(),
        ExprKind::TupleGet(_, i) => format!("element {i} of a tuple"),
        ExprKind::Field(_, i) => format!("field {i} of a model"),
        ExprKind::ModelInit { .. } => "`init`".into(),
        ExprKind::ModelBuild { .. } => "a model built field by field".into(),
        ExprKind::Block { .. } => "a block".into(),
        ExprKind::If { .. } => "an `if`".into(),
        ExprKind::ForRange { .. } | ExprKind::ForBatches { .. } | ExprKind::While { .. } => "a loop".into(),
        ExprKind::Return(_) => "`return`".into(),
    }
}

/// The type primitive `prim` gives the operands `args` with `attrs`, for code that builds nodes
/// (the derivative rules' builder); an error for a primitive whose type is its declaration.
pub fn infer_prim(prim: super::Prim, args: &[Expr], attrs: &super::Attrs) -> Result<Type, String> {
    match prims::rule(prim, args, attrs, &Type::Error)? {
        Rule::Is(t) => Ok(t),
        Rule::Declared => Err(format!("`{}` takes the type it is declared with", prim.name())),
    }
}

/// Whether an inferred type and a declared one agree: element types (a weak literal type
/// agrees with every type it can take) and shapes; layouts are not compared.
pub fn agree(a: &Type, b: &Type) -> bool {
    match (a, b) {
        (Type::Error, _) | (_, Type::Error) => true,
        (Type::Tensor(x), Type::Tensor(y)) => elems_agree(x.elem, y.elem) && x.shape == y.shape,
        (Type::Tuple(x), Type::Tuple(y)) | (Type::List(x), Type::List(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(a, b)| agree(a, b))
        }
        (Type::Model(m, x), Type::Model(n, y)) => {
            m == n
                && x.len() == y.len()
                && x.iter().zip(y).all(|(a, b)| match (a, b) {
                    (TypeArg::Dim(a), TypeArg::Dim(b)) => a == b,
                    (TypeArg::Type(a), TypeArg::Type(b)) => agree(a, b),
                    _ => false,
                })
        }
        (Type::ModelVar(a), Type::ModelVar(b)) => a == b,
        (Type::ModelType(a), Type::ModelType(b)) => agree(a, b),
        // Function values are typed at each application.
        (Type::Fn(_), Type::Fn(_)) => true,
        (Type::Str, Type::Str) => true,
        _ => false,
    }
}

/// Element types agree when equal, or when a weak one can take the other.
pub(super) fn elems_agree(a: Elem, b: Elem) -> bool {
    a == b || (a.is_weak() && elem_accepts(b, a).is_ok()) || (b.is_weak() && elem_accepts(a, b).is_ok())
}

/// A tensor type from its parts.
pub(super) fn tensor(elem: Elem, shape: Vec<ShapeItem>) -> Type {
    Type::Tensor(TensorTy::new(elem, shape))
}

/// Dims as shape items.
pub(super) fn dims(ds: &[Dim]) -> Vec<ShapeItem> {
    ds.iter().cloned().map(ShapeItem::Dim).collect()
}
