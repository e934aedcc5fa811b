//! The VMM process's sandbox (issue 10, item 4), seen from the host on real
//! KVM under a real wispd: every thread under seccomp with a filter of its
//! own role on top of the process's; an empty root in a mount namespace of
//! its own; a PID namespace whose init is the daemon's holder, not the
//! host's; `/dev/kvm` closed unless the VM may fork; forked VMs still
//! adopted (their pids translated by the daemon). The filters' rules
//! themselves are tested in `wisp-jail` (a forbidden call kills).

mod common;

use std::fs;
use std::time::Duration;

use common::daemon::Daemon;
use common::eventually;
use wisp_api::{CreateVm, VmInfo, VmState};

const TEN: Duration = Duration::from_secs(10);

fn status(pid: u32) -> String {
    fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default()
}

fn field<'a>(status: &'a str, key: &str) -> Vec<&'a str> {
    status.lines().find_map(|l| l.strip_prefix(key)).map(|v| v.split_whitespace().collect()).unwrap_or_default()
}

fn fds(pid: u32) -> Vec<String> {
    fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .flatten()
        .filter_map(|e| fs::read_link(e.path()).ok())
        .map(|p| p.to_string_lossy().into_owned())
        .collect()
}

fn ns(pid: u32, kind: &str) -> String {
    fs::read_link(format!("/proc/{pid}/ns/{kind}")).unwrap().to_string_lossy().into_owned()
}

fn running(d: &Daemon, image: &str, args: &[&str]) -> VmInfo {
    let req = CreateVm { image: image.into(), args: args.iter().map(|s| s.to_string()).collect(), ..Default::default() };
    let vm = d.client().create(&req).expect("create");
    assert_eq!(vm.state, VmState::Running);
    vm
}

/// The holder of the VMM processes' PID namespace, as the daemon recorded it.
fn holder(d: &Daemon) -> u32 {
    let rec: serde_json::Value = serde_json::from_slice(&fs::read(d.state().join("pidns")).expect("<state>/pidns")).unwrap();
    rec["pid"].as_u64().unwrap() as u32
}

#[test]
fn a_vmm_process_is_jailed_thread_by_thread_with_an_empty_root_in_its_own_namespaces() {
    let d = Daemon::start("sandbox-jail", &["--pool", "16M=1"]);
    let vm = running(&d, "sleeper", &[]);
    let pid = vm.pid;
    let st = status(pid);
    assert_eq!(field(&st, "Seccomp:"), ["2"], "filter mode");
    assert_eq!(field(&st, "NoNewPrivs:"), ["1"]);
    // Every thread of the process: the process's three filters and one of
    // its role (the kernel's own vCPU helper thread is not ours); the vCPU
    // thread (the main one, `wisp-vmm`) took a forking VM's role before
    // its shell was ready and, as sleeper cannot fork, the deny list that
    // narrows it to a vCPU thread's as the guest starts, which may be just
    // after the create answered: poll.
    let filters = || -> Vec<(String, u32)> {
        fs::read_dir(format!("/proc/{pid}/task"))
            .unwrap()
            .flatten()
            .filter_map(|t| {
                let comm = fs::read_to_string(t.path().join("comm")).ok()?;
                let n = field(&fs::read_to_string(t.path().join("status")).ok()?, "Seccomp_filters:").first()?.parse().ok()?;
                (!comm.starts_with("kvm-")).then(|| (comm.trim().to_string(), n))
            })
            .collect()
    };
    let all = eventually(TEN, || format!("not every thread narrowed to its role: {:?}", filters()), || {
        let f = filters();
        f.iter().all(|(name, n)| *n == if name == "wisp-vmm" { 5 } else { 4 }).then_some(f)
    });
    let roles = all.len();
    assert!(roles >= 2, "the vCPU and control threads");
    // Its root is an empty file system; its mounts are its own.
    let root: Vec<_> = fs::read_dir(format!("/proc/{pid}/root")).unwrap().flatten().map(|e| e.file_name()).collect();
    assert!(root.is_empty(), "the VMM process's root holds {root:?}");
    let me = std::process::id();
    for kind in ["mnt", "net", "ipc", "uts", "cgroup"] {
        assert_ne!(ns(pid, kind), ns(me, kind), "{kind} namespace");
    }
    // Its PID namespace: two levels of pids, and pid 1 of it is the
    // daemon's holder (an unprivileged user of its own), not the host's init.
    assert_eq!(field(&st, "NSpid:").len(), 2, "{st}");
    assert_ne!(ns(pid, "pid"), ns(me, "pid"));
    let h = holder(&d);
    assert_eq!(ns(h, "pid"), ns(pid, "pid"));
    let hs = status(h);
    assert_eq!(field(&hs, "NSpid:").last(), Some(&"1"));
    assert!(field(&hs, "Uid:").iter().all(|u| *u == "999999"), "{hs}");
    // A VM that cannot fork (sleeper declares no fork) lets go of /dev/kvm.
    assert!(!fds(pid).iter().any(|f| f == "/dev/kvm"), "{:?}", fds(pid));
}

#[test]
fn a_forking_vm_keeps_dev_kvm_and_its_children_are_adopted_across_the_pid_namespace() {
    let d = Daemon::start("sandbox-fork", &["--pool", "16M=1"]);
    // `nap 1`: the root forks a child that sleeps a minute.
    let vm = running(&d, "family", &["nap", "1"]);
    let mut c = d.client();
    // The child is registered under its host pid (the daemon translated
    // what the VMM process said), with the root as its parent.
    let child = eventually(
        TEN,
        || format!("no forked VM of {} in {:?}", vm.id, d.client().list()),
        || c.list().ok()?.into_iter().find(|v| v.parent.as_deref() == Some(&vm.id)),
    );
    assert_eq!(child.state, VmState::Running);
    let st = status(child.pid);
    assert_eq!(field(&st, "NSpid:").len(), 2, "{st}");
    assert_eq!(ns(child.pid, "pid"), ns(vm.pid, "pid"), "the family shares the VMM processes' namespace");
    let cmdline = fs::read(format!("/proc/{}/cmdline", child.pid)).unwrap();
    assert!(cmdline.windows(8).any(|w| w == b"__worker"), "the host pid is the forked VMM process's");
    // A forking VM's process holds /dev/kvm (and may use only the calls
    // that make a child's VM on it).
    let f = fds(vm.pid);
    assert!(f.iter().any(|f| f == "/dev/kvm"), "{f:?}");
}
