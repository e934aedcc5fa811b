//! The unsafe part of families: memory shared by the monitor processes of
//! one family (inherited through `fork(2)`), the process-shared robust mutex
//! that guards it, futex waits and wakes across processes, and `fork(2)`
//! itself. Everything else in `family` is safe code on top of this.

use std::io;
use std::sync::atomic::AtomicU32;
use std::time::Duration;

/// A `MAP_SHARED | MAP_ANONYMOUS | MAP_NORESERVE` mapping: shared with every
/// process forked after it was made, zero-filled, backed only where touched.
pub struct SharedMap {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the mapping is plain memory owned by this struct; concurrent
// access is coordinated by its users (atomics, or the family mutex).
unsafe impl Send for SharedMap {}
// SAFETY: as above.
unsafe impl Sync for SharedMap {}

impl SharedMap {
    pub fn new(len: usize) -> io::Result<SharedMap> {
        // SAFETY: a fresh anonymous mapping chosen by the kernel; nothing
        // else is replaced.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(SharedMap { ptr: p.cast(), len })
    }

    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// Give the pages of `[off, off + len)` back to the system (they read as
    /// zeros afterwards, in every process sharing the mapping).
    pub fn discard(&self, off: usize, len: usize) {
        if off.checked_add(len).is_some_and(|e| e <= self.len) {
            // SAFETY: the range lies inside this mapping; MADV_REMOVE only
            // drops its backing pages.
            unsafe {
                libc::madvise(self.ptr.add(off).cast(), len, libc::MADV_REMOVE);
            }
        }
    }
}

impl Drop for SharedMap {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping this struct made; no reference
        // into it outlives the struct (users borrow through `&self`).
        unsafe {
            libc::munmap(self.ptr.cast(), self.len);
        }
    }
}

/// Initialise a process-shared, robust mutex in place.
///
/// # Safety
/// `m` must point to writable memory of a `pthread_mutex_t` that no thread
/// uses yet.
pub unsafe fn mutex_init(m: *mut libc::pthread_mutex_t) {
    // SAFETY: per the caller's contract; the attribute object is local.
    unsafe {
        let mut attr: libc::pthread_mutexattr_t = std::mem::zeroed();
        libc::pthread_mutexattr_init(&mut attr);
        libc::pthread_mutexattr_setpshared(&mut attr, libc::PTHREAD_PROCESS_SHARED);
        libc::pthread_mutexattr_setrobust(&mut attr, libc::PTHREAD_MUTEX_ROBUST);
        libc::pthread_mutex_init(m, &attr);
        libc::pthread_mutexattr_destroy(&mut attr);
    }
}

/// Lock the mutex at `m`. If its previous owner died holding it (a family
/// member's monitor was SIGKILLed), the mutex is made consistent and the
/// lock taken anyway: the state it guards is kept valid at every step.
///
/// # Safety
/// `m` must point to a mutex initialised by [`mutex_init`] in a live mapping.
pub unsafe fn mutex_lock(m: *mut libc::pthread_mutex_t) {
    // SAFETY: per the caller's contract.
    unsafe {
        if libc::pthread_mutex_lock(m) == libc::EOWNERDEAD {
            libc::pthread_mutex_consistent(m);
        }
    }
}

/// Outcome of [`mutex_trylock`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TryLock {
    /// Another live thread holds it.
    Busy,
    /// Taken (it was free).
    Acquired,
    /// Taken; its previous owner died holding it (now consistent again).
    OwnerDied,
}

/// Try to lock the robust mutex at `m` without waiting.
///
/// # Safety
/// As for [`mutex_lock`].
pub unsafe fn mutex_trylock(m: *mut libc::pthread_mutex_t) -> TryLock {
    // SAFETY: per the caller's contract.
    unsafe {
        match libc::pthread_mutex_trylock(m) {
            0 => TryLock::Acquired,
            libc::EOWNERDEAD => {
                libc::pthread_mutex_consistent(m);
                TryLock::OwnerDied
            }
            _ => TryLock::Busy,
        }
    }
}

/// Unlock the mutex at `m`, which the calling thread holds.
///
/// # Safety
/// As for [`mutex_lock`], and the caller must hold the lock.
pub unsafe fn mutex_unlock(m: *mut libc::pthread_mutex_t) {
    // SAFETY: per the caller's contract.
    unsafe {
        libc::pthread_mutex_unlock(m);
    }
}

/// Sleep while `*word == expected` (at most `timeout`), woken by
/// [`futex_wake`] from any process sharing the word's memory.
pub fn futex_wait(word: &AtomicU32, expected: u32, timeout: Option<Duration>) {
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
pub fn futex_wake(word: &AtomicU32) {
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
/// held or owned at the time of the call (glibc keeps `malloc` usable).
pub unsafe fn fork() -> io::Result<i32> {
    // SAFETY: per the caller's contract.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(pid)
    }
}

/// Close a descriptor owned by an object whose thread does not exist in
/// this (forked) process and which will never be dropped here.
///
/// # Safety
/// Nothing in this process may use or close `fd` afterwards.
pub unsafe fn close_orphaned_fd(fd: i32) {
    // SAFETY: per the caller's contract.
    unsafe {
        libc::close(fd);
    }
}

/// Ask for SIGKILL when the parent process ends (direct mode: a family
/// lives and dies with `wisp run`). Returns the parent's pid afterwards, to
/// compare with the expected one (the parent may have died already).
pub fn die_with_parent() -> i32 {
    // SAFETY: prctl(PR_SET_PDEATHSIG) and getppid have no memory effects.
    unsafe {
        libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong, 0, 0, 0);
        libc::getppid()
    }
}

/// Wait for child process `pid` to end; returns its raw wait status.
pub fn wait_child(pid: i32) -> Option<i32> {
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

/// True if a process with this pid exists (whoever owns it).
pub fn process_exists(pid: i32) -> bool {
    // SAFETY: signal 0 only checks existence and permission.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// Kick thread `tid` of process `pid` with signal `sig` (the monitor's
/// vCPU kick): brings it out of KVM_RUN.
pub fn kick_thread(pid: i32, tid: i32, sig: i32) {
    // SAFETY: tgkill has no memory effects; a stale tid fails with ESRCH.
    unsafe {
        libc::syscall(libc::SYS_tgkill, pid, tid, sig);
    }
}

/// The calling thread's kernel id.
pub fn gettid() -> i32 {
    // SAFETY: no preconditions.
    unsafe { libc::gettid() }
}
