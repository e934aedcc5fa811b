//! A daemon whose mount namespace shows no cgroup hierarchy: `ip netns
//! exec` runs its command in a mount namespace with a fresh `/sys`,
//! without `/sys/fs/cgroup`'s mounts. The hierarchies are still there
//! (`/proc/self/cgroup` names the daemon's groups in them): the daemon
//! takes a mount namespace of its own (so that nobody else's changes) and
//! mounts them again at `/sys/fs/cgroup` in it, with the hybrid layout's
//! names (`unified` for v2, a v1 hierarchy by its controllers).

use std::fs;
use std::path::Path;

use rustix::mount::{mount, mount_change, MountFlags, MountPropagationFlags};
use rustix::thread::{unshare_unsafe, UnshareFlags};

use super::layout::Controller;
use super::CgroupError;

/// Where the hierarchies are mounted again.
const BASE: &str = "/sys/fs/cgroup";

fn failed(what: String) -> impl FnOnce(rustix::io::Errno) -> CgroupError {
    move |e| CgroupError::Mount(format!("{what}: {e}"))
}

/// Mount the hierarchies `proc_cgroup` (`/proc/self/cgroup`) names that
/// wisp uses at `/sys/fs/cgroup`, in a mount namespace of the daemon's own,
/// if nothing is mounted there (an empty directory). False (and nothing
/// done) otherwise. Call while the process is single-threaded: threads
/// made afterwards share the new namespace.
pub fn mount_hierarchies(proc_cgroup: &str) -> Result<bool, CgroupError> {
    let base = Path::new(BASE);
    if !fs::read_dir(base).is_ok_and(|mut d| d.next().is_none()) {
        return Ok(false);
    }
    // SAFETY: a new mount namespace for this (single) thread only; no
    // descriptor table is unshared (the flag that makes this unsafe).
    unsafe { unshare_unsafe(UnshareFlags::NEWNS) }.map_err(failed("a mount namespace of its own".into()))?;
    // Nothing mounted here may reach the namespace it was copied from.
    mount_change("/", MountPropagationFlags::DOWNSTREAM | MountPropagationFlags::REC).map_err(failed("make / a slave".into()))?;
    mount("wisp-cgroup", BASE, "tmpfs", MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC, c"mode=755")
        .map_err(failed(format!("tmpfs on {BASE}")))?;
    let wanted = |c: &str| Controller::ALL.iter().any(|w| w.name() == c);
    for line in proc_cgroup.lines() {
        let mut f = line.splitn(3, ':');
        let (Some(id), Some(controllers)) = (f.next(), f.next()) else { continue };
        let (name, fstype, data) = match (id, controllers) {
            ("0", "") => ("unified".to_string(), "cgroup2", None),
            (_, c) if c.split(',').any(wanted) && !c.contains("name=") => (c.to_string(), "cgroup", Some(c.to_string())),
            _ => continue,
        };
        let dir = base.join(&name);
        fs::create_dir(&dir).map_err(|e| CgroupError::Mount(format!("{}: {e}", dir.display())))?;
        let data = data.map(|d| std::ffi::CString::new(d).unwrap_or_default());
        mount(fstype, &dir, fstype, MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC, data.as_deref())
            .map_err(failed(format!("{fstype} ({name}) on {}", dir.display())))?;
    }
    Ok(true)
}
