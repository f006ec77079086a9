//! The fuzz target of stack strings: a stack decoded from the input as the
//! text a user writes (`stats(pool(sim, growth=8))`), sometimes misspelt,
//! built over the simulator and driven on three streams.

use arbitrary::{Result as ArbResult, Unstructured};
use memres_core::adaptor::Statistics;
use memres_core::check::LiveBlocks;
use memres_core::planned::Planned;
use memres_core::stack::Built;
use memres_core::{Block, DynResource, Error, Inspect, MemoryResource, Request};
use memres_sim::{SimDevice, SimStream, SimWorld};
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
/// over a `SimWorld`, then up to
/// 300 operations on three streams: allocations, frees of live blocks on
/// any stream, double frees, frees of foreign addresses, `step()` of every
/// `planned` layer, and `release()`.
///
/// A text that does not build fails with a `StackError` inside the text.
/// Every block handed out holds its request, is aligned as asked and
/// overlaps no live block; an allocation fails only as out of memory or as
/// a request the stack cannot serve; a free of a live block succeeds on any
/// stream; a double or foreign free fails; a stack with `stats` outermost
/// counts exactly the live blocks' bytes after every call, and nothing
/// once they are freed; once every block is freed, a `release()` leaves
/// nothing lent by a `sim` leaf.
pub fn run_stack_string(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let _ = run(&mut u);
}

/// Whether `block` shares a byte with a live block (a free of it would
/// free the live one, or be refused as inside it).
fn overlaps_live(blocks: &[(Block, usize)], block: Block) -> bool {
    let end = block.addr().saturating_add(block.size());
    blocks.iter().any(|(b, _)| b.addr() < end && block.addr() < b.addr() + b.size())
}

fn run(u: &mut Unstructured<'_>) -> ArbResult<()> {
    let text = text(u)?;
    let world = SimWorld::new();
    let streams: Vec<SimStream> = (0..3).map(|_| world.stream()).collect();
    let mut builder = memres_sim::builder::<SimStream>();
    builder.register_stream_layer();
    let built: Built<SimStream> = match builder.build_with_handles(&text, &streams[0]) {
        Ok(built) => built,
        Err(e) => {
            assert!(e.pos <= text.len(), "{text:?}: error at byte {} of {}: {e}", e.pos, text.len());
            return Ok(());
        }
    };
    let planned: Vec<Arc<Planned<DynResource<SimStream>>>> = built.all("planned");
    let stats: Option<Arc<Statistics<DynResource<SimStream>>>> =
        if text.starts_with("stats(") { built.get("stats") } else { None };
    let mr = &built.resource;
    let counted = |blocks: &[(Block, usize)], when: &str| {
        if let Some(stats) = &stats {
            let bytes: u64 = blocks.iter().map(|(b, _)| b.size()).sum();
            let counted = stats.get_bytes_counter().value;
            assert_eq!(
                counted, bytes as i64,
                "{text}: stats counts {counted} bytes, the blocks {bytes}, {when}"
            );
        }
    };
    let mut live = LiveBlocks::new();
    let mut blocks: Vec<(Block, usize)> = Vec::new();
    let mut freed: Vec<Block> = Vec::new();
    for _ in 0..u.int_in_range(0..=300)? {
        let stream = u.choose_index(streams.len())?;
        match u.int_in_range(0u8..=19)? {
            0..=8 => {
                let Ok(request) = request(u)? else { continue };
                match mr.allocate(request, &streams[stream]) {
                    Ok(block) => {
                        if let Err(v) = live.insert(block, request) {
                            panic!("{text}: {request:?} got {block:?}: {v:?}");
                        }
                        blocks.push((block, stream));
                    }
                    Err(
                        Error::OutOfMemory { .. }
                        | Error::LimitExceeded { .. }
                        | Error::InvalidSize { .. }
                        | Error::InvalidAlignment { .. }
                        | Error::CapacityExhausted { .. },
                    ) => {}
                    Err(e) => panic!("{text}: {request:?} failed with {e:?}"),
                }
                counted(&blocks, "after an allocation");
            }
            9..=15 if !blocks.is_empty() => {
                let (block, _) = blocks.swap_remove(u.choose_index(blocks.len())?);
                live.remove(&block).expect("a live block");
                if let Err(e) = mr.deallocate(block, &streams[stream]) {
                    panic!("{text}: the free of live {block:?} failed with {e:?}");
                }
                freed.push(block);
                counted(&blocks, "after a free");
            }
            16 if !freed.is_empty() => {
                // Only where no live block lies: that free would be the live one's.
                let block = *u.choose(&freed)?;
                if !block.is_empty() && !overlaps_live(&blocks, block) {
                    assert!(
                        mr.deallocate(block, &streams[stream]).is_err(),
                        "{text}: a double free of {block:?}"
                    );
                }
                counted(&blocks, "after a double free");
            }
            17 => {
                let addr = u.arbitrary::<u64>()? & !255;
                let block = Block::from_addr(addr, 256 * u64::from(u.int_in_range(1u16..=4096)?));
                if !overlaps_live(&blocks, block) {
                    assert!(
                        mr.deallocate(block, &streams[stream]).is_err(),
                        "{text}: a free of foreign {block:?}"
                    );
                }
                counted(&blocks, "after a foreign free");
            }
            18 => {
                for p in &planned {
                    p.step(&streams[stream]).unwrap_or_else(|e| panic!("{text}: step failed with {e:?}"));
                }
            }
            _ => {
                if let Err(e) = built.release_layers().release(&streams[stream]) {
                    panic!("{text}: release failed with {e:?}");
                }
                counted(&blocks, "after a release");
            }
        }
    }
    for (block, stream) in blocks.drain(..) {
        live.remove(&block).expect("a live block");
        if let Err(e) = mr.deallocate(block, &streams[stream]) {
            panic!("{text}: the last free of {block:?} failed with {e:?}");
        }
    }
    counted(&blocks, "once every block is freed");
    // A simulated stream has no stream to free on when dropped: the caller
    // releases first. Then nothing stays held from a `sim` leaf.
    if let Err(e) = built.release_layers().release(&streams[0]) {
        panic!("{text}: the last release failed with {e:?}");
    }
    for device in built.all::<SimDevice>("sim") {
        let held = device.usage().used;
        assert_eq!(
            held, 0,
            "{text}: the device still lends {held} bytes after every block was freed and released"
        );
    }
    Ok(())
}
