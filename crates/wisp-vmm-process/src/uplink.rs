//! The family's uplink to the daemon: one slot for the VM's life. Its
//! descriptor number never changes, and a process forked from this one
//! inherits it (`fork.rs` announces a forked child on it). A daemon that
//! re-adopted the VM after a restart sends a new one ([`replace_uplink`],
//! the control thread), which takes the old one's place in one step (`dup3`
//! onto its number): the next fork announces itself to the new daemon.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::OnceLock;

/// The family's uplink to the daemon, once a VM that may fork runs. Read
/// without a lock (a forked child may not take one the parent's other
/// threads held), and never taken out: only what it refers to changes.
static UPLINK: OnceLock<OwnedFd> = OnceLock::new();

/// Keep `fd` as the family's uplink (once, when the VM starts); the slot.
pub(crate) fn set_uplink(fd: OwnedFd) -> Option<BorrowedFd<'static>> {
    let _ = UPLINK.set(fd);
    UPLINK.get().map(|f| f.as_fd())
}

/// Put `new`, sent by the daemon, in the uplink's place: it must be a Unix
/// SEQPACKET socket (what the uplink is, and what a forked child sends its
/// note on); the VM must have an uplink (may fork).
pub(crate) fn replace_uplink(new: OwnedFd) -> Result<(), String> {
    use rustix::net::{sockopt, AddressFamily, SocketType};
    let slot = UPLINK.get().ok_or(crate::proto::NO_FORK)?;
    let kind = (sockopt::socket_domain(&new), sockopt::socket_type(&new));
    if !matches!(kind, (Ok(AddressFamily::UNIX), Ok(SocketType::SEQPACKET))) {
        return Err("an uplink must be a Unix SEQPACKET socket".into());
    }
    wisp_vmm::replace_fd(slot, new.as_fd()).map_err(|e| format!("uplink: {e}"))
}

/// The uplink, if this VM has one (it may fork).
pub(crate) fn get() -> Option<&'static OwnedFd> {
    UPLINK.get()
}
