//! The run's time limit: after the deadline a watchdog thread halts the VM
//! and kicks the vCPU thread until the run loop acknowledges.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::control::{Control, Halt};

/// Ends a runaway guest.
pub(super) struct Watchdog {
    done: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// The VM it watches (another one after a recycled spare became a new
    /// child in this process: [`Watchdog::retarget`]).
    target: Arc<Mutex<Arc<Control>>>,
    deadline: Instant,
}

impl Watchdog {
    pub(super) fn start(deadline: Instant, control: Arc<Control>) -> Watchdog {
        let done = Arc::new(AtomicBool::new(false));
        let target = Arc::new(Mutex::new(control));
        let (d, t) = (done.clone(), target.clone());
        let thread = std::thread::spawn(move || {
            crate::sys::thread_started(crate::sys::ThreadRole::Watchdog);
            while !d.load(Ordering::Acquire) {
                let now = Instant::now();
                if now < deadline {
                    std::thread::park_timeout(deadline - now);
                    continue;
                }
                // Repeat: a kick that lands just before KVM_RUN is entered is lost.
                let control = t.lock().unwrap_or_else(|e| e.into_inner()).clone();
                control.halt(Halt::Timeout);
                control.interrupt();
                std::thread::park_timeout(Duration::from_millis(1));
            }
        });
        Watchdog { done, thread: Some(thread), target, deadline }
    }

    /// The descriptor of the control block it watches (kept open in a
    /// child until the watchdog lets go of that block).
    pub(super) fn target_fd(&self) -> Option<i32> {
        use std::os::fd::AsRawFd;
        self.target.lock().unwrap_or_else(|e| e.into_inner()).idle_fd().map(|f| f.as_raw_fd())
    }

    /// When it ends the run.
    pub(super) fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Watch `control`'s VM from now on (a recycled spare's next child: the
    /// same process and deadline, so no new thread on the child's path).
    pub(super) fn retarget(&self, control: Arc<Control>) {
        *self.target.lock().unwrap_or_else(|e| e.into_inner()) = control;
        if let Some(t) = &self.thread {
            t.thread().unpark();
        }
    }

    /// In a forked child, where the watchdog's thread does not exist:
    /// leave it alone (the parent's watchdog is the parent's).
    pub(super) fn forget_in_child(self) {
        std::mem::forget(self);
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.done.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }
}
