//! Pipes between the VMs of a family: `pipe`, `close`, `read`, `write` on
//! descriptors (per VM, inherited by fork) that name one end of a pipe in
//! the region (a ring of `PIPE_CAPACITY` bytes).

use wisp_abi::errno::*;
use wisp_abi::family::limits::*;

use super::region::{fd_entry, fd_pipe, lock, release_end, wake_waiters, Inner};
use super::{CallResult, Family, Waiter};

impl Family {
    pub fn pipe(&self) -> CallResult {
        let l = lock(&self.map);
        let inner = &mut *l.inner;
        let fds = &inner.members[self.me].fds;
        let mut free = (0..MAX_FDS).filter(|&i| fds[i] == 0);
        let (Some(r), Some(w)) = (free.next(), free.next()) else { return Err(EMFILE) };
        let Some(p) = inner.pipes.iter().position(|p| p.used == 0) else { return Err(ENOSPC) };
        let pipe = &mut inner.pipes[p];
        (pipe.used, pipe.readers, pipe.writers, pipe.head, pipe.len) = (1, 1, 1, 0, 0);
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
        release_end(l.inner, f);
        wake_waiters(&self.map, l.inner);
        Ok((0, 0))
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
        self.blocking(nowait.then_some(EAGAIN), w, |inner, me| {
            let p = match Self::pipe_of(inner, me, fd, 0) {
                Ok(p) => p,
                Err(e) => return Some(Err(e)),
            };
            let pipe = &mut inner.pipes[p];
            pipe.len = pipe.len.min(PIPE_CAPACITY as u32); // never trust shared state blindly
            if pipe.len == 0 {
                return (pipe.writers == 0 || max == 0).then_some(Ok((0, 0)));
            }
            let n = max.min(pipe.len as usize);
            let head = pipe.head as usize % PIPE_CAPACITY;
            let first = n.min(PIPE_CAPACITY - head);
            out.extend_from_slice(&pipe.buf[head..head + first]);
            out.extend_from_slice(&pipe.buf[..n - first]);
            pipe.head = ((head + n) % PIPE_CAPACITY) as u32;
            pipe.len -= n as u32;
            wake_waiters(&self.map, inner);
            Some(Ok((n as i64, 0)))
        })
    }

    /// Write `data` to descriptor `fd`: all of it (blocking as needed), or
    /// what fits with `nowait`. Writes up to `PIPE_BUF` are atomic.
    pub fn write(&self, fd: u64, data: &[u8], nowait: bool, w: &Waiter) -> CallResult {
        let mut done = 0usize;
        loop {
            let r = self.blocking(nowait.then_some(EAGAIN), w, |inner, me| {
                let p = match Self::pipe_of(inner, me, fd, 1) {
                    Ok(p) => p,
                    Err(e) => return Some(Err(e)),
                };
                let pipe = &mut inner.pipes[p];
                if pipe.readers == 0 {
                    return Some(Err(EPIPE));
                }
                let rest = &data[done..];
                pipe.len = pipe.len.min(PIPE_CAPACITY as u32);
                let space = PIPE_CAPACITY - pipe.len as usize;
                let need = if rest.len() <= PIPE_BUF { rest.len() } else { 1 };
                if space < need.max(1) {
                    return None;
                }
                let n = rest.len().min(space);
                let tail = (pipe.head as usize + pipe.len as usize) % PIPE_CAPACITY;
                let first = n.min(PIPE_CAPACITY - tail);
                pipe.buf[tail..tail + first].copy_from_slice(&rest[..first]);
                pipe.buf[..n - first].copy_from_slice(&rest[first..n]);
                pipe.len += n as u32;
                wake_waiters(&self.map, inner);
                Some(Ok(n))
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
