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
//! The main thread serves the group's control socket (the daemon asks it
//! to `host` a VM) and every hosted VM's own control socket with one poll;
//! a `wait` is parked until its VM ends, so an idle VM costs one thread.
//! The next VM's thread is made ahead: it creates and enters its shell,
//! narrows its filter, and waits for its VM, so a `host` creates no thread,
//! KVM VM or filter on its path.

use std::io::{self, Write};
use std::os::fd::OwnedFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use rustix::event::{eventfd, poll, EventfdFlags, PollFd, PollFlags};
use wisp_api::ExitInfo;
use wisp_jail::seccomp::Role;
use wisp_jail::JailFiles;
use wisp_vmm::{Image, Kvm, Shell};

use crate::boot::{self, Boot};
use crate::control::{accept_timed, read_request, serve_hosted};
use crate::exit::{exit_info, Runner, ERROR};
use crate::process::{begin, Started};
use crate::proto::{send_line, Reply, Request, WorkerState};
use crate::state::Shared;

/// Stack of a VM's thread (the monitor's run loop needs little; only the
/// pages touched cost memory).
const VCPU_STACK: usize = 256 << 10;

/// Entry point of a group VMM process `id` in directory `dir`: up to `n`
/// VMs of `mem` bytes, jailed as user and group `uid`. Never returns.
pub fn main(id: &str, dir: &Path, mem: u64, uid: u32, n: u32) -> ! {
    match run(dir, mem, uid, n) {
        Ok(()) => std::process::exit(0),
        Err(e) => {
            eprintln!("wisp-vmm group {id}: {e}");
            println!("error: {e}");
            std::process::exit(1)
        }
    }
}

/// A VM the group runs.
struct Hosted {
    shared: Arc<Shared>,
    listener: UnixListener,
    sessions: Vec<UnixStream>,
}

/// What a VM's thread is given to run.
struct Job {
    shared: Arc<Shared>,
    image: Image,
    args: Vec<String>,
    timeout: Option<Duration>,
    conn: UnixStream,
    attach: bool,
    client: Option<(UnixStream, Vec<u8>)>,
    received_ns: u64,
}

/// What every VM thread needs of the group.
#[derive(Clone)]
struct Ctx {
    kvm: Arc<Kvm>,
    mem: u64,
    sync_regs: bool,
    /// Written when a VM has ended: the main thread lets it go.
    ended: Arc<OwnedFd>,
}

fn run(dir: &Path, mem: u64, uid: u32, n: u32) -> Result<(), String> {
    wisp_jail::close_inherited();
    crate::monotonic_ns();
    let _ = rustix::thread::set_name(c"wisp-vmm");
    let kvm = wisp_vmm::open_kvm().map_err(|e| e.to_string())?;
    // Asked now: the jail refuses the question.
    let sync_regs = wisp_vmm::sync_regs_supported(&kvm);
    let sock_path = dir.join("ctl.sock");
    let _ = std::fs::remove_file(&sock_path);
    let listener = UnixListener::bind(&sock_path).map_err(|e| format!("bind {}: {e}", sock_path.display()))?;
    let ended = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK).map_err(|e| format!("eventfd: {e}"))?;
    wisp_vmm::Control::prepare_process();
    wisp_jail::enter_with(uid, wisp_jail::Sizes::group(mem, n), wisp_vmm::kick_signal(), dir)?;
    wisp_vmm::set_thread_hook(crate::narrow::narrow_thread);
    let ctx = Ctx { kvm: Arc::new(kvm), mem, sync_regs, ended: Arc::new(ended) };
    let mut spare = Some(make_spare(&ctx)?);
    println!("ready");
    let _ = io::stdout().flush();

    let mut vms: Vec<Hosted> = Vec::new();
    let mut sessions: Vec<UnixStream> = Vec::new();
    loop {
        // Poll: the group's socket, the end signal, the group's sessions,
        // then each VM's listener and sessions.
        let (accept, wake, ready_group, ready_vms) = {
            let mut fds = Vec::with_capacity(2 + sessions.len() + 2 * vms.len());
            fds.push(PollFd::new(&listener, PollFlags::IN));
            fds.push(PollFd::new(&*ctx.ended, PollFlags::IN));
            fds.extend(sessions.iter().map(|c| PollFd::new(c, PollFlags::IN)));
            for v in &vms {
                fds.push(PollFd::new(&v.listener, PollFlags::IN));
                fds.extend(v.sessions.iter().map(|c| PollFd::new(c, PollFlags::IN)));
            }
            if poll(&mut fds, None).is_err() {
                continue;
            }
            let hit = |i: usize| !fds[i].revents().is_empty();
            let group: Vec<usize> = (0..sessions.len()).filter(|&i| hit(2 + i)).collect();
            let mut at = 2 + sessions.len();
            let mut per_vm = Vec::new();
            for (k, v) in vms.iter().enumerate() {
                let acc = hit(at);
                let ready: Vec<usize> = (0..v.sessions.len()).filter(|&i| hit(at + 1 + i)).collect();
                at += 1 + v.sessions.len();
                if acc || !ready.is_empty() {
                    per_vm.push((k, acc, ready));
                }
            }
            (hit(0), hit(1), group, per_vm)
        };
        for (k, acc, ready) in ready_vms {
            let v = &mut vms[k];
            for i in ready.into_iter().rev() {
                let conn = v.sessions.swap_remove(i);
                v.sessions.extend(serve_hosted(&v.shared, conn));
            }
            if acc {
                if let Ok((conn, _)) = accept_timed(&v.listener) {
                    v.sessions.extend(serve_hosted(&v.shared, conn));
                }
            }
        }
        for i in ready_group.into_iter().rev() {
            let conn = sessions.swap_remove(i);
            sessions.extend(serve_group(&ctx, conn, &mut vms, &mut spare, n));
        }
        if accept {
            if let Ok((conn, _)) = accept_timed(&listener) {
                sessions.extend(serve_group(&ctx, conn, &mut vms, &mut spare, n));
            }
        }
        if wake {
            let _ = rustix::io::read(&*ctx.ended, &mut [0u8; 8]);
            // A VM that has ended and has nobody reading from it any more
            // goes, with its sockets.
            vms.retain(|v| {
                let st = v.shared.state.lock().unwrap();
                !(st.phase == WorkerState::Exited && st.conns == 0)
            });
        }
    }
}

/// Serve one request on the group's control socket. Returns the
/// connection if it can carry more (a `host`'s is the VM's from then on).
fn serve_group(ctx: &Ctx, conn: UnixStream, vms: &mut Vec<Hosted>, spare: &mut Option<mpsc::SyncSender<Job>>, n: u32) -> Option<UnixStream> {
    let (req, fds) = read_request(&conn)?;
    let received_ns = crate::monotonic_ns();
    let reply = match req {
        Request::Host { vm: _, image_name, args, timeout_ms, attach, client_head } => {
            if vms.len() >= n as usize {
                Reply::err(format!("this group holds {n} VMs already"))
            } else {
                match host(fds, image_name, client_head) {
                    Err(e) => Reply::err(e),
                    Ok((shared, listener, image, client)) => {
                        let timeout = timeout_ms.map(Duration::from_millis);
                        let job = Job { shared: shared.clone(), image, args, timeout, conn, attach, client, received_ns };
                        // The spare thread takes it; the next one is made
                        // while this VM boots (none once the group is full).
                        let sent = spare.take().map(|tx| tx.send(job));
                        if !matches!(sent, Some(Ok(()))) {
                            shared.end(ExitInfo { code: ERROR.into(), reason: "the group has no thread for it".into() });
                        }
                        vms.push(Hosted { shared, listener, sessions: Vec::new() });
                        if vms.len() < n as usize {
                            *spare = make_spare(ctx).inspect_err(|e| wisp_vmm::stderr_line(&format!("wisp-vmm group: {e}"))).ok();
                        }
                        return None;
                    }
                }
            }
        }
        Request::Status => Reply::ok(if vms.is_empty() { WorkerState::Pooled } else { WorkerState::Running }),
        Request::Shutdown => {
            let _ = send_line(&conn, &Reply::ok(WorkerState::Exited), None);
            std::process::exit(0)
        }
        _ => Reply::err("a group's control socket takes host, status and shutdown"),
    };
    let _ = send_line(&conn, &reply, None);
    Some(conn)
}

/// A VM's pieces from a `host` request's descriptors: exit.json,
/// console.log, the control socket's listener, the image, and the client
/// if `client_head` says one comes.
type Pieces = (Arc<Shared>, UnixListener, Image, Option<(UnixStream, Vec<u8>)>);

fn host(fds: Vec<OwnedFd>, image_name: String, client_head: Option<String>) -> Result<Pieces, String> {
    let want = 4 + usize::from(client_head.is_some());
    if fds.len() != want {
        return Err(format!("host needs {want} descriptors, {} came", fds.len()));
    }
    let mut fds = fds.into_iter();
    let mut next = || fds.next().expect("counted above");
    let files = JailFiles::from_files(next().into(), next().into());
    let listener = UnixListener::from(next());
    // Parsed here (the daemon is not trusted blindly).
    let image = Image::from_fd(&image_name, next()).map_err(|e| e.to_string())?;
    let client = client_head.map(|h| (UnixStream::from(next()), h.into_bytes()));
    let shared = Shared::new(files, WorkerState::Pooled, None);
    Ok((shared, listener, image, client))
}

/// Make the next VM's thread: it creates its shell and enters it once,
/// narrows itself to a vCPU thread's role, and waits for its job.
fn make_spare(ctx: &Ctx) -> Result<mpsc::SyncSender<Job>, String> {
    let (tx, rx) = mpsc::sync_channel::<Job>(1);
    let ctx = ctx.clone();
    std::thread::Builder::new()
        .name("spare".into())
        .stack_size(VCPU_STACK)
        .spawn(move || {
            // Making a KVM VM is within a forking vCPU thread's role; running
            // one that cannot fork, within a vCPU thread's.
            crate::narrow::narrow(Role::VcpuFork);
            let shell = Shell::create_with(&ctx.kvm, ctx.mem, ctx.sync_regs, false).and_then(|mut s| s.warm_up().map(|()| s));
            crate::narrow::narrow_from(Role::VcpuFork, Role::Vcpu);
            let Ok(job) = rx.recv() else { return };
            let _ = rustix::thread::set_name(c"vcpu");
            run_vm(shell, job);
            let _ = rustix::io::write(&*ctx.ended, &1u64.to_ne_bytes());
        })
        .map(|_| tx)
        .map_err(|e| format!("VM thread: {e}"))
}

/// A VM's thread, once its job came: load, answer, run, record the end.
fn run_vm(shell: wisp_vmm::Result<Shell>, job: Job) {
    let Job { shared, image, args, timeout, conn, attach, client, received_ns } = job;
    let t = Instant::now();
    let family = boot::daemon_family(false, Some(1));
    let loaded = shell.and_then(|s| boot::load(s, Boot { image: &image, args: &args, net: None, family }));
    drop(image);
    let mut vm = match loaded {
        Ok(vm) => vm,
        Err(e) => {
            let _ = send_line(&conn, &Reply::err(e.to_string()), None);
            shared.end(ExitInfo { code: ERROR.into(), reason: e.to_string() });
            return;
        }
    };
    let boot_us = t.elapsed().as_micros() as u64;
    let mut sink = begin(&shared, &vm, conn, Started { boot_us, received_ns, held: false }, attach, client);
    let deadline = timeout.map(|t| Instant::now() + t);
    let exit = match vm.run_until_fork(&mut sink, deadline) {
        Some(outcome) => exit_info(&outcome, Runner::Daemon),
        // Its family allows no fork: this does not happen.
        None => ExitInfo { code: ERROR.into(), reason: "a VM of a group forked".into() },
    };
    drop(sink);
    drop(vm);
    shared.end(exit);
}
