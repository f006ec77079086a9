//! The allocations a driver resource has handed out, so that a bad free is
//! answered with a typed error before the driver sees it.

use crate::context::Context;
use memres_core::{Error, Result};
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

/// Shards, so that threads freeing different blocks rarely share a lock.
const SHARDS: usize = 16;

/// Every live driver allocation of one resource: its base address to the
/// size that was asked for. A free of an address not in the table, or with
/// another size, is an error without a driver call (the driver would answer
/// `CUDA_ERROR_INVALID_VALUE`, which tools such as compute-sanitizer report).
#[derive(Debug, Default)]
pub(crate) struct LiveAllocations {
    /// Shard `i` holds the bases whose hash is `i`.
    shards: [Mutex<HashMap<u64, u64>>; SHARDS],
    /// The device's memory in bytes, read once: a request above it is out of
    /// memory without asking the driver.
    total: OnceLock<u64>,
}

fn shard_of(base: u64) -> usize {
    // Driver allocations are at least 256-aligned: mix the bits above.
    ((base >> 8).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 60) as usize % SHARDS
}

impl LiveAllocations {
    /// The device's memory, asked of the driver on first use.
    pub(crate) fn device_total(&self, context: &Context) -> u64 {
        *self.total.get_or_init(|| context.memory_info().map(|m| m.total).unwrap_or(u64::MAX))
    }

    /// Records that `base` was handed out for a request of `size` bytes.
    pub(crate) fn insert(&self, base: u64, size: u64) {
        self.shards[shard_of(base)].lock().unwrap_or_else(|p| p.into_inner()).insert(base, size);
    }

    /// Takes `base` out of the table if it is live with `size`.
    ///
    /// # Errors
    ///
    /// [`Error::UnknownBlock`] if it is not live (never handed out, or freed
    /// already); [`Error::SizeMismatch`] if it was asked for with another size.
    pub(crate) fn remove(&self, base: u64, addr: u64, size: u64) -> Result<()> {
        let mut shard = self.shards[shard_of(base)].lock().unwrap_or_else(|p| p.into_inner());
        match shard.get(&base) {
            None => Err(Error::UnknownBlock { addr }),
            Some(&expected) if expected != size => Err(Error::SizeMismatch { addr, expected, given: size }),
            Some(_) => {
                shard.remove(&base);
                Ok(())
            }
        }
    }

    /// Puts `base` back after a free the driver refused.
    pub(crate) fn restore(&self, base: u64, size: u64) {
        self.insert(base, size);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_frees_are_caught_and_change_nothing() {
        let live = LiveAllocations::default();
        live.insert(0x1000, 100);
        assert_eq!(live.remove(0x2000, 0x2000, 100), Err(Error::UnknownBlock { addr: 0x2000 }));
        assert_eq!(
            live.remove(0x1000, 0x1000, 7),
            Err(Error::SizeMismatch { addr: 0x1000, expected: 100, given: 7 })
        );
        assert_eq!(live.remove(0x1000, 0x1000, 100), Ok(()));
        assert_eq!(live.remove(0x1000, 0x1000, 100), Err(Error::UnknownBlock { addr: 0x1000 }));
    }

    #[test]
    fn shards_spread_aligned_addresses() {
        let used: std::collections::HashSet<usize> =
            (0..64u64).map(|i| shard_of(0x7f00_0000_0000 + i * 512)).collect();
        assert!(used.len() > SHARDS / 2, "{used:?}");
    }
}
