//! Each thread of a jailed VMM process narrows its seccomp filter to its
//! role (`wisp_jail::seccomp`) as it starts: the control threads here, the
//! monitor's own threads through [`narrow_thread`] (`wisp_vmm`'s thread
//! hook), the vCPU thread (the main thread) before its shell is ready. A
//! leaf.

use wisp_jail::seccomp::Role;

use crate::exit::ERROR;

/// Narrow the calling thread's seccomp filter to `role`. A thread that
/// cannot is not left running wider than it should: the process ends.
pub(crate) fn narrow(role: Role) {
    if let Err(e) = wisp_jail::seccomp::narrow(role) {
        wisp_vmm::stderr_line(&format!("wisp-vmm: {e}"));
        std::process::exit(ERROR.into());
    }
}

/// Narrow the calling thread, at role `from`, to `to` (the small deny
/// list `wisp_jail::seccomp::narrow_from` prepared). As [`narrow`].
pub(crate) fn narrow_from(from: Role, to: Role) {
    if let Err(e) = wisp_jail::seccomp::narrow_from(from, to) {
        wisp_vmm::stderr_line(&format!("wisp-vmm: {e}"));
        std::process::exit(ERROR.into());
    }
}

/// The hook of the monitor's own threads (see [`wisp_vmm::set_thread_hook`]).
pub(crate) fn narrow_thread(role: wisp_vmm::ThreadRole) {
    narrow(match role {
        wisp_vmm::ThreadRole::Io => Role::Io,
        wisp_vmm::ThreadRole::Reaper => Role::Reaper,
        wisp_vmm::ThreadRole::Watchdog => Role::Watchdog,
    });
}

