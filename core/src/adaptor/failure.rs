//! RMM's `failure_callback_resource_adaptor`: a callback decides whether to
//! retry after out of memory.

use crate::{Block, MemoryResource, Request, Result, Stream};
use core::fmt;

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
/// Only out-of-memory errors ([`Error::is_out_of_memory`](crate::Error::is_out_of_memory))
/// reach the callback; any other error is returned at once. A callback
/// that asks to retry forever is bounded: after
/// [`max_retries`](Self::max_retries) retries (default
/// [`DEFAULT_MAX_RETRIES`](Self::DEFAULT_MAX_RETRIES)) the last error is
/// returned.
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
        FailureCallback { upstream, data, callback, max_retries: Self::DEFAULT_MAX_RETRIES }
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
                Err(e) if e.is_out_of_memory() => {
                    if !(self.callback)(request.size(), &self.data) || retries >= self.max_retries {
                        return Err(e);
                    }
                    retries += 1;
                }
                other => return other,
            }
        }
    }

    #[inline]
    fn deallocate(&self, block: Block, stream: &S) -> Result<()> {
        self.upstream.deallocate(block, stream)
    }

    /// Equal to a `FailureCallback` over an equal upstream, whatever its
    /// callback, as in RMM.
    #[inline]
    fn id(&self) -> crate::ResourceId {
        crate::ResourceId::over::<Self>(self.upstream.id())
    }
}

// SAFETY: `FailureCallback` hands out `R`'s blocks unchanged and gives them back only through
// `R::deallocate`.
unsafe impl<E, R: crate::copy::MemoryOf<E>, T, F> crate::copy::MemoryOf<E> for FailureCallback<R, T, F> {}
