//! Writing a snapshot file whole (feature `std`).

use std::ffi::OsString;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Refuses a path that ends with a separator, `.` or `..`: it names a
/// directory, there or not. `Path` drops such an end (the file name of
/// `out/.` is `out`), so a file named from it would be made beside the
/// directory named (`out-0`, `out.dev0`), or a check of it pass for a
/// path no write can take.
///
/// ```
/// use memres_core::snapshot::check_names_a_file;
/// use std::path::Path;
/// assert!(check_names_a_file(Path::new("out/s.pickle")).is_ok());
/// for dir in ["out/", "out/.", "out/..", ".", "/"] {
///     assert!(check_names_a_file(Path::new(dir)).is_err(), "{dir}");
/// }
/// ```
///
/// # Errors
///
/// `IsADirectory`, saying so.
pub fn check_names_a_file(path: &Path) -> io::Result<()> {
    let text = path.as_os_str().as_encoded_bytes();
    // Bytes past ASCII are never a separator, whatever they encode.
    let last =
        text.rsplit(|&b| b.is_ascii() && std::path::is_separator(b as char)).next().unwrap_or_default();
    match !text.is_empty() && matches!(last, b"" | b"." | b"..") {
        true => Err(io::Error::new(
            io::ErrorKind::IsADirectory,
            "it names a directory (it ends with a separator, `.` or `..`); name a file in it",
        )),
        false => Ok(()),
    }
}

/// Writes `bytes` to the file `path` whole: into a temporary file beside
/// it (`.NAME.PID.N.tmp`, in the same directory so that the rename stays
/// on one file system), synced, then renamed over `path`. A reader, or a
/// crash midway, sees the old file or the new one, never a truncated
/// pickle. On an error the temporary file is removed and `path` is as it
/// was. The temporary file is made new: whatever lies under its name (a
/// link planted by another user of the directory) is never followed nor
/// truncated, and a file that takes an old one's permissions is private
/// until it does.
///
/// What a user set up around the file is kept: where `path` is a symbolic
/// link, the file it leads to is replaced and the link stays; a file that
/// was there keeps its permissions. After the rename the directory is
/// synced (on Unix) so that the new name survives a crash too. Where `path`
/// is neither a file nor a directory (a device such as `/dev/null`, a named
/// pipe), `bytes` are written into it: there is no file to replace, and a
/// file renamed over it would take its place (`/dev/null` made a plain
/// file, where the process may write to `/dev`). Such a write is not
/// whole: a pipe whose reader goes away midway has part of the bytes, and
/// a named pipe with no reader waits for one.
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
/// `IsADirectory` for a path that ends with a separator, `.` or `..`
/// ([`check_names_a_file`]); `InvalidInput` for an empty path or a chain
/// of more than 40 symbolic links (a loop); else the error of
/// reading the links or the old file's permissions, or of making,
/// writing, syncing or renaming the temporary file (`path` a directory, a
/// directory that does not exist or cannot be written).
pub fn write_file(path: &Path, bytes: &[u8]) -> io::Result<()> {
    check_names_a_file(path)?;
    // Before its links are followed by hand: a process's `/dev/stdout` or
    // `/dev/fd/N` leads to a pipe by a name (`pipe:[N]`) no path reaches.
    if written_in_place(path) {
        return OpenOptions::new().write(true).open(path)?.write_all(bytes);
    }
    let path = &follow_links(path)?;
    let old = match fs::metadata(path) {
        Ok(old) => Some(old.permissions()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => return Err(e),
    };
    let (mut file, tmp) = create_temporary(path, old.is_some())?;
    let written = (|| {
        // Before the bytes: the file made private, it takes the old file's
        // permissions, never readable by others meanwhile.
        if let Some(old) = old {
            file.set_permissions(old)?;
        }
        file.write_all(bytes)?;
        // On disk before the rename, so that a crash after it cannot leave
        // the new name over an empty or partial file.
        file.sync_all()?;
        drop(file);
        fs::rename(&tmp, path)
    })();
    if written.is_err() {
        // Ours: it was made new.
        let _ = fs::remove_file(&tmp);
        return written;
    }
    sync_directory(path);
    Ok(())
}

/// Checks that [`write_file`] could write `path` now, and leaves
/// everything as it was: follows its links, reads the old file's
/// permissions, and makes and removes the temporary file beside it. A tool
/// that writes a file after a long run tells the user before it.
///
/// ```
/// # fn main() -> std::io::Result<()> {
/// use memres_core::snapshot::check_file;
/// let path = std::env::temp_dir().join(format!("memres-doc-check-{}.pickle", std::process::id()));
/// check_file(&path)?;
/// assert!(!path.exists(), "made nothing");
/// assert!(check_file(&std::env::temp_dir()).is_err(), "a directory");
/// # Ok(())
/// # }
/// ```
///
/// A device or a socket, which [`write_file`] writes into, is opened for
/// writing (a socket cannot be: refused); a named pipe is taken as it is,
/// since opening it would wait for its reader.
///
/// # Errors
///
/// What [`write_file`] would meet before its bytes: `path` a directory,
/// or ending with a separator, `.` or `..` (`IsADirectory`), a name too long for the temporary file, a directory
/// that does not exist or cannot be written, links that loop.
pub fn check_file(path: &Path) -> io::Result<()> {
    check_names_a_file(path)?;
    if written_in_place(path) {
        #[cfg(unix)]
        if std::os::unix::fs::FileTypeExt::is_fifo(&fs::metadata(path)?.file_type()) {
            return Ok(());
        }
        return OpenOptions::new().write(true).open(path).map(drop);
    }
    let path = &follow_links(path)?;
    if path.is_dir() {
        return Err(io::Error::new(io::ErrorKind::IsADirectory, "it is a directory"));
    }
    match fs::metadata(path) {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let (file, tmp) = create_temporary(path, false)?;
    drop(file);
    fs::remove_file(&tmp)
}

/// Whether `path` (its links followed) is there and neither a file nor a
/// directory: a device or a named pipe, which [`write_file`] writes into.
fn written_in_place(path: &Path) -> bool {
    fs::metadata(path).is_ok_and(|m| !m.is_file() && !m.is_dir())
}

/// `path` with the symbolic links at its end followed, so that the rename
/// replaces the file they lead to, not the link. A link that leads nowhere
/// yet is followed too (which `canonicalize` refuses): the file is made
/// where it points.
///
/// # Errors
///
/// A link that cannot be read, or more than 40 in a row (a loop).
pub fn follow_links(path: &Path) -> io::Result<PathBuf> {
    let mut path = path.to_path_buf();
    // Linux's own limit on the links of one lookup: 40 followed, then one
    // more look at where the last leads.
    for _ in 0..=40 {
        match fs::symlink_metadata(&path) {
            Ok(meta) if meta.file_type().is_symlink() => {
                let to = fs::read_link(&path)?;
                path = match path.parent() {
                    Some(dir) if to.is_relative() => dir.join(to),
                    _ => to,
                };
            }
            _ => return Ok(path),
        }
    }
    Err(io::Error::new(io::ErrorKind::InvalidInput, "too many levels of symbolic links"))
}

/// Syncs the directory that holds `path`, so that the rename is on disk.
/// Best effort: the new file is in place by now, and a file system that
/// refuses a directory sync (some do) would only weaken what a crash
/// keeps; an error here would say the write failed when it did not.
fn sync_directory(path: &Path) {
    // Miri cannot sync a directory; its tests check the rest.
    #[cfg(all(unix, not(miri)))]
    {
        let dir = match path.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir,
            _ => Path::new("."),
        };
        if let Ok(dir) = File::open(dir) {
            let _ = dir.sync_all();
        }
    }
    #[cfg(not(all(unix, not(miri))))]
    let _ = path;
}

/// Makes the temporary file beside `path`, new: a file or link already
/// under its name (planted by another user of the directory, or left by
/// a process of the same id) is never followed nor truncated; the next
/// name is tried. `private`: readable by the owner alone (on Unix), for
/// a file that takes an old one's permissions before its bytes.
fn create_temporary(path: &Path, private: bool) -> io::Result<(File, PathBuf)> {
    let mut tries = 0;
    loop {
        let tmp = temporary(path)?;
        let mut options = OpenOptions::new();
        options.write(true).create_new(true);
        #[cfg(unix)]
        if private {
            std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        }
        #[cfg(not(unix))]
        let _ = private;
        match options.open(&tmp) {
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && tries < 1000 => tries += 1,
            made => return made.map(|file| (file, tmp)),
        }
    }
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
