//! Request and response bodies of the wispd API.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use crate::links::LinkSpec;

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
    /// Limit the NIC's traffic in each direction (needs `net` or `ports`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub net_rate: Option<NetRate>,
    /// Leave the NIC's bridge port open to the other VMs of the bridge
    /// (needs `net` or `ports`). By default a VM's port is isolated: it
    /// reaches the gateway (the host side of the bridge) and VMs that have
    /// `net_peers`, never another isolated VM. A VM with `net_peers`
    /// reaches, and is reached by, every VM on the bridge.
    #[serde(default, skip_serializing_if = "is_false")]
    pub net_peers: bool,
    /// Further links (implies `net`): a VM that routes for a client — a
    /// personal firewall — gets a NIC per link whose host end lives in the
    /// client's network namespace (`LinkSpec`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub links: Vec<LinkSpec>,
    /// Memory limit of the VM's family in bytes: guest RAM, monitors and
    /// the copy-on-write growth of every VM it forks (default: what
    /// `family_limit` VMs of `mem` bytes each may use).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<u64>,
    /// CPU quota of the VM's family, in CPUs (e.g. 1.5; default: none, a
    /// fair share of the host's CPUs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<f64>,
    /// Most VMs in the VM's family (itself, its children, theirs, ...;
    /// 1..=[`MAX_FAMILY`], default [`MAX_FAMILY`]); a fork beyond it fails
    /// with `EAGAIN`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub family_limit: Option<u32>,
    /// Whose VM it is (1-64 of `[A-Za-z0-9_.-]`). Under
    /// `wispd --vms-per-process N` the VMs of one tenant (and size) may
    /// share a VMM process and its sandbox; VMs of different tenants never
    /// do. Default: the anonymous tenant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// The guest's environment, `KEY=VALUE` entries (the guest reads
    /// `wisp::env::var`; a key given twice: the last wins).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    /// Read-only files for the guest (`wisp::fs`), at most
    /// [`MAX_FILE_BYTES`] together.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<GuestFile>,
    /// Keep the guest's standard input open until a client sends it
    /// (`POST /v1/vms/{id}/stdin`) and closes it; without it the guest
    /// reads an empty input.
    #[serde(default, skip_serializing_if = "is_false")]
    pub stdin: bool,
    /// Disks for the guest (`wisp::blk`), at most [`MAX_VOLUMES`]: files
    /// or block devices the daemon opens with the client's own rights.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<Volume>,
    /// Shared libraries mapped for the guest (`wisp::lib`), at most
    /// [`MAX_LIBS`]: absolute paths of `NAME.so` files the daemon opens
    /// with the client's own rights, checks (signature, ELF) and keeps one
    /// copy of for every VM (`docs/libraries.md`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub libs: Vec<String>,
    /// Restore the snapshot at this absolute path (opened with the client's
    /// rights) instead of booting an image: the VM goes on from where it
    /// was saved, with its memory size (`image` is only its label then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore: Option<String>,
    /// The snapshots `restore` is laid over when it is incremental, oldest
    /// (a full one) first, each the base of the next (absolute paths).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bases: Vec<String>,
    /// Start from the template of this name (`POST /v1/templates`) instead
    /// of booting `image`: as `restore`, from the daemon's own snapshot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// Run on a recycled VM (`wisp run --recycle`): the image is the
    /// recycler, `libs` its one application library; wispd runs it in a
    /// recycling group, on a recycler kept at its ready point between runs
    /// (`docs/libraries.md`, "Recycling").
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub recycle: bool,
}

/// Most volumes of a VM through the API.
pub const MAX_VOLUMES: usize = 3;
/// Most shared libraries a create may name.
pub const MAX_LIBS: usize = 8;

/// A disk given to a guest.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Volume {
    /// Absolute path of the file or block device (a whole number of 4 KiB
    /// sectors).
    pub path: String,
    /// Writes are refused (many VMs may share one read-only volume).
    #[serde(default, skip_serializing_if = "is_false")]
    pub read_only: bool,
}

/// Most bytes of [`CreateVm::files`] together (they travel base64-encoded
/// in a request body of at most 1 MiB).
pub const MAX_FILE_BYTES: usize = 512 * 1024;

/// A read-only file given to a guest.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GuestFile {
    /// Its absolute path in the guest.
    pub path: String,
    /// Its contents, base64 (standard alphabet, padded).
    pub data: String,
}

impl GuestFile {
    /// The file at guest path `path` holding `bytes`.
    pub fn new(path: &str, bytes: &[u8]) -> GuestFile {
        use base64::Engine;
        GuestFile { path: path.to_string(), data: base64::engine::general_purpose::STANDARD.encode(bytes) }
    }

    /// Its contents.
    pub fn bytes(&self) -> Result<Vec<u8>, String> {
        use base64::Engine;
        base64::engine::general_purpose::STANDARD.decode(&self.data).map_err(|e| format!("file {}: contents are not base64: {e}", self.path))
    }
}

/// Whether `s` is a name of 1 to `most` of `[A-Za-z0-9_.-]`, not starting
/// with `-` or `.`: the rule of VM, template and tenant names, and of a
/// link's namespace and interface.
pub fn valid_name(s: &str, most: usize) -> bool {
    !s.is_empty() && s.len() <= most && s.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) && !s.starts_with(['-', '.'])
}

/// Whether `t` can name a tenant ([`valid_name`], 64 at most).
pub fn valid_tenant(t: &str) -> bool {
    valid_name(t, 64)
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// Most VMs in one family (the monitor's family region has this many
/// member slots: `wisp_abi::family::limits::MAX_MEMBERS`).
pub const MAX_FAMILY: u32 = 64;

/// Smallest CPU quota a family may be given, in CPUs.
pub const MIN_CPUS: f64 = 0.01;

/// What a VM's family may use, as the daemon applied it (its control group).
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct VmLimits {
    /// Memory limit of the family in bytes (guest RAM, monitors, copy-on-write growth).
    pub memory: u64,
    /// CPU quota of the family in CPUs; none: no quota.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpus: Option<f64>,
    /// Most VMs in the family.
    pub family_limit: u32,
    /// Most processes and threads in the family.
    pub pids: u64,
}

/// A NIC's rate limit, the same in each direction; 0 = unlimited.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct NetRate {
    /// Bytes per second.
    #[serde(default)]
    pub bytes_per_sec: u64,
    /// Frames per second.
    #[serde(default)]
    pub frames_per_sec: u64,
}

/// A forwarded TCP port: connections to `host` on the daemon's host (on
/// the address `addr`, by default 127.0.0.1) go to `vm` on the VM's address.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct PortMap {
    /// Host port.
    pub host: u16,
    /// VM port.
    pub vm: u16,
    /// Host address to listen on; `None`: [`PortMap::DEFAULT_ADDR`], this
    /// host only. `0.0.0.0` listens on every address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub addr: Option<IpAddr>,
}

impl PortMap {
    /// Where a forward listens unless its map names an address: loopback,
    /// so that a forwarded port is not open to the network by accident.
    pub const DEFAULT_ADDR: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

    /// The host address to listen on.
    pub fn host_addr(&self) -> IpAddr {
        self.addr.unwrap_or(Self::DEFAULT_ADDR)
    }
}

/// `[ADDR:]HOSTPORT:VMPORT`, as `wisp run -p` takes it: `8013:13`,
/// `0.0.0.0:8013:13`, `[::1]:8013:13`.
impl FromStr for PortMap {
    type Err = String;

    fn from_str(s: &str) -> Result<PortMap, String> {
        let err = || format!("'{s}': expected [ADDR:]HOSTPORT:VMPORT, e.g. 8013:13 or 0.0.0.0:8013:13");
        let (addr, ports) = match s.strip_prefix('[') {
            Some(rest) => {
                let (a, ports) = rest.split_once("]:").ok_or_else(err)?;
                (Some(a.parse::<Ipv6Addr>().map_err(|_| err())?.into()), ports)
            }
            None => match s.matches(':').count() {
                1 => (None, s),
                2 => {
                    let (a, ports) = s.split_once(':').ok_or_else(err)?;
                    (Some(a.parse::<Ipv4Addr>().map_err(|_| format!("'{a}' is not an IPv4 address"))?.into()), ports)
                }
                _ => return Err(err()),
            },
        };
        let (h, v) = ports.split_once(':').ok_or_else(err)?;
        let port = |p: &str| p.parse::<u16>().ok().filter(|p| *p != 0).ok_or_else(err);
        Ok(PortMap { host: port(h)?, vm: port(v)?, addr })
    }
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
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
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
    /// Microseconds from the create request's arrival at the daemon to the
    /// guest's first complete console line, as the daemon saw it; set by a
    /// create with `wait_line` (none otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_line_us: Option<u64>,
    /// Where its start's time went (a VM this daemon started).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_trace: Option<BootTrace>,
    /// IPv4 address of its NIC, if it has one.
    #[serde(default)]
    pub ip: Option<String>,
    /// Forwarded host ports.
    #[serde(default)]
    pub ports: Vec<PortMap>,
    /// Its further links (`CreateVm::links`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub links: Vec<LinkSpec>,
    /// Its NIC's bridge port is open to the other VMs (`CreateVm::net_peers`);
    /// false: isolated, or no NIC.
    #[serde(default)]
    pub net_peers: bool,
    /// For a VM forked by another: the parent's id.
    #[serde(default)]
    pub parent: Option<String>,
    /// For a forked VM: the id of its family's root (whose VMM process
    /// command line it still carries).
    #[serde(default)]
    pub family: Option<String>,
    /// What the VM's family may use (none: the daemon runs without
    /// control groups, or the VM predates them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limits: Option<VmLimits>,
    /// The tenant it was created for, if one was named.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// The id of the group VMM process that runs it, if it shares one
    /// (`wispd --vms-per-process`); none: a VMM process of its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
}

/// A start's way through the toolstack, on the host's monotonic clock
/// (`CLOCK_MONOTONIC`, ns; the same clock for every process of the host,
/// so a client on the host can put its own times beside them): the
/// request's arrival at the daemon, the start command sent to the VMM
/// process, received there, the guest about to run, and (for an attached
/// create, whose console the VMM process writes to the client itself) the
/// guest's first output written to the client.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BootTrace {
    pub arrived_ns: u64,
    pub sent_ns: u64,
    pub received_ns: u64,
    pub entered_ns: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_output_ns: Option<u64>,
    /// The shell held the image loaded ahead (nothing was loaded on the way).
    #[serde(default)]
    pub preloaded: bool,
}

/// `GET /v1/pool` and `PUT /v1/pool`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct PoolInfo {
    /// Ready shells wanted per memory size (bytes → count).
    pub target: Vec<PoolTarget>,
    /// Ready shells now per memory size.
    #[serde(default)]
    pub ready: Vec<PoolTarget>,
    /// Of those, the shells that hold an image loaded ahead (the one last
    /// created with their size): a create of it skips loading it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub loaded: Vec<PoolImage>,
    /// Groups of VMs (`wispd --vms-per-process`) whose next VM is prepared:
    /// its thread waits with its shell entered, its directory is made.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub group_spares: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// Ready shells of one memory size holding one image loaded ahead.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct PoolImage {
    /// Guest RAM in bytes.
    pub mem: u64,
    /// The image's name.
    pub image: String,
    /// How many.
    pub count: u32,
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

/// `POST /v1/vms/{id}/snapshot`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct SnapshotVm {
    /// Where to write it: an absolute path the daemon creates (or
    /// replaces) with the client's rights.
    pub path: String,
    /// Stop the VM once it is saved (else it goes on).
    #[serde(default, skip_serializing_if = "is_false")]
    pub stop: bool,
    /// Only the pages written since the VM's last snapshot through this
    /// daemon (its base, named in the file): restore it with its bases.
    #[serde(default, skip_serializing_if = "is_false")]
    pub incremental: bool,
}

/// A snapshot taken.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct SnapshotInfo {
    /// The VM's id.
    pub vm: String,
    /// The file written.
    pub path: String,
    /// Its bytes, and the bytes of guest RAM in them.
    pub bytes: u64,
    pub ram_bytes: u64,
    /// Microseconds the VM was held for it (it ran on meanwhile otherwise).
    pub held_us: u64,
    /// Microseconds from the request's arrival to the file's last byte.
    pub took_us: u64,
    /// SHA-256 of the file (hex), as its header holds it.
    pub digest: String,
    /// An incremental snapshot's base (hex).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<String>,
}

/// `POST /v1/vms/{id}/update`: a live update of one of the VM's shared
/// libraries (`docs/libraries.md`).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct UpdateLib {
    /// The new library: an absolute path the daemon opens with the
    /// client's rights.
    pub path: String,
    /// The library it replaces, by name (default: the new file's stem).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replace: Option<String>,
    /// Longest wait for the guest to reach a point where it runs no
    /// library code, in ms (default 5,000; at most 60,000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_ms: Option<u64>,
}

/// `POST /v1/recyclers`: a recycler endpoint for one application library
/// (`docs/libraries.md`, "Recycler endpoints").
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct AddRecycler {
    /// The application library: an absolute path of a `NAME.so` file the
    /// daemon opens with the client's rights and checks.
    pub lib: String,
    /// Guest RAM of its recyclers (default: the daemon's default size).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem: Option<u64>,
    /// Whose recycling group runs it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
}

/// A recycler endpoint: a socket at which `POST /v1/vms?attach=true` runs
/// the app on a recycler kept at its ready point, answered by the VMM
/// process itself (the console as chunks, the exit status in the
/// `X-Wisp-Exit` trailer).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct RecyclerInfo {
    /// Its id.
    pub id: String,
    /// The socket to send runs to (only its owner may connect).
    pub socket: String,
    /// The library's path as given, and the app's name (its stem).
    pub lib: String,
    pub app: String,
    /// Guest RAM of its recycler, bytes.
    pub mem: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// The user id that added it (the socket's owner).
    pub uid: u32,
    /// The recycling group (VMM process) that serves it.
    pub group: String,
    /// Microseconds from the request until its recycler was at its ready
    /// point.
    pub ready_us: u64,
}

/// `POST /v1/jit`: serve a host port with an image, just in time: the
/// first connection from a new client address boots a VM of the image that
/// serves that client (this and its later connections), and a VM that has
/// had no connection for `idle_ms` is removed (`docs/usecases.md`,
/// "Just-in-time VMs").
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct AddJit {
    /// The image each client's VM runs (it serves TCP on `port.vm`).
    pub image: String,
    /// The host port (and address, by default 127.0.0.1) served, and the
    /// VM's port its connections go to.
    pub port: PortMap,
    /// The VMs' arguments.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Guest RAM of each VM (default: the daemon's default size).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem: Option<u64>,
    /// A client's VM with no connection for this long is removed, in ms
    /// (default 30,000; 10 to 86,400,000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_ms: Option<u64>,
    /// Most VMs (clients) at once; a new client beyond is refused
    /// (default and most: 4,096).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_vms: Option<u32>,
    /// Whose VMs they are.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
}

/// Bounds of [`AddJit`]'s numbers.
pub const JIT_IDLE_MS: std::ops::RangeInclusive<u64> = 10..=86_400_000;
/// Most VMs one just-in-time service keeps.
pub const JIT_MAX_VMS: u32 = 4096;

/// A just-in-time service.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct JitInfo {
    /// Its id.
    pub id: String,
    pub image: String,
    pub port: PortMap,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    pub mem: u64,
    pub idle_ms: u64,
    pub max_vms: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// VMs booted, connections served, and connections refused or failed
    /// (over the caps, a VM that did not start or answer) since it began.
    pub boots: u64,
    pub connections: u64,
    pub failed: u64,
    /// Each client's VM now.
    #[serde(default)]
    pub clients: Vec<JitClient>,
}

/// One client of a just-in-time service and its VM.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct JitClient {
    /// The client's address.
    pub client: String,
    /// Its VM's id and address.
    pub vm: String,
    pub ip: String,
    /// Connections served by it, and open now.
    pub connections: u64,
    pub open: u32,
    /// Microseconds from its first connection's arrival to the VM taking
    /// it (the VM booted, its port answering).
    pub boot_us: u64,
}

/// A live update done.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct UpdateInfo {
    /// The VM's id.
    pub vm: String,
    /// The library replaced (its name stays).
    pub library: String,
    /// The new library's file.
    pub path: String,
    /// Microseconds from the request's arrival to the old library unmapped.
    pub took_us: u64,
    /// Microseconds the VMM process took, of which the guest was held
    /// (its switch), and waited for (to reach a point where it runs no
    /// library code).
    pub update_us: u64,
    pub held_us: u64,
    pub quiesce_us: u64,
    /// Variables carried over, pointers moved with them, and pointers into
    /// the old library left as they were (not to an export).
    pub variables: u64,
    pub pointers: u64,
    pub stale: u64,
}

/// `POST /v1/vms/{id}/migrate`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct MigrateVm {
    /// The destination daemon's migration address, `ADDRESS:PORT`
    /// (`wispd --migrate-listen`).
    pub to: String,
}

/// A VM moved.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct MigrateInfo {
    /// Its id here (gone now).
    pub vm: String,
    pub to: String,
    /// Its id at the destination.
    pub there: String,
    /// Bytes of its snapshots sent.
    pub bytes: u64,
    /// Microseconds from its pause here to its running there.
    pub downtime_us: u64,
    /// Microseconds from the request's arrival to the end.
    pub took_us: u64,
}

/// `POST /v1/templates`: boot `image` and save it when its guest says it is
/// ready (`wisp::ready`); VMs start from it with `CreateVm::from`.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct CreateTemplate {
    /// The template's name (as a VM name: 1-64 of [A-Za-z0-9_.-]); one of
    /// the same name is replaced.
    pub name: String,
    /// Image path (absolute) or a bundled app name.
    pub image: String,
    /// Its arguments.
    #[serde(default)]
    pub args: Vec<String>,
    /// Guest RAM in bytes (default 16 MiB).
    #[serde(default)]
    pub mem: Option<u64>,
    /// Longest the guest may take to say it is ready (default 30 s).
    #[serde(default)]
    pub timeout_ms: Option<u64>,
}

/// A template.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct TemplateInfo {
    pub name: String,
    /// The image it was booted from.
    pub image: String,
    pub args: Vec<String>,
    pub mem: u64,
    /// Bytes of its snapshot, and of guest RAM in it.
    pub bytes: u64,
    pub ram_bytes: u64,
    /// The VM that was booted and saved (it has exited).
    pub vm: String,
    /// Microseconds from the request's arrival to the snapshot saved.
    pub made_us: u64,
    /// When it was made (ms since the epoch).
    pub created_ms: u64,
}

/// Most VMs one `POST /v1/vms/remove` may name.
pub const MAX_REMOVE: usize = 1024;

/// `POST /v1/vms/remove`: remove many VMs in one request (with `force`,
/// running ones are killed first, in waves).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RemoveVms {
    /// VM ids, unique id prefixes or names (at most [`MAX_REMOVE`]).
    pub vms: Vec<String>,
    /// Kill running VMs first.
    #[serde(default)]
    pub force: bool,
}

/// What `POST /v1/vms/remove` did: the ids of the VMs removed, and why each
/// of the others was not.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct RemovedVms {
    /// Ids of the VMs removed.
    pub removed: Vec<String>,
    /// The VMs not removed, as named in the request, and why.
    pub failed: Vec<RemoveFailure>,
}

/// One VM that `POST /v1/vms/remove` did not remove.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct RemoveFailure {
    /// The VM as the request named it.
    pub vm: String,
    /// Why not.
    pub error: String,
}

/// `GET /v1/version`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Version {
    /// Daemon version.
    pub version: String,
    /// Hypercall ABI version of its monitor.
    pub abi: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_maps_parse_and_keep_old_json() {
        let pm = |host, vm, addr: Option<&str>| PortMap { host, vm, addr: addr.map(|a| a.parse().unwrap()) };
        assert_eq!("8013:13".parse(), Ok(pm(8013, 13, None)));
        assert_eq!("0.0.0.0:8013:13".parse(), Ok(pm(8013, 13, Some("0.0.0.0"))));
        assert_eq!("10.99.0.1:80:8080".parse(), Ok(pm(80, 8080, Some("10.99.0.1"))));
        assert_eq!("[::1]:8013:13".parse(), Ok(pm(8013, 13, Some("::1"))));
        for bad in ["8013", "0:13", "8013:0", "x:8013:13", "1.2.3.4:5", "::1:8013:13", "[::1]8013:13", "a:b:c:d", ""] {
            assert!(bad.parse::<PortMap>().is_err(), "{bad}");
        }
        assert_eq!("300.1.1.1:1:2".parse::<PortMap>().unwrap_err(), "'300.1.1.1' is not an IPv4 address");
        // Requests and records without an address still read; one without is written as before.
        let old: PortMap = serde_json::from_str(r#"{"host":8013,"vm":13}"#).unwrap();
        assert_eq!((old, old.host_addr()), (pm(8013, 13, None), PortMap::DEFAULT_ADDR));
        assert_eq!(serde_json::to_string(&old).unwrap(), r#"{"host":8013,"vm":13}"#);
        let any = pm(8013, 13, Some("0.0.0.0"));
        assert_eq!(serde_json::to_string(&any).unwrap(), r#"{"host":8013,"vm":13,"addr":"0.0.0.0"}"#);
        assert!(serde_json::from_str::<PortMap>(r#"{"host":1,"vm":2,"addr":"nowhere"}"#).is_err());
    }
}
