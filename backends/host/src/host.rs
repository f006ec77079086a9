use memres_core::{Block, Error, MemoryResource, Request, Result, Stream};
use std::alloc::Layout;
use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

#[cfg(test)]
mod tests;

/// Real host memory from the global allocator: the upstream for containers,
/// tests and replays that want bytes behind their addresses.
///
/// ```text
///  allocate(req) ──► std::alloc::alloc(size rounded to 256, req.align)
///                     └ record addr ─► outstanding: addr → layout
///  deallocate(b) ──► look b.addr up in outstanding ── missing ─► UnknownBlock
///                     └ found, sizes agree ─► std::alloc::dealloc
/// ```
///
/// A block's address is the pointer as a number. Every free is checked
/// against the table of outstanding allocations before memory goes back to
/// the global allocator, so an unknown or repeated free is an
/// [`Error::UnknownBlock`] value, never undefined behaviour. Whatever is
/// still outstanding when the resource is dropped is freed then.
///
/// # Examples
///
/// ```
/// use memres_core::{MemoryResource, Request};
/// use memres_host::HostMemory;
/// let host = HostMemory::new();
/// let b = host.allocate(Request::aligned(1000, 4096)?, &())?;
/// assert_eq!(b.addr() % 4096, 0);
/// assert_eq!(host.held_bytes(), 1024);
/// host.deallocate(b, &())?;
/// assert!(host.deallocate(b, &()).is_err());
/// assert_eq!((host.held_bytes(), host.peak_held_bytes()), (0, 1024));
/// # Ok::<(), memres_core::Error>(())
/// ```
#[derive(Debug, Default)]
pub struct HostMemory {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Every allocation not yet freed: its address and the exact layout it
    /// was allocated with (the only layout `dealloc` may be given).
    outstanding: HashMap<u64, Outstanding>,
    /// Sum of the layouts' sizes in `outstanding`.
    held: u64,
    /// Highest `held` ever (or since the last reset).
    peak: u64,
    allocations: u64,
    frees: u64,
}

#[derive(Debug, Clone, Copy)]
struct Outstanding {
    layout: Layout,
    /// The size the caller asked for, which its free must repeat.
    requested: u64,
}

impl HostMemory {
    /// An empty resource.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state stays consistent across a panic: every update of it is
        // made after the fallible steps.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Bytes held by callers now (sizes rounded to 256).
    pub fn held_bytes(&self) -> u64 {
        self.lock().held
    }

    /// The most bytes ever held at once.
    pub fn peak_held_bytes(&self) -> u64 {
        self.lock().peak
    }

    /// Forgets the peak: it restarts from what is held now.
    pub fn reset_peak(&self) {
        let mut s = self.lock();
        s.peak = s.held;
    }

    /// Number of allocations not yet freed.
    pub fn outstanding(&self) -> usize {
        self.lock().outstanding.len()
    }

    /// Number of successful allocations and frees so far.
    pub fn call_counts(&self) -> (u64, u64) {
        let s = self.lock();
        (s.allocations, s.frees)
    }
}

impl<S: Stream + ?Sized> MemoryResource<S> for HostMemory {
    fn allocate(&self, request: Request, _stream: &S) -> Result<Block> {
        if request.is_zero() {
            return Ok(Block::EMPTY);
        }
        let size = request.rounded_size(256);
        let too_big = Error::InvalidSize { size: request.size() };
        let layout =
            Layout::from_size_align(usize::try_from(size).map_err(|_| too_big)?, request.align() as usize)
                .map_err(|_| too_big)?;
        // SAFETY: `layout` has a non-zero size (the request is not zero and
        // rounding up keeps it so), which is all `alloc` requires.
        let ptr = unsafe { std::alloc::alloc(layout) };
        let mut s = self.lock();
        if ptr.is_null() {
            return Err(Error::OutOfMemory {
                requested: request.size(),
                largest_free: 0,
                pool_size: s.held,
                max_size: None,
            });
        }
        let addr = ptr as u64;
        s.outstanding.insert(addr, Outstanding { layout, requested: request.size() });
        s.held += size;
        s.peak = s.peak.max(s.held);
        s.allocations += 1;
        Ok(Block::new(addr, request.size(), Block::NO_TAG))
    }

    fn deallocate(&self, block: Block, _stream: &S) -> Result<()> {
        if block.is_empty() {
            return Ok(());
        }
        let mut s = self.lock();
        let addr = block.addr();
        let entry = *s.outstanding.get(&addr).ok_or(Error::UnknownBlock { addr })?;
        if entry.requested != block.size() {
            return Err(Error::SizeMismatch { addr, expected: entry.requested, given: block.size() });
        }
        s.outstanding.remove(&addr);
        s.held -= entry.layout.size() as u64;
        s.frees += 1;
        // SAFETY: `addr` was in `outstanding`, so it is a pointer that
        // `alloc` returned with exactly `entry.layout` and that has not been
        // freed since (entries are removed, as just now, before their memory
        // goes back). Removing it first makes a second free of it an error.
        unsafe { std::alloc::dealloc(addr as *mut u8, entry.layout) };
        Ok(())
    }
}

// SAFETY: a block's `size()` bytes lie inside the allocation of
// `request.rounded_size(256)` bytes that `alloc` returned for it: live host
// memory, which `HostCopy` reads and writes by pointer, until `deallocate`
// or the resource's drop gives it back. The global allocator hands out disjoint
// allocations, and the resource keeps its table apart from them.
unsafe impl memres_core::copy::MemoryOf<crate::HostCopy> for HostMemory {}

impl Drop for HostMemory {
    fn drop(&mut self) {
        let s = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        for (addr, entry) in s.outstanding.drain() {
            // SAFETY: as in `deallocate`: every entry of `outstanding` is a
            // live pointer from `alloc` with this layout, and draining the
            // table frees each exactly once.
            unsafe { std::alloc::dealloc(addr as *mut u8, entry.layout) };
        }
    }
}
