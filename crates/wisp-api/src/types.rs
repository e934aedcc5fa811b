//! Request and response bodies of the wispd API.

use serde::{Deserialize, Serialize};

/// `POST /v1/vms`: create and start a VM.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CreateVm {
    /// Image path (absolute, as seen by the daemon) or a bundled app name.
    pub image: String,
    /// Guest arguments (argument 0, the image name, is added by the monitor).
    #[serde(default)]
    pub args: Vec<String>,
    /// Guest RAM in bytes (default 16 MiB).
    #[serde(default)]
    pub mem: Option<u64>,
    /// Optional unique name.
    #[serde(default)]
    pub name: Option<String>,
    /// End the VM after this many milliseconds.
    #[serde(default)]
    pub timeout_ms: Option<u64>,
    /// Give the VM a NIC on the daemon's bridge, with an address from its
    /// subnet.
    #[serde(default)]
    pub net: bool,
    /// Forward these host TCP ports to the VM (implies `net`).
    #[serde(default)]
    pub ports: Vec<PortMap>,
}

/// A forwarded TCP port: connections to `host` on the daemon's host go to
/// `vm` on the VM's address.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct PortMap {
    /// Host port.
    pub host: u16,
    /// VM port.
    pub vm: u16,
}

/// Life-cycle state of a VM.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum VmState {
    /// Running (or parked in idle).
    Running,
    /// Paused by the API.
    Paused,
    /// The guest exited or was stopped; its logs and status remain until `rm`.
    Exited,
}

/// How a VM ended.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ExitInfo {
    /// Exit status as `wisp run` reports it (guest code, 124 timeout,
    /// 137 killed, 139 stopped for misbehaviour).
    pub code: i32,
    /// Why, for a VM the monitor stopped ("guest fault: ..."), or "exited".
    pub reason: String,
}

/// `GET /v1/vms/{id}` and the entries of `GET /v1/vms`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct VmInfo {
    /// Unique id (12 hex digits).
    pub id: String,
    /// Unique name, if given.
    pub name: Option<String>,
    /// Image as requested.
    pub image: String,
    /// Guest arguments.
    pub args: Vec<String>,
    /// Guest RAM in bytes.
    pub mem: u64,
    /// State.
    pub state: VmState,
    /// Process id of the VMM process holding the VM.
    pub pid: u32,
    /// Creation time, ms since the Unix epoch.
    pub created_ms: u64,
    /// Set once the VM has exited.
    pub exit: Option<ExitInfo>,
    /// Microseconds the execute phase took (request → guest running).
    pub boot_us: Option<u64>,
    /// IPv4 address of its NIC, if it has one.
    #[serde(default)]
    pub ip: Option<String>,
    /// Forwarded host ports.
    #[serde(default)]
    pub ports: Vec<PortMap>,
    /// For a VM forked by another: the parent's id.
    #[serde(default)]
    pub parent: Option<String>,
    /// For a forked VM: the id of its family's root (whose VMM process
    /// command line it still carries).
    #[serde(default)]
    pub family: Option<String>,
}

/// `GET /v1/pool` and `PUT /v1/pool`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct PoolInfo {
    /// Ready shells wanted per memory size (bytes → count).
    pub target: Vec<PoolTarget>,
    /// Ready shells now per memory size.
    #[serde(default)]
    pub ready: Vec<PoolTarget>,
}

/// A pool size for one memory size.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct PoolTarget {
    /// Guest RAM in bytes.
    pub mem: u64,
    /// Number of shells.
    pub count: u32,
}

/// Body of every 4xx/5xx answer.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ErrorBody {
    /// What was wrong, for a person.
    pub error: String,
}

/// `POST /v1/vms/{id}/stop`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct StopVm {
    /// Grace period before the VM is killed, in ms (default 2000).
    #[serde(default)]
    pub grace_ms: Option<u64>,
}

/// `GET /v1/version`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Version {
    /// Daemon version.
    pub version: String,
    /// Hypercall ABI version of its monitor.
    pub abi: u32,
}
