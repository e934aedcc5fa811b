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
//!
//! Pids: a member has a *family pid* (the root 1, then one more per fork,
//! never naming two members or zombies at once: `region::alloc_fpid`),
//! which is all a guest ever sees or names — a pid that is no member of the
//! family is `ESRCH`, whatever runs on the host. The host pid of its
//! monitor process stays the monitor's, for kicks, pidfds and the reaper.
//!
//! Here: a VM's handle ([`Family`]) — fork bookkeeping, exit and wait,
//! identity and signals, and the blocking loop every waiting call runs.
//! `region.rs`: the region's layout, lock and membership bookkeeping;
//! `pipes.rs`, `msgq.rs`, `shm.rs`: the three kinds of IPC object;
//! `reaper.rs`: the thread that notices children's ends; `shared.rs`: the
//! shared mapping and the process-shared robust mutex.

mod msgq;
mod pipes;
mod reaper;
mod region;
mod shared;
mod shm;

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use wisp_abi::errno::*;
use wisp_abi::family::limits::*;
use wisp_abi::family::rings::Shared;
use wisp_abi::family::{flags, signal};

use crate::sys::{futex_wait, kick_thread, SPIN};
use reaper::Reaper;
use region::{
    alive, alloc_fpid, bell, claim_alive, end_refs, exit_member, fd_pipe, lock, raise, reap_dead, release_member,
    rings, Inner, Member, FREE, ROOT_FPID, RUNNING, ZOMBIE,
};
pub use region::{Bell, BellRef};
pub(crate) use shared::SharedMap;

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
    /// Hand later forks to a spare monitor process prepared while the guest
    /// waits (`vm/spare.rs`).
    pub spares: bool,
    /// A child made from a spare whose guest exits becomes its parent's
    /// spare again (`vm/spare.rs`): its process does not end, so an embedder
    /// that reports each VM's end from its process (wispd's VMM process) says
    /// no for now.
    pub recycle: bool,
}

impl Default for FamilyOptions {
    fn default() -> Self {
        FamilyOptions { fork: false, limit: MAX_MEMBERS as u32, orphans_die: true, spares: false, recycle: false }
    }
}

/// How soon a call that found a ring's lock held looks again.
const BUSY_RECHECK: std::time::Duration = std::time::Duration::from_millis(1);

/// How long the monitor waits for a ring's lock held by a live member (it
/// holds it for one copy) before the caller sleeps until it is released.
const LOCK_SPIN: std::time::Duration = std::time::Duration::from_micros(20);

/// What [`Family::blocking`] waits at most before looking for members
/// that died without anyone noticing (no CPU to speak of: one wake-up).
const RECHECK: std::time::Duration = std::time::Duration::from_secs(1);

/// What a fork needs to undo or finish.
pub struct ForkSlot {
    pub(crate) idx: usize,
    /// The child's family pid.
    pub(crate) fpid: i32,
    /// The host pid of the forking monitor process.
    pub(crate) parent_pid: i32,
}

/// One VM's handle on its family.
pub struct Family {
    map: Arc<SharedMap>,
    arena: Option<Arc<SharedMap>>,
    me: usize,
    /// Host pid of this monitor process.
    pid: i32,
    /// This VM's family pid.
    fpid: i32,
    pub(crate) opts: FamilyOptions,
    /// Segments attached here: (segment index, attach count).
    attached: Vec<(usize, u32)>,
    /// Watches this process's children (made at the first fork).
    reaper: Option<Reaper>,
    /// For a forked VM: the host pid of the VM that forked it.
    forked_from: i32,
    /// The guest-visible page is mapped into this VM (`rings_slot`).
    rings_mapped: bool,
}

/// The KVM memory slot of the family's guest-visible page (after the
/// shared-memory segments' slots `1..=MAX_SEGMENTS`).
pub const RINGS_SLOT: u32 = 1 + MAX_SEGMENTS as u32;

/// Result of a family call: (ret, ret2) or a negative errno.
pub type CallResult = Result<(i64, u64), i64>;

impl Family {
    /// A new family with this VM (process `std::process::id()`) as its root.
    pub fn new_root(opts: FamilyOptions) -> std::io::Result<Family> {
        let map = Arc::new(region::create()?);
        let pid = std::process::id() as i32;
        {
            let l = lock(&map);
            l.inner.limit = opts.limit.clamp(1, MAX_MEMBERS as u32);
            l.inner.last_fpid = ROOT_FPID;
            let m = &mut l.inner.members[0];
            m.state = RUNNING;
            m.pid = pid;
            m.fpid = ROOT_FPID;
        }
        // The loading thread is the vCPU thread (wisp runs a VM on the
        // thread that loaded it).
        claim_alive(&map, 0);
        rings(&map).cells[0].fpid.store(ROOT_FPID, Ordering::SeqCst);
        Ok(Family {
            map,
            arena: None,
            me: 0,
            pid,
            fpid: ROOT_FPID,
            opts,
            attached: Vec::new(),
            reaper: None,
            forked_from: 0,
            rings_mapped: false,
        })
    }

    pub fn set_options(&mut self, opts: FamilyOptions) {
        self.opts = opts;
        lock(&self.map).inner.limit = opts.limit.clamp(1, MAX_MEMBERS as u32);
    }

    /// The host pid of this VM's monitor process.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// This VM's pid in its family (the root's is 1): the pid its guest
    /// sees.
    pub fn fpid(&self) -> i32 {
        self.fpid
    }

    /// For a forked VM, the host pid of the VM that forked it (0 for a
    /// root), even if that one has ended since.
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

    /// Take the pending signals (all of them are in this member's cell on
    /// the guest-visible page, whoever raised them).
    pub fn take_signals(&self) -> u64 {
        rings(&self.map).cells[self.me].take()
    }

    // ----- the guest-visible page -----

    /// For the RINGS call: (this member's cell index, the page's guest
    /// address), after `map(slot, guest address, host address, size)` put it
    /// into this VM (once).
    pub fn rings_info(&mut self, map: &mut dyn FnMut(u32, u64, u64, u64) -> bool) -> CallResult {
        use wisp_abi::family::rings::{RINGS_GPA, RINGS_SIZE};
        if !self.rings_mapped {
            let host = rings(&self.map) as *const _ as u64;
            if !map(RINGS_SLOT, RINGS_GPA, host, RINGS_SIZE) {
                return Err(ENOMEM);
            }
            self.rings_mapped = true;
        }
        Ok((self.me as i64, RINGS_GPA))
    }

    /// The WAKE call: `kind` 0 wakes every member waiting in a family call
    /// (a pipe's sleepers among them), 1 the member of cell `idx`.
    pub fn wake(&self, kind: u64, idx: u64) -> CallResult {
        match kind {
            0 => {
                let l = lock(&self.map);
                region::wake_waiters(&self.map, l.inner);
            }
            1 if (idx as usize) < MAX_MEMBERS => region::notify(&self.map, idx as usize),
            _ => return Err(EINVAL),
        }
        Ok((0, 0))
    }

    /// Signals are pending for this member (raised on the page, maybe by a
    /// guest: the idle hypercall then reports `events::FAMILY`).
    pub fn signals_pending(&self) -> bool {
        rings(&self.map).cells[self.me].signals.load(Ordering::SeqCst) & !1 != 0
    }

    /// Say on the page that this member's vCPU sleeps in its monitor (or no
    /// longer does). Going to sleep, true if a signal is pending already
    /// (the caller then does not sleep): a sender sets the signal before it
    /// looks at `parked`, this side the other way round.
    pub fn park_cell(&self, parked: bool) -> bool {
        rings(&self.map).cells[self.me].parked.store(parked as u32, Ordering::SeqCst);
        parked && self.signals_pending()
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
        let fpid = alloc_fpid(inner);
        inner.members[idx] = Member::forked(fpid, self.fpid, shm, fds);
        let b = bell(&self.map, idx);
        b.kill.store(0, Ordering::Release);
        b.tid.store(0, Ordering::Release);
        b.events.store(0, Ordering::Release);
        let c = &rings(&self.map).cells[idx];
        c.signals.store(0, Ordering::SeqCst);
        c.parked.store(0, Ordering::SeqCst);
        c.ppid.store(self.fpid, Ordering::SeqCst);
        c.fpid.store(fpid, Ordering::SeqCst);
        // Free until the child takes it (a previous member's may be stale).
        // SAFETY: the slot is free (no live member uses its mutex) and the
        // region lock is held, so no `reap_dead` looks at it meanwhile.
        unsafe { shared::mutex_init(alive(&self.map, idx)) };
        Ok(ForkSlot { idx, fpid, parent_pid: self.pid })
    }

    /// The host fork failed: give the slot back.
    pub fn fork_abort(&self, slot: &ForkSlot) {
        let l = lock(&self.map);
        release_member(&self.map, l.inner, slot.idx);
        l.inner.members[slot.idx].state = FREE;
        rings(&self.map).cells[slot.idx].fpid.store(0, Ordering::SeqCst);
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
        self.fpid = slot.fpid;
        self.forked_from = slot.parent_pid;
        // Its new KVM VM maps the page with the shared-memory segments
        // (`attachments`), whether the parent's guest used it or not.
        self.rings_mapped = true;
        let l = lock(&self.map);
        claim_alive(&self.map, slot.idx);
        l.inner.members[slot.idx].pid = self.pid;
    }

    /// The segments attached here (segment index, attach count), for a
    /// child made in another process (`vm/spare.rs`).
    pub(crate) fn attached_list(&self) -> Vec<(usize, u32)> {
        self.attached.clone()
    }

    /// In a child: the segments its parent had attached at the fork.
    pub(crate) fn set_attached(&mut self, list: Vec<(usize, u32)>) {
        self.attached = list;
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
            reaper::watch_alone(self.map.clone(), pid, slot.idx);
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

    /// (own family pid, parent's family pid: 0 for a root or an orphan).
    pub fn getpid(&self) -> CallResult {
        let l = lock(&self.map);
        Ok((self.fpid as i64, l.inner.members[self.me].ppid.max(0) as u64))
    }

    /// Send `sig` to the member with family pid `pid`. A pid no member of
    /// this family has is `ESRCH`: nothing outside the family (another
    /// family's VM, any host process) can be named, nor probed.
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
        let found = l.inner.members.iter().position(|m| m.state == RUNNING && m.fpid == pid);
        let Some(idx) = found.or_else(|| l.inner.members.iter().position(|m| m.state == ZOMBIE && m.fpid == pid)) else {
            return Err(ESRCH);
        };
        if sig == 0 || l.inner.members[idx].state != RUNNING {
            return Ok((0, 0));
        }
        let host_pid = l.inner.members[idx].pid;
        let b = bell(&self.map, idx);
        if sig == signal::SIGKILL as u64 {
            b.kill.store(1, Ordering::Release);
            b.ring();
            let tid = b.tid.load(Ordering::Acquire) as i32;
            // Both from the shared region: a host pid not known yet (0) or
            // spoilt (negative, naming a process group) gets no kick.
            if tid > 0 && host_pid > 0 {
                kick_thread(host_pid, tid, kick_sig);
            }
        } else {
            raise(&self.map, idx, sig as u32);
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
        self.blocking_on(nowait, w, None, |inner, me, _| match attempt(inner, me) {
            Some(r) => Attempt::Done(r),
            None => Attempt::Wait,
        })
    }

    /// [`Self::blocking`] for a call that waits on a ring of the guest-visible
    /// page: before sleeping it also watches `watch` (a position guests move
    /// without telling the monitor), and `attempt` is told when it is the
    /// last look before sleeping (`true`: it then asks the ring's parties to
    /// wake this member, which costs them an exit, and looks again).
    fn blocking_on<T>(
        &self,
        nowait: Option<i64>,
        w: &Waiter,
        watch: Option<&AtomicU32>,
        mut attempt: impl FnMut(&mut Inner, usize, bool) -> Attempt<T>,
    ) -> Result<T, i64> {
        let b = self.bell();
        let cell = &rings(&self.map).cells[self.me];
        loop {
            let seq = b.seq.load(Ordering::Acquire);
            let seen = watch.map(|a| a.load(Ordering::SeqCst));
            {
                let l = lock(&self.map);
                if let Attempt::Done(r) = attempt(l.inner, self.me, false) {
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
            // A peer often answers within microseconds: look for the bell,
            // signals raised on the page and the watched position a little
            // while before sleeping (the wake-up of a sleeping thread costs
            // more than that).
            let until = std::time::Instant::now() + SPIN;
            let moved = || watch.zip(seen).is_some_and(|(a, v)| a.load(Ordering::Relaxed) != v);
            while b.seq.load(Ordering::Acquire) == seq
                && cell.signals.load(Ordering::Relaxed) == 0
                && !moved()
                && std::time::Instant::now() < until
            {
                std::hint::spin_loop();
            }
            if moved() {
                continue;
            }
            // Nobody promised a wake-up while a member holds the ring's lock
            // (for long: it may be stopped, or hostile): look again soon.
            let mut recheck = RECHECK;
            if watch.is_some() {
                let l = lock(&self.map);
                match attempt(l.inner, self.me, true) {
                    Attempt::Done(r) => {
                        l.inner.members[self.me].waiting = 0;
                        return r;
                    }
                    Attempt::Busy => recheck = BUSY_RECHECK,
                    Attempt::Wait => {}
                }
            }
            if (w.interrupted)() || self.park_cell(true) {
                self.park_cell(false);
                lock(&self.map).inner.members[self.me].waiting = 0;
                return Err(EINTR);
            }
            futex_wait(&b.seq, seq, Some(recheck));
            self.park_cell(false);
            (w.hold)();
        }
    }

    /// Run `f` on `ring` (a pipe's or a queue's) with its lock held as this member; wakes the
    /// ring's sleepers afterwards if they asked. `None` while a live member
    /// holds the lock for longer than [`LOCK_SPIN`]. A lock left by a member
    /// that is gone, or by this member's own guest (its vCPU is here, not
    /// copying), is taken over.
    fn with_ring<R: Shared, T, E>(
        &self,
        inner: &mut Inner,
        ring: &R,
        f: impl FnOnce(&R) -> Result<T, E>,
    ) -> Option<Result<T, E>> {
        let who = self.fpid as u32;
        let until = std::time::Instant::now() + LOCK_SPIN;
        loop {
            if ring.try_lock(who) {
                let r = f(ring);
                if ring.unlock(r.is_ok()) {
                    region::wake_waiters(&self.map, inner);
                }
                return Some(r);
            }
            if std::time::Instant::now() >= until {
                return None;
            }
            let holder = ring.lock_word().load(Ordering::SeqCst);
            let live = inner.members.iter().any(|m| m.state == RUNNING && m.fpid as u32 == holder);
            if holder == who || !live {
                let _ = ring.lock_word().compare_exchange(holder, 0, Ordering::SeqCst, Ordering::SeqCst);
            } else {
                std::hint::spin_loop();
            }
        }
    }

    /// Park until a signal arrives (always ends with `EINTR`).
    pub fn pause(&self, w: &Waiter) -> CallResult {
        self.blocking(None, w, |_, _| None::<CallResult>)
    }

    // ----- wait -----

    /// Wait for the child with family pid `pid` (-1: any) to end: its
    /// family pid and wait status.
    pub fn wait(&self, pid: i64, nowait: bool, w: &Waiter) -> CallResult {
        let me = self.fpid;
        let r = self.blocking(nowait.then_some(i64::MIN), w, |inner, _| {
            let mut any = false;
            for m in inner.members.iter_mut() {
                if m.state == FREE || m.ppid != me || (pid > 0 && m.fpid as i64 != pid) {
                    continue;
                }
                // Family pids are positive; the table is shared memory, and a
                // spoilt entry's pid would read as an errno: not a child.
                if m.fpid <= 0 {
                    continue;
                }
                any = true;
                if m.state == ZOMBIE {
                    m.state = FREE;
                    return Some(Ok((m.fpid as i64, m.status)));
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
}

/// One attempt of a blocking call.
pub(super) enum Attempt<T> {
    /// Completed (or failed).
    Done(Result<T, i64>),
    /// Has to wait for a change that wakes it.
    Wait,
    /// A ring's lock was held (by a live member) all along.
    Busy,
}

impl<T> Attempt<T> {
    /// From `with_ring`'s answer: `None` (the lock stayed held) is `Busy`,
    /// else `done` says what the operation's result means.
    pub(super) fn from_ring<R>(r: Option<R>, done: impl FnOnce(R) -> Option<Result<T, i64>>) -> Attempt<T> {
        match r {
            None => Attempt::Busy,
            Some(r) => done(r).map_or(Attempt::Wait, Attempt::Done),
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use region::FPID_MAX;
    use wisp_abi::family::status;

    /// A child slot reserved by `fam`, its monitor process said to be `host`.
    fn child(fam: &Family, host: i32) -> ForkSlot {
        let s = fam.fork_reserve().unwrap();
        fam.fork_parent_done(&s, host);
        s
    }

    fn set_last(fam: &Family, v: i32) {
        lock(&fam.map).inner.last_fpid = v;
    }

    #[test]
    fn guests_see_family_pids_and_nothing_of_the_host() {
        let mut fam = Family::new_root(FamilyOptions::default()).unwrap();
        assert_eq!((fam.fpid(), fam.pid()), (1, std::process::id() as i32));
        assert_eq!(fam.getpid(), Ok((1, 0)));
        let a = child(&fam, 4_000_001);
        let b = child(&fam, 4_000_002);
        assert_eq!((a.fpid, b.fpid), (2, 3));
        // Named by family pid; signal 0 only checks.
        assert_eq!(fam.kill(2, signal::SIGUSR1 as u64, 0), Ok((0, 0)));
        assert_eq!(rings(&fam.map).cells[a.idx].signals.load(Ordering::Acquire), 1 << signal::SIGUSR1);
        assert_eq!(fam.kill(1, 0, 0), Ok((0, 0)));
        // A host pid is nothing here, be it a member's monitor or a live
        // process of the host (this one, init).
        for host in [4_000_001, std::process::id() as i64, 1 << 22] {
            assert_eq!(fam.kill(host, 0, 0), Err(ESRCH), "{host}");
            assert_eq!(fam.kill(host, signal::SIGKILL as u64, 0), Err(ESRCH), "{host}");
        }
        assert_eq!(fam.kill(4, 0, 0), Err(ESRCH));
        assert_eq!(fam.kill(0, 0, 0), Err(EINVAL));
        // Wait speaks family pids too.
        let (never, hold) = (|| false, || ());
        let w = Waiter { interrupted: &never, hold: &hold };
        assert_eq!(fam.wait(-1, true, &w), Ok((0, 0)));
        exit_member(&fam.map, lock(&fam.map).inner, a.idx, status::exited(3));
        assert_eq!(fam.wait(4_000_001, true, &w), Err(ECHILD), "a host pid names no child");
        assert_eq!(fam.wait(-1, true, &w), Ok((2, status::exited(3))));
        assert_eq!(fam.kill(2, 0, 0), Err(ESRCH), "waited for: gone");
        // Never handed out again while the family lives (short of a wrap).
        assert_eq!(child(&fam, 4_000_003).fpid, 4);
        exit_member(&fam.map, lock(&fam.map).inner, b.idx, status::signaled(signal::SIGKILL));
        assert_eq!(fam.wait(3, false, &w), Ok((3, status::signaled(signal::SIGKILL))));
        fam.exit(status::exited(0));
    }

    #[test]
    fn family_pids_wrap_around_the_ones_in_use() {
        let mut fam = Family::new_root(FamilyOptions::default()).unwrap();
        let a = child(&fam, 4_000_001);
        let b = child(&fam, 4_000_002);
        // b is a zombie (not waited for): it keeps its pid.
        exit_member(&fam.map, lock(&fam.map).inner, b.idx, status::exited(0));
        set_last(&fam, FPID_MAX - 1);
        assert_eq!(child(&fam, 4_000_003).fpid, FPID_MAX);
        // After the last one: 2 (held by a), 3 (b's, a zombie) are skipped;
        // 1 stays the root's.
        assert_eq!(child(&fam, 4_000_004).fpid, 4);
        // The counter is shared memory: a spoilt one starts over at 2.
        for spoilt in [0, -5, i32::MIN] {
            set_last(&fam, spoilt);
            let s = child(&fam, 4_000_005);
            assert_eq!(s.fpid, 5, "{spoilt}");
            fam.fork_abort(&s);
        }
        assert_eq!(a.fpid, 2);
        fam.exit(status::exited(0));
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
