//! Just-in-time VMs (`POST /v1/jit`, `wisp jit add`; issue 18 item 1,
//! after LightVM §7.1; `docs/usecases.md` "Just-in-time VMs"): the daemon
//! listens on a host port, and the first connection from a client address
//! it has no VM for boots a VM of the service's image with a NIC; that
//! connection and the client's later ones are joined to the VM's port
//! (`forward::serve`, the same copying as `wisp run -p`). Nothing the
//! client sent is lost meanwhile: the host's TCP accepted the connection
//! and holds its bytes until the VM takes them. A VM with no open
//! connection for the service's idle time is removed; so is one that
//! ended on its own (the client's next connection boots a new one).
//!
//! Services are not kept across a daemon restart; their VMs are re-adopted
//! as plain VMs then (`wisp rm` removes them).

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use wisp_api::{AddJit, CreateVm, JitClient, JitInfo, VmState, JIT_MAX_VMS};
use wisp_vmm::{check_mem_size, DEFAULT_MEM};

use super::create::Extras;
use super::error::ActionError;
use super::Daemon;
use crate::forward;

/// Most services a daemon serves.
pub const MAX_JITS: usize = 64;
/// How long a client's idle VM is kept unless the service says.
const DEFAULT_IDLE: Duration = Duration::from_secs(30);
/// Longest from a client's connection to its VM answering on its port.
const READY_WITHIN: Duration = Duration::from_secs(10);
/// Between two connection attempts to a VM not listening yet.
const RETRY: Duration = Duration::from_micros(200);
/// Longest one connection attempt to a VM waits for its answer.
const TRY_WITHIN: Duration = Duration::from_millis(100);

/// The services, by id.
#[derive(Default)]
pub struct Jits {
    by_id: Mutex<HashMap<String, Arc<Service>>>,
}

/// One service: its listener, its clients' VMs.
struct Service {
    /// What it was asked to be (`clients` and counts left empty).
    info: JitInfo,
    idle: Duration,
    listener: Arc<TcpListener>,
    state: Mutex<State>,
    /// Rung when a boot ends and when the service stops.
    changed: Condvar,
}

#[derive(Default)]
struct State {
    clients: HashMap<IpAddr, Client>,
    boots: u64,
    connections: u64,
    failed: u64,
    stopped: bool,
}

/// A client's VM: `None` while it boots (its other connections wait).
struct Client {
    vm: Option<(String, Ipv4Addr)>,
    open: u32,
    connections: u64,
    /// When its last connection closed.
    last: Instant,
    boot_us: u64,
}

/// An open connection of a client: counted while it lives.
struct Open {
    svc: Arc<Service>,
    from: IpAddr,
    vm: String,
}

impl Drop for Open {
    fn drop(&mut self) {
        let mut st = self.svc.lock();
        if let Some(c) = st.clients.get_mut(&self.from).filter(|c| c.vm.as_ref().is_some_and(|(id, _)| *id == self.vm)) {
            c.open = c.open.saturating_sub(1);
            c.last = Instant::now();
        }
    }
}

impl Service {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A connection from `from`: its VM's end (booted now if it has none)
    /// and its guard; `None` closes the client's connection.
    fn connect(self: &Arc<Self>, d: &Daemon, from: IpAddr) -> Option<(TcpStream, Open)> {
        let arrived = Instant::now();
        let (vm, ip, fresh) = self.vm_for(d, from, arrived)?;
        let open = Open { svc: self.clone(), from, vm: vm.clone() };
        match connect_until(SocketAddr::from((ip, self.info.port.vm)), arrived + READY_WITHIN, || running(d, &vm)) {
            Ok(s) => {
                if fresh {
                    if let Some(c) = self.lock().clients.get_mut(&from) {
                        c.boot_us = arrived.elapsed().as_micros() as u64;
                    }
                }
                Some((s, open))
            }
            Err(e) => {
                eprintln!("wispd: jit {}: client {from}: VM {vm} did not answer on port {}: {e}; removed", self.info.id, self.info.port.vm);
                drop(open);
                self.forget(d, from, &vm);
                None
            }
        }
    }

    /// The VM of client `from` (id, address, whether it was booted for
    /// this connection), its connection counted.
    fn vm_for(&self, d: &Daemon, from: IpAddr, arrived: Instant) -> Option<(String, Ipv4Addr, bool)> {
        let mut st = self.lock();
        loop {
            if st.stopped {
                return None;
            }
            match st.clients.get(&from).map(|c| c.vm.clone()) {
                None => break,
                // Its VM boots for another of its connections.
                Some(None) => st = self.changed.wait(st).unwrap_or_else(|e| e.into_inner()),
                Some(Some((vm, ip))) if running(d, &vm) => {
                    st.connections += 1;
                    let c = st.clients.get_mut(&from).expect("found above");
                    c.open += 1;
                    c.connections += 1;
                    return Some((vm, ip, false));
                }
                // It ended on its own: a new one.
                Some(Some((vm, _))) => {
                    st.clients.remove(&from);
                    drop(st);
                    let _ = d.remove(&vm, true);
                    st = self.lock();
                }
            }
        }
        if st.clients.len() >= self.info.max_vms as usize {
            st.failed += 1;
            return None;
        }
        st.clients.insert(from, Client { vm: None, open: 1, connections: 1, last: arrived, boot_us: 0 });
        drop(st);
        let req = CreateVm {
            image: self.info.image.clone(),
            args: self.info.args.clone(),
            mem: Some(self.info.mem),
            net: true,
            tenant: self.info.tenant.clone(),
            ..CreateVm::default()
        };
        let made = d.create(req, arrived, Extras::default());
        let mut st = self.lock();
        self.changed.notify_all();
        let made = match made {
            Ok(info) => info,
            Err(e) => {
                eprintln!("wispd: jit {}: client {from}: its VM did not start: {e}", self.info.id);
                st.clients.remove(&from);
                st.failed += 1;
                return None;
            }
        };
        let ip = made.ip.as_deref().and_then(|a| a.parse().ok());
        match ip {
            Some(ip) if !st.stopped => {
                st.boots += 1;
                st.connections += 1;
                st.clients.get_mut(&from).expect("inserted above").vm = Some((made.id.clone(), ip));
                Some((made.id, ip, true))
            }
            _ => {
                st.clients.remove(&from);
                drop(st);
                let _ = d.remove(&made.id, true);
                None
            }
        }
    }

    /// Drop client `from`'s VM `vm` (it failed): removed.
    fn forget(&self, d: &Daemon, from: IpAddr, vm: &str) {
        let mut st = self.lock();
        st.failed += 1;
        if st.clients.get(&from).is_some_and(|c| c.vm.as_ref().is_some_and(|(id, _)| id == vm)) {
            st.clients.remove(&from);
        }
        drop(st);
        let _ = d.remove(vm, true);
    }

    /// Remove the VMs idle for the service's idle time, until it stops.
    fn reap(&self, d: &Daemon) {
        let tick = (self.idle / 4).clamp(Duration::from_millis(5), Duration::from_secs(1));
        let mut st = self.lock();
        while !st.stopped {
            st = self.changed.wait_timeout(st, tick).unwrap_or_else(|e| e.into_inner()).0;
            let now = Instant::now();
            let idle: Vec<IpAddr> = st
                .clients
                .iter()
                .filter(|(_, c)| c.vm.is_some() && c.open == 0 && now.duration_since(c.last) >= self.idle)
                .map(|(ip, _)| *ip)
                .collect();
            let vms: Vec<String> = idle.iter().filter_map(|ip| st.clients.remove(ip)).filter_map(|c| c.vm.map(|(id, _)| id)).collect();
            if !vms.is_empty() {
                drop(st);
                for vm in vms {
                    let _ = d.remove(&vm, true);
                }
                st = self.lock();
            }
        }
    }

    fn info(&self) -> JitInfo {
        let st = self.lock();
        let mut clients: Vec<JitClient> = st
            .clients
            .iter()
            .filter_map(|(from, c)| {
                let (vm, ip) = c.vm.as_ref()?;
                Some(JitClient { client: from.to_string(), vm: vm.clone(), ip: ip.to_string(), connections: c.connections, open: c.open, boot_us: c.boot_us })
            })
            .collect();
        clients.sort_by(|a, b| a.client.cmp(&b.client));
        JitInfo { boots: st.boots, connections: st.connections, failed: st.failed, clients, ..self.info.clone() }
    }
}

/// Whether VM `id` is in the table and not ended.
fn running(d: &Daemon, id: &str) -> bool {
    d.vms.lock().by_id.get(id).is_some_and(|e| e.info.state != VmState::Exited)
}

/// Connect to `to`, again while it refuses (the guest has not bound its
/// port yet) or does not answer (each try waits [`TRY_WITHIN`] at most),
/// until `deadline`, or until `alive` says the VM has ended.
fn connect_until(to: SocketAddr, deadline: Instant, alive: impl Fn() -> bool) -> io::Result<TcpStream> {
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "no answer in time"));
        }
        match TcpStream::connect_timeout(&to, left.min(TRY_WITHIN)) {
            Err(e) if matches!(e.kind(), io::ErrorKind::ConnectionRefused | io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock) => {
                if !alive() {
                    return Err(io::Error::other("the VM has ended"));
                }
                if e.kind() == io::ErrorKind::ConnectionRefused {
                    std::thread::sleep(RETRY.min(left));
                }
            }
            done => return done,
        }
    }
}

impl Daemon {
    /// Start a just-in-time service.
    pub(super) fn add_jit(self: &Arc<Self>, j: AddJit) -> Result<JitInfo, ActionError> {
        wisp_api::action::check_jit(&j).map_err(ActionError::GuestData)?;
        if self.jits.by_id.lock().unwrap().len() >= MAX_JITS {
            return Err(ActionError::TooManyJits(MAX_JITS));
        }
        // The image is found now, not at the first client's connection.
        self.images.lookup(&self.cfg.image_dirs, &j.image)?;
        let mem = check_mem_size(j.mem.unwrap_or(DEFAULT_MEM)).map_err(ActionError::BadMemory)?;
        let listener = TcpListener::bind(SocketAddr::new(j.port.host_addr(), j.port.host))
            .map_err(|source| ActionError::PortInUse { port: j.port.host, source })?;
        let idle = j.idle_ms.map_or(DEFAULT_IDLE, Duration::from_millis);
        let info = JitInfo {
            id: super::process::new_id(),
            image: j.image,
            port: j.port,
            args: j.args,
            mem,
            idle_ms: idle.as_millis() as u64,
            max_vms: j.max_vms.unwrap_or(JIT_MAX_VMS),
            tenant: j.tenant,
            ..JitInfo::default()
        };
        let svc = Arc::new(Service { info, idle, listener: Arc::new(listener), state: Mutex::default(), changed: Condvar::new() });
        let (d, s) = (self.clone(), svc.clone());
        std::thread::Builder::new().name("jit-reap".into()).spawn(move || s.reap(&d)).map_err(ActionError::Vmm)?;
        let (d, s) = (self.clone(), svc.clone());
        if let Err(e) = forward::serve(svc.listener.clone(), svc.info.port.host, move |from| s.connect(&d, from.ip())) {
            svc.lock().stopped = true;
            svc.changed.notify_all();
            return Err(ActionError::Vmm(e));
        }
        self.jits.by_id.lock().unwrap().insert(svc.info.id.clone(), svc.clone());
        Ok(svc.info())
    }

    /// The services.
    pub(super) fn jits(&self) -> Vec<JitInfo> {
        let mut v: Vec<JitInfo> = self.jits.by_id.lock().unwrap().values().map(|s| s.info()).collect();
        v.sort_by(|a, b| a.id.cmp(&b.id));
        v
    }

    /// Stop service `id`: its port closes, its VMs are removed (those
    /// booting, by their boots once they end).
    pub(super) fn remove_jit(&self, id: &str) -> Result<(), ActionError> {
        let svc = self.jits.by_id.lock().unwrap().remove(id).ok_or_else(|| ActionError::NoJit(id.to_string()))?;
        forward::shut(&svc.listener);
        let mut st = svc.lock();
        st.stopped = true;
        let vms: Vec<String> = st.clients.drain().filter_map(|(_, c)| c.vm.map(|(vm, _)| vm)).collect();
        drop(st);
        svc.changed.notify_all();
        for vm in vms {
            let _ = self.remove(&vm, true);
        }
        Ok(())
    }
}
