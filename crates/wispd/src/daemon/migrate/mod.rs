//! Live migration between daemons (issue 16): the source streams a VM to a
//! destination daemon over TCP, and the VM goes on there.
//!
//! The two daemons share a key (`wispd --migrate-key FILE`) and prove it to
//! each other before anything else: the destination sends a nonce, the
//! source answers with HMAC-SHA256(key, "src" ‖ nonce) and a nonce of its
//! own, the destination answers HMAC(key, "dst" ‖ that nonce). So no one
//! without the key pushes a VM into a daemon, and no one without it is
//! sent one. Then, in one connection:
//!
//! 1. a JSON line: the VM's name and image, how many snapshots follow;
//! 2. pre-copy: a whole snapshot, taken while the VM runs (its vCPU is held
//!    only while its pages are copied); the destination answers once it has
//!    it checked and sealed, and only then does the VM stop (so the
//!    downtime does not include the destination still taking in the whole);
//! 3. stop-and-copy: the VM paused, an incremental snapshot of the pages
//!    written since (KVM's dirty log and the monitor's own);
//! 4. each as a little-endian u64 length and the snapshot's bytes; the
//!    destination checks each as it comes (`snapshot::receive_over`, the
//!    increment over the digest it computed for the whole one);
//! 5. the destination restores the chain in a pooled shell (a NIC gets the
//!    VM's address and announces it) and answers a JSON line.
//!
//! Only then does the source end its copy of the VM. Any failure before —
//! the destination unreachable, refusing, dying, the connection dropping —
//! resumes the VM at the source.

use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod channel;
mod conn;

pub use conn::{Addr, Listener};
use channel::{Channel, Tee};
use conn::Conn;
use hmac::{Hmac, Mac};
use rustix::fs::{memfd_create, MemfdFlags};
use sha2::Sha256;
use wisp_api::{CreateVm, MigrateInfo, MigrateVm, VmState};
use wisp_vmm::snapshot;
use wisp_vmm_process::proto::Request;

use super::create::{Extras, More};
use super::snapshot::Restorable;
use super::error::ActionError;
use super::{hex, Daemon};

/// How long each step of a migration may take on the wire.
const IO_TIMEOUT: Duration = Duration::from_secs(20);
/// The protocol's greeting (2: each snapshot but the last is answered; 3:
/// every message after the handshake authenticated, `channel.rs`).
const GREETING: &str = "WISPMIG3";
/// Most bytes of one snapshot a destination takes.
const MAX_PART: u64 = wisp_abi::layout::MAX_MEM + (64 << 20);

/// The header of a migration.
#[derive(serde::Serialize, serde::Deserialize)]
struct Header {
    name: Option<String>,
    image: String,
    parts: u32,
}

/// The destination's answer: to each snapshot but the last (taken, or
/// why not), and to the whole (the VM's id there, or why not).
#[derive(serde::Serialize, serde::Deserialize)]
struct Answer {
    ok: bool,
    #[serde(default)]
    id: String,
    #[serde(default)]
    error: String,
}

fn mac(key: &[u8], role: &[u8], nonce: &[u8]) -> Hmac<Sha256> {
    let mut m = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes any key length");
    m.update(role);
    m.update(nonce);
    m
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    s.len().is_multiple_of(2).then(|| (0..s.len()).step_by(2).map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok()).collect::<Option<Vec<u8>>>()).flatten()
}

fn nonce() -> std::io::Result<[u8; 32]> {
    let mut n = [0u8; 32];
    rustix::rand::getrandom(&mut n, rustix::rand::GetRandomFlags::empty()).map_err(std::io::Error::from)?;
    Ok(n)
}

/// One line (at most 4 KiB) from the peer.
fn line(r: &mut impl BufRead) -> std::io::Result<String> {
    let mut s = String::new();
    r.take(4096).read_line(&mut s)?;
    if !s.ends_with('\n') {
        return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "the peer ended or sent a line too long"));
    }
    Ok(s.trim_end().to_string())
}

/// The source's side of the handshake: the channel its messages go on.
fn prove_source(r: &mut impl BufRead, w: &mut impl Write, key: &[u8]) -> Result<Channel, String> {
    let greet = line(r).map_err(|e| format!("no greeting: {e}"))?;
    let their = greet.strip_prefix(GREETING).map(str::trim).and_then(unhex).filter(|n| n.len() == 32).ok_or("not a wisp daemon's migration port")?;
    let mine = nonce().map_err(|e| e.to_string())?;
    writeln!(w, "{} {}", hex(&mac(key, b"src", &their).finalize().into_bytes()), hex(&mine)).map_err(|e| e.to_string())?;
    let answer = line(r).map_err(|e| format!("no answer to the key: {e}"))?;
    if let Some(e) = answer.strip_prefix("error: ") {
        return Err(e.to_string());
    }
    let proof = unhex(&answer).ok_or("a malformed proof")?;
    mac(key, b"dst", &mine).verify_slice(&proof).map_err(|_| "the destination does not hold the migration key".to_string())?;
    Ok(Channel::source(key, &their, &mine))
}

/// The destination's side of the handshake: the channel its messages go on.
fn prove_destination(r: &mut impl BufRead, w: &mut impl Write, key: &[u8]) -> Result<Channel, String> {
    let mine = nonce().map_err(|e| e.to_string())?;
    writeln!(w, "{GREETING} {}", hex(&mine)).map_err(|e| e.to_string())?;
    let reply = line(r).map_err(|e| e.to_string())?;
    let (proof, theirs) = reply.split_once(' ').ok_or("a malformed proof")?;
    let (proof, theirs) = (unhex(proof).ok_or("a malformed proof")?, unhex(theirs).filter(|n| n.len() == 32).ok_or("a malformed nonce")?);
    if mac(key, b"src", &mine).verify_slice(&proof).is_err() {
        let _ = writeln!(w, "error: the migration key does not match");
        return Err("a source without the migration key".into());
    }
    writeln!(w, "{}", hex(&mac(key, b"dst", &theirs).finalize().into_bytes())).map_err(|e| e.to_string())?;
    Ok(Channel::destination(key, &mine, &theirs))
}

impl Daemon {
    /// Move VM `key` to the daemon at `body.to`.
    pub(super) fn migrate_vm(self: &Arc<Self>, key: &str, body: MigrateVm, arrived: Instant) -> Result<MigrateInfo, ActionError> {
        let (id, dir, info) = self.dir_of(key)?;
        if info.state == VmState::Exited {
            return Err(ActionError::Exited(id));
        }
        // One migration at a time, and no pause, resume or snapshot of the
        // VM meanwhile (until this returns).
        let _moving = Moving::start(self, &id)?;
        let fail = |why: String| ActionError::Migrate { to: body.to.clone(), why };
        if !info.links.is_empty() {
            return Err(fail("a VM with links cannot be moved yet (its links' taps live in namespaces of this host)".into()));
        }
        let secret = self.cfg.migrate_key.clone().ok_or_else(|| fail("this daemon has no migration key (wispd --migrate-key FILE)".into()))?;
        let addr: Addr = body.to.parse().map_err(fail)?;
        let conn = Conn::connect(&addr, IO_TIMEOUT).map_err(|e| fail(e.to_string()))?;
        let mut r = BufReader::new(conn.try_clone().map_err(|e| fail(e.to_string()))?);
        let mut w = &conn;
        let mut ch = prove_source(&mut r, &mut w, &secret).map_err(fail)?;
        let header = Header { name: info.name.clone(), image: info.image.clone(), parts: 2 };
        ch.send_line(&mut w, &serde_json::to_string(&header).unwrap_or_default()).map_err(|e| fail(e.to_string()))?;
        // Pre-copy: the whole VM while it runs.
        let whole = self.save_part(&id, &dir, info.mem, Request::Snapshot { incremental: false, pause: false }).map_err(|e| fail(e.to_string()))?;
        send_part(&mut w, &mut ch, &whole).map_err(|e| fail(e.to_string()))?;
        answer(&mut r, &mut ch).map_err(fail)?;
        // Stop-and-copy, in one request: paused, the pages written since.
        let down = Instant::now();
        // Once the increment has gone, only the destination's answer says
        // where the VM runs: without one, it is left paused here.
        let moved = self.save_part(&id, &dir, info.mem, Request::Snapshot { incremental: true, pause: true }).and_then(|inc| {
            send_part(&mut w, &mut ch, &inc).map_err(|e| fail(e.to_string()))?;
            let there = match read_answer(&mut r, &mut ch) {
                Err(why) => return Err(ActionError::MigrateUnknown { to: body.to.clone(), why }),
                Ok(Err(refused)) => return Err(fail(refused)),
                Ok(Ok(there)) => there,
            };
            Ok((there, whole.metadata().map(|m| m.len()).unwrap_or(0) + inc.metadata().map(|m| m.len()).unwrap_or(0)))
        });
        match moved {
            Ok((there, bytes)) => {
                let id_shown = id.clone();
                let downtime_us = down.elapsed().as_micros() as u64;
                // It runs there: this copy is hidden (its name is free, no
                // key finds it, its end goes unrecorded), killed now (a
                // signal; the paused vCPU never runs again) and removed off
                // the request's path once its process has ended.
                self.vms.lock().hide(&id);
                self.kill_process(&id);
                let d = self.clone();
                std::thread::spawn(move || {
                    if let Err(e) = d.remove_found(id.clone(), &dir, &info, true) {
                        eprintln!("wispd: VM {id}, moved away: cannot remove its copy here: {e}");
                    }
                });
                Ok(MigrateInfo { vm: id_shown, to: body.to, there, bytes, downtime_us, took_us: arrived.elapsed().as_micros() as u64 })
            }
            // No answer after the increment: it may run there.
            Err(e @ ActionError::MigrateUnknown { .. }) => Err(e),
            Err(e) => {
                // Nothing moved: the VM goes on here (as it was: a VM paused
                // before stays paused).
                if info.state == VmState::Running {
                    let _ = self.set_paused(&id, false);
                }
                Err(e)
            }
        }
    }

    /// A snapshot of VM `id` into a memfd of the daemon's own (`how`: a
    /// [`Request::Snapshot`]).
    fn save_part(&self, id: &str, dir: &std::path::Path, mem: u64, how: Request) -> Result<File, ActionError> {
        let fd = memfd_create("wisp-migrate", MemfdFlags::CLOEXEC).map_err(|e| ActionError::Snapshot { path: "migration".into(), why: e.to_string() })?;
        let file = File::from(fd);
        self.save_into(id, dir, mem, file.try_clone().map_err(ActionError::Vmm)?, how, "migration")?;
        Ok(file)
    }

    /// Take migrations on `listener` (`wispd --migrate-listen`), one at a
    /// time, each on this thread.
    pub fn serve_migrations(self: Arc<Self>, listener: Listener) {
        loop {
            let Ok(conn) = listener.accept() else { continue };
            if let Err(e) = self.take_migration(&conn) {
                eprintln!("wispd: migration from {}: {e}", conn.peer());
            }
        }
    }

    fn take_migration(&self, conn: &Conn) -> Result<(), String> {
        let key = self.cfg.migrate_key.clone().ok_or("no migration key")?;
        conn.set_timeouts(IO_TIMEOUT).map_err(|e| e.to_string())?;
        let mut r = BufReader::new(conn.try_clone().map_err(|e| e.to_string())?);
        let mut w = conn;
        let mut ch = prove_destination(&mut r, &mut w, &key)?;
        let header: Header = serde_json::from_str(&ch.recv_line(&mut r)?).map_err(|e| format!("a malformed header: {e}"))?;
        if !(1..=64).contains(&header.parts) {
            return Err(format!("{} snapshots announced", header.parts));
        }
        let answer = match self.receive_vm(&mut r, &mut w, &mut ch, &header) {
            Ok(id) => Answer { ok: true, id, error: String::new() },
            Err(e) => Answer { ok: false, id: String::new(), error: e.to_string() },
        };
        let told = ch.send_line(&mut w, &serde_json::to_string(&answer).unwrap_or_default());
        if told.is_err() && answer.ok {
            // The source cannot learn that it runs here, and may resume its
            // copy: this one goes.
            let _ = self.remove(&answer.id, true);
        }
        told.map_err(|e| e.to_string())
    }

    /// The snapshots of a migration, checked as they come, and the VM
    /// restored from them (its id). Each snapshot but the last is answered
    /// once checked and sealed, the one before the last once it is restored
    /// in a pooled shell and held there: the source stops the VM then, and
    /// the last increment only has to be laid over it.
    fn receive_vm(&self, r: &mut impl Read, w: &mut impl Write, ch: &mut Channel, header: &Header) -> Result<String, ActionError> {
        let fail = |why: String| ActionError::Snapshot { path: "migration".into(), why };
        let req = CreateVm { image: header.image.clone(), name: header.name.clone(), ..Default::default() };
        let mut chain: Vec<Arc<Restorable>> = Vec::new();
        for i in 0..header.parts - 1 {
            if i > 0 {
                taken(w, ch).map_err(|e| fail(e.to_string()))?;
            }
            chain.push(receive_part(r, ch, i, chain.last())?);
        }
        let Some(restore) = chain.pop() else {
            // A single snapshot: restored as it is.
            let last = receive_part(r, ch, 0, None)?;
            return Ok(self.create(req, Instant::now(), Extras { restore: Some(last), ..Default::default() })?.id);
        };
        let base = restore.clone();
        let last = header.parts - 1;
        let more: More<'_> = Box::new(move || {
            taken(w, ch).map_err(|e| fail(e.to_string()))?;
            receive_part(r, ch, last, Some(&base))
        });
        let info = self.create(req, Instant::now(), Extras { restore: Some(restore), bases: chain, hold: Some(more), ..Default::default() })?;
        Ok(info.id)
    }
}

/// Snapshot `i` of a migration from `r` (its length, its bytes, its tag on
/// `ch`), checked as it comes (an increment over `base`), its tag verified
/// before it is used, and sealed where it is.
fn receive_part(r: &mut impl Read, ch: &mut Channel, i: u32, base: Option<&Arc<Restorable>>) -> Result<Arc<Restorable>, ActionError> {
    let fail = |why: String| ActionError::Snapshot { path: "migration".into(), why };
    let mut len = [0u8; 8];
    r.read_exact(&mut len).map_err(|e| fail(format!("snapshot {i}: {e}")))?;
    let mut mac = ch.next_in();
    mac.update(&len);
    let len = u64::from_le_bytes(len);
    if len > MAX_PART {
        return Err(fail(format!("snapshot {i} of {len} bytes")));
    }
    let file = File::from(memfd_create("wisp-migrated", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING).map_err(|e| fail(e.to_string()))?);
    let base = base.map(|b| b.snap.header.digest);
    let snap = snapshot::receive_over(&mut Tee { inner: (&mut *r).take(len), mac: &mut mac }, &file, wisp_abi::layout::MAX_MEM, base)
        .map_err(|e| fail(format!("snapshot {i}: {e}")))?;
    let mut tag = [0u8; 32];
    r.read_exact(&mut tag).map_err(|e| fail(format!("snapshot {i}'s tag: {e}")))?;
    mac.verify_slice(&tag).map_err(|_| fail(format!("snapshot {i} does not verify (changed on the way?)")))?;
    // Checked as it came, its digest computed here: sealed where it is.
    Ok(Arc::new(super::snapshot::sealed(file, snap, "migration")?))
}

/// The destination's answer to a snapshot it has taken.
fn taken(w: &mut impl Write, ch: &mut Channel) -> std::io::Result<()> {
    ch.send_line(w, &serde_json::to_string(&Answer { ok: true, id: String::new(), error: String::new() }).unwrap_or_default())
}

/// The destination's answer: its id there (empty for a snapshot taken), or
/// the error it gave.
fn answer(r: &mut impl BufRead, ch: &mut Channel) -> Result<String, String> {
    read_answer(r, ch).and_then(|a| a)
}

/// The destination's answer as it came (`Ok`: its id there, or the error
/// it refused with), or why none came (`Err`).
fn read_answer(r: &mut impl BufRead, ch: &mut Channel) -> Result<Result<String, String>, String> {
    let a: Answer = serde_json::from_str(&ch.recv_line(r).map_err(|e| format!("no answer: {e}"))?).map_err(|e| format!("a malformed answer: {e}"))?;
    Ok(if a.ok { Ok(a.id) } else { Err(a.error) })
}

/// A VM being migrated ([`Entry::migrating`](super::table::Entry)), until
/// this is dropped.
struct Moving<'a> {
    d: &'a Daemon,
    id: String,
}

impl<'a> Moving<'a> {
    fn start(d: &'a Daemon, id: &str) -> Result<Moving<'a>, ActionError> {
        let mut t = d.vms.lock();
        let e = t.by_id.get_mut(id).ok_or_else(|| ActionError::NotFound(id.to_string()))?;
        if e.migrating {
            return Err(ActionError::Migrating(id.to_string()));
        }
        e.migrating = true;
        Ok(Moving { d, id: id.to_string() })
    }
}

impl Drop for Moving<'_> {
    fn drop(&mut self) {
        if let Some(e) = self.d.vms.lock().by_id.get_mut(&self.id) {
            e.migrating = false;
        }
    }
}

/// One snapshot on the wire: its length, its bytes, and its tag on `ch`.
fn send_part(w: &mut impl Write, ch: &mut Channel, f: &File) -> std::io::Result<()> {
    let len = f.metadata()?.len().to_le_bytes();
    let mut mac = ch.next_out();
    mac.update(&len);
    w.write_all(&len)?;
    let mut buf = vec![0u8; 64 << 10];
    let mut rd = Read::take(f, u64::from_le_bytes(len));
    loop {
        let n = rd.read(&mut buf)?;
        if n == 0 {
            break;
        }
        mac.update(&buf[..n]);
        w.write_all(&buf[..n])?;
    }
    w.write_all(&mac.finalize().into_bytes())?;
    w.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn daemons_prove_the_key_to_each_other() {
        // Source and destination over a socket pair, with the same key and
        // with different ones.
        for (src_key, dst_key, ok) in [(b"same key 123456".as_slice(), b"same key 123456".as_slice(), true), (b"one key 1234567", b"another key 123", false)] {
            let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
            let dst = std::thread::spawn(move || {
                let mut r = BufReader::new(b.try_clone().unwrap());
                let mut ch = prove_destination(&mut r, &mut &b, dst_key)?;
                // The first message after the handshake, authenticated.
                ch.recv_line(&mut r)
            });
            let mut r = BufReader::new(a.try_clone().unwrap());
            let src = prove_source(&mut r, &mut &a, src_key).and_then(|mut ch| ch.send_line(&mut &a, "header").map_err(|e| e.to_string()));
            let dst = dst.join().unwrap();
            assert_eq!((src.is_ok(), dst.is_ok()), (ok, ok), "{src:?} {dst:?}");
            if ok {
                assert_eq!(dst.unwrap(), "header", "both sides derived the same session");
            } else {
                assert_eq!(src.unwrap_err(), "the migration key does not match");
            }
        }
    }
}
