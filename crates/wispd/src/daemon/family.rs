//! Fork registration: a VMM process forked by a VM of a family (a guest's
//! `fork()`) announces itself on the family's uplink, and the daemon makes
//! it a VM of its own (id, directory, files, control socket, table entry).

use std::fs;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixListener;

use wisp_api::{VmInfo, VmState};
use wisp_jail::JailFiles;
use wisp_vmm_process::proto::{recv_packet, send_packet, ForkKit, ForkNote};

use super::process::{is_ours, new_vm_dir, DirError};
use super::table::Entry;
use super::uids::dir_uid;
use super::{now_ms, Daemon};
use crate::fsutil::write_atomic;

/// Ended forked VMs kept per family (older ones are removed).
const FORKED_KEEP: usize = 64;

/// Why a forked process was not made a VM (told to it, and logged).
#[derive(Debug, thiserror::Error)]
enum ForkError {
    #[error("bad fork note: {0}")]
    BadNote(serde_json::Error),
    #[error("the forking VM is not a VM of this family")]
    NotInFamily,
    #[error("process {0} is a VM already")]
    AlreadyVm(u32),
    #[error("the family has no user id")]
    NoUid,
    #[error("process {0} is not a VMM process of this family")]
    NotOurs(u32),
    #[error(transparent)]
    Dir(#[from] DirError),
    #[error("files: {0}")]
    Files(std::io::Error),
    #[error("bind: {0}")]
    Bind(std::io::Error),
    #[error("{0}")]
    Record(std::io::Error),
}

impl Daemon {
    /// A message on family `root`'s uplink: a VMM process forked by one of
    /// its VMs asks to become a VM of its own.
    pub(super) fn on_uplink(&self, root: &str) {
        let fd = {
            let t = self.vms.lock();
            t.by_id.get(root).and_then(|e| e.uplink.as_ref()).and_then(|f| f.try_clone().ok())
        };
        let Some(fd) = fd else { return };
        let (msg, fds) = match recv_packet(fd.as_fd()) {
            Ok(m) => m,
            Err(_) => {
                // Every VMM process of the family has gone.
                self.unwatch(fd.as_fd());
                if let Some(e) = self.vms.lock().by_id.get_mut(root) {
                    e.uplink = None;
                }
                return;
            }
        };
        let Some(reply) = fds.into_iter().next() else { return };
        let r = serde_json::from_slice::<ForkNote>(&msg).map_err(ForkError::BadNote).and_then(|note| self.fork_child(root, &note));
        let _ = match r {
            Ok((id, fds)) => {
                let b: Vec<_> = fds.iter().map(|f| f.as_fd()).collect();
                send_packet(reply.as_fd(), &ForkKit { id: Some(id), error: None }, &b)
            }
            Err(e) => {
                eprintln!("wispd: family {root}: fork refused: {e}");
                send_packet(reply.as_fd(), &ForkKit { id: None, error: Some(e.to_string()) }, &[])
            }
        };
    }

    /// Make process `note.child_pid`, forked by a VM of family `root`, a VM
    /// of the toolstack: id, directory, files, control socket, table entry.
    fn fork_child(&self, root: &str, note: &ForkNote) -> Result<(String, [OwnedFd; 4]), ForkError> {
        let (parent, dir_uid, old) = {
            let t = self.vms.lock();
            let in_family = |e: &&Entry| e.info.id == root || e.info.family.as_deref() == Some(root);
            // The forking VM may have ended already (fork, then exit at once).
            let e = t
                .by_id
                .values()
                .filter(in_family)
                .find(|e| e.info.pid == note.parent_pid)
                .ok_or(ForkError::NotInFamily)?;
            if t.by_id.values().any(|e| e.info.pid == note.child_pid && e.info.exit.is_none()) {
                return Err(ForkError::AlreadyVm(note.child_pid));
            }
            // Keep at most FORKED_KEEP ended forked VMs per family: the
            // oldest go, so a guest forking in a loop cannot fill the host.
            let mut ended: Vec<(u64, String)> = t
                .by_id
                .values()
                .filter(in_family)
                .filter(|e| e.info.family.is_some() && e.info.exit.is_some())
                .map(|e| (e.info.created_ms, e.info.id.clone()))
                .collect();
            ended.sort();
            let old: Vec<String> = ended.iter().rev().skip(FORKED_KEEP).map(|(_, id)| id.clone()).collect();
            (e.info.clone(), dir_uid(&e.dir).ok_or(ForkError::NoUid)?, old)
        };
        for id in old {
            let _ = self.remove(&id, false);
        }
        // The process must be one of the family's VMM processes (forked from
        // the root's, so it carries the root's command line); its parent may
        // be gone already, so that is not checked.
        if !is_ours(note.child_pid, root) {
            return Err(ForkError::NotOurs(note.child_pid));
        }
        let (id, dir) = new_vm_dir(&self.vms_dir(), dir_uid)?;
        let files = JailFiles::open(&dir).map_err(ForkError::Files)?;
        let listener = UnixListener::bind(dir.join("ctl.sock")).map_err(ForkError::Bind)?;
        let _ = fs::write(dir.join("pid"), note.child_pid.to_string());
        let info = VmInfo {
            id: id.clone(),
            name: None,
            image: parent.image.clone(),
            args: parent.args.clone(),
            mem: parent.mem,
            state: VmState::Running,
            pid: note.child_pid,
            created_ms: now_ms(),
            exit: None,
            boot_us: None,
            ip: None,
            ports: Vec::new(),
            parent: Some(parent.id.clone()),
            family: Some(root.to_string()),
        };
        write_atomic(&dir.join("vm.json"), &serde_json::to_vec(&info).unwrap_or_default()).map_err(ForkError::Record)?;
        self.insert(info, dir, None);
        let (d, x, c) = files.into_parts();
        Ok((id, [d, OwnedFd::from(x), OwnedFd::from(c), OwnedFd::from(listener)]))
    }
}
