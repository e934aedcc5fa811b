//! Orderly shutdown on SIGTERM/SIGINT: the signals are blocked in every
//! thread and taken synchronously by one thread with `sigwait`.

/// Block SIGTERM and SIGINT in the calling thread (and threads it spawns
/// afterwards). Call first thing in `main`.
pub fn block_term() {
    // SAFETY: the set is initialised by sigemptyset before use; changing the
    // calling thread's mask has no other effect.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
    }
}

/// Wait for SIGTERM or SIGINT (blocked by [`block_term`]).
pub fn wait_term() -> i32 {
    // SAFETY: as above; `sigwait` writes the signal number into `sig`.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        let mut sig = 0;
        libc::sigwait(&set, &mut sig);
        sig
    }
}
