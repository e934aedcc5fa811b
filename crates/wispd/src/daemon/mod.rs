//! The daemon: its state and the actions it executes (after Firecracker's
//! `RuntimeApiController`). The API router turns each HTTP request into a
//! [`wisp_api::action::Action`]; [`Daemon::handle`] runs it and answers
//! with an [`Outcome`] or a typed [`ActionError`].
//!
//! There is no central store on the boot path: a VM's whole configuration
//! travels in its `start` request and lands in its own boot-info page. The
//! daemon only keeps, per VMM process, a small record in `meta/<id>.json`
//! (`record`), where no VMM process can write, so a restarted daemon can
//! find and re-adopt every VMM process; a VM's own directory `vms/<id>/`
//! holds only what its VMM process produces (console, exit status), read
//! back as untrusted input.
//!
//! Rooms: `table` (the VMs, names, lookup, waiting), `uids` (user ids of
//! VMM processes), `net` (bridge, addresses, taps), `process` (spawning
//! and stopping VMM processes, their directories), `watch` (exits), `create`
//! (creating a VM, with its rollback), `lifecycle` (everything after),
//! `remove` (removing one VM, a family, many at once), `group` (VMM
//! processes that hold many VMs),
//! `console` (console streams), `family` (forked VMs), `record` (the
//! daemon's own state), `adopt` (VMs left by a previous daemon), `quota`
//! (what the daemon admits, what each family may use; the families'
//! control groups are `crate::cgroup`), `error` (the typed errors of
//! actions), `scrape` (`GET /metrics`).

use std::fs;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rustix::event::epoll;
use wisp_api::action::Action;
use wisp_api::{ExitInfo, PoolInfo, Version, VmInfo};

use crate::cgroup::{CgroupError, Cgroups};
use crate::images::{CachedImage, ImageCache};
use crate::pool::{Pool, PoolError, Shells};

mod adopt;
mod console;
mod create;
mod error;
mod family;
mod group;
mod guestdata;
mod lifecycle;
mod libs;
mod links;
pub mod migrate;
mod net;
pub mod process;
mod quota;
mod record;
mod jit;
mod recyclers;
mod remove;
mod scrape;
mod snapshot;
mod table;
mod template;
mod uids;
mod watch;

pub use console::Console;
pub use error::ActionError;
pub use quota::Quotas;
use net::VmNet;
use process::{SpawnError, Worker};
use record::Records;
use table::VmTable;
use uids::{dir_uid, Uids};

/// Daemon configuration.
#[derive(Clone, Debug)]
pub struct Config {
    /// State directory (`vms/<id>/` per VM, `meta/<id>.json` per VMM process).
    pub state_dir: PathBuf,
    /// Directories searched for bundled images by name.
    pub image_dirs: Vec<PathBuf>,
    /// Bridge the VMs' taps are attached to.
    pub bridge: String,
    /// VM subnet: network address and prefix; the bridge takes host 1.
    pub subnet: ([u8; 4], u8),
    /// Where links' subnets may lie (`wispd --link-subnets`).
    pub link_subnets: ([u8; 4], u8),
    /// What the daemon admits.
    pub quotas: Quotas,
    /// Most shells the pool keeps, all sizes together.
    pub max_pool_shells: u32,
    /// Most bytes of images the image cache keeps.
    pub image_cache_bytes: u64,
    /// Contain each family in a control group (off: no memory, pids or CPU
    /// limits at all).
    pub cgroups: bool,
    /// Most VMs one VMM process holds (1: a process per VM; more: the VMs
    /// of one tenant and size that a group can hold share one, `group`).
    pub vms_per_process: u32,
    /// Runs a recycling group hosts at once (`wisp run --recycle`).
    pub recyclers_per_process: u32,
    /// The key migrating daemons share (`migrate.rs`); none: this daemon
    /// neither sends nor takes VMs.
    pub migrate_key: Option<Vec<u8>>,
}

/// What an action gives back.
pub enum Outcome {
    /// The daemon's version.
    Version(Version),
    /// Every VM.
    Vms(Vec<VmInfo>),
    /// The metrics, in Prometheus' text format (`scrape.rs`).
    Metrics(String),
    /// A VM just created.
    Created(VmInfo),
    /// A VM just created whose VMM process now answers the client (on
    /// its connection, handed over): the connection is used up.
    HandedOver,
    /// A VM (as it is after the action).
    Vm(VmInfo),
    /// How a VM ended.
    Exit(ExitInfo),
    /// A VM's console output.
    Logs(Console),
    /// The VM is gone.
    Removed,
    /// What a batch removal did.
    RemovedVms(wisp_api::RemovedVms),
    /// The pool.
    Pool(PoolInfo),
    /// A snapshot taken.
    Snapshot(wisp_api::SnapshotInfo),
    /// A template made.
    Template(wisp_api::TemplateInfo),
    /// Every template.
    Templates(Vec<wisp_api::TemplateInfo>),
    /// A VM moved to another daemon.
    Migrated(wisp_api::MigrateInfo),
    /// A library of a VM replaced while it runs.
    Updated(wisp_api::UpdateInfo),
    /// A recycler endpoint made.
    Recycler(wisp_api::RecyclerInfo),
    /// Every recycler endpoint.
    Recyclers(Vec<wisp_api::RecyclerInfo>),
    /// A just-in-time service started.
    Jit(wisp_api::JitInfo),
    /// Every just-in-time service.
    Jits(Vec<wisp_api::JitInfo>),
}

/// Why the daemon could not start.
#[derive(Debug, thiserror::Error)]
pub enum InitError {
    /// The state directory.
    #[error("state dir: {0}")]
    StateDir(io::Error),
    /// The exit watcher's epoll.
    #[error("epoll: {0}")]
    Epoll(rustix::io::Errno),
    /// Control groups for the families.
    #[error("resource containment: {0} (wispd --no-cgroups runs without it: no memory, pids or CPU limits)")]
    Cgroup(#[from] CgroupError),
}

/// Default grace period of a stop, in ms.
const DEFAULT_GRACE_MS: u64 = 2000;
/// Longest grace period of a stop, in ms.
const MAX_GRACE_MS: u64 = 600_000;

/// Bytes as lower-case hex digits (digests, nonces, MACs).
fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Milliseconds since the Unix epoch.
fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// The daemon.
pub struct Daemon {
    /// Configuration.
    pub cfg: Config,
    vms: VmTable,
    /// Ready shells.
    pub pool: Arc<Pool>,
    images: ImageCache,
    /// Snapshots checked for restores, by file identity.
    snapshots: snapshot::SnapshotCache,
    libs: libs::LibCache,
    epoll: OwnedFd,
    uids: Uids,
    net: Arc<VmNet>,
    records: Records,
    /// The PID namespace VMM processes start in (none if it could not be
    /// made: they then live in the daemon's, and the daemon says so).
    pidns: Option<crate::pidns::PidNs>,
    /// The families' control groups (none with `--no-cgroups`).
    cgroups: Option<Cgroups>,
    /// CPUs this host gives the daemon.
    host_cpus: usize,
    /// Group VMM processes (`--vms-per-process`).
    groups: group::Groups,
    /// Recycler endpoints (`recyclers.rs`).
    recyclers: recyclers::Recyclers,
    /// Just-in-time services (`jit.rs`).
    jits: jit::Jits,
    links: links::Links,
    /// Boot latencies (`scrape.rs`: what they measure).
    boot_seconds: crate::metrics::Histogram,
    /// The daemon itself, for work it starts on threads of their own (a
    /// group made ahead, `group.rs`).
    me: std::sync::OnceLock<std::sync::Weak<Daemon>>,
}

impl Daemon {
    /// Create the daemon: state directory, epoll, re-adoption of the VMs a
    /// previous daemon left running.
    ///
    /// `vms/` and `meta/` are the daemon's alone (0700, not links): a VMM
    /// process cannot reach another VM's directory, nor the records, by a
    /// path. A state directory without `meta/` was written by a daemon that
    /// kept its records inside the VMs' directories: it is migrated once.
    pub fn new(cfg: Config) -> Result<Arc<Daemon>, InitError> {
        fs::create_dir_all(&cfg.state_dir).map_err(InitError::StateDir)?;
        let meta = cfg.state_dir.join("meta");
        let old_layout = fs::symlink_metadata(&meta).is_err();
        for dir in [&cfg.state_dir.join("vms"), &meta] {
            crate::fsutil::private_dir(dir).map_err(InitError::StateDir)?;
        }
        let epoll = epoll::create(epoll::CreateFlags::CLOEXEC).map_err(InitError::Epoll)?;
        let net = Arc::new(VmNet::new(&cfg.bridge, cfg.subnet));
        let pidns = crate::pidns::PidNs::open_or_create(&cfg.state_dir)
            .inspect_err(|e| eprintln!("wispd: no PID namespace for VMM processes ({e}): they share the daemon's"))
            .inspect(|ns| eprintln!("wispd: VMM processes start in the PID namespace of process {}", ns.pid))
            .ok();
        let cgroups = if cfg.cgroups { Some(Cgroups::init()?) } else { None };
        match &cgroups {
            Some(c) => eprintln!("wispd: families' control groups: {}", c.describe()),
            None => eprintln!("wispd: --no-cgroups: VMs run without memory, pids or CPU limits"),
        }
        let d = Arc::new(Daemon {
            pool: Arc::new(Pool::new(cfg.max_pool_shells)),
            images: ImageCache::new(cfg.image_cache_bytes),
            snapshots: snapshot::SnapshotCache::default(),
            libs: libs::LibCache::default(),
            cfg,
            vms: VmTable::default(),
            epoll,
            uids: Uids::default(),
            net,
            records: Records::new(meta),
            pidns,
            cgroups,
            host_cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            groups: group::Groups::default(),
            recyclers: recyclers::Recyclers::default(),
            jits: jit::Jits::default(),
            links: links::Links::default(),
            boot_seconds: crate::metrics::Histogram::new(&scrape::BOOT_BUCKETS),
            me: std::sync::OnceLock::new(),
        });
        d.groups.set_net(d.net.clone());
        let _ = d.me.set(Arc::downgrade(&d));
        d.adopt(old_layout);
        Ok(d)
    }

    /// Execute one action, whose request arrived at `arrived`.
    pub fn handle(self: &Arc<Self>, action: Action, arrived: Instant, client: &UnixStream) -> Result<Outcome, ActionError> {
        Ok(match action {
            Action::Version => {
                Outcome::Version(Version { version: env!("CARGO_PKG_VERSION").into(), abi: wisp_abi::ABI_VERSION })
            }
            Action::ListVms => Outcome::Vms(self.vms.lock().list()),
            Action::Metrics => Outcome::Metrics(self.metrics()),
            Action::CreateVm { vm, attach, wait_line } => {
                let vols = guestdata::volumes(&vm, client)?;
                let restore = match (&vm.restore, &vm.from) {
                    (Some(p), _) => Some(self.restorable(p, client)?),
                    (None, Some(t)) => Some(self.template_snapshot(t)?),
                    (None, None) => None,
                };
                let bases = vm.bases.iter().map(|p| self.restorable(p, client)).collect::<Result<Vec<_>, _>>()?;
                let libs = self.libraries(&vm, client)?;
                let extras = create::Extras { vols, restore, bases, template: None, hold: None, libs };
                match (attach, wait_line) {
                    (false, false) => Outcome::Created(self.create(vm, arrived, extras)?),
                    (false, true) => Outcome::Created(self.create_wait_line(vm, arrived, extras)?),
                    (true, _) => {
                        self.create_handed_over(vm, arrived, client, extras)?;
                        Outcome::HandedOver
                    }
                }
            }
            Action::MigrateVm { vm, body } => Outcome::Migrated(self.migrate_vm(&vm, body, arrived)?),
            Action::MakeTemplate(t) => Outcome::Template(self.make_template(t, arrived)?),
            Action::ListTemplates => Outcome::Templates(self.templates()?),
            Action::RemoveTemplate(name) => {
                self.remove_template(&name)?;
                Outcome::Removed
            }
            Action::GetVm(vm) => Outcome::Vm(self.get(&vm)?),
            Action::PauseVm(vm) => Outcome::Vm(self.pause(&vm, true)?),
            Action::ResumeVm(vm) => Outcome::Vm(self.pause(&vm, false)?),
            Action::StopVm { vm, grace_ms } => {
                let grace = Duration::from_millis(grace_ms.unwrap_or(DEFAULT_GRACE_MS).min(MAX_GRACE_MS));
                Outcome::Vm(self.stop(&vm, grace)?)
            }
            Action::KillVm(vm) => Outcome::Vm(self.kill(&vm)?),
            Action::WaitVm(vm) => Outcome::Exit(self.wait(&vm, None)?),
            Action::Stdin(vm) => {
                self.stdin(&vm, client)?;
                Outcome::HandedOver
            }
            Action::Logs { vm, follow, stderr } => Outcome::Logs(self.logs(&vm, follow, stderr)?),
            Action::RemoveVm { vm, force, family: false } => {
                self.remove(&vm, force)?;
                Outcome::Removed
            }
            Action::RemoveVm { vm, force, family: true } => {
                self.remove_family(&vm, force)?;
                Outcome::Removed
            }
            Action::RemoveVms(r) => Outcome::RemovedVms(self.remove_many(&r.vms, r.force)),
            Action::SnapshotVm { vm, body } => Outcome::Snapshot(self.snapshot(&vm, body, client, arrived)?),
            Action::UpdateLib { vm, body } => Outcome::Updated(self.update_lib(&vm, body, client, arrived)?),
            Action::AddRecycler(r) => Outcome::Recycler(self.add_recycler(r, client, arrived)?),
            Action::ListRecyclers => Outcome::Recyclers(self.recyclers()),
            Action::RemoveRecycler(id) => {
                self.remove_recycler(&id)?;
                Outcome::Removed
            }
            Action::AddJit(j) => Outcome::Jit(self.add_jit(j)?),
            Action::ListJits => Outcome::Jits(self.jits()),
            Action::RemoveJit(id) => {
                self.remove_jit(&id)?;
                Outcome::Removed
            }
            Action::GetPool => Outcome::Pool(wisp_api::PoolInfo { group_spares: self.groups.spares(), ..self.pool.info() }),
            Action::SetPool(p) => {
                self.pool.set_targets(&p.target)?;
                Outcome::Pool(self.pool.info())
            }
        })
    }

    fn vms_dir(&self) -> PathBuf {
        self.cfg.state_dir.join("vms")
    }

    /// Spawn a VMM process with a prepared shell of `mem` bytes, in a
    /// control group of its own with a family's default limits, and wait
    /// until it is ready.
    fn spawn_worker(&self, mem: u64) -> Result<Worker, SpawnError> {
        let limits = quota::family_limits(mem, None, None, None);
        let cg = self.cgroups.as_ref().map(|c| (c, &limits));
        let mut w = process::spawn(&self.vms_dir(), &self.records, &self.uids, self.pidns.as_ref(), mem, cg, None, false)?;
        // Its family's uplink, watched from now on (nothing comes on it
        // before the VM runs and forks): off a create's path.
        w.uplink = process::uplink_pair();
        if let Some((mine, _)) = &w.uplink {
            self.watch_uplink(&w.id, mine.as_fd());
        }
        Ok(w)
    }

    /// Stop an unused VMM process and remove its directory and group.
    fn discard_worker(&self, mut w: Worker) {
        self.net.release(&w.id);
        process::stop(&mut w);
        self.destroy_group(&w.id);
        self.remove_dir(&w.dir);
    }

    /// Kill whatever is left in family `root`'s control group and remove it.
    fn destroy_group(&self, root: &str) {
        if let Some(c) = &self.cgroups {
            if let Err(e) = c.destroy(root) {
                eprintln!("wispd: family {root}: {e}");
            }
        }
    }

    /// Family `root` has no VM running any more: its control group goes if
    /// it is empty (without waiting; what is left in it is killed when the
    /// family's last VM is removed).
    fn family_ended(&self, root: &str) {
        if let Some(c) = &self.cgroups {
            if self.vms.lock().family_count(root).1 == 0 {
                c.remove_if_empty(root);
            }
        }
    }

    /// Set the pool's target for shells of `mem` bytes (within its bounds).
    pub fn set_pool_target(&self, mem: u64, count: u32) -> Result<(), PoolError> {
        self.pool.set_target(mem, count)
    }

    /// Remove a VM directory and its record, and give its user id back
    /// (unless another VM of its family still has it).
    fn remove_dir(&self, dir: &Path) {
        let uid = dir_uid(dir);
        if let Some(id) = dir.file_name().and_then(|n| n.to_str()) {
            self.records.forget(id);
        }
        let _ = fs::remove_dir_all(dir);
        if let Some(u) = uid {
            if !self.vms.lock().uid_in_use(u) && !self.groups.holds_uid(u) {
                self.uids.free(u);
            }
        }
    }

    /// Write VM `id`'s record again, as the table has it now.
    fn save(&self, id: &str) -> io::Result<()> {
        self.records.save(id, || self.vms.lock().by_id.get(id).map(|e| e.info.clone()))
    }

    /// Stop the pool's shells (daemon shutdown). Running VMs keep running.
    pub fn shutdown(&self) {
        for w in self.pool.drain() {
            self.discard_worker(w);
        }
    }
}

impl Shells for Daemon {
    fn spawn(&self, mem: u64, image: Option<&Arc<CachedImage>>) -> Result<Worker, SpawnError> {
        let mut w = self.spawn_worker(mem)?;
        // Still in the background (the refill's priority): its tap, the
        // preload too.
        self.net.prepare(&w.id);
        match image.map_or(Ok(()), |i| process::preload(&mut w, i)).and_then(|()| process::to_foreground(&w)) {
            Ok(()) => Ok(w),
            Err(e) => {
                self.discard_worker(w);
                Err(e)
            }
        }
    }

    fn preload(&self, mut w: Worker, image: &Arc<CachedImage>) -> Option<Worker> {
        match process::preload(&mut w, image) {
            Ok(()) => Some(w),
            Err(e) => {
                eprintln!("wispd: pool: {e}");
                self.discard_worker(w);
                None
            }
        }
    }

    fn discard(&self, w: Worker) {
        self.discard_worker(w)
    }
}
