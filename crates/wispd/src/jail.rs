//! The sandbox of a VMM process, after Firecracker's jailer: once its shell
//! is prepared and its control socket bound, the process
//! - moves into its own network, IPC and UTS namespaces (it has no network:
//!   NICs come later as descriptors from the daemon),
//! - takes resource limits (descriptors, threads, file size, no core dumps),
//! - drops to a user and group of its own (unique per VM, so it cannot
//!   signal, trace or read other VMs' processes and files) with no
//!   capabilities and `no_new_privs`,
//! - and installs a seccomp allow-list: every system call not on it fails
//!   with EPERM. `open`/`openat` are not on it: the files the process writes
//!   (`exit.json`, `console.log`) are opened before, and renamed into place
//!   relative to a directory descriptor.

use std::collections::BTreeMap;
use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use rustix::fs::{openat, renameat, Mode, OFlags, CWD};
use rustix::process::{setrlimit, Resource, Rlimit};
use seccompiler::{BpfProgram, SeccompAction, SeccompFilter};

/// Files a jailed VMM process may write, opened before the jail closes.
pub struct JailFiles {
    dir: OwnedFd,
    /// `exit.json.tmp`.
    pub exit_tmp: File,
    /// `console.log.tmp`.
    pub console_tmp: File,
}

impl JailFiles {
    /// Open the VM directory and the temporary files in it.
    pub fn open(dir: &Path) -> std::io::Result<JailFiles> {
        let dir = openat(CWD, dir, OFlags::DIRECTORY | OFlags::RDONLY | OFlags::CLOEXEC, Mode::empty())?;
        let tmp = |name: &str| -> std::io::Result<File> {
            let fd = openat(&dir, name, OFlags::CREATE | OFlags::TRUNC | OFlags::WRONLY | OFlags::CLOEXEC, Mode::from_raw_mode(0o644))?;
            Ok(File::from(fd))
        };
        Ok(JailFiles { exit_tmp: tmp("exit.json.tmp")?, console_tmp: tmp("console.log.tmp")?, dir })
    }

    /// The same from descriptors opened by someone else (the daemon, for a
    /// forked VM).
    pub fn from_fds(dir: OwnedFd, exit_tmp: File, console_tmp: File) -> JailFiles {
        JailFiles { dir, exit_tmp, console_tmp }
    }

    /// The directory and the two files, as descriptors.
    pub fn into_parts(self) -> (OwnedFd, File, File) {
        (self.dir, self.exit_tmp, self.console_tmp)
    }

    /// Rename `<name>.tmp` to `<name>` inside the VM directory.
    pub fn commit(&self, name: &str) -> std::io::Result<()> {
        Ok(renameat(self.dir.as_fd(), format!("{name}.tmp"), self.dir.as_fd(), name)?)
    }
}

/// System calls a VMM process needs once jailed.
const ALLOWED: &[i64] = &[
    libc::SYS_read,
    libc::SYS_write,
    libc::SYS_readv,
    libc::SYS_writev,
    libc::SYS_pread64,
    libc::SYS_pwrite64,
    libc::SYS_close,
    libc::SYS_ioctl,
    libc::SYS_fstat,
    libc::SYS_newfstatat,
    libc::SYS_statx,
    libc::SYS_lseek,
    libc::SYS_fsync,
    libc::SYS_fdatasync,
    libc::SYS_renameat,
    libc::SYS_renameat2,
    libc::SYS_mmap,
    libc::SYS_munmap,
    libc::SYS_mprotect,
    libc::SYS_mremap,
    libc::SYS_madvise,
    libc::SYS_brk,
    libc::SYS_futex,
    libc::SYS_clone,
    libc::SYS_clone3,
    libc::SYS_set_robust_list,
    libc::SYS_rseq,
    libc::SYS_sched_getaffinity,
    libc::SYS_sched_yield,
    libc::SYS_prctl,
    libc::SYS_sigaltstack,
    libc::SYS_rt_sigaction,
    libc::SYS_rt_sigprocmask,
    libc::SYS_rt_sigreturn,
    libc::SYS_tgkill,
    libc::SYS_getpid,
    libc::SYS_gettid,
    libc::SYS_getrandom,
    libc::SYS_clock_gettime,
    libc::SYS_clock_nanosleep,
    libc::SYS_nanosleep,
    libc::SYS_poll,
    libc::SYS_ppoll,
    libc::SYS_eventfd2,
    libc::SYS_accept4,
    libc::SYS_accept,
    libc::SYS_recvmsg,
    // Fork: a forked VM's monitor asks the daemon for its files over a
    // pair; a parent's monitor reaps its children and signals its family.
    libc::SYS_socketpair,
    libc::SYS_wait4,
    libc::SYS_waitid,
    libc::SYS_pidfd_open,
    libc::SYS_kill,
    libc::SYS_getppid,
    libc::SYS_sendmsg,
    libc::SYS_recvfrom,
    libc::SYS_sendto,
    libc::SYS_setsockopt,
    libc::SYS_getsockopt,
    libc::SYS_shutdown,
    libc::SYS_fcntl,
    libc::SYS_exit,
    libc::SYS_exit_group,
    libc::SYS_restart_syscall,
];

fn filter() -> Result<BpfProgram, String> {
    let rules: BTreeMap<i64, Vec<seccompiler::SeccompRule>> = ALLOWED.iter().map(|&s| (s, vec![])).collect();
    let f = SeccompFilter::new(
        rules,
        SeccompAction::Errno(libc::EPERM as u32),
        SeccompAction::Allow,
        seccompiler::TargetArch::x86_64,
    )
    .map_err(|e| format!("seccomp filter: {e}"))?;
    f.try_into().map_err(|e: seccompiler::BackendError| format!("seccomp compile: {e}"))
}

/// Close the jail around the calling process. Call while it is still
/// single-threaded: the filter and credentials then hold for every thread
/// it creates afterwards.
pub fn enter(uid: u32, mem: u64) -> Result<(), String> {
    let prog = filter()?;
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
