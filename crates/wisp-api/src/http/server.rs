//! The server side: read one request (its head parsed by `httparse`), write responses (whole, JSON,
//! errors, chunked streams).

use serde::{de::DeserializeOwned, Serialize};
use std::io::{self, BufRead, Read, Write};

use super::common::{
    bad, content_length, find_header, has_token, is_tchar, is_vchar, owned_headers, percent_decode, read_head, reason,
    HeadErr, HttpError, MAX_BODY_BYTES, MAX_HEADERS, MAX_HEADER_BYTES,
};

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

/// Why `httparse` refused a request head, in the words of the checks it replaced: the request line is
/// diagnosed first (method, target, version: 505 for an HTTP version other than 1.x), then the header
/// lines.
fn head_error(e: httparse::Error, head: &[u8]) -> HttpError {
    if e == httparse::Error::TooManyHeaders {
        return HttpError::new(431, format!("too many header fields (limit {MAX_HEADERS})"));
    }
    let mut lines = head.split(|&b| b == b'\n').map(|l| l.strip_suffix(b"\r").unwrap_or(l));
    let first = lines.next().unwrap_or_default();
    if let Err(e) = diagnose_request_line(first) {
        return e;
    }
    let rest: Vec<&[u8]> = lines.filter(|l| !l.is_empty()).collect();
    if rest.iter().any(|l| l.starts_with(b" ") || l.starts_with(b"\t")) {
        return bad("obsolete header line folding is not supported");
    }
    match e {
        httparse::Error::HeaderValue => bad("invalid character in header value"),
        _ if rest.iter().any(|l| !l.contains(&b':')) => bad("malformed header line"),
        httparse::Error::HeaderName => bad("invalid header name"),
        _ => bad("malformed request head"),
    }
}

/// What is wrong with a request line that `httparse` refused, if it is the request line.
fn diagnose_request_line(line: &[u8]) -> Result<(), HttpError> {
    let s = std::str::from_utf8(line).map_err(|_| bad("request line is not valid UTF-8"))?;
    let mut it = s.split(' ');
    let (Some(method), Some(target), Some(version), None) = (it.next(), it.next(), it.next(), it.next()) else {
        return Err(bad("malformed request line"));
    };
    if !matches!(version, "HTTP/1.1" | "HTTP/1.0") {
        let n = version.strip_prefix("HTTP/").unwrap_or("");
        let numeric = n.starts_with(|c: char| c.is_ascii_digit()) && n.bytes().all(|b| b.is_ascii_digit() || b == b'.');
        return Err(match numeric && n.len() <= 3 {
            true => HttpError::new(505, format!("unsupported HTTP version {version}")),
            false => bad("malformed request line"),
        });
    }
    if method.is_empty() || !method.bytes().all(is_tchar) {
        return Err(bad("invalid method"));
    }
    parse_target(target).map(drop)
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
/// `Expect: 100-continue` is not answered here (there is no writer; see [`read_request_with`]) but
/// any other expectation is refused with 417.
pub fn read_request<R: BufRead>(r: &mut R) -> Result<Option<Request>, HttpError> {
    read(r, None)
}

/// [`read_request`] on a connection: a request with `Expect: 100-continue` and a body gets its
/// `100 Continue` on `w` once the head has been accepted, before the body is read (a head refused with
/// 411, 413 or 417 gets no `100`: the final answer comes instead).
pub fn read_request_with<R: BufRead>(r: &mut R, w: &mut dyn Write) -> Result<Option<Request>, HttpError> {
    read(r, Some(w))
}

fn read<R: BufRead>(r: &mut R, interim: Option<&mut dyn Write>) -> Result<Option<Request>, HttpError> {
    let mut budget = MAX_HEADER_BYTES;
    let head = match read_head(r, &mut budget) {
        Ok(Some(head)) => head,
        Ok(None) => return Ok(None),
        Err(HeadErr::Io(_)) if budget == MAX_HEADER_BYTES => return Ok(None),
        Err(HeadErr::Io(_)) => return Err(bad("incomplete request")),
        Err(HeadErr::TooLong) => {
            return Err(HttpError::new(431, format!("request head too large (limit {MAX_HEADER_BYTES} bytes)")))
        }
    };
    let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let mut parsed = httparse::Request::new(&mut slots);
    match parsed.parse(&head) {
        Ok(httparse::Status::Complete(n)) if n == head.len() => {}
        Ok(_) => return Err(bad("malformed request head")),
        Err(e) => return Err(head_error(e, &head)),
    }
    let (method, target) = (parsed.method.unwrap_or_default(), parsed.path.unwrap_or_default());
    let http10 = parsed.version == Some(0);
    let (path, query) = parse_target(target)?;
    let mut headers = owned_headers(parsed.headers).map_err(bad)?;
    if find_header(&headers, "transfer-encoding").is_some() {
        return Err(HttpError::new(411, "Transfer-Encoding request bodies are not supported; send Content-Length"));
    }
    let len = content_length(&headers).map_err(bad)?.unwrap_or(0);
    if len > MAX_BODY_BYTES as u64 {
        return Err(HttpError::new(413, format!("request body too large ({len} bytes; limit {MAX_BODY_BYTES})")));
    }
    // RFC 9110 10.1.1: 100-continue is the one expectation; an HTTP/1.0 request's is ignored.
    if !http10 {
        for (_, v) in headers.iter().filter(|(n, _)| n == "expect") {
            if !v.eq_ignore_ascii_case("100-continue") {
                return Err(HttpError::new(417, format!("unsupported expectation '{v}' (only 100-continue is)")));
            }
        }
        if let (Some(w), true) = (interim, len > 0 && has_token(&headers, "expect", "100-continue")) {
            if w.write_all(b"HTTP/1.1 100 Continue\r\n\r\n").and_then(|()| w.flush()).is_err() {
                return Err(bad("incomplete request"));
            }
        }
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

/// Status line plus `Content-Type` (control characters stripped); a status outside 100..=599 is sent as 500.
fn response_head(status: u16, content_type: &str) -> Vec<u8> {
    let status = if (100..=599).contains(&status) { status } else { 500 };
    let ct: String = content_type.chars().filter(|c| !c.is_control()).collect();
    format!("HTTP/1.1 {status} {}\r\nContent-Type: {ct}\r\n", reason(status)).into_bytes()
}

/// [`response_head`] followed by the `extra` header fields.
fn response_head_with(status: u16, content_type: &str, extra: &[(&str, &str)]) -> Vec<u8> {
    let mut out = response_head(status, content_type);
    for (k, v) in extra {
        out.extend_from_slice(format!("{k}: {v}\r\n").as_bytes());
    }
    out
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
    write_response_with(w, status, content_type, &[], body, keep_alive)
}

/// [`write_response`] with `extra` header fields.
pub fn write_response_with<W: Write>(
    w: &mut W,
    status: u16,
    content_type: &str,
    extra: &[(&str, &str)],
    body: &[u8],
    keep_alive: bool,
) -> io::Result<()> {
    let mut out = response_head_with(status, content_type, extra);
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
    w.write_all(&chunked_head(status, content_type, extra))?;
    w.flush()
}

/// The head [`start_chunked_with`] writes, as bytes (for a writer elsewhere: the daemon hands an
/// attached client's connection to the VMM process, which writes it).
pub fn chunked_head(status: u16, content_type: &str, extra: &[(&str, &str)]) -> Vec<u8> {
    let mut out = response_head_with(status, content_type, extra);
    out.extend_from_slice(b"Transfer-Encoding: chunked\r\n\r\n");
    out
}

/// One chunk's frame around `data` (empty for empty `data`: an empty chunk would end the body).
pub fn chunk_frame(data: &[u8], out: &mut Vec<u8>) {
    out.clear();
    if !data.is_empty() {
        out.extend_from_slice(format!("{:x}\r\n", data.len()).as_bytes());
        out.extend_from_slice(data);
        out.extend_from_slice(b"\r\n");
    }
}

/// What ends a chunked body.
pub const LAST_CHUNK: &[u8] = b"0\r\n\r\n";

/// The last chunk of a VM's console response with its exit status as
/// trailer fields: `X-Wisp-Exit` (the code) and `X-Wisp-Exit-Reason`
/// (control characters left out).
pub fn exit_trailer(code: i32, reason: &str) -> Vec<u8> {
    let reason: String = reason.chars().filter(|c| !c.is_control()).collect();
    format!("0\r\nX-Wisp-Exit: {code}\r\nX-Wisp-Exit-Reason: {reason}\r\n\r\n").into_bytes()
}

/// Send one chunk and flush; empty `data` is a no-op (an empty chunk would end the body).
pub fn write_chunk<W: Write>(w: &mut W, data: &[u8]) -> io::Result<()> {
    if data.is_empty() {
        return Ok(());
    }
    let mut out = Vec::with_capacity(data.len() + 12);
    chunk_frame(data, &mut out);
    w.write_all(&out)?;
    w.flush()
}

/// End a chunked body, and flush.
pub fn end_chunked<W: Write>(w: &mut W) -> io::Result<()> {
    w.write_all(LAST_CHUNK)?;
    w.flush()
}
