//! The files `memres replay` and `memres steps` read and write, checked
//! before anything runs: an output that is a workload's trace, or another
//! output, would overwrite it.

use memres_core::snapshot::follow_links;
use std::fs::{self, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};

#[cfg(test)]
mod tests;

/// A file of the run and how the command line named it, for messages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Named {
    /// The path as given.
    pub path: PathBuf,
    /// What names it: `--timeline t.html`, `the workload t.csv`.
    pub what: String,
}

impl Named {
    /// `path`, named by `what`.
    pub fn new(path: impl Into<PathBuf>, what: impl Into<String>) -> Named {
        Named { path: path.into(), what: what.into() }
    }
}

/// Where `path` lies: its canonical path, or for a file not made yet its
/// canonical folder and its name, found through its links (a dangling
/// link is written through to the file it names); `None` for links that
/// loop.
fn identity(path: &Path) -> Option<PathBuf> {
    if let Ok(p) = fs::canonicalize(path) {
        return Some(p);
    }
    unmade(&follow_links(path).ok()?)
}

/// The canonical folder of the file `path`, not made yet, and its name.
fn unmade(path: &Path) -> Option<PathBuf> {
    let name = path.file_name()?;
    let folder = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    fs::canonicalize(folder).ok().map(|p| p.join(name))
}

/// One file under any of its names, hard links included: its device and
/// inode on Unix (two links are two canonical paths), its canonical path
/// elsewhere.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct FileId(#[cfg(unix)] (u64, u64), #[cfg(not(unix))] PathBuf);

/// The file at `path`: `None` where there is none.
pub fn file_id(path: &Path) -> Option<FileId> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        fs::metadata(path).ok().map(|m| FileId((m.dev(), m.ino())))
    }
    #[cfg(not(unix))]
    {
        fs::canonicalize(path).ok().map(FileId)
    }
}

/// Whether `a` and `b` are one file, under any names (links included). A
/// device or a pipe (`/dev/null`) is no file to keep: never the same.
pub fn same_file(a: &Path, b: &Path) -> bool {
    match (fs::metadata(a), fs::metadata(b)) {
        (Ok(x), Ok(y)) => x.is_file() && y.is_file() && file_id(a).is_some_and(|id| file_id(b) == Some(id)),
        // One is made by the run, the other is there already: two files.
        (Ok(_), Err(_)) | (Err(_), Ok(_)) => false,
        (Err(_), Err(_)) => identity(a).is_some() && identity(a) == identity(b),
    }
}

/// Refuses an output that is the same file as a workload's trace or as
/// another output; a log may be one file with another log (the later
/// builds append to it), with nothing else.
///
/// # Errors
///
/// The message, naming both.
pub fn check_distinct(inputs: &[Named], outputs: &[Named], logs: &[Named]) -> Result<(), String> {
    let clash = |a: &Named, b: &Named| {
        same_file(&a.path, &b.path)
            .then(|| format!("{} and {} are the same file: it would be overwritten", a.what, b.what))
    };
    for (i, out) in outputs.iter().enumerate() {
        let others = inputs.iter().chain(&outputs[i + 1..]).chain(logs);
        if let Some(message) = others.filter_map(|other| clash(out, other)).next() {
            return Err(message);
        }
    }
    for log in logs {
        if let Some(message) = inputs.iter().filter_map(|input| clash(log, input)).next() {
            return Err(message);
        }
    }
    Ok(())
}

/// Checks that `path` can be written, leaving it as it was: a directory is
/// refused (a `--snapshot out/` wrote `out-0` beside it), an existing file
/// is opened to append (and closed with nothing written), a new one is
/// made and removed again (so a folder that does not exist or cannot be
/// written to is told now, not after the run), where its links lead. A
/// pipe or a device is taken as it is, as [`check_file`](memres_core::snapshot::check_file)
/// takes it: opening a named pipe would wait for a reader, and closing it
/// would end the stream that reader sees before the log is written.
///
/// # Errors
///
/// Why it cannot be written.
pub fn check_writable(path: &Path) -> io::Result<()> {
    // Asked of the kernel's own lookup, before the links are followed by
    // hand: `/dev/stdout` leads through `/proc/self/fd/1` to a pipe that
    // no path names (its link reads `pipe:[N]`), and was refused as a
    // folder that does not exist.
    if fs::metadata(path).is_ok_and(|m| !m.is_file() && !m.is_dir()) {
        return Ok(());
    }
    // A link to a file not made yet is written through: its file is made.
    let path = &follow_links(path)?;
    if path.is_dir() {
        return Err(io::Error::new(io::ErrorKind::IsADirectory, "it is a directory"));
    }
    if path.exists() {
        OpenOptions::new().append(true).open(path).map(drop)
    } else {
        OpenOptions::new().write(true).create_new(true).open(path).and_then(|made| {
            drop(made);
            fs::remove_file(path)
        })
    }
}

/// Checks that each of `outputs` (written whole after the run by
/// [`write_file`](memres_core::snapshot::write_file), through a temporary
/// file beside it) can be written, as that write would
/// ([`check_file`](memres_core::snapshot::check_file)).
///
/// # Errors
///
/// The message, naming the first that cannot be written.
pub fn check_outputs(outputs: &[Named]) -> Result<(), String> {
    for out in outputs {
        memres_core::snapshot::check_file(&out.path)
            .map_err(|e| format!("cannot write {}: {e}", out.what))?;
    }
    Ok(())
}
