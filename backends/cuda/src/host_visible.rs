//! The host-accessible driver allocations live now, pinned and managed, of
//! every resource of this crate: what [`CudaCopy`](crate::CudaCopy) checks
//! its accesses against ([checked access](memres_core::copy#checked-access)).
//!
//! ```text
//!  cuMemHostAlloc / cuMemAllocManaged ──► insert(base, bytes)   (before the block is handed out)
//!  free(base, cuMemFreeHost / cuMemFree)  ──► under the lock: remove, free (put back if refused)
//!  CudaCopy on a range in the table       ──► under the lock: queue the work, wait for the stream
//! ```
//!
//! The driver reads and writes this memory on the host's side: a stale
//! address of it, once freed, may be host memory the process uses for other
//! things. So an allocation leaves the table and is freed under the lock,
//! and `CudaCopy` touches a range in the table only under the lock and until
//! its work has completed.

use crate::sys;
use memres_core::copy::LiveRanges;
use std::sync::{Mutex, MutexGuard};

/// Every host-accessible allocation not yet freed: base to end.
static LIVE: Mutex<LiveRanges> = Mutex::new(LiveRanges::new());

/// The table, locked. No other lock of this crate is taken while it is
/// held; driver calls are made under it.
pub(crate) fn lock() -> MutexGuard<'static, LiveRanges> {
    // The table stays consistent across a panic: each update is one call.
    LIVE.lock().unwrap_or_else(|p| p.into_inner())
}

/// Records the driver allocation `base..base + bytes`, made just now and
/// not handed out yet.
pub(crate) fn insert(base: u64, bytes: usize) {
    lock().insert(base, bytes as u64);
}

/// Frees the allocation at `base` with `release`, under the lock: it leaves the
/// table first and comes back if the driver refuses. An allocation that is
/// not in the table is not freed: `CUDA_ERROR_INVALID_VALUE`.
pub(crate) fn free(base: u64, release: impl FnOnce(u64) -> sys::CuResult) -> sys::CuResult {
    let mut live = lock();
    let Some(bytes) = live.remove(base) else {
        return sys::CUDA_ERROR_INVALID_VALUE;
    };
    let code = release(base);
    if code != sys::CUDA_SUCCESS {
        live.insert(base, bytes);
    }
    code
}

#[cfg(test)]
mod tests {
    use super::*;
    use memres_core::Error;

    #[test]
    fn an_allocation_is_live_until_its_free_succeeds() {
        // Addresses no driver hands out (the test needs no GPU).
        let base = 0xdead_0000_0000;
        insert(base, 4096);
        assert_eq!(lock().check(base + 4000, 96), Ok(()));
        assert_eq!(free(base, |_| sys::CUDA_ERROR_INVALID_CONTEXT), sys::CUDA_ERROR_INVALID_CONTEXT);
        assert_eq!(lock().check(base, 4096), Ok(()), "a refused free keeps it live");
        let mut freed = None;
        assert_eq!(
            free(base, |b| {
                freed = Some(b);
                sys::CUDA_SUCCESS
            }),
            sys::CUDA_SUCCESS
        );
        assert_eq!(freed, Some(base));
        assert_eq!(lock().check(base, 1), Err(Error::NotLive { addr: base, len: 1 }));
        assert_eq!(free(base, |_| panic!("freed twice")), sys::CUDA_ERROR_INVALID_VALUE);
    }
}
