//! Run-time values of the interpreter and how `print` shows them.

use crate::ir::{FnTarget, Local, Program};
use crate::types::{ClosureId, ModelId};
use kernels::format::format_tensor_with;
use kernels::{DType, Tensor};
use std::rc::Rc;

#[derive(Clone, Debug)]
pub enum Value {
    Tensor(Tensor),
    Tuple(Rc<Vec<Value>>),
    Model(Rc<ModelValue>),
    Str(Rc<str>),
    Fn(Rc<FnValue>),
    /// A model type used as a value (the argument of `init`); carries nothing at run time.
    Type,
    /// Reverse mode's stored loop states (`tape_push`, `tape_get`).
    Tape(Tape),
    /// An `f32` matrix held as int8 values with per-channel scales (`quantize`, `interp::compress`).
    Quant(Rc<kernels::QuantMatrix>),
    /// An optimizer state held in pieces over a mesh axis (`shard: dp`, `interp::zero`).
    Sharded(Rc<super::zero::Sharded>),
    /// A gradient's partial sum over a mesh axis, left for a sharded optimizer step to
    /// reduce-scatter (`interp::zero`); summed whole before anything else reads it.
    Partial(Rc<super::zero::PartialSum>),
}

/// An append-only sequence shared by all its versions: each version sees its first `len`
/// entries, and pushing onto the newest version appends in place (O(1)), so a loop that pushes
/// its state every iteration stores n states in O(n) time and memory. Pushing onto an older
/// version copies its entries first, so every version keeps the value it had: tapes are
/// values like any other.
#[derive(Clone, Debug, Default)]
pub struct Tape {
    buf: Rc<std::cell::RefCell<Vec<Value>>>,
    len: usize,
}

impl Tape {
    /// This tape with `v` appended.
    pub fn push(&self, v: Value) -> Tape {
        let mut b = self.buf.borrow_mut();
        if b.len() == self.len {
            b.push(v);
            return Tape { buf: self.buf.clone(), len: self.len + 1 };
        }
        let mut copy: Vec<Value> = b[..self.len].to_vec();
        copy.push(v);
        Tape { buf: Rc::new(std::cell::RefCell::new(copy)), len: self.len + 1 }
    }

    /// Entry `i`, taken out of the tape (left as `()`): a loop's backward pass reads each
    /// iteration's entry once, so its memory goes as soon as that iteration's backward is done.
    pub fn take(&self, i: i64) -> Option<Value> {
        let i = usize::try_from(i).ok().filter(|&i| i < self.len)?;
        self.buf.borrow_mut().get_mut(i).map(|v| std::mem::replace(v, Value::unit()))
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Elements per tensor, on average, from which a constructed model keeps its tensors apart
/// rather than copying them into one buffer ([`ModelValue::assembled`]). Arithmetic over a
/// model in parts pays a little per tensor (a task of the JIT's one call over the parts, a
/// kernel launch in the interpreter), a few microseconds; a copy of 32,768 `f32`s (256 KiB read
/// and written) costs about as much.
pub const PART_MIN: usize = 1 << 15;

/// A model instance: its type's dim arguments (for binding generic dims) and its fields.
#[derive(Clone, Debug)]
pub struct ModelValue {
    pub model: ModelId,
    pub dims: Vec<i64>,
    pub fields: Vec<Value>,
}

impl ModelValue {
    /// The model's tensors in field order when every field is a tensor of rank ≥ 1 or such a
    /// model, all of one element type (`None` otherwise).
    fn dense_leaves(&self) -> Option<Vec<&Tensor>> {
        fn walk<'a>(m: &'a ModelValue, out: &mut Vec<&'a Tensor>) -> Option<()> {
            for f in &m.fields {
                match f {
                    Value::Tensor(t) if t.rank() > 0 && t.dtype() == out.first().map_or(t.dtype(), |u| u.dtype()) => {
                        out.push(t)
                    }
                    Value::Model(n) => walk(n, out)?,
                    _ => return None,
                }
            }
            Some(())
        }
        let mut out = Vec::new();
        walk(self, &mut out)?;
        (!out.is_empty()).then_some(out)
    }

    /// The model's parameters as one rank-1 tensor, without a copy, when the model is flat:
    /// its tensors (all of rank ≥ 1 and one element type) lie one after another in one buffer,
    /// in field order. Elementwise arithmetic on flat models is one kernel over this tensor.
    pub fn flat(&self) -> Option<Tensor> {
        let leaves = self.dense_leaves()?;
        let mut acc = leaves[0].with_shape(vec![leaves[0].len()]).ok()?;
        for t in &leaves[1..] {
            acc = acc.join(t)?;
        }
        Some(acc)
    }

    /// The model in one buffer: itself when it is flat already, a copy with its tensors
    /// concatenated when it can be flat, `None` when it cannot (mixed element types, scalars).
    pub fn packed(self: &Rc<Self>) -> Option<Rc<ModelValue>> {
        if self.flat().is_some() {
            return Some(self.clone());
        }
        let flat = Tensor::concat_flat(&self.dense_leaves()?)?;
        self.with_flat(&flat).map(Rc::new)
    }

    /// The model as a constructor builds it: packed into one buffer (as [`Self::packed`]) when
    /// its tensors are small, on average below [`PART_MIN`] elements, and kept as built when
    /// they are large. Packing copies every parameter once so that model arithmetic is one
    /// loop; for large tensors that copy is a pass over memory each time the model is built
    /// (every gradient, at the end of each `grad`), while the JIT's model arithmetic reads
    /// separate tensors where they are, in one call (`interp::accel`'s `run_models`).
    pub fn assembled(self: &Rc<Self>) -> Option<Rc<ModelValue>> {
        let leaves = self.dense_leaves()?;
        let total: usize = leaves.iter().map(|t| t.len()).sum();
        if total >= leaves.len().saturating_mul(PART_MIN) {
            return None;
        }
        self.packed()
    }

    /// The model's tensors in field order (depth first, nested models included) when every
    /// field is a tensor of rank ≥ 1 or such a model, all of one element type.
    pub fn tensors(&self) -> Option<Vec<Tensor>> {
        Some(self.dense_leaves()?.into_iter().cloned().collect())
    }

    /// A model of this one's type whose tensors, in field order, are `tensors` (the caller
    /// gives each its field's shape); `None` when their number is not the model's.
    pub fn with_tensors(&self, tensors: impl IntoIterator<Item = Tensor>) -> Option<ModelValue> {
        fn rebuild(m: &ModelValue, ts: &mut dyn Iterator<Item = Tensor>) -> Option<ModelValue> {
            let mut fields = Vec::with_capacity(m.fields.len());
            for f in &m.fields {
                fields.push(match f {
                    Value::Tensor(_) => Value::Tensor(ts.next()?),
                    Value::Model(n) => Value::Model(Rc::new(rebuild(n, ts)?)),
                    _ => return None,
                });
            }
            Some(ModelValue { model: m.model, dims: m.dims.clone(), fields })
        }
        let mut ts = tensors.into_iter();
        let m = rebuild(self, &mut ts)?;
        ts.next().is_none().then_some(m)
    }

    /// A model of this one's type whose tensors, in field order, are consecutive views of
    /// `flat` of the given shapes (for a model whose own tensors are placeholders).
    pub fn with_flat_as(&self, shapes: &[Vec<usize>], flat: &Tensor) -> Option<ModelValue> {
        let mut at = 0;
        let mut views = Vec::with_capacity(shapes.len());
        for s in shapes {
            let v = flat.view(at, s.clone()).ok()?;
            at += v.len();
            views.push(v);
        }
        (at == flat.len()).then_some(())?;
        self.with_tensors(views)
    }

    /// A model of this one's type whose tensors are consecutive views of `flat` (a rank-1
    /// tensor with as many elements as the model has parameters).
    pub fn with_flat(&self, flat: &Tensor) -> Option<ModelValue> {
        fn rebuild(m: &ModelValue, flat: &Tensor, at: &mut usize) -> Option<ModelValue> {
            let mut fields = Vec::with_capacity(m.fields.len());
            for f in &m.fields {
                fields.push(match f {
                    Value::Tensor(t) => {
                        let v = flat.view(*at, t.shape().to_vec()).ok()?;
                        *at += t.len();
                        Value::Tensor(v)
                    }
                    Value::Model(n) => Value::Model(Rc::new(rebuild(n, flat, at)?)),
                    _ => return None,
                });
            }
            Some(ModelValue { model: m.model, dims: m.dims.clone(), fields })
        }
        let mut at = 0;
        let m = rebuild(self, flat, &mut at)?;
        (at == flat.len()).then_some(m)
    }
}

/// A function value.
#[derive(Clone, Debug)]
pub enum FnValue {
    /// A named function, or one instance of a closure with its captured locals.
    /// `dims` are the dimension values of the scope a closure was made in.
    Func {
        target: FnTarget,
        captures: Vec<(Local, Value)>,
        closure: Option<ClosureId>,
        dims: Vec<(crate::types::Sym, i64)>,
    },
    /// The pullback returned by `vjp`: the function and primals it closes over.
    Pullback { func: Rc<FnValue>, primals: Vec<Value> },
}

impl Value {
    pub fn unit() -> Value {
        Value::Tuple(Rc::new(vec![]))
    }

    /// The value with a model in it held as one flat buffer when it can be (see
    /// [`ModelValue::packed`]); anything else unchanged.
    pub fn packed(self) -> Value {
        match &self {
            Value::Model(m) => m.packed().map_or(self, Value::Model),
            _ => self,
        }
    }

    /// A constructor's model packed when its tensors are small ([`ModelValue::assembled`]);
    /// anything else unchanged.
    pub fn assembled(self) -> Value {
        match &self {
            Value::Model(m) => m.assembled().map_or(self, Value::Model),
            _ => self,
        }
    }

    pub fn tensor(&self) -> Option<&Tensor> {
        match self {
            Value::Tensor(t) => Some(t),
            _ => None,
        }
    }

    /// This value with `f` applied to every tensor in it (models field by field, tuples item
    /// by item; anything else as it is).
    pub(crate) fn map_tensors<E>(&self, f: &mut dyn FnMut(&Tensor) -> Result<Tensor, E>) -> Result<Value, E> {
        Ok(match self {
            Value::Tensor(t) => Value::Tensor(f(t)?),
            Value::Partial(p) => Value::Tensor(f(&p.t)?),
            Value::Model(m) => {
                let fields = m.fields.iter().map(|x| x.map_tensors(f)).collect::<Result<Vec<_>, E>>()?;
                Value::Model(Rc::new(ModelValue { model: m.model, dims: m.dims.clone(), fields }))
            }
            Value::Tuple(xs) => Value::Tuple(Rc::new(xs.iter().map(|x| x.map_tensors(f)).collect::<Result<_, E>>()?)),
            other => other.clone(),
        })
    }

    /// Tensor leaves in field order (depth first), for `params`, `save` and `map`.
    pub fn leaves<'a>(&'a self, out: &mut Vec<&'a Tensor>) {
        match self {
            Value::Tensor(t) => out.push(t),
            Value::Partial(p) => out.push(&p.t),
            Value::Model(m) => m.fields.iter().for_each(|f| f.leaves(out)),
            Value::Tuple(ts) => ts.iter().for_each(|f| f.leaves(out)),
            _ => {}
        }
    }

    /// Tensor leaves with their dotted field paths (`layers.0.w` style), for safetensors; a
    /// quantized matrix as the `f32` values it stands for.
    pub fn named_leaves(&self, prog: &Program, prefix: &str, out: &mut Vec<(String, Tensor)>) {
        self.named_leaves_with(prog, prefix, out, None);
    }

    /// [`Value::named_leaves`], with each quantized matrix `w` given as its int8 values (an
    /// `i32` tensor whose name goes into `int8`) and `w.scale`, its `f32` scales, when `int8`
    /// is given.
    pub fn named_leaves_with(
        &self,
        prog: &Program,
        prefix: &str,
        out: &mut Vec<(String, Tensor)>,
        mut int8: Option<&mut std::collections::HashSet<String>>,
    ) {
        match self {
            Value::Tensor(t) => out.push((prefix.to_string(), t.clone())),
            Value::Quant(q) => match int8 {
                Some(set) => {
                    let values = q.values().into_iter().map(i32::from).collect();
                    let shape = q.shape().to_vec();
                    if let (Ok(v), Ok(s)) =
                        (Tensor::from_i32(shape, values), Tensor::from_f32(vec![q.shape()[1]], q.scales().to_vec()))
                    {
                        set.insert(prefix.to_string());
                        out.push((prefix.to_string(), v));
                        out.push((format!("{prefix}.scale"), s));
                    }
                }
                None => out.push((prefix.to_string(), q.dequantize())),
            },
            // A stack's tensors are named per layer (`layers.0.w`), as `L` separate models.
            Value::Model(m) if prog.model(m.model).stack.is_some() => {
                for (l, v) in super::stacks::layers(prog, m).unwrap_or_default().iter().enumerate() {
                    let path = if prefix.is_empty() { l.to_string() } else { format!("{prefix}.{l}") };
                    v.named_leaves_with(prog, &path, out, int8.as_deref_mut());
                }
            }
            Value::Model(m) => {
                let def = prog.model(m.model);
                for (f, v) in def.fields.iter().zip(&m.fields) {
                    let name = prog.names.get(f.name);
                    let path = if prefix.is_empty() { name.to_string() } else { format!("{prefix}.{name}") };
                    v.named_leaves_with(prog, &path, out, int8.as_deref_mut());
                }
            }
            Value::Tuple(ts) => {
                for (i, v) in ts.iter().enumerate() {
                    let path = if prefix.is_empty() { i.to_string() } else { format!("{prefix}.{i}") };
                    v.named_leaves_with(prog, &path, out, int8.as_deref_mut());
                }
            }
            _ => {}
        }
    }

    /// The text `print` writes for this value.
    pub fn display(&self, prog: &Program) -> String {
        self.display_with(prog, None)
    }

    /// [`Value::display`] with floats shown with `precision` digits after the point.
    pub fn display_with(&self, prog: &Program, precision: Option<u32>) -> String {
        match self {
            Value::Tensor(t) => format_tensor_with(t, precision.map(|k| k as usize)),
            Value::Str(s) => s.to_string(),
            Value::Tuple(ts) => {
                let items: Vec<String> = ts.iter().map(|v| v.display_with(prog, precision)).collect();
                if items.len() == 1 {
                    format!("({},)", items[0])
                } else {
                    format!("({})", items.join(", "))
                }
            }
            // A stack prints as the list of its layers.
            Value::Model(m) if prog.model(m.model).stack.is_some() => {
                let items: Vec<String> = super::stacks::layers(prog, m)
                    .unwrap_or_default()
                    .iter()
                    .map(|v| v.display_with(prog, precision))
                    .collect();
                format!("[{}]", items.join(", "))
            }
            Value::Model(m) => {
                let def = prog.model(m.model);
                let items: Vec<String> = def
                    .fields
                    .iter()
                    .zip(&m.fields)
                    .map(|(f, v)| format!("{}: {}", prog.names.get(f.name), v.display_with(prog, precision)))
                    .collect();
                format!("{} {{ {} }}", prog.names.get(def.name), items.join(", "))
            }
            Value::Fn(_) => "<function>".to_string(),
            Value::Type => "<type>".to_string(),
            Value::Tape(t) => format!("<tape of {}>", t.len()),
            Value::Quant(q) => format_tensor_with(&q.dequantize(), precision.map(|k| k as usize)),
            // Gathered before `print` sees it; this is the rank's piece.
            Value::Sharded(s) => s.value.display_with(prog, precision),
            // Summed before `print` sees it.
            Value::Partial(p) => format!("<partial sum of {:?}>", p.t.shape()),
        }
    }
}

/// The scalar value of a rank-0 tensor as i64 (indices, seeds, sizes).
pub fn scalar_i64(t: &Tensor) -> Option<i64> {
    if t.len() != 1 {
        return None;
    }
    match t.dtype() {
        DType::I32 => t.as_i32().map(|v| v[0] as i64),
        DType::Bool => t.as_bool().map(|v| v[0] as i64),
        _ => t.scalar_value_f64().map(|v| v as i64),
    }
}
