//! A typed client for the wispd API, used by the `wisp` command, tests and
//! benchmarks.

use std::io;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;

use crate::action::Action;
use crate::http;
use crate::{CreateVm, ExitInfo, PoolInfo, RemoveVms, RemovedVms, Version, VmInfo, VM_ID_HEADER};

/// An API error: the daemon's status and message, or a transport failure.
#[derive(Debug)]
pub enum ApiError {
    /// The daemon answered with an error status.
    Status(u16, String),
    /// The daemon could not be reached or answered garbage.
    Io(io::Error),
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ApiError::Status(s, m) => write!(f, "{m} ({s})"),
            ApiError::Io(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for ApiError {}

impl From<io::Error> for ApiError {
    fn from(e: io::Error) -> Self {
        ApiError::Io(e)
    }
}

/// Result of an API call.
pub type Result<T> = std::result::Result<T, ApiError>;

/// A connection to wispd. Every call is an [`Action`], turned into its
/// HTTP request by [`Action::to_request`]; the named methods are shorthands.
pub struct Client {
    http: http::Client,
    socket: PathBuf,
}

impl Client {
    /// Connect to the daemon at `socket`.
    pub fn connect(socket: &Path) -> io::Result<Client> {
        Ok(Client { http: http::Client::connect(socket)?, socket: socket.to_path_buf() })
    }

    /// The socket this client talks to.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Perform an action that answers with one JSON value (or none: `()`).
    pub fn call<T: DeserializeOwned>(&mut self, action: &Action) -> Result<T> {
        let c = action.to_request();
        let r = self.http.request(c.method, &c.target, c.body.as_deref())?;
        if !(200..300).contains(&r.status) {
            return Err(ApiError::Status(r.status, r.error_message()));
        }
        if r.body.is_empty() {
            return serde_json::from_slice(b"null").map_err(|e| ApiError::Io(io::Error::other(e)));
        }
        r.json().map_err(|e| ApiError::Io(io::Error::new(io::ErrorKind::InvalidData, e.message)))
    }

    /// Perform an action whose answer is a stream (see [`Action::streams`]),
    /// delivering it as it comes; `on_data` returns false to stop.
    pub fn call_streaming(&mut self, action: &Action, on_data: &mut dyn FnMut(&[u8]) -> bool) -> Result<()> {
        let c = action.to_request();
        let status = self.http.stream(c.method, &c.target, c.body.as_deref(), on_data)?;
        if !(200..300).contains(&status) {
            let msg = self.http.take_error().map(|r| r.error_message()).unwrap_or_default();
            return Err(ApiError::Status(status, msg));
        }
        Ok(())
    }

    /// `GET /v1/version`.
    pub fn version(&mut self) -> Result<Version> {
        self.call(&Action::Version)
    }

    /// `POST /v1/vms`.
    pub fn create(&mut self, req: &CreateVm) -> Result<VmInfo> {
        self.call(&Action::CreateVm { vm: req.clone(), attach: false, wait_line: false })
    }

    /// `POST /v1/vms?wait_line=true`: create a VM and answer once its
    /// console has printed its first complete line (`first_line_us` says
    /// when); an error if the VM ends or the daemon's deadline passes first.
    pub fn create_wait_line(&mut self, req: &CreateVm) -> Result<VmInfo> {
        self.call(&Action::CreateVm { vm: req.clone(), attach: false, wait_line: true })
    }

    /// `POST /v1/vms?attach=true`: create a VM and deliver its console
    /// output as it comes, until the VM ends. Returns the VM's id.
    pub fn create_attached(&mut self, req: &CreateVm, on_data: &mut dyn FnMut(&[u8]) -> bool) -> Result<String> {
        self.create_attached_with(req, &mut |_| {}, on_data)
    }

    /// [`Client::create_attached`], with `on_start` called with the VM's id
    /// once the response's head has come (before its console output).
    pub fn create_attached_with(
        &mut self,
        req: &CreateVm,
        on_start: &mut dyn FnMut(&str),
        on_data: &mut dyn FnMut(&[u8]) -> bool,
    ) -> Result<String> {
        let c = Action::CreateVm { vm: req.clone(), attach: true, wait_line: false }.to_request();
        let mut on_head = |headers: &[(String, String)]| {
            if let Some((_, id)) = headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(VM_ID_HEADER)) {
                on_start(id);
            }
        };
        let status = self.http.stream_with_head(c.method, &c.target, c.body.as_deref(), &mut on_head, on_data)?;
        if !(200..300).contains(&status) {
            let msg = self.http.take_error().map(|r| r.error_message()).unwrap_or_default();
            return Err(ApiError::Status(status, msg));
        }
        self.http
            .last_header(VM_ID_HEADER)
            .map(str::to_string)
            .ok_or_else(|| ApiError::Io(io::Error::new(io::ErrorKind::InvalidData, format!("no {VM_ID_HEADER} header"))))
    }

    /// The exit status a [`Client::create_attached_with`]'s response ended
    /// with (its `X-Wisp-Exit` trailer), if it came: the VMM process sends
    /// it unless a slow reader had the console streamed from its ring.
    pub fn attached_exit(&self) -> Option<ExitInfo> {
        self.http.exit_trailer()
    }

    /// `GET /v1/vms`.
    pub fn list(&mut self) -> Result<Vec<VmInfo>> {
        self.call(&Action::ListVms)
    }

    /// `GET /v1/vms/{id}`.
    pub fn get(&mut self, id: &str) -> Result<VmInfo> {
        self.call(&Action::GetVm(id.into()))
    }

    /// `POST /v1/vms/{id}/pause`.
    pub fn pause(&mut self, id: &str) -> Result<VmInfo> {
        self.call(&Action::PauseVm(id.into()))
    }

    /// `POST /v1/vms/{id}/snapshot`: save the VM into `path` (it goes on
    /// unless `stop`).
    pub fn snapshot(&mut self, id: &str, path: &str, stop: bool) -> Result<crate::SnapshotInfo> {
        self.snapshot_with(id, &crate::SnapshotVm { path: path.into(), stop, incremental: false })
    }

    /// `POST /v1/vms/{id}/snapshot` with every option.
    pub fn snapshot_with(&mut self, id: &str, body: &crate::SnapshotVm) -> Result<crate::SnapshotInfo> {
        self.call(&Action::SnapshotVm { vm: id.into(), body: body.clone() })
    }

    /// `POST /v1/vms/{id}/update`: replace one of VM `id`'s libraries.
    pub fn update_lib(&mut self, id: &str, body: &crate::UpdateLib) -> Result<crate::UpdateInfo> {
        self.call(&Action::UpdateLib { vm: id.into(), body: body.clone() })
    }

    /// `POST /v1/vms/{id}/migrate`: move VM `id` to the daemon at `to`.
    pub fn migrate(&mut self, id: &str, to: &str) -> Result<crate::MigrateInfo> {
        self.call(&Action::MigrateVm { vm: id.into(), body: crate::MigrateVm { to: to.into() } })
    }

    /// `POST /v1/recyclers`: a recycler endpoint for an application library.
    pub fn add_recycler(&mut self, r: &crate::AddRecycler) -> Result<crate::RecyclerInfo> {
        self.call(&Action::AddRecycler(r.clone()))
    }

    /// `GET /v1/recyclers`.
    pub fn recyclers(&mut self) -> Result<Vec<crate::RecyclerInfo>> {
        self.call(&Action::ListRecyclers)
    }

    /// `DELETE /v1/recyclers/{id}`.
    pub fn remove_recycler(&mut self, id: &str) -> Result<()> {
        self.call(&Action::RemoveRecycler(id.into()))
    }

    /// `POST /v1/jit`.
    pub fn add_jit(&mut self, j: &crate::AddJit) -> Result<crate::JitInfo> {
        self.call(&Action::AddJit(j.clone()))
    }

    /// `GET /v1/jit`.
    pub fn jits(&mut self) -> Result<Vec<crate::JitInfo>> {
        self.call(&Action::ListJits)
    }

    /// `DELETE /v1/jit/{id}`.
    pub fn remove_jit(&mut self, id: &str) -> Result<()> {
        self.call(&Action::RemoveJit(id.into()))
    }

    /// `POST /v1/templates`: make a template.
    pub fn make_template(&mut self, t: &crate::CreateTemplate) -> Result<crate::TemplateInfo> {
        self.call(&Action::MakeTemplate(t.clone()))
    }

    /// `GET /v1/templates`.
    pub fn templates(&mut self) -> Result<Vec<crate::TemplateInfo>> {
        self.call(&Action::ListTemplates)
    }

    /// `DELETE /v1/templates/{name}`.
    pub fn remove_template(&mut self, name: &str) -> Result<()> {
        self.call(&Action::RemoveTemplate(name.into()))
    }

    /// `POST /v1/vms/{id}/resume`.
    pub fn resume(&mut self, id: &str) -> Result<VmInfo> {
        self.call(&Action::ResumeVm(id.into()))
    }

    /// `POST /v1/vms/{id}/stop`.
    pub fn stop(&mut self, id: &str, grace_ms: Option<u64>) -> Result<VmInfo> {
        self.call(&Action::StopVm { vm: id.into(), grace_ms })
    }

    /// `POST /v1/vms/{id}/kill`.
    pub fn kill(&mut self, id: &str) -> Result<VmInfo> {
        self.call(&Action::KillVm(id.into()))
    }

    /// `GET /v1/vms/{id}/wait`.
    pub fn wait(&mut self, id: &str) -> Result<ExitInfo> {
        self.call(&Action::WaitVm(id.into()))
    }

    /// `DELETE /v1/vms/{id}`.
    pub fn remove(&mut self, id: &str, force: bool) -> Result<()> {
        self.call(&Action::RemoveVm { vm: id.into(), force, family: false })
    }

    /// `DELETE /v1/vms/{id}?family=true[&force=true]`: VM `id`'s whole family.
    pub fn remove_family(&mut self, id: &str, force: bool) -> Result<()> {
        self.call(&Action::RemoveVm { vm: id.into(), force, family: true })
    }

    /// `POST /v1/vms/remove`: many VMs in one request.
    pub fn remove_many(&mut self, vms: &[String], force: bool) -> Result<RemovedVms> {
        self.call(&Action::RemoveVms(RemoveVms { vms: vms.to_vec(), force }))
    }

    /// `GET /v1/vms/{id}/logs[?follow=true]`, delivering output as it comes.
    pub fn logs(&mut self, id: &str, follow: bool, on_data: &mut dyn FnMut(&[u8]) -> bool) -> Result<()> {
        self.call_streaming(&Action::Logs { vm: id.into(), follow, stderr: false }, on_data)
    }

    /// `GET /v1/vms/{id}/logs?stream=stderr[&follow=true]`: as [`Client::logs`], of standard error.
    pub fn logs_stderr(&mut self, id: &str, follow: bool, on_data: &mut dyn FnMut(&[u8]) -> bool) -> Result<()> {
        self.call_streaming(&Action::Logs { vm: id.into(), follow, stderr: true }, on_data)
    }

    /// `POST /v1/vms/{id}/stdin`: the connection that carries the VM's
    /// standard input (write to it; shut its write side at the end).
    pub fn open_stdin(&mut self, id: &str) -> Result<std::os::unix::net::UnixStream> {
        let c = Action::Stdin(id.into()).to_request();
        match self.http.upgrade(c.method, &c.target)? {
            Ok(conn) => Ok(conn),
            Err(status) => Err(ApiError::Status(status, self.http.take_error().map(|r| r.error_message()).unwrap_or_default())),
        }
    }

    /// `GET /v1/pool`.
    pub fn pool(&mut self) -> Result<PoolInfo> {
        self.call(&Action::GetPool)
    }

    /// `PUT /v1/pool`.
    pub fn set_pool(&mut self, p: &PoolInfo) -> Result<PoolInfo> {
        self.call(&Action::SetPool(p.clone()))
    }

    /// A raw request (tests of malformed input).
    pub fn raw(&mut self, method: &str, path: &str, body: Option<&[u8]>) -> io::Result<http::Response> {
        self.http.request(method, path, body)
    }
}
