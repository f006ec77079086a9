//! The arena table: which arena serves which stream or thread, found
//! without a lock, claimed and given up as streams and threads come and go.

use super::local::Local;
use super::{ArenaResource, Owner};
use crate::lock::RawLock;
use crate::primitive::{spin_loop, AtomicU64, Ordering};
use crate::{Error, Result, Stream};

/// An arena's [`Owner`] as the slot table names it: (`STREAM`, stream id)
/// or (`THREAD`, thread number); `NOBODY` for a free slot. Two words to
/// compare on the hot path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct OwnerKey {
    pub(super) kind: u64,
    pub(super) key: u64,
}

impl OwnerKey {
    pub(super) const NOBODY: OwnerKey = OwnerKey { kind: EMPTY, key: 0 };

    /// The caller's: its thread on the default stream, else its stream.
    #[inline]
    pub(super) fn of_caller(stream_id: u64) -> Self {
        if stream_id == 0 {
            OwnerKey { kind: THREAD, key: thread_no::current() }
        } else {
            OwnerKey { kind: STREAM, key: stream_id }
        }
    }

    pub(super) fn owner(self) -> Option<Owner> {
        match self.kind {
            STREAM => Some(Owner::Stream(self.key)),
            THREAD => Some(Owner::Thread(self.key)),
            _ => None,
        }
    }

    /// The stream id whose work the arena's frees are ordered on.
    pub(super) fn stream_id(self) -> u64 {
        if self.kind == STREAM {
            self.key
        } else {
            0
        }
    }
}

/// Slot states of the arena table.
pub(super) const EMPTY: u64 = 0;
pub(super) const CLAIMING: u64 = 1;
pub(super) const STREAM: u64 = 2;
pub(super) const THREAD: u64 = 3;

/// One entry of the arena table: written when claimed or retired, else
/// only read, so lookups by every thread share its cache line without
/// contention. It only points callers to an arena: the arena's `owner`,
/// read under its lock, decides (a lookup racing with a change of hands may
/// read a stale entry).
#[derive(Debug)]
pub(super) struct SlotKey {
    /// `EMPTY`, `CLAIMING`, `STREAM` or `THREAD`; back to `EMPTY` when the
    /// arena is retired (under its lock).
    pub(super) state: AtomicU64,
    /// The stream id or thread number; valid once `state` is `STREAM` or `THREAD`.
    pub(super) key: AtomicU64,
}

/// The calling thread's number: small, unique among live threads, reused
/// after a thread exits (so that its arena, and the superblocks it holds,
/// go to the next new thread rather than being stranded).
///
/// Under `cfg(loom)` the same code runs on loom's thread-locals (whose
/// destructors run when a loom thread ends), atomics and lock, and its
/// statics are loom's `lazy_static`s, made afresh for each execution: loom
/// models the per-thread arenas, numbers handed on included.
#[cfg(feature = "std")]
pub(super) mod thread_no {
    use alloc::vec::Vec;
    #[cfg(not(loom))]
    use core::sync::atomic::{AtomicU64, Ordering};
    #[cfg(loom)]
    use loom::{
        sync::atomic::{AtomicU64, Ordering},
        sync::Mutex,
        thread_local,
    };
    #[cfg(not(loom))]
    use std::{sync::Mutex, thread_local};

    #[cfg(not(loom))]
    static NEXT: AtomicU64 = AtomicU64::new(1);
    #[cfg(not(loom))]
    static FREED: Mutex<Vec<u64>> = Mutex::new(Vec::new());
    #[cfg(loom)]
    loom::lazy_static! {
        static ref NEXT: AtomicU64 = AtomicU64::new(1);
        static ref FREED: Mutex<Vec<u64>> = Mutex::new(Vec::new());
    }

    struct No(u64);

    impl Drop for No {
        fn drop(&mut self) {
            // A failed loom execution unwinds its threads after its state,
            // these statics included, is gone.
            #[cfg(loom)]
            if std::thread::panicking() {
                return;
            }
            FREED.lock().unwrap_or_else(|p| p.into_inner()).push(self.0);
        }
    }

    thread_local! {
        static NO: No = No(FREED.lock().unwrap_or_else(|p| p.into_inner()).pop()
            .unwrap_or_else(|| NEXT.fetch_add(1, Ordering::Relaxed)));
    }

    /// This thread's number (0 while its thread-locals are being destroyed).
    #[inline]
    pub(super) fn current() -> u64 {
        NO.try_with(|n| n.0).unwrap_or(0)
    }

    /// Whether every number handed out has been given back: every thread
    /// that took one has run its thread-locals' destructors.
    #[cfg(loom)]
    pub(crate) fn all_given_back() -> bool {
        let freed = FREED.lock().unwrap_or_else(|p| p.into_inner()).len() as u64;
        freed == NEXT.load(Ordering::Relaxed) - 1
    }
}

/// Without `std` there is no thread identity: all threads share one arena
/// for the default stream.
#[cfg(not(feature = "std"))]
pub(super) mod thread_no {
    #[inline]
    pub(super) fn current() -> u64 {
        0
    }
}

impl<U, L: RawLock> ArenaResource<U, L> {
    pub(super) fn claimed(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.keys.len())
            .filter(|&i| matches!(self.keys[i].state.load(Ordering::Acquire), STREAM | THREAD))
    }

    /// The stream id that slot `i` serves (0 for per-thread arenas).
    #[inline]
    pub(super) fn stream_of(&self, i: usize) -> u64 {
        let k = &self.keys[i];
        match k.state.load(Ordering::Acquire) {
            STREAM => k.key.load(Ordering::Relaxed),
            _ => 0,
        }
    }

    /// The slot the table names for `me`, if any: probes from the hash of
    /// `me`, past empty slots (slots are retired), so a miss reads them all.
    #[inline]
    pub(super) fn find_slot(&self, me: OwnerKey) -> Option<usize> {
        let OwnerKey { kind, key } = me;
        for i in self.probe_order(me) {
            let k = &self.keys[i];
            loop {
                match k.state.load(Ordering::Acquire) {
                    CLAIMING => spin_loop(),
                    s => {
                        if s == kind && k.key.load(Ordering::Relaxed) == key {
                            return Some(i);
                        }
                        break;
                    }
                }
            }
        }
        None
    }

    /// Every slot, from `me`'s home slot (found by hashing) on.
    #[inline]
    pub(super) fn probe_order(&self, me: OwnerKey) -> impl Iterator<Item = usize> {
        let n = self.keys.len();
        let start = ((me.key ^ me.kind).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32) as usize % n;
        (0..n).map(move |p| if start + p >= n { start + p - n } else { start + p })
    }

    /// A slot for `me`, who has none: an empty one, else one freed by
    /// retiring idle arenas (after taking back the superblocks of the
    /// arenas with nothing live, as when running dry).
    #[cold]
    pub(super) fn claim_slot<S: Stream + ?Sized>(&self, me: OwnerKey, stream: &S) -> Result<usize> {
        for round in 0..2 {
            if let Some(i) = self.find_slot(me).or_else(|| self.claim_empty(me)) {
                return Ok(i);
            }
            // Superblocks taken only from arenas they keep from going idle.
            if round == 0 && self.retire_idle() == 0 {
                self.reclaim(stream, |_, a| !a.has_live())?;
                self.retire_idle();
            }
        }
        Err(Error::CapacityExhausted { capacity: self.keys.len() as u32 })
    }

    /// Claims an empty slot for `me`, the first in `me`'s probe order.
    pub(super) fn claim_empty(&self, me: OwnerKey) -> Option<usize> {
        let OwnerKey { kind, key } = me;
        for i in self.probe_order(me) {
            let k = &self.keys[i];
            if k.state.load(Ordering::Relaxed) != EMPTY
                || k.state.compare_exchange(EMPTY, CLAIMING, Ordering::Acquire, Ordering::Relaxed).is_err()
            {
                continue;
            }
            // An empty slot's arena is idle (it was retired so): it only
            // needs its owner.
            self.arenas[i].0.with(|a| a.set_owner(me));
            k.key.store(key, Ordering::Relaxed);
            k.state.store(kind, Ordering::Release);
            return Some(i);
        }
        None
    }

    /// Frees the slots of idle arenas (nothing live, no superblock): each
    /// may serve a new stream or thread. Returns how many.
    pub(super) fn retire_idle(&self) -> usize {
        self.retire(|_, _| true)
    }

    /// Frees the slots of the idle arenas that `pick` names (by slot and
    /// state, under the arena's lock). Returns how many.
    pub(super) fn retire(&self, mut pick: impl FnMut(usize, &Local) -> bool) -> usize {
        let mut freed = 0;
        for (i, (k, arena)) in self.keys.iter().zip(&self.arenas[..]).enumerate() {
            if !matches!(k.state.load(Ordering::Relaxed), STREAM | THREAD) {
                continue;
            }
            // An arena whose lock the call this one comes from holds
            // (through the upstream) is in use.
            let _ = arena.0.try_with(|a| {
                // Under the arena's lock, so no allocation of its owner is
                // under way; a slot still being claimed is left alone.
                if a.owner() != OwnerKey::NOBODY
                    && a.is_idle()
                    && matches!(k.state.load(Ordering::Acquire), STREAM | THREAD)
                    && pick(i, a)
                {
                    a.set_owner(OwnerKey::NOBODY);
                    k.state.store(EMPTY, Ordering::Release);
                    freed += 1;
                }
            });
        }
        freed
    }
}
