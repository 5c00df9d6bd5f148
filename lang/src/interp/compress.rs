//! Run-time side of model compression: `quantize` turns every `f32` matrix of a value into an
//! int8 [`QuantMatrix`] (a `Value::Quant` leaf), `prune` zeroes the smallest-magnitude weights
//! of each matrix. A quantized leaf stays int8 where it is the right operand of `@` (the int8
//! kernel) and in `save`; every other operation sees the `f32` matrix it stands for.

use std::rc::Rc;

use kernels::{KernelError, QuantMatrix, Tensor};

use super::value::{ModelValue, Value};

/// `v` with every `f32` matrix quantized (a quantized one is kept).
pub(crate) fn quantize(v: &Value) -> Result<Value, KernelError> {
    Ok(match v {
        Value::Tensor(t) if t.rank() == 2 && t.dtype() == kernels::DType::F32 => {
            Value::Quant(Rc::new(QuantMatrix::quantize(t)?))
        }
        Value::Model(m) => {
            let fields = m.fields.iter().map(quantize).collect::<Result<Vec<_>, _>>()?;
            Value::Model(Rc::new(ModelValue { model: m.model, dims: m.dims.clone(), fields }))
        }
        other => other.clone(),
    })
}

/// `v` with the fraction `s` of each float matrix's (rank ≥ 2) entries, the smallest in
/// magnitude, set to zero: `round(s · n)` entries (ties in magnitude by position, first first),
/// as `torch.nn.utils.prune.l1_unstructured(amount=s)` counts them. Vectors (biases, norm
/// gains) are kept.
pub(crate) fn prune(v: &Value, s: f64) -> Result<Value, KernelError> {
    if !(0.0..=1.0).contains(&s) {
        return Err(KernelError::OutOfRange(format!("prune: sparsity {s} is not between 0 and 1")));
    }
    Ok(match v {
        Value::Tensor(t) if t.rank() >= 2 && t.dtype().is_float() => Value::Tensor(prune_tensor(t, s)?),
        Value::Quant(q) => Value::Tensor(prune_tensor(&q.dequantize(), s)?),
        Value::Model(m) => {
            let fields = m.fields.iter().map(|f| prune(f, s)).collect::<Result<Vec<_>, _>>()?;
            Value::Model(Rc::new(ModelValue { model: m.model, dims: m.dims.clone(), fields }))
        }
        other => other.clone(),
    })
}

fn prune_tensor(t: &Tensor, s: f64) -> Result<Tensor, KernelError> {
    let mut v = t.to_f64_vec();
    let k = ((s * v.len() as f64).round_ties_even() as usize).min(v.len());
    let mut order: Vec<usize> = (0..v.len()).collect();
    // NaN counts as the largest magnitude (it is never the one pruned first).
    let key = |i: usize| if v[i].is_nan() { f64::INFINITY } else { v[i].abs() };
    order.sort_by(|&a, &b| key(a).total_cmp(&key(b)).then(a.cmp(&b)));
    for &i in &order[..k] {
        v[i] = 0.0;
    }
    Tensor::from_f64(t.shape().to_vec(), v).map(|x| x.cast(t.dtype()))
}

/// `x @ w` for an int8 `w`: the int8 kernel, `x` read as `f32`.
pub(crate) fn matmul(x: Tensor, w: &QuantMatrix) -> Result<Tensor, KernelError> {
    let x = if x.dtype() == kernels::DType::F32 { x } else { x.cast(kernels::DType::F32) };
    kernels::ops::matmul_i8(&x, w)
}

/// The value with a quantized leaf given as its `f32` matrix (models and tuples unchanged).
pub(crate) fn plain(v: Value) -> Value {
    match v {
        Value::Quant(q) => Value::Tensor(q.dequantize()),
        other => other,
    }
}

/// Parameters counted by `params`: the elements of every tensor leaf, quantized or not.
pub(crate) fn count(v: &Value) -> usize {
    match v {
        Value::Tensor(t) => t.len(),
        Value::Quant(q) => q.shape()[0] * q.shape()[1],
        Value::Model(m) => m.fields.iter().map(count).sum(),
        Value::Tuple(ts) => ts.iter().map(count).sum(),
        _ => 0,
    }
}

/// The quantized matrix a file holds as int8 values (read as `i32`) and `f32` scales, one per
/// column.
pub(crate) fn from_file(values: &Tensor, scales: &Tensor) -> Result<QuantMatrix, KernelError> {
    let [rows, cols] = [values.shape()[0], values.shape()[1]];
    let q = values
        .as_i32()
        .unwrap_or(&[])
        .iter()
        .map(|&x| i8::try_from(x).map_err(|_| KernelError::Invalid(format!("a quantized value {x} is not int8"))))
        .collect::<Result<Vec<i8>, _>>()?;
    let s = scales.as_f32().filter(|s| s.len() == cols && scales.rank() == 1).ok_or_else(|| {
        KernelError::Invalid(format!("the scales of a quantized [{rows}, {cols}] matrix must be f32[{cols}]"))
    })?;
    QuantMatrix::from_parts(rows, cols, &q, s.to_vec())
}
