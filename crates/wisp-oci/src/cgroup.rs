//! The container's control groups (`linux.cgroupsPath`, its CPU, pids and
//! memory limits), as runc's cgroupfs driver makes them: the path beneath
//! the root of every hierarchy with a controller wisp-oci sets (v1: cpu,
//! cpuacct, memory, pids; v2: the unified one), the container's process
//! moved in before it makes the VM (so guest RAM is charged there), the
//! limits written, and the groups removed by `delete` once the process is
//! gone. `podman run --cpus/--pids-limit/-m` and `podman stats` then work
//! as with runc. A systemd-style path (`slice:prefix:name`) is turned into
//! the directories systemd would use (`/machine.slice/libpod-ID.scope`);
//! no unit is made (`--systemd-cgroup` is otherwise ignored).
//!
//! The memory limit is the guest's RAM plus [`MONITOR_HEADROOM`]: the
//! monitor's own pages are charged there too, and a guest that uses all
//! its RAM must not be killed for the monitor's.

use std::path::{Component, Path, PathBuf};

use procfs_core::process::MountInfos;
use procfs_core::FromBufRead;

/// Above the guest's RAM in the memory limit: the monitor's own memory.
pub const MONITOR_HEADROOM: u64 = 32 << 20;

/// What the spec asks of the groups.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Limits {
    pub cpu_quota: Option<i64>,
    pub cpu_period: Option<u64>,
    pub cpu_shares: Option<u64>,
    pub pids: Option<i64>,
    /// Guest RAM, bytes (none: the monitor's default; the memory limit is
    /// this plus the headroom).
    pub memory: Option<u64>,
}

/// A hierarchy's directory for the container.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Group {
    pub dir: PathBuf,
    pub v2: bool,
    /// The v1 controllers of its hierarchy.
    pub controllers: Vec<String>,
}

const CONTROLLERS: [&str; 4] = ["cpu", "cpuacct", "memory", "pids"];

/// The container's group in each hierarchy, from `cgroups_path` (the
/// spec's) and `mountinfo` (the text of /proc/self/mountinfo).
pub fn groups(cgroups_path: &Path, mountinfo: &str) -> Result<Vec<Group>, String> {
    let rel = relative(cgroups_path)?;
    let mounts = MountInfos::from_buf_read(mountinfo.as_bytes()).map_err(|e| format!("/proc/self/mountinfo: {e}"))?;
    let mut out: Vec<Group> = Vec::new();
    for m in &mounts.0 {
        // Only a hierarchy's root mount (a bind of part of one is not where
        // an absolute cgroups path lives).
        if m.root != "/" {
            continue;
        }
        let group = if m.fs_type == "cgroup" {
            let controllers: Vec<String> = CONTROLLERS.iter().filter(|c| m.super_options.contains_key(**c)).map(|c| c.to_string()).collect();
            if controllers.is_empty() {
                continue;
            }
            Group { dir: m.mount_point.join(&rel), v2: false, controllers }
        } else if m.fs_type == "cgroup2" {
            Group { dir: m.mount_point.join(&rel), v2: true, controllers: Vec::new() }
        } else {
            continue;
        };
        if !out.iter().any(|g| g.dir == group.dir) {
            out.push(group);
        }
    }
    Ok(out)
}

/// `cgroups_path` as a path beneath a hierarchy's root: absolute paths as
/// they are, `slice:prefix:name` as systemd lays it out; nothing that
/// leaves the hierarchy.
fn relative(p: &Path) -> Result<PathBuf, String> {
    let s = p.to_str().ok_or_else(|| format!("linux.cgroupsPath {p:?} is not UTF-8"))?;
    let rel = match s.split(':').collect::<Vec<_>>()[..] {
        [slice, prefix, name] if !s.starts_with('/') => {
            let mut path = expand_slice(if slice.is_empty() { "system.slice" } else { slice })?;
            path.push(if prefix.is_empty() { format!("{name}.scope") } else { format!("{prefix}-{name}.scope") });
            path
        }
        _ => PathBuf::from(s.trim_start_matches('/')),
    };
    if rel.as_os_str().is_empty() || rel.components().any(|c| !matches!(c, Component::Normal(_))) {
        return Err(format!("linux.cgroupsPath {s:?} must name a group beneath the hierarchies' roots"));
    }
    Ok(rel)
}

/// systemd's slice nesting: `a-b.slice` is `a.slice/a-b.slice`.
fn expand_slice(slice: &str) -> Result<PathBuf, String> {
    let base = slice.strip_suffix(".slice").filter(|b| !b.is_empty() && !b.contains('/')).ok_or_else(|| format!("{slice:?} is not a slice"))?;
    if base == "-" {
        return Ok(PathBuf::new());
    }
    let mut path = PathBuf::new();
    let mut prefix = String::new();
    for part in base.split('-') {
        if part.is_empty() {
            return Err(format!("{slice:?} is not a slice"));
        }
        prefix = if prefix.is_empty() { part.to_string() } else { format!("{prefix}-{part}") };
        path.push(format!("{prefix}.slice"));
    }
    Ok(path)
}

/// Make the groups, move this process into them and write the limits.
pub fn join(groups: &[Group], limits: &Limits) -> Result<(), String> {
    let me = std::process::id().to_string();
    for g in groups {
        std::fs::create_dir_all(&g.dir).map_err(|e| format!("control group {}: {e}", g.dir.display()))?;
        for (file, value) in settings(g, limits) {
            put(&g.dir.join(file), &value)?;
        }
        put(&g.dir.join("cgroup.procs"), &me)?;
    }
    Ok(())
}

/// The files a group's limits are written to.
fn settings(g: &Group, l: &Limits) -> Vec<(&'static str, String)> {
    let has = |c: &str| g.controllers.iter().any(|x| x == c);
    let mut s = Vec::new();
    let mem = l.memory.map(|m| m + MONITOR_HEADROOM);
    if g.v2 {
        // Only where the unified hierarchy has the controller (a hybrid
        // layout's has none: its files are not there).
        let offered = std::fs::read_to_string(g.dir.parent().unwrap_or(&g.dir).join("cgroup.subtree_control")).unwrap_or_default();
        let on = |c: &str| offered.split_whitespace().any(|x| x == c);
        if let (Some(m), true) = (mem, on("memory")) {
            s.push(("memory.max", m.to_string()));
        }
        if let (Some(p), true) = (l.pids, on("pids")) {
            s.push(("pids.max", p.to_string()));
        }
        if let (Some(q), true) = (l.cpu_quota, on("cpu")) {
            s.push(("cpu.max", format!("{} {}", if q > 0 { q.to_string() } else { "max".into() }, l.cpu_period.unwrap_or(100_000))));
        }
        return s;
    }
    if let (Some(m), true) = (mem, has("memory")) {
        s.push(("memory.limit_in_bytes", m.to_string()));
    }
    if let (Some(p), true) = (l.pids, has("pids")) {
        s.push(("pids.max", if p > 0 { p.to_string() } else { "max".into() }));
    }
    if has("cpu") {
        if let Some(sh) = l.cpu_shares {
            s.push(("cpu.shares", sh.to_string()));
        }
        if let Some(p) = l.cpu_period {
            s.push(("cpu.cfs_period_us", p.to_string()));
        }
        if let Some(q) = l.cpu_quota {
            s.push(("cpu.cfs_quota_us", q.to_string()));
        }
    }
    s
}

fn put(file: &Path, value: &str) -> Result<(), String> {
    std::fs::write(file, value).map_err(|e| format!("{} <- {value}: {e}", file.display()))
}

/// Remove the container's own groups (their process is gone; the engine's
/// parent groups stay, as runc leaves them). A group
/// already gone is fine; one still holding a process is left (said).
pub fn remove(dirs: &[PathBuf]) -> Result<(), String> {
    let mut errs = Vec::new();
    for d in dirs {
        match std::fs::remove_dir(d) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => errs.push(format!("{}: {e}", d.display())),
            _ => {}
        }
    }
    if errs.is_empty() {
        Ok(())
    } else {
        Err(format!("control groups left: {}", errs.join("; ")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
36 31 0:33 / /sys/fs/cgroup/devices rw,relatime - cgroup cgroup rw,devices
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    #[test]
    fn a_path_lands_in_every_hierarchy_with_a_controller_it_sets() {
        let g = groups(Path::new("/libpod_parent/libpod-abc"), HYBRID).unwrap();
        let dirs: Vec<_> = g.iter().map(|g| g.dir.to_str().unwrap().to_string()).collect();
        assert_eq!(
            dirs,
            [
                "/sys/fs/cgroup/cpu/libpod_parent/libpod-abc",
                "/sys/fs/cgroup/cpuacct/libpod_parent/libpod-abc",
                "/sys/fs/cgroup/memory/libpod_parent/libpod-abc",
                "/sys/fs/cgroup/pids/libpod_parent/libpod-abc",
                "/sys/fs/cgroup/unified/libpod_parent/libpod-abc",
            ]
        );
    }

    #[test]
    fn systemd_paths_and_escapes() {
        assert_eq!(relative(Path::new("machine.slice:libpod:abc")).unwrap(), PathBuf::from("machine.slice/libpod-abc.scope"));
        assert_eq!(relative(Path::new("kubepods-besteffort.slice:cri-containerd:x")).unwrap(), PathBuf::from("kubepods.slice/kubepods-besteffort.slice/cri-containerd-x.scope"));
        assert_eq!(relative(Path::new("/default/c1")).unwrap(), PathBuf::from("default/c1"));
        for bad in ["/a/../../etc", "/", "", "bad-.slice:p:n"] {
            assert!(relative(Path::new(bad)).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn limits_become_v1_files() {
        let g = Group { dir: "/x".into(), v2: false, controllers: vec!["memory".into(), "pids".into(), "cpu".into()] };
        let l = Limits { cpu_quota: Some(50_000), cpu_period: Some(100_000), cpu_shares: None, pids: Some(64), memory: Some(32 << 20) };
        let s = settings(&g, &l);
        assert!(s.contains(&("memory.limit_in_bytes", ((32 << 20) + MONITOR_HEADROOM).to_string())));
        assert!(s.contains(&("pids.max", "64".into())));
        assert!(s.contains(&("cpu.cfs_quota_us", "50000".into())));
        assert!(s.contains(&("cpu.cfs_period_us", "100000".into())));
    }
}
