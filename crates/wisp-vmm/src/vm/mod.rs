//! The *execute* phase: load an image into a prepared [`Shell`], then run
//! the vCPU and serve its hypercalls until the guest exits or is stopped.
//!
//! Rooms: this file (loading, the run loop, exits), `hypercall.rs` (the
//! hypercall table and the basic calls), `ipc.rs` (the family hypercall),
//! `fork.rs` (fork), `spare.rs` (forks prepared ahead of time),
//! `snapshot.rs` (snapshots taken and restored),
//! `stdio.rs` (stderr and stdin), `watchdog.rs` (the run's time limit).

mod fork;
mod hypercall;
mod ipc;
mod reuse;
mod snapshot;
mod spare;
mod stdio;
mod watchdog;

use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use kvm_ioctls::VcpuExit;
use wisp_abi::layout::{BOOT_INFO, MIN_HEAP, STACK_BOTTOM, STACK_TOP};
use wisp_abi::BootInfo;

use crate::access::UserMap;
use crate::arch;
use crate::control::{Control, Halt};
use crate::devices::{Device, Devices};
use crate::error::{Error, Result};
use crate::family::{Family, FamilyOptions};
use crate::fault::{Fault, Outcome, StopReason};
use crate::image::Image;
use crate::loader;
use crate::shell::Shell;
use crate::signal::{KickTimer, ThreadId};
use crate::state::{self, VmState};
use crate::stats::Stats;
use watchdog::Watchdog;

pub use crate::loader::FEATURES;
pub use stdio::{Console, StdinFeed};
pub use reuse::{Stop as ReuseStop, COPY_ALL_PAGES as REUSE_COPY_ALL_PAGES};
pub use snapshot::Restoring;

/// A VM with its image loaded, ready to run.
pub struct Vm {
    devices: Devices,
    shell: Shell,
    /// Features the image declared (and this monitor has): the hypercalls
    /// it may use.
    features: u64,
    /// The guest's own view of its RAM: every buffer it names is checked
    /// against it.
    user: UserMap,
    /// Host monotonic time the guest's clock counts from.
    boot: Instant,
    control: Arc<Control>,
    /// Declared after `shell`: shared-memory slots of the VM point into the
    /// family's arena, so the VM goes first.
    family: Family,
    /// Set in a forked child until the run loop has re-armed its watchdog.
    forked: bool,
    /// Called with the outcome before the family learns of the end.
    on_end: Option<fn(&Outcome)>,
    /// Scratch buffer for IPC data.
    buf: Vec<u8>,
    /// A monitor process ready to take this VM's next fork (`spare.rs`).
    spare: Option<spare::Spare>,
    /// A fork handed to a spare, to finish at the next exit.
    after_fork: Option<(spare::Spare, crate::family::ForkSlot, i32)>,
    /// Spares handed a fork whose children run: each is a spare again once
    /// its child's guest ends.
    lent: Vec<spare::Spare>,
    /// In a child made from a spare: what makes it a spare again.
    recycle: Option<spare::Recycle>,
    /// The control block's inherited-descriptor epoch the spares were made in.
    spares_epoch: u64,
    /// A recycled spare's watchdog, for its next child (same deadline).
    kept_watchdog: Option<Watchdog>,
    /// Forks so far, and their count when a spare was last made.
    forks: u32,
    spare_round: u32,
    /// Descriptors of the embedder's that a forked child keeps
    /// ([`Vm::keep_in_children`]).
    keep: Vec<i32>,
    /// The console's flush is due at the guest's first exit, which this
    /// timer brings within a bound ([`Vm::flush_at_first_exit`]).
    first_flush: Option<(KickTimer, std::time::Duration)>,
    /// Standard input, if the embedder gave one ([`Vm::attach_stdin`]).
    stdin: Option<stdio::Stdin>,
    /// Where a snapshot goes when the guest says it is ready: the VM is
    /// being made into a template ([`Vm::save_when_ready`]).
    on_ready: Option<crate::control::SaveSink>,
    /// A VM run again and again: its ready point (`reuse.rs`).
    reuse: Option<Box<reuse::Reuse>>,
}

/// What the run loop saw at one exit, copied out of the `kvm_run` page.
enum Exit {
    Out { port: u16, data: [u8; 4], len: usize },
    In { port: u16 },
    Mmio { addr: u64, write: bool },
    Shutdown,
    Hlt,
    Interrupted,
    Other(String),
}

impl Shell {
    /// Load `image` with arguments `args` (argument 0 is the image name).
    pub fn load(self, image: &Image, args: &[String]) -> Result<Vm> {
        self.load_devices(image, args, Vec::new())
    }

    /// [`Shell::load`] with devices: their regions take the top of RAM, in
    /// order, and they are described in the boot-info device table. The
    /// image's manifest is checked first: an image that needs a feature
    /// this monitor lacks, or a device it is not given, is refused.
    pub fn load_devices(mut self, image: &Image, args: &[String], devices: Vec<Box<dyn Device>>) -> Result<Vm> {
        let t = Instant::now();
        let mut devices = Devices::new(devices)?;
        let features = loader::check_features(image)?;
        devices.check_manifest(&image.manifest, image.lib_policy.as_ref())?;
        let ram_size = self.ram.size();
        let reserved = devices.ram_taken();
        if reserved + MIN_HEAP > ram_size {
            return Err(Error::BadMemory(format!(
                "memory too small: the devices' regions take {} KiB of the {} MiB of RAM (--mem)",
                reserved >> 10,
                ram_size >> 20
            )));
        }
        let mem = devices.place(ram_size);
        if image.end() > mem {
            return Err(Error::BadMemory(format!(
                "image does not fit: its segments end at {:#x} ({} KiB) but guest RAM is {} MiB (--mem)",
                image.end(),
                image.end() >> 10,
                mem >> 20
            )));
        }
        if image.end() + MIN_HEAP > mem {
            return Err(Error::BadMemory(format!(
                "memory too small: the image needs at least {} KiB of RAM (--mem){}, {} MiB given",
                (image.end() + MIN_HEAP + reserved) >> 10,
                if devices.is_empty() { "" } else { " with its device regions" },
                ram_size >> 20
            )));
        }
        // The image the shell holds already (same bytes), or a new one.
        let held = match self.preloaded.take() {
            Some(p) if Arc::ptr_eq(&p.image.bytes, &image.bytes) => Some((p.user, p.tsc_offset)),
            Some(_) => {
                self.clear_preloaded()?;
                None
            }
            None => None,
        };
        let preloaded = held.is_some();
        let tsc_offset = held.as_ref().and_then(|h| h.1);
        let user = match held {
            Some((user, _)) => user,
            None => {
                for s in &image.segments {
                    loader::load_segment(&self.ram, image, s)?;
                }
                arch::map_image(&self.ram, image)?
            }
        };
        self.stats.phase("image_load", t);

        let t = Instant::now();
        let mut info = BootInfo::new();
        info.mem_size = ram_size;
        info.image_start = image.start();
        info.image_end = image.end();
        info.heap_start = image.end();
        info.heap_end = mem;
        info.stack_bottom = STACK_BOTTOM;
        info.stack_top = STACK_TOP;
        info.tsc_hz = self.tsc_hz;
        let argv = std::iter::once(image.name.as_str()).chain(args.iter().map(String::as_str));
        info.set_args(argv).map_err(|n| if n == usize::MAX { Error::ArgNul } else { Error::ArgsTooLong(n) })?;
        devices.describe(&mut info);
        let boot = Instant::now();
        info.wall_clock_ns = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0);
        info.boot_tsc = match tsc_offset {
            Some(offset) => state::host_tsc().wrapping_add(offset),
            None => state::read_tsc(&self.vcpu)?,
        };
        self.ram.write_obj(BOOT_INFO, &info)?;
        // A preloaded image's entry registers were set with it.
        if !preloaded {
            self.vcpu
                .set_regs(&arch::initial_regs(image.entry))
                .map_err(|e| Error::Kvm("set registers", e.into()))?;
        }
        if self.warmed && !preloaded {
            // Reloading CR3 flushes the warm-up's translations (a preloaded
            // image's are the ones wanted).
            crate::shell::load_sregs(&self.vcpu)?;
        }
        self.stats.phase("boot_info", t);
        Vm::assemble(self, devices, features, user, boot)
    }
}

impl Vm {
    /// A VM of `shell` with its image (or snapshot) in RAM: its family (a
    /// new root; made ahead with a preloaded image) and control block, its
    /// devices started.
    fn assemble(mut shell: Shell, mut devices: Devices, features: u64, user: UserMap, boot: Instant) -> Result<Vm> {
        let (family, control) = match shell.family.take() {
            Some(fc) => fc,
            None => {
                let f = Family::new_root(FamilyOptions::default()).map_err(|e| Error::Host("family region", e))?;
                let control = Arc::new(Control::new(f.bell_ref()));
                (f, control)
            }
        };
        devices.activate(&shell.ram, &control, &shell.vm, &user)?;
        Ok(Vm { devices, shell, features, user, boot, control, family, forked: false,
            on_end: None,
            buf: Vec::new(),
            spare: None,
            after_fork: None,
            lent: Vec::new(),
            recycle: None,
            spares_epoch: 0,
            kept_watchdog: None,
            forks: 0,
            spare_round: 0,
            keep: Vec::new(),
            first_flush: None,
            stdin: None,
            on_ready: None,
            reuse: None,
        })
    }

    /// Run until the guest exits or is stopped. Console output goes to
    /// `console` (stdout and stderr). `timeout` bounds the whole run.
    /// A guest that forks goes on running in both processes: the parent's
    /// `run` continues, and in the child process `run` continues too (with
    /// the same console) and returns the child's outcome there.
    pub fn run(&mut self, console: &mut dyn Console, timeout: Option<std::time::Duration>) -> Outcome {
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            if let Some(o) = self.run_until_fork(console, deadline) {
                return o;
            }
        }
    }

    /// Like [`Vm::run`] (with an absolute deadline), but in a forked child
    /// process returns `None` right after the fork, before the child VM
    /// first runs: the caller can give the child an identity of its own
    /// (console, control channel) and then call this again to run it.
    pub fn run_until_fork(&mut self, console: &mut dyn Console, deadline: Option<Instant>) -> Option<Outcome> {
        self.control.set_vcpu_thread(Some(ThreadId::current()));
        let watchdog = match (deadline, self.kept_watchdog.take()) {
            (Some(d), Some(w)) if w.deadline() == d => {
                w.retarget(self.control.clone());
                Some(w)
            }
            (d, _) => d.map(|d| Watchdog::start(d, self.control.clone())),
        };
        let start = Instant::now();
        let mut first_exit = true;
        let mut first_flush = self.first_flush.take();
        if let Some((timer, within)) = &first_flush {
            timer.arm(*within);
        }
        let outcome = loop {
            self.control.checkpoint();
            if let Some((sink, incremental)) = self.control.take_save() {
                // A snapshot, then on (or back to the pause).
                self.serve_save(sink, incremental);
                continue;
            }
            match self.control.halted() {
                Halt::Kill => break Outcome::Stopped(StopReason::Killed),
                Halt::Timeout => break Outcome::Stopped(StopReason::Timeout),
                Halt::None => {}
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                break Outcome::Stopped(StopReason::Timeout);
            }
            let exit = self.enter();
            self.shell.stats.exits += 1;
            if first_exit {
                self.shell.stats.phase("guest_init", start);
                first_exit = false;
            }
            self.finish_fork();
            // A first exit that waits (the idle hypercall: a restored guest
            // that was asleep, a server waiting for its first client) is
            // flushed before the wait, not after it.
            if let (Exit::Out { port, .. }, true) = (&exit, first_flush.is_some()) {
                if wisp_abi::Hypercall::from_port(*port) == Some(wisp_abi::Hypercall::Idle) {
                    if let Some((timer, _)) = first_flush.take() {
                        timer.disarm();
                        let _ = console.flush();
                    }
                }
            }
            let r = if self.spare_wanted(&exit) && matches!(self.make_spare(), spare::Made::Child) {
                Ok(None) // the spare, now a fork's child: that exit was the parent's
            } else {
                match exit {
                    Exit::Out { port, data, len } => self.on_out(port, &data[..len], console, deadline),
                    Exit::In { port } => Err(StopReason::BadIo { port, detail: "the guest read a port" }),
                    Exit::Mmio { addr, write } => Err(StopReason::OutsideRam { addr, write }),
                    Exit::Shutdown => Err(StopReason::TripleFault),
                    Exit::Hlt => Err(StopReason::Kvm("the vCPU halted".into())),
                    Exit::Interrupted => Ok(None),
                    Exit::Other(s) => Err(StopReason::Kvm(s)),
                }
            };
            if self.forked {
                // Timers are not inherited: this one is the parent's.
                std::mem::forget(first_flush.take());
            } else if let Some((timer, _)) = first_flush.take() {
                timer.disarm();
                let _ = console.flush();
            }
            if self.forked {
                // A new process: the parent's watchdog thread is not here,
                // and standard input stays with the parent (forgotten, not
                // dropped: its lock may have been held by the parent's
                // feeder thread at the fork, a thread this process lacks).
                self.forked = false;
                std::mem::forget(self.stdin.take());
                if let Some(w) = watchdog {
                    w.forget_in_child();
                }
                self.control.set_vcpu_thread(None);
                return None;
            }
            match r {
                Ok(None) => {}
                Ok(Some(code)) => break Outcome::Exited(code),
                Err(reason) => break Outcome::Stopped(reason),
            }
        };
        let mut watchdog = watchdog;
        // A reusable VM at its ready point or at the end of a run: it lives
        // on (`reuse.rs`), and nobody is told of an end.
        if self.reuse_stop().is_some() {
            drop(watchdog);
            self.control.set_vcpu_thread(None);
            let _ = console.flush();
            return Some(outcome);
        }
        // No more forks: the spare goes (lent ones: their children run on).
        self.finish_fork();
        drop(self.spare.take());
        self.lent.clear();
        self.control.set_vcpu_thread(None);
        // What the runner says about the end comes first: once the family
        // knows, the parent may act (and end this process, in `wisp run`).
        if let Some(f) = self.on_end {
            f(&outcome);
        }
        // A child made from a spare may serve its parent's next fork (and
        // keeps its watchdog for that child).
        let recycled = self.recycle_begin(&outcome);
        if recycled.is_some() {
            self.kept_watchdog = watchdog.take();
        }
        drop(watchdog);
        use wisp_abi::family::{signal as sig, status};
        self.family.exit(match &outcome {
            Outcome::Exited(c) => status::exited(*c),
            Outcome::Stopped(StopReason::Killed | StopReason::Timeout) => status::signaled(sig::SIGKILL),
            Outcome::Stopped(_) => status::signaled(sig::SIGSEGV),
        });
        let run_us = start.elapsed().as_secs_f64() * 1e6 - self.shell.stats.get("guest_init").unwrap_or(0.0);
        self.shell.stats.add("guest_run", run_us);
        let _ = console.flush();
        if let Some(r) = recycled {
            // As after a fork: the caller runs the next child.
            self.recycle(r);
            self.forked = false;
            return None;
        }
        Some(outcome)
    }

    /// The library window, if the VM maps libraries: live updates from
    /// another thread (`devices::library::update`).
    pub fn library_window(&self) -> Option<Arc<crate::devices::library::update::Window>> {
        self.devices.window().cloned()
    }

    /// The control block: pause, resume, kill, events (usable from other threads).
    pub fn control(&self) -> Arc<Control> {
        self.control.clone()
    }

    /// How this VM's family behaves (whether it may fork, its size limit).
    pub fn set_family_options(&mut self, opts: FamilyOptions) {
        // A VM that can never fork lets go of `/dev/kvm` at once: nothing
        // in its process can make another VM.
        if !opts.fork || self.features & wisp_abi::features::FORK == 0 {
            self.shell.kvm = None;
        }
        self.family.set_options(opts);
    }

    /// Flush `console` at the guest's first exit of any kind, which comes
    /// `within` the first entry at the latest (a kick brings a guest that
    /// makes none back to the monitor). An embedder defers to that flush
    /// what the guest does not need to start (answers, hand-overs), so the
    /// path from a request to the guest's first instruction is only what
    /// the guest needs.
    pub fn flush_at_first_exit(&mut self, within: std::time::Duration) -> Result<()> {
        let timer = KickTimer::for_this_thread().map_err(|e| Error::Host("first-exit timer", e))?;
        self.first_flush = Some((timer, within));
        Ok(())
    }

    /// Whether [`Vm::flush_at_first_exit`] is set for the next run.
    pub fn flushes_at_first_exit(&self) -> bool {
        self.first_flush.is_some()
    }

    /// Have `f` called with the outcome when the VM ends, before its
    /// family (its parent) learns of it.
    pub fn on_end(&mut self, f: fn(&Outcome)) {
        self.on_end = Some(f);
    }

    /// Whether this VM may fork (it declared the feature, its family
    /// allows it, and its monitor still holds `/dev/kvm`).
    pub fn may_fork(&self) -> bool {
        self.shell.can_fork()
    }

    /// The host pid of the VM's monitor process (in the pid namespace that
    /// process is in).
    pub fn pid(&self) -> i32 {
        self.family.pid()
    }

    /// The host pid of the VM that forked this one (0 for a family's root),
    /// even if it has ended since.
    pub fn forked_from(&self) -> i32 {
        self.family.forked_from()
    }

    /// The VM's pid in its family, as its guest sees it (the root's is 1).
    pub fn family_pid(&self) -> i32 {
        self.family.fpid()
    }

    /// Timings so far.
    pub fn stats(&self) -> &Stats {
        &self.shell.stats
    }

    /// The VM's state beyond its memory, at an exit: the vCPU (with the
    /// exiting instruction completed) and the devices.
    pub(crate) fn save_state(&mut self) -> Result<VmState> {
        Ok(VmState { vcpu: state::save_vcpu(&mut self.shell.vcpu, self.shell.sync_regs)?, devices: self.devices.save_state() })
    }

    /// Enter the guest once and copy out what the exit needs.
    fn enter(&mut self) -> Exit {
        match self.shell.vcpu.run() {
            Ok(VcpuExit::IoOut(port, d)) => {
                let mut data = [0u8; 4];
                let len = d.len().min(4);
                data[..len].copy_from_slice(&d[..len]);
                Exit::Out { port, data, len: d.len() }
            }
            Ok(VcpuExit::IoIn(port, _)) => Exit::In { port },
            Ok(VcpuExit::MmioRead(addr, _)) => Exit::Mmio { addr, write: false },
            Ok(VcpuExit::MmioWrite(addr, _)) => Exit::Mmio { addr, write: true },
            Ok(VcpuExit::Shutdown) => Exit::Shutdown,
            Ok(VcpuExit::Hlt) => Exit::Hlt,
            Ok(VcpuExit::Intr) => Exit::Interrupted,
            Ok(VcpuExit::InternalError) => Exit::Other("internal error (emulation failed)".into()),
            Ok(VcpuExit::FailEntry(r, _)) => Exit::Other(format!("VM entry failed (reason {r:#x})")),
            Ok(other) => Exit::Other(format!("unexpected exit {other:?}")),
            Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => Exit::Interrupted,
            Err(e) => Exit::Other(format!("KVM_RUN failed: {e}")),
        }
    }

    fn decode_fault(&self, vector: u8) -> StopReason {
        let regs = self.shell.vcpu.get_regs();
        let sregs = self.shell.vcpu.get_sregs();
        match (regs, sregs) {
            (Ok(r), Ok(s)) => match Fault::decode(&self.shell.ram, vector, r.rsp, s.cr2) {
                Some(f) => StopReason::Exception(f),
                None => StopReason::Kvm(format!("exception {vector} with an unreadable frame")),
            },
            _ => StopReason::Kvm(format!("exception {vector}; registers unreadable")),
        }
    }
}
