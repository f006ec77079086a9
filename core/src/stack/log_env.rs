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

/// Checks `value`, the setting of [`LOG_FILE_VAR`], for device `device`
/// before that device is used, leaving everything as it was: a name whose
/// directory does not exist or is not a directory, that names a directory
/// (an existing one, or any name that ends with a separator, `.` or `..`),
/// that starts or ends with white space (a stray space or newline, never
/// meant as part of a file's name), or the device's file that this process
/// cannot write (an existing one opened for writing, uncut; a missing one's
/// directory by a temporary file made and removed beside it, as
/// [`snapshot::check_file`](crate::snapshot::check_file) does), is an error
/// that names the variable. The kernel decides, not the permission bits: a
/// directory of another user's, writable by none but its owner, is refused,
/// and a file of mode 0444 is accepted for root, who can write it. A file
/// that cannot be created for another reason is found when a device first
/// logs.
///
/// # Errors
///
/// An [`io::Error`] that names the variable and the path.
///
/// ```
/// use memres_core::stack::check_log_file;
/// use std::ffi::OsStr;
/// assert!(check_log_file(None, 0).is_ok());
/// let dir = std::env::temp_dir();
/// assert!(check_log_file(Some(dir.join("memres.csv").as_os_str()), 0).is_ok());
/// assert!(check_log_file(Some(dir.as_os_str()), 0).is_err(), "a directory");
/// assert!(check_log_file(Some(OsStr::new("logs/")), 0).is_err(), "a directory, there or not");
/// assert!(check_log_file(Some(OsStr::new("memres.csv\n")), 0).is_err(), "white space around it");
/// assert!(check_log_file(Some(OsStr::new("/no/such/dir/memres.csv")), 1).is_err());
/// ```
pub fn check_log_file(value: Option<&OsStr>, device: u32) -> io::Result<()> {
    let Some(file) = log_file_of_device(value, device) else {
        return Ok(());
    };
    let fail = |kind: io::ErrorKind, why: &str| Err(named(value, io::Error::new(kind, why.to_string())));
    let text = value.unwrap_or_default().to_string_lossy();
    if text.trim() != text {
        return fail(io::ErrorKind::InvalidInput, "the name starts or ends with white space");
    }
    // `logs/` would log to the file `logs.dev0`, and `missing/.` to
    // `missing.dev0`, beside the directory it names.
    crate::snapshot::check_names_a_file(Path::new(value.unwrap_or_default())).map_err(|e| named(value, e))?;
    let dir = match file.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    match std::fs::metadata(dir) {
        Ok(m) if !m.is_dir() => {
            return fail(io::ErrorKind::NotADirectory, "its directory is not a directory")
        }
        Ok(_) => {}
        Err(e) => return Err(named(value, e)),
    }
    if std::fs::metadata(value.unwrap_or_default()).is_ok_and(|m| m.is_dir()) {
        return fail(io::ErrorKind::IsADirectory, "it names a directory");
    }
    let why = |what: &str, e: io::Error| named(value, io::Error::new(e.kind(), format!("{what}: {e}")));
    match std::fs::metadata(&file) {
        Ok(m) if m.is_dir() => fail(io::ErrorKind::IsADirectory, "it names a directory"),
        // Opened as the log opens it, but not cut: only the kernel knows
        // whether this process may write it.
        Ok(m) if m.is_file() => std::fs::OpenOptions::new()
            .write(true)
            .open(&file)
            .map(drop)
            .map_err(|e| why("the file cannot be written", e)),
        // A device or a pipe, as a snapshot's file is checked.
        Ok(_) => crate::snapshot::check_file(&file).map_err(|e| why("the file cannot be written", e)),
        // A temporary file beside it, made and removed.
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            crate::snapshot::check_file(&file).map_err(|e| why("its directory cannot be written", e))
        }
        Err(e) => Err(named(value, e)),
    }
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
    check_log_file(value, device)?;
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

#[cfg(test)]
mod tests {
    use super::check_log_file;
    use alloc::format;
    use alloc::string::{String, ToString};
    use alloc::vec::Vec;
    use std::io::ErrorKind;
    use std::path::PathBuf;

    /// A directory of its own for `test`, made anew.
    fn dir(test: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("memres-log-env-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// The names in `dir`, sorted.
    fn names(dir: &std::path::Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into())
            .collect();
        names.sort();
        names
    }

    /// `Path` drops a final `.`: `missing/.` would have logged to
    /// `missing.dev0` beside the directory it names, and `file.txt/.` to
    /// `file.dev0.txt`.
    #[test]
    fn a_name_ending_in_a_dot_names_a_directory_there_or_not() {
        let dir = dir("dot");
        std::fs::write(dir.join("file.txt"), "").unwrap();
        for name in ["missing/.", "missing/..", "file.txt/.", "file.txt/..", "."] {
            let value = dir.join(name);
            let e = check_log_file(Some(value.as_os_str()), 0).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::IsADirectory, "{name}: {e}");
            assert!(e.to_string().contains("MEMRES_LOG_FILE"), "{e}");
        }
        assert_eq!(names(&dir), ["file.txt"], "made nothing");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A missing file's directory is tried with a temporary file, made and
    /// removed; an existing file is opened for writing and left as it was.
    #[test]
    fn a_file_that_can_be_written_is_accepted_and_left_as_it_was() {
        let dir = dir("writable");
        check_log_file(Some(dir.join("new.csv").as_os_str()), 0).unwrap();
        assert!(names(&dir).is_empty(), "made nothing: {:?}", names(&dir));
        std::fs::write(dir.join("old.dev0.csv"), "rows\n").unwrap();
        check_log_file(Some(dir.join("old.csv").as_os_str()), 0).unwrap();
        assert_eq!(std::fs::read_to_string(dir.join("old.dev0.csv")).unwrap(), "rows\n");
        assert_eq!(names(&dir), ["old.dev0.csv"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Whether this process runs as root (its effective user id is 0).
    #[cfg(target_os = "linux")]
    fn root() -> bool {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let uid = status.lines().find_map(|l| l.strip_prefix("Uid:")).unwrap();
        uid.split_whitespace().nth(1) == Some("0")
    }

    /// The kernel decides, not the permission bits: a file of mode 0444 is
    /// written by root (it was refused as read only) and refused for any
    /// other user; a directory no one can make a file in (`/proc/self`) is
    /// refused.
    #[cfg(target_os = "linux")]
    #[test]
    fn whether_a_file_can_be_written_is_the_kernels_to_say() {
        use std::os::unix::fs::PermissionsExt;
        let dir = dir("kernel");
        let file = dir.join("ro.dev0.csv");
        std::fs::write(&file, "rows\n").unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o444)).unwrap();
        let checked = check_log_file(Some(dir.join("ro.csv").as_os_str()), 0);
        match root() {
            true => checked.unwrap(),
            false => assert_eq!(checked.unwrap_err().kind(), ErrorKind::PermissionDenied),
        }
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "rows\n");
        std::fs::remove_dir_all(&dir).unwrap();
        let e = check_log_file(Some(std::ffi::OsStr::new("/proc/self/memres.csv")), 0).unwrap_err();
        assert!(e.to_string().contains("its directory cannot be written"), "{e}");
    }
}
