//! Just enough JSON for the iperf3 control protocol: the members of one
//! top-level object (nested objects and arrays are skipped), and escaping
//! strings for the messages we write.

use alloc::string::String;
use alloc::vec::Vec;

/// A member's value. Numbers are kept as integers (iperf3's parameters are
/// all integers; a fraction is truncated).
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Num(i64),
    Bool(bool),
    Str(String),
    Null,
    /// An object or array (skipped).
    Nested,
}

/// The members of a top-level JSON object, in order.
pub struct Object(Vec<(String, Value)>);

impl Object {
    /// The value of member `key`, if present.
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
pub fn parse(text: &[u8]) -> Option<Object> {
    let mut p = Parser { s: text, i: 0 };
    p.ws();
    p.eat(b'{')?;
    let mut members = Vec::new();
    p.ws();
    if p.peek() == Some(b'}') {
        p.i += 1;
    } else {
        loop {
            p.ws();
            let key = p.string()?;
            p.ws();
            p.eat(b':')?;
            p.ws();
            let value = p.value(0)?;
            members.push((key, value));
            p.ws();
            match p.next()? {
                b',' => continue,
                b'}' => break,
                _ => return None,
            }
        }
    }
    p.ws();
    (p.i == p.s.len()).then_some(Object(members))
}

/// Nesting deeper than this is refused.
const MAX_DEPTH: usize = 32;

struct Parser<'a> {
    s: &'a [u8],
    i: usize,
}

impl Parser<'_> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    fn next(&mut self) -> Option<u8> {
        let c = self.peek()?;
        self.i += 1;
        Some(c)
    }

    fn eat(&mut self, c: u8) -> Option<()> {
        (self.next()? == c).then_some(())
    }

    fn ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.i += 1;
        }
    }

    fn literal(&mut self, word: &[u8]) -> Option<()> {
        let end = self.i.checked_add(word.len())?;
        (self.s.get(self.i..end)? == word).then(|| self.i = end)
    }

    fn value(&mut self, depth: usize) -> Option<Value> {
        match self.peek()? {
            b'"' => self.string().map(Value::Str),
            b't' => self.literal(b"true").map(|_| Value::Bool(true)),
            b'f' => self.literal(b"false").map(|_| Value::Bool(false)),
            b'n' => self.literal(b"null").map(|_| Value::Null),
            b'{' | b'[' => self.nested(depth).map(|_| Value::Nested),
            b'-' | b'0'..=b'9' => self.number().map(Value::Num),
            _ => None,
        }
    }

    /// Skip an object or array.
    fn nested(&mut self, depth: usize) -> Option<()> {
        if depth >= MAX_DEPTH {
            return None;
        }
        let close = if self.next()? == b'{' { b'}' } else { b']' };
        self.ws();
        if self.peek() == Some(close) {
            self.i += 1;
            return Some(());
        }
        loop {
            self.ws();
            if close == b'}' {
                self.string()?;
                self.ws();
                self.eat(b':')?;
                self.ws();
            }
            self.value(depth + 1)?;
            self.ws();
            match self.next()? {
                b',' => continue,
                c if c == close => return Some(()),
                _ => return None,
            }
        }
    }

    fn string(&mut self) -> Option<String> {
        self.eat(b'"')?;
        let mut out = Vec::new();
        loop {
            match self.next()? {
                b'"' => break,
                b'\\' => match self.next()? {
                    b'"' => out.push(b'"'),
                    b'\\' => out.push(b'\\'),
                    b'/' => out.push(b'/'),
                    b'b' => out.push(8),
                    b'f' => out.push(12),
                    b'n' => out.push(b'\n'),
                    b'r' => out.push(b'\r'),
                    b't' => out.push(b'\t'),
                    b'u' => {
                        let hex = self.s.get(self.i..self.i + 4)?;
                        self.i += 4;
                        let code = u32::from_str_radix(core::str::from_utf8(hex).ok()?, 16).ok()?;
                        let c = char::from_u32(code).unwrap_or('?');
                        out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes());
                    }
                    _ => return None,
                },
                c => out.push(c),
            }
        }
        String::from_utf8(out).ok()
    }

    /// A number, truncated to an integer (saturating).
    fn number(&mut self) -> Option<i64> {
        let neg = self.peek() == Some(b'-');
        if neg {
            self.i += 1;
        }
        let mut mantissa: i64 = 0;
        let mut exp: i32 = 0;
        let mut digits = 0;
        while let Some(c @ b'0'..=b'9') = self.peek() {
            self.i += 1;
            digits += 1;
            match mantissa.checked_mul(10).and_then(|m| m.checked_add((c - b'0') as i64)) {
                Some(m) => mantissa = m,
                None => exp += 1, // keep the magnitude
            }
        }
        if self.peek() == Some(b'.') {
            self.i += 1;
            while let Some(c @ b'0'..=b'9') = self.peek() {
                self.i += 1;
                digits += 1;
                if let Some(m) = mantissa.checked_mul(10).and_then(|m| m.checked_add((c - b'0') as i64)) {
                    mantissa = m;
                    exp -= 1;
                }
            }
        }
        if digits == 0 {
            return None;
        }
        if matches!(self.peek(), Some(b'e' | b'E')) {
            self.i += 1;
            let eneg = match self.peek() {
                Some(b'-') => {
                    self.i += 1;
                    true
                }
                Some(b'+') => {
                    self.i += 1;
                    false
                }
                _ => false,
            };
            let mut e: i32 = 0;
            let mut edigits = 0;
            while let Some(c @ b'0'..=b'9') = self.peek() {
                self.i += 1;
                edigits += 1;
                e = e.saturating_mul(10).saturating_add((c - b'0') as i32);
            }
            if edigits == 0 {
                return None;
            }
            exp = exp.saturating_add(if eneg { -e } else { e });
        }
        let mut v = mantissa;
        while exp > 0 {
            v = v.saturating_mul(10);
            exp -= 1;
        }
        while exp < 0 && v != 0 {
            v /= 10;
            exp += 1;
        }
        Some(if neg { -v } else { v })
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
                let _ = core::fmt::Write::write_fmt(&mut out, format_args!("\\u{:04x}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Nanoseconds as seconds with a fraction (a JSON number).
pub fn secs(ns: u64) -> String {
    alloc::format!("{}.{:06}", ns / 1_000_000_000, ns % 1_000_000_000 / 1000)
}
