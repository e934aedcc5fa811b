//! The wisp hypercall ABI: the one contract between the monitor (host) and the
//! library OS (guest).
//!
//! Everything a guest needs to know about its virtual machine is in this crate:
//! the guest-physical memory map, the boot-info page the guest reads instead of
//! probing hardware, the hypercall numbers and their argument blocks, error
//! codes, and the ABI version the monitor checks against every image.
//!
//! # Calling convention
//!
//! The guest runs entirely at CPL 3. A hypercall is one `out dx, eax`
//! instruction: `dx` is [`HYPERCALL_PORT_BASE`] plus the [`Hypercall`] number,
//! `eax` is the guest-physical address of the call's argument block (a
//! `#[repr(C)]` struct from [`args`], which must lie entirely inside guest RAM
//! below 4 GiB). The monitor reads the block, performs the call, writes any
//! results back into the block and resumes the guest after the `out`.
//! The TSS I/O-permission bitmap opens exactly the hypercall ports to CPL 3;
//! any other port access faults.
//!
//! # Image note
//!
//! Every image carries an ELF note (`PT_NOTE`) named [`NOTE_NAME`] of type
//! [`NOTE_TYPE_ABI`] whose descriptor is an [`ImageNote`]. The monitor refuses
//! images without it or with another ABI version.
#![no_std]
#![forbid(unsafe_code)]

pub mod args;
pub mod bootinfo;
pub mod layout;
pub mod net;

pub use bootinfo::{BootInfo, DeviceDesc, DeviceKind};

/// Version of this ABI. Bumped on any incompatible change; the monitor
/// refuses an image built against another version.
pub const ABI_VERSION: u32 = 1;

/// First I/O port of the hypercall window.
pub const HYPERCALL_PORT_BASE: u16 = 0x500;
/// Number of ports in the hypercall window (`HYPERCALL_PORT_BASE..+COUNT`).
pub const HYPERCALL_PORT_COUNT: u16 = 16;
/// Port the monitor-owned exception stubs (CPL 0) report faults on. It is
/// outside the window the guest may use, so a guest cannot fake a fault.
pub const FAULT_PORT: u16 = 0x5ff;

/// Hypercall numbers (added to [`HYPERCALL_PORT_BASE`]).
#[repr(u16)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hypercall {
    /// Write bytes to the console. Args: [`args::ConsoleWrite`].
    ConsoleWrite = 0,
    /// End the VM with an exit code. Args: [`args::Exit`].
    Exit = 1,
    /// Read the host's clocks. Args: [`args::Clock`].
    Clock = 2,
    /// Park the vCPU until a timeout passes or an event arrives.
    /// Args: [`args::Idle`].
    Idle = 3,
    /// Tell the monitor the NIC's TX ring has frames (only needed while
    /// `NetHeader::monitor_idle` is 1). Args: [`net::NetNotify`].
    NetNotify = 4,
}

impl Hypercall {
    /// Decode a hypercall from the port the guest wrote to.
    pub fn from_port(port: u16) -> Option<Hypercall> {
        match port.checked_sub(HYPERCALL_PORT_BASE)? {
            0 => Some(Hypercall::ConsoleWrite),
            1 => Some(Hypercall::Exit),
            2 => Some(Hypercall::Clock),
            3 => Some(Hypercall::Idle),
            4 => Some(Hypercall::NetNotify),
            _ => None,
        }
    }

    /// The I/O port of this hypercall.
    pub const fn port(self) -> u16 {
        HYPERCALL_PORT_BASE + self as u16
    }
}

/// Event bits returned by the idle hypercall (`args::Idle::events`).
pub mod events {
    /// The toolstack asks the guest to stop gracefully (`wisp stop`). The
    /// library OS exits with status 143 unless the app handles it.
    pub const STOP: u64 = 1 << 0;
    /// A NIC's RX ring has new frames (or its TX ring has room again).
    pub const NET: u64 = 1 << 1;
}

/// Error codes returned in the `ret` field of argument blocks
/// (negative values; `>= 0` means success).
pub mod errno {
    /// Success.
    pub const OK: i64 = 0;
    /// A pointer or length in the argument block falls outside guest RAM.
    pub const EFAULT: i64 = -14;
    /// An argument is invalid (e.g. a length over the limit).
    pub const EINVAL: i64 = -22;
    /// The call is not supported by this monitor.
    pub const ENOSYS: i64 = -38;
}

/// ELF note name (with the terminating NUL, as stored in the note).
pub const NOTE_NAME: &[u8; 5] = b"wisp\0";
/// ELF note type of the ABI note.
pub const NOTE_TYPE_ABI: u32 = 0x5749_5350; // "WISP"

/// Descriptor of the ABI note every image carries.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImageNote {
    /// [`ABI_VERSION`] the image was built against.
    pub abi_version: u32,
    /// Reserved, zero.
    pub flags: u32,
}

/// Size in bytes of an [`ImageNote`] descriptor.
pub const IMAGE_NOTE_SIZE: usize = 8;

impl ImageNote {
    /// Parse the note descriptor (little endian).
    pub fn parse(desc: &[u8]) -> Option<ImageNote> {
        if desc.len() < IMAGE_NOTE_SIZE {
            return None;
        }
        Some(ImageNote {
            abi_version: u32::from_le_bytes([desc[0], desc[1], desc[2], desc[3]]),
            flags: u32::from_le_bytes([desc[4], desc[5], desc[6], desc[7]]),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hypercall_ports_round_trip() {
        for hc in [Hypercall::ConsoleWrite, Hypercall::Exit, Hypercall::Clock, Hypercall::Idle, Hypercall::NetNotify] {
            assert_eq!(Hypercall::from_port(hc.port()), Some(hc));
            assert!(hc.port() < HYPERCALL_PORT_BASE + HYPERCALL_PORT_COUNT);
        }
        assert_eq!(Hypercall::from_port(HYPERCALL_PORT_BASE + 9), None);
        assert_eq!(Hypercall::from_port(0x10), None);
        assert!(FAULT_PORT >= HYPERCALL_PORT_BASE + HYPERCALL_PORT_COUNT);
    }

    #[test]
    fn note_parses() {
        let n = ImageNote::parse(&[1, 0, 0, 0, 0, 0, 0, 0]).unwrap();
        assert_eq!(n.abi_version, 1);
        assert!(ImageNote::parse(&[1, 0, 0]).is_none());
    }
}
