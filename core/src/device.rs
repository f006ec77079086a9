//! The current resource of each device, with RMM's four functions
//! (feature `std`): [`get_current_device_resource`],
//! [`set_current_device_resource`], [`get_per_device_resource`] and
//! [`set_per_device_resource`]. Setting returns the resource it replaces.
//!
//! A [`Registry`] maps (stream type, device id) to a
//! [`DynResource<S>`](crate::DynResource). One process-wide registry is
//! reached through the free functions; separate registries can be made for
//! tests or subsystems.
//!
//! # The current device
//!
//! Which device is current on the calling thread is the backend's to say:
//! it registers a query for its stream type
//! ([`set_current_device_query`]; the CUDA backend's asks the driver, as
//! RMM's `get_current_cuda_device`). For a stream type with none, the
//! current device is device 0.
//!
//! # Default
//!
//! A `get` for a device nobody set a resource for asks the default factory
//! registered for that stream type ([`Registry::set_default_factory`]; a
//! backend registers its own, as RMM's CUDA resource is the default),
//! stores what it makes as that device's resource and returns it, so later
//! `get`s return the same resource. With no factory registered, the `get`
//! is an error ([`Error::InvalidConfig`]) and nothing is stored.
//!
//! # Examples
//!
//! ```
//! use memres_core::device::{get_per_device_resource, set_per_device_resource};
//! use memres_core::{DynResource, MemoryResource, Request};
//! # use memres_core::testing::BumpUpstream;
//! use std::sync::Arc;
//! let r: DynResource = Arc::new(BumpUpstream::new(1 << 20));
//! assert!(set_per_device_resource::<()>(7, r.clone()).is_none());
//! let got = get_per_device_resource::<()>(7)?;
//! assert!(Arc::ptr_eq(&got, &r));
//! let b = got.allocate(Request::new(64)?, &())?;
//! got.deallocate(b, &())?;
//! # Ok::<(), memres_core::Error>(())
//! ```

use crate::{DynResource, Error, Result, Stream};
use alloc::boxed::Box;
use alloc::collections::btree_map::{BTreeMap, Entry};
use core::any::{Any, TypeId};
use std::sync::RwLock;

/// A device id (a CUDA device ordinal, or any number a backend chooses).
///
/// ```
/// let first_gpu: memres_core::device::DeviceId = 0;
/// # let _ = first_gpu;
/// ```
pub type DeviceId = u32;

/// Makes the default resource of a device for one stream type (a backend's
/// registration: a plain function, so that it can be stored for any `S`).
///
/// ```
/// use memres_core::device::{DeviceId, Factory};
/// use memres_core::{DynResource, Error};
/// # use memres_core::testing::BumpUpstream;
/// # use std::sync::Arc;
/// fn make(device: DeviceId) -> Result<DynResource, Error> {
///     Ok(Arc::new(BumpUpstream::new(1 << 30)))
/// }
/// let f: Factory<()> = make;
/// assert!(f(0).is_ok());
/// ```
pub type Factory<S> = fn(DeviceId) -> Result<DynResource<S>>;

/// Says which device is current on the calling thread, for one stream type
/// (a backend's registration).
///
/// ```
/// use memres_core::device::CurrentDevice;
/// let q: CurrentDevice = || Ok(0);
/// assert_eq!(q(), Ok(0));
/// ```
pub type CurrentDevice = fn() -> Result<DeviceId>;

/// Resources per (stream type, device id), and default factories and
/// current-device queries per stream type, each behind a reader-writer
/// lock.
///
/// ```text
///  resources: (TypeId of S, device) ─► Box<DynResource<S>>   (as dyn Any)
///  factories:  TypeId of S          ─► Box<Factory<S>>       (as dyn Any)
///  queries:    TypeId of S          ─► CurrentDevice
/// ```
///
/// # Examples
///
/// ```
/// use memres_core::device::Registry;
/// use memres_core::{DynResource, Error};
/// # use memres_core::testing::BumpUpstream;
/// use std::sync::Arc;
/// let reg = Registry::new();
/// assert!(matches!(reg.get_per_device_resource::<()>(0), Err(Error::InvalidConfig { .. })));
/// reg.set_default_factory::<()>(|_device| Ok(Arc::new(BumpUpstream::new(1 << 20)) as DynResource));
/// let a = reg.get_current_device_resource::<()>()?; // device 0: no query registered
/// assert!(Arc::ptr_eq(&a, &reg.get_per_device_resource::<()>(0)?)); // made once, then kept
/// # Ok::<(), Error>(())
/// ```
#[derive(Debug)]
pub struct Registry {
    /// Each value is a `DynResource<S>` for the `S` whose `TypeId` is in
    /// its key.
    resources: RwLock<BTreeMap<(TypeId, DeviceId), Box<dyn Any + Send + Sync>>>,
    /// Each value is a `Factory<S>` for the `S` whose `TypeId` is its key.
    factories: RwLock<BTreeMap<TypeId, Box<dyn Any + Send + Sync>>>,
    /// The current-device query of each stream type that registered one.
    queries: RwLock<BTreeMap<TypeId, CurrentDevice>>,
}

impl Default for Registry {
    fn default() -> Self {
        Self::new()
    }
}

impl Registry {
    /// An empty registry: no resources, no factories, no queries.
    ///
    /// ```
    /// # use memres_core::device::Registry;
    /// assert!(Registry::new().get_per_device_resource::<()>(0).is_err());
    /// ```
    pub const fn new() -> Self {
        Registry {
            resources: RwLock::new(BTreeMap::new()),
            factories: RwLock::new(BTreeMap::new()),
            queries: RwLock::new(BTreeMap::new()),
        }
    }

    /// Makes `resource` the resource of `device` for streams of type `S`,
    /// and returns the one it replaces (RMM's `set_per_device_resource`).
    ///
    /// ```
    /// # use memres_core::device::Registry;
    /// # use memres_core::DynResource;
    /// # use memres_core::testing::BumpUpstream;
    /// # use std::sync::Arc;
    /// let reg = Registry::new();
    /// let r: DynResource = Arc::new(BumpUpstream::new(1 << 20));
    /// assert!(reg.set_per_device_resource::<()>(0, r.clone()).is_none());
    /// assert!(reg.set_per_device_resource::<()>(0, r).is_some());
    /// ```
    pub fn set_per_device_resource<S: Stream + ?Sized + 'static>(
        &self,
        device: DeviceId,
        resource: DynResource<S>,
    ) -> Option<DynResource<S>> {
        let mut map = self.resources.write().unwrap_or_else(|p| p.into_inner());
        map.insert((TypeId::of::<S>(), device), Box::new(resource)).map(downcast::<DynResource<S>>)
    }

    /// The resource of `device` for streams of type `S`; if none was set,
    /// the one the default factory makes (then kept). RMM's
    /// `get_per_device_resource`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] when none was set and no default factory is
    /// registered for `S`, or when the factory, making the device's
    /// resource, asks for it (a factory may wrap another device's); the
    /// factory's error if it fails (nothing is stored then).
    ///
    /// ```
    /// # use memres_core::device::Registry;
    /// assert!(Registry::new().get_per_device_resource::<()>(3).is_err());
    /// ```
    pub fn get_per_device_resource<S: Stream + ?Sized + 'static>(
        &self,
        device: DeviceId,
    ) -> Result<DynResource<S>> {
        if let Some(r) = self.existing_per_device_resource(device) {
            return Ok(r);
        }
        let factory = self
            .factories
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&TypeId::of::<S>())
            .map(|f| *downcast_ref::<Factory<S>>(f))
            .ok_or(Error::InvalidConfig {
                what: "no resource set for this device and no default factory registered \
                       (memres::device::install_defaults registers the backends')",
            })?;
        // Made outside the lock (a factory may be slow, or use the registry);
        // if two threads race, the first one stored wins and both return it.
        let made = {
            let _making =
                Making::begin(self, TypeId::of::<S>(), Some(device)).ok_or(Error::InvalidConfig {
                    what: "the default factory asked for the resource it is making (its device's, before \
                       it was stored)",
                })?;
            factory(device)?
        };
        let (stored, lost) = {
            let mut map = self.resources.write().unwrap_or_else(|p| p.into_inner());
            match map.entry((TypeId::of::<S>(), device)) {
                Entry::Occupied(e) => (downcast_ref::<DynResource<S>>(e.get()).clone(), Some(made)),
                Entry::Vacant(e) => (downcast_ref::<DynResource<S>>(e.insert(Box::new(made))).clone(), None),
            }
        };
        // The loser's resource drops with the lock gone: its `Drop` may use
        // the registry.
        drop(lost);
        Ok(stored)
    }

    /// The resource of `device` for streams of type `S` if it has one (set,
    /// or made by the default factory); never makes one. A factory that
    /// serializes the threads racing to make a device's first resource
    /// asks it for the one stored while they waited.
    ///
    /// ```
    /// # use memres_core::device::Registry;
    /// # use memres_core::DynResource;
    /// # use memres_core::testing::BumpUpstream;
    /// # use std::sync::Arc;
    /// let reg = Registry::new();
    /// reg.set_default_factory::<()>(|_device| Ok(Arc::new(BumpUpstream::new(256)) as DynResource));
    /// assert!(reg.existing_per_device_resource::<()>(0).is_none()); // the factory is not asked
    /// let made = reg.get_per_device_resource::<()>(0)?;
    /// assert!(Arc::ptr_eq(&reg.existing_per_device_resource::<()>(0).unwrap(), &made));
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    pub fn existing_per_device_resource<S: Stream + ?Sized + 'static>(
        &self,
        device: DeviceId,
    ) -> Option<DynResource<S>> {
        let map = self.resources.read().unwrap_or_else(|p| p.into_inner());
        map.get(&(TypeId::of::<S>(), device)).map(|r| downcast_ref::<DynResource<S>>(r).clone())
    }

    /// The resource of the device current on the calling thread (see
    /// [`current_device`](Self::current_device)), as
    /// [`get_per_device_resource`](Self::get_per_device_resource). RMM's
    /// `get_current_device_resource`.
    ///
    /// # Errors
    ///
    /// The query's error, or [`get_per_device_resource`](Self::get_per_device_resource)'s.
    ///
    /// ```
    /// # use memres_core::device::Registry;
    /// # use memres_core::DynResource;
    /// # use memres_core::testing::BumpUpstream;
    /// # use std::sync::Arc;
    /// let reg = Registry::new();
    /// reg.set_current_device_query::<()>(|| Ok(3));
    /// let r: DynResource = Arc::new(BumpUpstream::new(1 << 20));
    /// reg.set_per_device_resource::<()>(3, r.clone());
    /// assert!(Arc::ptr_eq(&reg.get_current_device_resource::<()>()?, &r));
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    pub fn get_current_device_resource<S: Stream + ?Sized + 'static>(&self) -> Result<DynResource<S>> {
        self.get_per_device_resource(self.current_device::<S>()?)
    }

    /// Makes `resource` the resource of the device current on the calling
    /// thread, and returns the one it replaces. RMM's
    /// `set_current_device_resource`.
    ///
    /// # Errors
    ///
    /// The current-device query's error; nothing is set then.
    ///
    /// ```
    /// # use memres_core::device::Registry;
    /// # use memres_core::DynResource;
    /// # use memres_core::testing::BumpUpstream;
    /// # use std::sync::Arc;
    /// let reg = Registry::new();
    /// let (a, b): (DynResource, DynResource) = (Arc::new(BumpUpstream::new(256)), Arc::new(BumpUpstream::new(256)));
    /// assert!(reg.set_current_device_resource::<()>(a.clone())?.is_none());
    /// assert!(Arc::ptr_eq(&reg.set_current_device_resource::<()>(b)?.unwrap(), &a));
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    pub fn set_current_device_resource<S: Stream + ?Sized + 'static>(
        &self,
        resource: DynResource<S>,
    ) -> Result<Option<DynResource<S>>> {
        Ok(self.set_per_device_resource(self.current_device::<S>()?, resource))
    }

    /// Registers how to tell the device current on the calling thread for
    /// streams of type `S`; returns whether a query was replaced.
    ///
    /// ```
    /// # use memres_core::device::Registry;
    /// let reg = Registry::new();
    /// assert!(!reg.set_current_device_query::<()>(|| Ok(1)));
    /// assert_eq!(reg.current_device::<()>(), Ok(1));
    /// ```
    pub fn set_current_device_query<S: Stream + ?Sized + 'static>(&self, query: CurrentDevice) -> bool {
        let mut map = self.queries.write().unwrap_or_else(|p| p.into_inner());
        map.insert(TypeId::of::<S>(), query).is_some()
    }

    /// Registers `query` for streams of type `S` unless one is registered
    /// already; returns whether it was: how a backend installs its default
    /// without replacing the program's own.
    ///
    /// ```
    /// # use memres_core::device::Registry;
    /// let reg = Registry::new();
    /// reg.set_current_device_query::<()>(|| Ok(1));
    /// assert!(!reg.set_current_device_query_if_absent::<()>(|| Ok(2)));
    /// assert_eq!(reg.current_device::<()>(), Ok(1));
    /// ```
    pub fn set_current_device_query_if_absent<S: Stream + ?Sized + 'static>(
        &self,
        query: CurrentDevice,
    ) -> bool {
        let mut map = self.queries.write().unwrap_or_else(|p| p.into_inner());
        let absent = !map.contains_key(&TypeId::of::<S>());
        map.entry(TypeId::of::<S>()).or_insert(query);
        absent
    }

    /// The device current on the calling thread for streams of type `S`:
    /// what the registered query says, else device 0.
    ///
    /// # Errors
    ///
    /// The query's; [`Error::InvalidConfig`] when the query asks for the
    /// current device itself.
    ///
    /// ```
    /// # use memres_core::device::Registry;
    /// assert_eq!(Registry::new().current_device::<()>(), Ok(0));
    /// ```
    pub fn current_device<S: Stream + ?Sized + 'static>(&self) -> Result<DeviceId> {
        let query = self.queries.read().unwrap_or_else(|p| p.into_inner()).get(&TypeId::of::<S>()).copied();
        let Some(query) = query else { return Ok(0) };
        let _asking = Making::begin(self, TypeId::of::<S>(), None)
            .ok_or(Error::InvalidConfig { what: "the current-device query asked for the current device" })?;
        query()
    }

    /// Registers the factory that makes a device's resource for streams of
    /// type `S` when none was set; returns whether one was replaced.
    ///
    /// ```
    /// # use memres_core::device::Registry;
    /// # use memres_core::DynResource;
    /// # use memres_core::testing::BumpUpstream;
    /// # use std::sync::Arc;
    /// let reg = Registry::new();
    /// assert!(!reg.set_default_factory::<()>(|_| Ok(Arc::new(BumpUpstream::new(256)) as DynResource)));
    /// assert!(reg.get_per_device_resource::<()>(1).is_ok());
    /// ```
    pub fn set_default_factory<S: Stream + ?Sized + 'static>(&self, factory: Factory<S>) -> bool {
        let mut map = self.factories.write().unwrap_or_else(|p| p.into_inner());
        map.insert(TypeId::of::<S>(), Box::new(factory)).is_some()
    }

    /// Registers `factory` for streams of type `S` unless one is registered
    /// already; returns whether it was: how a backend installs its default
    /// without replacing the program's own.
    ///
    /// ```
    /// # use memres_core::device::Registry;
    /// # use memres_core::DynResource;
    /// # use memres_core::testing::BumpUpstream;
    /// # use std::sync::Arc;
    /// let reg = Registry::new();
    /// let factory = |_| Ok(Arc::new(BumpUpstream::new(256)) as DynResource);
    /// assert!(reg.set_default_factory_if_absent::<()>(factory));
    /// assert!(!reg.set_default_factory_if_absent::<()>(factory));
    /// ```
    pub fn set_default_factory_if_absent<S: Stream + ?Sized + 'static>(&self, factory: Factory<S>) -> bool {
        let mut map = self.factories.write().unwrap_or_else(|p| p.into_inner());
        let absent = !map.contains_key(&TypeId::of::<S>());
        map.entry(TypeId::of::<S>()).or_insert_with(|| Box::new(factory));
        absent
    }

    /// Forgets the resource of `device` for streams of type `S` (the next
    /// get asks the factory again), and returns it.
    ///
    /// ```
    /// # use memres_core::device::Registry;
    /// assert!(Registry::new().reset_per_device_resource::<()>(0).is_none());
    /// ```
    pub fn reset_per_device_resource<S: Stream + ?Sized + 'static>(
        &self,
        device: DeviceId,
    ) -> Option<DynResource<S>> {
        let mut map = self.resources.write().unwrap_or_else(|p| p.into_inner());
        map.remove(&(TypeId::of::<S>(), device)).map(downcast::<DynResource<S>>)
    }
}

/// Every value under a key with `TypeId::of::<S>()` was stored as the type
/// the key names, so these downcasts cannot fail.
fn downcast<T: 'static>(b: Box<dyn Any + Send + Sync>) -> T {
    *b.downcast::<T>().expect("registry entries have the type their key names")
}

// Takes the box, not `&dyn Any`: a `&Box<dyn Any>` would coerce to a
// `&dyn Any` whose type is the box itself.
#[allow(clippy::borrowed_box)]
fn downcast_ref<T: 'static>(b: &Box<dyn Any + Send + Sync>) -> &T {
    (**b).downcast_ref::<T>().expect("registry entries have the type their key names")
}

static GLOBAL: Registry = Registry::new();

/// The process-wide registry.
///
/// ```
/// # use memres_core::device::global;
/// let _ = global().get_per_device_resource::<()>(1234);
/// ```
pub fn global() -> &'static Registry {
    &GLOBAL
}

/// The resource of the device current on the calling thread (streams of
/// type `S`) in the process-wide registry; see
/// [`Registry::get_current_device_resource`].
///
/// # Errors
///
/// As [`Registry::get_current_device_resource`].
///
/// ```
/// # use memres_core::device::get_current_device_resource;
/// struct NeverRegistered;
/// # impl memres_core::Stream for NeverRegistered {
/// #     type Event = ();
/// #     fn id(&self) -> u64 { 0 }
/// #     fn record(&self) -> memres_core::Result<()> { Ok(()) }
/// #     fn wait(&self, _: &()) -> memres_core::Result<()> { Ok(()) }
/// #     fn query(&self, _: &()) -> memres_core::Result<bool> { Ok(true) }
/// #     fn synchronize(&self) -> memres_core::Result<()> { Ok(()) }
/// # }
/// assert!(get_current_device_resource::<NeverRegistered>().is_err());
/// ```
pub fn get_current_device_resource<S: Stream + ?Sized + 'static>() -> Result<DynResource<S>> {
    GLOBAL.get_current_device_resource()
}

/// Makes `resource` the resource of the device current on the calling
/// thread (streams of type `S`) in the process-wide registry; returns the
/// one it replaces. See [`Registry::set_current_device_resource`].
///
/// # Errors
///
/// The current-device query's error; nothing is set then.
///
/// ```
/// # use memres_core::device::{set_current_device_resource, get_current_device_resource};
/// # use memres_core::DynResource;
/// # use memres_core::testing::BumpUpstream;
/// # use std::sync::Arc;
/// # struct Mine;
/// # impl memres_core::Stream for Mine {
/// #     type Event = ();
/// #     fn id(&self) -> u64 { 0 }
/// #     fn record(&self) -> memres_core::Result<()> { Ok(()) }
/// #     fn wait(&self, _: &()) -> memres_core::Result<()> { Ok(()) }
/// #     fn query(&self, _: &()) -> memres_core::Result<bool> { Ok(true) }
/// #     fn synchronize(&self) -> memres_core::Result<()> { Ok(()) }
/// # }
/// let r: DynResource<Mine> = Arc::new(BumpUpstream::new(256));
/// assert!(set_current_device_resource::<Mine>(r)?.is_none());
/// assert!(get_current_device_resource::<Mine>().is_ok());
/// # Ok::<(), memres_core::Error>(())
/// ```
pub fn set_current_device_resource<S: Stream + ?Sized + 'static>(
    resource: DynResource<S>,
) -> Result<Option<DynResource<S>>> {
    GLOBAL.set_current_device_resource(resource)
}

/// The resource of `device` (streams of type `S`) in the process-wide
/// registry; see [`Registry::get_per_device_resource`].
///
/// # Errors
///
/// As [`Registry::get_per_device_resource`].
///
/// ```
/// # use memres_core::device::get_per_device_resource;
/// struct NeverRegistered;
/// # impl memres_core::Stream for NeverRegistered {
/// #     type Event = ();
/// #     fn id(&self) -> u64 { 0 }
/// #     fn record(&self) -> memres_core::Result<()> { Ok(()) }
/// #     fn wait(&self, _: &()) -> memres_core::Result<()> { Ok(()) }
/// #     fn query(&self, _: &()) -> memres_core::Result<bool> { Ok(true) }
/// #     fn synchronize(&self) -> memres_core::Result<()> { Ok(()) }
/// # }
/// assert!(get_per_device_resource::<NeverRegistered>(0).is_err());
/// ```
pub fn get_per_device_resource<S: Stream + ?Sized + 'static>(device: DeviceId) -> Result<DynResource<S>> {
    GLOBAL.get_per_device_resource(device)
}

/// Makes `resource` the resource of `device` (streams of type `S`) in the
/// process-wide registry; returns the one it replaces. See
/// [`Registry::set_per_device_resource`].
///
/// ```
/// # use memres_core::device::{set_per_device_resource, get_per_device_resource};
/// # use memres_core::DynResource;
/// # use memres_core::testing::BumpUpstream;
/// # use std::sync::Arc;
/// set_per_device_resource::<()>(42, Arc::new(BumpUpstream::new(256)) as DynResource);
/// assert!(get_per_device_resource::<()>(42).is_ok());
/// ```
pub fn set_per_device_resource<S: Stream + ?Sized + 'static>(
    device: DeviceId,
    resource: DynResource<S>,
) -> Option<DynResource<S>> {
    GLOBAL.set_per_device_resource(device, resource)
}

/// Registers the default factory for streams of type `S` in the
/// process-wide registry; see [`Registry::set_default_factory`].
///
/// ```
/// # use memres_core::device::{set_default_factory, get_per_device_resource};
/// # use memres_core::DynResource;
/// # use memres_core::testing::BumpUpstream;
/// # use std::sync::Arc;
/// set_default_factory::<()>(|_| Ok(Arc::new(BumpUpstream::new(1 << 20)) as DynResource));
/// assert!(get_per_device_resource::<()>(99).is_ok());
/// ```
pub fn set_default_factory<S: Stream + ?Sized + 'static>(factory: Factory<S>) -> bool {
    GLOBAL.set_default_factory(factory)
}

/// Registers the current-device query for streams of type `S` in the
/// process-wide registry; see [`Registry::set_current_device_query`].
///
/// ```
/// # use memres_core::device::{current_device, set_current_device_query};
/// # struct Mine;
/// # impl memres_core::Stream for Mine {
/// #     type Event = ();
/// #     fn id(&self) -> u64 { 0 }
/// #     fn record(&self) -> memres_core::Result<()> { Ok(()) }
/// #     fn wait(&self, _: &()) -> memres_core::Result<()> { Ok(()) }
/// #     fn query(&self, _: &()) -> memres_core::Result<bool> { Ok(true) }
/// #     fn synchronize(&self) -> memres_core::Result<()> { Ok(()) }
/// # }
/// set_current_device_query::<Mine>(|| Ok(2));
/// assert_eq!(current_device::<Mine>(), Ok(2));
/// ```
pub fn set_current_device_query<S: Stream + ?Sized + 'static>(query: CurrentDevice) -> bool {
    GLOBAL.set_current_device_query::<S>(query)
}

/// The device current on the calling thread for streams of type `S`, as
/// the process-wide registry tells it; see [`Registry::current_device`].
///
/// # Errors
///
/// The query's.
///
/// ```
/// # use memres_core::device::current_device;
/// assert_eq!(current_device::<()>(), Ok(0));
/// ```
pub fn current_device<S: Stream + ?Sized + 'static>() -> Result<DeviceId> {
    GLOBAL.current_device::<S>()
}

mod memory_of;
pub use memory_of::{
    get_per_device_resource_of, promise_memory_of, promise_memory_of_unchecked, set_per_device_resource_of,
    CurrentResource, DeviceStream,
};

std::thread_local! {
    /// What this thread's default factories are making (a registry, a
    /// stream type, a device) and its current-device queries are asking
    /// (no device), innermost last.
    static MAKING: core::cell::RefCell<alloc::vec::Vec<(usize, TypeId, Option<DeviceId>)>> =
        const { core::cell::RefCell::new(alloc::vec::Vec::new()) };
}

/// A factory making a device's default, or a query asking for the current
/// device, on this thread until dropped. One that asks for what it is
/// making would run itself again, without end: it recursed until the
/// stack overflowed, which aborts the process.
struct Making((usize, TypeId, Option<DeviceId>));

impl Making {
    /// `None` if this thread is making it already.
    fn begin(registry: &Registry, stream: TypeId, device: Option<DeviceId>) -> Option<Making> {
        let key = (registry as *const Registry as usize, stream, device);
        // At the thread's exit, with its list gone, nothing is refused.
        let fresh = MAKING
            .try_with(|m| {
                let mut m = m.borrow_mut();
                let fresh = !m.contains(&key);
                if fresh {
                    m.push(key);
                }
                fresh
            })
            .unwrap_or(true);
        fresh.then_some(Making(key))
    }
}

impl Drop for Making {
    fn drop(&mut self) {
        let _ = MAKING.try_with(|m| {
            let mut m = m.borrow_mut();
            if let Some(i) = m.iter().rposition(|k| *k == self.0) {
                m.remove(i);
            }
        });
    }
}

#[cfg(all(test, not(loom)))]
mod tests;
