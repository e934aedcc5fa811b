//! The tap backend ([`super::backend::Backend`]): frames between a tap
//! (opened with `IFF_VNET_HDR`, see [`crate::tap`]) and the rings in guest
//! RAM, without copying payloads: one `writev` per
//! TX frame (the monitor's virtio-net header, its copy of the frame's
//! headers, then the rest of the frame straight from the guest's slots)
//! and one `readv` per RX frame (the host's header into the monitor's
//! buffer, the frame straight into the free slots).
//!
//! The iovecs point into guest RAM through raw pointers only
//! ([`RamView::host_ptr`], bounds-checked): no Rust reference to memory
//! the guest may change at any time is ever made; the kernel reads or
//! writes it. What the monitor decides on (identity, header) was checked
//! on its private copy before (`ring::check`).

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use wisp_abi::net::{VnetHdr, VNET_HDR_SIZE};
use zerocopy::{FromBytes, IntoBytes};

use super::backend::Backend;
use super::ring::{Ranges, RxSpace, TxFrame};
use crate::memory::RamView;

fn iovec(ptr: *mut u8, len: usize) -> libc::iovec {
    libc::iovec { iov_base: ptr.cast(), iov_len: len }
}

/// iovecs over `ranges` of guest RAM, after the ones in `out[..at]`;
/// returns how many `out` now holds.
fn guest_iovecs(ram: &RamView, ranges: &Ranges, out: &mut [libc::iovec; 5], mut at: usize) -> Result<usize, String> {
    for &(addr, len) in ranges.iter().filter(|r| r.1 > 0) {
        out[at] = iovec(ram.host_ptr(addr, len).map_err(|e| e.to_string())?, len);
        at += 1;
    }
    Ok(at)
}

/// A tap opened with a virtio-net header, as a NIC's backend.
pub struct Tap {
    fd: OwnedFd,
}

impl Tap {
    /// The backend on tap descriptor `fd` (see [`crate::tap::open_tap`]).
    pub fn new(fd: OwnedFd) -> Tap {
        Tap { fd }
    }
}

impl Backend for Tap {
    fn send(&self, ram: &RamView, f: &TxFrame) -> Result<usize, String> {
        send(self.fd.as_fd(), ram, f)
    }

    fn recv(&self, ram: &RamView, space: &RxSpace) -> Option<(VnetHdr, usize)> {
        recv(self.fd.as_fd(), ram, space)
    }

    fn ready_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// Send `f` to the tap. A full tap queue drops the frame, as a NIC would
/// (the result says so; the caller carries on).
fn send(tap: BorrowedFd<'_>, ram: &RamView, f: &TxFrame) -> Result<usize, String> {
    let vnet = f.vnet;
    let mut iov = [iovec(std::ptr::null_mut(), 0); 5];
    iov[0] = iovec(vnet.as_bytes().as_ptr().cast_mut(), VNET_HDR_SIZE);
    iov[1] = iovec(f.head.as_ptr().cast_mut(), f.head.len());
    let n = guest_iovecs(ram, &f.rest, &mut iov, 2)?;
    // SAFETY: every iovec describes readable memory that outlives the
    // call: `vnet` and `f.head` are the monitor's own (the kernel only
    // reads through iovecs given to writev, so the `*mut` casts are never
    // written through), the others lie inside guest RAM (checked by
    // `host_ptr`), mapped for as long as `ram` lives. `n` ≤ 5 entries.
    let r = unsafe { libc::writev(tap.as_raw_fd(), iov.as_ptr(), n as libc::c_int) };
    if r < 0 {
        return Err(std::io::Error::last_os_error().to_string());
    }
    Ok(r as usize)
}

/// Read one frame from the tap into `space`: its header (the host's) and
/// length, a length over the room if it was longer (then it is cut), or
/// `None` if there is none.
fn recv(tap: BorrowedFd<'_>, ram: &RamView, space: &RxSpace) -> Option<(VnetHdr, usize)> {
    let mut vnet = [0u8; VNET_HDR_SIZE];
    let mut extra = [0u8; 1];
    let mut iov = [iovec(std::ptr::null_mut(), 0); 5];
    iov[0] = iovec(vnet.as_mut_ptr(), VNET_HDR_SIZE);
    let mut n = guest_iovecs(ram, &space.ranges, &mut iov, 1).ok()?;
    // One byte more than the room: a frame that does not fit shows.
    iov[n] = iovec(extra.as_mut_ptr(), 1);
    n += 1;
    // SAFETY: every iovec describes writable memory that outlives the
    // call: `vnet` and `extra` are locals, the others lie inside guest RAM
    // (checked by `host_ptr`), mapped for as long as `ram` lives, in free
    // RX slots that the guest does not read until the monitor publishes
    // them. `n` ≤ 5 entries.
    let r = unsafe { libc::readv(tap.as_raw_fd(), iov.as_ptr(), n as libc::c_int) };
    let len = usize::try_from(r).ok()?.checked_sub(VNET_HDR_SIZE)?;
    Some((VnetHdr::read_from_bytes(&vnet).ok()?, len))
}
