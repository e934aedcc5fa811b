//! Snapshots through the daemon. A VM is saved into a file the client
//! names, created with the client's rights (the daemon runs as root: it
//! writes no file a client could not): its VMM process writes the snapshot
//! into a pipe, and the daemon reads it as the untrusted stream it is
//! (`wisp_vmm::snapshot::receive`: the head checked before anything is
//! written, the length as it comes) and seals it with the digest it
//! computed itself. For a restore the daemon opens the file with the
//! client's rights, checks it whole (digest included) and copies it into a
//! sealed memfd, which the VMM process maps copy-on-write: the client
//! cannot change the pages under a running VM, and many restores of one
//! snapshot share them. Checked snapshots are kept by the file's identity
//! (device, inode, size, modification time), as images are: a restore of
//! one still opens the file with the client's rights, but checks and
//! copies it only once.

use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustix::fs::{fcntl_add_seals, memfd_create, MemfdFlags, SealFlags};
use wisp_api::{SnapshotInfo, SnapshotVm, VmState};
use wisp_vmm::snapshot::{self, Snapshot};
use wisp_vmm_process::proto::{self, Request};

use super::error::ActionError;
use super::{hex, Daemon};

/// Longest the daemon waits for a VMM process to write its snapshot.
const SAVE_TIMEOUT: Duration = Duration::from_secs(35);
/// The pipe a snapshot comes through: 1 MiB (`fs.pipe-max-size`'s default).
const PIPE_BYTES: usize = 1 << 20;

/// A snapshot read for a restore: checked, in a sealed memfd.
pub(super) struct Restorable {
    pub memfd: OwnedFd,
    pub snap: Snapshot,
}

impl Restorable {
    /// The address of the snapshot's NIC, if its VM had one: a restored VM
    /// keeps it (its guest is configured with it).
    pub fn nic_ip(&self) -> Option<[u8; 4]> {
        let nic = self.snap.devices.iter().find(|d| d.kind == wisp_abi::DeviceKind::Net as u32)?;
        Some(wisp_abi::net::decode_ipv4(nic.params[1]).0)
    }
}

/// A file's identity: device, inode, size, modification time (s, ns).
type FileKey = (u64, u64, u64, i64, i64);

/// Most snapshots kept, and most bytes of them.
const CACHE_ENTRIES: usize = 64;
const CACHE_BYTES: u64 = 1 << 30;

/// Checked snapshots by file identity, with when each was last used.
type Entries = std::collections::HashMap<FileKey, (Arc<Restorable>, u64)>;

/// Checked snapshots by file identity, the least recently used going first.
/// A file being checked has a gate: restores of it meanwhile wait for that
/// one check (a hundred restores of one file at once make one copy, whose
/// pages they all share), not for checks of other files.
#[derive(Default)]
pub(super) struct SnapshotCache {
    inner: std::sync::Mutex<(u64, Entries)>,
    gates: std::sync::Mutex<std::collections::HashMap<FileKey, Arc<std::sync::Mutex<()>>>>,
}

impl SnapshotCache {
    fn get(&self, key: &FileKey) -> Option<Arc<Restorable>> {
        let mut c = self.inner.lock().unwrap();
        c.0 += 1;
        let tick = c.0;
        c.1.get_mut(key).map(|(r, used)| {
            *used = tick;
            r.clone()
        })
    }

    /// The gate of file `key` (made if there is none).
    fn gate(&self, key: FileKey) -> Arc<std::sync::Mutex<()>> {
        self.gates.lock().unwrap().entry(key).or_default().clone()
    }

    /// The check of file `key` is over (cached or failed): its gate goes
    /// (if it is still `gate`: a later check may have made its own).
    fn ungate(&self, key: &FileKey, gate: &Arc<std::sync::Mutex<()>>) {
        let mut g = self.gates.lock().unwrap();
        if g.get(key).is_some_and(|held| Arc::ptr_eq(held, gate)) {
            g.remove(key);
        }
    }

    fn put(&self, key: FileKey, r: Arc<Restorable>) {
        let mut c = self.inner.lock().unwrap();
        c.0 += 1;
        let tick = c.0;
        c.1.insert(key, (r, tick));
        let bytes = |m: &Entries| m.values().map(|(r, _)| r.snap.header.file_len).sum::<u64>();
        while c.1.len() > CACHE_ENTRIES || (c.1.len() > 1 && bytes(&c.1) > CACHE_BYTES) {
            let Some(oldest) = c.1.iter().min_by_key(|(_, (_, used))| *used).map(|(k, _)| *k) else { break };
            c.1.remove(&oldest);
        }
    }
}

impl Daemon {
    /// Save VM `key` into `body.path` (then stop it, with `body.stop`).
    pub(super) fn snapshot(&self, key: &str, body: SnapshotVm, client: &UnixStream, arrived: Instant) -> Result<SnapshotInfo, ActionError> {
        let (id, dir, info) = self.dir_of(&self.not_migrating(key)?)?;
        if info.state == VmState::Exited {
            return Err(ActionError::Exited(id));
        }
        let fail = |why: String| ActionError::Snapshot { path: body.path.clone(), why };
        if !info.links.is_empty() {
            return Err(fail("a VM with links cannot be saved yet (a restore gets one NIC)".into()));
        }
        let peer = crate::access::peer(client.as_fd()).map_err(|e| fail(format!("the client's credentials: {e}")))?;
        let file = crate::access::create_as(&peer, Path::new(&body.path)).map_err(|e| fail(format!("{e} (created with the client's rights, uid {})", peer.uid)))?;
        let (snap, [_, ram_bytes, held_us]) = match self.save_into(&id, &dir, info.mem, file, Request::Snapshot { incremental: body.incremental, pause: false }, &body.path) {
            Ok(r) => r,
            Err(e) => {
                let _ = std::fs::remove_file(&body.path);
                return Err(e);
            }
        };
        let took_us = arrived.elapsed().as_micros() as u64;
        if body.stop {
            self.kill(&id)?;
        }
        Ok(SnapshotInfo {
            vm: id,
            path: body.path,
            bytes: snap.header.file_len,
            ram_bytes,
            held_us,
            took_us,
            digest: hex(&snap.header.digest),
            base: (snap.header.flags & snapshot::flags::INCREMENTAL != 0).then(|| hex(&snap.header.base_digest)),
        })
    }

    /// A snapshot of VM `id` (its directory `dir`, `mem` bytes of RAM) into
    /// `file` (named `shown` in errors): its VMM process writes it into a
    /// pipe, checked here as it comes and sealed. `how` is the request
    /// ([`Request::Snapshot`]): with `incremental` only the pages written
    /// since its last one, which becomes its base; with `pause` the VM
    /// paused first and left paused. The snapshot, and what the VMM process
    /// said: bytes, RAM bytes, µs held.
    pub(super) fn save_into(&self, id: &str, dir: &Path, mem: u64, file: File, how: Request, shown: &str) -> Result<(Snapshot, [u64; 3]), ActionError> {
        let fail = |why: String| ActionError::Snapshot { path: shown.to_string(), why };
        let Request::Snapshot { incremental, .. } = how else { return Err(fail("not a snapshot request".into())) };
        let (mut rd, wr) = std::io::pipe().map_err(|e| fail(format!("pipe: {e}")))?;
        // Room for a small VM's whole snapshot: its vCPU, held while it
        // writes, does not wait for this side to read (the host's limit, or
        // the default 64 KiB, otherwise).
        let _ = rustix::pipe::fcntl_setpipe_size(&wr, PIPE_BYTES);
        // An incremental one's base: the VM's last snapshot through this daemon.
        let base = match self.vms.lock().by_id.get(id).and_then(|e| e.last_snapshot) {
            Some(d) => Some(d),
            None if incremental => return Err(fail("an incremental snapshot needs an earlier one of this VM taken through this daemon".into())),
            None => None,
        };
        let reader = std::thread::spawn(move || snapshot::receive_over(&mut rd, &file, mem, base));
        // Sent, then the daemon's write end closed: the reader sees the
        // stream's end when the VMM process closes its own.
        let sent = proto::send(&dir.join("ctl.sock"), &how, &[wr.as_fd()], Some(SAVE_TIMEOUT));
        drop(wr);
        let reply = sent.and_then(proto::read_reply).map(|(r, _)| r);
        let received = reader.join().unwrap_or_else(|_| Err(snapshot::Error::Io("the reader panicked".into())));
        let reply = reply.map_err(|source| ActionError::Unreachable { id: id.to_string(), source })?;
        self.set_state(id, &reply);
        if !reply.ok {
            return Err(ActionError::Refused(reply.error.unwrap_or_default()));
        }
        let snap = received.map_err(|e| fail(e.to_string()))?;
        if let Some(e) = self.vms.lock().by_id.get_mut(id) {
            e.last_snapshot = Some(snap.header.digest);
        }
        Ok((snap, reply.saved.unwrap_or_default()))
    }

    /// The snapshot at `path` for a restore, read with the rights of the
    /// client on `client`, checked whole and copied into a sealed memfd.
    pub(super) fn restorable(&self, path: &str, client: &UnixStream) -> Result<Arc<Restorable>, ActionError> {
        let fail = |why: String| ActionError::Snapshot { path: path.to_string(), why };
        let peer = crate::access::peer(client.as_fd()).map_err(|e| fail(format!("the client's credentials: {e}")))?;
        let file = crate::access::open_as(&peer, Path::new(path), false).map_err(|e| fail(format!("{e} (opened with the client's rights, uid {})", peer.uid)))?;
        self.checked_file(file, path)
    }

    /// A snapshot file of the daemon's own (a template's) for a start.
    pub(super) fn restorable_own(&self, path: &Path) -> Result<Arc<Restorable>, ActionError> {
        let shown = path.display().to_string();
        let file = File::open(path).map_err(|e| ActionError::Snapshot { path: shown.clone(), why: e.to_string() })?;
        self.checked_file(file, &shown)
    }

    /// `file` (named `path` in errors) checked whole and copied into a
    /// sealed memfd, or as it was checked before (same identity).
    pub(super) fn checked_file(&self, file: File, path: &str) -> Result<Arc<Restorable>, ActionError> {
        let fail = |why: String| ActionError::Snapshot { path: path.to_string(), why };
        let m = file.metadata().map_err(|e| fail(e.to_string()))?;
        let key = (m.dev(), m.ino(), m.size(), m.mtime(), m.mtime_nsec());
        if let Some(hit) = self.snapshots.get(&key) {
            return Ok(hit);
        }
        // One check per file at a time; whoever waited finds it cached.
        let gate = self.snapshots.gate(key);
        let _checking = gate.lock().unwrap_or_else(|p| p.into_inner());
        let r = match self.snapshots.get(&key) {
            Some(hit) => Ok(hit),
            None => self.check_copy(&file, path).inspect(|r| self.snapshots.put(key, r.clone())),
        };
        self.snapshots.ungate(&key, &gate);
        r
    }

    /// [`Daemon::checked_file`]'s check: `file` copied into a sealed memfd
    /// and checked whole there.
    fn check_copy(&self, file: &File, path: &str) -> Result<Arc<Restorable>, ActionError> {
        let fail = |why: String| ActionError::Snapshot { path: path.to_string(), why };
        // The head, to know its length; the whole file is checked on the
        // copy the client cannot change under the VM (hashed once).
        let snap = Snapshot::read(file, false).map_err(|e| fail(e.to_string()))?;
        let memfd = memfd_create("wisp-snapshot", MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING).map_err(|e| fail(format!("memfd: {e}")))?;
        let copy = File::from(memfd);
        copy.set_len(snap.header.file_len).map_err(|e| fail(format!("memfd: {e}")))?;
        let n = std::io::copy(&mut std::io::Read::take(file, snap.header.file_len), &mut &copy).map_err(|e| fail(e.to_string()))?;
        if n != snap.header.file_len {
            return Err(fail("it changed while it was read".into()));
        }
        let snap = Snapshot::read(&copy, true).map_err(|e| fail(e.to_string()))?;
        Ok(Arc::new(sealed(copy, snap, path)?))
    }
}

/// A checked snapshot in a memfd of the daemon's own (made with
/// `ALLOW_SEALING`), sealed against every change.
pub(super) fn sealed(memfd: File, snap: Snapshot, path: &str) -> Result<Restorable, ActionError> {
    let fail = |why: String| ActionError::Snapshot { path: path.to_string(), why };
    let memfd = OwnedFd::from(memfd);
    fcntl_add_seals(memfd.as_fd(), SealFlags::WRITE | SealFlags::GROW | SealFlags::SHRINK | SealFlags::SEAL).map_err(|e| fail(format!("seal: {e}")))?;
    // A NIC comes back with the address its guest has, environment and
    // files with the saved pages, disks on the volumes the restore is given
    // (the VMM process matches them to the saved devices).
    Ok(Restorable { memfd, snap })
}
