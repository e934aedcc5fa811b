//! The library OS's thin offload layer between smoltcp and the NIC's rings
//! (`wisp_abi::net`): smoltcp stays the TCP/IP stack and emits MSS-sized
//! segments; this layer coalesces the consecutive segments of a flow that
//! one poll emits into a super-frame of up to 64 KiB, which the host cuts
//! back into those segments (TSO/GSO: `gso_type` TCPV4, `gso_size` = the
//! segments' payload), and leaves TCP checksums to the host (NEEDS_CSUM:
//! the checksum field holds the pseudo-header sum). What smoltcp would
//! have sent is what leaves the host: the same segments, byte for byte but
//! the IPv4 identification.
//!
//! A segment joins the open super-frame if it continues it: the same
//! headers (addresses, ports, ACK number, window, options, TTL...) but for
//! the sequence number (the next one), the IPv4 length, identification and
//! checksum and PSH; ACK set, no SYN/FIN/RST/URG; a payload of the first
//! segment's size, or less for the last one (after which nothing joins, as
//! after PSH); within [`MAX_GSO_FRAME`] bytes and [`MAX_GSO_SEGS`]
//! segments. A crate of its own (`no_std`, no wisp-libos) so that `make
//! test` tests it on the host.
#![cfg_attr(not(test), no_std)]

extern crate alloc;

use alloc::vec::Vec;
use wisp_abi::net::{gso, vnet_flags, VnetHdr, MAX_GSO_FRAME, MAX_GSO_SEGS, MIN_GSO_SIZE};

/// Ethernet header bytes.
pub const ETH: usize = 14;
/// The longest headers kept for comparison (Ethernet, IPv4, TCP, options).
const HEAD_MAX: usize = ETH + 60 + 60;

const TCP: u8 = 6;
const FIN: u8 = 0x01;
const SYN: u8 = 0x02;
const RST: u8 = 0x04;
const PSH: u8 = 0x08;
const ACK: u8 = 0x10;
const URG: u8 = 0x20;

/// A TCP/IPv4 frame's layout.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Seg {
    /// IPv4 header bytes.
    pub ip_hl: usize,
    /// Ethernet + IPv4 + TCP header bytes.
    pub hdrs: usize,
    /// Payload bytes.
    pub payload: usize,
    /// Sequence number.
    pub seq: u32,
    /// TCP flags.
    pub flags: u8,
}

/// The layout of `frame` if it is a whole TCP/IPv4 datagram (no fragment,
/// its IPv4 length the frame's).
pub fn parse(frame: &[u8]) -> Option<Seg> {
    if frame.len() < ETH + 20 + 20 || frame[12..14] != [0x08, 0x00] || frame[ETH] >> 4 != 4 {
        return None;
    }
    let ip_hl = (frame[ETH] & 0xf) as usize * 4;
    let tot = u16::from_be_bytes([frame[ETH + 2], frame[ETH + 3]]) as usize;
    let frag = u16::from_be_bytes([frame[ETH + 6], frame[ETH + 7]]) & 0x3fff;
    if ip_hl < 20 || frame[ETH + 9] != TCP || frag != 0 || ETH + tot != frame.len() || frame.len() < ETH + ip_hl + 20 {
        return None;
    }
    let l4 = ETH + ip_hl;
    let doff = (frame[l4 + 12] >> 4) as usize * 4;
    let hdrs = l4 + doff;
    if doff < 20 || hdrs > frame.len() || hdrs > HEAD_MAX {
        return None;
    }
    let seq = u32::from_be_bytes([frame[l4 + 4], frame[l4 + 5], frame[l4 + 6], frame[l4 + 7]]);
    Some(Seg { ip_hl, hdrs, payload: frame.len() - hdrs, seq, flags: frame[l4 + 13], })
}

/// The ones' complement sum of `data` (16-bit big-endian words), unfolded.
fn sum(data: &[u8], mut acc: u32) -> u32 {
    let mut words = data.chunks_exact(2);
    for w in &mut words {
        acc += u16::from_be_bytes([w[0], w[1]]) as u32;
    }
    if let [b] = words.remainder() {
        acc += (*b as u32) << 8;
    }
    acc
}

fn fold(mut acc: u32) -> u16 {
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    acc as u16
}

/// Fill in what the host needs to complete a TCP/IPv4 frame's checksum:
/// the pseudo-header sum (addresses, protocol, TCP length) in the checksum
/// field, folded and not complemented. Returns the header asking for it.
fn ask_checksum(head: &mut [u8], seg: &Seg, tcp_len: usize) -> VnetHdr {
    let l4 = ETH + seg.ip_hl;
    let acc = sum(&head[ETH + 12..ETH + 20], TCP as u32 + tcp_len as u32);
    head[l4 + 16..l4 + 18].copy_from_slice(&fold(acc).to_be_bytes());
    VnetHdr { flags: vnet_flags::NEEDS_CSUM, csum_start: l4 as u16, csum_offset: 16, ..Default::default() }
}

/// The IPv4 header checksum of `ip` (its checksum field counted as 0).
fn ipv4_checksum(ip: &[u8]) -> u16 {
    !fold(sum(&ip[..10], sum(&ip[12..], 0)))
}

/// A single frame smoltcp built, going alone: a TCP/IPv4 one asks the
/// host for its checksum (its headers, `frame`, are changed), any other
/// goes as it is (smoltcp computed its checksums).
pub fn single(frame: &mut [u8]) -> VnetHdr {
    match parse(frame) {
        Some(seg) => ask_checksum(frame, &seg, frame.len() - ETH - seg.ip_hl),
        None => VnetHdr::default(),
    }
}

/// Super-frames open at once (one per flow): smoltcp's egress sends one
/// segment per socket and round, so the segments of parallel streams
/// interleave.
pub const OPEN_MAX: usize = 4;

/// A super-frame being built, in a buffer of its own.
#[derive(Debug)]
struct Open {
    /// Its first segment's layout.
    first: Seg,
    /// The frame so far.
    buf: Vec<u8>,
    segs: u32,
    next_seq: u32,
    /// Nothing more may join (a short segment or PSH came).
    closed: bool,
    psh: bool,
    /// When it opened (for the oldest to go first when all are in use).
    age: u64,
}

impl Open {
    /// Whether `frame` belongs to the same flow (addresses and ports).
    fn same_flow(&self, frame: &[u8], seg: &Seg) -> bool {
        let l4 = ETH + seg.ip_hl;
        let ours = ETH + self.first.ip_hl;
        seg.ip_hl == self.first.ip_hl && frame[ETH + 12..ETH + 20] == self.buf[ETH + 12..ETH + 20] && frame[l4..l4 + 4] == self.buf[ours..ours + 4]
    }

    /// Finish it (IPv4 length and checksum, PSH, the pseudo-header sum)
    /// and hand it to `out` with its virtio-net header.
    fn finish(&mut self, out: &mut impl FnMut(&[u8], VnetHdr)) {
        let s = self.first;
        let len = self.buf.len();
        let head = &mut self.buf[..];
        if self.segs == 1 {
            let v = ask_checksum(head, &s, len - ETH - s.ip_hl);
            return out(&self.buf, v);
        }
        let ip = &mut head[ETH..ETH + s.ip_hl];
        ip[2..4].copy_from_slice(&((len - ETH) as u16).to_be_bytes());
        ip[10..12].fill(0);
        let c = ipv4_checksum(ip);
        ip[10..12].copy_from_slice(&c.to_be_bytes());
        if self.psh {
            head[ETH + s.ip_hl + 13] |= PSH;
        }
        let v = ask_checksum(head, &s, len - ETH - s.ip_hl);
        out(&self.buf, VnetHdr { gso_type: gso::TCPV4, hdr_len: s.hdrs as u16, gso_size: s.payload as u16, ..v });
    }

    /// Whether `frame` (`seg`, of the same flow) continues this super-frame.
    fn continued_by(&self, frame: &[u8], seg: &Seg) -> bool {
        let s = &self.first;
        if self.closed
            || seg.hdrs != s.hdrs
            || seg.seq != self.next_seq
            || seg.payload == 0
            || seg.payload > s.payload
            || self.buf.len() + seg.payload > MAX_GSO_FRAME as usize
            || self.segs >= MAX_GSO_SEGS
        {
            return false;
        }
        // The same headers but for what differs between segments.
        let (ip, l4) = (ETH, ETH + s.ip_hl);
        let same = |a: usize, b: usize| frame[a..b] == self.buf[a..b];
        same(0, ip + 2)
            && same(ip + 6, ip + 10)
            && same(ip + 12, l4 + 4)
            && same(l4 + 8, l4 + 13)
            && (frame[l4 + 13] & !PSH) == (self.buf[l4 + 13] & !PSH)
            && same(l4 + 14, l4 + 16)
            && same(l4 + 18, s.hdrs)
    }
}

/// Coalesces a poll's segments, up to [`OPEN_MAX`] flows at once.
#[derive(Debug, Default)]
pub struct Coalescer {
    open: [Option<Open>; OPEN_MAX],
    /// Buffers of finished super-frames, kept for the next ones.
    spare: Vec<Vec<u8>>,
    clock: u64,
}

impl Coalescer {
    /// Take a frame smoltcp built (`frame`, whose headers may be changed):
    /// it joins an open super-frame of its flow, opens one, or goes alone;
    /// every frame that is done, in the order it must leave (a flow's
    /// frames in their order), goes to `out` with its virtio-net header.
    /// At most [`OPEN_MAX`] + 1 frames go out per call.
    pub fn push(&mut self, frame: &mut [u8], mut out: impl FnMut(&[u8], VnetHdr)) {
        let Some(seg) = parse(frame) else { return out(frame, VnetHdr::default()) };
        let data = seg.flags & ACK != 0 && seg.flags & (FIN | SYN | RST | URG) == 0 && seg.payload > 0;
        let mine = self.open.iter().position(|o| o.as_ref().is_some_and(|o| o.same_flow(frame, &seg)));
        if let Some(i) = mine {
            let o = self.open[i].as_mut().expect("found above");
            if data && o.continued_by(frame, &seg) {
                o.buf.extend_from_slice(&frame[seg.hdrs..]);
                o.segs += 1;
                o.next_seq = seg.seq.wrapping_add(seg.payload as u32);
                o.psh |= seg.flags & PSH != 0;
                o.closed = seg.payload < o.first.payload || o.psh;
                return;
            }
            // The flow's earlier data goes first.
            self.close(i, &mut out);
        }
        // A new super-frame: a full data segment that may be followed.
        if !data || seg.payload < MIN_GSO_SIZE as usize || seg.flags & PSH != 0 {
            let v = ask_checksum(frame, &seg, frame.len() - ETH - seg.ip_hl);
            return out(frame, v);
        }
        let i = match self.open.iter().position(Option::is_none) {
            Some(i) => i,
            None => {
                let oldest = (0..OPEN_MAX).min_by_key(|&i| self.open[i].as_ref().map_or(0, |o| o.age)).unwrap_or(0);
                self.close(oldest, &mut out);
                oldest
            }
        };
        let mut buf = self.spare.pop().unwrap_or_default();
        buf.clear();
        buf.reserve(MAX_GSO_FRAME as usize);
        buf.extend_from_slice(frame);
        self.clock += 1;
        let next_seq = seg.seq.wrapping_add(seg.payload as u32);
        self.open[i] = Some(Open { first: seg, buf, segs: 1, next_seq, closed: false, psh: false, age: self.clock });
    }

    fn close(&mut self, i: usize, out: &mut impl FnMut(&[u8], VnetHdr)) {
        if let Some(mut o) = self.open[i].take() {
            o.finish(out);
            self.spare.push(o.buf);
        }
    }

    /// Hand every open super-frame to `out` (at the end of a poll).
    pub fn flush(&mut self, mut out: impl FnMut(&[u8], VnetHdr)) {
        let mut order: Vec<usize> = (0..OPEN_MAX).filter(|&i| self.open[i].is_some()).collect();
        order.sort_by_key(|&i| self.open[i].as_ref().map_or(0, |o| o.age));
        for i in order {
            self.close(i, &mut out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A TCP segment smoltcp would send: `payload` bytes at `seq`.
    fn seg(seq: u32, payload: usize, flags: u8) -> Vec<u8> {
        let mut f = vec![2, 0, 0, 0, 0, 1, 0x52, 0x54, 0, 9, 0, 2, 0x08, 0x00];
        let tot = (40 + payload) as u16;
        let mut ip = vec![0x45, 0, (tot >> 8) as u8, tot as u8, 0, 0, 0x40, 0, 64, 6, 0, 0, 10, 9, 0, 2, 10, 9, 0, 1];
        let c = ipv4_checksum(&ip);
        ip[10..12].copy_from_slice(&c.to_be_bytes());
        f.extend_from_slice(&ip);
        f.extend_from_slice(&[0x13, 0x89, 0xc0, 0x00]);
        f.extend_from_slice(&seq.to_be_bytes());
        f.extend_from_slice(&[0, 0, 0, 9, 0x50, flags, 0x10, 0x00, 0, 0, 0, 0]);
        f.extend((0..payload).map(|i| (seq as usize + i) as u8));
        f
    }

    /// The full TCP checksum of a TCP/IPv4 frame, as a host computes it
    /// from the pseudo-header sum in the field.
    fn complete(frame: &[u8], seg: &Seg) -> u16 {
        !fold(sum(&frame[ETH + seg.ip_hl..], 0))
    }

    /// The checksum a receiver verifies: over pseudo-header and segment.
    fn verify(frame: &[u8]) -> bool {
        let s = parse(frame).unwrap();
        let tcp_len = frame.len() - ETH - s.ip_hl;
        fold(sum(&frame[ETH + 12..ETH + 20], TCP as u32 + tcp_len as u32 + sum(&frame[ETH + s.ip_hl..], 0))) == 0xffff
    }

    /// Run `frames` through a coalescer as the NIC does; the frames that
    /// go out (header, bytes).
    fn run(frames: &[Vec<u8>]) -> Vec<(VnetHdr, Vec<u8>)> {
        let mut c = Coalescer::default();
        let mut out: Vec<(VnetHdr, Vec<u8>)> = Vec::new();
        for f in frames {
            let mut f = f.clone();
            let before = out.len();
            c.push(&mut f, |b, v| out.push((v, b.to_vec())));
            assert!(out.len() - before <= OPEN_MAX + 1);
        }
        c.flush(|b, v| out.push((v, b.to_vec())));
        out
    }

    /// What the host makes of a super-frame: its segments (Linux's
    /// tcp_gso_segment, simplified: seq, length, PSH on the last, checksums).
    fn segment(v: &VnetHdr, f: &[u8]) -> Vec<Vec<u8>> {
        let s = parse(f).unwrap();
        if v.gso_type == gso::NONE {
            let mut g = f.to_vec();
            let c = complete(&g, &s);
            g[ETH + s.ip_hl + 16..ETH + s.ip_hl + 18].copy_from_slice(&c.to_be_bytes());
            return vec![g];
        }
        let size = v.gso_size as usize;
        let chunks: Vec<&[u8]> = f[s.hdrs..].chunks(size).collect();
        let n = chunks.len();
        chunks
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let mut g = f[..s.hdrs].to_vec();
                g.extend_from_slice(c);
                let tot = (g.len() - ETH) as u16;
                g[ETH + 2..ETH + 4].copy_from_slice(&tot.to_be_bytes());
                g[ETH + 10..ETH + 12].fill(0);
                let ipc = ipv4_checksum(&g[ETH..ETH + s.ip_hl]);
                g[ETH + 10..ETH + 12].copy_from_slice(&ipc.to_be_bytes());
                let l4 = ETH + s.ip_hl;
                g[l4 + 4..l4 + 8].copy_from_slice(&s.seq.wrapping_add((i * size) as u32).to_be_bytes());
                if i + 1 < n {
                    g[l4 + 13] &= !(PSH | FIN);
                }
                let tcp_len = g.len() - l4;
                let acc = sum(&g[ETH + 12..ETH + 20], TCP as u32 + tcp_len as u32);
                g[l4 + 16..l4 + 18].copy_from_slice(&fold(acc).to_be_bytes());
                let c = complete(&g, &s);
                g[l4 + 16..l4 + 18].copy_from_slice(&c.to_be_bytes());
                g
            })
            .collect()
    }

    /// A frame with a full checksum, as smoltcp would have sent it.
    fn with_checksum(f: &[u8]) -> Vec<u8> {
        let mut g = f.to_vec();
        let s = parse(&g).unwrap();
        let l4 = ETH + s.ip_hl;
        let acc = sum(&g[ETH + 12..ETH + 20], TCP as u32 + (g.len() - l4) as u32);
        g[l4 + 16..l4 + 18].copy_from_slice(&fold(acc).to_be_bytes());
        let c = complete(&g, &s);
        g[l4 + 16..l4 + 18].copy_from_slice(&c.to_be_bytes());
        g
    }

    #[test]
    fn a_polls_segments_become_one_super_frame_that_the_host_cuts_back() {
        let mut frames: Vec<Vec<u8>> = (0..44).map(|i| seg(1000 + i * 1460, 1460, ACK)).collect();
        frames.push(seg(1000 + 44 * 1460, 700, ACK | PSH));
        let out = run(&frames);
        assert_eq!(out.len(), 1);
        let (v, f) = &out[0];
        assert_eq!(*v, VnetHdr { flags: 1, gso_type: gso::TCPV4, hdr_len: 54, gso_size: 1460, csum_start: 34, csum_offset: 16 });
        assert_eq!(f.len(), 54 + 44 * 1460 + 700);
        // The host's segments are smoltcp's, checksums and all.
        let back = segment(v, f);
        assert_eq!(back.len(), 45);
        for (b, orig) in back.iter().zip(&frames) {
            assert_eq!(b, &with_checksum(orig));
            assert!(verify(b));
        }
    }

    #[test]
    fn only_continuations_join() {
        let a = seg(1, 1000, ACK);
        let mut other_port = seg(1001, 1000, ACK);
        other_port[ETH + 20 + 1] ^= 1;
        let mut other_ack = seg(1001, 1000, ACK);
        other_ack[ETH + 20 + 11] ^= 1;
        let mut other_window = seg(1001, 1000, ACK);
        other_window[ETH + 20 + 15] ^= 1;
        for (b, why) in [
            (seg(1002, 1000, ACK), "a gap in the sequence"),
            (seg(1001, 1001, ACK), "a larger payload"),
            (seg(1001, 1000, ACK | FIN), "FIN"),
            (seg(1001, 1000, ACK | RST), "RST"),
            (seg(1001, 0, ACK), "no payload"),
            (other_port, "another flow"),
            (other_ack, "another ACK number"),
            (other_window, "another window"),
        ] {
            let out = run(&[a.clone(), b.clone()]);
            assert_eq!(out.len(), 2, "{why}");
            // (Another flow's frame may go first: `a` stays open.)
            let a_out = out.iter().find(|(_, f)| f[ETH + 21] == a[ETH + 21] && f[..ETH + 20] == a[..ETH + 20]).unwrap();
            assert_eq!(a_out.0.gso_type, gso::NONE, "{why}: one segment goes as a plain frame");
            assert!(segment(&a_out.0, &a_out.1) == [with_checksum(&a)], "{why}");
        }
        // After a short segment or PSH, nothing joins; a new one opens.
        let out = run(&[seg(1, 1000, ACK), seg(1001, 500, ACK), seg(1501, 1000, ACK), seg(2501, 1000, ACK)]);
        assert_eq!(out.iter().map(|(v, f)| (v.gso_type, f.len())).collect::<Vec<_>>(), [(1, 54 + 1500), (1, 54 + 2000)]);
        let out = run(&[seg(1, 1000, ACK | PSH), seg(1001, 1000, ACK)]);
        assert_eq!(out.len(), 2, "a segment with PSH goes alone");
        // Not TCP: at once and untouched, while the open super-frame of
        // another flow goes on.
        let mut udp = seg(1, 100, ACK);
        udp[ETH + 9] = 17;
        let out = run(&[seg(1, 1000, ACK), udp.clone(), seg(1001, 1000, ACK)]);
        assert!(out[0] == (VnetHdr::default(), udp));
        assert_eq!((out.len(), out[1].0.gso_type, out[1].1.len()), (2, gso::TCPV4, 2054));
        let out = run(&[seg(1, 0, ACK)]);
        assert_eq!(out[0].0, VnetHdr { flags: 1, csum_start: 34, csum_offset: 16, ..Default::default() });
        assert!(verify(&segment(&out[0].0, &out[0].1)[0]));
    }

    #[test]
    fn interleaved_flows_each_coalesce_in_order() {
        // Four streams, one segment each per round, as smoltcp's egress
        // sends them; then a pure ACK of stream 1 and stream 0's FIN.
        let flow = |port: u8, seq: u32, len: usize, flags: u8| {
            let mut f = seg(seq, len, flags);
            f[ETH + 20 + 1] = port;
            f
        };
        let mut frames = Vec::new();
        for r in 0..10u32 {
            for p in 0..4u8 {
                frames.push(flow(p, 1 + r * 1000, 1000, ACK));
            }
        }
        frames.push(flow(1, 10_001, 0, ACK));
        frames.push(flow(0, 10_001, 0, ACK | FIN));
        let out = run(&frames);
        let port = |f: &Vec<u8>| f[ETH + 20 + 1];
        // Stream 1's data, then its ACK; stream 0's data, then its FIN;
        // streams 2 and 3 at the end of the poll.
        let shape: Vec<(u8, u8, usize)> = out.iter().map(|(v, f)| (port(f), v.gso_type, f.len())).collect();
        assert_eq!(shape, [(1, 1, 54 + 10_000), (1, 0, 54), (0, 1, 54 + 10_000), (0, 0, 54), (2, 1, 54 + 10_000), (3, 1, 54 + 10_000)]);
        let mut seen = [0usize; 4];
        for (v, f) in &out {
            for b in segment(v, f) {
                assert!(verify(&b));
                let p = port(&b) as usize;
                let orig = frames.iter().filter(|g| port(g) as usize == p).nth(seen[p]).unwrap();
                seen[p] += 1;
                assert!(b == with_checksum(orig), "stream {p}, segment {}", seen[p]);
            }
        }
        assert_eq!(seen, [11, 11, 10, 10]);
        // A fifth flow closes the oldest.
        let mut frames: Vec<Vec<u8>> = (0..5u8).map(|p| flow(p, 1, 1000, ACK)).collect();
        frames.push(flow(4, 1001, 1000, ACK));
        let out = run(&frames);
        let shape: Vec<(u8, usize)> = out.iter().map(|(_, f)| (port(f), f.len())).collect();
        assert_eq!(shape, [(0, 1054), (1, 1054), (2, 1054), (3, 1054), (4, 2054)]);
    }

    #[test]
    fn super_frames_stay_within_the_abis_bounds() {
        // 64 KiB: 44 full segments of 1460 fill it (a 45th would pass 65,549 bytes).
        let frames: Vec<Vec<u8>> = (0..100).map(|i| seg(i * 1460, 1460, ACK)).collect();
        let out = run(&frames);
        assert!(out.iter().all(|(_, f)| f.len() <= MAX_GSO_FRAME as usize));
        assert_eq!(out[0].1.len(), 54 + 44 * 1460);
        let total: usize = out.iter().map(|(_, f)| f.len() - 54).sum();
        assert_eq!(total, 100 * 1460);
        // Small segments: at most MAX_GSO_SEGS of them.
        let frames: Vec<Vec<u8>> = (0..100).map(|i| seg(i * 100, 100, ACK)).collect();
        let out = run(&frames);
        assert_eq!(out[0].1.len(), 54 + MAX_GSO_SEGS as usize * 100);
        // Below MIN_GSO_SIZE nothing opens.
        let frames: Vec<Vec<u8>> = (0..3).map(|i| seg(i * 10, 10, ACK)).collect();
        assert_eq!(run(&frames).len(), 3);
    }
}
