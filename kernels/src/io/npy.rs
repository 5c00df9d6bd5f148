//! NumPy `.npy` files: versions 1.0, 2.0 and 3.0, either byte order, C or Fortran order.
//!
//! Reading never panics: every length and offset comes from the file and is checked before
//! use, the data is read only after the header has been checked against the file's length,
//! and every failure names the file and says what is wrong with it.

use std::io::Read;

use crate::cpu::shape::permute;
use crate::error::KernelError;
use crate::tensor::{checked_numel, DType, Storage, Tensor};

const MAGIC: &[u8] = b"\x93NUMPY";

fn err(name: &str, message: impl Into<String>) -> KernelError {
    KernelError::Io { path: name.to_string(), message: message.into() }
}

/// Reads a `.npy` file: its header first, then exactly the data the header describes, after
/// checking that the file is long enough to hold it.
pub fn read_npy(path: &std::path::Path) -> Result<Tensor, KernelError> {
    let (mut file, len) = super::file::open_file(path)?;
    read_npy_from(&mut file, len, true, &path.display().to_string())
}

/// Writes a `.npy` file (version 1.0, or 2.0 for very long headers), atomically.
pub fn write_npy(path: &std::path::Path, t: &Tensor) -> Result<(), KernelError> {
    super::file::write_bytes(path, &npy_bytes(t))
}

/// The element kinds a `.npy` file may hold, before conversion to an msl dtype.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    Float,
    Int,
    Uint,
    Bool,
}

struct Descr {
    kind: Kind,
    size: usize,
    big_endian: bool,
    text: String,
}

impl Descr {
    /// How the element type reads in messages: `f64`, `i64`, `u8`, `bool`.
    fn short(&self) -> String {
        match self.kind {
            Kind::Float => format!("f{}", self.size * 8),
            Kind::Int => format!("i{}", self.size * 8),
            Kind::Uint => format!("u{}", self.size * 8),
            Kind::Bool => "bool".into(),
        }
    }
}

fn parse_descr(s: &str, name: &str) -> Result<Descr, KernelError> {
    let unsupported = || {
        err(
            name,
            format!(
                "unsupported element type '{}' (msl reads f2, f4, f8, i1, i2, i4, i8, u1, u2, u4, u8 and b1)",
                super::shown(s)
            ),
        )
    };
    let mut chars = s.chars();
    let order = chars.next().ok_or_else(unsupported)?;
    let big_endian = match order {
        '<' | '|' | '=' => false,
        '>' => true,
        _ => return Err(unsupported()),
    };
    let kind = match chars.next() {
        Some('f') => Kind::Float,
        Some('i') => Kind::Int,
        Some('u') => Kind::Uint,
        Some('b') => Kind::Bool,
        _ => return Err(unsupported()),
    };
    let size: usize = chars.as_str().parse().map_err(|_| unsupported())?;
    let ok = match kind {
        Kind::Float => matches!(size, 2 | 4 | 8),
        Kind::Int | Kind::Uint => matches!(size, 1 | 2 | 4 | 8),
        Kind::Bool => size == 1,
    };
    if !ok {
        return Err(unsupported());
    }
    Ok(Descr { kind, size, big_endian, text: s.to_string() })
}

/// A value of the Python dict literal in a `.npy` header.
#[derive(Debug)]
enum PyValue {
    Str(String),
    Bool(bool),
    Tuple(Vec<u64>),
    Other,
}

/// A small parser for the header dict, e.g. `{'descr': '<f4', 'fortran_order': False,
/// 'shape': (3, 4), }`.
struct HeaderParser<'a> {
    s: &'a [u8],
    pos: usize,
}

impl HeaderParser<'_> {
    fn ws(&mut self) {
        while self.pos < self.s.len() && self.s[self.pos].is_ascii_whitespace() {
            self.pos += 1;
        }
    }
    fn peek(&mut self) -> Option<u8> {
        self.ws();
        self.s.get(self.pos).copied()
    }
    fn eat(&mut self, c: u8) -> bool {
        if self.peek() == Some(c) {
            self.pos += 1;
            true
        } else {
            false
        }
    }
    fn string(&mut self) -> Option<String> {
        let q = self.peek()?;
        if q != b'\'' && q != b'"' {
            return None;
        }
        let start = self.pos + 1;
        let len = self.s[start..].iter().position(|&c| c == q)?;
        self.pos = start + len + 1;
        String::from_utf8(self.s[start..start + len].to_vec()).ok()
    }
    fn word(&mut self) -> &[u8] {
        self.ws();
        let start = self.pos;
        while self.pos < self.s.len() && (self.s[self.pos].is_ascii_alphanumeric() || self.s[self.pos] == b'_') {
            self.pos += 1;
        }
        &self.s[start..self.pos]
    }
    fn value(&mut self) -> Option<PyValue> {
        match self.peek()? {
            b'\'' | b'"' => self.string().map(PyValue::Str),
            b'(' => {
                self.pos += 1;
                let mut dims = Vec::new();
                loop {
                    if self.eat(b')') {
                        return Some(PyValue::Tuple(dims));
                    }
                    let w = self.word();
                    let w = w.strip_suffix(b"L").unwrap_or(w);
                    let d: u64 = std::str::from_utf8(w).ok()?.parse().ok()?;
                    dims.push(d);
                    if !self.eat(b',') && self.peek() != Some(b')') {
                        return None;
                    }
                }
            }
            b'[' => Some(PyValue::Other),
            _ => match self.word() {
                b"True" => Some(PyValue::Bool(true)),
                b"False" => Some(PyValue::Bool(false)),
                _ => None,
            },
        }
    }
    fn dict(&mut self) -> Option<Vec<(String, PyValue)>> {
        if !self.eat(b'{') {
            return None;
        }
        let mut out = Vec::new();
        loop {
            if self.eat(b'}') {
                return Some(out);
            }
            let key = self.string()?;
            if !self.eat(b':') {
                return None;
            }
            let v = self.value()?;
            out.push((key, v));
            if !self.eat(b',') && self.peek() != Some(b'}') {
                return None;
            }
        }
    }
}

/// Parses the bytes of a `.npy` file; `name` is used in error messages.
pub fn parse_npy(bytes: &[u8], name: &str) -> Result<Tensor, KernelError> {
    read_npy_from(&mut &bytes[..], bytes.len() as u64, true, name)
}

/// The shape a `.npy` stream of `avail` bytes declares, reading its header only (`msl dryrun`).
pub(crate) fn header_shape(r: &mut impl Read, avail: u64, name: &str) -> Result<Vec<usize>, KernelError> {
    read_header(r, avail, name).map(|h| h.shape)
}

/// What a `.npy` header says about the data after it.
struct Header {
    descr: Descr,
    fortran: bool,
    shape: Vec<usize>,
    /// Bytes from the start of the file to the first data byte.
    data_start: u64,
    /// Bytes of data the shape and element type need.
    need: usize,
}

/// Reads a `.npy` stream of `avail` bytes: the header, then exactly the data it describes.
/// `avail` is the file's length, or the size an archive declares for a member; it bounds what
/// the header may claim before anything is allocated. With `trusted` (a regular file's own
/// length) the data buffer is allocated at once; otherwise it grows as bytes arrive, so that a
/// lying declared size costs nothing.
pub(crate) fn read_npy_from(r: &mut impl Read, avail: u64, trusted: bool, name: &str) -> Result<Tensor, KernelError> {
    let h = read_header(r, avail, name)?;
    let have = avail.saturating_sub(h.data_start);
    let truncated = |have: u64| {
        let dims: Vec<String> = h.shape.iter().map(|d| d.to_string()).collect();
        let dims = if dims.is_empty() { "scalar".to_string() } else { dims.join("×") };
        err(
            name,
            format!(
                "truncated: header says {dims} {} but file holds {have} bytes of data (needs {})",
                h.descr.short(),
                h.need
            ),
        )
    };
    if have < h.need as u64 {
        return Err(truncated(have));
    }
    let data = if trusted {
        let mut data = vec![0u8; h.need];
        r.read_exact(&mut data).map_err(|e| match e.kind() {
            std::io::ErrorKind::UnexpectedEof => err(name, "truncated: the file is shorter than its length said"),
            _ => err(name, format!("cannot read: {e}")),
        })?;
        data
    } else {
        let data = super::file::read_at_most(r, h.need as u64).map_err(|e| err(name, format!("cannot read: {e}")))?;
        if data.len() < h.need {
            return Err(truncated(data.len() as u64));
        }
        data
    };
    let storage = decode(&data, &h.descr, name)?;
    let shape = h.shape;
    if h.fortran && shape.len() > 1 {
        let reversed: Vec<usize> = shape.iter().rev().copied().collect();
        let t = Tensor::new(reversed, storage)?;
        let perm: Vec<usize> = (0..shape.len()).rev().collect();
        permute(&t, &perm)
    } else {
        Tensor::new(shape, storage)
    }
}

/// Reads and checks the preamble and header dict of a `.npy` stream of `avail` bytes.
fn read_header(r: &mut impl Read, avail: u64, name: &str) -> Result<Header, KernelError> {
    let read = |r: &mut dyn Read, n: u64| {
        let mut v = Vec::new();
        r.take(n).read_to_end(&mut v).map(|_| v).map_err(|e| err(name, format!("cannot read: {e}")))
    };
    let pre = read(r, 8)?;
    if pre.len() < 8 || &pre[..6] != MAGIC {
        return Err(err(name, "not a .npy file (bad magic)"));
    }
    let (major, minor) = (pre[6], pre[7]);
    let width = match major {
        1 => 2u64,
        2 | 3 => 4,
        _ => {
            return Err(err(
                name,
                format!("unsupported .npy format version {major}.{minor} (msl reads 1.0, 2.0 and 3.0)"),
            ))
        }
    };
    let ends_in_header = || err(name, "truncated: the file ends inside its header");
    let len_bytes = read(r, width)?;
    if (len_bytes.len() as u64) < width {
        return Err(ends_in_header());
    }
    let header_len = len_bytes.iter().rev().fold(0u64, |a, &b| a << 8 | u64::from(b));
    let header_start = 8 + width;
    let data_start = header_start + header_len;
    if data_start > avail {
        return Err(ends_in_header());
    }
    let header = read(r, header_len)?;
    if (header.len() as u64) < header_len {
        return Err(ends_in_header());
    }
    let bad_header = |what: &str| err(name, format!("malformed .npy header: {what}"));
    let fields = HeaderParser { s: &header, pos: 0 }.dict().ok_or_else(|| bad_header("not a Python dict literal"))?;
    let get = |k: &str| fields.iter().find(|(key, _)| key == k).map(|(_, v)| v);
    let descr = match get("descr") {
        Some(PyValue::Str(s)) => parse_descr(s, name)?,
        Some(_) => return Err(err(name, "structured (record) arrays are not supported")),
        None => return Err(bad_header("no 'descr' entry")),
    };
    let fortran = match get("fortran_order") {
        Some(PyValue::Bool(b)) => *b,
        None => false,
        Some(_) => return Err(bad_header("'fortran_order' is not True or False")),
    };
    let dims = match get("shape") {
        Some(PyValue::Tuple(d)) => d.clone(),
        _ => return Err(bad_header("no 'shape' tuple")),
    };
    let shape: Vec<usize> = dims
        .iter()
        .map(|&d| usize::try_from(d).map_err(|_| bad_header("a dimension is too large")))
        .collect::<Result<_, _>>()?;
    // A shape msl could not hold is refused here, before any data is read.
    let count = checked_numel(&shape).map_err(|e| err(name, e.to_string()))?;
    let need = count.checked_mul(descr.size).ok_or_else(|| bad_header("the shape has too many elements"))?;
    Ok(Header { descr, fortran, shape, data_start, need })
}

/// Converts raw element bytes to storage: floats to f32/f64 (f16 widens to f32), integers to
/// i32 with a range check, bools to bool.
fn decode(data: &[u8], d: &Descr, name: &str) -> Result<Storage, KernelError> {
    let be = d.big_endian;
    let word = |c: &[u8]| -> u64 {
        let mut v = 0u64;
        if be {
            for &b in c {
                v = v << 8 | b as u64;
            }
        } else {
            for &b in c.iter().rev() {
                v = v << 8 | b as u64;
            }
        }
        v
    };
    let chunks = data.chunks_exact(d.size);
    Ok(match (d.kind, d.size) {
        (Kind::Float, 2) => crate::tensor::Element::into_storage(
            chunks.map(|c| half::f16::from_bits(word(c) as u16)).collect::<Vec<half::f16>>(),
        ),
        (Kind::Float, 4) => {
            crate::tensor::Element::into_storage(chunks.map(|c| f32::from_bits(word(c) as u32)).collect::<Vec<f32>>())
        }
        (Kind::Float, _) => {
            crate::tensor::Element::into_storage(chunks.map(|c| f64::from_bits(word(c))).collect::<Vec<f64>>())
        }
        (Kind::Bool, _) => crate::tensor::Element::into_storage(data.iter().map(|&b| b != 0).collect::<Vec<bool>>()),
        (Kind::Int, size) => {
            let shift = 64 - 8 * size as u32;
            let vals = chunks.map(|c| ((word(c) << shift) as i64) >> shift);
            crate::tensor::Element::into_storage(to_i32(vals, d, name)?)
        }
        (Kind::Uint, _) => {
            let vals = chunks.map(|c| word(c).min(i64::MAX as u64) as i64);
            crate::tensor::Element::into_storage(to_i32(vals, d, name)?)
        }
    })
}

fn to_i32(vals: impl Iterator<Item = i64>, d: &Descr, name: &str) -> Result<Vec<i32>, KernelError> {
    vals.enumerate()
        .map(|(i, v)| {
            i32::try_from(v)
                .map_err(|_| err(name, format!("element {i} ({v}) of this '{}' array does not fit in i32", d.text)))
        })
        .collect()
}

/// The bytes of a `.npy` file holding `t` (little-endian, C order).
pub fn npy_bytes(t: &Tensor) -> Vec<u8> {
    let descr = match t.dtype() {
        DType::F32 => "<f4",
        DType::F64 => "<f8",
        DType::I32 => "<i4",
        DType::Bool => "|b1",
        DType::F16 => "<f2",
        // NumPy has no bfloat16: its values are written as the f32 values they are (exactly).
        DType::Bf16 => return npy_bytes(&t.cast(DType::F32)),
    };
    let dims: Vec<String> = t.shape().iter().map(|d| d.to_string()).collect();
    let shape = match dims.len() {
        0 => "()".to_string(),
        1 => format!("({},)", dims[0]),
        _ => format!("({})", dims.join(", ")),
    };
    let mut header = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
    // The preamble (magic, version, length) plus the header end on a 64-byte boundary, '\n' last.
    let v1 = header.len() + 11 <= u16::MAX as usize;
    let preamble = if v1 { 10 } else { 12 };
    let total = (preamble + header.len() + 1).div_ceil(64) * 64;
    while preamble + header.len() + 1 < total {
        header.push(' ');
    }
    header.push('\n');
    let mut out = Vec::with_capacity(total + t.nbytes());
    out.extend_from_slice(MAGIC);
    if v1 {
        out.extend_from_slice(&[1, 0]);
        out.extend_from_slice(&(header.len() as u16).to_le_bytes());
    } else {
        out.extend_from_slice(&[2, 0]);
        out.extend_from_slice(&(header.len() as u32).to_le_bytes());
    }
    out.extend_from_slice(header.as_bytes());
    super::push_le_data(&mut out, t);
    out
}
