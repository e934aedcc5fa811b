//! The daemon's state and operations: the VM table, spawning and adopting
//! VMM processes, and the life-cycle calls the API maps onto.
//!
//! There is no central store on the boot path: a VM's whole configuration
//! travels in its `start` request and lands in its own boot-info page. The
//! daemon only keeps, per VM, a small `vm.json` in the VM's directory so a
//! restarted daemon can find and re-adopt every VMM process.

use std::collections::HashMap;
use std::fs;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::net::UnixStream;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustix::event::epoll;
use rustix::process::{pidfd_open, Pid, PidfdFlags};
use wisp_api::{CreateVm, ExitInfo, VmInfo, VmState};
use wisp_vmm::{check_mem_size, DEFAULT_MEM};

use crate::images::ImageCache;
use crate::pool::Pool;
use crate::proto::{self, Reply, Request, WorkerState};
use crate::worker::write_atomic;

/// Daemon configuration.
#[derive(Clone, Debug)]
pub struct Config {
    /// State directory (`vms/<id>/` per VM).
    pub state_dir: PathBuf,
    /// Directories searched for bundled images by name.
    pub image_dirs: Vec<PathBuf>,
    /// Bridge the VMs' taps are attached to.
    pub bridge: String,
    /// VM subnet: network address and prefix; the bridge takes host 1.
    pub subnet: ([u8; 4], u8),
}

/// An error answered to an API client.
#[derive(Debug)]
pub struct ApiError {
    /// HTTP status.
    pub status: u16,
    /// Message.
    pub message: String,
}

impl ApiError {
    fn new(status: u16, message: impl Into<String>) -> ApiError {
        ApiError { status, message: message.into() }
    }
}

/// Result of an API operation.
pub type ApiResult<T> = Result<T, ApiError>;

/// A VMM process (pooled or holding a VM).
pub struct Worker {
    /// Id (becomes the VM's id).
    pub id: String,
    /// Process id.
    pub pid: u32,
    /// Its directory.
    pub dir: PathBuf,
    /// Set if this daemon spawned it (to reap it).
    pub child: Option<Child>,
}

struct Entry {
    info: VmInfo,
    dir: PathBuf,
    child: Option<Child>,
    pidfd: Option<OwnedFd>,
    /// An open control connection to the VMM process, reused by quick requests.
    ctl: Option<UnixStream>,
    /// Host ports forwarded to the VM (closed when it exits).
    forwards: Vec<crate::forward::Forward>,
    /// For a family's root: the daemon's end of the family's uplink, on
    /// which forked VMM processes announce themselves.
    uplink: Option<OwnedFd>,
}

/// Ended forked VMs kept per family (older ones are removed).
const FORKED_KEEP: usize = 64;

/// Epoll tokens of uplinks carry this bit (pidfds carry the bare id).
const UPLINK: u64 = 1 << 63;

#[derive(Default)]
struct Table {
    by_id: HashMap<String, Entry>,
    names: HashMap<String, String>,
}

/// The daemon.
pub struct Daemon {
    /// Configuration.
    pub cfg: Config,
    table: Mutex<Table>,
    exited: Condvar,
    /// Ready shells.
    pub pool: Arc<Pool>,
    images: ImageCache,
    epoll: OwnedFd,
    uids: Mutex<Uids>,
    net: Mutex<NetState>,
}

/// The VM network: bridge, address allocation.
#[derive(Default)]
struct NetState {
    nl: Option<crate::netlink::Netlink>,
    bridge: u32,
    used: std::collections::HashSet<u32>,
}

/// User ids of VMM processes: one of its own per VM.
#[derive(Default)]
struct Uids {
    used: std::collections::HashSet<u32>,
    next: u32,
}

/// First user id given to VMM processes.
pub const UID_BASE: u32 = 1_000_000;
/// Number of user ids in the range.
pub const UID_COUNT: u32 = 1_000_000;

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

fn new_id() -> String {
    let mut b = [0u8; 6];
    if fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut b)).is_err() {
        let n = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
        b.copy_from_slice(&n.to_le_bytes()[..6]);
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn token(id: &str) -> u64 {
    u64::from_str_radix(id, 16).unwrap_or(0)
}

fn valid_name(n: &str) -> bool {
    !n.is_empty()
        && n.len() <= 64
        && n.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        && !n.starts_with(['-', '.'])
}

impl Daemon {
    /// Create the daemon: state directory, epoll, re-adoption of the VMs a
    /// previous daemon left running.
    pub fn new(cfg: Config) -> Result<Arc<Daemon>, String> {
        fs::create_dir_all(cfg.state_dir.join("vms")).map_err(|e| format!("state dir: {e}"))?;
        let epoll = epoll::create(epoll::CreateFlags::CLOEXEC).map_err(|e| format!("epoll: {e}"))?;
        let d = Arc::new(Daemon {
            cfg,
            table: Mutex::new(Table::default()),
            exited: Condvar::new(),
            pool: Arc::new(Pool::default()),
            images: ImageCache::default(),
            epoll,
            uids: Mutex::new(Uids::default()),
            net: Mutex::new(NetState::default()),
        });
        d.adopt();
        Ok(d)
    }

    fn vms_dir(&self) -> PathBuf {
        self.cfg.state_dir.join("vms")
    }

    /// A new VM id and its directory, owned by `uid` and private to it.
    fn new_vm_dir(&self, uid: u32) -> Result<(String, PathBuf), String> {
        let id = new_id();
        let dir = self.vms_dir().join(&id);
        fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let owner = (Some(rustix::fs::Uid::from_raw(uid)), Some(rustix::fs::Gid::from_raw(uid)));
        rustix::fs::chown(&dir, owner.0, owner.1).map_err(|e| format!("chown {}: {e}", dir.display()))?;
        rustix::fs::chmod(&dir, rustix::fs::Mode::from_raw_mode(0o700)).map_err(|e| format!("chmod: {e}"))?;
        Ok((id, dir))
    }

    /// Spawn a VMM process with a prepared shell of `mem` bytes and wait
    /// until it is ready.
    pub fn spawn_worker(&self, mem: u64) -> Result<Worker, String> {
        let uid = self.alloc_uid()?;
        let (id, dir) = self.new_vm_dir(uid).inspect_err(|_| self.free_uid(uid))?;
        let log = fs::File::create(dir.join("vmm.log")).map_err(|e| e.to_string())?;
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let mut cmd = Command::new(exe);
        cmd.arg("__worker").arg("--id").arg(&id).arg("--dir").arg(&dir).arg("--mem").arg(mem.to_string());
        cmd.arg("--uid").arg(uid.to_string());
        cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(log);
        // One malloc arena: a VMM process has two threads and little heap.
        cmd.env("MALLOC_ARENA_MAX", "1");
        // Its own process group: signals for the daemon's group (Ctrl-C) do
        // not reach VMs, and the VMs outlive the daemon.
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let mut child = cmd.spawn().map_err(|e| format!("spawn VMM process: {e}"))?;
        let pid = child.id();
        let _ = fs::write(dir.join("pid"), pid.to_string());
        let mut line = String::new();
        let mut out = BufReader::new(child.stdout.take().expect("piped"));
        let _ = out.read_line(&mut line);
        if line.trim() != "ready" {
            let _ = child.kill();
            let _ = child.wait();
            let _ = fs::remove_dir_all(&dir);
            self.free_uid(uid);
            let msg = line.trim().strip_prefix("error: ").unwrap_or(line.trim()).to_string();
            return Err(if msg.is_empty() { "VMM process failed to start".into() } else { msg });
        }
        Ok(Worker { id, pid, dir, child: Some(child) })
    }

    /// Set up the bridge (once) and give out an address, MAC and tap.
    fn alloc_net(&self, id: &str) -> Result<(proto::NetSpec, OwnedFd), String> {
        let (net, prefix) = self.cfg.subnet;
        let base = u32::from_be_bytes(net) & (u32::MAX << (32 - prefix as u32));
        let hosts = (1u32 << (32 - prefix as u32)).saturating_sub(2);
        let mut st = self.net.lock().unwrap();
        if st.nl.is_none() {
            let mut nl = crate::netlink::Netlink::open().map_err(|e| format!("netlink: {e}"))?;
            let bridge = nl.ensure_bridge(&self.cfg.bridge).map_err(|e| format!("bridge {}: {e}", self.cfg.bridge))?;
            nl.add_address(bridge, (base + 1).to_be_bytes(), prefix)
                .map_err(|e| format!("address on {}: {e}", self.cfg.bridge))?;
            st.bridge = bridge;
            st.nl = Some(nl);
        }
        let host = (2..=hosts).find(|h| !st.used.contains(h)).ok_or("the VM subnet is full")?;
        let ip = (base + host).to_be_bytes();
        let tap_name = format!("wt{}", &id[..id.len().min(12)]);
        let tap = wisp_vmm::tap::open_tap(&tap_name).map_err(|e| e.to_string())?;
        let index = crate::netlink::if_index(&tap_name).ok_or_else(|| format!("tap {tap_name} did not appear"))?;
        let bridge = st.bridge;
        st.nl.as_mut().expect("opened above").set_link(index, Some(bridge)).map_err(|e| format!("attach {tap_name}: {e}"))?;
        st.used.insert(host);
        let mac = [0x52, 0x54, 0x00, ip[1], ip[2], ip[3]];
        Ok((proto::NetSpec { ip, prefix, gateway: (base + 1).to_be_bytes(), mac }, tap))
    }

    fn host_part(&self, ip: &str) -> Option<u32> {
        let a: std::net::Ipv4Addr = ip.parse().ok()?;
        let (_, prefix) = self.cfg.subnet;
        Some(u32::from(a) & !(u32::MAX << (32 - prefix as u32)))
    }

    fn free_ip(&self, ip: &Option<String>) {
        if let Some(h) = ip.as_deref().and_then(|i| self.host_part(i)) {
            self.net.lock().unwrap().used.remove(&h);
        }
    }

    fn alloc_uid(&self) -> Result<u32, String> {
        let mut u = self.uids.lock().unwrap();
        for _ in 0..UID_COUNT {
            let uid = UID_BASE + u.next % UID_COUNT;
            u.next = u.next.wrapping_add(1);
            if u.used.insert(uid) {
                return Ok(uid);
            }
        }
        Err("no free user id for a VMM process".into())
    }

    fn free_uid(&self, uid: u32) {
        self.uids.lock().unwrap().used.remove(&uid);
    }

    fn dir_uid(dir: &Path) -> Option<u32> {
        use std::os::unix::fs::MetadataExt;
        fs::metadata(dir).ok().map(|m| m.uid()).filter(|u| (UID_BASE..UID_BASE + UID_COUNT).contains(u))
    }

    /// Remove a VM directory and give its user id back (unless another VM
    /// of its family still has it).
    fn remove_dir(&self, dir: &Path) {
        let uid = Self::dir_uid(dir);
        let _ = fs::remove_dir_all(dir);
        if let Some(u) = uid {
            let shared = self.table.lock().unwrap().by_id.values().any(|e| Self::dir_uid(&e.dir) == Some(u));
            if !shared {
                self.free_uid(u);
            }
        }
    }

    /// Stop an unused pooled VMM process and remove its directory.
    pub fn discard_worker(&self, mut w: Worker) {
        let _ = proto::call(&w.dir.join("ctl.sock"), &Request::Shutdown, None, Some(Duration::from_secs(1)));
        match w.child.as_mut() {
            Some(c) => {
                let _ = c.kill();
                let _ = c.wait();
            }
            None => kill_pid(w.pid),
        }
        self.remove_dir(&w.dir);
    }

    fn resolve_image(&self, image: &str) -> ApiResult<PathBuf> {
        if image.contains('/') {
            let p = PathBuf::from(image);
            if !p.is_absolute() {
                return Err(ApiError::new(400, format!("image path '{image}' must be absolute")));
            }
            return Ok(p);
        }
        self.cfg
            .image_dirs
            .iter()
            .map(|d| d.join(image))
            .find(|p| p.is_file())
            .ok_or_else(|| ApiError::new(400, format!("no such image: '{image}' is not a bundled app")))
    }

    /// Create and start a VM.
    pub fn create(self: &Arc<Self>, req: CreateVm) -> ApiResult<VmInfo> {
        self.create_inner(req, false).map(|(info, _)| info)
    }

    /// Create and start a VM and return its console stream (until it ends)
    /// along with it: one round trip from request to first output.
    pub fn create_attached(self: &Arc<Self>, req: CreateVm) -> ApiResult<(VmInfo, BufReader<UnixStream>)> {
        let (info, stream) = self.create_inner(req, true)?;
        Ok((info, stream.expect("attached start returns its stream")))
    }

    fn create_inner(self: &Arc<Self>, req: CreateVm, attach: bool) -> ApiResult<(VmInfo, Option<BufReader<UnixStream>>)> {
        let mem = check_mem_size(req.mem.unwrap_or(DEFAULT_MEM)).map_err(|e| ApiError::new(400, e.to_string()))?;
        if let Some(n) = &req.name {
            if !valid_name(n) {
                return Err(ApiError::new(400, format!("invalid name '{n}': use 1-64 of [A-Za-z0-9_.-]")));
            }
        }
        let path = self.resolve_image(&req.image)?;
        let image = self.images.get(&path).map_err(|e| ApiError::new(400, e))?;
        // Reserve the name before any work.
        if let Some(n) = &req.name {
            let mut t = self.table.lock().unwrap();
            if t.names.contains_key(n) {
                return Err(ApiError::new(409, format!("the name '{n}' is already in use")));
            }
            t.names.insert(n.clone(), String::new());
        }
        let release_name = |d: &Daemon| {
            if let Some(n) = &req.name {
                d.table.lock().unwrap().names.remove(n);
            }
        };
        let worker = match self.pool.take(mem) {
            Some(w) => w,
            None => match self.spawn_worker(mem) {
                Ok(w) => w,
                Err(e) => {
                    release_name(self);
                    return Err(ApiError::new(500, format!("cannot prepare a VM: {e}")));
                }
            },
        };
        let wants_net = req.net || !req.ports.is_empty();
        let net = if wants_net {
            match self.alloc_net(&worker.id) {
                Ok(n) => Some(n),
                Err(e) => {
                    release_name(self);
                    self.discard_worker(worker);
                    return Err(ApiError::new(500, format!("cannot set up the VM's network: {e}")));
                }
            }
        } else {
            None
        };
        // Host ports first: a port in use fails the request before the VM starts.
        let mut forwards = Vec::new();
        if let Some((n, _)) = &net {
            for m in &req.ports {
                match crate::forward::Forward::start(*m, std::net::Ipv4Addr::from(n.ip)) {
                    Ok(f) => forwards.push(f),
                    Err(e) => {
                        release_name(self);
                        self.free_ip(&Some(std::net::Ipv4Addr::from(n.ip).to_string()));
                        self.discard_worker(worker);
                        return Err(ApiError::new(409, format!("cannot forward host port {}: {e}", m.host)));
                    }
                }
            }
        }
        let info = VmInfo {
            ports: req.ports.clone(),
            ip: net.as_ref().map(|(n, _)| std::net::Ipv4Addr::from(n.ip).to_string()),
            id: worker.id.clone(),
            name: req.name.clone(),
            image: req.image.clone(),
            args: req.args.clone(),
            mem,
            state: VmState::Running,
            pid: worker.pid,
            created_ms: now_ms(),
            exit: None,
            boot_us: None,
            parent: None,
            family: None,
        };
        let dir = worker.dir.clone();
        self.insert(info.clone(), dir.clone(), worker.child);
        if let Some(e) = self.table.lock().unwrap().by_id.get_mut(&info.id) {
            e.forwards = forwards;
        }
        let (spec, tap) = net.map_or((None, None), |(n, t)| (Some(n), Some(t)));
        // The family's uplink: forked VMs of this one announce themselves on it.
        let uplink = rustix::net::socketpair(
            rustix::net::AddressFamily::UNIX,
            rustix::net::SocketType::SEQPACKET,
            rustix::net::SocketFlags::CLOEXEC,
            None,
        )
        .ok();
        let start = Request::Start {
            image_name: image.image.name.clone(),
            args: req.args,
            timeout_ms: req.timeout_ms,
            attach,
            net: spec,
            uplink: uplink.is_some(),
        };
        let mut fds = vec![&image.memfd];
        fds.extend(tap.as_ref());
        if let Some((mine, theirs)) = &uplink {
            fds.push(theirs);
            let _ = epoll::add(&self.epoll, mine.as_fd(), epoll::EventData::new_u64(UPLINK | token(&info.id)), epoll::EventFlags::IN);
        }
        // Record the VM while its VMM process loads the image.
        let sent = proto::send(&dir.join("ctl.sock"), &start, &fds, Some(Duration::from_secs(10)));
        // The VMM process holds the tap now: it disappears when that process ends.
        drop(tap);
        if let Some((mine, _theirs)) = uplink {
            if let Some(e) = self.table.lock().unwrap().by_id.get_mut(&info.id) {
                e.uplink = Some(mine);
            }
        }
        if let Err(e) = write_atomic(&dir.join("vm.json"), &serde_json::to_vec(&info).unwrap_or_default()) {
            let _ = self.remove(&info.id, true);
            return Err(ApiError::new(500, format!("cannot record the VM: {e}")));
        }
        match sent.and_then(proto::read_reply) {
            Ok((Reply { ok: true, boot_us, .. }, stream)) => {
                let stream = attach.then(|| {
                    let _ = stream.get_ref().set_read_timeout(None);
                    stream
                });
                let mut t = self.table.lock().unwrap();
                if let Some(e) = t.by_id.get_mut(&info.id) {
                    e.info.boot_us = boot_us;
                    return Ok((e.info.clone(), stream));
                }
                Ok((info, stream))
            }
            Ok((r, _)) => {
                let msg = r.error.unwrap_or_else(|| "start failed".into());
                let _ = self.remove(&info.id, true);
                Err(ApiError::new(400, msg))
            }
            Err(e) => {
                let _ = self.remove(&info.id, true);
                Err(ApiError::new(500, format!("VMM process: {e}")))
            }
        }
    }

    fn insert(&self, info: VmInfo, dir: PathBuf, child: Option<Child>) {
        let pidfd = Pid::from_raw(info.pid as i32).and_then(|p| pidfd_open(p, PidfdFlags::empty()).ok());
        if let Some(fd) = &pidfd {
            let _ = epoll::add(&self.epoll, fd.as_fd(), epoll::EventData::new_u64(token(&info.id)), epoll::EventFlags::IN);
        }
        let mut t = self.table.lock().unwrap();
        if let Some(n) = &info.name {
            t.names.insert(n.clone(), info.id.clone());
        }
        let gone = pidfd.is_none() && info.exit.is_none();
        t.by_id.insert(info.id.clone(), Entry { info: info.clone(), dir, child, pidfd, ctl: None, forwards: Vec::new(), uplink: None });
        drop(t);
        if gone {
            self.on_exit(&info.id);
        }
    }

    /// Find a VM by id, unique id prefix, or name.
    fn lookup(&self, t: &Table, key: &str) -> ApiResult<String> {
        if t.by_id.contains_key(key) {
            return Ok(key.to_string());
        }
        if let Some(id) = t.names.get(key).filter(|id| !id.is_empty()) {
            return Ok(id.clone());
        }
        let matches: Vec<&String> = t.by_id.keys().filter(|id| key.len() >= 3 && id.starts_with(key)).collect();
        match matches.len() {
            1 => Ok(matches[0].clone()),
            0 => Err(ApiError::new(404, format!("no such VM: {key}"))),
            _ => Err(ApiError::new(409, format!("'{key}' matches several VMs"))),
        }
    }

    /// All VMs.
    pub fn list(&self) -> Vec<VmInfo> {
        let t = self.table.lock().unwrap();
        let mut v: Vec<VmInfo> = t.by_id.values().map(|e| e.info.clone()).collect();
        v.sort_by(|a, b| a.created_ms.cmp(&b.created_ms).then(a.id.cmp(&b.id)));
        v
    }

    /// One VM.
    pub fn get(&self, key: &str) -> ApiResult<VmInfo> {
        let t = self.table.lock().unwrap();
        let id = self.lookup(&t, key)?;
        Ok(t.by_id[&id].info.clone())
    }

    fn dir_of(&self, key: &str) -> ApiResult<(String, PathBuf, VmInfo)> {
        let t = self.table.lock().unwrap();
        let id = self.lookup(&t, key)?;
        let e = &t.by_id[&id];
        Ok((id, e.dir.clone(), e.info.clone()))
    }

    fn call_worker(&self, key: &str, req: &Request) -> ApiResult<(String, Reply)> {
        let (id, dir, info) = self.dir_of(key)?;
        if info.state == VmState::Exited {
            return Err(ApiError::new(409, format!("VM {id} has exited")));
        }
        match self.call_session(&id, &dir, req) {
            Ok(r) if r.ok => Ok((id, r)),
            Ok(r) => Err(ApiError::new(409, r.error.unwrap_or_default())),
            Err(e) => Err(ApiError::new(409, format!("VM {id} is not reachable: {e}"))),
        }
    }

    /// A quick request on the VM's open control connection (opened on
    /// first use, reopened once if it went stale).
    fn call_session(&self, id: &str, dir: &Path, req: &Request) -> std::io::Result<Reply> {
        let cached = self.table.lock().unwrap().by_id.get_mut(id).and_then(|e| e.ctl.take());
        let fresh = || -> std::io::Result<UnixStream> {
            let c = UnixStream::connect(dir.join("ctl.sock"))?;
            c.set_read_timeout(Some(Duration::from_secs(5)))?;
            Ok(c)
        };
        let once = |c: &UnixStream| -> std::io::Result<Reply> {
            proto::send_line(c, req, None)?;
            let mut line = String::new();
            BufReader::new(c).read_line(&mut line)?;
            if line.is_empty() {
                return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "VMM process closed the connection"));
            }
            serde_json::from_str(&line).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
        };
        let (conn, reply) = match cached.map(|c| once(&c).map(|r| (c, r))) {
            Some(Ok(ok)) => ok,
            _ => {
                let c = fresh()?;
                let r = once(&c)?;
                (c, r)
            }
        };
        if let Some(e) = self.table.lock().unwrap().by_id.get_mut(id) {
            if e.ctl.is_none() && e.info.state != VmState::Exited {
                e.ctl = Some(conn);
            }
        }
        Ok(reply)
    }

    fn set_state(&self, id: &str, r: &Reply) {
        let mut t = self.table.lock().unwrap();
        if let Some(e) = t.by_id.get_mut(id) {
            if e.info.state != VmState::Exited {
                match r.state {
                    Some(WorkerState::Paused) => e.info.state = VmState::Paused,
                    Some(WorkerState::Running) => e.info.state = VmState::Running,
                    _ => {}
                }
            }
        }
    }

    /// Pause or resume.
    pub fn pause(&self, key: &str, pause: bool) -> ApiResult<VmInfo> {
        let (id, r) = self.call_worker(key, if pause { &Request::Pause } else { &Request::Resume })?;
        self.set_state(&id, &r);
        self.get(&id)
    }

    /// Ask the guest to stop; kill it after `grace`.
    pub fn stop(&self, key: &str, grace: Duration) -> ApiResult<VmInfo> {
        let (id, _) = self.call_worker(key, &Request::Stop { grace_ms: grace.as_millis() as u64 })?;
        self.wait(&id, Some(grace + Duration::from_secs(5)))?;
        self.get(&id)
    }

    /// Kill now.
    pub fn kill(&self, key: &str) -> ApiResult<VmInfo> {
        let (id, dir, info) = self.dir_of(key)?;
        if info.state == VmState::Exited {
            return Err(ApiError::new(409, format!("VM {id} has exited")));
        }
        if proto::call(&dir.join("ctl.sock"), &Request::Kill, None, Some(Duration::from_secs(2))).is_err() {
            kill_pid(info.pid);
        }
        self.wait(&id, Some(Duration::from_secs(5)))?;
        self.get(&id)
    }

    /// Wait until the VM has exited (or `timeout`).
    pub fn wait(&self, key: &str, timeout: Option<Duration>) -> ApiResult<ExitInfo> {
        let mut t = self.table.lock().unwrap();
        let id = self.lookup(&t, key)?;
        let deadline = timeout.map(|d| std::time::Instant::now() + d);
        loop {
            match t.by_id.get(&id) {
                None => return Err(ApiError::new(404, format!("VM {id} was removed"))),
                Some(e) if e.info.exit.is_some() => return Ok(e.info.exit.clone().unwrap_or(ExitInfo { code: 0, reason: String::new() })),
                _ => {}
            }
            t = match deadline {
                Some(d) => {
                    let now = std::time::Instant::now();
                    if now >= d {
                        return Err(ApiError::new(504, format!("VM {id} did not exit in time")));
                    }
                    self.exited.wait_timeout(t, d - now).unwrap().0
                }
                None => self.exited.wait(t).unwrap(),
            };
        }
    }

    /// Console output: the buffer, then (if `follow`) new output until the
    /// VM ends. `out` returns false to stop.
    pub fn logs(&self, key: &str, follow: bool, out: &mut dyn FnMut(&[u8]) -> bool) -> ApiResult<()> {
        let (_, dir, info) = self.dir_of(key)?;
        if info.state != VmState::Exited {
            if let Ok((r, mut stream)) = proto::call(&dir.join("ctl.sock"), &Request::Logs { follow }, None, None) {
                if r.ok {
                    let mut buf = [0u8; 16384];
                    loop {
                        match stream.read(&mut buf) {
                            Ok(0) | Err(_) => return Ok(()),
                            Ok(n) => {
                                if !out(&buf[..n]) {
                                    return Ok(());
                                }
                            }
                        }
                    }
                }
            }
        }
        // Exited (or exiting): the VMM process saved the buffer.
        let data = fs::read(dir.join("console.log")).unwrap_or_default();
        out(&data);
        Ok(())
    }

    /// Remove a VM (with `force`, kill it first if it runs).
    pub fn remove(&self, key: &str, force: bool) -> ApiResult<()> {
        let (id, dir, info) = self.dir_of(key)?;
        if info.state != VmState::Exited {
            if !force {
                return Err(ApiError::new(409, format!("VM {id} is running: stop it first or force removal")));
            }
            if proto::call(&dir.join("ctl.sock"), &Request::Kill, None, Some(Duration::from_secs(2))).is_err() {
                kill_pid(info.pid);
            }
            if self.wait(&id, Some(Duration::from_secs(5))).is_err() {
                kill_pid(info.pid);
                self.wait(&id, Some(Duration::from_secs(5)))?;
            }
        }
        let mut t = self.table.lock().unwrap();
        if let Some(e) = t.by_id.remove(&id) {
            if let Some(n) = &e.info.name {
                t.names.remove(n);
            }
            if let Some(fd) = &e.pidfd {
                let _ = epoll::delete(&self.epoll, fd.as_fd());
            }
            if let Some(fd) = &e.uplink {
                let _ = epoll::delete(&self.epoll, fd.as_fd());
            }
        }
        drop(t);
        self.remove_dir(&dir);
        Ok(())
    }

    /// A VMM process ended: record how, reap it, wake waiters.
    fn on_exit(&self, id: &str) {
        let mut t = self.table.lock().unwrap();
        let Some(e) = t.by_id.get_mut(id) else { return };
        if let Some(fd) = e.pidfd.take() {
            let _ = epoll::delete(&self.epoll, fd.as_fd());
        }
        if let Some(c) = e.child.as_mut() {
            let _ = c.wait();
        }
        e.child = None;
        e.ctl = None;
        e.forwards.clear();
        if e.info.exit.is_none() {
            let exit = read_exit(&e.dir).unwrap_or_else(|| {
                let x = ExitInfo { code: 137, reason: "the VMM process died".into() };
                let _ = write_atomic(&e.dir.join("exit.json"), &serde_json::to_vec(&x).unwrap_or_default());
                x
            });
            e.info.exit = Some(exit);
        }
        e.info.state = VmState::Exited;
        let ip = e.info.ip.clone();
        drop(t);
        self.free_ip(&ip);
        self.exited.notify_all();
    }

    /// The exit watcher: one thread, one epoll over every VMM process's pidfd.
    pub fn watch_loop(self: Arc<Self>) {
        let mut events: Vec<epoll::Event> = Vec::with_capacity(256);
        loop {
            events.clear();
            if epoll::wait(&self.epoll, rustix::buffer::spare_capacity(&mut events), None).is_err() {
                continue;
            }
            // Ids are 12 hex digits: the token is the id.
            for ev in events.iter() {
                let t = ev.data.u64();
                if t & UPLINK != 0 {
                    self.on_uplink(&format!("{:012x}", t & !UPLINK));
                } else {
                    self.on_exit(&format!("{t:012x}"));
                }
            }
        }
    }

    /// A message on family `root`'s uplink: a VMM process forked by one of
    /// its VMs asks to become a VM of its own.
    fn on_uplink(&self, root: &str) {
        use crate::proto::{recv_packet, send_packet, ForkKit, ForkNote};
        let fd = {
            let t = self.table.lock().unwrap();
            t.by_id.get(root).and_then(|e| e.uplink.as_ref()).and_then(|f| f.try_clone().ok())
        };
        let Some(fd) = fd else { return };
        let (msg, fds) = match recv_packet(fd.as_fd()) {
            Ok(m) => m,
            Err(_) => {
                // Every VMM process of the family has gone.
                let _ = epoll::delete(&self.epoll, fd.as_fd());
                if let Some(e) = self.table.lock().unwrap().by_id.get_mut(root) {
                    e.uplink = None;
                }
                return;
            }
        };
        let Some(reply) = fds.into_iter().next() else { return };
        let r = match serde_json::from_slice::<ForkNote>(&msg) {
            Ok(note) => self.fork_child(root, &note),
            Err(e) => Err(format!("bad fork note: {e}")),
        };
        let _ = match r {
            Ok((id, fds)) => {
                let b: Vec<_> = fds.iter().map(|f| f.as_fd()).collect();
                send_packet(reply.as_fd(), &ForkKit { id: Some(id), error: None }, &b)
            }
            Err(e) => {
                eprintln!("wispd: family {root}: fork refused: {e}");
                send_packet(reply.as_fd(), &ForkKit { id: None, error: Some(e) }, &[])
            }
        };
    }

    /// Make process `note.child_pid`, forked by a VM of family `root`, a VM
    /// of the toolstack: id, directory, files, control socket, table entry.
    fn fork_child(&self, root: &str, note: &crate::proto::ForkNote) -> Result<(String, [OwnedFd; 4]), String> {
        let (parent, dir_uid, old) = {
            let t = self.table.lock().unwrap();
            let in_family = |e: &&Entry| e.info.id == root || e.info.family.as_deref() == Some(root);
            // The forking VM may have ended already (fork, then exit at once).
            let e = t
                .by_id
                .values()
                .filter(in_family)
                .find(|e| e.info.pid == note.parent_pid)
                .ok_or("the forking VM is not a VM of this family")?;
            if t.by_id.values().any(|e| e.info.pid == note.child_pid && e.info.exit.is_none()) {
                return Err(format!("process {} is a VM already", note.child_pid));
            }
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
            (e.info.clone(), Self::dir_uid(&e.dir).ok_or("the family has no user id")?, old)
        };
        for id in old {
            let _ = self.remove(&id, false);
        }
        // The process must be one of the family's VMM processes (forked from
        // the root's, so it carries the root's command line); its parent may
        // be gone already, so that is not checked.
        if !is_our_worker(note.child_pid, root) {
            return Err(format!("process {} is not a VMM process of this family", note.child_pid));
        }
        let (id, dir) = self.new_vm_dir(dir_uid)?;
        let files = crate::jail::JailFiles::open(&dir).map_err(|e| format!("files: {e}"))?;
        let listener = std::os::unix::net::UnixListener::bind(dir.join("ctl.sock")).map_err(|e| format!("bind: {e}"))?;
        let _ = fs::write(dir.join("pid"), note.child_pid.to_string());
        let info = VmInfo {
            id: id.clone(),
            name: None,
            image: parent.image.clone(),
            args: parent.args.clone(),
            mem: parent.mem,
            state: VmState::Running,
            pid: note.child_pid,
            created_ms: now_ms(),
            exit: None,
            boot_us: None,
            ip: None,
            ports: Vec::new(),
            parent: Some(parent.id.clone()),
            family: Some(root.to_string()),
        };
        write_atomic(&dir.join("vm.json"), &serde_json::to_vec(&info).unwrap_or_default()).map_err(|e| e.to_string())?;
        self.insert(info, dir, None);
        let (d, x, c) = files.into_parts();
        Ok((id, [d, OwnedFd::from(x), OwnedFd::from(c), OwnedFd::from(listener)]))
    }

    /// Find the VMs a previous daemon left: adopt running ones, record
    /// exited ones, and stop pooled shells (the new pool replaces them).
    fn adopt(&self) {
        let Ok(rd) = fs::read_dir(self.vms_dir()) else { return };
        for ent in rd.flatten() {
            let dir = ent.path();
            let id = ent.file_name().to_string_lossy().into_owned();
            let pid: Option<u32> = fs::read_to_string(dir.join("pid")).ok().and_then(|s| s.trim().parse().ok());
            let info: Option<VmInfo> = fs::read(dir.join("vm.json")).ok().and_then(|b| serde_json::from_slice(&b).ok());
            // A forked VM's process carries its family root's command line.
            let cmd_id = info.as_ref().and_then(|i| i.family.clone()).unwrap_or_else(|| id.clone());
            let alive = pid.is_some_and(|p| is_our_worker(p, &cmd_id));
            let Some(mut info) = info else {
                // A pooled shell or a VM that never started.
                if alive {
                    kill_pid(pid.unwrap_or(0));
                }
                let _ = fs::remove_dir_all(&dir);
                continue;
            };
            if let Some(u) = Self::dir_uid(&dir) {
                self.uids.lock().unwrap().used.insert(u);
            }
            info.exit = read_exit(&dir);
            if info.exit.is_none() && alive {
                if let Some(h) = info.ip.as_deref().and_then(|i| self.host_part(i)) {
                    self.net.lock().unwrap().used.insert(h);
                }
            }
            if info.exit.is_some() {
                info.state = VmState::Exited;
            } else if alive {
                if let Ok((r, _)) = proto::call(&dir.join("ctl.sock"), &Request::Status, None, Some(Duration::from_secs(2))) {
                    info.state = if r.state == Some(WorkerState::Paused) { VmState::Paused } else { VmState::Running };
                    info.boot_us = r.boot_us;
                }
            }
            let restore: Vec<_> = if info.exit.is_none() && alive { info.ports.clone() } else { Vec::new() };
            let (id, ip) = (info.id.clone(), info.ip.clone());
            self.insert(info, dir, None);
            if let Some(ip) = ip.and_then(|i| i.parse().ok()) {
                let fw: Vec<_> = restore
                    .iter()
                    .filter_map(|m| match crate::forward::Forward::start(*m, ip) {
                        Ok(f) => Some(f),
                        Err(e) => {
                            eprintln!("wispd: VM {id}: cannot forward host port {} again: {e}", m.host);
                            None
                        }
                    })
                    .collect();
                if let Some(e) = self.table.lock().unwrap().by_id.get_mut(&id) {
                    e.forwards = fw;
                }
            }
        }
    }

    /// Stop the pool's shells (daemon shutdown). Running VMs keep running.
    pub fn shutdown(&self) {
        for w in self.pool.drain() {
            self.discard_worker(w);
        }
    }
}

fn read_exit(dir: &Path) -> Option<ExitInfo> {
    fs::read(dir.join("exit.json")).ok().and_then(|b| serde_json::from_slice(&b).ok())
}

/// True if `pid` is a live VMM process for VM `id` (guards against pid reuse).
fn is_our_worker(pid: u32, id: &str) -> bool {
    fs::read(format!("/proc/{pid}/cmdline"))
        .map(|c| {
            let args: Vec<&[u8]> = c.split(|&b| b == 0).collect();
            args.iter().any(|a| *a == b"__worker") && args.iter().any(|a| *a == id.as_bytes())
        })
        .unwrap_or(false)
}

fn kill_pid(pid: u32) {
    if let Some(p) = Pid::from_raw(pid as i32) {
        let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
    }
}
