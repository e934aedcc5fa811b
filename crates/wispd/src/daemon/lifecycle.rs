//! The life-cycle operations on VMs that exist: inspect, pause and resume,
//! stop, kill, wait, console output (removal is `remove`); and the quick control
//! requests they send to a VMM process.

use std::io::{self, BufReader, Cursor, Write};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use wisp_api::{ExitInfo, VmInfo, VmState};
use wisp_vmm_process::proto::{self, Reply, Request, WorkerState};

use super::console::Console;
use super::error::ActionError;
use super::Daemon;
use crate::fsutil::read_tail;

impl Daemon {
    /// One VM.
    pub(super) fn get(&self, key: &str) -> Result<VmInfo, ActionError> {
        Ok(self.vms.lock().find(key)?.1.info.clone())
    }

    /// Id, directory and state of the VM `key` names.
    pub(super) fn dir_of(&self, key: &str) -> Result<(String, PathBuf, VmInfo), ActionError> {
        let t = self.vms.lock();
        let (id, e) = t.find(key)?;
        Ok((id, e.dir.clone(), e.info.clone()))
    }

    /// A quick control request to a running VM's VMM process.
    fn call_worker(&self, key: &str, req: &Request) -> Result<(String, Reply), ActionError> {
        let (id, dir, info) = self.dir_of(key)?;
        if info.state == VmState::Exited {
            return Err(ActionError::Exited(id));
        }
        match self.call_session(&id, &dir, req) {
            Ok(r) if r.ok => Ok((id, r)),
            Ok(r) => Err(ActionError::Refused(r.error.unwrap_or_default())),
            Err(source) => Err(ActionError::Unreachable { id, source }),
        }
    }

    /// A quick request on the VM's open control connection (opened on
    /// first use, reopened once if it went stale).
    fn call_session(&self, id: &str, dir: &Path, req: &Request) -> io::Result<Reply> {
        let cached = self.vms.lock().by_id.get_mut(id).and_then(|e| e.ctl.take());
        let fresh = || -> io::Result<UnixStream> {
            let c = UnixStream::connect(dir.join("ctl.sock"))?;
            c.set_read_timeout(Some(Duration::from_secs(5)))?;
            Ok(c)
        };
        let once = |c: &UnixStream| -> io::Result<Reply> {
            proto::send_line(c, req, None)?;
            // The reply is untrusted: one line, capped.
            proto::read_reply_line(&mut BufReader::new(c))
        };
        let (conn, reply) = match cached.map(|c| once(&c).map(|r| (c, r))) {
            Some(Ok(ok)) => ok,
            _ => {
                let c = fresh()?;
                let r = once(&c)?;
                (c, r)
            }
        };
        if let Some(e) = self.vms.lock().by_id.get_mut(id) {
            if e.ctl.is_none() && e.info.state != VmState::Exited {
                e.ctl = Some(conn);
            }
        }
        Ok(reply)
    }

    /// Record the state a VMM process reported (paused or running).
    pub(super) fn set_state(&self, id: &str, r: &Reply) {
        let mut t = self.vms.lock();
        if let Some(e) = t.by_id.get_mut(id) {
            if e.info.state != VmState::Exited {
                match r.state {
                    Some(WorkerState::Paused) => e.info.state = VmState::Paused,
                    Some(WorkerState::Running) => e.info.state = VmState::Running,
                    _ => {}
                }
            }
        }
    }

    /// Pause or resume.
    pub(super) fn pause(&self, key: &str, pause: bool) -> Result<VmInfo, ActionError> {
        let id = self.not_migrating(key)?;
        self.set_paused(&id, pause)
    }

    /// [`Daemon::pause`] of VM `id`, migrating or not (a migration's own).
    pub(super) fn set_paused(&self, id: &str, pause: bool) -> Result<VmInfo, ActionError> {
        let (id, r) = self.call_worker(id, if pause { &Request::Pause } else { &Request::Resume })?;
        self.set_state(&id, &r);
        self.get(&id)
    }

    /// The id of VM `key`, unless it is being migrated.
    pub(super) fn not_migrating(&self, key: &str) -> Result<String, ActionError> {
        let t = self.vms.lock();
        let (id, e) = t.find(key)?;
        if e.migrating {
            return Err(ActionError::Migrating(id));
        }
        Ok(id)
    }

    /// Ask the guest to stop; kill it after `grace`.
    pub(super) fn stop(&self, key: &str, grace: Duration) -> Result<VmInfo, ActionError> {
        let (id, _) = self.call_worker(key, &Request::Stop { grace_ms: grace.as_millis() as u64 })?;
        self.wait(&id, Some(grace + Duration::from_secs(5)))?;
        self.get(&id)
    }

    /// Kill now.
    pub(super) fn kill(&self, key: &str) -> Result<VmInfo, ActionError> {
        let (id, dir, info) = self.dir_of(key)?;
        if info.state == VmState::Exited {
            return Err(ActionError::Exited(id));
        }
        if !ask_kill(&dir) {
            self.kill_process(&id);
        }
        self.wait(&id, Some(Duration::from_secs(5)))?;
        self.get(&id)
    }

    /// Wait until the VM has exited (or `timeout`).
    pub(super) fn wait(&self, key: &str, timeout: Option<Duration>) -> Result<ExitInfo, ActionError> {
        self.vms.wait_exit(key, timeout)
    }

    /// Console output (standard output's, or with `stderr` standard
    /// error's): the buffer, then (if `follow`) new output until the VM
    /// ends.
    pub(super) fn logs(&self, key: &str, follow: bool, stderr: bool) -> Result<Console, ActionError> {
        let (_, dir, info) = self.dir_of(key)?;
        if info.state != VmState::Exited {
            if let Ok((r, stream)) = proto::call(&dir.join("ctl.sock"), &Request::Logs { follow, stderr }, None, None) {
                if r.ok {
                    return Ok(Console::Live(stream));
                }
            }
        }
        // Exited (or exiting): the VMM process saved the buffer (untrusted:
        // its last CONSOLE_RING bytes at most, never through a link).
        let file = if stderr { "stderr.log" } else { "console.log" };
        let saved = read_tail(&dir.join(file), wisp_vmm_process::CONSOLE_RING as u64).unwrap_or_default();
        Ok(Console::Saved(Cursor::new(saved)))
    }
}

impl Daemon {
    /// Hand `client`'s connection to VM `key`'s VMM process as its standard
    /// input (`POST /v1/vms/{vm}/stdin`), then answer it `101`: from there
    /// the daemon is out of that connection.
    pub(super) fn stdin(&self, key: &str, client: &UnixStream) -> Result<(), ActionError> {
        let (id, dir, info) = self.dir_of(key)?;
        if info.state == VmState::Exited {
            return Err(ActionError::StdinRefused(format!("VM {id} has exited")));
        }
        let fd = client.try_clone().map(OwnedFd::from).map_err(ActionError::Vmm)?;
        match proto::call(&dir.join("ctl.sock"), &Request::Stdin, Some(&fd), Some(Duration::from_secs(5))) {
            // Refused: the VMM process let go of the connection, which
            // stays the daemon's.
            Ok((r, _)) if !r.ok => Err(ActionError::StdinRefused(r.error.unwrap_or_default())),
            Ok(_) => {
                let head = b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: wisp-stdin\r\n\r\n";
                let _ = (&*client).write_all(head);
                Ok(())
            }
            // No answer: the VMM process may hold the connection and read
            // it; the daemon must not read it too. The error closes it.
            Err(e) => {
                let msg = format!("standard input: the VMM process did not answer: {e}");
                let _ = wisp_api::http::write_error(&mut &*client, 500, &msg, false);
                Ok(())
            }
        }
    }
}

/// Ask the VMM process of the VM in `dir` to kill it (a `kill` request, 2 s
/// at most): whether it answered.
pub(super) fn ask_kill(dir: &Path) -> bool {
    proto::call(&dir.join("ctl.sock"), &Request::Kill, None, Some(Duration::from_secs(2))).is_ok()
}
