//! Offline placement of a whole workload: where each block goes when every
//! lifetime is known before the first allocation
//! ([`memres_core::planned::placement`], as [`Planned`] lays out a step).
//!
//! No allocator knows the future, so this is not a resource but a
//! reference: what a placement that never moves a block can reach once it
//! has seen the whole sequence. The online peers (`offset-allocator`,
//! `range-alloc`) and the pools place each block knowing only the past.
//! Sizes are rounded up to 256 bytes, as the peers' are.
//!
//! [`Planned`]: memres_core::planned::Planned

use crate::replay::GRANULE;
use crate::workload::Workload;
use memres_core::planned::placement::Lifetime;

#[cfg(test)]
mod tests;

/// The blocks of `workload`, indexed by allocation id: live from the op
/// that allocates them to the op that frees them (or past the last op).
pub fn lifetimes(workload: &Workload) -> Vec<Lifetime> {
    let end = workload.ops.len() as u32;
    let mut blocks = Vec::with_capacity(workload.ids as usize);
    for (i, op) in workload.ops.iter().enumerate() {
        if op.alloc {
            // Ids are allocated in order (`Workload::from_ops` checks it).
            blocks.push(Lifetime {
                start: i as u32,
                end,
                size: op.size.checked_next_multiple_of(GRANULE).unwrap_or(u64::MAX),
            });
        } else {
            blocks[op.id as usize].end = i as u32;
        }
    }
    blocks
}
