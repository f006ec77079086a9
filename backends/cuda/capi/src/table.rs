//! The blocks a device has handed out through the C functions, by address.
//!
//! A C caller frees with a pointer (and a size); the resources want the
//! [`Block`] they handed out, tag included: the pool frees a tagged block in
//! O(1) but an address-only one by walking its chunk, and the stream-ordered
//! layer refuses address-only frees. So every live block is kept here and
//! frees carry the real tag, whatever the stack.
//!
//! ```text
//!  Table { shards: [Mutex<AddrMap<(size, tag)>>; 64] }
//!    shard = top 6 bits of (addr >> 8) * K   (blocks are 256-aligned)
//!    insert on allocate, remove on free: O(1), one uncontended lock
//! ```

use memres_core::addr_map::AddrMap;
use memres_core::Block;
use std::sync::Mutex;

const SHARD_BITS: u32 = 6;
const SHARDS: usize = 1 << SHARD_BITS;

/// A shard's blocks: (size, tag) by address.
type Map = AddrMap<(u64, u64)>;

/// One shard on cache lines of its own, so that threads working on
/// different shards do not share a line.
#[repr(align(128))]
#[derive(Default)]
struct Shard(Mutex<Map>);

/// Live blocks by address, in shards.
///
/// # Examples
///
/// ```
/// use memres::table::Table;
/// use memres_core::Block;
/// let t = Table::new();
/// t.insert(Block::new(0x1000, 64, 7));
/// assert_eq!(t.len(), 1);
/// // A free of another size leaves the block recorded.
/// assert_eq!(t.remove_sized(0x1000, Some(32)), Err(Some(Block::new(0x1000, 64, 7))));
/// assert_eq!(t.remove_sized(0x1000, Some(64)), Ok(Block::new(0x1000, 64, 7)));
/// assert_eq!(t.remove_sized(0x1000, Some(64)), Err(None));
/// ```
pub struct Table {
    /// Every live block is in exactly one shard: the one its address picks.
    shards: Box<[Shard]>,
}

impl std::fmt::Debug for Table {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Table").field("live", &self.len()).finish()
    }
}

impl Default for Table {
    fn default() -> Self {
        Self::new()
    }
}

impl Table {
    /// An empty table.
    pub fn new() -> Self {
        Table { shards: (0..SHARDS).map(|_| Shard::default()).collect() }
    }

    fn shard(&self, addr: u64) -> &Mutex<Map> {
        // A different multiplier from the map's: the shard and the slot
        // within it are chosen by independent bits.
        let i = (addr >> 8).wrapping_mul(0xD6E8_FEB8_6659_FD93) >> (64 - SHARD_BITS);
        &self.shards[i as usize].0
    }

    /// Records a live block, unless its address is recorded already: then
    /// the recorded block stays, and is returned. A correct resource never
    /// hands out a live address; one that does (or two whose ranges
    /// overlap) must not make the older block unfreeable, nor its free
    /// free the newer. A block put back after a free that failed must not
    /// go over a newer one either: a resource outside its contract that
    /// freed it and then failed may have handed the address to another
    /// thread, whose block stays (put over it, the stale entry made the
    /// newer block's free a size mismatch, and a retried free freed it).
    pub fn insert(&self, block: Block) -> Option<Block> {
        let mut map = self.shard(block.addr()).lock().unwrap_or_else(|p| p.into_inner());
        if let Some(&(size, tag)) = map.get(block.addr()) {
            return Some(Block::new(block.addr(), size, tag));
        }
        map.insert(block.addr(), (block.size(), block.tag()));
        None
    }

    /// Takes the block at `addr` out of the table if it has `size` bytes
    /// (any size for `None`); a block of another size stays, and is the
    /// error (`Err(None)`: no block at `addr`). Checked under the shard's
    /// lock: a free of the wrong size never takes a block out, even for a
    /// moment in which the right free of it finds it gone.
    pub fn remove_sized(&self, addr: u64, size: Option<u64>) -> Result<Block, Option<Block>> {
        let mut map = self.shard(addr).lock().unwrap_or_else(|p| p.into_inner());
        let &(allocated, tag) = map.get(addr).ok_or(None)?;
        if size.is_some_and(|s| s != allocated) {
            return Err(Some(Block::new(addr, allocated, tag)));
        }
        map.remove(addr);
        Ok(Block::new(addr, allocated, tag))
    }

    /// The live block at `addr`, if any.
    pub fn get(&self, addr: u64) -> Option<Block> {
        let map = self.shard(addr).lock().unwrap_or_else(|p| p.into_inner());
        map.get(addr).map(|&(size, tag)| Block::new(addr, size, tag))
    }

    /// The number of live blocks (locks each shard in turn: not a snapshot
    /// while other threads allocate).
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.0.lock().unwrap_or_else(|p| p.into_inner()).len()).sum()
    }

    /// Whether no block is live.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memres_core::testing::SplitMix64;

    #[test]
    fn matches_a_plain_map_under_random_inserts_and_removes() {
        let t = Table::new();
        let mut model = std::collections::BTreeMap::new();
        let mut rng = SplitMix64::new(7);
        for step in 0..20_000u64 {
            let addr = (rng.next_u64() % 4096) << 8;
            if rng.next_u64() % 2 == 0 {
                let b = Block::new(addr, step, step ^ 0xABC);
                let old = *model.entry(addr).or_insert(b);
                assert_eq!(t.insert(b), (old != b).then_some(old));
            } else {
                assert_eq!(t.remove_sized(addr, None).ok(), model.remove(&addr));
            }
        }
        assert_eq!(t.len(), model.len());
        // Every shard is used: addresses spread.
        let used = t.shards.iter().filter(|s| !s.0.lock().unwrap().is_empty()).count();
        assert_eq!(used, SHARDS);
    }

    #[test]
    fn an_insert_never_replaces_the_block_recorded_at_its_address() {
        let t = Table::new();
        let old = Block::new(0x1000, 512, 1);
        assert_eq!(t.insert(old), None);
        assert_eq!(t.remove_sized(0x1000, None), Ok(old));
        // The address handed out again meanwhile: the newer block stays
        // when the old one is put back.
        let newer = Block::new(0x1000, 256, 2);
        assert_eq!(t.insert(newer), None);
        assert_eq!(t.insert(old), Some(newer));
        assert_eq!(t.remove_sized(0x1000, None), Ok(newer));
        // A resource that hands a live address out again: the older block
        // stays.
        t.insert(old);
        assert_eq!(t.insert(newer), Some(old));
        assert_eq!(t.remove_sized(0x1000, None), Ok(old));
        assert!(t.is_empty());
    }

    #[test]
    fn a_remove_of_another_size_leaves_the_block_recorded() {
        let t = Table::new();
        let b = Block::new(0x1000, 512, 1);
        t.insert(b);
        assert_eq!(t.remove_sized(0x1000, Some(256)), Err(Some(b)));
        assert_eq!(t.remove_sized(0x2000, Some(512)), Err(None));
        assert_eq!(t.remove_sized(0x1000, Some(512)), Ok(b));
        assert_eq!(t.remove_sized(0x1000, Some(512)), Err(None));
        t.insert(b);
        assert_eq!(t.remove_sized(0x1000, None), Ok(b));
        assert!(t.is_empty());
    }

    #[test]
    fn threads_see_each_others_blocks() {
        let t = Table::new();
        std::thread::scope(|s| {
            for k in 0..4u64 {
                let t = &t;
                s.spawn(move || {
                    for i in 0..1000u64 {
                        t.insert(Block::new(((i * 4 + k) << 8) + (1 << 40), 256, i));
                    }
                });
            }
        });
        assert_eq!(t.len(), 4000);
        for a in 0..4000u64 {
            let b = t.remove_sized((a << 8) + (1 << 40), Some(256)).expect("inserted by some thread");
            assert_eq!(b.tag(), a / 4);
        }
        assert!(t.is_empty());
    }
}

/// Blocks the stack handed out at an address live already (or at 0, or of
/// another size than asked) whose give-back it refused at once: kept here,
/// never lost, and given back again by each release of the device
/// (`memres_release`, `memres_empty_cache`).
#[derive(Debug, Default)]
pub struct Stranded(Mutex<Vec<Block>>);

impl Stranded {
    /// Keeps `block` to give back later.
    pub(crate) fn keep(&self, block: Block) {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push(block);
    }

    /// The blocks kept and not given back yet.
    pub fn blocks(&self) -> Vec<Block> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// Gives each block kept back with `free`; keeps those it refuses,
    /// and answers the first refusal. A free that panics keeps those not
    /// reached yet, and leaves its own block to `free`, which may have
    /// taken it before the panic (as the core's layers leave such a block
    /// to the layer below): given back again, it could be freed twice.
    pub(crate) fn give_back<E>(&self, mut free: impl FnMut(Block) -> Result<(), E>) -> Result<(), E> {
        let taken = std::mem::take(&mut *self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
        let mut first = Ok(());
        for (i, &block) in taken.iter().enumerate() {
            match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| free(block))) {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    self.keep(block);
                    first = first.and(Err(e));
                }
                Err(payload) => {
                    taken[i + 1..].iter().for_each(|&b| self.keep(b));
                    std::panic::resume_unwind(payload)
                }
            }
        }
        first
    }
}
