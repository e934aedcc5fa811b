//! The daemon's own state: one record per VMM process, `<state>/meta/<id>.json`,
//! in a directory only the daemon (root) can write or even enter. A VM's
//! own directory (`vms/<id>/`, writable by its VMM process) holds only what
//! that process produces; nothing the daemon acts on is read from there.
//!
//! A record says which process holds the VM (pid, its start time against
//! pid reuse, the user id it runs under) and, once it holds a VM, the VM as
//! the API shows it (addresses, host ports, family links, exit status).
//! Records are written by the daemon, atomically or in place in one
//! step ([`crate::fsutil::rewrite`]), and still checked when
//! read back ([`check_ports`], [`valid_id`], and the pid, address and
//! directory checks of re-adoption).

use std::collections::HashMap;
use std::fs;
use std::io;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use wisp_api::{PortMap, VmInfo};

use crate::fsutil::{read_capped, rewrite, ReadError};

/// Largest record read back.
pub const MAX_RECORD: u64 = 1 << 20;
/// Most forwarded host ports a re-adopted VM gets back.
pub const MAX_PORTS: usize = 1024;

/// One record.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Record {
    /// The VMM process's id (the VM's id once it holds one).
    pub id: String,
    /// User (and group) id the VMM process runs under.
    pub uid: u32,
    /// Its process id.
    pub pid: u32,
    /// Its start time (clock ticks after boot, `/proc/<pid>/stat`), if known.
    #[serde(default)]
    pub start: Option<u64>,
    /// It runs in its family's control group (`wisp-<family root>`):
    /// re-adoption checks that the pid is there. False in records of a
    /// daemon without control groups (or from before them).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub contained: bool,
    /// The VM it holds; none for a pooled shell or a group.
    #[serde(default)]
    pub vm: Option<VmInfo>,
    /// A group VMM process hosting up to this many VMs (each with a record
    /// of its own that names the group: `VmInfo::group`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hosts: Option<u32>,
}

/// Who a VMM process is (fixed for the life of a record).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Proc {
    /// User and group id.
    pub uid: u32,
    /// Process id.
    pub pid: u32,
    /// Start time, if known.
    pub start: Option<u64>,
    /// In its family's control group.
    pub contained: bool,
    /// A group hosting up to this many VMs.
    pub hosts: Option<u32>,
}

/// Why a record was not read.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// Missing, unreadable, not a file, or too large.
    #[error("{0}")]
    Read(#[from] ReadError),
    /// Not a record.
    #[error("malformed: {0}")]
    Parse(#[from] serde_json::Error),
    /// The record names another VM than its file.
    #[error("it names VM '{0}'")]
    OtherId(String),
}

pub use crate::procfs::valid_id;

/// Host ports claimed so far, with the addresses each is claimed on.
pub type Claimed = HashMap<u16, Vec<IpAddr>>;

/// Keep the forwards of `ports` that may be restored: both ports non-zero,
/// no host port claimed twice on one address (or once on every address,
/// `0.0.0.0`/`::`, and again on any; `taken` holds those of VMs adopted
/// before), at most [`MAX_PORTS`]. Returns the kept ones and why each
/// other one was dropped.
pub fn check_ports(ports: &[PortMap], taken: &mut Claimed) -> (Vec<PortMap>, Vec<String>) {
    let (mut keep, mut refused) = (Vec::new(), Vec::new());
    for m in ports {
        let (addr, what) = (m.host_addr(), format!("{}:{}", m.host, m.vm));
        let on = taken.entry(m.host).or_default();
        if m.host == 0 || m.vm == 0 {
            refused.push(format!("{what}: port 0"));
        } else if keep.len() >= MAX_PORTS {
            refused.push(format!("{what}: more than {MAX_PORTS} ports"));
        } else if on.iter().any(|a| *a == addr || a.is_unspecified() || addr.is_unspecified()) {
            refused.push(format!("{what}: host port {} on {addr} claimed twice", m.host));
        } else {
            on.push(addr);
            keep.push(*m);
        }
    }
    (keep, refused)
}

/// The records and the process behind each.
pub struct Records {
    dir: PathBuf,
    procs: Mutex<HashMap<String, Proc>>,
}

impl Records {
    /// Records in `dir` (made private beforehand).
    pub fn new(dir: PathBuf) -> Records {
        Records { dir, procs: Mutex::new(HashMap::new()) }
    }

    fn path(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{id}.json"))
    }

    /// Know VM `id`'s process without writing its record yet (the first
    /// [`Records::save`] writes it).
    pub fn track(&self, id: &str, p: Proc) {
        self.procs.lock().unwrap().insert(id.to_string(), p);
    }

    /// Record VMM process `id` (held by `p`) with `vm` (none for a pooled shell).
    pub fn register(&self, id: &str, p: Proc, vm: Option<VmInfo>) -> io::Result<()> {
        let mut procs = self.procs.lock().unwrap();
        procs.insert(id.to_string(), p);
        self.write(id, p, vm)
    }

    /// Write `id`'s record again with the VM `vm` gives. `vm` is called with
    /// the records locked, so the last writer writes the newest state.
    pub fn save(&self, id: &str, vm: impl FnOnce() -> Option<VmInfo>) -> io::Result<()> {
        let procs = self.procs.lock().unwrap();
        let Some(p) = procs.get(id).copied() else { return Ok(()) };
        self.write(id, p, vm())
    }

    fn write(&self, id: &str, p: Proc, vm: Option<VmInfo>) -> io::Result<()> {
        let r = Record { id: id.to_string(), uid: p.uid, pid: p.pid, start: p.start, contained: p.contained, vm, hosts: p.hosts };
        rewrite(&self.path(id), &serde_json::to_vec(&r).map_err(io::Error::other)?)
    }

    /// The process behind each of `ids`, as known (one lock for all).
    pub fn procs_of<'a>(&self, ids: impl IntoIterator<Item = &'a str>) -> Vec<Option<Proc>> {
        let procs = self.procs.lock().unwrap();
        ids.into_iter().map(|id| procs.get(id).copied()).collect()
    }

    /// Drop `id`'s record.
    pub fn forget(&self, id: &str) {
        let mut procs = self.procs.lock().unwrap();
        procs.remove(id);
        let _ = fs::remove_file(self.path(id));
    }

    /// The ids of every record file (names that are no id are reported).
    pub fn ids(&self) -> Vec<String> {
        let Ok(rd) = fs::read_dir(&self.dir) else { return Vec::new() };
        let mut ids = Vec::new();
        for ent in rd.flatten() {
            let name = ent.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') && name.ends_with(".tmp") {
                // A write interrupted by a crash.
                let _ = fs::remove_file(ent.path());
                continue;
            }
            match name.strip_suffix(".json").filter(|s| valid_id(s)) {
                Some(id) => ids.push(id.to_string()),
                None => eprintln!("wispd: {}: not a record, ignored", ent.path().display()),
            }
        }
        ids.sort();
        ids
    }

    /// Whether `id` has a record file.
    pub fn exists(&self, id: &str) -> bool {
        self.path(id).exists()
    }

    /// Read `id`'s record (capped, strictly parsed, naming `id`).
    pub fn read(&self, id: &str) -> Result<Record, RecordError> {
        parse(id, &read_capped(&self.path(id), MAX_RECORD)?)
    }
}

/// Parse record bytes found under the name `id`.
pub fn parse(id: &str, bytes: &[u8]) -> Result<Record, RecordError> {
    let r: Record = serde_json::from_slice(bytes)?;
    if r.id != id {
        return Err(RecordError::OtherId(r.id));
    }
    if let Some(v) = r.vm.as_ref().filter(|v| v.id != id) {
        return Err(RecordError::OtherId(v.id.clone()));
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;
    use wisp_api::VmState;

    fn vm(id: &str) -> VmInfo {
        VmInfo {
            id: id.into(),
            name: None,
            image: "sleeper".into(),
            args: vec![],
            mem: 16 << 20,
            state: VmState::Running,
            pid: 42,
            created_ms: 1,
            exit: None,
            boot_us: None,
            first_line_us: None,
            boot_trace: None,
            ip: Some("10.99.0.2".into()),
            ports: vec![PortMap { host: 8080, vm: 80, addr: None }],
            links: Vec::new(),
            net_peers: false,
            parent: None,
            family: None,
            limits: None,
            tenant: None,
            group: None,
        }
    }

    #[test]
    fn ids_are_twelve_lowercase_hex_digits() {
        assert!(valid_id("0123456789ab"));
        for bad in ["", "0123456789a", "0123456789abc", "0123456789AB", "../../etc/xx", "0123456789ag", "01234567 9ab"] {
            assert!(!valid_id(bad), "{bad:?}");
        }
    }

    #[test]
    fn records_are_parsed_strictly_and_must_name_their_file() {
        let id = "0123456789ab";
        let r = Record { id: id.into(), uid: 1_000_007, pid: 42, start: Some(9), contained: true, vm: Some(vm(id)), hosts: None };
        let bytes = serde_json::to_vec(&r).unwrap();
        assert_eq!(parse(id, &bytes).unwrap(), r);
        assert!(matches!(parse("ba9876543210", &bytes), Err(RecordError::OtherId(o)) if o == id));
        let other = Record { vm: Some(vm("ba9876543210")), ..r.clone() };
        assert!(matches!(parse(id, &serde_json::to_vec(&other).unwrap()), Err(RecordError::OtherId(_))));
        for bad in [&b"{"[..], b"[]", b"{\"id\":\"0123456789ab\",\"uid\":1,\"pid\":2,\"extra\":1}", b"{\"id\":\"0123456789ab\",\"uid\":-1,\"pid\":2}", b"\xff\xfe"] {
            assert!(matches!(parse(id, bad), Err(RecordError::Parse(_))), "{}", String::from_utf8_lossy(bad));
        }
        // A pooled shell's record has no VM.
        assert!(parse(id, b"{\"id\":\"0123456789ab\",\"uid\":1000001,\"pid\":7}").unwrap().vm.is_none());
    }

    #[test]
    fn ports_are_non_zero_unique_and_bounded() {
        let p = |host, vm| PortMap { host, vm, addr: None };
        let on = |addr: &str, host, vm| PortMap { host, vm, addr: Some(addr.parse().unwrap()) };
        let mut taken = Claimed::from([(22, vec![PortMap::DEFAULT_ADDR])]);
        let (keep, refused) = check_ports(&[p(8080, 80), p(0, 80), p(8081, 0), p(8080, 81), p(22, 22), p(9000, 9000)], &mut taken);
        assert_eq!(keep, vec![p(8080, 80), p(9000, 9000)]);
        assert_eq!(refused.len(), 4, "{refused:?}");
        assert!(refused[2].contains("claimed twice"), "{refused:?}");
        // One port on two addresses is fine; on every address and on one is not.
        let (keep, refused) = check_ports(&[on("10.0.0.5", 80, 80), on("10.0.0.6", 80, 80), on("0.0.0.0", 9000, 1), on("0.0.0.0", 81, 1), p(81, 1)], &mut taken);
        assert_eq!(keep, vec![on("10.0.0.5", 80, 80), on("10.0.0.6", 80, 80), on("0.0.0.0", 81, 1)]);
        assert_eq!(refused.len(), 2, "{refused:?}");
        let many: Vec<PortMap> = (1..=(MAX_PORTS as u16 + 5)).map(|h| p(h + 10_000, 1)).collect();
        let (keep, refused) = check_ports(&many, &mut Claimed::new());
        assert_eq!((keep.len(), refused.len()), (MAX_PORTS, 5));
    }

    #[test]
    fn records_round_trip_through_their_directory() {
        let d = std::env::temp_dir().join(format!("wispd-records-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        crate::fsutil::private_dir(&d).unwrap();
        let recs = Records::new(d.clone());
        let id = "00000000abcd";
        let p = Proc { uid: 1_000_003, pid: 77, start: Some(5), contained: false, hosts: None };
        recs.register(id, p, None).unwrap();
        assert_eq!(recs.read(id).unwrap().vm, None);
        recs.save(id, || Some(vm(id))).unwrap();
        assert_eq!(recs.read(id).unwrap(), Record { id: id.into(), uid: p.uid, pid: 77, start: Some(5), contained: false, vm: Some(vm(id)), hosts: None });
        // Records of a daemon without control groups read as uncontained.
        assert!(!parse("0123456789ab", b"{\"id\":\"0123456789ab\",\"uid\":1000001,\"pid\":7}").unwrap().contained);
        fs::write(d.join("not-a-record.json"), b"{}").unwrap();
        assert_eq!(recs.ids(), vec![id.to_string()]);
        recs.forget(id);
        assert!(!recs.exists(id));
        // Saving a forgotten record writes nothing.
        recs.save(id, || Some(vm(id))).unwrap();
        assert!(!recs.exists(id));
        let _ = fs::remove_dir_all(&d);
    }
}
