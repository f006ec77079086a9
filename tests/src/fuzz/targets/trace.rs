//! The fuzz target of the trace reader (`memres_core::trace`), which reads
//! files users hand to `memres replay`: any bytes are read without a panic,
//! to rows or to an error naming a line of the input; the rows read, written
//! back one per line as [`Record`]'s `Display` writes them, read back the
//! same (but for the two kinds of row the format cannot write back: below).

use memres_core::trace::{read, read_all, ReadError, Record, MAX_LINE};

/// Runs one input.
pub fn run_trace(data: &[u8]) {
    let mut rows = Vec::new();
    let got = read(data, |line, r| {
        // A row is read from a line of the input, in order.
        let last = rows.last().map_or(0, |&(l, _)| l);
        assert!(line > last, "rows out of order: line {line} after {last}");
        rows.push((line, r.to_owned()));
        Ok(())
    });
    let lines = data.split(|&b| b == b'\n').count() as u64;
    match got {
        Ok(()) => {}
        Err(ReadError::Malformed { line, what }) => {
            assert!((1..=lines).contains(&line), "line {line} of {lines}: {what}");
            assert!(rows.last().is_none_or(|&(l, _)| l < line), "a row read at or after the line refused");
        }
        Err(ReadError::Io(e)) => panic!("reading bytes in memory failed: {e}"),
    }
    let rows: Vec<Record<String>> = rows.into_iter().map(|(_, r)| r).collect();
    let written: Vec<String> = rows.iter().map(|r| r.to_string()).collect();
    // Two rows the format cannot write back as read. Writing adds `0x` to
    // a pointer read without it: a line read at the longest may be written
    // longer than a reader takes. And a thread whose text starts with a
    // byte-order mark (after another, or after a space) is written at the
    // start of a line, where a reader takes the mark for a file's.
    if written.iter().any(|w| w.len() > MAX_LINE || w.starts_with('\u{feff}')) {
        return;
    }
    let text = written.join("\n");
    match read_all(text.as_bytes()) {
        Ok(again) => assert_eq!(again, rows, "written as\n{text}"),
        Err(e) => panic!("rows written back are not read: {e}\n{text}"),
    }
}
