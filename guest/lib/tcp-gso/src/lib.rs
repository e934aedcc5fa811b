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
use wisp_abi::net::{gso, slots_for, vnet_flags, VnetHdr, MAX_GSO_FRAME, MAX_GSO_SEGS, MIN_GSO_SIZE};

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

/// A frame of the batch: where it lies in the arena, and what it is.
#[derive(Clone, Copy, Debug)]
struct Held {
    off: usize,
    len: usize,
    /// Its layout if it is TCP/IPv4.
    seg: Option<Seg>,
    /// The next frame of its flow ([`NONE`]: the last).
    next: u32,
}

const NONE: u32 = u32::MAX;

/// A flow of the batch and its frames, in their order.
#[derive(Clone, Copy, Debug)]
struct Flow {
    /// Addresses and ports of a TCP/IPv4 flow; `None` gathers every other
    /// frame (ARP, UDP, ICMP...), which goes alone, in its order.
    key: Option<[u8; 12]>,
    first: u32,
    last: u32,
}

/// The super-frame being built while a flow's frames are walked.
#[derive(Clone, Copy, Debug)]
struct Open {
    /// The held frame it starts with, and that frame's layout.
    first: usize,
    seg: Seg,
    /// Bytes so far (headers and payloads).
    len: usize,
    segs: u32,
    next_seq: u32,
    /// Nothing more may join (a short segment or PSH came).
    closed: bool,
    psh: bool,
}

/// One frame going out: `head`, then the `body` ranges of `arena` (the
/// payloads that follow the first segment's, for a super-frame).
#[derive(Debug)]
pub struct Out<'a> {
    pub head: &'a [u8],
    pub arena: &'a [u8],
    pub body: &'a [(usize, usize)],
    pub vnet: VnetHdr,
}

impl Out<'_> {
    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.head.len() + self.body.iter().map(|r| r.1).sum::<usize>()
    }

    /// Whether it is empty (never, for a frame the batch hands out).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Its bytes, piece by piece.
    pub fn pieces(&self) -> impl Iterator<Item = &[u8]> {
        core::iter::once(self.head).chain(self.body.iter().map(|&(o, l)| &self.arena[o..o + l]))
    }
}

/// The frames smoltcp builds during one poll, held in an arena of the
/// batch's own and handed out when the poll ends (or the arena or the ring
/// runs short): per flow, in the order the flows first appeared, each
/// flow's frames in their order, the consecutive data segments of a flow
/// coalesced into super-frames. smoltcp's egress sends one segment per
/// socket and round, so with many connections the segments of a flow lie
/// far apart in the order they were built: grouping them per flow over the
/// whole poll is what lets fifty 10 KB responses leave as fifty
/// super-frames rather than 350 segments. A frame is copied once, from the
/// arena to the ring.
#[derive(Debug)]
pub struct Batch {
    arena: Vec<u8>,
    used: usize,
    held: Vec<Held>,
    flows: Vec<Flow>,
    /// Ring slots its frames would take each alone.
    slots: u32,
    /// Scratch: a super-frame's payload ranges, and its patched headers.
    ranges: Vec<(usize, usize)>,
    head: [u8; HEAD_MAX],
}

impl Batch {
    /// A batch holding up to `arena` bytes of frames.
    pub fn new(arena: usize) -> Batch {
        Batch { arena: alloc::vec![0; arena], used: 0, held: Vec::new(), flows: Vec::new(), slots: 0, ranges: Vec::new(), head: [0; HEAD_MAX] }
    }

    /// Arena bytes free for the next frame.
    pub fn room(&self) -> usize {
        self.arena.len() - self.used
    }

    /// Ring slots the held frames would take if each went alone: what
    /// [`Batch::flush`] publishes takes at most this many (a super-frame is
    /// shorter than its segments together).
    pub fn slots(&self) -> u32 {
        self.slots
    }

    /// Whether no frame is held.
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// The arena's next `len` bytes, for a frame to be built in; `None` if
    /// they are not free (flush first).
    pub fn buffer(&mut self, len: usize) -> Option<&mut [u8]> {
        self.arena.get_mut(self.used..self.used + len)
    }

    /// Hold the `len`-byte frame just built in [`Batch::buffer`]`(len)`.
    pub fn commit(&mut self, len: usize) {
        let off = self.used;
        let frame = &self.arena[off..off + len];
        let seg = parse(frame);
        let key = seg.map(|s| {
            let mut k = [0u8; 12];
            k[..8].copy_from_slice(&frame[ETH + 12..ETH + 20]);
            k[8..].copy_from_slice(&frame[ETH + s.ip_hl..ETH + s.ip_hl + 4]);
            k
        });
        let me = self.held.len() as u32;
        self.held.push(Held { off, len, seg, next: NONE });
        self.used += len;
        self.slots += slots_for(len as u32);
        // Recent flows first: smoltcp's rounds revisit them in turn.
        match self.flows.iter().rposition(|f| f.key == key) {
            Some(i) => {
                let last = self.flows[i].last as usize;
                self.held[last].next = me;
                self.flows[i].last = me;
            }
            None => self.flows.push(Flow { key, first: me, last: me }),
        }
    }

    /// Hand every held frame to `out`, in the order described at
    /// [`Batch`], with its virtio-net header; the batch is empty after.
    pub fn flush(&mut self, mut out: impl FnMut(Out<'_>)) {
        let flows = core::mem::take(&mut self.flows);
        for f in &flows {
            let mut open: Option<Open> = None;
            let mut i = f.first;
            while i != NONE {
                let idx = i as usize;
                let h = self.held[idx];
                i = h.next;
                if let Some(o) = open.as_mut() {
                    if self.continues(o, &h) {
                        let seg = h.seg.expect("continues: a TCP segment");
                        self.ranges.push((h.off + seg.hdrs, seg.payload));
                        o.len += seg.payload;
                        o.segs += 1;
                        o.next_seq = seg.seq.wrapping_add(seg.payload as u32);
                        o.psh |= seg.flags & PSH != 0;
                        o.closed = seg.payload < o.seg.payload || o.psh;
                        continue;
                    }
                    // The flow's earlier data goes first.
                    self.finish(open.take().expect("open"), &mut out);
                }
                let Some(seg) = h.seg else {
                    out(Out { head: &self.arena[h.off..h.off + h.len], arena: &self.arena, body: &[], vnet: VnetHdr::default() });
                    continue;
                };
                if starts_super_frame(&seg) {
                    self.ranges.clear();
                    self.ranges.push((h.off + seg.hdrs, seg.payload));
                    open = Some(Open { first: idx, seg, len: h.len, segs: 1, next_seq: seg.seq.wrapping_add(seg.payload as u32), closed: false, psh: false });
                    continue;
                }
                let frame = &mut self.arena[h.off..h.off + h.len];
                let v = ask_checksum(frame, &seg, h.len - ETH - seg.ip_hl);
                out(Out { head: &self.arena[h.off..h.off + h.len], arena: &self.arena, body: &[], vnet: v });
            }
            if let Some(o) = open {
                self.finish(o, &mut out);
            }
        }
        self.flows = flows;
        self.flows.clear();
        self.held.clear();
        self.ranges.clear();
        self.used = 0;
        self.slots = 0;
    }

    /// Whether held frame `h` (of the same flow) continues super-frame `o`:
    /// the same headers but for what differs between segments.
    fn continues(&self, o: &Open, h: &Held) -> bool {
        let Some(seg) = h.seg else { return false };
        let s = &o.seg;
        let data = seg.flags & ACK != 0 && seg.flags & (FIN | SYN | RST | URG) == 0;
        if !data
            || o.closed
            || seg.hdrs != s.hdrs
            || seg.seq != o.next_seq
            || seg.payload == 0
            || seg.payload > s.payload
            || o.len + seg.payload > MAX_GSO_FRAME as usize
            || o.segs >= MAX_GSO_SEGS
        {
            return false;
        }
        let first = self.held[o.first];
        let (a, b) = (&self.arena[first.off..first.off + s.hdrs], &self.arena[h.off..h.off + s.hdrs]);
        let (ip, l4) = (ETH, ETH + s.ip_hl);
        let same = |x: usize, y: usize| a[x..y] == b[x..y];
        same(0, ip + 2)
            && same(ip + 6, ip + 10)
            && same(ip + 12, l4 + 4)
            && same(l4 + 8, l4 + 13)
            && (b[l4 + 13] & !PSH) == (a[l4 + 13] & !PSH)
            && same(l4 + 14, l4 + 16)
            && same(l4 + 18, s.hdrs)
    }

    /// Hand out super-frame `o` (IPv4 length and checksum, PSH, the
    /// pseudo-header sum in its headers); one segment goes as it is.
    fn finish(&mut self, o: Open, out: &mut impl FnMut(Out<'_>)) {
        let s = o.seg;
        let first = self.held[o.first];
        if o.segs == 1 {
            let frame = &mut self.arena[first.off..first.off + first.len];
            let v = ask_checksum(frame, &s, first.len - ETH - s.ip_hl);
            out(Out { head: &self.arena[first.off..first.off + first.len], arena: &self.arena, body: &[], vnet: v });
            self.ranges.clear();
            return;
        }
        let head = &mut self.head[..s.hdrs];
        head.copy_from_slice(&self.arena[first.off..first.off + s.hdrs]);
        let ip = &mut head[ETH..ETH + s.ip_hl];
        ip[2..4].copy_from_slice(&((o.len - ETH) as u16).to_be_bytes());
        ip[10..12].fill(0);
        let c = ipv4_checksum(ip);
        ip[10..12].copy_from_slice(&c.to_be_bytes());
        if o.psh {
            head[ETH + s.ip_hl + 13] |= PSH;
        }
        let v = ask_checksum(head, &s, o.len - ETH - s.ip_hl);
        let vnet = VnetHdr { gso_type: gso::TCPV4, hdr_len: s.hdrs as u16, gso_size: s.payload as u16, ..v };
        // The payloads: the first segment's, then the others'.
        out(Out { head: &self.head[..s.hdrs], arena: &self.arena, body: &self.ranges, vnet });
        self.ranges.clear();
    }
}

/// Whether a segment may start a super-frame: a full data segment that
/// may be followed (no PSH, FIN, SYN, RST, URG; not tiny).
fn starts_super_frame(seg: &Seg) -> bool {
    seg.flags & ACK != 0 && seg.flags & (FIN | SYN | RST | URG | PSH) == 0 && seg.payload >= MIN_GSO_SIZE as usize
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
        run_in(1 << 20, frames)
    }

    /// The same with an arena of `arena` bytes, flushed when full; checks
    /// that what a flush hands out takes no more ring slots than it said.
    fn run_in(arena: usize, frames: &[Vec<u8>]) -> Vec<(VnetHdr, Vec<u8>)> {
        let mut b = Batch::new(arena);
        let mut out: Vec<(VnetHdr, Vec<u8>)> = Vec::new();
        let mut flush = |b: &mut Batch, out: &mut Vec<(VnetHdr, Vec<u8>)>| {
            let (said, before) = (b.slots(), out.len());
            b.flush(|o| out.push((o.vnet, o.pieces().flatten().copied().collect())));
            let took: u32 = out[before..].iter().map(|(_, f)| slots_for(f.len() as u32)).sum();
            assert!(took <= said, "{took} slots published, {said} said");
            assert!(b.is_empty() && b.slots() == 0 && b.room() == arena);
        };
        for f in frames {
            if b.room() < f.len() {
                flush(&mut b, &mut out);
            }
            b.buffer(f.len()).unwrap().copy_from_slice(f);
            b.commit(f.len());
        }
        flush(&mut b, &mut out);
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
        assert!(out[1] == (VnetHdr::default(), udp));
        assert_eq!((out.len(), out[0].0.gso_type, out[0].1.len()), (2, gso::TCPV4, 2054));
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
        // Per stream in the order they first came: stream 0's data, then
        // its FIN; stream 1's data, then its ACK; streams 2 and 3.
        let shape: Vec<(u8, u8, usize)> = out.iter().map(|(v, f)| (port(f), v.gso_type, f.len())).collect();
        assert_eq!(shape, [(0, 1, 54 + 10_000), (0, 0, 54), (1, 1, 54 + 10_000), (1, 0, 54), (2, 1, 54 + 10_000), (3, 1, 54 + 10_000)]);
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
        // Fifty responses of seven segments, one segment per stream and
        // round: fifty super-frames.
        let mut frames = Vec::new();
        for r in 0..7u32 {
            for p in 0..50u8 {
                frames.push(flow(p, 1 + r * 1460, 1460, if r == 6 { ACK | PSH } else { ACK }));
            }
        }
        let out = run(&frames);
        let shape: Vec<(u8, u8, usize)> = out.iter().map(|(v, f)| (port(f), v.gso_type, f.len())).collect();
        assert_eq!(shape, (0..50u8).map(|p| (p, 1, 54 + 7 * 1460)).collect::<Vec<_>>());
        // An arena too small for a poll: flushed when full, every segment
        // still leaves once and in its order, in fewer frames than segments.
        let out = run_in(256 << 10, &frames);
        assert!(out.len() < frames.len() / 2, "{} frames", out.len());
        let mut seen = [0u32; 50];
        for (v, f) in &out {
            for b in segment(v, f) {
                let p = port(&b) as usize;
                let orig = frames.iter().filter(|g| port(g) as usize == p).nth(seen[p] as usize).unwrap();
                assert!(b == with_checksum(orig), "stream {p}, segment {}", seen[p]);
                seen[p] += 1;
            }
        }
        assert!(seen.iter().all(|&n| n == 7));
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
