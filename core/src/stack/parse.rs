//! The parser: text to a tree of [`Call`]s, and typed reads of their
//! arguments.

use super::{StackError, StackErrorKind};
use alloc::string::{String, ToString};
use alloc::vec::Vec;

/// A resource in a stack description: `name(args...)`.
///
/// # Examples
///
/// ```
/// let call = memres_core::stack::parse("pool(sim, max=4GiB)")?;
/// assert_eq!((call.name.as_str(), call.pos, call.args.len()), ("pool", 0, 2));
/// # Ok::<(), memres_core::stack::StackError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Call {
    /// The resource's name.
    pub name: String,
    /// Byte position of the name in the text.
    pub pos: usize,
    /// The arguments in order.
    pub args: Vec<Arg>,
}

/// One argument: positional (`key` is `None`) or `key=value`.
///
/// # Examples
///
/// ```
/// let call = memres_core::stack::parse("pool(sim, max=4GiB)")?;
/// assert_eq!(call.args[1].key.as_deref(), Some("max"));
/// assert_eq!(call.args[1].key_pos, 10);
/// # Ok::<(), memres_core::stack::StackError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Arg {
    /// The key of a `key=value` argument.
    pub key: Option<String>,
    /// Byte position of the key (of the value, for a positional argument).
    pub key_pos: usize,
    /// The value.
    pub value: Value,
}

/// An argument's value: a nested resource or a word.
///
/// # Examples
///
/// ```
/// use memres_core::stack::{parse, Value};
/// let call = parse("limit(sim, 2GiB)")?;
/// assert!(matches!(call.args[0].value, Value::Call(_)));
/// assert_eq!(call.args[1].value, Value::Word { text: "2GiB".into(), pos: 11 });
/// # Ok::<(), memres_core::stack::StackError>(())
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value {
    /// A resource (a bare name is a call with no arguments).
    Call(Call),
    /// Any other word: a size, a path, a number.
    Word {
        /// The text.
        text: String,
        /// Its byte position.
        pos: usize,
    },
}

/// The most calls nested inside each other's parentheses: the parser (and
/// every walk of the tree, and the build) recurses once per level, so an
/// unbounded depth would overflow the stack; real stacks are a handful
/// deep. [`parse`] refuses deeper text, and a
/// [`StackBuilder`](super::StackBuilder) a deeper [`Call`] made by hand,
/// before it builds anything. The core's layers make their resources out
/// of the build's recursion: a stack of this depth, pools and arenas
/// included, builds and serves on a thread stack of 256 KiB (debug builds
/// need some 96 KiB of it; tested as
/// `a_stack_of_max_depth_layers_builds_and_serves_on_a_small_thread_stack`).
/// A constructor registered by others that recurses with a large resource
/// in its frame takes that much for every level under it.
pub const MAX_DEPTH: usize = 64;

/// Parses a stack description.
///
/// # Errors
///
/// A [`StackError`] naming the byte position of the first problem:
/// unbalanced parentheses, an empty name, a missing `,` or `)`, a misplaced
/// `=`, text after the end, calls nested more than [`MAX_DEPTH`] deep.
///
/// ```
/// use memres_core::stack::{parse, StackErrorKind};
/// assert!(parse("stats(pool(sim))").is_ok());
/// assert_eq!(parse("stats(pool(sim)))").unwrap_err().kind, StackErrorKind::UnbalancedParen);
/// assert_eq!(parse("(sim)").unwrap_err().kind, StackErrorKind::EmptyName);
/// ```
pub fn parse(text: &str) -> Result<Call, StackError> {
    let mut p = Parser { text: text.as_bytes(), src: text, at: 0, depth: 0 };
    let value = p.value()?;
    p.skip_ws();
    if p.at < p.text.len() {
        let kind = if p.text[p.at] == b')' {
            StackErrorKind::UnbalancedParen
        } else {
            StackErrorKind::TrailingInput
        };
        return Err(StackError::new(p.at, kind));
    }
    match value {
        Value::Call(c) => Ok(c),
        Value::Word { pos, .. } => Err(StackError::new(pos, StackErrorKind::WrongKind("a resource name"))),
    }
}

struct Parser<'a> {
    text: &'a [u8],
    src: &'a str,
    /// Next byte to read.
    at: usize,
    /// Calls whose `(` is open.
    depth: usize,
}

/// Whether `c` may be in a word: white space (Unicode's, a no-break space
/// too, as `str::trim` takes it) and the delimiters may not.
fn is_word_char(c: char) -> bool {
    !matches!(c, ',' | '(' | ')' | '=') && !c.is_whitespace()
}

fn is_name(s: &str) -> bool {
    let mut bytes = s.bytes();
    bytes.next().is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

impl<'a> Parser<'a> {
    /// The char at `at`, a char boundary: `at` moves over whole chars, or
    /// one byte past an ASCII delimiter that `peek` saw.
    fn char_at(&self) -> Option<char> {
        self.src[self.at..].chars().next()
    }

    fn skip_ws(&mut self) {
        while let Some(c) = self.char_at().filter(|c| c.is_whitespace()) {
            self.at += c.len_utf8();
        }
    }

    fn peek(&mut self) -> Option<u8> {
        self.skip_ws();
        self.text.get(self.at).copied()
    }

    /// A word, possibly empty; `at` is left after it.
    fn word(&mut self) -> (usize, &'a str) {
        self.skip_ws();
        let start = self.at;
        while let Some(c) = self.char_at().filter(|&c| is_word_char(c)) {
            self.at += c.len_utf8();
        }
        (start, &self.src[start..self.at])
    }

    fn value(&mut self) -> Result<Value, StackError> {
        let (pos, word) = self.word();
        let word = word.to_string();
        match self.peek() {
            Some(b'(') => {
                if word.is_empty() {
                    return Err(StackError::new(self.at, StackErrorKind::EmptyName));
                }
                if !is_name(&word) {
                    return Err(StackError::new(pos, StackErrorKind::Expected("a resource name before `(`")));
                }
                if self.depth == MAX_DEPTH {
                    return Err(StackError::new(pos, StackErrorKind::TooDeep));
                }
                self.at += 1;
                self.depth += 1;
                let args = self.args()?;
                self.depth -= 1;
                Ok(Value::Call(Call { name: word, pos, args }))
            }
            _ if word.is_empty() => Err(StackError::new(self.at, StackErrorKind::EmptyName)),
            _ if is_name(&word) => Ok(Value::Call(Call { name: word, pos, args: Vec::new() })),
            _ => Ok(Value::Word { text: word, pos }),
        }
    }

    /// The arguments after `(`, up to and including `)`.
    fn args(&mut self) -> Result<Vec<Arg>, StackError> {
        let mut args = Vec::new();
        if self.peek() == Some(b')') {
            self.at += 1;
            return Ok(args);
        }
        loop {
            let save = self.at;
            let (key_pos, word) = self.word();
            let arg = if !word.is_empty() && self.peek() == Some(b'=') {
                if !is_name(word) {
                    return Err(StackError::new(key_pos, StackErrorKind::Expected("a key name before `=`")));
                }
                let key = word.to_string();
                self.at += 1;
                self.skip_ws();
                if matches!(self.peek(), Some(b',' | b')') | None) {
                    return Err(StackError::new(self.at, StackErrorKind::Expected("a value after `=`")));
                }
                Arg { key: Some(key), key_pos, value: self.value()? }
            } else {
                self.at = save;
                let value = self.value()?;
                Arg { key: None, key_pos: value.pos(), value }
            };
            args.push(arg);
            match self.peek() {
                Some(b',') => self.at += 1,
                Some(b')') => {
                    self.at += 1;
                    return Ok(args);
                }
                _ => return Err(StackError::new(self.at, StackErrorKind::Expected("`,` or `)`"))),
            }
        }
    }
}

/// A whole number of 32 bits: digits only, with no sign, as sizes and the
/// trace reader's numbers are (`str::parse` takes a leading `+`).
pub(super) fn whole_u32(text: &str) -> Option<u32> {
    match text.bytes().all(|b| b.is_ascii_digit()) {
        true => text.parse().ok(),
        false => None,
    }
}

/// Reads a size: a decimal number with an optional suffix, in any case:
/// `B`; `K`/`KiB`, `M`/`MiB`, `G`/`GiB`, `T`/`TiB` (powers of 1024);
/// `KB`, `MB`, `GB`, `TB` (powers of 1000, as the SI units they are).
/// Digits may be grouped by underscores, each between two digits (`1_000`;
/// `1_`, `1__0` and `_1` are no sizes).
///
/// ```
/// use memres_core::stack::parse_size;
/// assert_eq!(parse_size("4GiB"), Some(4 << 30));
/// assert_eq!(parse_size("512k"), Some(512 << 10));
/// assert_eq!(parse_size("2GB"), Some(2_000_000_000));
/// assert_eq!(parse_size("64kb"), Some(64_000));
/// assert_eq!(parse_size("1_000"), Some(1000));
/// assert_eq!(parse_size("64_MiB"), None);
/// assert_eq!(parse_size("1.5G"), None);
/// assert_eq!(parse_size("99999999TiB"), None); // overflows
/// ```
pub fn parse_size(text: &str) -> Option<u64> {
    let digits_end = text.find(|c: char| !c.is_ascii_digit() && c != '_').unwrap_or(text.len());
    let (number, suffix) = text.split_at(digits_end);
    // Each underscore between two digits: none leads, trails or doubles.
    if number.split('_').any(str::is_empty) {
        return None;
    }
    let mut n: u64 = 0;
    for c in number.bytes().filter(|&b| b != b'_') {
        n = n.checked_mul(10)?.checked_add(u64::from(c - b'0'))?;
    }
    let suffix = suffix.as_bytes();
    let unit: u64 = match suffix.len() {
        0 => 1,
        _ if suffix.eq_ignore_ascii_case(b"b") => 1,
        _ => {
            let power = match suffix[0].to_ascii_lowercase() {
                b'k' => 1,
                b'm' => 2,
                b'g' => 3,
                b't' => 4,
                _ => return None,
            };
            let rest = &suffix[1..];
            if rest.is_empty() || rest.eq_ignore_ascii_case(b"ib") {
                1u64 << (10 * power)
            } else if rest.eq_ignore_ascii_case(b"b") {
                1000u64.pow(power)
            } else {
                return None;
            }
        }
    };
    n.checked_mul(unit)
}

impl Value {
    /// Byte position of the value.
    ///
    /// ```
    /// let c = memres_core::stack::parse("a(b, 5)")?;
    /// assert_eq!((c.args[0].value.pos(), c.args[1].value.pos()), (2, 5));
    /// # Ok::<(), memres_core::stack::StackError>(())
    /// ```
    pub fn pos(&self) -> usize {
        match self {
            Value::Call(c) => c.pos,
            Value::Word { pos, .. } => *pos,
        }
    }

    /// The value as text: a word, or a bare name with no arguments.
    ///
    /// # Errors
    ///
    /// [`StackErrorKind::WrongKind`] for a call with arguments.
    ///
    /// ```
    /// let c = memres_core::stack::parse("log(x, file=/tmp/a.csv)")?;
    /// assert_eq!(c.args[1].value.text()?, "/tmp/a.csv");
    /// # Ok::<(), memres_core::stack::StackError>(())
    /// ```
    pub fn text(&self) -> Result<&str, StackError> {
        match self {
            Value::Word { text, .. } => Ok(text),
            Value::Call(c) if c.args.is_empty() => Ok(&c.name),
            Value::Call(c) => {
                Err(StackError::new(c.pos, StackErrorKind::WrongKind("a word, not a resource")))
            }
        }
    }

    /// The value as a size (see [`parse_size`]).
    ///
    /// # Errors
    ///
    /// [`StackErrorKind::BadSize`] at the value's position.
    ///
    /// ```
    /// let c = memres_core::stack::parse("sim(80GiB)")?;
    /// assert_eq!(c.args[0].value.size()?, 80 << 30);
    /// # Ok::<(), memres_core::stack::StackError>(())
    /// ```
    pub fn size(&self) -> Result<u64, StackError> {
        let text = self.text()?;
        parse_size(text).ok_or_else(|| StackError::new(self.pos(), StackErrorKind::BadSize(text.to_string())))
    }

    /// The value as a resource.
    ///
    /// # Errors
    ///
    /// [`StackErrorKind::WrongKind`] for a word.
    ///
    /// ```
    /// let c = memres_core::stack::parse("stats(sim)")?;
    /// assert_eq!(c.args[0].value.call()?.name, "sim");
    /// # Ok::<(), memres_core::stack::StackError>(())
    /// ```
    pub fn call(&self) -> Result<&Call, StackError> {
        match self {
            Value::Call(c) => Ok(c),
            Value::Word { pos, .. } => Err(StackError::new(*pos, StackErrorKind::WrongKind("a resource"))),
        }
    }
}

impl Call {
    /// Refuses calls nested more than [`MAX_DEPTH`] deep, as [`parse`]
    /// does: a call made by hand may be, and a build recurses once per
    /// level. The walk is a loop, to refuse any depth.
    ///
    /// # Errors
    ///
    /// [`StackErrorKind::TooDeep`] at the first call, in the order of the
    /// text, that opens one level too many: one with arguments inside
    /// `MAX_DEPTH` calls.
    pub(super) fn check_depth(&self) -> Result<(), StackError> {
        // The calls to look at, each with how many calls are around it;
        // arguments pushed last first, so that the first is met first.
        let mut todo = alloc::vec![(self, 0)];
        while let Some((call, around)) = todo.pop() {
            if call.args.is_empty() {
                continue;
            }
            if around == MAX_DEPTH {
                return Err(call.error(StackErrorKind::TooDeep));
            }
            let inner = call.args.iter().rev().filter_map(|a| match &a.value {
                Value::Call(c) => Some((c, around + 1)),
                Value::Word { .. } => None,
            });
            todo.extend(inner);
        }
        Ok(())
    }

    /// The error "`kind` about this call", at its name.
    ///
    /// ```
    /// # use memres_core::stack::{parse, StackErrorKind};
    /// let c = parse("  pool")?;
    /// assert_eq!(c.error(StackErrorKind::ExtraArg).pos, 2);
    /// # Ok::<(), memres_core::stack::StackError>(())
    /// ```
    pub fn error(&self, kind: StackErrorKind) -> StackError {
        StackError::new(self.pos, kind)
    }

    /// The `i`th positional argument.
    ///
    /// ```
    /// let c = memres_core::stack::parse("limit(sim, x=1, 2G)")?;
    /// assert_eq!(c.positional(1).unwrap().text()?, "2G");
    /// assert!(c.positional(2).is_none());
    /// # Ok::<(), memres_core::stack::StackError>(())
    /// ```
    pub fn positional(&self, i: usize) -> Option<&Value> {
        self.args.iter().filter(|a| a.key.is_none()).nth(i).map(|a| &a.value)
    }

    /// The value of `key=...`, if given.
    ///
    /// ```
    /// let c = memres_core::stack::parse("pool(sim, max=4G)")?;
    /// assert_eq!(c.keyed("max").unwrap().size()?, 4 << 30);
    /// assert!(c.keyed("initial").is_none());
    /// # Ok::<(), memres_core::stack::StackError>(())
    /// ```
    pub fn keyed(&self, key: &str) -> Option<&Value> {
        self.args.iter().find(|a| a.key.as_deref() == Some(key)).map(|a| &a.value)
    }

    /// Checks that the call takes at most `positional` positional arguments
    /// and only the keys in `keys`, each at most once.
    ///
    /// # Errors
    ///
    /// [`StackErrorKind::ExtraArg`], [`StackErrorKind::UnknownKey`] or
    /// [`StackErrorKind::DuplicateKey`] at the argument's position.
    ///
    /// ```
    /// # use memres_core::stack::{parse, StackErrorKind};
    /// let c = parse("pool(sim, colour=red)")?;
    /// let e = c.expect_args(1, &["initial", "max"]).unwrap_err();
    /// assert_eq!((e.pos, e.kind), (10, StackErrorKind::UnknownKey("colour".into())));
    /// # Ok::<(), memres_core::stack::StackError>(())
    /// ```
    pub fn expect_args(&self, positional: usize, keys: &[&str]) -> Result<(), StackError> {
        let mut seen_positional = 0;
        for (i, arg) in self.args.iter().enumerate() {
            match &arg.key {
                None => {
                    seen_positional += 1;
                    if seen_positional > positional {
                        return Err(StackError::new(arg.key_pos, StackErrorKind::ExtraArg));
                    }
                }
                Some(k) => {
                    if !keys.contains(&k.as_str()) {
                        return Err(StackError::new(arg.key_pos, StackErrorKind::UnknownKey(k.clone())));
                    }
                    if self.args[..i].iter().any(|a| a.key.as_ref() == Some(k)) {
                        return Err(StackError::new(arg.key_pos, StackErrorKind::DuplicateKey(k.clone())));
                    }
                }
            }
        }
        Ok(())
    }

    /// The `i`th positional argument as a resource.
    ///
    /// # Errors
    ///
    /// [`StackErrorKind::MissingArg`] if absent, [`StackErrorKind::WrongKind`]
    /// if a word.
    ///
    /// ```
    /// let c = memres_core::stack::parse("stats(pool(sim))")?;
    /// assert_eq!(c.resource(0)?.resource(0)?.name, "sim");
    /// assert!(c.resource(1).is_err());
    /// # Ok::<(), memres_core::stack::StackError>(())
    /// ```
    pub fn resource(&self, i: usize) -> Result<&Call, StackError> {
        self.positional(i)
            .ok_or_else(|| self.error(StackErrorKind::MissingArg("an upstream resource")))?
            .call()
    }

    /// The size given as `key=...`, if any.
    ///
    /// # Errors
    ///
    /// [`StackErrorKind::BadSize`] at the value.
    ///
    /// ```
    /// let c = memres_core::stack::parse("pool(sim, initial=1GiB)")?;
    /// assert_eq!(c.size_arg("initial")?, Some(1 << 30));
    /// assert_eq!(c.size_arg("max")?, None);
    /// # Ok::<(), memres_core::stack::StackError>(())
    /// ```
    pub fn size_arg(&self, key: &str) -> Result<Option<u64>, StackError> {
        self.keyed(key).map(Value::size).transpose()
    }

    /// The whole number given as `key=...`, if any; `what` says what it
    /// must be, in the error.
    ///
    /// # Errors
    ///
    /// [`StackErrorKind::BadValue`] at the value if it is not a whole number
    /// that fits 32 bits (digits only: `+16` is refused, as a size with a
    /// sign is).
    ///
    /// ```
    /// let c = memres_core::stack::parse("fixed(sim, blocks=16, size=x)")?;
    /// assert_eq!(c.u32_arg("blocks", "a whole number")?, Some(16));
    /// assert_eq!(c.u32_arg("size", "a whole number").unwrap_err().to_string(), "at byte 27: bad value: size `x`: a whole number");
    /// # Ok::<(), memres_core::stack::StackError>(())
    /// ```
    pub fn u32_arg(&self, key: &str, what: &str) -> Result<Option<u32>, StackError> {
        let Some(v) = self.keyed(key) else { return Ok(None) };
        let text = v.text()?;
        whole_u32(text).map(Some).ok_or_else(|| {
            StackError::new(v.pos(), StackErrorKind::BadValue(alloc::format!("{key} `{text}`: {what}")))
        })
    }

    /// The error "this resource could not be made: `e`", at its name.
    ///
    /// ```
    /// # use memres_core::stack::{parse, StackErrorKind};
    /// # use memres_core::Error;
    /// let c = parse("pool(sim)")?;
    /// let refused = Error::InvalidConfig { what: "no upstream" };
    /// let e = c.resource_error(refused);
    /// assert_eq!((e.pos, e.kind), (0, StackErrorKind::Resource(refused)));
    /// # Ok::<(), memres_core::stack::StackError>(())
    /// ```
    pub fn resource_error(&self, e: crate::Error) -> StackError {
        self.error(StackErrorKind::Resource(e))
    }

    /// The flag given as `key=true` or `key=false`, if any.
    ///
    /// # Errors
    ///
    /// [`StackErrorKind::BadValue`] at the value if it is neither word.
    ///
    /// ```
    /// let c = memres_core::stack::parse("pool(sim, release=false, x=yes)")?;
    /// assert_eq!(c.bool_arg("release")?, Some(false));
    /// assert_eq!(c.bool_arg("initial")?, None);
    /// assert!(c.bool_arg("x").is_err());
    /// # Ok::<(), memres_core::stack::StackError>(())
    /// ```
    pub fn bool_arg(&self, key: &str) -> Result<Option<bool>, StackError> {
        let Some(v) = self.keyed(key) else { return Ok(None) };
        match v.text()? {
            "true" => Ok(Some(true)),
            "false" => Ok(Some(false)),
            text => Err(StackError::new(
                v.pos(),
                StackErrorKind::BadValue(alloc::format!("{key} `{text}`: true or false")),
            )),
        }
    }
}
