use crate::tally::{accessors, Tally};
use memres_core::check::{FailNth, Violation};
use memres_core::index::CoalescingIndex;
use memres_core::{Block, Error, Inspect, MemoryResource, Range, Request, Result, Stream, Usage};
use std::sync::Mutex;

/// An address space of a chosen capacity with no bytes behind it: the
/// upstream that stands in for device memory in tests, fuzzing and replays.
///
/// Like `cuMemAlloc`, every allocation is a separate range aligned to 256
/// bytes (or more when asked); freed ranges are reused. It checks every free
/// (a double free is [`Error::DoubleFree`] by the block's tag, an unknown
/// block or a bare address not live [`Error::UnknownBlock`]), counts the
/// bytes it holds and their peak, and can be told to fail the Nth
/// allocation from now.
///
/// # Examples
///
/// ```
/// use memres_core::{Inspect, MemoryResource, Request};
/// use memres_sim::SimDevice;
/// let dev = SimDevice::new(1 << 30);
/// let b = dev.allocate(Request::new(1000)?, &())?;
/// assert_eq!(dev.usage().held, 1024); // what it lent, rounded to 256
/// dev.fail_nth(1);
/// assert!(dev.allocate(Request::new(1000)?, &()).is_err());
/// dev.deallocate(b, &())?;
/// assert_eq!((dev.usage().held, dev.usage().peak_held), (0, 1024));
/// # Ok::<(), memres_core::Error>(())
/// ```
#[derive(Debug)]
pub struct SimDevice {
    capacity: u64,
    /// Where its blocks lie: from its base, twice the capacity.
    addresses: Range,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    /// Free and used ranges of the address space.
    space: CoalescingIndex,
    /// The first node of the space's one region.
    first: u32,
    /// Bytes handed out and calls.
    tally: Tally,
    /// The injected allocation failure, armed or delivered.
    fail: FailNth,
}

impl SimDevice {
    /// Where the simulated address space starts: far from 0, like a GPU's.
    pub const BASE: u64 = 0x7f00_0000_0000;

    /// The largest capacity its address space holds: 2^46 bytes (64 TiB).
    /// A larger one is served only as far as the space goes (the stack's
    /// `sim` refuses it).
    pub const MAX_CAPACITY: u64 = 1 << 46;

    /// A device that holds at most `capacity` bytes at once, its addresses
    /// from [`BASE`](Self::BASE).
    pub fn new(capacity: u64) -> Self {
        Self::with_base(capacity, Self::BASE).expect("BASE and any capacity fit")
    }

    /// A device whose addresses start at `base` rather than
    /// [`BASE`](Self::BASE): a second device beside a first, whose blocks
    /// the first never hands out too (as two GPUs, or `cuMemAlloc` and
    /// another allocator, never give out one address twice). Its
    /// [`addresses`](Self::addresses) must not meet the other's.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] if `base` is zero or not a multiple of 256,
    /// or its addresses would run past `u64::MAX`.
    ///
    /// ```
    /// use memres_core::{Error, MemoryResource, Request};
    /// use memres_sim::SimDevice;
    /// let (a, b) = (SimDevice::new(1 << 30), SimDevice::with_base(1 << 30, 1 << 60)?);
    /// assert!(a.addresses().end() <= b.addresses().start());
    /// let block = b.allocate(Request::new(1000)?, &())?;
    /// assert!(b.addresses().contains(block.addr()) && !a.addresses().contains(block.addr()));
    /// // Bases it refuses: not a multiple of 256, zero, too near the top.
    /// for base in [100, 0, u64::MAX - 4095] {
    ///     assert!(matches!(SimDevice::with_base(1 << 30, base), Err(Error::InvalidConfig { .. })));
    /// }
    /// let top = SimDevice::with_base(1 << 19, 0u64.wrapping_sub((1 << 20) + 256))?; // 1 MiB of addresses
    /// assert_eq!(top.addresses().end(), u64::MAX - 255);
    /// let aligned = top.allocate(Request::aligned(4096, 2 << 20)?, &());
    /// assert!(matches!(aligned, Err(Error::OutOfMemory { .. })), "no 2 MiB boundary there");
    /// # b.deallocate(block, &())?;
    /// # Ok::<(), Error>(())
    /// ```
    pub fn with_base(capacity: u64, base: u64) -> Result<Self> {
        // Twice the capacity in address space, so that fragmentation of the
        // simulated space never limits what the capacity allows.
        let span = capacity.saturating_mul(2).clamp(1 << 20, Self::MAX_CAPACITY) & !255;
        let bad = |what| Err(Error::InvalidConfig { what });
        if base == 0 || base % 256 != 0 {
            return bad("a simulated device's base is a non-zero multiple of 256");
        }
        let Some(addresses) = Range::new(base, span) else {
            return bad("a simulated device's addresses run past u64::MAX");
        };
        let mut space = CoalescingIndex::new(256);
        let first = space.add_range(addresses)?;
        Ok(SimDevice {
            capacity,
            addresses,
            state: Mutex::new(State { space, first, tally: Tally::default(), fail: FailNth::new() }),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The capacity in bytes.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// The addresses it hands its blocks out from (twice the capacity, at
    /// least 1 MiB, from its base).
    pub fn addresses(&self) -> Range {
        self.addresses
    }

    accessors!();

    /// Makes the `n`th allocation from now fail (`n = 1`: the next one) with
    /// an injected backend error; `n = 0` cancels.
    pub fn fail_nth(&self, n: u64) {
        self.lock().fail.arm(n);
    }
}

/// A leaf: it holds what it lent. The checker checks its address space and
/// that the bytes it counts are those its space has in use.
impl Inspect for SimDevice {
    fn usage(&self) -> Usage {
        self.lock().tally.usage()
    }

    fn check(&self) -> std::result::Result<(), Violation> {
        let s = self.lock();
        s.space.check()?;
        s.tally.check_held(s.space.used_bytes(), "bytes held out differ from the space's bytes in use")
    }
}

impl<S: Stream + ?Sized> MemoryResource<S> for SimDevice {
    fn allocate(&self, request: Request, _stream: &S) -> Result<Block> {
        if request.is_zero() {
            return Ok(Block::EMPTY);
        }
        let mut s = self.lock();
        if s.fail.fires() {
            return Err(Error::Backend { code: 2, what: "injected failure of the simulated device" });
        }
        let size = request.rounded_size(256);
        // The largest free range, as far as the capacity lets it be taken:
        // ranges may be fewer than the capacity allows (fragmented, or a
        // capacity beyond the space). Blocks are whole 256-byte units, so
        // is what the capacity leaves.
        let out_of_memory = |s: &State| Error::OutOfMemory {
            requested: request.size(),
            largest_free: s.space.largest_free().min((self.capacity - s.tally.held) & !255),
            pool_size: self.capacity,
            max_size: Some(self.capacity),
        };
        if size > self.capacity - s.tally.held {
            return Err(out_of_memory(&s));
        }
        match s.space.allocate(request.size(), request.align())? {
            Some(a) => {
                s.tally.allocated(size);
                Ok(Block::new(a.addr, request.size(), a.tag))
            }
            None => Err(out_of_memory(&s)),
        }
    }

    fn deallocate(&self, block: Block, _stream: &S) -> Result<()> {
        if block.is_empty() {
            return Ok(());
        }
        let mut s = self.lock();
        let (addr, size) = (block.addr(), block.size());
        if block.tag() == Block::NO_TAG {
            // Address-only free: find the node by address.
            let tag = s.space.find_used(s.first, addr).ok_or(Error::UnknownBlock { addr })?;
            s.space.free(tag, addr, size)?;
        } else if let Err(e) = s.space.free(block.tag(), addr, size) {
            // A tag that names no live range: its block was freed (and the
            // range merged into a free neighbour or handed out again), or
            // it is another's. The address tells which; nothing is freed.
            let Error::UnknownBlock { .. } = e else { return Err(e) };
            let first = s.first;
            s.space.free_by_address(first, addr, size, true)?;
        }
        s.tally.freed(size.next_multiple_of(256));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::SimDevice;
    use memres_core::{Block, Error, Inspect, MemoryResource, Request};

    fn out_of_memory(requested: u64, largest_free: u64, capacity: u64) -> Error {
        Error::OutOfMemory { requested, largest_free, pool_size: capacity, max_size: Some(capacity) }
    }

    #[test]
    fn out_of_memory_names_no_free_block_smaller_than_it_hands_out() {
        // What the capacity leaves was named as it was, below 256 bytes too:
        // a device of 1000 bytes refused 1000 with 1000 said free, though
        // it hands out 256-byte multiples only.
        let dev = SimDevice::new(1000);
        assert_eq!(dev.allocate(Request::new(1000).unwrap(), &()), Err(out_of_memory(1000, 768, 1000)));
        let b = dev.allocate(Request::new(768).unwrap(), &()).unwrap();
        assert_eq!(dev.allocate(Request::new(1).unwrap(), &()), Err(out_of_memory(1, 0, 1000)));
        dev.deallocate(b, &()).unwrap();
    }

    #[test]
    fn out_of_memory_names_a_free_block_the_device_has() {
        // It named the capacity not held, whether or not a free range that
        // long was there.
        let (all, quarter) = (SimDevice::MAX_CAPACITY, SimDevice::MAX_CAPACITY / 4);
        // Fragmented: a capacity of its whole space, every other quarter free.
        let dev = SimDevice::new(all);
        let mut quarters: Vec<Block> =
            (0..4).map(|_| dev.allocate(Request::new(quarter).unwrap(), &()).unwrap()).collect();
        quarters.sort_by_key(|b| b.addr());
        for b in [quarters[0], quarters[2]] {
            dev.deallocate(b, &()).unwrap();
        }
        let e = dev.allocate(Request::new(2 * quarter).unwrap(), &());
        assert_eq!(e, Err(out_of_memory(2 * quarter, quarter, all)));
        dev.deallocate(dev.allocate(Request::new(quarter).unwrap(), &()).unwrap(), &()).unwrap();
        // A capacity beyond its space: 2^50 bytes over 2^46 of addresses.
        let dev = SimDevice::new(1 << 50);
        assert_eq!(
            dev.allocate(Request::new(1 << 47).unwrap(), &()),
            Err(out_of_memory(1 << 47, all, 1 << 50))
        );
        dev.deallocate(dev.allocate(Request::new(all).unwrap(), &()).unwrap(), &()).unwrap();
    }

    #[test]
    fn a_double_free_is_told_as_one_whatever_became_of_the_range() {
        // A freed block whose range merged into a free neighbour, or was
        // handed out again, has a tag that names no live range: its second
        // free was an unknown block.
        let dev = SimDevice::new(1 << 20);
        let one = || Request::new(256).unwrap();
        let [x, a, y] = [(); 3].map(|_| dev.allocate(one(), &()).unwrap());
        dev.deallocate(x, &()).unwrap();
        dev.deallocate(a, &()).unwrap(); // merged into `x`'s free range
        assert_eq!(dev.deallocate(a, &()), Err(Error::DoubleFree { addr: a.addr() }));
        // A bare address has no tag to tell it by: unknown, as documented.
        let by_address = Block::from_addr(a.addr(), 256);
        assert_eq!(dev.deallocate(by_address, &()), Err(Error::UnknownBlock { addr: a.addr() }));
        let z = dev.allocate(one(), &()).unwrap();
        assert_eq!(z.addr(), x.addr(), "handed out again");
        assert_eq!(dev.deallocate(x, &()), Err(Error::DoubleFree { addr: x.addr() }));
        // Still unknown: an address inside a live block, and one outside the space.
        let inside = Block::from_addr(y.addr() + 128, 128);
        assert_eq!(dev.deallocate(inside, &()), Err(Error::UnknownBlock { addr: inside.addr() }));
        let outside = Block::new(dev.addresses().end(), 256, a.tag());
        assert_eq!(dev.deallocate(outside, &()), Err(Error::UnknownBlock { addr: outside.addr() }));
        // Nothing changed: the live blocks go back, and the counts are exact.
        assert_eq!((dev.usage().held, dev.call_counts()), (512, (4, 2)));
        dev.deallocate(z, &()).unwrap();
        dev.deallocate(y, &()).unwrap();
        assert_eq!((dev.usage().held, dev.check()), (0, Ok(())));
    }
}
