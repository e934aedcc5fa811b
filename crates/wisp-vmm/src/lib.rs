//! The wisp monitor ("VMM"): one unikernel VM on KVM.
//!
//! A VM is made in two phases, so the toolstack can pay the first one before
//! a request arrives:
//! - *prepare* — [`Shell::create`]: KVM VM and vCPU, CPUID, guest RAM in a
//!   memfd registered with KVM, GDT/TSS/IDT/page-table roots, special
//!   registers;
//! - *execute* — [`Shell::load`] then [`Vm::run`]: copy the image's segments
//!   in, map them, write the boot-info page, set registers, run the vCPU and
//!   serve hypercalls.
//!
//! Nothing a guest does can make the monitor panic: every exit is turned
//! into either a served hypercall or a [`StopReason`].

pub mod access;
pub mod arch;
pub mod control;
pub mod detach;
pub mod devices;
pub mod error;
pub mod family;
pub mod fault;
pub mod image;
pub mod library;
mod loader;
pub mod memory;
mod preload;
pub mod rate_limiter;
pub mod shell;
mod signal;
pub mod snapshot;
pub mod state;
pub mod stats;
mod sys;
pub mod tap;
pub mod vm;

pub use control::{Control, Saved};

/// Get this process ready for VMs before a sandbox closes: install the
/// process-wide kick handler (a sandbox may forbid `rt_sigaction`) and find
/// whether the host's TSC is stable (a sandbox hides `/sys`:
/// `state::stable_tsc`). Idempotent.
pub fn prepare_process() {
    signal::install_kick_handler();
    state::stable_tsc();
}
pub use error::{Error, Result};
pub use family::FamilyOptions;
pub use fault::{Outcome, StopReason};
pub use image::Image;
pub use devices::net::{mac_for_ipv4, NetConfig, NetRate, Nic};
pub use rate_limiter::Rate;
pub use devices::{block::BlockConfig, block::Disk, data::DataDevice, Device, DeviceState, Devices};
pub use kvm_ioctls::Kvm;
pub use shell::{check_mem_size, open_kvm, sync_regs_supported, Shell, DEFAULT_MEM};
pub use state::{VcpuState, VmState};
pub use signal::kick_signal;
pub use sys::{close_all_but, replace_fd, set_thread_hook, stderr_line, ThreadRole};
pub use vm::{Console, Restoring, ReuseStop, StdinFeed, Vm, FEATURES, REUSE_COPY_ALL_PAGES};
