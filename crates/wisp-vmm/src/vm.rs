//! The *execute* phase: load an image into a prepared [`Shell`], then run
//! the vCPU and serve its hypercalls until the guest exits or is stopped.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::control::{Control, Halt};
use crate::family::{CallResult, Family, FamilyOptions, Waiter};
use crate::shell::CpuState;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use kvm_bindings::{kvm_msr_entry, Msrs};
use kvm_ioctls::VcpuExit;
use wisp_abi::args::{self, CONSOLE_WRITE_MAX};
use wisp_abi::layout::{BOOT_INFO, MIN_HEAP, STACK_BOTTOM, STACK_TOP};
use wisp_abi::{BootInfo, Hypercall, FAULT_PORT};

use crate::arch;
use crate::error::{Error, Result};
use crate::fault::{Fault, Outcome, StopReason};
use crate::image::Image;
use crate::net::NetConfig;
use crate::shell::Shell;
use crate::signal::ThreadId;
use crate::stats::Stats;

pub(crate) const MSR_IA32_TSC: u32 = 0x10;

/// Most bytes one pipe read or write moves per hypercall.
const IPC_CHUNK: u64 = 1 << 20;

/// A VM with its image loaded, ready to run.
pub struct Vm {
    net: Option<crate::net::NetDevice>,
    shell: Shell,
    /// Host monotonic time the guest's clock counts from.
    boot: Instant,
    control: Arc<Control>,
    /// Declared after `shell`: shared-memory slots of the VM point into the
    /// family's arena, so the VM goes first.
    family: Family,
    /// A forked child whose NIC stayed with the parent.
    net_orphaned: bool,
    /// Set in a forked child until the run loop has re-armed its watchdog.
    forked: bool,
    /// Scratch buffer for IPC data.
    buf: Vec<u8>,
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
        self.load_with(image, args, None)
    }

    /// [`Shell::load`] with a NIC: its ring region takes the top of RAM and
    /// is described in the boot-info device table.
    pub fn load_with(mut self, image: &Image, args: &[String], net: Option<NetConfig>) -> Result<Vm> {
        let t = Instant::now();
        let ram_size = self.ram.size();
        let net_base = net.as_ref().map(|_| ram_size - wisp_abi::net::REGION_SIZE);
        let mem = net_base.unwrap_or(ram_size);
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
                (image.end() + MIN_HEAP + (ram_size - mem)) >> 10,
                if net.is_some() { " with its NIC rings" } else { "" },
                ram_size >> 20
            )));
        }
        for s in &image.segments {
            load_segment(&self.ram, image, s)?;
        }
        arch::map_image(&self.ram, image)?;
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
        if let (Some(cfg), Some(base)) = (&net, net_base) {
            use wisp_abi::net as n;
            info.devices[0] = wisp_abi::DeviceDesc {
                kind: wisp_abi::DeviceKind::Net as u32,
                flags: 0,
                base,
                size: n::REGION_SIZE,
                params: [
                    n::encode_mac(cfg.mac),
                    n::encode_ipv4(cfg.ip.0, cfg.ip.1),
                    cfg.gateway.map_or(0, |g| n::encode_ipv4(g, 0)),
                    n::SLOTS as u64,
                    n::SLOT_SIZE as u64,
                ],
            };
            info.device_count = 1;
        }
        let mut msrs = Msrs::from_entries(&[kvm_msr_entry { index: MSR_IA32_TSC, ..Default::default() }])
            .map_err(|e| Error::Host("MSR list", std::io::Error::other(format!("{e:?}"))))?;
        let boot = Instant::now();
        info.wall_clock_ns = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0);
        self.vcpu.get_msrs(&mut msrs).map_err(|e| Error::Kvm("read guest TSC", e.into()))?;
        info.boot_tsc = msrs.as_slice()[0].data;
        self.ram.write_obj(BOOT_INFO, &info)?;
        self.vcpu
            .set_regs(&arch::initial_regs(image.entry))
            .map_err(|e| Error::Kvm("set registers", e.into()))?;
        if self.warmed {
            // Reloading CR3 flushes the warm-up's translations.
            let mut sregs = self.vcpu.get_sregs().map_err(|e| Error::Kvm("get sregs", e.into()))?;
            arch::set_sregs(&mut sregs);
            self.vcpu.set_sregs(&sregs).map_err(|e| Error::Kvm("set sregs", e.into()))?;
        }
        self.stats.phase("boot_info", t);
        let family = Family::new_root(FamilyOptions::default()).map_err(|e| Error::Host("family region", e))?;
        let control = Arc::new(Control::new(family.bell_ref()));
        let net = match (net, net_base) {
            (Some(cfg), Some(base)) => Some(
                crate::net::NetDevice::start(self.ram.view(), base, cfg.tap, control.clone())
                    .map_err(|e| Error::Host("start the NIC's I/O thread", e))?,
            ),
            _ => None,
        };
        Ok(Vm { net, shell: self, boot, control, family, net_orphaned: false, forked: false, buf: Vec::new() })
    }
}

/// Put one segment's file bytes into guest RAM: whole pages copy-on-write
/// from the image's descriptor when it has one and the layout allows,
/// partial pages (and everything else) copied.
fn load_segment(ram: &crate::memory::GuestRam, image: &Image, s: &crate::image::Segment) -> Result<()> {
    use std::os::fd::AsFd;
    use wisp_abi::layout::{align_up, PAGE_SIZE};
    let data = image.file_bytes(s);
    let (start, end) = (s.vaddr, s.vaddr + s.filesz);
    let (first, last) = (align_up(start, PAGE_SIZE), end & !(PAGE_SIZE - 1));
    match &image.file {
        Some(fd) if s.vaddr % PAGE_SIZE == s.offset % PAGE_SIZE && last > first => {
            ram.write(start, &data[..(first - start) as usize])?;
            ram.map_file_cow(first, last - first, fd.as_fd(), s.offset + (first - start))?;
            ram.write(last, &data[(last - start) as usize..])
        }
        _ => ram.write(start, data),
    }
}

/// Ends a runaway guest: after the deadline it halts the VM and kicks the
/// vCPU thread until the run loop acknowledges.
struct Watchdog {
    done: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watchdog {
    fn start(deadline: Instant, control: Arc<Control>) -> Watchdog {
        let done = Arc::new(AtomicBool::new(false));
        let d = done.clone();
        let thread = std::thread::spawn(move || {
            while !d.load(Ordering::Acquire) {
                let now = Instant::now();
                if now < deadline {
                    std::thread::park_timeout(deadline - now);
                    continue;
                }
                // Repeat: a kick that lands just before KVM_RUN is entered is lost.
                control.halt(Halt::Timeout);
                control.interrupt();
                std::thread::park_timeout(Duration::from_millis(1));
            }
        });
        Watchdog { done, thread: Some(thread) }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.done.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}

impl Vm {
    /// Run until the guest exits or is stopped. Console output goes to
    /// `console`. `timeout` bounds the whole run.
    /// A guest that forks goes on running in both processes: the parent's
    /// `run` continues, and in the child process `run` continues too (with
    /// the same console) and returns the child's outcome there.
    pub fn run(&mut self, console: &mut dyn Write, timeout: Option<Duration>) -> Outcome {
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
    pub fn run_until_fork(&mut self, console: &mut dyn Write, deadline: Option<Instant>) -> Option<Outcome> {
        self.control.set_vcpu_thread(Some(ThreadId::current()));
        let watchdog = deadline.map(|d| Watchdog::start(d, self.control.clone()));
        let start = Instant::now();
        let mut first_exit = true;
        let outcome = loop {
            self.control.checkpoint();
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
            let r = match exit {
                Exit::Out { port, data, len } => self.on_out(port, &data[..len], console, deadline),
                Exit::In { port } => Err(StopReason::BadIo { port, detail: "the guest read a port" }),
                Exit::Mmio { addr, write } => Err(StopReason::OutsideRam { addr, write }),
                Exit::Shutdown => Err(StopReason::TripleFault),
                Exit::Hlt => Err(StopReason::Kvm("the vCPU halted".into())),
                Exit::Interrupted => Ok(None),
                Exit::Other(s) => Err(StopReason::Kvm(s)),
            };
            if self.forked {
                // A new process: the parent's watchdog thread is not here.
                self.forked = false;
                std::mem::forget(watchdog);
                self.control.set_vcpu_thread(None);
                return None;
            }
            match r {
                Ok(None) => {}
                Ok(Some(code)) => break Outcome::Exited(code),
                Err(reason) => break Outcome::Stopped(reason),
            }
        };
        drop(watchdog);
        self.control.set_vcpu_thread(None);
        use wisp_abi::family::{signal as sig, status};
        self.family.exit(match &outcome {
            Outcome::Exited(c) => status::exited(*c),
            Outcome::Stopped(StopReason::Killed | StopReason::Timeout) => status::signaled(sig::SIGKILL),
            Outcome::Stopped(_) => status::signaled(sig::SIGSEGV),
        });
        let run_us = start.elapsed().as_secs_f64() * 1e6 - self.shell.stats.get("guest_init").unwrap_or(0.0);
        self.shell.stats.add("guest_run", run_us);
        let _ = console.flush();
        Some(outcome)
    }

    /// The control block: pause, resume, kill, events (usable from other threads).
    pub fn control(&self) -> Arc<Control> {
        self.control.clone()
    }

    /// How this VM's family behaves (whether it may fork, its size limit).
    pub fn set_family_options(&mut self, opts: FamilyOptions) {
        self.family.set_options(opts);
    }

    /// The VM's pid in its family (its monitor process's pid).
    pub fn pid(&self) -> i32 {
        self.family.pid()
    }

    /// The pid of the VM that forked this one (0 for a family's root),
    /// even if it has ended since.
    pub fn forked_from(&self) -> i32 {
        self.family.forked_from()
    }

    /// Timings so far.
    pub fn stats(&self) -> &Stats {
        &self.shell.stats
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

    /// Serve an `out`: a hypercall, or a fault report from the exception stubs.
    fn on_out(
        &mut self,
        port: u16,
        data: &[u8],
        console: &mut dyn Write,
        deadline: Option<Instant>,
    ) -> std::result::Result<Option<i32>, StopReason> {
        if port == FAULT_PORT {
            return Err(self.decode_fault(data.first().copied().unwrap_or(0xff)));
        }
        let Some(hc) = Hypercall::from_port(port) else {
            return Err(StopReason::UnknownHypercall { port });
        };
        if data.len() != 4 {
            return Err(StopReason::BadHypercall {
                call: name(hc),
                detail: format!("issued with a {}-byte out; the ABI uses `out dx, eax`", data.len()),
            });
        }
        self.shell.stats.hypercalls += 1;
        let gpa = u32::from_le_bytes([data[0], data[1], data[2], data[3]]) as u64;
        if matches!(hc, Hypercall::Fork | Hypercall::Family) {
            return self.on_family(hc, gpa, deadline).map(|()| None);
        }
        let ram = &self.shell.ram;
        let bad = |detail: String| StopReason::BadHypercall { call: name(hc), detail };
        let block = |size: usize| arg_block(ram, hc, gpa, size);
        match hc {
            Hypercall::ConsoleWrite => {
                block(size_of::<args::ConsoleWrite>())?;
                let mut a: args::ConsoleWrite = ram.read_obj(gpa).map_err(|e| bad(e.to_string()))?;
                if a.len > CONSOLE_WRITE_MAX {
                    return Err(bad(format!("length {} exceeds the {CONSOLE_WRITE_MAX}-byte limit", a.len)));
                }
                if !ram.contains(a.data, a.len) {
                    return Err(bad(format!("buffer {:#x}+{:#x} is outside guest RAM", a.data, a.len)));
                }
                let mut buf = vec![0u8; a.len as usize];
                ram.read(a.data, &mut buf).map_err(|e| bad(e.to_string()))?;
                let _ = console.write_all(&buf);
                a.ret = a.len as i64;
                ram.write_obj(gpa, &a).map_err(|e| bad(e.to_string()))?;
                Ok(None)
            }
            Hypercall::Exit => {
                block(size_of::<args::Exit>())?;
                let a: args::Exit = ram.read_obj(gpa).map_err(|e| bad(e.to_string()))?;
                Ok(Some(a.code))
            }
            Hypercall::Clock => {
                block(size_of::<args::Clock>())?;
                let a = args::Clock {
                    monotonic_ns: self.boot.elapsed().as_nanos() as u64,
                    wall_ns: SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0),
                };
                ram.write_obj(gpa, &a).map_err(|e| bad(e.to_string()))?;
                Ok(None)
            }
            Hypercall::NetNotify => {
                block(size_of::<wisp_abi::net::NetNotify>())?;
                let a: wisp_abi::net::NetNotify = ram.read_obj(gpa).map_err(|e| bad(e.to_string()))?;
                match (&self.net, a.device) {
                    (Some(n), 0) => n.kick(),
                    (None, 0) if self.net_orphaned => {} // a forked child's inherited NIC: gone
                    _ => return Err(bad(format!("no NIC number {}", a.device))),
                }
                Ok(None)
            }
            Hypercall::Fork | Hypercall::Family => unreachable!("served by on_family"),
            Hypercall::Idle => {
                block(size_of::<args::Idle>())?;
                let mut a: args::Idle = ram.read_obj(gpa).map_err(|e| bad(e.to_string()))?;
                let mut wait = Duration::from_nanos(a.timeout_ns);
                if let Some(d) = deadline {
                    wait = wait.min(d.saturating_duration_since(Instant::now()));
                }
                a.events = self.park(wait);
                ram.write_obj(gpa, &a).map_err(|e| bad(e.to_string()))?;
                Ok(None)
            }
        }
    }

    /// Block the vCPU thread until `wait` passes or its bell rings. Uses no
    /// CPU meanwhile. Returns the pending event bits.
    fn park(&self, wait: Duration) -> u64 {
        let bell = self.control.bell();
        let seq = bell.seq.load(Ordering::Acquire);
        let pending = self.control.take_events();
        if pending != 0 || !self.control.set_parked(true) {
            return pending;
        }
        if self.family.has_relatives() {
            // Members of a family answer each other quickly: watch the bell
            // briefly before sleeping, as blocking family calls do.
            crate::family::spin_on(&bell.seq, seq, wait);
        }
        crate::family::futex_wait(&bell.seq, seq, Some(wait));
        self.control.set_parked(false);
        self.control.take_events()
    }

    /// The fork and family hypercalls.
    fn on_family(&mut self, hc: Hypercall, gpa: u64, deadline: Option<Instant>) -> std::result::Result<(), StopReason> {
        use wisp_abi::errno::*;
        use wisp_abi::family::{flags, op, Call};
        let ram = self.shell.ram.view();
        let bad = |detail: String| StopReason::BadHypercall { call: name(hc), detail };
        if hc == Hypercall::Fork {
            arg_block(&ram, hc, gpa, size_of::<args::Fork>())?;
            let ret = self.fork();
            // In the child this writes its own (copy-on-write) RAM.
            return ram.write_obj(gpa, &args::Fork { ret }).map_err(|e| bad(e.to_string()));
        }
        arg_block(&ram, hc, gpa, size_of::<Call>())?;
        let mut c: Call = ram.read_obj(gpa).map_err(|e| bad(e.to_string()))?;
        let [a0, a1, a2, a3] = c.a;
        let nowait = c.flags & flags::NOWAIT != 0;
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
            op::GETPID => fam.getpid(),
            op::PIPE => fam.pipe(),
            op::CLOSE => fam.close(a0),
            op::READ | op::MSGRCV => {
                let len = a2.min(IPC_CHUNK);
                if !ram.contains(a1, len) {
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
                } else if !ram.contains(a1, len) {
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
            _ => Err(ENOSYS),
        };
        (c.ret, c.ret2) = match r {
            Ok((a, b)) => (a, b),
            Err(e) => (e, 0),
        };
        c.signals = self.family.take_signals();
        ram.write_obj(gpa, &c).map_err(|e| bad(e.to_string()))
    }

    /// Fork this VM: the host process forks (guest RAM becomes copy-on-write
    /// between the two), the child makes a KVM VM of its own with the
    /// parent's vCPU state. Returns the child's pid, 0 in the child, or a
    /// negative errno.
    fn fork(&mut self) -> i64 {
        use wisp_abi::errno::*;
        if !self.family.opts.fork || self.shell.kvm.is_none() {
            return ENOSYS;
        }
        if self.family.ensure_arena().is_err() {
            return ENOMEM;
        }
        let slot = match self.family.fork_reserve() {
            Ok(s) => s,
            Err(e) => return e,
        };
        let st = match self.capture_cpu() {
            Ok(s) => s,
            Err(_) => {
                self.family.fork_abort(&slot);
                return EAGAIN;
            }
        };
        let t = Instant::now();
        // SAFETY: in the child only this (vCPU) thread exists. It builds new
        // objects (KVM VM, control block, watchdog) and leaves alone
        // everything the parent's other threads own (watchdog, NIC I/O
        // thread, toolstack threads): the NIC is abandoned, the old watchdog
        // forgotten.
        match unsafe { crate::family::fork() } {
            Err(_) => {
                self.family.fork_abort(&slot);
                EAGAIN
            }
            Ok(0) => match self.become_child(&slot, st, t) {
                Ok(()) => 0,
                Err(e) => {
                    eprintln!("wisp: the forked VM could not start: {e}");
                    self.family.exit(wisp_abi::family::status::signaled(wisp_abi::family::signal::SIGSEGV));
                    std::process::exit(125);
                }
            },
            Ok(pid) => {
                self.family.fork_parent_done(&slot, pid);
                self.family.watch_child(&slot, pid);
                pid as i64
            }
        }
    }

    /// The vCPU state at this exit, with the hypercall's `out` completed
    /// (one `KVM_RUN` with `immediate_exit` moves RIP past it).
    fn capture_cpu(&mut self) -> Result<CpuState> {
        let vcpu = &mut self.shell.vcpu;
        vcpu.set_kvm_immediate_exit(1);
        let r = vcpu.run().map(|_| ());
        vcpu.set_kvm_immediate_exit(0);
        match r {
            Err(e) if e.errno() == libc::EINTR => {}
            Err(e) => return Err(Error::Kvm("complete the fork hypercall", e.into())),
            Ok(()) => return Err(Error::Kvm("complete the fork hypercall", std::io::Error::other("guest entered"))),
        }
        let regs = vcpu.get_regs().map_err(|e| Error::Kvm("get registers", e.into()))?;
        let sregs = vcpu.get_sregs().map_err(|e| Error::Kvm("get sregs", e.into()))?;
        let fpu = vcpu.get_fpu().map_err(|e| Error::Kvm("get FPU", e.into()))?;
        let mut msrs = Msrs::from_entries(&[kvm_msr_entry { index: MSR_IA32_TSC, ..Default::default() }])
            .map_err(|e| Error::Host("MSR list", std::io::Error::other(format!("{e:?}"))))?;
        vcpu.get_msrs(&mut msrs).map_err(|e| Error::Kvm("read guest TSC", e.into()))?;
        let tsc = msrs.as_slice()[0].data;
        Ok(CpuState { regs, sregs, fpu, tsc })
    }

    /// In the forked child process: become the child VM.
    fn become_child(&mut self, slot: &crate::family::ForkSlot, mut st: CpuState, t: Instant) -> Result<()> {
        // From here on this process is the child: a failure below ends the
        // child's membership, never the parent's.
        self.family.become_child(slot);
        if self.family.opts.orphans_die && crate::family::die_with_parent() != slot.parent_pid {
            std::process::exit(137); // the parent is gone already
        }
        // The guest's clock keeps running across the fork.
        st.tsc += (t.elapsed().as_nanos() as u64).saturating_mul(self.shell.tsc_hz) / 1_000_000_000;
        self.shell.rebuild_after_fork(&st)?;
        for (s, gpa, host, size) in self.family.attachments() {
            if !map_slot(&self.shell.vm, s, gpa, host, size) {
                return Err(Error::Kvm("map shared memory", std::io::Error::last_os_error()));
            }
        }
        if let Some(n) = self.net.take() {
            n.abandon_after_fork();
            self.net_orphaned = true;
        }
        self.control = Arc::new(Control::new(self.family.bell_ref()));
        self.control.set_vcpu_thread(Some(ThreadId::current()));
        self.boot = self.boot.min(Instant::now());
        self.forked = true;
        Ok(())
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

/// Hypercall `hc`'s argument block (`size` bytes at `gpa`) must lie in
/// guest RAM.
fn arg_block(ram: &crate::memory::RamView, hc: Hypercall, gpa: u64, size: usize) -> std::result::Result<(), StopReason> {
    if ram.contains(gpa, size as u64) {
        Ok(())
    } else {
        let detail = format!("argument block at {gpa:#x} ({size} bytes) is outside guest RAM");
        Err(StopReason::BadHypercall { call: name(hc), detail })
    }
}

fn name(hc: Hypercall) -> &'static str {
    match hc {
        Hypercall::ConsoleWrite => "console_write",
        Hypercall::Exit => "exit",
        Hypercall::Clock => "clock",
        Hypercall::Idle => "idle",
        Hypercall::NetNotify => "net_notify",
        Hypercall::Fork => "fork",
        Hypercall::Family => "family",
    }
}

/// Add (size > 0) or remove (size 0) KVM memory slot `slot` for a family
/// shared-memory segment. Returns false if KVM refused.
fn map_slot(vm: &kvm_ioctls::VmFd, slot: u32, gpa: u64, host: u64, size: u64) -> bool {
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
