//! Fork: the monitor process forks (guest RAM is a private mapping, so the
//! child holds a copy-on-write copy of it) and the child makes a KVM VM of
//! its own over the same RAM with the parent's state (`crate::state`).

use std::sync::Arc;
use std::time::Instant;

use wisp_abi::{args, Hypercall};

use super::hypercall::{arg_block, write_block, Served};
use super::ipc::map_slot;
use super::Vm;
use crate::control::Control;
use crate::error::{Error, Result};
use crate::signal::ThreadId;
use crate::state::VmState;

impl Vm {
    /// The fork hypercall (`declared`: the image declared the feature).
    pub(super) fn fork_call(&mut self, gpa: u64, declared: bool) -> Served {
        let ram = self.shell.ram.view();
        arg_block(&ram, &self.user, Hypercall::Fork, gpa, size_of::<args::Fork>(), true)?;
        let ret = if declared { self.fork() } else { wisp_abi::errno::ENOSYS };
        // In the child this writes its own (copy-on-write) RAM.
        write_block(&ram, Hypercall::Fork, gpa, &args::Fork { ret })
    }

    /// Fork this VM. Returns the child's family pid, 0 in the child, or a
    /// negative errno.
    fn fork(&mut self) -> i64 {
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
            Ok(0) => match self.become_child(&slot, st, t) {
                Ok(()) => 0,
                Err(e) => {
                    crate::sys::stderr_line(&format!("wisp: the forked VM could not start: {e}"));
                    self.family.exit(wisp_abi::family::status::signaled(wisp_abi::family::signal::SIGSEGV));
                    std::process::exit(125);
                }
            },
            Ok(pid) => {
                self.family.fork_parent_done(&slot, pid);
                self.family.watch_child(&slot, pid);
                slot.fpid as i64
            }
        }
    }

    /// In the forked child process: become the child VM.
    fn become_child(&mut self, slot: &crate::family::ForkSlot, mut st: VmState, t: Instant) -> Result<()> {
        // From here on this process is the child: a failure below ends the
        // child's membership, never the parent's.
        self.family.become_child(slot);
        if self.family.opts.orphans_die && crate::sys::die_with_parent() != slot.parent_pid {
            std::process::exit(137); // the parent is gone already
        }
        // The guest's clock keeps running across the fork.
        st.vcpu.tsc += (t.elapsed().as_nanos() as u64).saturating_mul(self.shell.tsc_hz) / 1_000_000_000;
        self.shell.rebuild_after_fork(&st.vcpu)?;
        for (s, gpa, host, size) in self.family.attachments() {
            if !map_slot(&self.shell.vm, s, gpa, host, size) {
                return Err(Error::Kvm("map shared memory", std::io::Error::last_os_error()));
            }
        }
        self.devices.on_fork_child();
        self.control = Arc::new(Control::new(self.family.bell_ref()));
        self.control.set_vcpu_thread(Some(ThreadId::current()));
        self.boot = self.boot.min(Instant::now());
        self.forked = true;
        Ok(())
    }
}
