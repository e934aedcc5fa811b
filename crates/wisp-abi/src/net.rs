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
//! Indices are free-running u32 counters (slot = index % SLOTS), written
//! with release and read with acquire ordering. RX: the monitor writes slot
//! `rx_prod % SLOTS` (descriptor then buffer) and increments `rx_prod`; the
//! guest consumes and increments `rx_cons`. TX: the guest writes slot
//! `tx_prod % SLOTS` and increments `tx_prod`; the monitor sends it and
//! increments `tx_cons`. Frames are whole Ethernet frames without FCS.
//! A guest that breaks these rules (an index running ahead by more than
//! SLOTS, a length over SLOT_SIZE) gets its NIC stopped; nothing else.
//!
//! `DeviceDesc` fields for a NIC: `base`/`size` = the region; `params[0]` =
//! MAC address (6 bytes, little-endian in the low 48 bits); `params[1]` =
//! IPv4 address (low 32 bits, network byte order as a big-endian u32 value,
//! e.g. 10.0.0.2 = 0x0a000002) | prefix length << 32; `params[2]` = IPv4
//! gateway (same encoding, 0 = none); `params[3]` = SLOTS; `params[4]` =
//! SLOT_SIZE.

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// Slots per ring (a power of two).
pub const SLOTS: u32 = 256;
/// Bytes per slot (enough for a 1514-byte Ethernet frame).
pub const SLOT_SIZE: u32 = 2048;
/// IP MTU of the NIC.
pub const MTU: u32 = 1500;
/// Largest frame (MTU + Ethernet header).
pub const MAX_FRAME: u32 = MTU + 14;

/// Offset of the header page.
pub const HEADER_OFF: u64 = 0;
/// Offset of the RX descriptors.
pub const RX_DESC_OFF: u64 = 0x1000;
/// Offset of the TX descriptors.
pub const TX_DESC_OFF: u64 = RX_DESC_OFF + SLOTS as u64 * 8;
/// Offset of the RX buffers.
pub const RX_BUF_OFF: u64 = 0x2000 + ((SLOTS as u64 * 16 + 0xfff) & !0xfff) - 0x1000;
/// Offset of the TX buffers.
pub const TX_BUF_OFF: u64 = RX_BUF_OFF + SLOTS as u64 * SLOT_SIZE as u64;
/// Size of the whole region.
pub const REGION_SIZE: u64 = TX_BUF_OFF + SLOTS as u64 * SLOT_SIZE as u64;

/// Offsets of the header fields (u32 each), for atomic access.
pub mod hdr {
    /// Monitor → guest frames produced.
    pub const RX_PROD: u64 = 0;
    /// Guest → frames consumed.
    pub const RX_CONS: u64 = 4;
    /// Guest → frames produced.
    pub const TX_PROD: u64 = 8;
    /// Monitor → frames consumed.
    pub const TX_CONS: u64 = 12;
    /// Monitor: 1 while its I/O thread sleeps and needs a kick for TX.
    pub const MONITOR_IDLE: u64 = 16;
    /// Monitor: non-zero once the NIC has been stopped (the guest broke the rules).
    pub const STOPPED: u64 = 20;
}

/// The header page (see [`hdr`] for the offsets).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct NetHeader {
    /// Frames the monitor has put in the RX ring.
    pub rx_prod: u32,
    /// Frames the guest has taken from the RX ring.
    pub rx_cons: u32,
    /// Frames the guest has put in the TX ring.
    pub tx_prod: u32,
    /// Frames the monitor has sent from the TX ring.
    pub tx_cons: u32,
    /// 1 while the monitor's I/O thread sleeps (kick it after queuing TX).
    pub monitor_idle: u32,
    /// Non-zero once the monitor stopped this NIC.
    pub stopped: u32,
}

/// One ring slot's descriptor.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct SlotDesc {
    /// Frame length in bytes (≤ SLOT_SIZE).
    pub len: u32,
    /// Reserved, zero.
    pub flags: u32,
}

/// Encode an IPv4 address + prefix for `DeviceDesc::params[1]`.
pub const fn encode_ipv4(addr: [u8; 4], prefix: u8) -> u64 {
    (u32::from_be_bytes(addr) as u64) | ((prefix as u64) << 32)
}

/// Decode `DeviceDesc::params[1]` (or `[2]`, prefix 0): (address, prefix).
pub const fn decode_ipv4(v: u64) -> ([u8; 4], u8) {
    ((v as u32).to_be_bytes(), (v >> 32) as u8)
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
    fn layout_is_page_aligned_and_disjoint() {
        assert!(TX_DESC_OFF + SLOTS as u64 * 8 <= RX_BUF_OFF);
        assert_eq!(RX_BUF_OFF % 0x1000, 0);
        assert_eq!(TX_BUF_OFF % 0x1000, 0);
        assert_eq!(REGION_SIZE % 0x1000, 0);
        assert!(SLOTS.is_power_of_two());
        assert!(MAX_FRAME <= SLOT_SIZE);
        assert_eq!(core::mem::size_of::<NetHeader>() as u64, hdr::STOPPED + 4);
    }

    #[test]
    fn encodings_round_trip() {
        let v = encode_ipv4([10, 0, 0, 2], 24);
        assert_eq!(decode_ipv4(v), ([10, 0, 0, 2], 24));
        let m = [0x52, 0x54, 0, 0x12, 0x34, 0x56];
        assert_eq!(decode_mac(encode_mac(m)), m);
    }
}
