//! Recycler endpoints (`POST /v1/recyclers`; issue 17, recycling's third
//! design; `docs/libraries.md` "Recycler endpoints"): a socket of its own
//! for one application library, at which a recycling group's VMM process
//! runs the app on a recycler kept at its ready point and answers the
//! client itself (`wisp_vmm_process`'s `endpoint.rs`). The daemon is on
//! no run's path: it opens and checks the library with the client's
//! rights once, binds the socket (`<state>/recyclers/<id>.sock`, the
//! client's user's alone), and hands it to a group with a `serve` request
//! whose connection it keeps: closing it (`DELETE /v1/recyclers/{id}`, or
//! the daemon's end) ends the endpoint. An endpoint takes a place in its
//! group, as a VM does. Endpoints are not kept across a daemon restart.

use std::collections::HashMap;
use std::io::BufReader;
use std::os::fd::AsFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use wisp_api::{AddRecycler, RecyclerInfo};
use wisp_vmm::{check_mem_size, DEFAULT_MEM};
use wisp_vmm_process::proto::{self, Request};

use super::error::ActionError;
use super::Daemon;

/// The image recyclers run.
const RECYCLER: &str = "recycler";
/// Most endpoints a daemon serves.
pub const MAX_RECYCLERS: usize = 64;
/// Longest a group takes to have an endpoint's recycler at its ready point.
const READY_WITHIN: Duration = Duration::from_secs(20);

/// The endpoints, by id.
#[derive(Default)]
pub struct Recyclers {
    by_id: Mutex<HashMap<String, Recycler>>,
}

struct Recycler {
    info: RecyclerInfo,
    /// The `serve` request's connection: the endpoint lives while it is open.
    _serve: UnixStream,
    path: PathBuf,
}

impl Recyclers {
    /// How many endpoints there are.
    pub fn count(&self) -> usize {
        self.by_id.lock().unwrap().len()
    }
}

impl Daemon {
    fn recyclers_dir(&self) -> PathBuf {
        self.cfg.state_dir.join("recyclers")
    }

    /// Make an endpoint for `r.lib`, for the client on `client`.
    pub(super) fn add_recycler(&self, r: AddRecycler, client: &UnixStream, arrived: Instant) -> Result<RecyclerInfo, ActionError> {
        if self.recyclers.by_id.lock().unwrap().len() >= MAX_RECYCLERS {
            return Err(ActionError::TooManyRecyclers(MAX_RECYCLERS));
        }
        let peer = crate::access::peer(client.as_fd()).map_err(|e| ActionError::GuestData(format!("the client's credentials: {e}")))?;
        let lib = self.library_file(&peer, &r.lib)?;
        let image = self.images.lookup(&self.cfg.image_dirs, RECYCLER)?;
        let mem = r.mem.unwrap_or(DEFAULT_MEM);
        check_mem_size(mem).map_err(ActionError::BadMemory)?;
        let tenant = r.tenant.clone().unwrap_or_default();
        let mut place = self.take_place(&tenant, mem, true)?;
        // (The group's next VM's slot stays the group's.)
        self.give_back_slot(&mut place);
        let made = self.serve_endpoint(&place.group_dir, &peer, &image, &lib);
        let (id, path, serve) = match made {
            Ok(m) => m,
            Err(e) => {
                self.leave_group(&place.group);
                return Err(e);
            }
        };
        let info = RecyclerInfo {
            id: id.clone(),
            socket: path.display().to_string(),
            lib: r.lib,
            app: lib.name.clone(),
            mem,
            tenant: r.tenant,
            uid: peer.uid,
            group: place.group.clone(),
            ready_us: arrived.elapsed().as_micros() as u64,
        };
        self.recyclers.by_id.lock().unwrap().insert(id, Recycler { info: info.clone(), _serve: serve, path });
        Ok(info)
    }

    /// Bind an endpoint's socket for `peer` and have the group in
    /// `group_dir` serve it; its id, path and the `serve` connection.
    fn serve_endpoint(
        &self,
        group_dir: &std::path::Path,
        peer: &crate::access::Peer,
        image: &crate::images::CachedImage,
        lib: &super::libs::LibFile,
    ) -> Result<(String, PathBuf, UnixStream), ActionError> {
        let dir = self.recyclers_dir();
        let io = ActionError::Vmm;
        std::fs::create_dir_all(&dir).map_err(io)?;
        // Others may pass through to their own sockets, not list them.
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o711)).map_err(io)?;
        let id = super::process::new_id();
        let path = dir.join(format!("{id}.sock"));
        let listener = UnixListener::bind(&path).map_err(io)?;
        let owned = (|| {
            std::os::unix::fs::chown(&path, Some(peer.uid), Some(peer.gid))?;
            std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
            let conn = UnixStream::connect(group_dir.join("ctl.sock"))?;
            conn.set_read_timeout(Some(READY_WITHIN))?;
            let req = Request::Serve { image_name: image.image.name.clone(), libs: vec![lib.name.clone()] };
            proto::send_line_fds(&conn, &req, &[listener.as_fd(), image.memfd.as_fd(), lib.memfd.as_fd()])?;
            let reply = proto::read_reply_line(&mut BufReader::new(&conn))?;
            conn.set_read_timeout(None)?;
            Ok::<_, std::io::Error>((conn, reply))
        })();
        let refused = match owned {
            Ok((conn, reply)) if reply.ok => return Ok((id, path, conn)),
            Ok((_, reply)) => ActionError::StartRefused(reply.error.unwrap_or_else(|| "the recycler did not start".into())),
            Err(e) => ActionError::Vmm(e),
        };
        let _ = std::fs::remove_file(&path);
        Err(refused)
    }

    /// The endpoints.
    pub(super) fn recyclers(&self) -> Vec<RecyclerInfo> {
        let mut v: Vec<RecyclerInfo> = self.recyclers.by_id.lock().unwrap().values().map(|r| r.info.clone()).collect();
        v.sort_by(|a, b| a.id.cmp(&b.id));
        v
    }

    /// End endpoint `id`: its group's thread ends with the `serve`
    /// connection, its socket goes, its place in the group is free.
    pub(super) fn remove_recycler(&self, id: &str) -> Result<(), ActionError> {
        let r = self.recyclers.by_id.lock().unwrap().remove(id).ok_or_else(|| ActionError::NoRecycler(id.to_string()))?;
        let _ = std::fs::remove_file(&r.path);
        let group = r.info.group.clone();
        drop(r);
        self.leave_group(&group);
        Ok(())
    }
}
