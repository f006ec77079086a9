//! [`AddrMap`]: what a layer keeps per live block, found by the block's
//! address in one probe or a few, whatever the number of live blocks.
//!
//! The adaptors that must know every block they handed out ([`Limiting`]'s
//! charges, [`Tracking`]'s entries) look a block up on every free. An
//! ordered map costs a walk down a tree and an allocation per insert; this
//! one costs a multiplication, and its entries sit in one array.
//!
//! ```text
//!  slots: [empty | (addr, value)]   a power of two of them, at most half full
//!  home(addr) = top bits of addr * K          (K odd: every address bit counts)
//!  find:   from home(addr) forward, to addr or to an empty slot
//!  insert: where find stopped; doubles the slots first if they would be
//!          more than half full
//!  remove: empties the slot, then moves each later entry of the run back
//!          into the hole when its home is not after the hole (no
//!          tombstones); the slots stay, as many as the most entries
//!          needed
//! ```
//!
//! [`Limiting`]: crate::adaptor::Limiting
//! [`Tracking`]: crate::adaptor::Tracking

use alloc::vec::Vec;

/// Spreads an address over the hash's top bits (2^64 over the golden ratio,
/// odd: the product is a bijection, and blocks' aligned low bits still
/// move the top ones).
const K: u64 = 0x9E37_79B9_7F4A_7C15;

/// The fewest slots the map holds once it holds anything.
const MIN_SLOTS: usize = 8;

/// A map from block addresses to `V`, by open addressing with linear
/// probing.
///
/// # Examples
///
/// ```
/// use memres_core::addr_map::AddrMap;
/// let mut m = AddrMap::new();
/// assert_eq!(m.insert(0x1000, 64), None);
/// assert_eq!(m.insert(0x1000, 128), Some(64));
/// assert_eq!(m.get(0x1000), Some(&128));
/// assert_eq!(m.remove(0x1000), Some(128));
/// assert!(m.is_empty());
/// ```
#[derive(Clone, Debug)]
pub struct AddrMap<V> {
    /// Empty, or a power of two of slots (at least [`MIN_SLOTS`]), at most
    /// half of them full. An entry lies in its home slot or after it, with
    /// no empty slot between the two (cyclically): `find` stops at the
    /// first empty slot.
    slots: Vec<Option<(u64, V)>>,
    /// Full slots.
    len: usize,
}

impl<V> Default for AddrMap<V> {
    fn default() -> Self {
        Self::new()
    }
}

impl<V> AddrMap<V> {
    /// An empty map; allocates nothing until the first insert.
    pub const fn new() -> Self {
        AddrMap { slots: Vec::new(), len: 0 }
    }

    /// The number of entries.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the map has no entry.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The value at `addr`, if any.
    pub fn get(&self, addr: u64) -> Option<&V> {
        if self.slots.is_empty() {
            return None;
        }
        match self.find(addr) {
            (i, true) => self.slots[i].as_ref().map(|(_, v)| v),
            (_, false) => None,
        }
    }

    /// Puts `value` at `addr`; returns the value that was there.
    pub fn insert(&mut self, addr: u64, value: V) -> Option<V> {
        // A replacement takes no slot: only a new entry may grow the map.
        let empty = match self.slots.is_empty() {
            true => None,
            false => match self.find(addr) {
                (found, true) => return self.slots[found].replace((addr, value)).map(|(_, v)| v),
                (empty, false) => Some(empty),
            },
        };
        let i = match empty {
            Some(i) if (self.len + 1) * 2 <= self.slots.len() => i,
            _ => {
                self.resize((self.slots.len() * 2).max(MIN_SLOTS));
                self.find(addr).0
            }
        };
        self.slots[i] = Some((addr, value));
        self.len += 1;
        None
    }

    /// Takes the value at `addr` out.
    pub fn remove(&mut self, addr: u64) -> Option<V> {
        if self.slots.is_empty() {
            return None;
        }
        let (i, true) = self.find(addr) else { return None };
        let (_, value) = self.slots[i].take()?;
        self.len -= 1;
        // Close the hole: an entry after it in the run moves back into it
        // unless its home lies after the hole (it would then sit before its
        // home). Its slot becomes the hole.
        let mask = self.slots.len() - 1;
        let (mut hole, mut j) = (i, (i + 1) & mask);
        while let Some((a, _)) = self.slots[j] {
            let home = self.home(a);
            if j.wrapping_sub(home) & mask >= j.wrapping_sub(hole) & mask {
                self.slots[hole] = self.slots[j].take();
                hole = j;
            }
            j = (j + 1) & mask;
        }
        Some(value)
    }

    /// The entries, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &V)> + '_ {
        self.slots.iter().filter_map(|s| s.as_ref().map(|(a, v)| (*a, v)))
    }

    /// The slot `addr` hashes to (the slots are not empty).
    fn home(&self, addr: u64) -> usize {
        (addr.wrapping_mul(K) >> (64 - self.slots.len().trailing_zeros())) as usize
    }

    /// The slot holding `addr` (`true`), or the empty slot where it would
    /// go (`false`). The slots are not empty.
    fn find(&self, addr: u64) -> (usize, bool) {
        let mask = self.slots.len() - 1;
        let mut i = self.home(addr);
        // Ends: at most half the slots are full.
        loop {
            match &self.slots[i] {
                None => return (i, false),
                Some((a, _)) if *a == addr => return (i, true),
                Some(_) => i = (i + 1) & mask,
            }
        }
    }

    /// Moves every entry into `slots` new slots (a power of two, at least
    /// twice the entries).
    fn resize(&mut self, slots: usize) {
        let old = core::mem::replace(&mut self.slots, (0..slots).map(|_| None).collect());
        for (addr, value) in old.into_iter().flatten() {
            let (i, _) = self.find(addr);
            self.slots[i] = Some((addr, value));
        }
    }
}

/// A layer's table of the live blocks it handed out, by address: each value
/// with the number of the allocation that recorded it, so that a free takes
/// out the value it found and never a newer allocation's.
///
/// A free leaves its block's value in the table while the upstream frees it
/// (no lock is held across the upstream's call, which may call back into
/// the layer):
///
/// ```text
///  allocate ─► upstream ─ok─► insert(addr, value): a new record number; a
///                               value found there is stale (its block was
///                               freed, its free not yet taken out) ─► the caller
///  deallocate ─► freeing(addr): the record number ─► upstream ─ok─► freed(mark):
///                └ none: not a live block                        the value, if
///                                                                still that record
/// ```
///
/// Another free of the same address meanwhile (one of the two is a stale
/// block's, a double free) finds the value too and is passed on: the
/// upstream alone tells which free is right, and the one it takes out the
/// value. A free the upstream refuses, or panics in, changes nothing. Once
/// the upstream freed the block, another thread may get the address and
/// record its own block: that insert finds the freed block's value (stale)
/// and gives it to the caller to count off, and the free's
/// [`freed`](Self::freed) then finds a newer record and leaves it.
///
/// An upstream that frees by address alone (it cannot tell a stale block
/// from the live one at the address) may take a stale free that was passed
/// on before the address was recorded again as a free of the newer block:
/// that block stays recorded, as one freed behind the layer's back, until
/// the address is recorded again.
#[derive(Debug)]
pub(crate) struct Records<V> {
    /// Each live block's value, with its record number.
    map: AddrMap<(u64, V)>,
    /// Inserts made: the next record's number (wrapping; a free would have
    /// to last 2^64 inserts to mistake one record for another).
    inserts: u64,
}

/// A free under way: the address and the record number it found there.
#[derive(Clone, Copy, Debug)]
#[must_use = "a free's mark takes the value out once the upstream freed the block"]
pub(crate) struct Freeing {
    addr: u64,
    record: u64,
}

impl<V> Records<V> {
    /// No record.
    pub(crate) const fn new() -> Self {
        Records { map: AddrMap::new(), inserts: 0 }
    }

    /// Records `value` at `addr`; returns the value recorded there before
    /// (a block freed or under way to be: stale, for the caller to count off).
    pub(crate) fn insert(&mut self, addr: u64, value: V) -> Option<V> {
        let record = self.inserts;
        self.inserts = self.inserts.wrapping_add(1);
        self.map.insert(addr, (record, value)).map(|(_, old)| old)
    }

    /// The value at `addr`, if any.
    pub(crate) fn get(&self, addr: u64) -> Option<&V> {
        self.map.get(addr).map(|(_, v)| v)
    }

    /// A free of the block at `addr` begins: its mark, to pass to
    /// [`freed`](Self::freed) once the upstream freed it, and the block's
    /// value; `None` if no block is recorded there.
    pub(crate) fn freeing(&self, addr: u64) -> Option<(Freeing, &V)> {
        self.map.get(addr).map(|(record, v)| (Freeing { addr, record: *record }, v))
    }

    /// The upstream freed the block `mark` found: its value, taken out, if
    /// the address still holds that record (not if another free of it took
    /// it out, nor if a newer allocation, recorded since, took its place and
    /// gave it back as stale).
    pub(crate) fn freed(&mut self, mark: Freeing) -> Option<V> {
        match self.map.get(mark.addr) {
            Some(&(record, _)) if record == mark.record => self.map.remove(mark.addr).map(|(_, v)| v),
            _ => None,
        }
    }

    /// The records, in no particular order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u64, &V)> + '_ {
        self.map.iter().map(|(a, (_, v))| (a, v))
    }

    /// The number of records.
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// Whether nothing is recorded.
    pub(crate) fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

/// The frees of one kind told to a record before the memory below frees
/// them, and not yet answered, by address: the number of the latest. A
/// record that must tell a free before the free happens (once freed, the
/// address may be handed to another thread and recorded at once) takes
/// the free back if refused, but only while it is still in flight: a free
/// of the address that went through meanwhile (a double free racing it)
/// answers it, so that the refused one brings nothing back to life.
///
/// The two may settle in either order. The free that went through found
/// nothing to tell (the first had taken the address out), so if the
/// refusal settles first it is taken back, and the address is marked:
/// when the other is then answered, the record frees the address after
/// all ([`answered`](Self::answered)).
#[derive(Clone, Debug, Default)]
pub(crate) struct InFlight {
    latest: AddrMap<u64>,
    /// Addresses whose refused free was taken back
    /// ([`taken_back`](Self::taken_back)) and not told, answered or handed
    /// out again since.
    taken_back: AddrMap<()>,
    /// Frees told so far: the number of the last (wrapping; a free would
    /// have to last 2^64 others to be mistaken for one).
    told: u64,
}

impl InFlight {
    /// A free of `addr` told: its number.
    pub(crate) fn tell(&mut self, addr: u64) -> u64 {
        self.told = self.told.wrapping_add(1);
        self.latest.insert(addr, self.told);
        self.unmark(addr);
        self.told
    }

    /// Takes free `number` of `addr` out to undo it: whether it was still
    /// in flight.
    pub(crate) fn take(&mut self, addr: u64, number: u64) -> bool {
        let current = self.latest.get(addr) == Some(&number);
        if current {
            self.latest.remove(addr);
        }
        current
    }

    /// The record took back a refused free of `addr` ([`take`](Self::take)
    /// answered yes, and it brought the block back): a free of `addr` that
    /// found nothing to tell may still be in flight.
    pub(crate) fn taken_back(&mut self, addr: u64) {
        self.taken_back.insert(addr, ());
    }

    /// The memory below freed `addr`, whose free `told` it (`None`: the
    /// record held nothing to tell, as another free in flight had taken
    /// it out): neither can be taken back. Whether the record must free
    /// `addr` now: a free that told nothing, where the other's refusal
    /// settled first and brought the block back.
    #[must_use = "true: the record frees `addr` now"]
    pub(crate) fn answered(&mut self, addr: u64, told: Option<u64>) -> bool {
        if told.is_none_or(|n| self.latest.get(addr) == Some(&n)) {
            self.latest.remove(addr);
        }
        told.is_none() && self.unmark(addr)
    }

    /// `addr` handed out again: a free of it in flight was done.
    pub(crate) fn forget(&mut self, addr: u64) {
        self.latest.remove(addr);
        self.unmark(addr);
    }

    /// Drops the mark of a free taken back at `addr`: whether there was one.
    pub(crate) fn unmark(&mut self, addr: u64) -> bool {
        !self.taken_back.is_empty() && self.taken_back.remove(addr).is_some()
    }

    /// The addresses with a free in flight.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.latest.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{steps, SplitMix64};
    use alloc::collections::BTreeMap;

    /// Checks the map against a model: the same entries, each found from its
    /// home with no empty slot before it, the slots' count within bounds.
    fn same(m: &AddrMap<u64>, model: &BTreeMap<u64, u64>) {
        assert_eq!(m.len(), model.len());
        let mut entries: Vec<(u64, u64)> = m.iter().map(|(a, &v)| (a, v)).collect();
        entries.sort_unstable();
        assert_eq!(entries, model.iter().map(|(&a, &v)| (a, v)).collect::<Vec<_>>());
        for (&a, &v) in model {
            assert_eq!(m.get(a), Some(&v));
        }
        let n = m.slots.len();
        assert!(n == 0 || n.is_power_of_two() && n >= MIN_SLOTS && m.len() * 2 <= n);
    }

    /// Random inserts and removes, over addresses drawn from a few hundred
    /// (so that the same address comes back, and runs form and close),
    /// agree with an ordered map.
    #[test]
    fn agrees_with_an_ordered_map() {
        for (seed, shift) in [(1, 8), (2, 21), (3, 40)] {
            let (mut m, mut model) = (AddrMap::new(), BTreeMap::new());
            let mut rng = SplitMix64::new(seed);
            for step in 0..steps(40_000) {
                let addr = (rng.next_u64() % 300) << shift;
                // Inserts win at first, then removes: the map grows and shrinks.
                let grow = step < steps(40_000) / 2;
                if (rng.next_u64() % 3 != 0) == grow {
                    assert_eq!(m.insert(addr, step as u64), model.insert(addr, step as u64));
                } else {
                    assert_eq!(m.remove(addr), model.remove(&addr));
                }
                if step % 97 == 0 {
                    same(&m, &model);
                }
            }
            same(&m, &model);
        }
    }

    /// Addresses that share a home make one long run; removing from its
    /// middle keeps every later entry findable.
    #[test]
    fn a_run_of_one_home_survives_removes_from_its_middle() {
        let mut m = AddrMap::new();
        m.insert(0, 0);
        let mut same_home: Vec<u64> = (1..u64::MAX).filter(|&a| m.home(a) == m.home(0)).take(3).collect();
        same_home.insert(0, 0);
        for &a in &same_home {
            m.insert(a, a + 1);
        }
        assert_eq!(m.slots.len(), MIN_SLOTS);
        assert_eq!(m.remove(same_home[1]), Some(same_home[1] + 1));
        for &a in [same_home[0], same_home[2], same_home[3]].iter() {
            assert_eq!(m.get(a), Some(&(a + 1)), "{a:#x}");
        }
        assert_eq!(m.get(same_home[1]), None);
        assert_eq!(m.len(), 3);
    }

    /// A free takes out the record it found, once: not a newer allocation's
    /// at the same address (its insert gave the freed value back as
    /// stale), nor again for a second free the upstream took too.
    #[test]
    fn a_free_takes_out_only_the_record_it_found() {
        let mut r = Records::new();
        assert!(r.freeing(0x1000).is_none());
        r.insert(0x1000, 1);
        let (freeing, &value) = r.freeing(0x1000).unwrap();
        assert_eq!(value, 1);
        assert_eq!(r.insert(0x1000, 2), Some(1), "the freed block's value, stale");
        assert_eq!(r.freed(freeing), None);
        assert_eq!(r.get(0x1000), Some(&2));
        let (first, _) = r.freeing(0x1000).unwrap();
        let (second, _) = r.freeing(0x1000).unwrap();
        assert_eq!(r.freed(second), Some(2));
        assert_eq!(r.freed(first), None);
        assert!(r.is_empty() && r.get(0x1000).is_none());
    }

    /// A new value at an address already in the map takes no slot, so it
    /// grows nothing, even with the slots half full.
    #[test]
    fn replacing_a_value_does_not_grow_the_slots() {
        let mut m = AddrMap::new();
        for a in 0..4u64 {
            m.insert(a << 8, a);
        }
        assert_eq!(m.slots.len(), MIN_SLOTS);
        assert_eq!(m.insert(0, 9), Some(0));
        assert_eq!((m.slots.len(), m.len(), m.get(0)), (MIN_SLOTS, 4, Some(&9)));
    }

    #[test]
    fn grows_by_doubling_and_keeps_its_slots() {
        let mut m = AddrMap::new();
        assert_eq!(m.slots.len(), 0);
        for a in 0..1000u64 {
            m.insert(a << 8, a);
        }
        assert_eq!(m.slots.len(), 2048);
        for a in 0..1000u64 {
            assert_eq!(m.remove(a << 8), Some(a));
        }
        assert!(m.is_empty());
        assert_eq!(m.slots.len(), 2048);
        assert_eq!(m.remove(0), None);
        assert_eq!(AddrMap::<u8>::new().get(5), None);
    }
}
