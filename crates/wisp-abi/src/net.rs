//! The virtual NIC: two rings of fixed-size slots in a region of guest RAM
//! shared with the monitor, described by a `DeviceKind::Net` entry in the
//! boot-info device table. No exit per packet: the monitor's I/O thread
//! polls the TX ring and fills the RX ring; the guest kicks it
//! ([`crate::Hypercall::Notify`] with this NIC's device index) only when it has queued frames *and*
//! the monitor said it sleeps ([`NetHeader::monitor_idle`]), and the
//! monitor wakes an idle guest with the [`crate::events::NET`] event — one
//! crossing per batch in each direction at most.
//!
//! Region layout (offsets from `DeviceDesc::base`, all page aligned):
//!
//! ```text
//! HEADER_OFF  NetHeader (indices, flags)                  one page
//! RX_DESC_OFF SLOTS × SlotDesc for RX, then TX_DESC_OFF SLOTS × SlotDesc for TX
//! RX_BUF_OFF  SLOTS × SLOT_SIZE bytes of RX frame buffers
//! TX_BUF_OFF  SLOTS × SLOT_SIZE bytes of TX frame buffers
//! ```
//!
//! # Frames and chains (ABI v4)
//!
//! A frame is a whole Ethernet frame without FCS, with a virtio-net header
//! ([`VnetHdr`], the layout of `struct virtio_net_hdr`, virtio 1.x §5.1.6)
//! in its descriptor. It takes `slots_for(len)` = ⌈len / SLOT_SIZE⌉
//! **consecutive** slots (a chain; slot SLOTS − 1 is followed by slot 0),
//! and only the first slot's descriptor counts: `len` is the whole frame's
//! length, the frame's bytes run on through the next slots' buffers (which
//! are contiguous in memory except where the ring wraps). Chains are
//! positional, so they cannot loop; a chain must lie within the published
//! part of the ring and be at most [`MAX_CHAIN`] slots (a frame of at most
//! [`MAX_GSO_FRAME`] bytes).
//!
//! Indices are free-running u32 counters of **slots** (slot = index %
//! SLOTS), written with release and read with acquire ordering. RX: the
//! monitor writes the chain at `rx_prod` (buffers, then the first slot's
//! descriptor) and adds its slots to `rx_prod`; the guest consumes the
//! chain and adds them to `rx_cons`. TX: the guest writes the chain at
//! `tx_prod` and adds its slots to `tx_prod`; the monitor sends it and adds
//! them to `tx_cons`. A guest that breaks these rules gets its NIC stopped;
//! nothing else: an index running ahead by more than SLOTS, a length of 0
//! or over [`MAX_GSO_FRAME`], a chain past `tx_prod`, or a header the
//! monitor refuses (below).
//!
//! # Offloads
//!
//! [`DeviceDesc::params`](crate::DeviceDesc)`[4]` holds the [`offload`]
//! bits the monitor enabled on its tap. With [`offload::CSUM`] a TX frame
//! may leave its TCP or UDP checksum to the host (`VIRTIO_NET_HDR_F_NEEDS_CSUM`,
//! `csum_start` = the L4 header, `csum_offset` = 16 or 6, the checksum
//! field holding the pseudo-header sum); with [`offload::TSO4`] a TX frame
//! may be a TCP/IPv4 super-segment of up to [`MAX_GSO_FRAME`] bytes the
//! host cuts into segments of `gso_size` payload bytes (`gso_type` =
//! [`gso::TCPV4`], NEEDS_CSUM, `hdr_len` = the Ethernet + IPv4 + TCP
//! headers, the IPv4 total length that of the whole frame). The monitor
//! checks every TX header against the frame it describes (see
//! `docs/abi.md`) and writes its own to the tap, never the guest's.
//! RX frames come with the header the host gave: a coalesced super-frame
//! (gso_type TCPV4/TCPV6, up to [`MAX_CHAIN`] slots),
//! `VIRTIO_NET_HDR_F_NEEDS_CSUM` (the host's own frame: its checksum is
//! not filled in, the data is good) or `VIRTIO_NET_HDR_F_DATA_VALID` (the
//! host checked it); without either, the guest checks the checksums itself.
//!
//! `DeviceDesc` fields for a NIC: `base`/`size` = the region; `params[0]` =
//! MAC address (6 bytes, little-endian in the low 48 bits); `params[1]` =
//! IPv4 address (low 32 bits, network byte order as a big-endian u32 value,
//! e.g. 10.0.0.2 = 0x0a000002) | prefix length << 32; `params[2]` = IPv4
//! gateway (same encoding, 0 = none); `params[3]` = SLOTS | SLOT_SIZE << 32
//! ([`encode_geometry`]); `params[4]` = [`offload`] bits.

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// Slots per ring (a power of two).
pub const SLOTS: u32 = 512;
/// Bytes per slot (a 1514-byte frame fits one; a larger one chains).
pub const SLOT_SIZE: u32 = 2048;
/// IP MTU of the NIC.
pub const MTU: u32 = 1500;
/// Largest frame without GSO (MTU + Ethernet header).
pub const MAX_FRAME: u32 = MTU + 14;
/// Largest frame of a chain: an IPv4 datagram's largest (65,535 bytes)
/// with its Ethernet header. RX super-frames of the host (IPv6 among
/// them) are at most [`MAX_CHAIN`] slots.
pub const MAX_GSO_FRAME: u32 = 65535 + 14;
/// Most slots a frame takes.
pub const MAX_CHAIN: u32 = MAX_GSO_FRAME.div_ceil(SLOT_SIZE);
/// Most segments a TX super-frame may stand for.
pub const MAX_GSO_SEGS: u32 = 64;
/// Smallest `gso_size` of a TX super-frame.
pub const MIN_GSO_SIZE: u32 = 64;

/// Slots a frame of `len` bytes takes (0 for 0).
pub const fn slots_for(len: u32) -> u32 {
    len.div_ceil(SLOT_SIZE)
}

/// Offload bits (`DeviceDesc::params[4]`): what the monitor's tap does for
/// the guest.
pub mod offload {
    /// TX frames may ask for their TCP/UDP checksum (NEEDS_CSUM); RX frames
    /// may come with NEEDS_CSUM or DATA_VALID.
    pub const CSUM: u64 = 1 << 0;
    /// TX frames may be TCP/IPv4 super-segments (gso TCPV4); RX frames may
    /// be coalesced super-frames.
    pub const TSO4: u64 = 1 << 1;
}

/// `VnetHdr::flags` bits (virtio's `VIRTIO_NET_HDR_F_*`).
pub mod vnet_flags {
    /// The checksum at `csum_start + csum_offset` is to be filled in over
    /// the bytes from `csum_start` on (it holds the pseudo-header sum).
    pub const NEEDS_CSUM: u8 = 1;
    /// RX: the host checked the checksums.
    pub const DATA_VALID: u8 = 2;
}

/// `VnetHdr::gso_type` values (virtio's `VIRTIO_NET_HDR_GSO_*`).
pub mod gso {
    /// Not a super-frame.
    pub const NONE: u8 = 0;
    /// TCP over IPv4.
    pub const TCPV4: u8 = 1;
    /// UDP fragmentation offload (never accepted on TX).
    pub const UDP: u8 = 3;
    /// TCP over IPv6.
    pub const TCPV6: u8 = 4;
    /// UDP segmentation (never accepted on TX).
    pub const UDP_L4: u8 = 5;
    /// Flag: ECN (never accepted on TX).
    pub const ECN: u8 = 0x80;
}

/// Offsets of the header fields (u32 each), for atomic access.
pub mod hdr {
    /// Monitor → guest slots produced.
    pub const RX_PROD: u64 = 0;
    /// Guest → slots consumed.
    pub const RX_CONS: u64 = 4;
    /// Guest → slots produced.
    pub const TX_PROD: u64 = 8;
    /// Monitor → slots consumed.
    pub const TX_CONS: u64 = 12;
    /// Monitor: 1 while its I/O thread sleeps and needs a kick for TX.
    pub const MONITOR_IDLE: u64 = 16;
    /// Monitor: non-zero once the NIC has been stopped (the guest broke the rules).
    pub const STOPPED: u64 = 20;
    /// Monitor: 1 while its I/O thread waits for room in the RX ring.
    pub const RX_WAIT: u64 = 24;
    /// Monitor: 1 if a TX kick by exit (the notify hypercall) is served at
    /// once on the vCPU thread — prefer it to the doorbell then.
    pub const KICK_EXIT: u64 = 28;
}

/// Bytes of a descriptor.
pub const DESC_SIZE: u64 = 16;

/// Offset of the header page.
pub const HEADER_OFF: u64 = 0;
/// Offset of the RX descriptors.
pub const RX_DESC_OFF: u64 = 0x1000;
/// Offset of the TX descriptors.
pub const TX_DESC_OFF: u64 = RX_DESC_OFF + SLOTS as u64 * DESC_SIZE;
/// Offset of the RX buffers.
pub const RX_BUF_OFF: u64 = RX_DESC_OFF + ((2 * SLOTS as u64 * DESC_SIZE + 0xfff) & !0xfff);
/// Offset of the TX buffers.
pub const TX_BUF_OFF: u64 = RX_BUF_OFF + SLOTS as u64 * SLOT_SIZE as u64;
/// Size of the whole region.
pub const REGION_SIZE: u64 = TX_BUF_OFF + SLOTS as u64 * SLOT_SIZE as u64;

/// The header page (see [`hdr`] for the offsets).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct NetHeader {
    /// Slots the monitor has filled in the RX ring.
    pub rx_prod: u32,
    /// Slots the guest has taken from the RX ring.
    pub rx_cons: u32,
    /// Slots the guest has filled in the TX ring.
    pub tx_prod: u32,
    /// Slots the monitor has sent from the TX ring.
    pub tx_cons: u32,
    /// 1 while the monitor's I/O thread sleeps (kick it after queuing TX).
    pub monitor_idle: u32,
    /// Non-zero once the monitor stopped this NIC.
    pub stopped: u32,
    /// 1 while the monitor's I/O thread waits for room in the RX ring
    /// (it stopped reading the tap): a guest that frees RX slots while it
    /// is 1 kicks the NIC, as for TX. Optional: a guest that does not is
    /// served by the monitor's own re-check (every millisecond) — an
    /// addition older guests may ignore, so no ABI bump.
    pub rx_wait: u32,
    /// 1 if the monitor serves a kick by exit (the notify hypercall, or a
    /// doorbell that exits) on the vCPU thread at once: the frames leave
    /// before the guest runs on, with no other thread woken, which beats a
    /// doorbell that wakes a sleeping I/O thread (on a host whose idle CPUs
    /// wake slowly, by far). A guest then kicks a sleeping monitor
    /// (`monitor_idle` 1) after queuing TX with `notify`. Optional, like
    /// `rx_wait`: older guests ring the doorbell, which still works.
    pub kick_exit: u32,
}

/// A virtio-net header (`struct virtio_net_hdr`, little-endian): how a
/// frame is offloaded (see [`vnet_flags`], [`gso`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct VnetHdr {
    /// [`vnet_flags`] bits.
    pub flags: u8,
    /// A [`gso`] value.
    pub gso_type: u8,
    /// Bytes of headers (Ethernet + IP + TCP) of a super-frame.
    pub hdr_len: u16,
    /// Payload bytes of each segment of a super-frame.
    pub gso_size: u16,
    /// Where the checksummed bytes start (NEEDS_CSUM).
    pub csum_start: u16,
    /// Where the checksum is, from `csum_start` (NEEDS_CSUM).
    pub csum_offset: u16,
}

/// Bytes of a [`VnetHdr`].
pub const VNET_HDR_SIZE: usize = 10;

/// One ring slot's descriptor; only the first slot of a chain counts.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct SlotDesc {
    /// Length of the whole frame in bytes (1..=[`MAX_GSO_FRAME`]).
    pub len: u32,
    /// How the frame is offloaded.
    pub vnet: VnetHdr,
    /// Reserved, zero.
    pub reserved: u16,
}

/// Encode the ring geometry for `DeviceDesc::params[3]`.
pub const fn encode_geometry(slots: u32, slot_size: u32) -> u64 {
    slots as u64 | (slot_size as u64) << 32
}

/// Decode `DeviceDesc::params[3]`: (slots, slot size).
pub const fn decode_geometry(v: u64) -> (u32, u32) {
    (v as u32, (v >> 32) as u32)
}

/// Encode an IPv4 address + prefix for `DeviceDesc::params[1]`.
pub const fn encode_ipv4(addr: [u8; 4], prefix: u8) -> u64 {
    (u32::from_be_bytes(addr) as u64) | ((prefix as u64) << 32)
}

/// Decode `DeviceDesc::params[1]` (or `[2]`, prefix 0): (address, prefix).
pub const fn decode_ipv4(v: u64) -> ([u8; 4], u8) {
    ((v as u32).to_be_bytes(), (v >> 32) as u8)
}

/// The netmask of an IPv4 prefix of `len` bits (more than 32 count as 32).
/// The one prefix rule of the monitor's identity filter, the daemon's
/// subnets and links, and the firewall's rules.
pub const fn prefix_mask(len: u8) -> u32 {
    if len == 0 {
        0
    } else {
        u32::MAX << (32 - if len > 32 { 32 } else { len }) as u32
    }
}

/// Whether IPv4 address `a` lies in the prefix `net`/`len`.
pub const fn in_prefix(a: [u8; 4], (net, len): ([u8; 4], u8)) -> bool {
    let mask = prefix_mask(len);
    u32::from_be_bytes(a) & mask == u32::from_be_bytes(net) & mask
}

/// Encode a MAC address for `DeviceDesc::params[0]`.
pub fn encode_mac(mac: [u8; 6]) -> u64 {
    let mut b = [0u8; 8];
    b[..6].copy_from_slice(&mac);
    u64::from_le_bytes(b)
}

/// Decode `DeviceDesc::params[0]`.
pub fn decode_mac(v: u64) -> [u8; 6] {
    let b = v.to_le_bytes();
    [b[0], b[1], b[2], b[3], b[4], b[5]]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_mask_their_bits_and_no_more() {
        assert_eq!((prefix_mask(0), prefix_mask(8), prefix_mask(30), prefix_mask(32), prefix_mask(40)), (0, 0xff00_0000, 0xffff_fffc, u32::MAX, u32::MAX));
        assert!(in_prefix([10, 200, 3, 2], ([10, 200, 3, 0], 30)));
        assert!(!in_prefix([10, 200, 3, 4], ([10, 200, 3, 0], 30)));
        assert!(in_prefix([8, 8, 8, 8], ([0; 4], 0)), "a default route holds everything");
        assert!(!in_prefix([192, 168, 0, 8], ([192, 168, 0, 9], 32)));
    }

    #[test]
    fn layout_is_page_aligned_and_disjoint() {
        assert!(TX_DESC_OFF + SLOTS as u64 * DESC_SIZE <= RX_BUF_OFF);
        assert_eq!(RX_BUF_OFF % 0x1000, 0);
        assert_eq!(TX_BUF_OFF % 0x1000, 0);
        assert_eq!(REGION_SIZE % 0x1000, 0);
        assert!(SLOTS.is_power_of_two());
        assert!(MAX_FRAME <= SLOT_SIZE);
        assert_eq!(core::mem::size_of::<NetHeader>() as u64, hdr::KICK_EXIT + 4);
        assert_eq!(core::mem::size_of::<VnetHdr>(), VNET_HDR_SIZE);
        assert_eq!(core::mem::size_of::<SlotDesc>() as u64, DESC_SIZE);
        // A region of about 2 MiB; a ring holds this many largest frames.
        assert_eq!(REGION_SIZE, 0x1000 + 0x4000 + 2 * 512 * 2048);
        assert_eq!(MAX_CHAIN, 33);
        assert_eq!(SLOTS / MAX_CHAIN, 15);
        assert_eq!((slots_for(0), slots_for(1), slots_for(2048), slots_for(2049)), (0, 1, 1, 2));
        assert_eq!(slots_for(MAX_GSO_FRAME), MAX_CHAIN);
    }

    #[test]
    fn encodings_round_trip() {
        let v = encode_ipv4([10, 0, 0, 2], 24);
        assert_eq!(decode_ipv4(v), ([10, 0, 0, 2], 24));
        let m = [0x52, 0x54, 0, 0x12, 0x34, 0x56];
        assert_eq!(decode_mac(encode_mac(m)), m);
        assert_eq!(decode_geometry(encode_geometry(SLOTS, SLOT_SIZE)), (SLOTS, SLOT_SIZE));
    }
}
