//! The *prepare* phase of the toolstack: a pool of ready VMM processes
//! (shells) per memory size, refilled in the background.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex};

use crate::daemon::{Daemon, Worker};

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
    pub fn refill_loop(self: Arc<Self>, daemon: Arc<Daemon>) {
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
            let spawned = daemon.spawn_worker(need);
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
                        daemon.discard_worker(w);
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
