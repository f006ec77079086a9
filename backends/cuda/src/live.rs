//! The allocations a driver resource has handed out, so that a bad free is
//! answered with a typed error before the driver sees it.

use crate::context::Context;
use memres_core::{Error, Result};
use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, OnceLock};

/// Shards, so that threads freeing different blocks rarely share a lock.
const SHARDS: usize = 16;

/// Every live driver allocation of one resource: its base address to the
/// address and size of the block handed out in it. A free of a block whose
/// allocation is not in the table, or that is not the block handed out
/// there (another address, another size), is an error without a driver call
/// (the driver would answer `CUDA_ERROR_INVALID_VALUE`, which tools such as
/// compute-sanitizer report, or free the allocation of another block).
#[derive(Debug, Default)]
pub(crate) struct LiveAllocations {
    /// Shard `i` holds the bases whose hash is `i`.
    shards: [Mutex<HashMap<u64, Handed>>; SHARDS],
    /// The device's memory in bytes, read once the driver answers: a
    /// request above it is out of memory without asking the driver.
    total: OnceLock<u64>,
}

/// The block handed out in one driver allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Handed {
    /// Its address: the allocation's base, or above it by the padding of
    /// an alignment over the driver's.
    addr: u64,
    /// The size that was asked for.
    size: u64,
}

fn shard_of(base: u64) -> usize {
    // Driver allocations are at least 256-aligned: mix the bits above.
    ((base >> 8).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 60) as usize % SHARDS
}

impl LiveAllocations {
    /// The device's memory, asked of the driver until it answers;
    /// `u64::MAX` (no early refusal) while it does not.
    pub(crate) fn device_total(&self, context: &Context) -> u64 {
        if let Some(&total) = self.total.get() {
            return total;
        }
        match context.memory_info() {
            Ok(m) => *self.total.get_or_init(|| m.total),
            Err(_) => u64::MAX,
        }
    }

    fn shard(&self, base: u64) -> MutexGuard<'_, HashMap<u64, Handed>> {
        // Each update is one call: a panic cannot leave a shard torn.
        self.shards[shard_of(base)].lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records that the block `addr`, `size` bytes, was handed out in the
    /// allocation at `base`.
    pub(crate) fn insert(&self, base: u64, addr: u64, size: u64) {
        self.shard(base).insert(base, Handed { addr, size });
    }

    /// Takes `base` out of the table if the block handed out in it is at
    /// `addr` and `size` bytes long.
    ///
    /// # Errors
    ///
    /// [`Error::UnknownBlock`] if it is not live (never handed out, or freed
    /// already) or another block's address was handed out in it;
    /// [`Error::SizeMismatch`] if it was asked for with another size.
    pub(crate) fn remove(&self, base: u64, addr: u64, size: u64) -> Result<()> {
        let mut shard = self.shard(base);
        match shard.get(&base) {
            Some(h) if h.addr != addr => Err(Error::UnknownBlock { addr }),
            None => Err(Error::UnknownBlock { addr }),
            Some(h) if h.size != size => Err(Error::SizeMismatch { addr, expected: h.size, given: size }),
            Some(_) => {
                shard.remove(&base);
                Ok(())
            }
        }
    }

    /// Puts `base` back after a free the driver refused: the block `addr`,
    /// `size` bytes, that [`remove`](Self::remove) took out.
    pub(crate) fn restore(&self, base: u64, addr: u64, size: u64) {
        self.insert(base, addr, size);
    }

    /// How many allocations are live.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().unwrap_or_else(|p| p.into_inner()).len()).sum()
    }

    /// The bases of the allocations still live, taking them out of the table.
    pub(crate) fn drain(&mut self) -> impl Iterator<Item = u64> + '_ {
        self.shards
            .iter_mut()
            .flat_map(|s| s.get_mut().unwrap_or_else(|p| p.into_inner()).drain().map(|(b, _)| b))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_frees_are_caught_and_change_nothing() {
        let live = LiveAllocations::default();
        live.insert(0x1000, 0x1000, 100);
        assert_eq!(live.remove(0x2000, 0x2000, 100), Err(Error::UnknownBlock { addr: 0x2000 }));
        assert_eq!(
            live.remove(0x1000, 0x1000, 7),
            Err(Error::SizeMismatch { addr: 0x1000, expected: 100, given: 7 })
        );
        assert_eq!(live.remove(0x1000, 0x1000, 100), Ok(()));
        assert_eq!(live.remove(0x1000, 0x1000, 100), Err(Error::UnknownBlock { addr: 0x1000 }));
    }

    #[test]
    fn a_block_at_another_address_in_a_live_allocation_is_unknown() {
        // A block aligned to 4096 bytes, 0xf00 above its allocation's base,
        // and a forged one that names the same base (its address and its
        // padding 256 bytes higher).
        let live = LiveAllocations::default();
        let (base, addr) = (0x7000_0100, 0x7000_1000);
        live.insert(base, addr, 1000);
        let forged = addr + 256;
        assert_eq!(live.remove(base, forged, 1000), Err(Error::UnknownBlock { addr: forged }));
        assert_eq!(live.remove(base, base, 1000), Err(Error::UnknownBlock { addr: base }));
        // The table is unchanged: the real block is freed once.
        assert_eq!(live.remove(base, addr, 1000), Ok(()));
        assert_eq!(live.remove(base, addr, 1000), Err(Error::UnknownBlock { addr }));
    }

    #[test]
    fn a_restored_allocation_keeps_its_block_address() {
        let live = LiveAllocations::default();
        let (base, addr) = (0x7000_0100, 0x7000_1000);
        live.insert(base, addr, 1000);
        live.insert(0x9000_0000, 0x9000_0000, 64);
        assert_eq!(live.remove(base, addr, 1000), Ok(()));
        // The driver refused the free: back as it was.
        live.restore(base, addr, 1000);
        assert_eq!(live.remove(base, addr + 256, 1000), Err(Error::UnknownBlock { addr: addr + 256 }));
        assert_eq!(live.remove(0x9000_0000, 0x9000_0000, 64), Ok(()));
        assert_eq!(live.remove(base, addr, 1000), Ok(()));
    }

    #[test]
    fn a_failed_question_of_the_devices_memory_is_asked_again() {
        use crate::context::{Context, Device};
        use crate::fake::{install, take, Driver};
        let (live, context) = (LiveAllocations::default(), Context::fake(Device::fake(0)));
        install(Driver::default());
        let first = live.device_total(&context);
        take();
        let mut driver = Driver::default();
        driver.memory = Some(1 << 30);
        install(driver);
        let second = live.device_total(&context);
        take();
        // No figure, no early refusal; the next answer is kept.
        assert_eq!((first, second), (u64::MAX, 1 << 30));
    }

    #[test]
    fn shards_spread_aligned_addresses() {
        let used: std::collections::HashSet<usize> =
            (0..64u64).map(|i| shard_of(0x7f00_0000_0000 + i * 512)).collect();
        assert!(used.len() > SHARDS / 2, "{used:?}");
    }
}
