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
    /// Any other invalid argument, described in words.
    Invalid(String),
}

impl KernelError {
    /// A shorthand for the dtype errors of operations that take one kind of element.
    pub(crate) fn dtype(op: &'static str, expected: &str, found: DType) -> KernelError {
        KernelError::DTypeMismatch { op, expected: expected.to_string(), found: found.to_string() }
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
            KernelError::Invalid(message) => write!(f, "{message}"),
        }
    }
}

impl std::error::Error for KernelError {}
