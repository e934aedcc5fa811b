//! `hostile net-offload WHAT`: TX frames whose virtio-net header or chain
//! breaks the rules (ABI v4, `wisp_abi::net`), written straight into the
//! ring after one good super-frame: the monitor must stop this NIC and
//! only it. `hostile net-rx-stall SECS`: a guest that never takes an RX
//! frame while the host sends it plenty.

use core::sync::atomic::{AtomicU32, Ordering};
use core::time::Duration;

use alloc::vec::Vec;
use wisp::abi::net::{
    decode_ipv4, decode_mac, gso, hdr, slots_for, vnet_flags, SlotDesc, VnetHdr, DESC_SIZE, MAX_GSO_FRAME, SLOTS, SLOT_SIZE,
    TX_BUF_OFF, TX_DESC_OFF,
};
use wisp::abi::DeviceDesc;

/// The NIC's device-table entry and index.
fn nic() -> Option<(u32, &'static DeviceDesc)> {
    let info = wisp::env::boot_info();
    let n = info.device_count as usize;
    info.devices[..n]
        .iter()
        .enumerate()
        .find(|(_, d)| d.kind == wisp::abi::DeviceKind::Net as u32)
        .map(|(i, d)| (i as u32, d))
}

fn field(dev: &DeviceDesc, off: u64) -> &'static AtomicU32 {
    // SAFETY: the header page of the NIC region is guest RAM shared with
    // the monitor, mapped for the guest's life; u32 fields at 4-byte
    // aligned offsets, only accessed atomically.
    unsafe { &*((dev.base + off) as *const AtomicU32) }
}

/// A TCP/IPv4 super-frame from the NIC's own addresses to the gateway:
/// 10 segments of 1448 bytes, with the header that asks the host to cut it.
fn super_frame(dev: &DeviceDesc) -> (Vec<u8>, VnetHdr) {
    let (mac, (ip, _), gw) = (decode_mac(dev.params[0]), decode_ipv4(dev.params[1]), decode_ipv4(dev.params[2]).0);
    let payload = 10 * 1448;
    let mut f = Vec::new();
    f.extend_from_slice(&[0xff; 6]);
    f.extend_from_slice(&mac);
    f.extend_from_slice(&[0x08, 0x00]);
    let tot = (40 + payload) as u16;
    f.extend_from_slice(&[0x45, 0, (tot >> 8) as u8, tot as u8, 0, 0, 0x40, 0, 64, 6, 0, 0]);
    f.extend_from_slice(&ip);
    f.extend_from_slice(&gw);
    f.extend_from_slice(&[0x27, 0x0f, 0x27, 0x0f, 0, 0, 0, 1, 0, 0, 0, 1, 0x50, 0x10, 0xff, 0xff, 0, 0, 0, 0]);
    f.resize(f.len() + payload, 0x5a);
    let v = VnetHdr {
        flags: vnet_flags::NEEDS_CSUM,
        gso_type: gso::TCPV4,
        hdr_len: 54,
        gso_size: 1448,
        csum_start: 34,
        csum_offset: 16,
    };
    (f, v)
}

/// Write `frame` into the TX slots from `tx_prod` on (wrapping), its
/// descriptor saying `len` bytes with header `vnet`, and publish `slots`
/// slots.
fn put(dev: &DeviceDesc, frame: &[u8], len: u32, vnet: VnetHdr, slots: u32) {
    let prod = field(dev, hdr::TX_PROD).load(Ordering::Acquire);
    for (i, chunk) in frame.chunks(SLOT_SIZE as usize).enumerate() {
        let slot = (prod.wrapping_add(i as u32) % SLOTS) as u64;
        // SAFETY: TX slots from `tx_prod` on belong to the guest until it
        // publishes them (the ring is empty here: the monitor took all);
        // each chunk fits its slot.
        unsafe {
            core::ptr::copy_nonoverlapping(chunk.as_ptr(), (dev.base + TX_BUF_OFF + slot * SLOT_SIZE as u64) as *mut u8, chunk.len())
        };
    }
    let d = SlotDesc { len, vnet, reserved: 0 };
    // SAFETY: the descriptor of slot `prod`, the guest's until published.
    unsafe { core::ptr::write_volatile((dev.base + TX_DESC_OFF + (prod % SLOTS) as u64 * DESC_SIZE) as *mut SlotDesc, d) };
    field(dev, hdr::TX_PROD).store(prod.wrapping_add(slots), Ordering::Release);
}

/// Wait up to 5 s for `done`.
fn wait_for(done: impl Fn() -> bool) -> bool {
    let start = wisp::time::Instant::now();
    while !done() {
        if start.elapsed() > Duration::from_secs(5) {
            return false;
        }
        wisp::time::sleep(Duration::from_millis(5));
    }
    true
}

/// `net-offload WHAT`: a good super-frame, then a bad frame (WHAT).
pub fn bad_frame(what: &str) -> i32 {
    let Some((idx, dev)) = nic() else {
        wisp::println!("net-offload: no NIC");
        return 2;
    };
    let (f, good) = super_frame(dev);
    let len = f.len() as u32;
    let slots = slots_for(len);
    // The good one first: the monitor takes it (and the NIC goes on).
    put(dev, &f, len, good, slots);
    wisp::hypercall::notify(idx);
    let prod = field(dev, hdr::TX_PROD).load(Ordering::Acquire);
    if !wait_for(|| field(dev, hdr::TX_CONS).load(Ordering::Acquire) == prod) || field(dev, hdr::STOPPED).load(Ordering::Acquire) != 0 {
        wisp::println!("net-offload: the good super-frame was not taken");
        return 1;
    }
    let (len, vnet, slots) = match what {
        "gso-type" => (len, VnetHdr { gso_type: gso::UDP_L4, ..good }, slots),
        "gso-ecn" => (len, VnetHdr { gso_type: gso::TCPV4 | gso::ECN, ..good }, slots),
        "gso-size" => (len, VnetHdr { gso_size: 9000, ..good }, slots),
        "gso-size-zero" => (len, VnetHdr { gso_size: 0, ..good }, slots),
        "hdr-len" => (len, VnetHdr { hdr_len: 14_000, ..good }, slots),
        "csum-start" => (len, VnetHdr { csum_start: 60_000, ..good }, slots),
        "csum-offset" => (len, VnetHdr { csum_offset: 14_470, ..good }, slots),
        "flags" => (len, VnetHdr { flags: 0xff, ..good }, slots),
        // A frame without GSO longer than a slot (and the MTU).
        "frame-len" => (3000, VnetHdr::default(), 2),
        // The chain says 8 slots; 3 are published: it leaves the ring.
        "chain-past-prod" => (len, good, 3),
        // A chain longer than any frame: it would wrap onto itself.
        "chain-loop" => (SLOTS * SLOT_SIZE + 1, good, SLOTS),
        "chain-long" => (MAX_GSO_FRAME + 1, good, slots_for(MAX_GSO_FRAME + 1)),
        _ => {
            wisp::println!("net-offload: unknown case '{}'", what);
            return 2;
        }
    };
    put(dev, &f, len, vnet, slots);
    wisp::hypercall::notify(idx);
    let stopped = wait_for(|| field(dev, hdr::STOPPED).load(Ordering::Acquire) != 0);
    wisp::println!("net-offload {}: nic stopped = {}, guest still running", what, stopped as u32);
    if stopped { 0 } else { 1 }
}

/// `net-rx-stall SECS`: never take an RX frame for SECS seconds, then say
/// how full the RX ring is and whether the NIC still runs.
pub fn rx_stall(secs: u64) -> i32 {
    let Some((_, dev)) = nic() else {
        wisp::println!("net-rx-stall: no NIC");
        return 2;
    };
    wisp::println!("net-rx-stall: not reading for {} s", secs);
    wisp::time::sleep(Duration::from_secs(secs));
    let waiting = field(dev, hdr::RX_PROD).load(Ordering::Acquire).wrapping_sub(field(dev, hdr::RX_CONS).load(Ordering::Acquire));
    let stopped = field(dev, hdr::STOPPED).load(Ordering::Acquire);
    wisp::println!("net-rx-stall: {} slots waiting, nic stopped = {}", waiting, stopped);
    0
}
