//! Fork adoption: a guest under the daemon that forks leaves a copy of its
//! VMM process holding the child VM. That process asks the daemon, over the
//! family's uplink, to make it a VM of the toolstack, and takes the
//! directory, files and control socket the daemon sends back.
//!
//! The uplink sits in one slot ([`set_uplink`]) for the VM's life: its
//! descriptor number never changes, and a process forked from this one
//! inherits it. A daemon that re-adopted the VM after a restart sends a new
//! one ([`replace_uplink`], the control thread), which takes the old one's
//! place in one step (`dup3` onto its number): the next fork announces
//! itself to the new daemon.

use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixListener;
use std::sync::{Arc, OnceLock};

use wisp_jail::JailFiles;

use crate::control::spawn_server;
use crate::proto::{recv_packet, send_packet, ForkKit, ForkNote, WorkerState};
use crate::state::Shared;

/// The family's uplink to the daemon, once a VM that may fork runs. Read
/// without a lock (a forked child may not take one the parent's other
/// threads held), and never taken out: only what it refers to changes.
static UPLINK: OnceLock<OwnedFd> = OnceLock::new();

/// Keep `fd` as the family's uplink (once, when the VM starts); the slot.
pub(crate) fn set_uplink(fd: OwnedFd) -> Option<std::os::fd::BorrowedFd<'static>> {
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

/// In a forked VMM process: tell the daemon through the family's uplink,
/// take the child VM's files and control socket it sends back,
/// and serve them with fresh state (the parent's may be locked by threads
/// that did not survive the fork).
pub(crate) fn become_child_vm(vm: &wisp_vmm::Vm) -> Result<Arc<Shared>, String> {
    let uplink = UPLINK.get().ok_or("no uplink to the daemon")?;
    let (mine, theirs) = rustix::net::socketpair(
        rustix::net::AddressFamily::UNIX,
        rustix::net::SocketType::SEQPACKET,
        rustix::net::SocketFlags::CLOEXEC,
        None,
    )
    .map_err(|e| format!("socketpair: {e}"))?;
    let note = ForkNote { child_pid: std::process::id(), parent_pid: vm.forked_from() as u32 };
    send_packet(uplink.as_fd(), &note, &[theirs.as_fd()]).map_err(|e| format!("tell the daemon: {e}"))?;
    drop(theirs);
    let mut fds = [rustix::event::PollFd::new(&mine, rustix::event::PollFlags::IN)];
    let ts = rustix::time::Timespec { tv_sec: 10, tv_nsec: 0 };
    if rustix::event::poll(&mut fds, Some(&ts)).map_err(|e| e.to_string())? == 0 {
        return Err("the daemon did not answer".into());
    }
    let (msg, fds) = recv_packet(mine.as_fd()).map_err(|e| format!("daemon's answer: {e}"))?;
    let kit: ForkKit = serde_json::from_slice(&msg).map_err(|e| format!("daemon's answer: {e}"))?;
    if let Some(e) = kit.error {
        return Err(e);
    }
    let [exit, console, listener]: [OwnedFd; 3] = fds.try_into().map_err(|_| "the daemon's answer lacks descriptors")?;
    let files = JailFiles::from_files(File::from(exit), File::from(console));
    let shared = Shared::new(files, WorkerState::Running, Some(vm.control()));
    let listener = UnixListener::from(listener);
    spawn_server(&shared, move || Some(listener))?;
    Ok(shared)
}
