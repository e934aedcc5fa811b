//! The daemon trusts only what it wrote (issue 10, item 5), on real KVM
//! with a real wispd: what a compromised VMM process can leave in its own
//! directory (a pid, an id, addresses, host ports) is never acted on after
//! a restart; a fork note whose answer is never read stalls nothing; an
//! oversized control reply is refused; a user id some process still holds
//! is not given to a VM. Each test plants what a VMM process
//! running as its VM's user id could, the way it could (from inside its
//! directory, as that user).

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::daemon::Daemon;
use common::{eventually, wait_console};
use wisp_api::client::{ApiError, Client};
use wisp_api::{CreateVm, PortMap, VmInfo, VmState};

const TEN: Duration = Duration::from_secs(10);

/// A wispd of this test, optionally in a network namespace of its own (so
/// that the host ports it binds are only its own).
fn start_daemon(tag: &str, pool: &str, netns: bool) -> Daemon {
    Daemon::launch(&format!("trust-{tag}"), netns, &["--pool", pool, "--bridge", "wispt0", "--subnet", "10.88.0.0/24"])
}

/// A host process of this test that has nothing to do with wisp; killed
/// when dropped.
struct Bystander(Child);

impl Bystander {
    fn sleep() -> Bystander {
        Bystander(Command::new("sleep").arg("1000").spawn().expect("sleep"))
    }

    /// A root process whose command line reads like VM `id`'s VMM process
    /// (`… __worker --id ID`): xargs waits on its stdin.
    fn lookalike(id: &str) -> Bystander {
        let c = Command::new("xargs")
            .args(["__worker", "--id", id])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("xargs");
        let pid = c.id();
        eventually(TEN, || "xargs did not start".into(), || {
            std::fs::read(format!("/proc/{pid}/cmdline")).ok().filter(|c| c.starts_with(b"xargs\0")).map(drop)
        });
        Bystander(c)
    }

    /// `cat` running as user and group `uid` (it waits on its stdin).
    fn under_uid(uid: u32) -> Bystander {
        let c = Command::new("setpriv")
            .args(["--reuid", &uid.to_string(), "--regid", &uid.to_string(), "--clear-groups", "cat"])
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("setpriv (util-linux)");
        let b = Bystander(c);
        eventually(TEN, || format!("cat did not start as user {uid}"), || (b.uids() == Some(vec![uid; 4])).then_some(()));
        b
    }

    /// Its real, effective, saved and file-system user ids (once it runs
    /// the program it was started for, not its launcher).
    fn uids(&self) -> Option<Vec<u32>> {
        proc_uids(self.pid()).filter(|_| {
            std::fs::read(format!("/proc/{}/cmdline", self.pid())).is_ok_and(|c| c.starts_with(b"cat\0"))
        })
    }

    fn pid(&self) -> u32 {
        self.0.id()
    }

    fn alive(&mut self) -> bool {
        self.0.try_wait().unwrap().is_none()
    }
}

impl Drop for Bystander {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn create(c: &mut Client, req: CreateVm) -> VmInfo {
    let image = req.image.clone();
    c.create(&req).unwrap_or_else(|e| panic!("create {image}: {e}"))
}

fn sleeper() -> CreateVm {
    CreateVm { image: "sleeper".into(), args: vec!["1h".into(), "20ms".into()], ..Default::default() }
}

fn owner(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().uid()
}

/// The real, effective, saved and file-system user ids of process `pid`.
fn proc_uids(pid: u32) -> Option<Vec<u32>> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find_map(|l| l.strip_prefix("Uid:"))?;
    line.split_whitespace().map(|n| n.parse().ok()).collect()
}

/// The first user id a fresh daemon hands out (`UID_BASE`, wispd's
/// `daemon/uids.rs`).
const FIRST_VM_UID: u32 = 1_000_000;

#[test]
fn a_user_id_a_process_still_holds_is_not_given_to_a_vm() {
    // A process runs under the id a fresh daemon would hand out first (one a
    // VM of an earlier daemon kept, say, or anyone's): sharing it would let
    // each signal and trace the other.
    let holder = Bystander::under_uid(FIRST_VM_UID);
    let d = start_daemon("uid", "16M=1", false);
    let mut c = d.client();
    // The daemon's first user id went to its pooled shell, which the VM
    // takes.
    eventually(TEN, || "the pool did not fill".into(), || {
        (c.pool().ok()?.ready.iter().map(|r| r.count).sum::<u32>() == 1).then_some(())
    });
    let vm = create(&mut c, sleeper());
    wait_console(&mut c, &vm.id, "sleeper: sleeping");
    let uids = proc_uids(vm.pid).expect("the VM's process");
    assert!(uids.iter().all(|&u| u == uids[0]), "{uids:?}");
    assert_ne!(uids[0], FIRST_VM_UID, "the VM got the user id of a live process");
    assert!((FIRST_VM_UID..2 * FIRST_VM_UID).contains(&uids[0]), "{uids:?}");
    assert_eq!(owner(&d.vm_dir(&vm.id)), uids[0]);
    assert_eq!(holder.uids(), Some(vec![FIRST_VM_UID; 4]), "the holder was there all along");
}

/// Run `script` as user and group `uid` (no other groups) with `dir` as its
/// working directory — as a VMM process acts on its directory through its
/// descriptor (renaming what it wrote over any name) — with `input` on stdin.
fn as_uid(uid: u32, dir: &Path, script: &str, input: &[u8]) -> Output {
    let mut c = Command::new("setpriv")
        .args(["--reuid", &uid.to_string(), "--regid", &uid.to_string(), "--clear-groups", "sh", "-c", script])
        .current_dir(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("setpriv (util-linux)");
    c.stdin.take().unwrap().write_all(input).unwrap();
    c.wait_with_output().unwrap()
}

/// Plant `vm.json` (and `pid`) in VM `id`'s directory as its user: written
/// to files of its own, renamed over those names (whoever owns them).
fn plant_record(d: &Daemon, id: &str, info: &VmInfo) {
    let dir = d.vm_dir(id);
    let script = format!("cat > .planted && mv -f .planted vm.json && echo {} > .planted && mv -f .planted pid", info.pid);
    let o = as_uid(owner(&dir), &dir, &script, &serde_json::to_vec(info).unwrap());
    assert!(o.status.success(), "planting in {}: {}", dir.display(), String::from_utf8_lossy(&o.stderr));
}

/// Whether process `pid`'s network namespace has a TCP socket listening on `port`.
fn listening(pid: u32, port: u16) -> bool {
    ["tcp", "tcp6"].iter().any(|f| {
        let table = std::fs::read_to_string(format!("/proc/{pid}/net/{f}")).unwrap_or_default();
        table.lines().skip(1).any(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            cols.len() > 3 && cols[3] == "0A" && cols[1].rsplit(':').next() == Some(format!("{port:04X}").as_str())
        })
    })
}

#[test]
fn a_pid_planted_in_a_vm_directory_never_gets_a_host_process_killed() {
    let mut d = start_daemon("pid", "16M=1", false);
    let mut c = d.client();
    let vm = create(&mut c, sleeper());
    wait_console(&mut c, &vm.id, "sleeper: sleeping");
    // The pooled shell's directory (the one that is not the VM's).
    let pooled = eventually(TEN, || "the pool did not fill".into(), || {
        let ready = c.pool().ok()?.ready.iter().map(|r| r.count).sum::<u32>() == 1;
        let dirs: Vec<String> = std::fs::read_dir(d.state().join("vms")).ok()?.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
        let others: Vec<&String> = dirs.iter().filter(|n| **n != vm.id).collect();
        (ready && others.len() == 1).then(|| others[0].clone())
    });
    // Host processes that have nothing to do with wisp: a plain one, and a
    // root process whose command line reads like the pooled shell's VMM
    // process (which the old command-line check took for one).
    let mut plain = Bystander::sleep();
    let mut lookalike = Bystander::lookalike(&pooled);
    drop(c);
    d.sigkill();

    // What the VM's and the pooled shell's processes could leave behind.
    plant_record(&d, &vm.id, &VmInfo { pid: plain.pid(), ..vm.clone() });
    let pool_dir = d.vm_dir(&pooled);
    let o = as_uid(owner(&pool_dir), &pool_dir, &format!("echo {} > .planted && mv -f .planted pid", lookalike.pid()), b"");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // The daemon's own records are out of their reach.
    let vm_dir = d.vm_dir(&vm.id);
    let o = as_uid(owner(&vm_dir), &vm_dir, &format!("echo x > ../../meta/{}.json", vm.id), b"");
    assert!(!o.status.success(), "a VM's user wrote into the daemon's records");
    let meta = d.state().join("meta");
    let o = as_uid(owner(&vm_dir), &vm_dir, &format!("echo x > {}/planted.json", meta.display()), b"");
    assert!(!o.status.success() && !meta.join("planted.json").exists(), "a VM's user wrote into the daemon's records");

    d.restart();
    let mut c = d.client();
    assert!(lookalike.alive(), "the restarted daemon killed a host process planted as a pooled shell's pid");
    assert!(plain.alive(), "the restarted daemon killed a host process planted as a VM's pid");
    // The VM is adopted with its own process, not the planted one.
    let got = c.get(&vm.id).unwrap();
    assert_eq!((got.pid, got.state), (vm.pid, VmState::Running), "{got:?}");
    assert!(d.log().contains(&format!("VM {}: vm.json in its directory is not the daemon's: ignored", vm.id)), "{}", d.log());
    c.pause(&vm.id).unwrap();
    c.resume(&vm.id).unwrap();
    // Removing it by force stops its own VMM process, and nothing else.
    c.remove(&vm.id, true).unwrap();
    assert!(plain.alive(), "removing the VM killed the host process planted as its pid");
    assert!(lookalike.alive());
    assert!(matches!(c.get(&vm.id), Err(ApiError::Status(404, _))));
    let gone = || (!Path::new(&format!("/proc/{}/status", vm.pid)).exists()).then_some(());
    eventually(TEN, || format!("VM {}'s VMM process {} still runs", vm.id, vm.pid), gone);
}

#[test]
fn planted_addresses_and_ports_are_never_bound_and_old_state_is_migrated_once() {
    let mut d = start_daemon("net", "16M=1", true);
    let base = 20_000 + (std::process::id() % 20_000) as u16;
    let (p0, p1, p2) = (base, base + 1, base + 2);
    let mut c = d.client();
    // A VM with a forwarded port of its own: the check below sees it.
    let fwd = create(&mut c, CreateVm { image: "daytime".into(), ports: vec![PortMap { host: p0, vm: 13, addr: None }], ..Default::default() });
    wait_console(&mut c, &fwd.id, "daytime: listening");
    assert!(listening(d.pid(), p0), "the forward of port {p0} is not seen");
    let a = create(&mut c, sleeper());
    let b = create(&mut c, sleeper());
    let dead = create(&mut c, sleeper());
    for v in [&a, &b, &dead] {
        wait_console(&mut c, &v.id, "sleeper: sleeping");
    }
    drop(c);
    d.sigkill();

    // A's process leaves a record with an address outside the subnet and
    // a host port.
    let planted = |v: &VmInfo, ip: &str, ports: Vec<PortMap>| VmInfo { ip: Some(ip.into()), ports, ..v.clone() };
    plant_record(&d, &a.id, &planted(&a, "192.0.2.7", vec![PortMap { host: p1, vm: 80, addr: None }]));
    d.restart();
    let pid = d.pid();
    assert!(!listening(pid, p1), "the restarted daemon bound host port {p1} planted by a VMM process");
    assert!(listening(pid, p0), "the VM's own forward was not restored");
    let mut c = d.client();
    let got = c.get(&a.id).unwrap();
    assert_eq!((got.state, got.ip.as_deref(), got.ports.len()), (VmState::Running, None, 0), "{got:?}");
    drop(c);

    // The previous layout kept the record inside each VM's directory: a
    // state directory of it is migrated once, checking what it says.
    d.sigkill();
    let meta = d.state().join("meta");
    for ent in std::fs::read_dir(&meta).map(|r| r.flatten().collect::<Vec<_>>()).unwrap_or_default() {
        let r: serde_json::Value = serde_json::from_slice(&std::fs::read(ent.path()).unwrap()).unwrap();
        let id = r["id"].as_str().unwrap();
        match serde_json::from_value::<Option<VmInfo>>(r["vm"].clone()).unwrap() {
            Some(v) => std::fs::write(d.vm_dir(id).join("vm.json"), serde_json::to_vec(&v).unwrap()).unwrap(),
            None => std::fs::write(d.vm_dir(id).join("pid"), r["pid"].to_string()).unwrap(),
        }
    }
    let _ = std::fs::remove_dir_all(&meta);
    // Planted by B's process: an address outside the subnet, a host port.
    plant_record(&d, &b.id, &planted(&b, "192.0.2.8", vec![PortMap { host: p2, vm: 80, addr: None }]));
    // Planted by DEAD's process: an unrelated process as its pid.
    let mut bystander = Bystander::sleep();
    plant_record(&d, &dead.id, &VmInfo { pid: bystander.pid(), ..dead.clone() });
    d.restart();
    let pid = d.pid();
    assert!(!listening(pid, p2), "port {p2} planted in the previous layout was bound");
    assert!(!listening(pid, p1));
    assert!(listening(pid, p0), "the forward of a migrated VM was not restored");
    let mut c = d.client();
    for v in [&fwd, &a, &b] {
        let got = c.get(&v.id).unwrap();
        assert_eq!((got.state, got.pid), (VmState::Running, v.pid), "{got:?}");
    }
    assert_eq!(c.get(&fwd.id).unwrap().ports, vec![PortMap { host: p0, vm: 13, addr: None }]);
    let got = c.get(&b.id).unwrap();
    assert_eq!((got.ip.as_deref(), got.ports.len()), (None, 0), "{got:?}");
    // DEAD's record pointed at a process that is not its VMM process: the
    // VM counts as ended, and the process is never signalled.
    let got = c.get(&dead.id).unwrap();
    assert_eq!(got.state, VmState::Exited, "{got:?}");
    c.remove(&dead.id, true).unwrap();
    assert!(bystander.alive(), "a process planted in the previous layout was killed");
    // Migrated once: the records are the daemon's again, nothing is left
    // in the VMs' directories, and a record planted now is ignored.
    assert!(meta.join(format!("{}.json", a.id)).is_file());
    for v in [&fwd, &a, &b] {
        assert!(!d.vm_dir(&v.id).join("vm.json").exists() && !d.vm_dir(&v.id).join("pid").exists());
    }
    drop(c);
    d.sigkill();
    plant_record(&d, &b.id, &planted(&b, "10.88.0.99", vec![PortMap { host: p2, vm: 80, addr: None }]));
    d.restart();
    assert!(!listening(d.pid(), p2), "a record planted after the migration was read");
    // DEAD's VMM process was never adopted (its pid was replaced): the
    // harness ends it.
}

/// The descriptor number of the family uplink (a SEQPACKET socket of the
/// daemon's network namespace) in VMM process `vmm`.
fn uplink_fd(vmm: u32, daemon: u32) -> i32 {
    let seqpacket = common::seqpacket_sockets(daemon);
    let found: Vec<i32> = common::fds(vmm).into_iter().filter(|(_, t)| seqpacket.contains(t)).map(|(n, _)| n).collect();
    assert_eq!(found.len(), 1, "uplinks of VMM process {vmm}: {found:?}");
    found[0]
}

/// A copy of descriptor `fd` of process `pid` (root may take any).
fn steal_fd(pid: u32, fd: i32) -> OwnedFd {
    // SAFETY: plain system calls; the descriptors they return are new and
    // owned here.
    unsafe {
        let pidfd = libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0);
        assert!(pidfd >= 0, "pidfd_open: {}", std::io::Error::last_os_error());
        let pidfd = OwnedFd::from_raw_fd(pidfd as i32);
        let got = libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), fd, 0);
        assert!(got >= 0, "pidfd_getfd: {}", std::io::Error::last_os_error());
        OwnedFd::from_raw_fd(got as i32)
    }
}

/// Bytes sent on socket `fd` that its peer has not read yet.
fn unread(fd: &OwnedFd) -> i32 {
    let mut n: libc::c_int = 0;
    // SAFETY: SIOCOUTQ writes one int.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCOUTQ, &mut n) };
    assert_eq!(r, 0, "SIOCOUTQ: {}", std::io::Error::last_os_error());
    n
}

#[test]
fn a_fork_note_whose_answer_is_never_read_stalls_nothing() {
    let d = start_daemon("fork", "16M=2", false);
    let mut c = d.client();
    // A VM whose image may fork (only such a VM's process holds an uplink).
    let root = create(&mut c, CreateVm { image: "family".into(), args: vec!["hold".into()], ..Default::default() });
    wait_console(&mut c, &root.id, "hold: pid");
    // What a compromised VMM process of the family can do: send a fork
    // note on its uplink with an answer socket it never reads and whose
    // buffer it has filled first, in blocking mode.
    let uplink = steal_fd(root.pid, uplink_fd(root.pid, d.pid()));
    let (mine, theirs) = UnixStream::pair().unwrap();
    theirs.set_nonblocking(true).unwrap();
    while (&theirs).write(&[0u8; 4096]).is_ok() {}
    theirs.set_nonblocking(false).unwrap();
    let bystander = Bystander::sleep();
    let note = wisp_vmm_process::proto::ForkNote { child_pid: bystander.pid(), parent_pid: root.pid };
    wisp_vmm_process::proto::send_packet(uplink.as_fd(), &note, &[theirs.as_fd()]).unwrap();
    drop(theirs);
    // The daemon has read the note (and holds the answer socket).
    eventually(TEN, || "the daemon did not read the fork note".into(), || (unread(&uplink) == 0).then_some(()));

    // Other VMs' exits are still seen, and the API answers.
    let t = Instant::now();
    let hello = create(&mut c, CreateVm { image: "hello".into(), args: vec!["still".into()], ..Default::default() });
    let what = || format!("the daemon did not see VM {} exit (its exit watcher is stalled)", hello.id);
    eventually(TEN, what, || (c.get(&hello.id).ok()?.state == VmState::Exited).then_some(()));
    assert_eq!(c.wait(&hello.id).unwrap().code, 0);
    assert!(c.list().unwrap().len() >= 2);
    // Forks of other families are still registered.
    let family = create(&mut c, CreateVm { image: "family".into(), args: vec!["nap".into(), "2".into()], ..Default::default() });
    eventually(TEN, || "the forked VMs were not registered".into(), || {
        let kids = c.list().ok()?.into_iter().filter(|v| v.parent.as_deref() == Some(&family.id)).count();
        (kids == 2).then_some(())
    });
    assert!(t.elapsed() < TEN);
    assert!(d.log().contains("fork refused"), "{}", d.log());
    drop(mine);
}

#[test]
fn an_oversized_control_reply_is_refused() {
    let d = start_daemon("ctl", "16M=1", false);
    let mut c = d.client();
    let vm = create(&mut c, sleeper());
    wait_console(&mut c, &vm.id, "sleeper: sleeping");
    // A VMM process that answers a control request with an endless line
    // (here: a socket of the test's put in place of the VM's).
    let dir = d.vm_dir(&vm.id);
    let fake = UnixListener::bind(dir.join("fake.sock")).unwrap();
    std::fs::rename(dir.join("fake.sock"), dir.join("ctl.sock")).unwrap();
    let liar = std::thread::spawn(move || {
        let (s, _) = fake.accept().unwrap();
        let mut req = String::new();
        BufReader::new(&s).read_line(&mut req).unwrap();
        let chunk = vec![b'x'; 1 << 20];
        let mut sent = 0usize;
        while sent < 256 << 20 {
            match (&s).write(&chunk) {
                Ok(n) => sent += n,
                Err(_) => break,
            }
        }
        (req, sent)
    });
    let r = c.pause(&vm.id);
    let (req, sent) = liar.join().unwrap();
    assert!(req.contains("pause"), "{req}");
    assert!(matches!(&r, Err(ApiError::Status(_, m)) if m.contains("reply line too long")), "{r:?}");
    assert!(sent < 16 << 20, "the daemon read {} MiB of one reply line", sent >> 20);
    // The daemon goes on.
    assert_eq!(c.get(&vm.id).unwrap().state, VmState::Running);
    c.kill(&vm.id).unwrap();
    assert_eq!(c.wait(&vm.id).unwrap().code, 137);
}
