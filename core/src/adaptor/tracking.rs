//! RMM's `tracking_resource_adaptor`: every outstanding allocation.

use crate::addr_map::{Freeing, Records};
use crate::lock::Shared;
use crate::{Block, Error, MemoryResource, Request, Result, Stream};
use alloc::boxed::Box;
use alloc::vec::Vec;
use core::fmt;

/// One allocation that has not been freed.
///
/// # Examples
///
/// ```
/// use memres_core::adaptor::Outstanding;
/// let o = Outstanding { addr: 0x1000, size: 64, #[cfg(feature = "std")] backtrace: None };
/// assert_eq!(o.size, 64);
/// ```
#[derive(Clone, Debug)]
pub struct Outstanding {
    /// Its address.
    pub addr: u64,
    /// Its requested size.
    pub size: u64,
    /// Where it was allocated, when backtraces are on.
    #[cfg(feature = "std")]
    pub backtrace: Option<alloc::sync::Arc<std::backtrace::Backtrace>>,
}

/// The outstanding allocations of a [`Tracking`] adaptor, sorted by
/// address. Its `Display` lists them (with backtraces when captured).
///
/// # Examples
///
/// ```
/// use memres_core::adaptor::Tracking;
/// use memres_core::{MemoryResource, Request};
/// # use memres_core::testing::BumpUpstream;
/// let t = Tracking::new(BumpUpstream::new(1 << 20));
/// let b = t.allocate(Request::new(100)?, &())?;
/// let report = t.get_outstanding_allocations();
/// assert_eq!((report.count(), report.bytes()), (1, 100));
/// assert!(report.to_string().starts_with("1 outstanding allocation(s), 100 bytes"));
/// # t.deallocate(b, &())?;
/// # Ok::<(), memres_core::Error>(())
/// ```
#[derive(Clone, Debug, Default)]
pub struct LeakReport {
    /// Sorted by address.
    pub allocations: Vec<Outstanding>,
}

impl LeakReport {
    /// Number of outstanding allocations.
    ///
    /// ```
    /// # use memres_core::adaptor::LeakReport;
    /// assert_eq!(LeakReport::default().count(), 0);
    /// ```
    pub fn count(&self) -> usize {
        self.allocations.len()
    }

    /// Sum of their requested sizes.
    ///
    /// ```
    /// # use memres_core::adaptor::LeakReport;
    /// assert_eq!(LeakReport::default().bytes(), 0);
    /// ```
    pub fn bytes(&self) -> u64 {
        self.allocations.iter().fold(0, |sum, o| sum.saturating_add(o.size))
    }

    /// Whether nothing is outstanding.
    ///
    /// ```
    /// # use memres_core::adaptor::LeakReport;
    /// assert!(LeakReport::default().is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.allocations.is_empty()
    }
}

impl fmt::Display for LeakReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{} outstanding allocation(s), {} bytes", self.count(), self.bytes())?;
        for o in &self.allocations {
            writeln!(f, "  {:#x}: {} bytes", o.addr, o.size)?;
            #[cfg(feature = "std")]
            if let Some(bt) = &o.backtrace {
                writeln!(f, "{bt}")?;
            }
        }
        Ok(())
    }
}

/// What a [`Tracking`] adaptor does with the leaks it finds when dropped.
type LeakHandler = Box<dyn Fn(&LeakReport) + Send + Sync>;

/// An entry of the table: the requested size and, when on, a backtrace.
#[derive(Clone, Debug)]
struct Entry {
    size: u64,
    #[cfg(feature = "std")]
    backtrace: Option<alloc::sync::Arc<std::backtrace::Backtrace>>,
}

/// The live blocks, and their bytes counted as they come and go so that
/// [`Tracking::get_allocated_bytes`] reads one number.
#[derive(Debug)]
struct Table {
    /// Live blocks handed out through the adaptor, by address.
    blocks: Records<Entry>,
    /// The sum of `blocks`' sizes, wrapping: an upstream outside the
    /// contract may hand out blocks whose sizes sum past `u64::MAX`, and
    /// every size added is taken off again.
    bytes: u64,
}

impl Table {
    fn insert(&mut self, addr: u64, entry: Entry) {
        self.bytes = self.bytes.wrapping_add(entry.size);
        // An address handed out again without a free through the adaptor
        // done (the upstream freed it directly, or a free is not yet back
        // from it): the old entry is gone, so are its bytes.
        if let Some(old) = self.blocks.insert(addr, entry) {
            self.bytes = self.bytes.wrapping_sub(old.size);
        }
    }

    /// The upstream freed the block `freeing` found: its entry goes, if
    /// still there (see [`Records::freed`]).
    fn freed(&mut self, freeing: Freeing) {
        if let Some(entry) = self.blocks.freed(freeing) {
            self.bytes = self.bytes.wrapping_sub(entry.size);
        }
    }
}

/// Keeps every outstanding allocation (address → size) and reports the
/// ones still outstanding: RMM's `tracking_resource_adaptor`.
///
/// ```text
///  allocate ─► upstream ─ok─► table.insert(addr, size [, backtrace])
///  deallocate ─► table.freeing(addr) ─► upstream ─ok─► table.freed (the entry goes)
///                ├ not there: Error::UnknownBlock └ error, panic: nothing changes
///                └ wrong size: Error::SizeMismatch
///  drop ─► leaks? ─► the leak handler, or (std) a report on stderr
/// ```
///
/// A free of a block the table does not hold is refused before it reaches
/// the upstream; one the upstream refuses or panics in keeps the block
/// outstanding (the upstream may not have freed it), so that a retry
/// frees it and a leak report names it. The entry stays in the table while
/// the upstream frees the block: a double free made meanwhile (a stale copy
/// of a block whose address was handed out again) goes to the upstream too,
/// which tells the two apart, and never makes the live block's free fail.
/// Zero-byte requests are not tracked. With `std`,
/// `Tracking::with_backtraces` records a backtrace with every allocation
/// (off by default; `std::backtrace::Backtrace::force_capture()`, whatever
/// `RUST_BACKTRACE` says: asking for them is the switch, as RMM's
/// `capture_stacks`).
///
/// # Examples
///
/// ```
/// use memres_core::adaptor::Tracking;
/// use memres_core::{Error, MemoryResource, Request};
/// # use memres_core::testing::BumpUpstream;
/// let t = Tracking::new(BumpUpstream::new(1 << 20));
/// let b = t.allocate(Request::new(100)?, &())?;
/// assert_eq!(t.get_allocated_bytes(), 100);
/// t.deallocate(b, &())?;
/// assert_eq!(t.deallocate(b, &()), Err(Error::UnknownBlock { addr: b.addr() }));
/// assert!(t.get_outstanding_allocations().is_empty());
/// # Ok::<(), Error>(())
/// ```
pub struct Tracking<R> {
    upstream: R,
    table: Shared<Table>,
    /// Called at drop when something is outstanding.
    on_leak: Option<LeakHandler>,
    #[cfg(feature = "std")]
    backtraces: bool,
}

impl<R> Tracking<R> {
    /// Tracks what passes through to `upstream`.
    ///
    /// ```
    /// # use memres_core::adaptor::Tracking;
    /// assert_eq!(Tracking::new(()).get_allocated_bytes(), 0);
    /// ```
    pub fn new(upstream: R) -> Self {
        Tracking {
            upstream,
            table: Shared::new(Table { blocks: Records::new(), bytes: 0 }),
            on_leak: None,
            #[cfg(feature = "std")]
            backtraces: false,
        }
    }

    /// Calls `handler` with the report when the adaptor is dropped with
    /// allocations outstanding (instead of printing it to stderr).
    ///
    /// ```
    /// # use memres_core::adaptor::Tracking;
    /// # use memres_core::{MemoryResource, Request};
    /// # use memres_core::testing::BumpUpstream;
    /// use std::sync::{Arc, Mutex};
    /// let seen = Arc::new(Mutex::new(0));
    /// let s = seen.clone();
    /// let up = BumpUpstream::new(1 << 20);
    /// let t = Tracking::new(&up).on_leak(move |r| *s.lock().unwrap() = r.bytes());
    /// t.allocate(Request::new(10)?, &())?;
    /// drop(t);
    /// assert_eq!(*seen.lock().unwrap(), 10);
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    pub fn on_leak(mut self, handler: impl Fn(&LeakReport) + Send + Sync + 'static) -> Self {
        self.on_leak = Some(Box::new(handler));
        self
    }

    /// Records a backtrace with every allocation (std only, off by default).
    ///
    /// ```
    /// # use memres_core::adaptor::Tracking;
    /// # use memres_core::{MemoryResource, Request};
    /// # use memres_core::testing::BumpUpstream;
    /// let t = Tracking::new(BumpUpstream::new(1 << 20)).with_backtraces(true);
    /// let b = t.allocate(Request::new(10)?, &())?;
    /// assert!(t.get_outstanding_allocations().allocations[0].backtrace.is_some());
    /// # t.deallocate(b, &())?;
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    #[cfg(feature = "std")]
    pub fn with_backtraces(mut self, on: bool) -> Self {
        self.backtraces = on;
        self
    }

    /// Sum of the requested sizes of the outstanding allocations (RMM's
    /// `get_allocated_bytes`).
    ///
    /// ```
    /// # use memres_core::adaptor::Tracking;
    /// assert_eq!(Tracking::new(()).get_allocated_bytes(), 0);
    /// ```
    pub fn get_allocated_bytes(&self) -> u64 {
        self.table.with(|t| t.bytes)
    }

    /// The size of the outstanding allocation at `addr`, if any.
    ///
    /// ```
    /// # use memres_core::adaptor::Tracking;
    /// assert_eq!(Tracking::new(()).size_of(0x1000), None);
    /// ```
    pub fn size_of(&self, addr: u64) -> Option<u64> {
        self.table.with(|t| t.blocks.get(addr).map(|e| e.size))
    }

    /// Every outstanding allocation, sorted by address (the leak report, on
    /// demand; RMM's `get_outstanding_allocations`).
    ///
    /// ```
    /// # use memres_core::adaptor::Tracking;
    /// assert_eq!(Tracking::new(()).get_outstanding_allocations().count(), 0);
    /// ```
    pub fn get_outstanding_allocations(&self) -> LeakReport {
        let mut allocations: Vec<Outstanding> = self.table.with(|t| {
            t.blocks
                .iter()
                .map(|(addr, e)| Outstanding {
                    addr,
                    size: e.size,
                    #[cfg(feature = "std")]
                    backtrace: e.backtrace.clone(),
                })
                .collect()
        });
        allocations.sort_unstable_by_key(|o| o.addr);
        LeakReport { allocations }
    }

    /// The upstream resource.
    ///
    /// ```
    /// # use memres_core::adaptor::Tracking;
    /// assert_eq!(*Tracking::new(3u8).upstream(), 3);
    /// ```
    pub fn upstream(&self) -> &R {
        &self.upstream
    }

    fn entry(&self, size: u64) -> Entry {
        Entry {
            size,
            #[cfg(feature = "std")]
            backtrace: self
                .backtraces
                .then(|| alloc::sync::Arc::new(std::backtrace::Backtrace::force_capture())),
        }
    }
}

impl<R> Drop for Tracking<R> {
    fn drop(&mut self) {
        if self.table.with(|t| t.blocks.is_empty()) {
            return;
        }
        let report = self.get_outstanding_allocations();
        match &self.on_leak {
            Some(handler) => crate::resource::in_destructor(|| handler(&report)),
            // A report that cannot be written (standard error closed) is
            // dropped: `eprint!` would panic, and abort while unwinding.
            #[cfg(feature = "std")]
            None => crate::resource::in_destructor(|| {
                use std::io::Write;
                let _ = write!(std::io::stderr().lock(), "memres: tracking adaptor dropped with {report}");
            }),
            #[cfg(not(feature = "std"))]
            None => {}
        }
    }
}

impl<R: fmt::Debug> fmt::Debug for Tracking<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tracking")
            .field("upstream", &self.upstream)
            .field("outstanding", &self.table.with(|t| t.blocks.len()))
            .finish_non_exhaustive()
    }
}

impl<S: Stream + ?Sized, R: MemoryResource<S>> MemoryResource<S> for Tracking<R> {
    fn allocate(&self, request: Request, stream: &S) -> Result<Block> {
        let block = self.upstream.allocate(request, stream)?;
        if !block.is_empty() {
            let entry = self.entry(block.size());
            self.table.with(|t| t.insert(block.addr(), entry));
        }
        Ok(block)
    }

    fn deallocate(&self, block: Block, stream: &S) -> Result<()> {
        if block.is_empty() {
            return self.upstream.deallocate(block, stream);
        }
        let addr = block.addr();
        let freeing = self.table.with(|t| match t.blocks.freeing(addr) {
            None => Err(Error::UnknownBlock { addr }),
            Some((_, e)) if e.size != block.size() => {
                Err(Error::SizeMismatch { addr, expected: e.size, given: block.size() })
            }
            Some((freeing, _)) => Ok(freeing),
        })?;
        if crate::plant::FORGET_CHECKED_FREE {
            self.table.with(|t| t.freed(freeing));
            return self.upstream.deallocate(block, stream);
        }
        // The entry stays while the upstream frees the block: on its error
        // or panic the block is still live and outstanding.
        self.upstream.deallocate(block, stream)?;
        self.table.with(|t| t.freed(freeing));
        Ok(())
    }
}

crate::inspect::forward_inspect!(Tracking<R>, upstream);

// SAFETY: `Tracking` hands out `R`'s blocks unchanged and gives them back only through
// `R::deallocate`.
unsafe impl<E, R: crate::copy::MemoryOf<E>> crate::copy::MemoryOf<E> for Tracking<R> {}
