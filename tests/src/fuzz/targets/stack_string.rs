//! The fuzz target of stack strings: a stack decoded from the input as the
//! text a user writes (`stats(pool(sim, growth=8))`), sometimes misspelt,
//! built over the simulator and driven on three streams.

use arbitrary::{Result as ArbResult, Unstructured};
use memres_core::adaptor::{Aligned, Limiting, Statistics, Tracking};
use memres_core::arena::ArenaResource;
use memres_core::binning::BinningResource;
use memres_core::check::LiveBlocks;
use memres_core::fixed::FixedSizeResource;
use memres_core::per_stream::{PerStreamPool, PoolMaker, VirtualMaker};
use memres_core::planned::Planned;
use memres_core::pool::CoalescingPool;
use memres_core::stack::{parse, parse_size, Built, Call, OnStream, Value};
use memres_core::stream_ordered::StreamOrdered;
use memres_core::vpool::VirtualPool;
use memres_core::{Block, DynResource, Error, Inspect, MemoryResource, Request, Result, Shared, Stream};
use memres_sim::{HbChecked, SimAddressSpace, SimDevice, SimStream, SimWorld};
use std::any::Any;
use std::sync::Arc;

/// Values of keys and arguments: sizes where configurations break, and
/// words that are no size.
const VALUES: &[&str] = &[
    "0",
    "1",
    "3",
    "7",
    "8",
    "64",
    "65",
    "255",
    "256",
    "1000",
    "1024",
    "4096",
    "64K",
    "1KB",
    "1m",
    "1MiB",
    "2MiB",
    "3MiB",
    "32MiB",
    "1GiB",
    "64GiB",
    "1TiB",
    "16EiB",
    "18446744073709551615",
    "99999999999999999999",
    "-1",
    "1.5",
    "0x10",
    "",
    "true",
    "false",
    "yes",
    "peak",
    "double",
    "default",
];

/// The algorithms and adaptors of the core's builder and the stream
/// layer, with their keys (`log` is left out: it writes a file).
const LAYERS: &[(&str, &[&str])] = &[
    ("pool", &["initial", "max", "growth", "granule", "release", "large", "per_stream"]),
    ("fixed", &["size", "blocks"]),
    ("binning", &["min_bin", "max_bin", "powers"]),
    ("arena", &["initial", "max", "superblock"]),
    ("stream", &[]),
    ("stats", &[]),
    ("track", &[]),
    ("planned", &[]),
    ("limit", &["bytes"]),
    ("align", &["alignment", "threshold"]),
];

/// Sizes a bin takes (multiples of 256 bytes).
const BIN_SIZES: &[&str] = &["256", "512", "768", "1024", "4096", "64KiB", "1MiB"];

const VPOOL_KEYS: &[&str] =
    &["reserve", "release_threshold", "granule", "slack", "trim_on_commit", "handle_granules", "per_stream"];

fn pick<'a>(u: &mut Unstructured<'_>, of: &[&'a str]) -> ArbResult<&'a str> {
    u.choose(of).copied()
}

/// `, key=value` up to twice; a key of another name now and then.
fn keys(u: &mut Unstructured<'_>, text: &mut String, own: &[&str]) -> ArbResult<()> {
    for _ in 0..u.int_in_range(0..=2)? {
        let key = if own.is_empty() || u.ratio(1, 8)? {
            pick(u, &["x", "initial", "bytes"])?
        } else {
            pick(u, own)?
        };
        *text += &format!(", {key}={}", pick(u, VALUES)?);
    }
    Ok(())
}

/// A leaf: `sim`, `sim(capacity)` or a virtual pool over a `sim`.
fn leaf(u: &mut Unstructured<'_>) -> ArbResult<String> {
    Ok(match u.int_in_range(0u8..=3)? {
        0 => "sim".into(),
        1 => format!("sim({})", pick(u, &["64GiB", "1GiB", "64MiB"])?),
        2 => format!("sim({})", pick(u, VALUES)?),
        _ => {
            let capacity = if u.ratio(3, 4)? { "1TiB" } else { pick(u, VALUES)? };
            let mut text = format!("vpool(sim({capacity})");
            keys(u, &mut text, VPOOL_KEYS)?;
            text + ")"
        }
    })
}

/// The resource of a counted bin: a leaf of its own (each `sim` and
/// `vpool` of a stack has addresses of its own), bare or under one layer.
fn bin_resource(u: &mut Unstructured<'_>) -> ArbResult<String> {
    let leaf = leaf(u)?;
    if u.ratio(1, 2)? {
        return Ok(leaf);
    }
    let &(name, own) = u.choose(LAYERS)?;
    let mut text = format!("{name}({leaf}");
    keys(u, &mut text, own)?;
    Ok(text + ")")
}

/// A stack of up to `depth` layers over a leaf.
fn stack(u: &mut Unstructured<'_>, depth: u32) -> ArbResult<String> {
    if depth == 0 || u.ratio(1, 4)? {
        return leaf(u);
    }
    let &(name, own) = u.choose(LAYERS)?;
    let mut text = format!("{name}({}", stack(u, depth - 1)?);
    if matches!(name, "limit" | "fixed") && u.ratio(2, 3)? {
        text += &format!(", {}", pick(u, VALUES)?);
    }
    if name == "binning" {
        // Bins given one by one: fixed-size ones over the upstream, and
        // counted ones over a resource of their own.
        for _ in 0..u.int_in_range(0..=2)? {
            let size = if u.ratio(3, 4)? { pick(u, BIN_SIZES)? } else { pick(u, VALUES)? };
            text += &format!(", bin({size}");
            if u.ratio(1, 3)? {
                text += &format!(", {}", bin_resource(u)?);
            }
            text += ")";
        }
    }
    keys(u, &mut text, own)?;
    Ok(text + ")")
}

/// The text, with up to two bytes deleted, inserted or replaced in one
/// input of four.
fn text(u: &mut Unstructured<'_>) -> ArbResult<String> {
    let depth = u.int_in_range(1..=4)?;
    let mut bytes = stack(u, depth)?.into_bytes();
    if u.ratio(1, 4)? {
        for _ in 0..u.int_in_range(1..=2)? {
            let i = u.choose_index(bytes.len())?;
            let b = *u.choose(b"(),= a1_\0\xff")?;
            match u.int_in_range(0u8..=2)? {
                0 => drop(bytes.remove(i)),
                1 => bytes.insert(i, b),
                _ => bytes[i] = b,
            }
        }
    }
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// A request: sizes from 0 to past what any resource serves, and now and
/// then an alignment up to 16 MiB (or one that is no power of two).
fn request(u: &mut Unstructured<'_>) -> ArbResult<std::result::Result<Request, Error>> {
    let size = match u.int_in_range(0u8..=9)? {
        0 => 0,
        1 => u.int_in_range(1..=300)?,
        2..=4 => u.int_in_range(1..=64u64 << 10)?,
        5..=7 => u.int_in_range(1..=8u64 << 20)?,
        8 => u.int_in_range(1..=300u64 << 20)?,
        _ => *u.choose(&[u64::MAX, Request::MAX_SIZE, Request::MAX_SIZE + 1, 1 << 40, 3 << 30])?,
    };
    if u.ratio(1, 6)? {
        let align = 1u64 << u.int_in_range(0..=24)?;
        return Ok(Request::aligned(size, if u.ratio(1, 16)? { align + 1 } else { align }));
    }
    Ok(Request::new(size))
}

/// The stack text `data` decodes to, as [`run_stack_string`] reads it:
/// to read a finding, or to choose seeds that build.
pub fn stack_string_of(data: &[u8]) -> Option<String> {
    text(&mut Unstructured::new(data)).ok()
}

/// Fuzz target `stack_string`: a stack string decoded from the input
/// (every algorithm and adaptor of the core's builder, nested up to four
/// deep, over `sim` or a `vpool`, with keys and values where configurations
/// break, `binning`'s `bin(SIZE)` bins and `bin(SIZE, RESOURCE)` bins over a
/// leaf of their own, one text in four misspelt), built
/// over a `SimWorld` (each `sim`'s frees synchronize it, as `cuMemFree`
/// does: `FreeSynchronizes`), then up to
/// 300 operations on three streams, behind the happens-before checker
/// (`HbChecked`): allocations (each used by a kernel on its stream), frees
/// of live blocks on any stream (ordered after the block's use, as a
/// correct caller does), double frees, frees of foreign addresses,
/// `step()` of every `planned` layer, and `release()`.
///
/// A text that does not build fails with a `StackError` inside the text.
/// After every operation the checker of every resource of the stack that
/// has one passes (`pool`, `fixed`, `binning`, `arena`, `vpool`, `sim`;
/// `stream`, `planned` and `limit`, whose checkers need one of the stack
/// under them, run their own layer's, `check_layer`); the `stats`, `track`
/// and `limit` layers at its top (over nothing but each other) count
/// exactly the live blocks. Every block handed out holds its request, is
/// aligned as asked and overlaps no live block; in a stack that promises
/// stream order (`promises_stream_order`) it is no reuse, on another
/// stream, of memory freed there that the stream is not ordered after
/// (no `HbViolation`). An allocation fails only as a request the
/// stack cannot serve (a size or alignment above a `fixed` block's,
/// metadata full) or out of memory where it may be: a `max=` or a `limit`
/// in the stack, or a leaf without room for the request and the chunks
/// its layers take (sizes the text names, the layers' defaults); a failed
/// one leaves the resource under the top layers with the bytes in use it
/// had. A free of a live block succeeds on any stream; a double or
/// foreign free fails and changes no figure of any resource. Once every
/// block is freed, a `release()` leaves nothing lent by a `sim` leaf.
pub fn run_stack_string(data: &[u8]) {
    stack_string_order(data);
}

/// What a run of the `stack_string` target saw of memory moving between
/// streams: the corpus test checks that the committed inputs reach both.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StackOrder {
    /// Reuses of freed memory on another stream than the free's, ordered
    /// after it, in stacks that promise stream order: what the checker
    /// judged there and found right.
    pub ordered_reuses: u64,
    /// Reuses on another stream not ordered after the free, in stacks that
    /// do not promise stream order (documented, not prevented): races the
    /// checker sees but does not judge.
    pub races_unpromised: u64,
}

impl std::ops::AddAssign for StackOrder {
    fn add_assign(&mut self, o: Self) {
        self.ordered_reuses += o.ordered_reuses;
        self.races_unpromised += o.races_unpromised;
    }
}

/// Runs `data` as [`run_stack_string`] does, and says what the run saw
/// across streams.
pub fn stack_string_order(data: &[u8]) -> StackOrder {
    let mut order = StackOrder::default();
    let _ = run(&mut Unstructured::new(data), &mut order);
    order
}

/// Whether `block` shares a byte with a live block (a free of it would
/// free the live one, or be refused as inside it).
fn overlaps_live(blocks: &[(Block, usize)], block: Block) -> bool {
    let end = block.addr().saturating_add(block.size());
    blocks.iter().any(|(b, _)| b.addr() < end && block.addr() < b.addr() + b.size())
}

/// A `sim` leaf as the `cuda` leaf is (`cuMemFree`): a free waits for the
/// whole device first, so memory it takes back may go to any stream at
/// once. (`SimDevice` alone ignores streams: a stack that gives memory
/// back to it and takes it again on another stream would race by the
/// device's doing, which no real device does.) The stack keeps the
/// device itself as the `sim`'s handle.
struct FreeSynchronizes {
    device: D,
    world: SimWorld,
}

impl MemoryResource<SimStream> for FreeSynchronizes {
    fn allocate(&self, request: Request, stream: &SimStream) -> Result<Block> {
        self.device.allocate(request, stream)
    }
    fn deallocate(&self, block: Block, stream: &SimStream) -> Result<()> {
        self.world.synchronize();
        self.device.deallocate(block, stream)
    }
}

/// Whether the stack `call` promises stream order to its caller, as the
/// docs say (docs/safety.md, *Stream order*; docs/cuda.md, *Why the
/// default is stream-ordered*; each layer's rustdoc): memory freed on a
/// stream is handed out on another only once that stream is ordered after
/// the free. It holds for
///
/// - `stream` (`StreamOrdered`): a block reaches another stream after an
///   event wait, and goes back to the layers under it only once its free
///   completed (a release synchronizes first);
/// - `arena`: a free on another stream than the block's arena's
///   synchronizes the freeing stream, and superblocks leave an arena only
///   after a synchronization;
/// - `vpool(..., per_stream=true)`: each stream's pool has addresses of its
///   own;
/// - a `sim` leaf, whose frees synchronize the device here
///   ([`FreeSynchronizes`]);
/// - `pool(UP, per_stream=true)` where `UP` promises it: chunks move
///   between streams' pools ordered, but what goes back upstream is freed
///   there on the calling stream, for `UP` to hand to any stream;
/// - `planned(UP)` where `UP` promises it: its regions serve another
///   stream only after a synchronization, every other block is `UP`'s;
/// - the layers that pass calls through (`stats`, `track`, `limit`,
///   `align`) where the stack under them promises it.
///
/// It does not hold for `pool`, `fixed`, `binning` and `vpool` without
/// `per_stream`: one free list for all streams takes a block back at once
/// and may hand it to another stream, which the docs say and nothing
/// prevents (docs/safety.md).
fn promises_stream_order(call: &Call) -> bool {
    let upstream_promises = || call.resource(0).is_ok_and(promises_stream_order);
    let per_stream = call.bool_arg("per_stream") == Ok(Some(true));
    match call.name.as_str() {
        "stream" | "arena" | "sim" => true,
        "vpool" => per_stream,
        "pool" => per_stream && upstream_promises(),
        "planned" | "stats" | "track" | "limit" | "align" => upstream_promises(),
        _ => false,
    }
}

type D = DynResource<SimStream>;
type StreamLayer = Shared<StreamOrdered<OnStream<SimStream>, SimStream>>;
type Vpool = Shared<VirtualPool<SimAddressSpace>>;
type VpoolPerStream = Shared<PerStreamPool<VirtualMaker<Arc<SimAddressSpace>>, SimStream>>;

/// The layers that pass every call through and hold no memory.
const PASSING: &[&str] = &["stats", "track", "limit", "align"];

/// The resources of a built stack, by the typed handles it keeps (each
/// name's type: [`Built::get`]).
struct Handles {
    /// Every resource with a checker and figures.
    inspected: Vec<Named>,
    /// The stream-ordered layers: their checker leaves out the stack under
    /// them, whose resources are checked each on its own.
    streams: Vec<Arc<StreamLayer>>,
    sims: Vec<Arc<SimDevice>>,
    vpools: Vec<Arc<Vpool>>,
    vpools_per_stream: Vec<Arc<VpoolPerStream>>,
    /// Checked as `streams` are, by their own layer's checker.
    planned: Vec<Arc<Planned<D>>>,
    stats: Vec<Arc<Statistics<D>>>,
    track: Vec<Arc<Tracking<D>>>,
    /// Checked as `streams` are, by their own layer's checker.
    limit: Vec<Arc<Limiting<D>>>,
    /// How many of `stats`, `track` and `limit` (outermost first) are at
    /// the top of the stack, over nothing but each other and `align`: they
    /// see every call the caller makes.
    top: [usize; 3],
    /// The resource under them, which hands out the caller's blocks.
    under_top: Under,
}

/// The resource under the layers at the top of a stack, as its bytes in
/// use are read.
enum Under {
    Inspected(Arc<dyn Inspect + Send + Sync>),
    Stream(Arc<StreamLayer>),
    /// `planned`, which has no figures of its own.
    Unread,
}

impl Under {
    /// The resource under the top layers of a stack, `call`, the first of
    /// its name in the text (the layers above are all before it).
    fn of(built: &Built<SimStream>, call: &Call) -> Self {
        fn first<T: Inspect + Any + Send + Sync>(built: &Built<SimStream>, name: &str) -> Under {
            Under::Inspected(built.get::<T>(name).expect("the handle of a call built"))
        }
        let per_stream = call.bool_arg("per_stream") == Ok(Some(true));
        match call.name.as_str() {
            "sim" => first::<SimDevice>(built, "sim"),
            "vpool" if per_stream => first::<VpoolPerStream>(built, "vpool"),
            "vpool" => first::<Vpool>(built, "vpool"),
            "pool" if per_stream => first::<Shared<PerStreamPool<PoolMaker<D>, SimStream>>>(built, "pool"),
            "pool" => first::<Shared<CoalescingPool<D>>>(built, "pool"),
            "fixed" => first::<Shared<FixedSizeResource<D>>>(built, "fixed"),
            "binning" => first::<BinningResource<'static, D, SimStream>>(built, "binning"),
            "arena" => first::<ArenaResource<D>>(built, "arena"),
            "stream" => Under::Stream(built.get("stream").expect("the handle of a call built")),
            _ => Under::Unread,
        }
    }

    /// The bytes it has handed out, as it counts them (`None`: unread).
    fn in_use(&self) -> Option<u64> {
        match self {
            Under::Inspected(r) => Some(r.usage().used),
            Under::Stream(s) => Some(s.with(|so| so.held_bytes() - so.listed_bytes())),
            Under::Unread => None,
        }
    }
}

/// A resource with a checker and figures, and its name.
type Named = (&'static str, Arc<dyn Inspect + Send + Sync>);

/// Every resource named `name` of type `T`.
fn named<T: Inspect + Any + Send + Sync>(built: &Built<SimStream>, name: &'static str) -> Vec<Named> {
    built.all::<T>(name).into_iter().map(|h| (name, h as Arc<dyn Inspect + Send + Sync>)).collect()
}

impl Handles {
    fn of(built: &Built<SimStream>, root: &Call, text: &str) -> Self {
        let mut inspected = named::<SimDevice>(built, "sim");
        inspected.extend(named::<Vpool>(built, "vpool"));
        inspected.extend(named::<VpoolPerStream>(built, "vpool"));
        inspected.extend(named::<Shared<CoalescingPool<D>>>(built, "pool"));
        inspected.extend(named::<Shared<PerStreamPool<PoolMaker<D>, SimStream>>>(built, "pool"));
        inspected.extend(named::<Shared<FixedSizeResource<D>>>(built, "fixed"));
        inspected.extend(named::<BinningResource<'static, D, SimStream>>(built, "binning"));
        inspected.extend(named::<ArenaResource<D>>(built, "arena"));
        let mut top = [0; 3];
        let mut call = root;
        while let Some(i) = PASSING.iter().position(|&n| n == call.name) {
            if let Some(t) = top.get_mut(i) {
                *t += 1;
            }
            call = call.resource(0).expect("it built");
        }
        let under_top = Under::of(built, call);
        let h = Handles {
            inspected,
            streams: built.all("stream"),
            sims: built.all("sim"),
            vpools: built.all("vpool"),
            vpools_per_stream: built.all("vpool"),
            planned: built.all("planned"),
            stats: built.all("stats"),
            track: built.all("track"),
            limit: built.all("limit"),
            top,
            under_top,
        };
        // Every handle is read as its type: none is left unchecked unseen.
        let found = |name: &str| match name {
            "stream" => h.streams.len(),
            "planned" => h.planned.len(),
            "stats" => h.stats.len(),
            "track" => h.track.len(),
            "limit" => h.limit.len(),
            "align" => built.all::<Aligned<D>>("align").len(),
            _ => h.inspected.iter().filter(|(n, _)| *n == name).count(),
        };
        for (name, _) in built.names() {
            let kept = built.names().filter(|(n, _)| *n == name).count();
            assert_eq!(
                found(name),
                kept,
                "{text}: {kept} `{name}` kept, {} read as their types",
                found(name)
            );
        }
        h
    }

    /// Runs every checker; checks that the layers at the top count exactly
    /// the live `blocks`.
    fn check(&self, blocks: &[(Block, usize)], text: &str, when: &str) {
        for (name, r) in &self.inspected {
            if let Err(v) = r.check() {
                panic!("{text}: a `{name}`'s checker {when}: {v}");
            }
        }
        for s in &self.streams {
            if let Err(v) = s.with(|so| so.check_layer()) {
                panic!("{text}: a `stream`'s checker {when}: {v}");
            }
        }
        for p in &self.planned {
            if let Err(v) = p.check_layer() {
                panic!("{text}: a `planned`'s checker {when}: {v}");
            }
        }
        for l in &self.limit {
            if let Err(v) = l.check_layer() {
                panic!("{text}: a `limit`'s checker {when}: {v}");
            }
        }
        let bytes: u64 = blocks.iter().map(|(b, _)| b.size()).sum();
        let charged: u64 =
            blocks.iter().map(|(b, _)| b.size().next_multiple_of(Limiting::<()>::GRANULE)).sum();
        let [stats, track, limit] = self.top;
        for (k, s) in self.stats[..stats].iter().enumerate() {
            let counted = s.get_bytes_counter().value;
            assert_eq!(
                counted, bytes as i64,
                "{text}: stats {k} counts {counted} bytes, the blocks {bytes}, {when}"
            );
        }
        for (k, t) in self.track[..track].iter().enumerate() {
            let counted = t.get_allocated_bytes();
            assert_eq!(
                counted, bytes,
                "{text}: track {k} counts {counted} bytes, the blocks {bytes}, {when}"
            );
        }
        for (k, l) in self.limit[..limit].iter().enumerate() {
            let counted = l.get_allocated_bytes();
            assert_eq!(
                counted, charged,
                "{text}: limit {k} charges {counted} bytes, the blocks {charged}, {when}"
            );
        }
    }

    /// Every figure of every resource: no failed free may change one.
    fn figures(&self) -> Vec<u64> {
        let mut f = Vec::new();
        for (_, r) in &self.inspected {
            let u = r.usage();
            f.extend([u.used, u.held, u.peak_held, u.free, u.largest_free]);
        }
        for s in &self.streams {
            f.extend(s.with(|so| [so.live_count() as u64, so.held_bytes(), so.listed_bytes()]));
        }
        for p in &self.planned {
            f.extend([p.held(), p.passed_through()]);
        }
        for s in &self.stats {
            let (b, a) = (s.get_bytes_counter(), s.get_allocations_counter());
            f.extend([b.value, b.peak, b.total, a.value, a.peak, a.total].map(|v| v as u64));
        }
        f.extend(self.track.iter().map(|t| t.get_allocated_bytes()));
        f.extend(self.limit.iter().map(|l| l.get_allocated_bytes()));
        f
    }

    /// Whether a leaf has too little left (a device's memory, a virtual
    /// pool's physical memory or reserved addresses) for four times `need`
    /// and `margin` more (the chunks its layers take): out of memory is
    /// fair then.
    fn short_of(&self, need: u64, margin: u64, streams: &[SimStream]) -> bool {
        let room = need.saturating_mul(4).saturating_add(margin);
        let sim = self.sims.iter().any(|d| d.capacity().saturating_sub(d.usage().used) < room);
        // A virtual pool's physical memory, and the addresses of its one
        // reservation (or of the stream's pool; a stream without one has
        // yet to reserve).
        let physical = |s: &SimAddressSpace| s.physical_bytes().saturating_sub(s.committed_bytes()) < room;
        let addresses = |free: u64, granule: u64| free < room.saturating_add(2 * granule);
        let vpool = self
            .vpools
            .iter()
            .any(|v| v.with(|p| physical(p.space()) || addresses(p.usage().largest_free, p.granule())));
        let per_stream = self.vpools_per_stream.iter().any(|v| {
            v.with(|p| {
                physical(p.maker().space())
                    || streams.iter().any(|s| {
                        p.pool_of(s.id()).is_none_or(|q| addresses(q.usage().largest_free, q.granule()))
                    })
            })
        });
        sim || vpool || per_stream
    }
}

/// What the text says that bounds what the stack may take: whether it has
/// a `max=` or a `limit`, and the two largest numbers its layers are given
/// (not a leaf's capacity, nor a reservation's size).
fn bounds(call: &Call, bounded: &mut bool, numbers: &mut Vec<u64>) {
    *bounded |= call.name == "limit";
    for arg in &call.args {
        *bounded |= arg.key.as_deref() == Some("max");
        match &arg.value {
            Value::Call(c) if c.args.is_empty() => numbers.extend(parse_size(&c.name)),
            Value::Call(c) if call.name != "sim" => bounds(c, bounded, numbers),
            Value::Word { text, .. } if call.name != "sim" && arg.key.as_deref() != Some("reserve") => {
                numbers.extend(parse_size(text));
            }
            _ => {}
        }
    }
}

/// Whether `err`, the answer to the valid `request`, is one the stack
/// may give: out of memory where [`Handles::short_of`] or a bound says so,
/// a size or alignment a `fixed` block (a `binning`'s bins are) or a
/// virtual pool's span refuses, metadata full in the resources that have
/// it.
fn may_fail(
    h: &Handles,
    names: &[&str],
    (bounded, margin): (bool, u64),
    request: &Request,
    err: &Error,
    streams: &[SimStream],
) -> bool {
    let has = |n: &str| names.contains(&n);
    let align = if request.align() > 256 { request.align() } else { 0 };
    let need = request.rounded_size(256).saturating_add(align);
    // No leaf holds 64 TiB, and layers round up to sizes no request takes.
    let huge = need > SimDevice::MAX_CAPACITY;
    match err {
        Error::OutOfMemory { .. } | Error::LimitExceeded { .. } => {
            bounded || huge || h.short_of(need, margin, streams)
        }
        Error::InvalidSize { .. } => huge || has("fixed") || has("binning") || has("vpool"),
        Error::InvalidAlignment { .. } => has("fixed") || has("binning"),
        Error::CapacityExhausted { .. } => ["pool", "fixed", "binning", "arena"].iter().any(|n| has(n)),
        _ => false,
    }
}

fn run(u: &mut Unstructured<'_>, order: &mut StackOrder) -> ArbResult<()> {
    let text = text(u)?;
    let world = SimWorld::new();
    let streams: Vec<SimStream> = (0..3).map(|_| world.stream()).collect();
    let mut builder = memres_sim::builder::<SimStream>();
    builder.register_stream_layer();
    let device_world = world.clone();
    builder.register("sim", move |call, cx| {
        let device = cx.keep(call, memres_sim::sim(call, cx)?);
        Ok(Arc::new(FreeSynchronizes { device, world: device_world.clone() }))
    });
    let built: Built<SimStream> = match builder.build_with_handles(&text, &streams[0]) {
        Ok(built) => built,
        Err(e) => {
            assert!(e.pos <= text.len(), "{text:?}: error at byte {} of {}: {e}", e.pos, text.len());
            return Ok(());
        }
    };
    let root = parse(&text).expect("a text that builds parses");
    let h = Handles::of(&built, &root, &text);
    let names: Vec<&str> = built.names().map(|(n, _)| n).collect();
    let (mut bounded, mut numbers) = (false, Vec::new());
    bounds(&root, &mut bounded, &mut numbers);
    numbers.sort_unstable_by(|a, b| b.cmp(a));
    // A layer takes chunks of its sizes (a `fixed`'s, of up to 128 blocks
    // by default, or as many as given), or of its defaults (a `binning`'s
    // largest bin, 4 MiB, in chunks of 128 blocks): at most this.
    let (big, next) = (numbers.first().copied().unwrap_or(0), numbers.get(1).copied().unwrap_or(0));
    let margin = (1u64 << 30).max(big.saturating_mul(128)).max(big.saturating_mul(next)).saturating_mul(2);
    // Every call goes through the happens-before checker; its violations
    // are judged where the stack promises stream order.
    let ordered = promises_stream_order(&root);
    let mr = HbChecked::new(&built.resource);
    let judge_order = |when: &str| {
        if let Some(v) = mr.violations().first().filter(|_| ordered) {
            panic!("{text}: promises stream order, yet {when}: {v}");
        }
    };
    let mut live = LiveBlocks::new();
    let mut blocks: Vec<(Block, usize)> = Vec::new();
    let mut freed: Vec<Block> = Vec::new();
    h.check(&blocks, &text, "once built");
    for _ in 0..u.int_in_range(0..=300)? {
        let stream = u.choose_index(streams.len())?;
        match u.int_in_range(0u8..=19)? {
            0..=8 => {
                let Ok(request) = request(u)? else { continue };
                let before = h.under_top.in_use();
                match mr.allocate(request, &streams[stream]) {
                    Ok(block) => {
                        if let Err(v) = live.insert(block, request) {
                            panic!("{text}: {request:?} got {block:?}: {v:?}");
                        }
                        streams[stream].enqueue(); // a kernel uses it
                        blocks.push((block, stream));
                    }
                    Err(e) => {
                        assert!(
                            may_fail(&h, &names, (bounded, margin), &request, &e, &streams),
                            "{text}: {request:?} failed with {e:?}"
                        );
                        // Nothing handed out: the resource under the top
                        // layers counts its blocks as before (the layers
                        // under it may hold more or less: a failed growth
                        // takes back what it gave back, in chunks its
                        // upstream sizes).
                        let after = h.under_top.in_use();
                        assert_eq!(
                            after, before,
                            "{text}: {request:?} failed with {e:?}, yet changed the bytes in use"
                        );
                    }
                }
                judge_order("after an allocation");
                h.check(&blocks, &text, "after an allocation");
            }
            9..=15 if !blocks.is_empty() => {
                let (block, used_on) = blocks.swap_remove(u.choose_index(blocks.len())?);
                live.remove(&block).expect("a live block");
                if used_on != stream {
                    // As a correct caller: the free comes after the block's use.
                    let used = streams[used_on].record().expect("no stream call fails here");
                    streams[stream].wait(&used).expect("no stream call fails here");
                }
                if let Err(e) = mr.deallocate(block, &streams[stream]) {
                    panic!("{text}: the free of live {block:?} failed with {e:?}");
                }
                freed.push(block);
                h.check(&blocks, &text, "after a free");
            }
            16 if !freed.is_empty() => {
                // Only where no live block lies: that free would be the live one's.
                let block = *u.choose(&freed)?;
                if !block.is_empty() && !overlaps_live(&blocks, block) {
                    let before = h.figures();
                    assert!(
                        mr.deallocate(block, &streams[stream]).is_err(),
                        "{text}: a double free of {block:?}"
                    );
                    assert_eq!(h.figures(), before, "{text}: a double free of {block:?} changed figures");
                }
                h.check(&blocks, &text, "after a double free");
            }
            17 => {
                let addr = u.arbitrary::<u64>()? & !255;
                let block = Block::from_addr(addr, 256 * u64::from(u.int_in_range(1u16..=4096)?));
                if !overlaps_live(&blocks, block) {
                    let before = h.figures();
                    assert!(
                        mr.deallocate(block, &streams[stream]).is_err(),
                        "{text}: a free of foreign {block:?}"
                    );
                    assert_eq!(h.figures(), before, "{text}: a free of foreign {block:?} changed figures");
                }
                h.check(&blocks, &text, "after a foreign free");
            }
            18 => {
                for p in &h.planned {
                    p.step(&streams[stream]).unwrap_or_else(|e| panic!("{text}: step failed with {e:?}"));
                }
                h.check(&blocks, &text, "after a step");
            }
            _ => {
                if let Err(e) = built.release_layers().release(&streams[stream]) {
                    panic!("{text}: release failed with {e:?}");
                }
                h.check(&blocks, &text, "after a release");
            }
        }
    }
    for (block, stream) in blocks.drain(..) {
        live.remove(&block).expect("a live block");
        if let Err(e) = mr.deallocate(block, &streams[stream]) {
            panic!("{text}: the last free of {block:?} failed with {e:?}");
        }
    }
    if ordered {
        order.ordered_reuses = mr.ordered_cross_stream_reuses();
    } else {
        order.races_unpromised = mr.violation_count() as u64;
    }
    h.check(&blocks, &text, "once every block is freed");
    // A simulated stream has no stream to free on when dropped: the caller
    // releases first. Then nothing stays held from a `sim` leaf.
    if let Err(e) = built.release_layers().release(&streams[0]) {
        panic!("{text}: the last release failed with {e:?}");
    }
    h.check(&blocks, &text, "after the last release");
    for device in &h.sims {
        let held = device.usage().used;
        assert_eq!(
            held, 0,
            "{text}: the device still lends {held} bytes after every block was freed and released"
        );
    }
    Ok(())
}
