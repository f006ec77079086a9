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

/// A failed allocation allocated nothing: memres and RMM log it with a
/// null pointer (`0x0`, `(nil)`), as `Record`'s docs say it is. One with
/// another pointer is a row no writer writes (an `allocate` row mangled),
/// malformed at its line. Before, it was read with its pointer, and the
/// replay skipped the allocation and then, as stray, its free.
#[test]
fn an_allocate_failure_with_a_pointer_is_malformed() {
    for null in ["0x0", "(nil)", "0", "0X00"] {
        let row = format!("0,1,allocate failure,{null},64,0");
        assert_eq!(Record::parse(&row).map(|r| r.pointer), Ok(0), "{row}");
    }
    let what = "an allocate failure with pointer `0x7f00` (a failure's is null)";
    assert_eq!(Record::parse("0,1,allocate failure,0x7f00,64,0"), Err(what.into()));
    let text = format!("{HEADER}\n0,1,allocate failure,0x0,64,0\n0,2,allocate failure,0x7f00,64,0\n");
    match read_all(text.as_bytes()).unwrap_err() {
        ReadError::Malformed { line, what: w } => assert_eq!((line, w.as_str()), (3, what)),
        ReadError::Io(e) => panic!("{e}"),
    }
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
        // Digits past 64 bits are said so, not taken for no number.
        (
            format!("{header}0,1,free,0x10,18446744073709551616,0\n"),
            2,
            "size `18446744073709551616` is past 64 bits (above 18446744073709551615)",
        ),
        (
            format!("{header}0,1,free,0x10000000000000000,1,0\n"),
            2,
            "pointer `0x10000000000000000` is past 64 bits (above 0xffffffffffffffff)",
        ),
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

/// Every writer of the format writes each field (RMM: `%t,%H:%M:%S.%f`,
/// then the stream's handle), so an empty `Thread`, `Time` or `Stream` is
/// a row cut short (a file cut after its last comma), malformed at its
/// line. Before, it was a valid row.
#[test]
fn a_row_with_an_empty_field_is_malformed() {
    for (row, what) in [
        ("0,1,allocate,0x100,256,", "empty Stream field"),
        ("0,1,allocate,0x100,256, ", "empty Stream field"),
        (",1,allocate,0x100,256,0", "empty Thread field"),
        ("0,,allocate,0x100,256,0", "empty Time field"),
        ("0,1,allocate,,256,0", "pointer `` is not a hex number"),
        ("0,1,allocate,0x100,,0", "size `` is not a number"),
        (",,,,,", "empty Thread field"),
    ] {
        assert_eq!(Record::parse(row), Err(what.into()), "{row}");
        let text = format!("{HEADER}\n0,1,free,0x10,1,0\n{row}\n");
        match read_all(text.as_bytes()).unwrap_err() {
            ReadError::Malformed { line, what: w } => assert_eq!((line, w.as_str()), (3, what), "{row}"),
            ReadError::Io(e) => panic!("{e}"),
        }
    }
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
}

/// Bytes that are not UTF-8 are a malformed line naming its line (they were
/// the reader's error, with no line), and the rows before it are read.
#[test]
fn a_line_that_is_not_utf8_names_its_line() {
    let mut seen = vec![];
    let e = read(&b"0,1,allocate,0x10,1,0\n0,1,free,0x10,1,\xff\n0,2,free,0x20,1,0\n"[..], |line, _| {
        seen.push(line);
        Ok(())
    })
    .unwrap_err();
    assert_eq!(e.to_string(), "line 2: not UTF-8 (byte 17 of the line)");
    assert_eq!(seen, [1]);
}

/// A line is read no further than `MAX_LINE` bytes: a file with no line
/// break (a gzip of zeros) is a malformed line, not a string that grows
/// until memory runs out.
#[test]
fn a_line_longer_than_the_longest_row_is_refused_without_reading_its_rest() {
    use std::io::{BufReader, Read};
    /// Counts the bytes taken from it.
    struct Counting<R>(R, std::rc::Rc<core::cell::Cell<u64>>);
    impl<R: Read> Read for Counting<R> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = self.0.read(buf)?;
            self.1.set(self.1.get() + n as u64);
            Ok(n)
        }
    }
    let taken = std::rc::Rc::new(core::cell::Cell::new(0));
    let endless = std::io::repeat(b'0').take(64 << 20);
    let e = read(BufReader::new(Counting(endless, taken.clone())), |_, _| Ok(())).unwrap_err();
    assert_eq!(e.to_string(), format!("line 1: longer than {MAX_LINE} bytes"));
    assert!(taken.get() <= 2 * (MAX_LINE as u64 + 8192), "read {} bytes of one line", taken.get());
    // The line is named where it lies; one of `MAX_LINE` bytes is read
    // whole (as a row it has one field).
    let header = "Thread,Time,Action,Pointer,Size,Stream\n";
    for (length, what) in [
        (MAX_LINE, "expected 6 fields, found 1".to_string()),
        (MAX_LINE + 1, format!("longer than {MAX_LINE} bytes")),
    ] {
        // Followed by a row, or the last line, with no line break.
        for rest in ["\n0,1,free,0x10,1,0\n", ""] {
            let text = format!("{header}{}{rest}", "7".repeat(length));
            match read_all(text.as_bytes()).unwrap_err() {
                ReadError::Malformed { line, what: w } => {
                    assert_eq!((line, &w), (2, &what), "{length} {rest:?}")
                }
                ReadError::Io(e) => panic!("{e}"),
            }
        }
    }
}

/// A line break is not counted in `MAX_LINE`, `\r\n` (a trace saved on
/// Windows) no more than `\n`: a line of `MAX_LINE` bytes and `\r\n` was
/// refused as longer.
#[test]
fn a_crlf_line_break_is_not_counted_in_the_longest_line() {
    let header = "Thread,Time,Action,Pointer,Size,Stream\r\n";
    let row = "0,1,free,0x10,1,0";
    let longest = format!("{row}{}", " ".repeat(MAX_LINE - row.len())); // spaces trimmed
    for rest in ["\r\n0,2,free,0x20,2,0\r\n", "\r\n", ""] {
        let rows = read_all(format!("{header}{longest}{rest}").as_bytes()).unwrap();
        assert_eq!(rows[0].size, 1, "{rest:?}");
    }
    for line_break in ["\r\n", "\n", ""] {
        let e = read_all(format!("{header}{longest} {line_break}").as_bytes()).unwrap_err();
        assert_eq!(e.to_string(), format!("line 2: longer than {MAX_LINE} bytes"), "{line_break:?}");
    }
}

/// A byte-order mark that starts a file (or a file that `cat` joined) is
/// dropped, and a header with spaces before it is a header: line 1 was
/// `unknown action \`Action\``, a data row after a mark an unknown thread.
#[test]
fn a_byte_order_mark_and_spaces_before_a_header_are_skipped() {
    let trace = "\u{feff}Thread,Time,Action,Pointer,Size,Stream\n\
                 0,1,allocate,0x10,256,0\n  \
                 Thread,Time,Action,Pointer,Size,Stream\n\
                 \u{feff}0,2,free,0x10,256,0\n\
                 \u{feff} Thread,Time,Action,Pointer,Size,Stream\n";
    let mut lines = vec![];
    read(trace.as_bytes(), |line, r| {
        lines.push((line, r.action, r.thread.to_string()));
        Ok(())
    })
    .unwrap();
    assert_eq!(lines, [(2, Action::Allocate, "0".into()), (4, Action::Free, "0".into())]);
    // Only a mark at the start of a line goes: one inside a row is its text.
    let e = read_all("0,1,\u{feff}free,0x10,256,0\n".as_bytes()).unwrap_err();
    assert_eq!(e.to_string(), "line 1: unknown action `\u{feff}free`");
}

/// `is_skipped` answers what `read` does with a line, one that starts
/// with a byte-order mark included: it said `false` to a header or a
/// blank line after a mark, which `read` skips.
#[test]
fn is_skipped_answers_as_read_does_after_a_byte_order_mark() {
    for line in [
        format!("\u{feff}{HEADER}"),
        "\u{feff}".into(),
        "\u{feff}  ".into(),
        "\u{feff} Thread , Time,Action,Pointer,Size,Stream".into(),
        format!(" \u{feff}{HEADER}"),
        "\u{feff}0,1,free,0x10,256,0".into(),
        format!("\u{feff}\u{feff}{HEADER}"),
    ] {
        let mut rows = 0;
        let read = read(line.as_bytes(), |_, _| {
            rows += 1;
            Ok(())
        });
        let skipped = read.is_ok() && rows == 0;
        assert_eq!(is_skipped(&line), skipped, "{line:?}");
    }
}

/// A header of other columns, or of these in another order, is a
/// malformed line: its rows would be read by the format's order (with
/// `Size` and `Stream` swapped, every size read as the stream's `0`).
/// Before, any line starting `Thread,` was skipped as a header.
#[test]
fn a_header_of_other_columns_is_malformed() {
    for header in [
        "Thread,Time,Action,Pointer,Stream,Size",
        "Thread,Time,Action,Pointer,Size",
        "Thread,Time,Action,Pointer,Size,Stream,Device",
        "Thread,",
    ] {
        let trace = format!("{header}\n0,1,allocate,0x100,0,256\n");
        let e = read_all(trace.as_bytes()).unwrap_err();
        assert_eq!(e.to_string(), format!("line 1: a header other than `{HEADER}`"), "{header}");
        assert!(!is_skipped(header), "{header}");
    }
    // The header itself, its fields trimmed as a row's are, is skipped.
    for header in [HEADER, " Thread , Time,Action,Pointer,Size,Stream\r"] {
        assert!(is_skipped(header), "{header:?}");
        let rows = read_all(format!("{header}\n0,1,allocate,0x100,256,0\n").as_bytes()).unwrap();
        assert_eq!(rows.iter().map(|r| r.size).collect::<Vec<_>>(), [256], "{header:?}");
    }
}
