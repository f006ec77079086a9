//! The configuration of the virtual pool.

use crate::{Error, Result};

/// Sizes and policies of a [`VirtualPool`](super::VirtualPool).
///
/// # Examples
///
/// ```
/// use memres_core::vpool::VirtualConfig;
/// let c = VirtualConfig::new(64 << 30).release_threshold(256 << 20).max_reservations(4);
/// assert_eq!((c.reserve_size(), c.release_threshold_bytes()), (64 << 30, 256 << 20));
/// assert_eq!(VirtualConfig::default(), VirtualConfig::new(VirtualConfig::DEFAULT_RESERVE));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VirtualConfig {
    pub(super) reserve: u64,
    pub(super) keep: u64,
    pub(super) max_reservations: u32,
    pub(super) trim_on_commit: bool,
    pub(super) slack_permille: u32,
}

impl Default for VirtualConfig {
    /// One reservation of [`DEFAULT_RESERVE`](Self::DEFAULT_RESERVE) bytes,
    /// as [`new`](Self::new).
    fn default() -> Self {
        VirtualConfig::new(Self::DEFAULT_RESERVE)
    }
}

impl VirtualConfig {
    /// The reservation of the default configuration: 64 GiB of addresses
    /// (costing no memory until committed).
    pub const DEFAULT_RESERVE: u64 = 64 << 30;

    /// One reservation of `reserve` bytes (rounded up to the space's
    /// granule), no free committed memory kept, no growth.
    pub const fn new(reserve: u64) -> Self {
        VirtualConfig { reserve, keep: 0, max_reservations: 1, trim_on_commit: true, slack_permille: 0 }
    }

    /// Whether a pool over a space of `granule`-byte granules may take
    /// this configuration: what [`VirtualPool::with_config`] checks before
    /// it reserves anything, and what a pool made later (one per stream)
    /// can be checked against when it is configured.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] for a granule that is no power of two of
    /// at least 256 bytes, a reservation of zero bytes or zero
    /// reservations, or a reservation of `u32::MAX` granules or more (the
    /// pool keeps a bit per granule, numbered by a `u32`).
    ///
    /// [`VirtualPool::with_config`]: super::VirtualPool::with_config
    pub fn check(&self, granule: u64) -> Result<()> {
        if !granule.is_power_of_two() || granule < 256 {
            return Err(Error::InvalidConfig { what: "space granule not a power of two >= 256" });
        }
        if self.reserve == 0 || self.max_reservations == 0 {
            return Err(Error::InvalidConfig { what: "reservation of zero bytes or zero reservations" });
        }
        if self.reserve.div_ceil(granule) >= u32::MAX as u64 {
            return Err(Error::InvalidConfig {
                what: "a reservation of 2^32 - 1 granules or more: reserve less, or take larger granules",
            });
        }
        Ok(())
    }

    crate::config::setters! {
        /// The release threshold: up to `bytes` of committed memory that no
        /// live block touches stay committed (the CUDA pool's
        /// `cudaMemPoolAttrReleaseThreshold`, RMM's `release_threshold`). 0
        /// decommits at once: correct, just more map and unmap calls.
        release_threshold(bytes: u64) => keep;

        /// How many reservations the pool may hold (at least 1). When the first
        /// is full, the pool reserves another of the same size (or of the
        /// request's size if larger); blocks never span reservations.
        max_reservations(n: u32) => max_reservations;

        /// Whether an allocation that needs fresh granules first decommits Idle
        /// ones, as many as the commit would take committed memory beyond its
        /// peak so far, plus the [slack](Self::slack_permille) (default: yes).
        /// With no slack, kept free memory then never raises the peak:
        /// committed memory goes beyond its peak only when nothing is Idle, so
        /// the peak is that of the granules live blocks touch, whatever the
        /// release threshold. Below the peak, Idle granules stay, and blocks
        /// that land on them need no map or unmap call, as with alternating
        /// allocate and free of one size. Without it, up to the release
        /// threshold adds to the peak (the CUDA pool's behaviour).
        trim_on_commit(yes: bool) => trim_on_commit;

        /// How far committed memory may go beyond the peak of bytes in use
        /// before [`trim_on_commit`](Self::trim_on_commit) gives Idle memory
        /// back, in thousandths of that peak (default 0).
        ///
        /// With a slack of 0, an allocation that needs fresh granules beyond
        /// the peak of committed memory decommits Idle ones, even those the
        /// next blocks would land on: the granules a workload touches over time
        /// outnumber those it touches at once (on the `gpt_train` trace, 7 %
        /// more), so a replayed workload maps and unmaps on every pass. With a
        /// slack `s`, Idle memory stays while committed memory is at most
        /// `(1 + s / 1000) ×` the peak of bytes in use (in whole granules), and
        /// the peak of committed memory is at most that or the peak of
        /// granules live blocks touch, whichever is more. With `release_threshold(u64::MAX)`
        /// the slack alone bounds the kept memory. The figures measured with
        /// the slack on the replayed training traces are in
        /// `docs/measurements.md`.
        ///
        /// # Examples
        ///
        /// ```
        /// use memres_core::vpool::VirtualConfig;
        /// let c = VirtualConfig::new(64 << 30).release_threshold(u64::MAX).slack_permille(40); // 4 %
        /// assert_eq!(c.slack(), 40);
        /// ```
        slack_permille(permille: u32) => slack_permille;
    }

    /// The slack in thousandths of the peak of bytes in use.
    pub const fn slack(&self) -> u32 {
        self.slack_permille
    }

    /// Whether [`trim_on_commit`](Self::trim_on_commit) is on.
    pub const fn trims_on_commit(&self) -> bool {
        self.trim_on_commit
    }

    /// The size of a reservation.
    pub const fn reserve_size(&self) -> u64 {
        self.reserve
    }

    /// The release threshold.
    pub const fn release_threshold_bytes(&self) -> u64 {
        self.keep
    }

    /// The most reservations the pool holds.
    pub const fn reservations(&self) -> u32 {
        self.max_reservations
    }
}
