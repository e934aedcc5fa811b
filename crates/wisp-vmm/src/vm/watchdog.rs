//! The run's time limit: after the deadline a watchdog thread halts the VM
//! and kicks the vCPU thread until the run loop acknowledges.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::control::{Control, Halt};

/// Ends a runaway guest.
pub(super) struct Watchdog {
    done: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watchdog {
    pub(super) fn start(deadline: Instant, control: Arc<Control>) -> Watchdog {
        let done = Arc::new(AtomicBool::new(false));
        let d = done.clone();
        let thread = std::thread::spawn(move || {
            crate::sys::thread_started(crate::sys::ThreadRole::Watchdog);
            while !d.load(Ordering::Acquire) {
                let now = Instant::now();
                if now < deadline {
                    std::thread::park_timeout(deadline - now);
                    continue;
                }
                // Repeat: a kick that lands just before KVM_RUN is entered is lost.
                control.halt(Halt::Timeout);
                control.interrupt();
                std::thread::park_timeout(Duration::from_millis(1));
            }
        });
        Watchdog { done, thread: Some(thread) }
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
