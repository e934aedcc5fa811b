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
/// host for its checksum (its headers, `head`, are changed), any other
/// goes as it is (smoltcp computed its checksums).
pub fn single(head: &mut [u8]) -> VnetHdr {
    match parse(head) {
        Some(seg) => ask_checksum(head, &seg, head.len() - ETH - seg.ip_hl),
        None => VnetHdr::default(),
    }
}

/// The super-frame being built.
#[derive(Clone, Copy, Debug)]
pub struct Open {
    /// Its first segment's headers.
    first: Seg,
    head: [u8; HEAD_MAX],
    /// Bytes so far.
    pub len: usize,
    segs: u32,
    next_seq: u32,
    /// Nothing more may join (a short segment or PSH came).
    closed: bool,
    psh: bool,
}

impl Open {
    /// Segments in it.
    pub fn segs(&self) -> u32 {
        self.segs
    }

    /// Finish it: `head` is its first `hdrs` bytes (in the ring), where
    /// the IPv4 length and checksum, PSH and the pseudo-header sum are
    /// set; returns its virtio-net header.
    pub fn finish(&self, head: &mut [u8]) -> VnetHdr {
        let s = self.first;
        if self.segs == 1 {
            return ask_checksum(head, &s, self.len - ETH - s.ip_hl);
        }
        let ip = &mut head[ETH..ETH + s.ip_hl];
        ip[2..4].copy_from_slice(&((self.len - ETH) as u16).to_be_bytes());
        ip[10..12].fill(0);
        let c = ipv4_checksum(ip);
        ip[10..12].copy_from_slice(&c.to_be_bytes());
        if self.psh {
            head[ETH + s.ip_hl + 13] |= PSH;
        }
        let v = ask_checksum(head, &s, self.len - ETH - s.ip_hl);
        VnetHdr { gso_type: gso::TCPV4, hdr_len: s.hdrs as u16, gso_size: s.payload as u16, ..v }
    }

    /// Whether `frame` (`seg`) continues this super-frame.
    fn continued_by(&self, frame: &[u8], seg: &Seg) -> bool {
        let s = &self.first;
        if self.closed
            || seg.hdrs != s.hdrs
            || seg.seq != self.next_seq
            || seg.payload == 0
            || seg.payload > s.payload
            || self.len + seg.payload > MAX_GSO_FRAME as usize
            || self.segs >= MAX_GSO_SEGS
        {
            return false;
        }
        // The same headers but for what differs between segments.
        let (ip, l4) = (ETH, ETH + s.ip_hl);
        let same = |a: usize, b: usize| frame[a..b] == self.head[a..b];
        same(0, ip + 2)
            && same(ip + 6, ip + 10)
            && same(ip + 12, l4 + 4)
            && same(l4 + 8, l4 + 13)
            && (frame[l4 + 13] & !PSH) == (self.head[l4 + 13] & !PSH)
            && same(l4 + 14, l4 + 16)
            && same(l4 + 18, s.hdrs)
    }
}

/// What to do with a frame smoltcp built.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Offer {
    /// Copy its payload (`frame[from..]`) to the open super-frame at byte
    /// `at`.
    Append {
        /// Where its payload starts.
        from: usize,
        /// Where it goes in the super-frame.
        at: usize,
    },
    /// Finish and publish the open super-frame (if any, [`Coalescer::take`]),
    /// then put this frame at the start of a new chain: as the new open
    /// super-frame if `open`, else alone (finished with [`single`]).
    New {
        /// It opens a super-frame.
        open: bool,
    },
}

/// Coalesces a poll's segments.
#[derive(Debug, Default)]
pub struct Coalescer {
    open: Option<Open>,
}

impl Coalescer {
    /// Decide for `frame`; with [`Offer::New`] the caller takes the open
    /// frame first.
    pub fn offer(&mut self, frame: &[u8]) -> Offer {
        let Some(seg) = parse(frame) else { return Offer::New { open: false } };
        let data = seg.flags & ACK != 0 && seg.flags & (FIN | SYN | RST | URG) == 0 && seg.payload > 0;
        if let Some(o) = &mut self.open {
            if data && o.continued_by(frame, &seg) {
                let at = o.len;
                o.len += seg.payload;
                o.segs += 1;
                o.next_seq = seg.seq.wrapping_add(seg.payload as u32);
                o.psh |= seg.flags & PSH != 0;
                o.closed = seg.payload < o.first.payload || o.psh;
                return Offer::Append { from: seg.hdrs, at };
            }
        }
        // A new super-frame: a full data segment that may be followed.
        let open = data && seg.payload >= MIN_GSO_SIZE as usize && seg.flags & PSH == 0;
        Offer::New { open }
    }

    /// After [`Offer::New`]: the open super-frame to publish (if any); if
    /// the new frame opens one, it is `frame` from now on.
    pub fn take(&mut self, frame: &[u8], open: bool) -> Option<Open> {
        let was = self.open.take();
        if open {
            if let Some(seg) = parse(frame) {
                let mut head = [0u8; HEAD_MAX];
                head[..seg.hdrs].copy_from_slice(&frame[..seg.hdrs]);
                let next_seq = seg.seq.wrapping_add(seg.payload as u32);
                self.open = Some(Open { first: seg, head, len: frame.len(), segs: 1, next_seq, closed: false, psh: false });
            }
        }
        was
    }

    /// The open super-frame, taken (to publish at the end of a poll).
    pub fn flush(&mut self) -> Option<Open> {
        self.open.take()
    }

    /// Whether a super-frame is open.
    pub fn is_open(&self) -> bool {
        self.open.is_some()
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
        let mut open: Option<Vec<u8>> = None;
        let publish = |o: Open, buf: Vec<u8>, out: &mut Vec<(VnetHdr, Vec<u8>)>| {
            let mut buf = buf;
            assert_eq!(buf.len(), o.len);
            let v = o.finish(&mut buf);
            out.push((v, buf));
        };
        for f in frames {
            match c.offer(f) {
                Offer::Append { from, at } => {
                    let b = open.as_mut().unwrap();
                    assert_eq!(b.len(), at);
                    b.extend_from_slice(&f[from..]);
                }
                Offer::New { open: o } => {
                    if let Some(was) = c.take(f, o) {
                        publish(was, open.take().unwrap(), &mut out);
                    }
                    if o {
                        open = Some(f.clone());
                    } else {
                        let mut b = f.clone();
                        let v = single(&mut b);
                        out.push((v, b));
                    }
                }
            }
        }
        if let Some(o) = c.flush() {
            publish(o, open.take().unwrap(), &mut out);
        }
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
            assert_eq!(out[0].0.gso_type, gso::NONE, "{why}: one segment goes as a plain frame");
            assert_eq!(segment(&out[0].0, &out[0].1), [with_checksum(&a)], "{why}");
        }
        // After a short segment or PSH, nothing joins; a new one opens.
        let out = run(&[seg(1, 1000, ACK), seg(1001, 500, ACK), seg(1501, 1000, ACK), seg(2501, 1000, ACK)]);
        assert_eq!(out.iter().map(|(v, f)| (v.gso_type, f.len())).collect::<Vec<_>>(), [(1, 54 + 1500), (1, 54 + 2000)]);
        let out = run(&[seg(1, 1000, ACK | PSH), seg(1001, 1000, ACK)]);
        assert_eq!(out.len(), 2, "a segment with PSH goes alone");
        // Not TCP, or not data: alone, untouched but for the checksum request.
        let mut udp = seg(1, 100, ACK);
        udp[ETH + 9] = 17;
        let out = run(&[seg(1, 1000, ACK), udp.clone(), seg(1001, 1000, ACK)]);
        assert_eq!(out[1], (VnetHdr::default(), udp));
        assert_eq!(out.len(), 3);
        let out = run(&[seg(1, 0, ACK)]);
        assert_eq!(out[0].0, VnetHdr { flags: 1, csum_start: 34, csum_offset: 16, ..Default::default() });
        assert!(verify(&segment(&out[0].0, &out[0].1)[0]));
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
