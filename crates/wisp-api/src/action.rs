//! The API's actions: every request the daemon serves, as a typed value
//! (after Firecracker's `VmmAction`). Both ends speak them: the client turns
//! an [`Action`] into an HTTP request ([`Action::to_request`]) and the
//! daemon's router turns an HTTP request back into one
//! ([`Action::from_request`]), so the table of methods and paths lives here
//! once. What the daemon does with an action, and which status each of its
//! errors gets, is the daemon's business.
//!
//! A new API call is a new variant here (both directions, and the
//! round-trip test below), a handler in the daemon, and a line in
//! `docs/api.yaml`.

use std::fmt;

use crate::http::{percent_encode, HttpError, Request};
use crate::{AddJit, AddRecycler, CreateTemplate, CreateVm, MigrateVm, PoolInfo, RemoveVms, SnapshotVm, StopVm, UpdateLib, API_PREFIX, MAX_FAMILY, MAX_REMOVE, MIN_CPUS};

/// Most CPUs a quota may name (the daemon also refuses more than its host has).
pub const MAX_CPUS: f64 = 1024.0;

/// Why the resource limits of a create request cannot be used. Checked by
/// both ends ([`check_limits`]): the client before it sends, the daemon
/// when it receives (which answers 400).
#[derive(Clone, Debug, PartialEq)]
pub enum LimitError {
    /// `cpus` is not a number of CPUs (at least [`MIN_CPUS`]).
    Cpus(f64),
    /// `family_limit` is not 1..=[`MAX_FAMILY`].
    FamilyLimit(u32),
    /// `memory` is zero.
    NoMemory,
    /// `files` hold more than [`crate::MAX_FILE_BYTES`] together.
    Files(usize),
    /// More than [`crate::MAX_VOLUMES`] volumes, or one not named by an
    /// absolute path.
    Volumes(String),
    /// More than [`crate::MAX_LIBS`] libraries, or one not named by an
    /// absolute path of a `NAME.so` file.
    Libs(String),
}

impl fmt::Display for LimitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LimitError::Cpus(c) => write!(f, "cpus {c}: must be a number of CPUs from {MIN_CPUS} to {MAX_CPUS}"),
            LimitError::FamilyLimit(n) => write!(f, "family_limit {n}: must be 1 to {MAX_FAMILY}"),
            LimitError::NoMemory => write!(f, "memory 0: a family needs memory"),
            LimitError::Files(n) => write!(
                f,
                "files of {n} bytes: at most {} KiB of files go through wispd (more: without a daemon, or the block device)",
                crate::MAX_FILE_BYTES >> 10
            ),
            LimitError::Volumes(m) => write!(f, "volumes: {m}"),
            LimitError::Libs(m) => write!(f, "libs: {m}"),
        }
    }
}

impl std::error::Error for LimitError {}

/// Check the resource limits a create request asks for (`memory`, `cpus`,
/// `family_limit`) as far as they do not depend on the host.
pub fn check_limits(vm: &CreateVm) -> Result<(), LimitError> {
    if let Some(c) = vm.cpus {
        if !(MIN_CPUS..=MAX_CPUS).contains(&c) {
            return Err(LimitError::Cpus(c));
        }
    }
    if let Some(n) = vm.family_limit {
        if !(1..=MAX_FAMILY).contains(&n) {
            return Err(LimitError::FamilyLimit(n));
        }
    }
    if vm.memory == Some(0) {
        return Err(LimitError::NoMemory);
    }
    // (Decoded, base64 is 3 bytes in 4.)
    let files: usize = vm.files.iter().map(|f| f.data.len() / 4 * 3).sum();
    if files > crate::MAX_FILE_BYTES {
        return Err(LimitError::Files(files));
    }
    if vm.volumes.len() > crate::MAX_VOLUMES {
        return Err(LimitError::Volumes(format!("{} given, at most {} through wispd", vm.volumes.len(), crate::MAX_VOLUMES)));
    }
    if let Some(v) = vm.volumes.iter().find(|v| !v.path.starts_with('/') || v.path.contains('\0')) {
        return Err(LimitError::Volumes(format!("'{}' is not an absolute path", v.path)));
    }
    if vm.libs.len() > crate::MAX_LIBS {
        return Err(LimitError::Libs(format!("{} given, at most {}", vm.libs.len(), crate::MAX_LIBS)));
    }
    if let Some(l) = vm.libs.iter().find(|l| !l.starts_with('/') || l.contains('\0') || !l.ends_with(".so")) {
        return Err(LimitError::Libs(format!("'{l}' is not an absolute path of a NAME.so file")));
    }
    Ok(())
}

/// Check a just-in-time service's request as far as it does not depend on
/// the host (both ends: the client before it sends, the router).
pub fn check_jit(j: &AddJit) -> Result<(), String> {
    if j.image.is_empty() || j.image.contains('\0') {
        return Err("image: a name or path is needed".into());
    }
    if j.port.host == 0 || j.port.vm == 0 {
        return Err(format!("port {}:{}: ports are 1 to 65535", j.port.host, j.port.vm));
    }
    if let Some(ms) = j.idle_ms.filter(|ms| !crate::JIT_IDLE_MS.contains(ms)) {
        return Err(format!("idle_ms {ms}: must be {} to {}", crate::JIT_IDLE_MS.start(), crate::JIT_IDLE_MS.end()));
    }
    if let Some(n) = j.max_vms.filter(|n| !(1..=crate::JIT_MAX_VMS).contains(n)) {
        return Err(format!("max_vms {n}: must be 1 to {}", crate::JIT_MAX_VMS));
    }
    if j.tenant.as_deref().is_some_and(|t| !crate::valid_tenant(t)) {
        return Err(InvalidCreate::Tenant.to_string());
    }
    Ok(())
}

/// Where the metrics are (`Action::Metrics`).
pub const METRICS_PATH: &str = "/metrics";

/// One API request, parsed. VMs are named by `vm`: an id, a unique id
/// prefix (3+ digits) or a name.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// `GET /v1/version`.
    Version,
    /// `GET /v1/vms`.
    ListVms,
    /// `GET /metrics` (outside `/v1`, where Prometheus looks): the daemon's
    /// metrics in Prometheus' text format 0.0.4.
    Metrics,
    /// `POST /v1/vms[?attach=true|?wait_line=true]`: create and start a
    /// VM; with `attach` the response streams its console until it ends,
    /// with `wait_line` it is sent once the guest has printed its first
    /// complete console line (and says when: `VmInfo::first_line_us`).
    CreateVm {
        /// What to start.
        vm: CreateVm,
        /// Stream the console in the response.
        attach: bool,
        /// Answer only after the guest's first console line.
        wait_line: bool,
    },
    /// `GET /v1/vms/{vm}`.
    GetVm(String),
    /// `POST /v1/vms/{vm}/pause`.
    PauseVm(String),
    /// `POST /v1/vms/{vm}/resume`.
    ResumeVm(String),
    /// `POST /v1/vms/{vm}/stop`: the stop event, then a kill after the
    /// grace period (`None`: the daemon's default).
    StopVm {
        /// Which VM.
        vm: String,
        /// Grace period in ms.
        grace_ms: Option<u64>,
    },
    /// `POST /v1/vms/{vm}/kill`.
    KillVm(String),
    /// `GET /v1/vms/{vm}/wait`.
    WaitVm(String),
    /// `GET /v1/vms/{vm}/logs[?follow=true][&stream=stderr]`: the console
    /// buffer (standard output's, or standard error's), then (with
    /// `follow`) new output until the VM ends, streamed.
    Logs {
        /// Which VM.
        vm: String,
        /// Keep streaming until the VM ends.
        follow: bool,
        /// Standard error instead of standard output.
        stderr: bool,
    },
    /// `POST /v1/vms/{vm}/stdin`: the connection becomes the VM's standard
    /// input (`101 Switching Protocols`, `Upgrade: wisp-stdin`): every byte
    /// the client sends after the response's head, until it shuts its
    /// side, is what the guest reads. The VM must have been created with
    /// `stdin`, and its input is taken once.
    Stdin(String),
    /// `DELETE /v1/vms/{vm}[?force=true][&family=true]`: remove a VM (with
    /// `force`, kill it first if it runs); with `family`, every VM of its
    /// family (all killed at once, so that none forks meanwhile).
    RemoveVm {
        /// Which VM.
        vm: String,
        /// Kill a running VM first.
        force: bool,
        /// The VM's whole family.
        family: bool,
    },
    /// `POST /v1/vms/remove`: remove many VMs at once (with `force`,
    /// running ones are killed first, in waves); the answer says which went
    /// and why the others did not.
    RemoveVms(RemoveVms),
    /// `POST /v1/vms/{vm}/snapshot`: save the VM into a file (it goes on
    /// unless `stop`).
    SnapshotVm {
        /// Which VM.
        vm: String,
        /// Where, and whether to stop it then.
        body: SnapshotVm,
    },
    /// `POST /v1/vms/{vm}/update`: replace one of the VM's shared
    /// libraries while it runs.
    UpdateLib {
        /// Which VM.
        vm: String,
        /// The new library, and which it replaces.
        body: UpdateLib,
    },
    /// `POST /v1/vms/{vm}/migrate`: move the VM to another daemon.
    MigrateVm {
        /// Which VM.
        vm: String,
        /// Where to.
        body: MigrateVm,
    },
    /// `POST /v1/templates`: make a template (boot, save at ready).
    MakeTemplate(CreateTemplate),
    /// `GET /v1/templates`.
    ListTemplates,
    /// `DELETE /v1/templates/{name}`.
    RemoveTemplate(String),
    /// `POST /v1/recyclers`: a recycler endpoint for an application library.
    AddRecycler(AddRecycler),
    /// `GET /v1/recyclers`.
    ListRecyclers,
    /// `DELETE /v1/recyclers/{id}`.
    RemoveRecycler(String),
    /// `POST /v1/jit`: a just-in-time service (a VM per client).
    AddJit(AddJit),
    /// `GET /v1/jit`.
    ListJits,
    /// `DELETE /v1/jit/{id}`: the service and its VMs go.
    RemoveJit(String),
    /// `GET /v1/pool`.
    GetPool,
    /// `PUT /v1/pool`: set pool sizes (the `ready` field is ignored).
    SetPool(PoolInfo),
}

/// A create request whose options do not fit together: a 400, from the
/// router (`Action::from_request`) and from the daemon alike.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum InvalidCreate {
    /// `net_rate` for a VM without a NIC.
    RateWithoutNic,
    /// `net_peers` for a VM without a NIC.
    PeersWithoutNic,
    /// `attach` and `wait_line` in one request.
    AttachAndWaitLine,
    /// A tenant that is no tenant name.
    Tenant,
    /// A restore with what a snapshot carries itself (memory, devices).
    RestoreWith(&'static str),
    /// A snapshot path that is not absolute.
    RestorePath,
    /// A recycled run with what a recycled VM does not have, or without
    /// its one application library.
    Recycle(&'static str),
    /// A link that cannot be made as asked.
    Link(String),
}

/// Whether two IPv4 prefixes share an address.
pub fn overlap((a, la): ([u8; 4], u8), (b, lb): ([u8; 4], u8)) -> bool {
    wisp_abi::net::in_prefix(a, (b, la.min(lb)))
}

impl std::fmt::Display for InvalidCreate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            InvalidCreate::RateWithoutNic => "net_rate needs a NIC: ask for net or ports too",
            InvalidCreate::PeersWithoutNic => "net_peers needs a NIC: ask for net or ports too",
            InvalidCreate::AttachAndWaitLine => "attach and wait_line do not go together: the console stream starts at once",
            InvalidCreate::Tenant => "invalid tenant: use 1-64 of [A-Za-z0-9_.-], not starting with '-' or '.'",
            InvalidCreate::RestoreWith(what) => return write!(f, "restore takes no {what}: a restored VM has its snapshot's memory and devices"),
            InvalidCreate::RestorePath => "restore: the snapshots' paths must be absolute (and at most 64 bases)",
            InvalidCreate::Recycle(what) => return write!(f, "recycle: {what} (a recycled run is one application library run by the recycler image)"),
            InvalidCreate::Link(why) => return f.write_str(why),
        })
    }
}

impl std::error::Error for InvalidCreate {}

impl CreateVm {
    /// Whether the VM gets a NIC: `net`, host ports to forward, or links.
    pub fn wants_nic(&self) -> bool {
        self.net || !self.ports.is_empty() || !self.links.is_empty()
    }

    /// Check the request as a whole: options of a NIC need one.
    pub fn check(&self) -> Result<(), InvalidCreate> {
        if self.net_rate.is_some() && !self.wants_nic() {
            return Err(InvalidCreate::RateWithoutNic);
        }
        if self.net_peers && !self.wants_nic() {
            return Err(InvalidCreate::PeersWithoutNic);
        }
        if self.tenant.as_deref().is_some_and(|t| !crate::valid_tenant(t)) {
            return Err(InvalidCreate::Tenant);
        }
        if let Some(why) = self.links.iter().find_map(|l| l.invalid()) {
            return Err(InvalidCreate::Link(why));
        }
        if self.links.len() > crate::links::MAX_LINKS {
            return Err(InvalidCreate::Link(format!("at most {} links", crate::links::MAX_LINKS)));
        }
        let subnets: Vec<_> = self.links.iter().filter_map(|l| l.subnet()).collect();
        if subnets.iter().enumerate().any(|(i, a)| subnets[..i].iter().any(|b| overlap(*a, *b))) {
            return Err(InvalidCreate::Link("two links' subnets overlap".into()));
        }
        if self.recycle {
            let given = [
                (self.libs.len() != 1, "exactly one library (the application) is needed"),
                (self.wants_nic(), "no NIC (net, ports)"),
                (!self.volumes.is_empty(), "no volumes"),
                (self.memory.is_some() || self.cpus.is_some() || self.family_limit.is_some(), "no limits of its own (memory, cpus, family_limit)"),
                (self.stdin, "no stdin"),
                (!self.env.is_empty() || !self.files.is_empty(), "no environment or files"),
                (self.restore.is_some() || self.from.is_some() || self.name.is_some(), "no restore, template or name"),
            ];
            if let Some((_, what)) = given.iter().find(|(g, _)| *g) {
                return Err(InvalidCreate::Recycle(what));
            }
        }
        if self.restore.is_some() && self.from.is_some() {
            return Err(InvalidCreate::RestoreWith("template (from)"));
        }
        if let Some(path) = self.restore.as_ref().or(self.from.as_ref()) {
            if self.restore.is_some() && (!path.starts_with('/') || path.contains('\0')) {
                return Err(InvalidCreate::RestorePath);
            }
            if self.bases.iter().any(|b| !b.starts_with('/') || b.contains('\0')) || self.bases.len() > 64 {
                return Err(InvalidCreate::RestorePath);
            }
            let given = [
                (self.mem.is_some(), "mem"),
                (self.wants_nic(), "NIC (net, ports)"),
                (!self.env.is_empty() || !self.files.is_empty(), "environment or files"),
                (!self.libs.is_empty(), "libraries"),
                (!self.args.is_empty(), "arguments"),
                (self.stdin, "stdin"),
            ];
            if let Some((_, what)) = given.iter().find(|(g, _)| *g) {
                return Err(InvalidCreate::RestoreWith(what));
            }
        }
        Ok(())
    }
}

/// An action as an HTTP request: method, path with query, JSON body.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpCall {
    /// Method.
    pub method: &'static str,
    /// Path and query (percent-encoded).
    pub target: String,
    /// JSON body, if the request has one.
    pub body: Option<Vec<u8>>,
}

fn vm_target(vm: &str, rest: &str) -> String {
    format!("{API_PREFIX}/vms/{}{rest}", percent_encode(vm))
}

fn json<T: serde::Serialize>(v: &T) -> Option<Vec<u8>> {
    Some(serde_json::to_vec(v).unwrap_or_default())
}

/// A boolean query flag: absent, `false` or `0` is false; `true`, `1` or a
/// bare name is true; anything else is a 400.
fn flag(req: &Request, name: &str) -> Result<bool, HttpError> {
    match req.query_param(name) {
        None | Some("false") | Some("0") => Ok(false),
        Some("true") | Some("1") | Some("") => Ok(true),
        Some(v) => Err(HttpError::new(400, format!("query parameter {name}={v}: expected true or false"))),
    }
}

impl Action {
    /// Whether the response is a stream (console output) rather than one
    /// JSON value.
    pub fn streams(&self) -> bool {
        matches!(self, Action::CreateVm { attach: true, .. } | Action::Logs { .. })
    }

    /// The HTTP request for this action.
    pub fn to_request(&self) -> HttpCall {
        let call = |method, target, body| HttpCall { method, target, body };
        match self {
            Action::Version => call("GET", format!("{API_PREFIX}/version"), None),
            Action::ListVms => call("GET", format!("{API_PREFIX}/vms"), None),
            Action::Metrics => call("GET", METRICS_PATH.to_string(), None),
            Action::CreateVm { vm, attach, wait_line } => {
                let q = match (*attach, *wait_line) {
                    (false, false) => "",
                    (true, false) => "?attach=true",
                    (false, true) => "?wait_line=true",
                    (true, true) => "?attach=true&wait_line=true",
                };
                call("POST", format!("{API_PREFIX}/vms{q}"), json(vm))
            }
            Action::GetVm(vm) => call("GET", vm_target(vm, ""), None),
            Action::PauseVm(vm) => call("POST", vm_target(vm, "/pause"), None),
            Action::ResumeVm(vm) => call("POST", vm_target(vm, "/resume"), None),
            Action::StopVm { vm, grace_ms } => call("POST", vm_target(vm, "/stop"), json(&StopVm { grace_ms: *grace_ms })),
            Action::KillVm(vm) => call("POST", vm_target(vm, "/kill"), None),
            Action::WaitVm(vm) => call("GET", vm_target(vm, "/wait"), None),
            Action::Stdin(vm) => call("POST", vm_target(vm, "/stdin"), None),
            Action::Logs { vm, follow, stderr } => {
                let q = match (*follow, *stderr) {
                    (false, false) => "/logs",
                    (true, false) => "/logs?follow=true",
                    (false, true) => "/logs?stream=stderr",
                    (true, true) => "/logs?follow=true&stream=stderr",
                };
                call("GET", vm_target(vm, q), None)
            }
            Action::RemoveVm { vm, force, family } => {
                let q = match (*force, *family) {
                    (false, false) => "",
                    (true, false) => "?force=true",
                    (false, true) => "?family=true",
                    (true, true) => "?force=true&family=true",
                };
                call("DELETE", vm_target(vm, q), None)
            }
            Action::RemoveVms(r) => call("POST", format!("{API_PREFIX}/vms/remove"), json(r)),
            Action::SnapshotVm { vm, body } => call("POST", vm_target(vm, "/snapshot"), json(body)),
            Action::UpdateLib { vm, body } => call("POST", vm_target(vm, "/update"), json(body)),
            Action::MigrateVm { vm, body } => call("POST", vm_target(vm, "/migrate"), json(body)),
            Action::MakeTemplate(t) => call("POST", format!("{API_PREFIX}/templates"), json(t)),
            Action::ListTemplates => call("GET", format!("{API_PREFIX}/templates"), None),
            Action::RemoveTemplate(name) => call("DELETE", format!("{API_PREFIX}/templates/{}", percent_encode(name)), None),
            Action::AddRecycler(r) => call("POST", format!("{API_PREFIX}/recyclers"), json(r)),
            Action::ListRecyclers => call("GET", format!("{API_PREFIX}/recyclers"), None),
            Action::RemoveRecycler(id) => call("DELETE", format!("{API_PREFIX}/recyclers/{}", percent_encode(id)), None),
            Action::AddJit(j) => call("POST", format!("{API_PREFIX}/jit"), json(j)),
            Action::ListJits => call("GET", format!("{API_PREFIX}/jit"), None),
            Action::RemoveJit(id) => call("DELETE", format!("{API_PREFIX}/jit/{}", percent_encode(id)), None),
            Action::GetPool => call("GET", format!("{API_PREFIX}/pool"), None),
            Action::SetPool(p) => call("PUT", format!("{API_PREFIX}/pool"), json(p)),
        }
    }

    /// Parse a request into an action: path, method, query flags and JSON
    /// body become typed values. Unknown paths are 404, other methods on
    /// known paths 405, bad flags and bodies 400.
    pub fn from_request(req: &Request) -> Result<Action, HttpError> {
        let no_endpoint = || HttpError::new(404, format!("no such endpoint: {}", req.path));
        if req.path == METRICS_PATH {
            return match req.method.as_str() {
                "GET" => Ok(Action::Metrics),
                m => Err(HttpError::new(405, format!("method {m} not allowed on {}", req.path))),
            };
        }
        let path = req.path.strip_prefix(API_PREFIX).ok_or_else(no_endpoint)?;
        let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
        let vm = |id: &str| id.to_string();
        Ok(match (req.method.as_str(), parts.as_slice()) {
            ("GET", ["version"]) => Action::Version,
            ("GET", ["vms"]) => Action::ListVms,
            ("POST", ["vms"]) => {
                let attach = flag(req, "attach")?;
                let wait_line = flag(req, "wait_line")?;
                if attach && wait_line {
                    return Err(HttpError::new(400, InvalidCreate::AttachAndWaitLine.to_string()));
                }
                let vm: CreateVm = req.json()?;
                vm.check().map_err(|e| HttpError::new(400, e.to_string()))?;
                Action::CreateVm { vm, attach, wait_line }
            }
            ("POST", ["vms", "remove"]) => {
                let r: RemoveVms = req.json()?;
                if r.vms.len() > MAX_REMOVE {
                    return Err(HttpError::new(400, format!("{} VMs named: at most {MAX_REMOVE} per request", r.vms.len())));
                }
                Action::RemoveVms(r)
            }
            ("GET", ["vms", id]) => Action::GetVm(vm(id)),
            ("DELETE", ["vms", id]) => Action::RemoveVm { vm: vm(id), force: flag(req, "force")?, family: flag(req, "family")? },
            ("POST", ["vms", id, "pause"]) => Action::PauseVm(vm(id)),
            ("POST", ["vms", id, "resume"]) => Action::ResumeVm(vm(id)),
            ("POST", ["vms", id, "kill"]) => Action::KillVm(vm(id)),
            ("POST", ["vms", id, "stop"]) => {
                let body: StopVm = if req.body.is_empty() { StopVm::default() } else { req.json()? };
                Action::StopVm { vm: vm(id), grace_ms: body.grace_ms }
            }
            ("GET", ["vms", id, "wait"]) => Action::WaitVm(vm(id)),
            ("POST", ["vms", id, "snapshot"]) => {
                let body: SnapshotVm = req.json()?;
                if !body.path.starts_with('/') || body.path.contains('\0') {
                    return Err(HttpError::new(400, format!("snapshot path '{}' is not absolute", body.path)));
                }
                Action::SnapshotVm { vm: vm(id), body }
            }
            ("POST", ["vms", id, "update"]) => {
                let body: UpdateLib = req.json()?;
                if !body.path.starts_with('/') || body.path.contains('\0') || !body.path.ends_with(".so") {
                    return Err(HttpError::new(400, format!("library path '{}' is not an absolute path of a .so file", body.path)));
                }
                if body.replace.as_ref().is_some_and(|r| r.is_empty() || r.len() > 24 || r.contains('\0')) {
                    return Err(HttpError::new(400, "replace: a library's name is 1 to 24 bytes".to_string()));
                }
                Action::UpdateLib { vm: vm(id), body }
            }
            ("POST", ["vms", id, "stdin"]) => Action::Stdin(vm(id)),
            ("GET", ["vms", id, "logs"]) => {
                let stderr = match req.query_param("stream") {
                    None | Some("stdout") => false,
                    Some("stderr") => true,
                    Some(v) => return Err(HttpError::new(400, format!("query parameter stream={v}: expected stdout or stderr"))),
                };
                Action::Logs { vm: vm(id), follow: flag(req, "follow")?, stderr }
            }
            ("POST", ["vms", id, "migrate"]) => Action::MigrateVm { vm: vm(id), body: req.json()? },
            ("POST", ["templates"]) => Action::MakeTemplate(req.json()?),
            ("GET", ["templates"]) => Action::ListTemplates,
            ("DELETE", ["templates", name]) => Action::RemoveTemplate(name.to_string()),
            ("POST", ["recyclers"]) => {
                let r: AddRecycler = req.json()?;
                if !r.lib.starts_with('/') || r.lib.contains('\0') || !r.lib.ends_with(".so") {
                    return Err(HttpError::new(400, format!("library path '{}' is not an absolute path of a .so file", r.lib)));
                }
                if r.tenant.as_deref().is_some_and(|t| !crate::valid_tenant(t)) {
                    return Err(HttpError::new(400, InvalidCreate::Tenant.to_string()));
                }
                Action::AddRecycler(r)
            }
            ("GET", ["recyclers"]) => Action::ListRecyclers,
            ("DELETE", ["recyclers", id]) => Action::RemoveRecycler(id.to_string()),
            ("POST", ["jit"]) => {
                let j: AddJit = req.json()?;
                check_jit(&j).map_err(|m| HttpError::new(400, m))?;
                Action::AddJit(j)
            }
            ("GET", ["jit"]) => Action::ListJits,
            ("DELETE", ["jit", id]) => Action::RemoveJit(id.to_string()),
            ("GET", ["pool"]) => Action::GetPool,
            ("PUT", ["pool"]) => Action::SetPool(req.json()?),
            (m, ["version"] | ["vms"] | ["vms", _] | ["vms", _, _] | ["pool"]) => {
                return Err(HttpError::new(405, format!("method {m} not allowed on {}", req.path)))
            }
            _ => return Err(no_endpoint()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::read_request;
    use crate::{PoolTarget, PortMap};

    /// The request `call` puts on the wire, read back by the server's parser.
    fn wire(call: &HttpCall) -> Request {
        let body = call.body.clone().unwrap_or_default();
        let mut raw = format!("{} {} HTTP/1.1\r\nContent-Length: {}\r\n\r\n", call.method, call.target, body.len()).into_bytes();
        raw.extend_from_slice(&body);
        read_request(&mut &raw[..]).unwrap().unwrap()
    }

    fn parse(method: &'static str, target: &str, body: &str) -> Result<Action, HttpError> {
        Action::from_request(&wire(&HttpCall { method, target: target.into(), body: Some(body.into()) }))
    }

    #[test]
    fn libraries_are_absolute_so_paths_at_most_eight() {
        let with = |libs: Vec<&str>| check_limits(&CreateVm { libs: libs.into_iter().map(String::from).collect(), ..Default::default() });
        assert_eq!(with(vec!["/l/hello.so"]), Ok(()));
        assert_eq!(with(vec!["hello.so"]).unwrap_err().to_string(), "libs: 'hello.so' is not an absolute path of a NAME.so file");
        assert!(with(vec!["/l/hello"]).is_err());
        assert_eq!(with(vec!["/l/a.so"; 9]).unwrap_err().to_string(), "libs: 9 given, at most 8");
        let r = CreateVm { image: "snap".into(), restore: Some("/s/a.snap".into()), libs: vec!["/l/hello.so".into()], ..Default::default() };
        assert!(r.check().unwrap_err().to_string().contains("no libraries"));
    }

    #[test]
    fn a_restore_takes_nothing_its_snapshot_carries() {
        let r = CreateVm { image: "snap".into(), restore: Some("/s/a.snap".into()), ..Default::default() };
        assert_eq!(r.check(), Ok(()));
        let bad = |f: &dyn Fn(&mut CreateVm)| {
            let mut c = r.clone();
            f(&mut c);
            c.check().unwrap_err().to_string()
        };
        assert_eq!(bad(&|c| c.restore = Some("a.snap".into())), "restore: the snapshots' paths must be absolute (and at most 64 bases)");
        assert_eq!(bad(&|c| c.mem = Some(32 << 20)), "restore takes no mem: a restored VM has its snapshot's memory and devices");
        assert!(bad(&|c| c.net = true).contains("no NIC"));
        assert!(bad(&|c| c.env = vec!["A=1".into()]).contains("no environment"));
        assert!(bad(&|c| c.args = vec!["x".into()]).contains("no arguments"));
        // A disk's contents are not in a snapshot: its volume is given again.
        let with_disk = CreateVm { volumes: vec![crate::Volume { path: "/v.img".into(), read_only: false }], ..r.clone() };
        assert_eq!(with_disk.check(), Ok(()));
        // Through the router: a 400.
        let e = parse("POST", "/v1/vms", r#"{"image":"s","restore":"/s","mem":33554432}"#).unwrap_err();
        assert_eq!(e.status, 400);
        let e = parse("POST", "/v1/vms/x/update", r#"{"path":"rel.so"}"#).unwrap_err();
        assert_eq!((e.status, e.message.as_str()), (400, "library path 'rel.so' is not an absolute path of a .so file"));
        let e = parse("POST", "/v1/vms/x/update", r#"{"path":"/a.so","replace":""}"#).unwrap_err();
        assert_eq!((e.status, e.message.as_str()), (400, "replace: a library's name is 1 to 24 bytes"));
        let e = parse("POST", "/v1/vms/x/snapshot", r#"{"path":"rel.snap"}"#).unwrap_err();
        assert_eq!((e.status, e.message.as_str()), (400, "snapshot path 'rel.snap' is not absolute"));
    }

    #[test]
    fn every_action_survives_the_round_trip() {
        let create = CreateVm {
            image: "hello".into(),
            args: vec!["x".into()],
            mem: Some(32 << 20),
            name: Some("n".into()),
            timeout_ms: Some(5),
            net: true,
            ports: vec![
                PortMap { host: 8013, vm: 13, addr: None },
                PortMap { host: 8014, vm: 14, addr: Some([0, 0, 0, 0].into()) },
            ],
            net_rate: Some(crate::NetRate { bytes_per_sec: 1 << 20, frames_per_sec: 2000 }),
            net_peers: true,
            links: Vec::new(),
            memory: Some(256 << 20),
            cpus: Some(1.5),
            family_limit: Some(8),
            tenant: Some("acme".into()),
            env: vec!["A=1".into(), "B=".into()],
            files: vec![crate::GuestFile::new("/etc/x", b"\x00\xffbytes")],
            stdin: true,
            volumes: vec![crate::Volume { path: "/v.img".into(), read_only: true }],
            libs: vec!["/l/hello.so".into()],
            restore: None,
            from: None,
            bases: Vec::new(),
            recycle: false,
        };
        assert_eq!(check_limits(&create), Ok(()));
        // A recycled run: one library, none of what a recycler lacks.
        let run = CreateVm { image: "recycler".into(), libs: vec!["/l/hello.so".into()], recycle: true, ..Default::default() };
        assert_eq!(run.check(), Ok(()));
        let refused = |c: CreateVm| c.check().unwrap_err().to_string();
        assert!(refused(CreateVm { libs: Vec::new(), ..run.clone() }).contains("exactly one library"));
        assert!(refused(CreateVm { net: true, ..run.clone() }).contains("no NIC"));
        assert!(refused(CreateVm { stdin: true, ..run.clone() }).contains("no stdin"));
        assert!(refused(CreateVm { cpus: Some(1.0), ..run.clone() }).contains("no limits"));
        assert!(refused(CreateVm { name: Some("n".into()), ..run.clone() }).contains("no restore, template or name"));
        let back: CreateVm = serde_json::from_slice(&serde_json::to_vec(&run).unwrap()).unwrap();
        assert_eq!(back, run);
        assert_eq!(create.files[0].bytes().unwrap(), b"\x00\xffbytes");
        let mut big = create.clone();
        big.files = vec![crate::GuestFile::new("/big", &vec![0u8; crate::MAX_FILE_BYTES + 3])];
        assert!(matches!(check_limits(&big), Err(LimitError::Files(_))));
        let pool = PoolInfo { target: vec![PoolTarget { mem: 16 << 20, count: 3 }], ..Default::default() };
        let all = [
            Action::Version,
            Action::ListVms,
            Action::Metrics,
            Action::CreateVm { vm: create.clone(), attach: false, wait_line: false },
            Action::CreateVm { vm: create.clone(), attach: true, wait_line: false },
            Action::CreateVm { vm: create, attach: false, wait_line: true },
            Action::GetVm("abc".into()),
            Action::PauseVm("abc".into()),
            Action::ResumeVm("abc".into()),
            Action::StopVm { vm: "abc".into(), grace_ms: None },
            Action::StopVm { vm: "abc".into(), grace_ms: Some(300) },
            Action::KillVm("abc".into()),
            Action::WaitVm("abc".into()),
            Action::Stdin("abc".into()),
            Action::Logs { vm: "abc".into(), follow: false, stderr: false },
            Action::Logs { vm: "abc".into(), follow: true, stderr: false },
            Action::Logs { vm: "abc".into(), follow: false, stderr: true },
            Action::Logs { vm: "abc".into(), follow: true, stderr: true },
            Action::RemoveVm { vm: "abc".into(), force: false, family: false },
            Action::RemoveVm { vm: "abc".into(), force: true, family: false },
            Action::RemoveVm { vm: "abc".into(), force: false, family: true },
            Action::RemoveVm { vm: "abc".into(), force: true, family: true },
            Action::RemoveVms(RemoveVms { vms: vec!["abc".into(), "web".into()], force: true }),
            Action::RemoveVms(RemoveVms::default()),
            Action::SnapshotVm { vm: "abc".into(), body: SnapshotVm { path: "/tmp/a.snap".into(), stop: false, incremental: false } },
            Action::SnapshotVm { vm: "abc".into(), body: SnapshotVm { path: "/tmp/a.snap".into(), stop: true, incremental: true } },
            Action::UpdateLib { vm: "abc".into(), body: UpdateLib { path: "/l/hello2.so".into(), replace: Some("hello".into()), wait_ms: Some(100) } },
            Action::MakeTemplate(CreateTemplate { name: "t".into(), image: "counter".into(), args: vec!["1".into()], mem: Some(32 << 20), timeout_ms: Some(5) }),
            Action::ListTemplates,
            Action::RemoveTemplate("t".into()),
            Action::MigrateVm { vm: "abc".into(), body: MigrateVm { to: "10.0.0.2:7777".into() } },
            Action::AddRecycler(AddRecycler { lib: "/l/hello.so".into(), mem: Some(16 << 20), tenant: Some("acme".into()) }),
            Action::ListRecyclers,
            Action::RemoveRecycler("r1".into()),
            Action::AddJit(AddJit { image: "daytime".into(), port: "8013:13".parse().unwrap(), args: vec!["a".into()], mem: Some(16 << 20), idle_ms: Some(500), max_vms: Some(9), tenant: Some("acme".into()) }),
            Action::ListJits,
            Action::RemoveJit("j1".into()),
            Action::GetPool,
            Action::SetPool(pool),
        ];
        for a in all {
            assert_eq!(Action::from_request(&wire(&a.to_request())).unwrap(), a);
        }
        // Keys are percent-encoded on the way and decoded back; a '/' in
        // one makes more path segments, as it always did.
        let a = Action::Logs { vm: "a b?ü".into(), follow: true, stderr: false };
        assert_eq!(Action::from_request(&wire(&a.to_request())).unwrap(), a);
        assert_eq!(Action::from_request(&wire(&Action::GetVm("a/b".into()).to_request())).unwrap_err().status, 405);
    }

    #[test]
    fn bad_requests_get_4xx_with_the_same_messages() {
        let status = |m: &'static str, t: &str, b: &str| parse(m, t, b).map_err(|e| (e.status, e.message));
        assert_eq!(status("GET", "/v2/vms", "").unwrap_err(), (404, "no such endpoint: /v2/vms".into()));
        assert_eq!(status("GET", "/v1/nothing", "").unwrap_err(), (404, "no such endpoint: /v1/nothing".into()));
        assert_eq!(status("DELETE", "/v1/vms", "").unwrap_err(), (405, "method DELETE not allowed on /v1/vms".into()));
        assert_eq!(status("POST", "/v1/vms/x/nope", "").unwrap_err().0, 405);
        assert_eq!(status("POST", "/metrics", "").unwrap_err(), (405, "method POST not allowed on /metrics".into()));
        assert_eq!(parse("GET", "/metrics?x=1", "").unwrap(), Action::Metrics);
        assert_eq!(status("GET", "/v1/metrics", "").unwrap_err().0, 404);
        assert_eq!(status("POST", "/v1/recyclers", r#"{"lib":"rel.so"}"#).unwrap_err(), (400, "library path 'rel.so' is not an absolute path of a .so file".into()));
        assert_eq!(status("POST", "/v1/recyclers", r#"{"lib":"/l/a.so","tenant":"-x"}"#).unwrap_err().0, 400);
        assert_eq!(status("POST", "/v1/recyclers", r#"{"lib":"/l/a.so","nope":1}"#).unwrap_err().0, 400);
        assert_eq!(status("GET", "/v1/vms/x/logs?follow=maybe", "").unwrap_err(), (400, "query parameter follow=maybe: expected true or false".into()));
        // The attach flag is checked before the body.
        assert_eq!(status("POST", "/v1/vms?attach=2", "{").unwrap_err().1, "query parameter attach=2: expected true or false");
        assert_eq!(status("POST", "/v1/vms?wait_line=no", "{").unwrap_err().1, "query parameter wait_line=no: expected true or false");
        assert_eq!(
            status("POST", "/v1/vms?attach=true&wait_line=true", r#"{"image":"x"}"#).unwrap_err(),
            (400, "attach and wait_line do not go together: the console stream starts at once".into())
        );
        assert_eq!(status("POST", "/v1/vms", "").unwrap_err(), (400, "missing JSON body".into()));
        assert!(status("POST", "/v1/vms", "{\"image\": 5}").unwrap_err().1.contains("invalid type"));
        assert!(status("PUT", "/v1/pool", "{\"bogus\": 1}").unwrap_err().1.contains("missing field"));
        // Options of a NIC without one.
        let no_nic = [
            (r#"{"image":"x","net_rate":{"bytes_per_sec":1}}"#, "net_rate needs a NIC: ask for net or ports too"),
            (r#"{"image":"x","net_peers":true}"#, "net_peers needs a NIC: ask for net or ports too"),
            (r#"{"image":"x","net_peers":true,"net":false}"#, "net_peers needs a NIC: ask for net or ports too"),
        ];
        for (body, msg) in no_nic {
            assert_eq!(status("POST", "/v1/vms", body).unwrap_err(), (400, msg.into()), "{body}");
        }
        for ok in [r#"{"image":"x","net_peers":true,"net":true}"#, r#"{"image":"x","net_peers":true,"ports":[{"host":1,"vm":2}]}"#] {
            assert!(matches!(parse("POST", "/v1/vms", ok), Ok(Action::CreateVm { vm: CreateVm { net_peers: true, .. }, .. })), "{ok}");
        }
        // A request that does not ask for it is isolated, and says nothing of it.
        let Action::CreateVm { vm, .. } = parse("POST", "/v1/vms", r#"{"image":"x","net":true}"#).unwrap() else { panic!() };
        assert!(!vm.net_peers);
        assert!(!String::from_utf8(Action::CreateVm { vm, attach: false, wait_line: false }.to_request().body.unwrap()).unwrap().contains("peers"));
        // An empty stop body is the default grace; a bare flag is true.
        assert_eq!(parse("POST", "/v1/vms/x/stop", "").unwrap(), Action::StopVm { vm: "x".into(), grace_ms: None });
        assert_eq!(parse("DELETE", "/v1/vms/x?force", "").unwrap(), Action::RemoveVm { vm: "x".into(), force: true, family: false });
        // A batch removal names at most MAX_REMOVE VMs; a VM named "remove"
        // is still reached by its own path.
        let many = serde_json::to_string(&RemoveVms { vms: vec!["a".into(); MAX_REMOVE + 1], force: true }).unwrap();
        assert_eq!(parse("POST", "/v1/vms/remove", &many).unwrap_err().status, 400);
        assert_eq!(parse("POST", "/v1/vms/remove", r#"{"vms":["a"],"bogus":1}"#).unwrap_err().status, 400);
        assert_eq!(parse("DELETE", "/v1/vms/remove", "").unwrap(), Action::RemoveVm { vm: "remove".into(), force: false, family: false });
        assert_eq!(parse("GET", "/v1/vms/", "").unwrap(), Action::ListVms);
    }

    #[test]
    fn limits_are_checked_with_clear_messages() {
        let vm = |memory, cpus, family_limit| CreateVm { image: "x".into(), memory, cpus, family_limit, ..Default::default() };
        assert_eq!(check_limits(&vm(None, None, None)), Ok(()));
        assert_eq!(check_limits(&vm(Some(1), Some(MIN_CPUS), Some(1))), Ok(()));
        assert_eq!(check_limits(&vm(None, Some(MAX_CPUS), Some(MAX_FAMILY))), Ok(()));
        for c in [0.0, -1.0, 0.001, f64::NAN, f64::INFINITY, 1e9] {
            assert!(matches!(check_limits(&vm(None, Some(c), None)), Err(LimitError::Cpus(_))), "{c}");
        }
        assert_eq!(check_limits(&vm(None, Some(0.0), None)).unwrap_err().to_string(), "cpus 0: must be a number of CPUs from 0.01 to 1024");
        for n in [0, MAX_FAMILY + 1, u32::MAX] {
            assert_eq!(check_limits(&vm(None, None, Some(n))), Err(LimitError::FamilyLimit(n)));
        }
        assert_eq!(check_limits(&vm(None, None, Some(0))).unwrap_err().to_string(), "family_limit 0: must be 1 to 64");
        assert_eq!(check_limits(&vm(Some(0), None, None)).unwrap_err().to_string(), "memory 0: a family needs memory");
        // Unknown fields are still refused; the new ones parse.
        let ok: CreateVm = serde_json::from_str(r#"{"image":"x","memory":1048576,"cpus":0.5,"family_limit":4}"#).unwrap();
        assert_eq!((ok.memory, ok.cpus, ok.family_limit), (Some(1 << 20), Some(0.5), Some(4)));
        assert!(serde_json::from_str::<CreateVm>(r#"{"image":"x","cpu":1}"#).is_err());
        assert!(serde_json::from_str::<CreateVm>(r#"{"image":"x","cpus":"1"}"#).is_err());
        assert!(serde_json::from_str::<CreateVm>(r#"{"image":"x","family_limit":-1}"#).is_err());
    }
}
