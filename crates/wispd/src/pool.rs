//! The *prepare* phase of the toolstack: a pool of ready VMM processes
//! (shells) per memory size, refilled in the background. The pool holds
//! [`Worker`]s; who makes and stops them ([`Shells`]) is given to it.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex};

use wisp_api::{PoolInfo, PoolTarget};

use crate::daemon::process::{SpawnError, Worker};

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
    /// Spawn a VMM process with a prepared shell of `mem` bytes, ready.
    fn spawn(&self, mem: u64) -> Result<Worker, SpawnError>;
    /// Stop a shell that will not be used.
    fn discard(&self, w: Worker);
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
        PoolInfo { target: conv(self.targets()), ready: conv(self.ready()) }
    }

    /// Take a ready shell of `mem` bytes, if there is one.
    pub fn take(&self, mem: u64) -> Option<Worker> {
        let mut p = self.inner.lock().unwrap();
        let w = p.ready.get_mut(&mem).and_then(VecDeque::pop_front);
        self.cv.notify_all();
        w
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

    /// The refill loop: keep every size at its target. Runs on its own thread.
    pub fn refill_loop(self: Arc<Self>, shells: Arc<dyn Shells>) {
        loop {
            let need = {
                let mut p = self.inner.lock().unwrap();
                loop {
                    if p.stopping {
                        return;
                    }
                    let need = p
                        .target
                        .iter()
                        .find(|(m, t)| p.ready.get(m).map_or(0, VecDeque::len) < **t as usize)
                        .map(|(m, _)| *m);
                    match need {
                        Some(m) => {
                            p.in_flight += 1;
                            break m;
                        }
                        None => p = self.cv.wait(p).unwrap(),
                    }
                }
            };
            let spawned = shells.spawn(need);
            let done = |pool: &Pool| {
                let mut p = pool.inner.lock().unwrap();
                p.in_flight -= 1;
                pool.cv.notify_all();
            };
            match spawned {
                Ok(w) => {
                    let mut p = self.inner.lock().unwrap();
                    if p.stopping {
                        drop(p);
                        shells.discard(w);
                        done(&self);
                        return;
                    }
                    p.ready.entry(need).or_default().push_back(w);
                    p.in_flight -= 1;
                    self.cv.notify_all();
                }
                Err(e) => {
                    done(&self);
                    eprintln!("wispd: pool: cannot prepare a {} MiB shell: {e}", need >> 20);
                    std::thread::sleep(std::time::Duration::from_secs(1));
                }
            }
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
        assert_eq!(p.info(), PoolInfo { target: vec![t(16 << 20, 2), t(32 << 20, 1)], ready: vec![] });
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
