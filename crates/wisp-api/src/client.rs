//! A typed client for the wispd API, used by the `wisp` command, tests and
//! benchmarks.

use std::io;
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;

use crate::http::{self, percent_encode};
use crate::{CreateVm, ExitInfo, PoolInfo, StopVm, Version, VmInfo, API_PREFIX};

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

/// A connection to wispd.
pub struct Client {
    http: http::Client,
    socket: PathBuf,
}

fn vm_path(id: &str, rest: &str) -> String {
    format!("{API_PREFIX}/vms/{}{rest}", percent_encode(id))
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

    fn call<T: DeserializeOwned>(&mut self, method: &str, path: &str, body: Option<Vec<u8>>) -> Result<T> {
        let r = self.http.request(method, path, body.as_deref())?;
        if !(200..300).contains(&r.status) {
            return Err(ApiError::Status(r.status, r.error_message()));
        }
        if r.body.is_empty() {
            return serde_json::from_slice(b"null").map_err(|e| ApiError::Io(io::Error::other(e)));
        }
        r.json().map_err(|e| ApiError::Io(io::Error::new(io::ErrorKind::InvalidData, e.message)))
    }

    /// `GET /v1/version`.
    pub fn version(&mut self) -> Result<Version> {
        self.call("GET", &format!("{API_PREFIX}/version"), None)
    }

    /// `POST /v1/vms`.
    pub fn create(&mut self, req: &CreateVm) -> Result<VmInfo> {
        self.call("POST", &format!("{API_PREFIX}/vms"), Some(serde_json::to_vec(req).unwrap_or_default()))
    }

    /// `POST /v1/vms?attach=true`: create a VM and deliver its console
    /// output as it comes, until the VM ends. Returns the VM's id.
    pub fn create_attached(&mut self, req: &CreateVm, on_data: &mut dyn FnMut(&[u8]) -> bool) -> Result<String> {
        let body = serde_json::to_vec(req).unwrap_or_default();
        let status = self.http.stream("POST", &format!("{API_PREFIX}/vms?attach=true"), Some(&body), on_data)?;
        if !(200..300).contains(&status) {
            let msg = self.http.take_error().map(|r| r.error_message()).unwrap_or_default();
            return Err(ApiError::Status(status, msg));
        }
        self.http
            .last_header("x-wisp-vm-id")
            .map(str::to_string)
            .ok_or_else(|| ApiError::Io(io::Error::new(io::ErrorKind::InvalidData, "no X-Wisp-Vm-Id header")))
    }

    /// `GET /v1/vms`.
    pub fn list(&mut self) -> Result<Vec<VmInfo>> {
        self.call("GET", &format!("{API_PREFIX}/vms"), None)
    }

    /// `GET /v1/vms/{id}`.
    pub fn get(&mut self, id: &str) -> Result<VmInfo> {
        self.call("GET", &vm_path(id, ""), None)
    }

    /// `POST /v1/vms/{id}/pause`.
    pub fn pause(&mut self, id: &str) -> Result<VmInfo> {
        self.call("POST", &vm_path(id, "/pause"), None)
    }

    /// `POST /v1/vms/{id}/resume`.
    pub fn resume(&mut self, id: &str) -> Result<VmInfo> {
        self.call("POST", &vm_path(id, "/resume"), None)
    }

    /// `POST /v1/vms/{id}/stop`.
    pub fn stop(&mut self, id: &str, grace_ms: Option<u64>) -> Result<VmInfo> {
        let body = serde_json::to_vec(&StopVm { grace_ms }).unwrap_or_default();
        self.call("POST", &vm_path(id, "/stop"), Some(body))
    }

    /// `POST /v1/vms/{id}/kill`.
    pub fn kill(&mut self, id: &str) -> Result<VmInfo> {
        self.call("POST", &vm_path(id, "/kill"), None)
    }

    /// `GET /v1/vms/{id}/wait`.
    pub fn wait(&mut self, id: &str) -> Result<ExitInfo> {
        self.call("GET", &vm_path(id, "/wait"), None)
    }

    /// `DELETE /v1/vms/{id}`.
    pub fn remove(&mut self, id: &str, force: bool) -> Result<()> {
        let q = if force { "?force=true" } else { "" };
        let r = self.http.request("DELETE", &vm_path(id, q), None)?;
        if !(200..300).contains(&r.status) {
            return Err(ApiError::Status(r.status, r.error_message()));
        }
        Ok(())
    }

    /// `GET /v1/vms/{id}/logs[?follow=true]`, delivering output as it comes.
    pub fn logs(&mut self, id: &str, follow: bool, on_data: &mut dyn FnMut(&[u8]) -> bool) -> Result<()> {
        let q = if follow { "/logs?follow=true" } else { "/logs" };
        let status = self.http.stream("GET", &vm_path(id, q), None, on_data)?;
        if !(200..300).contains(&status) {
            let msg = self.http.take_error().map(|r| r.error_message()).unwrap_or_default();
            return Err(ApiError::Status(status, msg));
        }
        Ok(())
    }

    /// `GET /v1/pool`.
    pub fn pool(&mut self) -> Result<PoolInfo> {
        self.call("GET", &format!("{API_PREFIX}/pool"), None)
    }

    /// `PUT /v1/pool`.
    pub fn set_pool(&mut self, p: &PoolInfo) -> Result<PoolInfo> {
        self.call("PUT", &format!("{API_PREFIX}/pool"), Some(serde_json::to_vec(p).unwrap_or_default()))
    }

    /// A raw request (tests of malformed input).
    pub fn raw(&mut self, method: &str, path: &str, body: Option<&[u8]>) -> io::Result<http::Response> {
        self.http.request(method, path, body)
    }
}
