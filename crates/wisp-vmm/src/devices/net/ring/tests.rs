use super::*;
use wisp_abi::net::{offload, MAX_GSO_SEGS};

const MAC: [u8; 6] = [0x52, 0x54, 0, 9, 0, 2];
const IP: [u8; 4] = [10, 9, 0, 2];
const OFFLOADS: u64 = offload::CSUM | offload::TSO4;

/// An IPv4 frame from the NIC (source `ip`), `len` bytes, tagged `tag`.
fn frame(ip: [u8; 4], tag: u8, len: usize) -> Vec<u8> {
    let mut f = vec![0xff; 6];
    f.extend_from_slice(&MAC);
    f.extend_from_slice(&[0x08, 0x00, 0x45, 0, 0, 20, 0, 0, 0, 0, 64, 17, 0, 0]);
    f.extend_from_slice(&ip);
    f.extend_from_slice(&[10, 9, 0, 1]);
    f.resize(len, tag);
    f
}

/// A TCP/IPv4 super-frame from the NIC: `payload` bytes in segments of
/// `size`, its header asking for GSO; payload bytes count up from `tag`.
fn tso(payload: usize, size: u16, tag: u8) -> (Vec<u8>, VnetHdr) {
    let mut f = vec![0xff; 6];
    f.extend_from_slice(&MAC);
    let tot = (40 + payload) as u16;
    f.extend_from_slice(&[0x08, 0x00, 0x45, 0, (tot >> 8) as u8, tot as u8, 0, 0, 0x40, 0, 64, 6, 0, 0]);
    f.extend_from_slice(&IP);
    f.extend_from_slice(&[10, 9, 0, 1, 0x13, 0x89, 0xc0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0x50, 0x10, 0xff, 0xff, 0, 0, 0, 0]);
    f.extend((0..payload).map(|i| tag.wrapping_add(i as u8)));
    let v = VnetHdr { flags: 1, gso_type: gso::TCPV4, hdr_len: 54, gso_size: size, csum_start: 34, csum_offset: 16 };
    (f, v)
}

/// What a guest does to send: the frame in the slots from `tx_prod` on
/// (wrapping), its descriptor, then the index.
fn queue_with(m: &mut ByteRegion, f: &[u8], vnet: VnetHdr) {
    let prod = m.load_u32(hdr::TX_PROD).unwrap();
    let slot = prod % SLOTS;
    let [(a0, l0), (a1, _)] = chain(TX_BUF_OFF, slot, 0, f.len());
    m.write(a0, &f[..l0]).unwrap();
    m.write(a1, &f[l0..]).unwrap();
    let d = SlotDesc { len: f.len() as u32, vnet, reserved: 0 };
    m.write(TX_DESC_OFF + slot as u64 * DESC_SIZE, d.as_bytes()).unwrap();
    m.store_u32(hdr::TX_PROD, prod.wrapping_add(slots_for(f.len() as u32).max(1))).unwrap();
}

fn queue(m: &mut ByteRegion, f: &[u8]) {
    queue_with(m, f, VnetHdr::default())
}

fn ring(m: &ByteRegion, rate: NetRate, t: Instant) -> NicRing {
    NicRing::new(m, 0, MAC, IP, OFFLOADS, rate, t).unwrap()
}

/// Frames that reached the tap: (header, frame).
type Sent = Vec<(VnetHdr, Vec<u8>)>;

/// A TX pass: what it did and what reached the tap.
fn drain(r: &mut NicRing, m: &mut ByteRegion, t: Instant) -> (Result<Tx, String>, Sent) {
    let mut sent = Vec::new();
    let tx = r.drain_tx(m, t, |mem, f| sent.push((f.vnet, f.to_vec(mem).unwrap())));
    (tx, sent)
}

/// An RX pass with frames from `frames` (each with its header).
fn fill(r: &mut NicRing, m: &mut ByteRegion, t: Instant, frames: &mut impl Iterator<Item = (VnetHdr, Vec<u8>)>) -> Result<Rx, String> {
    r.fill_rx(m, t, |mem, space| {
        let (v, f) = frames.next()?;
        if !space.put(mem, &f).unwrap() {
            return Some((v, space.capacity() + 1));
        }
        Some((v, f.len()))
    })
}

/// The guest's view of the RX frame at slot index `at`: descriptor, bytes.
fn rx_frame(m: &ByteRegion, at: u32) -> (SlotDesc, Vec<u8>) {
    let slot = at % SLOTS;
    let mut d = [0u8; DESC_SIZE as usize];
    m.read(RX_DESC_OFF + slot as u64 * DESC_SIZE, &mut d).unwrap();
    let d = SlotDesc::read_from_bytes(&d).unwrap();
    let mut f = vec![0; d.len as usize];
    let [(a0, l0), (a1, _)] = chain(RX_BUF_OFF, slot, 0, f.len());
    m.read(a0, &mut f[..l0]).unwrap();
    m.read(a1, &mut f[l0..]).unwrap();
    (d, f)
}

#[test]
fn frames_go_once_under_the_nics_identity() {
    let (mut m, t) = (ByteRegion::region(), Instant::now());
    let mut r = ring(&m, NetRate::default(), t);
    let (good, spoofed, last) = (frame(IP, 1, 60), frame([10, 9, 0, 7], 2, 60), frame(IP, 3, MAX_FRAME as usize));
    for f in [&good, &spoofed, &last] {
        queue(&mut m, f);
    }
    let (tx, sent) = drain(&mut r, &mut m, t);
    assert_eq!(tx, Ok(Tx { taken: 3, wait: None }));
    assert_eq!(sent, [(VnetHdr::default(), good), (VnetHdr::default(), last)]);
    assert_eq!((r.stats().tx_frames, r.stats().tx_spoofed), (2, 1));
    assert_eq!(m.load_u32(hdr::TX_CONS), Ok(3));
    // The guest rewinds the consumer index: nothing goes twice.
    m.store_u32(hdr::TX_CONS, 0).unwrap();
    let (tx, sent) = drain(&mut r, &mut m, t);
    assert_eq!((tx, sent.len()), (Ok(Tx::default()), 0));
    assert_eq!(r.indices(), (3, 0));
    // Indices wrap around u32.
    let mut m = ByteRegion::region();
    m.store_u32(hdr::TX_PROD, u32::MAX).unwrap();
    m.store_u32(hdr::TX_CONS, u32::MAX).unwrap();
    let mut r = ring(&m, NetRate::default(), t);
    queue(&mut m, &frame(IP, 4, 100));
    queue(&mut m, &frame(IP, 5, 100));
    assert_eq!(drain(&mut r, &mut m, t).1.len(), 2);
    assert_eq!(r.indices().0, 1);
}

#[test]
fn super_frames_chain_slots_and_reach_the_tap_whole() {
    let (mut m, t) = (ByteRegion::region(), Instant::now());
    // Start 10 slots before the ring's end: the second frame wraps.
    for f in [hdr::TX_PROD, hdr::TX_CONS] {
        m.store_u32(f, SLOTS - 10).unwrap();
    }
    let mut r = ring(&m, NetRate::default(), t);
    let (a, va) = tso(9 * 1448, 1448, 1);
    let (b, vb) = tso(65535 - 40, 1460, 2);
    queue_with(&mut m, &a, va);
    queue_with(&mut m, &b, vb);
    queue(&mut m, &frame(IP, 3, 60));
    let (tx, sent) = drain(&mut r, &mut m, t);
    assert_eq!(tx, Ok(Tx { taken: 3, wait: None }));
    assert_eq!(sent.len(), 3);
    // The monitor's header: the checked fields, the frame as queued.
    assert_eq!(sent[0], (va, a.clone()));
    assert_eq!(sent[1], (vb, b.clone()));
    assert_eq!(sent[2].1, frame(IP, 3, 60));
    let slots = slots_for(a.len() as u32) + slots_for(b.len() as u32) + 1;
    assert_eq!(slots, 7 + 33 + 1);
    assert_eq!(r.indices().0, (SLOTS - 10).wrapping_add(slots));
    assert_eq!(m.load_u32(hdr::TX_CONS), Ok(r.indices().0));
    assert_eq!(r.stats().tx_segments, 9 + 45 + 1);
    // A super-frame pays for each segment: 20 frames/s lets 2 through
    // (the burst), and 45 segments are a debt of 2.15 s.
    let mut m = ByteRegion::region();
    let rate = NetRate { tx: Rate { bytes: 0, ops: 20 }, rx: Rate::default() };
    let mut r = ring(&m, rate, t);
    queue_with(&mut m, &b, vb);
    queue(&mut m, &frame(IP, 4, 60));
    let (tx, _) = drain(&mut r, &mut m, t);
    assert_eq!(tx.unwrap(), Tx { taken: 1, wait: Some(Duration::from_millis(2200)) });
}

#[test]
fn chains_and_headers_that_break_the_rules_stop_the_nic() {
    let t = Instant::now();
    let err = |m: &mut ByteRegion| {
        let mut r = ring(m, NetRate::default(), t);
        drain(&mut r, m, t).0.unwrap_err()
    };
    // A chain longer than what was queued: it leaves the ring.
    let mut m = ByteRegion::region();
    let (b, vb) = tso(40_000, 1448, 1);
    queue_with(&mut m, &b, vb);
    m.store_u32(hdr::TX_PROD, 5).unwrap();
    assert!(err(&mut m).contains("takes 20 slots and only 5 are queued"));
    // Over the largest frame a chain may hold.
    let mut m = ByteRegion::region();
    let d = SlotDesc { len: MAX_GSO_FRAME + 1, vnet: vb, reserved: 0 };
    m.write(TX_DESC_OFF, d.as_bytes()).unwrap();
    m.store_u32(hdr::TX_PROD, SLOTS).unwrap();
    assert!(err(&mut m).contains(&format!("length {}", MAX_GSO_FRAME + 1)));
    // Bogus headers: the slot and the reason.
    for (v, why) in [
        (VnetHdr { gso_type: gso::UDP_L4, ..vb }, "gso_type 0x5"),
        (VnetHdr { gso_size: 0, ..vb }, "gso_size 0"),
        (VnetHdr { hdr_len: 40_000, ..vb }, "hdr_len 40000"),
        (VnetHdr { csum_start: 60_000, ..vb }, "csum_start 60000"),
        (VnetHdr { csum_offset: 3, ..vb }, "csum_offset 3"),
        (VnetHdr { gso_size: 100, ..vb }, &format!("({MAX_GSO_SEGS} at most)")),
    ] {
        let mut m = ByteRegion::region();
        queue(&mut m, &frame(IP, 1, 60));
        queue_with(&mut m, &b, v);
        let mut r = ring(&m, NetRate::default(), t);
        let (tx, sent) = drain(&mut r, &mut m, t);
        let e = tx.unwrap_err();
        assert!(e.starts_with("TX slot 1: ") && e.contains(why), "{v:?}: {e}");
        assert_eq!(sent.len(), 1, "the frame before it went");
    }
    // Without the tap's offloads, no offload is asked of it.
    let mut m = ByteRegion::region();
    queue_with(&mut m, &b, vb);
    let mut r = NicRing::new(&m, 0, MAC, IP, offload::CSUM, NetRate::default(), t).unwrap();
    assert!(drain(&mut r, &mut m, t).0.unwrap_err().contains("not an offload of this NIC"));
}

#[test]
fn broken_ring_rules_stop_the_nic_without_a_panic() {
    let t = Instant::now();
    let err = |m: &mut ByteRegion| {
        let mut r = ring(m, NetRate::default(), t);
        drain(&mut r, m, t).0.unwrap_err()
    };
    let mut m = ByteRegion::region();
    m.store_u32(hdr::TX_PROD, SLOTS + 1).unwrap();
    assert!(err(&mut m).contains("ahead of the consumer"));
    // A producer behind the consumer is as far ahead as u32 goes.
    let mut m = ByteRegion::region();
    m.store_u32(hdr::TX_CONS, 5).unwrap();
    m.store_u32(hdr::TX_PROD, 4).unwrap();
    assert!(err(&mut m).contains("ahead of the consumer"));
    for len in [0, MAX_GSO_FRAME + 1, u32::MAX] {
        let mut m = ByteRegion::region();
        m.write(TX_DESC_OFF, SlotDesc { len, ..Default::default() }.as_bytes()).unwrap();
        m.store_u32(hdr::TX_PROD, SLOTS).unwrap();
        assert!(err(&mut m).contains(&format!("length {len}")), "{len}");
    }
    // A region cut short by the end of memory: an error where it ends.
    let mut m = ByteRegion::new(TX_BUF_OFF as usize + 100);
    queue(&mut m, &frame(IP, 1, 60));
    // The second frame's buffer lies past the end: only its descriptor.
    m.write(TX_DESC_OFF + DESC_SIZE, SlotDesc { len: 60, ..Default::default() }.as_bytes()).unwrap();
    m.store_u32(hdr::TX_PROD, 2).unwrap();
    let mut r = ring(&m, NetRate::default(), t);
    let (tx, sent) = drain(&mut r, &mut m, t);
    assert!(tx.unwrap_err().contains("outside"));
    assert_eq!(sent.len(), 1, "the first frame fits");
    assert!(NicRing::new(&ByteRegion::new(8), 0, MAC, IP, 0, NetRate::default(), t).is_err());
    // The RX consumer ahead of the producer.
    let mut m = ByteRegion::region();
    let mut r = ring(&m, NetRate::default(), t);
    m.store_u32(hdr::RX_CONS, 1).unwrap();
    let e = r.fill_rx(&mut m, t, |_, _| Some((VnetHdr::default(), 60))).unwrap_err();
    assert!(e.contains("RX consumer index 1 is ahead"), "{e}");
}

#[test]
fn rx_fills_free_slots_only() {
    let (mut m, t) = (ByteRegion::region(), Instant::now());
    let mut r = ring(&m, NetRate::default(), t);
    let mut n = 0u32;
    let mut recv = |mem: &mut ByteRegion, space: &RxSpace| {
        n += 1;
        let mut f = vec![0u8; 60 + (n as usize % 1000)];
        f[..4].copy_from_slice(&n.to_le_bytes());
        space.put(mem, &f).unwrap();
        Some((VnetHdr::default(), f.len()))
    };
    // A frame is read only with room for the largest (MAX_CHAIN slots).
    let rx = r.fill_rx(&mut m, t, &mut recv).unwrap();
    let fit = SLOTS - MAX_CHAIN + 1;
    assert_eq!(rx, Rx { got: fit, full: true, wait: None });
    assert_eq!(m.load_u32(hdr::RX_PROD), Ok(fit));
    // Slot 7 holds the 8th frame, with its length.
    let (d, f) = rx_frame(&m, 7);
    assert_eq!((d.len, u32::from_le_bytes(f[..4].try_into().unwrap())), (68, 8));
    // The guest takes 10: 10 more fit.
    m.store_u32(hdr::RX_CONS, 10).unwrap();
    assert_eq!(r.fill_rx(&mut m, t, &mut recv).unwrap().got, 10);
    // Nothing to read: nothing delivered, not full.
    m.store_u32(hdr::RX_CONS, fit + 10).unwrap();
    assert_eq!(r.fill_rx(&mut m, t, |_, _| None).unwrap(), Rx::default());
    assert_eq!(r.stats().rx_frames, fit as u64 + 10);
}

#[test]
fn rx_super_frames_chain_slots_with_the_hosts_header() {
    let (mut m, t) = (ByteRegion::region(), Instant::now());
    // Start 5 slots before the end: the first frame wraps.
    for f in [hdr::RX_PROD, hdr::RX_CONS] {
        m.store_u32(f, SLOTS - 5).unwrap();
    }
    let mut r = ring(&m, NetRate::default(), t);
    let (a, mut va) = tso(40 * 1448, 1448, 7);
    va.flags = vnet_flags::NEEDS_CSUM | 0x80;
    let small = frame([10, 9, 0, 1], 9, 60);
    let dv = VnetHdr { flags: vnet_flags::DATA_VALID, ..Default::default() };
    let huge = vec![0u8; MAX_CHAIN as usize * SLOT_SIZE as usize + 1];
    let mut frames = [(va, a.clone()), (VnetHdr::default(), huge), (dv, small.clone())].into_iter();
    let rx = fill(&mut r, &mut m, t, &mut frames).unwrap();
    assert_eq!(rx.got, 2, "the frame longer than a chain is dropped");
    assert_eq!(r.stats().rx_dropped, 1);
    let (d, f) = rx_frame(&m, SLOTS - 5);
    // Flags the ABI does not define are not passed on.
    assert_eq!(d, SlotDesc { len: a.len() as u32, vnet: VnetHdr { flags: vnet_flags::NEEDS_CSUM, ..va }, reserved: 0 });
    assert_eq!(f, a);
    let next = (SLOTS - 5).wrapping_add(slots_for(a.len() as u32));
    assert_eq!(rx_frame(&m, next), (SlotDesc { len: 60, vnet: dv, reserved: 0 }, small));
    assert_eq!(m.load_u32(hdr::RX_PROD), Ok(next.wrapping_add(1)));
    assert_eq!(r.stats().rx_segments, 40 + 1);
}

#[test]
fn rx_frames_longer_than_max_frame_are_paid_for() {
    // Found by the nic_ring fuzz target: the RX budget was checked for
    // MAX_FRAME bytes and then charged with the frame's length; a
    // longer frame (up to a slot) was refused the charge and went free,
    // so a host sending such frames passed any frame limit.
    let (mut m, t) = (ByteRegion::region(), Instant::now());
    // 40 KiB/s (a burst of 4096 bytes) and 100 frames/s (a burst of 10).
    let rate = NetRate { tx: Rate::default(), rx: Rate { bytes: 40960, ops: 100 } };
    let mut r = ring(&m, rate, t);
    let mut sizes = [2048usize, 500].into_iter().chain(std::iter::repeat(SLOT_SIZE as usize));
    let rx = r.fill_rx(&mut m, t, |_, _| Some((VnetHdr::default(), sizes.next()?))).unwrap();
    assert_eq!(rx.got, 2, "the byte budget allows 2048 + 500 bytes, then waits");
    assert!(rx.wait.is_some() && !rx.full);
    // Only frames: the burst of 10 and no more.
    let rate = NetRate { tx: Rate::default(), rx: Rate { bytes: 0, ops: 100 } };
    let mut r = ring(&m, rate, t);
    let rx = r.fill_rx(&mut m, t, |_, _| Some((VnetHdr::default(), SLOT_SIZE as usize))).unwrap();
    assert_eq!(rx.got, 10);
    // A super-frame of the host counts as its segments: 100 frames/s
    // take one of 45, then wait for its debt.
    let mut m = ByteRegion::region();
    let mut r = ring(&m, rate, t);
    let (a, va) = tso(45 * 1448, 1448, 1);
    let rx = fill(&mut r, &mut m, t, &mut std::iter::repeat((va, a))).unwrap();
    assert_eq!(rx.got, 1);
    assert_eq!(rx.wait, Some(Duration::from_millis(360)));
}

#[test]
fn budgets_hold_frames_back_until_their_time() {
    let (mut m, t) = (ByteRegion::region(), Instant::now());
    // 20 frames/s: a burst of 2, then one every 50 ms.
    let rate = NetRate { tx: Rate { bytes: 0, ops: 20 }, rx: Rate { bytes: 0, ops: 20 } };
    let mut r = ring(&m, rate, t);
    for i in 0..5 {
        queue(&mut m, &frame(IP, i, 100));
    }
    let (tx, sent) = drain(&mut r, &mut m, t);
    assert_eq!(sent.len(), 2);
    assert_eq!(tx.unwrap(), Tx { taken: 2, wait: Some(Duration::from_millis(50)) });
    let (tx, _) = drain(&mut r, &mut m, t + Duration::from_millis(49));
    assert_eq!(tx.unwrap().taken, 0);
    let (tx, _) = drain(&mut r, &mut m, t + Duration::from_millis(50));
    assert_eq!(tx.unwrap().taken, 1);
    // A clock going backwards adds nothing.
    assert_eq!(drain(&mut r, &mut m, t).0.unwrap().taken, 0);
    // RX: the burst, then the budget's wait; frames stay with the host.
    let mut offered = 0;
    let rx = r
        .fill_rx(&mut m, t, |_, _| {
            offered += 1;
            Some((VnetHdr::default(), 60))
        })
        .unwrap();
    assert_eq!((rx.got, offered), (2, 2));
    assert_eq!(rx.wait, Some(Duration::from_millis(50)));
}
