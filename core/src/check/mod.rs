//! The invariant checker: what tests and fuzz targets run after every step.
//!
//! Each algorithm has a `check()` method that walks its metadata (O(n), never
//! on the hot path) and returns the first broken invariant as a
//! [`Violation`]. [`LiveBlocks`] checks what a caller sees: every live block
//! aligned as asked, no two overlapping. [`FailNth`] is the fault injection
//! of the simulated devices, streams and address spaces.

use core::fmt;

/// A broken invariant: what is wrong.
///
/// # Examples
///
/// ```
/// use memres_core::check::Violation;
/// assert_eq!(Violation::new("free neighbours not coalesced").to_string(), "free neighbours not coalesced");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Violation {
    what: &'static str,
}

impl Violation {
    /// A violation described by `what`.
    pub const fn new(what: &'static str) -> Self {
        Violation { what }
    }

    /// What is wrong.
    pub const fn what(&self) -> &'static str {
        self.what
    }
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.what)
    }
}

impl core::error::Error for Violation {}

mod fail;
#[cfg(feature = "alloc")]
mod live;
pub use fail::FailNth;
#[cfg(feature = "alloc")]
pub use live::LiveBlocks;
