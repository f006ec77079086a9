use crate::host::live;
use memres_core::copy::CopyEngine;
use memres_core::{Result, Stream};

/// The copy engine of host memory: addresses are pointers, copies are
/// `memcpy`, done at once (so they are trivially ordered on any stream).
///
/// Every access is checked: it happens only if its range lies in one live
/// allocation of a [`HostMemory`](crate::HostMemory) (of any instance), and
/// under the lock under which those allocations are freed; any other range
/// is [`Error::NotLive`](memres_core::Error::NotLive) and nothing is touched
/// ([checked access](memres_core::copy#checked-access)). So a container
/// whose block was freed by other code, or whose resource ended, never
/// touches freed memory, and memory from anywhere else (a
/// [`SimDevice`](crate::SimDevice) address, a stack buffer) is refused. The
/// containers pair it only with resources that are
/// [`MemoryOf<HostCopy>`](memres_core::copy::MemoryOf), which `HostMemory`
/// is and `SimDevice` is not. Host copies take one process-wide lock each
/// and so run one at a time.
///
/// # Examples
///
/// ```
/// use memres_core::copy::CopyEngine;
/// use memres_core::{Error, MemoryResource, Request};
/// use memres_sim::{HostCopy, HostMemory};
/// let host = HostMemory::new();
/// let b = host.allocate(Request::new(3)?, &())?;
/// let mut out = [0u8; 3];
/// // SAFETY: `b` is a block of host memory this code holds.
/// unsafe {
///     HostCopy.copy_from_host(b.addr(), b"abc", &())?;
///     HostCopy.copy_to_host(&mut out, b.addr(), &())?;
/// }
/// assert_eq!(&out, b"abc");
/// host.deallocate(b, &())?;
/// // SAFETY: the block was freed: the engine refuses to touch it.
/// let e = unsafe { HostCopy.copy_to_host(&mut out, b.addr(), &()) };
/// assert_eq!(e, Err(Error::NotLive { addr: b.addr(), len: 3 }));
/// # Ok::<(), memres_core::Error>(())
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct HostCopy;

// Why the accesses below are sound, whatever the caller's block has been
// through: each range touched lies in one live `HostMemory` allocation,
// checked under `live`'s lock, which is held until the access is done, and
// `HostMemory` frees an allocation only under that lock, after taking it out
// of the table. Those allocations are initialized (zeroed when made), and
// neither `HostMemory` nor this engine makes Rust references to them; unsafe
// code that does must hold the block, keep it from other code (the rule in
// `HostMemory`'s documentation) and so not pass it here as the other side of
// a host slice. The bytes touched are then covered by no reference: at worst
// they are another holder's data, when other code freed the caller's block.
impl<S: Stream + ?Sized> CopyEngine<S> for HostCopy {
    type Kind = HostCopy;

    unsafe fn copy_from_host(&self, dst: u64, src: &[u8], _: &S) -> Result<()> {
        let live = live();
        live.check(dst, src.len() as u64)?;
        if !src.is_empty() {
            // SAFETY: `dst..dst + src.len()` lies in a live allocation that
            // stays live while `live` is held and that no reference covers,
            // so not `src` either (see above).
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst as *mut u8, src.len()) };
        }
        Ok(())
    }

    unsafe fn copy_to_host(&self, dst: &mut [u8], src: u64, _: &S) -> Result<()> {
        let live = live();
        live.check(src, dst.len() as u64)?;
        if !dst.is_empty() {
            // SAFETY: `src..src + dst.len()` lies in a live, initialized
            // allocation that stays live while `live` is held and that no
            // reference covers, so not the exclusive borrow `dst` either.
            unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst.as_mut_ptr(), dst.len()) };
        }
        Ok(())
    }

    unsafe fn copy(&self, dst: u64, src: u64, len: u64, _: &S) -> Result<()> {
        let live = live();
        live.check(src, len)?;
        live.check(dst, len)?;
        if len > 0 {
            // SAFETY: both ranges lie in live, initialized allocations that
            // stay live while `live` is held (so `len` fits a `usize`) and
            // that no reference covers. They may overlap (a block freed by
            // other code and handed out again to the same caller): `copy` is
            // a `memmove`.
            unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, len as usize) };
        }
        Ok(())
    }

    unsafe fn fill(&self, dst: u64, value: u8, len: u64, _: &S) -> Result<()> {
        let live = live();
        live.check(dst, len)?;
        if len > 0 {
            // SAFETY: the range lies in a live allocation that stays live
            // while `live` is held (so `len` fits a `usize`) and that no
            // reference covers.
            unsafe { std::ptr::write_bytes(dst as *mut u8, value, len as usize) };
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::HostCopy;
    use crate::host::host_test_alone;
    use crate::HostMemory;
    use memres_core::copy::CopyEngine;
    use memres_core::{Error, MemoryResource, Request};

    #[test]
    fn only_live_host_memory_is_touched() {
        // Alone: freed addresses below could be another test's blocks by now
        // (the access then succeeded, writing under that test's `&mut`).
        let _alone = host_test_alone();
        let host = HostMemory::new();
        let b = host.allocate(Request::new(512).unwrap(), &()).unwrap();
        let (a, end) = (b.addr(), b.addr() + 512);
        let not_live = |addr, len| Err(Error::NotLive { addr, len });
        let mut out = [0u8; 8];
        let stack = out.as_mut_ptr() as u64;
        // SAFETY: `b` is held here; the other ranges are refused, untouched.
        unsafe {
            assert_eq!(HostCopy.fill(a, 7, 512, &()), Ok(()));
            assert_eq!(HostCopy.copy(a + 256, a, 8, &()), Ok(()));
            assert_eq!(HostCopy.copy(a + 4, a, 8, &()), Ok(()), "overlapping: a memmove");
            assert_eq!(HostCopy.fill(end - 4, 1, 8, &()), not_live(end - 4, 8), "past the end");
            assert_eq!(HostCopy.copy_from_host(end, b"x", &()), not_live(end, 1));
            assert_eq!(HostCopy.copy(stack, a, 8, &()), not_live(stack, 8), "a stack buffer");
            assert_eq!(HostCopy.copy_to_host(&mut out, 0, &()), not_live(0, 8));
            assert_eq!(HostCopy.copy_to_host(&mut [], 0, &()), Ok(()), "nothing to touch");
            assert_eq!(HostCopy.copy_to_host(&mut out, a + 256, &()), Ok(()));
        }
        assert_eq!(out, [7; 8]);
        host.deallocate(b, &()).unwrap();
        // SAFETY: refused, as above: no other test holds host memory (its
        // allocator may have handed out `a` again, but to no `HostMemory`).
        unsafe {
            assert_eq!(HostCopy.fill(a, 0, 1, &()), not_live(a, 1));
            assert_eq!(HostCopy.copy_to_host(&mut out, a, &()), not_live(a, 8));
        }
        let c = host.allocate(Request::new(300).unwrap(), &()).unwrap();
        drop(host);
        // SAFETY: refused: the resource's drop freed `c`.
        assert_eq!(unsafe { HostCopy.fill(c.addr(), 0, 1, &()) }, not_live(c.addr(), 1));
        // A range past the last address is refused, not wrapped around.
        // SAFETY: refused, as above.
        assert_eq!(unsafe { HostCopy.fill(u64::MAX - 2, 0, 8, &()) }, not_live(u64::MAX - 2, 8));
    }

    /// Copies to and from a block that another thread frees and allocates
    /// again meanwhile each touch live memory or are refused: the check and
    /// the access hold the lock under which memory is freed (under Miri, an
    /// access after the free is undefined behaviour it reports).
    #[test]
    fn copies_racing_frees_touch_only_live_memory() {
        use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
        // Alone: the racing side hands the engine freed addresses.
        let _alone = host_test_alone();
        let host = HostMemory::new();
        let (addr, done) = (AtomicU64::new(0), AtomicBool::new(false));
        let rounds = if cfg!(miri) { 40 } else { 2000 };
        std::thread::scope(|s| {
            s.spawn(|| {
                for _ in 0..rounds {
                    let b = host.allocate(Request::new(64).unwrap(), &()).unwrap();
                    addr.store(b.addr(), Relaxed);
                    std::thread::yield_now();
                    host.deallocate(b, &()).unwrap();
                }
                done.store(true, Relaxed);
            });
            let mut out = [0u8; 64];
            while !done.load(Relaxed) {
                let a = addr.load(Relaxed);
                // SAFETY: `a` is not held here, which the methods ask for;
                // `HostCopy` promises more (its checked access): it touches
                // a range only while it is live, under the lock that its
                // free takes, and no reference covers that memory.
                let results = unsafe {
                    [
                        HostCopy.fill(a, 1, 64, &()),
                        HostCopy.copy_to_host(&mut out, a, &()),
                        HostCopy.copy_from_host(a, &out, &()),
                        HostCopy.copy(a, a, 64, &()),
                    ]
                };
                for r in results {
                    assert!(matches!(r, Ok(()) | Err(Error::NotLive { .. })), "{r:?}");
                }
                std::thread::yield_now();
            }
        });
        assert_eq!(host.live_count(), 0);
    }
}
