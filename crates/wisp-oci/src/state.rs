//! Containers' state on disk: `ROOT/ID/` (the root directory is the
//! runtime's, mode 0700) holds `state.json` (what `create` recorded) and,
//! until `start`, the `exec.fifo` the container's process waits on. A
//! container's status is read from the world, not stored: stopped once its
//! process is gone (or is a zombie, or its pid now names another process:
//! the process's start time is recorded), created while the fifo is there,
//! running otherwise.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use oci_spec::runtime::ContainerState;
use serde::{Deserialize, Serialize};

/// How long a container must have been found orphaned before a sweep
/// removes it.
pub const ORPHAN_GRACE: std::time::Duration = std::time::Duration::from_secs(60);

pub struct Root {
    dir: PathBuf,
}

/// What `create` recorded.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Record {
    pub id: String,
    pub bundle: PathBuf,
    pub pid: i32,
    /// The process's start time (clock ticks since boot, /proc/PID/stat).
    pub pid_start: u64,
    pub created: String,
    #[serde(default)]
    pub annotations: HashMap<String, String>,
    /// Who ran `create` (the engine: conmon, containerd's shim) and its
    /// start time: a container whose process and engine are both gone has
    /// nobody left to delete it ([`Root::sweep`]).
    #[serde(default)]
    pub engine_pid: i32,
    #[serde(default)]
    pub engine_start: u64,
    /// The container's control groups, removed with it.
    #[serde(default)]
    pub cgroups: Vec<PathBuf>,
}

/// A container's directory.
#[derive(Debug)]
pub struct Dir {
    pub path: PathBuf,
}

impl Root {
    pub fn new(dir: &Path) -> Root {
        Root { dir: dir.to_path_buf() }
    }

    /// Make a new container's directory (refused if the id is taken).
    pub fn make(&self, id: &str) -> Result<Dir, String> {
        check_id(id)?;
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(&self.dir).map_err(|e| format!("state root {}: {e}", self.dir.display()))?;
        let path = self.dir.join(id);
        match std::fs::DirBuilder::new().mode(0o700).create(&path) {
            Ok(()) => Ok(Dir { path }),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Err(format!("container {id} already exists")),
            Err(e) => Err(format!("{}: {e}", path.display())),
        }
    }

    /// Remove the containers nobody can delete any more: their process and
    /// the engine that created them are both gone (an engine killed before
    /// it deleted its containers: podman's conmon killed, then the
    /// container removed, leaves the runtime's state behind, runc's too).
    /// Returns the ids removed.
    pub fn sweep(&self) -> Vec<String> {
        let Ok(entries) = std::fs::read_dir(&self.dir) else { return Vec::new() };
        let mut gone = Vec::new();
        for e in entries.flatten() {
            let Some(id) = e.file_name().to_str().map(str::to_string) else { continue };
            let Ok((dir, rec)) = self.open(&id) else { continue };
            // Unknown engines are never judged; an orphan is first marked,
            // and removed only when a later sweep finds it so for longer
            // than [`ORPHAN_GRACE`] (an engine started through a wrapper
            // that exits at once may still come to `delete` it).
            let orphaned = rec.engine_pid > 0
                && rec.engine_start > 0
                && !alive(rec.engine_pid, rec.engine_start)
                && !alive(rec.pid, rec.pid_start);
            let mark = dir.path.join("orphaned");
            if !orphaned {
                continue;
            }
            let since = std::fs::metadata(&mark).and_then(|m| m.modified()).ok();
            let Some(since) = since else {
                let _ = std::fs::write(&mark, b"");
                continue;
            };
            if since.elapsed().is_ok_and(|d| d >= ORPHAN_GRACE) && dir.remove().is_ok() {
                let _ = crate::cgroup::remove(&rec.cgroups);
                gone.push(id);
            }
        }
        gone
    }

    /// An existing container's directory and record.
    pub fn open(&self, id: &str) -> Result<(Dir, Record), String> {
        check_id(id)?;
        let path = self.dir.join(id);
        let file = path.join("state.json");
        let bytes = match std::fs::read(&file) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(format!("container {id} does not exist")),
            Err(e) => return Err(format!("{}: {e}", file.display())),
        };
        let rec: Record = serde_json::from_slice(&bytes).map_err(|e| format!("{}: {e}", file.display()))?;
        Ok((Dir { path }, rec))
    }
}

impl Dir {
    pub fn fifo(&self) -> PathBuf {
        self.path.join("exec.fifo")
    }

    /// Record `rec` (written whole, then renamed into place).
    pub fn save(&self, rec: &Record) -> Result<(), String> {
        let tmp = self.path.join("state.json.tmp");
        let json = serde_json::to_vec(rec).map_err(|e| e.to_string())?;
        std::fs::write(&tmp, json).and_then(|()| std::fs::rename(&tmp, self.path.join("state.json"))).map_err(|e| format!("{}: {e}", tmp.display()))
    }

    pub fn status(&self, rec: &Record) -> ContainerState {
        if !alive(rec.pid, rec.pid_start) {
            ContainerState::Stopped
        } else if self.fifo().exists() {
            ContainerState::Created
        } else {
            ContainerState::Running
        }
    }

    pub fn remove(self) -> Result<(), String> {
        match std::fs::remove_dir_all(&self.path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(format!("{}: {e}", self.path.display())),
            _ => Ok(()),
        }
    }
}

/// Container ids as runc takes them: letters, digits, `_+-.`, not `.`/`..`.
fn check_id(id: &str) -> Result<(), String> {
    let ok = !id.is_empty()
        && id.len() <= 1024
        && id != "."
        && id != ".."
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || b"_+-.".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(format!("invalid container id {id:?}: letters, digits and _+-. only"))
    }
}

/// Process `pid`'s start time, if it lives (a zombie does not): its
/// `/proc/PID/stat` read by `procfs-core`.
pub fn start_time(pid: i32) -> Option<u64> {
    use procfs_core::FromRead;
    let stat = procfs_core::process::Stat::from_file(format!("/proc/{pid}/stat")).ok()?;
    (!matches!(stat.state, 'Z' | 'X')).then_some(stat.starttime)
}

/// Whether `pid` is still the process recorded (same start time).
pub fn alive(pid: i32, start: u64) -> bool {
    pid > 0 && start_time(pid) == Some(start)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_checked() {
        for bad in ["", ".", "..", "a/b", "a b", "x\0"] {
            assert!(check_id(bad).is_err(), "{bad:?}");
        }
        for good in ["abc", "9b84ea846643b4f7", "my_ctr-1.2+x"] {
            assert!(check_id(good).is_ok(), "{good:?}");
        }
    }

    #[test]
    fn this_process_lives_and_a_changed_start_time_does_not() {
        let me = std::process::id() as i32;
        let t = start_time(me).unwrap();
        assert!(alive(me, t));
        assert!(!alive(me, t + 1));
        assert!(!alive(0, 0));
    }

    #[test]
    fn a_taken_id_is_refused_and_a_missing_one_does_not_exist() {
        let root = Root::new(&std::env::temp_dir().join(format!("wisp-oci-root-{}", std::process::id())));
        let d = root.make("c1").unwrap();
        assert!(root.make("c1").unwrap_err().contains("already exists"));
        assert!(root.open("c2").unwrap_err().contains("does not exist"));
        let rec = Record { id: "c1".into(), bundle: "/b".into(), pid: 1, pid_start: 0, created: String::new(), annotations: HashMap::new(), engine_pid: 0, engine_start: 0, cgroups: Vec::new() };
        d.save(&rec).unwrap();
        let (d, got) = root.open("c1").unwrap();
        assert_eq!(got.bundle, PathBuf::from("/b"));
        assert_eq!(d.status(&got), ContainerState::Stopped);
        // Its engine unknown (0): kept by a sweep; its engine and process
        // gone: swept; its engine alive: kept.
        assert!(root.sweep().is_empty());
        let me = std::process::id() as i32;
        d.save(&Record { engine_pid: me, engine_start: start_time(me).unwrap(), ..rec.clone() }).unwrap();
        assert!(root.sweep().is_empty());
        d.save(&Record { engine_pid: me, engine_start: 1, ..rec }).unwrap();
        // Marked first; removed once the mark is older than the grace.
        assert!(root.sweep().is_empty());
        let mark = std::fs::File::options().write(true).open(d.path.join("orphaned")).unwrap();
        mark.set_modified(std::time::SystemTime::now() - ORPHAN_GRACE).unwrap();
        assert_eq!(root.sweep(), ["c1"]);
        assert!(root.open("c1").unwrap_err().contains("does not exist"));
        let _ = std::fs::remove_dir_all(&root.dir);
    }
}
