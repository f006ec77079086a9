//! Writing a snapshot file whole (feature `std`).

use std::ffi::OsString;
use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Writes `bytes` to the file `path` whole: into a temporary file beside
/// it (`.NAME.PID.N.tmp`, in the same directory so that the rename stays
/// on one file system), synced, then renamed over `path`. A reader, or a
/// crash midway, sees the old file or the new one, never a truncated
/// pickle. On an error the temporary file is removed and `path` is as it
/// was.
///
/// ```
/// # fn main() -> std::io::Result<()> {
/// use memres_core::snapshot::{write_file, MemoryMap};
/// let path = std::env::temp_dir().join(format!("memres-doc-{}.pickle", std::process::id()));
/// write_file(&path, &MemoryMap::new(16).pickle())?;
/// assert!(std::fs::read(&path)?.starts_with(b"\x80\x02"));
/// # std::fs::remove_file(&path)
/// # }
/// ```
///
/// # Errors
///
/// `InvalidInput` for a path that names no file (`/`, `..`, empty);
/// else the error of making, writing, syncing or renaming the temporary
/// file (`path` a directory, a directory that does not exist or cannot be
/// written).
pub fn write_file(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let tmp = temporary(path)?;
    let written = (|| {
        let mut file = File::create(&tmp)?;
        file.write_all(bytes)?;
        // On disk before the rename, so that a crash after it cannot leave
        // the new name over an empty or partial file.
        file.sync_all()?;
        drop(file);
        fs::rename(&tmp, path)
    })();
    if written.is_err() {
        // Nothing to do if it was never made.
        let _ = fs::remove_file(&tmp);
    }
    written
}

/// The temporary file beside `path`: hidden, and named by the process and
/// a count so that two writers, in one process or two, never share one.
fn temporary(path: &Path) -> io::Result<PathBuf> {
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "the path names no file"))?;
    let mut tmp = OsString::from(".");
    tmp.push(name);
    tmp.push(std::format!(".{}.{}.tmp", std::process::id(), COUNT.fetch_add(1, Ordering::Relaxed)));
    Ok(path.with_file_name(tmp))
}
