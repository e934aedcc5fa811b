//! The virtual NIC, a [`Device`]: an I/O thread per NIC that moves frames
//! between the shared rings (see `wisp_abi::net`) and a tap device, with no
//! exit per packet and no per-frame allocation. It sends everything the
//! guest queued, fills the RX ring from the tap, wakes an idle guest once
//! per batch (`events::NET`), and sleeps in `poll` — after telling the
//! guest it needs a kick (`monitor_idle`) — when there is nothing to do.
//!
//! The rings live in guest memory, so every index and length is untrusted:
//! a guest that breaks the ring rules gets its NIC stopped (`stopped` set,
//! the thread ends); the monitor and other VMs are not affected.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use rustix::event::{eventfd, poll, EventfdFlags, PollFd, PollFlags};
use wisp_abi::net::{hdr, SlotDesc, REGION_SIZE, RX_BUF_OFF, RX_DESC_OFF, SLOTS, SLOT_SIZE, TX_BUF_OFF, TX_DESC_OFF};
use wisp_abi::DeviceKind;

use super::{Device, DeviceState};
use crate::control::Control;
use crate::error::{Error, Result as VmmResult};
use crate::memory::RamView;

/// Configuration of a NIC, given at load time.
#[derive(Debug)]
pub struct NetConfig {
    /// The tap device the NIC is connected to.
    pub tap: OwnedFd,
    /// Guest MAC address.
    pub mac: [u8; 6],
    /// Guest IPv4 address and prefix length.
    pub ip: ([u8; 4], u8),
    /// IPv4 gateway, if any.
    pub gateway: Option<[u8; 4]>,
}

/// Counters of a NIC.
#[derive(Clone, Copy, Debug, Default)]
pub struct NetStats {
    /// Frames sent to the tap.
    pub tx_frames: u64,
    /// Frames delivered to the guest.
    pub rx_frames: u64,
    /// Frames dropped because the RX ring was full.
    pub rx_dropped: u64,
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
    state: NicState,
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
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Result<NetStats, String>>>,
}

impl Nic {
    /// A NIC on `cfg.tap`.
    pub fn new(cfg: NetConfig) -> Nic {
        Nic { mac: cfg.mac, ip: cfg.ip, gateway: cfg.gateway, state: NicState::Ready(cfg.tap) }
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
            SLOTS as u64,
            SLOT_SIZE as u64,
        ]
    }

    fn activate(&mut self, ram: RamView, base: u64, control: Arc<Control>) -> std::io::Result<()> {
        let NicState::Ready(tap) = std::mem::replace(&mut self.state, NicState::Detached) else {
            return Err(std::io::Error::other("the NIC is already active"));
        };
        let kick = Arc::new(eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?);
        let stop = Arc::new(AtomicBool::new(false));
        let tap_raw = std::os::fd::AsRawFd::as_raw_fd(&tap);
        let io = Io { ram, base, tap, kick: kick.clone(), stop: stop.clone(), control, stats: NetStats::default() };
        let thread = std::thread::Builder::new().name("net0".into()).stack_size(256 << 10).spawn(move || io.run())?;
        self.state = NicState::Running(Running { tap_raw, kick, stop, thread: Some(thread) });
        Ok(())
    }

    fn notify(&self) {
        if let NicState::Running(r) = &self.state {
            r.kick();
        }
    }

    fn on_fork_child(&mut self) {
        match std::mem::replace(&mut self.state, NicState::Detached) {
            NicState::Running(r) => r.abandon_after_fork(),
            NicState::Ready(tap) => drop(tap),
            NicState::Detached => {}
        }
    }

    fn restore_state(&mut self, state: &DeviceState) -> VmmResult<()> {
        use wisp_abi::net as n;
        let [mac, ip, gw, slots, slot_size] = state.params;
        if slots != SLOTS as u64 || slot_size != SLOT_SIZE as u64 {
            return Err(Error::Devices(format!("saved NIC has {slots} slots of {slot_size} bytes; this monitor's have {SLOTS} of {SLOT_SIZE}")));
        }
        self.mac = n::decode_mac(mac);
        self.ip = n::decode_ipv4(ip);
        self.gateway = (gw != 0).then(|| n::decode_ipv4(gw).0);
        Ok(())
    }
}

impl Running {
    fn kick(&self) {
        let _ = rustix::io::write(self.kick.as_fd(), &1u64.to_ne_bytes());
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
        self.kick();
        self.thread.take().and_then(|t| t.join().ok())
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}

struct Io {
    ram: RamView,
    base: u64,
    tap: OwnedFd,
    kick: Arc<OwnedFd>,
    stop: Arc<AtomicBool>,
    control: Arc<Control>,
    stats: NetStats,
}

/// How many times the I/O thread re-checks the rings before sleeping.
const SPIN_ROUNDS: u32 = 64;

impl Io {
    fn run(mut self) -> Result<NetStats, String> {
        let r = self.serve();
        if r.is_err() {
            // Tell the guest its NIC is gone; wake it so it notices.
            let _ = self.ram.store_u32(self.base + hdr::STOPPED, 1);
            self.control.post_events(wisp_abi::events::NET);
        }
        r.map(|_| self.stats)
    }

    fn serve(&mut self) -> Result<(), String> {
        let mut frame = vec![0u8; SLOT_SIZE as usize];
        let mut idle_rounds = 0u32;
        loop {
            if self.stop.load(Ordering::Acquire) {
                return Ok(());
            }
            let sent = self.drain_tx(&mut frame)?;
            let (received, rx_full) = self.fill_rx(&mut frame)?;
            if received > 0 {
                self.control.post_events(wisp_abi::events::NET);
            }
            if sent + received > 0 {
                idle_rounds = 0;
                continue;
            }
            idle_rounds += 1;
            if idle_rounds < SPIN_ROUNDS {
                std::hint::spin_loop();
                continue;
            }
            // Going to sleep: announce it, then look once more so a frame
            // queued in between is not left waiting for a kick.
            self.ram.store_u32(self.base + hdr::MONITOR_IDLE, 1).map_err(|e| e.to_string())?;
            // The store above must be visible before we read the guest's
            // index (store→load ordering; the guest has the matching fence),
            // or a kick could be lost.
            std::sync::atomic::fence(Ordering::SeqCst);
            let pending = self.tx_pending()?;
            if pending == 0 {
                let mut fds = [PollFd::new(&self.tap, PollFlags::IN), PollFd::new(&*self.kick, PollFlags::IN)];
                // With a full RX ring, the tap stays readable: check back
                // soon instead of spinning on it.
                let ts = rustix::time::Timespec { tv_sec: 0, tv_nsec: 1_000_000 };
                let _ = poll(&mut fds, if rx_full { Some(&ts) } else { None });
                let mut b = [0u8; 8];
                let _ = rustix::io::read(self.kick.as_fd(), &mut b);
            }
            self.ram.store_u32(self.base + hdr::MONITOR_IDLE, 0).map_err(|e| e.to_string())?;
            idle_rounds = 0;
        }
    }

    fn tx_pending(&self) -> Result<u32, String> {
        let prod = self.ram.load_u32(self.base + hdr::TX_PROD).map_err(|e| e.to_string())?;
        let cons = self.ram.load_u32(self.base + hdr::TX_CONS).map_err(|e| e.to_string())?;
        let n = prod.wrapping_sub(cons);
        if n > SLOTS {
            return Err(format!("TX producer index {prod} is {n} slots ahead of the consumer ({cons}); ring size {SLOTS}"));
        }
        Ok(n)
    }

    /// Send every frame the guest queued. Returns how many.
    fn drain_tx(&mut self, frame: &mut [u8]) -> Result<u32, String> {
        let n = self.tx_pending()?;
        let mut cons = self.ram.load_u32(self.base + hdr::TX_CONS).map_err(|e| e.to_string())?;
        for _ in 0..n {
            let slot = (cons % SLOTS) as u64;
            let d: SlotDesc = self.ram.read_obj(self.base + TX_DESC_OFF + slot * 8).map_err(|e| e.to_string())?;
            if d.len == 0 || d.len > SLOT_SIZE {
                return Err(format!("TX slot {slot}: length {} (1..={SLOT_SIZE} allowed)", d.len));
            }
            let buf = &mut frame[..d.len as usize];
            self.ram.read(self.base + TX_BUF_OFF + slot * SLOT_SIZE as u64, buf).map_err(|e| e.to_string())?;
            // A full tap queue drops the frame, as a NIC would.
            let _ = rustix::io::write(&self.tap, buf);
            self.stats.tx_frames += 1;
            cons = cons.wrapping_add(1);
            self.ram.store_u32(self.base + hdr::TX_CONS, cons).map_err(|e| e.to_string())?;
        }
        Ok(n)
    }

    /// Move frames from the tap into free RX slots. Returns (frames, ring full).
    fn fill_rx(&mut self, frame: &mut [u8]) -> Result<(u32, bool), String> {
        let mut prod = self.ram.load_u32(self.base + hdr::RX_PROD).map_err(|e| e.to_string())?;
        let mut got = 0;
        loop {
            let cons = self.ram.load_u32(self.base + hdr::RX_CONS).map_err(|e| e.to_string())?;
            let used = prod.wrapping_sub(cons);
            if used > SLOTS {
                return Err(format!("RX consumer index {cons} is ahead of the producer ({prod})"));
            }
            if used == SLOTS {
                return Ok((got, true));
            }
            let n = match rustix::io::read(&self.tap, &mut frame[..]) {
                Ok(0) | Err(_) => return Ok((got, false)),
                Ok(n) => n,
            };
            let slot = (prod % SLOTS) as u64;
            self.ram
                .write(self.base + RX_BUF_OFF + slot * SLOT_SIZE as u64, &frame[..n])
                .map_err(|e| e.to_string())?;
            self.ram
                .write_obj(self.base + RX_DESC_OFF + slot * 8, &SlotDesc { len: n as u32, flags: 0 })
                .map_err(|e| e.to_string())?;
            prod = prod.wrapping_add(1);
            self.ram.store_u32(self.base + hdr::RX_PROD, prod).map_err(|e| e.to_string())?;
            self.stats.rx_frames += 1;
            got += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn macs_come_from_the_address() {
        assert_eq!(mac_for_ipv4([10, 99, 0, 2]), [0x52, 0x54, 0, 99, 0, 2]);
        // Unicast and locally administered.
        assert_eq!(mac_for_ipv4([10, 1, 2, 3])[0] & 0b11, 0b10);
    }
}
