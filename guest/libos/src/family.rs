//! Process-like VMs: fork, and IPC inside a family (VMs forked from one
//! root): pipes, signals, exit/wait, System V-style message queues and
//! shared memory. See `wisp_abi::family` for the ABI.
//!
//! Blocking calls park the VM in the monitor until they can complete (no
//! CPU used); the `_nowait` variants return `EAGAIN`/`ENOMSG` instead.
//! Signals are delivered when the VM next talks to the monitor (any family
//! call, or the executor's idle): a handler set with [`signal`] runs, else
//! the default action — `SIGCHLD` is ignored, every other signal ends the
//! VM with status 128 + the signal number. An interrupted blocking call is
//! restarted after the handlers ran.
//!
//! Pipe reads and writes and signals between running members go through
//! the family's shared page without an exit when they can (`rings.rs`);
//! signals raised there are delivered after such a call too.

use core::fmt;

use wisp_abi::errno;
use wisp_abi::family::{flags, op};
use wisp_abi::Hypercall;

pub use wisp_abi::family::flags::{IPC_CREAT, IPC_EXCL};
pub use wisp_abi::family::signal::*;
pub use wisp_abi::family::status;

use crate::hypercall;
use crate::signals::family_call;

/// A failed call: the negative errno of the ABI, as a positive number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Errno(pub i64);

impl Errno {
    pub const EPERM: Errno = Errno(-errno::EPERM);
    pub const ENOENT: Errno = Errno(-errno::ENOENT);
    pub const ESRCH: Errno = Errno(-errno::ESRCH);
    pub const EINTR: Errno = Errno(-errno::EINTR);
    pub const EIO: Errno = Errno(-errno::EIO);
    pub const E2BIG: Errno = Errno(-errno::E2BIG);
    pub const EBADF: Errno = Errno(-errno::EBADF);
    pub const ECHILD: Errno = Errno(-errno::ECHILD);
    pub const EAGAIN: Errno = Errno(-errno::EAGAIN);
    pub const ENOMEM: Errno = Errno(-errno::ENOMEM);
    pub const EFAULT: Errno = Errno(-errno::EFAULT);
    pub const EEXIST: Errno = Errno(-errno::EEXIST);
    pub const EINVAL: Errno = Errno(-errno::EINVAL);
    pub const EMFILE: Errno = Errno(-errno::EMFILE);
    pub const ENOSPC: Errno = Errno(-errno::ENOSPC);
    pub const EPIPE: Errno = Errno(-errno::EPIPE);
    pub const ENOSYS: Errno = Errno(-errno::ENOSYS);
    pub const ENOMSG: Errno = Errno(-errno::ENOMSG);
    pub const EIDRM: Errno = Errno(-errno::EIDRM);

    /// The symbolic name.
    pub fn name(self) -> &'static str {
        match self {
            Errno::EPERM => "EPERM",
            Errno::ENOENT => "ENOENT",
            Errno::ESRCH => "ESRCH",
            Errno::EINTR => "EINTR",
            Errno::EIO => "EIO",
            Errno::E2BIG => "E2BIG",
            Errno::EBADF => "EBADF",
            Errno::ECHILD => "ECHILD",
            Errno::EAGAIN => "EAGAIN",
            Errno::ENOMEM => "ENOMEM",
            Errno::EFAULT => "EFAULT",
            Errno::EEXIST => "EEXIST",
            Errno::EINVAL => "EINVAL",
            Errno::EMFILE => "EMFILE",
            Errno::ENOSPC => "ENOSPC",
            Errno::EPIPE => "EPIPE",
            Errno::ENOSYS => "ENOSYS",
            Errno::ENOMSG => "ENOMSG",
            Errno::EIDRM => "EIDRM",
            _ => "E?",
        }
    }
}

impl fmt::Display for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name(), self.0)
    }
}

/// Result of a family call.
pub type Result<T> = core::result::Result<T, Errno>;

/// A VM's pid in its family: the root is 1, each fork gives the next
/// number; never two members (or zombies) at once. VMs of other families
/// and host processes have none.
pub type Pid = u32;

fn check(ret: i64) -> Result<i64> {
    if ret < 0 {
        Err(Errno(-ret))
    } else {
        Ok(ret)
    }
}

/// One family hypercall; runs the handlers of the signals it returns.
fn raw(opcode: u32, flg: u32, a: [u64; 4]) -> (i64, u64) {
    let (r, r2, _) = family_call(opcode, flg, a);
    (r, r2)
}

/// A family call, restarted while it is interrupted (after the stop
/// request or signal that interrupted it was handled).
fn call(opcode: u32, flg: u32, a: [u64; 4]) -> Result<(i64, u64)> {
    loop {
        let (r, r2) = raw(opcode, flg, a);
        if r == errno::EINTR {
            crate::process::dispatch_events(hypercall::idle(0));
            continue;
        }
        return check(r).map(|r| (r, r2));
    }
}

// ----- fork, identity, exit/wait -----

/// Fork this VM. Returns `Ok(0)` in the child and the child's pid in the
/// parent. The child starts with a copy-on-write copy of this VM's memory,
/// its pipe descriptors and shared-memory attachments; a NIC stays with the
/// parent. `EAGAIN`: the family's size limit is reached. The image's
/// manifest needs `features::FORK` (and `FAMILY` for the IPC below).
///
/// ```ignore
/// use wisp::family as f;
/// let (r, w) = f::pipe()?;
/// if f::fork()? == 0 {
///     f::write(w, b"hi from the child")?;
///     wisp::exit(0);
/// }
/// let mut buf = [0u8; 64];
/// let n = f::read(r, &mut buf)?;
/// let (_pid, status) = f::waitpid(-1, false)?.expect("a child");
/// ```
pub fn fork() -> Result<Pid> {
    let mut a = wisp_abi::args::Fork::default();
    hypercall::call(Hypercall::Fork, &mut a);
    if a.ret == 0 {
        crate::rings::after_fork();
    }
    check(a.ret).map(|p| p as Pid)
}

/// This VM's pid.
pub fn getpid() -> Pid {
    match crate::rings::pids() {
        Some((me, _)) => me,
        None => raw(op::GETPID, 0, [0; 4]).0 as Pid,
    }
}

/// The parent's pid (0 for a family's root, or once the parent ended).
pub fn getppid() -> Pid {
    match crate::rings::pids() {
        Some((_, parent)) => parent,
        None => raw(op::GETPID, 0, [0; 4]).1 as Pid,
    }
}

/// Wait for any child to end: (pid, wait status; see [`status`]).
pub fn wait() -> Result<(Pid, u64)> {
    waitpid(-1, false).map(|r| r.unwrap_or((0, 0)))
}

/// Wait for child `pid` (-1: any). With `nohang`, `Ok(None)` if none has
/// ended yet.
pub fn waitpid(pid: i64, nohang: bool) -> Result<Option<(Pid, u64)>> {
    if !nohang {
        crate::rings::spin_for_child(4 * crate::rings::SPIN_NS);
    }
    let flg = if nohang { flags::NOWAIT } else { 0 };
    let (r, st) = call(op::WAIT, flg, [pid as u64, 0, 0, 0])?;
    Ok((r > 0).then_some((r as Pid, st)))
}

// ----- signals -----

/// Run `handler` when signal `sig` arrives (instead of the default action).
pub fn signal(sig: u32, handler: fn(u32)) {
    crate::signals::set_handler(sig, handler);
}

/// Whether family member `pid` is asleep in its monitor right now: in a
/// blocking family call (a read of an empty pipe, a receive on an empty
/// queue, a wait) or idle — as `ps` shows a process in state `S`. `None`
/// if this VM does not use the family's shared page or no member has that
/// pid. A snapshot: it may wake the next moment.
pub fn parked(pid: Pid) -> Option<bool> {
    crate::rings::parked(pid)
}

/// Send signal `sig` to `pid`, a VM of this family (`ESRCH` for a pid no
/// member has). `SIGKILL` ends it at once; other signals are delivered
/// when it next talks to the monitor.
pub fn kill(pid: Pid, sig: u32) -> Result<()> {
    if crate::rings::kill(pid, sig) {
        crate::rings::poll_page();
        return Ok(());
    }
    call(op::KILL, 0, [pid as u64, sig as u64, 0, 0]).map(drop)
}

/// Park until a signal arrives (and its handler ran), like `pause(2)`.
pub fn pause() {
    let sigs = crate::rings::spin_for_signals();
    if sigs != 0 {
        crate::signals::deliver(sigs);
        return;
    }
    loop {
        let (_, _, sigs) = family_call(op::PAUSE, 0, [0; 4]);
        if sigs != 0 {
            return;
        }
        // Interrupted by something else (a stop request): handle it.
        crate::process::dispatch_events(hypercall::idle(0));
    }
}

// ----- pipes -----

/// Create a pipe: (read descriptor, write descriptor).
pub fn pipe() -> Result<(u32, u32)> {
    let (r, w) = call(op::PIPE, 0, [0; 4]).map(|(r, w)| (r as u32, w as u32))?;
    crate::rings::forget(r);
    crate::rings::forget(w);
    Ok((r, w))
}

/// Close a descriptor.
pub fn close(fd: u32) -> Result<()> {
    crate::rings::forget(fd);
    call(op::CLOSE, 0, [fd as u64, 0, 0, 0]).map(drop)
}

/// Read into `buf`; blocks until some data is there. `Ok(0)`: end of file
/// (every write end is closed).
pub fn read(fd: u32, buf: &mut [u8]) -> Result<usize> {
    if let Some(n) = crate::rings::read(fd, buf, crate::rings::SPIN_NS) {
        crate::rings::poll_page();
        return Ok(n);
    }
    call(op::READ, 0, [fd as u64, buf.as_mut_ptr() as u64, buf.len() as u64, 0]).map(|r| r.0 as usize)
}

/// [`read`] without blocking (`EAGAIN` if the pipe is empty).
pub fn read_nowait(fd: u32, buf: &mut [u8]) -> Result<usize> {
    if let Some(n) = crate::rings::read(fd, buf, 0) {
        crate::rings::poll_page();
        return Ok(n);
    }
    call(op::READ, flags::NOWAIT, [fd as u64, buf.as_mut_ptr() as u64, buf.len() as u64, 0]).map(|r| r.0 as usize)
}

/// Write all of `data` (blocking while the pipe is full). `EPIPE`: no
/// reader is left.
pub fn write(fd: u32, data: &[u8]) -> Result<usize> {
    let mut done = crate::rings::write(fd, data);
    crate::rings::poll_page();
    while done < data.len() {
        let rest = &data[done..];
        done += call(op::WRITE, 0, [fd as u64, rest.as_ptr() as u64, rest.len() as u64, 0])?.0 as usize;
    }
    Ok(done)
}

// ----- message queues -----

/// An IPC key from a name and a project id (there are no files in a
/// unikernel: the name is hashed).
pub fn ftok(path: &str, proj_id: u8) -> i64 {
    let mut h: u32 = 0x811c_9dc5;
    for b in path.bytes() {
        h = (h ^ b as u32).wrapping_mul(0x0100_0193);
    }
    (((proj_id as u32) << 24) | (h & 0x00ff_ffff)) as i64
}

/// The message queue for `key` (0: a new private one); `flg` takes
/// [`IPC_CREAT`] and [`IPC_EXCL`].
pub fn msgget(key: i64, flg: u64) -> Result<u64> {
    call(op::MSGGET, 0, [key as u64, flg, 0, 0]).map(|r| r.0 as u64)
}

/// Queue `data` with type `mtype` (> 0); blocks while the queue is full.
pub fn msgsnd(id: u64, mtype: i64, data: &[u8]) -> Result<()> {
    if crate::rings::msgsnd(id, mtype, data) {
        crate::rings::poll_page();
        return Ok(());
    }
    call(op::MSGSND, 0, [id, data.as_ptr() as u64, data.len() as u64, mtype as u64]).map(drop)
}

/// Receive a message into `buf`: the first one (`msgtyp` 0), the first of
/// type `msgtyp` (> 0), or the first of the lowest type up to `-msgtyp`
/// (< 0). Blocks until one is there unless `nowait` (`ENOMSG`). Returns
/// (length, type).
pub fn msgrcv(id: u64, buf: &mut [u8], msgtyp: i64, nowait: bool) -> Result<(usize, i64)> {
    let spin = if nowait { 0 } else { crate::rings::SPIN_NS };
    if let Some((n, t)) = crate::rings::msgrcv(id, buf, msgtyp, false, spin) {
        crate::rings::poll_page();
        return Ok((n, t));
    }
    let flg = if nowait { flags::NOWAIT } else { 0 };
    call(op::MSGRCV, flg, [id, buf.as_mut_ptr() as u64, buf.len() as u64, msgtyp as u64])
        .map(|(n, t)| (n as usize, t as i64))
}

/// Remove a message queue (waiters get `EIDRM`).
pub fn msgrmid(id: u64) -> Result<()> {
    call(op::MSGRMID, 0, [id, 0, 0, 0]).map(drop)
}

// ----- shared memory -----

/// The shared-memory segment for `key` (0: a new private one) of `size`
/// bytes; `flg` takes [`IPC_CREAT`] and [`IPC_EXCL`].
pub fn shmget(key: i64, size: usize, flg: u64) -> Result<u64> {
    call(op::SHMGET, 0, [key as u64, flg, size as u64, 0]).map(|r| r.0 as u64)
}

/// An attached shared-memory segment. Other VMs of the family may change
/// it at any time, so it is only reachable as atomics or by copying.
#[derive(Clone, Copy, Debug)]
pub struct Shm {
    addr: usize,
    len: usize,
}

impl Shm {
    /// Bytes in the segment.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for an empty segment (never: segments have at least a page).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Its guest address (the same in every VM of the family).
    pub fn addr(&self) -> usize {
        self.addr
    }

    /// The segment as 64-bit atomic words.
    pub fn words(&self) -> &[core::sync::atomic::AtomicU64] {
        // SAFETY: the monitor mapped `len` bytes (a multiple of the page
        // size) at the page-aligned `addr` until `shmdt`, which consumes
        // this handle; atomics may alias concurrent writers.
        unsafe { core::slice::from_raw_parts(self.addr as *const core::sync::atomic::AtomicU64, self.len / 8) }
    }

    /// Copy `data` in at byte offset `off` (panics if it does not fit).
    pub fn write(&self, off: usize, data: &[u8]) {
        assert!(off.checked_add(data.len()).is_some_and(|e| e <= self.len));
        for (i, b) in data.iter().enumerate() {
            // SAFETY: in bounds (checked above); volatile because other VMs
            // share the memory.
            unsafe { core::ptr::write_volatile((self.addr + off + i) as *mut u8, *b) };
        }
    }

    /// Copy `buf.len()` bytes out from byte offset `off`.
    pub fn read(&self, off: usize, buf: &mut [u8]) {
        assert!(off.checked_add(buf.len()).is_some_and(|e| e <= self.len));
        for (i, b) in buf.iter_mut().enumerate() {
            // SAFETY: as for `write`.
            *b = unsafe { core::ptr::read_volatile((self.addr + off + i) as *const u8) };
        }
    }
}

/// Attach segment `id`: at the same address in every VM of the family that
/// attaches it; inherited by fork.
pub fn shmat(id: u64) -> Result<Shm> {
    let (addr, size) = call(op::SHMAT, 0, [id, 0, 0, 0])?;
    Ok(Shm { addr: addr as usize, len: size as usize })
}

/// Detach a segment; touching its memory afterwards stops the VM.
pub fn shmdt(shm: Shm) -> Result<()> {
    call(op::SHMDT, 0, [shm.addr as u64, 0, 0, 0]).map(drop)
}

/// Remove segment `id` once no VM has it attached.
pub fn shmrmid(id: u64) -> Result<()> {
    call(op::SHMRMID, 0, [id, 0, 0, 0]).map(drop)
}
