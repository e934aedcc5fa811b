//! User ids of VMM processes: one of its own per VM, from a fixed range
//! (a forked VM keeps its family root's, as its process does).
//!
//! A user id is never handed out while a live process holds it. What this
//! daemon run gave out is remembered until it is given back ([`Uids::free`]),
//! and re-adopted VMs' ids are counted in ([`Uids::mark_used`]); but a
//! process can hold an id its VM's record no longer does — a forked VM not
//! adopted yet, a killed one not gone yet, one a previous daemon left, one
//! someone else started — so [`Uids::alloc`] also skips every id of the
//! range that a process of `/proc` holds (a zombie counts: it is not gone
//! yet). A process's effective user id is the owner of its `/proc/<pid>`
//! directory (one `stat`); for processes whose effective id is root — who
//! may hold any real or saved id, a set-user-id program run by a VM user
//! for one — the real, effective, saved and file-system ids of
//! `/proc/<pid>/status` are read as well. Not seen: a thread whose ids
//! differ from its process's (raw `setresuid` in one thread), and a
//! process that holds an id of the range only as its real or saved one
//! while its effective id is another unprivileged one.
//!
//! The scan is kept off the boot path (`alloc` runs when a pooled shell is
//! spawned), and one result serves the allocations of the next
//! [`SCAN_MAX_AGE`], so there is at most one scan a second however fast
//! VMs come and go. An id given back meanwhile counts as held until a
//! later scan shows it is not (its VM's processes may still run). The
//! daemon's own processes get ids it has handed out, and a forked VM's
//! come from a process that holds it, so what a result that old can miss
//! is only someone else's process started since — as one started between
//! any scan and the new VMM process taking its id would be missed.
//!
//! Cost, measured on the development machine (2 vCPUs, PVM) with 3,000
//! processes each under a VMM user id of its own (as `bench-density` makes
//! them) and the machine's own (~100 root-owned): ~25-30 ms a scan; with
//! 1,500 of the 3,000 root-owned instead (a `status` read each) ~120 ms;
//! reading every process's `status` would take ~170 ms.

use std::collections::HashSet;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::procfs::status_ids;

/// First user id given to VMM processes.
pub const UID_BASE: u32 = 1_000_000;
/// Number of user ids in the range.
pub const UID_COUNT: u32 = 1_000_000;

/// How long one scan of `/proc` serves allocations.
const SCAN_MAX_AGE: Duration = Duration::from_secs(1);

/// Why no user id could be given.
#[derive(Debug, thiserror::Error)]
pub enum UidError {
    /// Every user id of the range is taken.
    #[error("no free user id for a VMM process")]
    Exhausted,
    /// The processes' ids could not be read.
    #[error("cannot tell which user ids processes hold (reading /proc): {0}")]
    Scan(io::Error),
}

fn in_range(uid: u32) -> bool {
    (UID_BASE..UID_BASE + UID_COUNT).contains(&uid)
}

/// The allocator.
#[derive(Default)]
pub struct Uids {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    used: HashSet<u32>,
    next: u32,
    /// Ids of the range processes held at the last scan, and when it ran
    /// (none: scan at the next allocation).
    held: Option<(HashSet<u32>, Instant)>,
}

impl Uids {
    /// Make `uid` the next candidate (tests).
    #[cfg(test)]
    fn rewind(&self, uid: u32) {
        self.inner.lock().unwrap().next = uid - UID_BASE;
    }

    /// Scan at the next allocation, as after [`SCAN_MAX_AGE`] (tests).
    #[cfg(test)]
    fn expire(&self) {
        self.inner.lock().unwrap().held = None;
    }

    /// A user id no live VM has and no live process holds.
    pub fn alloc(&self) -> Result<u32, UidError> {
        let mut u = self.inner.lock().unwrap();
        if u.held.as_ref().is_none_or(|(_, at)| at.elapsed() >= SCAN_MAX_AGE) {
            u.held = Some((held_uids(Path::new("/proc")).map_err(UidError::Scan)?, Instant::now()));
        }
        let Inner { used, next, held } = &mut *u;
        let held = &held.as_ref().expect("scanned above").0;
        for _ in 0..UID_COUNT {
            let uid = UID_BASE + *next % UID_COUNT;
            *next = next.wrapping_add(1);
            if !held.contains(&uid) && used.insert(uid) {
                return Ok(uid);
            }
        }
        Err(UidError::Exhausted)
    }

    /// Give `uid` back. Processes may still hold it: it counts as held
    /// until the next scan.
    pub fn free(&self, uid: u32) {
        let mut u = self.inner.lock().unwrap();
        u.used.remove(&uid);
        if let Some((held, _)) = u.held.as_mut() {
            held.insert(uid);
        }
    }

    /// Count `uid` as taken (a VM re-adopted after a restart).
    pub fn mark_used(&self, uid: u32) {
        self.inner.lock().unwrap().used.insert(uid);
    }
}

/// The user ids of the range that processes under `proc` (a procfs) hold:
/// the effective id of each (its directory's owner), and for those whose
/// effective id is root every id of its `status`. Processes that end
/// during the scan are skipped.
fn held_uids(proc: &Path) -> io::Result<HashSet<u32>> {
    let mut held = HashSet::new();
    for ent in std::fs::read_dir(proc)? {
        let ent = ent?;
        let name = ent.file_name();
        if !name.as_encoded_bytes().iter().all(u8::is_ascii_digit) {
            continue;
        }
        let Ok(meta) = ent.metadata() else { continue };
        let euid = meta.uid();
        if in_range(euid) {
            held.insert(euid);
        } else if euid == 0 {
            let Ok(status) = std::fs::read_to_string(ent.path().join("status")) else { continue };
            held.extend(status_ids(&status, "Uid:").unwrap_or_default().into_iter().filter(|&u| in_range(u)));
        }
    }
    Ok(held)
}

/// The VMM-process user id that owns `dir`, if it is one of the range.
pub fn dir_uid(dir: &Path) -> Option<u32> {
    std::fs::metadata(dir).ok().map(|m| m.uid()).filter(|&u| in_range(u))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Child;

    #[test]
    fn the_pid_namespace_holders_id_is_outside_the_range() {
        assert!(!(UID_BASE..UID_BASE + UID_COUNT).contains(&crate::pidns::HOLDER_UID));
    }

    #[test]
    fn ids_are_unique_until_freed() {
        let u = Uids::default();
        let (a, b) = (u.alloc().unwrap(), u.alloc().unwrap());
        assert!(a != b && in_range(a));
        u.mark_used(UID_BASE + 2);
        let c = u.alloc().unwrap();
        assert!(c != UID_BASE + 2 && c != a && c != b);
        u.free(a);
        assert_ne!(u.alloc().unwrap(), b);
    }

    /// `cat` under real, effective and saved user ids (`setpriv` options),
    /// once it runs with them (it ends when its stdin closes).
    fn holder(ids: &[&str], uid: u32) -> Child {
        crate::procfs::spawn_as(ids, &["cat"], |cmd, status| {
            cmd.starts_with(b"cat\0") && status_ids(status, "Uid:").is_some_and(|ids| ids.contains(&uid))
        })
    }

    fn end(mut c: Child) {
        drop(c.stdin.take());
        c.wait().unwrap();
    }

    #[test]
    fn an_id_a_process_holds_is_skipped() {
        // Ids near the top of the range, which a test daemon does not reach
        // (process.rs's test uses the last one).
        let (a, b, c) = (UID_BASE + UID_COUNT - 10, UID_BASE + UID_COUNT - 9, UID_BASE + UID_COUNT - 8);
        // Held as the effective id, or only as the real and saved one by a
        // process whose effective id is root (found through its status).
        let ha = holder(&["--reuid", &a.to_string()], a);
        let hb = holder(&["--ruid", &b.to_string(), "--euid", "0"], b);
        let held = held_uids(Path::new("/proc")).unwrap();
        assert!(held.contains(&a) && held.contains(&b), "{held:?}");
        let u = Uids::default();
        u.rewind(a);
        assert_eq!(u.alloc().unwrap(), c, "{a} and {b} are held");
        // Given back while a process still holds it (a forked VM not
        // adopted yet): not handed out again, by the same scan's result
        // (taken before that process began) nor by a new one.
        let hc = holder(&["--reuid", &c.to_string()], c);
        u.free(c);
        u.rewind(c);
        assert_eq!(u.alloc().unwrap(), c + 1);
        u.free(c + 1);
        u.expire();
        u.rewind(c);
        assert_eq!(u.alloc().unwrap(), c + 1);
        for h in [ha, hb, hc] {
            end(h);
        }
        // Nobody holds them any more: handed out after the next scan.
        u.rewind(a);
        assert_eq!(u.alloc().unwrap(), c + 2, "the old result still counts");
        u.free(c + 1);
        u.free(c + 2);
        u.expire();
        u.rewind(a);
        assert_eq!([u.alloc().unwrap(), u.alloc().unwrap(), u.alloc().unwrap()], [a, b, c]);
    }
}
