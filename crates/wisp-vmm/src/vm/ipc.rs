//! The family hypercall: IPC between the VMs of a family (pipes, signals,
//! wait, message queues, shared memory). The family region does the work
//! (`crate::family`); this file copies operands between guest RAM and it,
//! bounded and checked, and maps shared-memory segments into the VM.

use std::time::Instant;

use wisp_abi::family::{flags, op, Call};
use wisp_abi::Hypercall;

use super::hypercall::{read_block, write_block, Served};
use super::Vm;
use crate::control::Halt;
use crate::family::{CallResult, Waiter};

/// Most bytes one pipe read or write moves per hypercall.
const IPC_CHUNK: u64 = 1 << 20;

impl Vm {
    /// The family hypercall (`declared`: the image declared the feature).
    pub(super) fn family_call(&mut self, gpa: u64, declared: bool, deadline: Option<Instant>) -> Served {
        use wisp_abi::errno::*;
        let hc = Hypercall::Family;
        let ram = self.shell.ram.view();
        let mut c: Call = read_block(&ram, &self.user, hc, gpa, true)?;
        let user = &self.user;
        let [a0, a1, a2, a3] = c.a;
        let nowait = c.flags & flags::NOWAIT != 0;
        if !nowait {
            // A call that may block watches no device descriptor (a NIC
            // whose I/O thread left its tap to idle parks: awake again).
            self.devices.park_unwatched();
        }
        let control = self.control.clone();
        let interrupted = || {
            control.halted() != Halt::None
                || control.peek_events() & wisp_abi::events::STOP != 0
                || deadline.is_some_and(|d| Instant::now() >= d)
        };
        let hold = || control.checkpoint();
        let w = Waiter { interrupted: &interrupted, hold: &hold };
        let fam = &mut self.family;
        let buf = &mut self.buf;
        let vm = &self.shell.vm;
        let r: CallResult = match c.op {
            _ if !declared => Err(ENOSYS),
            op::GETPID => fam.getpid(),
            op::PIPE => fam.pipe(),
            op::CLOSE => fam.close(a0),
            op::READ | op::MSGRCV => {
                let len = a2.min(IPC_CHUNK);
                // Into memory the guest may write, never the monitor's pages.
                if !ram.contains(a1, len) || !user.writable(a1, len) {
                    Err(EFAULT)
                } else {
                    let r = if c.op == op::READ {
                        fam.read(a0, len as usize, nowait, &w, buf)
                    } else {
                        fam.msgrcv(a0, len as usize, a3 as i64, c.flags, &w, buf)
                    };
                    match r {
                        Ok(v) => ram.write(a1, buf).map(|()| v).map_err(|_| EFAULT),
                        e => e,
                    }
                }
            }
            op::WRITE | op::MSGSND => {
                let len = a2.min(IPC_CHUNK);
                if c.op == op::MSGSND && a2 > wisp_abi::family::limits::MSG_MAX as u64 {
                    Err(EINVAL)
                } else if !ram.contains(a1, len) || !user.readable(a1, len) {
                    Err(EFAULT)
                } else {
                    buf.resize(len as usize, 0);
                    match ram.read(a1, buf) {
                        Err(_) => Err(EFAULT),
                        Ok(()) if c.op == op::WRITE => fam.write(a0, buf, nowait, &w),
                        Ok(()) => fam.msgsnd(a0, buf, a3 as i64, nowait, &w),
                    }
                }
            }
            op::KILL => fam.kill(a0 as i64, a1, crate::signal::kick_signal()),
            op::WAIT => fam.wait(a0 as i64, nowait, &w),
            op::MSGGET => fam.msgget(a0 as i64, a1),
            op::MSGRMID => fam.msgrmid(a0),
            op::SHMGET => fam.shmget(a0 as i64, a2, a1),
            op::SHMAT => fam.shmat(a0, &mut |slot, gpa, host, size| map_slot(vm, slot, gpa, host, size)),
            op::SHMDT => fam.shmdt(a0, &mut |slot, gpa| {
                map_slot(vm, slot, gpa, 0, 0);
            }),
            op::SHMRMID => fam.shmrmid(a0),
            op::SIGNALS => Ok((0, 0)),
            op::PAUSE => fam.pause(&w),
            op::RINGS => fam.rings_info(&mut |slot, gpa, host, size| map_slot(vm, slot, gpa, host, size)),
            op::WAKE => fam.wake(a0, a1),
            op::FDRING => fam.fd_ring(a0),
            _ => Err(ENOSYS),
        };
        (c.ret, c.ret2) = match r {
            Ok((a, b)) => (a, b),
            Err(e) => (e, 0),
        };
        c.signals = self.family.take_signals();
        write_block(&ram, hc, gpa, &c)
    }
}

/// Add (size > 0) or remove (size 0) KVM memory slot `slot` for a family
/// shared-memory segment. Returns false if KVM refused.
pub(super) fn map_slot(vm: &kvm_ioctls::VmFd, slot: u32, gpa: u64, host: u64, size: u64) -> bool {
    let region = kvm_bindings::kvm_userspace_memory_region {
        slot,
        flags: 0,
        guest_phys_addr: gpa,
        memory_size: size,
        userspace_addr: host,
    };
    // SAFETY: `host..host + size` lies in the family's shared-memory arena
    // (checked by `Family::shmat`), which the `Vm` keeps mapped for longer
    // than its KVM VM (field order); size 0 only deletes the slot.
    unsafe { vm.set_user_memory_region(region) }.is_ok()
}
