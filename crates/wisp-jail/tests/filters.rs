//! The seccomp filters, each restriction tried for real: a forked child
//! installs the filters and makes one system call; the test reads how the
//! child ended (SIGSYS: killed by the filter; an exit code: what the call
//! returned). The child makes raw system calls only (the test harness has
//! other threads whose locks it must not touch).

use seccompiler::BpfProgram;
use wisp_jail::seccomp::{self, Role, CLONE_THREAD_FLAGS};

const KICK: i32 = 35;

/// How the child ended.
#[derive(Debug, PartialEq)]
enum End {
    Killed(i32),
    /// The call's result: 0 on success, else the errno.
    Returned(i32),
}

/// Fork; in the child install `filters` and run `call` (returns -1 and sets
/// errno on failure), exit with 0 or the errno.
fn try_call(filters: &[BpfProgram], call: impl Fn() -> i64) -> End {
    // SAFETY: the child only installs prebuilt filters, makes raw system
    // calls and `_exit`s (no allocation, no lock).
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        for f in filters {
            if seccompiler::apply_filter(f).is_err() {
                unsafe { libc::_exit(100) };
            }
        }
        let r = call();
        let code = if r < 0 { std::io::Error::last_os_error().raw_os_error().unwrap_or(101) } else { 0 };
        unsafe { libc::_exit(code) };
    }
    let mut st = 0;
    // SAFETY: waiting for our own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut st, 0) }, pid);
    if libc::WIFSIGNALED(st) {
        End::Killed(libc::WTERMSIG(st))
    } else {
        End::Returned(libc::WEXITSTATUS(st))
    }
}

fn process() -> Vec<BpfProgram> {
    seccomp::process_filters(KICK).unwrap()
}

fn with_role(role: Role) -> Vec<BpfProgram> {
    let mut f = process();
    f.push(seccomp::role_filter(role, KICK).unwrap());
    f
}

fn sys(n: i64, a: [u64; 6]) -> i64 {
    // SAFETY: each test passes arguments the call only reads as numbers, or
    // null pointers (the call then fails with EFAULT, if it is let through).
    unsafe { libc::syscall(n, a[0], a[1], a[2], a[3], a[4], a[5]) }
}

const SIGSYS: End = End::Killed(libc::SIGSYS);

#[test]
fn allowed_calls_run() {
    assert_eq!(try_call(&process(), || sys(libc::SYS_getpid, [0; 6])), End::Returned(0));
    let fionbio = || {
        let mut on: libc::c_int = 1;
        // SAFETY: FIONBIO reads an int we own.
        unsafe { libc::ioctl(1, libc::FIONBIO, &mut on) as i64 }
    };
    assert_eq!(try_call(&process(), fionbio), End::Returned(0));
    let fstat = || {
        // SAFETY: `st` is ours; "" with AT_EMPTY_PATH is fstat.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        unsafe { libc::fstatat(1, c"".as_ptr(), &mut st, libc::AT_EMPTY_PATH) as i64 }
    };
    assert_eq!(try_call(&process(), fstat), End::Returned(0));
}

#[test]
fn an_ioctl_outside_the_list_kills_the_process() {
    // TIOCGWINSZ: a harmless request, but not one a VMM process makes.
    assert_eq!(try_call(&process(), || sys(libc::SYS_ioctl, [1, libc::TIOCGWINSZ, 0, 0, 0, 0])), SIGSYS);
    // The KVM system calls a VMM process never makes (capabilities, CPUID).
    assert_eq!(try_call(&process(), || sys(libc::SYS_ioctl, [1, 0xae03, 0, 0, 0, 0])), SIGSYS, "KVM_CHECK_EXTENSION");
}

#[test]
fn clone_only_makes_threads_and_forks_and_clone3_is_not_there() {
    // New namespaces, or sharing memory with a new process: killed.
    let newns = (libc::CLONE_NEWNS | libc::SIGCHLD) as u64;
    assert_eq!(try_call(&process(), || sys(libc::SYS_clone, [newns, 0, 0, 0, 0, 0])), SIGSYS);
    let vm = (libc::CLONE_VM | libc::SIGCHLD) as u64;
    assert_eq!(try_call(&process(), || sys(libc::SYS_clone, [vm, 0, 0, 0, 0, 0])), SIGSYS);
    // clone3 carries its flags in memory: ENOSYS, so glibc uses clone.
    assert_eq!(try_call(&process(), || sys(libc::SYS_clone3, [0; 6])), End::Returned(libc::ENOSYS));
    // A thread's flags are allowed (a null stack makes the call fail
    // before anything is made: EINVAL, not a kill).
    let thread = try_call(&process(), || sys(libc::SYS_clone, [CLONE_THREAD_FLAGS, 0, 0, 0, 0, 0]));
    assert!(matches!(thread, End::Returned(_)), "{thread:?}");
}

#[test]
fn signals_prctl_paths_and_executable_memory_are_refused() {
    // kill: none at all, not even signal 0 (asking whether a process
    // exists), by a forking vCPU thread either; SIGCONT to itself would be
    // harmless.
    // SAFETY (closures): plain numeric arguments.
    assert_eq!(try_call(&process(), || unsafe { libc::kill(libc::getpid(), libc::SIGCONT) as i64 }), SIGSYS);
    for filters in [process(), with_role(Role::VcpuFork)] {
        assert_eq!(try_call(&filters, || unsafe { libc::kill(libc::getppid(), 0) as i64 }), SIGSYS);
    }
    // tgkill: the kick signal only.
    let tgkill = |sig: i32| move || unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), libc::gettid(), sig) };
    assert_eq!(try_call(&process(), tgkill(libc::SIGUSR2)), SIGSYS);
    // prctl: thread names and no_new_privs, not (say) making the process dumpable.
    assert_eq!(try_call(&process(), || unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0) as i64 }), SIGSYS);
    // A path lookup by fstatat: killed; statx answers ENOSYS; open EACCES.
    let stat_path = || {
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        unsafe { libc::fstatat(libc::AT_FDCWD, c"/etc/passwd".as_ptr(), &mut st, 0) as i64 }
    };
    assert_eq!(try_call(&process(), stat_path), SIGSYS);
    assert_eq!(try_call(&process(), || sys(libc::SYS_statx, [libc::AT_FDCWD as u64, 0, 0, 0, 0, 0])), End::Returned(libc::ENOSYS));
    let open = || unsafe { libc::open(c"/etc/passwd".as_ptr(), libc::O_RDONLY) as i64 };
    assert_eq!(try_call(&process(), open), End::Returned(libc::EACCES));
    // No executable memory.
    let exec = || unsafe {
        let p = libc::mmap(std::ptr::null_mut(), 4096, libc::PROT_READ | libc::PROT_EXEC, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0);
        if p == libc::MAP_FAILED { -1 } else { 0 }
    };
    assert_eq!(try_call(&process(), exec), SIGSYS);
    // Calls off the list altogether: socket, execve.
    assert_eq!(try_call(&process(), || sys(libc::SYS_socket, [libc::AF_INET as u64, libc::SOCK_STREAM as u64, 0, 0, 0, 0])), SIGSYS);
    assert_eq!(try_call(&process(), || sys(libc::SYS_execve, [0; 6])), SIGSYS);
}

#[test]
fn each_thread_role_is_narrower_than_the_process() {
    let fionbio = || {
        let mut on: libc::c_int = 1;
        unsafe { libc::ioctl(1, libc::FIONBIO, &mut on) as i64 }
    };
    // The NIC's I/O thread (guest rings) makes no ioctl at all, no socket
    // pairs, no processes.
    assert_eq!(try_call(&with_role(Role::Io), fionbio), SIGSYS);
    let pair = || {
        let mut fds = [0; 2];
        unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_STREAM, 0, fds.as_mut_ptr()) as i64 }
    };
    assert_eq!(try_call(&with_role(Role::Io), pair), SIGSYS);
    // The control thread: sockets yes, KVM no.
    assert_eq!(try_call(&with_role(Role::Control), fionbio), End::Returned(0));
    assert_eq!(try_call(&with_role(Role::Control), || sys(libc::SYS_ioctl, [1, 0xae80, 0, 0, 0, 0])), SIGSYS, "KVM_RUN");
    // The vCPU thread of a VM that cannot fork makes no VM and no process;
    // one that may fork does (socketpair for the daemon's answer).
    assert_eq!(try_call(&with_role(Role::Vcpu), pair), SIGSYS);
    assert_eq!(try_call(&with_role(Role::Vcpu), || sys(libc::SYS_ioctl, [1, 0xae01, 0, 0, 0, 0])), SIGSYS, "KVM_CREATE_VM");
    assert_eq!(try_call(&with_role(Role::VcpuFork), pair), End::Returned(0));
    let create_vm = try_call(&with_role(Role::VcpuFork), || sys(libc::SYS_ioctl, [1, 0xae01, 0, 0, 0, 0]));
    assert!(matches!(create_vm, End::Returned(e) if e != 0), "KVM_CREATE_VM on a non-KVM fd fails, is not killed: {create_vm:?}");
    // The watchdog: no sockets.
    assert_eq!(try_call(&with_role(Role::Watchdog), || sys(libc::SYS_recvmsg, [0; 6])), SIGSYS);
}

#[test]
fn a_forking_vcpu_thread_narrowed_by_its_deny_list_is_a_vcpu_thread() {
    // What VcpuFork allows and Vcpu does not: each is killed once the deny
    // list stacks on VcpuFork's filter, and what both allow still runs.
    let deny = seccomp::narrowing_filter(Role::VcpuFork, Role::Vcpu, KICK).unwrap().expect("a deny list");
    let mut narrowed = with_role(Role::VcpuFork);
    narrowed.push(deny.clone());
    assert!(deny.len() * 4 < seccomp::role_filter(Role::Vcpu, KICK).unwrap().len(), "the deny list is small");
    let pair = || {
        let mut fds = [0; 2];
        unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_STREAM, 0, fds.as_mut_ptr()) as i64 }
    };
    let killed: Vec<(&str, Box<dyn Fn() -> i64>)> = vec![
        ("socketpair", Box::new(pair)),
        ("KVM_CREATE_VM", Box::new(|| sys(libc::SYS_ioctl, [1, 0xae01, 0, 0, 0, 0]))),
        ("close_range", Box::new(|| sys(libc::SYS_close_range, [100, 200, 0, 0, 0, 0]))),
        ("dup3", Box::new(|| sys(libc::SYS_dup3, [1, 100, libc::O_CLOEXEC as u64, 0, 0, 0]))),
        ("fork", Box::new(|| sys(libc::SYS_clone, [seccomp::CLONE_FORK_FLAGS, 0, 0, 0, 0, 0]))),
        ("PR_SET_PDEATHSIG", Box::new(|| sys(libc::SYS_prctl, [libc::PR_SET_PDEATHSIG as u64, 9, 0, 0, 0, 0]))),
        ("memfd_create", Box::new(|| sys(libc::SYS_memfd_create, [0; 6]))),
        ("wait4", Box::new(|| sys(libc::SYS_wait4, [u64::MAX, 0, libc::WNOHANG as u64, 0, 0, 0]))),
    ];
    for (what, call) in &killed {
        assert_eq!(try_call(&with_role(Role::Vcpu), call), SIGSYS, "{what} under Vcpu");
        assert_eq!(try_call(&narrowed, call), SIGSYS, "{what} under VcpuFork narrowed to Vcpu");
    }
    let fionbio = || {
        let mut on: libc::c_int = 1;
        unsafe { libc::ioctl(1, libc::FIONBIO, &mut on) as i64 }
    };
    assert_eq!(try_call(&narrowed, fionbio), End::Returned(0));
    assert_eq!(try_call(&narrowed, || sys(libc::SYS_getpid, [0; 6])), End::Returned(0));
    let name = || sys(libc::SYS_prctl, [libc::PR_GET_NAME as u64, 0, 0, 0, 0, 0]);
    assert_eq!(try_call(&narrowed, name), End::Returned(libc::EFAULT), "PR_GET_NAME runs (and faults on a null buffer)");
    // A role that allows more than the one it would narrow has no deny list.
    assert!(seccomp::narrowing_filter(Role::Vcpu, Role::VcpuFork, KICK).unwrap().is_none());
}

#[test]
fn only_the_control_and_forking_threads_swap_a_descriptor_and_only_a_forking_one_closes_ranges() {
    // dup3 onto a descriptor number, close-on-exec: how a new family uplink
    // takes the old one's place (the control thread; in a forked VM that
    // thread's filter stacks on the forking vCPU thread's).
    let dup3 = |flags: i32| move || sys(libc::SYS_dup3, [1, 100, flags as u64, 0, 0, 0]);
    let mut both = with_role(Role::VcpuFork);
    both.push(seccomp::role_filter(Role::Control, KICK).unwrap());
    for filters in [with_role(Role::Control), with_role(Role::VcpuFork), both] {
        assert_eq!(try_call(&filters, dup3(libc::O_CLOEXEC)), End::Returned(0));
        assert_eq!(try_call(&filters, dup3(0)), SIGSYS, "without close-on-exec");
    }
    for role in [Role::Vcpu, Role::Io, Role::Reaper, Role::Watchdog] {
        assert_eq!(try_call(&with_role(role), dup3(libc::O_CLOEXEC)), SIGSYS, "{role:?}");
    }
    assert_eq!(try_call(&process(), || sys(libc::SYS_dup2, [1, 100, 0, 0, 0, 0])), SIGSYS);
    // A forked child closes its parent's descriptors: close_range, no flags
    // (CLOSE_RANGE_UNSHARE = 2 is not allowed), by a forking vCPU thread.
    let close_range = |flags: u64| move || sys(libc::SYS_close_range, [100, 200, flags, 0, 0, 0]);
    assert_eq!(try_call(&with_role(Role::VcpuFork), close_range(0)), End::Returned(0));
    assert_eq!(try_call(&with_role(Role::VcpuFork), close_range(2)), SIGSYS);
    assert_eq!(try_call(&with_role(Role::Vcpu), close_range(0)), SIGSYS);
    // What a descriptor is may be read (SO_TYPE, SO_DOMAIN), not set.
    let pair_then = |opt: i32, set: bool| {
        move || {
            let mut fds = [0; 2];
            // SAFETY: `fds`, `v` and `len` are ours.
            if unsafe { libc::socketpair(libc::AF_UNIX, libc::SOCK_SEQPACKET, 0, fds.as_mut_ptr()) } < 0 {
                return -1;
            }
            let mut v: libc::c_int = 0;
            let mut len = size_of::<libc::c_int>() as libc::socklen_t;
            let p = (&raw mut v).cast();
            unsafe {
                if set {
                    libc::setsockopt(fds[0], libc::SOL_SOCKET, opt, p, len) as i64
                } else {
                    libc::getsockopt(fds[0], libc::SOL_SOCKET, opt, p, &mut len) as i64
                }
            }
        }
    };
    for opt in [libc::SO_TYPE, libc::SO_DOMAIN] {
        assert_eq!(try_call(&process(), pair_then(opt, false)), End::Returned(0), "get {opt}");
        assert_eq!(try_call(&process(), pair_then(opt, true)), SIGSYS, "set {opt}");
    }
}
