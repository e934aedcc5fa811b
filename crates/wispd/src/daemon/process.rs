//! VMM processes as the daemon sees them: spawning one with a prepared
//! shell, stopping an unused one, telling ours from other processes, and
//! the private directory each VM gets (`vms/<id>/`). Knows nothing of the
//! VM table, so the pool can hold [`Worker`]s without knowing the daemon.
//!
//! A VMM process is not trusted once its guest has run: a process id is
//! only taken for one of ours when the process runs under the VM's own
//! user id with a VMM process's command line for that VM (and, when
//! known, started when recorded), and it is only ever signalled through a
//! pidfd opened before that check. What it writes into its directory
//! (`exit.json`) is read as untrusted input ([`read_exit`]).

use std::fs;
use std::io::{self, BufRead, BufReader, Read};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustix::io::Errno;
use rustix::process::{pidfd_open, pidfd_send_signal, Pid, PidfdFlags, Signal};
use serde::Deserialize;
use wisp_api::ExitInfo;
use wisp_vmm_process::proto::{self, Request};

use super::record::{Proc, Records};
use crate::pidns::PidNs;
use super::uids::{UidError, Uids, UID_BASE, UID_COUNT};
use crate::cgroup::{CgroupError, Cgroups, Limits};
use crate::fsutil::read_capped;
use crate::images::CachedImage;

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
    /// A pidfd on it and its pid in its own PID namespace, taken when it
    /// got ready (off a request's path).
    pub pidfd: Option<OwnedFd>,
    pub ns_pid: Option<u32>,
    /// The image its shell holds loaded ahead (`Request::Preload`).
    pub preloaded: Option<Arc<CachedImage>>,
    /// A connection to its control socket, open since it got ready: a
    /// preload and the start go on it (no connect on a create's path).
    pub session: Option<UnixStream>,
    /// Its family's uplink (the daemon's end, already watched; the other
    /// goes with the start), made with the shell.
    pub uplink: Option<(OwnedFd, OwnedFd)>,
}

/// Longest wait for a pooled shell's answer on its session.
pub const SESSION_TIMEOUT: Duration = Duration::from_secs(10);

/// A new family uplink: the daemon's end and the VMM process's.
pub fn uplink_pair() -> Option<(OwnedFd, OwnedFd)> {
    use rustix::net::{socketpair, AddressFamily, SocketFlags, SocketType};
    socketpair(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None).ok()
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
}

/// Why a VMM process could not be prepared.
#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    /// No user id to give.
    #[error(transparent)]
    Uid(#[from] UidError),
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
    /// Its record could not be written.
    #[error("record: {0}")]
    Record(io::Error),
    /// Its family's control group could not be made.
    #[error("control group: {0}")]
    Cgroup(CgroupError),
    /// It started but did not get ready (its own message, if it said one).
    #[error("{0}")]
    NotReady(String),
}

pub(super) fn new_id() -> String {
    let mut b = [0u8; 6];
    if fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut b)).is_err() {
        let n = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
        b.copy_from_slice(&n.to_le_bytes()[..6]);
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// A new VM id and its directory under `vms_dir`, still the daemon's own
/// (0700, root): the files the VMM process will use are made in it first,
/// and only then is it given to the VM ([`give_dir`]), so nothing a VMM
/// process of the same user id plants can be there when the daemon does.
pub fn new_vm_dir(vms_dir: &Path) -> Result<(String, PathBuf), DirError> {
    use std::os::unix::fs::DirBuilderExt;
    loop {
        let id = new_id();
        let dir = vms_dir.join(&id);
        match fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => return Ok((id, dir)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(source) => return Err(DirError::Create { dir, source }),
        }
    }
}

/// Give VM directory `dir` to user and group `uid` (it stays 0700): its VMM
/// process commits its files into it by renaming.
pub fn give_dir(dir: &Path, uid: u32) -> Result<(), DirError> {
    let owner = (Some(rustix::fs::Uid::from_raw(uid)), Some(rustix::fs::Gid::from_raw(uid)));
    rustix::fs::chown(dir, owner.0, owner.1).map_err(|source| DirError::Chown { dir: dir.to_path_buf(), source })
}

/// Spawn a VMM process with a prepared shell of `mem` bytes, under a user
/// id of its own and (with `cg`) in a new control group of its own with
/// those limits (its family's, once it holds a VM), record it, and wait
/// until it is ready. On any failure the user id, the directory, the
/// group, the record and the process (if it started) are given back.
pub fn spawn(vms_dir: &Path, records: &Records, uids: &Uids, pidns: Option<&PidNs>, mem: u64, cg: Option<(&Cgroups, &Limits)>, hosts: Option<u32>, recycle: bool) -> Result<Worker, SpawnError> {
    let uid = uids.alloc()?;
    let made = new_vm_dir(vms_dir).map_err(SpawnError::from).and_then(|(id, dir)| {
        let groups = match cg {
            Some((c, limits)) => c.create(&id, limits).map_err(SpawnError::Cgroup),
            None => Ok(Vec::new()),
        };
        groups
            .and_then(|groups| start(&id, &dir, records, uid, pidns, mem, &groups, hosts, recycle))
            .map(|child| {
                // Our own child, not reaped yet: the pid cannot have been reused.
                let pid = child.id();
                let pidfd = Pid::from_raw(pid as i32).and_then(|p| pidfd_open(p, PidfdFlags::empty()).ok());
                let ns_pid = crate::procfs::ns_pid(pid);
                let session = UnixStream::connect(dir.join("ctl.sock"))
                    .and_then(|s| s.set_read_timeout(Some(SESSION_TIMEOUT)).map(|()| s))
                    .ok();
                Worker { id: id.clone(), pid, dir: dir.clone(), child: Some(child), pidfd, ns_pid, preloaded: None, session, uplink: None }
            })
            .inspect_err(|_| {
                records.forget(&id);
                let _ = fs::remove_dir_all(&dir);
                if let Some((c, _)) = cg {
                    let _ = c.destroy(&id);
                }
            })
    });
    if made.is_err() {
        uids.free(uid);
    }
    made
}

/// Start `wispd __worker` for VM `id` in `dir` (joining the control
/// groups `groups` first thing), record it, wait for its "ready" and give
/// it its directory.
#[allow(clippy::too_many_arguments)]
fn start(id: &str, dir: &Path, records: &Records, uid: u32, pidns: Option<&PidNs>, mem: u64, groups: &[PathBuf], hosts: Option<u32>, recycle: bool) -> Result<Child, SpawnError> {
    let log = fs::File::create(dir.join("vmm.log")).map_err(SpawnError::Log)?;
    // The daemon's own binary through /proc/self/exe: the file this daemon
    // runs even once an upgrade has replaced (or removed) it on disk, so
    // its VMM processes match it; shown under its path.
    let exe = std::env::current_exe().map_err(SpawnError::Exe)?;
    let mut cmd = Command::new("/proc/self/exe");
    let shown = exe.to_string_lossy();
    std::os::unix::process::CommandExt::arg0(&mut cmd, shown.strip_suffix(" (deleted)").unwrap_or(&shown));
    cmd.arg("__worker").arg("--id").arg(id).arg("--dir").arg(dir).arg("--mem").arg(mem.to_string());
    cmd.arg("--uid").arg(uid.to_string());
    for g in groups {
        cmd.arg("--cgroup").arg(g);
    }
    if let Some(n) = hosts {
        cmd.arg("--group").arg(n.to_string());
        if recycle {
            cmd.arg("--recycle");
        }
    }
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(log);
    // One malloc arena: a VMM process has two threads and little heap. The
    // heap is not given back between the pooled phase and the start (a
    // `brk` on the start's path otherwise; what it keeps is small).
    cmd.env("MALLOC_ARENA_MAX", "1");
    cmd.env("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=1048576:glibc.malloc.top_pad=262144");
    // Its own process group: signals for the daemon's group (Ctrl-C) do
    // not reach VMs, and the VMs outlive the daemon.
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    let mut child = match pidns {
        Some(ns) => ns.spawn(&mut cmd),
        None => cmd.spawn(),
    }
    .map_err(SpawnError::Spawn)?;
    let fail = |child: &mut Child, e: SpawnError| {
        let _ = child.kill();
        let _ = child.wait();
        Err(e)
    };
    // Our child, not reaped yet: its pid and start time are its own.
    let p = Proc { uid, pid: child.id(), start: proc_start(child.id()), contained: !groups.is_empty(), hosts };
    if let Err(e) = records.register(id, p, None) {
        return fail(&mut child, SpawnError::Record(e));
    }
    let mut line = String::new();
    let mut out = BufReader::new(child.stdout.take().expect("piped"));
    let _ = out.by_ref().take(4096).read_line(&mut line);
    if line.trim() != "ready" {
        let msg = line.trim().strip_prefix("error: ").unwrap_or(line.trim()).to_string();
        return fail(&mut child, SpawnError::NotReady(if msg.is_empty() { "VMM process failed to start".into() } else { msg }));
    }
    if let Err(e) = give_dir(dir, uid) {
        return fail(&mut child, e.into());
    }
    Ok(child)
}

/// Send `req` (with `fds`) to the pooled VMM process in `dir`: on its open
/// session if there is one, else on a new connection; its answer is read
/// from the connection returned, within [`SESSION_TIMEOUT`].
pub fn send_to_shell(session: Option<UnixStream>, dir: &Path, req: &Request, fds: &[BorrowedFd<'_>]) -> io::Result<UnixStream> {
    match session {
        Some(s) => proto::send_on(s, req, fds),
        None => proto::send(&dir.join("ctl.sock"), req, fds, Some(SESSION_TIMEOUT)),
    }
}

/// Make prepared VMM process `w` (see [`spawn`]) a normal process again
/// if it was prepared in the background (the pool's refill thread runs
/// there: `wisp_jail::priority`).
pub fn to_foreground(w: &Worker) -> Result<(), SpawnError> {
    if !wisp_jail::priority::in_background() {
        return Ok(());
    }
    wisp_jail::priority::foreground_process(w.pid)
        .map_err(|e| SpawnError::NotReady(format!("cannot bring it out of the background: {e}")))
}

/// Have pooled VMM process `w` load `image` ahead of a start (see
/// `wisp_vmm_process::proto::Request::Preload`). A shell that fails to is
/// of no use (its process has ended): the caller discards it.
pub fn preload(w: &mut Worker, image: &Arc<CachedImage>) -> Result<(), SpawnError> {
    let req = Request::Preload { image_name: image.image.name.clone() };
    let err = |e: io::Error| SpawnError::NotReady(format!("preload: {e}"));
    let conn = send_to_shell(w.session.take(), &w.dir, &req, &[image.memfd.as_fd()]);
    let (reply, conn) = conn.and_then(proto::read_reply).map_err(err)?;
    // The session stays open for the start.
    w.session = Some(conn.into_inner());
    if !reply.ok {
        return Err(SpawnError::NotReady(format!("preload: {}", reply.error.unwrap_or_default())));
    }
    w.preloaded = Some(image.clone());
    Ok(())
}

/// Stop an unused VMM process (asked first, then killed) and reap it. Its
/// directory is left to the caller.
pub fn stop(w: &mut Worker) {
    let _ = proto::call(&w.dir.join("ctl.sock"), &Request::Shutdown, None, Some(Duration::from_secs(1)));
    if let Some(c) = w.child.as_mut() {
        let _ = c.kill();
        let _ = c.wait();
    }
}

/// SIGKILL the process behind `pidfd` (never a pid, which may have been
/// reused).
pub fn kill_fd(pidfd: &OwnedFd) {
    let _ = pidfd_send_signal(pidfd, Signal::KILL);
}

pub use crate::procfs::proc_start;

use crate::procfs::status_ids;

/// True if `pid` is a live VMM process for VM `id` (a forked VM's process
/// carries its family root's id): its command line is `wispd __worker --id
/// ID …`, every user and group id it has is `uid` (a VMM process's own,
/// which no other process has), and if `start` is known it started then
/// (against pid reuse). A process that only copied the command line, or
/// any process of another user, is not ours.
pub fn is_ours(pid: u32, id: &str, uid: u32, start: Option<u64>) -> bool {
    if pid <= 1 || pid == std::process::id() || !(UID_BASE..UID_BASE + UID_COUNT).contains(&uid) {
        return false;
    }
    let Ok(status) = fs::read_to_string(format!("/proc/{pid}/status")) else { return false };
    let only_uid = |key| status_ids(&status, key).is_some_and(|ids| ids.len() == 4 && ids.iter().all(|&u| u == uid));
    if !only_uid("Uid:") || !only_uid("Gid:") {
        return false;
    }
    if start.is_some() && proc_start(pid) != start {
        return false;
    }
    let Ok(cmdline) = fs::read(format!("/proc/{pid}/cmdline")) else { return false };
    let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
    args.get(1) == Some(&b"__worker".as_slice())
        && args.windows(2).any(|w| w[0] == b"--id" && w[1] == id.as_bytes())
}

/// A pidfd on `pid` if it [`is_ours`]: opened before the check, so a
/// signal sent through it reaches the process that was checked or none.
pub fn open_ours(pid: u32, id: &str, uid: u32, start: Option<u64>) -> Option<OwnedFd> {
    let fd = pidfd_open(Pid::from_raw(i32::try_from(pid).ok()?)?, PidfdFlags::empty()).ok()?;
    is_ours(pid, id, uid, start).then_some(fd)
}

/// Largest `exit.json` read.
const MAX_EXIT_FILE: u64 = 4096;

/// `exit.json` as a VMM process writes it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ExitFile {
    code: i32,
    reason: String,
}

/// How the VM in `dir` ended, as its VMM process wrote it. Advisory only
/// (the process may have been compromised): a file that is no regular
/// file, too large, malformed, or with a status outside 0..=255 counts as
/// none (the caller then reports that the VMM process died); control
/// characters in the reason are replaced.
pub fn read_exit(dir: &Path) -> Option<ExitInfo> {
    let bytes = read_capped(&dir.join("exit.json"), MAX_EXIT_FILE).ok()?;
    parse_exit(&bytes)
}

fn parse_exit(bytes: &[u8]) -> Option<ExitInfo> {
    let f: ExitFile = serde_json::from_slice(bytes).ok()?;
    if !(0..=255).contains(&f.code) {
        return None;
    }
    let reason = f.reason.chars().map(|c| if c.is_control() { '?' } else { c }).collect();
    Some(ExitInfo { code: f.code, reason })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_files_are_advisory_and_parsed_strictly() {
        assert_eq!(parse_exit(br#"{"code":143,"reason":"exited"}"#), Some(ExitInfo { code: 143, reason: "exited".into() }));
        let odd = parse_exit(b"{\"code\":0,\"reason\":\"a\\u001b[2Jb\\nc\"}").unwrap();
        assert_eq!(odd.reason, "a?[2Jb?c");
        for bad in [&b""[..], b"{", b"null", br#"{"code":256,"reason":""}"#, br#"{"code":-1,"reason":""}"#, br#"{"code":0}"#, br#"{"code":0,"reason":"","pid":1}"#] {
            assert_eq!(parse_exit(bad), None, "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn only_a_vmm_process_under_its_own_uid_is_ours() {
        // This test process: root, and no VMM process.
        let me = std::process::id();
        assert!(proc_start(me).is_some());
        assert!(!is_ours(me, "0123456789ab", UID_BASE, None));
        assert!(!is_ours(1, "0123456789ab", UID_BASE, None));
        assert!(!is_ours(me, "0123456789ab", 0, None), "root is never a VMM process's user");
        // A process under a VMM user id whose command line names a VM the
        // way a VMM process's does (xargs waits on its stdin): ours only for
        // that VM, that user id and that start time.
        let uid = UID_BASE + UID_COUNT - 1;
        let (u, argv) = (uid.to_string(), ["xargs", "__worker", "--id", "0123456789ab"]);
        let mut c = crate::procfs::spawn_as(&["--reuid", &u, "--regid", &u, "--clear-groups"], &argv, |cmd, _| cmd.starts_with(b"xargs\0"));
        let pid = c.id();
        let start = proc_start(pid);
        assert!(is_ours(pid, "0123456789ab", uid, None));
        assert!(is_ours(pid, "0123456789ab", uid, start));
        assert!(open_ours(pid, "0123456789ab", uid, start).is_some());
        assert!(!is_ours(pid, "0123456789ab", uid, start.map(|s| s + 1)), "another start time is another process");
        assert!(!is_ours(pid, "ba9876543210", uid, None), "another VM's");
        assert!(!is_ours(pid, "0123456789ab", uid - 1, None), "another user id's");
        assert!(open_ours(pid, "0123456789ab", uid - 1, None).is_none());
        drop(c.stdin.take());
        let _ = c.wait();
        assert!(!is_ours(pid, "0123456789ab", uid, None), "gone");
        let status = "Name:\tx\nUid:\t1000001\t1000001\t1000001\t1000001\nGid:\t5\t5\t5\t5\n";
        assert_eq!(status_ids(status, "Uid:"), Some(vec![1_000_001; 4]));
        assert_eq!(status_ids(status, "Gid:"), Some(vec![5; 4]));
        assert_eq!(status_ids(status, "Groups:"), None);
    }
}
