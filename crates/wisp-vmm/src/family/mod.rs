//! Families of VMs: fork and the IPC between VMs forked from one root.
//!
//! Every VM owns a *family region*, shared memory made when it is loaded
//! and inherited by each monitor process forked from it: a table of members
//! (pid, parent, state, exit status, descriptors), the family's pipes,
//! message queues and shared-memory segments, all behind one process-shared
//! robust mutex, and per member a *bell* (futex word, event and signal bits)
//! other members ring without the lock. A blocked call parks its vCPU thread
//! on its own bell. Shared-memory segments live in an *arena* (shared memory
//! too) that each attaching VM maps into its guest-physical window at
//! [`wisp_abi::layout::SHM_BASE`].
//!
//! Only monitor code ever touches the region; guests reach it through the
//! family hypercall, which copies bounded data between guest RAM and it.
//! Guest-given numbers (descriptors, ids, pids) are all checked.

mod shared;

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use wisp_abi::errno::*;
use wisp_abi::family::limits::*;
use wisp_abi::family::{flags, signal, status};
use wisp_abi::layout::{PAGE_SIZE, SHM_BASE, SHM_SIZE};

pub(crate) use shared::{close_orphaned_fd, die_with_parent, fork, futex_wait, gettid};
use shared::{futex_wake, SharedMap};

/// Watch `word` for a change from `seq` for at most `SPIN` (and `limit`).
pub(crate) fn spin_on(word: &AtomicU32, seq: u32, limit: std::time::Duration) {
    let until = std::time::Instant::now() + SPIN.min(limit);
    while word.load(Ordering::Acquire) == seq && std::time::Instant::now() < until {
        std::hint::spin_loop();
    }
}

/// How a VM's family behaves; set by whoever runs the VM.
#[derive(Clone, Copy, Debug)]
pub struct FamilyOptions {
    /// Whether the guest may fork (the monitor process must be able to).
    pub fork: bool,
    /// Most VMs alive or not yet waited for in the family (root included,
    /// at most [`MAX_MEMBERS`]); a fork beyond it fails with `EAGAIN`.
    pub limit: u32,
    /// Children's monitor processes end with their parent's (direct mode).
    pub orphans_die: bool,
}

impl Default for FamilyOptions {
    fn default() -> Self {
        FamilyOptions { fork: false, limit: MAX_MEMBERS as u32, orphans_die: true }
    }
}

/// How long a blocked family call watches its bell before sleeping.
const SPIN: std::time::Duration = std::time::Duration::from_micros(50);

/// A member's bell: rung (seq bumped, futex woken) whenever something it may
/// wait for changes.
#[repr(C)]
pub struct Bell {
    pub seq: AtomicU32,
    /// Set to end the VM at once (SIGKILL from the family).
    pub kill: AtomicU32,
    /// Kernel thread id of the vCPU thread (for kicks out of KVM_RUN).
    pub tid: AtomicU32,
    _pad: u32,
    /// `wisp_abi::events` bits for the next idle hypercall.
    pub events: AtomicU64,
    /// Pending signals.
    pub signals: AtomicU64,
    /// Held by the member's vCPU thread while the member lives: a robust
    /// mutex, so the kernel marks it when that thread dies, however it
    /// dies. Others find dead members with a `trylock`.
    alive: std::cell::UnsafeCell<libc::pthread_mutex_t>,
}

impl Bell {
    pub fn ring(&self) {
        self.seq.fetch_add(1, Ordering::AcqRel);
        futex_wake(&self.seq);
    }
}

const MAGIC: u64 = 0x314d_4146_5053_4957; // "WISPFAM1"
const FREE: u32 = 0;
const RUNNING: u32 = 1;
const ZOMBIE: u32 = 2;

#[repr(C)]
struct Header {
    magic: u64,
    lock: libc::pthread_mutex_t,
}

#[repr(C)]
struct Member {
    state: u32,
    waiting: u32,
    pid: i32,
    ppid: i32,
    status: u64,
    /// Attached segments (bit per segment index).
    shm: u64,
    /// 0 = free, else 1 + pipe * 2 + end (0 read, 1 write).
    fds: [u16; MAX_FDS],
}

#[repr(C)]
struct Pipe {
    used: u32,
    readers: u32,
    writers: u32,
    head: u32,
    len: u32,
    _pad: u32,
    buf: [u8; PIPE_CAPACITY],
}

#[repr(C)]
#[derive(Clone, Copy)]
struct MsgEntry {
    mtype: i64,
    len: u64,
}

#[repr(C)]
struct Queue {
    used: u32,
    gen: u32,
    key: i64,
    count: u32,
    bytes: u32,
    entries: [MsgEntry; QUEUE_MESSAGES],
    data: [u8; QUEUE_BYTES],
}

#[repr(C)]
struct Segment {
    used: u32,
    gen: u32,
    key: i64,
    off: u64,
    size: u64,
    attached: u32,
    removed: u32,
}

#[repr(C)]
struct Inner {
    limit: u32,
    gen: u32,
    members: [Member; MAX_MEMBERS],
    pipes: [Pipe; MAX_PIPES],
    queues: [Queue; MAX_QUEUES],
    segments: [Segment; MAX_SEGMENTS],
}

#[repr(C)]
struct Region {
    header: Header,
    bells: [Bell; MAX_MEMBERS],
    inner: Inner,
}

/// A handle on a family region usable from any thread of the process.
#[derive(Clone)]
pub struct BellRef {
    map: Arc<SharedMap>,
    idx: usize,
}

impl BellRef {
    pub fn get(&self) -> &Bell {
        bell(&self.map, self.idx)
    }
}

/// What [`Family::blocking`] waits at most before looking for members
/// that died without anyone noticing (no CPU to speak of: one wake-up).
const RECHECK: std::time::Duration = std::time::Duration::from_secs(1);

/// The `alive` mutex of member `idx`.
fn alive(map: &SharedMap, idx: usize) -> *mut libc::pthread_mutex_t {
    bell(map, idx).alive.get()
}

/// Make member `idx`'s `alive` mutex new and take it (the calling thread
/// is the member's vCPU thread).
fn claim_alive(map: &SharedMap, idx: usize) {
    // SAFETY: the mutex lives in the family region for as long as `map`;
    // slot `idx` was just given to this member, so no live thread uses it.
    unsafe {
        shared::mutex_init(alive(map, idx));
        shared::mutex_lock(alive(map, idx));
    }
}

/// End, as killed, every running member whose vCPU thread is gone (a
/// monitor process killed with nobody to reap it: an orphan). True if it
/// ended any.
fn reap_dead(map: &SharedMap, inner: &mut Inner, me: usize) -> bool {
    let mut any = false;
    for idx in 0..MAX_MEMBERS {
        if idx == me || inner.members[idx].state != RUNNING || inner.members[idx].pid == 0 {
            continue;
        }
        // SAFETY: an initialised robust mutex in the live region (a
        // RUNNING member with a pid was set up by `fork_reserve`/`new_root`).
        match unsafe { shared::mutex_trylock(alive(map, idx)) } {
            shared::TryLock::Busy => {}
            // SAFETY: this thread took it just now.
            shared::TryLock::Acquired => unsafe { shared::mutex_unlock(alive(map, idx)) },
            shared::TryLock::OwnerDied => {
                // SAFETY: as above.
                unsafe { shared::mutex_unlock(alive(map, idx)) };
                exit_member(map, inner, idx, status::signaled(signal::SIGKILL));
                any = true;
            }
        }
    }
    any
}

fn bell(map: &SharedMap, idx: usize) -> &Bell {
    let r = map.as_ptr() as *const Region;
    // SAFETY: the map is at least `size_of::<Region>()` bytes (made by
    // `Family::new_root`), zero-initialised memory is a valid `Bell`, and
    // bells are only accessed through shared references to atomics.
    unsafe { &(*r).bells[idx.min(MAX_MEMBERS - 1)] }
}

/// The family region, locked.
struct Locked<'a> {
    map: &'a SharedMap,
    inner: &'a mut Inner,
}

fn lock(map: &SharedMap) -> Locked<'_> {
    let r = map.as_ptr() as *mut Region;
    // SAFETY: the mutex was initialised by `new_root` before any other
    // process could see the region; `Inner` is only ever accessed while it is
    // held (by every process of the family), so this `&mut` is exclusive;
    // zero bytes are a valid `Inner`, and every index read from it is checked.
    unsafe {
        shared::mutex_lock(&raw mut (*r).header.lock);
        Locked { map, inner: &mut (*r).inner }
    }
}

impl Drop for Locked<'_> {
    fn drop(&mut self) {
        let r = self.map.as_ptr() as *mut Region;
        // SAFETY: this thread took the lock in `lock`.
        unsafe { shared::mutex_unlock(&raw mut (*r).header.lock) }
    }
}

/// What a fork needs to undo or finish.
pub struct ForkSlot {
    pub(crate) idx: usize,
    pub(crate) parent_pid: i32,
}

/// One VM's handle on its family.
pub struct Family {
    map: Arc<SharedMap>,
    arena: Option<Arc<SharedMap>>,
    me: usize,
    pid: i32,
    pub(crate) opts: FamilyOptions,
    /// Segments attached here: (segment index, attach count).
    attached: Vec<(usize, u32)>,
    /// Watches this process's children (made at the first fork).
    reaper: Option<Reaper>,
    /// For a forked VM: the pid of the VM that forked it.
    forked_from: i32,
}

/// Result of a family call: (ret, ret2) or a negative errno.
pub type CallResult = Result<(i64, u64), i64>;

impl Family {
    /// A new family with this VM (process `std::process::id()`) as its root.
    pub fn new_root(opts: FamilyOptions) -> std::io::Result<Family> {
        let map = Arc::new(SharedMap::new(size_of::<Region>())?);
        let r = map.as_ptr() as *mut Region;
        // SAFETY: the region was just mapped, zero-filled and is private to
        // this thread until the first fork.
        unsafe {
            shared::mutex_init(&raw mut (*r).header.lock);
            (*r).header.magic = MAGIC;
        }
        let pid = std::process::id() as i32;
        {
            let l = lock(&map);
            l.inner.limit = opts.limit.clamp(1, MAX_MEMBERS as u32);
            let m = &mut l.inner.members[0];
            m.state = RUNNING;
            m.pid = pid;
        }
        // The loading thread is the vCPU thread (wisp runs a VM on the
        // thread that loaded it).
        claim_alive(&map, 0);
        Ok(Family { map, arena: None, me: 0, pid, opts, attached: Vec::new(), reaper: None, forked_from: 0 })
    }

    pub fn set_options(&mut self, opts: FamilyOptions) {
        self.opts = opts;
        lock(&self.map).inner.limit = opts.limit.clamp(1, MAX_MEMBERS as u32);
    }

    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// For a forked VM, the pid of the VM that forked it (0 for a root),
    /// even if that one has ended since.
    pub fn forked_from(&self) -> i32 {
        self.forked_from
    }

    /// True once this VM forked or was forked (it has family to hear from).
    pub fn has_relatives(&self) -> bool {
        self.me != 0 || self.reaper.is_some()
    }

    pub fn bell_ref(&self) -> BellRef {
        BellRef { map: self.map.clone(), idx: self.me }
    }

    fn bell(&self) -> &Bell {
        bell(&self.map, self.me)
    }

    /// Take the pending signals.
    pub fn take_signals(&self) -> u64 {
        self.bell().signals.swap(0, Ordering::AcqRel)
    }

    /// Make the shared-memory arena (before the first fork or segment, so
    /// every later member inherits it).
    pub fn ensure_arena(&mut self) -> std::io::Result<()> {
        if self.arena.is_none() {
            self.arena = Some(Arc::new(SharedMap::new(SHM_SIZE as usize)?));
        }
        Ok(())
    }

    // ----- fork -----

    /// Reserve a member slot for a child: it inherits this VM's descriptors
    /// and attached segments.
    pub fn fork_reserve(&self) -> Result<ForkSlot, i64> {
        let l = lock(&self.map);
        let inner = &mut *l.inner;
        let members = inner.members.iter().filter(|m| m.state != FREE).count();
        if members >= inner.limit as usize {
            return Err(EAGAIN);
        }
        let Some(idx) = inner.members.iter().position(|m| m.state == FREE) else { return Err(EAGAIN) };
        let fds = inner.members[self.me].fds;
        let shm = inner.members[self.me].shm;
        for (pipe, end) in fds.iter().filter_map(|&f| fd_pipe(f)) {
            *end_refs(&mut inner.pipes[pipe], end) += 1;
        }
        for (i, s) in inner.segments.iter_mut().enumerate() {
            if shm & (1 << i) != 0 {
                s.attached += 1;
            }
        }
        let m = &mut inner.members[idx];
        *m = Member { state: RUNNING, waiting: 0, pid: 0, ppid: self.pid, status: 0, shm, fds };
        let b = bell(&self.map, idx);
        b.kill.store(0, Ordering::Release);
        b.tid.store(0, Ordering::Release);
        b.events.store(0, Ordering::Release);
        b.signals.store(0, Ordering::Release);
        // Free until the child takes it (a previous member's may be stale).
        // SAFETY: the slot is free (no live member uses its mutex) and the
        // region lock is held, so no `reap_dead` looks at it meanwhile.
        unsafe { shared::mutex_init(alive(&self.map, idx)) };
        Ok(ForkSlot { idx, parent_pid: self.pid })
    }

    /// The host fork failed: give the slot back.
    pub fn fork_abort(&self, slot: &ForkSlot) {
        let l = lock(&self.map);
        release_member(l.inner, slot.idx);
        l.inner.members[slot.idx].state = FREE;
    }

    /// Parent side after the host fork: the child's pid is known.
    pub fn fork_parent_done(&self, slot: &ForkSlot, pid: i32) {
        let l = lock(&self.map);
        let m = &mut l.inner.members[slot.idx];
        if m.pid == 0 {
            m.pid = pid;
        }
    }

    /// Child side after the host fork: this handle becomes the child's.
    pub fn become_child(&mut self, slot: &ForkSlot) {
        // The parent's reaper thread does not exist in this process.
        std::mem::forget(self.reaper.take());
        self.me = slot.idx;
        self.pid = std::process::id() as i32;
        self.forked_from = slot.parent_pid;
        let l = lock(&self.map);
        claim_alive(&self.map, slot.idx);
        l.inner.members[slot.idx].pid = self.pid;
    }

    /// Watch child `slot` (process `pid`): when the process ends without
    /// having said so (killed, or its monitor failed), its membership ends
    /// here and its parent learns of it. One reaper thread per process
    /// watches all children (through pidfds), so a fork does not pay for a
    /// thread.
    pub fn watch_child(&mut self, slot: &ForkSlot, pid: i32) {
        if self.reaper.is_none() {
            self.reaper = Reaper::start(self.map.clone()).ok();
        }
        let ok = self.reaper.as_ref().is_some_and(|r| r.watch(pid, slot.idx));
        if !ok {
            // No reaper: a thread of its own for this child.
            let map = self.map.clone();
            let idx = slot.idx;
            let _ = std::thread::Builder::new().stack_size(64 << 10).spawn(move || {
                let raw = shared::wait_child(pid).unwrap_or(libc::SIGKILL);
                child_ended(&map, idx, pid, raw);
            });
        }
    }

    /// This VM ended with wait status `st`: close its descriptors, detach its
    /// segments, become a zombie for its parent (SIGCHLD) or go away.
    pub fn exit(&mut self, st: u64) {
        let l = lock(&self.map);
        if l.inner.members[self.me].pid == self.pid && l.inner.members[self.me].state == RUNNING {
            exit_member(&self.map, l.inner, self.me, st);
            // SAFETY: this thread took it in `new_root`/`become_child`.
            unsafe { shared::mutex_unlock(alive(&self.map, self.me)) };
        }
        drop(l);
        self.attached.clear();
    }

    // ----- identity and signals -----

    pub fn getpid(&self) -> CallResult {
        let l = lock(&self.map);
        Ok((self.pid as i64, l.inner.members[self.me].ppid.max(0) as u64))
    }

    /// Send `sig` to member `pid`.
    pub fn kill(&self, pid: i64, sig: u64, kick_sig: i32) -> CallResult {
        if sig > signal::MAX as u64 {
            return Err(EINVAL);
        }
        let Ok(pid) = i32::try_from(pid) else { return Err(ESRCH) };
        if pid <= 0 {
            return Err(EINVAL);
        }
        let l = lock(&self.map);
        reap_dead(&self.map, l.inner, self.me);
        let found = l.inner.members.iter().position(|m| m.state == RUNNING && m.pid == pid);
        let Some(idx) = found.or_else(|| l.inner.members.iter().position(|m| m.state == ZOMBIE && m.pid == pid)) else {
            drop(l);
            // Someone else's VM (or any process): refused; nothing at all: ESRCH.
            return Err(if shared::process_exists(pid) { EPERM } else { ESRCH });
        };
        if sig == 0 || l.inner.members[idx].state != RUNNING {
            return Ok((0, 0));
        }
        let b = bell(&self.map, idx);
        if sig == signal::SIGKILL as u64 {
            b.kill.store(1, Ordering::Release);
            b.ring();
            let tid = b.tid.load(Ordering::Acquire) as i32;
            if tid > 0 {
                shared::kick_thread(pid, tid, kick_sig);
            }
        } else {
            b.signals.fetch_or(1 << sig, Ordering::AcqRel);
            b.events.fetch_or(wisp_abi::events::FAMILY, Ordering::AcqRel);
            b.ring();
        }
        Ok((0, 0))
    }

    // ----- blocking -----

    /// Run `attempt` under the lock until it completes. Between attempts
    /// the vCPU thread sleeps on its bell; `interrupted` ends the wait with
    /// `EINTR`, `hold` is called after each wake-up (pause). With `nowait`,
    /// an attempt that would block returns `nowait`'s error at once.
    fn blocking<T>(
        &self,
        nowait: Option<i64>,
        w: &Waiter,
        mut attempt: impl FnMut(&mut Inner, usize) -> Option<Result<T, i64>>,
    ) -> Result<T, i64> {
        let b = self.bell();
        loop {
            let seq = b.seq.load(Ordering::Acquire);
            {
                let l = lock(&self.map);
                if let Some(r) = attempt(l.inner, self.me) {
                    l.inner.members[self.me].waiting = 0;
                    return r;
                }
                // Before giving up or waiting: a member that died unnoticed
                // may be what the call waits for (a pipe's last writer).
                if reap_dead(&self.map, l.inner, self.me) {
                    continue;
                }
                if let Some(e) = nowait {
                    return Err(e);
                }
                l.inner.members[self.me].waiting = 1;
            }
            if (w.interrupted)() || b.signals.load(Ordering::Acquire) != 0 {
                lock(&self.map).inner.members[self.me].waiting = 0;
                return Err(EINTR);
            }
            // A peer often answers within microseconds: look for the bell
            // a little while before sleeping (the wake-up of a sleeping
            // thread costs more than that).
            spin_on(&b.seq, seq, SPIN);
            futex_wait(&b.seq, seq, Some(RECHECK));
            (w.hold)();
        }
    }

    /// Park until a signal arrives (always ends with `EINTR`).
    pub fn pause(&self, w: &Waiter) -> CallResult {
        self.blocking(None, w, |_, _| None::<CallResult>)
    }

    // ----- pipes -----

    pub fn pipe(&self) -> CallResult {
        let l = lock(&self.map);
        let inner = &mut *l.inner;
        let fds = &inner.members[self.me].fds;
        let mut free = (0..MAX_FDS).filter(|&i| fds[i] == 0);
        let (Some(r), Some(w)) = (free.next(), free.next()) else { return Err(EMFILE) };
        let Some(p) = inner.pipes.iter().position(|p| p.used == 0) else { return Err(ENOSPC) };
        let pipe = &mut inner.pipes[p];
        (pipe.used, pipe.readers, pipe.writers, pipe.head, pipe.len) = (1, 1, 1, 0, 0);
        let fds = &mut inner.members[self.me].fds;
        fds[r] = fd_entry(p, 0);
        fds[w] = fd_entry(p, 1);
        Ok((r as i64, w as u64))
    }

    pub fn close(&self, fd: u64) -> CallResult {
        let l = lock(&self.map);
        let Some(f) = l.inner.members[self.me].fds.get(fd as usize).copied().filter(|&f| f != 0) else {
            return Err(EBADF);
        };
        l.inner.members[self.me].fds[fd as usize] = 0;
        release_end(l.inner, f);
        wake_waiters(&self.map, l.inner);
        Ok((0, 0))
    }

    /// The pipe behind descriptor `fd` if it is open on `end`.
    fn pipe_of(inner: &Inner, me: usize, fd: u64, end: u16) -> Result<usize, i64> {
        match inner.members[me].fds.get(fd as usize).and_then(|&f| fd_pipe(f)) {
            Some((pipe, e)) if e == end => Ok(pipe),
            _ => Err(EBADF),
        }
    }

    /// Read up to `max` bytes from descriptor `fd`; `out` receives them.
    pub fn read(&self, fd: u64, max: usize, nowait: bool, w: &Waiter, out: &mut Vec<u8>) -> CallResult {
        out.clear();
        self.blocking(nowait.then_some(EAGAIN), w, |inner, me| {
            let p = match Self::pipe_of(inner, me, fd, 0) {
                Ok(p) => p,
                Err(e) => return Some(Err(e)),
            };
            let pipe = &mut inner.pipes[p];
            pipe.len = pipe.len.min(PIPE_CAPACITY as u32); // never trust shared state blindly
            if pipe.len == 0 {
                return (pipe.writers == 0 || max == 0).then_some(Ok((0, 0)));
            }
            let n = max.min(pipe.len as usize);
            let head = pipe.head as usize % PIPE_CAPACITY;
            let first = n.min(PIPE_CAPACITY - head);
            out.extend_from_slice(&pipe.buf[head..head + first]);
            out.extend_from_slice(&pipe.buf[..n - first]);
            pipe.head = ((head + n) % PIPE_CAPACITY) as u32;
            pipe.len -= n as u32;
            wake_waiters(&self.map, inner);
            Some(Ok((n as i64, 0)))
        })
    }

    /// Write `data` to descriptor `fd`: all of it (blocking as needed), or
    /// what fits with `nowait`. Writes up to `PIPE_BUF` are atomic.
    pub fn write(&self, fd: u64, data: &[u8], nowait: bool, w: &Waiter) -> CallResult {
        let mut done = 0usize;
        loop {
            let r = self.blocking(nowait.then_some(EAGAIN), w, |inner, me| {
                let p = match Self::pipe_of(inner, me, fd, 1) {
                    Ok(p) => p,
                    Err(e) => return Some(Err(e)),
                };
                let pipe = &mut inner.pipes[p];
                if pipe.readers == 0 {
                    return Some(Err(EPIPE));
                }
                let rest = &data[done..];
                pipe.len = pipe.len.min(PIPE_CAPACITY as u32);
                let space = PIPE_CAPACITY - pipe.len as usize;
                let need = if rest.len() <= PIPE_BUF { rest.len() } else { 1 };
                if space < need.max(1) {
                    return None;
                }
                let n = rest.len().min(space);
                let tail = (pipe.head as usize + pipe.len as usize) % PIPE_CAPACITY;
                let first = n.min(PIPE_CAPACITY - tail);
                pipe.buf[tail..tail + first].copy_from_slice(&rest[..first]);
                pipe.buf[..n - first].copy_from_slice(&rest[first..n]);
                pipe.len += n as u32;
                wake_waiters(&self.map, inner);
                Some(Ok(n))
            });
            match r {
                Ok(n) => {
                    done += n;
                    if done == data.len() {
                        return Ok((done as i64, 0));
                    }
                }
                // Like Linux: what was written counts, the error comes next time.
                Err(e) if done > 0 && e != EBADF => return Ok((done as i64, 0)),
                Err(e) => return Err(e),
            }
        }
    }

    // ----- wait -----

    /// Wait for child `pid` (-1: any) to end.
    pub fn wait(&self, pid: i64, nowait: bool, w: &Waiter) -> CallResult {
        let me_pid = self.pid;
        let r = self.blocking(nowait.then_some(i64::MIN), w, |inner, _| {
            let mut any = false;
            for m in inner.members.iter_mut() {
                if m.state == FREE || m.ppid != me_pid || (pid > 0 && m.pid as i64 != pid) {
                    continue;
                }
                any = true;
                if m.state == ZOMBIE {
                    m.state = FREE;
                    return Some(Ok((m.pid as i64, m.status)));
                }
            }
            if !any {
                return Some(Err(ECHILD));
            }
            None
        });
        match r {
            Err(i64::MIN) => Ok((0, 0)),
            r => r,
        }
    }

    // ----- message queues -----

    pub fn msgget(&self, key: i64, flg: u64) -> CallResult {
        let l = lock(&self.map);
        let inner = &mut *l.inner;
        if let Some(i) = by_key(key, flg, || inner.queues.iter().position(|q| q.used != 0 && q.key == key))? {
            return Ok((ipc_id(inner.queues[i].gen, i), 0));
        }
        let Some(i) = inner.queues.iter().position(|q| q.used == 0) else { return Err(ENOSPC) };
        let gen = next_gen(inner);
        let q = &mut inner.queues[i];
        (q.used, q.gen, q.key, q.count, q.bytes) = (1, gen, key, 0, 0);
        Ok((ipc_id(gen, i), 0))
    }

    fn queue(inner: &mut Inner, id: u64) -> Option<&mut Queue> {
        let q = inner.queues.get_mut(id_index(id))?;
        (q.used != 0 && q.gen as u64 == id >> 8).then_some(q)
    }

    /// The segment `id` names, and its index.
    fn segment(inner: &mut Inner, id: u64) -> Option<(usize, &mut Segment)> {
        let idx = id_index(id);
        let s = inner.segments.get_mut(idx)?;
        (s.used != 0 && s.gen as u64 == id >> 8).then_some((idx, s))
    }

    pub fn msgsnd(&self, id: u64, data: &[u8], mtype: i64, nowait: bool, w: &Waiter) -> CallResult {
        if mtype <= 0 || data.len() > MSG_MAX {
            return Err(EINVAL);
        }
        let mut seen = false;
        self.blocking(nowait.then_some(EAGAIN), w, |inner, _| {
            let Some(q) = Self::queue(inner, id) else { return Some(Err(if seen { EIDRM } else { EINVAL })) };
            seen = true;
            if q.count as usize >= QUEUE_MESSAGES || q.bytes as usize >= QUEUE_BYTES || q.bytes as usize + data.len() > QUEUE_BYTES {
                return None;
            }
            let off = q.bytes as usize;
            q.data[off..off + data.len()].copy_from_slice(data);
            q.entries[q.count as usize] = MsgEntry { mtype, len: data.len() as u64 };
            q.count += 1;
            q.bytes += data.len() as u32;
            wake_waiters(&self.map, inner);
            Some(Ok((0, 0)))
        })
    }

    pub fn msgrcv(&self, id: u64, max: usize, msgtyp: i64, flg: u32, w: &Waiter, out: &mut Vec<u8>) -> CallResult {
        out.clear();
        let mut seen = false;
        let nowait = flg & flags::NOWAIT != 0;
        self.blocking(nowait.then_some(ENOMSG), w, |inner, _| {
            let Some(q) = Self::queue(inner, id) else { return Some(Err(if seen { EIDRM } else { EINVAL })) };
            seen = true;
            let n = (q.count as usize).min(QUEUE_MESSAGES);
            let pick = match msgtyp {
                0 => (n > 0).then_some(0),
                t if t > 0 => q.entries[..n].iter().position(|e| e.mtype == t),
                t => {
                    let lim = t.checked_neg().unwrap_or(i64::MAX);
                    let best = q.entries[..n].iter().enumerate().filter(|(_, e)| e.mtype <= lim).min_by_key(|(_, e)| e.mtype);
                    best.map(|(i, _)| i)
                }
            }?;
            let e = q.entries[pick];
            let len = (e.len as usize).min(MSG_MAX);
            if len > max && flg & flags::NOERROR == 0 {
                return Some(Err(E2BIG));
            }
            let off: usize = q.entries[..pick].iter().map(|e| (e.len as usize).min(MSG_MAX)).sum();
            let bytes = (q.bytes as usize).min(QUEUE_BYTES);
            if off + len > bytes {
                // Torn by a member killed mid-update: drop the queue's contents.
                (q.count, q.bytes) = (0, 0);
                return Some(Err(EIDRM));
            }
            out.extend_from_slice(&q.data[off..off + len.min(max)]);
            q.data.copy_within(off + len..bytes, off);
            q.entries.copy_within(pick + 1..n, pick);
            q.count = n as u32 - 1;
            q.bytes = (bytes - len) as u32;
            wake_waiters(&self.map, inner);
            Some(Ok((len.min(max) as i64, e.mtype as u64)))
        })
    }

    pub fn msgrmid(&self, id: u64) -> CallResult {
        let l = lock(&self.map);
        let Some(q) = Self::queue(l.inner, id) else { return Err(EINVAL) };
        q.used = 0;
        wake_waiters(&self.map, l.inner);
        Ok((0, 0))
    }

    // ----- shared memory -----

    pub fn shmget(&mut self, key: i64, size: u64, flg: u64) -> CallResult {
        if self.ensure_arena().is_err() {
            return Err(ENOMEM);
        }
        let l = lock(&self.map);
        let inner = &mut *l.inner;
        let existing = || inner.segments.iter().position(|s| s.used != 0 && s.removed == 0 && s.key == key);
        if let Some(i) = by_key(key, flg, existing)? {
            if size > inner.segments[i].size {
                return Err(EINVAL);
            }
            return Ok((ipc_id(inner.segments[i].gen, i), 0));
        }
        if size == 0 || size > SHM_SIZE {
            return Err(EINVAL);
        }
        let size = size.div_ceil(PAGE_SIZE) * PAGE_SIZE;
        let Some(i) = inner.segments.iter().position(|s| s.used == 0) else { return Err(ENOSPC) };
        // First fit in the arena.
        let mut used: Vec<(u64, u64)> =
            inner.segments.iter().filter(|s| s.used != 0).map(|s| (s.off, s.off + s.size)).collect();
        used.sort_unstable();
        let mut at = 0u64;
        for (s, e) in used {
            if s >= at + size {
                break;
            }
            at = at.max(e);
        }
        if at + size > SHM_SIZE {
            return Err(ENOMEM);
        }
        let gen = next_gen(inner);
        // New segments read as zeros, whoever used those pages before.
        if let Some(a) = &self.arena {
            a.discard(at as usize, size as usize);
        }
        inner.segments[i] = Segment { used: 1, gen, key, off: at, size, attached: 0, removed: 0 };
        Ok((ipc_id(gen, i), 0))
    }

    /// Attach segment `id`: `map_slot(slot, guest address, host address,
    /// size)` makes it visible to the guest (a KVM memory slot).
    pub fn shmat(&mut self, id: u64, map_slot: &mut dyn FnMut(u32, u64, u64, u64) -> bool) -> CallResult {
        let Some(arena) = self.arena.clone() else { return Err(EINVAL) };
        let l = lock(&self.map);
        let Some((idx, s)) = Self::segment(l.inner, id) else { return Err(EINVAL) };
        if s.removed != 0 {
            return Err(EIDRM);
        }
        let (off, size) = (s.off, s.size);
        if let Some(a) = self.attached.iter_mut().find(|a| a.0 == idx) {
            a.1 = a.1.saturating_add(1);
            return Ok(((SHM_BASE + off) as i64, size));
        }
        if off + size > arena.len() as u64
            || !map_slot(1 + idx as u32, SHM_BASE + off, arena.as_ptr() as u64 + off, size)
        {
            return Err(ENOMEM);
        }
        s.attached += 1;
        l.inner.members[self.me].shm |= 1 << idx;
        self.attached.push((idx, 1));
        Ok(((SHM_BASE + off) as i64, size))
    }

    /// Detach the segment attached at guest address `addr`.
    pub fn shmdt(&mut self, addr: u64, unmap_slot: &mut dyn FnMut(u32, u64)) -> CallResult {
        let l = lock(&self.map);
        let Some(pos) = self.attached.iter().position(|&(i, _)| {
            l.inner.segments.get(i).is_some_and(|s| s.used != 0 && SHM_BASE + s.off == addr)
        }) else {
            return Err(EINVAL);
        };
        let idx = self.attached[pos].0;
        self.attached[pos].1 -= 1;
        if self.attached[pos].1 > 0 {
            return Ok((0, 0));
        }
        self.attached.swap_remove(pos);
        unmap_slot(1 + idx as u32, addr);
        l.inner.members[self.me].shm &= !(1 << idx);
        detach_segment(self.arena.as_deref(), l.inner, idx);
        Ok((0, 0))
    }

    pub fn shmrmid(&self, id: u64) -> CallResult {
        let l = lock(&self.map);
        let Some((_, s)) = Self::segment(l.inner, id) else { return Err(EINVAL) };
        s.removed = 1;
        if s.attached == 0 {
            free_segment(self.arena.as_deref(), s);
        }
        Ok((0, 0))
    }

    /// Segments attached here, to map again in a forked child's new VM:
    /// (slot, guest address, host address, size).
    pub fn attachments(&self) -> Vec<(u32, u64, u64, u64)> {
        let Some(arena) = &self.arena else { return Vec::new() };
        let l = lock(&self.map);
        self.attached
            .iter()
            .filter_map(|&(i, _)| {
                let s = l.inner.segments.get(i)?;
                Some((1 + i as u32, SHM_BASE + s.off, arena.as_ptr() as u64 + s.off, s.size))
            })
            .collect()
    }
}

/// What a blocking call consults while it waits.
pub struct Waiter<'a> {
    /// True if the wait must end now (stop request, kill, timeout).
    pub interrupted: &'a dyn Fn() -> bool,
    /// Called after each wake-up (holds while the VM is paused).
    pub hold: &'a dyn Fn(),
}

/// The id of IPC object `idx` of generation `gen` (stale ids do not match
/// a reused slot).
fn ipc_id(gen: u32, idx: usize) -> i64 {
    (gen as i64) << 8 | idx as i64
}

/// The slot an IPC id names.
fn id_index(id: u64) -> usize {
    (id & 0xff) as usize
}

/// A new IPC object generation.
fn next_gen(inner: &mut Inner) -> u32 {
    inner.gen = inner.gen.wrapping_add(1) & 0x7f_ffff;
    inner.gen
}

/// The System V `*get` rules for `key` and flags `flg`: `Ok(Some(i))` for
/// the existing object `i` (found by `existing`), `Ok(None)` to make one.
fn by_key(key: i64, flg: u64, existing: impl FnOnce() -> Option<usize>) -> Result<Option<usize>, i64> {
    if key == 0 {
        return Ok(None); // IPC_PRIVATE
    }
    let create = flg & flags::IPC_CREAT != 0;
    match existing() {
        Some(_) if create && flg & flags::IPC_EXCL != 0 => Err(EEXIST),
        Some(i) => Ok(Some(i)),
        None if !create => Err(ENOENT),
        None => Ok(None),
    }
}

/// Ring every member blocked in a family call.
fn wake_waiters(map: &SharedMap, inner: &mut Inner) {
    for (i, m) in inner.members.iter_mut().enumerate() {
        if m.waiting != 0 {
            m.waiting = 0;
            bell(map, i).ring();
        }
    }
}

/// A descriptor table entry for `end` (0 read, 1 write) of pipe `pipe`.
fn fd_entry(pipe: usize, end: u16) -> u16 {
    1 + 2 * pipe as u16 + end
}

/// The (pipe, end) a descriptor table entry names, if any.
fn fd_pipe(f: u16) -> Option<(usize, u16)> {
    let v = f.checked_sub(1)?;
    (((v / 2) as usize) < MAX_PIPES).then_some(((v / 2) as usize, v % 2))
}

/// The reference count of `end` of `p`.
fn end_refs(p: &mut Pipe, end: u16) -> &mut u32 {
    if end == 0 {
        &mut p.readers
    } else {
        &mut p.writers
    }
}

/// Drop one reference to a pipe end (`f` as stored in a descriptor table).
fn release_end(inner: &mut Inner, f: u16) {
    let Some((pipe, end)) = fd_pipe(f) else { return };
    let p = &mut inner.pipes[pipe];
    let refs = end_refs(p, end);
    *refs = refs.saturating_sub(1);
    if p.readers == 0 && p.writers == 0 {
        p.used = 0;
    }
}

/// Close a member's descriptors and drop its segment attachments.
fn release_member(inner: &mut Inner, idx: usize) {
    let fds = std::mem::replace(&mut inner.members[idx].fds, [0; MAX_FDS]);
    for f in fds.into_iter().filter(|&f| f != 0) {
        release_end(inner, f);
    }
    // No arena handle here (a reaper may be ending someone else's
    // membership): freed pages are discarded when the offset is handed out
    // again.
    let shm = std::mem::take(&mut inner.members[idx].shm);
    for i in (0..MAX_SEGMENTS).filter(|i| shm & (1 << i) != 0) {
        detach_segment(None, inner, i);
    }
}

/// Drop one attachment of segment `idx`; the last one of a removed segment
/// frees it.
fn detach_segment(arena: Option<&SharedMap>, inner: &mut Inner, idx: usize) {
    let s = &mut inner.segments[idx];
    s.attached = s.attached.saturating_sub(1);
    if s.attached == 0 && s.removed != 0 {
        free_segment(arena, s);
    }
}

fn free_segment(arena: Option<&SharedMap>, s: &mut Segment) {
    s.used = 0;
    if let Some(a) = arena {
        a.discard(s.off as usize, s.size as usize);
    }
}

/// End member `idx` with wait status `st`.
fn exit_member(map: &SharedMap, inner: &mut Inner, idx: usize, st: u64) {
    release_member(inner, idx);
    let (pid, ppid) = (inner.members[idx].pid, inner.members[idx].ppid);
    // Orphans: zombies go away, running children lose their parent.
    for m in inner.members.iter_mut().filter(|m| m.state != FREE && m.ppid == pid && pid != 0) {
        if m.state == ZOMBIE {
            m.state = FREE;
        } else {
            m.ppid = 0;
        }
    }
    let parent = (ppid != 0).then(|| inner.members.iter().position(|m| m.state == RUNNING && m.pid == ppid)).flatten();
    let m = &mut inner.members[idx];
    m.status = st;
    m.state = if parent.is_some() { ZOMBIE } else { FREE };
    if let Some(p) = parent {
        let b = bell(map, p);
        b.signals.fetch_or(1 << signal::SIGCHLD, Ordering::AcqRel);
        b.events.fetch_or(wisp_abi::events::FAMILY, Ordering::AcqRel);
        b.ring();
    }
    wake_waiters(map, inner);
}


/// A child process ended with raw wait status `raw`: if it did not end its
/// membership itself, end it now.
fn child_ended(map: &SharedMap, idx: usize, pid: i32, raw: i32) {
    let st = if libc::WIFSIGNALED(raw) {
        status::signaled(libc::WTERMSIG(raw) as u32)
    } else {
        status::exited(libc::WEXITSTATUS(raw))
    };
    let l = lock(map);
    let m = &l.inner.members[idx];
    if m.pid == pid && m.state == RUNNING {
        exit_member(map, l.inner, idx, st);
    }
}

/// The thread that reaps a process's children.
struct Reaper {
    tx: std::sync::mpsc::Sender<(i32, usize, std::os::fd::OwnedFd)>,
    wake: Arc<std::os::fd::OwnedFd>,
}

impl Reaper {
    fn start(map: Arc<SharedMap>) -> std::io::Result<Reaper> {
        use rustix::event::{eventfd, poll, EventfdFlags, PollFd, PollFlags};
        let wake = Arc::new(eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?);
        let (tx, rx) = std::sync::mpsc::channel::<(i32, usize, std::os::fd::OwnedFd)>();
        let w = wake.clone();
        std::thread::Builder::new().name("reaper".into()).stack_size(128 << 10).spawn(move || {
            let mut kids: Vec<(i32, usize, std::os::fd::OwnedFd)> = Vec::new();
            loop {
                let ready: Vec<usize> = {
                    let mut fds = vec![PollFd::new(&*w, PollFlags::IN)];
                    fds.extend(kids.iter().map(|k| PollFd::new(&k.2, PollFlags::IN)));
                    if poll(&mut fds, None).is_err() {
                        continue;
                    }
                    if !fds[0].revents().is_empty() {
                        let mut b = [0u8; 8];
                        let _ = rustix::io::read(&*w, &mut b);
                    }
                    (1..fds.len()).filter(|&i| !fds[i].revents().is_empty()).map(|i| i - 1).collect()
                };
                for i in ready.into_iter().rev() {
                    let (pid, idx, _fd) = kids.swap_remove(i);
                    let raw = shared::wait_child(pid).unwrap_or(libc::SIGKILL);
                    child_ended(&map, idx, pid, raw);
                }
                kids.extend(rx.try_iter());
            }
        })?;
        Ok(Reaper { tx, wake })
    }

    fn watch(&self, pid: i32, idx: usize) -> bool {
        let Ok(pidfd) = rustix::process::pidfd_open(
            rustix::process::Pid::from_raw(pid).expect("a child's pid is positive"),
            rustix::process::PidfdFlags::empty(),
        ) else {
            return false;
        };
        if self.tx.send((pid, idx, pidfd)).is_err() {
            return false;
        }
        let _ = rustix::io::write(&*self.wake, &1u64.to_ne_bytes());
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptor_entries_round_trip() {
        for pipe in [0, 1, MAX_PIPES - 1] {
            for end in [0, 1] {
                assert_eq!(fd_pipe(fd_entry(pipe, end)), Some((pipe, end)));
            }
        }
        assert_eq!(fd_pipe(0), None);
        assert_eq!(fd_pipe(fd_entry(MAX_PIPES, 0)), None);
        assert_eq!(fd_pipe(u16::MAX), None);
    }

    #[test]
    fn get_by_key_follows_system_v() {
        let c = flags::IPC_CREAT;
        let x = flags::IPC_EXCL;
        assert_eq!(by_key(0, 0, || Some(3)), Ok(None)); // private: always new
        assert_eq!(by_key(7, 0, || Some(3)), Ok(Some(3)));
        assert_eq!(by_key(7, c, || Some(3)), Ok(Some(3)));
        assert_eq!(by_key(7, c | x, || Some(3)), Err(EEXIST));
        assert_eq!(by_key(7, 0, || None), Err(ENOENT));
        assert_eq!(by_key(7, c, || None), Ok(None));
    }
}
