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
//! [`NOTE_TYPE_ABI`] whose descriptor is an [`ImageNote`]: the ABI version
//! and the image's manifest (the features and devices it needs). The
//! monitor refuses images without it, with another ABI version, or needing
//! what it cannot give; the version and feature rules are in [`manifest`].
#![no_std]
#![forbid(unsafe_code)]

pub mod app;
pub mod args;
pub mod blk;
pub mod bootinfo;
pub mod data;
pub mod family;
pub mod layout;
pub mod libpolicy;
pub mod manifest;
pub mod net;

pub use bootinfo::{BootInfo, DeviceDesc, DeviceKind};
pub use manifest::{features, ImageNote, IMAGE_NOTE_SIZE};

/// Version of this ABI. Bumped only when an existing contract changes
/// incompatibly; additions are feature bits (see [`manifest`]). The monitor
/// refuses an image built against another version.
///
/// - v1: console, exit, clock, idle, NIC notify.
/// - v2: the image note carries a manifest (features, devices); hypercall 4
///   notifies any device of the boot-info table; fork and family IPC are
///   the features `fork` and `family`.
/// - v3: the pids of fork and family IPC are family-local (the root 1),
///   no longer the host pids of monitor processes; KILL of a pid outside
///   the family is `ESRCH` (v2 answered `EPERM` for another family's VM).
/// - v4: NIC rings carry a virtio-net header in each descriptor (16 bytes),
///   frames of up to 64 KiB chain consecutive slots (indices count slots),
///   512 slots a ring, the geometry packed in `params[3]` and the tap's
///   offloads in `params[4]` (see [`net`]).
pub const ABI_VERSION: u32 = 4;

/// First I/O port of the hypercall window.
pub const HYPERCALL_PORT_BASE: u16 = 0x500;
/// Number of ports in the hypercall window (`HYPERCALL_PORT_BASE..+COUNT`).
pub const HYPERCALL_PORT_COUNT: u16 = 16;
/// Port the monitor-owned exception stubs (CPL 0) report faults on. It is
/// outside the window the guest may use, so a guest cannot fake a fault.
pub const FAULT_PORT: u16 = 0x5ff;

/// First doorbell port: an `out` of any byte to `DOORBELL_PORT_BASE + i`
/// kicks device `i` of the boot-info table, like [`Hypercall::Notify`] but
/// without an argument block — so the monitor can have KVM turn it into an
/// eventfd signal (`KVM_IOEVENTFD`) that never leaves the kernel (~8 µs on
/// PVM hosts, against 18–40 µs for an exit to the monitor). Only for devices
/// whose entry has [`bootinfo::device_flags::DOORBELL`]; a monitor without
/// KVM's help serves it as an exit, the same for the guest.
pub const DOORBELL_PORT_BASE: u16 = 0x600;

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
    /// Kick a device of the boot-info table (for a NIC: its TX ring has
    /// frames; only needed while `NetHeader::monitor_idle` is 1).
    /// Args: [`args::Notify`].
    Notify = 4,
    /// Fork this VM: the child is a new VM with a copy-on-write copy of
    /// guest RAM and the same registers. Feature [`features::FORK`].
    /// Args: [`args::Fork`].
    Fork = 5,
    /// Family IPC (pipes, signals, wait, message queues, shared memory);
    /// the operation is in the block. Feature [`features::FAMILY`].
    /// Args: [`family::Call`].
    Family = 6,
    /// Standard error and standard input: the operation is in the block.
    /// Feature [`features::STDIO`]. Args: [`args::Stdio`].
    Stdio = 7,
    /// The guest is ready: what comes after is what every start needs
    /// again. A VM being made into a template is saved here (its
    /// instances go on from the return of this call); otherwise nothing
    /// happens. Feature [`features::READY`]. Args: [`args::Ready`].
    Ready = 8,
    /// Shared libraries: the guest is at a point where no frame of a
    /// library's code is on its stack, and takes the updates waiting
    /// (`BootInfo::lib_state` bit 0). Args: [`args::Library`]. Part of
    /// every monitor that sets that bit (no feature: a guest calls it only
    /// when asked).
    Library = 9,
}

impl Hypercall {
    /// Decode a hypercall from the port the guest wrote to.
    pub fn from_port(port: u16) -> Option<Hypercall> {
        match port.checked_sub(HYPERCALL_PORT_BASE)? {
            0 => Some(Hypercall::ConsoleWrite),
            1 => Some(Hypercall::Exit),
            2 => Some(Hypercall::Clock),
            3 => Some(Hypercall::Idle),
            4 => Some(Hypercall::Notify),
            5 => Some(Hypercall::Fork),
            6 => Some(Hypercall::Family),
            7 => Some(Hypercall::Stdio),
            8 => Some(Hypercall::Ready),
            9 => Some(Hypercall::Library),
            _ => None,
        }
    }

    /// The I/O port of this hypercall.
    pub const fn port(self) -> u16 {
        HYPERCALL_PORT_BASE + self as u16
    }

    /// The feature bit an image must declare to use this hypercall (0: none,
    /// part of every monitor of this ABI version).
    pub const fn feature(self) -> u64 {
        match self {
            Hypercall::Fork => features::FORK,
            Hypercall::Family => features::FAMILY,
            Hypercall::Stdio => features::STDIO,
            Hypercall::Ready => features::READY,
            _ => 0,
        }
    }

    /// The hypercall's name (in stop reasons and logs).
    pub const fn name(self) -> &'static str {
        match self {
            Hypercall::ConsoleWrite => "console_write",
            Hypercall::Exit => "exit",
            Hypercall::Clock => "clock",
            Hypercall::Idle => "idle",
            Hypercall::Notify => "notify",
            Hypercall::Fork => "fork",
            Hypercall::Family => "family",
            Hypercall::Stdio => "stdio",
            Hypercall::Ready => "ready",
            Hypercall::Library => "library",
        }
    }
}

/// Event bits returned by the idle hypercall (`args::Idle::events`).
pub mod events {
    /// The toolstack asks the guest to stop gracefully (`wisp stop`). The
    /// library OS exits with status 143 unless the app handles it.
    pub const STOP: u64 = 1 << 0;
    /// A NIC's RX ring has new frames (or its TX ring has room again).
    pub const NET: u64 = 1 << 1;
    /// Something changed in the VM's family: a signal is pending (take it
    /// with [`crate::family::op::SIGNALS`]) or an IPC object it may wait on
    /// changed.
    pub const FAMILY: u64 = 1 << 2;
    /// Standard input has bytes to read, or reached its end
    /// ([`crate::args::stdio_op::READ_IN`] answers at once).
    pub const STDIN: u64 = 1 << 3;
    /// A disk wrote completions (see [`crate::blk`]).
    pub const DISK: u64 = 1 << 4;
    /// A shared library's update waits for the guest
    /// ([`crate::Hypercall::Library`], `BootInfo::lib_state`).
    pub const LIBRARY: u64 = 1 << 5;
}

/// Error codes returned in the `ret` field of argument blocks
/// (negative values; `>= 0` means success).
pub mod errno {
    /// Success.
    pub const OK: i64 = 0;
    /// Not allowed (e.g. the target VM is outside the caller's family).
    pub const EPERM: i64 = -1;
    /// No such IPC key, object or descriptor target.
    pub const ENOENT: i64 = -2;
    /// No such VM.
    pub const ESRCH: i64 = -3;
    /// A blocking call was interrupted (a stop request or a signal).
    pub const EINTR: i64 = -4;
    /// The family's shared IPC page held nonsense (written over): the call
    /// that found it failed and the ring starts empty again.
    pub const EIO: i64 = -5;
    /// A message is longer than the receive buffer.
    pub const E2BIG: i64 = -7;
    /// Not an open descriptor (or the wrong end of a pipe).
    pub const EBADF: i64 = -9;
    /// No children to wait for.
    pub const ECHILD: i64 = -10;
    /// Would block (non-blocking call), or a family limit was reached.
    pub const EAGAIN: i64 = -11;
    /// Out of memory for the object.
    pub const ENOMEM: i64 = -12;
    /// The key exists and exclusive creation was asked.
    pub const EEXIST: i64 = -17;
    /// Too many open descriptors.
    pub const EMFILE: i64 = -24;
    /// A write to a read-only disk.
    pub const EROFS: i64 = -30;
    /// No room for another object of this kind in the family.
    pub const ENOSPC: i64 = -28;
    /// Writing to a pipe nobody can read.
    pub const EPIPE: i64 = -32;
    /// No message of the wanted type (non-blocking receive).
    pub const ENOMSG: i64 = -42;
    /// The object was removed while the caller waited on it.
    pub const EIDRM: i64 = -43;
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
/// ELF note type of an image's library policy ([`libpolicy::LibPolicy`]).
pub const NOTE_TYPE_LIBS: u32 = 0x5749_534c; // "WISL"

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hypercall_ports_round_trip() {
        for hc in [
            Hypercall::ConsoleWrite,
            Hypercall::Exit,
            Hypercall::Clock,
            Hypercall::Idle,
            Hypercall::Notify,
            Hypercall::Fork,
            Hypercall::Family,
            Hypercall::Stdio,
            Hypercall::Ready,
            Hypercall::Library,
        ] {
            assert_eq!(Hypercall::from_port(hc.port()), Some(hc));
            assert!(hc.port() < HYPERCALL_PORT_BASE + HYPERCALL_PORT_COUNT);
        }
        assert_eq!(Hypercall::from_port(HYPERCALL_PORT_BASE + 10), None);
        assert_eq!(Hypercall::Stdio.feature(), features::STDIO);
        assert_eq!(Hypercall::Ready.feature(), features::READY);
        assert_eq!(Hypercall::from_port(0x10), None);
        assert!(FAULT_PORT >= HYPERCALL_PORT_BASE + HYPERCALL_PORT_COUNT);
    }

    #[test]
    fn features_of_hypercalls_are_defined() {
        assert_eq!(Hypercall::Fork.feature(), features::FORK);
        assert_eq!(Hypercall::Family.feature(), features::FAMILY);
        assert_eq!(Hypercall::Idle.feature(), 0);
        assert_eq!(features::ALL & Hypercall::Fork.feature(), features::FORK);
    }
}
