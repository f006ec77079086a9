//! What can go wrong in a stack description, and where.

use alloc::string::String;
use core::fmt;

use super::MAX_DEPTH;

/// What went wrong, and where.
///
/// # Examples
///
/// ```
/// use memres_core::stack::{parse, StackErrorKind};
/// let e = parse("pool(sim").unwrap_err();
/// assert_eq!((e.pos, &e.kind), (8, &StackErrorKind::Expected("`,` or `)`")));
/// assert_eq!(e.to_string(), "at byte 8: expected `,` or `)`");
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StackError {
    /// Byte position in the text.
    pub pos: usize,
    /// What is wrong.
    pub kind: StackErrorKind,
}

/// The kinds of [`StackError`].
///
/// # Examples
///
/// ```
/// use memres_core::stack::StackErrorKind;
/// assert_eq!(StackErrorKind::EmptyName.to_string(), "empty name");
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum StackErrorKind {
    /// The text ended or had another token where this was expected.
    Expected(&'static str),
    /// A `(` with no name before it, or nothing where a value should be.
    EmptyName,
    /// A `)` with no `(` to close.
    UnbalancedParen,
    /// Text after the stack ended.
    TrailingInput,
    /// A size that is not a number with a known suffix, or overflows.
    BadSize(String),
    /// A name no constructor is registered for.
    UnknownName(String),
    /// A key the resource does not take.
    UnknownKey(String),
    /// A key given twice.
    DuplicateKey(String),
    /// A required argument is missing.
    MissingArg(&'static str),
    /// Too many positional arguments.
    ExtraArg,
    /// A resource where a word was expected, or a word where a resource was.
    WrongKind(&'static str),
    /// An argument value the resource does not accept.
    BadValue(String),
    /// The resource could not be made.
    Resource(crate::Error),
    /// An I/O error of a backend (opening a log file...).
    Io(String),
    /// Parentheses nested more than [`MAX_DEPTH`] deep, or calls of a
    /// [`Call`](super::Call) made by hand (`pos`: the call that opens one
    /// too many).
    TooDeep,
}

impl fmt::Display for StackErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StackErrorKind::Expected(what) => write!(f, "expected {what}"),
            StackErrorKind::EmptyName => f.write_str("empty name"),
            StackErrorKind::UnbalancedParen => f.write_str("unbalanced `)`"),
            StackErrorKind::TrailingInput => f.write_str("unexpected text after the stack"),
            StackErrorKind::BadSize(t) => {
                write!(f, "bad size `{t}` (a number with B, K, KiB, KB, M, MiB, MB, G, GiB, GB, T, TiB or TB, any case)")
            }
            StackErrorKind::UnknownName(n) if n == "stream" => {
                write!(
                    f,
                    "unknown resource `stream` (a builder has it once `register_stream_layer` added it)"
                )
            }
            StackErrorKind::UnknownName(n) => write!(f, "unknown resource `{n}`"),
            StackErrorKind::UnknownKey(k) => write!(f, "unknown key `{k}`"),
            StackErrorKind::DuplicateKey(k) => write!(f, "key `{k}` given twice"),
            StackErrorKind::MissingArg(a) => write!(f, "missing argument: {a}"),
            StackErrorKind::ExtraArg => f.write_str("too many positional arguments"),
            StackErrorKind::WrongKind(w) => write!(f, "expected {w}"),
            StackErrorKind::BadValue(v) => write!(f, "bad value: {v}"),
            StackErrorKind::Resource(e) => write!(f, "{e}"),
            StackErrorKind::Io(e) => write!(f, "{e}"),
            StackErrorKind::TooDeep => write!(f, "calls nested more than {MAX_DEPTH} deep"),
        }
    }
}

impl fmt::Display for StackError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "at byte {}: {}", self.pos, self.kind)
    }
}

impl core::error::Error for StackError {}

impl StackError {
    /// An error at `pos`.
    ///
    /// ```
    /// # use memres_core::stack::{StackError, StackErrorKind};
    /// assert_eq!(StackError::new(3, StackErrorKind::ExtraArg).pos, 3);
    /// ```
    pub fn new(pos: usize, kind: StackErrorKind) -> Self {
        StackError { pos, kind }
    }
}
