use core::fmt;

/// A half-open range of addresses `start..start + len` in some address space.
///
/// The core never dereferences an address: a range is only numbers. `start +
/// len` never overflows (the constructor checks it).
///
/// # Examples
///
/// ```
/// use memres_core::Range;
/// let r = Range::new(0x1000, 0x100).unwrap();
/// assert_eq!(r.end(), 0x1100);
/// assert!(r.contains(0x10ff) && !r.contains(0x1100));
/// assert!(Range::new(u64::MAX, 2).is_none());
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct Range {
    start: u64,
    len: u64,
}

impl Range {
    /// The range `start..start + len`, or `None` if its end overflows `u64`.
    pub const fn new(start: u64, len: u64) -> Option<Self> {
        match start.checked_add(len) {
            Some(_) => Some(Range { start, len }),
            None => None,
        }
    }

    /// The range `start..end`, or `None` if `end < start`.
    ///
    /// ```
    /// # use memres_core::Range;
    /// assert_eq!(Range::from_bounds(4, 10).unwrap().len(), 6);
    /// assert!(Range::from_bounds(10, 4).is_none());
    /// ```
    pub const fn from_bounds(start: u64, end: u64) -> Option<Self> {
        match end.checked_sub(start) {
            Some(len) => Some(Range { start, len }),
            None => None,
        }
    }

    /// First address of the range.
    pub const fn start(&self) -> u64 {
        self.start
    }

    /// Number of addresses in the range.
    #[allow(clippy::len_without_is_empty)]
    pub const fn len(&self) -> u64 {
        self.len
    }

    /// One past the last address.
    pub const fn end(&self) -> u64 {
        self.start + self.len
    }

    /// Whether the range holds no address.
    ///
    /// ```
    /// # use memres_core::Range;
    /// assert!(Range::new(5, 0).unwrap().is_empty());
    /// ```
    pub const fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether `addr` lies in the range.
    pub const fn contains(&self, addr: u64) -> bool {
        addr >= self.start && addr - self.start < self.len
    }

    /// Whether `other` lies wholly inside this range.
    ///
    /// ```
    /// # use memres_core::Range;
    /// let a = Range::new(0, 100).unwrap();
    /// assert!(a.contains_range(&Range::new(10, 90).unwrap()));
    /// assert!(!a.contains_range(&Range::new(10, 91).unwrap()));
    /// ```
    pub const fn contains_range(&self, other: &Range) -> bool {
        other.start >= self.start && other.end() <= self.end()
    }

    /// Whether the two ranges share an address (empty ranges share none).
    ///
    /// ```
    /// # use memres_core::Range;
    /// let a = Range::new(0, 10).unwrap();
    /// assert!(a.overlaps(&Range::new(9, 1).unwrap()));
    /// assert!(!a.overlaps(&Range::new(10, 1).unwrap()));
    /// ```
    pub const fn overlaps(&self, other: &Range) -> bool {
        self.len != 0 && other.len != 0 && self.start < other.end() && other.start < self.end()
    }
}

impl fmt::Debug for Range {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#x}..{:#x}", self.start, self.end())
    }
}
