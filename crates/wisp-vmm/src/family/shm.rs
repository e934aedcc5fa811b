//! Shared-memory segments: `shmget` allocates one in the family's arena (a
//! shared mapping every member inherits), `shmat` maps it into the guest at
//! `SHM_BASE + offset` (a KVM memory slot), `shmdt`, `shmrmid`.

use std::sync::Arc;

use wisp_abi::errno::*;
use wisp_abi::layout::{PAGE_SIZE, SHM_BASE, SHM_SIZE};

use super::region::{detach_segment, free_segment, lock, Inner, Segment};
use super::shared::SharedMap;
use super::{by_key, id_index, ipc_id, next_gen, CallResult, Family};

impl Family {
    /// Make the shared-memory arena (before the first fork or segment, so
    /// every later member inherits it).
    pub fn ensure_arena(&mut self) -> std::io::Result<()> {
        if self.arena.is_none() {
            self.arena = Some(Arc::new(SharedMap::new(SHM_SIZE as usize)?));
        }
        Ok(())
    }

    /// The segment `id` names, and its index.
    fn segment(inner: &mut Inner, id: u64) -> Option<(usize, &mut Segment)> {
        let idx = id_index(id);
        let s = inner.segments.get_mut(idx)?;
        (s.used != 0 && s.gen as u64 == id >> 8).then_some((idx, s))
    }

    pub fn shmget(&mut self, key: i64, size: u64, flg: u64) -> CallResult {
        if self.ensure_arena().is_err() {
            return Err(ENOMEM);
        }
        let l = lock(&self.map);
        let inner = &mut *l.inner;
        let existing = || inner.segments.iter().position(|s| s.used != 0 && s.removed == 0 && s.key == key);
        if let Some(i) = by_key(key, flg, existing)? {
            if size > inner.segments[i].size {
                return Err(EINVAL);
            }
            return Ok((ipc_id(inner.segments[i].gen, i), 0));
        }
        if size == 0 || size > SHM_SIZE {
            return Err(EINVAL);
        }
        let size = size.div_ceil(PAGE_SIZE) * PAGE_SIZE;
        let Some(i) = inner.segments.iter().position(|s| s.used == 0) else { return Err(ENOSPC) };
        // First fit in the arena.
        let mut used: Vec<(u64, u64)> =
            inner.segments.iter().filter(|s| s.used != 0).map(|s| (s.off, s.off + s.size)).collect();
        used.sort_unstable();
        let mut at = 0u64;
        for (s, e) in used {
            if s >= at + size {
                break;
            }
            at = at.max(e);
        }
        if at + size > SHM_SIZE {
            return Err(ENOMEM);
        }
        let gen = next_gen(inner);
        // New segments read as zeros, whoever used those pages before.
        if let Some(a) = &self.arena {
            a.discard(at as usize, size as usize);
        }
        inner.segments[i] = Segment { used: 1, gen, key, off: at, size, attached: 0, removed: 0 };
        Ok((ipc_id(gen, i), 0))
    }

    /// Attach segment `id`: `map_slot(slot, guest address, host address,
    /// size)` makes it visible to the guest (a KVM memory slot).
    pub fn shmat(&mut self, id: u64, map_slot: &mut dyn FnMut(u32, u64, u64, u64) -> bool) -> CallResult {
        let Some(arena) = self.arena.clone() else { return Err(EINVAL) };
        let l = lock(&self.map);
        let Some((idx, s)) = Self::segment(l.inner, id) else { return Err(EINVAL) };
        if s.removed != 0 {
            return Err(EIDRM);
        }
        let (off, size) = (s.off, s.size);
        if let Some(a) = self.attached.iter_mut().find(|a| a.0 == idx) {
            a.1 = a.1.saturating_add(1);
            return Ok(((SHM_BASE + off) as i64, size));
        }
        if off + size > arena.len() as u64
            || !map_slot(1 + idx as u32, SHM_BASE + off, arena.as_ptr() as u64 + off, size)
        {
            return Err(ENOMEM);
        }
        s.attached += 1;
        l.inner.members[self.me].shm |= 1 << idx;
        self.attached.push((idx, 1));
        Ok(((SHM_BASE + off) as i64, size))
    }

    /// Detach the segment attached at guest address `addr`.
    pub fn shmdt(&mut self, addr: u64, unmap_slot: &mut dyn FnMut(u32, u64)) -> CallResult {
        let l = lock(&self.map);
        let Some(pos) = self.attached.iter().position(|&(i, _)| {
            l.inner.segments.get(i).is_some_and(|s| s.used != 0 && SHM_BASE + s.off == addr)
        }) else {
            return Err(EINVAL);
        };
        let idx = self.attached[pos].0;
        self.attached[pos].1 -= 1;
        if self.attached[pos].1 > 0 {
            return Ok((0, 0));
        }
        self.attached.swap_remove(pos);
        unmap_slot(1 + idx as u32, addr);
        l.inner.members[self.me].shm &= !(1 << idx);
        detach_segment(self.arena.as_deref(), l.inner, idx);
        Ok((0, 0))
    }

    pub fn shmrmid(&self, id: u64) -> CallResult {
        let l = lock(&self.map);
        let Some((_, s)) = Self::segment(l.inner, id) else { return Err(EINVAL) };
        s.removed = 1;
        if s.attached == 0 {
            free_segment(self.arena.as_deref(), s);
        }
        Ok((0, 0))
    }

    /// Segments attached here, to map again in a forked child's new VM:
    /// (slot, guest address, host address, size).
    /// The family's guest-visible page comes first (a child always has it).
    pub fn attachments(&self) -> Vec<(u32, u64, u64, u64)> {
        use wisp_abi::family::rings::{RINGS_GPA, RINGS_SIZE};
        let page = (super::RINGS_SLOT, RINGS_GPA, super::region::rings(&self.map) as *const _ as u64, RINGS_SIZE);
        let Some(arena) = &self.arena else { return vec![page] };
        let l = lock(&self.map);
        let segments = self.attached.iter().filter_map(|&(i, _)| {
            let s = l.inner.segments.get(i)?;
            Some((1 + i as u32, SHM_BASE + s.off, arena.as_ptr() as u64 + s.off, s.size))
        });
        std::iter::once(page).chain(segments).collect()
    }
}
