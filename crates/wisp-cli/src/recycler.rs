//! `wisp recycler add|ls|rm`: recycler endpoints (`/v1/recyclers`;
//! `docs/libraries.md`, "Recycler endpoints"), and `wisp run --recycle`
//! sent straight to one when the caller has one for the library.

use std::io::Write;
use std::path::{Path, PathBuf};

use clap::Subcommand;
use wisp_api::client::Client;
use wisp_api::http::Client as HttpClient;

use crate::RunArgs;

#[derive(Subcommand)]
pub enum RecyclerCmd {
    /// Keep a recycler of application library APP.so booted at its ready
    /// point, behind a socket of its own; print its id and socket. `wisp
    /// run --recycle APP.so` then goes straight to it.
    Add {
        /// The application library (e.g. build/libs/hello.so).
        lib: PathBuf,
        /// Guest RAM of its recycler, e.g. 16M.
        #[arg(long, value_parser = crate::units::parse_mem)]
        mem: Option<u64>,
        /// Whose recycling group serves it.
        #[arg(long)]
        tenant: Option<String>,
    },
    /// List recycler endpoints.
    Ls,
    /// Remove a recycler endpoint (its recycler goes).
    Rm {
        /// Its id.
        id: String,
    },
}

/// Run a `wisp recycler` command against the daemon at `socket`.
pub fn manage(socket: &Path, cmd: RecyclerCmd) -> Result<u8, String> {
    let mut c = Client::connect(socket).map_err(|e| format!("cannot reach wispd at {}: {e} (recycler endpoints are wispd's)", socket.display()))?;
    let err = |e: wisp_api::client::ApiError| e.to_string();
    match cmd {
        RecyclerCmd::Add { lib, mem, tenant } => {
            let lib = std::path::absolute(&lib).map_err(|e| format!("{}: {e}", lib.display()))?.display().to_string();
            let r = c.add_recycler(&wisp_api::AddRecycler { lib, mem, tenant }).map_err(err)?;
            println!("{} {}", r.id, r.socket);
        }
        RecyclerCmd::Ls => {
            let list = c.recyclers().map_err(err)?;
            println!("{:<12} {:<10} {:>6} {:<12} SOCKET", "ID", "APP", "MEM", "GROUP");
            for r in list {
                println!("{:<12} {:<10} {:>5}M {:<12} {}", r.id, r.app, r.mem >> 20, r.group, r.socket);
            }
        }
        RecyclerCmd::Rm { id } => c.remove_recycler(&id).map_err(err)?,
    }
    Ok(0)
}

/// The socket of the caller's endpoint for `lib` (an absolute path), if
/// the daemon has one and the run asks for nothing but arguments and a
/// time limit.
pub fn endpoint_for(c: &mut Client, a: &RunArgs, lib: &str) -> Option<String> {
    let plain = !a.detach && a.name.is_none() && a.count.is_none() && a.mem.is_none() && a.tenant.is_none() && !a.interactive && a.env.is_empty() && a.env_file.is_empty() && a.files.is_empty() && a.libs.len() == 1;
    if !plain {
        return None;
    }
    // SAFETY: geteuid(2) has no preconditions and cannot fail.
    let uid = unsafe { libc::geteuid() };
    c.recyclers().ok()?.into_iter().find(|r| r.lib == lib && r.uid == uid).map(|r| r.socket)
}

/// Run at endpoint `socket` with `args`: its console to stdout, its exit
/// status (the response's `X-Wisp-Exit` trailer) returned.
pub fn run_at(socket: &str, args: &[String], timeout: Option<std::time::Duration>) -> Result<u8, String> {
    let mut c = HttpClient::connect(Path::new(socket)).map_err(|e| format!("recycler endpoint {socket}: {e}"))?;
    let body = serde_json::json!({ "args": args, "timeout_ms": timeout.map(|t| t.as_millis() as u64) });
    let body = serde_json::to_vec(&body).map_err(|e| e.to_string())?;
    let mut out = std::io::stdout().lock();
    let status = c
        .stream("POST", "/v1/vms?attach=true", Some(&body), &mut |d| out.write_all(d).and_then(|_| out.flush()).is_ok())
        .map_err(|e| format!("recycler endpoint {socket}: {e}"))?;
    if status != 201 {
        let why = c.take_error().map(|r| r.error_message()).unwrap_or_default();
        return Err(format!("recycler endpoint {socket}: {status} {why}"));
    }
    let code = c.last_header("x-wisp-exit").and_then(|v| v.parse::<i32>().ok()).ok_or_else(|| format!("recycler endpoint {socket}: the run's exit status did not come"))?;
    if let Some(reason) = c.last_header("x-wisp-exit-reason").filter(|r| *r != "exited") {
        eprintln!("wisp: {reason}");
    }
    Ok(code as u8)
}
