//! The NIC's ring processing (`wisp_vmm::devices::net::ring`), the code the monitor's I/O thread
//! runs over a region of guest RAM, here over a real region in a byte buffer: the input is a guest
//! that writes whatever it likes into the region (indices, descriptors, frames; well-formed sends
//! too, so the monitor gets past its checks) between the monitor's passes over the TX and RX rings,
//! with frames from the host and a clock the input moves.
//!
//! Input: 8 bytes of setup, then operations (an opcode byte and its operands; a short tail ends it).
//!   setup: [0] layout (0: the region at 0; 1: at 4096; 2: cut short by [1..3] × 16 bytes),
//!          [3] TX frames/s, [4] TX KiB/s, [5] RX frames/s, [6] RX KiB/s (0: unlimited),
//!          [7] ≠ 0: every index starts at u32::MAX − [7] (they wrap).
//!   op % 8: 0 write a header field, 1 a TX descriptor, 2 bytes of a TX buffer; 3 send a frame as a
//!          guest does (own or forged identity); 4 a TX pass; 5 an RX pass with frames from the
//!          input; 6 the guest takes RX frames; 7 the clock moves.
//!
//! Checked besides "no panic": what leaves carries the NIC's identity and fits a slot; the published
//! indices are the monitor's; every slot taken is counted once (sent or spoofed); RX frames land in
//! their slots with their lengths and never overrun the guest's consumer; the frame budgets hold
//! against the clock; a broken rule is an error that stops the NIC.
#![no_main]

use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use wisp_abi::net::{hdr, SlotDesc, REGION_SIZE, RX_BUF_OFF, RX_DESC_OFF, SLOTS, SLOT_SIZE, TX_BUF_OFF, TX_DESC_OFF};
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

/// Most frames a budget of `per_sec` may let through in `elapsed` (its burst of 100 ms, at least
/// one, then the rate).
fn most_frames(per_sec: u64, elapsed: Duration) -> u128 {
    (per_sec as u128 / 10).max(1) + per_sec as u128 * elapsed.as_nanos() / 1_000_000_000
}

fn run(data: &[u8]) -> Option<()> {
    let mut inp = Input(data);
    let (layout, cut) = (inp.u8() % 3, inp.u16() as u64 * 16);
    let (base, size) = match layout {
        0 => (0, REGION_SIZE),
        1 => (4096, 4096 + REGION_SIZE),
        // The header page and the descriptors always fit: the NIC could not start otherwise.
        _ => (0, REGION_SIZE - cut.min(REGION_SIZE - RX_BUF_OFF)),
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
    let mut ring = NicRing::new(&mem, base, MAC, IP, NetRate { tx: tx_rate, rx: rx_rate }, t0).expect("the header fits");
    let (tx0, rx0) = ring.indices();
    let mut frame = vec![0u8; SLOT_SIZE as usize];
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
                // Mostly near the slot size; sometimes anything at all.
                let len = if raw & 0x8000 != 0 { inp.u32() } else { raw as u32 % (SLOT_SIZE + 2) };
                let d = SlotDesc { len, flags: inp.u32() };
                mem.write(base + TX_DESC_OFF + slot * 8, d.as_bytes()).ok()?;
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
                let len = (inp.u16() as usize % SLOT_SIZE as usize) + 1;
                let fill = inp.bytes(len.min(64));
                let f = guest_frame(kind, len, &fill);
                let prod = mem.load_u32(base + hdr::TX_PROD).ok()?;
                let slot = (prod % SLOTS) as u64;
                let _ = mem.write(base + TX_BUF_OFF + slot * SLOT_SIZE as u64, &f);
                mem.write(base + TX_DESC_OFF + slot * 8, SlotDesc { len: len as u32, flags: 0 }.as_bytes()).ok()?;
                mem.store_u32(base + hdr::TX_PROD, prod.wrapping_add(1)).ok()?;
            }
            4 => {
                let mut sent = Vec::new();
                let r = ring.drain_tx(&mut mem, now, &mut frame, |f| sent.push(f.to_vec()));
                for f in &sent {
                    assert!((1..=SLOT_SIZE as usize).contains(&f.len()), "a {}-byte frame left", f.len());
                    assert!(own_frame(f, MAC, IP), "a frame under another identity left: {f:02x?}");
                }
                let st = ring.stats();
                let (tx, _) = ring.indices();
                assert_eq!(tx.wrapping_sub(tx0) as u64, st.tx_frames + st.tx_spoofed, "every slot taken counted once");
                match r {
                    Ok(t) => {
                        // Published with each frame taken (a guest may scribble on it meanwhile:
                        // only the monitor's copy counts).
                        if t.taken > 0 {
                            assert_eq!(mem.load_u32(base + hdr::TX_CONS), Ok(tx), "the published index is the monitor's");
                        }
                        assert!(t.taken as usize >= sent.len());
                        assert!(t.wait.is_none() || !tx_rate.is_unlimited());
                        if tx_rate.ops > 0 {
                            let most = most_frames(tx_rate.ops, now - t0);
                            assert!(tx.wrapping_sub(tx0) as u128 <= most, "{} frames through a budget of {most}", tx.wrapping_sub(tx0));
                        }
                    }
                    Err(e) => return Some(stop(&ring, &mut mem, e)),
                }
            }
            5 => {
                let count = inp.u8() % 64;
                let mut offered: Vec<Vec<u8>> = Vec::new();
                let (_, before) = ring.indices();
                let r = ring.fill_rx(&mut mem, now, &mut frame, |buf| {
                    if offered.len() >= count as usize {
                        return None;
                    }
                    let n = (inp.u16() as usize).min(buf.len());
                    let bytes = inp.bytes(n);
                    buf[..n].copy_from_slice(&bytes);
                    offered.push(bytes);
                    Some(n)
                });
                let (_, after) = ring.indices();
                match r {
                    Ok(rx) => {
                        if rx.got > 0 {
                            assert_eq!(mem.load_u32(base + hdr::RX_PROD), Ok(after), "the published index is the monitor's");
                        }
                        assert_eq!(after.wrapping_sub(before), rx.got);
                        let cons = mem.load_u32(base + hdr::RX_CONS).ok()?;
                        assert!(after.wrapping_sub(cons) <= SLOTS, "RX ran over the guest's consumer");
                        // Frames of length 0 are "none": they end the pass undelivered.
                        let delivered: Vec<&Vec<u8>> = offered.iter().take_while(|f| !f.is_empty()).collect();
                        assert_eq!(delivered.len(), rx.got as usize);
                        for (i, f) in delivered.iter().enumerate() {
                            let slot = (before.wrapping_add(i as u32) % SLOTS) as u64;
                            let mut d = [0u8; 8];
                            mem.read(base + RX_DESC_OFF + slot * 8, &mut d).ok()?;
                            assert_eq!(SlotDesc::read_from_bytes(&d).unwrap().len as usize, f.len());
                            let mut got = vec![0u8; f.len()];
                            mem.read(base + RX_BUF_OFF + slot * SLOT_SIZE as u64, &mut got).ok()?;
                            assert_eq!(&got, *f, "RX slot {slot}");
                        }
                        if rx_rate.ops > 0 {
                            let most = most_frames(rx_rate.ops, now - t0);
                            assert!(after.wrapping_sub(rx0) as u128 <= most, "{} RX frames through a budget of {most}", after.wrapping_sub(rx0));
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
