//! Re-adoption: a daemon started again finds the VMs a previous one left
//! in the state directory. Running ones are adopted (state asked over the
//! control socket, exit watched, address and host ports taken again),
//! exited ones are listed with their status, pooled shells are stopped.

use std::fs;
use std::time::Duration;

use wisp_api::{VmInfo, VmState};
use wisp_vmm_process::proto::{self, Request, WorkerState};

use super::process::{is_ours, kill_pid, read_exit};
use super::uids::dir_uid;
use super::Daemon;
use crate::forward::Forward;

impl Daemon {
    /// Find the VMs a previous daemon left: adopt running ones, record
    /// exited ones, and stop pooled shells (the new pool replaces them).
    pub(super) fn adopt(&self) {
        let Ok(rd) = fs::read_dir(self.vms_dir()) else { return };
        for ent in rd.flatten() {
            let dir = ent.path();
            let id = ent.file_name().to_string_lossy().into_owned();
            let pid: Option<u32> = fs::read_to_string(dir.join("pid")).ok().and_then(|s| s.trim().parse().ok());
            let info: Option<VmInfo> = fs::read(dir.join("vm.json")).ok().and_then(|b| serde_json::from_slice(&b).ok());
            // A forked VM's process carries its family root's command line.
            let cmd_id = info.as_ref().and_then(|i| i.family.clone()).unwrap_or_else(|| id.clone());
            let alive = pid.is_some_and(|p| is_ours(p, &cmd_id));
            let Some(mut info) = info else {
                // A pooled shell or a VM that never started.
                if alive {
                    kill_pid(pid.unwrap_or(0));
                }
                let _ = fs::remove_dir_all(&dir);
                continue;
            };
            if let Some(u) = dir_uid(&dir) {
                self.uids.mark_used(u);
            }
            info.exit = read_exit(&dir);
            if info.exit.is_none() && alive {
                if let Some(ip) = info.ip.as_deref() {
                    self.net.mark_used(ip);
                }
            }
            if info.exit.is_some() {
                info.state = VmState::Exited;
            } else if alive {
                if let Ok((r, _)) = proto::call(&dir.join("ctl.sock"), &Request::Status, None, Some(Duration::from_secs(2))) {
                    info.state = if r.state == Some(WorkerState::Paused) { VmState::Paused } else { VmState::Running };
                    info.boot_us = r.boot_us;
                }
            }
            let restore: Vec<_> = if info.exit.is_none() && alive { info.ports.clone() } else { Vec::new() };
            let (id, ip) = (info.id.clone(), info.ip.clone());
            self.insert(info, dir, None);
            if let Some(ip) = ip.and_then(|i| i.parse().ok()) {
                let fw = Forward::restore(&id, &restore, ip);
                if let Some(e) = self.vms.lock().by_id.get_mut(&id) {
                    e.forwards = fw;
                }
            }
        }
    }
}
