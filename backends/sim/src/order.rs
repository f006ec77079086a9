//! The happens-before checker: every reuse of freed memory on another stream
//! must be ordered after the free.

use crate::stream::SimStream;
use memres_core::check::Violation;
use memres_core::{Block, Inspect, MemoryResource, Range, Request, Result, Stream, Usage};
use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Mutex, MutexGuard};

/// A reuse of freed memory that was not ordered after the free: the work of
/// `reuse_stream` may touch bytes that work on `free_stream` still uses.
///
/// # Examples
///
/// ```
/// use memres_core::{Block, Range};
/// use memres_sim::HbViolation;
/// let v = HbViolation {
///     reuse: Block::from_addr(0x1000, 256),
///     reuse_stream: 2,
///     freed: Range::new(0x1000, 512).unwrap(),
///     free_stream: 1,
///     free_position: 7,
/// };
/// assert!(v.to_string().contains("stream 2"));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HbViolation {
    /// The block handed out.
    pub reuse: Block,
    /// The stream it was handed out on.
    pub reuse_stream: u64,
    /// The freed range it overlaps.
    pub freed: Range,
    /// The stream the range was freed on.
    pub free_stream: u64,
    /// The free's position on `free_stream`.
    pub free_position: u64,
}

impl fmt::Display for HbViolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "block {:#x}+{} handed out on stream {} overlaps {:#x}+{} freed on stream {} at position {}, \
             with no wait on an event recorded after the free and no host synchronization",
            self.reuse.addr(),
            self.reuse.size(),
            self.reuse_stream,
            self.freed.start(),
            self.freed.len(),
            self.free_stream,
            self.free_position
        )
    }
}

impl std::error::Error for HbViolation {}

/// A wrapper that checks the happens-before rule of stream-ordered reuse
/// around any resource on [`SimStream`]s.
///
/// Each `deallocate` is a stream operation: the wrapper enqueues it on the
/// stream and records the freed range with the stream and the position (a
/// free the inner resource refuses is taken back from the stream, unless
/// the world changed since: it then stays, an operation that does
/// nothing).
/// Each `allocate` checks the block against the recorded frees it overlaps:
/// a reuse on another stream must be ordered after the free (the reusing
/// stream waited, directly or transitively, on an event recorded on the
/// freeing stream after the free; or the host observed the free complete).
/// Streams of several [`SimWorld`](crate::SimWorld)s may share one checked
/// resource: a reuse on another world than the free's is ordered only once
/// the host observed the free complete.
/// The part of a record that a reuse overlaps is then dropped, the rest kept.
///
/// Violations are counted and kept; [`panicking`](HbChecked::panicking)
/// makes the first one panic at once.
///
/// # Examples
///
/// ```
/// use memres_core::{MemoryResource, Request, Stream};
/// use memres_sim::{HbChecked, SimDevice, SimWorld};
/// let world = SimWorld::new();
/// let (a, b) = (world.stream(), world.stream());
/// let dev = HbChecked::new(SimDevice::new(1 << 20));
/// let x = dev.allocate(Request::new(256)?, &a)?;
/// dev.deallocate(x, &a)?;
/// // SimDevice reuses the range at once, on another stream: a violation.
/// let y = dev.allocate(Request::new(256)?, &b)?;
/// assert_eq!(y.addr(), x.addr());
/// assert_eq!(dev.violation_count(), 1);
/// # Ok::<(), memres_core::Error>(())
/// ```
#[derive(Debug)]
pub struct HbChecked<R> {
    inner: R,
    panic: bool,
    state: Mutex<CheckState>,
}

#[derive(Debug, Default)]
struct CheckState {
    /// Freed ranges not yet reused, by start: end, stream, position. The
    /// ranges are disjoint.
    frees: BTreeMap<u64, FreeRecord>,
    violations: Vec<HbViolation>,
    /// Reuses on another stream that were checked and found ordered.
    ordered_reuses: u64,
}

#[derive(Clone, Debug)]
struct FreeRecord {
    end: u64,
    /// The freeing stream itself: its id names it in its world only.
    stream: SimStream,
    position: u64,
}

impl<R> HbChecked<R> {
    /// Checks `inner`; violations are counted, not fatal.
    pub fn new(inner: R) -> Self {
        HbChecked { inner, panic: false, state: Mutex::new(CheckState::default()) }
    }

    /// Panics at the first violation as well as counting it; the block of
    /// that allocation goes back to `inner` before the panic.
    pub fn panicking(mut self) -> Self {
        self.panic = true;
        self
    }

    fn lock(&self) -> MutexGuard<'_, CheckState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The checked resource.
    pub fn inner(&self) -> &R {
        &self.inner
    }

    /// Number of violations so far.
    pub fn violation_count(&self) -> usize {
        self.lock().violations.len()
    }

    /// The violations so far, oldest first.
    pub fn violations(&self) -> Vec<HbViolation> {
        self.lock().violations.clone()
    }

    /// Number of reuses on another stream than the free's that were ordered
    /// correctly: shows that a test exercised cross-stream reuse at all.
    pub fn ordered_cross_stream_reuses(&self) -> u64 {
        self.lock().ordered_reuses
    }

    /// Number of freed ranges not reused yet.
    pub fn pending_frees(&self) -> usize {
        self.lock().frees.len()
    }

    /// Forgets every recorded free: after the host synchronized the whole
    /// device, or when the memory was given back to its owner.
    pub fn clear_frees(&self) {
        self.lock().frees.clear();
    }
}

impl CheckState {
    /// Keys of the records overlapping `start..end`.
    fn overlapping(&self, start: u64, end: u64) -> Vec<u64> {
        let mut keys = Vec::new();
        for (&k, r) in self.frees.range(..end).rev() {
            if r.end <= start {
                break;
            }
            keys.push(k);
        }
        keys
    }

    /// Removes `start..end` from the records, keeping what lies outside it.
    fn cut(&mut self, start: u64, end: u64) {
        for k in self.overlapping(start, end) {
            let r = self.frees.remove(&k).expect("key just found");
            if k < start {
                self.frees.insert(k, FreeRecord { end: start, ..r.clone() });
            }
            if r.end > end {
                self.frees.insert(end, r);
            }
        }
    }
}

/// The checked resource's figures and checker.
impl<R: Inspect> Inspect for HbChecked<R> {
    fn usage(&self) -> Usage {
        self.inner.usage()
    }
    fn check(&self) -> std::result::Result<(), Violation> {
        self.inner.check()
    }
}

impl<R: MemoryResource<SimStream>> MemoryResource<SimStream> for HbChecked<R> {
    fn allocate(&self, request: Request, stream: &SimStream) -> Result<Block> {
        // The lock spans the inner call so that frees and reuses are seen
        // in the order the inner resource saw them.
        let mut st = self.lock();
        let block = self.inner.allocate(request, stream)?;
        if block.is_empty() {
            return Ok(block);
        }
        let (start, end) = (block.addr(), block.addr().saturating_add(block.size()));
        let mut found = Vec::new();
        for k in st.overlapping(start, end) {
            let r = st.frees[&k].clone();
            if r.stream.is(stream) {
                continue;
            }
            if stream.is_ordered_after_stream(&r.stream, r.position) {
                st.ordered_reuses += 1;
            } else {
                found.push(HbViolation {
                    reuse: block,
                    reuse_stream: stream.id(),
                    freed: Range::new(k, r.end - k).expect("recorded ranges are valid"),
                    free_stream: r.stream.id(),
                    free_position: r.position,
                });
            }
        }
        st.cut(start, end);
        let first = found.first().copied();
        st.violations.extend(found);
        if let (Some(v), true) = (first, self.panic) {
            // The caller never gets the block: it goes back first (at once,
            // as nothing used it), counted as the violation it is.
            drop(st);
            let _ = self.inner.deallocate(block, stream);
            panic!("happens-before violation: {v}");
        }
        Ok(block)
    }

    fn deallocate(&self, block: Block, stream: &SimStream) -> Result<()> {
        let mut st = self.lock();
        if block.is_empty() {
            return self.inner.deallocate(block, stream);
        }
        // The free is an operation on the stream: work submitted before it
        // may still use the block. Submitted before the inner call, so that
        // an event the inner resource records in it comes after the free.
        let op = stream.submit();
        if let Err(e) = self.inner.deallocate(block, stream) {
            // A refused free submits nothing.
            stream.retract(op);
            return Err(e);
        }
        let position = op.position;
        let (start, end) = (block.addr(), block.addr().saturating_add(block.size()));
        st.cut(start, end);
        st.frees.insert(start, FreeRecord { end, stream: stream.clone(), position });
        Ok(())
    }
}

// SAFETY: `HbChecked` hands out `R`'s blocks unchanged and gives them back
// only through `R::deallocate`.
unsafe impl<E, R: memres_core::copy::MemoryOf<E>> memres_core::copy::MemoryOf<E> for HbChecked<R> {}

#[cfg(test)]
mod tests;
