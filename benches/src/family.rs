//! The trace family of `benches/data/`: what `memres replay` runs when it
//! is given no workload, and which traces are held out from tuning.
//!
//! A directory of traces may hold `held_out.txt`: the names of the traces
//! no default may be tuned on (file names without `.csv.gz` or `.csv`, or
//! with them), one per line, `#` starting a comment. The replay marks the
//! rows of a trace named in the `held_out.txt` beside it (a held-out trace
//! copied elsewhere without that file is not marked), and replays them after
//! the others in its default run, so that they are reported apart.

use std::io;
use std::path::{Path, PathBuf};

#[cfg(test)]
mod tests;

/// The directory of the family's traces.
pub const DATA_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/data");

/// The file beside the traces that names the held-out ones.
pub const HELD_OUT_FILE: &str = "held_out.txt";

/// A trace's name: its file name without `.csv.gz` or `.csv`; `None` for
/// any other file.
pub fn trace_name(path: &Path) -> Option<&str> {
    let file = path.file_name()?.to_str()?;
    file.strip_suffix(".csv.gz").or_else(|| file.strip_suffix(".csv"))
}

/// The names that `dir`'s `held_out.txt` lists: none without the file (a
/// byte-order mark that starts it is dropped).
///
/// # Errors
///
/// The file exists but cannot be read.
pub fn held_out_names(dir: &Path) -> io::Result<Vec<String>> {
    let text = match std::fs::read_to_string(dir.join(HELD_OUT_FILE)) {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    // A byte-order mark (some editors save one) is no part of a name.
    Ok(text
        .trim_start_matches('\u{feff}')
        .lines()
        .map(|line| line.split('#').next().unwrap_or_default().trim())
        .filter(|name| !name.is_empty())
        // Listed by its file name, it is the trace of that name.
        .map(|name| name.strip_suffix(".csv.gz").or_else(|| name.strip_suffix(".csv")).unwrap_or(name))
        .map(String::from)
        .collect())
}

/// Whether the trace at `path` is named in the `held_out.txt` beside it
/// (a generator spec, or a trace with no list beside it, is not).
///
/// # Errors
///
/// The list beside the trace exists but cannot be read: a held-out trace
/// must not pass for a tuning one.
pub fn is_held_out(path: &Path) -> io::Result<bool> {
    let (Some(name), Some(dir)) = (trace_name(path), path.parent()) else { return Ok(false) };
    Ok(held_out_names(dir)?.iter().any(|n| n == name))
}

/// Every trace in `dir` (`.csv.gz` or `.csv`) by name, the held-out ones
/// after the others.
///
/// # Errors
///
/// `dir` or its `held_out.txt` cannot be read.
pub fn traces(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let held = held_out_names(dir)?;
    let mut paths = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_file() && trace_name(&path).is_some() {
            paths.push(path);
        }
    }
    paths.sort_by_cached_key(|p| {
        let name = trace_name(p).unwrap_or_default().to_string();
        (held.contains(&name), name)
    });
    Ok(paths)
}
