//! A group VMM process (`wispd __worker --group N`): up to N VMs of one
//! tenant and one size in one jailed process, so that thousands of idle
//! VMs cost a few hundred processes rather than thousands (see
//! `docs/toolstack.md`, density).
//!
//! Every VM is still a KVM VM of its own, run by a thread of its own (its
//! vCPU thread): a guest that faults or is killed stops that thread only,
//! and its neighbours run on. What the VMs share is the sandbox (user id,
//! namespaces, seccomp filters, control group), which is why a group holds
//! the VMs of one tenant only, and no VM that may fork or has a NIC.
//!
//! The next VM's thread is made ahead (the *spare*): it creates and enters
//! its shell, loads the image the group ran last into it, and then serves
//! the group's control socket itself (narrowing its filter to a vCPU
//! thread's once its VM is loaded). A `host`
//! request thus wakes the very thread that will run the VM: no hand-off,
//! thread, KVM VM or filter on its path. The main thread serves every
//! hosted VM's own control socket with one poll (a `wait` is parked until
//! its VM ends: an idle VM costs one thread), and makes the next spare
//! once the last one has taken a VM.

use std::io::{self, Write};
use std::os::fd::OwnedFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustix::event::{eventfd, poll, EventfdFlags, PollFd, PollFlags};
use wisp_api::ExitInfo;
use wisp_jail::seccomp::Role;
use wisp_jail::JailFiles;
use wisp_vmm::{Image, Kvm, Shell};

use crate::boot::{self, Boot};
use crate::hosting::{Hosting, Job};
use crate::control::{accept_timed, next_pooled, read_request, serve_hosted};
use crate::exit::{exit_info, Runner, ERROR};
use crate::process::{begin, Started};
use crate::proto::{send_line, Reply, Request, WorkerState};
use crate::state::Shared;

/// Stack of a VM's thread (the monitor's run loop needs little; only the
/// pages touched cost memory).
const VCPU_STACK: usize = 256 << 10;

/// Entry point of a group VMM process `id` in directory `dir`: up to `n`
/// VMs of `mem` bytes, jailed as user and group `uid`. Never returns.
pub fn main(id: &str, dir: &Path, mem: u64, uid: u32, n: u32, recycle: bool) -> ! {
    match run(dir, mem, uid, n, recycle) {
        Ok(()) => std::process::exit(0),
        Err(e) => {
            eprintln!("wisp-vmm group {id}: {e}");
            println!("error: {e}");
            std::process::exit(1)
        }
    }
}

/// A VM the group runs, as the main thread serves it.
struct Hosted {
    shared: Arc<Shared>,
    listener: UnixListener,
    sessions: Vec<UnixStream>,
}

/// The image of the last VM hosted, and which file it came from: a `host`
/// of the same file (the daemon's image cache hands out one memfd per
/// image) reuses it, unparsed and uncopied, and the next spare loads it
/// ahead.
struct Last {
    file: (u64, u64),
    image: Image,
}

/// What the group's threads share.
struct Group {
    kvm: Kvm,
    mem: u64,
    sync_regs: bool,
    /// Most VMs running at once.
    n: usize,
    /// A recycling group (`recycle.rs`): its VMs are recyclers, each kept
    /// at its ready point between runs.
    recycle: bool,
    /// Recyclers at their ready point, each waiting for a run of the
    /// files it was booted from (`recycle.rs`).
    recyclers: crate::recycle::Pool,
    /// Recycler endpoints asked for, for the main thread to start.
    endpoints: Mutex<Vec<crate::endpoint::Endpoint>>,
    /// The group's control socket (served by the spare).
    listener: UnixListener,
    /// Wakes the main thread: a VM was hosted or has ended.
    wake: OwnedFd,
    /// VMs hosted, for the main thread to take over.
    news: Mutex<Vec<Hosted>>,
    /// VMs running.
    running: AtomicUsize,
    /// A spare exists (preparing or serving the group's socket).
    spare: AtomicBool,
    /// Connections to the group's socket, between spares.
    sessions: Mutex<Vec<UnixStream>>,
    last: Mutex<Option<Last>>,
}

impl Group {
    fn wake(&self) {
        let _ = rustix::io::write(&self.wake, &1u64.to_ne_bytes());
    }

    /// A new shell of the group's size, not entered yet.
    fn shell(&self) -> wisp_vmm::Result<Shell> {
        Shell::create_with(&self.kvm, self.mem, self.sync_regs, true)
    }
}

impl crate::hosting::Hosting for Group {
    fn fresh_shell(&self) -> wisp_vmm::Result<Shell> {
        self.shell().and_then(|mut s| s.warm_up().map(|()| s))
    }

    fn run_done(&self) {
        self.running.fetch_sub(1, Ordering::AcqRel);
        self.wake();
    }
}

fn run(dir: &Path, mem: u64, uid: u32, n: u32, recycle: bool) -> Result<(), String> {
    wisp_jail::close_inherited();
    crate::monotonic_ns();
    let _ = rustix::thread::set_name(c"wisp-vmm");
    let kvm = wisp_vmm::open_kvm().map_err(|e| e.to_string())?;
    // Asked now: the jail refuses the question.
    let sync_regs = wisp_vmm::sync_regs_supported(&kvm);
    let sock_path = dir.join("ctl.sock");
    let _ = std::fs::remove_file(&sock_path);
    let listener = UnixListener::bind(&sock_path).map_err(|e| format!("bind {}: {e}", sock_path.display()))?;
    let wake = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK).map_err(|e| format!("eventfd: {e}"))?;
    wisp_vmm::prepare_process();
    wisp_jail::enter_with(uid, wisp_jail::Sizes::group(mem, n), wisp_vmm::kick_signal(), dir)?;
    wisp_vmm::set_thread_hook(crate::narrow::narrow_thread);
    let g = Arc::new(Group {
        kvm,
        mem,
        sync_regs,
        n: n.max(1) as usize,
        recycle,
        recyclers: crate::recycle::Pool::new(n.max(1) as usize),
        endpoints: Mutex::new(Vec::new()),
        listener,
        wake,
        news: Mutex::new(Vec::new()),
        running: AtomicUsize::new(0),
        spare: AtomicBool::new(false),
        sessions: Mutex::new(Vec::new()),
        last: Mutex::new(None),
    });
    make_spare(&g)?;
    println!("ready");
    let _ = io::stdout().flush();

    let mut vms: Vec<Hosted> = Vec::new();
    loop {
        // Poll: the wake-up, then each VM's listener and sessions.
        // Without a spare in a group with room (its making failed), try
        // again every 100 ms.
        let want_spare = || !g.spare.load(Ordering::Acquire) && g.running.load(Ordering::Acquire) < g.n;
        let timeout = want_spare().then_some(rustix::event::Timespec { tv_sec: 0, tv_nsec: 100_000_000 });
        let (wake, ready) = {
            let mut fds = Vec::with_capacity(1 + 2 * vms.len());
            fds.push(PollFd::new(&g.wake, PollFlags::IN));
            for v in &vms {
                fds.push(PollFd::new(&v.listener, PollFlags::IN));
                fds.extend(v.sessions.iter().map(|c| PollFd::new(c, PollFlags::IN)));
            }
            if poll(&mut fds, timeout.as_ref()).is_err() {
                continue;
            }
            let hit = |i: usize| !fds[i].revents().is_empty();
            let mut at = 1;
            let mut ready = Vec::new();
            for (k, v) in vms.iter().enumerate() {
                let acc = hit(at);
                let conns: Vec<usize> = (0..v.sessions.len()).filter(|&i| hit(at + 1 + i)).collect();
                at += 1 + v.sessions.len();
                if acc || !conns.is_empty() {
                    ready.push((k, acc, conns));
                }
            }
            (hit(0), ready)
        };
        for (k, acc, conns) in ready {
            let v = &mut vms[k];
            for i in conns.into_iter().rev() {
                let conn = v.sessions.swap_remove(i);
                v.sessions.extend(serve_hosted(&v.shared, conn));
            }
            // A new connection is a session: read once it has a request
            // (the daemon connects ahead of its first one).
            if acc {
                if let Ok((conn, _)) = accept_timed(&v.listener) {
                    v.sessions.push(conn);
                }
            }
        }
        if wake {
            let _ = rustix::io::read(&g.wake, &mut [0u8; 8]);
            vms.append(&mut g.news.lock().unwrap());
            for ep in std::mem::take(&mut *g.endpoints.lock().unwrap()) {
                crate::endpoint::start(g.clone(), ep);
            }
            // A VM that has ended and has nobody reading from it any more
            // goes, with its sockets.
            vms.retain(|v| {
                let st = v.shared.state.lock().unwrap();
                !(st.phase == WorkerState::Exited && st.conns == 0)
            });
        }
        // The spare took a VM (or one ended in a full group): the next.
        if want_spare() {
            if let Err(e) = make_spare(&g) {
                wisp_vmm::stderr_line(&format!("wisp-vmm group: {e}"));
            }
        }
    }
}

/// Make the next VM's thread (from the main thread, whose filter it
/// starts with): it creates its shell, loads the image the group ran last
/// into it, and serves the group's socket until a `host` gives it its VM.
fn make_spare(g: &Arc<Group>) -> Result<(), String> {
    let ahead = g.last.lock().unwrap().as_ref().map(|l| l.image.clone());
    g.spare.store(true, Ordering::Release);
    let g2 = g.clone();
    let made = std::thread::Builder::new().name("spare".into()).stack_size(VCPU_STACK).spawn(move || {
        // Making a KVM VM is within a forking vCPU thread's role; running
        // one that cannot fork, within a vCPU thread's.
        crate::narrow::narrow(Role::VcpuFork);
        // The shell keeps a handle on /dev/kvm: a VM of another image than
        // the one loaded ahead needs a new KVM VM (its VM cannot fork: its
        // family allows none, and its thread's filter no KVM VM once it runs).
        // Preloading enters the shell too (its prefault run); a shell whose
        // preload failed half-way is of no use: a fresh one.
        // (A recycler boots with its run's libraries: nothing loaded ahead.)
        let shell = match ahead.filter(|_| !g2.recycle) {
            Some(image) => g2.shell().and_then(|mut s| s.preload(image).map(|()| s)).or_else(|_| g2.fresh_shell()),
            None => g2.fresh_shell(),
        };
        let job = serve_group(&g2);
        // Hosting now: the main thread makes the next spare.
        g2.spare.store(false, Ordering::Release);
        let _ = rustix::thread::set_name(c"vcpu");
        if g2.recycle {
            g2.wake();
            crate::recycle::run(&*g2, &g2.recyclers, shell, job);
            return;
        }
        // Once this VM has started: making a KVM VM and its memory takes
        // the process's memory map for writing, which this VM's loading
        // and first page faults would wait for (~0.7 ms seen).
        run_vm(shell, job, || g2.wake());
        g2.run_done();
    });
    made.map(drop).map_err(|e| {
        g.spare.store(false, Ordering::Release);
        format!("VM thread: {e}")
    })
}


/// The spare serves the group's control socket (its connections with one
/// poll: the daemon connects ahead of its requests) until a `host` it can
/// take: that VM is handed to the main thread and becomes this thread's
/// job; the other connections wait for the next spare.
fn serve_group(g: &Group) -> Job {
    let mut sessions = std::mem::take(&mut *g.sessions.lock().unwrap());
    loop {
        let Some(conn) = next_pooled(&g.listener, &mut sessions) else { continue };
        let Some((req, fds)) = read_request(&conn) else { continue };
        let received_ns = crate::monotonic_ns();
        let reply = match req {
            Request::Host { vm: _, image_name, args, timeout_ms, attach, client_head, data, stdin, libs, net, links } => {
                if g.running.load(Ordering::Acquire) >= g.n {
                    Reply::err(format!("this group runs {} VMs already", g.n))
                } else if !libs.is_empty() && !g.recycle {
                    Reply::err("only a recycling group's VMs map libraries")
                } else if net.is_some() && g.recycle {
                    Reply::err("a recycling group's VMs have no NIC")
                } else {
                    match crate::proto::nics(net, links).map_err(String::from).and_then(|nics| host(fds, image_name, client_head, data, libs, nics, &g.last)) {
                        Err(e) => Reply::err(e),
                        Ok((shared, listener, image, net, client, data, libraries, files)) => {
                            g.running.fetch_add(1, Ordering::AcqRel);
                            g.news.lock().unwrap().push(Hosted { shared: shared.clone(), listener, sessions: Vec::new() });
                            let timeout = timeout_ms.map(Duration::from_millis);
                            let job = Job { shared, image, args, timeout, conn, attach, client, received_ns, data, net, stdin, libraries, files };
                            // A recycler waiting at its ready point with
                            // these files takes it; this thread serves on.
                            let job = if g.recycle {
                                match g.recyclers.hand_over(job) {
                                    Ok(()) => {
                                        g.wake();
                                        continue;
                                    }
                                    Err(job) => job,
                                }
                            } else {
                                job
                            };
                            g.sessions.lock().unwrap().append(&mut sessions);
                            return job;
                        }
                    }
                }
            }
            Request::Serve { image_name, libs } if g.recycle => match crate::endpoint::Endpoint::new(conn.try_clone(), fds, &image_name, libs) {
                Ok(ep) => {
                    // The endpoint's thread answers once its recycler is
                    // ready; the connection is the endpoint's from now on.
                    g.endpoints.lock().unwrap().push(ep);
                    g.wake();
                    continue;
                }
                Err(e) => Reply::err(e),
            },
            Request::Status => Reply::ok(WorkerState::Pooled),
            Request::Shutdown => {
                let _ = send_line(&conn, &Reply::ok(WorkerState::Exited), None);
                std::process::exit(0)
            }
            _ => Reply::err("a group's control socket takes host, serve (a recycling group's), status and shutdown"),
        };
        if send_line(&conn, &reply, None).is_ok() {
            sessions.push(conn);
        }
    }
}

/// A VM's pieces from a `host` request's descriptors: exit.json,
/// console.log, stderr.log, the control socket's listener, the image, its
/// NICs `net` describes (a tap each), the client if `client_head` says one comes, the data region, the libraries, and
/// the files of the image and libraries.
type Pieces = (
    Arc<Shared>,
    UnixListener,
    Image,
    Vec<wisp_vmm::NetConfig>,
    Option<(UnixStream, Vec<u8>)>,
    Option<wisp_vmm::DataDevice>,
    Vec<wisp_vmm::devices::library::LibraryDevice>,
    Vec<(u64, u64)>,
);

fn host(fds: Vec<OwnedFd>, image_name: String, client_head: Option<String>, data: bool, libs: Vec<String>, net: Vec<crate::proto::NetSpec>, last: &Mutex<Option<Last>>) -> Result<Pieces, String> {
    let want = 5 + net.len() + usize::from(client_head.is_some()) + usize::from(data) + libs.len();
    if fds.len() != want {
        return Err(format!("host needs {want} descriptors, {} came", fds.len()));
    }
    let mut fds = fds.into_iter();
    let mut next = || fds.next().expect("counted above");
    let files = JailFiles::from_files(next().into(), next().into(), next().into());
    let listener = UnixListener::from(next());
    // Parsed here (the daemon is not trusted blindly), unless it is the
    // very file the last VM's image was parsed from.
    let fd = next();
    let st = rustix::fs::fstat(&fd).map_err(|e| format!("image: {e}"))?;
    let file = (st.st_dev as u64, st.st_ino as u64);
    let mut last = last.lock().unwrap();
    let image = match last.as_ref().filter(|l| l.file == file && l.image.name == image_name) {
        Some(l) => l.image.clone(),
        None => {
            let image = Image::from_fd(&image_name, fd).map_err(|e| e.to_string())?;
            *last = Some(Last { file, image: image.clone() });
            image
        }
    };
    drop(last);
    let net = net.into_iter().map(|n| n.into_config(next())).collect();
    let client = client_head.map(|h| (UnixStream::from(next()), h.into_bytes()));
    let data = if data { Some(boot::data_from_fd(next())?) } else { None };
    // Checked here too (the daemon is not trusted blindly).
    let mut keys = vec![file];
    let mut libraries = Vec::with_capacity(libs.len());
    for name in libs {
        let fd = next();
        let st = rustix::fs::fstat(&fd).map_err(|e| format!("library {name}: {e}"))?;
        keys.push((st.st_dev as u64, st.st_ino as u64));
        libraries.push(wisp_vmm::devices::library::LibraryDevice::from_fd(&name, fd).map_err(|e| format!("library {name}: {e}"))?);
    }
    let shared = Shared::new(files, WorkerState::Pooled, None);
    Ok((shared, listener, image, net, client, data, libraries, keys))
}

/// A VM's thread, once its job came: load, answer, call `started` (also
/// if it failed to start), run, record the end.
fn run_vm(shell: wisp_vmm::Result<Shell>, job: Job, started: impl FnOnce()) {
    let Job { shared, image, args, timeout, conn, attach, client, received_ns, data, net, stdin, .. } = job;
    let t = Instant::now();
    let family = boot::daemon_family(false, Some(1));
    let loaded = shell.and_then(|s| boot::load(s, Boot { image: &image, args: &args, net, data, disks: Vec::new(), libraries: Vec::new(), family }));
    drop(image);
    let mut vm = match loaded {
        Ok(vm) => vm,
        Err(e) => {
            let _ = send_line(&conn, &Reply::err(e.to_string()), None);
            started();
            shared.end(ExitInfo { code: ERROR.into(), reason: e.to_string() });
            return;
        }
    };
    if stdin {
        *shared.stdin.lock().unwrap() = Some(vm.attach_stdin());
    }
    // A vCPU thread's role from here (a deny list on the forking one's).
    crate::narrow::narrow_from(Role::VcpuFork, Role::Vcpu);
    let boot_us = t.elapsed().as_micros() as u64;
    let mut sink = begin(&shared, &mut vm, conn, Started { boot_us, received_ns, held: false }, attach, client, None);
    started();
    // Killed before it ran (its control did not exist yet).
    if shared.state.lock().unwrap().kill_asked {
        vm.control().kill();
    }
    let deadline = timeout.map(|t| Instant::now() + t);
    let exit = match vm.run_until_fork(&mut sink, deadline) {
        Some(outcome) => exit_info(&outcome, Runner::Daemon),
        // Its family allows no fork: this does not happen.
        None => ExitInfo { code: ERROR.into(), reason: "a VM of a group forked".into() },
    };
    sink.finish(&exit);
    // The end is told first: destroying the KVM VM (~0.5 ms here) keeps no
    // waiter (nor a batch removal) waiting.
    shared.end(exit);
    drop(vm);
}
