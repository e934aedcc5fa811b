//! wispd and the `wisp` client on real KVM: the life cycle, names, the
//! pool, re-adoption after a daemon SIGKILL, isolation between VMs, and
//! 4xx answers to bad requests.

mod common;

use common::daemon::Daemon;
use common::{console, eventually, wait_console};
use std::path::Path;
use std::process::Output;
use std::time::{Duration, Instant};

use wisp_api::client::{ApiError, Client};
use wisp_api::{CreateVm, VmState};

fn text(o: &Output) -> (String, String) {
    (String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
}

fn create(c: &mut Client, image: &str, args: &[&str], name: Option<&str>) -> wisp_api::VmInfo {
    c.create(&CreateVm {
        image: image.into(),
        args: args.iter().map(|s| s.to_string()).collect(),
        name: name.map(str::to_string),
        ..Default::default()
    })
    .unwrap_or_else(|e| panic!("create {image}: {e}"))
}

#[test]
fn life_cycle_through_the_cli() {
    let d = Daemon::start("cli", &["--pool", "16M=2"]);
    // Attached run: console and exit status as without a daemon.
    let o = d.wisp(&["run", "hello", "--", "via", "daemon"]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(out.starts_with("Hello from wisp! args: [\"via\", \"daemon\"]"), "{out}");
    let o = d.wisp(&["run", "hostile", "--", "exit", "7"]);
    assert_eq!(o.status.code(), Some(7));

    // Detached, named.
    let o = d.wisp(&["run", "-d", "--name", "sleepy", "sleeper", "--", "1h", "50ms"]);
    assert_eq!(o.status.code(), Some(0), "{:?}", text(&o));
    let id = text(&o).0.trim().to_string();
    assert_eq!(id.len(), 12, "{id}");
    let (ps, _) = text(&d.wisp(&["ps"]));
    assert!(ps.contains(&id) && ps.contains("sleepy") && ps.contains("running"), "{ps}");

    assert_eq!(d.wisp(&["pause", "sleepy"]).status.code(), Some(0));
    assert!(text(&d.wisp(&["ps"])).0.contains("paused"));
    let mut c = d.client();
    let before = console(&mut c, &id).len();
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(d.wisp(&["resume", "sleepy"]).status.code(), Some(0));
    assert_eq!(c.get("sleepy").unwrap().state, VmState::Running);
    assert_eq!(console(&mut c, &id).len(), before, "a paused VM printed");

    let (l, _) = text(&d.wisp(&["logs", "sleepy"]));
    assert!(l.contains("sleeper: sleeping"), "{l}");
    let (inspect, _) = text(&d.wisp(&["inspect", "sleepy"]));
    assert!(inspect.contains(&format!("\"id\": \"{id}\"")), "{inspect}");

    // Graceful stop: the library OS exits 143 on the stop event.
    assert_eq!(d.wisp(&["stop", "sleepy"]).status.code(), Some(0));
    assert_eq!(d.wisp(&["wait", &id]).status.code(), Some(143));
    let (ps, _) = text(&d.wisp(&["ps"]));
    assert!(!ps.contains(&id), "exited VM listed without -a: {ps}");
    assert!(text(&d.wisp(&["ps", "-a"])).0.contains("exited (143)"));

    // A guest that ignores the stop request is killed after the grace period.
    let o = d.wisp(&["run", "-d", "hostile", "--", "spin"]);
    let spin = text(&o).0.trim().to_string();
    let t = Instant::now();
    assert_eq!(d.wisp(&["stop", "--grace", "300ms", &spin]).status.code(), Some(0));
    assert!(t.elapsed() >= Duration::from_millis(300));
    assert_eq!(d.wisp(&["wait", &spin]).status.code(), Some(137));

    // kill, rm of a running VM needs -f, names are freed by rm.
    let o = d.wisp(&["run", "-d", "--name", "victim", "sleeper"]);
    let victim = text(&o).0.trim().to_string();
    let o = d.wisp(&["rm", "victim"]);
    assert_ne!(o.status.code(), Some(0));
    assert!(text(&o).1.contains("is running"), "{:?}", text(&o));
    assert_eq!(d.wisp(&["kill", "victim"]).status.code(), Some(0));
    assert_eq!(d.wisp(&["wait", &victim]).status.code(), Some(137));
    assert_eq!(d.wisp(&["rm", "victim"]).status.code(), Some(0));
    assert_eq!(d.wisp(&["run", "-d", "--name", "victim", "noop"]).status.code(), Some(0));

    // Mass operations.
    let o = d.wisp(&["run", "-d", "--count", "5", "sleeper"]);
    let (out, err) = text(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert_eq!(out.lines().count(), 5, "{out}");
    assert!(err.contains("started 5 of 5 VMs"), "{err}");
    let o = d.wisp(&["rm", "--all", "-f"]);
    assert_eq!(o.status.code(), Some(0));
    assert!(text(&o).1.contains("removed"), "{:?}", text(&o));
    assert!(d.client().list().unwrap().is_empty());
}

#[test]
fn an_image_its_vm_cannot_serve_is_refused_and_leaves_nothing_behind() {
    // daytime's manifest requires a NIC; asked for without one, the VMM
    // process refuses it at load and the daemon answers 400 with that line.
    let d = Daemon::start("manifest", &["--pool", "16M=1"]);
    let mut c = d.client();
    let r = c.create(&CreateVm { image: "daytime".into(), name: Some("nicless".into()), ..Default::default() });
    assert!(
        matches!(r, Err(ApiError::Status(400, ref m)) if m.contains("the image needs a net device ('net0'), and none was given")),
        "{r:?}"
    );
    // Rolled back: no VM is listed, and the name is free again.
    assert!(c.list().unwrap().is_empty(), "{:?}", c.list());
    create(&mut c, "sleeper", &[], Some("nicless"));
}

#[test]
fn names_and_bad_requests_get_4xx() {
    let d = Daemon::start("api", &["--pool", "16M=1"]);
    let mut c = d.client();
    create(&mut c, "sleeper", &[], Some("one"));
    let dup = c.create(&CreateVm { image: "sleeper".into(), name: Some("one".into()), ..Default::default() });
    assert!(matches!(dup, Err(ApiError::Status(409, ref m)) if m.contains("already in use")), "{dup:?}");
    let check = |c: &mut Client, method: &str, path: &str, body: Option<&str>, status: u16, needle: &str| {
        let r = c.raw(method, path, body.map(str::as_bytes)).unwrap();
        assert_eq!(r.status, status, "{method} {path}: {}", r.error_message());
        assert!(r.error_message().contains(needle), "{method} {path}: {}", r.error_message());
    };
    check(&mut c, "GET", "/v1/vms/ffffffffffff", None, 404, "no such VM");
    check(&mut c, "POST", "/v1/vms/nope/pause", None, 404, "no such VM");
    check(&mut c, "POST", "/v1/vms", Some("{not json"), 400, "JSON");
    check(&mut c, "POST", "/v1/vms", Some("{\"image\": 5}"), 400, "invalid type");
    check(&mut c, "POST", "/v1/vms", Some("{\"image\":\"hello\",\"bogus\":1}"), 400, "unknown field");
    check(&mut c, "POST", "/v1/vms", Some("{\"image\":\"hello\",\"mem\":1099511627776000}"), 400, "memory too large");
    check(&mut c, "POST", "/v1/vms", Some("{\"image\":\"hello\",\"mem\":1024}"), 400, "memory too small");
    check(&mut c, "POST", "/v1/vms", Some("{\"image\":\"no-such-app\"}"), 400, "no such image");
    check(&mut c, "POST", "/v1/vms", Some("{\"image\":\"relative/path\"}"), 400, "must be absolute");
    check(&mut c, "POST", "/v1/vms", Some("{\"image\":\"/etc/passwd\"}"), 400, "not an ELF");
    check(&mut c, "POST", "/v1/vms", Some("{\"image\":\"hello\",\"name\":\"bad name!\"}"), 400, "invalid name");
    check(&mut c, "DELETE", "/v1/vms", None, 405, "not allowed");
    check(&mut c, "GET", "/v1/nothing", None, 404, "no such endpoint");
    check(&mut c, "GET", "/v1/vms/one/logs?follow=maybe", None, 400, "expected true or false");
    check(&mut c, "PUT", "/v1/pool", Some("{\"target\":[{\"mem\":1,\"count\":1}]}"), 400, "memory too small");
    // The daemon is still fine.
    assert_eq!(c.get("one").unwrap().state, VmState::Running);
    assert_eq!(c.version().unwrap().abi, wisp_abi::ABI_VERSION);
}

#[test]
fn wait_line_answers_at_the_guests_first_complete_line() {
    let d = Daemon::start("waitline", &["--pool", "16M=2"]);
    let mut c = d.client();
    let late = |ms: &str| CreateVm { image: "hostile".into(), args: vec!["late-line".into(), ms.into()], ..Default::default() };
    // Half a line at once, its end 300 ms later: the answer waits for the end.
    let t = Instant::now();
    let vm = c.create_wait_line(&late("300")).unwrap();
    let waited = t.elapsed();
    let first = vm.first_line_us.expect("first_line_us in the answer");
    let boot = vm.boot_us.expect("boot_us in the answer");
    assert!(first >= 300_000, "first line after {first} µs, printed 300 ms after boot");
    assert!(first > boot, "first line {first} µs before the image was loaded ({boot} µs)");
    assert!(waited >= Duration::from_millis(300) && waited.as_micros() as u64 >= first, "{waited:?}, {first} µs");
    // The line is on the console by the time the answer arrives, and the VM runs on.
    assert!(console(&mut c, &vm.id).contains("late-line: after 300 ms\n"), "{}", console(&mut c, &vm.id));
    let got = c.get(&vm.id).unwrap();
    assert_eq!((got.state, got.first_line_us), (VmState::Running, Some(first)));
    // A guest that prints at once: the line comes soon after the image is loaded.
    let hello = c.create_wait_line(&CreateVm { image: "hello".into(), ..Default::default() }).unwrap();
    let first = hello.first_line_us.unwrap();
    assert!(first >= hello.boot_us.unwrap() && first < 5_000_000, "{hello:?}");
    // Without the option the answer does not wait and says nothing of a line.
    let plain = c.create(&late("5000")).unwrap();
    assert_eq!(plain.first_line_us, None);
    assert!(!console(&mut c, &plain.id).contains("after"), "the plain create waited for the line");
    // A VM that ends without a line: a clear error naming it, not a hang.
    let r = c.create_wait_line(&CreateVm { image: "noop".into(), ..Default::default() });
    assert!(matches!(&r, Err(ApiError::Status(409, m)) if m.contains("ended before its first console line")), "{r:?}");
    // One that stays silent: the daemon's deadline (10 s) ends the wait; the VM runs on.
    let t = Instant::now();
    let r = c.create_wait_line(&late("60000"));
    assert!(matches!(&r, Err(ApiError::Status(504, m)) if m.contains("no complete console line within 10 s")), "{r:?}");
    assert!(t.elapsed() >= Duration::from_secs(10) && t.elapsed() < Duration::from_secs(20), "{:?}", t.elapsed());
    // Both options at once are refused; the connection still serves.
    let r = c.raw("POST", "/v1/vms?attach=true&wait_line=true", Some(b"{\"image\":\"hello\"}")).unwrap();
    assert_eq!(r.status, 400, "{}", r.error_message());
    assert_eq!(c.version().unwrap().abi, wisp_abi::ABI_VERSION);
}

#[test]
fn pool_refills_after_a_burst_larger_than_the_pool() {
    let d = Daemon::start("pool", &["--pool", "16M=2"]);
    let mut c = d.client();
    let ten = Duration::from_secs(10);
    let ready = |c: &mut Client| c.pool().unwrap().ready.iter().map(|r| r.count).sum::<u32>() >= 2;
    eventually(ten, || "pool not filled".into(), || ready(&mut c).then_some(()));
    let ids: Vec<String> = (0..6).map(|i| create(&mut c, "hello", &[&i.to_string()], None).id).collect();
    for (i, id) in ids.iter().enumerate() {
        assert_eq!(c.wait(id).unwrap().code, 0);
        assert!(console(&mut c, id).contains(&format!("args: [\"{i}\"]")));
    }
    eventually(ten, || "pool not refilled".into(), || ready(&mut c).then_some(()));
    // Another size on demand.
    let vm = c.create(&CreateVm { image: "hello".into(), mem: Some(32 << 20), ..Default::default() }).unwrap();
    assert_eq!(c.wait(&vm.id).unwrap().code, 0);
    assert!(console(&mut c, &vm.id).contains("32 MiB RAM"));
}

#[test]
fn daemon_sigkill_and_restart_readopts_every_vm() {
    let mut d = Daemon::start("readopt", &["--pool", "16M=2"]);
    let mut c = d.client();
    let a = create(&mut c, "sleeper", &["1h", "20ms"], Some("a"));
    let b = create(&mut c, "sleeper", &["1h", "20ms"], None);
    let done = create(&mut c, "hello", &["done"], None);
    assert_eq!(c.wait(&done.id).unwrap().code, 0);
    c.pause(&b.id).unwrap();
    wait_console(&mut c, &a.id, "sleeper: sleeping");
    drop(c);

    d.sigkill_and_restart();
    let mut c = d.client();
    let vms = c.list().unwrap();
    assert_eq!(vms.len(), 3, "{vms:?}");
    assert_eq!(c.get("a").unwrap().state, VmState::Running);
    assert_eq!(c.get(&b.id).unwrap().state, VmState::Paused);
    assert_eq!(c.get(&done.id).unwrap().exit.unwrap().code, 0);
    assert!(console(&mut c, &done.id).contains("args: [\"done\"]"));
    assert!(console(&mut c, &a.id).contains("sleeper: sleeping"));
    c.resume(&b.id).unwrap();
    c.stop("a", Some(2000)).unwrap();
    assert_eq!(c.wait("a").unwrap().code, 143);
    c.kill(&b.id).unwrap();
    assert_eq!(c.wait(&b.id).unwrap().code, 137);
}

#[test]
fn a_crashing_or_killed_vm_does_not_disturb_its_neighbours() {
    let d = Daemon::start("isolation", &["--pool", "16M=2"]);
    let mut c = d.client();
    let calm = create(&mut c, "sleeper", &["1h", "10ms"], None);
    let crash = create(&mut c, "hostile", &["ud2"], None);
    let x = c.wait(&crash.id).unwrap();
    assert_eq!(x.code, 139);
    assert!(x.reason.contains("invalid opcode"), "{}", x.reason);
    // SIGKILL another VM's VMM process from outside.
    let victim = create(&mut c, "sleeper", &["1h"], None);
    // SAFETY: killing a process this test created through the daemon.
    unsafe { libc::kill(victim.pid as i32, libc::SIGKILL) };
    let x = c.wait(&victim.id).unwrap();
    assert_eq!((x.code, x.reason.as_str()), (137, "the VMM process died"));
    // The neighbour still runs and answers.
    assert_eq!(c.get(&calm.id).unwrap().state, VmState::Running);
    c.pause(&calm.id).unwrap();
    c.resume(&calm.id).unwrap();
    let n = console(&mut c, &calm.id).len();
    assert!(n > 0);
    c.stop(&calm.id, Some(1000)).unwrap();
    assert_eq!(c.wait(&calm.id).unwrap().code, 143);
}

#[test]
fn vmm_processes_are_sandboxed() {
    use std::io::{BufRead, BufReader, Write};
    let d = Daemon::start("jail", &["--pool", "16M=1"]);
    let mut c = d.client();
    let a = create(&mut c, "sleeper", &["1h"], None);
    let b = create(&mut c, "sleeper", &["1h"], None);
    let status = |pid: u32| std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |s: &str, k: &str| -> String {
        s.lines().find(|l| l.starts_with(&format!("{k}:"))).unwrap_or_default().split_whitespace().nth(1).unwrap_or("").to_string()
    };
    let (sa, sb) = (status(a.pid), status(b.pid));
    assert_eq!(field(&sa, "Seccomp"), "2", "seccomp filter not active:\n{sa}");
    assert_eq!(field(&sa, "NoNewPrivs"), "1");
    assert_eq!(field(&sa, "CapEff"), "0000000000000000");
    let (ua, ub) = (field(&sa, "Uid"), field(&sb, "Uid"));
    assert_ne!(ua, "0");
    assert_ne!(ua, ub, "two VMs share a user id");
    // Own network namespace.
    let ns = |pid: u32| std::fs::read_link(format!("/proc/{pid}/ns/net")).unwrap();
    assert_ne!(ns(a.pid), std::fs::read_link("/proc/self/ns/net").unwrap());
    // Ask the VMM process itself to open files: the seccomp filter answers
    // EACCES (its root is empty anyway).
    let sock = d.dir.join("state/vms").join(&a.id).join("ctl.sock");
    for path in ["/etc/hostname", "/dev/kvm", "/"] {
        let mut s = std::os::unix::net::UnixStream::connect(&sock).unwrap();
        writeln!(s, "{{\"op\":\"probe_open\",\"path\":\"{path}\"}}").unwrap();
        let mut line = String::new();
        BufReader::new(s).read_line(&mut line).unwrap();
        assert!(line.contains("\"ok\":false") && line.contains("Permission denied"), "{path}: {line}");
    }
    // The VM still works afterwards.
    c.pause(&a.id).unwrap();
    c.resume(&a.id).unwrap();
    c.stop(&a.id, Some(1000)).unwrap();
    assert_eq!(c.wait(&a.id).unwrap().code, 143);
}

#[test]
fn images_are_shared_copy_on_write_from_the_cache() {
    let d = Daemon::start("cow", &["--pool", "16M=2"]);
    let mut c = d.client();
    let a = create(&mut c, "sleeper", &["1h"], None);
    let b = create(&mut c, "sleeper", &["1h"], None);
    // Each VMM process maps the image cache's memfd (one inode for both).
    let inode = |pid: u32| -> String {
        let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
        let line = maps.lines().find(|l| l.contains("memfd:wisp-image")).unwrap_or_else(|| panic!("no image mapping:\n{maps}"));
        line.split_whitespace().nth(4).unwrap().to_string()
    };
    assert_eq!(inode(a.pid), inode(b.pid));
    wait_console(&mut c, &a.id, "sleeper: sleeping");
}

#[test]
fn forked_vms_are_vms_of_the_toolstack() {
    let mut d = Daemon::start("fork", &["--pool", "16M=1"]);
    let mut c = d.client();
    let root = create(&mut c, "family", &["nap", "2"], Some("napper"));
    // The two children show up as VMs of their own, with their parent.
    let kids = eventually(Duration::from_secs(10), || "the children did not appear".into(), || {
        let kids: Vec<_> = c.list().unwrap().into_iter().filter(|v| v.parent.as_deref() == Some(&root.id)).collect();
        (kids.len() == 2).then_some(kids)
    });
    let (ps, _) = text(&d.wisp(&["ps"]));
    assert_eq!(ps.lines().filter(|l| l.contains(&root.id)).count(), 3, "{ps}");
    // Each child says its pid in the family (2 and 3; the root is 1).
    let mut fpids = Vec::new();
    for k in &kids {
        assert_eq!(k.family.as_deref(), Some(root.id.as_str()));
        assert_ne!(k.pid, root.pid);
        wait_console(&mut c, &k.id, "sleeping");
        let out = console(&mut c, &k.id);
        let fpid = out.lines().find_map(|l| l.strip_prefix("nap: child ")?.strip_suffix(" sleeping")).expect(&out);
        fpids.push(fpid.to_string());
    }
    let mut sorted = fpids.clone();
    sorted.sort();
    assert_eq!(sorted, ["2", "3"]);
    // A restarted daemon finds the forked VMs again, with their parent.
    d.sigkill_and_restart();
    let mut c = d.client();
    for k in &kids {
        let v = c.get(&k.id).unwrap();
        assert_eq!((v.state, v.parent.as_deref()), (VmState::Running, Some(root.id.as_str())), "{v:?}");
    }
    // Stopping one child gracefully and killing the other reach the parent
    // as exit statuses, like any child process.
    assert_eq!(d.wisp(&["stop", &kids[0].id]).status.code(), Some(0));
    assert_eq!(d.wisp(&["kill", &kids[1].id]).status.code(), Some(0));
    assert_eq!(c.wait(&root.id).unwrap().code, 0);
    let out = console(&mut c, &root.id);
    assert!(out.contains(&format!("nap: child {} ended: exit Some(143) signal None", fpids[0])), "{out}");
    assert!(out.contains(&format!("nap: child {} ended: exit None signal Some(9)", fpids[1])), "{out}");
    assert!(out.contains("nap ok"), "{out}");
    assert_eq!(c.wait(&kids[0].id).unwrap().code, 143);
    assert_eq!(c.wait(&kids[1].id).unwrap().code, 137);
    // Cleaned up like any other VM.
    assert_eq!(d.wisp(&["rm", "--all"]).status.code(), Some(0));
    assert!(c.list().unwrap().is_empty());
}

#[test]
fn a_readopted_family_forks_vms_of_the_restarted_daemon() {
    let mut d = Daemon::start("late", &["--pool", "16M=1"]);
    let mut c = d.client();
    // The root forks a member at once; each forks a successor (and exits)
    // only when told to stop.
    let root = create(&mut c, "family", &["late"], None);
    let ten = Duration::from_secs(10);
    let child_of = |c: &mut Client, parent: &str, not: &str| {
        c.list().unwrap().into_iter().find(|v| v.parent.as_deref() == Some(parent) && v.id != not)
    };
    let member = eventually(ten, || "the member was not registered".into(), || child_of(&mut c, &root.id, ""));
    wait_console(&mut c, &root.id, "late: root 1 waiting");
    wait_console(&mut c, &member.id, "late: member 2 waiting");
    drop(c);

    // The uplink the first daemon made dies with it; the new one makes
    // another and hands it to both running members.
    d.sigkill_and_restart();
    let mut c = d.client();
    // A member forked under the old daemon forks under the new one, and so
    // does the root.
    let mut kids = Vec::new();
    for (parent, says) in [(&member, "late: 3 forked by 2"), (&root, "late: 4 forked by 1")] {
        let x = c.stop(&parent.id, Some(10_000)).unwrap().exit;
        assert_eq!(x.as_ref().map(|x| x.code), Some(0), "{x:?}: {}", console(&mut c, &parent.id));
        let what = || format!("{}'s child was not registered; wispd says:\n{}", parent.id, d.log());
        let kid = eventually(ten, what, || child_of(&mut c, &parent.id, &member.id));
        assert_eq!((kid.family.as_deref(), kid.state), (Some(root.id.as_str()), VmState::Running), "{kid:?}");
        assert!(kid.pid != parent.pid && kid.pid != 0, "{kid:?}");
        wait_console(&mut c, &kid.id, says);
        kids.push((kid, parent));
    }
    // Listed with their parents.
    let (ps, _) = text(&d.wisp(&["ps", "-a"]));
    for (kid, parent) in &kids {
        let line = ps.lines().find(|l| l.starts_with(&kid.id)).unwrap_or_else(|| panic!("{} not in ps:\n{ps}", kid.id));
        assert!(line.split_whitespace().any(|w| w == parent.id), "{line}");
    }
    // Stopped, killed, waited for and removed like any VM.
    let (grandchild, kid) = (&kids[0].0, &kids[1].0);
    assert_eq!(d.wisp(&["stop", &grandchild.id]).status.code(), Some(0));
    assert_eq!(d.wisp(&["wait", &grandchild.id]).status.code(), Some(143));
    assert_eq!(d.wisp(&["kill", &kid.id]).status.code(), Some(0));
    assert_eq!(d.wisp(&["wait", &kid.id]).status.code(), Some(137));
    for v in [grandchild, kid] {
        assert_eq!(d.wisp(&["rm", &v.id]).status.code(), Some(0));
        assert!(matches!(c.get(&v.id), Err(ApiError::Status(404, _))), "{} still listed", v.id);
    }
}

#[test]
fn a_vmm_process_takes_only_a_seqpacket_uplink_and_only_if_its_vm_forks() {
    use std::os::fd::OwnedFd;
    use std::os::unix::net::UnixStream;
    use wisp_vmm_process::proto::{self, Request, NO_FORK};
    let d = Daemon::start("uplink", &["--pool", "16M=1"]);
    let mut c = d.client();
    let forks = create(&mut c, "family", &["late"], None);
    let plain = create(&mut c, "sleeper", &["1h"], None);
    let ask = |id: &str, fd: Option<&OwnedFd>| {
        let sock = d.vm_dir(id).join("ctl.sock");
        proto::call(&sock, &Request::Uplink, fd, Some(Duration::from_secs(5))).unwrap().0
    };
    let seqpacket = || {
        use rustix::net::{socketpair, AddressFamily, SocketFlags, SocketType};
        socketpair(AddressFamily::UNIX, SocketType::SEQPACKET, SocketFlags::CLOEXEC, None).unwrap().0
    };
    let stream: OwnedFd = UnixStream::pair().unwrap().0.into();
    let file: OwnedFd = std::fs::File::open("/dev/null").unwrap().into();
    for (fd, why) in [(None, "needs"), (Some(&stream), "SEQPACKET"), (Some(&file), "SEQPACKET")] {
        let r = ask(&forks.id, fd);
        assert!(!r.ok && r.error.as_deref().is_some_and(|e| e.contains(why)), "{r:?}");
    }
    let r = ask(&plain.id, Some(&seqpacket()));
    assert_eq!(r.error.as_deref(), Some(NO_FORK), "{r:?}");
    assert!(ask(&forks.id, Some(&seqpacket())).ok);
    // Both still run and answer.
    for v in [&forks, &plain] {
        assert_eq!(c.pause(&v.id).unwrap().state, VmState::Paused);
        assert_eq!(c.resume(&v.id).unwrap().state, VmState::Running);
    }
}

#[test]
fn a_forked_vm_holds_only_its_own_descriptors() {
    use std::process::{Command, Stdio};
    let d = Daemon::start("fds", &["--pool", "16M=1"]);
    let mut c = d.client();
    let root = create(&mut c, "family", &["late"], None);
    let ten = Duration::from_secs(10);
    let child_of = |c: &mut Client, parent: &str| c.list().unwrap().into_iter().find(|v| v.parent.as_deref() == Some(parent));
    let member = eventually(ten, || "the member was not registered".into(), || child_of(&mut c, &root.id));
    wait_console(&mut c, &member.id, "late: member 2 waiting");
    // The member's control socket serves a kept session (pause, resume)
    // and a console stream when it forks.
    c.pause(&member.id).unwrap();
    c.resume(&member.id).unwrap();
    let mut follow = Command::new(env!("CARGO_BIN_EXE_wisp"))
        .args(["logs", "-f", &member.id])
        .env("WISP_SOCKET", &d.socket)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let sockets = |pid: u32| -> Vec<String> { common::fds(pid).into_iter().map(|f| f.1).filter(|t| t.starts_with("socket:")).collect() };
    let streams = |pid: u32| sockets(pid).len();
    eventually(ten, || "the console stream did not reach the member".into(), || (streams(member.pid) >= 4).then_some(()));
    // The uplink: the SEQPACKET socket (of the daemon's making) the root and
    // the member hold.
    let seqpacket = common::seqpacket_sockets(d.pid());
    let (of_root, of_member) = (sockets(root.pid), sockets(member.pid));
    let uplink: Vec<&String> = of_member.iter().filter(|s| of_root.contains(s) && seqpacket.contains(s)).collect();
    assert_eq!(uplink.len(), 1, "root {of_root:?}, member {of_member:?}");
    // Told to stop, the member forks and exits.
    assert_eq!(c.stop(&member.id, Some(10_000)).unwrap().exit.map(|x| x.code), Some(0));
    let kid = eventually(ten, || format!("the member's child was not registered: {}", d.log()), || child_of(&mut c, &member.id));
    wait_console(&mut c, &kid.id, "late: 3 forked by 2");
    // The member's console stream ended with it: no child holds it open.
    eventually(ten, || "`wisp logs -f` of the ended member did not end".into(), || follow.try_wait().unwrap());
    // Its own files, control socket and the family's uplink; nothing of
    // the member's (control sockets, files) or the root's.
    let dir = d.vm_dir(&kid.id).to_string_lossy().into_owned();
    let in_dir = |t: &str| t.starts_with(&format!("{dir}/"));
    let a_socket = |t: &str| t.starts_with("socket:[");
    common::assert_only_own_fds(kid.pid, &[&in_dir, &a_socket]);
    let of_kid = sockets(kid.pid);
    assert_eq!(of_kid.len(), 2, "{of_kid:?}");
    assert!(of_kid.contains(uplink[0]), "no uplink: {of_kid:?}");
    assert!(of_kid.iter().all(|s| s == uplink[0] || !of_member.contains(s)), "the member's sockets: {of_kid:?} {of_member:?}");
    let mut files: Vec<_> = common::fds(kid.pid).into_iter().filter(|f| in_dir(&f.1)).map(|f| f.1).collect();
    files.sort();
    let own = ["console.log", "exit.json", "stderr.log"].map(|f| format!("{dir}/{f}"));
    assert_eq!(files, own, "{files:?}");
    // It works: console (above), its control socket, family calls (its
    // pause), a stop.
    assert_eq!(c.pause(&kid.id).unwrap().state, VmState::Paused);
    assert_eq!(c.resume(&kid.id).unwrap().state, VmState::Running);
    assert_eq!(c.stop(&kid.id, Some(10_000)).unwrap().exit.map(|x| x.code), Some(143));
}

/// Under the daemon too, forks after the first go to spare monitor
/// processes prepared while the guest waits (sandboxed: the spare's RAM file
/// stays within the process's file size limit), and each child is a VM of
/// the toolstack that sees its parent's memory as at its fork.
#[test]
fn forks_under_the_daemon_go_to_prepared_spares() {
    let d = Daemon::start("spares", &["--pool", "16M=1"]);
    let mut c = d.client();
    let root = create(&mut c, "family", &["cow-again", "4"], None);
    let x = c.wait(&root.id).unwrap();
    let out = console(&mut c, &root.id);
    assert_eq!(x.code, 0, "{out}");
    for n in 1..=4 {
        assert!(out.contains(&format!("round {n}: child exited 7, parent sees global {} heap 0xdd", n * 10 + 1)), "{out}");
    }
    let kids: Vec<_> = c.list().unwrap().into_iter().filter(|v| v.parent.as_deref() == Some(&root.id)).collect();
    assert_eq!(kids.len(), 4, "every child is a VM of the toolstack: {kids:?}");
    // The root saw each child's guest end; the toolstack records the end
    // once the child's VMM process is gone, which may be a moment later.
    for k in &kids {
        assert_eq!(c.wait(&k.id).unwrap().code, 7, "{kids:?}");
    }
    // The VMM process counted forks that went to a spare in its log.
    let log = std::fs::read_to_string(d.dir.join("state/vms").join(&root.id).join("vmm.log")).unwrap_or_default();
    assert!(log.contains("forks_prepared 3 "), "{log}");
}

#[test]
fn a_forked_vm_outlives_a_parent_that_exits_at_once() {
    let d = Daemon::start("daemonize", &["--pool", "16M=1"]);
    let mut c = d.client();
    let root = create(&mut c, "family", &["daemonize"], None);
    assert_eq!(c.wait(&root.id).unwrap().code, 0);
    let kid = eventually(Duration::from_secs(10), || "the child was not registered".into(), || {
        c.list().unwrap().into_iter().find(|v| v.parent.as_deref() == Some(&root.id))
    });
    // The child waits for its parent's end (end of file on a pipe only the
    // parent could write), then says so and exits.
    let exit = eventually(Duration::from_secs(20), || "the child did not see its parent go".into(), || {
        c.get(&kid.id).unwrap().exit
    });
    let out = console(&mut c, &kid.id);
    assert_eq!(exit.code, 0, "{out}");
    assert!(out.contains("outlived its parent true"), "{out}");
}

#[test]
fn many_vms_are_removed_in_one_request() {
    let d = Daemon::start("batch", &["--pool", "16M=2"]);
    let mut c = d.client();
    let running: Vec<wisp_api::VmInfo> = (0..5).map(|_| create(&mut c, "sleeper", &[], None)).collect();
    let done = create(&mut c, "noop", &[], Some("done"));
    assert_eq!(c.wait("done").unwrap().code, 0);
    let ids: Vec<String> = running.iter().map(|v| v.id.clone()).collect();

    // Without force: the exited VM goes, the running ones stay, each named
    // with its reason; so does a name that names nothing.
    let mut named = vec!["done".to_string(), "nosuch".to_string()];
    named.extend(ids.iter().cloned());
    let r = c.remove_many(&named, false).unwrap();
    assert_eq!(r.removed, vec![done.id.clone()], "{r:?}");
    assert_eq!(r.failed.len(), 6, "{r:?}");
    assert!(r.failed.iter().any(|f| f.vm == "nosuch" && f.error.contains("no such VM")), "{r:?}");
    for id in &ids {
        assert!(r.failed.iter().any(|f| &f.vm == id && f.error.contains("is running")), "{id}: {r:?}");
        assert_eq!(c.get(id).unwrap().state, VmState::Running);
    }
    // The CLI says so too, per VM.
    let o = d.wisp(&["rm", &ids[0], "nosuch"]);
    assert_eq!(o.status.code(), Some(125), "{:?}", text(&o));
    assert!(text(&o).1.contains(&format!("wisp: error: {}: VM {} is running", ids[0], ids[0])), "{:?}", text(&o));

    // With force, in one request (a VM named twice, by id and by prefix,
    // goes once): every VM and its VMM process and directory are gone.
    let mut named = ids.clone();
    named.push(ids[1][..8].to_string());
    let r = c.remove_many(&named, true).unwrap();
    assert_eq!((r.removed.len(), r.failed.len()), (5, 0), "{r:?}");
    assert!(c.list().unwrap().is_empty());
    for v in &running {
        assert!(!d.vm_dir(&v.id).exists(), "{} left its directory", v.id);
        eventually(Duration::from_secs(5), || format!("VMM process {} of {} still there", v.pid, v.id), || {
            (!std::path::Path::new(&format!("/proc/{}", v.pid)).exists()).then_some(())
        });
    }
    // A request naming more VMs than the API takes is refused whole.
    let many = vec!["x".to_string(); wisp_api::MAX_REMOVE + 1];
    assert!(matches!(c.remove_many(&many, true), Err(ApiError::Status(400, _))));
}

#[test]
fn a_daemon_whose_binary_is_replaced_on_disk_keeps_starting_vmm_processes() {
    // An upgrade replaces (or removes) wispd's file while the daemon runs:
    // the VMM processes it starts from then on are still its own binary.
    let dir = common::fresh_dir("replaced-bin");
    let exe = dir.join("wispd");
    std::fs::copy(Path::new(env!("CARGO_BIN_EXE_wisp")).with_file_name("wispd"), &exe).unwrap();
    let d = Daemon::launch_exe("replaced", false, &exe, &["--pool", "16M=1", "--vms-per-process", "2"]);
    std::fs::remove_file(&exe).unwrap();
    let mut c = d.client();
    // More VMs than the pool holds, and a group of two: new processes.
    for _ in 0..3 {
        assert_eq!(create(&mut c, "family", &["hold"], None).state, VmState::Running);
    }
    let a = create(&mut c, "sleeper", &["1h"], None);
    let b = create(&mut c, "sleeper", &["1h"], None);
    assert!(a.group.is_some() && a.group == b.group, "{a:?} {b:?}");
    eventually(Duration::from_secs(10), || format!("the pool did not refill: {}", d.log()), || {
        (c.pool().ok()?.ready.iter().map(|p| p.count).sum::<u32>() == 1).then_some(())
    });
    assert!(!d.log().contains("cannot prepare"), "{}", d.log());
    assert_eq!(d.wisp(&["rm", "-f", "--all"]).status.code(), Some(0));
}

#[test]
fn a_second_daemon_on_a_served_socket_is_refused_but_a_mute_listener_is_not_a_daemon() {
    let wispd = std::path::Path::new(env!("CARGO_BIN_EXE_wisp")).with_file_name("wispd");
    let d = Daemon::start("second", &[]);
    let dir = common::fresh_dir("second-state");
    let o = std::process::Command::new(&wispd)
        .arg("--socket")
        .arg(&d.socket)
        .arg("--state-dir")
        .arg(dir.join("state"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("another wispd is serving"), "{}", String::from_utf8_lossy(&o.stderr));
    drop(d);
    // A listener nobody accepts on (as a killed daemon's, inherited by a
    // process on its way to exec) does not keep a daemon from starting.
    let sock = dir.join("mute.sock");
    let mute = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    let ino = |p: &Path| std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(p).ok()?).into();
    let mut child = std::process::Command::new(&wispd)
        .arg("--socket")
        .arg(&sock)
        .arg("--state-dir")
        .arg(dir.join("state2"))
        .arg("--pool")
        .arg("16M=0")
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // (Asking before it bound its own socket would wait on the mute one.)
    let mute_ino: Option<u64> = ino(&sock);
    eventually(Duration::from_secs(20), || "wispd did not bind a socket of its own".into(), || (ino(&sock) != mute_ino && ino(&sock).is_some()).then_some(()));
    let up = eventually(Duration::from_secs(20), || "wispd did not answer".into(), || {
        wisp_api::client::Client::connect(&sock).ok().and_then(|mut c| c.version().ok())
    });
    assert!(up.abi > 0);
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let _ = child.wait();
    drop(mute);
    common::daemon::kill_leftovers(&dir);
    let _ = std::fs::remove_dir_all(&dir);
}
