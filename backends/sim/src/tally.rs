//! What the simulated device and host memory count: bytes held by callers,
//! their peak, and the calls that moved them.

use memres_core::check::Violation;
use memres_core::Usage;

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

    /// A leaf's figures: it holds what it handed out.
    pub(crate) fn usage(&self) -> Usage {
        Usage::leaf(self.held, self.peak)
    }

    /// The leaf's check: the bytes held out are `counted`, what the leaf's
    /// own record of its blocks (`record`) adds up to.
    pub(crate) fn check_held(&self, counted: u64, record: &'static str) -> Result<(), Violation> {
        if counted == self.held {
            Ok(())
        } else {
            Err(Violation::new(record))
        }
    }
}

/// The public accessors of a leaf whose `lock()` guards a [`Tally`] in a
/// field `tally`, beside its [`Usage`] (the bytes it holds out, sizes
/// rounded to 256, and their peak since made or since
/// `reset_peak`): one definition for both leaves.
macro_rules! accessors {
    () => {
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
