//! The PID namespace of VMM processes: one per state directory, held open
//! by a small init process of its own (`wispd __pidns`).
//!
//! A VMM process in it sees and signals only processes of that namespace
//! (other VMM processes, under other user ids, so not even those), never
//! the daemon or any other host process; a pid it reports (in a fork note)
//! is a number of that namespace, which the daemon translates
//! (`crate::procfs::ns_pid`) and never trusts.
//!
//! Why one namespace for all VMs and not one per VM: a namespace ends (and
//! every process in it is killed) when its init process ends. A VM's own
//! process as init would take its forked children with it, and a VM family
//! under the daemon outlives its root; an init process per VM would double
//! the processes per VM (DAMON charges for every process mapping the
//! binary, `MACHINE.md`). One holder per daemon costs one idle process.
//!
//! The holder survives the daemon (the VMs do too); a restarted daemon
//! finds it through `<state>/pidns` (the daemon's own directory) and checks
//! that it is still the same process before it enters its namespace.

use std::fs;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use rustix::fs::{openat, Mode, OFlags, CWD};
use rustix::thread::{move_into_link_name_space, LinkNameSpaceType};
use serde::{Deserialize, Serialize};

/// User and group id of the holder: below the VMM processes' range, used by
/// nothing else, so no VMM process (nor anyone but root) can signal it.
/// (`daemon::uids` checks that its range starts above it.)
pub const HOLDER_UID: u32 = 999_999;

/// What `<state>/pidns` records.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Holder {
    pid: u32,
    start: u64,
}

/// The namespace, entered by [`PidNs::spawn`].
pub struct PidNs {
    /// `/proc/<holder>/ns/pid`.
    ns: OwnedFd,
    /// The holder's pid (host).
    pub pid: u32,
}

impl PidNs {
    /// The namespace of state directory `state`: the recorded holder if it
    /// still runs, else a new one.
    pub fn open_or_create(state: &Path) -> io::Result<PidNs> {
        let rec = state.join("pidns");
        if let Some(ns) = fs::read(&rec).ok().and_then(|b| serde_json::from_slice::<Holder>(&b).ok()).and_then(|h| reopen(&h)) {
            return Ok(ns);
        }
        let mut child = in_thread(None, || holder_command(state).spawn())?;
        let pid = child.id();
        // It says "ready" once it runs as its own user (or ends: EOF).
        let mut line = String::new();
        let out = child.stdout.take().expect("piped");
        let _ = io::BufRead::read_line(&mut io::BufReader::new(io::Read::take(out, 64)), &mut line);
        if line.trim() != "ready" {
            let _ = child.kill();
            let _ = child.wait();
            return Err(io::Error::other("the PID namespace holder did not start"));
        }
        // Not waited for: the holder outlives this daemon.
        std::mem::forget(child);
        let start = crate::procfs::proc_start(pid).ok_or_else(|| io::Error::other("the PID namespace holder ended at once"))?;
        let h = Holder { pid, start };
        let ns = reopen(&h).ok_or_else(|| io::Error::other("the PID namespace holder is not as started"))?;
        crate::fsutil::write_atomic(&rec, &serde_json::to_vec(&h).map_err(io::Error::other)?)?;
        Ok(ns)
    }

    /// Spawn `cmd` inside the namespace (from a short-lived thread: a thread
    /// whose children go to another PID namespace cannot make threads).
    pub fn spawn(&self, cmd: &mut Command) -> io::Result<Child> {
        in_thread(Some(self.ns.as_fd()), || cmd.spawn())
    }
}

/// Run `f` on a new thread whose children go to PID namespace `ns` (None:
/// to a new one).
fn in_thread<T: Send>(ns: Option<std::os::fd::BorrowedFd<'_>>, f: impl FnOnce() -> io::Result<T> + Send) -> io::Result<T> {
    std::thread::scope(|s| {
        s.spawn(|| {
            match ns {
                Some(fd) => move_into_link_name_space(fd, Some(LinkNameSpaceType::ProcessID))?,
                // SAFETY: only the PID namespace of this thread's future
                // children changes; no descriptor table is unshared.
                None => unsafe { rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWPID) }?,
            }
            f()
        })
        .join()
        .map_err(|_| io::Error::other("PID namespace thread panicked"))?
    })
}

/// `wispd __pidns --state-dir STATE`: the holder, in no one's process group.
fn holder_command(state: &Path) -> Command {
    let exe = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("/proc/self/exe"));
    let mut cmd = Command::new(exe);
    cmd.arg("--state-dir").arg(state).arg("__pidns");
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::null());
    std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
    cmd
}

/// The holder's namespace, if the process `h` names is still it: the same
/// start time, `wispd … __pidns` under [`HOLDER_UID`], pid 1 of its
/// namespace.
fn reopen(h: &Holder) -> Option<PidNs> {
    if crate::procfs::proc_start(h.pid)? != h.start {
        return None;
    }
    let status = fs::read_to_string(format!("/proc/{}/status", h.pid)).ok()?;
    let ids = |key: &str| status_ids(&status, key).map(|ids| ids.iter().all(|&u| u == HOLDER_UID));
    let cmdline = fs::read(format!("/proc/{}/cmdline", h.pid)).ok()?;
    if ids("Uid:") != Some(true) || ids("Gid:") != Some(true) || !cmdline.split(|&b| b == 0).any(|a| a == b"__pidns") || ns_pid(h.pid) != Some(1) {
        return None;
    }
    let ns = openat(CWD, format!("/proc/{}/ns/pid", h.pid), OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty()).ok()?;
    // The start time again: the pid cannot have been reused in between.
    (crate::procfs::proc_start(h.pid)? == h.start).then_some(PidNs { ns, pid: h.pid })
}

use crate::procfs::{ns_pid, status_ids};


/// The holder's life: drop to [`HOLDER_UID`] and reap whatever is
/// re-parented to it (forked VMM processes whose parent ended), forever.
pub fn holder_main() -> ! {
    let _ = rustix::thread::set_name(c"wisp-pidns");
    // SAFETY: credential and signal-mask calls on this single-threaded
    // process; `set` is a valid signal set for the calls that take it.
    unsafe {
        if libc::setgroups(0, std::ptr::null()) != 0
            || libc::setresgid(HOLDER_UID, HOLDER_UID, HOLDER_UID) != 0
            || libc::setresuid(HOLDER_UID, HOLDER_UID, HOLDER_UID) != 0
        {
            std::process::exit(1);
        }
        libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
        // Ready; standard output is the daemon's pipe, closed after this.
        libc::write(1, b"ready\n".as_ptr().cast(), 6);
        let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
        libc::dup2(null, 1);
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGCHLD);
        libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        loop {
            // Reap every ended child, then sleep until another ends (a
            // blocked SIGCHLD stays pending, so none is missed).
            while libc::waitpid(-1, std::ptr::null_mut(), libc::WNOHANG) > 0 {}
            libc::sigwaitinfo(&set, std::ptr::null_mut());
        }
    }
}
