//! RMM's `failure_callback_resource_adaptor`: a callback decides whether to
//! retry after out of memory (or, when asked, after any failure).

use crate::{Block, Error, MemoryResource, Request, Result, Stream};
use core::fmt;

/// Which failures of the upstream reach the callback of a
/// [`FailureCallback`]: RMM's `ExceptionType` parameter.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum RetryOn {
    /// Out of memory only ([`Error::is_out_of_memory`]), as RMM's default
    /// `rmm::out_of_memory`; any other error is returned at once.
    #[default]
    OutOfMemory,
    /// Every failure of an allocation (a backend error, an injected
    /// failure, a size or alignment the upstream refuses), as RMM's
    /// adaptor over `std::exception`.
    AnyError,
}

impl RetryOn {
    /// Whether `error` reaches the callback.
    ///
    /// ```
    /// use memres_core::adaptor::RetryOn;
    /// use memres_core::Error;
    /// let backend = Error::Backend { code: 2, what: "busy" };
    /// assert!(!RetryOn::OutOfMemory.catches(&backend));
    /// assert!(RetryOn::AnyError.catches(&backend));
    /// ```
    pub const fn catches(self, error: &Error) -> bool {
        match self {
            RetryOn::OutOfMemory => error.is_out_of_memory(),
            RetryOn::AnyError => true,
        }
    }
}

/// Calls a user callback when the upstream runs out of memory; the callback
/// (given the bytes requested and the user data) frees what it can and
/// returns `true` to retry or `false` to give up: RMM's
/// `failure_callback_resource_adaptor`.
///
/// ```text
///  allocate ─► upstream ─ok──────────────────────────────► block
///                └ out of memory ─► callback(bytes, data) ─true─► retry (at most max_retries times)
///                                                          └false─► the error
/// ```
///
/// By default only out-of-memory errors ([`Error::is_out_of_memory`])
/// reach the callback and any other error is returned at once;
/// [`with_retry_on`](Self::with_retry_on)`(`[`RetryOn::AnyError`]`)` hands
/// it every failure. A callback that returns `false` gets the error that
/// made it be called returned, as it was. A callback
/// that asks to retry forever is bounded: after
/// [`max_retries`](Self::max_retries) retries (default
/// [`DEFAULT_MAX_RETRIES`](Self::DEFAULT_MAX_RETRIES)) the last error is
/// returned. A callback that allocates through the same adaptor (its data
/// holds it) gets that nested allocation's error back at once, without
/// being called again: each failure would call it anew, a recursion with
/// no end that overflowed the stack. With the feature `std` this holds per
/// thread; without it no thread can be told from another, so while a
/// callback runs, any failing allocation of the adaptor returns its error
/// without calling it.
///
/// # Examples
///
/// ```
/// use memres_core::adaptor::FailureCallback;
/// use memres_core::{MemoryResource, Request};
/// use std::sync::atomic::{AtomicU64, Ordering};
/// # use memres_core::testing::BumpUpstream;
/// let calls = AtomicU64::new(0);
/// let r = FailureCallback::new(BumpUpstream::new(1 << 20), &calls, |bytes, calls: &&AtomicU64| {
///     calls.fetch_add(1, Ordering::Relaxed);
///     false // give up
/// });
/// assert!(r.allocate(Request::new(2 << 20)?, &()).is_err());
/// assert_eq!(calls.load(Ordering::Relaxed), 1);
/// # Ok::<(), memres_core::Error>(())
/// ```
pub struct FailureCallback<R, T, F> {
    upstream: R,
    data: T,
    callback: F,
    /// Retries per allocation before the error is returned.
    max_retries: u32,
    /// The failures that reach the callback.
    retry_on: RetryOn,
    /// What tells this adaptor's callback running on a thread (with
    /// `std`); without `std`, where threads cannot be told apart, the
    /// count of callbacks running.
    #[cfg(feature = "std")]
    running: super::on_thread::Key,
    #[cfg(not(feature = "std"))]
    running: crate::primitive::AtomicU64,
}

/// Runs `callback` as the callback of `adaptor`; `None`, without running
/// it, if one runs already (on this thread, with `std`): the caller is
/// inside it.
#[allow(clippy::needless_return)] // one of the two returns is configured out
fn run_callback<R, T, F, U>(adaptor: &FailureCallback<R, T, F>, callback: impl FnOnce() -> U) -> Option<U> {
    #[cfg(feature = "std")]
    return super::on_thread::run(&adaptor.running, callback);
    #[cfg(not(feature = "std"))]
    {
        use crate::primitive::Ordering;
        /// Holds the count at 1 until dropped (a panicking callback included).
        struct Running<'a>(&'a crate::primitive::AtomicU64);
        impl Drop for Running<'_> {
            fn drop(&mut self) {
                self.0.store(0, Ordering::Release);
            }
        }
        let count = &adaptor.running;
        count.compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed).ok()?;
        let _running = Running(count);
        Some(callback())
    }
}

impl<R, T, F: Fn(u64, &T) -> bool> FailureCallback<R, T, F> {
    /// Retries a failed allocation at most this many times by default.
    pub const DEFAULT_MAX_RETRIES: u32 = 64;

    /// Calls `callback(bytes, &data)` when `upstream` runs out of memory.
    ///
    /// ```
    /// # use memres_core::adaptor::FailureCallback;
    /// let r = FailureCallback::new((), (), |_, _| false);
    /// assert_eq!(r.max_retries(), 64);
    /// ```
    pub fn new(upstream: R, data: T, callback: F) -> Self {
        FailureCallback {
            upstream,
            data,
            callback,
            max_retries: Self::DEFAULT_MAX_RETRIES,
            retry_on: RetryOn::OutOfMemory,
            #[cfg(feature = "std")]
            running: super::on_thread::Key::default(),
            #[cfg(not(feature = "std"))]
            running: crate::primitive::AtomicU64::new(0),
        }
    }

    /// The same adaptor with another retry cap (0: the callback is called
    /// but the allocation is never retried).
    ///
    /// ```
    /// # use memres_core::adaptor::FailureCallback;
    /// let r = FailureCallback::new((), (), |_, _| true).with_max_retries(3);
    /// assert_eq!(r.max_retries(), 3);
    /// ```
    pub fn with_max_retries(mut self, retries: u32) -> Self {
        self.max_retries = retries;
        self
    }

    /// The same adaptor with its callback called on the failures `retry_on`
    /// names (by default [`RetryOn::OutOfMemory`]).
    ///
    /// ```
    /// use memres_core::adaptor::{FailureCallback, RetryOn};
    /// use memres_core::{Error, MemoryResource, Request};
    /// # use memres_core::testing::BumpUpstream;
    /// let up = BumpUpstream::new(1 << 20);
    /// up.fail_after(0); // every allocation fails with a backend error
    /// let r = FailureCallback::new(&up, (), |_, _| false).with_retry_on(RetryOn::AnyError);
    /// assert_eq!(r.retry_on(), RetryOn::AnyError);
    /// assert!(matches!(r.allocate(Request::new(256)?, &()), Err(Error::Backend { .. })));
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    pub fn with_retry_on(mut self, retry_on: RetryOn) -> Self {
        self.retry_on = retry_on;
        self
    }

    /// The failures that reach the callback.
    ///
    /// ```
    /// # use memres_core::adaptor::{FailureCallback, RetryOn};
    /// assert_eq!(FailureCallback::new((), (), |_, _| true).retry_on(), RetryOn::OutOfMemory);
    /// ```
    pub fn retry_on(&self) -> RetryOn {
        self.retry_on
    }

    /// The retry cap.
    ///
    /// ```
    /// # use memres_core::adaptor::FailureCallback;
    /// assert_eq!(FailureCallback::new((), (), |_, _| true).with_max_retries(0).max_retries(), 0);
    /// ```
    pub fn max_retries(&self) -> u32 {
        self.max_retries
    }

    /// The user data.
    ///
    /// ```
    /// # use memres_core::adaptor::FailureCallback;
    /// assert_eq!(*FailureCallback::new((), 5, |_, _| true).data(), 5);
    /// ```
    pub fn data(&self) -> &T {
        &self.data
    }

    /// The upstream resource.
    ///
    /// ```
    /// # use memres_core::adaptor::FailureCallback;
    /// assert_eq!(*FailureCallback::new(1u8, (), |_, _| true).upstream(), 1);
    /// ```
    pub fn upstream(&self) -> &R {
        &self.upstream
    }
}

impl<R: fmt::Debug, T: fmt::Debug, F> fmt::Debug for FailureCallback<R, T, F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FailureCallback")
            .field("upstream", &self.upstream)
            .field("data", &self.data)
            .field("max_retries", &self.max_retries)
            .field("retry_on", &self.retry_on)
            .finish_non_exhaustive()
    }
}

impl<S, R, T, F> MemoryResource<S> for FailureCallback<R, T, F>
where
    S: Stream + ?Sized,
    R: MemoryResource<S>,
    F: Fn(u64, &T) -> bool,
{
    fn allocate(&self, request: Request, stream: &S) -> Result<Block> {
        let mut retries = 0;
        loop {
            match self.upstream.allocate(request, stream) {
                Err(e) if self.retry_on.catches(&e) => {
                    // Inside this adaptor's own callback: no second call.
                    let called = run_callback(self, || (self.callback)(request.size(), &self.data));
                    let Some(retry) = called else { return Err(e) };
                    if !retry || retries >= self.max_retries {
                        return Err(e);
                    }
                    retries += 1;
                }
                other => return other,
            }
        }
    }

    // Equal whatever the callback, as in RMM.
    crate::resource::pass_blocks_through!(upstream);
}

crate::inspect::forward_inspect!(FailureCallback<R, T, F>, upstream);

// SAFETY: `FailureCallback` hands out `R`'s blocks unchanged and gives them back only through
// `R::deallocate`.
unsafe impl<E, R: crate::copy::MemoryOf<E>, T, F> crate::copy::MemoryOf<E> for FailureCallback<R, T, F> {}
