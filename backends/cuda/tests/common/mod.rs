//! What every GPU test needs: a device or a clear "skipped", and the means
//! to write and read memory.
#![allow(dead_code, unreachable_pub)]

use memres_core::copy::MemoryOf;
use memres_core::{Block, MemoryResource, MemoryResourceMut, Request, Result, Stream};
use memres_cuda::{ops, CudaStream, Device};
use std::ffi::c_void;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// Set this variable (to anything but `0`) on a machine with a GPU: a test
/// that finds no device then fails instead of skipping. A number `N` says
/// the machine has `N` devices: a test that needs up to `N` and finds
/// fewer fails too; one that needs more than the number (or than one,
/// for another value) still skips.
pub const REQUIRE_GPU: &str = "MEMRES_REQUIRE_GPU";

/// Device 0, or `None` after printing why the test is skipped. A skipped
/// test passes without having tested anything; the message says so.
pub fn gpu(test: &str) -> Option<Device> {
    gpus(test, 1).map(|mut v| v.remove(0))
}

/// The first `n` devices, or `None` after printing why the test is skipped.
pub fn gpus(test: &str, n: u32) -> Option<Vec<Device>> {
    // Whether the machine has no usable GPU at all (as opposed to too few).
    let (reason, no_gpu) = match memres_cuda::init() {
        Err(e) => (format!("the CUDA driver did not initialize ({e})"), true),
        Ok(()) => match Device::count() {
            Err(e) => (format!("no device count ({e})"), true),
            Ok(c) if c < n => (format!("{n} CUDA device(s) needed, {c} found"), c == 0),
            Ok(_) => return Some((0..n).map(|i| Device::get(i).expect("listed device")).collect()),
        },
    };
    let required = std::env::var(REQUIRE_GPU)
        .ok()
        .filter(|v| !v.is_empty() && v != "0")
        .map_or(0, |v| v.parse::<u32>().unwrap_or(1));
    assert!(
        !(required >= n || (required > 0 && no_gpu)),
        "{test}: {reason}, and {REQUIRE_GPU} is {required}"
    );
    eprintln!("SKIPPED {test}: {reason}; nothing was tested");
    None
}

/// The words a test writes into block number `i`.
pub fn pattern(i: u64) -> u32 {
    0x9E37_79B9u32.wrapping_mul(i as u32 + 1) ^ 0x5A5A_0000
}

/// Fills `block` (device-accessible memory) with `value` on `stream`.
pub fn fill(stream: &CudaStream, block: &Block, value: u32) {
    // SAFETY: the block is live until the caller frees it, which tests do
    // only after reading it back (a stream synchronization).
    unsafe { ops::memset_d32(stream, block.addr(), value, (block.size() / 4) as usize) }.expect("memset");
}

/// Reads `block` back after the work on `stream` and checks every word is `value`.
pub fn expect_filled(stream: &CudaStream, block: &Block, value: u32) {
    let mut host = vec![0u8; (block.size() / 4 * 4) as usize];
    // SAFETY: the block is live and `host` is as long as the range read.
    unsafe { ops::copy_to_host(stream, &mut host, block.addr()) }.expect("copy to host");
    for (k, w) in host.chunks_exact(4).enumerate() {
        let got = u32::from_ne_bytes(w.try_into().unwrap());
        assert_eq!(got, value, "word {k} of block at {:#x}", block.addr());
    }
}

/// A host function queued on a stream that holds the stream until
/// [`Gate::open`] (or, as a guard against a hung test, ten seconds).
pub struct Gate {
    inner: Arc<(Mutex<bool>, Condvar)>,
}

unsafe extern "C" fn wait_for_gate(data: *mut c_void) {
    // SAFETY: `data` is the `Arc` raw pointer given to `cuLaunchHostFunc` by
    // `Gate::block`; this call owns that reference and drops it.
    let inner = unsafe { Arc::from_raw(data as *const (Mutex<bool>, Condvar)) };
    let (lock, cv) = &*inner;
    let guard = lock.lock().unwrap_or_else(|p| p.into_inner());
    let _ = cv.wait_timeout_while(guard, Duration::from_secs(10), |open| !*open);
}

impl Gate {
    /// Queues a closed gate on `stream`: work queued after it waits.
    pub fn block(stream: &CudaStream) -> Gate {
        let inner = Arc::new((Mutex::new(false), Condvar::new()));
        let data = Arc::into_raw(inner.clone()) as *mut c_void;
        // SAFETY: the function only waits on the condition variable (no CUDA
        // call, as host functions must not make); it takes over the
        // reference counted in `data`.
        let rc = unsafe { memres_cuda::sys::cuLaunchHostFunc(stream.raw(), Some(wait_for_gate), data) };
        if rc != 0 {
            // SAFETY: the driver refused the function: the reference is ours again.
            drop(unsafe { Arc::from_raw(data as *const (Mutex<bool>, Condvar)) });
            panic!("cuLaunchHostFunc failed: {}", memres_cuda::error_name(rc));
        }
        Gate { inner }
    }

    /// Lets the stream go on.
    pub fn open(&self) {
        let (lock, cv) = &*self.inner;
        *lock.lock().unwrap_or_else(|p| p.into_inner()) = true;
        cv.notify_all();
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        self.open();
    }
}

/// A resource owned, to go under [`Shared`](memres_core::Shared), whose
/// `with` can then replace it (and so end it) under the blocks it handed out.
pub struct Owned<R>(pub R);

impl<S: Stream + ?Sized, R: MemoryResource<S>> MemoryResourceMut<S> for Owned<R> {
    fn allocate(&mut self, request: Request, stream: &S) -> Result<Block> {
        self.0.allocate(request, stream)
    }

    fn deallocate(&mut self, block: Block, stream: &S) -> Result<()> {
        self.0.deallocate(block, stream)
    }
}

// SAFETY: `Owned` hands out `R`'s blocks unchanged and gives them back only
// through `R::deallocate`; replacing `R` ends it, as `MemoryOf` allows.
unsafe impl<E, R: MemoryOf<E>> MemoryOf<E> for Owned<R> {}
