//! `.safetensors` files: parsed and validated by the `safetensors` crate, written by hand so
//! that tensors keep the order the caller gives.

use std::collections::HashSet;
use std::path::Path;

use safetensors::tensor::{Dtype, SafeTensors};

use crate::error::KernelError;
use crate::tensor::{DType, Tensor};

/// Reads every tensor of a `.safetensors` file, in file (offset) order.
pub fn read_safetensors(path: &Path) -> Result<Vec<(String, Tensor)>, KernelError> {
    let bytes = super::file::read_file(path)?;
    parse_safetensors(&bytes, &path.display().to_string(), |_| true)
}

/// Reads one tensor of a `.safetensors` file: the one named `entry`, or the only one when
/// `entry` is `None`. Other tensors are not decoded. Errors list the names the file holds.
pub fn read_safetensors_entry(path: &Path, entry: Option<&str>) -> Result<Tensor, KernelError> {
    let bytes = super::file::read_file(path)?;
    let name = path.display().to_string();
    let names = parse_safetensors(&bytes, &name, |_| false)?;
    let names: Vec<String> = names.into_iter().map(|(n, _)| n).collect();
    let listed = || names.iter().map(|n| super::shown(n)).collect::<Vec<_>>().join(", ");
    let wanted = match entry {
        Some(e) if names.iter().any(|n| n == e) => e.to_string(),
        Some(e) => return Err(KernelError::io(path, format!("no tensor named '{e}' (the file holds: {})", listed()))),
        None => match names.len() {
            0 => return Err(KernelError::io(path, "the file holds no tensors")),
            1 => names[0].clone(),
            _ => {
                return Err(KernelError::io(
                    path,
                    format!("the file holds several tensors ({}); name the one to load", listed()),
                ))
            }
        },
    };
    let all = parse_safetensors(&bytes, &name, |n| n == wanted)?;
    let found = all.into_iter().find(|(n, _)| *n == wanted);
    found.map(|(_, t)| t).ok_or_else(|| KernelError::io(path, format!("no tensor named '{wanted}'")))
}

/// The shape of one tensor of a `.safetensors` file (chosen as [`read_safetensors_entry`]
/// chooses it), reading only the 8-byte length and the JSON header (`msl dryrun`).
pub fn entry_shape(path: &Path, entry: Option<&str>) -> Result<Vec<usize>, KernelError> {
    use std::io::Read;
    let (f, len) = super::file::open_file(path)?;
    let fail = |m: &str| KernelError::io(path, format!("not a valid .safetensors file ({m})"));
    let mut f = f.take(8);
    let mut pre = [0u8; 8];
    f.read_exact(&mut pre).map_err(|_| fail("shorter than its header length"))?;
    let n = u64::from_le_bytes(pre);
    if n > len.saturating_sub(8) || n > 100 << 20 {
        return Err(fail("its header length exceeds the file"));
    }
    let mut f = f.into_inner().take(n);
    let mut header = Vec::new();
    f.read_to_end(&mut header).map_err(|e| KernelError::io(path, format!("cannot read: {e}")))?;
    let json: serde_json::Value = serde_json::from_slice(&header).map_err(|_| fail("its header is not JSON"))?;
    let obj = json.as_object().ok_or_else(|| fail("its header is not a JSON object"))?;
    let names: Vec<&String> = obj.keys().filter(|k| k.as_str() != "__metadata__").collect();
    let listed = || names.iter().map(|n| super::shown(n)).collect::<Vec<_>>().join(", ");
    let key = match entry {
        Some(e) if names.iter().any(|n| *n == e) => e.to_string(),
        Some(e) => return Err(KernelError::io(path, format!("no tensor named '{e}' (the file holds: {})", listed()))),
        None if names.len() == 1 => names[0].clone(),
        None if names.is_empty() => return Err(KernelError::io(path, "the file holds no tensors")),
        None => {
            return Err(KernelError::io(
                path,
                format!("the file holds several tensors ({}); name the one to load", listed()),
            ))
        }
    };
    let shape = obj[&key].get("shape").and_then(|s| s.as_array()).ok_or_else(|| fail("a tensor has no shape"))?;
    shape
        .iter()
        .map(|d| d.as_u64().and_then(|d| usize::try_from(d).ok()).ok_or_else(|| fail("a bad dimension")))
        .collect()
}

/// Parses the bytes of a `.safetensors` file; `name` is used in error messages. Tensors for
/// which `decode_it` is false are listed with an empty placeholder instead of being decoded.
pub fn parse_safetensors(
    bytes: &[u8],
    name: &str,
    decode_it: impl Fn(&str) -> bool,
) -> Result<Vec<(String, Tensor)>, KernelError> {
    let err = |m: String| KernelError::Io { path: name.to_string(), message: m };
    let (header_len, meta) =
        SafeTensors::read_metadata(bytes).map_err(|e| err(format!("not a valid .safetensors file ({e})")))?;
    let data_start = 8usize.saturating_add(header_len);
    let data = bytes.get(data_start..).ok_or_else(|| err("truncated: the file ends inside its header".into()))?;
    let mut out = Vec::new();
    for key in meta.offset_keys() {
        if !decode_it(&key) {
            out.push((key, Tensor::scalar_bool(false)));
            continue;
        }
        let info = meta.info(&key).ok_or_else(|| err(format!("tensor '{}' has no entry", super::shown(&key))))?;
        let (start, end) = info.data_offsets;
        let raw = data.get(start..end).ok_or_else(|| {
            err(format!("truncated: the data of tensor '{}' lies past the end of the file", super::shown(&key)))
        })?;
        let t =
            decode(info.dtype, &info.shape, raw).map_err(|m| err(format!("tensor '{}': {m}", super::shown(&key))))?;
        out.push((key, t));
    }
    Ok(out)
}

fn decode(dtype: Dtype, shape: &[usize], raw: &[u8]) -> Result<Tensor, String> {
    let shape = shape.to_vec();
    let mk = |t: Result<Tensor, KernelError>| t.map_err(|e| e.to_string());
    macro_rules! le {
        ($n:expr, $f:expr) => {
            raw.chunks_exact($n).map(|c| $f(c.try_into().expect("chunk size")))
        };
    }
    let ints = |vals: Vec<i64>| -> Result<Tensor, String> {
        let v = vals
            .into_iter()
            .enumerate()
            .map(|(i, x)| i32::try_from(x).map_err(|_| format!("element {i} ({x}) does not fit in i32")))
            .collect::<Result<Vec<i32>, String>>()?;
        mk(Tensor::from_vec(shape.clone(), v))
    };
    // The element types msl keeps as they are: the bytes copied into place.
    let kept = |d: DType| mk(super::tensor_from_le(d, shape.clone(), raw));
    match dtype {
        Dtype::F32 => kept(DType::F32),
        Dtype::F64 => kept(DType::F64),
        Dtype::F16 => kept(DType::F16),
        Dtype::BF16 => kept(DType::Bf16),
        Dtype::I32 => kept(DType::I32),
        Dtype::BOOL => kept(DType::Bool),
        Dtype::I64 => ints(le!(8, i64::from_le_bytes).collect()),
        Dtype::I16 => ints(le!(2, i16::from_le_bytes).map(i64::from).collect()),
        Dtype::I8 => ints(raw.iter().map(|&b| b as i8 as i64).collect()),
        Dtype::U8 => ints(raw.iter().map(|&b| b as i64).collect()),
        Dtype::U16 => ints(le!(2, u16::from_le_bytes).map(i64::from).collect()),
        Dtype::U32 => ints(le!(4, u32::from_le_bytes).map(i64::from).collect()),
        other => Err(format!(
            "unsupported dtype {other:?} (msl reads F32, F64, F16, BF16, I64, I32, I16, I8, U8, U16, U32 and BOOL)"
        )),
    }
}

/// Writes named tensors, in the given order, as a `.safetensors` file with
/// `"__metadata__": {"format": "pt"}`, atomically. Names must be distinct.
pub fn write_safetensors(path: &Path, named: &[(String, Tensor)]) -> Result<(), KernelError> {
    write_safetensors_narrowed(path, named, &HashSet::new())
}

/// [`write_safetensors`], with the `i32` tensors named in `int8` written as `I8` (a quantized
/// matrix's values; each must lie in -128..=127).
pub fn write_safetensors_narrowed(
    path: &Path,
    named: &[(String, Tensor)],
    int8: &HashSet<String>,
) -> Result<(), KernelError> {
    let bytes = bytes_narrowed(named, int8).map_err(|m| KernelError::io(path, m))?;
    super::file::write_bytes(path, &bytes)
}

/// The bytes of a `.safetensors` file holding `named`.
pub fn safetensors_bytes(named: &[(String, Tensor)]) -> Result<Vec<u8>, String> {
    bytes_narrowed(named, &HashSet::new())
}

fn bytes_narrowed(named: &[(String, Tensor)], int8: &HashSet<String>) -> Result<Vec<u8>, String> {
    let head = header_narrowed(named, int8)?;
    let data: usize = named.iter().map(|(n, t)| t.len() * stored_size(n, t, int8)).sum();
    let mut out = Vec::with_capacity(head.len() + data);
    out.extend_from_slice(&head);
    for (n, t) in named {
        if int8.contains(n) {
            let v = t.as_i32().ok_or_else(|| format!("'{n}' is not an integer tensor"))?;
            for &x in v {
                out.push(i8::try_from(x).map_err(|_| format!("'{n}' holds {x}, not an int8 value"))? as u8);
            }
        } else {
            super::push_le_data(&mut out, t);
        }
    }
    Ok(out)
}

/// Bytes per element of `t` as written.
fn stored_size(name: &str, t: &Tensor, int8: &HashSet<String>) -> usize {
    if int8.contains(name) {
        1
    } else {
        t.dtype().size_in_bytes()
    }
}

/// The safetensors element type name of `d`.
pub fn dtype_name(d: DType) -> &'static str {
    match d {
        DType::F32 => "F32",
        DType::F64 => "F64",
        DType::I32 => "I32",
        DType::Bool => "BOOL",
        DType::Bf16 => "BF16",
        DType::F16 => "F16",
    }
}

/// The start of a `.safetensors` file holding `named`: the header's length (8 bytes, little
/// endian) and the header, padded with spaces to a multiple of 8 bytes. The tensors' data
/// follows it in the given order, each one's bytes right after the previous one's.
pub(crate) fn header(named: &[(String, Tensor)]) -> Result<Vec<u8>, String> {
    header_narrowed(named, &HashSet::new())
}

fn header_narrowed(named: &[(String, Tensor)], int8: &HashSet<String>) -> Result<Vec<u8>, String> {
    let mut header = String::from("{\"__metadata__\":{\"format\":\"pt\"}");
    let mut offset = 0usize;
    let mut seen = std::collections::HashSet::new();
    for (name, t) in named {
        if name == "__metadata__" || !seen.insert(name.as_str()) {
            return Err(format!("cannot save two tensors named '{name}'"));
        }
        let size = t.len() * stored_size(name, t, int8);
        let dims: Vec<String> = t.shape().iter().map(|d| d.to_string()).collect();
        header.push_str(&format!(
            ",{}:{{\"dtype\":\"{}\",\"shape\":[{}],\"data_offsets\":[{offset},{}]}}",
            json_string(name),
            if int8.contains(name) { "I8" } else { dtype_name(t.dtype()) },
            dims.join(","),
            offset + size
        ));
        offset += size;
    }
    header.push('}');
    while header.len() % 8 != 0 {
        header.push(' ');
    }
    let mut out = Vec::with_capacity(8 + header.len());
    out.extend_from_slice(&(header.len() as u64).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    Ok(out)
}

/// A JSON string literal for `s`.
fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}
