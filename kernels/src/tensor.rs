//! The host tensor: a shape and shared, immutable, contiguous row-major storage (or, for a
//! tensor an accelerator computed, its elements there until the host reads them).

use std::fmt;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use crate::cpu::map_slice;
use crate::device::{Device, DeviceTensor, Resident};
use crate::error::KernelError;

/// The element types msl tensors can hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F64,
    I32,
    Bool,
    /// Storage only: 2 bytes an element, computed in `f32` (bfloat16: f32's exponent, 8 bits
    /// of mantissa).
    Bf16,
    /// Storage only: 2 bytes an element, computed in `f32` (IEEE half precision).
    F16,
}

impl DType {
    /// The spelling msl uses in source code and messages.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::I32 => "i32",
            DType::Bool => "bool",
            DType::Bf16 => "bf16",
            DType::F16 => "f16",
        }
    }

    /// True for `f32` and `f64`, and for the storage-only `bf16` and `f16`.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F64 | DType::Bf16 | DType::F16)
    }

    /// True for the storage-only types `bf16` and `f16`, which kernels compute in `f32`.
    pub fn is_half(self) -> bool {
        matches!(self, DType::Bf16 | DType::F16)
    }

    /// The size of one element in bytes, as stored in files.
    pub fn size_in_bytes(self) -> usize {
        match self {
            DType::F32 | DType::I32 => 4,
            DType::F64 => 8,
            DType::Bool => 1,
            DType::Bf16 | DType::F16 => 2,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A run of elements in a shared, immutable buffer: the whole buffer, or a view of part of it
/// (a field of a model held as one flat buffer). Cloning only bumps a reference count; it
/// dereferences to the elements it covers.
#[derive(Clone, Debug)]
pub struct Shared<T> {
    buf: Arc<Vec<T>>,
    start: usize,
    len: usize,
}

impl<T> Shared<T> {
    /// The elements as a slice.
    pub fn as_slice(&self) -> &[T] {
        &self.buf[self.start..self.start + self.len]
    }

    /// The buffer, when this covers all of it and nothing else refers to it.
    pub fn into_vec(self) -> Result<Vec<T>, Shared<T>> {
        if self.start != 0 || self.len != self.buf.len() {
            return Err(self);
        }
        let Shared { buf, start, len } = self;
        Arc::try_unwrap(buf).map_err(|buf| Shared { buf, start, len })
    }

    /// The view of `len` elements from `start` (relative to this view), sharing the buffer.
    pub fn view(&self, start: usize, len: usize) -> Option<Shared<T>> {
        (start.checked_add(len)? <= self.len).then(|| Shared { buf: self.buf.clone(), start: self.start + start, len })
    }

    /// The elements for writing in place, when nothing else refers to the buffer.
    pub fn as_mut_slice(&mut self) -> Option<&mut [T]> {
        let (start, len) = (self.start, self.len);
        Arc::get_mut(&mut self.buf).map(|v| &mut v[start..start + len])
    }

    /// Whether `next` starts in the same buffer right where this view ends.
    pub fn is_followed_by(&self, next: &Shared<T>) -> bool {
        Arc::ptr_eq(&self.buf, &next.buf) && self.start + self.len == next.start
    }

    /// This view extended by `more` elements of the same buffer (see [`Shared::is_followed_by`]).
    pub fn extend(&self, more: usize) -> Option<Shared<T>> {
        let len = self.len.checked_add(more)?;
        (self.start + len <= self.buf.len()).then(|| Shared { buf: self.buf.clone(), start: self.start, len })
    }
}

impl<T> From<Vec<T>> for Shared<T> {
    fn from(v: Vec<T>) -> Shared<T> {
        let len = v.len();
        Shared { buf: Arc::new(v), start: 0, len }
    }
}

impl<T> std::ops::Deref for Shared<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        self.as_slice()
    }
}

impl<T: PartialEq> PartialEq for Shared<T> {
    fn eq(&self, other: &Shared<T>) -> bool {
        self.as_slice() == other.as_slice()
    }
}

/// Shared, immutable host storage. Cloning only bumps a reference count.
#[derive(Clone, Debug, PartialEq)]
pub enum Storage {
    F32(Shared<f32>),
    F64(Shared<f64>),
    I32(Shared<i32>),
    Bool(Shared<bool>),
    Bf16(Shared<half::bf16>),
    F16(Shared<half::f16>),
}

/// Applies a generic expression to storage of any element type: `each_storage!(s, v => expr)`
/// binds `v` to the [`Shared`] buffer of whichever type `s` holds.
macro_rules! each_storage {
    ($s:expr, $v:ident => $body:expr) => {
        match $s {
            $crate::tensor::Storage::F32($v) => $body,
            $crate::tensor::Storage::F64($v) => $body,
            $crate::tensor::Storage::I32($v) => $body,
            $crate::tensor::Storage::Bool($v) => $body,
            $crate::tensor::Storage::Bf16($v) => $body,
            $crate::tensor::Storage::F16($v) => $body,
        }
    };
}
pub(crate) use each_storage;

impl Storage {
    /// The element type of this storage.
    pub fn dtype(&self) -> DType {
        match self {
            Storage::F32(_) => DType::F32,
            Storage::F64(_) => DType::F64,
            Storage::I32(_) => DType::I32,
            Storage::Bool(_) => DType::Bool,
            Storage::Bf16(_) => DType::Bf16,
            Storage::F16(_) => DType::F16,
        }
    }

    /// The number of elements.
    pub fn len(&self) -> usize {
        each_storage!(self, v => v.len())
    }

    /// True when the storage holds no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The view of `len` elements from `start`, sharing the buffer.
    pub fn view(&self, start: usize, len: usize) -> Option<Storage> {
        Some(match self {
            Storage::F32(v) => Storage::F32(v.view(start, len)?),
            Storage::F64(v) => Storage::F64(v.view(start, len)?),
            Storage::I32(v) => Storage::I32(v.view(start, len)?),
            Storage::Bool(v) => Storage::Bool(v.view(start, len)?),
            Storage::Bf16(v) => Storage::Bf16(v.view(start, len)?),
            Storage::F16(v) => Storage::F16(v.view(start, len)?),
        })
    }

    /// Overwrites these elements with `src`'s, in place: both of one type and length, and
    /// nothing else referring to this buffer (a device's caller-provided output).
    pub fn copy_from(&mut self, src: &Storage) -> Result<(), KernelError> {
        let (have, len) = (src.dtype(), src.len());
        if have != self.dtype() || len != self.len() {
            return Err(KernelError::Invalid(format!(
                "an output of {len} {} elements was written into a buffer of {} {}",
                have.name(),
                self.len(),
                self.dtype().name()
            )));
        }
        let shared = || KernelError::Invalid("an output buffer that something else still refers to".into());
        macro_rules! copy {
            ($($v:ident),*) => {
                match (self, src) {
                    $((Storage::$v(d), Storage::$v(s)) => d.as_mut_slice().ok_or_else(shared)?.copy_from_slice(s),)*
                    _ => unreachable!("the element types were compared above"),
                }
            };
        }
        copy!(F32, F64, I32, Bool, Bf16, F16);
        Ok(())
    }

    /// Whether nothing else refers to the buffer (so that it may be written in place).
    pub fn is_unshared(&mut self) -> bool {
        each_storage!(self, v => v.as_mut_slice().is_some())
    }

    /// The address of the first element (identifies a buffer and a position in it).
    pub fn addr(&self) -> usize {
        each_storage!(self, v => v.as_ptr() as usize)
    }

    /// `self` and `next` as one view, when `next` starts in the same buffer right where `self`
    /// ends and both hold the same element type.
    pub fn join(&self, next: &Storage) -> Option<Storage> {
        Some(match (self, next) {
            (Storage::F32(a), Storage::F32(b)) if a.is_followed_by(b) => Storage::F32(a.extend(b.len())?),
            (Storage::F64(a), Storage::F64(b)) if a.is_followed_by(b) => Storage::F64(a.extend(b.len())?),
            (Storage::I32(a), Storage::I32(b)) if a.is_followed_by(b) => Storage::I32(a.extend(b.len())?),
            (Storage::Bool(a), Storage::Bool(b)) if a.is_followed_by(b) => Storage::Bool(a.extend(b.len())?),
            (Storage::Bf16(a), Storage::Bf16(b)) if a.is_followed_by(b) => Storage::Bf16(a.extend(b.len())?),
            (Storage::F16(a), Storage::F16(b)) if a.is_followed_by(b) => Storage::F16(a.extend(b.len())?),
            _ => return None,
        })
    }

    /// Storage holding `parts` one after another in one new buffer (all of one element type,
    /// which `dtype` names; `None` when a part holds another).
    pub fn concat(dtype: DType, parts: &[&Storage]) -> Option<Storage> {
        fn cat<T: Element>(parts: &[&Storage]) -> Option<Storage> {
            let n = parts.iter().map(|p| p.len()).sum();
            let mut out = Vec::with_capacity(n);
            for p in parts {
                out.extend_from_slice(T::slice(p)?);
            }
            Some(T::into_storage(out))
        }
        match dtype {
            DType::F32 => cat::<f32>(parts),
            DType::F64 => cat::<f64>(parts),
            DType::I32 => cat::<i32>(parts),
            DType::Bool => cat::<bool>(parts),
            DType::Bf16 => cat::<half::bf16>(parts),
            DType::F16 => cat::<half::f16>(parts),
        }
    }
}

/// A Rust type that can be a tensor element. Generic kernels are written once over this trait.
pub trait Element: Copy + Send + Sync + PartialEq + PartialOrd + fmt::Debug + Default + 'static {
    /// The dtype of tensors holding this element type.
    const DTYPE: DType;
    /// The elements of `s`, when `s` holds this type.
    fn slice(s: &Storage) -> Option<&[Self]>;
    /// Wraps a vector into storage.
    fn into_storage(v: Vec<Self>) -> Storage;
    /// The value as an `f64` (bool gives 1 or 0).
    fn to_f64(self) -> f64;
    /// The value from an `f64`: integers truncate toward zero (saturating), bool is `v != 0`.
    fn from_f64(v: f64) -> Self;
    /// The additive identity.
    fn zero() -> Self;
    /// The multiplicative identity.
    fn one() -> Self;
}

macro_rules! impl_element {
    ($t:ty, $variant:ident, $zero:expr, $one:expr, $to:expr, $from:expr) => {
        impl Element for $t {
            const DTYPE: DType = DType::$variant;
            fn slice(s: &Storage) -> Option<&[Self]> {
                match s {
                    Storage::$variant(v) => Some(v.as_slice()),
                    _ => None,
                }
            }
            fn into_storage(v: Vec<Self>) -> Storage {
                Storage::$variant(Shared::from(v))
            }
            fn to_f64(self) -> f64 {
                let f: fn($t) -> f64 = $to;
                f(self)
            }
            fn from_f64(v: f64) -> Self {
                let f: fn(f64) -> $t = $from;
                f(v)
            }
            fn zero() -> Self {
                $zero
            }
            fn one() -> Self {
                $one
            }
        }
    };
}

impl_element!(f32, F32, 0.0, 1.0, |x| x as f64, |v| v as f32);
impl_element!(f64, F64, 0.0, 1.0, |x| x, |v| v);
impl_element!(i32, I32, 0, 1, |x| x as f64, |v| v as i32);
impl_element!(bool, Bool, false, true, |x| if x { 1.0 } else { 0.0 }, |v| v != 0.0);
impl_element!(half::bf16, Bf16, half::bf16::ZERO, half::bf16::ONE, |x| x.to_f64(), half::bf16::from_f64);
impl_element!(half::f16, F16, half::f16::ZERO, half::f16::ONE, |x| x.to_f64(), half::f16::from_f64);

/// A host tensor: always contiguous and row-major. `Clone` is cheap (the storage is shared).
///
/// A tensor an accelerator computed may still live there ([`Tensor::resident`]): its elements
/// are brought to the host the first time something reads them, once, and a kernel the
/// accelerator runs reads them where they are ([`Tensor::resident_on`]). So a program whose
/// kernels all run on a device moves data only where the host reads it (`print`, files), and
/// everything that reads a tensor on the host sees the same elements either way.
#[derive(Clone)]
pub struct Tensor {
    shape: Vec<usize>,
    data: Data,
}

/// Where a tensor's elements are.
#[derive(Clone)]
enum Data {
    Host(Storage),
    Resident(Arc<Resident>),
}

impl PartialEq for Tensor {
    fn eq(&self, other: &Tensor) -> bool {
        self.shape == other.shape && self.storage() == other.storage()
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tensor").field("shape", &self.shape).field("storage", self.storage()).finish()
    }
}

impl Tensor {
    /// Builds a tensor from a shape and storage whose length must be the product of the shape.
    pub fn new(shape: Vec<usize>, storage: Storage) -> Result<Tensor, KernelError> {
        let need = checked_numel(&shape)?;
        if need != storage.len() {
            return Err(KernelError::DataLength { shape, len: storage.len() });
        }
        Ok(Tensor { shape, data: Data::Host(storage) })
    }

    /// Builds a tensor from a typed vector, checking its length against the shape.
    pub fn from_vec<T: Element>(shape: Vec<usize>, data: Vec<T>) -> Result<Tensor, KernelError> {
        Tensor::new(shape, T::into_storage(data))
    }

    /// Builds a tensor whose shape the caller has already checked with [`checked_numel`]
    /// (directly, or because it is made of the dims of valid tensors) and whose data has that
    /// length.
    pub(crate) fn from_parts<T: Element>(shape: Vec<usize>, data: Vec<T>) -> Tensor {
        debug_assert_eq!(checked_numel(&shape).ok(), Some(data.len()));
        Tensor { shape, data: Data::Host(T::into_storage(data)) }
    }

    pub fn from_f32(shape: Vec<usize>, data: Vec<f32>) -> Result<Tensor, KernelError> {
        Tensor::from_vec(shape, data)
    }
    pub fn from_f64(shape: Vec<usize>, data: Vec<f64>) -> Result<Tensor, KernelError> {
        Tensor::from_vec(shape, data)
    }
    pub fn from_i32(shape: Vec<usize>, data: Vec<i32>) -> Result<Tensor, KernelError> {
        Tensor::from_vec(shape, data)
    }
    pub fn from_bool(shape: Vec<usize>, data: Vec<bool>) -> Result<Tensor, KernelError> {
        Tensor::from_vec(shape, data)
    }

    pub fn scalar_f32(v: f32) -> Tensor {
        Tensor::from_parts(vec![], vec![v])
    }
    pub fn scalar_f64(v: f64) -> Tensor {
        Tensor::from_parts(vec![], vec![v])
    }
    pub fn scalar_i32(v: i32) -> Tensor {
        Tensor::from_parts(vec![], vec![v])
    }
    pub fn scalar_bool(v: bool) -> Tensor {
        Tensor::from_parts(vec![], vec![v])
    }

    pub fn shape(&self) -> &[usize] {
        &self.shape
    }
    pub fn dtype(&self) -> DType {
        match &self.data {
            Data::Host(s) => s.dtype(),
            Data::Resident(r) => r.dtype(),
        }
    }
    /// The number of elements.
    pub fn len(&self) -> usize {
        match &self.data {
            Data::Host(s) => s.len(),
            Data::Resident(r) => r.len(),
        }
    }
    /// True when the tensor has no element (some dimension is 0).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The bytes its elements take (as stored in files).
    pub fn nbytes(&self) -> usize {
        self.len() * self.dtype().size_in_bytes()
    }
    pub fn rank(&self) -> usize {
        self.shape.len()
    }
    /// The elements on the host (brought from the device the first time, for a resident
    /// tensor).
    pub fn storage(&self) -> &Storage {
        match &self.data {
            Data::Host(s) => s,
            Data::Resident(r) => r.host(),
        }
    }

    /// The storage for writing in place (see [`Storage::copy_from`]). A resident tensor is
    /// brought to the host first and stays there.
    pub fn storage_mut(&mut self) -> &mut Storage {
        if let Data::Resident(_) = &self.data {
            // Taken out first, so that a tensor nothing else refers to keeps its buffer unshared.
            let empty = Data::Host(Storage::Bool(Shared::from(Vec::new())));
            if let Data::Resident(r) = std::mem::replace(&mut self.data, empty) {
                self.data = Data::Host(Resident::take_host(r, true));
            }
        }
        match &mut self.data {
            Data::Host(s) => s,
            Data::Resident(_) => unreachable!("brought to the host just above"),
        }
    }
    /// The shape and storage, giving up the tensor (a caller that owns the only reference to
    /// the storage may reuse its buffer).
    pub fn into_parts(self) -> (Vec<usize>, Storage) {
        let storage = match self.data {
            Data::Host(s) => s,
            Data::Resident(r) => Resident::take_host(r, false),
        };
        (self.shape, storage)
    }

    /// A tensor whose elements are the device tensor `on` (row-major) of `device`, brought to
    /// the host only when something reads them there. `moved` counts the bytes that takes.
    pub fn resident(
        device: Arc<dyn Device>,
        on: DeviceTensor,
        moved: Option<Arc<AtomicU64>>,
    ) -> Result<Tensor, KernelError> {
        let shape = on.shape().to_vec();
        checked_numel(&shape)?;
        let r = Resident::new(device, on, None, moved)?;
        Ok(Tensor { shape, data: Data::Resident(Arc::new(r)) })
    }

    /// This host tensor, with a copy of its elements on `device` (`on`, row-major) that
    /// kernels there read: reading it on the host costs nothing.
    pub fn mirrored(
        &self,
        device: Arc<dyn Device>,
        on: DeviceTensor,
        moved: Option<Arc<AtomicU64>>,
    ) -> Result<Tensor, KernelError> {
        if on.shape() != self.shape() || on.dtype() != self.dtype() {
            return Err(KernelError::Invalid(format!(
                "a copy of {:?} {} cannot be a copy of {:?} {}",
                on.shape(),
                on.dtype(),
                self.shape(),
                self.dtype()
            )));
        }
        let r = Resident::new(device, on, Some(self.storage().clone()), moved)?;
        Ok(Tensor { shape: self.shape.clone(), data: Data::Resident(Arc::new(r)) })
    }

    /// The tensor with its elements on the host only (a resident tensor's device copy is
    /// let go by this one).
    pub fn to_host(&self) -> Tensor {
        Tensor { shape: self.shape.clone(), data: Data::Host(self.storage().clone()) }
    }

    /// The elements as a tensor of `device`, when they live there (see [`Tensor::resident`]).
    pub fn resident_on(&self, device: &Arc<dyn Device>) -> Option<&DeviceTensor> {
        match &self.data {
            Data::Resident(r) => r.on(device),
            Data::Host(_) => None,
        }
    }

    /// Whether the elements are on the host (always, but for a resident tensor not read yet).
    pub fn on_host(&self) -> bool {
        match &self.data {
            Data::Host(_) => true,
            Data::Resident(r) => r.on_host(),
        }
    }

    /// The elements when the tensor holds `T`.
    pub fn data<T: Element>(&self) -> Option<&[T]> {
        T::slice(self.storage())
    }
    pub fn as_f32(&self) -> Option<&[f32]> {
        self.data()
    }
    pub fn as_f64(&self) -> Option<&[f64]> {
        self.data()
    }
    pub fn as_i32(&self) -> Option<&[i32]> {
        self.data()
    }
    pub fn as_bool(&self) -> Option<&[bool]> {
        self.data()
    }

    /// The same elements under another shape with the same number of elements (no copy).
    pub fn with_shape(&self, shape: Vec<usize>) -> Result<Tensor, KernelError> {
        match &self.data {
            Data::Host(s) => Tensor::new(shape, s.clone()),
            Data::Resident(r) => {
                if checked_numel(&shape)? != r.len() {
                    return Err(KernelError::DataLength { shape, len: r.len() });
                }
                let r = r.view(0, &shape)?;
                Ok(Tensor { shape, data: Data::Resident(Arc::new(r)) })
            }
        }
    }

    /// The `shape`d view of this tensor's elements from `start` on, sharing its buffer.
    pub fn view(&self, start: usize, shape: Vec<usize>) -> Result<Tensor, KernelError> {
        let n = checked_numel(&shape)?;
        let outside =
            || KernelError::Invalid(format!("a view of {n} elements from {start} of a tensor of {}", self.len()));
        match &self.data {
            Data::Host(s) => {
                let storage = s.view(start, n).ok_or_else(outside)?;
                Ok(Tensor { shape, data: Data::Host(storage) })
            }
            Data::Resident(r) => {
                if start.checked_add(n).is_none_or(|end| end > r.len()) {
                    return Err(outside());
                }
                let r = r.view(start, &shape)?;
                Ok(Tensor { shape, data: Data::Resident(Arc::new(r)) })
            }
        }
    }

    /// The elements of `self` then `next` as one rank-1 tensor without a copy, when `next`
    /// starts in the same buffer right where `self` ends.
    pub fn join(&self, next: &Tensor) -> Option<Tensor> {
        match (&self.data, &next.data) {
            (Data::Host(a), Data::Host(b)) => {
                let storage = a.join(b)?;
                Some(Tensor { shape: vec![storage.len()], data: Data::Host(storage) })
            }
            (Data::Resident(a), Data::Resident(b)) => {
                let r = a.join(b)?;
                Some(Tensor { shape: vec![r.len()], data: Data::Resident(Arc::new(r)) })
            }
            // Elements in two places are not one run of a buffer.
            (Data::Host(_), Data::Resident(_)) | (Data::Resident(_), Data::Host(_)) => None,
        }
    }

    /// The elements of `parts` one after another in one new rank-1 tensor (`None` when their
    /// element types differ or there are none).
    pub fn concat_flat(parts: &[&Tensor]) -> Option<Tensor> {
        let dtype = parts.first()?.dtype();
        // Tensors that live on one device are concatenated there.
        if let Some(t) = Resident::concat(parts.iter().map(|t| match &t.data {
            Data::Resident(r) => Some(&**r),
            Data::Host(_) => None,
        })) {
            return Some(t);
        }
        let storages: Vec<&Storage> = parts.iter().map(|t| t.storage()).collect();
        let storage = Storage::concat(dtype, &storages)?;
        Some(Tensor { shape: vec![storage.len()], data: Data::Host(storage) })
    }

    /// Every element as an `f64`, whatever the dtype (bool gives 1 or 0).
    pub fn to_f64_vec(&self) -> Vec<f64> {
        match self.storage() {
            Storage::F32(v) => v.iter().map(|&x| x as f64).collect(),
            Storage::F64(v) => v.to_vec(),
            Storage::I32(v) => v.iter().map(|&x| x as f64).collect(),
            Storage::Bool(v) => v.iter().map(|&x| if x { 1.0 } else { 0.0 }).collect(),
            Storage::Bf16(v) => v.iter().map(|x| x.to_f64()).collect(),
            Storage::F16(v) => v.iter().map(|x| x.to_f64()).collect(),
        }
    }

    /// The single element as an `f64` when the tensor holds exactly one.
    pub fn scalar_value_f64(&self) -> Option<f64> {
        if self.len() != 1 {
            return None;
        }
        Some(match self.storage() {
            Storage::F32(v) => v[0] as f64,
            Storage::F64(v) => v[0],
            Storage::I32(v) => v[0] as f64,
            Storage::Bool(v) => {
                if v[0] {
                    1.0
                } else {
                    0.0
                }
            }
            Storage::Bf16(v) => v[0].to_f64(),
            Storage::F16(v) => v[0].to_f64(),
        })
    }

    /// Converts the elements to another dtype, as `f32(x)`, `f64(x)` and `i32(x)` do. Floats to
    /// `i32` truncate toward zero like NumPy's `astype`, but a NaN, an infinity or a value
    /// outside the range of `i32` is an error (NumPy gives an unspecified integer there, which
    /// msl would print as if it were a result); bool converts to 1 or 0; numbers convert to
    /// bool as `x != 0`.
    pub fn try_cast(&self, to: DType) -> Result<Tensor, KernelError> {
        let bad = |value: String, nan: bool, i: usize| KernelError::CastOutOfRange {
            value,
            nan,
            to,
            index: (self.rank() > 0).then_some(i),
        };
        match (self.storage(), to) {
            (Storage::F32(v), DType::I32) => {
                if let Some(i) = v.iter().position(|&x| !f32_fits_i32(x)) {
                    return Err(bad(crate::format::format_f32(v[i]), v[i].is_nan(), i));
                }
            }
            (Storage::F64(v), DType::I32) => {
                if let Some(i) = v.iter().position(|&x| !f64_fits_i32(x)) {
                    return Err(bad(crate::format::format_f64(v[i]), v[i].is_nan(), i));
                }
            }
            _ => {}
        }
        Ok(self.cast(to))
    }

    /// Converts the elements to another dtype without checking: floats to `i32` saturate (NaN
    /// gives 0). For conversions that cannot lose a value (widening, bool to numbers, numbers
    /// to bool) and for kernels whose floats are known to be whole numbers in range; a
    /// conversion a program asks for goes through [`Tensor::try_cast`].
    pub fn cast(&self, to: DType) -> Tensor {
        if self.dtype() == to {
            return self.clone();
        }
        let shape = self.shape.clone();
        let storage = match (self.storage(), to) {
            (Storage::F32(v), DType::F64) => Storage::F64(Shared::from(map_slice(v, |x| x as f64))),
            (Storage::F32(v), DType::I32) => Storage::I32(Shared::from(map_slice(v, |x| x as i32))),
            (Storage::F32(v), DType::Bool) => Storage::Bool(Shared::from(map_slice(v, |x| x != 0.0))),
            (Storage::F64(v), DType::F32) => Storage::F32(Shared::from(map_slice(v, |x| x as f32))),
            (Storage::F64(v), DType::I32) => Storage::I32(Shared::from(map_slice(v, |x| x as i32))),
            (Storage::F64(v), DType::Bool) => Storage::Bool(Shared::from(map_slice(v, |x| x != 0.0))),
            (Storage::I32(v), DType::F32) => Storage::F32(Shared::from(map_slice(v, |x| x as f32))),
            (Storage::I32(v), DType::F64) => Storage::F64(Shared::from(map_slice(v, |x| x as f64))),
            (Storage::I32(v), DType::Bool) => Storage::Bool(Shared::from(map_slice(v, |x| x != 0))),
            (Storage::Bool(v), DType::F32) => Storage::F32(Shared::from(map_slice(v, |x| u8::from(x) as f32))),
            (Storage::Bool(v), DType::F64) => Storage::F64(Shared::from(map_slice(v, |x| u8::from(x) as f64))),
            (Storage::Bool(v), DType::I32) => Storage::I32(Shared::from(map_slice(v, i32::from))),
            // The storage-only types go through `f32`, rounding to nearest even on the way in.
            (Storage::Bf16(v), _) => return Tensor::from_parts(shape, map_slice(v, half::bf16::to_f32)).cast(to),
            (Storage::F16(v), _) => return Tensor::from_parts(shape, map_slice(v, half::f16::to_f32)).cast(to),
            (Storage::F64(v), DType::Bf16) => Storage::Bf16(Shared::from(map_slice(v, half::bf16::from_f64))),
            (Storage::F64(v), DType::F16) => Storage::F16(Shared::from(map_slice(v, half::f16::from_f64))),
            (Storage::F32(v), DType::Bf16) => Storage::Bf16(Shared::from(map_slice(v, half::bf16::from_f32))),
            (Storage::F32(v), DType::F16) => Storage::F16(Shared::from(map_slice(v, half::f16::from_f32))),
            (_, DType::Bf16 | DType::F16) => return self.cast(DType::F32).cast(to),
            (s, _) => s.clone(),
        };
        Tensor { shape, data: Data::Host(storage) }
    }

    /// `f` applied to this tensor, widened to `f32` when it is `bf16` or `f16`: storage-only
    /// types are computed in `f32`, and a float result goes back to this tensor's type.
    pub fn in_f32(&self, f: impl FnOnce(&Tensor) -> Result<Tensor, KernelError>) -> Result<Tensor, KernelError> {
        if !self.dtype().is_half() {
            return f(self);
        }
        let r = f(&self.cast(DType::F32))?;
        Ok(if r.dtype() == DType::F32 { r.cast(self.dtype()) } else { r })
    }
}

/// Whether an f32 truncates to an `i32` (false for NaN and the infinities). Every f32 from
/// -2^31 up to but excluding 2^31 does; both bounds are exact in f32.
pub fn f32_fits_i32(x: f32) -> bool {
    (-2147483648.0..2147483648.0).contains(&x)
}

/// Whether an f64 truncates to an `i32`: it lies strictly between -2^31 - 1 and 2^31, so that
/// truncation toward zero lands in range (-2147483648.5 becomes -2147483648).
pub fn f64_fits_i32(x: f64) -> bool {
    x > -2147483649.0 && x < 2147483648.0
}

/// The most elements a tensor may have: as many 8-byte elements as fit in the largest
/// allocation Rust permits (`isize::MAX` bytes). Sizes are checked against it, whatever the
/// element type, so that no element count, byte size or stride computed from a valid shape can
/// overflow.
pub const MAX_ELEMENTS: usize = isize::MAX as usize / 8;

/// The number of elements of a shape, or [`KernelError::SizeOverflow`] when the product of
/// its nonzero dimensions exceeds [`MAX_ELEMENTS`]. Zero dimensions are left out of that test
/// (as NumPy does): a shape such as `[0, 2^62]` holds no element, but the sub-products of its
/// dims (the strides, the output of `sum(x, axis: 0)`) would still be out of range. Every
/// tensor's shape passes this check, so every product of some of its dims fits in `usize`.
pub fn checked_numel(shape: &[usize]) -> Result<usize, KernelError> {
    let nonzero = shape.iter().filter(|&&d| d != 0).try_fold(1usize, |acc, &d| acc.checked_mul(d));
    match nonzero {
        Some(n) if n <= MAX_ELEMENTS => Ok(if shape.contains(&0) { 0 } else { n }),
        _ => Err(KernelError::size_overflow(shape)),
    }
}
