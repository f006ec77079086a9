//! Current resources that are memory of a copy engine: what the containers
//! made without a resource use.
//!
//! The registry hands out [`DynResource`]s, which the types cannot vouch
//! for as [`MemoryOf`] any engine. So a resource is *promised*, once, as
//! memory of an engine `E`: through a [`MemoryOf<E>`] bound
//! ([`promise_memory_of`], [`Registry::set_per_device_resource_of`]) or by hand (the `unsafe`
//! [`promise_memory_of_unchecked`]). The promise names the resource object
//! (its `Arc` allocation) and the engine value to use with it;
//! [`Registry::get_per_device_resource_of`] hands out a device's current resource for `E` only
//! if that very object was promised for `E`.
//!
//! ```text
//!  set_per_device_resource_of(device, Arc<R: MemoryOf<E>>, engine) ─► promises: (K, E, address of R) ─► Weak<R>, engine
//!                                              └► set_per_device_resource(device, R)          (the current resource)
//!  get_per_device_resource_of::<K, E>(device) ─► get_per_device_resource(device) ─► r ─► promised for E?  ─► (CurrentResource<K, E>, engine)
//!                                                 no ─► InvalidConfig
//! ```
//!
//! So the containers see the same current resource as every other user of
//! the registry, and refuse (a typed error) one that was set without a
//! promise, such as a simulated device (numbers with no bytes behind them).
//! A backend's default factory promises what it makes, so that the default
//! resource serves the containers too.

use super::{DeviceId, Registry, GLOBAL};
use crate::copy::MemoryOf;
use crate::{Block, DynResource, Error, MemoryResource, Request, Result, Stream};
use alloc::boxed::Box;
use alloc::collections::BTreeMap;
use alloc::sync::{Arc, Weak};
use alloc::vec::Vec;
use core::any::{Any, TypeId};
use core::fmt;
use core::marker::PhantomData;
use std::sync::RwLock;

/// A stream that names its device, and the stream type its device's
/// resources are registered under: the stream itself, or for a reference
/// the stream it borrows (containers hold `&CudaStream` while the registry
/// holds resources for `CudaStream`).
///
/// `()` is the stream of device 0.
///
/// ```
/// use memres_core::device::DeviceStream;
/// fn key_of<S: DeviceStream>(s: &S) -> &S::Key {
///     s.key()
/// }
/// assert_eq!((*key_of(&&()), ().device()), ((), 0));
/// ```
pub trait DeviceStream: Stream {
    /// The stream type the device's resources are registered under.
    type Key: Stream + ?Sized + 'static;
    /// The stream as that type.
    fn key(&self) -> &Self::Key;
    /// The device the stream's work runs on.
    fn device(&self) -> DeviceId;
}

impl DeviceStream for () {
    type Key = ();
    fn key(&self) -> &() {
        self
    }
    fn device(&self) -> DeviceId {
        0
    }
}

impl<S: DeviceStream + ?Sized + 'static> DeviceStream for &S {
    type Key = S::Key;
    fn key(&self) -> &S::Key {
        (**self).key()
    }
    fn device(&self) -> DeviceId {
        (**self).device()
    }
}

/// A device's current resource, promised to be memory of the engine `E`:
/// what [`Registry::get_per_device_resource_of`] hands out and the containers made without a
/// resource hold. It serves every stream whose [`DeviceStream::Key`] is `K`.
///
/// Made only from a promised resource, so it is [`MemoryOf<E>`].
pub struct CurrentResource<K: ?Sized + 'static, E> {
    /// An object promised for `E` (see the module's documentation).
    resource: DynResource<K>,
    /// Invariant in `E`: the promise is for `E` alone, not for a type
    /// that differs from it by a lifetime. Holds no `E`: `Send` and `Sync`
    /// whatever `E` is.
    _engine: PhantomData<fn(&E) -> E>,
}

impl<K: ?Sized + 'static, E> CurrentResource<K, E> {
    /// The resource, as the registry holds it.
    pub fn resource(&self) -> &DynResource<K> {
        &self.resource
    }
}

impl<K: ?Sized + 'static, E> Clone for CurrentResource<K, E> {
    fn clone(&self) -> Self {
        CurrentResource { resource: self.resource.clone(), _engine: PhantomData }
    }
}

impl<K: ?Sized + 'static, E> fmt::Debug for CurrentResource<K, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CurrentResource")
            .field("resource", &Arc::as_ptr(&self.resource).cast::<()>())
            .finish()
    }
}

impl<K: Stream + ?Sized + 'static, S: DeviceStream<Key = K> + ?Sized, E> MemoryResource<S>
    for CurrentResource<K, E>
{
    #[inline]
    fn allocate(&self, request: Request, stream: &S) -> Result<Block> {
        self.resource.allocate(request, stream.key())
    }
    #[inline]
    fn deallocate(&self, block: Block, stream: &S) -> Result<()> {
        self.resource.deallocate(block, stream.key())
    }
    /// The resource itself: this is a view of it, as
    /// [`AssumeMemoryOf`](crate::copy::AssumeMemoryOf) is.
    #[inline]
    fn id(&self) -> crate::ResourceId {
        self.resource.id()
    }
}

// SAFETY: a `CurrentResource` is made only by `Registry::get_per_device_resource_of`, from a
// resource object found in `PROMISES` under `E`; an entry is made only by
// `promise_memory_of`, whose bound `R: MemoryOf<E>` holds for the object, or
// by `promise_memory_of_unchecked`, whose caller promises it. The entry's
// `Weak` keeps the object's allocation, so no other object can have its
// address while the entry exists: the resource found is the promised object,
// and its blocks are handed out unchanged here, on the stream it serves.
unsafe impl<K: ?Sized + 'static, E> MemoryOf<E> for CurrentResource<K, E> {}

/// What `PROMISES` holds under one key, with its types erased.
trait Promise: Any + Send + Sync {
    /// Whether the promised object still lives.
    fn is_alive(&self) -> bool;
    fn as_any(&self) -> &dyn Any;
}

/// A promise that the object behind `resource` is memory of engines of type
/// `E`, and the engine to use with it.
struct Promised<K: ?Sized + 'static, E> {
    /// Keeps the object's allocation (not the object), so its address stays
    /// its own while the promise is listed.
    resource: Weak<dyn MemoryResource<K> + Send + Sync>,
    /// Shared, so that the engine's `Clone` and `Drop` (user code, which
    /// may use the promises) run with `PROMISES` unlocked.
    engine: Arc<E>,
}

impl<K: ?Sized + 'static, E: Send + Sync + 'static> Promise for Promised<K, E> {
    fn is_alive(&self) -> bool {
        self.resource.strong_count() > 0
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// (stream key type, engine type, address of the resource object) to a
/// `Promised<K, E>` of those types.
type Promises = BTreeMap<(TypeId, TypeId, usize), Box<dyn Promise>>;

static PROMISES: RwLock<Promises> = RwLock::new(BTreeMap::new());

fn address<K: ?Sized>(resource: &DynResource<K>) -> usize {
    Arc::as_ptr(resource).cast::<()>() as usize
}

/// Promises that `resource` is memory of engines of type `E`, to be used
/// with `engine`: wherever it is (or becomes) a device's current resource
/// for streams of type `K`, [`Registry::get_per_device_resource_of`] hands it out for `E`. A
/// backend's default factory calls this on what it makes. A second promise
/// of the same object for the same `E` replaces the engine.
///
/// The promise lasts as long as the object. It costs an entry that holds
/// the engine and keeps the object's `Arc` allocation (not the object), so
/// that no other object takes its address while the promise is listed. Once
/// the object is gone, the entry, and the engine with it, is dropped by the
/// next promise or the next lookup that finds a resource
/// ([`Registry::get_per_device_resource_of`], a container made without a
/// resource), whatever object either is about: an engine that holds much
/// (a CUDA context) is held until then.
///
/// ```
/// use memres_core::device::{promise_memory_of, Registry};
/// use memres_core::copy::MemoryOf;
/// # use memres_core::{Block, MemoryResource, Request, Result};
/// # struct Host;
/// # impl MemoryResource for Host {
/// #     fn allocate(&self, _: Request, _: &()) -> Result<Block> { Ok(Block::EMPTY) }
/// #     fn deallocate(&self, _: Block, _: &()) -> Result<()> { Ok(()) }
/// # }
/// # #[derive(Clone)]
/// # struct HostEngine;
/// # // SAFETY: hands out nothing.
/// # unsafe impl MemoryOf<HostEngine> for Host {}
/// use std::sync::Arc;
/// let host = Arc::new(Host); // `Host: MemoryOf<HostEngine>`
/// promise_memory_of::<(), _, _>(&host, HostEngine);
/// let reg = Registry::new();
/// reg.set_per_device_resource::<()>(0, host);
/// assert!(reg.get_per_device_resource_of::<(), HostEngine>(0).is_ok());
/// ```
pub fn promise_memory_of<K, E, R>(resource: &Arc<R>, engine: E)
where
    K: Stream + ?Sized + 'static,
    E: Send + Sync + 'static,
    R: MemoryResource<K> + MemoryOf<E> + Send + Sync + 'static,
{
    let erased: DynResource<K> = resource.clone();
    // SAFETY: the object is an `R`, and `R: MemoryOf<E>`.
    unsafe { promise_memory_of_unchecked(&erased, engine) }
}

/// [`promise_memory_of`] for a resource whose type is erased (a stack built
/// from a string): the promise is made by hand.
///
/// # Safety
///
/// The object behind `resource` must meet the contract of [`MemoryOf<E>`]
/// for every block it hands out, as long as it lives (see
/// [`AssumeMemoryOf::new`](crate::copy::AssumeMemoryOf::new)).
pub unsafe fn promise_memory_of_unchecked<K, E>(resource: &DynResource<K>, engine: E)
where
    K: Stream + ?Sized + 'static,
    E: Send + Sync + 'static,
{
    let key = (TypeId::of::<K>(), TypeId::of::<E>(), address(resource));
    let promise = Promised::<K, E> { resource: Arc::downgrade(resource), engine: Arc::new(engine) };
    // The entries taken out drop after the lock goes: an engine's `Drop`
    // may use the promises.
    let gone = {
        let mut promises = PROMISES.write().unwrap_or_else(|p| p.into_inner());
        let mut gone = take_dead(&mut promises);
        gone.extend(promises.insert(key, Box::new(promise)));
        gone
    };
    drop(gone);
}

/// Takes out the entries whose objects are gone, for the caller to drop
/// once it lets go of the lock.
fn take_dead(promises: &mut Promises) -> Vec<Box<dyn Promise>> {
    let dead: Vec<_> = promises.iter().filter(|(_, p)| !p.is_alive()).map(|(k, _)| *k).collect();
    dead.iter().filter_map(|k| promises.remove(k)).collect()
}

/// The engine promised with `resource` for `E`, if it was promised; prunes
/// the entries whose objects are gone on the way.
fn promised_engine<K: ?Sized + 'static, E: Clone + 'static>(resource: &DynResource<K>) -> Option<E> {
    let key = (TypeId::of::<K>(), TypeId::of::<E>(), address(resource));
    let (engine, any_dead) = {
        let promises = PROMISES.read().unwrap_or_else(|p| p.into_inner());
        let engine = promises.get(&key).and_then(|p| p.as_any().downcast_ref::<Promised<K, E>>());
        // A look at each entry's count, under the read lock already taken:
        // the write lock only where there is something to prune.
        (engine.map(|p| p.engine.clone()), promises.values().any(|p| !p.is_alive()))
    };
    if any_dead {
        let gone = take_dead(&mut PROMISES.write().unwrap_or_else(|p| p.into_inner()));
        drop(gone);
    }
    // Cloned with the lock gone: an engine's `Clone` may use the promises.
    engine.map(|engine| E::clone(&engine))
}

const NOT_PROMISED: Error = Error::InvalidConfig {
    what: "the device's current resource is not promised to be memory of this copy engine \
           (set it with set_per_device_resource_of)",
};

impl Registry {
    /// Makes `resource` the current resource of `device` for streams of
    /// type `K`, promised as memory of `engine` ([`promise_memory_of`]);
    /// returns the one it replaces.
    ///
    /// ```
    /// # use memres_core::device::Registry;
    /// # use memres_core::copy::MemoryOf;
    /// # use memres_core::{Block, MemoryResource, Request, Result};
    /// # struct Host;
    /// # impl MemoryResource for Host {
    /// #     fn allocate(&self, _: Request, _: &()) -> Result<Block> { Ok(Block::EMPTY) }
    /// #     fn deallocate(&self, _: Block, _: &()) -> Result<()> { Ok(()) }
    /// # }
    /// # #[derive(Clone)]
    /// # struct HostEngine;
    /// # // SAFETY: hands out nothing.
    /// # unsafe impl MemoryOf<HostEngine> for Host {}
    /// # use std::sync::Arc;
    /// let reg = Registry::new();
    /// assert!(reg.set_per_device_resource_of::<(), _, _>(0, Arc::new(Host), HostEngine).is_none());
    /// let (_resource, _engine) = reg.get_per_device_resource_of::<(), HostEngine>(0)?;
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    pub fn set_per_device_resource_of<K, E, R>(
        &self,
        device: DeviceId,
        resource: Arc<R>,
        engine: E,
    ) -> Option<DynResource<K>>
    where
        K: Stream + ?Sized + 'static,
        E: Send + Sync + 'static,
        R: MemoryResource<K> + MemoryOf<E> + Send + Sync + 'static,
    {
        promise_memory_of::<K, E, R>(&resource, engine);
        self.set_per_device_resource::<K>(device, resource)
    }

    /// The current resource of `device` for streams of type `K` (see
    /// [`get_per_device_resource`](Self::get_per_device_resource): the default factory's if none was set), with the
    /// engine promised with it, if it was promised as memory of `E`.
    ///
    /// # Errors
    ///
    /// As [`get_per_device_resource`](Self::get_per_device_resource); [`Error::InvalidConfig`] if the resource was
    /// not promised for `E` (set through [`set_per_device_resource`](Self::set_per_device_resource) only, or made by
    /// a factory that does not promise it).
    pub fn get_per_device_resource_of<K, E>(&self, device: DeviceId) -> Result<(CurrentResource<K, E>, E)>
    where
        K: Stream + ?Sized + 'static,
        E: Clone + Send + Sync + 'static,
    {
        let resource = self.get_per_device_resource::<K>(device)?;
        let engine = promised_engine::<K, E>(&resource).ok_or(NOT_PROMISED)?;
        Ok((CurrentResource { resource, _engine: PhantomData }, engine))
    }
}

/// [`Registry::set_per_device_resource_of`] on the process-wide registry: the current resource
/// of `device` that the containers made without a resource use (and every
/// other user of the registry).
///
/// ```
/// # use memres_core::device::{get_per_device_resource_of, set_per_device_resource_of};
/// # use memres_core::copy::MemoryOf;
/// # use memres_core::{Block, MemoryResource, Request, Result};
/// # struct Host;
/// # impl MemoryResource for Host {
/// #     fn allocate(&self, _: Request, _: &()) -> Result<Block> { Ok(Block::EMPTY) }
/// #     fn deallocate(&self, _: Block, _: &()) -> Result<()> { Ok(()) }
/// # }
/// # #[derive(Clone)]
/// # struct HostEngine;
/// # // SAFETY: hands out nothing.
/// # unsafe impl MemoryOf<HostEngine> for Host {}
/// # use std::sync::Arc;
/// set_per_device_resource_of::<(), _, _>(77, Arc::new(Host), HostEngine);
/// assert!(get_per_device_resource_of::<(), HostEngine>(77).is_ok());
/// ```
pub fn set_per_device_resource_of<K, E, R>(
    device: DeviceId,
    resource: Arc<R>,
    engine: E,
) -> Option<DynResource<K>>
where
    K: Stream + ?Sized + 'static,
    E: Send + Sync + 'static,
    R: MemoryResource<K> + MemoryOf<E> + Send + Sync + 'static,
{
    GLOBAL.set_per_device_resource_of(device, resource, engine)
}

/// [`Registry::get_per_device_resource_of`] on the process-wide registry.
///
/// # Errors
///
/// As [`Registry::get_per_device_resource_of`].
pub fn get_per_device_resource_of<K, E>(device: DeviceId) -> Result<(CurrentResource<K, E>, E)>
where
    K: Stream + ?Sized + 'static,
    E: Clone + Send + Sync + 'static,
{
    GLOBAL.get_per_device_resource_of(device)
}

#[cfg(all(test, not(loom)))]
mod tests;
