//! Removing VMs: one (killed first with `force`), a whole family (all its
//! processes killed at once, so that none forks meanwhile), or many in one
//! request (killed in waves, then removed without a look at every VM per
//! removal: the table keeps its counts).

use std::collections::HashSet;
use std::os::fd::AsFd;
use std::time::Duration;

use wisp_api::{RemoveFailure, RemovedVms, VmState};

use super::error::ActionError;
use super::lifecycle::ask_kill;
use super::table::root_of;
use super::Daemon;

/// VMM processes killed at once by a batch removal, whose ends are waited
/// for before the next wave: the host frees a few dozen VMs' memory and
/// filters at a time, not ten thousand.
const WAVE: usize = 32;

/// Threads that send a wave's kills.
const KILLERS: usize = 8;

impl Daemon {
    /// Remove a VM (with `force`, kill it first if it runs). With the last
    /// VM of its family goes the family's control group, and every process
    /// still in it.
    pub(super) fn remove(&self, key: &str, force: bool) -> Result<(), ActionError> {
        let (id, dir, info) = self.dir_of(key)?;
        self.remove_found(id, &dir, &info, force)
    }

    /// [`Daemon::remove`] of the VM found: `id`, its directory and what
    /// the table said of it (a hidden one too).
    pub(super) fn remove_found(&self, id: String, dir: &std::path::Path, info: &wisp_api::VmInfo, force: bool) -> Result<(), ActionError> {
        let wait = |t| self.vms.wait_exit_id(&id, Some(t));
        if info.state != VmState::Exited {
            if !force {
                return Err(ActionError::Running(id));
            }
            if !ask_kill(dir) {
                self.kill_process(&id);
            }
            if wait(Duration::from_secs(5)).is_err() {
                self.kill_process(&id);
                if let Some(g) = &info.group {
                    // A group that does not end its VM when asked twice is
                    // not working: the whole group goes (its tenant's VMs).
                    if wait(Duration::from_secs(2)).is_err() {
                        self.kill_group(g);
                    }
                }
                wait(Duration::from_secs(5))?;
            }
        }
        let root = root_of(info).to_string();
        let mut t = self.vms.lock();
        let removed = t.remove(&id);
        if let Some(e) = &removed {
            for fd in e.pidfd.iter().chain(e.uplink.iter()) {
                self.unwatch(fd.as_fd());
            }
        }
        let family_left = t.family_count(&root).0 > 0;
        drop(t);
        // A group's VM leaves its group (the group goes with its last),
        // once: a removal that found it gone already leaves nothing.
        if let Some(g) = &info.group {
            if let Some(e) = &removed {
                self.remove_dir(dir);
                if !e.released {
                    self.leave_group(g);
                }
            }
            return Ok(());
        }
        // The family's last VM: whatever still runs in its control group
        // (nothing should) is killed, before its user id can be reused.
        if !family_left {
            self.destroy_group(&root);
        }
        self.remove_dir(dir);
        Ok(())
    }

    /// The ids of family `root`'s VMs (the root's too, if it is still there).
    fn family_ids(&self, root: &str) -> Vec<String> {
        let t = self.vms.lock();
        t.by_id.values().filter(|e| root_of(&e.info) == root).map(|e| e.info.id.clone()).collect()
    }

    /// Remove every VM of VM `key`'s family (with `force`, running ones
    /// too). Removed one by one, a family that forks would make new VMs
    /// as fast as old ones go: with a control group, every process in it
    /// is killed at once first (none forks meanwhile), and so is the group.
    pub(super) fn remove_family(&self, key: &str, force: bool) -> Result<(), ActionError> {
        let (id, _, info) = self.dir_of(key)?;
        let root = info.family.clone().unwrap_or(id);
        if !force {
            let t = self.vms.lock();
            let running = t.by_id.values().find(|e| root_of(&e.info) == root && e.info.state != VmState::Exited);
            if let Some(e) = running {
                return Err(ActionError::Running(e.info.id.clone()));
            }
        }
        self.destroy_group(&root);
        // A fork registered while the family died is one more (exited) VM:
        // a few rounds take those too.
        for _ in 0..4 {
            let ids = self.family_ids(&root);
            if ids.is_empty() {
                break;
            }
            for id in ids {
                match self.remove(&id, true) {
                    Ok(()) | Err(ActionError::NotFound(_) | ActionError::Gone(_)) => {}
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(())
    }

    /// Remove many VMs (`POST /v1/vms/remove`). With `force`, the running
    /// ones are killed first, [`WAVE`] VMM processes at a time (by pidfd:
    /// one system call each, their ends seen by the exit watcher), then
    /// each is removed as [`Daemon::remove`] does. Each VM named that could
    /// not be removed is in `failed`, with the reason; a VM named twice is
    /// removed once.
    pub(super) fn remove_many(&self, keys: &[String], force: bool) -> RemovedVms {
        let mut out = RemovedVms::default();
        let mut ids: Vec<(String, String)> = Vec::new();
        let mut running: Vec<String> = Vec::new();
        {
            let t = self.vms.lock();
            let mut seen = HashSet::new();
            for k in keys {
                match t.find(k) {
                    Err(e) => out.failed.push(RemoveFailure { vm: k.clone(), error: e.to_string() }),
                    Ok((id, _)) if !seen.insert(id.clone()) => {}
                    Ok((id, e)) if e.info.state != VmState::Exited && !force => {
                        out.failed.push(RemoveFailure { vm: k.clone(), error: ActionError::Running(id).to_string() })
                    }
                    Ok((id, e)) => {
                        if e.info.state != VmState::Exited {
                            running.push(id.clone());
                        }
                        ids.push((k.clone(), id));
                    }
                }
            }
        }
        {
            // Their ends go unrecorded: their records go with them.
            let mut t = self.vms.lock();
            for (_, id) in &ids {
                if let Some(e) = t.by_id.get_mut(id) {
                    e.removing = true;
                }
            }
        }
        for wave in running.chunks(WAVE) {
            // A group's VM is killed by a request (a round trip each): the
            // wave's requests go out from several threads at once.
            std::thread::scope(|s| {
                for part in wave.chunks(WAVE.div_ceil(KILLERS)) {
                    s.spawn(move || part.iter().for_each(|id| self.kill_process(id)));
                }
            });
            for id in wave {
                let _ = self.wait(id, Some(Duration::from_secs(5)));
            }
        }
        for (k, id) in ids {
            match self.remove(&id, true) {
                Ok(()) => out.removed.push(id),
                Err(e) => {
                    // Not removed after all: its end is recorded as any VM's.
                    let ended = self.vms.lock().by_id.get_mut(&id).map(|en| {
                        en.removing = false;
                        en.info.exit.is_some()
                    });
                    if ended == Some(true) {
                        let _ = self.save(&id);
                    }
                    out.failed.push(RemoveFailure { vm: k, error: e.to_string() })
                }
            }
        }
        out
    }
}
