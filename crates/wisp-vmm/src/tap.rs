//! Tap devices: open `/dev/net/tun` and attach to (or create) a tap
//! interface by name, in non-blocking mode, without packet-info headers,
//! with a virtio-net header before each frame (`IFF_VNET_HDR`, 10 bytes:
//! `TUNSETVNETHDRSZ`) and offloads (`TUNSETOFFLOAD`): checksums, TSO for
//! IPv4 and IPv6. So the host hands the VM its super-frames unsegmented
//! (up to 64 KiB, GSO/GRO) with partial checksums, and takes the VM's the
//! same way (`docs/networking.md`).
//!
//! All of it is done here, by whoever opens the tap (wispd, or `wisp run
//! --tap` before its jail closes): the settings belong to the tap, and the
//! sandboxed VMM process may not make these ioctls.

use std::fs::OpenOptions;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;

use wisp_abi::net::{offload, VNET_HDR_SIZE};

use crate::error::{Error, Result};

#[repr(C)]
struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

/// `struct ifreq` with its `ifr_qlen` member (an `int` after the name).
#[repr(C)]
struct IfReqQlen {
    name: [u8; libc::IFNAMSIZ],
    qlen: libc::c_int,
    _pad: [u8; 20],
}

/// Frames the host queues for a VM before it drops them: four rings'
/// worth. A tap's default (500) overflowed in 2 ms at 250k small datagrams
/// a second whenever the I/O thread waited for a CPU on a two-core host —
/// 0.2–0.4 % of 64-byte datagrams lost; with 1024 0.01–0.1 %, with 2000
/// none (`docs/networking.md`).
pub const TX_QUEUE_LEN: libc::c_int = 4 * wisp_abi::net::SLOTS as libc::c_int;

/// Raise the transmit queue of interface `name` (the host's queue towards
/// the VM) to [`TX_QUEUE_LEN`] if it is shorter. Best effort: it needs
/// `CAP_NET_ADMIN`, which whoever opens a tap has; a failure leaves the
/// queue as it was.
fn raise_tx_queue(name: &[u8; libc::IFNAMSIZ]) {
    // SAFETY: a plain socket call; the result is checked.
    let s = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if s < 0 {
        return;
    }
    // SAFETY: `s` is the socket just made, owned here.
    let s = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(s) };
    let mut req = IfReqQlen { name: *name, qlen: 0, _pad: [0; 20] };
    // SAFETY: SIOCGIFTXQLEN and SIOCSIFTXQLEN read and write a `struct
    // ifreq`, which `IfReqQlen` matches in size and layout (name, then the
    // `ifr_qlen` union member); `req` is a live local.
    unsafe {
        if libc::ioctl(s.as_raw_fd(), libc::SIOCGIFTXQLEN as _, &mut req as *mut IfReqQlen) == 0 && req.qlen < TX_QUEUE_LEN {
            req.qlen = TX_QUEUE_LEN;
            libc::ioctl(s.as_raw_fd(), libc::SIOCSIFTXQLEN as _, &mut req as *mut IfReqQlen);
        }
    }
}

/// An open tap and the offloads it has.
#[derive(Debug)]
pub struct Tap {
    /// The descriptor (non-blocking, close-on-exec).
    pub fd: OwnedFd,
    /// The offloads enabled, as `wisp_abi::net::offload` bits (what the
    /// guest may ask of it).
    pub offloads: u64,
}

/// The offloads tried, best first: (TUNSETOFFLOAD bits, the guest's bits).
const OFFLOADS: [(libc::c_uint, u64); 3] = [
    (libc::TUN_F_CSUM | libc::TUN_F_TSO4 | libc::TUN_F_TSO6, offload::CSUM | offload::TSO4),
    (libc::TUN_F_CSUM, offload::CSUM),
    (0, 0),
];

/// Open the tap interface `name` (created if it does not exist and the
/// caller may create interfaces), with a virtio-net header and the
/// offloads the kernel gives (checksum, TSO4, TSO6; fewer on a kernel
/// that refuses them).
pub fn open_tap(name: &str) -> Result<Tap> {
    if name.is_empty() || name.len() >= libc::IFNAMSIZ || name.bytes().any(|b| b == 0 || b == b'/') {
        return Err(Error::Host("tap name", std::io::Error::other(format!("invalid interface name '{name}'"))));
    }
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open("/dev/net/tun")
        .map_err(|e| Error::Host("open /dev/net/tun", e))?;
    let flags = (libc::IFF_TAP | libc::IFF_NO_PI | libc::IFF_VNET_HDR) as libc::c_short;
    let mut req = IfReq { name: [0; libc::IFNAMSIZ], flags, _pad: [0; 22] };
    req.name[..name.len()].copy_from_slice(name.as_bytes());
    // SAFETY: TUNSETIFF reads and writes a `struct ifreq`, which `IfReq`
    // matches in size and layout (name, then the flags union member); the
    // descriptor is a freshly opened /dev/net/tun.
    let r = unsafe { libc::ioctl(f.as_raw_fd(), libc::TUNSETIFF as _, &mut req as *mut IfReq) };
    if r < 0 {
        return Err(Error::Host("attach tap", std::io::Error::last_os_error()));
    }
    let size = VNET_HDR_SIZE as libc::c_int;
    // SAFETY: TUNSETVNETHDRSZ reads one `int` through the pointer, a live
    // local; the descriptor is the tap attached above.
    let r = unsafe { libc::ioctl(f.as_raw_fd(), libc::TUNSETVNETHDRSZ as _, &size as *const libc::c_int) };
    if r < 0 {
        return Err(Error::Host("tap virtio-net header size", std::io::Error::last_os_error()));
    }
    let mut offloads = None;
    for (bits, ours) in OFFLOADS {
        // SAFETY: TUNSETOFFLOAD takes its argument by value (an unsigned
        // long of TUN_F_* bits); the descriptor is the tap attached above.
        let r = unsafe { libc::ioctl(f.as_raw_fd(), libc::TUNSETOFFLOAD as _, bits as libc::c_ulong) };
        if r == 0 {
            offloads = Some(ours);
            break;
        }
    }
    let offloads = offloads.ok_or_else(|| Error::Host("tap offloads", std::io::Error::last_os_error()))?;
    raise_tx_queue(&req.name);
    Ok(Tap { fd: OwnedFd::from(f), offloads })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_names_are_refused_before_any_ioctl() {
        for bad in ["", "a/b", "0123456789abcdef", "a\0b"] {
            assert!(open_tap(bad).is_err(), "{bad:?}");
        }
    }
}
