//! `wisp fn serve`: a functions service (issue 18 item 2, after LightVM
//! §7.2; `docs/usecases.md` "Functions"). An HTTP endpoint where functions
//! are registered (`PUT /functions/NAME`, or `--fn NAME=IMAGE` at start)
//! and called (`POST /functions/NAME`, the call's arguments in a JSON body):
//! each call runs in a VM of its own under wispd and answers with what the
//! function printed, and its VM is gone after. A function is an image,
//! booted fresh for each call from one of the daemon's prepared shells
//! (the image loaded ahead) and removed after it; or an application
//! library (`NAME.so`), run on a recycler kept at its ready point behind an
//! endpoint of its own and scrubbed back to that point after each call
//! (`docs/libraries.md`): what one call leaves in memory, the next never
//! sees.
//!
//! Per call: a time limit (a VM has one vCPU, so it bounds the call's CPU
//! time as well), a memory size (the VM's RAM: a function that allocates
//! past it fails inside its VM), and an output limit (a call that prints
//! more is stopped). A call that hits one is answered with a status and a
//! one-line reason: 504 (time), 507 (memory), 502 (output). A function
//! that exits non-zero is answered 500 with its output and `X-Wisp-Exit`.
//!
//! Served with a thread per connection (at most [`MAX_CONNECTIONS`]), the
//! HTTP of `wisp_api::http`, the daemon's API through `wisp_api::client`.
//! At most `--max-running` calls run at once; the others wait their turn,
//! first come first served: an overloaded service builds a backlog rather
//! than refusing calls or running more VMs than the host can serve.

use std::collections::HashMap;
use std::io::BufReader;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Subcommand;
use serde::{Deserialize, Serialize};
use wisp_api::client::{ApiError, Client};
use wisp_api::http::{self, Client as HttpClient, HttpError, Request};
use wisp_api::CreateVm;

/// Most connections served at once (more are answered 503 and closed).
const MAX_CONNECTIONS: usize = 512;
/// Most bytes of a request body.
const MAX_BODY: usize = 64 << 10;

#[derive(Subcommand)]
pub enum FnCmd {
    /// Serve functions over HTTP on ADDR: `PUT /functions/NAME` registers
    /// one, `POST /functions/NAME` calls it, `GET /functions` lists them.
    Serve {
        /// Where to listen, e.g. 127.0.0.1:8080.
        #[arg(long, default_value = "127.0.0.1:8080")]
        listen: SocketAddr,
        /// Register NAME as IMAGE (a bundled app, an image path, or an
        /// application library ending in .so) at start; repeatable.
        #[arg(long = "fn", value_name = "NAME=IMAGE")]
        functions: Vec<String>,
        /// Default time limit of a call.
        #[arg(long, value_parser = crate::units::parse_duration, default_value = "5s")]
        time_limit: Duration,
        /// Default memory of a call's VM, e.g. 16M.
        #[arg(long, value_parser = crate::units::parse_mem, default_value = "16M")]
        mem: u64,
        /// Default output limit of a call, e.g. 1M.
        #[arg(long, value_parser = crate::units::parse_mem, default_value = "1M")]
        max_output: u64,
        /// Most calls running at once; more wait for one to end, in the
        /// order they came (a backlog, not a refusal).
        #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=4096))]
        max_running: u32,
        /// Register NAME as host executable PATH, run as a fresh process
        /// per call, without a VM: the comparison the functions benchmark
        /// makes (`bench/usecases_fn.py`), with the same server, time and
        /// output limits (no memory limit). Only here, never over HTTP.
        #[arg(long = "process-fn", value_name = "NAME=PATH")]
        process_functions: Vec<String>,
    },
}

/// A registered function (`PUT /functions/NAME`'s body).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Function {
    /// An image (bundled app name or absolute path), or an absolute path
    /// of an application library `NAME.so`.
    pub image: String,
    /// Arguments given before each call's own.
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub time_limit_ms: Option<u64>,
    #[serde(default)]
    pub mem: Option<u64>,
    #[serde(default)]
    pub max_output: Option<u64>,
    /// A library's recycler endpoint (its socket), once made.
    #[serde(default, skip_deserializing)]
    pub endpoint: Option<String>,
    /// A host executable run as a process per call (`--process-fn`).
    #[serde(default, skip_deserializing)]
    pub process: bool,
}

/// A call's body: its arguments.
#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Call {
    #[serde(default)]
    args: Vec<String>,
}

struct Defaults {
    time_limit: Duration,
    mem: u64,
    max_output: u64,
}

struct Service {
    socket: PathBuf,
    functions: Mutex<HashMap<String, Function>>,
    defaults: Defaults,
    open: AtomicUsize,
    /// Calls running, and tickets (taken, served) that order the waiting.
    running: Mutex<Running>,
    turn: std::sync::Condvar,
}

#[derive(Default)]
struct Running {
    now: u32,
    max: u32,
    next_ticket: u64,
    serving: u64,
}

/// A running call's place, given back when dropped.
struct Place<'a>(&'a Service);

impl Drop for Place<'_> {
    fn drop(&mut self) {
        self.0.running.lock().unwrap().now -= 1;
        self.0.turn.notify_all();
    }
}

/// Run `wisp fn` against the daemon at `socket`.
pub fn run(socket: &Path, cmd: FnCmd) -> Result<u8, String> {
    let FnCmd::Serve { listen, functions, time_limit, mem, max_output, max_running, process_functions } = cmd;
    Client::connect(socket).map_err(|e| format!("cannot reach wispd at {}: {e} (functions run under wispd)", socket.display()))?;
    let svc = Arc::new(Service {
        socket: socket.to_path_buf(),
        functions: Mutex::new(HashMap::new()),
        defaults: Defaults { time_limit, mem, max_output },
        open: AtomicUsize::new(0),
        running: Mutex::new(Running { max: max_running, ..Running::default() }),
        turn: std::sync::Condvar::new(),
    });
    for f in functions {
        let (name, image) = f.split_once('=').ok_or_else(|| format!("--fn {f}: expected NAME=IMAGE"))?;
        let image = if image.ends_with(".so") { std::path::absolute(image).map_err(|e| e.to_string())?.display().to_string() } else { crate::remote::image_ref(image)? };
        svc.register(name, Function { image, ..Function::default() }).map_err(|e| format!("--fn {f}: {}", e.message))?;
    }
    for f in process_functions {
        let (name, path) = f.split_once('=').ok_or_else(|| format!("--process-fn {f}: expected NAME=PATH"))?;
        let path = std::fs::canonicalize(path).map_err(|e| format!("--process-fn {f}: {e}"))?.display().to_string();
        svc.register(name, Function { image: path, ..Function::default() }).map_err(|e| format!("--process-fn {f}: {}", e.message))?;
        if let Some(f) = svc.functions.lock().unwrap().get_mut(name) {
            f.process = true;
        }
    }
    let listener = TcpListener::bind(listen).map_err(|e| format!("cannot listen on {listen}: {e}"))?;
    eprintln!("wisp fn: serving on {}", listener.local_addr().map_err(|e| e.to_string())?);
    for conn in listener.incoming() {
        let Ok(mut conn) = conn else { continue };
        if svc.open.fetch_add(1, Ordering::AcqRel) >= MAX_CONNECTIONS {
            svc.open.fetch_sub(1, Ordering::AcqRel);
            let _ = http::write_error(&mut conn, 503, "too many connections", false);
            continue;
        }
        let svc = svc.clone();
        let _ = std::thread::Builder::new().name("fn".into()).spawn(move || {
            svc.connection(conn);
            svc.open.fetch_sub(1, Ordering::AcqRel);
        });
    }
    Ok(0)
}

/// A call's answer: status, content type, body and extra headers.
struct Answer {
    status: u16,
    body: Vec<u8>,
    json: bool,
    headers: Vec<(&'static str, String)>,
    /// A call's VM, removed once the answer is written.
    after: Option<String>,
}

impl Answer {
    fn error(status: u16, message: impl Into<String>) -> Answer {
        let body = serde_json::to_vec(&serde_json::json!({ "error": message.into() })).unwrap_or_default();
        Answer { status, body, json: true, headers: Vec::new(), after: None }
    }

    fn text(status: u16, body: Vec<u8>) -> Answer {
        Answer { status, body, json: false, headers: Vec::new(), after: None }
    }

    fn json<T: Serialize>(status: u16, v: &T) -> Answer {
        Answer { status, body: serde_json::to_vec(v).unwrap_or_default(), json: true, headers: Vec::new(), after: None }
    }
}

impl From<HttpError> for Answer {
    fn from(e: HttpError) -> Answer {
        Answer::error(e.status, e.message)
    }
}

impl Service {
    fn connection(&self, conn: TcpStream) {
        let Ok(mut w) = conn.try_clone() else { return };
        let mut r = BufReader::new(conn);
        loop {
            let req = match http::read_request(&mut r) {
                Ok(Some(req)) => req,
                Ok(None) => return,
                Err(e) => {
                    let _ = http::write_error(&mut w, e.status, &e.message, false);
                    return;
                }
            };
            let keep = req.keep_alive();
            let a = if req.body.len() > MAX_BODY { Answer::error(413, format!("a request body is at most {MAX_BODY} bytes")) } else { self.route(&req) };
            let extra: Vec<(&str, &str)> = a.headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
            let ctype = if a.json { "application/json" } else { "text/plain; charset=utf-8" };
            let ok = http::write_response_with(&mut w, a.status, ctype, &extra, &a.body, keep).is_ok();
            // The call's VM goes after its answer: no caller waits for that.
            if let Some(vm) = &a.after {
                self.remove_vm(vm);
            }
            if !ok || !keep {
                return;
            }
        }
    }

    fn route(&self, req: &Request) -> Answer {
        let parts: Vec<&str> = req.path.trim_matches('/').split('/').collect();
        match (req.method.as_str(), parts.as_slice()) {
            ("GET", ["functions"]) => Answer::json(200, &*self.functions.lock().unwrap()),
            ("PUT", ["functions", name]) => match req.json::<Function>().map_err(Answer::from).and_then(|f| self.register(name, f).map_err(Answer::from)) {
                Ok(f) => Answer::json(201, &f),
                Err(a) => a,
            },
            ("DELETE", ["functions", name]) => match self.functions.lock().unwrap().remove(*name) {
                Some(f) => {
                    if let Some(ep) = &f.endpoint {
                        self.remove_endpoint(ep);
                    }
                    Answer::text(204, Vec::new())
                }
                None => Answer::error(404, format!("no such function: {name}")),
            },
            ("POST", ["functions", name]) => {
                let call = if req.body.iter().all(u8::is_ascii_whitespace) { Ok(Call::default()) } else { req.json::<Call>() };
                match call {
                    Ok(call) => self.call(name, call),
                    Err(e) => e.into(),
                }
            }
            (_, ["functions"] | ["functions", _]) => Answer::error(405, format!("method {} not allowed on {}", req.method, req.path)),
            _ => Answer::error(404, format!("no such endpoint: {}", req.path)),
        }
    }

    /// Register (or replace) function `name`: checked, and a library's
    /// recycler endpoint made.
    fn register(&self, name: &str, mut f: Function) -> Result<Function, HttpError> {
        let bad = |m: String| HttpError::new(400, m);
        if name.is_empty() || name.len() > 64 || !name.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) {
            return Err(bad(format!("function name '{name}': use 1-64 of [A-Za-z0-9_.-]")));
        }
        if f.image.is_empty() || f.image.contains('\0') {
            return Err(bad("image: a bundled app's name, an image path or a library path is needed".into()));
        }
        if f.time_limit_ms == Some(0) || f.mem == Some(0) || f.max_output == Some(0) {
            return Err(bad("time_limit_ms, mem and max_output must be above 0".into()));
        }
        f.endpoint = None;
        f.process = false;
        if f.image.ends_with(".so") {
            if !f.image.starts_with('/') {
                return Err(bad(format!("library '{}': an absolute path is needed", f.image)));
            }
            let mut c = self.daemon()?;
            let r = c.add_recycler(&wisp_api::AddRecycler { lib: f.image.clone(), mem: Some(f.mem.unwrap_or(self.defaults.mem)), tenant: None }).map_err(api_error)?;
            f.endpoint = Some(r.socket);
        }
        if let Some(old) = self.functions.lock().unwrap().insert(name.to_string(), f.clone()) {
            if let Some(ep) = &old.endpoint {
                self.remove_endpoint(ep);
            }
        }
        Ok(f)
    }

    fn remove_endpoint(&self, socket: &str) {
        let Ok(mut c) = self.daemon() else { return };
        if let Some(r) = c.recyclers().ok().and_then(|l| l.into_iter().find(|r| r.socket == socket)) {
            let _ = c.remove_recycler(&r.id);
        }
    }

    fn daemon(&self) -> Result<Client, HttpError> {
        Client::connect(&self.socket).map_err(|e| HttpError::new(503, format!("wispd: {e}")))
    }

    /// A place among the calls running, once it is this call's turn (first
    /// come, first served).
    fn place(&self) -> Place<'_> {
        let mut r = self.running.lock().unwrap();
        let ticket = r.next_ticket;
        r.next_ticket += 1;
        while r.serving != ticket || r.now >= r.max {
            r = self.turn.wait(r).unwrap();
        }
        r.serving += 1;
        r.now += 1;
        drop(r);
        self.turn.notify_all();
        Place(self)
    }

    /// Call function `name` with `call`'s arguments.
    fn call(&self, name: &str, call: Call) -> Answer {
        let Some(f) = self.functions.lock().unwrap().get(name).cloned() else {
            return Answer::error(404, format!("no such function: {name}"));
        };
        let limits = Limits {
            time: f.time_limit_ms.map_or(self.defaults.time_limit, Duration::from_millis),
            mem: f.mem.unwrap_or(self.defaults.mem),
            output: f.max_output.unwrap_or(self.defaults.max_output),
        };
        let args: Vec<String> = f.args.iter().cloned().chain(call.args).collect();
        let t = Instant::now();
        let place = self.place();
        let done = match &f.endpoint {
            Some(ep) => run_recycled(ep, &args, &limits),
            None if f.process => run_process(&f.image, &args, &limits),
            None => self.run_fresh(&f.image, &args, &limits),
        };
        drop(place);
        let (mut a, vm) = match done {
            Ok(mut ran) => {
                let vm = ran.vm.take();
                (ran.answer(&limits), vm)
            }
            Err(a) => (a, None),
        };
        a.headers.push(("X-Wisp-Call-Us", t.elapsed().as_micros().to_string()));
        a.after = vm;
        a
    }

    /// A call on a fresh VM of `image`, removed after.
    fn run_fresh(&self, image: &str, args: &[String], limits: &Limits) -> Result<Ran, Answer> {
        let mut c = self.daemon()?;
        let req = CreateVm {
            image: image.to_string(),
            args: args.to_vec(),
            mem: Some(limits.mem),
            timeout_ms: Some(limits.time.as_millis() as u64),
            ..CreateVm::default()
        };
        let mut out = Vec::new();
        let mut over = false;
        let id = c.create_attached_with(&req, &mut |_| {}, &mut |d| collect(&mut out, &mut over, d, limits.output)).map_err(api_error)?;
        // The exit status ends the console's response; else it is waited
        // for (on a new connection: the attached one ended with the console).
        let told = c.attached_exit().filter(|_| !over);
        let mut c = self.daemon()?;
        if over {
            let _ = c.kill(&id);
        }
        let exit = match told {
            Some(x) => x,
            None => c.wait(&id).map_err(api_error)?,
        };
        let oom = exit.code == OOM_CODE && stderr_says_oom(&mut c, &id);
        Ok(Ran { code: exit.code, reason: exit.reason, out, over, oom, vm: Some(id) })
    }

    /// Remove a call's VM (after its answer went).
    fn remove_vm(&self, id: &str) {
        if let Ok(mut c) = self.daemon() {
            let _ = c.remove(id, true);
        }
    }
}

/// The exit status of a guest that panicked (an allocation that failed is
/// one: told apart by its message on standard error).
const OOM_CODE: i32 = 101;
/// The time limit's exit status (`wisp run --timeout`).
const TIMEOUT_CODE: i32 = 124;

struct Limits {
    time: Duration,
    mem: u64,
    output: u64,
}

/// What a call did.
struct Ran {
    code: i32,
    reason: String,
    out: Vec<u8>,
    over: bool,
    oom: bool,
    /// The VM to remove once the answer went (a fresh one's).
    vm: Option<String>,
}

impl Ran {
    fn answer(self, limits: &Limits) -> Answer {
        let exit = ("X-Wisp-Exit", self.code.to_string());
        let mut a = if self.over {
            Answer::error(502, format!("the call printed more than its output limit of {} bytes: stopped", limits.output))
        } else if self.code == TIMEOUT_CODE {
            Answer::error(504, format!("the call ran past its time limit of {} ms: stopped", limits.time.as_millis()))
        } else if self.oom {
            Answer::error(507, format!("the call ran out of its memory ({} MiB)", limits.mem >> 20))
        } else if self.code == 0 {
            Answer::text(200, self.out)
        } else {
            let mut a = Answer::text(500, self.out);
            if self.reason != "exited" {
                a.headers.push(("X-Wisp-Exit-Reason", self.reason.replace(['\r', '\n'], " ")));
            }
            a
        };
        a.headers.push(exit);
        a
    }
}

/// Keep `d` in `out` up to `limit` bytes; past it, note it and stop reading.
fn collect(out: &mut Vec<u8>, over: &mut bool, d: &[u8], limit: u64) -> bool {
    if out.len() as u64 + d.len() as u64 > limit {
        *over = true;
        return false;
    }
    out.extend_from_slice(d);
    true
}

/// Whether VM `id`'s standard error says an allocation failed.
fn stderr_says_oom(c: &mut Client, id: &str) -> bool {
    let mut err = Vec::new();
    let _ = c.logs_stderr(id, false, &mut |d| {
        err.extend_from_slice(d);
        err.len() < 64 << 10
    });
    String::from_utf8_lossy(&err).contains("memory allocation of")
}

/// A call at a library's recycler endpoint `socket` (answered by the
/// recycling group: the console as chunks, the exit in a trailer).
fn run_recycled(socket: &str, args: &[String], limits: &Limits) -> Result<Ran, Answer> {
    let unreachable = |e: std::io::Error| Answer::error(503, format!("the function's recycler endpoint: {e}"));
    let mut c = HttpClient::connect(Path::new(socket)).map_err(unreachable)?;
    let body = serde_json::to_vec(&serde_json::json!({ "args": args, "timeout_ms": limits.time.as_millis() as u64 })).unwrap_or_default();
    let mut out = Vec::new();
    let mut over = false;
    let status = c.stream("POST", "/v1/vms?attach=true", Some(&body), &mut |d| collect(&mut out, &mut over, d, limits.output));
    if over {
        return Ok(Ran { code: 0, reason: "exited".into(), out, over, oom: false, vm: None });
    }
    let status = status.map_err(unreachable)?;
    if status != 201 {
        let why = c.take_error().map(|r| r.error_message()).unwrap_or_default();
        return Err(Answer::error(502, format!("the function's recycler refused the call: {status} {why}")));
    }
    let wisp_api::ExitInfo { code, reason } = c.exit_trailer().ok_or_else(|| Answer::error(502, "the call's exit status did not come"))?;
    // (A recycler's standard error is not kept: a panic in it is a panic.)
    let oom = code == OOM_CODE && reason.contains("memory allocation");
    Ok(Ran { code, reason, out, over, oom, vm: None })
}

/// A call as a fresh host process of `path` (`--process-fn`): its standard
/// output read up to the limit, killed at the time limit or past it.
fn run_process(path: &str, args: &[String], limits: &Limits) -> Result<Ran, Answer> {
    use std::process::{Command, Stdio};
    let mut child = Command::new(path)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| Answer::error(502, format!("{path}: {e}")))?;
    let mut stdout = child.stdout.take().expect("piped");
    let limit = limits.output;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let (mut out, mut over, mut buf) = (Vec::new(), false, [0u8; 16384]);
        while let Ok(n @ 1..) = std::io::Read::read(&mut stdout, &mut buf) {
            if !collect(&mut out, &mut over, &buf[..n], limit) {
                break;
            }
        }
        let _ = tx.send((out, over));
    });
    let (out, over, timed_out) = match rx.recv_timeout(limits.time) {
        Ok((out, over)) => (out, over, false),
        Err(_) => (Vec::new(), false, true),
    };
    if over || timed_out {
        let _ = child.kill();
    }
    let status = child.wait().map_err(|e| Answer::error(502, format!("{path}: {e}")))?;
    let code = if timed_out { TIMEOUT_CODE } else { status.code().unwrap_or(128 + std::os::unix::process::ExitStatusExt::signal(&status).unwrap_or(0)) };
    Ok(Ran { code, reason: "exited".into(), out, over, oom: false, vm: None })
}

fn api_error(e: ApiError) -> HttpError {
    match e {
        ApiError::Status(s, m) if (400..500).contains(&s) => HttpError::new(s, m),
        e => HttpError::new(502, format!("wispd: {e}")),
    }
}
