//! Exit watching: one epoll over every VMM process's pidfd (and every
//! family's uplink), one thread; a VMM process that ends is recorded as an
//! exited VM and its waiters are woken. Nothing on this thread waits for a
//! VMM process: a fork note read from an uplink is handed to the fork
//! registration thread (`family`), and `exit.json` is read without
//! blocking.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;
use std::process::Child;
use std::sync::Arc;

use rustix::event::epoll;
use wisp_api::{ExitInfo, VmInfo};

use super::family::ForkQueue;
use super::process::{kill_fd, read_exit, Worker};
use super::table::Entry;
use super::Daemon;

/// Epoll tokens of uplinks carry this bit (pidfds carry the bare id).
const UPLINK: u64 = 1 << 63;

/// Ids are 12 hex digits: the token is the id.
fn token(id: &str) -> u64 {
    u64::from_str_radix(id, 16).unwrap_or(0)
}

impl Daemon {
    /// Record a VM held by `worker`, a VMM process this daemon spawned,
    /// without watching the process yet: a create
    /// watches it ([`Daemon::watch_pid`]) once the start is sent, off the
    /// path to the guest (a pidfd that became readable meanwhile is
    /// reported when added: epoll is level-triggered).
    pub(super) fn insert_unwatched(&self, info: VmInfo, worker: Worker) {
        let ns_pid = worker.pidfd.as_ref().and(worker.ns_pid);
        self.table_insert(info, worker.dir, worker.child, worker.pidfd, ns_pid);
    }

    /// Watch VM `id`'s VMM process (see [`Daemon::insert_unwatched`]).
    pub(super) fn watch_pid(&self, id: &str) {
        if let Some(fd) = self.vms.lock().by_id.get(id).and_then(|e| e.pidfd.as_ref()) {
            let _ = epoll::add(&self.epoll, fd.as_fd(), epoll::EventData::new_u64(token(id)), epoll::EventFlags::IN);
        }
    }

    /// Record a VM whose VMM process `pidfd` refers to (checked to be its
    /// VMM process by the caller; none if it is gone, and then the VM is
    /// recorded as exited at once) and watch it.
    pub(super) fn insert_watched(&self, info: VmInfo, dir: PathBuf, child: Option<Child>, pidfd: Option<OwnedFd>) {
        let ns_pid = pidfd.as_ref().and_then(|_| crate::procfs::ns_pid(info.pid));
        self.insert_with(info, dir, child, pidfd, ns_pid)
    }

    fn insert_with(&self, info: VmInfo, dir: PathBuf, child: Option<Child>, pidfd: Option<OwnedFd>, ns_pid: Option<u32>) {
        let id = info.id.clone();
        self.table_insert(info, dir, child, pidfd, ns_pid);
        self.watch_pid(&id);
    }

    /// Put a VM in the table (a VM without a process, and no exit yet, is
    /// recorded as exited at once).
    fn table_insert(&self, info: VmInfo, dir: PathBuf, child: Option<Child>, pidfd: Option<OwnedFd>, ns_pid: Option<u32>) {
        let gone = pidfd.is_none() && info.exit.is_none();
        let id = info.id.clone();
        let mut e = Entry::new(info, dir, child, pidfd);
        e.ns_pid = ns_pid;
        self.vms.lock().insert(e);
        if gone {
            self.on_exit(&id);
        }
    }

    /// Watch family `root`'s uplink for forked VMM processes.
    pub(super) fn watch_uplink(&self, root: &str, fd: BorrowedFd<'_>) {
        let _ = epoll::add(&self.epoll, fd, epoll::EventData::new_u64(UPLINK | token(root)), epoll::EventFlags::IN);
    }

    /// SIGKILL VM `id`'s VMM process, through its pidfd: never a pid, which
    /// may be another process's by now (a VM whose process has been seen to
    /// end has no pidfd any more).
    /// A VM of a group is killed by a `kill` request instead: its pidfd's
    /// place holds the pending `wait`, and a signal would end the group.
    pub(super) fn kill_process(&self, id: &str) {
        let t = self.vms.lock();
        let Some(e) = t.by_id.get(id) else { return };
        if e.info.group.is_some() {
            let dir = e.dir.clone();
            drop(t);
            super::lifecycle::ask_kill(&dir);
        } else if let Some(fd) = e.pidfd.as_ref() {
            kill_fd(fd);
        }
    }

    /// Stop watching a pidfd or an uplink.
    pub(super) fn unwatch(&self, fd: BorrowedFd<'_>) {
        let _ = epoll::delete(&self.epoll, fd);
    }

    /// A VMM process ended: record how (in the table and in its record),
    /// reap it, wake waiters.
    fn on_exit(&self, id: &str) {
        let mut t = self.vms.lock();
        let Some(e) = t.set_exited(id) else { return };
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
            // What the VMM process left is advisory: anything but a
            // well-formed status is a process that died.
            let exit = read_exit(&e.dir).unwrap_or_else(|| ExitInfo {
                code: wisp_vmm_process::exit::KILLED.into(),
                reason: "the VMM process died".into(),
            });
            e.info.exit = Some(exit);
        }
        let ip = e.info.ip.clone();
        let root = super::table::root_of(&e.info).to_string();
        let removing = e.removing;
        // A recycled run gives its place back as it ends: its group's
        // capacity is runs at once, not runs listed.
        let release = e.info.group.clone().filter(|g| !e.released && self.groups.recycling(g));
        e.released |= release.is_some();
        drop(t);
        if let Some(g) = release {
            self.leave_group(&g);
        }
        self.links.remove(id);
        self.net.free(ip.as_deref());
        self.net.release(id);
        self.family_ended(&root);
        self.vms.notify_exit();
        if removing {
            return;
        }
        if let Err(err) = self.save(id) {
            eprintln!("wispd: VM {id}: cannot record its exit: {err}");
        }
    }

    /// The exit watcher: one thread, one epoll over every VMM process's
    /// pidfd and family uplink. Starts the fork registration thread.
    pub fn watch_loop(self: Arc<Self>) {
        let forks = match ForkQueue::start(self.clone()) {
            Ok(q) => Some(q),
            Err(e) => {
                eprintln!("wispd: cannot start the fork registration thread ({e}): forked VMs will not be registered");
                None
            }
        };
        let mut events: Vec<epoll::Event> = Vec::with_capacity(256);
        loop {
            events.clear();
            if epoll::wait(&self.epoll, rustix::buffer::spare_capacity(&mut events), None).is_err() {
                continue;
            }
            for ev in events.iter() {
                let t = ev.data.u64();
                if t & UPLINK != 0 {
                    self.on_uplink(&format!("{:012x}", t & !UPLINK), forks.as_ref());
                } else {
                    self.on_exit(&format!("{t:012x}"));
                }
            }
        }
    }
}
