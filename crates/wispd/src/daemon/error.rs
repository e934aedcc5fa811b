//! The typed error of every action (after Firecracker's `VmmActionError`).
//! Each variant carries what its message needs; the message is the one the
//! API answers with, and the HTTP status of each variant is chosen in one
//! place, by the router (`api.rs`).

use std::io;

use wisp_api::action::LimitError;

use super::net::NetError;
use super::process::SpawnError;
use crate::cgroup::CgroupError;
use crate::images::ImageError;
use crate::pool::PoolError;

/// A size in bytes for people: whole MiB as such.
pub struct Size(pub u64);

impl std::fmt::Display for Size {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            b if b % (1 << 20) == 0 => write!(f, "{} MiB", b >> 20),
            b => write!(f, "{b} bytes"),
        }
    }
}

/// Why an action failed.
#[derive(Debug, thiserror::Error)]
pub enum ActionError {
    /// The memory size cannot be used.
    #[error("{0}")]
    BadMemory(wisp_vmm::Error),
    /// The name is not a valid VM name.
    #[error("invalid name '{0}': use 1-64 of [A-Za-z0-9_.-]")]
    InvalidName(String),
    /// The environment or files cannot be given to a guest.
    #[error("{0}")]
    GuestData(String),
    /// The VM's standard input cannot be taken.
    #[error("standard input: {0}")]
    StdinRefused(String),
    /// The request's options do not fit together (options of a NIC
    /// without one).
    #[error(transparent)]
    Invalid(#[from] wisp_api::action::InvalidCreate),
    /// The image cannot be found, read or used.
    #[error(transparent)]
    BadImage(#[from] ImageError),
    /// The VMM process refused to start the VM (its message).
    #[error("{0}")]
    StartRefused(String),
    /// A pool size that cannot be used.
    #[error(transparent)]
    Pool(#[from] PoolError),
    /// No VM has this id, id prefix or name.
    #[error("no such VM: {0}")]
    NotFound(String),
    /// The VM was removed while the action waited for it.
    #[error("VM {0} was removed")]
    Gone(String),
    /// Another VM has this name.
    #[error("the name '{0}' is already in use")]
    NameInUse(String),
    /// The id prefix names several VMs.
    #[error("'{0}' matches several VMs")]
    Ambiguous(String),
    /// The VM has exited.
    #[error("VM {0} has exited")]
    Exited(String),
    /// The VM runs, and the action needs it ended.
    #[error("VM {0} is running: stop it first or force removal")]
    Running(String),
    /// The VMM process refused a control request (its message).
    #[error("{0}")]
    Refused(String),
    /// The VMM process's control socket did not answer.
    #[error("VM {id} is not reachable: {source}")]
    Unreachable { id: String, source: io::Error },
    /// A host port to forward is taken.
    #[error("cannot forward host port {port}: {source}")]
    PortInUse { port: u16, source: io::Error },
    /// The VM did not exit in time.
    #[error("VM {0} did not exit in time")]
    Timeout(String),
    /// A create with `wait_line`: the VM ended before its first console line.
    #[error("VM {id} ended before its first console line ({reason})")]
    EndedBeforeLine { id: String, reason: String },
    /// A create with `wait_line`: no complete console line within the
    /// deadline. The VM is left running.
    #[error("VM {id} printed no complete console line within {} s; it is still running", waited.as_secs())]
    NoLineInTime { id: String, waited: std::time::Duration },
    /// No VMM process could be prepared.
    #[error("cannot prepare a VM: {0}")]
    Prepare(SpawnError),
    /// A link (`CreateVm::links`) could not be made as asked.
    #[error("cannot make the VM's link: {0}")]
    Link(String),
    /// A link's subnet is another's (a VM's link, a host route).
    #[error("{0}")]
    LinkTaken(String),
    /// The VM's NIC could not be set up.
    #[error("cannot set up the VM's network: {0}")]
    Network(NetError),
    /// The VM's record (`meta/<id>.json`) could not be written.
    #[error("cannot record the VM: {0}")]
    Record(io::Error),
    /// Talking to the VMM process failed.
    #[error("VMM process: {0}")]
    Vmm(io::Error),
    /// The limits asked for cannot be used.
    #[error(transparent)]
    Limits(#[from] LimitError),
    /// More CPUs than the host has.
    #[error("cpus {asked}: this host has {host} CPUs")]
    TooManyCpus { asked: f64, host: usize },
    /// A memory limit too small for the VM itself.
    #[error("memory limit {} is below one VM of this size and its monitor ({})", Size(*memory), Size(*min))]
    MemoryBelowVm { memory: u64, min: u64 },
    /// Limits asked of a daemon that runs without control groups.
    #[error("memory and cpus limits need control groups, and this daemon runs without them (wispd --no-cgroups)")]
    NoCgroups,
    /// As many VMs run as the daemon admits.
    #[error("too many VMs: at most {0} may run at once (wispd --max-vms)")]
    TooManyVms(usize),
    /// The guest memory the daemon admits is taken.
    #[error("not enough guest memory: {} asked, {} of {} in use (wispd --max-guest-memory)", Size(*asked), Size(*used), Size(*max))]
    GuestMemory { asked: u64, used: u64, max: u64 },
    /// A migration did not happen (the VM goes on where it was).
    #[error("migration to {to} failed, the VM runs on here: {why}")]
    Migrate { to: String, why: String },
    /// A migration whose end is not known here: the increment went, and no
    /// answer came. The VM stays paused here (it may run there).
    #[error("migration to {to}: no answer after the last increment ({why}); the VM is left paused here: see whether it runs there, then resume or remove it here")]
    MigrateUnknown { to: String, why: String },
    /// The VM is being migrated: nothing else may pause, resume, save or
    /// move it meanwhile.
    #[error("VM {0} is being migrated")]
    Migrating(String),
    /// No template has this name.
    #[error("no such template: {0}")]
    NoTemplate(String),
    /// No recycler endpoint has this id.
    #[error("no such recycler endpoint: {0}")]
    NoRecycler(String),
    /// As many recycler endpoints as the daemon serves.
    #[error("too many recycler endpoints: at most {0}")]
    TooManyRecyclers(usize),
    /// No just-in-time service has this id.
    #[error("no such just-in-time service: {0}")]
    NoJit(String),
    /// As many just-in-time services as the daemon serves.
    #[error("too many just-in-time services: at most {0}")]
    TooManyJits(usize),
    /// A snapshot file cannot be written, read or used (its path and why).
    #[error("snapshot {path}: {why}")]
    Snapshot { path: String, why: String },
    /// The VM's control group could not be given its limits.
    #[error("cannot apply the VM's limits: {0}")]
    Contain(CgroupError),
}
