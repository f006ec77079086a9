//! The unmap checker: memory is taken away only once the work that used
//! it is done.

use crate::SimStream;
use memres_core::vmem::{ReservableSpace, DECOMMITTED_IN_PART};
use memres_core::{Error, Range, Result, Stream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// A [`ReservableSpace`] that checks its decommits: a range the caller
/// says was used by the work of a stream up to some position
/// ([`used`](Self::used)) may be decommitted only once the host has
/// observed that work complete (a synchronization of that stream, of one
/// ordered after it, or of its device). The streams may be of any
/// [`SimWorld`](crate::SimWorld): each is checked in its own. A decommit that takes such memory
/// too early is counted ([`early_unmaps`](Self::early_unmaps)); on a GPU it
/// would unmap memory a kernel still touches.
///
/// # Examples
///
/// ```
/// use memres_core::vmem::ReservableSpace;
/// use memres_core::Stream;
/// use memres_sim::{SimAddressSpace, SimWorld, UnmapChecked};
/// let world = SimWorld::new();
/// let (a, b) = (world.non_blocking_stream(), world.non_blocking_stream());
/// let space = UnmapChecked::new(SimAddressSpace::new(1 << 30, 2 << 20)?);
/// let r = space.reserve(4 << 20)?;
/// space.commit(r)?;
/// a.enqueue(); // a kernel on `a`, still to run, that uses `r`
/// space.used(r, &a);
/// space.decommit(r, &b)?; // ordered on `b`, which never waited on `a`
/// assert_eq!(space.early_unmaps(), 1);
/// space.commit(r)?;
/// space.used(r, &a);
/// space.decommit(r, &a)?; // after `a`'s work
/// assert_eq!(space.early_unmaps(), 1);
/// # Ok::<(), memres_core::Error>(())
/// ```
#[derive(Debug)]
pub struct UnmapChecked<V> {
    space: V,
    /// Ranges in use: the range, the stream (its id names it in its world
    /// only), the stream's position then.
    used: Mutex<Vec<(Range, SimStream, u64)>>,
    early: AtomicUsize,
}

impl<V> UnmapChecked<V> {
    /// Checks the decommits of `space`.
    pub fn new(space: V) -> Self {
        UnmapChecked { space, used: Mutex::new(Vec::new()), early: AtomicUsize::new(0) }
    }

    /// The checked space.
    pub fn inner(&self) -> &V {
        &self.space
    }

    /// Records that the work submitted to `stream` so far uses `range`.
    pub fn used(&self, range: Range, stream: &SimStream) {
        self.lock().push((range, stream.clone(), stream.position()));
    }

    /// Decommits that took memory before the work using it was done.
    pub fn early_unmaps(&self) -> usize {
        self.early.load(Ordering::Relaxed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(Range, SimStream, u64)>> {
        self.used.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Checks the ranges in use that a decommit of `range`, which answered
    /// `done`, took, and forgets them; answers `done`. A decommit that
    /// failed half-way ([`DECOMMITTED_IN_PART`]) took part of the range,
    /// which part unknown here: it is checked as one that took it all.
    fn took(&self, range: Range, done: Result<()>) -> Result<()> {
        let took = match done {
            Ok(()) => true,
            Err(Error::Backend { what, .. }) => what == DECOMMITTED_IN_PART,
            Err(_) => false,
        };
        if took {
            self.lock().retain(|(r, s, pos)| {
                if r.end() <= range.start() || range.end() <= r.start() {
                    return true;
                }
                if !s.is_observed(s.id(), *pos) {
                    self.early.fetch_add(1, Ordering::Relaxed);
                }
                false
            });
        }
        done
    }
}

impl<V: ReservableSpace> ReservableSpace for UnmapChecked<V> {
    fn granule(&self) -> u64 {
        self.space.granule()
    }
    fn reserve(&self, len: u64) -> Result<Range> {
        self.space.reserve(len)
    }
    fn release(&self, range: Range) -> Result<()> {
        self.space.release(range)
    }
    fn commit(&self, range: Range) -> Result<()> {
        self.space.commit(range)
    }
    fn releasable(&self, range: Range, want: u64) -> Option<Range> {
        self.space.releasable(range, want)
    }
    /// The space's decommit (which orders itself on `stream`), then the
    /// check of the ranges in use that it took (failed half-way too).
    fn decommit<S: Stream + ?Sized>(&self, range: Range, stream: &S) -> Result<()> {
        self.took(range, self.space.decommit(range, stream))
    }
    /// The space's own, checked as [`decommit`](Self::decommit): a space
    /// that keeps memory for the commits to come does so checked too.
    fn decommit_for_commit<S: Stream + ?Sized>(&self, range: Range, stream: &S) -> Result<()> {
        self.took(range, self.space.decommit_for_commit(range, stream))
    }
    fn release_kept(&self) {
        self.space.release_kept();
    }
}

#[cfg(test)]
mod tests;
