//! Values dropped with the GIL released.
//!
//! Dropping a stack or a buffer can free memory, and a free can wait: on a
//! lock that a thread holds while it calls Python (a pool over a
//! `CallbackMemoryResource` holds its lock while the callback runs), or on
//! the device. Python drops an object with the GIL held; a drop that waited
//! on such a lock with it would freeze the interpreter. RMM's
//! `DeviceBuffer.__dealloc__` frees with the GIL released for the same
//! reason.

use pyo3::prelude::*;
use std::mem::ManuallyDrop;
use std::ops::Deref;

/// `T`, dropped with the GIL released.
pub(crate) struct DropDetached<T: Send>(ManuallyDrop<T>);

impl<T: Send> DropDetached<T> {
    pub(crate) fn new(value: T) -> Self {
        DropDetached(ManuallyDrop::new(value))
    }
}

impl<T: Send> Deref for DropDetached<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T: Send> Drop for DropDetached<T> {
    fn drop(&mut self) {
        // SAFETY: the value is taken once, here, as `self` is dropped, and
        // `self.0` is never read again (no other code runs on `self` after
        // its `drop`).
        let value = unsafe { ManuallyDrop::take(&mut self.0) };
        // A `Py` the value holds is released when the GIL is taken back
        // (PyO3 defers it): after the rest of the value is gone.
        Python::attach(|py| py.detach(move || drop(value)));
    }
}
