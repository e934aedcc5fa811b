//! The REST API (see `docs/api.yaml`): HTTP/1.1 on a Unix socket, one thread
//! per connection, JSON bodies. This layer only translates: an HTTP request
//! becomes an [`Action`] (bad input is a 4xx with a message), the daemon
//! executes it, and its [`Outcome`] or [`ActionError`] becomes the response.
//! The HTTP status of each error lives here, in [`status`].
//!
//! Connections are bounded: a peer that is not root, the daemon's user or a
//! member of the API group is answered 403 ([`Access`]); beyond
//! `max_connections` at once a connection is answered 503 (both by one
//! thread that answers and closes, without reading more than a little of
//! the request); a connection idle longer than `idle_timeout` between
//! requests is closed, a request not received whole within `read_timeout`
//! of its first byte is answered 408, and a peer that does not take a
//! response within `write_timeout` loses its connection.

use std::io::{self, BufRead, BufReader, Read};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use wisp_api::action::Action;
use wisp_api::http::{self, HttpError, Request};

use crate::access::{Access, Peer};
use crate::daemon::{ActionError, Console, Daemon, Outcome};
use crate::slots::Slots;

/// How the API's connections are bounded.
#[derive(Clone, Debug)]
pub struct Config {
    /// Who may connect.
    pub access: Access,
    /// Most connections served at once.
    pub max_connections: usize,
    /// Longest wait for the next request on a kept-alive connection.
    pub idle_timeout: Duration,
    /// Longest time for a request to arrive whole, from its first byte.
    pub read_timeout: Duration,
    /// Longest time a response write may block on a peer that does not read.
    pub write_timeout: Duration,
}

/// Refused connections waiting for their answer; more are closed unanswered.
const REFUSALS_QUEUED: usize = 64;
/// How long a refused connection is given to finish sending and take its answer.
const REFUSAL_TIME: Duration = Duration::from_millis(500);

/// A connection to answer with an error and close.
struct Refusal {
    conn: UnixStream,
    status: u16,
    message: String,
}

/// Serve the API on `listener` forever.
pub fn serve(daemon: Arc<Daemon>, listener: UnixListener, cfg: Config) {
    let cfg = Arc::new(cfg);
    let slots = Slots::new(cfg.max_connections);
    let (refusals, queue) = mpsc::sync_channel::<Refusal>(REFUSALS_QUEUED);
    let _ = std::thread::Builder::new().name("api-refuse".into()).spawn(move || queue.into_iter().for_each(refuse));
    for conn in listener.incoming() {
        let Ok(conn) = conn else { continue };
        if let Err((peer, message)) = cfg.access.check(&conn) {
            eprintln!("wispd: API: refused a connection from {}: {message}", describe(peer.as_ref()));
            let _ = refusals.try_send(Refusal { conn, status: 403, message });
            continue;
        }
        let Some(slot) = slots.try_take() else {
            let message = format!("too many API connections (at most {}); try again later", slots.max());
            let _ = refusals.try_send(Refusal { conn, status: 503, message });
            continue;
        };
        let (d, cfg) = (daemon.clone(), cfg.clone());
        let _ = std::thread::Builder::new().name("api".into()).spawn(move || {
            let _slot = slot;
            touch_stack();
            connection(d, conn, &cfg)
        });
    }
}

/// Stack a request's path uses, made resident while the connection waits
/// for its first request (a first touch costs a page fault, several µs
/// each on a virtualised host, on the request's path otherwise).
const STACK_AHEAD: usize = 32 << 10;

#[inline(never)]
fn touch_stack() {
    let mut pages = [0u8; STACK_AHEAD];
    std::hint::black_box(&mut pages);
}

fn describe(peer: Option<&Peer>) -> String {
    match peer {
        Some(p) => format!("uid {} gid {} pid {}", p.uid, p.gid, p.pid),
        None => "an unknown peer".into(),
    }
}

/// Answer a refused connection and close it, after taking (a bounded amount
/// of, for a bounded time) what the client sends, so that it reads the
/// answer rather than a reset.
fn refuse(r: Refusal) {
    let conn = r.conn;
    let _ = conn.set_write_timeout(Some(REFUSAL_TIME));
    let _ = http::write_error(&mut &conn, r.status, &r.message, false);
    let _ = conn.shutdown(std::net::Shutdown::Write);
    let deadline = Instant::now() + REFUSAL_TIME;
    let (mut buf, mut left) = ([0u8; 4096], 64usize << 10);
    while left > 0 {
        let rest = deadline.saturating_duration_since(Instant::now());
        if rest.is_zero() || conn.set_read_timeout(Some(rest)).is_err() {
            break;
        }
        match (&conn).read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => left = left.saturating_sub(n),
        }
    }
}

/// The read half of a connection: every read ends by a deadline.
struct Timed {
    stream: UnixStream,
    deadline: Instant,
    expired: bool,
}

impl Timed {
    /// Reads from now on end within `limit`.
    fn arm(&mut self, limit: Duration) {
        self.deadline = Instant::now() + limit;
        self.expired = false;
    }
}

impl Read for Timed {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            self.expired = true;
            return Err(io::ErrorKind::TimedOut.into());
        }
        self.stream.set_read_timeout(Some(left))?;
        let r = self.stream.read(buf);
        if matches!(&r, Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut)) {
            self.expired = true;
        }
        r
    }
}

fn connection(d: Arc<Daemon>, conn: UnixStream, cfg: &Config) {
    let _ = conn.set_write_timeout(Some(cfg.write_timeout));
    let Ok(read_half) = conn.try_clone() else { return };
    let mut r = BufReader::new(Timed { stream: read_half, deadline: Instant::now(), expired: false });
    let mut w = conn;
    loop {
        // The next request begins within the idle timeout (or the connection
        // is closed quietly) and arrives whole within the read timeout.
        r.get_mut().arm(cfg.idle_timeout);
        if !r.fill_buf().is_ok_and(|b| !b.is_empty()) {
            return;
        }
        // The request has arrived (its first byte): what `first_line_us` counts from.
        let arrived = Instant::now();
        r.get_mut().arm(cfg.read_timeout);
        let req = match http::read_request_with(&mut r, &mut w) {
            Ok(Some(req)) => req,
            Ok(None) => return,
            Err(_) if r.get_ref().expired => {
                let message = format!("the request did not arrive within {:?}", cfg.read_timeout);
                let _ = http::write_error(&mut w, 408, &message, false);
                return;
            }
            Err(e) => {
                let _ = http::write_error(&mut w, e.status, &e.message, false);
                return;
            }
        };
        let keep = req.keep_alive();
        match route(&d, &req, &mut w, keep, arrived) {
            Ok(true) => {}
            Ok(false) => return, // streamed: connection used up
            Err(e) => {
                if http::write_error(&mut w, e.status, &e.message, keep).is_err() {
                    return;
                }
            }
        }
        if !keep {
            return;
        }
    }
}

/// The HTTP status of each action error: the one place it is chosen.
/// Quotas: 429 when there would be too many (VMs, pooled shells), 507 when
/// there is not enough (guest memory).
fn status(e: &ActionError) -> u16 {
    use crate::pool::PoolError;
    use ActionError::*;
    match e {
        Pool(PoolError::TooLarge { .. } | PoolError::TooManySizes) | TooManyVms(_) | TooManyRecyclers(_) | TooManyJits(_) => 429,
        GuestMemory { .. } => 507,
        BadMemory(_) | InvalidName(_) | GuestData(_) | Invalid(_) | BadImage(_) | StartRefused(_) | Pool(_) | Snapshot { .. } => 400,
        Limits(_) | TooManyCpus { .. } | MemoryBelowVm { .. } | NoCgroups => 400,
        NotFound(_) | Gone(_) | NoTemplate(_) | NoRecycler(_) | NoJit(_) => 404,
        // A host address that is not this host's cannot be listened on: the request was wrong.
        PortInUse { source, .. } if source.kind() == io::ErrorKind::AddrNotAvailable => 400,
        NameInUse(_) | Ambiguous(_) | Exited(_) | Running(_) | Refused(_) | Unreachable { .. } | PortInUse { .. } | Migrating(_) | LinkTaken(_) => 409,
        Link(_) => 400,
        EndedBeforeLine { .. } | StdinRefused(_) => 409,
        Timeout(_) | NoLineInTime { .. } => 504,
        Prepare(_) | Network(_) | Record(_) | Vmm(_) | Contain(_) => 500,
        // The other daemon failed it.
        Migrate { .. } | MigrateUnknown { .. } => 502,
    }
}

/// An answer with an error status.
struct Failure {
    status: u16,
    message: String,
}

impl From<HttpError> for Failure {
    fn from(e: HttpError) -> Failure {
        Failure { status: e.status, message: e.message }
    }
}

impl From<ActionError> for Failure {
    fn from(e: ActionError) -> Failure {
        Failure { status: status(&e), message: e.to_string() }
    }
}

impl From<io::Error> for Failure {
    fn from(e: io::Error) -> Failure {
        Failure { status: 500, message: e.to_string() }
    }
}

/// Handle one request. Ok(true): answered, connection reusable; Ok(false):
/// answered with a stream that ended the connection.
fn route(d: &Arc<Daemon>, req: &Request, w: &mut UnixStream, keep: bool, arrived: Instant) -> Result<bool, Failure> {
    let action = Action::from_request(req)?;
    let outcome = d.handle(action, arrived, w)?;
    match outcome {
        Outcome::Version(v) => json(w, 200, &v, keep),
        Outcome::Vms(v) => json(w, 200, &v, keep),
        Outcome::Metrics(text) => {
            http::write_response(w, 200, crate::metrics::CONTENT_TYPE, text.as_bytes(), keep)?;
            Ok(true)
        }
        Outcome::Created(v) => json(w, 201, &v, keep),
        Outcome::Vm(v) => json(w, 200, &v, keep),
        Outcome::Exit(x) => json(w, 200, &x, keep),
        Outcome::Pool(p) => json(w, 200, &p, keep),
        Outcome::Snapshot(s) => json(w, 201, &s, keep),
        Outcome::Updated(u) => json(w, 200, &u, keep),
        Outcome::Template(t) => json(w, 201, &t, keep),
        Outcome::Templates(t) => json(w, 200, &t, keep),
        Outcome::Recycler(r) => json(w, 201, &r, keep),
        Outcome::Recyclers(r) => json(w, 200, &r, keep),
        Outcome::Jit(j) => json(w, 201, &j, keep),
        Outcome::Jits(j) => json(w, 200, &j, keep),
        Outcome::Migrated(m) => json(w, 200, &m, keep),
        Outcome::RemovedVms(r) => json(w, 200, &r, keep),
        Outcome::Removed => {
            http::write_response(w, 204, "application/json", b"", keep)?;
            Ok(true)
        }
        // Its VMM process answers (the VM's id in a header, then the
        // console until the VM ends) and closes the connection.
        Outcome::HandedOver => Ok(false),
        Outcome::Logs(console) => {
            http::start_chunked(w, 200, "application/octet-stream")?;
            stream(w, console, keep)
        }
    }
}

/// A JSON answer (the connection stays usable).
fn json<T: serde::Serialize>(w: &mut UnixStream, status: u16, v: &T, keep: bool) -> Result<bool, Failure> {
    http::write_response(w, status, "application/json", &serde_json::to_vec(v).unwrap_or_default(), keep)?;
    Ok(true)
}

/// Send `console` as the chunks of a started chunked response, until it
/// ends. False if the client went away (the connection is used up).
fn stream(w: &mut UnixStream, mut console: Console, keep: bool) -> Result<bool, Failure> {
    let mut buf = [0u8; 16384];
    loop {
        match console.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if http::write_chunk(w, &buf[..n]).is_err() {
                    return Ok(false);
                }
            }
        }
    }
    http::end_chunked(w)?;
    Ok(keep)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::ErrorKind;
    use wisp_api::action::InvalidCreate;

    #[test]
    fn statuses_and_messages_of_action_errors() {
        let io = || io::Error::new(ErrorKind::AddrInUse, "Address in use");
        let cases: Vec<(ActionError, u16, &str)> = vec![
            (ActionError::InvalidName("a b".into()), 400, "invalid name 'a b': use 1-64 of [A-Za-z0-9_.-]"),
            (ActionError::Invalid(InvalidCreate::RateWithoutNic), 400, "net_rate needs a NIC: ask for net or ports too"),
            (ActionError::Invalid(InvalidCreate::PeersWithoutNic), 400, "net_peers needs a NIC: ask for net or ports too"),
            (ActionError::StartRefused("bad image".into()), 400, "bad image"),
            (
                ActionError::Pool(crate::pool::PoolError::TooLarge { asked: 10_001, max: 64 }),
                429,
                "pool of 10001 shells is too large (at most 64 in all: wispd --max-pool-shells)",
            ),
            (ActionError::Pool(crate::pool::PoolError::TooManySizes), 429, "too many pool sizes: at most 16"),
            (ActionError::TooManyVms(2), 429, "too many VMs: at most 2 may run at once (wispd --max-vms)"),
            (
                ActionError::GuestMemory { asked: 64 << 20, used: 32 << 20, max: 64 << 20 },
                507,
                "not enough guest memory: 64 MiB asked, 32 MiB of 64 MiB in use (wispd --max-guest-memory)",
            ),
            (ActionError::Limits(wisp_api::action::LimitError::FamilyLimit(65)), 400, "family_limit 65: must be 1 to 64"),
            (ActionError::TooManyCpus { asked: 3.5, host: 2 }, 400, "cpus 3.5: this host has 2 CPUs"),
            (
                ActionError::MemoryBelowVm { memory: 1000, min: 20 << 20 },
                400,
                "memory limit 1000 bytes is below one VM of this size and its monitor (20 MiB)",
            ),
            (
                ActionError::NoCgroups,
                400,
                "memory and cpus limits need control groups, and this daemon runs without them (wispd --no-cgroups)",
            ),
            (ActionError::BadImage(crate::images::ImageError::Relative("a/b".into())), 400, "image path 'a/b' must be absolute"),
            (ActionError::NotFound("x".into()), 404, "no such VM: x"),
            (ActionError::Gone("x".into()), 404, "VM x was removed"),
            (ActionError::NameInUse("n".into()), 409, "the name 'n' is already in use"),
            (ActionError::Ambiguous("abc".into()), 409, "'abc' matches several VMs"),
            (ActionError::Exited("x".into()), 409, "VM x has exited"),
            (ActionError::Running("x".into()), 409, "VM x is running: stop it first or force removal"),
            (ActionError::Refused("already paused".into()), 409, "already paused"),
            (ActionError::Unreachable { id: "x".into(), source: io() }, 409, "VM x is not reachable: Address in use"),
            (ActionError::PortInUse { port: 8013, source: io() }, 409, "cannot forward host port 8013: Address in use"),
            (
                ActionError::PortInUse { port: 8013, source: io::Error::new(ErrorKind::AddrNotAvailable, "Cannot assign") },
                400,
                "cannot forward host port 8013: Cannot assign",
            ),
            (ActionError::Timeout("x".into()), 504, "VM x did not exit in time"),
            (
                ActionError::EndedBeforeLine { id: "x".into(), reason: "exit 0: exited".into() },
                409,
                "VM x ended before its first console line (exit 0: exited)",
            ),
            (
                ActionError::NoLineInTime { id: "x".into(), waited: Duration::from_secs(10) },
                504,
                "VM x printed no complete console line within 10 s; it is still running",
            ),
            (ActionError::Record(io()), 500, "cannot record the VM: Address in use"),
            (ActionError::Vmm(io()), 500, "VMM process: Address in use"),
            (
                ActionError::Prepare(crate::daemon::process::SpawnError::NotReady("VMM process failed to start".into())),
                500,
                "cannot prepare a VM: VMM process failed to start",
            ),
        ];
        for (e, code, msg) in cases {
            let f = Failure::from(e);
            assert_eq!((f.status, f.message.as_str()), (code, msg));
        }
    }
}
