//! What the server and the client share: limits, the error type, the line
//! and message-head readers (the head is parsed by `httparse`), percent-coding
//! and reason phrases.

use std::fmt;
use std::io::{self, BufRead};

/// Largest request head (request line, headers, line ends) the server reads.
pub const MAX_HEADER_BYTES: usize = 16 * 1024;
/// Largest request body (`Content-Length`) the server accepts.
pub const MAX_BODY_BYTES: usize = 1 << 20;
/// Largest response head the client reads.
pub const CLIENT_MAX_HEADER_BYTES: usize = 64 << 10;
/// Largest response body [`Client::request`](super::Client::request) buffers.
pub const CLIENT_MAX_BODY_BYTES: usize = 64 << 20;

/// A request the server answers with an error status, or a response body the client could not decode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpError {
    /// HTTP status code to answer with.
    pub status: u16,
    /// What was wrong, for a person.
    pub message: String,
}

impl HttpError {
    /// An error with the given status and message.
    pub fn new(status: u16, message: impl Into<String>) -> Self {
        HttpError { status, message: message.into() }
    }
}

impl fmt::Display for HttpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}: {}", self.status, reason(self.status), self.message)
    }
}

impl std::error::Error for HttpError {}

pub(super) fn bad(msg: &str) -> HttpError {
    HttpError::new(400, msg)
}

pub(super) fn find_header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
}

/// Whether any `name` header lists `token` (comma-separated, case-insensitive).
pub(super) fn has_token(headers: &[(String, String)], name: &str, token: &str) -> bool {
    let mut values = headers.iter().filter(|(n, _)| n.eq_ignore_ascii_case(name));
    values.any(|(_, v)| v.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
}

/// RFC 9110 `tchar`: the characters of methods and header names.
pub(super) fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Visible ASCII: the characters of a request target.
pub(super) fn is_vchar(b: u8) -> bool {
    (0x21..0x7f).contains(&b)
}

/// Why reading a message head failed.
pub(super) enum HeadErr {
    /// Over the byte budget.
    TooLong,
    /// I/O error or EOF in the middle.
    Io(io::Error),
}

impl HeadErr {
    pub(super) fn into_io(self) -> io::Error {
        match self {
            HeadErr::TooLong => invalid("response headers too large"),
            HeadErr::Io(e) => e,
        }
    }
}

pub(super) fn invalid(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.to_string())
}

pub(super) fn eof() -> io::Error {
    io::Error::new(io::ErrorKind::UnexpectedEof, "connection closed mid-message")
}

/// Read one line, consuming at most `*budget` bytes (decremented), and return it without its LF or
/// CRLF. `Ok(None)`: EOF before any byte.
pub(super) fn read_line<R: BufRead>(r: &mut R, budget: &mut usize) -> Result<Option<Vec<u8>>, HeadErr> {
    let mut line = Vec::new();
    loop {
        let buf = match r.fill_buf() {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(HeadErr::Io(e)),
        };
        if buf.is_empty() {
            return if line.is_empty() { Ok(None) } else { Err(HeadErr::Io(eof())) };
        }
        let avail = &buf[..buf.len().min(*budget)];
        let nl = avail.iter().position(|&b| b == b'\n');
        let take = nl.map_or(avail.len(), |i| i + 1);
        line.extend_from_slice(&avail[..take]);
        r.consume(take);
        *budget -= take;
        if nl.is_some() {
            line.pop();
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            return Ok(Some(line));
        }
        if *budget == 0 {
            return Err(HeadErr::TooLong);
        }
    }
}

/// Read a message head (start line and header lines, each ending in LF or CRLF) up to and including
/// the empty line that ends it, consuming at most `*budget` bytes (decremented) and nothing after the
/// head; the lines come back ending in CRLF, for `httparse`. Empty lines before the start line are
/// skipped (and counted). `Ok(None)`: EOF before the start line.
pub(super) fn read_head<R: BufRead>(r: &mut R, budget: &mut usize) -> Result<Option<Vec<u8>>, HeadErr> {
    let mut head = Vec::new();
    loop {
        match read_line(r, budget)? {
            None if head.is_empty() => return Ok(None),
            None => return Err(HeadErr::Io(eof())),
            // An empty line before the start line.
            Some(l) if l.is_empty() && head.is_empty() => {}
            Some(l) => {
                let end = l.is_empty();
                head.extend_from_slice(&l);
                head.extend_from_slice(b"\r\n");
                if end {
                    return Ok(Some(head));
                }
            }
        }
    }
}

/// Most header fields in a message head (requests and responses).
pub const MAX_HEADERS: usize = 100;

/// The header fields `httparse` found, as (lower-cased name, value) pairs; values must be UTF-8 and are
/// trimmed of spaces and tabs.
pub(super) fn owned_headers(parsed: &[httparse::Header<'_>]) -> Result<Vec<(String, String)>, &'static str> {
    let mut headers = Vec::with_capacity(parsed.len());
    for h in parsed {
        let value = std::str::from_utf8(h.value).map_err(|_| "header value is not valid UTF-8")?;
        headers.push((h.name.to_ascii_lowercase(), value.trim_matches([' ', '\t']).to_string()));
    }
    Ok(headers)
}

/// The `Content-Length` of a message, `Ok(None)` when absent; values beyond u64 read as `u64::MAX`.
pub(super) fn content_length(headers: &[(String, String)]) -> Result<Option<u64>, &'static str> {
    let mut len = None;
    for (_, v) in headers.iter().filter(|(n, _)| n == "content-length") {
        if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
            return Err("invalid Content-Length");
        }
        let n = v.parse().unwrap_or(u64::MAX);
        if len.is_some_and(|l| l != n) {
            return Err("conflicting Content-Length headers");
        }
        len = Some(n);
    }
    Ok(len)
}

/// Decode `%XX` escapes (and `+` as a space when `plus_as_space`); 400 on a bad escape or when the
/// result is not UTF-8.
pub fn percent_decode(s: &str, plus_as_space: bool) -> Result<String, HttpError> {
    let hex = |i: usize| s.as_bytes().get(i).and_then(|&b| (b as char).to_digit(16));
    let (b, mut out, mut i) = (s.as_bytes(), Vec::with_capacity(s.len()), 0);
    while i < b.len() {
        match b[i] {
            b'%' => {
                let (Some(hi), Some(lo)) = (hex(i + 1), hex(i + 2)) else {
                    return Err(bad("invalid percent-encoding"));
                };
                out.push((hi * 16 + lo) as u8);
                i += 2;
            }
            b'+' if plus_as_space => out.push(b' '),
            c => out.push(c),
        };
        i += 1;
    }
    String::from_utf8(out).map_err(|_| bad("percent-decoded text is not valid UTF-8"))
}

/// Percent-encode all but the RFC 3986 unreserved characters, for a path segment or a query key or value.
pub fn percent_encode(s: &str) -> String {
    let keep = |b: u8| b.is_ascii_alphanumeric() || b"-._~".contains(&b);
    s.bytes().map(|b| if keep(b) { (b as char).to_string() } else { format!("%{b:02X}") }).collect()
}

/// The reason phrase of a status code (a generic one for codes not listed).
#[rustfmt::skip]
pub fn reason(status: u16) -> &'static str {
    match status {
        100 => "Continue", 200 => "OK", 201 => "Created", 202 => "Accepted", 204 => "No Content",
        304 => "Not Modified", 400 => "Bad Request", 403 => "Forbidden", 404 => "Not Found",
        405 => "Method Not Allowed", 408 => "Request Timeout", 409 => "Conflict", 411 => "Length Required",
        413 => "Content Too Large", 415 => "Unsupported Media Type", 417 => "Expectation Failed",
        422 => "Unprocessable Content",
        429 => "Too Many Requests", 431 => "Request Header Fields Too Large", 500 => "Internal Server Error",
        501 => "Not Implemented", 502 => "Bad Gateway", 503 => "Service Unavailable", 504 => "Gateway Timeout",
        505 => "HTTP Version Not Supported", 507 => "Insufficient Storage",
        _ => ["Unknown", "Informational", "Success", "Redirection", "Client Error", "Server Error"]
            .get(usize::from(status / 100)).unwrap_or(&"Unknown"),
    }
}
