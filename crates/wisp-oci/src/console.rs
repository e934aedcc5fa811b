//! A container with a terminal (`process.terminal`, `podman run -t`): the
//! runtime makes a pseudo-terminal, sends its master to the engine's
//! `--console-socket` (SCM_RIGHTS, as runc does) and the container's
//! process takes the slave as its stdio and controlling terminal; the
//! guest's console is then the engine's terminal.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::Path;

/// Make the pseudo-terminal and hand its master to the engine at
/// `socket`; returns the slave.
pub fn open(socket: &Path) -> Result<OwnedFd, String> {
    let (mut master, mut slave) = (-1, -1);
    // SAFETY: openpty writes two descriptors; name, termios and winsize
    // may be null.
    if unsafe { libc::openpty(&mut master, &mut slave, std::ptr::null_mut(), std::ptr::null(), std::ptr::null()) } != 0 {
        return Err(format!("openpty: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: both were just returned by openpty and are owned here.
    let (master, slave) = unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
    let s = UnixStream::connect(socket).map_err(|e| format!("console socket {}: {e}", socket.display()))?;
    send_fd(&s, &master, b"/dev/ptmx").map_err(|e| format!("console socket {}: {e}", socket.display()))?;
    Ok(slave)
}

/// In the container's process (a new session): the terminal becomes its
/// stdio and controlling terminal.
pub fn take(tty: OwnedFd) -> Result<(), String> {
    let fd = tty.as_raw_fd();
    // SAFETY: TIOCSCTTY takes an int argument; dup2 takes two descriptors,
    // `fd` alive for the calls.
    unsafe {
        if libc::ioctl(fd, libc::TIOCSCTTY, 0) != 0 {
            return Err(format!("terminal: {}", std::io::Error::last_os_error()));
        }
        for to in 0..3 {
            if libc::dup2(fd, to) < 0 {
                return Err(format!("terminal: {}", std::io::Error::last_os_error()));
            }
        }
    }
    Ok(())
}

/// Send `fd` with `name` as the message's bytes (runc sends the master's
/// name).
fn send_fd(s: &UnixStream, fd: &OwnedFd, name: &[u8]) -> std::io::Result<()> {
    let raw = fd.as_raw_fd();
    // SAFETY: CMSG_SPACE computes a size from a constant.
    let space = unsafe { libc::CMSG_SPACE(size_of::<libc::c_int>() as u32) } as usize;
    let mut control = vec![0u8; space];
    let mut iov = libc::iovec { iov_base: name.as_ptr() as *mut _, iov_len: name.len() };
    // SAFETY: msghdr is plain data; every field used is set below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr() as *mut _;
    msg.msg_controllen = space;
    // SAFETY: the control buffer is CMSG_SPACE(int) bytes, room for one
    // header and one int, which CMSG_FIRSTHDR/CMSG_DATA point into; the
    // iovec and buffers outlive sendmsg.
    unsafe {
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(size_of::<libc::c_int>() as u32) as usize;
        std::ptr::write_unaligned(libc::CMSG_DATA(c) as *mut libc::c_int, raw);
        if libc::sendmsg(s.as_raw_fd(), &msg, 0) < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}
