//! The virtual NIC, a [`Device`]: an I/O thread per NIC that moves frames
//! between the shared rings (see `wisp_abi::net`) and a tap device, with no
//! exit per packet and no per-frame allocation. It sends everything the
//! guest queued, fills the RX ring from the tap, wakes an idle guest once
//! per batch (`events::NET`), and sleeps in `poll` — after telling the
//! guest it needs a kick (`monitor_idle`) — when there is nothing to do.
//!
//! The ring processing itself is [`ring`] (public, so that tests and the
//! `nic_ring` fuzz target run it over a region in memory), the host side
//! behind [`backend::Backend`] — [`tapio::Tap`] (frames of up to 64 KiB
//! with a virtio-net header, without copying payloads); this file is the
//! device and what its vCPU thread does; [`io`] is the I/O thread.
//!
//! The rings live in guest memory, so every index and length is untrusted:
//! a guest that breaks the ring rules gets its NIC stopped (`stopped` set,
//! the thread ends); the monitor and other VMs are not affected. The
//! monitor's own indices (`tx_cons`, `rx_prod`) are kept here and only
//! published to the ring, never read back: a guest that rewinds them cannot
//! make the monitor send a frame twice or overwrite unread RX slots.
//!
//! Frames leave only with the VM's own identity: Ethernet source = its
//! MAC, and only ARP (sender = its MAC and IPv4 address, or 0.0.0.0 for a
//! probe) and IPv4 (source = its address); anything else is dropped and
//! counted (`tx_spoofed`), so a tenant cannot ARP-spoof the gateway or
//! another VM, or send under another address.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};
use std::thread::JoinHandle;

use rustix::event::{eventfd, EventfdFlags};
use std::time::{Duration, Instant};

use wisp_abi::net::{decode_geometry, encode_geometry, REGION_SIZE, SLOTS, SLOT_SIZE};
use wisp_abi::DeviceKind;

use super::{Device, DeviceState};
use crate::control::Control;
use crate::error::{Error, Result as VmmResult};
use crate::memory::RamView;
use crate::rate_limiter::Rate;

pub mod backend;
mod io;
pub mod ring;
pub mod tapio;

use backend::Backend;
use io::{Io, ParkWatch, BUSY_PARK};
use ring::NicRing;

/// Configuration of a NIC, given at load time.
#[derive(Debug)]
pub struct NetConfig {
    /// The tap device the NIC is connected to (opened with a virtio-net
    /// header, [`crate::tap`]).
    pub tap: OwnedFd,
    /// The offloads enabled on the tap (`wisp_abi::net::offload` bits).
    pub offloads: u64,
    /// Guest MAC address.
    pub mac: [u8; 6],
    /// Guest IPv4 address and prefix length.
    pub ip: ([u8; 4], u8),
    /// IPv4 gateway, if any.
    pub gateway: Option<[u8; 4]>,
    /// Rate limits of each direction (default: none).
    pub rate: NetRate,
    /// The prefixes this VM routes for (a firewall's or router's): IPv4
    /// sources its frames may carry besides its own address. Given by
    /// whoever made the NIC, never by the guest; empty for a VM that
    /// speaks only for itself.
    pub routes: Vec<([u8; 4], u8)>,
}

/// Rate limits of a NIC (`wisp run --net-rate`): bytes and frames per
/// second leaving the VM (`tx`) and reaching it (`rx`); 0 = unlimited.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NetRate {
    /// Guest → host.
    pub tx: Rate,
    /// Host → guest.
    pub rx: Rate,
}

/// Counters of a NIC.
#[derive(Clone, Copy, Debug, Default)]
pub struct NetStats {
    /// Frames sent to the tap (a super-frame counts once).
    pub tx_frames: u64,
    /// Segments they stand for on the wire.
    pub tx_segments: u64,
    /// Frames delivered to the guest (a super-frame counts once).
    pub rx_frames: u64,
    /// Segments they stand for.
    pub rx_segments: u64,
    /// Frames dropped because the RX ring was full.
    pub rx_dropped: u64,
    /// Frames the guest sent under another identity (dropped).
    pub tx_spoofed: u64,
}

/// Whether `frame`, sent by the NIC with `mac` and IPv4 address `ip`
/// that routes for `routes`, carries only its own identity (see the
/// module comment): its MAC always; as IPv4 source its address or one of
/// `routes`; in ARP its own address only.
pub fn own_frame(frame: &[u8], mac: [u8; 6], ip: [u8; 4], routes: &[([u8; 4], u8)]) -> bool {
    const ARP: u16 = 0x0806;
    const IPV4: u16 = 0x0800;
    if frame.len() < 14 || frame[6..12] != mac {
        return false;
    }
    match u16::from_be_bytes([frame[12], frame[13]]) {
        // Ethernet/IPv4 ARP: sender hardware address at 22, protocol at 28.
        ARP => frame.len() >= 42 && frame[22..28] == mac && (frame[28..32] == ip || frame[28..32] == [0; 4]),
        // IPv4: source address at 26 (after a 20-byte minimum header).
        IPV4 => {
            frame.len() >= 34 && {
                let src = [frame[26], frame[27], frame[28], frame[29]];
                src == ip || routes.iter().any(|r| wisp_abi::net::in_prefix(src, *r))
            }
        }
        _ => false,
    }
}

/// The MAC address of a VM's NIC with IPv4 address `ip` unless one is
/// given: locally administered (the QEMU/KVM prefix 52:54:00) followed by
/// the address's last three bytes, so it is unique within a /8. The one
/// rule for `wisp run --tap` and the daemon's bridge.
pub fn mac_for_ipv4(ip: [u8; 4]) -> [u8; 6] {
    [0x52, 0x54, 0x00, ip[1], ip[2], ip[3]]
}

/// A NIC: its configuration, then (once activated) its I/O thread.
pub struct Nic {
    mac: [u8; 6],
    ip: ([u8; 4], u8),
    gateway: Option<[u8; 4]>,
    offloads: u64,
    rate: NetRate,
    routes: Vec<([u8; 4], u8)>,
    state: NicState,
    /// Given a saved identity (a restored or moved VM): it announces
    /// itself when it starts.
    restored: bool,
}

enum NicState {
    /// Not activated yet.
    Ready(OwnedFd),
    Running(Running),
    /// In a forked child: the NIC stayed with the parent.
    Detached,
}

/// A running NIC's I/O thread and how to kick it.
struct Running {
    /// The tap's descriptor number (owned by the I/O thread's state).
    tap_raw: std::os::fd::RawFd,
    kick: Arc<OwnedFd>,
    /// The same eventfd as `kick`, for KVM to signal on a doorbell.
    kick_kvm: Option<vmm_sys_util::eventfd::EventFd>,
    /// The backend (shared with the I/O thread), and whether a parked vCPU
    /// may wake on it: false while the I/O thread leaves frames in it (RX
    /// ring full, RX budget spent), where watching it would only spin.
    backend: Arc<dyn Backend>,
    watchable: Arc<AtomicBool>,
    /// Since when a parked vCPU watches the backend (and serves what it
    /// brings): once that is an idle VM's park, the I/O thread stops
    /// watching it too (on this host, waking a thread on an idle CPU costs
    /// tens of microseconds).
    park_watch: Arc<ParkWatch>,
    /// The rings, shared with the I/O thread: the vCPU thread serves them
    /// itself when it can (see [`Running::serve_here`]).
    rings: Arc<Mutex<Rings>>,
    control: Arc<Control>,
    stop: Arc<AtomicBool>,
    io: Mutex<IoThread>,
}

/// The I/O thread, started only when the NIC needs one: a stream to carry
/// (a pass on the vCPU thread moved `HANDOVER_FRAMES` or more), budgets to
/// wait out, a full RX ring. Until then the vCPU thread serves the rings at
/// its parks and exits alone — and a VM whose frames come a few at a time
/// (a firewall per client, a just-in-time service's VM) pays for no thread.
enum IoThread {
    NotYet(Io),
    Started(JoinHandle<Result<NetStats, String>>),
    Gone,
}

/// The rings' processing and the memory they live in; whoever holds the
/// lock (the I/O thread for a round, or the vCPU thread) moves frames.
struct Rings {
    ram: RamView,
    /// Indices, identity, budgets (`ring/`).
    ring: NicRing,
    /// Why the guest lost its NIC, whichever thread found out: the I/O
    /// thread ends with it, and the vCPU thread serves the rings no more.
    failed: Option<String>,
}

/// What one pass over the rings did.
struct Pass {
    tx: ring::Tx,
    rx: ring::Rx,
}

impl Rings {
    /// Send what the guest queued, then fill the RX ring from the backend.
    fn pass(&mut self, backend: &dyn Backend, now: Instant) -> Result<Pass, String> {
        // offload: frames with a virtio-net header, payloads not copied
        // (tapio.rs). A full tap queue drops the frame, as a NIC would.
        let tx = self.ring.drain_tx(&mut self.ram, now, |ram, f| {
            let _ = backend.send(ram, f);
        })?;
        let rx = self.ring.fill_rx(&mut self.ram, now, |ram, space| backend.recv(ram, space))?;
        Ok(Pass { tx, rx })
    }
}

impl Nic {
    /// A NIC on `cfg.tap`.
    pub fn new(cfg: NetConfig) -> Nic {
        Nic { mac: cfg.mac, ip: cfg.ip, gateway: cfg.gateway, offloads: cfg.offloads, rate: cfg.rate, routes: cfg.routes, state: NicState::Ready(cfg.tap), restored: false }
    }

    /// A gratuitous ARP for this NIC's address, as its tap takes frames
    /// (a zero virtio-net header first): the switches on its way learn
    /// where its MAC is now, and neighbours refresh their caches.
    fn gratuitous_arp(&self) -> Vec<u8> {
        let mut f = vec![0u8; wisp_abi::net::VNET_HDR_SIZE];
        f.extend_from_slice(&[0xff; 6]);
        f.extend_from_slice(&self.mac);
        f.extend_from_slice(&[0x08, 0x06]);
        // Ethernet, IPv4, 6 + 4 bytes, a request for its own address.
        f.extend_from_slice(&[0x00, 0x01, 0x08, 0x00, 6, 4, 0x00, 0x01]);
        f.extend_from_slice(&self.mac);
        f.extend_from_slice(&self.ip.0);
        f.extend_from_slice(&[0; 6]);
        f.extend_from_slice(&self.ip.0);
        // Padded to the shortest Ethernet frame.
        f.resize(wisp_abi::net::VNET_HDR_SIZE + 60, 0);
        f
    }

    /// Stop the I/O thread; returns its counters, or why it stopped the NIC.
    pub fn shutdown(&mut self) -> Option<Result<NetStats, String>> {
        match &mut self.state {
            NicState::Running(r) => r.shutdown(),
            _ => None,
        }
    }
}

impl Device for Nic {
    fn kind(&self) -> DeviceKind {
        DeviceKind::Net
    }

    fn region_size(&self) -> u64 {
        REGION_SIZE
    }

    fn params(&self) -> [u64; 5] {
        use wisp_abi::net as n;
        [
            n::encode_mac(self.mac),
            n::encode_ipv4(self.ip.0, self.ip.1),
            self.gateway.map_or(0, |g| n::encode_ipv4(g, 0)),
            encode_geometry(SLOTS, SLOT_SIZE),
            self.offloads,
        ]
    }

    fn activate(&mut self, ram: RamView, base: u64, control: Arc<Control>, _user: &crate::access::UserMap) -> std::io::Result<()> {
        let NicState::Ready(tap) = std::mem::replace(&mut self.state, NicState::Detached) else {
            return Err(std::io::Error::other("the NIC is already active"));
        };
        if self.restored {
            // Best effort: a lost announcement costs a neighbour a lookup.
            let _ = rustix::io::write(&tap, &self.gratuitous_arp());
        }
        let kick = Arc::new(eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?);
        let stop = Arc::new(AtomicBool::new(false));
        let tap_raw = std::os::fd::AsRawFd::as_raw_fd(&tap);
        // Where the rings stand before the guest first runs: from here on
        // the monitor's indices are its own.
        let ring = NicRing::new(&ram, base, self.mac, self.ip.0, self.offloads, self.rate, Instant::now()).map_err(std::io::Error::other)?.routing(self.routes.clone());
        let backend: Arc<dyn Backend> = Arc::new(tapio::Tap::new(tap));
        let watchable = Arc::new(AtomicBool::new(true));
        let park_watch = Arc::new(ParkWatch::new());
        // No I/O thread yet: the guest kicks by exit, which this thread
        // serves, and a parked vCPU serves the frames that wake it.
        let mut ram = ram;
        ring.set_idle(&mut ram, true).map_err(std::io::Error::other)?;
        ring.set_kick_exit(&mut ram, true).map_err(std::io::Error::other)?;
        park_watch.io_blind.store(true, Ordering::Release);
        let rings = Arc::new(Mutex::new(Rings { ram, ring, failed: None }));
        let io = Io {
            rings: rings.clone(),
            backend: backend.clone(),
            kick: kick.clone(),
            stop: stop.clone(),
            control: control.clone(),
            watchable: watchable.clone(),
            park_watch: park_watch.clone(),
        };
        let kick_kvm = dup_eventfd(&kick);
        let io = Mutex::new(IoThread::NotYet(io));
        self.state = NicState::Running(Running { tap_raw, kick, kick_kvm, backend, watchable, park_watch, rings, control, stop, io });
        Ok(())
    }

    fn notify(&self) {
        if let NicState::Running(r) = &self.state {
            // An exit kick: this thread sends what the guest queued (the
            // I/O thread sleeps, or it would not have been kicked), unless
            // the I/O thread is at the rings right now.
            if !r.serve_here(false, false) {
                r.kick();
            }
        }
    }

    fn flags(&self) -> u32 {
        wisp_abi::bootinfo::device_flags::PARK_SENDS
    }

    fn before_park(&self) {
        if let NicState::Running(r) = &self.state {
            // What the guest queued and left for the park (`PARK_SENDS`):
            // unless the I/O thread is at the rings right now (then it
            // sends them).
            r.serve_here(false, false);
        }
    }

    fn park_ended(&self, woken: bool, parked: Duration) {
        if let NicState::Running(r) = &self.state {
            r.park_watch.end();
            // An idle VM's frame, or one the sleeping I/O thread does not
            // watch for: serve it here. After a short park the guest is in
            // an exchange, not idle — the I/O thread carries it from here
            // (see `BUSY_PARK`); when it watches the tap itself, it already
            // does, and a pass here would only compete with it.
            let busy = parked < BUSY_PARK;
            if woken && (!busy || r.park_watch.io_blind.load(Ordering::Acquire)) {
                r.serve_here(true, busy);
            }
        }
    }

    fn kick_eventfd(&self) -> Option<&vmm_sys_util::eventfd::EventFd> {
        match &self.state {
            NicState::Running(r) => r.kick_kvm.as_ref(),
            _ => None,
        }
    }

    fn park_begins(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        match &self.state {
            NicState::Running(r) if r.watchable.load(Ordering::Acquire) => {
                r.park_watch.begin();
                Some(r.backend.ready_fd())
            }
            _ => None,
        }
    }

    fn park_unwatched(&self) {
        if let NicState::Running(r) = &self.state {
            // The park that ended last watched the tap (`end` stored since
            // it ended); an I/O thread that left the tap to it, or has not
            // started, must watch it now. Against an I/O thread going
            // blind meanwhile: it stores `io_blind`, fences, and looks at
            // the watch again (`Io::serve`); one of the two sides sees the
            // other.
            std::sync::atomic::fence(Ordering::SeqCst);
            if r.park_watch.io_blind.load(Ordering::Acquire) {
                r.kick();
            }
        }
    }

    fn on_fork_child(&mut self) {
        match std::mem::replace(&mut self.state, NicState::Detached) {
            NicState::Running(r) => r.abandon_after_fork(),
            NicState::Ready(tap) => drop(tap),
            NicState::Detached => {}
        }
    }

    fn quiesced(&self, f: &mut dyn FnMut()) -> VmmResult<()> {
        match &self.state {
            // Whoever moves frames holds the rings: while they are held here
            // the I/O thread waits, and the indices in guest RAM are the
            // ones its last pass published.
            NicState::Running(r) => {
                let _held = r.rings.lock().map_err(|_| Error::Devices("the NIC's rings were abandoned".into()))?;
                f();
            }
            _ => f(),
        }
        Ok(())
    }

    fn restore_state(&mut self, state: &DeviceState) -> VmmResult<()> {
        use wisp_abi::net as n;
        let [mac, ip, gw, geometry, offloads] = state.params;
        let (slots, slot_size) = decode_geometry(geometry);
        if (slots, slot_size) != (SLOTS, SLOT_SIZE) {
            return Err(Error::Devices(format!("saved NIC has {slots} slots of {slot_size} bytes; this monitor's have {SLOTS} of {SLOT_SIZE}")));
        }
        // The guest read its offloads at boot: this tap must have them all.
        if offloads & !self.offloads != 0 {
            return Err(Error::Devices(format!("saved NIC used offloads {offloads:#x}; this tap has {:#x}", self.offloads)));
        }
        self.offloads = offloads;
        self.mac = n::decode_mac(mac);
        self.ip = n::decode_ipv4(ip);
        self.gateway = (gw != 0).then(|| n::decode_ipv4(gw).0);
        self.restored = true;
        Ok(())
    }
}

/// A second handle on the eventfd `fd`, as the type KVM's bindings take.
pub(super) fn dup_eventfd(fd: &OwnedFd) -> Option<vmm_sys_util::eventfd::EventFd> {
    use std::os::fd::{FromRawFd, IntoRawFd};
    let dup = rustix::io::fcntl_dupfd_cloexec(fd, 0).ok()?;
    // SAFETY: `dup` is a fresh descriptor of the eventfd that we own;
    // `EventFd` takes ownership of it (and closes it when dropped).
    Some(unsafe { vmm_sys_util::eventfd::EventFd::from_raw_fd(dup.into_raw_fd()) })
}

impl Running {
    /// Wake the I/O thread (started now if it was not).
    fn kick(&self) {
        self.start_io();
        let _ = rustix::io::write(self.kick.as_fd(), &1u64.to_ne_bytes());
    }

    /// Start the I/O thread if it is not running. If it cannot be started
    /// the vCPU thread goes on serving the rings alone.
    fn start_io(&self) {
        let Ok(mut t) = self.io.lock() else { return };
        let IoThread::NotYet(io) = &*t else { return };
        let io = io.clone();
        let spawned = std::thread::Builder::new().name("net0".into()).stack_size(256 << 10).spawn(move || {
            crate::sys::thread_started(crate::sys::ThreadRole::Io);
            io.run()
        });
        if let Ok(h) = spawned {
            self.park_watch.io_blind.store(false, Ordering::Release);
            *t = IoThread::Started(h);
        }
    }

    /// One pass over the rings on the vCPU thread (after an idle park, or
    /// on an exit kick), so that a frame for an idle guest, or its answer,
    /// does not wait for the I/O thread to wake up: an idle VM answers
    /// with one thread woken, not three. `woken`: the park just ended, and
    /// the I/O thread (woken by the same frame) may hold the rings for a
    /// moment — wait for it briefly rather than enter the guest before the
    /// frame is in its ring. `hand_over`: wake the I/O thread after a pass
    /// that moved frames, to carry the exchange from here. Returns false if
    /// the I/O thread had the rings (it moves the frames then) or the NIC
    /// is stopped.
    fn serve_here(&self, woken: bool, hand_over: bool) -> bool {
        let Some(mut g) = self.lock_rings(woken) else { return false };
        if g.failed.is_some() || self.stop.load(Ordering::Acquire) {
            return false;
        }
        match g.pass(&*self.backend, Instant::now()) {
            Ok(p) => {
                if p.rx.got > 0 {
                    self.control.post_events(wisp_abi::events::NET);
                }
                // Budgets and a full RX ring are the I/O thread's to wait
                // out (it sleeps with a timeout then); and a stream is its
                // to carry, on its own CPU, with this thread in the guest.
                let moved = p.tx.taken + p.rx.got;
                if moved >= HANDOVER_FRAMES || (hand_over && moved > 0) || p.tx.wait.is_some() || p.rx.wait.is_some() || p.rx.full {
                    drop(g);
                    self.kick();
                }
                true
            }
            Err(why) => {
                g.failed = Some(why);
                drop(g);
                self.kick();
                false
            }
        }
    }

    /// The rings' lock: at once, or (`patient`) after up to a few
    /// microseconds of the I/O thread's round.
    fn lock_rings(&self, patient: bool) -> Option<MutexGuard<'_, Rings>> {
        let deadline = Instant::now() + LOCK_PATIENCE;
        loop {
            match self.rings.try_lock() {
                Ok(g) => return Some(g),
                Err(TryLockError::Poisoned(_)) => return None,
                Err(TryLockError::WouldBlock) if patient && Instant::now() < deadline => std::hint::spin_loop(),
                Err(TryLockError::WouldBlock) => return None,
            }
        }
    }

    /// In a forked child, where the I/O thread does not exist: close the
    /// tap (the NIC stays the parent's) and forget the rest.
    fn abandon_after_fork(self) {
        // SAFETY: the thread owning the tap descriptor exists only in the
        // parent; in this process its state is never dropped (forgotten
        // below), so nothing else closes or uses the number.
        unsafe { crate::sys::close_orphaned_fd(self.tap_raw) };
        std::mem::forget(self);
    }

    fn shutdown(&mut self) -> Option<Result<NetStats, String>> {
        self.stop.store(true, Ordering::Release);
        let io = std::mem::replace(&mut *self.io.lock().ok()?, IoThread::Gone);
        match io {
            IoThread::Started(h) => {
                let _ = rustix::io::write(self.kick.as_fd(), &1u64.to_ne_bytes());
                h.join().ok()
            }
            // Never needed: the counters are the rings'.
            IoThread::NotYet(_) => {
                let g = self.rings.lock().ok()?;
                Some(match &g.failed {
                    Some(why) => Err(why.clone()),
                    None => Ok(g.ring.stats()),
                })
            }
            IoThread::Gone => None,
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}

/// Frames in one pass on the vCPU thread that make it a stream: the I/O
/// thread is woken to take over.
const HANDOVER_FRAMES: u32 = 8;

/// How long a woken vCPU waits for the I/O thread's round over the rings.
const LOCK_PATIENCE: Duration = Duration::from_micros(20);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_frames_with_the_nics_own_identity_leave() {
        let mac = [0x52, 0x54, 0, 9, 0, 2];
        let ip = [10, 9, 0, 2];
        let eth = |src: [u8; 6], ty: u16, rest: &[u8]| -> Vec<u8> {
            let mut f = vec![0xff; 6];
            f.extend_from_slice(&src);
            f.extend_from_slice(&ty.to_be_bytes());
            f.extend_from_slice(rest);
            f
        };
        let arp = |sha: [u8; 6], spa: [u8; 4]| -> Vec<u8> {
            let mut a = vec![0, 1, 8, 0, 6, 4, 0, 2];
            a.extend_from_slice(&sha);
            a.extend_from_slice(&spa);
            a.extend_from_slice(&[0; 10]);
            a
        };
        let ipv4 = |src: [u8; 4]| -> Vec<u8> {
            let mut h = vec![0x45, 0, 0, 20, 0, 0, 0, 0, 64, 17, 0, 0];
            h.extend_from_slice(&src);
            h.extend_from_slice(&[10, 9, 0, 1]);
            h
        };
        assert!(own_frame(&eth(mac, 0x0800, &ipv4(ip)), mac, ip, &[]));
        assert!(own_frame(&eth(mac, 0x0806, &arp(mac, ip)), mac, ip, &[]));
        assert!(own_frame(&eth(mac, 0x0806, &arp(mac, [0; 4])), mac, ip, &[]), "ARP probe");
        let other = [0x52, 0x54, 0, 9, 0, 3];
        assert!(!own_frame(&eth(other, 0x0800, &ipv4(ip)), mac, ip, &[]), "another source MAC");
        assert!(!own_frame(&eth(mac, 0x0806, &arp(mac, [10, 9, 0, 1])), mac, ip, &[]), "claims the gateway");
        assert!(!own_frame(&eth(mac, 0x0806, &arp(other, ip)), mac, ip, &[]), "another sender MAC");
        assert!(!own_frame(&eth(mac, 0x0800, &ipv4([10, 9, 0, 7])), mac, ip, &[]), "another source IP");
        assert!(!own_frame(&eth(mac, 0x86dd, &[0; 40]), mac, ip, &[]), "IPv6 is not the NIC's");
        assert!(!own_frame(&eth(mac, 0x8100, &ipv4(ip)), mac, ip, &[]), "VLAN-tagged");
        assert!(!own_frame(&eth(mac, 0x0800, &[0x45; 10]), mac, ip, &[]), "truncated");
        assert!(!own_frame(&[0; 13], mac, ip, &[]));
        // A NIC that routes for prefixes: their sources pass, others not,
        // and ARP stays its own.
        let routes = [([10, 200, 7, 0], 24), ([192, 168, 0, 9], 32)];
        assert!(own_frame(&eth(mac, 0x0800, &ipv4([10, 200, 7, 33])), mac, ip, &routes));
        assert!(own_frame(&eth(mac, 0x0800, &ipv4([192, 168, 0, 9])), mac, ip, &routes));
        assert!(own_frame(&eth(mac, 0x0800, &ipv4(ip)), mac, ip, &routes));
        assert!(!own_frame(&eth(mac, 0x0800, &ipv4([10, 200, 8, 1])), mac, ip, &routes), "outside the routed prefix");
        assert!(!own_frame(&eth(mac, 0x0800, &ipv4([192, 168, 0, 8])), mac, ip, &routes), "next to a /32");
        assert!(!own_frame(&eth(mac, 0x0806, &arp(mac, [10, 200, 7, 33])), mac, ip, &routes), "ARP for a routed address");
        assert!(!own_frame(&eth(other, 0x0800, &ipv4([10, 200, 7, 33])), mac, ip, &routes), "another MAC");
        assert!(own_frame(&eth(mac, 0x0800, &ipv4([8, 8, 8, 8])), mac, ip, &[([0; 4], 0)]), "a default route");
    }

    #[test]
    fn macs_come_from_the_address() {
        assert_eq!(mac_for_ipv4([10, 99, 0, 2]), [0x52, 0x54, 0, 99, 0, 2]);
        // Unicast and locally administered.
        assert_eq!(mac_for_ipv4([10, 1, 2, 3])[0] & 0b11, 0b10);
    }
}
