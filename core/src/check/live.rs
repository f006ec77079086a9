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
    /// If it is misaligned, smaller than asked, or overlaps a live block.
    pub fn insert(&mut self, block: Block, request: Request) -> Result<(), Violation> {
        if block.is_empty() {
            return if request.is_zero() {
                Ok(())
            } else {
                Err(Violation::new("empty block for a non-zero request"))
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
