extern crate std;

use super::*;
use crate::check::LiveBlocks;
use crate::testing::{BumpUpstream, SplitMix64, TestStream, SYNC_FAILURE};
use crate::Inspect;
use core::sync::atomic::AtomicUsize;
use std::string::ToString;
use std::sync::Barrier;
use std::vec;
use std::vec::Vec;

pub(super) fn small_config() -> ArenaConfig {
    ArenaConfig::new().superblock_size(1 << 20).chunk_size(4 << 20).large_threshold(256 << 10).max_arenas(8)
}

pub(super) fn req(size: u64) -> Request {
    Request::new(size).unwrap()
}

/// Ten blocks of one size class, each followed by a `spacer`-byte block
/// that keeps it apart from the next: the first `long` bytes, the others
/// `short`. Freed in order, the first (the longest) ends last in its
/// class's free list, past the ranges the bounded class search looks at.
/// Answers the ten and the spacers.
fn ten_holes<R: MemoryResource<TestStream>>(
    r: &R,
    s: &TestStream,
    long: u64,
    short: u64,
    spacer: u64,
) -> (Vec<Block>, Vec<Block>) {
    let mut holes = Vec::new();
    let mut spacers = Vec::new();
    for k in 0..10 {
        holes.push(r.allocate(req(if k == 0 { long } else { short }), s).unwrap());
        spacers.push(r.allocate(req(spacer), s).unwrap());
    }
    (holes, spacers)
}

/// [`ten_holes`] of one small size class (the first `long` bytes, the
/// others 400 granules, kept apart by 256 bytes), then the thread's one
/// superblock of `superblock` bytes filled.
fn small_holes_in_a_full_superblock(
    arena: &ArenaResource<BumpUpstream>,
    s: &TestStream,
    long: u64,
    superblock: u64,
) -> (Vec<Block>, Vec<Block>) {
    let (holes, mut kept) = ten_holes(arena, s, long, 400 << 8, 256);
    while arena.usage().used < superblock {
        let rest = superblock - arena.usage().used;
        kept.push(arena.allocate(req(rest.min(128 << 10)), s).unwrap());
    }
    (holes, kept)
}

/// Frees `holes` in order, the longest first: it ends last in its class's
/// list, where the class search misses it. Answers its address.
fn free_holes<R: MemoryResource<TestStream>>(r: &R, s: &TestStream, holes: Vec<Block>) -> u64 {
    let at = holes[0].addr();
    for h in holes {
        r.deallocate(h, s).unwrap();
    }
    at
}

/// Frees `blocks`, then checks the arena and that nothing is used.
fn free_all(arena: &ArenaResource<BumpUpstream>, s: &TestStream, blocks: Vec<Block>) {
    for b in blocks {
        arena.deallocate(b, s).unwrap();
    }
    arena.check().unwrap();
    assert_eq!(arena.usage().used, 0);
}

#[test]
fn randomized_ops_on_several_streams_with_checker_every_step() {
    let streams = [TestStream::new(0), TestStream::new(1), TestStream::new(2), TestStream::new(0xdead_beef)];
    let config = small_config().maximum_size(48 << 20);
    let arena = ArenaResource::with_config(BumpUpstream::new(1 << 40), config, &()).unwrap();
    let mut rng = SplitMix64::new(42);
    let mut live = LiveBlocks::new();
    let mut blocks: Vec<(Block, usize)> = Vec::new();
    let (mut ooms, mut large, mut by_addr, mut cross) = (0, 0, 0, 0);
    for step in 0..crate::testing::steps(100_000) as u32 {
        let s = rng.below(streams.len() as u64) as usize;
        if blocks.is_empty() || rng.below(100) < 52 {
            let size = match rng.below(10) {
                0 => 0,
                1..=6 => 1 + rng.below(16 << 10),
                7 | 8 => 1 + rng.below(256 << 10),
                _ => (256 << 10) + rng.below(4 << 20),
            };
            let align = if rng.below(8) == 0 { 256 << rng.below(8) } else { 256 };
            let request = Request::aligned(size, align).unwrap();
            let used = arena.usage().used;
            match arena.allocate(request, &streams[s]) {
                Ok(b) => {
                    live.insert(b, request).unwrap_or_else(|v| panic!("step {step}: {v}"));
                    if !b.is_empty() {
                        large += (size > 256 << 10) as u32;
                        blocks.push((b, s));
                    }
                }
                Err(Error::OutOfMemory { requested, pool_size, max_size, .. }) => {
                    assert_eq!((requested, max_size), (size, Some(48 << 20)));
                    assert!(pool_size <= 48 << 20);
                    assert_eq!(arena.usage().used, used, "a failed allocation changed nothing");
                    ooms += 1;
                }
                Err(e) => panic!("step {step}: {e}"),
            }
        } else {
            let (b, from) = blocks.swap_remove(rng.below(blocks.len() as u64) as usize);
            let on = if rng.below(4) == 0 { rng.below(streams.len() as u64) as usize } else { from };
            cross += (streams[on].id() != streams[from].id()) as u32;
            let b = if rng.below(8) == 0 {
                by_addr += 1;
                Block::from_addr(b.addr(), b.size())
            } else {
                b
            };
            arena.deallocate(b, &streams[on]).unwrap_or_else(|e| panic!("step {step}: {e}"));
            live.remove(&b).unwrap();
        }
        arena.check().unwrap_or_else(|v| panic!("step {step}: {v}"));
    }
    // A full run takes every path often; a short one, under Miri, need not.
    assert!(
        ooms > 0 && large > 1000 && by_addr > 1000 && cross > 1000 || cfg!(miri),
        "{ooms} {large} {by_addr} {cross}"
    );
    assert_eq!(arena.arena_count(), 4);
    for (b, s) in blocks.drain(..) {
        arena.deallocate(b, &streams[s]).unwrap();
        live.remove(&b).unwrap();
    }
    assert_eq!(arena.usage().used, 0);
    // Each stream takes back its own arenas' superblocks.
    for s in &streams {
        arena.release(s).unwrap();
    }
    arena.check().unwrap();
    assert_eq!(arena.usage().held, 0);
    assert_eq!(arena.upstream_with(|u| u.usage().held), 0);
}

#[test]
fn threads_on_their_own_arenas_then_check() {
    let config = small_config().max_arenas(16);
    let arena = ArenaResource::with_config(BumpUpstream::new(1 << 40), config, &()).unwrap();
    let streams: Vec<TestStream> =
        vec![TestStream::new(0), TestStream::new(0), TestStream::new(5), TestStream::new(6)];
    let barrier = Barrier::new(streams.len());
    let leftovers: Vec<Vec<Block>> = std::thread::scope(|s| {
        let handles: Vec<_> = streams
            .iter()
            .enumerate()
            .map(|(t, stream)| {
                let arena = &arena;
                let barrier = &barrier;
                s.spawn(move || {
                    let mut rng = SplitMix64::new(t as u64);
                    let mut mine = Vec::new();
                    barrier.wait();
                    for _ in 0..crate::testing::steps(20_000) {
                        if mine.is_empty() || rng.below(2) == 0 {
                            let size = if rng.below(50) == 0 { 300 << 10 } else { 1 + rng.below(64 << 10) };
                            mine.push(arena.allocate(req(size), stream).unwrap());
                        } else {
                            let b = mine.swap_remove(rng.below(mine.len() as u64) as usize);
                            arena.deallocate(b, stream).unwrap();
                        }
                    }
                    // All threads live at once: each default-stream thread has its arena.
                    barrier.wait();
                    mine
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    arena.check().unwrap();
    // Two per-thread arenas for the default stream, one per other stream.
    let owners: Vec<Owner> = arena.dump().arenas.iter().map(|a| a.owner).collect();
    // Without `std` there is no thread identity: one arena for the default stream.
    let per_thread = if cfg!(feature = "std") { 2 } else { 1 };
    assert_eq!(owners.iter().filter(|o| matches!(o, Owner::Thread(_))).count(), per_thread, "{owners:?}");
    assert!(owners.contains(&Owner::Stream(5)) && owners.contains(&Owner::Stream(6)));
    // Free everything from this thread on the default stream: blocks go back
    // to the arenas they came from; other streams' blocks make it synchronize.
    let main = TestStream::new(0);
    let n: usize = leftovers.iter().map(Vec::len).sum();
    let from_streams: usize = leftovers[2].len() + leftovers[3].len();
    for b in leftovers.into_iter().flatten() {
        arena.deallocate(b, &main).unwrap();
    }
    assert!(n > 0);
    let syncs = main.faults().syncs();
    assert!(syncs >= from_streams as u64, "{syncs} < {from_streams}");
    arena.check().unwrap();
    assert_eq!(arena.usage().used, 0);
}

#[test]
fn a_block_goes_back_to_its_arena_and_cross_stream_frees_synchronize() {
    let arena = ArenaResource::with_config(BumpUpstream::new(1 << 30), small_config(), &()).unwrap();
    let (a, b) = (TestStream::new(1), TestStream::new(2));
    let x = arena.allocate(req(1000), &a).unwrap();
    let y = arena.allocate(req(1000), &b).unwrap();
    // Different arenas: different superblocks.
    assert!(x.addr().abs_diff(y.addr()) >= 1 << 20);
    arena.deallocate(x, &a).unwrap();
    assert_eq!(a.faults().syncs(), 0, "a free on the block's own stream needs no synchronization");
    arena.deallocate(y, &a).unwrap();
    assert_eq!(a.faults().syncs(), 1, "a free on another stream synchronizes it");
    // Stream 2's arena got its block back: it reuses the same address.
    let y2 = arena.allocate(req(1000), &b).unwrap();
    assert_eq!(y2.addr(), y.addr());
    let dump = arena.dump();
    let s2 = dump.arenas.iter().find(|s| s.owner == Owner::Stream(2)).unwrap();
    assert_eq!(s2.used, 1024);
    // Large blocks come from the global arena; their free synchronizes.
    let big = arena.allocate(req(2 << 20), &b).unwrap();
    assert_eq!(arena.dump().large_blocks, 1);
    arena.deallocate(big, &b).unwrap();
    assert_eq!(b.faults().syncs(), 1);
    arena.deallocate(y2, &b).unwrap();
    arena.check().unwrap();
}

#[test]
fn failed_synchronize_changes_nothing() {
    let arena = ArenaResource::with_config(BumpUpstream::new(1 << 30), small_config(), &()).unwrap();
    let (a, b) = (TestStream::new(1), TestStream::new(2));
    let x = arena.allocate(req(5000), &a).unwrap();
    let big = arena.allocate(req(3 << 20), &a).unwrap();
    b.faults().set_failing(true);
    assert_eq!(arena.deallocate(x, &b), Err(SYNC_FAILURE));
    assert_eq!(arena.deallocate(big, &b), Err(SYNC_FAILURE));
    assert_eq!((b.faults().syncs(), b.faults().failed_syncs()), (0, 2));
    assert_eq!(arena.usage().used, 5120 + (3 << 20));
    arena.check().unwrap();
    arena.deallocate(x, &a).unwrap();
    arena.deallocate(big, &a).unwrap();
    assert_eq!(arena.usage().used, 0);
}

#[test]
fn size_classes_and_thresholds() {
    let arena = ArenaResource::new(BumpUpstream::new(1 << 30));
    let s = TestStream::new(3);
    let a = arena.allocate(req(2049), &s).unwrap();
    assert_eq!(arena.usage().used, 2560);
    let b = arena.allocate(req(1 << 20), &s).unwrap();
    assert_eq!(arena.dump().large_blocks, 0, "1 MiB is still served by the arena, as in RMM");
    let c = arena.allocate(req((1 << 20) + 1), &s).unwrap();
    assert_eq!(arena.dump().large_blocks, 1);
    assert_eq!(arena.usage().used, 2560 + (1 << 20) + (1 << 20) + 256);
    // A small size with a large alignment that cannot fit a superblock goes global.
    let d = arena.allocate(Request::aligned(4096, 16 << 20).unwrap(), &s).unwrap();
    assert_eq!(d.addr() % (16 << 20), 0);
    assert_eq!(arena.dump().large_blocks, 2);
    for x in [a, b, c, d] {
        arena.deallocate(x, &s).unwrap();
    }
    arena.check().unwrap();
    let plain =
        ArenaResource::with_config(BumpUpstream::new(1 << 30), ArenaConfig::new().size_classes(false), &())
            .unwrap();
    let e = plain.allocate(req(2049), &s).unwrap();
    assert_eq!(plain.usage().used, 2304);
    plain.deallocate(e, &s).unwrap();
}

#[test]
fn double_free_foreign_block_and_size_mismatch() {
    let arena = ArenaResource::with_config(BumpUpstream::new(1 << 30), small_config(), &()).unwrap();
    let s = TestStream::new(0);
    let a = arena.allocate(req(1000), &s).unwrap();
    let keep = arena.allocate(req(1000), &s).unwrap();
    let big = arena.allocate(req(2 << 20), &s).unwrap();
    arena.deallocate(a, &s).unwrap();
    assert_eq!(arena.deallocate(a, &s), Err(Error::DoubleFree { addr: a.addr() }));
    assert_eq!(
        arena.deallocate(Block::from_addr(a.addr(), 1000), &s),
        Err(Error::DoubleFree { addr: a.addr() })
    );
    arena.deallocate(big, &s).unwrap();
    assert_eq!(arena.deallocate(big, &s), Err(Error::DoubleFree { addr: big.addr() }));
    // Foreign: an address no chunk holds, a forged tag naming an unused arena,
    // a forged "large" tag on a superblock's first address.
    assert_eq!(arena.deallocate(Block::from_addr(12, 1000), &s), Err(Error::UnknownBlock { addr: 12 }));
    let forged = Block::new(keep.addr() + 256, 256, 7 << SLOT_SHIFT);
    assert_eq!(arena.deallocate(forged, &s), Err(Error::UnknownBlock { addr: keep.addr() + 256 }));
    let first = arena.dump();
    let sb = Block::new(keep.addr(), 1 << 20, 0xff << SLOT_SHIFT);
    assert!(arena.deallocate(sb, &s).is_err());
    assert_eq!(arena.dump(), first);
    // Another size, of the same class too (an adaptor above counts off the
    // size a free states): the size asked for is expected.
    for given in [5000, u64::MAX, 1001, 1024] {
        assert_eq!(
            arena.deallocate(Block::new(keep.addr(), given, keep.tag()), &s),
            Err(Error::SizeMismatch { addr: keep.addr(), expected: keep.size(), given })
        );
    }
    arena.check().unwrap();
    assert_eq!(arena.usage().used, 1024);
    arena.deallocate(keep, &s).unwrap();
    assert_eq!(arena.usage().used, 0);
    arena.check().unwrap();
}

/// A free with a size above `Request::MAX_SIZE` is a wrong size like any
/// other: `SizeMismatch` for a live block, small or large, by tag or by
/// address; `DoubleFree` for a freed one; `UnknownBlock` for an address the
/// arena never handed out. It used to be `UnknownBlock` for every block
/// (found by the `arena` fuzz target).
#[test]
fn a_free_with_a_size_above_the_largest_request_is_a_wrong_size() {
    let arena = ArenaResource::with_config(BumpUpstream::new(1 << 30), small_config(), &()).unwrap();
    let (s, other) = (TestStream::new(1), TestStream::new(2));
    let small = arena.allocate(req(1000), &s).unwrap();
    let large = arena.allocate(req(2 << 20), &s).unwrap();
    let gone = arena.allocate(req(3000), &s).unwrap();
    arena.deallocate(gone, &s).unwrap();
    let before = arena.dump();
    for huge in [Request::MAX_SIZE + 1, u64::MAX - 1, u64::MAX] {
        for (b, expected) in [(small, 1000), (large, 2 << 20)] {
            for x in [Block::new(b.addr(), huge, b.tag()), Block::from_addr(b.addr(), huge)] {
                for on in [&s, &other] {
                    let want = Err(Error::SizeMismatch { addr: b.addr(), expected, given: huge });
                    assert_eq!(arena.deallocate(x, on), want, "{x:?}");
                }
            }
        }
        for x in [Block::new(gone.addr(), huge, gone.tag()), Block::from_addr(gone.addr(), huge)] {
            assert_eq!(arena.deallocate(x, &s), Err(Error::DoubleFree { addr: gone.addr() }));
        }
        assert_eq!(arena.deallocate(Block::from_addr(12, huge), &s), Err(Error::UnknownBlock { addr: 12 }));
    }
    assert_eq!(arena.dump(), before);
    arena.check().unwrap();
    for b in [small, large] {
        arena.deallocate(b, &s).unwrap();
    }
    assert_eq!(arena.usage().used, 0);
    arena.check().unwrap();
}

/// A valid request whose alignment takes the chunk it needs above
/// `Request::MAX_SIZE` is out of memory, with or without a maximum. It used
/// to be the upstream's `InvalidSize` for that chunk, a size the caller
/// never asked for (found by the `arena` fuzz target).
#[test]
fn a_request_whose_alignment_needs_more_than_the_largest_size_is_out_of_memory() {
    for config in [small_config(), small_config().maximum_size(64 << 20)] {
        let arena = ArenaResource::with_config(BumpUpstream::new(1 << 30), config, &()).unwrap();
        let s = TestStream::new(1);
        let keep = arena.allocate(req(1000), &s).unwrap();
        let held = arena.usage().held;
        for (size, align) in [(Request::MAX_SIZE, 1 << 20), (Request::MAX_SIZE - 4096, Request::MAX_ALIGN)] {
            let err = arena.allocate(Request::aligned(size, align).unwrap(), &s).unwrap_err();
            assert!(matches!(err, Error::OutOfMemory { requested, .. } if requested == size), "{err}");
        }
        assert_eq!((arena.usage().held, arena.usage().used), (held, 1024));
        arena.check().unwrap();
        let b = arena.allocate(Request::aligned(2 << 20, 4 << 20).unwrap(), &s).unwrap();
        for x in [b, keep] {
            arena.deallocate(x, &s).unwrap();
        }
        arena.check().unwrap();
    }
}

#[test]
fn zero_and_huge_sizes() {
    let arena = ArenaResource::new(BumpUpstream::new(1 << 30));
    let s = TestStream::new(4);
    assert_eq!(arena.allocate(req(0), &s), Ok(Block::EMPTY));
    assert_eq!(arena.deallocate(Block::EMPTY, &s), Ok(()));
    let err = arena.allocate(req(Request::MAX_SIZE), &s).unwrap_err();
    assert!(matches!(err, Error::OutOfMemory { requested, .. } if requested == Request::MAX_SIZE), "{err}");
    assert_eq!(arena.usage().held, 0);
    arena.check().unwrap();
    let b = arena.allocate(req(100), &s).unwrap();
    arena.deallocate(b, &s).unwrap();
}

#[test]
fn upstream_failure_while_growing_changes_nothing() {
    let config = small_config().initial_size(4 << 20);
    let arena = ArenaResource::with_config(BumpUpstream::new(1 << 30), config, &()).unwrap();
    let s = TestStream::new(0);
    let mut blocks = Vec::new();
    // Fill the first chunk (4 superblocks of 1 MiB, 4 blocks each).
    for _ in 0..16 {
        blocks.push(arena.allocate(req(200 << 10), &s).unwrap());
    }
    assert_eq!(arena.usage().held, 4 << 20);
    arena.upstream_with(|u| u.fail_after(0));
    let before = arena.dump();
    assert!(matches!(arena.allocate(req(200 << 10), &s), Err(Error::Backend { .. })));
    assert!(matches!(arena.allocate(req(3 << 20), &s), Err(Error::Backend { .. })));
    assert_eq!(arena.dump(), before);
    arena.check().unwrap();
    arena.upstream_with(|u| u.fail_after(u64::MAX));
    blocks.push(arena.allocate(req(200 << 10), &s).unwrap());
    assert_eq!(arena.usage().held, 8 << 20);
    for b in blocks {
        arena.deallocate(b, &s).unwrap();
    }
    arena.check().unwrap();
}

/// At its maximum the global arena gives its wholly free chunks back
/// before it grows; where the upstream refuses one and the growth then
/// fails, it takes back what did go back.
#[test]
fn a_failed_growth_at_the_maximum_takes_back_what_went_back_beside_a_refused_chunk() {
    const MIB: u64 = 1 << 20;
    let config = small_config().maximum_size(12 * MIB);
    let arena = ArenaResource::with_config(BumpUpstream::new(9 * MIB), config, &()).unwrap();
    let s = TestStream::new(0);
    // Two large blocks, a 4 MiB chunk each, then both wholly free.
    let a = arena.allocate(req(4 * MIB), &s).unwrap();
    let b = arena.allocate(req(4 * MIB), &s).unwrap();
    arena.deallocate(a, &s).unwrap();
    arena.deallocate(b, &s).unwrap();
    assert_eq!(arena.usage().held, 8 * MIB);
    // 6 MiB more passes the maximum: both chunks are offered back, `a`'s
    // is refused, and the 5 MiB left upstream cannot hold 6.
    arena.upstream_with(|u| u.refuse_free_at(a.addr()));
    let e = arena.allocate(req(6 * MIB), &s).unwrap_err();
    assert!(matches!(e, Error::Backend { code: -2, .. }), "{e:?}");
    arena.check().unwrap();
    assert_eq!((arena.usage().held, arena.upstream_with(|u| u.usage().held)), (8 * MIB, 8 * MIB));
    // Once the upstream takes `a`'s chunk back, 6 MiB fits.
    arena.upstream_with(|u| u.refuse_free_at(0));
    let c = arena.allocate(req(6 * MIB), &s).unwrap();
    arena.deallocate(c, &s).unwrap();
    arena.check().unwrap();
}

static DUMPS: AtomicUsize = AtomicUsize::new(0);
fn count_dump(d: &ArenaDump) {
    assert!(d.requested.is_some() && !d.arenas.is_empty());
    assert!(d.to_string().contains("out of memory"));
    DUMPS.fetch_add(1, Ordering::Relaxed);
}

#[test]
fn out_of_memory_with_figures_and_dump_then_usable_again() {
    let config = small_config().maximum_size(4 << 20).dump_on_failure(DumpTarget::Callback(count_dump));
    let arena = ArenaResource::with_config(BumpUpstream::new(1 << 30), config, &()).unwrap();
    let s = TestStream::new(0);
    let mut blocks = Vec::new();
    for _ in 0..16 {
        blocks.push(arena.allocate(req(200 << 10), &s).unwrap());
    }
    let err = arena.allocate(req(200 << 10), &s).unwrap_err();
    assert_eq!(
        err,
        Error::OutOfMemory {
            requested: 200 << 10,
            largest_free: 128 << 10,
            pool_size: 4 << 20,
            max_size: Some(4 << 20)
        }
    );
    assert_eq!(DUMPS.load(Ordering::Relaxed), 1);
    let dump = arena.dump();
    assert_eq!(dump.arenas[0].superblocks, 4);
    // 224 KiB classes: 4 superblocks, each with a 128 KiB tail: fragmentation 1 - 128/512.
    assert!((dump.arenas[0].fragmentation() - 0.75).abs() < 1e-9);
    arena.check().unwrap();
    for b in blocks.drain(..8) {
        arena.deallocate(b, &s).unwrap();
    }
    // Two superblocks are wholly free again: a 2 MiB large block needs them
    // back in the global arena, coalesced.
    let big = arena.allocate(req(2 << 20), &s).unwrap();
    assert_eq!(arena.dump().arenas[0].superblocks, 2);
    arena.check().unwrap();
    arena.deallocate(big, &s).unwrap();
    for b in blocks {
        arena.deallocate(b, &s).unwrap();
    }
    assert_eq!(arena.usage().used, 0);
    arena.check().unwrap();
}

#[test]
fn default_stream_threads_take_back_each_others_free_superblocks() {
    let config = small_config().maximum_size(4 << 20);
    let arena = ArenaResource::with_config(BumpUpstream::new(1 << 30), config, &()).unwrap();
    // A thread fills everything on the default stream, then frees it: its
    // arena keeps the superblocks.
    std::thread::scope(|sc| {
        sc.spawn(|| {
            let blocks: Vec<Block> = (0..16).map(|_| arena.allocate(req(200 << 10), &()).unwrap()).collect();
            for b in blocks {
                arena.deallocate(b, &()).unwrap();
            }
        });
    });
    assert_eq!(arena.dump().arenas[0].free_superblocks, 4);
    // Another thread (this one) can still allocate: the free superblocks come back.
    let b = arena.allocate(req(3 << 20), &()).unwrap();
    arena.check().unwrap();
    arena.deallocate(b, &()).unwrap();
}

/// The case (#17): one stream's arena holds every superblock the
/// maximum allows, all free; another stream's request used to be out of
/// memory. It is served once the device is synchronized (RMM's last resort
/// too); a stream that cannot synchronize the device still cannot take
/// them, and gets out of memory with figures.
#[test]
fn other_streams_free_superblocks_serve_after_a_device_synchronization() {
    for device in [false, true] {
        let config = small_config().maximum_size(2 << 20);
        let arena = ArenaResource::with_config(BumpUpstream::new(1 << 30), config, &()).unwrap();
        let (a, b) = (TestStream::new(1).device_sync(device), TestStream::new(2).device_sync(device));
        let blocks: Vec<Block> = (0..8).map(|_| arena.allocate(req(200 << 10), &a).unwrap()).collect();
        for x in blocks {
            arena.deallocate(x, &a).unwrap();
        }
        let r = arena.allocate(req(1000), &b);
        arena.check().unwrap();
        match r {
            Ok(x) => {
                assert!(device);
                assert_eq!((b.faults().device_syncs(), b.faults().syncs()), (1, 1));
                assert_eq!(arena.dump().arenas.iter().map(|s| s.superblocks).sum::<usize>(), 1);
                arena.deallocate(x, &b).unwrap();
            }
            Err(e) => {
                assert!(!device, "{e}");
                let want = Error::OutOfMemory {
                    requested: 1000,
                    largest_free: 256 << 10,
                    pool_size: 2 << 20,
                    max_size: Some(2 << 20),
                };
                assert_eq!(e, want);
                // Nothing moved: stream 1's arena keeps its superblocks.
                let dump = arena.dump();
                let of_a = dump.arenas.iter().find(|s| s.owner == Owner::Stream(1)).unwrap();
                assert_eq!(of_a.free_superblocks, 2);
            }
        }
        // Stream 1 takes back its own superblocks (and, with the device
        // synchronized, stream 2's).
        let big = arena.allocate(req(2 << 20), &a).unwrap();
        arena.deallocate(big, &a).unwrap();
        arena.check().unwrap();
    }
}

/// Out of memory names the largest block the arena could hand out, as its
/// usage does: an arena's free range counts only up to the large threshold
/// (a larger request goes to the global arena). A wholly free superblock
/// that another stream's arena keeps was named whole: 1 MiB, for a request
/// of 512 KiB that no arena could ever serve.
#[test]
fn out_of_memory_names_no_free_range_longer_than_a_block_it_could_hand_out() {
    let config = small_config().maximum_size(2 << 20);
    let arena = ArenaResource::with_config(BumpUpstream::new(1 << 30), config, &()).unwrap();
    let (a, b) = (TestStream::new(1), TestStream::new(2));
    let blocks: Vec<Block> = (0..8).map(|_| arena.allocate(req(200 << 10), &a).unwrap()).collect();
    for x in blocks {
        arena.deallocate(x, &a).unwrap();
    }
    // Stream 2 cannot synchronize the device: stream 1's arena keeps both.
    for size in [1000, 512 << 10] {
        let err = arena.allocate(req(size), &b).unwrap_err();
        let want = Error::OutOfMemory {
            requested: size,
            largest_free: 256 << 10,
            pool_size: 2 << 20,
            max_size: Some(2 << 20),
        };
        assert_eq!(err, want);
        assert_eq!(arena.usage().largest_free, 256 << 10);
    }
    arena.check().unwrap();
}

/// A failed device synchronization while running dry fails the request
/// with the stream's error and leaves the superblocks where they were.
#[test]
fn a_failed_device_synchronization_changes_nothing() {
    let config = small_config().maximum_size(2 << 20);
    let arena = ArenaResource::with_config(BumpUpstream::new(1 << 30), config, &()).unwrap();
    let (a, b) = (TestStream::new(1), TestStream::new(2).device_sync(true));
    // Two superblocks of four blocks each; the first one wholly free again.
    let mut blocks: Vec<Block> = (0..8).map(|_| arena.allocate(req(200 << 10), &a).unwrap()).collect();
    for x in blocks.drain(..4) {
        arena.deallocate(x, &a).unwrap();
    }
    let of_a = |d: &ArenaDump| *d.arenas.iter().find(|s| s.owner == Owner::Stream(1)).unwrap();
    let before = arena.dump();
    assert_eq!((of_a(&before).superblocks, of_a(&before).free_superblocks), (2, 1));
    b.faults().fail_nth(1);
    assert_eq!(arena.allocate(req(1000), &b), Err(SYNC_FAILURE));
    let after = arena.dump();
    assert_eq!((after.global, of_a(&after)), (before.global, of_a(&before)));
    arena.check().unwrap();
    let w = arena.allocate(req(1000), &b).unwrap();
    assert_eq!(b.faults().device_syncs(), 1);
    arena.deallocate(w, &b).unwrap();
    for x in blocks {
        arena.deallocate(x, &a).unwrap();
    }
    arena.check().unwrap();
}

#[test]
fn resource_is_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<ArenaResource<BumpUpstream>>();
    #[cfg(feature = "std")]
    assert_send_sync::<ArenaResource<BumpUpstream, crate::lock::StdLock>>();
}

#[test]
fn free_chunks_go_upstream_to_make_room_for_a_larger_one_under_the_maximum() {
    let config = small_config().chunk_size(1 << 20).maximum_size(2 << 20);
    let arena = ArenaResource::with_config(BumpUpstream::new(1 << 30), config, &()).unwrap();
    let s = TestStream::new(3);
    // A superblock in one chunk, a large block in the other.
    let a = arena.allocate(req(1000), &s).unwrap();
    let b = arena.allocate(req(700 << 10), &s).unwrap();
    assert_eq!((arena.usage().held, arena.dump().chunks, arena.dump().large_blocks), (2 << 20, 2, 1));
    // Two 1 MiB chunks can never hold a 2 MiB block, even when free.
    assert!(matches!(arena.allocate(req(2 << 20), &s), Err(Error::OutOfMemory { .. })));
    for x in [a, b] {
        arena.deallocate(x, &s).unwrap();
    }
    let big = arena.allocate(req(2 << 20), &s).unwrap();
    assert_eq!((arena.usage().held, arena.dump().chunks), (2 << 20, 1));
    assert_eq!(arena.upstream_with(|u| u.usage().held), 2 << 20);
    arena.check().unwrap();
    arena.deallocate(big, &s).unwrap();
    arena.check().unwrap();
}

/// A request whose alignment makes it large: the global arena grows by a
/// chunk of exactly what it needs, and serves it from that chunk (a chunk
/// of exactly `need` bytes lands in a size class below the one searched).
#[test]
fn a_chunk_grown_for_an_aligned_request_serves_it() {
    let up = crate::testing::BumpUpstream::new(1 << 40);
    let config = ArenaConfig::new().superblock_size(1 << 20).chunk_size(8 << 20);
    let arena = ArenaResource::with_config(&up, config, &()).unwrap();
    let r = Request::aligned(547_534, 256 << 20).unwrap();
    let b = arena.allocate(r, &()).unwrap();
    assert_eq!(b.addr() % (256 << 20), 0);
    arena.check().unwrap();
    arena.deallocate(b, &()).unwrap();
    arena.check().unwrap();
    assert_eq!(arena.usage().used, 0);
}

/// Superblocks taken out for a give-back whose synchronization panicked
/// stayed in transit: held for good, the arena never idle, `check` failing.
#[test]
fn a_give_back_whose_stream_panics_leaves_no_superblock_in_transit() {
    let s = crate::testing::PanickingStream::new(5);
    let arena = ArenaResource::<_>::with_config(BumpUpstream::new(1 << 30), ArenaConfig::new(), &s).unwrap();
    let b = arena.allocate(Request::new(1000).unwrap(), &s).unwrap();
    arena.deallocate(b, &s).unwrap();
    s.panic_in("synchronize", 0);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| arena.release(&s)));
    assert!(r.is_err());
    arena.check().unwrap();
    assert!(arena.release(&s).unwrap() > 0, "the chunk goes back");
    assert_eq!(arena.upstream_with(|u| u.usage().held), 0);
    arena.check().unwrap();
}

/// Without `std` nothing catches the second panic: the process aborts.
#[cfg(feature = "std")]
#[test]
fn an_arena_dropped_while_unwinding_over_a_panicking_upstream_does_not_abort() {
    let up = BumpUpstream::new(1 << 30);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let arena = ArenaResource::new(&up);
        let b = arena.allocate(req(1000), &()).unwrap();
        arena.deallocate(b, &()).unwrap();
        up.panic_in("allocate", 0);
        up.panic_in("deallocate", 0);
        // Grows: the upstream panics, and the arena, dropped while the
        // thread unwinds, gives its chunk back to it (which panics again).
        let _ = arena.allocate(req(64 << 20), &());
    }));
    assert!(r.is_err());
    // The chunk whose give-back panicked is left to the upstream.
    assert!(up.usage().held > 0);
}

/// The global arena at its maximum lends a superblock of exactly what an
/// aligned small request needs, which sits in a size class below the one
/// the arena's search starts at: the arena carves from it directly (it
/// searched, found nothing, and answered `OutOfMemory`).
#[test]
fn an_aligned_small_request_is_served_from_the_superblock_left_at_the_maximum() {
    let up = BumpUpstream::new(1 << 40);
    let config = ArenaConfig::new().maximum_size((8 << 20) + 5119 * 256);
    let arena = ArenaResource::with_config(&up, config, &()).unwrap();
    let (s1, s2) = (TestStream::new(1), TestStream::new(2));
    let keep = arena.allocate(req(1000), &s1).unwrap();
    // 256 KiB + 1 MiB - 256: exactly the 1310464 bytes left at the maximum.
    let b = arena.allocate(Request::aligned(256 << 10, 1 << 20).unwrap(), &s2).unwrap();
    assert_eq!(b.addr() % (1 << 20), 0);
    arena.check().unwrap();
    arena.deallocate(b, &s2).unwrap();
    arena.deallocate(keep, &s1).unwrap();
    arena.check().unwrap();
    assert_eq!(arena.usage().used, 0);
}

/// The same with a superblock size that is no class boundary: every new
/// superblock is exactly what the request needs.
#[test]
fn an_aligned_small_request_is_served_from_a_superblock_of_exactly_its_need() {
    let up = BumpUpstream::new(1 << 40);
    let config = ArenaConfig::new().superblock_size(5119 * 256);
    let arena = ArenaResource::with_config(&up, config, &()).unwrap();
    let b = arena.allocate(Request::aligned(256 << 10, 1 << 20).unwrap(), &()).unwrap();
    assert_eq!(b.addr() % (1 << 20), 0);
    arena.check().unwrap();
    arena.deallocate(b, &()).unwrap();
    assert_eq!(arena.usage().used, 0);
}

/// An upstream that, once armed, calls back into the arena above it from
/// its allocate (a small and a large request) and its free (a free of a
/// large block of the arena): a user's upstream wired in a cycle.
#[cfg(feature = "critical-section")]
struct CallsBack {
    up: BumpUpstream,
    above: std::sync::Mutex<
        std::sync::Weak<ArenaResource<std::sync::Arc<CallsBack>, crate::lock::CriticalSectionLock>>,
    >,
    free: std::sync::Mutex<Option<Block>>,
    answers: std::sync::Mutex<Vec<Result<()>>>,
}

#[cfg(feature = "critical-section")]
impl MemoryResource for CallsBack {
    fn allocate(&self, request: Request, stream: &()) -> Result<Block> {
        if let Some(arena) = core::mem::take(&mut *self.above.lock().unwrap()).upgrade() {
            let mut answers = self.answers.lock().unwrap();
            answers.push(arena.allocate(req(1000), stream).map(|_| ()));
            answers.push(arena.allocate(req(2 << 20), stream).map(|_| ()));
        }
        self.up.allocate(request, stream)
    }
    fn deallocate(&self, block: Block, stream: &()) -> Result<()> {
        if let Some(arena) = core::mem::take(&mut *self.above.lock().unwrap()).upgrade() {
            if let Some(b) = self.free.lock().unwrap().take() {
                self.answers.lock().unwrap().push(arena.deallocate(b, stream));
            }
        }
        self.up.deallocate(block, stream)
    }
}

/// Under a lock that refuses re-entry, a call into the arena from inside
/// its upstream's call is `Reentrant` and changes nothing, as for a
/// `Shared` resource; it panicked (`with` on a lock the outer call held).
#[cfg(feature = "critical-section")]
#[test]
fn an_upstream_calling_back_into_the_arena_gets_a_reentrant_error() {
    use std::sync::{Arc, Mutex, Weak};
    let up = Arc::new(CallsBack {
        up: BumpUpstream::new(1 << 30),
        above: Mutex::new(Weak::new()),
        free: Mutex::new(None),
        answers: Mutex::new(Vec::new()),
    });
    let arena: Arc<ArenaResource<_, crate::lock::CriticalSectionLock>> =
        Arc::new(ArenaResource::with_config_in(up.clone(), small_config(), &()).unwrap());
    *up.above.lock().unwrap() = Arc::downgrade(&arena);
    // The first small request grows under the arena's lock and the global one.
    let small = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| arena.allocate(req(1000), &())));
    let small = small.expect("the nested calls panicked").unwrap();
    assert_eq!(*up.answers.lock().unwrap(), [Err(Error::Reentrant), Err(Error::Reentrant)]);
    arena.check().unwrap();
    assert_eq!(arena.usage().used, 1024);
    // A free from inside the upstream's free (a release, under the global lock).
    let big = arena.allocate(req(2 << 20), &()).unwrap();
    // A chunk of its own, wholly free again: the release gives it back.
    let other = arena.allocate(req(3 << 20), &()).unwrap();
    arena.deallocate(other, &()).unwrap();
    arena.deallocate(small, &()).unwrap();
    up.answers.lock().unwrap().clear();
    *up.free.lock().unwrap() = Some(big);
    *up.above.lock().unwrap() = Arc::downgrade(&arena);
    let released = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| arena.release(&())));
    assert!(released.expect("the nested free panicked").unwrap() > 0);
    assert_eq!(*up.answers.lock().unwrap(), [Err(Error::Reentrant)]);
    assert_eq!(arena.usage().used, 2 << 20, "the large block stays live");
    arena.check().unwrap();
    arena.deallocate(big, &()).unwrap();
    arena.check().unwrap();
    assert_eq!(arena.usage().used, 0);
}

/// At its maximum the global arena lends a superblock from a free range
/// shorter than `superblock_size`: the longest it holds, found only among
/// the first ranges of its size class. With the longest further down that
/// list, a small request failed with `OutOfMemory` though every free range
/// could hold its superblock.
#[test]
fn at_the_maximum_a_superblock_comes_from_any_free_range_that_holds_it() {
    let max = 24 << 20;
    let config = ArenaConfig::new()
        .superblock_size(2 << 20)
        .chunk_size(max)
        .initial_size(max)
        .maximum_size(max)
        .large_threshold(256 << 10);
    let arena = ArenaResource::with_config(BumpUpstream::new(1 << 30), config, &()).unwrap();
    let s = TestStream::new(1);
    // Ten holes of one size class, the longest first, kept apart.
    let (holes, mut kept) = ten_holes(&arena, &s, (1536 + 31) << 10, 1536 << 10, 512 << 10);
    let rest = max - arena.usage().used;
    kept.push(arena.allocate(req(rest), &s).unwrap());
    assert_eq!(arena.usage().used, max);
    // Freed longest first: it ends last in its class's list.
    for h in holes {
        arena.deallocate(h, &s).unwrap();
    }
    let small = arena.allocate(req(1000), &TestStream::new(2)).unwrap();
    arena.check().unwrap();
    arena.deallocate(small, &TestStream::new(2)).unwrap();
    free_all(&arena, &s, kept);
}

/// At its maximum the global arena serves a large request from any free
/// range that holds it: the class search looks only at the first ranges of
/// the request's class. With the one range that fits further down that
/// list, the request failed with `OutOfMemory` naming that range as the
/// largest free.
#[test]
fn at_the_maximum_a_large_block_comes_from_any_free_range_that_holds_it() {
    let max = 24 << 20;
    let config = ArenaConfig::new()
        .superblock_size(2 << 20)
        .chunk_size(max)
        .initial_size(max)
        .maximum_size(max)
        .large_threshold(256 << 10);
    let arena = ArenaResource::with_config(BumpUpstream::new(1 << 30), config, &()).unwrap();
    let s = TestStream::new(1);
    // Ten holes of one size class, the longest first, kept apart.
    let long = (1536 + 31) << 10;
    let (holes, mut kept) = ten_holes(&arena, &s, long, 1536 << 10, 512 << 10);
    let rest = max - arena.usage().used;
    kept.push(arena.allocate(req(rest), &s).unwrap());
    assert_eq!(arena.usage().used, max);
    let at = free_holes(&arena, &s, holes);
    let big = arena.allocate(req(long), &s).unwrap();
    assert_eq!(big.addr(), at);
    arena.check().unwrap();
    arena.deallocate(big, &s).unwrap();
    free_all(&arena, &s, kept);
}

/// At its maximum the global arena lends a superblock from any free range
/// that holds what an aligned small request needs: with `need` inside a
/// size class, the class search missed the one range that fits further
/// down that class's list, and the request failed with `OutOfMemory`.
#[test]
fn at_the_maximum_an_aligned_superblock_comes_from_any_free_range_that_holds_it() {
    let max = 24 << 20;
    let config = ArenaConfig::new()
        .superblock_size(2 << 20)
        .chunk_size(max)
        .initial_size(max)
        .maximum_size(max)
        .large_threshold(256 << 10);
    let arena = ArenaResource::with_config(BumpUpstream::new(1 << 30), config, &()).unwrap();
    let s = TestStream::new(1);
    // A superblock for 256 KiB at 1 MiB needs 1280 KiB less 256 bytes;
    // ten holes of its class, only the first (last in the list) that long.
    let need = (1280 << 10) - 256;
    let (holes, mut kept) = ten_holes(&arena, &s, need, 1248 << 10, 512 << 10);
    let rest = max - arena.usage().used;
    kept.push(arena.allocate(req(rest), &s).unwrap());
    assert_eq!(arena.usage().used, max);
    for h in holes {
        arena.deallocate(h, &s).unwrap();
    }
    let small = arena.allocate(Request::aligned(256 << 10, 1 << 20).unwrap(), &TestStream::new(2)).unwrap();
    assert_eq!(small.addr() % (1 << 20), 0);
    arena.check().unwrap();
    arena.deallocate(small, &TestStream::new(2)).unwrap();
    free_all(&arena, &s, kept);
}

/// A growth that fails with the upstream's error (it refused the wholly
/// free chunk given back at the maximum, and then there was no room) still
/// lets a large block, and a superblock, come from any free range that
/// holds it; the error stands only where none does.
#[test]
fn a_growth_refused_by_the_upstream_still_lets_a_block_come_from_any_free_range_that_holds_it() {
    let max = 25 << 20;
    let config = ArenaConfig::new()
        .superblock_size(2 << 20)
        .chunk_size(24 << 20)
        .initial_size(24 << 20)
        .maximum_size(max)
        .large_threshold(256 << 10);
    let arena = ArenaResource::with_config(BumpUpstream::new(1 << 30), config, &()).unwrap();
    let s = TestStream::new(1);
    // Ten holes of one size class, the longest first, kept apart; the
    // first one also holds the superblock of an aligned 256 KiB request.
    let long = (1536 + 31) << 10;
    let (holes, mut kept) = ten_holes(&arena, &s, long, 1536 << 10, 512 << 10);
    let rest = (24 << 20) - arena.usage().used;
    kept.push(arena.allocate(req(rest), &s).unwrap());
    // A second chunk, the last MiB under the maximum, wholly free, and the
    // upstream refuses to take it back.
    let last = arena.allocate(req(512 << 10), &s).unwrap();
    assert_eq!(arena.usage().held, max);
    arena.deallocate(last, &s).unwrap();
    arena.upstream_with(|u| u.refuse_free_at(last.addr()));
    let at = free_holes(&arena, &s, holes);
    let big = arena.allocate(req(long), &s).unwrap();
    assert_eq!(big.addr(), at);
    arena.check().unwrap();
    arena.deallocate(big, &s).unwrap();
    let t = TestStream::new(2);
    let small = arena.allocate(Request::aligned(256 << 10, 1 << 20).unwrap(), &t).unwrap();
    assert_eq!(small.addr() % (1 << 20), 0);
    arena.check().unwrap();
    // Nothing free holds 2 MiB: the refusal is the error.
    let e = arena.allocate(req(2 << 20), &s).unwrap_err();
    assert!(matches!(e, Error::Backend { code: -2, .. }), "{e:?}");
    arena.check().unwrap();
    arena.upstream_with(|u| u.refuse_free_at(0));
    arena.deallocate(small, &t).unwrap();
    free_all(&arena, &s, kept);
}

/// At the maximum a small block comes from any free range of the thread's
/// own superblocks that holds it: the class search looks only at the first
/// ranges of its class, and with no superblock to be had the request
/// failed with `OutOfMemory` though its arena held a range that fits.
#[test]
fn at_the_maximum_a_small_block_comes_from_any_free_range_of_its_arena_that_holds_it() {
    let max = 2 << 20;
    let config = ArenaConfig::new()
        .superblock_size(max)
        .chunk_size(max)
        .initial_size(max)
        .maximum_size(max)
        .large_threshold(256 << 10)
        .size_classes(false);
    let arena = ArenaResource::with_config(BumpUpstream::new(1 << 30), config, &()).unwrap();
    let s = TestStream::new(1);
    let long = 407 << 8;
    let (holes, kept) = small_holes_in_a_full_superblock(&arena, &s, long, max);
    let at = free_holes(&arena, &s, holes);
    let b = arena.allocate(req(long), &s).unwrap();
    assert_eq!(b.addr(), at);
    arena.check().unwrap();
    arena.deallocate(b, &s).unwrap();
    free_all(&arena, &s, kept);
}

/// A superblock request whose growth fails with the upstream's error (it
/// refused the wholly free chunk given back at the maximum, and then there
/// was no room) still lets a small block come from any free range of the
/// thread's own superblocks that holds it; the error stands where none does.
#[test]
fn a_growth_refused_by_the_upstream_still_lets_a_small_block_come_from_its_arena() {
    let config = ArenaConfig::new()
        .superblock_size(2 << 20)
        .chunk_size(2 << 20)
        .initial_size(2 << 20)
        .maximum_size((2 << 20) + (768 << 10))
        .large_threshold(256 << 10)
        .size_classes(false);
    let arena = ArenaResource::with_config(BumpUpstream::new(1 << 30), config, &()).unwrap();
    let s = TestStream::new(1);
    let long = 407 << 8;
    let (holes, kept) = small_holes_in_a_full_superblock(&arena, &s, long, 2 << 20);
    // A second chunk, too short for a superblock, wholly free, and the
    // upstream refuses to take it back.
    let last = arena.allocate(req(512 << 10), &s).unwrap();
    assert_eq!(arena.usage().held, (2 << 20) + (768 << 10));
    arena.deallocate(last, &s).unwrap();
    arena.upstream_with(|u| u.refuse_free_at(last.addr()));
    let at = free_holes(&arena, &s, holes);
    let b = arena.allocate(req(long), &s).unwrap();
    assert_eq!(b.addr(), at);
    arena.check().unwrap();
    // Nothing free in the thread's arena holds 200 KiB: the refusal is
    // the error.
    let e = arena.allocate(req(200 << 10), &s).unwrap_err();
    assert!(matches!(e, Error::Backend { code: -2, .. }), "{e:?}");
    arena.check().unwrap();
    arena.upstream_with(|u| u.refuse_free_at(0));
    arena.deallocate(b, &s).unwrap();
    free_all(&arena, &s, kept);
}

/// An upstream that, once armed, checks the arena above it and formats it
/// from inside its allocate (under the arena's locks).
#[cfg(feature = "critical-section")]
struct Inspects {
    up: BumpUpstream,
    above: std::sync::Mutex<
        std::sync::Weak<ArenaResource<std::sync::Arc<Inspects>, crate::lock::CriticalSectionLock>>,
    >,
    seen: std::sync::Mutex<Vec<(bool, std::string::String)>>,
}

#[cfg(feature = "critical-section")]
impl MemoryResource for Inspects {
    fn allocate(&self, request: Request, stream: &()) -> Result<Block> {
        if let Some(arena) = core::mem::take(&mut *self.above.lock().unwrap()).upgrade() {
            let checked = arena.check().is_err();
            self.seen.lock().unwrap().push((checked, std::format!("{arena:?}")));
        }
        self.up.allocate(request, stream)
    }
    fn deallocate(&self, block: Block, stream: &()) -> Result<()> {
        self.up.deallocate(block, stream)
    }
}

/// Under a lock that refuses re-entry, the arena checked from inside its
/// upstream's call reports a violation, and its `Debug` says it is in use,
/// as a `Shared` resource's do; both panicked (`with` on a lock held).
#[cfg(feature = "critical-section")]
#[test]
fn an_arena_checked_from_inside_its_upstream_reports_it_without_a_panic() {
    use std::sync::{Arc, Mutex, Weak};
    let up = Arc::new(Inspects {
        up: BumpUpstream::new(1 << 30),
        above: Mutex::new(Weak::new()),
        seen: Mutex::new(Vec::new()),
    });
    let arena: Arc<ArenaResource<_, crate::lock::CriticalSectionLock>> =
        Arc::new(ArenaResource::with_config_in(up.clone(), small_config(), &()).unwrap());
    *up.above.lock().unwrap() = Arc::downgrade(&arena);
    let b = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| arena.allocate(req(1000), &())));
    let b = b.expect("checking from inside the upstream panicked").unwrap();
    let seen = up.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 1);
    assert!(seen[0].0, "a check under the arena's own locks cannot pass");
    assert!(seen[0].1.contains("in use"), "{}", seen[0].1);
    arena.check().unwrap();
    arena.deallocate(b, &()).unwrap();
    assert_eq!(arena.usage().used, 0);
}
