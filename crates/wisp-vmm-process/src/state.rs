//! What the threads of a daemon's VMM process share: the VM's phase and
//! exit, its control block once it runs, the console ring, the files it
//! writes when it ends, and a count of open connections (the process stays
//! until they are served).

use std::io::{self, Write};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Condvar, Mutex};

use wisp_api::ExitInfo;
use wisp_jail::JailFiles;
use wisp_vmm::Control;

use crate::console::{Console, Framing};
use crate::proto::{send_line, Reply, WorkerState};

pub(crate) struct State {
    pub phase: WorkerState,
    pub exit: Option<ExitInfo>,
    pub boot_us: Option<u64>,
    pub control: Option<Arc<Control>>,
    /// The VM's library window, if it maps libraries (live updates).
    pub libraries: Option<Arc<wisp_vmm::devices::library::update::Window>>,
    /// Connections being served (or streamed to).
    pub conns: usize,
    /// `wait` requests parked until the VM ends (a group's VMs: no thread
    /// per waiter).
    pub waiters: Vec<UnixStream>,
    /// A kill came before the VM ran (a group's VM between its `host` and
    /// its start): it is killed as it starts.
    pub kill_asked: bool,
}

impl State {
    /// The reply to a status request.
    pub fn status(&self) -> Reply {
        Reply { state: Some(self.phase), exit: self.exit.clone(), boot_us: self.boot_us, ..Reply::ok(self.phase) }
    }
}

pub(crate) struct Shared {
    /// `exit.json` and `console.log`, taken when the VM ends.
    pub files: Mutex<Option<JailFiles>>,
    pub state: Mutex<State>,
    /// Signalled on changes of `state`.
    pub cv: Condvar,
    pub console: Console,
    /// The guest's standard error (its own ring, `stderr.log`).
    pub errors: Console,
    /// The guest's standard input until a client takes it (`stdin`).
    pub stdin: Mutex<Option<wisp_vmm::StdinFeed>>,
    /// The connection its input comes from once taken: shut when the VM
    /// ends, so that its thread ends too (in a group, the process goes on).
    pub stdin_conn: Mutex<Option<UnixStream>>,
}

impl Shared {
    pub fn new(files: JailFiles, phase: WorkerState, control: Option<Arc<Control>>) -> Arc<Shared> {
        Arc::new(Shared {
            files: Mutex::new(Some(files)),
            state: Mutex::new(State { phase, exit: None, boot_us: None, control, libraries: None, conns: 0, waiters: Vec::new(), kill_asked: false }),
            cv: Condvar::new(),
            console: Console::new(),
            errors: Console::new(),
            stdin: Mutex::new(None),
            stdin_conn: Mutex::new(None),
        })
    }

    /// Whether the VM has ended.
    pub fn exited(&self) -> bool {
        self.state.lock().unwrap().phase == WorkerState::Exited
    }

    /// Stream the console to `conn` (see [`Console::stream`]) until the VM
    /// ends.
    pub fn stream_logs(&self, conn: UnixStream, follow: bool, from: Option<u64>, framing: Framing, pending: &[u8]) -> io::Result<()> {
        self.console.stream(conn, follow, from, || self.exited(), framing, pending)
    }

    /// The VM has ended: write `console.log`, `stderr.log` and `exit.json`, record the
    /// exit, wake every thread waiting and answer the parked waiters.
    pub fn end(&self, exit: ExitInfo) {
        if let Some(mut f) = self.files.lock().unwrap().take() {
            let _ = self.console.write_to(&mut f.console);
            let _ = self.errors.write_to(&mut f.errors);
            let _ = f.exit.write_all(&serde_json::to_vec(&exit).unwrap_or_default());
        }
        let (waiters, reply) = {
            let mut st = self.state.lock().unwrap();
            st.phase = WorkerState::Exited;
            st.exit = Some(exit);
            st.control = None;
            self.cv.notify_all();
            (std::mem::take(&mut st.waiters), st.status())
        };
        self.console.wake();
        self.errors.wake();
        // Input for a VM that has ended goes nowhere: refused from now on
        // (the phase), and a feeding thread is ended.
        drop(self.stdin.lock().unwrap().take());
        if let Some(c) = self.stdin_conn.lock().unwrap().take() {
            let _ = c.shutdown(std::net::Shutdown::Both);
        }
        for w in waiters {
            let _ = send_line(&w, &reply, None);
        }
    }

    /// Answer `conn`'s `wait` when the VM ends (now, if it has).
    pub fn park_waiter(&self, conn: UnixStream) {
        let mut st = self.state.lock().unwrap();
        if st.phase == WorkerState::Exited {
            let reply = st.status();
            drop(st);
            let _ = send_line(&conn, &reply, None);
        } else {
            st.waiters.push(conn);
        }
    }

    /// A connection being served has finished.
    pub fn release_conn(&self) {
        let mut st = self.state.lock().unwrap();
        st.conns -= 1;
        self.cv.notify_all();
    }
}

/// Run `f` on a thread of its own, counted as an open connection (the
/// caller has counted it).
pub(crate) fn spawn_conn(shared: &Arc<Shared>, f: impl FnOnce(&Arc<Shared>) -> io::Result<()> + Send + 'static) {
    let s = shared.clone();
    let spawned = std::thread::Builder::new().stack_size(256 << 10).spawn(move || {
        crate::narrow::narrow(wisp_jail::seccomp::Role::Control);
        let _ = f(&s);
        s.release_conn();
    });
    if spawned.is_err() {
        shared.release_conn();
    }
}
