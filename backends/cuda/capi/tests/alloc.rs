//! `memres_alloc` and `memres_free` through their C signatures. Without a
//! GPU they fail cleanly (NULL, a message); with one they serve memory
//! that is written and read back, and refuse bad frees.

mod common;

use common::{free, gpu, stats, try_alloc as alloc};
use memres::{memres_alloc, memres_free};
use memres_cuda::{ops, CudaStream};
use std::ffi::c_void;
use std::ptr::null_mut;

// One test: the device's stack is process-wide and built once.
#[test]
fn alloc_and_free_through_the_c_functions() {
    // Calls that fail the same way with or without a GPU.
    assert!(alloc(0).is_null(), "zero bytes: NULL");
    assert!(alloc(-1).is_null());
    assert!(memres::last_error().contains("negative size"), "{}", memres::last_error());
    // SAFETY: the device is out of range and refused before any use.
    assert!(unsafe { memres_alloc(64, 1 << 20, null_mut()) }.is_null());
    assert!(memres::last_error().contains("out of range"));
    // A size no request can have: refused before the device is set up
    // (`configure` below still finds no device in use).
    assert!(alloc(isize::MAX).is_null());
    assert!(memres::last_error().contains("above Request::MAX_SIZE"), "{}", memres::last_error());
    assert_eq!(stats(), None, "no device was built");
    free(null_mut(), 0); // ignored

    let Some(device) = gpu("alloc_and_free_through_the_c_functions") else {
        assert!(alloc(1 << 20).is_null());
        assert!(memres::last_error().contains("device 0"), "{}", memres::last_error());
        free(0x1000 as *mut c_void, 64);
        assert!(memres::last_error().contains("allocated nothing"), "{}", memres::last_error());
        assert_eq!(stats(), None, "no device was built");
        return;
    };

    assert_eq!(memres::configure("stats(pool(async, per_stream=true, initial=64MiB))"), Ok(()));
    let stream = CudaStream::new(device).unwrap();
    let sizes: Vec<isize> = (0..64).map(|i| 256 + i * 4099).collect();
    let ptrs: Vec<*mut c_void> = sizes.iter().map(|&s| alloc(s)).collect();
    for (i, (&p, &s)) in ptrs.iter().zip(&sizes).enumerate() {
        assert!(!p.is_null(), "{}", memres::last_error());
        assert_eq!(p as usize % 256, 0);
        // SAFETY: `p` is live for `s` bytes until freed below, after the read.
        unsafe { ops::memset_d32(&stream, p as u64, i as u32, s as usize / 4) }.unwrap();
    }
    let s = stats().expect("device 0 was used");
    assert_eq!(s.has_stats, 1);
    assert_eq!(s.count_current, 64);
    assert_eq!(s.bytes_current, sizes.iter().sum::<isize>() as i64);
    assert_eq!(s.live_blocks, 64);
    assert!(s.upstream_current >= 64 << 20, "the initial chunk: {s:?}");
    assert!(s.reserved_current >= s.upstream_current, "{s:?}");
    configure_is_refused_now();

    for (i, (&p, &s)) in ptrs.iter().zip(&sizes).enumerate() {
        let mut host = vec![0u8; s as usize / 4 * 4];
        // SAFETY: `p` is live and `host` as long as the range read.
        unsafe { ops::copy_to_host(&stream, &mut host, p as u64) }.unwrap();
        assert!(host.chunks_exact(4).all(|w| u32::from_ne_bytes(w.try_into().unwrap()) == i as u32));
    }
    memres_core::Stream::synchronize(&stream).unwrap();

    // A wrong size is refused and the block stays live.
    free(ptrs[0], sizes[0] + 1);
    assert!(memres::last_error().contains("allocated with"), "{}", memres::last_error());
    assert_eq!(stats().unwrap().live_blocks, 64);
    for (&p, &s) in ptrs.iter().zip(&sizes) {
        free(p, s);
    }
    let s = stats().unwrap();
    assert_eq!((s.count_current, s.bytes_current, s.live_blocks, s.count_total), (0, 0, 0, 64));
    // Freed twice, or never allocated: refused, nothing changes.
    free(ptrs[3], sizes[3]);
    assert!(memres::last_error().contains("freed already"), "{}", memres::last_error());
    free((ptrs[3] as usize + 256) as *mut c_void, -1);
    assert_eq!(stats().unwrap(), s);

    // Out of memory: NULL and a message, and the device still serves.
    let too_much = 2 * device.total_memory().unwrap() as isize;
    assert!(alloc(too_much).is_null());
    assert!(memres::last_error().contains("out of memory"), "{}", memres::last_error());
    let p = alloc(1000);
    assert!(!p.is_null());
    free(p, -1);

    // Threads allocate and free at once; the figures add up.
    std::thread::scope(|sc| {
        for t in 0..4 {
            sc.spawn(move || {
                for i in 0..500isize {
                    let size = 256 + (i * 37 + t * 11) % 100_000;
                    let p = alloc(size) as usize;
                    assert_ne!(p, 0);
                    free(p as *mut c_void, size);
                }
            });
        }
    });
    let s = stats().unwrap();
    assert_eq!((s.count_current, s.live_blocks, s.count_total), (0, 0, 64 + 1 + 2000));

    // Two streams: a block freed on another stream than its allocation's
    // goes back to its own stream's pool, which waits on the freeing stream
    // (events recorded on and waited by streams known only by handle).
    let (a, b) = (CudaStream::new(device).unwrap(), CudaStream::new(device).unwrap());
    let on = |s: &CudaStream| s.raw().cast::<c_void>();
    // SAFETY: `a` is a valid stream of device 0.
    let p = unsafe { memres_alloc(1 << 20, 0, on(&a)) };
    assert!(!p.is_null(), "{}", memres::last_error());
    // SAFETY: `p` is live for 1 MiB until freed below, after this on `a`.
    unsafe { ops::memset_d32(&a, p as u64, 7, 1 << 18) }.unwrap();
    use memres_core::Stream;
    b.wait(&a.record().unwrap()).unwrap();
    // SAFETY: `b` is valid and ordered after the use of `p` on `a`.
    unsafe { memres_free(p, 1 << 20, 0, on(&b)) };
    assert_eq!(stats().unwrap().live_blocks, 0, "{}", memres::last_error());
    // SAFETY: `a` is valid.
    let q = unsafe { memres_alloc(1 << 20, 0, on(&a)) };
    assert_eq!(q, p, "back in the pool of `a`: {}", memres::last_error());
    // SAFETY: `q` was last used by nothing; `a` is valid.
    unsafe { memres_free(q, 1 << 20, 0, on(&a)) };
    a.synchronize().unwrap();
    b.synchronize().unwrap();
    assert_eq!(stats().unwrap().live_blocks, 0);

    // The default stream is the device's, whatever context the calling
    // thread has current: here none, on a thread that never called CUDA.
    // A block of `a` freed on it is a free on another stream, which records
    // an event on the default stream in device 0's primary context (it
    // failed: "no CUDA context is current for the default stream").
    // SAFETY: `a` is a valid stream of device 0.
    let p = unsafe { memres_alloc(1 << 20, 0, on(&a)) } as usize;
    assert_ne!(p, 0, "{}", memres::last_error());
    a.synchronize().unwrap();
    let a_raw = on(&a) as usize;
    std::thread::spawn(move || {
        // SAFETY: null names device 0's legacy stream; no work uses `p`.
        unsafe { memres_free(p as *mut c_void, 1 << 20, 0, null_mut()) };
        assert_eq!(memres::last_error(), "", "the free on the default stream");
        // SAFETY: as above.
        let q = unsafe { memres_alloc(1 << 20, 0, null_mut()) };
        assert!(!q.is_null(), "{}", memres::last_error());
        // SAFETY: `q` is used by no work; `a` is a valid stream of device 0.
        unsafe { memres_free(q, 1 << 20, 0, a_raw as *mut c_void) };
        assert_eq!(memres::last_error(), "", "the free on `a` of the default stream's block");
    })
    .join()
    .unwrap();
    a.synchronize().unwrap();
    assert_eq!(stats().unwrap().live_blocks, 0);
}

fn configure_is_refused_now() {
    let e = memres::configure("pool(cuda)").unwrap_err();
    assert!(e.contains("in use already"), "{e}");
}
