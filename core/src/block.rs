use crate::{Error, Range, Result};

/// What an allocation hands back: an address, the size that was asked for,
/// and an opaque tag that lets the resource free it without a search.
///
/// The tag belongs to the resource that made the block (for the pool it is a
/// node index and a generation count). A resource checks it before trusting
/// it, so a forged, stale or foreign block is an error, never corruption.
/// Callers that only hold an address (a C ABI, a trace) build the block with
/// [`Block::from_addr`], whose tag says "unknown": the resource then looks the
/// address up.
///
/// # Examples
///
/// ```
/// use memres_core::Block;
/// let b = Block::from_addr(0x1000, 64);
/// assert_eq!((b.addr(), b.size(), b.tag()), (0x1000, 64, Block::NO_TAG));
/// assert!(Block::EMPTY.is_empty());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Block {
    addr: u64,
    size: u64,
    tag: u64,
}

impl Default for Block {
    /// [`Block::EMPTY`].
    fn default() -> Self {
        Block::EMPTY
    }
}

impl Block {
    /// The tag of a block whose maker is not known.
    pub const NO_TAG: u64 = u64::MAX;

    /// The answer to a zero-byte request: no memory, and freeing it does nothing.
    pub const EMPTY: Block = Block { addr: 0, size: 0, tag: Block::NO_TAG };

    /// A block as a resource hands it out. Only resources should need this.
    #[inline]
    pub const fn new(addr: u64, size: u64, tag: u64) -> Self {
        Block { addr, size, tag }
    }

    /// A block known only by its address and size (as a C caller or a trace
    /// knows it): the resource looks it up when it is freed.
    #[inline]
    pub const fn from_addr(addr: u64, size: u64) -> Self {
        Block { addr, size, tag: Self::NO_TAG }
    }

    /// First address of the block.
    #[inline]
    pub const fn addr(&self) -> u64 {
        self.addr
    }

    /// The size that was asked for, in bytes.
    #[inline]
    pub const fn size(&self) -> u64 {
        self.size
    }

    /// The resource's tag ([`NO_TAG`](Self::NO_TAG) when unknown).
    #[inline]
    pub const fn tag(&self) -> u64 {
        self.tag
    }

    /// The same block with another tag: for adaptors that keep their own.
    #[inline]
    pub const fn with_tag(self, tag: u64) -> Self {
        Block { tag, ..self }
    }

    /// Whether this is the answer to a zero-byte request: no address and
    /// no bytes. A block of zero bytes at an address is none: no resource
    /// hands one out, so a free of one names a block with a wrong size (or
    /// none), an error.
    #[inline]
    pub const fn is_empty(&self) -> bool {
        self.size == 0 && self.addr == 0
    }

    /// The addresses the block covers (its requested size).
    ///
    /// ```
    /// # use memres_core::Block;
    /// assert_eq!(Block::from_addr(512, 10).range().end(), 522);
    /// ```
    pub fn range(&self) -> Range {
        Range::new(self.addr, self.size).unwrap_or_default()
    }

    /// The first `len` bytes of a block an upstream handed out for a request
    /// of `len` bytes. A shorter block is an error: what lies past its size
    /// is not the upstream's to give (see [`MemoryOf`](crate::copy::MemoryOf));
    /// so is one whose first `len` bytes run past the last address. Either
    /// is the upstream's fault ([`Error::UpstreamMisbehaved`]), not the
    /// request's.
    pub(crate) fn upstream_range(&self, len: u64) -> Result<Range> {
        if self.size < len {
            return Err(self.misbehaved("shorter than asked"));
        }
        Range::new(self.addr, len).ok_or(self.misbehaved("running past the last address"))
    }

    /// [`Error::UpstreamMisbehaved`] for this block, an upstream's answer,
    /// with what is wrong with it.
    pub(crate) const fn misbehaved(&self, what: &'static str) -> Error {
        Error::UpstreamMisbehaved { addr: self.addr, size: self.size, what }
    }
}
