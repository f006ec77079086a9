//! The leaves of a C caller's stack: the CUDA crate's
//! ([`memres_cuda::stack`]), and refusals of the names whose memory is not
//! the device's.

use memres_core::stack::{log_file, StackBuilder, StackErrorKind};
use memres_core::DynResource;
use memres_cuda::CudaStream;

/// Makes the names that stand for no device memory errors in `builder`:
/// `sim` (a simulated device: made-up addresses), `host` (host memory,
/// which kernels cannot use), `vpool` (a pool over a simulated address
/// space; `vmm` is the device's) and `pinned` (page-locked host memory,
/// which kernels reach only across the bus). Handed to PyTorch or CuPy,
/// their pointers would crash, or crawl through, the first kernel that used
/// them.
///
/// # Examples
///
/// ```
/// use memres::leaves::refuse_host_leaves;
/// use memres_core::stack::StackBuilder;
/// use memres_cuda::CudaStream;
/// let mut b = StackBuilder::<CudaStream>::new();
/// refuse_host_leaves(&mut b);
/// let e = b.build("stats(pool(sim))", &CudaStream::legacy()).err().unwrap();
/// assert_eq!(e.pos, 11);
/// assert!(e.to_string().contains("`sim` is a simulated device"), "{e}");
/// ```
pub fn refuse_host_leaves(builder: &mut StackBuilder<CudaStream>) -> &mut StackBuilder<CudaStream> {
    for (name, what) in [
        ("sim", "a simulated device, whose addresses are made up"),
        ("host", "host memory, which kernels cannot use"),
        ("vpool", "a pool over a simulated address space (`vmm` is the device's)"),
        ("pinned", "page-locked host memory, which kernels reach only across the bus"),
    ] {
        builder.register(name, move |call, _| {
            Err(call.error(StackErrorKind::BadValue(format!(
                "`{name}` is {what}: the C library hands out device memory (async, cuda, managed, vmm)"
            ))))
        });
    }
    builder
}

/// A builder that checks a stack without touching a device: the CUDA
/// leaves check their arguments and stand in as unbacked leaves
/// ([`memres_cuda::stack::register_checking`]), and `log` checks its
/// arguments without opening its file; `sim`, `host`, `vpool` and `pinned`
/// are refused ([`refuse_host_leaves`]).
///
/// # Examples
///
/// ```
/// use memres::leaves::checking_builder;
/// use memres_cuda::CudaStream;
/// let b = checking_builder();
/// assert!(b.build("stats(pool(async, initial=1GiB))", &CudaStream::legacy()).is_ok());
/// assert!(b.build("pool(asink)", &CudaStream::legacy()).is_err());
/// ```
pub fn checking_builder() -> StackBuilder<CudaStream> {
    let mut b = StackBuilder::<CudaStream>::new();
    memres_cuda::stack::register_checking(&mut b);
    refuse_host_leaves(&mut b);
    b.register("log", |call, cx| {
        log_file(call)?.text()?;
        let upstream: DynResource<CudaStream> = cx.upstream(call, 0)?;
        Ok(upstream)
    });
    b
}
