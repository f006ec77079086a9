//! Why C frees go through an address table: the cost of freeing by
//! address alone (the pool finds the block by walking its chunk) against a
//! table lookup and a tagged free (O(1)), over a leaf with no memory behind
//! it (the pool never touches its blocks).
//!
//! ```sh
//! cargo run --release -p memres-cuda-capi --example free_by_address
//! ```

use memres::table::Table;
use memres_core::pool::{CoalescingPool, PoolConfig};
use memres_core::stack::Unbacked;
use memres_core::testing::SplitMix64;
use memres_core::{Block, MemoryResource, Request, Shared};
use std::time::Instant;

fn main() -> Result<(), memres_core::Error> {
    for live in [100usize, 1_000, 10_000] {
        let (by_address, by_table) = (run(live, false)?, run(live, true)?);
        println!(
            "{live:6} live blocks in one chunk: free by address {by_address:8.1} ns, \
             table lookup + tagged free {by_table:6.1} ns (allocation's table insert included)"
        );
    }
    Ok(())
}

/// ns per allocate+free pair of `live` blocks, freed in random order.
fn run(live: usize, table: bool) -> Result<f64, memres_core::Error> {
    let pool = Shared::new(CoalescingPool::with_config(
        Unbacked::new(),
        PoolConfig::new().initial_size(8 << 30),
        &(),
    )?);
    let t = Table::new();
    let mut rng = SplitMix64::new(1);
    let rounds = (200_000 / live).max(3);
    let start = Instant::now();
    for _ in 0..rounds {
        let mut blocks = Vec::with_capacity(live);
        for _ in 0..live {
            let b = pool.allocate(Request::new(256 + rng.below(64 << 10))?, &())?;
            if table {
                t.insert(b);
            }
            blocks.push((b.addr(), b.size()));
        }
        for i in (1..blocks.len()).rev() {
            blocks.swap(i, rng.below(i as u64 + 1) as usize);
        }
        for (addr, size) in blocks {
            // As `memres_free` does: the table checks the size it is given.
            let b = if table {
                t.remove_sized(addr, Some(size)).expect("live")
            } else {
                Block::from_addr(addr, size)
            };
            pool.deallocate(b, &())?;
        }
    }
    Ok(start.elapsed().as_nanos() as f64 / (rounds * live) as f64)
}
