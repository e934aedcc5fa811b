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

    /// Remove every ready shell (for shutdown).
    pub fn drain(&self) -> Vec<Worker> {
        let mut p = self.inner.lock().unwrap();
        p.stopping = true;
        self.cv.notify_all();
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
                        Some(m) => break m,
                        None => p = self.cv.wait(p).unwrap(),
                    }
                }
            };
            match daemon.spawn_worker(need) {
                Ok(w) => {
                    let mut p = self.inner.lock().unwrap();
                    if p.stopping {
                        drop(p);
                        daemon.discard_worker(w);
                        return;
                    }
                    p.ready.entry(need).or_default().push_back(w);
                }
                Err(e) => {
                    eprintln!("wispd: pool: cannot prepare a {} MiB shell: {e}", need >> 20);
                    std::thread::sleep(std::time::Duration::from_secs(1));
                }
            }
        }
    }
}
