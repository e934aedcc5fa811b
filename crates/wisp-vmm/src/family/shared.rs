//! The unsafe part of families: memory shared by the monitor processes of
//! one family (inherited through `fork(2)`) and the process-shared robust
//! mutex that guards it. The family region's layout and its two accessors
//! (bells, and `Inner` under the lock) are in `region.rs`; the host calls
//! (futexes, `fork(2)`, waits) in `crate::sys`.

use std::io;

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

    /// A `MAP_SHARED` mapping of the first `len` bytes of file `fd`, left
    /// out of processes forked later (`MADV_DONTFORK`).
    pub fn of_file(fd: std::os::fd::BorrowedFd<'_>, len: usize) -> io::Result<SharedMap> {
        use std::os::fd::AsRawFd;
        // SAFETY: a fresh mapping chosen by the kernel; nothing else is
        // replaced.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_NORESERVE,
                fd.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the mapping just made, whole.
        unsafe { libc::madvise(p, len, libc::MADV_DONTFORK) };
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
