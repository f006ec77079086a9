extern crate std;

use super::*;
use crate::storage::ArrayStorage;
use crate::testing::{BumpUpstream, SplitMix64};
use crate::Inspect;
use std::collections::BTreeMap;
use std::vec::Vec;

type Fixed = FixedSizeResource<BumpUpstream>;
/// Metadata with no allocator: 64 chunks, 1024 slots.
type ArrayFixed = FixedSizeResource<BumpUpstream, ArrayStorage<Chunk, 64>, ArrayStorage<Slot, 1024>>;

fn fixed(config: FixedConfig) -> Fixed {
    Fixed::with_config(BumpUpstream::new(1 << 40), config, &()).unwrap()
}

/// Everything a failed call must leave as it was.
fn figures<U: core::borrow::Borrow<BumpUpstream>, C: Storage<Chunk>, L: Storage<Slot>>(
    f: &FixedSizeResource<U, C, L>,
) -> [u64; 5] {
    [
        f.usage().held,
        f.used_blocks(),
        f.free_blocks(),
        f.chunk_count() as u64,
        f.upstream().borrow().usage().held,
    ]
}

/// Random allocate and free (by tag and by address), bad requests and bad
/// frees, releases and upstream failures; the resource's checker and the
/// caller's view checked after every step.
fn randomized<C: Storage<Chunk>, L: Storage<Slot>>(
    mut f: FixedSizeResource<BumpUpstream, C, L>,
    ops: usize,
    seed: u64,
) {
    let bs = f.block_size();
    let mut rng = SplitMix64::new(seed);
    // Live blocks by address (the caller's view): no two share an address,
    // and blocks are whole slots, so none overlap.
    let mut live: BTreeMap<u64, Block> = BTreeMap::new();
    let mut blocks: Vec<Block> = Vec::new();
    let mut freed: Vec<Block> = Vec::new();
    // How often each path ran: double frees, foreign frees, upstream
    // failures, releases that gave bytes back, address-only frees.
    let mut seen = [0u64; 5];
    for step in 0..crate::testing::steps(ops) {
        let before = figures(&f);
        match rng.below(100) {
            // Allocate, unless too many are live.
            0..=51 if blocks.len() < 600 => {
                let size = match rng.below(8) {
                    0 => 0,
                    1 => bs,
                    _ => 1 + rng.below(bs),
                };
                let align = if rng.below(8) == 0 { 256 << rng.below(4) } else { 256 };
                let req = Request::aligned(size, align).unwrap();
                if f.free_blocks() == 0 && rng.below(8) == 0 {
                    f.upstream().fail_after(0);
                }
                match f.allocate(req, &()) {
                    Ok(b) if size == 0 => assert!(b.is_empty(), "step {step}"),
                    Ok(b) => {
                        assert_eq!((b.size(), b.addr() % align), (size, 0), "step {step}");
                        assert!(live.insert(b.addr(), b).is_none(), "step {step}: address handed out twice");
                        blocks.push(b);
                    }
                    Err(Error::InvalidAlignment { align: a }) => {
                        assert!(a > f.alignment() && a == align, "step {step}");
                        assert_eq!(before, figures(&f), "step {step}");
                    }
                    Err(Error::Backend { .. }) => {
                        seen[2] += 1;
                        assert_eq!(f.free_blocks(), 0, "step {step}: grew with free blocks");
                        assert_eq!(before, figures(&f), "step {step}");
                    }
                    Err(e) => panic!("step {step}: {e}"),
                }
                f.upstream().fail_after(u64::MAX);
            }
            // A request above the block size.
            52 => {
                let req = Request::new(bs + 1 + rng.below(bs)).unwrap();
                assert!(matches!(f.allocate(req, &()), Err(Error::InvalidSize { .. })), "step {step}");
                assert_eq!(before, figures(&f), "step {step}");
            }
            // A double free (stale tag, or address only) or a foreign block.
            53..=55 => {
                let (b, double) = match (freed.is_empty(), rng.below(3)) {
                    (false, 0) => (freed[rng.below(freed.len() as u64) as usize], true),
                    (false, 1) => {
                        let b = freed[rng.below(freed.len() as u64) as usize];
                        (Block::from_addr(b.addr(), b.size()), true)
                    }
                    _ => (Block::new(rng.next_u64() & !255, 256, rng.next_u64()), false),
                };
                if live.contains_key(&b.addr()) && b.tag() == Block::NO_TAG {
                    // Address-only free of a live block: legitimately frees it.
                    continue;
                }
                let r = f.deallocate(b, &());
                match r {
                    Err(Error::DoubleFree { .. }) => {
                        assert!(double, "step {step}");
                        seen[0] += 1;
                    }
                    Err(Error::UnknownBlock { .. }) => seen[1] += 1,
                    other => panic!("step {step}: {other:?} for {b:?}"),
                }
                assert_eq!(before, figures(&f), "step {step}");
            }
            // Release wholly free chunks.
            56 => {
                let given = f.release(&()).unwrap();
                seen[3] += (given > 0) as u64;
                assert_eq!(before[0] - given, f.usage().held, "step {step}");
                assert_eq!(f.usage().held, f.upstream().usage().held, "step {step}");
            }
            _ if !blocks.is_empty() => {
                let b = blocks.swap_remove(rng.below(blocks.len() as u64) as usize);
                let by_addr = rng.below(4) == 0;
                let given = if by_addr { Block::from_addr(b.addr(), b.size()) } else { b };
                seen[4] += by_addr as u64;
                f.deallocate(given, &()).unwrap_or_else(|e| panic!("step {step}: {e}"));
                live.remove(&b.addr()).unwrap();
                if freed.len() < 64 {
                    freed.push(b);
                } else {
                    freed[rng.below(64) as usize] = b;
                }
                // A freed address may be handed out again: keep only stale
                // blocks whose address is not live.
                freed.retain(|x| !live.contains_key(&x.addr()));
            }
            _ => {}
        }
        if let Err(v) = f.check() {
            panic!("step {step}: {v}");
        }
        assert_eq!(f.used_blocks(), live.len() as u64, "step {step}");
        assert_eq!(f.usage().held, f.upstream().usage().held, "step {step}");
        // Stale blocks whose address came back live are no longer stale.
        freed.retain(|x| !live.contains_key(&x.addr()));
    }
    // (A full run takes every path; a short one, under Miri, need not.)
    assert!(seen.iter().all(|&n| n > 0) || cfg!(miri), "a path never ran: {seen:?}");
    for b in blocks.drain(..) {
        f.deallocate(b, &()).unwrap();
    }
    f.check().unwrap();
    assert_eq!(f.usage().used, 0);
    f.release(&()).unwrap();
    f.check().unwrap();
    assert_eq!((f.usage().held, f.upstream().usage().held), (0, 0));
}

#[test]
fn randomized_default_storage() {
    let config = FixedConfig::new(1024).blocks_per_chunk(16);
    randomized(fixed(config), 100_000, 1);
}

#[test]
fn randomized_array_storage_no_allocator() {
    let config = FixedConfig::new(768).blocks_per_chunk(8).chunk_alignment(1024);
    let f = ArrayFixed::with_config_in(BumpUpstream::new(1 << 40), config, &()).unwrap();
    randomized(f, 100_000, 2);
}

#[test]
fn randomized_one_block_per_chunk() {
    let config = FixedConfig::new(256).blocks_per_chunk(1).initial_chunks(3);
    randomized(fixed(config), 30_000, 3);
}

#[test]
fn blocks_are_consecutive_lowest_first_and_reused_lifo() {
    let mut f = fixed(FixedConfig::new(512).blocks_per_chunk(4));
    let r = Request::new(512).unwrap();
    let b: Vec<Block> = (0..4).map(|_| f.allocate(r, &()).unwrap()).collect();
    for w in b.windows(2) {
        assert_eq!(w[1].addr() - w[0].addr(), 512);
    }
    assert_eq!(f.chunk_count(), 1);
    f.deallocate(b[2], &()).unwrap();
    f.deallocate(b[0], &()).unwrap();
    assert_eq!(f.allocate(r, &()).unwrap().addr(), b[0].addr());
    assert_eq!(f.allocate(r, &()).unwrap().addr(), b[2].addr());
    // The stack is empty: the next request takes a second chunk.
    f.allocate(r, &()).unwrap();
    assert_eq!((f.chunk_count(), f.usage().held, f.used_blocks()), (2, 4096, 5));
    f.check().unwrap();
}

#[test]
fn request_above_block_size_or_alignment_is_an_error() {
    let mut f = fixed(FixedConfig::new(1024).chunk_alignment(256));
    let e = f.allocate(Request::new(1025).unwrap(), &()).unwrap_err();
    assert_eq!(e, Error::InvalidSize { size: 1025, what: "above the block size" });
    assert_eq!(
        f.allocate(Request::aligned(16, 512).unwrap(), &()),
        Err(Error::InvalidAlignment { align: 512 })
    );
    assert_eq!(f.usage().held, 0, "nothing taken for a refused request");
    // Chunks aligned to 4096 and 1024-byte blocks guarantee 1024.
    let mut g = fixed(FixedConfig::new(1024).chunk_alignment(4096));
    assert_eq!(g.alignment(), 1024);
    let b = g.allocate(Request::aligned(16, 1024).unwrap(), &()).unwrap();
    assert_eq!(b.addr() % 1024, 0);
    assert!(g.allocate(Request::aligned(16, 2048).unwrap(), &()).is_err());
    g.check().unwrap();
}

#[test]
fn zero_byte_request_takes_nothing() {
    let mut f = fixed(FixedConfig::default());
    let b = f.allocate(Request::new(0).unwrap(), &()).unwrap();
    assert!(b.is_empty());
    f.deallocate(b, &()).unwrap();
    assert_eq!(f.usage().held, 0);
}

#[test]
fn bad_frees_are_errors_and_change_nothing() {
    // Both over one address space, so that their addresses differ.
    let up = BumpUpstream::new(1 << 30);
    let mut f = FixedSizeResource::with_config(&up, FixedConfig::new(256).blocks_per_chunk(4), &()).unwrap();
    let mut other =
        FixedSizeResource::with_config(&up, FixedConfig::new(256).blocks_per_chunk(4), &()).unwrap();
    let r = Request::new(200).unwrap();
    let a = f.allocate(r, &()).unwrap();
    let foreign = other.allocate(r, &()).unwrap();
    let before = figures(&f);
    // Another resource's block: its tag names a slot here, with another address.
    assert_eq!(f.deallocate(foreign, &()), Err(Error::UnknownBlock { addr: foreign.addr() }));
    // An address inside a chunk but not at a block boundary.
    assert_eq!(
        f.deallocate(Block::from_addr(a.addr() + 16, 200), &()),
        Err(Error::UnknownBlock { addr: a.addr() + 16 })
    );
    // A size above the block size, and one within it but not the size asked
    // for (an adaptor above counts off the size a free states).
    for wrong in [Block::from_addr(a.addr(), 257), Block::new(a.addr(), 201, a.tag())] {
        let e = f.deallocate(wrong, &());
        assert!(matches!(e, Err(Error::SizeMismatch { expected: 200, .. })), "{e:?}");
    }
    assert_eq!(before, figures(&f));
    f.deallocate(a, &()).unwrap();
    let before = figures(&f);
    assert_eq!(f.deallocate(a, &()), Err(Error::DoubleFree { addr: a.addr() }));
    assert_eq!(f.deallocate(Block::from_addr(a.addr(), 200), &()), Err(Error::DoubleFree { addr: a.addr() }));
    assert_eq!(before, figures(&f));
    // The slot handed out again: the old tag is stale, the new one works.
    let b = f.allocate(r, &()).unwrap();
    assert_eq!(b.addr(), a.addr());
    assert_eq!(f.deallocate(a, &()), Err(Error::DoubleFree { addr: a.addr() }));
    f.deallocate(b, &()).unwrap();
    f.check().unwrap();
    assert_eq!(f.used_blocks(), 0);
}

/// A slot at the end of its generations is retired: a tag 2^32 - 1 frees
/// old stays a double free (before, the generation wrapped, and the stale
/// tag freed the block of the slot's next owner).
#[test]
fn a_used_up_slot_is_retired_and_its_stale_tags_stay_double_frees() {
    let mut f = fixed(FixedConfig::new(256).blocks_per_chunk(2));
    let r = Request::new(256).unwrap();
    let a = f.allocate(r, &()).unwrap();
    f.deallocate(a, &()).unwrap();
    let i = a.tag() as u32 as usize;
    // As after 2^32 - 3 more frees of this slot.
    f.slots.table[i].generation = u32::MAX - 2;
    for _ in 0..3 {
        let b = f.allocate(r, &()).unwrap();
        f.deallocate(b, &()).unwrap();
        f.check().unwrap();
    }
    let c = f.allocate(r, &()).unwrap();
    assert_eq!(f.deallocate(a, &()), Err(Error::DoubleFree { addr: a.addr() }));
    assert_ne!(c.addr(), a.addr(), "the retired block was handed out again");
    // The retired block is held and not used: free, but never handed out.
    let u = f.usage();
    assert_eq!((f.used_blocks(), f.free_blocks(), u.free, u.largest_free), (1, 0, 256, 0));
    f.check().unwrap();
    // The chunk goes back once its other block is free; its slot group,
    // reused, keeps the retirement.
    f.deallocate(c, &()).unwrap();
    assert_eq!(f.free_blocks(), 1);
    assert_eq!(f.release(&()).unwrap(), 512);
    f.check().unwrap();
    let d = f.allocate(r, &()).unwrap();
    assert_eq!(d.tag() as u32, c.tag() as u32);
    assert_eq!((f.usage().held, f.used_blocks(), f.free_blocks()), (512, 1, 0));
    f.check().unwrap();
    f.deallocate(d, &()).unwrap();

    // With one block per chunk, a group of only retired slots is not reused.
    let mut f = fixed(FixedConfig::new(256).blocks_per_chunk(1));
    let x = f.allocate(r, &()).unwrap();
    f.deallocate(x, &()).unwrap();
    f.slots.table[0].generation = u32::MAX - 1;
    let a = f.allocate(r, &()).unwrap();
    f.deallocate(a, &()).unwrap();
    assert_eq!((f.used_blocks(), f.free_blocks()), (0, 0));
    assert_eq!(f.release(&()).unwrap(), 256);
    let b = f.allocate(r, &()).unwrap();
    assert_eq!((b.tag() as u32, f.slots.table.len()), (1, 2));
    assert_eq!(f.deallocate(a, &()), Err(Error::UnknownBlock { addr: a.addr() }));
    f.check().unwrap();
}

#[test]
fn upstream_failure_while_growing_leaves_resource_usable() {
    let mut f = fixed(FixedConfig::new(256).blocks_per_chunk(2));
    let r = Request::new(256).unwrap();
    let a = f.allocate(r, &()).unwrap();
    let b = f.allocate(r, &()).unwrap();
    f.upstream().fail_after(0);
    let before = figures(&f);
    assert!(matches!(f.allocate(r, &()), Err(Error::Backend { .. })));
    assert_eq!(before, figures(&f));
    f.check().unwrap();
    // Frees still work and their blocks are reused without upstream.
    f.deallocate(a, &()).unwrap();
    assert_eq!(f.allocate(r, &()).unwrap().addr(), a.addr());
    f.upstream().fail_after(u64::MAX);
    f.allocate(r, &()).unwrap();
    assert_eq!(f.chunk_count(), 2);
    f.deallocate(b, &()).unwrap();
    f.check().unwrap();
}

#[test]
fn upstream_out_of_memory_reports_figures() {
    let mut f =
        Fixed::with_config(BumpUpstream::new(1024), FixedConfig::new(512).blocks_per_chunk(2), &()).unwrap();
    let r = Request::new(512).unwrap();
    f.allocate(r, &()).unwrap();
    f.allocate(r, &()).unwrap();
    let e = f.allocate(r, &()).unwrap_err();
    assert_eq!(e, Error::OutOfMemory { requested: 512, largest_free: 0, pool_size: 1024, max_size: None });
    f.check().unwrap();
}

#[test]
fn failed_initial_chunks_hold_nothing() {
    let up = BumpUpstream::new(1 << 30);
    up.fail_after(2);
    let config = FixedConfig::new(256).blocks_per_chunk(4).initial_chunks(3);
    let e = FixedSizeResource::with_config(&up, config, &()).unwrap_err();
    assert!(matches!(e, Error::Backend { .. }));
    assert_eq!(up.usage().held, 0);
}

#[test]
fn release_gives_back_only_wholly_free_chunks() {
    let mut f = fixed(FixedConfig::new(256).blocks_per_chunk(2));
    let r = Request::new(256).unwrap();
    let b: Vec<Block> = (0..6).map(|_| f.allocate(r, &()).unwrap()).collect();
    // Chunk 0 wholly free, chunk 1 half free, chunk 2 used.
    f.deallocate(b[0], &()).unwrap();
    f.deallocate(b[1], &()).unwrap();
    f.deallocate(b[2], &()).unwrap();
    assert_eq!(f.release(&()).unwrap(), 512);
    f.check().unwrap();
    assert_eq!((f.chunk_count(), f.usage().held, f.upstream().usage().held), (2, 1024, 1024));
    assert_eq!(f.free_blocks(), 1);
    // The released chunk's address is unknown now.
    assert_eq!(f.deallocate(b[0], &()), Err(Error::UnknownBlock { addr: b[0].addr() }));
    // Its slot group is reused by the next grow.
    let c = f.allocate(r, &()).unwrap();
    assert_eq!(c.addr(), b[2].addr());
    f.allocate(r, &()).unwrap();
    assert_eq!(f.chunk_count(), 3);
    f.check().unwrap();
    assert_eq!(f.release(&()).unwrap(), 0);
    assert_eq!(f.usage().peak_held, 1536);
}

#[test]
fn fixed_capacity_exhausted_is_an_error_and_changes_nothing() {
    type Tiny = FixedSizeResource<BumpUpstream, ArrayStorage<Chunk, 2>, ArrayStorage<Slot, 6>>;
    let mut f =
        Tiny::with_config_in(BumpUpstream::new(1 << 20), FixedConfig::new(256).blocks_per_chunk(2), &())
            .unwrap();
    let r = Request::new(256).unwrap();
    let b: Vec<Block> = (0..4).map(|_| f.allocate(r, &()).unwrap()).collect();
    let before = figures(&f);
    assert_eq!(f.allocate(r, &()), Err(Error::CapacityExhausted { capacity: 2 }));
    assert_eq!(before, figures(&f));
    f.check().unwrap();
    f.deallocate(b[0], &()).unwrap();
    f.deallocate(b[1], &()).unwrap();
    f.release(&()).unwrap();
    // The vacant slot group is reused: no new slots are needed.
    f.allocate(r, &()).unwrap();
    f.allocate(r, &()).unwrap();
    assert_eq!(f.chunk_count(), 2);
    f.check().unwrap();

    // Slots run out before chunks do.
    type FewSlots = FixedSizeResource<BumpUpstream, ArrayStorage<Chunk, 8>, ArrayStorage<Slot, 5>>;
    let mut g =
        FewSlots::with_config_in(BumpUpstream::new(1 << 20), FixedConfig::new(256).blocks_per_chunk(2), &())
            .unwrap();
    for _ in 0..4 {
        g.allocate(r, &()).unwrap();
    }
    assert_eq!(g.allocate(r, &()), Err(Error::CapacityExhausted { capacity: 5 }));
    assert_eq!(g.upstream().usage().held, 1024, "nothing stranded upstream");
    g.check().unwrap();
}

#[test]
fn invalid_configs_are_rejected() {
    let up = BumpUpstream::new(1 << 30);
    for config in [
        FixedConfig::new(0),
        FixedConfig::new(100),
        FixedConfig::new(256).blocks_per_chunk(0),
        FixedConfig::new(256).chunk_alignment(100),
        FixedConfig::new(256).chunk_alignment(128),
        FixedConfig::new(1 << 40).blocks_per_chunk(1 << 30),
    ] {
        assert!(
            matches!(FixedSizeResource::with_config(&up, config, &()), Err(Error::InvalidConfig { .. })),
            "{config:?}"
        );
    }
    assert_eq!(up.usage().held, 0);
}

/// Each block has a slot of host metadata, made when its chunk is taken: a
/// count near `u32::MAX` was taken, and the first allocation asked the host
/// for about 100 GB of slots. The most is taken, and serves.
#[test]
fn more_blocks_per_chunk_than_the_most_are_refused() {
    let up = BumpUpstream::new(1 << 40);
    let max = FixedConfig::MAX_BLOCKS_PER_CHUNK;
    for n in [max + 1, u32::MAX - 4, u32::MAX] {
        let config = FixedConfig::new(256).blocks_per_chunk(n);
        assert!(
            matches!(FixedSizeResource::with_config(&up, config, &()), Err(Error::InvalidConfig { .. })),
            "{n}"
        );
    }
    let mut fixed =
        FixedSizeResource::with_config(&up, FixedConfig::new(256).blocks_per_chunk(max), &()).unwrap();
    assert_eq!(up.usage().held, 0);
    // 24 MiB of slots: quick, but not under Miri; without an allocator the
    // fixed-capacity slot table refuses them, and nothing is taken.
    if cfg!(miri) {
        return;
    }
    match fixed.allocate(Request::new(256).unwrap(), &()) {
        Ok(b) => {
            assert_eq!((fixed.usage().held, fixed.free_blocks()), (256 << 20, u64::from(max) - 1));
            fixed.deallocate(b, &()).unwrap();
        }
        Err(Error::CapacityExhausted { .. }) if !cfg!(feature = "alloc") => assert_eq!(up.usage().held, 0),
        Err(e) => panic!("{e:?}"),
    }
    fixed.check().unwrap();
}

#[test]
fn shared_between_threads() {
    let f = crate::Shared::new(fixed(FixedConfig::new(256).blocks_per_chunk(8)));
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                let r = Request::new(256).unwrap();
                for _ in 0..crate::testing::steps(1000) {
                    let b = crate::MemoryResource::allocate(&f, r, &()).unwrap();
                    crate::MemoryResource::deallocate(&f, b, &()).unwrap();
                }
            });
        }
    });
    f.with(|f| {
        f.check().unwrap();
        assert_eq!(f.used_blocks(), 0);
    });
}

#[test]
fn debug_shows_figures() {
    let f = fixed(FixedConfig::new(512));
    let s = std::format!("{f:?}");
    assert!(s.contains("block_size: 512") && s.contains("held: 0"), "{s}");
}

/// An upstream outside the contract: every allocation at one address.
struct OneAddress;

impl MemoryResource for OneAddress {
    fn allocate(&self, request: Request, _: &()) -> crate::Result<Block> {
        Ok(Block::new(1 << 20, request.size(), Block::NO_TAG))
    }
    fn deallocate(&self, _: Block, _: &()) -> crate::Result<()> {
        Ok(())
    }
}

/// A chunk over memory held already is refused: both of one-block chunks
/// handed out the same address.
#[test]
fn a_chunk_over_memory_held_already_is_refused() {
    let mut f = FixedSizeResource::try_new(OneAddress, FixedConfig::new(256).blocks_per_chunk(1)).unwrap();
    let a = f.allocate(Request::new(256).unwrap(), &()).unwrap();
    let e = f.allocate(Request::new(256).unwrap(), &()).unwrap_err();
    let what = "overlapping memory a chunk already holds";
    assert_eq!(e, Error::UpstreamMisbehaved { addr: 1 << 20, size: 256, what }, "the upstream's fault");
    f.check().unwrap();
    f.deallocate(a, &()).unwrap();
}

/// A release whose upstream panics on the second chunk: the first went
/// back, and the free stack still ran through its slots (relinked only
/// once `release` returned), so the next allocations were blocks of
/// memory given back, then an index out of bounds. The chunk whose free
/// panicked left the resource before its free (an upstream may take a
/// chunk and then panic): lost to it, never carved again.
#[test]
fn a_release_whose_upstream_panics_leaves_the_free_stack_in_the_chunks_held() {
    let mut f = fixed(FixedConfig::new(256).blocks_per_chunk(2));
    let blocks: Vec<_> = (0..4).map(|_| f.allocate(Request::new(256).unwrap(), &()).unwrap()).collect();
    for b in &blocks {
        f.deallocate(*b, &()).unwrap();
    }
    f.upstream().panic_in("deallocate", 1);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f.release(&())));
    assert!(r.is_err());
    // One chunk went back; the one whose free panicked is the upstream's.
    assert_eq!(figures(&f), [0, 0, 0, 0, 512]);
    f.check().unwrap();
    for _ in 0..2 {
        let b = f.allocate(Request::new(256).unwrap(), &()).unwrap();
        let old = |a: &Block| (a.addr()..a.addr() + 512).contains(&b.addr());
        assert!(![blocks[0], blocks[2]].iter().any(old), "{b:?} lies in a chunk given back");
    }
    f.check().unwrap();
    assert_eq!(figures(&f), [512, 2, 0, 1, 1024]);
}

/// The same for a grow whose upstream panics: nothing changes.
#[test]
fn a_grow_whose_upstream_panics_changes_nothing() {
    let mut f = fixed(FixedConfig::new(256).blocks_per_chunk(2));
    let a = f.allocate(Request::new(256).unwrap(), &()).unwrap();
    let b = f.allocate(Request::new(256).unwrap(), &()).unwrap();
    let before = figures(&f);
    f.upstream().panic_in("allocate", 0);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        f.allocate(Request::new(256).unwrap(), &())
    }));
    assert!(r.is_err());
    assert_eq!(figures(&f), before);
    f.check().unwrap();
    let c = f.allocate(Request::new(256).unwrap(), &()).unwrap();
    for x in [a, b, c] {
        f.deallocate(x, &()).unwrap();
    }
    assert_eq!(f.release(&()).unwrap(), 1024);
}

/// A stream type whose `at_drop` (a safe trait's) calls back twice: the
/// chunk went back upstream twice, where a shared upstream may have handed
/// it to someone else in between.
#[test]
fn a_stream_whose_at_drop_calls_back_twice_frees_each_chunk_once() {
    use core::sync::atomic::{AtomicU64, Ordering};
    struct Twice;
    impl Stream for Twice {
        type Event = ();
        fn id(&self) -> u64 {
            0
        }
        fn record(&self) -> crate::Result<()> {
            Ok(())
        }
        fn wait(&self, _: &()) -> crate::Result<()> {
            Ok(())
        }
        fn query(&self, _: &()) -> crate::Result<bool> {
            Ok(true)
        }
        fn synchronize(&self) -> crate::Result<()> {
            Ok(())
        }
        fn at_drop(give_back: &mut dyn FnMut(&Self)) -> bool {
            give_back(&Twice);
            give_back(&Twice);
            true
        }
    }
    struct CountFrees(BumpUpstream, AtomicU64);
    impl<S: Stream + ?Sized> MemoryResource<S> for CountFrees {
        fn allocate(&self, r: Request, s: &S) -> crate::Result<Block> {
            self.0.allocate(r, s)
        }
        fn deallocate(&self, b: Block, s: &S) -> crate::Result<()> {
            self.1.fetch_add(1, Ordering::Relaxed);
            self.0.deallocate(b, s)
        }
    }
    let up = CountFrees(BumpUpstream::new(1 << 30), AtomicU64::new(0));
    {
        let mut f = FixedSizeResource::try_new(&up, FixedConfig::new(256).blocks_per_chunk(4)).unwrap();
        let b = MemoryResourceMut::<Twice>::allocate(&mut f, Request::new(10).unwrap(), &Twice).unwrap();
        MemoryResourceMut::<Twice>::deallocate(&mut f, b, &Twice).unwrap();
    }
    assert_eq!(up.1.load(Ordering::Relaxed), 1, "the chunk went back upstream once");
    assert_eq!(up.0.usage().held, 0);
}
