//! Numeric comma-separated files: an optional header row, then rows of numbers.

use std::path::Path;

use crate::error::KernelError;
use crate::format::{format_f32, format_f64};
use crate::tensor::{DType, Storage, Tensor};

/// Reads a numeric CSV file as an f64 tensor of shape `[rows, cols]`. A first row that does
/// not parse as numbers is taken as a header and skipped; blank lines are ignored; every row
/// must have the same number of values.
pub fn read_csv(path: &Path) -> Result<Tensor, KernelError> {
    read_csv_as(path, DType::F64)
}

/// Reads a numeric CSV file as a `[rows, cols]` tensor of `dtype` (see [`parse_csv_as`]).
pub fn read_csv_as(path: &Path, dtype: DType) -> Result<Tensor, KernelError> {
    let bytes = super::file::read_file(path)?;
    parse_csv_as(&bytes, &path.display().to_string(), dtype)
}

/// Parses CSV bytes as f64; `name` is used in error messages.
pub fn parse_csv(bytes: &[u8], name: &str) -> Result<Tensor, KernelError> {
    parse_csv_as(bytes, name, DType::F64)
}

/// Parses CSV bytes into a tensor of `dtype`. Values convert as `f32(x)`, `i32(x)` and bool's
/// `x != 0` do, except that a value `i32` cannot hold exactly (NaN, an infinity, a fraction,
/// anything out of range) is an error naming its row, line, column and text: text numbers
/// carry no element type, so a value that does not fit is a wrong file, never a value to clip.
pub fn parse_csv_as(bytes: &[u8], name: &str, dtype: DType) -> Result<Tensor, KernelError> {
    let err = |m: String| KernelError::Io { path: name.to_string(), message: m };
    let text = std::str::from_utf8(bytes).map_err(|_| err("not a text file (invalid UTF-8)".into()))?;
    let split = |line: &str| -> Vec<String> {
        line.trim().split(',').map(|f| f.trim().trim_matches('"').trim().to_string()).collect()
    };
    let mut values: Vec<f64> = Vec::new();
    // The line number (from 1) of each data row, for messages.
    let mut lines: Vec<usize> = Vec::new();
    let mut cols: Option<(usize, usize)> = None;
    let mut first = true;
    for (lineno, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let fields = split(line);
        let parsed: Result<Vec<f64>, usize> =
            fields.iter().enumerate().map(|(i, f)| f.parse::<f64>().map_err(|_| i)).collect();
        let row = match parsed {
            Ok(row) => row,
            Err(_) if first => {
                first = false;
                continue;
            }
            Err(col) => {
                return Err(err(format!(
                    "line {}, column {}: \"{}\" is not a number",
                    lineno + 1,
                    col + 1,
                    super::shown(&fields[col])
                )))
            }
        };
        first = false;
        match cols {
            None => cols = Some((row.len(), lineno + 1)),
            Some((n, at)) if n != row.len() => {
                return Err(err(format!("line {} has {} values but line {at} has {n}", lineno + 1, row.len())))
            }
            _ => {}
        }
        values.extend(row);
        lines.push(lineno + 1);
    }
    let cols = cols.map_or(0, |c| c.0);
    let shape = vec![lines.len(), cols];
    match dtype {
        DType::F64 => Tensor::from_f64(shape, values),
        DType::F32 => Tensor::from_f32(shape, values.iter().map(|&v| v as f32).collect()),
        DType::Bf16 | DType::F16 => Ok(Tensor::from_f64(shape, values)?.cast(dtype)),
        DType::Bool => Tensor::from_bool(shape, values.iter().map(|&v| v != 0.0).collect()),
        DType::I32 => {
            let whole = |v: f64| v.fract() == 0.0 && crate::tensor::f64_fits_i32(v);
            if let Some(i) = values.iter().position(|&v| !whole(v)) {
                let (row, col) = (i / cols, i % cols);
                let line = lines[row];
                let field = text.lines().nth(line - 1).map(|l| split(l)[col].clone()).unwrap_or_default();
                let v = values[i];
                let why = if v.is_nan() {
                    "is not a number".to_string()
                } else if v.is_finite() && v.fract() != 0.0 {
                    "is not a whole number".to_string()
                } else {
                    format!("is outside the range of i32 ({} to {})", i32::MIN, i32::MAX)
                };
                return Err(err(format!(
                    "row {} (line {line}), column {}: {field} {why}, so it cannot be loaded as i32",
                    row + 1,
                    col + 1
                )));
            }
            Tensor::from_i32(shape, values.iter().map(|&v| v as i32).collect())
        }
    }
}

/// Writes a tensor of rank at most 2 as CSV: a scalar as one value, a vector as one value per
/// line (like `numpy.savetxt`), a matrix as one row per line. Bools are written as 1 and 0.
pub fn write_csv(path: &Path, t: &Tensor) -> Result<(), KernelError> {
    let (rows, cols) = match t.shape() {
        [] => (1, 1),
        [n] => (*n, 1),
        [r, c] => (*r, *c),
        _ => {
            return Err(KernelError::io(
                path,
                format!("cannot write a rank-{} tensor as CSV (rank 2 at most)", t.rank()),
            ))
        }
    };
    let cell = |i: usize| -> String {
        match t.storage() {
            Storage::F32(v) => format_f32(v[i]),
            Storage::F64(v) => format_f64(v[i]),
            Storage::I32(v) => v[i].to_string(),
            Storage::Bool(v) => u8::from(v[i]).to_string(),
            Storage::Bf16(v) => crate::format::format_half(v[i].to_f32(), |x| half::bf16::from_f32(x).to_f32()),
            Storage::F16(v) => crate::format::format_half(v[i].to_f32(), |x| half::f16::from_f32(x).to_f32()),
        }
    };
    let mut out = String::new();
    for r in 0..rows {
        let line: Vec<String> = (0..cols).map(|c| cell(r * cols + c)).collect();
        out.push_str(&line.join(","));
        out.push('\n');
    }
    super::file::write_bytes(path, out.as_bytes())
}
