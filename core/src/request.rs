use crate::{Error, Result, DEFAULT_ALIGNMENT};

/// A validated allocation request: a size in bytes and a power-of-two alignment.
///
/// Validation happens here, at the boundary, so that the algorithms never see
/// a size whose rounding overflows or an alignment that is not a power of two.
/// Alignments below [`DEFAULT_ALIGNMENT`] are raised to it, as in RMM.
///
/// A request of zero bytes is valid: every resource answers it with
/// [`Block::EMPTY`](crate::Block::EMPTY) (no memory, nothing to free), as RMM
/// answers it with a null pointer.
///
/// # Examples
///
/// ```
/// use memres_core::{Error, Request};
/// let r = Request::new(1000)?;
/// assert_eq!((r.size(), r.align()), (1000, 256));
/// assert_eq!(Request::aligned(64, 4096)?.align(), 4096);
/// assert_eq!(Request::aligned(64, 16)?.align(), 256);
/// assert!(matches!(Request::aligned(64, 3), Err(Error::InvalidAlignment { align: 3 })));
/// assert!(matches!(Request::new(u64::MAX), Err(Error::InvalidSize { .. })));
/// # Ok::<(), Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Request {
    size: u64,
    align: u64,
}

impl Request {
    /// The largest size a request may ask for: 2^62 bytes. Anything larger
    /// is an [`Error::InvalidSize`], so that rounding and padding never overflow.
    pub const MAX_SIZE: u64 = 1 << 62;
    /// The largest alignment a request may ask for: 2^40 bytes.
    pub const MAX_ALIGN: u64 = 1 << 40;

    /// A request for `size` bytes at the default alignment (256 bytes).
    pub const fn new(size: u64) -> Result<Self> {
        Self::aligned(size, DEFAULT_ALIGNMENT)
    }

    /// A request for `size` bytes aligned to `align`, a power of two.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidAlignment`] if `align` is not a power of two or above
    /// [`MAX_ALIGN`](Self::MAX_ALIGN); [`Error::InvalidSize`] if `size` is
    /// above [`MAX_SIZE`](Self::MAX_SIZE).
    pub const fn aligned(size: u64, align: u64) -> Result<Self> {
        if !align.is_power_of_two() || align > Self::MAX_ALIGN {
            return Err(Error::InvalidAlignment { align });
        }
        if size > Self::MAX_SIZE {
            return Err(Error::InvalidSize { size, what: "above Request::MAX_SIZE" });
        }
        let align = if align < DEFAULT_ALIGNMENT { DEFAULT_ALIGNMENT } else { align };
        Ok(Request { size, align })
    }

    /// Requested size in bytes.
    pub const fn size(&self) -> u64 {
        self.size
    }

    /// Alignment in bytes: a power of two, at least 256.
    pub const fn align(&self) -> u64 {
        self.align
    }

    /// Whether the request is for zero bytes.
    ///
    /// ```
    /// # use memres_core::Request;
    /// assert!(Request::new(0).unwrap().is_zero());
    /// ```
    pub const fn is_zero(&self) -> bool {
        self.size == 0
    }

    /// The size rounded up to a multiple of `granule` (usually a power of
    /// two); a granule of 0 leaves it as it is. Never overflows: the size is
    /// at most [`MAX_SIZE`](Self::MAX_SIZE), so the multiple is below
    /// `size + granule` or is `granule` itself.
    ///
    /// ```
    /// # use memres_core::Request;
    /// assert_eq!(Request::new(1).unwrap().rounded_size(256), 256);
    /// assert_eq!(Request::new(1000).unwrap().rounded_size(0), 1000);
    /// assert_eq!(Request::new(1000).unwrap().rounded_size(3), 1002);
    /// ```
    #[inline]
    pub const fn rounded_size(&self, granule: u64) -> u64 {
        if granule.is_power_of_two() {
            (self.size + granule - 1) & !(granule - 1)
        } else if granule == 0 {
            self.size
        } else {
            self.size.div_ceil(granule) * granule
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Request;

    /// Every granule, 0 and those no power of two included: the smallest
    /// multiple at or above the size, with no overflow (a granule of 0 used
    /// to underflow).
    #[test]
    fn rounded_size_is_defined_for_every_granule() {
        for size in [0, 1, 255, 256, 1000, Request::MAX_SIZE - 1, Request::MAX_SIZE] {
            let r = Request::new(size).unwrap();
            assert_eq!(r.rounded_size(0), size);
            assert_eq!(r.rounded_size(1), size);
            for g in [3, 256, 1000, 1 << 40, 1 << 63, u64::MAX - 1, u64::MAX] {
                let got = r.rounded_size(g);
                assert!(got % g == 0 && got >= size && got - size < g, "{size} to {g}: {got}");
            }
        }
    }
}
