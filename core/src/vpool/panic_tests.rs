//! The virtual pool over a space whose code panics mid-call or decommits
//! only part of a range: the pool's figures stay those of the space, its
//! checker holds, and it stays usable.

extern crate std;

use super::tests::*;
use super::*;
use crate::testing::PanicTrap;
use crate::vmem::CountingSpace;
use core::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// A [`CountingSpace`] whose chosen method panics once, after a number of
/// calls of it pass (before it does anything), and whose next decommit can
/// be made to decommit only its first granules and fail.
struct Panicky<'a> {
    inner: &'a CountingSpace,
    trap: PanicTrap,
    /// Granules the next decommit takes before it fails, if set.
    in_part: Cell<Option<u64>>,
    /// Whether the method that panics does its work first (outside the
    /// trait's contract: it leaves its range changed).
    takes_first: Cell<bool>,
}

impl<'a> Panicky<'a> {
    fn new(inner: &'a CountingSpace) -> Self {
        Panicky { inner, trap: PanicTrap::new(), in_part: Cell::new(None), takes_first: Cell::new(false) }
    }

    /// `method` (`"commit"`, `"decommit"` (either kind), `"releasable"`,
    /// `"release_kept"`) panics once after `skip` calls of it pass.
    fn panic_in(&self, method: &'static str, skip: u32) {
        self.trap.arm(method, skip);
    }

    fn call(&self, method: &'static str) {
        self.trap.spring("Panicky", method);
    }

    /// `work`, `method`'s, with the trap before it, or after it where the
    /// method takes first.
    fn around(&self, method: &'static str, work: impl FnOnce() -> Result<()>) -> Result<()> {
        if !self.takes_first.get() {
            self.call(method);
            return work();
        }
        let done = work();
        self.call(method);
        done
    }

    fn decommit_inner(&self, range: Range) -> Result<()> {
        self.around("decommit", || {
            if let Some(n) = self.in_part.take() {
                let part = Range::new(range.start(), n * self.inner.granule()).unwrap();
                self.inner.decommit(part, &()).unwrap();
                return Err(Error::Backend { code: 1, what: crate::vmem::DECOMMITTED_IN_PART });
            }
            self.inner.decommit(range, &())
        })
    }
}

impl ReservableSpace for Panicky<'_> {
    fn granule(&self) -> u64 {
        self.inner.granule()
    }
    fn reserve(&self, len: u64) -> Result<Range> {
        self.inner.reserve(len)
    }
    fn release(&self, range: Range) -> Result<()> {
        self.inner.release(range)
    }
    fn commit(&self, range: Range) -> Result<()> {
        self.around("commit", || self.inner.commit(range))
    }
    fn decommit<S: Stream + ?Sized>(&self, range: Range, _: &S) -> Result<()> {
        self.decommit_inner(range)
    }
    fn decommit_for_commit<S: Stream + ?Sized>(&self, range: Range, _: &S) -> Result<()> {
        self.decommit_inner(range)
    }
    fn release_kept(&self) {
        self.call("release_kept");
    }
    fn releasable(&self, range: Range, want: u64) -> Option<Range> {
        self.call("releasable");
        self.inner.releasable(range, want)
    }
}

/// What every test asserts after a panic or a partial decommit: the
/// checker holds, the pool's committed bytes are the space's, and every
/// block the pool hands out lies over committed memory.
fn exact(p: &VirtualPool<&Panicky<'_>>, space: &CountingSpace) {
    p.check().unwrap();
    assert_eq!(p.usage().held, space.committed_bytes(), "the pool's committed bytes are not the space's");
}

/// Allocates `size` bytes, checks that the block lies over committed
/// memory, and returns it.
fn mapped(p: &mut VirtualPool<&Panicky<'_>>, space: &CountingSpace, size: u64) -> Block {
    let b = p.allocate(req(size), &()).unwrap();
    assert!(space.is_committed(granules_of(&b, MIB)), "a block over unmapped memory");
    exact(p, space);
    b
}

/// Frees `live`, trims, and checks that everything went back.
fn give_all_back(mut p: VirtualPool<&Panicky<'_>>, space: &CountingSpace, live: &[Block]) {
    for &b in live {
        p.deallocate(b, &()).unwrap();
        exact(&p, space);
    }
    p.trim(&()).unwrap();
    assert_eq!((p.usage().used, p.usage().held, space.committed_bytes()), (0, 0, 0));
    exact(&p, space);
    drop(p);
    assert_eq!(space.reservation_count(), 0);
}

/// Granule 1 Idle between Uncommitted granules 0 and 2, granule 3 held by
/// the returned block: a block over granules 0..3 needs two commits (as
/// `tests::idle_between_uncommitted`).
fn idle_between<'a>(space: &'a Panicky<'a>) -> (VirtualPool<&'a Panicky<'a>>, Block) {
    let mut p = VirtualPool::with_config(space, VirtualConfig::new(64 * MIB).release_threshold(MIB)).unwrap();
    let [a, b, c] = [0; 3].map(|_| p.allocate(req(MIB), &()).unwrap());
    let anchor = p.allocate(req(256), &()).unwrap();
    p.deallocate(a, &()).unwrap();
    p.trim(&()).unwrap();
    p.deallocate(c, &()).unwrap();
    p.deallocate(b, &()).unwrap();
    assert_eq!((p.usage().held, p.idle_bytes()), (2 * MIB, MIB));
    (p, anchor)
}

#[test]
fn a_commit_that_panics_half_way_gives_the_block_back_and_counts_what_it_committed() {
    let space = CountingSpace::new(1 << 30, MIB);
    let panicky = Panicky::new(&space);
    let (mut p, anchor) = idle_between(&panicky);
    let base = p.reservations[0].range.start();
    let used = p.usage().used;
    // Granule 0 is committed, then the commit of granule 2 panics.
    panicky.panic_in("commit", 1);
    let r = catch_unwind(AssertUnwindSafe(|| p.allocate(req(3 * MIB), &())));
    assert!(r.is_err());
    exact(&p, &space);
    // No block live but the anchor; granule 0 counted, Idle. Granule 2, of
    // the commit that panicked, is asked of the space (committed now, as
    // the space may have mapped it before the panic): counted, Idle.
    assert_eq!((p.usage().used, p.usage().held, p.idle_bytes()), (used, 4 * MIB, 3 * MIB));
    assert!(space.is_committed(range(base, 3 * MIB)));
    let b = mapped(&mut p, &space, 3 * MIB);
    assert_eq!(b.addr(), base);
    give_all_back(p, &space, &[b, anchor]);
}

#[test]
fn a_commit_that_fails_half_way_and_whose_undo_panics_counts_what_stays_committed() {
    let space = CountingSpace::new(1 << 30, MIB);
    let panicky = Panicky::new(&space);
    let (mut p, anchor) = idle_between(&panicky);
    let used = p.usage().used;
    // Granule 0 is committed, the commit of granule 2 fails, and the
    // decommit of granule 0 that undoes the first panics: it stays.
    space.fail_nth(2);
    panicky.panic_in("decommit", 0);
    let r = catch_unwind(AssertUnwindSafe(|| p.allocate(req(3 * MIB), &())));
    assert!(r.is_err());
    exact(&p, &space);
    assert_eq!((p.usage().used, p.usage().held), (used, 3 * MIB));
    let b = mapped(&mut p, &space, 3 * MIB);
    give_all_back(p, &space, &[b, anchor]);
}

/// As `idle_tests::a_trim_that_makes_room_for_a_commit_lets_the_space_keep_the_memory_for_it`:
/// `c` (3 MiB) lands in the hole of `a` (4 MiB) and needs 3 fresh
/// granules beyond the limit, so 3 of `b`'s 6 Idle granules are
/// decommitted first (`decommit_for_commit`, then `commit`, then
/// `release_kept`).
fn trims_on_commit<'a>(space: &'a Panicky<'a>) -> (VirtualPool<&'a Panicky<'a>>, Block) {
    let config = VirtualConfig::new(64 * MIB).release_threshold(64 * MIB);
    let mut p = VirtualPool::with_config(space, config).unwrap();
    let a = p.allocate(req(4 * MIB), &()).unwrap();
    let anchor = p.allocate(req(256), &()).unwrap();
    p.deallocate(a, &()).unwrap();
    let b = p.allocate(req(6 * MIB), &()).unwrap();
    p.deallocate(b, &()).unwrap();
    (p, anchor)
}

#[test]
fn a_panic_in_the_trim_or_the_commits_of_an_allocation_gives_the_block_back() {
    for method in ["decommit", "releasable", "commit", "release_kept"] {
        let space = CountingSpace::new(1 << 30, MIB);
        let panicky = Panicky::new(&space);
        let (mut p, anchor) = trims_on_commit(&panicky);
        let before = (p.usage().used, p.reserved_bytes());
        panicky.panic_in(method, 0);
        let r = catch_unwind(AssertUnwindSafe(|| p.allocate(req(3 * MIB), &())));
        assert!(r.is_err(), "{method}");
        exact(&p, &space);
        assert_eq!((p.usage().used, p.reserved_bytes()), before, "{method}");
        let c = mapped(&mut p, &space, 3 * MIB);
        give_all_back(p, &space, &[c, anchor]);
    }
}

#[test]
fn a_panic_in_the_decommit_of_a_free_leaves_the_trim_pending() {
    for method in ["decommit", "releasable"] {
        // Nothing kept: the free of `a` decommits its 4 granules.
        let space = CountingSpace::new(1 << 30, MIB);
        let panicky = Panicky::new(&space);
        let mut p = VirtualPool::with_config(&panicky, VirtualConfig::new(64 * MIB)).unwrap();
        let a = mapped(&mut p, &space, 4 * MIB);
        let anchor = mapped(&mut p, &space, 256);
        panicky.panic_in(method, 0);
        let r = catch_unwind(AssertUnwindSafe(|| p.deallocate(a, &())));
        assert!(r.is_err(), "{method}");
        // The block is free; its granules, still committed, are Idle, and
        // the next call gives them back.
        exact(&p, &space);
        assert_eq!((p.usage().used, p.idle_bytes(), p.usage().held), (256, 4 * MIB, 5 * MIB), "{method}");
        let b = mapped(&mut p, &space, 256);
        give_all_back(p, &space, &[b, anchor]);
    }
}

#[test]
fn a_decommit_that_takes_only_part_of_a_range_is_counted_as_the_space_holds_it() {
    // Nothing kept: the free of `a` asks to decommit its 4 granules; the
    // space takes the first 2, then fails.
    let space = CountingSpace::new(1 << 30, MIB);
    let panicky = Panicky::new(&space);
    let mut p = VirtualPool::with_config(&panicky, VirtualConfig::new(64 * MIB)).unwrap();
    let a = mapped(&mut p, &space, 4 * MIB);
    let anchor = mapped(&mut p, &space, 256);
    panicky.in_part.set(Some(2));
    p.deallocate(a, &()).unwrap();
    exact(&p, &space);
    // The same place again: every granule of it committed.
    let b = mapped(&mut p, &space, 4 * MIB);
    assert_eq!(b.addr(), a.addr());
    give_all_back(p, &space, &[b, anchor]);
}

#[test]
fn an_undo_that_decommits_only_part_of_a_range_is_counted_as_the_space_holds_it() {
    // Granules 0..2 free and Uncommitted, 2 Idle, 3..5 Uncommitted: a block
    // over 0..5 commits 0..2, then 3..5 fails; the undo of 0..2 takes only
    // granule 0.
    let space = CountingSpace::new(1 << 30, MIB);
    let panicky = Panicky::new(&space);
    let mut p =
        VirtualPool::with_config(&panicky, VirtualConfig::new(64 * MIB).release_threshold(MIB)).unwrap();
    let base = p.reservations[0].range.start();
    let a = mapped(&mut p, &space, 2 * MIB);
    let b = mapped(&mut p, &space, MIB);
    let c = mapped(&mut p, &space, 2 * MIB);
    let anchor = mapped(&mut p, &space, 256);
    p.deallocate(a, &()).unwrap();
    p.trim(&()).unwrap();
    p.deallocate(c, &()).unwrap();
    p.trim(&()).unwrap();
    p.deallocate(b, &()).unwrap();
    assert!(space.is_committed(range(base + 2 * MIB, MIB)));
    exact(&p, &space);
    space.fail_nth(2);
    panicky.in_part.set(Some(1));
    assert!(p.allocate(req(5 * MIB), &()).is_err());
    exact(&p, &space);
    let d = mapped(&mut p, &space, 5 * MIB);
    assert_eq!(d.addr(), base);
    give_all_back(p, &space, &[d, anchor]);
}

/// With physical memory full, the granules a decommit kept are told apart
/// from those it took by a commit refused as misuse, not as out of memory:
/// the space says misuse before anything else.
#[test]
fn a_partial_decommit_at_full_physical_memory_is_counted_as_the_space_holds_it() {
    let space = CountingSpace::new(5 * MIB, MIB);
    let panicky = Panicky::new(&space);
    let mut p = VirtualPool::with_config(&panicky, VirtualConfig::new(64 * MIB)).unwrap();
    let a = mapped(&mut p, &space, 4 * MIB);
    let anchor = mapped(&mut p, &space, 256);
    assert_eq!(space.committed_bytes(), 5 * MIB, "physical memory full");
    panicky.in_part.set(Some(2));
    p.deallocate(a, &()).unwrap();
    exact(&p, &space);
    let b = mapped(&mut p, &space, 4 * MIB);
    give_all_back(p, &space, &[b, anchor]);
}

/// A space outside its contract, whose commit or decommit does its work
/// and then panics, in each place the pool calls it: the free's trim, a
/// `trim`, the trim that makes room for a commit, the undo of a failed
/// commit, a commit. The pool asks the space granule by granule what it
/// holds, so its figures stay the space's and the next block lies over
/// mapped memory. Before, it took the range as it was: it counted the
/// granules the space had unmapped and handed a block out over them (the
/// four decommits), or never counted those the space had mapped, and every
/// allocation over them failed as a commit of committed memory (a commit).
#[test]
fn a_space_that_takes_a_range_and_then_panics_leaves_the_pool_counting_what_it_holds() {
    for site in ["the free's trim", "a trim", "the trim on commit", "the undo of a failed commit", "a commit"]
    {
        let space = CountingSpace::new(1 << 30, MIB);
        let panicky = Panicky::new(&space);
        panicky.takes_first.set(true);
        let (mut p, anchor, size) = panic_after_taking(site, &panicky);
        let checked = catch_unwind(AssertUnwindSafe(|| {
            exact(&p, &space);
            let b = mapped(&mut p, &space, size);
            give_all_back(p, &space, &[b, anchor]);
        }));
        assert!(checked.is_ok(), "after a panic in {site}");
    }
}

/// A pool over `s` whose call of the space at `site` panicked, with its
/// anchor block and the size of a block over the granules it touched.
fn panic_after_taking<'a>(site: &str, s: &'a Panicky<'a>) -> (VirtualPool<&'a Panicky<'a>>, Block, u64) {
    let fresh =
        |keep| VirtualPool::with_config(s, VirtualConfig::new(64 * MIB).release_threshold(keep)).unwrap();
    let (mut p, anchor, size) = match site {
        "the free's trim" | "a trim" => {
            let mut p = fresh(if site == "a trim" { 64 * MIB } else { 0 });
            let a = p.allocate(req(4 * MIB), &()).unwrap();
            let anchor = p.allocate(req(256), &()).unwrap();
            if site == "a trim" {
                p.deallocate(a, &()).unwrap();
            }
            s.panic_in("decommit", 0);
            let r = catch_unwind(AssertUnwindSafe(|| match site {
                "a trim" => p.trim(&()).map(drop),
                _ => p.deallocate(a, &()),
            }));
            assert!(r.is_err(), "{site}");
            return (p, anchor, 4 * MIB);
        }
        "the trim on commit" => {
            let (p, anchor) = trims_on_commit(s);
            s.panic_in("decommit", 0);
            (p, anchor, 3 * MIB)
        }
        "the undo of a failed commit" => {
            let (p, anchor) = idle_between(s);
            s.inner.fail_nth(2);
            s.panic_in("decommit", 0);
            (p, anchor, 3 * MIB)
        }
        _ => {
            let mut p = fresh(u64::MAX);
            let anchor = p.allocate(req(256), &()).unwrap();
            s.panic_in("commit", 0);
            (p, anchor, 3 * MIB)
        }
    };
    assert!(catch_unwind(AssertUnwindSafe(|| p.allocate(req(size), &()))).is_err(), "{site}");
    (p, anchor, size)
}
