//! The pool with fixed-capacity metadata: no allocator needed.

use super::*;
use crate::storage::ArrayStorage;
use crate::testing::BumpUpstream;
use crate::Inspect;

type SmallPool = CoalescingPool<BumpUpstream, ArrayStorage<Node, 8>, ArrayStorage<Chunk, 2>>;

fn small_pool() -> SmallPool {
    let config =
        PoolConfig::new().initial_size(1 << 20).growth(Growth::Fraction { divisor: 1, granule: 1 << 20 });
    SmallPool::with_config_in(BumpUpstream::new(1 << 30), config, &()).unwrap()
}

#[test]
fn node_capacity_exhausted_is_an_error_and_pool_stays_usable() {
    let mut pool = small_pool();
    let mut blocks = [Block::EMPTY; 16];
    let mut n = 0;
    let err = loop {
        match pool.allocate(Request::new(256).unwrap(), &()) {
            Ok(b) => {
                blocks[n] = b;
                n += 1;
                pool.check().unwrap();
            }
            Err(e) => break e,
        }
    };
    assert_eq!(err, Error::CapacityExhausted { capacity: 8 });
    // Node slots: 8; a split keeps two spare, so fewer than 8 blocks fit.
    assert!(n >= 5, "only {n} blocks");
    pool.check().unwrap();
    let used = pool.usage().used;
    assert_eq!(used, n as u64 * 256);
    // Freeing makes room again.
    pool.deallocate(blocks[n - 1], &()).unwrap();
    n -= 1;
    pool.check().unwrap();
    let b = pool.allocate(Request::new(256).unwrap(), &()).unwrap();
    pool.deallocate(b, &()).unwrap();
    for b in &blocks[..n] {
        pool.deallocate(*b, &()).unwrap();
        pool.check().unwrap();
    }
    assert_eq!(pool.usage().used, 0);
}

#[test]
fn chunk_capacity_exhausted_is_an_error_and_nothing_leaks() {
    let mut pool = small_pool();
    let a = pool.allocate(Request::new(1 << 20).unwrap(), &()).unwrap();
    let b = pool.allocate(Request::new(1 << 20).unwrap(), &()).unwrap();
    assert_eq!(pool.chunk_count(), 2);
    let held = pool.upstream().usage().held;
    let err = pool.allocate(Request::new(1 << 20).unwrap(), &()).unwrap_err();
    assert_eq!(err, Error::CapacityExhausted { capacity: 2 });
    assert_eq!(pool.upstream().usage().held, held, "no upstream block stranded");
    pool.check().unwrap();
    pool.deallocate(a, &()).unwrap();
    pool.deallocate(b, &()).unwrap();
    pool.release(&()).unwrap();
    assert_eq!(pool.upstream().usage().held, 0);
}

#[cfg(feature = "heapless")]
#[test]
fn heapless_vec_storage() {
    let mut pool: HeaplessPool<BumpUpstream, 32, 4> =
        HeaplessPool::with_config_in(BumpUpstream::new(1 << 30), PoolConfig::new(), &()).unwrap();
    let mut live = [Block::EMPTY; 8];
    for (i, slot) in live.iter_mut().enumerate() {
        *slot = pool.allocate(Request::new(1000 * (i as u64 + 1)).unwrap(), &()).unwrap();
        pool.check().unwrap();
    }
    for b in live {
        pool.deallocate(b, &()).unwrap();
        pool.check().unwrap();
    }
    assert_eq!(pool.usage().used, 0);
}

#[test]
fn growth_with_too_few_node_slots_takes_nothing_from_upstream() {
    let mut pool = small_pool();
    let mut blocks = [Block::EMPTY; 16];
    let mut n = 0;
    // Fill the node table with small blocks of the initial chunk.
    while let Ok(b) = pool.allocate(Request::new(256).unwrap(), &()) {
        blocks[n] = b;
        n += 1;
    }
    // Freeing the last block merges it into the free tail: two vacant slots,
    // enough for a search but not for a new chunk's range and a split.
    pool.deallocate(blocks[n - 1], &()).unwrap();
    let held = pool.usage().held;
    let err = pool.allocate(Request::new(2 << 20).unwrap(), &()).unwrap_err();
    assert_eq!(err, Error::CapacityExhausted { capacity: 8 });
    assert_eq!(pool.usage().held, held, "a failed allocation kept a chunk");
    assert_eq!(pool.upstream().usage().held, held);
    pool.check().unwrap();
}

/// Random allocations and frees over fixed-capacity metadata. The pool's
/// index reads its storage without bounds checks, so under Miri (in CI) a
/// short run shows every access stays inside it; running out of slots is
/// `CapacityExhausted`, with nothing allocated and the pool consistent.
fn randomized_bounded<N: Storage<Node>, C: Storage<Chunk>>(
    mut pool: CoalescingPool<BumpUpstream, N, C>,
    seed: u64,
) {
    let mut rng = crate::testing::SplitMix64::new(seed);
    let mut live = [Block::EMPTY; 48];
    let mut n = 0;
    let mut refused = 0;
    for step in 0..crate::testing::steps(20_000) {
        if n == 0 || n < live.len() && rng.below(100) < 55 {
            let size = match rng.below(3) {
                0 => rng.below(512),
                1 => rng.below(64 << 10),
                _ => rng.below(2 << 20),
            };
            let align = if rng.below(8) == 0 { 256 << rng.below(6) } else { 256 };
            let used = pool.usage().used;
            match pool.allocate(Request::aligned(size, align).unwrap(), &()) {
                Ok(b) => {
                    assert!(b.size() >= size && b.addr() % align == 0, "step {step}: {b:?}");
                    if !b.is_empty() {
                        live[n] = b;
                        n += 1;
                    }
                }
                Err(Error::CapacityExhausted { .. }) => {
                    refused += 1;
                    assert_eq!(pool.usage().used, used, "step {step}");
                }
                Err(e) => panic!("step {step}: {e}"),
            }
        } else {
            let i = rng.below(n as u64) as usize;
            let b = live[i];
            live[i] = live[n - 1];
            n -= 1;
            pool.deallocate(b, &()).unwrap();
        }
        pool.check().unwrap_or_else(|v| panic!("step {step}: {v}"));
        assert_eq!(pool.upstream().usage().held, pool.usage().held, "step {step}");
    }
    // A full run fills the storage (a short one, under Miri, need not).
    assert!(refused > 0 || cfg!(miri), "the storage never ran out");
    for &b in &live[..n] {
        pool.deallocate(b, &()).unwrap();
    }
    pool.check().unwrap();
    assert_eq!(pool.usage().used, 0);
    pool.release(&()).unwrap();
    assert_eq!(pool.upstream().usage().held, 0);
}

#[test]
fn randomized_array_storage() {
    type Pool = CoalescingPool<BumpUpstream, ArrayStorage<Node, 32>, ArrayStorage<Chunk, 4>>;
    randomized_bounded(Pool::with_config_in(BumpUpstream::new(1 << 40), PoolConfig::new(), &()).unwrap(), 1);
}

#[cfg(feature = "heapless")]
#[test]
fn randomized_heapless_storage() {
    let pool: HeaplessPool<BumpUpstream, 32, 4> =
        HeaplessPool::with_config_in(BumpUpstream::new(1 << 40), PoolConfig::new(), &()).unwrap();
    randomized_bounded(pool, 2);
}
