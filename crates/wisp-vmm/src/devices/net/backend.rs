//! The host side of a NIC: where its frames go and come from. The I/O
//! thread (`net.rs`) and the ring processing (`ring/`) see only this
//! trait; [`super::tapio::Tap`] — a tap opened with a virtio-net header —
//! is the one backend today. Where the host has `/dev/vhost-net` (this
//! one does not: `../shared/MACHINE.md`), a vhost-net backend would hand
//! the kernel the ring's memory and take the I/O thread out of the path;
//! it would implement the same calls.
//!
//! Why one frame a call: a tap's `read` returns one frame and its `write`
//! takes one; the kernel's batched interface to a tap (`tun_recvmsg` with
//! `TUN_MSG_PTR`) is for vhost-net only. What moves many segments in one
//! call is GSO: a TCP super-frame of up to 64 KiB is one `writev` or
//! `readv` (`docs/networking.md` says what each step gave, and why not
//! `io_uring` in a seccomp sandbox).

use std::os::fd::BorrowedFd;

use wisp_abi::net::VnetHdr;

use super::ring::{RxSpace, TxFrame};
use crate::memory::RamView;

/// Where a NIC's frames go and come from on the host.
pub trait Backend: Send + Sync {
    /// Send `f` (the monitor's checked header, its copy of the frame's
    /// first bytes, the rest in guest RAM). An error drops the frame, as a
    /// NIC drops one its link refuses; the caller carries on.
    fn send(&self, ram: &RamView, f: &TxFrame) -> Result<usize, String>;

    /// Write one waiting frame into `space` (free RX slots in guest RAM):
    /// its header and length — a length over the room if it was longer
    /// (then it was cut) — or `None` if none waits.
    fn recv(&self, ram: &RamView, space: &RxSpace) -> Option<(VnetHdr, usize)>;

    /// A descriptor that polls readable while frames wait for the guest
    /// (the I/O thread sleeps on it; a parked vCPU may wake on it).
    fn ready_fd(&self) -> BorrowedFd<'_>;
}
