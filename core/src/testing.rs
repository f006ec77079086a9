//! Small upstreams for examples, tests and fuzzing inside the core.
//!
//! The real ones live in the backends (`memres-host`'s `SimDevice`,
//! `memres-cuda`); these need nothing but the core.

use crate::primitive::{AtomicU64, Ordering};
use crate::{Block, Error, MemoryResource, Request, Result, Stream};

/// An upstream that hands out fresh, never-reused address ranges from a
/// counter, up to a capacity, and counts the bytes outstanding. Frees are
/// only counted (it cannot tell a bad free: use `SimDevice` for that).
///
/// # Examples
///
/// ```
/// use memres_core::{testing::BumpUpstream, MemoryResource, Request};
/// let up = BumpUpstream::new(1024);
/// let b = up.allocate(Request::new(512)?, &())?;
/// assert_eq!(up.outstanding(), 512);
/// assert!(up.allocate(Request::new(1024)?, &()).is_err());
/// up.deallocate(b, &())?;
/// assert_eq!(up.outstanding(), 0);
/// # Ok::<(), memres_core::Error>(())
/// ```
#[derive(Debug)]
pub struct BumpUpstream {
    capacity: u64,
    /// Next address to hand out; starts at 1 MiB so that 0 is never valid.
    next: AtomicU64,
    /// Bytes handed out and not yet freed (sizes rounded to 256).
    outstanding: AtomicU64,
    /// Allocations to let through before every call fails (`u64::MAX`: never).
    fail_after: AtomicU64,
}

impl BumpUpstream {
    /// An upstream that holds at most `capacity` bytes outstanding.
    pub fn new(capacity: u64) -> Self {
        BumpUpstream {
            capacity,
            next: AtomicU64::new(1 << 20),
            outstanding: AtomicU64::new(0),
            fail_after: AtomicU64::new(u64::MAX),
        }
    }

    /// Bytes handed out and not freed.
    pub fn outstanding(&self) -> u64 {
        self.outstanding.load(Ordering::Relaxed)
    }

    /// Lets `n` more allocations succeed, then fails every later one.
    pub fn fail_after(&self, n: u64) {
        self.fail_after.store(n, Ordering::Relaxed);
    }
}

impl<S: Stream + ?Sized> MemoryResource<S> for BumpUpstream {
    fn allocate(&self, request: Request, _: &S) -> Result<Block> {
        if request.is_zero() {
            return Ok(Block::EMPTY);
        }
        let left = self.fail_after.load(Ordering::Relaxed);
        if left == 0 {
            return Err(Error::Backend { code: -1, what: "injected upstream failure" });
        }
        if left != u64::MAX {
            self.fail_after.store(left - 1, Ordering::Relaxed);
        }
        let size = request.rounded_size(256);
        let out = self.outstanding.load(Ordering::Relaxed);
        if out + size > self.capacity {
            return Err(Error::OutOfMemory {
                requested: request.size(),
                largest_free: self.capacity - out,
                pool_size: self.capacity,
                max_size: Some(self.capacity),
            });
        }
        self.outstanding.fetch_add(size, Ordering::Relaxed);
        let align = request.align();
        let addr = self.next.fetch_add(size + align, Ordering::Relaxed);
        let addr = (addr + align - 1) & !(align - 1);
        Ok(Block::new(addr, request.size(), 0))
    }

    fn deallocate(&self, block: Block, _: &S) -> Result<()> {
        let size = (block.size() + 255) & !255;
        self.outstanding.fetch_sub(size, Ordering::Relaxed);
        Ok(())
    }
}

/// SplitMix64: the small, fast, deterministic generator the workload
/// strings and randomized tests use (the same one as RMM's bench harness).
///
/// # Examples
///
/// ```
/// use memres_core::testing::SplitMix64;
/// let mut a = SplitMix64::new(42);
/// let mut b = SplitMix64::new(42);
/// assert_eq!(a.next_u64(), b.next_u64());
/// assert!(a.below(10) < 10);
/// ```
#[derive(Clone, Debug)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator seeded with `seed`.
    pub const fn new(seed: u64) -> Self {
        SplitMix64 { state: seed }
    }

    /// The next 64 random bits.
    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n > 0`), by modulo as RMM's harness does.
    #[inline]
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

/// A stream known only by its id, whose work is always complete: for
/// resources that key state by stream (per-stream arenas, free lists, logs)
/// in tests and examples with no device behind them.
///
/// # Examples
///
/// ```
/// use memres_core::{testing::IdStream, Stream};
/// let s = IdStream(7);
/// assert_eq!(s.id(), 7);
/// assert!(s.query(&s.record()?)?);
/// # Ok::<(), memres_core::Error>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct IdStream(pub u64);

impl Stream for IdStream {
    type Event = ();
    fn id(&self) -> u64 {
        self.0
    }
    fn record(&self) -> Result<()> {
        Ok(())
    }
    fn wait(&self, _: &()) -> Result<()> {
        Ok(())
    }
    fn query(&self, _: &()) -> Result<bool> {
        Ok(true)
    }
    fn synchronize(&self) -> Result<()> {
        Ok(())
    }
}
