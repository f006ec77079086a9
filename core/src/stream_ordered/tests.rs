extern crate std;

use super::*;
use crate::pool::{CoalescingPool, PoolConfig};
use crate::testing::{BumpUpstream, LoggedStream, StreamLog};
use crate::Inspect;
use alloc::rc::Rc;
use alloc::vec;
use core::cell::RefCell;

type Layer = StreamOrdered<CoalescingPool<BumpUpstream>, LoggedStream>;

fn setup(max: Option<u64>) -> (Layer, LoggedStream, LoggedStream, Rc<RefCell<StreamLog>>) {
    let log = Rc::new(RefCell::new(StreamLog::default()));
    let config = match max {
        Some(m) => PoolConfig::new().initial_size(m).maximum_size(m),
        None => PoolConfig::new(),
    };
    let pool = CoalescingPool::with_config(BumpUpstream::new(1 << 30), config, &()).unwrap();
    let a = LoggedStream { id: 1, log: log.clone() };
    let b = LoggedStream { id: 2, log: log.clone() };
    (StreamOrdered::new(pool), a, b, log)
}

fn req(n: u64) -> Request {
    Request::new(n).unwrap()
}

#[test]
fn own_stream_reuses_at_once_without_stream_calls() {
    let (mut so, a, _, log) = setup(None);
    let x = so.allocate(req(4096), &a).unwrap();
    so.deallocate(x, &a).unwrap();
    so.check().unwrap();
    let y = so.allocate(req(4000), &a).unwrap();
    assert_eq!((y.addr(), y.size()), (x.addr(), 4000));
    assert_eq!(so.stats().own_hits, 1);
    assert!(log.borrow().records.is_empty() && log.borrow().waits.is_empty());
    so.check().unwrap();
}

#[test]
fn other_stream_waits_on_an_event_of_the_freeing_stream() {
    let (mut so, a, b, log) = setup(None);
    let x = so.allocate(req(4096), &a).unwrap();
    so.deallocate(x, &a).unwrap();
    let y = so.allocate(req(4096), &b).unwrap();
    assert_eq!(y.addr(), x.addr());
    assert_eq!(log.borrow().records, vec![1]);
    assert_eq!(log.borrow().waits, vec![(2, 1)]);
    assert_eq!(so.stats().steals, 1);
    so.check().unwrap();
}

#[test]
fn unordered_variant_skips_the_wait() {
    let (so, a, b, log) = setup(None);
    let mut so = so.with_cross_stream(CrossStream::Unordered);
    let x = so.allocate(req(4096), &a).unwrap();
    so.deallocate(x, &a).unwrap();
    let y = so.allocate(req(4096), &b).unwrap();
    assert_eq!(y.addr(), x.addr());
    assert!(log.borrow().waits.is_empty());
}

#[test]
fn much_larger_listed_blocks_are_not_wasted_on_small_requests() {
    let (mut so, a, _, _) = setup(None);
    let x = so.allocate(req(1 << 20), &a).unwrap();
    so.deallocate(x, &a).unwrap();
    let y = so.allocate(req(1000), &a).unwrap();
    assert_ne!(y.addr(), x.addr());
    assert_eq!(so.stats().own_hits, 0);
    so.check().unwrap();
}

/// The bound is in footprints (sizes rounded up to 256): a listed block
/// serves a request whose footprint is at least half its own, so a
/// 1000-byte block (1024) serves 257 bytes (512), and a 1025-byte block
/// (1280) does not serve 512 bytes.
#[test]
fn a_listed_block_serves_requests_of_at_least_half_its_footprint() {
    let (mut so, a, _, _) = setup(None);
    let x = so.allocate(req(1000), &a).unwrap();
    let w = so.allocate(req(1025), &a).unwrap();
    so.deallocate(x, &a).unwrap();
    so.deallocate(w, &a).unwrap();
    let y = so.allocate(req(257), &a).unwrap();
    assert_eq!((y.addr(), so.stats().own_hits), (x.addr(), 1));
    let z = so.allocate(req(512), &a).unwrap();
    assert_ne!(z.addr(), w.addr());
    assert_eq!(so.stats().own_hits, 1);
    so.check().unwrap();
}

#[test]
fn bad_frees_are_errors_and_change_nothing() {
    let (mut so, a, b, _) = setup(None);
    let x = so.allocate(req(512), &a).unwrap();
    let before = (so.live_count(), so.usage().used, so.listed_bytes());
    let foreign = Block::new(0xdead_0000, 512, 0);
    assert_eq!(so.deallocate(foreign, &a), Err(Error::UnknownBlock { addr: 0xdead_0000 }));
    assert_eq!(
        so.deallocate(Block::from_addr(x.addr(), 512), &a),
        Err(Error::UnknownBlock { addr: x.addr() })
    );
    assert!(matches!(so.deallocate(Block::new(x.addr(), 256, x.tag()), &a), Err(Error::SizeMismatch { .. })));
    assert_eq!((so.live_count(), so.usage().used, so.listed_bytes()), before);
    so.check().unwrap();
    // Freed on another stream than its allocation's: allowed.
    so.deallocate(x, &b).unwrap();
    assert_eq!(so.deallocate(x, &b), Err(Error::DoubleFree { addr: x.addr() }));
    // Reused on a: the stale tag is still a double free.
    let y = so.allocate(req(512), &a).unwrap();
    assert_eq!(y.addr(), x.addr());
    assert_eq!(so.deallocate(x, &a), Err(Error::DoubleFree { addr: x.addr() }));
    so.deallocate(y, &a).unwrap();
    assert_eq!((so.live_count(), so.usage().used), (0, 0));
    so.check().unwrap();
}

/// A stale tag is a double free once its slot went to a block at another
/// address, on any stream: its block's address is the layer's still
/// (listed, or served again under another slot). An older generation of
/// the slot at an address the layer does not hold (never handed out,
/// inside a live block) stays unknown. Before, the slot's new address made
/// every stale tag `UnknownBlock`.
#[test]
fn a_stale_tag_is_a_double_free_after_its_slot_went_to_another_address() {
    let (mut so, a, b, _) = setup(None);
    let x = so.allocate(req(1000), &a).unwrap();
    so.deallocate(x, &a).unwrap();
    // Too large for the listed block: from the pool, in `x`'s slot.
    let y = so.allocate(req(1 << 20), &a).unwrap();
    assert_eq!(y.tag() as u32, x.tag() as u32, "the same slot");
    assert_ne!(y.addr(), x.addr());
    let state = |so: &Layer| (so.live_count(), so.usage().used, so.listed_bytes(), so.listed_count());
    let before = state(&so);
    let double = Err(Error::DoubleFree { addr: x.addr() });
    assert_eq!(so.deallocate(x, &a), double, "listed");
    assert_eq!(so.deallocate(x, &b), double, "on another stream");
    assert_eq!(so.deallocate(Block::new(x.addr(), 5000, x.tag()), &a), double, "whatever its size");
    for (addr, what) in [(0xdead_0000, "never handed out"), (y.addr() + 256, "inside a live block")] {
        let forged = Block::new(addr, 1000, x.tag());
        assert_eq!(so.deallocate(forged, &a), Err(Error::UnknownBlock { addr }), "{what}");
    }
    assert_eq!(state(&so), before);
    so.check().unwrap();
    // `x`'s place served again, under another slot.
    let z = so.allocate(req(1000), &a).unwrap();
    assert_eq!(z.addr(), x.addr());
    assert_ne!(z.tag() as u32, x.tag() as u32);
    let before = state(&so);
    assert_eq!(so.deallocate(x, &a), double, "live under another slot");
    assert_eq!(state(&so), before);
    so.deallocate(z, &a).unwrap();
    so.deallocate(y, &a).unwrap();
    assert_eq!((so.live_count(), so.usage().used), (0, 0));
    so.check().unwrap();
}

/// A slot at the end of its generations is retired: a tag 2^32 - 1 frees
/// old stays a double free (before, the generation wrapped, and the stale
/// tag freed the block of the slot's next owner, at the same address).
#[test]
fn a_used_up_slot_is_retired_and_its_stale_tags_stay_double_frees() {
    let (mut so, a, _, _) = setup(None);
    let x = so.allocate(req(512), &a).unwrap();
    so.deallocate(x, &a).unwrap();
    // As after 2^32 - 2 more frees of this slot.
    so.slots[x.tag() as u32 as usize].generation = u32::MAX - 1;
    for _ in 0..2 {
        let y = so.allocate(req(512), &a).unwrap();
        so.deallocate(y, &a).unwrap();
        so.check().unwrap();
    }
    let w = so.allocate(req(512), &a).unwrap();
    assert_eq!(w.addr(), x.addr());
    assert_eq!(so.deallocate(x, &a), Err(Error::DoubleFree { addr: x.addr() }));
    assert_ne!(w.tag() as u32, x.tag() as u32, "the retired slot was handed out again");
    assert_eq!(so.live_count(), 1);
    so.check().unwrap();
    so.deallocate(w, &a).unwrap();
    so.check().unwrap();
}

#[test]
fn zero_byte_requests() {
    let (mut so, a, _, _) = setup(None);
    let z = so.allocate(req(0), &a).unwrap();
    assert_eq!(z, Block::EMPTY);
    so.deallocate(z, &a).unwrap();
    assert_eq!(so.live_count(), 0);
}

#[test]
fn reclaim_gives_back_blocks_whose_free_completed() {
    let (mut so, a, _, log) = setup(None);
    let xs: Vec<_> = (0..4).map(|_| so.allocate(req(1024), &a).unwrap()).collect();
    for &x in &xs {
        so.deallocate(x, &a).unwrap();
    }
    // First call fences; nothing is known complete yet.
    assert_eq!(so.reclaim().unwrap(), 0);
    assert_eq!(log.borrow().records, vec![1]);
    assert_eq!(so.reclaim().unwrap(), 0);
    log.borrow_mut().complete = true;
    assert_eq!(so.reclaim().unwrap(), 4);
    assert_eq!((so.listed_bytes(), so.inner().usage().used), (0, 0));
    // Back in the pool, coalesced into one range.
    assert_eq!(so.inner().usage().largest_free, so.inner().usage().held);
    so.check().unwrap();
}

#[test]
fn last_resort_synchronizes_and_merges_before_out_of_memory() {
    let (mut so, a, b, log) = setup(Some(64 * 1024));
    let xs: Vec<_> = (0..16).map(|_| so.allocate(req(4096), &a).unwrap()).collect();
    for &x in &xs {
        so.deallocate(x, &a).unwrap();
    }
    // No listed block fits; the pool is at its maximum and all of it listed.
    let big = so.allocate(req(32 * 1024), &b).unwrap();
    assert_eq!(log.borrow().syncs, vec![1]);
    assert_eq!(so.stats().last_resorts, 1);
    assert_eq!(so.listed_bytes(), 0);
    so.check().unwrap();
    // Too large even after merging: out of memory, nothing lost.
    let err = so.allocate(req(64 * 1024), &b).unwrap_err();
    assert!(err.is_out_of_memory());
    so.deallocate(big, &b).unwrap();
    so.check().unwrap();
    assert_eq!(so.usage().used + so.listed_bytes(), so.inner().usage().used);
}

#[test]
fn failed_record_leaves_the_block_listed() {
    let (mut so, a, b, log) = setup(None);
    let x = so.allocate(req(4096), &a).unwrap();
    so.deallocate(x, &a).unwrap();
    log.borrow_mut().fail_record = true;
    assert!(matches!(so.allocate(req(4096), &b), Err(Error::Backend { .. })));
    assert_eq!((so.listed_bytes(), so.live_count()), (4096, 0));
    so.check().unwrap();
    log.borrow_mut().fail_record = false;
    let y = so.allocate(req(4096), &b).unwrap();
    assert_eq!(y.addr(), x.addr());
}

/// Blocks on two streams, fenced by one reclaim; then a third freed after
/// the fence. Full, the pool needs two of them back for 8 KiB.
fn three_listed_after_a_fence() -> (Layer, LoggedStream, LoggedStream, Rc<RefCell<StreamLog>>) {
    let (mut so, a, b, log) = setup(Some(3 * 4096));
    let [x, y, z] = [0; 3].map(|_| so.allocate(req(4096), &a).unwrap());
    so.deallocate(x, &a).unwrap();
    so.deallocate(y, &b).unwrap();
    assert_eq!(so.reclaim(), Ok(0), "nothing complete: each list fenced");
    so.deallocate(z, &b).unwrap();
    log.borrow_mut().complete = true;
    (so, a, b, log)
}

/// A stream that cannot record its fence does not keep the blocks its
/// own and the other lists gave back from the allocation that needs them.
/// Before, the failed record ended the reclaim: the allocation failed
/// with 8 KiB free in the pool.
#[test]
fn a_failed_fence_does_not_fail_an_allocation_the_reclaim_made_room_for() {
    let (mut so, a, _, log) = three_listed_after_a_fence();
    log.borrow_mut().fail_record = true;
    let got = so.allocate(req(8192), &a).unwrap();
    assert_eq!((so.listed_bytes(), so.live_count()), (4096, 1), "the block after the fence stays listed");
    so.check().unwrap();
    // The reclaim itself says it failed, having given back what it could.
    so.deallocate(got, &a).unwrap();
    let (mut so, _, _, log) = three_listed_after_a_fence();
    log.borrow_mut().fail_record = true;
    assert!(matches!(so.reclaim(), Err(Error::Backend { code: 1, .. })));
    assert_eq!(so.listed_bytes(), 4096);
    so.check().unwrap();
    log.borrow_mut().fail_record = false;
    assert_eq!(so.reclaim(), Ok(0), "fenced now");
    assert_eq!(so.reclaim(), Ok(1));
    assert_eq!(so.listed_bytes(), 0);
}

/// The last resort merges every list it can synchronize: one stream that
/// fails keeps its own list, not the others'. Before, the first failure
/// ended the merge.
#[test]
fn a_stream_that_fails_to_synchronize_keeps_only_its_own_list() {
    // A full pool whose three blocks are listed on the streams `on` names.
    let freed_on = |on: [u64; 3]| {
        let (mut so, a, _, log) = setup(Some(3 * 4096));
        for (block, id) in [0; 3].map(|_| so.allocate(req(4096), &a).unwrap()).into_iter().zip(on) {
            so.deallocate(block, &LoggedStream { id, log: log.clone() }).unwrap();
        }
        (so, log)
    };
    // Stream 1 comes first in the lists; it fails, stream 2 merges.
    let (mut so, log) = freed_on([1, 2, 2]);
    log.borrow_mut().fail_sync_of = Some(1);
    assert!(matches!(so.synchronize_and_merge(), Err(Error::Backend { code: 5, .. })));
    assert_eq!(so.listed_bytes(), 4096, "stream 2's list merged, stream 1's kept");
    so.check().unwrap();
    // No listed block serves 8 KiB: the last resort merges stream 2's two,
    // which lie side by side, and the allocation takes them.
    let (mut so, log) = freed_on([1, 2, 2]);
    log.borrow_mut().fail_sync_of = Some(1);
    let got = so.allocate(req(8192), &LoggedStream { id: 3, log: log.clone() });
    assert!(got.is_ok(), "{got:?}");
    assert_eq!(so.listed_bytes(), 4096);
    so.check().unwrap();
}

/// A stream whose `id` is fixed, or, once `flips` is set, alternates
/// between 1 and 2 from call to call: a safe `Stream` that says different
/// things within one call of the layer.
#[derive(Clone, Debug)]
struct Flaky {
    id: Rc<core::cell::Cell<u64>>,
    flips: bool,
}

impl Stream for Flaky {
    type Event = ();
    fn id(&self) -> u64 {
        let id = self.id.get();
        if self.flips {
            self.id.set(3 - id);
        }
        id
    }
    fn record(&self) -> Result<()> {
        Ok(())
    }
    fn wait(&self, _: &()) -> Result<()> {
        Ok(())
    }
    fn query(&self, _: &()) -> Result<bool> {
        Ok(true)
    }
    fn synchronize(&self) -> Result<()> {
        Ok(())
    }
}

#[test]
fn a_stream_whose_id_changes_within_a_call_gets_a_checked_block() {
    let pool = CoalescingPool::new(BumpUpstream::new(1 << 30));
    let mut so: StreamOrdered<_, Flaky> = StreamOrdered::new(pool);
    let on = |id| Flaky { id: Rc::new(core::cell::Cell::new(id)), flips: false };
    // Stream 1 lists a 500-byte block, stream 2 a 257-byte one aligned to
    // 256 only: both in the 512-byte bucket, at the same place.
    let fits = so.allocate(req(500), &on(1)).unwrap();
    let short = so.allocate(Request::aligned(257, 256).unwrap(), &on(2)).unwrap();
    so.deallocate(fits, &on(1)).unwrap();
    so.deallocate(short, &on(2)).unwrap();
    // Asked on a stream that says 1, then 2: the block found on 1's list is
    // the one taken.
    let got = so.allocate(req(500), &Flaky { id: Rc::new(core::cell::Cell::new(1)), flips: true }).unwrap();
    assert_eq!((got.addr(), got.size()), (fits.addr(), 500));
    so.check().unwrap();
}

#[test]
fn randomized_with_unit_stream() {
    let mut rng = crate::testing::SplitMix64::new(7);
    let mut so = StreamOrdered::<_, ()>::new(CoalescingPool::new(BumpUpstream::new(1 << 30)));
    let mut live = crate::check::LiveBlocks::new();
    let mut blocks = Vec::new();
    for _ in 0..crate::testing::steps(5_000) {
        if blocks.is_empty() || rng.below(2) == 0 {
            let r = req(rng.below(1 << 14));
            let b = so.allocate(r, &()).unwrap();
            live.insert(b, r).unwrap();
            blocks.push(b);
        } else {
            let b = blocks.swap_remove(rng.below(blocks.len() as u64) as usize);
            live.remove(&b).unwrap();
            so.deallocate(b, &()).unwrap();
        }
        if rng.below(64) == 0 {
            so.reclaim().unwrap();
        }
        so.check().unwrap();
    }
}

/// A free whose stream's `id` panics changes nothing: the slot was retired
/// before it, and its inner block lost for good.
#[test]
fn a_free_whose_streams_id_panics_changes_nothing() {
    use crate::testing::PanickingStream;
    let mut so = StreamOrdered::<_, PanickingStream>::new(CoalescingPool::new(BumpUpstream::new(1 << 30)));
    let s = PanickingStream::new(1);
    let a = so.allocate(Request::new(1000).unwrap(), &s).unwrap();
    s.panic_in("id", 0);
    let freed = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| so.deallocate(a, &s)));
    assert!(freed.is_err());
    so.check().unwrap();
    so.deallocate(a, &s).unwrap();
    so.check().unwrap();
    assert_eq!((so.live_count(), so.listed_count()), (0, 1), "the block is listed, nothing lost");
}

#[test]
fn a_dropped_layer_gives_its_listed_blocks_back() {
    let up = BumpUpstream::new(1 << 30);
    let log = Rc::new(RefCell::new(StreamLog::default()));
    let a = LoggedStream { id: 1, log };
    let mut so = StreamOrdered::<_, LoggedStream>::new(CoalescingPool::new(&up));
    let kept = so.allocate(req(1000), &a).unwrap();
    let b = so.allocate(req(5000), &a).unwrap();
    so.deallocate(b, &a).unwrap();
    assert_eq!(so.listed_bytes(), 5120);
    // A live block keeps its chunk; free everything and the chunk goes back.
    so.deallocate(kept, &a).unwrap();
    drop(so);
    assert_eq!(up.usage().held, 0, "every block was freed, yet the upstream still holds the chunk");
}

#[test]
fn a_reclaim_whose_inner_free_panics_keeps_no_empty_bucket() {
    let up = BumpUpstream::new(1 << 30);
    let log = Rc::new(RefCell::new(StreamLog::default()));
    let a = LoggedStream { id: 1, log: log.clone() };
    let mut so = StreamOrdered::<_, LoggedStream>::new(&up);
    let (x, y) = (so.allocate(req(1000), &a).unwrap(), so.allocate(req(5000), &a).unwrap());
    so.deallocate(x, &a).unwrap();
    so.deallocate(y, &a).unwrap();
    so.reclaim().unwrap(); // fences both buckets
    log.borrow_mut().complete = true;
    up.panic_in("deallocate", 1); // the second bucket's free panics
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| so.reclaim()));
    assert!(r.is_err());
    so.check().unwrap();
    // The block whose free panicked is off the list (an inner free may take
    // it and then panic): the upstream still holds it, nothing serves it.
    assert_eq!((so.listed_bytes(), up.usage().held), (0, 5120));
    assert_eq!(so.reclaim().unwrap(), 0);
}

/// An inner algorithm whose free takes the block back and then panics,
/// when told.
struct TakesThenPanics {
    pool: CoalescingPool<BumpUpstream>,
    panic_next_free: Rc<core::cell::Cell<bool>>,
}

impl MemoryResourceMut<()> for TakesThenPanics {
    fn allocate(&mut self, request: Request, s: &()) -> Result<Block> {
        self.pool.allocate(request, s)
    }
    fn deallocate(&mut self, block: Block, s: &()) -> Result<()> {
        self.pool.deallocate(block, s)?;
        assert!(!self.panic_next_free.replace(false), "after taking the block back");
        Ok(())
    }
}

impl Inspect for TakesThenPanics {
    fn usage(&self) -> crate::Usage {
        self.pool.usage()
    }
    fn check(&self) -> core::result::Result<(), crate::check::Violation> {
        self.pool.check()
    }
}

/// A block whose inner free (a reclaim's, or a merge's) takes it back and
/// then panics is served by the inner algorithm only, not from the list as
/// well. (Before, it was popped off its list after the free: still listed,
/// the stream's next allocation took it from the list and the one after
/// from the inner algorithm, two live blocks at one address.)
#[test]
fn a_block_the_inner_takes_back_before_its_free_panics_is_not_served_twice() {
    for merge in [false, true] {
        let log = Rc::new(RefCell::new(StreamLog::default()));
        let a = LoggedStream { id: 1, log: log.clone() };
        let flag = Rc::new(core::cell::Cell::new(false));
        let pool = CoalescingPool::new(BumpUpstream::new(1 << 30));
        let mut so =
            StreamOrdered::<_, LoggedStream>::new(TakesThenPanics { pool, panic_next_free: flag.clone() });
        let x = so.allocate(req(1000), &a).unwrap();
        so.deallocate(x, &a).unwrap();
        so.reclaim().unwrap(); // records the fence
        log.borrow_mut().complete = true;
        flag.set(true);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match merge {
            false => so.reclaim().map(drop),
            true => so.synchronize_and_merge(),
        }));
        assert!(r.is_err(), "{merge}");
        assert_eq!(so.listed_bytes(), 0, "{merge}");
        so.check().unwrap();
        let (y, z) = (so.allocate(req(1000), &a).unwrap(), so.allocate(req(1000), &a).unwrap());
        assert_ne!(y.addr(), z.addr(), "{merge}: the same memory handed out twice");
        so.check().unwrap();
    }
}

/// An inner algorithm outside the contract: it hands out the block it is
/// given, whatever the request, and counts frees.
struct GivenBlock {
    block: Block,
    frees: u32,
}

impl MemoryResourceMut<()> for GivenBlock {
    fn allocate(&mut self, _: Request, _: &()) -> Result<Block> {
        Ok(self.block)
    }
    fn deallocate(&mut self, _: Block, _: &()) -> Result<()> {
        self.frees += 1;
        Ok(())
    }
}

impl Inspect for GivenBlock {
    fn usage(&self) -> crate::Usage {
        crate::Usage::leaf(0, 0)
    }
    fn check(&self) -> core::result::Result<(), crate::check::Violation> {
        Ok(())
    }
}

/// An inner block longer than asked is kept whole and counted by its
/// footprint; one whose footprint would end past the last address (or
/// take the bytes held past `u64::MAX`) goes back as an error. Before, its
/// footprint overflowed inside the layer after the slot was taken: a panic
/// in a debug build, a block counted as 0 bytes in a release build.
#[test]
fn an_inner_block_near_the_top_of_its_size_range() {
    let exact = |so: &StreamOrdered<GivenBlock, ()>, live: u64, listed: u64| {
        so.check().unwrap();
        assert_eq!((so.usage().used, so.listed_bytes(), so.held_bytes()), (live, listed, live + listed));
    };

    let mut so =
        StreamOrdered::<_, ()>::new(GivenBlock { block: Block::new(0, u64::MAX - 100, 7), frees: 0 });
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| so.allocate(req(256), &())));
    const WHAT: &str = "its footprint, with the bytes held, past the last address";
    let err = Error::UpstreamMisbehaved { addr: 0, size: u64::MAX - 100, what: WHAT };
    assert_eq!(r.expect("allocate did not panic"), Err(err));
    assert_eq!((so.live_count(), so.inner().frees), (0, 1), "given back");
    exact(&so, 0, 0);

    // The longest footprint that ends at an address serves, and is counted.
    let longest = u64::MAX - 255;
    so.inner.block = Block::new(0, longest - 200, 7);
    let a = so.allocate(req(256), &()).unwrap();
    assert_eq!((a.addr(), a.size()), (0, 256));
    exact(&so, longest, 0);
    // Then another over it (an inner outside the contract) would take the
    // bytes held past `u64::MAX`.
    so.inner.block = Block::new(1 << 20, 256, 8);
    let err = Error::UpstreamMisbehaved { addr: 1 << 20, size: 256, what: WHAT };
    assert_eq!(so.allocate(req(256), &()), Err(err));
    assert_eq!(so.inner().frees, 2);
    exact(&so, longest, 0);
    so.deallocate(a, &()).unwrap();
    exact(&so, 0, longest);
}

/// An inner block whose asked bytes run past the last address goes back to
/// the inner algorithm as its fault (`UpstreamMisbehaved`), nothing
/// counted, and the layer serves on. Before, it was `InvalidSize`, as if
/// the request's size were wrong.
#[test]
fn an_inner_block_running_past_the_last_address_is_the_inners_fault() {
    let top = u64::MAX - 255;
    let mut so = StreamOrdered::<_, ()>::new(GivenBlock { block: Block::new(top, 4096, 7), frees: 0 });
    let err = Error::UpstreamMisbehaved { addr: top, size: 4096, what: "running past the last address" };
    assert_eq!(so.allocate(req(4096), &()), Err(err));
    assert_eq!((so.live_count(), so.held_bytes(), so.inner().frees), (0, 0, 1), "given back");
    so.check().unwrap();
    so.inner.block = Block::new(1 << 20, 4096, 7);
    let a = so.allocate(req(4096), &()).unwrap();
    assert_eq!((a.addr(), so.held_bytes()), (1 << 20, 4096));
    so.deallocate(a, &()).unwrap();
    so.check().unwrap();
}

/// An inner block not aligned as the request asks goes back to the inner
/// algorithm as an error, nothing counted, and the layer serves on. Before,
/// it was handed out as the request's block.
#[test]
fn an_inner_block_not_aligned_as_asked_goes_back_as_an_error() {
    // A block aligned to 256 only.
    let mut so =
        StreamOrdered::<_, ()>::new(GivenBlock { block: Block::new((1 << 20) + 256, 4096, 7), frees: 0 });
    let err = Error::UpstreamMisbehaved { addr: (1 << 20) + 256, size: 4096, what: "not aligned as asked" };
    assert_eq!(so.allocate(Request::aligned(4096, 4096).unwrap(), &()), Err(err));
    assert_eq!((so.live_count(), so.held_bytes(), so.inner().frees), (0, 0, 1), "given back");
    so.check().unwrap();
    // A request the block answers is served.
    let a = so.allocate(req(4096), &()).unwrap();
    assert_eq!((a.addr(), so.held_bytes()), ((1 << 20) + 256, 4096));
    so.deallocate(a, &()).unwrap();
    so.check().unwrap();
}

/// As `Stream::id` says: one read per allocation, on each of its paths
/// (the inner algorithm with no list, the own list, another stream's list,
/// the inner algorithm past the lists), and one per free. Before, the
/// slow path read it again to leave the caller's list out.
#[test]
fn each_call_reads_its_streams_id_once() {
    let (mut so, a, b, log) = setup(None);
    let reads_in = |call: &mut dyn FnMut()| {
        let before = log.borrow().ids;
        call();
        log.borrow().ids - before
    };
    let (mut x, mut own, mut stolen, mut past) = (Block::EMPTY, Block::EMPTY, Block::EMPTY, Block::EMPTY);
    assert_eq!(reads_in(&mut || x = so.allocate(req(1000), &a).unwrap()), 1, "no list");
    assert_eq!(reads_in(&mut || so.deallocate(x, &a).unwrap()), 1, "a free");
    assert_eq!(reads_in(&mut || own = so.allocate(req(1000), &a).unwrap()), 1, "the own list");
    assert_eq!(own.addr(), x.addr());
    so.deallocate(own, &a).unwrap();
    assert_eq!(reads_in(&mut || stolen = so.allocate(req(1000), &b).unwrap()), 1, "another stream's list");
    assert_eq!(stolen.addr(), x.addr());
    let y = so.allocate(req(1000), &a).unwrap();
    so.deallocate(y, &a).unwrap();
    assert_eq!(reads_in(&mut || past = so.allocate(req(4000), &b).unwrap()), 1, "past the lists");
    assert_ne!(past.addr(), y.addr(), "the listed block is too short");
    assert_eq!(so.stats().steals, 1);
    so.check().unwrap();
}

/// An inner algorithm that refuses a listed block back (outside its
/// contract): the block stays listed, serving as before, and the blocks
/// behind it in its bucket go back all the same; no later call stops at it.
#[test]
fn a_block_the_inner_refuses_back_stays_listed_and_the_others_go_back() {
    let up = BumpUpstream::new(1 << 30);
    let log = Rc::new(RefCell::new(StreamLog::default()));
    let a = LoggedStream { id: 1, log: log.clone() };
    let mut so = StreamOrdered::<_, LoggedStream>::new(&up);
    let (x, y) = (so.allocate(req(1000), &a).unwrap(), so.allocate(req(1000), &a).unwrap());
    so.deallocate(x, &a).unwrap(); // the front of the bucket
    so.deallocate(y, &a).unwrap();
    so.reclaim().unwrap(); // fences both
    log.borrow_mut().complete = true;
    up.refuse_free_at(x.addr());
    assert!(matches!(so.reclaim(), Err(Error::Backend { .. })));
    so.check().unwrap();
    assert_eq!((so.listed_bytes(), so.listed_count(), up.usage().held), (1024, 1, 1024), "y went back");
    assert_eq!((so.stats().reclaimed, so.stats().refused), (1, 1));
    // Refused again at the next reclaim, then taken once the inner will.
    assert!(matches!(so.reclaim(), Err(Error::Backend { .. })));
    up.refuse_free_at(0);
    assert_eq!(so.reclaim().unwrap(), 1);
    assert_eq!((so.listed_bytes(), up.usage().held, so.stats().refused), (0, 0, 2));
    so.check().unwrap();
}

/// The last resort goes on past a block the inner refuses back: the others
/// go back and the allocation is served from the room they leave.
#[test]
fn the_last_resort_goes_on_past_a_block_the_inner_refuses_back() {
    let up = BumpUpstream::new(2048);
    let log = Rc::new(RefCell::new(StreamLog::default()));
    let a = LoggedStream { id: 1, log: log.clone() };
    let mut so = StreamOrdered::<_, LoggedStream>::new(&up);
    let (x, y) = (so.allocate(req(1024), &a).unwrap(), so.allocate(req(1024), &a).unwrap());
    so.deallocate(x, &a).unwrap();
    so.deallocate(y, &a).unwrap();
    up.refuse_free_at(x.addr());
    // 256 bytes: no listed block serves it, the inner is full.
    let z = so.allocate(req(256), &a).unwrap();
    so.check().unwrap();
    assert_eq!((so.listed_bytes(), so.stats().last_resorts, so.stats().refused), (1024, 1, 1));
    assert_eq!(up.usage().held, 1024 + 256);
    // The refused block still serves its stream.
    assert_eq!(so.allocate(req(1024), &a).unwrap().addr(), x.addr());
    so.deallocate(z, &a).unwrap();
    so.check().unwrap();
}

/// A live block longer than its inner block is found, also within the
/// inner block's footprint (only its own size is promised to be memory:
/// `find` and `inner_allocate` hold to that).
#[test]
fn the_checker_finds_a_live_block_longer_than_its_inner_block() {
    let (mut so, a, _, _) = setup(None);
    let b = so.allocate(req(1000), &a).unwrap();
    so.check_layer().unwrap();
    let i = so.slots.iter().position(|s| s.live).unwrap();
    assert_eq!(so.slots[i].inner.size(), 1000);
    so.slots[i].size = 1020;
    assert_eq!(so.check_layer().unwrap_err().what(), "live block larger than its inner block, or empty");
    so.slots[i].size = 1000;
    so.deallocate(b, &a).unwrap();
    so.check_layer().unwrap();
}
