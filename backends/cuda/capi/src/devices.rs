//! The devices' state: each device's stack, built the first time it is
//! used (see the crate's *The stack of a device*), with what serves C
//! callers on it, and the configuration that decides the stack.

use crate::leaves::{checking_builder, refuse_host_leaves};
use crate::table::{Stranded, Table};
use crate::{device_index, guard, set_error, snapshot, DEFAULT_STACK, MAX_DEVICES, STACK_VAR};
use memres_core::adaptor::{Gauge, Logging, Statistics};
use memres_core::planned::Planned;
use memres_core::stack::{check_log_file, log_from_env, ReleaseLayers, StackBuilder, LOG_FILE_VAR};
use memres_core::DynResource;
use memres_cuda::stack::DriverPools;
use memres_cuda::{CudaStream, Device};
use std::any::Any;
use std::cell::RefCell;
use std::ffi::c_int;
use std::sync::{Arc, Mutex, OnceLock};

/// A device's resource and what is needed to serve C callers.
pub(crate) struct DeviceState {
    pub(crate) resource: DynResource<CudaStream>,
    /// The stack description it was built from.
    pub(crate) stack: String,
    /// Every block handed out and not yet freed.
    pub(crate) table: Table,
    /// Blocks handed out at a live address, at 0 or of another size than
    /// asked whose give-back the stack refused, given back again by each
    /// release.
    pub(crate) stranded: Stranded,
    /// The outermost `stats` adaptor, if any.
    pub(crate) stats: Option<Arc<Statistics<DynResource<CudaStream>>>>,
    /// Bytes held by all CUDA leaves.
    pub(crate) upstream: Arc<Gauge>,
    /// The pools under the `async` leaves, to ask the driver what they
    /// reserve (the stack lives as long as the process).
    pub(crate) driver_pools: DriverPools,
    /// The `log` adaptors, flushed by `memres_flush` and at exit.
    pub(crate) logs: Vec<Arc<Logging<DynResource<CudaStream>>>>,
    /// The `planned` layers, stepped by `memres_step`.
    pub(crate) planned: Vec<Arc<Planned<DynResource<CudaStream>>>>,
    /// The layers that keep freed memory, given back by `memres_release`.
    pub(crate) releasing: ReleaseLayers<CudaStream>,
    /// The legacy default stream of the device's primary context, with its
    /// cache of events: the stream of most calls (PyTorch's default).
    pub(crate) legacy: CudaStream,
    /// What `memres_snapshot` writes, where watched.
    pub(crate) map: Option<snapshot::Map>,
}

static DEVICES: [OnceLock<DeviceState>; MAX_DEVICES] = [const { OnceLock::new() }; MAX_DEVICES];

/// The stack set by `memres_configure`. Its lock also serializes building.
static CONFIG: Mutex<Option<String>> = Mutex::new(None);

/// The stack a device will be built from now.
///
/// # Errors
///
/// A message when [`STACK_VAR`] is set to what is not UTF-8 (no stack
/// string is; ignored, it left the default stack in its place unsaid).
fn stack_text(configured: &Option<String>) -> Result<String, String> {
    if let Some(s) = configured {
        return Ok(s.clone());
    }
    match std::env::var(STACK_VAR) {
        Ok(s) if !s.trim().is_empty() => Ok(s),
        Err(std::env::VarError::NotUnicode(v)) => Err(format!("memres: {STACK_VAR} is not UTF-8: {v:?}")),
        _ => Ok(DEFAULT_STACK.to_string()),
    }
}

fn build(d: usize, stack: &str) -> Result<DeviceState, String> {
    let device = Device::get(d as u32).map_err(|e| format!("memres: device {d}: {e}"))?;
    let context = device.primary_context().map_err(|e| format!("memres: device {d}: {e}"))?;
    let upstream = Arc::new(Gauge::default());
    let mut builder = StackBuilder::<CudaStream>::new();
    let map = if snapshot::enabled() {
        Some(snapshot::register_tapped(&mut builder, device, upstream.clone()))
    } else {
        memres_cuda::stack::register(&mut builder, device, upstream.clone());
        None
    };
    refuse_host_leaves(&mut builder);
    let legacy = CudaStream::legacy_in(context);
    let built = builder
        .build_with_handles(stack, &legacy)
        .map_err(|e| format!("memres: device {d}: stack `{stack}`: {e}"))?;
    let mut driver_pools = DriverPools::default();
    driver_pools.note(&built);
    let mut logs = built.all("log");
    let mut resource = built.resource.clone();
    if let Some(log) = log_from_env(&resource, std::env::var_os(LOG_FILE_VAR).as_deref(), d as u32)
        .map_err(|e| format!("memres: device {d}: {e}"))?
    {
        resource = log.clone();
        logs.push(log);
    }
    if let Some(m) = &map {
        resource = snapshot::tap_top(resource, m, device);
    }
    // Rust code in this process sees the same resource through the registry.
    memres_core::device::set_per_device_resource::<CudaStream>(d as u32, resource.clone());
    Ok(DeviceState {
        stats: built.get("stats"),
        driver_pools,
        planned: built.all("planned"),
        releasing: built.release_layers(),
        legacy,
        logs,
        resource,
        stack: stack.to_string(),
        table: Table::new(),
        stranded: Stranded::default(),
        upstream,
        map,
    })
}

/// Device `d`'s state, if it has been used.
pub(crate) fn used(d: usize) -> Option<&'static DeviceState> {
    DEVICES[d].get()
}

/// Device `d`'s map: `None` when the device is not used yet, `Some(None)`
/// when it is used unwatched.
pub(crate) fn device_map(d: usize) -> Option<Option<snapshot::Map>> {
    DEVICES[d].get().map(|s| s.map.clone())
}

/// The state of device `d`, built on first use.
pub(crate) fn state(d: usize) -> Result<&'static DeviceState, String> {
    let slot = &DEVICES[d];
    if let Some(s) = slot.get() {
        return Ok(s);
    }
    let config = CONFIG.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(s) = slot.get() {
        return Ok(s);
    }
    let stack = stack_text(&config)?;
    if config.is_none() {
        // `configure` checked its stack; the variable's is checked here,
        // before the device's primary context is made (for good), so that
        // a typo is named as one, with a GPU or without.
        check_stack(&stack).map_err(|e| format!("memres: {STACK_VAR} `{stack}`: {e}"))?;
    }
    // Before the build too (again, after `configure`, which checked it
    // then): the build makes the context for good and cuts the files of
    // the stack's own `log` layers, and a log file refused after it would
    // have cut them for nothing, at every try.
    check_log_file(std::env::var_os(LOG_FILE_VAR).as_deref(), d as u32)
        .map_err(|e| format!("memres: {e}"))?;
    let made = build(d, &stack)?;
    if !made.logs.is_empty() {
        flush_at_exit();
    }
    Ok(slot.get_or_init(|| made))
}

/// Flushes every device's `log` adaptors.
///
/// # Errors
///
/// The first write error, as a message; every log is flushed regardless.
pub fn flush() -> Result<(), String> {
    each_log(Logging::flush)
}

/// `f` of every device's `log` adaptors, each of them.
///
/// # Errors
///
/// The first error, as a message.
fn each_log(f: impl Fn(&Logging<DynResource<CudaStream>>) -> std::io::Result<()>) -> Result<(), String> {
    let mut result = Ok(());
    for (d, slot) in DEVICES.iter().enumerate() {
        for log in slot.get().map_or(&[][..], |s| &s.logs[..]) {
            if let Err(e) = f(log) {
                result = result.and(Err(format!("memres: device {d}: flushing a log: {e}")));
            }
        }
    }
    result
}

/// Makes the process flush the logs when it exits (once): a device's
/// resource lives as long as the process and is never dropped, so its
/// log's buffer would otherwise be lost. Makes `fork` lock them flushed
/// first ([`Logging::lock_flushed`]) and let them go in both processes:
/// a child's exit would write the rows buffered at the fork a second time,
/// and wait for ever for a log another thread was writing.
fn flush_at_exit() {
    extern "C" {
        fn atexit(callback: extern "C" fn()) -> c_int;
        fn pthread_atfork(
            prepare: Option<extern "C" fn()>,
            parent: Option<extern "C" fn()>,
            child: Option<extern "C" fn()>,
        ) -> c_int;
    }
    extern "C" fn at_exit() {
        // Flushed, and the rows logged after this handler (static
        // destructors, other threads) written at once: no flush comes later.
        guard((), || each_log(Logging::write_through));
    }
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: `atexit` is the C library's; the callback is a plain
        // function that lives as long as the program, takes no arguments
        // and lets no panic out (`guard`).
        if unsafe { atexit(at_exit) } != 0 {
            set_error("memres: cannot flush the logs at exit; call memres_flush".into());
        }
        // SAFETY: `pthread_atfork` is the C library's; the handlers are
        // plain functions that live as long as the program, take no
        // arguments and let no panic out (`guard`).
        if unsafe { pthread_atfork(Some(before_fork), Some(after_fork), Some(after_fork)) } != 0 {
            set_error("memres: cannot lock the logs at fork; a child's exit may write rows twice".into());
        }
    });
}

std::thread_local! {
    /// What the thread that forks locked before `fork` (the configuration's
    /// lock, so that no device is built meanwhile, then each log), let go
    /// of after it.
    static LOCKED_AT_FORK: RefCell<Vec<Box<dyn Any>>> = const { RefCell::new(Vec::new()) };
}

/// Locks the configuration and every device's logs, flushed.
extern "C" fn before_fork() {
    guard((), || {
        let config = CONFIG.lock().unwrap_or_else(|p| p.into_inner());
        let mut locked: Vec<Box<dyn Any>> = vec![Box::new(config)];
        for log in DEVICES.iter().filter_map(OnceLock::get).flat_map(|s| &s.logs) {
            // `None` only inside a log's own writer: a file's never forks.
            if let Some(l) = Logging::lock_flushed(log) {
                locked.push(Box::new(l));
            }
        }
        LOCKED_AT_FORK.with(|l| l.borrow_mut().extend(locked));
        Ok(())
    });
}

/// Lets go of what [`before_fork`] locked, in the parent and in the child.
extern "C" fn after_fork() {
    guard((), || {
        // The logs first, the configuration last: the reverse order.
        let locked = LOCKED_AT_FORK.with(|l| std::mem::take(&mut *l.borrow_mut()));
        locked.into_iter().rev().for_each(drop);
        Ok(())
    });
}

/// Builds `stack` with the checking builder: what a device's build would
/// refuse, without touching a device.
fn check_stack(stack: &str) -> Result<(), memres_core::stack::StackError> {
    checking_builder().build(stack, &CudaStream::legacy()).map(drop)
}

/// Checks `stack` and makes it the stack of every device used from now on:
/// the Rust form of `memres_configure`.
///
/// # Errors
///
/// A message naming the byte position of what is wrong with the stack
/// (checked without a device), naming `MEMRES_LOG_FILE` when its value
/// cannot be logged to ([`check_log_file`]), or saying that a device was
/// used already (its stack cannot change while blocks may be out).
pub fn configure(stack: &str) -> Result<(), String> {
    let mut config = CONFIG.lock().unwrap_or_else(|p| p.into_inner());
    check_stack(stack).map_err(|e| format!("memres: stack `{stack}`: {e}"))?;
    // No device is chosen yet: the first one's file stands for them all.
    check_log_file(std::env::var_os(LOG_FILE_VAR).as_deref(), 0).map_err(|e| format!("memres: {e}"))?;
    if let Some(d) = DEVICES.iter().position(|s| s.get().is_some()) {
        return Err(format!(
            "memres: device {d} is in use already; configure before the first allocation or step"
        ));
    }
    *config = Some(stack.to_string());
    Ok(())
}

/// The stack device `device` runs, or, not used yet, the one its first use
/// would build now (unchecked: a malformed one is refused then).
///
/// # Errors
///
/// A message when the device is out of range, or [`STACK_VAR`] is not
/// UTF-8.
pub fn stack(device: c_int) -> Result<String, String> {
    let d = device_index(device)?;
    if let Some(st) = DEVICES[d].get() {
        return Ok(st.stack.clone());
    }
    stack_text(&CONFIG.lock().unwrap_or_else(|p| p.into_inner()))
}
