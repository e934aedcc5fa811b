//! The hypercall table: an `out` on a hypercall port is decoded here and
//! served by its handler; the basic calls (console, exit, clock, idle,
//! device notify) live here too. Fork and family IPC are in `fork.rs` and
//! `ipc.rs`. A new hypercall: its number in `wisp_abi::Hypercall` (and a
//! feature bit if it is an addition), its argument block in `wisp_abi::args`,
//! a line in [`Vm::on_out`] and its handler.
//!
//! Every argument block and pointer is guest data: checked against guest
//! RAM before use, copied, then validated (a bad one stops the VM with a
//! [`StopReason::BadHypercall`]).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use wisp_abi::args::{self, CONSOLE_WRITE_MAX};
use wisp_abi::{Hypercall, FAULT_PORT};

use super::{Console, Vm};
use crate::access::UserMap;
use crate::fault::StopReason;
use crate::memory::RamView;

/// What serving one `out` gives the run loop: `Some(code)` if the guest
/// exited, or why it must stop.
pub(super) type Served = Result<Option<i32>, StopReason>;

impl Vm {
    /// Serve an `out`: a hypercall, or a fault report from the exception stubs.
    pub(super) fn on_out(&mut self, port: u16, data: &[u8], console: &mut dyn Console, deadline: Option<Instant>) -> Served {
        if port == FAULT_PORT {
            return Err(self.decode_fault(data.first().copied().unwrap_or(0xff)));
        }
        if let Some(index) = port.checked_sub(wisp_abi::DOORBELL_PORT_BASE).filter(|i| (*i as usize) < wisp_abi::bootinfo::MAX_DEVICES) {
            // A doorbell KVM did not serve itself.
            self.shell.stats.hypercalls += 1;
            if !self.devices.notify(index as u32) {
                return Err(StopReason::BadIo { port, detail: "a doorbell of no device" });
            }
            return Ok(None);
        }
        let Some(hc) = Hypercall::from_port(port) else {
            return Err(StopReason::UnknownHypercall { port });
        };
        if data.len() != 4 {
            return Err(StopReason::BadHypercall {
                call: hc.name(),
                detail: format!("issued with a {}-byte out; the ABI uses `out dx, eax`", data.len()),
            });
        }
        self.shell.stats.hypercalls += 1;
        let gpa = u32::from_le_bytes([data[0], data[1], data[2], data[3]]) as u64;
        // A feature the image did not declare is not there for it.
        let declared = self.features & hc.feature() == hc.feature();
        match hc {
            Hypercall::ConsoleWrite => self.console_write(gpa, console),
            Hypercall::Exit => self.exit(gpa),
            Hypercall::Clock => self.clock(gpa),
            Hypercall::Idle => self.idle(gpa, deadline),
            Hypercall::Notify => self.notify(gpa),
            Hypercall::Fork => self.fork_call(gpa, declared),
            Hypercall::Family => self.family_call(gpa, declared, deadline),
            Hypercall::Stdio => self.stdio(gpa, declared, console),
            Hypercall::Ready => self.ready(gpa, declared),
            Hypercall::Library => self.library_call(gpa),
        }
    }

    /// The guest runs no library code: switch the library updates waiting
    /// (`devices::library::update`).
    fn library_call(&mut self, gpa: u64) -> Served {
        let hc = Hypercall::Library;
        let mut a: args::Library = read_block(&self.shell.ram, &self.user, hc, gpa, true)?;
        a.ret = match (a.op, self.devices.window().cloned()) {
            (args::library_op::SWITCH, Some(w)) => w.switch(&mut self.devices) as i64,
            (args::library_op::SWITCH, None) => 0,
            _ => wisp_abi::errno::EINVAL,
        };
        write_block(&self.shell.ram, hc, gpa, &a)
    }

    fn console_write(&mut self, gpa: u64, console: &mut dyn Console) -> Served {
        let hc = Hypercall::ConsoleWrite;
        let ram: &RamView = &self.shell.ram;
        let mut a: args::ConsoleWrite = read_block(ram, &self.user, hc, gpa, true)?;
        if a.len > CONSOLE_WRITE_MAX {
            return Err(bad(hc, format!("length {} exceeds the {CONSOLE_WRITE_MAX}-byte limit", a.len)));
        }
        if !ram.contains(a.data, a.len) {
            return Err(bad(hc, format!("buffer {:#x}+{:#x} is outside guest RAM", a.data, a.len)));
        }
        if !self.user.readable(a.data, a.len) {
            return Err(bad(hc, format!("buffer {:#x}+{:#x} is not in memory the guest may read", a.data, a.len)));
        }
        let mut buf = vec![0u8; a.len as usize];
        ram.read(a.data, &mut buf).map_err(|e| bad(hc, e.to_string()))?;
        let _ = console.write_all(&buf);
        a.ret = a.len as i64;
        write_block(ram, hc, gpa, &a)
    }

    fn exit(&mut self, gpa: u64) -> Served {
        let a: args::Exit = read_block(&self.shell.ram, &self.user, Hypercall::Exit, gpa, false)?;
        // A reusable VM's run ends; the VM lives on (`reuse.rs`).
        self.run_ends(a.code);
        Ok(Some(a.code))
    }

    fn clock(&mut self, gpa: u64) -> Served {
        let ram: &RamView = &self.shell.ram;
        arg_block(ram, &self.user, Hypercall::Clock, gpa, size_of::<args::Clock>(), true)?;
        let a = args::Clock {
            monotonic_ns: self.boot.elapsed().as_nanos() as u64,
            wall_ns: SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0),
        };
        write_block(ram, Hypercall::Clock, gpa, &a)
    }

    fn notify(&mut self, gpa: u64) -> Served {
        let a: args::Notify = read_block(&self.shell.ram, &self.user, Hypercall::Notify, gpa, false)?;
        if !self.devices.notify(a.device) {
            return Err(bad(Hypercall::Notify, format!("no device number {}", a.device)));
        }
        Ok(None)
    }

    fn idle(&mut self, gpa: u64, deadline: Option<Instant>) -> Served {
        let ram: &RamView = &self.shell.ram;
        let mut a: args::Idle = read_block(ram, &self.user, Hypercall::Idle, gpa, true)?;
        let mut wait = Duration::from_nanos(a.timeout_ns);
        if let Some(d) = deadline {
            wait = wait.min(d.saturating_duration_since(Instant::now()));
        }
        a.events = self.park(wait);
        write_block(ram, Hypercall::Idle, gpa, &a)
    }

    /// Block the vCPU thread until `wait` passes or its bell rings. Uses no
    /// CPU meanwhile. Returns the pending event bits.
    fn park(&self, wait: Duration) -> u64 {
        if let Some(w) = self.devices.window() {
            w.reap_at_park();
        }
        // Before the events are looked at: a pass that brings frames posts
        // NET, and the park returns at once.
        self.devices.before_park();
        let bell = self.control.bell();
        let seq = bell.seq.load(Ordering::Acquire);
        let pending = self.control.take_events();
        if pending != 0 || !self.control.set_parked(true) {
            return pending;
        }
        // An event posted after the look above and before the park was
        // announced wrote no eventfd (`wake_idle` writes it only to a
        // parked thread), but it rang the bell: the sequence moved. (The
        // announcement and this read are both sequentially consistent, as
        // the poster's ring and its read of `parked` are: one of the two
        // sides sees the other.)
        let rung = bell.seq.load(Ordering::SeqCst) != seq;
        match self.control.idle_fd() {
            _ if rung => {}
            Some(idle) if !self.family.has_relatives() => self.park_on_fds(idle, wait),
            _ => {
                // Nothing here watches the devices' descriptors.
                self.devices.park_unwatched();
                if self.family.has_relatives() {
                    // Members of a family answer each other quickly: watch
                    // the bell briefly before sleeping, as blocking family
                    // calls do.
                    crate::sys::spin_on(&bell.seq, seq, wait);
                }
                // The sequence read before the events were checked: a ring
                // since then ends the wait at once. A signal raised on the
                // family's page before it learnt of the park wakes nobody:
                // looked for here.
                if !self.family.park_cell(true) {
                    crate::sys::futex_wait(&bell.seq, seq, Some(wait));
                }
                self.family.park_cell(false);
            }
        }
        self.control.set_parked(false);
        let signals = if self.family.signals_pending() { wisp_abi::events::FAMILY } else { 0 };
        self.control.take_events() | signals
    }

    /// The park of a VM without relatives (only this process rings its
    /// bell): wait on the bell's eventfd and on what the devices say will
    /// bring work — a NIC's tap. A frame then wakes this thread and the
    /// NIC's I/O thread together, and the guest is on its way back while
    /// the frame is still being put in its ring, instead of one thread
    /// waking the other in turn.
    fn park_on_fds(&self, idle: std::os::fd::BorrowedFd<'_>, wait: Duration) {
        use rustix::event::{poll, PollFd, PollFlags};
        let mut fds = vec![PollFd::new(&idle, PollFlags::IN)];
        let sources = self.devices.park_begins();
        fds.extend(sources.iter().map(|f| PollFd::new(f, PollFlags::IN)));
        let ts = rustix::time::Timespec { tv_sec: wait.as_secs().min(i64::MAX as u64) as i64, tv_nsec: wait.subsec_nanos() as i64 };
        // Events posted between the check above and here wrote the eventfd:
        // the poll returns at once.
        let start = Instant::now();
        let woken = poll(&mut fds, Some(&ts)).unwrap_or(0) > 0;
        // Before the bell is read: events the devices post here ring it,
        // and a ring left unread would end the next park at once.
        self.devices.park_ended(woken, start.elapsed());
        let mut b = [0u8; 8];
        let _ = rustix::io::read(idle, &mut b);
    }
}

/// Hypercall `hc`'s argument block (`size` bytes at `gpa`) must lie in
/// guest RAM the guest itself may read, and write if `out` (the call
/// writes results back into it).
pub(super) fn arg_block(ram: &RamView, user: &UserMap, hc: Hypercall, gpa: u64, size: usize, out: bool) -> Result<(), StopReason> {
    let size = size as u64;
    let detail = if !ram.contains(gpa, size) {
        "is outside guest RAM"
    } else if !user.readable(gpa, size) || (out && !user.writable(gpa, size)) {
        if out { "is not in memory the guest may write" } else { "is not in memory the guest may read" }
    } else {
        return Ok(());
    };
    Err(StopReason::BadHypercall { call: hc.name(), detail: format!("argument block at {gpa:#x} ({size} bytes) {detail}") })
}

/// Copy hypercall `hc`'s argument block out of guest RAM (checked as
/// [`arg_block`] says).
pub(super) fn read_block<T: zerocopy::FromBytes + zerocopy::IntoBytes>(
    ram: &RamView,
    user: &UserMap,
    hc: Hypercall,
    gpa: u64,
    out: bool,
) -> Result<T, StopReason> {
    arg_block(ram, user, hc, gpa, size_of::<T>(), out)?;
    ram.read_obj(gpa).map_err(|e| bad(hc, e.to_string()))
}

/// Write hypercall `hc`'s argument block back (results), into a block
/// [`read_block`] or [`arg_block`] checked with `out`.
pub(super) fn write_block<T: zerocopy::IntoBytes + zerocopy::Immutable>(ram: &RamView, hc: Hypercall, gpa: u64, v: &T) -> Served {
    ram.write_obj(gpa, v).map(|()| None).map_err(|e| bad(hc, e.to_string()))
}

/// A bad argument block: the VM stops.
pub(super) fn bad(hc: Hypercall, detail: String) -> StopReason {
    StopReason::BadHypercall { call: hc.name(), detail }
}
