//! The one error type of the kernels crate, with the user-facing messages msl prints.

use std::fmt;

use crate::tensor::DType;

/// Everything a kernel, the RNG or a file loader can report.
///
/// The variants carry data rather than prose so that callers can react to them; `Display` turns
/// them into the sentences that msl shows its users.
#[derive(Debug, Clone, PartialEq)]
pub enum KernelError {
    /// Two shapes that an operation needs to agree do not.
    ShapeMismatch { op: &'static str, lhs: Vec<usize>, rhs: Vec<usize> },
    /// A tensor was built from a data vector whose length does not match its shape.
    DataLength { shape: Vec<usize>, len: usize },
    /// Integer division or remainder by zero.
    DivisionByZero,
    /// An index (in a slice, gather, scatter or one-hot) falls outside its axis.
    IndexOutOfRange { index: i64, axis: usize, size: usize },
    /// An axis argument is not smaller than the rank of the tensor.
    AxisOutOfRange { op: &'static str, axis: usize, rank: usize },
    /// An operation got an element type it does not support.
    DTypeMismatch { op: &'static str, expected: String, found: String },
    /// A file could not be read or written, or its content is malformed.
    Io { path: String, message: String },
    /// A file is well formed but holds something other than what was asked for.
    FileMismatch { path: String, expected: String, found: String },
    /// A shape whose element count cannot be held: the product of its nonzero dimensions is
    /// above [`MAX_ELEMENTS`](crate::tensor::MAX_ELEMENTS). The dims are wide so that a sum of
    /// dimensions that overflowed `usize` (a huge `concat`) can still be shown exactly.
    SizeOverflow { dims: Vec<u128> },
    /// A float converted to `i32` is NaN, infinite or outside the range of `i32`. `index` is the
    /// flat position of the first such element, `None` for a scalar.
    /// `value` is the element as msl prints it.
    CastOutOfRange { value: String, nan: bool, to: DType, index: Option<usize> },
    /// A run-time count or length outside what the operands hold (a cache length, a `top_k`
    /// count), described in words.
    OutOfRange(String),
    /// Any other invalid argument, described in words.
    Invalid(String),
}

impl KernelError {
    /// A shorthand for the dtype errors of operations that take one kind of element.
    pub(crate) fn dtype(op: &'static str, expected: &str, found: DType) -> KernelError {
        KernelError::DTypeMismatch { op, expected: expected.to_string(), found: found.to_string() }
    }

    /// The error for a shape of `usize` dims whose element count is too large.
    pub(crate) fn size_overflow(dims: &[usize]) -> KernelError {
        KernelError::SizeOverflow { dims: dims.iter().map(|&d| d as u128).collect() }
    }

    /// A shorthand for I/O errors: `path` is shown before the message.
    pub(crate) fn io(path: &std::path::Path, message: impl Into<String>) -> KernelError {
        KernelError::Io { path: path.display().to_string(), message: message.into() }
    }
}

/// Formats a shape the way msl writes it in messages: `[2, 3]`.
pub fn shape_string(shape: &[usize]) -> String {
    let parts: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    format!("[{}]", parts.join(", "))
}

impl fmt::Display for KernelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            KernelError::ShapeMismatch { op, lhs, rhs } => {
                write!(f, "{op}: shapes {} and {} are incompatible", shape_string(lhs), shape_string(rhs))
            }
            KernelError::DataLength { shape, len } => {
                let need: usize = shape.iter().product();
                write!(f, "shape {} needs {need} elements but {len} were given", shape_string(shape))
            }
            KernelError::DivisionByZero => write!(f, "integer division by zero"),
            KernelError::IndexOutOfRange { index, axis, size } => {
                write!(f, "index {index} is out of range for axis {axis} of size {size}")
            }
            KernelError::AxisOutOfRange { op, axis, rank } => {
                write!(f, "{op}: axis {axis} is out of range for a tensor of rank {rank}")
            }
            KernelError::DTypeMismatch { op, expected, found } => write!(f, "{op}: expected {expected}, found {found}"),
            KernelError::Io { path, message } => write!(f, "{path}: {message}"),
            KernelError::FileMismatch { path, expected, found } => {
                write!(f, "{path}: expected {expected} but the file holds {found}")
            }
            KernelError::SizeOverflow { dims } => {
                let parts: Vec<String> = dims.iter().map(|d| d.to_string()).collect();
                let shape = format!("[{}]", parts.join(", "));
                let max = crate::tensor::MAX_ELEMENTS;
                // Zero dims are left out of the count: NumPy refuses such shapes as well, and
                // they would make strides and sub-products overflow in every kernel.
                let count = dims.iter().filter(|&&d| d != 0).try_fold(1u128, |a, &d| a.checked_mul(d));
                let count = count.map_or_else(|| "more than 2^128".to_string(), |c| c.to_string());
                if dims.contains(&0) {
                    write!(
                        f,
                        "size overflow: shape {shape} is too large: its nonzero dimensions multiply to {count} elements (at most {max} are supported)"
                    )
                } else {
                    write!(f, "size overflow: shape {shape} has {count} elements (at most {max} are supported)")
                }
            }
            KernelError::CastOutOfRange { value, nan, to, index } => {
                let what = match index {
                    Some(i) => format!("element {i} ({value})"),
                    None => value.clone(),
                };
                let why = if *nan {
                    "it is not a number".to_string()
                } else {
                    format!("it is outside the range of {to} ({} to {})", i32::MIN, i32::MAX)
                };
                write!(f, "cannot convert {what} to {to}: {why}")
            }
            KernelError::Invalid(message) | KernelError::OutOfRange(message) => write!(f, "{message}"),
        }
    }
}

impl std::error::Error for KernelError {}
