//! Items: declaring names, resolving `use`, checking signatures, then checking bodies.

use super::expr::{Binding, FnCx};
use super::resolve::TyEnv;
use super::{Checker, FnSig, ItemRef, ModelSig, ModuleId, ParamSig};
use crate::diag::{Code, Diagnostic};
use crate::ir::{self, ExprKind};
use crate::source::Span;
use crate::syntax::ast::{self, ItemKind};
use crate::types::TensorTy;
use crate::types::{FuncId, ModelId, Type};
use std::rc::Rc;

/// The dims, rests and model parameters a `[…]` list declares, by source name.
type GenericNames =
    (Vec<(String, crate::types::Sym)>, Vec<(String, crate::types::RestSym)>, Vec<(String, crate::types::TyVar)>);

impl Checker {
    fn define(&mut self, m: ModuleId, name: &ast::Ident, r: ItemRef) {
        let scope = &mut self.scopes[m.0 as usize];
        if scope.contains_key(&name.name) {
            self.diags.push(
                Diagnostic::error(Code::E0205, name.span, format!("`{}` is defined twice", name.name))
                    .label("second definition"),
            );
            return;
        }
        scope.insert(name.name.clone(), r);
    }

    pub(super) fn declare_items(&mut self, m: ModuleId) {
        let ast = self.module(m).ast.clone();
        let file_text = self.sources.text(self.module(m).file).to_string();
        let is_root_or_user = !self.module(m).is_stdlib;
        if !is_root_or_user {
            let name = self.module(m).name.clone();
            for &p in builtin_exports(&name) {
                self.scopes[m.0 as usize].insert(p.name().to_string(), ItemRef::Builtin(p));
            }
        }
        for item in &ast.items {
            let doc = crate::syntax::lexer::doc_comment_before(&file_text, item.span.start as usize);
            match &item.kind {
                ItemKind::Fn(f) => {
                    let id = FuncId(self.fn_sigs.len() as u32);
                    let annotations = item.annotations.iter().map(|a| a.name.name.clone()).collect();
                    self.fn_sigs.push(FnSig {
                        name: f.name.name.clone(),
                        module: m,
                        dims: vec![],
                        rests: vec![],
                        models: vec![],
                        params: vec![],
                        ret: Type::unit(),
                        span: f.name.span,
                        doc: doc.clone(),
                        decl: Some(Rc::new(f.clone())),
                        dim_names: vec![],
                        rest_names: vec![],
                        model_names: vec![],
                        annotations,
                    });
                    let name = self.prog.names.intern(&f.name.name);
                    let sid = self.span_id(f.name.span);
                    self.prog.funcs.push(placeholder_func(name, sid));
                    self.define(m, &f.name, ItemRef::Func(id));
                    if is_root_or_user {
                        self.index.items.push((f.name.name.clone(), "fn", f.name.span, doc));
                    }
                }
                ItemKind::Model(md) => {
                    let id = ModelId(self.model_sigs.len() as u32);
                    self.model_sigs.push(ModelSig {
                        name: md.name.name.clone(),
                        module: m,
                        dims: vec![],
                        models: vec![],
                        generic_is_model: model_generics(&md.generics).iter().map(|(_, is_model)| *is_model).collect(),
                        fields: vec![],
                        span: md.name.span,
                        doc: doc.clone(),
                        decl: Rc::new(md.clone()),
                    });
                    let name = self.prog.names.intern(&md.name.name);
                    let sid = self.span_id(md.name.span);
                    self.prog.models.push(ir::Model {
                        name,
                        dims: vec![],
                        models: vec![],
                        fields: vec![],
                        span: sid,
                        stack: None,
                        stack_axis: None,
                    });
                    self.define(m, &md.name, ItemRef::Model(id));
                    if is_root_or_user {
                        self.index.items.push((md.name.name.clone(), "model", md.name.span, doc));
                    }
                }
                ItemKind::Mesh { name, axes } => {
                    let mut out = Vec::new();
                    for (a, d) in axes {
                        let size = match d.kind {
                            ast::DimKind::Int(n) if n > 0 => n,
                            _ => {
                                self.diags.push(
                                    Diagnostic::error(
                                        Code::E0502,
                                        d.span,
                                        "a mesh axis size must be a positive integer",
                                    )
                                    .label("expected e.g. `dp = 2`"),
                                );
                                1
                            }
                        };
                        out.push((self.prog.names.intern(&a.name), size));
                    }
                    // `--mesh dp=4,mp=1` replaces the sizes written in the file.
                    for (axis, size) in super::mesh_override() {
                        match axes.iter().position(|(a, _)| a.name == axis) {
                            Some(i) => out[i].1 = size,
                            None => {
                                let known: Vec<&str> = axes.iter().map(|(a, _)| a.name.as_str()).collect();
                                self.diags.push(
                                    Diagnostic::error(
                                        Code::E0502,
                                        name.span,
                                        format!(
                                            "`--mesh` names axis `{axis}`, which mesh `{}` does not declare",
                                            name.name
                                        ),
                                    )
                                    .label(format!("this mesh has axes {}", known.join(", ")))
                                    .with_help("name the axes of this mesh, e.g. `--mesh dp=4`"),
                                );
                            }
                        }
                    }
                    // Every product of axis sizes must fit (block counts, rank numbers).
                    let devices = out.iter().try_fold(1i64, |acc, (_, n)| acc.checked_mul(*n));
                    if devices.is_none_or(|d| d > i64::from(i32::MAX)) {
                        self.diags.push(
                            Diagnostic::error(Code::E0502, name.span, "this mesh has more devices than msl can number")
                                .label(format!("at most {} devices", i32::MAX))
                                .with_help("a mesh's axis sizes multiply to the number of processes it runs on"),
                        );
                        for a in out.iter_mut() {
                            a.1 = 1;
                        }
                    }
                    if !self.prog.meshes.is_empty() {
                        self.diags.push(
                            Diagnostic::error(Code::E0502, name.span, "a program has at most one mesh")
                                .label("second mesh declaration")
                                .with_help("declare every axis in one `mesh`, e.g. `mesh M[dp = 2, mp = 2]`"),
                        );
                    }
                    let n = self.prog.names.intern(&name.name);
                    self.prog.meshes.push(ir::Mesh { name: n, axes: out });
                    let idx = self.prog.meshes.len() - 1;
                    self.define(m, name, ItemRef::Mesh(idx));
                }
                _ => {}
            }
        }
    }

    pub(super) fn resolve_uses(&mut self, m: ModuleId) {
        let ast = self.module(m).ast.clone();
        let uses = self.module(m).uses.clone();
        for (i, item) in ast.items.iter().enumerate() {
            let ItemKind::Use(u) = &item.kind else { continue };
            if uses.iter().any(|(j, _)| *j == i) {
                continue;
            }
            // A `use` that failed (reported where it is written): the names it would bring.
            let names: Vec<String> = match u {
                ast::UseTarget::File(path, _) => std::path::Path::new(path)
                    .file_stem()
                    .map(|s| s.to_string_lossy().into_owned())
                    .into_iter()
                    .collect(),
                ast::UseTarget::Module(path) => path.last().map(|i| i.name.clone()).into_iter().collect(),
                ast::UseTarget::Names(_, names) => names.iter().map(|n| n.name.clone()).collect(),
            };
            self.unresolved.extend(names.into_iter().map(|n| (m.0, n)));
        }
        for (i, target) in uses {
            let ItemKind::Use(u) = &ast.items[i].kind else { continue };
            match u {
                ast::UseTarget::File(_, span) => {
                    let name = self.module(target).name.clone();
                    self.define(m, &ast::Ident { name, span: *span }, ItemRef::Module(target));
                }
                ast::UseTarget::Module(path) => {
                    let full = path.iter().map(|i| i.name.as_str()).collect::<Vec<_>>().join(".");
                    let target_is_full = matches!(&self.module(target).origin,
                        super::Origin::Stdlib(s) if *s == full);
                    let last = path.last().unwrap();
                    if target_is_full {
                        self.define(m, last, ItemRef::Module(target));
                    } else {
                        self.import_name(m, target, last);
                    }
                }
                ast::UseTarget::Names(_, names) => {
                    let subs = self.module(m).sub_uses.clone();
                    for n in names {
                        match subs.iter().find(|(j, name, _)| *j == i && *name == n.name) {
                            Some((_, _, sm)) if !self.scopes[target.0 as usize].contains_key(&n.name) => {
                                self.define(m, n, ItemRef::Module(*sm))
                            }
                            _ => self.import_name(m, target, n),
                        }
                    }
                }
            }
        }
    }

    fn import_name(&mut self, m: ModuleId, target: ModuleId, n: &ast::Ident) {
        match self.scopes[target.0 as usize].get(&n.name).cloned() {
            Some(r) => self.define(m, n, r),
            None => {
                let mname = self.module(target).name.clone();
                let cands: Vec<String> = self.scopes[target.0 as usize].keys().cloned().collect();
                let mut d =
                    Diagnostic::error(Code::E0207, n.span, format!("module `{mname}` has no item `{}`", n.name))
                        .label("not defined there");
                if let Some(s) = super::suggest(&n.name, cands.iter().map(String::as_str)) {
                    d = d.with_help(format!("did you mean `{s}`?"));
                }
                self.diags.push(d);
                self.unresolved.insert((m.0, n.name.clone()));
            }
        }
    }

    pub(super) fn collect_signatures(&mut self, m: ModuleId) {
        let ast = self.module(m).ast.clone();
        // Global dims first, in source order, then consts, models and functions.
        for item in &ast.items {
            if let ItemKind::Dim { name, value } = &item.kind {
                let d = self.resolve_dim(m, value, &mut TyEnv::default());
                self.define(m, name, ItemRef::Dim(d.clone()));
                let ds = self.dim_str(&d);
                self.index.types.push((name.span, format!("dim {} = {ds}", name.name), Some(name.span)));
            }
        }
        let overrides = if self.root == Some(m) { super::const_override() } else { Vec::new() };
        for item in &ast.items {
            if let ItemKind::Const { name, ty, value } = &item.kind {
                let mut cx = FnCx::new(m);
                let expected = ty.as_ref().map(|t| self.resolve_type(m, t, &mut TyEnv::default()));
                let mut v = self.check_expr(&mut cx, value, expected.as_ref());
                if let Some((_, c)) = overrides.iter().find(|(n, _)| *n == name.name) {
                    // `--const NAME=VALUE`: the value replaces the written one, in its type.
                    let float = matches!(&v.ty, Type::Tensor(TensorTy { elem, .. }) if elem.is_float());
                    let kind = match (c, float) {
                        (super::ConstValue::Float(x), true) => Some(ast::ExprKind::Float(*x)),
                        (super::ConstValue::Float(x), false) => {
                            let ts = self.ty_str(&v.ty);
                            self.diags.push(
                                Diagnostic::error(
                                    Code::E0303,
                                    value.span,
                                    format!("`--const {}={x}`: `{}` is not a float constant", name.name, name.name),
                                )
                                .label(format!("this is {ts}")),
                            );
                            None
                        }
                        (super::ConstValue::Int(n), true) => Some(ast::ExprKind::Float(*n as f64)),
                        (super::ConstValue::Int(n), false) => Some(ast::ExprKind::Int(*n)),
                        (super::ConstValue::Bool(b), _) => Some(ast::ExprKind::Bool(*b)),
                    };
                    if let Some(k) = kind {
                        let lit = ast::Expr::new(k, value.span);
                        let t = expected.clone().unwrap_or_else(|| v.ty.clone());
                        let given = self.check_expr(&mut cx, &lit, Some(&t));
                        v = self.coerce(given, &t, value.span, "`--const` value");
                    }
                }
                if let Some(t) = &expected {
                    v = self.coerce(v, t, value.span, "constant");
                }
                let id = ir::ConstId(self.prog.consts.len() as u32);
                let n = self.prog.names.intern(&name.name);
                self.index.types.push((name.span, self.ty_str(&v.ty), Some(name.span)));
                self.prog.consts.push(ir::Const { name: n, ty: v.ty.clone(), value: v });
                self.define(m, name, ItemRef::Const(id));
            }
        }
        for (n, _) in &overrides {
            let declared = ast.items.iter().any(|i| matches!(&i.kind, ItemKind::Const { name, .. } if name.name == *n));
            if !declared {
                let file = self.module(m).file;
                self.diags.push(
                    Diagnostic::error(
                        Code::E0201,
                        crate::source::Span::new(file, 0, 0),
                        format!("`--const` names `{n}`, which this file does not declare as a `const`"),
                    )
                    .with_help("`--const NAME=VALUE` replaces the value of `const NAME = …` in the file run"),
                );
            }
        }
        let mut declared = Vec::new();
        // Stacks of this module's models get their fields once every model here is declared.
        self.declaring_models = true;
        for item in &ast.items {
            if let ItemKind::Model(md) = &item.kind {
                let ItemRef::Model(id) = self.scopes[m.0 as usize][&md.name.name].clone() else { continue };
                self.model_signature(m, id, md);
                declared.push(id);
            }
        }
        self.break_model_cycles(&declared);
        self.declaring_models = false;
        self.fill_pending_stacks();
        for item in &ast.items {
            if let ItemKind::Fn(f) = &item.kind {
                let Some(ItemRef::Func(id)) = self.scopes[m.0 as usize].get(&f.name.name).cloned() else { continue };
                if self.fn_sigs[id.0 as usize].decl.as_ref().is_some_and(|d| d.name.span == f.name.span) {
                    self.fn_signature(m, id, f);
                }
            }
        }
    }

    fn generics_env(&mut self, generics: &[ast::Generic], env: &mut TyEnv) -> GenericNames {
        let (mut dims, mut rests, mut models) = (vec![], vec![], vec![]);
        let mut seen = std::collections::HashSet::new();
        for g in generics {
            let id = match g {
                ast::Generic::Dim(i) | ast::Generic::Model(i) | ast::Generic::Rest(i) => i,
            };
            if !seen.insert(id.name.clone()) {
                self.diags.push(Diagnostic::error(Code::E0205, id.span, format!("`{}` is declared twice", id.name)));
                continue;
            }
            match g {
                ast::Generic::Dim(i) => {
                    let s = self.new_sym(&i.name);
                    env.dims.insert(i.name.clone(), crate::types::Dim::var(s));
                    dims.push((i.name.clone(), s));
                }
                ast::Generic::Rest(i) => {
                    let r = self.new_rest(&i.name);
                    env.rests.insert(i.name.clone(), r);
                    rests.push((i.name.clone(), r));
                }
                ast::Generic::Model(i) => {
                    let v = self.new_tyvar(&i.name);
                    env.models.insert(i.name.clone(), v);
                    models.push((i.name.clone(), v));
                }
            }
        }
        (dims, rests, models)
    }

    fn model_signature(&mut self, m: ModuleId, id: ModelId, md: &ast::ModelDecl) {
        let mut env = TyEnv::default();
        let (dims, _rests, models) = self.generics_env(&md.generics, &mut env);
        let mut fields = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for f in &md.fields {
            if !seen.insert(f.name.name.clone()) {
                self.diags.push(Diagnostic::error(
                    Code::E0205,
                    f.name.span,
                    format!("field `{}` is defined twice", f.name.name),
                ));
                continue;
            }
            let ty = self.resolve_type(m, &f.ty, &mut env);
            fields.push((f.name.name.clone(), ty, f.name.span));
        }
        let sig = &mut self.model_sigs[id.0 as usize];
        sig.dims = dims.iter().map(|(_, s)| *s).collect();
        sig.models = models.iter().map(|(_, v)| *v).collect();
        sig.fields = fields.clone();
        let model = &mut self.prog.models[id.0 as usize];
        model.dims = dims.iter().map(|(_, s)| *s).collect();
        model.models = models.iter().map(|(_, v)| *v).collect();
        let mut ir_fields = Vec::new();
        for (n, t, _) in &fields {
            let name = self.prog.names.intern(n);
            ir_fields.push(ir::Field { name, ty: t.clone(), init: None });
        }
        self.prog.models[id.0 as usize].fields = ir_fields;
        // Remember the env for checking the initialisers.
        let _ = (dims, models);
    }

    /// A model that contains itself (`model A { a: A }`, or `A { b: B }` with `B { a: A }`) would
    /// be infinite: each field that closes such a cycle is `E0213`, and its type becomes the
    /// error type so that no later stage follows the cycle. Models of other modules cannot be in
    /// a cycle with these (modules do not use each other in a cycle).
    fn break_model_cycles(&mut self, declared: &[ModelId]) {
        // A stack (`[A; L]`) contains what its inner model does: the edge goes to the inner.
        fn contained(t: &Type, stacks: &[Option<ModelId>], out: &mut Vec<ModelId>) {
            match t {
                Type::Model(id, args) => {
                    let mut id = *id;
                    while let Some(inner) = stacks.get(id.0 as usize).copied().flatten() {
                        id = inner;
                    }
                    out.push(id);
                    for a in args {
                        if let crate::types::TypeArg::Type(t) = a {
                            contained(t, stacks, out);
                        }
                    }
                }
                Type::Tuple(ts) | Type::List(ts) => ts.iter().for_each(|t| contained(t, stacks, out)),
                _ => {}
            }
        }
        // The containment edges (model, field index, contained model) of these models, then a
        // depth-first search; an edge back to a model on the current path closes a cycle.
        let stacks: Vec<Option<ModelId>> = self.prog.models.iter().map(|m| m.stack).collect();
        let edges = |sigs: &[super::ModelSig], id: ModelId| -> Vec<(usize, ModelId)> {
            let mut out = Vec::new();
            for (k, (_, t, _)) in sigs[id.0 as usize].fields.iter().enumerate() {
                let mut inner = Vec::new();
                contained(t, &stacks, &mut inner);
                out.extend(inner.into_iter().map(|m| (k, m)));
            }
            out
        };
        let mut state = std::collections::HashMap::new(); // 1: on the path, 2: done
        for &root in declared {
            if state.contains_key(&root) {
                continue;
            }
            state.insert(root, 1u8);
            let mut stack: Vec<SearchFrame> = vec![(root, edges(&self.model_sigs, root), 0)];
            while let Some(top) = stack.last_mut() {
                let (id, at) = (top.0, top.2);
                let Some(&(k, next)) = top.1.get(at) else {
                    state.insert(id, 2);
                    stack.pop();
                    continue;
                };
                top.2 += 1;
                match state.get(&next) {
                    Some(1) => {
                        if self.model_sigs[id.0 as usize].fields[k].1.is_error() {
                            continue;
                        }
                        let names: Vec<String> =
                            stack.iter().map(|(m, _, _)| self.model_sigs[m.0 as usize].name.clone()).collect();
                        let from = stack.iter().position(|(m, _, _)| *m == next).unwrap_or(0);
                        let mut path = names[from..].to_vec();
                        path.push(self.model_sigs[next.0 as usize].name.clone());
                        let here = self.model_sigs[id.0 as usize].name.clone();
                        let (fname, _, fspan) = self.model_sigs[id.0 as usize].fields[k].clone();
                        let msg = if path.len() == 2 {
                            format!("model `{here}` contains itself through field `{fname}`")
                        } else {
                            format!(
                                "model `{}` contains itself: {} (field `{fname}` of `{here}`)",
                                path[0],
                                path.join(" → ")
                            )
                        };
                        self.diags.push(
                            Diagnostic::error(Code::E0213, fspan, msg)
                                .label("this field makes the model infinite")
                                .with_help("a model can hold other models, but not, directly or through them, itself"),
                        );
                        self.model_sigs[id.0 as usize].fields[k].1 = Type::Error;
                        if let Some(f) = self.prog.models[id.0 as usize].fields.get_mut(k) {
                            f.ty = Type::Error;
                        }
                    }
                    Some(_) => {}
                    None => {
                        state.insert(next, 1);
                        let es = edges(&self.model_sigs, next);
                        stack.push((next, es, 0));
                    }
                }
            }
        }
    }

    fn fn_signature(&mut self, m: ModuleId, id: FuncId, f: &ast::FnDecl) {
        let mut env = TyEnv::default();
        let (dims, rests, models) = self.generics_env(&f.generics, &mut env);
        let mut params = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for p in &f.params {
            if !seen.insert(p.name.name.clone()) {
                self.diags.push(Diagnostic::error(
                    Code::E0205,
                    p.name.span,
                    format!("parameter `{}` is declared twice", p.name.name),
                ));
            }
            let ty = match &p.ty {
                Some(t) => self.resolve_type(m, t, &mut env),
                None => {
                    self.diags.push(
                        Diagnostic::error(
                            Code::E0304,
                            p.name.span,
                            format!("parameter `{}` needs a type", p.name.name),
                        )
                        .label("write `name: type`"),
                    );
                    Type::Error
                }
            };
            params.push(ParamSig { name: p.name.name.clone(), ty, default: p.default.clone(), span: p.name.span });
        }
        let ret = match &f.ret {
            Some(t) => self.resolve_type(m, t, &mut env),
            None => Type::unit(),
        };
        let mut dims = dims;
        dims.append(&mut env.undeclared);
        let sig = &mut self.fn_sigs[id.0 as usize];
        sig.dims = dims.iter().map(|(_, s)| *s).collect();
        sig.rests = rests.iter().map(|(_, r)| *r).collect();
        sig.models = models.iter().map(|(_, v)| *v).collect();
        sig.params = params;
        sig.ret = ret;
        sig.dim_names = dims;
        sig.rest_names = rests;
        sig.model_names = models;
    }

    pub(super) fn check_bodies(&mut self, m: ModuleId) {
        let ast = self.module(m).ast.clone();
        for item in &ast.items {
            if !matches!(item.kind, ItemKind::Fn(_)) {
                for a in &item.annotations {
                    self.diags.push(
                        Diagnostic::error(Code::E0214, a.span, format!("`@{}` applies to functions only", a.name.name))
                            .label("not on a function"),
                    );
                }
            }
            match &item.kind {
                ItemKind::Fn(f) => {
                    if let Some(ItemRef::Func(id)) = self.scopes[m.0 as usize].get(&f.name.name).cloned() {
                        if self.fn_sigs[id.0 as usize].decl.as_ref().is_some_and(|d| d.name.span == f.name.span) {
                            self.ensure_body(id);
                            self.check_annotations(m, id, &item.annotations);
                        }
                    }
                }
                ItemKind::Model(md) => {
                    if let Some(ItemRef::Model(id)) = self.scopes[m.0 as usize].get(&md.name.name).cloned() {
                        if self.model_sigs[id.0 as usize].decl.name.span == md.name.span {
                            self.check_model_inits(m, id);
                        }
                    }
                }
                ItemKind::Test { name, body } => {
                    let mut cx = FnCx::new(m);
                    let b = self.check_block(&mut cx, body, None);
                    let fname = self.prog.names.intern(&format!("test \"{name}\""));
                    let sid = self.span_id(item.span);
                    let id = self.push_func(fname, &cx, vec![], Type::unit(), b, sid);
                    self.prog.tests.push(ir::Test { name: name.clone(), func: id, span: sid });
                }
                _ => {}
            }
        }
    }

    /// Checks a function body once; called in module order and on demand by calls. A call of a
    /// function defined later checks that body first, recursively; the depth of that recursion
    /// is bounded by `MAX_BODY_DEPTH`.
    pub(crate) fn ensure_body(&mut self, id: FuncId) {
        let i = id.0 as usize;
        if self.body_done.get(i).copied().unwrap_or(true) {
            return;
        }
        if self.checking.len() >= MAX_BODY_DEPTH {
            // Left unchecked for now: `check_all` comes back to it with an empty stack.
            self.diags.push(
                Diagnostic::error(
                    Code::E0106,
                    self.fn_sigs[i].span,
                    format!(
                        "calls nested more than {MAX_BODY_DEPTH} deep through functions defined after their callers"
                    ),
                )
                .label("reached through that chain")
                .with_help("define functions before the functions that call them"),
            );
            return;
        }
        self.body_done[i] = true;
        let sig = self.fn_sigs[i].clone();
        let Some(decl) = sig.decl.clone() else { return };
        self.checking.push(id);
        let mut cx = FnCx::new(sig.module);
        cx.ret = Some(sig.ret.clone());
        cx.func = Some(id);
        for (n, s) in &sig.dim_names {
            cx.bind(n, Binding::Dim(crate::types::Dim::var(*s)));
        }
        for (n, r) in &sig.rest_names {
            cx.bind(n, Binding::Rest(*r));
        }
        for (n, v) in &sig.model_names {
            cx.bind(n, Binding::Model(*v));
        }
        let mut params = Vec::new();
        for p in &sig.params {
            let l = cx.new_local(self, &p.name, p.ty.clone(), false);
            self.index.types.push((p.span, format!("{}: {}", p.name, self.ty_str(&p.ty)), Some(p.span)));
            params.push(l);
        }
        let body = self.check_block(&mut cx, &decl.body, Some(&sig.ret));
        // A result mismatch points at the body's last expression (or the block when it has none)
        // and labels the declared result type.
        let tail = match decl.body.stmts.last().map(|s| &s.kind) {
            Some(ast::StmtKind::Expr(e)) => e.span,
            _ => decl.body.span,
        };
        let ret_span = decl.ret.as_ref().map(|t| t.span);
        let body = if sig.ret.is_unit() { body } else { self.coerce_result(body, &sig.ret, tail, ret_span) };
        let f = &mut self.prog.funcs[i];
        f.dims = sig.dims.clone();
        f.rests = sig.rests.clone();
        f.models = sig.models.clone();
        f.params = params;
        f.ret = sig.ret.clone();
        f.locals = cx.locals.clone();
        f.body = body;
        let anns: Vec<_> = sig.annotations.iter().map(|a| self.prog.names.intern(a)).collect();
        self.prog.funcs[i].annotations = anns;
        self.checking.pop();
    }

    fn coerce_result(&mut self, body: ir::Expr, ret: &Type, span: Span, ret_span: Option<Span>) -> ir::Expr {
        // A `_` in the declared result was reported already (`E0307`); nothing can match it.
        let infer_dim = |t: &Type| {
            match t {
            Type::Tensor(TensorTy { shape: s, .. }) => s.iter().any(|i| {
                matches!(i, crate::types::ShapeItem::Dim(d) if d.vars().any(|v| self.prog.sym_names[v.0 as usize] == "_"))
            }),
            _ => false,
        }
        };
        if body.ty.has_error() || ret.has_error() || infer_dim(ret) {
            return body;
        }
        match self.try_coerce(body, ret) {
            Ok(e) => e,
            Err((e, why)) => {
                let d = Diagnostic::error(
                    Code::E0316,
                    span,
                    format!(
                        "function body has type {}, but the declared result is {}",
                        self.ty_str(&e.ty),
                        self.ty_str(ret)
                    ),
                )
                .label(why);
                let d = match ret_span {
                    Some(r) => d.with_secondary(r, format!("declared result {}", self.ty_str(ret))),
                    None => d,
                };
                self.error(d);
                e
            }
        }
    }

    fn check_model_inits(&mut self, m: ModuleId, id: ModelId) {
        let sig = self.model_sigs[id.0 as usize].clone();
        for (i, f) in sig.decl.fields.iter().enumerate() {
            // A repeated field was reported (`E0205`); its initialiser is not checked against the first.
            if sig.decl.fields[..i].iter().any(|g| g.name.name == f.name.name) {
                continue;
            }
            let Some((_, fty, _)) = sig.fields.iter().find(|(n, _, _)| *n == f.name.name).cloned() else { continue };
            let idx = sig.fields.iter().position(|(n, _, _)| *n == f.name.name).unwrap_or(i);
            let Some(init) = &f.init else {
                if !fty.is_model() && !fty.has_error() && !matches!(fty, Type::Model(..)) {
                    // Fields without initialisers are fine for models built with a constructor.
                }
                continue;
            };
            let mut cx = FnCx::new(m);
            cx.in_init = true;
            for ((n, _), s) in model_generics(&sig.decl.generics).into_iter().zip(self.generic_bindings(&sig)) {
                cx.bind(&n.name, s);
            }
            let v = self.check_expr(&mut cx, init, Some(&fty));
            let v = self.coerce(v, &fty, init.span, "field initialiser");
            let name = self.prog.names.intern(&format!("{}.{}", sig.name, f.name.name));
            let sid = self.span_id(init.span);
            let fid = self.push_func(name, &cx, vec![], fty.clone(), v, sid);
            self.prog.funcs[fid.0 as usize].dims = sig.dims.clone();
            if let Some(field) = self.prog.models[id.0 as usize].fields.get_mut(idx) {
                field.init = Some(fid);
            }
        }
    }

    /// A binding for each of `model_generics`, in order.
    fn generic_bindings(&self, sig: &ModelSig) -> Vec<Binding> {
        let (mut d, mut v) = (sig.dims.iter(), sig.models.iter());
        sig.generic_is_model
            .iter()
            .map_while(|&is_model| {
                if is_model {
                    v.next().map(|x| Binding::Model(*x))
                } else {
                    d.next().map(|s| Binding::Dim(crate::types::Dim::var(*s)))
                }
            })
            .collect()
    }

    /// Adds a synthesised function (test body, initialiser, closure instance) to the program.
    pub(crate) fn push_func(
        &mut self,
        name: ir::Name,
        cx: &FnCx,
        params: Vec<ir::Local>,
        ret: Type,
        body: ir::Expr,
        span: ir::SpanId,
    ) -> FuncId {
        let id = FuncId(self.prog.funcs.len() as u32);
        self.prog.funcs.push(ir::Func {
            name,
            dims: vec![],
            rests: vec![],
            models: vec![],
            n_captures: 0,
            params,
            ret,
            locals: cx.locals.clone(),
            body,
            annotations: vec![],
            span,
        });
        // Keep the signature table aligned with the function table.
        self.fn_sigs.push(FnSig {
            name: self.prog.names.get(name).to_string(),
            module: cx.module,
            dims: vec![],
            rests: vec![],
            models: vec![],
            params: vec![],
            ret: Type::unit(),
            span: self.prog.span(span),
            doc: None,
            decl: None,
            dim_names: vec![],
            rest_names: vec![],
            model_names: vec![],
            annotations: vec![],
        });
        self.body_done.push(true);
        id
    }
}

fn placeholder_func(name: ir::Name, span: ir::SpanId) -> ir::Func {
    ir::Func {
        name,
        dims: vec![],
        rests: vec![],
        models: vec![],
        n_captures: 0,
        params: vec![],
        ret: Type::unit(),
        locals: vec![],
        body: ir::Expr { kind: ExprKind::Tuple(vec![]), ty: Type::unit(), span, id: crate::ir::ExprId::fresh() },
        annotations: vec![],
        span,
    }
}

/// The `[…]` parameters of a model that its type takes as arguments, in order, with `true` for
/// `M: Model`: as `generics_env` keeps them (a repeated name counts once, `..S` not at all), so
/// that they line up with the signature's `dims` and `models`.
fn model_generics(generics: &[ast::Generic]) -> Vec<(&ast::Ident, bool)> {
    let mut seen = std::collections::HashSet::new();
    generics
        .iter()
        .filter_map(|g| match g {
            ast::Generic::Dim(i) => seen.insert(i.name.as_str()).then_some((i, false)),
            ast::Generic::Model(i) => seen.insert(i.name.as_str()).then_some((i, true)),
            ast::Generic::Rest(i) => {
                seen.insert(i.name.as_str());
                None
            }
        })
        .collect()
}

/// The annotations a function may carry.
const ANNOTATIONS: &[&str] = &["custom_vjp", "pipeline", "recompute", "copies", "optimizer_init", "optimizer_step"];

impl Checker {
    /// Whether annotation `a` of function `id` is one msl knows, with arguments of the right
    /// form where the annotation's own check does not look at them; `E0214` otherwise.
    fn annotation_known(&mut self, id: FuncId, a: &ast::Annotation) -> bool {
        let name = a.name.name.as_str();
        let fail = |this: &mut Self, msg: String, help: String| {
            this.diags.push(Diagnostic::error(Code::E0214, a.span, msg).label("this annotation").with_help(help));
            false
        };
        if !ANNOTATIONS.contains(&name) {
            let mut help = format!(
                "the annotations are {}",
                ANNOTATIONS.iter().map(|n| format!("`@{n}`")).collect::<Vec<_>>().join(", ")
            );
            if let Some(s) = super::suggest(name, ANNOTATIONS.iter().copied()) {
                help = format!("did you mean `@{s}`?");
            }
            return fail(self, format!("unknown annotation `@{name}`"), help);
        }
        match name {
            "recompute" | "optimizer_init" | "optimizer_step" if !a.args.is_empty() => {
                fail(self, format!("`@{name}` takes no arguments"), format!("write `@{name}` alone"))
            }
            "copies" => {
                let n = match a.args.as_slice() {
                    [ast::Arg { name: None, value }] => match &value.kind {
                        ast::ExprKind::Int(v) => Some(*v),
                        _ => None,
                    },
                    _ => None,
                };
                if n.is_none_or(|n| n < 1) {
                    return fail(
                        self,
                        "`@copies` takes the number of copies, an integer of at least 1".into(),
                        "write `@copies(2)`".into(),
                    );
                }
                let batched = self.fn_sigs[id.0 as usize]
                    .params
                    .iter()
                    .any(|p| matches!(&p.ty, Type::Tensor(tt) if !tt.shape.is_empty()));
                if !batched {
                    let f = self.fn_sigs[id.0 as usize].name.clone();
                    return fail(
                        self,
                        format!("`@copies` splits a batch, but `{f}` has no tensor parameter with a batch dim"),
                        "put it on the function that takes the batch (its first dim is the batch dim)".into(),
                    );
                }
                let n = n.unwrap_or(1) as usize;
                self.copies_opts.push(super::copies::CopiesOpt { func: id, n, span: a.span });
                true
            }
            _ => true,
        }
    }

    /// Annotations on functions: `@custom_vjp(f_vjp)` names the function that computes the
    /// cotangents of `f`'s parameters from `(params…, out, g)`; other annotations are kept for
    /// later passes (`@recompute`, `@pipeline`, `@copies`).
    fn check_annotations(&mut self, m: ModuleId, id: FuncId, anns: &[ast::Annotation]) {
        for a in anns {
            if !self.annotation_known(id, a) {
                continue;
            }
            if a.name.name == "pipeline" {
                self.pipeline_annotation(id, a);
                continue;
            }
            if a.name.name != "custom_vjp" {
                continue;
            }
            let target = match a.args.as_slice() {
                [ast::Arg { name: None, value }] => match &value.kind {
                    ast::ExprKind::Name(n) => match self.scopes[m.0 as usize].get(n).cloned() {
                        Some(ItemRef::Func(b)) => Some((b, value.span)),
                        _ => {
                            self.diags.push(Diagnostic::error(
                                Code::E0201,
                                value.span,
                                format!("unknown function `{n}`"),
                            ));
                            None
                        }
                    },
                    _ => None,
                },
                _ => None,
            };
            let Some((b, bspan)) = target else {
                self.diags.push(
                    Diagnostic::error(Code::E0404, a.span, "`@custom_vjp` takes the name of the function computing the cotangents")
                        .with_help("write `@custom_vjp(f_vjp)` where `fn f_vjp(params…, out, g)` returns the parameters' cotangents"),
                );
                continue;
            };
            let f = self.fn_sigs[id.0 as usize].clone();
            let bs = self.fn_sigs[b.0 as usize].clone();
            let mut want: Vec<Type> = f.params.iter().map(|p| p.ty.clone()).collect();
            want.push(f.ret.clone());
            want.push(f.ret.clone());
            let ret_want = if f.params.len() == 1 {
                f.params[0].ty.clone()
            } else {
                Type::Tuple(f.params.iter().map(|p| p.ty.clone()).collect())
            };
            // Compare shapes by renaming the derivative's dims to the function's, in order.
            let mut subst = crate::types::unify::Subst::default();
            for (s, t) in bs.dims.iter().zip(&f.dims) {
                subst.dims.insert(*s, crate::types::Dim::var(*t));
            }
            for (r, t) in bs.rests.iter().zip(&f.rests) {
                subst.rests.insert(*r, vec![crate::types::ShapeItem::Rest(*t)]);
            }
            for (v, t) in bs.models.iter().zip(&f.models) {
                subst.models.insert(*v, Type::ModelVar(*t));
            }
            let got: Vec<Type> = bs.params.iter().map(|p| subst.ty(&p.ty)).collect();
            if got != want || subst.ty(&bs.ret) != ret_want {
                let ws: Vec<String> = want.iter().map(|t| self.ty_str(t)).collect();
                self.diags.push(
                    Diagnostic::error(
                        Code::E0404,
                        bspan,
                        format!(
                            "`{}` must have parameters ({}) and return {}",
                            bs.name,
                            ws.join(", "),
                            self.ty_str(&ret_want)
                        ),
                    )
                    .with_secondary(bs.span, "defined here"),
                );
                continue;
            }
            self.ensure_body(b);
            self.prog.custom_vjp.insert(id, b);
        }
    }
}

/// Deepest chain of on-demand body checks: each level takes a few dozen KiB of stack in a debug
/// build, and the checker must fit in the CLI's 1 GiB stack (and a 256 MiB test thread).
const MAX_BODY_DEPTH: usize = 4096;

/// A model on the path of the containment search: the model, its edges (field index,
/// contained model) and the next edge to follow.
type SearchFrame = (ModelId, Vec<(usize, ModelId)>, usize);

/// The builtins a stdlib module re-exports under their own names, instead of defining them a
/// second time in msl (`use nn.relu` and `nn.relu(x)` are the builtin `relu`).
pub(crate) fn builtin_exports(module: &str) -> &'static [crate::ir::Prim] {
    use crate::ir::Prim;
    match module {
        "nn" => &[
            Prim::Relu,
            Prim::Gelu,
            Prim::Sigmoid,
            Prim::Softmax,
            Prim::LogSoftmax,
            Prim::Conv2d,
            Prim::MaxPool2d,
            Prim::AvgPool2d,
        ],
        _ => &[],
    }
}
