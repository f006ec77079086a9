//! Workloads: allocation sequences decoded once into a flat list of [`Op`]s.
//!
//! A workload comes from a spec string, generated exactly as RMM's replay
//! harness generates it, or from a trace in RMM's log format:
//!
//! | spec | what |
//! | --- | --- |
//! | `random:N:MAXBYTES:SEED` | `N` allocations of uniform sizes in `1..=MAXBYTES` |
//! | `lograndom:N:MINB:MAXB:SEED` | `N` allocations of log-uniform sizes in `MINB..=MAXB`, as far as floating point goes ([`SizeLaw::LogUniform`]) |
//! | anything else | a path to a CSV trace (`Thread,Time,Action,Pointer,Size,Stream`), plain or gzip |
//!
//! Every allocation gets a fresh id (`0, 1, 2, ...`); every id is freed
//! exactly once, ids still live at the end of the sequence are freed then.

use memres_core::testing::SplitMix64;
use memres_core::trace::{self, Action, ReadError};
use memres_core::Request;
use std::collections::HashMap;
use std::ffi::OsStr;
use std::fmt;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;

#[cfg(test)]
mod tests;

/// The most bytes a generated workload keeps live at once (RMM's harness
/// caps them at 8 GiB): an allocation that would pass it becomes a free.
pub const LIVE_CAP: u64 = 8 << 30;

/// One step of a workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Op {
    /// Bytes requested (a free repeats its allocation's size).
    pub size: u64,
    /// The allocation's id: an index into a table of live blocks.
    pub id: u32,
    /// Index of the stream the step runs on (`0..Workload::streams`).
    pub stream: u16,
    /// Allocate (`true`) or free (`false`) `id`.
    pub alloc: bool,
}

/// A decoded workload and the figures that do not depend on the resource.
#[derive(Clone, Debug)]
pub struct Workload {
    /// The spec or path it came from.
    pub name: String,
    /// The steps, in order.
    pub ops: Vec<Op>,
    /// Number of ids (allocations): ids are `0..ids`.
    pub ids: u32,
    /// Number of distinct streams (at least 1).
    pub streams: u16,
    /// Frees of pointers the trace never allocated, skipped.
    pub skipped_frees: u64,
    /// Failed allocations of the trace (`allocate failure`, a null
    /// pointer), skipped: nothing was allocated.
    pub failed_allocations: u64,
    /// Allocations of a pointer the trace had allocated and not freed: the
    /// block it held stays live to the end of the trace (as RMM's harness
    /// keeps it), raising the peak live bytes, and is freed there.
    pub reused_pointers: u64,
    /// Frees whose size is not their allocation's, replayed with the
    /// allocation's size.
    pub size_mismatches: u64,
    /// Each op's time in microseconds, where every row of a trace has one
    /// ([`time_us`]; RMM's clock times counted on past midnight, a clock
    /// half a day or more before the row before being the next day's);
    /// the frees at the end take the last row's.
    pub times: Option<Vec<u64>>,
    /// The most bytes (as requested) live at once.
    pub peak_live: u64,
    /// The most allocations live at once.
    pub peak_live_count: u32,
}

/// Why a workload could not be decoded.
#[derive(Debug)]
pub enum WorkloadError {
    /// A generator spec with bad fields.
    Spec {
        /// The spec.
        spec: String,
        /// What is wrong with it.
        what: String,
    },
    /// The trace could not be opened or read.
    Io {
        /// The trace's path.
        path: String,
        /// The failure.
        error: std::io::Error,
    },
    /// A workload with no operation to replay.
    Empty {
        /// The spec or path.
        name: String,
        /// What was skipped, if anything.
        skipped: String,
    },
    /// A workload that does not fit in the process's memory.
    TooLarge {
        /// The spec or path.
        name: String,
        /// The operations it held when memory ran out.
        ops: usize,
    },
    /// A line of the trace that is not a valid record.
    Malformed {
        /// The trace's path.
        path: String,
        /// The line number, counted from 1.
        line: u64,
        /// What is wrong with it.
        what: String,
    },
}

impl fmt::Display for WorkloadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WorkloadError::Spec { spec, what } => write!(f, "bad workload `{spec}`: {what}"),
            WorkloadError::Io { path, error } => write!(f, "cannot read trace {path}: {error}"),
            WorkloadError::Empty { name, skipped } => {
                write!(f, "workload `{name}` has no operation to replay{skipped}")
            }
            WorkloadError::TooLarge { name, ops } => {
                write!(f, "workload `{name}` does not fit in this process's memory ({ops} operations held)")
            }
            WorkloadError::Malformed { path, line, what } => {
                write!(f, "{path}:{line}: malformed line: {what}")
            }
        }
    }
}

impl std::error::Error for WorkloadError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            WorkloadError::Io { error, .. } => Some(error),
            _ => None,
        }
    }
}

impl Workload {
    /// Decodes a spec: a generator (`random:...`, `lograndom:...`) or a
    /// trace path.
    ///
    /// # Errors
    ///
    /// [`WorkloadError`] for a bad spec, a missing or unreadable file, a
    /// malformed line (with its number), or no operation to replay.
    pub fn load(spec: impl AsRef<OsStr>) -> Result<Workload, WorkloadError> {
        let spec = spec.as_ref();
        let w = match spec.to_str().and_then(Self::generated) {
            Some(w) => w?,
            // A path need not be UTF-8: the operating system's bytes, as given.
            None => load_trace(Path::new(spec))?,
        };
        if w.ops.is_empty() {
            let skipped = match (w.skipped_frees, w.failed_allocations) {
                (0, 0) => String::new(),
                (f, a) => format!(" ({f} stray frees and {a} failed allocations skipped)"),
            };
            return Err(WorkloadError::Empty { name: w.name, skipped });
        }
        Ok(w)
    }

    /// The workload a generator's spec makes; `None` where `spec` names none.
    fn generated(spec: &str) -> Option<Result<Workload, WorkloadError>> {
        let made = if let Some(rest) = spec.strip_prefix("random:") {
            fields(spec, rest).and_then(|[n, max, seed]| match max {
                0 => Err(spec_error(spec, "MAXBYTES must be at least 1")),
                _ => generate(spec, n, 1, max, seed, SizeLaw::Uniform, LIVE_CAP),
            })
        } else if let Some(rest) = spec.strip_prefix("lograndom:") {
            fields(spec, rest).and_then(|[n, min, max, seed]| match min == 0 || min > max {
                true => Err(spec_error(spec, "need 1 <= MINB <= MAXB")),
                false => generate(spec, n, min, max, seed, SizeLaw::LogUniform, LIVE_CAP),
            })
        } else {
            return None;
        };
        Some(made)
    }

    /// Builds a workload from ops, computing its figures.
    ///
    /// # Panics
    ///
    /// If the ops do not allocate ids `0..n` in order, each freed once after
    /// its allocation with its size, or if the bytes live at once pass
    /// `u64::MAX` (a trace that does so is refused when read: [`parse_trace`]).
    pub fn from_ops(name: String, ops: Vec<Op>, skipped_frees: u64) -> Result<Workload, WorkloadError> {
        let mut live = 0u64;
        let mut peak_live = 0u64;
        let mut count = 0u32;
        let mut peak_live_count = 0u32;
        let mut ids = 0u32;
        let mut streams = 1u16;
        let mut sizes: Vec<Option<u64>> = Vec::new();
        for op in &ops {
            streams = streams.max(op.stream + 1);
            if op.alloc {
                assert_eq!(op.id, ids, "ids are allocated in order");
                ids += 1;
                room(&mut sizes, &name, ops.len())?;
                sizes.push(Some(op.size));
                live = live.checked_add(op.size).expect("the bytes live at once fit in a u64");
                count += 1;
                peak_live = peak_live.max(live);
                peak_live_count = peak_live_count.max(count);
            } else {
                let size = sizes.get_mut(op.id as usize).and_then(Option::take);
                assert_eq!(size, Some(op.size), "free of id {} that is live with this size", op.id);
                live -= op.size;
                count -= 1;
            }
        }
        Ok(Workload {
            name,
            ops,
            ids,
            streams,
            skipped_frees,
            failed_allocations: 0,
            reused_pointers: 0,
            size_mismatches: 0,
            times: None,
            peak_live,
            peak_live_count,
        })
    }
}

/// Room in `v` for one more item, or the error of workload `name`, which
/// held `ops` operations then: a workload too large for the process's
/// memory is an error, not an abort.
fn room<T>(v: &mut Vec<T>, name: &str, ops: usize) -> Result<(), WorkloadError> {
    v.try_reserve(1).map_err(|_| WorkloadError::TooLarge { name: name.to_owned(), ops })
}

/// The trace file `spec` names: `None` for a generator (`random:...`,
/// `lograndom:...`).
pub fn trace_path(spec: &OsStr) -> Option<&Path> {
    let generated = spec.to_str().is_some_and(|s| s.starts_with("random:") || s.starts_with("lograndom:"));
    (!generated).then(|| Path::new(spec))
}

fn spec_error(spec: &str, what: impl Into<String>) -> WorkloadError {
    WorkloadError::Spec { spec: spec.to_owned(), what: what.into() }
}

fn fields<const K: usize>(spec: &str, rest: &str) -> Result<[u64; K], WorkloadError> {
    let parts: Vec<&str> = rest.split(':').collect();
    if parts.len() != K {
        return Err(spec_error(spec, format!("expected {K} numbers after the kind, found {}", parts.len())));
    }
    let mut out = [0u64; K];
    for (o, p) in out.iter_mut().zip(parts) {
        // Digits only, as a trace's numbers: `str::parse` takes a `+`.
        if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
            return Err(spec_error(spec, format!("`{p}` is not a number (digits only, with no sign)")));
        }
        *o = p.parse().map_err(|_| spec_error(spec, format!("`{p}` is past {}", u64::MAX)))?;
    }
    Ok(out)
}

/// How a generator draws sizes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SizeLaw {
    /// `min + r % (max - min + 1)`.
    Uniform,
    /// `exp(ln min + u (ln max - ln min))`, truncated, with `u` the top 53
    /// bits of `r` as a fraction. As in RMM's harness, the rounding of
    /// `exp(ln x)` can land a size just off the bounds: a byte below `min`
    /// where it rounds down to `min - 1`, past `max` for sizes of about
    /// 2^52 bytes and more.
    ///
    /// ```
    /// use memres_bench::workload::Workload;
    /// let w = Workload::load("lograndom:1:1000:1000:1")?;
    /// assert_eq!(w.ops[0].size, 999);
    /// # Ok::<(), memres_bench::workload::WorkloadError>(())
    /// ```
    LogUniform,
}

/// Generates `n` allocations and their frees, step for step as RMM's replay
/// harness does (`gen_random`): the same generator calls in the same order,
/// the same floating-point formula, the same live cap.
///
/// Each step: unless nothing is live, a coin (`r % 2 == 0`: allocate);
/// then a size (drawn for frees too); an allocation that would take live
/// bytes past `cap` becomes a free; a free takes a live id at a random
/// index and moves the last one into its place. The ids still live are
/// freed at the end, in that list's order.
///
/// # Errors
///
/// [`WorkloadError::Spec`] when a size alone exceeds `cap` with nothing
/// live (RMM's harness has undefined behaviour there) or `n` does not fit
/// ids of 32 bits.
pub fn generate(
    name: &str,
    n: u64,
    min: u64,
    max: u64,
    seed: u64,
    law: SizeLaw,
    cap: u64,
) -> Result<Workload, WorkloadError> {
    let n = u32::try_from(n).map_err(|_| spec_error(name, "N must fit in 32 bits"))?;
    let mut rng = SplitMix64::new(seed);
    let mut ops = Vec::new();
    ops.try_reserve_exact(2 * n as usize)
        .map_err(|_| spec_error(name, "N too large for this machine's memory"))?;
    let mut live: Vec<(u32, u64)> = Vec::new();
    let mut live_bytes = 0u64;
    let mut next = 0u32;
    let (ln_min, ln_max) = ((min as f64).ln(), (max as f64).ln());
    while next < n {
        let mut alloc = live.is_empty() || rng.next_u64() % 2 == 0;
        let size = match law {
            SizeLaw::LogUniform => {
                let u = (rng.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64);
                (ln_min + u * (ln_max - ln_min)).exp() as u64
            }
            SizeLaw::Uniform => min + rng.next_u64() % (max - min).wrapping_add(1).max(1),
        };
        if alloc && live_bytes.saturating_add(size) > cap {
            alloc = false;
        }
        if alloc {
            ops.push(Op { size, id: next, stream: 0, alloc: true });
            room(&mut live, name, ops.len())?;
            live.push((next, size));
            live_bytes += size;
            next += 1;
        } else {
            if live.is_empty() {
                return Err(spec_error(
                    name,
                    format!("a size of {size} bytes exceeds the live cap of {cap}"),
                ));
            }
            let i = (rng.next_u64() % live.len() as u64) as usize;
            let (id, size) = live.swap_remove(i);
            ops.push(Op { size, id, stream: 0, alloc: false });
            live_bytes -= size;
        }
    }
    ops.extend(live.iter().map(|&(id, size)| Op { size, id, stream: 0, alloc: false }));
    Workload::from_ops(name.to_owned(), ops, 0)
}

/// Loads a trace in RMM's log format, plain or gzip (told by its first
/// bytes, not its name).
///
/// Rows are read as [`memres_core::trace`] says (RMM's own logs and
/// memres's): header lines are skipped wherever they are, so traces
/// concatenated by `cat` read as one (as do gzip files of several members,
/// which every member of is read; zero bytes after the last member are
/// padding, as gzip reads them, and any other byte there is an error that
/// says so); blank lines are skipped;
/// `allocate failure` records (an allocation that did not happen, logged
/// with a null pointer; another pointer is a malformed line) too, counted
/// in [`Workload::failed_allocations`]. A
/// free of a pointer that is not live is skipped and counted in
/// [`Workload::skipped_frees`]. An allocation of zero bytes at the null
/// pointer is the empty block, of which any number may be live: each is an
/// allocation of its own, and a null free of zero bytes frees one of them
/// (a stray free where none is live). An allocation of a pointer that is
/// already live replaces it (as RMM's harness does), counted in
/// [`Workload::reused_pointers`]; the replaced id and every id still live at
/// the end are freed at the end, in id order. A free takes its
/// allocation's size; one that states another is counted in
/// [`Workload::size_mismatches`]. Each distinct
/// value of the Stream column is one stream, numbered by first appearance;
/// a free runs on its own line's stream, an end-of-trace free on its
/// allocation's.
///
/// # Errors
///
/// [`WorkloadError::Io`] when the file cannot be opened or read,
/// [`WorkloadError::Malformed`] for a line that is not a row of the format
/// ([`memres_core::trace::Record::parse`]: other than six fields, an empty
/// one, an unknown action, a pointer that is not hex or a size that is not
/// a number), more streams or allocations than an op can number, or an
/// allocation that takes the bytes live at once past `u64::MAX` (four
/// blocks of 2^62 bytes), which no figure of a workload could hold.
pub fn load_trace(path: &Path) -> Result<Workload, WorkloadError> {
    let name = path.display().to_string();
    let io = |error| WorkloadError::Io { path: name.clone(), error };
    let file = std::fs::File::open(path).map_err(io)?;
    let mut reader = BufReader::new(file);
    let gzip = reader.fill_buf().map_err(io)?.starts_with(&[0x1f, 0x8b]);
    let reader: Box<dyn Read> = if gzip {
        Box::new(Members { member: Some(flate2::bufread::GzDecoder::new(reader)) })
    } else {
        Box::new(reader)
    };
    parse_trace(&name, BufReader::new(reader))
}

/// The gzip members of a file, one after the other (`cat a.gz b.gz`), read
/// as gzip reads them: zero bytes after the last member are padding (a
/// block device's, a tape's); any other byte that starts no member is an
/// error, not a member cut short.
struct Members<R> {
    /// The member being read; `None` once the file is read.
    member: Option<flate2::bufread::GzDecoder<R>>,
}

impl<R: BufRead> Read for Members<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while let Some(member) = &mut self.member {
            let n = member.read(buf)?;
            if n > 0 || buf.is_empty() {
                return Ok(n);
            }
            // The member ended: what follows is another, padding or nothing.
            let Some(mut rest) = self.member.take().map(flate2::bufread::GzDecoder::into_inner) else {
                break;
            };
            match rest.fill_buf()?.first() {
                Some(0x1f) => self.member = Some(flate2::bufread::GzDecoder::new(rest)),
                Some(0) => padding(&mut rest)?,
                Some(_) => return Err(after_the_last_member()),
                None => {}
            }
        }
        Ok(0)
    }
}

/// Reads zero bytes to the end.
///
/// # Errors
///
/// A byte other than zero, or the reader's error.
fn padding(rest: &mut impl BufRead) -> std::io::Result<()> {
    loop {
        let bytes = rest.fill_buf()?;
        if bytes.is_empty() {
            return Ok(());
        }
        if bytes.iter().any(|&b| b != 0) {
            return Err(after_the_last_member());
        }
        let n = bytes.len();
        rest.consume(n);
    }
}

fn after_the_last_member() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        "bytes after the last gzip member that are neither a member nor zero padding",
    )
}

/// [`load_trace`] over any reader; `name` names it in errors. The rows are
/// read by the core's one reader of RMM's format
/// ([`memres_core::trace::read`]).
///
/// # Errors
///
/// As [`load_trace`].
pub fn parse_trace(name: &str, reader: impl BufRead) -> Result<Workload, WorkloadError> {
    let mut ops = Vec::new();
    let mut live: HashMap<u64, (u32, u64, u16)> = HashMap::new();
    let mut replaced: Vec<(u32, u64, u16)> = Vec::new();
    // The live empty blocks (id, stream): see `Action::Allocate` below.
    let mut empty: Vec<(u32, u16)> = Vec::new();
    let mut streams: HashMap<String, u16> = HashMap::new();
    let mut next = 0u32;
    let mut skipped = 0u64;
    let mut failed = 0u64;
    let (mut reused, mut mismatched) = (0u64, 0u64);
    // As `Workload::from_ops` counts them: a replaced block stays live.
    let mut live_bytes = 0u64;
    let mut times: Option<Vec<u64>> = Some(Vec::new());
    let mut days = 0;
    // Set where memory ran out: the read stops there, and the error is
    // that, not the line's.
    let mut too_large = false;
    // Streams are numbered when an op first uses them, so that skipped
    // rows leave no gaps.
    let mut intern = |stream: &str| match streams.get(stream) {
        Some(&s) => Ok::<u16, String>(s),
        None => {
            let s = u16::try_from(streams.len())
                .ok()
                .filter(|&s| s < u16::MAX)
                .ok_or_else(|| "more than 65535 distinct streams".to_string())?;
            streams.insert(stream.to_owned(), s);
            Ok(s)
        }
    };
    trace::read(reader, |_, row| {
        // Room for the row's op, its time and its place among the live
        // blocks, before anything of it is noted.
        let fits = ops.try_reserve(1).is_ok()
            && times.as_mut().is_none_or(|t| t.try_reserve(1).is_ok())
            && (row.action != Action::Allocate
                || (live.try_reserve(1).is_ok()
                    && replaced.try_reserve(1).is_ok()
                    && empty.try_reserve(1).is_ok()));
        if !fits {
            too_large = true;
            return Err(String::new());
        }
        match row.action {
            Action::Allocate => {
                if next == u32::MAX {
                    return Err("more than 2^32 - 1 allocations".into());
                }
                if row.size > Request::MAX_SIZE {
                    return Err(format!("a size of {} bytes, above any request (2^62 bytes)", row.size));
                }
                live_bytes = live_bytes.checked_add(row.size).ok_or_else(|| {
                    format!(
                        "{} bytes live at once, past the most a workload counts (2^64 - 1)",
                        u128::from(live_bytes) + u128::from(row.size)
                    )
                })?;
                let stream = intern(row.stream)?;
                // Zero bytes at the null pointer is the empty block (RMM's
                // answer to a zero-byte request, memres's `Block::EMPTY`),
                // which any number of allocations hold at once: each is an
                // op of its own, as the program made the call, kept out of
                // `live` (keyed by the pointer, a second one replaced the
                // first, and its free was a stray free).
                if row.pointer == 0 && row.size == 0 {
                    empty.push((next, stream));
                } else if let Some(old) = live.insert(row.pointer, (next, row.size, stream)) {
                    replaced.push(old);
                    reused += 1;
                }
                ops.push(Op { size: row.size, id: next, stream, alloc: true });
                push_time(&mut times, row.time, &mut days);
                next += 1;
            }
            Action::Free => {
                // A null free of zero bytes frees a live empty block (any:
                // they are all alike), else it is looked up as any other.
                let empty_block = if row.pointer == 0 && row.size == 0 { empty.pop() } else { None };
                match empty_block.map(|(id, stream)| (id, 0, stream)).or_else(|| live.remove(&row.pointer)) {
                    // The free's own stream, which may differ from its
                    // allocation's: RMM lets a block be freed on another
                    // stream.
                    Some((id, size, _)) => {
                        live_bytes -= size;
                        mismatched += u64::from(row.size != size);
                        ops.push(Op { size, id, stream: intern(row.stream)?, alloc: false });
                        push_time(&mut times, row.time, &mut days);
                    }
                    None => skipped += 1,
                }
            }
            Action::AllocateFailure => failed += 1,
        }
        Ok(())
    })
    .map_err(|e| match e {
        _ if too_large => WorkloadError::TooLarge { name: name.to_owned(), ops: ops.len() },
        ReadError::Io(error) => WorkloadError::Io { path: name.to_owned(), error },
        ReadError::Malformed { line, what } => WorkloadError::Malformed { path: name.to_owned(), line, what },
    })?;
    // The frees of the blocks left live, in the order they were allocated.
    let n = live.len() + replaced.len() + empty.len();
    let total = ops.len() + n;
    let mut rest: Vec<(u32, u64, u16)> = Vec::new();
    let fits = rest.try_reserve_exact(n).is_ok()
        && ops.try_reserve_exact(n).is_ok()
        && times.as_mut().is_none_or(|t| t.try_reserve_exact(total - t.len()).is_ok());
    if !fits {
        return Err(WorkloadError::TooLarge { name: name.to_owned(), ops: ops.len() });
    }
    let empty = empty.into_iter().map(|(id, stream)| (id, 0, stream));
    rest.extend(live.into_values().chain(replaced).chain(empty));
    rest.sort_unstable_by_key(|&(id, ..)| id);
    ops.extend(rest.into_iter().map(|(id, size, stream)| Op { size, id, stream, alloc: false }));
    if let Some(t) = &mut times {
        let last = t.last().copied().unwrap_or(0);
        t.resize(ops.len(), last);
    }
    let mut w = Workload::from_ops(name.to_owned(), ops, skipped)?;
    w.failed_allocations = failed;
    (w.reused_pointers, w.size_mismatches) = (reused, mismatched);
    w.times = times;
    Ok(w)
}

/// A day in microseconds.
const DAY_US: u64 = 86_400_000_000;

/// Appends a row's time, or gives the times up at a row without one.
/// RMM's clock times start again at midnight: `days` counts the midnights
/// passed, a clock half a day or more before the row before being the
/// next day's (and one half a day or more after it, a row logged late,
/// the day before's).
fn push_time(times: &mut Option<Vec<u64>>, text: &str, days: &mut u64) {
    let (Some(t), Some(us)) = (times.as_mut(), time_us(text)) else {
        *times = None;
        return;
    };
    let clock = text.contains(':');
    let on = |days: u64| days.checked_mul(DAY_US).and_then(|d| d.checked_add(us));
    let at = match (clock, t.last().copied(), on(*days)) {
        (true, Some(last), Some(at)) if at.saturating_add(DAY_US / 2) <= last => {
            *days += 1;
            on(*days)
        }
        (true, Some(last), Some(at)) if *days > 0 && at >= last.saturating_add(DAY_US / 2) => on(*days - 1),
        (_, _, at) => at,
    };
    match at {
        Some(at) => t.push(at),
        // Past what microseconds in a u64 hold: no time.
        None => *times = None,
    }
}

/// A trace's time in microseconds: memres writes microseconds since the
/// Unix epoch, RMM a clock time `HH:MM:SS.ffffff` (read as microseconds
/// since midnight); `None` for anything else, a clock time that no clock
/// shows included (`99:99:99`: read as 4 days, it ran the times of a
/// trace backwards at the next row).
///
/// ```
/// use memres_bench::workload::time_us;
/// assert_eq!(time_us("1795342456727905"), Some(1795342456727905));
/// assert_eq!(time_us("14:03:21.123456"), Some(((14 * 60 + 3) * 60 + 21) * 1_000_000 + 123456));
/// assert_eq!(time_us("14:03:21.5"), Some(((14 * 60 + 3) * 60 + 21) * 1_000_000 + 500000));
/// assert_eq!(time_us("23:59:59.999999"), Some(86_400_000_000 - 1));
/// assert_eq!(time_us("noon"), None);
/// for no_clock in ["24:00:00", "99:99:99.9", "12:60:00", "12:00:60"] {
///     assert_eq!(time_us(no_clock), None, "{no_clock}");
/// }
/// ```
pub fn time_us(text: &str) -> Option<u64> {
    if let Ok(us) = text.parse::<u64>() {
        return Some(us);
    }
    let (clock, fraction) = text.split_once('.').unwrap_or((text, ""));
    let mut parts = clock.split(':').map(|p| p.parse::<u64>().ok());
    let (Some(Some(h)), Some(Some(m)), Some(Some(sec)), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return None;
    };
    if fraction.len() > 6 || !fraction.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if h >= 24 || m >= 60 || sec >= 60 {
        return None;
    }
    let micros = format!("{fraction:0<6}").parse::<u64>().ok()?;
    Some(((h * 60 + m) * 60 + sec) * 1_000_000 + micros)
}
