//! Device tensors and their views: a shape, strides and an offset into a buffer that only the
//! device that made it understands. Views (permutations, the swap of the last two axes,
//! broadcasts, narrowing, size-1 axes) are made here in O(1), the same way for every device;
//! a device reads a view through its strides or makes it contiguous first.

use std::any::Any;
use std::sync::Arc;

use crate::error::KernelError;
use crate::tensor::{DType, Element, Tensor};

/// A tensor that lives on some device: its shape, strides (in elements; 0 on a broadcast
/// axis), offset, dtype and an opaque buffer of `base_len` elements.
#[derive(Clone)]
pub struct DeviceTensor {
    shape: Vec<usize>,
    strides: Vec<usize>,
    offset: usize,
    base_len: usize,
    dtype: DType,
    buffer: Arc<dyn Any + Send + Sync>,
}

impl std::fmt::Debug for DeviceTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceTensor")
            .field("shape", &self.shape)
            .field("strides", &self.strides)
            .field("offset", &self.offset)
            .field("dtype", &self.dtype)
            .finish_non_exhaustive()
    }
}

/// The row-major strides of `shape`.
pub fn row_major(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![0; shape.len()];
    let mut s = 1;
    for (st, &d) in strides.iter_mut().zip(shape).rev() {
        *st = s;
        s *= d;
    }
    strides
}

fn bad(op: &str, why: String) -> KernelError {
    KernelError::Invalid(format!("view {op}: {why}"))
}

impl DeviceTensor {
    /// Wraps a device's own buffer of `shape`'s element count, row-major. Devices call this;
    /// users get device tensors from them.
    pub fn new(shape: Vec<usize>, dtype: DType, buffer: Arc<dyn Any + Send + Sync>) -> DeviceTensor {
        let strides = row_major(&shape);
        let base_len = shape.iter().product();
        DeviceTensor { shape, strides, offset: 0, base_len, dtype, buffer }
    }
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }
    pub fn strides(&self) -> &[usize] {
        &self.strides
    }
    /// The position of the first element in the buffer.
    pub fn offset(&self) -> usize {
        self.offset
    }
    /// How many elements the buffer holds (at least the view's reach).
    pub fn base_len(&self) -> usize {
        self.base_len
    }
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The bytes of the elements the view selects.
    pub fn nbytes(&self) -> usize {
        self.len() * self.dtype.size_in_bytes()
    }
    pub fn rank(&self) -> usize {
        self.shape.len()
    }
    /// Whether the elements lie in row-major order one after another (from `offset`); size-1
    /// axes may have any stride.
    pub fn is_row_major(&self) -> bool {
        let mut s = 1;
        for (&d, &st) in self.shape.iter().zip(&self.strides).rev() {
            if d != 1 && st != s {
                return false;
            }
            s *= d;
        }
        true
    }
    /// Whether the view is exactly its whole buffer in row-major order, so that a kernel may
    /// read the buffer as it is.
    pub fn is_contiguous(&self) -> bool {
        self.offset == 0 && self.len() == self.base_len && self.is_row_major()
    }
    /// The buffer as the device's own type `B`, or `None` when another device made it.
    pub fn buffer<B: Any>(&self) -> Option<&B> {
        self.buffer.downcast_ref::<B>()
    }
    /// The buffer for writing, when nothing else refers to it.
    pub fn buffer_mut<B: Any>(&mut self) -> Option<&mut B> {
        Arc::get_mut(&mut self.buffer)?.downcast_mut::<B>()
    }

    /// The buffer as the device's own type `B`, shared, or `None` when another device made it.
    pub fn into_buffer<B: Any + Send + Sync>(self) -> Option<Arc<B>> {
        self.buffer.downcast::<B>().ok()
    }

    fn view(&self, shape: Vec<usize>, strides: Vec<usize>, offset: usize) -> DeviceTensor {
        DeviceTensor { shape, strides, offset, base_len: self.base_len, dtype: self.dtype, buffer: self.buffer.clone() }
    }

    /// The same elements under another shape of as many elements; a row-major view only
    /// (anything else must be made contiguous first).
    pub fn with_shape(&self, shape: Vec<usize>) -> DeviceTensor {
        let strides = row_major(&shape);
        self.view(shape, strides, self.offset)
    }
    /// A reshape: a view when the elements are row-major, `None` when they must be copied.
    pub fn reshaped(&self, shape: &[usize]) -> Option<DeviceTensor> {
        (shape.iter().product::<usize>() == self.len() && self.is_row_major()).then(|| self.with_shape(shape.to_vec()))
    }
    /// Axis `i` of the result is axis `perm[i]` of this tensor.
    pub fn permuted(&self, perm: &[usize]) -> Result<DeviceTensor, KernelError> {
        let mut seen = vec![false; self.rank()];
        if perm.len() != self.rank() || perm.iter().any(|&p| p >= seen.len() || std::mem::replace(&mut seen[p], true)) {
            return Err(bad("permute", format!("{perm:?} is not a permutation of {} axes", self.rank())));
        }
        let shape = perm.iter().map(|&p| self.shape[p]).collect();
        let strides = perm.iter().map(|&p| self.strides[p]).collect();
        Ok(self.view(shape, strides, self.offset))
    }
    /// The last two axes swapped (each matrix of a stack transposed).
    pub fn transposed_last(&self) -> Result<DeviceTensor, KernelError> {
        let n = self.rank();
        if n < 2 {
            return Err(bad("transpose", format!("a tensor of rank {n} has no two last axes")));
        }
        let mut perm: Vec<usize> = (0..n).collect();
        perm.swap(n - 2, n - 1);
        self.permuted(&perm)
    }
    /// NumPy broadcasting to `shape`: new leading axes and size-1 axes read one element.
    pub fn broadcast_to(&self, shape: &[usize]) -> Result<DeviceTensor, KernelError> {
        let extra = shape.len().checked_sub(self.rank());
        let fail = || bad("broadcast", format!("{:?} does not broadcast to {shape:?}", self.shape));
        let extra = extra.ok_or_else(fail)?;
        let mut strides = vec![0; shape.len()];
        for (i, (&d, &st)) in self.shape.iter().zip(&self.strides).enumerate() {
            match (d, shape[extra + i]) {
                (a, b) if a == b => strides[extra + i] = st,
                (1, _) => {}
                _ => return Err(fail()),
            }
        }
        Ok(self.view(shape.to_vec(), strides, self.offset))
    }
    /// A new size-1 axis at `axis` (at most the rank).
    pub fn expanded(&self, axis: usize) -> Result<DeviceTensor, KernelError> {
        if axis > self.rank() {
            return Err(KernelError::AxisOutOfRange { op: "expand_dims", axis, rank: self.rank() });
        }
        let (mut shape, mut strides) = (self.shape.clone(), self.strides.clone());
        shape.insert(axis, 1);
        strides.insert(axis, 0);
        Ok(self.view(shape, strides, self.offset))
    }
    /// Without the size-1 axis `axis`, or without every size-1 axis.
    pub fn squeezed(&self, axis: Option<usize>) -> Result<DeviceTensor, KernelError> {
        let keep: Vec<usize> = match axis {
            Some(a) if self.shape.get(a) == Some(&1) => (0..self.rank()).filter(|&i| i != a).collect(),
            Some(a) => return Err(KernelError::AxisOutOfRange { op: "squeeze", axis: a, rank: self.rank() }),
            None => (0..self.rank()).filter(|&i| self.shape[i] != 1).collect(),
        };
        let shape = keep.iter().map(|&i| self.shape[i]).collect();
        let strides = keep.iter().map(|&i| self.strides[i]).collect();
        Ok(self.view(shape, strides, self.offset))
    }
    /// Positions `start..start + len` of `axis`.
    pub fn narrowed(&self, axis: usize, start: usize, len: usize) -> Result<DeviceTensor, KernelError> {
        let size =
            *self.shape.get(axis).ok_or(KernelError::AxisOutOfRange { op: "narrow", axis, rank: self.rank() })?;
        if start.checked_add(len).is_none_or(|end| end > size) {
            return Err(bad("narrow", format!("{start}..{} is outside 0..{size}", start.saturating_add(len))));
        }
        let mut shape = self.shape.clone();
        shape[axis] = len;
        let offset = if len == 0 { self.offset } else { self.offset + start * self.strides[axis] };
        Ok(self.view(shape, self.strides.clone(), offset))
    }

    /// The `shape`d, row-major view of this row-major tensor's elements from `start` on.
    pub fn flat_view(&self, start: usize, shape: &[usize]) -> Result<DeviceTensor, KernelError> {
        let n: usize = shape.iter().product();
        if !self.is_row_major() || start.checked_add(n).is_none_or(|end| end > self.len()) {
            return Err(bad("flat", format!("{n} elements from {start} of a tensor of {:?}", self.shape)));
        }
        let offset = if n == 0 { self.offset } else { self.offset + start };
        Ok(self.view(shape.to_vec(), row_major(shape), offset))
    }

    /// The elements of this tensor then `next`'s as one rank-1 view, when both are row-major
    /// runs of one buffer and `next` starts where this one ends.
    pub fn join(&self, next: &DeviceTensor) -> Option<DeviceTensor> {
        let follows = Arc::ptr_eq(&self.buffer, &next.buffer)
            && self.dtype == next.dtype
            && self.is_row_major()
            && next.is_row_major()
            && self.offset + self.len() == next.offset;
        follows.then(|| self.view(vec![self.len() + next.len()], vec![1], self.offset))
    }

    /// The view `like` describes (its shape, strides and offset counted in the elements of a
    /// row-major tensor of this one's length, as a view of the CPU device's copy is) of this
    /// tensor's buffer; `None` unless this tensor is row-major, of `like`'s element type, and
    /// holds every element `like` reads.
    pub fn restrided(&self, like: &DeviceTensor) -> Option<DeviceTensor> {
        let fits = self.is_row_major() && like.dtype == self.dtype && like.reach() <= self.len();
        fits.then(|| self.view(like.shape.clone(), like.strides.clone(), self.offset + like.offset))
    }

    /// The furthest buffer position the view reads, plus one (0 for an empty view).
    fn reach(&self) -> usize {
        if self.is_empty() {
            return 0;
        }
        self.offset + self.shape.iter().zip(&self.strides).map(|(&d, &s)| (d - 1) * s).sum::<usize>() + 1
    }
}

fn gather<T: Element>(src: &[T], v: &DeviceTensor) -> Vec<T> {
    let n = v.len();
    let mut out = Vec::with_capacity(n);
    if n == 0 {
        return out;
    }
    let Some(last) = v.rank().checked_sub(1) else {
        out.push(src[v.offset]);
        return out;
    };
    let (len, step) = (v.shape[last], v.strides[last]);
    let mut idx = vec![0; last];
    let mut base = v.offset;
    loop {
        if step == 1 {
            out.extend_from_slice(&src[base..base + len]);
        } else {
            out.extend((0..len).map(|j| src[base + j * step]));
        }
        let mut d = last;
        loop {
            if d == 0 {
                return out;
            }
            d -= 1;
            idx[d] += 1;
            base += v.strides[d];
            if idx[d] < v.shape[d] {
                break;
            }
            base -= v.strides[d] * v.shape[d];
            idx[d] = 0;
        }
    }
}

/// The elements a view `v` selects from a host buffer `base` (the view's buffer, downloaded
/// or the CPU's own), as a new contiguous tensor; shared storage when they already lie in order.
pub fn gather_host(base: &Tensor, v: &DeviceTensor) -> Result<Tensor, KernelError> {
    if base.dtype() != v.dtype() || v.reach() > base.len() {
        return Err(KernelError::Invalid(format!(
            "a view of {} {} elements reaching {} does not fit a buffer of {} {}",
            v.len(),
            v.dtype().name(),
            v.reach(),
            base.len(),
            base.dtype().name()
        )));
    }
    if v.is_row_major() {
        let storage = base.storage().view(v.offset, v.len()).ok_or_else(|| KernelError::Invalid("view".into()))?;
        return Tensor::new(v.shape.clone(), storage);
    }
    macro_rules! go {
        ($t:ty) => {
            Tensor::from_vec(v.shape.clone(), gather(base.data::<$t>().unwrap_or_default(), v))
        };
    }
    match base.dtype() {
        DType::F32 => go!(f32),
        DType::F64 => go!(f64),
        DType::I32 => go!(i32),
        DType::Bool => go!(bool),
        DType::Bf16 => go!(half::bf16),
        DType::F16 => go!(half::f16),
    }
}
