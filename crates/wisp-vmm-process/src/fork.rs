//! Fork adoption: a guest under the daemon that forks leaves a copy of its
//! VMM process holding the child VM. That process asks the daemon, over the
//! family's uplink, to make it a VM of the toolstack, and takes the
//! directory, files and control socket the daemon sends back.
//!
//! The uplink itself: `uplink.rs`.

use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixListener;
use std::sync::Arc;

use wisp_jail::JailFiles;

use crate::control::spawn_server;
use crate::proto::{recv_packet, send_packet, ForkKit, ForkNote, WorkerState};
use crate::state::Shared;

/// In a forked VMM process: tell the daemon through the family's uplink,
/// take the child VM's files and control socket it sends back,
/// and serve them with fresh state (the parent's may be locked by threads
/// that did not survive the fork).
pub(crate) fn become_child_vm(vm: &wisp_vmm::Vm) -> Result<Arc<Shared>, String> {
    let uplink = crate::uplink::get().ok_or("no uplink to the daemon")?;
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
    let [exit, console, errors, listener]: [OwnedFd; 4] = fds.try_into().map_err(|_| "the daemon's answer lacks descriptors")?;
    let files = JailFiles::from_files(File::from(exit), File::from(console), File::from(errors));
    let shared = Shared::new(files, WorkerState::Running, Some(vm.control()));
    shared.state.lock().unwrap().libraries = vm.library_window();
    let listener = UnixListener::from(listener);
    spawn_server(&shared, move || Some(listener))?;
    Ok(shared)
}
