//! Where algorithms keep their metadata: a growable `Vec` (feature `alloc`),
//! or fixed-capacity storage chosen by a const generic, for builds with no
//! allocator at all.
//!
//! Running out of fixed capacity is its own error,
//! [`Error::CapacityExhausted`](crate::Error::CapacityExhausted), never a panic.

use core::ops::{Deref, DerefMut};

/// A list of `T` that may refuse to grow.
///
/// # Safety
///
/// The core indexes the slice of a `Storage` without bounds checks at
/// indices it has pushed (the pool's index does, on its hot path), so an
/// implementation must behave as `Vec<T>` does for these operations:
///
/// - `Default::default()` is empty.
/// - `deref()` and `deref_mut()` view the same elements, the storage's
///   contents, in order; an element keeps the value last written to it
///   (by `try_push` or through `deref_mut`) until it is removed.
/// - The contents change only through `&mut self` calls: `try_push`
///   appends exactly its value when it returns `Ok` and changes nothing
///   when it returns `Err`; `pop` removes the last element (none when
///   empty); `swap_remove` does what `Vec::swap_remove` does. No other call
///   (`deref`, `deref_mut`, `max_len`, `Clone`...) changes the length.
/// - `deref`, `deref_mut` and `try_push` do not panic (`try_push` refuses
///   only with `Err`): the index calls them between the writes of one
///   update, and an update cut short there could leave a link it then
///   follows without a bounds check.
///
/// `max_len` is only a promise about `try_push`: getting it wrong gives
/// wrong errors, never unsoundness.
///
/// A storage that breaks this could make the core read out of bounds, which
/// is why implementing the trait takes `unsafe`:
///
/// ```compile_fail,E0200
/// use memres_core::storage::Storage;
/// // A storage whose `try_push` says `Ok` but stores nothing.
/// #[derive(Default)]
/// struct Lying(Vec<u32>);
/// impl core::ops::Deref for Lying {
///     type Target = [u32];
///     fn deref(&self) -> &[u32] { &self.0 }
/// }
/// impl core::ops::DerefMut for Lying {
///     fn deref_mut(&mut self) -> &mut [u32] { &mut self.0 }
/// }
/// impl Storage<u32> for Lying {
///     fn try_push(&mut self, _: u32) -> Result<(), u32> { Ok(()) }
///     fn pop(&mut self) -> Option<u32> { None }
///     fn swap_remove(&mut self, i: usize) -> u32 { self.0.swap_remove(i) }
///     fn max_len(&self) -> u32 { u32::MAX }
/// }
/// ```
///
/// # Examples
///
/// ```
/// use memres_core::storage::{ArrayStorage, Storage};
/// let mut s: ArrayStorage<u32, 2> = Default::default();
/// assert!(s.try_push(1).is_ok() && s.try_push(2).is_ok());
/// assert_eq!(s.try_push(3), Err(3));
/// assert_eq!(&s[..], &[1, 2]);
/// ```
pub unsafe trait Storage<T>: Deref<Target = [T]> + DerefMut + Default {
    /// Appends `value`, or gives it back if the storage is full.
    fn try_push(&mut self, value: T) -> Result<(), T>;
    /// Removes and returns the last element.
    fn pop(&mut self) -> Option<T>;
    /// Removes element `index`, moving the last element into its place.
    ///
    /// # Panics
    ///
    /// If `index` is out of bounds.
    fn swap_remove(&mut self, index: usize) -> T;
    /// How many elements the storage can ever hold (`u32::MAX` if unbounded).
    fn max_len(&self) -> u32;
}

// SAFETY: `Vec` is the model the contract describes; each method forwards
// to `Vec`'s own.
#[cfg(feature = "alloc")]
unsafe impl<T> Storage<T> for alloc::vec::Vec<T> {
    #[inline]
    fn try_push(&mut self, value: T) -> Result<(), T> {
        // Refused rather than a panic or an abort when the host is out of
        // memory: `push` then has the room, and neither allocates nor panics.
        if self.try_reserve(1).is_err() {
            return Err(value);
        }
        self.push(value);
        Ok(())
    }
    #[inline]
    fn pop(&mut self) -> Option<T> {
        alloc::vec::Vec::pop(self)
    }
    #[inline]
    fn swap_remove(&mut self, index: usize) -> T {
        alloc::vec::Vec::swap_remove(self, index)
    }
    fn max_len(&self) -> u32 {
        u32::MAX
    }
}

// SAFETY: `heapless::Vec` is a `Vec` with a fixed capacity: its `Deref`s view
// its elements, `push` appends or gives the value back when full, and `pop`
// and `swap_remove` are `Vec`'s; each method forwards to its own.
#[cfg(feature = "heapless")]
unsafe impl<T, const N: usize> Storage<T> for heapless::Vec<T, N> {
    #[inline]
    fn try_push(&mut self, value: T) -> Result<(), T> {
        self.push(value)
    }
    #[inline]
    fn pop(&mut self) -> Option<T> {
        heapless::Vec::pop(self)
    }
    #[inline]
    fn swap_remove(&mut self, index: usize) -> T {
        heapless::Vec::swap_remove(self, index)
    }
    fn max_len(&self) -> u32 {
        N.min(u32::MAX as usize) as u32
    }
}

/// Fixed-capacity storage of `N` copyable elements in an array: no allocator,
/// no `unsafe`, no dependency.
///
/// # Examples
///
/// ```
/// use memres_core::storage::{ArrayStorage, Storage};
/// let mut s: ArrayStorage<u8, 4> = Default::default();
/// s.try_push(7).unwrap();
/// assert_eq!(s.pop(), Some(7));
/// assert!(s.is_empty());
/// ```
#[derive(Clone, Copy, Debug)]
pub struct ArrayStorage<T, const N: usize> {
    items: [T; N],
    /// Elements `..len` are live; the rest are `T::default()`.
    len: usize,
}

impl<T: Copy + Default, const N: usize> Default for ArrayStorage<T, N> {
    fn default() -> Self {
        ArrayStorage { items: [T::default(); N], len: 0 }
    }
}

impl<T, const N: usize> Deref for ArrayStorage<T, N> {
    type Target = [T];
    #[inline]
    fn deref(&self) -> &[T] {
        &self.items[..self.len]
    }
}

impl<T, const N: usize> DerefMut for ArrayStorage<T, N> {
    #[inline]
    fn deref_mut(&mut self) -> &mut [T] {
        &mut self.items[..self.len]
    }
}

// SAFETY: both `Deref`s view `items[..len]`; `len` starts at 0 and changes
// only in `try_push` (+1 after writing the new last element, never past `N`:
// it returns `Err` at `N`), `pop` and `swap_remove` (-1, after moving the
// element out). The fields are private, so nothing else writes them.
unsafe impl<T: Copy + Default, const N: usize> Storage<T> for ArrayStorage<T, N> {
    #[inline]
    fn try_push(&mut self, value: T) -> Result<(), T> {
        if self.len == N {
            return Err(value);
        }
        self.items[self.len] = value;
        self.len += 1;
        Ok(())
    }
    #[inline]
    fn pop(&mut self) -> Option<T> {
        if self.len == 0 {
            return None;
        }
        self.len -= 1;
        Some(core::mem::take(&mut self.items[self.len]))
    }
    fn swap_remove(&mut self, index: usize) -> T {
        assert!(index < self.len, "swap_remove index {index} out of bounds {}", self.len);
        let last = self.len - 1;
        self.items.swap(index, last);
        self.len = last;
        core::mem::take(&mut self.items[last])
    }
    fn max_len(&self) -> u32 {
        N.min(u32::MAX as usize) as u32
    }
}

/// The storage the algorithms use unless told otherwise: `Vec` with the
/// `alloc` feature, a 1024-element [`ArrayStorage`] without it.
#[cfg(feature = "alloc")]
pub type DefaultStorage<T> = alloc::vec::Vec<T>;
/// The storage the algorithms use unless told otherwise: `Vec` with the
/// `alloc` feature, a 1024-element [`ArrayStorage`] without it.
#[cfg(not(feature = "alloc"))]
pub type DefaultStorage<T> = ArrayStorage<T, 1024>;

#[cfg(all(test, feature = "heapless", target_pointer_width = "64"))]
mod tests {
    use super::Storage;

    /// A capacity past `u32::MAX` (zero-sized elements cost nothing) is
    /// `u32::MAX`, as for `ArrayStorage`; it was cut to its low 32 bits,
    /// 0 here, and every push was refused as over capacity.
    #[test]
    fn a_heapless_capacity_past_u32_max_saturates() {
        let s: heapless::Vec<(), { 1 << 32 }> = Default::default();
        assert_eq!(Storage::max_len(&s), u32::MAX);
        let s: heapless::Vec<(), { (1 << 32) + 8 }> = Default::default();
        assert_eq!(Storage::max_len(&s), u32::MAX);
    }
}
