//! `MEMRES_LOG_FILE`, RMM's `RMM_LOG_FILE`: the environment names a file,
//! and the stack a device is built from logs every call to it in RMM's
//! format (feature `std`).
//!
//! The functions take the variable's value rather than read it, so that
//! what the setting does is tested without touching the process's
//! environment; the C library passes `std::env::var_os(LOG_FILE_VAR)`.

use crate::adaptor::Logging;
use alloc::format;
use alloc::string::ToString;
use alloc::sync::Arc;
use std::ffi::{OsStr, OsString};
use std::io;
use std::path::{Path, PathBuf};

/// The environment variable that names where the default stack logs.
pub const LOG_FILE_VAR: &str = "MEMRES_LOG_FILE";

/// The file device `device` logs to when [`LOG_FILE_VAR`] is `value`:
/// `None` when it is unset or blank; otherwise the name with `.dev<N>`
/// before its extension, as RMM's Python names one log per device
/// (`rmm_log.dev0.txt`), so that the devices of one process never write
/// over one another's logs.
///
/// ```
/// use memres_core::stack::log_file_of_device;
/// use std::ffi::OsStr;
/// use std::path::Path;
/// let v = Some(OsStr::new("/tmp/memres.csv"));
/// assert_eq!(log_file_of_device(v, 1).as_deref(), Some(Path::new("/tmp/memres.dev1.csv")));
/// assert_eq!(log_file_of_device(Some(OsStr::new("log")), 0).as_deref(), Some(Path::new("log.dev0")));
/// assert_eq!(log_file_of_device(Some(OsStr::new("  ")), 0), None);
/// assert_eq!(log_file_of_device(None, 0), None);
/// ```
pub fn log_file_of_device(value: Option<&OsStr>, device: u32) -> Option<PathBuf> {
    let path = Path::new(value.filter(|v| !v.to_string_lossy().trim().is_empty())?);
    let mut name = OsString::from(path.file_stem().unwrap_or_default());
    name.push(format!(".dev{device}"));
    if let Some(ext) = path.extension() {
        name.push(".");
        name.push(ext);
    }
    Some(path.with_file_name(name))
}

/// Checks `value`, the setting of [`LOG_FILE_VAR`], before any device is
/// used, creating nothing: a name whose directory does not exist or is not
/// a directory, that names a directory (an existing one, or any name that
/// ends with a separator, `.` or `..`), that starts or ends with white
/// space (a stray space or newline, never meant as part of a file's name),
/// or a file or directory that is read only, is an error that names the
/// variable. A file that cannot be created for another reason is found
/// when a device first logs.
///
/// # Errors
///
/// An [`io::Error`] that names the variable and the path.
///
/// ```
/// use memres_core::stack::check_log_file;
/// use std::ffi::OsStr;
/// assert!(check_log_file(None).is_ok());
/// let dir = std::env::temp_dir();
/// assert!(check_log_file(Some(dir.join("memres.csv").as_os_str())).is_ok());
/// assert!(check_log_file(Some(dir.as_os_str())).is_err(), "a directory");
/// assert!(check_log_file(Some(OsStr::new("logs/"))).is_err(), "a directory, there or not");
/// assert!(check_log_file(Some(OsStr::new("memres.csv\n"))).is_err(), "white space around it");
/// assert!(check_log_file(Some(OsStr::new("/no/such/dir/memres.csv"))).is_err());
/// ```
pub fn check_log_file(value: Option<&OsStr>) -> io::Result<()> {
    let Some(file) = log_file_of_device(value, 0) else {
        return Ok(());
    };
    let fail = |kind: io::ErrorKind, why: &str| Err(named(value, io::Error::new(kind, why.to_string())));
    let text = value.unwrap_or_default().to_string_lossy();
    if text.trim() != text {
        return fail(io::ErrorKind::InvalidInput, "the name starts or ends with white space");
    }
    // `Path` drops a final separator: `logs/` would log to the file `logs.dev0`.
    if text.ends_with(std::path::is_separator) || Path::new(value.unwrap_or_default()).file_name().is_none() {
        return fail(io::ErrorKind::IsADirectory, "it names a directory; name a file in it");
    }
    let dir = match file.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    match std::fs::metadata(dir) {
        Ok(m) if !m.is_dir() => {
            return fail(io::ErrorKind::NotADirectory, "its directory is not a directory")
        }
        Ok(m) if m.permissions().readonly() => {
            return fail(io::ErrorKind::PermissionDenied, "its directory is read only")
        }
        Ok(_) => {}
        Err(e) => return Err(named(value, e)),
    }
    for path in [Path::new(value.unwrap_or_default()), &file] {
        match std::fs::metadata(path) {
            Ok(m) if m.is_dir() => return fail(io::ErrorKind::IsADirectory, "it names a directory"),
            Ok(m) if m.permissions().readonly() => {
                return fail(io::ErrorKind::PermissionDenied, "the file is read only")
            }
            _ => {}
        }
    }
    Ok(())
}

/// `resource` logged to device `device`'s file when [`LOG_FILE_VAR`] is
/// `value` (see [`log_file_of_device`]): the [`Logging`] adaptor over a
/// clone of it (a [`DynResource`](crate::DynResource), or any handle whose
/// clones share one resource: the adaptor keeps the handle's type, and with
/// it what the type promises, [`MemoryOf`](crate::copy::MemoryOf)
/// included), which the caller serves from instead and flushes; `None`
/// when the variable is unset or blank.
///
/// # Errors
///
/// What [`check_log_file`] finds, or the file cannot be made (the error
/// names the variable and the file); nothing is made, and `resource` is as
/// it was.
///
/// ```
/// use memres_core::stack::{log_from_env, StackBuilder, Unbacked};
/// use memres_core::{DynResource, MemoryResource, Request};
/// use std::sync::Arc;
/// let stack: DynResource = Arc::new(Unbacked::new());
/// let file = std::env::temp_dir().join(format!("memres-doc-{}.csv", std::process::id()));
/// let log = log_from_env(&stack, Some(file.as_os_str()), 0)?.unwrap();
/// let b = log.allocate(Request::new(1000)?, &())?;
/// log.deallocate(b, &())?;
/// log.flush()?;
/// let dev0 = file.with_file_name(format!("memres-doc-{}.dev0.csv", std::process::id()));
/// let rows = memres_core::trace::read_all(std::io::BufReader::new(std::fs::File::open(&dev0)?))?;
/// assert_eq!(rows.len(), 2);
/// # std::fs::remove_file(dev0)?;
/// assert!(log_from_env(&stack, None, 0)?.is_none());
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn log_from_env<R: Clone>(
    resource: &R,
    value: Option<&OsStr>,
    device: u32,
) -> io::Result<Option<Arc<Logging<R>>>> {
    let Some(file) = log_file_of_device(value, device) else {
        return Ok(None);
    };
    check_log_file(value)?;
    let log = Logging::to_file(resource.clone(), &file).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("{LOG_FILE_VAR}: cannot log device {device} to `{}`: {e}", file.display()),
        )
    })?;
    Ok(Some(Arc::new(log)))
}

fn named(value: Option<&OsStr>, e: io::Error) -> io::Error {
    let path = Path::new(value.unwrap_or_default()).display();
    io::Error::new(e.kind(), format!("{LOG_FILE_VAR}=`{path}`: {e}"))
}
