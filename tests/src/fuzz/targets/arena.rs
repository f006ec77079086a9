//! The arena target: `ArenaResource` over the spied `SimDevice`, on four
//! stream ids and two threads.
//!
//! The model follows the arena's documented rules (`memres_core::arena`):
//!
//! - a request is *large* (served by the global arena) when its size is
//!   above `large_threshold`, or when its size class plus its alignment less
//!   256 bytes exceeds `superblock_size`; else it is *small* and served by
//!   the caller's arena (one per stream id, one per thread on stream 0);
//! - a small block occupies its size class, a large one its size rounded up
//!   to 256 bytes, and a free is checked against that: any size of the same
//!   class (small) or the same multiple of 256 (large) frees the block,
//!   another is `SizeMismatch`, a size above `Request::MAX_SIZE` too;
//! - a free synchronizes the freeing stream when the block is large or its
//!   arena serves another stream id; a failed synchronization fails the call
//!   and changes nothing;
//! - the table of arenas has `max_arenas` slots: a small request of a stream
//!   or thread with no arena yet claims one; with none left, the slots of
//!   idle arenas (nothing live) are freed, if their superblocks (if any) can
//!   be taken back by the caller (its stream can synchronize the device, or
//!   they are of its own stream id), and with none such it is
//!   `CapacityExhausted`; `release` frees the slot of every arena left with
//!   nothing live and no superblock, and leaves no wholly free superblock in
//!   the arenas the caller may take back;
//! - an arena gives up its slot only with nothing live (idle sweeps may
//!   retire arenas at any small request); a sweep that cannot synchronize
//!   takes nothing back and fails nothing, the request goes on;
//! - out of memory only when no free range of the caller's arena or of the
//!   global arena could serve, and the maximum or the upstream forbids
//!   growing;
//! - a growth at the maximum gives wholly free chunks back first; the
//!   upstream may refuse one (it stays), and a growth that then fails
//!   takes again what went back and answers the refusal, not out of
//!   memory;
//! - a growth that fails (the upstream's error) takes nothing new from the
//!   upstream, and a call may then still be served from a free range the
//!   arena held; its error stands only where no free range of the global
//!   arena holds the block (a small one: a superblock for it);
//! - a maximum below the superblock size is `InvalidConfig`, with nothing
//!   taken from upstream.

use super::super::{drive, FuzzResource, Model, Op};
use super::{round256, Spy};
use arbitrary::Unstructured;
use memres_core::arena::{ArenaConfig, ArenaResource, ArenaStats, DumpTarget, Owner};
use memres_core::testing::{SyncFaults, TestStream, SYNC_FAILURE};
use memres_core::{Block, Error, Inspect, MemoryResource, Request, Result};
use std::collections::HashMap;
use std::sync::Arc;

type Arena = ArenaResource<Spy>;

mod rules;

use rules::{dump_seen, sure_fit, Attempt, Helper, Key, Params, Placed, LANES};

/// `ArenaResource` over a spied `SimDevice`, driven on [`LANES`].
#[derive(Debug)]
struct ArenaTarget {
    arena: Arc<Arena>,
    spy: Spy,
    params: Params,
    faults: Arc<SyncFaults>,
    lanes: Vec<TestStream>,
    current: usize,
    helper: Option<Helper>,
    /// Live blocks by address.
    placed: HashMap<u64, Placed>,
    /// Arenas claimed, as the model counts them.
    keys: Vec<Key>,
    /// The arena's numbers of the main and the helper thread, learned
    /// when their arenas appear.
    threads: [Option<u64>; 2],
    last: Attempt,
}

impl ArenaTarget {
    fn key_of(&self, lane: usize) -> Key {
        match LANES[lane] {
            (0, helper) => Key::Thread(helper),
            (id, _) => Key::Stream(id),
        }
    }

    /// Runs `f` with the current lane's stream, on the lane's thread.
    fn on_lane<T: Send + 'static>(&mut self, f: impl FnOnce(&Arena, &TestStream) -> T + Send + 'static) -> T {
        let stream = self.lanes[self.current].clone();
        if LANES[self.current].1 {
            let arena = Arc::clone(&self.arena);
            self.helper.get_or_insert_with(Helper::spawn).run(move || f(&arena, &stream))
        } else {
            f(&self.arena, &stream)
        }
    }

    fn injected(&self) -> u64 {
        self.faults.failed_syncs()
    }

    /// The key of a dump's arena.
    fn key_of_owner(&self, owner: Owner) -> Option<Key> {
        match owner {
            Owner::Stream(id) => Some(Key::Stream(id)),
            Owner::Thread(n) if self.threads[0] == Some(n) => Some(Key::Thread(false)),
            Owner::Thread(n) if self.threads[1] == Some(n) => Some(Key::Thread(true)),
            _ => None,
        }
    }

    /// Whether a claim on stream `on` may free the slot of arena `a`: nothing
    /// live there, and its superblocks (if any) ones the caller may take back
    /// (after a device synchronization, or of its own stream id).
    fn retirable(&self, a: &ArenaStats, on: u64) -> bool {
        let stream = match a.owner {
            Owner::Stream(id) => id,
            _ => 0,
        };
        a.used == 0 && (a.superblocks == 0 || self.params.device_sync || stream == on)
    }

    /// Takes the arenas of the dump as the model's after a call that may
    /// claim a slot for `claimer` (learning its thread's number) or retire
    /// idle arenas; returns whether `claimer` got one.
    fn resync_keys(&mut self, claimer: Option<Key>) -> bool {
        let dump = self.arena.dump();
        if let Some(Key::Thread(helper)) = claimer {
            if self.threads[helper as usize].is_none() {
                let known = self.threads;
                self.threads[helper as usize] = dump.arenas.iter().find_map(|a| match a.owner {
                    Owner::Thread(n) if !known.contains(&Some(n)) => Some(n),
                    _ => None,
                });
            }
        }
        let mut keys = Vec::new();
        for a in &dump.arenas {
            match self.key_of_owner(a.owner) {
                Some(k) if !keys.contains(&k) => keys.push(k),
                _ => panic!("fuzz oracle: arena of an unknown or second owner {:?}", a.owner),
            }
        }
        for k in &self.keys {
            if !keys.contains(k) && self.placed.values().any(|p| !p.large && p.key == *k) {
                panic!("fuzz oracle: arena {k:?} gave up its slot with blocks live");
            }
        }
        let claimed = claimer.is_some_and(|c| keys.contains(&c));
        if keys.iter().any(|k| !self.keys.contains(k) && Some(*k) != claimer) {
            panic!("fuzz oracle: arenas {keys:?} appeared; the model had {:?}", self.keys);
        }
        self.keys = keys;
        claimed
    }

    /// Releases on every stream id with no failure armed: everything goes
    /// back upstream once nothing is live (a release on stream 0 takes back
    /// the superblocks of every thread's arena).
    fn release_everywhere(&mut self) {
        self.faults.fail_nth(0);
        self.spy.inner.fail_nth(0);
        for lane in (0..LANES.len()).filter(|&l| !LANES[l].1) {
            self.current = lane;
            if let Err(e) = self.on_lane(|a, s| a.release(s)) {
                panic!("fuzz oracle: release on lane {lane} failed: {e:?}");
            }
        }
        if self.arena.usage().used == 0 && (self.arena.usage().held != 0 || self.spy.inner.usage().held != 0)
        {
            panic!(
                "fuzz oracle: nothing in use and released on every stream, yet {} bytes held ({} upstream)",
                self.arena.usage().held,
                self.spy.inner.usage().held
            );
        }
    }
}

impl FuzzResource for ArenaTarget {
    fn allocate(&mut self, request: Request) -> Result<Block> {
        let key = self.key_of(self.current);
        let large = self.params.is_large(&request);
        let small = !request.is_zero() && !large;
        let claims = small && !self.keys.contains(&key);
        // A full table frees the slots of idle arenas whose superblocks
        // (if any) the caller may take back.
        let full = claims && self.keys.len() >= self.params.max_arenas as usize;
        let on = LANES[self.current].0;
        let table_full = full && !self.arena.dump().arenas.iter().any(|a| self.retirable(a, on));
        let (injected, held) = (self.injected(), self.arena.usage().held);
        let got = self.on_lane(move |a, s| a.allocate(request, s));
        let stream_failed = self.injected() != injected;
        // A small request's superblock request may sweep idle arenas
        // first, and a sweep that cannot synchronize fails nothing.
        let may_sweep = small && self.params.idle_after != 0;
        self.last = Attempt { large, key: small.then_some(key), table_full, stream_failed, may_sweep };
        // Idle sweeps may have retired arenas: the model follows.
        let claimed = self.resync_keys(claims.then_some(key));
        if claims {
            // The slot is claimed before the arena is asked, whatever it
            // answers; only a failed synchronization (taking superblocks
            // back to free a slot) keeps it from being claimed.
            if (table_full && claimed) || (!table_full && !claimed && !stream_failed) {
                panic!(
                    "fuzz oracle: {request:?} claimed an arena: {claimed}; the table was full: {table_full}, a synchronization failed: {stream_failed}"
                );
            }
        }
        if let Ok(block) = got {
            if table_full {
                panic!("fuzz oracle: {request:?} on a full arena table got {block:?}");
            }
            // An upstream failure fails the call, but for one in taking
            // back what a failed growth gave back first (as far as the
            // upstream allows), after which the call goes on, and for a
            // growth's: a failed growth leaves the arena as it was, and
            // the call may still be served from a free range held before,
            // with nothing taken from the upstream.
            let log = self.spy.log();
            let took = !log.granted.is_empty() || self.arena.usage().held > held;
            if (stream_failed && !may_sweep) || (log.failed_other && log.given_back.is_empty() && took) {
                panic!(
                    "fuzz oracle: {request:?} succeeded though a synchronization (failed: {stream_failed}) or the upstream failed; {held} bytes held before, {} after; upstream log {log:?}",
                    self.arena.usage().held
                );
            }
            if !block.is_empty() {
                let footprint = self.footprint_of(&request);
                let stream = LANES[self.current].0;
                self.placed.insert(block.addr(), Placed { large, key, stream, footprint });
            }
        }
        got
    }

    fn deallocate(&mut self, block: Block) -> Result<()> {
        loop {
            let before = self.summary();
            let (injected, syncs) = (self.injected(), self.faults.syncs());
            let got = self.on_lane(move |a, s| a.deallocate(block, s));
            if self.injected() != injected {
                // The synchronization failed: so must the free, changing
                // nothing; the caller tries again.
                if got != Err(SYNC_FAILURE) {
                    panic!(
                        "fuzz oracle: free of {block:?}: a synchronization failed and the free gave {got:?}"
                    );
                }
                let after = self.summary();
                if after != before {
                    panic!("fuzz oracle: free of {block:?} failed to synchronize and changed {before:?} -> {after:?}");
                }
                continue;
            }
            if got.is_ok() && !block.is_empty() {
                if let Some(p) = self.placed.remove(&block.addr()) {
                    // A free synchronizes when the block may be reused by
                    // another stream than the freeing one.
                    let on = LANES[self.current].0;
                    let want = u64::from(p.large || p.stream != on);
                    let made = self.faults.syncs() - syncs;
                    if made != want {
                        panic!(
                            "fuzz oracle: free of {block:?} ({p:?}) on stream {on:#x} synchronized {made} times, expected {want}"
                        );
                    }
                }
            }
            return got;
        }
    }

    fn release(&mut self) -> Option<Result<u64>> {
        let before = self.summary();
        let held = self.arena.usage().held;
        let injected = self.injected();
        let got = self.on_lane(|a, s| a.release(s));
        if self.injected() != injected {
            let after = self.summary();
            if got != Err(SYNC_FAILURE) || after != before {
                panic!("fuzz oracle: release failed to synchronize: {got:?}, {before:?} -> {after:?}");
            }
            return Some(Ok(0));
        }
        self.resync_keys(None);
        // The superblocks go back to the global arena before its chunks go
        // upstream: a refused chunk changes nothing of that.
        let refused = matches!(&got, Err(e) if self.spy.refused_free(e));
        if got.is_ok() || refused {
            let dump = self.arena.dump();
            let on = LANES[self.current].0;
            for a in &dump.arenas {
                let reclaims = self.params.device_sync
                    || matches!(a.owner, Owner::Stream(id) if id == on)
                    || (on == 0 && matches!(a.owner, Owner::Thread(_)));
                if reclaims && a.free_superblocks != 0 {
                    panic!("fuzz oracle: release on stream {on:#x} left wholly free superblocks: {a:?}");
                }
                if a.used == 0 && a.superblocks == 0 {
                    panic!("fuzz oracle: release left an idle arena its slot: {a:?}");
                }
            }
            // The spy refuses one free: every other wholly free chunk
            // went back.
            let kept = usize::from(refused);
            if dump.global.used == 0 && dump.chunks > kept {
                panic!(
                    "fuzz oracle: release kept {} chunks of {} bytes with nothing lent or live ({got:?})",
                    dump.chunks, dump.global.held
                );
            }
            if let Ok(bytes) = got {
                if held - bytes != dump.global.held {
                    panic!(
                        "fuzz oracle: release gave back {bytes} bytes of {held}, {} held now",
                        dump.global.held
                    );
                }
            }
        }
        Some(got)
    }

    fn check(&self, model: &Model) -> std::result::Result<(), String> {
        if super::super::invariant_checker_on() {
            self.arena.check().map_err(|v| v.to_string())?;
        }
        let held = self.arena.usage().held;
        if self.spy.inner.usage().held != held {
            return Err(format!(
                "upstream holds {} bytes, the arena says {held}",
                self.spy.inner.usage().held
            ));
        }
        if let Some(max) = self.params.maximum {
            if self.arena.usage().peak_held > max {
                return Err(format!(
                    "{} bytes held at the peak, above the maximum {max}",
                    self.arena.usage().peak_held
                ));
            }
        }
        // The model's blocks are the arena's: large ones in the global
        // arena, small ones in the arena of the stream or thread that asked.
        if self.placed.len() != model.live().len()
            || model
                .live()
                .iter()
                .any(|l| self.placed.get(&l.block.addr()).is_none_or(|p| p.footprint != l.footprint))
        {
            return Err("the target's record of live blocks differs from the model's".into());
        }
        let (mut large_blocks, mut large_bytes) = (0, 0);
        let mut used: HashMap<Key, u64> = HashMap::new();
        for p in self.placed.values() {
            if p.large {
                large_blocks += 1;
                large_bytes += p.footprint;
            } else {
                *used.entry(p.key).or_default() += p.footprint;
            }
        }
        let dump = self.arena.dump();
        if (dump.large_blocks, dump.large_bytes) != (large_blocks, large_bytes) {
            return Err(format!(
                "{} large blocks of {} bytes in the global arena, the model has {large_blocks} of {large_bytes}",
                dump.large_blocks, dump.large_bytes
            ));
        }
        if dump.arenas.len() != self.keys.len() {
            return Err(format!("{} arenas, the model claimed {:?}", dump.arenas.len(), self.keys));
        }
        for a in &dump.arenas {
            let key = self
                .key_of_owner(a.owner)
                .ok_or_else(|| format!("arena of an unknown owner {:?}", a.owner))?;
            if !self.keys.contains(&key) {
                return Err(format!("arena {key:?} was never claimed"));
            }
            let want = used.get(&key).copied().unwrap_or(0);
            if a.used != want || a.used + a.free != a.held {
                return Err(format!("arena {key:?}: {a:?}, the model has {want} bytes in use there"));
            }
        }
        Ok(())
    }

    fn used_bytes(&self) -> u64 {
        self.arena.usage().used
    }

    fn footprint(&self, size: u64) -> u64 {
        self.params.class(size)
    }

    fn footprint_of(&self, request: &Request) -> u64 {
        if self.params.is_large(request) {
            round256(request.size())
        } else {
            self.params.class(request.size())
        }
    }

    fn size_class_of(&self, _block: &Block, size: u64) -> u64 {
        if size > Request::MAX_SIZE {
            return u64::MAX; // no block's
        }
        // Small and large blocks: the arena checks the exact size asked for.
        size
    }

    fn odd_free_sizes(&self) -> bool {
        true
    }

    fn summary(&self) -> Vec<u64> {
        let d = self.arena.dump();
        let g = &d.global;
        let mut v = vec![
            self.arena.usage().used,
            g.held,
            d.chunks as u64,
            d.large_blocks,
            d.large_bytes,
            g.superblocks as u64,
            g.used,
            g.free,
            g.largest_free,
        ];
        for a in &d.arenas {
            v.extend([
                a.superblocks as u64,
                a.free_superblocks as u64,
                a.held,
                a.used,
                a.free,
                a.largest_free,
            ]);
        }
        v
    }

    fn spy(&self) -> Option<&Spy> {
        Some(&self.spy)
    }

    fn streams(&self) -> u8 {
        LANES.len() as u8
    }

    fn stream_op(&mut self, op: Op) {
        match op {
            Op::Stream { which } => self.current = which as usize % LANES.len(),
            Op::FailStream { n } => self.faults.fail_nth(n),
            // The fuzz streams have no work to advance or wait for.
            _ => {}
        }
    }

    fn judge_alloc_failure(
        &self,
        request: &Request,
        err: &Error,
        before: &[u64],
        _: &Model,
    ) -> std::result::Result<(), String> {
        let last = self.last;
        let log = self.spy.log();
        // A failed growth at the maximum takes again what it gave back
        // (also beside a chunk the upstream refused), as far as the
        // upstream allows.
        let held = self.arena.dump().global.held;
        let took_back = !log.granted.is_empty() || log.failed_other || !log.refused.is_empty();
        if held < before[1] && !took_back {
            return Err(format!("the arena gave back {:?} and did not ask for it again", log.given_back));
        }
        if last.table_full {
            return match err {
                Error::CapacityExhausted { capacity } if *capacity == self.params.max_arenas => Ok(()),
                _ => Err(format!(
                    "expected CapacityExhausted: the table of {} arenas is full",
                    self.params.max_arenas
                )),
            };
        }
        if last.stream_failed && (*err == SYNC_FAILURE || !last.may_sweep) {
            return match *err == SYNC_FAILURE {
                true => Ok(()),
                false => Err("a synchronization failed: expected its error".into()),
            };
        }
        let Error::OutOfMemory { requested, largest_free, pool_size, max_size } = *err else {
            let growth_failed = (matches!(err, Error::Backend { .. }) && log.failed_other)
                || (log.free_refused && self.spy.refused_free(err));
            if !growth_failed {
                return Err(format!("unexpected error; upstream log {log:?}"));
            }
            // A failed growth leaves the arena as it was: its error stands
            // only where no free range of the global arena holds the block,
            // or for a small one, a superblock for it.
            let (size, align) = (request.size(), request.align());
            let holds = if last.large {
                round256(size) + align - 256
            } else {
                round256(self.params.class(size) + align - 256).max(1 << 20)
            };
            let largest = self.arena.dump().global.largest_free;
            if largest >= holds {
                return Err(format!("the global arena's free range of {largest} bytes holds it"));
            }
            return Ok(());
        };
        if log.free_refused {
            return Err("out of memory after a refused free: the refusal is the cause".into());
        }
        if !log.granted_only_what_went_back() {
            return Err(format!(
                "the arena took chunks of {:?} bytes (it gave back {:?}) and still failed",
                log.granted, log.given_back
            ));
        }
        let dump = self.arena.dump();
        // An arena's free range serves blocks up to the large threshold only.
        let largest = dump
            .arenas
            .iter()
            .map(|a| a.largest_free.min(self.params.threshold))
            .fold(dump.global.largest_free, u64::max);
        if requested != request.size()
            || pool_size != dump.global.held
            || max_size != self.params.maximum
            || largest_free != largest
        {
            return Err(format!(
                "wrong figures: {} held, largest free {largest}, maximum {:?}",
                dump.global.held, self.params.maximum
            ));
        }
        let room = self.params.maximum.map_or(u64::MAX, |m| m - dump.global.held);
        let (size, align) = (request.size(), request.align());
        // The chunk the global arena would grow by at least.
        let need = if last.large {
            if dump.global.largest_free >= sure_fit(size, align) {
                return Err(format!(
                    "the global arena's free range of {} bytes fits it",
                    dump.global.largest_free
                ));
            }
            round256(size) + align - 256
        } else {
            let class = self.params.class(size);
            let key = last.key.expect("a small request has an arena");
            let mine = dump.arenas.iter().find(|a| self.key_of_owner(a.owner) == Some(key));
            let mine = mine.ok_or_else(|| format!("no arena {key:?}"))?;
            if mine.largest_free >= sure_fit(class, align) {
                return Err(format!(
                    "arena {key:?} has a free range of {} bytes that fits it",
                    mine.largest_free
                ));
            }
            // A superblock of the configured size, or at the maximum the
            // largest that fits, down to max(need, 1 MiB).
            let smallest = (class + align - 256).max(1 << 20);
            if dump.global.largest_free >= smallest {
                return Err(format!(
                    "the global arena's free range of {} bytes holds a superblock for it",
                    dump.global.largest_free
                ));
            }
            self.params.superblock.max(class + align - 256)
        };
        let can_grow = need <= Request::MAX_SIZE && need <= room;
        if can_grow && !log.refused.contains(&need) {
            return Err(format!(
                "a chunk of {need} bytes fits under the maximum and the upstream refused only {:?}",
                log.refused
            ));
        }
        Ok(())
    }
}

/// Fuzz target `arena`: [`ArenaResource`] over a spied `SimDevice`, with
/// superblocks of 1 to 8 MiB, thresholds from 0 to 8 MiB, one to 64 arena
/// slots, with or without size classes, a maximum, an initial size,
/// streams that can synchronize the device or not, idle sweeps every 1, 2
/// or 64 superblock requests or never, and a failure dump; calls on streams
/// 0 (from two threads), 1, 2 and a large id, whose synchronizations can be
/// made to fail.
pub fn run_arena(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let Ok((params, config, capacity)) = (|| -> arbitrary::Result<(Params, ArenaConfig, u64)> {
        let superblock = (1u64 << 20) * *u.choose(&[1u64, 1, 2, 8])?;
        let chunk = superblock * *u.choose(&[1u64, 2, 4])?;
        let threshold =
            (*u.choose(&[0u64, 1000, 4096, 256 << 10, 300_000, 1 << 20, 8 << 20])?).min(superblock);
        let max_arenas = *u.choose(&[1u32, 2, 3, 8, 64])?;
        let size_classes = u.arbitrary::<u8>()? % 8 != 0;
        let capacity = *u.choose(&[16u64 << 20, 256 << 20, 1 << 40])?;
        let initial = match u.int_in_range(0..=3u8)? {
            0 => 0,
            1 => 256 * u.int_in_range(1..=64u64)?,
            2 => chunk,
            _ => 4 * chunk,
        }
        .min(capacity);
        let maximum =
            if u.arbitrary()? { Some(initial + 256 * u.int_in_range(0..=1u64 << 18)?) } else { None };
        let device_sync = u.arbitrary()?;
        let mut config = ArenaConfig::new()
            .superblock_size(superblock)
            .chunk_size(chunk)
            .large_threshold(threshold)
            .max_arenas(max_arenas)
            .size_classes(size_classes)
            .initial_size(initial);
        if let Some(m) = maximum {
            config = config.maximum_size(m);
        }
        let idle_after = *u.choose(&[0u32, 1, 2, 64])?;
        config = config.idle_after(idle_after);
        if u.arbitrary()? {
            config = config.dump_on_failure(DumpTarget::Callback(dump_seen));
        }
        let params =
            Params { superblock, threshold, max_arenas, size_classes, maximum, device_sync, idle_after };
        Ok((params, config, capacity))
    })() else {
        return;
    };
    let spy = Spy::new(capacity);
    let faults = Arc::new(SyncFaults::new());
    let lanes: Vec<TestStream> = LANES
        .iter()
        .map(|&(id, _)| TestStream::with_faults(id, Arc::clone(&faults)).device_sync(params.device_sync))
        .collect();
    let made = ArenaResource::with_config(spy.clone(), config, &lanes[0]);
    if params.maximum.is_some_and(|m| m < params.superblock) {
        // No superblock could ever be had.
        match made {
            Err(Error::InvalidConfig { .. }) if spy.inner.usage().held == 0 => return,
            other => panic!(
                "fuzz oracle: a maximum below the superblock size gave {:?}, {} bytes taken",
                other.map(|_| ()),
                spy.inner.usage().held
            ),
        }
    }
    let arena = made.expect("a valid configuration over a roomy device");
    let mut target = ArenaTarget {
        arena: Arc::new(arena),
        spy,
        params,
        faults,
        lanes,
        current: 0,
        helper: None,
        placed: HashMap::new(),
        keys: Vec::new(),
        threads: [None; 2],
        last: Attempt::default(),
    };
    drive(&mut target, &mut u);
    target.release_everywhere();
}
