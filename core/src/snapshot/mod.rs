//! Snapshots of a resource's memory in the format of PyTorch's
//! `torch.cuda.memory._snapshot()`, so that PyTorch's memory viewer
//! (`torch.cuda._memory_viz`, `pytorch.org/memory_viz`) opens them (feature
//! `alloc`).
//!
//! A [`MemoryMap`] is told what a resource does, in PyTorch's words:
//! segments (what the resource took from its upstream, a `cudaMalloc` in
//! PyTorch) and blocks (what it handed out) come and go, and a trace of
//! those events is kept. Whoever sees both sides of a resource feeds it: the
//! replay tool taps the leaf of a stack for the segments and its top for
//! the blocks, so that any stack over any algorithm is mapped the same way.
//! A free it tells before the memory below frees it, which that may yet
//! refuse, goes through a [`Freeing`], taken back if refused.
//! [`MemoryMap::pickle`] writes the snapshot; [`MemoryMap::runs`] gives
//! each segment as used and free runs (the tool's `--map`). `write_file`
//! (feature `std`) puts it in a file whole, never truncated for a reader.
//!
//! Which fields are filled, and which cannot be: `docs/snapshots.md`.
//!
//! ```
//! use memres_core::snapshot::MemoryMap;
//! let mut map = MemoryMap::new(16);
//! map.segment_alloc(0x1000, 4096, 0, None);
//! map.alloc(0x1000, 1024, 1000, 0, None);
//! map.alloc(0x1800, 512, 512, 0, None);
//! assert_eq!((map.held(), map.live(), map.largest_free()), (4096, 1512, 1536));
//! let runs = map.runs();
//! assert_eq!(runs[0].runs.iter().map(|r| (r.size, r.requested)).collect::<Vec<_>>(),
//!            [(1024, Some(1000)), (1024, None), (512, Some(512)), (1536, None)]);
//! assert_eq!(&map.pickle()[..2], b"\x80\x02");
//! ```

#[cfg(feature = "std")]
mod file;
mod pickle;
mod tap;
#[cfg(test)]
mod tests;

#[cfg(feature = "std")]
pub use file::{check_file, check_names_a_file, follow_links, write_file};
pub use tap::{Freeing, Recording, Side, Tap};

use alloc::collections::{BTreeMap, VecDeque};
use alloc::vec::Vec;
use pickle::{dumps, Py};

/// What a trace entry records, PyTorch's `action` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// A block handed out (`alloc`).
    Alloc,
    /// A block the program frees (`free_requested`): always told with its
    /// `free_completed` right after it, as PyTorch tells a free that waits
    /// for no stream, which its viewer takes as one free.
    FreeRequested,
    /// A block given back (`free_completed`; memres frees at once, right
    /// after its `free_requested`).
    FreeCompleted,
    /// Memory taken from the upstream (`segment_alloc`).
    SegmentAlloc,
    /// Memory given back to the upstream (`segment_free`).
    SegmentFree,
    /// An allocation that failed for want of memory (`oom`).
    Oom,
}

impl Action {
    /// PyTorch's word for it.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Alloc => "alloc",
            Action::FreeRequested => "free_requested",
            Action::FreeCompleted => "free_completed",
            Action::SegmentAlloc => "segment_alloc",
            Action::SegmentFree => "segment_free",
            Action::Oom => "oom",
        }
    }
}

/// One event of the trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TraceEntry {
    /// What happened.
    pub action: Action,
    /// The block's or segment's address; for `oom`, the bytes the device
    /// had free (PyTorch's `device_free`, which it writes instead of an
    /// address; 0 where not known).
    pub addr: u64,
    /// Its size (the request's, for `alloc`, the frees' and `oom`).
    pub size: u64,
    /// The stream's id.
    pub stream: u64,
    /// Microseconds, where the source has a time.
    pub time_us: Option<u64>,
}

#[derive(Clone, Copy, Debug)]
struct Segment {
    size: u64,
    stream: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Live {
    size: u64,
    requested: u64,
    stream: u64,
    /// It lay in no segment when handed out (its leaf is not tapped): it is
    /// a segment of its own, whose `segment_alloc` and `segment_free` the
    /// trace tells around the block's.
    own_segment: bool,
}

/// A block that [`MemoryMap::free`] took out: what a refused [`Freeing`]
/// puts back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Freed(Live);

/// A segment that [`MemoryMap::segment_free`] took out: what a refused
/// [`Freeing`] puts back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentFreed {
    size: u64,
    stream: u64,
}

/// What a [`Freeing`] told the map, and the number of its first event
/// (its events are numbered on from it, one each).
#[derive(Clone, Copy, Debug)]
enum Told {
    Block(Freed, u64),
    Segment(SegmentFreed, u64),
}

impl Told {
    /// The events its free told.
    fn events(&self) -> usize {
        match self {
            Told::Block(Freed(b), _) => 2 + usize::from(b.own_segment),
            Told::Segment(..) => 1,
        }
    }

    /// The numbers of its events.
    fn numbers(&self) -> core::ops::Range<u64> {
        let (Told::Block(_, first) | Told::Segment(_, first)) = *self;
        first..first + self.events() as u64
    }
}

impl SegmentFreed {
    /// Its bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The stream it was taken on.
    pub fn stream(&self) -> u64 {
        self.stream
    }
}

impl Freed {
    /// Its bytes.
    pub fn size(&self) -> u64 {
        self.0.size
    }

    /// The bytes requested.
    pub fn requested(&self) -> u64 {
        self.0.requested
    }

    /// The stream it was allocated on.
    pub fn stream(&self) -> u64 {
        self.0.stream
    }
}

/// A run of a segment: a live block, or free bytes between blocks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Run {
    /// Where it starts.
    pub addr: u64,
    /// Its bytes.
    pub size: u64,
    /// The bytes requested, for a live block (at most `size`: a block
    /// cut short keeps what is left of its request); `None` for free bytes.
    pub requested: Option<u64>,
}

/// A segment as used and free runs, in address order, which tile it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentRuns {
    /// Where it starts.
    pub addr: u64,
    /// Its bytes.
    pub size: u64,
    /// The stream it was taken on.
    pub stream: u64,
    /// Its runs.
    pub runs: Vec<Run>,
    /// Whether it is a live block that lies in no segment held, standing
    /// as a segment of its own: none of [`MemoryMap::held`]'s bytes.
    pub alone: bool,
}

/// The segments and live blocks of a resource, and the last events.
///
/// A free told ahead ([`Freeing`]) and refused leaves the trace as it would
/// be had it never been told: the last `max_entries` events of all the
/// others, in order. So the events pushed out of a full trace while frees
/// told ahead are in flight are kept aside, as many as those frees told
/// (an undo takes its own events out and puts back as many as it took out
/// of the trace: the newest pushed out, whether its own events or later
/// ones pushed them out), and let go once the frees are settled.
#[derive(Clone, Debug)]
pub struct MemoryMap {
    /// No two overlap (one handed out over another ends it first).
    segments: BTreeMap<u64, Segment>,
    /// No two overlap, as the segments.
    blocks: BTreeMap<u64, Live>,
    held: u64,
    live: u64,
    /// The trace, after the `pushed_out` events at its front: those
    /// pushed out of it, oldest first, kept for frees told ahead. Each
    /// event with its number, strictly increasing from front to back, by
    /// which an undo finds a free's own events.
    trace: VecDeque<(u64, TraceEntry)>,
    /// The number of the next event told.
    next_event: u64,
    /// At most `told_ahead`.
    pushed_out: usize,
    /// The events told by frees told ahead and not yet settled.
    told_ahead: usize,
    max_entries: usize,
    now: Option<u64>,
    /// The frees of blocks told ahead ([`Freeing`]) and not yet answered.
    blocks_freeing: crate::addr_map::InFlight,
    /// The frees of segments told ahead and not yet answered.
    segments_freeing: crate::addr_map::InFlight,
}

/// The entry of `map` (whose entries never overlap) that overlaps
/// `[addr, addr + size)`, the one starting last if several do; an entry of
/// no bytes holds its address. In u128: a range may end at 2^64.
fn overlapping<V: Copy>(
    map: &BTreeMap<u64, V>,
    addr: u64,
    size: u64,
    size_of: fn(&V) -> u64,
) -> Option<(u64, V)> {
    let end = u128::from(addr) + u128::from(size.max(1));
    let last = match u64::try_from(end) {
        Ok(end) => map.range(..end).next_back(),
        Err(_) => map.iter().next_back(),
    };
    // None before it ends past its start: if it ends at or below `addr`,
    // so do they.
    let (&start, &v) = last?;
    (u128::from(start) + u128::from(size_of(&v).max(1)) > u128::from(addr)).then_some((start, v))
}

impl MemoryMap {
    /// An empty map that keeps the last `max_entries` events (PyTorch's
    /// `max_entries` of `_record_memory_history`).
    pub fn new(max_entries: usize) -> Self {
        MemoryMap {
            segments: BTreeMap::new(),
            blocks: BTreeMap::new(),
            held: 0,
            live: 0,
            trace: VecDeque::new(),
            next_event: 0,
            pushed_out: 0,
            told_ahead: 0,
            max_entries,
            now: None,
            blocks_freeing: crate::addr_map::InFlight::default(),
            segments_freeing: crate::addr_map::InFlight::default(),
        }
    }

    /// The time of the events told without one from now on (what a
    /// [`Tap`] tells), in microseconds; `None`: no time.
    pub fn set_time(&mut self, time_us: Option<u64>) {
        self.now = time_us;
    }

    /// Adds an event to the trace, pushing the oldest out of a full one.
    fn record(&mut self, action: Action, addr: u64, size: u64, stream: u64, time_us: Option<u64>) {
        if self.max_entries == 0 {
            return;
        }
        if self.trace.len() - self.pushed_out == self.max_entries {
            self.pushed_out += 1;
            // Before the push: a trace with no free told ahead keeps its
            // capacity.
            self.let_go();
        }
        let time_us = time_us.or(self.now);
        self.trace.push_back((self.next_event, TraceEntry { action, addr, size, stream, time_us }));
        self.next_event += 1;
    }

    /// Lets go of the events pushed out that no free told ahead may need.
    fn let_go(&mut self) {
        while self.pushed_out > self.told_ahead {
            self.trace.pop_front();
            self.pushed_out -= 1;
        }
    }

    /// A free told ahead was settled (done or refused).
    fn settled(&mut self, told: Told) {
        self.told_ahead -= told.events();
        self.let_go();
    }

    /// After an undo took a free's events out (of the trace or of the
    /// events pushed out): puts back at the trace's front the events
    /// pushed out last, as many as fit.
    fn put_back(&mut self) {
        let room = self.max_entries - (self.trace.len() - self.pushed_out);
        self.pushed_out -= room.min(self.pushed_out);
    }

    /// Takes out the events of a free told ahead (`told`) that are still
    /// in the trace or among the events pushed out, then puts back as many
    /// as it took out of the trace, those pushed out last.
    fn take_out(&mut self, told: Told) {
        for number in told.numbers() {
            if let Ok(i) = self.trace.binary_search_by_key(&number, |&(n, _)| n) {
                self.trace.remove(i);
                if i < self.pushed_out {
                    self.pushed_out -= 1;
                }
            }
        }
        self.put_back();
    }

    /// `size` bytes at `addr` taken from the upstream on `stream`.
    pub fn segment_alloc(&mut self, addr: u64, size: u64, stream: u64, time_us: Option<u64>) {
        // The sums wrap as the adaptors' counts do: sizes of a map fed from
        // outside may pass u64, and each size added is taken off again.
        // Handed out again: a free of the old segment in flight was done.
        self.segments_freeing.forget(addr);
        self.gone_unseen(addr, size, stream, time_us);
        self.segments.insert(addr, Segment { size, stream });
        self.held = self.held.wrapping_add(size);
        self.record(Action::SegmentAlloc, addr, size, stream, time_us);
    }

    /// The segment at `addr` given back (an unknown one is ignored): the
    /// segment. The free is final; one that the upstream may yet refuse is
    /// told through a [`Freeing`].
    pub fn segment_free(&mut self, addr: u64, stream: u64, time_us: Option<u64>) -> Option<SegmentFreed> {
        let s = self.segments.remove(&addr)?;
        self.held = self.held.wrapping_sub(s.size);
        self.record(Action::SegmentFree, addr, s.size, stream, time_us);
        Some(SegmentFreed { size: s.size, stream: s.stream })
    }

    /// Takes back a [`segment_free`](Self::segment_free) told ahead
    /// (`told`) that the upstream refused: the segment is held again, and
    /// the free's event leaves the trace, which gets back the event pushed
    /// out last. A segment held at `addr` since shows that the upstream did
    /// free it: nothing changes. Marked as taken back: a free of it that
    /// told nothing may yet be answered ([`answered`](Self::answered)).
    fn segment_unfree(&mut self, addr: u64, freed: SegmentFreed, told: Told) {
        if overlapping(&self.segments, addr, freed.size, |s| s.size).is_some() {
            return;
        }
        self.segments.insert(addr, Segment { size: freed.size, stream: freed.stream });
        self.held = self.held.wrapping_add(freed.size);
        self.take_out(told);
        self.segments_freeing.taken_back(addr);
    }

    /// A block of `size` bytes at `addr` handed out for a request of
    /// `requested` bytes. One that lies in no segment (its leaf is not
    /// tapped) is a segment of its own, in the snapshot and in the trace:
    /// its `segment_alloc` comes right before the block's `alloc`, its
    /// `segment_free` right after the block's free, so that a viewer
    /// undoing the trace finds every block it brings back in a segment.
    pub fn alloc(&mut self, addr: u64, size: u64, requested: u64, stream: u64, time_us: Option<u64>) {
        // Handed out again: a free of the old block in flight was done.
        self.blocks_freeing.forget(addr);
        self.blocks_gone_unseen(addr, size, stream, time_us);
        let own_segment = !self.lies_in_a_segment(addr);
        self.blocks.insert(addr, Live { size, requested, stream, own_segment });
        self.live = self.live.wrapping_add(requested);
        if own_segment {
            self.record(Action::SegmentAlloc, addr, size, stream, time_us);
        }
        self.record(Action::Alloc, addr, requested, stream, time_us);
    }

    /// `[addr, addr + size)` handed out again, as a segment, while the map
    /// holds segments or blocks there: what held them gave them back
    /// unseen (a resource dropped with blocks live, whose simulated device
    /// went with it and whose addresses the next device took; a free that
    /// passed no tap). Told freed now, from the highest address down, each
    /// segment's blocks before it, on the new one's stream: PyTorch's
    /// viewer, stepping back over the trace, undoes each `segment_alloc`
    /// and `alloc` into free memory, and before, it undid the new one over
    /// the old, which it then lost.
    fn gone_unseen(&mut self, addr: u64, size: u64, stream: u64, time_us: Option<u64>) {
        while let Some((start, old)) = overlapping(&self.segments, addr, size, |s| s.size) {
            self.blocks_gone_unseen(start, old.size, stream, time_us);
            self.segment_free(start, stream, time_us);
        }
        self.blocks_gone_unseen(addr, size, stream, time_us);
    }

    /// The live blocks in `[addr, addr + size)`, handed out again: told
    /// freed now (see [`gone_unseen`](Self::gone_unseen)).
    fn blocks_gone_unseen(&mut self, addr: u64, size: u64, stream: u64, time_us: Option<u64>) {
        while let Some((start, _)) = overlapping(&self.blocks, addr, size, |b| b.size) {
            self.free(start, stream, time_us);
        }
    }

    /// Whether `addr` lies in a segment held.
    fn lies_in_a_segment(&self, addr: u64) -> bool {
        self.segments.range(..=addr).next_back().is_some_and(|(&start, s)| addr - start < s.size)
    }

    /// Takes back a [`free`](Self::free) of the block at `addr` told ahead
    /// (`told`) that the resource refused: the block is live again, as
    /// `free` took it out, and the free's events leave the trace (no
    /// allocation is told: none happened); the trace gets back as many
    /// events as it lost, those pushed out last. A block handed out at
    /// `addr` since shows that the resource did free it: nothing changes.
    /// Marked as taken back, as [`segment_unfree`](Self::segment_unfree).
    fn unfree(&mut self, addr: u64, freed: Freed, told: Told) {
        let Freed(b) = freed;
        if overlapping(&self.blocks, addr, b.size, |b| b.size).is_some() {
            return;
        }
        self.blocks.insert(addr, b);
        self.live = self.live.wrapping_add(b.requested);
        self.take_out(told);
        self.blocks_freeing.taken_back(addr);
    }

    /// The block at `addr` given back (an unknown one is ignored), told as
    /// PyTorch tells a free, `free_requested` then `free_completed` (then
    /// the `segment_free` of a block that is a segment of its own): the
    /// block. The free is final; one that the resource may yet refuse is
    /// told through a [`Freeing`].
    pub fn free(&mut self, addr: u64, stream: u64, time_us: Option<u64>) -> Option<Freed> {
        let b = self.blocks.remove(&addr)?;
        self.live = self.live.wrapping_sub(b.requested);
        // Both, adjacent: PyTorch's viewer merges the pair into one free; a
        // `free_completed` alone it undoes into a block freed but waiting
        // for a `record_stream`.
        self.record(Action::FreeRequested, addr, b.requested, stream, time_us);
        self.record(Action::FreeCompleted, addr, b.requested, stream, time_us);
        if b.own_segment {
            self.record(Action::SegmentFree, addr, b.size, b.stream, time_us);
        }
        Some(Freed(b))
    }

    /// The frees of `side` told ahead and not yet answered.
    fn in_flight(&mut self, side: Side) -> &mut crate::addr_map::InFlight {
        match side {
            Side::Blocks => &mut self.blocks_freeing,
            Side::Segments => &mut self.segments_freeing,
        }
    }

    /// The stream the block or segment (`side`) at `addr` was taken on.
    fn stream_of(&self, side: Side, addr: u64) -> Option<u64> {
        match side {
            Side::Blocks => self.blocks.get(&addr).map(|b| b.stream),
            Side::Segments => self.segments.get(&addr).map(|s| s.stream),
        }
    }

    /// Tells a free of `side` at `addr` before the memory below frees it
    /// ([`Freeing`]): what it took out and its number in flight; `None`
    /// if the map held nothing there.
    fn tell_ahead(
        &mut self,
        side: Side,
        addr: u64,
        stream: u64,
        time_us: Option<u64>,
    ) -> Option<(Told, u64)> {
        // Counted before it is told: what its events push out is kept.
        let events = match side {
            Side::Blocks => 2 + usize::from(self.blocks.get(&addr)?.own_segment),
            Side::Segments => self.segments.get(&addr).map(|_| 1)?,
        };
        self.told_ahead += events;
        let first = self.next_event;
        let told = match side {
            Side::Blocks => self.free(addr, stream, time_us).map(|f| Told::Block(f, first)),
            Side::Segments => self.segment_free(addr, stream, time_us).map(|f| Told::Segment(f, first)),
        };
        debug_assert_eq!(told.map(|t| t.events()), Some(events));
        Some((told?, self.in_flight(side).tell(addr)))
    }

    /// The memory below freed `addr`, whose free told ahead is `told`
    /// (`None`: it told nothing, as another free in flight had taken the
    /// address out, told on `stream` at `time_us`): neither can be taken
    /// back. Where the other's refusal settled first and brought the
    /// block or segment back, it is freed now (on `stream`, or without
    /// one on the stream it was taken on).
    fn answered(
        &mut self,
        side: Side,
        addr: u64,
        told: Option<(Told, u64)>,
        stream: Option<u64>,
        time_us: Option<u64>,
    ) {
        if self.in_flight(side).answered(addr, told.map(|(_, number)| number)) {
            let stream = stream.or_else(|| self.stream_of(side, addr)).unwrap_or(0);
            match side {
                Side::Blocks => drop(self.free(addr, stream, time_us)),
                Side::Segments => drop(self.segment_free(addr, stream, time_us)),
            }
        }
        if let Some((told, _)) = told {
            self.settled(told);
        }
    }

    /// The memory below refused the free told ahead as `number`: taken
    /// back if it is still the address's free in flight (not if another
    /// free of the address went through meanwhile, a double free racing
    /// it, nor if the address was handed out again).
    fn take_back(&mut self, addr: u64, told: Told, number: u64) {
        match told {
            Told::Block(freed, _) if self.blocks_freeing.take(addr, number) => self.unfree(addr, freed, told),
            Told::Segment(freed, _) if self.segments_freeing.take(addr, number) => {
                self.segment_unfree(addr, freed, told)
            }
            _ => {}
        }
        self.settled(told);
    }

    /// A request of `size` bytes that failed for want of memory, while the
    /// device had `device_free` bytes free (0: not known).
    pub fn oom(&mut self, size: u64, stream: u64, device_free: u64, time_us: Option<u64>) {
        self.record(Action::Oom, device_free, size, stream, time_us);
    }

    /// Bytes held from the upstream: the segments' sum.
    pub fn held(&self) -> u64 {
        self.held
    }

    /// Bytes requested by the live blocks.
    pub fn live(&self) -> u64 {
        self.live
    }

    /// The events kept, oldest first.
    pub fn trace(&self) -> impl Iterator<Item = &TraceEntry> {
        self.trace.range(self.pushed_out..).map(|(_, e)| e)
    }

    /// The largest run of free bytes inside one segment: of bytes no
    /// live block covers, a block counted at its size as told (the taps
    /// tell the requested size, so a resource's rounding counts as free).
    pub fn largest_free(&self) -> u64 {
        let mut largest = 0;
        self.each_segment(|_, _, runs, _| {
            for r in runs.iter().filter(|r| r.requested.is_none()) {
                largest = largest.max(r.size);
            }
        });
        largest
    }

    /// Every segment as runs, in address order. A live block that lies in
    /// no segment (the leaf was not seen) is a segment of its own, as the
    /// trace tells ([`alloc`](Self::alloc)).
    pub fn runs(&self) -> Vec<SegmentRuns> {
        let mut out = Vec::new();
        self.each_segment(|addr, seg, runs, alone| {
            out.push(SegmentRuns { addr, size: seg.size, stream: seg.stream, runs: runs.to_vec(), alone })
        });
        out
    }

    /// Calls `each` with every segment, its runs (one buffer reused) and
    /// whether it is a block alone.
    fn each_segment(&self, mut each: impl FnMut(u64, Segment, &[Run], bool)) {
        // A run holds no more of its request than its bytes: a block cut
        // short at its segment's end keeps only what is left of it.
        let used = |addr, size, live: &Live| Run { addr, size, requested: Some(live.requested.min(size)) };
        // Exact: every address narrowed lies below a segment's end, at
        // most 2^64, and every size is at most a segment's or a block's.
        let low = |n: u128| n as u64;
        let mut runs = Vec::new();
        let mut blocks = self.blocks.iter().peekable();
        let mut segments = self.segments.iter().peekable();
        while let Some((&addr, &seg)) = segments.next() {
            // In u128: a segment may end at 2^64, past the last address;
            // one said to pass it (from a faulty upstream) stops there.
            let end = (u128::from(addr) + u128::from(seg.size)).min(1 << 64);
            // Its blocks start in it (and so before the next segment: none
            // overlap), as `alloc` judges a block's segment.
            let next = segments.peek().map_or(1 << 64, |(&n, _)| u128::from(n));
            // Blocks before this segment lie in none.
            while let Some((&b, live)) = blocks.next_if(|(&b, _)| b < addr) {
                each(b, Segment { size: live.size, stream: live.stream }, &[used(b, live.size, live)], true);
            }
            runs.clear();
            let mut at = u128::from(addr);
            while let Some((&b, live)) = blocks.next_if(|(&b, _)| u128::from(b) < end.min(next)) {
                let start = u128::from(b);
                // Blocks never overlap: each starts at or past `at`.
                if start > at {
                    runs.push(Run { addr: low(at), size: low(start - at), requested: None });
                }
                let stop = (start + u128::from(live.size)).min(end);
                runs.push(used(b, low(stop - start), live));
                at = stop;
            }
            if at < end {
                runs.push(Run { addr: low(at), size: low(end - at), requested: None });
            }
            each(addr, seg, &runs, false);
        }
        for (&b, live) in blocks {
            each(b, Segment { size: live.size, stream: live.stream }, &[used(b, live.size, live)], true);
        }
    }

    /// The snapshot as PyTorch's `torch.cuda.memory._snapshot()` returns
    /// it, pickled: `segments` with their blocks, and `device_traces` with
    /// one device's events (device 0; [`pickle_devices`] for more).
    pub fn pickle(&self) -> Vec<u8> {
        pickle_devices(&[Some(self)])
    }

    /// The segments as PyTorch's dicts, on `device`.
    fn segments_py(&self, device: i128, out: &mut Vec<Py<'static>>) {
        let int = |n: u64| Py::Int(i128::from(n));
        let empty = || Py::List(Vec::new());
        self.each_segment(|addr, seg, runs, _| {
            let sum = |n: u64, m: u64| n.saturating_add(m);
            let allocated = runs.iter().filter(|r| r.requested.is_some()).map(|r| r.size).fold(0, sum);
            let requested = runs.iter().filter_map(|r| r.requested).fold(0, sum);
            let blocks = runs
                .iter()
                .map(|r| {
                    Py::Dict(alloc::vec![
                        ("address", int(r.addr)),
                        ("size", int(r.size)),
                        ("requested_size", int(r.requested.unwrap_or(0))),
                        (
                            "state",
                            Py::Str(if r.requested.is_some() { "active_allocated" } else { "inactive" })
                        ),
                        ("frames", empty()),
                    ])
                })
                .collect();
            out.push(Py::Dict(alloc::vec![
                ("device", Py::Int(device)),
                ("address", int(addr)),
                ("total_size", int(seg.size)),
                ("allocated_size", int(allocated)),
                ("active_size", int(allocated)),
                ("requested_size", int(requested)),
                ("stream", int(seg.stream)),
                // PyTorch's small pool serves requests up to 1 MiB from 2 MiB segments.
                ("segment_type", Py::Str(if seg.size <= 2 << 20 { "small" } else { "large" })),
                ("segment_pool_id", Py::Tuple(alloc::vec![Py::Int(0), Py::Int(0)])),
                ("is_expandable", Py::Bool(false)),
                ("frames", empty()),
                ("blocks", Py::List(blocks)),
            ]));
        });
    }

    /// The events as PyTorch's dicts.
    fn trace_py(&self) -> Py<'static> {
        let int = |n: u64| Py::Int(i128::from(n));
        let events = self
            .trace()
            .map(|e| {
                // An `oom` says the device's free bytes where the others
                // say an address, as PyTorch's.
                let addr = if e.action == Action::Oom { "device_free" } else { "addr" };
                let mut fields = alloc::vec![
                    ("action", Py::Str(e.action.as_str())),
                    (addr, int(e.addr)),
                    ("size", int(e.size)),
                    ("stream", int(e.stream)),
                    ("frames", Py::List(Vec::new())),
                ];
                if let Some(t) = e.time_us {
                    fields.push(("time_us", int(t)));
                }
                Py::Dict(fields)
            })
            .collect();
        Py::List(events)
    }
}

/// One snapshot of several devices: `maps[d]` is device `d`'s map (`None`:
/// a device not in use, with no segments and an empty trace).
///
/// ```
/// use memres_core::snapshot::{pickle_devices, MemoryMap};
/// let mut one = MemoryMap::new(10);
/// one.segment_alloc(0x1000, 4096, 0, None);
/// let bytes = pickle_devices(&[None, Some(&one)]);
/// assert!(bytes.starts_with(b"\x80\x02}") && bytes.ends_with(b"."));
/// ```
pub fn pickle_devices(maps: &[Option<&MemoryMap>]) -> Vec<u8> {
    let mut segments = Vec::new();
    let mut traces = Vec::new();
    // A trace for device 0 at least: PyTorch's viewer opens the first
    // device's, and one with none it cannot open.
    for d in 0..maps.len().max(1) {
        match maps.get(d).copied().flatten() {
            Some(m) => {
                m.segments_py(d as i128, &mut segments);
                traces.push(m.trace_py());
            }
            None => traces.push(Py::List(Vec::new())),
        }
    }
    dumps(&Py::Dict(alloc::vec![("segments", Py::List(segments)), ("device_traces", Py::List(traces))]))
}
