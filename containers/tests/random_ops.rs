//! Random container operations over a host pool, each checked against a
//! plain `Vec<u8>`: blocks are reused as buffers come and go, grow, shrink
//! and are cloned, so every copy path of `HostCopy` (from and to the host,
//! within host memory, fills) runs over recycled memory. Under Miri (in CI)
//! a short run finds any read of freed or unwritten bytes on those paths.

use memres_containers::{ContainerError, DeviceBuffer};
use memres_core::pool::{CoalescingPool, PoolConfig};
use memres_core::testing::{steps, SplitMix64};
use memres_core::{Error, Inspect, Shared};
use memres_sim::{HostCopy, HostMemory};

type Pool = Shared<CoalescingPool<HostMemory>>;
type Buffer<'a> = DeviceBuffer<&'a Pool, HostCopy>;

/// The pool's maximum size: small enough that growth sometimes fails.
const MAX: u64 = 16 << 10;

/// Random bytes of length `len`.
fn bytes(rng: &mut SplitMix64, len: usize) -> Vec<u8> {
    (0..len).map(|_| rng.below(256) as u8).collect()
}

/// Fails the test unless `e` is the full pool's refusal (the container is
/// then unchanged, which the comparison with the model checks).
fn expect_full(e: ContainerError, step: usize) {
    assert!(matches!(e, ContainerError::Memory(Error::OutOfMemory { .. })), "step {step}: {e}");
}

#[test]
fn random_buffer_operations_match_a_vec() {
    let config = PoolConfig::new().initial_size(8 << 10).maximum_size(MAX);
    let pool: Pool = Shared::new(CoalescingPool::with_config(HostMemory::new(), config, &()).unwrap());
    let mut rng = SplitMix64::new(0xb0f);
    let mut live: Vec<(Buffer<'_>, Vec<u8>)> = Vec::new();
    // How often each operation ran, and how often growth was refused.
    let mut seen = [0u32; 9];
    let mut full = 0;
    for step in 0..steps(20_000) {
        let op = if live.is_empty() { 0 } else { rng.below(9) as usize };
        let i = rng.below(live.len().max(1) as u64) as usize;
        let len = rng.below(2048) as usize;
        match op {
            0 if live.len() < 16 => {
                let data = bytes(&mut rng, len);
                match DeviceBuffer::from_slice_in(&data, (), &pool, HostCopy) {
                    Ok(b) => live.push((b, data)),
                    Err(e) => {
                        expect_full(e, step);
                        full += 1;
                    }
                }
            }
            0 | 1 => drop(live.swap_remove(i)),
            2 => {
                let (b, model) = &mut live[i];
                let offset = rng.below(model.len() as u64 + 1) as usize;
                let data = bytes(&mut rng, len.min(model.len() - offset));
                b.write(offset as u64, &data).unwrap();
                model[offset..offset + data.len()].copy_from_slice(&data);
                // Past the length: refused, nothing written.
                let e = b.write(model.len() as u64, &[1]).unwrap_err();
                assert!(matches!(e, ContainerError::IndexOutOfRange { .. }), "step {step}: {e}");
            }
            3 => {
                let (b, model) = &mut live[i];
                match b.resize(len as u64) {
                    Ok(()) => model.resize(len, 0),
                    Err(e) => {
                        expect_full(e, step);
                        full += 1;
                    }
                }
            }
            4 => {
                let (b, _) = &mut live[i];
                match b.reserve(len as u64) {
                    Ok(()) => assert!(b.capacity() >= len as u64, "step {step}"),
                    Err(e) => {
                        expect_full(e, step);
                        full += 1;
                    }
                }
            }
            5 => {
                let (b, model) = &mut live[i];
                match b.shrink_to_fit() {
                    Ok(()) => assert_eq!(b.capacity() as usize, model.len(), "step {step}"),
                    Err(e) => {
                        expect_full(e, step);
                        full += 1;
                    }
                }
            }
            6 => {
                let (b, model) = &mut live[i];
                let value = rng.below(256) as u8;
                b.fill(value).unwrap();
                model.fill(value);
            }
            7 => {
                let (b, model) = &mut live[i];
                b.clear();
                model.clear();
            }
            _ if live.len() < 16 => match live[i].0.try_clone_on(()) {
                Ok(c) => {
                    let model = live[i].1.clone();
                    live.push((c, model));
                }
                Err(e) => {
                    expect_full(e, step);
                    full += 1;
                }
            },
            _ => drop(live.swap_remove(i)),
        }
        seen[op] += 1;
        // Every buffer holds what the model says; a read of a random range too.
        for (b, model) in &live {
            assert_eq!(&b.to_vec().unwrap(), model, "step {step}");
        }
        if let Some((b, model)) = live.get(i) {
            let start = rng.below(model.len() as u64 + 1) as usize;
            let mut out = vec![0u8; rng.below((model.len() - start) as u64 + 1) as usize];
            b.read(start as u64, &mut out).unwrap();
            assert_eq!(out, model[start..start + out.len()], "step {step}");
        }
        pool.with(|p| p.check()).unwrap_or_else(|v| panic!("step {step}: {v}"));
    }
    // A full run takes every operation and fills the pool at times (a short
    // one, under Miri, need not).
    if !cfg!(miri) {
        assert!(seen.iter().all(|&n| n > 0) && full > 0, "{seen:?} {full}");
    }
    live.clear();
    pool.with(|p| {
        p.check().unwrap();
        assert_eq!(p.usage().used, 0);
    });
}
