use core::fmt;

/// Shorthand for `Result<T, memres_core::Error>`.
pub type Result<T, E = Error> = core::result::Result<T, E>;

/// Everything that can go wrong, as a value.
///
/// Every failure leaves the resource usable and its accounting exact: a
/// failed call hands out nothing and frees no block of the caller's. What
/// the resource holds from its upstream may differ afterwards only as far
/// as the upstream decides: a pool gives its wholly free chunks back before
/// it grows and takes them again if the growth fails, which the upstream
/// may refuse.
///
/// # Examples
///
/// ```
/// use memres_core::Error;
/// let e = Error::OutOfMemory { requested: 4096, largest_free: 1024, pool_size: 8192, max_size: Some(8192) };
/// assert_eq!(
///     e.to_string(),
///     "out of memory: requested 4.00 KiB, largest free block 1.00 KiB, pool size 8.00 KiB, maximum 8.00 KiB",
/// );
/// // A pool with no maximum of its own, over an upstream that has one.
/// let e = Error::OutOfMemory { requested: 4096, largest_free: 0, pool_size: 0, max_size: None };
/// assert!(e.to_string().ends_with("pool size 0 B, no maximum of its own"));
/// // A size that no pool could serve says why.
/// let e = memres_core::Request::new(u64::MAX).unwrap_err();
/// assert_eq!(e.to_string(), format!("invalid size: {} bytes (above Request::MAX_SIZE)", u64::MAX));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Error {
    /// No block of the requested size could be found or made.
    OutOfMemory {
        /// Bytes asked for.
        requested: u64,
        /// Largest free block the resource holds.
        largest_free: u64,
        /// Bytes the resource holds from its upstream.
        pool_size: u64,
        /// The resource's maximum size, if it has one of its own (`None`
        /// says nothing of its upstream's, which may be what it met).
        max_size: Option<u64>,
    },
    /// A size that cannot be served at all (above [`Request::MAX_SIZE`](crate::Request::MAX_SIZE),
    /// or above what this resource ever hands out).
    InvalidSize {
        /// The size asked for.
        size: u64,
        /// Why it cannot be served (`"above the block size"`).
        what: &'static str,
    },
    /// An alignment that is not a power of two, or too large: above 2^40
    /// ([`Request::MAX_ALIGN`](crate::Request::MAX_ALIGN)), or above what
    /// this resource aligns its blocks to (a fixed-size resource: 256).
    InvalidAlignment {
        /// The alignment asked for.
        align: u64,
    },
    /// A free of an address this resource never handed out (or that belongs
    /// to another resource).
    UnknownBlock {
        /// The address given.
        addr: u64,
    },
    /// A copy or fill of bytes that do not lie in one live allocation: a
    /// copy engine that checks its accesses refused them, touching nothing
    /// (the block was freed by other code, or its resource ended).
    NotLive {
        /// The first byte of the access.
        addr: u64,
        /// Bytes the access covers.
        len: u64,
    },
    /// A free of a block that is already free.
    DoubleFree {
        /// The address given.
        addr: u64,
    },
    /// A free whose size does not match the allocation.
    SizeMismatch {
        /// The address given.
        addr: u64,
        /// The size of the allocation.
        expected: u64,
        /// The size given with the free.
        given: u64,
    },
    /// A limiting adaptor refused the request.
    LimitExceeded {
        /// Bytes asked for.
        requested: u64,
        /// Bytes in use under the limit.
        used: u64,
        /// The limit.
        limit: u64,
    },
    /// Fixed-capacity metadata storage is full.
    CapacityExhausted {
        /// How many entries the storage holds.
        capacity: u32,
    },
    /// A configuration that makes no sense (the message says which).
    InvalidConfig {
        /// What is wrong.
        what: &'static str,
    },
    /// A call into a resource behind a lock that refuses re-entry
    /// ([`CriticalSectionLock`](crate::lock)), made from inside a call on the
    /// same resource (an upstream that calls back into it), or a
    /// [`Planned::step`](crate::planned::Planned::step) while another one
    /// runs: refused, and nothing changed.
    Reentrant,
    /// An upstream (the resource, inner algorithm or reservable space a
    /// resource takes its memory from, perhaps the user's code) answered a
    /// valid request outside its contract: memory shorter than asked, not
    /// aligned or sized as asked, running past the last address, or
    /// overlapping memory it lent already. The fault is the upstream's, not
    /// the caller's: what it handed out went back to it (memory overlapping
    /// what the resource holds is only kept out of use, as it is in part
    /// the resource's own), nothing is counted, and the resource serves on.
    ///
    /// ```
    /// # use memres_core::Error;
    /// let e = Error::UpstreamMisbehaved { addr: 0x100000, size: 512, what: "shorter than asked" };
    /// assert_eq!(e.to_string(), "upstream misbehaved: it handed out 512 bytes at 0x100000, shorter than asked");
    /// ```
    UpstreamMisbehaved {
        /// The address of what the upstream handed out.
        addr: u64,
        /// Its size in bytes.
        size: u64,
        /// What is wrong with it (`"shorter than asked"`).
        what: &'static str,
    },
    /// The backend failed for a reason of its own.
    Backend {
        /// The backend's error code (a `CUresult` for CUDA).
        code: i64,
        /// The backend's name for it.
        what: &'static str,
    },
}

impl Error {
    /// Whether this is an out-of-memory error (of any kind: a full pool, a
    /// limit, an upstream out of memory).
    ///
    /// ```
    /// # use memres_core::Error;
    /// assert!(Error::LimitExceeded { requested: 1, used: 0, limit: 0 }.is_out_of_memory());
    /// assert!(!Error::DoubleFree { addr: 0 }.is_out_of_memory());
    /// ```
    pub const fn is_out_of_memory(&self) -> bool {
        matches!(self, Error::OutOfMemory { .. } | Error::LimitExceeded { .. })
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Error::OutOfMemory { requested, largest_free, pool_size, max_size } => {
                let (requested, largest_free, pool_size) =
                    (Bytes(requested), Bytes(largest_free), Bytes(pool_size));
                write!(
                    f,
                    "out of memory: requested {requested}, largest free block {largest_free}, pool size {pool_size}"
                )?;
                match max_size {
                    Some(m) => write!(f, ", maximum {}", Bytes(m)),
                    // Its upstream may have one, which it met.
                    None => write!(f, ", no maximum of its own"),
                }
            }
            Error::InvalidSize { size, what } => write!(f, "invalid size: {size} bytes ({what})"),
            Error::InvalidAlignment { align } => {
                write!(f, "invalid alignment: {align} (not a power of two up to 2^40, or above what this resource aligns to)")
            }
            Error::UnknownBlock { addr } => {
                write!(f, "free of {addr:#x}, which this resource did not hand out")
            }
            Error::NotLive { addr, len } => {
                write!(f, "access to {len} bytes at {addr:#x}, which do not lie in one live allocation")
            }
            Error::DoubleFree { addr } => write!(f, "double free of {addr:#x}"),
            Error::SizeMismatch { addr, expected, given } => {
                write!(f, "free of {addr:#x} with size {given}, but it was allocated with size {expected}")
            }
            Error::LimitExceeded { requested, used, limit } => {
                let (requested, used, limit) = (Bytes(requested), Bytes(used), Bytes(limit));
                write!(f, "limit exceeded: requested {requested} with {used} in use, limit {limit}")
            }
            Error::CapacityExhausted { capacity } => {
                write!(f, "metadata capacity exhausted ({capacity} entries)")
            }
            Error::InvalidConfig { what } => write!(f, "invalid configuration: {what}"),
            Error::Reentrant => f.write_str("re-entrant or overlapping call into a resource (refused)"),
            Error::UpstreamMisbehaved { addr, size, what } => {
                write!(f, "upstream misbehaved: it handed out {size} bytes at {addr:#x}, {what}")
            }
            Error::Backend { code, what } => write!(f, "backend error {code}: {what}"),
        }
    }
}

impl core::error::Error for Error {}

/// Bytes as people read them: `512 B` below a KiB, else two decimals of
/// the largest binary unit that keeps the number at least 1 (`546.00 MiB`).
///
/// ```
/// use memres_core::Bytes;
/// assert_eq!(Bytes(512).to_string(), "512 B");
/// assert_eq!(Bytes(546 << 20).to_string(), "546.00 MiB");
/// assert_eq!(Bytes(3 << 39).to_string(), "1.50 TiB");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Bytes(pub u64);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
        let mut value = self.0 as f64;
        let mut unit = 0;
        while value >= 1024.0 && unit + 1 < UNITS.len() {
            value /= 1024.0;
            unit += 1;
        }
        if unit == 0 {
            write!(f, "{} B", self.0)
        } else {
            write!(f, "{value:.2} {}", UNITS[unit])
        }
    }
}
