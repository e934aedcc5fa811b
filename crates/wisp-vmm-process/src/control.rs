//! The control socket of a daemon's VMM process (`ctl.sock`, the server side
//! of [`crate::proto`]). While the shell waits in the pool the main thread
//! answers requests itself ([`serve_pooled`]) until a `start` arrives; once
//! the VM runs a thread of its own serves the socket ([`serve_loop`]).

use std::fs::File;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use wisp_vmm::{Image, NetConfig};

use crate::proto::{recv_line, send_line, Reply, Request, WorkerState};
use crate::state::{spawn_conn, Shared};

/// The answer to a `host` sent to a VM's own control socket.
const NOT_A_GROUP: &str = "this is a VM's control socket: only a group's hosts VMs";

/// A start request, parsed.
pub(crate) struct StartCmd {
    /// The image, or none for the shell's preloaded one (of this name).
    pub image: Option<Image>,
    pub image_name: String,
    pub args: Vec<String>,
    pub timeout: Option<Duration>,
    pub attach: bool,
    /// Its NICs, in order.
    pub net: Vec<NetConfig>,
    /// The family's uplink to the daemon (the guest may fork).
    pub uplink: Option<OwnedFd>,
    /// Most VMs in the family, if the daemon set it.
    pub family_limit: Option<u32>,
    /// The API client's connection and the response head to write to it
    /// (the console goes there, as HTTP chunks).
    pub client: Option<(UnixStream, Vec<u8>)>,
    /// When the request was read (host monotonic clock, ns).
    pub received_ns: u64,
    /// The guest's environment and files.
    pub data: Option<wisp_vmm::DataDevice>,
    /// Keep its standard input open for a `stdin` request.
    pub stdin: bool,
    /// Its disks.
    pub disks: Vec<wisp_vmm::BlockConfig>,
    /// A snapshot to restore instead of an image (a sealed memfd).
    pub snapshot: Option<OwnedFd>,
    /// Its bases if it is incremental, oldest first.
    pub bases: Vec<OwnedFd>,
    /// Make the VM a template: its snapshot goes here when it is ready.
    pub template: Option<OwnedFd>,
    /// Hold the restore until a [`Request::Continue`] brings the last
    /// increment.
    pub hold: bool,
    /// Shared libraries to map, checked.
    pub libraries: Vec<wisp_vmm::devices::library::LibraryDevice>,
}

/// What a pooled shell is asked to do with itself.
pub(crate) enum Pooled {
    /// Start a VM.
    Start(StartCmd),
    /// Load this image ahead.
    Preload(Image),
}

/// Serve one request while the shell waits in the pool. Returns a start
/// command or an image to preload (and the connection, for the reply).
pub(crate) fn serve_pooled(shared: &Arc<Shared>, conn: UnixStream) -> Option<(Pooled, UnixStream)> {
    let (req, fds) = read_request(&conn)?;
    let received_ns = crate::monotonic_ns();
    let reply = match req {
        Request::Preload { image_name } => match fds.into_iter().next().map(|fd| Image::from_fd(&image_name, fd)) {
            Some(Ok(image)) => return Some((Pooled::Preload(image), conn)),
            Some(Err(e)) => Reply::err(e.to_string()),
            None => Reply::err("preload needs the image descriptor"),
        },
        Request::Start { image_name, preloaded, restore, bases, args, timeout_ms, attach, net, links, uplink, family_limit, client_head, data, stdin, volumes, template, hold, libs } => {
            if hold && !restore {
                let _ = send_line(&conn, &Reply::err("only a restore is held"), None);
                return None;
            }
            let mut fds = fds.into_iter();
            let first = if preloaded { None } else { fds.next() };
            if !preloaded && first.is_none() {
                let _ = send_line(&conn, &Reply::err(if restore { "a restore needs the snapshot's descriptor" } else { "start needs the image descriptor" }), None);
                return None;
            }
            let (image_fd, snapshot) = if restore { (None, first) } else { (first, None) };
            // An incremental snapshot's bases, oldest first.
            let mut chain = Vec::new();
            for i in 0..if restore { bases } else { 0 } {
                match fds.next() {
                    Some(fd) => chain.push(fd),
                    None => {
                        let _ = send_line(&conn, &Reply::err(format!("base {i} of the snapshot needs its descriptor")), None);
                        return None;
                    }
                }
            }
            let specs = match crate::proto::nics(net, links) {
                Ok(s) => s,
                Err(e) => {
                    let _ = send_line(&conn, &Reply::err(e), None);
                    return None;
                }
            };
            let mut nics = Vec::with_capacity(specs.len());
            for n in specs {
                match fds.next() {
                    Some(tap) => nics.push(n.into_config(tap)),
                    None => {
                        let _ = send_line(&conn, &Reply::err("a NIC needs the tap descriptor"), None);
                        return None;
                    }
                }
            }
            let net = nics;
            let uplink = if uplink { fds.next() } else { None };
            let client = match client_head {
                None => None,
                Some(head) => match fds.next() {
                    Some(fd) => Some((UnixStream::from(fd), head.into_bytes())),
                    None => {
                        let _ = send_line(&conn, &Reply::err("an attached client needs its connection"), None);
                        return None;
                    }
                },
            };
            let data = match data.then(|| fds.next()) {
                None => None,
                Some(Some(fd)) => match crate::boot::data_from_fd(fd) {
                    Ok(d) => Some(d),
                    Err(e) => {
                        let _ = send_line(&conn, &Reply::err(e), None);
                        return None;
                    }
                },
                Some(None) => {
                    let _ = send_line(&conn, &Reply::err("environment and files need their descriptor"), None);
                    return None;
                }
            };
            // Checked again here (the daemon is not trusted blindly).
            let mut disks = Vec::new();
            for (i, ro) in volumes.into_iter().enumerate() {
                let made = fds.next().ok_or_else(|| format!("volume {i} needs its descriptor")).and_then(|fd| {
                    wisp_vmm::BlockConfig::from_file(std::fs::File::from(fd), ro, &format!("{i}"))
                });
                match made {
                    Ok(d) => disks.push(d),
                    Err(e) => {
                        let _ = send_line(&conn, &Reply::err(e), None);
                        return None;
                    }
                }
            }
            // Checked again here (the daemon is not trusted blindly).
            let mut libraries = Vec::new();
            for name in libs {
                let made = fds.next().ok_or_else(|| format!("library {name} needs its descriptor")).and_then(|fd| {
                    wisp_vmm::devices::library::LibraryDevice::from_fd(&name, fd).map_err(|e| format!("library {name}: {e}"))
                });
                match made {
                    Ok(l) => libraries.push(l),
                    Err(e) => {
                        let _ = send_line(&conn, &Reply::err(e), None);
                        return None;
                    }
                }
            }
            let template = match template.then(|| fds.next()) {
                None => None,
                Some(Some(fd)) => Some(fd),
                Some(None) => {
                    let _ = send_line(&conn, &Reply::err("a template needs its stream's descriptor"), None);
                    return None;
                }
            };
            // Parsed again here (the daemon is not trusted blindly); its
            // pages are mapped copy-on-write from the shared memfd.
            match image_fd.map(|fd| Image::from_fd(&image_name, fd)).transpose() {
                Ok(image) => {
                    let timeout = timeout_ms.map(Duration::from_millis);
                    let cmd = StartCmd {
                        image,
                        image_name,
                        args,
                        timeout,
                        attach,
                        net,
                        uplink,
                        family_limit,
                        client,
                        received_ns,
                        data,
                        stdin,
                        disks,
                        snapshot,
                        bases: chain,
                        template,
                        hold,
                        libraries,
                    };
                    return Some((Pooled::Start(cmd), conn));
                }
                Err(e) => Reply::err(e.to_string()),
            }
        }
        Request::Status => shared.state.lock().unwrap().status(),
        Request::Logs { .. } => Reply::ok(WorkerState::Pooled),
        Request::ProbeOpen { path } => probe_open(&path),
        Request::Shutdown => {
            let _ = send_line(&conn, &Reply::ok(WorkerState::Pooled), None);
            std::process::exit(0)
        }
        Request::Pause | Request::Resume | Request::Stop { .. } | Request::Kill | Request::Wait | Request::Uplink | Request::Snapshot { .. } | Request::Continue | Request::UpdateLib { .. } => {
            Reply::err("the VM has not been started")
        }
        Request::Host { .. } | Request::Serve { .. } => Reply::err(NOT_A_GROUP),
        Request::Stdin => Reply::err("the VM has not started: its standard input is not open yet"),
    };
    let _ = send_line(&conn, &reply, None);
    None
}

/// The control socket once the VM runs. Quick requests (status, pause,
/// resume, kill, stop) are answered on this thread, and their connection
/// stays open for more (the daemon keeps one per VM, so a pause is one
/// round trip on an open socket); requests that stream or block until the VM
/// ends (logs, wait) get a thread of their own and use up their connection.
pub(crate) fn serve_loop(shared: &Arc<Shared>, listener: UnixListener) {
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
            if let Ok((conn, _)) = accept_timed(&listener) {
                sessions.extend(serve_one(shared, conn));
            }
        }
    }
}

/// Start [`serve_loop`] on a thread of its own ("ctl"), once `listener`
/// arrives (the main thread serves it until the VM runs).
pub(crate) fn spawn_server(
    shared: &Arc<Shared>,
    listener: impl FnOnce() -> Option<UnixListener> + Send + 'static,
) -> Result<(), String> {
    let s = shared.clone();
    std::thread::Builder::new()
        .name("ctl".into())
        .stack_size(256 << 10)
        .spawn(move || {
            crate::narrow::narrow(wisp_jail::seccomp::Role::Control);
            if let Some(listener) = listener() {
                serve_loop(&s, listener);
            }
        })
        .map(drop)
        .map_err(|e| e.to_string())
}

/// While the shell waits in the pool: the next connection with a request
/// to read, a new one or one of the open `sessions` (the daemon keeps one
/// open per pooled shell, so a start needs no connect). Waits until there
/// is one.
pub(crate) fn next_pooled(listener: &UnixListener, sessions: &mut Vec<UnixStream>) -> Option<UnixStream> {
    use rustix::event::{poll, PollFd, PollFlags};
    loop {
        let (accept, ready) = {
            let mut fds = Vec::with_capacity(sessions.len() + 1);
            fds.push(PollFd::new(listener, PollFlags::IN));
            fds.extend(sessions.iter().map(|c| PollFd::new(c, PollFlags::IN)));
            poll(&mut fds, None).ok()?;
            (!fds[0].revents().is_empty(), (1..fds.len()).find(|&i| !fds[i].revents().is_empty()))
        };
        if let Some(i) = ready {
            return Some(sessions.swap_remove(i - 1));
        }
        // A new connection is a session too: read once it has a request.
        if accept {
            if let Ok((c, _)) = accept_timed(listener) {
                sessions.push(c);
            }
        }
    }
}

/// Stay on the CPU (without sleeping, so the CPU does not go idle) until
/// `conn` has something to read or `most` has passed; yielding between
/// looks, so that on a busy host whatever else is runnable (the daemon
/// making the start, other VMs) runs first.
pub(crate) fn stay_awake(conn: &UnixStream, most: Duration) {
    use rustix::event::{poll, PollFd, PollFlags};
    let deadline = Instant::now() + most;
    while Instant::now() < deadline {
        let mut fds = [PollFd::new(conn, PollFlags::IN)];
        if poll(&mut fds, Some(&rustix::time::Timespec { tv_sec: 0, tv_nsec: 0 })).is_ok_and(|n| n > 0) {
            return;
        }
        std::thread::yield_now();
    }
}

/// Accept a connection, whose reads then end within 10 s (a request line
/// comes whole: reads come when a poll said there is something).
pub(crate) fn accept_timed(listener: &UnixListener) -> io::Result<(UnixStream, std::os::unix::net::SocketAddr)> {
    let (c, a) = listener.accept()?;
    c.set_read_timeout(Some(Duration::from_secs(10)))?;
    Ok((c, a))
}

/// Read one request line (within the read timeout [`accept_timed`] set) and
/// decode it; a malformed one is answered with an error and ends the
/// connection.
pub(crate) fn read_request(conn: &UnixStream) -> Option<(Request, Vec<OwnedFd>)> {
    let (line, fd) = recv_line(conn).ok()?;
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
    serve_request(shared, conn, false)
}

/// [`serve_one`] for a VM of a group, served by the group's main thread:
/// a `wait` is parked (answered when the VM ends) rather than given a
/// thread.
pub(crate) fn serve_hosted(shared: &Arc<Shared>, conn: UnixStream) -> Option<UnixStream> {
    serve_request(shared, conn, true)
}

fn serve_request(shared: &Arc<Shared>, conn: UnixStream, park_waits: bool) -> Option<UnixStream> {
    let (req, fds) = read_request(&conn)?;
    if park_waits && req == Request::Wait {
        shared.park_waiter(conn);
        return None;
    }
    // A group's VMs cannot fork: they take no uplink.
    if park_waits && req == Request::Uplink {
        return send_line(&conn, &Reply::err(crate::proto::NO_FORK), None).ok().map(|()| conn);
    }
    let reply_conn = conn.try_clone().ok()?;
    // Counted while served, so the process does not exit (the VM may end
    // meanwhile, e.g. on a stop request) before the reply is sent.
    shared.state.lock().unwrap().conns += 1;
    if matches!(req, Request::Wait | Request::Logs { .. }) {
        spawn_conn(shared, move |s| serve(s, reply_conn, req));
        return None;
    }
    let r = match req {
        Request::Uplink => send_line(&reply_conn, &uplink(shared, fds), None),
        Request::Stdin => send_line(&reply_conn, &stdin(shared, fds), None),
        Request::Snapshot { incremental, pause } => send_line(&reply_conn, &snapshot(shared, fds, incremental, pause), None),
        Request::UpdateLib { name, wait_ms } => {
            let r = send_line(&reply_conn, &update_lib(shared, fds, &name, wait_ms), None);
            r
        }
        req => serve(shared, reply_conn, req),
    };
    shared.release_conn();
    r.ok().map(|_| conn)
}

/// Most time a snapshot may hold the control thread (the vCPU is saved at
/// its next exit; writing goes as fast as the daemon reads).
const SNAPSHOT_TIMEOUT: Duration = Duration::from_secs(30);

/// A snapshot of the VM into the descriptor passed (a pipe's write end,
/// closed when it is written: the reader sees its end).
fn snapshot(shared: &Arc<Shared>, fds: Vec<OwnedFd>, incremental: bool, pause: bool) -> Reply {
    let (fd, control) = match running_with_fd(shared, fds, "a snapshot needs its stream's descriptor") {
        Ok(v) => v,
        Err(r) => return r,
    };
    // Paused first: no guest instruction runs between the snapshot and the
    // pause (a paused vCPU serves the snapshot where it waits).
    if pause {
        if let Err(e) = set_paused(shared, &control, true) {
            return e;
        }
    }
    match control.save_with(Box::new(File::from(fd)), incremental, SNAPSHOT_TIMEOUT) {
        Ok(s) => {
            let mut r = shared.state.lock().unwrap().status();
            r.saved = Some([s.bytes, s.ram_bytes, s.held_us]);
            r
        }
        Err(e) => Reply::err(format!("snapshot: {e}")),
    }
}

/// A request's first descriptor and the running VM's control block, or
/// the answer why not (`missing`: none was passed).
fn running_with_fd(shared: &Arc<Shared>, fds: Vec<OwnedFd>, missing: &str) -> Result<(OwnedFd, Arc<wisp_vmm::Control>), Reply> {
    let fd = fds.into_iter().next().ok_or_else(|| Reply::err(missing))?;
    let control = shared.state.lock().unwrap().control.clone().ok_or_else(|| Reply::err("the VM is not running"))?;
    if shared.exited() {
        return Err(Reply::err("the VM has exited"));
    }
    Ok((fd, control))
}

/// Longest a live update waits for the guest.
const MAX_UPDATE_WAIT: Duration = Duration::from_secs(60);

/// A live update of library `name` by the one in the descriptor passed
/// (`wisp_vmm::devices::library::update`).
fn update_lib(shared: &Arc<Shared>, fds: Vec<OwnedFd>, name: &str, wait_ms: u64) -> Reply {
    let (fd, control) = match running_with_fd(shared, fds, "an update needs the library's descriptor") {
        Ok(v) => v,
        Err(r) => return r,
    };
    if control.is_paused() {
        return Reply::err("the VM is paused: a library is switched where the guest runs (resume it first)");
    }
    let new = match wisp_vmm::devices::library::LibraryDevice::from_fd(name, fd) {
        Ok(d) => d,
        Err(e) => return Reply::err(format!("library {name}: {e}")),
    };
    let Some(window) = shared.state.lock().unwrap().libraries.clone() else {
        return Reply::err(format!("update of library {name}: the VM maps no library"));
    };
    match window.update(&control, name, new, Duration::from_millis(wait_ms).min(MAX_UPDATE_WAIT)) {
        Ok(u) => {
            let mut r = shared.state.lock().unwrap().status();
            r.updated = Some([u.total_us, u.held_us, u.quiesce_us, u.variables as u64, u.pointers as u64, u.stale as u64]);
            r
        }
        Err(e) => Reply::err(format!("update of library {name}: {e}")),
    }
}

/// A new family uplink from a daemon that re-adopted the VM (the first
/// descriptor of the request; any other is closed).
fn uplink(shared: &Arc<Shared>, fds: Vec<OwnedFd>) -> Reply {
    let Some(fd) = fds.into_iter().next() else {
        return Reply::err("uplink needs the socket's descriptor");
    };
    match crate::uplink::replace_uplink(fd) {
        Ok(()) => {
            let st = shared.state.lock().unwrap();
            // Spare monitor processes hold the old uplink: new ones come.
            if let Some(c) = &st.control {
                c.inherited_changed();
            }
            st.status()
        }
        Err(e) => Reply::err(e),
    }
}

/// The guest's standard input from the connection passed (the first
/// descriptor), on a thread of its own until the connection's end. The
/// thread is not counted as a connection: a VM that ends does not wait for
/// its input to end.
fn stdin(shared: &Arc<Shared>, fds: Vec<OwnedFd>) -> Reply {
    let Some(fd) = fds.into_iter().next() else {
        return Reply::err("stdin needs the connection's descriptor");
    };
    if shared.exited() {
        return Reply::err("the VM has exited");
    }
    let Some(feed) = shared.stdin.lock().unwrap().take() else {
        return Reply::err("this VM's standard input is not open (create it with stdin), or is taken already");
    };
    let conn = UnixStream::from(fd);
    let _ = conn.set_read_timeout(None);
    match conn.try_clone() {
        Ok(c) => *shared.stdin_conn.lock().unwrap() = Some(c),
        Err(e) => return Reply::err(format!("stdin: {e}")),
    }
    // Ended meanwhile: `end` may have looked before the connection was kept.
    if shared.exited() {
        drop(shared.stdin_conn.lock().unwrap().take());
        return Reply::err("the VM has exited");
    }
    let spawned = std::thread::Builder::new().name("stdin".into()).spawn(move || {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match io::Read::read(&mut &conn, &mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => feed.push(&buf[..n]),
            }
        }
        feed.end();
    });
    match spawned {
        Ok(_) => shared.state.lock().unwrap().status(),
        Err(e) => Reply::err(format!("stdin thread: {e}")),
    }
}

fn probe_open(path: &str) -> Reply {
    match File::open(path) {
        Ok(_) => Reply::ok(WorkerState::Running),
        Err(e) => Reply::err(format!("open {path}: {e}")),
    }
}

/// Pause (its vCPU stopped, within 1 s) or resume the VM, and record it.
fn set_paused(shared: &Arc<Shared>, c: &wisp_vmm::Control, pause: bool) -> Result<(), Reply> {
    if pause {
        if !c.pause(Duration::from_secs(1)) {
            return Err(Reply::err("the vCPU did not stop within 1 s"));
        }
    } else {
        c.resume();
    }
    let mut st = shared.state.lock().unwrap();
    if st.phase != WorkerState::Exited {
        st.phase = if pause { WorkerState::Paused } else { WorkerState::Running };
    }
    Ok(())
}

/// Serve one request once the VM has been started.
fn serve(shared: &Arc<Shared>, conn: UnixStream, req: Request) -> io::Result<()> {
    let control = || shared.state.lock().unwrap().control.clone();
    let reply = match req {
        Request::Start { .. } | Request::Preload { .. } | Request::Continue => Reply::err("this VM has already been started"),
        Request::Host { .. } | Request::Serve { .. } => Reply::err(NOT_A_GROUP),
        Request::Status => shared.state.lock().unwrap().status(),
        Request::Stdin => Reply::err("stdin needs the connection's descriptor"),
        Request::Pause | Request::Resume => {
            let Some(c) = control() else {
                return send_line(&conn, &Reply::err("the VM is not running"), None);
            };
            match set_paused(shared, &c, req == Request::Pause) {
                Ok(()) => shared.state.lock().unwrap().status(),
                Err(e) => e,
            }
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
            shared.state.lock().unwrap().status()
        }
        Request::Kill | Request::Shutdown => {
            let mut st = shared.state.lock().unwrap();
            match st.control.clone() {
                Some(c) => c.kill(),
                None => st.kill_asked = true,
            }
            st.status()
        }
        Request::Wait => {
            let mut st = shared.state.lock().unwrap();
            while st.phase != WorkerState::Exited {
                st = shared.cv.wait(st).unwrap();
            }
            st.status()
        }
        Request::Logs { follow, stderr: false } => {
            send_line(&conn, &Reply::ok(shared.state.lock().unwrap().phase), None)?;
            return shared.stream_logs(conn, follow, None, crate::console::Framing::Raw, b"");
        }
        Request::Logs { follow, stderr: true } => {
            send_line(&conn, &Reply::ok(shared.state.lock().unwrap().phase), None)?;
            return shared.errors.stream(conn, follow, None, || shared.exited(), crate::console::Framing::Raw, b"");
        }
        Request::ProbeOpen { path } => probe_open(&path),
        Request::Uplink => Reply::err("uplink needs its descriptor"),
        Request::Snapshot { .. } => Reply::err("a snapshot needs its stream's descriptor"),
        Request::UpdateLib { .. } => Reply::err("an update needs the library's descriptor"),
    };
    send_line(&conn, &reply, None)
}
