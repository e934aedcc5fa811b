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
//! RESP frames are read with the `redis-protocol` crate (`no_std` with
//! `alloc`). Bad input gets an error reply; a protocol error or more than
//! 1 MiB of an unfinished request closes the connection, as Redis does.
#![no_std]
#![no_main]

extern crate alloc;

use alloc::collections::BTreeMap;
use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec;
use alloc::vec::Vec;
use core::cell::RefCell;

use redis_protocol::resp2::decode::decode;
use redis_protocol::resp2::encode::encode;
use redis_protocol::resp2::types::{OwnedFrame as Frame, Resp2Frame};
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

/// One request taken from the front of `pending`: its words, or `None`
/// if it is not complete yet. `Err`: a protocol error.
fn take_request(pending: &mut Vec<u8>) -> Result<Option<Vec<Vec<u8>>>, &'static str> {
    if pending.first() == Some(&b'*') {
        let Some((frame, used)) = decode(pending).map_err(|_| "Protocol error: invalid multibulk request")? else { return Ok(None) };
        pending.drain(..used);
        let Frame::Array(items) = frame else { return Err("Protocol error: expected an array") };
        return items
            .into_iter()
            .map(|i| match i {
                Frame::BulkString(b) => Ok(b),
                _ => Err("Protocol error: expected '$'"),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some);
    }
    // An inline command: a line of words.
    let Some(nl) = pending.iter().position(|&b| b == b'\n') else { return Ok(None) };
    let line: Vec<u8> = pending.drain(..=nl).collect();
    Ok(Some(line.split(|b| b.is_ascii_whitespace()).filter(|w| !w.is_empty()).map(<[u8]>::to_vec).collect()))
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
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        let mut quit = false;
        loop {
            match take_request(&mut pending) {
                Ok(Some(words)) if words.is_empty() => {}
                Ok(Some(words)) => {
                    let (reply, last) = command(&words);
                    put(&mut out, &reply);
                    if last {
                        quit = true;
                        break;
                    }
                }
                Ok(None) => break,
                Err(why) => {
                    put(&mut out, &Frame::Error(format!("ERR {why}")));
                    quit = true;
                    break;
                }
            }
        }
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

/// Append `frame`'s encoding to `out`.
fn put(out: &mut Vec<u8>, frame: &Frame) {
    let at = out.len();
    out.resize(at + frame.encode_len(), 0);
    match encode(&mut out[at..], frame) {
        Ok(n) => out.truncate(at + n),
        Err(_) => {
            out.truncate(at);
            out.extend_from_slice(b"-ERR internal error\r\n");
        }
    }
}

fn ok() -> Frame {
    Frame::SimpleString(b"OK".to_vec())
}

fn err(msg: &str) -> Frame {
    Frame::Error(format!("ERR {msg}"))
}

fn int(n: i64) -> Frame {
    Frame::Integer(n)
}

fn bulk(b: Option<&Vec<u8>>) -> Frame {
    b.map_or(Frame::Null, |v| Frame::BulkString(v.clone()))
}

/// A number in a request.
fn number(b: &[u8]) -> Option<i64> {
    core::str::from_utf8(b).ok()?.parse().ok()
}

/// The reply to one request (its words, the command first), and whether
/// the connection ends after it.
fn command(w: &[Vec<u8>]) -> (Frame, bool) {
    let name = String::from_utf8_lossy(&w[0]).to_ascii_uppercase();
    let args = &w[1..];
    let arity = |name: &str| err(&format!("wrong number of arguments for '{}' command", name.to_ascii_lowercase()));
    let reply = match (name.as_str(), args.len()) {
        ("PING", 0) => Frame::SimpleString(b"PONG".to_vec()),
        ("PING", 1) | ("ECHO", 1) => Frame::BulkString(args[0].clone()),
        ("SET", 2..) => set(args),
        ("GET", 1) => with(|s| bulk(s.data.get(&args[0]))),
        ("DEL", 1..) => with(|s| int(args.iter().filter(|k| s.data.remove(*k).is_some()).count() as i64)),
        ("EXISTS", 1..) => with(|s| int(args.iter().filter(|k| s.data.contains_key(*k)).count() as i64)),
        ("INCR", 1) => add(&args[0], 1),
        ("DECR", 1) => add(&args[0], -1),
        ("INCRBY", 2) => match number(&args[1]) {
            Some(n) => add(&args[0], n),
            None => err("value is not an integer or out of range"),
        },
        ("MGET", 1..) => with(|s| Frame::Array(args.iter().map(|k| bulk(s.data.get(k))).collect())),
        ("MSET", n) if n >= 2 && n % 2 == 0 => with(|s| {
            for kv in args.chunks(2) {
                s.data.insert(kv[0].clone(), kv[1].clone());
            }
            ok()
        }),
        ("DBSIZE", 0) => with(|s| int(s.data.len() as i64)),
        ("FLUSHALL" | "FLUSHDB", 0) => with(|s| {
            s.data.clear();
            ok()
        }),
        ("BGSAVE", 0) => bgsave(),
        ("LASTSAVE", 0) => with(|s| int(s.last_ok as i64)),
        ("INFO", 0 | 1) => Frame::BulkString(info(args.first()).into_bytes()),
        ("SELECT", 1) if args[0] == b"0" => ok(),
        ("SELECT", 1) => err("DB index is out of range"),
        ("CONFIG", 2) if args[0].eq_ignore_ascii_case(b"GET") => config_get(&args[1]),
        ("COMMAND", _) => Frame::Array(Vec::new()),
        ("QUIT", 0) => return (ok(), true),
        ("PING" | "ECHO" | "SET" | "GET" | "DEL" | "EXISTS" | "INCR" | "DECR" | "INCRBY" | "MGET" | "MSET" | "DBSIZE" | "FLUSHALL" | "FLUSHDB" | "BGSAVE" | "LASTSAVE" | "INFO" | "SELECT" | "CONFIG" | "QUIT", _) => arity(&name),
        _ => err(&format!("unknown command '{}'", String::from_utf8_lossy(&w[0]))),
    };
    (reply, false)
}

/// SET K V [NX|XX]: `Null` when NX or XX kept it from being set.
fn set(args: &[Vec<u8>]) -> Frame {
    let (nx, xx) = match args.get(2).map(|o| o.to_ascii_uppercase()) {
        None => (false, false),
        Some(o) if o == b"NX" && args.len() == 3 => (true, false),
        Some(o) if o == b"XX" && args.len() == 3 => (false, true),
        Some(_) => return err("syntax error (options taken: NX, XX)"),
    };
    with(|s| {
        let there = s.data.contains_key(&args[0]);
        if (nx && there) || (xx && !there) {
            return Frame::Null;
        }
        s.data.insert(args[0].clone(), args[1].clone());
        ok()
    })
}

/// INCR, DECR, INCRBY: the new value.
fn add(key: &[u8], by: i64) -> Frame {
    with(|s| {
        let now = match s.data.get(key) {
            None => 0,
            Some(v) => match number(v) {
                Some(n) => n,
                None => return err("value is not an integer or out of range"),
            },
        };
        match now.checked_add(by) {
            Some(n) => {
                s.data.insert(key.to_vec(), n.to_string().into_bytes());
                int(n)
            }
            None => err("increment or decrement would overflow"),
        }
    })
}

/// CONFIG GET: the two parameters redis-benchmark asks for.
fn config_get(param: &[u8]) -> Frame {
    let p = param.to_ascii_lowercase();
    let value: &[u8] = match p.as_slice() {
        b"save" => b"",
        b"appendonly" => b"no",
        _ => return Frame::Array(Vec::new()),
    };
    Frame::Array(vec![Frame::BulkString(p.clone()), Frame::BulkString(value.to_vec())])
}

/// INFO [SECTION].
fn info(section: Option<&Vec<u8>>) -> String {
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

fn bgsave() -> Frame {
    if with(|s| s.saving.is_some()) {
        return err("Background save already in progress");
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
            Frame::SimpleString(b"Background saving started".to_vec())
        }
        Err(e) => err(&format!("fork: {e}")),
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
