//! Where the daemon's own control group is, in every hierarchy it can use:
//! read from `/proc/self/cgroup` (which group, per hierarchy) and
//! `/proc/self/mountinfo` (where each hierarchy is mounted, and which part
//! of it), for cgroup v1, v2 and the hybrid layouts in between.
//!
//! Pure functions over the two files' text ([`find`], [`select`]), so the
//! rules are tested on fixtures of each layout. A group path that leaves
//! the hierarchy (`..`, which `/proc/self/cgroup` shows for a group outside
//! the reader's cgroup namespace) or that no mount shows is refused: the
//! daemon never makes or writes a group anywhere but beneath its own.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use procfs_core::process::MountInfos;
use procfs_core::{FromBufRead, ProcessCGroups};

/// A controller wisp uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Controller {
    /// Memory: guest RAM, the monitor and a family's copy-on-write growth.
    Memory,
    /// Tasks: a family's processes and threads.
    Pids,
    /// CPU time (a quota per period).
    Cpu,
    /// Freezing a family while it is killed (v1; v2 has `cgroup.freeze`).
    Freezer,
}

impl Controller {
    /// Its name in `/proc/self/cgroup`, mount options and `cgroup.controllers`.
    pub fn name(self) -> &'static str {
        match self {
            Controller::Memory => "memory",
            Controller::Pids => "pids",
            Controller::Cpu => "cpu",
            Controller::Freezer => "freezer",
        }
    }

    /// Every controller wisp uses.
    pub const ALL: [Controller; 4] = [Controller::Memory, Controller::Pids, Controller::Cpu, Controller::Freezer];
    /// The ones it cannot do without.
    pub const REQUIRED: [Controller; 3] = [Controller::Memory, Controller::Pids, Controller::Cpu];
}

/// Why the daemon's group could not be placed.
#[derive(Debug, PartialEq, thiserror::Error)]
pub enum LayoutError {
    /// `/proc/self/cgroup` or `mountinfo` could not be parsed.
    #[error("cannot parse {what}: {why}")]
    Parse { what: &'static str, why: String },
    /// A group path that is not a clean absolute path inside its hierarchy.
    #[error("control group path '{0}' leaves its hierarchy (outside this cgroup namespace?): refused")]
    Escapes(String),
    /// No mount shows the daemon's group of this hierarchy.
    #[error("the daemon's control group '{path}' ({what}) is not visible under any cgroup mount")]
    NotMounted { what: String, path: String },
    /// Controllers wisp needs are in no hierarchy it can write.
    #[error("no writable cgroup hierarchy has the {} controller(s)", .0.join(", "))]
    Missing(Vec<&'static str>),
}

/// The daemon's group in one hierarchy.
#[derive(Clone, Debug, PartialEq)]
pub struct Found {
    /// cgroup v2 (the unified hierarchy).
    pub v2: bool,
    /// Hierarchy id as `/proc/<pid>/cgroup` shows it (0 for v2).
    pub id: u32,
    /// v1: the hierarchy's controllers; v2: empty (they are read from the group).
    pub controllers: Vec<String>,
    /// The group, as `/proc/<pid>/cgroup` shows it.
    pub path: String,
    /// Its directory.
    pub dir: PathBuf,
    /// Whether its mount is writable.
    pub writable: bool,
}

/// A hierarchy the daemon makes families' groups in.
#[derive(Clone, Debug, PartialEq)]
pub struct Hierarchy {
    /// cgroup v2.
    pub v2: bool,
    /// Hierarchy id (0 for v2).
    pub id: u32,
    /// The controllers wisp takes from it.
    pub serves: Vec<Controller>,
    /// The daemon's group, as `/proc/<pid>/cgroup` shows it.
    pub path: String,
    /// Its directory.
    pub dir: PathBuf,
}

impl Hierarchy {
    /// Whether wisp takes `c` from here.
    pub fn has(&self, c: Controller) -> bool {
        self.serves.contains(&c)
    }

    /// Group `name` (one plain path component) beneath the daemon's, as
    /// `/proc/<pid>/cgroup` shows it.
    pub fn child_path(&self, name: &str) -> String {
        format!("{}/{name}", self.path.trim_end_matches('/'))
    }
}

/// The hierarchies wisp uses, each with the daemon's group in it.
#[derive(Clone, Debug, PartialEq)]
pub struct Layout {
    /// v1 hierarchies first, then v2 (if any).
    pub hierarchies: Vec<Hierarchy>,
}

/// `path` is an absolute group path with no `.`, `..` or empty components.
fn clean(path: &str) -> bool {
    path == "/"
        || path.strip_prefix('/').is_some_and(|p| !p.contains('\0') && p.split('/').all(|c| !c.is_empty() && c != "." && c != ".."))
}

/// `mountinfo` escapes space, tab, newline and backslash as `\ooo`.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let oct = |j: usize| b.get(j).filter(|c| (b'0'..=b'7').contains(c)).map(|c| c - b'0');
        if b[i] == b'\\' {
            if let (Some(x), Some(y), Some(z)) = (oct(i + 1), oct(i + 2), oct(i + 3)) {
                out.push(x.wrapping_mul(64).wrapping_add(y * 8).wrapping_add(z));
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The daemon's group in every hierarchy of `proc_cgroup` (the text of
/// `/proc/self/cgroup`) that has a controller wisp uses (v1) or is the
/// unified one (v2), placed through `mountinfo` (`/proc/self/mountinfo`).
/// Named v1 hierarchies (`name=systemd`) and others are skipped.
pub fn find(proc_cgroup: &str, mountinfo: &str) -> Result<Vec<Found>, LayoutError> {
    let groups = ProcessCGroups::from_buf_read(proc_cgroup.as_bytes())
        .map_err(|e| LayoutError::Parse { what: "/proc/self/cgroup", why: e.to_string() })?;
    let mounts = MountInfos::from_buf_read(mountinfo.as_bytes())
        .map_err(|e| LayoutError::Parse { what: "/proc/self/mountinfo", why: e.to_string() })?;
    let wanted = |c: &String| Controller::ALL.iter().any(|w| w.name() == c);
    let mut found = Vec::new();
    for g in groups.0 {
        let v2 = g.hierarchy == 0 && g.controllers.is_empty();
        if !v2 && !g.controllers.iter().any(wanted) {
            continue;
        }
        if !clean(&g.pathname) {
            return Err(LayoutError::Escapes(g.pathname));
        }
        let what = if v2 { "cgroup2".to_string() } else { g.controllers.join(",") };
        // The mounts of this hierarchy whose root holds the group.
        let place = mounts.0.iter().filter_map(|m| {
            let serves = if v2 {
                m.fs_type == "cgroup2"
            } else {
                m.fs_type == "cgroup" && g.controllers.iter().all(|c| m.super_options.contains_key(c))
            };
            let root = unescape(&m.root);
            let rel = Path::new(&g.pathname).strip_prefix(&root).ok()?;
            let at = PathBuf::from(unescape(&m.mount_point.to_string_lossy()));
            let dir = if rel.as_os_str().is_empty() { at } else { at.join(rel) };
            (serves && clean(&root)).then(|| (dir, !m.mount_options.contains_key("ro")))
        });
        let Some((dir, writable)) = place.into_iter().next() else {
            return Err(LayoutError::NotMounted { what, path: g.pathname });
        };
        found.push(Found { v2, id: g.hierarchy, controllers: if v2 { Vec::new() } else { g.controllers }, path: g.pathname, dir, writable });
    }
    Ok(found)
}

/// Choose where each controller comes from: a writable v1 hierarchy that
/// has it, else the v2 hierarchy if the daemon's group there offers it
/// (`v2_available`: its `cgroup.controllers`). The freezer of v2 is
/// `cgroup.freeze`, always there. A writable v2 hierarchy is used even
/// when it serves no controller of wisp's (the hybrid layout): its groups
/// still hold every process of a family, and `cgroup.kill` ends them at
/// once. Memory, pids and cpu are required.
pub fn select(found: &[Found], v2_available: &[String]) -> Result<Layout, LayoutError> {
    let mut serves: HashMap<usize, Vec<Controller>> = HashMap::new();
    let v2 = found.iter().position(|f| f.v2 && f.writable);
    let mut missing = Vec::new();
    for c in Controller::ALL {
        let v1 = found.iter().position(|f| !f.v2 && f.writable && f.controllers.iter().any(|n| n == c.name()));
        let from_v2 = v2.filter(|_| c == Controller::Freezer || v2_available.iter().any(|n| n == c.name()));
        match v1.or(from_v2) {
            Some(i) => serves.entry(i).or_default().push(c),
            None if Controller::REQUIRED.contains(&c) => missing.push(c.name()),
            None => {}
        }
    }
    if !missing.is_empty() {
        return Err(LayoutError::Missing(missing));
    }
    let mut hierarchies = Vec::new();
    for (i, f) in found.iter().enumerate() {
        let serves = serves.remove(&i);
        if serves.is_some() || Some(i) == v2 {
            hierarchies.push(Hierarchy { v2: f.v2, id: f.id, serves: serves.unwrap_or_default(), path: f.path.clone(), dir: f.dir.clone() });
        }
    }
    hierarchies.sort_by_key(|h| h.v2);
    Ok(Layout { hierarchies })
}

/// A family's group name: `wisp-` and the family root's id (12 lowercase
/// hex digits), one plain path component; None for anything else.
pub fn group_name(id: &str) -> Option<String> {
    crate::procfs::valid_id(id).then(|| format!("wisp-{id}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This kind of host: memory, pids, cpu, freezer in v1, each mounted
    /// alone; cgroup2 at `unified` with only hugetlb; the process in a
    /// memory group of its own.
    const HYBRID_CGROUP: &str = "\
9:name=systemd:/
8:pids:/
7:blkio:/
6:freezer:/
5:devices:/
4:memory:/process_api/189cbc4e
3:cpuset:/
2:cpuacct:/
1:cpu:/
0::/
";
    const HYBRID_MOUNTS: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
34 31 0:31 / /sys/fs/cgroup/cpuset rw,relatime - cgroup cgroup rw,cpuset
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
36 31 0:33 / /sys/fs/cgroup/devices rw,relatime - cgroup cgroup rw,devices
37 31 0:34 / /sys/fs/cgroup/freezer rw,relatime - cgroup cgroup rw,freezer
38 31 0:35 / /sys/fs/cgroup/blkio rw,relatime - cgroup cgroup rw,blkio
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    /// A systemd host on cgroup v2 only, the daemon in its service's group.
    const V2_CGROUP: &str = "0::/system.slice/wispd.service\n";
    const V2_MOUNTS: &str = "\
22 1 259:2 / / rw,relatime shared:1 - ext4 /dev/root rw
25 22 0:21 / /proc rw,nosuid,nodev,noexec,relatime shared:12 - proc proc rw
26 24 0:22 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
";

    /// Classic v1 (systemd's legacy layout): cpu and cpuacct mounted together.
    const V1_CGROUP: &str = "\
12:pids:/system.slice/wispd.service
11:memory:/system.slice/wispd.service
10:freezer:/
4:cpu,cpuacct:/system.slice/wispd.service
1:name=systemd:/system.slice/wispd.service
";
    const V1_MOUNTS: &str = "\
26 24 0:23 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
27 26 0:24 / /sys/fs/cgroup/systemd rw,nosuid,nodev,noexec,relatime shared:10 - cgroup cgroup rw,xattr,name=systemd
30 26 0:27 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime shared:13 - cgroup cgroup rw,cpu,cpuacct
33 26 0:30 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:16 - cgroup cgroup rw,memory
34 26 0:31 / /sys/fs/cgroup/freezer rw,nosuid,nodev,noexec,relatime shared:17 - cgroup cgroup rw,freezer
37 26 0:34 / /sys/fs/cgroup/pids rw,nosuid,nodev,noexec,relatime shared:20 - cgroup cgroup rw,pids
";

    fn names(l: &Layout) -> Vec<(bool, Vec<&'static str>, String)> {
        l.hierarchies.iter().map(|h| (h.v2, h.serves.iter().map(|c| c.name()).collect(), h.dir.display().to_string())).collect()
    }

    #[test]
    fn hybrid_takes_v1_controllers_and_v2_for_kill() {
        let found = find(HYBRID_CGROUP, HYBRID_MOUNTS).unwrap();
        let mem = found.iter().find(|f| f.controllers == ["memory"]).unwrap();
        assert_eq!((mem.id, mem.path.as_str()), (4, "/process_api/189cbc4e"));
        assert_eq!(mem.dir, PathBuf::from("/sys/fs/cgroup/memory/process_api/189cbc4e"));
        // Devices, blkio, cpuset, cpuacct and name=systemd are not wisp's.
        assert_eq!(found.len(), 5, "{found:?}");
        let l = select(&found, &["hugetlb".into()]).unwrap();
        assert_eq!(
            names(&l),
            vec![
                (false, vec!["pids"], "/sys/fs/cgroup/pids".into()),
                (false, vec!["freezer"], "/sys/fs/cgroup/freezer".into()),
                (false, vec!["memory"], "/sys/fs/cgroup/memory/process_api/189cbc4e".into()),
                (false, vec!["cpu"], "/sys/fs/cgroup/cpu".into()),
                (true, vec![], "/sys/fs/cgroup/unified".into()),
            ]
        );
        assert_eq!(l.hierarchies[2].child_path("wisp-0123456789ab"), "/process_api/189cbc4e/wisp-0123456789ab");
        assert_eq!(l.hierarchies[0].child_path("wisp-0123456789ab"), "/wisp-0123456789ab");
    }

    #[test]
    fn pure_v2_takes_everything_from_the_unified_hierarchy() {
        let found = find(V2_CGROUP, V2_MOUNTS).unwrap();
        assert_eq!(found, vec![Found { v2: true, id: 0, controllers: vec![], path: "/system.slice/wispd.service".into(), dir: "/sys/fs/cgroup/system.slice/wispd.service".into(), writable: true }]);
        let avail: Vec<String> = ["cpuset", "cpu", "io", "memory", "pids"].map(String::from).into();
        let l = select(&found, &avail).unwrap();
        assert_eq!(names(&l), vec![(true, vec!["memory", "pids", "cpu", "freezer"], "/sys/fs/cgroup/system.slice/wispd.service".into())]);
        // Without the controllers delegated to the daemon's group, it is refused.
        assert_eq!(select(&found, &["cpu".into()]).unwrap_err(), LayoutError::Missing(vec!["memory", "pids"]));
        assert_eq!(
            select(&found, &[]).unwrap_err().to_string(),
            "no writable cgroup hierarchy has the memory, pids, cpu controller(s)"
        );
    }

    #[test]
    fn classic_v1_with_co_mounted_cpu() {
        let found = find(V1_CGROUP, V1_MOUNTS).unwrap();
        let l = select(&found, &[]).unwrap();
        assert_eq!(
            names(&l),
            vec![
                (false, vec!["pids"], "/sys/fs/cgroup/pids/system.slice/wispd.service".into()),
                (false, vec!["memory"], "/sys/fs/cgroup/memory/system.slice/wispd.service".into()),
                (false, vec!["freezer"], "/sys/fs/cgroup/freezer".into()),
                (false, vec!["cpu"], "/sys/fs/cgroup/cpu,cpuacct/system.slice/wispd.service".into()),
            ]
        );
        assert_eq!(l.hierarchies[3].id, 4);
    }

    #[test]
    fn a_mount_of_a_subtree_places_the_group_inside_it() {
        // A container: its hierarchy's subtree /docker/abc is mounted at
        // /sys/fs/cgroup/memory (the mount's root field).
        let cg = "4:memory:/docker/abc/inner\n2:pids:/docker/abc\n1:cpu:/docker/abc\n";
        let mounts = "\
35 31 0:32 /docker/abc /sys/fs/cgroup/memory ro,relatime - cgroup cgroup rw,memory
36 31 0:33 /docker/abc /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
37 31 0:34 /docker/abc /sys/fs/cgroup/cpu\\040x rw,relatime - cgroup cgroup rw,cpu
";
        let found = find(cg, mounts).unwrap();
        assert_eq!(found[0].dir, PathBuf::from("/sys/fs/cgroup/memory/inner"));
        assert!(!found[0].writable, "mounted read-only");
        assert_eq!(found[1].dir, PathBuf::from("/sys/fs/cgroup/pids"));
        assert_eq!(found[2].dir, PathBuf::from("/sys/fs/cgroup/cpu x"), "\\040 is a space");
        // Memory is only mounted read-only: wisp cannot contain VMs there.
        assert_eq!(select(&found, &[]).unwrap_err(), LayoutError::Missing(vec!["memory"]));
    }

    #[test]
    fn groups_outside_the_mounts_or_the_hierarchy_are_refused() {
        // The group is outside the subtree the container sees.
        let mounts = "35 31 0:32 /docker/abc /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n";
        assert_eq!(
            find("4:memory:/docker/other\n", mounts).unwrap_err(),
            LayoutError::NotMounted { what: "memory".into(), path: "/docker/other".into() }
        );
        // A prefix of a name is not a parent: /docker/abcd is not in /docker/abc.
        assert!(matches!(find("4:memory:/docker/abcd\n", mounts), Err(LayoutError::NotMounted { .. })));
        // Outside the reader's cgroup namespace the kernel shows `..`.
        for bad in ["/../..", "/a/../../b", "relative", "/a//b", "/a/./b"] {
            let cg = format!("0::{bad}\n");
            assert_eq!(find(&cg, V2_MOUNTS).unwrap_err(), LayoutError::Escapes(bad.into()), "{bad}");
        }
        // Not mounted at all.
        assert!(matches!(find("0::/\n", HYBRID_MOUNTS.lines().next().unwrap()), Err(LayoutError::NotMounted { .. })));
        // Garbage is an error, not a panic.
        assert!(matches!(find("x:y\n", V2_MOUNTS), Err(LayoutError::Parse { .. })));
        assert!(matches!(find(V2_CGROUP, "1 2 3\n"), Err(LayoutError::Parse { .. })));
    }

    #[test]
    fn group_names_are_one_plain_component() {
        assert_eq!(group_name("0123456789ab").as_deref(), Some("wisp-0123456789ab"));
        for bad in ["", "..", "../../etc", "0123456789AB", "0123456789a/", "0123456789abc"] {
            assert_eq!(group_name(bad), None, "{bad}");
        }
        assert!(clean("/") && clean("/a/b") && !clean("/a/") && !clean(""));
    }
}
