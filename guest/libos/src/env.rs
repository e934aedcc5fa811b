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

/// The region of environment and files the monitor wrote, if any.
pub(crate) fn data() -> Option<wisp_abi::data::DataRegion<'static>> {
    let info = boot_info();
    let d = info.devices.iter().take(info.device_count as usize).find(|d| d.kind == wisp_abi::DeviceKind::Data as u32)?;
    let ram = info.mem_size;
    if d.base.checked_add(d.size).is_none_or(|end| end > ram) || d.size == 0 {
        return None;
    }
    // SAFETY: guest memory is identity-mapped and the monitor placed the
    // region inside RAM (checked above), above the heap, before the first
    // instruction; nothing frees it, and nothing in the library OS writes
    // it, so a shared view for the guest's whole life is sound.
    let bytes = unsafe { core::slice::from_raw_parts(d.base as *const u8, d.size as usize) };
    wisp_abi::data::DataRegion::parse(bytes)
}

/// The environment (`wisp run -e KEY=VALUE`, `--env-file`): every entry
/// as (key, value), in the order given. Entries that are not UTF-8 are
/// skipped.
pub fn vars() -> impl Iterator<Item = (&'static str, &'static str)> {
    data().into_iter().flat_map(|d| d.env()).filter_map(|(k, v)| Some((core::str::from_utf8(k).ok()?, core::str::from_utf8(v).ok()?)))
}

/// The value of environment variable `key` (the last one given, if it
/// was given twice).
///
/// ```ignore
/// let level = wisp::env::var("LOG_LEVEL").unwrap_or("info");
/// ```
pub fn var(key: &str) -> Option<&'static str> {
    vars().filter(|(k, _)| *k == key).last().map(|(_, v)| v)
}
