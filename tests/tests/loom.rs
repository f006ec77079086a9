//! loom models of memres's shared state. Run with
//! `RUSTFLAGS="--cfg loom" cargo test -p memres-tests --release --test loom`.
//! Each model states its preemption bound; loom explores every interleaving
//! within it.
#![cfg(loom)]

use loom::thread;
use memres_core::pool::CoalescingPool;
use memres_core::testing::loom::{model, spawn};
use memres_core::testing::BumpUpstream;
use memres_core::{Inspect, MemoryResource, Request, Shared};
use std::sync::Arc;

/// Two threads increment through the lock wrapper: no update is lost.
/// Preemption bound: 3.
#[test]
fn shared_excludes() {
    model(Some(3), || {
        let counter = Arc::new(Shared::<u32>::new(0));
        let c2 = counter.clone();
        let t = thread::spawn(move || c2.with(|c| *c += 1));
        counter.with(|c| *c += 1);
        t.join().unwrap();
        assert_eq!(counter.with(|c| *c), 2);
    });
}

/// Two threads allocate through a shared pool at once, one also frees: the
/// live blocks never overlap and the pool ends empty and consistent.
/// Preemption bound: 2.
#[test]
fn shared_pool_two_threads() {
    model(Some(2), || {
        let pool = Arc::new(Shared::new(CoalescingPool::new(BumpUpstream::new(1 << 30))));
        let p2 = pool.clone();
        let t = spawn(move || {
            let freed = p2.allocate(Request::new(256).unwrap(), &()).unwrap();
            p2.deallocate(freed, &()).unwrap();
            p2.allocate(Request::new(1000).unwrap(), &()).unwrap()
        });
        let a = pool.allocate(Request::new(3000).unwrap(), &()).unwrap();
        let b = t.join().unwrap();
        assert!(!a.range().overlaps(&b.range()), "{a:?} overlaps {b:?}");
        pool.deallocate(a, &()).unwrap();
        pool.deallocate(b, &()).unwrap();
        pool.with(|p| {
            p.check().unwrap();
            assert_eq!(p.usage().used, 0);
        });
    });
}

/// The stream-ordered layer shared by two threads, each on its own stream.
///
/// The streams are a small simulation built from loom's mutex: each has a
/// count of the work submitted to it and a vector clock of the work of other
/// streams it is ordered after (through waits). The world records every
/// `record` and `wait` call, knows which blocks are live and where each freed
/// range was last used, and checks every block handed out: it overlaps no
/// live block, and if it overlaps a range last used on another stream, the
/// taking stream waited on an event recorded on that stream after the use
/// (or the use is known complete on the host, through a query or a
/// synchronize).
mod stream_ordered {
    use loom::sync::Mutex;
    use memres_core::pool::{CoalescingPool, PoolConfig};
    use memres_core::stream_ordered::{CrossStream, StreamOrdered};
    use memres_core::testing::loom::{model, spawn};
    use memres_core::testing::BumpUpstream;
    use memres_core::{Block, Error, Inspect, MemoryResource, Request, Result, Shared, Stream};
    use std::sync::Arc;

    const STREAMS: usize = 3;

    /// A call the layer made on a stream.
    #[derive(Clone, Copy, Debug)]
    enum Call {
        /// `record` on `stream` when its work count was `at`.
        Record {
            stream: usize,
            at: u64,
        },
        /// `wait` on `stream` for an event of `on` at its work count `at`.
        Wait {
            stream: usize,
            on: usize,
            at: u64,
        },
        Query,
        Synchronize,
    }

    #[derive(Debug, Default)]
    struct State {
        /// Work submitted to each stream (a count).
        work: [u64; STREAMS],
        /// `clock[s][t]`: the work of `t` that later work of `s` is ordered
        /// after.
        clock: [[u64; STREAMS]; STREAMS],
        /// Work of each stream known complete on the host.
        done: [u64; STREAMS],
        calls: Vec<Call>,
        /// Live blocks as (addr, len, stream).
        live: Vec<(u64, u64, usize)>,
        /// Freed ranges not handed out since, as (addr, len, stream of the
        /// last use, work count of the last use).
        freed: Vec<(u64, u64, usize, u64)>,
        /// Blocks handed out over a range last used on another stream.
        moved: u32,
    }

    #[derive(Debug, Default)]
    struct World(Mutex<State>);

    fn overlaps(a: (u64, u64), b: (u64, u64)) -> bool {
        a.0 < b.0 + b.1 && b.0 < a.0 + a.1
    }

    impl World {
        /// `block` was handed out on `stream`: check it against the live
        /// blocks and the last uses of what it covers.
        fn took(&self, stream: &TestStream, block: Block) {
            let s = stream.index();
            let mut st = self.0.lock().unwrap();
            let range = (block.addr(), block.size());
            if let Some(l) = st.live.iter().find(|l| overlaps(range, (l.0, l.1))) {
                panic!("{block:?} handed out on stream {s} overlaps live block {l:?}");
            }
            let mut moved = false;
            for &(addr, len, t, at) in &st.freed {
                if t == s || !overlaps(range, (addr, len)) {
                    continue;
                }
                moved = true;
                assert!(
                    st.clock[s][t] >= at || st.done[t] >= at,
                    "{block:?} taken on stream {s} is not ordered after its last use on stream {t} \
                     (work {at}); calls: {:?}",
                    st.calls
                );
            }
            st.moved += u32::from(moved);
            // The new user is ordered after those uses: they are settled.
            st.freed.retain(|f| !overlaps(range, (f.0, f.1)));
            st.live.push((block.addr(), block.size(), s));
        }

        /// The last use of `block` is submitted to `stream`, just before the
        /// block is freed on it.
        fn last_use(&self, stream: &TestStream, block: Block) {
            let s = stream.index();
            let mut st = self.0.lock().unwrap();
            let i = st.live.iter().position(|l| l.0 == block.addr()).expect("freeing a live block");
            st.live.swap_remove(i);
            st.work[s] += 1;
            let at = st.work[s];
            st.freed.push((block.addr(), block.size(), s, at));
        }

        fn moved(&self) -> u32 {
            self.0.lock().unwrap().moved
        }

        fn live(&self) -> usize {
            self.0.lock().unwrap().live.len()
        }

        /// Every wait is on an event the layer has just recorded on another
        /// stream (both under the layer's lock, so nothing comes between).
        fn check_waits(&self) {
            let st = self.0.lock().unwrap();
            for (i, c) in st.calls.iter().enumerate() {
                if let Call::Wait { stream, on, at } = *c {
                    let before = i.checked_sub(1).map(|j| st.calls[j]);
                    assert!(
                        matches!(before, Some(Call::Record { stream: r, at: a }) if r == on && a == at && on != stream),
                        "wait without a record just before it on another stream: {:?}",
                        st.calls
                    );
                }
            }
        }

        fn count(&self, f: impl Fn(&Call) -> bool) -> usize {
            self.0.lock().unwrap().calls.iter().filter(|c| f(c)).count()
        }
    }

    /// An event: the recording stream's vector clock at the record.
    #[derive(Clone, Copy, Debug)]
    struct Event {
        stream: usize,
        clock: [u64; STREAMS],
    }

    #[derive(Clone, Debug)]
    struct TestStream {
        id: u64,
        world: Arc<World>,
    }

    impl TestStream {
        fn index(&self) -> usize {
            self.id as usize
        }
    }

    impl Stream for TestStream {
        type Event = Event;
        fn id(&self) -> u64 {
            self.id
        }
        fn record(&self) -> Result<Event> {
            let s = self.index();
            let mut st = self.world.0.lock().unwrap();
            let mut clock = st.clock[s];
            clock[s] = st.work[s];
            st.calls.push(Call::Record { stream: s, at: clock[s] });
            Ok(Event { stream: s, clock })
        }
        fn wait(&self, e: &Event) -> Result<()> {
            let s = self.index();
            let mut st = self.world.0.lock().unwrap();
            for t in 0..STREAMS {
                st.clock[s][t] = st.clock[s][t].max(e.clock[t]);
            }
            st.calls.push(Call::Wait { stream: s, on: e.stream, at: e.clock[e.stream] });
            Ok(())
        }
        fn query(&self, e: &Event) -> Result<bool> {
            // Work completes only when a stream is synchronized.
            let mut st = self.world.0.lock().unwrap();
            let done = (0..STREAMS).all(|t| st.done[t] >= e.clock[t]);
            st.calls.push(Call::Query);
            Ok(done)
        }
        fn synchronize(&self) -> Result<()> {
            let s = self.index();
            let mut st = self.world.0.lock().unwrap();
            // The stream's work and all it waited for are complete.
            for t in 0..STREAMS {
                let upto = if t == s { st.work[s] } else { st.clock[s][t] };
                st.done[t] = st.done[t].max(upto);
            }
            st.calls.push(Call::Synchronize);
            Ok(())
        }
    }

    type Layer = Shared<StreamOrdered<CoalescingPool<BumpUpstream>, TestStream>>;

    fn setup(cross: CrossStream, max: Option<u64>) -> (Arc<Layer>, TestStream, TestStream) {
        let world = Arc::new(World::default());
        let config = match max {
            Some(m) => PoolConfig::new().initial_size(m).maximum_size(m),
            None => PoolConfig::new(),
        };
        let pool = CoalescingPool::with_config(BumpUpstream::new(1 << 30), config, &()).unwrap();
        let layer = Arc::new(Shared::new(StreamOrdered::new(pool).with_cross_stream(cross)));
        let s1 = TestStream { id: 1, world: world.clone() };
        let s2 = TestStream { id: 2, world };
        (layer, s1, s2)
    }

    /// Allocates on `s` and checks the block with the world; out of memory
    /// is `None`.
    fn take(layer: &Layer, s: &TestStream, size: u64) -> Option<Block> {
        match layer.allocate(Request::new(size).unwrap(), s) {
            Ok(b) => {
                s.world.took(s, b);
                Some(b)
            }
            Err(Error::OutOfMemory { .. }) => None,
            Err(e) => panic!("{e}"),
        }
    }

    fn give(layer: &Layer, s: &TestStream, block: Block) {
        s.world.last_use(s, block);
        layer.deallocate(block, s).unwrap();
    }

    /// Everything is freed: the layer and its pool agree and hold no live
    /// byte.
    fn check_empty(layer: &Layer, world: &World) {
        assert_eq!(world.live(), 0);
        world.check_waits();
        layer.with(|so| {
            so.check().unwrap();
            assert_eq!((so.live_count(), so.usage().used), (0, 0));
            assert_eq!(so.inner().usage().used, so.listed_bytes());
        });
    }

    /// Thread 1 allocates, uses and frees a block on stream 1, then
    /// allocates again; thread 2 does the same on stream 2 at once. Either
    /// may take the other's freed block: no two live blocks ever overlap,
    /// each block taken from the other stream's list was ordered after its
    /// last use by a record on the freeing stream and a wait on the taking
    /// one, and the layer makes exactly one record and one wait per block it
    /// moves.
    /// Preemption bound: 4 (about 5,000 interleavings, under a second in
    /// release).
    #[test]
    fn cross_stream_reuse_waits_on_the_freeing_stream() {
        model(Some(4), || {
            let (layer, s1, s2) = setup(CrossStream::Wait, None);
            let world = s1.world.clone();
            let (l2, t2) = (layer.clone(), s2.clone());
            let t = spawn(move || {
                let b = take(&l2, &t2, 1000).unwrap();
                give(&l2, &t2, b);
                take(&l2, &t2, 1000).unwrap()
            });
            let a = take(&layer, &s1, 1000).unwrap();
            give(&layer, &s1, a);
            let a = take(&layer, &s1, 1000).unwrap();
            let b = t.join().unwrap();
            let steals = layer.with(|so| so.stats().steals) as usize;
            assert_eq!(world.count(|c| matches!(c, Call::Wait { .. })), steals);
            assert_eq!(world.count(|c| matches!(c, Call::Record { .. })), steals);
            assert_eq!(world.moved() as usize, steals);
            give(&layer, &s1, a);
            give(&layer, &s2, b);
            check_empty(&layer, &world);
        });
    }

    /// A block allocated on stream 1 is freed on stream 2 by another thread
    /// while the first thread allocates on stream 1: it is then stream 2's
    /// to reuse at once, and stream 1's only after a wait.
    /// Preemption bound: none (all of its few hundred interleavings).
    #[test]
    fn free_on_another_stream_than_the_allocation() {
        model(None, || {
            let (layer, s1, s2) = setup(CrossStream::Wait, None);
            let world = s1.world.clone();
            let a = take(&layer, &s1, 1000).unwrap();
            let (l2, t2) = (layer.clone(), s2.clone());
            let t = spawn(move || {
                give(&l2, &t2, a);
                take(&l2, &t2, 1000).unwrap()
            });
            let c = take(&layer, &s1, 1000).unwrap();
            let b = t.join().unwrap();
            give(&layer, &s1, c);
            give(&layer, &s2, b);
            check_empty(&layer, &world);
        });
    }

    /// The pool holds one chunk, its maximum. Thread 1 holds a small block
    /// and frees it on stream 1; thread 2 asks for the whole chunk on stream
    /// 2, which the freed block (listed on stream 1, too small to steal)
    /// stands in the way of: the layer must synchronize stream 1 and merge
    /// its list before the pool can serve it. Whatever the interleaving, the
    /// whole chunk is handed out over the small block's range only after its
    /// last use is complete, each such move is a steal (record and wait) or
    /// a last resort (synchronize), and once both threads are done the
    /// chunk can be had on either stream.
    /// Preemption bound: none (all of its few hundred interleavings).
    #[test]
    fn last_resort_synchronizes_before_reuse_on_another_stream() {
        const MAX: u64 = 2 << 20;
        model(None, || {
            let (layer, s1, s2) = setup(CrossStream::Wait, Some(MAX));
            let world = s1.world.clone();
            let (l2, t2) = (layer.clone(), s2.clone());
            let t = spawn(move || {
                let big = take(&l2, &t2, MAX);
                if let Some(b) = big {
                    give(&l2, &t2, b);
                }
                big.is_some()
            });
            if let Some(a) = take(&layer, &s1, 1000) {
                give(&layer, &s1, a);
            }
            let got_big = t.join().unwrap();
            // Nothing is live now: the whole chunk can be had on either
            // stream.
            let big = take(&layer, &s2, MAX).unwrap();
            give(&layer, &s2, big);
            let big = take(&layer, &s1, MAX).unwrap();
            give(&layer, &s1, big);
            assert!(got_big || world.moved() > 0);
            let stats = layer.with(|so| so.stats());
            assert!(u64::from(world.moved()) <= stats.steals + stats.last_resorts);
            check_empty(&layer, &world);
        });
    }

    /// The checker finds the race when the layer hands a block to another
    /// stream without waiting ([`CrossStream::Unordered`], kept for this
    /// purpose): the model above with the wait left out fails.
    /// Preemption bound: 2.
    #[test]
    #[should_panic(expected = "is not ordered after its last use")]
    fn checker_catches_reuse_without_a_wait() {
        model(Some(2), || {
            let (layer, s1, s2) = setup(CrossStream::Unordered, None);
            let (l2, t2) = (layer.clone(), s2.clone());
            let t = spawn(move || {
                let b = take(&l2, &t2, 1000).unwrap();
                give(&l2, &t2, b);
            });
            let a = take(&layer, &s1, 1000).unwrap();
            give(&layer, &s1, a);
            t.join().unwrap();
        });
    }
}
