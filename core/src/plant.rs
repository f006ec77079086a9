//! Bugs planted on purpose, to show that the invariant checkers and the fuzz
//! oracles catch them (`fuzz/plant.sh` builds with one of them).
//!
//! Each flag is `false` unless the crate is built with
//! `--cfg memres_plant="NAME"`: a `const`, so the branches it guards are
//! folded away and an ordinary build runs exactly the code it would without
//! them. Every planted bug is named here and nowhere else.

/// `free` does not merge a range with the free range after it
/// (`skip_coalesce`).
pub(crate) const SKIP_COALESCE: bool = cfg!(memres_plant = "skip_coalesce");

/// A split leaves its tail one granule early, overlapping the block handed
/// out (`split_off_by_one`).
pub(crate) const SPLIT_OFF_BY_ONE: bool = cfg!(memres_plant = "split_off_by_one");

/// The stream-ordered layer hands a block to another stream without
/// waiting on the event after its free (`missing_wait`).
#[cfg(feature = "alloc")]
pub(crate) const MISSING_WAIT: bool = cfg!(memres_plant = "missing_wait");

/// The binning resource's tally (its large blocks, a counted bin's) takes
/// a freed block's size off the bytes it counts, not the footprint it
/// added (`tally_frees_size`).
#[cfg(feature = "alloc")]
pub(crate) const TALLY_FREES_SIZE: bool = cfg!(memres_plant = "tally_frees_size");

/// The tracking adaptor forgets a block it has checked before the upstream
/// frees it, so a free the upstream refuses loses a live block
/// (`forget_checked_free`).
#[cfg(feature = "alloc")]
pub(crate) const FORGET_CHECKED_FREE: bool = cfg!(memres_plant = "forget_checked_free");
