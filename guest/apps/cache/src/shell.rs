//! The operator's shell (MiniCache's µSH): `ls`, `stats`, `info`, `add`,
//! `rm`, `purge`, `uptime`, `halt` and `help`, one command a line, over the
//! console (the VM's standard input: `wisp run -i`, or `POST
//! /v1/vms/{vm}/stdin` through wispd; answers on standard output) and over
//! HTTP (`POST /.shell` with the command as the body, and the `PURGE`
//! method, from the addresses in `CACHE_ADMIN` only).

use alloc::format;
use alloc::rc::Rc;
use alloc::string::String;
use core::cell::RefCell;
use core::fmt::Write;

use crate::store::Store;

/// Totals since boot.
#[derive(Default)]
pub struct Totals {
    pub requests: u64,
    pub hits: u64,
    pub misses: u64,
    pub bytes: u64,
}

/// What a command says, and whether the cache is to stop.
pub struct Answer {
    pub text: String,
    pub halt: bool,
}

fn answer(text: String) -> Answer {
    Answer { text, halt: false }
}

/// Run one command line.
pub fn run(line: &str, store: &Rc<RefCell<Store>>, totals: &Totals) -> Answer {
    let mut words = line.split_ascii_whitespace();
    let cmd = words.next().unwrap_or("");
    let arg = words.next();
    let mut out = String::new();
    match (cmd, arg) {
        ("", _) => {}
        ("help", _) => out.push_str("commands: ls, stats, info, add URL [NAME], rm OBJECT, purge OBJECT, uptime, halt\n"),
        ("ls", _) => {
            for e in store.borrow().entries() {
                let kind = if e.kind == shfs::Kind::File { "file" } else if e.stored() { "link*" } else { "link" };
                let _ = writeln!(out, "{} {} {} {} hits {}", String::from_utf8_lossy(&shfs::hex(&e.digest)), kind, e.size, e.name(), e.hits);
            }
        }
        ("stats", _) => {
            let s = store.borrow();
            let _ = writeln!(
                out,
                "requests {} hits {} misses {} bytes {} objects {} cached {} bytes",
                totals.requests,
                totals.hits,
                totals.misses,
                totals.bytes,
                s.len(),
                s.cached_bytes()
            );
        }
        ("info", _) => {
            let s = store.borrow();
            let _ = writeln!(
                out,
                "volume '{}': {} chunks of {} bytes, {} objects of {} at most, {}",
                s.sb.label(),
                s.sb.chunks,
                s.sb.chunk_size,
                s.len(),
                s.sb.slots(),
                if s.disk.read_only() { "read-only" } else { "read-write" }
            );
        }
        ("uptime", _) => {
            let up = wisp::time::uptime();
            let _ = writeln!(out, "up {}.{:03} s, {} requests", up.as_secs(), up.subsec_millis(), totals.requests);
        }
        ("add", Some(url)) => match store.borrow_mut().add_link(url, words.next().unwrap_or("")) {
            Ok(d) => {
                let _ = writeln!(out, "added {}", String::from_utf8_lossy(&shfs::hex(&d)));
            }
            Err(e) => {
                let _ = writeln!(out, "add: {}", e);
            }
        },
        ("rm", Some(o)) => out = format!("{}\n", store.borrow_mut().remove(o).unwrap_or_else(|e| format!("rm: {}", e))),
        ("purge", Some(o)) => out = format!("{}\n", store.borrow_mut().purge(o).unwrap_or_else(|e| format!("purge: {}", e))),
        ("halt", _) => {
            let saved = store.borrow_mut().save_stats();
            let _ = writeln!(out, "halting ({})", saved.unwrap_or_else(|e| format!("statistics not saved: {}", e)));
            return Answer { text: out, halt: true };
        }
        (c, None) if ["add", "rm", "purge"].contains(&c) => {
            let _ = writeln!(out, "{}: which object? (help)", c);
        }
        (c, _) => {
            let _ = writeln!(out, "unknown command '{}' (help)", c);
        }
    }
    answer(out)
}

/// Whether `peer` may use the shell and PURGE over HTTP: its address is
/// in `CACHE_ADMIN` (comma-separated IPv4 addresses; none by default).
pub fn admin(peer: Option<core::net::Ipv4Addr>) -> bool {
    let Some(ip) = peer else { return false };
    wisp::env::var("CACHE_ADMIN").is_some_and(|list| list.split(',').any(|a| a.trim().parse() == Ok(ip)))
}
