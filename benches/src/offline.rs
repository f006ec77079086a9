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
use memres_core::planned::placement::{first_conflict, place, Lifetime, Method, Placement};

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

/// Each method's placement of `blocks`, in the order of [`Method::ALL`],
/// every one checked: each is printed, not only the best.
///
/// # Errors
///
/// As [`check`], for the first that fails.
pub fn place_each(blocks: &[Lifetime]) -> Result<Vec<(Method, Placement)>, String> {
    let each: Vec<(Method, Placement)> = Method::ALL.iter().map(|&m| (m, place(blocks, m))).collect();
    each.iter().try_for_each(|(method, placement)| check(blocks, *method, placement))?;
    Ok(each)
}

/// Checks the `placement` of `blocks` that `method` made.
///
/// # Errors
///
/// Two blocks live at once whose addresses overlap; a top of `u64::MAX`,
/// where the offsets saturate (blocks that, rounded up, pass 2^64 bytes),
/// so that neither its footprint nor its check could be trusted.
pub fn check(blocks: &[Lifetime], method: Method, placement: &Placement) -> Result<(), String> {
    let name = method.name();
    if placement.top == u64::MAX {
        return Err(format!("the {name} placement reaches 2^64 - 1 bytes"));
    }
    match first_conflict(blocks, placement) {
        Some((a, b)) => {
            Err(format!("the {name} placement puts blocks {a} and {b}, live at once, on one address"))
        }
        None => Ok(()),
    }
}
