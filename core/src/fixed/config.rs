//! The configuration of the fixed-size resource.

use super::slots::MAX_SLOTS;
use crate::{Error, Request, Result, DEFAULT_ALIGNMENT};

// A chunk's slots are numbered below the slot table's markers.
const _: () = assert!((FixedConfig::MAX_BLOCKS_PER_CHUNK as u64) < MAX_SLOTS);

/// Sizes of a [`FixedSizeResource`](super::FixedSizeResource).
///
/// # Examples
///
/// ```
/// use memres_core::fixed::FixedConfig;
/// let c = FixedConfig::new(4096).blocks_per_chunk(64).chunk_alignment(4096);
/// assert_eq!(c.chunk_size(), 4096 * 64);
/// assert_eq!(c.alignment(), 4096);
/// assert_eq!(FixedConfig::default().block_size(), 1 << 20);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FixedConfig {
    block_size: u64,
    blocks_per_chunk: u32,
    chunk_align: u64,
    initial_chunks: u32,
}

impl Default for FixedConfig {
    /// RMM's defaults: 1 MiB blocks, 128 blocks per chunk, 256-byte aligned
    /// chunks, nothing taken up front.
    fn default() -> Self {
        FixedConfig::new(FixedConfig::DEFAULT_BLOCK_SIZE)
    }
}

impl FixedConfig {
    /// RMM's default block size: 1 MiB.
    ///
    /// ```
    /// # use memres_core::fixed::FixedConfig;
    /// assert_eq!(FixedConfig::default().block_size(), FixedConfig::DEFAULT_BLOCK_SIZE);
    /// ```
    pub const DEFAULT_BLOCK_SIZE: u64 = 1 << 20;
    /// RMM's default number of blocks per upstream chunk.
    ///
    /// ```
    /// # use memres_core::fixed::FixedConfig;
    /// assert_eq!(FixedConfig::new(256).blocks(), FixedConfig::DEFAULT_BLOCKS_PER_CHUNK);
    /// ```
    pub const DEFAULT_BLOCKS_PER_CHUNK: u32 = 128;
    /// The most blocks per chunk: 2^20. Each block has a 24-byte slot of
    /// host metadata, made when its chunk is taken, so this is 24 MiB per
    /// chunk, 8192 times RMM's default; a count near `u32::MAX` asked the
    /// host for about 100 GB at the first allocation.
    ///
    /// ```
    /// # use memres_core::fixed::FixedConfig;
    /// assert_eq!(FixedConfig::MAX_BLOCKS_PER_CHUNK, 1 << 20);
    /// ```
    pub const MAX_BLOCKS_PER_CHUNK: u32 = 1 << 20;

    /// Blocks of `block_size` bytes (a multiple of 256), 128 to a chunk.
    ///
    /// ```
    /// # use memres_core::fixed::FixedConfig;
    /// assert_eq!(FixedConfig::new(512).blocks(), 128);
    /// ```
    pub const fn new(block_size: u64) -> Self {
        FixedConfig {
            block_size,
            blocks_per_chunk: Self::DEFAULT_BLOCKS_PER_CHUNK,
            chunk_align: DEFAULT_ALIGNMENT,
            initial_chunks: 0,
        }
    }

    crate::config::setters! {
        /// Blocks carved from each upstream chunk (1 to
        /// [`MAX_BLOCKS_PER_CHUNK`](Self::MAX_BLOCKS_PER_CHUNK)).
        ///
        /// ```
        /// # use memres_core::fixed::FixedConfig;
        /// assert_eq!(FixedConfig::new(512).blocks_per_chunk(8).blocks(), 8);
        /// ```
        blocks_per_chunk(n: u32) => blocks_per_chunk;

        /// The alignment asked of upstream for each chunk (a power of two
        /// from 256 to [`Request::MAX_ALIGN`]; 256 by default, as RMM).
        ///
        /// ```
        /// # use memres_core::fixed::FixedConfig;
        /// assert_eq!(FixedConfig::new(8192).chunk_alignment(4096).alignment(), 4096);
        /// ```
        chunk_alignment(align: u64) => chunk_align;

        /// Chunks taken from upstream when the resource is made (RMM takes one).
        ///
        /// ```
        /// # use memres_core::fixed::FixedConfig;
        /// assert_eq!(FixedConfig::new(512).initial_chunks(1).initial(), 1);
        /// ```
        initial_chunks(n: u32) => initial_chunks;
    }

    /// The block size.
    ///
    /// ```
    /// # use memres_core::fixed::FixedConfig;
    /// assert_eq!(FixedConfig::new(768).block_size(), 768);
    /// ```
    pub const fn block_size(&self) -> u64 {
        self.block_size
    }

    /// Blocks per chunk.
    ///
    /// ```
    /// # use memres_core::fixed::FixedConfig;
    /// assert_eq!(FixedConfig::default().blocks(), 128);
    /// ```
    pub const fn blocks(&self) -> u32 {
        self.blocks_per_chunk
    }

    /// Chunks taken up front.
    ///
    /// ```
    /// # use memres_core::fixed::FixedConfig;
    /// assert_eq!(FixedConfig::default().initial(), 0);
    /// ```
    pub const fn initial(&self) -> u32 {
        self.initial_chunks
    }

    /// Bytes of one upstream chunk: block size times blocks per chunk
    /// (saturating; a configuration where it overflows is refused).
    ///
    /// ```
    /// # use memres_core::fixed::FixedConfig;
    /// assert_eq!(FixedConfig::default().chunk_size(), 128 << 20);
    /// ```
    pub const fn chunk_size(&self) -> u64 {
        self.block_size.saturating_mul(self.blocks_per_chunk as u64)
    }

    /// The alignment every block has: the chunk alignment, or the largest
    /// power of two dividing the block size if that is smaller.
    ///
    /// ```
    /// # use memres_core::fixed::FixedConfig;
    /// assert_eq!(FixedConfig::new(768).chunk_alignment(4096).alignment(), 256);
    /// ```
    pub const fn alignment(&self) -> u64 {
        let natural = self.block_size & self.block_size.wrapping_neg();
        if natural != 0 && natural < self.chunk_align {
            natural
        } else {
            self.chunk_align
        }
    }

    /// The alignment asked of upstream for each chunk.
    pub(super) const fn chunk_align(&self) -> u64 {
        self.chunk_align
    }

    pub(crate) fn validate(&self) -> Result<()> {
        if self.block_size == 0 || self.block_size % 256 != 0 || self.block_size > Request::MAX_SIZE {
            return Err(Error::InvalidConfig {
                what: "block size is zero, not a multiple of 256 or too large",
            });
        }
        if self.blocks_per_chunk == 0 || self.blocks_per_chunk > Self::MAX_BLOCKS_PER_CHUNK {
            return Err(Error::InvalidConfig { what: "blocks per chunk is zero, or too large (above 2^20)" });
        }
        if self.block_size.checked_mul(self.blocks_per_chunk as u64).is_none_or(|c| c > Request::MAX_SIZE) {
            return Err(Error::InvalidConfig { what: "chunk size overflows" });
        }
        if !self.chunk_align.is_power_of_two()
            || self.chunk_align < 256
            || self.chunk_align > Request::MAX_ALIGN
        {
            return Err(Error::InvalidConfig { what: "chunk alignment is not a power of two in 256..=2^40" });
        }
        Ok(())
    }
}
