//! Message queues (System V style): `msgget` by key, `msgsnd`, `msgrcv`
//! by type (0, t or -t), `msgrmid`. The region keeps which queues exist
//! (key, generation); the messages are in the queue's ring on the
//! guest-visible page, which guests use themselves while nothing blocks
//! (`wisp_abi::family::rings::QueueRing`). This is the slow path, with the
//! same rules.

use std::sync::atomic::Ordering;

use wisp_abi::errno::*;
use wisp_abi::family::flags;
use wisp_abi::family::limits::*;
use wisp_abi::family::rings::{Blocked, NoMessage, QueueRing, WAIT_READER, WAIT_WRITER};

use super::region::{lock, rings, wake_waiters, Inner};
use super::{by_key, id_index, ipc_id, next_gen, Attempt, CallResult, Family, Waiter};

impl Family {
    pub fn msgget(&self, key: i64, flg: u64) -> CallResult {
        let l = lock(&self.map);
        let inner = &mut *l.inner;
        if let Some(i) = by_key(key, flg, || inner.queues.iter().position(|q| q.used != 0 && q.key == key))? {
            return Ok((ipc_id(inner.queues[i].gen, i), 0));
        }
        let Some(i) = inner.queues.iter().position(|q| q.used == 0) else { return Err(ENOSPC) };
        let gen = next_gen(inner);
        let q = &mut inner.queues[i];
        (q.used, q.gen, q.key) = (1, gen, key);
        let id = ipc_id(gen, i);
        self.reset_queue(inner, i, id as u64);
        Ok((id, 0))
    }

    /// The index of queue `id`, if it exists.
    fn queue(inner: &Inner, id: u64) -> Option<usize> {
        let i = id_index(id);
        let q = inner.queues.get(i)?;
        (q.used != 0 && q.gen as u64 == id >> 8).then_some(i)
    }

    /// The ring of queue `id` (what a blocked call watches).
    fn queue_ring(&self, id: u64) -> Option<&QueueRing> {
        let i = Self::queue(lock(&self.map).inner, id)?;
        Some(&rings(&self.map).queues[i])
    }

    pub fn msgsnd(&self, id: u64, data: &[u8], mtype: i64, nowait: bool, w: &Waiter) -> CallResult {
        if mtype <= 0 || data.len() > MSG_MAX {
            return Err(EINVAL);
        }
        let mut seen = false;
        let watch = self.queue_ring(id).map(|r| &r.count);
        self.blocking_on(nowait.then_some(EAGAIN), w, watch, |inner, _, last| {
            let Some(i) = Self::queue(inner, id) else {
                return Attempt::Done(Err(if seen { EIDRM } else { EINVAL }));
            };
            seen = true;
            let ring = &rings(&self.map).queues[i];
            if last {
                ring.waiters.fetch_or(WAIT_WRITER, Ordering::SeqCst);
            }
            match self.with_ring(inner, ring, |r| r.send(mtype, data)) {
                None => Attempt::Busy,
                Some(Ok(())) => Attempt::Done(Ok((0, 0))),
                Some(Err(Blocked::Wait)) => Attempt::Wait,
                Some(Err(Blocked::Corrupt)) => Attempt::Done(Err(self.spoilt(inner, i))),
            }
        })
    }

    pub fn msgrcv(&self, id: u64, max: usize, msgtyp: i64, flg: u32, w: &Waiter, out: &mut Vec<u8>) -> CallResult {
        out.clear();
        out.resize(max.min(MSG_MAX), 0);
        let mut seen = false;
        let nowait = flg & flags::NOWAIT != 0;
        let truncate = flg & flags::NOERROR != 0;
        let watch = self.queue_ring(id).map(|r| &r.count);
        let r = self.blocking_on(nowait.then_some(ENOMSG), w, watch, |inner, _, last| {
            let Some(i) = Self::queue(inner, id) else {
                return Attempt::Done(Err(if seen { EIDRM } else { EINVAL }));
            };
            seen = true;
            let ring = &rings(&self.map).queues[i];
            if last {
                ring.waiters.fetch_or(WAIT_READER, Ordering::SeqCst);
            }
            match self.with_ring(inner, ring, |r| r.receive(msgtyp, out, truncate)) {
                None => Attempt::Busy,
                Some(Ok(got)) => Attempt::Done(Ok(got)),
                Some(Err(NoMessage::Wait)) => Attempt::Wait,
                Some(Err(NoMessage::TooBig)) => Attempt::Done(Err(E2BIG)),
                Some(Err(NoMessage::Corrupt)) => Attempt::Done(Err(self.spoilt(inner, i))),
            }
        });
        let n = r.map(|(n, _)| n).unwrap_or(0);
        out.truncate(n);
        r.map(|(n, t)| (n as i64, t as u64))
    }

    /// Queue `i`'s ring was written over: it starts empty again (what it
    /// held is lost) and the call that found it fails with `EIO`.
    fn spoilt(&self, inner: &mut Inner, i: usize) -> i64 {
        self.reset_queue(inner, i, ipc_id(inner.queues[i].gen, i) as u64);
        wake_waiters(&self.map, inner);
        EIO
    }

    /// Queue `i`'s ring starts empty, serving `id`: under its lock, so that
    /// a guest still copying into it (a stale id, a torn queue) finishes
    /// first; a lock held past the monitor's wait is taken over.
    fn reset_queue(&self, inner: &mut Inner, i: usize, id: u64) {
        let ring = &rings(&self.map).queues[i];
        if self.with_ring(inner, ring, |r| Ok::<(), ()>(r.reset(id, false))).is_none() {
            ring.reset(id, true);
        }
    }

    pub fn msgrmid(&self, id: u64) -> CallResult {
        let l = lock(&self.map);
        let Some(i) = Self::queue(l.inner, id) else { return Err(EINVAL) };
        l.inner.queues[i].used = 0;
        // Under the ring's lock: a guest's fast path checks the queue is
        // still there with the lock held.
        let ring = &rings(&self.map).queues[i];
        let _ = self.with_ring(l.inner, ring, |r| Ok::<(), ()>(r.live.store(0, Ordering::SeqCst)));
        ring.live.store(0, Ordering::SeqCst);
        wake_waiters(&self.map, l.inner);
        Ok((0, 0))
    }
}
