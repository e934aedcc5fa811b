//! The NIC's ring processing (`wisp_vmm::devices::net::ring`), the code the monitor's I/O thread
//! runs over a region of guest RAM, here over a real region in a byte buffer: the input is a guest
//! that writes whatever it likes into the region (indices, descriptors, frames; well-formed sends
//! too, so the monitor gets past its checks) between the monitor's passes over the TX and RX rings,
//! with frames from the host and a clock the input moves.
//!
//! Input: 8 bytes of setup, then operations (an opcode byte and its operands; a short tail ends it).
//!   setup: [0] layout (% 4 — 0: the region at 0; 1: at 4096; 2: cut short by [1..3] × 16 bytes),
//!          bit 2 set: the tap's offloads are bits 3-4 (else checksum and TSO4),
//!          [3] TX frames/s, [4] TX KiB/s, [5] RX frames/s, [6] RX KiB/s (0: unlimited),
//!          [7] ≠ 0: every index starts at u32::MAX − [7] (they wrap).
//!   op % 8: 0 write a header field, 1 a TX descriptor (length and virtio-net header), 2 bytes of a
//!          TX buffer; 3 send a frame as a guest does (own or forged identity; plain, or a TCP
//!          super-frame chained over slots with a header that is right or has one field changed);
//!          4 a TX pass; 5 an RX pass with frames (and headers) from the input; 6 the guest takes
//!          RX slots; 7 the clock moves.
//!
//! Checked besides "no panic": what leaves carries the NIC's identity, is 1..=MAX_GSO_FRAME bytes,
//! and its header (the monitor's own) passes the monitor's checks against the frame that leaves
//! (so no guest header reaches the tap unchecked) and asks only for the tap's offloads; the
//! published indices are the monitor's; every frame taken is counted once (sent or spoofed); RX
//! frames land in their chains with their lengths and headers and never overrun the guest's
//! consumer; the frame budgets hold against the clock, counting a super-frame's segments; a broken
//! rule is an error that stops the NIC.
#![no_main]

use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use wisp_abi::net::{
    gso, hdr, offload, slots_for, vnet_flags, SlotDesc, VnetHdr, DESC_SIZE, MAX_FRAME, MAX_GSO_FRAME, MAX_GSO_SEGS, REGION_SIZE,
    RX_BUF_OFF, RX_DESC_OFF, SLOTS, SLOT_SIZE, TX_BUF_OFF, TX_DESC_OFF,
};
use wisp_vmm::devices::net::ring::check::{self, HEAD_MAX};
use wisp_vmm::devices::net::ring::{ByteRegion, NicRing, RingMemory};
use wisp_vmm::devices::net::own_frame;
use wisp_vmm::{NetRate, Rate};
use zerocopy::{FromBytes, IntoBytes};

const MAC: [u8; 6] = [0x52, 0x54, 0, 9, 0, 2];
const IP: [u8; 4] = [10, 9, 0, 2];

/// The input, read front to back; zeros once it runs out.
struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn u8(&mut self) -> u8 {
        let (b, rest) = self.0.split_first().map_or((0, &[][..]), |(b, r)| (*b, r));
        self.0 = rest;
        b
    }
    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }
    /// `n` bytes: the input's, repeated (or zeros if there are none left).
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        let take = n.min(self.0.len()).min(64);
        let (head, rest) = self.0.split_at(take);
        self.0 = rest;
        if head.is_empty() {
            return vec![0; n];
        }
        head.iter().copied().cycle().take(n).collect()
    }
}

/// A frame a guest would send, `len` bytes: `kind` picks the EtherType and what it forges.
fn guest_frame(kind: u8, len: usize, fill: &[u8]) -> Vec<u8> {
    let mut f = fill.to_vec();
    f.resize(len, 0);
    let mut src = MAC;
    if kind & 4 != 0 {
        src[5] ^= 0x55;
    }
    let mut ip = IP;
    if kind & 8 != 0 {
        ip[3] = ip[3].wrapping_add(75);
    }
    let ty: u16 = match kind & 3 {
        0 => 0x0800,
        1 => 0x0806,
        2 => 0x86dd,
        _ => u16::from_be_bytes([fill.first().copied().unwrap_or(0), 0]),
    };
    let mut head = vec![0xff; 6];
    head.extend_from_slice(&src);
    head.extend_from_slice(&ty.to_be_bytes());
    if ty == 0x0806 {
        head.extend_from_slice(&[0, 1, 8, 0, 6, 4, 0, 1]);
        head.extend_from_slice(&src);
        head.extend_from_slice(&ip);
    } else {
        head.extend_from_slice(&[0x45, 0, 0, 20, 0, 0, 0, 0, 64, 17, 0, 0]);
        head.extend_from_slice(&ip);
    }
    let n = head.len().min(len);
    f[..n].copy_from_slice(&head[..n]);
    f
}

/// A TCP/IPv4 super-frame from the NIC, `payload` bytes in segments of `size`, and the header
/// that asks for GSO (`size` 0: a plain frame asking for its checksum).
fn tso_frame(payload: usize, size: u16, fill: &[u8]) -> (Vec<u8>, VnetHdr) {
    let mut f = vec![0xff; 6];
    f.extend_from_slice(&MAC);
    let tot = (40 + payload) as u16;
    f.extend_from_slice(&[0x08, 0x00, 0x45, 0, (tot >> 8) as u8, tot as u8, 0, 0, 0x40, 0, 64, 6, 0, 0]);
    f.extend_from_slice(&IP);
    f.extend_from_slice(&[10, 9, 0, 1, 0x13, 0x89, 0xc0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0x50, 0x10, 0xff, 0xff, 0, 0, 0, 0]);
    f.extend(fill.iter().copied().cycle().take(payload));
    f.resize(54 + payload, 0);
    let mut v = VnetHdr { flags: vnet_flags::NEEDS_CSUM, csum_start: 34, csum_offset: 16, ..Default::default() };
    if size > 0 {
        (v.gso_type, v.hdr_len, v.gso_size) = (gso::TCPV4, 54, size);
    }
    (f, v)
}

/// Write `f` into the TX chain at index `prod` (wrapping after the last slot); false past the end of
/// a region cut short (the guest's write would fault).
fn write_chain(mem: &mut ByteRegion, base: u64, prod: u32, f: &[u8]) -> bool {
    f.chunks(SLOT_SIZE as usize).enumerate().all(|(i, c)| {
        let slot = (prod.wrapping_add(i as u32) % SLOTS) as u64;
        mem.write(base + TX_BUF_OFF + slot * SLOT_SIZE as u64, c).is_ok()
    })
}

/// Read `len` bytes of the RX chain at index `at`.
fn read_chain(mem: &ByteRegion, base: u64, at: u32, len: usize) -> Option<Vec<u8>> {
    let mut f = vec![0u8; len];
    for (i, c) in f.chunks_mut(SLOT_SIZE as usize).enumerate() {
        let slot = (at.wrapping_add(i as u32) % SLOTS) as u64;
        mem.read(base + RX_BUF_OFF + slot * SLOT_SIZE as u64, c).ok()?;
    }
    Some(f)
}

/// Most frames a budget of `per_sec` may let through in `elapsed` (its burst of 100 ms, at least
/// one, then the rate).
fn most_frames(per_sec: u64, elapsed: Duration) -> u128 {
    (per_sec as u128 / 10).max(1) + per_sec as u128 * elapsed.as_nanos() / 1_000_000_000
}

fn run(data: &[u8]) -> Option<()> {
    let mut inp = Input(data);
    let (setup, cut) = (inp.u8(), inp.u16() as u64 * 16);
    let offloads = if setup & 4 == 0 { offload::CSUM | offload::TSO4 } else { (setup >> 3) as u64 & 3 };
    let (base, size) = match setup % 4 {
        1 => (4096, 4096 + REGION_SIZE),
        // The header page and the descriptors always fit: the NIC could not start otherwise.
        2 => (0, REGION_SIZE - cut.min(REGION_SIZE - RX_BUF_OFF)),
        _ => (0, REGION_SIZE),
    };
    let rate = |ops: u8, kib: u8| Rate { bytes: kib as u64 * 1024, ops: ops as u64 };
    let (tx_rate, rx_rate) = {
        let (a, b, c, d) = (inp.u8(), inp.u8(), inp.u8(), inp.u8());
        (rate(a, b), rate(c, d))
    };
    let start = inp.u8();
    let mut mem = ByteRegion::new(size as usize);
    if start != 0 {
        for f in [hdr::RX_PROD, hdr::RX_CONS, hdr::TX_PROD, hdr::TX_CONS] {
            mem.store_u32(base + f, u32::MAX - start as u32).ok()?;
        }
    }
    let t0 = Instant::now();
    let mut now = t0;
    let mut ring = NicRing::new(&mem, base, MAC, IP, offloads, NetRate { tx: tx_rate, rx: rx_rate }, t0).expect("the header fits");
    let mut taken = 0u64;
    let stop = |ring: &NicRing, mem: &mut ByteRegion, e: String| {
        assert!(!e.is_empty());
        ring.mark_stopped(mem).expect("the header fits");
        assert_eq!(mem.load_u32(base + hdr::STOPPED), Ok(1));
    };
    for _ in 0..200 {
        if inp.0.is_empty() {
            break;
        }
        match inp.u8() % 8 {
            0 => {
                let field = [hdr::RX_PROD, hdr::RX_CONS, hdr::TX_PROD, hdr::TX_CONS, hdr::MONITOR_IDLE, hdr::STOPPED][inp.u8() as usize % 6];
                mem.store_u32(base + field, inp.u32()).ok()?;
            }
            1 => {
                let slot = inp.u8() as u64 % SLOTS as u64;
                let raw = inp.u16();
                // Mostly up to a chain's largest; sometimes anything at all.
                let len = if raw & 0x8000 != 0 { inp.u32() } else { (raw as u32 * 3) % (MAX_GSO_FRAME + 2) };
                let vnet = VnetHdr {
                    flags: inp.u8(),
                    gso_type: inp.u8(),
                    hdr_len: inp.u16(),
                    gso_size: inp.u16(),
                    csum_start: inp.u16(),
                    csum_offset: inp.u16(),
                };
                let d = SlotDesc { len, vnet, reserved: inp.u16() };
                mem.write(base + TX_DESC_OFF + slot * DESC_SIZE, d.as_bytes()).ok()?;
            }
            2 => {
                let slot = inp.u8() as u64 % SLOTS as u64;
                let off = inp.u16() as u64 % SLOT_SIZE as u64;
                let n = (inp.u8() as u64).min(SLOT_SIZE as u64 - off) as usize;
                let bytes = inp.bytes(n);
                // Past a region cut short: the guest's write fails, as it would fault.
                let _ = mem.write(base + TX_BUF_OFF + slot * SLOT_SIZE as u64 + off, &bytes);
            }
            3 => {
                let kind = inp.u8();
                let (f, vnet) = if kind & 16 == 0 {
                    let len = (inp.u16() as usize % MAX_FRAME as usize) + 1;
                    let fill = inp.bytes(len.min(64));
                    (guest_frame(kind, len, &fill), VnetHdr::default())
                } else {
                    // A super-frame (or with kind & 32 a plain TCP frame asking for its checksum),
                    // with kind & 64 one field of its header changed.
                    let payload = inp.u16() as usize % (MAX_GSO_FRAME as usize - 53) + 1;
                    let size = if kind & 32 != 0 { 0 } else { 1448 - (inp.u8() as u16 & 0x3ff) };
                    let fill = inp.bytes(64);
                    let (f, mut v) = tso_frame(if size == 0 { payload.min(1460) } else { payload }, size, &fill);
                    if kind & 64 != 0 {
                        let x = inp.u16();
                        match inp.u8() % 6 {
                            0 => v.flags = x as u8,
                            1 => v.gso_type = x as u8,
                            2 => v.hdr_len = x,
                            3 => v.gso_size = x,
                            4 => v.csum_start = x,
                            _ => v.csum_offset = x,
                        }
                    }
                    (f, v)
                };
                let prod = mem.load_u32(base + hdr::TX_PROD).ok()?;
                let _ = write_chain(&mut mem, base, prod, &f);
                let d = SlotDesc { len: f.len() as u32, vnet, reserved: 0 };
                mem.write(base + TX_DESC_OFF + (prod % SLOTS) as u64 * DESC_SIZE, d.as_bytes()).ok()?;
                mem.store_u32(base + hdr::TX_PROD, prod.wrapping_add(slots_for(f.len() as u32))).ok()?;
            }
            4 => {
                let mut sent = Vec::new();
                let r = ring.drain_tx(&mut mem, now, |m, f| sent.push((f.vnet, f.head.len(), f.to_vec(m).expect("the monitor's ranges lie in the region"))));
                for (vnet, head_len, f) in &sent {
                    assert!((1..=MAX_GSO_FRAME as usize).contains(&f.len()), "a {}-byte frame left", f.len());
                    assert_eq!(*head_len, f.len().min(HEAD_MAX));
                    assert!(own_frame(f, MAC, IP, &[]), "a frame under another identity left: {:02x?}", &f[..f.len().min(64)]);
                    // The header that reaches the tap is the monitor's: it passes the monitor's own
                    // checks against the frame as it leaves, and asks only what the tap does.
                    let d = SlotDesc { len: f.len() as u32, vnet: *vnet, reserved: 0 };
                    let plan = check::tx(&d, &f[..f.len().min(HEAD_MAX)], offloads);
                    assert!(plan.as_ref().is_ok_and(|p| p.vnet == *vnet), "the monitor sent header {vnet:?}: {plan:?}");
                    if vnet.gso_type == gso::NONE {
                        assert!(f.len() <= MAX_FRAME as usize);
                    }
                }
                let st = ring.stats();
                match r {
                    Ok(t) => {
                        taken += t.taken as u64;
                        assert_eq!(taken, st.tx_frames + st.tx_spoofed, "every frame taken counted once");
                        // Published with each frame taken (a guest may scribble on it meanwhile: only
                        // the monitor's copy counts).
                        if t.taken > 0 {
                            assert_eq!(mem.load_u32(base + hdr::TX_CONS), Ok(ring.indices().0), "the published index is the monitor's");
                        }
                        assert!(t.taken as usize >= sent.len());
                        assert!(t.wait.is_none() || !tx_rate.is_unlimited());
                        if tx_rate.ops > 0 {
                            // Every segment is paid for; the last frame may leave a debt of its segments.
                            let most = most_frames(tx_rate.ops, now - t0) + MAX_GSO_SEGS as u128;
                            assert!((st.tx_segments as u128) <= most, "{} segments through a budget of {most}", st.tx_segments);
                        }
                    }
                    Err(e) => return Some(stop(&ring, &mut mem, e)),
                }
            }
            5 => {
                let count = inp.u8() % 64;
                let mut offered: Vec<(VnetHdr, Vec<u8>)> = Vec::new();
                let (_, before) = ring.indices();
                let r = ring.fill_rx(&mut mem, now, |m, space| {
                    if offered.len() >= count as usize {
                        return None;
                    }
                    let n = (inp.u16() as usize).min(space.capacity());
                    let bytes = inp.bytes(n);
                    let gso_size = inp.u16();
                    let vnet = VnetHdr { flags: inp.u8(), gso_type: inp.u8() % 6, hdr_len: 54, gso_size, ..Default::default() };
                    assert!(space.put(m, &bytes).expect("the room lies in the region or is refused"));
                    offered.push((vnet, bytes));
                    Some((vnet, n))
                });
                let (_, after) = ring.indices();
                match r {
                    Ok(rx) => {
                        if rx.got > 0 {
                            assert_eq!(mem.load_u32(base + hdr::RX_PROD), Ok(after), "the published index is the monitor's");
                        }
                        let cons = mem.load_u32(base + hdr::RX_CONS).ok()?;
                        assert!(after.wrapping_sub(cons) <= SLOTS, "RX ran over the guest's consumer");
                        // Frames of length 0 are "none": they end the pass undelivered.
                        let delivered: Vec<&(VnetHdr, Vec<u8>)> = offered.iter().take_while(|f| !f.1.is_empty()).collect();
                        assert_eq!(delivered.len(), rx.got as usize);
                        let mut at = before;
                        for (vnet, f) in delivered {
                            let mut d = [0u8; DESC_SIZE as usize];
                            mem.read(base + RX_DESC_OFF + (at % SLOTS) as u64 * DESC_SIZE, &mut d).ok()?;
                            let d = SlotDesc::read_from_bytes(&d).unwrap();
                            assert_eq!(d.len as usize, f.len());
                            let flags = vnet.flags & (vnet_flags::NEEDS_CSUM | vnet_flags::DATA_VALID);
                            assert_eq!(d.vnet, VnetHdr { flags, ..*vnet }, "the host's header, its known flags");
                            assert_eq!(read_chain(&mem, base, at, f.len()).as_ref(), Some(f), "RX chain at {at}");
                            at = at.wrapping_add(slots_for(f.len() as u32));
                        }
                        assert_eq!(at, after);
                        if rx_rate.ops > 0 {
                            // A frame is read only with a frame's budget there, and pays at least
                            // that (a super-frame its segments, as a debt).
                            let most = most_frames(rx_rate.ops, now - t0);
                            let frames = ring.stats().rx_frames + ring.stats().rx_dropped;
                            assert!(frames as u128 <= most, "{frames} RX frames through a budget of {most}");
                            assert!(ring.stats().rx_segments >= ring.stats().rx_frames);
                        }
                    }
                    Err(e) => return Some(stop(&ring, &mut mem, e)),
                }
            }
            6 => {
                let cons = mem.load_u32(base + hdr::RX_CONS).ok()?;
                mem.store_u32(base + hdr::RX_CONS, cons.wrapping_add(inp.u8() as u32)).ok()?;
            }
            _ => now += Duration::from_millis(inp.u16() as u64),
        }
        // Idle flag round trip, as the I/O thread does before and after sleeping.
        ring.set_idle(&mut mem, true).expect("the header fits");
        ring.set_idle(&mut mem, false).expect("the header fits");
    }
    Some(())
}

fuzz_target!(|data: &[u8]| {
    let _ = run(data);
});
