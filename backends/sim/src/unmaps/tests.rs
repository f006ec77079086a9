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
