//! Control groups as a test sees them: a process's group in each hierarchy
//! (`/proc/<pid>/cgroup`), placed through this process's mounts
//! (`/proc/self/mountinfo`), for v1, v2 and hybrid hosts alike.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// A process's group in one hierarchy.
#[derive(Clone, Debug, PartialEq)]
pub struct Group {
    /// cgroup v2.
    pub v2: bool,
    /// v1: the hierarchy's controllers.
    pub controllers: Vec<String>,
    /// The group's path in its hierarchy.
    pub path: String,
    /// Its directory, and the hierarchy's mount point.
    pub dir: PathBuf,
    pub mount: PathBuf,
}

impl Group {
    /// A control file of the group.
    pub fn file(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// Read a control file (trimmed).
    pub fn read(&self, name: &str) -> String {
        let p = self.file(name);
        std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display())).trim().to_string()
    }

    /// Whether the group has control file `name` (its controller is there).
    pub fn has(&self, name: &str) -> bool {
        self.file(name).exists()
    }

    /// The processes in it (v1 may list one more than once).
    pub fn procs(&self) -> Vec<u32> {
        let text = std::fs::read_to_string(self.file("cgroup.procs")).unwrap_or_default();
        let mut pids: Vec<u32> = text.lines().filter_map(|l| l.trim().parse().ok()).collect();
        pids.sort_unstable();
        pids.dedup();
        pids
    }

    /// Move process `pid` into this group.
    pub fn put(&self, pid: u32) {
        std::fs::write(self.file("cgroup.procs"), pid.to_string())
            .unwrap_or_else(|e| panic!("move {pid} into {}: {e}", self.dir.display()));
    }
}

/// (mount point, root, fstype, super options) of every cgroup mount.
fn mounts() -> Vec<(PathBuf, String, String, Vec<String>)> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    text.lines()
        .filter_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            let pre: Vec<&str> = pre.split(' ').collect();
            let post: Vec<&str> = post.split(' ').collect();
            let fstype = post.first()?.to_string();
            (fstype == "cgroup" || fstype == "cgroup2").then(|| {
                let opts = post.get(2).map(|o| o.split(',').map(String::from).collect()).unwrap_or_default();
                (PathBuf::from(pre[4]), pre[3].to_string(), fstype, opts)
            })
        })
        .collect()
}

/// Process `pid`'s groups in every hierarchy this process can see (named
/// and unmounted ones left out).
pub fn groups_of(pid: u32) -> Vec<Group> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    let mounts = mounts();
    text.lines()
        .filter_map(|l| {
            let mut f = l.splitn(3, ':');
            let id: u32 = f.next()?.parse().ok()?;
            let controllers: Vec<String> = f.next()?.split(',').filter(|c| !c.is_empty()).map(String::from).collect();
            let path = f.next()?.to_string();
            let v2 = id == 0 && controllers.is_empty();
            if controllers.iter().any(|c| c.starts_with("name=")) {
                return None;
            }
            let (mount, root, _, _) = mounts.iter().find(|(_, root, fstype, opts)| {
                let kind = if v2 {
                    fstype == "cgroup2"
                } else {
                    fstype == "cgroup" && controllers.iter().all(|c| opts.contains(c))
                };
                kind && Path::new(&path).starts_with(root)
            })?;
            let rel = Path::new(&path).strip_prefix(root).ok()?;
            let dir = if rel.as_os_str().is_empty() { mount.clone() } else { mount.join(rel) };
            Some(Group { v2, controllers: if v2 { Vec::new() } else { controllers }, path, dir, mount: mount.clone() })
        })
        .collect()
}

/// Process `pid`'s groups named `name` (its family's: `wisp-<root id>`).
pub fn family_groups(pid: u32, name: &str) -> Vec<Group> {
    groups_of(pid).into_iter().filter(|g| g.path.rsplit('/').next() == Some(name)).collect()
}

/// The group among `groups` that has control file `file` (its controller).
pub fn with_file<'a>(groups: &'a [Group], file: &str) -> &'a Group {
    groups.iter().find(|g| g.has(file)).unwrap_or_else(|| panic!("no group with {file} among {groups:?}"))
}

/// A family group's memory limit.
pub fn memory_limit(g: &Group) -> u64 {
    g.read(if g.v2 { "memory.max" } else { "memory.limit_in_bytes" }).parse().unwrap()
}

/// The group among `groups` that has the memory controller.
pub fn memory_group(groups: &[Group]) -> &Group {
    groups.iter().find(|g| g.has("memory.max") || g.has("memory.limit_in_bytes")).expect("a memory group")
}

/// Times the OOM killer killed in a memory group.
pub fn oom_kills(g: &Group) -> u64 {
    let text = g.read(if g.v2 { "memory.events" } else { "memory.oom_control" });
    text.lines().find_map(|l| l.strip_prefix("oom_kill ")).and_then(|n| n.trim().parse().ok()).unwrap_or(0)
}

/// The most memory a memory group has held.
pub fn memory_peak(g: &Group) -> u64 {
    g.read(if g.v2 { "memory.peak" } else { "memory.max_usage_in_bytes" }).parse().unwrap()
}
