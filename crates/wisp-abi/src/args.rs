//! Argument blocks of the hypercalls. The guest passes the guest-physical
//! address of one of these in `eax`; the monitor reads it, validates every
//! pointer and length in it against guest RAM, and writes results back.

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

/// Largest console write the monitor accepts in one call.
pub const CONSOLE_WRITE_MAX: u64 = 64 * 1024;

/// [`crate::Hypercall::ConsoleWrite`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct ConsoleWrite {
    /// Guest-physical address of the bytes.
    pub data: u64,
    /// Number of bytes (at most [`CONSOLE_WRITE_MAX`]).
    pub len: u64,
    /// Out: bytes written, or a negative [`crate::errno`] value.
    pub ret: i64,
}

/// [`crate::Hypercall::Exit`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct Exit {
    /// Exit status of the VM (0..=255 is passed through to `wisp run`).
    pub code: i32,
    /// Reserved, zero.
    pub reserved: u32,
}

/// [`crate::Hypercall::Clock`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct Clock {
    /// Out: nanoseconds since boot on the host's monotonic clock.
    pub monotonic_ns: u64,
    /// Out: host `CLOCK_REALTIME`, nanoseconds since the Unix epoch.
    pub wall_ns: u64,
}

/// [`crate::Hypercall::Idle`]: park until `timeout_ns` passes or an event
/// arrives. No CPU is used while parked.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct Idle {
    /// Longest time to park, in nanoseconds (`u64::MAX`: until an event).
    pub timeout_ns: u64,
    /// Out: bit mask of pending events (0: the timeout passed).
    pub events: u64,
}

/// [`crate::Hypercall::Notify`]: kick a device.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct Notify {
    /// Index of the device in the boot-info device table.
    pub device: u32,
    /// Reserved, zero.
    pub reserved: u32,
}

/// [`crate::Hypercall::Fork`]: fork this VM.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct Fork {
    /// Out: the child's pid in the parent, 0 in the child, or a negative
    /// errno (`EAGAIN`: the family's limit is reached; `ENOSYS`: this
    /// monitor cannot fork).
    pub ret: i64,
}

/// Operations of [`crate::Hypercall::Stdio`] (`Stdio::op`).
pub mod stdio_op {
    /// Write `len` bytes at `data` to standard error (at most
    /// [`super::CONSOLE_WRITE_MAX`]); `ret` = bytes written.
    pub const WRITE_ERR: u32 = 0;
    /// Read up to `len` bytes of standard input into `data`, without
    /// blocking: `ret` = bytes read, 0 at its end (or when the VM has no
    /// standard input), `EAGAIN` when none are there yet — an idle
    /// hypercall then returns [`crate::events::STDIN`] once there are.
    pub const READ_IN: u32 = 1;
}

/// [`crate::Hypercall::Ready`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct Ready {
    /// Out: 0, or a negative errno (`ENOSYS`: the image did not declare
    /// `features::READY`).
    pub ret: i64,
}

/// [`crate::Hypercall::Stdio`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct Stdio {
    /// A [`stdio_op`] value.
    pub op: u32,
    /// Reserved, zero.
    pub reserved: u32,
    /// Guest-physical address of the buffer.
    pub data: u64,
    /// Its length in bytes.
    pub len: u64,
    /// Out: bytes written or read, or a negative [`crate::errno`] value.
    pub ret: i64,
}

/// Operations of [`crate::Hypercall::Library`] (`Library::op`).
pub mod library_op {
    /// The guest runs no library code (no frame of one on its stack): the
    /// monitor switches every library whose update waits, carrying its
    /// variables over, and rewrites its boot-info entry; `ret` = libraries
    /// switched (0: none waited). Symbols looked up before must be looked
    /// up again once `BootInfo::lib_state`'s generation changed.
    pub const SWITCH: u32 = 0;
}

/// [`crate::Hypercall::Library`].
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct Library {
    /// A [`library_op`] value.
    pub op: u32,
    /// Reserved, zero.
    pub reserved: u32,
    /// Out: the operation's result, or a negative [`crate::errno`] value.
    pub ret: i64,
}
