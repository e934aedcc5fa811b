//! The client side: a keep-alive HTTP/1.1 client over a Unix socket and its response reader (heads and
//! chunk sizes parsed by `httparse`).

use serde::{de::DeserializeOwned, Serialize};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};

use super::common::{
    content_length, eof, find_header, has_token, invalid, is_tchar, is_vchar, owned_headers, read_head, read_line,
    reason, HeadErr, HttpError, CLIENT_MAX_BODY_BYTES, CLIENT_MAX_HEADER_BYTES, MAX_HEADERS,
};

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
pub(super) enum Framing {
    Empty,
    Length(u64),
    Chunked,
    UntilEof,
}

/// A response head; `close`: the server will close the connection after the body.
pub(super) struct Head {
    status: u16,
    headers: Vec<(String, String)>,
    close: bool,
}

/// Read a response head (parsed by `httparse`), skipping interim 1xx responses. `Ok(None)`: EOF or I/O
/// error before any byte.
pub(super) fn read_response_head<R: BufRead>(r: &mut R) -> io::Result<Option<Head>> {
    for round in 0..8 {
        let mut budget = CLIENT_MAX_HEADER_BYTES;
        let raw = match read_head(r, &mut budget) {
            Ok(Some(h)) => h,
            Ok(None) if round == 0 => return Ok(None),
            Err(HeadErr::Io(_)) if round == 0 && budget == CLIENT_MAX_HEADER_BYTES => return Ok(None),
            Ok(None) => return Err(eof()),
            Err(e) => return Err(e.into_io()),
        };
        let mut slots = [httparse::EMPTY_HEADER; MAX_HEADERS];
        let mut parsed = httparse::Response::new(&mut slots);
        match parsed.parse(&raw) {
            Ok(httparse::Status::Complete(_)) => {}
            Err(httparse::Error::TooManyHeaders) => return Err(invalid("too many response header fields")),
            Err(httparse::Error::Version | httparse::Error::Status) => return Err(invalid("malformed status line")),
            _ => return Err(invalid("malformed response head")),
        }
        let (status, http10) = (parsed.code.unwrap_or_default(), parsed.version == Some(0));
        let headers = owned_headers(parsed.headers).map_err(invalid)?;
        if (100..200).contains(&status) && status != 101 {
            continue;
        }
        let close = has_token(&headers, "connection", "close")
            || (http10 && !has_token(&headers, "connection", "keep-alive"));
        return Ok(Some(Head { status, headers, close }));
    }
    Err(invalid("too many interim responses"))
}

pub(super) fn framing(method: &str, head: &Head) -> io::Result<Framing> {
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
#[cfg(test)]
pub(super) fn read_body<R: BufRead>(r: &mut R, framing: &Framing, limit: u64, on_data: OnData) -> io::Result<bool> {
    read_body_trailers(r, framing, limit, on_data, &mut Vec::new())
}

/// [`read_body`], with a chunked body's trailer fields (names lower-cased,
/// values trimmed; lines that are no field are left out) added to `trailers`.
pub(super) fn read_body_trailers<R: BufRead>(r: &mut R, framing: &Framing, limit: u64, on_data: OnData, trailers: &mut Vec<(String, String)>) -> io::Result<bool> {
    let mut total = 0;
    match *framing {
        Framing::Empty => Ok(true),
        Framing::Length(n) if n > limit => Err(invalid("response body too large")),
        Framing::Length(n) => pump(r, n, false, &mut total, limit, on_data),
        Framing::UntilEof => pump(r, u64::MAX, true, &mut total, limit, on_data),
        Framing::Chunked => loop {
            let mut line = read_line(r, &mut 4096).map_err(HeadErr::into_io)?.ok_or_else(eof)?;
            let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
            if digits == 0 || digits > 15 {
                return Err(invalid("malformed chunk size"));
            }
            line.extend_from_slice(b"\r\n");
            let size = match httparse::parse_chunk_size(&line) {
                Ok(httparse::Status::Complete((_, size))) => size,
                _ => return Err(invalid("malformed chunk size")),
            };
            if size == 0 {
                let mut budget = CLIENT_MAX_HEADER_BYTES;
                while let Some(l) = read_line(r, &mut budget).map_err(HeadErr::into_io)?.filter(|l| !l.is_empty()) {
                    let l = String::from_utf8_lossy(&l);
                    if let Some((k, v)) = l.split_once(':').filter(|_| trailers.len() < MAX_HEADERS) {
                        trailers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()));
                    }
                }
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

/// A keep-alive HTTP/1.1 client over a Unix socket. It reconnects when the server has closed the
/// connection, and never sends a request twice when the first one may have reached the server:
/// - before a request goes out on a reused connection, the connection is checked (a non-blocking
///   peek): one the server has closed, or one holding bytes nobody asked for, is replaced by a new one;
/// - a request is sent again (once, on a new connection) only when the kernel took none of its bytes
///   on a reused connection (its first `write` failed: the server had closed the connection), or when
///   its method is safe (GET, HEAD: RFC 9110 9.2.1, there is no effect to repeat) and a reused
///   connection ended before any byte of the response;
/// - otherwise a request whose bytes left and that got no answer is an `UnexpectedEof` error, and not
///   sent again: a POST that created a VM before the connection broke must not create a second one.
///
/// When the server closes the connection while the request is being written, its answer (a 503 at
/// its connection cap, a 403) is still read.
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
        self.stream_with_head(method, path_and_query, body, &mut |_| {}, on_data)
    }

    /// [`Client::stream`], with `on_head` given a 2xx response's headers
    /// before its body.
    pub fn stream_with_head(
        &mut self,
        method: &str,
        path_and_query: &str,
        body: Option<&[u8]>,
        on_head: &mut dyn FnMut(&[(String, String)]),
        on_data: &mut dyn FnMut(&[u8]) -> bool,
    ) -> io::Result<u16> {
        self.last_error = None;
        let head = self.send(method, path_and_query, body)?;
        self.last_headers = head.headers.clone();
        if (200..300).contains(&head.status) {
            on_head(&head.headers);
            self.finish(method, &head, u64::MAX, on_data)?;
        } else {
            let mut out = Vec::new();
            self.finish(method, &head, CLIENT_MAX_BODY_BYTES as u64, &mut collect(&mut out))?;
            self.last_error = Some(Response { status: head.status, headers: head.headers, body: out });
        }
        Ok(head.status)
    }

    /// Send a bodiless request that asks for the connection (`Upgrade`): on
    /// `101 Switching Protocols` the raw connection, else the status (the
    /// answer is kept for [`Client::take_error`]).
    pub fn upgrade(&mut self, method: &str, path_and_query: &str) -> io::Result<Result<UnixStream, u16>> {
        self.last_error = None;
        let head = self.send(method, path_and_query, None)?;
        if head.status == 101 {
            let conn = self.conn.take().ok_or_else(|| io::Error::new(io::ErrorKind::NotConnected, "connection closed"))?;
            if !conn.buffer().is_empty() {
                return Err(io::Error::new(io::ErrorKind::InvalidData, "bytes after a 101 response's head"));
            }
            return Ok(Ok(conn.into_inner()));
        }
        let mut out = Vec::new();
        self.finish(method, &head, CLIENT_MAX_BODY_BYTES as u64, &mut collect(&mut out))?;
        self.last_error = Some(Response { status: head.status, headers: head.headers, body: out });
        Ok(Err(head.status))
    }

    /// First header named `name` (case-insensitive) of the last response to
    /// [`Client::stream`], or of its trailer (after its chunked body).
    pub fn last_header(&self, name: &str) -> Option<&str> {
        find_header(&self.last_headers, name)
    }

    /// The exit status the last [`Client::stream`]ed VM console ended
    /// with (`X-Wisp-Exit`, `X-Wisp-Exit-Reason`: [`super::exit_trailer`]),
    /// if it came.
    pub fn exit_trailer(&self) -> Option<crate::ExitInfo> {
        let code = self.last_header("x-wisp-exit")?.parse().ok()?;
        let reason = self.last_header("x-wisp-exit-reason").unwrap_or("exited").to_string();
        Some(crate::ExitInfo { code, reason })
    }

    /// The non-2xx response of the last [`Client::stream`] call, if any.
    pub fn take_error(&mut self) -> Option<Response> {
        self.last_error.take()
    }

    /// Write the request and read the response head, (re)connecting as needed (see [`Client`] for when
    /// a request is sent again).
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
        let safe = matches!(method, "GET" | "HEAD");
        loop {
            if self.reused && !self.conn.as_ref().is_some_and(still_open) {
                self.conn = None;
            }
            if self.conn.is_none() {
                let path = self
                    .path
                    .as_ref()
                    .ok_or_else(|| io::Error::new(io::ErrorKind::NotConnected, "connection closed"))?;
                self.conn = Some(BufReader::new(UnixStream::connect(path)?));
                self.reused = false;
            }
            let (reused, can_reconnect) = (self.reused, self.path.is_some());
            let Some(conn) = self.conn.as_mut() else { continue };
            let (sent, written) = write_counting(conn.get_mut(), &req);
            let result = match written {
                Ok(()) => read_response_head(conn),
                // Not one byte left: the server had closed this idle connection. Nothing to repeat.
                Err(e) if closed(&e) && sent == 0 && reused && can_reconnect => {
                    self.conn = None;
                    self.reused = false;
                    continue;
                }
                // Closed while we wrote: the server may have answered first (its cap, a refusal).
                Err(e) if closed(&e) => match read_response_head(conn) {
                    Ok(Some(head)) => Ok(Some(head)),
                    _ => Err(io::Error::new(
                        e.kind(),
                        format!(
                            "the server closed the connection while the request was being sent ({sent} of {} bytes \
                             sent); it was not sent again",
                            req.len()
                        ),
                    )),
                },
                Err(e) => Err(e),
            };
            match result {
                Ok(Some(head)) => {
                    self.reused = true;
                    return Ok(head);
                }
                // A safe request on a connection the server closed as we used it: no effect to repeat.
                Ok(None) if reused && safe && can_reconnect => {
                    self.conn = None;
                    self.reused = false;
                }
                Ok(None) => {
                    self.conn = None;
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "server closed the connection without responding (the request may have been \
                         processed; it was not sent again)",
                    ));
                }
                Err(e) => {
                    self.conn = None;
                    return Err(e);
                }
            }
        }
    }

    /// Read the body of `head`; keep the connection only if it can be reused.
    fn finish(&mut self, method: &str, head: &Head, limit: u64, on_data: OnData) -> io::Result<()> {
        let Some(conn) = self.conn.as_mut() else { return Err(eof()) };
        let trailers = &mut self.last_headers;
        let result = framing(method, head).and_then(|f| Ok((read_body_trailers(conn, &f, limit, on_data, trailers)?, f)));
        if head.close || !matches!(result, Ok((true, Framing::Empty | Framing::Length(_) | Framing::Chunked))) {
            self.conn = None;
        }
        result.map(drop)
    }
}

/// Whether a write error means the peer has closed the connection.
fn closed(e: &io::Error) -> bool {
    matches!(e.kind(), io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset)
}

/// Write all of `buf`, returning how many bytes the kernel took along with the outcome.
fn write_counting(s: &mut UnixStream, buf: &[u8]) -> (usize, io::Result<()>) {
    let mut sent = 0;
    while sent < buf.len() {
        match s.write(&buf[sent..]) {
            Ok(0) => return (sent, Err(io::ErrorKind::WriteZero.into())),
            Ok(n) => sent += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return (sent, Err(e)),
        }
    }
    (sent, Ok(()))
}

/// Whether a kept-alive connection can carry the next request: nothing unread in our buffer, and the
/// socket neither closed by the server nor holding bytes nobody asked for (a non-blocking read; a byte
/// it takes is one nobody asked for, and the connection is dropped anyway).
fn still_open(conn: &BufReader<UnixStream>) -> bool {
    if !conn.buffer().is_empty() {
        return false;
    }
    let mut s = conn.get_ref();
    let mut byte = [0u8; 1];
    let idle = s.set_nonblocking(true).is_ok()
        && matches!(s.read(&mut byte), Err(ref e) if e.kind() == io::ErrorKind::WouldBlock);
    s.set_nonblocking(false).is_ok() && idle
}
