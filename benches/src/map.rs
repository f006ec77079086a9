//! `memres replay --map`: at the peak, each segment (what the resource
//! holds from its upstream) as a bar of used and free runs, so that
//! stranded free space shows in a terminal.
//!
//! ```text
//! segment 0x10000000  64.00 MiB  used 40.25 MiB in 12 blocks  free 23.75 MiB, largest 20.00 MiB
//!   [######9####.....................#####1....................#####]
//! ```
//!
//! Each cell of a bar covers an equal share of the segment: `#` all used,
//! `.` all free, `1`..`9` that many tenths used, rounded down (a cell used
//! under a tenth shows `1`, so that no used byte looks free). Live blocks
//! that lie in no segment held (from a leaf not watched, a `vpool` beside
//! a `sim`) are summed up in one line of their own, apart from the bytes
//! held.

use crate::report::human_bytes;
use memres_core::snapshot::SegmentRuns;
use std::fmt::Write as _;

#[cfg(test)]
mod tests;

/// Cells in a bar.
pub const WIDTH: usize = 64;

/// The most segments listed; the rest are summed up in one line.
pub const MAX_SEGMENTS: usize = 40;

/// The bar of one segment: [`WIDTH`] cells (fewer for a segment of fewer
/// bytes).
pub fn bar(seg: &SegmentRuns) -> String {
    let cells = (WIDTH as u64).min(seg.size.max(1));
    let mut used = vec![0u64; cells as usize];
    let cell = |offset: u64| (u128::from(offset) * u128::from(cells) / u128::from(seg.size.max(1))) as u64;
    for r in seg.runs.iter().filter(|r| r.requested.is_some()) {
        let (start, end) = (r.addr - seg.addr, r.addr - seg.addr + r.size);
        for (c, u) in used.iter_mut().enumerate().take(cell(end - 1) as usize + 1).skip(cell(start) as usize)
        {
            // The bytes of cell c are [lo, hi).
            let lo = (u128::from(c as u64) * u128::from(seg.size)).div_ceil(u128::from(cells)) as u64;
            let hi = ((u128::from(c as u64 + 1) * u128::from(seg.size)).div_ceil(u128::from(cells)) as u64)
                .min(seg.size);
            *u += end.min(hi).saturating_sub(start.max(lo));
        }
    }
    let mut out = String::with_capacity(cells as usize);
    for (c, &u) in used.iter().enumerate() {
        let lo = (u128::from(c as u64) * u128::from(seg.size)).div_ceil(u128::from(cells)) as u64;
        let hi = ((u128::from(c as u64 + 1) * u128::from(seg.size)).div_ceil(u128::from(cells)) as u64)
            .min(seg.size);
        let span = (hi - lo).max(1);
        out.push(match u {
            0 => '.',
            u if u >= span => '#',
            u => char::from(b'0' + ((u * 10 / span) as u8).clamp(1, 9)),
        });
    }
    out
}

/// The map of `segments`: a line of figures and a bar each, the largest
/// [`MAX_SEGMENTS`] in address order, then totals; blocks alone
/// ([`SegmentRuns::alone`]) are no segment held and only summed up.
pub fn render(all: &[SegmentRuns]) -> String {
    let (alone, segments): (Vec<&SegmentRuns>, Vec<&SegmentRuns>) = all.iter().partition(|s| s.alone);
    let mut shown: Vec<&SegmentRuns> = segments.clone();
    shown.sort_by_key(|s| std::cmp::Reverse(s.size));
    let hidden: Vec<&SegmentRuns> = shown.split_off(shown.len().min(MAX_SEGMENTS));
    shown.sort_by_key(|s| s.addr);
    let mut out = String::new();
    let (mut held, mut used_all, mut free_all) = (0u64, 0u64, 0u64);
    for s in &segments {
        let used: u64 = s.runs.iter().filter(|r| r.requested.is_some()).map(|r| r.size).sum();
        held += s.size;
        used_all += used;
        free_all += s.size - used;
    }
    for s in &shown {
        let used: u64 = s.runs.iter().filter(|r| r.requested.is_some()).map(|r| r.size).sum();
        let blocks = s.runs.iter().filter(|r| r.requested.is_some()).count();
        let largest = s.runs.iter().filter(|r| r.requested.is_none()).map(|r| r.size).max().unwrap_or(0);
        let _ = writeln!(
            out,
            "segment {:#x}  {}  used {} in {blocks} blocks  free {}, largest {}",
            s.addr,
            human_bytes(s.size),
            human_bytes(used),
            human_bytes(s.size - used),
            human_bytes(largest)
        );
        let _ = writeln!(out, "  [{}]", bar(s));
    }
    if !hidden.is_empty() {
        let bytes: u64 = hidden.iter().map(|s| s.size).sum();
        let _ = writeln!(out, "... and {} smaller segments of {} in all", hidden.len(), human_bytes(bytes));
    }
    if !alone.is_empty() {
        let requested: u64 = alone.iter().flat_map(|s| &s.runs).filter_map(|r| r.requested).sum();
        let bytes: u64 = alone.iter().map(|s| s.size).sum();
        let _ = writeln!(
            out,
            "{} blocks outside watched segments: {} live in {}",
            alone.len(),
            human_bytes(requested),
            human_bytes(bytes)
        );
    }
    let _ = writeln!(
        out,
        "{} segments: held {}, used {}, free {}  (# used, . free, 1-9 tenths used)",
        segments.len(),
        human_bytes(held),
        human_bytes(used_all),
        human_bytes(free_all)
    );
    out
}
