//! The machine as the boot-info page describes it, and the arguments.

use core::sync::atomic::{AtomicPtr, Ordering};

use wisp_abi::BootInfo;

static INFO: AtomicPtr<BootInfo> = AtomicPtr::new(core::ptr::null_mut());

pub(crate) fn init(info: &'static BootInfo) {
    INFO.store(info as *const BootInfo as *mut BootInfo, Ordering::Relaxed);
}

/// The boot-info page.
pub fn boot_info() -> &'static BootInfo {
    let p = INFO.load(Ordering::Relaxed);
    // SAFETY: set once in `start` from the monitor's read-only page, which
    // stays mapped for the guest's whole life, before any app code runs.
    unsafe { &*p }
}

/// The arguments; argument 0 is the image name. Arguments that are not
/// UTF-8 are skipped.
pub fn args() -> impl Iterator<Item = &'static str> {
    boot_info().args().filter_map(|a| core::str::from_utf8(a).ok())
}

/// Argument `n`, if present.
pub fn arg(n: usize) -> Option<&'static str> {
    args().nth(n)
}

/// Bytes of guest RAM.
pub fn mem_size() -> u64 {
    boot_info().mem_size
}
