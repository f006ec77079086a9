//! The fuzz target of the binning resource.

use super::super::{drive, FuzzResource, Model};
use super::{upstream_explains, Spy};
use arbitrary::Unstructured;
use memres_core::binning::BinningResource;
use memres_core::{Block, Error, Inspect, MemoryResource, Request, Result};

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
                    used += f.usage().used;
                    free += f.usage().free;
                    held += f.usage().held;
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
        used + (self.spy.inner.usage().held - held)
    }
    fn footprint(&self, size: u64) -> u64 {
        self.bins.bin_for(size).unwrap_or(size.div_ceil(256) * 256)
    }
    fn size_class(&self, size: u64) -> u64 {
        // Fixed bins and the upstream's pool check the exact size a block
        // was asked with.
        size
    }
    fn summary(&self) -> Vec<u64> {
        let (used, free, held) = self.fixed_figures();
        vec![self.used_bytes(), used, free, held, self.spy.inner.usage().held]
    }
    fn spy(&self) -> Option<&Spy> {
        Some(&self.spy)
    }
    fn forgets(&self, block: &Block) -> bool {
        self.bins.bin_for(block.size()).is_none() || self.released_any
    }
    fn stale_errors(&self, block: &Block) -> Vec<Error> {
        // The upstream may have given the address to a bin as a chunk: the
        // binning resource (naming the bin) or the upstream (naming the
        // chunk) refuses the size.
        let (addr, given) = (block.addr(), block.size());
        self.bins
            .bin_sizes()
            .iter()
            .flat_map(|&bin| {
                [
                    Error::SizeMismatch { addr, expected: bin * 128, given },
                    Error::SizeMismatch { addr, expected: bin, given },
                ]
            })
            .collect()
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
            // A size for the upstream at an address in a bin's chunk: the
            // binning resource refuses it, naming the bin.
            allowed.push(Error::SizeMismatch { addr, expected: bin, given });
        }
        allowed
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
                let free_in_bin = self.bins.fixed_bin(bin).expect("a fixed bin").with(|f| f.usage().free);
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
