//! The container's process (forked by `create`): it becomes the VM's
//! monitor. Before `start` it joins the network namespace, plumbs the
//! namespace's interface to a tap for the VM (`net`), loads the image and
//! makes the VM; then it tells `create` it is ready and waits at
//! `exec.fifo` until `start` opens it; then it runs the guest, its console
//! on this process's stdout (the engine's log), and exits with the guest's
//! status. A Kubernetes pod's sandbox container has no VM: its process
//! joins the namespace and, once started, waits as `pause` does for
//! SIGTERM or SIGINT, then exits 0.

use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;

use wisp_abi::DeviceKind;
use wisp_vmm::{DataDevice, Image, DEFAULT_MEM};
use wisp_vmm_process::boot::{self, Boot};
use wisp_vmm_process::exit::{exit_info, Runner};

use crate::bundle::{Netns, Plan};

/// Run as the container's process; returns its exit status. `ready`:
/// where `create` waits for "ready" or why not; `go`: where `create` says
/// "go" once it has recorded the container (its end: `create` died, and so
/// does this process); `console`: the terminal to take as stdio, if the
/// container has one.
pub fn run(plan: &Plan, groups: &[crate::cgroup::Group], fifo: &Path, ready: OwnedFd, go: OwnedFd, console: Option<OwnedFd>) -> i32 {
    // Only what this process needs stays open: not what the engine left
    // open in `create` (runc closes them too).
    let mut keep = vec![ready.as_raw_fd(), go.as_raw_fd()];
    keep.extend(console.as_ref().map(|c| c.as_raw_fd()));
    keep.extend(plan.image.as_ref().map(|(_, fd)| fd.as_raw_fd()));
    // SAFETY: this process has one thread; what it owns is in `keep`, and
    // everything else was the engine's, never used here.
    unsafe { wisp_vmm::close_all_but(&keep) };
    let ready = std::fs::File::from(ready);
    let vm = match make(plan, groups, console) {
        Ok(vm) => vm,
        Err(e) => {
            tell(&ready, &e);
            return 1;
        }
    };
    tell(&ready, "ready");
    drop(ready);
    let mut word = [0u8; 2];
    if std::fs::File::from(go).read_exact(&mut word).is_err() || &word != b"go" {
        return 1;
    }
    // The gate: opening the fifo for writing blocks until `start` opens it
    // for reading; the byte tells `start` we are through, and the fifo,
    // gone, that the container runs (even if `start` is killed now).
    match std::fs::OpenOptions::new().write(true).open(fifo) {
        Ok(mut f) => {
            let _ = std::fs::remove_file(fifo);
            if f.write_all(b"0").is_err() {
                return 1;
            }
        }
        Err(e) => {
            wisp_vmm::stderr_line(&format!("wisp-oci: {}: {e}", fifo.display()));
            return 1;
        }
    }
    let Some(mut vm) = vm else {
        // A pod's sandbox: as `pause`, wait for SIGTERM or SIGINT, exit 0
        // (one that comes before the mask is set ends it by the signal).
        let stops = sigset(&[libc::SIGTERM, libc::SIGINT]);
        let mut sig = 0;
        // SAFETY: pthread_sigmask and sigwait read a live sigset; sigwait
        // writes one int; this process has one thread.
        unsafe {
            libc::pthread_sigmask(libc::SIG_BLOCK, &stops, std::ptr::null_mut());
            libc::sigwait(&stops, &mut sig);
        }
        return 0;
    };
    // The engine's stdin (a pipe with `-i`, /dev/null without: end of
    // input at once) is the guest's.
    wisp_vmm_process::terminal::feed_stdin(vm.attach_stdin());
    let mut out = wisp_vmm_process::terminal::Terminal(std::io::stdout().lock());
    let outcome = vm.run(&mut out, None);
    let _ = out.flush();
    let exit = exit_info(&outcome, Runner::Direct);
    if exit.reason != "exited" {
        wisp_vmm::stderr_line(&format!("wisp-oci: VM stopped: {}", exit.reason));
    }
    // The VM's memory and threads go with the process.
    std::mem::forget(vm);
    exit.code as i32
}

/// Everything before `ready`: the container's groups (before anything is
/// allocated: guest RAM is charged where it is first touched), a session
/// of its own (the engine's terminal signals are not its), the terminal,
/// the network namespace, and the VM (none for a pod's sandbox).
fn make(plan: &Plan, groups: &[crate::cgroup::Group], console: Option<OwnedFd>) -> Result<Option<wisp_vmm::Vm>, String> {
    crate::cgroup::join(groups, &plan.limits)?;
    // SAFETY: setsid takes no arguments.
    unsafe { libc::setsid() };
    if let Some(tty) = console {
        crate::console::take(tty)?;
    }
    join(&plan.netns)?;
    plan.image.as_ref().map(|(name, fd)| prepare(plan, name, fd)).transpose()
}

/// The VM (`name`, `image`: the plan's image), in the namespace joined.
fn prepare(plan: &Plan, name: &str, image: &OwnedFd) -> Result<wisp_vmm::Vm, String> {
    // From the descriptor `create` opened: its whole pages mapped
    // copy-on-write (containers of one image share them in the page
    // cache), unless the image had to be relocated.
    let fd = image.try_clone().map_err(|e| format!("image {name}: {e}"))?;
    let img = Image::from_fd(name, fd).map_err(|e| format!("image {name}: {e}"))?;
    let wants_nic = img.manifest.devices().iter().any(|d| d.kind == DeviceKind::Net as u32);
    let net = match &plan.netns {
        Netns::Join(_) | Netns::New if wants_nic => crate::net::plumb()?,
        _ => None,
    };
    let data = if plan.env.is_empty() { None } else { Some(DataDevice::new(&plan.env, &[]).map_err(|e| format!("process.env: {e}"))?) };
    let shell = boot::prepare(plan.limits.memory.unwrap_or(DEFAULT_MEM)).map_err(|e| e.to_string())?;
    let family = boot::direct_family(wisp_abi::family::limits::MAX_MEMBERS as u32);
    let boot = Boot { image: &img, args: &plan.args, net: net.into_iter().collect(), data, disks: vec![], libraries: vec![], family };
    boot::load(shell, boot).map_err(|e| e.to_string())
}

fn sigset(signals: &[i32]) -> libc::sigset_t {
    // SAFETY: sigemptyset initialises the set it is given; sigaddset adds
    // valid signal numbers to it.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for &s in signals {
            libc::sigaddset(&mut set, s);
        }
        set
    }
}

/// Enter the network namespace the bundle names (or a new one).
fn join(ns: &Netns) -> Result<(), String> {
    match ns {
        Netns::Host => Ok(()),
        Netns::New => {
            // SAFETY: unshare takes a flag word.
            if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
                return Err(format!("new network namespace: {}", std::io::Error::last_os_error()));
            }
            Ok(())
        }
        Netns::Join(path) => {
            let f = std::fs::File::open(path).map_err(|e| format!("network namespace {}: {e}", path.display()))?;
            // The runtime's own namespace named by path (`--network
            // ns:/proc/1/ns/net`): the host's; its interfaces are not the
            // VM's to take over.
            let (a, b) = (f.metadata(), std::fs::metadata("/proc/self/ns/net"));
            if let (Ok(a), Ok(b)) = (a, b) {
                use std::os::unix::fs::MetadataExt;
                if (a.dev(), a.ino()) == (b.dev(), b.ino()) {
                    return Err(format!("network namespace {} is the runtime's own (the host's): its interface is not handed to a VM", path.display()));
                }
            }
            // SAFETY: setns takes a descriptor (open for the call's length)
            // and a namespace type.
            if unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                return Err(format!("network namespace {}: {}", path.display(), std::io::Error::last_os_error()));
            }
            Ok(())
        }
    }
}

/// Say `msg` to `create` on the ready pipe.
fn tell(mut w: &std::fs::File, msg: &str) {
    let _ = w.write_all(msg.as_bytes());
}
