//! Exit watching: one epoll over every VMM process's pidfd (and every
//! family's uplink), one thread; a VMM process that ends is recorded as an
//! exited VM and its waiters are woken.

use std::os::fd::{AsFd, BorrowedFd};
use std::path::PathBuf;
use std::process::Child;
use std::sync::Arc;

use rustix::event::epoll;
use rustix::process::{pidfd_open, Pid, PidfdFlags};
use wisp_api::{ExitInfo, VmInfo, VmState};

use super::process::read_exit;
use super::table::Entry;
use super::Daemon;
use crate::fsutil::write_atomic;

/// Epoll tokens of uplinks carry this bit (pidfds carry the bare id).
const UPLINK: u64 = 1 << 63;

/// Ids are 12 hex digits: the token is the id.
fn token(id: &str) -> u64 {
    u64::from_str_radix(id, 16).unwrap_or(0)
}

impl Daemon {
    /// Record a VM and watch its VMM process (a process already gone is
    /// recorded as exited at once).
    pub(super) fn insert(&self, info: VmInfo, dir: PathBuf, child: Option<Child>) {
        let pidfd = Pid::from_raw(info.pid as i32).and_then(|p| pidfd_open(p, PidfdFlags::empty()).ok());
        if let Some(fd) = &pidfd {
            let _ = epoll::add(&self.epoll, fd.as_fd(), epoll::EventData::new_u64(token(&info.id)), epoll::EventFlags::IN);
        }
        let gone = pidfd.is_none() && info.exit.is_none();
        let id = info.id.clone();
        self.vms.lock().insert(Entry::new(info, dir, child, pidfd));
        if gone {
            self.on_exit(&id);
        }
    }

    /// Watch family `root`'s uplink for forked VMM processes.
    pub(super) fn watch_uplink(&self, root: &str, fd: BorrowedFd<'_>) {
        let _ = epoll::add(&self.epoll, fd, epoll::EventData::new_u64(UPLINK | token(root)), epoll::EventFlags::IN);
    }

    /// Stop watching a pidfd or an uplink.
    pub(super) fn unwatch(&self, fd: BorrowedFd<'_>) {
        let _ = epoll::delete(&self.epoll, fd);
    }

    /// A VMM process ended: record how, reap it, wake waiters.
    fn on_exit(&self, id: &str) {
        let mut t = self.vms.lock();
        let Some(e) = t.by_id.get_mut(id) else { return };
        if let Some(fd) = e.pidfd.take() {
            self.unwatch(fd.as_fd());
        }
        if let Some(c) = e.child.as_mut() {
            let _ = c.wait();
        }
        e.child = None;
        e.ctl = None;
        e.forwards.clear();
        if e.info.exit.is_none() {
            let exit = read_exit(&e.dir).unwrap_or_else(|| {
                let x = ExitInfo { code: wisp_vmm_process::exit::KILLED.into(), reason: "the VMM process died".into() };
                let _ = write_atomic(&e.dir.join("exit.json"), &serde_json::to_vec(&x).unwrap_or_default());
                x
            });
            e.info.exit = Some(exit);
        }
        e.info.state = VmState::Exited;
        let ip = e.info.ip.clone();
        drop(t);
        self.net.free(ip.as_deref());
        self.vms.notify_exit();
    }

    /// The exit watcher: one thread, one epoll over every VMM process's pidfd.
    pub fn watch_loop(self: Arc<Self>) {
        let mut events: Vec<epoll::Event> = Vec::with_capacity(256);
        loop {
            events.clear();
            if epoll::wait(&self.epoll, rustix::buffer::spare_capacity(&mut events), None).is_err() {
                continue;
            }
            for ev in events.iter() {
                let t = ev.data.u64();
                if t & UPLINK != 0 {
                    self.on_uplink(&format!("{:012x}", t & !UPLINK));
                } else {
                    self.on_exit(&format!("{t:012x}"));
                }
            }
        }
    }
}
