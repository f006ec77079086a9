//! The arena's configurations that are refused, with nothing taken from
//! upstream.

extern crate std;

use super::tests::{req, small_config};
use super::*;
use crate::testing::{BumpUpstream, TestStream};
use crate::Inspect;

/// A maximum below one superblock: no small request could ever be served
/// (the case, #17: it was accepted, then every small request was
/// out of memory). `InvalidConfig`, with nothing taken from upstream; a
/// maximum of one superblock serves.
#[test]
fn a_maximum_below_one_superblock_is_refused() {
    let up = BumpUpstream::new(1 << 30);
    for c in [
        ArenaConfig::new().maximum_size(4 << 20),
        ArenaConfig::new().maximum_size(0),
        ArenaConfig::new().initial_size(1 << 20).maximum_size((8 << 20) - 256),
        small_config().superblock_size(2 << 20).initial_size(1 << 20).maximum_size(1 << 20),
    ] {
        let r = ArenaResource::with_config(&up, c, &());
        assert!(
            matches!(r, Err(Error::InvalidConfig { what: "maximum size below the superblock size" })),
            "{c:?}: {:?}",
            r.map(|_| ())
        );
        assert_eq!(up.usage().held, 0);
    }
    let arena = ArenaResource::with_config(&up, ArenaConfig::new().maximum_size(8 << 20), &()).unwrap();
    let b = arena.allocate(req(1000), &TestStream::new(1)).unwrap();
    arena.deallocate(b, &TestStream::new(1)).unwrap();
    arena.check().unwrap();
}

#[test]
fn invalid_configs_are_refused() {
    let up = || BumpUpstream::new(1 << 30);
    for c in [
        ArenaConfig::new().superblock_size(512 << 10),
        ArenaConfig::new().superblock_size((1 << 20) + 1),
        ArenaConfig::new().chunk_size(1 << 20),
        ArenaConfig::new().initial_size(8 << 20).maximum_size(4 << 20),
        ArenaConfig::new().large_threshold(16 << 20),
        ArenaConfig::new().max_arenas(0),
        ArenaConfig::new().max_arenas(256),
    ] {
        assert!(
            matches!(ArenaResource::with_config(up(), c, &()), Err(Error::InvalidConfig { .. })),
            "{c:?}"
        );
    }
}

/// A chunk size or an initial size above what a request may hold would make
/// every growth fail with `InvalidSize`: refused when the resource is made,
/// with nothing taken from upstream.
#[test]
fn configs_no_request_could_use_are_refused() {
    let up = BumpUpstream::new(u64::MAX);
    for c in [
        ArenaConfig::new().chunk_size(Request::MAX_SIZE + 256),
        ArenaConfig::new().chunk_size(!255),
        ArenaConfig::new().initial_size(Request::MAX_SIZE + 256),
    ] {
        let r = ArenaResource::with_config(&up, c, &());
        assert!(matches!(r, Err(Error::InvalidConfig { .. })), "{c:?}: {:?}", r.map(|_| ()));
        assert_eq!(up.usage().held, 0);
    }
    // The largest chunk a request can hold, in superblocks that do not
    // divide it: growth still asks for no more than a request may hold.
    let c = ArenaConfig::new().superblock_size(3 << 20).chunk_size(Request::MAX_SIZE);
    let arena = ArenaResource::with_config(&up, c, &()).unwrap();
    let b = arena.allocate(req(1000), &()).unwrap();
    arena.deallocate(b, &()).unwrap();
    arena.check().unwrap();
}

/// Without size classes a small block takes its size rounded up to 256, so
/// a threshold that rounds to at most a superblock fits one: it was refused
/// as if its jemalloc size class (here 1.25 MiB) had to fit.
#[test]
fn without_size_classes_the_threshold_need_only_round_into_a_superblock() {
    let up = BumpUpstream::new(1 << 30);
    let sb = (1 << 20) + 256;
    let c = small_config().superblock_size(sb).large_threshold(sb);
    let r = ArenaResource::with_config(&up, c, &());
    assert!(matches!(r, Err(Error::InvalidConfig { .. })), "{:?}", r.map(|_| ()));
    let arena = ArenaResource::with_config(&up, c.size_classes(false), &()).unwrap();
    let s = TestStream::new(1);
    let b = arena.allocate(req(sb), &s).unwrap();
    assert_eq!(arena.dump().arenas[0].used, sb, "served by the stream's arena");
    arena.deallocate(b, &s).unwrap();
    arena.check().unwrap();
}
