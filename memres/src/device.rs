//! The current resource of each device, with a default on every device, as
//! in RMM: the core's registry ([`memres_core::device`], all of it
//! re-exported here) with the backends' defaults installed.
//!
//! # The default resource
//!
//! The four functions are RMM's, generic over the stream type `S` of the
//! resource (`()` where streams mean nothing; the quick start's is
//! inferred); they are the core's with the defaults installed first, as is
//! [`current_device`] (with `cuda`, the driver's current device). A device nobody set a resource for serves from:
//!
//! | features | `()` | [`SimStream`](memres_sim::SimStream) | `CudaStream` |
//! | --- | --- | --- | --- |
//! | `sim` (the default) | a simulated device ([`SimDevice`](memres_sim::SimDevice) of [`DEFAULT_SIM_CAPACITY`](memres_sim::DEFAULT_SIM_CAPACITY), numbers with no bytes behind them; device `d` is [`nth_sim_device`](memres_sim::nth_sim_device)`(.., d)`, with addresses no other device's default has (a [`SimDevice::new`](memres_sim::SimDevice::new) starts where device 0's does), for `d` below [`SIM_DEVICES`](memres_sim::SIM_DEVICES)) | the same | |
//! | `cuda` | the device's `cuMemAlloc` resource (`CudaMemory`, RMM's `cuda_memory_resource`), promised as memory of `CudaCopy` so that containers made without a resource use it | | the same |
//!
//! "The same" is the same object: a device's default is made once and
//! serves every stream type that has one (one simulated device per device
//! id, one log file), whichever thread or stream type asks first.
//! Other stream types have no default: a get is `InvalidConfig` until a
//! resource is set (or a factory registered).
//! With both features, `()` gets the CUDA resource. The defaults are
//! installed in the core's process-wide registry once, by the first call of
//! one of the four functions, [`get_per_device_resource_of`],
//! [`current_device`] or [`install_defaults`]: a program that
//! uses the core's generic functions or the containers' constructors
//! without a resource before any of these calls [`install_defaults`] first
//! (the core's error says so). A factory or current-device query the
//! program registers before is kept (the defaults go only where none is);
//! one it registers after replaces the default; a resource it sets
//! replaces the default of that device.
//!
//! Where the default cannot be made (the `cuda` feature on a machine with
//! no GPU), a get is the backend's typed error and nothing is stored: the
//! next get tries again.
//!
//! # Logging from the environment
//!
//! When `MEMRES_LOG_FILE` names a file (RMM's `RMM_LOG_FILE`), each default
//! resource is made behind the [`Logging`]
//! adaptor, logging device `N` to the file with `.devN` before its
//! extension ([`memres_core::stack::log_from_env`]). The rows are buffered:
//! [`flush_logs`] writes them out, and so does the process's exit (a
//! return from `main`, `std::process::exit`), after which each row is
//! written as it is logged, as the C library does. A file that cannot be made is
//! `InvalidConfig` from the get, its message naming the variable, the file
//! and the system's reason (``MEMRES_LOG_FILE=`/no/dir/log.csv`: No such
//! file or directory (os error 2)``); nothing is stored.
//!
//! # Examples
//!
//! ```
//! # #[cfg(not(feature = "cuda"))] {
//! use memres::device::{get_current_device_resource, get_per_device_resource, set_per_device_resource};
//! use memres::prelude::*;
//! use memres::DynResource;
//! use std::sync::Arc;
//! let mr: DynResource = get_current_device_resource()?; // the simulated device 0: nobody set one
//! let block = mr.allocate(1 << 20)?;
//! mr.deallocate(block)?;
//! // Setting returns the resource it replaces.
//! let pool: DynResource = Arc::new(Shared::new(CoalescingPool::new(get_per_device_resource(5)?)));
//! let before = set_per_device_resource(5, pool.clone()).unwrap();
//! assert!(Arc::ptr_eq(&set_per_device_resource(5, before).unwrap(), &pool));
//! # }
//! # Ok::<(), memres::Error>(())
//! ```

pub use memres_core::device::*;

use memres_core::device as registry;

use memres_core::adaptor::Logging;
use memres_core::stack::{log_from_env, LOG_FILE_VAR};
use memres_core::{DynResource, Error, MemoryResource, Result, Stream};
use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::sync::{Arc, Mutex, Once};

/// Installs the backends' default factories in the core's process-wide
/// registry, once (the four functions of this module,
/// [`get_per_device_resource_of`] and [`current_device`] call it first;
/// the registrations, `set_default_factory` and `set_current_device_query`,
/// do not), for the
/// stream types that have none: a factory or current-device query the
/// program registered before is kept.
///
/// ```
/// memres::device::install_defaults();
/// # #[cfg(not(feature = "cuda"))]
/// assert!(memres::device::global().get_per_device_resource::<()>(3).is_ok());
/// ```
pub fn install_defaults() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // The CUDA defaults first: with both features, `()` gets CUDA's.
        #[cfg(feature = "cuda")]
        {
            global().set_default_factory_if_absent::<()>(cuda::default::<()>);
            global().set_default_factory_if_absent::<memres_cuda::CudaStream>(
                cuda::default::<memres_cuda::CudaStream>,
            );
            global().set_current_device_query_if_absent::<()>(cuda::current);
            global().set_current_device_query_if_absent::<memres_cuda::CudaStream>(cuda::current);
        }
        #[cfg(feature = "sim")]
        {
            global().set_default_factory_if_absent::<()>(sim::default::<()>);
            global().set_default_factory_if_absent::<memres_sim::SimStream>(
                sim::default::<memres_sim::SimStream>,
            );
        }
    });
}

/// The device current on the calling thread for streams of type `S`:
/// with the `cuda` feature, for `()` and `CudaStream`, the driver's
/// (device 0 when the thread has no context, as `cudaGetDevice`); device 0
/// otherwise. RMM's `get_current_cuda_device`.
///
/// # Errors
///
/// The driver's, as [`Error::Backend`].
///
/// ```
/// # #[cfg(not(feature = "cuda"))]
/// assert_eq!(memres::device::current_device::<()>(), Ok(0));
/// ```
pub fn current_device<S: Stream + ?Sized + 'static>() -> Result<DeviceId> {
    install_defaults();
    registry::current_device::<S>()
}

/// The resource of the current device ([`current_device`]): RMM's
/// `get_current_device_resource()`; its default if nobody set one.
///
/// # Errors
///
/// [`current_device`]'s, or [`get_per_device_resource`]'s.
pub fn get_current_device_resource<S: Stream + ?Sized + 'static>() -> Result<DynResource<S>> {
    install_defaults();
    registry::get_current_device_resource::<S>()
}

/// Makes `resource` the resource of the current device, and returns the
/// one it replaces (`None` if the device had none, not even its default
/// yet): RMM's `set_current_device_resource`.
///
/// # Errors
///
/// [`current_device`]'s; nothing is set then.
pub fn set_current_device_resource<S: Stream + ?Sized + 'static>(
    resource: DynResource<S>,
) -> Result<Option<DynResource<S>>> {
    install_defaults();
    registry::set_current_device_resource(resource)
}

/// The resource of `device`: RMM's `get_per_device_resource`; its default
/// if nobody set one (made now, then kept).
///
/// # Errors
///
/// The default's: the driver's error as [`Error::Backend`] for a device
/// that does not exist (`cuda`; [`Error::InvalidConfig`] for one above
/// `i32::MAX`, which no driver call can take), [`Error::InvalidConfig`] for a device of
/// [`SIM_DEVICES`](memres_sim::SIM_DEVICES) or more (`sim`: their addresses
/// would run into the `vpool`s'), for a `MEMRES_LOG_FILE` that cannot be made, or
/// for a stream type with no default; nothing is stored then.
pub fn get_per_device_resource<S: Stream + ?Sized + 'static>(device: DeviceId) -> Result<DynResource<S>> {
    install_defaults();
    registry::get_per_device_resource::<S>(device)
}

/// The resource of `device` for streams of type `K`, with its engine, if
/// it was promised as memory of the copy engine `E`: the core's
/// [`get_per_device_resource_of`](memres_core::device::get_per_device_resource_of)
/// with the defaults installed first (with `cuda`, a device's default is
/// promised for `CudaCopy`).
///
/// # Errors
///
/// [`get_per_device_resource`]'s; [`Error::InvalidConfig`] if the
/// resource was not promised for `E` (a simulated device is memory of no
/// engine).
pub fn get_per_device_resource_of<K, E>(device: DeviceId) -> Result<(CurrentResource<K, E>, E)>
where
    K: Stream + ?Sized + 'static,
    E: Clone + Send + Sync + 'static,
{
    install_defaults();
    registry::get_per_device_resource_of::<K, E>(device)
}

/// Makes `resource` the resource of `device` and returns the one it
/// replaces: RMM's `set_per_device_resource`.
pub fn set_per_device_resource<S: Stream + ?Sized + 'static>(
    device: DeviceId,
    resource: DynResource<S>,
) -> Option<DynResource<S>> {
    install_defaults();
    registry::set_per_device_resource(device, resource)
}

/// Writes out the rows that the default resources logged so far (see
/// [logging from the environment](self#logging-from-the-environment)).
///
/// # Errors
///
/// The first file's error; every file is flushed even so.
///
/// ```
/// memres::device::flush_logs()?;
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn flush_logs() -> io::Result<()> {
    each_log(false)
}

/// Flushes every log; with `through`, each writes its later rows as they
/// come.
fn each_log(through: bool) -> io::Result<()> {
    let logs = LOGS.lock().unwrap_or_else(|p| p.into_inner());
    logs.iter().map(|flush| flush(through)).fold(Ok(()), Result::and)
}

/// How to flush each log a default resource was made with: with `true`,
/// its rows are written through from then on.
type Flush = Box<dyn Fn(bool) -> io::Result<()> + Send + Sync>;
static LOGS: Mutex<Vec<Flush>> = Mutex::new(Vec::new());

/// Has the process's exit flush every log, once: the logs live in statics,
/// which are never dropped, so that the rows buffered last were lost
/// unless the program called [`flush_logs`]. From then on each row is
/// written as it comes: rows that other threads or static destructors log
/// after the handler still reach the file.
fn flush_logs_at_exit() {
    extern "C" {
        fn atexit(callback: extern "C" fn()) -> std::ffi::c_int;
    }
    extern "C" fn at_exit() {
        // Nothing may unwind into the C library's exit; the errors have no
        // one to go to.
        let _ = std::panic::catch_unwind(|| each_log(true));
    }
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: `atexit` is the C library's, declared with its C
        // signature; the callback is a plain function that lives as long
        // as the program, takes no arguments and lets no panic out. A
        // refusal (no slot left) leaves `flush_logs` the way out.
        let _ = unsafe { atexit(at_exit) };
    });
}

/// A device's default as made: the backend's resource, behind the logging
/// adaptor when `MEMRES_LOG_FILE` names a file. One object serves every
/// stream type (`R` is a resource on all of them).
enum Made<R> {
    Plain(Arc<R>),
    Logged(Arc<Logging<Arc<R>>>),
}

impl<R> Clone for Made<R> {
    fn clone(&self) -> Self {
        match self {
            Made::Plain(r) => Made::Plain(r.clone()),
            Made::Logged(l) => Made::Logged(l.clone()),
        }
    }
}

impl<R: Send + Sync + 'static> Made<R> {
    /// `resource`, logged if the environment says so (the log's flush
    /// listed for [`flush_logs`]).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] naming the file and the reason when it
    /// cannot be made.
    fn new(resource: R, device: DeviceId) -> Result<Self> {
        let resource = Arc::new(resource);
        let log = log_from_env(&resource, std::env::var_os(LOG_FILE_VAR).as_deref(), device)
            .map_err(|e| Error::InvalidConfig { what: kept(e.to_string()) })?;
        Ok(match log {
            Some(log) => {
                let flushed = log.clone();
                let flush = move |through| if through { flushed.write_through() } else { flushed.flush() };
                LOGS.lock().unwrap_or_else(|p| p.into_inner()).push(Box::new(flush));
                flush_logs_at_exit();
                Made::Logged(log)
            }
            None => Made::Plain(resource),
        })
    }

    /// The same object, as a resource of streams of type `S`.
    fn resource<S: Stream + ?Sized + 'static>(&self) -> DynResource<S>
    where
        R: MemoryResource<S>,
    {
        match self {
            Made::Plain(r) => r.clone(),
            Made::Logged(l) => l.clone(),
        }
    }
}

/// `message` for the life of the process: [`Error`] is `Copy`, its
/// messages `&'static str`. Each distinct message is kept once, so a get
/// that fails again and again (the same file, the same reason) keeps no
/// more.
fn kept(message: String) -> &'static str {
    static KEPT: Mutex<BTreeSet<&'static str>> = Mutex::new(BTreeSet::new());
    let mut kept = KEPT.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(&known) = kept.get(message.as_str()) {
        return known;
    }
    let new: &'static str = Box::leak(message.into_boxed_str());
    kept.insert(new);
    new
}

/// Each device's default, made once for all stream types: the registry
/// keeps a default per stream type and runs its factory outside its lock,
/// so without this, `()` and a stream type (or two threads racing) would
/// each make a device of their own and truncate the same log file.
struct Defaults<T>(Mutex<BTreeMap<DeviceId, T>>);

impl<T: Clone> Defaults<T> {
    const fn new() -> Self {
        Defaults(Mutex::new(BTreeMap::new()))
    }

    /// The device's default, made by `make` (under the lock, so once) if
    /// there is none; an error stores nothing, so the next call tries again.
    fn get(&self, device: DeviceId, make: impl FnOnce() -> Result<T>) -> Result<T> {
        let mut made = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(t) = made.get(&device) {
            return Ok(t.clone());
        }
        let t = make()?;
        made.insert(device, t.clone());
        Ok(t)
    }
}

#[cfg(feature = "sim")]
mod sim {
    use super::{Defaults, DeviceId, Made};
    use memres_core::{DynResource, Result, Stream};
    use memres_sim::{nth_sim_device, SimDevice, DEFAULT_SIM_CAPACITY};

    static MADE: Defaults<Made<SimDevice>> = Defaults::new();

    /// A simulated device of [`DEFAULT_SIM_CAPACITY`] bytes, one per device
    /// id whatever the stream type, each with addresses of its own (so one
    /// device refuses another's blocks).
    pub(super) fn default<S: Stream + ?Sized + 'static>(device: DeviceId) -> Result<DynResource<S>> {
        let made =
            MADE.get(device, || Made::new(nth_sim_device(DEFAULT_SIM_CAPACITY, device.into())?, device))?;
        Ok(made.resource())
    }
}

#[cfg(feature = "cuda")]
mod cuda {
    use super::{Defaults, DeviceId, Made};
    use memres_core::device::promise_memory_of;
    use memres_core::{DynResource, Result, Stream};
    use memres_cuda::{AsRawStream, CudaCopy, CudaMemory, Device};

    static MADE: Defaults<(Made<CudaMemory>, CudaCopy)> = Defaults::new();

    /// The CUDA driver's current device.
    pub(super) fn current() -> Result<DeviceId> {
        Ok(Device::current()?.ordinal())
    }

    /// The device's `cuMemAlloc` resource, promised as memory of its
    /// [`CudaCopy`] for the containers.
    pub(super) fn default<S: Stream + AsRawStream + ?Sized + 'static>(
        device: DeviceId,
    ) -> Result<DynResource<S>> {
        let (made, engine) = MADE.get(device, || {
            let gpu = Device::get(device)?;
            // The log last: made, it is listed for `flush_logs` for good,
            // and its file emptied; an error after it would do so again at
            // the next get.
            let (engine, resource) = (CudaCopy::new(gpu)?, CudaMemory::new(gpu)?);
            Ok((Made::new(resource, device)?, engine))
        })?;
        match &made {
            Made::Plain(mr) => promise_memory_of::<S, _, _>(mr, engine),
            Made::Logged(log) => promise_memory_of::<S, _, _>(log, engine),
        };
        Ok(made.resource())
    }
}
