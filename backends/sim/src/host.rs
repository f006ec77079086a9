use crate::tally::{accessors, Tally};
use memres_core::check::Violation;
use memres_core::copy::LiveRanges;
use memres_core::{Block, Error, Inspect, MemoryResource, Request, Result, Stream, Usage};
use std::alloc::Layout;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

#[cfg(test)]
mod tests;

/// Real host memory from the global allocator: the upstream for containers,
/// tests and replays that want bytes behind their addresses.
///
/// ```text
///  allocate(req) ──► std::alloc::alloc_zeroed(size rounded to 256, req.align)
///                     └ record addr ─► outstanding: addr → layout
///                                      LIVE (every HostMemory): addr..addr + size
///  deallocate(b) ──► look b.addr up in outstanding ── missing ─► UnknownBlock
///                     ├ found, b's tag another's ─► DoubleFree
///                     └ found, sizes agree ─► under LIVE's lock: remove, dealloc
/// ```
///
/// A block's address is the pointer as a number, its tag a number no other
/// block of the process had. Every free is checked against the table of
/// outstanding allocations before memory goes back to the global
/// allocator, so an unknown or repeated free is an [`Error::UnknownBlock`]
/// value, or [`Error::DoubleFree`] where the allocator handed the address
/// out again (the tag tells; a bare address, [`Block::NO_TAG`], is freed by
/// its address), never undefined behaviour nor the free of another
/// holder's block. Whatever is
/// still outstanding when the resource is dropped is freed then.
///
/// The live allocations of all `HostMemory`s are also listed in one
/// process-wide table, [`LiveRanges`] under a lock, which
/// [`HostCopy`](crate::HostCopy) checks each access against and performs it
/// under; memory leaves the table under that lock as it is freed. Blocks are
/// zeroed when allocated. So a container whose block other code freed, or
/// whose `HostMemory` was dropped, gets [`Error::NotLive`] or, at worst, the
/// bytes of whoever holds that memory now: never freed or uninitialized
/// memory (see [checked access](memres_core::copy#checked-access)). The
/// cost: one more lock taken by each allocation and free, and by each copy
/// (process-wide: host copies do not run in parallel), and zeroing; this is
/// the backend for tests and embedding, not for speed.
///
/// The resource never touches its blocks or makes references to them.
/// Unsafe code that reads or writes a block's bytes through its address (as
/// a test might) gets no such guard: the table guards `HostCopy`'s
/// accesses, not raw ones, and knows which ranges are live, not whose. A
/// stale container of any `HostMemory` of the process writes a block whose
/// address the allocator handed out again, so such code must hold no
/// reference to the bytes while containers over host memory may run
/// elsewhere (see `MemoryOf`).
///
/// # Examples
///
/// ```
/// use memres_core::{Inspect, MemoryResource, Request};
/// use memres_sim::HostMemory;
/// let host = HostMemory::new();
/// let b = host.allocate(Request::aligned(1000, 4096)?, &())?;
/// assert_eq!(b.addr() % 4096, 0);
/// assert_eq!(host.usage().held, 1024);
/// host.deallocate(b, &())?;
/// assert!(host.deallocate(b, &()).is_err());
/// assert_eq!((host.usage().held, host.usage().peak_held), (0, 1024));
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
    /// The sum of the layouts' sizes in `outstanding`, and calls.
    tally: Tally,
}

#[derive(Debug, Clone, Copy)]
struct Outstanding {
    layout: Layout,
    /// The size the caller asked for, which its free must repeat.
    requested: u64,
    /// The block's tag, which its free repeats or leaves out.
    tag: u64,
}

/// The next block's tag: one count for every `HostMemory`, so that a stale
/// block never bears the tag of a live one at its address.
static NEXT_TAG: AtomicU64 = AtomicU64::new(0);

/// Every allocation of every `HostMemory` not yet freed: what `HostCopy`
/// checks its accesses against. Memory is freed only while this lock is held
/// and after its range has left the table.
static LIVE: Mutex<LiveRanges> = Mutex::new(LiveRanges::new());

/// The process-wide table of live host allocations, locked. Taken after a
/// resource's own lock, never before.
pub(crate) fn live() -> MutexGuard<'static, LiveRanges> {
    // The table stays consistent across a panic: each update is one call.
    LIVE.lock().unwrap_or_else(|p| p.into_inner())
}

/// The tests of this crate that allocate host memory run together; the one
/// that hands [`HostCopy`](crate::HostCopy) freed addresses runs alone: the
/// allocator may give a freed address to another test's block, which the
/// access would then find live and write (under that test's `&mut`, where
/// it holds one). Only `HostMemory` lists memory in `LIVE`, and every test
/// that makes one holds this lock.
#[cfg(test)]
static HOST_TESTS: std::sync::RwLock<()> = std::sync::RwLock::new(());

/// For a test that allocates host memory: it runs beside the others but
/// not beside [`host_test_alone`]'s.
#[cfg(test)]
pub(crate) fn host_tests_together() -> std::sync::RwLockReadGuard<'static, ()> {
    HOST_TESTS.read().unwrap_or_else(|p| p.into_inner())
}

/// For a test that hands `HostCopy` freed addresses: no other test holds
/// host memory while it runs.
#[cfg(test)]
pub(crate) fn host_test_alone() -> std::sync::RwLockWriteGuard<'static, ()> {
    HOST_TESTS.write().unwrap_or_else(|p| p.into_inner())
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

    accessors!();

    /// Number of allocations not yet freed.
    pub fn live_count(&self) -> usize {
        self.lock().outstanding.len()
    }

    /// Locks the process-wide table of live host allocations (of every
    /// `HostMemory`) until the guard is dropped: what a fork handler holds
    /// across `fork`, dropping it in the parent and in the child. A child
    /// that inherited the table locked by another thread of the parent
    /// (in an allocation, a free or a [`HostCopy`](crate::HostCopy) copy)
    /// would wait for ever in each of its own. It waits for the table's
    /// holder, if any; it takes no resource's lock (each is taken before
    /// the table, never after). The thread that holds the guard must not
    /// allocate, free or copy host memory until it drops it: each of those
    /// takes the table, and would wait for ever.
    pub fn lock_table() -> impl Sized + 'static {
        live()
    }
}

/// A leaf: it holds what it handed out. The checker checks that the bytes
/// it counts are those of its table.
impl Inspect for HostMemory {
    fn usage(&self) -> Usage {
        self.lock().tally.usage()
    }

    fn check(&self) -> std::result::Result<(), Violation> {
        let s = self.lock();
        let listed = s.outstanding.values().map(|o| o.layout.size() as u64).sum();
        s.tally.check_held(listed, "bytes held out differ from the table's")
    }
}

impl<S: Stream + ?Sized> MemoryResource<S> for HostMemory {
    fn allocate(&self, request: Request, _stream: &S) -> Result<Block> {
        if request.is_zero() {
            return Ok(Block::EMPTY);
        }
        let size = request.rounded_size(256);
        let too_big =
            Error::InvalidSize { size: request.size(), what: "more than host memory's allocator takes" };
        let layout =
            Layout::from_size_align(usize::try_from(size).map_err(|_| too_big)?, request.align() as usize)
                .map_err(|_| too_big)?;
        // SAFETY: `layout` has a non-zero size (the request is not zero and
        // rounding up keeps it so), which is all `alloc_zeroed` requires.
        // Zeroed: a stale holder of a freed block may read a fresh one.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        let mut s = self.lock();
        if ptr.is_null() {
            return Err(Error::OutOfMemory {
                requested: request.size(),
                largest_free: 0,
                pool_size: s.tally.held,
                max_size: None,
            });
        }
        let addr = ptr as u64;
        let tag = NEXT_TAG.fetch_add(1, Ordering::Relaxed);
        s.outstanding.insert(addr, Outstanding { layout, requested: request.size(), tag });
        live().insert(addr, size);
        s.tally.allocated(size);
        Ok(Block::new(addr, request.size(), tag))
    }

    fn deallocate(&self, block: Block, _stream: &S) -> Result<()> {
        if block.is_empty() {
            return Ok(());
        }
        let mut s = self.lock();
        let addr = block.addr();
        let entry = *s.outstanding.get(&addr).ok_or(Error::UnknownBlock { addr })?;
        if block.tag() != Block::NO_TAG && block.tag() != entry.tag {
            // A block freed before, whose address was handed out again.
            return Err(Error::DoubleFree { addr });
        }
        if entry.requested != block.size() {
            return Err(Error::SizeMismatch { addr, expected: entry.requested, given: block.size() });
        }
        s.outstanding.remove(&addr);
        s.tally.freed(entry.layout.size() as u64);
        // SAFETY: `addr` was in `outstanding` with `entry.layout` and has
        // just been taken out, under the resource's lock.
        unsafe { free(&mut live(), addr, entry.layout) };
        Ok(())
    }
}

/// Gives the allocation at `addr` back to the global allocator, taking it
/// out of `live` (the locked [`LIVE`]) first.
///
/// # Safety
///
/// `addr` must be an entry the caller has just taken out of a resource's
/// `outstanding`, with its `layout`.
unsafe fn free(live: &mut LiveRanges, addr: u64, layout: Layout) {
    live.remove(addr);
    // SAFETY: `addr` came out of `outstanding`, so it is a pointer that
    // `alloc_zeroed` returned with exactly `layout` and that has not been
    // freed since (entries leave `outstanding` before their memory goes
    // back, so no one frees it twice). It has left `LIVE` while its lock is
    // held, so no `HostCopy` access is under way in it or will start in it.
    unsafe { std::alloc::dealloc(addr as *mut u8, layout) };
}

// SAFETY: a block's `size()` bytes lie inside the allocation of
// `request.rounded_size(256)` bytes that `alloc_zeroed` returned for it:
// live, initialized host memory, which `HostCopy` reads and writes by
// pointer, until `deallocate` or the resource's drop gives it back. The
// global allocator hands out disjoint allocations, the resource keeps its
// table apart from them and never touches them or makes references to
// them. Checked access: every allocation is in `LIVE` from before its block
// is handed out until it is freed, which happens under `LIVE`'s lock after
// it left the table; `HostCopy` touches only ranges inside one entry of
// `LIVE` and only while holding that lock. So a block freed by other code
// or by the resource's drop is never touched again.
unsafe impl memres_core::copy::MemoryOf<crate::HostCopy> for HostMemory {}

impl Drop for HostMemory {
    fn drop(&mut self) {
        let s = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        let mut live = live();
        for (addr, entry) in s.outstanding.drain() {
            // SAFETY: draining the table takes each entry out once, with
            // its layout.
            unsafe { free(&mut live, addr, entry.layout) };
        }
    }
}
