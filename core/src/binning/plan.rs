//! Choosing bins from measured request sizes.

use alloc::collections::BTreeMap;
use alloc::vec;
use alloc::vec::Vec;

/// How many request sizes a workload asked for: sizes rounded up to 256
/// bytes (as every resource rounds them), with their counts; a size whose
/// rounding would pass `u64::MAX` counts as `u64::MAX`.
///
/// Zero-byte requests are not recorded: they never reach a bin.
///
/// # Examples
///
/// ```
/// use memres_core::binning::SizeHistogram;
/// let mut h: SizeHistogram = [100, 200, 256, 300, 0].into_iter().collect();
/// h.record_n(4096, 10);
/// assert_eq!(h.iter().collect::<Vec<_>>(), [(256, 3), (512, 1), (4096, 10)]);
/// assert_eq!((h.total(), h.len()), (14, 3));
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SizeHistogram {
    /// Size rounded up to 256 -> number of requests; no zero counts.
    counts: BTreeMap<u64, u64>,
    /// Sum of the counts.
    total: u64,
}

impl SizeHistogram {
    /// An empty histogram.
    ///
    /// ```
    /// # use memres_core::binning::SizeHistogram;
    /// assert!(SizeHistogram::new().is_empty());
    /// ```
    pub fn new() -> Self {
        Self::default()
    }

    /// Records one request of `size` bytes.
    ///
    /// ```
    /// # use memres_core::binning::SizeHistogram;
    /// let mut h = SizeHistogram::new();
    /// h.record(1000);
    /// assert_eq!(h.count(1024), 1);
    /// ```
    pub fn record(&mut self, size: u64) {
        self.record_n(size, 1);
    }

    /// Records `n` requests of `size` bytes.
    ///
    /// ```
    /// # use memres_core::binning::SizeHistogram;
    /// let mut h = SizeHistogram::new();
    /// h.record_n(256, 5);
    /// assert_eq!(h.count(1), 5);
    /// ```
    pub fn record_n(&mut self, size: u64, n: u64) {
        if size == 0 || n == 0 {
            return;
        }
        // Counts saturate: a histogram fed from outside is never a panic.
        let count = self.counts.entry(round256(size)).or_insert(0);
        *count = count.saturating_add(n);
        self.total = self.total.saturating_add(n);
    }

    /// Requests recorded whose size rounds up to the same 256 bytes as `size`.
    ///
    /// ```
    /// # use memres_core::binning::SizeHistogram;
    /// assert_eq!(SizeHistogram::new().count(4096), 0);
    /// ```
    pub fn count(&self, size: u64) -> u64 {
        self.counts.get(&round256(size)).copied().unwrap_or(0)
    }

    /// Number of requests recorded.
    ///
    /// ```
    /// # use memres_core::binning::SizeHistogram;
    /// let h: SizeHistogram = [1, 2, 3].into_iter().collect();
    /// assert_eq!(h.total(), 3);
    /// ```
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Number of distinct (rounded) sizes.
    ///
    /// ```
    /// # use memres_core::binning::SizeHistogram;
    /// let h: SizeHistogram = [1, 2, 300].into_iter().collect();
    /// assert_eq!(h.len(), 2);
    /// ```
    pub fn len(&self) -> usize {
        self.counts.len()
    }

    /// Whether nothing was recorded.
    ///
    /// ```
    /// # use memres_core::binning::SizeHistogram;
    /// assert!(SizeHistogram::new().is_empty());
    /// ```
    pub fn is_empty(&self) -> bool {
        self.counts.is_empty()
    }

    /// The (rounded size, count) pairs, by ascending size.
    ///
    /// ```
    /// # use memres_core::binning::SizeHistogram;
    /// let h: SizeHistogram = [512, 1].into_iter().collect();
    /// assert_eq!(h.iter().next(), Some((256, 1)));
    /// ```
    pub fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.counts.iter().map(|(&s, &n)| (s, n))
    }
}

impl FromIterator<u64> for SizeHistogram {
    fn from_iter<I: IntoIterator<Item = u64>>(sizes: I) -> Self {
        let mut h = SizeHistogram::new();
        h.extend(sizes);
        h
    }
}

impl Extend<u64> for SizeHistogram {
    fn extend<I: IntoIterator<Item = u64>>(&mut self, sizes: I) {
        for s in sizes {
            self.record(s);
        }
    }
}

/// `size` rounded up to 256; `u64::MAX` where that would pass it, so a
/// size is never filed under a smaller one (no bin holds it: the plan's
/// bins are multiples of 256).
fn round256(size: u64) -> u64 {
    size.checked_add(255).map_or(u64::MAX, |s| s & !255)
}

/// How [`BinningResource::from_histogram`](super::BinningResource::from_histogram)
/// picks bins from a [`SizeHistogram`].
///
/// A bin of size `b` serves every request of up to `b` bytes that no smaller
/// bin holds, and pads it to `b`: the *waste* of a set of bins on a
/// histogram is the sum of that padding over the requests the bins serve
/// (beyond the 256-byte rounding every resource does). The plan picks, among
/// the sizes of the histogram up to [`max_bin_size`](Self::max_bin_size):
///
/// 1. the largest bin size `T` (so the most requests go to bins) for which
///    at most [`max_bins`](Self::max_bins) bins, the largest being `T`, each
///    serving at least [`min_share_percent`](Self::min_share_percent) of the
///    requests, keep the waste within
///    [`max_waste_percent`](Self::max_waste_percent) of the bytes those
///    requests ask for;
/// 2. for that `T`, the set of at most `max_bins` bins with the least
///    waste (the fewest bins on a tie).
///
/// Frequent sizes therefore get bins of their own, rare sizes between them
/// ride in the next bin up, and requests above `T` (a sparse tail of large
/// sizes, which would need many bins or much padding) go to the upstream. The
/// choice is exact (dynamic programming over the distinct sizes, the
/// optimal 1-D quantization with weights), in O(max_bins * n²) time for n
/// distinct sizes; histograms of more than 1024 sizes are first coarsened by
/// rounding sizes up to a power-of-two granule until at most 1024 remain.
///
/// # Examples
///
/// ```
/// use memres_core::binning::{BinPlan, SizeHistogram};
/// let mut h = SizeHistogram::new();
/// h.record_n(256, 1000);
/// h.record_n(1024, 1000);
/// h.record_n(768, 10); // rides in the 1024 bin: 2560 bytes of waste
/// h.record_n(1 << 30, 5); // above the largest bin size: upstream
/// assert_eq!(BinPlan::new().choose(&h), [256, 1024]);
/// // 768 is under 1% of the requests: no bin of its own unless allowed.
/// assert_eq!(BinPlan::new().min_share_percent(0).choose(&h), [256, 768, 1024]);
/// // One bin only: a 1024 bin would pad the 256-byte requests fourfold.
/// assert_eq!(BinPlan::new().max_bins(1).choose(&h), [256]);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BinPlan {
    pub(super) max_bins: u32,
    pub(super) max_bin_size: u64,
    pub(super) max_waste_percent: u32,
    pub(super) min_share_percent: u32,
    pub(super) blocks_per_chunk: u32,
}

impl Default for BinPlan {
    fn default() -> Self {
        BinPlan::new()
    }
}

impl BinPlan {
    /// At most 16 bins, none above 1 MiB, waste at most 10% of the bytes
    /// served by bins, each bin serving at least 1% of the requests, 128
    /// blocks per chunk (as RMM's fixed-size resource).
    ///
    /// ```
    /// # use memres_core::binning::BinPlan;
    /// assert_eq!(BinPlan::new(), BinPlan::default());
    /// ```
    pub const fn new() -> Self {
        BinPlan {
            max_bins: 16,
            max_bin_size: 1 << 20,
            max_waste_percent: 10,
            min_share_percent: 1,
            blocks_per_chunk: 128,
        }
    }

    crate::config::setters! {
        /// At most `n` bins.
        ///
        /// ```
        /// # use memres_core::binning::{BinPlan, SizeHistogram};
        /// let h: SizeHistogram = [256, 512].into_iter().collect();
        /// assert!(BinPlan::new().max_bins(0).choose(&h).is_empty());
        /// ```
        max_bins(n: u32) => max_bins;

        /// No bin larger than `bytes`: larger requests always go upstream.
        /// [`from_histogram`](super::BinningResource::from_histogram)
        /// refuses a size whose chunk (of
        /// [`blocks_per_chunk`](Self::blocks_per_chunk) blocks) passes
        /// [`Request::MAX_SIZE`](crate::Request::MAX_SIZE).
        ///
        /// ```
        /// # use memres_core::binning::{BinPlan, SizeHistogram};
        /// let h: SizeHistogram = [256, 8192].into_iter().collect();
        /// assert_eq!(BinPlan::new().max_bin_size(4096).choose(&h), [256]);
        /// ```
        max_bin_size(bytes: u64) => max_bin_size;

        /// Padding allowed, in percent of the bytes asked by the requests that
        /// bins serve.
        ///
        /// ```
        /// # use memres_core::binning::{BinPlan, SizeHistogram};
        /// let h: SizeHistogram = [256, 512].into_iter().collect();
        /// // 256 bytes of padding on 768 asked: 33%.
        /// assert_eq!(BinPlan::new().max_bins(1).max_waste_percent(34).choose(&h), [512]);
        /// assert_eq!(BinPlan::new().max_bins(1).max_waste_percent(33).choose(&h), [256]);
        /// ```
        max_waste_percent(percent: u32) => max_waste_percent;

        /// Every bin serves at least `percent` of the requests of the histogram
        /// (0: no minimum): a bin parks a chunk of blocks, which rare sizes do
        /// not repay.
        ///
        /// ```
        /// # use memres_core::binning::{BinPlan, SizeHistogram};
        /// let mut h = SizeHistogram::new();
        /// h.record_n(256, 990);
        /// h.record_n(8192, 10);
        /// assert_eq!(BinPlan::new().min_share_percent(2).choose(&h), [256]);
        /// assert_eq!(BinPlan::new().min_share_percent(1).choose(&h), [256, 8192]);
        /// ```
        min_share_percent(percent: u32) => min_share_percent;

        /// Blocks per upstream chunk of each bin (at most
        /// [`FixedConfig::MAX_BLOCKS_PER_CHUNK`](crate::fixed::FixedConfig::MAX_BLOCKS_PER_CHUNK)).
        ///
        /// ```
        /// # use memres_core::binning::BinPlan;
        /// assert_eq!(BinPlan::new().blocks_per_chunk(8).blocks(), 8);
        /// ```
        blocks_per_chunk(n: u32) => blocks_per_chunk;
    }

    /// Blocks per upstream chunk of each bin.
    ///
    /// ```
    /// # use memres_core::binning::BinPlan;
    /// assert_eq!(BinPlan::new().blocks(), 128);
    /// ```
    pub const fn blocks(&self) -> u32 {
        self.blocks_per_chunk
    }

    /// Refuses a plan whose bins could not all be made, whatever sizes it
    /// chooses: blocks per chunk 0 or above
    /// [`FixedConfig::MAX_BLOCKS_PER_CHUNK`](crate::fixed::FixedConfig::MAX_BLOCKS_PER_CHUNK),
    /// or a chunk of its largest bin size (`max_bin_size` rounded down to
    /// 256) above [`Request::MAX_SIZE`](crate::Request::MAX_SIZE).
    pub(super) fn validate(&self) -> crate::Result<()> {
        // The largest bin's configuration is the one that can fail; below
        // 256 no bin is chosen, and a 256-byte bin checks the blocks alone.
        let largest = (self.max_bin_size & !255).max(256);
        crate::fixed::FixedConfig::new(largest).blocks_per_chunk(self.blocks_per_chunk).validate()
    }

    /// The bin sizes for `histogram`, ascending (multiples of 256): see the
    /// type's documentation for the rule.
    ///
    /// # Time Complexity
    ///
    /// O(max_bins * n²) for n ≤ 1024 distinct sizes, plus O(n log n) to
    /// coarsen a larger histogram.
    ///
    /// # Examples
    ///
    /// ```
    /// # use memres_core::binning::{BinPlan, SizeHistogram};
    /// let h: SizeHistogram = [300, 300, 300, 2000].into_iter().collect();
    /// assert_eq!(BinPlan::new().choose(&h), [512, 2048]);
    /// assert!(BinPlan::new().choose(&SizeHistogram::new()).is_empty());
    /// ```
    pub fn choose(&self, histogram: &SizeHistogram) -> Vec<u64> {
        let points = coarsened(histogram, self.max_bin_size & !255, MAX_POINTS);
        let n = points.len();
        let k = (self.max_bins as usize).min(n);
        if k == 0 {
            return Vec::new();
        }
        // Prefix sums (1-based): requests and bytes of the i smallest sizes.
        const NONE: u128 = u128::MAX;
        let mut count = vec![0u128; n + 1];
        let mut bytes = vec![0u128; n + 1];
        for (i, &(s, c)) in points.iter().enumerate() {
            // u128 holds any real histogram's sums: the counts of at most
            // `MAX_POINTS` points stay below 2^75; the bytes of extreme
            // counts and sizes saturate rather than panic.
            count[i + 1] = count[i] + c as u128;
            bytes[i + 1] = bytes[i].saturating_add(c as u128 * s as u128);
        }
        // Waste of one bin of size points[j - 1] serving points[i..j], or
        // NONE if it serves too few requests.
        let min_count = histogram.total() as u128 * self.min_share_percent as u128;
        let cost = |i: usize, j: usize| {
            if (count[j] - count[i]).saturating_mul(100) < min_count {
                return NONE;
            }
            (points[j - 1].0 as u128).saturating_mul(count[j] - count[i]).saturating_sub(bytes[j] - bytes[i])
        };
        // best[m][j]: least waste of m bins serving the j smallest sizes, the
        // largest bin being points[j - 1]; from[m][j]: where bin m starts.
        let mut best = vec![vec![NONE; n + 1]; k + 1];
        let mut from = vec![vec![0usize; n + 1]; k + 1];
        for (j, w) in best[1].iter_mut().enumerate().skip(1) {
            *w = cost(0, j);
        }
        for m in 2..=k {
            let (done, rest) = best.split_at_mut(m);
            let (prev, row) = (&done[m - 1], &mut rest[0]);
            for j in m..=n {
                let (mut b, mut at) = (NONE, 0);
                for (i, &p) in prev.iter().enumerate().take(j).skip(m - 1) {
                    let c = cost(i, j);
                    if p != NONE && c != NONE && p.saturating_add(c) < b {
                        (b, at) = (p.saturating_add(c), i);
                    }
                }
                row[j] = b;
                from[m][j] = at;
            }
        }
        // The largest top within the waste budget, then the least waste.
        let budget = |j: usize| bytes[j].saturating_mul(self.max_waste_percent as u128) / 100;
        for j in (1..=n).rev() {
            let least = (1..=k.min(j)).min_by_key(|&m| best[m][j]).filter(|&m| best[m][j] <= budget(j));
            if let Some(m) = least {
                let mut sizes = Vec::with_capacity(m);
                let (mut m, mut j) = (m, j);
                while m > 0 {
                    sizes.push(points[j - 1].0);
                    j = from[m][j];
                    m -= 1;
                }
                sizes.reverse();
                return sizes;
            }
        }
        Vec::new()
    }
}

/// The most distinct sizes the plan optimizes over.
const MAX_POINTS: usize = 1024;

/// The histogram's (size, count) pairs up to `max_size`, merged by rounding
/// sizes up to ever coarser power-of-two granules until at most `max_points`
/// remain. Rounding up keeps every bin able to hold what it serves.
pub(super) fn coarsened(histogram: &SizeHistogram, max_size: u64, max_points: usize) -> Vec<(u64, u64)> {
    let mut points: Vec<(u64, u64)> = histogram.iter().take_while(|&(s, _)| s <= max_size).collect();
    let mut granule = 512u64;
    while points.len() > max_points {
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(points.len() / 2 + 1);
        for &(s, c) in &points {
            // Never above `max_size` (a multiple of 256, at least `s`).
            let s = s.div_ceil(granule).saturating_mul(granule).min(max_size);
            match merged.last_mut() {
                // Counts saturate, as the histogram's do: merged ones
                // may add up past `u64::MAX`.
                Some(last) if last.0 == s => last.1 = last.1.saturating_add(c),
                _ => merged.push((s, c)),
            }
        }
        points = merged;
        granule = granule.saturating_mul(2);
    }
    points
}
