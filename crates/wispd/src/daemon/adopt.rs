//! Re-adoption: a daemon started again finds the VMs a previous one left,
//! from its own records (`meta/<id>.json`, see `record`). Running ones are
//! adopted (state asked over the control socket, exit watched, address and
//! host ports taken again, a new family uplink sent), exited ones are
//! listed with their status, pooled shells are stopped.
//!
//! Nothing is taken on trust, not even the daemon's own records: a record
//! must name its file and its VM's directory (a real directory owned by the
//! VM's user id); its process must be a VMM process of that VM running
//! under that user id (and started when recorded) and, if it was made in
//! one, in its family's control group — any other process is left alone,
//! never signalled; its address must be a free VM address of
//! the subnet and its host ports non-zero and unclaimed, or they are not
//! restored. What a VM's directory holds is only read as advisory
//! (`exit.json`).
//!
//! A state directory of the previous layout (the record as `vm.json` and
//! `pid` inside each VM's directory, which its VMM process could replace)
//! is migrated once, when `meta/` does not exist yet: each record that
//! names its directory becomes a record of the daemon's, with the same
//! checks before anything is signalled, bound or forwarded.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use wisp_api::{VmInfo, VmState};
use wisp_vmm_process::proto::{self, Request, WorkerState};

use super::process::{is_ours, kill_fd, open_ours, proc_start};
use super::record::{check_ports, valid_id, Claimed, Proc, Record, MAX_RECORD};
use super::uids::{UID_BASE, UID_COUNT};
use super::table::root_of;
use super::Daemon;
use crate::forward::Forward;
use crate::fsutil::read_capped;

/// What earlier adopted VMs hold: a process or a host port is adopted once.
#[derive(Default)]
pub(super) struct Seen {
    pids: HashSet<u32>,
    ports: Claimed,
}

/// The owner of `dir` if it is a real directory (not a link) owned by a
/// VMM process's user id.
fn vm_dir_owner(dir: &Path) -> Option<u32> {
    let m = fs::symlink_metadata(dir).ok()?;
    (m.file_type().is_dir() && (UID_BASE..UID_BASE + UID_COUNT).contains(&m.uid())).then_some(m.uid())
}

impl Daemon {
    /// Find the VMMs a previous daemon left: adopt running VMs, record
    /// exited ones, stop pooled shells (the new pool replaces them), and
    /// remove directories nobody recorded.
    pub(super) fn adopt(&self, old_layout: bool) {
        if old_layout {
            self.migrate();
        }
        let mut seen = Seen::default();
        let ids = self.records.ids();
        // Groups first: their VMs are adopted as theirs.
        let mut groups = Vec::new();
        for id in &ids {
            if let Some(rec) = self.records.read(id).ok().filter(|r| r.hosts.is_some()) {
                groups.push(id.clone());
                self.adopt_group(rec, &mut seen);
            }
        }
        for id in ids.iter().filter(|id| !groups.contains(id)) {
            self.adopt_one(id, &mut seen);
        }
        self.drop_empty_groups();
        self.renew_uplinks();
        // Families none of whose VMs runs: their (empty) groups go.
        let roots: HashSet<String> = self.vms.lock().by_id.values().map(|e| root_of(&e.info).to_string()).collect();
        for root in roots {
            self.family_ended(&root);
        }
        let Ok(rd) = fs::read_dir(self.vms_dir()) else { return };
        for ent in rd.flatten() {
            let name = ent.file_name().to_string_lossy().into_owned();
            if valid_id(&name) && !self.records.exists(&name) && ent.file_type().is_ok_and(|t| t.is_dir()) {
                // Made just before a crash, or left by a VM whose record was
                // refused when migrated: nothing here is signalled, but its
                // control group (only ever this daemon's VMM processes) goes.
                let _ = fs::remove_dir_all(ent.path());
                self.destroy_group(&name);
            } else if !valid_id(&name) {
                eprintln!("wispd: {}: not a VM directory, left alone", ent.path().display());
            }
        }
    }

    /// A pid is taken for VM `id`'s process only if it is one of its VMM
    /// processes ([`open_ours`]), in its family's control group if it was
    /// made in one (`cmd_id` is the family root's id), and no VM adopted
    /// before has it; the pidfd is opened before the checks.
    pub(super) fn verified(&self, rec: &Record, cmd_id: &str, seen: &mut Seen) -> Option<OwnedFd> {
        if rec.pid == 0 {
            return None;
        }
        if seen.pids.contains(&rec.pid) {
            eprintln!("wispd: VM {}: pid {} is another VM's: not its process", rec.id, rec.pid);
            return None;
        }
        let outside = || rec.contained && self.cgroups.as_ref().is_some_and(|c| !c.holds(cmd_id, rec.pid));
        match open_ours(rec.pid, cmd_id, rec.uid, rec.start) {
            Some(_) if outside() => {
                eprintln!("wispd: VM {}: pid {} is not in its family's control group: left alone", rec.id, rec.pid);
                None
            }
            Some(fd) => {
                seen.pids.insert(rec.pid);
                Some(fd)
            }
            None if Path::new(&format!("/proc/{}", rec.pid)).exists() => {
                eprintln!("wispd: VM {}: pid {} is not its VMM process: left alone", rec.id, rec.pid);
                None
            }
            None => None,
        }
    }

    /// Adopt the VMM process of record `id`.
    fn adopt_one(&self, id: &str, seen: &mut Seen) {
        let rec = match self.records.read(id) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("wispd: record of VM {id}: {e}: ignored");
                return;
            }
        };
        let dir = self.vms_dir().join(id);
        // The daemon keeps nothing in a VM's directory any more: such files
        // there were put there by someone else (its VMM process?).
        for name in ["vm.json", "pid"] {
            if fs::symlink_metadata(dir.join(name)).is_ok() {
                eprintln!("wispd: VM {id}: {name} in its directory is not the daemon's: ignored");
            }
        }
        let Some(mut info) = rec.vm.clone() else {
            // A pooled shell: the new pool replaces it.
            if let Some(fd) = self.verified(&rec, id, seen) {
                kill_fd(&fd);
            }
            self.destroy_group(id);
            self.records.forget(id);
            let _ = fs::remove_dir_all(&dir);
            return;
        };
        // Whatever becomes of the record, a process may still hold its user
        // id: it is not given to another VM.
        if (UID_BASE..UID_BASE + UID_COUNT).contains(&rec.uid) {
            self.uids.mark_used(rec.uid);
        }
        if vm_dir_owner(&dir) != Some(rec.uid) {
            eprintln!("wispd: VM {id}: its directory is missing or not its own (user {}): record ignored", rec.uid);
            if fs::symlink_metadata(&dir).is_err() {
                self.records.forget(id);
            }
            return;
        }
        if [&info.family, &info.parent].into_iter().flatten().any(|f| !valid_id(f)) {
            eprintln!("wispd: VM {id}: its family is no VM id: record ignored");
            return;
        }
        // A forked VM's process carries its family root's command line; a
        // group's VM is its (adopted) group's, watched on a pending `wait`.
        let cmd_id = info.family.clone().unwrap_or_else(|| id.to_string());
        // Every VM of an adopted group is one of its members, ended or not
        // (the group goes with the last of them).
        if let Some(g) = info.group.as_deref().filter(|g| self.groups.matches(g, rec.pid, rec.uid)) {
            self.groups.join(g);
        }
        let pidfd = match &info.group {
            _ if info.exit.is_some() => None,
            Some(g) => self.adopt_hosted(g, &rec, &dir),
            None => self.verified(&rec, &cmd_id, seen),
        };
        let alive = pidfd.is_some();
        let mut restore = Vec::new();
        // The pid shown is the recorded one (0 if none was ever checked).
        info.pid = rec.pid;
        if alive {
            if let Ok((r, _)) = proto::call(&dir.join("ctl.sock"), &Request::Status, None, Some(Duration::from_secs(2))) {
                info.state = if r.state == Some(WorkerState::Paused) { VmState::Paused } else { VmState::Running };
                info.boot_us = r.boot_us;
            }
            self.adopt_net(&mut info, seen);
            restore = info.ports.clone();
        } else if info.exit.is_some() {
            info.state = VmState::Exited;
        }
        if !alive && !info.links.is_empty() {
            // Its links' routes outlived it (the daemon was down): gone now.
            self.links.adopt(id, info.ip.as_deref(), &info.links);
            self.links.remove(id);
        }
        let start = rec.start.or_else(|| alive.then(|| proc_start(rec.pid)).flatten());
        let p = Proc { uid: rec.uid, pid: rec.pid, start, contained: rec.contained, hosts: None };
        if let Err(e) = self.records.register(id, p, Some(info.clone())) {
            eprintln!("wispd: VM {id}: cannot write its record: {e}");
        }
        let ip = info.ip.clone();
        // A VM whose process is gone is recorded as exited at once.
        self.insert_watched(info, dir, None, pidfd);
        if let Some(ip) = ip.filter(|_| alive).and_then(|i| i.parse().ok()) {
            let fw = Forward::restore(id, &restore, ip);
            if let Some(e) = self.vms.lock().by_id.get_mut(id) {
                e.forwards = fw;
            }
        }
    }

    /// Give each family with running VMs a new uplink: the old one's
    /// daemon end died with the previous daemon, and its forks would end at
    /// once. The daemon keeps one end (on the root's entry, watched as at
    /// create) and sends the other to every running member (`uplink`
    /// request), which puts it in the old one's place: a VM forked from
    /// then on becomes a VM of this daemon. A family with no forking
    /// member, or whose root is no longer listed, gets none.
    fn renew_uplinks(&self) {
        let mut families: HashMap<String, Vec<(String, PathBuf)>> = HashMap::new();
        {
            let t = self.vms.lock();
            for e in t.by_id.values().filter(|e| e.pidfd.is_some() && e.info.exit.is_none()) {
                let root = root_of(&e.info).to_string();
                if t.by_id.get(&root).is_some_and(|r| r.uplink.is_none()) {
                    families.entry(root).or_default().push((e.info.id.clone(), e.dir.clone()));
                }
            }
        }
        for (root, members) in families {
            let pair = rustix::net::socketpair(
                rustix::net::AddressFamily::UNIX,
                rustix::net::SocketType::SEQPACKET,
                rustix::net::SocketFlags::CLOEXEC,
                None,
            );
            let Ok((mine, theirs)) = pair else {
                eprintln!("wispd: family {root}: no new uplink (socketpair failed): its forks will not be registered");
                continue;
            };
            let mut taken = 0;
            for (id, dir) in members {
                let r = proto::call(&dir.join("ctl.sock"), &Request::Uplink, Some(&theirs), Some(Duration::from_secs(2)));
                match r {
                    Ok((r, _)) if r.ok => taken += 1,
                    Ok((r, _)) if r.error.as_deref() == Some(proto::NO_FORK) => {}
                    Ok((r, _)) => eprintln!("wispd: VM {id}: new uplink refused: {}", r.error.unwrap_or_default()),
                    Err(e) => eprintln!("wispd: VM {id}: new uplink not sent: {e}"),
                }
            }
            if taken == 0 {
                continue;
            }
            let mut t = self.vms.lock();
            if let Some(e) = t.by_id.get_mut(&root) {
                self.watch_uplink(&root, mine.as_fd());
                e.uplink = Some(mine);
            }
        }
    }

    /// Take a running VM's address and host ports again, dropping what
    /// cannot be its: an address that is no free VM address of the subnet
    /// (and then every port), ports that are zero or claimed before.
    fn adopt_net(&self, info: &mut VmInfo, seen: &mut Seen) {
        let id = info.id.clone();
        match info.ip.as_deref().map(|ip| self.net.claim(ip)) {
            Some(Err(why)) => {
                eprintln!("wispd: VM {id}: address not restored: {why}");
                // Routes through an address it no longer has must not stay.
                self.links.adopt(&id, info.ip.as_deref(), &info.links);
                self.links.remove(&id);
                info.ip = None;
            }
            Some(Ok(())) => self.links.adopt(&id, info.ip.as_deref(), &info.links),
            None => {}
        }
        if info.ip.is_none() {
            if !info.ports.is_empty() {
                eprintln!("wispd: VM {id}: host ports not restored: the VM has no address");
            }
            info.ports.clear();
            return;
        }
        let (keep, refused) = check_ports(&info.ports, &mut seen.ports);
        for r in refused {
            eprintln!("wispd: VM {id}: host port not restored: {r}");
        }
        info.ports = keep;
    }

    /// Migrate a state directory of the previous layout: each VM
    /// directory's `vm.json` that names its directory becomes a record (its
    /// process taken only once checked, see [`Daemon::verified`]); other
    /// directories are those of pooled shells, or hold a record that was
    /// replaced: their process is stopped if it is that VM's own, and the
    /// directory goes.
    fn migrate(&self) {
        let Ok(rd) = fs::read_dir(self.vms_dir()) else { return };
        for ent in rd.flatten() {
            let (name, dir) = (ent.file_name().to_string_lossy().into_owned(), ent.path());
            let Some(uid) = valid_id(&name).then(|| vm_dir_owner(&dir)).flatten() else { continue };
            let old_pid = read_capped(&dir.join("pid"), 32)
                .ok()
                .and_then(|b| String::from_utf8(b).ok())
                .and_then(|s| s.trim().parse::<u32>().ok());
            let old = match read_capped(&dir.join("vm.json"), MAX_RECORD) {
                Ok(b) => Some(serde_json::from_slice::<VmInfo>(&b).map_err(|e| e.to_string())),
                Err(_) => None,
            };
            let mut info = match old {
                Some(Ok(info)) if info.id == name && old_pid.is_none_or(|p| p == info.pid) => info,
                refused => {
                    match refused {
                        Some(Ok(info)) => eprintln!("wispd: {}: vm.json names VM {:?}, pid {}: not adopted", dir.display(), info.id, info.pid),
                        Some(Err(e)) => eprintln!("wispd: {}: vm.json: {e}: not adopted", dir.display()),
                        None => {}
                    }
                    match old_pid.and_then(|p| open_ours(p, &name, uid, None)) {
                        Some(fd) => kill_fd(&fd),
                        // A process of its may still run: its user id is not reused.
                        None => self.uids.mark_used(uid),
                    }
                    // Its control group, if it has one, holds only its own.
                    self.destroy_group(&name);
                    let _ = fs::remove_dir_all(&dir);
                    continue;
                }
            };
            // That layout had no listening addresses: its forwards listen on
            // the default one (whatever the file says).
            for m in &mut info.ports {
                m.addr = None;
            }
            let cmd_id = info.family.clone().filter(|f| valid_id(f)).unwrap_or_else(|| name.clone());
            // Taken as its process only if it is one now; the start time
            // makes the record hold for that process alone from here on.
            let ours = is_ours(info.pid, &cmd_id, uid, None);
            if !ours {
                eprintln!("wispd: VM {name}: pid {} is not its VMM process: not taken", info.pid);
            }
            // That layout had no control groups.
            let p = Proc { uid, pid: if ours { info.pid } else { 0 }, start: ours.then(|| proc_start(info.pid)).flatten(), contained: false, hosts: None };
            match self.records.register(&name, p, Some(info)) {
                Ok(()) => {
                    let _ = fs::remove_file(dir.join("vm.json"));
                    let _ = fs::remove_file(dir.join("pid"));
                    eprintln!("wispd: VM {name}: record migrated out of its directory");
                }
                Err(e) => eprintln!("wispd: VM {name}: cannot migrate its record: {e}"),
            }
        }
    }
}
