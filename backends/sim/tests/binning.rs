//! The binning resource and its fixed-size bins over the simulated device.

use memres_core::binning::{BinPlan, BinningResource, SizeHistogram};
use memres_core::pool::CoalescingPool;
use memres_core::testing::SplitMix64;
use memres_core::Inspect;
use memres_core::{Block, Error, MemoryResource, Request, Shared};
use memres_sim::SimDevice;
use std::sync::Arc;

/// Bytes the binning resource's fixed bins hold from the device.
fn bins_held<U>(bins: &BinningResource<'_, U>) -> u64 {
    bins.bin_sizes().iter().filter_map(|&s| bins.fixed_bin(s)).map(|f| f.with(|f| f.usage().held)).sum()
}

#[test]
fn randomized_over_the_device() {
    let dev = SimDevice::new(8 << 30);
    let bins = BinningResource::with_exponents(&dev, 8, 16).unwrap();
    let mut rng = SplitMix64::new(21);
    let mut live: Vec<Block> = Vec::new();
    let mut large = 0u64;
    for step in 0..20_000 {
        if live.is_empty() || rng.below(100) < 52 {
            let size = if rng.below(10) == 0 { 1 + rng.below(1 << 20) } else { 1 + rng.below(1 << 16) };
            let b = bins.allocate(Request::new(size).unwrap(), &()).unwrap();
            if bins.bin_for(size).is_none() {
                large += (size + 255) & !255;
            }
            live.push(b);
        } else {
            let b = live.swap_remove(rng.below(live.len() as u64) as usize);
            bins.deallocate(b, &()).unwrap();
            if bins.bin_for(b.size()).is_none() {
                large -= (b.size() + 255) & !255;
            }
        }
        bins.check().unwrap_or_else(|v| panic!("step {step}: {v}"));
        assert_eq!(dev.usage().held, bins_held(&bins) + large, "step {step}");
        if rng.below(2000) == 0 {
            bins.release(&()).unwrap();
        }
    }
    for b in live {
        bins.deallocate(b, &()).unwrap();
    }
    bins.release(&()).unwrap();
    assert_eq!(dev.usage().held, 0);
}

#[test]
fn device_failure_and_bad_frees_leave_accounting_exact() {
    let dev = SimDevice::new(1 << 30);
    let bins = BinningResource::with_exponents(&dev, 8, 10).unwrap();
    let small = bins.allocate(Request::new(300).unwrap(), &()).unwrap();
    let large = bins.allocate(Request::new(5000).unwrap(), &()).unwrap();
    let held = dev.usage().held;
    dev.fail_nth(1);
    assert!(bins.allocate(Request::new(1024).unwrap(), &()).is_err(), "the 1 KiB bin cannot grow");
    assert_eq!(dev.usage().held, held);
    bins.deallocate(small, &()).unwrap();
    bins.deallocate(large, &()).unwrap();
    assert!(matches!(bins.deallocate(small, &()), Err(Error::DoubleFree { .. })));
    assert!(bins.deallocate(large, &()).is_err(), "the device refuses a double free");
    assert!(bins.deallocate(Block::from_addr(SimDevice::BASE + (1 << 40), 64), &()).is_err());
    bins.check().unwrap();
    bins.release(&()).unwrap();
    assert_eq!(dev.usage().held, 0);
}

#[test]
fn histogram_bins_over_a_shared_pool_from_threads() {
    let dev = SimDevice::new(8 << 30);
    let pool = Arc::new(Shared::new(CoalescingPool::new(&dev)));
    let hist: SizeHistogram = [768u64, 768, 768, 4096, 4096, 40_000].into_iter().cycle().take(6000).collect();
    let bins = BinningResource::<_>::from_histogram(Arc::clone(&pool), &hist, &BinPlan::new()).unwrap();
    assert_eq!(bins.bin_sizes(), &[768, 4096, 40_192]);
    std::thread::scope(|s| {
        for t in 0..2 {
            let bins = &bins;
            s.spawn(move || {
                let mut rng = SplitMix64::new(t);
                let mut mine = Vec::new();
                for _ in 0..5000 {
                    if mine.len() < 64 && rng.below(2) == 0 {
                        let size = [768, 4096, 40_000, 100_000][rng.below(4) as usize];
                        mine.push(bins.allocate(Request::new(size).unwrap(), &()).unwrap());
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
    pool.with(|p| {
        p.check().unwrap();
        assert_eq!(p.usage().used, 0);
    });
}
