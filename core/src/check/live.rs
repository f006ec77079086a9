use super::Violation;
use crate::{Block, Request};
use alloc::collections::BTreeMap;

/// The caller's view of a resource: every block it handed out and was not
/// given back. Checks that each new block is aligned as asked and overlaps
/// no live block, and that each freed block was live.
///
/// # Examples
///
/// ```
/// use memres_core::check::LiveBlocks;
/// use memres_core::{Block, Request};
/// let mut live = LiveBlocks::new();
/// live.insert(Block::from_addr(0, 512), Request::new(512)?).unwrap();
/// assert!(live.insert(Block::from_addr(256, 256), Request::new(256)?).is_err());
/// assert_eq!(live.bytes(), 512);
/// live.remove(&Block::from_addr(0, 512)).unwrap();
/// assert!(live.is_empty());
/// # Ok::<(), memres_core::Error>(())
/// ```
#[derive(Debug, Default, Clone)]
pub struct LiveBlocks {
    /// Start address of each live block to its end (start + requested size).
    by_addr: BTreeMap<u64, u64>,
    /// Sum of the requested sizes.
    bytes: u64,
}

impl LiveBlocks {
    /// No live blocks.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records a block handed out for `request`.
    ///
    /// # Errors
    ///
    /// If a zero-byte request gets another block than the empty one, or
    /// another request the empty one; if it is misaligned or sized otherwise
    /// than asked; if it overlaps a live block.
    pub fn insert(&mut self, block: Block, request: Request) -> Result<(), Violation> {
        if block.is_empty() || request.is_zero() {
            return match (block.is_empty(), request.is_zero()) {
                (true, true) => Ok(()),
                (true, false) => Err(Violation::new("empty block for a non-zero request")),
                // The empty block answers it alone (`MemoryResource`'s contract).
                _ => Err(Violation::new("non-empty block for a zero request")),
            };
        }
        if block.size() != request.size() {
            return Err(Violation::new("block size differs from the request"));
        }
        if block.addr() % request.align() != 0 {
            return Err(Violation::new("block not aligned as requested"));
        }
        let end = block.addr().checked_add(block.size()).ok_or(Violation::new("block end overflows"))?;
        if let Some((_, &prev_end)) = self.by_addr.range(..=block.addr()).next_back() {
            if prev_end > block.addr() {
                return Err(Violation::new("block overlaps a live block"));
            }
        }
        if let Some((&next, _)) = self.by_addr.range(block.addr()..).next() {
            if next < end {
                return Err(Violation::new("block overlaps a live block"));
            }
        }
        self.by_addr.insert(block.addr(), end);
        self.bytes += block.size();
        Ok(())
    }

    /// Records that `block` was given back.
    ///
    /// # Errors
    ///
    /// If it was not live with that size.
    pub fn remove(&mut self, block: &Block) -> Result<(), Violation> {
        if block.is_empty() {
            return Ok(());
        }
        match self.by_addr.get(&block.addr()) {
            Some(&end) if end - block.addr() == block.size() => {
                self.by_addr.remove(&block.addr());
                self.bytes -= block.size();
                Ok(())
            }
            Some(_) => Err(Violation::new("freed with another size than allocated")),
            None => Err(Violation::new("freed block was not live")),
        }
    }

    /// Sum of the requested sizes of live blocks.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Number of live blocks.
    pub fn len(&self) -> usize {
        self.by_addr.len()
    }

    /// Whether no block is live.
    pub fn is_empty(&self) -> bool {
        self.by_addr.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::LiveBlocks;
    use crate::{Block, Request};

    /// A zero-byte request is answered with the empty block alone (the
    /// contract of `MemoryResource`): a block of no bytes elsewhere is a
    /// resource's fault, and is not recorded.
    #[test]
    fn a_zero_request_takes_only_the_empty_block() {
        let mut live = LiveBlocks::new();
        let zero = Request::new(0).unwrap();
        assert_eq!(live.insert(Block::EMPTY, zero), Ok(()));
        assert!(live.insert(Block::from_addr(0x1000, 0), zero).is_err());
        assert!(live.is_empty());
        // Nothing recorded at 0x1000 stands in the way of a real block there.
        assert_eq!(live.insert(Block::from_addr(0xf00, 0x200), Request::new(0x200).unwrap()), Ok(()));
    }
}
