//! The pool's sizes and policies.

use super::Growth;
use crate::{Error, Request, Result};

/// Sizes and policies of a [`CoalescingPool`](super::CoalescingPool).
///
/// # Examples
///
/// ```
/// use memres_core::pool::{Growth, PoolConfig};
/// let c = PoolConfig::new().initial_size(1 << 30).maximum_size(4 << 30).growth(Growth::Double);
/// assert_eq!(c.maximum(), Some(4 << 30));
/// assert_eq!(PoolConfig::default(), PoolConfig::new());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolConfig {
    pub(super) initial_size: u64,
    pub(super) maximum_size: Option<u64>,
    pub(super) growth: Growth,
    pub(super) release_on_grow: bool,
    pub(super) large_threshold: u64,
    pub(super) keep_under_peak: bool,
}

impl Default for PoolConfig {
    /// [`PoolConfig::new`].
    fn default() -> Self {
        PoolConfig::new()
    }
}

impl PoolConfig {
    /// A pool that starts empty, has no maximum, grows by
    /// [`Growth::DEFAULT`], gives wholly free chunks back before growing and
    /// lets blocks of every size share chunks.
    pub const fn new() -> Self {
        PoolConfig {
            initial_size: 0,
            maximum_size: None,
            growth: Growth::DEFAULT,
            release_on_grow: true,
            large_threshold: u64::MAX,
            keep_under_peak: false,
        }
    }

    /// The compact policy: blocks of 16 MiB or more in chunks of their own,
    /// the rest in chunks of at least 1/32 of the pool in 2 MiB steps, and
    /// free chunks given back only when the pool would grow past its peak
    /// in use (`pool(UP, growth=32, granule=2MiB, large=16MiB,
    /// release=peak)`). It holds less than the default on every replayed
    /// trace, but over CUDA's stream-ordered pool the chunks it gives back
    /// and takes again within a step stay reserved by the driver until the
    /// next synchronization: see `docs/measurements.md` before choosing it.
    pub const fn compact() -> Self {
        PoolConfig {
            growth: Growth::Fraction { divisor: 32, granule: 2 << 20 },
            large_threshold: 16 << 20,
            keep_under_peak: true,
            ..Self::new()
        }
    }

    crate::config::setters! {
        /// Bytes taken from upstream when the pool is made (a multiple of 256).
        initial_size(bytes: u64) => initial_size;

        /// The most bytes the pool ever holds from upstream (a multiple of 256).
        maximum_size(bytes: u64) => maximum_size Some;

        /// How the pool grows.
        growth(growth: Growth) => growth;

        /// Whether wholly free chunks go back upstream before the pool grows,
        /// so that a new chunk replaces them instead of adding to them
        /// (default: yes; RMM: no). Free chunks too small for the request
        /// would otherwise sit beside the new chunk at the peak.
        release_on_grow(yes: bool) => release_on_grow;

        /// With [`release_on_grow`](Self::release_on_grow): give back only
        /// what would take the pool past the most bytes it has had in use,
        /// largest chunk first, keeping the rest for the next request of
        /// their size (default: no, all of them).
        keep_under_peak(yes: bool) => keep_under_peak;

        /// Requests of at least this many bytes get chunks of their own, sized
        /// for them ([`Growth::Exact`] in the growth's granule), which smaller
        /// blocks never share, each reused only by a request of about its
        /// size: within a quarter and a granule, or no longer than the chunk
        /// growth would take for that request with its alignment padding (so
        /// a chunk always serves again the request it was grown for), or by
        /// any request when no chunk can be had (at the maximum, or the
        /// upstream out of memory) (default `u64::MAX`: every block shares chunks, as in RMM's pool;
        /// [`PoolConfig::compact`]: 16 MiB).
        large_threshold(bytes: u64) => large_threshold;
    }

    /// The maximum size, if any.
    pub const fn maximum(&self) -> Option<u64> {
        self.maximum_size
    }

    /// The granule of large blocks' chunks: the growth's (256 bytes for
    /// growth by doubling).
    pub(super) fn large_granule(&self) -> u64 {
        match self.growth {
            Growth::Fraction { granule, .. } | Growth::Exact { granule } => granule,
            Growth::Steps { step, .. } if step.is_power_of_two() => step,
            Growth::Double | Growth::Steps { .. } => 256,
        }
    }

    /// The chunks of large blocks: exactly their size, in the granule.
    pub(super) fn large_growth(&self) -> Growth {
        Growth::Exact { granule: self.large_granule() }
    }

    pub(crate) fn validate(&self) -> Result<()> {
        if self.initial_size % 256 != 0 {
            return Err(Error::InvalidConfig { what: "initial pool size is not a multiple of 256" });
        }
        if self.initial_size > Request::MAX_SIZE {
            return Err(Error::InvalidConfig { what: "initial pool size above the largest request" });
        }
        if let Some(max) = self.maximum_size {
            if max % 256 != 0 {
                return Err(Error::InvalidConfig { what: "maximum pool size is not a multiple of 256" });
            }
            if max < self.initial_size {
                return Err(Error::InvalidConfig { what: "maximum pool size below the initial size" });
            }
        }
        const BAD_STEP: &str = "growth divisor is zero or granule not a power of two >= 256";
        if let Growth::Fraction { divisor: 0, .. } = self.growth {
            return Err(Error::InvalidConfig { what: BAD_STEP });
        }
        if let Growth::Fraction { granule, .. } | Growth::Exact { granule } = self.growth {
            if !granule.is_power_of_two() || granule < 256 {
                return Err(Error::InvalidConfig { what: BAD_STEP });
            }
            // Every chunk would be asked with more bytes than a request holds.
            if granule > Request::MAX_SIZE {
                return Err(Error::InvalidConfig { what: "growth granule above the largest request" });
            }
        }
        if let Growth::Steps { minimum, divisor, step } = self.growth {
            if divisor == 0 || step == 0 || step % 256 != 0 || minimum % 256 != 0 {
                return Err(Error::InvalidConfig {
                    what: "growth divisor or step is zero, or step or minimum not a multiple of 256",
                });
            }
            if step > Request::MAX_SIZE || minimum > Request::MAX_SIZE {
                return Err(Error::InvalidConfig {
                    what: "growth step or minimum above the largest request",
                });
            }
        }
        Ok(())
    }
}
