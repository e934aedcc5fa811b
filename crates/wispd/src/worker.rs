//! The VMM process: one per VM, spawned by the daemon as `wispd __worker`.
//!
//! *Prepare*: open KVM, create the shell, bind the control socket, say
//! "ready" — this is what the daemon's pool keeps waiting. *Execute*: a
//! `start` request brings the image (as a sealed memfd from the daemon's
//! image cache); the vCPU thread loads it and runs. The process serves
//! status, pause/resume, stop/kill, logs and wait on its control socket,
//! writes `exit.json` and `console.log` into its directory when the guest
//! ends, and exits once nobody is reading from it any more. It survives a
//! daemon restart: the new daemon finds it through its directory.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use wisp_api::ExitInfo;
use wisp_vmm::{open_kvm, Control, Image, Outcome, Shell, StopReason};

use crate::jail::{self, JailFiles};
use crate::proto::{recv_line, send_line, Reply, Request, WorkerState};

/// Bytes of console output kept per VM.
pub const CONSOLE_RING: usize = 64 * 1024;

/// Exit status for an outcome, as `wisp run` reports it.
pub fn exit_info(outcome: &Outcome) -> ExitInfo {
    match outcome {
        Outcome::Exited(c) => ExitInfo { code: c & 0xff, reason: "exited".into() },
        Outcome::Stopped(StopReason::Timeout) => ExitInfo { code: 124, reason: StopReason::Timeout.to_string() },
        Outcome::Stopped(StopReason::Killed) => ExitInfo { code: 137, reason: "killed".into() },
        Outcome::Stopped(r) => ExitInfo { code: 139, reason: r.to_string() },
    }
}

struct Console {
    ring: VecDeque<u8>,
    /// Bytes ever written.
    total: u64,
}

struct State {
    phase: WorkerState,
    exit: Option<ExitInfo>,
    boot_us: Option<u64>,
    control: Option<Arc<Control>>,
    conns: usize,
}

struct Shared {
    files: Mutex<Option<JailFiles>>,
    state: Mutex<State>,
    cv: Condvar,
    console: Mutex<Console>,
    console_cv: Condvar,
}

/// The guest's console: into the ring buffer, and for an attached start
/// straight to the attached connection from the vCPU thread (no thread
/// wake-up between the guest's output and the socket). If the reader is slow
/// (the socket would block) a streaming thread takes the connection over from
/// the ring, so the guest never waits for a client.
impl Shared {
    fn new(files: JailFiles, phase: WorkerState, control: Option<Arc<Control>>) -> Arc<Shared> {
        Arc::new(Shared {
            files: Mutex::new(Some(files)),
            state: Mutex::new(State { phase, exit: None, boot_us: None, control, conns: 0 }),
            cv: Condvar::new(),
            console: Mutex::new(Console { ring: VecDeque::new(), total: 0 }),
            console_cv: Condvar::new(),
        })
    }

    /// A connection being served has finished.
    fn release_conn(&self) {
        let mut st = self.state.lock().unwrap();
        st.conns -= 1;
        self.cv.notify_all();
    }
}

struct Sink {
    shared: Arc<Shared>,
    direct: Option<UnixStream>,
}

impl Write for Sink {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let total = {
            let mut c = self.shared.console.lock().unwrap();
            c.total += data.len() as u64;
            let keep = data.len().min(CONSOLE_RING);
            let over = (c.ring.len() + keep).saturating_sub(CONSOLE_RING);
            c.ring.drain(..over);
            c.ring.extend(&data[data.len() - keep..]);
            self.shared.console_cv.notify_all();
            c.total
        };
        if let Some(conn) = &self.direct {
            let sent = rustix::net::send(conn, data, rustix::net::SendFlags::DONTWAIT | rustix::net::SendFlags::NOSIGNAL);
            match sent {
                Ok(n) if n == data.len() => {}
                Ok(n) => self.hand_over(total - (data.len() - n) as u64),
                Err(rustix::io::Errno::AGAIN) => self.hand_over(total - data.len() as u64),
                Err(_) => self.drop_direct(), // the reader went away
            }
        }
        Ok(data.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Sink {
    /// Give the attached connection to a streaming thread, from byte `pos`.
    fn hand_over(&mut self, pos: u64) {
        if let Some(conn) = self.direct.take() {
            spawn_conn(&self.shared, move |s| stream_logs_from(s, conn, true, Some(pos)));
        }
    }

    fn drop_direct(&mut self) {
        if self.direct.take().is_some() {
            self.shared.release_conn();
        }
    }
}

impl Drop for Sink {
    fn drop(&mut self) {
        self.drop_direct();
    }
}

/// Entry point of `wispd __worker`. Never returns.
pub fn main(id: &str, dir: &Path, mem: u64, uid: u32) -> ! {
    match run(id, dir, mem, uid) {
        Ok(()) => std::process::exit(0),
        Err(e) => {
            eprintln!("wisp-vmm {id}: {e}");
            println!("error: {e}");
            std::process::exit(1)
        }
    }
}

fn run(_id: &str, dir: &Path, mem: u64, uid: u32) -> Result<(), String> {
    // Show up as `wisp-vmm` in ps/top, apart from the daemon.
    let _ = rustix::thread::set_name(c"wisp-vmm");
    let kvm = open_kvm().map_err(|e| e.to_string())?;
    let mut shell = Shell::create(&kvm, mem).map_err(|e| e.to_string())?;
    shell.warm_up().map_err(|e| e.to_string())?;
    drop(kvm);
    let sock_path = dir.join("ctl.sock");
    let _ = std::fs::remove_file(&sock_path);
    let listener = UnixListener::bind(&sock_path).map_err(|e| format!("bind {}: {e}", sock_path.display()))?;
    let files = JailFiles::open(dir).map_err(|e| format!("open files in {}: {e}", dir.display()))?;
    wisp_vmm::Control::prepare_process();
    jail::enter(uid, mem)?;
    let shared = Shared::new(files, WorkerState::Pooled, None);
    // The server thread takes the control socket once the VM runs; until
    // then this thread answers requests itself, and a `start` makes it the
    // vCPU thread with no thread creation or hand-off on the boot path.
    let (ltx, lrx) = mpsc::channel::<UnixListener>();
    let s = shared.clone();
    std::thread::Builder::new()
        .name("ctl".into())
        .stack_size(256 << 10)
        .spawn(move || {
            if let Ok(listener) = lrx.recv() {
                serve_loop(&s, listener);
            }
        })
        .map_err(|e| e.to_string())?;
    println!("ready");
    let _ = io::stdout().flush();
    for conn in listener.incoming() {
        let Ok(conn) = conn else { continue };
        let Some((mut cmd, conn)) = serve_pooled(&shared, conn) else { continue };
        let t = Instant::now();
        let mut vm = match shell.load_with(&cmd.image, &cmd.args, cmd.net.take()) {
            Ok(vm) => vm,
            Err(e) => {
                let _ = send_line(&conn, &Reply::err(e.to_string()), None);
                finish(&shared, ExitInfo { code: 125, reason: e.to_string() });
            }
        };
        let boot_us = t.elapsed().as_micros() as u64;
        {
            let mut st = shared.state.lock().unwrap();
            st.phase = WorkerState::Running;
            st.boot_us = Some(boot_us);
            st.control = Some(vm.control());
            if cmd.attach {
                st.conns += 1;
            }
        }
        let _ = send_line(&conn, &Reply { boot_us: Some(boot_us), ..Reply::ok(WorkerState::Running) }, None);
        let _ = ltx.send(listener);
        vm.set_family_options(wisp_vmm::FamilyOptions {
            fork: cmd.uplink.is_some(),
            limit: wisp_abi::family::limits::MAX_MEMBERS as u32,
            orphans_die: false,
        });
        let deadline = cmd.timeout.map(|t| Instant::now() + t);
        let mut shared = shared;
        let mut sink = Sink { shared: shared.clone(), direct: cmd.attach.then_some(conn) };
        let outcome = loop {
            if let Some(o) = vm.run_until_fork(&mut sink, deadline) {
                break o;
            }
            // The forked child's process. Everything above belongs to the
            // parent VM (and to threads that do not exist here): leave it
            // untouched and become a VM of our own.
            // The attached client's connection is the parent's: close our
            // copy (without the bookkeeping, which is the parent's too).
            drop(sink.direct.take());
            std::mem::forget(sink);
            shared = match become_child_vm(cmd.uplink.as_ref(), &vm) {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("wisp-vmm: forked VM: {e}");
                    std::process::exit(125);
                }
            };
            sink = Sink { shared: shared.clone(), direct: None };
        };
        drop(sink);
        drop(vm);
        finish(&shared, exit_info(&outcome));
    }
    Ok(())
}

/// In a forked VMM process: tell the daemon through the family's uplink,
/// take the child VM's directory, files and control socket it sends back,
/// and serve them with fresh state (the parent's may be locked by threads
/// that did not survive the fork).
fn become_child_vm(uplink: Option<&std::os::fd::OwnedFd>, vm: &wisp_vmm::Vm) -> Result<Arc<Shared>, String> {
    use std::os::fd::AsFd;
    use crate::proto::{recv_packet, send_packet, ForkKit, ForkNote};
    let uplink = uplink.ok_or("no uplink to the daemon")?;
    let (mine, theirs) = rustix::net::socketpair(
        rustix::net::AddressFamily::UNIX,
        rustix::net::SocketType::SEQPACKET,
        rustix::net::SocketFlags::CLOEXEC,
        None,
    )
    .map_err(|e| format!("socketpair: {e}"))?;
    let note = ForkNote { child_pid: std::process::id(), parent_pid: vm.forked_from() as u32 };
    send_packet(uplink.as_fd(), &note, &[theirs.as_fd()]).map_err(|e| format!("tell the daemon: {e}"))?;
    drop(theirs);
    let mut fds = [rustix::event::PollFd::new(&mine, rustix::event::PollFlags::IN)];
    let ts = rustix::time::Timespec { tv_sec: 10, tv_nsec: 0 };
    if rustix::event::poll(&mut fds, Some(&ts)).map_err(|e| e.to_string())? == 0 {
        return Err("the daemon did not answer".into());
    }
    let (msg, fds) = recv_packet(mine.as_fd()).map_err(|e| format!("daemon's answer: {e}"))?;
    let kit: ForkKit = serde_json::from_slice(&msg).map_err(|e| format!("daemon's answer: {e}"))?;
    if let Some(e) = kit.error {
        return Err(e);
    }
    let [dir, exit_tmp, console_tmp, listener]: [std::os::fd::OwnedFd; 4] =
        fds.try_into().map_err(|_| "the daemon's answer lacks descriptors")?;
    let files = JailFiles::from_fds(dir, File::from(exit_tmp), File::from(console_tmp));
    let shared = Shared::new(files, WorkerState::Running, Some(vm.control()));
    let listener = UnixListener::from(listener);
    let s = shared.clone();
    std::thread::Builder::new()
        .name("ctl".into())
        .stack_size(256 << 10)
        .spawn(move || serve_loop(&s, listener))
        .map_err(|e| e.to_string())?;
    Ok(shared)
}

/// Run `f` on a thread of its own, counted as an open connection.
fn spawn_conn(shared: &Arc<Shared>, f: impl FnOnce(&Arc<Shared>) -> io::Result<()> + Send + 'static) {
    let s = shared.clone();
    let spawned = std::thread::Builder::new().stack_size(256 << 10).spawn(move || {
        let _ = f(&s);
        s.release_conn();
    });
    if spawned.is_err() {
        shared.release_conn();
    }
}

/// The control socket once the VM runs. Quick requests (status, pause,
/// resume, kill, stop) are answered on this thread, and their connection
/// stays open for more (the daemon keeps one per VM, so a pause is one
/// round trip on an open socket); requests that stream or block until the VM
/// ends (logs, wait) get a thread of their own and use up their connection.
fn serve_loop(shared: &Arc<Shared>, listener: UnixListener) {
    use rustix::event::{poll, PollFd, PollFlags};
    let mut sessions: Vec<UnixStream> = Vec::new();
    loop {
        let (accept, ready) = {
            let mut fds = Vec::with_capacity(sessions.len() + 1);
            fds.push(PollFd::new(&listener, PollFlags::IN));
            fds.extend(sessions.iter().map(|c| PollFd::new(c, PollFlags::IN)));
            if poll(&mut fds, None).is_err() {
                continue;
            }
            let ready: Vec<usize> = (1..fds.len()).filter(|&i| !fds[i].revents().is_empty()).map(|i| i - 1).collect();
            (!fds[0].revents().is_empty(), ready)
        };
        for i in ready.into_iter().rev() {
            let conn = sessions.swap_remove(i);
            sessions.extend(serve_one(shared, conn));
        }
        if accept {
            if let Ok((conn, _)) = listener.accept() {
                sessions.extend(serve_one(shared, conn));
            }
        }
    }
}

/// Read one request line (10 s at most) and decode it; a malformed one is
/// answered with an error and ends the connection.
fn read_request(conn: &UnixStream) -> Option<(Request, Vec<std::os::fd::OwnedFd>)> {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
    let (line, fd) = recv_line(conn).ok()?;
    let _ = conn.set_read_timeout(None);
    match serde_json::from_slice(&line) {
        Ok(r) => Some((r, fd)),
        Err(e) => {
            let _ = send_line(conn, &Reply::err(format!("bad request: {e}")), None);
            None
        }
    }
}

/// Read and answer one request; give the connection back if it can carry more.
fn serve_one(shared: &Arc<Shared>, conn: UnixStream) -> Option<UnixStream> {
    let (req, _fd) = read_request(&conn)?;
    let reply_conn = conn.try_clone().ok()?;
    // Counted while served, so the process does not exit (the VM may end
    // meanwhile, e.g. on a stop request) before the reply is sent.
    shared.state.lock().unwrap().conns += 1;
    if matches!(req, Request::Wait | Request::Logs { .. }) {
        spawn_conn(shared, move |s| serve(s, reply_conn, req));
        return None;
    }
    let r = serve(shared, reply_conn, req);
    shared.release_conn();
    r.ok().map(|_| conn)
}

/// A start request, parsed.
struct StartCmd {
    image: Image,
    args: Vec<String>,
    timeout: Option<Duration>,
    attach: bool,
    net: Option<wisp_vmm::NetConfig>,
    /// The family's uplink to the daemon (the guest may fork).
    uplink: Option<std::os::fd::OwnedFd>,
}

/// Serve one request while the shell waits in the pool. Returns the start
/// command (and its connection, for the reply) when one arrives.
fn serve_pooled(shared: &Arc<Shared>, conn: UnixStream) -> Option<(StartCmd, UnixStream)> {
    let (req, fds) = read_request(&conn)?;
    let reply = match req {
        Request::Start { image_name, args, timeout_ms, attach, net, uplink } => {
            let mut fds = fds.into_iter();
            let Some(fd) = fds.next() else {
                let _ = send_line(&conn, &Reply::err("start needs the image descriptor"), None);
                return None;
            };
            let net = match (net.is_some().then(|| fds.next()).flatten(), net) {
                (_, None) => None,
                (Some(tap), Some(n)) => Some(wisp_vmm::NetConfig {
                    tap,
                    mac: n.mac,
                    ip: (n.ip, n.prefix),
                    gateway: Some(n.gateway),
                }),
                (None, Some(_)) => {
                    let _ = send_line(&conn, &Reply::err("a NIC needs the tap descriptor"), None);
                    return None;
                }
            };
            let uplink = if uplink { fds.next() } else { None };
            // Parsed again here (the daemon is not trusted blindly); its
            // pages are mapped copy-on-write from the shared memfd.
            match Image::from_fd(&image_name, fd) {
                Ok(image) => {
                    let timeout = timeout_ms.map(Duration::from_millis);
                    let cmd = StartCmd { image, args, timeout, attach, net, uplink };
                    return Some((cmd, conn));
                }
                Err(e) => Reply::err(e.to_string()),
            }
        }
        Request::Status => status(&shared.state.lock().unwrap()),
        Request::Logs { .. } => Reply::ok(WorkerState::Pooled),
        Request::ProbeOpen { path } => probe_open(&path),
        Request::Shutdown => {
            let _ = send_line(&conn, &Reply::ok(WorkerState::Pooled), None);
            std::process::exit(0)
        }
        Request::Pause | Request::Resume | Request::Stop { .. } | Request::Kill | Request::Wait => {
            Reply::err("the VM has not been started")
        }
    };
    let _ = send_line(&conn, &reply, None);
    None
}

fn probe_open(path: &str) -> Reply {
    match File::open(path) {
        Ok(_) => Reply::ok(WorkerState::Running),
        Err(e) => Reply::err(format!("open {path}: {e}")),
    }
}

fn finish(shared: &Arc<Shared>, exit: ExitInfo) -> ! {
    if let Some(mut f) = shared.files.lock().unwrap().take() {
        {
            let c = shared.console.lock().unwrap();
            let (a, b) = c.ring.as_slices();
            let _ = f.console_tmp.write_all(a).and_then(|_| f.console_tmp.write_all(b));
        }
        let _ = f.commit("console.log");
        let _ = f.exit_tmp.write_all(&serde_json::to_vec(&exit).unwrap_or_default());
        let _ = f.commit("exit.json");
    }
    let mut st = shared.state.lock().unwrap();
    st.phase = WorkerState::Exited;
    st.exit = Some(exit);
    st.control = None;
    shared.cv.notify_all();
    shared.console_cv.notify_all();
    // Let followers and waiters read the end, then go.
    let deadline = Instant::now() + Duration::from_secs(5);
    while st.conns > 0 && Instant::now() < deadline {
        st = shared.cv.wait_timeout(st, Duration::from_millis(50)).unwrap().0;
    }
    std::process::exit(0)
}

/// Write a file atomically (temporary file, then rename). Not fsynced:
/// state must survive a crash of the daemon or a VMM process, not of the
/// host (the state directory lives in /run).
pub fn write_atomic(path: &Path, data: &[u8]) -> io::Result<()> {
    let tmp = path.with_extension("tmp");
    let mut f = File::create(&tmp)?;
    f.write_all(data)?;
    std::fs::rename(&tmp, path)
}

fn status(st: &State) -> Reply {
    Reply { ok: true, state: Some(st.phase), exit: st.exit.clone(), boot_us: st.boot_us, error: None }
}

/// Serve one request once the VM has been started.
fn serve(shared: &Arc<Shared>, conn: UnixStream, req: Request) -> io::Result<()> {
    let control = || shared.state.lock().unwrap().control.clone();
    let reply = match req {
        Request::Start { .. } => Reply::err("this VM has already been started"),
        Request::Status => status(&shared.state.lock().unwrap()),
        Request::Pause | Request::Resume => {
            let Some(c) = control() else {
                return send_line(&conn, &Reply::err("the VM is not running"), None);
            };
            let pause = req == Request::Pause;
            if pause {
                if !c.pause(Duration::from_secs(1)) {
                    return send_line(&conn, &Reply::err("the vCPU did not stop within 1 s"), None);
                }
            } else {
                c.resume();
            }
            let mut st = shared.state.lock().unwrap();
            if st.phase != WorkerState::Exited {
                st.phase = if pause { WorkerState::Paused } else { WorkerState::Running };
            }
            status(&st)
        }
        Request::Stop { grace_ms } => {
            if let Some(c) = control() {
                c.post_events(wisp_abi::events::STOP);
                c.resume();
                let s = shared.clone();
                std::thread::spawn(move || {
                    let deadline = Instant::now() + Duration::from_millis(grace_ms);
                    let mut st = s.state.lock().unwrap();
                    while st.phase != WorkerState::Exited && Instant::now() < deadline {
                        st = s.cv.wait_timeout(st, deadline - Instant::now()).unwrap().0;
                    }
                    if st.phase != WorkerState::Exited {
                        c.kill();
                    }
                });
            }
            status(&shared.state.lock().unwrap())
        }
        Request::Kill | Request::Shutdown => {
            if let Some(c) = control() {
                c.kill();
            }
            status(&shared.state.lock().unwrap())
        }
        Request::Wait => {
            let mut st = shared.state.lock().unwrap();
            while st.phase != WorkerState::Exited {
                st = shared.cv.wait(st).unwrap();
            }
            status(&st)
        }
        Request::Logs { follow } => {
            send_line(&conn, &Reply::ok(shared.state.lock().unwrap().phase), None)?;
            return stream_logs(shared, conn, follow);
        }
        Request::ProbeOpen { path } => probe_open(&path),
    };
    send_line(&conn, &reply, None)
}

fn stream_logs(shared: &Arc<Shared>, conn: UnixStream, follow: bool) -> io::Result<()> {
    stream_logs_from(shared, conn, follow, None)
}

/// Stream console output from byte `from` (default: the oldest buffered).
fn stream_logs_from(shared: &Arc<Shared>, mut conn: UnixStream, follow: bool, from: Option<u64>) -> io::Result<()> {
    let mut pos = {
        let c = shared.console.lock().unwrap();
        from.unwrap_or(c.total - c.ring.len() as u64)
    };
    loop {
        let chunk = {
            let mut c = shared.console.lock().unwrap();
            loop {
                let start = c.total - c.ring.len() as u64;
                pos = pos.max(start);
                if pos < c.total {
                    let from = (pos - start) as usize;
                    let (a, b) = c.ring.as_slices();
                    let mut v = Vec::with_capacity(c.ring.len() - from);
                    if from < a.len() {
                        v.extend_from_slice(&a[from..]);
                        v.extend_from_slice(b);
                    } else {
                        v.extend_from_slice(&b[from - a.len()..]);
                    }
                    pos = c.total;
                    break v;
                }
                let exited = shared.state.lock().unwrap().phase == WorkerState::Exited;
                if !follow || exited {
                    return Ok(());
                }
                c = shared.console_cv.wait_timeout(c, Duration::from_millis(200)).unwrap().0;
            }
        };
        conn.write_all(&chunk)?;
    }
}
