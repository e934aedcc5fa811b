//! The disk: a file (or block device) of the host behind the request and
//! completion rings of `wisp_abi::blk`. An I/O thread takes the guest's
//! requests, checks each on its own copy (alignment, bounds, the buffer in
//! memory the guest may read or write), reads or writes the file straight
//! into or out of guest RAM (`preadv`/`pwritev` on iovecs from
//! [`RamView::host_ptr`]: no bounce buffer, no Rust reference into guest
//! memory), writes the completions and wakes a waiting guest with
//! `events::DISK`. It sleeps on the disk's kick eventfd (the guest's
//! doorbell, signalled inside KVM) with `monitor_idle` set, and looks at
//! the ring once more after setting it, so no request is left behind. A
//! guest that breaks the ring rules loses its disk (`stopped`, the reason
//! on stderr); the VM goes on. A forked child has no disk (as no NIC).
//!
//! A snapshot holds the I/O thread between passes (`serving`): every
//! request taken is done and its completion published, so the ring in
//! guest RAM is whole. The disk's contents are not in the snapshot: a
//! restored disk is the volume given to the restore, and its I/O thread
//! starts from the indices the ring holds (checked as any index is).

use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use rustix::event::{eventfd, EventfdFlags};
use wisp_abi::blk::{self, hdr, BlkComp, BlkReq, COMP_OFF, MAX_IO, REQ_OFF, SECTOR, SLOTS};
use wisp_abi::{errno, DeviceKind};

use super::{Device, DeviceState};
use crate::access::UserMap;
use crate::control::Control;
use crate::error::Result as VmmResult;
use crate::memory::RamView;

/// A disk to give a VM.
pub struct BlockConfig {
    /// The backing file or block device.
    pub file: OwnedFd,
    /// Bytes the guest sees (a multiple of the sector, at most the file's).
    pub capacity: u64,
    /// Writes are refused.
    pub read_only: bool,
}

impl BlockConfig {
    /// Open `path` as a disk: read-only, or read-write. A file whose size
    /// is not a whole number of 4 KiB sectors, or that is empty, is
    /// refused.
    pub fn open(path: &std::path::Path, read_only: bool) -> Result<BlockConfig, String> {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(!read_only)
            .open(path)
            .map_err(|e| format!("volume {}: {e}", path.display()))?;
        BlockConfig::from_file(f, read_only, &path.display().to_string())
    }

    /// The disk on an open file or block device (`name` for messages),
    /// checked as [`BlockConfig::open`] checks it.
    pub fn from_file(f: File, read_only: bool, name: &str) -> Result<BlockConfig, String> {
        let meta = f.metadata().map_err(|e| format!("volume {name}: {e}"))?;
        use std::os::unix::fs::FileTypeExt;
        let size = if meta.is_file() {
            meta.len()
        } else if meta.file_type().is_block_device() {
            use std::io::Seek;
            let mut f = &f;
            f.seek(std::io::SeekFrom::End(0)).map_err(|e| format!("volume {name}: {e}"))?
        } else {
            return Err(format!("volume {name} is neither a regular file nor a block device"));
        };
        if size == 0 || size % SECTOR != 0 {
            return Err(format!(
                "volume {name} is {size} bytes: a volume is a whole number of {SECTOR}-byte sectors (e.g. truncate -s 64M {name})"
            ));
        }
        Ok(BlockConfig { file: OwnedFd::from(f), capacity: size, read_only })
    }
}

/// A VM's disk.
pub struct Disk {
    capacity: u64,
    read_only: bool,
    state: State,
    /// Held by the I/O thread for each pass over the ring, and by a
    /// snapshot while it reads guest RAM.
    serving: Arc<Mutex<()>>,
    /// Restored from a snapshot: the ring in guest RAM is under way.
    restored: bool,
}

enum State {
    Ready(OwnedFd),
    Running(Running),
    Detached,
}

struct Running {
    kick: Arc<OwnedFd>,
    kick_kvm: Option<vmm_sys_util::eventfd::EventFd>,
    stop: Arc<AtomicBool>,
    file_raw: i32,
    thread: Option<JoinHandle<()>>,
}

impl Disk {
    /// The disk on `cfg.file`.
    pub fn new(cfg: BlockConfig) -> Disk {
        Disk { capacity: cfg.capacity, read_only: cfg.read_only, state: State::Ready(cfg.file), serving: Arc::new(Mutex::new(())), restored: false }
    }
}

impl Device for Disk {
    fn kind(&self) -> DeviceKind {
        DeviceKind::Block
    }

    fn region_size(&self) -> u64 {
        blk::REGION_SIZE
    }

    fn params(&self) -> [u64; 5] {
        let flags = if self.read_only { blk::flags::READ_ONLY } else { 0 };
        [self.capacity, flags, blk::encode_geometry(SLOTS, MAX_IO), 0, 0]
    }

    fn activate(&mut self, ram: RamView, base: u64, control: Arc<Control>, user: &UserMap) -> std::io::Result<()> {
        let State::Ready(file) = std::mem::replace(&mut self.state, State::Detached) else {
            return Err(std::io::Error::other("the disk is already active"));
        };
        let kick = Arc::new(eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?);
        let stop = Arc::new(AtomicBool::new(false));
        let file_raw = file.as_raw_fd();
        // A restored ring goes on from the indices the monitor published
        // (the guest could have changed them: they are checked as any index).
        let (req_cons, comp_prod) = if self.restored {
            let at = |off| ram.load_u32(base + off).map_err(std::io::Error::other);
            (at(hdr::REQ_CONS)?, at(hdr::COMP_PROD)?)
        } else {
            (0, 0)
        };
        let io = Io {
            ram,
            base,
            user: user.clone(),
            file: File::from(file),
            capacity: self.capacity,
            read_only: self.read_only,
            control,
            kick: kick.clone(),
            stop: stop.clone(),
            serving: self.serving.clone(),
            req_cons,
            comp_prod,
        };
        let thread = std::thread::Builder::new().name("disk".into()).stack_size(128 << 10).spawn(move || {
            crate::sys::thread_started(crate::sys::ThreadRole::Io);
            io.run()
        })?;
        let kick_kvm = super::net::dup_eventfd(&kick);
        self.state = State::Running(Running { kick, kick_kvm, stop, file_raw, thread: Some(thread) });
        Ok(())
    }

    fn notify(&self) {
        if let State::Running(r) = &self.state {
            r.kick();
        }
    }

    fn kick_eventfd(&self) -> Option<&vmm_sys_util::eventfd::EventFd> {
        match &self.state {
            State::Running(r) => r.kick_kvm.as_ref(),
            _ => None,
        }
    }

    fn on_fork_child(&mut self) {
        // The parent's I/O thread may have held the lock at the fork: the
        // child's is its own (it has no I/O thread to take it).
        self.serving = Arc::new(Mutex::new(()));
        match std::mem::replace(&mut self.state, State::Detached) {
            State::Running(r) => {
                // SAFETY: the thread owning the file exists only in the
                // parent; here its state is forgotten (never dropped), so
                // nothing else closes or uses the number.
                unsafe { crate::sys::close_orphaned_fd(r.file_raw) };
                std::mem::forget(r);
            }
            State::Ready(f) => drop(f),
            State::Detached => {}
        }
    }

    fn quiesced(&self, f: &mut dyn FnMut()) -> crate::error::Result<()> {
        // Between two passes of the I/O thread: no request half done.
        let _held = self.serving.lock().unwrap_or_else(|p| p.into_inner());
        f();
        Ok(())
    }

    fn restore_state(&mut self, state: &DeviceState) -> VmmResult<()> {
        if state.params[0] != self.capacity {
            return Err(crate::error::Error::Devices(format!(
                "saved disk of {} bytes; this volume has {}",
                state.params[0], self.capacity
            )));
        }
        // The guest read its disk's mode at boot.
        let saved_ro = state.params[1] & blk::flags::READ_ONLY != 0;
        if saved_ro != self.read_only {
            let mode = |ro| if ro { "read-only" } else { "read-write" };
            return Err(crate::error::Error::Devices(format!("the saved disk was {}; this volume is given {}", mode(saved_ro), mode(self.read_only))));
        }
        self.restored = true;
        Ok(())
    }
}

impl Running {
    fn kick(&self) {
        let _ = rustix::io::write(self.kick.as_fd(), &1u64.to_ne_bytes());
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        self.kick();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The I/O thread's side: the rings, the file, its own indices.
struct Io {
    ram: RamView,
    base: u64,
    user: UserMap,
    file: File,
    capacity: u64,
    read_only: bool,
    control: Arc<Control>,
    kick: Arc<OwnedFd>,
    stop: Arc<AtomicBool>,
    /// Held for each pass (see [`Disk::quiesced`]).
    serving: Arc<Mutex<()>>,
    /// The monitor's own indices (the guest's copies are never read back).
    req_cons: u32,
    comp_prod: u32,
}

impl Io {
    fn run(mut self) {
        let serving = self.serving.clone();
        loop {
            if self.stop.load(Ordering::Acquire) {
                return;
            }
            // A pass: requests done, then the flag set, under the lock a
            // snapshot takes.
            let pass = serving.lock().unwrap_or_else(|p| p.into_inner());
            let _ = self.ram.store_u32(self.base + hdr::MONITOR_IDLE, 0);
            match self.serve() {
                Ok(0) => {}
                Ok(_) => self.control.post_events(wisp_abi::events::DISK),
                Err(why) => return self.fail(&why),
            }
            // Asleep from here: the guest kicks after queuing. A request
            // queued before the flag was seen is looked for once more.
            let _ = self.ram.store_u32(self.base + hdr::MONITOR_IDLE, 1);
            if self.pending().unwrap_or(true) {
                continue;
            }
            drop(pass);
            let mut fds = [rustix::event::PollFd::new(&*self.kick, rustix::event::PollFlags::IN)];
            let _ = rustix::event::poll(&mut fds, None);
            let mut b = [0u8; 8];
            let _ = rustix::io::read(&*self.kick, &mut b);
        }
    }

    /// Whether the guest queued requests not taken yet.
    fn pending(&self) -> Result<bool, String> {
        let prod = self.ram.load_u32(self.base + hdr::REQ_PROD).map_err(|e| e.to_string())?;
        Ok(prod != self.req_cons)
    }

    /// Do every request queued; the number done.
    fn serve(&mut self) -> Result<u32, String> {
        let mut done = 0;
        loop {
            let prod = self.ram.load_u32(self.base + hdr::REQ_PROD).map_err(|e| e.to_string())?;
            let queued = prod.wrapping_sub(self.req_cons);
            if queued == 0 {
                return Ok(done);
            }
            if queued > SLOTS {
                return Err(format!("request index {prod} ran {queued} ahead of the {} taken (at most {SLOTS})", self.req_cons));
            }
            let comp_cons = self.ram.load_u32(self.base + hdr::COMP_CONS).map_err(|e| e.to_string())?;
            if self.comp_prod.wrapping_sub(comp_cons) >= SLOTS {
                return Err(format!("more than {SLOTS} requests unanswered or unread (completions read: {comp_cons})"));
            }
            let slot = (self.req_cons % SLOTS) as u64;
            // A copy: the guest may change the slot meanwhile.
            let req: BlkReq = self.ram.read_obj(self.base + REQ_OFF + slot * 32).map_err(|e| e.to_string())?;
            let (status, len) = self.perform(&req)?;
            let comp = BlkComp { tag: req.tag, status, len, reserved: 0 };
            let at = self.base + COMP_OFF + (self.comp_prod % SLOTS) as u64 * 16;
            self.ram.write_obj(at, &comp).map_err(|e| e.to_string())?;
            self.req_cons = self.req_cons.wrapping_add(1);
            self.comp_prod = self.comp_prod.wrapping_add(1);
            self.ram.store_u32(self.base + hdr::REQ_CONS, self.req_cons).map_err(|e| e.to_string())?;
            self.ram.store_u32(self.base + hdr::COMP_PROD, self.comp_prod).map_err(|e| e.to_string())?;
            done += 1;
        }
    }

    /// Check and do one request: its status and bytes moved, or why the
    /// disk stops.
    fn perform(&self, r: &BlkReq) -> Result<(i32, u32), String> {
        if r.op == blk::op::FLUSH {
            return Ok(match self.file.sync_data() {
                Ok(()) => (0, 0),
                Err(_) => (errno::EIO as i32, 0),
            });
        }
        if r.op != blk::op::READ && r.op != blk::op::WRITE {
            return Err(format!("request {} has operation {}", r.tag, r.op));
        }
        let len = r.len as u64;
        if len == 0 || len > MAX_IO as u64 || len % SECTOR != 0 || r.offset % SECTOR != 0 {
            return Err(format!(
                "request {} of {len} bytes at {:#x}: offsets and lengths are whole {SECTOR}-byte sectors, at most {MAX_IO}",
                r.tag, r.offset
            ));
        }
        if r.offset.checked_add(len).is_none_or(|end| end > self.capacity) {
            return Err(format!("request {} at {:#x}+{len:#x} is beyond the disk's {} bytes", r.tag, r.offset, self.capacity));
        }
        let write = r.op == blk::op::WRITE;
        // A read writes guest memory: only where the guest may write; a
        // write reads it: only where it may read.
        let allowed = if write { self.user.readable(r.addr, len) } else { self.user.writable(r.addr, len) };
        if !allowed {
            return Err(format!(
                "request {}: buffer {:#x}+{len:#x} is not in memory the guest may {}",
                r.tag,
                r.addr,
                if write { "read" } else { "write" }
            ));
        }
        if write && self.read_only {
            return Ok((errno::EROFS as i32, 0));
        }
        let ptr = self.ram.host_ptr(r.addr, len as usize).map_err(|e| e.to_string())?;
        let iov = libc::iovec { iov_base: ptr.cast(), iov_len: len as usize };
        let fd = self.file.as_raw_fd();
        // SAFETY: the iovec describes `len` bytes of guest RAM inside its
        // mapping (checked by `host_ptr`), mapped for as long as `ram`
        // lives; the kernel reads or writes them (no Rust reference to
        // them exists), and `fd` is this thread's open file.
        let n = unsafe {
            if write {
                libc::pwritev(fd, &iov, 1, r.offset as libc::off_t)
            } else {
                libc::preadv(fd, &iov, 1, r.offset as libc::off_t)
            }
        };
        // (A short transfer of a regular file inside its size does not
        // happen; one is reported as an I/O error, not retried.)
        Ok(if n == len as isize { (0, len as u32) } else { (errno::EIO as i32, n.max(0) as u32) })
    }

    /// The guest broke the rules: its disk stops, the VM goes on.
    fn fail(&self, why: &str) {
        let _ = self.ram.store_u32(self.base + hdr::STOPPED, 1);
        crate::sys::stderr_line(&format!("wisp: disk stopped: {why}"));
        self.control.post_events(wisp_abi::events::DISK);
    }
}
