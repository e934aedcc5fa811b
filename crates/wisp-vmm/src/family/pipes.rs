//! Pipes between the VMs of a family: `pipe`, `close`, `read`, `write` on
//! descriptors (per VM, inherited by fork) that name one end of a pipe.
//! The bookkeeping (descriptors, ends open) is in the region; the bytes
//! are in the pipe's ring on the guest-visible page, which guests read and
//! write themselves while nothing blocks (`wisp_abi::family::rings`). This
//! is the slow path: the monitor applies the same rules to the ring, takes
//! its lock as the calling member, and puts the caller to sleep when it has
//! to wait.

use std::sync::atomic::Ordering;

use wisp_abi::errno::*;
use wisp_abi::family::limits::*;
use wisp_abi::family::rings::{Blocked, PipeRing, WAIT_READER, WAIT_WRITER};

use super::region::{fd_entry, fd_pipe, lock, release_end, rings, wake_waiters, Inner};
use super::{Attempt, CallResult, Family, Waiter};

impl Family {
    pub fn pipe(&self) -> CallResult {
        let l = lock(&self.map);
        let inner = &mut *l.inner;
        let fds = &inner.members[self.me].fds;
        let mut free = (0..MAX_FDS).filter(|&i| fds[i] == 0);
        let (Some(r), Some(w)) = (free.next(), free.next()) else { return Err(EMFILE) };
        let Some(p) = inner.pipes.iter().position(|p| p.used == 0) else { return Err(ENOSPC) };
        let pipe = &mut inner.pipes[p];
        (pipe.used, pipe.readers, pipe.writers) = (1, 1, 1);
        let ring = &rings(&self.map).pipes[p];
        ring.reset(true);
        ring.closed.store(0, Ordering::SeqCst);
        ring.waiters.store(0, Ordering::SeqCst);
        let fds = &mut inner.members[self.me].fds;
        fds[r] = fd_entry(p, 0);
        fds[w] = fd_entry(p, 1);
        Ok((r as i64, w as u64))
    }

    pub fn close(&self, fd: u64) -> CallResult {
        let l = lock(&self.map);
        let Some(f) = l.inner.members[self.me].fds.get(fd as usize).copied().filter(|&f| f != 0) else {
            return Err(EBADF);
        };
        l.inner.members[self.me].fds[fd as usize] = 0;
        release_end(&self.map, l.inner, f);
        wake_waiters(&self.map, l.inner);
        Ok((0, 0))
    }

    /// For the FDRING call: descriptor `fd`'s (ring index, end).
    pub fn fd_ring(&self, fd: u64) -> CallResult {
        let l = lock(&self.map);
        match l.inner.members[self.me].fds.get(fd as usize).and_then(|&f| fd_pipe(f)) {
            Some((pipe, end)) => Ok((pipe as i64, end as u64)),
            None => Err(EBADF),
        }
    }

    /// The ring of the pipe behind descriptor `fd` if it is open on `end`
    /// (what a blocked call watches; the attempts look again under the lock).
    fn ring_for(&self, fd: u64, end: u16) -> Option<&PipeRing> {
        let p = Self::pipe_of(lock(&self.map).inner, self.me, fd, end).ok()?;
        Some(&rings(&self.map).pipes[p])
    }

    /// The pipe behind descriptor `fd` if it is open on `end`.
    fn pipe_of(inner: &Inner, me: usize, fd: u64, end: u16) -> Result<usize, i64> {
        match inner.members[me].fds.get(fd as usize).and_then(|&f| fd_pipe(f)) {
            Some((pipe, e)) if e == end => Ok(pipe),
            _ => Err(EBADF),
        }
    }

    /// Read up to `max` bytes from descriptor `fd`; `out` receives them.
    pub fn read(&self, fd: u64, max: usize, nowait: bool, w: &Waiter, out: &mut Vec<u8>) -> CallResult {
        out.clear();
        out.resize(max.min(PIPE_CAPACITY), 0);
        let ring = self.ring_for(fd, 0);
        let r = self.blocking_on(nowait.then_some(EAGAIN), w, ring.map(|r| &r.tail), |inner, me, last| {
            let p = match Self::pipe_of(inner, me, fd, 0) {
                Ok(p) => p,
                Err(e) => return Attempt::Done(Err(e)),
            };
            let ring = &rings(&self.map).pipes[p];
            if last {
                // Going to sleep: say so on the ring, then look once more (a
                // writer that filled it before it saw the bit wakes nobody).
                ring.waiters.fetch_or(WAIT_READER, Ordering::SeqCst);
            }
            let eof = inner.pipes[p].writers == 0 || out.is_empty();
            let r = self.with_ring(inner, ring, |r| spoilt_empty(r, r.take(out)));
            if r == Some(Err(Blocked::Corrupt)) {
                wake_waiters(&self.map, inner);
            }
            Attempt::from_ring(r, |r| match r {
                Ok(n) => Some(Ok(n)),
                Err(Blocked::Corrupt) => Some(Err(EIO)),
                Err(Blocked::Wait) => eof.then_some(Ok(0)),
            })
        });
        let n = *r.as_ref().unwrap_or(&0);
        out.truncate(n);
        r.map(|n| (n as i64, 0))
    }

    /// Write `data` to descriptor `fd`: all of it (blocking as needed), or
    /// what fits with `nowait`. Writes up to `PIPE_BUF` are atomic.
    pub fn write(&self, fd: u64, data: &[u8], nowait: bool, w: &Waiter) -> CallResult {
        let mut done = 0usize;
        loop {
            let ring = self.ring_for(fd, 1);
            let r = self.blocking_on(nowait.then_some(EAGAIN), w, ring.map(|r| &r.head), |inner, me, last| {
                let p = match Self::pipe_of(inner, me, fd, 1) {
                    Ok(p) => p,
                    Err(e) => return Attempt::Done(Err(e)),
                };
                if inner.pipes[p].readers == 0 {
                    return Attempt::Done(Err(EPIPE));
                }
                let ring = &rings(&self.map).pipes[p];
                if last {
                    ring.waiters.fetch_or(WAIT_WRITER, Ordering::SeqCst);
                }
                let r = self.with_ring(inner, ring, |r| spoilt_empty(r, r.put(&data[done..])));
                if r == Some(Err(Blocked::Corrupt)) {
                    wake_waiters(&self.map, inner);
                }
                Attempt::from_ring(r, |r| match r {
                    Ok(n) => Some(Ok(n)),
                    Err(Blocked::Corrupt) => Some(Err(EIO)),
                    Err(Blocked::Wait) => None,
                })
            });
            match r {
                Ok(n) => {
                    done += n;
                    if done == data.len() {
                        return Ok((done as i64, 0));
                    }
                }
                // Like Linux: what was written counts, the error comes next time.
                Err(e) if done > 0 && e != EBADF => return Ok((done as i64, 0)),
                Err(e) => return Err(e),
            }
        }
    }
}

/// With `ring`'s lock held: after `r`, a ring found corrupt starts empty
/// (what it held is lost; the call fails with `EIO`).
fn spoilt_empty<T>(ring: &PipeRing, r: Result<T, Blocked>) -> Result<T, Blocked> {
    if matches!(r, Err(Blocked::Corrupt)) {
        ring.reset(false);
    }
    r
}
