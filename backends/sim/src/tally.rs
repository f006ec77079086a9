//! What the simulated device and host memory count: bytes held by callers,
//! their peak, and the calls that moved them.

/// The figures of a leaf, kept under its lock.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Tally {
    /// Bytes held by callers (sizes rounded to 256).
    pub(crate) held: u64,
    /// The highest `held` since creation or the last reset.
    pub(crate) peak: u64,
    /// Successful allocations.
    pub(crate) allocations: u64,
    /// Successful frees.
    pub(crate) frees: u64,
}

impl Tally {
    /// Counts an allocation of `bytes`.
    pub(crate) fn allocated(&mut self, bytes: u64) {
        self.held += bytes;
        self.peak = self.peak.max(self.held);
        self.allocations += 1;
    }

    /// Counts a free of `bytes`.
    pub(crate) fn freed(&mut self, bytes: u64) {
        self.held -= bytes;
        self.frees += 1;
    }
}

/// The public accessors of a leaf whose `lock()` guards a [`Tally`] in a
/// field `tally`: one definition for both leaves.
macro_rules! accessors {
    () => {
        /// Bytes held by callers now (sizes rounded to 256).
        pub fn held_bytes(&self) -> u64 {
            self.lock().tally.held
        }

        /// The most bytes ever held at once (since the last
        /// [`reset_peak`](Self::reset_peak)).
        pub fn peak_held_bytes(&self) -> u64 {
            self.lock().tally.peak
        }

        /// Forgets the peak: it restarts from what is held now.
        pub fn reset_peak(&self) {
            let mut s = self.lock();
            s.tally.peak = s.tally.held;
        }

        /// Number of successful allocations and frees so far.
        pub fn call_counts(&self) -> (u64, u64) {
            let t = self.lock().tally;
            (t.allocations, t.frees)
        }
    };
}
pub(crate) use accessors;
