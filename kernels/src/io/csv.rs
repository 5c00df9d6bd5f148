//! Numeric comma-separated files: an optional header row, then rows of numbers.

use std::path::Path;

use crate::error::KernelError;
use crate::format::{format_f32, format_f64};
use crate::tensor::{Storage, Tensor};

/// Reads a numeric CSV file as an f64 tensor of shape `[rows, cols]`. A first row that does
/// not parse as numbers is taken as a header and skipped; blank lines are ignored; every row
/// must have the same number of values.
pub fn read_csv(path: &Path) -> Result<Tensor, KernelError> {
    let bytes = std::fs::read(path).map_err(|e| KernelError::io(path, format!("cannot read: {e}")))?;
    parse_csv(&bytes, &path.display().to_string())
}

/// Parses CSV bytes; `name` is used in error messages.
pub fn parse_csv(bytes: &[u8], name: &str) -> Result<Tensor, KernelError> {
    let err = |m: String| KernelError::Io { path: name.to_string(), message: m };
    let text = std::str::from_utf8(bytes).map_err(|_| err("not a text file (invalid UTF-8)".into()))?;
    let mut values: Vec<f64> = Vec::new();
    let mut cols: Option<(usize, usize)> = None;
    let mut rows = 0usize;
    let mut first = true;
    for (lineno, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let fields: Vec<&str> = line.split(',').map(|f| f.trim().trim_matches('"').trim()).collect();
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
                    fields[col]
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
        rows += 1;
    }
    let cols = cols.map_or(0, |c| c.0);
    Tensor::from_f64(vec![rows, cols], values)
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
        }
    };
    let mut out = String::new();
    for r in 0..rows {
        let line: Vec<String> = (0..cols).map(|c| cell(r * cols + c)).collect();
        out.push_str(&line.join(","));
        out.push('\n');
    }
    std::fs::write(path, out).map_err(|e| KernelError::io(path, format!("cannot write: {e}")))
}
