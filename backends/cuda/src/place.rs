//! Placing blocks in driver allocations: alignment above the driver's, the
//! tag that remembers the padding, and the out-of-memory figures.

use crate::context::Context;
use crate::error::{check_free, error_from_code};
use crate::live::LiveAllocations;
use crate::sys;
use memres_core::{Block, Error, Request, Result};

/// The alignment every driver allocation has (CUDA guarantees 256 bytes).
pub(crate) const DRIVER_ALIGN: u64 = 256;

/// Tags of this crate's blocks: a marker in the top 16 bits, and below it
/// the padding between the driver's allocation and the block (non-zero only
/// for alignments above 256 bytes).
const TAG_MARK: u64 = 0xC0DA << 48;
const PAD_MASK: u64 = (1 << 48) - 1;

/// Bytes to ask the driver for so that a block of `request` fits at its
/// alignment in an allocation aligned to [`DRIVER_ALIGN`].
pub(crate) fn padded_size(request: Request) -> Result<usize> {
    // Requests are at most 2^62 bytes aligned to at most 2^40: no overflow.
    let bytes = request.size() + request.align().saturating_sub(DRIVER_ALIGN);
    usize::try_from(bytes)
        .map_err(|_| Error::InvalidSize { size: request.size(), what: "more than a usize holds" })
}

/// The block of `request` in the driver allocation `base..base + bytes`, or
/// `None` if the driver broke its alignment promise and it does not fit.
pub(crate) fn place(base: u64, bytes: usize, request: Request) -> Option<Block> {
    let mask = request.align() - 1;
    let addr = base.checked_add(mask)? & !mask;
    let pad = addr - base;
    (pad + request.size() <= bytes as u64).then(|| Block::new(addr, request.size(), TAG_MARK | pad))
}

/// The driver allocation a block lives in. A block without this crate's
/// tag (known by its address only) is taken to start its allocation.
pub(crate) fn base_of(block: Block) -> Result<u64> {
    let tag = block.tag();
    if tag & !PAD_MASK != TAG_MARK {
        return Ok(block.addr());
    }
    block.addr().checked_sub(tag & PAD_MASK).ok_or(Error::UnknownBlock { addr: block.addr() })
}

/// The error when the driver's allocation of `bytes` at `base` does not
/// have the alignment it promises: the driver, this resource's upstream,
/// broke its contract ([`Error::UpstreamMisbehaved`]), not a request's.
pub(crate) fn misaligned(base: u64, bytes: usize) -> Error {
    Error::UpstreamMisbehaved {
        addr: base,
        size: bytes as u64,
        what: "not aligned to 256 bytes, as the driver promises",
    }
}

/// Runs a driver allocation `alloc(bytes, &mut base)` for `request` and
/// places the block in it; out of memory gets the figures (`pool_size`: the
/// bytes the resource holds, if it knows; else the device's bytes in use).
/// Callers make the context current first.
pub(crate) fn allocate_with(
    context: &Context,
    live: &LiveAllocations,
    request: Request,
    alloc: impl FnOnce(usize, &mut u64) -> sys::CuResult,
    free: impl FnOnce(u64) -> sys::CuResult,
    pool_size: impl FnOnce() -> Option<u64>,
) -> Result<Block> {
    if request.is_zero() {
        return Ok(Block::EMPTY);
    }
    let bytes = padded_size(request)?;
    let mut base = 0;
    match alloc(bytes, &mut base) {
        sys::CUDA_SUCCESS => {}
        sys::CUDA_ERROR_OUT_OF_MEMORY => return Err(out_of_memory(context, request.size(), pool_size())),
        code => return Err(error_from_code(code)),
    }
    match place(base, bytes, request) {
        Some(block) => {
            live.insert(base, block.addr(), block.size());
            Ok(block)
        }
        None => {
            // Nothing to do if giving it back fails too: report the first error.
            let _ = free(base);
            Err(misaligned(base, bytes))
        }
    }
}

/// The free of a resource that keeps its blocks in `live`: takes `block`'s
/// allocation out of the table (so no one frees it twice), gives it back
/// with `free` (called with our context current, on the base address), and
/// puts it back in the table if the driver refuses, so that the block stays
/// live and accounted.
///
/// # Errors
///
/// The table's answer to a block it does not hold; the driver's error.
pub(crate) fn deallocate_with(
    context: &Context,
    live: &LiveAllocations,
    block: Block,
    free: impl FnOnce(u64) -> sys::CuResult,
) -> Result<()> {
    if block.is_empty() {
        return Ok(());
    }
    let base = base_of(block)?;
    live.remove(base, block.addr(), block.size())?;
    let freed = context.scope(|| check_free(free(base), block.addr()));
    if freed.is_err() {
        live.restore(base, block.addr(), block.size());
    }
    freed
}

/// Gives back `block`, of a resource that keeps its blocks in `live`,
/// which was allocated and handed out to no one: takes its allocation out
/// of the table and frees it with `free` (called on the base address, with
/// the allocation's context current). It stays out of the table whatever
/// the driver answers: no one else holds the block to free it again.
pub(crate) fn discard_with(live: &LiveAllocations, block: Block, free: impl FnOnce(u64) -> sys::CuResult) {
    // A block of ours: its tag names its allocation.
    let Ok(base) = base_of(block) else { return };
    if live.remove(base, block.addr(), block.size()).is_ok() {
        // Nothing else to do if the driver refuses: no one can free it.
        let _ = free(base);
    }
}

/// [`Error::OutOfMemory`] for `requested` bytes: the largest free block is
/// at most the device's free memory (`cuMemGetInfo`), the maximum is the
/// device's memory. Figures the driver cannot give are 0.
pub(crate) fn out_of_memory(context: &Context, requested: u64, pool_size: Option<u64>) -> Error {
    let (free, total) = context.memory_info().map(|m| (m.free, m.total)).unwrap_or((0, 0));
    Error::OutOfMemory {
        requested,
        largest_free: free,
        pool_size: pool_size.unwrap_or(total.saturating_sub(free)),
        max_size: (total > 0).then_some(total),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_alignment_needs_no_padding() {
        let r = Request::new(1000).unwrap();
        assert_eq!(padded_size(r).unwrap(), 1000);
        let b = place(0x10_0000, 1000, r).unwrap();
        assert_eq!((b.addr(), b.size()), (0x10_0000, 1000));
        assert_eq!(base_of(b).unwrap(), 0x10_0000);
    }

    #[test]
    fn large_alignment_is_padded_and_the_padding_remembered() {
        let r = Request::aligned(1000, 4096).unwrap();
        let bytes = padded_size(r).unwrap();
        assert_eq!(bytes, 1000 + 4096 - 256);
        // Every 256-aligned base gives a 4096-aligned block inside the allocation.
        for k in 0..16u64 {
            let base = 0x7000_0000 + k * 256;
            let b = place(base, bytes, r).unwrap();
            assert_eq!(b.addr() % 4096, 0);
            assert!(b.addr() >= base && b.addr() + 1000 <= base + bytes as u64);
            assert_eq!(base_of(b).unwrap(), base);
        }
    }

    #[test]
    fn foreign_and_address_only_blocks_start_their_allocation() {
        assert_eq!(base_of(Block::from_addr(0x5000, 10)).unwrap(), 0x5000);
        assert_eq!(base_of(Block::new(0x5000, 10, 7)).unwrap(), 0x5000);
        // A marked tag with more padding than the address: never underflow.
        assert_eq!(
            base_of(Block::new(0x100, 10, TAG_MARK | 0x200)),
            Err(Error::UnknownBlock { addr: 0x100 })
        );
    }

    #[test]
    fn a_misaligned_driver_allocation_is_refused() {
        let r = Request::new(512).unwrap();
        assert_eq!(place(0x1001, 512, r), None);
    }
}
