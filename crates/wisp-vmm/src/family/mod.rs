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

use std::sync::atomic::Ordering;
use std::sync::Arc;

use wisp_abi::errno::*;
use wisp_abi::family::limits::*;
use wisp_abi::family::{flags, signal};

use crate::sys::{futex_wait, kick_thread, process_exists, spin_on, SPIN};
use reaper::Reaper;
use region::{
    alive, bell, claim_alive, end_refs, exit_member, fd_pipe, lock, reap_dead, release_member, Inner, Member, FREE,
    RUNNING, ZOMBIE,
};
pub use region::{Bell, BellRef};
use shared::SharedMap;

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

/// What [`Family::blocking`] waits at most before looking for members
/// that died without anyone noticing (no CPU to speak of: one wake-up).
const RECHECK: std::time::Duration = std::time::Duration::from_secs(1);

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
        let map = Arc::new(region::create()?);
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
            return Err(if process_exists(pid) { EPERM } else { ESRCH });
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
                kick_thread(pid, tid, kick_sig);
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
