//! The runtime's commands. `create` forks the container's process, which
//! joins the engine's network namespace, hands the VM the namespace's
//! interface (`net`), makes the VM (image loaded, RAM and devices ready:
//! the boot's cold part is paid before `start`), tells `create` it is
//! ready and waits on `exec.fifo`; `start` opens the fifo, and the process
//! runs the VM and exits with the guest's status (a signal from `kill`
//! ends it as it would any process: 128+N to the engine). The process is
//! the engine's to reap: `create` exits once it is ready, and the
//! engine's subreaper (conmon, containerd's shim) adopts it.

use std::ffi::CString;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::{Duration, Instant};

use oci_spec::runtime::{ContainerState, FeaturesBuilder, LinuxFeatureBuilder, LinuxNamespaceType, StateBuilder};

use crate::bundle::{self, Plan};
use crate::log::Log;
use crate::state::{self, Record, Root};

/// The runtime-spec version this runtime speaks.
const OCI_VERSION: &str = "1.0.2";
/// Longest `start` waits for the container's process at its gate, and
/// `delete --force` for it to die.
const WAIT: Duration = Duration::from_secs(10);

pub fn create(
    root: &Root,
    log: &Log,
    id: &str,
    bundle_dir: &Path,
    pid_file: Option<&Path>,
    console_socket: Option<&Path>,
    preserve_fds: u32,
) -> Result<(), String> {
    let plan = bundle::read(bundle_dir)?;
    if preserve_fds > 0 {
        return Err(format!("--preserve-fds {preserve_fds}: a VM takes no descriptors from the host"));
    }
    let console = match (plan.terminal, console_socket) {
        (true, Some(s)) => Some(crate::console::open(s)?),
        (true, None) => return Err("process.terminal is set but no --console-socket was given".into()),
        (false, _) => None,
    };
    for gone in root.sweep() {
        log.debug(&format!("container {gone}: its process and engine are gone; its state removed"));
    }
    // SAFETY: getppid takes no arguments.
    let engine_pid = unsafe { libc::getppid() };
    let engine_start = state::start_time(engine_pid).unwrap_or(0);
    let dir = root.make(id)?;
    let made = (|| {
        let fifo = dir.fifo();
        let c = CString::new(fifo.as_os_str().as_bytes()).map_err(|e| e.to_string())?;
        // SAFETY: mkfifo reads the NUL-terminated path, a live CString.
        if unsafe { libc::mkfifo(c.as_ptr(), 0o600) } != 0 {
            return Err(format!("{}: {}", fifo.display(), std::io::Error::last_os_error()));
        }
        let groups = match &plan.cgroups_path {
            Some(p) => {
                let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").map_err(|e| format!("/proc/self/mountinfo: {e}"))?;
                crate::cgroup::groups(p, &mountinfo)?
            }
            None => Vec::new(),
        };
        let cgroups: Vec<_> = groups.iter().map(|g| g.dir.clone()).collect();
        let launched = (|| {
            let child = spawn(&plan, &groups, &fifo, console)?;
            // From here a failure ends the child (it also ends by itself if
            // this process dies before it says go: its read of `go` sees the
            // end).
            let pid = child.pid;
            log.debug(&format!("container {id}: process {pid} ready"));
            let recorded = (|| {
                let pid_start = state::start_time(pid).ok_or_else(|| format!("the container's process {pid} ended at once"))?;
                let created = crate::log::rfc3339(std::time::SystemTime::now());
                let rec = Record { id: id.into(), bundle: plan.bundle.clone(), pid, pid_start, created, annotations: plan.annotations.clone(), engine_pid, engine_start, cgroups: cgroups.clone() };
                dir.save(&rec)?;
                match pid_file {
                    Some(p) => write_pid_file(p, pid),
                    None => Ok(()),
                }
            })();
            match recorded {
                Ok(()) => child.go(),
                Err(e) => {
                    child.end();
                    Err(e)
                }
            }
        })();
        // No process is in the groups now unless the container was made.
        if launched.is_err() {
            let _ = crate::cgroup::remove(&cgroups);
        }
        launched
    })();
    if made.is_err() {
        let _ = dir.remove();
    }
    made
}

/// The container's process, ready at its gate, waiting for `go` (the
/// state and pid file written).
struct Child {
    pid: i32,
    go: OwnedFd,
}

impl Child {
    fn go(self) -> Result<(), String> {
        std::fs::File::from(self.go).write_all(b"go").map_err(|e| format!("the container's process: {e}"))
    }

    /// Kill and reap it.
    fn end(self) {
        // SAFETY: kill and waitpid take our own child's pid.
        unsafe {
            libc::kill(self.pid, libc::SIGKILL);
            libc::waitpid(self.pid, std::ptr::null_mut(), 0);
        }
    }
}

/// A pipe's (read, write) ends, close-on-exec.
fn pipe() -> Result<(OwnedFd, OwnedFd), String> {
    let mut fds = [0; 2];
    // SAFETY: pipe2 writes two descriptors into the array it is given.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(format!("pipe: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: both numbers were just returned by pipe2 and are owned here.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Fork the container's process; returns it once it is ready at its gate,
/// or why it could not get there.
fn spawn(plan: &Plan, groups: &[crate::cgroup::Group], fifo: &Path, console: Option<OwnedFd>) -> Result<Child, String> {
    let (ready_r, ready_w) = pipe()?;
    let (go_r, go_w) = pipe()?;
    // SAFETY: this process is single-threaded (the runtime's command line
    // starts no thread before this), so the child may do anything.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(format!("fork: {}", std::io::Error::last_os_error()));
    }
    if pid == 0 {
        drop((ready_r, go_w));
        let code = crate::init::run(plan, groups, fifo, ready_w, go_r, console);
        std::process::exit(code);
    }
    drop((ready_w, go_r));
    let child = Child { pid, go: go_w };
    let mut said = Vec::new();
    let _ = std::fs::File::from(ready_r).read_to_end(&mut said);
    if said == b"ready" {
        return Ok(child);
    }
    child.end();
    let said = String::from_utf8_lossy(&said).into_owned();
    Err(if said.is_empty() { "the container's process ended before it was ready".into() } else { said })
}

fn write_pid_file(path: &Path, pid: i32) -> Result<(), String> {
    let tmp = path.with_extension("wisp-oci.tmp");
    std::fs::write(&tmp, pid.to_string()).and_then(|()| std::fs::rename(&tmp, path)).map_err(|e| format!("pid file {}: {e}", path.display()))
}

pub fn start(root: &Root, id: &str) -> Result<(), String> {
    let (dir, rec) = root.open(id)?;
    let status = dir.status(&rec);
    if status != ContainerState::Created {
        return Err(format!("container {id} is {status}, not created"));
    }
    let fifo = dir.fifo();
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&fifo)
        .map_err(|e| format!("{}: {e}", fifo.display()))?;
    // The process, let through its gate, writes one byte (and removes the
    // fifo). Another `start` that took the byte: the fifo is gone.
    let deadline = Instant::now() + WAIT;
    loop {
        let mut b = [0u8; 1];
        match (&f).read(&mut b) {
            Ok(1) => break,
            _ if !fifo.exists() => return Err(format!("container {id} was started by another start")),
            Ok(_) | Err(_) if !state::alive(rec.pid, rec.pid_start) => return Err(format!("container {id}'s process ended before it started")),
            _ if Instant::now() >= deadline => return Err(format!("container {id}'s process did not start within {WAIT:?}")),
            _ => {
                let mut p = libc::pollfd { fd: f.as_raw_fd(), events: libc::POLLIN, revents: 0 };
                // SAFETY: poll reads and writes one pollfd, a live local.
                unsafe { libc::poll(&mut p, 1, 50) };
            }
        }
    }
    Ok(())
}

pub fn state(root: &Root, id: &str) -> Result<String, String> {
    let (dir, rec) = root.open(id)?;
    let status = dir.status(&rec);
    let mut b = StateBuilder::default().version(OCI_VERSION).id(id).status(status).bundle(rec.bundle.clone()).annotations(rec.annotations.clone());
    if status != ContainerState::Stopped {
        b = b.pid(rec.pid);
    }
    let s = b.build().map_err(|e| e.to_string())?;
    serde_json::to_string_pretty(&s).map_err(|e| e.to_string())
}

pub fn kill(root: &Root, id: &str, signal: &str) -> Result<(), String> {
    let signo = parse_signal(signal)?;
    let (_, rec) = root.open(id)?;
    let not_running = || format!("container {id}: container not running");
    let pidfd = process(&rec).ok_or_else(not_running)?;
    send(&pidfd, signo).map_err(|e| if e.raw_os_error() == Some(libc::ESRCH) { not_running() } else { format!("kill {}: {e}", rec.pid) })
}

/// A descriptor for the container's process — the one recorded (its start
/// time checked once the descriptor holds it: a pid reused since cannot
/// be signalled through it) — if it lives.
fn process(rec: &Record) -> Option<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, rec.pid, 0) };
    if fd < 0 {
        return None;
    }
    // SAFETY: the number was just returned by pidfd_open and is owned here.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    state::alive(rec.pid, rec.pid_start).then_some(fd)
}

fn send(pidfd: &OwnedFd, signo: i32) -> std::io::Result<()> {
    // SAFETY: pidfd_send_signal takes a pidfd, a signal number, a null
    // siginfo and flags.
    let r = unsafe { libc::syscall(libc::SYS_pidfd_send_signal, pidfd.as_raw_fd(), signo, std::ptr::null::<libc::siginfo_t>(), 0) };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

pub fn delete(root: &Root, id: &str, force: bool) -> Result<(), String> {
    let (dir, rec) = root.open(id)?;
    match dir.status(&rec) {
        ContainerState::Stopped => {}
        // As runc: a container never started is deleted with its process.
        ContainerState::Created | ContainerState::Creating => end(&rec)?,
        ContainerState::Running if force => end(&rec)?,
        ContainerState::Running => return Err(format!("container {id} is running: stop it first, or delete --force")),
    }
    dir.remove()?;
    // Its process is gone: its groups are empty (best effort: a group
    // that cannot be removed must not keep the container).
    if let Err(e) = crate::cgroup::remove(&rec.cgroups) {
        eprintln!("wisp-oci: {e}");
    }
    Ok(())
}

/// Kill the container's process and wait until it is gone (or a zombie
/// for its engine to reap: its pidfd is readable from then on).
fn end(rec: &Record) -> Result<(), String> {
    let Some(pidfd) = process(rec) else { return Ok(()) };
    match send(&pidfd, libc::SIGKILL) {
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => return Ok(()),
        Err(e) => return Err(format!("kill {}: {e}", rec.pid)),
        Ok(()) => {}
    }
    let mut p = libc::pollfd { fd: pidfd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    // SAFETY: poll reads and writes one pollfd, a live local.
    let n = unsafe { libc::poll(&mut p, 1, WAIT.as_millis() as i32) };
    if n == 1 {
        Ok(())
    } else {
        Err(format!("container {}'s process {} did not die within {WAIT:?}", rec.id, rec.pid))
    }
}

/// A signal by number or name (`9`, `KILL`, `SIGKILL`).
fn parse_signal(s: &str) -> Result<i32, String> {
    if let Ok(n) = s.parse::<i32>() {
        return if (1..=64).contains(&n) { Ok(n) } else { Err(format!("invalid signal {s}")) };
    }
    const NAMES: [(&str, i32); 16] = [
        ("HUP", libc::SIGHUP),
        ("INT", libc::SIGINT),
        ("QUIT", libc::SIGQUIT),
        ("KILL", libc::SIGKILL),
        ("USR1", libc::SIGUSR1),
        ("USR2", libc::SIGUSR2),
        ("PIPE", libc::SIGPIPE),
        ("ALRM", libc::SIGALRM),
        ("TERM", libc::SIGTERM),
        ("CHLD", libc::SIGCHLD),
        ("CONT", libc::SIGCONT),
        ("STOP", libc::SIGSTOP),
        ("TSTP", libc::SIGTSTP),
        ("WINCH", libc::SIGWINCH),
        ("PWR", libc::SIGPWR),
        ("SYS", libc::SIGSYS),
    ];
    let name = s.strip_prefix("SIG").unwrap_or(s);
    NAMES.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|&(_, v)| v).ok_or_else(|| format!("invalid signal {s}"))
}

pub fn features() -> String {
    let linux = LinuxFeatureBuilder::default().namespaces(vec![LinuxNamespaceType::Network]).build().expect("all fields set");
    let annotations = [
        ("org.wisp.runtime".to_string(), "a wisp VM per container (KVM)".to_string()),
        (bundle::IMAGE_ANNOTATION.to_string(), format!("the image's path in the root filesystem (default {})", bundle::DEFAULT_IMAGE)),
    ];
    let f = FeaturesBuilder::default()
        .oci_version_min("1.0.0")
        .oci_version_max(OCI_VERSION)
        .hooks(Vec::<String>::new())
        .mount_options(Vec::<String>::new())
        .linux(linux)
        .annotations(annotations.into_iter().collect::<std::collections::HashMap<_, _>>())
        .build()
        .expect("all fields set");
    serde_json::to_string_pretty(&f).expect("serialisable")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signals_by_number_and_name() {
        assert_eq!(parse_signal("9"), Ok(libc::SIGKILL));
        assert_eq!(parse_signal("SIGTERM"), Ok(libc::SIGTERM));
        assert_eq!(parse_signal("term"), Ok(libc::SIGTERM));
        assert_eq!(parse_signal("KILL"), Ok(libc::SIGKILL));
        for bad in ["0", "65", "SIGNOPE", "", "-1"] {
            assert!(parse_signal(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn features_are_json() {
        let v: serde_json::Value = serde_json::from_str(&features()).unwrap();
        assert_eq!(v["ociVersionMax"], OCI_VERSION);
        assert_eq!(v["linux"]["namespaces"][0], "network");
    }
}
