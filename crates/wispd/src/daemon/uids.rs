//! User ids of VMM processes: one of its own per VM, from a fixed range
//! (a forked VM keeps its family root's, as its process does).

use std::collections::HashSet;
use std::path::Path;
use std::sync::Mutex;

/// First user id given to VMM processes.
pub const UID_BASE: u32 = 1_000_000;
/// Number of user ids in the range.
pub const UID_COUNT: u32 = 1_000_000;

/// Every user id of the range is taken.
#[derive(Debug, thiserror::Error)]
#[error("no free user id for a VMM process")]
pub struct NoFreeUid;

/// The allocator.
#[derive(Default)]
pub struct Uids {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    used: HashSet<u32>,
    next: u32,
}

impl Uids {
    /// A user id no live VM has.
    pub fn alloc(&self) -> Result<u32, NoFreeUid> {
        let mut u = self.inner.lock().unwrap();
        for _ in 0..UID_COUNT {
            let uid = UID_BASE + u.next % UID_COUNT;
            u.next = u.next.wrapping_add(1);
            if u.used.insert(uid) {
                return Ok(uid);
            }
        }
        Err(NoFreeUid)
    }

    /// Give `uid` back.
    pub fn free(&self, uid: u32) {
        self.inner.lock().unwrap().used.remove(&uid);
    }

    /// Count `uid` as taken (a VM re-adopted after a restart).
    pub fn mark_used(&self, uid: u32) {
        self.inner.lock().unwrap().used.insert(uid);
    }
}

/// The VMM-process user id that owns `dir`, if it is one of the range.
pub fn dir_uid(dir: &Path) -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(dir).ok().map(|m| m.uid()).filter(|u| (UID_BASE..UID_BASE + UID_COUNT).contains(u))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unique_until_freed() {
        let u = Uids::default();
        let (a, b) = (u.alloc().unwrap(), u.alloc().unwrap());
        assert!(a != b && (UID_BASE..UID_BASE + UID_COUNT).contains(&a));
        u.mark_used(UID_BASE + 2);
        let c = u.alloc().unwrap();
        assert!(c != UID_BASE + 2 && c != a && c != b);
        u.free(a);
        assert_ne!(u.alloc().unwrap(), b);
    }
}
