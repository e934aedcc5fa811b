//! The monitor's side of a NIC's rings (layout and rules in
//! `wisp_abi::net`): take the frames the guest queued in the TX ring, fill
//! the RX ring with frames from the host, under the NIC's identity filter
//! ([`own_frame`](super::own_frame)) and its rate limits. The NIC's I/O
//! thread runs it over guest RAM and a tap; it is public so that tests and
//! the `nic_ring` fuzz target can run the very same code over a region in
//! a byte buffer ([`ByteRegion`]) with frames of their own.
//!
//! The region is guest memory: the guest may write anything there at any
//! time. So every index and descriptor is copied out once and then checked
//! (copy-then-validate), and so are a TX frame's headers: what the monitor
//! decides on — the identity, the virtio-net header ([`check`]) — and the
//! headers it sends are its private copy. Only the payload after them goes
//! from guest memory to the tap without a copy ([`TxFrame::rest`]): the
//! guest may change it meanwhile, which changes nothing but its own data.
//! RX frames are written into the ring's slots as the host gave them. The
//! monitor's own indices (`tx_cons`, `rx_prod`) live here and are only
//! published, never read back. A broken rule is an `Err` (the NIC stops),
//! never a panic.

pub mod check;
#[cfg(test)]
mod tests;

use std::time::{Duration, Instant};

use wisp_abi::net::{
    gso, hdr, slots_for, vnet_flags, SlotDesc, VnetHdr, DESC_SIZE, MAX_CHAIN, MAX_FRAME, MAX_GSO_FRAME, REGION_SIZE, RX_BUF_OFF,
    RX_DESC_OFF, SLOTS, SLOT_SIZE, TX_BUF_OFF, TX_DESC_OFF,
};
use zerocopy::{FromBytes, IntoBytes};

use check::HEAD_MAX;

use super::{own_frame, NetRate, NetStats};
use crate::memory::RamView;
use crate::rate_limiter::{Rate, RateLimiter};

/// Memory holding a NIC's region: guest RAM in the monitor, a
/// [`ByteRegion`] in tests and fuzzing. Every access is bounds-checked by
/// the implementation; an access outside it is an `Err`.
pub trait RingMemory {
    /// Load an aligned u32 (acquire: it may be the guest's index).
    fn load_u32(&self, addr: u64) -> Result<u32, String>;
    /// Store an aligned u32 (release: the guest reads it as an index).
    fn store_u32(&mut self, addr: u64, v: u32) -> Result<(), String>;
    /// Copy `buf.len()` bytes out of memory at `addr`.
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), String>;
    /// Copy `data` into memory at `addr`.
    fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), String>;
}

impl RingMemory for RamView {
    fn load_u32(&self, addr: u64) -> Result<u32, String> {
        RamView::load_u32(self, addr).map_err(|e| e.to_string())
    }

    fn store_u32(&mut self, addr: u64, v: u32) -> Result<(), String> {
        RamView::store_u32(self, addr, v).map_err(|e| e.to_string())
    }

    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), String> {
        RamView::read(self, addr, buf).map_err(|e| e.to_string())
    }

    fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), String> {
        RamView::write(self, addr, data).map_err(|e| e.to_string())
    }
}

/// Memory in a byte buffer, checked like guest RAM (u32 accesses aligned,
/// nothing past the end): where tests and the fuzz target put a region.
#[derive(Clone, Debug)]
pub struct ByteRegion {
    /// The bytes, as the guest would see them.
    pub bytes: Vec<u8>,
}

impl ByteRegion {
    /// `size` zero bytes (a whole region is [`REGION_SIZE`]).
    pub fn new(size: usize) -> ByteRegion {
        ByteRegion { bytes: vec![0; size] }
    }

    /// A whole region, zeroed.
    pub fn region() -> ByteRegion {
        ByteRegion::new(REGION_SIZE as usize)
    }

    fn range(&self, addr: u64, len: usize) -> Result<std::ops::Range<usize>, String> {
        let end = addr.checked_add(len as u64).filter(|e| *e <= self.bytes.len() as u64);
        match end {
            Some(end) => Ok(addr as usize..end as usize),
            None => Err(format!("{len} bytes at {addr:#x} are outside the {}-byte region", self.bytes.len())),
        }
    }
}

impl RingMemory for ByteRegion {
    fn load_u32(&self, addr: u64) -> Result<u32, String> {
        if !addr.is_multiple_of(4) {
            return Err(format!("unaligned u32 at {addr:#x}"));
        }
        let r = self.range(addr, 4)?;
        Ok(u32::from_le_bytes(self.bytes[r].try_into().unwrap_or_default()))
    }

    fn store_u32(&mut self, addr: u64, v: u32) -> Result<(), String> {
        if !addr.is_multiple_of(4) {
            return Err(format!("unaligned u32 at {addr:#x}"));
        }
        let r = self.range(addr, 4)?;
        self.bytes[r].copy_from_slice(&v.to_le_bytes());
        Ok(())
    }

    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), String> {
        let r = self.range(addr, buf.len())?;
        buf.copy_from_slice(&self.bytes[r]);
        Ok(())
    }

    fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), String> {
        let r = self.range(addr, data.len())?;
        self.bytes[r].copy_from_slice(data);
        Ok(())
    }
}

fn limiter(rate: Rate, now: Instant) -> Option<RateLimiter> {
    (!rate.is_unlimited()).then(|| RateLimiter::new_at(rate, MAX_FRAME as u64, now))
}

/// What one pass over the TX side did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tx {
    /// Frames taken from the ring (sent or dropped as spoofed).
    pub taken: u32,
    /// The TX budget stopped the pass: the next frame may go after this long.
    pub wait: Option<Duration>,
}

/// What one pass over the RX side did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Rx {
    /// Frames delivered.
    pub got: u32,
    /// The ring has no room for a frame of [`MAX_CHAIN`] slots.
    pub full: bool,
    /// The RX budget is spent for this long.
    pub wait: Option<Duration>,
}

/// Up to two ranges of the region (a chain that wraps around the ring's
/// end is two): `(address, length)`, an unused one of length 0.
pub type Ranges = [(u64, usize); 2];

/// A checked TX frame, ready for the tap: the monitor's header, its copy
/// of the frame's first bytes, and where the rest lies in guest memory.
#[derive(Clone, Copy, Debug)]
pub struct TxFrame<'a> {
    /// The monitor's own virtio-net header (rebuilt from checked fields).
    pub vnet: VnetHdr,
    /// The frame's first bytes (its headers), copied and checked.
    pub head: &'a [u8],
    /// The rest of the frame in guest memory, in order.
    pub rest: Ranges,
}

impl TxFrame<'_> {
    /// The frame's length.
    pub fn len(&self) -> usize {
        self.head.len() + self.rest[0].1 + self.rest[1].1
    }

    /// Whether the frame is empty (never: frames have at least one byte).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The whole frame, read from `mem` (tests and fuzzing; the I/O thread
    /// hands the ranges to the kernel instead).
    pub fn to_vec(&self, mem: &impl RingMemory) -> Result<Vec<u8>, String> {
        let mut f = self.head.to_vec();
        for &(addr, len) in &self.rest {
            let at = f.len();
            f.resize(at + len, 0);
            mem.read(addr, &mut f[at..])?;
        }
        Ok(f)
    }
}

/// Where an RX frame may go: the [`MAX_CHAIN`] free slots at `rx_prod`.
#[derive(Clone, Copy, Debug)]
pub struct RxSpace {
    /// The slots' buffers, in order.
    pub ranges: Ranges,
}

impl RxSpace {
    /// Bytes of room.
    pub fn capacity(&self) -> usize {
        self.ranges[0].1 + self.ranges[1].1
    }

    /// Copy `frame` into the room (tests and fuzzing; the I/O thread reads
    /// the tap into it); false if it does not fit.
    pub fn put(&self, mem: &mut impl RingMemory, frame: &[u8]) -> Result<bool, String> {
        if frame.len() > self.capacity() {
            return Ok(false);
        }
        let first = frame.len().min(self.ranges[0].1);
        mem.write(self.ranges[0].0, &frame[..first])?;
        mem.write(self.ranges[1].0, &frame[first..])?;
        Ok(true)
    }
}

/// The ranges of `len` bytes from `skip` on, of the chain at `slot` of the
/// ring whose buffers start at `buf` (it wraps after slot SLOTS − 1).
fn chain(buf: u64, slot: u32, skip: usize, len: usize) -> Ranges {
    let to_end = (SLOTS - slot) as usize * SLOT_SIZE as usize;
    let at = buf + slot as u64 * SLOT_SIZE as u64;
    if skip >= to_end {
        return [(buf + (skip - to_end) as u64, len), (buf, 0)];
    }
    let first = len.min(to_end - skip);
    [(at + skip as u64, first), (buf, len - first)]
}

/// Segments and bytes on the wire of an RX frame of `len` bytes with
/// header `v` (the host's): a super-frame counts as its segments.
fn rx_cost(v: &VnetHdr, len: usize) -> (u64, u64) {
    if v.gso_type == gso::NONE || v.gso_size == 0 {
        return (1, len as u64);
    }
    let hdrs = (v.hdr_len as usize).min(len);
    let segs = (len - hdrs).div_ceil(v.gso_size as usize).max(1) as u64;
    (segs, len as u64 + (segs - 1) * hdrs as u64)
}

/// The monitor's state of one NIC's rings: its identity, its offloads, its
/// own indices, its budgets and counters.
#[derive(Clone, Debug)]
pub struct NicRing {
    /// Offset of the region in the memory.
    base: u64,
    /// What its frames may say they come from.
    mac: [u8; 6],
    ip: [u8; 4],
    /// Further IPv4 sources it may send from (`NetConfig::routes`).
    routes: Vec<([u8; 4], u8)>,
    /// The tap's offloads (`wisp_abi::net::offload` bits): what TX headers may ask for.
    offloads: u64,
    /// TX slots taken (the monitor's copy of `hdr::TX_CONS`).
    tx_cons: u32,
    /// RX slots filled (the monitor's copy of `hdr::RX_PROD`).
    rx_prod: u32,
    tx_limit: Option<RateLimiter>,
    rx_limit: Option<RateLimiter>,
    stats: NetStats,
}

impl NicRing {
    /// The rings of the region at `base` of `mem`, for a NIC with `mac` and
    /// IPv4 address `ip` whose tap has `offloads`, limited to `rate` from
    /// `now` on. The monitor's indices start where the ring's stand now
    /// (before the guest runs); from here on they are its own.
    pub fn new(mem: &impl RingMemory, base: u64, mac: [u8; 6], ip: [u8; 4], offloads: u64, rate: NetRate, now: Instant) -> Result<NicRing, String> {
        Ok(NicRing {
            base,
            mac,
            ip,
            routes: Vec::new(),
            offloads,
            tx_cons: mem.load_u32(base + hdr::TX_CONS)?,
            rx_prod: mem.load_u32(base + hdr::RX_PROD)?,
            tx_limit: limiter(rate.tx, now),
            rx_limit: limiter(rate.rx, now),
            stats: NetStats::default(),
        })
    }

    /// The same rings, for a NIC that routes for `routes` (its frames may
    /// carry those IPv4 sources too).
    pub fn routing(mut self, routes: Vec<([u8; 4], u8)>) -> NicRing {
        self.routes = routes;
        self
    }

    /// Its counters.
    pub fn stats(&self) -> NetStats {
        self.stats
    }

    /// The monitor's indices: (TX slots taken, RX slots filled).
    pub fn indices(&self) -> (u32, u32) {
        (self.tx_cons, self.rx_prod)
    }

    /// Say whether the monitor sleeps (and needs a kick for TX).
    pub fn set_idle(&self, mem: &mut impl RingMemory, idle: bool) -> Result<(), String> {
        mem.store_u32(self.base + hdr::MONITOR_IDLE, idle as u32)
    }

    /// Say whether the monitor waits for RX room (and needs a kick when
    /// the guest frees some).
    pub fn set_rx_wait(&self, mem: &mut impl RingMemory, waiting: bool) -> Result<(), String> {
        mem.store_u32(self.base + hdr::RX_WAIT, waiting as u32)
    }

    /// Tell the guest whether a TX kick by exit is served at once on its
    /// vCPU thread (`kick_exit`).
    pub fn set_kick_exit(&self, mem: &mut impl RingMemory, served: bool) -> Result<(), String> {
        mem.store_u32(self.base + hdr::KICK_EXIT, served as u32)
    }

    /// Whether the RX ring has room for a frame of [`MAX_CHAIN`] slots
    /// (the room `fill_rx` needs to read the tap).
    pub fn rx_room(&self, mem: &impl RingMemory) -> Result<bool, String> {
        Ok(self.rx_free(mem)? >= MAX_CHAIN)
    }

    /// Free RX slots; an error if the guest's consumer index ran ahead of
    /// the monitor's producer index.
    fn rx_free(&self, mem: &impl RingMemory) -> Result<u32, String> {
        let cons = mem.load_u32(self.base + hdr::RX_CONS)?;
        let used = self.rx_prod.wrapping_sub(cons);
        if used > SLOTS {
            return Err(format!("RX consumer index {cons} is ahead of the producer ({})", self.rx_prod));
        }
        Ok(SLOTS - used)
    }

    /// Tell the guest its NIC is stopped.
    pub fn mark_stopped(&self, mem: &mut impl RingMemory) -> Result<(), String> {
        mem.store_u32(self.base + hdr::STOPPED, 1)
    }

    /// Slots the guest has queued and the monitor not taken yet.
    pub fn tx_pending(&self, mem: &impl RingMemory) -> Result<u32, String> {
        let prod = mem.load_u32(self.base + hdr::TX_PROD)?;
        let cons = self.tx_cons;
        let n = prod.wrapping_sub(cons);
        if n > SLOTS {
            return Err(format!("TX producer index {prod} is {n} slots ahead of the consumer ({cons}); ring size {SLOTS}"));
        }
        Ok(n)
    }

    /// Take every frame the guest queued, as far as the TX budget allows at
    /// `now`: its descriptor and headers are copied and checked, and it is
    /// handed to `send` (with the memory, where the rest of it lies) if it
    /// carries the NIC's own identity (else dropped and counted).
    pub fn drain_tx<M: RingMemory>(&mut self, mem: &mut M, now: Instant, mut send: impl FnMut(&M, &TxFrame)) -> Result<Tx, String> {
        let pending = self.tx_pending(mem)?;
        let (mut done, mut taken) = (0u32, 0u32);
        let mut head = [0u8; HEAD_MAX];
        while done < pending {
            let slot = self.tx_cons % SLOTS;
            let mut d = [0u8; DESC_SIZE as usize];
            mem.read(self.base + TX_DESC_OFF + slot as u64 * DESC_SIZE, &mut d)?;
            let d = SlotDesc::read_from_bytes(&d).unwrap_or_default();
            if d.len == 0 || d.len > MAX_GSO_FRAME {
                return Err(format!("TX slot {slot}: length {} (1..={MAX_GSO_FRAME} allowed)", d.len));
            }
            let n = slots_for(d.len);
            if n > pending - done {
                return Err(format!(
                    "TX slot {slot}: a {}-byte frame takes {n} slots and only {} are queued (the chain leaves the ring)",
                    d.len,
                    pending - done
                ));
            }
            let len = d.len as usize;
            let hl = len.min(HEAD_MAX);
            let buf = self.base + TX_BUF_OFF;
            let [(a0, l0), (a1, _)] = chain(buf, slot, 0, hl);
            mem.read(a0, &mut head[..l0])?;
            mem.read(a1, &mut head[l0..hl])?;
            let plan = check::tx(&d, &head[..hl], self.offloads).map_err(|e| format!("TX slot {slot}: {e}"))?;
            if let Some(l) = &mut self.tx_limit {
                if !l.consume_ops_at(plan.wire_bytes, plan.segs as u64, now) {
                    return Ok(Tx { taken, wait: Some(l.ready_in_ops_at(plan.wire_bytes, plan.segs as u64, now)) });
                }
            }
            if own_frame(&head[..hl], self.mac, self.ip, &self.routes) {
                send(mem, &TxFrame { vnet: plan.vnet, head: &head[..hl], rest: chain(buf, slot, hl, len - hl) });
                self.stats.tx_frames += 1;
                self.stats.tx_segments += plan.segs as u64;
            } else {
                self.stats.tx_spoofed += 1;
            }
            self.tx_cons = self.tx_cons.wrapping_add(n);
            done += n;
            taken += 1;
            mem.store_u32(self.base + hdr::TX_CONS, self.tx_cons)?;
        }
        Ok(Tx { taken, wait: None })
    }

    /// Fill the RX ring with frames from `recv`, as far as the RX budget
    /// allows at `now`: while [`MAX_CHAIN`] slots are free, `recv` gets
    /// the memory and their room, writes one frame there and says its
    /// header and length (`None` or 0 when there is none; a length over
    /// the room: a frame too long, dropped). Beyond the budget frames stay
    /// where `recv` takes them from.
    pub fn fill_rx<M: RingMemory>(&mut self, mem: &mut M, now: Instant, mut recv: impl FnMut(&mut M, &RxSpace) -> Option<(VnetHdr, usize)>) -> Result<Rx, String> {
        let mut rx = Rx::default();
        loop {
            if self.rx_free(mem)? < MAX_CHAIN {
                rx.full = true;
                return Ok(rx);
            }
            // A frame read cannot be put back: it is delivered and paid
            // for. The budget must hold a slot's worth (a frame longer
            // than MAX_FRAME, VLAN-tagged or oversized, is as dear) and
            // a frame; a super-frame's further segments and bytes are a
            // debt the budget pays before the next read.
            if let Some(l) = &mut self.rx_limit {
                let wait = l.ready_in_at(SLOT_SIZE as u64, now);
                if !wait.is_zero() {
                    rx.wait = Some(wait);
                    return Ok(rx);
                }
            }
            let slot = self.rx_prod % SLOTS;
            let space = RxSpace { ranges: chain(self.base + RX_BUF_OFF, slot, 0, MAX_CHAIN as usize * SLOT_SIZE as usize) };
            let (vnet, n) = match recv(mem, &space) {
                Some((v, n)) if n > 0 => (v, n),
                _ => return Ok(rx),
            };
            let n = n.min(space.capacity() + 1);
            let (segs, bytes) = rx_cost(&vnet, n);
            if let Some(l) = &mut self.rx_limit {
                l.charge_at(bytes, segs, now);
            }
            if n > space.capacity() {
                self.stats.rx_dropped += 1;
                continue;
            }
            // The host's header as it is, but for flags the ABI does not define.
            let vnet = VnetHdr { flags: vnet.flags & (vnet_flags::NEEDS_CSUM | vnet_flags::DATA_VALID), ..vnet };
            let d = SlotDesc { len: n as u32, vnet, reserved: 0 };
            mem.write(self.base + RX_DESC_OFF + slot as u64 * DESC_SIZE, d.as_bytes())?;
            self.rx_prod = self.rx_prod.wrapping_add(slots_for(n as u32));
            mem.store_u32(self.base + hdr::RX_PROD, self.rx_prod)?;
            self.stats.rx_frames += 1;
            self.stats.rx_segments += segs;
            rx.got += 1;
        }
    }
}
