//! Resolving written types and dimension expressions to `Type` and `Dim`.

use super::{Checker, ItemRef, ModuleId};
use crate::diag::{Code, Diagnostic};
use crate::syntax::ast::{self, DimArg, DimKind, TypeKind};
use crate::types::{AxisId, Layout, TensorTy};
use crate::types::{Dim, Elem, ElemTy, FnTy, RestSym, ShapeItem, Sym, TyVar, Type, TypeArg};
use std::collections::HashMap;

/// The generic names visible while resolving a type.
#[derive(Clone, Debug, Default)]
pub struct TyEnv {
    pub dims: HashMap<String, Dim>,
    pub rests: HashMap<String, RestSym>,
    pub models: HashMap<String, TyVar>,
    /// When set, unknown dim names become fresh run-time dims (in `let` annotations) and are
    /// recorded here; `_` becomes a fresh dim to be inferred.
    pub fresh: Option<Vec<(String, Sym)>>,
    /// Dim names used without a declaration (each reported once): a function's signature
    /// takes them as generic dims, so that its calls check without follow-up errors.
    pub undeclared: Vec<(String, Sym)>,
}

impl Checker {
    pub(crate) fn resolve_dim(&mut self, m: ModuleId, d: &ast::DimExpr, env: &mut TyEnv) -> Dim {
        match &d.kind {
            DimKind::Int(n) => Dim::constant(*n),
            DimKind::Infer => {
                if env.fresh.is_some() {
                    let s = self.new_sym("_");
                    if let Some(fresh) = env.fresh.as_mut() {
                        fresh.push(("_".to_string(), s));
                    }
                    Dim::var(s)
                } else {
                    self.error(
                        Diagnostic::error(Code::E0307, d.span, "`_` is only allowed in `let` annotations")
                            .label("write the dimension here"),
                    );
                    Dim::var(self.new_sym("_"))
                }
            }
            DimKind::Var(name) => {
                if let Some(x) = env.dims.get(name) {
                    return x.clone();
                }
                if let Some(ItemRef::Dim(x)) = self.scopes[m.0 as usize].get(name) {
                    return x.clone();
                }
                // A dim of a used module: `layers.Width`.
                if let Some((module, item)) = name.split_once('.') {
                    if let Some(ItemRef::Module(u)) = self.scopes[m.0 as usize].get(module) {
                        if let Some(ItemRef::Dim(x)) = self.scopes[u.0 as usize].get(item) {
                            return x.clone();
                        }
                    }
                }
                if let Some(fresh) = env.fresh.as_mut().filter(|_| !name.contains('.')) {
                    if let Some((_, s)) = fresh.iter().find(|(n, _)| n == name) {
                        return Dim::var(*s);
                    }
                    let s = self.new_sym(name);
                    env.fresh.as_mut().unwrap().push((name.clone(), s));
                    return Dim::var(s);
                }
                let mut cands: Vec<String> = env.dims.keys().cloned().collect();
                cands.extend(
                    self.scopes[m.0 as usize]
                        .iter()
                        .filter(|(_, r)| matches!(r, ItemRef::Dim(_)))
                        .map(|(n, _)| n.clone()),
                );
                let mut diag =
                    Diagnostic::error(Code::E0209, d.span, format!("unknown dimension `{name}`")).label("not declared");
                diag = match self.suggest_budgeted(name, &cands) {
                    Some(s) => diag.with_help(format!("did you mean `{s}`?")),
                    None => diag.with_help(format!(
                        "declare it in the `[…]` list of the function or model, or as `dim {name} = …`"
                    )),
                };
                self.error(diag);
                // A fresh variable keeps checking going, the same one for every later use of the
                // name here, so that one missing declaration is one error.
                let s = self.new_sym(name);
                env.dims.insert(name.clone(), Dim::var(s));
                env.undeclared.push((name.clone(), s));
                Dim::var(s)
            }
            DimKind::Neg(a) => self.resolve_dim(m, a, env).neg(),
            DimKind::Bin(op, a, b) => {
                let x = self.resolve_dim(m, a, env);
                let y = self.resolve_dim(m, b, env);
                let r = match op {
                    ast::BinOp::Add => x.add(&y),
                    ast::BinOp::Sub => x.sub(&y),
                    ast::BinOp::Mul => x.mul(&y),
                    _ => self.dim_div(&x, &y, d.span),
                };
                self.dim_in_range(r, &x, &y, d.span)
            }
            DimKind::Error => {
                self.error(
                    Diagnostic::error(Code::E0209, d.span, "expected a dimension")
                        .label("not a dimension")
                        .with_help("a dimension is an integer, a dim name, or `+ - * /` of them, e.g. `2 * D`"),
                );
                Dim::var(self.new_sym("?"))
            }
        }
    }

    /// `r`, computed from `x` and `y`; reports `E0105` when it left the 64-bit range that they
    /// were in (dim arithmetic saturates there, so the value would be silently wrong).
    pub(crate) fn dim_in_range(&mut self, r: Dim, x: &Dim, y: &Dim, span: crate::source::Span) -> Dim {
        if r.overflows() && !x.overflows() && !y.overflows() {
            self.error(Diagnostic::error(Code::E0105, span, "dimension does not fit in 64 bits").label("too large"));
        }
        r
    }

    /// Exact division of dims; reports `E0317` when it cannot be exact.
    pub(crate) fn dim_div(&mut self, x: &Dim, y: &Dim, span: crate::source::Span) -> Dim {
        if y.as_const() == Some(0) {
            self.error(Diagnostic::error(Code::E0317, span, "dimension divided by zero"));
            return x.clone();
        }
        match x.div(y) {
            Some(q) if q.is_fractional_const() => {
                self.error(
                    Diagnostic::error(
                        Code::E0317,
                        span,
                        format!("dimension division is not exact: {} / {}", self.dim_str(x), self.dim_str(y)),
                    )
                    .label("does not divide evenly"),
                );
                q
            }
            Some(q) => q,
            None => {
                self.error(
                    Diagnostic::error(
                        Code::E0317,
                        span,
                        format!("cannot divide a dimension by the sum {}", self.dim_str(y)),
                    )
                    .label("divisor must be a single term such as `H` or `2*H`"),
                );
                x.clone()
            }
        }
    }

    pub(crate) fn resolve_type(&mut self, m: ModuleId, t: &ast::TypeExpr, env: &mut TyEnv) -> Type {
        match &t.kind {
            TypeKind::Error => Type::Error,
            TypeKind::Tuple(ts) => Type::Tuple(ts.iter().map(|t| self.resolve_type(m, t, env)).collect()),
            TypeKind::Fn { params, ret } => Type::Fn(FnTy::Sig {
                params: params.iter().map(|t| self.resolve_type(m, t, env)).collect(),
                ret: Box::new(self.resolve_type(m, ret, env)),
            }),
            TypeKind::Stack { elem, len } => self.resolve_stack_type(m, elem, len, t.span, env),
            TypeKind::Named { path, args } => {
                if path.len() == 1 {
                    let name = path[0].name.as_str();
                    if let Some(e) = ElemTy::from_name(name) {
                        let Some(args) = args else { return Type::scalar(e) };
                        return self.resolve_shape(m, e, args, env);
                    }
                    if let Some(v) = env.models.get(name) {
                        if args.is_some() {
                            self.error(Diagnostic::error(
                                Code::E0304,
                                t.span,
                                format!("model parameter `{name}` takes no `[…]` arguments"),
                            ));
                        }
                        return Type::ModelVar(*v);
                    }
                }
                let found = match self.lookup_path(m, path) {
                    Some(ItemRef::Model(id)) => Some(id),
                    None if path.len() == 1 => self.used_model(m, &path[0].name),
                    _ => None,
                };
                match found {
                    Some(id) => self.model_type_from_args(m, id, args.as_deref(), env, t.span),
                    None => {
                        let name = path.iter().map(|i| i.name.as_str()).collect::<Vec<_>>().join(".");
                        let mut cands: Vec<String> =
                            ["f32", "f64", "i32", "bool", "bf16", "f16"].iter().map(|s| s.to_string()).collect();
                        cands.extend(env.models.keys().cloned());
                        cands.extend(
                            self.scopes[m.0 as usize]
                                .iter()
                                .filter(|(_, r)| matches!(r, ItemRef::Model(_)))
                                .map(|(n, _)| n.clone()),
                        );
                        let mut d = Diagnostic::error(Code::E0208, t.span, format!("unknown type `{name}`"))
                            .label("not a type");
                        if let Some(s) = self.suggest_budgeted(&name, &cands) {
                            d = d.with_help(format!("did you mean `{s}`?"));
                        }
                        self.error(d);
                        Type::Error
                    }
                }
            }
        }
    }

    fn resolve_shape(&mut self, m: ModuleId, e: ElemTy, args: &[DimArg], env: &mut TyEnv) -> Type {
        let mut shape = Vec::new();
        let mut layout: Vec<Vec<AxisId>> = Vec::new();
        let mut seen: Vec<AxisId> = Vec::new();
        let mut rests = 0;
        for a in args {
            layout.push(Vec::new());
            match a {
                DimArg::Dim { dim, shard } => {
                    let d = self.resolve_dim(m, dim, env);
                    let mut axes = Vec::new();
                    for axis in shard {
                        let Some((id, _)) = self.check_shard_axis(m, axis) else { continue };
                        if seen.contains(&id) {
                            self.error(
                                Diagnostic::error(
                                    Code::E0504,
                                    axis.span,
                                    format!("mesh axis `{}` splits two dims of one tensor", axis.name),
                                )
                                .label("second use of this axis")
                                .with_help("a tensor is split over an axis at most once; replicate one of the dims"),
                            );
                            continue;
                        }
                        seen.push(id);
                        axes.push(id);
                    }
                    let parts: i64 = axes.iter().map(|a| self.axis_size(*a)).product();
                    if let Some(n) = d.as_const() {
                        if parts > 1 && n % parts != 0 {
                            let names: Vec<&str> = shard.iter().map(|a| a.name.as_str()).collect();
                            let span = shard.first().map(|a| dim.span.to(a.span)).unwrap_or(dim.span);
                            self.error(
                                Diagnostic::error(
                                    Code::E0503,
                                    span,
                                    format!("dim {n} does not split evenly over `{}` ({parts} parts)", names.join(", ")),
                                )
                                .label(format!("{n} is not a multiple of {parts}"))
                                .with_help("every rank of a mesh axis holds an equal block: make the size a multiple, or replicate this dim"),
                            );
                        }
                    }
                    *layout.last_mut().expect("pushed above") = axes;
                    shape.push(ShapeItem::Dim(d));
                }
                DimArg::Type(t) => {
                    self.error(
                        Diagnostic::error(Code::E0209, t.span, "expected a dimension, found a model type")
                            .label("a tensor's `[…]` holds dimensions"),
                    );
                    shape.push(ShapeItem::Dim(Dim::var(self.new_sym("?"))));
                }
                DimArg::Rest(name) => {
                    rests += 1;
                    if rests > 1 {
                        self.error(Diagnostic::error(Code::E0305, name.span, "a shape can have only one `..` rest"));
                    }
                    let r = match env.rests.get(&name.name) {
                        Some(r) => *r,
                        None => {
                            if env.fresh.is_some() {
                                let r = self.new_rest(&name.name);
                                env.rests.insert(name.name.clone(), r);
                                r
                            } else {
                                self.error(
                                    Diagnostic::error(
                                        Code::E0209,
                                        name.span,
                                        format!("unknown shape variable `..{}`", name.name),
                                    )
                                    .with_help(format!("declare it as `..{}` in the function's `[…]` list", name.name)),
                                );
                                let r = self.new_rest(&name.name);
                                env.rests.insert(name.name.clone(), r);
                                r
                            }
                        }
                    };
                    shape.push(ShapeItem::Rest(r));
                }
            }
        }
        let layout = if layout.iter().all(Vec::is_empty) { Layout::default() } else { Layout(layout) };
        Type::Tensor(TensorTy { elem: Elem::T(e), shape, layout })
    }

    /// The size of a mesh axis (1 for an axis that no mesh declares).
    pub(crate) fn axis_size(&self, a: AxisId) -> i64 {
        self.prog.meshes.first().and_then(|m| m.axes.get(a.0 as usize)).map(|(_, n)| *n).unwrap_or(1)
    }

    /// The axis a sharding annotation names, with its size; reports `E0501` for an unknown one.
    pub(crate) fn check_shard_axis(&mut self, m: ModuleId, axis: &ast::Ident) -> Option<(AxisId, i64)> {
        let found = self.prog.meshes.first().and_then(|mesh| {
            mesh.axes
                .iter()
                .position(|(n, _)| self.prog.names.get(*n) == axis.name)
                .map(|i| (AxisId(i as u32), mesh.axes[i].1))
        });
        if found.is_none() {
            let cands: Vec<String> = self
                .prog
                .meshes
                .iter()
                .flat_map(|mesh| mesh.axes.iter().map(|(n, _)| self.prog.names.get(*n).to_string()))
                .collect();
            let mut d = Diagnostic::error(Code::E0501, axis.span, format!("unknown mesh axis `{}`", axis.name))
                .label("no mesh declares this axis");
            d = match super::suggest(&axis.name, cands.iter().map(String::as_str)) {
                Some(s) => d.with_help(format!("did you mean `{s}`?")),
                None => d.with_help("declare the mesh first, e.g. `mesh M[dp = 2]`"),
            };
            self.error(d);
        }
        let _ = m;
        found
    }

    /// `Mlp[64, 128, 10]` or `AdamState[M]`: a model type with its arguments.
    pub(crate) fn model_type_from_args(
        &mut self,
        m: ModuleId,
        id: crate::types::ModelId,
        args: Option<&[DimArg]>,
        env: &mut TyEnv,
        span: crate::source::Span,
    ) -> Type {
        let kinds = self.model_sigs[id.0 as usize].generic_is_model.clone();
        let name = self.model_sigs[id.0 as usize].name.clone();
        let args = args.unwrap_or(&[]);
        if args.len() != kinds.len() {
            self.error(
                Diagnostic::error(
                    Code::E0312,
                    span,
                    format!("model `{name}` takes {} type arguments, found {}", kinds.len(), args.len()),
                )
                .label("wrong number of arguments"),
            );
            return Type::Error;
        }
        let mut out = Vec::new();
        for (a, is_model) in args.iter().zip(kinds) {
            match a {
                DimArg::Dim { dim, shard } => {
                    if is_model {
                        let ty = match &dim.kind {
                            DimKind::Var(n) => {
                                if let Some(v) = env.models.get(n) {
                                    Type::ModelVar(*v)
                                } else {
                                    match self.scopes[m.0 as usize].get(n).cloned() {
                                        Some(ItemRef::Model(mid)) => {
                                            self.model_type_from_args(m, mid, None, env, dim.span)
                                        }
                                        _ => {
                                            self.error(Diagnostic::error(
                                                Code::E0208,
                                                dim.span,
                                                format!("expected a model type, found `{n}`"),
                                            ));
                                            Type::Error
                                        }
                                    }
                                }
                            }
                            _ => {
                                self.error(Diagnostic::error(Code::E0208, dim.span, "expected a model type"));
                                Type::Error
                            }
                        };
                        out.push(TypeArg::Type(ty));
                    } else {
                        out.push(TypeArg::Dim(self.resolve_dim(m, dim, env)));
                        if let Some(axis) = shard.first() {
                            self.check_shard_axis(m, axis);
                            self.error(
                                Diagnostic::error(
                                    Code::E0502,
                                    axis.span,
                                    format!("a model's dims are not split; `@{}` belongs on a tensor dim", axis.name),
                                )
                                .label("sharding annotation on a model argument")
                                .with_help("write the layout on the model's fields, e.g. `w: f32[I, H @mp]`"),
                            );
                        }
                    }
                }
                DimArg::Type(t) if is_model => out.push(TypeArg::Type(self.resolve_type(m, t, env))),
                DimArg::Type(t) => {
                    self.error(
                        Diagnostic::error(
                            Code::E0209,
                            t.span,
                            format!("model `{name}` expects a dimension here, found a model type"),
                        )
                        .label("not a dimension"),
                    );
                    out.push(TypeArg::Dim(Dim::var(self.new_sym("?"))));
                }
                DimArg::Rest(n) => {
                    self.error(Diagnostic::error(Code::E0305, n.span, "a model type argument cannot be `..`"));
                    out.push(TypeArg::Dim(Dim::constant(1)));
                }
            }
        }
        Type::Model(id, out)
    }

    /// Looks up `name` or `module.name` at module level.
    /// A model type of a module that `m` uses, named without the module (`AdamState` for
    /// `adam.AdamState` after `use optim.adam`, as the contract writes a checkpoint's type):
    /// found when exactly one used module has a model of that name and nothing in `m` does.
    fn used_model(&self, m: ModuleId, name: &str) -> Option<crate::types::ModelId> {
        let mut found: Vec<crate::types::ModelId> = self.scopes[m.0 as usize]
            .values()
            .filter_map(|r| match r {
                ItemRef::Module(u) => match self.scopes[u.0 as usize].get(name) {
                    Some(ItemRef::Model(id)) => Some(*id),
                    _ => None,
                },
                _ => None,
            })
            .collect();
        found.sort();
        found.dedup();
        match found[..] {
            [id] => Some(id),
            _ => None,
        }
    }

    pub(crate) fn lookup_path(&self, m: ModuleId, path: &[ast::Ident]) -> Option<ItemRef> {
        let mut scope_mod = m;
        for (i, seg) in path.iter().enumerate() {
            let r = self.scopes[scope_mod.0 as usize].get(&seg.name)?.clone();
            if i + 1 == path.len() {
                return Some(r);
            }
            match r {
                ItemRef::Module(next) => scope_mod = next,
                _ => return None,
            }
        }
        None
    }
}
