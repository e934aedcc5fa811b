//! Just enough JSON for guest apps (`no_std` + `alloc`, no wisp-libos): the
//! members of one top-level object (nested objects and arrays are checked
//! and skipped), and writing strings and numbers for the messages an app
//! sends. Used by the iperf app for iperf3's control messages.
//!
//! Every input is bounded, so no message can stall a guest or exhaust its
//! heap: work is linear in the input (each byte is looked at a fixed number
//! of times: a number's exponent is clamped, not iterated), nesting stops
//! at [`MAX_DEPTH`] levels, a string at [`MAX_STRING`] bytes, a number at
//! [`MAX_NUMBER`] characters, an object at [`MAX_MEMBERS`] members; skipped
//! values allocate nothing. The caller bounds the input's length (iperf
//! takes 256 KiB at most).
//!
//! Why not a field crate such as `serde-json-core`: iperf3's messages are
//! a flat object whose flags are told by *presence* (`"reverse":true` or
//! absent) and whose members vary between iperf3 versions; serde's typed
//! structs need a field per member, borrowed `&str`s that cannot hold an
//! escaped title, and serde_derive's visitors. Measured on a minimal
//! `x86_64-unknown-none` binary reading iperf's 18 parameters:
//! serde-json-core 0.6 with serde's derive 20.7 KB of code, this crate
//! 12.0 KB including `alloc` (which every image links anyway); in the
//! iperf image it adds less than a page (0.6 KB) over the parser it
//! replaced. This parser is strict JSON (RFC 8259) apart from what it
//! keeps: numbers become saturating integers.
#![cfg_attr(not(test), no_std)]

extern crate alloc;

use alloc::string::String;
use alloc::vec::Vec;
use core::fmt;

/// Nesting deeper than this is refused (objects and arrays).
pub const MAX_DEPTH: usize = 32;
/// Longest string (key or value), in bytes once decoded.
pub const MAX_STRING: usize = 4096;
/// Longest number, in characters (sign, digits, fraction, exponent).
pub const MAX_NUMBER: usize = 64;
/// Most members of the top-level object.
pub const MAX_MEMBERS: usize = 256;

/// A member's value. Numbers are kept as integers (a fraction is
/// truncated toward zero, magnitudes beyond `i64` saturate).
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Num(i64),
    Bool(bool),
    Str(String),
    Null,
    /// An object or array (checked, then skipped).
    Nested,
}

/// Why a text was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Error {
    /// Not JSON, or not one object (also: the text ends too early).
    Syntax,
    /// Nested deeper than [`MAX_DEPTH`].
    TooDeep,
    /// A string longer than [`MAX_STRING`].
    StringTooLong,
    /// A number longer than [`MAX_NUMBER`].
    NumberTooLong,
    /// More than [`MAX_MEMBERS`] members.
    TooManyMembers,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Error::Syntax => "malformed JSON",
            Error::TooDeep => "nested too deep",
            Error::StringTooLong => "string too long",
            Error::NumberTooLong => "number too long",
            Error::TooManyMembers => "too many members",
        })
    }
}

/// The members of a top-level JSON object, in order.
#[derive(Debug)]
pub struct Object(Vec<(String, Value)>);

impl Object {
    /// The value of member `key`, if present (the first, if repeated).
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// Whether member `key` is present (iperf3 marks flags by presence).
    pub fn has(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    /// Member `key` as an integer (`true` counts as 1).
    pub fn int(&self, key: &str) -> Option<i64> {
        match self.get(key)? {
            Value::Num(n) => Some(*n),
            Value::Bool(b) => Some(*b as i64),
            _ => None,
        }
    }

    /// Member `key` if it is `true` or a non-zero number.
    pub fn flag(&self, key: &str) -> bool {
        self.int(key).is_some_and(|n| n != 0)
    }
}

/// Parse `text` as one JSON object.
pub fn parse(text: &[u8]) -> Result<Object, Error> {
    let mut p = Parser { s: text, i: 0 };
    p.ws();
    p.eat(b'{')?;
    let mut members = Vec::new();
    p.ws();
    if p.peek() == Some(b'}') {
        p.i += 1;
    } else {
        loop {
            if members.len() == MAX_MEMBERS {
                return Err(Error::TooManyMembers);
            }
            p.ws();
            let key = p.string()?;
            p.ws();
            p.eat(b':')?;
            p.ws();
            let value = p.value()?;
            members.push((key, value));
            p.ws();
            match p.next()? {
                b',' => continue,
                b'}' => break,
                _ => return Err(Error::Syntax),
            }
        }
    }
    p.ws();
    if p.i != p.s.len() {
        return Err(Error::Syntax);
    }
    Ok(Object(members))
}

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
}

/// Where a string's bytes go: kept (a member's key or value) or only
/// counted (a skipped value).
enum Sink {
    Keep(Vec<u8>),
    Count(usize),
}

impl Sink {
    fn push(&mut self, bytes: &[u8]) -> Result<(), Error> {
        let len = match self {
            Sink::Keep(v) => v.len(),
            Sink::Count(n) => *n,
        };
        if len + bytes.len() > MAX_STRING {
            return Err(Error::StringTooLong);
        }
        match self {
            Sink::Keep(v) => v.extend_from_slice(bytes),
            Sink::Count(n) => *n += bytes.len(),
        }
        Ok(())
    }
}

impl Parser<'_> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    fn next(&mut self) -> Result<u8, Error> {
        let c = self.peek().ok_or(Error::Syntax)?;
        self.i += 1;
        Ok(c)
    }

    fn eat(&mut self, c: u8) -> Result<(), Error> {
        if self.next()? == c {
            Ok(())
        } else {
            Err(Error::Syntax)
        }
    }

    fn ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.i += 1;
        }
    }

    fn literal(&mut self, word: &[u8]) -> Result<(), Error> {
        let end = self.i.checked_add(word.len()).ok_or(Error::Syntax)?;
        if self.s.get(self.i..end) != Some(word) {
            return Err(Error::Syntax);
        }
        self.i = end;
        Ok(())
    }

    /// A member's value.
    fn value(&mut self) -> Result<Value, Error> {
        match self.peek().ok_or(Error::Syntax)? {
            b'"' => self.string().map(Value::Str),
            b'{' | b'[' => self.skip_nested().map(|_| Value::Nested),
            _ => self.scalar(),
        }
    }

    fn scalar(&mut self) -> Result<Value, Error> {
        match self.peek().ok_or(Error::Syntax)? {
            b't' => self.literal(b"true").map(|_| Value::Bool(true)),
            b'f' => self.literal(b"false").map(|_| Value::Bool(false)),
            b'n' => self.literal(b"null").map(|_| Value::Null),
            b'-' | b'0'..=b'9' => self.number().map(Value::Num),
            _ => Err(Error::Syntax),
        }
    }

    /// Check and skip an object or array. Iterative, with the kind of each
    /// open level in a bit of `stack` (set: object), so that the depth is
    /// bounded by [`MAX_DEPTH`] and not by the guest's stack.
    fn skip_nested(&mut self) -> Result<(), Error> {
        const _: () = assert!(MAX_DEPTH <= 64);
        let mut stack: u64 = 0;
        let mut depth = 0;
        // Expecting a value (after `[`, `,` in an array, `:`), or what may
        // follow one.
        let mut want_value = true;
        loop {
            self.ws();
            if want_value {
                match self.peek().ok_or(Error::Syntax)? {
                    c @ (b'{' | b'[') => {
                        if depth == MAX_DEPTH {
                            return Err(Error::TooDeep);
                        }
                        self.i += 1;
                        let object = c == b'{';
                        stack = stack << 1 | object as u64;
                        depth += 1;
                        self.ws();
                        let close = if object { b'}' } else { b']' };
                        if self.peek() == Some(close) {
                            // Empty: closed below as if after a value.
                            want_value = false;
                            continue;
                        }
                        if object {
                            self.skip_key()?;
                        }
                        continue;
                    }
                    b'"' => self.skip_string()?,
                    _ => {
                        self.scalar()?;
                    }
                }
                want_value = false;
                continue;
            }
            let object = stack & 1 == 1;
            match (self.next()?, object) {
                (b',', true) => {
                    self.ws();
                    self.skip_key()?;
                    want_value = true;
                }
                (b',', false) => want_value = true,
                (b'}', true) | (b']', false) => {
                    stack >>= 1;
                    depth -= 1;
                    if depth == 0 {
                        return Ok(());
                    }
                }
                _ => return Err(Error::Syntax),
            }
        }
    }

    /// A key and its colon, in a skipped object.
    fn skip_key(&mut self) -> Result<(), Error> {
        self.skip_string()?;
        self.ws();
        self.eat(b':')
    }

    fn string(&mut self) -> Result<String, Error> {
        let mut out = Sink::Keep(Vec::new());
        self.string_into(&mut out)?;
        match out {
            Sink::Keep(v) => String::from_utf8(v).map_err(|_| Error::Syntax),
            Sink::Count(_) => unreachable!(),
        }
    }

    fn skip_string(&mut self) -> Result<(), Error> {
        self.string_into(&mut Sink::Count(0))
    }

    fn string_into(&mut self, out: &mut Sink) -> Result<(), Error> {
        self.eat(b'"')?;
        loop {
            // A run of plain bytes at once.
            let start = self.i;
            while matches!(self.peek(), Some(c) if c != b'"' && c != b'\\' && c >= 0x20) {
                self.i += 1;
            }
            out.push(&self.s[start..self.i])?;
            match self.next()? {
                b'"' => return Ok(()),
                b'\\' => {
                    let c = match self.next()? {
                        b'"' => '"',
                        b'\\' => '\\',
                        b'/' => '/',
                        b'b' => '\u{8}',
                        b'f' => '\u{c}',
                        b'n' => '\n',
                        b'r' => '\r',
                        b't' => '\t',
                        b'u' => self.unicode_escape()?,
                        _ => return Err(Error::Syntax),
                    };
                    out.push(c.encode_utf8(&mut [0; 4]).as_bytes())?;
                }
                // A raw control character.
                _ => return Err(Error::Syntax),
            }
        }
    }

    /// The character of a `\uXXXX` escape (the `\u` read), joining a
    /// UTF-16 surrogate pair.
    fn unicode_escape(&mut self) -> Result<char, Error> {
        let hi = self.hex4()?;
        let code = match hi {
            0xd800..=0xdbff => {
                self.literal(b"\\u")?;
                let lo = self.hex4()?;
                if !(0xdc00..=0xdfff).contains(&lo) {
                    return Err(Error::Syntax);
                }
                0x10000 + ((hi - 0xd800) << 10) + (lo - 0xdc00)
            }
            0xdc00..=0xdfff => return Err(Error::Syntax),
            c => c,
        };
        char::from_u32(code).ok_or(Error::Syntax)
    }

    fn hex4(&mut self) -> Result<u32, Error> {
        let mut v = 0;
        for _ in 0..4 {
            let d = (self.next()? as char).to_digit(16).ok_or(Error::Syntax)?;
            v = v * 16 + d;
        }
        Ok(v)
    }

    /// A number, truncated toward zero to an integer (saturating).
    fn number(&mut self) -> Result<i64, Error> {
        // Its extent first: at most MAX_NUMBER characters are looked at.
        let rest = &self.s[self.i..];
        let len = rest
            .iter()
            .take(MAX_NUMBER + 1)
            .take_while(|c| matches!(c, b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E'))
            .count();
        if len > MAX_NUMBER {
            return Err(Error::NumberTooLong);
        }
        self.i += len;
        parse_number(&rest[..len]).ok_or(Error::Syntax)
    }
}

/// A whole JSON number (RFC 8259's grammar), truncated toward zero to an
/// integer, saturating.
fn parse_number(t: &[u8]) -> Option<i64> {
    let mut i = 0;
    let neg = t.first() == Some(&b'-');
    i += neg as usize;
    let digits = |i: &mut usize| {
        let start = *i;
        while t.get(*i).is_some_and(u8::is_ascii_digit) {
            *i += 1;
        }
        &t[start..*i]
    };
    // The value is mantissa * 10^exp; digits past i64's range only count
    // for the magnitude.
    let (mut mantissa, mut exp, mut full) = (0i64, 0i64, false);
    let mut add = |c: u8| match mantissa
        .checked_mul(10)
        .and_then(|m| m.checked_add((c - b'0') as i64))
    {
        Some(m) if !full => {
            mantissa = m;
            true
        }
        _ => {
            full = true;
            false
        }
    };
    let int = digits(&mut i);
    if int.is_empty() || (int.len() > 1 && int[0] == b'0') {
        return None;
    }
    for &c in int {
        if !add(c) {
            exp += 1;
        }
    }
    if t.get(i) == Some(&b'.') {
        i += 1;
        let frac = digits(&mut i);
        if frac.is_empty() {
            return None;
        }
        for &c in frac {
            if add(c) {
                exp -= 1;
            }
        }
    }
    if matches!(t.get(i), Some(b'e' | b'E')) {
        i += 1;
        let eneg = t.get(i) == Some(&b'-');
        i += matches!(t.get(i), Some(b'-' | b'+')) as usize;
        let e = digits(&mut i);
        if e.is_empty() {
            return None;
        }
        let e = e.iter().fold(0i64, |e, &c| {
            e.saturating_mul(10).saturating_add((c - b'0') as i64)
        });
        exp = exp.saturating_add(if eneg { -e } else { e });
    }
    (i == t.len()).then(|| scale(mantissa, exp, neg))
}

/// `mantissa * 10^exp`, truncated toward zero, saturating, negated if
/// `neg`: at most 19 steps whatever `exp` is (10^19 > i64::MAX).
fn scale(mantissa: i64, exp: i64, neg: bool) -> i64 {
    let v = if mantissa == 0 {
        0
    } else if exp >= 19 {
        i64::MAX
    } else if exp <= -19 {
        0
    } else if exp >= 0 {
        (0..exp).fold(mantissa, |v, _| v.saturating_mul(10))
    } else {
        (0..-exp).fold(mantissa, |v, _| v / 10)
    };
    if neg {
        -v
    } else {
        v
    }
}

/// `s` as a JSON string literal (with the quotes).
pub fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = fmt::Write::write_fmt(&mut out, format_args!("\\u{:04x}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Nanoseconds as seconds with six decimals (a JSON number).
pub fn seconds(ns: u64) -> String {
    alloc::format!("{}.{:06}", ns / 1_000_000_000, ns % 1_000_000_000 / 1000)
}

#[cfg(test)]
mod tests;
