//! Fault injection for the simulated backends: the Nth call fails.

/// One armed failure: the `n`th call after [`arm`](FailNth::arm)`(n)` fails,
/// once (`n = 1`: the next call); it counts the failures it delivered. The
/// fault injection of the simulated devices, streams and address spaces.
///
/// # Examples
///
/// ```
/// use memres_core::check::FailNth;
/// let mut f = FailNth::new();
/// f.arm(2);
/// assert_eq!([f.fires(), f.fires(), f.fires()], [false, true, false]);
/// f.arm(1);
/// f.arm(0); // cancels
/// assert!(!f.fires());
/// assert_eq!(f.delivered(), 1);
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FailNth {
    /// Calls to let through, the failing one included (0: none armed).
    left: u64,
    /// Calls made to fail so far.
    delivered: u64,
}

impl FailNth {
    /// Nothing armed, nothing delivered.
    pub const fn new() -> Self {
        FailNth { left: 0, delivered: 0 }
    }

    /// Makes the `n`th call from now fail; `n = 0` cancels.
    pub fn arm(&mut self, n: u64) {
        self.left = n;
    }

    /// Counts one call: true when it is the one to fail.
    pub fn fires(&mut self) -> bool {
        if self.left == 0 {
            return false;
        }
        self.left -= 1;
        if self.left > 0 {
            return false;
        }
        // Counted in the branch, not as `fire as u64`: rustc 1.95 in release
        // builds lost that addition where the call was inlined into a branch
        // on its answer (rust-lang/rust#158206, fixed in 1.96.1).
        self.delivered += 1;
        true
    }

    /// The calls made to fail so far.
    pub fn delivered(&self) -> u64 {
        self.delivered
    }
}
