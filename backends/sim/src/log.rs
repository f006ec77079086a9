//! RMM's `logging_resource_adaptor`: every call as a CSV row.

use memres_core::{Block, MemoryResource, Request, Result, Stream};
use std::fmt;
use std::fs::File;
use std::io::{self, BufRead, BufWriter, Write};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// The header of RMM's log format, as this adaptor writes it.
pub const LOG_HEADER: &str = "Thread,Time,Action,Pointer,Size,Stream";

/// What a log row records.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// A successful allocation (`allocate`).
    Allocate,
    /// A successful free (`free`).
    Free,
    /// A failed allocation (`allocate failure`; the pointer is `0x0`).
    AllocateFailure,
}

impl Action {
    /// The word RMM writes for it.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Allocate => "allocate",
            Action::Free => "free",
            Action::AllocateFailure => "allocate failure",
        }
    }
}

/// One row of a log in RMM's format.
///
/// # Examples
///
/// ```
/// use memres_sim::{Action, LogRecord};
/// let r: LogRecord = "0,1795342456727905,allocate,0x7fed54800000,16777216,0".parse()?;
/// assert_eq!((r.action, r.addr, r.size), (Action::Allocate, 0x7fed54800000, 16 << 20));
/// assert_eq!(r.to_string(), "0,1795342456727905,allocate,0x7fed54800000,16777216,0");
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LogRecord {
    /// A small number per thread, in order of each thread's first logged call.
    pub thread: u64,
    /// Microseconds since the Unix epoch, from a monotonic clock.
    pub time: u64,
    /// What happened.
    pub action: Action,
    /// The block's address (0 for a failure).
    pub addr: u64,
    /// The requested size in bytes.
    pub size: u64,
    /// The stream's [`Stream::id`].
    pub stream: u64,
}

impl fmt::Display for LogRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{},{},{},{:#x},{},{}",
            self.thread,
            self.time,
            self.action.as_str(),
            self.addr,
            self.size,
            self.stream
        )
    }
}

fn bad(what: &str, line: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("{what} in log row `{line}`"))
}

impl std::str::FromStr for LogRecord {
    type Err = io::Error;

    fn from_str(line: &str) -> io::Result<Self> {
        let fields: Vec<&str> = line.trim_end_matches(['\r', '\n']).split(',').collect();
        let [thread, time, action, pointer, size, stream] = fields[..] else {
            return Err(bad("not six fields", line));
        };
        let number = |s: &str, what: &str| s.parse::<u64>().map_err(|_| bad(what, line));
        let action = match action {
            "allocate" => Action::Allocate,
            "free" => Action::Free,
            "allocate failure" => Action::AllocateFailure,
            _ => return Err(bad("unknown action", line)),
        };
        let hex = pointer.strip_prefix("0x").ok_or_else(|| bad("pointer without 0x", line))?;
        Ok(LogRecord {
            thread: number(thread, "bad thread")?,
            time: number(time, "bad time")?,
            action,
            addr: u64::from_str_radix(hex, 16).map_err(|_| bad("bad pointer", line))?,
            size: number(size, "bad size")?,
            stream: number(stream, "bad stream")?,
        })
    }
}

/// Reads a log in RMM's format (header first, then one row per line).
///
/// # Errors
///
/// [`io::ErrorKind::InvalidData`] naming the line for a missing header or a
/// malformed row; the reader's own errors.
///
/// # Examples
///
/// ```
/// use memres_sim::{parse_log, Action};
/// let text = "Thread,Time,Action,Pointer,Size,Stream\n0,5,free,0x100,256,0\n";
/// let rows = parse_log(text.as_bytes())?;
/// assert_eq!(rows[0].action, Action::Free);
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn parse_log(reader: impl BufRead) -> io::Result<Vec<LogRecord>> {
    let mut lines = reader.lines();
    match lines.next().transpose()? {
        Some(h) if h.trim_end() == LOG_HEADER => {}
        _ => return Err(io::Error::new(io::ErrorKind::InvalidData, "log does not start with the header")),
    }
    let mut rows = Vec::new();
    for (i, line) in lines.enumerate() {
        let line = line?;
        if line.is_empty() {
            continue;
        }
        rows.push(line.parse().map_err(|e: io::Error| {
            io::Error::new(io::ErrorKind::InvalidData, format!("line {}: {e}", i + 2))
        })?);
    }
    Ok(rows)
}

/// The number of the calling thread in logs: 0 for the first thread that
/// logs, 1 for the next...
fn thread_number() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    thread_local! {
        static NUMBER: u64 = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    NUMBER.with(|n| *n)
}

/// Microseconds since the Unix epoch, read from a monotonic clock anchored
/// once per process: never goes backwards, even when the wall clock does.
fn now_micros() -> u64 {
    static ANCHOR: OnceLock<(Instant, u64)> = OnceLock::new();
    let (instant, micros) = *ANCHOR.get_or_init(|| {
        let since_epoch = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
        (Instant::now(), since_epoch.as_micros() as u64)
    });
    micros + instant.elapsed().as_micros() as u64
}

/// Writes every allocation and free to a CSV log in RMM's format: RMM's
/// `logging_resource_adaptor`.
///
/// ```text
///  Thread,Time,Action,Pointer,Size,Stream
///  0,1795342456727905,allocate,0x7fed54800000,16777216,0
///  0,1795342456728011,free,0x7fed54800000,16777216,0
///  1,1795342456728313,allocate failure,0x0,1099511627776,0
/// ```
///
/// - `Thread`: a small number per thread (0 for the first that logs).
/// - `Time`: microseconds since the Unix epoch, from a monotonic clock (as
///   in the shared traces).
/// - `Action`: `allocate`, `free`, or `allocate failure` (pointer `0x0`).
/// - `Pointer` in hexadecimal, `Size` the requested bytes, `Stream` the
///   stream's [`Stream::id`].
///
/// Rows are written under the writer's lock, so they are in time order and
/// a replay of the log reproduces what happened. An allocation's row is
/// written once the upstream answered (with the address, or as a failure).
/// A free's row is written *before* the upstream frees the block, as RMM
/// does: once freed, the address may be handed out to another thread, whose
/// `allocate` row must come after this `free`. So a free the upstream then
/// refuses (a double free, a wrong size) is logged all the same: RMM's
/// format has no row to take it back, and a replay treats the block as
/// freed there (a later free of it is a free of a pointer not live, which
/// replays skip). Such frees are counted
/// ([`refused_frees`](Self::refused_frees)). Write errors never fail a
/// call: they are counted ([`write_errors`](Self::write_errors)). The file
/// is flushed when the adaptor is dropped, or by [`flush`](Self::flush).
///
/// # Examples
///
/// ```
/// use memres_core::{MemoryResource, Request};
/// use memres_sim::{parse_log, Action, Logging, SimDevice};
/// let log = Logging::new(SimDevice::new(1 << 30), Vec::new())?;
/// let b = log.allocate(Request::new(1000)?, &())?;
/// log.deallocate(b, &())?;
/// let (_, bytes) = log.into_parts();
/// let rows = parse_log(&bytes[..])?;
/// assert_eq!(rows.iter().map(|r| r.action).collect::<Vec<_>>(), [Action::Allocate, Action::Free]);
/// assert_eq!((rows[0].addr, rows[0].size), (b.addr(), 1000));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct Logging<R, W: Write = BufWriter<File>> {
    upstream: R,
    /// The header is written; rows follow.
    out: Mutex<W>,
    /// Rows that could not be written.
    write_errors: AtomicU64,
    /// Frees logged that the upstream then refused.
    refused_frees: AtomicU64,
}

impl<R> Logging<R> {
    /// Logs to a new file at `path` (truncated if it exists).
    ///
    /// # Errors
    ///
    /// The file cannot be created, or the header not written: at
    /// construction, never at the first allocation.
    ///
    /// ```
    /// # use memres_sim::{Logging, SimDevice};
    /// assert!(Logging::to_file(SimDevice::new(1 << 20), "/no/such/dir/log.csv").is_err());
    /// ```
    pub fn to_file(upstream: R, path: impl AsRef<Path>) -> io::Result<Self> {
        let mut log = Logging::new(upstream, BufWriter::new(File::create(path)?))?;
        // Make the header reach the file now, so that a file that accepts no
        // writes fails here.
        log.out.get_mut().unwrap_or_else(|p| p.into_inner()).flush()?;
        Ok(log)
    }
}

impl<R, W: Write> Logging<R, W> {
    /// Logs to `writer`; writes the header now.
    ///
    /// # Errors
    ///
    /// The header cannot be written.
    ///
    /// ```
    /// # use memres_sim::{Logging, SimDevice};
    /// let log = Logging::new(SimDevice::new(1 << 20), Vec::new())?;
    /// assert_eq!(log.into_parts().1, b"Thread,Time,Action,Pointer,Size,Stream\n");
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn new(upstream: R, mut writer: W) -> io::Result<Self> {
        writeln!(writer, "{LOG_HEADER}")?;
        Ok(Logging {
            upstream,
            out: Mutex::new(writer),
            write_errors: AtomicU64::new(0),
            refused_frees: AtomicU64::new(0),
        })
    }

    /// Flushes the writer.
    ///
    /// # Errors
    ///
    /// The writer's.
    pub fn flush(&self) -> io::Result<()> {
        self.out.lock().unwrap_or_else(|p| p.into_inner()).flush()
    }

    /// Rows that could not be written so far.
    pub fn write_errors(&self) -> u64 {
        self.write_errors.load(Ordering::Relaxed)
    }

    /// Frees logged so far that the upstream then refused (their `free`
    /// rows are in the log: a free is logged before it is made).
    pub fn refused_frees(&self) -> u64 {
        self.refused_frees.load(Ordering::Relaxed)
    }

    /// The upstream resource.
    pub fn upstream(&self) -> &R {
        &self.upstream
    }

    /// The upstream and the writer.
    pub fn into_parts(self) -> (R, W) {
        (self.upstream, self.out.into_inner().unwrap_or_else(|p| p.into_inner()))
    }

    fn log(&self, action: Action, addr: u64, size: u64, stream: u64) {
        let thread = thread_number();
        let mut out = self.out.lock().unwrap_or_else(|p| p.into_inner());
        let row = LogRecord { thread, time: now_micros(), action, addr, size, stream };
        if writeln!(out, "{row}").is_err() {
            self.write_errors.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl<S, R, W> MemoryResource<S> for Logging<R, W>
where
    S: Stream + ?Sized,
    R: MemoryResource<S>,
    W: Write,
{
    fn allocate(&self, request: Request, stream: &S) -> Result<Block> {
        match self.upstream.allocate(request, stream) {
            Ok(b) => {
                self.log(Action::Allocate, b.addr(), b.size(), stream.id());
                Ok(b)
            }
            Err(e) => {
                self.log(Action::AllocateFailure, 0, request.size(), stream.id());
                Err(e)
            }
        }
    }

    fn deallocate(&self, block: Block, stream: &S) -> Result<()> {
        // Before the upstream frees it: after, another thread may get the
        // address and log its allocation first.
        self.log(Action::Free, block.addr(), block.size(), stream.id());
        self.upstream.deallocate(block, stream).inspect_err(|_| {
            self.refused_frees.fetch_add(1, Ordering::Relaxed);
        })
    }
}

// SAFETY: `Logging` hands out `R`'s blocks unchanged and gives them back only
// through `R::deallocate`.
unsafe impl<E, R: memres_core::copy::MemoryOf<E>, W: Write> memres_core::copy::MemoryOf<E> for Logging<R, W> {}

#[cfg(test)]
mod tests;
