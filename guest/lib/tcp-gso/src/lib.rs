//! The library OS's thin offload layer between smoltcp and the NIC's rings
//! (`wisp_abi::net`). smoltcp (0.14, `segmentation-offload`) builds TCP
//! segments of up to 64 KiB and names the segment size the host must cut
//! them into (TSO); this layer writes what the host needs for that — the
//! virtio-net header (`gso_type` TCPV4, `gso_size`, `hdr_len`) and the
//! pseudo-header sum in the TCP checksum field (NEEDS_CSUM: the host
//! completes each segment's checksum) — and cuts itself what the host
//! would refuse under the ABI's bounds (more than [`MAX_GSO_SEGS`]
//! segments, a segment size below [`MIN_GSO_SIZE`]: a peer with a small
//! MSS). What smoltcp would have sent segment by segment is what leaves
//! the host. A crate of its own (`no_std`, no wisp-libos) so that `make
//! test` tests it on the host.
#![cfg_attr(not(test), no_std)]

use wisp_abi::net::{gso, vnet_flags, VnetHdr, MAX_GSO_SEGS, MIN_GSO_SIZE};

/// Ethernet header bytes.
pub const ETH: usize = 14;
/// The longest headers kept for comparison (Ethernet, IPv4, TCP, options).
const HEAD_MAX: usize = ETH + 60 + 60;

const TCP: u8 = 6;
const FIN: u8 = 0x01;
const PSH: u8 = 0x08;
#[cfg(test)]
const ACK: u8 = 0x10;

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

/// How a TCP/IPv4 frame smoltcp built goes to the host as it is: its
/// virtio-net header (the frame's TCP checksum field gets the
/// pseudo-header sum) — with `size` (smoltcp's segment size for it, if it
/// is larger than one segment) the host cuts it (TSO) — or `Err(())` if
/// the host would refuse that cut: too many segments, or segments too
/// small ([`split`] sends it instead). Frames that are not TCP/IPv4 go as
/// they are (smoltcp computed their checksums).
#[allow(clippy::result_unit_err)]
pub fn offload(frame: &mut [u8], size: Option<u16>) -> Result<VnetHdr, ()> {
    let Some(seg) = parse(frame) else { return Ok(VnetHdr::default()) };
    let tcp_len = frame.len() - ETH - seg.ip_hl;
    let Some(size) = size.filter(|&n| seg.payload > n as usize) else {
        return Ok(ask_checksum(frame, &seg, tcp_len));
    };
    if size < MIN_GSO_SIZE as u16 || seg.payload.div_ceil(size as usize) > MAX_GSO_SEGS as usize {
        return Err(());
    }
    let v = ask_checksum(frame, &seg, tcp_len);
    Ok(VnetHdr { gso_type: gso::TCPV4, hdr_len: seg.hdrs as u16, gso_size: size, ..v })
}

/// Send a TCP/IPv4 super-segment that [`offload`] refused, in pieces the
/// host takes: super-segments of at most [`MAX_GSO_SEGS`] segments of
/// `size`; or, below [`MIN_GSO_SIZE`], single segments — at most
/// [`MAX_GSO_SEGS`] of them, the rest dropped for TCP to send again (a
/// peer asking for segments that small gets slow service, not a NIC the
/// monitor stops). Each piece goes to `out` as its headers, its payload
/// and its virtio-net header; PSH and FIN stay on the last. Returns the
/// pieces' count.
pub fn split(frame: &[u8], size: u16, mut out: impl FnMut(&[u8], &[u8], VnetHdr)) -> usize {
    let Some(seg) = parse(frame) else { return 0 };
    let size = (size as usize).max(1);
    let (per, most) = if size >= MIN_GSO_SIZE as usize {
        (size * MAX_GSO_SEGS as usize, usize::MAX)
    } else {
        (size, MAX_GSO_SEGS as usize)
    };
    let payload = &frame[seg.hdrs..];
    let n = payload.len().div_ceil(per).min(most);
    let mut head = [0u8; HEAD_MAX];
    let (ip, l4) = (ETH, ETH + seg.ip_hl);
    for (i, piece) in payload.chunks(per).take(n).enumerate() {
        let h = &mut head[..seg.hdrs];
        h.copy_from_slice(&frame[..seg.hdrs]);
        let tot = (seg.hdrs - ETH + piece.len()) as u16;
        h[ip + 2..ip + 4].copy_from_slice(&tot.to_be_bytes());
        h[ip + 10..ip + 12].fill(0);
        let c = ipv4_checksum(&h[ip..l4]);
        h[ip + 10..ip + 12].copy_from_slice(&c.to_be_bytes());
        h[l4 + 4..l4 + 8].copy_from_slice(&seg.seq.wrapping_add((i * per) as u32).to_be_bytes());
        if i + 1 < payload.len().div_ceil(per) {
            h[l4 + 13] &= !(PSH | FIN);
        }
        let this = Seg { payload: piece.len(), seq: seg.seq.wrapping_add((i * per) as u32), flags: h[l4 + 13], ..seg };
        let v = ask_checksum(h, &this, seg.hdrs - ETH - seg.ip_hl + piece.len());
        let v = if piece.len() > size { VnetHdr { gso_type: gso::TCPV4, hdr_len: seg.hdrs as u16, gso_size: size as u16, ..v } } else { v };
        out(h, piece, v);
    }
    n
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

    /// What the host makes of a frame: its segments (Linux's
    /// tcp_gso_segment, simplified: seq, length, PSH and FIN on the last,
    /// checksums), after checking the ABI's bounds as the monitor does.
    fn segment(v: &VnetHdr, f: &[u8]) -> Vec<Vec<u8>> {
        let s = parse(f).unwrap();
        if v.gso_type == gso::NONE {
            let mut g = f.to_vec();
            let c = complete(&g, &s);
            g[ETH + s.ip_hl + 16..ETH + s.ip_hl + 18].copy_from_slice(&c.to_be_bytes());
            return vec![g];
        }
        let size = v.gso_size as usize;
        assert!(size >= MIN_GSO_SIZE as usize && v.hdr_len as usize == s.hdrs, "{v:?}");
        let chunks: Vec<&[u8]> = f[s.hdrs..].chunks(size).collect();
        let n = chunks.len();
        assert!(n <= MAX_GSO_SEGS as usize, "{n} segments");
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

    /// The segments a stack without offloads would have sent for
    /// `payload` bytes at `seq` in segments of `size`, PSH on the last.
    fn expected(seq: u32, payload: usize, size: usize, flags: u8) -> Vec<Vec<u8>> {
        let n = payload.div_ceil(size);
        (0..n)
            .map(|i| {
                let len = size.min(payload - i * size);
                let f = if i + 1 == n { flags } else { flags & !(PSH | FIN) };
                with_checksum(&seg(seq + (i * size) as u32, len, f))
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
    fn a_super_segment_is_what_the_host_cuts_back_into_smoltcps_segments() {
        let mut f = seg(1000, 44 * 1460 + 700, ACK | PSH);
        let v = offload(&mut f, Some(1460)).unwrap();
        assert_eq!(v, VnetHdr { flags: 1, gso_type: gso::TCPV4, hdr_len: 54, gso_size: 1460, csum_start: 34, csum_offset: 16 });
        let back = segment(&v, &f);
        assert_eq!(back, expected(1000, 44 * 1460 + 700, 1460, ACK | PSH));
        assert!(back.iter().all(|b| verify(b)));
    }

    #[test]
    fn one_segment_goes_alone_with_its_checksum_left_to_the_host() {
        for (payload, size) in [(100, None), (1460, Some(1460)), (0, None), (0, Some(1460))] {
            let mut f = seg(7, payload, ACK | PSH);
            let v = offload(&mut f, size).unwrap();
            assert_eq!(v, VnetHdr { flags: 1, csum_start: 34, csum_offset: 16, ..Default::default() }, "{payload} {size:?}");
            assert_eq!(segment(&v, &f), [with_checksum(&seg(7, payload, ACK | PSH))]);
        }
        // Not TCP: untouched, no header.
        let mut udp = seg(1, 100, ACK);
        udp[ETH + 9] = 17;
        let before = udp.clone();
        assert_eq!(offload(&mut udp, Some(1460)), Ok(VnetHdr::default()));
        assert_eq!(udp, before);
    }

    #[test]
    fn what_the_host_would_refuse_is_split_into_pieces_it_takes() {
        // A peer without an MSS option (536): 123 segments, over 64.
        let f = seg(5, 65_000, ACK | PSH);
        assert_eq!(offload(&mut f.clone(), Some(536)), Err(()));
        let mut back = Vec::new();
        let n = split(&f, 536, |h, p, v| {
            let mut g = h.to_vec();
            g.extend_from_slice(p);
            back.extend(segment(&v, &g));
        });
        assert_eq!(n, 2);
        assert_eq!(back, expected(5, 65_000, 536, ACK | PSH));
        // A FIN stays on the last piece only.
        let f = seg(5, 40_000, ACK | FIN);
        let mut back = Vec::new();
        split(&f, 536, |h, p, v| {
            let mut g = h.to_vec();
            g.extend_from_slice(p);
            back.extend(segment(&v, &g));
        });
        assert_eq!(back, expected(5, 40_000, 536, ACK | FIN));
        // Segments below the ABI's minimum: single segments, 64 at most
        // (TCP sends the rest again).
        let f = seg(9, 10_000, ACK | PSH);
        assert_eq!(offload(&mut f.clone(), Some(36)), Err(()));
        let mut back = Vec::new();
        let n = split(&f, 36, |h, p, v| {
            assert_eq!(v.gso_type, gso::NONE);
            let mut g = h.to_vec();
            g.extend_from_slice(p);
            back.extend(segment(&v, &g));
        });
        assert_eq!(n, MAX_GSO_SEGS as usize);
        assert_eq!(back, expected(9, 10_000, 36, ACK | PSH)[..MAX_GSO_SEGS as usize]);
    }
}
