//! A create's shared libraries (`CreateVm::libs`, `docs/libraries.md`):
//! opened with the client's rights, checked (signature, then the ELF) and
//! copied once into a sealed memfd per file version, which every VM that
//! uses the library maps: its code is one copy in host memory however many
//! VMs call it. The VMM process checks the copy again before it maps it.

use std::collections::HashMap;
use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::sync::{Arc, Mutex};

use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use wisp_api::{CreateVm, UpdateInfo, UpdateLib, VmState};
use wisp_vmm_process::proto::{self, Request};

use super::error::ActionError;
use super::Daemon;

/// A checked library, held for VMs: its name (the file's stem) and the
/// sealed copy they map.
pub struct LibFile {
    pub name: String,
    pub memfd: OwnedFd,
}

/// A file's identity: device, inode, size, modification time (s, ns).
type FileKey = (u64, u64, u64, i64, i64);

/// Most library versions kept.
const CACHE_ENTRIES: usize = 64;
/// Most bytes of a library file (its span's limit and a signature).
const MAX_FILE: u64 = wisp_vmm::library::MAX_SPAN + 4096;

/// How long an update waits for the guest unless told, and at most (ms).
const DEFAULT_WAIT_MS: u64 = 5_000;
const MAX_WAIT_MS: u64 = 60_000;

/// Checked libraries by file identity.
#[derive(Default)]
pub(super) struct LibCache {
    inner: Mutex<HashMap<FileKey, Arc<LibFile>>>,
}

impl Daemon {
    /// `req`'s libraries, each opened with the rights of the client on
    /// `client`, checked, and held in a sealed memfd (once per file version).
    pub(super) fn libraries(&self, req: &CreateVm, client: &UnixStream) -> Result<Vec<Arc<LibFile>>, ActionError> {
        if req.libs.is_empty() {
            return Ok(Vec::new());
        }
        wisp_api::action::check_limits(req)?;
        let peer = crate::access::peer(client.as_fd()).map_err(|e| ActionError::GuestData(format!("the client's credentials: {e}")))?;
        req.libs.iter().map(|path| self.library_file(&peer, path)).collect()
    }

    /// The library at `path`, opened with the rights of `peer`, checked,
    /// and held in a sealed memfd (once per file version).
    pub(super) fn library_file(&self, peer: &crate::access::Peer, path: &str) -> Result<Arc<LibFile>, ActionError> {
        let fail = |why: String| ActionError::GuestData(format!("library {path}: {why}"));
        let f = crate::access::open_as(peer, std::path::Path::new(path), false).map_err(|e| fail(format!("{e} (opened with the client's rights, uid {})", peer.uid)))?;
        let m = f.metadata().map_err(|e| fail(e.to_string()))?;
        let key = (m.dev(), m.ino(), m.size(), m.mtime(), m.mtime_nsec());
        if let Some(hit) = self.libs.inner.lock().unwrap().get(&key) {
            return Ok(hit.clone());
        }
        let mut bytes = Vec::new();
        (&f).take(MAX_FILE + 1).read_to_end(&mut bytes).map_err(|e| fail(e.to_string()))?;
        if bytes.len() as u64 > MAX_FILE {
            return Err(fail(format!("more than {} MiB", MAX_FILE >> 20)));
        }
        wisp_vmm::library::Library::read(&bytes).map_err(|e| fail(e.to_string()))?;
        let name = std::path::Path::new(path).file_stem().and_then(|s| s.to_str()).unwrap_or_default().to_string();
        let memfd = crate::fsutil::sealed_memfd("wisp-library", &bytes).map_err(|e| fail(format!("memfd: {e}")))?;
        let lib = Arc::new(LibFile { name, memfd });
        let mut c = self.libs.inner.lock().unwrap();
        if c.len() >= CACHE_ENTRIES {
            c.clear();
        }
        Ok(c.entry(key).or_insert(lib).clone())
    }

    /// A live update of one of VM `key`'s libraries (`POST
    /// /v1/vms/{id}/update`): the new library opened with the client's
    /// rights and checked here, then handed to the VM's VMM process, which
    /// checks it against the one it replaces and switches it at the
    /// guest's next quiescent point.
    pub(super) fn update_lib(&self, key: &str, body: UpdateLib, client: &UnixStream, arrived: Instant) -> Result<UpdateInfo, ActionError> {
        let id = self.not_migrating(key)?;
        let (id, dir, info) = self.dir_of(&id)?;
        if info.state == VmState::Exited {
            return Err(ActionError::Exited(id));
        }
        let peer = crate::access::peer(client.as_fd()).map_err(|e| ActionError::GuestData(format!("the client's credentials: {e}")))?;
        let lib = self.library_file(&peer, &body.path)?;
        let name = body.replace.clone().unwrap_or_else(|| lib.name.clone());
        let wait_ms = body.wait_ms.unwrap_or(DEFAULT_WAIT_MS).min(MAX_WAIT_MS);
        let req = Request::UpdateLib { name: name.clone(), wait_ms };
        let timeout = Duration::from_millis(wait_ms) + Duration::from_secs(5);
        let reply = proto::send(&dir.join("ctl.sock"), &req, &[lib.memfd.as_fd()], Some(timeout))
            .and_then(proto::read_reply)
            .map(|(r, _)| r)
            .map_err(|source| ActionError::Unreachable { id: id.clone(), source })?;
        if !reply.ok {
            return Err(ActionError::Refused(reply.error.unwrap_or_default()));
        }
        let [update_us, held_us, quiesce_us, variables, pointers, stale] = reply.updated.unwrap_or_default();
        Ok(UpdateInfo { vm: id, library: name, path: body.path, took_us: arrived.elapsed().as_micros() as u64, update_us, held_us, quiesce_us, variables, pointers, stale })
    }
}
