use crate::Result;

/// The stream model of a backend: what the stream-ordered algorithms need to
/// reuse memory safely across streams.
///
/// A block freed on stream A may be reused on A at once. Another stream B may
/// take it only after B waits on an event recorded on A after the free.
/// The core blocks the calling thread ([`synchronize`](Stream::synchronize),
/// [`synchronize_device`](Stream::synchronize_device)) only where it must
/// know work complete with no event to wait on: at its last resort before
/// reporting out of memory; to give memory that other streams used back
/// upstream (a `release`, a planned step that lets its region go); and at
/// frees it orders so: the arena's of a large block and of a block on
/// another stream than its arena's (as RMM's arena), `Planned`'s of a block
/// on another stream than its step's.
///
/// `()` is the stream of resources for which streams mean nothing: all its
/// operations succeed at once.
///
/// # Examples
///
/// ```
/// use memres_core::Stream;
/// let s = ();
/// let e = s.record()?;
/// s.wait(&e)?;
/// assert!(s.query(&e)?);
/// assert_eq!(s.id(), 0);
/// assert!(s.synchronize_device()?);
/// # Ok::<(), memres_core::Error>(())
/// ```
pub trait Stream {
    /// A point in the stream's work that others can wait on.
    type Event;

    /// A number that identifies the stream among those in use (the raw
    /// handle of a CUDA stream). Free lists are kept per `id`. The
    /// stream-ordered layer and the per-stream pool read it once per
    /// allocation and free, so an `id` that changes from call to call
    /// misplaces blocks between their lists but never hands out a block
    /// that was not checked; other resources may read it more than once in
    /// a call (the arena reads it again when it tries again).
    fn id(&self) -> u64;

    /// Records an event after all work submitted to the stream so far.
    fn record(&self) -> Result<Self::Event>;

    /// Makes all later work on this stream wait for `event`.
    fn wait(&self, event: &Self::Event) -> Result<()>;

    /// Whether the work before `event` has completed.
    fn query(&self, event: &Self::Event) -> Result<bool>;

    /// Blocks the calling thread until all work on the stream has completed.
    fn synchronize(&self) -> Result<()>;

    /// Blocks the calling thread until all work on every stream of the
    /// stream's device has completed (`cuCtxSynchronize`), and says whether
    /// it could: how resources that keep no handle of the streams they
    /// served know those streams idle, at their last resort before out of
    /// memory and before they give memory other streams used back upstream
    /// (`PerStreamPool::release` calls it first). The default cannot
    /// (`Ok(false)`).
    fn synchronize_device(&self) -> Result<bool> {
        Ok(false)
    }

    /// Calls `give_back` with the stream on which a resource being dropped
    /// gives its upstream chunks back, for stream types that have one
    /// needing no handle (as RMM's pools free on the default stream when
    /// destroyed), and says whether it did. The default has none (`false`):
    /// a dropped resource over such a stream keeps its chunks (call
    /// `release` on a stream before dropping it). The resources free each
    /// chunk once, however many times `give_back` is called.
    fn at_drop(give_back: &mut dyn FnMut(&Self)) -> bool {
        let _ = give_back;
        false
    }

    /// [`at_drop`](Self::at_drop)'s stream as a value that lives for
    /// ever, for stream types that have one: a reference to the stream
    /// type (`&S`, as the containers pass theirs) gives this one at drop,
    /// as it cannot give one lent for the call alone. A type whose
    /// `at_drop` gives a stream gives it here too where it can; the
    /// default has none, and a resource over references to such streams
    /// keeps its chunks when dropped.
    fn static_drop_stream() -> Option<&'static Self>
    where
        Self: 'static,
    {
        None
    }
}

impl Stream for () {
    type Event = ();

    #[inline]
    fn id(&self) -> u64 {
        0
    }
    #[inline]
    fn record(&self) -> Result<()> {
        Ok(())
    }
    #[inline]
    fn wait(&self, _: &()) -> Result<()> {
        Ok(())
    }
    #[inline]
    fn query(&self, _: &()) -> Result<bool> {
        Ok(true)
    }
    #[inline]
    fn synchronize(&self) -> Result<()> {
        Ok(())
    }
    #[inline]
    fn at_drop(give_back: &mut dyn FnMut(&())) -> bool {
        give_back(&());
        true
    }
    #[inline]
    fn static_drop_stream() -> Option<&'static ()> {
        Some(&())
    }
    #[inline]
    fn synchronize_device(&self) -> Result<bool> {
        Ok(true)
    }
}

// `S: 'static`, so that a reference to it gives its drop stream at drop.
impl<S: Stream + ?Sized + 'static> Stream for &S {
    type Event = S::Event;
    #[inline]
    fn id(&self) -> u64 {
        (**self).id()
    }
    #[inline]
    fn record(&self) -> Result<S::Event> {
        (**self).record()
    }
    #[inline]
    fn wait(&self, event: &S::Event) -> Result<()> {
        (**self).wait(event)
    }
    #[inline]
    fn query(&self, event: &S::Event) -> Result<bool> {
        (**self).query(event)
    }
    #[inline]
    fn synchronize(&self) -> Result<()> {
        (**self).synchronize()
    }
    #[inline]
    fn synchronize_device(&self) -> Result<bool> {
        (**self).synchronize_device()
    }
    fn at_drop(give_back: &mut dyn FnMut(&Self)) -> bool {
        match S::static_drop_stream() {
            Some(stream) => {
                give_back(&stream);
                true
            }
            None => false,
        }
    }
}

/// A number for the calling thread, the same on every call from it and
/// never given to another thread of the process, and never 0 (feature
/// `std`): what names a thread's per-thread stream (memres-cuda's), or
/// the holder of a lock that must tell its own re-entry from another
/// thread's wait.
///
/// ```
/// let me = memres_core::thread_number();
/// assert!(me != 0 && me == memres_core::thread_number());
/// assert_ne!(std::thread::spawn(memres_core::thread_number).join().unwrap(), me);
/// ```
#[cfg(feature = "std")]
pub fn thread_number() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(1);
    std::thread_local! {
        static NUMBER: u64 = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    NUMBER.with(|n| *n)
}
