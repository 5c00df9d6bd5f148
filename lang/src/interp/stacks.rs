//! Stacks of models at run time (`layers: [Block[D]; L]`): a stack's value holds each field of
//! its layers stacked along a leading dim (a nested model field is itself a stack), so model
//! arithmetic, optimizers and gradients treat it as any model. `init` initialises layer `l` as
//! the inner model under the path `layers.l`, and checkpoints name its tensors per layer
//! (`layers.0.w`), so a stack equals `L` separately initialised and saved blocks.

use super::value::{ModelValue, Value};
use crate::ir::Program;
use crate::types::{ModelId, Type};
use kernels::{ops, KernelError, Tensor};
use std::rc::Rc;

fn not_a_stack() -> KernelError {
    KernelError::Invalid("internal error: a stack of models holds a value that is not a tensor or a stack".into())
}

/// Layer `l` of the stack `m`: the inner model whose fields are row `l` of the stack's.
pub(crate) fn layer(prog: &Program, m: &ModelValue, l: usize) -> Result<Value, KernelError> {
    let Some(inner) = prog.model(m.model).stack else { return Err(not_a_stack()) };
    let mut fields = Vec::with_capacity(m.fields.len());
    for f in &m.fields {
        fields.push(match f {
            Value::Tensor(t) => Value::Tensor(ops::slice(t, &[ops::SliceSpec::Index(l as i64)])?),
            Value::Model(sub) => layer(prog, sub, l)?,
            _ => return Err(not_a_stack()),
        });
    }
    Ok(Value::Model(Rc::new(ModelValue { model: inner, dims: m.dims.get(1..).unwrap_or(&[]).to_vec(), fields })))
}

/// Every layer of the stack `m`, in order.
pub(crate) fn layers(prog: &Program, m: &ModelValue) -> Result<Vec<Value>, KernelError> {
    let n = m.dims.first().copied().unwrap_or(0).max(0) as usize;
    (0..n).map(|l| layer(prog, m, l)).collect()
}

/// The stack (model `id`, a stack) of these layers, each a value of its inner model.
pub(crate) fn stack_layers(prog: &Program, id: ModelId, layers: &[Value]) -> Result<Value, KernelError> {
    let def = prog.model(id);
    let models: Vec<&ModelValue> = layers
        .iter()
        .map(|v| match v {
            Value::Model(m) => Ok(&**m),
            _ => Err(not_a_stack()),
        })
        .collect::<Result<_, _>>()?;
    let first = models.first().ok_or_else(|| KernelError::Invalid("a stack of models needs a layer".into()))?;
    let mut fields = Vec::with_capacity(def.fields.len());
    for (k, f) in def.fields.iter().enumerate() {
        let column: Vec<Value> =
            models.iter().map(|m| m.fields.get(k).cloned().ok_or_else(not_a_stack)).collect::<Result<_, _>>()?;
        fields.push(match (&f.ty, &column[0]) {
            (_, Value::Tensor(_)) => {
                let ts: Vec<Tensor> = column
                    .into_iter()
                    .map(|v| match v {
                        Value::Tensor(t) => Ok(t),
                        _ => Err(not_a_stack()),
                    })
                    .collect::<Result<_, _>>()?;
                Value::Tensor(ops::stack(&ts, 0)?)
            }
            (Type::Model(sub, _), Value::Model(_)) => stack_layers(prog, *sub, &column)?,
            _ => return Err(not_a_stack()),
        });
    }
    let mut dims = vec![models.len() as i64];
    dims.extend(first.dims.iter().copied());
    Ok(Value::Model(Rc::new(ModelValue { model: id, dims, fields })))
}
