//! The control files of one family's group, v1 or v2: what its limits
//! are written as ([`settings`]), and how everything in it is killed
//! ([`kill_all`]). Every path written here is a control file of the
//! daemon's group or of a `wisp-<id>` group directly beneath it.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rustix::process::{pidfd_open, pidfd_send_signal, Pid, PidfdFlags, Signal};

use super::layout::{Controller, Hierarchy};
use super::{io_err, words, CgroupError, Limits, CPU_PERIOD_US};

/// How long a family's processes are given to die.
pub const KILL_DEADLINE: Duration = Duration::from_secs(5);
/// How long freezing a group may take before its processes are killed anyway.
const FREEZE_DEADLINE: Duration = Duration::from_secs(1);

/// Write `value` to control file `path` (which must exist: a missing file
/// is an error, never a new file).
pub fn put(path: &Path, value: &str) -> Result<(), CgroupError> {
    let mut f = fs::OpenOptions::new().write(true).open(path).map_err(io_err(path))?;
    f.write_all(value.as_bytes()).map_err(io_err(path))
}

/// One control-file write of a limit.
#[derive(Debug, PartialEq, Eq)]
pub struct Setting {
    /// Control file.
    pub file: &'static str,
    /// What is written.
    pub value: String,
    /// Skipped if the kernel has no such file (swap accounting, `oom.group`).
    pub optional: bool,
}

fn set(file: &'static str, value: impl ToString) -> Setting {
    Setting { file, value: value.to_string(), optional: false }
}

fn opt(file: &'static str, value: impl ToString) -> Setting {
    Setting { file, value: value.to_string(), optional: true }
}

/// The writes that give a group of hierarchy `h` the limits `l`, in order.
/// v1 keeps `memory.limit_in_bytes` ≤ `memory.memsw.limit_in_bytes` at
/// every step, so the memory+swap limit is lifted first.
pub fn settings(h: &Hierarchy, l: &Limits) -> Vec<Setting> {
    let mut s = Vec::new();
    if h.has(Controller::Memory) {
        if h.v2 {
            s.push(set("memory.max", l.memory));
            s.push(opt("memory.swap.max", 0));
        } else {
            s.push(opt("memory.memsw.limit_in_bytes", -1));
            s.push(set("memory.limit_in_bytes", l.memory));
            s.push(opt("memory.memsw.limit_in_bytes", l.memory));
        }
    }
    if h.has(Controller::Pids) {
        s.push(set("pids.max", l.pids));
    }
    if h.has(Controller::Cpu) {
        if h.v2 {
            let quota = l.cpu_quota_us.map_or("max".to_string(), |q| q.to_string());
            s.push(set("cpu.max", format!("{quota} {CPU_PERIOD_US}")));
        } else {
            s.push(set("cpu.cfs_period_us", CPU_PERIOD_US));
            s.push(set("cpu.cfs_quota_us", l.cpu_quota_us.map_or(-1, |q| q as i64)));
        }
    }
    s
}

/// What a new group gets once: an OOM in the family is handled inside the
/// family (v1: the OOM killer enabled in the group, whatever its parent
/// says; v2: the whole family is killed together).
fn first_settings(h: &Hierarchy) -> Vec<Setting> {
    match (h.has(Controller::Memory), h.v2) {
        (false, _) => Vec::new(),
        (true, true) => vec![opt("memory.oom.group", 1)],
        (true, false) => vec![set("memory.oom_control", 0)],
    }
}

fn apply(dir: &Path, settings: &[Setting]) -> Result<(), CgroupError> {
    for s in settings {
        let path = dir.join(s.file);
        if s.optional && !path.exists() {
            continue;
        }
        put(&path, &s.value)?;
    }
    Ok(())
}

/// Settings of a new group `dir` of hierarchy `h` made once.
pub fn prepare(h: &Hierarchy, dir: &Path) -> Result<(), CgroupError> {
    apply(dir, &first_settings(h))
}

/// Give group `dir` of hierarchy `h` the limits `l`.
pub fn set_limits(h: &Hierarchy, dir: &Path, l: &Limits) -> Result<(), CgroupError> {
    apply(dir, &settings(h, l))
}

/// v2: enable the controllers wisp takes from `h` for the daemon's
/// children. A group with processes cannot (no internal processes): the
/// daemon then moves itself into `<group>/daemon`, if it is alone (the root
/// group is exempt and keeps its processes).
pub fn enable_v2(h: &Hierarchy) -> Result<(), CgroupError> {
    let want: Vec<&str> = h.serves.iter().filter(|c| **c != Controller::Freezer).map(|c| c.name()).collect();
    let ctl = h.dir.join("cgroup.subtree_control");
    let enabled = words(&fs::read_to_string(&ctl).map_err(io_err(&ctl))?);
    let missing: Vec<&str> = want.into_iter().filter(|c| !enabled.iter().any(|e| e == c)).collect();
    if missing.is_empty() {
        return Ok(());
    }
    if h.path != "/" {
        let me = std::process::id();
        let others: Vec<u32> = procs(&h.dir).into_iter().filter(|p| *p != me).collect();
        if !others.is_empty() {
            return Err(CgroupError::Busy { dir: h.dir.clone(), controllers: missing.join(", "), others });
        }
        let leaf = h.dir.join("daemon");
        match fs::create_dir(&leaf) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(CgroupError::Io { path: leaf, source: e }),
        }
        put(&leaf.join("cgroup.procs"), "0")?;
    }
    let add: Vec<String> = missing.iter().map(|c| format!("+{c}")).collect();
    put(&ctl, &add.join(" "))
}

/// (hierarchy id, group path) of each line of a `/proc/<pid>/cgroup`.
pub fn groups_of(text: &str) -> Vec<(u32, String)> {
    text.lines()
        .filter_map(|l| {
            let mut f = l.splitn(3, ':');
            let id = f.next()?.parse().ok()?;
            let _controllers = f.next()?;
            Some((id, f.next()?.to_string()))
        })
        .collect()
}

/// The processes in group `dir` (none if it cannot be read).
pub fn procs(dir: &Path) -> Vec<u32> {
    fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default().lines().filter_map(|l| l.trim().parse().ok()).collect()
}

/// SIGKILL process `pid`, seen in group `dir` of hierarchy `h`, through a
/// pidfd opened before checking that it is (still) in that group: a pid
/// that was reused meanwhile is another process, outside the group, and
/// left alone.
fn kill_member(h: &Hierarchy, dir: &Path, pid: u32) {
    let Some(p) = i32::try_from(pid).ok().and_then(Pid::from_raw) else { return };
    let Ok(fd) = pidfd_open(p, PidfdFlags::empty()) else { return };
    let Some(name) = dir.file_name().and_then(|n| n.to_str()) else { return };
    let path = h.child_path(name);
    let inside = fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .is_ok_and(|t| groups_of(&t).iter().any(|(id, p)| *id == h.id && *p == path));
    if inside {
        let _ = pidfd_send_signal(&fd, Signal::KILL);
    }
}

/// Freeze (`on`) or thaw the group: v2 `cgroup.freeze`, else a v1 freezer
/// group. Returns whether there was a freezer to use. Freezing waits until
/// the group is frozen (within [`FREEZE_DEADLINE`]).
fn freeze(dirs: &[(&Hierarchy, PathBuf)], on: bool) -> bool {
    let v2 = dirs.iter().find(|(h, d)| h.v2 && d.join("cgroup.freeze").exists());
    let v1 = dirs.iter().find(|(h, _)| !h.v2 && h.has(Controller::Freezer));
    let (file, value, done) = match (v2, v1) {
        (Some((_, d)), _) => (d.join("cgroup.freeze"), if on { "1" } else { "0" }, (d.join("cgroup.events"), "frozen 1")),
        (None, Some((_, d))) => (d.join("freezer.state"), if on { "FROZEN" } else { "THAWED" }, (d.join("freezer.state"), "FROZEN")),
        (None, None) => return false,
    };
    if put(&file, value).is_err() {
        return false;
    }
    let deadline = Instant::now() + FREEZE_DEADLINE;
    while on && Instant::now() < deadline {
        if fs::read_to_string(&done.0).is_ok_and(|s| s.lines().any(|l| l.trim() == done.1)) {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    true
}

/// Kill every process in family `id`'s group (`dirs`: its directory in
/// each hierarchy) and wait until none is left, within [`KILL_DEADLINE`].
/// With `cgroup.kill` (v2, Linux 5.14) the kernel kills them all at once,
/// forks in flight included; otherwise the group is frozen (so nothing
/// forks or exits meanwhile), each member gets SIGKILL through a pidfd,
/// and it is thawed to die. Stragglers (a process in one hierarchy's group
/// only) are killed one by one until the deadline.
pub fn kill_all(dirs: &[(&Hierarchy, PathBuf)], id: &str) -> Result<(), CgroupError> {
    kill_all_with(dirs, id, true)
}

/// [`kill_all`], with `cgroup.kill` (if there is one) or without.
pub fn kill_all_with(dirs: &[(&Hierarchy, PathBuf)], id: &str, use_kill_file: bool) -> Result<(), CgroupError> {
    let t = Instant::now();
    let each = || {
        for (h, d) in dirs {
            for pid in procs(d) {
                kill_member(h, d, pid);
            }
        }
    };
    let kill = dirs.iter().map(|(_, d)| d.join("cgroup.kill")).find(|k| use_kill_file && k.exists());
    match kill {
        Some(k) => put(&k, "1")?,
        None => {
            let frozen = freeze(dirs, true);
            each();
            if frozen {
                freeze(dirs, false);
            }
        }
    }
    let mut nap = Duration::from_micros(200);
    loop {
        let mut left: Vec<u32> = dirs.iter().flat_map(|(_, d)| procs(d)).collect();
        if left.is_empty() {
            return Ok(());
        }
        if t.elapsed() > KILL_DEADLINE {
            left.sort_unstable();
            left.dedup();
            return Err(CgroupError::Survivors { group: format!("wisp-{id}"), pids: left, secs: KILL_DEADLINE.as_secs() });
        }
        each();
        std::thread::sleep(nap);
        nap = (nap * 2).min(Duration::from_millis(20));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(v2: bool, serves: &[Controller]) -> Hierarchy {
        Hierarchy { v2, id: if v2 { 0 } else { 3 }, serves: serves.to_vec(), path: "/a".into(), dir: "/sys/fs/cgroup/x/a".into() }
    }

    fn files(s: &[Setting]) -> Vec<(&str, &str, bool)> {
        s.iter().map(|s| (s.file, s.value.as_str(), s.optional)).collect()
    }

    #[test]
    fn limits_as_v1_and_v2_write_them() {
        use Controller::*;
        let l = Limits { memory: 96 << 20, pids: 544, cpu_quota_us: Some(150_000) };
        assert_eq!(
            files(&settings(&h(true, &[Memory, Pids, Cpu, Freezer]), &l)),
            vec![("memory.max", "100663296", false), ("memory.swap.max", "0", true), ("pids.max", "544", false), ("cpu.max", "150000 100000", false)]
        );
        assert_eq!(
            files(&settings(&h(false, &[Memory]), &l)),
            vec![
                ("memory.memsw.limit_in_bytes", "-1", true),
                ("memory.limit_in_bytes", "100663296", false),
                ("memory.memsw.limit_in_bytes", "100663296", true)
            ]
        );
        let no_quota = Limits { cpu_quota_us: None, ..l };
        assert_eq!(files(&settings(&h(false, &[Cpu]), &no_quota)), vec![("cpu.cfs_period_us", "100000", false), ("cpu.cfs_quota_us", "-1", false)]);
        assert_eq!(files(&settings(&h(true, &[Cpu]), &no_quota)), vec![("cpu.max", "max 100000", false)]);
        assert_eq!(files(&settings(&h(false, &[Pids]), &l)), vec![("pids.max", "544", false)]);
        // A hierarchy used only for cgroup.kill and freezing gets no limit.
        assert!(settings(&h(true, &[Freezer]), &l).is_empty());
        assert_eq!(files(&first_settings(&h(true, &[Memory]))), vec![("memory.oom.group", "1", true)]);
        assert_eq!(files(&first_settings(&h(false, &[Memory]))), vec![("memory.oom_control", "0", false)]);
    }

    #[test]
    fn proc_cgroup_lines() {
        assert_eq!(groups_of("4:memory:/a/wisp-x\n0::/\nbad\n1:cpu,cpuacct:/with:colon\n"), vec![
            (4, "/a/wisp-x".to_string()),
            (0, "/".to_string()),
            (1, "/with:colon".to_string())
        ]);
    }

    #[test]
    fn control_files_are_never_created() {
        let d = std::env::temp_dir().join(format!("wispd-cg-put-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        assert!(matches!(put(&d.join("pids.max"), "1"), Err(CgroupError::Io { .. })));
        assert!(!d.join("pids.max").exists());
        let _ = fs::remove_dir_all(&d);
    }
}
