//! The seccomp allow-list of a jailed VMM process: every system call not on
//! [`ALLOWED`] fails with EPERM.

use std::collections::BTreeMap;

use seccompiler::{BpfProgram, SeccompAction, SeccompFilter};

/// System calls a VMM process needs once jailed.
pub const ALLOWED: &[i64] = &[
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

/// The allow-list compiled to a BPF program (EPERM for everything else).
pub fn filter() -> Result<BpfProgram, String> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_allow_list_compiles_and_leaves_out_what_a_jailed_process_must_not_do() {
        assert!(!filter().unwrap().is_empty());
        for sys in [libc::SYS_open, libc::SYS_openat, libc::SYS_socket, libc::SYS_connect, libc::SYS_execve, libc::SYS_ptrace, libc::SYS_mount] {
            assert!(!ALLOWED.contains(&sys), "{sys} is allowed");
        }
        let mut sorted = ALLOWED.to_vec();
        sorted.sort();
        sorted.dedup();
        assert_eq!(sorted.len(), ALLOWED.len(), "duplicates");
    }
}
