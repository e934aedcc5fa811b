//! `cache [PORT]`: the content cache (after MiniCache): an HTTP/1.1
//! server (port 80 by default) of the objects of the SHFS volume on the
//! VM's first disk (`wisp run --volume cache.img:ro --net -p 8080:80
//! cache`; fill it with `wisp shfs`). `GET` and `HEAD` by digest
//! (`/<64 hex digits>`) or by name; keep-alive and pipelining; `Range`
//! (one range: 206, several: 206 `multipart/byteranges`, none satisfiable:
//! 416); `ETag` (the digest) and `Last-Modified`, with `If-None-Match` and
//! `If-Modified-Since` (304); `Cache-Control` (`CACHE_MAX_AGE` seconds in
//! the environment, default 3600) and `Content-Type`; 400, 404, 405, 414
//! and 431 where they apply; 408 for a request that does not come whole
//! within `CACHE_REQUEST_TIMEOUT_MS` (default 10 s). Link objects are fetched from their upstream
//! on the first request, streamed to every client that asks meanwhile
//! (one upstream read), and stored on a writable volume (`upstream.rs`;
//! 502/504 when the upstream fails or does not answer within
//! `CACHE_UPSTREAM_TIMEOUT_MS`, default 10 s). A volume that is not SHFS, damaged or
//! truncated is refused at mount (exit 1, the reason on stderr).
#![no_std]
#![no_main]

extern crate alloc;

mod shell;
mod store;
mod upstream;

use alloc::format;
use alloc::rc::Rc;
use alloc::string::String;
use alloc::vec::Vec;
use core::cell::RefCell;

use httpcache::Ranges;
use shfs::Kind;
use store::{Store, CACHE_OBJECT_MAX, PIECE};
use shell::Totals;
use upstream::{Fetches, State};
use wisp::net::{TcpListener, TcpOptions, TcpStream};

wisp::main!(main, wisp::Manifest::new().nic(true));

/// Longest request line (else 414) and request head (else 431).
const MAX_LINE: usize = 8 << 10;
const MAX_HEAD: usize = 16 << 10;
/// Most header fields of a request (else 431).
const MAX_HEADERS: usize = 64;
/// Largest request body (a shell command).
const MAX_BODY: usize = 4096;

/// What every connection shares.
struct Cache {
    store: Rc<RefCell<Store>>,
    fetches: Rc<Fetches>,
    totals: RefCell<Totals>,
    max_age: u64,
    /// Longest wait for the rest of a request (`CACHE_REQUEST_TIMEOUT_MS`,
    /// default 10 s).
    request_timeout: core::time::Duration,
}

fn main() -> i32 {
    let (port, cfg) = match wisp::net::server_args("cache", 1, 80) {
        Ok(x) => x,
        Err(code) => return code,
    };
    let Some(disk) = wisp::blk::disk() else {
        wisp::eprintln!("cache: no volume (run with --volume cache.img[:ro], made with wisp shfs mkfs)");
        return 1;
    };
    // A quarter of the heap caches objects.
    let info = wisp::env::boot_info();
    let budget = (info.heap_end - info.heap_start) / 4;
    let store = match Store::mount(disk, budget) {
        Ok(s) => s,
        Err(e) => {
            wisp::eprintln!("cache: cannot mount the volume: {}", e);
            return 1;
        }
    };
    let max_age: u64 = wisp::env::var("CACHE_MAX_AGE").and_then(|v| v.parse().ok()).unwrap_or(3600);
    // Large send buffers (a 100 KB object leaves in two 64 KiB segments,
    // not in seven windows' worth) and a deep backlog cost nothing until
    // used: the library OS backs their pages lazily and gives connections
    // smaller buffers when the heap runs short.
    let envn = |var: &str, default: usize| wisp::env::var(var).and_then(|v| v.parse().ok()).unwrap_or(default);
    let opts = TcpOptions {
        nodelay: true,
        backlog: envn("CACHE_BACKLOG", 64),
        tx_buffer: envn("CACHE_SEND_BUFFER", 256 << 10),
        ..TcpOptions::default()
    };
    let listener = match TcpListener::bind_app("cache", port, opts) {
        Ok(l) => l,
        Err(code) => return code,
    };
    wisp::println!("cache: serving {} objects on {}:{}", store.len(), cfg.ip, port);
    let ms = |var: &str, default: u64| core::time::Duration::from_millis(wisp::env::var(var).and_then(|v| v.parse().ok()).unwrap_or(default));
    let cache = Rc::new(Cache {
        store: Rc::new(RefCell::new(store)),
        fetches: Rc::new(Fetches::default()),
        totals: RefCell::new(Totals::default()),
        max_age,
        request_timeout: ms("CACHE_REQUEST_TIMEOUT_MS", 10_000),
    });
    // The operator's shell on the console (standard input), beside the server.
    let c = cache.clone();
    wisp::exec::spawn(async move {
        let mut line = String::new();
        while wisp::stdin::read_line_async(&mut line).await > 0 {
            let a = shell::run(&line, &c.store, &c.totals.borrow());
            wisp::print!("{}", a.text);
            if a.halt {
                wisp::exit(0);
            }
            line.clear();
        }
    });
    // Statistics written back to a writable volume every
    // CACHE_STATS_SECONDS (default 60; 0: only at `halt`), those that
    // changed.
    let every = wisp::env::var("CACHE_STATS_SECONDS").and_then(|v| v.parse::<u64>().ok()).unwrap_or(60);
    if every > 0 && !cache.store.borrow().disk.read_only() {
        let store = cache.store.clone();
        wisp::exec::spawn(async move {
            loop {
                wisp::exec::sleep(core::time::Duration::from_secs(every)).await;
                if let Err(e) = store.borrow_mut().save_changed_stats() {
                    wisp::eprintln!("cache: writing statistics back: {}", e);
                }
            }
        });
    }
    listener.serve_app("cache", move |conn| serve(conn, cache.clone()))
}

/// Serve one connection: requests as they come (pipelined ones in order)
/// until the client closes or asks to.
async fn serve(conn: TcpStream, cache: Rc<Cache>) {
    let mut buf: Vec<u8> = Vec::with_capacity(4096);
    let mut chunk = [0u8; 4096];
    loop {
        // Every complete request in the buffer, in order.
        loop {
            // The request line's and the head's bounds hold whether or
            // not the rest has come.
            let line_end = buf.windows(2).position(|w| w == b"\r\n");
            if line_end.map_or(buf.len(), |i| i) > MAX_LINE {
                return error(&conn, 414, "the request line is too long").await;
            }
            let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
            let mut req = httparse::Request::new(&mut headers);
            match req.parse(&buf) {
                Ok(httparse::Status::Complete(n)) if n > MAX_HEAD => {
                    return error(&conn, 431, "the request head is too large").await;
                }
                Ok(httparse::Status::Complete(n)) => {
                    // A body (a shell command) comes whole first.
                    let len = match header(&req, "Content-Length").map(|v| v.trim().parse::<usize>()) {
                        None => 0,
                        Some(Ok(l)) if l <= MAX_BODY => l,
                        Some(_) => return error(&conn, 400, "a request body of at most 4 KiB").await,
                    };
                    if buf.len() < n + len {
                        break;
                    }
                    let keep = respond(&conn, &req, &buf[n..n + len], &cache).await;
                    buf.drain(..n + len);
                    if !keep {
                        return;
                    }
                }
                Ok(httparse::Status::Partial) => {
                    if buf.len() > MAX_HEAD {
                        return error(&conn, 431, "the request head is too large").await;
                    }
                    break;
                }
                Err(httparse::Error::TooManyHeaders) => return error(&conn, 431, "too many header fields").await,
                Err(e) => return error(&conn, 400, &format!("malformed request: {}", e)).await,
            }
        }
        // The rest of a request that has begun must come within the
        // request timeout (else 408: a client that trickles its head holds
        // nothing for long). Between requests no timer is armed (one per
        // read would cost every request a timer); an idle connection stays
        // until its client closes it.
        let read = if buf.is_empty() {
            Some(conn.read(&mut chunk).await)
        } else {
            wisp::exec::timeout(cache.request_timeout, conn.read(&mut chunk)).await
        };
        match read {
            None => return error(&conn, 408, "the request did not come in time").await,
            Some(Ok(0)) | Some(Err(_)) => return,
            Some(Ok(n)) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// Answer with an error and close.
async fn error(conn: &TcpStream, status: u16, msg: &str) {
    let body = format!("{}\n", msg);
    let head = httpcache::head(status, &[("Content-Type", "text/plain")], body.len() as u64, false);
    let _ = conn.write_all(head.as_bytes()).await;
    let _ = conn.write_all(body.as_bytes()).await;
}

fn header<'a>(req: &'a httparse::Request<'_, '_>, name: &str) -> Option<&'a str> {
    req.headers.iter().find(|h| h.name.eq_ignore_ascii_case(name)).and_then(|h| core::str::from_utf8(h.value).ok())
}

/// Answer one request; whether the connection stays open.
async fn respond(conn: &TcpStream, req: &httparse::Request<'_, '_>, req_body: &[u8], cache: &Cache) -> bool {
    let (store, max_age) = (&cache.store, cache.max_age);
    cache.totals.borrow_mut().requests += 1;
    let connection = header(req, "Connection").unwrap_or("");
    let keep = if req.version == Some(0) {
        connection.eq_ignore_ascii_case("keep-alive")
    } else {
        !connection.eq_ignore_ascii_case("close")
    };
    let method = req.method.unwrap_or("");
    let path = req.path.unwrap_or("/");
    let path = path.split('?').next().unwrap_or(path);
    let head_only = method == "HEAD";
    // The operator's: the shell and PURGE, from CACHE_ADMIN addresses only.
    if method == "PURGE" || (method == "POST" && path == "/.shell") {
        if !shell::admin(conn.peer_addr().map(|p| p.0)) {
            let text = "not from an address in CACHE_ADMIN\n";
            return send(conn, httpcache::head(403, &[("Content-Type", "text/plain")], text.len() as u64, keep), text.as_bytes(), keep).await;
        }
        let (status, text) = if method == "PURGE" {
            match store.borrow_mut().purge(path) {
                Ok(t) => (200, format!("{}\n", t)),
                Err(e) => (404, format!("{}\n", e)),
            }
        } else {
            let a = shell::run(&String::from_utf8_lossy(req_body), store, &cache.totals.borrow());
            if a.halt {
                let _ = send(conn, httpcache::head(200, &[("Content-Type", "text/plain")], a.text.len() as u64, false), a.text.as_bytes(), false).await;
                // The answer is acknowledged before the VM ends (an exit
                // drops what the sockets still hold).
                let _ = wisp::exec::timeout(core::time::Duration::from_secs(2), conn.flush()).await;
                wisp::exit(0);
            }
            (200, a.text)
        };
        return send(conn, httpcache::head(status, &[("Content-Type", "text/plain")], text.len() as u64, keep), text.as_bytes(), keep).await;
    }
    if method != "GET" && !head_only {
        let body = "only GET and HEAD\n";
        let h = httpcache::head(405, &[("Allow", "GET, HEAD"), ("Content-Type", "text/plain")], body.len() as u64, keep);
        return send(conn, h, body.as_bytes(), keep).await;
    }
    let now = wisp::time::wall_ns() / 1_000_000_000;
    let found = store.borrow().lookup(path);
    let Some(e) = found else {
        let body = "no such object\n";
        let h = httpcache::head(404, &[("Content-Type", "text/plain")], body.len() as u64, keep);
        return send(conn, h, body.as_bytes(), keep).await;
    };
    if e.kind == Kind::Link && !e.stored() {
        count(cache, &e.digest, false, 0, now);
        return stream(conn, cache, &e, head_only, keep).await;
    }
    let etag = format!("\"{}\"", String::from_utf8_lossy(&shfs::hex(&e.digest)));
    let modified = httpcache::http_date(e.last_modified);
    let cache_control = format!("public, max-age={}", max_age);
    let date = httpcache::http_date(now);
    let common: [(&str, &str); 6] = [
        ("Date", &date),
        ("ETag", &etag),
        ("Last-Modified", &modified),
        ("Cache-Control", &cache_control),
        ("Accept-Ranges", "bytes"),
        ("Content-Type", if e.mime().is_empty() { "application/octet-stream" } else { e.mime() }),
    ];
    // Conditionals: If-None-Match wins over If-Modified-Since.
    let not_modified = match header(req, "If-None-Match") {
        Some(inm) => httpcache::none_match(inm, &etag),
        None => header(req, "If-Modified-Since").and_then(httpcache::parse_http_date).is_some_and(|t| e.last_modified <= t),
    };
    if not_modified {
        count(cache, &e.digest, true, 0, now);
        let h = httpcache::head(304, &common[..5], 0, keep);
        return send(conn, h, b"", keep).await;
    }
    match httpcache::ranges(header(req, "Range"), e.size) {
        Ranges::Unsatisfiable => {
            let cr = format!("bytes */{}", e.size);
            let h = httpcache::head(416, &[("Content-Range", &cr), ("Content-Type", "text/plain")], 0, keep);
            send(conn, h, b"", keep).await
        }
        Ranges::Whole => {
            let h = httpcache::head(200, &common, e.size, keep);
            if !send(conn, h, b"", true).await {
                return false;
            }
            if !head_only && !body(conn, store, &e, 0, e.size).await {
                return false;
            }
            count(cache, &e.digest, true, if head_only { 0 } else { e.size }, now);
            keep
        }
        Ranges::Parts(parts) if parts.len() == 1 => {
            let (s, t) = parts[0];
            let cr = format!("bytes {}-{}/{}", s, t - 1, e.size);
            let mut hs: Vec<(&str, &str)> = common.to_vec();
            hs.push(("Content-Range", &cr));
            let h = httpcache::head(206, &hs, t - s, keep);
            if !send(conn, h, b"", true).await || (!head_only && !body(conn, store, &e, s, t).await) {
                return false;
            }
            count(cache, &e.digest, true, if head_only { 0 } else { t - s }, now);
            keep
        }
        Ranges::Parts(parts) => {
            let ct = format!("multipart/byteranges; boundary={}", httpcache::BOUNDARY);
            let mut hs: Vec<(&str, &str)> = common[..5].to_vec();
            hs.push(("Content-Type", &ct));
            let len = httpcache::multipart_len(common[5].1, &parts, e.size);
            if !send(conn, httpcache::head(206, &hs, len, keep), b"", true).await {
                return false;
            }
            if !head_only {
                for &(s, t) in &parts {
                    let ph = httpcache::part_head(common[5].1, s, t, e.size);
                    if conn.write_all(ph.as_bytes()).await.is_err() || !body(conn, store, &e, s, t).await {
                        return false;
                    }
                }
                if conn.write_all(httpcache::multipart_end().as_bytes()).await.is_err() {
                    return false;
                }
            }
            count(cache, &e.digest, true, if head_only { 0 } else { len }, now);
            keep
        }
    }
}

/// Send a head (and a small body); whether the connection is still good
/// and to be kept.
async fn send(conn: &TcpStream, head: String, body: &[u8], keep: bool) -> bool {
    if conn.write_all(head.as_bytes()).await.is_err() || (!body.is_empty() && conn.write_all(body).await.is_err()) {
        return false;
    }
    keep
}

/// Send bytes `[s, t)` of file `e`: from the cache, or from the disk a
/// piece at a time.
async fn body(conn: &TcpStream, store: &Rc<RefCell<Store>>, e: &shfs::Entry, s: u64, t: u64) -> bool {
    let step = if e.size <= CACHE_OBJECT_MAX { t - s } else { PIECE };
    let mut at = s;
    while at < t {
        let end = (at + step).min(t);
        let bytes = match store.borrow_mut().bytes(e, at, end) {
            Ok(b) => b,
            Err(err) => {
                wisp::eprintln!("cache: reading {}: {}", String::from_utf8_lossy(&shfs::hex(&e.digest)), err);
                return false;
            }
        };
        if conn.write_all(&bytes).await.is_err() {
            return false;
        }
        at = end;
    }
    true
}

/// A link not stored yet: join its fetch and send what comes, as it
/// comes (the whole object; ranges and conditionals once it is stored).
async fn stream(conn: &TcpStream, cache: &Cache, e: &shfs::Entry, head_only: bool, keep: bool) -> bool {
    let f = upstream::join(&cache.fetches, &cache.store, e);
    // The head once the upstream said its length, or failed.
    loop {
        let (state, total) = (f.borrow().state, f.borrow().total);
        if let State::Failed(status) = state {
            let body = "the upstream failed\n";
            let h = httpcache::head(status, &[("Content-Type", "text/plain")], body.len() as u64, keep);
            return send(conn, h, body.as_bytes(), keep).await;
        }
        if total.is_some() || state == State::Done {
            break;
        }
        upstream::changed(&f, 0, false).await;
    }
    let etag = format!("\"{}\"", String::from_utf8_lossy(&shfs::hex(&e.digest)));
    let mime = f.borrow().mime.clone();
    let total = f.borrow().total.unwrap_or(f.borrow().data.len() as u64);
    let h = httpcache::head(200, &[("ETag", &etag), ("Content-Type", &mime), ("X-Cache", "miss")], total, keep);
    if !send(conn, h, b"", true).await {
        return false;
    }
    if head_only {
        return keep;
    }
    let mut pos = 0usize;
    loop {
        let (piece, state) = {
            let x = f.borrow();
            (x.data[pos..].to_vec(), x.state)
        };
        if !piece.is_empty() {
            if conn.write_all(&piece).await.is_err() {
                return false;
            }
            pos += piece.len();
            continue;
        }
        match state {
            State::Done => break,
            // The head went out: the client learns of it by the close.
            State::Failed(_) => return false,
            State::Running => upstream::changed(&f, pos, true).await,
        }
    }
    count(cache, &e.digest, false, pos as u64, wisp::time::wall_ns() / 1_000_000_000);
    keep
}

/// Count a request of an object, in its statistics and the totals.
fn count(cache: &Cache, digest: &[u8; shfs::DIGEST_SIZE], hit: bool, bytes: u64, now: u64) {
    cache.store.borrow_mut().count(digest, hit, bytes, now);
    let mut t = cache.totals.borrow_mut();
    if hit {
        t.hits += 1;
    } else {
        t.misses += 1;
    }
    t.bytes += bytes;
}

