//! Kicking a vCPU thread out of `KVM_RUN`: a no-op handler on a real-time
//! signal, and `pthread_kill` to deliver it. The only libc `unsafe` of the
//! monitor lives here.

use std::sync::Once;

/// The signal used to kick vCPU threads.
pub fn kick_signal() -> libc::c_int {
    libc::SIGRTMIN() + 1
}

extern "C" fn on_kick(_: libc::c_int) {}

/// Install the no-op handler once per process. Without `SA_RESTART`, a
/// thread in `KVM_RUN` returns `EINTR` when the signal arrives.
pub fn install_kick_handler() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: `sigaction` is given a zeroed, then fully initialised
        // struct; the handler is async-signal-safe (it does nothing).
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_kick as extern "C" fn(libc::c_int) as usize;
            libc::sigemptyset(&mut sa.sa_mask);
            sa.sa_flags = 0;
            libc::sigaction(kick_signal(), &sa, std::ptr::null_mut());
        }
    });
}

/// A thread that can be kicked.
#[derive(Clone, Copy, Debug)]
pub struct ThreadId(libc::pthread_t);

impl ThreadId {
    /// The calling thread.
    pub fn current() -> ThreadId {
        // SAFETY: `pthread_self` has no preconditions.
        ThreadId(unsafe { libc::pthread_self() })
    }

    /// Send the kick signal. The caller guarantees the thread is still
    /// alive (the run loop outlives its watchdog; see `vm::Watchdog`).
    pub fn kick(self) {
        // SAFETY: the thread id came from `pthread_self` of a thread that is
        // joined only after every kicker has stopped.
        unsafe {
            libc::pthread_kill(self.0, kick_signal());
        }
    }
}
