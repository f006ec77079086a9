//! A dropped resource gives its chunks back upstream (as RMM's resources
//! release theirs when destroyed), and never one under a live block.

use crate::arena::{ArenaConfig, ArenaResource};
use crate::fixed::{FixedConfig, FixedSizeResource};
use crate::pool::{CoalescingPool, PoolConfig};
use crate::testing::BumpUpstream;
use crate::{Inspect, MemoryResource, MemoryResourceMut, Request};
use alloc::vec::Vec;

fn held(up: &BumpUpstream) -> u64 {
    up.usage().held
}

#[test]
fn dropped_pool_gives_every_chunk_back() {
    let up = BumpUpstream::new(1 << 30);
    let config = PoolConfig::new().initial_size(1 << 20).release_on_grow(false);
    let mut pool = CoalescingPool::with_config(&up, config, &()).unwrap();
    // A second chunk, freed again: both chunks wholly free.
    let b = pool.allocate(Request::new(4 << 20).unwrap(), &()).unwrap();
    pool.deallocate(b, &()).unwrap();
    assert_eq!(pool.chunk_count(), 2);
    drop(pool);
    assert_eq!(held(&up), 0);
}

#[test]
fn dropped_pool_made_empty_gives_back_what_it_grew() {
    let up = BumpUpstream::new(1 << 30);
    let mut pool = CoalescingPool::new(&up);
    let b = pool.allocate(Request::new(1000).unwrap(), &()).unwrap();
    pool.deallocate(b, &()).unwrap();
    drop(pool);
    assert_eq!(held(&up), 0);
}

#[test]
fn dropped_pool_keeps_only_chunks_with_live_blocks() {
    let up = BumpUpstream::new(1 << 30);
    let config = PoolConfig::new().release_on_grow(false);
    let mut pool = CoalescingPool::with_config(&up, config, &()).unwrap();
    let live = pool.allocate(Request::new(1 << 20).unwrap(), &()).unwrap();
    let freed = pool.allocate(Request::new(64 << 20).unwrap(), &()).unwrap();
    pool.deallocate(freed, &()).unwrap();
    let live_chunk = pool.chunk_ranges().find(|r| r.contains(live.addr())).unwrap().len();
    drop(pool);
    // The chunk under the live block is never freed under it.
    assert_eq!(held(&up), live_chunk);
}

#[test]
fn dropped_fixed_size_resource_gives_every_chunk_back() {
    let up = BumpUpstream::new(1 << 30);
    let config = FixedConfig::new(4096).blocks_per_chunk(4);
    let mut fixed = FixedSizeResource::with_config(&up, config, &()).unwrap();
    let blocks: Vec<_> = (0..9).map(|_| fixed.allocate(Request::new(4096).unwrap(), &()).unwrap()).collect();
    for b in &blocks[1..] {
        fixed.deallocate(*b, &()).unwrap();
    }
    assert_eq!(fixed.chunk_count(), 3);
    drop(fixed);
    // The first chunk holds the live block.
    assert_eq!(held(&up), 4 * 4096);
}

#[test]
fn dropped_arena_gives_every_chunk_back() {
    let up = BumpUpstream::new(1 << 30);
    let arena = ArenaResource::with_config(&up, ArenaConfig::new().initial_size(32 << 20), &()).unwrap();
    // Small blocks (from an arena's superblock) and a large one.
    let small: Vec<_> = (0..100).map(|_| arena.allocate(Request::new(3000).unwrap(), &()).unwrap()).collect();
    let large = arena.allocate(Request::new(64 << 20).unwrap(), &()).unwrap();
    for b in small {
        arena.deallocate(b, &()).unwrap();
    }
    arena.deallocate(large, &()).unwrap();
    assert!(held(&up) > 0);
    drop(arena);
    assert_eq!(held(&up), 0);
}

#[test]
fn dropped_arena_keeps_the_chunk_of_a_live_block() {
    let up = BumpUpstream::new(1 << 30);
    let arena = ArenaResource::new(&up);
    let live = arena.allocate(Request::new(64 << 20).unwrap(), &()).unwrap();
    let freed = arena.allocate(Request::new(300 << 20).unwrap(), &()).unwrap();
    arena.deallocate(freed, &()).unwrap();
    drop(arena);
    assert!(held(&up) >= live.size() && held(&up) < 300 << 20);
}

/// A superblock that an arena holds with nothing live in it is no live
/// block: its chunk goes back, though another chunk holds one (it stayed
/// with the upstream for good: the drop gave back only chunks wholly free
/// in the global arena).
#[test]
fn dropped_arena_gives_back_the_chunks_of_free_superblocks_beside_a_live_block() {
    let up = BumpUpstream::new(1 << 40);
    let config = ArenaConfig::new().superblock_size(1 << 20).chunk_size(1 << 20).large_threshold(1 << 10);
    // The initial chunk, taken on `()`, gives the drop a stream to give
    // chunks back on (`TestStream` has none).
    let arena = ArenaResource::with_config(&up, config.initial_size(1 << 20), &()).unwrap();
    let (s1, s2) = (crate::testing::TestStream::new(1), crate::testing::TestStream::new(2));
    // Two chunks, a superblock each, in two arenas.
    let a = arena.allocate(Request::new(512).unwrap(), &s1).unwrap();
    let _live = arena.allocate(Request::new(512).unwrap(), &s2).unwrap();
    arena.deallocate(a, &s1).unwrap();
    assert_eq!(held(&up), 2 << 20);
    drop(arena);
    assert_eq!(held(&up), 1 << 20);
}

/// Arms the upstream's next free to panic and drops `resource`: the drop
/// panics.
#[cfg(feature = "std")] // the rest of the chunks go back from a guard, with std
fn drop_with_a_panicking_free<R>(resource: R, up: &BumpUpstream) {
    up.panic_in("deallocate", 0);
    let dropped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(resource)));
    assert!(dropped.is_err(), "the free's panic goes on");
}

#[cfg(feature = "std")] // the rest of the chunks go back from a guard, with std
#[test]
fn a_dropped_pool_whose_upstream_free_panics_gives_back_every_other_chunk() {
    let up = BumpUpstream::new(1 << 30);
    let config =
        PoolConfig::new().growth(crate::chunks::Growth::Exact { granule: 1 << 20 }).release_on_grow(false);
    let mut pool = CoalescingPool::with_config(&up, config, &()).unwrap();
    let blocks: Vec<_> =
        (0..3).map(|_| pool.allocate(Request::new(1 << 20).unwrap(), &()).unwrap()).collect();
    for b in blocks {
        pool.deallocate(b, &()).unwrap();
    }
    assert_eq!(pool.chunk_count(), 3);
    drop_with_a_panicking_free(pool, &up);
    // Only the chunk whose free panicked stays with the upstream.
    assert_eq!(held(&up), 1 << 20);
}

#[cfg(feature = "std")] // the rest of the chunks go back from a guard, with std
#[test]
fn a_dropped_fixed_size_resource_whose_upstream_free_panics_gives_back_every_other_chunk() {
    let up = BumpUpstream::new(1 << 30);
    let config = FixedConfig::new(4096).blocks_per_chunk(1);
    let mut fixed = FixedSizeResource::with_config(&up, config, &()).unwrap();
    let blocks: Vec<_> = (0..3).map(|_| fixed.allocate(Request::new(4096).unwrap(), &()).unwrap()).collect();
    for b in blocks {
        fixed.deallocate(b, &()).unwrap();
    }
    assert_eq!(fixed.chunk_count(), 3);
    drop_with_a_panicking_free(fixed, &up);
    assert_eq!(held(&up), 4096);
}

#[cfg(feature = "std")] // the rest of the chunks go back from a guard, with std
#[test]
fn a_dropped_arena_whose_upstream_free_panics_gives_back_every_other_chunk() {
    let up = BumpUpstream::new(1 << 30);
    let config = ArenaConfig::new().superblock_size(1 << 20).chunk_size(1 << 20).large_threshold(1 << 10);
    let arena = ArenaResource::with_config(&up, config, &()).unwrap();
    // Large blocks, a chunk each.
    let blocks: Vec<_> =
        (0..3).map(|_| arena.allocate(Request::new(1 << 20).unwrap(), &()).unwrap()).collect();
    for b in blocks {
        arena.deallocate(b, &()).unwrap();
    }
    assert_eq!(arena.dump().chunks, 3);
    drop_with_a_panicking_free(arena, &up);
    assert_eq!(held(&up), 1 << 20);
}
