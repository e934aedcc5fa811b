//! The checks of a TX frame's virtio-net header: the guest wrote it, so
//! the monitor decides from its own copy of the descriptor and of the
//! frame's headers, and writes a header of its own to the tap, rebuilt
//! from the fields it checked — never the guest's bytes.
//!
//! Rules (`docs/abi.md`, "NIC"): only NEEDS_CSUM among the flags, only
//! the offloads the tap has ([`offload`] bits), unused fields zero; a
//! checksum request points at the TCP or UDP checksum of an IPv4
//! datagram that is no fragment; a TCP/IPv4 super-frame (gso TCPV4) asks
//! for its checksum, says its headers' length, has a `gso_size` a segment
//! of which fits the MTU, at most [`MAX_GSO_SEGS`] segments, and an IPv4
//! total length that is the frame's. A frame without GSO is at most
//! [`MAX_FRAME`] bytes. A header that breaks a rule stops the NIC.

use wisp_abi::net::{gso, offload, vnet_flags, SlotDesc, VnetHdr, MAX_FRAME, MAX_GSO_SEGS, MIN_GSO_SIZE, MTU};

/// Ethernet header bytes.
const ETH: usize = 14;
const IPPROTO_TCP: u8 = 6;
const IPPROTO_UDP: u8 = 17;

/// The longest headers a TX frame may carry (Ethernet, IPv4 and TCP with
/// all their options): what the monitor copies and decides on.
pub const HEAD_MAX: usize = ETH + 60 + 60;

/// What the monitor sends for a checked frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TxPlan {
    /// The monitor's own header for the tap.
    pub vnet: VnetHdr,
    /// Segments the frame stands for on the wire (1 without GSO).
    pub segs: u32,
    /// Bytes on the wire once segmented (headers repeated per segment).
    pub wire_bytes: u64,
}

/// An IPv4 datagram's L4 part, as far as a checksum request needs it.
struct L4 {
    /// Offset of the L4 header in the frame.
    start: usize,
    proto: u8,
}

/// The IPv4 header of `head` (the frame's first bytes, at most
/// [`HEAD_MAX`]) for a frame of `len` bytes: where its L4 header starts.
fn ipv4_l4(head: &[u8], len: usize) -> Result<L4, String> {
    if head.len() < ETH + 20 || head[12..14] != [0x08, 0x00] {
        return Err("a checksum or GSO request on a frame that is not IPv4".into());
    }
    let (ver, ihl) = (head[ETH] >> 4, (head[ETH] & 0xf) as usize * 4);
    if ver != 4 || ihl < 20 || head.len() < ETH + ihl {
        return Err(format!("an IPv4 header of version {ver}, {ihl} bytes, in a {len}-byte frame"));
    }
    let frag = u16::from_be_bytes([head[ETH + 6], head[ETH + 7]]);
    if frag & 0x3fff != 0 {
        return Err("a checksum or GSO request on an IPv4 fragment".into());
    }
    Ok(L4 { start: ETH + ihl, proto: head[ETH + 9] })
}

/// Check the descriptor `d` of a TX frame whose first bytes (a private
/// copy, `min(len, HEAD_MAX)` of them) are `head`, on a NIC with
/// `offloads`; say how to send it.
pub fn tx(d: &SlotDesc, head: &[u8], offloads: u64) -> Result<TxPlan, String> {
    let v = d.vnet;
    let len = d.len as usize;
    if v.flags & !vnet_flags::NEEDS_CSUM != 0 {
        return Err(format!("header flags {:#x}: only NEEDS_CSUM (1) may be set on TX", v.flags));
    }
    let csum = v.flags & vnet_flags::NEEDS_CSUM != 0;
    if csum && offloads & offload::CSUM == 0 {
        return Err("NEEDS_CSUM, and this NIC has no checksum offload".into());
    }
    match v.gso_type {
        gso::NONE => {}
        gso::TCPV4 if offloads & offload::TSO4 != 0 => return tso4(&v, head, len),
        t => return Err(format!("gso_type {t:#x} is not an offload of this NIC")),
    }
    if len > MAX_FRAME as usize {
        return Err(format!("a {len}-byte frame without GSO ({MAX_FRAME} bytes at most)"));
    }
    if v.hdr_len != 0 || v.gso_size != 0 {
        return Err(format!("hdr_len {} and gso_size {} on a frame without GSO (0 expected)", v.hdr_len, v.gso_size));
    }
    if !csum {
        if v.csum_start != 0 || v.csum_offset != 0 {
            return Err(format!("csum_start {} and csum_offset {} without NEEDS_CSUM (0 expected)", v.csum_start, v.csum_offset));
        }
        return Ok(TxPlan { vnet: VnetHdr::default(), segs: 1, wire_bytes: len as u64 });
    }
    let (start, offset) = csum_place(&v, head, len)?;
    let vnet = VnetHdr { flags: vnet_flags::NEEDS_CSUM, csum_start: start, csum_offset: offset, ..Default::default() };
    Ok(TxPlan { vnet, segs: 1, wire_bytes: len as u64 })
}

/// Where the checksum goes: the guest's `csum_start`/`csum_offset` must be
/// the frame's TCP or UDP checksum, inside the frame.
fn csum_place(v: &VnetHdr, head: &[u8], len: usize) -> Result<(u16, u16), String> {
    let l4 = ipv4_l4(head, len)?;
    let (offset, l4_min) = match l4.proto {
        IPPROTO_TCP => (16, 20),
        IPPROTO_UDP => (6, 8),
        p => return Err(format!("a checksum request for IP protocol {p} (only TCP and UDP)")),
    };
    if v.csum_start as usize != l4.start || v.csum_offset != offset {
        return Err(format!(
            "csum_start {} / csum_offset {}: the frame's checksum is at {} / {offset}",
            v.csum_start, v.csum_offset, l4.start
        ));
    }
    if l4.start + l4_min > len {
        return Err(format!("a {len}-byte frame ends inside its L4 header (at {})", l4.start));
    }
    Ok((l4.start as u16, offset))
}

/// A TCP/IPv4 super-frame.
fn tso4(v: &VnetHdr, head: &[u8], len: usize) -> Result<TxPlan, String> {
    if v.flags & vnet_flags::NEEDS_CSUM == 0 {
        return Err("gso TCPV4 without NEEDS_CSUM".into());
    }
    let (start, offset) = csum_place(v, head, len)?;
    let l4 = start as usize;
    if offset != 16 {
        return Err("gso TCPV4 on a frame that is not TCP".into());
    }
    let doff = (head[l4 + 12] >> 4) as usize * 4;
    let hdrs = l4 + doff;
    if doff < 20 || hdrs > head.len() {
        return Err(format!("a TCP header of {doff} bytes at {l4} in a {len}-byte frame"));
    }
    if v.hdr_len as usize != hdrs {
        return Err(format!("hdr_len {}: the frame's headers are {hdrs} bytes", v.hdr_len));
    }
    let tot_len = u16::from_be_bytes([head[ETH + 2], head[ETH + 3]]) as usize;
    if tot_len != len - ETH {
        return Err(format!("IPv4 total length {tot_len} in a {len}-byte super-frame ({} expected)", len - ETH));
    }
    let payload = len - hdrs;
    let most = MTU as usize - (hdrs - ETH);
    let size = v.gso_size as usize;
    if !(MIN_GSO_SIZE as usize..=most).contains(&size) {
        return Err(format!("gso_size {size}: {MIN_GSO_SIZE}..={most} for these headers and the MTU"));
    }
    if payload == 0 {
        return Err("a super-frame without payload".into());
    }
    let segs = payload.div_ceil(size);
    if segs > MAX_GSO_SEGS as usize {
        return Err(format!("{segs} segments of {size} bytes ({MAX_GSO_SEGS} at most)"));
    }
    let wire_bytes = (len + (segs - 1) * hdrs) as u64;
    let mut vnet = VnetHdr { flags: vnet_flags::NEEDS_CSUM, csum_start: start, csum_offset: offset, ..Default::default() };
    if segs > 1 {
        // One segment needs no segmentation: it goes as a plain frame.
        vnet.gso_type = gso::TCPV4;
        vnet.hdr_len = hdrs as u16;
        vnet.gso_size = size as u16;
    }
    Ok(TxPlan { vnet, segs: segs as u32, wire_bytes })
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: u64 = offload::CSUM | offload::TSO4;

    /// A TCP/IPv4 frame with `payload` bytes, total length set.
    fn tcp(payload: usize) -> Vec<u8> {
        let mut f = vec![0xff; 6];
        f.extend_from_slice(&[0x52, 0x54, 0, 9, 0, 2, 0x08, 0x00]);
        let tot = (20 + 20 + payload) as u16;
        f.extend_from_slice(&[0x45, 0, (tot >> 8) as u8, tot as u8, 0, 0, 0x40, 0, 64, 6, 0, 0, 10, 9, 0, 2, 10, 9, 0, 1]);
        f.extend_from_slice(&[0x13, 0x89, 0xc0, 0x00, 0, 0, 0, 1, 0, 0, 0, 1, 0x50, 0x10, 0xff, 0xff, 0, 0, 0, 0]);
        f.resize(f.len() + payload, 0xab);
        f
    }

    fn desc(len: usize, vnet: VnetHdr) -> SlotDesc {
        SlotDesc { len: len as u32, vnet, reserved: 0 }
    }

    fn check(f: &[u8], vnet: VnetHdr, offloads: u64) -> Result<TxPlan, String> {
        tx(&desc(f.len(), vnet), &f[..f.len().min(HEAD_MAX)], offloads)
    }

    fn gso4(size: u16) -> VnetHdr {
        VnetHdr { flags: 1, gso_type: gso::TCPV4, hdr_len: 54, gso_size: size, csum_start: 34, csum_offset: 16 }
    }

    #[test]
    fn the_abi_speaks_virtio() {
        use virtio_bindings::virtio_net as v;
        assert_eq!(vnet_flags::NEEDS_CSUM as u32, v::VIRTIO_NET_HDR_F_NEEDS_CSUM);
        assert_eq!(vnet_flags::DATA_VALID as u32, v::VIRTIO_NET_HDR_F_DATA_VALID);
        assert_eq!(gso::NONE as u32, v::VIRTIO_NET_HDR_GSO_NONE);
        assert_eq!(gso::TCPV4 as u32, v::VIRTIO_NET_HDR_GSO_TCPV4);
        assert_eq!(gso::UDP as u32, v::VIRTIO_NET_HDR_GSO_UDP);
        assert_eq!(gso::TCPV6 as u32, v::VIRTIO_NET_HDR_GSO_TCPV6);
        assert_eq!(gso::UDP_L4 as u32, v::VIRTIO_NET_HDR_GSO_UDP_L4);
        assert_eq!(gso::ECN as u32, v::VIRTIO_NET_HDR_GSO_ECN);
        assert_eq!(std::mem::size_of::<v::virtio_net_hdr>(), wisp_abi::net::VNET_HDR_SIZE);
    }

    #[test]
    fn good_headers_are_rebuilt_by_the_monitor() {
        // Plain.
        let p = check(&tcp(100), VnetHdr::default(), 0).unwrap();
        assert_eq!(p, TxPlan { vnet: VnetHdr::default(), segs: 1, wire_bytes: 154 });
        // A checksum request.
        let v = VnetHdr { flags: 1, csum_start: 34, csum_offset: 16, ..Default::default() };
        assert_eq!(check(&tcp(100), v, offload::CSUM).unwrap().vnet, v);
        // A super-frame of 45 segments of 1448 and a last one.
        let f = tcp(44 * 1448 + 1000);
        let p = check(&f, gso4(1448), ALL).unwrap();
        assert_eq!((p.vnet, p.segs), (gso4(1448), 45));
        assert_eq!(p.wire_bytes, f.len() as u64 + 44 * 54);
        // The largest: 65,549 bytes.
        let f = tcp(65535 - 40);
        assert_eq!(f.len(), 65549);
        assert_eq!(check(&f, gso4(1460), ALL).unwrap().segs, 45);
        // One segment only: sent as a plain frame with its checksum request.
        let p = check(&tcp(1000), gso4(1448), ALL).unwrap();
        assert_eq!(p.vnet, VnetHdr { flags: 1, csum_start: 34, csum_offset: 16, ..Default::default() });
        assert_eq!(p.segs, 1);
    }

    #[test]
    fn bogus_headers_are_refused() {
        let f = tcp(10 * 1448);
        let bad = |v: VnetHdr, offloads: u64, why: &str| {
            let e = check(&f, v, offloads).unwrap_err();
            assert!(e.contains(why), "{v:?}: {e}");
        };
        bad(VnetHdr { flags: 2, ..Default::default() }, ALL, "flags 0x2");
        bad(VnetHdr { flags: 0x81, ..gso4(1448) }, ALL, "flags 0x81");
        bad(gso4(1448), offload::CSUM, "gso_type 0x1 is not");
        for t in [gso::UDP, gso::TCPV6, gso::UDP_L4, gso::TCPV4 | gso::ECN, 0x7f] {
            bad(VnetHdr { gso_type: t, ..gso4(1448) }, ALL, "gso_type");
        }
        bad(VnetHdr { flags: 0, ..gso4(1448) }, ALL, "without NEEDS_CSUM");
        bad(VnetHdr { flags: 1, csum_start: 34, csum_offset: 16, ..Default::default() }, 0, "no checksum offload");
        // gso_size out of range: 0, below the minimum, over the MTU's segment.
        for size in [0, 1, 63, 1461, u16::MAX] {
            bad(gso4(size), ALL, "gso_size");
        }
        // Too many segments of a small size.
        bad(gso4(100), ALL, "segments of 100 bytes");
        // hdr_len not the headers'.
        for h in [0, 53, 55, 1000, u16::MAX] {
            bad(VnetHdr { hdr_len: h, ..gso4(1448) }, ALL, "hdr_len");
        }
        // csum_start / csum_offset elsewhere than the TCP checksum.
        for (s, o) in [(0, 0), (14, 10), (34, 6), (35, 16), (u16::MAX, u16::MAX), (34, 17)] {
            bad(VnetHdr { csum_start: s, csum_offset: o, ..gso4(1448) }, ALL, "csum_start");
        }
        // Fields that must be zero without the flag or GSO.
        let small = tcp(100);
        let zero = |v: VnetHdr, why: &str| assert!(check(&small, v, ALL).unwrap_err().contains(why), "{v:?}");
        zero(VnetHdr { csum_start: 34, ..Default::default() }, "without NEEDS_CSUM");
        zero(VnetHdr { csum_offset: 16, ..Default::default() }, "without NEEDS_CSUM");
        zero(VnetHdr { gso_size: 1448, ..Default::default() }, "without GSO");
        zero(VnetHdr { hdr_len: 54, flags: 1, csum_start: 34, csum_offset: 16, ..Default::default() }, "without GSO");
        // A frame over the MTU without GSO.
        bad(VnetHdr::default(), ALL, "without GSO (1514");
        // The IPv4 total length is not the frame's.
        let mut g = f.clone();
        g[17] ^= 1;
        assert!(check(&g, gso4(1448), ALL).unwrap_err().contains("total length"));
        // A fragment, UDP under TCPV4, ARP with a checksum request.
        let mut g = f.clone();
        g[20] = 0x20;
        assert!(check(&g, gso4(1448), ALL).unwrap_err().contains("fragment"));
        let mut g = f.clone();
        g[23] = 17;
        assert!(check(&g, gso4(1448), ALL).unwrap_err().contains("csum_start"));
        let mut g = tcp(10);
        g[12..14].copy_from_slice(&[0x08, 0x06]);
        let v = VnetHdr { flags: 1, csum_start: 34, csum_offset: 16, ..Default::default() };
        assert!(check(&g, v, ALL).unwrap_err().contains("not IPv4"));
        // A TCP header claiming more than the frame holds; an IPv4 header too short.
        let mut g = tcp(0);
        g[46] = 0xf0;
        assert!(check(&g, v, ALL).is_ok(), "a long data offset does not matter without GSO");
        assert!(check(&g, gso4(1448), ALL).is_err());
        let mut g = f.clone();
        g[14] = 0x44;
        assert!(check(&g, gso4(1448), ALL).unwrap_err().contains("IPv4 header"));
        // Frames too short for what they claim.
        for n in [0, 13, 20, 33, 40, 53] {
            let g = &tcp(0)[..n];
            assert!(tx(&desc(n, v), g, ALL).is_err(), "{n} bytes");
            assert!(tx(&desc(n, gso4(1448)), g, ALL).is_err(), "{n} bytes");
        }
    }
}
