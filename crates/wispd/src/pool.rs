//! The *prepare* phase of the toolstack: a pool of ready VMM processes
//! (shells) per memory size, refilled in the background. The pool holds
//! [`Worker`]s; who makes and stops them ([`Shells`]) is given to it.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex};

use wisp_api::{PoolImage, PoolInfo, PoolTarget};

use crate::daemon::process::{SpawnError, Worker};
use crate::images::CachedImage;

/// Most memory sizes the pool keeps shells of.
pub const MAX_SIZES: usize = 16;

/// Why a pool size was refused.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    /// The memory size cannot be used.
    #[error("{0}")]
    BadMemory(wisp_vmm::Error),
    /// More shells in all than the daemon keeps.
    #[error("pool of {asked} shells is too large (at most {max} in all: wispd --max-pool-shells)")]
    TooLarge { asked: u64, max: u32 },
    /// More memory sizes than [`MAX_SIZES`].
    #[error("too many pool sizes: at most {MAX_SIZES}")]
    TooManySizes,
}

/// What makes and stops the pool's shells (the daemon).
pub trait Shells: Send + Sync {
    /// Spawn a VMM process with a prepared shell of `mem` bytes, ready, and
    /// with `image` loaded ahead if given.
    fn spawn(&self, mem: u64, image: Option<&Arc<CachedImage>>) -> Result<Worker, SpawnError>;
    /// Load `image` ahead into ready shell `w` (None: it failed and is gone).
    fn preload(&self, w: Worker, image: &Arc<CachedImage>) -> Option<Worker>;
    /// Stop a shell that will not be used.
    fn discard(&self, w: Worker);
}

/// The pool's next piece of work.
enum Job {
    /// Prepare a shell of this size (with this image loaded ahead).
    Spawn(u64, Option<Arc<CachedImage>>),
    /// Load the size's likely image into this ready shell.
    Preload(u64, Worker, Arc<CachedImage>),
    /// Stop this ready shell: sealed to an image no longer likely (a new
    /// one, with the likely image, takes its place).
    Discard(Worker),
}

/// Whether `w` holds `image` loaded ahead.
fn holds(w: &Worker, image: &Arc<CachedImage>) -> bool {
    w.preloaded.as_ref().is_some_and(|p| Arc::ptr_eq(p, image))
}

/// The shell of `q` a create takes: one that `holds` its image loaded
/// ahead, else one that holds none, else any that is not sealed.
fn pick(q: &VecDeque<Worker>, holds: impl Fn(&Worker) -> bool) -> Option<usize> {
    q.iter()
        .position(holds)
        .or_else(|| q.iter().position(|w| w.preloaded.is_none()))
        .or_else(|| q.iter().position(|w| !sealed(w)))
}

/// The shell a restore takes: one that holds no image, else the first.
fn any_shell(q: &VecDeque<Worker>) -> usize {
    q.iter().position(|w| w.preloaded.is_none()).unwrap_or(0)
}

/// Whether `w` can run only the image it holds: one that cannot fork (its
/// VMM process narrowed itself for that image when it loaded it ahead).
fn sealed(w: &Worker) -> bool {
    w.preloaded.as_ref().is_some_and(|p| !p.image.forks())
}

/// Ready shells and how many of each size to keep.
pub struct Pool {
    inner: Mutex<PoolInner>,
    cv: Condvar,
    /// Most shells kept, all sizes together.
    max_shells: u32,
}

#[derive(Default)]
struct PoolInner {
    target: HashMap<u64, u32>,
    ready: HashMap<u64, VecDeque<Worker>>,
    stopping: bool,
    /// Shells being prepared right now (not yet in `ready`).
    in_flight: usize,
    /// Creates under way ([`Pool::busy`]): a refill waits for them.
    busy: usize,
    /// Per size, the image last created with it: shells get it loaded ahead.
    likely: HashMap<u64, Arc<CachedImage>>,
}

/// Longest a refill waits for creates under way to finish ([`Pool::busy`]):
/// under a steady stream of creates the pool still refills.
const REFILL_DEFER: std::time::Duration = std::time::Duration::from_millis(20);

/// A create under way (see [`Pool::busy`]); dropped when it is done.
pub struct Busy<'a>(&'a Pool);

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        let mut p = self.0.inner.lock().unwrap();
        p.busy -= 1;
        self.0.cv.notify_all();
    }
}

impl Pool {
    /// An empty pool that keeps at most `max_shells` shells in all.
    pub fn new(max_shells: u32) -> Pool {
        Pool { inner: Mutex::default(), cv: Condvar::new(), max_shells }
    }

    /// Set how many shells of `mem` bytes to keep ready, if the pool may
    /// keep that many ([`Pool::new`], [`MAX_SIZES`]).
    pub fn set_target(&self, mem: u64, count: u32) -> Result<(), PoolError> {
        let mut p = self.inner.lock().unwrap();
        let others: u64 = p.target.iter().filter(|(m, _)| **m != mem).map(|(_, c)| u64::from(*c)).sum();
        if others + u64::from(count) > u64::from(self.max_shells) {
            return Err(PoolError::TooLarge { asked: others + u64::from(count), max: self.max_shells });
        }
        if !p.target.contains_key(&mem) && p.target.len() >= MAX_SIZES {
            return Err(PoolError::TooManySizes);
        }
        p.target.insert(mem, count);
        self.cv.notify_all();
        Ok(())
    }

    /// Set the sizes of `targets`, in order, each checked first (the ones
    /// before a bad one stay set).
    pub fn set_targets(&self, targets: &[PoolTarget]) -> Result<(), PoolError> {
        for t in targets {
            let mem = wisp_vmm::check_mem_size(t.mem).map_err(PoolError::BadMemory)?;
            self.set_target(mem, t.count)?;
        }
        Ok(())
    }

    /// (mem, target) pairs.
    pub fn targets(&self) -> Vec<(u64, u32)> {
        let p = self.inner.lock().unwrap();
        let mut v: Vec<_> = p.target.iter().map(|(m, c)| (*m, *c)).collect();
        v.sort();
        v
    }

    /// (mem, ready) pairs.
    pub fn ready(&self) -> Vec<(u64, u32)> {
        let p = self.inner.lock().unwrap();
        let mut v: Vec<_> = p.ready.iter().map(|(m, q)| (*m, q.len() as u32)).filter(|x| x.1 > 0).collect();
        v.sort();
        v
    }

    /// Targets and ready shells, as the API shows them.
    pub fn info(&self) -> PoolInfo {
        let conv = |v: Vec<(u64, u32)>| v.into_iter().map(|(mem, count)| PoolTarget { mem, count }).collect();
        let mut loaded: Vec<PoolImage> = Vec::new();
        for (mem, q) in &self.inner.lock().unwrap().ready {
            for name in q.iter().filter_map(|w| w.preloaded.as_ref().map(|i| &i.image.name)) {
                match loaded.iter_mut().find(|l| l.mem == *mem && l.image == *name) {
                    Some(l) => l.count += 1,
                    None => loaded.push(PoolImage { mem: *mem, image: name.clone(), count: 1 }),
                }
            }
        }
        loaded.sort_by(|a, b| (a.mem, &a.image).cmp(&(b.mem, &b.image)));
        PoolInfo { target: conv(self.targets()), ready: conv(self.ready()), loaded, group_spares: 0 }
    }

    /// A create is under way until the guard drops: the refill of the
    /// shell it takes waits (at most [`REFILL_DEFER`]), so that preparing a
    /// shell (process creation, KVM, control groups: work that takes locks
    /// in the kernel a create needs too) does not slow it down.
    pub fn busy(&self) -> Busy<'_> {
        self.inner.lock().unwrap().busy += 1;
        Busy(self)
    }

    /// Take a ready shell of `mem` bytes for `image`, if there is one (the
    /// caller holds a [`Pool::busy`] guard, whose drop starts the refill): one
    /// that holds the image loaded ahead, else one that holds none, else
    /// any. The image becomes the size's likely one (shells made from now
    /// on get it loaded ahead).
    pub fn take(&self, mem: u64, image: &Arc<CachedImage>) -> Option<Worker> {
        let mut p = self.inner.lock().unwrap();
        p.likely.insert(mem, image.clone());
        let q = p.ready.get_mut(&mem)?;
        let i = pick(q, |w| holds(w, image));
        // The refill hears of it when the create is done (`Busy`'s drop):
        // no wake-up on the create's path.
        q.remove(i?)
    }

    /// Take a ready shell of `mem` bytes for a restore: one that holds no
    /// image, else any (a restore clears RAM and makes no new KVM VM, so a
    /// shell sealed to its image serves too). The likely image stays what
    /// it was.
    pub fn take_any(&self, mem: u64) -> Option<Worker> {
        let mut p = self.inner.lock().unwrap();
        let q = p.ready.get_mut(&mem)?;
        let i = any_shell(q);
        q.remove(i)
    }

    /// Poke the shell [`Pool::take_any`] will give (as [`Pool::poke`]).
    pub fn poke_any(&self, mem: u64) {
        let p = self.inner.lock().unwrap();
        let Some(q) = p.ready.get(&mem) else { return };
        if let Some(s) = q.get(any_shell(q)).and_then(|w| w.session.as_ref()) {
            wisp_vmm_process::proto::poke(s);
        }
    }

    /// Poke the shell [`Pool::take`] will most likely give a create of
    /// `mem` bytes for the image named `image` (`proto::POKE`; before the
    /// image is looked up, so the name stands for it): it stays awake a
    /// moment, and the start finds it so.
    pub fn poke(&self, mem: u64, image: &str) {
        let p = self.inner.lock().unwrap();
        let Some(q) = p.ready.get(&mem) else { return };
        let i = pick(q, |w| w.preloaded.as_ref().is_some_and(|i| i.image.name == image));
        if let Some(s) = i.and_then(|i| q[i].session.as_ref()) {
            wisp_vmm_process::proto::poke(s);
        }
    }

    /// Stop refilling and remove every ready shell (for shutdown). Waits for
    /// a shell being prepared, which the refill thread then discards itself,
    /// so none is left behind.
    pub fn drain(&self) -> Vec<Worker> {
        let mut p = self.inner.lock().unwrap();
        p.stopping = true;
        self.cv.notify_all();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while p.in_flight > 0 && std::time::Instant::now() < deadline {
            p = self.cv.wait_timeout(p, std::time::Duration::from_millis(50)).unwrap().0;
        }
        p.ready.drain().flat_map(|(_, q)| q).collect()
    }

    /// The refill loop: keep every size at its target. Runs on its own
    /// thread, in the background (`SCHED_IDLE`, and so do the VMM processes
    /// it starts until they are ready): a refill takes no CPU time from the
    /// request that took a shell.
    pub fn refill_loop(self: Arc<Self>, shells: Arc<dyn Shells>) {
        // Only if a shell made there can be brought back (CAP_SYS_NICE).
        if !wisp_jail::priority::can_come_back() {
            eprintln!("wispd: pool: shells are prepared at normal priority (leaving SCHED_IDLE needs CAP_SYS_NICE)");
        } else if let Err(e) = wisp_jail::priority::background() {
            eprintln!("wispd: pool: cannot prepare shells in the background: {e}");
        }
        while let Some(job) = self.next_job() {
            // Creates under way first (see `busy`).
            {
                let deadline = std::time::Instant::now() + REFILL_DEFER;
                let mut p = self.inner.lock().unwrap();
                while p.busy > 0 && !p.stopping {
                    let left = deadline.saturating_duration_since(std::time::Instant::now());
                    if left.is_zero() {
                        break;
                    }
                    p = self.cv.wait_timeout(p, left).unwrap().0;
                }
            }
            let (mem, made) = match job {
                Job::Spawn(mem, image) => (mem, shells.spawn(mem, image.as_ref()).map(Some)),
                Job::Preload(mem, w, image) => (mem, Ok(shells.preload(w, &image))),
                Job::Discard(w) => {
                    shells.discard(w);
                    continue;
                }
            };
            let mut p = self.inner.lock().unwrap();
            p.in_flight -= 1;
            self.cv.notify_all();
            match made {
                Ok(Some(w)) if p.stopping => {
                    drop(p);
                    shells.discard(w);
                    return;
                }
                Ok(Some(w)) => p.ready.entry(mem).or_default().push_back(w),
                Ok(None) => {}
                Err(e) => {
                    drop(p);
                    eprintln!("wispd: pool: cannot prepare a {} MiB shell: {e}", mem >> 20);
                    std::thread::sleep(std::time::Duration::from_secs(1));
                }
            }
        }
    }

    /// The next job, waiting until there is one (None: stopping). A shell
    /// to make comes first; then a ready shell that lacks its size's
    /// likely image.
    fn next_job(&self) -> Option<Job> {
        let mut p = self.inner.lock().unwrap();
        loop {
            if p.stopping {
                return None;
            }
            let need = p.target.iter().find(|(m, t)| p.ready.get(m).map_or(0, VecDeque::len) < **t as usize).map(|(m, _)| *m);
            if let Some(m) = need {
                p.in_flight += 1;
                return Some(Job::Spawn(m, p.likely.get(&m).cloned()));
            }
            let likely: Vec<(u64, Arc<CachedImage>)> = p.likely.iter().map(|(m, i)| (*m, i.clone())).collect();
            for (m, image) in likely {
                let q = p.ready.get_mut(&m);
                if let Some(w) = q.and_then(|q| q.iter().position(|w| !holds(w, &image)).and_then(|i| q.remove(i))) {
                    if sealed(&w) {
                        return Some(Job::Discard(w));
                    }
                    p.in_flight += 1;
                    return Some(Job::Preload(m, w, image));
                }
            }
            p = self.cv.wait(p).unwrap();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_are_checked_in_order() {
        let p = Pool::new(10_000);
        let t = |mem: u64, count| PoolTarget { mem, count };
        p.set_targets(&[t(16 << 20, 2)]).unwrap();
        let e = p.set_targets(&[t(32 << 20, 1), t(32 << 20, 10_001), t(64 << 20, 1)]).unwrap_err();
        assert_eq!(e.to_string(), "pool of 10003 shells is too large (at most 10000 in all: wispd --max-pool-shells)");
        assert!(p.set_targets(&[t(1, 1)]).unwrap_err().to_string().contains("memory too small"));
        // The targets before the bad one stay set, as they always did.
        assert_eq!(p.targets(), vec![(16 << 20, 2), (32 << 20, 1)]);
        assert_eq!(p.info(), PoolInfo { target: vec![t(16 << 20, 2), t(32 << 20, 1)], ..Default::default() });
    }

    #[test]
    fn the_pool_is_bounded_in_all_and_in_sizes() {
        let p = Pool::new(8);
        let t = |mem: u64, count| PoolTarget { mem, count };
        p.set_targets(&[t(16 << 20, 4), t(32 << 20, 4)]).unwrap();
        // A size counts once: setting it again replaces its count.
        p.set_targets(&[t(16 << 20, 2), t(32 << 20, 6)]).unwrap();
        assert!(matches!(p.set_targets(&[t(64 << 20, 1)]), Err(PoolError::TooLarge { asked: 9, max: 8 })));
        assert!(matches!(p.set_target(16 << 20, 10_000), Err(PoolError::TooLarge { .. })));
        assert_eq!(p.targets(), vec![(16 << 20, 2), (32 << 20, 6)]);
        // What `PUT /pool` accepted before: 10,000 shells for each of 2,048 sizes.
        let p = Pool::new(64);
        let many: Vec<PoolTarget> = (0..2048u64).map(|i| t((4 << 20) + (i << 21), 0)).collect();
        assert!(matches!(p.set_targets(&many), Err(PoolError::TooManySizes)));
        assert_eq!(p.targets().len(), MAX_SIZES);
    }
}
