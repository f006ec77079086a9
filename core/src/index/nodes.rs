//! The node storage of the index: slots, their links, the vacant list and
//! the retirement of slots whose generations are used up.

use super::CoalescingIndex;
use crate::storage::Storage;
use crate::{Error, Result};

/// "No node" in links and list heads.
pub(super) const NONE: u32 = u32::MAX;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum State {
    /// A free range, in the bin list of its size class.
    Free,
    /// A range handed out.
    Used,
    /// A slot on the vacant list, not describing any range.
    Vacant,
    /// A slot whose generation is used up: never handed out or reused
    /// again, so no tag of it can match. A region's first node retired this
    /// way stays as the region's zero-length *header*: its `next_phys` leads
    /// to the region's first range, so the region keeps its handle.
    Retired,
}

/// One range of the index: free, used, or a vacant slot. Public only so that
/// the storage type can be named; its fields are private.
#[derive(Clone, Copy, Debug)]
pub struct Node {
    pub(super) addr: u64,
    pub(super) size: u64,
    /// Neighbour at the next lower address in the same region, or `NONE`.
    pub(super) prev_phys: u32,
    /// Neighbour at the next higher address in the same region, or `NONE`.
    pub(super) next_phys: u32,
    /// Bin list links (free nodes), vacant-list link (`next_free`, vacant
    /// nodes), or, on a used node, the bytes its allocation was rounded up
    /// by, low and high halves ([`rounding`](Node::rounding)):
    /// the size asked for is `size` less that, and a free must state it.
    pub(super) prev_free: u32,
    pub(super) next_free: u32,
    /// Bumped on every allocation, never wrapped: a slot whose generation
    /// is used up is retired (see `relocate`), so a tag matches only the one
    /// allocation it was made for.
    pub(super) gen: u32,
    /// The bin list holding the node while it is free (fits in the padding
    /// after `state`; saves recomputing the class on removal).
    pub(super) bin: u16,
    pub(super) state: State,
}

impl Default for Node {
    /// A vacant slot linked to nothing: a link of 0 would name slot 0.
    fn default() -> Self {
        Node {
            addr: 0,
            size: 0,
            prev_phys: NONE,
            next_phys: NONE,
            prev_free: NONE,
            next_free: NONE,
            gen: 0,
            bin: 0,
            state: State::Vacant,
        }
    }
}

impl Node {
    /// The bytes a used node's allocation was rounded up by.
    #[inline(always)]
    pub(super) fn rounding(&self) -> u64 {
        self.prev_free as u64 | (self.next_free as u64) << 32
    }

    /// Notes the rounding of a used node (see [`rounding`](Self::rounding)).
    #[inline(always)]
    pub(super) fn set_rounding(&mut self, rounding: u64) {
        (self.prev_free, self.next_free) = (rounding as u32, (rounding >> 32) as u32);
    }
}

impl<N: Storage<Node>> CoalescingIndex<N> {
    /// Node `i`. Reading `NONE` panics before anything changes: it is what
    /// a list cut short by a panic caught mid-update would lead to.
    #[inline]
    pub(super) fn node(&self, i: u32) -> &Node {
        if i == NONE {
            read_of_none();
        }
        // SAFETY: `i` is in range, from what the index ever stores, whole
        // lists or not. Every `i` that reaches here is a list head, a link
        // read from a node, the vacant-list head, or a slot index that the
        // public entry points checked against `nodes.len()` (`resolve`,
        // `allocate_in`, `region_start`: `remove_range`, `is_region_free`, the
        // region walks).
        // The index stores in those words only `NONE` or the index of a slot
        // that exists (`reserve_nodes` pushes before it links, and stops
        // below `NONE`), but for a used node's `prev_free` and `next_free`,
        // which hold its rounding (`set_rounding`): links are read only from
        // nodes on a bin list or the vacant list, which are free or vacant
        // (`insert_free` and `make_vacant` set the state with the links, and
        // every caller of `remove_free` found the node free: a bin list's,
        // or checked `State::Free`), and a used node's rounding is never
        // read as a link. Slots are never removed: the index only calls
        // `try_push`, and the `unsafe trait Storage` promises that the length
        // changes only there (by one, on `Ok`) and that the elements keep
        // what was written. So a stored index other than `NONE` is in range
        // for the index's life, however an update was cut short; `NONE` was
        // refused above.
        unsafe { self.nodes.get_unchecked(i as usize) }
    }

    /// As [`node`](Self::node), to write.
    #[inline]
    pub(super) fn node_mut(&mut self, i: u32) -> &mut Node {
        if i == NONE {
            read_of_none();
        }
        // SAFETY: as in `node`: `i` is a stored index or a checked one, and
        // not `NONE`.
        unsafe { self.nodes.get_unchecked_mut(i as usize) }
    }

    /// The link `field` picks out of node `i`, or a scratch word when `i` is
    /// `NONE`: list and neighbour updates then store without a branch that
    /// random sizes would mispredict.
    #[inline(always)]
    pub(super) fn link_of(&mut self, i: u32, field: fn(&mut Node) -> &mut u32) -> &mut u32 {
        if i != NONE {
            // SAFETY: as in `node`: a stored index, not `NONE`.
            field(unsafe { self.nodes.get_unchecked_mut(i as usize) })
        } else {
            &mut self.scratch
        }
    }

    /// Makes sure `n` node slots can be had without failing.
    pub(super) fn reserve_nodes(&mut self, n: u32) -> Result<()> {
        let mut have = 0;
        let mut v = self.vacant;
        while v != NONE && have < n {
            have += 1;
            v = self.node(v).next_free;
        }
        while have < n {
            let i = self.nodes.len() as u32;
            if i == NONE || self.nodes.try_push(Node::default()).is_err() {
                return Err(Error::CapacityExhausted { capacity: self.nodes.max_len() });
            }
            let vacant = self.vacant;
            let node = self.node_mut(i);
            node.next_free = vacant;
            self.vacant = i;
            self.vacant_len += 1;
            have += 1;
        }
        Ok(())
    }

    /// Makes sure `n` more ranges can be made (by splits or
    /// [`add_range`](Self::add_range)) without running out of metadata: a
    /// caller that must not fail halfway (a pool about to take a chunk from
    /// upstream) asks first.
    ///
    /// # Errors
    ///
    /// [`Error::CapacityExhausted`] if the storage cannot hold `n` more.
    ///
    /// # Examples
    ///
    /// ```
    /// use memres_core::index::{CoalescingIndex, Node};
    /// use memres_core::storage::ArrayStorage;
    /// let mut index: CoalescingIndex<ArrayStorage<Node, 2>> = CoalescingIndex::new(256);
    /// assert!(index.reserve(2).is_ok());
    /// assert!(index.reserve(3).is_err());
    /// ```
    pub fn reserve(&mut self, n: u32) -> Result<()> {
        self.reserve_nodes(n)
    }

    /// Takes a vacant slot; `reserve_nodes` must have made sure there is one.
    /// Without one, the read of `NONE` panics before anything changes.
    #[inline]
    pub(super) fn take_vacant(&mut self) -> u32 {
        let i = self.vacant;
        self.vacant = self.node(i).next_free;
        self.vacant_len -= 1;
        i
    }

    /// Puts slot `i` on the vacant list, or retires it if its generation is
    /// used up: a slot taken from the vacant list must be carvable without
    /// moving (`carve` counts on it to stay within two slots).
    #[inline]
    pub(super) fn make_vacant(&mut self, i: u32) {
        if self.node(i).gen == u32::MAX {
            self.retire(i);
            return;
        }
        let vacant = self.vacant;
        let node = self.node_mut(i);
        node.state = State::Vacant;
        node.next_free = vacant;
        node.prev_free = NONE;
        self.vacant = i;
        self.vacant_len += 1;
    }

    /// Takes slot `i` out of use for good.
    #[cold]
    pub(super) fn retire(&mut self, i: u32) {
        let node = self.node_mut(i);
        *node = Node {
            state: State::Retired,
            prev_phys: NONE,
            next_phys: NONE,
            prev_free: NONE,
            next_free: NONE,
            size: 0,
            ..*node
        };
    }

    /// Moves free node `i` (in no list, its generation used up) to a vacant
    /// slot and retires `i`, so that no tag of `i` ever matches again: the
    /// price is one slot per 2^32 allocations of one slot. Returns the new
    /// slot. A region's first node stays as the region's header (see
    /// [`State::Retired`]).
    #[cold]
    pub(super) fn relocate(&mut self, i: u32) -> u32 {
        let j = self.take_vacant();
        let n = *self.node(i);
        let gen = self.node(j).gen;
        *self.node_mut(j) = Node { gen, ..n };
        *self.link_of(n.next_phys, |m| &mut m.prev_phys) = j;
        self.retire(i);
        if n.prev_phys == NONE {
            self.node_mut(j).prev_phys = i;
            self.node_mut(i).next_phys = j;
        } else {
            self.node_mut(n.prev_phys).next_phys = j;
        }
        j
    }

    /// The node where the region whose handle is `first` starts: `first`
    /// itself, or the node after it if `first` is a retired header.
    #[inline]
    pub(super) fn skip_header(&self, first: u32) -> u32 {
        match self.nodes.get(first as usize) {
            Some(n) if n.state == State::Retired => n.next_phys,
            _ => first,
        }
    }
}

#[cfg(test)]
impl<N: Storage<Node>> CoalescingIndex<N> {
    /// Sets slot `i`'s generation, as 2^32 allocations would: for the tests
    /// of what happens at the end of the generations.
    pub(crate) fn set_generation(&mut self, i: u32, gen: u32) {
        self.node_mut(i).gen = gen;
    }
}

/// A list walked to its end and one step further: only a list cut short by
/// a panic caught mid-update (a caller's closure) leads here.
#[cold]
#[inline(never)]
fn read_of_none() -> ! {
    panic!("CoalescingIndex: a list ends early (the index was left mid-update by a panic)")
}
