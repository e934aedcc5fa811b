//! The VM table: entries by id and names, lookup by id, unique id prefix or
//! name, and the condition variable that wakes those waiting for an exit.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::Child;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use wisp_api::{ExitInfo, VmInfo, VmState};

use super::error::ActionError;
use super::uids::dir_uid;
use crate::forward::Forward;

/// One VM.
pub struct Entry {
    /// What the API shows.
    pub info: VmInfo,
    /// Its directory.
    pub dir: PathBuf,
    /// Its VMM process, if this daemon spawned it (to reap it).
    pub child: Option<Child>,
    /// Its VMM process's pidfd, watched for the exit.
    pub pidfd: Option<OwnedFd>,
    /// An open control connection to the VMM process, reused by quick requests.
    pub ctl: Option<UnixStream>,
    /// Host ports forwarded to the VM (closed when it exits).
    pub forwards: Vec<Forward>,
    /// For a family's root: the daemon's end of the family's uplink, on
    /// which forked VMM processes announce themselves.
    pub uplink: Option<OwnedFd>,
    /// Its VMM process's pid in the VMM processes' PID namespace (what
    /// that process and its family call it), read when it was entered.
    pub ns_pid: Option<u32>,
    /// The user id owning its directory, read once when it is inserted.
    uid: Option<u32>,
    /// Being removed (a batch removal killed it): its end is not written
    /// to its record, which goes next.
    pub removing: bool,
    /// The digest of the last snapshot taken of it: the base of the next
    /// incremental one.
    pub last_snapshot: Option<[u8; 32]>,
    /// Moved to another daemon and being removed here: not found by any
    /// name, id or prefix, nor listed (see [`Table::hide`]).
    hidden: bool,
    /// Being migrated: pauses, resumes, snapshots and other migrations are
    /// refused meanwhile (a snapshot would take the dirty log the
    /// migration's increment is made of).
    pub migrating: bool,
    /// A recycled run that has ended: its place in its recycling group was
    /// given back then (not again when it is removed).
    pub released: bool,
}

impl Entry {
    /// A fresh entry for a VM.
    pub fn new(info: VmInfo, dir: PathBuf, child: Option<Child>, pidfd: Option<OwnedFd>) -> Entry {
        Entry { info, dir, child, pidfd, ctl: None, forwards: Vec::new(), uplink: None, ns_pid: None, uid: None, removing: false, last_snapshot: None, hidden: false, migrating: false, released: false }
    }
}

/// The VMs and their names.
#[derive(Default)]
pub struct Table {
    /// Every VM by id.
    pub by_id: HashMap<String, Entry>,
    /// Names to ids; a name reserved by a create in progress maps to "".
    names: HashMap<String, String>,
    /// Creates admitted and in progress: how many, and their guest RAM
    /// (`quota`).
    pub(super) pending: (usize, u64),
    /// VMs not exited and their guest RAM (kept as VMs come, end and go:
    /// no look at every VM on a create).
    pub(super) live: (usize, u64),
    /// VMs per directory owner (forked VMs share their family's user id).
    uids: HashMap<u32, usize>,
    /// VMs per family root (the root itself counted), and how many of them
    /// have not exited.
    families: HashMap<String, (usize, usize)>,
}

/// The root of the family `info` belongs to (a VM that never forked is the
/// root of its own).
pub fn root_of(info: &VmInfo) -> &str {
    info.family.as_deref().unwrap_or(&info.id)
}

impl Table {
    /// Find a VM by id, unique id prefix (3+ digits), or name.
    pub fn lookup(&self, key: &str) -> Result<String, ActionError> {
        if self.by_id.get(key).is_some_and(|e| !e.hidden) {
            return Ok(key.to_string());
        }
        if let Some(id) = self.names.get(key).filter(|id| !id.is_empty()) {
            return Ok(id.clone());
        }
        let matches: Vec<&String> = self.by_id.iter().filter(|(id, e)| key.len() >= 3 && id.starts_with(key) && !e.hidden).map(|(id, _)| id).collect();
        match matches.len() {
            1 => Ok(matches[0].clone()),
            0 => Err(ActionError::NotFound(key.to_string())),
            _ => Err(ActionError::Ambiguous(key.to_string())),
        }
    }

    /// The entry `key` names, with its id.
    pub fn find(&self, key: &str) -> Result<(String, &Entry), ActionError> {
        let id = self.lookup(key)?;
        let e = &self.by_id[&id];
        Ok((id, e))
    }

    /// All VMs, oldest first.
    pub fn list(&self) -> Vec<VmInfo> {
        let mut v: Vec<VmInfo> = self.by_id.values().filter(|e| !e.hidden).map(|e| e.info.clone()).collect();
        v.sort_by(|a, b| a.created_ms.cmp(&b.created_ms).then(a.id.cmp(&b.id)));
        v
    }

    /// Every VM the API shows (not the hidden ones), in no order.
    pub fn shown(&self) -> impl Iterator<Item = &Entry> {
        self.by_id.values().filter(|e| !e.hidden)
    }

    /// Hold `name` for a VM being created.
    pub fn reserve_name(&mut self, name: &str) -> Result<(), ActionError> {
        if self.names.contains_key(name) {
            return Err(ActionError::NameInUse(name.to_string()));
        }
        self.names.insert(name.to_string(), String::new());
        Ok(())
    }

    /// Let go of a name reserved for a create that failed (a name that
    /// names a VM stays).
    pub fn release_name(&mut self, name: &str) {
        if self.names.get(name).is_some_and(String::is_empty) {
            self.names.remove(name);
        }
    }

    /// Add a VM (its name, if any, now names it, unless another VM in the
    /// table has it already).
    pub fn insert(&mut self, mut e: Entry) {
        // The same id again replaces the entry: counted once.
        self.remove(&e.info.id.clone());
        e.uid = dir_uid(&e.dir);
        if let Some(u) = e.uid {
            *self.uids.entry(u).or_default() += 1;
        }
        let live = e.info.state != VmState::Exited;
        let f = self.families.entry(root_of(&e.info).to_string()).or_default();
        f.0 += 1;
        if live {
            f.1 += 1;
            self.live = (self.live.0 + 1, self.live.1.saturating_add(e.info.mem));
        }
        if let Some(n) = &e.info.name {
            let held = self.names.get(n).is_some_and(|id| id != &e.info.id && self.by_id.contains_key(id));
            if !held {
                self.names.insert(n.clone(), e.info.id.clone());
            }
        }
        self.by_id.insert(e.info.id.clone(), e);
    }

    /// Hide VM `id`, which goes on elsewhere (moved to another daemon)
    /// while its copy here is killed and removed: no key finds it and no
    /// list shows it, its name is free, and its end is not recorded; it
    /// still counts against the limits until it is removed.
    pub fn hide(&mut self, id: &str) {
        let Some(e) = self.by_id.get_mut(id) else { return };
        e.hidden = true;
        e.removing = true;
        if let Some(n) = &e.info.name {
            if self.names.get(n).is_some_and(|holder| holder == id) {
                self.names.remove(n);
            }
        }
    }

    /// Take VM `id` out, with its name (if the name is this VM's).
    pub fn remove(&mut self, id: &str) -> Option<Entry> {
        let e = self.by_id.remove(id)?;
        if let Some(u) = e.uid {
            if let Some(c) = self.uids.get_mut(&u) {
                *c -= 1;
                if *c == 0 {
                    self.uids.remove(&u);
                }
            }
        }
        let live = e.info.state != VmState::Exited;
        if live {
            self.live = (self.live.0.saturating_sub(1), self.live.1.saturating_sub(e.info.mem));
        }
        let root = root_of(&e.info);
        if let Some(f) = self.families.get_mut(root) {
            f.0 -= 1;
            f.1 -= live as usize;
            if f.0 == 0 {
                self.families.remove(root);
            }
        }
        if let Some(n) = &e.info.name {
            if self.names.get(n).is_some_and(|holder| holder == id) {
                self.names.remove(n);
            }
        }
        Some(e)
    }

    /// Whether a VM's directory is owned by `uid` (forked VMs share their
    /// family's).
    pub fn uid_in_use(&self, uid: u32) -> bool {
        self.uids.contains_key(&uid)
    }

    /// Record that VM `id` has exited (the one way a VM's state becomes
    /// `Exited` in the table). Returns its entry, or none if it is not
    /// there or had exited already.
    pub fn set_exited(&mut self, id: &str) -> Option<&mut Entry> {
        let e = self.by_id.get_mut(id)?;
        if e.info.state == VmState::Exited {
            return None;
        }
        e.info.state = VmState::Exited;
        self.live = (self.live.0.saturating_sub(1), self.live.1.saturating_sub(e.info.mem));
        if let Some(f) = self.families.get_mut(root_of(&e.info)) {
            f.1 -= 1;
        }
        Some(e)
    }

    /// How many VMs family `root` has (the root counted, if it is still
    /// there), and how many of them have not exited.
    pub fn family_count(&self, root: &str) -> (usize, usize) {
        self.families.get(root).copied().unwrap_or_default()
    }
}

/// The table behind its lock, and the exit condition.
#[derive(Default)]
pub struct VmTable {
    table: Mutex<Table>,
    exited: Condvar,
}

impl VmTable {
    /// Lock the table.
    pub fn lock(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap()
    }

    /// Wake every waiter: a VM has exited.
    pub fn notify_exit(&self) {
        self.exited.notify_all();
    }

    /// Wait until VM `key` has exited (or `timeout`).
    pub fn wait_exit(&self, key: &str, timeout: Option<Duration>) -> Result<ExitInfo, ActionError> {
        let id = self.lock().lookup(key)?;
        self.wait_exit_id(&id, timeout)
    }

    /// [`VmTable::wait_exit`] of the VM whose id is `id` (hidden or not).
    pub fn wait_exit_id(&self, id: &str, timeout: Option<Duration>) -> Result<ExitInfo, ActionError> {
        let id = id.to_string();
        let mut t = self.lock();
        let deadline = timeout.map(|d| Instant::now() + d);
        loop {
            match t.by_id.get(&id) {
                None => return Err(ActionError::Gone(id)),
                Some(e) if e.info.exit.is_some() => {
                    return Ok(e.info.exit.clone().unwrap_or(ExitInfo { code: 0, reason: String::new() }))
                }
                _ => {}
            }
            t = match deadline {
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return Err(ActionError::Timeout(id));
                    }
                    self.exited.wait_timeout(t, d - now).unwrap().0
                }
                None => self.exited.wait(t).unwrap(),
            };
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use wisp_api::VmState;

    /// A running VM of 16 MiB named `id`.
    pub(crate) fn info(id: &str) -> VmInfo {
        VmInfo {
            id: id.into(),
            name: None,
            image: "hello".into(),
            args: vec![],
            mem: 16 << 20,
            state: VmState::Running,
            pid: 1,
            created_ms: 0,
            exit: None,
            boot_us: None,
            first_line_us: None,
            boot_trace: None,
            ip: None,
            ports: vec![],
            links: Vec::new(),
            net_peers: false,
            parent: None,
            family: None,
            limits: None,
            tenant: None,
            group: None,
        }
    }

    fn vm(id: &str, name: Option<&str>) -> Entry {
        let info = VmInfo { name: name.map(str::to_string), ..info(id) };
        Entry::new(info, PathBuf::from("/nonexistent"), None, None)
    }

    #[test]
    fn lookup_by_id_prefix_and_name() {
        let mut t = Table::default();
        t.insert(vm("abc123000000", Some("one")));
        t.insert(vm("abc456000000", None));
        assert_eq!(t.lookup("abc123000000").unwrap(), "abc123000000");
        assert_eq!(t.lookup("one").unwrap(), "abc123000000");
        assert_eq!(t.lookup("abc4").unwrap(), "abc456000000");
        assert!(matches!(t.lookup("abc"), Err(ActionError::Ambiguous(k)) if k == "abc"));
        assert!(matches!(t.lookup("ab"), Err(ActionError::NotFound(_))), "prefixes need 3 digits");
        assert!(matches!(t.lookup("two"), Err(ActionError::NotFound(_))));
        // A reserved name is taken but names no VM yet.
        t.reserve_name("two").unwrap();
        assert!(matches!(t.reserve_name("two"), Err(ActionError::NameInUse(_))));
        assert!(matches!(t.reserve_name("one"), Err(ActionError::NameInUse(_))));
        assert!(matches!(t.lookup("two"), Err(ActionError::NotFound(_))));
        t.release_name("two");
        t.reserve_name("two").unwrap();
        // Removing a VM frees its name.
        assert!(t.remove("abc123000000").is_some());
        t.reserve_name("one").unwrap();
        assert_eq!(t.list().len(), 1);
    }

    #[test]
    fn a_hidden_vm_is_found_by_no_key_but_counts_until_removed() {
        let mut t = Table::default();
        t.insert(vm("abc123000000", Some("moved")));
        t.insert(vm("def456000000", None));
        t.hide("abc123000000");
        for key in ["abc123000000", "moved", "abc1", "abc"] {
            assert!(matches!(t.lookup(key), Err(ActionError::NotFound(_))), "{key} finds a hidden VM");
        }
        assert_eq!(t.list().iter().map(|v| v.id.as_str()).collect::<Vec<_>>(), ["def456000000"]);
        // Its name is free at once; its RAM counts until it is removed.
        t.reserve_name("moved").unwrap();
        assert_eq!(t.live, (2, 32 << 20));
        assert!(t.by_id["abc123000000"].removing, "its end is not recorded");
        assert!(t.remove("abc123000000").is_some());
        assert_eq!(t.live, (1, 16 << 20));
    }

    #[test]
    fn names_are_unique_and_ids_come_first() {
        let mut t = Table::default();
        t.insert(vm("abc123000000", Some("web")));
        assert!(matches!(t.reserve_name("web"), Err(ActionError::NameInUse(n)) if n == "web"));
        // Order: a whole id, then a name, then a unique id prefix (3+).
        t.insert(vm("def456000000", Some("abc123000000")));
        assert_eq!(t.lookup("abc123000000").unwrap(), "abc123000000", "an id is not hidden by a name");
        assert_eq!(t.lookup("def").unwrap(), "def456000000");
        t.insert(vm("fed000000000", Some("abc")));
        assert_eq!(t.lookup("abc").unwrap(), "fed000000000", "a name comes before an id prefix");
        assert_eq!(t.lookup("abc1").unwrap(), "abc123000000");
        // A name reserved by a create in progress names nothing yet: the
        // key is still an id prefix.
        t.reserve_name("def").unwrap();
        assert_eq!(t.lookup("def").unwrap(), "def456000000");
        // Names are exact: no prefixes, no case folding.
        for key in ["we", "WEB", "web ", ""] {
            assert!(matches!(t.lookup(key), Err(ActionError::NotFound(_))), "{key:?}");
        }
        assert_eq!(t.find("web").unwrap().1.info.id, "abc123000000");
    }

    #[test]
    fn a_name_is_freed_only_by_its_own_vm() {
        let mut t = Table::default();
        t.insert(vm("aaa000000000", Some("x")));
        // A second VM recorded with the same name (as a re-adoption may
        // read it) does not take the name from the first.
        t.insert(vm("bbb000000000", Some("x")));
        assert_eq!(t.lookup("x").unwrap(), "aaa000000000");
        // Removing the second leaves the first its name.
        assert!(t.remove("bbb000000000").is_some());
        assert_eq!(t.lookup("x").unwrap(), "aaa000000000");
        assert!(matches!(t.reserve_name("x"), Err(ActionError::NameInUse(_))));
        // Letting go of a reservation never frees a VM's name.
        t.release_name("x");
        assert_eq!(t.lookup("x").unwrap(), "aaa000000000");
        assert!(matches!(t.reserve_name("x"), Err(ActionError::NameInUse(_))));
        // Once its VM is removed the name is free; the create that reserves
        // it makes its VM the name's.
        assert!(t.remove("aaa000000000").is_some());
        assert!(t.remove("aaa000000000").is_none());
        t.reserve_name("x").unwrap();
        t.insert(vm("ccc000000000", Some("x")));
        assert_eq!(t.lookup("x").unwrap(), "ccc000000000");
        assert_eq!(t.list().len(), 1);
    }

    #[test]
    fn counts_follow_vms_as_they_come_end_and_go() {
        let mut t = Table::default();
        t.insert(vm("aaa000000000", None));
        let kid = VmInfo { family: Some("aaa000000000".into()), parent: Some("aaa000000000".into()), ..info("bbb000000000") };
        t.insert(Entry::new(kid, PathBuf::from("/nonexistent"), None, None));
        t.insert(vm("ccc000000000", None));
        assert_eq!(t.load(), (3, 3 * (16 << 20)));
        assert_eq!(t.family_count("aaa000000000"), (2, 2));
        assert_eq!(t.family_count("ccc000000000"), (1, 1));
        // An exit is counted once; the VM stays in its family until removed.
        assert!(t.set_exited("bbb000000000").is_some());
        assert!(t.set_exited("bbb000000000").is_none());
        assert_eq!(t.family_count("aaa000000000"), (2, 1));
        assert_eq!(t.load(), (2, 2 * (16 << 20)));
        // The root goes first, its child after: the family is gone with both.
        t.remove("aaa000000000");
        assert_eq!(t.family_count("aaa000000000"), (1, 0));
        t.remove("bbb000000000");
        assert_eq!(t.family_count("aaa000000000"), (0, 0));
        // The same id inserted again is counted once.
        t.insert(vm("ccc000000000", None));
        assert_eq!((t.load(), t.family_count("ccc000000000")), ((1, 16 << 20), (1, 1)));
        t.remove("ccc000000000");
        assert_eq!((t.load(), t.families.len(), t.uids.len()), ((0, 0), 0, 0));
    }

    #[test]
    fn waiting_for_an_exit() {
        let vms = &VmTable::default();
        vms.lock().insert(vm("abc123000000", None));
        let r = vms.wait_exit("abc123000000", Some(Duration::from_millis(10)));
        assert!(matches!(r, Err(ActionError::Timeout(id)) if id == "abc123000000"));
        std::thread::scope(|s| {
            let (tx, rx) = std::sync::mpsc::channel();
            let waiter = s.spawn(move || {
                tx.send(rustix::thread::gettid()).unwrap();
                vms.wait_exit("abc", None)
            });
            until_asleep(rx.recv().unwrap());
            vms.lock().by_id.get_mut("abc123000000").unwrap().info.exit = Some(ExitInfo { code: 7, reason: "exited".into() });
            vms.notify_exit();
            assert_eq!(waiter.join().unwrap().unwrap().code, 7);
        });
        vms.lock().insert(vm("def000000000", None));
        std::thread::scope(|s| {
            let (tx, rx) = std::sync::mpsc::channel();
            let waiter = s.spawn(move || {
                tx.send(rustix::thread::gettid()).unwrap();
                vms.wait_exit("def", None)
            });
            until_asleep(rx.recv().unwrap());
            vms.lock().remove("def000000000");
            vms.notify_exit();
            assert!(matches!(waiter.join().unwrap(), Err(ActionError::Gone(_))));
        });
    }

    /// Wait (10 s at most) until thread `tid` of this process sleeps. For
    /// a waiter with nobody else holding the table's lock, that is in the
    /// condition variable: the exit is then signalled to a blocked waiter,
    /// not seen at once.
    fn until_asleep(tid: rustix::thread::Pid) {
        let path = format!("/proc/self/task/{}/stat", tid.as_raw_nonzero());
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let stat = std::fs::read_to_string(&path).unwrap_or_default();
            // The state follows the thread's name, in parentheses.
            if stat.rsplit(')').next().and_then(|s| s.split_whitespace().next()) == Some("S") {
                return;
            }
            assert!(Instant::now() < deadline, "the waiter never blocked: {stat}");
            std::thread::yield_now();
        }
    }
}
