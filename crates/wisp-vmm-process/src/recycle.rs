//! A recycling group's VM thread (`wispd __worker --group N --recycle`;
//! issue 17, recycling; `docs/libraries.md` "Recycling").
//!
//! The group (`group.rs`) hosts runs of the `recycler` image with an
//! application library, as a group hosts VMs: each run is a VM of the
//! toolstack (its own id, directory, record, console and exit). What is
//! recycled is the KVM VM under it. A thread's first run boots the
//! recycler with the run's image and libraries; the guest says it is
//! ready before it reads its arguments, and the monitor keeps that ready
//! point (`wisp_vmm`'s `vm/reuse.rs`). When the app exits, the run's end
//! is recorded and the VM is scrubbed back to the ready point, where it
//! waits. The group's spare (the thread serving its socket, with a fresh
//! shell) hands a run of the same image and library files to such a
//! recycler, which only writes the run's arguments into the boot-info
//! page and lets the guest go on: no KVM VM, image load, library check or
//! mapping on its path. A run no recycler waits for is the spare's own:
//! it boots a recycler for it. A run the monitor stops (a fault, a kill,
//! its time limit) ends its VM for good.

use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

use wisp_api::ExitInfo;
use wisp_jail::seccomp::Role;
use wisp_vmm::{Outcome, ReuseStop, Shell, Vm};

use crate::boot::{self, Boot};
use crate::exit::{exit_info, Runner, ERROR};
use crate::hosting::{Hosting, Job};
use crate::process::{begin, Started};
use crate::proto::{send_line, Reply};

/// A recycler at its ready point, and the files it was booted from.
pub(crate) struct Kept {
    vm: Vm,
    files: Vec<(u64, u64)>,
}

/// A thread whose recycler waits at its ready point for a run of `files`.
pub(crate) struct Parked {
    files: Vec<(u64, u64)>,
    hand: Mutex<Hand>,
    cv: Condvar,
}

/// What a waiting recycler is given.
enum Hand {
    Wait,
    Run(Job),
    /// Make room: the recycler goes (its thread ends).
    Go,
}

/// The recyclers of a group waiting at their ready point, each on its
/// thread, at most as many as the group runs at once.
pub(crate) struct Pool {
    ready: Mutex<Vec<Arc<Parked>>>,
    most: usize,
}

impl Pool {
    pub(crate) fn new(most: usize) -> Pool {
        Pool { ready: Mutex::new(Vec::new()), most }
    }

    /// Give `job` to a recycler waiting with its files (the one that waited
    /// longest), or back if none does.
    pub(crate) fn hand_over(&self, job: Job) -> Result<(), Job> {
        let p = {
            let mut ready = self.ready.lock().unwrap();
            match ready.iter().position(|p| p.files == job.files) {
                Some(i) => ready.remove(i),
                None => return Err(job),
            }
        };
        give(&p, Hand::Run(job));
        Ok(())
    }

    /// Wait with `p` among the ready; the one that waited longest goes if
    /// that makes too many.
    fn park(&self, p: &Arc<Parked>) {
        let evicted = {
            let mut ready = self.ready.lock().unwrap();
            ready.push(p.clone());
            (ready.len() > self.most).then(|| ready.remove(0))
        };
        if let Some(old) = evicted {
            give(&old, Hand::Go);
        }
    }
}

/// The thread of a recycling group's VM, from its first run (`shell`, made
/// ahead, runs it) until its VM ends for good: after each run its recycler
/// waits at its ready point in `pool` until the spare hands it a run of
/// the same files (or it is the one that waited longest when too many do).
pub(crate) fn run(host: &dyn Hosting, pool: &Pool, shell: wisp_vmm::Result<Shell>, first: Job) {
    let mut shell = Some(shell);
    let mut narrowed = false;
    let mut job = first;
    let mut kept = None;
    loop {
        kept = serve_run(host, &mut shell, &mut narrowed, job, kept);
        let Some(k) = kept.as_ref() else {
            host.run_done();
            return;
        };
        let p = Arc::new(Parked { files: k.files.clone(), hand: Mutex::new(Hand::Wait), cv: Condvar::new() });
        pool.park(&p);
        host.run_done();
        let mut hand = p.hand.lock().unwrap();
        job = loop {
            match std::mem::replace(&mut *hand, Hand::Wait) {
                Hand::Run(j) => break j,
                Hand::Go => return,
                Hand::Wait => hand = p.cv.wait(hand).unwrap(),
            }
        };
    }
}

fn give(p: &Parked, what: Hand) {
    *p.hand.lock().unwrap() = what;
    p.cv.notify_one();
}

/// Run `job`: on the recycler it brings if that was booted from the same
/// files, else on one booted now (from `shell` if one was made ahead).
/// Returns the recycler, scrubbed back to its ready point, if the app
/// exited.
fn serve_run(host: &dyn Hosting, shell: &mut Option<wisp_vmm::Result<Shell>>, narrowed: &mut bool, job: Job, kept: Option<Kept>) -> Option<Kept> {
    let t = Instant::now();
    let kept = kept.filter(|k| k.files == job.files);
    let Job { shared, image, args, timeout, conn, attach, client, received_ns, data, net: _, stdin: _, libraries, files } = job;
    let fail = |conn: &std::os::unix::net::UnixStream, e: String| {
        let _ = send_line(conn, &Reply::err(&e), None);
        shared.end(ExitInfo { code: ERROR.into(), reason: e });
    };
    let fresh = kept.is_none();
    let mut vm = match kept {
        Some(Kept { mut vm, files }) => {
            let argv: Vec<&str> = std::iter::once(image.name.as_str()).chain(args.iter().map(String::as_str)).collect();
            if let Err(e) = vm.set_run_args(&argv) {
                // Still at its ready point: kept for the next run.
                fail(&conn, e.to_string());
                return Some(Kept { vm, files });
            }
            vm
        }
        None => {
            let made = match shell.take() {
                Some(s) => s,
                None => host.fresh_shell(),
            };
            match made.and_then(|s| boot_recycler(s, &image, &args, data, libraries)) {
                Ok(vm) => vm,
                Err(e) => {
                    fail(&conn, e.to_string());
                    return None;
                }
            }
        }
    };
    drop(image);
    let boot_us = t.elapsed().as_micros() as u64;
    let mut sink = begin(&shared, &mut vm, conn, Started { boot_us, received_ns, held: !fresh }, attach, client, None);
    if shared.state.lock().unwrap().kill_asked {
        vm.control().kill();
    }
    let deadline = timeout.map(|t| Instant::now() + t);
    let mut outcome = vm.run_until_fork(&mut sink, deadline);
    if vm.reuse_stop() == Some(ReuseStop::Ready) {
        if let Err(e) = vm.keep_ready_point() {
            drop(sink);
            shared.end(ExitInfo { code: ERROR.into(), reason: format!("recycler: keep the ready point: {e}") });
            return None;
        }
        // A vCPU thread's role from here (a deny list on the forking one's).
        if !*narrowed {
            crate::narrow::narrow_from(Role::VcpuFork, Role::Vcpu);
            *narrowed = true;
        }
        outcome = vm.run_until_fork(&mut sink, deadline);
    }
    drop(sink);
    match (vm.reuse_stop(), outcome) {
        (Some(ReuseStop::Ended(code)), _) => {
            shared.end(exit_info(&Outcome::Exited(code), Runner::Daemon));
            match vm.scrub() {
                Ok(_) => Some(Kept { vm, files }),
                Err(e) => {
                    wisp_vmm::stderr_line(&format!("wisp-vmm group: scrub a recycler: {e}: it goes"));
                    None
                }
            }
        }
        (_, Some(o)) => {
            shared.end(exit_info(&o, Runner::Daemon));
            None
        }
        (_, None) => {
            shared.end(ExitInfo { code: ERROR.into(), reason: "a recycler forked".into() });
            None
        }
    }
}

/// A recycler of `image` with `libraries` booted on `shell` with `args`,
/// reusable (it stops at its ready point); a family of one.
pub(crate) fn boot_recycler(
    shell: Shell,
    image: &wisp_vmm::Image,
    args: &[String],
    data: Option<wisp_vmm::DataDevice>,
    libraries: Vec<wisp_vmm::devices::library::LibraryDevice>,
) -> wisp_vmm::Result<Vm> {
    let family = boot::daemon_family(false, Some(1));
    let mut vm = boot::load(shell, Boot { image, args, net: Vec::new(), data, disks: Vec::new(), libraries, family })?;
    vm.set_reusable();
    Ok(vm)
}
