//! Prepared forks. A VM that forked once keeps a *spare*: a monitor
//! process forked ahead of time — at an exit where the guest is about to
//! wait anyway — that has made its KVM VM and vCPU and maps guest RAM of
//! its own (an empty memfd, copy-on-write). The next fork hands the guest
//! to it: the parent writes the pages of guest RAM that hold anything into
//! the memfd (a small unikernel has touched ~100 KiB), puts the vCPU state
//! in a page it shares with the spare, and wakes it; the spare becomes the
//! child. On the parent's critical path there is no `fork(2)`, no VM to
//! create, and its guest pages keep their KVM mappings (`fork(2)` would
//! write-protect them all and the guest would fault each one back, ~8 µs a
//! page on PVM hosts). A guest whose RAM holds more than [`COPY_LIMIT`]
//! forks the classic way (`fork.rs`), which copies nothing up front.
//!
//! Hand-written because Linux has no call that gives another process a
//! copy-on-write copy of one mapping; what can be prepared is prepared.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use kvm_bindings::{kvm_fpu, kvm_regs, kvm_sregs};
use wisp_abi::family::{flags, op, Call};
use wisp_abi::{args, Hypercall};

use super::{Exit, Vm};
use crate::family::{ForkSlot, SharedMap};
use crate::memory::GuestRam;
use crate::state::VcpuState;

/// Most bytes of guest RAM a fork copies; above it the fork is `fork(2)`'s.
/// (Less where the process may not make files that large: `RLIMIT_FSIZE`,
/// 1 MiB in wispd's sandbox, bounds the spare's RAM file.)
pub(super) const COPY_LIMIT: u64 = 2 << 20;

/// Most attached shared-memory segments a hand-over carries.
const MAX_ATTACHED: usize = 64;

/// Most runs of copied pages a hand-over carries (runs closer than
/// [`RUN_GAP`] merge).
const MAX_RUNS: usize = 128;
const RUN_GAP: u64 = 64 << 10;

/// The hand-over word, at the start of the shared page.
const PREPARING: u32 = 0;
const READY: u32 = 1;
const FAILED: u32 = 2;
const GO: u32 = 3;
const CANCEL: u32 = 4;
/// The parent let go of a spare whose child runs: the child ends as a
/// process, not as a spare again.
const RELEASED: u32 = 5;

/// Most spares a parent keeps lent to running children (each comes back as
/// a spare when its child's guest ends: `Vm::recycle_begin`).
const MAX_LENT: usize = 4;

/// Where [`Hand`] sits in the shared page.
const HAND_OFFSET: usize = 64;
const PAGE: usize = 8192;
const _: () = assert!(HAND_OFFSET + size_of::<Hand>() <= PAGE);

/// What the parent gives the spare at a fork (written before `GO`).
#[repr(C)]
#[derive(Clone, Copy)]
struct Hand {
    regs: kvm_regs,
    sregs: kvm_sregs,
    fpu: kvm_fpu,
    tsc: u64,
    /// When the parent saved the state, in ns since the VM's boot instant
    /// (the spare has the same instant: it is a copy of the parent).
    saved_ns: u64,
    idx: u32,
    fpid: i32,
    parent_pid: i32,
    n_attached: u32,
    attached: [[u32; 2]; MAX_ATTACHED],
    /// The fork's argument block (the child writes its result, 0).
    fork_gpa: u64,
    n_runs: u32,
    _pad: u32,
    /// Guest RAM to map from the file: (guest-physical start, length, file
    /// offset); the rest is zeros.
    runs: [[u64; 3]; MAX_RUNS],
}

/// The parent's handle on its spare.
pub(super) struct Spare {
    pid: i32,
    /// The child's guest RAM file (a memfd), mapped: written at the fork
    /// with the pages that hold anything, back to back, `cap` bytes at most.
    view: SharedMap,
    cap: u64,
    page: SharedMap,
    /// Scratch space for the list of pages to copy.
    scratch: Vec<u8>,
    /// It served an earlier fork (its child's guest ended and it came back).
    pub(super) reused: bool,
    /// Its process, to tell a spare that died while it waited (killed from
    /// outside) from a ready one.
    pidfd: Option<OwnedFd>,
    /// Handed a fork once: the child's watch (the reaper) reaps the process.
    lent: bool,
}

/// In a child made from a spare: what it needs to become its parent's
/// spare again when its guest ends (its RAM file and the shared page).
pub(super) struct Recycle {
    mem: OwnedFd,
    page: SharedMap,
}

impl Recycle {
    /// The RAM file's descriptor (kept open in the child).
    pub(super) fn file(&self) -> i32 {
        std::os::fd::AsRawFd::as_raw_fd(&self.mem)
    }
}

/// The hand-over word of `page`.
fn word(page: &SharedMap) -> &AtomicU32 {
    // SAFETY: the mapping is at least a page long and page aligned, so
    // offset 0 holds an aligned u32 for as long as `page` lives; it is only
    // ever accessed atomically, by the parent and the spare.
    unsafe { &*page.as_ptr().cast::<AtomicU32>() }
}

impl Spare {
    /// Give the guest (its RAM, `vcpu`) to the spare as the child in `slot`;
    /// `gpa` is the fork's argument block. On success the spare's host pid.
    /// Err(true): not this time (too much RAM to copy), the spare stays
    /// usable; Err(false): it is not.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn hand_off(
        &mut self,
        ram: &GuestRam,
        gpa: u64,
        vcpu: &VcpuState,
        slot: &ForkSlot,
        attached: &[(usize, u32)],
        saved: Duration,
    ) -> Result<i32, bool> {
        let w = word(&self.page);
        if w.load(Ordering::Acquire) == FAILED || attached.len() > MAX_ATTACHED || !self.alive() {
            return Err(false);
        }
        let runs = match ram.resident(self.cap, &mut self.scratch) {
            Ok(Some(runs)) => runs,
            Ok(None) => return Err(true),
            Err(_) => return Err(false),
        };
        let (runs, size) = crate::memory::pack_runs(&runs, RUN_GAP);
        if size > self.cap || runs.len() > MAX_RUNS {
            return Err(true);
        }
        ram.copy_runs(&self.view, &runs).map_err(|_| false)?;
        let mut h = Hand {
            regs: vcpu.regs,
            sregs: vcpu.sregs,
            fpu: vcpu.fpu,
            tsc: vcpu.tsc,
            saved_ns: saved.as_nanos() as u64,
            idx: slot.idx as u32,
            fpid: slot.fpid,
            parent_pid: slot.parent_pid,
            n_attached: attached.len() as u32,
            attached: [[0; 2]; MAX_ATTACHED],
            fork_gpa: gpa,
            n_runs: runs.len() as u32,
            _pad: 0,
            runs: [[0; 3]; MAX_RUNS],
        };
        for (d, &(seg, n)) in h.attached.iter_mut().zip(attached) {
            *d = [seg as u32, n];
        }
        for (d, &(gpa, len, off)) in h.runs.iter_mut().zip(&runs) {
            *d = [gpa, len, off];
        }
        // SAFETY: the hand lies inside the page (checked at compile time),
        // aligned; the spare reads it only after it sees GO, stored below
        // with release ordering.
        unsafe { std::ptr::write(self.page.as_ptr().add(HAND_OFFSET).cast::<Hand>(), h) };
        let mut cur = w.load(Ordering::Acquire);
        loop {
            if cur != PREPARING && cur != READY {
                return Err(false);
            }
            match w.compare_exchange(cur, GO, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => break,
                Err(v) => cur = v,
            }
        }
        crate::sys::futex_wake(w);
        Ok(self.pid)
    }
}

impl Spare {
    /// Ready to take a fork (again: its last child's guest ended).
    fn ready(&self) -> bool {
        word(&self.page).load(Ordering::Acquire) == READY && self.alive()
    }

    /// Its process has not ended (as far as a pidfd tells; without one,
    /// assumed).
    fn alive(&self) -> bool {
        use rustix::event::{poll, PollFd, PollFlags};
        let Some(fd) = &self.pidfd else { return true };
        let mut fds = [PollFd::new(fd, PollFlags::IN)];
        poll(&mut fds, Some(&rustix::time::Timespec { tv_sec: 0, tv_nsec: 0 })).is_ok_and(|n| n == 0)
    }
}

impl Drop for Spare {
    /// Not handed a guest: tell the spare to go, and reap it. Handed one (a
    /// lent spare): its child runs on and ends as a process.
    fn drop(&mut self) {
        let w = word(&self.page);
        if w.swap(CANCEL, Ordering::AcqRel) == GO {
            w.store(RELEASED, Ordering::Release); // it is a VM now, watched as one
            return;
        }
        crate::sys::futex_wake(w);
        // A lent one's process is its last child's: the reaper reaps it (a
        // wait here could even take another child that got its pid).
        if !self.lent {
            let _ = crate::sys::wait_child(self.pid);
        }
    }
}

/// What [`Vm::make_spare`] turned this process into.
pub(super) enum Made {
    /// The parent: its spare is ready to take a fork (or none was made).
    Parent,
    /// The spare, handed a guest: the child of a fork, to be run.
    Child,
}

impl Vm {
    /// Whether to make a spare before serving `exit`: the VM forked since
    /// the last try and the exit is a call that is likely to wait (idle, or
    /// a blocking family call), so the guest loses no time to it.
    pub(super) fn spare_wanted(&self, exit: &Exit) -> bool {
        // A VM with libraries forks with fork(2) only: a spare made ahead
        // would hold its libraries' variables as they were then.
        if !self.family.opts.spares || self.spare.is_some() || self.spare_round >= self.forks || !self.can_fork_now() || self.devices.window().is_some() {
            return false;
        }
        let Exit::Out { port, data, len: 4 } = exit else {
            return false;
        };
        if *port == Hypercall::Idle.port() {
            return true;
        }
        if *port != Hypercall::Family.port() {
            return false;
        }
        match self.shell.ram.read_obj::<Call>(u32::from_le_bytes(*data) as u64) {
            Ok(c) => c.flags & flags::NOWAIT == 0 && matches!(c.op, op::READ | op::MSGRCV | op::WAIT | op::PAUSE),
            Err(_) => false,
        }
    }

    /// Fork a spare monitor process (see the module's comment). In the
    /// parent, returns at once; in the spare, returns once a fork handed it
    /// a guest (it is that fork's child then) — or never, when it is not
    /// needed.
    pub(super) fn make_spare(&mut self) -> Made {
        self.spare_round = self.forks;
        // What the next fork will likely copy: those pages of the file get
        // their memory now, so the copy only copies.
        let mut scratch = Vec::new();
        // The file may not grow past the process's file size limit (a
        // larger one would end the process with SIGXFSZ).
        let page_size = wisp_abi::layout::PAGE_SIZE;
        let fsize = rustix::process::getrlimit(rustix::process::Resource::Fsize).current.unwrap_or(u64::MAX);
        let cap = COPY_LIMIT.min(fsize & !(page_size - 1));
        let Ok(Some(likely)) = self.shell.ram.resident(cap, &mut scratch) else { return Made::Parent };
        let (likely, size) = crate::memory::pack_runs(&likely, RUN_GAP);
        if size > cap || likely.len() > MAX_RUNS {
            return Made::Parent;
        }
        let kit = (|| -> std::io::Result<(OwnedFd, SharedMap, SharedMap)> {
            self.family.ensure_arena()?;
            let mem = rustix::fs::memfd_create("wisp-fork", rustix::fs::MemfdFlags::CLOEXEC)?;
            rustix::fs::ftruncate(&mem, cap)?;
            rustix::fs::fallocate(&mem, rustix::fs::FallocateFlags::KEEP_SIZE, 0, size)?;
            let view = SharedMap::of_file(mem.as_fd(), cap as usize)?;
            Ok((mem, view, SharedMap::new(PAGE)?))
        })();
        let Ok((mem, view, page)) = kit else {
            return Made::Parent;
        };
        if self.shell.ram.set_inherited(false).is_err() {
            return Made::Parent;
        }
        let parent = self.family.pid();
        let name = crate::sys::thread_name();
        // The spare prepares as a batch job: it does not take the CPU from
        // this thread (the guest is on its way back), and KVM's thread for
        // its VM starts so too.
        crate::sys::set_batch(true);
        // SAFETY: as for the fork in `fork.rs`: in the spare only this
        // (vCPU) thread exists, and until it is handed a guest it touches
        // only what it makes (KVM VM, guest RAM mapping) and the shared page;
        // devices let go of what their threads own (`on_fork_child`).
        match unsafe { crate::sys::fork() } {
            Ok(0) => {
                // Left out of this process (MADV_DONTFORK): not to unmap.
                std::mem::forget(view);
                // The parent's lent spares stay the parent's.
                std::mem::forget(std::mem::take(&mut self.lent));
                // Told apart from VMs in `ps` until it is one.
                crate::sys::set_thread_name(b"wisp-spare\0\0\0\0\0\0");
                self.serve_as_spare(mem, page, parent);
                crate::sys::set_thread_name(&name);
                Made::Child
            }
            r => {
                crate::sys::set_batch(false);
                let _ = self.shell.ram.set_inherited(true);
                if let Ok(pid) = r {
                    let pidfd = rustix::process::Pid::from_raw(pid)
                        .and_then(|p| rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty()).ok());
                    self.spare = Some(Spare { pid, view, cap, page, scratch, reused: false, pidfd, lent: false });
                }
                Made::Parent
            }
        }
    }

    /// In the spare: prepare, wait for a guest, become its VM.
    fn serve_as_spare(&mut self, mem: OwnedFd, page: SharedMap, parent: i32) {
        // Not needed any more if the parent goes.
        if crate::sys::die_with_parent() != parent {
            crate::sys::exit_now(0);
        }
        self.devices.on_fork_child();
        let prep = (self.shell.ram.map_zero())
            .and_then(|()| self.shell.renew_warm())
            // The warm-up's pages go: the child's come from the file.
            .and_then(|()| self.shell.ram.map_zero());
        // The parent's descriptors are not the spare's: they go now, not
        // when (if ever) it becomes a VM. Its RAM file stays: it serves again
        // when its child's guest ends (`recycle_begin`).
        self.close_inherited(&[std::os::fd::AsRawFd::as_raw_fd(&mem)]);
        let w = word(&page);
        match w.compare_exchange(PREPARING, if prep.is_ok() { READY } else { FAILED }, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) if prep.is_err() => crate::sys::exit_now(0),
            _ => {}
        }
        self.await_guest(Recycle { mem, page }, prep);
    }

    /// In a spare that is ready: wait for a fork's guest (or to be told to
    /// go), become that fork's child.
    fn await_guest(&mut self, r: Recycle, prep: crate::error::Result<()>) {
        let w = word(&r.page);
        let mut cur = w.load(Ordering::Acquire);
        while cur != GO {
            if cur == CANCEL {
                crate::sys::exit_now(0);
            }
            crate::sys::futex_wait(w, cur, None);
            cur = w.load(Ordering::Acquire);
        }
        // SAFETY: written by the parent before it stored GO (release), read
        // after GO was seen (acquire); inside the page, aligned.
        let h: Hand = unsafe { std::ptr::read(r.page.as_ptr().add(HAND_OFFSET).cast::<Hand>()) };
        if h.idx as usize >= wisp_abi::family::limits::MAX_MEMBERS {
            crate::sys::stderr_line("wisp: a spare was handed a member slot out of range");
            crate::sys::exit_now(125);
        }
        let slot = ForkSlot { idx: h.idx as usize, fpid: h.fpid, parent_pid: h.parent_pid };
        let n = (h.n_attached as usize).min(MAX_ATTACHED);
        self.family.set_attached(h.attached[..n].iter().map(|&[s, c]| (s as usize, c)).collect());
        let st = VcpuState { regs: h.regs, sregs: h.sregs, fpu: h.fpu, tsc: h.tsc };
        // Guest RAM: the pages the parent copied, and fork's result, 0.
        let runs: Vec<(u64, u64, u64)> =
            h.runs[..(h.n_runs as usize).min(MAX_RUNS)].iter().map(|&[g, l, o]| (g, l, o)).collect();
        let prep = prep
            .and_then(|()| self.shell.ram.map_runs(r.mem.as_fd(), &runs))
            .and_then(|()| self.shell.ram.write_obj(h.fork_gpa, &args::Fork { ret: 0 }));
        let ago = self.boot.elapsed().saturating_sub(Duration::from_nanos(h.saved_ns));
        self.recycle = Some(r);
        self.enter_child(&slot, st, ago, Some(prep));
    }

    /// The parent: a fork was handed to `spare`; keep it for when the
    /// child's guest ends (it then is a spare again).
    pub(super) fn lend(&mut self, mut spare: Spare) {
        spare.lent = true;
        if self.lent.len() >= MAX_LENT {
            drop(self.lent.remove(0));
        }
        self.lent.push(spare);
    }

    /// The parent: take back a lent spare that is ready again, if this VM
    /// has none.
    pub(super) fn reclaim_spare(&mut self) {
        // Spares forked before an inherited descriptor was replaced hold the
        // old one: they go (lent ones' children run on and end as processes).
        let epoch = self.control.inherited_epoch();
        if epoch != self.spares_epoch {
            drop(self.spare.take());
            self.lent.clear();
            self.spares_epoch = epoch;
        }
        if self.spare.is_none() {
            if let Some(i) = self.lent.iter().position(Spare::ready) {
                let mut s = self.lent.swap_remove(i);
                s.reused = true;
                self.spare = Some(s);
            }
        }
    }

    /// In a child made from a spare whose guest ended (`outcome`), before
    /// its family learns of it: if it can serve its parent again, reset to
    /// a spare's state (RAM back to the file's contents, the segments it
    /// attached gone) and say it is ready. Not a child that forked (its own
    /// children and spares end with it), nor one stopped from outside.
    /// Called once the run ended (its spares are gone by then).
    pub(super) fn recycle_begin(&mut self, outcome: &super::Outcome) -> Option<Recycle> {
        let r = self.recycle.take()?;
        if !self.family.opts.recycle || !matches!(outcome, super::Outcome::Exited(_)) || self.forks != 0 {
            return None;
        }
        for (slot, gpa, _, _) in self.family.attachments() {
            if slot != crate::family::RINGS_SLOT {
                super::ipc::map_slot(&self.shell.vm, slot, gpa, 0, 0);
            }
        }
        self.shell.ram.map_zero().ok()?;
        word(&r.page).compare_exchange(GO, READY, Ordering::AcqRel, Ordering::Acquire).ok()?;
        Some(r)
    }

    /// In a child that `recycle_begin` made a spare again, after its end was
    /// told: wait for the parent's next fork and become its child.
    pub(super) fn recycle(&mut self, r: Recycle) {
        let name = crate::sys::thread_name();
        crate::sys::set_thread_name(b"wisp-spare\0\0\0\0\0\0");
        crate::sys::set_batch(true);
        self.await_guest(r, Ok(()));
        crate::sys::set_thread_name(&name);
    }
}
