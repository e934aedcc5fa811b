//! The life of a daemon's VMM process (`wispd __worker`).
//!
//! *Prepare*: open KVM, create the shell and enter it once, bind the
//! control socket, close the jail, say "ready" — this is what the daemon's
//! pool keeps waiting. *Execute*: a `start` request brings the image (as a
//! sealed memfd from the daemon's image cache); this thread loads it and
//! becomes the vCPU thread, while the "ctl" thread takes the control socket
//! over. When the guest ends the process writes `exit.json` and
//! `console.log` into its directory and exits once nobody is reading from
//! it any more. It survives a daemon restart: the new daemon finds it
//! through its directory.

use std::io::{self, Write};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use wisp_api::ExitInfo;
use wisp_jail::seccomp::Role;
use wisp_jail::JailFiles;

use crate::boot::{self, Boot};
use crate::console::Framing;
use crate::sink::{Deferred, Sink, FIRST_EXIT_WITHIN};
use crate::control::{next_pooled, serve_pooled, spawn_server, Pooled};
use crate::exit::{exit_info, Runner, ERROR};
use crate::fork::become_child_vm;
use crate::proto::{send_line, Reply, Request, WorkerState};
use crate::state::Shared;

/// Entry point of the daemon's VMM process for VM `id`: its directory
/// `dir`, `mem` bytes of guest RAM, jailed as user and group `uid`. Never
/// returns. Errors before "ready" are printed as `error: …` on stdout (the
/// daemon reads them) and on stderr (`vmm.log`).
pub fn main(id: &str, dir: &Path, mem: u64, uid: u32) -> ! {
    match run(dir, mem, uid) {
        Ok(()) => std::process::exit(0),
        Err(e) => {
            eprintln!("wisp-vmm {id}: {e}");
            println!("error: {e}");
            std::process::exit(1)
        }
    }
}

fn run(dir: &Path, mem: u64, uid: u32) -> Result<(), String> {
    wisp_jail::close_inherited();
    // The clock's first reading finds the vDSO (rustix reads the auxiliary
    // vector with a prctl the jail does not allow): before the jail.
    crate::monotonic_ns();
    // Show up as `wisp-vmm` in ps/top, apart from the daemon.
    let _ = rustix::thread::set_name(c"wisp-vmm");
    let mut shell = boot::prepare(mem).map_err(|e| e.to_string())?;
    shell.warm_up().map_err(|e| e.to_string())?;
    let sock_path = dir.join("ctl.sock");
    let _ = std::fs::remove_file(&sock_path);
    let listener = UnixListener::bind(&sock_path).map_err(|e| format!("bind {}: {e}", sock_path.display()))?;
    let files = JailFiles::open(dir).map_err(|e| format!("open files in {}: {e}", dir.display()))?;
    wisp_vmm::prepare_process();
    wisp_jail::enter(uid, mem, wisp_vmm::kick_signal(), dir)?;
    wisp_vmm::set_thread_hook(crate::narrow::narrow_thread);
    let shared = Shared::new(files, WorkerState::Pooled, None);
    // The server thread takes the control socket once the VM runs; until
    // then this thread answers requests itself, and a `start` makes it the
    // vCPU thread with no thread creation or hand-off on the boot path.
    let (ltx, lrx) = mpsc::channel::<UnixListener>();
    spawn_server(&shared, move || lrx.recv().ok())?;
    // This thread becomes the vCPU thread of a VM that may fork (the
    // daemon's VMs can): narrow it now, while no one waits, so a start
    // pays no filter installation (~0.2 ms on PVM hosts). What the pooled
    // phase and the execute phase do is within that role.
    crate::narrow::narrow(Role::VcpuFork);
    println!("ready");
    let _ = io::stdout().flush();
    // Set once the shell holds an image that cannot fork, loaded ahead: the
    // vCPU thread is narrowed to a vCPU thread's role then (installing a
    // filter costs ~0.1 ms on PVM hosts), and the shell runs that image only.
    let mut sealed = false;
    let mut sessions = Vec::new();
    loop {
        let Some(conn) = next_pooled(&listener, &mut sessions) else { continue };
        // A poke: the start that follows finds this thread awake.
        if crate::proto::take_pokes(&conn) {
            crate::control::stay_awake(&conn, SOON_SPIN);
            sessions.push(conn);
            continue;
        }
        let (mut cmd, conn) = match serve_pooled(&shared, conn) {
            None => continue,
            Some((Pooled::Preload(image), conn)) => {
                if sealed {
                    let _ = send_line(&conn, &Reply::err("this shell holds an image loaded ahead for good"), None);
                    continue;
                }
                let forks = image.forks();
                // A shell that fails half-way is no use: the process ends
                // (the daemon discards it).
                if let Err(e) = shell.preload(image) {
                    let _ = send_line(&conn, &Reply::err(e.to_string()), None);
                    return Err(format!("preload: {e}"));
                }
                if !forks {
                    crate::narrow::narrow_from(Role::VcpuFork, Role::Vcpu);
                    sealed = true;
                }
                let _ = send_line(&conn, &Reply::ok(WorkerState::Pooled), None);
                sessions.push(conn);
                continue;
            }
            Some((Pooled::Start(cmd), conn)) => (cmd, conn),
        };
        let t = Instant::now();
        let family = boot::daemon_family(cmd.uplink.is_some(), cmd.family_limit);
        let held = cmd.image.is_none() && cmd.snapshot.is_none();
        let restored = cmd.snapshot.take();
        let image = match cmd.image.take() {
            // A restore: no image (the snapshot's pages are its memory; a
            // sealed shell serves too: it clears RAM, no new KVM VM).
            _ if restored.is_some() => None,
            // A sealed shell cannot make the new KVM VM another image needs.
            Some(_) if sealed => {
                let e = "this shell runs only the image it holds loaded ahead";
                let _ = send_line(&conn, &Reply::err(e), None);
                finish(&shared, ExitInfo { code: ERROR.into(), reason: e.into() });
            }
            Some(image) => Some(image),
            // The daemon said the shell holds it: it must, under that name.
            None => match shell.preloaded().filter(|i| i.name == cmd.image_name) {
                Some(image) => Some(image.clone()),
                None => {
                    let e = format!("no preloaded image '{}' in this shell", cmd.image_name);
                    let _ = send_line(&conn, &Reply::err(&e), None);
                    finish(&shared, ExitInfo { code: ERROR.into(), reason: e });
                }
            },
        };
        let loaded = match (&image, restored) {
            (Some(image), _) => {
                let boot = Boot { image, args: &cmd.args, net: std::mem::take(&mut cmd.net), data: cmd.data.take(), disks: std::mem::take(&mut cmd.disks), libraries: std::mem::take(&mut cmd.libraries), family };
                boot::load(shell, boot)
            }
            (None, Some(fd)) => {
                let mut chain = std::mem::take(&mut cmd.bases);
                chain.push(fd);
                // The snapshot's NIC on the tap the daemon made (its saved
                // identity is checked against it and taken over), its disks
                // on the volumes given.
                let (net, disks) = (std::mem::take(&mut cmd.net), std::mem::take(&mut cmd.disks));
                // A held restore says so once its pages are mapped, and
                // waits on the start's connection for the last increment.
                let more = cmd.hold.then(|| Box::new(|| wait_held(&conn)) as Box<dyn FnOnce() -> Result<OwnedFd, String>>);
                boot::restore_held(shell, &chain, net, disks, family, more)
            }
            (None, None) => unreachable!("an image or a snapshot"),
        };
        let mut vm = match loaded {
            Ok(vm) => vm,
            Err(e) => {
                let _ = send_line(&conn, &Reply::err(e.to_string()), None);
                finish(&shared, ExitInfo { code: ERROR.into(), reason: e.to_string() });
            }
        };
        if cmd.stdin {
            *shared.stdin.lock().unwrap() = Some(vm.attach_stdin());
        }
        if let Some(fd) = cmd.template.take() {
            vm.save_when_ready(Box::new(std::fs::File::from(fd)));
        }
        let boot_us = t.elapsed().as_micros() as u64;
        // From here this is the vCPU thread: narrowed to a forking VM's
        // role before "ready"; a VM that cannot fork loses those calls too.
        if !vm.may_fork() && !sealed {
            crate::narrow::narrow_from(Role::VcpuFork, Role::Vcpu);
        }
        // The uplink goes in its slot if the VM may fork (and forked
        // children keep it); a VM that cannot fork just holds it.
        if let Some(u) = cmd.uplink.take_if(|_| vm.may_fork()) {
            if let Some(fd) = crate::uplink::set_uplink(u) {
                vm.keep_in_children(fd);
            }
        }
        // The image's pages are mapped: its descriptor is needed no more.
        drop(image);
        // The control socket goes to its thread once the guest has run.
        let handover = ltx.clone();
        let then: Box<dyn FnOnce() + Send> = Box::new(move || drop(handover.send(listener)));
        let started = Started { boot_us, received_ns: cmd.received_ns, held };
        let sink = begin(&shared, &mut vm, conn, started, cmd.attach, cmd.client.take(), Some(then));
        let deadline = cmd.timeout.map(|t| Instant::now() + t);
        let mut shared = shared;
        let mut sink = sink;
        let outcome = loop {
            if let Some(o) = vm.run_until_fork(&mut sink, deadline) {
                break o;
            }
            // The forked child's process. Everything above belongs to the
            // parent VM (and to threads that do not exist here): leave it
            // untouched and become a VM of our own.
            sink.forget_in_child();
            shared = match become_child_vm(&vm) {
                Ok(s) => s,
                Err(e) => {
                    wisp_vmm::stderr_line(&format!("wisp-vmm: forked VM: {e}"));
                    std::process::exit(ERROR.into());
                }
            };
            sink = Sink::new(shared.clone(), None, None, None);
        };
        let exit = exit_info(&outcome, Runner::Daemon);
        sink.finish(&exit);
        let st = vm.stats();
        if st.forks_prepared > 0 {
            // For the operator (and tests): how forks were served.
            wisp_vmm::stderr_line(&format!(
                "wisp-vmm: forks_prepared {} forks_recycled {}",
                st.forks_prepared, st.forks_recycled
            ));
        }
        drop(vm);
        finish(&shared, exit);
    }
}

/// A held restore's wait: say it is held (`paused`) on the start's
/// connection `conn`, then take the [`Request::Continue`] that brings the
/// last increment (its descriptor). Anything else, or nothing within
/// [`HELD_AT_MOST`], fails the start.
fn wait_held(conn: &std::os::unix::net::UnixStream) -> Result<OwnedFd, String> {
    send_line(conn, &Reply::ok(WorkerState::Paused), None).map_err(|e| e.to_string())?;
    let _ = conn.set_read_timeout(Some(HELD_AT_MOST));
    let next = crate::control::read_request(conn);
    let _ = conn.set_read_timeout(None);
    match next {
        Some((Request::Continue, fds)) => fds.into_iter().next().ok_or_else(|| "continue needs the increment's descriptor".into()),
        Some(_) => Err("a held restore takes only `continue`".into()),
        None => Err("the held restore was not continued".into()),
    }
}

/// Longest a held restore waits for its last increment.
const HELD_AT_MOST: Duration = Duration::from_secs(30);

/// Longest a poked shell stays awake for the start (a create that did not
/// come to this shell costs this much CPU time at most).
const SOON_SPIN: Duration = Duration::from_micros(500);

/// The VM has ended: write `console.log` and `exit.json`, tell waiters,
/// let followers and waiters read the end (5 s at most), and exit.
fn finish(shared: &Arc<Shared>, exit: ExitInfo) -> ! {
    shared.end(exit);
    let mut st = shared.state.lock().unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while st.conns > 0 && Instant::now() < deadline {
        st = shared.cv.wait_timeout(st, Duration::from_millis(50)).unwrap().0;
    }
    std::process::exit(0)
}

/// How a start went, for its reply.
pub(crate) struct Started {
    /// The execute phase, in µs.
    pub boot_us: u64,
    /// When the request was read (host monotonic clock, ns).
    pub received_ns: u64,
    /// The shell held the image loaded ahead.
    pub held: bool,
}

/// The VM is loaded and about to run: record it as running, and set up
/// where its console goes (the client's own connection if handed over,
/// with `conn` told of the first output; else `conn` itself with
/// `attach`) and what waits for the guest's first exit ([`Deferred`]): the
/// reply on `conn`, the client's response head, then `then` (the control
/// socket's hand-over). Returns the vCPU thread's console sink.
pub(crate) fn begin(
    shared: &Arc<Shared>,
    vm: &mut wisp_vmm::Vm,
    conn: std::os::unix::net::UnixStream,
    started: Started,
    attach: bool,
    client: Option<(std::os::unix::net::UnixStream, Vec<u8>)>,
    then: Option<Box<dyn FnOnce() + Send>>,
) -> Sink {
    let Started { boot_us, received_ns, held } = started;
    let attached = client.is_some() || attach;
    {
        let mut st = shared.state.lock().unwrap();
        st.phase = WorkerState::Running;
        st.boot_us = Some(boot_us);
        st.control = Some(vm.control());
        st.libraries = vm.library_window();
        if attached {
            st.conns += 1;
        }
    }
    let reply = Reply {
        boot_us: Some(boot_us),
        received_ns: Some(received_ns),
        entered_ns: Some(crate::monotonic_ns()),
        preloaded: held,
        ..Reply::ok(WorkerState::Running)
    };
    let mut line = serde_json::to_vec(&reply).unwrap_or_default();
    line.push(b'\n');
    // Without the timer the answers go out now (this thread never enters
    // a guest that makes no exit).
    if let Err(e) = vm.flush_at_first_exit(FIRST_EXIT_WITHIN) {
        wisp_vmm::stderr_line(&format!("wisp-vmm: {e}: the start is answered before the guest runs"));
    }
    // The console goes to the client's own connection (handed over by the
    // daemon), after the response's head (the daemon's own writer's); the
    // daemon hears on the start's connection when the first output went
    // out (with the reply, if that waited for it: the client's bytes go
    // first). Else to the start's connection if attached. A daemon that
    // hears nothing may answer the client itself: nothing was written to
    // it before the VM ran.
    let (attached, start, head) = match client {
        Some((client, head)) => (Some((client, Framing::Chunked)), Some(conn), head),
        None if attach => (Some((conn, Framing::Raw)), None, Vec::new()),
        // Nothing more goes to the daemon on the start's connection than
        // the reply: it is not kept for the VM's life.
        None => (None, Some(conn), Vec::new()),
    };
    let mut sink = Sink::new(shared.clone(), attached, start, Some(Deferred { reply: line, head, then }));
    if !vm.flushes_at_first_exit() {
        let _ = sink.flush();
    }
    sink
}
