//! Cost of the containers over CUDA memory: `DeviceUVector<f32>` grown by
//! doubling from 1 to 2^24 elements, and a 1 MiB `DeviceUVector<u8>` made
//! and dropped 10^5 times, over a coalescing pool over `CudaAsyncMemory`
//! and over `CudaAsyncMemory` alone, all on one non-blocking stream.
//!
//! Both workloads write nothing they do not read, as RMM's containers:
//! they use the `unsafe` uninitialized constructor and growth
//! (`new_uninit`, `resize_uninit`), not the zero-filling `new` and `resize`.
//!
//! Each pass ends with a stream synchronization, so the copies of the
//! growth are inside its time. The figure is the median pass of several
//! (PASSES for the churn, ten times as many of the short growth; the first
//! pass, which fills the pools, is not timed).
//!
//! ```text
//! cargo run --release -p memres-cuda --example containers_bench [-- PASSES (default 7)]
//! ```

use memres_containers::DeviceUVector;
use memres_core::copy::MemoryOf;
use memres_core::pool::CoalescingPool;
use memres_core::Inspect;
use memres_core::{MemoryResource, Shared, Stream};
use memres_cuda::{CudaAsyncMemory, CudaCopy, CudaStream, Device, StreamOptions};
use std::time::Instant;

/// Doublings of the growth workload: 1 to 2^24 elements.
const DOUBLINGS: u32 = 24;
/// Vectors made and dropped per pass of the churn workload.
const CHURN: u32 = 100_000;
/// Bytes of each vector of the churn workload.
const CHURN_BYTES: usize = 1 << 20;

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Runs `pass` once untimed, then `passes` times; returns the median
/// nanoseconds per operation (`ops` operations per pass).
fn time(passes: usize, ops: u32, stream: &CudaStream, mut pass: impl FnMut()) -> f64 {
    pass();
    stream.synchronize().unwrap();
    let runs = (0..passes)
        .map(|_| {
            let start = Instant::now();
            pass();
            stream.synchronize().unwrap();
            start.elapsed().as_nanos() as f64 / f64::from(ops)
        })
        .collect();
    median(runs)
}

/// Grows a vector by doubling, keeping its elements: `DOUBLINGS` resizes.
fn grow<R>(stream: &'static CudaStream, mr: R, engine: &CudaCopy)
where
    R: MemoryResource<&'static CudaStream> + MemoryOf<CudaCopy>,
{
    let mut v = DeviceUVector::<f32, _, _, _>::from_slice_in(&[1.0], stream, mr, engine).unwrap();
    for d in 1..=DOUBLINGS {
        // SAFETY: the new elements are never read, nor the vector cloned.
        unsafe { v.resize_uninit(1 << d) }.unwrap();
    }
    assert_eq!(v.len(), 1 << DOUBLINGS);
}

/// Makes and drops `CHURN` vectors of `CHURN_BYTES`.
fn churn<R>(stream: &'static CudaStream, mr: R, engine: &CudaCopy)
where
    R: MemoryResource<&'static CudaStream> + MemoryOf<CudaCopy> + Copy,
{
    for _ in 0..CHURN {
        // SAFETY: the elements are never read, nor the vector cloned.
        let v =
            unsafe { DeviceUVector::<u8, _, _, _>::new_uninit_in(CHURN_BYTES, stream, mr, engine) }.unwrap();
        std::hint::black_box(v.addr());
    }
}

fn main() {
    // A first argument that is not a number (a test runner's flag) leaves the default.
    let passes: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).filter(|&n| n > 0).unwrap_or(7);
    let device = match Device::get(0) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("containers_bench: no CUDA device ({e}); nothing was measured");
            std::process::exit(2);
        }
    };
    // One stream for the whole run: leaked so that the containers can borrow it for 'static.
    let stream: &'static CudaStream = Box::leak(Box::new(
        CudaStream::with_options(device, StreamOptions { non_blocking: true, priority: 0 }).unwrap(),
    ));
    let engine = CudaCopy::new(device).unwrap();
    let pool = Shared::new(CoalescingPool::new(CudaAsyncMemory::new(device).unwrap()));
    let plain = CudaAsyncMemory::new(device).unwrap();

    println!("# memres containers on {} ({passes} timed passes, median)", device.name().unwrap_or_default());
    println!("# RMM's benchmark harness has no container benchmarks: no RMM figure to set beside these.");
    println!("{:<44} {:>28} {:>14}", "workload", "resource", "ns/op");
    let grow_label = format!("uvector<f32> resize x2, 1 -> 2^{DOUBLINGS} elems");
    let churn_label = format!("uvector<u8> {} MiB new+drop x{CHURN}", CHURN_BYTES >> 20);
    let rows = [
        (
            &grow_label,
            "memres pool over async",
            time(10 * passes, DOUBLINGS, stream, || grow(stream, &pool, &engine)),
        ),
        (
            &grow_label,
            "CudaAsyncMemory",
            time(10 * passes, DOUBLINGS, stream, || grow(stream, &plain, &engine)),
        ),
        (
            &churn_label,
            "memres pool over async",
            time(passes, CHURN, stream, || churn(stream, &pool, &engine)),
        ),
        (&churn_label, "CudaAsyncMemory", time(passes, CHURN, stream, || churn(stream, &plain, &engine))),
    ];
    for (workload, resource, ns) in rows {
        println!("{workload:<44} {resource:>28} {ns:>14.1}");
    }
    pool.with(|p| {
        p.check().unwrap();
        assert_eq!(p.usage().used, 0);
        p.release(stream).unwrap();
    });
    stream.synchronize().unwrap();
}
