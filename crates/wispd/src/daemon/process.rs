//! VMM processes as the daemon sees them: spawning one with a prepared
//! shell, stopping an unused one, telling ours from other processes, and
//! the private directory each VM gets (`vms/<id>/`). Knows nothing of the
//! VM table, so the pool can hold [`Worker`]s without knowing the daemon.

use std::fs;
use std::io::{self, BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustix::io::Errno;
use rustix::process::Pid;
use wisp_api::ExitInfo;
use wisp_vmm_process::proto::{self, Request};

use super::uids::{NoFreeUid, Uids};

/// A VMM process (pooled or holding a VM).
pub struct Worker {
    /// Id (becomes the VM's id).
    pub id: String,
    /// Process id.
    pub pid: u32,
    /// Its directory.
    pub dir: PathBuf,
    /// Set if this daemon spawned it (to reap it).
    pub child: Option<Child>,
}

/// Why a VM directory could not be made.
#[derive(Debug, thiserror::Error)]
pub enum DirError {
    /// Creating it.
    #[error("{}: {source}", dir.display())]
    Create { dir: PathBuf, source: io::Error },
    /// Giving it to the VM's user id.
    #[error("chown {}: {source}", dir.display())]
    Chown { dir: PathBuf, source: Errno },
    /// Making it private.
    #[error("chmod: {0}")]
    Chmod(Errno),
}

/// Why a VMM process could not be prepared.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    /// No user id left.
    #[error(transparent)]
    Uid(#[from] NoFreeUid),
    /// Its directory.
    #[error(transparent)]
    Dir(#[from] DirError),
    /// Its log file.
    #[error("{0}")]
    Log(io::Error),
    /// The daemon's own executable (which the VMM process runs).
    #[error("{0}")]
    Exe(io::Error),
    /// The process could not be started.
    #[error("spawn VMM process: {0}")]
    Spawn(io::Error),
    /// It started but did not get ready (its own message, if it said one).
    #[error("{0}")]
    NotReady(String),
}

fn new_id() -> String {
    let mut b = [0u8; 6];
    if fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut b)).is_err() {
        let n = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
        b.copy_from_slice(&n.to_le_bytes()[..6]);
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A new VM id and its directory under `vms_dir`, owned by `uid` and
/// private to it.
pub fn new_vm_dir(vms_dir: &Path, uid: u32) -> Result<(String, PathBuf), DirError> {
    let id = new_id();
    let dir = vms_dir.join(&id);
    fs::create_dir_all(&dir).map_err(|source| DirError::Create { dir: dir.clone(), source })?;
    let owner = (Some(rustix::fs::Uid::from_raw(uid)), Some(rustix::fs::Gid::from_raw(uid)));
    let private = rustix::fs::chown(&dir, owner.0, owner.1)
        .map_err(|source| DirError::Chown { dir: dir.clone(), source })
        .and_then(|()| rustix::fs::chmod(&dir, rustix::fs::Mode::from_raw_mode(0o700)).map_err(DirError::Chmod));
    if let Err(e) = private {
        let _ = fs::remove_dir_all(&dir);
        return Err(e);
    }
    Ok((id, dir))
}

/// Spawn a VMM process with a prepared shell of `mem` bytes, under a user
/// id of its own, and wait until it is ready. On any failure the user id,
/// the directory and the process (if it started) are given back.
pub fn spawn(vms_dir: &Path, uids: &Uids, mem: u64) -> Result<Worker, SpawnError> {
    let uid = uids.alloc()?;
    let made = new_vm_dir(vms_dir, uid).map_err(SpawnError::from).and_then(|(id, dir)| {
        start(&id, &dir, uid, mem).map(|child| Worker { id, pid: child.id(), dir: dir.clone(), child: Some(child) }).inspect_err(|_| {
            let _ = fs::remove_dir_all(&dir);
        })
    });
    if made.is_err() {
        uids.free(uid);
    }
    made
}

/// Start `wispd __worker` for VM `id` in `dir` and wait for its "ready".
fn start(id: &str, dir: &Path, uid: u32, mem: u64) -> Result<Child, SpawnError> {
    let log = fs::File::create(dir.join("vmm.log")).map_err(SpawnError::Log)?;
    let exe = std::env::current_exe().map_err(SpawnError::Exe)?;
    let mut cmd = Command::new(exe);
    cmd.arg("__worker").arg("--id").arg(id).arg("--dir").arg(dir).arg("--mem").arg(mem.to_string());
    cmd.arg("--uid").arg(uid.to_string());
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(log);
    // One malloc arena: a VMM process has two threads and little heap.
    cmd.env("MALLOC_ARENA_MAX", "1");
    // Its own process group: signals for the daemon's group (Ctrl-C) do
    // not reach VMs, and the VMs outlive the daemon.
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let mut child = cmd.spawn().map_err(SpawnError::Spawn)?;
    let _ = fs::write(dir.join("pid"), child.id().to_string());
    let mut line = String::new();
    let mut out = BufReader::new(child.stdout.take().expect("piped"));
    let _ = out.read_line(&mut line);
    if line.trim() != "ready" {
        let _ = child.kill();
        let _ = child.wait();
        let msg = line.trim().strip_prefix("error: ").unwrap_or(line.trim()).to_string();
        return Err(SpawnError::NotReady(if msg.is_empty() { "VMM process failed to start".into() } else { msg }));
    }
    Ok(child)
}

/// Stop an unused VMM process (asked first, then killed) and reap it. Its
/// directory is left to the caller.
pub fn stop(w: &mut Worker) {
    let _ = proto::call(&w.dir.join("ctl.sock"), &Request::Shutdown, None, Some(Duration::from_secs(1)));
    match w.child.as_mut() {
        Some(c) => {
            let _ = c.kill();
            let _ = c.wait();
        }
        None => kill_pid(w.pid),
    }
}

/// SIGKILL process `pid`.
pub fn kill_pid(pid: u32) {
    if let Some(p) = Pid::from_raw(pid as i32) {
        let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
    }
}

/// True if `pid` is a live VMM process for VM `id` (guards against pid reuse).
pub fn is_ours(pid: u32, id: &str) -> bool {
    fs::read(format!("/proc/{pid}/cmdline"))
        .map(|c| {
            let args: Vec<&[u8]> = c.split(|&b| b == 0).collect();
            args.contains(&b"__worker".as_slice()) && args.contains(&id.as_bytes())
        })
        .unwrap_or(false)
}

/// How the VM in `dir` ended, as its VMM process wrote it.
pub fn read_exit(dir: &Path) -> Option<ExitInfo> {
    fs::read(dir.join("exit.json")).ok().and_then(|b| serde_json::from_slice(&b).ok())
}
