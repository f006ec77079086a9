//! The resources the replay tool and benches compare, and the registry that
//! names them.
//!
//! Adding a resource: implement [`Build`] (construct a [`Replayer`] over
//! an upstream) and add one line to [`RESOURCES`].

use crate::replay::{replay, Measurement, ReplayError, Replayer, GRANULE};
use crate::workload::Workload;
use memres_core::pool::CoalescingPool;
use memres_core::{Block, Error, MemoryResource, MemoryResourceMut, Request};
use memres_host::{HostMemory, SimDevice};
use std::fmt;
use std::str::FromStr;

#[cfg(test)]
mod tests;

/// An upstream a memres resource can take memory from, with the figure
/// the replay reports.
pub trait Upstream: MemoryResource + fmt::Debug {
    /// The most bytes it handed out at once.
    fn peak_held_bytes(&self) -> u64;
}

impl Upstream for SimDevice {
    fn peak_held_bytes(&self) -> u64 {
        SimDevice::peak_held_bytes(self)
    }
}

impl Upstream for HostMemory {
    fn peak_held_bytes(&self) -> u64 {
        HostMemory::peak_held_bytes(self)
    }
}

/// Which upstream the memres resources take memory from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum UpstreamKind {
    /// A [`SimDevice`] of [`UpstreamKind::SIM_CAPACITY`] bytes: no bytes behind it.
    #[default]
    Sim,
    /// [`HostMemory`]: real host bytes.
    Host,
}

impl UpstreamKind {
    /// The capacity of the simulated device: 1 TiB.
    pub const SIM_CAPACITY: u64 = 1 << 40;
}

impl FromStr for UpstreamKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "sim" => Ok(UpstreamKind::Sim),
            "host" => Ok(UpstreamKind::Host),
            _ => Err(format!("unknown upstream `{s}` (expected sim or host)")),
        }
    }
}

impl fmt::Display for UpstreamKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            UpstreamKind::Sim => "sim",
            UpstreamKind::Host => "host",
        })
    }
}

/// How the tool runs each replay.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RunOptions {
    /// Where memres resources take memory from.
    pub upstream: UpstreamKind,
    /// Timed passes after the warm-up (the median is reported).
    pub passes: u32,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions { upstream: UpstreamKind::Sim, passes: 1 }
    }
}

/// Builds a resource for one workload over an upstream.
pub trait Build {
    /// The resource over an upstream of type `U`.
    type Resource<U: Upstream>: Replayer;

    /// The resource over `upstream`, sized for `workload` where it needs a
    /// capacity up front. Resources that manage a range of their own drop
    /// the upstream.
    fn build<U: Upstream>(upstream: U, workload: &Workload) -> Self::Resource<U>;
}

/// Replays `workload` on a fresh resource: monomorphized per resource and
/// upstream.
fn run<B: Build>(
    workload: &Workload,
    options: &RunOptions,
    progress: &mut dyn FnMut(usize),
) -> Result<Measurement, ReplayError> {
    let passes = options.passes;
    match options.upstream {
        UpstreamKind::Sim => {
            let upstream = SimDevice::new(UpstreamKind::SIM_CAPACITY);
            replay(&mut B::build(upstream, workload), workload, passes, progress)
        }
        UpstreamKind::Host => replay(&mut B::build(HostMemory::new(), workload), workload, passes, progress),
    }
}

/// Replays a workload on a fresh resource as the options say, telling a
/// progress callback how many ops each chunk did.
pub type RunFn = fn(&Workload, &RunOptions, &mut dyn FnMut(usize)) -> Result<Measurement, ReplayError>;

/// One entry of the registry.
#[derive(Clone, Copy)]
pub struct Resource {
    /// The name on the command line.
    pub name: &'static str,
    /// One line on what it is.
    pub about: &'static str,
    /// Replays a workload on a fresh instance.
    pub run: RunFn,
}

impl fmt::Debug for Resource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Resource").field("name", &self.name).finish_non_exhaustive()
    }
}

/// A registry entry for a resource built by `B` and replayed by the generic
/// engine over the chosen upstream.
pub const fn entry<B: Build>(name: &'static str, about: &'static str) -> Resource {
    Resource { name, about, run: run::<B> }
}

/// Every resource the tool knows, by name.
pub const RESOURCES: &[Resource] = &[
    entry::<Pool>("pool", "memres CoalescingPool, grown from zero over the upstream"),
    entry::<OffsetAllocator>("offset-allocator", "crate offset-allocator 0.2 (peer, 256-byte units)"),
    entry::<RangeAlloc>("range-alloc", "crate range-alloc 0.1 (peer, 256-byte units)"),
];

/// Looks a resource up by name.
///
/// # Errors
///
/// A message that lists the known names.
pub fn find(name: &str) -> Result<&'static Resource, String> {
    RESOURCES.iter().find(|r| r.name == name).ok_or_else(|| {
        let known: Vec<_> = RESOURCES.iter().map(|r| r.name).collect();
        format!("unknown resource `{name}` (known: {})", known.join(", "))
    })
}

/// The memres pool, used through [`MemoryResourceMut`] directly.
#[derive(Debug)]
pub struct Pool;

impl Build for Pool {
    type Resource<U: Upstream> = PoolReplayer<U>;
    fn build<U: Upstream>(upstream: U, _: &Workload) -> PoolReplayer<U> {
        PoolReplayer(CoalescingPool::new(upstream))
    }
}

/// [`CoalescingPool`] as a [`Replayer`].
#[derive(Debug)]
pub struct PoolReplayer<U>(pub CoalescingPool<U>);

impl<U: Upstream> Replayer for PoolReplayer<U> {
    type Handle = Block;

    fn vacant(&self) -> Block {
        Block::EMPTY
    }

    #[inline]
    fn allocate(&mut self, size: u64, _stream: u16) -> Result<Block, Error> {
        self.0.allocate(Request::new(size)?, &())
    }

    #[inline]
    fn deallocate(&mut self, block: Block, _size: u64, _stream: u16) -> Result<(), Error> {
        self.0.deallocate(block, &())
    }

    fn peak_upstream(&self) -> u64 {
        self.0.upstream().peak_held_bytes()
    }
}

/// Sizes in 256-byte units, checked to fit `u32`.
#[inline]
fn units(size: u64) -> Result<u32, Error> {
    u32::try_from(size.div_ceil(GRANULE)).map_err(|_| Error::InvalidSize { size })
}

fn peer_out_of_memory(size: u64, capacity_units: u64) -> Error {
    Error::OutOfMemory {
        requested: size,
        largest_free: 0,
        pool_size: capacity_units * GRANULE,
        max_size: Some(capacity_units * GRANULE),
    }
}

/// The `offset-allocator` crate: OffsetAllocator's TLSF-like index over
/// one range of `u32::MAX` units of 256 bytes (1 TiB).
#[derive(Debug)]
pub struct OffsetAllocator;

impl Build for OffsetAllocator {
    type Resource<U: Upstream> = OffsetReplayer;
    fn build<U: Upstream>(_: U, workload: &Workload) -> OffsetReplayer {
        // Each live allocation and each free gap between them is a node.
        let nodes = (workload.peak_live_count as u64 * 2 + 1024).min(u32::MAX as u64 - 2) as u32;
        OffsetReplayer { inner: offset_allocator::Allocator::with_max_allocs(u32::MAX, nodes), peak_end: 0 }
    }
}

/// [`offset_allocator::Allocator`] as a [`Replayer`].
pub struct OffsetReplayer {
    inner: offset_allocator::Allocator,
    /// The highest end offset handed out, in units.
    peak_end: u64,
}

impl fmt::Debug for OffsetReplayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OffsetReplayer").field("peak_end", &self.peak_end).finish_non_exhaustive()
    }
}

impl Replayer for OffsetReplayer {
    type Handle = Option<offset_allocator::Allocation>;

    fn vacant(&self) -> Self::Handle {
        None
    }

    #[inline]
    fn allocate(&mut self, size: u64, _stream: u16) -> Result<Self::Handle, Error> {
        let n = units(size)?;
        if n == 0 {
            return Ok(None);
        }
        let a = self.inner.allocate(n).ok_or_else(|| peer_out_of_memory(size, u32::MAX as u64))?;
        self.peak_end = self.peak_end.max(a.offset as u64 + n as u64);
        Ok(Some(a))
    }

    #[inline]
    fn deallocate(&mut self, handle: Self::Handle, _size: u64, _stream: u16) -> Result<(), Error> {
        if let Some(a) = handle {
            self.inner.free(a);
        }
        Ok(())
    }

    fn peak_upstream(&self) -> u64 {
        self.peak_end * GRANULE
    }
}

/// The `range-alloc` crate: a sorted list of free ranges, best fit, over
/// one range of 2^32 units of 256 bytes (1 TiB).
#[derive(Debug)]
pub struct RangeAlloc;

impl Build for RangeAlloc {
    type Resource<U: Upstream> = RangeReplayer;
    fn build<U: Upstream>(_: U, _: &Workload) -> RangeReplayer {
        RangeReplayer { inner: range_alloc::RangeAllocator::new(0..Self::CAPACITY), peak_end: 0 }
    }
}

impl RangeAlloc {
    /// The range's length in units.
    pub const CAPACITY: u64 = 1 << 32;
}

/// [`range_alloc::RangeAllocator`] as a [`Replayer`].
#[derive(Debug)]
pub struct RangeReplayer {
    inner: range_alloc::RangeAllocator<u64>,
    /// The highest end offset handed out, in units.
    peak_end: u64,
}

impl Replayer for RangeReplayer {
    /// `(start, end)` in units; `(0, 0)` for nothing.
    type Handle = (u64, u64);

    fn vacant(&self) -> Self::Handle {
        (0, 0)
    }

    #[inline]
    fn allocate(&mut self, size: u64, _stream: u16) -> Result<Self::Handle, Error> {
        let n = size.div_ceil(GRANULE);
        if n == 0 {
            return Ok((0, 0));
        }
        let r = self.inner.allocate_range(n).map_err(|_| peer_out_of_memory(size, RangeAlloc::CAPACITY))?;
        self.peak_end = self.peak_end.max(r.end);
        Ok((r.start, r.end))
    }

    #[inline]
    fn deallocate(&mut self, (start, end): Self::Handle, _size: u64, _stream: u16) -> Result<(), Error> {
        if start < end {
            self.inner.free_range(start..end);
        }
        Ok(())
    }

    fn peak_upstream(&self) -> u64 {
        self.peak_end * GRANULE
    }
}
