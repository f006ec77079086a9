//! RMM's `logging_resource_adaptor`: every call as a row of RMM's log
//! format ([`crate::trace`]; feature `std`).

use super::on_thread::{self, Key};
use crate::trace::{Action, Record, HEADER};
use crate::Pending;
use crate::{Block, MemoryResource, Request, Result, Stream};
use std::format;
use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Instant, SystemTime, UNIX_EPOCH};
use std::vec::Vec;

/// The calling thread's number in the log's thread column: 0 for the
/// first thread that logs, 1 for the next... Numbered apart from
/// [`crate::thread_number`] (which counts every thread that asked, from 1)
/// so that a log's threads read 0, 1, 2 whatever else the process ran.
fn log_thread() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    std::thread_local! {
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

/// Writes every allocation and free to a CSV log in RMM's format
/// ([`crate::trace`], which also reads it back): RMM's
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
/// call: they are counted ([`write_errors`](Self::write_errors)), and the
/// next [`flush`](Self::flush) says so; so is a row logged by the writer's
/// own call back into the adaptor (an allocation through it), which would
/// wait for the lock the row being written holds, a row whose writer
/// panics (the panic goes on to the caller; the log goes on, its lock
/// taken again though the panic poisoned it), and a free's row whose
/// stream's [`Stream::id`] panics. Such a panic loses no block: an
/// allocation's block goes back upstream (the caller never gets it), and a
/// free's block is freed upstream all the same (the caller gave it up),
/// while the panic unwinds. The count is of rows that may not have been
/// written: a row whose write passed and whose flush (written through)
/// failed or panicked is counted, though it may be in the log. The file is
/// flushed when the adaptor is dropped, or by `flush`.
///
/// # Examples
///
/// ```
/// use memres_core::adaptor::Logging;
/// use memres_core::trace::{read_all, Action};
/// use memres_core::{MemoryResource, Request};
/// # use memres_core::testing::BumpUpstream;
/// let log = Logging::new(BumpUpstream::new(1 << 30), Vec::new())?;
/// let b = log.allocate(Request::new(1000)?, &())?;
/// log.deallocate(b, &())?;
/// let (_, bytes) = log.into_parts();
/// let rows = read_all(&bytes[..])?;
/// assert_eq!(rows.iter().map(|r| r.action).collect::<Vec<_>>(), [Action::Allocate, Action::Free]);
/// assert_eq!((rows[0].pointer, rows[0].size), (b.addr(), 1000));
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
#[derive(Debug)]
pub struct Logging<R, W: Write = BufWriter<File>> {
    upstream: R,
    /// The header is written; rows follow.
    out: Mutex<Writer<W>>,
    /// Rows that may not have been written.
    write_errors: AtomicU64,
    /// Of `write_errors`, those a [`flush`](Logging::flush) has reported.
    reported_errors: AtomicU64,
    /// Frees logged that the upstream then refused.
    refused_frees: AtomicU64,
    /// Each row is flushed as it is written ([`write_through`](Logging::write_through)).
    write_through: AtomicBool,
    /// What tells this log's own code (a row, a flush) running on a thread.
    writing: Key,
    /// The [`thread_number`](crate::thread_number) of the thread holding a
    /// [`LockedLog`] of this log, 0 when none: that thread holds the lock
    /// its rows and flushes would wait for.
    locked_by: AtomicU64,
}

/// The log's writer, flushed when the log is dropped: while the thread
/// unwinds, a panic of that flush is caught (a writer's own drop, as
/// `BufWriter`'s, would flush again and abort the process; after a panic
/// in its flush `BufWriter` writes nothing more).
#[derive(Debug)]
struct Writer<W: Write> {
    /// `None` only once [`Logging::into_parts`] took it, or while the
    /// rows are `held`.
    inner: Option<W>,
    /// The rows of a log whose file is made later ([`Logging::held`]),
    /// until it is ([`Logging::start_held`]).
    held: Option<Vec<u8>>,
    /// The regular file it writes ([`to_file`](Logging::to_file),
    /// [`append_to_file`](Logging::append_to_file)), kept from any
    /// `to_file` of the process while this lives; given up after the
    /// writer's last flush.
    claim: Option<Claim>,
}

impl<W: Write> Writer<W> {
    /// Writes one whole row, or holds it.
    fn row(&mut self, row: &[u8], through: bool) -> io::Result<()> {
        if let Some(held) = &mut self.held {
            held.try_reserve(row.len()).map_err(|_| io::Error::from(io::ErrorKind::OutOfMemory))?;
            held.extend_from_slice(row);
            return Ok(());
        }
        self.write_all(row)?;
        if through {
            self.flush()?;
        }
        Ok(())
    }

    /// Flushes the writer; held rows wait for their file.
    fn flush_out(&mut self) -> io::Result<()> {
        match self.held {
            Some(_) => Ok(()),
            None => self.flush(),
        }
    }
}

impl<W: Write> core::ops::Deref for Writer<W> {
    type Target = W;
    fn deref(&self) -> &W {
        self.inner.as_ref().expect("the writer is taken only by `into_parts`, which ends the log")
    }
}

impl<W: Write> core::ops::DerefMut for Writer<W> {
    fn deref_mut(&mut self) -> &mut W {
        self.inner.as_mut().expect("the writer is taken only by `into_parts`, which ends the log")
    }
}

impl<W: Write> Drop for Writer<W> {
    fn drop(&mut self) {
        if let Some(w) = &mut self.inner {
            // What cannot be written now is lost with the log.
            crate::resource::in_destructor(|| drop(w.flush()));
        }
    }
}

/// The longest row: a thread, a time, a pointer, a size and a stream of up
/// to 20 digits each (the pointer `0x` and 16), the longest action, the
/// commas and the newline (120 bytes).
const ROW_BYTES: usize = 4 * 20 + 18 + "allocate failure".len() + 5 + 1;

/// A file whatever path reaches it: its device and inode (another path,
/// a hard link, is the same file); elsewhere than Unix, its canonical path.
#[derive(Clone, Debug, PartialEq, Eq)]
struct FileId(#[cfg(unix)] (u64, u64), #[cfg(not(unix))] std::path::PathBuf);

impl FileId {
    fn of(file: &File, _path: &Path) -> io::Result<FileId> {
        #[cfg(unix)]
        {
            use std::os::unix::fs::MetadataExt;
            let m = file.metadata()?;
            Ok(FileId((m.dev(), m.ino())))
        }
        #[cfg(not(unix))]
        {
            let _ = file;
            Ok(FileId(std::fs::canonicalize(_path)?))
        }
    }
}

/// The regular files that live logs write, one entry per log. Every log writes
/// at the end of its file ([`File`]s opened to append, each row written
/// whole), so logs that append share a file; a log that makes it new
/// would cut the others' rows, and is refused while another lives (the
/// same stack text built for two devices did that).
static CLAIMED: Mutex<Vec<FileId>> = Mutex::new(Vec::new());

/// A file in [`CLAIMED`], taken out when dropped.
#[derive(Debug)]
struct Claim(FileId);

impl Claim {
    /// Claims `file` for a log that makes it new: refused while another
    /// log writes it.
    fn new_file(file: &File, path: &Path) -> io::Result<Claim> {
        let id = FileId::of(file, path)?;
        let mut claimed = CLAIMED.lock().unwrap_or_else(|p| p.into_inner());
        if claimed.contains(&id) {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!(
                    "`{}` is written by another log of this process (give each log, \
                     and each device's, its own file)",
                    path.display()
                ),
            ));
        }
        claimed.push(id.clone());
        Ok(Claim(id))
    }

    /// Claims the file `id` for a log that appends to it, and runs `start`
    /// (which writes the header of an empty file) while no other log of
    /// the process starts on it.
    fn appending<T>(id: FileId, start: impl FnOnce() -> io::Result<T>) -> io::Result<(Claim, T)> {
        let mut claimed = CLAIMED.lock().unwrap_or_else(|p| p.into_inner());
        let started = start()?;
        claimed.push(id.clone());
        Ok((Claim(id), started))
    }
}

impl Drop for Claim {
    fn drop(&mut self) {
        let mut claimed = CLAIMED.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = claimed.iter().position(|c| *c == self.0) {
            claimed.swap_remove(i);
        }
    }
}

impl<R> Logging<R> {
    /// Logs to a new file at `path` (truncated if it exists).
    ///
    /// # Errors
    ///
    /// The file cannot be created, or the header not written (a file it
    /// made is then removed): at construction, never at the first
    /// allocation. `AlreadyExists` while
    /// another log of this process writes the same file, by whatever path
    /// (which is then left as it is).
    ///
    /// ```
    /// # use memres_core::adaptor::Logging;
    /// # use memres_core::testing::BumpUpstream;
    /// assert!(Logging::to_file(BumpUpstream::new(1 << 20), "/no/such/dir/log.csv").is_err());
    /// ```
    pub fn to_file(upstream: R, path: impl AsRef<Path>) -> io::Result<Self> {
        let (out, claim) = LogFile::open(path.as_ref())?.start(&[])?;
        let mut log = Logging::continuing(upstream, out);
        log.out.get_mut().unwrap_or_else(|p| p.into_inner()).claim = claim;
        Ok(log)
    }

    /// A log whose file is made later, by [`start_held`](Self::start_held):
    /// until then it holds its rows, and makes nothing if it is dropped
    /// first. A stack's `log` layer is so, its file made once the whole
    /// stack is built: a stack refused leaves the file as it was.
    pub(crate) fn held(upstream: R) -> Self {
        Logging::with_writer(upstream, Writer { inner: None, held: Some(Vec::new()), claim: None })
    }

    /// Tries the first write of the rows it holds into `file`, before any
    /// file of its stack is cut ([`LogFile::try_write`]).
    ///
    /// # Errors
    ///
    /// [`LogFile::try_write`]'s.
    pub(crate) fn try_held(&self, file: &mut LogFile) -> io::Result<()> {
        let out = self.out.lock().unwrap_or_else(|p| p.into_inner());
        file.try_write(out.held.as_deref().unwrap_or_default())
    }

    /// Makes `file` the file of a [`held`](Self::held) log, as
    /// [`to_file`](Self::to_file) does, and writes the rows it held there.
    ///
    /// # Errors
    ///
    /// [`LogFile::start`]'s; the log holds its rows still.
    pub(crate) fn start_held(&self, file: LogFile) -> io::Result<()> {
        let mut out = self.out.lock().unwrap_or_else(|p| p.into_inner());
        let (file, claim) = file.start(out.held.as_deref().unwrap_or_default())?;
        *out = Writer { inner: Some(file), held: None, claim };
        Ok(())
    }

    /// Logs to the end of the file at `path`, made if missing: after the
    /// rows it holds (a log continued, by a stack built again in the same
    /// run), or from the header if it is empty. Its contents are never cut.
    /// Logs of the process that write the same file at once keep each
    /// row whole; a later `to_file` of it is refused while this lives.
    ///
    /// # Errors
    ///
    /// The file cannot be opened, or the header not written.
    ///
    /// ```
    /// # use memres_core::adaptor::Logging;
    /// # use memres_core::testing::BumpUpstream;
    /// assert!(Logging::append_to_file(BumpUpstream::new(1 << 20), "/no/such/dir/log.csv").is_err());
    /// ```
    pub fn append_to_file(upstream: R, path: impl AsRef<Path>) -> io::Result<Self> {
        let path = path.as_ref();
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        let start = |file: File| -> io::Result<BufWriter<File>> {
            let empty = file.metadata()?.len() == 0;
            let mut out = BufWriter::new(file);
            if empty {
                writeln!(out, "{HEADER}")?;
            }
            // As in `to_file`: a file that accepts no writes fails here.
            out.flush()?;
            Ok(out)
        };
        if !file.metadata()?.is_file() {
            return Ok(Logging::continuing(upstream, start(file)?));
        }
        let id = FileId::of(&file, path)?;
        let (claim, out) = Claim::appending(id, || start(file))?;
        let mut log = Logging::continuing(upstream, out);
        log.out.get_mut().unwrap_or_else(|p| p.into_inner()).claim = Some(claim);
        Ok(log)
    }
}

/// The file of a log made new ([`Logging::to_file`], a stack's `log`
/// layer), opened and claimed but not yet cut: so a stack opens all its
/// logs' files, and tries their first writes
/// ([`try_write`](Self::try_write)), before it cuts any, and one refused
/// leaves the others as they were. Dropped before it is
/// [`start`](Self::start)ed, it leaves the file as it was (but for what a
/// device or a pipe was written), and takes back one it made where
/// nothing was.
#[derive(Debug)]
pub(crate) struct LogFile {
    file: File,
    /// `None` for a device or a pipe.
    claim: Option<Claim>,
    /// A device's or a pipe's header and rows are written: by
    /// [`try_write`](Self::try_write), as its log's.
    written: bool,
    /// Last, so that the file is closed before it is removed.
    made: MadeAnew,
}

impl LogFile {
    /// Opens the file at `path`, made if missing, and claims it.
    ///
    /// # Errors
    ///
    /// The file cannot be opened; `AlreadyExists` while another log of this
    /// process writes it, by whatever path (which is then left as it is).
    pub(crate) fn open(path: &Path) -> io::Result<LogFile> {
        let (file, made) = open_or_make(path)?;
        // A device (`/dev/null`) or a pipe has no rows to cut or offsets to clash.
        let claim = match file.metadata()?.is_file() {
            true => Some(Claim::new_file(&file, path)?),
            false => None,
        };
        Ok(LogFile { file, claim, written: false, made })
    }

    /// Tries the first write of the header and `rows`, so that a file
    /// that accepts none (a full disk, `/dev/full`) refuses a stack
    /// before any of its log files is cut. A regular file
    /// ([`try_regular`]) is first cut to its own length, so that one that
    /// cannot be cut (append-only) is refused with nothing written; then
    /// has them written after what it holds, and is cut back to that: as
    /// it was, and with room for them once cut. A device or a pipe has
    /// nothing to cut, and cannot take a write back: they are written as
    /// its log's.
    ///
    /// A regular file that holds rows whose write is refused for want of
    /// room (a full disk, a quota, the limit of file size: what it holds
    /// may be what takes it, as a log that filled the disk) is not refused
    /// here: it is cut back, as it was, and its [`start`](Self::start),
    /// which cuts it first, decides. If that fails too, the build is
    /// refused with this file cut (its rows gone, the new ones maybe not
    /// all written), and the log files the stack started before it cut and
    /// written; those after it are left as they were.
    ///
    /// # Errors
    ///
    /// The file cannot be cut, written (but for want of room, where it
    /// holds rows), or cut back.
    pub(crate) fn try_write(&mut self, rows: &[u8]) -> io::Result<()> {
        if self.claim.is_none() {
            write_log(&self.file, rows)?;
            self.written = true;
            return Ok(());
        }
        try_regular(&self.file, rows)
    }

    /// Cuts the file, writes the header and then `rows` (unless
    /// [`try_write`](Self::try_write) wrote them to a device or a pipe),
    /// and gives the writer and the claim. After a `try_write`, only a
    /// disk another process filled meanwhile fails here, or one whose
    /// trial was left to this (a file holding rows, out of room).
    ///
    /// # Errors
    ///
    /// The file cannot be cut or written (a file made anew is then taken
    /// back).
    fn start(self, rows: &[u8]) -> io::Result<(BufWriter<File>, Option<Claim>)> {
        let LogFile { file, claim, written, made } = self;
        // On an error the file is closed before `made` takes it back.
        let out = write_start(file, claim.is_some(), (!written).then_some(rows))?;
        made.keep();
        Ok((out, claim))
    }
}

/// What [`LogFile::try_write`] does to a regular file, so that its order
/// is tested on files that refuse a step.
trait Trial {
    /// The length of the file.
    fn size(&self) -> io::Result<u64>;
    /// The file cut (or grown) to `len`.
    fn cut(&self, len: u64) -> io::Result<()>;
    /// The header and `rows` written at the file's end, and flushed.
    fn write_log(&self, rows: &[u8]) -> io::Result<()>;
}

impl Trial for File {
    fn size(&self) -> io::Result<u64> {
        Ok(self.metadata()?.len())
    }

    fn cut(&self, len: u64) -> io::Result<()> {
        self.set_len(len)
    }

    fn write_log(&self, rows: &[u8]) -> io::Result<()> {
        write_log(self, rows)
    }
}

/// The trial write of a regular file's header and `rows`, which leaves it
/// as it was.
fn try_regular(file: &impl Trial, rows: &[u8]) -> io::Result<()> {
    let len = file.size()?;
    // A cut to what it holds changes nothing, but is refused where the cut
    // back would be (an append-only file, whose writes pass): before
    // anything is written, which could not be taken back then.
    file.cut(len)?;
    // A write, as only a write meets a full disk; after what the file
    // holds, so that cutting back restores it without a copy of it.
    let tried = file.write_log(rows);
    // Whether the write failed or not, what it wrote goes.
    file.cut(len)?;
    match tried {
        // What the file holds may be what takes the room (the log of the
        // run before filled the disk): cut, it may leave room for the new
        // rows. The start, which cuts it and writes them, decides.
        Err(e) if len > 0 && out_of_room(&e) => Ok(()),
        tried => tried,
    }
}

/// A write refused for want of room (a full disk, a quota, the process's
/// limit of file size), which a file cut may have.
fn out_of_room(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded | io::ErrorKind::FileTooLarge
    )
}

/// `file` cut (unless it is a device or a pipe) and its header and `rows`
/// written (unless they are).
fn write_start(file: File, cut: bool, rows: Option<&[u8]>) -> io::Result<BufWriter<File>> {
    if cut {
        file.set_len(0)?;
    }
    if let Some(rows) = rows {
        write_log(&file, rows)?;
    }
    Ok(BufWriter::new(file))
}

/// The header and `rows` written to `file`, at its end, and flushed: so
/// that a file that accepts no writes fails here.
fn write_log(file: &File, rows: &[u8]) -> io::Result<()> {
    let mut out = BufWriter::new(file);
    writeln!(out, "{HEADER}")?;
    out.write_all(rows)?;
    out.flush()
}

/// The file at `path` opened uncut, so that a file another log writes is
/// left whole, and to append, so that logs that append to it later keep
/// their rows; made where nothing was, then a [`MadeAnew`] of it: what a
/// refusal takes back is only what was made.
fn open_or_make(path: &Path) -> io::Result<(File, MadeAnew)> {
    let mut at = path.to_path_buf();
    loop {
        match OpenOptions::new().create_new(true).append(true).open(&at) {
            Ok(file) => return Ok((file, MadeAnew(Some(at)))),
            // `create_new` refuses a link even to nothing (dangling): it is
            // followed then, to make the file it names as made. A loop of
            // links is `try_exists`'s error.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists && !at.try_exists()? => {
                let target = std::fs::read_link(&at)?;
                at = at.parent().unwrap_or(Path::new("")).join(target);
            }
            // A file, or a link to one: it was there, and is kept.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                return Ok((OpenOptions::new().create(true).append(true).open(&at)?, MadeAnew(None)))
            }
            Err(e) => return Err(e),
        }
    }
}

/// The path of a file a [`LogFile`] made where nothing was, removed when
/// dropped: `None` once the file is the log's.
#[derive(Debug)]
struct MadeAnew(Option<std::path::PathBuf>);

impl MadeAnew {
    /// Leaves the file made to its log.
    fn keep(mut self) {
        self.0 = None;
    }
}

impl Drop for MadeAnew {
    fn drop(&mut self) {
        if let Some(path) = &self.0 {
            // What cannot be removed is left, empty or with the header.
            drop(std::fs::remove_file(path));
        }
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
    /// # use memres_core::adaptor::Logging;
    /// # use memres_core::testing::BumpUpstream;
    /// let log = Logging::new(BumpUpstream::new(1 << 20), Vec::new())?;
    /// assert_eq!(log.into_parts().1, b"Thread,Time,Action,Pointer,Size,Stream\n");
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn new(upstream: R, mut writer: W) -> io::Result<Self> {
        writeln!(writer, "{HEADER}")?;
        Ok(Logging::continuing(upstream, writer))
    }

    /// Logs rows to `writer`, which has the header already.
    fn continuing(upstream: R, writer: W) -> Self {
        Logging::with_writer(upstream, Writer { inner: Some(writer), held: None, claim: None })
    }

    fn with_writer(upstream: R, out: Writer<W>) -> Self {
        Logging {
            upstream,
            out: Mutex::new(out),
            write_errors: AtomicU64::new(0),
            reported_errors: AtomicU64::new(0),
            refused_frees: AtomicU64::new(0),
            write_through: AtomicBool::new(false),
            writing: Key::default(),
            locked_by: AtomicU64::new(0),
        }
    }

    /// Flushes the writer.
    ///
    /// # Errors
    ///
    /// The writer's; else, where rows may not have been written since the
    /// last flush that said so ([`write_errors`](Self::write_errors)), an
    /// error that says how many, so that a flush that succeeds means the
    /// log lost nothing.
    pub fn flush(&self) -> io::Result<()> {
        self.own(|| {
            let mut out = self.out.lock().unwrap_or_else(|p| p.into_inner());
            out.flush_out()?;
            // Under the writer's lock, as every row's count.
            let lost = self.write_errors.load(Ordering::Relaxed);
            let reported = self.reported_errors.swap(lost, Ordering::Relaxed);
            match lost - reported {
                0 => Ok(()),
                n => Err(io::Error::other(format!("{n} rows of the log may not have been written"))),
            }
        })
        .unwrap_or_else(|| {
            Err(io::Error::other(
                "a flush of the log from inside its own writer, or while this thread locks it",
            ))
        })
    }

    /// From now on, flushes each row as it is written, after flushing
    /// what is buffered: for a log that is never dropped, whose process
    /// exits after its exit handler flushed it, so that the rows logged
    /// later (by static destructors, other threads, an interpreter's
    /// finalization) still reach the file.
    ///
    /// # Errors
    ///
    /// [`flush`](Self::flush)'s.
    ///
    /// ```
    /// # use memres_core::adaptor::Logging;
    /// # use memres_core::testing::BumpUpstream;
    /// # use memres_core::MemoryResource;
    /// # use memres_core::Request;
    /// # use std::io::BufWriter;
    /// let log = Logging::new(BumpUpstream::new(1 << 20), BufWriter::new(Vec::new()))?;
    /// log.write_through()?;
    /// log.allocate(Request::new(256)?, &())?;
    /// // Written, not buffered: the header and the row.
    /// let out = log.into_parts().1;
    /// assert_eq!((out.buffer().len(), out.get_ref().iter().filter(|&&c| c == b'\n').count()), (0, 2));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn write_through(&self) -> io::Result<()> {
        self.write_through.store(true, Ordering::Relaxed);
        self.flush()
    }

    /// Rows that may not have been written so far: the writer's error or
    /// panic, a free's row whose stream's `id` panicked, or a row of the
    /// writer's own call back into the log. A row written
    /// whose flush (written through) failed or panicked is counted, though
    /// it may be in the log.
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
        let mut out = self.out.into_inner().unwrap_or_else(|p| p.into_inner());
        (self.upstream, out.inner.take().expect("the writer is taken only here"))
    }

    /// Runs `f`, this log's own code that takes its writer's lock, on this
    /// thread; `None` where the thread holds that lock already and would
    /// wait for itself for ever: inside the writer's own call (a writer,
    /// the user's, that allocates through this log or flushes it), or
    /// while it holds a [`LockedLog`] of it (a fork handler that frees a
    /// block logged here meanwhile, by a collector it runs).
    fn own<T>(&self, f: impl FnOnce() -> T) -> Option<T> {
        if self.locked_by.load(Ordering::Relaxed) == crate::thread_number() {
            return None;
        }
        on_thread::run(&self.writing, f)
    }

    fn log(&self, action: Action, addr: u64, size: u64, stream: u64) {
        let ran = self.own(|| {
            let thread = log_thread();
            let mut out = self.out.lock().unwrap_or_else(|p| p.into_inner());
            let row = Record { thread, time: now_micros(), action, pointer: addr, size, stream };
            let through = self.write_through.load(Ordering::Relaxed);
            // Made whole first, so that the writer gets it in one call: a
            // buffer flushes whole rows only, and logs that append to one
            // file mix rows, never parts of them.
            let mut line = [0u8; ROW_BYTES];
            let mut cursor = io::Cursor::new(&mut line[..]);
            let len = writeln!(cursor, "{row}").map(|()| cursor.position() as usize);
            // Counted lost unless written, on an error and on the writer's
            // panic alike; before the lock goes (the guard is dropped
            // first), as `flush` reads the count under it: a flush after
            // this row never misses it.
            let lost = Count(&self.write_errors);
            if len.and_then(|n| out.row(&line[..n], through)).is_ok() {
                core::mem::forget(lost);
            }
        });
        if ran.is_none() {
            // Refused where this thread holds the lock (in a row's or a
            // flush's writer call, or a `LockedLog`): counted under it still.
            self.write_errors.fetch_add(1, Ordering::Relaxed);
        }
    }
}

impl<S: Stream + ?Sized, R: MemoryResource<S>, W: Write> MemoryResource<S> for Logging<R, W> {
    fn allocate(&self, request: Request, stream: &S) -> Result<Block> {
        // Read before the upstream call: `id` is the user's and may panic.
        let id = stream.id();
        match self.upstream.allocate(request, stream) {
            Ok(b) => {
                // The writer is the user's too: if it panics, the block
                // the caller never gets goes back.
                let pending = Pending::new(&self.upstream, b, stream);
                self.log(Action::Allocate, b.addr(), b.size(), id);
                Ok(pending.hand_over())
            }
            Err(e) => {
                self.log(Action::AllocateFailure, 0, request.size(), id);
                Err(e)
            }
        }
    }

    fn deallocate(&self, block: Block, stream: &S) -> Result<()> {
        // The caller gave the block up: if the stream's `id` or the writer
        // (the user's) panics, it still goes back upstream, its row lost.
        let pending = Pending::new(&self.upstream, block, stream);
        let unread = Count(&self.write_errors);
        let id = stream.id();
        core::mem::forget(unread);
        // Before the upstream frees it: after, another thread may get the
        // address and log its allocation first.
        self.log(Action::Free, block.addr(), block.size(), id);
        let block = pending.hand_over();
        // Counted unless the upstream frees it: on its error, and on its
        // panic, the row tells of a free that did not happen.
        let refused = Count(&self.refused_frees);
        self.upstream.deallocate(block, stream)?;
        core::mem::forget(refused);
        Ok(())
    }
}

/// Counts one when dropped, unless forgotten once what it counts did not
/// happen: a free refused, a row lost.
struct Count<'a>(&'a AtomicU64);

impl Drop for Count<'_> {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

crate::inspect::forward_inspect!(Logging<R, W: Write>, upstream);

// SAFETY: `Logging` hands out `R`'s blocks unchanged and gives them back only
// through `R::deallocate`.
unsafe impl<E, R: crate::copy::MemoryOf<E>, W: Write> crate::copy::MemoryOf<E> for Logging<R, W> {}

impl<R: 'static, W: Write + 'static> Logging<R, W> {
    /// Flushes the log and keeps its writer locked until the [`LockedLog`]
    /// is dropped: what a fork handler takes before `fork` and lets go of
    /// after it, in the parent and in the child. The child then inherits no buffered
    /// row (which its exit handler would write a second time) and no lock
    /// that another thread held (which no thread of the child could ever
    /// let go). Rows other threads log meanwhile wait; those of this
    /// thread are counted lost ([`write_errors`](Self::write_errors)), and
    /// its flushes refused, as they would wait for the lock it holds. A
    /// flush that fails is counted as one row that may not have been
    /// written.
    ///
    /// `None` inside this log's own writer, which holds the lock already,
    /// and while this thread holds a `LockedLog` of it.
    ///
    /// ```
    /// # use memres_core::adaptor::Logging;
    /// # use memres_core::testing::BumpUpstream;
    /// # use memres_core::{MemoryResource, Request};
    /// # use std::io::BufWriter;
    /// # use std::sync::Arc;
    /// let log = Arc::new(Logging::new(BumpUpstream::new(1 << 20), BufWriter::new(Vec::new()))?);
    /// log.allocate(Request::new(256)?, &())?;
    /// let locked = Logging::lock_flushed(&log).expect("not inside the log's writer");
    /// assert_eq!(locked.writer().unwrap().buffer().len(), 0); // the row is written out
    /// drop(locked); // rows may be logged again
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn lock_flushed(this: &Arc<Self>) -> Option<LockedLog<R, W>> {
        this.own(|| {
            let mut out = this.out.lock().unwrap_or_else(|p| p.into_inner());
            this.locked_by.store(crate::thread_number(), Ordering::Relaxed);
            if out.flush_out().is_err() {
                this.write_errors.fetch_add(1, Ordering::Relaxed);
            }
            // SAFETY: only the lifetime changes. The guard borrows the
            // mutex inside the `Arc`'s allocation, which does not move
            // and lives while an `Arc` of it does: `LockedLog` owns one
            // (`log`), and drops its guard first (fields drop in the
            // order declared). The guard never leaves `LockedLog` with the
            // longer lifetime: `writer` lends it for `LockedLog`'s own.
            let out = unsafe {
                core::mem::transmute::<MutexGuard<'_, Writer<W>>, MutexGuard<'static, Writer<W>>>(out)
            };
            LockedLog { out, log: Arc::clone(this) }
        })
    }
}

/// A log's writer locked by [`Logging::lock_flushed`], its rows flushed:
/// the log writes no row until this is dropped. Not `Send`: it is let go
/// of on the thread that took it (the thread that forks, in the parent and
/// in the child).
pub struct LockedLog<R: 'static, W: Write + 'static = BufWriter<File>> {
    /// The guard of `log`'s writer: declared first, so dropped first.
    out: MutexGuard<'static, Writer<W>>,
    /// What keeps the mutex `out` borrows where it is.
    log: Arc<Logging<R, W>>,
}

impl<R: 'static, W: Write + 'static> Drop for LockedLog<R, W> {
    fn drop(&mut self) {
        // Before the guard (dropped after this): the lock is this thread's
        // until then.
        self.log.locked_by.store(0, Ordering::Relaxed);
    }
}

impl<R, W: Write> LockedLog<R, W> {
    /// The log's writer, flushed when it was locked; `None` while the log
    /// holds its rows for a file not made yet (a stack's `log` layer until
    /// the whole stack is built).
    pub fn writer(&self) -> Option<&W> {
        self.out.inner.as_ref()
    }
}

impl<R, W: Write> core::fmt::Debug for LockedLog<R, W> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str("LockedLog")
    }
}

#[cfg(test)]
mod tests;
