//! Tensors that stay on the device that computed them: a device tensor, and its elements on
//! the host once something there has read them (brought over once, then shared by every clone).

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

/// A device tensor and its elements on the host, once read.
pub struct Resident {
    /// Row-major (its elements one after another from its offset).
    on: DeviceTensor,
    device: Arc<dyn Device>,
    host: OnceLock<Storage>,
    /// Counts the bytes brought to the host.
    moved: Option<Arc<AtomicU64>>,
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
        Ok(Resident { on, device, host: host.map(OnceLock::from).unwrap_or_default(), moved })
    }

    pub(crate) fn dtype(&self) -> DType {
        self.on.dtype()
    }

    pub(crate) fn len(&self) -> usize {
        self.on.len()
    }

    /// The device tensor, when it belongs to `device`.
    pub(crate) fn on(&self, device: &Arc<dyn Device>) -> Option<&DeviceTensor> {
        let same = std::ptr::addr_eq(Arc::as_ptr(&self.device), Arc::as_ptr(device));
        same.then_some(&self.on)
    }

    pub(crate) fn on_host(&self) -> bool {
        self.host.get().is_some()
    }

    /// The elements on the host, brought from the device the first time.
    pub(crate) fn host(&self) -> &Storage {
        self.host.get_or_init(|| self.fetch())
    }

    fn fetch(&self) -> Storage {
        match self.device.download(&self.on) {
            Ok(t) => {
                if let Some(n) = &self.moved {
                    n.fetch_add((t.len() * t.dtype().size_in_bytes()) as u64, Ordering::Relaxed);
                }
                t.into_parts().1
            }
            Err(e) => std::panic::panic_any(DeviceLost(format!(
                "{}: a tensor could not be brought to the host: {e}",
                self.device.name()
            ))),
        }
    }

    /// The elements on the host, taken out when nothing else refers to them, else shared;
    /// with `own`, always in a buffer nothing else refers to (copied when need be), so that the
    /// caller may write them in place.
    pub(crate) fn take_host(r: Arc<Resident>, own: bool) -> Storage {
        let mut s = match Arc::try_unwrap(r) {
            Ok(r) => {
                // The clone is the only reference to the host copy once `r` is gone.
                let s = r.host().clone();
                drop(r);
                s
            }
            Err(r) => r.host().clone(),
        };
        if own && !s.is_unshared() {
            s = Storage::concat(s.dtype(), &[&s]).unwrap_or(s);
        }
        s
    }

    /// The elements of `self` then `next` as one rank-1 view, when they are one run of a
    /// buffer on one device.
    pub(crate) fn join(&self, next: &Resident) -> Option<Resident> {
        next.on(&self.device)?;
        let on = self.on.join(&next.on)?;
        let host = match (self.host.get(), next.host.get()) {
            (Some(a), Some(b)) => a.join(b),
            _ => None,
        };
        Resident::new(self.device.clone(), on, host, self.moved.clone()).ok()
    }

    /// The elements of `parts` one after another, concatenated on their device: `None` unless
    /// every part lives on one device that runs the concatenation (and it succeeds).
    pub(crate) fn concat<'a>(mut parts: impl Iterator<Item = Option<&'a Resident>>) -> Option<Tensor> {
        let first = parts.next()??;
        let mut flat = vec![first.on.flat_view(0, &[first.len()]).ok()?];
        for r in parts {
            let r = r?;
            r.on(&first.device)?;
            flat.push(r.on.flat_view(0, &[r.len()]).ok()?);
        }
        let refs: Vec<&DeviceTensor> = flat.iter().collect();
        let p = KernelParams::new().axis(0);
        if !first.device.runs(KernelId::Concat, &refs, &p) {
            return None;
        }
        let out = first.device.launch(KernelId::Concat, &refs, &p).ok()?;
        Tensor::resident(first.device.clone(), out, first.moved.clone()).ok()
    }

    /// The `shape`d view of the elements from `start` on (the caller checked that they are
    /// there), still on the device, and on the host too when they already are.
    pub(crate) fn view(&self, start: usize, shape: &[usize]) -> Result<Resident, KernelError> {
        let on = self.on.flat_view(start, shape)?;
        let n = on.len();
        let host = self.host.get().and_then(|s| s.view(start, n));
        Resident::new(self.device.clone(), on, host, self.moved.clone())
    }
}
