//! Fork registration: a VMM process forked by a VM of a family (a guest's
//! `fork()`) announces itself on the family's uplink, and the daemon makes
//! it a VM of its own (id, directory, files, control socket, record, table
//! entry).
//!
//! The note comes from a process that runs guest-controlled code, so the
//! exit watcher only reads it (without waiting) and queues it ([`ForkQueue`],
//! bounded in all and per family); the registration runs on a thread of its
//! own, and the answer is sent without waiting: a process that does not
//! read it loses its registration, and stalls nothing.

use std::collections::HashMap;
use std::fs;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::mpsc::{self, SyncSender};
use std::sync::{Arc, Mutex};

use wisp_api::{VmInfo, VmState};
use wisp_jail::JailFiles;
use wisp_vmm_process::proto::{try_recv_packet, try_send_packet, ForkKit, ForkNote};

use super::process::{give_dir, new_vm_dir, open_ours, proc_start, DirError};
use super::record::Proc;
use super::table::Entry;
use super::uids::dir_uid;
use super::{now_ms, Daemon};

/// Ended forked VMs kept per family (older ones are removed).
const FORKED_KEEP: usize = 64;
/// Fork notes waiting for registration, in all.
const QUEUE: usize = 256;
/// Fork notes of one family waiting for registration.
const PER_FAMILY: usize = 8;

/// Why a forked process was not made a VM (told to it, and logged).
#[derive(Debug, thiserror::Error)]
enum ForkError {
    #[error("bad fork note: {0}")]
    BadNote(serde_json::Error),
    #[error("the forking VM is not a VM of this family")]
    NotInFamily,
    #[error("process {0} is a VM already")]
    AlreadyVm(u32),
    #[error("the family has no user id")]
    NoUid,
    #[error("process {0} is not a VMM process of this family")]
    NotOurs(u32),
    #[error("process {0} is not in the family's control group")]
    OutsideGroup(u32),
    #[error("{0}")]
    Quota(super::error::ActionError),
    #[error(transparent)]
    Dir(#[from] DirError),
    #[error("files: {0}")]
    Files(io::Error),
    #[error("bind: {0}")]
    Bind(io::Error),
    #[error("{0}")]
    Record(io::Error),
}

/// A note read from an uplink, with the descriptor to answer on.
struct Job {
    root: String,
    msg: Vec<u8>,
    reply: OwnedFd,
}

/// The fork registration thread and its bounded queue.
pub(super) struct ForkQueue {
    tx: SyncSender<Job>,
    /// Notes waiting per family.
    waiting: Arc<Mutex<HashMap<String, usize>>>,
}

impl ForkQueue {
    /// Start the registration thread ("fork").
    pub(super) fn start(d: Arc<Daemon>) -> io::Result<ForkQueue> {
        let (tx, rx) = mpsc::sync_channel::<Job>(QUEUE);
        let waiting: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
        let w = waiting.clone();
        std::thread::Builder::new().name("fork".into()).spawn(move || {
            for job in rx {
                let root = job.root.clone();
                d.register(job);
                let mut w = w.lock().unwrap();
                if let Some(n) = w.get_mut(&root) {
                    *n -= 1;
                    if *n == 0 {
                        w.remove(&root);
                    }
                }
            }
        })?;
        Ok(ForkQueue { tx, waiting })
    }

    /// Queue a note; false (and the note is dropped, which closes its
    /// answer descriptor) if its family or the queue has too many waiting.
    fn push(&self, job: Job) -> bool {
        let mut w = self.waiting.lock().unwrap();
        let n = w.get(&job.root).copied().unwrap_or(0);
        if n >= PER_FAMILY {
            return false;
        }
        let root = job.root.clone();
        if self.tx.try_send(job).is_err() {
            return false;
        }
        w.insert(root, n + 1);
        true
    }
}

/// A forked process made a VM, to be answered and entered in the table.
struct Child {
    id: String,
    info: VmInfo,
    dir: PathBuf,
    pidfd: OwnedFd,
    /// `exit.json`, `console.log`, `stderr.log`, control socket.
    fds: [OwnedFd; 4],
}

impl Daemon {
    /// A message on family `root`'s uplink: a VMM process forked by one of
    /// its VMs asks to become a VM of its own. Read without waiting and
    /// queued for the registration thread.
    pub(super) fn on_uplink(&self, root: &str, forks: Option<&ForkQueue>) {
        let fd = {
            let t = self.vms.lock();
            t.by_id.get(root).and_then(|e| e.uplink.as_ref()).and_then(|f| f.try_clone().ok())
        };
        let Some(fd) = fd else { return };
        let (msg, fds) = match try_recv_packet(fd.as_fd()) {
            Ok(m) => m,
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => return,
            Err(_) => {
                // Every VMM process of the family has gone.
                self.unwatch(fd.as_fd());
                if let Some(e) = self.vms.lock().by_id.get_mut(root) {
                    e.uplink = None;
                }
                return;
            }
        };
        // The first descriptor is the answer's; any other is closed here.
        let Some(reply) = fds.into_iter().next() else { return };
        let job = Job { root: root.to_string(), msg, reply };
        if !forks.is_some_and(|q| q.push(job)) {
            eprintln!("wispd: family {root}: too many fork notes waiting: one refused");
        }
    }

    /// Register one forked process (on the registration thread) and answer
    /// it without waiting. A process that cannot take its answer is not
    /// registered (its directory and record go again).
    fn register(&self, job: Job) {
        let Job { root, msg, reply } = job;
        // Pids in the note are of the VMM processes' PID namespace, and only
        // what the VMM process says: the child's host pid is the kernel's
        // word (the creator of the socket pair it sent).
        let r = serde_json::from_slice::<ForkNote>(&msg).map_err(ForkError::BadNote).and_then(|note| {
            let cred = rustix::net::sockopt::socket_peercred(&reply).map_err(|_| ForkError::NotOurs(note.child_pid))?;
            self.fork_child(&root, &note, cred.pid.as_raw_nonzero().get() as u32)
        });
        match r {
            Ok(c) => {
                let b: Vec<_> = c.fds.iter().map(|f| f.as_fd()).collect();
                match try_send_packet(reply.as_fd(), &ForkKit { id: Some(c.id.clone()), error: None }, &b) {
                    Ok(()) => self.insert_watched(c.info, c.dir, None, Some(c.pidfd)),
                    Err(e) => {
                        eprintln!("wispd: family {root}: forked process {} did not take its answer ({e}): not registered", c.info.pid);
                        self.records.forget(&c.id);
                        let _ = fs::remove_dir_all(&c.dir);
                    }
                }
            }
            Err(e) => {
                eprintln!("wispd: family {root}: fork refused: {e}");
                let _ = try_send_packet(reply.as_fd(), &ForkKit { id: None, error: Some(e.to_string()) }, &[]);
            }
        }
    }

    /// Make process `child_pid` (host pid; `note.child_pid` in its own
    /// namespace), forked by a VM of family `root`, a VM of the toolstack:
    /// id, directory, files, control socket, record.
    fn fork_child(&self, root: &str, note: &ForkNote, child_pid: u32) -> Result<Child, ForkError> {
        let (parent, uid, old) = {
            let t = self.vms.lock();
            let in_family = |e: &&Entry| super::table::root_of(&e.info) == root;
            // The forking VM may have ended already (fork, then exit at once).
            let e = t
                .by_id
                .values()
                .filter(in_family)
                .find(|e| e.ns_pid == Some(note.parent_pid))
                .ok_or(ForkError::NotInFamily)?;
            if t.by_id.values().any(|e| e.info.pid == child_pid && e.info.exit.is_none()) {
                return Err(ForkError::AlreadyVm(child_pid));
            }
            // A forked VM counts against the daemon's quotas like any.
            t.fits(e.info.mem, &self.cfg.quotas).map_err(ForkError::Quota)?;
            // Keep at most FORKED_KEEP ended forked VMs per family: the
            // oldest go, so a guest forking in a loop cannot fill the host.
            let mut ended: Vec<(u64, String)> = t
                .by_id
                .values()
                .filter(in_family)
                .filter(|e| e.info.family.is_some() && e.info.exit.is_some())
                .map(|e| (e.info.created_ms, e.info.id.clone()))
                .collect();
            ended.sort();
            let old: Vec<String> = ended.iter().rev().skip(FORKED_KEEP).map(|(_, id)| id.clone()).collect();
            (e.info.clone(), dir_uid(&e.dir).ok_or(ForkError::NoUid)?, old)
        };
        for id in old {
            let _ = self.remove(&id, false);
        }
        // The process must be one of the family's VMM processes: forked from
        // the root's, it carries the root's command line, and it runs under
        // the family's user id. Its parent may be gone already, so that is
        // not checked.
        let start = proc_start(child_pid);
        let pidfd = open_ours(child_pid, root, uid, start).ok_or(ForkError::NotOurs(child_pid))?;
        // Forked from a member, it is in the family's control group.
        let contained = match &self.cgroups {
            Some(c) if c.exists(root) => c.holds(root, child_pid).then_some(true).ok_or(ForkError::OutsideGroup(child_pid))?,
            _ => false,
        };
        // The directory is the daemon's until its files are made.
        let (id, dir) = new_vm_dir(&self.vms_dir())?;
        let made = (|| {
            let files = JailFiles::open(&dir).map_err(ForkError::Files)?;
            let listener = UnixListener::bind(dir.join("ctl.sock")).map_err(ForkError::Bind)?;
            give_dir(&dir, uid)?;
            let info = VmInfo {
                id: id.clone(),
                name: None,
                image: parent.image.clone(),
                args: parent.args.clone(),
                mem: parent.mem,
                state: VmState::Running,
                pid: child_pid,
                created_ms: now_ms(),
                exit: None,
                boot_us: None,
                first_line_us: None,
                boot_trace: None,
                ip: None,
                ports: Vec::new(),
                links: Vec::new(),
                // The NIC stays with the parent: a forked VM has none.
                net_peers: false,
                parent: Some(parent.id.clone()),
                family: Some(root.to_string()),
                limits: parent.limits,
                tenant: parent.tenant.clone(),
                group: None,
            };
            let p = Proc { uid, pid: child_pid, start, contained, hosts: None };
            self.records.register(&id, p, Some(info.clone())).map_err(ForkError::Record)?;
            let (x, c, e) = files.into_parts();
            Ok((info, [OwnedFd::from(x), OwnedFd::from(c), OwnedFd::from(e), OwnedFd::from(listener)]))
        })();
        match made {
            Ok((info, fds)) => Ok(Child { id, info, dir, pidfd, fds }),
            Err(e) => {
                self.records.forget(&id);
                let _ = fs::remove_dir_all(&dir);
                Err(e)
            }
        }
    }
}
