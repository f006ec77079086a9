//! The CUDA resources as names of the core's
//! [`StackBuilder`]: `async`, `cuda`, `managed`, `pinned` and `vmm`, and the
//! layer `prefetch`.
//!
//! | name | arguments | resource (typed handle) |
//! | --- | --- | --- |
//! | `async` | `initial=`, `release_threshold=`, `ipc=none\|posix_fd\|fabric`, `pool=own\|default\|managed` | [`CudaAsyncMemory`] on its own pool, or with `pool=default` on the device's default pool ([`CudaAsyncMemory::default_pool`], RMM's async view resource), left as it is (`Counted<CudaAsyncMemory>`); with `pool=managed`, [`CudaAsyncManagedMemory`] on the device's default pool of managed memory (CUDA 13; RMM's `cuda_async_managed_memory_resource`; `Counted<CudaAsyncManagedMemory>`) |
//! | `cuda` | none | [`CudaMemory`] (`Counted<CudaMemory>`) |
//! | `managed` | none | [`ManagedMemory`] (`Counted<ManagedMemory>`) |
//! | `pinned` | none | [`PinnedMemory`], page-locked host memory (`Counted<PinnedMemory>`) |
//! | `vmm` | `reserve=`, `release_threshold=`, `slack=`, `handle_granules=`, `large_handles=`, `trim_on_commit=`, `per_stream=` | a [`VirtualPool`](memres_core::vpool::VirtualPool) over [`CudaVirtualSpace`](crate::CudaVirtualSpace) ([`VmmPool`]), counted by the bytes it maps (see [`VmmConfig`]); with `per_stream=true` one per stream, stream-ordered ([`VmmPools`]) |
//!
//!
//! | layer | arguments | resource (typed handle) |
//! | --- | --- | --- |
//! | `prefetch` | the upstream | [`Prefetch`] of the upstream to the builder's device: RMM's `prefetch_resource_adaptor`, meant over `managed` |
//!
//! Every leaf counts what it holds from the device in one [`Gauge`] per
//! stack ([`Counted`]; `vmm` its mapped bytes, [`CountedSpace`]), so that
//! the bytes a stack holds from the device are known whatever the stack.
//! Every leaf is [`MemoryOf<CudaCopy>`](MemoryOf), a bound the compiler
//! checks where it is registered
//! ([`StackBuilder::register_leaf_of`]): the builder's
//! [`is_leaf_of::<CudaCopy>`](StackBuilder::is_leaf_of) says so of each
//! name. [`register_checking`] registers the same names for checking a
//! stack without a device (not as such leaves: nothing backs them).
//! [`DriverPools`] finds the driver pools under a built stack's `async`
//! leaves, whose reserve can exceed what the stack holds from them.
//!
//! # Examples
//!
//! ```no_run
//! use memres_core::adaptor::Gauge;
//! use memres_core::stack::StackBuilder;
//! use memres_cuda::{CudaStream, Device};
//! use std::sync::Arc;
//! let device = Device::get(0)?;
//! let gauge = Arc::new(Gauge::default());
//! let mut builder = StackBuilder::<CudaStream>::new();
//! memres_cuda::stack::register(&mut builder, device, gauge.clone());
//! let stream = CudaStream::legacy_in(device.primary_context()?);
//! let stack = builder.build("stats(pool(async, initial=1GiB))", &stream)?;
//! assert!(gauge.value() >= 1 << 30);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod vmm;

pub use vmm::{vmm_config, CountedSpace, VmmConfig, VmmPool, VmmPools, VMM_RESERVATIONS};

use crate::{
    AsyncConfig, CudaAsyncManagedMemory, CudaAsyncMemory, CudaCopy, CudaMemory, CudaStream, Device,
    IpcHandle, ManagedMemory, PinnedMemory, Prefetch,
};
use memres_core::adaptor::{Counted, Gauge};
use memres_core::copy::MemoryOf;
use memres_core::stack::{Built, Call, StackBuilder, StackError, StackErrorKind, Unbacked};
use memres_core::MemoryResource;
use std::sync::{Arc, Weak};

/// The options of `async`'s own pool: `initial=` (bytes reserved when made,
/// default 0), `release_threshold=` (bytes kept reserved across
/// synchronizations, default: all of them) and `ipc=` (the handle its
/// memory can be exported as, for other processes: `none`, the default,
/// `posix_fd` or `fabric`; [`IpcHandle`]); `pool=` is
/// read by [`async_pool`].
///
/// # Errors
///
/// An unknown key, a positional argument or a bad size, at its position.
///
/// # Examples
///
/// ```
/// use memres_cuda::stack::async_config;
/// use memres_core::stack::parse;
/// let c = async_config(&parse("async(initial=1GiB, release_threshold=2GiB)")?)?;
/// assert_eq!(c, memres_cuda::AsyncConfig::new().initial_size(1 << 30).release_threshold(2 << 30));
/// assert!(async_config(&parse("async(initial=lots)")?).is_err());
/// let ipc = async_config(&parse("async(ipc=posix_fd)")?)?;
/// assert_eq!(ipc, memres_cuda::AsyncConfig::new().ipc_handle(memres_cuda::IpcHandle::PosixFileDescriptor));
/// assert_eq!(async_config(&parse("async(ipc=yes)")?).unwrap_err().pos, 10);
/// # Ok::<(), memres_core::stack::StackError>(())
/// ```
pub fn async_config(call: &Call) -> Result<AsyncConfig, StackError> {
    call.expect_args(0, &["initial", "release_threshold", "ipc", "pool"])?;
    let mut config = AsyncConfig::new();
    if let Some(v) = call.keyed("ipc") {
        let handle = match v.text()? {
            "none" => IpcHandle::None,
            "posix_fd" => IpcHandle::PosixFileDescriptor,
            "fabric" => IpcHandle::Fabric,
            other => {
                return Err(StackError::new(
                    v.pos(),
                    StackErrorKind::BadValue(format!("ipc `{other}`: none, posix_fd or fabric")),
                ))
            }
        };
        config = config.ipc_handle(handle);
    }
    if let Some(initial) = call.size_arg("initial")? {
        config = config.initial_size(initial);
    }
    if let Some(threshold) = call.size_arg("release_threshold")? {
        config = config.release_threshold(threshold);
    }
    Ok(config)
}

/// The pool `async` serves from (`pool=`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AsyncPool {
    /// `pool=own` (the default): a pool made for the leaf, configured by
    /// [`async_config`].
    Own,
    /// `pool=default`: the device's default pool, viewed as it is.
    Default,
    /// `pool=managed`: the device's default pool of managed memory (CUDA
    /// 13), viewed as it is.
    Managed,
}

/// The pool `async` serves from: its own (`pool=own`, the default), or a
/// view of the device's default pool (`pool=default`) or of its default
/// pool of managed memory (`pool=managed`). A view leaves the pool's
/// attributes as they are, so it takes none of `initial=`,
/// `release_threshold=` and `ipc=`.
///
/// # Errors
///
/// [`StackErrorKind::BadValue`] at `pool=` for another value, and at
/// `initial=`, `release_threshold=` or `ipc=` beside a view.
///
/// # Examples
///
/// ```
/// use memres_cuda::stack::{async_pool, AsyncPool};
/// use memres_core::stack::parse;
/// assert_eq!(async_pool(&parse("async(pool=default)")?)?, AsyncPool::Default);
/// assert_eq!(async_pool(&parse("async(pool=managed)")?)?, AsyncPool::Managed);
/// assert_eq!(async_pool(&parse("async(pool=own, initial=1GiB)")?)?, AsyncPool::Own);
/// assert_eq!(async_pool(&parse("async")?)?, AsyncPool::Own);
/// assert_eq!(async_pool(&parse("async(pool=mine)")?).unwrap_err().pos, 11);
/// assert_eq!(async_pool(&parse("async(pool=default, initial=1GiB)")?).unwrap_err().pos, 28);
/// assert_eq!(async_pool(&parse("async(pool=managed, ipc=posix_fd)")?).unwrap_err().pos, 24);
/// # Ok::<(), memres_core::stack::StackError>(())
/// ```
pub fn async_pool(call: &Call) -> Result<AsyncPool, StackError> {
    let Some(v) = call.keyed("pool") else { return Ok(AsyncPool::Own) };
    let named = v.text()?;
    let pool = match named {
        "own" => return Ok(AsyncPool::Own),
        "default" => AsyncPool::Default,
        "managed" => AsyncPool::Managed,
        other => {
            return Err(StackError::new(
                v.pos(),
                StackErrorKind::BadValue(format!("pool `{other}`: own, default or managed")),
            ))
        }
    };
    match ["initial", "release_threshold", "ipc"].into_iter().find_map(|k| call.keyed(k).map(|v| (k, v))) {
        Some((key, v)) => Err(StackError::new(
            v.pos(),
            StackErrorKind::BadValue(format!(
                "`{key}=` with `pool={named}`: a view leaves the device's pool as it is"
            )),
        )),
        None => Ok(pool),
    }
}

/// A leaf of no arguments made by `make` on `device`, counted in `gauge`.
fn plain_leaf<R>(
    builder: &mut StackBuilder<CudaStream>,
    name: &str,
    device: Device,
    gauge: &Arc<Gauge>,
    make: fn(Device) -> memres_core::Result<R>,
) where
    R: MemoryResource<CudaStream> + MemoryOf<CudaCopy> + Send + Sync + 'static,
{
    let gauge = gauge.clone();
    builder.register_leaf_of::<CudaCopy>(name, move |call, cx| {
        call.expect_args(0, &[])?;
        let leaf = make(device).map_err(|e| call.resource_error(e))?;
        Ok(cx.keep_leaf_of(call, Counted::new(leaf, gauge.clone())))
    });
}

/// Registers the CUDA leaves of `device` in `builder` (see the
/// [module](self)), every one counted in `gauge`, and the `prefetch` layer.
pub fn register(
    builder: &mut StackBuilder<CudaStream>,
    device: Device,
    gauge: Arc<Gauge>,
) -> &mut StackBuilder<CudaStream> {
    let g = gauge.clone();
    builder.register_leaf_of::<CudaCopy>("async", move |call, cx| {
        let config = async_config(call)?;
        let leaf = match async_pool(call)? {
            AsyncPool::Own => CudaAsyncMemory::with_config(device, config),
            AsyncPool::Default => CudaAsyncMemory::default_pool(device),
            AsyncPool::Managed => {
                let leaf =
                    CudaAsyncManagedMemory::default_pool(device).map_err(|e| call.resource_error(e))?;
                return Ok(cx.keep_leaf_of_releasing(call, Counted::new(leaf, g.clone())));
            }
        };
        let leaf = leaf.map_err(|e| call.resource_error(e))?;
        Ok(cx.keep_leaf_of_releasing(call, Counted::new(leaf, g.clone())))
    });
    plain_leaf(builder, "cuda", device, &gauge, CudaMemory::new);
    plain_leaf(builder, "managed", device, &gauge, ManagedMemory::new);
    plain_leaf(builder, "pinned", device, &gauge, PinnedMemory::new);
    builder.register("prefetch", move |call, cx| {
        call.expect_args(1, &[])?;
        let layer = Prefetch::new(cx.upstream(call, 0)?, device).map_err(|e| call.resource_error(e))?;
        Ok(cx.keep(call, layer))
    });
    builder.register_leaf_of::<CudaCopy>("vmm", move |call, cx| {
        let config = vmm_config(call)?;
        if config.per_stream {
            let pools = config.build_per_stream(device, gauge.clone()).map_err(|e| call.resource_error(e))?;
            return Ok(cx.keep_leaf_of_releasing(call, pools));
        }
        let pool = config.build(device, gauge.clone()).map_err(|e| call.resource_error(e))?;
        Ok(cx.keep_leaf_of_releasing(call, pool))
    })
}

/// Reads a leaf's arguments as its constructor does, and nothing more.
type ArgCheck = fn(&Call) -> Result<(), StackError>;

/// Registers the CUDA leaves for checking a stack without a device: each
/// reads its arguments as [`register`]'s does, then stands in as an
/// [`Unbacked`] leaf, which serves any size (only the device knows its
/// memory). `prefetch` reads its upstream and stands in as that upstream.
///
/// # Examples
///
/// ```
/// use memres_core::stack::StackBuilder;
/// use memres_cuda::CudaStream;
/// let mut b = StackBuilder::<CudaStream>::new();
/// memres_cuda::stack::register_checking(&mut b);
/// assert!(b.build("stats(pool(async(initial=64GiB), initial=60GiB))", &CudaStream::legacy()).is_ok());
/// assert_eq!(b.build("pool(async(bogus=1))", &CudaStream::legacy()).err().unwrap().pos, 11);
/// assert!(b.build("stats(prefetch(managed))", &CudaStream::legacy()).is_ok());
/// assert_eq!(b.build("prefetch(managed, cuda)", &CudaStream::legacy()).err().unwrap().pos, 18);
/// ```
pub fn register_checking(builder: &mut StackBuilder<CudaStream>) -> &mut StackBuilder<CudaStream> {
    let checks: [(&str, ArgCheck); 5] = [
        ("async", |call| async_config(call).and_then(|_| async_pool(call)).map(drop)),
        ("cuda", |call| call.expect_args(0, &[])),
        ("managed", |call| call.expect_args(0, &[])),
        ("pinned", |call| call.expect_args(0, &[])),
        ("vmm", |call| vmm_config(call).map(drop)),
    ];
    for (name, check) in checks {
        builder.register(name, move |call, cx| {
            check(call)?;
            Ok(cx.keep(call, Unbacked::new()))
        });
    }
    builder.register("prefetch", |call, cx| {
        call.expect_args(1, &[])?;
        cx.upstream(call, 0)
    })
}

/// The driver pools under the `async` leaves of built stacks, to ask what
/// they reserve: the driver's pool can hold more than the stack holds from
/// it (its release threshold, other users of a shared pool). Held weakly,
/// so a stack that goes takes its pools out of the figures.
///
/// # Examples
///
/// ```
/// let pools = memres_cuda::stack::DriverPools::default();
/// assert_eq!(pools.reserved(), (0, 0));
/// ```
#[derive(Debug, Default)]
pub struct DriverPools {
    /// `async` leaves of device memory (`pool=own` or `pool=default`).
    own: Vec<Weak<Counted<CudaAsyncMemory>>>,
    /// `async(pool=managed)` leaves.
    managed: Vec<Weak<Counted<CudaAsyncManagedMemory>>>,
}

impl DriverPools {
    /// Adds the `async` leaves of `built`, a stack built with the names of
    /// [`register`], and forgets those of stacks that are gone.
    pub fn note<S: ?Sized>(&mut self, built: &Built<S>) {
        self.own.retain(|w| w.strong_count() > 0);
        self.managed.retain(|w| w.strong_count() > 0);
        self.own.extend(built.all::<Counted<CudaAsyncMemory>>("async").iter().map(Arc::downgrade));
        self.managed.extend(built.all::<Counted<CudaAsyncManagedMemory>>("async").iter().map(Arc::downgrade));
    }

    /// What the pools of the live leaves reserve: `(bytes now, the sum of
    /// each pool's most)`, each pool once ([`reserved_by`](crate::reserved_by)).
    pub fn reserved(&self) -> (u64, u64) {
        let own: Vec<_> = self.own.iter().filter_map(Weak::upgrade).collect();
        let managed: Vec<_> = self.managed.iter().filter_map(Weak::upgrade).collect();
        crate::reserved_by(own.iter().map(|l| l.inner()).chain(managed.iter().map(|l| l.inner().pool())))
    }
}
