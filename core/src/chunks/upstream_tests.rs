//! An upstream outside its contract (a safe trait of the user's) that hands
//! a resource a block overlapping a chunk it holds, running past the last
//! address, shorter or not aligned as asked: the resource (one keeping a
//! chunk table, or the binning resource's large path and counted bins) answers the caller's
//! valid request with the upstream's fault (`UpstreamMisbehaved`), gives
//! the block back, counts nothing and serves on. Before, the pool, the
//! fixed-size resource and the arena answered `InvalidConfig` or
//! `InvalidSize`, as if the request were wrong.

use crate::arena::ArenaResource;
use crate::binning::BinningResource;
use crate::fixed::{FixedConfig, FixedSizeResource};
use crate::pool::{CoalescingPool, PoolConfig};
use crate::primitive::{AtomicU64, Ordering::Relaxed};
use crate::{Block, Error, Inspect, MemoryResource, MemoryResourceMut, Request, Result, Stream};

/// Hands out fresh blocks aligned to 1 GiB, but for the one block it was
/// told to hand out next; counts the blocks and bytes it has out.
#[derive(Debug)]
struct Misbehaving {
    next: AtomicU64,
    /// The next block to hand out whatever is asked (size 0: none).
    told: [AtomicU64; 2],
    blocks: AtomicU64,
    bytes: AtomicU64,
}

impl Misbehaving {
    fn new() -> Self {
        let zero = || AtomicU64::new(0);
        Misbehaving { next: AtomicU64::new(1 << 40), told: [zero(), zero()], blocks: zero(), bytes: zero() }
    }

    /// Hands out `size` bytes at `addr` for the next request.
    fn tell(&self, addr: u64, size: u64) {
        self.told[0].store(addr, Relaxed);
        self.told[1].store(size, Relaxed);
    }

    /// Blocks and bytes out.
    fn out(&self) -> (u64, u64) {
        (self.blocks.load(Relaxed), self.bytes.load(Relaxed))
    }
}

impl<S: Stream + ?Sized> MemoryResource<S> for Misbehaving {
    fn allocate(&self, request: Request, _: &S) -> Result<Block> {
        let block = match self.told[1].swap(0, Relaxed) {
            0 => Block::new(self.next.fetch_add(request.rounded_size(1 << 30), Relaxed), request.size(), 0),
            size => Block::new(self.told[0].load(Relaxed), size, 0),
        };
        self.blocks.fetch_add(1, Relaxed);
        self.bytes.fetch_add(block.size(), Relaxed);
        Ok(block)
    }
    fn deallocate(&self, block: Block, _: &S) -> Result<()> {
        self.blocks.fetch_sub(1, Relaxed);
        self.bytes.fetch_sub(block.size(), Relaxed);
        Ok(())
    }
}

/// A leaf: it holds the bytes it has out.
impl Inspect for Misbehaving {
    fn usage(&self) -> crate::Usage {
        crate::Usage::leaf(self.bytes.load(Relaxed), 0)
    }
    fn check(&self) -> core::result::Result<(), crate::check::Violation> {
        Ok(())
    }
}

fn req(size: u64) -> Request {
    Request::new(size).unwrap()
}

/// The top 256-aligned address: a block there of more than 256 bytes runs
/// past the last address.
const TOP: u64 = u64::MAX - 255;

/// `err` is the upstream's fault, naming the block it handed out.
#[track_caller]
fn blames_upstream(err: Error, addr: u64, size: u64, what: &str) {
    assert!(
        matches!(err, Error::UpstreamMisbehaved { addr: a, size: s, what: w } if (a, s, w) == (addr, size, what)),
        "{err}"
    );
}

#[test]
fn a_pool_blames_its_upstream_for_a_chunk_overlapping_one_it_holds_or_past_the_last_address() {
    let up = Misbehaving::new();
    let config = PoolConfig::new().release_on_grow(false);
    let mut pool = CoalescingPool::with_config(&up, config, &()).unwrap();
    let a = pool.allocate(req(1000), &()).unwrap();
    let (held, out) = (pool.usage().held, up.out());
    assert_eq!(out, (1, held));
    // Any request past the chunk's free bytes needs a new chunk.
    let big = req(held * 2);
    let cases = [
        (a.addr(), 1 << 40, "overlapping memory a chunk already holds"),
        (a.addr() - 256, 1 << 40, "overlapping memory a chunk already holds"),
        (TOP, 1 << 40, "running past the last address"),
        ((1 << 50) + 128, 1 << 40, "not aligned as asked"),
        (1 << 50, 256, "shorter than asked"),
    ];
    for (addr, size, what) in cases {
        up.tell(addr, size);
        blames_upstream(pool.allocate(big, &()).unwrap_err(), addr, size, what);
        // Given back, nothing counted.
        assert_eq!((up.out(), pool.usage().held, pool.usage().used), (out, held, 1024), "{what}");
        pool.check().unwrap();
    }
    // The pool serves on: the same request, from a block as asked.
    let b = pool.allocate(big, &()).unwrap();
    assert_eq!(up.out().0, 2);
    for x in [a, b] {
        pool.deallocate(x, &()).unwrap();
    }
    pool.release(&()).unwrap();
    assert_eq!(up.out(), (0, 0));
}

#[test]
fn a_fixed_size_resource_blames_its_upstream_for_a_chunk_overlapping_one_it_holds_or_past_the_last_address() {
    let up = Misbehaving::new();
    let config = FixedConfig::new(4096).blocks_per_chunk(1).chunk_alignment(4096);
    let mut fixed = FixedSizeResource::with_config(&up, config, &()).unwrap();
    let a = fixed.allocate(req(4096), &()).unwrap();
    let out = up.out();
    assert_eq!((out, fixed.chunk_count()), ((1, 4096), 1));
    let cases = [
        (a.addr(), 4096, "overlapping memory a chunk already holds"),
        (u64::MAX - 4095 - 4096, 8192, "not sized as asked"),
        (u64::MAX - 4095, 4096, "running past the last address"),
        ((1 << 50) + 256, 4096, "not aligned as asked"),
    ];
    for (addr, size, what) in cases {
        up.tell(addr, size);
        blames_upstream(fixed.allocate(req(4096), &()).unwrap_err(), addr, size, what);
        assert_eq!((up.out(), fixed.chunk_count(), fixed.usage().used), (out, 1, 4096), "{what}");
        fixed.check().unwrap();
    }
    let b = fixed.allocate(req(4096), &()).unwrap();
    assert_eq!((up.out(), fixed.chunk_count()), ((2, 8192), 2));
    for x in [a, b] {
        fixed.deallocate(x, &()).unwrap();
    }
    fixed.release(&()).unwrap();
    assert_eq!(up.out(), (0, 0));
}

#[test]
fn an_arena_blames_its_upstream_for_a_chunk_overlapping_one_it_holds_or_past_the_last_address() {
    let up = Misbehaving::new();
    let arena = ArenaResource::new(&up);
    let large = req(64 << 20);
    let a = arena.allocate(large, &()).unwrap();
    let (held, out) = (arena.usage().held, up.out());
    assert_eq!(out.0, 1);
    let big = req(held * 2);
    let cases = [
        (a.addr(), 1 << 40, "overlapping memory a chunk already holds"),
        (TOP, 1 << 40, "running past the last address"),
        ((1 << 50) + 128, 1 << 40, "not aligned as asked"),
    ];
    for (addr, size, what) in cases {
        up.tell(addr, size);
        blames_upstream(arena.allocate(big, &()).unwrap_err(), addr, size, what);
        assert_eq!((up.out(), arena.usage().held, arena.usage().used), (out, held, 64 << 20), "{what}");
        arena.check().unwrap();
    }
    let b = arena.allocate(big, &()).unwrap();
    for x in [a, b] {
        arena.deallocate(x, &()).unwrap();
    }
    arena.release(&()).unwrap();
    assert_eq!(up.out(), (0, 0));
}

#[test]
fn binning_blames_its_upstream_for_a_large_block_past_the_last_address() {
    // No bins: every size takes the large path, straight to the upstream.
    let up = Misbehaving::new();
    let binning = BinningResource::<_, ()>::new(&up);
    let a = binning.allocate(req(4096), &()).unwrap();
    let (out, used) = (up.out(), binning.usage().used);
    for (addr, size, what) in
        [(TOP, 4096, "running past the last address"), (1 << 50, 256, "shorter than asked")]
    {
        up.tell(addr, size);
        blames_upstream(binning.allocate(req(4096), &()).unwrap_err(), addr, size, what);
        assert_eq!((up.out(), binning.usage().used), (out, used), "{what}");
    }
    let b = binning.allocate(req(4096), &()).unwrap();
    for x in [a, b] {
        binning.deallocate(x, &()).unwrap();
    }
    assert_eq!((up.out(), binning.usage().used), ((0, 0), 0));
}

#[test]
fn binning_blames_its_upstream_and_a_counted_bin_for_a_block_not_aligned_as_asked() {
    // No bins of its own: 4 KiB goes upstream; 1 KiB to a counted bin of
    // the same kind of resource.
    let (up, bin) = (Misbehaving::new(), Misbehaving::new());
    let mut binning = BinningResource::<_, ()>::new(&up);
    binning.add_counted_bin(1024, &bin).unwrap();
    let mut live =
        [binning.allocate(req(4096), &()).unwrap(), binning.allocate(req(1024), &()).unwrap()].to_vec();
    for (from, size) in [(&up, 4096), (&bin, 1024)] {
        let (up_out, bin_out, used) = (up.out(), bin.out(), binning.usage().used);
        let aligned = |align| Request::aligned(size, align).unwrap();
        for (addr, request) in [((1 << 50) + 128, req(size)), ((1 << 50) + 4096, aligned(1 << 16))] {
            from.tell(addr, size);
            blames_upstream(binning.allocate(request, &()).unwrap_err(), addr, size, "not aligned as asked");
            // Given back, nothing counted.
            assert_eq!(
                (up.out(), bin.out(), binning.usage().used),
                (up_out, bin_out, used),
                "{size} at {addr:#x}"
            );
            binning.check().unwrap();
        }
        // It serves on, aligned as asked.
        let b = binning.allocate(aligned(1 << 16), &()).unwrap();
        assert_eq!(b.addr() % (1 << 16), 0);
        live.push(b);
    }
    for x in live {
        binning.deallocate(x, &()).unwrap();
    }
    assert_eq!((up.out(), bin.out(), binning.usage().used), ((0, 0), (0, 0), 0));
}

/// A counted bin (or a bin of `add_bin`) that answers with a block longer
/// than the bin: the block's free, routed by its size, would go to another
/// bin or upstream, and never reach the bin. Before, the block was handed
/// out and its free was `UnknownBlock`: held by the bin for good.
#[test]
fn binning_blames_a_bin_for_a_block_longer_than_the_bin() {
    let (up, counted, other) = (Misbehaving::new(), Misbehaving::new(), Misbehaving::new());
    let mut binning = BinningResource::<_, ()>::new(&up);
    binning.add_counted_bin(1024, &counted).unwrap();
    binning.add_bin(4096, &other).unwrap();
    for (bin, size, addr) in [(&counted, 1000, 1 << 50), (&other, 3000, 1 << 51)] {
        bin.tell(addr, 8192);
        blames_upstream(binning.allocate(req(size), &()).unwrap_err(), addr, 8192, "longer than its bin");
        // Given back, nothing counted.
        assert_eq!((up.out(), counted.out(), other.out(), binning.usage().used), ((0, 0), (0, 0), (0, 0), 0));
        binning.check().unwrap();
        // It serves on.
        let b = binning.allocate(req(size), &()).unwrap();
        binning.deallocate(b, &()).unwrap();
    }
    assert_eq!((up.out(), counted.out(), other.out()), ((0, 0), (0, 0), (0, 0)));
}

/// A bin of `add_bin` (a resource of the user's) that answers with a block
/// shorter than asked, or not aligned as asked: the caller never gets it.
/// Before, it was handed out (a shorter one's free, routed by its size,
/// could go to a bin below, which never handed it out).
#[test]
fn binning_blames_an_added_bin_for_a_block_shorter_or_not_aligned_as_asked() {
    let (up, below, other) = (Misbehaving::new(), Misbehaving::new(), Misbehaving::new());
    let mut binning = BinningResource::<_, ()>::new(&up);
    binning.add_bin(256, &below).unwrap();
    binning.add_bin(1024, &other).unwrap();
    for (addr, size, request, what) in [
        (1 << 50, 200, req(1000), "shorter than asked"),
        ((1 << 50) + 256, 1000, Request::aligned(1000, 512).unwrap(), "not aligned as asked"),
    ] {
        other.tell(addr, size);
        blames_upstream(binning.allocate(request, &()).unwrap_err(), addr, size, what);
        // Given back, nothing held.
        assert_eq!((up.out(), below.out(), other.out()), ((0, 0), (0, 0), (0, 0)), "{what}");
        binning.check().unwrap();
        let b = binning.allocate(request, &()).unwrap();
        binning.deallocate(b, &()).unwrap();
    }
    assert_eq!((up.out(), below.out(), other.out()), ((0, 0), (0, 0), (0, 0)));
}

/// Answers every request with a block of 8 KiB at 1 MiB, and refuses every
/// free.
struct LongAndKept;

impl<S: Stream + ?Sized> MemoryResource<S> for LongAndKept {
    fn allocate(&self, _: Request, _: &S) -> Result<Block> {
        Ok(Block::new(1 << 20, 8192, 0))
    }
    fn deallocate(&self, _: Block, _: &S) -> Result<()> {
        Err(Error::Backend { code: -1, what: "refused" })
    }
}

/// A counted bin's block longer than the bin, which the bin will not take
/// back: the binning resource never counted it. Before, its tally kept it,
/// counted held and used for good, though nobody held it.
#[test]
fn a_counted_bins_block_longer_than_the_bin_is_never_counted() {
    let up = Misbehaving::new();
    let mut binning = BinningResource::<_, ()>::new(&up);
    binning.add_counted_bin(1024, LongAndKept).unwrap();
    blames_upstream(binning.allocate(req(1000), &()).unwrap_err(), 1 << 20, 8192, "longer than its bin");
    assert_eq!((binning.usage().used, binning.usage().held), (0, 0));
    binning.check().unwrap();
}
