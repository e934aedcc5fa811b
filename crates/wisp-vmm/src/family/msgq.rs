//! Message queues (System V style): `msgget` by key, `msgsnd`, `msgrcv`
//! by type (0, t or -t), `msgrmid`.

use wisp_abi::errno::*;
use wisp_abi::family::flags;
use wisp_abi::family::limits::*;

use super::region::{lock, wake_waiters, Inner, MsgEntry, Queue};
use super::{by_key, id_index, ipc_id, next_gen, CallResult, Family, Waiter};

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
        (q.used, q.gen, q.key, q.count, q.bytes) = (1, gen, key, 0, 0);
        Ok((ipc_id(gen, i), 0))
    }

    fn queue(inner: &mut Inner, id: u64) -> Option<&mut Queue> {
        let q = inner.queues.get_mut(id_index(id))?;
        (q.used != 0 && q.gen as u64 == id >> 8).then_some(q)
    }

    pub fn msgsnd(&self, id: u64, data: &[u8], mtype: i64, nowait: bool, w: &Waiter) -> CallResult {
        if mtype <= 0 || data.len() > MSG_MAX {
            return Err(EINVAL);
        }
        let mut seen = false;
        self.blocking(nowait.then_some(EAGAIN), w, |inner, _| {
            let Some(q) = Self::queue(inner, id) else { return Some(Err(if seen { EIDRM } else { EINVAL })) };
            seen = true;
            if q.count as usize >= QUEUE_MESSAGES || q.bytes as usize >= QUEUE_BYTES || q.bytes as usize + data.len() > QUEUE_BYTES {
                return None;
            }
            let off = q.bytes as usize;
            q.data[off..off + data.len()].copy_from_slice(data);
            q.entries[q.count as usize] = MsgEntry { mtype, len: data.len() as u64 };
            q.count += 1;
            q.bytes += data.len() as u32;
            wake_waiters(&self.map, inner);
            Some(Ok((0, 0)))
        })
    }

    pub fn msgrcv(&self, id: u64, max: usize, msgtyp: i64, flg: u32, w: &Waiter, out: &mut Vec<u8>) -> CallResult {
        out.clear();
        let mut seen = false;
        let nowait = flg & flags::NOWAIT != 0;
        self.blocking(nowait.then_some(ENOMSG), w, |inner, _| {
            let Some(q) = Self::queue(inner, id) else { return Some(Err(if seen { EIDRM } else { EINVAL })) };
            seen = true;
            let n = (q.count as usize).min(QUEUE_MESSAGES);
            let pick = match msgtyp {
                0 => (n > 0).then_some(0),
                t if t > 0 => q.entries[..n].iter().position(|e| e.mtype == t),
                t => {
                    let lim = t.checked_neg().unwrap_or(i64::MAX);
                    let best = q.entries[..n].iter().enumerate().filter(|(_, e)| e.mtype <= lim).min_by_key(|(_, e)| e.mtype);
                    best.map(|(i, _)| i)
                }
            }?;
            let e = q.entries[pick];
            let len = (e.len as usize).min(MSG_MAX);
            if len > max && flg & flags::NOERROR == 0 {
                return Some(Err(E2BIG));
            }
            let off: usize = q.entries[..pick].iter().map(|e| (e.len as usize).min(MSG_MAX)).sum();
            let bytes = (q.bytes as usize).min(QUEUE_BYTES);
            if off + len > bytes {
                // Torn by a member killed mid-update: drop the queue's contents.
                (q.count, q.bytes) = (0, 0);
                return Some(Err(EIDRM));
            }
            out.extend_from_slice(&q.data[off..off + len.min(max)]);
            q.data.copy_within(off + len..bytes, off);
            q.entries.copy_within(pick + 1..n, pick);
            q.count = n as u32 - 1;
            q.bytes = (bytes - len) as u32;
            wake_waiters(&self.map, inner);
            Some(Ok((len.min(max) as i64, e.mtype as u64)))
        })
    }

    pub fn msgrmid(&self, id: u64) -> CallResult {
        let l = lock(&self.map);
        let Some(q) = Self::queue(l.inner, id) else { return Err(EINVAL) };
        q.used = 0;
        wake_waiters(&self.map, l.inner);
        Ok((0, 0))
    }
}
