//! The sandbox of a VMM process, after Firecracker's jailer: once its shell
//! is prepared and its control socket bound, the process
//! - moves into its own network, IPC and UTS namespaces (it has no network:
//!   NICs come later as descriptors from the daemon),
//! - takes resource limits (descriptors, threads, file size, no core dumps),
//! - drops to a user and group of its own (unique per VM, so it cannot
//!   signal, trace or read other VMs' processes and files) with no
//!   capabilities and `no_new_privs`,
//! - and installs a seccomp allow-list ([`seccomp`]): every system call not
//!   on it fails with EPERM. `open`/`openat` are not on it: the files the
//!   process writes (`exit.json`, `console.log`) are opened before
//!   ([`JailFiles`]), and renamed into place relative to a directory
//!   descriptor.

mod files;
pub mod seccomp;

pub use files::JailFiles;

use rustix::process::{setrlimit, Resource, Rlimit};

/// Close the jail around the calling process: user and group id `uid`, an
/// address space of guest RAM (`mem` bytes) plus 2 GiB. Call while it is
/// still single-threaded: the filter and credentials then hold for every
/// thread it creates afterwards.
pub fn enter(uid: u32, mem: u64) -> Result<(), String> {
    let prog = seccomp::filter()?;
    // SAFETY: `unshare` of these namespaces affects only this (single-threaded)
    // process; no memory is involved.
    let r = unsafe { libc::unshare(libc::CLONE_NEWNET | libc::CLONE_NEWIPC | libc::CLONE_NEWUTS) };
    if r != 0 {
        return Err(format!("unshare: {}", std::io::Error::last_os_error()));
    }
    let lim = |res, n: u64| {
        setrlimit(res, Rlimit { current: Some(n), maximum: Some(n) }).map_err(|e| format!("setrlimit {res:?}: {e}"))
    };
    lim(Resource::Nofile, 256)?;
    lim(Resource::Nproc, 256)?;
    lim(Resource::Core, 0)?;
    lim(Resource::Fsize, 1 << 20)?;
    lim(Resource::Memlock, 0)?;
    lim(Resource::As, mem + (2 << 30))?;
    // SAFETY: plain credential system calls on this single-threaded process;
    // after them the process has no capabilities (all uids non-zero).
    unsafe {
        if libc::setgroups(0, std::ptr::null()) != 0
            || libc::setresgid(uid, uid, uid) != 0
            || libc::setresuid(uid, uid, uid) != 0
        {
            return Err(format!("drop privileges: {}", std::io::Error::last_os_error()));
        }
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
            return Err(format!("no_new_privs: {}", std::io::Error::last_os_error()));
        }
    }
    seccompiler::apply_filter(&prog).map_err(|e| format!("seccomp: {e}"))
}
