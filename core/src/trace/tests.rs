extern crate std;

use super::*;
use alloc::format;
use alloc::vec;

#[test]
fn reads_what_memres_writes() {
    let trace = "Thread,Time,Action,Pointer,Size,Stream\n\
                 0,1795342502440678,allocate,0x7fed29500000,37632,0\n\
                 0,1795342503172834,free,0x7febcb2daa00,4,0\n\
                 1,1795342503172899,allocate failure,0x0,1099511627776,3\n";
    let rows = read_all(trace.as_bytes()).unwrap();
    assert_eq!(
        rows[0],
        Record {
            thread: "0".into(),
            time: "1795342502440678".into(),
            action: Action::Allocate,
            pointer: 0x7fed29500000,
            size: 37632,
            stream: "0".into()
        }
    );
    assert_eq!(rows[1].action, Action::Free);
    assert_eq!((rows[2].action, rows[2].pointer, rows[2].stream.as_str()), (Action::AllocateFailure, 0, "3"));
    // Every row prints back as it was written.
    for (row, line) in rows.iter().zip(trace.lines().skip(1)) {
        assert_eq!(row.to_string(), line);
    }
}

/// RMM's `logging_resource_adaptor` writes a thread id, a clock time, `%p`
/// pointers (`(nil)` for the null pointer of a failed allocation) and the
/// stream's handle.
#[test]
fn reads_what_rmm_writes() {
    let trace = "Thread,Time,Action,Pointer,Size,Stream\n\
                 140245113054976,14:03:21.123456,allocate,0x7f3a2c000000,1048576,0x55d0c0a0b0c0\n\
                 140245113054976,14:03:21.123501,allocate failure,(nil),1099511627776,0\n\
                 140245113054976,14:03:21.123588,free,0x7f3a2c000000,1048576,0x55d0c0a0b0c0\n";
    let rows = read_all(trace.as_bytes()).unwrap();
    let seen: Vec<_> = rows.iter().map(|r| (r.action, r.pointer, r.size, r.stream.as_str())).collect();
    assert_eq!(
        seen,
        [
            (Action::Allocate, 0x7f3a2c000000, 1 << 20, "0x55d0c0a0b0c0"),
            (Action::AllocateFailure, 0, 1 << 40, "0"),
            (Action::Free, 0x7f3a2c000000, 1 << 20, "0x55d0c0a0b0c0"),
        ]
    );
    assert_eq!((rows[0].thread.as_str(), rows[0].time.as_str()), ("140245113054976", "14:03:21.123456"));
}

#[test]
fn headers_blank_lines_and_spaces_are_skipped() {
    let trace = "Thread,Time,Action,Pointer,Size,Stream\r\n\
                 0,1,allocate, 0X10 ,256 , a\r\n\
                 \n   \n\
                 Thread,Time,Action,Pointer,Size,Stream\n\
                 0,2,free,10,256,a\n";
    let mut lines = vec![];
    read(trace.as_bytes(), |line, r| {
        lines.push((line, r.action, r.pointer, r.size, r.stream.to_string()));
        Ok(())
    })
    .unwrap();
    assert_eq!(
        lines,
        [(2, Action::Allocate, 0x10, 256, "a".into()), (6, Action::Free, 0x10, 256, "a".into())]
    );
}

#[test]
fn malformed_rows_name_their_line() {
    let header = "Thread,Time,Action,Pointer,Size,Stream\n";
    for (text, line, what) in [
        (format!("{header}0,1,free,0x10,1\n"), 2, "expected 6 fields, found 5"),
        (format!("{header}0,1,alloc,0x10,1,0\n"), 2, "unknown action `alloc`"),
        (
            format!("{header}0,1,allocate,0x10,1,0\n0,1,free,0xzz,1,0\n"),
            3,
            "pointer `0xzz` is not a hex number",
        ),
        (format!("{header}0,1,free,nil,1,0\n"), 2, "pointer `nil` is not a hex number"),
        (format!("{header}0,1,free,0x10,-5,0\n"), 2, "size `-5` is not a number"),
        // The format has six fields: a seventh is no column of it.
        (format!("{header}0,1,free,0x10,1,0,extra\n"), 2, "expected 6 fields, found 7"),
        (format!("{header}0,1,free,0x10,1,0,\n"), 2, "expected 6 fields, found 7"),
        // Numbers are digits only: no sign.
        (format!("{header}0,1,free,0x10,+5,0\n"), 2, "size `+5` is not a number"),
        (format!("{header}0,1,free,+10,1,0\n"), 2, "pointer `+10` is not a hex number"),
        (format!("{header}0,1,free,0x+10,1,0\n"), 2, "pointer `0x+10` is not a hex number"),
    ] {
        match read_all(text.as_bytes()).unwrap_err() {
            ReadError::Malformed { line: l, what: w } => assert_eq!((l, w.as_str()), (line, what), "{text}"),
            ReadError::Io(e) => panic!("{e}"),
        }
    }
    // A row the caller refuses is an error at its line too.
    let e = read("0,1,free,0x10,1,0\n".as_bytes(), |_, _| Err("no frees".into())).unwrap_err();
    assert_eq!(e.to_string(), "line 1: no frees");
}

#[test]
fn reader_errors_are_io_errors() {
    struct Broken;
    impl std::io::Read for Broken {
        fn read(&mut self, _: &mut [u8]) -> std::io::Result<usize> {
            Err(std::io::Error::other("disk gone"))
        }
    }
    let e = read_all(std::io::BufReader::new(Broken)).unwrap_err();
    assert!(matches!(&e, ReadError::Io(io) if io.to_string() == "disk gone"), "{e}");
    // Bytes that are not UTF-8 are the reader's error, not a panic.
    assert!(matches!(read_all(&b"0,1,free,0x10,1,\xff\n"[..]), Err(ReadError::Io(_))));
}
