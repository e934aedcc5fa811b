//! The seccomp filters of a jailed VMM process (`seccompiler`, after
//! Firecracker's per-thread filters).
//!
//! Filters stack: a system call runs only if every filter of the calling
//! thread allows it, and the strictest answer wins (kill > errno > allow).
//! - The **process filter** ([`process_filters`]) is installed once, when
//!   the jail closes, and holds for every thread: the union of what the
//!   threads need, each call with its arguments checked where the kernel
//!   lets a filter see them (ioctl request numbers, clone flags, prctl
//!   options, socket options, no executable mappings, the kick signal
//!   only). Anything else **kills the process** (SIGSYS). Beside it, two
//!   small filters answer a few calls with an error instead: `clone3` and
//!   `statx` with ENOSYS (the C library and the standard library fall back
//!   to `clone` and `fstat`, whose arguments a filter can check), `open`
//!   and `openat` with EACCES (a jailed process has nothing to open; a
//!   library probing a file gets an error, not a dead VM).
//! - Each thread then narrows itself to its **role** ([`Role`], [`narrow`]):
//!   the NIC's I/O thread, which reads guest-written rings, may only move
//!   bytes and wait; the control thread may not touch KVM; the vCPU thread
//!   of a VM that cannot fork may not make VMs or processes.
//!
//! Filters are compiled once ([`prepare`]), before the jail closes, so a
//! thread's start pays two system calls, not a compilation.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen as Len, SeccompCmpOp as Op, SeccompCondition as Cond, SeccompFilter,
    SeccompRule,
};

/// What a thread of a VMM process does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Role {
    /// The vCPU thread of a VM that may fork: it makes the child's KVM VM
    /// and the child process, and talks to the daemon over the uplink.
    VcpuFork,
    /// The vCPU thread of a VM that cannot fork.
    Vcpu,
    /// The control server and its connection threads.
    Control,
    /// A device's I/O thread (the NIC's): moves bytes and waits.
    Io,
    /// The thread that reaps forked children.
    Reaper,
    /// The watchdog that ends a VM at its time limit.
    Watchdog,
}

impl Role {
    /// Every role.
    pub const ALL: [Role; 6] = [Role::VcpuFork, Role::Vcpu, Role::Control, Role::Io, Role::Reaper, Role::Watchdog];
}

/// KVM ioctl request numbers (x86-64, `linux/kvm.h`).
pub mod kvm {
    /// Make a VM (on `/dev/kvm`).
    pub const CREATE_VM: u64 = 0xae01;
    /// Size of a vCPU's shared run area (on `/dev/kvm`).
    pub const GET_VCPU_MMAP_SIZE: u64 = 0xae04;
    /// Make a vCPU (on a VM).
    pub const CREATE_VCPU: u64 = 0xae41;
    /// Map guest memory (on a VM; also family shared memory).
    pub const SET_USER_MEMORY_REGION: u64 = 0x4020_ae46;
    /// Run the vCPU.
    pub const RUN: u64 = 0xae80;
    pub const GET_REGS: u64 = 0x8090_ae81;
    pub const SET_REGS: u64 = 0x4090_ae82;
    pub const GET_SREGS: u64 = 0x8138_ae83;
    pub const SET_SREGS: u64 = 0x4138_ae84;
    pub const GET_MSRS: u64 = 0xc008_ae88;
    pub const SET_MSRS: u64 = 0x4008_ae89;
    pub const GET_FPU: u64 = 0x81a0_ae8c;
    pub const SET_FPU: u64 = 0x41a0_ae8d;
    pub const SET_CPUID2: u64 = 0x4008_ae90;
    pub const GET_TSC_KHZ: u64 = 0xaea3;
    /// Bind an eventfd to a port (device doorbells), at load time.
    pub const IOEVENTFD: u64 = 0x4040_ae79;
    /// The pages the guest wrote since the last call (incremental
    /// snapshots).
    pub const GET_DIRTY_LOG: u64 = 0x4010_ae42;
}

/// `ioctl`s on vCPU and VM descriptors a running VM uses.
const KVM_RUNNING: &[u64] = &[
    kvm::RUN,
    kvm::GET_REGS,
    kvm::SET_REGS,
    kvm::GET_SREGS,
    kvm::SET_SREGS,
    kvm::GET_MSRS,
    kvm::SET_MSRS,
    kvm::GET_FPU,
    kvm::SET_FPU,
    kvm::GET_TSC_KHZ,
    kvm::SET_USER_MEMORY_REGION,
    kvm::IOEVENTFD,
    kvm::GET_DIRTY_LOG,
];
/// `ioctl`s that make a forked child's VM: the only ones allowed on the
/// `/dev/kvm` descriptor a forking VM keeps.
const KVM_CREATE: &[u64] = &[kvm::CREATE_VM, kvm::GET_VCPU_MMAP_SIZE, kvm::CREATE_VCPU, kvm::SET_CPUID2];
/// `ioctl`s on sockets and other descriptors (non-blocking mode, close on exec).
const FD_IOCTLS: &[u64] = &[libc::FIONBIO, libc::FIOCLEX];

/// `clone` flags of a new thread (glibc's `pthread_create`).
pub const CLONE_THREAD_FLAGS: u64 = (libc::CLONE_VM
    | libc::CLONE_FS
    | libc::CLONE_FILES
    | libc::CLONE_SIGHAND
    | libc::CLONE_THREAD
    | libc::CLONE_SYSVSEM
    | libc::CLONE_SETTLS
    | libc::CLONE_PARENT_SETTID
    | libc::CLONE_CHILD_CLEARTID) as u64;
/// `clone` flags of `fork()` (glibc).
pub const CLONE_FORK_FLAGS: u64 = (libc::CLONE_CHILD_CLEARTID | libc::CLONE_CHILD_SETTID | libc::SIGCHLD) as u64;

/// What a filter allows, call by call: no entry, not allowed; an empty rule
/// list, any arguments; otherwise any one of the rules.
type Rules = BTreeMap<i64, Vec<SeccompRule>>;

fn cond(arg: u8, op: Op, v: u64) -> Cond {
    Cond::new(arg, Len::Qword, op, v).expect("argument index below 6")
}

fn dword(arg: u8, v: u64) -> Cond {
    Cond::new(arg, Len::Dword, Op::Eq, v).expect("argument index below 6")
}

fn rule(conds: Vec<Cond>) -> SeccompRule {
    SeccompRule::new(conds).expect("a rule has conditions")
}

/// Allow `sys` when argument `arg` (32-bit) is one of `values`.
fn one_of(r: &mut Rules, sys: i64, arg: u8, values: &[u64]) {
    r.entry(sys).or_default().extend(values.iter().map(|&v| rule(vec![dword(arg, v)])));
}

fn any(r: &mut Rules, calls: &[i64]) {
    for &c in calls {
        r.insert(c, Vec::new());
    }
}

/// What every thread needs: memory, time, signals of its own, futexes,
/// waiting, its own end, and narrowing itself further.
fn common(r: &mut Rules, kick_signal: i32) {
    any(
        r,
        &[
            libc::SYS_read,
            libc::SYS_write,
            libc::SYS_close,
            libc::SYS_munmap,
            libc::SYS_mremap,
            libc::SYS_madvise,
            libc::SYS_brk,
            libc::SYS_futex,
            libc::SYS_set_robust_list,
            libc::SYS_rseq,
            libc::SYS_sched_getaffinity,
            libc::SYS_sched_yield,
            libc::SYS_sigaltstack,
            libc::SYS_rt_sigprocmask,
            libc::SYS_rt_sigreturn,
            libc::SYS_getpid,
            libc::SYS_gettid,
            libc::SYS_getrandom,
            libc::SYS_clock_gettime,
            libc::SYS_clock_nanosleep,
            libc::SYS_nanosleep,
            libc::SYS_poll,
            libc::SYS_ppoll,
            libc::SYS_fstat,
            libc::SYS_exit,
            libc::SYS_exit_group,
            libc::SYS_restart_syscall,
            // Answered ENOSYS/EACCES by the errno filters ([`process_filters`]).
            libc::SYS_statx,
            libc::SYS_open,
            libc::SYS_openat,
        ],
    );
    // No executable memory: no new code in a jailed process.
    let no_exec = || vec![rule(vec![cond(2, Op::MaskedEq(libc::PROT_EXEC as u64), 0)])];
    r.insert(libc::SYS_mmap, no_exec());
    r.insert(libc::SYS_mprotect, no_exec());
    // `fstat` as glibc makes it: on a descriptor, never a path lookup
    // (a jailed process has no directory descriptor, and its root is empty).
    r.insert(
        libc::SYS_newfstatat,
        vec![rule(vec![cond(3, Op::MaskedEq(libc::AT_EMPTY_PATH as u64), libc::AT_EMPTY_PATH as u64)])],
    );
    // Thread names, and installing a further filter (which can only narrow).
    one_of(r, libc::SYS_prctl, 0, &[libc::PR_SET_NAME as u64, libc::PR_GET_NAME as u64, libc::PR_SET_NO_NEW_PRIVS as u64]);
    r.insert(
        libc::SYS_seccomp,
        vec![rule(vec![dword(0, libc::SECCOMP_SET_MODE_FILTER as u64), cond(1, Op::Eq, 0)])],
    );
    // Kicks between the monitor's own threads, with its signal only.
    r.insert(libc::SYS_tgkill, vec![rule(vec![dword(2, kick_signal as u64)])]);
}

/// Sockets already open: a control connection, the uplink, a console.
fn sockets(r: &mut Rules) {
    any(
        r,
        &[
            libc::SYS_readv,
            libc::SYS_writev,
            libc::SYS_recvmsg,
            libc::SYS_sendmsg,
            libc::SYS_recvfrom,
            libc::SYS_sendto,
            libc::SYS_accept4,
            libc::SYS_accept,
            libc::SYS_shutdown,
            libc::SYS_eventfd2,
        ],
    );
    // Timeouts, and reading a socket's error.
    let opts = [libc::SO_RCVTIMEO as u64, libc::SO_SNDTIMEO as u64, libc::SO_ERROR as u64];
    for sys in [libc::SYS_setsockopt, libc::SYS_getsockopt] {
        r.insert(sys, opts.iter().map(|&o| rule(vec![dword(1, libc::SOL_SOCKET as u64), dword(2, o)])).collect());
    }
    // What a descriptor handed over is (the uplink must be a Unix SEQPACKET socket).
    for o in [libc::SO_TYPE as u64, libc::SO_DOMAIN as u64] {
        r.entry(libc::SYS_getsockopt).or_default().push(rule(vec![dword(1, libc::SOL_SOCKET as u64), dword(2, o)]));
    }
    let cmds = [libc::F_GETFL, libc::F_SETFL, libc::F_GETFD, libc::F_SETFD, libc::F_DUPFD_CLOEXEC, libc::F_GET_SEALS];
    one_of(r, libc::SYS_fcntl, 1, &cmds.map(|c| c as u64));
}

/// Putting a new family uplink in place of the old one (`dup3` onto its
/// number, close-on-exec), when a restarted daemon sends one: the control
/// thread does it, and in a forked VM that thread is the vCPU thread's
/// (its filter stacks on that one's).
fn swap_uplink(r: &mut Rules) {
    r.insert(libc::SYS_dup3, vec![rule(vec![dword(2, libc::O_CLOEXEC as u64)])]);
}

fn threads(r: &mut Rules) {
    // `clone3` passes its flags in memory a filter cannot read: it answers
    // ENOSYS (errno filter) and the C library falls back to `clone`.
    any(r, &[libc::SYS_clone3, libc::SYS_rt_sigaction]);
    r.entry(libc::SYS_clone).or_default().push(rule(vec![cond(0, Op::Eq, CLONE_THREAD_FLAGS)]));
}

fn ioctls(r: &mut Rules, kvm: bool, create: bool) {
    let mut reqs: Vec<u64> = FD_IOCTLS.to_vec();
    if kvm {
        reqs.extend_from_slice(KVM_RUNNING);
    }
    if create {
        reqs.extend_from_slice(KVM_CREATE);
    }
    one_of(r, libc::SYS_ioctl, 1, &reqs);
}

/// Forking a VM: the child process, its descriptors from the daemon, and
/// a parent's care of its children.
fn forking(r: &mut Rules) {
    r.entry(libc::SYS_clone).or_default().push(rule(vec![cond(0, Op::Eq, CLONE_FORK_FLAGS)]));
    any(r, &[libc::SYS_socketpair, libc::SYS_wait4, libc::SYS_waitid, libc::SYS_pidfd_open, libc::SYS_getppid]);
    // The child closes the parent's descriptors (plain `close_range`, no flags).
    r.insert(libc::SYS_close_range, vec![rule(vec![dword(2, 0)])]);
    // A forked child of `wisp run` dies with its parent.
    one_of(r, libc::SYS_prctl, 0, &[libc::PR_SET_PDEATHSIG as u64]);
    // A spare monitor process for the next fork (wisp-vmm `vm/spare.rs`):
    // the child's guest RAM as a memfd of its own, the pages to copy into
    // it, and preparing as a batch job (this thread only: pid 0).
    any(r, &[libc::SYS_memfd_create, libc::SYS_ftruncate, libc::SYS_fallocate, libc::SYS_mincore]);
    r.insert(libc::SYS_sched_setscheduler, vec![rule(vec![cond(0, Op::Eq, 0)])]);
    // How large that memfd may grow (RLIMIT_FSIZE): reading this process's
    // limits only (pid 0, no new limit).
    r.insert(libc::SYS_prlimit64, vec![rule(vec![cond(0, Op::Eq, 0), cond(2, Op::Eq, 0)])]);
    // No `kill` at all: family pids are family-local, and the monitor
    // never asks the host whether a pid exists.
}

/// The rules of `role`.
fn role_rules(role: Role, kick_signal: i32) -> Rules {
    let mut r = Rules::new();
    common(&mut r, kick_signal);
    match role {
        Role::VcpuFork | Role::Vcpu => {
            sockets(&mut r);
            threads(&mut r);
            any(&mut r, &[libc::SYS_pread64, libc::SYS_pwrite64, libc::SYS_lseek]);
            // A disk's I/O thread is started from here and inherits this
            // filter under its own (filters only narrow).
            any(&mut r, &[libc::SYS_preadv, libc::SYS_pwritev, libc::SYS_fdatasync]);
            // A timer that kicks this thread out of the guest by a deadline
            // (wisp-vmm `signal::KickTimer`: the first exit's flush).
            any(&mut r, &[libc::SYS_timer_create, libc::SYS_timer_settime, libc::SYS_timer_delete]);
            // A snapshot: which pages of guest RAM hold anything.
            any(&mut r, &[libc::SYS_mincore]);
            let fork = role == Role::VcpuFork;
            ioctls(&mut r, true, fork);
            if fork {
                forking(&mut r);
                swap_uplink(&mut r);
            }
        }
        Role::Control => {
            sockets(&mut r);
            threads(&mut r);
            ioctls(&mut r, false, false);
            swap_uplink(&mut r);
            // A live update of a shared library (wisp-vmm
            // `devices/library/update.rs`): the new library read from its
            // sealed memfd and mapped in a slot of its own, the old one's
            // slot deleted — while the vCPU runs on.
            any(&mut r, &[libc::SYS_pread64]);
            one_of(&mut r, libc::SYS_ioctl, 1, &[kvm::SET_USER_MEMORY_REGION]);
        }
        Role::Io => {
            any(&mut r, &[libc::SYS_readv, libc::SYS_writev, libc::SYS_eventfd2]);
            // A disk's file (wisp-vmm `devices/block.rs`).
            any(&mut r, &[libc::SYS_preadv, libc::SYS_pwritev, libc::SYS_fdatasync]);
        }
        Role::Reaper => {
            any(&mut r, &[libc::SYS_wait4, libc::SYS_waitid, libc::SYS_pidfd_open]);
        }
        Role::Watchdog => {}
    }
    r
}

/// The process filter's rules: every role's together (the first thread
/// becomes any of them). A call some role allows with any arguments is
/// allowed so; otherwise any rule of any role.
fn process_rules(kick_signal: i32) -> Rules {
    let mut all = Rules::new();
    let mut unconditional = std::collections::BTreeSet::new();
    for role in Role::ALL {
        for (sys, rules) in role_rules(role, kick_signal) {
            if rules.is_empty() {
                unconditional.insert(sys);
            }
            let e = all.entry(sys).or_default();
            for rl in rules {
                if !e.contains(&rl) {
                    e.push(rl);
                }
            }
        }
    }
    for sys in unconditional {
        all.insert(sys, Vec::new());
    }
    all
}

fn compile(rules: Rules, mismatch: SeccompAction, matched: SeccompAction) -> Result<BpfProgram, String> {
    let f = SeccompFilter::new(rules, mismatch, matched, seccompiler::TargetArch::x86_64)
        .map_err(|e| format!("seccomp filter: {e}"))?;
    f.try_into().map_err(|e: seccompiler::BackendError| format!("seccomp compile: {e}"))
}

/// The filters installed when the jail closes, in order: the allow-list
/// (anything else kills the process), then the errno answers.
pub fn process_filters(kick_signal: i32) -> Result<Vec<BpfProgram>, String> {
    let allow = compile(process_rules(kick_signal), SeccompAction::KillProcess, SeccompAction::Allow)?;
    let enosys = compile(
        [libc::SYS_clone3, libc::SYS_statx].into_iter().map(|s| (s, Vec::new())).collect(),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::ENOSYS as u32),
    )?;
    let eacces = compile(
        [libc::SYS_open, libc::SYS_openat].into_iter().map(|s| (s, Vec::new())).collect(),
        SeccompAction::Allow,
        SeccompAction::Errno(libc::EACCES as u32),
    )?;
    Ok(vec![allow, enosys, eacces])
}

/// `role`'s filter: anything outside it kills the process.
pub fn role_filter(role: Role, kick_signal: i32) -> Result<BpfProgram, String> {
    compile(role_rules(role, kick_signal), SeccompAction::KillProcess, SeccompAction::Allow)
}

/// The rules that take a thread at role `from` to role `to` (a narrower
/// one): the calls, and the argument rules of calls, that `from` allows and
/// `to` does not, as a deny list. Stacked on `from`'s filter it leaves
/// exactly `to`'s, and it is a few dozen instructions where `to`'s own
/// filter is hundreds (installing a filter costs in proportion: the kernel
/// runs it once per system call number to cache its answers). None if
/// `to` is not a subset that a deny list can express (a call `from`
/// allows with any arguments and `to` only with some).
fn narrowing_rules(from: Role, to: Role, kick_signal: i32) -> Option<Rules> {
    let wider = role_rules(from, kick_signal);
    let narrower = role_rules(to, kick_signal);
    let mut deny = Rules::new();
    for (sys, rules) in wider {
        match narrower.get(&sys) {
            None => {
                deny.insert(sys, Vec::new());
            }
            Some(kept) if kept.is_empty() => {}
            Some(_) if rules.is_empty() => return None,
            Some(kept) => {
                // Rules test one argument for one value each: those `to`
                // lacks match no call that a kept rule matches.
                let gone: Vec<SeccompRule> = rules.into_iter().filter(|r| !kept.contains(r)).collect();
                if !gone.is_empty() {
                    deny.insert(sys, gone);
                }
            }
        }
    }
    // Anything `to` allows must have been allowed by `from`.
    narrower.keys().all(|sys| role_rules(from, kick_signal).contains_key(sys)).then_some(deny)
}

/// The deny-list filter that narrows a thread at role `from` to role `to`
/// (see [`narrowing_rules`]), if there is one.
pub fn narrowing_filter(from: Role, to: Role, kick_signal: i32) -> Result<Option<BpfProgram>, String> {
    narrowing_rules(from, to, kick_signal)
        .map(|deny| compile(deny, SeccompAction::Allow, SeccompAction::KillProcess))
        .transpose()
}

/// The narrowings prepared as deny lists: (from, to).
const NARROWINGS: [(Role, Role); 1] = [(Role::VcpuFork, Role::Vcpu)];

static PREPARED: OnceLock<Vec<(Role, BpfProgram)>> = OnceLock::new();
static PREPARED_NARROWINGS: OnceLock<Vec<((Role, Role), BpfProgram)>> = OnceLock::new();

/// Compile every role's filter now (before the jail closes), for
/// [`narrow`]. `kick_signal` is the signal the monitor's threads kick each
/// other with.
pub fn prepare(kick_signal: i32) -> Result<(), String> {
    let progs = Role::ALL.iter().map(|&r| role_filter(r, kick_signal).map(|p| (r, p))).collect::<Result<Vec<_>, _>>()?;
    let _ = PREPARED.set(progs);
    let mut narrowings = Vec::new();
    for (from, to) in NARROWINGS {
        if let Some(p) = narrowing_filter(from, to, kick_signal)? {
            narrowings.push(((from, to), p));
        }
    }
    let _ = PREPARED_NARROWINGS.set(narrowings);
    Ok(())
}

/// Narrow the calling thread, already narrowed to `from`, to `to`: with
/// the small deny list if one is prepared, else with `to`'s filter.
pub fn narrow_from(from: Role, to: Role) -> Result<(), String> {
    match PREPARED_NARROWINGS.get().and_then(|v| v.iter().find(|(k, _)| *k == (from, to))) {
        Some((_, prog)) => seccompiler::apply_filter(prog).map_err(|e| format!("seccomp ({from:?} -> {to:?}): {e}")),
        None => narrow(to),
    }
}

/// Narrow the calling thread to `role` (and the threads it creates after).
/// Does nothing if [`prepare`] was not called (a process that is not
/// jailed, such as `wisp run` without a daemon).
pub fn narrow(role: Role) -> Result<(), String> {
    let Some(progs) = PREPARED.get() else { return Ok(()) };
    let prog = &progs.iter().find(|(r, _)| *r == role).expect("every role is prepared").1;
    seccompiler::apply_filter(prog).map_err(|e| format!("seccomp ({role:?}): {e}"))
}
