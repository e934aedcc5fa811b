//! Host helpers the monitor needs that the standard library lacks: futex
//! waits and wakes across processes, short spins, thread ids and kicks,
//! `fork(2)` and waiting for children, parent-death signals, replacing a
//! descriptor in place. Each is one system call (or a loop around one) and
//! knows nothing of its users.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// How long a blocked wait watches its word before sleeping on it (a
/// wake-up from sleep costs more than that on the hosts wisp runs on).
pub(crate) const SPIN: Duration = Duration::from_micros(50);

/// Watch `word` for a change from `seq` for at most `SPIN` (and `limit`).
pub(crate) fn spin_on(word: &AtomicU32, seq: u32, limit: Duration) {
    let until = Instant::now() + SPIN.min(limit);
    while word.load(Ordering::Acquire) == seq && Instant::now() < until {
        std::hint::spin_loop();
    }
}

/// Sleep while `*word == expected` (at most `timeout`), woken by
/// [`futex_wake`] from any process sharing the word's memory.
pub(crate) fn futex_wait(word: &AtomicU32, expected: u32, timeout: Option<Duration>) {
    let ts = timeout.map(|t| libc::timespec {
        tv_sec: t.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: t.subsec_nanos() as _,
    });
    let tsp = ts.as_ref().map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: `word` is a valid, aligned u32 for the duration of the call;
    // FUTEX_WAIT (shared) only reads it. `tsp` is null or points to `ts`.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAIT, expected, tsp, 0, 0);
    }
}

/// Wake every waiter on `word`.
pub(crate) fn futex_wake(word: &AtomicU32) {
    // SAFETY: as for `futex_wait`; FUTEX_WAKE does not access the word.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX, 0, 0, 0);
    }
}

/// `fork(2)`: Ok(0) in the child, Ok(pid) in the parent.
///
/// # Safety
/// Only the calling thread exists in the child. The caller must not, in the
/// child, use any lock or object another thread of this process may have
/// held or owned at the time of the call — no `Mutex` of an object shared
/// with other threads, no `std::io::stdout`/`stderr` ([`stderr_line`]
/// instead) — until it has made its own. Allocation is fine: glibc's
/// `fork` takes and resets the `malloc` locks around the call.
pub(crate) unsafe fn fork() -> io::Result<i32> {
    // SAFETY: per the caller's contract.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(pid)
    }
}

/// Write `msg` and a newline to standard error with one `write(2)` and no
/// lock. For a forked child before it owns its state: the standard
/// library's stderr lock may have been held by another thread of the
/// parent at the fork, and would then never be released in the child.
pub fn stderr_line(msg: &str) {
    let mut line = Vec::with_capacity(msg.len() + 1);
    line.extend_from_slice(msg.as_bytes());
    line.push(b'\n');
    // SAFETY: descriptor 2 is only written; `line` is valid for its length.
    let _ = unsafe { libc::write(2, line.as_ptr().cast(), line.len()) };
}

/// Close a descriptor owned by an object whose thread does not exist in
/// this (forked) process and which will never be dropped here.
///
/// # Safety
/// Nothing in this process may use or close `fd` afterwards.
pub(crate) unsafe fn close_orphaned_fd(fd: i32) {
    // SAFETY: per the caller's contract.
    unsafe {
        libc::close(fd);
    }
}

/// Make descriptor `slot` refer to the file `new` refers to, in one step
/// (`dup3`, close-on-exec): its number stays `slot`'s throughout, so a
/// thread using it, or a process forked meanwhile, sees the old file or the
/// new one, never a closed or reused number. The old file is closed here
/// (this process's reference to it).
pub fn replace_fd(slot: &OwnedFd, new: BorrowedFd<'_>) -> io::Result<()> {
    if slot.as_raw_fd() == new.as_raw_fd() {
        return Ok(());
    }
    // SAFETY: dup3 onto a descriptor `slot` owns (borrowed for the call):
    // the number stays open and `slot`'s; only the file behind it changes.
    // `new` is only read.
    if unsafe { libc::dup3(new.as_raw_fd(), slot.as_raw_fd(), libc::O_CLOEXEC) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// In a forked process: close every descriptor above 2 except those in
/// `keep` (one `close_range` per gap between them).
///
/// # Safety
/// Every descriptor closed must belong to nothing this process will use or
/// drop again: objects of the parent's other threads (which do not exist
/// here) or forgotten ones. Whatever the caller still owns must be in `keep`.
pub unsafe fn close_all_but(keep: &[i32]) {
    let mut keep: Vec<u32> = keep.iter().filter(|&&fd| fd > 2).map(|&fd| fd as u32).collect();
    keep.sort_unstable();
    keep.dedup();
    let mut from = 3u32;
    for k in keep.into_iter().map(Some).chain([None]) {
        let to = k.map_or(u32::MAX, |k| k.wrapping_sub(1));
        if k.is_none_or(|k| k > from) {
            // SAFETY: per the caller's contract; close_range touches no
            // memory of this process.
            unsafe { libc::syscall(libc::SYS_close_range, from, to, 0u32) };
        }
        if let Some(k) = k {
            from = k + 1;
        }
    }
}

/// Ask for SIGKILL when the parent process ends (direct mode: a family
/// lives and dies with `wisp run`). Returns the parent's pid afterwards, to
/// compare with the expected one (the parent may have died already).
pub(crate) fn die_with_parent() -> i32 {
    // SAFETY: prctl(PR_SET_PDEATHSIG) and getppid have no memory effects.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0);
        libc::getppid()
    }
}

/// Run the calling thread as a batch job (`SCHED_BATCH`: it never takes
/// the CPU from a thread that is woken, and a process it forks starts so
/// too) or as a normal thread again. Both are allowed to any process.
pub(crate) fn set_batch(batch: bool) {
    let param = libc::sched_param { sched_priority: 0 };
    let policy = if batch { libc::SCHED_BATCH } else { libc::SCHED_OTHER };
    // SAFETY: `param` is a valid sched_param for the call.
    unsafe {
        libc::sched_setscheduler(0, policy, &param);
    }
}

/// The calling thread's name (its process's, for the main thread).
pub(crate) fn thread_name() -> [u8; 16] {
    let mut name = [0u8; 16];
    // SAFETY: PR_GET_NAME writes at most 16 bytes into `name`.
    unsafe {
        libc::prctl(libc::PR_GET_NAME, name.as_mut_ptr() as libc::c_ulong, 0, 0, 0);
    }
    name
}

/// Name the calling thread (NUL-terminated, at most 16 bytes).
pub(crate) fn set_thread_name(name: &[u8; 16]) {
    // SAFETY: PR_SET_NAME reads at most 16 bytes from `name`.
    unsafe {
        libc::prctl(libc::PR_SET_NAME, name.as_ptr() as libc::c_ulong, 0, 0, 0);
    }
}

/// Undo [`die_with_parent`]: the process outlives its parent.
pub(crate) fn outlive_parent() {
    // SAFETY: prctl(PR_SET_PDEATHSIG, 0) has no memory effects.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, 0 as libc::c_ulong, 0, 0, 0);
    }
}

/// End this process at once with `code`: no exit handlers, no flush of
/// buffers it inherited (a spare monitor process that is not needed).
pub(crate) fn exit_now(code: i32) -> ! {
    // SAFETY: _exit never returns and touches no memory of this process.
    unsafe { libc::_exit(code) }
}

/// Wait for child process `pid` to end; returns its raw wait status.
pub(crate) fn wait_child(pid: i32) -> Option<i32> {
    let mut status = 0;
    loop {
        // SAFETY: `status` is a valid out pointer.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::__WALL) };
        if r == pid {
            return Some(status);
        }
        if r < 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            return None;
        }
    }
}

/// Kick thread `tid` of process `pid` with signal `sig` (the monitor's
/// vCPU kick): brings it out of KVM_RUN.
pub(crate) fn kick_thread(pid: i32, tid: i32, sig: i32) {
    // SAFETY: tgkill has no memory effects; a stale tid fails with ESRCH.
    unsafe {
        libc::syscall(libc::SYS_tgkill, pid, tid, sig);
    }
}

/// The calling thread's kernel id.
pub(crate) fn gettid() -> i32 {
    // SAFETY: no preconditions.
    unsafe { libc::gettid() }
}

/// What a thread the monitor starts does, for a sandbox that narrows each
/// thread's system calls to its role (see [`set_thread_hook`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ThreadRole {
    /// A device's I/O thread (moves bytes between a ring and the host).
    Io,
    /// The thread that reaps forked children.
    Reaper,
    /// The watchdog that ends a VM at its time limit.
    Watchdog,
}

static THREAD_HOOK: std::sync::OnceLock<fn(ThreadRole)> = std::sync::OnceLock::new();

/// Have every thread the monitor starts call `hook` with its role first
/// (the VMM process narrows its seccomp filter there). Set once.
pub fn set_thread_hook(hook: fn(ThreadRole)) {
    let _ = THREAD_HOOK.set(hook);
}

/// Called by a monitor thread as it starts.
pub(crate) fn thread_started(role: ThreadRole) {
    if let Some(hook) = THREAD_HOOK.get() {
        hook(role);
    }
}
