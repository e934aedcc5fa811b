//! The NIC driver: smoltcp's [`phy::Device`] over the two shared rings of
//! a `DeviceKind::Net` device (see `wisp_abi::net` for the ABI), with the
//! host's offloads where the monitor's tap has them (`params[4]`):
//!
//! - TX: smoltcp builds each frame of a poll in a batch of ours
//!   (`tcp_gso::Batch`), held until the poll ends; then, per flow, TCP
//!   segments that continue one another go to the ring as super-frames of
//!   up to 64 KiB, which the host cuts back into them (gso TCPV4), and
//!   TCP checksums are left to the host (smoltcp is told not to compute
//!   them; the checksum field gets the pseudo-header sum and the
//!   descriptor NEEDS_CSUM). Other frames go alone.
//! - RX: the host's super-frames (up to [`MAX_CHAIN`] slots) go to smoltcp
//!   whole — its ingress path takes a TCP segment longer than the MTU — and
//!   straight from the ring unless the chain wraps around its end. smoltcp
//!   checks no checksum; frames the host vouched for (NEEDS_CSUM: its own,
//!   DATA_VALID: checked) are taken as they are, the others are checked
//!   here (IPv4 header, TCP, UDP, ICMP) and dropped if wrong.
//!
//! The guest owns `rx_cons` and `tx_prod`, the monitor `rx_prod` and
//! `tx_cons` (slot counts). We read the monitor's index with acquire
//! ordering (so the slots it published are visible) and publish ours with
//! release ordering (so the slots we filled or finished with are). A TX
//! token is only handed out while the TX ring has room for every frame the
//! batch holds, each alone, and one frame more, so `tx_prod` never runs
//! more than `SLOTS` ahead of `tx_cons`; every TX frame is
//! 1..=`MAX_GSO_FRAME` bytes.

use alloc::vec;
use alloc::vec::Vec;
use core::sync::atomic::{fence, AtomicU32, Ordering};

use smoltcp::phy::{self, Checksum, ChecksumCapabilities, DeviceCapabilities, Medium};
use smoltcp::time::Instant;
use smoltcp::wire::{EthernetFrame, EthernetProtocol, Icmpv4Packet, IpProtocol, Ipv4Packet, TcpPacket, UdpPacket};
use wisp_abi::net::{
    decode_geometry, hdr, offload, slots_for, vnet_flags, SlotDesc, VnetHdr, DESC_SIZE, MAX_CHAIN, MAX_FRAME, MAX_GSO_FRAME, MAX_GSO_SEGS, REGION_SIZE,
    RX_BUF_OFF, RX_DESC_OFF, SLOTS, SLOT_SIZE, TX_BUF_OFF, TX_DESC_OFF,
};
use wisp_abi::DeviceDesc;

/// The header field at offset `off` of the NIC region at `base`.
fn field(base: u64, off: u64) -> &'static AtomicU32 {
    debug_assert!(off <= hdr::KICK_EXIT && off.is_multiple_of(4));
    // SAFETY: `base` was checked by `Nic::new`: a page-aligned region of at
    // least REGION_SIZE bytes, disjoint from the image, stack and heap, that
    // the monitor keeps mapped read/write for the guest's whole life. `off`
    // is a `hdr` offset, so the field is 4-byte aligned inside the header
    // page. Both sides only ever access these fields atomically, and no
    // Rust object other than these atomics lives in that memory.
    unsafe { &*((base + off) as *const AtomicU32) }
}

/// Guest-physical (= virtual) address of a slot's descriptor.
fn desc_addr(base: u64, desc_off: u64, index: u32) -> u64 {
    base + desc_off + (index % SLOTS) as u64 * DESC_SIZE
}

/// The two pieces (address, length) of `len` bytes from byte `offset` of
/// the chain that starts at ring index `index` of the buffers at
/// `buf_off` (a chain wraps after slot SLOTS − 1).
fn pieces(base: u64, buf_off: u64, index: u32, offset: usize, len: usize) -> [(u64, usize); 2] {
    let slot = index % SLOTS;
    let bufs = base + buf_off;
    let to_end = (SLOTS - slot) as usize * SLOT_SIZE as usize;
    if offset >= to_end {
        return [(bufs + (offset - to_end) as u64, len), (bufs, 0)];
    }
    let first = len.min(to_end - offset);
    [(bufs + slot as u64 * SLOT_SIZE as u64 + offset as u64, first), (bufs, len - first)]
}

/// Check a device-table entry against the ABI this library OS was built
/// with; `Ok((base, offloads))` if the rings can be used.
pub(crate) fn check(dev: &DeviceDesc) -> Result<(u64, u64), &'static str> {
    let info = crate::env::boot_info();
    let base = dev.base;
    let end = base.checked_add(REGION_SIZE).ok_or("region wraps around")?;
    if decode_geometry(dev.params[3]) != (SLOTS, SLOT_SIZE) {
        return Err("ring geometry differs from this library OS's ABI");
    }
    if dev.size < REGION_SIZE {
        return Err("region too small");
    }
    if base == 0 || !base.is_multiple_of(4096) || end > 1 << 47 {
        return Err("bad region address");
    }
    let overlaps = |lo: u64, hi: u64| base < hi && lo < end;
    if overlaps(0, 0x2000)
        || overlaps(info.stack_bottom, info.stack_top)
        || overlaps(info.image_start, info.image_end)
        || overlaps(info.heap_start, info.heap_end)
    {
        return Err("region overlaps the guest's own memory");
    }
    // Offloads this library OS knows; others are not used, nor TSO
    // without the checksum offload (a super-frame asks for its checksum).
    let mut offloads = dev.params[4] & (offload::CSUM | offload::TSO4);
    if offloads & offload::CSUM == 0 {
        offloads = 0;
    }
    Ok((base, offloads))
}

/// Whether the checksums of `frame` that the host did not vouch for hold:
/// the IPv4 header's and the TCP, UDP or ICMP one (what smoltcp, told not
/// to check, would have). Frames that are no such datagram are left to
/// smoltcp.
fn checksums_hold(frame: &[u8]) -> bool {
    let Ok(eth) = EthernetFrame::new_checked(frame) else { return true };
    if eth.ethertype() != EthernetProtocol::Ipv4 {
        return true;
    }
    let Ok(ip) = Ipv4Packet::new_checked(eth.payload()) else { return true };
    if !ip.verify_checksum() {
        return false;
    }
    if ip.more_frags() || ip.frag_offset() != 0 {
        return true;
    }
    let (src, dst) = (ip.src_addr().into(), ip.dst_addr().into());
    match ip.next_header() {
        IpProtocol::Tcp => TcpPacket::new_checked(ip.payload()).map_or(true, |p| p.verify_checksum(&src, &dst)),
        IpProtocol::Udp => UdpPacket::new_checked(ip.payload()).map_or(true, |p| p.verify_checksum(&src, &dst)),
        IpProtocol::Icmp => Icmpv4Packet::new_checked(ip.payload()).map_or(true, |p| p.verify_checksum()),
        _ => true,
    }
}

/// Longest a kick is left for the park (`Nic::flush_lazy`).
pub(crate) const LAZY_KICK_NS: u64 = 50_000;

/// The NIC's rings.
pub(crate) struct Nic {
    /// Index of the NIC in the device table (for its `notify` kicks).
    index: u32,
    /// The monitor serves its doorbell (kicks without an exit, where KVM helps).
    doorbell: bool,
    /// The monitor sends queued TX frames when the vCPU parks
    /// (`device_flags::PARK_SENDS`).
    park_sends: bool,
    /// A kick by exit left for the park (`flush_lazy`), since when.
    owed_since: Option<u64>,
    rx: Rx,
    tx: Tx,
    /// The monitor stopped the NIC (or broke the ring rules): never touch
    /// the rings again.
    dead: bool,
}

struct Rx {
    base: u64,
    /// Our copy of `rx_cons` (we are its only writer).
    cons: u32,
    /// Frames taken since the last `take_activity`.
    frames: u32,
    /// Slots were handed back since the last `flush`.
    freed: bool,
    /// Where a chain that wraps around the ring's end is put together.
    bounce: Vec<u8>,
}

struct Tx {
    ring: TxRing,
    /// Frames built since the last `take_activity`.
    frames: u32,
    /// A TX token was refused because the ring was full.
    full: bool,
    /// The tap's offloads we use.
    offloads: u64,
    /// The longest frame smoltcp may build: a 64 KiB TCP segment with the
    /// TSO offload, else one MTU.
    max: usize,
    /// Where smoltcp builds a frame whose chain would wrap around the
    /// ring's end, and where one the host would refuse is taken apart.
    scratch: Vec<u8>,
}

/// The TX ring as the guest fills it.
struct TxRing {
    base: u64,
    /// Our copy of `tx_prod` (we are its only writer).
    prod: u32,
    /// Frames published since the last `flush`.
    queued: u32,
}

impl Rx {
    /// Slots waiting in the RX ring.
    fn available(&self) -> u32 {
        field(self.base, hdr::RX_PROD).load(Ordering::Acquire).wrapping_sub(self.cons)
    }

    /// Give the chain at `rx_cons` (a frame is waiting: `available` > 0)
    /// and its header to `f`, then hand the chain back to the monitor. A
    /// length the ABI does not allow (a monitor bug) gives an empty frame.
    fn take<R>(&mut self, f: impl FnOnce(&[u8], VnetHdr) -> R) -> R {
        let d = desc_addr(self.base, RX_DESC_OFF, self.cons);
        // SAFETY: the caller saw `rx_prod` (acquire) past `rx_cons`, so the
        // monitor has finished writing this chain's descriptor and buffers
        // and will not touch them again until we advance `rx_cons`. The
        // descriptor lies inside the region `check` validated, 16-byte
        // aligned; a volatile copy, no reference into shared memory.
        let desc = unsafe { core::ptr::read_volatile(d as *const SlotDesc) };
        let avail = self.available();
        let mut len = desc.len as usize;
        let slots = slots_for(desc.len);
        if len == 0 || slots > MAX_CHAIN || slots > avail {
            len = 0;
        }
        let [(a0, l0), (a1, l1)] = pieces(self.base, RX_BUF_OFF, self.cons, 0, len);
        let frame: &[u8] = if l1 == 0 {
            // SAFETY: as above, the chain's `len` bytes are contiguous
            // (no wrap) inside the RX buffers; the monitor leaves them
            // alone until we publish `rx_cons` below, after `f` is done.
            unsafe { core::slice::from_raw_parts(a0 as *const u8, l0) }
        } else {
            self.bounce.resize(len, 0);
            // SAFETY: as above; the two pieces lie inside the RX buffers
            // and `bounce` holds `l0 + l1` bytes.
            unsafe {
                core::ptr::copy_nonoverlapping(a0 as *const u8, self.bounce.as_mut_ptr(), l0);
                core::ptr::copy_nonoverlapping(a1 as *const u8, self.bounce.as_mut_ptr().add(l0), l1);
            }
            &self.bounce[..len]
        };
        let r = f(frame, desc.vnet);
        // Done with the chain: hand it back.
        self.cons = self.cons.wrapping_add(slots.max(1).min(avail));
        field(self.base, hdr::RX_CONS).store(self.cons, Ordering::Release);
        self.frames += 1;
        self.freed = true;
        r
    }
}

impl TxRing {
    /// Free slots.
    fn free(&self) -> u32 {
        let cons = field(self.base, hdr::TX_CONS).load(Ordering::Acquire);
        SLOTS - self.prod.wrapping_sub(cons).min(SLOTS)
    }

    /// The chain at `prod` for a `len`-byte frame, if it does not wrap
    /// around the ring's end: smoltcp builds the frame there, in place.
    fn chain_mut(&mut self, len: usize) -> Option<&mut [u8]> {
        let [(a0, l0), (_, l1)] = pieces(self.base, TX_BUF_OFF, self.prod, 0, len);
        if l1 != 0 || l0 != len {
            return None;
        }
        // SAFETY: the chain at `prod` is not published: the monitor finished
        // with these slots (`Tx::has_room` saw them free with an acquire
        // load of `tx_cons` before the token that led here, and at most that
        // many are published per token) and reads them again only after
        // `publish_built` publishes them. `pieces` keeps the `len` bytes
        // inside the TX buffers of the validated region, contiguous (no
        // wrap). The slice lives no longer than this borrow of the ring.
        Some(unsafe { core::slice::from_raw_parts_mut(a0 as *mut u8, len) })
    }

    /// Publish the `len`-byte frame built at `prod` with header `vnet`.
    fn publish_built(&mut self, len: usize, vnet: VnetHdr) {
        let d = desc_addr(self.base, TX_DESC_OFF, self.prod);
        let desc = SlotDesc { len: len as u32, vnet, reserved: 0 };
        // SAFETY: this slot's descriptor, owned by us as in `chain_mut`; it
        // is 16-byte aligned inside the validated region.
        unsafe { core::ptr::write_volatile(d as *mut SlotDesc, desc) };
        self.prod = self.prod.wrapping_add(slots_for(len as u32));
        field(self.base, hdr::TX_PROD).store(self.prod, Ordering::Release);
        self.queued += 1;
    }

    /// Copy the frame made of `parts` (`len` bytes together) into the
    /// chain at `prod` and publish it with header `vnet`.
    fn publish(&mut self, parts: &[&[u8]], len: usize, vnet: VnetHdr) {
        let dst = pieces(self.base, TX_BUF_OFF, self.prod, 0, len);
        let (mut di, mut at) = (0, 0);
        for mut src in parts.iter().copied() {
            while !src.is_empty() && di < dst.len() {
                let (addr, room) = dst[di];
                let n = src.len().min(room - at);
                // SAFETY: the chain at `prod`, ours as in `chain_mut`;
                // `pieces` keeps every byte inside the TX buffers of the
                // validated region (a frame is at most MAX_CHAIN < SLOTS
                // slots), and `at + n` stays within this piece.
                unsafe { core::ptr::copy_nonoverlapping(src.as_ptr(), (addr as usize + at) as *mut u8, n) };
                src = &src[n..];
                at += n;
                if at == room {
                    (di, at) = (di + 1, 0);
                }
            }
        }
        self.publish_built(len, vnet);
    }
}

impl Tx {
    /// Free TX slots a token needs: with TSO, a 64 KiB segment the host
    /// would refuse, split into its most pieces (`tcp_gso::split`: 64
    /// single segments, or up to 16 super-segments of 3 slots); else one
    /// frame.
    fn room(&self) -> u32 {
        if self.max > MAX_FRAME as usize { MAX_GSO_SEGS.max(MAX_CHAIN) } else { slots_for(MAX_FRAME) }
    }

    fn has_room(&self) -> bool {
        self.ring.free() >= self.room()
    }

    /// The virtio-net header for `frame` as it is (smoltcp's segment size
    /// `tso` for a TCP segment past the MTU), or `Err` if the host would
    /// refuse it and it must be split.
    fn vnet(offloads: u64, frame: &mut [u8], tso: Option<u16>) -> Result<VnetHdr, ()> {
        if offloads & offload::CSUM == 0 {
            return Ok(VnetHdr::default());
        }
        tcp_gso::offload(frame, tso)
    }

    /// Send the `len` bytes in `scratch` in pieces the host takes.
    fn publish_split(&mut self, len: usize, size: u16) {
        let ring = &mut self.ring;
        tcp_gso::split(&self.scratch[..len], size, |h, p, v| ring.publish(&[h, p], h.len() + p.len(), v));
    }
}

impl Nic {
    /// The NIC described by device-table entry `index` (already `check`ed,
    /// `base` being its region, `offloads` what it may use, `flags` the
    /// entry's: whether the monitor serves its doorbell, sends at parks).
    pub(crate) fn new(index: u32, base: u64, offloads: u64, flags: u32) -> Nic {
        use wisp_abi::bootinfo::device_flags::{DOORBELL, PARK_SENDS};
        let (doorbell, park_sends) = (flags & DOORBELL != 0, flags & PARK_SENDS != 0);
        // The indices may not start at zero (the monitor owns their initial
        // values): continue from wherever they are.
        let rx_cons = field(base, hdr::RX_CONS).load(Ordering::Acquire);
        let tx_prod = field(base, hdr::TX_PROD).load(Ordering::Acquire);
        let tso = offloads & offload::CSUM != 0 && offloads & offload::TSO4 != 0;
        let max = if tso { MAX_GSO_FRAME as usize } else { MAX_FRAME as usize };
        Nic {
            index,
            doorbell,
            park_sends,
            owed_since: None,
            rx: Rx { base, cons: rx_cons, frames: 0, freed: false, bounce: Vec::new() },
            tx: Tx {
                ring: TxRing { base, prod: tx_prod, queued: 0 },
                frames: 0,
                full: false,
                offloads,
                max,
                // (Zeroed lazily: its pages cost nothing until a frame wraps.)
                scratch: vec![0u8; max],
            },
            dead: false,
        }
    }

    /// Whether the NIC is unusable: the monitor set `stopped`, or its RX
    /// index ran impossibly far ahead. Once true, stays true.
    pub(crate) fn is_dead(&mut self) -> bool {
        if !self.dead {
            let stopped = field(self.rx.base, hdr::STOPPED).load(Ordering::Acquire) != 0;
            self.dead = stopped || self.rx.available() > SLOTS;
        }
        self.dead
    }

    /// Cheap check whether a poll would find work: RX frames it can take
    /// (there is a TX slot for a reply), or room in a TX ring that was full.
    pub(crate) fn pending(&self) -> bool {
        if self.dead {
            return false;
        }
        let rx = self.rx.available() != 0;
        (rx || self.tx.full) && self.tx.has_room()
    }

    /// Whether RX frames wait in the ring.
    pub(crate) fn rx_waiting(&self) -> bool {
        !self.dead && self.rx.available() != 0
    }

    /// Start a poll: forget that the TX ring was full.
    pub(crate) fn begin_poll(&mut self) {
        self.tx.full = false;
    }

    /// Whether a TX token was refused (ring full) since `begin_poll`.
    pub(crate) fn tx_was_full(&self) -> bool {
        self.tx.full
    }

    /// Frames received and sent since the last call (and reset those).
    pub(crate) fn take_activity(&mut self) -> (u32, u32) {
        (core::mem::take(&mut self.rx.frames), core::mem::take(&mut self.tx.frames))
    }

    /// After a poll: kick the monitor's I/O
    /// thread if frames were queued while it sleeps, or RX slots were
    /// freed while it waits for them — once per batch, never per frame.
    pub(crate) fn flush(&mut self) {
        self.flush_with(false);
    }

    /// As [`flush`](Self::flush), but a kick by exit is left for the park
    /// when the monitor sends at parks (`PARK_SENDS`), for at most
    /// [`LAZY_KICK_NS`]: for a caller that parks next, unless more frames
    /// keep it busy (then a later flush kicks). One exit a frame, not two.
    pub(crate) fn flush_lazy(&mut self) {
        self.flush_with(true);
    }

    /// The vCPU parks now: a kick left for it is paid.
    pub(crate) fn parking(&mut self) {
        self.owed_since = None;
    }

    fn flush_with(&mut self, lazy: bool) {
        if self.dead {
            return;
        }
        let queued = core::mem::take(&mut self.tx.ring.queued) != 0 || self.owed_since.is_some();
        let freed = core::mem::take(&mut self.rx.freed);
        if !queued && !freed {
            return;
        }
        // Our `tx_prod` / `rx_cons` stores must be visible before we read
        // `monitor_idle` / `rx_wait` (the monitor does the mirror image:
        // store the flag, then re-read our index), or each side could miss
        // the other's write. Release/acquire does not order a store before
        // a later load; a full fence does.
        fence(Ordering::SeqCst);
        let base = self.tx.ring.base;
        let tx_kick = queued && field(base, hdr::MONITOR_IDLE).load(Ordering::Acquire) == 1;
        let rx_kick = freed && field(base, hdr::RX_WAIT).load(Ordering::Acquire) == 1;
        let kick = tx_kick || rx_kick;
        if !kick {
            // The monitor's thread is awake (or was woken): nothing owed.
            self.owed_since = None;
            return;
        }
        // Frames for a sleeping monitor that serves exits at once: an
        // exit sends them before we run on, where the doorbell would
        // only wake its thread (`kick_exit` in `wisp_abi::net`).
        let exit = tx_kick && field(base, hdr::KICK_EXIT).load(Ordering::Acquire) == 1;
        if exit && lazy && self.park_sends && !rx_kick {
            let now = crate::time::monotonic_ns();
            match self.owed_since {
                None => {
                    self.owed_since = Some(now);
                    return;
                }
                Some(t) if now.saturating_sub(t) < LAZY_KICK_NS => return,
                Some(_) => {}
            }
        }
        self.owed_since = None;
        if self.doorbell && !exit {
            crate::hypercall::doorbell(self.index);
        } else {
            crate::hypercall::notify(self.index);
        }
    }
}

/// Raw frames, for an app that takes the NIC as a link (`net::link`):
/// whole Ethernet frames with their virtio-net headers, no stack.
impl Nic {
    /// Hand the next RX frame and its header to `f` (nothing if the ring
    /// is empty). Checksums are not checked: a frame passing through is
    /// the receiver's to check.
    pub(crate) fn recv_raw<R>(&mut self, f: impl FnOnce(&[u8], VnetHdr) -> R) -> Option<R> {
        if self.dead || self.rx.available() == 0 {
            return None;
        }
        Some(self.rx.take(f))
    }

    /// Build a `len`-byte frame with `f` and queue it with header `vnet`
    /// (the monitor checks it: a header this NIC's offloads do not allow
    /// stops the NIC). `None` if the ring has no room, or `len` is not
    /// 1..=`MAX_GSO_FRAME` (more than `MAX_FRAME` only as a super-frame).
    pub(crate) fn send_raw<R>(&mut self, len: usize, vnet: VnetHdr, f: impl FnOnce(&mut [u8]) -> R) -> Option<R> {
        let most = if vnet.gso_type == 0 { MAX_FRAME as usize } else { self.tx.max };
        if self.dead || len == 0 || len > most || self.tx.ring.free() < slots_for(len as u32) {
            self.tx.full |= !self.dead && len != 0 && len <= most;
            return None;
        }
        let tx = &mut self.tx;
        tx.frames += 1;
        if let Some(buf) = tx.ring.chain_mut(len) {
            let r = f(buf);
            tx.ring.publish_built(len, vnet);
            return Some(r);
        }
        let r = f(&mut tx.scratch[..len]);
        tx.ring.publish(&[&tx.scratch[..len]], len, vnet);
        Some(r)
    }

    /// Whether the TX ring has room for the longest frame.
    pub(crate) fn tx_room(&self) -> bool {
        !self.dead && self.tx.ring.free() >= MAX_CHAIN
    }

    /// The offloads this NIC may use (`wisp_abi::net::offload` bits).
    pub(crate) fn offloads(&self) -> u64 {
        self.tx.offloads
    }
}

impl phy::Device for Nic {
    type RxToken<'a> = RxToken<'a>;
    type TxToken<'a> = TxToken<'a>;

    fn receive(&mut self, _now: Instant) -> Option<(RxToken<'_>, TxToken<'_>)> {
        if self.dead || self.rx.available() == 0 {
            return None;
        }
        // Processing a frame may need a reply (ARP, ICMP echo, TCP ACK/RST):
        // leave RX frames waiting until there is a TX slot for it.
        if !self.tx.has_room() {
            self.tx.full = true;
            return None;
        }
        Some((RxToken { rx: &mut self.rx }, TxToken { tx: &mut self.tx, tso: None }))
    }

    fn transmit(&mut self, _now: Instant) -> Option<TxToken<'_>> {
        if self.dead {
            return None;
        }
        if !self.tx.has_room() {
            self.tx.full = true;
            return None;
        }
        Some(TxToken { tx: &mut self.tx, tso: None })
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut caps = DeviceCapabilities::default();
        caps.medium = Medium::Ethernet;
        caps.max_transmission_unit = MAX_FRAME as usize;
        caps.max_burst_size = None;
        // Computed on TX (TCP's by the host where it can), never checked
        // on RX: `checksums_hold` does what the host did not vouch for.
        let mut sums = ChecksumCapabilities::default();
        sums.ipv4 = Checksum::Tx;
        sums.udp = Checksum::Tx;
        sums.icmpv4 = Checksum::Tx;
        sums.tcp = if self.tx.offloads & offload::CSUM != 0 { Checksum::None } else { Checksum::Tx };
        caps.checksum = sums;
        if self.tx.max > MAX_FRAME as usize {
            caps.segmentation.tcpv4 = core::num::NonZeroUsize::new(MAX_GSO_FRAME as usize);
        }
        caps
    }
}

/// One received frame: the chain at `rx_cons`.
pub(crate) struct RxToken<'a> {
    rx: &'a mut Rx,
}

impl phy::RxToken for RxToken<'_> {
    fn consume<R, F: FnOnce(&[u8]) -> R>(self, f: F) -> R {
        self.rx.take(|frame, vnet| {
            let vouched = vnet.flags & (vnet_flags::NEEDS_CSUM | vnet_flags::DATA_VALID) != 0;
            f(if vouched || checksums_hold(frame) { frame } else { &[] })
        })
    }
}

/// Room for one frame: smoltcp builds it in the ring (or in our buffer
/// when its chain would wrap around the ring's end).
pub(crate) struct TxToken<'a> {
    tx: &'a mut Tx,
    /// The segment size smoltcp asks the host to cut this frame into.
    tso: Option<u16>,
}

impl phy::TxToken for TxToken<'_> {
    fn set_meta(&mut self, meta: smoltcp::phy::PacketMeta) {
        self.tso = meta.segmentation_offload_size.map(|n| n.get());
    }

    fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
        let tx = self.tx;
        if len == 0 || len > tx.max {
            // Cannot go on the ring (smoltcp never asks for this with our
            // capabilities): build it and drop it, as a NIC drops an
            // oversized frame.
            let mut scratch = vec![0u8; len];
            return f(&mut scratch);
        }
        tx.frames += 1;
        let tso = self.tso.filter(|_| len > MAX_FRAME as usize);
        if let Some(buf) = tx.ring.chain_mut(len) {
            let r = f(buf);
            match Tx::vnet(tx.offloads, buf, tso) {
                Ok(vnet) => tx.ring.publish_built(len, vnet),
                Err(()) => {
                    tx.scratch[..len].copy_from_slice(buf);
                    tx.publish_split(len, tso.unwrap_or(0));
                }
            }
            return r;
        }
        let r = f(&mut tx.scratch[..len]);
        match Tx::vnet(tx.offloads, &mut tx.scratch[..len], tso) {
            Ok(vnet) => tx.ring.publish(&[&tx.scratch[..len]], len, vnet),
            Err(()) => tx.publish_split(len, tso.unwrap_or(0)),
        }
        r
    }
}
