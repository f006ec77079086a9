extern crate std;

use super::plan::coarsened;
use super::*;
use crate::check::LiveBlocks;
use crate::pool::CoalescingPool;
use crate::testing::{BumpUpstream, SplitMix64};
use std::collections::BTreeMap;

type Pool = Shared<CoalescingPool<BumpUpstream>>;

fn pool() -> Pool {
    Shared::new(CoalescingPool::new(BumpUpstream::new(1 << 40)))
}

/// Everything a failed call must leave as it was: the upstream pool's
/// figures and each fixed bin's.
fn figures(b: &BinningResource<'_, &Pool>) -> std::vec::Vec<u64> {
    let mut v = b.upstream().with(|p| std::vec![p.usage().used, p.usage().held, p.upstream().usage().held]);
    for &s in b.bin_sizes() {
        if let Some(f) = b.fixed_bin(s) {
            f.with(|f| v.extend([f.usage().held, f.used_blocks()]));
        }
    }
    v
}

/// Random allocate and free over power-of-two bins, a custom bin and the
/// pool as upstream and large path, with bad frees and upstream failures;
/// every bin's checker, the pool's checker, the caller's view and the
/// accounting checked after every step.
#[test]
fn randomized_over_fixed_bins_and_pool() {
    let pool = pool();
    // A bin of a size that is no power of two, served by its own fixed resource.
    let custom =
        Shared::new(FixedSizeResource::try_new(&pool, FixedConfig::new(3072).blocks_per_chunk(8)).unwrap());
    let mut bins = BinningResource::with_exponents(&pool, 8, 14).unwrap();
    bins.add_bin(3000, &custom).unwrap();
    let mut rng = SplitMix64::new(11);
    let mut live = LiveBlocks::new();
    let mut blocks: std::vec::Vec<Block> = std::vec::Vec::new();
    // Blocks live per route (bin size, or 0 for upstream) and large bytes.
    let mut per_route: BTreeMap<u64, u64> = BTreeMap::new();
    let mut large_bytes = 0u64;
    let mut seen = [0u64; 3];
    for step in 0..crate::testing::steps(100_000) {
        let before = figures(&bins);
        match rng.below(100) {
            0..=53 if blocks.len() < 800 => {
                let size = match rng.below(10) {
                    0 => 0,
                    1..=3 => rng.below(1024),
                    4..=7 => rng.below(20_000),
                    8 => 1 << rng.below(16),
                    _ => rng.below(1 << 20),
                };
                let req = Request::new(size).unwrap();
                let starved = bins
                    .bin_for(size)
                    .is_none_or(|s| bins.fixed_bin(s).is_some_and(|f| f.with(|f| f.free_blocks() == 0)));
                if starved && rng.below(16) == 0 {
                    pool.with(|p| p.upstream().fail_after(0));
                }
                match bins.allocate(req, &()) {
                    Ok(b) => {
                        live.insert(b, req).unwrap_or_else(|v| panic!("step {step}: {v}"));
                        if !b.is_empty() {
                            blocks.push(b);
                            let route = bins.bin_for(size).unwrap_or(0);
                            *per_route.entry(route).or_insert(0) += 1;
                            if route == 0 {
                                large_bytes += req.rounded_size(256);
                            }
                        }
                    }
                    Err(e) => {
                        assert!(
                            e.is_out_of_memory() || matches!(e, Error::Backend { .. }),
                            "step {step}: {e}"
                        );
                        seen[0] += 1;
                        assert_eq!(before, figures(&bins), "step {step}");
                    }
                }
                pool.with(|p| p.upstream().fail_after(u64::MAX));
            }
            // A double free, or a block of another resource.
            54..=56 if !blocks.is_empty() => {
                let b = blocks[rng.below(blocks.len() as u64) as usize];
                let bad = if rng.below(2) == 0 {
                    seen[1] += 1;
                    Block::new(b.addr() + (1 << 36), b.size(), b.tag())
                } else {
                    // Free it for real, then once more.
                    bins.deallocate(b, &()).unwrap();
                    live.remove(&b).unwrap();
                    blocks.retain(|x| x.addr() != b.addr());
                    let route = bins.bin_for(b.size()).unwrap_or(0);
                    *per_route.get_mut(&route).unwrap() -= 1;
                    if route == 0 {
                        large_bytes -= (b.size() + 255) & !255;
                    }
                    seen[2] += 1;
                    b
                };
                let before = figures(&bins);
                let e = bins.deallocate(bad, &()).unwrap_err();
                assert!(
                    matches!(e, Error::DoubleFree { .. } | Error::UnknownBlock { .. }),
                    "step {step}: {e}"
                );
                assert_eq!(before, figures(&bins), "step {step}");
            }
            57 => {
                bins.release(&()).unwrap();
            }
            _ if !blocks.is_empty() => {
                let b = blocks.swap_remove(rng.below(blocks.len() as u64) as usize);
                bins.deallocate(b, &()).unwrap_or_else(|e| panic!("step {step}: {e}"));
                live.remove(&b).unwrap();
                let route = bins.bin_for(b.size()).unwrap_or(0);
                *per_route.get_mut(&route).unwrap() -= 1;
                if route == 0 {
                    large_bytes -= (b.size() + 255) & !255;
                }
            }
            _ => {}
        }
        if let Err(v) =
            bins.check().and_then(|()| pool.with(|p| p.check())).and_then(|()| custom.with(|f| f.check()))
        {
            panic!("step {step}: {v}");
        }
        // Exact accounting: the pool's bytes in use are the chunks of the
        // bins plus the large blocks; each bin holds its live blocks.
        let mut held = custom.with(|f| f.usage().held);
        for &s in bins.bin_sizes() {
            let used = bins
                .fixed_bin(s)
                .map_or_else(|| custom.with(|f| f.used_blocks()), |f| f.with(|f| f.used_blocks()));
            assert_eq!(used, per_route.get(&s).copied().unwrap_or(0), "step {step}: bin {s}");
            held += bins.fixed_bin(s).map_or(0, |f| f.with(|f| f.usage().held));
        }
        assert_eq!(pool.with(|p| p.usage().used), held + large_bytes, "step {step}");
    }
    // (A full run takes every path; a short one, under Miri, need not.)
    assert!(seen.iter().all(|&n| n > 0) || cfg!(miri), "a path never ran: {seen:?}");
    for b in blocks.drain(..) {
        bins.deallocate(b, &()).unwrap();
    }
    bins.release(&()).unwrap();
    custom.with(|f| f.release(&())).unwrap();
    bins.check().unwrap();
    pool.with(|p| {
        p.check().unwrap();
        assert_eq!(p.usage().used, 0);
    });
}

#[test]
fn routes_to_smallest_bin_that_holds_the_size() {
    let up = BumpUpstream::new(1 << 40);
    let mut bins = BinningResource::with_exponents(&up, 8, 12).unwrap();
    bins.add_fixed_bin(FixedConfig::new(768)).unwrap();
    assert_eq!(bins.bin_sizes(), &[256, 512, 768, 1024, 2048, 4096]);
    for (size, bin) in [
        (1, Some(256)),
        (256, Some(256)),
        (257, Some(512)),
        (600, Some(768)),
        (769, Some(1024)),
        (4096, Some(4096)),
        (4097, None),
    ] {
        assert_eq!(bins.bin_for(size), bin, "{size}");
        let b = bins.allocate(Request::new(size).unwrap(), &()).unwrap();
        if let Some(s) = bin {
            assert_eq!(bins.fixed_bin(s).unwrap().with(|f| f.used_blocks()), 1, "{size}");
        }
        bins.deallocate(b, &()).unwrap();
        if let Some(s) = bin {
            assert_eq!(bins.fixed_bin(s).unwrap().with(|f| f.used_blocks()), 0, "{size}");
        }
    }
    // Zero bytes: nothing anywhere.
    assert!(bins.allocate(Request::new(0).unwrap(), &()).unwrap().is_empty());
    bins.release(&()).unwrap();
    assert_eq!(up.usage().held, 0);
}

#[test]
fn bad_bin_configurations_are_refused_and_change_nothing() {
    let up = BumpUpstream::new(1 << 40);
    let mut bins = BinningResource::with_exponents(&up, 8, 10).unwrap();
    let other = || Shared::new(CoalescingPool::new(&up));
    assert!(matches!(bins.add_bin(512, other()), Err(Error::InvalidConfig { .. })), "twice");
    assert!(matches!(bins.add_bin(0, other()), Err(Error::InvalidConfig { .. })), "zero");
    assert!(matches!(bins.add_bin(u64::MAX, other()), Err(Error::InvalidConfig { .. })), "too large");
    assert!(matches!(bins.add_fixed_bin(FixedConfig::new(1024)), Err(Error::InvalidConfig { .. })), "twice");
    assert!(
        matches!(bins.add_fixed_bin(FixedConfig::new(1000)), Err(Error::InvalidConfig { .. })),
        "not 256s"
    );
    assert_eq!(bins.bin_sizes(), &[256, 512, 1024]);
    bins.check().unwrap();
    for (min, max) in [(10, 9), (7, 9), (8, 63), (8, 60)] {
        assert!(
            matches!(BinningResource::<_>::with_exponents(&up, min, max), Err(Error::InvalidConfig { .. })),
            "{min}..={max}"
        );
    }
    // A working resource after all that.
    let b = bins.allocate(Request::new(300).unwrap(), &()).unwrap();
    bins.deallocate(b, &()).unwrap();
    assert_eq!(up.usage().held, 512 * 128);
}

#[test]
fn foreign_and_double_frees_are_errors_in_bins_and_upstream() {
    let pool = pool();
    let bins = BinningResource::with_exponents(&pool, 8, 10).unwrap();
    let other = BinningResource::with_exponents(&pool, 8, 10).unwrap();
    let r_small = Request::new(500).unwrap();
    let r_large = Request::new(5000).unwrap();
    let small = bins.allocate(r_small, &()).unwrap();
    let large = bins.allocate(r_large, &()).unwrap();
    let foreign = other.allocate(r_small, &()).unwrap();
    let before = figures(&bins);
    assert_eq!(bins.deallocate(foreign, &()), Err(Error::UnknownBlock { addr: foreign.addr() }));
    assert_eq!(before, figures(&bins));
    bins.deallocate(small, &()).unwrap();
    bins.deallocate(large, &()).unwrap();
    let before = figures(&bins);
    assert_eq!(bins.deallocate(small, &()), Err(Error::DoubleFree { addr: small.addr() }));
    assert!(bins.deallocate(large, &()).is_err());
    assert_eq!(before, figures(&bins));
    // Too aligned for the bin: refused, not misrouted.
    let e = bins.allocate(Request::aligned(300, 4096).unwrap(), &()).unwrap_err();
    assert_eq!(e, Error::InvalidAlignment { align: 4096 });
    bins.check().unwrap();
    other.deallocate(foreign, &()).unwrap();
}

#[test]
fn upstream_failure_while_a_bin_grows_leaves_everything_usable() {
    let up = BumpUpstream::new(1 << 40);
    let bins = BinningResource::with_exponents(&up, 8, 9).unwrap();
    up.fail_after(0);
    assert!(matches!(bins.allocate(Request::new(256).unwrap(), &()), Err(Error::Backend { .. })));
    assert!(matches!(bins.allocate(Request::new(4096).unwrap(), &()), Err(Error::Backend { .. })));
    assert_eq!(up.usage().held, 0);
    bins.check().unwrap();
    up.fail_after(u64::MAX);
    let b = bins.allocate(Request::new(256).unwrap(), &()).unwrap();
    bins.deallocate(b, &()).unwrap();
    assert_eq!(bins.fixed_bin(256).unwrap().with(|f| (f.used_blocks(), f.usage().held)), (0, 256 * 128));
}

#[test]
fn shared_between_threads_with_a_lock_per_bin() {
    fn assert_send_sync<T: Send + Sync>(_: &T) {}
    let pool = pool();
    let bins = BinningResource::with_exponents(&pool, 8, 12).unwrap();
    assert_send_sync(&bins);
    std::thread::scope(|s| {
        for t in 0..2u64 {
            let bins = &bins;
            s.spawn(move || {
                let mut rng = SplitMix64::new(t);
                let mut mine = std::vec::Vec::new();
                for _ in 0..crate::testing::steps(5_000) {
                    if mine.len() < 50 && rng.below(2) == 0 {
                        mine.push(bins.allocate(Request::new(rng.below(10_000)).unwrap(), &()).unwrap());
                    } else if let Some(b) = mine.pop() {
                        bins.deallocate(b, &()).unwrap();
                    }
                }
                for b in mine {
                    bins.deallocate(b, &()).unwrap();
                }
            });
        }
    });
    bins.check().unwrap();
    bins.release(&()).unwrap();
    pool.with(|p| assert_eq!(p.usage().used, 0));
}

/// A plan no bin could be made by is refused whatever the histogram
/// holds: with an empty one, or one whose sizes it chooses no bin for, a
/// plan of 0 blocks per chunk made a binning resource with no bins.
#[test]
fn a_bad_plan_is_refused_whatever_the_histogram_holds() {
    let up = BumpUpstream::new(1 << 30);
    let empty = SizeHistogram::new();
    let small: SizeHistogram = [512; 100].into_iter().collect();
    let huge: SizeHistogram = [1 << 40; 100].into_iter().collect();
    let too_many = FixedConfig::MAX_BLOCKS_PER_CHUNK + 1;
    for plan in [
        BinPlan::new().blocks_per_chunk(0),
        BinPlan::new().blocks_per_chunk(too_many),
        BinPlan::new().blocks_per_chunk(0).max_bins(0),
        // Its largest bins' chunks: 2^62 in 128 blocks, past any request.
        BinPlan::new().max_bin_size(1 << 62),
        BinPlan::new().max_bin_size(u64::MAX).blocks_per_chunk(1),
    ] {
        for h in [&empty, &small, &huge] {
            let made = BinningResource::<_>::from_histogram(&up, h, &plan);
            assert!(matches!(made, Err(Error::InvalidConfig { .. })), "{plan:?} over {:?}", h.iter().next());
        }
    }
    assert_eq!(up.usage().held, 0);
    // The largest chunk a request may take is a plan's bound.
    for plan in
        [BinPlan::new().max_bin_size(1 << 55), BinPlan::new().max_bin_size(1 << 62).blocks_per_chunk(1)]
    {
        for (h, bins) in [(&empty, &[][..]), (&small, &[512][..]), (&huge, &[1 << 40][..])] {
            let made = BinningResource::<_>::from_histogram(&up, h, &plan).unwrap();
            assert_eq!(made.bin_sizes(), bins, "{plan:?}");
        }
    }
}

#[test]
fn bins_from_a_histogram_serve_the_hot_sizes() {
    let mut rng = SplitMix64::new(5);
    let hot = [512u64, 1536, 8192, 65536];
    // Under Miri a tenth: the plan is quadratic in the distinct sizes.
    let n = if cfg!(miri) { 2_000 } else { 20_000 };
    let sample: std::vec::Vec<u64> = (0..n)
        .map(|_| match rng.below(10) {
            0..=7 => hot[rng.below(4) as usize] - rng.below(200),
            _ => 1 + rng.below(1 << 24),
        })
        .collect();
    let hist: SizeHistogram = sample.iter().copied().collect();
    let plan = BinPlan::new().max_bins(6);
    let up = BumpUpstream::new(1 << 44);
    let bins = BinningResource::<_>::from_histogram(&up, &hist, &plan).unwrap();
    for h in hot {
        assert!(bins.bin_sizes().contains(&h), "{h} not a bin: {:?}", bins.bin_sizes());
    }
    assert!(bins.bin_sizes().len() <= 6);
    // The waste the bins cause on the sample is within the budget.
    let (mut waste, mut asked) = (0u64, 0u64);
    for &s in &sample {
        if let Some(b) = bins.bin_for(s) {
            waste += b - ((s + 255) & !255);
            asked += (s + 255) & !255;
        }
    }
    assert!(waste * 100 <= asked * 10, "waste {waste} of {asked}");
    // And they work.
    let blocks: std::vec::Vec<Block> =
        sample[..n / 20].iter().map(|&s| bins.allocate(Request::new(s).unwrap(), &()).unwrap()).collect();
    bins.check().unwrap();
    for b in blocks {
        bins.deallocate(b, &()).unwrap();
    }
    bins.release(&()).unwrap();
    assert_eq!(up.usage().held, 0);
}

/// The plan's choice against a brute force over every subset of sizes, on
/// small random histograms: same top, same number of bins, same waste.
#[test]
fn plan_matches_brute_force() {
    let mut rng = SplitMix64::new(9);
    for case in 0..crate::testing::steps(400) {
        let mut hist = SizeHistogram::new();
        for _ in 0..1 + rng.below(8) {
            hist.record_n(256 * (1 + rng.below(40)), 1 + rng.below(50));
        }
        let plan = BinPlan::new()
            .max_bins(1 + rng.below(4) as u32)
            .max_waste_percent(rng.below(40) as u32)
            .min_share_percent(rng.below(30) as u32)
            .max_bin_size(256 * (1 + rng.below(45)));
        let points = coarsened(&hist, plan.max_bin_size & !255, usize::MAX);
        let waste_of = |bins: &[u64]| -> Option<(u128, u128)> {
            let (mut w, mut asked) = (0u128, 0u128);
            for &(s, c) in &points {
                if let Some(&b) = bins.iter().find(|&&b| b >= s) {
                    w += (b - s) as u128 * c as u128;
                    asked += s as u128 * c as u128;
                }
            }
            Some((w, asked))
        };
        // Brute force: over all subsets whose top is a point, the largest
        // top, then the least waste, then the fewest bins, within budget.
        let n = points.len();
        let mut best: Option<(u64, usize, u128)> = None;
        for mask in 1u32..(1 << n) {
            let set: std::vec::Vec<u64> =
                (0..n).filter(|i| mask & (1 << i) != 0).map(|i| points[i].0).collect();
            if set.len() > plan.max_bins as usize {
                continue;
            }
            let top = *set.last().unwrap();
            // Requests each bin serves: those above the next smaller bin.
            let mut lower = 0;
            let too_few = set.iter().any(|&b| {
                let n: u64 = points.iter().filter(|&&(s, _)| s > lower && s <= b).map(|p| p.1).sum();
                lower = b;
                n * 100 < hist.total() * plan.min_share_percent as u64
            });
            if too_few {
                continue;
            }
            let (w, asked) = waste_of(&set).unwrap();
            if w > asked * plan.max_waste_percent as u128 / 100 {
                continue;
            }
            let key = (top, set.len(), w);
            let better = match best {
                None => true,
                Some((t, m, bw)) => top > t || (top == t && (w < bw || (w == bw && set.len() < m))),
            };
            if better {
                best = Some(key);
            }
        }
        let chosen = plan.choose(&hist);
        let got = chosen.last().map(|&top| (top, chosen.len(), waste_of(&chosen).unwrap().0));
        assert_eq!(got, best, "case {case}: {hist:?} {plan:?} chose {chosen:?}");
    }
}

// Not under Miri: a plan over 1024 sizes is some 10^7 steps of safe
// arithmetic (hours there), with no unsafe code on its path.
#[cfg(not(miri))]
#[test]
fn large_histograms_are_coarsened_and_still_chosen() {
    let mut rng = SplitMix64::new(3);
    let hist: SizeHistogram = (0..50_000).map(|_| 1 + rng.below(1 << 20)).collect();
    assert!(hist.len() > 1024);
    let points = coarsened(&hist, 1 << 20, 1024);
    assert!(points.len() <= 1024);
    assert_eq!(points.iter().map(|p| p.1).sum::<u64>(), hist.total(), "no request lost");
    assert!(points.windows(2).all(|w| w[0].0 < w[1].0) && points.last().unwrap().0 <= 1 << 20);
    let chosen = BinPlan::new().choose(&hist);
    assert!(!chosen.is_empty() && chosen.len() <= 16);
    assert!(chosen.iter().all(|&b| b % 256 == 0 && b <= 1 << 20));
}

#[test]
fn debug_lists_bins() {
    let up = BumpUpstream::new(1 << 30);
    let mut bins = BinningResource::<_>::with_exponents(&up, 8, 8).unwrap();
    bins.add_bin(1024, Shared::new(CoalescingPool::new(&up))).unwrap();
    let s = std::format!("{bins:?}");
    assert!(s.contains("256: Shared") && s.contains("1024: MemoryResource"), "{s}");
}

/// A block larger than every bin freed with a size whose rounding overflows
/// (`next_multiple_of` panicked): the upstream, which knows the block,
/// refuses it, and the bytes stay counted.
#[test]
fn a_large_free_with_a_size_whose_rounding_overflows_is_refused() {
    let up = BumpUpstream::new(1 << 30);
    let pool = Shared::new(CoalescingPool::new(&up));
    let bins = BinningResource::<_>::with_exponents(&pool, 9, 9).unwrap();
    let large = bins.allocate(Request::new(1 << 20).unwrap(), &()).unwrap();
    let (held, used) = (up.usage().held, bins.usage().used);
    for tag in [large.tag(), Block::NO_TAG] {
        let wrong = Block::new(large.addr(), u64::MAX, tag);
        assert!(matches!(bins.deallocate(wrong, &()), Err(Error::SizeMismatch { given: u64::MAX, .. })));
        assert_eq!((up.usage().held, bins.usage().used), (held, used));
        bins.check().unwrap();
    }
    bins.deallocate(large, &()).unwrap();
    assert_eq!(bins.usage().used, 0);
    bins.check().unwrap();
}

/// A free known only by its address, at the start of a bin's chunk, with a
/// size too large for every bin: the upstream must not get it (it would
/// free the bin's whole chunk). The error expects the size the block was
/// asked with, as the bin's own does (before: the bin's block size).
#[test]
fn a_wrong_size_free_never_hands_a_bin_chunk_upstream() {
    let up = BumpUpstream::new(1 << 30);
    let bins = BinningResource::<_>::with_exponents(&up, 9, 9).unwrap();
    let b = bins.allocate(Request::new(300).unwrap(), &()).unwrap();
    let held = up.usage().held;
    let chunk = bins.fixed_bin(512).unwrap().with(|f| f.config().chunk_size());
    let wrong = Block::from_addr(b.addr(), chunk - 1);
    assert_eq!(
        bins.deallocate(wrong, &()),
        Err(Error::SizeMismatch { addr: b.addr(), expected: 300, given: chunk - 1 })
    );
    assert_eq!(up.usage().held, held, "the chunk stays with the bin");
    bins.check().unwrap();
    // The chunk's second block, past its start, is the bin's too.
    let second = bins.allocate(Request::new(300).unwrap(), &()).unwrap();
    assert_eq!(second.addr(), b.addr() + 512);
    assert_eq!(
        bins.deallocate(Block::from_addr(second.addr(), chunk - 1), &()),
        Err(Error::SizeMismatch { addr: second.addr(), expected: 300, given: chunk - 1 })
    );
    bins.deallocate(second, &()).unwrap();
    bins.deallocate(b, &()).unwrap();
    bins.check().unwrap();
}

/// The same through a bin of the user's over the same upstream (a pool),
/// which the binning resource cannot ask about its chunks: only blocks the
/// upstream handed out through the large path go to it.
#[test]
fn a_wrong_size_free_never_hands_an_added_bins_chunk_upstream() {
    let up = BumpUpstream::new(1 << 30);
    let mut bins: BinningResource<_> = BinningResource::new(&up);
    bins.add_bin(64 << 10, Shared::new(CoalescingPool::new(&up))).unwrap();
    let b = bins.allocate(Request::new(5000).unwrap(), &()).unwrap();
    let (held, usage) = (up.usage().held, bins.usage());
    let wrong = Block::from_addr(b.addr(), 1 << 20);
    assert_eq!(bins.deallocate(wrong, &()), Err(Error::UnknownBlock { addr: b.addr() }));
    assert_eq!((up.usage().held, bins.usage()), (held, usage), "the chunk stays with the bin");
    // A large block freed twice: the second free is refused here too.
    let large = bins.allocate(Request::new(1 << 20).unwrap(), &()).unwrap();
    bins.deallocate(large, &()).unwrap();
    assert_eq!(bins.deallocate(large, &()), Err(Error::UnknownBlock { addr: large.addr() }));
    assert_eq!((bins.usage().used, bins.usage().held), (usage.used, usage.held));
    bins.deallocate(b, &()).unwrap();
    bins.check().unwrap();
}

/// A size whose rounding up to 256 would pass `u64::MAX` counts as
/// `u64::MAX`, never under a smaller size: it was filed under
/// `u64::MAX - 255` (`saturating_add(255)` then the mask rounded it down),
/// with that size's exact requests, and a plan of bins up to `u64::MAX`
/// chose a bin of `u64::MAX - 255` bytes for it.
#[test]
fn a_size_whose_rounding_up_passes_u64_max_counts_as_u64_max() {
    let top = u64::MAX - 255; // the largest multiple of 256
    let mut h = SizeHistogram::new();
    h.record(top);
    h.record(top + 1);
    h.record(u64::MAX);
    h.record(top - 1);
    assert_eq!(h.iter().collect::<Vec<_>>(), [(top, 2), (u64::MAX, 2)]);
    assert_eq!((h.count(top), h.count(top + 1), h.count(u64::MAX)), (2, 2, 2));
    let mut huge = SizeHistogram::new();
    huge.record_n(u64::MAX, 10);
    let plan = BinPlan::new().max_bin_size(u64::MAX).max_waste_percent(100);
    assert_eq!(plan.choose(&huge), [0u64; 0], "no bin holds u64::MAX bytes");
}

/// Extreme counts and sizes saturate rather than overflow (a histogram
/// fed from outside: `record_n` and the plan's sums panicked).
#[test]
fn a_histogram_of_extreme_counts_is_planned_without_a_panic() {
    let mut h = SizeHistogram::new();
    h.record_n(256, u64::MAX);
    h.record_n(512, 1);
    assert_eq!((h.total(), h.count(256)), (u64::MAX, u64::MAX));
    assert_eq!(BinPlan::new().choose(&h), [256], "the 512s are too few to get a bin");
    let mut h = SizeHistogram::new();
    h.record_n(1 << 62, 1 << 60);
    let sizes = BinPlan::new().max_bin_size(1 << 62).max_waste_percent(100).choose(&h);
    assert_eq!(sizes, [1 << 62]);

    // More sizes than the plan optimizes over (1024): coarsening merges
    // 256 and 512 into 512, 768 and 1024 into 1024, ..., whose counts add
    // up past `u64::MAX` (a panic, or in release a wrap to 0 that left
    // those sizes out of the plan). They saturate: every point counts
    // `u64::MAX`, so the plan is that of one request of each point's size.
    let mut h = SizeHistogram::new();
    for k in 1..=1024u64 {
        h.record_n(k * 256, u64::MAX / 2 + 1);
    }
    h.record_n(1025 * 256, u64::MAX);
    let points = coarsened(&h, 1 << 20, 1024);
    assert_eq!(points.len(), 513);
    assert!(points.iter().all(|&(_, c)| c == u64::MAX), "{points:?}");
    // Planning over 513 points takes minutes under Miri; the merge above,
    // where the counts overflowed, runs there, and the plan has no unsafe
    // code.
    if cfg!(miri) {
        return;
    }
    let mut once = SizeHistogram::new();
    once.extend(points.iter().map(|&(s, _)| s));
    let plan = BinPlan::new().min_share_percent(0);
    let sizes = plan.choose(&h);
    assert!(!sizes.is_empty());
    assert_eq!(sizes, plan.choose(&once));
    // With the default minimum share as well.
    let sizes = BinPlan::new().choose(&h);
    assert!(!sizes.is_empty() && sizes.len() <= 16 && sizes.windows(2).all(|w| w[0] < w[1]), "{sizes:?}");
}

/// A counted bin (a resource with no figures to read: a `DynResource`):
/// the binning resource counts its blocks at their footprints, passes a
/// free on only for a block that came from it, and keeps its figures when
/// the bin refuses a free.
#[test]
fn a_counted_bins_blocks_are_counted_here_and_only_its_own_go_back_to_it() {
    use std::sync::Arc;
    // One upstream under the pool and the fixed bins: no address is both's.
    let up = Arc::new(BumpUpstream::new(1 << 30));
    let pool: crate::DynResource = Arc::new(Shared::new(CoalescingPool::new(up.clone())));
    let mut bins: BinningResource<_> = BinningResource::with_exponents(up.clone(), 8, 9).unwrap();
    bins.add_counted_bin(64 << 10, pool.clone()).unwrap();
    assert!(matches!(bins.add_counted_bin(512, pool.clone()), Err(Error::InvalidConfig { .. })), "twice");
    assert_eq!(bins.bin_sizes(), &[256, 512, 64 << 10]);
    assert!(bins.fixed_bin(64 << 10).is_none());
    let a = bins.allocate(Request::new(5000).unwrap(), &()).unwrap();
    let b = bins.allocate(Request::new(60_000).unwrap(), &()).unwrap();
    let counted = 5120 + 60_160;
    let u = bins.usage();
    assert_eq!((u.used, u.held, u.free), (counted, counted, 0));
    assert_eq!(bins.fixed_bin(512).unwrap().with(|f| f.usage().held), 0, "the pool served them");

    // Refused, nothing freed: a block of the pool that did not come
    // through here, a fixed bin's block freed with a size routed to the
    // counted bin, and the bin's own block freed with a size it refuses.
    let direct = pool.allocate(Request::new(4000).unwrap(), &()).unwrap();
    assert_eq!(bins.deallocate(direct, &()), Err(Error::UnknownBlock { addr: direct.addr() }));
    let small = bins.allocate(Request::new(300).unwrap(), &()).unwrap();
    let u = bins.usage();
    assert_eq!(
        bins.deallocate(Block::from_addr(small.addr(), 4000), &()),
        Err(Error::SizeMismatch { addr: small.addr(), expected: 300, given: 4000 })
    );
    assert!(bins.deallocate(Block::new(a.addr(), 4999, a.tag()), &()).is_err());
    assert_eq!(bins.usage(), u);
    bins.check().unwrap();

    bins.deallocate(a, &()).unwrap();
    assert_eq!(bins.deallocate(a, &()), Err(Error::UnknownBlock { addr: a.addr() }), "twice");
    pool.deallocate(direct, &()).unwrap();
    bins.deallocate(b, &()).unwrap();
    bins.deallocate(small, &()).unwrap();
    let u = bins.usage();
    assert_eq!(u.used, 0);
    assert_eq!(u.held, 512 * 128, "the 512-byte bin's chunk; nothing counted for the pool");
    assert!(u.peak_held >= 512 * 128 + counted);
    bins.check().unwrap();
}

/// The checker compares the bytes counted for the large blocks and for a
/// counted bin with the footprints of their live blocks.
#[test]
fn the_checker_finds_bytes_counted_that_no_live_block_has() {
    let up = BumpUpstream::new(1 << 30);
    let mut bins: BinningResource<_> = BinningResource::with_exponents(&up, 8, 8).unwrap();
    bins.add_counted_bin(4096, Shared::new(CoalescingPool::new(&up))).unwrap();
    let a = bins.allocate(Request::new(1000).unwrap(), &()).unwrap();
    let b = bins.allocate(Request::new(10_000).unwrap(), &()).unwrap();
    bins.check().unwrap();
    let Bin::Counted(_, counted) = &bins.bins[1] else { unreachable!("the 4096-byte bin is counted") };
    for tally in [&bins.large, counted] {
        tally.live.with(|l| l.held += 256);
        assert!(bins.check().is_err());
        tally.live.with(|l| l.held -= 256);
        bins.check().unwrap();
    }
    bins.deallocate(a, &()).unwrap();
    bins.deallocate(b, &()).unwrap();
    bins.check().unwrap();
}

/// Safe user bins whose figures are large (a held count kept as
/// "unknown", u64::MAX) are read without a panic: their sums saturate.
/// Before, `usage` added them with `+`, which panicked on overflow in a
/// debug build.
#[test]
fn bins_with_figures_near_u64_max_are_read_saturated() {
    struct Big;
    impl MemoryResource<()> for Big {
        fn allocate(&self, request: Request, _: &()) -> Result<Block> {
            Err(Error::OutOfMemory {
                requested: request.size(),
                largest_free: 0,
                pool_size: 0,
                max_size: None,
            })
        }
        fn deallocate(&self, block: Block, _: &()) -> Result<()> {
            Err(Error::UnknownBlock { addr: block.addr() })
        }
    }
    impl Inspect for Big {
        fn usage(&self) -> Usage {
            Usage::new(u64::MAX - 1, u64::MAX, u64::MAX, 7)
        }
        fn check(&self) -> core::result::Result<(), crate::check::Violation> {
            Ok(())
        }
    }
    let up = BumpUpstream::new(1 << 30);
    let mut bins = BinningResource::new(&up);
    bins.add_bin(256, Big).unwrap();
    bins.add_bin(512, Big).unwrap();
    let u = bins.usage();
    assert_eq!((u.used, u.held, u.peak_held, u.free, u.largest_free), (u64::MAX, u64::MAX, u64::MAX, 2, 7));
}

/// An upstream outside the contract whose large blocks' footprints add up
/// past `u64::MAX`: each block at the start of a quarter of the address
/// space in turn (the fifth back at 0, over the bin's chunk). The bytes
/// are read saturated and checked exactly, and count down exactly from
/// there. Before, the large blocks' tally wrapped to 0 at 2^64 and its
/// checker's sum panicked in a debug build (as did `held_as_layer`).
#[test]
fn large_blocks_whose_footprints_add_up_past_u64_max_are_counted_saturated() {
    struct Quarters(core::sync::atomic::AtomicU64);
    impl MemoryResource for Quarters {
        fn allocate(&self, request: Request, _: &()) -> Result<Block> {
            let n = self.0.fetch_add(1, core::sync::atomic::Ordering::Relaxed);
            Ok(Block::new((n % 4) << 62, request.size(), 0))
        }
        fn deallocate(&self, _: Block, _: &()) -> Result<()> {
            Ok(())
        }
    }
    let up = Quarters(core::sync::atomic::AtomicU64::new(0));
    let bins = BinningResource::with_exponents(&up, 8, 8).unwrap();
    let small = bins.allocate(Request::new(256).unwrap(), &()).unwrap();
    let in_bin = bins.usage().held;
    // Footprints 2^62 each: 2^64. The block in the last quarter ends at
    // the last address.
    let large: std::vec::Vec<_> = [1 << 62, 1 << 62, (1 << 62) - 1, 1 << 62]
        .map(|size| bins.allocate(Request::new(size).unwrap(), &()).unwrap())
        .into();
    assert_eq!(bins.usage().held, u64::MAX);
    assert_eq!(bins.held_as_layer(|_| true), u64::MAX);
    assert_eq!(bins.check(), Ok(()));
    for &b in &large[..3] {
        bins.deallocate(b, &()).unwrap();
    }
    assert_eq!(bins.usage().held, in_bin + (1 << 62));
    assert_eq!(bins.usage().peak_held, u64::MAX);
    bins.deallocate(large[3], &()).unwrap();
    bins.deallocate(small, &()).unwrap();
    assert_eq!(bins.usage().held, in_bin);
    assert_eq!(bins.check(), Ok(()));
}

/// A bin added while blocks are live would take over the frees of those
/// of its sizes that a larger bin or the upstream handed out: their frees
/// would reach it, which never had them, and they could never be freed.
/// Such a bin is refused; one that takes over no live block is added.
#[test]
fn a_bin_that_would_take_over_live_blocks_is_refused_and_they_still_free() {
    let up = BumpUpstream::new(1 << 40);
    let mut bins = BinningResource::with_exponents(&up, 8, 10).unwrap();
    let other = || Shared::new(CoalescingPool::new(&up));
    let small = bins.allocate(Request::new(300).unwrap(), &()).unwrap(); // the 512 bin's
    let large = bins.allocate(Request::new(3000).unwrap(), &()).unwrap(); // the upstream's
    let refused = |r: Result<()>| matches!(r, Err(Error::InvalidConfig { .. }));
    assert!(refused(bins.add_fixed_bin(FixedConfig::new(3072))), "over a large block");
    assert!(refused(bins.add_counted_bin(3000, other())), "over a large block, its size");
    assert!(refused(bins.add_bin(400, other())), "over a fixed bin's block");
    assert_eq!(bins.bin_sizes(), &[256, 512, 1024]);
    // Below every live block of the bin above: nothing to take over.
    bins.add_fixed_bin(FixedConfig::new(2048)).unwrap();
    bins.add_bin(288, other()).unwrap();
    bins.check().unwrap();
    bins.deallocate(small, &()).unwrap();
    bins.deallocate(large, &()).unwrap();
    assert_eq!(bins.usage().used, 0);
    bins.add_fixed_bin(FixedConfig::new(4096)).unwrap();
    bins.check().unwrap();
}

/// A large block, or a counted bin's, freed with another size that still
/// routes there: the upstream below frees by address (as `cuMemFree`), so
/// it took the free, and counted the size given. Now refused here, the
/// block live, nothing freed.
#[test]
fn a_large_or_counted_block_freed_with_another_size_is_refused_here() {
    let up = BumpUpstream::new(1 << 30);
    let counted = BumpUpstream::new(1 << 30);
    let mut bins = BinningResource::<_>::with_exponents(&up, 8, 10).unwrap();
    bins.add_counted_bin(64 << 10, &counted).unwrap();
    for (size, given) in [(1 << 20, 100 << 10), (40 << 10, 50 << 10)] {
        let b = bins.allocate(Request::new(size).unwrap(), &()).unwrap();
        let (used, held) = (bins.usage().used, up.usage().held + counted.usage().held);
        let wrong = Block::new(b.addr(), given, b.tag());
        assert_eq!(
            bins.deallocate(wrong, &()),
            Err(Error::SizeMismatch { addr: b.addr(), expected: size, given }),
            "{size}"
        );
        assert_eq!((bins.usage().used, up.usage().held + counted.usage().held), (used, held), "{size}");
        bins.deallocate(b, &()).unwrap();
    }
    assert_eq!((bins.usage().used, up.usage().held, counted.usage().held), (0, 0, 0));
}
