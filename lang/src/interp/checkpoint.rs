//! Values as named tensors and back: the tensors a value of a type consists of (dotted names,
//! element types, global shapes), read from a checkpoint folder or a `.safetensors` file, and
//! the value of that type rebuilt from them.
//!
//! A value's tensors are named by their path: a model field by its name, a tuple item by its
//! position, joined with dots (`(m, opt, epoch)` gives `0.w1`, `1.mu.w1`, `1.t`, `2`); a lone
//! tensor is named `value`. Saving walks the value ([`Value::named_leaves`]), loading walks the
//! annotated type ([`Interp::plan`]), and both follow the same rules, so what one writes the
//! other reads. A model generic over `M: Model` (the optimizer states) is walked with `M`
//! replaced by its argument in the annotation.

use super::value::{ModelValue, Value};
use super::{rt, Frame, Interp, R};
use crate::diag::Code;
use crate::ir::eval::dtype_of;
use crate::source::Span;
use crate::types::unify::Subst;
use crate::types::{Dim, Elem, ModelId, ShapeItem, Sym, TensorTy, TyVar, Type, TypeArg};
use kernels::io::checkpoint::Wanted;
use kernels::Tensor;
use std::collections::HashMap;
use std::rc::Rc;

/// The structure of a value being loaded: where its tensors go.
pub(crate) enum Node {
    Tensor,
    Tuple(Vec<Node>),
    Model {
        id: ModelId,
        dims: Vec<i64>,
        fields: Vec<Node>,
    },
    /// A stack of models (`id`), read layer by layer (`layers.0.w`, …) and stacked.
    Stack {
        id: ModelId,
        layers: Vec<Node>,
    },
}

/// The name of the tensor at `path` (a lone tensor is `value`).
fn leaf_name(path: &str) -> String {
    if path.is_empty() {
        "value".to_string()
    } else {
        path.to_string()
    }
}

fn join(prefix: &str, part: &str) -> String {
    if prefix.is_empty() {
        part.to_string()
    } else {
        format!("{prefix}.{part}")
    }
}

/// A value's tensors with their names, in field order (see the module comment).
pub(crate) fn named_tensors(v: &Value, prog: &crate::ir::Program) -> Vec<(String, Tensor)> {
    match v {
        Value::Tensor(t) => vec![(leaf_name(""), t.clone())],
        other => {
            let mut named = Vec::new();
            other.named_leaves(prog, "", &mut named);
            named
        }
    }
}

impl Interp<'_> {
    /// The structure of a value of type `ty` and, appended to `wanted`, its tensors in order.
    /// `dims` binds the dims `ty` names, `models` the model parameters it names.
    pub(crate) fn plan(
        &self,
        ty: &Type,
        path: &str,
        dims: &HashMap<Sym, i64>,
        models: &HashMap<TyVar, Type>,
        span: Span,
        wanted: &mut Vec<Wanted>,
    ) -> R<Node> {
        let frame = Frame { locals: vec![], dims: dims.clone(), rests: Default::default() };
        match ty {
            Type::Tensor(TensorTy { elem: Elem::T(et), shape, .. }) => {
                let mut ds = Vec::with_capacity(shape.len());
                for item in shape {
                    let ShapeItem::Dim(d) = item else {
                        return Err(rt(Code::E0605, format!("`{}` has no fixed rank to load", leaf_name(path)), span));
                    };
                    // A dim bound from what is loaded (a lone tensor's new dims) has no value yet.
                    if d.vars().any(|s| !dims.contains_key(&s)) {
                        ds.push(None);
                        continue;
                    }
                    let v = self.dim(&frame, d, span)?;
                    let v = usize::try_from(v).map_err(|_| rt(Code::E0602, format!("negative dimension {v}"), span))?;
                    ds.push(Some(v));
                }
                wanted.push(Wanted {
                    name: leaf_name(path),
                    dtype: dtype_of(*et),
                    shape: ds,
                    group: None,
                    region: None,
                });
                Ok(Node::Tensor)
            }
            Type::Tuple(ts) => {
                let mut items = Vec::with_capacity(ts.len());
                for (i, t) in ts.iter().enumerate() {
                    items.push(self.plan(t, &join(path, &i.to_string()), dims, models, span, wanted)?);
                }
                Ok(Node::Tuple(items))
            }
            Type::Model(id, args) => {
                let def = self.prog.model(*id);
                let mut values = Vec::new();
                let mut inner_models = HashMap::new();
                let mut vars = def.models.iter();
                for a in args {
                    match a {
                        TypeArg::Dim(d) => values.push(self.dim(&frame, d, span)?),
                        TypeArg::Type(t) => {
                            // The argument is in this scope's terms: made concrete here, it
                            // means the same inside the model.
                            let subst = Subst {
                                dims: dims.iter().map(|(s, v)| (*s, Dim::constant(*v))).collect(),
                                models: models.clone(),
                                ..Subst::default()
                            };
                            if let Some(v) = vars.next() {
                                inner_models.insert(*v, subst.ty(t));
                            }
                        }
                    }
                }
                if let Some(inner) = def.stack {
                    // Its layers as the inner model: `path.0`, `path.1`, …
                    let mut rest = args.to_vec();
                    rest.remove(0);
                    let n = values.first().copied().unwrap_or(0).max(0);
                    let mut layers = Vec::with_capacity(n as usize);
                    for l in 0..n {
                        let t = Type::Model(inner, rest.clone());
                        layers.push(self.plan(&t, &join(path, &l.to_string()), dims, models, span, wanted)?);
                    }
                    return Ok(Node::Stack { id: *id, layers });
                }
                let inner_dims: HashMap<Sym, i64> = def.dims.iter().copied().zip(values.iter().copied()).collect();
                let mut fields = Vec::with_capacity(def.fields.len());
                for f in &def.fields {
                    let name = self.prog.names.get(f.name);
                    fields.push(self.plan(&f.ty, &join(path, name), &inner_dims, &inner_models, span, wanted)?);
                }
                Ok(Node::Model { id: *id, dims: values, fields })
            }
            Type::ModelVar(v) => match models.get(v) {
                Some(t) => self.plan(&t.clone(), path, dims, models, span, wanted),
                None => Err(rt(
                    Code::E0605,
                    format!("`{}` has a generic model type, which is not known here", leaf_name(path)),
                    span,
                )),
            },
            other => Err(rt(
                Code::E0605,
                format!("`{}` cannot be loaded: it is {}", leaf_name(path), crate::types::type_str(other, self.prog)),
                span,
            )),
        }
    }
}

/// Marks the tensors that will be held in one buffer ([`ModelValue::packed`]) as one read
/// group, so that they are read into it and never copied: those of each outermost model whose
/// tensors all have rank ≥ 1 and one element type. `at` counts the tensors walked so far,
/// `next` the groups.
pub(crate) fn mark_groups(node: &Node, wanted: &mut [Wanted], at: &mut usize, next: &mut usize) {
    match node {
        Node::Tensor => *at += 1,
        Node::Tuple(items) | Node::Stack { layers: items, .. } => {
            items.iter().for_each(|n| mark_groups(n, wanted, at, next))
        }
        Node::Model { fields, .. } => {
            let n = leaves(node);
            let own = wanted.get(*at..*at + n).unwrap_or(&[]);
            let dense = !own.is_empty() && own.iter().all(|w| !w.shape.is_empty() && w.dtype == own[0].dtype);
            if dense {
                for w in wanted.iter_mut().skip(*at).take(n) {
                    w.group = Some(*next);
                }
                *next += 1;
                *at += n;
            } else {
                fields.iter().for_each(|f| mark_groups(f, wanted, at, next));
            }
        }
    }
}

/// The number of tensors in a value of structure `node`.
fn leaves(node: &Node) -> usize {
    match node {
        Node::Tensor => 1,
        Node::Tuple(items) | Node::Model { fields: items, .. } | Node::Stack { layers: items, .. } => {
            items.iter().map(leaves).sum()
        }
    }
}

/// The value with structure `node` made of `tensors` (in the order [`Interp::plan`] listed
/// them).
pub(crate) fn assemble(
    prog: &crate::ir::Program,
    node: &Node,
    tensors: &mut impl Iterator<Item = Value>,
    span: Span,
) -> R<Value> {
    let short = || rt(Code::E0605, "internal error: fewer tensors than the type has", span);
    Ok(match node {
        Node::Tensor => tensors.next().ok_or_else(short)?,
        Node::Tuple(items) => {
            let vs = items.iter().map(|n| assemble(prog, n, tensors, span)).collect::<R<Vec<_>>>()?;
            Value::Tuple(Rc::new(vs))
        }
        Node::Model { id, dims, fields } => {
            let fields = fields.iter().map(|n| assemble(prog, n, tensors, span)).collect::<R<Vec<_>>>()?;
            Value::Model(Rc::new(ModelValue { model: *id, dims: dims.clone(), fields }))
        }
        Node::Stack { id, layers } => {
            let layers = layers.iter().map(|n| assemble(prog, n, tensors, span)).collect::<R<Vec<_>>>()?;
            super::stacks::stack_layers(prog, *id, &layers).map_err(|e| rt(Code::E0601, e.to_string(), span))?
        }
    })
}

/// The value with each model in one buffer where it can be: a model whose tensors can share a
/// buffer as a whole, else its model fields each (an optimizer state holds scalars, but its
/// moments are whole models).
pub(crate) fn pack(v: Value) -> Value {
    match &v {
        Value::Model(m) => {
            if let Some(p) = m.packed() {
                return Value::Model(p);
            }
            let fields = m.fields.iter().cloned().map(pack).collect();
            Value::Model(Rc::new(ModelValue { model: m.model, dims: m.dims.clone(), fields }))
        }
        Value::Tuple(items) => Value::Tuple(Rc::new(items.iter().cloned().map(pack).collect())),
        _ => v,
    }
}
