//! Fork: the child VM is made in another monitor process, over a copy of
//! guest RAM, with the parent's state (`crate::state`). Two ways: hand the
//! guest to a spare process prepared ahead of time (`spare.rs`: the pages
//! that hold anything are copied), or fork the monitor process here (guest
//! RAM is a private mapping, so the child holds a copy-on-write copy of it)
//! and make the child's KVM VM there.

use std::sync::Arc;
use std::time::{Duration, Instant};

use wisp_abi::{args, Hypercall};

use super::hypercall::{arg_block, write_block, Served};
use super::ipc::map_slot;
use super::Vm;
use crate::control::Control;
use crate::error::{Error, Result};
use crate::family::ForkSlot;
use crate::signal::ThreadId;
use crate::state::VcpuState;

impl Vm {
    /// Keep descriptor `fd` in forked children (and spares). A forked
    /// child's monitor process closes, before its guest runs, every
    /// descriptor above 2 that its VM does not own (KVM, its VM and vCPU,
    /// its control block's) and that was not kept here: the parent's
    /// control sockets, files, tap, image, spare, reaper and I/O-thread
    /// handles are the parent's. Whatever the embedder uses or drops in a
    /// child must be kept (e.g. the toolstack's uplink), and stay open as
    /// long as this VM.
    pub fn keep_in_children(&mut self, fd: std::os::fd::BorrowedFd<'_>) {
        self.keep.push(std::os::fd::AsRawFd::as_raw_fd(&fd));
    }

    /// In a forked child or a spare: close what the parent's objects held
    /// (see [`Vm::keep_in_children`]).
    pub(super) fn close_inherited(&self, also: &[i32]) {
        use std::os::fd::AsRawFd;
        let mut keep = self.keep.clone();
        keep.extend_from_slice(also);
        keep.extend([self.shell.vm.as_raw_fd(), self.shell.vcpu.as_raw_fd()]);
        keep.extend(self.shell.kvm.as_ref().map(AsRawFd::as_raw_fd));
        keep.extend(self.control.idle_fd().map(|f| f.as_raw_fd()));
        // SAFETY: in this process only the vCPU thread exists; what the
        // VM owns (its shell's descriptors, its control block's) and what
        // the embedder kept stay. Everything else belonged to threads of
        // the parent (control server and its connections, the NIC's I/O
        // thread, the reaper) or to objects forgotten here (the parent's
        // spare, reaper, NIC state, watchdog), or to devices, which let go
        // of theirs in `on_fork_child`: none is used or dropped here.
        unsafe { crate::sys::close_all_but(&keep) };
    }

    /// The fork hypercall (`declared`: the image declared the feature).
    pub(super) fn fork_call(&mut self, gpa: u64, declared: bool) -> Served {
        let ram = self.shell.ram.view();
        arg_block(&ram, &self.user, Hypercall::Fork, gpa, size_of::<args::Fork>(), true)?;
        let ret = if declared { self.fork(gpa) } else { wisp_abi::errno::ENOSYS };
        // In the child this writes its own (copy-on-write) RAM.
        write_block(&ram, Hypercall::Fork, gpa, &args::Fork { ret })
    }

    /// Whether this VM may fork now (the image declared it, its family
    /// allows it, and its monitor can make a VM).
    pub(super) fn can_fork_now(&self) -> bool {
        self.family.opts.fork && self.shell.can_fork() && self.features & wisp_abi::features::FORK != 0
    }

    /// Finish a fork handed to a spare (see `after_fork`).
    pub(super) fn finish_fork(&mut self) {
        if let Some((spare, slot, pid)) = self.after_fork.take() {
            self.family.watch_child(&slot, pid);
            self.lend(spare);
        }
        self.reclaim_spare();
    }

    /// Fork this VM (`gpa`: the call's argument block). Returns the child's
    /// family pid, 0 in the child, or a negative errno.
    fn fork(&mut self, gpa: u64) -> i64 {
        use wisp_abi::errno::*;
        if !self.family.opts.fork || !self.shell.can_fork() {
            return ENOSYS;
        }
        if self.family.ensure_arena().is_err() {
            return ENOMEM;
        }
        let slot = match self.family.fork_reserve() {
            Ok(s) => s,
            Err(e) => return e,
        };
        let st = match self.save_state() {
            Ok(s) => s,
            Err(_) => {
                self.family.fork_abort(&slot);
                return EAGAIN;
            }
        };
        let t = Instant::now();
        self.forks += 1;
        self.reclaim_spare();
        if let Some(mut spare) = self.spare.take() {
            let attached = self.family.attached_list();
            let saved = t.duration_since(self.boot);
            match spare.hand_off(&self.shell.ram, gpa, &st.vcpu, &slot, &attached, saved) {
                Ok(pid) => {
                    self.shell.stats.forks_prepared += 1;
                    self.shell.stats.forks_recycled += spare.reused as u64;
                    self.family.fork_parent_done(&slot, pid);
                    // Its handle (a descriptor, a mapping) and the child's
                    // watch cost system calls the guest need not wait for:
                    // at the next exit.
                    let fpid = slot.fpid as i64;
                    self.after_fork = Some((spare, slot, pid));
                    return fpid;
                }
                Err(true) => self.spare = Some(spare),
                Err(false) => {}
            }
        }
        // SAFETY: in the child only this (vCPU) thread exists. Until it owns
        // its state it takes no process-private lock another thread may have
        // held: it builds new objects (KVM VM, control block, watchdog),
        // uses only the family region's process-shared robust mutex, writes
        // errors with `stderr_line`, and leaves alone everything the
        // parent's other threads own (watchdog, device I/O threads, the
        // reaper, toolstack threads): devices let go of theirs
        // (`on_fork_child`), the old watchdog and reaper are forgotten.
        match unsafe { crate::sys::fork() } {
            Err(_) => {
                self.family.fork_abort(&slot);
                EAGAIN
            }
            Ok(0) => {
                // The parent's spares stay the parent's.
                std::mem::forget(self.spare.take());
                std::mem::forget(std::mem::take(&mut self.lent));
                // And this process is nobody's spare.
                self.recycle = None;
                self.enter_child(&slot, st.vcpu, t.elapsed(), None);
                0
            }
            Ok(pid) => {
                self.family.fork_parent_done(&slot, pid);
                self.family.watch_child(&slot, pid);
                slot.fpid as i64
            }
        }
    }

    /// In the child's process: become the child VM, whose state `st` was
    /// saved `ago`. `prepared`: the outcome of a spare's preparation (its
    /// KVM VM made over its own RAM), or `None` after `fork(2)` here. A
    /// failure ends the child's membership (never the parent's) and this
    /// process.
    pub(super) fn enter_child(&mut self, slot: &ForkSlot, st: VcpuState, ago: Duration, prepared: Option<Result<()>>) {
        self.family.become_child(slot);
        if let Err(e) = self.become_child(slot, st, ago, prepared) {
            crate::sys::stderr_line(&format!("wisp: the forked VM could not start: {e}"));
            self.family.exit(wisp_abi::family::status::signaled(wisp_abi::family::signal::SIGSEGV));
            std::process::exit(125);
        }
    }

    fn become_child(
        &mut self,
        slot: &ForkSlot,
        mut st: VcpuState,
        ago: Duration,
        prepared: Option<Result<()>>,
    ) -> Result<()> {
        if !self.family.opts.orphans_die {
            crate::sys::outlive_parent(); // a spare was to die with its parent
        } else if crate::sys::die_with_parent() != slot.parent_pid {
            std::process::exit(137); // the parent is gone already
        }
        // The guest's clock keeps running across the fork.
        st.tsc += (ago.as_nanos() as u64).saturating_mul(self.shell.tsc_hz) / 1_000_000_000;
        match prepared {
            None => {
                self.shell.rebuild_after_fork(&st)?;
                self.devices.on_fork_child();
            }
            Some(made) => {
                made?;
                crate::state::restore_vcpu(&self.shell.vcpu, &st)?;
            }
        }
        for (s, gpa, host, size) in self.family.attachments() {
            if !map_slot(&self.shell.vm, s, gpa, host, size) {
                return Err(Error::Kvm("map shared memory", std::io::Error::last_os_error()));
            }
        }
        // Its libraries: this process's copies of the parent's (copy on
        // write since the fork), in the child's KVM VM.
        self.devices.map_libraries_in(&self.shell.vm)?;
        self.control = Arc::new(Control::new(self.family.bell_ref()));
        self.control.set_vcpu_thread(Some(ThreadId::current()));
        // A VM of its own: normal scheduling (a spare prepared as a batch
        // job), and no forks of its own yet.
        crate::sys::set_batch(false);
        (self.forks, self.spare_round) = (0, 0);
        self.boot = self.boot.min(Instant::now());
        self.forked = true;
        // Before the guest runs: only what this VM needs stays open.
        // (A child made from a spare keeps its RAM file: `recycle_begin`.)
        // (Nor the control block a recycled process's watchdog still holds:
        // it closes that descriptor when it is retargeted.)
        let mut keep: Vec<i32> = self.recycle.as_ref().map(super::spare::Recycle::file).into_iter().collect();
        keep.extend(self.kept_watchdog.as_ref().and_then(|w| w.target_fd()));
        self.close_inherited(&keep);
        Ok(())
    }
}
