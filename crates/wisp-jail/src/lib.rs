//! The sandbox of a VMM process, after Firecracker's jailer: once its shell
//! is prepared and its control socket bound, the process
//! - moves into its own network, IPC, UTS, cgroup and mount namespaces (it
//!   has no network: NICs come later as descriptors from the daemon),
//! - changes its root to an empty, read-only file system (`pivot_root`;
//!   the old root is detached, so no path names a host file any more),
//! - takes resource limits (descriptors, threads, file size, no core dumps),
//! - drops to a user and group of its own (unique per VM, so it cannot
//!   signal, trace or read other VMs' processes and files) with no
//!   capabilities and `no_new_privs`,
//! - and installs its seccomp filters ([`seccomp`]): a call outside them
//!   kills the process, and each thread narrows itself to its role.
//!
//! The files the process writes (`exit.json`, `console.log`) are opened
//! before ([`JailFiles`]). Its PID namespace is made by whoever starts it
//! (the daemon): a process cannot move itself into a new one.

mod files;
pub mod priority;
pub mod seccomp;

use std::path::Path;

pub use files::JailFiles;

use rustix::mount::{mount, mount_change, mount_remount, unmount, MountFlags, MountPropagationFlags, UnmountFlags};
use rustix::process::{chdir, pivot_root, setrlimit, Resource, Rlimit};

/// Close the jail around the calling process: user and group id `uid`, an
/// address space of guest RAM (`mem` bytes) plus 2 GiB, `kick_signal` the
/// only signal its threads send each other. `base` is any existing
/// directory (the VM's own): in the new mount namespace the empty root is
/// mounted there before it becomes the root. Call while the process is
/// still single-threaded: the filters and credentials then hold for every
/// thread it creates afterwards.
pub fn enter(uid: u32, mem: u64, kick_signal: i32, base: &Path) -> Result<(), String> {
    enter_with(uid, Sizes::one(mem), kick_signal, base)
}

/// How large a jailed process may grow: its address space, descriptors
/// and threads (the latter two per user id, which is the process's own).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sizes {
    /// Bytes of address space.
    pub address_space: u64,
    /// Open descriptors.
    pub files: u64,
    /// Threads.
    pub threads: u64,
}

impl Sizes {
    /// A process with one VM of `mem` bytes of guest RAM.
    pub fn one(mem: u64) -> Sizes {
        Sizes { address_space: mem + (2 << 30), files: 256, threads: 256 }
    }

    /// A process holding up to `n` VMs of `mem` bytes each, each with its
    /// own KVM VM, vCPU thread and control socket: room for `n` times one
    /// VM's mappings, descriptors and threads (its watchdog, its streams).
    pub fn group(mem: u64, n: u32) -> Sizes {
        let n = u64::from(n.max(1));
        Sizes { address_space: n * (mem + (64 << 20)) + (2 << 30), files: 256 + 16 * n, threads: 256 + 4 * n }
    }
}

/// [`enter`] with the limits of `sizes`.
pub fn enter_with(uid: u32, sizes: Sizes, kick_signal: i32, base: &Path) -> Result<(), String> {
    let filters = seccomp::process_filters(kick_signal)?;
    seccomp::prepare(kick_signal)?;
    let flags = libc::CLONE_NEWNET | libc::CLONE_NEWIPC | libc::CLONE_NEWUTS | libc::CLONE_NEWNS | libc::CLONE_NEWCGROUP;
    // SAFETY: `unshare` of these namespaces affects only this (single-threaded)
    // process; no memory is involved.
    if unsafe { libc::unshare(flags) } != 0 {
        return Err(format!("unshare: {}", std::io::Error::last_os_error()));
    }
    empty_root(base)?;
    let lim = |res, n: u64| {
        setrlimit(res, Rlimit { current: Some(n), maximum: Some(n) }).map_err(|e| format!("setrlimit {res:?}: {e}"))
    };
    lim(Resource::Nofile, sizes.files)?;
    lim(Resource::Nproc, sizes.threads)?;
    lim(Resource::Core, 0)?;
    lim(Resource::Fsize, 1 << 20)?;
    lim(Resource::Memlock, 0)?;
    lim(Resource::As, sizes.address_space)?;
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
    for f in &filters {
        seccompiler::apply_filter(f).map_err(|e| format!("seccomp: {e}"))?;
    }
    Ok(())
}

/// Close every descriptor but standard input, output and error: call first
/// thing in a process that is to be jailed, so that nothing its starter
/// leaked by mistake reaches it.
pub fn close_inherited() {
    // SAFETY: the caller has opened nothing yet; no descriptor closed here
    // is owned by any object of this process.
    unsafe { libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, 0u32) };
}

/// In a new mount namespace: make an empty, read-only tmpfs the root and
/// detach the old one (the `pivot_root(".", ".")` idiom of pivot_root(2)).
fn empty_root(base: &Path) -> Result<(), String> {
    fn err(what: &'static str) -> impl Fn(rustix::io::Errno) -> String {
        move |e| format!("empty root: {what}: {e}")
    }
    // Nothing done here may propagate back to the host's mounts.
    mount_change("/", MountPropagationFlags::REC | MountPropagationFlags::PRIVATE).map_err(err("make / private"))?;
    let fl = MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC;
    mount("wisp-jail", base, "tmpfs", fl, Some(c"size=4k,nr_inodes=1,mode=0555")).map_err(err("mount tmpfs"))?;
    chdir(base).map_err(err("chdir"))?;
    pivot_root(".", ".").map_err(err("pivot_root"))?;
    unmount(".", UnmountFlags::DETACH).map_err(err("detach the old root"))?;
    chdir("/").map_err(err("chdir /"))?;
    mount_remount("/", fl | MountFlags::RDONLY, "").map_err(err("read-only"))?;
    Ok(())
}
