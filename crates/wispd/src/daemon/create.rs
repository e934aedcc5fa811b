//! Creating and starting a VM: check the request and its limits, admit it
//! under the daemon's quotas, reserve the name, take a prepared VMM
//! process, give its family's control group the limits asked for, give it
//! a NIC and host ports, record the VM and send `start`. Whatever has been
//! acquired when a step fails is given back by one guard ([`Rollback`]),
//! so every failure is just `?`.

use std::io::{self, BufReader, Read};
use std::net::Ipv4Addr;
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use wisp_api::{http, BootTrace, CreateVm, VmInfo, VmState, VM_ID_HEADER};
use wisp_vmm::{check_mem_size, DEFAULT_MEM};
use wisp_vmm_process::proto::{self, Reply, Request};

use super::error::ActionError;
use super::snapshot::Restorable;
use super::process::Worker;
use super::record::Proc;
use super::quota;
use super::{now_ms, Daemon};
use crate::forward::Forward;

/// A create's volumes, opened: (file, read-only) each.
pub(super) type Vols = Vec<(std::os::fd::OwnedFd, bool)>;

/// Brings a held restore's last increment (see [`Extras::hold`]).
pub(super) type More<'a> = Box<dyn FnOnce() -> Result<Arc<Restorable>, ActionError> + 'a>;

/// What a create takes besides its request: volumes opened with the
/// client's rights, a snapshot to restore, and where a template's
/// snapshot goes (the write end of the daemon's pipe).
#[derive(Default)]
pub(super) struct Extras<'a> {
    pub vols: Vols,
    pub restore: Option<Arc<Restorable>>,
    /// The bases `restore` is laid over, oldest first.
    pub bases: Vec<Arc<Restorable>>,
    pub template: Option<std::os::fd::OwnedFd>,
    /// Hold the restore once its pages are mapped, ask this for one more
    /// increment (made over `restore`), lay it over and only then run the
    /// VM: a migration's destination takes the last increment so.
    pub hold: Option<More<'a>>,
    /// Shared libraries to map for it, checked (`libs.rs`).
    pub libs: Vec<Arc<super::libs::LibFile>>,
}

pub(super) fn valid_name(n: &str) -> bool {
    wisp_api::valid_name(n, 64)
}

/// What a create holds so far. Dropped before [`Rollback::commit`], it
/// gives everything back: before the VM is in the table, the name, the
/// address and the VMM process one by one; after, the whole VM (removed by
/// force, as `rm -f` would).
struct Rollback<'a> {
    d: &'a Daemon,
    /// Guest RAM admitted under the quotas, until the VM is in the table.
    admitted: Option<u64>,
    name: Option<String>,
    worker: Option<Worker>,
    ip: Option<String>,
    /// The VM whose links were made (`links.rs`), until it is in the table.
    links: Option<String>,
    vm: Option<String>,
    /// A place taken in a group, and the VM directory made for it, until
    /// the VM is in the table.
    place: Option<(String, std::path::PathBuf)>,
}

impl<'a> Rollback<'a> {
    fn new(d: &'a Daemon) -> Rollback<'a> {
        Rollback { d, admitted: None, name: None, worker: None, ip: None, links: None, vm: None, place: None }
    }

    /// The VM is in the table now, with its name, process and address:
    /// from here on, undoing means removing it.
    fn tabled(&mut self, id: &str) {
        if let Some(mem) = self.admitted.take() {
            self.d.vms.lock().settle(mem);
        }
        self.name = None;
        self.ip = None;
        self.links = None;
        self.place = None;
        self.vm = Some(id.to_string());
    }

    /// Success: keep everything.
    fn commit(mut self) {
        self.vm = None;
    }
}

impl Drop for Rollback<'_> {
    fn drop(&mut self) {
        if let Some(mem) = self.admitted.take() {
            self.d.vms.lock().settle(mem);
        }
        if let Some(id) = self.vm.take() {
            let _ = self.d.remove(&id, true);
            return;
        }
        if let Some(n) = self.name.take() {
            self.d.vms.lock().release_name(&n);
        }
        if let Some(id) = self.links.take() {
            self.d.links.remove(&id);
        }
        if let Some(ip) = self.ip.take() {
            self.d.net.free(Some(&ip));
        }
        // A group's VM has no process of its own to discard.
        if let Some(w) = self.worker.take().filter(|_| self.place.is_none()) {
            self.d.discard_worker(w);
        }
        if let Some((group, dir)) = self.place.take() {
            self.d.remove_dir(&dir);
            self.d.leave_group(&group);
        }
    }
}

impl Daemon {
    /// Create and start a VM.
    pub(super) fn create(&self, req: CreateVm, arrived: Instant, extras: Extras<'_>) -> Result<VmInfo, ActionError> {
        self.create_inner(req, Attach::No, arrived, extras).map(|(info, _)| info)
    }

    /// Create and start a VM whose console streams to the API client on
    /// `client`, its own connection, handed to the VMM process: that
    /// process writes the response (`head`, made here once the VM has its
    /// id, then the console as HTTP chunks until the VM ends) with no hop
    /// through the daemon. On an error nothing has been written to
    /// `client`: the caller answers it.
    pub(super) fn create_handed_over(&self, req: CreateVm, arrived: Instant, client: &UnixStream, extras: Extras<'_>) -> Result<VmInfo, ActionError> {
        self.create_inner(req, Attach::Client(client), arrived, extras).map(|(info, _)| info)
    }

    /// Create and start a VM and answer once its console has printed its
    /// first complete line: the VM with `first_line_us`, the time from
    /// `arrived` (the request's arrival) to that line reaching the daemon.
    /// The line is awaited on the same stream an attached create reads (the
    /// vCPU thread writes the guest's output straight into it), blocking
    /// until it comes, the VM ends (its end of the stream closes) or
    /// [`FIRST_LINE_DEADLINE`] after `arrived` passes; the stream is then
    /// closed, which the VMM process takes as a reader gone.
    pub(super) fn create_wait_line(&self, req: CreateVm, arrived: Instant, extras: Extras<'_>) -> Result<VmInfo, ActionError> {
        // The pool's refill waits for the first line too.
        let _busy = self.pool.busy();
        let (info, stream) = self.create_inner(req, Attach::Daemon, arrived, extras)?;
        let mut stream = stream.expect("attached start returns its stream");
        let line_at = match first_line(&mut stream, arrived + FIRST_LINE_DEADLINE) {
            Ok(at) => at,
            Err(NoLine::Ended) => {
                drop(stream);
                let reason = match self.wait(&info.id, Some(Duration::from_secs(2))) {
                    Ok(x) => format!("exit {}: {}", x.code, x.reason),
                    Err(_) => "its console closed".into(),
                };
                return Err(ActionError::EndedBeforeLine { id: info.id, reason });
            }
            Err(NoLine::Deadline) => return Err(ActionError::NoLineInTime { id: info.id, waited: FIRST_LINE_DEADLINE }),
            Err(NoLine::Io(e)) => return Err(ActionError::Vmm(e)),
        };
        drop(stream);
        let us = line_at.saturating_duration_since(arrived).as_micros() as u64;
        let mut t = self.vms.lock();
        match t.by_id.get_mut(&info.id) {
            Some(e) => {
                e.info.first_line_us = Some(us);
                Ok(e.info.clone())
            }
            None => Ok(VmInfo { first_line_us: Some(us), ..info }),
        }
    }

    /// A create: of `req.image`, or of the snapshot `restore` (read and
    /// checked from `req.restore`).
    fn create_inner(&self, req: CreateVm, attach: Attach<'_>, arrived: Instant, extras: Extras<'_>) -> Result<(VmInfo, Option<BufReader<UnixStream>>), ActionError> {
        let Extras { vols, restore, bases, template, hold, libs } = extras;
        if hold.is_some() && restore.is_none() {
            return Err(ActionError::Snapshot { path: req.image.clone(), why: "only a restore is held".into() });
        }
        let mem = match &restore {
            Some(r) => r.snap.header.mem_size,
            None => req.mem.unwrap_or(DEFAULT_MEM),
        };
        let mem = check_mem_size(mem).map_err(ActionError::BadMemory)?;
        if let Some(n) = &req.name {
            if !valid_name(n) {
                return Err(ActionError::InvalidName(n.clone()));
            }
        }
        // The router checked it already; the daemon does not rely on that.
        req.check()?;
        // The shell this create will likely take wakes while the daemon works.
        if self.cfg.vms_per_process <= 1 && !req.recycle {
            match restore {
                None => self.pool.poke(mem, &req.image),
                Some(_) => self.pool.poke_any(mem),
            }
        }
        let limits = quota::request_limits(&req, mem, self.host_cpus)?;
        if self.cgroups.is_none() && (req.memory.is_some() || req.cpus.is_some()) {
            return Err(ActionError::NoCgroups);
        }
        let data = super::guestdata::memfd(&req)?;
        // Until the VM runs (a client's, until its first output) the pool's
        // refill waits.
        let _busy = self.pool.busy();
        let image = match restore {
            None => Some(self.images.lookup(&self.cfg.image_dirs, &req.image)?),
            Some(_) => None,
        };
        let mut undo = Rollback::new(self);
        self.vms.lock().admit(mem, &self.cfg.quotas)?;
        undo.admitted = Some(mem);
        // Reserve the name before any work.
        if let Some(n) = &req.name {
            self.vms.lock().reserve_name(n)?;
            undo.name = Some(n.clone());
        }
        // A VM a group can hold goes to one (`wispd --vms-per-process`).
        // A recycled run goes to a recycling group (`group.rs`).
        let (worker, hosted) = match &image {
            Some(_) if req.recycle => {
                let (w, h) = self.host_in_group(req.tenant.as_deref().unwrap_or(""), mem, true, false, &mut undo)?;
                (w, Some(h))
            }
            Some(image) if self.cfg.vms_per_process > 1 && super::group::groupable(&req, image) => {
                let (w, h) = self.host_in_group(req.tenant.as_deref().unwrap_or(""), mem, false, req.wants_nic(), &mut undo)?;
                (w, Some(h))
            }
            _ => {
                let taken = match &image {
                    Some(image) => self.pool.take(mem, image),
                    None => self.pool.take_any(mem),
                };
                let w = match taken {
                    Some(w) => w,
                    None => self.spawn_worker(mem).map_err(ActionError::Prepare)?,
                };
                (w, None)
            }
        };
        let worker = undo.worker.insert(worker);
        // The shell's group has a family's default limits: set those asked for.
        if let Some(c) = &self.cgroups {
            if limits != quota::family_limits(mem, None, None, None) {
                c.set_limits(&worker.id, &limits).map_err(ActionError::Contain)?;
            }
        }
        // A restored VM with a NIC keeps its address (its guest has it).
        let restore_ip = restore.as_ref().and_then(|r| r.nic_ip());
        let mut net = if req.wants_nic() || restore_ip.is_some() {
            let (mut spec, tap) = self.net.alloc_at(&worker.id, req.net_peers, restore_ip).map_err(ActionError::Network)?;
            spec.rate = req.net_rate.map_or((0, 0), |r| (r.bytes_per_sec, r.frames_per_sec));
            undo.ip = Some(Ipv4Addr::from(spec.ip).to_string());
            Some((spec, tap))
        } else {
            // (Closed off this path.)
            self.net.release(&worker.id);
            None
        };
        // Its links: their taps in the clients' namespaces, their routes.
        let links = match net.as_mut() {
            Some((spec, _)) if !req.links.is_empty() => {
                undo.links = Some(worker.id.clone());
                let made = self.links.make(&worker.id, spec.ip, (self.cfg.subnet, self.cfg.link_subnets), &req.links)?;
                spec.routes = made.subnets.clone();
                Some(made)
            }
            _ => None,
        };
        let (link_specs, link_taps) = links.map_or((Vec::new(), Vec::new()), |m| (m.specs, m.taps));
        // Host ports first: a port in use fails the request before the VM starts.
        let forwards = match &net {
            Some((spec, _)) => Forward::start_all(&req.ports, Ipv4Addr::from(spec.ip))
                .map_err(|(m, source)| ActionError::PortInUse { port: m.host, source })?,
            None => Vec::new(),
        };
        let mut worker = undo.worker.take().expect("held above");
        let session = worker.session.take();
        let uplink = worker.uplink.take();
        // The shell holds this very image loaded ahead: no descriptor, no load.
        let preloaded = image.as_ref().is_some_and(|image| worker.preloaded.as_ref().is_some_and(|p| Arc::ptr_eq(p, image)));
        let info = VmInfo {
            ports: req.ports.clone(),
            links: req.links.clone(),
            net_peers: req.net_peers,
            ip: net.as_ref().map(|(spec, _)| Ipv4Addr::from(spec.ip).to_string()),
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
            first_line_us: None,
            boot_trace: None,
            parent: None,
            family: None,
            limits: self.cgroups.as_ref().filter(|_| hosted.is_none()).map(|_| quota::shown(&limits, req.family_limit)),
            tenant: req.tenant.clone(),
            group: hosted.as_ref().map(|h| h.group.clone()),
        };
        let dir = worker.dir.clone();
        // Watched once the start is sent (below).
        self.insert_unwatched(info.clone(), worker);
        undo.tabled(&info.id);
        if let Some(e) = self.vms.lock().by_id.get_mut(&info.id) {
            e.forwards = forwards;
        }
        let (spec, tap) = net.map_or((None, None), |(n, t)| (Some(n), Some(t)));
        // The family's uplink: forked VMs of this one announce themselves on
        // it (made and watched when the shell was, else now).
        // An image that cannot fork gets none: no descriptor in the daemon
        // for the VM's life (one per VM is what bounds how many it holds).
        // (The pooled shell's uplink is unwatched once the start is sent.)
        let mut unused_uplink = None;
        let (uplink, watched) = match uplink {
            // (A restored VM does not fork: its family is its own, with no uplink.)
            _ if !image.as_ref().is_some_and(|i| i.image.forks()) => {
                unused_uplink = uplink;
                (None, false)
            }
            Some(u) => (Some(u), true),
            None => (super::process::uplink_pair(), false),
        };
        let client_head = match attach {
            Attach::Client(_) => {
                let extra = [(VM_ID_HEADER, info.id.as_str()), ("Connection", "close")];
                Some(String::from_utf8_lossy(&http::chunked_head(201, "application/octet-stream", &extra)).into_owned())
            }
            _ => None,
        };
        let start = match &hosted {
            Some(_) => Request::Host {
                vm: info.id.clone(),
                image_name: image.as_ref().map_or_else(String::new, |i| i.image.name.clone()),
                args: req.args,
                timeout_ms: req.timeout_ms,
                attach: matches!(attach, Attach::Daemon),
                client_head,
                data: data.is_some(),
                stdin: req.stdin,
                libs: libs.iter().map(|l| l.name.clone()).collect(),
                net: spec,
                links: link_specs,
            },
            None => Request::Start {
                image_name: image.as_ref().map_or_else(|| "snapshot".into(), |i| i.image.name.clone()),
                preloaded,
                restore: restore.is_some(),
                bases: bases.len() as u32,
                template: template.is_some(),
                args: req.args,
                timeout_ms: req.timeout_ms,
                attach: matches!(attach, Attach::Daemon),
                net: spec,
                links: link_specs,
                uplink: uplink.is_some(),
                family_limit: req.family_limit,
                client_head,
                data: data.is_some(),
                stdin: req.stdin,
                volumes: vols.iter().map(|(_, ro)| *ro).collect(),
                hold: hold.is_some(),
                libs: libs.iter().map(|l| l.name.clone()).collect(),
            },
        };
        // A group's VM: its files and control socket's listener first.
        let mut fds: Vec<_> = hosted.iter().flat_map(|h| [h.files.exit.as_fd(), h.files.console.as_fd(), h.files.errors.as_fd(), h.listener.as_fd()]).collect();
        fds.extend((!preloaded).then(|| image.as_ref().map_or_else(|| restore.as_ref().expect("a restore without an image").memfd.as_fd(), |i| i.memfd.as_fd())));
        fds.extend(bases.iter().map(|b| b.memfd.as_fd()));
        fds.extend(tap.as_ref().map(|t| t.as_fd()));
        fds.extend(link_taps.iter().map(|t| t.as_fd()));
        if let Some((mine, theirs)) = &uplink {
            fds.push(theirs.as_fd());
            if !watched {
                self.watch_uplink(&info.id, mine.as_fd());
            }
        }
        if let Attach::Client(c) = attach {
            fds.push(c.as_fd());
        }
        fds.extend(data.as_ref().map(|d| d.as_fd()));
        fds.extend(vols.iter().map(|(f, _)| f.as_fd()));
        fds.extend(libs.iter().map(|l| l.memfd.as_fd()));
        fds.extend(template.as_ref().map(|t| t.as_fd()));
        let sent_ns = wisp_vmm_process::monotonic_ns();
        let arrived_ns = sent_ns.saturating_sub(arrived.elapsed().as_nanos() as u64);
        let sent = super::process::send_to_shell(session, &dir, &start, &fds);
        // The record lives where VMM processes cannot write (`record`):
        // written while the VMM process starts the VM (in place, ~10-25 µs:
        // `fsutil::rewrite`; before the send it costs the start that much).
        // A daemon killed in between leaves a VM whose record is still its
        // shell's: the next daemon stops it as a pooled shell.
        let saved = self.save(&info.id);
        // Nothing else before the wait for the answer: the VMM process may
        // run on this very CPU as soon as this thread waits.
        let answer = sent.and_then(proto::read_reply);
        saved.map_err(ActionError::Record)?;
        drop(fds);
        self.watch_pid(&info.id);
        if let Some((mine, _)) = &unused_uplink {
            self.unwatch(mine.as_fd());
        }
        // The VMM process holds the tap now: it disappears when that process ends.
        drop(tap);
        // The group holds the VM's files and socket now.
        drop(hosted);
        if let Some((mine, _theirs)) = uplink {
            if let Some(e) = self.vms.lock().by_id.get_mut(&info.id) {
                e.uplink = Some(mine);
            }
        }
        let (reply, stream) = answer.map_err(ActionError::Vmm)?;
        // A held restore said it holds the pages mapped: its last increment
        // goes on the same connection, and the answer is then the start's.
        let (reply, stream) = match hold {
            Some(more) if reply.ok => {
                let inc = more()?;
                proto::send_on(stream.into_inner(), &Request::Continue, &[inc.memfd.as_fd()]).and_then(proto::read_reply).map_err(ActionError::Vmm)?
            }
            _ => (reply, stream),
        };
        let Reply { ok: true, boot_us, received_ns, entered_ns, preloaded: held, .. } = reply else {
            return Err(ActionError::StartRefused(reply.error.unwrap_or_else(|| "start failed".into())));
        };
        // A boot, on the daemon's own clock: the request's arrival to the
        // VMM process's answer that the guest has run (`scrape.rs`).
        self.boot_seconds.observe(arrived.elapsed());
        undo.commit();
        // The VMM process's clock readings are its word: shown, never used.
        let boot_trace = received_ns.zip(entered_ns).map(|(received_ns, entered_ns)| BootTrace {
            arrived_ns,
            sent_ns,
            received_ns,
            entered_ns,
            first_output_ns: None,
            preloaded: held,
        });
        self.set_boot(&info.id, boot_us, boot_trace);
        // A client's start: the VMM process says when the first output went
        // out; until then (or a short while) the pool's refill waits.
        let mut stream = stream;
        if let Attach::Client(_) = attach {
            let _ = stream.get_ref().set_read_timeout(Some(FIRST_OUTPUT_WAIT));
            if let Some(at) = proto::read_reply_line(&mut stream).ok().and_then(|r| r.first_output_ns) {
                let trace = boot_trace.map(|t| BootTrace { first_output_ns: Some(at), ..t });
                self.set_boot(&info.id, boot_us, trace);
            }
        }
        drop(_busy);
        drop(unused_uplink);
        let stream = matches!(attach, Attach::Daemon).then(|| {
            let _ = stream.get_ref().set_read_timeout(None);
            stream
        });
        if let Some(e) = self.vms.lock().by_id.get(&info.id) {
            return Ok((e.info.clone(), stream));
        }
        Ok((info, stream))
    }

    /// A place in a group for a VM of `tenant` and `mem` bytes, with its
    /// directory, files, control socket and record made: the VM's
    /// [`Worker`] (the group's process, a session to the group's control
    /// socket, and the pending `wait` that watches the VM in a pidfd's
    /// place) and what goes with the `host` request.
    fn host_in_group(&self, tenant: &str, mem: u64, recycle: bool, nic: bool, undo: &mut Rollback<'_>) -> Result<(Worker, Hosted), ActionError> {
        // A group that cannot make the slot (its process died) is closed,
        // and the VM goes to another, once.
        let mut tries = 2;
        let (place, slot) = loop {
            let mut place = self.take_place(tenant, mem, recycle)?;
            match self.take_slot(&mut place, nic) {
                Ok(s) => break (place, s),
                Err(e) => {
                    self.close_group(&place.group);
                    self.leave_group(&place.group);
                    tries -= 1;
                    if tries == 0 {
                        return Err(e);
                    }
                }
            }
        };
        let super::group::Slot { hd, watch, session } = slot;
        undo.place = Some((place.group.clone(), hd.dir.clone()));
        // Written with the VM, after the `host` request is sent.
        self.records.track(&hd.id, Proc { uid: place.uid, pid: place.pid, start: place.start, contained: false, hosts: None });
        let w = Worker {
            id: hd.id,
            pid: place.pid,
            dir: hd.dir,
            child: None,
            pidfd: Some(watch),
            ns_pid: None,
            preloaded: None,
            session: Some(session),
            uplink: None,
        };
        Ok((w, Hosted { group: place.group, files: hd.files, listener: hd.listener }))
    }

    /// Record VM `id`'s execute phase and trace (if it is still listed).
    fn set_boot(&self, id: &str, boot_us: Option<u64>, trace: Option<BootTrace>) {
        if let Some(e) = self.vms.lock().by_id.get_mut(id) {
            e.info.boot_us = boot_us;
            e.info.boot_trace = trace;
        }
    }
}

/// What goes with a `host` request to a group: the VM's files and its
/// control socket's listener.
struct Hosted {
    group: String,
    files: wisp_jail::JailFiles,
    listener: std::os::unix::net::UnixListener,
}

/// Where a start's console goes.
#[derive(Clone, Copy)]
enum Attach<'a> {
    /// Nowhere (the ring only: `logs`).
    No,
    /// To the daemon, on the start's own connection.
    Daemon,
    /// To the API client's connection, handed to the VMM process.
    Client(&'a UnixStream),
}

/// Longest a client's create waits to hear of the first output (keeping
/// the pool's refill back meanwhile).
const FIRST_OUTPUT_WAIT: Duration = Duration::from_millis(20);

/// Longest a create with `wait_line` waits for the guest's first console
/// line, from the request's arrival.
pub(super) const FIRST_LINE_DEADLINE: Duration = Duration::from_secs(10);

/// Why no first line came.
#[derive(Debug)]
enum NoLine {
    /// The stream ended: the VM ended (or its VMM process went away).
    Ended,
    /// The deadline passed.
    Deadline,
    /// Reading the stream failed otherwise.
    Io(io::Error),
}

/// Read a console stream until its first complete line (a `\n`) and
/// return when it arrived; nothing read is kept. Every read ends by
/// `deadline`.
fn first_line(stream: &mut BufReader<UnixStream>, deadline: Instant) -> Result<Instant, NoLine> {
    let mut buf = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(NoLine::Deadline);
        }
        stream.get_ref().set_read_timeout(Some(left)).map_err(NoLine::Io)?;
        match stream.read(&mut buf) {
            Ok(0) => return Err(NoLine::Ended),
            Ok(n) if buf[..n].contains(&b'\n') => return Ok(Instant::now()),
            Ok(_) => {}
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                return Err(NoLine::Deadline)
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(NoLine::Io(e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn pair() -> (UnixStream, BufReader<UnixStream>) {
        let (a, b) = UnixStream::pair().unwrap();
        (a, BufReader::new(b))
    }

    #[test]
    fn the_first_line_is_the_first_newline_wherever_it_falls() {
        let (mut w, mut r) = pair();
        w.write_all(b"part of a line, ").unwrap();
        let before = Instant::now();
        let writer = std::thread::spawn(move || {
            w.write_all(b"its end\nmore").unwrap();
            w
        });
        let at = first_line(&mut r, Instant::now() + Duration::from_secs(10)).unwrap();
        assert!(at >= before);
        drop(writer.join().unwrap());
    }

    #[test]
    fn an_end_or_the_deadline_is_no_line() {
        let (mut w, mut r) = pair();
        w.write_all(b"no newline").unwrap();
        drop(w);
        assert!(matches!(first_line(&mut r, Instant::now() + Duration::from_secs(10)), Err(NoLine::Ended)));
        // A writer that keeps quiet: the deadline ends the wait.
        let (w, mut r) = pair();
        let t = Instant::now();
        assert!(matches!(first_line(&mut r, t + Duration::from_millis(50)), Err(NoLine::Deadline)));
        assert!(t.elapsed() >= Duration::from_millis(50));
        assert!(matches!(first_line(&mut r, t), Err(NoLine::Deadline)));
        drop(w);
    }
}
