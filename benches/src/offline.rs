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
///
/// # Errors
///
/// A workload of more ops than [`op_count`] numbers.
pub fn lifetimes(workload: &Workload) -> Result<Vec<Lifetime>, String> {
    let end = op_count(&workload.name, workload.ops.len())?;
    let mut blocks = Vec::with_capacity(workload.ids as usize);
    // Every op's index is below `end`, so it fits.
    for (i, op) in (0..end).zip(&workload.ops) {
        if op.alloc {
            // Ids are allocated in order (`Workload::from_ops` checks it).
            blocks.push(Lifetime {
                start: i,
                end,
                size: op.size.checked_next_multiple_of(GRANULE).unwrap_or(u64::MAX),
            });
        } else {
            blocks[op.id as usize].end = i;
        }
    }
    Ok(blocks)
}

/// The number of `ops` of the workload `name` as the placement numbers
/// them, in 32 bits: a [`Lifetime`] is 16 bytes, and the placement sorts
/// and scans one per block, so 64-bit op numbers would make its data half
/// as large again for traces no one has (2^32 ops is 64 GiB of ops).
///
/// # Errors
///
/// More than `u32::MAX` ops: refused, where they were misnumbered (the
/// numbers wrapped).
pub fn op_count(name: &str, ops: usize) -> Result<u32, String> {
    u32::try_from(ops)
        .map_err(|_| format!("{name}: {ops} ops, more than the offline placement numbers ({})", u32::MAX))
}
