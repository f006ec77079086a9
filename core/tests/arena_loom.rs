//! loom models of the superblock hand-off between arenas and the global
//! arena, of an arena's slot changing hands, and of the per-thread arenas
//! of the default stream (a free from another thread, a thread's number and
//! arena handed on when it exits). Run with
//! `RUSTFLAGS="--cfg loom" cargo test -p memres-core --release --test arena_loom`.
//!
//! The tests' names start with `loom` so that one filter picks them and the
//! library's loom tests in a single run:
//! `RUSTFLAGS="--cfg loom" cargo test -p memres-core --features std --release --lib --test arena_loom loom`.
//!
//! Preemption bound: 2 or 3 (about 3 s in release; unbounded, the spin
//! locks and the growth path make too many interleavings), none for the
//! models of per-thread arenas, which have no growth to explore (every
//! interleaving in under a second).
#![cfg(loom)]

use loom::sync::Arc;
use memres_core::arena::{ArenaConfig, ArenaDump, ArenaResource, Owner};
use memres_core::testing::loom::{model, spawn};
use memres_core::testing::{BumpUpstream, IdStream, TestStream};
use memres_core::{Error, Inspect, MemoryResource, Request};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Two streams each take a superblock, use it and free it, while one of
/// them asks for a large block that needs all the memory back in the global
/// arena (and its chunks given back upstream, to be replaced by one chunk
/// large enough). Whatever the interleaving: each request is served or is a
/// clean out of memory, the invariants hold, and once the other stream is
/// done the large block can be had.
#[test]
fn loom_superblocks_return_to_the_global_arena_under_contention() {
    model(Some(3), || {
        let config = ArenaConfig::new()
            .superblock_size(1 << 20)
            .chunk_size(1 << 20)
            .large_threshold(256 << 10)
            .maximum_size(2 << 20)
            .max_arenas(2);
        let arena = Arc::new(ArenaResource::with_config(BumpUpstream::new(1 << 30), config, &()).unwrap());
        let other = arena.clone();
        let t = spawn(move || {
            // IdStream synchronizes the device: each stream may take back
            // the other's free superblocks.
            let s = IdStream(2);
            // Out of memory only while the other thread holds everything.
            match other.allocate(Request::new(1000).unwrap(), &s) {
                Ok(b) => other.deallocate(b, &s).unwrap(),
                Err(Error::OutOfMemory { .. }) => {}
                Err(e) => panic!("{e}"),
            }
        });
        let s = IdStream(1);
        let b = arena.allocate(Request::new(1000).unwrap(), &s).unwrap();
        arena.deallocate(b, &s).unwrap();
        let large = match arena.allocate(Request::new(2 << 20).unwrap(), &s) {
            Ok(x) => Some(x),
            Err(Error::OutOfMemory { .. }) => None,
            Err(e) => panic!("{e}"),
        };
        t.join().unwrap();
        arena.check().unwrap();
        let large = match large {
            Some(x) => x,
            None => arena.allocate(Request::new(2 << 20).unwrap(), &s).unwrap(),
        };
        arena.deallocate(large, &s).unwrap();
        arena.check().unwrap();
        assert_eq!(arena.usage().used, 0);
    });
}

/// A block allocated on one stream and freed on another from another
/// thread goes back to its own arena, concurrently with that arena's own
/// allocations.
#[test]
fn loom_cross_thread_free_into_a_busy_arena() {
    model(Some(3), || {
        let config = ArenaConfig::new().superblock_size(1 << 20).chunk_size(1 << 20).max_arenas(2);
        let arena = Arc::new(ArenaResource::with_config(BumpUpstream::new(1 << 30), config, &()).unwrap());
        let s1 = IdStream(1);
        let b = arena.allocate(Request::new(1000).unwrap(), &s1).unwrap();
        let other = arena.clone();
        let t = spawn(move || other.deallocate(b, &IdStream(2)).unwrap());
        let c = arena.allocate(Request::new(1000).unwrap(), &s1).unwrap();
        t.join().unwrap();
        arena.check().unwrap();
        arena.deallocate(c, &s1).unwrap();
        assert_eq!(arena.usage().used, 0);
        arena.check().unwrap();
    });
}

/// One slot, two streams: an arena's slot changes hands (taken from an
/// idle arena by the other stream, after a device synchronization) while
/// its former owner looks it up and allocates again. Whatever the
/// interleaving, each block comes from its own stream's arena (its free on
/// that stream needs no synchronization), a request is served or finds the
/// one slot held (`CapacityExhausted`), and the invariants hold.
#[test]
fn loom_an_idle_arena_changes_hands_under_its_former_owner() {
    // Two preemptions find the hand-off under a lookup (a missing owner
    // check fails here); three take several times longer.
    model(Some(2), || {
        // Room for both superblocks up front: no growth to explore.
        let config = ArenaConfig::new()
            .initial_size(2 << 20)
            .superblock_size(1 << 20)
            .chunk_size(1 << 20)
            .max_arenas(1);
        let arena = Arc::new(ArenaResource::with_config(BumpUpstream::new(1 << 30), config, &()).unwrap());
        let other = arena.clone();
        let t = spawn(move || use_once(&other, &TestStream::new(2).device_sync(true)));
        use_once(&arena, &TestStream::new(1).device_sync(true));
        use_once(&arena, &TestStream::new(1).device_sync(true));
        t.join().unwrap();
        arena.check().unwrap();
        assert_eq!(arena.usage().used, 0);
    });
}

/// Allocates and frees one small block on `s`, or finds the one slot held;
/// the free must not synchronize (the block came from `s`'s own arena).
fn use_once(arena: &ArenaResource<BumpUpstream>, s: &TestStream) {
    match arena.allocate(Request::new(1000).unwrap(), s) {
        Ok(b) => {
            let syncs = s.faults().syncs();
            arena.deallocate(b, s).unwrap();
            assert_eq!(s.faults().syncs(), syncs, "a block came from another stream's arena");
        }
        Err(Error::CapacityExhausted { capacity: 1 }) => {}
        Err(e) => panic!("{e}"),
    }
}

/// The idle sweep (at every superblock request here) takes the free
/// superblock of one stream's arena, unused since the last sweep, and its
/// slot, while its owner comes back and allocates in it. Whatever the
/// interleaving: the owner's block comes from its own arena, every request
/// is served (three superblocks fit), and the invariants hold.
#[test]
fn loom_an_idle_sweep_races_with_the_arena_owner() {
    model(Some(2), || {
        let config = ArenaConfig::new()
            .initial_size(3 << 20)
            .maximum_size(3 << 20)
            .superblock_size(1 << 20)
            .chunk_size(1 << 20)
            .max_arenas(2)
            .idle_after(1);
        let arena = Arc::new(ArenaResource::with_config(BumpUpstream::new(1 << 30), config, &()).unwrap());
        let s1 = TestStream::new(1).device_sync(true);
        // Stream 1's arena: one superblock, wholly free.
        use_once(&arena, &s1);
        let other = arena.clone();
        let t = spawn(move || {
            let s2 = TestStream::new(2).device_sync(true);
            // Each superblock request sweeps: the second (a block that
            // needs a superblock of its own) finds stream 1's arena idle
            // unless stream 1 used it meanwhile.
            let b = other.allocate(Request::new(1000).unwrap(), &s2).unwrap();
            let c = other.allocate(Request::new(1 << 20).unwrap(), &s2).unwrap();
            for x in [b, c] {
                other.deallocate(x, &s2).unwrap();
            }
        });
        use_once(&arena, &s1);
        t.join().unwrap();
        arena.check().unwrap();
        assert_eq!(arena.usage().used, 0);
    });
}

/// A release whose synchronization fails puts the superblocks it took out
/// back into their arena: meanwhile the arena, empty but for them, must not
/// change hands, or another stream would get memory whose frees its
/// stream has not run. So does the other stream's attempt to take them
/// (its stream cannot synchronize the device: they go back). Whatever the
/// interleaving, the other stream never gets a block in that superblock.
#[test]
fn loom_superblocks_in_transit_keep_their_arena() {
    use memres_core::testing::TestStream;
    model(Some(2), || {
        let config = ArenaConfig::new()
            .initial_size(2 << 20)
            .superblock_size(1 << 20)
            .chunk_size(1 << 20)
            .max_arenas(1);
        let arena = Arc::new(ArenaResource::with_config(BumpUpstream::new(1 << 30), config, &()).unwrap());
        let s1 = TestStream::new(1);
        let b1 = arena.allocate(Request::new(1000).unwrap(), &s1).unwrap();
        arena.deallocate(b1, &s1).unwrap();
        let other = arena.clone();
        let t = spawn(move || {
            let s2 = TestStream::new(2);
            let got = other.allocate(Request::new(1000).unwrap(), &s2);
            if let Ok(b) = got {
                other.deallocate(b, &s2).unwrap();
            }
            got
        });
        s1.faults().set_failing(true);
        // It fails, unless stream 2 had the superblock in transit then.
        let released = arena.release(&s1);
        assert!(released.is_err() || released == Ok(0), "{released:?}");
        match t.join().unwrap() {
            Ok(b2) => assert!(
                !(b1.addr()..b1.addr() + (1 << 20)).contains(&b2.addr()),
                "stream 2 got stream 1's superblock before stream 1 was synchronized"
            ),
            Err(e) => assert_eq!(e, Error::CapacityExhausted { capacity: 1 }),
        }
        arena.check().unwrap();
    });
}

/// An arena resource for two arenas of one 1 MiB superblock each, both
/// superblocks there from the start: no growth to explore.
fn two_arenas() -> Arc<ArenaResource<BumpUpstream>> {
    let config =
        ArenaConfig::new().initial_size(2 << 20).superblock_size(1 << 20).chunk_size(1 << 20).max_arenas(2);
    Arc::new(ArenaResource::with_config(BumpUpstream::new(1 << 30), config, &()).unwrap())
}

/// Two threads on the default stream (`()`), each with an arena of its own:
/// the second frees a block of the first's while the first allocates and
/// frees in that arena (a free from another thread into a busy arena), and
/// the first frees the second's block once the second is done.
/// Whatever the interleaving: the invariants hold, each thread's blocks come
/// from its own arena, the bytes in use are exact, and everything goes back.
#[test]
fn loom_a_thread_frees_into_another_threads_busy_arena() {
    model(None, || {
        let arena = two_arenas();
        // This thread is thread 1 on the default stream, the other thread 2.
        let a = arena.allocate(Request::new(1000).unwrap(), &()).unwrap();
        let other = arena.clone();
        let t = spawn(move || {
            let b = other.allocate(Request::new(1000).unwrap(), &()).unwrap();
            other.deallocate(a, &()).unwrap();
            b
        });
        let c = arena.allocate(Request::new(1000).unwrap(), &()).unwrap();
        arena.deallocate(c, &()).unwrap();
        let b = t.join().unwrap();
        arena.check().unwrap();
        assert_eq!(arena.usage().used, 1024);
        assert_eq!(arenas(&arena.dump()), [(Owner::Thread(1), 1, 0), (Owner::Thread(2), 1, 1024)]);
        // Into the arena of a thread that is done.
        arena.deallocate(b, &()).unwrap();
        arena.check().unwrap();
        assert_eq!(arena.usage().used, 0);
        assert_eq!(arena.release(&()), Ok(2 << 20));
        assert_eq!(
            (arena.usage().held, arena.upstream_with(|u| u.usage().held), arena.arena_count()),
            (0, 0, 0)
        );
    });
}

/// Each arena of `dump` as (owner, superblocks, bytes in use), by owner.
fn arenas(dump: &ArenaDump) -> Vec<(Owner, usize, u64)> {
    let mut arenas: Vec<_> = dump.arenas.iter().map(|a| (a.owner, a.superblocks, a.used)).collect();
    arenas.sort_by_key(|&(owner, ..)| match owner {
        Owner::Thread(n) => (0, n),
        Owner::Stream(s) => (1, s),
        Owner::Global => (2, 0),
    });
    arenas
}

/// Executions of the model below in which the new thread got the number of
/// the thread that exited, and in which it got a new one.
static HANDED_ON: AtomicUsize = AtomicUsize::new(0);
static NEW_NUMBER: AtomicUsize = AtomicUsize::new(0);

/// A thread on the default stream uses its arena and exits holding no
/// block; its arena keeps a wholly free superblock. A new thread takes the
/// exited thread's number, and with it its arena and that superblock
/// (rather than taking another superblock, leaving that one stranded).
/// loom's `join` may return before the exited thread's thread-locals are
/// destroyed (std's returns after), so in some interleavings the new thread
/// comes first and gets a new number: then it has an arena of its own, and
/// thread 1's keeps its superblock for the next thread. Whatever the
/// interleaving the invariants hold and the bytes in use are exact; both
/// cases occur.
#[test]
fn loom_a_new_thread_takes_the_number_and_arena_of_one_that_exited() {
    model(None, || {
        let arena = two_arenas();
        let first = arena.clone();
        let x = spawn(move || {
            let x = first.allocate(Request::new(1000).unwrap(), &()).unwrap();
            first.deallocate(x, &()).unwrap();
            x.addr()
        })
        .join()
        .unwrap();
        let second = arena.clone();
        let y = spawn(move || second.allocate(Request::new(1000).unwrap(), &()).unwrap()).join().unwrap();
        arena.check().unwrap();
        assert_eq!(arena.usage().used, 1024);
        let dump = arena.dump();
        if arenas(&dump) == [(Owner::Thread(1), 1, 1024)] {
            // Thread 1's arena, and its superblock: the block is where x was.
            assert_eq!((y.addr(), dump.global.superblocks), (x, 1));
            HANDED_ON.fetch_add(1, Ordering::Relaxed);
        } else {
            assert_eq!(arenas(&dump), [(Owner::Thread(1), 1, 0), (Owner::Thread(2), 1, 1024)]);
            NEW_NUMBER.fetch_add(1, Ordering::Relaxed);
        }
        arena.deallocate(y, &()).unwrap();
        arena.check().unwrap();
        assert_eq!(arena.usage().used, 0);
    });
    assert!(HANDED_ON.load(Ordering::Relaxed) > 0, "no execution handed thread 1's number on");
    assert!(NEW_NUMBER.load(Ordering::Relaxed) > 0, "no execution gave the new thread a new number");
}
