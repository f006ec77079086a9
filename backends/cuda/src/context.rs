//! Driver initialization, devices and their primary contexts.

use crate::error::check;
use crate::stream::CudaStream;
use crate::sys;
use memres_core::{Error, Result};
use std::marker::PhantomData;
use std::ptr;
use std::sync::{OnceLock, RwLock};

/// Initializes the CUDA driver (`cuInit`) once per process; later calls
/// return the first call's result. Every constructor in this crate calls it.
///
/// # Errors
///
/// The driver's error, e.g. `CUDA_ERROR_NO_DEVICE` on a machine without a
/// GPU, as [`Error::Backend`].
///
/// # Examples
///
/// ```
/// match memres_cuda::init() {
///     Ok(()) => println!("CUDA is ready"),
///     Err(e) => println!("no CUDA here: {e}"),
/// }
/// ```
pub fn init() -> Result<()> {
    static INIT: OnceLock<Result<()>> = OnceLock::new();
    // SAFETY: `cuInit` takes flags only (0 is the one valid value) and is
    // safe to call from any thread, any number of times.
    *INIT.get_or_init(|| check(unsafe { sys::cuInit(0) }))
}

/// The driver's version as `1000 * major + 10 * minor` (12080 for 12.8).
///
/// # Errors
///
/// The driver's error as [`Error::Backend`].
pub fn driver_version() -> Result<i32> {
    let mut v = 0;
    // SAFETY: the out parameter points at a live local.
    check(unsafe { sys::cuDriverGetVersion(&mut v) })?;
    Ok(v)
}

/// Free and total memory of a device, in bytes (`cuMemGetInfo`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryInfo {
    /// Bytes free on the device now (taken by no one, in no pool).
    pub free: u64,
    /// Bytes of memory on the device.
    pub total: u64,
}

/// A CUDA device, by ordinal.
///
/// # Examples
///
/// ```no_run
/// use memres_cuda::Device;
/// for i in 0..Device::count()? {
///     let d = Device::get(i)?;
///     let m = d.memory_info()?;
///     println!("{}: {} of {} bytes free", d.name()?, m.free, m.total);
/// }
/// # Ok::<(), memres_core::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Device {
    ordinal: u32,
    raw: sys::CUdevice,
}

impl Device {
    /// A device value that names no driver device, for models of the driver.
    #[cfg(test)]
    pub(crate) const fn fake(ordinal: u32) -> Device {
        Device { ordinal, raw: ordinal as sys::CUdevice }
    }

    /// How many CUDA devices this process can use; 0 when the driver finds
    /// none (`CUDA_ERROR_NO_DEVICE`).
    ///
    /// # Errors
    ///
    /// Any other driver error, as [`Error::Backend`].
    pub fn count() -> Result<u32> {
        match init() {
            Err(Error::Backend { code, .. }) if code == i64::from(sys::CUDA_ERROR_NO_DEVICE) => return Ok(0),
            r => r?,
        }
        let mut n = 0;
        // SAFETY: the driver is initialized; the out parameter points at a live local.
        check(unsafe { sys::cuDeviceGetCount(&mut n) })?;
        Ok(u32::try_from(n).unwrap_or(0))
    }

    /// The device of ordinal `ordinal` (0 to `count() - 1`).
    ///
    /// # Errors
    ///
    /// `CUDA_ERROR_INVALID_DEVICE` for an ordinal out of range, or the
    /// driver's initialization error, as [`Error::Backend`];
    /// [`Error::InvalidConfig`] for one above `i32::MAX`, which no driver
    /// call can take.
    pub fn get(ordinal: u32) -> Result<Device> {
        init()?;
        let ord =
            i32::try_from(ordinal).map_err(|_| Error::InvalidConfig { what: "device ordinal too large" })?;
        let mut raw = 0;
        // SAFETY: the driver is initialized; the out parameter points at a live local.
        check(unsafe { sys::cuDeviceGet(&mut raw, ord) })?;
        Ok(Device { ordinal, raw })
    }

    /// The device of the calling thread's current context, or device 0 when
    /// the thread has none (as the runtime API's `cudaGetDevice`).
    ///
    /// # Errors
    ///
    /// The driver's error as [`Error::Backend`].
    pub fn current() -> Result<Device> {
        init()?;
        let mut raw = 0;
        // SAFETY: the driver is initialized; the out parameter points at a live local.
        match unsafe { sys::cuCtxGetDevice(&mut raw) } {
            sys::CUDA_SUCCESS => Ok(Device { ordinal: u32::try_from(raw).unwrap_or(0), raw }),
            sys::CUDA_ERROR_INVALID_CONTEXT => Device::get(0),
            code => Err(crate::error::error_from_code(code)),
        }
    }

    /// The device's ordinal.
    pub fn ordinal(&self) -> u32 {
        self.ordinal
    }

    /// The driver's handle (`CUdevice`).
    pub fn raw(&self) -> sys::CUdevice {
        self.raw
    }

    /// The device's name, such as `"NVIDIA H100 80GB HBM3"`.
    ///
    /// # Errors
    ///
    /// The driver's error as [`Error::Backend`].
    pub fn name(&self) -> Result<String> {
        let mut buf = [0 as core::ffi::c_char; 256];
        // SAFETY: the buffer is live and its length is passed; the driver
        // writes at most that many bytes, NUL included.
        check(unsafe { sys::cuDeviceGetName(buf.as_mut_ptr(), buf.len() as i32, self.raw) })?;
        let bytes: Vec<u8> = buf.iter().take_while(|&&c| c != 0).map(|&c| c as u8).collect();
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// Bytes of memory on the device (`cuDeviceTotalMem`); needs no context.
    ///
    /// # Errors
    ///
    /// The driver's error as [`Error::Backend`].
    pub fn total_memory(&self) -> Result<u64> {
        let mut bytes = 0usize;
        // SAFETY: the out parameter points at a live local.
        check(unsafe { sys::cuDeviceTotalMem_v2(&mut bytes, self.raw) })?;
        Ok(bytes as u64)
    }

    /// Free and total memory of the device now (`cuMemGetInfo` in its
    /// primary context). Cheap while something (a resource, a stream) holds
    /// the context; otherwise the driver sets the context up for the call.
    ///
    /// # Errors
    ///
    /// The driver's error as [`Error::Backend`].
    pub fn memory_info(&self) -> Result<MemoryInfo> {
        self.primary_context()?.memory_info()
    }

    /// The value of a device attribute (`cuDeviceGetAttribute`; `attribute`
    /// is a `CUdevice_attribute` code).
    ///
    /// # Errors
    ///
    /// `CUDA_ERROR_INVALID_VALUE` for an attribute the driver does not know,
    /// as [`Error::Backend`].
    pub fn attribute(&self, attribute: i32) -> Result<i32> {
        let mut v = 0;
        // SAFETY: the out parameter points at a live local; the driver
        // checks `attribute`.
        check(unsafe { sys::cuDeviceGetAttribute(&mut v, attribute, self.raw) })?;
        Ok(v)
    }

    /// Whether the device supports stream-ordered memory pools
    /// (`cuMemAllocFromPoolAsync`), which [`CudaAsyncMemory`](crate::CudaAsyncMemory) needs.
    ///
    /// # Errors
    ///
    /// The driver's error as [`Error::Backend`].
    pub fn supports_memory_pools(&self) -> Result<bool> {
        Ok(self.attribute(sys::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED)? != 0)
    }

    /// Whether the device can access managed memory concurrently with the
    /// host (needed to prefetch managed memory to it).
    ///
    /// # Errors
    ///
    /// The driver's error as [`Error::Backend`].
    pub fn concurrent_managed_access(&self) -> Result<bool> {
        Ok(self.attribute(sys::CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS)? != 0)
    }

    /// The device's primary context, retained for the rest of the process
    /// from its first use, as the CUDA runtime keeps it.
    ///
    /// # Errors
    ///
    /// The driver's error as [`Error::Backend`].
    pub fn primary_context(&self) -> Result<Context> {
        Context::retain(*self)
    }

    /// Whether the device's primary context is active now
    /// (`cuDevicePrimaryCtxGetState`); asking makes nothing.
    fn primary_active(&self) -> Result<bool> {
        let (mut flags, mut active) = (0, 0);
        // SAFETY: a `Device` exists only once the driver is initialized and
        // `raw` came from it; both out parameters point at live locals.
        check(unsafe { sys::cuDevicePrimaryCtxGetState(self.raw, &mut flags, &mut active) })?;
        Ok(active != 0)
    }

    /// The device's legacy default stream (the null stream of its primary
    /// context). Work on it is ordered with all blocking streams of the
    /// context.
    ///
    /// # Errors
    ///
    /// The driver's error as [`Error::Backend`].
    pub fn default_stream(&self) -> Result<CudaStream> {
        Ok(CudaStream::legacy_in(self.primary_context()?))
    }
}

/// A device's primary context, retained (`cuDevicePrimaryCtxRetain`) once,
/// at its first use through this crate, and never released.
///
/// Every resource and stream of this crate holds one. Calls that need a
/// current context make this one current for the call and restore the
/// caller's afterwards, so resources of several devices can be used from any
/// thread in any order.
///
/// Why never released: the driver resets a primary context when its last
/// retain goes, freeing all its memory, while threads may still have it
/// current (a thread with no context keeps device 0's when a call of this
/// crate made it current); a later handle then sets the whole context up again. The
/// CUDA runtime, which CuPy, PyTorch and RMM use, keeps the primary context
/// for the life of the process too. A handle is a shared reference:
/// cloning and dropping it make no driver call.
///
/// # Examples
///
/// ```no_run
/// let ctx = memres_cuda::Device::get(0)?.primary_context()?;
/// ctx.bind()?; // current on this thread from now on
/// # Ok::<(), memres_core::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct Context {
    inner: &'static Retained,
}

#[derive(Debug)]
struct Retained {
    device: Device,
    /// Valid for the rest of the process: retained once, never released.
    raw: sys::CUcontext,
}

// SAFETY: a `CUcontext` is a handle the driver lets every thread use, and
// this one stays valid for the process (its retain is never released).
unsafe impl Send for Retained {}
// SAFETY: as above; `Retained` has no interior mutability of its own.
unsafe impl Sync for Retained {}

/// The primary context of each device retained so far, by ordinal. Entries
/// are only ever added, each leaked: they live as long as the process.
static RETAINED: RwLock<Vec<Option<&'static Retained>>> = RwLock::new(Vec::new());

impl Context {
    /// The primary context of device `ordinal`: after the first use of the
    /// device, a lookup that makes no driver call (what a caller that names
    /// devices by ordinal on every call wants, such as an allocator under
    /// PyTorch).
    ///
    /// # Errors
    ///
    /// The driver's error as [`Error::Backend`] (no such device).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use memres_cuda::{Context, Device};
    /// let ctx = Context::primary(0)?;
    /// assert_eq!(ctx.raw(), Device::get(0)?.primary_context()?.raw());
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    pub fn primary(ordinal: u32) -> Result<Context> {
        match Context::retained(ordinal as usize) {
            Some(context) => Ok(context),
            None => Device::get(ordinal)?.primary_context(),
        }
    }

    /// The primary context of device number `i` if it was retained.
    fn retained(i: usize) -> Option<Context> {
        let inner = RETAINED.read().unwrap_or_else(|p| p.into_inner()).get(i).copied().flatten()?;
        Some(Context { inner })
    }

    fn retain(device: Device) -> Result<Context> {
        let i = device.ordinal() as usize;
        // The table stays whole across a panic: each change is one store.
        if let Some(context) = Context::retained(i) {
            return Ok(context);
        }
        let mut table = RETAINED.write().unwrap_or_else(|p| p.into_inner());
        if let Some(inner) = table.get(i).copied().flatten() {
            return Ok(Context { inner });
        }
        init()?;
        let mut raw = ptr::null_mut();
        // SAFETY: the driver is initialized and `device` came from `cuDeviceGet`;
        // the out parameter points at a live local.
        check(unsafe { sys::cuDevicePrimaryCtxRetain(&mut raw, device.raw) })?;
        let inner: &'static Retained = Box::leak(Box::new(Retained { device, raw }));
        if table.len() <= i {
            table.resize(i + 1, None);
        }
        table[i] = Some(inner);
        Ok(Context { inner })
    }

    /// A context value that names no driver context, for models of the
    /// driver: making it current makes no driver call, as for a null one.
    #[cfg(test)]
    pub(crate) fn fake(device: Device) -> Context {
        Context { inner: Box::leak(Box::new(Retained { device, raw: ptr::null_mut() })) }
    }

    /// The device of the context.
    pub fn device(&self) -> Device {
        self.inner.device
    }

    /// The driver's handle (`CUcontext`), valid for the rest of the process.
    pub fn raw(&self) -> sys::CUcontext {
        self.inner.raw
    }

    /// Makes this context current on the calling thread (`cuCtxSetCurrent`),
    /// for driver calls made outside this crate. The context stays valid
    /// for the rest of the process.
    ///
    /// # Errors
    ///
    /// The driver's error as [`Error::Backend`].
    pub fn bind(&self) -> Result<()> {
        // SAFETY: the context is retained for the rest of the process.
        check(unsafe { sys::cuCtxSetCurrent(self.raw()) })
    }

    /// Free and total memory of the device now (`cuMemGetInfo`).
    ///
    /// # Errors
    ///
    /// The driver's error as [`Error::Backend`].
    pub fn memory_info(&self) -> Result<MemoryInfo> {
        let _current = Current::of(self)?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: a context is current; both out parameters point at live locals.
        check(unsafe { sys::cuMemGetInfo_v2(&mut free, &mut total) })?;
        Ok(MemoryInfo { free: free as u64, total: total as u64 })
    }

    /// A retain of the calling thread's current context, which must be its
    /// device's primary context: what an event recorded on a default stream
    /// of no known context keeps alive.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] when no context is current or it is not a
    /// primary one (this crate can keep only primary contexts alive); the
    /// driver's error as [`Error::Backend`]. It never makes a primary
    /// context: one the device has not made is not the current one.
    pub(crate) fn current_primary() -> Result<Context> {
        init()?;
        let mut now = ptr::null_mut();
        // SAFETY: the driver is initialized; the out parameter points at a live local.
        check(unsafe { sys::cuCtxGetCurrent(&mut now) })?;
        if now.is_null() {
            return Err(Error::InvalidConfig { what: "no CUDA context is current for the default stream" });
        }
        let not_primary = Error::InvalidConfig {
            what: "the default stream of a context that is not primary: name the stream with its context",
        };
        let device = Device::current()?;
        // Retaining an inactive primary context would create it (device
        // memory for good) only to find it is not `now`: an inactive one
        // cannot be current, so only an active one is retained, which
        // creates nothing.
        let context = match Context::retained(device.ordinal() as usize) {
            Some(context) => context,
            None if device.primary_active()? => Context::retain(device)?,
            None => return Err(not_primary),
        };
        if context.raw() != now {
            return Err(not_primary);
        }
        Ok(context)
    }

    /// Runs `f` with this context current, then makes the caller's current
    /// again.
    pub(crate) fn scope<T>(&self, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let _current = Current::of(self)?;
        f()
    }
}

/// Makes a context current on this thread until dropped, then restores the
/// one that was current before (a thread that had none keeps device 0's
/// primary context, as the CUDA runtime binds it; any other goes). Costs one
/// `cuCtxGetCurrent` when the context is current already, the common case.
/// It borrows what keeps the context alive for `'a`.
pub(crate) struct Current<'a> {
    /// The context to restore, when another was current.
    restore: Option<sys::CUcontext>,
    alive: PhantomData<&'a ()>,
}

impl<'a> Current<'a> {
    /// Makes `context` current while the guard, which borrows it, lives.
    pub(crate) fn of(context: &'a Context) -> Result<Current<'a>> {
        // SAFETY: `context` retains its context while it lives, and the
        // guard borrows it.
        unsafe { Current::enter(context.raw()) }
    }

    /// Makes `ctx` current (a null `ctx` leaves the thread's context as it is).
    ///
    /// # Safety
    ///
    /// `ctx` is null or a context that stays alive (not destroyed, its
    /// primary context not released for good) while the guard lives.
    pub(crate) unsafe fn enter(ctx: sys::CUcontext) -> Result<Current<'a>> {
        if ctx.is_null() {
            return Ok(Current { restore: None, alive: PhantomData });
        }
        let mut now = ptr::null_mut();
        // SAFETY: the out parameter points at a live local.
        check(unsafe { sys::cuCtxGetCurrent(&mut now) })?;
        if now == ctx {
            return Ok(Current { restore: None, alive: PhantomData });
        }
        // SAFETY: `ctx` is alive while the guard lives (the contract).
        check(unsafe { sys::cuCtxSetCurrent(ctx) })?;
        // A thread with no context keeps device 0's primary context, the one
        // the CUDA runtime binds to a thread on first use: restoring "none"
        // would cost two driver calls on every later call for nothing.
        // Another device's goes: kept, it made that device the runtime's
        // current device on the thread (`cudaGetDevice`, PyTorch's
        // `device="cuda"`), which the runtime itself would not have done.
        let keep = now.is_null() && Context::retained(0).is_some_and(|c| c.raw() == ctx);
        Ok(Current { restore: (!keep).then_some(now), alive: PhantomData })
    }
}

impl Drop for Current<'_> {
    fn drop(&mut self) {
        if let Some(prev) = self.restore {
            // SAFETY: `prev` was current on this thread when the guard was
            // made (or null, which unbinds). If the caller destroyed it
            // meanwhile the driver reports an error, ignored: there is
            // nothing better to restore.
            let _ = unsafe { sys::cuCtxSetCurrent(prev) };
        }
    }
}
