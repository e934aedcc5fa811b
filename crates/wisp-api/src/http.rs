//! A small HTTP/1.1 implementation for the daemon's Unix-socket API, in the spirit of Firecracker's
//! `micro_http`. The server side parses one request at a time from a [`BufRead`] and answers bad input
//! with a 4xx/5xx [`HttpError`]: never a panic, an unbounded read or an allocation sized by the peer.
//! The client side ([`Client`]) speaks keep-alive HTTP/1.1 over a `UnixStream` and reads
//! `Content-Length`, chunked and until-EOF bodies.
//!
//! Request bodies need `Content-Length` (chunked requests get 411); `Expect: 100-continue` is not
//! answered (curl goes ahead after a second). After [`read_request`] fails the connection is in an
//! unknown state: answer with `write_error(.., keep_alive = false)` and close it.

use serde::{de::DeserializeOwned, Serialize};
use std::fmt;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

/// Largest request head (request line, headers, line ends) the server reads.
pub const MAX_HEADER_BYTES: usize = 16 * 1024;
/// Largest request body (`Content-Length`) the server accepts.
pub const MAX_BODY_BYTES: usize = 1 << 20;
/// Largest response head the client reads.
pub const CLIENT_MAX_HEADER_BYTES: usize = 64 << 10;
/// Largest response body [`Client::request`] buffers.
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

fn bad(msg: &str) -> HttpError {
    HttpError::new(400, msg)
}

/// A parsed request.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Request {
    /// Method as sent (case-sensitive, e.g. `GET`).
    pub method: String,
    /// Percent-decoded path, without the query.
    pub path: String,
    /// Decoded query parameters in order (`+` is a space; a bare `k` is `k=""`).
    pub query: Vec<(String, String)>,
    /// Headers in order, names lower-cased, values trimmed. An HTTP/1.0 request without
    /// `Connection: keep-alive` gets a synthesized `connection: close`, so no version field is needed.
    pub headers: Vec<(String, String)>,
    /// Body (`Content-Length` bytes; empty without one).
    pub body: Vec<u8>,
}

impl Request {
    /// First header named `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        find_header(&self.headers, name)
    }

    /// First query parameter named `k`.
    pub fn query_param(&self, k: &str) -> Option<&str> {
        self.query.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str())
    }

    /// Whether to keep the connection: HTTP/1.1 unless `Connection: close`, HTTP/1.0 only with
    /// `Connection: keep-alive`.
    pub fn keep_alive(&self) -> bool {
        !has_token(&self.headers, "connection", "close")
    }

    /// Decode the body as JSON: 400 when it is empty or does not parse (with serde's message).
    pub fn json<T: DeserializeOwned>(&self) -> Result<T, HttpError> {
        if self.body.iter().all(u8::is_ascii_whitespace) {
            return Err(bad("missing JSON body"));
        }
        serde_json::from_slice(&self.body).map_err(|e| bad(&format!("invalid JSON body: {e}")))
    }
}

fn find_header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
}

/// Whether any `name` header lists `token` (comma-separated, case-insensitive).
fn has_token(headers: &[(String, String)], name: &str, token: &str) -> bool {
    let mut values = headers.iter().filter(|(n, _)| n.eq_ignore_ascii_case(name));
    values.any(|(_, v)| v.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
}

/// RFC 9110 `tchar`: the characters of methods and header names.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Visible ASCII: the characters of a request target.
fn is_vchar(b: u8) -> bool {
    (0x21..0x7f).contains(&b)
}

/// Why reading a message head failed.
enum HeadErr {
    /// Over the byte budget.
    TooLong,
    /// I/O error or EOF in the middle.
    Io(io::Error),
    /// Syntax error.
    Bad(&'static str),
}

impl HeadErr {
    fn into_io(self) -> io::Error {
        match self {
            HeadErr::TooLong => invalid("response headers too large"),
            HeadErr::Io(e) => e,
            HeadErr::Bad(m) => invalid(m),
        }
    }
}

fn invalid(msg: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.to_string())
}

fn eof() -> io::Error {
    io::Error::new(io::ErrorKind::UnexpectedEof, "connection closed mid-message")
}

/// Read one line, consuming at most `*budget` bytes (decremented), and return it without its LF or
/// CRLF. `Ok(None)`: EOF before any byte.
fn read_line<R: BufRead>(r: &mut R, budget: &mut usize) -> Result<Option<Vec<u8>>, HeadErr> {
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

/// Read header lines up to and including the empty line that ends the head.
fn read_headers<R: BufRead>(r: &mut R, budget: &mut usize) -> Result<Vec<(String, String)>, HeadErr> {
    let mut headers = Vec::new();
    loop {
        let line = read_line(r, budget)?.ok_or_else(|| HeadErr::Io(eof()))?;
        match line.first() {
            None => return Ok(headers),
            Some(b' ' | b'\t') => return Err(HeadErr::Bad("obsolete header line folding is not supported")),
            _ => {}
        }
        let colon = line.iter().position(|&b| b == b':').ok_or(HeadErr::Bad("malformed header line"))?;
        let (name, value) = (&line[..colon], &line[colon + 1..]);
        if name.is_empty() || !name.iter().all(|&b| is_tchar(b)) {
            return Err(HeadErr::Bad("invalid header name"));
        }
        if value.iter().any(|&b| (b < 0x20 && b != b'\t') || b == 0x7f) {
            return Err(HeadErr::Bad("invalid character in header value"));
        }
        let value = std::str::from_utf8(value).map_err(|_| HeadErr::Bad("header value is not valid UTF-8"))?;
        headers.push((String::from_utf8_lossy(name).to_ascii_lowercase(), value.trim_matches([' ', '\t']).into()));
    }
}

/// The `Content-Length` of a message, `Ok(None)` when absent; values beyond u64 read as `u64::MAX`.
fn content_length(headers: &[(String, String)]) -> Result<Option<u64>, &'static str> {
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

/// Parse a request line into method, target and "is HTTP/1.0".
fn parse_request_line(line: &[u8]) -> Result<(&str, &str, bool), HttpError> {
    let s = std::str::from_utf8(line).map_err(|_| bad("request line is not valid UTF-8"))?;
    let mut it = s.split(' ');
    let (Some(method), Some(target), Some(version), None) = (it.next(), it.next(), it.next(), it.next()) else {
        return Err(bad("malformed request line"));
    };
    let http10 = match version {
        "HTTP/1.1" => false,
        "HTTP/1.0" => true,
        _ => {
            let n = version.strip_prefix("HTTP/").unwrap_or("");
            let numeric =
                n.starts_with(|c: char| c.is_ascii_digit()) && n.bytes().all(|b| b.is_ascii_digit() || b == b'.');
            return Err(match numeric && n.len() <= 3 {
                true => HttpError::new(505, format!("unsupported HTTP version {version}")),
                false => bad("malformed request line"),
            });
        }
    };
    if method.is_empty() || !method.bytes().all(is_tchar) {
        return Err(bad("invalid method"));
    }
    Ok((method, target, http10))
}

/// Split an origin-form target (`/path?query`) into decoded path and query.
fn parse_target(target: &str) -> Result<(String, Vec<(String, String)>), HttpError> {
    if !target.bytes().all(is_vchar) {
        return Err(bad("invalid character in request target"));
    }
    if !target.starts_with('/') {
        return Err(bad("request target must be an absolute path"));
    }
    let target = target.split('#').next().unwrap_or("");
    let (raw_path, raw_query) = target.split_once('?').unwrap_or((target, ""));
    let path = percent_decode(raw_path, false)?;
    if path.chars().any(char::is_control) {
        return Err(bad("invalid character in path"));
    }
    let mut query = Vec::new();
    for pair in raw_query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        query.push((percent_decode(k, true)?, percent_decode(v, true)?));
    }
    Ok((path, query))
}

/// Read one request. `Ok(None)` on a clean EOF, or an I/O error (read timeout, reset), before any byte
/// of a request: the peer is gone or idle and there is nobody to answer. Leading empty lines are skipped.
pub fn read_request<R: BufRead>(r: &mut R) -> Result<Option<Request>, HttpError> {
    let head_err = |e| match e {
        HeadErr::TooLong => HttpError::new(431, format!("request head too large (limit {MAX_HEADER_BYTES} bytes)")),
        HeadErr::Io(_) => bad("incomplete request"),
        HeadErr::Bad(m) => bad(m),
    };
    let mut budget = MAX_HEADER_BYTES;
    let line = loop {
        match read_line(r, &mut budget) {
            Ok(Some(l)) if l.is_empty() => continue,
            Ok(Some(l)) => break l,
            Ok(None) => return Ok(None),
            Err(HeadErr::Io(_)) if budget == MAX_HEADER_BYTES => return Ok(None),
            Err(e) => return Err(head_err(e)),
        }
    };
    let (method, target, http10) = parse_request_line(&line)?;
    let (path, query) = parse_target(target)?;
    let mut headers = read_headers(r, &mut budget).map_err(head_err)?;
    if find_header(&headers, "transfer-encoding").is_some() {
        return Err(HttpError::new(411, "Transfer-Encoding request bodies are not supported; send Content-Length"));
    }
    let len = content_length(&headers).map_err(bad)?.unwrap_or(0);
    if len > MAX_BODY_BYTES as u64 {
        return Err(HttpError::new(413, format!("request body too large ({len} bytes; limit {MAX_BODY_BYTES})")));
    }
    let mut body = Vec::with_capacity(len as usize); // checked just above
    match r.take(len).read_to_end(&mut body) {
        Ok(n) if n as u64 == len => {}
        _ => return Err(bad("incomplete request")),
    }
    if http10 && !has_token(&headers, "connection", "keep-alive") {
        headers.push(("connection".into(), "close".into()));
    }
    Ok(Some(Request { method: method.into(), path, query, headers, body }))
}

/// The reason phrase of a status code (a generic one for codes not listed).
#[rustfmt::skip]
pub fn reason(status: u16) -> &'static str {
    match status {
        100 => "Continue", 200 => "OK", 201 => "Created", 202 => "Accepted", 204 => "No Content",
        304 => "Not Modified", 400 => "Bad Request", 403 => "Forbidden", 404 => "Not Found",
        405 => "Method Not Allowed", 408 => "Request Timeout", 409 => "Conflict", 411 => "Length Required",
        413 => "Content Too Large", 415 => "Unsupported Media Type", 422 => "Unprocessable Content",
        429 => "Too Many Requests", 431 => "Request Header Fields Too Large", 500 => "Internal Server Error",
        501 => "Not Implemented", 502 => "Bad Gateway", 503 => "Service Unavailable", 504 => "Gateway Timeout",
        505 => "HTTP Version Not Supported",
        _ => ["Unknown", "Informational", "Success", "Redirection", "Client Error", "Server Error"]
            .get(usize::from(status / 100)).unwrap_or(&"Unknown"),
    }
}

/// Status line plus `Content-Type` (control characters stripped); a status outside 100..=599 is sent as 500.
fn response_head(status: u16, content_type: &str) -> Vec<u8> {
    let status = if (100..=599).contains(&status) { status } else { 500 };
    let ct: String = content_type.chars().filter(|c| !c.is_control()).collect();
    format!("HTTP/1.1 {status} {}\r\nContent-Type: {ct}\r\n", reason(status)).into_bytes()
}

/// Write a complete response with a `Content-Length` body, and flush. 1xx, 204 and 304 responses go
/// without a body, as HTTP requires.
pub fn write_response<W: Write>(
    w: &mut W,
    status: u16,
    content_type: &str,
    body: &[u8],
    keep_alive: bool,
) -> io::Result<()> {
    let mut out = response_head(status, content_type);
    let body = if status < 200 || status == 204 || status == 304 { None } else { Some(body) };
    if let Some(body) = body {
        out.extend_from_slice(format!("Content-Length: {}\r\n", body.len()).as_bytes());
    }
    out.extend_from_slice(if keep_alive { b"Connection: keep-alive\r\n\r\n" } else { b"Connection: close\r\n\r\n" });
    out.extend_from_slice(body.unwrap_or_default());
    w.write_all(&out)?;
    w.flush()
}

/// Write `value` as an `application/json` response, with a trailing newline for people using curl. A
/// value that fails to serialize becomes a 500.
pub fn write_json<W: Write, T: Serialize>(w: &mut W, status: u16, value: &T, keep_alive: bool) -> io::Result<()> {
    let (status, mut body) = match serde_json::to_vec(value) {
        Ok(b) => (status, b),
        Err(e) => (500, serde_json::json!({ "error": format!("cannot encode response: {e}") }).to_string().into()),
    };
    body.push(b'\n');
    write_response(w, status, "application/json", &body, keep_alive)
}

/// Write the JSON error body `{"error": message}`.
pub fn write_error<W: Write>(w: &mut W, status: u16, message: &str, keep_alive: bool) -> io::Result<()> {
    write_json(w, status, &serde_json::json!({ "error": message }), keep_alive)
}

/// Start a `Transfer-Encoding: chunked` response; follow with [`write_chunk`]s and one [`end_chunked`],
/// after which the connection may be reused.
pub fn start_chunked<W: Write>(w: &mut W, status: u16, content_type: &str) -> io::Result<()> {
    start_chunked_with(w, status, content_type, &[])
}

/// [`start_chunked`] with extra response headers (names and values must be
/// plain header tokens/text).
pub fn start_chunked_with<W: Write>(w: &mut W, status: u16, content_type: &str, extra: &[(&str, &str)]) -> io::Result<()> {
    let mut out = response_head(status, content_type);
    for (k, v) in extra {
        out.extend_from_slice(format!("{k}: {v}\r\n").as_bytes());
    }
    out.extend_from_slice(b"Transfer-Encoding: chunked\r\n\r\n");
    w.write_all(&out)?;
    w.flush()
}

/// Send one chunk and flush; empty `data` is a no-op (an empty chunk would end the body).
pub fn write_chunk<W: Write>(w: &mut W, data: &[u8]) -> io::Result<()> {
    if data.is_empty() {
        return Ok(());
    }
    let mut out = format!("{:x}\r\n", data.len()).into_bytes();
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
    w.write_all(&out)?;
    w.flush()
}

/// End a chunked body, and flush.
pub fn end_chunked<W: Write>(w: &mut W) -> io::Result<()> {
    w.write_all(b"0\r\n\r\n")?;
    w.flush()
}

/// A response received by [`Client`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Response {
    /// Status code.
    pub status: u16,
    /// Headers in order, names lower-cased.
    pub headers: Vec<(String, String)>,
    /// Body, de-chunked.
    pub body: Vec<u8>,
}

impl Response {
    /// First header named `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        find_header(&self.headers, name)
    }

    /// Decode the body as JSON, whatever the status (error bodies decode as `ErrorBody`). A body that
    /// does not parse is reported with status 502.
    pub fn json<T: DeserializeOwned>(&self) -> Result<T, HttpError> {
        let status = self.status;
        serde_json::from_slice(&self.body)
            .map_err(|e| HttpError::new(502, format!("invalid JSON in {status} response: {e}")))
    }

    /// The `error` field of a JSON error body, else the body text, else the reason phrase.
    pub fn error_message(&self) -> String {
        let json = serde_json::from_slice::<serde_json::Value>(&self.body).ok();
        if let Some(s) = json.as_ref().and_then(|v| v.get("error")).and_then(|e| e.as_str()) {
            return s.into();
        }
        match String::from_utf8_lossy(&self.body).trim() {
            "" => reason(self.status).into(),
            t => t.into(),
        }
    }
}

/// How a response body is delimited.
enum Framing {
    Empty,
    Length(u64),
    Chunked,
    UntilEof,
}

/// A response head; `close`: the server will close the connection after the body.
struct Head {
    status: u16,
    headers: Vec<(String, String)>,
    close: bool,
}

/// Read a response head, skipping interim 1xx responses. `Ok(None)`: EOF or I/O error before any byte.
fn read_response_head<R: BufRead>(r: &mut R) -> io::Result<Option<Head>> {
    for round in 0..8 {
        let mut budget = CLIENT_MAX_HEADER_BYTES;
        let line = match read_line(r, &mut budget) {
            Ok(Some(l)) => l,
            Ok(None) if round == 0 => return Ok(None),
            Err(HeadErr::Io(_)) if round == 0 && budget == CLIENT_MAX_HEADER_BYTES => return Ok(None),
            Ok(None) => return Err(eof()),
            Err(e) => return Err(e.into_io()),
        };
        let line = String::from_utf8_lossy(&line);
        let mut it = line.splitn(3, ' ');
        let (version, code) = (it.next().unwrap_or(""), it.next().unwrap_or(""));
        if !version.starts_with("HTTP/1.") || code.len() != 3 || !code.bytes().all(|b| b.is_ascii_digit()) {
            return Err(invalid("malformed status line"));
        }
        let status = code.bytes().fold(0u16, |a, b| a * 10 + u16::from(b - b'0'));
        let headers = read_headers(r, &mut budget).map_err(HeadErr::into_io)?;
        if (100..200).contains(&status) && status != 101 {
            continue;
        }
        let close = has_token(&headers, "connection", "close")
            || (version == "HTTP/1.0" && !has_token(&headers, "connection", "keep-alive"));
        return Ok(Some(Head { status, headers, close }));
    }
    Err(invalid("too many interim responses"))
}

fn framing(method: &str, head: &Head) -> io::Result<Framing> {
    if method.eq_ignore_ascii_case("HEAD") || head.status < 200 || head.status == 204 || head.status == 304 {
        return Ok(Framing::Empty);
    }
    if let Some(te) = find_header(&head.headers, "transfer-encoding") {
        let chunked = te.rsplit(',').next().unwrap_or("").trim().eq_ignore_ascii_case("chunked");
        return Ok(if chunked { Framing::Chunked } else { Framing::UntilEof });
    }
    Ok(content_length(&head.headers).map_err(invalid)?.map_or(Framing::UntilEof, Framing::Length))
}

/// Receives body pieces; returns false to stop.
type OnData<'a> = &'a mut dyn FnMut(&[u8]) -> bool;

/// Deliver the next `n` body bytes (or all until EOF) to `on_data` as they arrive, counting them in
/// `total` against `limit`. Returns false when `on_data` asked to stop.
fn pump<R: BufRead>(
    r: &mut R,
    mut n: u64,
    until_eof: bool,
    total: &mut u64,
    limit: u64,
    on_data: OnData,
) -> io::Result<bool> {
    while n > 0 {
        let buf = match r.fill_buf() {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if buf.is_empty() {
            return if until_eof { Ok(true) } else { Err(eof()) };
        }
        let k = buf.len().min(usize::try_from(n).unwrap_or(usize::MAX));
        *total += k as u64;
        if *total > limit {
            return Err(invalid("response body too large"));
        }
        let go = on_data(&buf[..k]);
        r.consume(k);
        n -= if until_eof { 0 } else { k as u64 };
        if !go {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Read a response body of at most `limit` bytes, delivering it piece by piece. False: stopped early.
fn read_body<R: BufRead>(r: &mut R, framing: &Framing, limit: u64, on_data: OnData) -> io::Result<bool> {
    let mut total = 0;
    match *framing {
        Framing::Empty => Ok(true),
        Framing::Length(n) if n > limit => Err(invalid("response body too large")),
        Framing::Length(n) => pump(r, n, false, &mut total, limit, on_data),
        Framing::UntilEof => pump(r, u64::MAX, true, &mut total, limit, on_data),
        Framing::Chunked => loop {
            let line = read_line(r, &mut 4096).map_err(HeadErr::into_io)?.ok_or_else(eof)?;
            let line = String::from_utf8_lossy(&line);
            let size = line.split(';').next().unwrap_or("").trim();
            if size.is_empty() || size.len() > 15 || !size.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(invalid("malformed chunk size"));
            }
            let size = u64::from_str_radix(size, 16).map_err(|_| invalid("malformed chunk size"))?;
            if size == 0 {
                let mut budget = CLIENT_MAX_HEADER_BYTES; // skip the trailers
                while read_line(r, &mut budget).map_err(HeadErr::into_io)?.is_some_and(|l| !l.is_empty()) {}
                return Ok(true);
            }
            if !pump(r, size, false, &mut total, limit, on_data)? {
                return Ok(false);
            }
            if !matches!(read_line(r, &mut 2), Ok(Some(l)) if l.is_empty()) {
                return Err(invalid("missing line end after chunk"));
            }
        },
    }
}

/// An `on_data` that appends to `out`.
fn collect(out: &mut Vec<u8>) -> impl FnMut(&[u8]) -> bool + '_ {
    |d| {
        out.extend_from_slice(d);
        true
    }
}

/// A keep-alive HTTP/1.1 client over a Unix socket. It reconnects after the server closed the
/// connection, and retries once when a reused connection turns out closed before any response byte.
pub struct Client {
    path: Option<PathBuf>,
    conn: Option<BufReader<UnixStream>>,
    reused: bool,
    last_error: Option<Response>,
    last_headers: Vec<(String, String)>,
}

impl Client {
    /// Connect to the socket at `path`.
    pub fn connect(path: &Path) -> io::Result<Client> {
        let mut c = Client::from_stream(UnixStream::connect(path)?);
        c.path = Some(path.to_path_buf());
        Ok(c)
    }

    /// Wrap a connected stream (no reconnection once it closes).
    pub fn from_stream(stream: UnixStream) -> Client {
        Client { path: None, conn: Some(BufReader::new(stream)), reused: false, last_error: None, last_headers: Vec::new() }
    }

    /// Send a request (with a JSON content type when `body` is given) and read the whole response. Heads
    /// over [`CLIENT_MAX_HEADER_BYTES`] and bodies over [`CLIENT_MAX_BODY_BYTES`] are `InvalidData`.
    pub fn request(&mut self, method: &str, path_and_query: &str, body: Option<&[u8]>) -> io::Result<Response> {
        let head = self.send(method, path_and_query, body)?;
        let mut out = Vec::new();
        self.finish(method, &head, CLIENT_MAX_BODY_BYTES as u64, &mut collect(&mut out))?;
        Ok(Response { status: head.status, headers: head.headers, body: out })
    }

    /// [`Client::request`] with `body` serialized as JSON.
    pub fn request_json<T: Serialize>(&mut self, method: &str, path: &str, body: &T) -> io::Result<Response> {
        let body = serde_json::to_vec(body).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        self.request(method, path, Some(&body))
    }

    /// Send a request and deliver a 2xx response body (chunked, `Content-Length` or until EOF) to `on_data`
    /// piece by piece as it arrives; `on_data` returns false to stop early (the connection is then
    /// dropped). Returns the status. A non-2xx response is buffered instead, for [`Client::take_error`].
    pub fn stream(
        &mut self,
        method: &str,
        path_and_query: &str,
        body: Option<&[u8]>,
        on_data: &mut dyn FnMut(&[u8]) -> bool,
    ) -> io::Result<u16> {
        self.last_error = None;
        let head = self.send(method, path_and_query, body)?;
        self.last_headers = head.headers.clone();
        if (200..300).contains(&head.status) {
            self.finish(method, &head, u64::MAX, on_data)?;
        } else {
            let mut out = Vec::new();
            self.finish(method, &head, CLIENT_MAX_BODY_BYTES as u64, &mut collect(&mut out))?;
            self.last_error = Some(Response { status: head.status, headers: head.headers, body: out });
        }
        Ok(head.status)
    }

    /// Headers of the last response to [`Client::stream`] (names lower-cased).
    pub fn last_header(&self, name: &str) -> Option<&str> {
        self.last_headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }

    /// The non-2xx response of the last [`Client::stream`] call, if any.
    pub fn take_error(&mut self) -> Option<Response> {
        self.last_error.take()
    }

    /// Write the request and read the response head, (re)connecting as needed.
    fn send(&mut self, method: &str, target: &str, body: Option<&[u8]>) -> io::Result<Head> {
        if method.is_empty()
            || !method.bytes().all(is_tchar)
            || !target.starts_with('/')
            || !target.bytes().all(is_vchar)
        {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "invalid method or request target"));
        }
        let mut req = format!("{method} {target} HTTP/1.1\r\nHost: localhost\r\n").into_bytes();
        match body {
            Some(b) => req.extend_from_slice(
                format!("Content-Type: application/json\r\nContent-Length: {}\r\n", b.len()).as_bytes(),
            ),
            None if ["POST", "PUT", "PATCH"].contains(&method) => req.extend_from_slice(b"Content-Length: 0\r\n"),
            None => {}
        }
        req.extend_from_slice(b"\r\n");
        req.extend_from_slice(body.unwrap_or_default());
        loop {
            if self.conn.is_none() {
                let path = self
                    .path
                    .as_ref()
                    .ok_or_else(|| io::Error::new(io::ErrorKind::NotConnected, "connection closed"))?;
                self.conn = Some(BufReader::new(UnixStream::connect(path)?));
                self.reused = false;
            }
            let (reused, Some(conn)) = (self.reused, self.conn.as_mut()) else { continue };
            let result = match conn.get_mut().write_all(&req) {
                Ok(()) => read_response_head(conn),
                Err(e) if matches!(e.kind(), io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset) => Ok(None),
                Err(e) => Err(e),
            };
            if let Ok(Some(head)) = result {
                self.reused = true;
                return Ok(head);
            }
            self.conn = None;
            match result {
                Ok(None) if reused && self.path.is_some() => continue, // stale keep-alive connection
                Ok(_) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "server closed the connection without responding",
                    ))
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Read the body of `head`; keep the connection only if it can be reused.
    fn finish(&mut self, method: &str, head: &Head, limit: u64, on_data: OnData) -> io::Result<()> {
        let Some(conn) = self.conn.as_mut() else { return Err(eof()) };
        let result = framing(method, head).and_then(|f| Ok((read_body(conn, &f, limit, on_data)?, f)));
        if head.close || !matches!(result, Ok((true, Framing::Empty | Framing::Length(_) | Framing::Chunked))) {
            self.conn = None;
        }
        result.map(drop)
    }
}
#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;
    use std::sync::mpsc;
    use std::thread;
    use std::time::Duration;

    fn parse(bytes: &[u8]) -> Result<Option<Request>, HttpError> {
        read_request(&mut &bytes[..])
    }

    fn status_of(bytes: &[u8]) -> u16 {
        match parse(bytes) {
            Err(e) => e.status,
            Ok(r) => panic!("expected an error for {:?}, got {r:?}", String::from_utf8_lossy(bytes)),
        }
    }

    /// Serve requests on `s` until EOF, an error, or `handler` returns false;
    /// yields the number of requests served.
    fn serve<F>(s: UnixStream, mut handler: F) -> thread::JoinHandle<usize>
    where
        F: FnMut(&Request, &mut UnixStream) -> bool + Send + 'static,
    {
        thread::spawn(move || {
            let mut w = s.try_clone().unwrap();
            let mut r = BufReader::new(s);
            let mut n = 0;
            loop {
                match read_request(&mut r) {
                    Ok(Some(req)) => {
                        n += 1;
                        if !handler(&req, &mut w) || !req.keep_alive() {
                            return n;
                        }
                    }
                    Ok(None) => return n,
                    Err(e) => {
                        let _ = write_error(&mut w, e.status, &e.message, false);
                        return n;
                    }
                }
            }
        })
    }

    #[test]
    fn json_round_trip_and_keep_alive() {
        let (a, b) = UnixStream::pair().unwrap();
        let srv = serve(b, |req, w| {
            match (req.method.as_str(), req.path.as_str()) {
                ("POST", "/v1/vms") => {
                    let v: serde_json::Value = req.json().unwrap();
                    write_json(w, 201, &serde_json::json!({ "echo": v, "ct": req.header("Content-Type") }), true)
                }
                _ => write_error(w, 404, &format!("no route for {}", req.path), true),
            }
            .unwrap();
            true
        });
        let mut c = Client::from_stream(a);
        let r = c.request_json("POST", "/v1/vms", &serde_json::json!({ "image": "hello" })).unwrap();
        assert_eq!(r.status, 201);
        let v: serde_json::Value = r.json().unwrap();
        assert_eq!(v["echo"]["image"], "hello");
        assert_eq!(v["ct"], "application/json");
        let r = c.request("GET", "/nope", None).unwrap();
        assert_eq!((r.status, r.error_message().as_str()), (404, "no route for /nope"));
        assert_eq!(r.json::<crate::ErrorBody>().unwrap().error, "no route for /nope");
        drop(c);
        assert_eq!(srv.join().unwrap(), 2, "both requests on one connection");
    }

    #[test]
    fn chunked_streaming_is_incremental() {
        let (a, b) = UnixStream::pair().unwrap();
        let (tx, rx) = mpsc::channel::<()>();
        let srv = serve(b, move |req, w| {
            if req.path == "/after" {
                write_response(w, 204, "text/plain", b"ignored", true).unwrap();
                return true;
            }
            start_chunked(w, 200, "text/plain").unwrap();
            for i in 0..3 {
                write_chunk(w, format!("line {i}\n").as_bytes()).unwrap();
                write_chunk(w, b"").unwrap();
                // The next chunk is only sent once the client has seen this one.
                rx.recv_timeout(Duration::from_secs(10)).expect("chunk not delivered incrementally");
            }
            end_chunked(w).unwrap();
            true
        });
        let mut c = Client::from_stream(a);
        let mut got = Vec::new();
        let status = c
            .stream("GET", "/v1/vms/x/logs?follow=1", None, &mut |d| {
                got.extend_from_slice(d);
                tx.send(()).is_ok()
            })
            .unwrap();
        assert_eq!(status, 200);
        assert_eq!(got, b"line 0\nline 1\nline 2\n");
        // The connection is still usable after the chunked body.
        let r = c.request("GET", "/after", None).unwrap();
        assert_eq!((r.status, r.body.len()), (204, 0));
        drop(c);
        assert_eq!(srv.join().unwrap(), 2);
    }

    #[test]
    fn stream_error_is_kept_not_streamed() {
        let (a, b) = UnixStream::pair().unwrap();
        let srv = serve(b, |_, w| write_error(w, 404, "no such VM", true).is_ok());
        let mut c = Client::from_stream(a);
        let status = c.stream("GET", "/logs", None, &mut |_| panic!("error body streamed")).unwrap();
        assert_eq!(status, 404);
        assert_eq!(c.take_error().unwrap().error_message(), "no such VM");
        drop(c);
        srv.join().unwrap();
    }

    #[test]
    fn connect_reconnect_and_stale_retry() {
        let dir = std::env::temp_dir().join(format!("wisp-http-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let sock = dir.join("api.sock");
        let _ = std::fs::remove_file(&sock);
        let l = UnixListener::bind(&sock).unwrap();
        let srv = thread::spawn(move || {
            for _ in 0..4 {
                let (s, _) = l.accept().unwrap();
                // Claims keep-alive but closes: the client must retry once.
                serve(s, |req, w| {
                    write_response(w, 200, "text/plain", req.path.as_bytes(), true).unwrap();
                    false
                })
                .join()
                .unwrap();
            }
        });
        let mut c = Client::connect(&sock).unwrap();
        for p in ["/one", "/two", "/three"] {
            let r = c.request("GET", p, None).unwrap();
            assert_eq!(r.body, p.as_bytes());
        }
        let mut calls = 0;
        assert_eq!(
            c.stream("GET", "/stop", None, &mut |_| {
                calls += 1;
                false
            })
            .unwrap(),
            200
        );
        assert_eq!(calls, 1);
        srv.join().unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn query_and_percent_decoding() {
        let req =
            parse(b"GET /v1/vms/a%20b%2Fc?name=hello+world%21&flag&&x=%E2%9C%93 HTTP/1.1\r\n\r\n").unwrap().unwrap();
        assert_eq!(req.path, "/v1/vms/a b/c");
        assert_eq!(req.query_param("name"), Some("hello world!"));
        assert_eq!(req.query_param("flag"), Some(""));
        assert_eq!(req.query_param("x"), Some("✓"));
        assert_eq!(req.query.len(), 3);
        let name = "a b/c?&=+ü";
        assert_eq!(percent_decode(&percent_encode(name), true).unwrap(), name);
        // And through a real connection.
        let (a, b) = UnixStream::pair().unwrap();
        let srv = serve(b, |req, w| {
            let v = serde_json::json!({ "path": req.path, "q": req.query_param("q") });
            write_json(w, 200, &v, true).is_ok()
        });
        let mut c = Client::from_stream(a);
        let target = format!("/v1/vms/{}?q={}", percent_encode(name), percent_encode(name));
        let v: serde_json::Value = c.request("GET", &target, None).unwrap().json().unwrap();
        assert_eq!((v["path"].as_str(), v["q"].as_str()), (Some(&*format!("/v1/vms/{name}")), Some(name)));
        drop(c);
        srv.join().unwrap();
    }

    #[test]
    fn parsing_details() {
        assert_eq!(parse(b"").unwrap(), None);
        assert_eq!(parse(b"\r\n\n").unwrap(), None);
        let req = parse(b"\r\nPOST /x HTTP/1.1\nContent-Length: 2\nX-A:  v \t\n\n{}rest").unwrap().unwrap();
        assert_eq!((req.method.as_str(), req.body.as_slice(), req.header("x-a")), ("POST", &b"{}"[..], Some("v")));
        assert!(req.keep_alive());
        assert!(!parse(b"GET / HTTP/1.1\r\nConnection: Close\r\n\r\n").unwrap().unwrap().keep_alive());
        assert!(!parse(b"GET / HTTP/1.0\r\n\r\n").unwrap().unwrap().keep_alive());
        assert!(parse(b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n").unwrap().unwrap().keep_alive());
        // Pipelined requests come out one at a time.
        let mut input = &b"GET /1 HTTP/1.1\r\n\r\nGET /2 HTTP/1.1\r\n\r\n"[..];
        assert_eq!(read_request(&mut input).unwrap().unwrap().path, "/1");
        assert_eq!(read_request(&mut input).unwrap().unwrap().path, "/2");
        assert_eq!(read_request(&mut input).unwrap(), None);
        let json = |b: &[u8]| parse(b).unwrap().unwrap().json::<crate::StopVm>();
        assert_eq!(json(b"POST / HTTP/1.1\r\n\r\n").unwrap_err(), bad("missing JSON body"));
        let e = json(b"POST / HTTP/1.1\r\nContent-Length: 9\r\n\r\n{\"x\": 1}\n").unwrap_err();
        assert!(e.status == 400 && e.message.contains("unknown field"), "{e}");
        assert_eq!(
            json(b"POST / HTTP/1.1\r\nContent-Length: 16\r\n\r\n{\"grace_ms\": 5}\n").unwrap().grace_ms,
            Some(5)
        );
    }

    #[test]
    fn malformed_requests() {
        let big_header = format!("GET / HTTP/1.1\r\nX: {}\r\n\r\n", "a".repeat(MAX_HEADER_BYTES));
        let big_line = format!("GET /{} HTTP/1.1\r\n\r\n", "a".repeat(MAX_HEADER_BYTES));
        let cases: &[(&[u8], u16)] = &[
            (b"GARBAGE\r\n\r\n", 400),
            (b"GET /  HTTP/1.1\r\n\r\n", 400),
            (b"GET / HTTP/1.1 x\r\n\r\n", 400),
            (b"G(T / HTTP/1.1\r\n\r\n", 400),
            (b"GET nope HTTP/1.1\r\n\r\n", 400),
            (b"GET /\xff HTTP/1.1\r\n\r\n", 400),
            (b"GET /%zz HTTP/1.1\r\n\r\n", 400),
            (b"GET /%ff HTTP/1.1\r\n\r\n", 400),
            (b"GET /%00 HTTP/1.1\r\n\r\n", 400),
            (b"GET /?a=%4 HTTP/1.1\r\n\r\n", 400),
            (b"GET / HTTP/1.1\r\nNoColon\r\n\r\n", 400),
            (b"GET / HTTP/1.1\r\nBad Name: x\r\n\r\n", 400),
            (b"GET / HTTP/1.1\r\n: x\r\n\r\n", 400),
            (b"GET / HTTP/1.1\r\nX: \xff\xfe\r\n\r\n", 400),
            (b"GET / HTTP/1.1\r\nX: a\rb\r\n\r\n", 400),
            (b"GET / HTTP/1.1\r\nX: a\r\n folded\r\n\r\n", 400),
            (big_header.as_bytes(), 431),
            (big_line.as_bytes(), 431),
            (b"POST / HTTP/1.1\r\nContent-Length: 1048577\r\n\r\n", 413),
            (b"POST / HTTP/1.1\r\nContent-Length: 99999999999999999999999\r\n\r\n", 413),
            (b"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 411),
            (b"POST / HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 411),
            (b"POST / HTTP/1.1\r\nContent-Length: abc\r\n\r\n", 400),
            (b"POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n", 400),
            (b"POST / HTTP/1.1\r\nContent-Length: 1, 1\r\n\r\n", 400),
            (b"POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab", 400),
            (b"GET / HTTP/2.0\r\n\r\n", 505),
            (b"GET / HTTP/3\r\n\r\n", 505),
            (b"GET / HTTP/x\r\n\r\n", 400),
            (b"GET / FTP/1.0\r\n\r\n", 400),
            (b"GET / HTTP/1.1\r\nHost: x", 400),
            (b"GET / HTTP/1.1", 400),
            (b"POST / HTTP/1.1\r\nContent-Length: 10\r\n\r\nabc", 400),
        ];
        for (input, want) in cases {
            assert_eq!(status_of(input), *want, "{:?}", String::from_utf8_lossy(&input[..input.len().min(80)]));
        }
        assert_eq!(parse(b"POST / HTTP/1.1\r\nContent-Length: 3\r\n\r\nab").unwrap_err(), bad("incomplete request"));

        /// Yields its bytes once, then fails.
        struct Flaky(&'static [u8]);
        impl Read for Flaky {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                match std::mem::take(&mut self.0) {
                    [] => Err(io::Error::new(io::ErrorKind::ConnectionReset, "reset")),
                    b => {
                        let n = b.len().min(buf.len());
                        buf[..n].copy_from_slice(&b[..n]);
                        Ok(n)
                    }
                }
            }
        }
        let e = read_request(&mut BufReader::new(Flaky(b"GET / HTTP/1.1\r\nHo"))).unwrap_err();
        assert_eq!(e, bad("incomplete request"));
        assert_eq!(read_request(&mut BufReader::new(Flaky(b""))).unwrap(), None);
    }

    #[test]
    fn client_limits_and_bad_responses() {
        let huge_head = format!("HTTP/1.1 200 OK\r\nX: {}\r\n\r\n", "a".repeat(CLIENT_MAX_HEADER_BYTES));
        let cases: Vec<Vec<u8>> = vec![
            huge_head.into_bytes(),
            b"HTTP/1.1 200 OK\r\nContent-Length: 100000000\r\n\r\n".to_vec(),
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n".to_vec(),
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nfffffffffffffff\r\nab".to_vec(),
            b"HTTP/1.1 2000 OK\r\n\r\n".to_vec(),
            b"SSH-2.0-hello\r\n\r\n".to_vec(),
        ];
        for raw in cases {
            let (a, b) = UnixStream::pair().unwrap();
            let srv = serve(b, move |_, w| {
                let _ = w.write_all(&raw);
                false
            });
            let e = Client::from_stream(a).request("GET", "/", None).unwrap_err();
            assert!(matches!(e.kind(), io::ErrorKind::InvalidData | io::ErrorKind::UnexpectedEof), "{e:?}");
            srv.join().unwrap();
        }
        // 1xx is skipped, an EOF-delimited body is read to the end.
        let (a, b) = UnixStream::pair().unwrap();
        let srv = serve(b, |_, w| {
            let _ = w.write_all(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.0 200 OK\r\n\r\nuntil eof");
            false
        });
        let r = Client::from_stream(a).request("PUT", "/", None).unwrap();
        assert_eq!((r.status, r.body.as_slice()), (200, &b"until eof"[..]));
        srv.join().unwrap();
        let mut c = Client::from_stream(UnixStream::pair().unwrap().0);
        assert_eq!(c.request("GET", "no-slash", None).unwrap_err().kind(), io::ErrorKind::InvalidInput);
        assert_eq!(c.request("GET", "/a b", None).unwrap_err().kind(), io::ErrorKind::InvalidInput);
        let empty = Response { status: 503, ..Default::default() };
        assert_eq!(empty.error_message(), "Service Unavailable");
        assert_eq!(Response { body: b" oops\n".to_vec(), ..empty }.error_message(), "oops");
    }

    #[test]
    fn random_input_never_panics() {
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let seeds: [&[u8]; 4] = [
            b"POST /v1/vms?a=b%20c&d HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello",
            b"GET /v1/vms/%E2%9C%93 HTTP/1.0\nConnection: keep-alive\n\n",
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5;x=y\r\nhello\r\n0\r\nT: 1\r\n\r\n",
            b"HTTP/1.1 404 Not Found\r\nContent-Length: 17\r\n\r\n{\"error\":\"nope\"}\n",
        ];
        let alphabet = b" :\r\n\r\n%?&=/+;HTTP/1.01GETPOST0123456789abcdefContent-Length\t\xff\x00";
        for i in 0..5000 {
            let input: Vec<u8> = if i % 3 == 0 {
                (0..next() % 300).map(|_| next() as u8).collect()
            } else if i % 3 == 1 {
                (0..next() % 300).map(|_| alphabet[(next() % alphabet.len() as u64) as usize]).collect()
            } else {
                let mut v = seeds[(next() % 4) as usize].to_vec();
                for _ in 0..1 + next() % 4 {
                    let pos = (next() % (v.len() as u64 + 1)) as usize;
                    match next() % 3 {
                        0 if pos < v.len() => v[pos] = next() as u8,
                        1 if pos < v.len() => drop(v.remove(pos)),
                        _ => v.insert(pos, alphabet[(next() % alphabet.len() as u64) as usize]),
                    }
                }
                v
            };
            let mut r = &input[..];
            for _ in 0..4 {
                match read_request(&mut r) {
                    Ok(Some(req)) => assert!(req.body.len() <= MAX_BODY_BYTES && req.path.starts_with('/')),
                    Ok(None) => break,
                    Err(e) => {
                        assert!((400..=505).contains(&e.status), "{e}");
                        break;
                    }
                }
            }
            // The client-side parsers, on the same input.
            let mut r = &input[..];
            if let Ok(Some(head)) = read_response_head(&mut r) {
                if let Ok(f) = framing("GET", &head) {
                    let _ = read_body(&mut r, &f, 1 << 16, &mut |_| true);
                }
            }
        }
    }
}
