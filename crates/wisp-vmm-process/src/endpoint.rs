//! Recycler endpoints (issue 17, recycling's third design;
//! `docs/libraries.md` "Recycler endpoints"): a socket at which the VMM
//! process itself answers runs of one application library, on a recycler
//! it keeps at its ready point — the client's request reaches the process
//! that runs it in one hop, with no daemon on the way.
//!
//! The daemon (`POST /v1/recyclers`) opens and checks the library with
//! the client's rights, binds the endpoint's socket (the client's alone),
//! and sends it to a recycling group with a `serve` request. A thread of
//! the group (started by its main thread) boots the recycler with the
//! library, runs it to its ready point and keeps that point
//! (`wisp_vmm`'s `vm/reuse.rs`), answers the daemon, and serves the socket:
//! each connection carries one `POST /v1/vms?attach=true` whose body gives
//! the run's `args` (and may give `timeout_ms`; `image` and `libs`, if
//! given, must name what the endpoint runs). The run's console goes back
//! as HTTP chunks, standard error with it; its exit status ends the
//! response as the `X-Wisp-Exit` trailer, and the connection closes. The
//! recycler is scrubbed back to its ready point after each run; one the
//! monitor stopped (a fault, the time limit) is replaced by a new one. A
//! run is not a VM of the toolstack: it has no id or record, only its
//! response. The endpoint goes when the daemon closes the `serve`
//! request's connection. Runs at one endpoint take turns; a request is
//! untrusted input (at most 16 KiB of head and 1 MiB of body, read
//! within 10 s).

use std::io::{self, BufReader, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use wisp_api::http::{chunk_frame, chunked_head, read_request_with, write_error};
use wisp_jail::seccomp::Role;
use wisp_vmm::devices::library::LibraryDevice;
use wisp_vmm::{Image, ReuseStop, Vm};

use crate::control::next_pooled;
use crate::exit::{exit_info, Runner};
use crate::hosting::Hosting;
use crate::proto::{send_line, Reply, WorkerState};

/// Longest a recycler takes from its boot to its ready point.
const READY_WITHIN: Duration = Duration::from_secs(10);
/// Longest a client takes to send its request, or to take the answer's
/// bytes.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(10);
/// Stack of an endpoint's thread (as a VM's thread).
const STACK: usize = 256 << 10;
/// Most connections waiting for their request: beyond, the oldest goes
/// (a client of the endpoint's own user cannot run the group out of
/// descriptors).
const MOST_WAITING: usize = 64;

/// An endpoint asked for, with what its recycler is booted from.
pub(crate) struct Endpoint {
    /// The `serve` request's connection: answered once the recycler is
    /// ready; its end ends the endpoint.
    daemon: UnixStream,
    listener: UnixListener,
    image: Image,
    /// The application library: its name and sealed file.
    app: (String, OwnedFd),
}

impl Endpoint {
    /// An endpoint from a `serve` request's descriptors (listener, image,
    /// the one library).
    pub(crate) fn new(daemon: io::Result<UnixStream>, fds: Vec<OwnedFd>, image_name: &str, libs: Vec<String>) -> Result<Endpoint, String> {
        let daemon = daemon.map_err(|e| format!("the request's connection: {e}"))?;
        let [name] = <[String; 1]>::try_from(libs).map_err(|_| "a recycler endpoint runs exactly one application library".to_string())?;
        let [listener, image, lib] = <[OwnedFd; 3]>::try_from(fds).map_err(|f| format!("serve needs 3 descriptors, {} came", f.len()))?;
        let image = Image::from_fd(image_name, image).map_err(|e| e.to_string())?;
        Ok(Endpoint { daemon, listener: UnixListener::from(listener), image, app: (name, lib) })
    }
}

/// Start endpoint `ep`'s thread (from the group's main thread).
pub(crate) fn start(g: Arc<dyn Hosting>, ep: Endpoint) {
    let made = std::thread::Builder::new().name("endpoint".into()).stack_size(STACK).spawn(move || {
        // Making KVM VMs (a recycler again after one was stopped) is
        // within a forking vCPU thread's role.
        crate::narrow::narrow(Role::VcpuFork);
        serve(&*g, ep);
    });
    // Without its thread the endpoint is dropped: the daemon's connection
    // closes, and the daemon says the endpoint failed.
    if let Err(e) = made {
        wisp_vmm::stderr_line(&format!("wisp-vmm group: endpoint thread: {e}"));
    }
}

fn serve(g: &dyn Hosting, ep: Endpoint) {
    let Endpoint { daemon, listener, image, app } = ep;
    let t = Instant::now();
    let mut vm = match ready_recycler(g, &image, &app) {
        Ok(vm) => vm,
        Err(e) => {
            let _ = send_line(&daemon, &Reply::err(e), None);
            return;
        }
    };
    let reply = Reply { boot_us: Some(t.elapsed().as_micros() as u64), ..Reply::ok(WorkerState::Running) };
    if send_line(&daemon, &reply, None).is_err() {
        return;
    }
    let daemon_fd = daemon.as_raw_fd();
    let mut conns = vec![daemon];
    loop {
        let Some(conn) = next_pooled(&listener, &mut conns) else { continue };
        // The daemon closed its connection (or said something): the end.
        if conn.as_raw_fd() == daemon_fd {
            return;
        }
        // (The daemon's connection stays first.)
        while conns.len() > MOST_WAITING + 1 {
            conns.remove(1);
        }
        if !serve_one(&mut vm, &image.name, &app.0, conn) {
            vm = match ready_recycler(g, &image, &app) {
                Ok(vm) => vm,
                Err(e) => {
                    wisp_vmm::stderr_line(&format!("wisp-vmm group: endpoint of {}: a new recycler: {e}: the endpoint ends", app.0));
                    return;
                }
            };
        }
    }
}

/// A recycler of `image` with library `app`, booted on a new shell and
/// kept at its ready point.
fn ready_recycler(g: &dyn Hosting, image: &Image, app: &(String, OwnedFd)) -> Result<Vm, String> {
    let shell = g.fresh_shell().map_err(|e| e.to_string())?;
    let fd = app.1.try_clone().map_err(|e| format!("library {}: {e}", app.0))?;
    let lib = LibraryDevice::from_fd(&app.0, fd).map_err(|e| format!("library {}: {e}", app.0))?;
    let mut vm = crate::recycle::boot_recycler(shell, image, std::slice::from_ref(&app.0), None, vec![lib]).map_err(|e| e.to_string())?;
    let mut console = Vec::<u8>::new();
    let out = vm.run_until_fork(&mut console, Some(Instant::now() + READY_WITHIN));
    if vm.reuse_stop() != Some(ReuseStop::Ready) {
        let said = String::from_utf8_lossy(&console);
        return Err(format!("the recycler did not reach its ready point ({}): {}", out.map_or_else(|| "forked".into(), |o| exit_info(&o, Runner::Daemon).reason), said.trim()));
    }
    vm.keep_ready_point().map_err(|e| format!("keep the ready point: {e}"))?;
    Ok(vm)
}

/// Answer one request on `conn` with a run on `vm` (at its ready point).
/// Returns whether `vm` is at its ready point again (scrubbed).
fn serve_one(vm: &mut Vm, image: &str, app: &str, conn: UnixStream) -> bool {
    // (Its reads end within 10 s already: `accept_timed`.)
    let _ = conn.set_write_timeout(Some(CLIENT_TIMEOUT));
    let refuse = |status: u16, why: &str| {
        let _ = write_error(&mut (&conn), status, why, false);
        true
    };
    let req = match read_request_with(&mut BufReader::new(&conn), &mut (&conn)) {
        Ok(Some(r)) => r,
        Ok(None) => return true,
        Err(e) => return refuse(e.status, &e.message),
    };
    if req.path != "/v1/vms" {
        return refuse(404, &format!("no such endpoint: {} (a recycler endpoint takes POST /v1/vms?attach=true)", req.path));
    }
    if req.method != "POST" {
        return refuse(405, &format!("method {} not allowed on {}", req.method, req.path));
    }
    let body: Run = match serde_json::from_slice(&req.body) {
        Ok(b) => b,
        Err(e) => return refuse(400, &format!("invalid JSON body (a recycler endpoint takes args and timeout_ms): {e}")),
    };
    if let Err(why) = what_it_runs(&body, image, app) {
        return refuse(400, &why);
    }
    let argv: Vec<&str> = [image, app].into_iter().chain(body.args.iter().map(String::as_str)).collect();
    if let Err(e) = vm.set_run_args(&argv) {
        return refuse(400, &e.to_string());
    }
    let head = chunked_head(201, "application/octet-stream", &[("X-Wisp-App", app), ("Connection", "close")]);
    let mut out = RunOut { conn, head, frame: Vec::new(), ok: true, wrote: false };
    let deadline = body.timeout_ms.map(|ms| Instant::now() + Duration::from_millis(ms));
    let outcome = vm.run_until_fork(&mut out, deadline);
    let exit = match (vm.reuse_stop(), outcome) {
        (Some(ReuseStop::Ended(code)), _) => exit_info(&wisp_vmm::Outcome::Exited(code), Runner::Daemon),
        (_, Some(o)) => exit_info(&o, Runner::Daemon),
        (_, None) => wisp_api::ExitInfo { code: crate::exit::ERROR.into(), reason: "the recycler forked".into() },
    };
    out.finish(&exit);
    matches!(vm.reuse_stop(), Some(ReuseStop::Ended(_))) && vm.scrub().is_ok()
}

/// A run's body: a create's (`wisp_api::CreateVm`) as far as an endpoint
/// takes it — its arguments and time limit; `image`, `libs` and `recycle`
/// may be there, and must name what the endpoint runs.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Run {
    #[serde(default)]
    image: Option<String>,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    libs: Vec<String>,
    #[serde(default)]
    timeout_ms: Option<u64>,
    #[serde(default)]
    #[allow(dead_code)]
    recycle: bool,
}

fn what_it_runs(b: &Run, image: &str, app: &str) -> Result<(), String> {
    if b.image.as_deref().is_some_and(|i| i != image) {
        return Err(format!("this endpoint runs {app} on the {image} image, not {}", b.image.as_deref().unwrap_or_default()));
    }
    let stem = |p: &String| std::path::Path::new(p).file_stem().and_then(|s| s.to_str()).map(str::to_string);
    if b.libs.len() > 1 || b.libs.iter().any(|l| stem(l).as_deref() != Some(app)) {
        return Err(format!("this endpoint runs {app}.so only"));
    }
    Ok(())
}

/// A run's console: HTTP chunks on the client's connection, the response
/// head with the first; a client that stops taking them loses the rest,
/// not the guest its time.
struct RunOut {
    conn: UnixStream,
    head: Vec<u8>,
    frame: Vec<u8>,
    ok: bool,
    wrote: bool,
}

impl RunOut {
    /// End the response: the head if nothing was written, the last chunk
    /// with the exit status as a trailer.
    fn finish(mut self, exit: &wisp_api::ExitInfo) {
        let mut end = std::mem::take(&mut self.head);
        end.extend_from_slice(&wisp_api::http::exit_trailer(exit.code, &exit.reason));
        if self.ok {
            let _ = (&self.conn).write_all(&end);
        }
    }
}

impl Write for RunOut {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        if !self.ok || data.is_empty() {
            return Ok(data.len());
        }
        chunk_frame(data, &mut self.frame);
        if !self.wrote {
            self.frame.splice(0..0, std::mem::take(&mut self.head));
        }
        self.ok = (&self.conn).write_all(&self.frame).is_ok();
        // The reader of the first output waits for it, and the scheduler
        // may queue it behind this thread (the guest runs on): let it run.
        if !std::mem::replace(&mut self.wrote, true) {
            std::thread::yield_now();
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl wisp_vmm::Console for RunOut {
    fn write_err(&mut self, data: &[u8]) -> io::Result<()> {
        self.write(data).map(drop)
    }
}
