//! Link objects: fetched from their upstream (an origin or another cache,
//! `http://IPv4[:port]/path`) on the first request, streamed to that
//! client as the bytes come, and stored on the volume. Requests for the
//! same object meanwhile join the same fetch (request coalescing and
//! stream cloning, MiniCache §4: one upstream read, each client at its own
//! position in the bytes received so far). Only a complete body is
//! committed (its chunks written, then its entry): an upstream that fails,
//! stops or sends less than it announced leaves nothing a later request
//! would serve, and its clients get 502 (or 504 when it does not answer in
//! time) — or, once their head is sent, a closed connection.

use alloc::format;
use alloc::rc::Rc;
use alloc::string::String;
use alloc::vec::Vec;
use core::cell::RefCell;
use core::net::Ipv4Addr;
use core::task::{Poll, Waker};
use core::time::Duration;

use shfs::{Entry, DIGEST_SIZE};
use wisp::collections::HashMap;
use wisp::net::TcpStream;

use crate::store::Store;

/// Longest wait for the upstream to connect, answer, or send more:
/// `CACHE_UPSTREAM_TIMEOUT_MS` in the environment, default 10 s.
fn upstream_timeout() -> Duration {
    Duration::from_millis(wisp::env::var("CACHE_UPSTREAM_TIMEOUT_MS").and_then(|v| v.parse().ok()).unwrap_or(10_000))
}
/// Largest body fetched (it is held in memory while it comes).
pub const FETCH_MAX: u64 = 64 << 20;

/// How a fetch stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// Bytes are coming.
    Running,
    /// All bytes came.
    Done,
    /// It failed: the status for clients that have no head yet (502, 504).
    Failed(u16),
}

/// One fetch, shared by its clients.
pub struct Fetch {
    /// The body so far.
    pub data: Vec<u8>,
    /// Its length, once the upstream said it.
    pub total: Option<u64>,
    /// The upstream's Content-Type.
    pub mime: String,
    pub state: State,
    wakers: Vec<Waker>,
}

pub type Shared = Rc<RefCell<Fetch>>;

/// The fetches under way, by digest.
#[derive(Default)]
pub struct Fetches(RefCell<HashMap<[u8; DIGEST_SIZE], Shared>>);

impl Fetch {
    fn changed(&mut self) {
        for w in self.wakers.drain(..) {
            w.wake();
        }
    }
}

/// Wait until `f` has more than `seen` bytes, a length, or an end.
pub async fn changed(f: &Shared, seen: usize, head_known: bool) {
    core::future::poll_fn(|cx| {
        let mut x = f.borrow_mut();
        if x.data.len() > seen || x.state != State::Running || (!head_known && x.total.is_some()) {
            Poll::Ready(())
        } else {
            x.wakers.push(cx.waker().clone());
            Poll::Pending
        }
    })
    .await
}


/// The fetch of link `e`: the one under way, or a new one.
pub fn join(fetches: &Rc<Fetches>, store: &Rc<RefCell<Store>>, e: &Entry) -> Shared {
    if let Some(f) = fetches.0.borrow().get(&e.digest) {
        return f.clone();
    }
    let f: Shared = Rc::new(RefCell::new(Fetch { data: Vec::new(), total: None, mime: String::new(), state: State::Running, wakers: Vec::new() }));
    fetches.0.borrow_mut().insert(e.digest, f.clone());
    let (fetches, store, e, f2) = (fetches.clone(), store.clone(), *e, f.clone());
    wisp::exec::spawn(async move {
        let r = fetch(&e, &f2).await;
        let state = match r {
            Ok(()) => match store.borrow_mut().commit_fetched(&e, &f2.borrow().data) {
                Ok(()) => State::Done,
                Err(why) => {
                    // Served to its clients, not kept.
                    wisp::eprintln!("cache: not stored: {}", why);
                    State::Done
                }
            },
            Err((status, why)) => {
                wisp::eprintln!("cache: upstream {}: {}", e.url(), why);
                State::Failed(status)
            }
        };
        let mut x = f2.borrow_mut();
        x.state = state;
        x.changed();
        drop(x);
        fetches.0.borrow_mut().remove(&e.digest);
    });
    f
}

/// `http://A.B.C.D[:port]/path` → (address, port, path, host header).
fn parse_url(url: &str) -> Option<(Ipv4Addr, u16, &str, &str)> {
    let rest = url.strip_prefix("http://")?;
    let (host, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let (ip, port) = match host.split_once(':') {
        Some((ip, port)) => (ip, port.parse().ok()?),
        None => (host, 80),
    };
    Some((ip.parse().ok()?, port, if path.is_empty() { "/" } else { path }, host))
}

type Failure = (u16, String);

/// Fetch `e`'s body into `f`.
async fn fetch(e: &Entry, f: &Shared) -> Result<(), Failure> {
    let url = e.url();
    let (ip, port, path, host) = parse_url(url).ok_or((502, format!("'{}' is not http://IPv4[:port]/path", url)))?;
    let conn = match wisp::exec::timeout(upstream_timeout(), TcpStream::connect(ip, port)).await {
        None => return Err((504, "no connection in time".into())),
        Some(Err(err)) => return Err((502, format!("connect: {}", err))),
        Some(Ok(c)) => c,
    };
    let req = format!("GET {} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\nUser-Agent: wisp-cache\r\n\r\n", path, host);
    conn.write_all(req.as_bytes()).await.map_err(|err| (502, format!("send: {}", err)))?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 << 10];
    // The head.
    let body_start = loop {
        let n = match wisp::exec::timeout(upstream_timeout(), conn.read(&mut chunk)).await {
            None => return Err((504, "no answer in time".into())),
            Some(Err(err)) => return Err((502, format!("read: {}", err))),
            Some(Ok(0)) => return Err((502, "closed before its head".into())),
            Some(Ok(n)) => n,
        };
        buf.extend_from_slice(&chunk[..n]);
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut resp = httparse::Response::new(&mut headers);
        match resp.parse(&buf) {
            Ok(httparse::Status::Complete(at)) => {
                if resp.code != Some(200) {
                    return Err((502, format!("answered {}", resp.code.unwrap_or(0))));
                }
                let value = |name: &str| resp.headers.iter().find(|h| h.name.eq_ignore_ascii_case(name)).and_then(|h| core::str::from_utf8(h.value).ok());
                if value("Transfer-Encoding").is_some_and(|t| !t.eq_ignore_ascii_case("identity")) {
                    return Err((502, "a transfer coding this cache does not take".into()));
                }
                let total = match value("Content-Length").map(|v| v.trim().parse::<u64>()) {
                    Some(Ok(t)) if t <= FETCH_MAX => Some(t),
                    Some(Ok(t)) => return Err((502, format!("{} bytes, more than {} this cache fetches", t, FETCH_MAX))),
                    Some(Err(_)) => return Err((502, "a malformed Content-Length".into())),
                    None => None,
                };
                let mut x = f.borrow_mut();
                x.total = total;
                x.mime = String::from(value("Content-Type").unwrap_or("application/octet-stream"));
                x.changed();
                break at;
            }
            Ok(httparse::Status::Partial) if buf.len() < 16 << 10 => {}
            _ => return Err((502, "a malformed head".into())),
        }
    };
    // The body: what came with the head, then the rest.
    let mut first = buf.split_off(body_start);
    loop {
        if !first.is_empty() {
            let mut x = f.borrow_mut();
            x.data.append(&mut first);
            if x.data.len() as u64 > x.total.unwrap_or(FETCH_MAX) {
                return Err((502, "more bytes than announced".into()));
            }
            x.changed();
        }
        if f.borrow().total.is_some_and(|t| f.borrow().data.len() as u64 == t) {
            return Ok(());
        }
        match wisp::exec::timeout(upstream_timeout(), conn.read(&mut chunk)).await {
            None => return Err((504, "stalled".into())),
            Some(Err(err)) => return Err((502, format!("read: {}", err))),
            Some(Ok(0)) => {
                let (have, total) = (f.borrow().data.len() as u64, f.borrow().total);
                return match total {
                    Some(t) if t != have => Err((502, format!("closed after {} of {} bytes", have, t))),
                    _ => Ok(()),
                };
            }
            Some(Ok(n)) => first.extend_from_slice(&chunk[..n]),
        }
    }
}
