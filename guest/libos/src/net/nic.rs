//! The NIC driver: smoltcp's [`phy::Device`] over the two shared rings of
//! a `DeviceKind::Net` device (see `wisp_abi::net` for the ABI).
//!
//! The guest owns `rx_cons` and `tx_prod`, the monitor `rx_prod` and
//! `tx_cons`. We read the monitor's index with acquire ordering (so the slot
//! it published is visible) and publish ours with release ordering (so the
//! slot we filled or finished with is). A TX token is only handed out while
//! the TX ring has a free slot, so `tx_prod` never runs more than `SLOTS`
//! ahead of `tx_cons`; every TX frame is 1..=`SLOT_SIZE` bytes.

use alloc::vec;
use core::sync::atomic::{fence, AtomicU32, Ordering};

use smoltcp::phy::{self, DeviceCapabilities, Medium};
use smoltcp::time::Instant;
use wisp_abi::net::{hdr, MAX_FRAME, REGION_SIZE, RX_BUF_OFF, RX_DESC_OFF, SLOTS, SLOT_SIZE, TX_BUF_OFF, TX_DESC_OFF};
use wisp_abi::DeviceDesc;

/// The header field at offset `off` of the NIC region at `base`.
fn field(base: u64, off: u64) -> &'static AtomicU32 {
    debug_assert!(off <= hdr::STOPPED && off.is_multiple_of(4));
    // SAFETY: `base` was checked by `Nic::new`: a page-aligned region of at
    // least REGION_SIZE bytes, disjoint from the image, stack and heap, that
    // the monitor keeps mapped read/write for the guest's whole life. `off`
    // is a `hdr` offset, so the field is 4-byte aligned inside the header
    // page. Both sides only ever access these fields atomically, and no
    // Rust object other than these atomics lives in that memory.
    unsafe { &*((base + off) as *const AtomicU32) }
}

/// Guest-physical (= virtual) address of a slot's descriptor `len` field.
fn desc_addr(base: u64, desc_off: u64, slot: u32) -> u64 {
    base + desc_off + slot as u64 * 8
}

/// Guest-physical (= virtual) address of a slot's frame buffer.
fn buf_addr(base: u64, buf_off: u64, slot: u32) -> u64 {
    base + buf_off + slot as u64 * SLOT_SIZE as u64
}

/// Check a device-table entry against the ABI this library OS was built
/// with; `Ok(base)` if the rings can be used.
pub(crate) fn check(dev: &DeviceDesc) -> Result<u64, &'static str> {
    let info = crate::env::boot_info();
    let base = dev.base;
    let end = base.checked_add(REGION_SIZE).ok_or("region wraps around")?;
    if dev.params[3] != SLOTS as u64 || dev.params[4] != SLOT_SIZE as u64 {
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
    Ok(base)
}

/// The NIC's rings.
pub(crate) struct Nic {
    /// Index of the NIC in the device table (for its `notify` kicks).
    index: u32,
    /// The monitor serves its doorbell (kicks without an exit, where KVM helps).
    doorbell: bool,
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
}

struct Tx {
    base: u64,
    /// Our copy of `tx_prod` (we are its only writer).
    prod: u32,
    /// Frames queued since the last `flush`.
    queued: u32,
    /// Frames queued since the last `take_activity`.
    frames: u32,
    /// A TX token was refused because the ring was full.
    full: bool,
}

impl Rx {
    /// Frames waiting in the RX ring.
    fn available(&self) -> u32 {
        field(self.base, hdr::RX_PROD).load(Ordering::Acquire).wrapping_sub(self.cons)
    }
}

impl Tx {
    /// Whether the TX ring has a free slot.
    fn has_room(&self) -> bool {
        let cons = field(self.base, hdr::TX_CONS).load(Ordering::Acquire);
        self.prod.wrapping_sub(cons) < SLOTS
    }
}

impl Nic {
    /// The NIC described by device-table entry `index` (already `check`ed,
    /// `base` being its region).
    pub(crate) fn new(index: u32, base: u64, doorbell: bool) -> Nic {
        // The indices may not start at zero (the monitor owns their initial
        // values): continue from wherever they are.
        let rx_cons = field(base, hdr::RX_CONS).load(Ordering::Acquire);
        let tx_prod = field(base, hdr::TX_PROD).load(Ordering::Acquire);
        Nic {
            index,
            doorbell,
            rx: Rx { base, cons: rx_cons, frames: 0 },
            tx: Tx { base, prod: tx_prod, queued: 0, frames: 0, full: false },
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

    /// After a poll: if frames were queued and the monitor's I/O thread
    /// sleeps, kick it — once per batch, never per frame.
    pub(crate) fn flush(&mut self) {
        if core::mem::take(&mut self.tx.queued) == 0 || self.dead {
            return;
        }
        // Our `tx_prod` store must be visible before we read `monitor_idle`
        // (the monitor does the mirror image: store `monitor_idle = 1`, then
        // re-read `tx_prod`), or each side could miss the other's write.
        // Release/acquire does not order a store before a later load; a
        // full fence does.
        fence(Ordering::SeqCst);
        if field(self.tx.base, hdr::MONITOR_IDLE).load(Ordering::Acquire) == 1 {
            if self.doorbell {
                crate::hypercall::doorbell(self.index);
            } else {
                crate::hypercall::notify(self.index);
            }
        }
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
        Some((RxToken { rx: &mut self.rx }, TxToken { tx: &mut self.tx }))
    }

    fn transmit(&mut self, _now: Instant) -> Option<TxToken<'_>> {
        if self.dead {
            return None;
        }
        if !self.tx.has_room() {
            self.tx.full = true;
            return None;
        }
        Some(TxToken { tx: &mut self.tx })
    }

    fn capabilities(&self) -> DeviceCapabilities {
        let mut caps = DeviceCapabilities::default();
        caps.medium = Medium::Ethernet;
        caps.max_transmission_unit = MAX_FRAME as usize;
        caps.max_burst_size = None;
        caps
    }
}

/// One received frame: the slot at `rx_cons`.
pub(crate) struct RxToken<'a> {
    rx: &'a mut Rx,
}

impl phy::RxToken for RxToken<'_> {
    fn consume<R, F: FnOnce(&[u8]) -> R>(self, f: F) -> R {
        let rx = self.rx;
        let slot = rx.cons % SLOTS;
        let mut frame = [0u8; SLOT_SIZE as usize];
        // SAFETY: `receive` saw `rx_prod` (acquire) past `rx_cons`, so the
        // monitor has finished writing this slot's descriptor and buffer and
        // will not touch them again until we advance `rx_cons`. Both lie
        // inside the region `check` validated (slot < SLOTS); the descriptor
        // field is 4-byte aligned. Volatile/raw copies: no reference into
        // the shared memory is created.
        let len = unsafe { core::ptr::read_volatile(desc_addr(rx.base, RX_DESC_OFF, slot) as *const u32) };
        // A length the ABI does not allow is a monitor bug: drop the frame.
        let len = if len <= SLOT_SIZE { len as usize } else { 0 };
        // SAFETY: as above; `frame` holds SLOT_SIZE ≥ len bytes.
        unsafe {
            core::ptr::copy_nonoverlapping(buf_addr(rx.base, RX_BUF_OFF, slot) as *const u8, frame.as_mut_ptr(), len)
        };
        // The slot is copied out: hand it back before processing the frame.
        rx.cons = rx.cons.wrapping_add(1);
        field(rx.base, hdr::RX_CONS).store(rx.cons, Ordering::Release);
        rx.frames += 1;
        f(&frame[..len])
    }
}

/// Room for one frame: the slot at `tx_prod`.
pub(crate) struct TxToken<'a> {
    tx: &'a mut Tx,
}

impl phy::TxToken for TxToken<'_> {
    fn consume<R, F: FnOnce(&mut [u8]) -> R>(self, len: usize, f: F) -> R {
        let tx = self.tx;
        if len == 0 || len > SLOT_SIZE as usize {
            // Cannot go on the ring (smoltcp never asks for this with our
            // MTU): build it and drop it, as a NIC drops an oversized frame.
            let mut scratch = vec![0u8; len];
            return f(&mut scratch);
        }
        let slot = tx.prod % SLOTS;
        let buf = buf_addr(tx.base, TX_BUF_OFF, slot) as *mut u8;
        // SAFETY: the token exists only if `tx_prod - tx_cons < SLOTS`
        // (checked with an acquire load of `tx_cons`), so the monitor has
        // finished with this slot and reads it again only after we publish
        // it below. The buffer lies inside the validated region and is
        // SLOT_SIZE ≥ len bytes; nothing else references it meanwhile.
        let r = f(unsafe { core::slice::from_raw_parts_mut(buf, len) });
        // SAFETY: this slot's descriptor, owned by us as above; the `len`
        // field is 4-byte aligned, `flags` follows it.
        unsafe {
            let d = desc_addr(tx.base, TX_DESC_OFF, slot);
            core::ptr::write_volatile(d as *mut u32, len as u32);
            core::ptr::write_volatile((d + 4) as *mut u32, 0);
        }
        tx.prod = tx.prod.wrapping_add(1);
        field(tx.base, hdr::TX_PROD).store(tx.prod, Ordering::Release);
        tx.queued += 1;
        tx.frames += 1;
        r
    }
}
