use super::*;
use std::io::Write;

/// FNV-1a over (alloc, id, size) of every op, the fingerprint the reference
/// values below were taken with from RMM's harness's generator.
fn fingerprint(ops: &[Op]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for o in ops {
        for x in [o.alloc as u64, o.id as u64, o.size] {
            h ^= x;
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

/// Every id allocated once, in order, then freed once with its size; live
/// bytes never above `cap`; the figures of the workload agree.
fn check_well_formed(w: &Workload, cap: u64) {
    let mut sizes: Vec<Option<u64>> = Vec::new();
    let (mut live, mut peak, mut count, mut peak_count) = (0u64, 0u64, 0u32, 0u32);
    for op in &w.ops {
        assert!(op.stream < w.streams);
        if op.alloc {
            assert_eq!(op.id as usize, sizes.len());
            sizes.push(Some(op.size));
            live += op.size;
            count += 1;
        } else {
            assert_eq!(
                sizes[op.id as usize].take(),
                Some(op.size),
                "id {} freed twice or with another size",
                op.id
            );
            live -= op.size;
            count -= 1;
        }
        assert!(live <= cap);
        peak = peak.max(live);
        peak_count = peak_count.max(count);
    }
    assert!(sizes.iter().all(Option::is_none), "some id never freed");
    assert_eq!(sizes.len(), w.ids as usize);
    assert_eq!((w.peak_live, w.peak_live_count), (peak, peak_count));
}

#[test]
fn generators_match_rmm_harness() {
    // (spec, op count, fingerprint) from RMM's harness's `gen_random`.
    let cases = [
        ("random:100000:1048576:42", 200_000, 0x6cf7_5287_387f_86a3u64),
        ("lograndom:100000:256:16777216:7", 200_000, 0x8075_a091_8333_2e37),
        ("random:20:1000:42", 40, 0xfa59_91c2_4dac_9237),
        ("lograndom:20:256:16777216:7", 40, 0xe31b_7543_fd95_a601),
    ];
    for (spec, count, print) in cases {
        let w = Workload::load(spec).unwrap();
        assert_eq!(w.ops.len(), count, "{spec}");
        assert_eq!(fingerprint(&w.ops), print, "{spec}");
        check_well_formed(&w, LIVE_CAP);
    }
    let w = Workload::load("lograndom:20:256:16777216:7").unwrap();
    assert_eq!((w.ops[0].size, w.ops[1].size), (19312, 5_581_304));
}

#[test]
fn live_cap_turns_allocations_into_frees() {
    // 1 GiB sizes under a 4 GiB cap: the cap binds often.
    let w = generate("capped", 5000, 1, 1 << 30, 1, SizeLaw::Uniform, 4 << 30).unwrap();
    assert_eq!(w.ops.len(), 10_000);
    assert_eq!(fingerprint(&w.ops), 0x2d51_f3ce_68fb_f3ed);
    check_well_formed(&w, 4 << 30);
    assert!(w.peak_live > 3 << 30);
}

#[test]
fn generated_sizes_stay_in_bounds_and_seeds_decide() {
    for seed in 0..20 {
        let u = Workload::load(format!("random:300:5000:{seed}")).unwrap();
        assert_eq!(u.ops.len(), 600);
        assert!(u.ops.iter().all(|o| (1..=5000).contains(&o.size)));
        check_well_formed(&u, LIVE_CAP);
        let l = Workload::load(format!("lograndom:300:300:70000:{seed}")).unwrap();
        assert!(l.ops.iter().all(|o| (300..=70000).contains(&o.size)));
        check_well_formed(&l, LIVE_CAP);
        // Log-uniform: about as many sizes below the geometric mean as above.
        let small = l.ops.iter().filter(|o| o.alloc && o.size < 4583).count();
        assert!((90..=210).contains(&small), "{small} of 300 below the geometric mean");
    }
    let a = Workload::load("random:1000:4096:9").unwrap();
    let b = Workload::load("random:1000:4096:9").unwrap();
    let c = Workload::load("random:1000:4096:10").unwrap();
    assert_eq!(a.ops, b.ops);
    assert_ne!(a.ops, c.ops);
}

#[test]
fn bad_specs_are_refused() {
    for spec in [
        "random:10:0:1",
        "random:10:100",
        "random:10:100:1:2",
        "random:x:100:1",
        "random:-1:100:1",
        "lograndom:10:0:100:1",
        "lograndom:10:200:100:1",
        "random:5000000000:100:1",
    ] {
        let err = Workload::load(spec).unwrap_err();
        assert!(matches!(err, WorkloadError::Spec { .. }), "{spec}: {err}");
        assert!(err.to_string().contains(spec));
    }
    // Digits only, as a trace's numbers and a stack's: `str::parse` takes
    // a leading `+`.
    for (spec, field) in [("random:+5:10:1", "+5"), ("random:5:10:+1", "+1"), ("lograndom:1:+1:10:1", "+1")] {
        let err = Workload::load(spec).map(|w| w.ops.len()).unwrap_err().to_string();
        assert!(err.contains(&format!("`{field}` is not a number (digits only, with no sign)")), "{err}");
    }
    let err = generate("huge", 10, 1, 1 << 40, 1, SizeLaw::Uniform, 1 << 30).unwrap_err();
    assert!(err.to_string().contains("exceeds the live cap"), "{err}");
}

const TRACE: &str = "Thread,Time,Action,Pointer,Size,Stream
0,1,allocate,0x1000,100,0
0,2,allocate,0x2000,300,0x7f01
0,3,free,0x9999,64,0
0,4,free,0x1000,100,0x7f01
0,5,allocate failure,0x0,1000000,0

0,6,allocate,0x1000,50,0
0,7,allocate,0x3000,70,0
0,8,free,0x3000,70,0
0,9,free,0x3000,70,0
";

#[test]
fn trace_decodes_with_stray_frees_skipped_and_live_ids_freed_at_end() {
    let w = parse_trace("t.csv", TRACE.as_bytes()).unwrap();
    let op = |alloc, id, size, stream| Op { size, id, stream, alloc };
    assert_eq!(
        w.ops,
        [
            op(true, 0, 100, 0),
            op(true, 1, 300, 1),
            op(false, 0, 100, 1),
            op(true, 2, 50, 0),
            op(true, 3, 70, 0),
            op(false, 3, 70, 0),
            op(false, 1, 300, 1),
            op(false, 2, 50, 0),
        ]
    );
    assert_eq!((w.ids, w.streams, w.skipped_frees), (4, 2, 2));
    assert_eq!((w.peak_live, w.peak_live_count), (420, 3));
    check_well_formed(&w, u64::MAX);
}

#[test]
fn reused_pointer_replaces_the_live_one() {
    let t = "0,1,allocate,0xa0,10,0\n0,2,allocate,0xa0,20,0\n0,3,free,0xa0,20,0\n";
    let w = parse_trace("t", t.as_bytes()).unwrap();
    check_well_formed(&w, u64::MAX);
    assert_eq!(w.ops[2], Op { size: 20, id: 1, stream: 0, alloc: false });
    assert_eq!(w.ops[3], Op { size: 10, id: 0, stream: 0, alloc: false });
}

#[test]
fn malformed_lines_name_their_line() {
    let cases = [
        ("0,1,allocate,0x10,12\n", 1, "expected 6 fields"),
        (
            "Thread,Time,Action,Pointer,Size,Stream\n0,1,allocate,0x10,12,0\n0,2,allocate,zz,12,0\n",
            3,
            "not a hex",
        ),
        ("0,1,allocate,0x10,12,0\n0,1,allocate,0x20,-5,0\n", 2, "not a number"),
        ("0,1,allocate,0x10,12,0\n\n0,1,resize,0x10,12,0\n", 3, "unknown action `resize`"),
        // Sizes no request can have overflowed the live bytes and the
        // offline placement's rounding.
        ("0,1,allocate,0x10,18446744073709551615,0\n", 1, "above any request"),
    ];
    for (text, line, what) in cases {
        let err = parse_trace("bad.csv", text.as_bytes()).unwrap_err();
        match &err {
            WorkloadError::Malformed { path, line: l, what: w } => {
                assert_eq!((path.as_str(), *l), ("bad.csv", line), "{err}");
                assert!(w.contains(what), "{err}");
            }
            other => panic!("{other}"),
        }
        assert!(err.to_string().starts_with(&format!("bad.csv:{line}: malformed line")), "{err}");
    }
}

#[test]
fn traces_load_plain_and_gzip_and_missing_files_fail() {
    let dir = std::env::temp_dir().join(format!("memres-trace-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let plain = dir.join("t.csv");
    std::fs::write(&plain, TRACE).unwrap();
    // A gzip trace under a name that does not say so: told by its bytes.
    let gz = dir.join("t.data");
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    enc.write_all(TRACE.as_bytes()).unwrap();
    std::fs::write(&gz, enc.finish().unwrap()).unwrap();
    let a = Workload::load(plain.to_str().unwrap()).unwrap();
    let b = Workload::load(gz.to_str().unwrap()).unwrap();
    assert_eq!(a.ops, b.ops);
    assert_eq!(a.ops.len(), 8);
    let missing = dir.join("missing.csv");
    let err = Workload::load(missing.to_str().unwrap()).unwrap_err();
    assert!(matches!(err, WorkloadError::Io { .. }));
    assert!(err.to_string().contains("missing.csv"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `cat a.csv b.csv` and `cat a.csv.gz b.csv.gz`: the second file's header
/// line is skipped, not a malformed line, and every gzip member is read.
#[test]
fn concatenated_traces_read_as_one() {
    let body = TRACE.split_once('\n').unwrap().1;
    let want = parse_trace("one", format!("{TRACE}{body}").as_bytes()).unwrap();
    assert_eq!(want.ops.len(), 16);
    let twice = format!("{TRACE}{TRACE}");
    let plain = parse_trace("cat", twice.as_bytes()).unwrap();
    assert_eq!((plain.ops, plain.skipped_frees), (want.ops.clone(), want.skipped_frees));

    let dir = std::env::temp_dir().join(format!("memres-trace-cat-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let gz = dir.join("t.csv.gz");
    let mut members = Vec::new();
    for _ in 0..2 {
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        enc.write_all(TRACE.as_bytes()).unwrap();
        members.extend(enc.finish().unwrap());
    }
    std::fs::write(&gz, members).unwrap();
    let w = Workload::load(gz.to_str().unwrap()).unwrap();
    assert_eq!((w.ops, w.skipped_frees), (want.ops, want.skipped_frees));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn shipped_traces_decode() {
    let data = concat!(env!("CARGO_MANIFEST_DIR"), "/data/");
    for name in ["resnet_train.csv.gz", "gpt_train.csv.gz", "transformer_train.csv.gz"] {
        let w = Workload::load(format!("{data}{name}")).unwrap();
        check_well_formed(&w, u64::MAX);
        assert_eq!(w.ops.len() as u64 % 2, 0);
        assert!(w.ids > 1000 && w.peak_live > 0);
    }
}

#[test]
fn streams_are_numbered_by_first_use() {
    // The stray free on stream `z` and the failed allocation on `y` use no
    // stream number.
    let t = "0,1,free,0x5,1,z\n0,2,allocate failure,0x0,9,y\n0,3,allocate,0x10,1,b\n0,4,allocate,0x20,1,a\n0,5,free,0x10,1,a\n";
    let w = parse_trace("t", t.as_bytes()).unwrap();
    let streams: Vec<u16> = w.ops.iter().map(|o| o.stream).collect();
    assert_eq!(streams, [0, 1, 1, 1]);
    assert_eq!((w.streams, w.skipped_frees), (2, 1));
}

#[test]
fn too_many_streams_is_an_error() {
    let mut t = String::new();
    for i in 0..70_000u32 {
        t.push_str(&format!("0,{i},allocate,{:#x},256,s{i}\n", 0x1000 + i as u64 * 256));
    }
    let err = parse_trace("many", t.as_bytes()).unwrap_err();
    assert!(matches!(err, WorkloadError::Malformed { line: 65536, .. }), "{err}");
}

/// RMM's `logging_resource_adaptor` as it writes: a thread id, a clock
/// time, stream handles, and a failed allocation with a null pointer in
/// either spelling; the failures are skipped and counted.
#[test]
fn rmm_logs_with_failed_allocations_decode_with_a_count() {
    let t = "Thread,Time,Action,Pointer,Size,Stream\n\
             140245,14:03:21.123456,allocate,0x7f0a00000000,1024,0x0\n\
             140245,14:03:21.123460,allocate failure,0x0,1099511627776,0x0\n\
             140246,14:03:21.123470,allocate failure,(nil),2048,0x7f01\n\
             140245,14:03:21.123480,free,0x7f0a00000000,1024,0x7f01\n";
    let w = parse_trace("rmm.csv", t.as_bytes()).unwrap();
    assert_eq!(w.ops.len(), 2);
    assert_eq!((w.failed_allocations, w.skipped_frees, w.peak_live, w.streams), (2, 0, 1024, 2));
}

#[test]
fn workloads_with_nothing_to_replay_are_refused() {
    let e = Workload::load("random:0:100:1").unwrap_err();
    assert!(matches!(e, WorkloadError::Empty { .. }), "{e}");
    let dir = std::env::temp_dir().join(format!("memres-empty-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("empty.csv");
    std::fs::write(
        &path,
        "Thread,Time,Action,Pointer,Size,Stream\n0,1,free,0x10,5,0\n0,2,allocate failure,0x0,9,0\n",
    )
    .unwrap();
    let e = Workload::load(path.to_str().unwrap()).unwrap_err().to_string();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        e.ends_with("has no operation to replay (1 stray frees and 1 failed allocations skipped)"),
        "{e}"
    );
}

/// A clock past what microseconds in a u64 hold is no time (it overflowed).
#[test]
fn extreme_times_are_read_without_a_panic() {
    assert_eq!(time_us("99999999999999:00:00.0"), None);
    assert_eq!(time_us("1:00:00.5"), Some(3_600_500_000));
}

/// A trace whose live bytes pass u64 (blocks of 2^62 bytes, the largest
/// request) is refused at the allocation that takes them past it, naming
/// its line; up to u64::MAX they are counted. Before, the peak saturated,
/// and `memres offline` printed a peak of 16.00 EiB as if it were one.
#[test]
fn live_bytes_past_u64_are_refused_naming_the_line() {
    let big = memres_core::Request::MAX_SIZE;
    let blocks = |n: u64| -> String {
        (0..n).map(|i| format!("0,{i},allocate,{:#x},{big},0\n", (i + 1) << 20)).collect()
    };
    let e = parse_trace("big", blocks(5).as_bytes()).unwrap_err().to_string();
    assert_eq!(
        e,
        "big:4: malformed line: 18446744073709551616 bytes live at once, past the most a workload counts \
         (2^64 - 1)"
    );
    // Three blocks and one that fills u64 to its last byte: counted.
    let rest = u64::MAX - 3 * big;
    let t = format!("{}0,4,allocate,0x900000,{rest},0\n0,5,free,0x900000,{rest},0\n", blocks(3));
    assert_eq!(parse_trace("full", t.as_bytes()).unwrap().peak_live, u64::MAX);
}

/// A pointer allocated again while live, and a free that states another
/// size, are counted (they went unsaid): the first block stays live to the
/// end, raising the peak, and the free takes its allocation's size.
#[test]
fn pointers_allocated_again_while_live_and_frees_of_another_size_are_counted() {
    let trace = "Thread,Time,Action,Pointer,Size,Stream\n\
                 0,1,allocate,0x100,1000,0\n\
                 0,2,allocate,0x100,2000,0\n\
                 0,3,free,0x100,2000,0\n\
                 0,4,allocate,0x200,512,0\n\
                 0,5,free,0x200,256,0\n";
    let w = parse_trace("t", trace.as_bytes()).unwrap();
    assert_eq!((w.reused_pointers, w.size_mismatches, w.skipped_frees), (1, 1, 0));
    // The figures as before: the first block of 0x100 is freed at the end.
    assert_eq!(w.peak_live, 3000);
    let frees: Vec<(u32, u64)> = w.ops.iter().filter(|op| !op.alloc).map(|op| (op.id, op.size)).collect();
    assert_eq!(frees, [(1, 2000), (2, 512), (0, 1000)]);
    // A well-formed trace counts neither.
    let fine = parse_trace("f", "0,1,allocate,0x100,1000,0\n0,2,free,0x100,1000,0\n".as_bytes()).unwrap();
    assert_eq!((fine.reused_pointers, fine.size_mismatches), (0, 0));
}

/// Zero-byte allocations logged with a null pointer (RMM's answer to a
/// zero-byte request, memres's `Block::EMPTY`; `0x0` or `(nil)`) are empty
/// blocks, each an allocation of its own that a null free of zero bytes
/// frees: several live at once are no pointer allocated again, and their
/// frees no stray frees (they counted as both on a clean trace). A null
/// free of zero bytes with none live is still a stray free.
#[test]
fn zero_byte_allocations_at_the_null_pointer_are_empty_blocks_each_its_own() {
    let trace = "Thread,Time,Action,Pointer,Size,Stream\n\
                 0,1,allocate,0x0,0,s0\n\
                 0,2,allocate,(nil),0,s1\n\
                 0,3,allocate,0x100,1000,s0\n\
                 0,4,free,(nil),0,s0\n\
                 0,5,allocate,0x0,0,s0\n\
                 0,6,free,0x0,0,s1\n\
                 0,7,free,0x0,0,s0\n\
                 0,8,free,0x100,1000,s0\n\
                 0,9,free,0x0,0,s0\n\
                 0,10,allocate,0x0,0,s1\n";
    let w = parse_trace("t", trace.as_bytes()).unwrap();
    check_well_formed(&w, u64::MAX);
    assert_eq!((w.reused_pointers, w.skipped_frees, w.size_mismatches), (0, 1, 0));
    // Every row replayed but the stray free, and the empty block still
    // live at the end freed there, on its allocation's stream.
    assert_eq!(w.ops.len(), 9 + 1);
    assert_eq!((w.ids, w.peak_live, w.peak_live_count), (5, 1000, 3));
    assert_eq!(w.ops.last(), Some(&Op { size: 0, id: 4, stream: 1, alloc: false }));
    assert_eq!(w.times.as_ref().map(Vec::len), Some(w.ops.len()));
}

/// A gzip trace padded with zero bytes (a block device's, a tape's) reads
/// as gzip and Python's `gzip` read it: the padding is no member. Other
/// bytes after the last member (a line break added to the file) are an
/// error that says so: it said "unexpected end of file" or "invalid gzip
/// header", as if the data were cut short or not gzip at all.
#[test]
fn bytes_after_the_last_gzip_member_are_padding_or_a_clear_error() {
    let dir = std::env::temp_dir().join(format!("memres-trace-tail-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    enc.write_all(TRACE.as_bytes()).unwrap();
    let member = enc.finish().unwrap();
    let want = parse_trace("plain", TRACE.as_bytes()).unwrap();
    let load = |tail: &[u8]| {
        let gz = dir.join("t.csv.gz");
        std::fs::write(&gz, [&member[..], tail].concat()).unwrap();
        Workload::load(gz.to_str().unwrap())
    };
    for zeros in [1, 7, 512, 70_000] {
        let w = load(&vec![0; zeros]).unwrap_or_else(|e| panic!("{zeros} zero bytes: {e}"));
        assert_eq!(w.ops, want.ops, "{zeros} zero bytes");
    }
    for tail in [&b"\n"[..], b"\n\n", b"garbage after the data", b"\0\0\n"] {
        let e = load(tail).unwrap_err().to_string();
        assert!(e.contains("after the last gzip member"), "{tail:?}: {e}");
    }
    // A member cut short is still told as such.
    let e = load(&member[..member.len() / 2]).unwrap_err().to_string();
    assert!(!e.contains("after the last gzip member"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// RMM's clock times start again at midnight: a trace that runs past it
/// counts on from the day before (its times went back a day, and the
/// timeline's ticks after midnight read 0.00 s since the first op).
#[test]
fn clock_times_past_midnight_count_on() {
    let trace = "0,23:59:59.900000,allocate,0x100,1000,s\n\
                 0,23:59:59.899000,allocate,0x200,1000,s\n\
                 0,00:00:00.100000,free,0x100,1000,s\n\
                 0,23:59:59.000000,free,0x200,1000,s\n";
    let w = parse_trace("t", trace.as_bytes()).unwrap();
    let day = 86_400_000_000;
    // A row a little out of order stays on its day, on either side of
    // midnight; a clock half a day back is the next day's.
    assert_eq!(w.times, Some(vec![day - 100_000, day - 101_000, day + 100_000, day - 1_000_000]));
    // Microseconds since the epoch are taken as they are.
    let trace = "0,1795342456727905,allocate,0x100,1000,s\n0,1,free,0x100,1000,s\n";
    assert_eq!(parse_trace("t", trace.as_bytes()).unwrap().times, Some(vec![1795342456727905, 1]));
}
