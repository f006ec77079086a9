//! RMM's log format: the trace of a run, one allocation or free a row
//! (feature `std`).
//!
//! ```text
//!  Thread,Time,Action,Pointer,Size,Stream
//!  0,1795342456727905,allocate,0x7fed54800000,16777216,0
//!  0,1795342456728011,free,0x7fed54800000,16777216,0
//!  140245,14:03:21.123456,allocate failure,(nil),1099511627776,0x7f01
//! ```
//!
//! [`Logging`](crate::adaptor::Logging) writes it; [`read`] is the one
//! reader, of what memres writes and of what RMM's
//! `logging_resource_adaptor` writes:
//!
//! - `Thread`, `Time` and `Stream` are kept as text: memres writes numbers
//!   (a small number per thread, microseconds since the Unix epoch, the
//!   stream's [`Stream::id`](crate::Stream::id)), RMM a thread id, a clock
//!   time (`14:03:21.123456`) and the stream's handle (`0`, `0x7f01...`).
//! - `Action` is `allocate`, `free` or `allocate failure`.
//! - `Pointer` is hexadecimal, with or without `0x`; a failed allocation's
//!   null pointer is `0x0` (memres, RMM through `fmt`) or `(nil)` (RMM
//!   through `printf`'s `%p`), and a failure with another pointer is a
//!   malformed row.
//! - `Size` is the requested bytes.
//!
//! A row has exactly these six fields (a seventh, even empty, is a
//! malformed row), none of them empty (as every writer writes them: an
//! empty one is a row cut short), and its numbers are digits only, with no
//! sign.
//! Header lines are skipped wherever they are (traces concatenated by
//! `cat` read as one), as are blank lines; fields are trimmed, a header's
//! too, and a byte-order mark (U+FEFF) that starts a line is dropped. A
//! header of other columns, or of these in another order (a line whose
//! first field is `Thread`), is a malformed line: its rows would be read
//! in this order. A line is
//! UTF-8 of at most [`MAX_LINE`] bytes, read no further: a longer one is a
//! malformed line, as is one that is not UTF-8. A reader that wants gzip
//! decodes it and hands the text over as a [`BufRead`].
//!
//! # Examples
//!
//! ```
//! use memres_core::trace::{read_all, Action};
//! let text = "Thread,Time,Action,Pointer,Size,Stream\n\
//!             0,5,allocate,0x100,256,0\n\
//!             7,10:00:00.000001,allocate failure,(nil),1024,0x7f01\n";
//! let rows = read_all(text.as_bytes())?;
//! assert_eq!((rows[0].action, rows[0].pointer, rows[0].size), (Action::Allocate, 0x100, 256));
//! assert_eq!((rows[1].action, rows[1].pointer, rows[1].stream.as_str()), (Action::AllocateFailure, 0, "0x7f01"));
//! assert_eq!(rows[0].to_string(), "0,5,allocate,0x100,256,0");
//! # Ok::<(), memres_core::trace::ReadError>(())
//! ```

use alloc::string::{String, ToString};
use alloc::vec::Vec;
use core::fmt;
use std::io::{self, BufRead, Read};

#[cfg(test)]
mod tests;

/// The header row.
pub const HEADER: &str = "Thread,Time,Action,Pointer,Size,Stream";

/// What a row records.
///
/// ```
/// use memres_core::trace::Action;
/// assert_eq!(Action::AllocateFailure.as_str(), "allocate failure");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// A successful allocation (`allocate`).
    Allocate,
    /// A free (`free`).
    Free,
    /// A failed allocation (`allocate failure`; the pointer is null).
    AllocateFailure,
}

impl Action {
    /// The words of the format.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Allocate => "allocate",
            Action::Free => "free",
            Action::AllocateFailure => "allocate failure",
        }
    }
}

/// One row. `T` is the type of the three columns kept as they are: `&str`
/// as read, numbers as [`Logging`](crate::adaptor::Logging) writes them,
/// `String` for rows kept past their line ([`read_all`]).
///
/// Printed, a row is a line of the format (without its line break).
///
/// ```
/// use memres_core::trace::{Action, Record};
/// let r = Record::parse(" 3 , 99 ,free, 7F00 ,512, 1")?;
/// assert_eq!((r.thread, r.time, r.action, r.pointer, r.size, r.stream), ("3", "99", Action::Free, 0x7f00, 512, "1"));
/// assert_eq!(r.to_string(), "3,99,free,0x7f00,512,1");
/// # Ok::<(), String>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Record<T> {
    /// Who made the call.
    pub thread: T,
    /// When.
    pub time: T,
    /// What happened.
    pub action: Action,
    /// The block's address (0 for a failure).
    pub pointer: u64,
    /// The requested size in bytes.
    pub size: u64,
    /// The stream of the call.
    pub stream: T,
}

impl<T: fmt::Display> fmt::Display for Record<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Record { thread, time, action, pointer, size, stream } = self;
        write!(f, "{thread},{time},{},{pointer:#x},{size},{stream}", action.as_str())
    }
}

impl<'a> Record<&'a str> {
    /// Reads one row (not a header line: see [`is_skipped`]).
    ///
    /// # Errors
    ///
    /// What is wrong with it: other than six fields, an empty `Thread`,
    /// `Time` or `Stream`, an unknown action, a pointer that is not
    /// hexadecimal digits (after an optional `0x`), an `allocate failure`
    /// whose pointer is not null, a size that is not decimal digits (a
    /// sign is neither).
    pub fn parse(line: &'a str) -> Result<Self, String> {
        let line = line.trim_end_matches(['\r', '\n']);
        let mut cols = line.split(',').map(str::trim);
        let mut field = || cols.next();
        let (Some(thread), Some(time), Some(action), Some(pointer), Some(size), Some(stream), None) =
            (field(), field(), field(), field(), field(), field(), field())
        else {
            return Err(alloc::format!("expected 6 fields, found {}", line.split(',').count()));
        };
        // Every writer writes each field (RMM: a thread id, a clock time, the
        // stream's handle): an empty one is a row cut short.
        for (name, text) in [("Thread", thread), ("Time", time), ("Stream", stream)] {
            if text.is_empty() {
                return Err(alloc::format!("empty {name} field"));
            }
        }
        let action = match action {
            "allocate" => Action::Allocate,
            "free" => Action::Free,
            "allocate failure" => Action::AllocateFailure,
            other => return Err(alloc::format!("unknown action `{other}`")),
        };
        let pointer_text = pointer;
        let pointer = match pointer_text {
            "(nil)" => 0,
            p => {
                let digits = p.strip_prefix("0x").or_else(|| p.strip_prefix("0X")).unwrap_or(p);
                // `from_str_radix` takes a leading `+`, which no writer of
                // the format writes.
                if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return Err(alloc::format!("pointer `{p}` is not a hex number"));
                }
                u64::from_str_radix(digits, 16)
                    .map_err(|_| alloc::format!("pointer `{p}` is past 64 bits (above 0xffffffffffffffff)"))?
            }
        };
        // A failure allocated nothing: every writer logs it with the null
        // pointer, and another is a row mangled (an `allocate`'s).
        if action == Action::AllocateFailure && pointer != 0 {
            return Err(alloc::format!(
                "an allocate failure with pointer `{pointer_text}` (a failure's is null)"
            ));
        }
        if size.is_empty() || !size.bytes().all(|b| b.is_ascii_digit()) {
            return Err(alloc::format!("size `{size}` is not a number"));
        }
        let size = size
            .parse::<u64>()
            .map_err(|_| alloc::format!("size `{size}` is past 64 bits (above {})", u64::MAX))?;
        Ok(Record { thread, time, action, pointer, size, stream })
    }

    /// The row with its text copied.
    pub fn to_owned(&self) -> Record<String> {
        Record {
            thread: self.thread.to_string(),
            time: self.time.to_string(),
            action: self.action,
            pointer: self.pointer,
            size: self.size,
            stream: self.stream.to_string(),
        }
    }
}

/// Whether [`read`] skips `line`: blank, or the header (its fields
/// trimmed, as a row's are), after the byte-order mark that [`read`]
/// drops where it starts the line. A header of other columns, or of these
/// in another order, is not skipped: [`read`] refuses it.
///
/// ```
/// use memres_core::trace::{is_skipped, HEADER};
/// assert!(is_skipped(HEADER) && is_skipped("  ") && !is_skipped("0,1,free,0x100,256,0"));
/// assert!(is_skipped(" Thread,Time,Action,Pointer,Size,Stream"));
/// assert!(is_skipped("\u{feff}Thread,Time,Action,Pointer,Size,Stream"));
/// assert!(!is_skipped("Thread,Time,Action,Pointer,Stream,Size"));
/// ```
pub fn is_skipped(line: &str) -> bool {
    let line = line.strip_prefix('\u{feff}').unwrap_or(line).trim();
    line.is_empty() || line.split(',').map(str::trim).eq(HEADER.split(','))
}

/// Why a trace could not be read.
#[derive(Debug)]
pub enum ReadError {
    /// The reader failed.
    Io(io::Error),
    /// A row that is not one of the format, or that the caller refused.
    Malformed {
        /// Its line number, counted from 1.
        line: u64,
        /// What is wrong with it.
        what: String,
    },
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReadError::Io(e) => write!(f, "{e}"),
            ReadError::Malformed { line, what } => write!(f, "line {line}: {what}"),
        }
    }
}

impl std::error::Error for ReadError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ReadError::Io(e) => Some(e),
            ReadError::Malformed { .. } => None,
        }
    }
}

/// The longest line [`read`] takes, in bytes, its line break (`\n` or
/// `\r\n`) not counted:
/// a row of the format is under 200 bytes, and a longer line (a file with no
/// line break, a gzip of zeros) would otherwise grow without bound.
pub const MAX_LINE: usize = 4096;

/// Hands every row of `reader` to `each`, in order, with its line number.
///
/// # Errors
///
/// [`ReadError::Io`] from the reader; [`ReadError::Malformed`] for a line
/// longer than [`MAX_LINE`] bytes (read no further than that), one that is
/// not UTF-8, a header other than [`HEADER`], a row that does not parse (see [`Record::parse`]) or that
/// `each` refuses (its message), naming the line. Rows after the first
/// error are not read.
///
/// ```
/// use memres_core::trace::{read, ReadError};
/// let mut sizes = Vec::new();
/// read("0,1,allocate,0x100,256,0\n\n0,2,free,0x100,256,0\n".as_bytes(), |_, r| Ok(sizes.push(r.size)))?;
/// assert_eq!(sizes, [256, 256]);
/// let e = read("0,1,allocate,0x100,256,0\n0,2,resize,0x100,256,0\n".as_bytes(), |_, _| Ok(())).unwrap_err();
/// assert_eq!(e.to_string(), "line 2: unknown action `resize`");
/// # Ok::<(), ReadError>(())
/// ```
pub fn read(
    mut reader: impl BufRead,
    mut each: impl FnMut(u64, Record<&str>) -> Result<(), String>,
) -> Result<(), ReadError> {
    let mut bytes = Vec::new();
    let mut number = 0u64;
    loop {
        bytes.clear();
        // One byte past the longest line and its longest break (`\r\n`)
        // tells a longer one, whose rest is never read.
        let n =
            (&mut reader).take(MAX_LINE as u64 + 2).read_until(b'\n', &mut bytes).map_err(ReadError::Io)?;
        if n == 0 {
            return Ok(());
        }
        number += 1;
        let malformed = |what| ReadError::Malformed { line: number, what };
        let text = match bytes.strip_suffix(b"\n") {
            Some(text) => text.strip_suffix(b"\r").unwrap_or(text),
            None => &bytes[..],
        };
        if text.len() > MAX_LINE {
            return Err(malformed(alloc::format!("longer than {MAX_LINE} bytes")));
        }
        let line = core::str::from_utf8(text)
            .map_err(|e| malformed(alloc::format!("not UTF-8 (byte {} of the line)", e.valid_up_to() + 1)))?;
        if is_skipped(line) {
            continue;
        }
        // A byte-order mark is no text of a row: the first line of a file
        // saved with one, wherever `cat` put that file.
        let line = line.strip_prefix('\u{feff}').unwrap_or(line);
        // Another header: its rows would be read in this one's order.
        if line.split(',').next().map(str::trim) == Some("Thread") {
            return Err(malformed(alloc::format!("a header other than `{HEADER}`")));
        }
        Record::parse(line).and_then(|record| each(number, record)).map_err(malformed)?;
    }
}

/// Every row of `reader`, kept.
///
/// # Errors
///
/// As [`read`].
///
/// ```
/// let rows = memres_core::trace::read_all("0,1,free,0x100,256,0\n".as_bytes())?;
/// assert_eq!(rows[0].thread, "0");
/// # Ok::<(), memres_core::trace::ReadError>(())
/// ```
pub fn read_all(reader: impl BufRead) -> Result<Vec<Record<String>>, ReadError> {
    let mut rows = Vec::new();
    read(reader, |_, r| {
        rows.push(r.to_owned());
        Ok(())
    })?;
    Ok(rows)
}
