//! The *prepare* phase of the toolstack: a pool of ready VMM processes
//! (shells) per memory size, refilled in the background. The pool holds
//! [`Worker`]s; who makes and stops them ([`Shells`]) is given to it.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex};

use wisp_api::{PoolInfo, PoolTarget};

use crate::daemon::process::{SpawnError, Worker};

/// Largest number of ready shells kept per memory size.
pub const MAX_TARGET: u32 = 10_000;

/// Why a pool size was refused.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    /// The memory size cannot be used.
    #[error("{0}")]
    BadMemory(wisp_vmm::Error),
    /// More shells than [`MAX_TARGET`].
    #[error("pool of {0} shells is too large (at most {MAX_TARGET})")]
    TooLarge(u32),
}

/// What makes and stops the pool's shells (the daemon).
pub trait Shells: Send + Sync {
    /// Spawn a VMM process with a prepared shell of `mem` bytes, ready.
    fn spawn(&self, mem: u64) -> Result<Worker, SpawnError>;
    /// Stop a shell that will not be used.
    fn discard(&self, w: Worker);
}

/// Ready shells and how many of each size to keep.
#[derive(Default)]
pub struct Pool {
    inner: Mutex<PoolInner>,
    cv: Condvar,
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
    /// Set how many shells of `mem` bytes to keep ready.
    pub fn set_target(&self, mem: u64, count: u32) {
        let mut p = self.inner.lock().unwrap();
        p.target.insert(mem, count);
        self.cv.notify_all();
    }

    /// Set the sizes of `targets`, in order, each checked first (the ones
    /// before a bad one stay set).
    pub fn set_targets(&self, targets: &[PoolTarget]) -> Result<(), PoolError> {
        for t in targets {
            let mem = wisp_vmm::check_mem_size(t.mem).map_err(PoolError::BadMemory)?;
            if t.count > MAX_TARGET {
                return Err(PoolError::TooLarge(t.count));
            }
            self.set_target(mem, t.count);
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
        let p = Pool::default();
        let t = |mem: u64, count| PoolTarget { mem, count };
        p.set_targets(&[t(16 << 20, 2)]).unwrap();
        let e = p.set_targets(&[t(32 << 20, 1), t(32 << 20, 10_001), t(64 << 20, 1)]).unwrap_err();
        assert_eq!(e.to_string(), "pool of 10001 shells is too large (at most 10000)");
        assert!(p.set_targets(&[t(1, 1)]).unwrap_err().to_string().contains("memory too small"));
        // The targets before the bad one stay set, as they always did.
        assert_eq!(p.targets(), vec![(16 << 20, 2), (32 << 20, 1)]);
        assert_eq!(p.info(), PoolInfo { target: vec![t(16 << 20, 2), t(32 << 20, 1)], ready: vec![] });
    }
}
