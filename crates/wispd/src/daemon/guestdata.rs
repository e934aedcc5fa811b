//! A create's environment and files (`CreateVm::env`, `files`), checked and
//! laid out as the guest reads them (`wisp_vmm::DataDevice`, the ABI's
//! data region) in a sealed memfd that goes to the VMM process with the
//! start. The client read the files with its own rights: the daemon opens
//! none for it. Volumes (`CreateVm::volumes`) the daemon opens, with the
//! client's rights (`access::open_as`), and passes open.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use wisp_api::CreateVm;

use super::error::ActionError;

/// `req`'s volumes, opened with the rights of the client on `client` (the
/// daemon runs as root: a volume the client may not open is refused) and
/// checked (a whole number of sectors); (file, read-only) each.
pub(super) fn volumes(req: &CreateVm, client: &std::os::unix::net::UnixStream) -> Result<Vec<(OwnedFd, bool)>, ActionError> {
    if req.volumes.is_empty() {
        return Ok(Vec::new());
    }
    // Paths and their number first (as the create checks them later).
    wisp_api::action::check_limits(req)?;
    let peer = crate::access::peer(client.as_fd()).map_err(|e| ActionError::GuestData(format!("the client's credentials: {e}")))?;
    req.volumes
        .iter()
        .map(|v| {
            let f = crate::access::open_as(&peer, std::path::Path::new(&v.path), !v.read_only)
                .map_err(|e| ActionError::GuestData(format!("volume {}: {e} (opened with the client's rights, uid {})", v.path, peer.uid)))?;
            let cfg = wisp_vmm::BlockConfig::from_file(f, v.read_only, &v.path).map_err(ActionError::GuestData)?;
            Ok((cfg.file, v.read_only))
        })
        .collect()
}

/// The region for `req`, in a sealed memfd; none if it gives neither
/// environment nor files.
pub(super) fn memfd(req: &CreateVm) -> Result<Option<OwnedFd>, ActionError> {
    if req.env.is_empty() && req.files.is_empty() {
        return Ok(None);
    }
    let files = req
        .files
        .iter()
        .map(|f| Ok((f.path.clone(), Arc::from(f.bytes().map_err(ActionError::GuestData)?))))
        .collect::<Result<Vec<(String, Arc<[u8]>)>, ActionError>>()?;
    let data = wisp_vmm::DataDevice::new(&req.env, &files).map_err(|e| ActionError::GuestData(e.to_string()))?;
    crate::fsutil::sealed_memfd("wisp-data", data.bytes()).map(Some).map_err(|e| ActionError::GuestData(format!("memfd: {e}")))
}
