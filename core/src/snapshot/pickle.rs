//! The few opcodes of Python's pickle (protocol 2) that a snapshot needs:
//! dicts with string keys, lists, tuples, integers of any size, strings
//! and booleans. What `pickle.loads` reads back is plain Python data.

use alloc::vec::Vec;

/// A Python value as the snapshot writes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Py<'a> {
    Int(i128),
    Str(&'a str),
    Bool(bool),
    List(Vec<Py<'a>>),
    Tuple(Vec<Py<'a>>),
    Dict(Vec<(&'a str, Py<'a>)>),
}

/// `value` as a pickle: the protocol header, the value, `STOP`.
pub(crate) fn dumps(value: &Py<'_>) -> Vec<u8> {
    let mut out = alloc::vec![0x80, 2]; // PROTO 2
    write(&mut out, value);
    out.push(b'.'); // STOP
    out
}

/// Items per `MARK ... APPENDS/SETITEMS` batch, as Python's pickler does.
const BATCH: usize = 1000;

fn write(out: &mut Vec<u8>, value: &Py<'_>) {
    match value {
        Py::Int(n) => int(out, *n),
        Py::Str(s) => string(out, s),
        Py::Bool(true) => out.push(0x88),  // NEWTRUE
        Py::Bool(false) => out.push(0x89), // NEWFALSE
        Py::List(items) => {
            out.push(b']'); // EMPTY_LIST
            for batch in items.chunks(BATCH) {
                out.push(b'('); // MARK
                batch.iter().for_each(|v| write(out, v));
                out.push(b'e'); // APPENDS
            }
        }
        Py::Tuple(items) => {
            out.push(b'('); // MARK
            items.iter().for_each(|v| write(out, v));
            out.push(b't'); // TUPLE
        }
        Py::Dict(items) => {
            out.push(b'}'); // EMPTY_DICT
            for batch in items.chunks(BATCH) {
                out.push(b'('); // MARK
                for (k, v) in batch {
                    string(out, k);
                    write(out, v);
                }
                out.push(b'u'); // SETITEMS
            }
        }
    }
}

fn string(out: &mut Vec<u8>, s: &str) {
    out.push(b'X'); // BINUNICODE: 4-byte little-endian length, UTF-8
    out.extend_from_slice(&(s.len() as u32).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn int(out: &mut Vec<u8>, n: i128) {
    if let Ok(small) = i32::try_from(n) {
        out.push(b'J'); // BININT: 4-byte little-endian signed
        out.extend_from_slice(&small.to_le_bytes());
        return;
    }
    // LONG1: a length byte, then the two's complement little-endian bytes,
    // as few as keep the sign.
    let bytes = n.to_le_bytes();
    let mut len = bytes.len();
    while len > 1 {
        let (top, next) = (bytes[len - 1], bytes[len - 2]);
        let redundant = (top == 0 && next & 0x80 == 0) || (top == 0xff && next & 0x80 != 0);
        if !redundant {
            break;
        }
        len -= 1;
    }
    out.push(0x8a);
    out.push(len as u8);
    out.extend_from_slice(&bytes[..len]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_take_the_fewest_bytes_that_keep_the_sign() {
        assert_eq!(dumps(&Py::Int(5)), [0x80, 2, b'J', 5, 0, 0, 0, b'.']);
        // 2^31 needs a fifth byte for its sign; 2^32 - 1 too.
        assert_eq!(dumps(&Py::Int(1 << 31)), [0x80, 2, 0x8a, 5, 0, 0, 0, 0x80, 0, b'.']);
        assert_eq!(dumps(&Py::Int(-(1 << 40))), [0x80, 2, 0x8a, 6, 0, 0, 0, 0, 0, 0xff, b'.']);
    }

    #[test]
    fn a_dict_of_a_list_and_a_string() {
        let v = Py::Dict(alloc::vec![
            ("a", Py::List(alloc::vec![Py::Bool(true), Py::Int(-1)])),
            ("b", Py::Str("é"))
        ]);
        let expected: &[u8] = b"\x80\x02}(X\x01\x00\x00\x00a](\x88J\xff\xff\xff\xffeX\x01\x00\x00\x00bX\x02\x00\x00\x00\xc3\xa9u.";
        assert_eq!(dumps(&v), expected);
    }
}
