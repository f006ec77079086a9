use super::*;
use crate::{SimAddressSpace, SimWorld};

#[test]
fn work_of_another_world_is_checked_in_its_own_world() {
    // The record kept the bare id, looked up in one world given to the
    // checker: another world's default stream was taken for that world's
    // (id 0 in both), its other streams for none.
    let (w1, w2) = (SimWorld::new(), SimWorld::new());
    let space = UnmapChecked::new(SimAddressSpace::new(1 << 30, 2 << 20).unwrap());
    let r = space.reserve(2 << 20).unwrap();
    // Work of w2's default stream still to run: w1's being observed
    // tells nothing of it.
    space.commit(r).unwrap();
    let other_default = w2.default_stream();
    other_default.enqueue();
    space.used(r, &other_default);
    // Ordered on w1's default stream, whose work is done (the space's
    // decommit synchronizes it).
    let here = w1.default_stream();
    here.enqueue();
    space.decommit(r, &here).unwrap();
    assert_eq!(space.early_unmaps(), 1);
    // Work of a stream of w2 that the host observed done.
    space.commit(r).unwrap();
    let s = w2.stream();
    s.enqueue();
    space.used(r, &s);
    w2.synchronize();
    space.decommit(r, &here).unwrap();
    assert_eq!(space.early_unmaps(), 1);
}

/// A space that lists which of its decommits were called.
struct Listing {
    space: SimAddressSpace,
    calls: std::cell::RefCell<Vec<&'static str>>,
}

impl ReservableSpace for Listing {
    fn granule(&self) -> u64 {
        self.space.granule()
    }
    fn reserve(&self, len: u64) -> Result<Range> {
        self.space.reserve(len)
    }
    fn release(&self, range: Range) -> Result<()> {
        self.space.release(range)
    }
    fn commit(&self, range: Range) -> Result<()> {
        self.space.commit(range)
    }
    fn decommit<S: Stream + ?Sized>(&self, range: Range, stream: &S) -> Result<()> {
        self.calls.borrow_mut().push("decommit");
        self.space.decommit(range, stream)
    }
    fn decommit_for_commit<S: Stream + ?Sized>(&self, range: Range, stream: &S) -> Result<()> {
        self.calls.borrow_mut().push("decommit_for_commit");
        self.space.decommit(range, stream)
    }
    fn release_kept(&self) {
        self.calls.borrow_mut().push("release_kept");
    }
}

#[test]
fn a_decommit_for_a_commit_reaches_the_space_and_is_checked() {
    // The checker forwarded neither `decommit_for_commit` nor
    // `release_kept`: the space's plain `decommit` ran instead, so a space
    // that keeps memory for the commits to come ran another path checked
    // than unchecked.
    let world = SimWorld::new();
    let (a, b) = (world.non_blocking_stream(), world.non_blocking_stream());
    let inner = Listing { space: SimAddressSpace::new(1 << 30, 2 << 20).unwrap(), calls: Default::default() };
    let space = UnmapChecked::new(inner);
    let r = space.reserve(4 << 20).unwrap();
    space.commit(r).unwrap();
    a.enqueue();
    space.used(r, &a);
    space.decommit_for_commit(r, &b).unwrap(); // `b` never waited on `a`
    space.release_kept();
    assert_eq!(*space.inner().calls.borrow(), ["decommit_for_commit", "release_kept"]);
    assert_eq!((space.early_unmaps(), space.inner().space.committed_bytes()), (1, 0));
}

/// A space whose decommits take the first granule of their range and
/// then fail, unable to map it again.
struct HalfWay(SimAddressSpace);

impl ReservableSpace for HalfWay {
    fn granule(&self) -> u64 {
        self.0.granule()
    }
    fn reserve(&self, len: u64) -> Result<Range> {
        self.0.reserve(len)
    }
    fn release(&self, range: Range) -> Result<()> {
        self.0.release(range)
    }
    fn commit(&self, range: Range) -> Result<()> {
        self.0.commit(range)
    }
    fn decommit<S: Stream + ?Sized>(&self, range: Range, stream: &S) -> Result<()> {
        self.0.decommit(Range::new(range.start(), self.granule()).unwrap(), stream)?;
        Err(memres_core::Error::Backend { code: 1, what: memres_core::vmem::DECOMMITTED_IN_PART })
    }
}

#[test]
fn a_decommit_that_failed_half_way_is_checked_for_what_it_took() {
    // A decommit that failed was not checked, though one that failed half
    // way had taken part of its range: an early unmap there went untold.
    let world = SimWorld::new();
    let (a, b) = (world.non_blocking_stream(), world.non_blocking_stream());
    let space = UnmapChecked::new(HalfWay(SimAddressSpace::new(1 << 30, 2 << 20).unwrap()));
    let r = space.reserve(4 << 20).unwrap();
    space.commit(r).unwrap();
    a.enqueue();
    space.used(r, &a);
    let e = space.decommit(r, &b).unwrap_err(); // `b` never waited on `a`
    assert!(
        matches!(e, memres_core::Error::Backend { what, .. } if what == memres_core::vmem::DECOMMITTED_IN_PART)
    );
    assert_eq!((space.early_unmaps(), space.inner().0.committed_bytes()), (1, 2 << 20));
}
