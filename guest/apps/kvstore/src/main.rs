//! `kvstore [PORT] [SAVE_DELAY_MS]`: an in-memory key-value server that
//! speaks Redis' protocol (RESP2, port 6380 by default), so that
//! `redis-cli` and `redis-benchmark` work against it unchanged (issue 18,
//! item 5). It saves snapshots the way Redis does BGSAVE: it forks, and the
//! child VM — holding a copy-on-write copy of the data as it was at the
//! fork — writes the snapshot out while the parent keeps serving. The
//! parent learns that the save ended through SIGCHLD and `waitpid`.
//!
//! A unikernel here has no disk, so the child writes the snapshot to its
//! console (the VM's log under wispd, stdout with `wisp run`):
//! `kvstore: snapshot begin N`, one `kvstore: snapshot KEY VALUE` line per
//! key in key order (bytes that are not UTF-8 shown as U+FFFD), `kvstore:
//! snapshot end N CHECKSUM` (FNV-1a over `KEY VALUE\n` of every key, as
//! bytes). SAVE_DELAY_MS (default 0) makes the child wait before writing
//! (to show the parent serving meanwhile).
//!
//! Commands (names in any case): PING [MSG], ECHO MSG, SET K V [NX|XX],
//! GET K, DEL K.., EXISTS K.., INCR K, DECR K, INCRBY K N, MGET K..,
//! MSET K V.., DBSIZE, FLUSHALL, FLUSHDB, BGSAVE, LASTSAVE (the Unix time
//! of the last save that succeeded; 0 before one), INFO [SECTION]
//! (server, clients, persistence, keyspace), SELECT 0, CONFIG GET (`save`
//! and `appendonly`, as redis-benchmark asks), COMMAND (empty), QUIT.
//! Requests are RESP arrays of bulk strings, or inline commands (a line of
//! words, as Redis takes them); replies are RESP2. A client's requests are
//! answered in order, each batch that arrives with one write (pipelining).
//! RESP frames are read in place with the `redis-protocol` crate (`no_std`
//! with `alloc`); replies, a handful of shapes, are written straight into
//! the output (no frame built, no value copied). Bad input gets an error
//! reply; a protocol error or more than 1 MiB of an unfinished request
//! closes the connection, as Redis does.
#![no_std]
#![no_main]

extern crate alloc;

use alloc::collections::BTreeMap;
use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec;
use alloc::vec::Vec;
use core::cell::RefCell;

use core::fmt::Write as _;

use redis_protocol::resp2::decode::decode_range;
use redis_protocol::resp2::types::RangeFrame;
use wisp::family as f;
use wisp::net::{TcpListener, TcpOptions, TcpStream};

wisp::main!(main, wisp::Manifest::new().features(wisp::features::FORK | wisp::features::FAMILY).nic(true));

/// Most bytes of a request not complete yet.
const MAX_PENDING: usize = 1 << 20;

/// The server's state. Single vCPU, cooperative tasks: a RefCell suffices.
struct Store {
    data: BTreeMap<Vec<u8>, Vec<u8>>,
    /// The child saving now, if any.
    saving: Option<u32>,
    saves: u64,
    /// Unix time of the last save that succeeded (0: none).
    last_ok: u64,
    last_failed: bool,
    delay_ms: u64,
    clients: u64,
}

static STORE: Shared = Shared(RefCell::new(None));

struct Shared(RefCell<Option<Store>>);
// SAFETY: one vCPU, no interrupts, no threads: never accessed concurrently.
unsafe impl Sync for Shared {}

fn with<R>(f: impl FnOnce(&mut Store) -> R) -> R {
    f(STORE.0.borrow_mut().as_mut().expect("store initialised"))
}

fn unix_now() -> u64 {
    wisp::time::wall_ns() / 1_000_000_000
}

fn main() -> i32 {
    let (port, cfg) = match wisp::net::server_args("kvstore", 1, 6380) {
        Ok(x) => x,
        Err(code) => return code,
    };
    let delay_ms = wisp::env::arg(2).and_then(|s| s.parse().ok()).unwrap_or(0);
    *STORE.0.borrow_mut() =
        Some(Store { data: BTreeMap::new(), saving: None, saves: 0, last_ok: 0, last_failed: false, delay_ms, clients: 0 });
    // A save ended: reap the child and record how it went.
    f::signal(f::SIGCHLD, |_| {
        while let Ok(Some((pid, st))) = f::waitpid(-1, true) {
            with(|s| {
                if s.saving == Some(pid) {
                    s.saving = None;
                    s.saves += 1;
                    s.last_failed = f::status::exit_code(st) != Some(0);
                    if !s.last_failed {
                        s.last_ok = unix_now();
                    }
                }
            });
        }
    });
    // A benchmark's 50 clients connect at once: that many listen from the
    // start (a SYN that finds none is refused).
    let opts = TcpOptions { nodelay: true, backlog: 128, listen_first: 64, ..TcpOptions::default() };
    let listener = match TcpListener::bind_app("kvstore", port, opts) {
        Ok(l) => l,
        Err(code) => return code,
    };
    wisp::println!("kvstore: listening on {}:{}", cfg.ip, port);
    listener.serve_app("kvstore", serve)
}

/// A word of a request: its bytes' range in the buffer.
type Word = (usize, usize);

/// The next request in `buf`: its words and the bytes it took, or `None`
/// if it is not complete yet. `Err`: a protocol error. RESP frames are
/// read in place (`decode_range`: no copy of the request).
fn next_request(buf: &[u8], words: &mut Vec<Word>) -> Result<Option<usize>, &'static str> {
    words.clear();
    if buf.first() == Some(&b'*') {
        let Some((frame, used)) = decode_range(buf).map_err(|_| "Protocol error: invalid multibulk request")? else { return Ok(None) };
        let RangeFrame::Array(items) = frame else { return Err("Protocol error: expected an array") };
        for i in items {
            match i {
                RangeFrame::BulkString(r) => words.push(r),
                _ => return Err("Protocol error: expected '$'"),
            }
        }
        return Ok(Some(used));
    }
    // An inline command: a line of words.
    let Some(nl) = buf.iter().position(|&b| b == b'\n') else { return Ok(None) };
    let mut i = 0;
    while i < nl {
        while i < nl && buf[i].is_ascii_whitespace() {
            i += 1;
        }
        let start = i;
        while i < nl && !buf[i].is_ascii_whitespace() {
            i += 1;
        }
        if i > start {
            words.push((start, i));
        }
    }
    Ok(Some(nl + 1))
}

/// Serve one client until it quits or goes away.
async fn serve(conn: TcpStream) {
    with(|s| s.clients += 1);
    serve_client(&conn).await;
    with(|s| s.clients -= 1);
}

async fn serve_client(conn: &TcpStream) {
    let mut pending: Vec<u8> = Vec::new();
    let mut out: Vec<u8> = Vec::new();
    let mut words: Vec<Word> = Vec::new();
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        // Every complete request that came, answered in order into `out`.
        let mut at = 0;
        let mut quit = false;
        let mut args: Vec<&[u8]> = Vec::new();
        loop {
            match next_request(&pending[at..], &mut words) {
                Ok(Some(used)) => {
                    let req = &pending[at..at + used];
                    at += used;
                    if words.is_empty() {
                        continue;
                    }
                    args.clear();
                    args.extend(words.iter().map(|&(a, b)| &req[a..b]));
                    if command(&args, &mut out) {
                        quit = true;
                        break;
                    }
                }
                Ok(None) => break,
                Err(why) => {
                    error(&mut out, &format!("ERR {why}"));
                    quit = true;
                    break;
                }
            }
        }
        drop(args);
        pending.drain(..at);
        if !out.is_empty() {
            if conn.write_all(&out).await.is_err() {
                return;
            }
            out.clear();
        }
        if quit {
            return;
        }
        if pending.len() > MAX_PENDING {
            let _ = conn.write_all(b"-ERR Protocol error: too big request\r\n").await;
            return;
        }
        match conn.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => pending.extend_from_slice(&buf[..n]),
        }
    }
}

// Replies, written straight into the output (RESP2).

fn simple(out: &mut Vec<u8>, s: &str) {
    out.push(b'+');
    out.extend_from_slice(s.as_bytes());
    out.extend_from_slice(b"\r\n");
}

fn error(out: &mut Vec<u8>, s: &str) {
    out.push(b'-');
    out.extend(s.bytes().map(|b| if b == b'\r' || b == b'\n' { b' ' } else { b }));
    out.extend_from_slice(b"\r\n");
}

fn err(out: &mut Vec<u8>, msg: &str) {
    error(out, &format!("ERR {msg}"));
}

fn integer(out: &mut Vec<u8>, n: i64) {
    let _ = write!(Bytes(out), ":{n}\r\n");
}

fn bulk(out: &mut Vec<u8>, b: Option<&[u8]>) {
    match b {
        None => out.extend_from_slice(b"$-1\r\n"),
        Some(v) => {
            let _ = write!(Bytes(out), "${}\r\n", v.len());
            out.extend_from_slice(v);
            out.extend_from_slice(b"\r\n");
        }
    }
}

fn array(out: &mut Vec<u8>, n: usize) {
    let _ = write!(Bytes(out), "*{n}\r\n");
}

/// `fmt::Write` into a byte buffer.
struct Bytes<'a>(&'a mut Vec<u8>);

impl core::fmt::Write for Bytes<'_> {
    fn write_str(&mut self, s: &str) -> core::fmt::Result {
        self.0.extend_from_slice(s.as_bytes());
        Ok(())
    }
}

/// A number in a request.
fn number(b: &[u8]) -> Option<i64> {
    core::str::from_utf8(b).ok()?.parse().ok()
}

/// A command's name in capitals (at most 16 bytes; longer ones are no
/// command of ours).
fn upper<'a>(name: &[u8], buf: &'a mut [u8; 16]) -> &'a [u8] {
    let n = name.len().min(16);
    for (d, s) in buf.iter_mut().zip(&name[..n]) {
        *d = s.to_ascii_uppercase();
    }
    if name.len() > 16 { b"" } else { &buf[..n] }
}

/// Answer one request (its words, the command first) into `out`; whether
/// the connection ends after it.
fn command(w: &[&[u8]], out: &mut Vec<u8>) -> bool {
    let mut nb = [0u8; 16];
    let name = upper(w[0], &mut nb);
    let args = &w[1..];
    match (name, args.len()) {
        (b"GET", 1) => with(|s| bulk(out, s.data.get(args[0]).map(Vec::as_slice))),
        (b"SET", 2..) => set(args, out),
        (b"PING", 0) => simple(out, "PONG"),
        (b"PING", 1) | (b"ECHO", 1) => bulk(out, Some(args[0])),
        (b"DEL", 1..) => with(|s| integer(out, args.iter().filter(|k| s.data.remove(**k).is_some()).count() as i64)),
        (b"EXISTS", 1..) => with(|s| integer(out, args.iter().filter(|k| s.data.contains_key(**k)).count() as i64)),
        (b"INCR", 1) => add(args[0], 1, out),
        (b"DECR", 1) => add(args[0], -1, out),
        (b"INCRBY", 2) => match number(args[1]) {
            Some(n) => add(args[0], n, out),
            None => err(out, "value is not an integer or out of range"),
        },
        (b"MGET", 1..) => with(|s| {
            array(out, args.len());
            for k in args {
                bulk(out, s.data.get(*k).map(Vec::as_slice));
            }
        }),
        (b"MSET", n) if n >= 2 && n % 2 == 0 => with(|s| {
            for kv in args.chunks(2) {
                s.data.insert(kv[0].to_vec(), kv[1].to_vec());
            }
            simple(out, "OK");
        }),
        (b"DBSIZE", 0) => with(|s| integer(out, s.data.len() as i64)),
        (b"FLUSHALL" | b"FLUSHDB", 0) => with(|s| {
            s.data.clear();
            simple(out, "OK");
        }),
        (b"BGSAVE", 0) => bgsave(out),
        (b"LASTSAVE", 0) => with(|s| integer(out, s.last_ok as i64)),
        (b"INFO", 0 | 1) => {
            let text = info(args.first().copied());
            bulk(out, Some(text.as_bytes()));
        }
        (b"SELECT", 1) if args[0] == b"0" => simple(out, "OK"),
        (b"SELECT", 1) => err(out, "DB index is out of range"),
        (b"CONFIG", 2) if args[0].eq_ignore_ascii_case(b"GET") => config_get(args[1], out),
        (b"COMMAND", _) => array(out, 0),
        (b"QUIT", 0) => {
            simple(out, "OK");
            return true;
        }
        (
            b"PING" | b"ECHO" | b"SET" | b"GET" | b"DEL" | b"EXISTS" | b"INCR" | b"DECR" | b"INCRBY" | b"MGET" | b"MSET" | b"DBSIZE" | b"FLUSHALL"
            | b"FLUSHDB" | b"BGSAVE" | b"LASTSAVE" | b"INFO" | b"SELECT" | b"CONFIG" | b"QUIT",
            _,
        ) => err(out, &format!("wrong number of arguments for '{}' command", String::from_utf8_lossy(name).to_ascii_lowercase())),
        _ => err(out, &format!("unknown command '{}'", String::from_utf8_lossy(w[0]))),
    }
    false
}

/// SET K V [NX|XX]: nil when NX or XX kept it from being set.
fn set(args: &[&[u8]], out: &mut Vec<u8>) {
    let (nx, xx) = match args.get(2) {
        None => (false, false),
        Some(o) if o.eq_ignore_ascii_case(b"NX") && args.len() == 3 => (true, false),
        Some(o) if o.eq_ignore_ascii_case(b"XX") && args.len() == 3 => (false, true),
        Some(_) => return err(out, "syntax error (options taken: NX, XX)"),
    };
    with(|s| {
        let there = s.data.contains_key(args[0]);
        if (nx && there) || (xx && !there) {
            return bulk(out, None);
        }
        match s.data.get_mut(args[0]) {
            Some(v) => {
                v.clear();
                v.extend_from_slice(args[1]);
            }
            None => {
                s.data.insert(args[0].to_vec(), args[1].to_vec());
            }
        }
        simple(out, "OK");
    })
}

/// INCR, DECR, INCRBY: the new value.
fn add(key: &[u8], by: i64, out: &mut Vec<u8>) {
    with(|s| {
        let now = match s.data.get(key) {
            None => 0,
            Some(v) => match number(v) {
                Some(n) => n,
                None => return err(out, "value is not an integer or out of range"),
            },
        };
        match now.checked_add(by) {
            Some(n) => {
                s.data.insert(key.to_vec(), n.to_string().into_bytes());
                integer(out, n);
            }
            None => err(out, "increment or decrement would overflow"),
        }
    })
}

/// CONFIG GET: the two parameters redis-benchmark asks for.
fn config_get(param: &[u8], out: &mut Vec<u8>) {
    let p = param.to_ascii_lowercase();
    let value: &[u8] = match p.as_slice() {
        b"save" => b"",
        b"appendonly" => b"no",
        _ => return array(out, 0),
    };
    array(out, 2);
    bulk(out, Some(&p));
    bulk(out, Some(value));
}

/// INFO [SECTION].
fn info(section: Option<&[u8]>) -> String {
    let want = |name: &str| section.is_none_or(|s| s.eq_ignore_ascii_case(name.as_bytes()) || s.eq_ignore_ascii_case(b"all") || s.eq_ignore_ascii_case(b"default"));
    let mut out = String::new();
    with(|s| {
        if want("server") {
            out += "# Server\r\nredis_version:7.0.0\r\nredis_mode:standalone\r\nos:wisp\r\narch_bits:64\r\n";
            out += &format!("process_id:{}\r\nuptime_in_seconds:{}\r\n\r\n", f::getpid(), wisp::time::monotonic_ns() / 1_000_000_000);
        }
        if want("clients") {
            out += &format!("# Clients\r\nconnected_clients:{}\r\n\r\n", s.clients);
        }
        if want("persistence") {
            out += &format!(
                "# Persistence\r\nrdb_bgsave_in_progress:{}\r\nrdb_saves:{}\r\nrdb_last_save_time:{}\r\nrdb_last_bgsave_status:{}\r\n\r\n",
                s.saving.is_some() as u8,
                s.saves,
                s.last_ok,
                if s.last_failed { "err" } else { "ok" }
            );
        }
        if want("keyspace") {
            out += "# Keyspace\r\n";
            if !s.data.is_empty() {
                out += &format!("db0:keys={},expires=0,avg_ttl=0\r\n", s.data.len());
            }
        }
    });
    out
}

fn bgsave(out: &mut Vec<u8>) {
    if with(|s| s.saving.is_some()) {
        return err(out, "Background save already in progress");
    }
    match f::fork() {
        Ok(0) => {
            // The child: its memory is the parent's as of the fork, shared
            // copy-on-write, while the parent goes on changing its own.
            let delay = with(|s| s.delay_ms);
            if delay > 0 {
                wisp::time::sleep(core::time::Duration::from_millis(delay));
            }
            let code = with(|s| write_snapshot(&s.data));
            wisp::exit(code)
        }
        Ok(pid) => {
            with(|s| s.saving = Some(pid));
            simple(out, "Background saving started");
        }
        Err(e) => err(out, &format!("fork: {e}")),
    }
}

fn write_snapshot(data: &BTreeMap<Vec<u8>, Vec<u8>>) -> i32 {
    let mut sum: u64 = 0xcbf2_9ce4_8422_2325;
    wisp::println!("kvstore: snapshot begin {}", data.len());
    for (k, v) in data {
        for &b in k.iter().chain(b" ").chain(v.iter()).chain(b"\n") {
            sum = (sum ^ b as u64).wrapping_mul(0x100_0000_01b3);
        }
        wisp::println!("kvstore: snapshot {} {}", String::from_utf8_lossy(k), String::from_utf8_lossy(v));
    }
    wisp::println!("kvstore: snapshot end {} {:016x}", data.len(), sum);
    0
}
