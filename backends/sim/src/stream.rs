//! Simulated streams and events, with vector clocks.
//!
//! A [`SimWorld`] is the timeline of one simulated device. Each [`SimStream`]
//! of it is a queue of work; nothing runs by itself. Work completes only
//! when the test says so ([`SimWorld::advance`], [`SimWorld::complete`]) or
//! when the host waits for it ([`Stream::synchronize`]), so every test is
//! deterministic.
//!
//! # Model
//!
//! The streams of a world are numbered from 0, the default stream, in the
//! order they were made; their ids ([`Stream::id`]) are unique in the
//! process, but the default stream's: 0 in every world, as CUDA's legacy
//! stream is the stream 0 of every device. So two worlds' streams share no
//! free lists, and an event serves the streams of its own world only.
//!
//! Stream `i` keeps a vector clock `clock_i`: `clock_i[i]` is the number of
//! operations submitted to `i` (its *position*), and `clock_i[j]` is how much
//! of stream `j`'s work the next operation on `i` is ordered after (through
//! waits on events, directly or transitively). An event is a copy of the
//! clock at the time it was recorded; waiting on it joins it into the
//! waiter's clock.
//!
//! The world also keeps, per stream, the position up to which the device
//! has *completed* the stream's work, and the position up to which the host
//! has *observed* completion (a successful query, a synchronize). Memory freed
//! on stream `a` at position `p` may be reused on stream `b` once
//! `clock_b[a] >= p` or `observed[a] >= p`
//! ([`SimStream::is_ordered_after`]).
//!
//! The default stream (id 0) is CUDA's legacy default stream: work on it is
//! ordered after all earlier work of the *blocking* streams, and their later
//! work after its earlier work. Streams from [`SimWorld::non_blocking_stream`]
//! are not ordered with it.

use memres_core::check::FailNth;
use memres_core::device::{DeviceId, DeviceStream};
use memres_core::{Error, Result, Stream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// The next world's id: what tells its events from another world's.
static NEXT_WORLD: AtomicU64 = AtomicU64::new(0);
/// The next stream's id, in any world (the default streams' is 0).
static NEXT_STREAM: AtomicU64 = AtomicU64::new(1);

/// A wait on, a query of or a completion of an event of another world.
const FOREIGN_EVENT: Error = Error::Backend { code: 4, what: "event of another simulated world" };

/// The timeline of one simulated device: its streams, what they have
/// submitted, and what has completed.
///
/// Cheap to clone (a shared handle). Its events order its own streams
/// only: a wait on, a query of or a completion of an event of another
/// world is an error, and nothing changes.
///
/// # Examples
///
/// ```
/// use memres_core::Stream;
/// use memres_sim::SimWorld;
/// let world = SimWorld::new();
/// let (a, b) = (world.stream(), world.stream());
/// a.enqueue();
/// let ev = a.record()?;
/// assert!(!b.query(&ev)?); // nothing has run yet
/// b.wait(&ev)?;
/// assert!(b.is_ordered_after(a.id(), 1));
/// world.advance(); // the device finishes all submitted work
/// assert!(b.query(&ev)?);
/// # Ok::<(), memres_core::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct SimWorld {
    /// Unique in the process.
    id: u64,
    state: Arc<Mutex<World>>,
}

#[derive(Debug)]
struct World {
    /// Indexed by the streams' numbers; entry 0 is the default stream.
    /// Their ids rise with their numbers.
    streams: Vec<StreamState>,
    /// The injected failure of a stream call (record, wait, synchronize).
    fail: FailNth,
    /// Calls so far that changed a clock or a completion, or recorded an
    /// event: an operation can be taken back while it is the last of them.
    changes: u64,
}

/// An operation [`SimStream::submit`] submitted: what
/// [`SimStream::retract`] needs to take it back.
#[derive(Debug)]
pub(crate) struct Submitted {
    /// Its position on the stream.
    pub(crate) position: u64,
    /// The stream's clock before it.
    before: Vec<u64>,
    /// The world's `changes` after it.
    changes: u64,
}

#[derive(Debug)]
struct StreamState {
    /// The stream's id: 0 for the default stream.
    id: u64,
    /// Whether the stream synchronizes with the legacy default stream.
    blocking: bool,
    /// The stream's vector clock; missing entries are 0.
    clock: Vec<u64>,
    /// Position up to which the device has finished this stream's work.
    completed: u64,
    /// Position up to which the host knows the work finished;
    /// `observed <= completed`.
    observed: u64,
}

/// `a := a ⊔ b`.
fn join(a: &mut Vec<u64>, b: &[u64]) {
    if a.len() < b.len() {
        a.resize(b.len(), 0);
    }
    for (x, &y) in a.iter_mut().zip(b) {
        *x = (*x).max(y);
    }
}

impl World {
    /// The number of the stream of this world whose id is `id`.
    fn number_of(&self, id: u64) -> Option<usize> {
        self.streams.binary_search_by_key(&id, |s| s.id).ok()
    }

    /// The clock that the next operation on stream `i` is ordered after,
    /// implicit default-stream ordering included.
    fn effective(&self, i: usize) -> Vec<u64> {
        let s = &self.streams[i];
        let mut c = s.clock.clone();
        if s.blocking {
            if i == 0 {
                for t in self.streams.iter().filter(|t| t.blocking) {
                    join(&mut c, &t.clock);
                }
            } else {
                join(&mut c, &self.streams[0].clock);
            }
        }
        c
    }

    fn fail_point(&mut self) -> Result<()> {
        if self.fail.fires() {
            return Err(Error::Backend { code: 3, what: "injected failure of a simulated stream" });
        }
        Ok(())
    }

    /// Marks the work of every clock entry as completed, and as observed by
    /// the host when `observe`.
    fn complete(&mut self, clock: &[u64], observe: bool) {
        self.changes += 1;
        for (s, &p) in self.streams.iter_mut().zip(clock) {
            s.completed = s.completed.max(p);
            if observe {
                s.observed = s.observed.max(p);
            }
        }
    }

    /// Each stream's position: the clock of all work submitted so far.
    fn positions(&self) -> Vec<u64> {
        self.streams.iter().enumerate().map(|(i, s)| s.clock.get(i).copied().unwrap_or(0)).collect()
    }

    fn is_complete(&self, clock: &[u64]) -> bool {
        self.streams.iter().zip(clock).all(|(s, &p)| s.completed >= p)
    }
}

impl Default for SimWorld {
    fn default() -> Self {
        Self::new()
    }
}

impl SimWorld {
    /// A world with only the default stream (id 0).
    pub fn new() -> Self {
        let default = StreamState { id: 0, blocking: true, clock: vec![0], completed: 0, observed: 0 };
        SimWorld {
            id: NEXT_WORLD.fetch_add(1, Ordering::Relaxed),
            state: Arc::new(Mutex::new(World { streams: vec![default], fail: FailNth::new(), changes: 0 })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, World> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn add_stream(&self, blocking: bool) -> SimStream {
        let mut w = self.lock();
        let number = w.streams.len();
        // Taken under the lock, so the world's ids rise with its numbers.
        let id = NEXT_STREAM.fetch_add(1, Ordering::Relaxed);
        // Empty: a clock grows only as its stream learns of others (its own
        // work included), so n streams do not hold n² entries.
        w.streams.push(StreamState { id, blocking, clock: Vec::new(), completed: 0, observed: 0 });
        SimStream { world: self.clone(), id, number }
    }

    /// The default stream, id 0 (CUDA's legacy stream).
    pub fn default_stream(&self) -> SimStream {
        SimStream { world: self.clone(), id: 0, number: 0 }
    }

    /// A new blocking stream (as `cudaStreamCreate`): ordered with the
    /// default stream. Its id is no other stream's of the process.
    pub fn stream(&self) -> SimStream {
        self.add_stream(true)
    }

    /// A new non-blocking stream (`cudaStreamNonBlocking`): not ordered with
    /// the default stream.
    pub fn non_blocking_stream(&self) -> SimStream {
        self.add_stream(false)
    }

    /// Number of streams, the default one included.
    pub fn stream_count(&self) -> usize {
        self.lock().streams.len()
    }

    /// The device finishes all work submitted so far. The host does not
    /// learn of it until it queries or synchronizes.
    pub fn advance(&self) {
        let mut w = self.lock();
        let all = w.positions();
        w.complete(&all, false);
    }

    /// The device finishes the work before `event` (and what it depends on);
    /// later work stays pending.
    ///
    /// # Errors
    ///
    /// [`Error::Backend`] for an event of another world; nothing completes.
    pub fn complete(&self, event: &SimEvent) -> Result<()> {
        if event.world != self.id {
            return Err(FOREIGN_EVENT);
        }
        self.lock().complete(&event.clock, false);
        Ok(())
    }

    /// The host waits for the whole device (`cudaDeviceSynchronize`).
    pub fn synchronize(&self) {
        let mut w = self.lock();
        let all = w.positions();
        w.complete(&all, true);
    }

    /// Makes the `n`th stream call (record, wait, synchronize) from now fail
    /// with a backend error (`n = 1`: the next one); `n = 0` cancels.
    pub fn fail_nth(&self, n: u64) {
        self.lock().fail.arm(n);
    }

    /// Injected stream failures delivered so far: an armed failure fires
    /// in a later call, or never.
    ///
    /// ```
    /// use memres_core::Stream;
    /// let world = memres_sim::SimWorld::new();
    /// let s = world.stream();
    /// world.fail_nth(2);
    /// s.record()?;
    /// assert_eq!(world.injected_failures(), 0);
    /// assert!(s.record().is_err());
    /// assert_eq!(world.injected_failures(), 1);
    /// # Ok::<(), memres_core::Error>(())
    /// ```
    pub fn injected_failures(&self) -> u64 {
        self.lock().fail.delivered()
    }
}

/// A point in a stream's work: a copy of its vector clock when recorded.
///
/// # Examples
///
/// ```
/// use memres_core::Stream;
/// use memres_sim::SimWorld;
/// let world = SimWorld::new();
/// let s = world.stream();
/// s.enqueue();
/// let ev = s.record()?;
/// assert_eq!((ev.stream(), ev.position()), (s.id(), 1));
/// # Ok::<(), memres_core::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct SimEvent {
    /// The world's id.
    world: u64,
    /// The recording stream's id and number.
    stream: u64,
    number: usize,
    clock: Vec<u64>,
}

// Equal where they say the same: a clock grows with what its stream
// learns, so one may hold zeros past another's end.
impl PartialEq for SimEvent {
    fn eq(&self, other: &Self) -> bool {
        let (short, long) = match self.clock.len() <= other.clock.len() {
            true => (&self.clock, &other.clock),
            false => (&other.clock, &self.clock),
        };
        (self.world, self.stream, self.number) == (other.world, other.stream, other.number)
            && long[..short.len()] == short[..]
            && long[short.len()..].iter().all(|&t| t == 0)
    }
}

impl Eq for SimEvent {}

impl SimEvent {
    /// The id of the stream it was recorded on.
    pub fn stream(&self) -> u64 {
        self.stream
    }

    /// The recording stream's position: the operations before the event.
    pub fn position(&self) -> u64 {
        self.clock.get(self.number).copied().unwrap_or(0)
    }
}

/// A simulated stream of a [`SimWorld`]: a handle, cheap to clone,
/// `Send + Sync`.
///
/// # Examples
///
/// ```
/// use memres_core::Stream;
/// use memres_sim::SimWorld;
/// let world = SimWorld::new();
/// let s = world.stream();
/// let p = s.enqueue(); // a kernel
/// let ev = s.record()?;
/// assert!(!s.query(&ev)?);
/// s.synchronize()?;
/// assert!(s.query(&ev)? && s.is_observed(s.id(), p));
/// # Ok::<(), memres_core::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct SimStream {
    world: SimWorld,
    id: u64,
    /// Its number in the world: its entry in the clocks.
    number: usize,
}

impl SimStream {
    /// The world the stream belongs to.
    pub fn world(&self) -> &SimWorld {
        &self.world
    }

    /// Submits one operation (a kernel, a copy, a free) and returns its
    /// position on the stream.
    pub fn enqueue(&self) -> u64 {
        self.submit().position
    }

    /// [`enqueue`](Self::enqueue), keeping what [`retract`](Self::retract)
    /// needs.
    pub(crate) fn submit(&self) -> Submitted {
        let mut w = self.world.lock();
        let i = self.number;
        let mut c = w.effective(i);
        if c.len() <= i {
            c.resize(i + 1, 0);
        }
        c[i] += 1;
        let position = c[i];
        let before = std::mem::replace(&mut w.streams[i].clock, c);
        w.changes += 1;
        Submitted { position, before, changes: w.changes }
    }

    /// Takes back `op`, the operation of this stream that a call then
    /// failed to make: its position is free again, and a blocking stream
    /// is no longer ordered after the default stream's work through it. Only
    /// while nothing changed in the world since (no operation, wait,
    /// record or completion); else it stays, an operation that does nothing.
    pub(crate) fn retract(&self, op: Submitted) {
        let mut w = self.world.lock();
        if w.changes == op.changes {
            w.streams[self.number].clock = op.before;
            w.changes += 1;
        }
    }

    /// Operations submitted to the stream so far.
    pub fn position(&self) -> u64 {
        let w = self.world.lock();
        w.streams[self.number].clock.get(self.number).copied().unwrap_or(0)
    }

    /// Whether this stream's next operation is ordered after position `pos`
    /// of stream `other`: through waits (direct or transitive), the default
    /// stream's implicit ordering, or because the host has observed that
    /// work complete. Always true for `other == self.id()`. `other` is
    /// taken as a stream of this world: id 0 names this world's default
    /// stream, as every world's default has id 0 (the crate's checkers
    /// tell the worlds apart); any other id of another world is false (but
    /// for `pos` 0).
    pub fn is_ordered_after(&self, other: u64, pos: u64) -> bool {
        if other == self.id {
            return true;
        }
        let w = self.world.lock();
        let Some(j) = w.number_of(other) else { return pos == 0 };
        w.streams[j].observed >= pos || w.effective(self.number).get(j).copied().unwrap_or(0) >= pos
    }

    /// Whether the host has observed position `pos` of stream `other` of
    /// this stream's world complete (id 0: this world's default stream).
    pub fn is_observed(&self, other: u64, pos: u64) -> bool {
        let w = self.world.lock();
        w.number_of(other).map_or(0, |j| w.streams[j].observed) >= pos
    }

    /// Whether `other` is this stream: the same id in the same world (the
    /// default streams of all worlds have id 0).
    pub(crate) fn is(&self, other: &SimStream) -> bool {
        self.id == other.id && self.world.id == other.world.id
    }

    /// Whether this stream's next operation is ordered after position
    /// `pos` of `other`, a stream of any world: of another world only once
    /// the host has observed that work complete, as nothing else orders
    /// the work of two devices.
    pub(crate) fn is_ordered_after_stream(&self, other: &SimStream, pos: u64) -> bool {
        match self.world.id == other.world.id {
            true => self.is_ordered_after(other.id, pos),
            false => other.is_observed(other.id, pos),
        }
    }
}

impl Stream for SimStream {
    type Event = SimEvent;

    fn id(&self) -> u64 {
        self.id
    }

    fn record(&self) -> Result<SimEvent> {
        let mut w = self.world.lock();
        w.fail_point()?;
        let clock = w.effective(self.number);
        w.changes += 1;
        Ok(SimEvent { world: self.world.id, stream: self.id, number: self.number, clock })
    }

    /// Joins the event's clock into this stream's.
    ///
    /// # Errors
    ///
    /// An injected failure; [`Error::Backend`] for an event of another
    /// world. Nothing changes then.
    fn wait(&self, event: &SimEvent) -> Result<()> {
        let mut w = self.world.lock();
        w.fail_point()?;
        if event.world != self.world.id {
            return Err(FOREIGN_EVENT);
        }
        join(&mut w.streams[self.number].clock, &event.clock);
        w.changes += 1;
        Ok(())
    }

    /// # Errors
    ///
    /// [`Error::Backend`] for an event of another world.
    fn query(&self, event: &SimEvent) -> Result<bool> {
        if event.world != self.world.id {
            return Err(FOREIGN_EVENT);
        }
        let mut w = self.world.lock();
        if w.is_complete(&event.clock) {
            w.complete(&event.clock, true);
            Ok(true)
        } else {
            Ok(false)
        }
    }

    /// The host waits for the work submitted to the stream: its last
    /// operation's clock, not its next one's, which on a blocking stream
    /// takes in default-stream work submitted since (that work may be
    /// pending still). The default stream's synchronize is itself an
    /// operation of the legacy stream, which first waits on every blocking
    /// stream (CUDA's "standard default stream semantics"): its next
    /// operation's clock.
    fn synchronize(&self) -> Result<()> {
        let mut w = self.world.lock();
        w.fail_point()?;
        let c = if self.number == 0 { w.effective(0) } else { w.streams[self.number].clock.clone() };
        w.complete(&c, true);
        Ok(())
    }

    /// [`SimWorld::synchronize`], which can fail as the other calls can.
    fn synchronize_device(&self) -> Result<bool> {
        self.world.lock().fail_point()?;
        self.world.synchronize();
        Ok(true)
    }
}

/// A simulated world is one device, 0: its resources are registered under
/// `SimStream` (the containers made without a resource look them up so).
impl DeviceStream for SimStream {
    type Key = SimStream;
    fn key(&self) -> &SimStream {
        self
    }
    fn device(&self) -> DeviceId {
        0
    }
}

#[cfg(test)]
mod tests;
