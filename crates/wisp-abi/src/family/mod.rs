//! Family IPC: the argument block of [`crate::Hypercall::Family`], its
//! operations, flags, signal numbers and wait statuses.
//!
//! VMs forked from one root form a *family*; IPC works only inside it. A
//! VM's pid is *family-local*: the root's is 1, each fork gives the child
//! the next number, and no pid names two members or zombies at once (after
//! `i32::MAX` the count starts again at 2, skipping pids in use). Every pid
//! the ABI carries (fork's result, GETPID, KILL, WAIT) is one; a pid no
//! member of the caller's family has is `ESRCH`, so nothing outside the
//! family — another family's VM, a host process — can be named or probed.
//! Descriptors (pipe ends) belong to one VM and are inherited by fork;
//! message queues and shared-memory segments are named by keys in a
//! namespace of the family's own.
//!
//! Every call copies data between guest RAM and monitor-owned buffers:
//! buffers must lie in guest RAM. Blocking calls park the vCPU in the
//! monitor (no CPU used) until they can complete, unless [`flags::NOWAIT`]
//! is set; a stop request ends the wait with `EINTR`. Every call returns
//! the signals that were pending for the caller in [`Call::signals`] (and
//! clears them): the library OS runs their handlers.

use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

pub mod rings;

/// Argument block of the family hypercall.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, FromBytes, IntoBytes, Immutable, KnownLayout)]
pub struct Call {
    /// One of [`op`].
    pub op: u32,
    /// [`flags`] bits.
    pub flags: u32,
    /// Operands; their meaning is listed with each [`op`].
    pub a: [u64; 4],
    /// Out: the result (`>= 0`) or a negative errno.
    pub ret: i64,
    /// Out: a second result, where the operation has one.
    pub ret2: u64,
    /// Out: pending signals, taken by this call (bit `n` = signal `n`).
    pub signals: u64,
}

/// Operations (`Call::op`).
pub mod op {
    /// ret = own pid, ret2 = parent's pid (0 for a family's root, or once
    /// the parent ended).
    pub const GETPID: u32 = 0;
    /// Create a pipe: ret = read descriptor, ret2 = write descriptor.
    pub const PIPE: u32 = 1;
    /// Close descriptor a[0].
    pub const CLOSE: u32 = 2;
    /// Read up to a[2] bytes from descriptor a[0] into guest address a[1];
    /// ret = bytes read, 0 at end of file (no writer left).
    pub const READ: u32 = 3;
    /// Write a[2] bytes from guest address a[1] to descriptor a[0];
    /// ret = bytes written (all of them unless non-blocking).
    pub const WRITE: u32 = 4;
    /// Send signal a[1] (0: only check) to VM a[0], a member of the
    /// caller's family (`ESRCH` for a pid no member has).
    pub const KILL: u32 = 5;
    /// Wait for child a[0] (as i64; -1 = any child) to end:
    /// ret = its pid, ret2 = its wait status (see [`status`]).
    pub const WAIT: u32 = 6;
    /// Message queue for key a[0] (0 = private) with [`flags`] a[1]: ret = id.
    pub const MSGGET: u32 = 7;
    /// Send a[2] bytes at guest address a[1] with type a[3] (> 0) to queue a[0].
    pub const MSGSND: u32 = 8;
    /// Receive into guest address a[1] (a[2] bytes) from queue a[0] the first
    /// message of type a[3] (as i64: 0 = any, > 0 = that type, < 0 = lowest
    /// type up to its absolute value): ret = length, ret2 = its type.
    pub const MSGRCV: u32 = 9;
    /// Remove queue a[0]; waiters get `EIDRM`.
    pub const MSGRMID: u32 = 10;
    /// Shared-memory segment for key a[0] of a[2] bytes with [`flags`] a[1]:
    /// ret = id.
    pub const SHMGET: u32 = 11;
    /// Attach segment a[0]: ret = its guest address (in the window at
    /// [`crate::layout::SHM_BASE`]), ret2 = its size.
    pub const SHMAT: u32 = 12;
    /// Detach the segment attached at guest address a[0].
    pub const SHMDT: u32 = 13;
    /// Mark segment a[0] for removal once no VM has it attached.
    pub const SHMRMID: u32 = 14;
    /// Only take the pending signals (in `Call::signals`).
    pub const SIGNALS: u32 = 15;
    /// Park until a signal is pending (or a stop request): ret = `EINTR`,
    /// with the signals taken in `Call::signals`.
    pub const PAUSE: u32 = 16;
    /// Map the family's IPC page ([`rings`]) into this VM: ret = this VM's
    /// cell index in it, ret2 = its guest address ([`rings::RINGS_GPA`]).
    /// `ENOSYS` from a monitor without it (the guest then uses the calls
    /// above only). Again after a fork: the child's index differs.
    pub const RINGS: u32 = 17;
    /// Wake what sleeps in the monitor on the rings page: a[0] = 0 wakes the
    /// members waiting in a family call (pipe a[1]'s sleepers among them),
    /// a[0] = 1 wakes the member of cell a[1] (a signal was raised for it).
    pub const WAKE: u32 = 18;
    /// Descriptor a[0]'s pipe: ret = its ring index in [`rings::Rings::pipes`],
    /// ret2 = the end (0 read, 1 write).
    pub const FDRING: u32 = 19;
}

/// `Call::flags` bits, and the flag operand of MSGGET/SHMGET.
pub mod flags {
    /// Do not block: `EAGAIN` (pipes, msgsnd), `ENOMSG` (msgrcv) or, for
    /// WAIT, ret = 0 when no child has ended yet (WNOHANG).
    pub const NOWAIT: u32 = 1;
    /// MSGRCV: truncate a message longer than the buffer instead of `E2BIG`.
    pub const NOERROR: u32 = 2;
    /// MSGGET/SHMGET operand: create the object if the key has none.
    pub const IPC_CREAT: u64 = 0o1000;
    /// MSGGET/SHMGET operand with `IPC_CREAT`: fail with `EEXIST` if it exists.
    pub const IPC_EXCL: u64 = 0o2000;
}

/// Signal numbers (Linux's).
pub mod signal {
    pub const SIGHUP: u32 = 1;
    pub const SIGINT: u32 = 2;
    pub const SIGKILL: u32 = 9;
    pub const SIGUSR1: u32 = 10;
    pub const SIGSEGV: u32 = 11;
    pub const SIGUSR2: u32 = 12;
    pub const SIGPIPE: u32 = 13;
    pub const SIGTERM: u32 = 15;
    pub const SIGCHLD: u32 = 17;
    /// Highest signal number.
    pub const MAX: u32 = 63;
}

/// Wait statuses, encoded as on Unix.
pub mod status {
    /// Status of a VM that exited with `code`.
    pub const fn exited(code: i32) -> u64 {
        ((code as u64) & 0xff) << 8
    }
    /// Status of a VM ended by signal `sig` (a fault is `SIGSEGV`, a kill
    /// by the toolstack or the family `SIGKILL`).
    pub const fn signaled(sig: u32) -> u64 {
        (sig & 0x7f) as u64
    }
    /// `Some(code)` if the VM exited normally.
    pub const fn exit_code(s: u64) -> Option<i32> {
        if s & 0x7f == 0 {
            Some(((s >> 8) & 0xff) as i32)
        } else {
            None
        }
    }
    /// `Some(sig)` if the VM was ended by a signal.
    pub const fn term_signal(s: u64) -> Option<u32> {
        if s & 0x7f != 0 {
            Some((s & 0x7f) as u32)
        } else {
            None
        }
    }
}

/// Limits of one family (the monitor may set lower ones).
pub mod limits {
    /// VMs alive (or not yet waited for) in one family, root included.
    pub const MAX_MEMBERS: usize = 64;
    /// Open descriptors per VM.
    pub const MAX_FDS: usize = 64;
    /// Pipes per family.
    pub const MAX_PIPES: usize = 64;
    /// Bytes buffered in one pipe.
    pub const PIPE_CAPACITY: usize = 16 * 1024;
    /// Writes up to this size are atomic.
    pub const PIPE_BUF: usize = 4096;
    /// Message queues per family.
    pub const MAX_QUEUES: usize = 16;
    /// Bytes queued in one message queue.
    pub const QUEUE_BYTES: usize = 16 * 1024;
    /// Messages queued in one message queue.
    pub const QUEUE_MESSAGES: usize = 128;
    /// Largest message.
    pub const MSG_MAX: usize = 8192;
    /// Shared-memory segments per family.
    pub const MAX_SEGMENTS: usize = 32;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_round_trip() {
        assert_eq!(status::exit_code(status::exited(3)), Some(3));
        assert_eq!(status::term_signal(status::exited(3)), None);
        assert_eq!(status::term_signal(status::signaled(9)), Some(9));
        assert_eq!(status::exit_code(status::signaled(11)), None);
        assert_eq!(status::exit_code(status::exited(0)), Some(0));
    }

    #[test]
    fn call_block_layout() {
        assert_eq!(core::mem::size_of::<Call>(), 8 + 32 + 24);
    }
}
