extern crate std;

use super::*;
use crate::testing::{BumpUpstream, IdStream, SplitMix64};
use crate::trace::read_all;
use crate::Error;
use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use std::collections::{HashMap, HashSet};

type Op = (Action, u64, u64, u64);

/// The rows of a log as written: every one parses, fields as numbers.
fn rows(bytes: &[u8]) -> Vec<Record<u64>> {
    let number = |text: &str| text.parse::<u64>().unwrap();
    let rows = read_all(bytes).unwrap();
    rows.iter()
        .map(|r| Record {
            thread: number(&r.thread),
            time: number(&r.time),
            action: r.action,
            pointer: r.pointer,
            size: r.size,
            stream: number(&r.stream),
        })
        .collect()
}

fn ops_of(rows: &[Record<u64>]) -> Vec<Op> {
    rows.iter().map(|r| (r.action, r.pointer, r.size, r.stream)).collect()
}

#[test]
fn round_trip_yields_the_same_operations() {
    let log = Logging::new(BumpUpstream::new(1 << 30), Vec::new()).unwrap();
    let mut expected: Vec<Op> = Vec::new();
    let mut live = Vec::new();
    let mut rng = SplitMix64::new(11);
    for i in 0..crate::testing::steps(2000) as u64 {
        let stream = IdStream(rng.below(3) * 0x1000);
        if live.is_empty() || rng.below(2) == 0 {
            // Some requests are too large: logged as failures.
            let size = if i % 97 == 0 { 2 << 30 } else { rng.below(1 << 20) };
            match log.allocate(Request::new(size).unwrap(), &stream) {
                Ok(b) => {
                    expected.push((Action::Allocate, b.addr(), size, stream.0));
                    live.push(b);
                }
                Err(e) => {
                    assert!(matches!(e, Error::OutOfMemory { .. }));
                    expected.push((Action::AllocateFailure, 0, size, stream.0));
                }
            }
        } else {
            let b = live.swap_remove(rng.below(live.len() as u64) as usize);
            log.deallocate(b, &stream).unwrap();
            expected.push((Action::Free, b.addr(), b.size(), stream.0));
        }
    }
    assert_eq!((log.write_errors(), log.refused_frees()), (0, 0));
    let (_, bytes) = log.into_parts();
    let text = String::from_utf8(bytes).unwrap();
    assert!(text.starts_with("Thread,Time,Action,Pointer,Size,Stream\n"));
    let rows = rows(text.as_bytes());
    assert_eq!(ops_of(&rows), expected);
    assert!(rows.iter().any(|r| r.action == Action::AllocateFailure));
    // One thread, monotonic time, and every row prints back as written.
    assert!(rows.iter().all(|r| r.thread == rows[0].thread));
    assert!(rows.windows(2).all(|w| w[0].time <= w[1].time));
    for (row, line) in rows.iter().zip(text.lines().skip(1)) {
        assert_eq!(row.to_string(), line);
    }
}

#[test]
fn rows_use_rmm_format() {
    let log = Logging::new(BumpUpstream::new(1 << 30), Vec::new()).unwrap();
    let b = log.allocate(Request::new(16 << 20).unwrap(), &IdStream(7)).unwrap();
    let _ = log.allocate(Request::new(4 << 30).unwrap(), &IdStream(7));
    log.deallocate(b, &IdStream(7)).unwrap();
    let (_, bytes) = log.into_parts();
    let text = String::from_utf8(bytes).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 4);
    let fields: Vec<&str> = lines[1].split(',').collect();
    assert_eq!(fields[2..], ["allocate", &format!("{:#x}", b.addr()), "16777216", "7"]);
    assert!(fields[3].starts_with("0x"));
    // Microseconds since the epoch: 16 digits in this century.
    assert_eq!(fields[1].len(), 16, "{}", fields[1]);
    assert!(lines[2].ends_with(",allocate failure,0x0,4294967296,7"), "{}", lines[2]);
    assert!(lines[3].contains(",free,"));
}

/// A writer whose bytes the test (and the upstream below) can read while
/// the adaptor holds it.
#[derive(Clone, Default)]
struct SharedBuf(std::sync::Arc<Mutex<Vec<u8>>>);

impl Write for SharedBuf {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl SharedBuf {
    fn last_line(&self) -> String {
        let text = String::from_utf8(self.0.lock().unwrap().clone()).unwrap();
        text.lines().last().unwrap_or_default().to_string()
    }
}

/// An upstream that, when asked to free, notes the log's last line (what
/// another thread reusing the address at once would log after), and can be
/// made to refuse frees.
struct Peek {
    inner: BumpUpstream,
    log: SharedBuf,
    seen: Mutex<Vec<String>>,
    refuse: std::sync::atomic::AtomicBool,
}

impl MemoryResource for Peek {
    fn allocate(&self, request: Request, s: &()) -> Result<Block> {
        self.inner.allocate(request, s)
    }
    fn deallocate(&self, block: Block, s: &()) -> Result<()> {
        self.seen.lock().unwrap().push(self.log.last_line());
        if self.refuse.load(Ordering::Relaxed) {
            return Err(Error::Backend { code: 1, what: "free refused" });
        }
        self.inner.deallocate(block, s)
    }
}

/// RMM's order: the free's row is written before the upstream frees the
/// block, so no reuse of the address by another thread can be logged
/// before it. A free the upstream refuses stays logged, and is counted.
#[test]
fn a_free_is_logged_before_the_upstream_frees_it() {
    let buf = SharedBuf::default();
    let peek = Peek {
        inner: BumpUpstream::new(1 << 30),
        log: buf.clone(),
        seen: Mutex::default(),
        refuse: Default::default(),
    };
    let log = Logging::new(peek, buf.clone()).unwrap();
    let a = log.allocate(Request::new(1000).unwrap(), &()).unwrap();
    log.deallocate(a, &()).unwrap();
    let free_row = |b: &Block| format!(",free,{:#x},{},0", b.addr(), b.size());
    let seen = log.upstream().seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1);
    assert!(seen[0].ends_with(&free_row(&a)), "the upstream freed after the row {:?}", seen[0]);

    let b = log.allocate(Request::new(2000).unwrap(), &()).unwrap();
    log.upstream().refuse.store(true, Ordering::Relaxed);
    assert_eq!(log.deallocate(b, &()), Err(Error::Backend { code: 1, what: "free refused" }));
    assert_eq!((log.refused_frees(), log.write_errors()), (1, 0));
    assert!(buf.last_line().ends_with(&free_row(&b)), "{}", buf.last_line());
    log.upstream().refuse.store(false, Ordering::Relaxed);
    log.deallocate(b, &()).unwrap();
    assert_eq!(log.refused_frees(), 1);
    let rows = read_all(&buf.0.lock().unwrap()[..]).unwrap();
    let actions: Vec<Action> = rows.iter().map(|r| r.action).collect();
    use Action::{Allocate, Free};
    assert_eq!(actions, [Allocate, Free, Allocate, Free, Free]);
}

#[test]
fn threads_get_distinct_small_numbers() {
    let log = Logging::new(BumpUpstream::new(1 << 30), Vec::new()).unwrap();
    std::thread::scope(|s| {
        for t in 0..3u64 {
            let log = &log;
            s.spawn(move || {
                for _ in 0..crate::testing::steps(50) {
                    let b = log.allocate(Request::new(256).unwrap(), &IdStream(t)).unwrap();
                    log.deallocate(b, &IdStream(t)).unwrap();
                }
            });
        }
    });
    let rows = rows(&log.into_parts().1[..]);
    assert_eq!(rows.len(), 6 * crate::testing::steps(50));
    let mut thread_of: HashMap<u64, u64> = HashMap::new();
    for r in &rows {
        assert_eq!(*thread_of.entry(r.stream).or_insert(r.thread), r.thread);
    }
    assert_eq!(thread_of.values().collect::<HashSet<_>>().len(), 3);
    assert!(rows.windows(2).all(|w| w[0].time <= w[1].time));
}

#[test]
fn file_errors_at_construction_and_file_round_trip() {
    let err = Logging::to_file(BumpUpstream::new(1 << 20), "/nonexistent-dir/x/log.csv").unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::NotFound);
    let path = std::env::temp_dir().join(format!("memres-log-test-{}.csv", std::process::id()));
    {
        let log = Logging::to_file(BumpUpstream::new(1 << 20), &path).unwrap();
        // The header is on disk before any allocation.
        assert_eq!(std::fs::read_to_string(&path).unwrap(), format!("{HEADER}\n"));
        let b = log.allocate(Request::new(300).unwrap(), &()).unwrap();
        log.deallocate(b, &()).unwrap();
    }
    let rows = rows(&std::fs::read(&path).unwrap());
    std::fs::remove_file(&path).unwrap();
    assert_eq!(
        rows.iter().map(|r| (r.action, r.size, r.stream)).collect::<Vec<_>>(),
        [(Action::Allocate, 300, 0), (Action::Free, 300, 0)]
    );
}

/// A log appended to continues the rows it holds, under its one header;
/// a missing or empty file gets the header first.
#[test]
fn appending_continues_a_log_under_one_header() {
    let err = Logging::append_to_file(BumpUpstream::new(1 << 20), "/nonexistent-dir/x/log.csv").unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::NotFound);
    let path = std::env::temp_dir().join(format!("memres-log-append-{}.csv", std::process::id()));
    let _ = std::fs::remove_file(&path);
    for (size, fresh) in [(300, false), (500, false), (700, true)] {
        let log = if fresh {
            Logging::to_file(BumpUpstream::new(1 << 20), &path).unwrap()
        } else {
            Logging::append_to_file(BumpUpstream::new(1 << 20), &path).unwrap()
        };
        let b = log.allocate(Request::new(size).unwrap(), &()).unwrap();
        log.deallocate(b, &()).unwrap();
        drop(log);
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().filter(|l| *l == HEADER).count(), 1, "{text}");
        assert!(text.starts_with(HEADER), "{text}");
        let sizes: Vec<u64> = rows(text.as_bytes()).iter().map(|r| r.size).collect();
        let expected: &[u64] = match size {
            300 => &[300, 300],
            500 => &[300, 300, 500, 500],
            _ => &[700, 700],
        };
        assert_eq!(sizes, expected, "to_file starts anew, append_to_file continues");
    }
    std::fs::write(&path, "").unwrap();
    drop(Logging::append_to_file(BumpUpstream::new(1 << 20), &path).unwrap());
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        format!("{HEADER}\n"),
        "an empty file gets the header"
    );
    std::fs::remove_file(&path).unwrap();
}

#[test]
fn write_errors_are_counted_not_returned_and_the_next_flush_says_so() {
    struct Broken(bool);
    impl Write for Broken {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            if self.0 {
                Err(io::Error::other("disk full"))
            } else {
                Ok(buf.len())
            }
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }
    let log = Logging::new(BumpUpstream::new(1 << 20), Broken(false)).unwrap();
    log.out.lock().unwrap().0 = true;
    let b = log.allocate(Request::new(10).unwrap(), &()).unwrap();
    log.deallocate(b, &()).unwrap();
    assert_eq!(log.write_errors(), 2);
    // The next flush says so, once, though the writer works again.
    log.out.lock().unwrap().0 = false;
    let e = log.flush().unwrap_err();
    assert!(e.to_string().contains("2 rows"), "{e}");
    log.flush().unwrap();
    assert_eq!(log.write_errors(), 2);
    assert!(Logging::new(BumpUpstream::new(1 << 20), Broken(true)).is_err());
}

/// A writer that panics with `.1` on a row of one action (`.0`).
struct PanicsOnRow(&'static [u8], &'static str);

/// A writer that panics on the row of an allocation.
const PANICS_ON_ALLOCATE: PanicsOnRow = PanicsOnRow(b"allocate", "the writer panics");
/// A writer that panics on the row of a free.
const PANICS_ON_FREE: PanicsOnRow = PanicsOnRow(b"free", "the writer panics on a free");

impl std::io::Write for PanicsOnRow {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        if bytes.windows(self.0.len()).any(|w| w == self.0) {
            std::panic::panic_any(self.1);
        }
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The block of an allocation whose row the writer panicked on goes back
/// upstream: the caller never got it, and nobody else would free it.
#[test]
fn a_writer_that_panics_on_an_allocation_loses_no_block() {
    use crate::Inspect;
    let up = BumpUpstream::new(1 << 30);
    let log = Logging::new(&up, PANICS_ON_ALLOCATE).unwrap();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        log.allocate(Request::new(1 << 20).unwrap(), &())
    }));
    assert!(r.is_err());
    assert_eq!(up.usage().held, 0);
}

/// The block of a free whose row the writer panicked on still goes back
/// upstream: the caller gave it up, and nobody else would free it. The
/// panic goes on to the caller and the row is counted lost. Before, the
/// call left at the panic with the block held upstream for good.
#[test]
fn a_writer_that_panics_on_a_free_still_frees_the_block() {
    use crate::Inspect;
    let up = BumpUpstream::new(1 << 30);
    let log = Logging::new(&up, PANICS_ON_FREE).unwrap();
    let b = log.allocate(Request::new(1 << 20).unwrap(), &()).unwrap();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| log.deallocate(b, &())));
    let payload = r.unwrap_err();
    let message = payload.downcast_ref::<&str>().copied().unwrap_or("");
    assert!(message.contains("the writer panics on a free"), "{message:?}");
    assert_eq!(up.usage().held, 0);
    assert_eq!((log.write_errors(), log.refused_frees()), (1, 0));
}

/// A pool over a log whose writer panics on a chunk's free: the chunk went
/// back upstream all the same, so the pool must not carve it again. (Before,
/// the pool took a chunk out of its table only once its upstream's free
/// returned: the chunk stayed, wholly free, and the next block came from
/// memory the upstream held no more.)
#[test]
fn a_pool_over_a_log_whose_writer_panics_on_a_chunks_free_carves_it_no_more() {
    use crate::pool::CoalescingPool;
    use crate::{Inspect, MemoryResourceMut};
    let up = BumpUpstream::new(1 << 30);
    let mut pool = CoalescingPool::new(Logging::new(&up, PANICS_ON_FREE).unwrap());
    let a = pool.allocate(Request::new(1 << 20).unwrap(), &()).unwrap();
    let chunk = pool.chunk_ranges().next().unwrap();
    pool.deallocate(a, &()).unwrap();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| pool.release(&())));
    assert!(r.is_err());
    assert_eq!((up.usage().held, pool.usage().held), (0, 0));
    pool.check().unwrap();
    let b = pool.allocate(Request::new(1 << 20).unwrap(), &()).unwrap();
    assert!(!chunk.contains(b.addr()), "{b:?} carved from {chunk:?}, given back");
    assert_eq!(up.usage().held, pool.usage().held);
}

/// A free whose stream's `id` panics (no row can be made) still frees the
/// block, and its row is counted lost; the log goes on.
#[test]
fn a_free_whose_streams_id_panics_still_frees_the_block() {
    use crate::testing::PanickingStream;
    use crate::Inspect;
    let up = BumpUpstream::new(1 << 30);
    let log = Logging::new(&up, Vec::new()).unwrap();
    let stream = PanickingStream::new(5);
    let b = log.allocate(Request::new(1 << 20).unwrap(), &stream).unwrap();
    stream.panic_in("id", 0);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| log.deallocate(b, &stream)));
    assert!(r.is_err());
    assert_eq!(up.usage().held, 0);
    assert_eq!(log.write_errors(), 1);
    let err = log.flush().unwrap_err();
    assert!(err.to_string().starts_with("1 rows"), "{err}");
    let c = log.allocate(Request::new(2000).unwrap(), &stream).unwrap();
    log.deallocate(c, &stream).unwrap();
    let rows = rows(&log.into_parts().1);
    assert_eq!(
        rows.iter().map(|r| (r.action, r.size, r.stream)).collect::<Vec<_>>(),
        [(Action::Allocate, 1 << 20, 5), (Action::Allocate, 2000, 5), (Action::Free, 2000, 5)]
    );
}

/// An upstream whose frees panic.
struct PanicsOnFree(BumpUpstream);

impl MemoryResource<()> for PanicsOnFree {
    fn allocate(&self, request: Request, stream: &()) -> crate::Result<Block> {
        self.0.allocate(request, stream)
    }
    fn deallocate(&self, _: Block, _: &()) -> crate::Result<()> {
        panic!("the upstream's free panics")
    }
}

/// When the writer panics on an allocation's row and the upstream's free of
/// the block panics too, the second panic is caught (in a destructor while
/// unwinding it would abort the process): the caller sees the writer's.
#[test]
fn a_writer_and_an_upstream_free_that_both_panic_do_not_abort() {
    let log = Logging::new(PanicsOnFree(BumpUpstream::new(1 << 30)), PANICS_ON_ALLOCATE).unwrap();
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        log.allocate(Request::new(1 << 20).unwrap(), &())
    }));
    let payload = r.unwrap_err();
    let message = payload.downcast_ref::<&str>().copied().unwrap_or("");
    assert!(message.contains("the writer panics"), "{message:?}");
}

/// Two logs of one file (the same stack text built for two devices) cut
/// each other's rows and wrote over them at their own offsets: the second
/// is refused while the first lives, and the file keeps the first's rows.
#[test]
fn a_second_log_to_the_file_of_a_live_one_is_refused_and_leaves_it_whole() {
    let path = std::env::temp_dir().join(format!("memres-log-claim-{}.csv", std::process::id()));
    let first = Logging::to_file(BumpUpstream::new(1 << 20), &path).unwrap();
    let b = first.allocate(Request::new(300).unwrap(), &()).unwrap();
    first.flush().unwrap();
    // Named another way, it is the same file.
    let other_name = path.parent().unwrap().join(".").join(path.file_name().unwrap());
    let err = Logging::to_file(BumpUpstream::new(1 << 20), &other_name).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::AlreadyExists);
    assert!(err.to_string().contains("memres-log-claim-"), "{err}");
    first.deallocate(b, &()).unwrap();
    drop(first);
    let logged = rows(&std::fs::read(&path).unwrap());
    assert_eq!(
        logged.iter().map(|r| (r.action, r.size)).collect::<Vec<_>>(),
        [(Action::Allocate, 300), (Action::Free, 300)]
    );
    // Once the first is gone, the file may be logged to again, from empty.
    let again = Logging::to_file(BumpUpstream::new(1 << 20), &path).unwrap();
    assert_eq!(std::fs::read_to_string(&path).unwrap(), format!("{HEADER}\n"));
    drop(again);
    // A device has no rows to cut: any number of logs may write to it.
    let nulls: Vec<_> =
        (0..2).map(|_| Logging::to_file(BumpUpstream::new(1 << 20), "/dev/null").unwrap()).collect();
    drop(nulls);
    std::fs::remove_file(&path).unwrap();
}

/// An upstream whose frees panic.
#[derive(Debug)]
struct PanickingFree(BumpUpstream);

impl MemoryResource for PanickingFree {
    fn allocate(&self, request: Request, s: &()) -> crate::Result<Block> {
        self.0.allocate(request, s)
    }
    fn deallocate(&self, _: Block, _: &()) -> crate::Result<()> {
        panic!("the upstream's free panics")
    }
}

#[test]
fn a_free_whose_upstream_panics_is_counted_refused() {
    let log = Logging::new(PanickingFree(BumpUpstream::new(1 << 20)), Vec::new()).unwrap();
    let b = log.allocate(Request::new(1000).unwrap(), &()).unwrap();
    let freed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| log.deallocate(b, &())));
    assert!(freed.is_err());
    // Its row is in the log: counted, as a free the upstream refused.
    assert_eq!(log.refused_frees(), 1);
}

/// A writer that allocates through the log it writes for, once it is set.
struct Reentering<'a> {
    /// Weak: the log owns its writer.
    log: &'a std::sync::OnceLock<alloc::sync::Weak<dyn MemoryResource<()> + Send + Sync + 'a>>,
    out: &'a std::sync::Mutex<Vec<u8>>,
    /// Calls of `write` that allocated through the log.
    writes: &'a std::sync::atomic::AtomicU64,
}

impl std::io::Write for Reentering<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if let Some(log) = self.log.get().and_then(alloc::sync::Weak::upgrade) {
            let b = log.allocate(Request::new(256).unwrap(), &()).unwrap();
            log.deallocate(b, &()).unwrap();
            self.writes.fetch_add(1, Ordering::Relaxed);
        }
        self.out.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn a_writer_that_allocates_through_its_log_has_those_rows_counted_lost_not_a_deadlock() {
    let (me, out) = (std::sync::OnceLock::new(), std::sync::Mutex::new(Vec::new()));
    let writes = std::sync::atomic::AtomicU64::new(0);
    let log = alloc::sync::Arc::new(
        Logging::new(BumpUpstream::new(1 << 20), Reentering { log: &me, out: &out, writes: &writes })
            .unwrap(),
    );
    me.set(alloc::sync::Arc::downgrade(&log) as alloc::sync::Weak<dyn MemoryResource<()> + Send + Sync>)
        .ok()
        .unwrap();
    // Before, the writer's allocation waited for the lock its own row held.
    let b = log.allocate(Request::new(1000).unwrap(), &()).unwrap();
    log.deallocate(b, &()).unwrap();
    // Two rows written; each call of the writer lost its own two rows.
    assert!(log.flush().is_err(), "the lost rows are said");
    assert_eq!(crate::Inspect::usage(log.upstream()).held, 0);
    let (lost, writes) = (log.write_errors(), writes.load(Ordering::Relaxed));
    assert!(writes >= 2 && lost == 2 * writes, "{lost} rows lost in {writes} writes");
    let rows = read_all(&out.lock().unwrap()[..]).unwrap();
    assert_eq!(rows.iter().map(|r| r.size).collect::<Vec<_>>(), [1000, 1000]);
}

/// A failure callback over a log, holding it by value (at the callback's
/// own address), that frees cached blocks through the stack, as RMM's
/// free-on-out-of-memory callbacks do: the frees are logged. Before, the
/// log took its row for the callback's own code back into the adaptor at
/// that address, counted it lost, and the next `flush` failed.
#[test]
fn frees_from_a_failure_callback_over_the_log_are_logged() {
    use crate::adaptor::FailureCallback;
    use std::sync::{Mutex, OnceLock, Weak};
    type Stack = FailureCallback<Logging<BumpUpstream, Vec<u8>>, Arc<Cache>, fn(u64, &Arc<Cache>) -> bool>;
    #[derive(Default)]
    struct Cache {
        blocks: Mutex<Vec<Block>>,
        stack: OnceLock<Weak<Stack>>,
    }
    fn free_cached(_: u64, cache: &Arc<Cache>) -> bool {
        let stack = cache.stack.get().unwrap().upgrade().unwrap();
        let blocks = core::mem::take(&mut *cache.blocks.lock().unwrap());
        for &b in &blocks {
            stack.deallocate(b, &()).unwrap();
        }
        !blocks.is_empty()
    }
    use alloc::sync::Arc;
    let cache = Arc::new(Cache::default());
    let log = Logging::new(BumpUpstream::new(4096), Vec::new()).unwrap();
    let stack: Arc<Stack> = Arc::new(FailureCallback::new(log, cache.clone(), free_cached as fn(_, &_) -> _));
    assert_eq!(core::ptr::from_ref(&*stack).cast::<u8>(), core::ptr::from_ref(stack.upstream()).cast::<u8>());
    cache.stack.set(Arc::downgrade(&stack)).ok().unwrap();
    let a = stack.allocate(Request::new(4096).unwrap(), &()).unwrap();
    cache.blocks.lock().unwrap().push(a);
    // Out of memory: the callback frees `a` through the stack; the retry gets it.
    let b = stack.allocate(Request::new(4096).unwrap(), &()).unwrap();
    stack.deallocate(b, &()).unwrap();
    let log = stack.upstream();
    assert_eq!(log.write_errors(), 0);
    log.flush().unwrap();
    let actions: Vec<_> = read_all(&log.out.lock().unwrap()[..]).unwrap().iter().map(|r| r.action).collect();
    use Action::{Allocate, AllocateFailure, Free};
    assert_eq!(actions, [Allocate, AllocateFailure, Free, Allocate, Free]);
}

/// A log dropped while its thread unwinds, whose buffered writer panics
/// on the rows it still holds, flushes them in the drop: the panic is
/// caught there. Before, `BufWriter`'s own drop flushed, panicked a
/// second time, and the process aborted.
#[test]
fn a_log_dropped_while_unwinding_over_a_writer_that_panics_does_not_abort() {
    let r = std::panic::catch_unwind(|| {
        let log =
            Logging::new(BumpUpstream::new(1 << 20), std::io::BufWriter::new(PANICS_ON_ALLOCATE)).unwrap();
        // Buffered: written when the log is dropped, during the unwind.
        log.allocate(Request::new(256).unwrap(), &()).unwrap();
        panic!("another panic while the log lives");
    });
    let payload = r.unwrap_err();
    assert_eq!(payload.downcast_ref::<&str>(), Some(&"another panic while the log lives"));
}

/// Logs of one file by other means than two `to_file`s: a hard link names
/// the same file under another canonical path, and a log appending to a
/// file that a live `to_file` log writes (two builds of one `log(file=)`)
/// wrote over its rows at its own offset, or had its rows cut by a
/// `to_file` made after it. Now a file is known by its inode, every log
/// appends whole rows, and `to_file` is refused while any other log
/// writes the file.
#[test]
fn logs_of_one_file_by_a_link_or_by_appending_keep_every_row() {
    let dir = std::env::temp_dir();
    let path = dir.join(format!("memres-log-share-{}.csv", std::process::id()));
    // A Miri without a `linkat` shim makes no hard link: there the file's own
    // name stands in for the link's.
    let link = match cfg!(miri) {
        true => path.clone(),
        false => dir.join(format!("memres-log-share-{}-link.csv", std::process::id())),
    };
    if link != path {
        let _ = std::fs::remove_file(&link);
    }
    let first = Logging::to_file(BumpUpstream::new(1 << 20), &path).unwrap();
    if link != path {
        std::fs::hard_link(&path, &link).unwrap();
    }
    let by_link = Logging::to_file(BumpUpstream::new(1 << 20), &link).map(drop).unwrap_err();
    assert_eq!(by_link.kind(), io::ErrorKind::AlreadyExists);
    let a = first.allocate(Request::new(300).unwrap(), &()).unwrap();
    first.flush().unwrap();
    let second = Logging::append_to_file(BumpUpstream::new(1 << 20), &link).unwrap();
    let b = second.allocate(Request::new(500).unwrap(), &()).unwrap();
    second.flush().unwrap();
    first.deallocate(a, &()).unwrap();
    first.flush().unwrap();
    second.deallocate(b, &()).unwrap();
    drop(first);
    // The appending log lives on: the file is still not to be made new.
    let cut = Logging::to_file(BumpUpstream::new(1 << 20), &path).map(drop).unwrap_err();
    assert_eq!(cut.kind(), io::ErrorKind::AlreadyExists);
    drop(second);
    let logged = rows(&std::fs::read(&path).unwrap());
    let text = std::fs::read_to_string(&path).unwrap();
    assert_eq!(text.matches(HEADER).count(), 1, "{text}");
    assert_eq!(
        logged.iter().map(|r| (r.action, r.size)).collect::<Vec<_>>(),
        [(Action::Allocate, 300), (Action::Allocate, 500), (Action::Free, 300), (Action::Free, 500)]
    );
    if link != path {
        std::fs::remove_file(&link).unwrap();
    }
    std::fs::remove_file(&path).unwrap();
}

/// A row of the largest figures fits the buffer a row is made in.
#[test]
fn the_longest_row_fits_its_buffer() {
    let row = Record {
        thread: u64::MAX,
        time: u64::MAX,
        action: Action::AllocateFailure,
        pointer: u64::MAX,
        size: u64::MAX,
        stream: u64::MAX,
    };
    assert_eq!(format!("{row}\n").len(), ROW_BYTES);
}

/// A writer that panics while its flag is set.
struct PanicsWhile<'a>(&'a std::sync::atomic::AtomicBool, Vec<u8>);

impl std::io::Write for PanicsWhile<'_> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        assert!(!self.0.load(Ordering::Relaxed), "the writer panics");
        self.1.extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A row whose writer panics is lost: it was not counted, and the next
/// flush said the log lost nothing. It is counted as a row not written;
/// the log goes on (its lock, poisoned by the panic, is taken all the
/// same), and the flush after says so once.
#[test]
fn a_row_whose_writer_panics_is_counted_lost_and_the_log_goes_on() {
    let panics = std::sync::atomic::AtomicBool::new(false);
    let log = Logging::new(BumpUpstream::new(1 << 20), PanicsWhile(&panics, Vec::new())).unwrap();
    panics.store(true, Ordering::Relaxed);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        log.allocate(Request::new(1000).unwrap(), &())
    }));
    assert!(r.is_err());
    panics.store(false, Ordering::Relaxed);
    assert_eq!(log.write_errors(), 1);
    let b = log.allocate(Request::new(2000).unwrap(), &()).unwrap();
    log.deallocate(b, &()).unwrap();
    let err = log.flush().unwrap_err();
    assert!(err.to_string().starts_with("1 rows"), "{err}");
    log.flush().unwrap();
    let rows = rows(&log.into_parts().1 .1);
    assert_eq!(
        rows.iter().map(|r| (r.action, r.size)).collect::<Vec<_>>(),
        [(Action::Allocate, 2000), (Action::Free, 2000)]
    );
}

/// A regular file as [`try_regular`] sees it: its bytes, a cut refused
/// with `cut_error`, a write that writes half its bytes and then fails
/// with `write_error`; the steps it was asked, in order.
#[derive(Default)]
struct FakeFile {
    bytes: core::cell::RefCell<Vec<u8>>,
    cut_error: Option<io::ErrorKind>,
    write_error: Option<io::ErrorKind>,
    steps: core::cell::RefCell<Vec<&'static str>>,
}

impl FakeFile {
    fn holding(bytes: &[u8]) -> Self {
        FakeFile { bytes: core::cell::RefCell::new(bytes.to_vec()), ..FakeFile::default() }
    }
}

impl Trial for FakeFile {
    fn size(&self) -> io::Result<u64> {
        Ok(self.bytes.borrow().len() as u64)
    }

    fn cut(&self, len: u64) -> io::Result<()> {
        self.steps.borrow_mut().push("cut");
        if let Some(kind) = self.cut_error {
            return Err(kind.into());
        }
        self.bytes.borrow_mut().resize(len as usize, 0);
        Ok(())
    }

    fn write_log(&self, rows: &[u8]) -> io::Result<()> {
        self.steps.borrow_mut().push("write");
        let whole = [format!("{HEADER}\n").as_bytes(), rows].concat();
        let Some(kind) = self.write_error else {
            self.bytes.borrow_mut().extend_from_slice(&whole);
            return Ok(());
        };
        self.bytes.borrow_mut().extend_from_slice(&whole[..whole.len() / 2]);
        Err(kind.into())
    }
}

/// Removes the append-only attribute of a file when dropped.
struct AppendOnly<'a>(&'a std::path::Path);

impl Drop for AppendOnly<'_> {
    fn drop(&mut self) {
        drop(std::process::Command::new("chattr").arg("-a").arg(self.0).status());
    }
}

/// A log file that cannot be cut (append-only: its writes pass, its cuts
/// are refused) is refused by its trial write with nothing written, so
/// that a refused stack leaves it as it was. Before, the header and the
/// rows were written after what it held, and the cut back refused: they
/// stayed. Tried on a file that refuses cuts, and on a real append-only
/// file too where this machine can make one (`chattr +a`, which takes
/// root, or the capability, and a file system with the attribute; not
/// under Miri).
#[test]
fn a_log_file_that_cannot_be_cut_is_refused_with_nothing_written() {
    let file =
        FakeFile { cut_error: Some(io::ErrorKind::PermissionDenied), ..FakeFile::holding(b"old rows\n") };
    let e = try_regular(&file, b"0,1,allocate,0x100,256,0\n").unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
    assert_eq!(file.bytes.borrow().as_slice(), b"old rows\n");
    assert_eq!(*file.steps.borrow(), ["cut"]);

    // Miri runs no other process.
    if cfg!(miri) {
        return;
    }
    let path = std::env::temp_dir().join(format!("memres-log-append-only-{}.csv", std::process::id()));
    std::fs::write(&path, "old rows\n").unwrap();
    let made = std::process::Command::new("chattr").arg("+a").arg(&path).status().is_ok_and(|s| s.success());
    let append_only = AppendOnly(&path);
    if made {
        let mut file = LogFile::open(&path).unwrap();
        assert!(file.try_write(b"0,1,allocate,0x100,256,0\n").is_err());
        drop(file);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "old rows\n");
    }
    drop(append_only);
    std::fs::remove_file(&path).unwrap();
}

/// A regular file holding rows whose trial write is refused for want of
/// room (a full disk, a quota, the limit of file size) is cut back and
/// left to the start, which cuts it first: the rows it holds may be what
/// takes the room. Before, the trial refused it, and every stack over an
/// old log that had filled the disk. An empty file out of room, or a
/// write refused otherwise, still refuses.
#[test]
fn a_trial_write_out_of_room_over_old_rows_is_left_to_the_start() {
    let rows = b"0,1,allocate,0x100,256,0\n";
    for kind in [io::ErrorKind::StorageFull, io::ErrorKind::QuotaExceeded, io::ErrorKind::FileTooLarge] {
        let file = FakeFile { write_error: Some(kind), ..FakeFile::holding(b"old rows\n") };
        assert!(try_regular(&file, rows).is_ok(), "{kind:?}");
        assert_eq!(file.bytes.borrow().as_slice(), b"old rows\n", "{kind:?}");
        assert_eq!(*file.steps.borrow(), ["cut", "write", "cut"], "{kind:?}");
        let empty = FakeFile { write_error: Some(kind), ..FakeFile::holding(b"") };
        assert_eq!(try_regular(&empty, rows).unwrap_err().kind(), kind);
        assert!(empty.bytes.borrow().is_empty());
    }
    let file =
        FakeFile { write_error: Some(io::ErrorKind::PermissionDenied), ..FakeFile::holding(b"old rows\n") };
    assert_eq!(try_regular(&file, rows).unwrap_err().kind(), io::ErrorKind::PermissionDenied);
    assert_eq!(file.bytes.borrow().as_slice(), b"old rows\n");
}

/// `lock_flushed` writes the buffered rows out, and no row is written
/// while the log stays locked: what a fork handler needs, so that a child
/// inherits an empty buffer and a lock it can let go of.
#[test]
fn a_log_locked_flushed_writes_its_rows_out_and_no_row_until_let_go() {
    let log = Arc::new(Logging::new(BumpUpstream::new(1 << 30), BufWriter::new(Vec::new())).unwrap());
    log.allocate(Request::new(1000).unwrap(), &()).unwrap();
    let locked = Logging::lock_flushed(&log).expect("not inside the writer");
    assert_eq!(locked.writer().unwrap().buffer().len(), 0, "the row was left in the buffer");
    assert_eq!(rows(locked.writer().unwrap().get_ref()).len(), 1);
    let other = Arc::clone(&log);
    let row = move || assert!(other.allocate(Request::new(2000).unwrap(), &()).is_ok());
    assert!(crate::testing::waits_for(locked, row), "a row was logged while the log was locked");
    let log = Arc::try_unwrap(log).unwrap();
    let out = log.into_parts().1.into_inner().unwrap();
    assert_eq!(rows(&out).iter().map(|r| r.size).collect::<Vec<_>>(), [1000, 2000]);
}

/// The thread that holds a `LockedLog` (a fork handler, whose collector
/// may free a block logged here meanwhile) is served without its rows,
/// counted lost, and its flushes and locks refused: each waited for the
/// lock the thread held itself, for ever. Other threads' rows wait.
#[test]
fn the_thread_that_locks_a_log_is_served_and_its_rows_counted_lost() {
    let log = Arc::new(Logging::new(BumpUpstream::new(1 << 20), BufWriter::new(Vec::new())).unwrap());
    let (done, finished) = std::sync::mpsc::channel();
    let on_thread = Arc::clone(&log);
    let thread = std::thread::spawn(move || {
        let locked = Logging::lock_flushed(&on_thread).expect("not inside the writer");
        let b = on_thread.allocate(Request::new(256).unwrap(), &()).unwrap();
        on_thread.deallocate(b, &()).unwrap();
        let refused = (on_thread.flush().is_err(), Logging::lock_flushed(&on_thread).is_none());
        let other = Arc::clone(&on_thread);
        let waited = crate::testing::waits_for(locked, move || {
            other.allocate(Request::new(512).unwrap(), &()).unwrap();
        });
        let _ = done.send((refused, waited));
    });
    let (refused, waited) =
        finished.recv_timeout(std::time::Duration::from_secs(120)).expect("the thread hangs");
    thread.join().unwrap();
    assert_eq!(refused, (true, true), "a flush and a lock from the locking thread");
    assert!(waited, "another thread's row was logged while the log was locked");
    assert_eq!(log.write_errors(), 2, "the allocation's row and the free's");
    assert!(log.flush().is_err(), "the next flush says rows were lost");
    let log = Arc::try_unwrap(log).unwrap();
    let out = log.into_parts().1.into_inner().unwrap();
    assert_eq!(rows(&out).iter().map(|r| r.size).collect::<Vec<_>>(), [512], "logged once let go");
}

/// A log that holds its rows for a file not made yet (a stack's, during
/// its build) locks with no writer to show: `writer` answers `None` (it
/// panicked), and its rows stay held.
#[test]
fn a_log_holding_its_rows_locks_with_no_writer() {
    let log = Arc::new(Logging::held(BumpUpstream::new(1 << 20)));
    log.allocate(Request::new(64).unwrap(), &()).unwrap();
    let locked = Logging::lock_flushed(&log).expect("not inside the writer");
    assert!(locked.writer().is_none());
    drop(locked);
    assert_eq!(log.write_errors(), 0);
    assert!(log.out.lock().unwrap().held.as_ref().is_some_and(|h| !h.is_empty()), "the row is held still");
}

/// A flush that fails under `lock_flushed` is counted (the next flush says
/// so), and the log is locked all the same.
#[test]
fn a_failed_flush_of_a_log_locked_flushed_is_counted() {
    struct FailsFlush;
    impl Write for FailsFlush {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Err(io::Error::other("device gone"))
        }
    }
    let log = Arc::new(Logging::new(BumpUpstream::new(1 << 20), FailsFlush).unwrap());
    let locked = Logging::lock_flushed(&log).expect("not inside the writer");
    assert!(log.out.try_lock().is_err(), "the writer is not locked");
    drop(locked);
    assert_eq!(log.write_errors(), 1);
    assert!(log.flush().is_err());
}

/// Inside the log's own writer (which holds the lock), `lock_flushed`
/// answers `None` rather than wait for itself.
#[test]
fn a_log_cannot_be_locked_flushed_from_inside_its_own_writer() {
    use std::sync::Weak;
    #[derive(Default, Clone)]
    struct LocksItsLog(Arc<OnceLock<Weak<Logging<BumpUpstream, LocksItsLog>>>>, Arc<Mutex<Vec<bool>>>);
    impl Write for LocksItsLog {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            if let Some(log) = self.0.get().and_then(Weak::upgrade) {
                self.1.lock().unwrap().push(Logging::lock_flushed(&log).is_some());
            }
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }
    let writer = LocksItsLog::default();
    let log = Arc::new(Logging::new(BumpUpstream::new(1 << 20), writer.clone()).unwrap());
    writer.0.set(Arc::downgrade(&log)).unwrap();
    log.allocate(Request::new(64).unwrap(), &()).unwrap();
    assert_eq!(*writer.1.lock().unwrap(), [false]);
    // Outside the writer, it locks.
    assert!(Logging::lock_flushed(&log).is_some());
}
