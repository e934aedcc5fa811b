//! The *prepare* phase: a VM shell is a KVM VM with its vCPU, guest RAM and
//! the image-independent machine state, ready to take an image.
//!
//! Everything here can happen before anyone asks for a VM (the toolstack's
//! pool of ready shells); [`Shell::load`] is the *execute* phase.

use std::time::Instant;

use kvm_bindings::{kvm_userspace_memory_region, CpuId};
use kvm_ioctls::{Kvm, VcpuFd, VmFd};
use wisp_abi::layout::{align_up, LARGE_PAGE_SIZE, MAX_MEM, MIN_MEM};

use crate::arch;
use crate::error::{Error, Result};
use crate::memory::GuestRam;
use crate::state::{self, VcpuState};
use crate::stats::Stats;

/// Default guest RAM.
pub const DEFAULT_MEM: u64 = 16 << 20;

/// Open `/dev/kvm`.
pub fn open_kvm() -> Result<Kvm> {
    Kvm::new().map_err(|e| Error::NoKvm(e.into()))
}

/// Whether KVM copies registers out at an exit when asked
/// (`KVM_CAP_SYNC_REGS`).
pub fn sync_regs_supported(kvm: &Kvm) -> bool {
    kvm.check_extension(kvm_ioctls::Cap::SyncRegs)
}

/// Check a requested RAM size and round it up to a whole 2 MiB page.
pub fn check_mem_size(bytes: u64) -> Result<u64> {
    if bytes < MIN_MEM {
        return Err(Error::BadMemory(format!(
            "memory too small: {} KiB asked, at least {} MiB needed",
            bytes >> 10,
            MIN_MEM >> 20
        )));
    }
    if bytes > MAX_MEM {
        return Err(Error::BadMemory(format!(
            "memory too large: {} MiB asked, at most {} MiB supported",
            bytes >> 20,
            MAX_MEM >> 20
        )));
    }
    Ok(align_up(bytes, LARGE_PAGE_SIZE))
}

/// A prepared VM: KVM VM, one vCPU, guest RAM registered, system pages and
/// special registers written.
pub struct Shell {
    pub(crate) vm: VmFd,
    pub(crate) vcpu: VcpuFd,
    pub(crate) ram: GuestRam,
    pub(crate) tsc_hz: u64,
    pub(crate) stats: Stats,
    pub(crate) warmed: bool,
    /// Our own handle on `/dev/kvm`, to make a forked child's VM.
    pub(crate) kvm: Option<Kvm>,
    /// KVM copies registers out at an exit when asked (`KVM_CAP_SYNC_REGS`;
    /// asked here, before any sandbox forbids the question).
    pub(crate) sync_regs: bool,
    /// The image loaded ahead of a request (`preload.rs`).
    pub(crate) preloaded: Option<Preloaded>,
    /// The VM's family region and control block, made ahead with a
    /// preloaded image (by the thread that will run the VM).
    pub(crate) family: Option<(crate::family::Family, std::sync::Arc<crate::control::Control>)>,
    /// KVM logs the pages the guest writes (since a snapshot: the next
    /// incremental one's).
    pub(crate) dirty_log: bool,
}

/// The image a shell holds loaded ahead (`preload.rs`), and the guest's
/// view of RAM with it.
pub(crate) struct Preloaded {
    pub image: crate::image::Image,
    pub user: crate::access::UserMap,
    /// The guest TSC's offset from the host's, if the host's TSC is stable
    /// (`state::tsc_offset`: the start then reads the guest's clock base
    /// without a call into KVM). Of this vCPU: a new one comes with a new
    /// preload.
    pub tsc_offset: Option<u64>,
}

/// A second handle on the same `/dev/kvm` open file.
fn dup_kvm(kvm: &Kvm) -> Option<Kvm> {
    use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd};
    let fd = rustix::io::fcntl_dupfd_cloexec(
        // SAFETY: the descriptor is owned by `kvm`, alive for this call.
        unsafe { std::os::fd::BorrowedFd::borrow_raw(kvm.as_raw_fd()) },
        0,
    )
    .ok()?;
    // SAFETY: `fd` is a fresh descriptor of /dev/kvm that we own; `Kvm`
    // takes ownership of it.
    Some(unsafe { Kvm::from_raw_fd(fd.into_raw_fd()) })
}

impl Shell {
    /// Create a shell with `mem_size` bytes of RAM (see [`check_mem_size`]).
    pub fn create(kvm: &Kvm, mem_size: u64) -> Result<Shell> {
        Shell::create_with(kvm, mem_size, sync_regs_supported(kvm), true)
    }

    /// [`Shell::create`] where KVM can no longer be asked what it supports
    /// (in a sandbox that refuses the question): `sync_regs` is
    /// [`sync_regs_supported`]'s answer, asked before. With `can_fork` the
    /// shell keeps a handle on `/dev/kvm` of its own, to make a forked
    /// child's VM; without, its VM cannot fork.
    pub fn create_with(kvm: &Kvm, mem_size: u64, sync_regs: bool, can_fork: bool) -> Result<Shell> {
        let mem_size = check_mem_size(mem_size)?;
        let mut stats = Stats::default();

        let t = Instant::now();
        let (vm, vcpu) = new_vm(kvm)?;
        let tsc_hz = vcpu.get_tsc_khz().map(|k| k as u64 * 1000).unwrap_or(0);
        stats.phase("kvm_create", t);

        let t = Instant::now();
        let ram = GuestRam::new(mem_size)?;
        register_ram(&vm, &ram)?;
        stats.phase("memory", t);

        let t = Instant::now();
        arch::write_system_pages(&ram)?;
        load_sregs(&vcpu)?;
        stats.phase("arch_setup", t);

        let kvm = if can_fork { dup_kvm(kvm) } else { None };
        Ok(Shell { vm, vcpu, ram, tsc_hz, stats, warmed: false, kvm, sync_regs, preloaded: None, family: None, dirty_log: false })
    }

    /// Enter the guest once, before any image is loaded, so the expensive
    /// first `KVM_RUN` (vCPU setup inside KVM, ~0.2 ms on PVM hosts) is paid
    /// in the prepare phase. The code run is a single `out` at CPL 3; the
    /// image load overwrites it and its page tables.
    pub fn warm_up(&mut self) -> Result<()> {
        let t = Instant::now();
        arch::map_warmup(&self.ram)?;
        self.vcpu
            .set_regs(&arch::initial_regs(wisp_abi::layout::IMAGE_BASE))
            .map_err(|e| Error::Kvm("set registers", e.into()))?;
        let r = self.run_to_warmup_port("warm-up run");
        self.stats.phase("warm_up", t);
        self.warmed = true;
        r
    }

    /// Whether this shell can make a forked child's VM (it holds its own
    /// handle on `/dev/kvm`).
    pub(crate) fn can_fork(&self) -> bool {
        self.kvm.is_some()
    }

    /// In a forked child: replace the parent's KVM VM (unusable from this
    /// process) by a new one over the same (now copy-on-write) guest RAM,
    /// with the parent's vCPU state.
    pub(crate) fn rebuild_after_fork(&mut self, st: &VcpuState) -> Result<()> {
        self.renew()?;
        state::restore_vcpu(&self.vcpu, st)
    }

    /// In a forked process: a KVM VM and vCPU of its own over this guest
    /// RAM, state still to be set (a spare takes it later).
    pub(crate) fn renew(&mut self) -> Result<()> {
        let kvm = self.kvm.as_ref().ok_or(Error::Fork("this monitor has no handle on /dev/kvm to make the child's VM"))?;
        let (vm, vcpu) = new_vm(kvm)?;
        register_ram(&vm, &self.ram)?;
        // The parent's descriptors close here; its VM lives on in the parent.
        self.vcpu = vcpu;
        self.vm = vm;
        self.dirty_log = false;
        self.stats = Stats::default();
        Ok(())
    }

    /// In a spare monitor process: a new KVM VM over this RAM, entered once
    /// (the expensive first `KVM_RUN`, as in [`Shell::warm_up`]). What that
    /// writes into guest RAM the caller maps away again.
    pub(crate) fn renew_warm(&mut self) -> Result<()> {
        self.renew()?;
        arch::write_system_pages(&self.ram)?;
        load_sregs(&self.vcpu)?;
        self.warm_up()
    }

    /// Run the vCPU until the monitor's own code (the warm-up or the
    /// prefault code, `arch.rs`) reports on [`arch::WARMUP_PORT`]; any
    /// other exit is an error of `what`.
    pub(crate) fn run_to_warmup_port(&mut self, what: &'static str) -> Result<()> {
        match self.vcpu.run() {
            Ok(kvm_ioctls::VcpuExit::IoOut(arch::WARMUP_PORT, _)) => Ok(()),
            Ok(other) => Err(Error::Kvm(what, std::io::Error::other(format!("unexpected exit {other:?}")))),
            Err(e) => Err(Error::Kvm(what, e.into())),
        }
    }

    /// Start KVM's log of the pages the guest writes (it stays on), or
    /// read and clear it: one bit a page.
    pub(crate) fn dirty_pages(&mut self) -> Result<Vec<u64>> {
        if !self.dirty_log {
            register_ram_logged(&self.vm, &self.ram, true)?;
            self.dirty_log = true;
        }
        self.vm.get_dirty_log(0, self.ram.size() as usize).map_err(|e| Error::Kvm("get the dirty log", e.into()))
    }

    /// Bytes of guest RAM.
    pub fn mem_size(&self) -> u64 {
        self.ram.size()
    }

    /// The KVM VM (kept for later device setup).
    pub fn vm_fd(&self) -> &VmFd {
        &self.vm
    }
}

/// Write this module's special registers (long mode at CPL 3, our tables)
/// into `vcpu`: loading CR3 again also drops KVM's translations of the
/// page tables written before.
pub(crate) fn load_sregs(vcpu: &VcpuFd) -> Result<()> {
    let mut sregs = vcpu.get_sregs().map_err(|e| Error::Kvm("get sregs", e.into()))?;
    arch::set_sregs(&mut sregs);
    vcpu.set_sregs(&sregs).map_err(|e| Error::Kvm("set sregs", e.into()))
}

/// A KVM VM with its vCPU and our CPUID.
fn new_vm(kvm: &Kvm) -> Result<(VmFd, VcpuFd)> {
    let vm = kvm.create_vm().map_err(|e| Error::Kvm("create VM", e.into()))?;
    let vcpu = vm.create_vcpu(0).map_err(|e| Error::Kvm("create vCPU", e.into()))?;
    let cpuid = CpuId::from_entries(&arch::cpuid_entries())
        .map_err(|e| Error::Host("CPUID table", std::io::Error::other(format!("{e:?}"))))?;
    vcpu.set_cpuid2(&cpuid).map_err(|e| Error::Kvm("set CPUID", e.into()))?;
    Ok((vm, vcpu))
}

/// Register guest RAM as memory slot 0 of `vm`.
fn register_ram(vm: &VmFd, ram: &GuestRam) -> Result<()> {
    register_ram_logged(vm, ram, false)
}

/// [`register_ram`], with KVM logging the pages the guest writes if `log`.
pub(crate) fn register_ram_logged(vm: &VmFd, ram: &GuestRam, log: bool) -> Result<()> {
    let region = kvm_userspace_memory_region {
        slot: 0,
        flags: if log { kvm_bindings::KVM_MEM_LOG_DIRTY_PAGES } else { 0 },
        guest_phys_addr: 0,
        memory_size: ram.size(),
        userspace_addr: ram.host_addr(),
    };
    // SAFETY: `region` describes exactly the live mapping owned by `ram`,
    // which the shell keeps alive (fields drop in declaration order: `vm`
    // and `vcpu` before `ram`), so KVM never sees a stale address.
    unsafe { vm.set_user_memory_region(region) }.map_err(|e| Error::Kvm("set memory region", e.into()))
}
