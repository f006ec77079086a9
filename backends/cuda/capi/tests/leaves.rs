//! The C library's stack check: the CUDA leaves' arguments are read as the
//! real leaves read them, without a device.

use memres_core::stack::StackErrorKind;
use memres_cuda::CudaStream;

#[test]
fn the_checking_builder_refuses_what_the_real_one_would() {
    let b = memres::leaves::checking_builder();
    let s = CudaStream::legacy();
    let e = b.build("pool(async(bogus=1))", &s).err().unwrap();
    assert_eq!((e.pos, e.kind), (11, StackErrorKind::UnknownKey("bogus".into())));
    let e = b.build("stats(managed(1))", &s).err().unwrap();
    assert_eq!((e.pos, e.kind), (14, StackErrorKind::ExtraArg));
    let e = b.build("limit(cuda)", &s).err().unwrap();
    assert_eq!(e.kind, StackErrorKind::MissingArg("the limit in bytes"));
    // Sizes the simulated stand-in could never hold are still accepted:
    // only the device knows its memory.
    assert!(b.build("pool(async(initial=64GiB), initial=60GiB, max=1TiB)", &s).is_ok());
    assert!(b
        .build(
            "stats(vmm(reserve=1TiB, release_threshold=64GiB, handle_granules=1, trim_on_commit=false))",
            &s
        )
        .is_ok());
    let e = b.build("stats(vmm(handle_granules=65))", &s).err().unwrap();
    assert_eq!(e.pos, 26);
    let e = b.build("pool(vmm(1GiB))", &s).err().unwrap();
    assert_eq!((e.pos, e.kind), (9, StackErrorKind::ExtraArg));
    // Names whose memory is not the device's are refused where they stand.
    for (text, pos) in [("pool(sim)", 5), ("stats(host)", 6), ("vpool(sim)", 0), ("pool(pinned)", 5)] {
        let e = b.build(text, &s).err().unwrap();
        assert!(
            matches!(&e.kind, StackErrorKind::BadValue(m) if m.contains("hands out device memory")),
            "{e}"
        );
        assert_eq!(e.pos, pos, "{text}");
    }
}
