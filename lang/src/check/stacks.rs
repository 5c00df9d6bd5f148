//! Stacks of models (`layers: [Block[D]; L]`, LANGUAGE.md §8): a stack is a model of its own,
//! made by the checker, whose first dim is the number of layers and whose fields are the inner
//! model's with a leading `L`; `m.layers[l]` is the inner model built from each field's row `l`.
//! Everything that works on models (arithmetic, `map`, optimizers, gradients, checkpoints,
//! layouts) therefore works on a stack unchanged.

use super::expr::{mk, FnCx};
use super::{Checker, ModelSig};
use crate::diag::{Code, Diagnostic};
use crate::ir::{self, Attrs, ExprKind, Prim};
use crate::source::Span;
use crate::syntax::ast;
use crate::types::{AxisId, Dim, ElemTy, ModelId, ShapeItem, TensorTy, Type, TypeArg};
use std::rc::Rc;

impl Checker {
    /// The type `[elem; len]`: a stack of the model `elem` names.
    pub(crate) fn resolve_stack_type(
        &mut self,
        m: super::modules::ModuleId,
        elem: &ast::TypeExpr,
        len: &ast::DimArg,
        span: Span,
        env: &mut super::resolve::TyEnv,
    ) -> Type {
        let inner = self.resolve_type(m, elem, env);
        let axis;
        let n = match len {
            ast::DimArg::Dim { dim, shard } => {
                let d = self.resolve_dim(m, dim, env);
                if let Some(extra) = shard.get(1) {
                    self.error(
                        Diagnostic::error(Code::E0502, extra.span, "a stack of layers is split over one mesh axis")
                            .label("a second axis")
                            .with_help("write `[Block[D]; L @pp]`: each rank of `pp` holds a contiguous run of layers"),
                    );
                }
                axis = shard.first().and_then(|a| self.check_shard_axis(m, a)).map(|(a, _)| a);
                d
            }
            ast::DimArg::Rest(n) => {
                self.error(Diagnostic::error(Code::E0305, n.span, "the length of a stack cannot be `..`"));
                return Type::Error;
            }
            ast::DimArg::Type(t) => {
                self.error(
                    Diagnostic::error(Code::E0209, t.span, "expected the number of layers, found a model type")
                        .label("not a dimension"),
                );
                return Type::Error;
            }
        };
        match inner {
            Type::Model(id, args) => {
                if n.as_const().is_some_and(|k| k < 1) {
                    self.error(
                        Diagnostic::error(Code::E0306, span, "a stack of models needs at least one layer")
                            .label("no layers"),
                    );
                    return Type::Error;
                }
                let sid = self.stack_of(id, axis);
                let mut out = vec![TypeArg::Dim(n)];
                out.extend(args);
                Type::Model(sid, out)
            }
            Type::Error => Type::Error,
            t => {
                let ts = self.ty_str(&t);
                self.error(
                    Diagnostic::error(Code::E0304, elem.span, format!("a stack holds models, found {ts}"))
                        .label("not a model type")
                        .with_help("write `[Block[D]; L]` for L layers of a model `Block`; a tensor gains a dim instead: `f32[L, D]`"),
                );
                Type::Error
            }
        }
    }

    /// The stack model of `inner` (made once per axis): with `axis`, every field's leading dim
    /// is split over it, so each rank of the axis holds a contiguous run of layers (pipeline
    /// stages). Its fields are derived from the inner model's once those are known and free of
    /// cycles: at once outside a module's model declarations, after them
    /// (`fill_pending_stacks`) inside.
    pub(crate) fn stack_of(&mut self, inner: ModelId, axis: Option<AxisId>) -> ModelId {
        if let Some(&s) = self.stacks.get(&(inner, axis)) {
            return s;
        }
        let isig = &self.model_sigs[inner.0 as usize];
        let id = ModelId(self.model_sigs.len() as u32);
        let name = format!("[{}; …]", isig.name);
        let mut generic_is_model = vec![false];
        generic_is_model.extend(isig.generic_is_model.iter().copied());
        let ident = ast::Ident { name: name.clone(), span: isig.span };
        self.model_sigs.push(ModelSig {
            name: name.clone(),
            module: isig.module,
            dims: vec![],
            models: vec![],
            generic_is_model,
            fields: vec![],
            span: isig.span,
            doc: None,
            decl: Rc::new(ast::ModelDecl { name: ident, generics: vec![], fields: vec![] }),
        });
        let span = self.prog.models[inner.0 as usize].span;
        let n = self.prog.names.intern(&name);
        self.prog.models.push(ir::Model {
            name: n,
            dims: vec![],
            models: vec![],
            fields: vec![],
            span,
            stack: Some(inner),
            stack_axis: axis,
        });
        self.stacks.insert((inner, axis), id);
        if self.declaring_models {
            self.pending_stacks.push(id);
        } else {
            self.fill_stack(id);
        }
        id
    }

    /// Derives the fields of the stacks made while a module's models were being declared.
    pub(crate) fn fill_pending_stacks(&mut self) {
        while !self.pending_stacks.is_empty() {
            let id = self.pending_stacks.remove(0);
            self.fill_stack(id);
        }
    }

    fn fill_stack(&mut self, id: ModelId) {
        let Some(inner) = self.prog.models[id.0 as usize].stack else { return };
        let axis = self.prog.models[id.0 as usize].stack_axis;
        let isig = self.model_sigs[inner.0 as usize].clone();
        let len = self.new_sym("L");
        let l = Dim::var(len);
        let mut fields = Vec::with_capacity(isig.fields.len());
        for (name, t, span) in &isig.fields {
            let t = match t {
                Type::Tensor(tt) => {
                    let mut tt = tt.clone();
                    tt.shape.insert(0, ShapeItem::Dim(l.clone()));
                    if !tt.layout.0.is_empty() || axis.is_some() {
                        if tt.layout.0.is_empty() {
                            tt.layout.0 = vec![vec![]; tt.shape.len() - 1];
                        }
                        tt.layout.0.insert(0, axis.into_iter().collect());
                    }
                    Type::Tensor(tt)
                }
                Type::Model(m, args) => {
                    let (m, mut args) = (self.stack_of(*m, axis), args.clone());
                    args.insert(0, TypeArg::Dim(l.clone()));
                    Type::Model(m, args)
                }
                Type::Error => Type::Error,
                other => {
                    let ts = self.ty_str(other);
                    self.error(
                        Diagnostic::error(
                            Code::E0304,
                            *span,
                            format!("model `{}` cannot be stacked: field `{name}` is {ts}", isig.name),
                        )
                        .label("a stack gives tensor and model fields a leading dim"),
                    );
                    Type::Error
                }
            };
            fields.push((name.clone(), t, *span));
        }
        let mut dims = vec![len];
        dims.extend(isig.dims.iter().copied());
        let ir_fields = fields
            .iter()
            .map(|(n, t, _)| ir::Field { name: self.prog.names.intern(n), ty: t.clone(), init: None })
            .collect();
        let sig = &mut self.model_sigs[id.0 as usize];
        sig.dims = dims.clone();
        sig.models = isig.models.clone();
        sig.fields = fields;
        let model = &mut self.prog.models[id.0 as usize];
        model.dims = dims;
        model.models = isig.models;
        model.fields = ir_fields;
    }

    /// `stack[i]`: the inner model whose fields are row `i` of the stack's (`base` has a stack
    /// type `Model(id, targs)`).
    pub(crate) fn index_stack(
        &mut self,
        cx: &mut FnCx,
        base: ir::Expr,
        args: &[ast::IndexArg],
        span: Span,
    ) -> ir::Expr {
        let (id, targs) = match &base.ty {
            Type::Model(id, targs) => (*id, targs.clone()),
            _ => return self.error_expr(span),
        };
        let ts = self.ty_str(&base.ty);
        let [ast::IndexArg::Expr(i)] = args else {
            self.error(
                Diagnostic::error(Code::E0320, span, format!("{ts} is indexed by one layer index: `layers[l]`"))
                    .label("a stack of models takes one i32 index"),
            );
            return self.error_expr(span);
        };
        let i32t = Type::scalar(ElemTy::I32);
        let v = self.check_expr(cx, i, Some(&i32t));
        if v.ty.has_error() {
            return self.error_expr(span);
        }
        let len = match targs.first() {
            Some(TypeArg::Dim(d)) => d.clone(),
            _ => return self.error_expr(span),
        };
        if let (Some(k), Some(n)) = (self.static_dim(cx, i).and_then(|d| d.as_const()), len.as_const()) {
            if k >= n || k < -n {
                self.error(Diagnostic::error(
                    Code::E0320,
                    i.span,
                    format!("layer {k} is out of range for {ts}, which has {n} layers"),
                ));
                return self.error_expr(span);
            }
        }
        if let Some(axis) = self.prog.model(id).stack_axis {
            let piped = cx.func.is_some_and(|f| {
                self.fn_sigs.get(f.0 as usize).is_some_and(|s| s.annotations.iter().any(|a| a == "pipeline"))
            });
            if !piped {
                let name = self.prog.meshes.first().and_then(|m| m.axes.get(axis.0 as usize)).map(|(n, _)| *n);
                let name = name.map_or("its axis".to_string(), |n| format!("`{}`", self.prog.names.get(n)));
                self.error(
                    Diagnostic::error(
                        Code::E0505,
                        span,
                        format!("a stack of layers split over {name} is indexed only by a `@pipeline` function's layer loop"),
                    )
                    .label("each stage holds only its run of layers")
                    .with_help("run the layers in a `@pipeline` function, or keep the stack whole (`[Block[D]; L]`)"),
                );
                return self.error_expr(span);
            }
        }
        let v = self.coerce(v, &i32t, i.span, "layer index");
        let sid = self.span_id(span);
        let at = cx.new_temp_local(self, "layer", i32t.clone());
        let index = mk(ExprKind::Local(at), i32t.clone(), sid);
        let row = self.stack_row(cx, base, id, &targs, &index, span);
        let ty = row.ty.clone();
        let bind = ir::Stmt::Let { pat: ir::Pat::Local(at), value: v };
        mk(ExprKind::Block { stmts: vec![bind], result: Box::new(row) }, ty, sid)
    }

    /// Row `index` of the stack `base` (of type `Model(id, targs)`), nested stacks included.
    fn stack_row(
        &mut self,
        cx: &mut FnCx,
        base: ir::Expr,
        id: ModelId,
        targs: &[TypeArg],
        index: &ir::Expr,
        span: Span,
    ) -> ir::Expr {
        let Some(inner) = self.prog.models[id.0 as usize].stack else { return self.error_expr(span) };
        let sid = self.span_id(span);
        let whole = cx.new_temp_local(self, "stack", base.ty.clone());
        let read = mk(ExprKind::Local(whole), base.ty.clone(), sid);
        let mut fields = Vec::new();
        for k in 0..self.model_sigs[id.0 as usize].fields.len() {
            let fty = self.field_type(id, targs, k);
            let field = mk(ExprKind::Field(Box::new(read.clone()), k), fty.clone(), sid);
            fields.push(match &fty {
                Type::Tensor(TensorTy { elem, shape, .. }) => {
                    let row = Type::Tensor(TensorTy::new(*elem, shape[1..].to_vec()));
                    let attrs = Attrs { slice: vec![crate::ir::SliceEntry::Index], ..Attrs::default() };
                    self.prim(Prim::Slice, vec![field, index.clone()], attrs, row, span)
                }
                Type::Model(m, margs) => {
                    let (m, margs) = (*m, margs.clone());
                    self.stack_row(cx, field, m, &margs, index, span)
                }
                _ => return self.error_expr(span),
            });
        }
        let ty = Type::Model(inner, targs[1..].to_vec());
        let build = mk(ExprKind::ModelBuild { fields }, ty.clone(), sid);
        let bind = ir::Stmt::Let { pat: ir::Pat::Local(whole), value: base };
        mk(ExprKind::Block { stmts: vec![bind], result: Box::new(build) }, ty, sid)
    }
}
