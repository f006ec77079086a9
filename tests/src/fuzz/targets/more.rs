//! Targets of the algorithms beside the pool: fixed-size blocks, binning,
//! the stream-ordered layer, and a stack of adaptors.

use super::super::{drive, FuzzResource, Model, Op};
use super::{judge_pool_failure, pool_summary, released, Layers, Pool, SharedPool, Spy};
use arbitrary::Unstructured;
use memres_core::adaptor::{Limiting, Statistics};
use memres_core::binning::BinningResource;
use memres_core::fixed::{FixedConfig, FixedSizeResource};
use memres_core::pool::{CoalescingPool, Growth, PoolConfig};
use memres_core::stream_ordered::StreamOrdered;
use memres_core::{Block, Error, MemoryResource, MemoryResourceMut, Request, Result, Shared, Stream};
use memres_host::{HbChecked, SimStream, SimWorld};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// Whether an allocation failure is one the spied upstream explains: out of
/// memory only if it refused something, a backend error only if it failed.
fn upstream_explains(spy: &Spy, err: &Error) -> std::result::Result<(), String> {
    let log = spy.log();
    match err {
        Error::OutOfMemory { .. } if !log.refused.is_empty() => Ok(()),
        Error::Backend { .. } if log.failed_other => Ok(()),
        _ => Err(format!("the upstream did not refuse: {log:?}")),
    }
}

// ---------------------------------------------------------------- fixed

/// `FixedSizeResource` over the spied `SimDevice`.
#[derive(Debug)]
struct FixedTarget {
    fixed: FixedSizeResource<Spy>,
    spy: Spy,
}

impl FuzzResource for FixedTarget {
    fn allocate(&mut self, request: Request) -> Result<Block> {
        self.fixed.allocate(request, &())
    }
    fn deallocate(&mut self, block: Block) -> Result<()> {
        self.fixed.deallocate(block, &())
    }
    fn release(&mut self) -> Option<Result<u64>> {
        let got = self.fixed.release(&());
        if got.is_ok() && self.fixed.used_blocks() == 0 && self.fixed.pool_size() != 0 {
            panic!("fuzz oracle: release() kept {} bytes with nothing in use", self.fixed.pool_size());
        }
        Some(got)
    }
    fn fail_nth(&mut self, n: u64) -> bool {
        self.spy.inner.fail_nth(n);
        true
    }
    fn check(&self, model: &Model) -> std::result::Result<(), String> {
        if super::super::invariant_checker_on() {
            self.fixed.check().map_err(|v| v.to_string())?;
        }
        if self.spy.inner.held_bytes() != self.fixed.pool_size() {
            return Err(format!(
                "upstream holds {} bytes, the resource says {}",
                self.spy.inner.held_bytes(),
                self.fixed.pool_size()
            ));
        }
        if self.fixed.used_blocks() != model.live().len() as u64 {
            return Err(format!("{} used blocks, {} live", self.fixed.used_blocks(), model.live().len()));
        }
        let align = self.fixed.alignment();
        if let Some(l) = model.live().iter().find(|l| l.block.addr() % align != 0) {
            return Err(format!("{:?} not aligned to {align}", l.block));
        }
        Ok(())
    }
    fn used_bytes(&self) -> u64 {
        self.fixed.used_bytes()
    }
    fn footprint(&self, size: u64) -> u64 {
        // Any size the resource takes occupies one block; a larger one is
        // another class (a free with it is a size mismatch).
        if size <= self.fixed.block_size() {
            self.fixed.block_size()
        } else {
            size
        }
    }
    fn summary(&self) -> Vec<u64> {
        vec![self.fixed.used_bytes(), self.fixed.free_bytes(), self.fixed.pool_size(), self.fixed.chunk_count() as u64]
    }
    fn give_backs(&self) -> u64 {
        self.spy.frees()
    }
    fn begin_allocate(&mut self) {
        self.spy.take_log();
    }
    fn judge_alloc_failure(
        &self,
        request: &Request,
        err: &Error,
        before: &[u64],
        _: &Model,
    ) -> std::result::Result<(), String> {
        let want_size = request.size() > self.fixed.block_size();
        let want_align = !want_size && request.align() > self.fixed.alignment();
        match err {
            Error::InvalidSize { size } if want_size && *size == request.size() => Ok(()),
            Error::InvalidAlignment { align } if want_align && *align == request.align() => Ok(()),
            _ if want_size || want_align => Err("expected InvalidSize or InvalidAlignment".into()),
            _ if self.fixed.pool_size() != before[2] => Err("a failed allocation changed the bytes held".into()),
            _ if before[1] != 0 => Err(format!("{} bytes free in blocks and still failed", before[1])),
            _ => upstream_explains(&self.spy, err),
        }
    }
}

/// Fuzz target `fixed`: [`FixedSizeResource`] over a spied `SimDevice`.
pub fn run_fixed(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let Ok(config) = (|| -> arbitrary::Result<FixedConfig> {
        let block = 256 * *u.choose(&[1u64, 1, 3, 16, 4096])?;
        let per_chunk = *u.choose(&[1u32, 2, 7, 128])?;
        let align = 256u64 << *u.choose(&[0u32, 0, 4, 13])?;
        Ok(FixedConfig::new(block).blocks_per_chunk(per_chunk).chunk_alignment(align))
    })() else {
        return;
    };
    let Ok(capacity) = u.choose(&[4u64 << 20, 256 << 20, 1 << 40]).copied() else { return };
    let spy = Spy::new(capacity);
    let fixed = FixedSizeResource::with_config(spy.clone(), config, &()).expect("a valid configuration");
    drive(&mut FixedTarget { fixed, spy }, &mut u);
}

// -------------------------------------------------------------- binning

/// `BinningResource` with power-of-two fixed-size bins over the spied
/// `SimDevice`, which also serves every larger request.
struct BinningTarget {
    bins: BinningResource<'static, Spy>,
    spy: Spy,
    /// Whether a release gave a bin's chunk back (a stale block of a bin may
    /// then be unknown to it).
    released_any: bool,
}

impl std::fmt::Debug for BinningTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BinningTarget").field("bins", &self.bins.bin_sizes()).finish_non_exhaustive()
    }
}

impl BinningTarget {
    fn fixed_figures(&self) -> (u64, u64, u64) {
        let (mut used, mut free, mut held) = (0, 0, 0);
        for &size in self.bins.bin_sizes() {
            if let Some(f) = self.bins.fixed_bin(size) {
                f.with(|f| {
                    used += f.used_bytes();
                    free += f.free_bytes();
                    held += f.pool_size();
                });
            }
        }
        (used, free, held)
    }
}

impl FuzzResource for BinningTarget {
    fn allocate(&mut self, request: Request) -> Result<Block> {
        self.bins.allocate(request, &())
    }
    fn deallocate(&mut self, block: Block) -> Result<()> {
        self.bins.deallocate(block, &())
    }
    fn release(&mut self) -> Option<Result<u64>> {
        let got = self.bins.release(&());
        if let Ok(bytes) = got {
            self.released_any |= bytes > 0;
            let (used, _, held) = self.fixed_figures();
            if used == 0 && held != 0 {
                panic!("fuzz oracle: release() kept {held} bytes in bins with nothing in use");
            }
        }
        Some(got)
    }
    fn fail_nth(&mut self, n: u64) -> bool {
        self.spy.inner.fail_nth(n);
        true
    }
    fn check(&self, model: &Model) -> std::result::Result<(), String> {
        if super::super::invariant_checker_on() {
            self.bins.check().map_err(|v| v.to_string())?;
        }
        // Every live block sits in the bin its size routes to, or upstream.
        for l in model.live() {
            let route = self.bins.bin_for(l.block.size());
            let owner = self.bins.bin_sizes().iter().copied().find(|&s| {
                // A free with a larger size is refused as a size mismatch,
                // without freeing, only by the bin that holds the address.
                let probe = Block::from_addr(l.block.addr(), s + 1);
                self.bins
                    .fixed_bin(s)
                    .is_some_and(|f| matches!(f.deallocate(probe, &()), Err(Error::SizeMismatch { .. })))
            });
            if owner != route {
                return Err(format!("{:?} routes to bin {route:?} but lies in bin {owner:?}", l.block));
            }
        }
        Ok(())
    }
    fn used_bytes(&self) -> u64 {
        let (used, _, held) = self.fixed_figures();
        used + (self.spy.inner.held_bytes() - held)
    }
    fn footprint(&self, size: u64) -> u64 {
        self.bins.bin_for(size).unwrap_or(size.div_ceil(256) * 256)
    }
    fn summary(&self) -> Vec<u64> {
        let (used, free, held) = self.fixed_figures();
        vec![self.used_bytes(), used, free, held, self.spy.inner.held_bytes()]
    }
    fn give_backs(&self) -> u64 {
        self.spy.frees()
    }
    fn forgets(&self, block: &Block) -> bool {
        self.bins.bin_for(block.size()).is_none() || self.released_any
    }
    fn stale_errors(&self, block: &Block) -> Vec<Error> {
        // The upstream may have given the address to a bin as a chunk.
        let (addr, given) = (block.addr(), block.size());
        self.bins.bin_sizes().iter().map(|&bin| Error::SizeMismatch { addr, expected: bin * 128, given }).collect()
    }
    fn mismatch_errors(&self, addr: u64, expected: u64, given: u64) -> Vec<Error> {
        let expected_route = self.bins.bin_for(expected);
        if self.bins.bin_for(given) == expected_route {
            return vec![Error::SizeMismatch { addr, expected, given }];
        }
        // Routed to a resource that does not hold the block; the upstream
        // finds the bin's chunk there if the block is its first.
        let mut allowed = vec![Error::UnknownBlock { addr }, Error::DoubleFree { addr }];
        if let Some(bin) = expected_route {
            allowed.push(Error::SizeMismatch { addr, expected: bin * 128, given });
        }
        allowed
    }
    fn begin_allocate(&mut self) {
        self.spy.take_log();
    }
    fn judge_alloc_failure(
        &self,
        request: &Request,
        err: &Error,
        before: &[u64],
        _: &Model,
    ) -> std::result::Result<(), String> {
        match self.bins.bin_for(request.size()) {
            Some(_) if request.align() > 256 => match err {
                Error::InvalidAlignment { align } if *align == request.align() => Ok(()),
                _ => Err("a bin refuses alignments above 256 with InvalidAlignment".into()),
            },
            Some(bin) => {
                let free_in_bin = self.bins.fixed_bin(bin).expect("a fixed bin").with(|f| f.free_bytes());
                if free_in_bin != 0 {
                    return Err(format!("bin {bin} has {free_in_bin} bytes free and failed"));
                }
                if self.summary() != before {
                    return Err("the failed allocation changed the figures".into());
                }
                upstream_explains(&self.spy, err)
            }
            None => upstream_explains(&self.spy, err),
        }
    }
}

/// Fuzz target `binning`: [`BinningResource`] with bins of 256 B up to
/// 2^8..=2^16 bytes over a spied `SimDevice`, which serves larger requests.
pub fn run_binning(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let Ok((max_exponent, capacity)) = (|| -> arbitrary::Result<(u32, u64)> {
        Ok((u.int_in_range(8..=16)?, *u.choose(&[16u64 << 20, 1 << 30, 1 << 40])?))
    })() else {
        return;
    };
    let spy = Spy::new(capacity);
    let bins = BinningResource::with_exponents(spy.clone(), 8, max_exponent).expect("valid exponents");
    drive(&mut BinningTarget { bins, spy, released_any: false }, &mut u);
}
