//! A value taken out of a table for a call that may fail or panic (a
//! block for its free): put back when dropped, unless the call succeeded
//! or panicked. So a free that fails leaves the block in its table,
//! freeable again; one that panics leaves it to the stack, as the core's
//! layers leave a block whose free panicked to the layer below (it may
//! have been freed before the panic, and a second free would free it
//! twice).

/// `value`, out of its table until [`kept_out`](Self::kept_out); `put`
/// puts it back when this is dropped before that, unless by a panic.
pub(crate) struct PutBack<T, F: FnOnce(T)> {
    /// `Some` until dropped or kept out.
    taken: Option<(T, F)>,
}

impl<T, F: FnOnce(T)> PutBack<T, F> {
    /// `value`, just taken out of the table that `put` puts it back in.
    pub(crate) fn new(value: T, put: F) -> Self {
        PutBack { taken: Some((value, put)) }
    }

    /// The value taken.
    pub(crate) fn value(&self) -> &T {
        match &self.taken {
            Some((value, _)) => value,
            // Only `kept_out` and `drop` empty it, and both consume `self`.
            None => unreachable!("PutBack emptied while still in use"),
        }
    }

    /// The call succeeded: the value stays out of the table.
    pub(crate) fn kept_out(mut self) {
        self.taken = None;
    }
}

impl<T, F: FnOnce(T)> Drop for PutBack<T, F> {
    fn drop(&mut self) {
        match self.taken.take() {
            Some((value, put)) if !std::thread::panicking() => put(value),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::PutBack;
    use std::cell::RefCell;
    use std::panic::{catch_unwind, AssertUnwindSafe};

    /// Put back when the call fails (dropped before `kept_out`); not when
    /// it succeeds, nor when it panics (left to the call's callee).
    #[test]
    fn a_value_is_put_back_after_a_failure_only() {
        let table = RefCell::new(Vec::new());
        let put = |v: u32| table.borrow_mut().push(v);
        drop(PutBack::new(1, put));
        PutBack::new(2, put).kept_out();
        let panicked = catch_unwind(AssertUnwindSafe(|| {
            let taken = PutBack::new(3, put);
            assert_eq!(*taken.value(), 3);
            panic!("a free that panics");
        }));
        assert!(panicked.is_err());
        assert_eq!(*table.borrow(), [1]);
    }
}
