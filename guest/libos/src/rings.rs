//! The fast path of family IPC: pipe rings and signal cells on the family's
//! shared page (`wisp_abi::family::rings`), read and written here without
//! an exit. The monitor is entered only when a call has to wait (after a
//! short spin: a running peer usually answers within microseconds), to
//! wake a member that sleeps in its monitor, or when anything is unusual
//! (an end closed, a ring corrupt, a lock held long): then `family.rs`
//! makes the hypercall, and the monitor decides with what it trusts.
//!
//! Hand-written rather than a library: the protocol is wisp's own, shared
//! with the monitor through `wisp_abi`.

use wisp_abi::family::limits::{MAX_FDS, MAX_MEMBERS, MAX_PIPES, MAX_QUEUES, MSG_MAX};
use wisp_abi::family::op;
use wisp_abi::family::rings::{
    Blocked, Cell, NoMessage, PipeRing, QueueRing, Rings, Shared, NO_READERS, NO_WRITERS, RINGS_GPA,
};
use wisp_abi::family::signal::{MAX, SIGKILL};

use crate::global::Global;
use crate::signals::family_call;
use crate::time::monotonic_ns;

/// How long a call looks for its peer before it sleeps in the monitor.
pub(crate) const SPIN_NS: u64 = 50_000;

struct Page {
    /// 0: not asked yet; 1: mapped; 2: the monitor has none.
    state: u8,
    /// This VM's cell index.
    me: usize,
    /// This VM's family pid (the lock owner's name).
    fpid: u32,
    /// Per descriptor: 0 not known, else 1 + ring * 2 + end.
    fds: [u8; MAX_FDS],
}

static PAGE: Global<Page> = Global::new(Page { state: 0, me: 0, fpid: 0, fds: [0; MAX_FDS] });

fn rings() -> &'static Rings {
    // SAFETY: only called once the monitor answered RINGS, which mapped
    // the page at `RINGS_GPA` (user, read/write) for the rest of this VM's
    // life; it holds atomics only (any bit pattern is valid), shared with
    // the family's other VMs and monitors, so only shared references exist.
    unsafe { &*(RINGS_GPA as *const Rings) }
}

/// (the page, this VM's cell index, its family pid), asking the monitor the
/// first time.
fn page() -> Option<(&'static Rings, usize, u32)> {
    let (state, me, fpid) = PAGE.with(|p| (p.state, p.me, p.fpid));
    match state {
        1 => return Some((rings(), me, fpid)),
        2 => return None,
        _ => {}
    }
    let (idx, gpa, _) = family_call(op::RINGS, 0, [0; 4]);
    let (pid, _, _) = family_call(op::GETPID, 0, [0; 4]);
    let ok = idx >= 0 && (idx as usize) < MAX_MEMBERS && gpa == RINGS_GPA as u64 && pid > 0;
    PAGE.with(|p| {
        (p.state, p.me, p.fpid) = if ok { (1, idx as usize, pid as u32) } else { (2, 0, 0) };
    });
    ok.then(|| (rings(), idx as usize, pid as u32))
}

/// In a forked child: its cell and pid differ from the parent's (its
/// descriptors are the parent's).
pub(crate) fn after_fork() {
    PAGE.with(|p| p.state = if p.state == 2 { 2 } else { 0 });
}

/// Descriptor `fd` closed or made anew: its ring is asked again.
pub(crate) fn forget(fd: u32) {
    PAGE.with(|p| {
        if let Some(f) = p.fds.get_mut(fd as usize) {
            *f = 0;
        }
    });
}

/// The ring behind `fd` if it is a pipe's `end`, and this VM's pid.
fn ring_of(fd: u32, end: u8) -> Option<(&'static PipeRing, u32)> {
    let (r, _, fpid) = page()?;
    let known = PAGE.with(|p| p.fds.get(fd as usize).copied())?;
    let v = if known != 0 {
        known
    } else {
        let (ring, e, _) = family_call(op::FDRING, 0, [fd as u64, 0, 0, 0]);
        if ring < 0 || ring as usize >= MAX_PIPES || e > 1 {
            return None;
        }
        let v = 1 + ring as u8 * 2 + e as u8;
        PAGE.with(|p| p.fds[fd as usize] = v);
        v
    };
    ((v - 1) % 2 == end).then(|| (&r.pipes[((v - 1) / 2) as usize], fpid))
}

fn wake(kind: u64, idx: u64) {
    family_call(op::WAKE, 0, [kind, idx, 0, 0]);
}

/// Run `f` on `ring` under its lock; if it moved something, wakes the
/// sleepers that asked. `None` if the lock is taken.
fn locked<R: Shared, T, E>(ring: &R, fpid: u32, f: impl FnOnce(&R) -> Result<T, E>) -> Option<Result<T, E>> {
    if !ring.try_lock(fpid) {
        return None;
    }
    let r = f(ring);
    if ring.unlock(r.is_ok()) {
        wake(0, 0);
    }
    Some(r)
}

/// Read from pipe descriptor `fd` without an exit: `Some(n)` (n > 0), or
/// `None` for the monitor to do it (empty for a while, end of file, not a
/// pipe's read end, a corrupt ring).
pub(crate) fn read(fd: u32, buf: &mut [u8], spin_ns: u64) -> Option<usize> {
    let (ring, fpid) = ring_of(fd, 0)?;
    if buf.is_empty() {
        return None;
    }
    let start = monotonic_ns();
    loop {
        if ring.used() != Ok(0) {
            match locked(ring, fpid, |r| r.take(buf)) {
                Some(Ok(n)) => return Some(n),
                Some(Err(Blocked::Corrupt)) => return None,
                _ => {}
            }
        }
        if ring.closed.load(core::sync::atomic::Ordering::Acquire) & NO_WRITERS != 0
            || monotonic_ns() - start > spin_ns
        {
            return None;
        }
        core::hint::spin_loop();
    }
}

/// Write to pipe descriptor `fd` without an exit: the bytes written (all
/// of `data` unless the ring stayed full or something is unusual; the
/// monitor does the rest).
pub(crate) fn write(fd: u32, data: &[u8]) -> usize {
    let Some((ring, fpid)) = ring_of(fd, 1) else { return 0 };
    let mut done = 0;
    let mut start = monotonic_ns();
    while done < data.len() {
        if ring.closed.load(core::sync::atomic::Ordering::Acquire) & NO_READERS != 0 {
            break;
        }
        match locked(ring, fpid, |r| r.put(&data[done..])) {
            Some(Ok(n)) => {
                done += n;
                start = monotonic_ns();
                continue;
            }
            Some(Err(Blocked::Corrupt)) => break,
            _ => {}
        }
        if monotonic_ns() - start > SPIN_NS {
            break;
        }
        core::hint::spin_loop();
    }
    done
}

/// Queue `id`'s ring, if the page serves it, and this VM's pid.
fn queue_of(id: u64) -> Option<(&'static QueueRing, u32)> {
    let (r, _, fpid) = page()?;
    let ring = r.queues.get((id & 0xff) as usize).filter(|_| ((id & 0xff) as usize) < MAX_QUEUES)?;
    ring.serves(id).then_some((ring, fpid))
}

/// Send on queue `id` without an exit: true if sent (false: the monitor
/// does it — the queue stayed full, or anything unusual).
pub(crate) fn msgsnd(id: u64, mtype: i64, data: &[u8]) -> bool {
    if mtype <= 0 || data.len() > MSG_MAX {
        return false;
    }
    let Some((ring, fpid)) = queue_of(id) else { return false };
    let start = monotonic_ns();
    loop {
        // Still that queue, checked under its lock (the monitor removes a
        // queue under it too).
        match locked(ring, fpid, |r| if r.serves(id) { r.send(mtype, data) } else { Err(Blocked::Corrupt) }) {
            Some(Ok(())) => return true,
            Some(Err(Blocked::Corrupt)) => return false,
            _ => {}
        }
        if !ring.serves(id) || monotonic_ns() - start > SPIN_NS {
            return false;
        }
        core::hint::spin_loop();
    }
}

/// Receive from queue `id` without an exit (as `family::msgrcv`): `None`
/// for the monitor to do it (nothing for `spin_ns`, too long, unusual).
pub(crate) fn msgrcv(id: u64, buf: &mut [u8], msgtyp: i64, truncate: bool, spin_ns: u64) -> Option<(usize, i64)> {
    let (ring, fpid) = queue_of(id)?;
    let start = monotonic_ns();
    loop {
        let mut seen = ring.count.load(core::sync::atomic::Ordering::Acquire);
        if seen != 0 {
            let recv = |r: &QueueRing| if r.serves(id) { r.receive(msgtyp, buf, truncate) } else { Err(NoMessage::Corrupt) };
            match locked(ring, fpid, recv) {
                Some(Ok(got)) => return Some(got),
                Some(Err(NoMessage::Wait)) => {}
                Some(Err(_)) => return None,
                None => seen = u32::MAX,
            }
        }
        // Wait for the queue to change (or its lock to be free).
        let left = spin_ns.saturating_sub(monotonic_ns() - start);
        let changed = spin(left, || ring.count.load(core::sync::atomic::Ordering::Acquire) != seen || !ring.serves(id));
        if !changed || !ring.serves(id) {
            return None;
        }
    }
}

/// Send signal `sig` to family pid `pid` through the page: true if sent
/// (false: the monitor does it — `SIGKILL`, signal 0, a pid the page does
/// not show).
pub(crate) fn kill(pid: u32, sig: u32) -> bool {
    if sig == 0 || sig == SIGKILL || sig > MAX {
        return false;
    }
    let Some((r, _, _)) = page() else { return false };
    let Some(cell) = r.cell_of(pid as i32) else { return false };
    if cell.raise(sig) {
        let idx = (cell as *const Cell as usize - r.cells.as_ptr() as usize) / core::mem::size_of::<Cell>();
        wake(1, idx as u64);
    }
    true
}

/// Whether member `pid` sleeps in its monitor now (`None`: no page, or no
/// such member on it).
pub(crate) fn parked(pid: u32) -> Option<bool> {
    let (r, _, _) = page()?;
    Some(r.cell_of(pid as i32)?.parked.load(core::sync::atomic::Ordering::Acquire) != 0)
}

/// (this VM's pid, its parent's) from the page, if this VM uses it.
pub(crate) fn pids() -> Option<(u32, u32)> {
    if PAGE.with(|p| p.state) != 1 {
        return None;
    }
    let (r, me, fpid) = page()?;
    Some((fpid, r.cells[me].ppid.load(core::sync::atomic::Ordering::Acquire).max(0) as u32))
}

/// Deliver the signals raised for this VM on the page, without an exit
/// (after a fast-path call).
pub(crate) fn poll_page() {
    crate::signals::deliver(take_signals());
}

/// Take the signals raised for this VM on the page (0 if none, or no page).
pub(crate) fn take_signals() -> u64 {
    if PAGE.with(|p| p.state) != 1 {
        return 0;
    }
    let (r, me, _) = page().expect("mapped");
    r.cells[me].take()
}

/// Wait up to `ns` for `SIGCHLD` on the page, without taking it (a
/// blocking `waitpid` looks for its child's end before it asks the
/// monitor: a child that exits at once ends within a few hundred µs).
pub(crate) fn spin_for_child(ns: u64) {
    use wisp_abi::family::signal::SIGCHLD;
    let Some((r, me, _)) = page() else { return };
    spin(ns, || r.cells[me].signals.load(core::sync::atomic::Ordering::Acquire) & (1 << SIGCHLD) != 0);
}

/// Wait up to the spin time for a signal raised on the page; the ones taken.
pub(crate) fn spin_for_signals() -> u64 {
    let Some((r, me, _)) = page() else { return 0 };
    let mut s = 0;
    spin(SPIN_NS, || {
        s = r.cells[me].take();
        s != 0
    });
    s
}

/// Look at `done` until it says yes or `ns` pass; whether it said yes.
fn spin(ns: u64, mut done: impl FnMut() -> bool) -> bool {
    let start = monotonic_ns();
    loop {
        if done() {
            return true;
        }
        if monotonic_ns() - start >= ns {
            return false;
        }
        core::hint::spin_loop();
    }
}
