//! Tap devices: open `/dev/net/tun` and attach to (or create) a tap
//! interface by name, in non-blocking mode, without packet-info headers.

use std::fs::OpenOptions;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;

use crate::error::{Error, Result};

const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
const IFF_TAP: libc::c_short = 0x0002;
const IFF_NO_PI: libc::c_short = 0x1000;

#[repr(C)]
struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

/// Open the tap interface `name` (created if it does not exist and the
/// caller may create interfaces).
pub fn open_tap(name: &str) -> Result<OwnedFd> {
    if name.is_empty() || name.len() >= libc::IFNAMSIZ || name.bytes().any(|b| b == 0 || b == b'/') {
        return Err(Error::Host("tap name", std::io::Error::other(format!("invalid interface name '{name}'"))));
    }
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open("/dev/net/tun")
        .map_err(|e| Error::Host("open /dev/net/tun", e))?;
    let mut req = IfReq { name: [0; libc::IFNAMSIZ], flags: IFF_TAP | IFF_NO_PI, _pad: [0; 22] };
    req.name[..name.len()].copy_from_slice(name.as_bytes());
    // SAFETY: TUNSETIFF reads and writes a `struct ifreq`, which `IfReq`
    // matches in size and layout (name, then the flags union member); the
    // descriptor is a freshly opened /dev/net/tun.
    let r = unsafe { libc::ioctl(f.as_raw_fd(), TUNSETIFF as _, &mut req as *mut IfReq) };
    if r < 0 {
        return Err(Error::Host("attach tap", std::io::Error::last_os_error()));
    }
    Ok(OwnedFd::from(f))
}
