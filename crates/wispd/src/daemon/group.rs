//! Group VMM processes (`wispd --vms-per-process N`): the VMs of one tenant
//! and one size may share a jailed VMM process, up to N to a process
//! (`wisp_vmm_process::group`). Thousands of idle VMs are then a few
//! hundred processes: fewer mappings of the shared image pages for the
//! kernel to walk, fewer stacks and page tables (`docs/benchmarks.md`,
//! density).
//!
//! A VM in a group is a VM like any other to the rest of the daemon: its
//! own id, directory (owned by the group's user id), record and control
//! socket (bound here, its listener handed to the group). Its end is
//! watched on a `wait` request left pending on its control socket, in a
//! pidfd's place; it is killed by a `kill` request, never by a signal (the
//! signal would end its neighbours). A group is only for what it can hold
//! safely: an image that cannot fork, no NIC, and no limits of the VM's
//! own (those are a control group's, which is the process's). A group
//! goes when its last VM is removed; a restarted daemon adopts a group and
//! its VMs, and gives it no new VMs.

use std::collections::HashMap;
use std::fs;
use std::os::fd::OwnedFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::process::Child;
use std::sync::Mutex;
use std::time::Duration;

use wisp_api::CreateVm;
use wisp_jail::JailFiles;
use wisp_vmm_process::proto::{self, Request};

use super::error::ActionError;
use super::process::{self, give_dir, new_vm_dir, kill_fd};
use super::quota;
use super::Daemon;
use crate::images::CachedImage;

/// One group VMM process.
pub struct Group {
    /// Its id (also its control group's and its directory's name).
    pub id: String,
    pub pid: u32,
    pub start: Option<u64>,
    pub uid: u32,
    pub dir: PathBuf,
    /// Whose VMs, and of which size.
    pub tenant: String,
    pub mem: u64,
    /// Most VMs it hosts.
    pub hosts: u32,
    /// VMs of it in the table, and places taken by creates in progress.
    pub members: usize,
    /// Adopted from a previous daemon (or failing): no new VMs.
    pub closed: bool,
    child: Option<Child>,
    pidfd: Option<OwnedFd>,
}

/// The groups, by id.
#[derive(Default)]
pub struct Groups {
    by_id: Mutex<HashMap<String, Group>>,
}

impl Groups {
    /// Whether a group runs under user id `uid` (not to be given away).
    pub fn holds_uid(&self, uid: u32) -> bool {
        self.by_id.lock().unwrap().values().any(|g| g.uid == uid)
    }

    /// Add an adopted group (closed to new VMs).
    pub(super) fn adopt(&self, g: Group) {
        self.by_id.lock().unwrap().insert(g.id.clone(), g);
    }

    /// The group `id` if it runs as process `pid` under `uid`.
    pub(super) fn matches(&self, id: &str, pid: u32, uid: u32) -> bool {
        self.by_id.lock().unwrap().get(id).is_some_and(|g| g.pid == pid && g.uid == uid)
    }

    /// One more VM of group `id` (an adopted VM).
    pub(super) fn join(&self, id: &str) {
        if let Some(g) = self.by_id.lock().unwrap().get_mut(id) {
            g.members += 1;
        }
    }
}

/// A place in a group taken for a VM being created.
pub struct Place {
    pub group: String,
    pub pid: u32,
    /// The group process's start time.
    pub start: Option<u64>,
    pub uid: u32,
    pub group_dir: PathBuf,
}

/// What the daemon makes for a VM of a group before it asks the group to
/// host it: its directory, files and control socket.
pub struct HostedDir {
    pub id: String,
    pub dir: PathBuf,
    pub files: JailFiles,
    pub listener: UnixListener,
}

/// Whether the VM `req` asks for (of image `image`) may go to a group.
pub fn groupable(req: &CreateVm, image: &CachedImage) -> bool {
    !image.image.forks() && !req.wants_nic() && req.memory.is_none() && req.cpus.is_none() && req.family_limit.is_none()
}

impl Daemon {
    /// Take a place for a VM of `tenant` and `mem` bytes: in an open group
    /// with room, else in a new one.
    pub(super) fn take_place(&self, tenant: &str, mem: u64) -> Result<Place, ActionError> {
        let place = |g: &Group| Place { group: g.id.clone(), pid: g.pid, start: g.start, uid: g.uid, group_dir: g.dir.clone() };
        {
            let mut groups = self.groups.by_id.lock().unwrap();
            let open = groups.values_mut().find(|g| !g.closed && g.tenant == tenant && g.mem == mem && g.members < g.hosts as usize);
            if let Some(g) = open {
                g.members += 1;
                return Ok(place(g));
            }
        }
        let n = self.cfg.vms_per_process;
        let limits = quota::family_limits(mem, None, None, Some(n));
        let cg = self.cgroups.as_ref().map(|c| (c, &limits));
        let mut w = process::spawn(&self.vms_dir(), &self.records, &self.uids, self.pidns.as_ref(), mem, cg, Some(n))
            .map_err(ActionError::Prepare)?;
        let uid = super::uids::dir_uid(&w.dir).unwrap_or(0);
        let g = Group {
            id: w.id.clone(),
            pid: w.pid,
            start: process::proc_start(w.pid),
            uid,
            dir: w.dir.clone(),
            tenant: tenant.to_string(),
            mem,
            hosts: n,
            members: 1,
            closed: false,
            child: w.child.take(),
            pidfd: w.pidfd.take(),
        };
        let p = place(&g);
        self.groups.by_id.lock().unwrap().insert(g.id.clone(), g);
        Ok(p)
    }

    /// A VM of group `id` is gone (removed, or its create failed): with the
    /// group's last VM the group goes too.
    pub(super) fn leave_group(&self, id: &str) {
        let gone = {
            let mut groups = self.groups.by_id.lock().unwrap();
            let Some(g) = groups.get_mut(id) else { return };
            g.members = g.members.saturating_sub(1);
            if g.members > 0 {
                return;
            }
            groups.remove(id)
        };
        if let Some(g) = gone {
            self.end_group(g);
        }
    }

    /// Stop group `g` (its VMs are gone), and remove its control group,
    /// directory and record.
    fn end_group(&self, mut g: Group) {
        let _ = proto::call(&g.dir.join("ctl.sock"), &Request::Shutdown, None, Some(Duration::from_secs(1)));
        if let Some(fd) = &g.pidfd {
            kill_fd(fd);
        }
        if let Some(c) = g.child.as_mut() {
            let _ = c.wait();
        }
        self.destroy_group(&g.id);
        let dir = g.dir.clone();
        drop(g);
        self.remove_dir(&dir);
    }

    /// Make VM directory, files and control socket for a VM of the group
    /// at `place`, owned by the group's user id.
    pub(super) fn hosted_dir(&self, place: &Place) -> Result<HostedDir, ActionError> {
        let (id, dir) = new_vm_dir(&self.vms_dir()).map_err(|e| ActionError::Prepare(e.into()))?;
        let made = (|| {
            let files = JailFiles::open(&dir)?;
            let listener = UnixListener::bind(dir.join("ctl.sock"))?;
            give_dir(&dir, place.uid).map_err(std::io::Error::other)?;
            Ok::<_, std::io::Error>((files, listener))
        })();
        match made {
            Ok((files, listener)) => Ok(HostedDir { id, dir, files, listener }),
            Err(e) => {
                let _ = fs::remove_dir_all(&dir);
                Err(ActionError::Vmm(e))
            }
        }
    }

    /// Watch a VM of a group: a `wait` left pending on its control socket
    /// (answered, or closed, when the VM or its group ends).
    pub(super) fn hosted_watch(dir: &std::path::Path) -> std::io::Result<OwnedFd> {
        let c = UnixStream::connect(dir.join("ctl.sock"))?;
        proto::send_line(&c, &Request::Wait, None)?;
        Ok(c.into())
    }

    /// Kill VM `id` of a group: a `kill` request (a signal would end the
    /// whole group).
    pub(super) fn kill_hosted(&self, dir: &std::path::Path) {
        let _ = proto::call(&dir.join("ctl.sock"), &Request::Kill, None, Some(Duration::from_secs(2)));
    }

    /// Adopt the group VMM process of record `rec` (closed to new VMs), if
    /// it is one of ours (as `adopt` checks any VMM process); else its
    /// record, directory and control group go.
    pub(super) fn adopt_group(&self, rec: super::record::Record, seen: &mut super::adopt::Seen) {
        let dir = self.vms_dir().join(&rec.id);
        if (super::uids::UID_BASE..super::uids::UID_BASE + super::uids::UID_COUNT).contains(&rec.uid) {
            self.uids.mark_used(rec.uid);
        }
        let owned = super::uids::dir_uid(&dir) == Some(rec.uid);
        match self.verified(&rec, &rec.id, seen).filter(|_| owned) {
            Some(pidfd) => {
                let g = Group {
                    id: rec.id.clone(),
                    pid: rec.pid,
                    start: rec.start,
                    uid: rec.uid,
                    dir,
                    tenant: String::new(),
                    mem: 0,
                    hosts: rec.hosts.unwrap_or(0),
                    members: 0,
                    closed: true,
                    child: None,
                    pidfd: Some(pidfd),
                };
                self.groups.adopt(g);
            }
            None => {
                eprintln!("wispd: group {}: not a group process of ours any more: record dropped", rec.id);
                self.records.forget(&rec.id);
                self.destroy_group(&rec.id);
                let _ = fs::remove_dir_all(&dir);
            }
        }
    }

    /// The watch of a running VM of adopted group `group`, if the record
    /// names that group's process and user id.
    pub(super) fn adopt_hosted(&self, group: &str, rec: &super::record::Record, dir: &std::path::Path) -> Option<OwnedFd> {
        if !self.groups.matches(group, rec.pid, rec.uid) {
            eprintln!("wispd: VM {}: its group {group} is gone", rec.id);
            return None;
        }
        self.groups.join(group);
        Daemon::hosted_watch(dir).inspect_err(|e| eprintln!("wispd: VM {}: cannot watch it: {e}", rec.id)).ok()
    }

    /// After adoption: groups none of whose VMs is listed go.
    pub(super) fn drop_empty_groups(&self) {
        let empty: Vec<Group> = {
            let mut groups = self.groups.by_id.lock().unwrap();
            let ids: Vec<String> = groups.values().filter(|g| g.members == 0).map(|g| g.id.clone()).collect();
            ids.iter().filter_map(|id| groups.remove(id)).collect()
        };
        for g in empty {
            self.end_group(g);
        }
    }
}
