//! The family region: its `repr(C)` layout (a header with the lock, a bell
//! per member, and `Inner` — members, pipes, queues, segments — under the
//! lock), the two accessors into it (bells, and `Inner` under the lock),
//! and the bookkeeping every family call may need: finding dead members,
//! ending a membership and dropping what it held, ringing waiters.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use wisp_abi::family::limits::*;
use wisp_abi::family::{signal, status};

use wisp_abi::family::rings::{self, Rings, NO_READERS, NO_WRITERS};

use super::shared::{self, SharedMap};
use crate::sys::futex_wake;

const MAGIC: u64 = 0x314d_4146_5053_4957; // "WISPFAM1"
pub(super) const FREE: u32 = 0;
pub(super) const RUNNING: u32 = 1;
pub(super) const ZOMBIE: u32 = 2;

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
    /// Held by the member's vCPU thread while the member lives: a robust
    /// mutex, so the kernel marks it when that thread dies, however it
    /// dies. Others find dead members with a `trylock`.
    alive: std::cell::UnsafeCell<libc::pthread_mutex_t>,
}

impl Bell {
    pub fn ring(&self) {
        self.seq.fetch_add(1, Ordering::SeqCst);
        futex_wake(&self.seq);
    }
}

#[repr(C)]
struct Header {
    magic: u64,
    lock: libc::pthread_mutex_t,
}

#[repr(C)]
pub(super) struct Member {
    pub(super) state: u32,
    pub(super) waiting: u32,
    /// Host pid of the member's monitor process (0 until the parent's
    /// `fork(2)` returned): for kicks, the reaper, never for guests.
    pub(super) pid: i32,
    /// The member's family pid ([`alloc_fpid`]): what guests see.
    pub(super) fpid: i32,
    /// The parent's family pid (0: a root, or an orphan).
    pub(super) ppid: i32,
    _pad: u32,
    pub(super) status: u64,
    /// Attached segments (bit per segment index).
    pub(super) shm: u64,
    /// 0 = free, else 1 + pipe * 2 + end (0 read, 1 write): see [`fd_entry`].
    pub(super) fds: [u16; MAX_FDS],
}

impl Member {
    /// A running member forked by `ppid` (its host pid still unknown).
    pub(super) fn forked(fpid: i32, ppid: i32, shm: u64, fds: [u16; MAX_FDS]) -> Member {
        Member { state: RUNNING, waiting: 0, pid: 0, fpid, ppid, _pad: 0, status: 0, shm, fds }
    }
}

/// The family pid of a family's root.
pub(super) const ROOT_FPID: i32 = 1;
/// The highest family pid; the next one after it is 2 (1 stays the root's).
pub(super) const FPID_MAX: i32 = i32::MAX;

/// A family pid for a new member: the one after the last handed out,
/// skipping any a member or zombie holds, so a pid never names two VMs
/// at once; after [`FPID_MAX`] the count starts again at 2. The counter
/// lives in shared memory that any member's monitor could have spoilt: a
/// value out of range counts as the end of the range, and since at most
/// [`MAX_MEMBERS`] slots hold a pid, one of the next `MAX_MEMBERS + 1`
/// candidates is free.
pub(super) fn alloc_fpid(inner: &mut Inner) -> i32 {
    let mut p = inner.last_fpid;
    for _ in 0..=MAX_MEMBERS {
        p = if (ROOT_FPID..FPID_MAX).contains(&p) { p + 1 } else { ROOT_FPID + 1 };
        if !inner.members.iter().any(|m| m.state != FREE && m.fpid == p) {
            break;
        }
    }
    inner.last_fpid = p;
    p
}

/// A pipe's bookkeeping; its bytes are in its ring on the guest-visible
/// page (`wisp_abi::family::rings`), the same index.
#[repr(C)]
pub(super) struct Pipe {
    pub(super) used: u32,
    pub(super) readers: u32,
    pub(super) writers: u32,
    _pad: u32,
}

/// A message queue's identity; its messages are in its ring on the
/// guest-visible page, the same index.
#[repr(C)]
pub(super) struct Queue {
    pub(super) used: u32,
    pub(super) gen: u32,
    pub(super) key: i64,
}

#[repr(C)]
pub(super) struct Segment {
    pub(super) used: u32,
    pub(super) gen: u32,
    pub(super) key: i64,
    pub(super) off: u64,
    pub(super) size: u64,
    pub(super) attached: u32,
    pub(super) removed: u32,
}

#[repr(C)]
pub(super) struct Inner {
    pub(super) limit: u32,
    pub(super) gen: u32,
    /// The family pid handed out last (the root's is 1).
    pub(super) last_fpid: i32,
    _pad: u32,
    pub(super) members: [Member; MAX_MEMBERS],
    pub(super) pipes: [Pipe; MAX_PIPES],
    pub(super) queues: [Queue; MAX_QUEUES],
    pub(super) segments: [Segment; MAX_SEGMENTS],
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
    pub(super) map: Arc<SharedMap>,
    pub(super) idx: usize,
}

impl BellRef {
    pub fn get(&self) -> &Bell {
        bell(&self.map, self.idx)
    }
}

/// Where the guest-visible page starts in the family's mapping: after the
/// monitors' part, on a page of its own (only it is ever mapped into a VM).
pub(super) const RINGS_OFF: usize = size_of::<Region>().next_multiple_of(rings::RINGS_SIZE as usize);

/// Map a new family region: zero-filled (no members, no objects), its lock
/// ready; the guest-visible page follows it ([`RINGS_OFF`]).
pub(super) fn create() -> std::io::Result<SharedMap> {
    let map = SharedMap::new(RINGS_OFF + rings::RINGS_SIZE as usize)?;
    let r = map.as_ptr() as *mut Region;
    // SAFETY: the region was just mapped, zero-filled and is private to
    // this thread until the first fork.
    unsafe {
        shared::mutex_init(&raw mut (*r).header.lock);
        (*r).header.magic = MAGIC;
    }
    Ok(map)
}

/// The `alive` mutex of member `idx`.
pub(super) fn alive(map: &SharedMap, idx: usize) -> *mut libc::pthread_mutex_t {
    bell(map, idx).alive.get()
}

/// Make member `idx`'s `alive` mutex new and take it (the calling thread
/// is the member's vCPU thread).
pub(super) fn claim_alive(map: &SharedMap, idx: usize) {
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
pub(super) fn reap_dead(map: &SharedMap, inner: &mut Inner, me: usize) -> bool {
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

/// The family's guest-visible page. Guests write it too: everything read
/// from it is checked before use.
pub(super) fn rings(map: &SharedMap) -> &Rings {
    // SAFETY: the map is `RINGS_OFF + RINGS_SIZE` bytes (made by `create`),
    // `RINGS_OFF` is page-aligned, zeroed memory is a valid `Rings` (atomics
    // only, any bit pattern valid), and it is only accessed through shared
    // references to atomics, by monitors and guests alike.
    unsafe { &*(map.as_ptr().add(RINGS_OFF) as *const Rings) }
}

pub(super) fn bell(map: &SharedMap, idx: usize) -> &Bell {
    let r = map.as_ptr() as *const Region;
    // SAFETY: the map is at least `size_of::<Region>()` bytes (made by
    // `create`), zero-initialised memory is a valid `Bell`, and
    // bells are only accessed through shared references to atomics.
    unsafe { &(*r).bells[idx.min(MAX_MEMBERS - 1)] }
}

/// The family region, locked.
pub(super) struct Locked<'a> {
    map: &'a SharedMap,
    pub(super) inner: &'a mut Inner,
}

pub(super) fn lock(map: &SharedMap) -> Locked<'_> {
    let r = map.as_ptr() as *mut Region;
    // SAFETY: the mutex was initialised by `create` before any other
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

/// Make signal `sig` (not `SIGKILL`) pending for member `idx` and wake it:
/// in its cell on the guest-visible page, where its guest may find it
/// without an exit, and as an event for its idle hypercall.
pub(super) fn raise(map: &SharedMap, idx: usize, sig: u32) {
    rings(map).cells[idx.min(MAX_MEMBERS - 1)].raise(sig);
    notify(map, idx);
}

/// Wake member `idx` with `events::FAMILY` (its idle hypercall returns, a
/// blocking call looks again).
pub(super) fn notify(map: &SharedMap, idx: usize) {
    let b = bell(map, idx);
    b.events.fetch_or(wisp_abi::events::FAMILY, Ordering::AcqRel);
    b.ring();
}

/// Ring every member blocked in a family call.
pub(super) fn wake_waiters(map: &SharedMap, inner: &mut Inner) {
    for (i, m) in inner.members.iter_mut().enumerate() {
        if m.waiting != 0 {
            m.waiting = 0;
            bell(map, i).ring();
        }
    }
}

/// A descriptor table entry for `end` (0 read, 1 write) of pipe `pipe`.
pub(super) fn fd_entry(pipe: usize, end: u16) -> u16 {
    1 + 2 * pipe as u16 + end
}

/// The (pipe, end) a descriptor table entry names, if any.
pub(super) fn fd_pipe(f: u16) -> Option<(usize, u16)> {
    let v = f.checked_sub(1)?;
    (((v / 2) as usize) < MAX_PIPES).then_some(((v / 2) as usize, v % 2))
}

/// The reference count of `end` of `p`.
pub(super) fn end_refs(p: &mut Pipe, end: u16) -> &mut u32 {
    if end == 0 {
        &mut p.readers
    } else {
        &mut p.writers
    }
}

/// Drop one reference to a pipe end (`f` as stored in a descriptor table);
/// the last one of an end says so on the pipe's ring (guests then ask the
/// monitor, which answers end of file or `EPIPE`).
pub(super) fn release_end(map: &SharedMap, inner: &mut Inner, f: u16) {
    let Some((pipe, end)) = fd_pipe(f) else { return };
    let p = &mut inner.pipes[pipe];
    let refs = end_refs(p, end);
    *refs = refs.saturating_sub(1);
    if *refs == 0 {
        rings(map).pipes[pipe].closed.fetch_or(if end == 0 { NO_READERS } else { NO_WRITERS }, Ordering::SeqCst);
    }
    if p.readers == 0 && p.writers == 0 {
        p.used = 0;
    }
}

/// Close a member's descriptors and drop its segment attachments.
pub(super) fn release_member(map: &SharedMap, inner: &mut Inner, idx: usize) {
    let fds = std::mem::replace(&mut inner.members[idx].fds, [0; MAX_FDS]);
    for f in fds.into_iter().filter(|&f| f != 0) {
        release_end(map, inner, f);
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
pub(super) fn detach_segment(arena: Option<&SharedMap>, inner: &mut Inner, idx: usize) {
    let s = &mut inner.segments[idx];
    s.attached = s.attached.saturating_sub(1);
    if s.attached == 0 && s.removed != 0 {
        free_segment(arena, s);
    }
}

pub(super) fn free_segment(arena: Option<&SharedMap>, s: &mut Segment) {
    s.used = 0;
    if let Some(a) = arena {
        a.discard(s.off as usize, s.size as usize);
    }
}

/// End member `idx` with wait status `st`.
pub(super) fn exit_member(map: &SharedMap, inner: &mut Inner, idx: usize, st: u64) {
    release_member(map, inner, idx);
    rings(map).cells[idx].fpid.store(0, Ordering::SeqCst);
    let (fpid, ppid) = (inner.members[idx].fpid, inner.members[idx].ppid);
    // Orphans: zombies go away, running children lose their parent.
    for (i, m) in inner.members.iter_mut().enumerate().filter(|(_, m)| m.state != FREE && m.ppid == fpid && fpid > 0) {
        if m.state == ZOMBIE {
            m.state = FREE;
        } else {
            m.ppid = 0;
            rings(map).cells[i].ppid.store(0, Ordering::SeqCst);
        }
    }
    let parent = (ppid > 0).then(|| inner.members.iter().position(|m| m.state == RUNNING && m.fpid == ppid)).flatten();
    let m = &mut inner.members[idx];
    m.status = st;
    m.state = if parent.is_some() { ZOMBIE } else { FREE };
    if let Some(p) = parent {
        raise(map, p, signal::SIGCHLD);
    }
    wake_waiters(map, inner);
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
}
