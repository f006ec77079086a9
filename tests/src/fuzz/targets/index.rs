//! The fuzz target of the coalescing index alone.

use super::super::{drive, FuzzResource, Model};
use arbitrary::Unstructured;
use memres_core::pool::CoalescingIndex;
use memres_core::Range;
use memres_core::{Block, Error, Request, Result};
use std::cell::Cell;

/// `CoalescingIndex` alone over a few regions; `release` removes the wholly
/// free regions.
#[derive(Debug)]
struct IndexTarget {
    index: CoalescingIndex,
    /// Regions still in the index, with their first node.
    regions: Vec<(Range, u32)>,
    removed: u64,
    /// The range the last successful free coalesced into, to compare with
    /// the model.
    last_free: Cell<Option<(u64, Range)>>,
}

impl IndexTarget {
    fn build(u: &mut Unstructured<'_>) -> arbitrary::Result<Self> {
        let granule = 1u64 << *u.choose(&[8u32, 8, 8, 9, 12, 16])?;
        let mut index = CoalescingIndex::new(granule);
        let mut regions = Vec::new();
        let count = u.int_in_range(1..=4)?;
        let mut cursor = granule * u.int_in_range(0..=1024u64)?;
        for _ in 0..count {
            let len = granule
                * match u.int_in_range(0..=3u8)? {
                    0 => u.int_in_range(1..=64u64)?,
                    1 => u.int_in_range(1..=1 << 16)?,
                    2 => u.int_in_range(1..=1 << 24)?,
                    _ => 1 << u.int_in_range(20..=34u32)?,
                };
            // Adjacent regions too: they must never merge.
            let gap = if u.arbitrary()? { 0 } else { granule * u.int_in_range(1..=1 << 20)? };
            let start = match cursor.checked_add(gap) {
                Some(s) if s.checked_add(len).is_some() => s,
                _ => break,
            };
            let range = Range::new(start, len).expect("checked");
            let first = index.add_range(range).expect("add_range of a valid region");
            regions.push((range, first));
            cursor = range.end();
        }
        Ok(IndexTarget { index, regions, removed: 0, last_free: Cell::new(None) })
    }

    fn region_of(&self, addr: u64) -> Option<(Range, u32)> {
        self.regions.iter().copied().find(|(r, _)| r.contains(addr))
    }
}

impl FuzzResource for IndexTarget {
    fn allocate(&mut self, request: Request) -> Result<Block> {
        if request.is_zero() {
            return Ok(Block::EMPTY);
        }
        let g = self.index.granule();
        let len = request.size().next_multiple_of(g);
        let placed = if request.size() % 2 == 0 {
            // The free range it was carved from holds it.
            self.index.allocate_with_range(request.size(), request.align())?.map(|(a, from)| {
                assert!(
                    from.start() <= a.addr && a.addr + len <= from.end(),
                    "{:#x} not in {from:?}",
                    a.addr
                );
                a
            })
        } else {
            self.index.allocate(request.size(), request.align())?
        };
        if let (Some(a), true) = (placed, request.size() % 3 == 0) {
            // As the virtual pool moves a small block: to the first place a
            // rule of the address accepts (here, not the start of every
            // fourth granule), else nowhere; each place offered lies in
            // the free range offered with it.
            let fits = |addr: u64| addr / g % 4 != 0;
            let offered = |addr: u64, free: Range| {
                assert!(free.start() <= addr && addr + len <= free.end(), "{addr:#x} offered in {free:?}");
                fits(addr)
            };
            // An error changes nothing: `a` stays.
            let b = self.index.move_where(a, request.size(), request.align(), 8, offered).unwrap_or(a);
            assert!(
                fits(b.addr) || b.addr == a.addr,
                "move_where took {:#x}, a place it was refused",
                b.addr
            );
            return Ok(Block::new(b.addr, request.size(), b.tag));
        }
        match placed {
            Some(a) => Ok(Block::new(a.addr, request.size(), a.tag)),
            None => Err(Error::OutOfMemory {
                requested: request.size(),
                largest_free: self.index.largest_free(),
                pool_size: self.regions.iter().map(|(r, _)| r.len()).sum(),
                max_size: None,
            }),
        }
    }

    fn deallocate(&mut self, block: Block) -> Result<()> {
        if block.is_empty() {
            return Ok(());
        }
        let addr = block.addr();
        let freed = match self.index.free(block.tag(), addr, block.size()) {
            Err(Error::UnknownBlock { .. }) => {
                // The address-only path, as the pool does it.
                let Some((_, first)) = self.region_of(addr) else {
                    return Err(Error::UnknownBlock { addr });
                };
                match self.index.find_used(first, addr) {
                    Some(tag) if block.tag() == Block::NO_TAG => self.index.free(tag, addr, block.size())?,
                    Some(_) => return Err(Error::DoubleFree { addr }),
                    None if self.index.is_free_at(first, addr) => return Err(Error::DoubleFree { addr }),
                    None => return Err(Error::UnknownBlock { addr }),
                }
            }
            other => other?,
        };
        self.last_free.set(Some((addr, freed)));
        Ok(())
    }

    fn release(&mut self) -> Option<Result<u64>> {
        let mut bytes = 0;
        let mut kept = Vec::new();
        for (range, first) in std::mem::take(&mut self.regions) {
            if self.index.is_region_free(first) {
                match self.index.remove_range(first) {
                    Ok(r) if r == range => {
                        bytes += r.len();
                        self.removed += 1;
                    }
                    Ok(r) => panic!("remove_range({first}) gave {r:?}, the region was {range:?}"),
                    Err(e) => return Some(Err(e)),
                }
            } else {
                kept.push((range, first));
            }
        }
        self.regions = kept;
        Some(Ok(bytes))
    }

    fn check(&self, model: &Model) -> std::result::Result<(), String> {
        if super::super::invariant_checker_on() {
            self.index.check().map_err(|v| v.to_string())?;
        }
        let mut live: Vec<(u64, u64)> = model.live().iter().map(|l| (l.block.addr(), l.footprint)).collect();
        live.sort_unstable();
        let mut free = 0;
        let mut largest = 0;
        for &(region, first) in &self.regions {
            let gaps = model.gaps_in(region);
            free += gaps.iter().map(|g| g.len()).sum::<u64>();
            largest = gaps.iter().map(|g| g.len()).max().unwrap_or(0).max(largest);
            // The index's ranges of the region are exactly the model's gaps
            // and live blocks.
            let mut gi = gaps.iter();
            let mut bad = None;
            self.index.for_each_in_region(first, |r, is_free| {
                if is_free && gi.next() != Some(&r) {
                    bad = Some(r);
                }
                if !is_free && live.binary_search(&(r.start(), r.len())).is_err() {
                    bad = Some(r);
                }
            });
            if let Some(r) = bad {
                return Err(format!("index range {r:?} of region {region:?} is not what the model has"));
            }
            if gi.next().is_some() {
                return Err(format!("the index misses a free gap of region {region:?}"));
            }
        }
        if self.index.free_bytes() != free {
            return Err(format!("index counts {} bytes free, the model {free}", self.index.free_bytes()));
        }
        if self.index.largest_free() != largest {
            return Err(format!(
                "largest_free() = {}, the model's largest gap {largest}",
                self.index.largest_free()
            ));
        }
        if self.index.used_count() != model.live().len() as u64 {
            return Err(format!(
                "used_count() = {}, {} live blocks",
                self.index.used_count(),
                model.live().len()
            ));
        }
        if let Some((addr, range)) = self.last_free.take() {
            let region = self.region_of(addr).ok_or("freed address in no region")?.0;
            let gap = model.gaps_in(region).into_iter().find(|g| g.contains(addr));
            if gap != Some(range) {
                return Err(format!(
                    "free of {addr:#x} coalesced into {range:?}, the model's gap is {gap:?}"
                ));
            }
        }
        Ok(())
    }

    fn used_bytes(&self) -> u64 {
        self.index.used_bytes()
    }

    fn footprint(&self, size: u64) -> u64 {
        let g = self.index.granule();
        size.div_ceil(g) * g
    }

    fn size_class(&self, size: u64) -> u64 {
        // It checks the exact size a block was asked with.
        size
    }

    fn summary(&self) -> Vec<u64> {
        vec![
            self.index.used_bytes(),
            self.index.free_bytes(),
            self.index.used_count(),
            self.regions.len() as u64,
        ]
    }

    fn give_backs(&self) -> u64 {
        self.removed
    }

    fn judge_alloc_failure(
        &self,
        request: &Request,
        err: &Error,
        _before: &[u64],
        model: &Model,
    ) -> std::result::Result<(), String> {
        if !matches!(err, Error::OutOfMemory { .. }) {
            return Err("the index fails only by finding no range".into());
        }
        // The index's promise: a range of at least `need` plus one size
        // class step (1/32) always serves the request, whatever its place.
        let g = self.index.granule();
        let align = request.align().max(g);
        let need = request.size().div_ceil(g) + align / g - 1;
        let sure = need + need / 32;
        for &(region, _) in &self.regions {
            for gap in model.gaps_in(region) {
                if gap.len() / g >= sure {
                    return Err(format!(
                        "free range {gap:?} of {} granules surely fits {need} granules",
                        gap.len() / g
                    ));
                }
            }
        }
        Ok(())
    }
}

/// Fuzz target `index`: [`CoalescingIndex`] alone over a few regions.
pub fn run_index(data: &[u8]) {
    let mut u = Unstructured::new(data);
    let Ok(mut target) = IndexTarget::build(&mut u) else { return };
    drive(&mut target, &mut u);
}
