//! The fuzz targets of the binning resource: fixed-size bins alone, and
//! with a counted bin.

use super::super::{drive, FuzzResource, Model};
use super::{round256, upstream_explains, Spy};
use arbitrary::Unstructured;
use memres_core::binning::BinningResource;
use memres_core::fixed::FixedConfig;
use memres_core::{Block, Error, Inspect, MemoryResource, Request, Result};
use memres_sim::SimDevice;

/// `BinningResource` with power-of-two fixed-size bins over the spied
/// `SimDevice`, which also serves every larger request, and perhaps a
/// counted bin.
struct BinningTarget {
    bins: BinningResource<'static, Spy>,
    spy: Spy,
    /// A bin added with `add_counted_bin`, served by a second spied device
    /// whose addresses the first never hands out.
    counted: Option<Counted>,
    /// Whether a release gave a bin's chunk back (a stale block of a bin may
    /// then be unknown to it).
    released_any: bool,
    /// The bins' sizes, ascending, from the configuration the target
    /// decoded: the model routes with these, never with the resource's own
    /// routing, which it checks.
    sizes: Vec<u64>,
}

/// The counted bin: its size, and the device behind it.
struct Counted {
    size: u64,
    spy: Spy,
}

impl std::fmt::Debug for BinningTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BinningTarget")
            .field("bins", &self.bins.bin_sizes())
            .field("counted", &self.counted.as_ref().map(|c| c.size))
            .finish_non_exhaustive()
    }
}

impl BinningTarget {
    fn new(bins: BinningResource<'static, Spy>, spy: Spy, counted: Option<Counted>, sizes: Vec<u64>) -> Self {
        BinningTarget { bins, spy, counted, released_any: false, sizes }
    }

    /// The bin a request of `size` bytes routes to, in the model: the
    /// smallest that holds it; `None` above the largest (the upstream).
    fn route(&self, size: u64) -> Option<u64> {
        self.sizes.iter().copied().find(|&bin| bin >= size)
    }

    /// The resource's route of `size` bytes, checked against the model's.
    fn checked_route(&self, size: u64) -> std::result::Result<Option<u64>, String> {
        let (got, want) = (self.bins.bin_for(size), self.route(size));
        match got == want {
            true => Ok(want),
            false => {
                Err(format!("{size} bytes route to bin {got:?}, the smallest that holds them is {want:?}"))
            }
        }
    }

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

    /// The counted bin, if a block of `size` bytes routes to it.
    fn counted_for(&self, size: u64) -> Option<&Counted> {
        self.counted.as_ref().filter(|c| self.route(size) == Some(c.size))
    }

    /// Bytes the counted bin's device holds: its live blocks' footprints.
    fn counted_held(&self) -> u64 {
        self.counted.as_ref().map_or(0, |c| c.spy.inner.usage().held)
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
        let before = self.fixed_figures().2;
        let got = self.bins.release(&());
        let (used, _, held) = self.fixed_figures();
        // Chunks go back beside one the upstream refuses.
        self.released_any |= held < before;
        if let Ok(bytes) = got {
            if bytes != before - held {
                panic!(
                    "fuzz oracle: release() says {bytes} bytes went back; the bins hold {} less",
                    before - held
                );
            }
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
        // The figures the binning resource reports: every bin's and the
        // large blocks', counted by it (the tallies) or by the bins.
        if self.bins.bin_sizes() != self.sizes {
            return Err(format!("bins {:?}, configured {:?}", self.bins.bin_sizes(), self.sizes));
        }
        let used = self.bins.usage().used;
        if used != model.used() {
            return Err(format!("the resource reports {used} bytes used, the model {}", model.used()));
        }
        // Every live block sits in the bin its size routes to, or upstream,
        // and on the device that serves that route.
        let mut counted_live = 0;
        for l in model.live() {
            let route = self.checked_route(l.block.size())?;
            let owner = self.bins.bin_sizes().iter().copied().find(|&s| {
                // A free with a larger size is refused as a size mismatch,
                // without freeing, only by the bin that holds the address.
                let probe = Block::from_addr(l.block.addr(), s + 1);
                self.bins
                    .fixed_bin(s)
                    .is_some_and(|f| matches!(f.deallocate(probe, &()), Err(Error::SizeMismatch { .. })))
            });
            let device = match self.counted_for(l.block.size()) {
                Some(c) => {
                    counted_live += l.footprint;
                    &c.spy.inner
                }
                None if owner != route => {
                    return Err(format!("{:?} routes to bin {route:?} but lies in bin {owner:?}", l.block));
                }
                None => &self.spy.inner,
            };
            if !device.addresses().contains(l.block.addr()) {
                return Err(format!("{:?} lies outside the device its route {route:?} takes from", l.block));
            }
        }
        if counted_live != self.counted_held() {
            return Err(format!(
                "the counted bin's device holds {} bytes, its live blocks {counted_live}",
                self.counted_held()
            ));
        }
        Ok(())
    }
    fn used_bytes(&self) -> u64 {
        let (used, _, held) = self.fixed_figures();
        used + (self.spy.inner.usage().held - held) + self.counted_held()
    }
    fn footprint(&self, size: u64) -> u64 {
        match self.counted_for(size) {
            Some(_) => round256(size),
            None => self.route(size).unwrap_or(round256(size)),
        }
    }
    fn size_class(&self, size: u64) -> u64 {
        // Fixed bins and the devices check the exact size a block was
        // asked with.
        size
    }
    fn summary(&self) -> Vec<u64> {
        let (used, free, held) = self.fixed_figures();
        vec![self.used_bytes(), used, free, held, self.spy.inner.usage().held, self.counted_held()]
    }
    fn device_bases(&self) -> Vec<u64> {
        let counted = self.counted.as_ref().map(|c| c.spy.inner.addresses().start());
        [self.spy.inner.addresses().start()].into_iter().chain(counted).collect()
    }

    fn spy(&self) -> Option<&Spy> {
        Some(&self.spy)
    }
    /// The bins' device and the counted bin's.
    fn spies(&self) -> Vec<&Spy> {
        std::iter::once(&self.spy).chain(self.counted.as_ref().map(|c| &c.spy)).collect()
    }
    fn forgets(&self, block: &Block) -> bool {
        // The large blocks and the counted bin's leave the tally at their
        // free.
        let route = self.route(block.size());
        route.is_none() || self.counted_for(block.size()).is_some() || self.released_any
    }
    fn stale_errors(&self, block: &Block, live: Option<&Block>) -> Vec<Error> {
        // The upstream may have given the address to a bin as a chunk: the
        // binning resource (naming the bin's block size, or a live block's
        // size as asked) or the upstream (naming the chunk) refuses the
        // size.
        let (addr, given) = (block.addr(), block.size());
        let mut errors: Vec<Error> = self
            .bins
            .bin_sizes()
            .iter()
            .filter(|&&bin| self.bins.fixed_bin(bin).is_some())
            .flat_map(|&bin| {
                [
                    Error::SizeMismatch { addr, expected: bin * 128, given },
                    Error::SizeMismatch { addr, expected: bin, given },
                ]
            })
            .collect();
        errors.extend(live.map(|l| Error::SizeMismatch { addr, expected: l.size(), given }));
        // A large block or a counted bin's live there again, routed the
        // same: the tally refuses another size than the live block's.
        if let Some(live) = live.filter(|l| l.size() != given && self.route(l.size()) == self.route(given)) {
            if self.route(given).is_none() || self.counted_for(given).is_some() {
                errors.push(Error::SizeMismatch { addr, expected: live.size(), given });
            }
        }
        errors
    }
    fn mismatch_errors(&self, addr: u64, expected: u64, given: u64) -> Vec<Error> {
        let expected_route = self.route(expected);
        if self.route(given) == expected_route {
            return vec![Error::SizeMismatch { addr, expected, given }];
        }
        if self.counted_for(expected).is_some() {
            // Only the counted bin's device has that address: every other
            // route finds no block there.
            return vec![Error::UnknownBlock { addr }];
        }
        // Routed to a resource that does not hold the block; the upstream
        // finds the bin's chunk there if the block is its first.
        let mut allowed = vec![Error::UnknownBlock { addr }, Error::DoubleFree { addr }];
        if let Some(bin) = expected_route {
            allowed.push(Error::SizeMismatch { addr, expected: bin * 128, given });
            // A size for the upstream or the counted bin at a bin's live
            // block: the binning resource refuses it, naming the size the
            // block was asked with.
            allowed.push(Error::SizeMismatch { addr, expected, given });
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
        if self.summary() != before {
            return Err("the failed allocation changed the figures".into());
        }
        if let Some(c) = self.counted_for(request.size()) {
            // Any alignment: the device gives it.
            return upstream_explains(&c.spy, err);
        }
        match self.checked_route(request.size())? {
            Some(_) if request.align() > 256 => match err {
                Error::InvalidAlignment { align } if *align == request.align() => Ok(()),
                _ => Err("a bin refuses alignments above 256 with InvalidAlignment".into()),
            },
            Some(bin) => {
                let free_in_bin = self.bins.fixed_bin(bin).expect("a fixed bin").with(|f| f.usage().free);
                if free_in_bin != 0 {
                    return Err(format!("bin {bin} has {free_in_bin} bytes free and failed"));
                }
                upstream_explains(&self.spy, err)
            }
            None => upstream_explains(&self.spy, err),
        }
    }
}

/// The largest bin's exponent and the devices' capacity, as both targets
/// decode them.
fn decode_bins(u: &mut Unstructured<'_>) -> arbitrary::Result<(u32, u64)> {
    Ok((u.int_in_range(8..=16)?, *u.choose(&[16u64 << 20, 1 << 30, 1 << 40])?))
}

/// Fuzz target `binning`: [`BinningResource`] with bins of 256 B up to
/// 2^8..=2^16 bytes over a spied `SimDevice`, which serves larger requests.
pub fn run_binning(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let Ok((max_exponent, capacity)) = decode_bins(&mut u) else { return };
    let spy = Spy::new(capacity);
    let bins = BinningResource::with_exponents(spy.clone(), 8, max_exponent).expect("valid exponents");
    let sizes = (8..=max_exponent).map(|e| 1 << e).collect();
    drive(&mut BinningTarget::new(bins, spy, None, sizes), &mut u);
}

/// Fuzz target `binning_counted`: as `binning`, and a bin added with
/// [`add_counted_bin`](BinningResource::add_counted_bin) of any multiple
/// of 256 bytes up to twice the largest power-of-two bin (replacing the
/// power of two of its size), served by a second spied `SimDevice` whose
/// addresses start at 2^60, whose blocks the binning resource counts
/// itself.
pub fn run_binning_counted(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let Ok((max_exponent, capacity, size)) = (|| -> arbitrary::Result<(u32, u64, u64)> {
        let (max_exponent, capacity) = decode_bins(&mut u)?;
        Ok((max_exponent, capacity, 256 * u.int_in_range(1..=2u64 << (max_exponent - 8))?))
    })() else {
        return;
    };
    let spy = Spy::new(capacity);
    let mut bins = BinningResource::new(spy.clone());
    for e in (8..=max_exponent).filter(|&e| 1 << e != size) {
        bins.add_fixed_bin(FixedConfig::new(1 << e)).expect("a power-of-two bin");
    }
    let device = SimDevice::with_base(capacity, 1 << 60).expect("a base far above the first device's");
    let counted = Counted { size, spy: Spy::over(device) };
    bins.add_counted_bin(size, counted.spy.clone()).expect("a bin of a size not taken");
    let mut sizes: Vec<u64> = (8..=max_exponent).map(|e| 1 << e).filter(|&s| s != size).collect();
    sizes.push(size);
    sizes.sort_unstable();
    drive(&mut BinningTarget::new(bins, spy, Some(counted), sizes), &mut u);
}
