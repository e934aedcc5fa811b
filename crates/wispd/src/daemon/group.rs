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
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::{mpsc, Arc, Mutex};
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
    /// A recycling group (`wisp run --recycle`): its VMs are runs of the
    /// recycler on VMs it keeps at their ready point between runs
    /// (`wisp_vmm_process`'s `recycle.rs`).
    pub recycle: bool,
    child: Option<Child>,
    pidfd: Option<OwnedFd>,
    /// The next VM's directory, files, socket and connections, made ahead.
    next: Option<Slot>,
    /// Its last VM had a NIC: the next slot gets a tap made ahead too
    /// (a just-in-time service's VMs, `jit.rs`, come in runs).
    nic_ahead: bool,
}

/// What a VM of a group needs made before the group is asked to host it
/// (seven file-system calls, 1-2 ms on this host's ext4), made ahead by
/// the `slots` thread after each create: its directory, files and control
/// socket, the pending `wait` that watches it, and a connection to the
/// group's control socket for the `host` request.
pub struct Slot {
    pub hd: HostedDir,
    pub watch: OwnedFd,
    pub session: UnixStream,
}

impl Group {
    /// Whether it is an open group of this kind (recycling or not, tenant,
    /// size).
    fn open_of(&self, recycle: bool, tenant: &str, mem: u64) -> bool {
        !self.closed && self.recycle == recycle && self.tenant == tenant && self.mem == mem
    }

    /// Whether its process has ended or is ending: its pidfd is readable,
    /// or the session of its next VM's slot was closed (a process's
    /// descriptors close before it has quite ended).
    fn ended(&self) -> bool {
        use rustix::event::{poll, PollFd, PollFlags};
        let now = rustix::event::Timespec { tv_sec: 0, tv_nsec: 0 };
        let ready = |fd: BorrowedFd<'_>| {
            let mut fds = [PollFd::new(&fd, PollFlags::IN)];
            poll(&mut fds, Some(&now)).is_ok_and(|n| n > 0)
        };
        self.pidfd.as_ref().is_some_and(|fd| ready(fd.as_fd())) || self.next.as_ref().is_some_and(|s| ready(s.session.as_fd()))
    }
}

/// A group as the metrics show it.
pub(super) struct Census {
    pub id: String,
    pub pid: u32,
    pub start: Option<u64>,
    pub recycle: bool,
    /// Places taken (VMs, endpoints, creates in progress) and places in all.
    pub members: usize,
    pub hosts: u32,
}

/// The groups, by id, and the thread that makes their next VMs' slots.
#[derive(Default)]
pub struct Groups {
    by_id: Arc<Mutex<HashMap<String, Group>>>,
    slots: Mutex<Option<mpsc::Sender<String>>>,
    /// Kinds of group (recycling, tenant, size) a create is making a new
    /// group of: the creates that find none open meanwhile wait for it
    /// rather than make one each.
    making: Mutex<std::collections::HashSet<(bool, String, u64)>>,
    made: std::sync::Condvar,
    /// The VM network, for taps made ahead with slots.
    net: std::sync::OnceLock<Arc<super::net::VmNet>>,
}

/// A kind of group being made; the mark goes (and waiters look again)
/// when this is dropped, made or not.
struct Making<'a> {
    groups: &'a Groups,
    key: (bool, String, u64),
}

impl Drop for Making<'_> {
    fn drop(&mut self) {
        self.groups.making.lock().unwrap().remove(&self.key);
        self.groups.made.notify_all();
    }
}

impl Groups {
    /// Open groups whose next VM is prepared (its slot made, and a spare
    /// thread answering on its session).
    pub fn spares(&self) -> u32 {
        self.by_id.lock().unwrap().values().filter(|g| !g.closed && g.next.is_some()).count() as u32
    }

    /// Each group as the metrics show it (`scrape.rs`).
    pub(super) fn census(&self) -> Vec<Census> {
        let by_id = self.by_id.lock().unwrap();
        let seen = by_id.values().map(|g| Census { id: g.id.clone(), pid: g.pid, start: g.start, recycle: g.recycle, members: g.members, hosts: g.hosts });
        seen.collect()
    }

    /// Give the groups the VM network (once): slots get taps made ahead.
    pub(super) fn set_net(&self, net: Arc<super::net::VmNet>) {
        let _ = self.net.set(net);
    }

    /// Have group `id`'s next slot made (by the `slots` thread, started on
    /// first use; VM directories go in `vms_dir`).
    fn refill(&self, id: &str, vms_dir: &Path) {
        let mut tx = self.slots.lock().unwrap();
        if tx.is_none() {
            let (t, rx) = mpsc::channel::<String>();
            let (map, dir, net) = (self.by_id.clone(), vms_dir.to_path_buf(), self.net.get().cloned());
            let started = std::thread::Builder::new().name("slots".into()).spawn(move || slots_loop(&map, &dir, net.as_deref(), rx));
            if started.is_err() {
                return;
            }
            *tx = Some(t);
        }
        if let Some(t) = tx.as_ref() {
            let _ = t.send(id.to_string());
        }
    }

    /// Whether group `id` is a recycling group.
    pub(super) fn recycling(&self, id: &str) -> bool {
        self.by_id.lock().unwrap().get(id).is_some_and(|g| g.recycle)
    }

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

/// The `slots` thread: makes the slot of each group named on `rx` that
/// has none (a group gone or closed meanwhile gets none, and a slot made
/// for a group that went meanwhile is removed).
fn slots_loop(groups: &Mutex<HashMap<String, Group>>, vms_dir: &Path, net: Option<&super::net::VmNet>, rx: mpsc::Receiver<String>) {
    while let Ok(id) = rx.recv() {
        let want = groups.lock().unwrap().get(&id).filter(|g| !g.closed && g.next.is_none() && g.members < g.hosts as usize).map(|g| (g.dir.clone(), g.uid, g.nic_ahead));
        let Some((group_dir, uid, nic)) = want else { continue };
        match make_slot(vms_dir, &group_dir, uid) {
            Ok(slot) => {
                // The tap before the slot is seen: a create finds both or
                // makes its own.
                if let Some(net) = net.filter(|_| nic) {
                    net.prepare(&slot.hd.id);
                }
                let mut map = groups.lock().unwrap();
                match map.get_mut(&id).filter(|g| g.next.is_none()) {
                    Some(g) => g.next = Some(slot),
                    None => {
                        drop(map);
                        drop_slot(slot, net);
                    }
                }
            }
            Err(e) => eprintln!("wispd: group {id}: next VM's directory: {e}"),
        }
    }
}

/// A VM directory with its files and control socket for group user `uid`,
/// its watch, and a connection to the group's socket in `group_dir`.
fn make_slot(vms_dir: &Path, group_dir: &Path, uid: u32) -> Result<Slot, ActionError> {
    let hd = hosted_dir(vms_dir, uid)?;
    let made = (|| {
        let watch = hosted_watch(&hd.dir)?;
        let session = UnixStream::connect(group_dir.join("ctl.sock"))?;
        session.set_read_timeout(Some(process::SESSION_TIMEOUT))?;
        // Answered once the group's next VM thread is prepared and serves
        // the socket: the slot is ready then.
        proto::send_line(&session, &Request::Status, None)?;
        let r = proto::read_reply_line(&mut std::io::BufReader::new(&session))?;
        if !r.ok {
            return Err(std::io::Error::other(r.error.unwrap_or_default()));
        }
        Ok::<_, std::io::Error>((watch, session))
    })();
    match made {
        Ok((watch, session)) => Ok(Slot { hd, watch, session }),
        Err(e) => {
            let _ = fs::remove_dir_all(&hd.dir);
            Err(ActionError::Vmm(e))
        }
    }
}

impl Groups {
    /// A slot not used: its directory goes, and its tap if one was made.
    fn drop_slot(&self, slot: Slot) {
        drop_slot(slot, self.net.get().map(|n| &**n));
    }
}

/// [`Groups::drop_slot`], for the `slots` thread (which has the network, not the groups).
fn drop_slot(slot: Slot, net: Option<&super::net::VmNet>) {
    if let Some(net) = net {
        net.release(&slot.hd.id);
    }
    let _ = fs::remove_dir_all(&slot.hd.dir);
}

/// A place in a group taken for a VM being created.
pub struct Place {
    pub group: String,
    pub pid: u32,
    /// The group process's start time.
    pub start: Option<u64>,
    pub uid: u32,
    pub group_dir: PathBuf,
    /// Its slot, if one was made ahead.
    pub slot: Option<Slot>,
    /// The group has room for another VM after this one (so a slot for
    /// the next is worth making: a full group has no thread to answer).
    pub room: bool,
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
    !image.image.forks()
        && req.volumes.is_empty()
        && req.libs.is_empty()
        && req.memory.is_none()
        && req.cpus.is_none()
        && req.family_limit.is_none()
}

impl Daemon {
    /// Take a place for a VM of `tenant` and `mem` bytes: in an open group
    /// with room, else in a new one.
    pub(super) fn take_place(&self, tenant: &str, mem: u64, recycle: bool) -> Result<Place, ActionError> {
        let place = |g: &mut Group| Place {
            group: g.id.clone(),
            pid: g.pid,
            start: g.start,
            uid: g.uid,
            group_dir: g.dir.clone(),
            slot: g.next.take(),
            room: g.members < g.hosts as usize,
        };
        let open = || {
            let mut groups = self.groups.by_id.lock().unwrap();
            loop {
                // The fullest open group first: a group made ahead fills
                // after the one before it.
                let open = groups
                    .values_mut()
                    .filter(|g| g.open_of(recycle, tenant, mem) && g.members < g.hosts as usize)
                    .max_by_key(|g| g.members);
                match open {
                    // A group whose process has ended (killed, crashed)
                    // takes no more: the next candidate.
                    Some(g) if g.ended() => g.closed = true,
                    Some(g) => {
                        g.members += 1;
                        let p = place(g);
                        // Nearly full: the next group is to be made now, off
                        // any create's path (a group's start is tens of ms),
                        // once this lock (and the mark's) is let go.
                        let (left, nic) = (g.hosts as usize - g.members, g.nic_ahead);
                        let room = |o: &Group| o.open_of(false, tenant, mem) && o.hosts as usize - o.members > left;
                        let ahead = (!recycle && left <= (g.hosts as usize / 8).max(1) && !groups.values().any(room)).then_some(nic);
                        return Some((p, ahead));
                    }
                    None => return None,
                }
            }
        };
        // One new group of a kind at a time: creates that come meanwhile
        // wait for it (at most its start's time) and take places in it.
        let taken = |(p, ahead): (Place, Option<bool>)| {
            if let Some(nic) = ahead {
                self.make_group_ahead(tenant, mem, nic);
            }
            Ok(p)
        };
        let key = (recycle, tenant.to_string(), mem);
        let _making = loop {
            if let Some(found) = open() {
                return taken(found);
            }
            let mut making = self.groups.making.lock().unwrap();
            if making.contains(&key) {
                drop(self.groups.made.wait_timeout(making, Duration::from_secs(10)).unwrap());
                continue;
            }
            // (Looked at again under the mark's lock: a group made just now
            // was listed before its mark went.)
            if let Some(found) = open() {
                drop(making);
                return taken(found);
            }
            making.insert(key.clone());
            break Making { groups: &self.groups, key };
        };
        let mut g = self.make_group(tenant, mem, recycle)?;
        g.members = 1;
        let p = place(&mut g);
        self.groups.by_id.lock().unwrap().insert(g.id.clone(), g);
        Ok(p)
    }

    /// Make the next group of `tenant` and `mem` bytes (not recycling) on
    /// a thread of its own, unless one of the kind is being made; it joins
    /// the open groups empty, its first slot made ahead (with a tap if
    /// `nic`: the group before it had one ahead).
    fn make_group_ahead(&self, tenant: &str, mem: u64, nic: bool) {
        let Some(d) = self.me.get().and_then(std::sync::Weak::upgrade) else { return };
        let key = (false, tenant.to_string(), mem);
        {
            let mut making = self.groups.making.lock().unwrap();
            if !making.insert(key.clone()) {
                return;
            }
        }
        let tenant = tenant.to_string();
        let mark = key.clone();
        let started = std::thread::Builder::new().name("group-ahead".into()).spawn(move || {
            let _making = Making { groups: &d.groups, key };
            match d.make_group(&tenant, mem, false) {
                Ok(mut g) => {
                    g.nic_ahead = nic;
                    let id = g.id.clone();
                    let mut groups = d.groups.by_id.lock().unwrap();
                    // Its kind's VMs went meanwhile and left an empty group:
                    // at most one empty group of a kind (`leave_group`).
                    let empty = |o: &Group| o.open_of(false, &tenant, mem) && o.members == 0;
                    if groups.values().any(empty) {
                        drop(groups);
                        d.end_group(g);
                        return;
                    }
                    groups.insert(id.clone(), g);
                    drop(groups);
                    d.groups.refill(&id, &d.vms_dir());
                }
                Err(e) => eprintln!("wispd: the next group of tenant '{tenant}': {e}"),
            }
        });
        if started.is_err() {
            self.groups.making.lock().unwrap().remove(&mark);
            self.groups.made.notify_all();
        }
    }

    /// Start a group process of `tenant` and `mem` bytes (recycling or
    /// not), with no member yet.
    fn make_group(&self, tenant: &str, mem: u64, recycle: bool) -> Result<Group, ActionError> {
        let n = if recycle { self.cfg.recyclers_per_process } else { self.cfg.vms_per_process };
        let limits = quota::family_limits(mem, None, None, Some(n));
        let cg = self.cgroups.as_ref().map(|c| (c, &limits));
        let mut w = process::spawn(&self.vms_dir(), &self.records, &self.uids, self.pidns.as_ref(), mem, cg, Some(n), recycle)
            .map_err(ActionError::Prepare)?;
        // Its directory was given to its user id when it got ready.
        let Some(uid) = super::uids::dir_uid(&w.dir) else {
            self.discard_worker(w);
            return Err(ActionError::Prepare(process::SpawnError::NotReady("the group's directory has no owner".into())));
        };
        Ok(Group {
            id: w.id.clone(),
            pid: w.pid,
            start: process::proc_start(w.pid),
            uid,
            dir: w.dir.clone(),
            tenant: tenant.to_string(),
            mem,
            hosts: n,
            members: 0,
            closed: false,
            recycle,
            child: w.child.take(),
            pidfd: w.pidfd.take(),
            next: None,
            nic_ahead: false,
        })
    }

    /// Put the slot `place` took back in its group (an endpoint takes a
    /// place, not a VM's slot).
    pub(super) fn give_back_slot(&self, place: &mut Place) {
        let Some(slot) = place.slot.take() else { return };
        let mut groups = self.groups.by_id.lock().unwrap();
        match groups.get_mut(&place.group).filter(|g| g.next.is_none()) {
            Some(g) => g.next = Some(slot),
            None => {
                drop(groups);
                self.groups.drop_slot(slot);
            }
        }
    }

    /// A VM of group `id` is gone (removed, or its create failed): with the
    /// group's last VM the group goes too.
    pub(super) fn leave_group(&self, id: &str) {
        let gone = {
            let mut groups = self.groups.by_id.lock().unwrap();
            let Some(g) = groups.get_mut(id) else { return };
            g.members = g.members.saturating_sub(1);
            // An open group with no VM stays, unless another of its kind is
            // empty too: the kind's next VM (a function's next call, a
            // just-in-time service's next client) takes a place in it
            // instead of starting a group process (~15-20 ms), and a
            // recycling group's recyclers wait at their ready point.
            let (tenant, mem, recycle) = (g.tenant.clone(), g.mem, g.recycle);
            let keep = !g.closed && g.members == 0 && {
                let twin = |o: &Group| o.id != id && o.open_of(recycle, &tenant, mem) && o.members == 0;
                !groups.values().any(twin)
            };
            let g = groups.get_mut(id).expect("found above");
            if g.members > 0 || keep {
                // Room again in a group that was full: its next VM's slot.
                if !g.closed && g.next.is_none() && g.members + 1 == g.hosts as usize {
                    drop(groups);
                    self.groups.refill(id, &self.vms_dir());
                }
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
        if let Some(slot) = g.next.take() {
            self.groups.drop_slot(slot);
        }
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

    /// The slot for a VM of the group at `place` (with a NIC if `nic`):
    /// the one made ahead, else one made now. Either way the group's next
    /// one is made ahead (with a tap if this VM has a NIC).
    pub(super) fn take_slot(&self, place: &mut Place, nic: bool) -> Result<Slot, ActionError> {
        let slot = match place.slot.take() {
            Some(s) => Ok(s),
            None => make_slot(&self.vms_dir(), &place.group_dir, place.uid),
        };
        if let Some(g) = self.groups.by_id.lock().unwrap().get_mut(&place.group) {
            g.nic_ahead = nic;
        }
        if place.room {
            self.groups.refill(&place.group, &self.vms_dir());
        }
        slot
    }

    /// Group `id` failed to take a VM (its process gone or not answering):
    /// it takes no more.
    pub(super) fn close_group(&self, id: &str) {
        if let Some(g) = self.groups.by_id.lock().unwrap().get_mut(id) {
            g.closed = true;
        }
    }

    /// SIGKILL group `id`'s process (through its pidfd): every VM of it
    /// ends. For a group that does not answer; it takes no new VMs.
    pub(super) fn kill_group(&self, id: &str) {
        let mut groups = self.groups.by_id.lock().unwrap();
        if let Some(g) = groups.get_mut(id) {
            eprintln!("wispd: group {id} did not end a VM when asked: killed");
            g.closed = true;
            if let Some(fd) = &g.pidfd {
                kill_fd(fd);
            }
        }
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
                    recycle: false,
                    child: None,
                    pidfd: Some(pidfd),
                    next: None,
                    nic_ahead: false,
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
        hosted_watch(dir).inspect_err(|e| eprintln!("wispd: VM {}: cannot watch it: {e}", rec.id)).ok()
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

/// Make a VM directory in `vms_dir` with its files and control socket,
/// owned by group user `uid`.
fn hosted_dir(vms_dir: &Path, uid: u32) -> Result<HostedDir, ActionError> {
    let (id, dir) = new_vm_dir(vms_dir).map_err(|e| ActionError::Prepare(e.into()))?;
    let made = (|| {
        let files = JailFiles::open(&dir)?;
        let listener = UnixListener::bind(dir.join("ctl.sock"))?;
        give_dir(&dir, uid).map_err(std::io::Error::other)?;
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
fn hosted_watch(dir: &Path) -> std::io::Result<OwnedFd> {
    let c = UnixStream::connect(dir.join("ctl.sock"))?;
    proto::send_line(&c, &Request::Wait, None)?;
    Ok(c.into())
}
