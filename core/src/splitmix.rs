//! SplitMix64, the generator of RMM's bench harness: the workloads of the
//! replay tool, the randomized tests and the per-stream pools' stamps draw
//! from it. Public as `memres_core::testing::SplitMix64` (feature `testing`).

// Without `testing` only the crate's per-stream pools use it.
#![cfg_attr(not(any(test, feature = "testing")), allow(unreachable_pub, dead_code))]

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
    ///
    /// # Panics
    ///
    /// If `n` is 0: `0..0` holds no number.
    #[inline]
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}
