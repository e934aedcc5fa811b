//! The virtual disk: a request ring and a completion ring in a region of
//! guest RAM shared with the monitor, described by a
//! [`crate::DeviceKind::Block`] entry in the boot-info device table (the
//! NIC's design: no exit per request). The guest writes requests and kicks
//! the disk (its doorbell, handled inside KVM where it can be) only when
//! the monitor said it sleeps ([`BlkHeader::monitor_idle`]); the monitor's
//! I/O thread reads or writes the host file straight into or out of the
//! guest's buffers, writes completions, and wakes a guest that waits with
//! the [`crate::events::DISK`] event — one crossing per batch each way at
//! most.
//!
//! Region layout (offsets from `DeviceDesc::base`, page aligned):
//!
//! ```text
//! HEADER_OFF  BlkHeader (indices, flags)          one page
//! REQ_OFF     SLOTS × BlkReq (32 bytes)           one page
//! COMP_OFF    SLOTS × BlkComp (16 bytes)          one page
//! ```
//!
//! Indices are free-running u32 counters (slot = index % SLOTS), written
//! with release and read with acquire ordering. The guest writes a request
//! at `req_prod` and adds 1; the monitor takes it (adding 1 to `req_cons`),
//! performs it and writes its completion at `comp_prod`, adding 1; the
//! guest reads completions and adds to `comp_cons`. At most SLOTS requests
//! may be unanswered or unread at once (`req_prod - comp_cons <= SLOTS`),
//! so the completion ring never overflows. Requests complete in order.
//!
//! A request reads or writes `len` bytes at byte `offset` of the disk, both
//! multiples of [`SECTOR`], `len` at most [`MAX_IO`], inside the disk,
//! from or into the guest's buffer at guest-physical `addr`, which must lie
//! in memory the guest itself may write (for a read) or read (for a
//! write). A request the disk cannot do (a write to a read-only disk) is
//! completed with an error; a request that breaks these rules, or indices
//! that do, stop the disk ([`BlkHeader::stopped`]): the VM goes on without
//! it.
//!
//! `DeviceDesc` fields: `base`/`size` = the region; `params[0]` = capacity
//! in bytes (a multiple of [`SECTOR`]); `params[1]` = [`flags`];
//! `params[2]` = SLOTS | MAX_IO << 32.

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// Requests per ring (a power of two).
pub const SLOTS: u32 = 128;
/// The unit of offsets and lengths.
pub const SECTOR: u64 = 4096;
/// Largest request.
pub const MAX_IO: u32 = 1 << 20;
/// Offset of the header in the region.
pub const HEADER_OFF: u64 = 0;
/// Offset of the request ring.
pub const REQ_OFF: u64 = 0x1000;
/// Offset of the completion ring.
pub const COMP_OFF: u64 = 0x2000;
/// Bytes of the region.
pub const REGION_SIZE: u64 = 0x3000;

/// `DeviceDesc::params[1]` bits.
pub mod flags {
    /// Writes are refused (`EROFS`).
    pub const READ_ONLY: u64 = 1 << 0;
}

/// Request operations ([`BlkReq::op`]).
pub mod op {
    /// Read `len` bytes at `offset` into the buffer.
    pub const READ: u32 = 0;
    /// Write `len` bytes of the buffer at `offset`.
    pub const WRITE: u32 = 1;
    /// Make every completed write durable (`len` and `addr` 0).
    pub const FLUSH: u32 = 2;
}

/// The region's header.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct BlkHeader {
    /// Requests the guest has written.
    pub req_prod: u32,
    /// Requests the monitor has taken.
    pub req_cons: u32,
    /// Completions the monitor has written.
    pub comp_prod: u32,
    /// Completions the guest has read.
    pub comp_cons: u32,
    /// 1 while the monitor's I/O thread sleeps: kick the disk after
    /// queuing requests.
    pub monitor_idle: u32,
    /// Non-zero once the monitor stopped the disk (rules broken).
    pub stopped: u32,
}

/// Byte offsets of the header's fields.
pub mod hdr {
    /// [`super::BlkHeader::req_prod`].
    pub const REQ_PROD: u64 = 0;
    /// [`super::BlkHeader::req_cons`].
    pub const REQ_CONS: u64 = 4;
    /// [`super::BlkHeader::comp_prod`].
    pub const COMP_PROD: u64 = 8;
    /// [`super::BlkHeader::comp_cons`].
    pub const COMP_CONS: u64 = 12;
    /// [`super::BlkHeader::monitor_idle`].
    pub const MONITOR_IDLE: u64 = 16;
    /// [`super::BlkHeader::stopped`].
    pub const STOPPED: u64 = 20;
}

/// One request.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct BlkReq {
    /// An [`op`] value.
    pub op: u32,
    /// The guest's tag, returned in the completion.
    pub tag: u32,
    /// Byte offset on the disk (a multiple of [`SECTOR`]).
    pub offset: u64,
    /// Guest-physical address of the buffer.
    pub addr: u64,
    /// Bytes (a multiple of [`SECTOR`], at most [`MAX_IO`]).
    pub len: u32,
    /// Reserved, zero.
    pub reserved: u32,
}

/// One completion.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct BlkComp {
    /// The request's tag.
    pub tag: u32,
    /// 0, or a negative [`crate::errno`] value (`EROFS`, `EIO`).
    pub status: i32,
    /// Bytes moved.
    pub len: u32,
    /// Reserved, zero.
    pub reserved: u32,
}

/// `params[2]` for `slots` and `max_io`.
pub const fn encode_geometry(slots: u32, max_io: u32) -> u64 {
    slots as u64 | (max_io as u64) << 32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rings_fit_their_pages() {
        assert_eq!(core::mem::size_of::<BlkReq>(), 32);
        assert_eq!(core::mem::size_of::<BlkComp>(), 16);
        assert!(REQ_OFF + SLOTS as u64 * 32 <= COMP_OFF);
        assert!(COMP_OFF + SLOTS as u64 * 16 <= REGION_SIZE);
        assert_eq!(core::mem::offset_of!(BlkHeader, stopped) as u64, hdr::STOPPED);
        assert_eq!(core::mem::offset_of!(BlkHeader, monitor_idle) as u64, hdr::MONITOR_IDLE);
        assert!(SLOTS.is_power_of_two() && MAX_IO as u64 % SECTOR == 0);
    }
}
