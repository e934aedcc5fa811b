//! Resource containment (issue 10, item 3) against a real wispd on real
//! KVM: each VM family in a control group of its own beneath the daemon's,
//! with the limits asked for; teardown kills whatever is in the group; the
//! daemon's quotas (429, 507); a fork bomb that dirties memory stays
//! within its family's limit while the daemon and other VMs go on; and a
//! restarted daemon adopts a pid only in its family's group (item 5).

mod common;

use std::os::unix::process::ExitStatusExt;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::cgroup::{family_groups, groups_of, memory_group, memory_limit, memory_peak, oom_kills, with_file, Group};
use common::daemon::Daemon;
use common::{eventually, wait_console};
use wisp_api::client::{ApiError, Client};
use wisp_api::{CreateVm, PoolInfo, PoolTarget, VmInfo, VmLimits, VmState};

const TEN: Duration = Duration::from_secs(10);
const MIB: u64 = 1 << 20;

fn sleeper() -> CreateVm {
    CreateVm { image: "sleeper".into(), args: vec!["1h".into(), "50ms".into()], ..Default::default() }
}

fn create(c: &mut Client, req: CreateVm) -> VmInfo {
    let image = req.image.clone();
    c.create(&req).unwrap_or_else(|e| panic!("create {image}: {e}"))
}

/// VM `vm`'s family groups (by its VMM process), checked to lie directly
/// beneath the daemon's own group in each hierarchy and to hold the process.
fn family_of(d: &Daemon, vm: &VmInfo) -> Vec<Group> {
    let root = vm.family.clone().unwrap_or_else(|| vm.id.clone());
    let groups = family_groups(vm.pid, &format!("wisp-{root}"));
    assert!(!groups.is_empty(), "VM {}'s process {} is in no family group: {:?}", vm.id, vm.pid, groups_of(vm.pid));
    let mine = groups_of(d.pid());
    for g in &groups {
        let daemon = mine.iter().find(|m| m.v2 == g.v2 && m.controllers == g.controllers).expect("the daemon's group");
        // On cgroup v2 the daemon may have moved into a leaf of its group.
        let base = if g.v2 && daemon.path.ends_with("/daemon") { daemon.dir.parent().unwrap() } else { daemon.dir.as_path() };
        assert_eq!(g.dir.parent(), Some(base), "{g:?} is not beneath the daemon's group {daemon:?}");
        assert!(g.procs().contains(&vm.pid), "{g:?} does not hold {}", vm.pid);
    }
    groups
}

fn gone(groups: &[Group]) -> bool {
    groups.iter().all(|g| !g.dir.exists())
}

#[test]
fn a_family_lives_in_a_group_beneath_the_daemons_with_the_limits_asked_for() {
    let d = Daemon::start("contain-group", &["--pool", "16M=1"]);
    let mut c = d.client();
    let req = CreateVm { memory: Some(96 * MIB), cpus: Some(0.5), family_limit: Some(4), ..sleeper() };
    let vm = create(&mut c, req);
    assert_eq!(vm.limits, Some(VmLimits { memory: 96 * MIB, cpus: Some(0.5), family_limit: 4, pids: 64 }));
    let groups = family_of(&d, &vm);
    assert_eq!(memory_limit(memory_group(&groups)), 96 * MIB);
    assert_eq!(with_file(&groups, "pids.max").read("pids.max"), "64");
    let cpu = groups.iter().find(|g| g.has("cpu.max") || g.has("cpu.cfs_quota_us")).expect("a cpu group");
    if cpu.v2 {
        assert_eq!(cpu.read("cpu.max"), "50000 100000");
    } else {
        assert_eq!((cpu.read("cpu.cfs_quota_us").as_str(), cpu.read("cpu.cfs_period_us").as_str()), ("50000", "100000"));
    }
    // The family's limit of VMs reaches the monitor: the fifth fork fails.
    let fam = create(&mut c, CreateVm { image: "family".into(), args: vec!["many".into(), "4".into()], family_limit: Some(4), ..Default::default() });
    let out = c.wait(&fam.id).unwrap();
    assert_eq!(out.code, 1, "{}", common::console(&mut c, &fam.id));
    assert!(common::console(&mut c, &fam.id).contains("FAILED: fork 3: EAGAIN"), "{}", common::console(&mut c, &fam.id));
    // Without limits in the request: room for every VM the family may hold.
    let plain = create(&mut c, sleeper());
    let limits = plain.limits.expect("limits");
    assert_eq!((limits.memory, limits.cpus, limits.family_limit, limits.pids), (64 * 20 * MIB, None, 64, 1024));
    let groups = family_of(&d, &plain);
    assert_eq!(memory_limit(memory_group(&groups)), 64 * 20 * MIB);
    assert_eq!(with_file(&groups, "pids.max").read("pids.max"), "1024");
    // Limits that cannot be are refused with their reason.
    for (req, msg) in [
        (CreateVm { memory: Some(MIB), ..sleeper() }, "memory limit 1 MiB is below one VM of this size and its monitor (20 MiB)"),
        (CreateVm { cpus: Some(64.0), ..sleeper() }, "this host has"),
        (CreateVm { cpus: Some(0.0), ..sleeper() }, "cpus 0: must be a number of CPUs from 0.01"),
        (CreateVm { family_limit: Some(65), ..sleeper() }, "family_limit 65: must be 1 to 64"),
    ] {
        let r = c.create(&req);
        assert!(matches!(&r, Err(ApiError::Status(400, m)) if m.contains(msg)), "{r:?}");
    }
    // And by the client, before it asks.
    let o = d.wisp(&["run", "-d", "--cpus", "0", "sleeper"]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("a number of CPUs"), "{o:?}");
}

#[test]
fn removing_a_family_kills_whatever_is_in_its_group_and_removes_it() {
    let d = Daemon::start("contain-kill", &["--pool", "16M=2"]);
    let mut c = d.client();
    let vm = create(&mut c, sleeper());
    let groups = family_of(&d, &vm);
    // A process placed in the family's group (as one a compromised VMM
    // process could leave behind), in every hierarchy, which then starts a
    // child there and tells its pid.
    let mut stray = Command::new("sh")
        .args(["-c", "read go; sleep 1000 & echo $!; exec sleep 1000"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    for g in &groups {
        g.put(stray.id());
    }
    std::io::Write::write_all(stray.stdin.as_mut().unwrap(), b"go\n").unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(stray.stdout.take().unwrap()), &mut line).unwrap();
    let child: u32 = line.trim().parse().unwrap();
    for g in &groups {
        assert_eq!(g.procs().iter().filter(|p| **p != vm.pid).count(), 2, "{g:?}: {:?}", g.procs());
        assert!(g.procs().contains(&child));
    }
    c.remove(&vm.id, true).unwrap();
    assert_eq!(stray.wait().unwrap().signal(), Some(9), "the process in the family's group survived its removal");
    // Dead; reaped by whoever inherited it.
    let alive = || std::fs::read_to_string(format!("/proc/{child}/stat")).is_ok_and(|s| !s.rsplit(')').next().unwrap_or("").trim_start().starts_with('Z'));
    eventually(TEN, || format!("its child {child} survived"), || (!alive()).then_some(()));
    assert!(gone(&groups), "the family's group is still there");

    // A family whose root is removed keeps its group while a forked VM of
    // it runs; the last one takes it along.
    let root = create(&mut c, CreateVm { image: "family".into(), args: vec!["nap".into(), "2".into()], ..Default::default() });
    let kids = eventually(TEN, || "the forked VMs were not registered".into(), || {
        let kids: Vec<VmInfo> = c.list().ok()?.into_iter().filter(|v| v.family.as_deref() == Some(&root.id)).collect();
        (kids.len() == 2).then_some(kids)
    });
    let groups = family_of(&d, &root);
    for k in &kids {
        assert_eq!(family_of(&d, k), groups, "a forked VM is in its family's group");
    }
    c.remove(&root.id, true).unwrap();
    assert!(!gone(&groups), "the group went while the family's VMs run");
    c.remove(&kids[0].id, true).unwrap();
    assert!(!gone(&groups));
    c.remove(&kids[1].id, true).unwrap();
    assert!(gone(&groups), "the family's last VM is gone, its group is not");
    // An exited family's empty group goes with its last exit.
    let brief = create(&mut c, CreateVm { args: vec!["1s".into()], ..sleeper() });
    let groups = family_of(&d, &brief);
    assert_eq!(c.wait(&brief.id).unwrap().code, 0);
    eventually(TEN, || format!("{groups:?} stayed after the VM exited"), || gone(&groups).then_some(()));
}

#[test]
fn quotas_are_answered_429_and_507() {
    let d = Daemon::start("contain-quota", &["--pool", "16M=1", "--max-vms", "2", "--max-guest-memory", "40M", "--max-pool-shells", "4"]);
    let mut c = d.client();
    let a = create(&mut c, sleeper());
    let b = create(&mut c, sleeper());
    let r = c.create(&sleeper());
    assert!(matches!(&r, Err(ApiError::Status(429, m)) if m == "too many VMs: at most 2 may run at once (wispd --max-vms)"), "{r:?}");
    c.remove(&b.id, true).unwrap();
    let r = c.create(&CreateVm { mem: Some(32 * MIB), ..sleeper() });
    assert!(
        matches!(&r, Err(ApiError::Status(507, m)) if m == "not enough guest memory: 32 MiB asked, 16 MiB of 40 MiB in use (wispd --max-guest-memory)"),
        "{r:?}"
    );
    // Refused creates leave nothing held: the quota still has room for one.
    let b = create(&mut c, sleeper());
    // A VM that exited holds no share.
    c.kill(&b.id).unwrap();
    let b2 = create(&mut c, sleeper());
    // A forked VM counts too: the fork beyond the quota is refused.
    c.remove(&b2.id, true).unwrap();
    let fam = create(&mut c, CreateVm { image: "family".into(), args: vec!["nap".into(), "2".into()], ..Default::default() });
    eventually(TEN, || format!("no fork was refused: {}", d.log()), || d.log().contains("fork refused: too many VMs").then_some(()));
    let vms = c.list().unwrap();
    assert!(vms.iter().filter(|v| v.state != VmState::Exited).count() <= 2, "{vms:?}");
    for v in [&a, &fam] {
        c.remove(&v.id, true).unwrap();
    }

    // The pool: at most 4 shells in all, 16 sizes.
    let t = |mem: u64, count| PoolTarget { mem: mem * MIB, count };
    let set = |c: &mut Client, target: Vec<PoolTarget>| c.set_pool(&PoolInfo { target, ..Default::default() });
    set(&mut c, vec![t(16, 2), t(32, 2)]).unwrap();
    let r = set(&mut c, vec![t(64, 1)]);
    assert!(matches!(&r, Err(ApiError::Status(429, m)) if m == "pool of 5 shells is too large (at most 4 in all: wispd --max-pool-shells)"), "{r:?}");
    let r = set(&mut c, vec![t(16, 10_000)]);
    assert!(matches!(&r, Err(ApiError::Status(429, _))), "{r:?}");
    let many: Vec<PoolTarget> = (0..2048).map(|i| t(4 + 2 * i, 0)).collect();
    let r = set(&mut c, many);
    assert!(matches!(&r, Err(ApiError::Status(429, m)) if m == "too many pool sizes: at most 16"), "{r:?}");
    let o = d.wisp(&["pool", "--set", "16M=5"]);
    assert!(String::from_utf8_lossy(&o.stderr).contains("too large"), "{o:?}");
    // A daemon asked for a larger pool at its start refuses to start.
    let o = Command::new(std::path::Path::new(env!("CARGO_BIN_EXE_wisp")).with_file_name("wispd"))
        .arg("--socket")
        .arg(d.dir.join("x.sock"))
        .arg("--state-dir")
        .arg(d.dir.join("state2"))
        .args(["--pool", "16M=65", "--no-cgroups"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&o.stderr).contains("--pool 16M=65: pool of 65 shells is too large"), "{o:?}");
}

#[test]
fn a_fork_bomb_that_dirties_memory_stays_within_its_family_limit() {
    let d = Daemon::start("contain-bomb", &["--pool", "16M=2"]);
    let mut c = d.client();
    let bystander = create(&mut c, sleeper());
    wait_console(&mut c, &bystander.id, "sleeper: sleeping");
    // Every VM of the family forks, and each child writes 6 MiB of its own:
    // 64 VMs would take over 400 MiB. The family may have 64 MiB.
    let limit = 64 * MIB;
    let bomb = create(&mut c, CreateVm {
        image: "family".into(),
        args: vec!["hog".into(), "6".into()],
        memory: Some(limit),
        cpus: Some(0.5),
        ..Default::default()
    });
    let groups = family_of(&d, &bomb);
    let mem = memory_group(&groups).clone();
    // The family grows until the OOM killer, inside its group, stops it.
    let what = || format!("the family met no OOM kill: peak {} MiB, {}", memory_peak(&mem) >> 20, d.log());
    eventually(Duration::from_secs(120), what, || (oom_kills(&mem) > 0).then_some(()));
    let forked = c.list().unwrap().into_iter().filter(|v| v.family.as_deref() == Some(&bomb.id)).count();
    assert!(forked >= 3, "only {forked} forked VMs");
    assert!(memory_peak(&mem) <= limit, "the family held {} MiB, over its {} MiB", memory_peak(&mem) >> 20, limit >> 20);
    // The daemon and the other VMs go on; new VMs start and run.
    assert_eq!(c.get(&bystander.id).unwrap().state, VmState::Running);
    let hello = create(&mut c, CreateVm { image: "hello".into(), args: vec!["after".into(), "the".into(), "bomb".into()], ..Default::default() });
    assert_eq!(c.wait(&hello.id).unwrap().code, 0);
    assert!(common::console(&mut c, &hello.id).contains("args: [\"after\", \"the\", \"bomb\"]"));
    c.pause(&bystander.id).unwrap();
    c.resume(&bystander.id).unwrap();
    assert!(d.log().lines().all(|l| !l.contains("panicked")), "{}", d.log());
    // Removing the family (all of it at once: one by one, its VMs would
    // fork on as fast as they go) leaves nothing of it.
    let r = c.remove_family(&bomb.id, false);
    assert!(matches!(&r, Err(ApiError::Status(409, m)) if m.contains("is running")), "{r:?}");
    let member = c.list().unwrap().into_iter().find(|v| v.family.as_deref() == Some(&bomb.id)).expect("a forked VM");
    c.remove_family(&member.id, true).unwrap();
    let family: Vec<VmInfo> = c.list().unwrap().into_iter().filter(|v| v.id == bomb.id || v.family.as_deref() == Some(&bomb.id)).collect();
    assert!(family.is_empty(), "{family:?}");
    assert!(gone(&groups), "the bomb's group is still there");
    let left = || std::fs::read_dir("/proc").unwrap().flatten().filter(|e| {
        let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        cmd.windows(bomb.id.len()).any(|w| w == bomb.id.as_bytes()) && cmd.starts_with(b"/")
    }).count();
    assert_eq!(left(), 0, "VMM processes of the bomb survived");
    assert_eq!(c.get(&bystander.id).unwrap().state, VmState::Running);
}

#[test]
fn a_restarted_daemon_adopts_a_pid_only_in_its_familys_group() {
    let mut d = Daemon::start("contain-adopt", &["--pool", "16M=1"]);
    let mut c = d.client();
    let inside = create(&mut c, sleeper());
    let outside = create(&mut c, sleeper());
    let groups = family_of(&d, &outside);
    // No shell being spawned while the daemon is killed (a process between
    // fork and exec still holds its API socket for a moment).
    eventually(TEN, || "the pool did not fill".into(), || (c.pool().ok()?.ready.iter().map(|r| r.count).sum::<u32>() == 1).then_some(()));
    drop(c);
    d.sigkill();
    // A VMM process that is no longer in its family's group (here: moved to
    // each hierarchy's root group, where root may put any process).
    for g in &groups {
        let root = Group { dir: g.mount.clone(), path: "/".into(), ..g.clone() };
        root.put(outside.pid);
    }
    d.restart();
    let mut c = d.client();
    assert_eq!(c.get(&inside.id).unwrap().state, VmState::Running, "the VM in its group was not adopted");
    let got = c.get(&outside.id).unwrap();
    assert_eq!(got.state, VmState::Exited, "a pid outside its family's group was adopted: {got:?}");
    let msg = format!("VM {}: pid {} is not in its family's control group: left alone", outside.id, outside.pid);
    assert!(d.log().contains(&msg), "{}", d.log());
    // Left alone: the process still runs (the harness ends it).
    assert!(std::path::Path::new(&format!("/proc/{}", outside.pid)).exists());
    c.pause(&inside.id).unwrap();
    c.resume(&inside.id).unwrap();
}

#[test]
fn without_a_daemon_memory_and_cpu_limits_are_refused_clearly() {
    for flag in [["--memory", "64M"], ["--cpus", "1"]] {
        let r = common::wisp(&["run", flag[0], flag[1], "hello"]);
        assert_eq!(r.code, Some(125), "{}", r.stderr);
        assert!(r.stderr.contains("--memory and --cpus need wispd, which contains each VM family in a control group"), "{}", r.stderr);
    }
    // The family limit is the monitor's own: it works without a daemon.
    let r = common::wisp(&["run", "--family-limit", "1", "family", "--", "many", "1"]);
    assert!(r.stdout.contains("FAILED: fork 0: EAGAIN"), "{}", r.stdout);
}
