//! jemalloc-style size classes, computed rather than tabled.

/// The size class of a request of `size` bytes: the smallest class that
/// holds it.
///
/// Classes are 256 bytes apart up to 2 KiB (256, 512, ..., 2048), then four
/// per power of two: for `2^k < size <= 2^(k+1)` they are `2^k + j * 2^(k-2)`
/// for `j = 1..=4` (2560, 3072, 3584, 4096, 5120, ...). These are RMM's 117
/// classes up to 256 GiB, continued above it. Rounding wastes at most 25 %
/// of a request above 2 KiB (at most 255 bytes below), and blocks of the same
/// class fit each other's holes exactly when freed. A size above the
/// largest class a `u64` holds (`7 << 61`) gets `u64::MAX`.
///
/// # Examples
///
/// ```
/// use memres_core::arena::size_class;
/// assert_eq!(size_class(1), 256);
/// assert_eq!(size_class(2048), 2048);
/// assert_eq!(size_class(2049), 2560);
/// assert_eq!(size_class(1 << 20), 1 << 20);
/// assert_eq!(size_class((1 << 20) + 1), 1280 << 10);
/// ```
#[inline]
pub const fn size_class(size: u64) -> u64 {
    if size <= 2048 {
        let s = if size == 0 { 1 } else { size };
        return (s + 255) & !255;
    }
    // 2^k < size <= 2^(k+1)
    let k = 63 - (size - 1).leading_zeros();
    let step = 1u64 << (k - 2);
    match size.checked_add(step - 1) {
        Some(up) => up & !(step - 1),
        None => u64::MAX,
    }
}

#[cfg(test)]
mod tests {
    use super::size_class;

    #[test]
    fn classes_match_the_rmm_table_up_to_256_gib() {
        // Walk every class boundary: 117 classes including 256 GiB.
        let mut classes = alloc::vec::Vec::new();
        let mut c = size_class(1);
        while c <= 256 << 30 {
            classes.push(c);
            c = size_class(c + 1);
        }
        assert_eq!(classes.len(), 116, "116 finite classes plus RMM's catch-all");
        assert_eq!(&classes[..12], &[256, 512, 768, 1024, 1280, 1536, 1792, 2048, 2560, 3072, 3584, 4096]);
        assert_eq!(*classes.last().unwrap(), 256 << 30);
        for w in classes.windows(2) {
            assert!(w[1] > w[0] && w[1] - w[0] <= w[0] / 4 + 256);
            assert_eq!(w[1] % 256, 0);
        }
    }

    #[test]
    fn class_holds_the_size_and_is_idempotent() {
        let mut rng = crate::testing::SplitMix64::new(7);
        for _ in 0..crate::testing::steps(10_000) {
            let s = 1 + rng.below(1 << 40);
            let c = size_class(s);
            assert!(c >= s && c % 256 == 0 && size_class(c) == c);
            assert!(c - s <= s / 4 + 255);
        }
        assert_eq!(size_class(1 << 62), 1 << 62);
    }

    #[test]
    fn sizes_past_the_largest_class_get_the_largest_value() {
        assert_eq!(size_class(7 << 61), 7 << 61);
        assert_eq!(size_class((7 << 61) + 1), u64::MAX);
        assert_eq!(size_class(u64::MAX), u64::MAX);
    }
}
