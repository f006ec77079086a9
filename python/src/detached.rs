//! Values dropped with the GIL released.
//!
//! Dropping a stack or a buffer can free memory, and a free can wait: on a
//! lock that a thread holds while it calls Python (a pool over a
//! `CallbackMemoryResource` holds its lock while the callback runs), or on
//! the device. Python drops an object with the GIL held; a drop that waited
//! on such a lock with it would freeze the interpreter. RMM's
//! `DeviceBuffer.__dealloc__` frees with the GIL released for the same
//! reason.

use crate::reentry::{self, Covers};
use std::mem::ManuallyDrop;
use std::ops::Deref;

/// `T`, dropped with the GIL released; for a resource object's stack, also
/// outside the calls in progress on the thread that meet it
/// ([`reentry::drop_outside_calls`]).
pub(crate) struct DropDetached<T: Send + 'static> {
    /// Taken only by `drop`.
    value: ManuallyDrop<T>,
    /// The stack `value` is part of, if it is a resource object's.
    stack: Option<Covers>,
}

impl<T: Send + 'static> DropDetached<T> {
    pub(crate) fn new(value: T) -> Self {
        DropDetached { value: ManuallyDrop::new(value), stack: None }
    }

    /// `value`, part of the stack over `covers`.
    pub(crate) fn of_stack(value: T, covers: Covers) -> Self {
        DropDetached { value: ManuallyDrop::new(value), stack: Some(covers) }
    }
}

impl<T: Send + 'static> Deref for DropDetached<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.value
    }
}

impl<T: Send + 'static> Drop for DropDetached<T> {
    fn drop(&mut self) {
        // SAFETY: the value is taken once, here, as `self` is dropped, and
        // `self.value` is never read again (no other code runs on `self`
        // after its `drop`).
        let value = unsafe { ManuallyDrop::take(&mut self.value) };
        let stack = self.stack.take();
        let drop_it = move || match stack {
            Some(covers) => reentry::drop_outside_calls(&covers, value),
            None => crate::callback::drop_saying_what_raised(value),
        };
        // A `Py` the value holds is released when the GIL is taken back
        // (PyO3 defers it): after the rest of the value is gone. While the
        // interpreter is finalized `drop_it` is dropped unrun, and the value
        // with it: no thread waits for the GIL then.
        crate::gil::with_python(|py| crate::gil::detach(py, drop_it));
    }
}
