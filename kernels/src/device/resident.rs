//! Tensors that stay on the device that computed them: a view of a device buffer, and its
//! elements on the host once something there has read them. The buffer is brought over once,
//! whole, and every view of it (a model's fields, a reshape, a join of neighbours) reads that
//! one copy.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use super::{Device, DeviceTensor, KernelId, KernelParams};
use crate::error::KernelError;
use crate::tensor::{DType, Storage, Tensor};

/// The payload of the panic raised when a resident tensor's elements cannot be brought to the
/// host (the device failed). Reading a tensor cannot return an error, and a device that fails
/// a copy has lost its state; the command catches this payload and ends with its message and
/// exit status 2.
#[derive(Debug)]
pub struct DeviceLost(pub String);

/// A device tensor as a device made it, and its elements on the host once read.
struct Base {
    /// Row-major (its elements one after another from its offset).
    on: DeviceTensor,
    device: Arc<dyn Device>,
    host: OnceLock<Storage>,
    /// Counts the bytes brought to the host.
    moved: Option<Arc<AtomicU64>>,
}

impl Base {
    /// The elements on the host, brought from the device the first time.
    fn host(&self) -> &Storage {
        self.host.get_or_init(|| match self.device.download(&self.on) {
            Ok(t) => {
                if let Some(n) = &self.moved {
                    n.fetch_add(t.nbytes() as u64, Ordering::Relaxed);
                }
                t.into_parts().1
            }
            Err(e) => std::panic::panic_any(DeviceLost(format!(
                "{}: a tensor could not be brought to the host: {e}",
                self.device.name()
            ))),
        })
    }
}

/// A run of a resident buffer's elements: `len` of them from `start`, as the device tensor
/// `on`.
pub struct Resident {
    base: Arc<Base>,
    start: usize,
    /// Row-major: the elements `start..start + len` of the base.
    on: DeviceTensor,
    /// Those elements on the host, a view of the base's copy.
    host: OnceLock<Storage>,
}

impl Resident {
    pub(crate) fn new(
        device: Arc<dyn Device>,
        on: DeviceTensor,
        host: Option<Storage>,
        moved: Option<Arc<AtomicU64>>,
    ) -> Result<Resident, KernelError> {
        if !on.is_row_major() {
            return Err(KernelError::Invalid(format!(
                "a resident tensor must be row-major, not strides {:?} for shape {:?}",
                on.strides(),
                on.shape()
            )));
        }
        let host = host.map(OnceLock::from).unwrap_or_default();
        let base = Arc::new(Base { on: on.clone(), device, host: host.clone(), moved });
        Ok(Resident { base, start: 0, on, host })
    }

    pub(crate) fn dtype(&self) -> DType {
        self.on.dtype()
    }

    pub(crate) fn len(&self) -> usize {
        self.on.len()
    }

    /// The device tensor, when it belongs to `device`.
    pub(crate) fn on(&self, device: &Arc<dyn Device>) -> Option<&DeviceTensor> {
        let same = std::ptr::addr_eq(Arc::as_ptr(&self.base.device), Arc::as_ptr(device));
        same.then_some(&self.on)
    }

    pub(crate) fn on_host(&self) -> bool {
        self.host.get().is_some()
    }

    /// The elements on the host, brought from the device (the whole base) the first time.
    pub(crate) fn host(&self) -> &Storage {
        self.host.get_or_init(|| {
            let all = self.base.host();
            all.view(self.start, self.len()).unwrap_or_else(|| {
                std::panic::panic_any(DeviceLost(format!(
                    "{}: a view of {} elements from {} of a buffer of {}",
                    self.base.device.name(),
                    self.len(),
                    self.start,
                    all.len()
                )))
            })
        })
    }

    /// The elements on the host, taken out when nothing else refers to them, else shared;
    /// with `own`, always in a buffer nothing else refers to (copied when need be), so that the
    /// caller may write them in place.
    pub(crate) fn take_host(r: Arc<Resident>, own: bool) -> Storage {
        let mut s = r.host().clone();
        drop(r);
        if own && !s.is_unshared() {
            s = Storage::concat(s.dtype(), &[&s]).unwrap_or(s);
        }
        s
    }

    /// A run of the same base: `on` its elements from `start` (relative to the base).
    fn part(&self, start: usize, on: DeviceTensor) -> Resident {
        let host = OnceLock::new();
        if let Some(all) = self.base.host.get().and_then(|h| h.view(start, on.len())) {
            let _ = host.set(all);
        }
        Resident { base: self.base.clone(), start, on, host }
    }

    /// The elements of `self` then `next` as one rank-1 view, when they are one run of a
    /// buffer on one device.
    pub(crate) fn join(&self, next: &Resident) -> Option<Resident> {
        let one = Arc::ptr_eq(&self.base, &next.base) && self.start + self.len() == next.start;
        let on = one.then(|| self.on.join(&next.on))??;
        Some(self.part(self.start, on))
    }

    /// The elements of `parts` one after another, concatenated on their device: `None` unless
    /// every part lives on one device that runs the concatenation (and it succeeds).
    pub(crate) fn concat<'a>(mut parts: impl Iterator<Item = Option<&'a Resident>>) -> Option<Tensor> {
        let first = parts.next()??;
        let device = &first.base.device;
        let mut flat = vec![first.on.flat_view(0, &[first.len()]).ok()?];
        for r in parts {
            let r = r?;
            r.on(device)?;
            flat.push(r.on.flat_view(0, &[r.len()]).ok()?);
        }
        let refs: Vec<&DeviceTensor> = flat.iter().collect();
        let p = KernelParams::new().axis(0);
        if !device.runs(KernelId::Concat, &refs, &p) {
            return None;
        }
        let out = device.launch(KernelId::Concat, &refs, &p).ok()?;
        Tensor::resident(device.clone(), out, first.base.moved.clone()).ok()
    }

    /// The `shape`d view of the elements from `start` on (the caller checked that they are
    /// there), still on the device, and on the host too when they already are.
    pub(crate) fn view(&self, start: usize, shape: &[usize]) -> Result<Resident, KernelError> {
        let on = self.on.flat_view(start, shape)?;
        Ok(self.part(self.start + start, on))
    }
}
