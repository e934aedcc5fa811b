//! Controlling a running VM from other threads: pause, resume, kill,
//! snapshots, and events for the guest (graceful stop). The vCPU thread checks the control
//! block between guest entries; a kick (signal) or the bell brings it
//! out of `KVM_RUN` or out of the idle hypercall (a futex wait on the VM's
//! family bell).

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use crate::family::BellRef;
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
    /// The VM's bell in its family region: event bits, and the futex word
    /// the idle park and blocking family calls sleep on (other members of
    /// the family ring it too).
    bell: BellRef,
    paused: Mutex<PauseState>,
    cv: Condvar,
    vcpu: Mutex<Option<ThreadId>>,
    /// The vCPU thread is parked in the idle hypercall (not in the guest).
    parked: AtomicBool,
    /// Rung with the bell while the vCPU thread is parked, for a park that
    /// waits on descriptors (`poll`) rather than on the bell's futex.
    idle_fd: Option<std::os::fd::OwnedFd>,
    /// Bumped when a descriptor forked children inherit was replaced
    /// ([`Control::inherited_changed`]).
    inherited: std::sync::atomic::AtomicU64,
    /// A snapshot asked for ([`Control::save`]), and its answer.
    save: Mutex<SaveSlot>,
}

/// Where a snapshot goes: the stream's writer (a pipe to the toolstack, a
/// file, a peer).
pub type SaveSink = Box<dyn std::io::Write + Send>;

/// What a saved snapshot holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Saved {
    /// Bytes of the stream.
    pub bytes: u64,
    /// Bytes of guest RAM in it.
    pub ram_bytes: u64,
    /// Microseconds the vCPU was held for it.
    pub held_us: u64,
}

#[derive(Default)]
struct SaveSlot {
    /// The sink, and whether only the pages written since the last
    /// snapshot are asked for.
    job: Option<(SaveSink, bool)>,
    done: Option<Result<Saved, String>>,
}

#[derive(Default)]
struct PauseState {
    want: bool,
    acked: bool,
}

impl Control {

    pub(crate) fn new(bell: BellRef) -> Control {
        install_kick_handler();
        Control {
            halt: AtomicU8::new(Halt::None as u8),
            bell,
            paused: Mutex::new(PauseState::default()),
            cv: Condvar::new(),
            vcpu: Mutex::new(None),
            parked: AtomicBool::new(false),
            idle_fd: rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC | rustix::event::EventfdFlags::NONBLOCK).ok(),
            inherited: std::sync::atomic::AtomicU64::new(0),
            save: Mutex::new(SaveSlot::default()),
        }
    }


    /// Have the vCPU thread write a snapshot of the VM to `sink` at its next
    /// exit (a paused VM's at once; an idle one is woken for it), and wait
    /// for it, at most `timeout`. The VM goes on (or stays paused).
    pub fn save(&self, sink: SaveSink, timeout: Duration) -> Result<Saved, String> {
        self.save_with(sink, false, timeout)
    }

    /// [`Control::save`], of only the pages written since the VM's last
    /// snapshot with `incremental` (an error if it has none).
    pub fn save_with(&self, sink: SaveSink, incremental: bool, timeout: Duration) -> Result<Saved, String> {
        {
            let mut slot = self.save.lock().unwrap();
            if slot.job.is_some() {
                return Err("a snapshot of this VM is already being taken".into());
            }
            slot.job = Some((sink, incremental));
            slot.done = None;
        }
        // A paused vCPU waits on the condition variable (notified under its
        // lock: one between its look and its wait sees the job); a running
        // one is kicked out of the guest, an idle one woken.
        {
            let _p = self.paused.lock().unwrap();
            self.cv.notify_all();
        }
        self.interrupt();
        let deadline = Instant::now() + timeout;
        loop {
            // The answer is looked for with the pause lock held, the lock
            // the vCPU thread takes to announce it ([`Control::saved`]):
            // an answer that comes after the look wakes the wait below.
            let p = self.paused.lock().unwrap();
            {
                let mut slot = self.save.lock().unwrap();
                if let Some(done) = slot.done.take() {
                    return done;
                }
                let now = Instant::now();
                if now >= deadline || self.vcpu.lock().unwrap().is_none() || self.halted() != Halt::None {
                    slot.job = None;
                    return Err(if now >= deadline { "the VM did not stop for its snapshot in time" } else { "the VM is not running" }.into());
                }
            }
            // Kicked again in case the first kick landed just before KVM_RUN.
            let now = Instant::now();
            drop(self.cv.wait_timeout(p, (deadline - now).min(Duration::from_millis(1))).unwrap());
            if self.save.lock().unwrap().job.is_some() {
                self.interrupt();
            }
        }
    }

    /// A snapshot is asked for (the vCPU thread takes it with
    /// [`Control::take_save`]).
    pub(crate) fn save_pending(&self) -> bool {
        self.save.lock().unwrap().job.is_some()
    }

    pub(crate) fn take_save(&self) -> Option<(SaveSink, bool)> {
        self.save.lock().unwrap().job.take()
    }

    /// The vCPU thread's answer to a snapshot it took.
    pub(crate) fn saved(&self, r: Result<Saved, String>) {
        self.save.lock().unwrap().done = Some(r);
        let _p = self.paused.lock().unwrap();
        self.cv.notify_all();
    }

    /// The embedder replaced a descriptor that forked children inherit (a
    /// new family uplink): monitor processes forked before hold the old one,
    /// so the VM's spares (`vm/spare.rs`) go and new ones are made.
    pub fn inherited_changed(&self) {
        self.inherited.fetch_add(1, Ordering::AcqRel);
    }

    /// How often [`Control::inherited_changed`] was called.
    pub(crate) fn inherited_epoch(&self) -> u64 {
        self.inherited.load(Ordering::Acquire)
    }

    /// The eventfd a descriptor-waiting park watches (see `idle_fd`).
    pub(crate) fn idle_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.idle_fd.as_ref().map(std::os::fd::AsFd::as_fd)
    }

    pub(crate) fn bell(&self) -> &crate::family::Bell {
        self.bell.get()
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

    /// Forget a kill or timeout asked for, and events not taken: a
    /// recycled VM's next run starts afresh (`vm/reuse.rs`).
    pub(crate) fn clear_for_reuse(&self) {
        self.halt.store(Halt::None as u8, Ordering::Release);
        self.take_events();
    }

    pub(crate) fn halted(&self) -> Halt {
        if self.bell.get().kill.load(Ordering::Acquire) != 0 {
            return Halt::Kill;
        }
        match self.halt.load(Ordering::Acquire) {
            1 => Halt::Kill,
            2 => Halt::Timeout,
            _ => Halt::None,
        }
    }

    /// Deliver event bits (see `wisp_abi::events`) to the guest: its next or
    /// current idle hypercall returns them.
    pub fn post_events(&self, bits: u64) {
        self.bell.get().events.fetch_or(bits, Ordering::AcqRel);
        self.wake_idle();
    }

    pub(crate) fn take_events(&self) -> u64 {
        self.bell.get().events.swap(0, Ordering::AcqRel)
    }

    /// Event bits pending, without taking them.
    pub(crate) fn peek_events(&self) -> u64 {
        self.bell.get().events.load(Ordering::Acquire)
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
        if v && (self.is_paused() || self.halted() != Halt::None || self.save_pending()) {
            self.parked.store(false, Ordering::SeqCst);
            return false;
        }
        true
    }

    /// True while a pause is requested.
    /// Whether the vCPU thread sits in the idle hypercall (the guest has
    /// nothing to do until an event).
    pub(crate) fn is_parked(&self) -> bool {
        self.parked.load(Ordering::Acquire)
    }

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
        while st.want && self.halted() == Halt::None && !self.save_pending() {
            // With a timeout: a kill from the VM's family (another process)
            // cannot notify this condition variable.
            st = self.cv.wait_timeout(st, std::time::Duration::from_millis(100)).unwrap().0;
        }
        st.acked = false;
    }

    pub(crate) fn set_vcpu_thread(&self, t: Option<ThreadId>) {
        let tid = if t.is_some() { crate::sys::gettid() as u32 } else { 0 };
        self.bell.get().tid.store(tid, Ordering::Release);
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
        self.bell.get().ring();
        if let (true, Some(fd)) = (self.parked.load(Ordering::SeqCst), &self.idle_fd) {
            let _ = rustix::io::write(fd, &1u64.to_ne_bytes());
        }
    }
}
