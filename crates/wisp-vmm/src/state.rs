//! One path for the state of a VM: its vCPU ([`VcpuState`]: registers,
//! special registers, FPU/SSE, TSC) and its devices ([`DeviceState`]),
//! saved with [`save_vcpu`] and put back with [`restore_vcpu`]. Fork uses it
//! now (the child's new KVM VM takes the parent's state); snapshots and
//! migration use the same path (after Firecracker's `arch/x86_64/vcpu.rs`
//! and `persist.rs`).
//!
//! The vCPU is only ever saved at an exit to the monitor, after the exiting
//! instruction (a hypercall's `out`) has been completed
//! ([`complete_exit`]), so a restored vCPU resumes right after it.

use kvm_bindings::{kvm_fpu, kvm_msr_entry, kvm_regs, kvm_sregs, Msrs};
use kvm_ioctls::VcpuFd;

use crate::devices::DeviceState;
use crate::error::{Error, Result};

/// The time-stamp counter MSR.
const MSR_IA32_TSC: u32 = 0x10;

/// What a vCPU is, at an exit.
#[derive(Clone, Debug)]
pub struct VcpuState {
    /// General-purpose registers, RIP, RFLAGS.
    pub regs: kvm_regs,
    /// Segments, descriptor tables, control registers, EFER.
    pub sregs: kvm_sregs,
    /// x87/SSE state.
    pub fpu: kvm_fpu,
    /// The guest's time-stamp counter.
    pub tsc: u64,
}

/// What a VM is beyond its memory: its vCPU and its devices.
#[derive(Clone, Debug)]
pub struct VmState {
    /// The vCPU.
    pub vcpu: VcpuState,
    /// The devices, in boot-info table order.
    pub devices: Vec<DeviceState>,
}

/// Read the guest's TSC.
pub fn read_tsc(vcpu: &VcpuFd) -> Result<u64> {
    let mut msrs = tsc_msrs(0)?;
    vcpu.get_msrs(&mut msrs).map_err(|e| Error::Kvm("read guest TSC", e.into()))?;
    Ok(msrs.as_slice()[0].data)
}

/// The host's time-stamp counter.
pub fn host_tsc() -> u64 {
    // SAFETY: `rdtsc` reads a counter into registers: no memory effects,
    // and user mode may use it (Linux leaves CR4.TSD clear).
    unsafe { core::arch::x86_64::_rdtsc() }
}

/// Whether the host's TSC is stable: the kernel's clock source is the TSC
/// (it is not if the kernel found the TSC unreliable). Only then does KVM
/// keep a guest's TSC offset fixed for the guest's life, and
/// [`tsc_offset`] stays true. Read once (`prepare_process` reads it
/// before any sandbox hides `/sys`; unreadable counts as unstable).
pub fn stable_tsc() -> bool {
    static STABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *STABLE.get_or_init(|| {
        std::fs::read_to_string("/sys/devices/system/clocksource/clocksource0/current_clocksource")
            .is_ok_and(|s| s.trim() == "tsc")
    })
}

/// The guest TSC's offset from the host's: guest TSC = host TSC + this
/// (wrapping). Read between two host readings.
pub fn tsc_offset(vcpu: &VcpuFd) -> Result<u64> {
    let before = host_tsc();
    let guest = read_tsc(vcpu)?;
    let after = host_tsc();
    Ok(guest.wrapping_sub(before.wrapping_add(after.wrapping_sub(before) / 2)))
}

/// Set the guest's TSC.
pub fn write_tsc(vcpu: &VcpuFd, tsc: u64) -> Result<()> {
    vcpu.set_msrs(&tsc_msrs(tsc)?).map_err(|e| Error::Kvm("set TSC", e.into()))?;
    Ok(())
}

fn tsc_msrs(data: u64) -> Result<Msrs> {
    Msrs::from_entries(&[kvm_msr_entry { index: MSR_IA32_TSC, data, ..Default::default() }])
        .map_err(|e| Error::Host("MSR list", std::io::Error::other(format!("{e:?}"))))
}

/// Finish the instruction the vCPU exited on (one `KVM_RUN` with
/// `immediate_exit` completes a pending `out` and moves RIP past it
/// without entering the guest).
pub fn complete_exit(vcpu: &mut VcpuFd) -> Result<()> {
    vcpu.set_kvm_immediate_exit(1);
    let r = vcpu.run().map(|_| ());
    vcpu.set_kvm_immediate_exit(0);
    match r {
        Err(e) if e.errno() == libc::EINTR => Ok(()),
        Err(e) => Err(Error::Kvm("complete the exit", e.into())),
        Ok(()) => Err(Error::Kvm("complete the exit", std::io::Error::other("guest entered"))),
    }
}

/// Save the vCPU at an exit (completing the exiting instruction first).
/// `sync`: KVM can copy the registers out with that completion
/// (`KVM_CAP_SYNC_REGS`): two ioctls are saved (~5 µs each on PVM hosts).
pub fn save_vcpu(vcpu: &mut VcpuFd, sync: bool) -> Result<VcpuState> {
    use kvm_ioctls::SyncReg;
    if sync {
        vcpu.set_sync_valid_reg(SyncReg::Register);
        vcpu.set_sync_valid_reg(SyncReg::SystemRegister);
    }
    let done = complete_exit(vcpu);
    let synced = sync.then(|| {
        vcpu.clear_sync_valid_reg(SyncReg::Register);
        vcpu.clear_sync_valid_reg(SyncReg::SystemRegister);
        let s = vcpu.sync_regs();
        (s.regs, s.sregs)
    });
    done?;
    let (regs, sregs) = match synced {
        Some(rs) => rs,
        None => (
            vcpu.get_regs().map_err(|e| Error::Kvm("get registers", e.into()))?,
            vcpu.get_sregs().map_err(|e| Error::Kvm("get sregs", e.into()))?,
        ),
    };
    Ok(VcpuState { regs, sregs, fpu: vcpu.get_fpu().map_err(|e| Error::Kvm("get FPU", e.into()))?, tsc: read_tsc(vcpu)? })
}

/// Give a vCPU saved state.
pub fn restore_vcpu(vcpu: &VcpuFd, st: &VcpuState) -> Result<()> {
    vcpu.set_sregs(&st.sregs).map_err(|e| Error::Kvm("set sregs", e.into()))?;
    vcpu.set_regs(&st.regs).map_err(|e| Error::Kvm("set registers", e.into()))?;
    vcpu.set_fpu(&st.fpu).map_err(|e| Error::Kvm("set FPU", e.into()))?;
    write_tsc(vcpu, st.tsc)
}
