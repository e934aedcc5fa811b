//! Kicking a vCPU thread out of `KVM_RUN`: a no-op handler on a real-time
//! signal, `pthread_kill` to deliver it, and a POSIX timer that delivers
//! it by a deadline ([`KickTimer`]). The only libc `unsafe` of the monitor
//! lives here.

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

/// A one-shot timer that kicks the thread that made it: a bound on how
/// long that thread stays in `KVM_RUN` without an exit (a guest that makes
/// none still comes back to the monitor by then). A POSIX timer with
/// `SIGEV_THREAD_ID`: no thread of its own, one call to arm.
pub struct KickTimer(libc::timer_t);

// SAFETY: a timer id is a plain handle the kernel checks on every call;
// any thread may arm, disarm or delete it.
unsafe impl Send for KickTimer {}

impl KickTimer {
    /// A disarmed timer whose expiry kicks the calling thread.
    pub fn for_this_thread() -> std::io::Result<KickTimer> {
        install_kick_handler();
        // SAFETY: `sigevent` is plain data (zeroed, then the fields the
        // kernel reads for SIGEV_THREAD_ID set); `gettid` has no
        // preconditions; `timer_create` writes the id into `id` only.
        unsafe {
            let mut ev: libc::sigevent = std::mem::zeroed();
            ev.sigev_notify = libc::SIGEV_THREAD_ID;
            ev.sigev_signo = kick_signal();
            ev.sigev_notify_thread_id = libc::gettid();
            let mut id: libc::timer_t = std::ptr::null_mut();
            if libc::timer_create(libc::CLOCK_MONOTONIC, &mut ev, &mut id) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(KickTimer(id))
        }
    }

    /// Kick once, `after` from now (zero: disarm).
    pub fn arm(&self, after: std::time::Duration) {
        let spec = libc::itimerspec {
            it_interval: libc::timespec { tv_sec: 0, tv_nsec: 0 },
            it_value: libc::timespec { tv_sec: after.as_secs() as libc::time_t, tv_nsec: after.subsec_nanos() as libc::c_long },
        };
        // SAFETY: `self.0` came from `timer_create` and is deleted only on
        // drop; `spec` is read during the call only.
        unsafe {
            libc::timer_settime(self.0, 0, &spec, std::ptr::null_mut());
        }
    }

    /// Do not kick.
    pub fn disarm(&self) {
        self.arm(std::time::Duration::ZERO);
    }
}

impl Drop for KickTimer {
    fn drop(&mut self) {
        // SAFETY: `self.0` came from `timer_create` and is deleted once.
        unsafe {
            libc::timer_delete(self.0);
        }
    }
}
