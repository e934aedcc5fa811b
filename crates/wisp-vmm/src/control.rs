//! Controlling a running VM from other threads: pause, resume, kill, and
//! events for the guest (graceful stop). The vCPU thread checks the control
//! block between guest entries; a kick (signal) or the wake eventfd brings it
//! out of `KVM_RUN` or out of the idle hypercall.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use rustix::event::{eventfd, EventfdFlags};

use crate::signal::{install_kick_handler, ThreadId};

/// Why the run loop must stop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Halt {
    /// Keep running.
    None = 0,
    /// Killed through the API.
    Kill = 1,
    /// The run's time limit passed.
    Timeout = 2,
}

/// Shared control block of one VM.
pub struct Control {
    halt: AtomicU8,
    events: AtomicU64,
    paused: Mutex<PauseState>,
    cv: Condvar,
    vcpu: Mutex<Option<ThreadId>>,
    /// The vCPU thread is parked in the idle hypercall (not in the guest).
    parked: AtomicBool,
    pub(crate) wake: OwnedFd,
}

#[derive(Default)]
struct PauseState {
    want: bool,
    acked: bool,
}

impl Control {
    /// Install the process-wide kick handler now (e.g. before a sandbox
    /// forbids `rt_sigaction`). Idempotent.
    pub fn prepare_process() {
        install_kick_handler();
    }

    pub(crate) fn new() -> std::io::Result<Control> {
        install_kick_handler();
        Ok(Control {
            halt: AtomicU8::new(Halt::None as u8),
            events: AtomicU64::new(0),
            paused: Mutex::new(PauseState::default()),
            cv: Condvar::new(),
            vcpu: Mutex::new(None),
            parked: AtomicBool::new(false),
            wake: eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?,
        })
    }

    /// Stop the VM now (the run ends with `StopReason::Killed`).
    pub fn kill(&self) {
        self.halt(Halt::Kill);
    }

    pub(crate) fn halt(&self, why: Halt) {
        let _ = self.halt.compare_exchange(Halt::None as u8, why as u8, Ordering::AcqRel, Ordering::Acquire);
        self.resume_inner();
        self.interrupt();
    }

    pub(crate) fn halted(&self) -> Halt {
        match self.halt.load(Ordering::Acquire) {
            1 => Halt::Kill,
            2 => Halt::Timeout,
            _ => Halt::None,
        }
    }

    /// Deliver event bits (see `wisp_abi::events`) to the guest: its next or
    /// current idle hypercall returns them.
    pub fn post_events(&self, bits: u64) {
        self.events.fetch_or(bits, Ordering::AcqRel);
        self.wake_idle();
    }

    pub(crate) fn take_events(&self) -> u64 {
        self.events.swap(0, Ordering::AcqRel)
    }

    /// Pause the vCPU; returns once it is out of the guest and held (or the
    /// VM is not running), or after `timeout`.
    pub fn pause(&self, timeout: Duration) -> bool {
        let mut st = self.paused.lock().unwrap();
        st.want = true;
        drop(st);
        // A vCPU parked in the idle hypercall is already out of the guest; it
        // holds at its next checkpoint, without being woken now.
        if self.parked.load(Ordering::SeqCst) {
            return true;
        }
        self.interrupt();
        let deadline = Instant::now() + timeout;
        let mut st = self.paused.lock().unwrap();
        while !st.acked && st.want && self.vcpu.lock().unwrap().is_some() {
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            // Re-kick in case the first kick landed just before KVM_RUN.
            let (g, _) = self.cv.wait_timeout(st, (deadline - now).min(Duration::from_millis(1))).unwrap();
            st = g;
            if !st.acked {
                drop(st);
                self.interrupt();
                st = self.paused.lock().unwrap();
            }
        }
        true
    }

    /// Resume a paused vCPU.
    pub fn resume(&self) {
        self.resume_inner();
    }

    fn resume_inner(&self) {
        let mut st = self.paused.lock().unwrap();
        st.want = false;
        self.cv.notify_all();
    }

    /// Mark the vCPU thread as entering (true) or leaving (false) the idle
    /// park. Returns false if it must not park (a pause or halt is pending).
    pub(crate) fn set_parked(&self, v: bool) -> bool {
        self.parked.store(v, Ordering::SeqCst);
        if v && (self.is_paused() || self.halted() != Halt::None) {
            self.parked.store(false, Ordering::SeqCst);
            return false;
        }
        true
    }

    /// True while a pause is requested.
    pub fn is_paused(&self) -> bool {
        self.paused.lock().unwrap().want
    }

    /// Called by the vCPU thread between entries: hold while paused.
    pub(crate) fn checkpoint(&self) {
        let mut st = self.paused.lock().unwrap();
        if !st.want {
            return;
        }
        st.acked = true;
        self.cv.notify_all();
        while st.want && self.halted() == Halt::None {
            st = self.cv.wait(st).unwrap();
        }
        st.acked = false;
    }

    pub(crate) fn set_vcpu_thread(&self, t: Option<ThreadId>) {
        *self.vcpu.lock().unwrap() = t;
        self.cv.notify_all();
    }

    /// Bring the vCPU thread back to the run loop: kick it out of KVM_RUN
    /// and wake it from the idle hypercall.
    pub(crate) fn interrupt(&self) {
        self.wake_idle();
        if let Some(t) = *self.vcpu.lock().unwrap() {
            t.kick();
        }
    }

    fn wake_idle(&self) {
        let _ = rustix::io::write(self.wake.as_fd(), &1u64.to_ne_bytes());
    }
}
