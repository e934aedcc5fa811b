//! A NIC's I/O thread: it moves frames between the rings and the backend
//! while traffic flows, polls for the guest's answer, and sleeps — leaving
//! an idle VM's backend to its parked vCPU thread ([`ParkWatch`]) — when
//! there is nothing to do.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rustix::event::{poll, PollFd, PollFlags};

use super::backend::Backend;
use super::{NetStats, Pass, Rings};
use crate::control::Control;

/// A park shorter than this that a frame ended means an exchange in
/// progress (request/response, a stream's next window): the I/O thread is
/// woken to carry it, polling the tap while the guest spins, so that the
/// next frames reach the ring with no park at all. Longer parks are an idle
/// VM's, whose frames the vCPU thread serves alone.
pub(super) const BUSY_PARK: Duration = Duration::from_millis(2);

/// Since when the vCPU thread watches a NIC's backend in an idle park,
/// and whether the I/O thread sleeps without watching it.
pub(super) struct ParkWatch {
    base: Instant,
    /// Nanoseconds after `base` + 1; 0: not watching.
    since: std::sync::atomic::AtomicU64,
    /// The I/O thread sleeps and leaves the backend to the vCPU thread.
    pub(super) io_blind: AtomicBool,
}

impl ParkWatch {
    pub(super) fn new() -> ParkWatch {
        ParkWatch { base: Instant::now(), since: std::sync::atomic::AtomicU64::new(0), io_blind: AtomicBool::new(false) }
    }

    pub(super) fn begin(&self) {
        self.since.store(self.base.elapsed().as_nanos() as u64 + 1, Ordering::Release);
    }

    pub(super) fn end(&self) {
        self.since.store(0, Ordering::Release);
    }

    /// How long the vCPU has been watching (none: it does not).
    pub(super) fn watching_for(&self) -> Option<Duration> {
        let v = self.since.load(Ordering::Acquire);
        (v != 0).then(|| self.base.elapsed().saturating_sub(Duration::from_nanos(v - 1)))
    }
}

/// The I/O thread's state (see the module comment): handles on what it
/// shares with the vCPU thread.
#[derive(Clone)]
pub(super) struct Io {
    /// See `Running::rings`.
    pub(super) rings: Arc<Mutex<Rings>>,
    pub(super) backend: Arc<dyn Backend>,
    /// See `Running::watchable`.
    pub(super) watchable: Arc<AtomicBool>,
    /// See `Running::park_watch`.
    pub(super) park_watch: Arc<ParkWatch>,
    pub(super) kick: Arc<OwnedFd>,
    pub(super) stop: Arc<AtomicBool>,
    pub(super) control: Arc<Control>,
}

/// Why the I/O thread ends if another thread panicked holding the rings.
const ABANDONED: &str = "the NIC's rings were abandoned";

/// How many times the I/O thread re-checks the rings before sleeping.
const SPIN_ROUNDS: u32 = 64;

/// Adaptive polling for the guest's answer (after Linux's and KVM's halt
/// polling): once frames reached the guest, the I/O thread keeps watching
/// the TX ring for a while instead of sleeping, so a reply leaves at once —
/// no doorbell, no wake-up of this thread. The window doubles when a reply
/// came within it and halves when none did; it is never spent while the
/// guest is parked (it has nothing to say) and shrinks to nothing when the
/// thread finds it was preempted (the host has no CPU to spare).
#[derive(Debug)]
struct ReplyPoll {
    window: Duration,
}

impl ReplyPoll {
    const MIN: Duration = Duration::from_micros(2);
    const START: Duration = Duration::from_micros(50);
    const MAX: Duration = Duration::from_micros(400);
    /// A gap this long between two looks at the rings: we were descheduled.
    const PREEMPTED: Duration = Duration::from_micros(30);

    fn new() -> ReplyPoll {
        ReplyPoll { window: Self::START }
    }

    fn hit(&mut self) {
        self.window = (self.window * 2).min(Self::MAX);
    }

    fn miss(&mut self) {
        self.window = (self.window / 2).max(Self::MIN);
    }

    fn preempted(&mut self) {
        self.window = Self::MIN;
    }
}

impl Io {
    pub(super) fn run(self) -> Result<NetStats, String> {
        let r = self.serve();
        let Ok(mut g) = self.rings.lock() else { return Err(ABANDONED.into()) };
        if let Err(why) = &r {
            // offload: say why (the VM goes on; its console is the guest's).
            eprintln!("wisp: NIC stopped: {why}");
            // Tell the guest its NIC is gone; wake it so it notices. The
            // vCPU thread serves the rings no more either.
            let g = &mut *g;
            g.failed.get_or_insert_with(|| why.clone());
            let _ = g.ring.mark_stopped(&mut g.ram);
            self.control.post_events(wisp_abi::events::NET);
        }
        r.map(|_| g.ring.stats())
    }

    fn lock(&self) -> Result<MutexGuard<'_, Rings>, String> {
        let g = self.rings.lock().map_err(|_| ABANDONED.to_string())?;
        match &g.failed {
            Some(why) => Err(why.clone()),
            None => Ok(g),
        }
    }

    fn serve(&self) -> Result<(), String> {
        let mut idle_rounds = 0u32;
        let mut reply = ReplyPoll::new();
        // Until when to watch for the guest's answer, once frames reached it.
        let mut polling: Option<Instant> = None;
        let mut last = Instant::now();
        loop {
            if self.stop.load(Ordering::Acquire) {
                return Ok(());
            }
            // One clock reading a round: budgets, reply polling, preemption.
            let now = Instant::now();
            // The rings are held for the round's pass only: between rounds
            // a vCPU thread may serve them itself.
            let Pass { tx, rx } = self.lock()?.pass(&*self.backend, now)?;
            // Frames the tap may hold for us: not while they stay there for
            // want of RX room or budget.
            let tap_ready = !rx.full && rx.wait.is_none();
            self.watchable.store(tap_ready, Ordering::Release);
            if rx.got > 0 {
                self.control.post_events(wisp_abi::events::NET);
            }
            if now.duration_since(last) > ReplyPoll::PREEMPTED {
                reply.preempted();
            }
            last = now;
            if tx.taken > 0 && polling.take().is_some() {
                reply.hit();
            }
            if rx.got > 0 {
                polling = Some(now + reply.window);
            }
            if tx.taken + rx.got > 0 {
                idle_rounds = 0;
                continue;
            }
            if let Some(until) = polling {
                if now < until && !self.control.is_parked() {
                    std::hint::spin_loop();
                    continue;
                }
                polling = None;
                reply.miss();
            }
            if let Some(wait) = tx.wait {
                // Frames wait for the TX budget: sleep until it is there
                // (the guest need not kick meanwhile: monitor_idle stays 0).
                self.sleep(tap_ready, Some(rx.wait.map_or(wait, |r| r.min(wait))));
                last = Instant::now();
                continue;
            }
            idle_rounds += 1;
            // Spin only while the guest runs and may queue a frame any
            // moment: a parked vCPU sends nothing until it has run, and the
            // frames just posted may be waiting for this very CPU to run it.
            if idle_rounds < SPIN_ROUNDS && rx.wait.is_none() && !self.control.is_parked() {
                std::hint::spin_loop();
                continue;
            }
            // Whether an idle VM's parked vCPU watches the tap: then it
            // serves the rings, and a kick by exit is the guest's fastest
            // way to us. A park shorter than `BUSY_PARK` may be a pause in
            // an exchange, which this thread keeps carrying.
            let watched = self.park_watch.watching_for();
            let vcpu_serves = watched.is_some_and(|d| d >= BUSY_PARK);
            let mut g = self.lock()?;
            let Rings { ram, ring, .. } = &mut *g;
            ring.set_kick_exit(ram, vcpu_serves)?;
            // Going to sleep: announce it, then look once more so a frame
            // queued in between is not left waiting for a kick.
            ring.set_idle(ram, true)?;
            // The store above must be visible before we read the guest's
            // index (store→load ordering; the guest has the matching fence),
            // or a kick could be lost.
            std::sync::atomic::fence(Ordering::SeqCst);
            // With a full RX ring, the guest kicks us when it frees slots
            // (`rx_wait`; same store, fence, re-check as for TX).
            if rx.full {
                ring.set_rx_wait(ram, true)?;
                std::sync::atomic::fence(Ordering::SeqCst);
            }
            let room = rx.full && ring.rx_room(ram)?;
            let pending = ring.tx_pending(ram)?;
            drop(g);
            if pending == 0 && !room {
                // With a full RX ring the tap stays readable: do not watch
                // it; a guest that does not kick is checked on every
                // millisecond. With the RX budget spent: when it is there.
                let mut timeout = if rx.full { Some(Duration::from_millis(1)) } else { rx.wait };
                if let Some(d) = watched.filter(|_| !vcpu_serves) {
                    // Look again once the park has become an idle VM's.
                    let left = BUSY_PARK - d;
                    timeout = Some(timeout.map_or(left, |t| t.min(left)));
                }
                // A parked vCPU watching the tap serves it itself. If it
                // then runs the guest, frames wait until the guest kicks
                // or parks again — the points where it would look anyway
                // (a park that does not watch the tap, a family's, wakes
                // this thread first: `Device::park_unwatched`).
                self.park_watch.io_blind.store(vcpu_serves, Ordering::Release);
                // That park may have ended meanwhile and the next may be
                // one that does not watch the tap (`park_unwatched` fences
                // and reads `io_blind` after the park's end is stored):
                // blind only while the park still goes on.
                std::sync::atomic::fence(Ordering::SeqCst);
                let blind = vcpu_serves && self.park_watch.watching_for().is_some();
                if !blind {
                    self.park_watch.io_blind.store(false, Ordering::Release);
                }
                self.sleep(tap_ready && !blind, timeout);
                self.park_watch.io_blind.store(false, Ordering::Release);
            }
            let mut g = self.lock()?;
            let Rings { ram, ring, .. } = &mut *g;
            if rx.full {
                ring.set_rx_wait(ram, false)?;
            }
            ring.set_idle(ram, false)?;
            ring.set_kick_exit(ram, false)?;
            drop(g);
            idle_rounds = 0;
            last = Instant::now();
        }
    }

    /// Sleep until a kick, the tap readable (if `tap`), or `timeout`.
    fn sleep(&self, tap: bool, timeout: Option<Duration>) {
        let ts = timeout.map(|t| rustix::time::Timespec { tv_sec: t.as_secs() as i64, tv_nsec: t.subsec_nanos() as i64 });
        let ready = self.backend.ready_fd();
        let mut fds = [PollFd::new(&*self.kick, PollFlags::IN), PollFd::new(&ready, PollFlags::IN)];
        let n = if tap { 2 } else { 1 };
        let _ = poll(&mut fds[..n], ts.as_ref());
        let mut b = [0u8; 8];
        let _ = rustix::io::read(self.kick.as_fd(), &mut b);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reply_window_grows_on_answers_and_shrinks_without() {
        let mut p = ReplyPoll::new();
        assert_eq!(p.window, ReplyPoll::START);
        for _ in 0..10 {
            p.hit();
        }
        assert_eq!(p.window, ReplyPoll::MAX, "answers that come in time keep it open, up to the cap");
        p.miss();
        assert_eq!(p.window, ReplyPoll::MAX / 2);
        for _ in 0..20 {
            p.miss();
        }
        assert_eq!(p.window, ReplyPoll::MIN, "a guest that never answers costs (almost) nothing");
        p.hit();
        p.hit();
        p.preempted();
        assert_eq!(p.window, ReplyPoll::MIN, "no CPU to spare: stop polling");
    }
}
