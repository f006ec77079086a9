//! The host-accessible driver allocations live now, pinned and managed, of
//! every resource of this crate: what [`CudaCopy`](crate::CudaCopy) checks
//! its accesses against ([checked access](memres_core::copy#checked-access)).
//!
//! ```text
//!  cuMemHostAlloc / cuMemAllocManaged ──► insert(base, bytes)   (before the block is handed out)
//!  free(base, cuMemFreeHost / cuMemFree)  ──► under the lock: remove, wait for the accesses in it;
//!                                             then free (put back if refused)
//!  CudaCopy on a range in the table       ──► under the lock: check, mark in use (`Access`);
//!                                             then queue the work, wait for the stream, unmark
//! ```
//!
//! The driver reads and writes this memory on the host's side: a stale
//! address of it, once freed, may be host memory the process uses for other
//! things. So an allocation leaves the table under the lock before it is
//! freed, and waits there until no `CudaCopy` access is under way in it;
//! an access is checked against the table and marked under the lock, and
//! unmarked once its work has completed: a free waits for the accesses
//! under way, and none starts after. Neither the driver's free nor an
//! access's wait for its stream holds the lock, as both wait for the
//! device: under it, one would hold up every allocation, free and
//! `CudaCopy` access of pinned or managed memory in the process.
//!
//! A resource's drop frees nothing, and the primary context, whose end
//! would free every allocation in it, is kept for the process. The
//! allocations a resource still has out leave the table when it ends
//! ([`HostAllocations`]) all the same: no one may free them any more, so
//! `CudaCopy` answers `NotLive` on them from then on.

use crate::context::Context;
use crate::live::LiveAllocations;
use crate::place::{allocate_with, deallocate_with, discard_with};
use crate::sys;
use memres_core::copy::LiveRanges;
use memres_core::{Block, Request, Result};
use std::sync::{Condvar, Mutex, MutexGuard};

/// The host-visible allocations and the `CudaCopy` accesses in them.
pub(crate) struct Table {
    /// Every host-accessible allocation not yet freed: base to end.
    pub(crate) live: LiveRanges,
    /// The ranges of the [`Access`]es under way, one entry each (a range
    /// accessed twice at once is here twice); each lay in `live` when its
    /// access began.
    in_use: Vec<(u64, u64)>,
}

static TABLE: Mutex<Table> = Mutex::new(Table { live: LiveRanges::new(), in_use: Vec::new() });

/// Told when an access ends, for the frees waiting for it.
static ENDED: Condvar = Condvar::new();

/// The table, locked. No other lock of this crate is taken while it is
/// held, and no driver call that waits for the device is made under it.
pub(crate) fn lock() -> MutexGuard<'static, Table> {
    // The table stays consistent across a panic: each update is one call.
    TABLE.lock().unwrap_or_else(|p| p.into_inner())
}

/// A `CudaCopy` access of host-visible memory under way: its ranges, which
/// lay in the table when it began, stay in use, and a free of an
/// allocation they touch waits, until it drops.
#[derive(Debug)]
pub(crate) struct Access<const N: usize> {
    ranges: [(u64, u64); N],
}

impl<const N: usize> Access<N> {
    /// Marks `ranges` in use, with `table` (locked) where the caller
    /// checked them.
    pub(crate) fn begin(table: &mut Table, ranges: [(u64, u64); N]) -> Access<N> {
        table.in_use.extend_from_slice(&ranges);
        Access { ranges }
    }
}

impl<const N: usize> Drop for Access<N> {
    fn drop(&mut self) {
        let mut table = lock();
        for range in &self.ranges {
            if let Some(i) = table.in_use.iter().position(|r| r == range) {
                table.in_use.swap_remove(i);
            }
        }
        ENDED.notify_all();
    }
}

/// Takes the allocation at `base` out of the table, then waits until no
/// access is under way in it (none can start once it is out); its length,
/// or `None` if it is not in the table.
fn take_out(base: u64) -> Option<u64> {
    let mut table = lock();
    let bytes = table.live.remove(base)?;
    let end = base.saturating_add(bytes);
    while table.in_use.iter().any(|&(a, n)| a < end && base < a.saturating_add(n)) {
        table = ENDED.wait(table).unwrap_or_else(|p| p.into_inner());
    }
    Some(bytes)
}

/// The allocations of one pinned or managed resource, shared by its clones,
/// and the context they were made in (`C`: [`Context`], retained).
///
/// When the last clone goes, its drop takes the allocations still out
/// (never freed through the resource) out of the table of host-visible
/// allocations, under the table's lock: no `CudaCopy` access can start in
/// them after (one under way may finish: the drop does not wait for it,
/// as it frees nothing). The memory is still allocated (the context is
/// kept for the process), so no other allocation can have been handed its
/// addresses. It is not freed: dropping a resource frees nothing.
#[derive(Debug)]
pub(crate) struct HostAllocations<C = Context> {
    /// The allocations handed out and not yet freed.
    live: LiveAllocations,
    /// Keeps the memory: the driver frees a context's memory with it.
    context: C,
}

impl<C> HostAllocations<C> {
    /// No allocations yet, made in `context`.
    pub(crate) fn new(context: C) -> Self {
        HostAllocations { live: LiveAllocations::default(), context }
    }

    /// The context the allocations are made in.
    pub(crate) fn context(&self) -> &C {
        &self.context
    }

    /// The allocations handed out and not yet freed.
    pub(crate) fn live(&self) -> &LiveAllocations {
        &self.live
    }
}

impl<C> Drop for HostAllocations<C> {
    fn drop(&mut self) {
        let mut table = lock();
        for base in self.live.drain() {
            table.live.remove(base);
        }
    }
}

/// Records the driver allocation `base..base + bytes`, made just now and
/// not handed out yet.
pub(crate) fn insert(base: u64, bytes: usize) {
    lock().live.insert(base, bytes as u64);
}

/// Frees the allocation at `base` with `release`, once it has left the
/// table and no access is under way in it ([`take_out`]); it comes back if
/// the driver refuses, and until then a `CudaCopy` access of it is refused
/// as one of freed memory. An allocation that is not in the table is not
/// freed: `CUDA_ERROR_INVALID_VALUE`.
pub(crate) fn free(base: u64, release: impl FnOnce(u64) -> sys::CuResult) -> sys::CuResult {
    let Some(bytes) = take_out(base) else {
        return sys::CUDA_ERROR_INVALID_VALUE;
    };
    let code = release(base);
    if code != sys::CUDA_SUCCESS {
        // Still allocated, so no allocation since can have been handed
        // its addresses.
        lock().live.insert(base, bytes);
    }
    code
}

/// As [`free`], for an allocation handed out to no one: it leaves the
/// table whatever the driver answers, as no one holds it to free it again
/// (the memory, if the driver kept it, is touched by no one).
fn free_for_good(base: u64, release: impl FnOnce(u64) -> sys::CuResult) -> sys::CuResult {
    if take_out(base).is_none() {
        return sys::CUDA_ERROR_INVALID_VALUE;
    }
    release(base)
}

/// The allocate of a resource of host-visible memory: `alloc` (the
/// driver's call, run with `context` current) through [`allocate_with`],
/// the allocation recorded in the table before the block is handed out
/// (and in `allocations`); one the block cannot be placed in goes back
/// through [`free_for_good`] with `release`. `context` is the context of
/// `allocations`, or for a stream-ordered call the stream's: the default
/// stream handles (null, per-thread) name the current context's streams.
///
/// # Safety
///
/// `release` must free (or queue the free of) an allocation that `alloc`
/// made, called with `context` current by [`free`] or [`free_for_good`]
/// (which have taken it out of the table and waited for the `CudaCopy`
/// accesses in it, so none is under way in it or can start), on a base no
/// one else frees.
pub(crate) unsafe fn allocate(
    allocations: &HostAllocations,
    context: &Context,
    request: Request,
    alloc: impl FnOnce(usize, &mut u64) -> sys::CuResult,
    release: impl FnOnce(u64) -> sys::CuResult,
) -> Result<Block> {
    if request.is_zero() {
        return Ok(Block::EMPTY);
    }
    context.scope(|| {
        allocate_with(
            // Out of memory reports the memory of the allocations' device.
            allocations.context(),
            allocations.live(),
            request,
            |bytes, base| {
                let code = alloc(bytes, base);
                if code == sys::CUDA_SUCCESS {
                    insert(*base, bytes);
                }
                code
            },
            // `base` was just allocated by `alloc` (and put in the table)
            // and is handed out to no one; `free_for_good` releases it
            // once it has left the table (for good: no one could free it
            // later), no access under way, within our `context.scope`: what
            // `release` needs, as our caller promised.
            |base| free_for_good(base, release),
            || None,
        )
    })
}

/// The free of a resource of host-visible memory: [`deallocate_with`]
/// with `context` current (as [`allocate`]'s), whose release goes through
/// [`free`] with `release`.
///
/// # Safety
///
/// As [`allocate`], for the allocations of `allocations`.
pub(crate) unsafe fn deallocate(
    allocations: &HostAllocations,
    context: &Context,
    block: Block,
    release: impl FnOnce(u64) -> sys::CuResult,
) -> Result<()> {
    // `deallocate_with` passes, with `context` current, the base of an
    // allocation of `allocations` that it has just taken out of that table,
    // so no one else frees it; `free` releases it once it has left the
    // host-visible table, no access under way: what `release` needs, as
    // our caller promised.
    deallocate_with(context, allocations.live(), block, |base| free(base, release))
}

/// Gives back `block`, made by [`allocate`] for `allocations` and handed
/// out to no one, through [`place::discard_with`](crate::place::discard_with):
/// its allocation leaves `allocations` and the table of host-visible
/// allocations, and `release` frees it, whatever the driver answers.
///
/// # Safety
///
/// As [`allocate`], for the allocations of `allocations`, with the
/// context `release` needs current.
pub(crate) unsafe fn discard(
    allocations: &HostAllocations,
    block: Block,
    release: impl FnOnce(u64) -> sys::CuResult,
) {
    // `discard_with` passes the base of an allocation of `allocations`
    // that it has just taken out of that table, so no one else frees it;
    // `free_for_good` releases it once it has left the host-visible table,
    // no access under way: what `release` needs, as our caller promised.
    discard_with(allocations.live(), block, |base| free_for_good(base, release))
}

#[cfg(test)]
mod tests {
    use super::*;
    use memres_core::Error;

    #[test]
    fn allocations_still_out_when_their_resource_ends_are_no_longer_live() {
        // Addresses no driver hands out, and that no other test uses.
        let (a, b, other) = (0xbeef_0000_0000, 0xbeef_0001_0000, 0xbeef_0002_0000);
        let allocations = HostAllocations::new(());
        for base in [a, b] {
            insert(base, 4096);
            allocations.live().insert(base, base, 4096);
        }
        insert(other, 64); // another resource's
        drop(allocations);
        for base in [a, b] {
            assert_eq!(lock().live.check(base, 1), Err(Error::NotLive { addr: base, len: 1 }));
            assert_eq!(free(base, |_| panic!("freed")), sys::CUDA_ERROR_INVALID_VALUE);
        }
        assert_eq!(lock().live.check(other, 64), Ok(()), "another resource's allocation stays live");
        assert_eq!(free(other, |_| sys::CUDA_SUCCESS), sys::CUDA_SUCCESS);
    }

    /// An allocation the block cannot be placed in (a driver that broke
    /// its alignment promise) is handed out to no one: it leaves the table
    /// though the driver refuses its free, or it would stay live for good,
    /// after its resource too.
    #[test]
    fn an_allocation_no_block_was_placed_in_leaves_the_table_though_its_free_fails() {
        // An address no driver hands out (the test needs no GPU), not 256-aligned.
        let base = 0xbeef_0003_0001;
        let context = Context::fake(crate::Device::fake(0));
        let allocations = HostAllocations::new(context.clone());
        let request = Request::new(512).unwrap();
        let mut freed = None;
        // SAFETY: nothing is allocated or freed: neither closure calls the driver.
        let got = unsafe {
            allocate(
                &allocations,
                &context,
                request,
                |bytes, b| {
                    assert_eq!(bytes, 512);
                    *b = base;
                    sys::CUDA_SUCCESS
                },
                |b| {
                    freed = Some(b);
                    sys::CUDA_ERROR_INVALID_CONTEXT
                },
            )
        };
        let what = "not aligned to 256 bytes, as the driver promises";
        assert_eq!(got, Err(Error::UpstreamMisbehaved { addr: base, size: 512, what }), "the driver's fault");
        assert_eq!(freed, Some(base), "given back");
        assert_eq!(allocations.live().len(), 0);
        drop(allocations);
        assert_eq!(lock().live.check(base, 1), Err(Error::NotLive { addr: base, len: 1 }));
    }

    /// The driver's frees of this memory wait for the device to be idle:
    /// one under way holds up no other thread's allocation, check or free.
    #[test]
    fn a_free_in_the_driver_holds_up_no_other_use_of_the_table() {
        use std::time::{Duration, Instant};
        // Addresses no driver hands out (the test needs no GPU).
        let (base, other) = (0xdead_0001_0000, 0xdead_0002_0000);
        insert(base, 4096);
        let mut during = None;
        let code = free(base, |_| {
            let t = std::thread::spawn(move || {
                insert(other, 64);
                let check = lock().live.check(base, 1);
                (check, free(other, |_| sys::CUDA_SUCCESS))
            });
            // Held up, it ends only once this free returns.
            let deadline = Instant::now() + Duration::from_secs(10);
            while !t.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
            }
            during = Some((t.is_finished(), t));
            sys::CUDA_SUCCESS
        });
        assert_eq!(code, sys::CUDA_SUCCESS);
        let (ended, t) = during.expect("freed");
        assert!(ended, "another thread's use of the table waited for this free's driver call");
        let (check, freed) = t.join().unwrap();
        assert_eq!(check, Err(Error::NotLive { addr: base, len: 1 }), "out of the table before it is freed");
        assert_eq!(freed, sys::CUDA_SUCCESS);
    }

    /// `CudaCopy`'s accesses mark their ranges in use while their stream
    /// drains, the lock let go: a free of their allocation waits for them
    /// (none starts once it is out of the table), a free of another
    /// allocation does not.
    #[test]
    fn a_free_waits_for_the_accesses_in_its_allocation_only() {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::time::{Duration, Instant};
        // Addresses no driver hands out (the test needs no GPU).
        let (base, other) = (0xdead_0003_0000, 0xdead_0004_0000);
        insert(base, 4096);
        insert(other, 4096);
        let access = Access::begin(&mut lock(), [(base + 100, 8), (other, 8)]);
        let elsewhere = Access::begin(&mut lock(), [(other + 8, 8)]);
        let ended = AtomicBool::new(false);
        std::thread::scope(|s| {
            let f = s.spawn(|| {
                free(base, |_| {
                    assert!(ended.load(Ordering::SeqCst), "freed while an access was under way in it");
                    sys::CUDA_SUCCESS
                })
            });
            // Out of the table first: no access can start in it from then on.
            while lock().live.check(base, 1).is_ok() {
                std::thread::yield_now();
            }
            drop(elsewhere); // touches another allocation: lets nothing through
            ended.store(true, Ordering::SeqCst);
            drop(access);
            assert_eq!(f.join().unwrap(), sys::CUDA_SUCCESS);
        });
        let held = Access::begin(&mut lock(), [(base + 4096, 8)]); // past its end
        let t = std::thread::spawn(move || free(other, |_| sys::CUDA_SUCCESS));
        let deadline = Instant::now() + Duration::from_secs(10);
        while !t.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(t.is_finished(), "a free waited for an access outside its allocation");
        drop(held);
        assert_eq!(t.join().unwrap(), sys::CUDA_SUCCESS);
    }

    #[test]
    fn an_allocation_is_live_until_its_free_succeeds() {
        // Addresses no driver hands out (the test needs no GPU).
        let base = 0xdead_0000_0000;
        insert(base, 4096);
        assert_eq!(lock().live.check(base + 4000, 96), Ok(()));
        assert_eq!(free(base, |_| sys::CUDA_ERROR_INVALID_CONTEXT), sys::CUDA_ERROR_INVALID_CONTEXT);
        assert_eq!(lock().live.check(base, 4096), Ok(()), "a refused free keeps it live");
        let mut freed = None;
        assert_eq!(
            free(base, |b| {
                freed = Some(b);
                sys::CUDA_SUCCESS
            }),
            sys::CUDA_SUCCESS
        );
        assert_eq!(freed, Some(base));
        assert_eq!(lock().live.check(base, 1), Err(Error::NotLive { addr: base, len: 1 }));
        assert_eq!(free(base, |_| panic!("freed twice")), sys::CUDA_ERROR_INVALID_VALUE);
    }
}
