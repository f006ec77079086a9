//! How a resource sizes the chunks it takes from its upstream.

use crate::Request;

/// How a resource sizes the chunks it takes from its upstream when it runs
/// dry. The pool takes any policy ([`PoolConfig::growth`](crate::pool::PoolConfig::growth));
/// the arena grows by [`Growth::Steps`] of its chunk and superblock sizes.
///
/// Whatever the policy, a chunk is never larger than the room left under
/// the resource's maximum, and when the upstream is out of memory the size
/// asked is halved down to what the request needs, as RMM does. The
/// policy's rounding (to a granule, in steps) holds for the size it picks;
/// a chunk cut to the room left, to [`Request::MAX_SIZE`], or halved is
/// rounded up to 256 only.
///
/// Footprint (peak bytes held from upstream / peak live bytes) depends on
/// the policy: growth that doubles wastes up to the top half of the last
/// chunk; growth in tiny steps strands free space between chunks, which
/// never coalesce. `docs/measurements.md` gives the figures measured on the
/// replayed traces for each policy.
///
/// # Examples
///
/// ```
/// use memres_core::pool::Growth;
/// assert_eq!(Growth::default(), Growth::DEFAULT);
/// assert_eq!(Growth::DEFAULT, Growth::Fraction { divisor: 8, granule: 32 << 20 });
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Growth {
    /// RMM's policy: grow by `max(request, bytes held)` without a maximum
    /// (the resource doubles), and by `max(request, half the room left)`
    /// under a maximum.
    Double,
    /// Grow by `max(request, held / divisor)` rounded up to `granule`:
    /// geometric growth with ratio `1 + 1/divisor`, so the unused tail of
    /// the newest chunk is under `held / divisor + granule` (a first
    /// request of 1 MiB takes a whole granule).
    Fraction {
        /// The resource grows by at least `1/divisor` of what it holds.
        divisor: u32,
        /// The size picked is a multiple of this (a power of two, at least
        /// 256, at most [`Request::MAX_SIZE`]).
        granule: u64,
    },
    /// Grow by exactly what the request needs, rounded up to `granule` (a
    /// power of two, at least 256): the chunks a pool gives its large
    /// blocks, one block each.
    Exact {
        /// The size picked is a multiple of this.
        granule: u64,
    },
    /// Grow by `max(minimum, held / divisor)` rounded up to `step`, or by
    /// exactly what the request needs (rounded to 256) if that is more:
    /// the arena's policy, whose `minimum` is its chunk size and `step` its
    /// superblock size, so that chunks hold whole superblocks (unless cut
    /// to the room left or halved) and a large block gets a chunk of its
    /// own size.
    Steps {
        /// The smallest growth (a multiple of 256).
        minimum: u64,
        /// The resource grows by at least `1/divisor` of what it holds.
        divisor: u32,
        /// The size picked, unless the need, is a multiple of this (a
        /// multiple of 256).
        step: u64,
    },
}

impl Growth {
    /// The pool's default policy: chunks of at least 1/8 of the pool, in
    /// 32 MiB steps.
    ///
    /// Why 32 MiB: CUDA's stream-ordered pool maps memory in 32 MiB units,
    /// so finer chunks save nothing there, and fewer, larger chunks strand
    /// less free space between them. The unused tail of the newest chunk is
    /// under `pool / 8 + 32 MiB`. Its footprint on the replayed traces,
    /// against [`Growth::Double`] and smaller steps, is in
    /// `docs/measurements.md`.
    pub const DEFAULT: Growth =
        Growth::Fraction { divisor: Self::DEFAULT_DIVISOR, granule: Self::DEFAULT_GRANULE };

    /// The divisor of [`Growth::DEFAULT`]: the pool grows by at least 1/8.
    pub const DEFAULT_DIVISOR: u32 = 8;

    /// The chunk granule of [`Growth::DEFAULT`]: 32 MiB.
    pub const DEFAULT_GRANULE: u64 = 32 << 20;

    /// The chunk to ask for first when `need` bytes (a multiple of 256, at
    /// most [`Request::MAX_SIZE`]) do not fit, with `held` bytes held and
    /// `room` bytes left under the maximum (`None`: no maximum).
    pub(crate) fn chunk_size(&self, need: u64, held: u64, room: Option<u64>) -> u64 {
        let want = match *self {
            Growth::Double => match room {
                Some(room) => need.max(room / 2),
                None => need.max(held),
            },
            // Configs are validated (a divisor and step of at least 1, a
            // power-of-two granule); saturation keeps what held bytes or a
            // huge minimum could overflow under the cap below.
            Growth::Fraction { divisor, granule } => {
                let g = need.max(held / u64::from(divisor.max(1)));
                g.saturating_add(granule - 1) & !(granule - 1)
            }
            Growth::Exact { granule } => need.saturating_add(granule - 1) & !(granule - 1),
            Growth::Steps { minimum, divisor, step } => {
                let step = step.max(1);
                let g = minimum.max(held / u64::from(divisor.max(1)));
                need.max(g.div_ceil(step).saturating_mul(step))
            }
        };
        let want = (want.saturating_add(255) & !255).min(Request::MAX_SIZE);
        match room {
            Some(room) => want.min(room),
            None => want,
        }
    }
}

impl Default for Growth {
    fn default() -> Self {
        Growth::DEFAULT
    }
}
