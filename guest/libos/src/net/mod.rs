//! Networking: TCP and UDP over the VM's virtual NIC, on the smoltcp stack.
//!
//! The NIC is the first `DeviceKind::Net` entry of the boot-info device
//! table; its MAC, IPv4 address/prefix and gateway come from there too
//! ([`config`]). The stack starts the first time an app creates a socket
//! and from then on the executor ([`crate::exec`]) polls it: all socket
//! operations are `async` and need [`crate::exec::block_on`] or
//! [`crate::exec::run`] to make progress. Apps that never touch this
//! module link none of it and pay nothing at run time.
//!
//! Frames move through two shared-memory rings without an exit per packet
//! (see `wisp_abi::net`): the guest kicks the monitor only when it queued
//! frames while the monitor's I/O thread sleeps, and the monitor wakes an
//! idle guest with one `events::NET` per batch. Before parking, a guest with
//! traffic flowing spins briefly on the RX ring, since parking and waking
//! cost more than the next frame usually takes to arrive.
//!
//! Where the monitor's tap has them, frames carry up to 64 KiB: smoltcp's
//! TCP segments leave coalesced into super-frames the host segments, the
//! host's arrive coalesced, and checksums the host computes or checked are
//! not computed or checked again (`nic.rs`, `tcp_gso`).
//!
//! The stack answers ARP and ICMP echo (ping) by itself.
//!
//! ```ignore
//! use wisp::net::TcpListener;
//! wisp::exec::block_on(async {
//!     let listener = TcpListener::bind(7)?;
//!     loop {
//!         let conn = listener.accept().await?;
//!         wisp::exec::spawn(async move {
//!             let mut buf = [0u8; 1024];
//!             while let Ok(n @ 1..) = conn.read(&mut buf).await {
//!                 if conn.write_all(&buf[..n]).await.is_err() { break; }
//!             }
//!         });
//!     }
//! })
//! ```
//!
//! Each socket keeps one waker per direction: at most one task should wait
//! to read (or accept, or receive) and one to write on a socket at a time.

pub mod link;
mod nic;
mod tcp;
mod udp;

use alloc::vec::Vec;
use core::fmt;

pub use core::net::Ipv4Addr;
use smoltcp::iface::{Config, Interface, PollIngressSingleResult, PollResult, SocketHandle, SocketSet};
use smoltcp::socket::Socket;
use smoltcp::time::Instant as SmolInstant;
use smoltcp::wire::{EthernetAddress, HardwareAddress, IpAddress, IpCidr};
use wisp_abi::bootinfo::MAX_DEVICES;
use wisp_abi::net::{decode_ipv4, decode_mac};
use wisp_abi::{DeviceDesc, DeviceKind};

pub use tcp::{TcpListener, TcpOptions, TcpStream};
pub use udp::{UdpSocket, MAX_DATAGRAM};

use crate::exec::{IoPoll, IoSource};
use crate::global::Global;
use nic::Nic;

/// The NIC's configuration, from the boot-info device table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NetConfig {
    /// MAC address.
    pub mac: [u8; 6],
    /// IPv4 address.
    pub ip: Ipv4Addr,
    /// Prefix length of the local network (e.g. 24).
    pub prefix: u8,
    /// Default gateway, if any.
    pub gateway: Option<Ipv4Addr>,
}

/// Errors of the socket operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Error {
    /// The VM has no (usable) NIC.
    NoDevice,
    /// The monitor stopped the NIC; no socket works any more.
    NetDown,
    /// The port is already bound.
    AddrInUse,
    /// No free local port is left.
    NoPorts,
    /// An argument is invalid (port 0, unspecified address, a datagram too
    /// large for one frame...).
    InvalidInput,
    /// The destination is not on the local network and there is no gateway.
    Unreachable,
    /// The peer refused the connection (it answered with a reset).
    ConnectionRefused,
    /// The connection was reset by the peer or aborted after timeouts.
    ConnectionReset,
    /// Connecting took too long.
    TimedOut,
    /// Writing after [`TcpStream::shutdown`], or to a connection the peer
    /// no longer reads.
    BrokenPipe,
    /// The heap has no room for another connection's buffers.
    NoMemory,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Error::NoDevice => "no network device",
            Error::NoMemory => "out of memory for another connection",
            Error::NetDown => "network device stopped",
            Error::AddrInUse => "address in use",
            Error::NoPorts => "no free local port",
            Error::InvalidInput => "invalid argument",
            Error::Unreachable => "network unreachable",
            Error::ConnectionRefused => "connection refused",
            Error::ConnectionReset => "connection reset",
            Error::TimedOut => "timed out",
            Error::BrokenPipe => "broken pipe",
        })
    }
}

/// Result of the socket operations.
pub type Result<T> = core::result::Result<T, Error>;

/// The first NIC in the device table: (table index, entry, configuration).
fn find_nic() -> Option<(u32, &'static DeviceDesc, NetConfig)> {
    let info = crate::env::boot_info();
    let n = (info.device_count as usize).min(MAX_DEVICES);
    let (i, dev) = info.devices[..n].iter().enumerate().find(|(_, d)| d.kind == DeviceKind::Net as u32)?;
    Some((i as u32, dev, decode_config(dev)))
}

/// The address configuration of a NIC's device-table entry.
fn decode_config(dev: &DeviceDesc) -> NetConfig {
    let mac = decode_mac(dev.params[0]);
    let (ip, prefix) = decode_ipv4(dev.params[1]);
    let (gw, _) = decode_ipv4(dev.params[2]);
    NetConfig {
        mac,
        ip: Ipv4Addr::from(ip),
        prefix,
        gateway: if gw == [0; 4] { None } else { Some(Ipv4Addr::from(gw)) },
    }
}

/// Whether `cfg` is one the stack can use.
fn usable(cfg: &NetConfig) -> bool {
    let unicast_mac = cfg.mac[0] & 1 == 0 && cfg.mac != [0; 6];
    unicast_mac && cfg.prefix <= 32 && !cfg.ip.is_unspecified() && !cfg.ip.is_broadcast()
}

/// For a server app: the port given as argument `n` (default `default`)
/// and the NIC's configuration. On a bad argument or without a NIC it
/// prints why (prefixed with `app`) and returns the exit code to use.
pub fn server_args(app: &str, n: usize, default: u16) -> core::result::Result<(u16, NetConfig), i32> {
    let port = match crate::env::arg(n).map(str::parse::<u16>) {
        None => default,
        Some(Ok(p)) if p != 0 => p,
        Some(_) => {
            crate::eprintln!("usage: {} [PORT]", app);
            return Err(2);
        }
    };
    match config() {
        Some(cfg) => Ok((port, cfg)),
        None => {
            crate::eprintln!("{}: no network device (run with a NIC)", app);
            Err(1)
        }
    }
}

/// The NIC's configuration, or `None` if the VM has no (usable) NIC.
pub fn config() -> Option<NetConfig> {
    find_nic().map(|(_, _, cfg)| cfg).filter(usable)
}

/// Nanoseconds on the monotonic clock as a smoltcp instant.
fn smol(ns: u64) -> SmolInstant {
    SmolInstant::from_micros((ns / 1000) as i64)
}

/// A smoltcp instant as nanoseconds on the monotonic clock.
fn nanos(t: SmolInstant) -> u64 {
    (t.total_micros().max(0) as u64).saturating_mul(1000)
}

/// Most `Interface::poll` rounds per executor poll (each sends at most one
/// segment per socket).
const MAX_ROUNDS: usize = 64;
/// Most frames one poll takes from the RX ring. smoltcp hands each to its
/// socket's queue at once, and the tasks that empty those queues run only
/// after the poll: a burst of a whole ring (512 frames) into a UDP socket
/// holding `udp::QUEUE_PACKETS` would drop the rest. The frames left wait
/// in the ring (and then the tap), as in a NIC's queue, and the executor
/// polls again after the woken tasks ran.
const INGRESS_BATCH: usize = 64;
const _: () = assert!(udp::RECV_PACKETS >= 2 * INGRESS_BATCH);
/// With the TX ring full, poll again this soon (the monitor drains it
/// without telling us).
const TX_FULL_RETRY_NS: u64 = 20_000;
/// A closed connection that has not finished closing after this long is
/// aborted (a peer that never sends its FIN, or never answers).
const TCP_LINGER_NS: u64 = 60_000_000_000;
/// A dropped UDP socket's unsent datagrams are given this long (address
/// resolution) before they are discarded.
const UDP_LINGER_NS: u64 = 5_000_000_000;
/// First ephemeral port.
const EPHEMERAL_BASE: u16 = 49152;

/// The network stack.
pub(crate) struct Stack {
    cfg: NetConfig,
    iface: Interface,
    nic: Nic,
    sockets: SocketSet<'static>,
    /// TCP listeners, indexed by `TcpListener::id`.
    listeners: Vec<Option<tcp::Listener>>,
    /// Sockets their owner gave up, kept until they have sent what they
    /// hold and (TCP) their connection has closed, or their deadline passed.
    closing: Vec<Retired>,
    /// Next ephemeral port to try (offset from `EPHEMERAL_BASE`).
    next_port: u16,
    /// The NIC is gone: every operation fails with `NetDown`.
    dead: bool,
}

/// A socket its owner gave up.
struct Retired {
    handle: SocketHandle,
    tcp: bool,
    /// Monotonic ns after which it is aborted and freed anyway.
    deadline: u64,
}

// A single static: the size of the `Up` variant costs nothing.
#[allow(clippy::large_enum_variant)]
enum Net {
    Unprobed,
    Absent,
    Up(Stack),
}

static NET: Global<Net> = Global::new(Net::Unprobed);

static IO_SOURCE: IoSource = IoSource { poll: io_poll, pending: io_pending };

fn io_poll() -> IoPoll {
    NET.with(|n| match n {
        Net::Up(st) => st.poll(),
        _ => IoPoll::default(),
    })
}

fn io_pending() -> bool {
    NET.with(|n| match n {
        Net::Up(st) => st.nic.pending(),
        _ => false,
    })
}

/// Run `f` on the stack, starting it on first use. Fails if there is no
/// NIC or it was stopped.
fn with<R>(f: impl FnOnce(&mut Stack) -> R) -> Result<R> {
    NET.with(|n| {
        if let Net::Unprobed = n {
            *n = match Stack::new() {
                Some(st) => {
                    crate::exec::set_io_source(&IO_SOURCE);
                    Net::Up(st)
                }
                None => Net::Absent,
            };
        }
        match n {
            Net::Up(st) if st.dead => Err(Error::NetDown),
            Net::Up(st) => Ok(f(st)),
            _ => Err(Error::NoDevice),
        }
    })
}

/// Run `f` on a stack that was started, if it was (for `Drop`s).
fn with_started(f: impl FnOnce(&mut Stack)) {
    NET.with(|n| {
        if let Net::Up(st) = n {
            f(st)
        }
    })
}

/// Ask for the gateway's MAC address as the NIC starts (an ARP request
/// from our address). smoltcp fills its neighbour cache from any ARP
/// packet aimed at us, so the answer — there while the app still starts —
/// spares the first reply to a client behind the gateway (the host, on a
/// wispd bridge) an ARP round trip: a host that still knows this address
/// from an earlier VM sends it no request, and smoltcp would hold the
/// SYN-ACK until its own was answered (~1 ms on a parked VM). The request
/// also tells the host our MAC address.
fn ask_for_gateway(nic: &mut nic::Nic, cfg: &NetConfig, gw: Ipv4Addr, now: u64) {
    use smoltcp::phy::{Device, TxToken};
    use smoltcp::wire::{ArpOperation, ArpPacket, ArpRepr, EthernetFrame, EthernetProtocol, EthernetRepr};
    let mac = EthernetAddress(cfg.mac);
    let arp = ArpRepr::EthernetIpv4 {
        operation: ArpOperation::Request,
        source_hardware_addr: mac,
        source_protocol_addr: cfg.ip,
        target_hardware_addr: EthernetAddress([0; 6]),
        target_protocol_addr: gw,
    };
    let eth = EthernetRepr { src_addr: mac, dst_addr: EthernetAddress::BROADCAST, ethertype: EthernetProtocol::Arp };
    let Some(token) = nic.transmit(smol(now)) else { return };
    token.consume(eth.buffer_len() + arp.buffer_len(), |buf| {
        let mut frame = EthernetFrame::new_unchecked(buf);
        eth.emit(&mut frame);
        arp.emit(&mut ArpPacket::new_unchecked(frame.payload_mut()));
    });
    nic.flush();
}

impl Stack {
    fn new() -> Option<Stack> {
        let (index, dev, cfg) = find_nic()?;
        if !usable(&cfg) {
            crate::println!("wisp: net: NIC {} ignored: unusable address configuration {:?}", index, cfg);
            return None;
        }
        let (base, offloads) = match nic::check(dev) {
            Ok(b) => b,
            Err(why) => {
                crate::println!("wisp: net: NIC {} ignored: {}", index, why);
                return None;
            }
        };
        let mut nic = Nic::new(index, base, offloads, dev.flags);
        let now = crate::time::monotonic_ns();
        let mut config = Config::new(HardwareAddress::Ethernet(EthernetAddress(cfg.mac)));
        // Initial TCP sequence numbers and ports should differ per boot.
        let mac = cfg.mac.iter().fold(0u64, |a, &b| a << 8 | b as u64);
        config.random_seed = crate::time::rdtsc() ^ crate::time::wall_ns().rotate_left(17) ^ mac << 16;
        let mut iface = Interface::new(config, &mut nic, smol(now));
        iface.update_ip_addrs(|addrs| {
            let _ = addrs.push(IpCidr::new(IpAddress::Ipv4(cfg.ip), cfg.prefix));
        });
        if let Some(gw) = cfg.gateway {
            let _ = iface.routes_mut().add_default_ipv4_route(gw);
        }
        let next_port = (config_seed_port(&cfg) ^ crate::time::rdtsc() as u16) % (u16::MAX - EPHEMERAL_BASE + 1);
        if let Some(gw) = cfg.gateway {
            ask_for_gateway(&mut nic, &cfg, gw, now);
        }
        Some(Stack {
            cfg,
            iface,
            nic,
            sockets: SocketSet::new(Vec::new()),
            listeners: Vec::new(),
            closing: Vec::new(),
            next_port,
            dead: false,
        })
    }

    /// The executor's poll: move frames, wake tasks, say when to poll next.
    fn poll(&mut self) -> IoPoll {
        if self.dead {
            return IoPoll::default();
        }
        if self.nic.is_dead() {
            self.fail();
            return IoPoll::default();
        }
        self.nic.begin_poll();
        let mut now = crate::time::monotonic_ns();
        self.iface.poll_maintenance(smol(now));
        // Frames taken from the RX ring in this poll (at most INGRESS_BATCH).
        let mut taken = 0;
        for _ in 0..MAX_ROUNDS {
            let mut changed = false;
            while taken < INGRESS_BATCH {
                match self.iface.poll_ingress_single(smol(now), &mut self.nic, &mut self.sockets) {
                    PollIngressSingleResult::None => break,
                    PollIngressSingleResult::PacketProcessed => {}
                    PollIngressSingleResult::SocketStateChanged => changed = true,
                }
                taken += 1;
            }
            let r = self.iface.poll_egress(smol(now), &mut self.nic, &mut self.sockets);
            // Refill the listeners' backlogs before more SYNs are taken.
            self.service_listeners();
            if r == PollResult::None && !changed {
                break;
            }
            now = crate::time::monotonic_ns();
        }
        self.nic.flush();
        self.sweep(now);
        let (rx, tx) = self.nic.take_activity();
        let mut next = self.iface.poll_at(smol(now), &self.sockets).map(nanos);
        for r in &self.closing {
            next = Some(next.map_or(r.deadline, |n| n.min(r.deadline)));
        }
        if taken >= INGRESS_BATCH && self.nic.rx_waiting() {
            // More frames wait: poll again once the tasks this batch woke
            // have emptied their sockets.
            next = Some(now);
        }
        if self.nic.tx_was_full() {
            // Frames (or replies to received ones) wait for TX room, and no
            // event announces it: look again shortly.
            next = Some(now + TX_FULL_RETRY_NS);
        }
        IoPoll { next, busy: rx + tx > 0 }
    }

    /// The NIC died: fail every socket and wake every waiting task.
    fn fail(&mut self) {
        self.dead = true;
        crate::println!("wisp: net: the monitor stopped the NIC");
        for (_, s) in self.sockets.iter_mut() {
            match s {
                Socket::Tcp(s) => s.abort(),
                Socket::Udp(s) => s.close(),
                #[allow(unreachable_patterns)]
                _ => {}
            }
        }
        for l in self.listeners.iter_mut().flatten() {
            if let Some(w) = l.waker.take() {
                w.wake();
            }
        }
    }

    /// Give up socket `h` (a TCP socket if `tcp`, else UDP): the stack
    /// finishes sending what it holds and closing it, then frees it.
    fn retire(&mut self, handle: SocketHandle, tcp: bool) {
        let idle_udp = !tcp && self.sockets.get::<smoltcp::socket::udp::Socket>(handle).send_queue() == 0;
        if self.dead || idle_udp {
            self.sockets.remove(handle);
            return;
        }
        let linger = if tcp { TCP_LINGER_NS } else { UDP_LINGER_NS };
        let deadline = crate::time::monotonic_ns().saturating_add(linger);
        self.closing.push(Retired { handle, tcp, deadline });
    }

    /// Free retired sockets that are done.
    fn sweep(&mut self, now: u64) {
        let sockets = &mut self.sockets;
        self.closing.retain(|r| {
            let expired = now >= r.deadline;
            let done = if r.tcp {
                tcp::finished(sockets.get_mut::<smoltcp::socket::tcp::Socket>(r.handle), expired)
            } else {
                expired || sockets.get::<smoltcp::socket::udp::Socket>(r.handle).send_queue() == 0
            };
            if done {
                sockets.remove(r.handle);
            }
            !done
        });
    }

    /// Whether datagrams to `ip` can leave: it is on the local network, the
    /// broadcast address, or there is a gateway.
    fn reachable(&self, ip: Ipv4Addr) -> bool {
        let mask = u32::MAX.checked_shl(32 - self.cfg.prefix as u32).unwrap_or(0);
        let local = (u32::from(ip) ^ u32::from(self.cfg.ip)) & mask == 0;
        local || ip.is_broadcast() || self.cfg.gateway.is_some()
    }

    /// A free local port, `tcp` or UDP.
    fn ephemeral_port(&mut self, tcp: bool) -> Result<u16> {
        let span = u16::MAX - EPHEMERAL_BASE + 1;
        for _ in 0..span {
            let port = EPHEMERAL_BASE + self.next_port % span;
            self.next_port = (self.next_port + 1) % span;
            let used = if tcp { self.tcp_port_used(port) } else { self.udp_port_used(port) };
            if !used {
                return Ok(port);
            }
        }
        Err(Error::NoPorts)
    }

    fn tcp_port_used(&self, port: u16) -> bool {
        self.listeners.iter().flatten().any(|l| l.port == port)
            || self.sockets.iter().any(|(_, s)| match s {
                Socket::Tcp(s) => s.local_endpoint().is_some_and(|e| e.port == port),
                _ => false,
            })
    }

    fn udp_port_used(&self, port: u16) -> bool {
        self.sockets.iter().any(|(_, s)| match s {
            Socket::Udp(s) => s.endpoint().port == port,
            _ => false,
        })
    }
}

/// A per-VM starting point for ephemeral ports.
fn config_seed_port(cfg: &NetConfig) -> u16 {
    let o = cfg.ip.octets();
    u16::from_be_bytes([o[2] ^ cfg.mac[4], o[3] ^ cfg.mac[5]])
}

/// Wait until `f` returns `Ready`; `f` runs on the stack and registers the
/// task's waker with the socket when it returns `Pending`.
async fn wait<T>(mut f: impl FnMut(&mut Stack, &core::task::Waker) -> core::task::Poll<Result<T>>) -> Result<T> {
    core::future::poll_fn(|cx| match with(|st| f(st, cx.waker())) {
        Ok(p) => p,
        Err(e) => core::task::Poll::Ready(Err(e)),
    })
    .await
}
