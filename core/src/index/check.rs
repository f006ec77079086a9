//! The index's invariant checker.

use super::bins::{bin_floor, BIN_COUNT, FL_COUNT, SL_COUNT};
use super::nodes::{Node, State, NONE};
use super::CoalescingIndex;
use crate::check::Violation;
use crate::storage::Storage;

impl<N: Storage<Node>> CoalescingIndex<N> {
    /// A node by a link that [`check`](Self::check) has not verified yet.
    fn checked(&self, i: u32) -> core::result::Result<&Node, Violation> {
        self.nodes.get(i as usize).ok_or(Violation::new("link out of range"))
    }

    /// Checks every invariant of the index and returns the first broken one.
    ///
    /// Checked: links are symmetric; every free node is in the bin of its
    /// size and every bin list holds only free nodes; bitmap bits match
    /// non-empty bins; no two free nodes are neighbours (coalescing); physical
    /// neighbours are contiguous; sizes and addresses are granule multiples;
    /// the byte counters equal the sums over the nodes.
    ///
    /// # Time Complexity
    ///
    /// O(nodes): for tests and fuzzing, not the hot path.
    pub fn check(&self) -> core::result::Result<(), Violation> {
        let g_mask = self.granule() - 1;
        let (mut free, mut used, mut used_n, mut listed) = (0u128, 0u128, 0u64, 0usize);
        for (idx, n) in self.nodes.iter().enumerate() {
            let i = idx as u32;
            match n.state {
                State::Vacant => continue,
                State::Retired => {
                    // A header leads to its region's first range, and back.
                    let header_ok = n.next_phys == NONE
                        || self.checked(n.next_phys).is_ok_and(|m| {
                            m.prev_phys == i
                                && m.addr == n.addr
                                && matches!(m.state, State::Free | State::Used)
                        });
                    if !header_ok || n.prev_phys != NONE || n.size != 0 {
                        return Err(Violation::new("retired slot linked into a region but as its header"));
                    }
                    continue;
                }
                State::Free => free += u128::from(n.size),
                State::Used => {
                    used += u128::from(n.size);
                    used_n += 1;
                }
            }
            if n.size == 0 || n.size & g_mask != 0 || n.addr & g_mask != 0 {
                return Err(Violation::new("node size or address not a granule multiple"));
            }
            if n.next_phys != NONE {
                let m = self.checked(n.next_phys)?;
                if m.prev_phys != i || !matches!(m.state, State::Free | State::Used) {
                    return Err(Violation::new("physical links not symmetric"));
                }
                if n.addr + n.size != m.addr {
                    return Err(Violation::new("physical neighbours not contiguous"));
                }
                if n.state == State::Free && m.state == State::Free {
                    return Err(Violation::new("free neighbours not coalesced"));
                }
            }
            if n.prev_phys != NONE && self.checked(n.prev_phys)?.next_phys != i {
                return Err(Violation::new("physical links not symmetric"));
            }
        }
        for bin in 0..BIN_COUNT {
            let (fl, sl) = (bin / SL_COUNT, bin % SL_COUNT);
            let bit = self.sl_bitmap[fl] >> sl & 1 == 1;
            if bit != (self.heads[bin] != NONE) {
                return Err(Violation::new("second-level bitmap does not match bin"));
            }
            let mut i = self.heads[bin];
            let mut prev = NONE;
            while i != NONE {
                let n = self.checked(i)?;
                if n.state != State::Free {
                    return Err(Violation::new("non-free node in a bin list"));
                }
                if bin_floor(n.size >> self.shift) != bin || n.bin as usize != bin {
                    return Err(Violation::new("free node in the wrong bin"));
                }
                if n.prev_free != prev {
                    return Err(Violation::new("bin list links not symmetric"));
                }
                listed += 1;
                if listed > self.nodes.len() {
                    return Err(Violation::new("cycle in a bin list"));
                }
                prev = i;
                i = n.next_free;
            }
        }
        for fl in 0..FL_COUNT {
            if (self.fl_bitmap >> fl & 1 == 1) != (self.sl_bitmap[fl] != 0) {
                return Err(Violation::new("first-level bitmap does not match its row"));
            }
        }
        let vacant = self.nodes.iter().filter(|n| n.state == State::Vacant).count();
        let (mut i, mut on_list) = (self.vacant, 0usize);
        while i != NONE {
            let n = self.checked(i)?;
            if n.state != State::Vacant {
                return Err(Violation::new("non-vacant node on the vacant list"));
            }
            on_list += 1;
            if on_list > vacant {
                return Err(Violation::new("cycle in the vacant list"));
            }
            i = n.next_free;
        }
        if on_list != vacant || vacant != self.vacant_len as usize {
            return Err(Violation::new("vacant-slot count does not match the nodes"));
        }
        let free_nodes = self.nodes.iter().filter(|n| n.state == State::Free).count();
        if listed != free_nodes {
            return Err(Violation::new("free node missing from the bins"));
        }
        if free != self.free_bytes || used != self.used_bytes || used_n != self.used_count {
            return Err(Violation::new("byte counters do not match the nodes"));
        }
        Ok(())
    }
}
