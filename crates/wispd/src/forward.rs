//! Host port forwarding (`wisp run -p [ADDR:]HOSTPORT:VMPORT`): a listening
//! TCP socket on the host per mapping, on the address it names (by default
//! 127.0.0.1: this host only, never every address by accident); each
//! connection is joined to a new connection to the VM's address, bytes
//! copied both ways by two threads.
//!
//! Bounded ([`Limits`], set once by `main`): at most `max_connections`
//! forwarded connections at once in the daemon and `max_per_port` per
//! forward, beyond which a connection is refused (reset at once); a
//! connection that moves no byte either way for `idle_timeout` is closed,
//! and a peer that stops reading blocks a copy at most that long.

use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use wisp_api::PortMap;

use crate::slots::Slots;

/// How long a forwarded connection may take to reach the VM.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Bounds of the forwarded connections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Most forwarded connections at once, all forwards together.
    pub max_connections: usize,
    /// Most at once through one forward.
    pub max_per_port: usize,
    /// A connection with no byte either way for this long is closed.
    pub idle_timeout: Duration,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits { max_connections: 1024, max_per_port: 256, idle_timeout: Duration::from_secs(300) }
    }
}

/// The limits and the daemon-wide connection slots.
static LIMITS: OnceLock<(Limits, Slots)> = OnceLock::new();

/// Set the limits of every forward started from now on (once, at start).
pub fn configure(limits: Limits) {
    let _ = LIMITS.set((limits, Slots::new(limits.max_connections)));
}

fn limits() -> &'static (Limits, Slots) {
    LIMITS.get_or_init(|| (Limits::default(), Slots::new(Limits::default().max_connections)))
}

/// A running forward; stopped (listener closed) on drop.
pub struct Forward {
    listener: Arc<TcpListener>,
}

impl Forward {
    /// Listen on `map.host` at `map`'s host address and forward to `vm_ip:map.vm`.
    pub fn start(map: PortMap, vm_ip: Ipv4Addr) -> io::Result<Forward> {
        let listener = Arc::new(TcpListener::bind(SocketAddr::new(map.host_addr(), map.host))?);
        let target = SocketAddr::from((vm_ip, map.vm));
        serve(listener.clone(), map.host, move |_| TcpStream::connect_timeout(&target, CONNECT_TIMEOUT).ok().map(|vm| (vm, ())))?;
        Ok(Forward { listener })
    }

    /// Forward every mapping of a new VM: all of them, or none (those
    /// started are stopped again) and the mapping that failed, with why.
    pub fn start_all(maps: &[PortMap], vm_ip: Ipv4Addr) -> Result<Vec<Forward>, (PortMap, io::Error)> {
        maps.iter().map(|m| Forward::start(*m, vm_ip).map_err(|e| (*m, e))).collect()
    }

    /// Forward the mappings of a re-adopted VM `vm` again: those that
    /// cannot be are logged and skipped.
    pub fn restore(vm: &str, maps: &[PortMap], vm_ip: Ipv4Addr) -> Vec<Forward> {
        maps.iter()
            .filter_map(|m| match Forward::start(*m, vm_ip) {
                Ok(f) => Some(f),
                Err(e) => {
                    eprintln!("wispd: VM {vm}: cannot forward host port {} again: {e}", m.host);
                    None
                }
            })
            .collect()
    }
}

impl Drop for Forward {
    fn drop(&mut self) {
        // Wakes the accept loop with an error, which ends it.
        shut(&self.listener);
    }
}

/// Accept on `listener` until it is shut down (named `fwd<port>`). Each
/// connection within the caps gets a thread that asks `connect` (with the
/// client's address) for the other end and a guard it keeps for the
/// connection's life, then copies both ways; `None` closes the client's
/// connection. Forwards and just-in-time services (`daemon/jit.rs`) share it.
pub fn serve<G, F>(listener: Arc<TcpListener>, port: u16, connect: F) -> io::Result<()>
where
    G: Send + 'static,
    F: Fn(SocketAddr) -> Option<(TcpStream, G)> + Send + Sync + 'static,
{
    let (limits, all) = limits();
    let (limits, all, here) = (*limits, all.clone(), Slots::new(limits.max_per_port));
    let connect = Arc::new(connect);
    std::thread::Builder::new().name(format!("fwd{port}")).spawn(move || {
        for conn in listener.incoming() {
            let Ok(client) = conn else { break };
            // Both slots or none (one taken alone is given back here).
            let (Some(a), Some(b)) = (all.try_take(), here.try_take()) else {
                refuse(client);
                continue;
            };
            let connect = connect.clone();
            let _ = std::thread::Builder::new().name(format!("fwd{port}")).spawn(move || {
                let _slots = (a, b);
                let Ok(from) = client.peer_addr() else { return };
                if let Some((vm, _guard)) = connect(from) {
                    splice(client, vm, limits.idle_timeout);
                }
            });
        }
    })?;
    Ok(())
}

/// Shut `listener` down: its accept loop ([`serve`]) ends.
pub fn shut(listener: &TcpListener) {
    let _ = rustix::net::shutdown(listener, rustix::net::Shutdown::Both);
}

/// Refuse a connection over the caps: reset it at once.
fn refuse(client: TcpStream) {
    let _ = rustix::net::sockopt::set_socket_linger(&client, Some(Duration::ZERO));
}

/// Copy both directions until each side has finished, or until no byte has
/// moved either way for `idle`.
fn splice(a: TcpStream, b: TcpStream, idle: Duration) {
    // Reads wake up now and then to look at the clock; a write that blocks
    // for `idle` ends the connection.
    let tick = (idle / 4).clamp(Duration::from_millis(20), Duration::from_secs(5));
    for s in [&a, &b] {
        if s.set_read_timeout(Some(tick)).and_then(|()| s.set_write_timeout(Some(idle))).is_err() {
            return;
        }
    }
    let (Ok(a2), Ok(b2)) = (a.try_clone(), b.try_clone()) else { return };
    let clock = Arc::new(Clock { start: Instant::now(), last_ms: AtomicU64::new(0) });
    let c2 = clock.clone();
    let Ok(t) = std::thread::Builder::new().name("fwd-copy".into()).spawn(move || copy(a2, b2, &c2, idle)) else {
        return;
    };
    copy(b, a, &clock, idle);
    let _ = t.join();
}

/// When a byte last moved, either way.
struct Clock {
    start: Instant,
    last_ms: AtomicU64,
}

impl Clock {
    fn touch(&self) {
        self.last_ms.store(self.start.elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    fn quiet_for(&self) -> Duration {
        self.start.elapsed().saturating_sub(Duration::from_millis(self.last_ms.load(Ordering::Relaxed)))
    }
}

/// Copy `from` to `to` until EOF (then half-close `to`); on an error, or
/// when the connection has been idle for `idle`, close both.
fn copy(mut from: TcpStream, mut to: TcpStream, clock: &Clock, idle: Duration) {
    let mut buf = [0u8; 16384];
    loop {
        match from.read(&mut buf) {
            Ok(0) => {
                let _ = to.shutdown(Shutdown::Write);
                return;
            }
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
                clock.touch();
            }
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                if clock.quiet_for() >= idle {
                    break;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    let _ = from.shutdown(Shutdown::Both);
    let _ = to.shutdown(Shutdown::Both);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A forward on 127.0.0.1 to an echo server on 127.0.0.1 (the "VM").
    fn echo_server() -> (u16, std::thread::JoinHandle<()>) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let t = std::thread::spawn(move || {
            for s in l.incoming().take(8) {
                let Ok(mut s) = s else { return };
                std::thread::spawn(move || {
                    let mut r = s.try_clone().unwrap();
                    let _ = io::copy(&mut r, &mut s);
                });
            }
        });
        (port, t)
    }

    #[test]
    fn splice_closes_an_idle_connection_and_keeps_a_busy_one() {
        let (port, _srv) = echo_server();
        let front = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = front.local_addr().unwrap();
        let fwd = std::thread::spawn(move || {
            for _ in 0..2 {
                let (c, _) = front.accept().unwrap();
                let vm = TcpStream::connect(("127.0.0.1", port)).unwrap();
                std::thread::spawn(move || splice(c, vm, Duration::from_millis(400)));
            }
        });
        // Idle: closed after about 400 ms, not before.
        let mut idle = TcpStream::connect(addr).unwrap();
        idle.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let t = Instant::now();
        assert_eq!(idle.read(&mut [0; 8]).unwrap_or(0), 0, "idle connection not closed");
        assert!(t.elapsed() >= Duration::from_millis(400), "closed early: {:?}", t.elapsed());
        // Busy: a byte every 100 ms for 1.2 s keeps it open.
        let mut busy = TcpStream::connect(addr).unwrap();
        busy.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let t = Instant::now();
        while t.elapsed() < Duration::from_millis(1200) {
            busy.write_all(b"x").unwrap();
            let mut b = [0u8; 1];
            busy.read_exact(&mut b).expect("busy connection closed");
            std::thread::sleep(Duration::from_millis(100)); // pacing of the traffic, not synchronisation
        }
        fwd.join().unwrap();
    }
}
