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
    shutdown: bool,
}

struct Shared {
    files: Mutex<Option<JailFiles>>,
    state: Mutex<State>,
    cv: Condvar,
    console: Mutex<Console>,
    console_cv: Condvar,
}

struct StartCmd {
    image: Image,
    args: Vec<String>,
    timeout: Option<Duration>,
    reply: mpsc::Sender<Result<u64, String>>,
}

struct Sink(Arc<Shared>);

impl Write for Sink {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let mut c = self.0.console.lock().unwrap();
        c.total += data.len() as u64;
        let keep = data.len().min(CONSOLE_RING);
        let over = (c.ring.len() + keep).saturating_sub(CONSOLE_RING);
        c.ring.drain(..over);
        c.ring.extend(&data[data.len() - keep..]);
        self.0.console_cv.notify_all();
        Ok(data.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
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
    let shell = Shell::create(&kvm, mem).map_err(|e| e.to_string())?;
    drop(kvm);
    let sock_path = dir.join("ctl.sock");
    let _ = std::fs::remove_file(&sock_path);
    let listener = UnixListener::bind(&sock_path).map_err(|e| format!("bind {}: {e}", sock_path.display()))?;
    let files = JailFiles::open(dir).map_err(|e| format!("open files in {}: {e}", dir.display()))?;
    wisp_vmm::Control::prepare_process();
    jail::enter(uid, mem)?;
    let shared = Arc::new(Shared {
        files: Mutex::new(Some(files)),
        state: Mutex::new(State {
            phase: WorkerState::Pooled,
            exit: None,
            boot_us: None,
            control: None,
            conns: 0,
            shutdown: false,
        }),
        cv: Condvar::new(),
        console: Mutex::new(Console { ring: VecDeque::new(), total: 0 }),
        console_cv: Condvar::new(),
    });
    let (tx, rx) = mpsc::channel::<StartCmd>();
    let s = shared.clone();
    std::thread::Builder::new()
        .name("vcpu0".into())
        .spawn(move || vcpu_main(shell, rx, s))
        .map_err(|e| e.to_string())?;
    let tx = Arc::new(Mutex::new(Some(tx)));
    // Tell the daemon the shell is ready.
    println!("ready");
    let _ = io::stdout().flush();
    for conn in listener.incoming() {
        let Ok(conn) = conn else { continue };
        shared.state.lock().unwrap().conns += 1;
        let s = shared.clone();
        let tx = tx.clone();
        let spawned = std::thread::Builder::new().spawn(move || {
            let _ = serve(&s, conn, &tx);
            let mut st = s.state.lock().unwrap();
            st.conns -= 1;
            s.cv.notify_all();
        });
        if spawned.is_err() {
            shared.state.lock().unwrap().conns -= 1;
        }
    }
    Ok(())
}

/// The vCPU thread: wait for the image, run it, persist the outcome, exit
/// the process once no connection needs it.
fn vcpu_main(shell: Shell, rx: mpsc::Receiver<StartCmd>, shared: Arc<Shared>) {
    let Ok(cmd) = rx.recv() else {
        // Shut down while pooled.
        std::process::exit(0)
    };
    let t = Instant::now();
    let mut vm = match shell.load(&cmd.image, &cmd.args) {
        Ok(vm) => vm,
        Err(e) => {
            let _ = cmd.reply.send(Err(e.to_string()));
            finish(&shared, ExitInfo { code: 125, reason: e.to_string() });
        }
    };
    let boot_us = t.elapsed().as_micros() as u64;
    {
        let mut st = shared.state.lock().unwrap();
        st.phase = WorkerState::Running;
        st.boot_us = Some(boot_us);
        st.control = Some(vm.control());
    }
    let _ = cmd.reply.send(Ok(boot_us));
    let outcome = vm.run(&mut Sink(shared.clone()), cmd.timeout);
    drop(vm);
    finish(&shared, exit_info(&outcome));
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

fn serve(shared: &Arc<Shared>, conn: UnixStream, tx: &Mutex<Option<mpsc::Sender<StartCmd>>>) -> io::Result<()> {
    conn.set_read_timeout(Some(Duration::from_secs(10)))?;
    let (line, fd) = recv_line(&conn)?;
    conn.set_read_timeout(None)?;
    let req: Request = match serde_json::from_slice(&line) {
        Ok(r) => r,
        Err(e) => return send_line(&conn, &Reply::err(format!("bad request: {e}")), None),
    };
    let control = || shared.state.lock().unwrap().control.clone();
    let reply = match req {
        Request::Start { image_name, args, timeout_ms } => {
            let Some(fd) = fd else {
                return send_line(&conn, &Reply::err("start needs the image descriptor"), None);
            };
            // Parsed again here (the daemon is not trusted blindly); its
            // pages are mapped copy-on-write from the shared memfd.
            let image = match Image::from_fd(&image_name, fd) {
                Ok(i) => i,
                Err(e) => return send_line(&conn, &Reply::err(e.to_string()), None),
            };
            let (rtx, rrx) = mpsc::channel();
            let cmd = StartCmd { image, args, timeout: timeout_ms.map(Duration::from_millis), reply: rtx };
            let sent = tx.lock().unwrap().take().map(|t| t.send(cmd).is_ok()).unwrap_or(false);
            if !sent {
                Reply::err("this VM has already been started")
            } else {
                match rrx.recv() {
                    Ok(Ok(us)) => Reply { boot_us: Some(us), ..Reply::ok(WorkerState::Running) },
                    Ok(Err(e)) => Reply::err(e),
                    Err(_) => Reply::err("the vCPU thread ended"),
                }
            }
        }
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
        Request::Kill => {
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
        Request::ProbeOpen { path } => match File::open(&path) {
            Ok(_) => Reply::ok(shared.state.lock().unwrap().phase),
            Err(e) => Reply::err(format!("open {path}: {e}")),
        },
        Request::Shutdown => {
            let pooled = {
                let mut st = shared.state.lock().unwrap();
                st.shutdown = true;
                st.phase == WorkerState::Pooled
            };
            if pooled {
                // Dropping the start channel ends the vCPU thread and the process.
                tx.lock().unwrap().take();
            } else if let Some(c) = control() {
                c.kill();
            }
            Reply::ok(shared.state.lock().unwrap().phase)
        }
    };
    send_line(&conn, &reply, None)
}

fn stream_logs(shared: &Arc<Shared>, mut conn: UnixStream, follow: bool) -> io::Result<()> {
    let mut pos = {
        let c = shared.console.lock().unwrap();
        c.total - c.ring.len() as u64
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
