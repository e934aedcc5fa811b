//! Resource containment: one control group per VM family, beneath the
//! daemon's own group and nowhere else, in every hierarchy that has a
//! controller wisp uses (cgroup v2, v1, or the hybrid layouts between).
//!
//! A family's group is `<daemon's group>/wisp-<root id>` in each hierarchy
//! ([`layout`] finds them). The pool makes it for a VMM process before the
//! process exists; the process joins it itself, as root, before it
//! allocates guest RAM (memory is charged when it is first touched) and
//! before its jail closes ([`join`]); every VMM process a guest forks
//! inherits it. So the group holds the whole family and nothing else, and:
//!
//! - **memory**: one limit for guest RAM, the monitors and the family's
//!   copy-on-write growth (swap included where the host accounts it); a
//!   family over it meets the OOM killer inside its own group (v2: the
//!   whole family, `memory.oom.group`), never the daemon;
//! - **pids**: a bound on the family's processes and threads;
//! - **cpu**: a CFS quota (`cpus` × 100 ms per 100 ms), if asked;
//! - **teardown** ([`Cgroups::destroy`]): every process in the group is
//!   killed (`cgroup.kill` where the kernel has it, else freeze, SIGKILL
//!   each member through a pidfd, thaw), until the group is empty, then it
//!   is removed — nothing a VMM process started survives its family.
//!
//! The daemon also checks that a pid is in its family's group before it
//! adopts or kills it ([`Cgroups::holds`]).

mod group;
mod layout;
mod mount;

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

pub use layout::{group_name, Controller, Hierarchy, Layout, LayoutError};

/// The CFS period the quota is given for, in µs.
pub const CPU_PERIOD_US: u64 = 100_000;

/// What a family may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Bytes of memory (and memory + swap) for the whole family.
    pub memory: u64,
    /// Most tasks (processes and threads) in the family.
    pub pids: u64,
    /// CPU time per [`CPU_PERIOD_US`], in µs; none: no quota (a fair share).
    pub cpu_quota_us: Option<u64>,
}

/// Why a group could not be made, set, emptied or removed.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    /// The daemon's own group could not be placed.
    #[error(transparent)]
    Layout(#[from] LayoutError),
    /// Reading or writing a control file or directory.
    #[error("{}: {source}", path.display())]
    Io { path: PathBuf, source: io::Error },
    /// v2: controllers cannot be enabled for the daemon's children while
    /// other processes share its group.
    #[error(
        "cannot enable {controllers} for groups beneath {}: it also holds processes {others:?} \
         (start wispd in a control group of its own, e.g. a systemd service with Delegate=yes)",
        dir.display()
    )]
    Busy { dir: PathBuf, controllers: String, others: Vec<u32> },
    /// Not a family's id.
    #[error("'{0}' is no VM id")]
    BadId(String),
    /// Mounting the hierarchies in the daemon's own mount namespace.
    #[error("mount the cgroup hierarchies in this mount namespace: {0}")]
    Mount(String),
    /// Processes of a group that would not die.
    #[error("group {group}: processes {pids:?} still run after {secs} s")]
    Survivors { group: String, pids: Vec<u32>, secs: u64 },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> CgroupError + '_ {
    move |source| CgroupError::Io { path: path.to_path_buf(), source }
}

/// The families' groups of this daemon.
pub struct Cgroups {
    layout: Layout,
}

impl Cgroups {
    /// Find the daemon's own group in every hierarchy and make it ready to
    /// hold families' groups. On cgroup v2 the controllers must be enabled
    /// for the group's children (`cgroup.subtree_control`), which a group
    /// holding processes cannot do: the daemon then moves itself into a
    /// leaf, `<its group>/daemon`, if it is alone there (else it refuses).
    /// A daemon that finds itself in such a leaf (its own earlier move, or
    /// systemd's `DelegateSubgroup=daemon`) whose parent already enables
    /// what it needs takes the parent as its group. A daemon in a mount
    /// namespace of its own that shows no hierarchy (`ip netns exec`)
    /// mounts them there first.
    pub fn init() -> Result<Cgroups, CgroupError> {
        let read = |p: &str| fs::read_to_string(p).map_err(io_err(Path::new(p)));
        let proc_cgroup = read("/proc/self/cgroup")?;
        let mut found = match layout::find(&proc_cgroup, &read("/proc/self/mountinfo")?) {
            Err(LayoutError::NotMounted { .. }) if mount::mount_hierarchies(&proc_cgroup)? => {
                layout::find(&proc_cgroup, &read("/proc/self/mountinfo")?)?
            }
            r => r?,
        };
        let from_v1 = |c: Controller| found.iter().any(|f| !f.v2 && f.writable && f.controllers.iter().any(|n| n == c.name()));
        let need_v2: Vec<&str> = Controller::REQUIRED.into_iter().filter(|c| !from_v1(*c)).map(Controller::name).collect();
        if let Some(v2) = found.iter_mut().find(|f| f.v2 && f.writable) {
            let enabled = |dir: &Path| words(&fs::read_to_string(dir.join("cgroup.subtree_control")).unwrap_or_default());
            if let Some((path, dir)) = leaf_parent(&v2.path, &v2.dir, &need_v2, enabled) {
                (v2.path, v2.dir) = (path, dir);
            }
        }
        let avail = found
            .iter()
            .find(|f| f.v2 && f.writable)
            .map(|f| words(&fs::read_to_string(f.dir.join("cgroup.controllers")).unwrap_or_default()))
            .unwrap_or_default();
        let layout = layout::select(&found, &avail)?;
        if let Some(h) = layout.hierarchies.iter().find(|h| h.v2) {
            group::enable_v2(h)?;
        }
        Ok(Cgroups { layout })
    }

    /// Where each controller comes from, for the log.
    pub fn describe(&self) -> String {
        let one = |h: &Hierarchy| {
            let what: Vec<&str> = h.serves.iter().map(|c| c.name()).collect();
            let what = if what.is_empty() { "cgroup.kill".to_string() } else { what.join(",") };
            format!("{what} in {} ({})", h.dir.display(), if h.v2 { "v2" } else { "v1" })
        };
        self.layout.hierarchies.iter().map(one).collect::<Vec<_>>().join("; ")
    }

    /// Family `id`'s group directory in each hierarchy.
    fn dirs(&self, id: &str) -> Result<Vec<(&Hierarchy, PathBuf)>, CgroupError> {
        let name = group_name(id).ok_or_else(|| CgroupError::BadId(id.to_string()))?;
        Ok(self.layout.hierarchies.iter().map(|h| (h, h.dir.join(&name))).collect())
    }

    /// Make family `id`'s group (new, in every hierarchy) with `limits`.
    /// Returns the directories a VMM process joins ([`join`]). Nothing is
    /// left behind on failure.
    pub fn create(&self, id: &str, limits: &Limits) -> Result<Vec<PathBuf>, CgroupError> {
        let dirs = self.dirs(id)?;
        let mut made: Vec<PathBuf> = Vec::new();
        let r = (|| {
            for (h, d) in &dirs {
                fs::create_dir(d).map_err(io_err(d))?;
                made.push(d.clone());
                group::prepare(h, d)?;
                group::set_limits(h, d, limits)?;
            }
            Ok(())
        })();
        if let Err(e) = r {
            for d in made.iter().rev() {
                let _ = fs::remove_dir(d);
            }
            return Err(e);
        }
        Ok(made)
    }

    /// Set family `id`'s limits.
    pub fn set_limits(&self, id: &str, limits: &Limits) -> Result<(), CgroupError> {
        for (h, d) in self.dirs(id)? {
            group::set_limits(h, &d, limits)?;
        }
        Ok(())
    }

    /// Whether process `pid` is in family `id`'s group, in every hierarchy.
    pub fn holds(&self, id: &str, pid: u32) -> bool {
        let Some(name) = group_name(id) else { return false };
        let Ok(text) = fs::read_to_string(format!("/proc/{pid}/cgroup")) else { return false };
        let groups = group::groups_of(&text);
        self.layout.hierarchies.iter().all(|h| groups.iter().any(|(id, path)| *id == h.id && *path == h.child_path(&name)))
    }

    /// Whether family `id` has a group (in any hierarchy).
    pub fn exists(&self, id: &str) -> bool {
        self.dirs(id).is_ok_and(|d| d.iter().any(|(_, d)| d.is_dir()))
    }

    /// The processes in family `id`'s group (any hierarchy).
    #[cfg(test)]
    fn procs(&self, id: &str) -> Vec<u32> {
        let mut pids: Vec<u32> = self.dirs(id).unwrap_or_default().iter().flat_map(|(_, d)| group::procs(d)).collect();
        pids.sort_unstable();
        pids.dedup();
        pids
    }

    /// Remove family `id`'s group if nothing runs in it any more (without
    /// waiting: a group that still holds a process stays, for
    /// [`Cgroups::destroy`]). True if it is gone.
    pub fn remove_if_empty(&self, id: &str) -> bool {
        let Ok(dirs) = self.dirs(id) else { return false };
        dirs.iter().rev().all(|(_, d)| match fs::remove_dir(d) {
            Ok(()) => true,
            Err(e) => e.kind() == io::ErrorKind::NotFound,
        })
    }

    /// Kill every process in family `id`'s group and remove the group. A
    /// group that is not there is fine.
    pub fn destroy(&self, id: &str) -> Result<(), CgroupError> {
        let dirs: Vec<(&Hierarchy, PathBuf)> = self.dirs(id)?.into_iter().filter(|(_, d)| d.is_dir()).collect();
        if dirs.is_empty() {
            return Ok(());
        }
        group::kill_all(&dirs, id)?;
        for (_, d) in dirs.iter().rev() {
            match fs::remove_dir(d) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(CgroupError::Io { path: d.clone(), source: e }),
            }
        }
        Ok(())
    }
}

/// The daemon's v2 group if it runs in the leaf `<group>/daemon` (`path`,
/// `dir`) of a group whose children get the controllers it needs from v2
/// (`need_v2`; `enabled` reads a group's `cgroup.subtree_control`): that
/// group's path and directory.
fn leaf_parent(path: &str, dir: &Path, need_v2: &[&str], enabled: impl Fn(&Path) -> Vec<String>) -> Option<(String, PathBuf)> {
    let parent_path = path.strip_suffix("/daemon")?;
    let parent_dir = dir.parent()?;
    if need_v2.is_empty() || dir.file_name()? != "daemon" {
        return None;
    }
    let on = enabled(parent_dir);
    need_v2.iter().all(|c| on.iter().any(|e| e == c)).then(|| {
        (if parent_path.is_empty() { "/".into() } else { parent_path.into() }, parent_dir.to_path_buf())
    })
}

/// Space-separated words of a control file.
fn words(s: &str) -> Vec<String> {
    s.split_whitespace().map(String::from).collect()
}

/// In a VMM process, first thing (as root, single-threaded, before guest
/// RAM exists): join the family's group in every hierarchy (`dirs`, as
/// [`Cgroups::create`] gave them, each a `wisp-…` group), and make this
/// process the host's OOM killer's first choice over the daemon and other
/// host processes should the host itself run out of memory.
pub fn join(dirs: &[PathBuf]) -> Result<(), String> {
    for d in dirs {
        let ours = d.file_name().and_then(|n| n.to_str()).and_then(|n| n.strip_prefix("wisp-")).is_some_and(crate::procfs::valid_id);
        if !ours {
            return Err(format!("{}: not a family's control group", d.display()));
        }
        // "0": the writer itself (whatever its pid in a pid namespace).
        group::put(&d.join("cgroup.procs"), "0").map_err(|e| format!("join control group: {e}"))?;
    }
    let _ = fs::write("/proc/self/oom_score_adj", "500");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::{Child, Command, Stdio};
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::{Duration, Instant};

    /// A fresh family id of this test process.
    fn new_id() -> String {
        static N: AtomicU32 = AtomicU32::new(0);
        format!("{:08x}{:04x}", std::process::id(), N.fetch_add(1, Ordering::Relaxed) & 0xffff)
    }

    fn cgroups() -> Cgroups {
        Cgroups::init().unwrap_or_else(|e| {
            panic!("{e}: these tests run as root, in a control group whose controllers can be delegated (on pure cgroup v2: the root group, or one of their own)")
        })
    }

    /// A shell that joins `dirs` (as a VMM process does: writing 0), forks
    /// a child, and waits.
    fn member(dirs: &[PathBuf]) -> Child {
        let script = r#"for d in "$@"; do echo 0 > "$d/cgroup.procs" || exit 1; done; sleep 1000 & exec sleep 1000"#;
        Command::new("sh").args(["-c", script, "sh"]).args(dirs).stdin(Stdio::null()).spawn().expect("sh")
    }

    fn until(what: &str, mut f: impl FnMut() -> bool) {
        let t = Instant::now();
        while !f() {
            assert!(t.elapsed() < Duration::from_secs(10), "{what}");
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    fn read(d: &Path, file: &str) -> String {
        fs::read_to_string(d.join(file)).unwrap_or_else(|e| panic!("{}: {e}", d.join(file).display())).trim().to_string()
    }

    #[test]
    fn a_familys_group_has_its_limits_holds_its_processes_and_dies_whole() {
        let c = cgroups();
        let id = new_id();
        let l = Limits { memory: 64 << 20, pids: 32, cpu_quota_us: Some(50_000) };
        let dirs = c.create(&id, &l).unwrap();
        assert!(matches!(c.create(&id, &l), Err(CgroupError::Io { .. })), "a group is made new, never reused");
        for (h, d) in c.layout.hierarchies.iter().zip(&dirs) {
            // Directly beneath the daemon's (here: this test's) own group.
            assert_eq!((d.parent(), d.file_name().and_then(|n| n.to_str())), (Some(h.dir.as_path()), Some(format!("wisp-{id}").as_str())));
            for c in &h.serves {
                match (c, h.v2) {
                    (Controller::Memory, false) => assert_eq!(read(d, "memory.limit_in_bytes"), "67108864"),
                    (Controller::Memory, true) => assert_eq!(read(d, "memory.max"), "67108864"),
                    (Controller::Pids, _) => assert_eq!(read(d, "pids.max"), "32"),
                    (Controller::Cpu, false) => assert_eq!(read(d, "cpu.cfs_quota_us"), "50000"),
                    (Controller::Cpu, true) => assert_eq!(read(d, "cpu.max"), "50000 100000"),
                    (Controller::Freezer, _) => {}
                }
            }
        }
        let mem = c.layout.hierarchies.iter().zip(&dirs).find(|(h, _)| h.has(Controller::Memory)).unwrap();
        c.set_limits(&id, &Limits { memory: 128 << 20, pids: 64, cpu_quota_us: None }).unwrap();
        assert_eq!(read(mem.1, if mem.0.v2 { "memory.max" } else { "memory.limit_in_bytes" }), "134217728");
        // A process joins, and its child is in the group too.
        let mut m = member(&dirs);
        let pid = m.id();
        until("the member did not join", || c.holds(&id, pid) && c.procs(&id).len() == 2);
        assert!(!c.holds(&id, std::process::id()), "this process is not in the group");
        assert!(!c.holds(&new_id(), pid), "another family's group");
        // Teardown kills both and removes the group in every hierarchy.
        c.destroy(&id).unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(m.wait().unwrap().signal(), Some(9));
        assert!(dirs.iter().all(|d| !d.exists()) && !c.exists(&id));
        c.destroy(&id).unwrap();
        assert!(matches!(c.create("../../x", &l), Err(CgroupError::BadId(_))));
        assert!(!c.holds("../../x", pid));
    }

    #[test]
    fn without_cgroup_kill_a_group_is_frozen_and_killed_member_by_member() {
        let c = cgroups();
        let id = new_id();
        let dirs = c.create(&id, &Limits { memory: 64 << 20, pids: 32, cpu_quota_us: None }).unwrap();
        let mut m = member(&dirs);
        until("the member did not join", || c.procs(&id).len() == 2);
        let pairs: Vec<(&Hierarchy, PathBuf)> = c.layout.hierarchies.iter().zip(dirs.iter().cloned()).collect();
        group::kill_all_with(&pairs, &id, false).unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(m.wait().unwrap().signal(), Some(9));
        assert!(c.procs(&id).is_empty());
        c.destroy(&id).unwrap();
    }

    #[test]
    fn a_daemon_in_its_own_v2_leaf_takes_the_delegated_parent() {
        let all = ["memory", "pids", "cpu"];
        let on = |words: &'static str| move |_: &Path| super::words(words);
        let svc = Path::new("/sys/fs/cgroup/system.slice/wispd.service/daemon");
        assert_eq!(
            leaf_parent("/system.slice/wispd.service/daemon", svc, &all, on("cpu io memory pids")),
            Some(("/system.slice/wispd.service".into(), "/sys/fs/cgroup/system.slice/wispd.service".into()))
        );
        // Not delegated (the controllers are not enabled for its children).
        assert_eq!(leaf_parent("/system.slice/wispd.service/daemon", svc, &all, on("cpu")), None);
        // Not a leaf named daemon; a hybrid host that needs nothing of v2.
        assert_eq!(leaf_parent("/user.slice/session-1.scope", Path::new("/sys/fs/cgroup/user.slice/session-1.scope"), &all, on("memory pids cpu")), None);
        assert_eq!(leaf_parent("/daemon", Path::new("/sys/fs/cgroup/unified/daemon"), &[], on("memory pids cpu")), None);
        assert_eq!(leaf_parent("/daemon", Path::new("/sys/fs/cgroup/daemon"), &all, on("memory pids cpu")), Some(("/".into(), "/sys/fs/cgroup".into())));
    }

    #[test]
    fn a_vmm_process_joins_only_family_groups() {
        for bad in ["/sys/fs/cgroup/memory", "/sys/fs/cgroup/pids/wisp-../x", "/tmp/wisp-0123456789ab/..", "/x/wisp-0123"] {
            assert!(join(&[PathBuf::from(bad)]).unwrap_err().contains("not a family's control group"), "{bad}");
        }
        assert!(join(&[]).is_ok());
    }
}
