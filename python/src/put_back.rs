//! A value taken out of a table for a call that may fail or panic (a
//! block for its free): put back when dropped, unless the call succeeded.
//! So a free that fails, or that panics below (the core keeps a block whose
//! free panicked live), leaves the block in its table, freeable again.

/// `value`, out of its table until [`kept_out`](Self::kept_out); `put`
/// puts it back when this is dropped before that.
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
        if let Some((value, put)) = self.taken.take() {
            put(value);
        }
    }
}
