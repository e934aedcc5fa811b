//! Group VMM processes (`wispd --vms-per-process N`) on real KVM: VMs of one
//! tenant share a jailed process, each still its own KVM VM, run, stop and
//! are removed like any VM; a misbehaving guest stops only itself; tenants
//! never share; a restarted daemon adopts a group and its VMs.

mod common;

use common::daemon::Daemon;
use common::{console, wait_console};
use std::time::Duration;

use wisp_api::client::Client;
use wisp_api::{CreateVm, VmInfo, VmState};

fn create(c: &mut Client, image: &str, args: &[&str], tenant: Option<&str>) -> VmInfo {
    let req = CreateVm {
        image: image.into(),
        args: args.iter().map(|s| s.to_string()).collect(),
        tenant: tenant.map(str::to_string),
        ..Default::default()
    };
    c.create(&req).unwrap_or_else(|e| panic!("create {image}: {e}"))
}

/// The names of process `pid`'s threads.
fn names(pid: u32) -> Vec<String> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).map(|d| d.flatten().collect::<Vec<_>>()).unwrap_or_default();
    tasks.iter().map(|t| std::fs::read_to_string(t.path().join("comm")).unwrap_or_default().trim().to_string()).collect()
}

#[test]
fn vms_of_one_tenant_share_a_process_and_behave_like_any_vm() {
    let d = Daemon::start("group", &["--pool", "16M=1", "--vms-per-process", "3"]);
    let mut c = d.client();
    let vms: Vec<VmInfo> = (0..4).map(|_| create(&mut c, "sleeper", &["1h", "20ms"], Some("acme"))).collect();
    // Three to the first group, the fourth to a new one.
    let group = vms[0].group.clone().expect("a VM of a group says which");
    assert!(vms[..3].iter().all(|v| v.group.as_deref() == Some(group.as_str()) && v.pid == vms[0].pid), "{vms:?}");
    assert!(vms[3].group.is_some() && vms[3].group != vms[0].group && vms[3].pid != vms[0].pid, "{vms:?}");
    assert_eq!(vms[0].tenant.as_deref(), Some("acme"));
    // Sandboxed like a VMM process of its own: seccomp, no privileges.
    let status = std::fs::read_to_string(format!("/proc/{}/status", vms[0].pid)).unwrap();
    assert!(status.lines().any(|l| l.starts_with("Seccomp:") && l.ends_with('2')), "{status}");
    assert!(status.lines().any(|l| l == "CapEff:\t0000000000000000"), "{status}");
    // One thread per VM and the main thread (no next VM's thread: the
    // group is full). KVM's own task per VM (`kvm-nx-lpage-recovery`, a
    // kernel worker in the process) is not the monitor's.
    let own: Vec<String> = names(vms[0].pid).into_iter().filter(|n| !n.starts_with("kvm-")).collect();
    assert_eq!(own.len(), 3 + 1, "{own:?}");
    assert_eq!(own.iter().filter(|n| *n == "vcpu").count(), 3, "{own:?}");

    // Console, pause and resume, stop, kill, wait: each VM on its own.
    for v in &vms {
        wait_console(&mut c, &v.id, "sleeper");
    }
    c.pause(&vms[0].id).unwrap();
    assert_eq!(c.get(&vms[0].id).unwrap().state, VmState::Paused);
    c.resume(&vms[0].id).unwrap();
    c.stop(&vms[1].id, Some(2000)).unwrap();
    assert_eq!(c.wait(&vms[1].id).unwrap().code, 143);
    c.kill(&vms[2].id).unwrap();
    assert_eq!(c.wait(&vms[2].id).unwrap().code, 137);
    assert_eq!(c.get(&vms[0].id).unwrap().state, VmState::Running);
    assert!(console(&mut c, &vms[1].id).contains("sleeper"));

    // An attached run in a group: the console comes to the client, the
    // exit status too.
    let o = d.wisp(&["run", "--tenant", "acme", "hello", "--", "in", "a", "group"]);
    assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).starts_with("Hello from wisp! args: [\"in\", \"a\", \"group\"]"));
    // Waiting for the first line works too.
    let mut w = c.create_wait_line(&CreateVm { image: "hello".into(), tenant: Some("acme".into()), ..Default::default() }).unwrap();
    assert!(w.first_line_us.is_some() && w.group.is_some(), "{w:?}");
    w = c.get(&w.id).unwrap();
    assert_eq!(c.wait(&w.id).unwrap().code, 0);

    // Removed like any VM; with its last VM a group process goes, except
    // one empty group of the kind (here the one made ahead), which the
    // kind's next VM takes.
    let pids: Vec<u32> = c.list().unwrap().into_iter().filter_map(|v| v.group.map(|_| v.pid)).collect();
    let all: Vec<String> = c.list().unwrap().into_iter().map(|v| v.id).collect();
    let r = c.remove_many(&all, true).unwrap();
    assert!(r.failed.is_empty(), "{r:?}");
    let alive = |p: &u32| std::path::Path::new(&format!("/proc/{p}")).exists();
    let kept = common::eventually(Duration::from_secs(5), || format!("not exactly one group process left: {:?}", group_processes(&d)), || {
        let left = group_processes(&d);
        (left.len() == 1 && !pids.iter().any(|p| alive(p) && !left.contains(p))).then(|| left[0])
    });
    let next = create(&mut c, "sleeper", &["1h"], Some("acme"));
    assert_eq!(next.pid, kept, "the next VM of the kind goes to the empty group kept");
    c.remove(&next.id, true).unwrap();
    assert!(alive(&kept), "the only empty group of its kind stays");
    assert_eq!(group_processes(&d), vec![kept]);
}

/// The group processes of daemon `d` (its state directory in their command line).
fn group_processes(d: &Daemon) -> Vec<u32> {
    let dir = d.dir.to_string_lossy().into_owned();
    let procs = std::fs::read_dir("/proc").unwrap().flatten().filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok());
    procs
        .filter(|pid| {
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            cmd.contains("__worker") && cmd.contains("--group") && cmd.contains(&dir)
        })
        .collect()
}

#[test]
fn the_next_group_is_made_before_one_fills() {
    let d = Daemon::start("group-ahead", &["--pool", "16M=1", "--vms-per-process", "4"]);
    let mut c = d.client();
    // Four to a group: the third VM leaves room for one, and the next
    // group is made then, off the creates' path.
    let first: Vec<VmInfo> = (0..3).map(|_| create(&mut c, "sleeper", &["1h", "20ms"], Some("acme"))).collect();
    common::eventually(Duration::from_secs(20), || format!("no group made ahead: {:?}", group_processes(&d)), || (group_processes(&d).len() == 2).then_some(()));
    // The fourth fills the first group, the fifth goes to the one made ahead
    // (and no third is made: it has room enough).
    let fourth = create(&mut c, "sleeper", &["1h", "20ms"], Some("acme"));
    let fifth = create(&mut c, "sleeper", &["1h", "20ms"], Some("acme"));
    assert_eq!(fourth.group, first[0].group, "{fourth:?}");
    assert!(fifth.group.is_some() && fifth.group != first[0].group, "{fifth:?}");
    assert!(group_processes(&d).contains(&fifth.pid));
    assert_eq!(group_processes(&d).len(), 2, "{:?}", group_processes(&d));
    // Another tenant's VMs get no place in it.
    let other = create(&mut c, "sleeper", &["1h"], Some("other"));
    assert_ne!(other.pid, fifth.pid);
    assert_eq!(d.wisp(&["rm", "-f", "--all"]).status.code(), Some(0));
}

#[test]
fn a_misbehaving_guest_in_a_group_stops_only_itself() {
    let d = Daemon::start("group-hostile", &["--pool", "16M=1", "--vms-per-process", "4"]);
    let mut c = d.client();
    let calm = create(&mut c, "sleeper", &["1h", "10ms"], None);
    let spin = create(&mut c, "hostile-lone", &["spin"], None);
    let crash = create(&mut c, "hostile-lone", &["ud2"], None);
    let wild = create(&mut c, "hostile-lone", &["wild-write"], None);
    assert!([&spin, &crash, &wild].iter().all(|v| v.pid == calm.pid), "all four in one group");
    let x = c.wait(&crash.id).unwrap();
    assert_eq!(x.code, 139, "{x:?}");
    assert!(x.reason.contains("invalid opcode"), "{}", x.reason);
    assert_eq!(c.wait(&wild.id).unwrap().code, 139);
    // A guest that spins is killed alone.
    c.kill(&spin.id).unwrap();
    assert_eq!(c.wait(&spin.id).unwrap().code, 137);
    // The neighbour still runs and answers.
    assert_eq!(c.get(&calm.id).unwrap().state, VmState::Running);
    c.pause(&calm.id).unwrap();
    c.resume(&calm.id).unwrap();
    assert!(console(&mut c, &calm.id).contains("sleeper: sleeping"));
    // Its guest still runs: it takes the stop event and exits as asked.
    c.stop(&calm.id, Some(1000)).unwrap();
    assert_eq!(c.wait(&calm.id).unwrap().code, 143);
}

#[test]
fn tenants_and_vms_a_group_cannot_hold_get_processes_of_their_own() {
    let d = Daemon::start("group-tenants", &["--pool", "16M=1", "--vms-per-process", "8"]);
    let mut c = d.client();
    let a = create(&mut c, "sleeper", &["1h"], Some("a"));
    let a2 = create(&mut c, "sleeper", &["1h"], Some("a"));
    let b = create(&mut c, "sleeper", &["1h"], Some("b"));
    assert_eq!(a.pid, a2.pid);
    assert_ne!(a.pid, b.pid, "two tenants never share a process");
    let uid = |pid: u32| std::fs::metadata(format!("/proc/{pid}")).map(|m| std::os::unix::fs::MetadataExt::uid(&m)).unwrap();
    assert_ne!(uid(a.pid), uid(b.pid), "nor a user id");
    // An image that may fork, and a VM with limits of its own: alone.
    let forks = create(&mut c, "family", &["late"], Some("a"));
    assert!(forks.group.is_none() && forks.pid != a.pid, "{forks:?}");
    let limited = c.create(&CreateVm { image: "sleeper".into(), tenant: Some("a".into()), memory: Some(64 << 20), ..Default::default() });
    let limited = limited.unwrap();
    assert!(limited.group.is_none() && limited.pid != a.pid, "{limited:?}");
    // A tenant that is no name is refused.
    let bad = c.create(&CreateVm { image: "sleeper".into(), tenant: Some("../x".into()), ..Default::default() });
    assert!(matches!(bad, Err(wisp_api::client::ApiError::Status(400, _))), "{bad:?}");
    assert_eq!(d.wisp(&["rm", "-f", "--all"]).status.code(), Some(0));
}

#[test]
fn a_restarted_daemon_adopts_a_group_and_its_vms() {
    let mut d = Daemon::start("group-adopt", &["--pool", "16M=1", "--vms-per-process", "4"]);
    let mut c = d.client();
    let a = create(&mut c, "sleeper", &["1h", "10ms"], None);
    let b = create(&mut c, "sleeper", &["1h", "10ms"], None);
    let done = create(&mut c, "noop", &[], None);
    assert_eq!(c.wait(&done.id).unwrap().code, 0);
    assert!(a.pid == b.pid && b.pid == done.pid, "{a:?} {b:?} {done:?}");
    drop(c);
    d.sigkill_and_restart();
    let mut c = d.client();
    // An ended VM of the group is one of its members too: removing it
    // leaves the group and its running VMs alone.
    assert_eq!(d.wisp(&["rm", &done.id]).status.code(), Some(0));
    assert!(std::path::Path::new(&format!("/proc/{}", a.pid)).exists(), "the group went with an ended VM");
    for v in [&a, &b] {
        let got = c.get(&v.id).unwrap();
        assert_eq!((got.state, got.pid, got.group.as_deref()), (VmState::Running, a.pid, a.group.as_deref()), "{got:?}");
    }
    // Still controlled, and its end still seen; removing it leaves the
    // group to its last VM.
    c.kill(&a.id).unwrap();
    assert_eq!(c.wait(&a.id).unwrap().code, 137);
    assert_eq!(d.wisp(&["rm", &a.id]).status.code(), Some(0));
    assert_eq!(c.get(&b.id).unwrap().state, VmState::Running);
    c.pause(&b.id).unwrap();
    c.resume(&b.id).unwrap();
    // A new VM goes to a new group (the adopted one takes no more).
    let n = create(&mut c, "sleeper", &["1h"], None);
    assert!(n.pid != a.pid && n.group.is_some(), "{n:?}");
    let r = c.remove_many(&[b.id.clone(), n.id.clone()], true).unwrap();
    assert!(r.failed.is_empty(), "{r:?}");
    common::eventually(Duration::from_secs(5), || format!("adopted group {} still there", a.pid), || {
        (!std::path::Path::new(&format!("/proc/{}", a.pid)).exists()).then_some(())
    });
}

#[test]
fn a_group_whose_process_died_takes_no_new_vms() {
    let d = Daemon::start("group-dead", &["--pool", "16M=1", "--vms-per-process", "8"]);
    let mut c = d.client();
    let a = create(&mut c, "sleeper", &["1h"], Some("t"));
    // The group's process dies (from outside: as the OOM killer would).
    // SAFETY: killing a process this test created through the daemon.
    unsafe { libc::kill(a.pid as i32, libc::SIGKILL) };
    let x = c.wait(&a.id).unwrap();
    assert_eq!((x.code, x.reason.as_str()), (137, "the VMM process died"));
    // The tenant's next VM goes to a new group, at once.
    let t = std::time::Instant::now();
    let b = create(&mut c, "sleeper", &["1h"], Some("t"));
    assert!(b.pid != a.pid && b.group.is_some() && b.group != a.group, "{a:?} {b:?}");
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    assert_eq!(d.wisp(&["rm", "-f", "--all"]).status.code(), Some(0));
}
