//! The REST API (see `docs/api.yaml`): HTTP/1.1 on a Unix socket, one thread
//! per connection, JSON bodies. Every bad request gets a 4xx with a message.

use std::io::{BufReader, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::Arc;
use std::time::Duration;

use wisp_api::http::{self, HttpError, Request};
use wisp_api::{CreateVm, PoolInfo, PoolTarget, StopVm, Version};

use crate::daemon::{ApiError, Daemon};

/// Serve the API on `listener` forever.
pub fn serve(daemon: Arc<Daemon>, listener: UnixListener) {
    for conn in listener.incoming() {
        let Ok(conn) = conn else { continue };
        let d = daemon.clone();
        let _ = std::thread::Builder::new().name("api".into()).spawn(move || connection(d, conn));
    }
}

fn connection(d: Arc<Daemon>, conn: UnixStream) {
    let Ok(read_half) = conn.try_clone() else { return };
    let mut r = BufReader::new(read_half);
    let mut w = conn;
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
        match route(&d, &req, &mut w, keep) {
            Ok(true) => {}
            Ok(false) => return, // streamed: connection used up
            Err(e) => {
                if http::write_error(&mut w, e.status, &e.message, keep).is_err() {
                    return;
                }
            }
        }
        if !keep {
            return;
        }
    }
}

impl From<HttpError> for ApiError {
    fn from(e: HttpError) -> ApiError {
        ApiError { status: e.status, message: e.message }
    }
}

fn io_err(e: std::io::Error) -> ApiError {
    ApiError { status: 500, message: e.to_string() }
}

fn bad(status: u16, msg: impl Into<String>) -> ApiError {
    ApiError { status, message: msg.into() }
}

fn flag(req: &Request, name: &str) -> Result<bool, ApiError> {
    match req.query_param(name) {
        None | Some("false") | Some("0") => Ok(false),
        Some("true") | Some("1") | Some("") => Ok(true),
        Some(v) => Err(bad(400, format!("query parameter {name}={v}: expected true or false"))),
    }
}

/// Handle one request. Ok(true): answered, connection reusable; Ok(false):
/// answered with a stream that ended the connection.
fn route(d: &Arc<Daemon>, req: &Request, w: &mut UnixStream, keep: bool) -> Result<bool, ApiError> {
    let path = req.path.strip_prefix(wisp_api::API_PREFIX).ok_or_else(|| bad(404, format!("no such endpoint: {}", req.path)))?;
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let m = req.method.as_str();
    let json = |w: &mut UnixStream, status: u16, v: &dyn erased::Ser| -> Result<bool, ApiError> {
        http::write_response(w, status, "application/json", &v.to_json(), keep).map_err(io_err)?;
        Ok(true)
    };
    match (m, parts.as_slice()) {
        ("GET", ["version"]) => json(w, 200, &Version { version: env!("CARGO_PKG_VERSION").into(), abi: wisp_abi::ABI_VERSION }),
        ("GET", ["vms"]) => json(w, 200, &d.list()),
        ("POST", ["vms"]) if flag(req, "attach")? => {
            // Create and stream the console in one response; the VM's id is
            // in the X-Wisp-Vm-Id header.
            let body: CreateVm = req.json()?;
            let (vm, mut stream) = d.create_attached(body)?;
            http::start_chunked_with(w, 201, "application/octet-stream", &[("X-Wisp-Vm-Id", &vm.id)]).map_err(io_err)?;
            let mut buf = [0u8; 16384];
            loop {
                match std::io::Read::read(&mut stream, &mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if http::write_chunk(w, &buf[..n]).is_err() {
                            return Ok(false);
                        }
                    }
                }
            }
            http::end_chunked(w).map_err(io_err)?;
            Ok(keep)
        }
        ("POST", ["vms"]) => {
            let body: CreateVm = req.json()?;
            json(w, 201, &d.create(body)?)
        }
        ("GET", ["vms", id]) => json(w, 200, &d.get(id)?),
        ("DELETE", ["vms", id]) => {
            d.remove(id, flag(req, "force")?)?;
            http::write_response(w, 204, "application/json", b"", keep).map_err(io_err)?;
            Ok(true)
        }
        ("POST", ["vms", id, "pause"]) => json(w, 200, &d.pause(id, true)?),
        ("POST", ["vms", id, "resume"]) => json(w, 200, &d.pause(id, false)?),
        ("POST", ["vms", id, "kill"]) => json(w, 200, &d.kill(id)?),
        ("POST", ["vms", id, "stop"]) => {
            let body: StopVm = if req.body.is_empty() { StopVm::default() } else { req.json()? };
            let grace = Duration::from_millis(body.grace_ms.unwrap_or(2000).min(600_000));
            json(w, 200, &d.stop(id, grace)?)
        }
        ("GET", ["vms", id, "wait"]) => json(w, 200, &d.wait(id, None)?),
        ("GET", ["vms", id, "logs"]) => {
            let follow = flag(req, "follow")?;
            d.get(id)?; // 404 before the stream starts
            http::start_chunked(w, 200, "application/octet-stream").map_err(io_err)?;
            let mut ok = true;
            d.logs(id, follow, &mut |data| {
                ok = http::write_chunk(w, data).is_ok();
                ok
            })?;
            if ok {
                http::end_chunked(w).map_err(io_err)?;
            }
            let _ = w.flush();
            Ok(ok && keep)
        }
        ("GET", ["pool"]) => json(w, 200, &pool_info(d)),
        ("PUT", ["pool"]) => {
            let body: PoolInfo = req.json()?;
            for t in &body.target {
                let mem = wisp_vmm::check_mem_size(t.mem).map_err(|e| bad(400, e.to_string()))?;
                if t.count > 10_000 {
                    return Err(bad(400, format!("pool of {} shells is too large (at most 10000)", t.count)));
                }
                d.pool.set_target(mem, t.count);
            }
            json(w, 200, &pool_info(d))
        }
        (_, ["version"] | ["vms"] | ["vms", _] | ["vms", _, _] | ["pool"]) => {
            Err(bad(405, format!("method {m} not allowed on {}", req.path)))
        }
        _ => Err(bad(404, format!("no such endpoint: {}", req.path))),
    }
}

fn pool_info(d: &Daemon) -> PoolInfo {
    let conv = |v: Vec<(u64, u32)>| v.into_iter().map(|(mem, count)| PoolTarget { mem, count }).collect();
    PoolInfo { target: conv(d.pool.targets()), ready: conv(d.pool.ready()) }
}

mod erased {
    /// Object-safe serialisation for the route table's `json` helper.
    pub trait Ser {
        fn to_json(&self) -> Vec<u8>;
    }
    impl<T: serde::Serialize> Ser for T {
        fn to_json(&self) -> Vec<u8> {
            serde_json::to_vec(self).unwrap_or_default()
        }
    }
}
