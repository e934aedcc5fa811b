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
//! `console` (console streams), `family` (forked VMs), `record` (the
//! daemon's own state), `adopt` (VMs left by a previous daemon), `error`
//! (the typed errors of actions).

use std::fs;
use std::io;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustix::event::epoll;
use wisp_api::action::Action;
use wisp_api::{ExitInfo, PoolInfo, Version, VmInfo};

use crate::images::ImageCache;
use crate::pool::{Pool, Shells};

mod adopt;
mod console;
mod create;
mod error;
mod family;
mod lifecycle;
mod net;
pub mod process;
mod record;
mod table;
mod uids;
mod watch;

pub use console::Console;
pub use error::ActionError;
use net::VmNet;
use process::{SpawnError, Worker};
use record::Records;
use table::VmTable;
use uids::{dir_uid, Uids};
pub use uids::UID_BASE;

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
}

/// What an action gives back.
pub enum Outcome {
    /// The daemon's version.
    Version(Version),
    /// Every VM.
    Vms(Vec<VmInfo>),
    /// A VM just created.
    Created(VmInfo),
    /// A VM just created, and its console until it ends.
    Attached(VmInfo, Console),
    /// A VM (as it is after the action).
    Vm(VmInfo),
    /// How a VM ended.
    Exit(ExitInfo),
    /// A VM's console output.
    Logs(Console),
    /// The VM is gone.
    Removed,
    /// The pool.
    Pool(PoolInfo),
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
}

/// Default grace period of a stop, in ms.
const DEFAULT_GRACE_MS: u64 = 2000;
/// Longest grace period of a stop, in ms.
const MAX_GRACE_MS: u64 = 600_000;

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
    epoll: OwnedFd,
    uids: Uids,
    net: VmNet,
    records: Records,
    /// The PID namespace VMM processes start in (none if it could not be
    /// made: they then live in the daemon's, and the daemon says so).
    pidns: Option<crate::pidns::PidNs>,
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
        let net = VmNet::new(&cfg.bridge, cfg.subnet);
        let pidns = crate::pidns::PidNs::open_or_create(&cfg.state_dir)
            .inspect_err(|e| eprintln!("wispd: no PID namespace for VMM processes ({e}): they share the daemon's"))
            .inspect(|ns| eprintln!("wispd: VMM processes start in the PID namespace of process {}", ns.pid))
            .ok();
        let d = Arc::new(Daemon {
            cfg,
            vms: VmTable::default(),
            pool: Arc::new(Pool::default()),
            images: ImageCache::default(),
            epoll,
            uids: Uids::default(),
            net,
            records: Records::new(meta),
            pidns,
        });
        d.adopt(old_layout);
        Ok(d)
    }

    /// Execute one action.
    pub fn handle(&self, action: Action) -> Result<Outcome, ActionError> {
        Ok(match action {
            Action::Version => {
                Outcome::Version(Version { version: env!("CARGO_PKG_VERSION").into(), abi: wisp_abi::ABI_VERSION })
            }
            Action::ListVms => Outcome::Vms(self.vms.lock().list()),
            Action::CreateVm { vm, attach: false } => Outcome::Created(self.create(vm)?),
            Action::CreateVm { vm, attach: true } => {
                let (info, console) = self.create_attached(vm)?;
                Outcome::Attached(info, console)
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
            Action::Logs { vm, follow } => Outcome::Logs(self.logs(&vm, follow)?),
            Action::RemoveVm { vm, force } => {
                self.remove(&vm, force)?;
                Outcome::Removed
            }
            Action::GetPool => Outcome::Pool(self.pool.info()),
            Action::SetPool(p) => {
                self.pool.set_targets(&p.target)?;
                Outcome::Pool(self.pool.info())
            }
        })
    }

    fn vms_dir(&self) -> PathBuf {
        self.cfg.state_dir.join("vms")
    }

    /// Spawn a VMM process with a prepared shell of `mem` bytes and wait
    /// until it is ready.
    fn spawn_worker(&self, mem: u64) -> Result<Worker, SpawnError> {
        process::spawn(&self.vms_dir(), &self.records, &self.uids, self.pidns.as_ref(), mem)
    }

    /// Stop an unused VMM process and remove its directory.
    fn discard_worker(&self, mut w: Worker) {
        process::stop(&mut w);
        self.remove_dir(&w.dir);
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
            if !self.vms.lock().uid_in_use(u) {
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
    fn spawn(&self, mem: u64) -> Result<Worker, SpawnError> {
        self.spawn_worker(mem)
    }

    fn discard(&self, w: Worker) {
        self.discard_worker(w)
    }
}
