//! Decoding bytes into operations, with sizes and alignments drawn from the
//! distributions where allocators break: zero, tiny, granule edges, huge,
//! around `Request::MAX_SIZE`, alignments that are not powers of two.

use arbitrary::{Result, Unstructured};
use memres_core::Request;

/// One step of a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Allocate `size` bytes at `align` (possibly an invalid request).
    Allocate {
        /// Requested bytes.
        size: u64,
        /// Requested alignment (possibly not a power of two).
        align: u64,
    },
    /// Free a live block (index taken modulo the live count).
    Free {
        /// Which live block.
        index: usize,
        /// Through `Block::from_addr` (no tag) instead of the block as handed out.
        by_address: bool,
    },
    /// Free a live block with a size other than the one asked for.
    FreeWrongSize {
        /// Which live block.
        index: usize,
        /// Through `Block::from_addr`.
        by_address: bool,
        /// Selects the wrong size.
        delta: u8,
    },
    /// Free a block again (index into the recently freed ones).
    DoubleFree {
        /// Which freed block.
        index: usize,
        /// Through `Block::from_addr`.
        by_address: bool,
    },
    /// Free an address that was never handed out.
    FreeForeign {
        /// 0: inside a live block; 1: any number; 2: in a simulated
        /// device's address space (the offset's bits from 48 pick which,
        /// among the resource's `device_bases`); 3: a 256-aligned number.
        base: u8,
        /// Offset or address.
        offset: u64,
        /// The tag to present (`Block::NO_TAG`: address only).
        tag: u64,
    },
    /// Give free memory back upstream.
    Release,
    /// Make the upstream fail its `n`-th next allocation.
    FailNth {
        /// 1 = the next one.
        n: u64,
    },
    /// Switch the current stream (index taken modulo the stream count).
    Stream {
        /// Which stream.
        which: u8,
    },
    /// The device finishes all work submitted so far.
    Advance,
    /// The host waits for the whole device.
    Synchronize,
    /// Make the `n`-th next stream call (record, wait, synchronize) fail.
    FailStream {
        /// 1 = the next one.
        n: u64,
    },
}

/// Where a size is drawn from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SizeClass {
    /// 0 bytes.
    Zero,
    /// 1 to 512 bytes.
    Tiny,
    /// Up to 64 KiB.
    Small,
    /// Up to 16 MiB.
    Medium,
    /// Up to 1 GiB.
    Large,
    /// A multiple of 256 or of 2 MiB, give or take one.
    Edge,
    /// Near 2^k for any k up to 62.
    Power,
    /// Near `Request::MAX_SIZE` (valid and invalid).
    Huge,
}

impl SizeClass {
    /// Draws a size of this class.
    pub fn draw(self, u: &mut Unstructured<'_>) -> Result<u64> {
        Ok(match self {
            SizeClass::Zero => 0,
            SizeClass::Tiny => u.int_in_range(1..=512)?,
            SizeClass::Small => u.int_in_range(1..=64 << 10)?,
            SizeClass::Medium => u.int_in_range(1..=16 << 20)?,
            SizeClass::Large => u.int_in_range(1..=1 << 30)?,
            SizeClass::Edge => {
                let unit: u64 = if u.arbitrary::<bool>()? { 256 } else { 2 << 20 };
                let k: u64 = u.int_in_range(1..=64)?;
                let wiggle: i8 = u.int_in_range(-1..=1)?;
                (unit * k).wrapping_add_signed(wiggle as i64)
            }
            SizeClass::Power => {
                let k: u32 = u.int_in_range(0..=62)?;
                let wiggle: i8 = u.int_in_range(-1..=1)?;
                (1u64 << k).wrapping_add_signed(wiggle as i64).max(1)
            }
            SizeClass::Huge => {
                let below: u64 = u.int_in_range(0..=1 << 20)?;
                match u.int_in_range(0..=3u8)? {
                    0 => Request::MAX_SIZE - below,
                    1 => Request::MAX_SIZE + 1 + below,
                    2 => u64::MAX - below,
                    _ => (1 << 40) - below,
                }
            }
        })
    }
}

fn draw_size(u: &mut Unstructured<'_>) -> Result<u64> {
    // Weighted towards sizes that fit, so that runs build up state.
    let w: u8 = u.arbitrary()?;
    let class = match w {
        0..=9 => SizeClass::Zero,
        10..=79 => SizeClass::Tiny,
        80..=139 => SizeClass::Small,
        140..=179 => SizeClass::Medium,
        180..=199 => SizeClass::Large,
        200..=229 => SizeClass::Edge,
        230..=245 => SizeClass::Power,
        _ => SizeClass::Huge,
    };
    class.draw(u)
}

fn draw_align(u: &mut Unstructured<'_>) -> Result<u64> {
    let w: u8 = u.arbitrary()?;
    Ok(match w {
        0..=149 => 256,
        150..=179 => 1 << u.int_in_range(0..=8u32)?,
        180..=219 => 1 << u.int_in_range(9..=20u32)?,
        220..=234 => 1 << u.int_in_range(21..=41u32)?,
        235..=244 => *u.choose(&[0, 3, 384, 1000, 4097, 3 << 20])?,
        245..=250 => u64::MAX - u.int_in_range(0..=3)?,
        _ => u.arbitrary()?,
    })
}

impl Op {
    /// Decodes one operation.
    ///
    /// # Errors
    ///
    /// When the input is exhausted mid-operation.
    pub fn decode(u: &mut Unstructured<'_>) -> Result<Op> {
        Op::decode_for(u, 0)
    }

    /// Decodes one operation for a resource on `streams` streams: with
    /// streams, a quarter of the operation bytes are stream operations.
    ///
    /// # Errors
    ///
    /// When the input is exhausted mid-operation.
    pub fn decode_for(u: &mut Unstructured<'_>, streams: u8) -> Result<Op> {
        let kind: u8 = u.arbitrary()?;
        if streams > 0 && kind >= 192 {
            return Ok(match kind % 8 {
                0..=3 => Op::Stream { which: u.int_in_range(0..=streams - 1)? },
                4 | 5 => Op::Advance,
                6 => Op::Synchronize,
                _ => Op::FailStream { n: u.int_in_range(1..=4)? },
            });
        }
        Ok(match kind % 16 {
            0..=6 => Op::Allocate { size: draw_size(u)?, align: draw_align(u)? },
            7..=9 => Op::Free { index: u.arbitrary::<u16>()? as usize, by_address: false },
            10 => Op::Free { index: u.arbitrary::<u16>()? as usize, by_address: true },
            11 => Op::FreeWrongSize {
                index: u.arbitrary::<u16>()? as usize,
                by_address: u.arbitrary()?,
                delta: u.arbitrary()?,
            },
            12 => Op::DoubleFree { index: u.arbitrary::<u8>()? as usize, by_address: u.arbitrary()? },
            13 => {
                let base = u.int_in_range(0..=3)?;
                let offset = u.arbitrary()?;
                let tag = if u.arbitrary()? { memres_core::Block::NO_TAG } else { u.arbitrary()? };
                Op::FreeForeign { base, offset, tag }
            }
            14 => Op::Release,
            _ => Op::FailNth { n: u.int_in_range(1..=4)? },
        })
    }
}
