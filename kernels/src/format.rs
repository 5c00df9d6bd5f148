//! How msl's `print` shows values: Python-style shortest round-trip floats and nested lists.

use crate::tensor::{Storage, Tensor};

/// Tensors with more elements than this are summarised, like NumPy's `threshold`.
const THRESHOLD: usize = 1000;
/// Elements shown at each end of a summarised axis, like NumPy's `edgeitems`.
const EDGE: usize = 3;

/// Formats a tensor the way msl prints it: a scalar as its value (`4.0`, `0.6931472`, `12`,
/// `true`, `-inf`, `nan`), other tensors as nested lists with `", "` separators. Tensors with
/// more than 1000 elements show three items at each end of every long axis around `...`.
/// Lines are never wrapped.
pub fn format_tensor(t: &Tensor) -> String {
    format_tensor_with(t, None)
}

/// [`format_tensor`] with floats in fixed notation with `precision` digits after the point
/// (`print(x, precision: 3)`: `0.333`, `1.000`, `-inf`, `nan`), as Python's `f"{x:.3f}"`.
pub fn format_tensor_with(t: &Tensor, precision: Option<usize>) -> String {
    let fixed = |x: f64, k: usize| {
        if x.is_nan() {
            "nan".to_string()
        } else if x.is_infinite() {
            if x > 0.0 { "inf" } else { "-inf" }.to_string()
        } else {
            format!("{x:.k$}")
        }
    };
    let elem: Box<dyn Fn(usize) -> String + '_> = match (t.storage(), precision) {
        (Storage::F32(v), Some(k)) => Box::new(move |i| fixed(f64::from(v[i]), k)),
        (Storage::F64(v), Some(k)) => Box::new(move |i| fixed(v[i], k)),
        (Storage::F32(v), None) => Box::new(move |i| format_f32(v[i])),
        (Storage::F64(v), None) => Box::new(move |i| format_f64(v[i])),
        (Storage::I32(v), _) => Box::new(move |i| v[i].to_string()),
        (Storage::Bool(v), _) => Box::new(move |i| v[i].to_string()),
        (Storage::Bf16(v), Some(k)) => Box::new(move |i| fixed(v[i].to_f64(), k)),
        (Storage::F16(v), Some(k)) => Box::new(move |i| fixed(v[i].to_f64(), k)),
        (Storage::Bf16(v), None) => Box::new(move |i| format_half(v[i].to_f32(), |x| half::bf16::from_f32(x).to_f32())),
        (Storage::F16(v), None) => Box::new(move |i| format_half(v[i].to_f32(), |x| half::f16::from_f32(x).to_f32())),
    };
    let mut out = String::new();
    let summarize = t.len() > THRESHOLD;
    let strides = crate::cpu::contiguous_strides(t.shape());
    write_axis(&mut out, t.shape(), &strides, 0, 0, summarize, &*elem);
    out
}

fn write_axis(
    out: &mut String,
    shape: &[usize],
    strides: &[usize],
    dim: usize,
    offset: usize,
    summarize: bool,
    elem: &dyn Fn(usize) -> String,
) {
    if dim == shape.len() {
        out.push_str(&elem(offset));
        return;
    }
    let n = shape[dim];
    out.push('[');
    let write_item = |out: &mut String, i: usize| {
        write_axis(out, shape, strides, dim + 1, offset + i * strides[dim], summarize, elem)
    };
    if summarize && n > 2 * EDGE {
        for i in 0..EDGE {
            write_item(out, i);
            out.push_str(", ");
        }
        out.push_str("...");
        for i in n - EDGE..n {
            out.push_str(", ");
            write_item(out, i);
        }
    } else {
        for i in 0..n {
            if i > 0 {
                out.push_str(", ");
            }
            write_item(out, i);
        }
    }
    out.push(']');
}

/// The shortest decimal that reads back as the same f32, in Python's `repr` style.
pub fn format_f32(v: f32) -> String {
    python_style(format!("{v:?}"))
}

/// The shortest decimal that reads back as the same `bf16` or `f16` value (`round` rounds an
/// `f32` to that type), as `ml_dtypes` and JAX print them: `bf16(0.1)` is `0.1`, not the
/// `0.10009765625` it holds.
pub fn format_half(v: f32, round: impl Fn(f32) -> f32) -> String {
    if !v.is_finite() {
        return format_f32(v);
    }
    for digits in 1..=9 {
        let s = format!("{v:.*e}", digits - 1);
        if let Ok(x) = s.parse::<f32>() {
            if round(x) == v {
                return format_f32(x);
            }
        }
    }
    format_f32(v)
}

/// The shortest decimal that reads back as the same f64, in Python's `repr` style.
pub fn format_f64(v: f64) -> String {
    python_style(format!("{v:?}"))
}

/// Rust's `Debug` float output already is the shortest round-trip form with `.0` on integral
/// values and scientific notation outside `[1e-4, 1e16)`, as Python's `repr`. Only the
/// spelling of NaN and of exponents (`1e+20`, `1e-07`) differs.
fn python_style(s: String) -> String {
    if s == "NaN" {
        return "nan".into();
    }
    match s.split_once('e') {
        None => s,
        Some((mantissa, exp)) => {
            let (sign, digits) = match exp.strip_prefix('-') {
                Some(d) => ('-', d),
                None => ('+', exp),
            };
            format!("{mantissa}e{sign}{digits:0>2}")
        }
    }
}
