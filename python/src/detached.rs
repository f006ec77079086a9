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

/// `T`, dropped with the GIL released, and outside the calls in progress on
/// the thread that its drop would meet: a resource object's stack
/// ([`reentry::drop_outside_calls`]), a buffer, which frees its block into
/// a stack ([`reentry::drop_outside_frees`]).
pub(crate) struct DropDetached<T: Send + 'static> {
    /// Taken only by `drop`.
    value: ManuallyDrop<T>,
    /// The stack `value` is part of, or frees into; taken only by `drop`.
    stack: ManuallyDrop<Stack>,
}

enum Stack {
    PartOf(Covers),
    FreesInto(Covers),
}

impl<T: Send + 'static> DropDetached<T> {
    /// `value`, part of the stack over `covers`.
    pub(crate) fn of_stack(value: T, covers: Covers) -> Self {
        DropDetached { value: ManuallyDrop::new(value), stack: ManuallyDrop::new(Stack::PartOf(covers)) }
    }

    /// `value`, a buffer whose drop frees its block into the stack over
    /// `covers`.
    pub(crate) fn of_buffer(value: T, covers: Covers) -> Self {
        DropDetached { value: ManuallyDrop::new(value), stack: ManuallyDrop::new(Stack::FreesInto(covers)) }
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
        // SAFETY: the value and the stack are taken once, here, as `self`
        // is dropped, and never read again (no other code runs on `self`
        // after its `drop`).
        let (value, stack) =
            unsafe { (ManuallyDrop::take(&mut self.value), ManuallyDrop::take(&mut self.stack)) };
        let drop_it = move || match stack {
            Stack::PartOf(covers) => reentry::drop_outside_calls(&covers, value),
            Stack::FreesInto(covers) => reentry::drop_outside_frees(&covers, value),
        };
        // A `Py` the value holds is released when the GIL is taken back
        // (PyO3 defers it): after the rest of the value is gone. While the
        // interpreter is finalized `drop_it` is dropped unrun, and the value
        // with it: no thread waits for the GIL then.
        crate::gil::with_python(|py| crate::gil::detach(py, drop_it));
    }
}
