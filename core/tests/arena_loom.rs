//! loom model of the superblock hand-off between arenas and the global
//! arena. Run with
//! `RUSTFLAGS="--cfg loom" cargo test -p memres-core --release --test arena_loom`.
//!
//! The tests' names start with `loom` so that one filter picks them and the
//! library's loom tests in a single run:
//! `RUSTFLAGS="--cfg loom" cargo test -p memres-core --features std --release --lib --test arena_loom loom`.
//!
//! Preemption bound: 3 (about 3 s in release; unbounded, the spin locks
//! and the growth path make too many interleavings).
#![cfg(loom)]

use loom::sync::Arc;
use memres_core::arena::{ArenaConfig, ArenaResource};
use memres_core::testing::{BumpUpstream, IdStream};
use memres_core::{Error, MemoryResource, Request, Result};

fn synchronize_all() -> Result<()> {
    Ok(())
}

fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    builder.preemption_bound = Some(3);
    // The model's own thread has a small stack, and an arena index carries
    // its bin heads inline: run everything on threads with room.
    let f = std::sync::Arc::new(f);
    builder.check(move || {
        let f = f.clone();
        spawn(move || f()).join().unwrap();
    });
}

fn spawn<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> loom::thread::JoinHandle<T> {
    loom::thread::Builder::new().stack_size(4 << 20).spawn(f).unwrap()
}

/// Two streams each take a superblock, use it and free it, while one of
/// them asks for a large block that needs all the memory back in the global
/// arena (and its chunks given back upstream, to be replaced by one chunk
/// large enough). Whatever the interleaving: each request is served or is a
/// clean out of memory, the invariants hold, and once the other stream is
/// done the large block can be had.
#[test]
fn loom_superblocks_return_to_the_global_arena_under_contention() {
    model(|| {
        let config = ArenaConfig::new()
            .superblock_size(1 << 20)
            .chunk_size(1 << 20)
            .large_threshold(256 << 10)
            .maximum_size(2 << 20)
            .max_arenas(2)
            .synchronize_all(synchronize_all);
        let arena = Arc::new(ArenaResource::with_config(BumpUpstream::new(1 << 30), config, &()).unwrap());
        let other = arena.clone();
        let t = spawn(move || {
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
        assert_eq!(arena.used_bytes(), 0);
    });
}

/// A block allocated on one stream and freed on another from another
/// thread goes back to its own arena, concurrently with that arena's own
/// allocations.
#[test]
fn loom_cross_thread_free_into_a_busy_arena() {
    model(|| {
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
        assert_eq!(arena.used_bytes(), 0);
        arena.check().unwrap();
    });
}
