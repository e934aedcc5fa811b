//! `kvstore [PORT] [SAVE_DELAY_MS]`: a small in-memory key-value server
//! (port 6380 by default) that saves snapshots the way Redis does BGSAVE:
//! it forks, and the child VM — holding a copy-on-write copy of the data as
//! it was at the fork — writes the snapshot out while the parent keeps
//! serving. The parent learns that the save ended through SIGCHLD and
//! `waitpid`.
//!
//! A unikernel here has no disk, so the child writes the snapshot to its
//! console (the VM's log under wispd, stdout with `wisp run`):
//! `kvstore: snapshot begin N`, one `kvstore: snapshot KEY VALUE` line per
//! key in key order, `kvstore: snapshot end N CHECKSUM`. SAVE_DELAY_MS
//! (default 0) makes the child wait before writing (to show the parent
//! serving meanwhile).
//!
//! Protocol: one command per line, one reply line each.
//!   SET K V -> OK | GET K -> VALUE V or NIL | DEL K -> :1 or :0 |
//!   DBSIZE -> :N | BGSAVE -> OK saving in PID (or ERR a save is running) |
//!   LASTSAVE -> saves N running R last STATUS | QUIT
#![no_std]
#![no_main]

extern crate alloc;

use alloc::collections::BTreeMap;
use alloc::format;
use alloc::string::{String, ToString};
use alloc::vec::Vec;
use core::cell::RefCell;

use wisp::family as f;
use wisp::net::{TcpListener, TcpOptions, TcpStream};

wisp::main!(main, wisp::Manifest::new().features(wisp::features::FORK | wisp::features::FAMILY).nic(true));

/// The server's state. Single vCPU, cooperative tasks: a RefCell suffices.
struct Store {
    data: BTreeMap<String, String>,
    /// The child saving now, if any.
    saving: Option<u32>,
    saves: u64,
    last: String,
    delay_ms: u64,
}

static STORE: Shared = Shared(RefCell::new(None));

struct Shared(RefCell<Option<Store>>);
// SAFETY: one vCPU, no interrupts, no threads: never accessed concurrently.
unsafe impl Sync for Shared {}

fn with<R>(f: impl FnOnce(&mut Store) -> R) -> R {
    f(STORE.0.borrow_mut().as_mut().expect("store initialised"))
}

fn main() -> i32 {
    let (port, cfg) = match wisp::net::server_args("kvstore", 1, 6380) {
        Ok(x) => x,
        Err(code) => return code,
    };
    let delay_ms = wisp::env::arg(2).and_then(|s| s.parse().ok()).unwrap_or(0);
    *STORE.0.borrow_mut() =
        Some(Store { data: BTreeMap::new(), saving: None, saves: 0, last: "none".into(), delay_ms });
    // A save ended: reap the child and record how it went.
    f::signal(f::SIGCHLD, |_| {
        while let Ok(Some((pid, st))) = f::waitpid(-1, true) {
            with(|s| {
                if s.saving == Some(pid) {
                    s.saving = None;
                    s.saves += 1;
                    s.last = match f::status::exit_code(st) {
                        Some(0) => "ok".into(),
                        Some(c) => format!("failed (exit {c})"),
                        None => format!("failed (signal {})", f::status::term_signal(st).unwrap_or(0)),
                    };
                }
            });
        }
    });
    let listener = match TcpListener::bind_app("kvstore", port, TcpOptions { nodelay: true, ..TcpOptions::default() }) {
        Ok(l) => l,
        Err(code) => return code,
    };
    wisp::println!("kvstore: listening on {}:{}", cfg.ip, port);
    listener.serve_app("kvstore", serve)
}

/// Serve one client until it quits or goes away.
async fn serve(conn: TcpStream) {
    let mut pending: Vec<u8> = Vec::new();
    let mut buf = [0u8; 2048];
    loop {
        while let Some(nl) = pending.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = pending.drain(..=nl).collect();
            let line = core::str::from_utf8(&line).unwrap_or("").trim();
            let Some(reply) = command(line) else { return };
            if conn.write_all(reply.as_bytes()).await.is_err() || conn.write_all(b"\n").await.is_err() {
                return;
            }
        }
        if pending.len() > 64 * 1024 {
            let _ = conn.write_all(b"ERR line too long\n").await;
            return;
        }
        match conn.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => pending.extend_from_slice(&buf[..n]),
        }
    }
}

/// The reply to one command line; `None` ends the connection.
fn command(line: &str) -> Option<String> {
    let mut w = line.splitn(3, ' ');
    let cmd = w.next().unwrap_or("").to_ascii_uppercase();
    let (a, b) = (w.next(), w.next());
    Some(match (cmd.as_str(), a, b) {
        ("SET", Some(k), Some(v)) => with(|s| {
            s.data.insert(k.to_string(), v.to_string());
            "OK".into()
        }),
        ("GET", Some(k), None) => with(|s| s.data.get(k).map_or("NIL".into(), |v| format!("VALUE {v}"))),
        ("DEL", Some(k), None) => with(|s| format!(":{}", s.data.remove(k).is_some() as u8)),
        ("DBSIZE", None, None) => with(|s| format!(":{}", s.data.len())),
        ("BGSAVE", None, None) => bgsave(),
        ("LASTSAVE", None, None) => {
            with(|s| format!("saves {} running {} last {}", s.saves, s.saving.is_some() as u8, s.last))
        }
        ("QUIT", None, None) => return None,
        _ => "ERR unknown command or wrong arguments".into(),
    })
}

fn bgsave() -> String {
    if with(|s| s.saving.is_some()) {
        return "ERR a save is running".into();
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
            format!("OK saving in {pid}")
        }
        Err(e) => format!("ERR fork: {e}"),
    }
}

fn write_snapshot(data: &BTreeMap<String, String>) -> i32 {
    let mut sum: u64 = 0xcbf2_9ce4_8422_2325;
    wisp::println!("kvstore: snapshot begin {}", data.len());
    for (k, v) in data {
        for b in k.bytes().chain([b' ']).chain(v.bytes()).chain([b'\n']) {
            sum = (sum ^ b as u64).wrapping_mul(0x100_0000_01b3);
        }
        wisp::println!("kvstore: snapshot {} {}", k, v);
    }
    wisp::println!("kvstore: snapshot end {} {:016x}", data.len(), sum);
    0
}
