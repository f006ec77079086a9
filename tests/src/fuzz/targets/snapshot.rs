//! The fuzz target of the snapshot's [`MemoryMap`]: segments and blocks fed
//! from outside (overlapping what the map holds, which they end, at the top
//! of the address space, twice at one address), frees told ahead ([`Freeing`]) that the memory below does or
//! refuses in any order (a free that found nothing to tell, done after
//! the refusal of the one that took the address out, frees it), and a
//! short trace that pushes events out.
//!
//! Two oracles after every step. A model that keeps every event ever told,
//! taking a refused free's own events out: the map's trace is the model's
//! last `max_entries` events, and its held and live bytes are the model's.
//! And the layout: each segment's runs tile it in address order, no run
//! holds more of its request than its bytes, every live block starts
//! exactly one run (a segment of its own where it lies in none), and
//! `largest_free` is the largest free run.

use arbitrary::Unstructured;
use memres_core::snapshot::{Action, Freeing, MemoryMap, Side, TraceEntry};
use memres_core::Shared;
use std::collections::{BTreeMap, HashMap, HashSet};

/// A block as the model holds it.
#[derive(Clone, Copy, Debug)]
struct Block {
    size: u64,
    requested: u64,
    stream: u64,
    /// It lay in no segment when first handed out at its address.
    own_segment: bool,
}

/// What a free took out, to put back if refused.
#[derive(Clone, Copy, Debug)]
enum Took {
    Block(Block),
    Segment { size: u64, stream: u64 },
}

/// A free told ahead, as the model saw it.
#[derive(Debug)]
struct Told {
    side: Side,
    addr: u64,
    /// What it took out, its number in flight and its events; `None`: the
    /// map held nothing at the address.
    took: Option<(Took, u64, Vec<u64>)>,
    /// What it was told with: one that took nothing frees with them when
    /// done, where a refusal brought the address back meanwhile.
    stream: u64,
    time_us: Option<u64>,
}

/// Every event ever told, less those of refused frees.
#[derive(Debug, Default)]
struct Model {
    max_entries: usize,
    segments: BTreeMap<u64, (u64, u64)>,
    blocks: BTreeMap<u64, Block>,
    held: u64,
    live: u64,
    /// Events with their number.
    events: Vec<(u64, TraceEntry)>,
    next_event: u64,
    now: Option<u64>,
    /// Per side (blocks, segments): the number of the latest free told
    /// ahead of each address that may still be taken back.
    latest: [HashMap<u64, u64>; 2],
    /// Per side: the addresses a refusal brought back, not told, handed
    /// out or freed by a free that took nothing since.
    taken_back: [HashSet<u64>; 2],
    told: u64,
}

/// Whether `[a, a + a_len)` and `[b, b + b_len)` share a byte, an empty
/// range holding its address; in u128, as a range may end at 2^64.
fn overlaps(a: u64, a_len: u64, b: u64, b_len: u64) -> bool {
    let end = |at: u64, len: u64| u128::from(at) + u128::from(len.max(1));
    u128::from(a) < end(b, b_len) && u128::from(b) < end(a, a_len)
}

fn side_index(side: Side) -> usize {
    match side {
        Side::Blocks => 0,
        Side::Segments => 1,
    }
}

impl Model {
    fn record(
        &mut self,
        action: Action,
        addr: u64,
        size: u64,
        stream: u64,
        time_us: Option<u64>,
    ) -> Option<u64> {
        if self.max_entries == 0 {
            return None;
        }
        self.next_event += 1;
        let entry = TraceEntry { action, addr, size, stream, time_us: time_us.or(self.now) };
        self.events.push((self.next_event, entry));
        Some(self.next_event)
    }

    fn lies_in_a_segment(&self, addr: u64) -> bool {
        self.segments.range(..=addr).next_back().is_some_and(|(&start, &(size, _))| addr - start < size)
    }

    fn segment_alloc(&mut self, addr: u64, size: u64, stream: u64, time_us: Option<u64>) {
        self.latest[1].remove(&addr);
        self.taken_back[1].remove(&addr);
        // What it is handed out over is told freed first, from the highest
        // address down, each segment's blocks before it.
        let over = |start: u64, len: u64| overlaps(start, len, addr, size);
        let mut gone: Vec<(u64, u64)> =
            self.segments.iter().filter(|(&a, s)| over(a, s.0)).map(|(&a, s)| (a, s.0)).collect();
        gone.sort_unstable_by(|x, y| y.cmp(x));
        for (start, len) in gone {
            self.blocks_gone(start, len, stream, time_us);
            self.segment_free(start, stream, time_us);
        }
        self.blocks_gone(addr, size, stream, time_us);
        self.segments.insert(addr, (size, stream));
        self.held = self.held.wrapping_add(size);
        self.record(Action::SegmentAlloc, addr, size, stream, time_us);
    }

    /// Frees the blocks that overlap `[addr, addr + len)`, highest first.
    fn blocks_gone(&mut self, addr: u64, len: u64, stream: u64, time_us: Option<u64>) {
        let mut gone: Vec<u64> =
            self.blocks.iter().filter(|(&a, b)| overlaps(a, b.size, addr, len)).map(|(&a, _)| a).collect();
        gone.sort_unstable_by(|x, y| y.cmp(x));
        for a in gone {
            self.free(a, stream, time_us);
        }
    }

    fn segment_free(&mut self, addr: u64, stream: u64, time_us: Option<u64>) -> Option<(Took, Vec<u64>)> {
        let (size, taken_on) = self.segments.remove(&addr)?;
        self.held = self.held.wrapping_sub(size);
        let ids = self.record(Action::SegmentFree, addr, size, stream, time_us).into_iter().collect();
        Some((Took::Segment { size, stream: taken_on }, ids))
    }

    fn alloc(&mut self, addr: u64, size: u64, requested: u64, stream: u64, time_us: Option<u64>) {
        self.latest[0].remove(&addr);
        self.taken_back[0].remove(&addr);
        self.blocks_gone(addr, size, stream, time_us);
        let own_segment = !self.lies_in_a_segment(addr);
        self.blocks.insert(addr, Block { size, requested, stream, own_segment });
        self.live = self.live.wrapping_add(requested);
        if own_segment {
            self.record(Action::SegmentAlloc, addr, size, stream, time_us);
        }
        self.record(Action::Alloc, addr, requested, stream, time_us);
    }

    fn free(&mut self, addr: u64, stream: u64, time_us: Option<u64>) -> Option<(Took, Vec<u64>)> {
        let b = self.blocks.remove(&addr)?;
        self.live = self.live.wrapping_sub(b.requested);
        let mut ids = Vec::new();
        ids.extend(self.record(Action::FreeRequested, addr, b.requested, stream, time_us));
        ids.extend(self.record(Action::FreeCompleted, addr, b.requested, stream, time_us));
        if b.own_segment {
            ids.extend(self.record(Action::SegmentFree, addr, b.size, b.stream, time_us));
        }
        Some((Took::Block(b), ids))
    }

    fn tell_ahead(&mut self, side: Side, addr: u64, stream: u64, time_us: Option<u64>) -> Told {
        let took = match side {
            Side::Blocks => self.free(addr, stream, time_us),
            Side::Segments => self.segment_free(addr, stream, time_us),
        };
        let took = took.map(|(took, ids)| {
            self.told += 1;
            self.latest[side_index(side)].insert(addr, self.told);
            self.taken_back[side_index(side)].remove(&addr);
            (took, self.told, ids)
        });
        Told { side, addr, took, stream, time_us }
    }

    /// The memory below freed it: neither it nor a free of the address
    /// told before it can be taken back. One that took nothing, where the
    /// refusal of the free that took it settled first, frees it now.
    fn done(&mut self, t: Told) {
        let latest = &mut self.latest[side_index(t.side)];
        if t.took.as_ref().is_none_or(|(_, n, _)| latest.get(&t.addr) == Some(n)) {
            latest.remove(&t.addr);
        }
        if t.took.is_none() && self.taken_back[side_index(t.side)].remove(&t.addr) {
            match t.side {
                Side::Blocks => drop(self.free(t.addr, t.stream, t.time_us)),
                Side::Segments => drop(self.segment_free(t.addr, t.stream, t.time_us)),
            }
        }
    }

    /// The memory below refused it: if it is still the address's latest
    /// free in flight, what it took comes back and its events leave.
    fn refused(&mut self, t: Told) {
        let Some((took, n, ids)) = t.took else { return };
        let latest = &mut self.latest[side_index(t.side)];
        if latest.get(&t.addr) != Some(&n) {
            return;
        }
        latest.remove(&t.addr);
        match took {
            Took::Block(b) => {
                if self.blocks.iter().any(|(&a, o)| overlaps(a, o.size, t.addr, b.size)) {
                    return;
                }
                self.blocks.insert(t.addr, b);
                self.live = self.live.wrapping_add(b.requested);
                self.taken_back[0].insert(t.addr);
            }
            Took::Segment { size, stream } => {
                if self.segments.iter().any(|(&a, o)| overlaps(a, o.0, t.addr, size)) {
                    return;
                }
                self.segments.insert(t.addr, (size, stream));
                self.held = self.held.wrapping_add(size);
                self.taken_back[1].insert(t.addr);
            }
        }
        self.events.retain(|(id, _)| !ids.contains(id));
    }

    /// The events the map's trace should hold.
    fn trace(&self) -> Vec<TraceEntry> {
        let from = self.events.len().saturating_sub(self.max_entries);
        self.events[from..].iter().map(|&(_, e)| e).collect()
    }
}

/// An address from a small set, so that addresses repeat and blocks land
/// inside, across and past segments, and a few at the top of the space.
fn addr(u: &mut Unstructured<'_>) -> arbitrary::Result<u64> {
    Ok(match u.int_in_range(0..=7u8)? {
        0 => u64::MAX - 64 * u.int_in_range(0..=4u64)?,
        1 => u64::MAX - u.int_in_range(0..=3u64)?,
        _ => 64 * u.int_in_range(0..=24u64)?,
    })
}

fn size(u: &mut Unstructured<'_>) -> arbitrary::Result<u64> {
    Ok(match u.int_in_range(0..=9u8)? {
        0 => 0,
        1 => u64::MAX - u.int_in_range(0..=64u64)?,
        2 => u.int_in_range(1..=63u64)?,
        _ => 64 * u.int_in_range(1..=8u64)?,
    })
}

fn time(u: &mut Unstructured<'_>) -> arbitrary::Result<Option<u64>> {
    Ok(if u.ratio(1, 3)? { Some(u.int_in_range(0..=1000u64)?) } else { None })
}

/// Checks the map against the model and its layout.
fn check(map: &Shared<MemoryMap>, model: &Model, step: usize) {
    map.with(|m| {
        let trace: Vec<TraceEntry> = m.trace().copied().collect();
        assert_eq!(trace, model.trace(), "step {step}: the trace");
        assert_eq!((m.held(), m.live()), (model.held, model.live), "step {step}: held and live bytes");
        let runs = m.runs();
        let mut starts = Vec::new();
        let mut largest = 0;
        for seg in &runs {
            if seg.alone {
                assert_eq!(seg.runs.len(), 1, "step {step}: a block alone is one run: {seg:?}");
                assert!(
                    !model.lies_in_a_segment(seg.addr),
                    "step {step}: a block in a segment alone: {seg:?}"
                );
            } else {
                assert_eq!(
                    model.segments.get(&seg.addr).map(|s| s.0),
                    Some(seg.size),
                    "step {step}: {seg:?}"
                );
            }
            let mut at = u128::from(seg.addr);
            for r in &seg.runs {
                assert_eq!(u128::from(r.addr), at, "step {step}: runs tile in order: {seg:?}");
                assert!(r.size > 0 || r.requested.is_some(), "step {step}: an empty free run: {seg:?}");
                assert!(
                    r.requested.is_none_or(|q| q <= r.size),
                    "step {step}: more requested than held: {seg:?}"
                );
                at += u128::from(r.size);
                match r.requested {
                    // In the segment nearest below it, as its trace told.
                    Some(_) if !seg.alone => {
                        let holder = model.segments.range(..=r.addr).next_back().map(|(&s, _)| s);
                        assert_eq!(
                            holder,
                            Some(seg.addr),
                            "step {step}: a block in another segment: {seg:?}"
                        );
                        starts.push(r.addr);
                    }
                    Some(_) => starts.push(r.addr),
                    None if !seg.alone => largest = largest.max(r.size),
                    None => {}
                }
            }
            // A segment (not a block alone) said to pass the top of the
            // address space is laid out up to it.
            let end = u128::from(seg.addr) + u128::from(seg.size);
            let end = if seg.alone { end } else { end.min(1 << 64) };
            assert_eq!(at, end, "step {step}: runs cover: {seg:?}");
        }
        starts.sort_unstable();
        let blocks: Vec<u64> = model.blocks.keys().copied().collect();
        assert_eq!(starts, blocks, "step {step}: every live block starts one run");
        assert_eq!(m.largest_free(), largest, "step {step}: the largest free run");
    });
}

/// Runs one input.
pub fn run_snapshot(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let Ok(max_entries) = u.int_in_range(0..=12usize) else { return };
    let map = Shared::new(MemoryMap::new(max_entries));
    let mut model = Model { max_entries, ..Model::default() };
    let mut in_flight: Vec<(Freeing<'_>, Told)> = Vec::new();
    let mut step = 0;
    let mut each = |u: &mut Unstructured<'_>| -> arbitrary::Result<()> {
        step += 1;
        match u.int_in_range(0..=9u8)? {
            0 | 1 => {
                let (a, s, stream, t) = (addr(u)?, size(u)?, u.int_in_range(0..=2u64)?, time(u)?);
                map.with(|m| m.segment_alloc(a, s, stream, t));
                model.segment_alloc(a, s, stream, t);
            }
            2 => {
                let (a, stream, t) = (addr(u)?, u.int_in_range(0..=2u64)?, time(u)?);
                let freed = map.with(|m| m.segment_free(a, stream, t)).map(|f| (f.size(), f.stream()));
                let expected = model.segment_free(a, stream, t).map(|(took, _)| match took {
                    Took::Segment { size, stream } => (size, stream),
                    Took::Block(_) => unreachable!(),
                });
                assert_eq!(freed, expected, "step {step}: segment_free");
            }
            3 | 4 => {
                let (a, s, stream, t) = (addr(u)?, size(u)?, u.int_in_range(0..=2u64)?, time(u)?);
                let requested = if u.ratio(1, 4)? { size(u)? } else { s - u.int_in_range(0..=s.min(63))? };
                map.with(|m| m.alloc(a, s, requested, stream, t));
                model.alloc(a, s, requested, stream, t);
            }
            5 => {
                let (a, stream, t) = (addr(u)?, u.int_in_range(0..=2u64)?, time(u)?);
                let freed = map.with(|m| m.free(a, stream, t)).map(|f| (f.size(), f.requested(), f.stream()));
                let expected = model.free(a, stream, t).map(|(took, _)| match took {
                    Took::Block(b) => (b.size, b.requested, b.stream),
                    Took::Segment { .. } => unreachable!(),
                });
                assert_eq!(freed, expected, "step {step}: free");
            }
            6 => {
                let side = if u.ratio(2, 3)? { Side::Blocks } else { Side::Segments };
                let (a, stream, t) = (addr(u)?, u.int_in_range(0..=2u64)?, time(u)?);
                let freeing = Freeing::new(&map, side, a, stream, t);
                in_flight.push((freeing, model.tell_ahead(side, a, stream, t)));
            }
            7 | 8 if !in_flight.is_empty() => {
                let i = u.choose_index(in_flight.len())?;
                let (freeing, told) = in_flight.remove(i);
                if u.arbitrary()? {
                    freeing.done();
                    model.done(told);
                } else {
                    drop(freeing);
                    model.refused(told);
                }
            }
            9 => {
                let (s, stream, t) = (size(u)?, u.int_in_range(0..=2u64)?, time(u)?);
                let free = u.arbitrary()?;
                map.with(|m| m.oom(s, stream, free, t));
                model.record(Action::Oom, free, s, stream, t);
            }
            _ => {
                let t = time(u)?;
                map.with(|m| m.set_time(t));
                model.now = t;
            }
        }
        check(&map, &model, step);
        Ok(())
    };
    while !u.is_empty() && each(&mut u).is_ok() {}
    // The frees still in flight are refused, newest first.
    while let Some((freeing, told)) = in_flight.pop() {
        drop(freeing);
        model.refused(told);
        check(&map, &model, usize::MAX);
    }
    let pickle = map.with(|m| m.pickle());
    assert_eq!(&pickle[..2], b"\x80\x02", "a pickle of protocol 2");
}
